/*
 * attention.h -- the attention forward: the heuristic's variant for a
 * problem, the choice (tuning database, else the heuristic), and the
 * dispatch caches that make a repeated launch cheap.
 */
#ifndef FJ_ATTENTION_H
#define FJ_ATTENTION_H

#include "ctx.h"

/* The heuristic's variant for a problem on the context's target. */
void fj__heuristic(const fj_ctx *ctx, const fj_problem *p, fj_variant *v);
/* Its choice among the families without TMA (wmma, mma): the tuner's
 * starting point for their space. */
void fj__heuristic_sync(const fj_ctx *ctx, const fj_problem *p, fj_variant *v);
/* The variant for a problem: the tuning database, else the heuristic. */
fj_status fj__choose(fj_ctx *ctx, const fj_problem *p, fj_variant *v,
                     fj_choice *from);
void fj__dispatch_free(fj_dispatch *d);

#endif /* FJ_ATTENTION_H */
