/*
 * kernel.h -- from a template and its parameters to a kernel: the memory
 * cache, the render index, the disk cache, NVRTC; then the module and
 * function, loaded on first launch.  Kernels live as long as their context.
 */
#ifndef FJ_KERNEL_H
#define FJ_KERNEL_H

#include <stddef.h>

#include "compile.h"
#include "ctx.h"
#include "template.h"

struct fj_kernel {
  fj_variant variant;
  fj_kmeta meta;
  char *source;
  size_t source_len;
  fj_compiled out;
  fj_resources res;  /* res.cache unused: origin */
  /* How the last lookup found the kernel (fj_cache_origin), atomic:
   * lookups on any thread set it under the lock, fj_kernel_resources
   * reads it without. */
  int origin;
  void *module;    /* CUmodule, loaded on first launch */
  void *function;  /* CUfunction */
  void *vt_function;  /* FP8 attention's <symbol>_vt pass, on first use */
};

void fj__kmap_free(fj_kmap *m);
/* The kernel's function (meta.symbol), loading its module on first use.
 * The caller has entered the CUDA context. */
fj_status fj__kernel_function(fj_ctx *ctx, fj_kernel *k, void **function);
/* Another function of the same module (the probe module has several). */
fj_status fj__kernel_symbol(fj_ctx *ctx, fj_kernel *k, const char *symbol,
                            void **function);
/* FP8 attention's V^T pass, the module's <symbol>_vt, looked up once.
 * ctx->lock held, the CUDA context entered. */
fj_status fj__kernel_vt_function(fj_ctx *ctx, fj_kernel *k, void **function);
/* Compile-and-cache for any template, shared by attention kernels and the
 * layout probe: renders name with params, then memory/disk/NVRTC.
 * ctx->lock held, and released while NVRTC runs: the context's other
 * threads go on meanwhile (a build of the same kernel waits for this
 * one), so what the caller read under the lock before may have changed
 * when this returns. */
fj_status fj__kernel_build(fj_ctx *ctx, const char *template_name,
                           const fj_param *params, size_t nparams,
                           fj_kernel **out);
void fj__kernel_free(fj_kernel *k);
/* A kernel of template `name` that evaluates m's expressions outside the
 * attention kernels (block_mask.cu, rel_table.cu): the parameters each
 * such template takes -- template, symbol, arch, sm, version,
 * params_bytes, dtype (common.cuh's: f16, no tensor is read), mod_params
 * and mod_facts (mods_kernel.h) -- then its own `extra` (n, at most 8),
 * built as fj__kernel_build builds; ctx->lock held. */
fj_status fj__kernel_build_mods(fj_ctx *ctx, const char *name,
                                const char *symbol, const fj_mods *m,
                                const fj_param *extra, size_t n,
                                fj_kernel **out);

/* One kernel of a batch: the template and parameters in, the kernel (or a
 * failed status, message on the thread) out.  A status other than FJ_OK on
 * entry skips the item. */
typedef struct fj_build {
  const char *template_name;
  const fj_param *params;
  size_t nparams;
  fj_kernel *kernel;
  fj_status status;
  char *message;  /* malloc'd copy of a failure's message */
} fj_build;

/* fj__kernel_build for many at once: renders under ctx->lock, compiles
 * what the caches lack in up to `workers` child processes without holding
 * the lock, then stores the results.  Called without the lock. */
fj_status fj__kernel_build_many(fj_ctx *ctx, fj_build *builds, size_t n,
                                int workers, fj_progress_fn progress,
                                void *user);
/* A kernel compiling in the background (the tiered JIT, src/tier.c). */
typedef struct fj_kjob fj_kjob;
/* fj__kernel_build without the wait: a kernel the memory or disk cache
 * has comes back in *out; for one that needs NVRTC, *out is NULL and *job
 * its compile, rendered now (the parameters need not outlive the call),
 * to start with fj__kjob_start; both NULL where another thread's
 * fj__kernel_build compiles it now.  ctx->lock held. */
fj_status fj__kernel_build_async(fj_ctx *ctx, const char *template_name,
                                 const fj_param *params, size_t nparams,
                                 fj_kernel **out, fj_kjob **job);
/* Starts the job's compile on a thread of its own; where no thread can
 * start, the job is finished and freed here, and its failure returned. */
fj_status fj__kjob_start(fj_ctx *ctx, fj_kjob *job);
/* Frees a job never started (its rendered kernel with it). */
void fj__kjob_drop(fj_kjob *job);
/* Whether the job's compile has ended; never blocks. */
int fj__kjob_done(const fj_kjob *job);
/* The kernel's symbol (the variant's name). */
const char *fj__kjob_symbol(const fj_kjob *job);
/* Waits for the job (if it has not ended), then keeps its kernel in the
 * memory and disk caches as fj__kernel_build does, or returns its
 * failure with the compiler's message; frees the job.  ctx->lock held,
 * and released during the wait as fj__kernel_build releases it (the job
 * must be the caller's alone: taken out of any table first). */
fj_status fj__kjob_finish(fj_ctx *ctx, fj_kjob *job, fj_kernel **out);

/* Compiles ahead of use: a kernel the caches lack starts compiling on a
 * thread of its own (fj__kernel_build_async, fj__kjob_start), and a later
 * fj__kernel_build of it waits for that compile instead of starting its
 * own.  At most a few are in flight per context; beyond, nothing is
 * started (the build compiles then, as without).  A compile that failed
 * is reported by the build that waits for it.  ctx->lock held. */
fj_status fj__kernel_ahead(fj_ctx *ctx, const char *template_name,
                           const fj_param *params, size_t nparams);
/* Waits for the compiles ahead and keeps their kernels in the caches, as
 * a build would (the context is going: its disk cache keeps them). */
void fj__kernel_ahead_free(fj_ctx *ctx);

/* FJ_ERR_RESOURCES when the rendered kernel needs more shared memory than
 * the target allows per block. */
fj_status fj__check_smem(const fj_ctx *ctx, const fj_kmeta *meta);

#endif /* FJ_KERNEL_H */
