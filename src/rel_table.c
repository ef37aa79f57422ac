/*
 * rel_table.c -- a score expression's relative table: its bytes, its
 * kernel (templates/rel_table.cu) and its pass before the attention
 * kernels that read it (rel_table.h).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "flashjit.h"

#include "driver.h"
#include "kernel.h"
#include "mods.h"
#include "mods_kernel.h"
#include "rel_table.h"
#include "util.h"

/* Columns a head's row of the table has: every distance kv - q of tiles
 * over the lengths rounded up to FJ_MODS_RT_PAD (mods_kernel.h). */
static int64_t columns(const fj_problem *p)
{
  return fj__mods_rt_pad(p->seq_q) + fj__mods_rt_pad(p->seq_kv) + FJ_MODS_RT_PAD - 1;
}

size_t fj__rt_bytes(const fj_problem *p)
{
  if (!fj__mods_rt_on(p->mods))
    return 0;
  return ((size_t)p->heads_q * (size_t)columns(p) * sizeof(float) + 15) / 16 * 16;
}

fj_status fj__rt_kernel(fj_ctx *ctx, const fj_problem *p, fj_kernel **k)
{
  const fj_mods *m = p->mods;
  char symbol[64];
  snprintf(symbol, sizeof symbol, "fj_rel_table_x%08x",
           (unsigned)(fj__mods_hash(m) & 0xffffffffu));
  const fj_param own[] = {{"score_mod", FJ_PARAM_STR, 0, m->score, NULL},
                         {"pad", FJ_PARAM_INT, FJ_MODS_RT_PAD, NULL, NULL}};
  return fj__kernel_build_mods(ctx, "rel_table.cu", symbol, m, own,
                               FJ_ARRAY_LEN(own), k);
}

fj_status fj__rt_pass(fj_ctx *ctx, const fj_problem *p, void *fn,
                      uint64_t table, size_t used, unsigned char *mod_args,
                      fj_kparams *kp, void *stream)
{
  int64_t n = columns(p);
  if (n > INT32_MAX)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "seq_q %d + seq_kv %d: the score expression's relative "
                    "table counts at most %d distances",
                    p->seq_q, p->seq_kv, INT32_MAX);
  /* templates/mods.cuh's ModTensor: the pointer, then 4 int32 extents. */
  const int32_t e[4] = {p->heads_q, (int32_t)n, 0, 0};
  memcpy(mod_args + used, &table, sizeof table);
  memcpy(mod_args + used + 8, e, sizeof e);
  void *args[2] = {kp, mod_args};
  int64_t bx = (n + 255) / 256;
  fj_launch l = {fn,
                 {(unsigned)(bx < 1024 ? bx : 1024),
                  (unsigned)(p->heads_q < 65535 ? p->heads_q : 65535), 1},
                 {256, 1, 1}, 0, stream, args, 0};
  return fj__cu_launch(ctx, &l);
}
