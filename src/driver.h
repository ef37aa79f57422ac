/*
 * driver.h -- the CUDA Driver API, reached through dlopen so that
 * compile-only use needs no driver.  Every failure becomes FJ_ERR_CUDA with
 * the error's name, the call and the place.  Callers bracket device work
 * with fj__cu_enter / fj__cu_leave (the device's primary context).
 */
#ifndef FJ_DRIVER_H
#define FJ_DRIVER_H

#include <stddef.h>
#include <stdint.h>

#include "ctx.h"
#include "kparams.h"

typedef struct fj_launch {
  void *function;        /* CUfunction */
  unsigned grid[3];
  unsigned block[3];
  unsigned smem_bytes;
  void *stream;
  void **args;
  /* 1: the kernel may start before the one queued before it on the stream
   * has ended (programmatic dependent launch, sm_90 and newer); it waits
   * with griddepcontrol.wait before it reads that kernel's writes.  Where
   * the driver lacks cuLaunchKernelEx it starts after, as any launch. */
  int early;
} fj_launch;

/* Loads libcuda.so.1 and the entry points (once per process). */
fj_status fj__cu_init(const fj_ctx *ctx);
/* Retains the primary context of ctx->opts.device and fills ctx->dev. */
fj_status fj__cu_open_device(fj_ctx *ctx);
void fj__cu_close_device(fj_ctx *ctx);
/* Make the primary context current on this thread / restore the old one. */
fj_status fj__cu_enter(const fj_ctx *ctx);
void fj__cu_leave(const fj_ctx *ctx);
fj_status fj__cu_module_load(const fj_ctx *ctx, const void *cubin,
                             void **module);
/* Looks up a kernel and raises its dynamic shared memory limit if needed. */
fj_status fj__cu_function(const fj_ctx *ctx, void *module, const char *symbol,
                          unsigned smem_bytes, void **function);
void fj__cu_module_unload(void *module);
fj_status fj__cu_launch(const fj_ctx *ctx, const fj_launch *l);
/* How many clusters of l's kernel (its cluster size compiled in) can be
 * resident at once on the current context's device; 0 where the driver
 * cannot say. */
int fj__cu_resident_clusters(const fj_launch *l);
fj_status fj__cu_alloc(const fj_ctx *ctx, size_t bytes, uint64_t *dptr);
void fj__cu_free(uint64_t dptr);
/* Whether work on stream is being captured into a CUDA graph. */
fj_status fj__cu_capturing(const fj_ctx *ctx, void *stream, int *capturing);
fj_status fj__cu_copy_to_host(const fj_ctx *ctx, void *dst, uint64_t src,
                              size_t bytes);
fj_status fj__cu_copy_to_device(const fj_ctx *ctx, uint64_t dst,
                                const void *src, size_t bytes);
fj_status fj__cu_sync(const fj_ctx *ctx);
fj_status fj__cu_memset(const fj_ctx *ctx, uint64_t dst, unsigned char byte,
                        size_t bytes);
/* Sets `words` 32-bit words at dst to value, in stream order (a memset
 * node when the stream is being captured). */
fj_status fj__cu_memset32_async(const fj_ctx *ctx, uint64_t dst,
                                unsigned value, size_t words, void *stream);
fj_status fj__cu_event_create(const fj_ctx *ctx, void **event);
void fj__cu_event_destroy(void *event);
fj_status fj__cu_event_record(const fj_ctx *ctx, void *event, void *stream);
/* Waits for `end`, then the milliseconds between the two events. */
fj_status fj__cu_event_ms(const fj_ctx *ctx, void *start, void *end, float *ms);

/* What the driver knows of an address (cuPointerGetAttributes). */
typedef enum fj_mem_kind {
  FJ_MEM_OTHER = 0,  /* not CUDA's: pageable host memory, or no memory */
  FJ_MEM_HOST,       /* page-locked host memory (cuMemHostAlloc, registered) */
  FJ_MEM_DEVICE,     /* device memory of one device */
  FJ_MEM_MANAGED     /* managed (unified) memory */
} fj_mem_kind;

typedef struct fj_mem_info {
  fj_mem_kind kind;
  int ordinal;     /* FJ_MEM_DEVICE: the device's ordinal */
  uint64_t start;  /* the allocation the address lies in; bytes 0: unknown */
  uint64_t bytes;
} fj_mem_info;

/* One driver query of the process-wide table of address ranges (a lock
 * and a lookup in the driver: of the order of 0.1-0.3 us, estimated, not
 * measured here).  A pointer CUDA does not know is FJ_MEM_OTHER, not an
 * error. */
fj_status fj__cu_memory(const fj_ctx *ctx, const void *ptr, fj_mem_info *info);

/* A tiled tensor map (TMA): rank 1..5, dims and box in elements (dim 0
 * contiguous), strides[i] the byte stride of dim i + 1, f16 or bf16,
 * swizzle_bytes 32, 64 or 128; out-of-bounds elements read as zeros. */
typedef struct fj_tmap_desc {
  uint64_t base;
  fj_dtype dtype;
  int rank;
  int64_t dims[5];
  int64_t strides[4];
  int box[5];
  int swizzle_bytes;
} fj_tmap_desc;

fj_status fj__cu_tensor_map(const fj_ctx *ctx, const fj_tmap_desc *d,
                            fj_tmap *out);

#endif /* FJ_DRIVER_H */
