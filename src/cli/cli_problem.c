/*
 * cli_problem.c -- the problem of `run` and `tune` from --shape and friends,
 * checked before any GPU is looked for; for `run`, its random inputs in
 * device memory and the check of a variant against the float64 reference.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int cli_cuda_failed(const char *what, cudaError_t e)
{
  fprintf(stderr, "flashjit run: %s failed: %s (%s)\n", what,
          cudaGetErrorName(e), cudaGetErrorString(e));
  return EXIT_FAIL;
}

/* Elements spanned by a tensor with these strides (last index + 1). */
static size_t span(const int64_t s[3], int b, int h, int seq, int d)
{
  return (size_t)((b - 1) * s[0] + (h - 1) * s[1] + (seq - 1) * s[2] + d);
}

/* A small xorshift generator: inputs reproducible from --seed. */
static float next_uniform(uint64_t *state)
{
  uint64_t x = *state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  *state = x;
  return (float)((double)(x >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
}

static void *random_tensor(fj_dtype dtype, size_t n, float scale,
                           uint64_t *state)
{
  float *f = malloc(n * sizeof *f);
  void *out = malloc(n * 2 + 16);
  if (!f || !out) {
    free(f);
    free(out);
    return NULL;
  }
  for (size_t i = 0; i < n; i++)
    f[i] = next_uniform(state) * scale;
  fj_convert(dtype, out, FJ_F32, f, n);
  free(f);
  return out;
}

/* FP8 K/V: values spread over e4m3's range (x 64) with per-(batch, head)
 * scales of 1/64 that bring them back. */
static int run_fp8_scales(run_data *d)
{
  size_t n = (size_t)d->p.batch * (size_t)d->p.heads_kv;
  d->hks = malloc(n * sizeof(float));
  d->hvs = malloc(n * sizeof(float));
  if (!d->hks || !d->hvs)
    return EXIT_FAIL;
  for (size_t i = 0; i < n; i++)
    d->hks[i] = d->hvs[i] = 1.0f / 64;
  CUDA_TRY(cudaMalloc((void **)&d->dks, n * sizeof(float)));
  CUDA_TRY(cudaMalloc((void **)&d->dvs, n * sizeof(float)));
  CUDA_TRY(cudaMemcpy(d->dks, d->hks, n * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_TRY(cudaMemcpy(d->dvs, d->hvs, n * sizeof(float), cudaMemcpyHostToDevice));
  d->p.k_scale = d->dks;
  d->p.v_scale = d->dvs;
  return 0;
}

int cli_run_alloc(run_data *d, int seed)
{
  const fj_problem *p = &d->p;
  fj_dtype kv = p->kv_dtype ? p->kv_dtype : p->dtype;
  float kv_scale = kv == FJ_E4M3 ? 64.f : 1.f;
  d->esize = 2;
  d->kvsize = kv == FJ_E4M3 ? 1 : 2;
  d->nq = span(p->q_stride, p->batch, p->heads_q, p->seq_q, p->head_dim);
  d->nk = span(p->k_stride, p->batch, p->heads_kv, p->seq_kv, p->head_dim);
  d->no = span(p->o_stride, p->batch, p->heads_q, p->seq_q, p->head_dim);
  uint64_t state = UINT64_C(0x9e3779b97f4a7c15) ^ (uint64_t)seed;
  d->hq = random_tensor(p->dtype, d->nq, 1.f, &state);
  d->hk = random_tensor(kv, d->nk, kv_scale, &state);
  d->hv = random_tensor(kv, d->nk, kv_scale, &state);
  if (kv == FJ_E4M3 && run_fp8_scales(d))
    return EXIT_FAIL;
  d->ho = malloc(d->no * d->esize);
  size_t nlse = (size_t)p->batch * (size_t)p->heads_q * (size_t)p->seq_q;
  d->hlse = malloc(nlse * sizeof(float));
  if (!d->hq || !d->hk || !d->hv || !d->ho || !d->hlse) {
    fprintf(stderr, "flashjit run: out of host memory\n");
    return EXIT_FAIL;
  }
  CUDA_TRY(cudaMalloc(&d->dq, d->nq * d->esize));
  CUDA_TRY(cudaMalloc(&d->dk, d->nk * d->kvsize));
  CUDA_TRY(cudaMalloc(&d->dv, d->nk * d->kvsize));
  CUDA_TRY(cudaMalloc(&d->dout, d->no * d->esize));
  CUDA_TRY(cudaMalloc((void **)&d->dlse, nlse * sizeof(float)));
  CUDA_TRY(cudaMemcpy(d->dq, d->hq, d->nq * d->esize, cudaMemcpyHostToDevice));
  CUDA_TRY(cudaMemcpy(d->dk, d->hk, d->nk * d->kvsize, cudaMemcpyHostToDevice));
  CUDA_TRY(cudaMemcpy(d->dv, d->hv, d->nk * d->kvsize, cudaMemcpyHostToDevice));
  return 0;
}

void cli_run_free(run_data *d)
{
  free(d->hq);
  free(d->hk);
  free(d->hv);
  free(d->ho);
  free(d->hlse);
  free(d->hks);
  free(d->hvs);
  cudaFree(d->dks);
  cudaFree(d->dvs);
  for (int i = 0; i < 3; i++) {
    free(d->ref[i]);
    free(d->ref_lse[i]);
  }
  cudaFree(d->dq);
  cudaFree(d->dk);
  cudaFree(d->dv);
  cudaFree(d->dout);
  cudaFree(d->dlse);
}

/* One launch: variant v, or the library's choice when v is NULL. */
fj_status cli_launch_one(fj_ctx *ctx, run_data *d, const fj_variant *v,
                         float *lse)
{
  if (v)
    return fj_attention_fwd_variant(ctx, &d->p, v, d->dq, d->dk, d->dv,
                                    d->dout, lse, NULL);
  return fj_attention_fwd(ctx, &d->p, d->dq, d->dk, d->dv, d->dout, lse, NULL);
}

static double problem_flops(const fj_problem *p)
{
  double f = 4.0 * p->batch * p->heads_q * (double)p->seq_q * p->seq_kv *
             p->head_dim;
  return p->causal != FJ_CAUSAL_NONE ? f / 2 : f;
}

double cli_tflops(const fj_problem *p, double ms)
{
  return problem_flops(p) / (ms * 1e-3) / 1e12;
}

/* Rows of every (batch, head) the check covers: all of them when the float64
 * reference is cheap, else three evenly spaced blocks (start, middle, end). */
static int check_ranges(const fj_problem *p, int ranges[3][2])
{
  double per_row = 2.0 * p->batch * p->heads_q * (double)p->seq_kv *
                   p->head_dim;
  int rows = (int)fmin((double)p->seq_q, 2e9 / per_row / 3);
  if (rows < 1)
    rows = 1;
  if ((double)p->seq_q * per_row <= 2e9 || rows * 3 >= p->seq_q) {
    ranges[0][0] = 0;
    ranges[0][1] = p->seq_q;
    return 1;
  }
  int mid = p->seq_q / 2 - rows / 2;
  int starts[3] = {0, mid, p->seq_q - rows};
  for (int i = 0; i < 3; i++) {
    ranges[i][0] = starts[i];
    ranges[i][1] = starts[i] + rows;
  }
  return 3;
}

typedef struct err_sum {
  double diff2, ref2, max_abs, lse_diff2, lse_ref2;
  size_t nonfinite, checked;
} err_sum;

static void compare_range(const run_data *d, const double *ref,
                          const double *ref_lse, int r0, int r1, err_sum *e)
{
  const fj_problem *p = &d->p;
  int rows = r1 - r0, dim = p->head_dim;
  float *row = malloc(sizeof *row * (size_t)dim);
  for (int b = 0; b < p->batch && row; b++)
    for (int h = 0; h < p->heads_q; h++)
      for (int r = 0; r < rows; r++) {
        size_t base = (size_t)(b * p->o_stride[0] + h * p->o_stride[1] +
                               (r0 + r) * p->o_stride[2]);
        fj_convert(FJ_F32, row, p->dtype, (const char *)d->ho + base * 2,
                   (size_t)dim);
        size_t ri = ((size_t)(b * p->heads_q + h) * (size_t)rows + (size_t)r);
        for (int x = 0; x < dim; x++) {
          double o = row[x], want = ref[ri * (size_t)dim + (size_t)x];
          if (!isfinite(o))
            e->nonfinite++;
          e->diff2 += (o - want) * (o - want);
          e->ref2 += want * want;
          e->max_abs = fmax(e->max_abs, fabs(o - want));
        }
        double l = d->hlse[(size_t)(b * p->heads_q + h) * (size_t)p->seq_q +
                           (size_t)(r0 + r)];
        if (isfinite(ref_lse[ri])) {
          e->lse_diff2 += (l - ref_lse[ri]) * (l - ref_lse[ri]);
          e->lse_ref2 += ref_lse[ri] * ref_lse[ri];
        } else if (isfinite(l)) {
          e->nonfinite++;
        }
        e->checked++;
      }
  free(row);
}

/* The float64 reference for the checked rows, computed once per run. */
static int reference_rows(run_data *d)
{
  const fj_problem *p = &d->p;
  if (d->nranges)
    return 0;
  d->nranges = check_ranges(p, d->ranges);
  for (int i = 0; i < d->nranges; i++) {
    int rows = d->ranges[i][1] - d->ranges[i][0];
    size_t cnt = (size_t)p->batch * (size_t)p->heads_q * (size_t)rows;
    d->ref[i] = malloc(cnt * (size_t)p->head_dim * sizeof(double));
    d->ref_lse[i] = malloc(cnt * sizeof(double));
    if (!d->ref[i] || !d->ref_lse[i] ||
        fj_reference_fwd(p, d->hq, d->hk, d->hv, d->hks, d->hvs,
                         d->ranges[i][0], d->ranges[i][1], d->ref[i],
                         d->ref_lse[i]) != FJ_OK) {
      fprintf(stderr, "flashjit run: the reference failed\n");
      return EXIT_FAIL;
    }
  }
  return 0;
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
  for (int i = 0; i < d->nranges; i++)
    compare_range(d, d->ref[i], d->ref_lse[i], d->ranges[i][0],
                  d->ranges[i][1], &e);
  double rel = e.ref2 > 0 ? sqrt(e.diff2 / e.ref2) : sqrt(e.diff2);
  double lse_rel = e.lse_ref2 > 0 ? sqrt(e.lse_diff2 / e.lse_ref2) : 0;
  fj_dtype kv = p->kv_dtype ? p->kv_dtype : p->dtype;
  double limit = kv == FJ_E4M3 ? 3e-2 : 1e-2;
  int pass = e.nonfinite == 0 && rel < limit && lse_rel < 1e-3;
  *rel_out = rel;
  if (!quiet)
    printf("check: %zu of %d rows per (batch, head)%s; rel_err=%.3e "
           "max_abs_err=%.3e lse_rel_err=%.3e nonfinite=%zu -> %s\n",
           e.checked / (size_t)(p->batch * p->heads_q), p->seq_q,
           d->nranges > 1 ? " (start, middle, end)" : "", rel, e.max_abs,
           lse_rel, e.nonfinite, pass ? "PASS" : "FAIL");
  return pass ? 0 : EXIT_FAIL;
}

int cli_problem(cli *c, fj_problem *p)
{
  int b = c->shape[0], h = c->shape[1], s = c->shape[2], dim = c->shape[3];
  if (!c->shape_given)
    return cli_usage_error(c, "--shape B,H,S,D is required");
  /* Given values are taken as given: fj_problem_check names bad ones. */
  int hkv = cli_flag_given(c, "heads-kv") ? c->heads_kv : h;
  int skv = cli_flag_given(c, "seq-kv") ? c->seq_kv : s;
  if (c->head_dim_given && c->v.head_dim != dim)
    return cli_usage_error(c, "--head-dim %d contradicts --shape's D = %d",
                           c->v.head_dim, dim);
  c->v.head_dim = dim;
  fj_problem_init(p, b, h, hkv, s, skv, dim, c->v.dtype, c->order);
  p->causal = c->v.causal;
  p->kv_dtype = c->v.kv_dtype;
  p->splits = c->splits;
  return 0;
}

/* Checks the problem before looking for a GPU, so that bad input is
 * reported as bad input on any machine. */
static int run_validate(cli *c, const fj_problem *p)
{
  fj_ctx *ctx;
  int rc = cli_open_ctx(c, -1, "sm_90a", &ctx);
  if (rc)
    return rc;
  /* FP8 scales are allocated later; only their presence is checked here. */
  static const float placeholder[1];
  fj_problem check = *p;
  if (check.kv_dtype == FJ_E4M3)
    check.k_scale = check.v_scale = placeholder;
  fj_status st = fj_problem_check(ctx, &check);
  if (st != FJ_OK)
    rc = cli_fj_error(c, ctx, st);
  fj_ctx_destroy(ctx);
  return rc;
}

/* The problem of --shape and friends, checked without a GPU, and a context
 * on the device (run and tune). */
int cli_problem_on_device(cli *c, run_data *d, fj_ctx **ctx)
{
  memset(d, 0, sizeof *d);
  int rc = cli_problem(c, &d->p);
  if (!rc)
    rc = run_validate(c, &d->p);
  return rc ? rc : cli_open_ctx(c, c->device, NULL, ctx);
}

