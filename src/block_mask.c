/*
 * block_mask.c -- block masks (fj_block_mask): their checks against a
 * problem and a kernel's tiles, and fj_block_mask_build, which evaluates a
 * problem's mask per block on the GPU (templates/block_mask.cu).
 */
#include "flashjit.h"

#include "ctx.h"

fj_status fj_block_mask_size(fj_ctx *ctx, const fj_problem *p, int block_q,
                             int block_kv, size_t *bytes)
{
  (void)p; (void)block_q; (void)block_kv; (void)bytes;
  return fj__fail(ctx, FJ_ERR_UNSUPPORTED, "fj_block_mask_size: not built yet");
}

fj_status fj_block_mask_build(fj_ctx *ctx, const fj_problem *p, int block_q,
                              int block_kv, void *buf, size_t bytes,
                              fj_block_mask *out, void *stream)
{
  (void)p; (void)block_q; (void)block_kv; (void)buf; (void)bytes; (void)out;
  (void)stream;
  return fj__fail(ctx, FJ_ERR_UNSUPPORTED, "fj_block_mask_build: not built yet");
}
