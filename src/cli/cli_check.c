/*
 * cli_check.c -- what `run` reports of its launches: the work they did
 * (TFLOP/s over the pairs a mask keeps) and, with --check, sampled rows
 * against the float64 reference.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* The (query, key) pairs of one sequence inside --window (and the causal
 * mask): the kernels skip the tiles outside, so only these count.  The
 * window sits on the causal diagonal, bottom-right unless top-left. */
static double window_pairs(const fj_problem *p, int len_q, int len_kv)
{
  const fj_mods *m = p->mods;
  long long off = p->causal == FJ_CAUSAL_TOP_LEFT ? 0 : (long long)len_kv - len_q;
  double pairs = 0;
  for (long long r = 0; r < len_q; r++) {
    long long diag = r + off;
    long long lo = m->window_left >= 0 ? diag - m->window_left : 0;
    long long hi = p->causal != FJ_CAUSAL_NONE ? diag
                   : m->window_right >= 0      ? diag + m->window_right
                                               : len_kv - 1;
    lo = lo > 0 ? lo : 0;
    hi = hi < len_kv - 1 ? hi : len_kv - 1;
    pairs += hi >= lo ? (double)(hi - lo + 1) : 0;
  }
  return pairs;
}

/* Two matrix products over each sequence's own queries and keys: half of
 * them under a causal mask (near enough), those inside a window exactly;
 * a mask expression hides pairs the kernels still compute, so all count. */
static double problem_flops(const run_data *d)
{
  const fj_problem *p = &d->p;
  int window = p->mods && (p->mods->window_left != -1 ||
                           p->mods->window_right != -1);
  double pairs = 0;
  for (int b = 0; b < p->batch; b++)
    pairs += window ? window_pairs(p, cli_len_q(d, b), cli_len_kv(d, b))
                    : (double)cli_len_q(d, b) * cli_len_kv(d, b);
  /* Q K^T over head_dim, P V over head_dim_v: 2 FLOPs a product each. */
  double f = 2.0 * p->heads_q * pairs * (p->head_dim + cli_head_dim_v(p));
  return p->causal != FJ_CAUSAL_NONE && !window ? f / 2 : f;
}

double cli_tflops(const run_data *d, double ms)
{
  return problem_flops(d) / (ms * 1e-3) / 1e12;
}

/* Appends a block of the check: rows r0..r1 - 1 of sequences b0..b1 - 1
 * (blocks holds room for them all: see check_blocks). */
static void add_block(run_data *d, int b0, int b1, int r0, int r1)
{
  check_block *k = &d->blocks[d->nblocks++];
  memset(k, 0, sizeof *k);
  k->b0 = b0;
  k->b1 = b1;
  k->r0 = r0;
  k->r1 = r1;
}

/* Adds one sequence range's blocks: all of its len rows when three blocks
 * of `rows` would cover them, else the start, middle and end. */
static void add_sampled(run_data *d, int b0, int b1, int len, int rows)
{
  if ((long long)rows * 3 >= len) {
    add_block(d, b0, b1, 0, len);
    return;
  }
  d->sampled = 1;
  int starts[3] = {0, len / 2 - rows / 2, len - rows};
  for (int i = 0; i < 3; i++)
    add_block(d, b0, b1, starts[i], starts[i] + rows);
}

/* The rows the check covers: all of them when the float64 reference is
 * cheap, else three blocks of each sequence (start, middle, end), about
 * 2e9 multiply-adds in all.  Fixed lengths: the same rows of every
 * sequence at once; --varlen: each sequence on its own, so that its own
 * end is checked and no row past it is computed.  0 or EXIT_FAIL. */
static int check_blocks(run_data *d)
{
  const fj_problem *p = &d->p;
  double keys = 0, pairs = 0;
  for (int b = 0; b < p->batch; b++) {
    keys += cli_len_kv(d, b);
    pairs += (double)cli_len_q(d, b) * cli_len_kv(d, b);
  }
  double per_pair = 1.0 * p->heads_q * (p->head_dim + cli_head_dim_v(p));
  double fit = keys > 0 ? 2e9 / (per_pair * keys) / 3 : (double)p->seq_q;
  int rows = (int)fmax(1, fmin((double)p->seq_q, fit));
  int sampled = pairs * per_pair > 2e9, varlen = d->hix.cu_q != NULL;
  d->blocks = calloc(varlen ? 3 * (size_t)p->batch : 3, sizeof *d->blocks);
  if (!d->blocks)
    return EXIT_FAIL;
  if (!varlen)
    add_sampled(d, 0, p->batch, p->seq_q, sampled ? rows : p->seq_q);
  for (int b = 0; varlen && b < p->batch; b++)
    if (cli_len_q(d, b) > 0)
      add_sampled(d, b, b + 1, cli_len_q(d, b),
                  sampled ? rows : cli_len_q(d, b));
  return 0;
}

typedef struct err_sum {
  double diff2, ref2, max_abs, max_ref, lse_diff2, lse_ref2;
  size_t nonfinite, checked;
} err_sum;

