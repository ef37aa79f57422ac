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

void fj__dispatch_free(fj_dispatch *d);
/* The split-KV combine kernel of a split variant (templates/combine.cu:
 * its head dim, dtype and varlen), built or fetched like any kernel;
 * ctx->lock held. */
fj_status fj__combine_kernel(fj_ctx *ctx, const fj_variant *v, fj_kernel **k);

#endif /* FJ_ATTENTION_H */
