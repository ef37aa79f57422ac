/*
 * devptr.h -- which device a call's memory is on: the pointers of an
 * attention call checked against the context's device before anything is
 * queued, so that memory of another GPU is refused with a message naming
 * the argument instead of faulting a kernel on the wrong device.
 */
#ifndef FJ_DEVPTR_H
#define FJ_DEVPTR_H

#include <stddef.h>

#include "ctx.h"
#include "driver.h"

/* One pointer argument: its name as messages give it ("q",
 * "mods.params"), the element of an array argument (-1: none), the
 * address. */
typedef struct fj_devptr {
  const char *name;
  int index;
  const void *ptr;
} fj_devptr;

/* The most pointers one call has: q, k, v, o, lse, the workspace, three FP8
 * scales, O's scale and amax, three varlen arrays, the block table, the
 * sinks, eight arrays of a block mask (both directions), and the tensor
 * parameters. */
#define FJ_DEVPTR_MAX (24 + FJ_MOD_PARAMS_MAX)

/* How an address is looked up: fj__cu_memory, or a test's stand-in. */
typedef fj_status (*fj_mem_query)(const fj_ctx *ctx, const void *ptr,
                                  fj_mem_info *info);

/* The device pointers an attention call hands its kernels (NULL ones left
 * out; the FP8 scales only for FP8 K/V, tensor parameters only, not
 * scalars) into out, which holds FJ_DEVPTR_MAX; returns the count.  p has
 * passed fj_problem_check. */
size_t fj__devptr_list(const fj_problem *p, const void *q, const void *k,
                       const void *v, const void *o, const void *lse,
                       const void *workspace, fj_devptr *out);

/* FJ_ERR_INVALID_ARG for the first pointer that is device memory of a
 * device other than ctx's, "fn: q is memory of device 1; this context
 * runs on device 0".  Managed memory, page-locked host memory and memory
 * CUDA does not know pass (devptr.c says why).  Pointers inside an
 * allocation already found on the right device are not looked up again.
 * A failed query returns its status. */
fj_status fj__devptr_check(const fj_ctx *ctx, const char *fn,
                           const fj_devptr *ptrs, size_t n,
                           fj_mem_query query);

/* fj__devptr_check with the driver's query; nothing at all in a process
 * that sees one device.  n at most FJ_DEVPTR_MAX. */
fj_status fj__devptr_check_list(const fj_ctx *ctx, const char *fn,
                                const fj_devptr *ptrs, size_t n);

/* fj__devptr_check_list of one attention call's pointers. */
fj_status fj__devptr_check_call(const fj_ctx *ctx, const char *fn,
                                const fj_problem *p, const void *q,
                                const void *k, const void *v, const void *o,
                                const void *lse, const void *workspace);

#endif /* FJ_DEVPTR_H */