/* Compares one O row (converted to float) and its log-sum-exp l with the
 * reference's. */
static void compare_row(const float *row, const double *want, int dim,
                        double l, double want_lse, err_sum *e)
{
  for (int x = 0; x < dim; x++) {
    double o = row[x];
    if (!isfinite(o))
      e->nonfinite++;
    e->diff2 += (o - want[x]) * (o - want[x]);
    e->ref2 += want[x] * want[x];
    e->max_abs = fmax(e->max_abs, fabs(o - want[x]));
    e->max_ref = fmax(e->max_ref, fabs(want[x]));
  }
  if (isfinite(want_lse)) {
    e->lse_diff2 += (l - want_lse) * (l - want_lse);
    e->lse_ref2 += want_lse * want_lse;
  } else if (isfinite(l)) {
    e->nonfinite++;
  }
  e->checked++;
}

/* Compares a block's rows, of every sequence and head that has them (a
 * row past its sequence's end has no output), with their reference; a
 * sequence's row r is O's row cu_seqlens_q[b] + r when packed, and its
 * log-sum-exp entry r of [batch][heads_q][seq_q]. */
static void compare_block(const run_data *d, const check_block *k, err_sum *e)
{
  const fj_problem *p = &d->p;
  int rows = k->r1 - k->r0, dim = cli_head_dim_v(p);  /* O's columns */
  float *row = malloc(sizeof *row * (size_t)dim);
  for (int b = k->b0; b < k->b1 && row; b++)
    for (int h = 0; h < p->heads_q; h++)
      for (int r = k->r0; r < k->r1 && r < cli_len_q(d, b); r++) {
        int64_t first = d->hix.cu_q ? d->hix.cu_q[b] : 0;
        size_t base = (size_t)(b * p->o_stride[0] + h * p->o_stride[1] +
                               (first + r) * p->o_stride[2]);
        fj_convert(FJ_F32, row, cli_o_dtype(p), (const char *)d->ho + base * d->esize,
                   (size_t)dim);
        /* An e4m3 O carries its scale. */
        for (int x = 0; p->o_scale && x < dim; x++)
          row[x] /= d->o_scale;
        size_t ri = ((size_t)(b - k->b0) * (size_t)p->heads_q + (size_t)h) *
                        (size_t)rows + (size_t)(r - k->r0);
        size_t li = ((size_t)b * (size_t)p->heads_q + (size_t)h) * (size_t)p->seq_q +
                    (size_t)r;
        compare_row(row, k->ref + ri * (size_t)dim, dim, d->hlse[li],
                    k->lse[ri], e);
      }
  free(row);
}

/* The problem of sequences b0..b1 - 1 alone, with the host index arrays:
 * only for b0 0 or a varlen problem (whose Q and O are packed tokens and
 * K and V packed or paged, so that only the index arrays move). */
static fj_problem sub_problem(const run_data *d, int b0, int b1)
{
  fj_problem p = cli_host_problem(d);
  size_t hkv = p.scale_layout == FJ_SCALE_PER_TENSOR
                   ? 0
                   : (size_t)b0 * (size_t)p.heads_kv;
  p.batch = b1 - b0;
  p.cu_seqlens_q = p.cu_seqlens_q ? p.cu_seqlens_q + b0 : NULL;
  p.cu_seqlens_kv = p.cu_seqlens_kv ? p.cu_seqlens_kv + b0 : NULL;
  p.seqused_kv = p.seqused_kv ? p.seqused_kv + b0 : NULL;
  p.block_table = p.block_table ? p.block_table + (size_t)b0 * (size_t)p.max_pages
                                : NULL;
  p.k_scale = d->hks ? d->hks + hkv : NULL;
  p.q_scale = p.dtype == FJ_E4M3 && d->hqs ? d->hqs + hkv : NULL;
  p.v_scale = d->hvs ? d->hvs + hkv : NULL;
  return p;
}

/* The float64 reference of one block. */
static int reference_block(const run_data *d, check_block *k)
{
  fj_problem p = sub_problem(d, k->b0, k->b1);
  size_t cnt = (size_t)p.batch * (size_t)p.heads_q * (size_t)(k->r1 - k->r0);
  k->ref = malloc((cnt ? cnt : 1) * (size_t)cli_head_dim_v(&p) * sizeof(double));
  k->lse = malloc((cnt ? cnt : 1) * sizeof(double));
  if (!k->ref || !k->lse ||
      fj_reference_fwd(&p, d->hq, d->hk, d->hv, p.k_scale, p.v_scale, k->r0,
                       k->r1, k->ref, k->lse) != FJ_OK) {
    fprintf(stderr, "flashjit run: the reference failed: %s\n",
            fj_errmsg(NULL));
    return EXIT_FAIL;
  }
  return 0;
}

/* The float64 reference for the checked rows, computed once per run (and
 * tried again by the next check if it failed). */
