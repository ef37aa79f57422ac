/*
 * backward.h -- what the backward (backward.c) offers the modules above it:
 * the plan of one main kernel the tuner tries (tune_bwd.c), and the main
 * kernel's template parameters for a batch of compiles (prewarm_bwd.c).
 * Its public functions are in flashjit.h.
 */
#ifndef FJ_BACKWARD_H
#define FJ_BACKWARD_H

#include "ctx.h"
#include "variant.h"

/* The plan of p's backward with the main kernel of family mma (FJ_MMA_SYNC,
 * or FJ_MMA_WGMMA on a target that has it) and `stages`, instead of the
 * plan's own choice: rendered and checked against the target's shared
 * memory (FJ_ERR_UNSUPPORTED or FJ_ERR_RESOURCES with the reason), not
 * remembered.  The problem is checked as fj_attention_bwd_plan checks it.
 * Called without the lock. */
fj_status fj__bwd_plan_candidate(fj_ctx *ctx, const fj_problem *p,
                                 fj_mma mma, int stages, fj_bwd_plan *plan);

/* The template parameters of plan's main kernel for p (its template, its
 * symbol "fj_bwd_attn_..." in vp->symbol), for fj__kernel_build_many;
 * ctx->lock held. */
fj_status fj__bwd_main_params(fj_ctx *ctx, const fj_problem *p,
                              const fj_bwd_plan *plan, fj_vparams *vp);

#endif /* FJ_BACKWARD_H */
