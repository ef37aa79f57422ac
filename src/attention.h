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
 * its head dim, dtype and varlen), built or fetched like any kernel;
 * ctx->lock held. */
fj_status fj__combine_kernel(fj_ctx *ctx, const fj_variant *v, fj_kernel **k);
/* The kernels' parameter block for p and the given tensors: sizes,
 * strides, the mask's offset, the built-in modifications' values, the
 * varlen, paged and block-mask arrays (block_mask.c's kernel reads the
 * same block). */
void fj__fill_params(fj_kparams *kp, const fj_problem *p, const void *q,
                     const void *k, const void *v, void *o, float *lse);

#endif /* FJ_ATTENTION_H */