static int reference_rows(run_data *d)
{
  if (d->blocks)
    return 0;
  if (check_blocks(d)) {
    fprintf(stderr, "flashjit run: out of host memory\n");
    return EXIT_FAIL;
  }
  for (int i = 0; i < d->nblocks; i++)
    if (reference_block(d, &d->blocks[i])) {
      cli_free_blocks(d);
      return EXIT_FAIL;
    }
  return 0;
}

/* The check's line: the rows compared -- per (batch, head), or with
 * --varlen per head, of all sequences' real rows -- and the errors. */
static void print_check(const run_data *d, const err_sum *e, double rel,
                        double lse_rel, int pass)
{
  const fj_problem *p = &d->p;
  long long rows = 0;
  for (int b = 0; b < p->batch; b++)
    rows += cli_len_q(d, b);
  int varlen = d->hix.cu_q != NULL;
  size_t per = (size_t)p->heads_q * (size_t)(varlen ? 1 : p->batch);
  printf("check: %zu of %lld rows per %s%s; rel_err=%.3e max_abs_err=%.3e "
         "lse_rel_err=%.3e nonfinite=%zu -> %s\n",
         e->checked / per, varlen ? rows : (long long)p->seq_q,
         varlen ? "head (all sequences)" : "(batch, head)",
         !d->sampled ? "" : varlen ? " (start, middle, end of each sequence)"
                                   : " (start, middle, end)",
         rel, e->max_abs, lse_rel, e->nonfinite, pass ? "PASS" : "FAIL");
}

/* Runs v (NULL: the library's choice) on poisoned outputs and compares O
 * and the log-sum-exp with the reference.  Prints one line unless quiet;
 * *rel gets the relative error.  0 on PASS. */
int cli_check_variant(const cli *c, fj_ctx *ctx, run_data *d,
                      const fj_variant *v, int quiet, double *rel_out)
{
  const fj_problem *p = &d->p;
  size_t nlse = (size_t)p->batch * (size_t)p->heads_q * (size_t)p->seq_q;
  /* Poison: 0xff bytes are NaN in f16 and bf16 (and in float32), so any
   * element the kernel fails to write shows up. */
  CUDA_TRY(cudaMemset(d->dout, 0xff, d->no * d->esize));
  CUDA_TRY(cudaMemset(d->dlse, 0xff, nlse * sizeof(float)));
  fj_status st = cli_launch_one(ctx, d, v, d->dlse);
  if (st != FJ_OK)
    return cli_fj_error(c, ctx, st);
  CUDA_TRY(cudaDeviceSynchronize());
  CUDA_TRY(cudaMemcpy(d->ho, d->dout, d->no * d->esize, cudaMemcpyDeviceToHost));
  CUDA_TRY(cudaMemcpy(d->hlse, d->dlse, nlse * sizeof(float),
                      cudaMemcpyDeviceToHost));
  if (reference_rows(d))
    return EXIT_FAIL;
  err_sum e = {0};
  for (int i = 0; i < d->nblocks; i++)
    compare_block(d, &d->blocks[i], &e);
  double rel = e.ref2 > 0 ? sqrt(e.diff2 / e.ref2) : sqrt(e.diff2);
  double lse_rel = e.lse_ref2 > 0 ? sqrt(e.lse_diff2 / e.lse_ref2) : 0;
  fj_dtype kv = p->kv_dtype ? p->kv_dtype : p->dtype;
  /* FP8 attention rounds P to e4m3 too; FP8 K/V only their values; an
   * e4m3 O each element by up to 1/16 of itself (about 3.6% RMS, cuDNN
   * FP8's error with its e4m3 O). */
  double limit = cli_o_dtype(p) == FJ_E4M3 ? 7e-2
                 : p->dtype == FJ_E4M3     ? 5e-2
                 : kv == FJ_E4M3           ? 3e-2
                                           : 1e-2;
  /* bf16 with a softcap sums P as P.V takes it, rounded to bf16 (so that
   * one visible key gives V exactly): the log-sum-exp carries that
   * rounding, up to about two bf16 steps. */
  int capped = p->dtype == FJ_BF16 && p->mods && p->mods->softcap > 0.f;
  double lse_limit = capped ? 8e-3 : 1e-3;
  int pass = e.nonfinite == 0 && rel < limit && lse_rel < lse_limit;
  *rel_out = rel;
  if (!quiet)
    print_check(d, &e, rel, lse_rel, pass);
  /* FP8 attention's max |O| (o_amax) beside the reference's largest of
   * the rows checked: they differ by FP8's error. */
  if (!quiet && d->damax) {
    float amax = 0.f;
    CUDA_TRY(cudaMemcpy(&amax, d->damax, sizeof amax, cudaMemcpyDeviceToHost));
    printf("amax: %.6g (o_amax; the reference's largest |O| of the rows checked: %.6g)\n",
           (double)amax, e.max_ref);
  }
  return pass ? 0 : EXIT_FAIL;
}
