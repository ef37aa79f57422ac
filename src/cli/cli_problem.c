/*
 * cli_problem.c -- the problem of `run` and `tune` from --shape and friends,
 * checked before any GPU is looked for (its inputs: cli_inputs.c and
 * cli_mod_inputs.c; the check against the reference: cli_check.c).
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* A placeholder for the index arrays of a problem that is only planned or
 * checked: the library looks at which pointers are set, not at them. */
static const int32_t index_placeholder[1];

/* --varlen against the problem's bounds: one item per sequence, each
 * within seq_q and seq_kv (a seq_kv below 1 is the library's to name). */
static int check_varlen(const cli *c, int batch, int seq_q, int seq_kv)
{
  /* The list is quoted to its first 200 bytes, so that the item and the
   * limit after it stay in the message however many sequences it has. */
  char q[300];
  const char *list = cli_quote(c->varlen, q, sizeof q);
  if (c->nlens != batch)
    return cli_usage_error(c, "invalid value '%s' for --varlen: %d items for "
                              "--shape's B = %d (one Q[:K] per sequence)",
                           list, c->nlens, batch);
  for (int b = 0; b < batch; b++) {
    if (c->lens[b].q > seq_q)
      return cli_usage_error(c, "invalid value '%s' for --varlen: item %d has "
                                "%d queries, more than --shape's S = %d",
                             list, b + 1, c->lens[b].q, seq_q);
    if (seq_kv >= 1 && c->lens[b].kv > seq_kv)
      return cli_usage_error(c, "invalid value '%s' for --varlen: item %d has "
                                "%d keys, more than seq_kv = %d (--seq-kv, "
                                "default S)",
                             list, b + 1, c->lens[b].kv, seq_kv);
  }
  return 0;
}

/* --varlen: Q, O, K and V as packed tokens, with their totals (what the
 * wgmma family's tensor maps need). */
static void varlen_problem(const cli *c, fj_problem *p)
{
  long long tq = 0, tkv = 0;
  for (int b = 0; b < p->batch; b++) {
    tq += c->lens[b].q;
    tkv += c->lens[b].kv;
  }
  p->cu_seqlens_q = p->cu_seqlens_kv = index_placeholder;
  p->total_q = tq > INT32_MAX ? 0 : (int)tq;  /* 0: the mma family takes it */
  p->total_kv = tkv > INT32_MAX ? 0 : (int)tkv;
}

/* --page-size N: K and V as pages of N tokens (NHD), as many pages as the
 * sequences use (at least one), a table row of ceil(seq_kv / N) pages per
 * sequence, and each sequence's keys in seqused_kv.  A page size the
 * library refuses gets one page, for fj_problem_check to name. */
static void page_problem(const cli *c, fj_problem *p)
{
  int n = c->page_size;
  p->page_size = n;
  p->block_table = p->seqused_kv = index_placeholder;
  p->cu_seqlens_kv = NULL;
  p->total_kv = 0;
  p->max_pages = p->num_pages = 1;
  if (n < 1 || p->seq_kv < 1)
    return;
  long long pages = 0;
  for (int b = 0; b < p->batch; b++)
    pages += cli_pages_for(c->lens ? c->lens[b].kv : p->seq_kv, n);
  p->max_pages = (int)cli_pages_for(p->seq_kv, n);
  p->num_pages = pages < 1 ? 1 : pages > INT32_MAX ? INT32_MAX : (int)pages;
  int dv = p->head_dim_v ? p->head_dim_v : p->head_dim;
  int64_t row = (int64_t)p->heads_kv * p->head_dim, vrow = (int64_t)p->heads_kv * dv;
  int64_t s[3] = {row * n, p->head_dim, row}, sv[3] = {vrow * n, dv, vrow};
  memcpy(p->k_stride, s, sizeof s);
  memcpy(p->v_stride, sv, sizeof sv);
}

/* --head-dim-v: V and O contiguous with their own head dim (Q's and K's
 * strides stay fj_problem_init's); the strides are those of a problem of
 * that head dim in the same layout. */
static void split_dims(const cli *c, fj_problem *p, int b, int h, int hkv,
                       int s, int skv)
{
  fj_problem w;
  int dv = c->v.head_dim_v;
  p->head_dim_v = dv;
  if (!dv || dv == p->head_dim)
    return;
  fj_problem_init(&w, b, h, hkv, s, skv, dv, c->v.dtype,
                  c->lens ? FJ_THD : c->order);
  memcpy(p->v_stride, w.v_stride, sizeof w.v_stride);
  memcpy(p->o_stride, w.o_stride, sizeof w.o_stride);
}

/* emit's problem when --shape is not given: B,H,S,D = 2,16,4096,D; with
 * --varlen B its items and S (and seq_kv, unless given) their longest. */
static void emit_default_shape(cli *c, int *skv)
{
  int q = 1, kv = 1;
  for (int b = 0; b < c->nlens; b++) {
    q = c->lens[b].q > q ? c->lens[b].q : q;
    kv = c->lens[b].kv > kv ? c->lens[b].kv : kv;
  }
  c->shape[0] = c->lens ? c->nlens : 2;
  c->shape[1] = 16;
  c->shape[2] = c->lens ? q : 4096;
  c->shape[3] = c->v.head_dim;
  if (!cli_flag_given(c, "seq-kv"))
    *skv = c->lens ? kv : c->shape[2];
}

