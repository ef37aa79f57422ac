/*
 * tunedb.h -- the tuning database: one JSON file in the cache directory
 * mapping a problem class on a device to its tuned variant.  Below the
 * attention forward, which consults it, and the tuner, which fills it.
 */
#ifndef FJ_TUNEDB_H
#define FJ_TUNEDB_H

#include "ctx.h"

/* 1 and the tuned variant in *v when the database has the problem's class;
 * ctx->lock held. */
int fj__tune_lookup(fj_ctx *ctx, const fj_problem *p, fj_variant *v);
/* 1 and the family and stages of the backward's main kernel when the
 * database has the backward of p's class (fj_tune_bwd's entry; the plan
 * checks them by rendering); ctx->lock held. */
int fj__tune_lookup_bwd(fj_ctx *ctx, const fj_problem *p, fj_mma *mma,
                        int *stages);
void fj__tunedb_free(void *db);
/* Records a tuning result for p's class (fj_tune's last step). */
fj_status fj__tune_record(fj_ctx *ctx, const fj_problem *p,
                          const fj_variant *v, double ms, double default_ms);
/* Records the backward's main kernel for p's class (fj_tune_bwd's last
 * step), under a key of its own. */
fj_status fj__tune_record_bwd(fj_ctx *ctx, const fj_problem *p,
                              const fj_variant *v, double ms,
                              double default_ms);

#endif /* FJ_TUNEDB_H */
