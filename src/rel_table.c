/*
 * rel_table.c -- a score expression's relative table: its bytes, its
 * kernel (templates/rel_table.cu) and its pass before the attention
 * kernels that read it (rel_table.h).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashjit.h"

#include "driver.h"
#include "kernel.h"
#include "mods.h"
#include "mods_kernel.h"
#include "rel_table.h"
#include "util.h"

/* Columns a head's row of the table has: every distance kv - q of the
 * problem, -(seq_q - 1) .. seq_kv - 1. */
static int64_t columns(const fj_problem *p)
{
  return (int64_t)p->seq_q + p->seq_kv - 1;
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
  char symbol[64], params[FJ_MOD_PARAMS_MAX * (FJ_MOD_NAME_MAX + 8) + 1];
  snprintf(symbol, sizeof symbol, "fj_rel_table_x%08x",
           (unsigned)(fj__mods_hash(m) & 0xffffffffu));
  fj__mods_param_list(m, params, sizeof params);
  /* The score's facts (mods_kernel.h): heap, for their texts' room. */
  fj_mods_kparam *facts = malloc(sizeof *facts);
  char err[512] = "out of memory";
  if (!facts || fj__mods_kparam(m, facts, err, sizeof err)) {
    free(facts);
    return fj__fail(ctx, FJ_ERR_NOMEM, "%s", err);
  }
  fj_param list[] = {
      {"template", FJ_PARAM_STR, 0, "rel_table.cu", NULL},
      {"symbol", FJ_PARAM_STR, 0, symbol, NULL},
      {"arch", FJ_PARAM_STR, 0, ctx->arch, NULL},
      {"sm", FJ_PARAM_INT, ctx->sm, NULL, NULL},
      {"version", FJ_PARAM_STR, 0, fj_version(), NULL},
      {"params_bytes", FJ_PARAM_INT, (long long)sizeof(fj_kparams), NULL, NULL},
      {"dtype", FJ_PARAM_STR, 0, "f16", NULL},  /* common.cuh's; no tensor is read */
      {"score_mod", FJ_PARAM_STR, 0, m->score, NULL},
      {"mod_params", FJ_PARAM_STR, 0, params, NULL},
      facts->param,
  };
  fj_status st = fj__kernel_build(ctx, "rel_table.cu", list, FJ_ARRAY_LEN(list), k);
  free(facts);
  return st;
}

fj_status fj__rt_pass(fj_ctx *ctx, const fj_problem *p, void *fn,
                      uint64_t table, size_t used, unsigned char *mod_args,
                      fj_kparams *kp, void *stream)
{
  int64_t n = columns(p);
  if (n > INT32_MAX)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "seq_q %d + seq_kv %d - 1 distances: the score "
                    "expression's relative table counts at most %d",
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
