/*
 * block_mask.h -- block_mask.c's internals for the tests: the builder's
 * kernel (its public calls, fj_block_mask_size and _build, are in
 * flashjit.h).
 */
#ifndef FJ_BLOCK_MASK_H
#define FJ_BLOCK_MASK_H

#include "flashjit.h"

/* The kernel fj_block_mask_build would launch for p's mask with blocks of
 * block_q x block_kv (compiled or fetched from the caches, no GPU needed;
 * it belongs to the context), after the same checks. */
fj_status fj__block_mask_kernel(fj_ctx *ctx, const fj_problem *p, int block_q,
                                int block_kv, fj_kernel **k);

#endif /* FJ_BLOCK_MASK_H */
