/*
 * rel_table.h -- a score expression's relative table (mods.h's
 * fj__mods_rt_on): the score's subtree of the query head and the distance
 * alone, evaluated once a launch by templates/rel_table.cu into the
 * launch's workspace, where the forward's and the backward's kernels read
 * it in place of the subtree (mods_kernel.h's FJ_MODS_RT_NAME).
 */
#ifndef FJ_REL_TABLE_H
#define FJ_REL_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "ctx.h"
#include "kparams.h"

/* The table's bytes for p (float32 [heads_q][Q + K - 1], Q and K the
 * lengths rounded up to mods_kernel.h's FJ_MODS_RT_PAD; rounded up to 16),
 * 0 where p's kernels read none. */
size_t fj__rt_bytes(const fj_problem *p);

/* The kernel that fills p's table, compiled or fetched from the caches;
 * ctx->lock held. */
fj_status fj__rt_kernel(fj_ctx *ctx, const fj_problem *p, fj_kernel **k);

/* Appends the table's launch argument (at device address table) to
 * mod_args, whose first `used` bytes fj__mods_args wrote (p not checked:
 * no record after them), then launches fn, p's table kernel, to fill it
 * on stream with kp, p's parameter block. */
fj_status fj__rt_pass(fj_ctx *ctx, const fj_problem *p, void *fn,
                      uint64_t table, size_t used, unsigned char *mod_args,
                      fj_kparams *kp, void *stream);

#endif /* FJ_REL_TABLE_H */