int cli_problem(cli *c, fj_problem *p)
{
  int skv = c->seq_kv;
  if (!c->shape_given && c->cmd != CMD_EMIT)
    return cli_usage_error(c, "--shape B,H,S,D is required");
  if (!c->shape_given)
    emit_default_shape(c, &skv);
  else if (!cli_flag_given(c, "seq-kv"))
    skv = c->shape[2];
  int b = c->shape[0], h = c->shape[1], s = c->shape[2], dim = c->shape[3];
  /* Given values are taken as given: fj_problem_check names bad ones. */
  int hkv = cli_flag_given(c, "heads-kv") ? c->heads_kv : h;
  if (cli_flag_given(c, "head-dim") && c->v.head_dim != dim)
    return cli_usage_error(c, "--head-dim %d contradicts --shape's D = %d",
                           c->v.head_dim, dim);
  if (c->lens && cli_flag_given(c, "layout"))
    return cli_usage_error(c, "--layout does not apply with --varlen: its "
                              "sequences are packed tokens (thd)");
  int rc = c->lens ? check_varlen(c, b, s, skv) : 0;
  if (rc)
    return rc;
  if (c->latent && !(c->v.head_dim_v > 0 && c->v.head_dim_v < dim))
    return cli_usage_error(c, "--latent reads V as the first --head-dim-v columns "
                              "of K's rows: --head-dim-v must be below D = %d (got %d)",
                           dim, c->v.head_dim_v);
  c->v.head_dim = dim;
  fj_problem_init(p, b, h, hkv, s, skv, dim, c->v.dtype,
                  c->lens ? FJ_THD : c->order);
  split_dims(c, p, b, h, hkv, s, skv);
  p->causal = c->v.causal;
  p->kv_dtype = c->v.kv_dtype;
  p->scale_layout = c->scale_layout;
  p->o_dtype = c->v.o_dtype;
  p->splits = c->splits;
  p->deterministic = c->deterministic;
  p->mods = c->mods_on ? &c->mods : NULL;
  cli_block_mask_shape(c, p);
  if (c->lens)
    varlen_problem(c, p);
  if (cli_flag_given(c, "page-size"))
    page_problem(c, p);
  /* --latent: V is K's rows (their first head_dim_v columns). */
  if (c->latent)
    memcpy(p->v_stride, p->k_stride, sizeof p->k_stride);
  return 0;
}

/* The variant the flags give, checked on a compile-only sm_90a context:
 * a value out of range, an axis value not implemented or a combination
 * over sm_90a's limits (the most any target allows) is refused on every
 * GPU, so it is refused here, before one is looked for. */
static int check_given_variant(cli *c, fj_ctx *ctx)
{
  fj_status st = fj_variant_check(ctx, &c->v);
  return st == FJ_OK ? 0 : cli_fj_error(c, ctx, st);
}

/* The library's choice for the problem, planned for sm_90a: what it
 * refuses for every target (FP8 K/V in pages of stages 1, say) is refused
 * here. */
static int check_plan(cli *c, fj_ctx *ctx, const fj_problem *p)
{
  fj_plan plan;
  fj_status st = fj_attention_plan(ctx, p, &plan);
  return st == FJ_OK || st == FJ_ERR_RESOURCES ? 0 : cli_fj_error(c, ctx, st);
}

/* Checks the problem (and the variant the flags give, or else the
 * library's plan) before looking for a GPU, so that bad input is reported
 * as bad input on any machine. */
static int run_validate(cli *c, const fj_problem *p)
{
  if (cli_flag_given(c, "o-scale") && cli_o_dtype(p) != FJ_E4M3)
    return cli_usage_error(c, "--o-scale is an e4m3 O's scale: give --o-dtype e4m3 (with "
                              "--dtype e4m3) too, or leave it out");
  fj_ctx *ctx;
  int rc = cli_open_ctx(c, -1, "sm_90a", &ctx);
  if (rc)
    return rc;
  /* FP8 scales are allocated later; only their presence is checked here. */
  static const float placeholder[1];
  fj_problem check = *p;
  if (check.kv_dtype == FJ_E4M3 || check.dtype == FJ_E4M3)
    check.k_scale = check.v_scale = check.q_scale = placeholder;
  fj_status st = fj_problem_check(ctx, &check);
  if (st != FJ_OK)
    rc = cli_fj_error(c, ctx, st);
  else if (c->backward)
    rc = cli_backward_validate(c, ctx, &check);
  else if (c->variant_given)
    rc = check_given_variant(c, ctx);
  else if (c->cmd == CMD_RUN && !c->sweep)
    rc = check_plan(c, ctx, &check);
  fj_ctx_destroy(ctx);
  return rc;
}

/* The problem of --shape and friends, checked without a GPU, and a context
 * on the device (run and tune). */
int cli_problem_on_device(cli *c, run_data *d, fj_ctx **ctx)
{
  memset(d, 0, sizeof *d);
  d->latent = c->latent;
  d->o_scale = c->o_scale;
  int rc = cli_problem(c, &d->p);
  if (!rc)
    rc = run_validate(c, &d->p);
  if (!rc)
    rc = cli_index_make(c, d, c->seed);
  if (!rc)
    rc = cli_open_ctx(c, c->device, NULL, ctx);
  if (rc)
    cli_index_free(&d->hix);
  return rc;
}
