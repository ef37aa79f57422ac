/*
 * attention.h -- the attention forward: the choice (tuning database, else
 * the heuristic of plan.c), the plan, the launches, and the dispatch
 * caches that make a repeated launch cheap.  Its public functions are in
 * flashjit.h.
 */
#ifndef FJ_ATTENTION_H
#define FJ_ATTENTION_H

#include "ctx.h"
#include "kernel.h"
#include "kparams.h"

void fj__dispatch_free(fj_dispatch *d);
/* The split-KV combine kernel of a split variant (templates/combine.cu:
 * O's head dim, dtype, varlen and sinks) whose blocks take `cols` of O's
 * columns (fj__combine_cols: O's head dim, the plain fj_combine_d<D>_...
 * kernel, or 128, named ..._c128), built or fetched like any kernel;
 * ctx->lock held. */
fj_status fj__combine_kernel(fj_ctx *ctx, const fj_variant *v, int cols,
                             fj_kernel **k);
/* Its function, built and loaded if needed (remembered in the dispatch
 * caches); ctx->lock held and the CUDA context entered.  split-KV's
 * launches and fj_attention_merge (merge.c) take it from here. */
fj_status fj__combine_function(fj_ctx *ctx, const fj_variant *v, int cols,
                               void **fn);
/* The function of p's relative table's kernel (rel_table.h), built and
 * loaded if needed and remembered by the form's hash in the dispatch
 * caches, so that a launch that repeats a form costs a comparison (the
 * kernel's parameters take a parse and the expressions' printing);
 * ctx->lock held and the CUDA context entered.  The forward's and the
 * backward's launches take it from here. */
fj_status fj__rt_function(fj_ctx *ctx, const fj_problem *p, void **fn);
/* The kernels' parameter block for p and the given tensors: sizes,
 * strides, the mask's offset, the built-in modifications' values, the
 * varlen, paged and block-mask arrays (block_mask.c's kernel reads the
 * same block). */
void fj__fill_params(fj_kparams *kp, const fj_problem *p, const void *q,
                     const void *k, const void *v, void *o, float *lse);

/* A tensor's 16-byte alignment (the kernels move rows in 16-byte pieces,
 * TMA boxes too): its base pointer, and every stride in whole 16-byte
 * pieces; FJ_ERR_UNSUPPORTED naming `name` and the value otherwise. */
fj_status fj__check_alignment(const fj_ctx *ctx, const char *name,
                              const void *ptr, const int64_t s[3],
                              fj_dtype dtype);
/* One rank-4 tensor map (head dim d, sequence, heads, batch) of a tensor
 * with element strides s (batch, head, row), boxes of one 128-byte
 * swizzled row by `rows` rows (templates/tma_ring.lua's panels); encoded
 * maps are remembered per context. */
fj_status fj__tensor_map(fj_ctx *ctx, const void *base, fj_dtype dt,
                         const int64_t s[3], int d, int seq, int heads,
                         int batch, int rows, fj_tmap *out);

#endif /* FJ_ATTENTION_H */
