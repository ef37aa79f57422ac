/*
 * cli_run_bwd.c -- `flashjit run --backward`: the library's backward
 * (fj_attention_bwd) of the --shape problem on the GPU, after one forward
 * that gives it O and the log-sum-exp: its plan, the time of its first
 * call, its median time as run times the forward, TFLOP/s counted as 2.5
 * x the forward's FLOPs, and with --check dq, dk, dv (and dsinks) against
 * the float64 reference of every element (fj_reference_bwd).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

/* The check's host reference costs about B x H x Sq x Skv x D / 4e7
 * seconds of one core: above this, about 10 s, it is refused. */
#define CHECK_WORK_MAX 536870912.0

/* The backward's own buffers: dO (random, on the host and the device) and
 * the gradients (device). */
typedef struct bwd_data {
  fj_bwd_plan plan;
  void *hdo, *ddo;
  void *gq, *gk, *gv;
  float *gsinks;  /* with --sinks */
} bwd_data;

/* One backward of the library's choice, for cli_time_calls. */
typedef struct bwd_call {
  fj_ctx *ctx;
  run_data *d;
  bwd_data *b;
} bwd_call;

static fj_status call_bwd(void *arg)
{
  bwd_call *x = arg;
  const run_data *d = x->d;
  return fj_attention_bwd(x->ctx, &d->p, d->dq, d->dk, d->dv, d->dout,
                          x->b->ddo, d->dlse, x->b->gq, x->b->gk, x->b->gv,
                          x->b->gsinks, NULL);
}

int cli_backward_validate(cli *c, fj_ctx *ctx, const fj_problem *p)
{
  fj_bwd_plan plan;
  fj_status st = fj_attention_bwd_plan(ctx, p, &plan);
  if (st != FJ_OK)
    return cli_fj_error(c, ctx, st);
  double work = (double)p->batch * p->heads_q * p->seq_q * p->seq_kv *
                p->head_dim;
  if (c->cmd == CMD_RUN && c->check && work > CHECK_WORK_MAX)
    return cli_usage_error(
        c, "--check with --backward computes the float64 reference of every "
           "gradient on the host: B x H x Sq x Skv x D = %.0f is over %.0f "
           "(about 10 s of one core); check a smaller --shape",
        work, CHECK_WORK_MAX);
  return 0;
}

/* dO from --seed (after the inputs' numbers), and the gradients' buffers. */
static int bwd_alloc(const cli *c, const run_data *d, bwd_data *b)
{
  const fj_problem *p = &d->p;
  uint64_t state = cli_seed_state(c->seed) ^ UINT64_C(0x64646f7574);  /* "ddout" */
  b->hdo = cli_random_tensor(p->dtype, d->no, 1.f, &state);
  if (!b->hdo) {
    fprintf(stderr, "flashjit run: out of host memory\n");
    return EXIT_FAIL;
  }
  CUDA_TRY(cudaMalloc(&b->ddo, d->no * d->esize));
  CUDA_TRY(cudaMemcpy(b->ddo, b->hdo, d->no * d->esize, cudaMemcpyHostToDevice));
  CUDA_TRY(cudaMalloc(&b->gq, d->nq * d->esize));
  CUDA_TRY(cudaMalloc(&b->gk, d->nk * d->esize));
  CUDA_TRY(cudaMalloc(&b->gv, d->nv * d->esize));
  if (p->mods && p->mods->sinks)
    CUDA_TRY(cudaMalloc((void **)&b->gsinks, (size_t)p->heads_q * sizeof(float)));
  return 0;
}

static void bwd_free(bwd_data *b)
{
  free(b->hdo);
  cudaFree(b->ddo);
  cudaFree(b->gq);
  cudaFree(b->gk);
  cudaFree(b->gv);
  cudaFree(b->gsinks);
}

static double ms_since(const struct timespec *a)
{
  struct timespec z;
  clock_gettime(CLOCK_MONOTONIC, &z);
  return (double)(z.tv_sec - a->tv_sec) * 1e3 +
         (double)(z.tv_nsec - a->tv_nsec) * 1e-6;
}

/* The plan's lines: its three kernels (the main one's family and tiles),
 * grid, block, shared memory and workspace. */
static int print_plan(cli *c, fj_ctx *ctx, const run_data *d,
                      const fj_bwd_plan *plan)
{
  const char *names[FJ_BWD_KERNELS];
  for (int i = 0; i < FJ_BWD_KERNELS; i++) {
    fj_kernel *k;
    fj_status st = fj_attention_bwd_kernel(ctx, &d->p, plan, i, &k);
    if (st != FJ_OK)
      return cli_fj_error(c, ctx, st);
    names[i] = fj_kernel_name(k);
  }
  const fj_variant *v = &plan->variant;
  printf("backward%s: %s (mma %s, tiles %d x %d, %d warps, %d stage%s); "
         "preprocess %s, postprocess %s\n",
         d->p.deterministic ? " (deterministic)" : "", names[1],
         fj_mma_name(v->mma), v->tile_m, v->tile_n, v->warps, v->stages,
         v->stages == 1 ? "" : "s", names[0], names[2]);
  printf("grid: %u,%u,%u x %u threads, %u bytes of dynamic shared memory; "
         "workspace %zu bytes\n",
         plan->grid[0], plan->grid[1], plan->grid[2], plan->threads,
         plan->smem_bytes, plan->workspace_bytes);
  return 0;
}

/* The forward (O and the LSE), then the backward's first call (its
 * compile or cache fetch, load and run), timed; the plan it made. */
static int bwd_report(cli *c, fj_ctx *ctx, run_data *d, bwd_data *b)
{
  fj_status st = cli_launch_one(ctx, d, NULL, d->dlse);
  if (st != FJ_OK)
    return cli_fj_error(c, ctx, st);
  CUDA_TRY(cudaDeviceSynchronize());
  struct timespec a;
  clock_gettime(CLOCK_MONOTONIC, &a);
  bwd_call x = {ctx, d, b};
  if ((st = call_bwd(&x)) != FJ_OK)
    return cli_fj_error(c, ctx, st);
  CUDA_TRY(cudaDeviceSynchronize());
  double ms = ms_since(&a);
  /* The plan the call made (the context remembers it: no render). */
  if ((st = fj_attention_bwd_plan(ctx, &d->p, &b->plan)) != FJ_OK)
    return cli_fj_error(c, ctx, st);
  cli_print_problem(c, ctx, d);
  int rc = print_plan(c, ctx, d, &b->plan);
  if (!rc)
    printf("first call (compile or cache fetch, load, run): %.1f ms\n", ms);
  return rc;
}

static int bwd_timed(cli *c, fj_ctx *ctx, run_data *d, bwd_data *b)
{
  int iters = c->iters > 0 ? c->iters : 20;
  cli_timing t;
  bwd_call x = {ctx, d, b};
  fj_status st = cli_time_calls(call_bwd, &x, c->warmup, iters, &t);
  if (st != FJ_OK)
    return cli_fj_error(c, ctx, st);
  CUDA_TRY(cudaGetLastError());
  printf("time: median %.1f us, min %.1f us over %d runs; %.1f TFLOP/s "
         "(2.5 x the forward's FLOPs)\n",
         t.median_ms * 1e3, t.min_ms * 1e3, iters,
         2.5 * cli_tflops(d, t.median_ms));
  return 0;
}

/* ---- --check ------------------------------------------------------------------- */

typedef struct grad_err {
  double diff2, ref2;
} grad_err;

typedef struct bwd_errs {
  grad_err g[4];  /* dq, dk, dv, dsinks */
  double max_abs;
  size_t nonfinite;
} bwd_errs;

static void compare_one(double got, double want, grad_err *g, bwd_errs *e)
{
  if (!isfinite(got))
    e->nonfinite++;
  g->diff2 += (got - want) * (got - want);
  g->ref2 += want * want;
  e->max_abs = fmax(e->max_abs, fabs(got - want));
}

/* Compares every element of one gradient the strides address (heads of
 * them, seq rows each): got in the problem's dtype, want float32. */
static void compare_grad(const run_data *d, const void *got, const float *want,
                         const int64_t s[3], int heads, int seq, grad_err *g,
                         bwd_errs *e)
{
  const fj_problem *p = &d->p;
  float *row = malloc(sizeof *row * (size_t)p->head_dim);
  for (int bi = 0; bi < p->batch && row; bi++)
    for (int h = 0; h < heads; h++)
      for (int r = 0; r < seq; r++) {
        size_t at = (size_t)(bi * s[0] + h * s[1] + r * s[2]);
        fj_convert(FJ_F32, row, p->dtype, (const char *)got + at * d->esize,
                   (size_t)p->head_dim);
        for (int x = 0; x < p->head_dim; x++)
          compare_one(row[x], want[at + (size_t)x], g, e);
      }
  free(row);
}

static double rel_of(const grad_err *g)
{
  return g->ref2 > 0 ? sqrt(g->diff2 / g->ref2) : sqrt(g->diff2);
}

/* The host gradients: downloaded (got: dq, dk, dv in the dtype, then
 * dsinks as float32) and the reference's (want: float32, dsinks last). */
typedef struct bwd_host {
  void *got[3];
  float *want[3];
  float *gsinks, *rsinks;  /* heads_q each, with --sinks */
} bwd_host;

static void host_free(bwd_host *h)
{
  for (int i = 0; i < 3; i++) {
    free(h->got[i]);
    free(h->want[i]);
  }
  free(h->gsinks);
  free(h->rsinks);
}

/* Runs the backward on poisoned gradients and downloads them. */
static int bwd_download(cli *c, fj_ctx *ctx, run_data *d, bwd_data *b,
                        bwd_host *h)
{
  const size_t n[3] = {d->nq, d->nk, d->nv};
  void *dev[3] = {b->gq, b->gk, b->gv};
  size_t nsinks = (size_t)d->p.heads_q * sizeof(float);
  /* 0xff bytes are NaN in f16, bf16 and float32: an element the kernels
   * fail to write shows. */
  for (int i = 0; i < 3; i++)
    CUDA_TRY(cudaMemset(dev[i], 0xff, n[i] * d->esize));
  if (b->gsinks)
    CUDA_TRY(cudaMemset(b->gsinks, 0xff, nsinks));
  bwd_call x = {ctx, d, b};
  fj_status st = call_bwd(&x);
  if (st != FJ_OK)
    return cli_fj_error(c, ctx, st);
  CUDA_TRY(cudaDeviceSynchronize());
  for (int i = 0; i < 3; i++) {
    h->got[i] = malloc(n[i] * d->esize);
    h->want[i] = calloc(n[i], sizeof(float));
    if (!h->got[i] || !h->want[i]) {
      fprintf(stderr, "flashjit run: out of host memory\n");
      return EXIT_FAIL;
    }
    CUDA_TRY(cudaMemcpy(h->got[i], dev[i], n[i] * d->esize,
                        cudaMemcpyDeviceToHost));
  }
  if (b->gsinks && (!(h->gsinks = malloc(nsinks)) ||
                    !(h->rsinks = malloc(nsinks)))) {
    fprintf(stderr, "flashjit run: out of host memory\n");
    return EXIT_FAIL;
  }
  if (b->gsinks)
    CUDA_TRY(cudaMemcpy(h->gsinks, b->gsinks, nsinks, cudaMemcpyDeviceToHost));
  return 0;
}

/* The check's line: each gradient's relative error, and the verdict
 * (test_gpu_backward.c's bounds: bf16 rounds P and dS to 8 bits on their
 * way through shared memory, as cuDNN and FlashAttention do). */
static int print_verdict(const run_data *d, const bwd_errs *e, int sinks)
{
  double limit = d->p.dtype == FJ_BF16 ? 3e-2 : 1e-2, worst = 0;
  for (int i = 0; i < 3 + sinks; i++)
    worst = isnan(rel_of(&e->g[i])) ? (double)INFINITY
                                    : fmax(worst, rel_of(&e->g[i]));
  int pass = e->nonfinite == 0 && worst < limit;
  printf("check: every element against the float64 reference; dq rel_err=%.3e "
         "dk rel_err=%.3e dv rel_err=%.3e",
         rel_of(&e->g[0]), rel_of(&e->g[1]), rel_of(&e->g[2]));
  if (sinks)
    printf(" dsinks rel_err=%.3e", rel_of(&e->g[3]));
  printf(" max_abs_err=%.3e nonfinite=%zu (limit %.0e) -> %s\n", e->max_abs,
         e->nonfinite, limit, pass ? "PASS" : "FAIL");
  return pass ? 0 : EXIT_FAIL;
}

static int bwd_check(cli *c, fj_ctx *ctx, run_data *d, bwd_data *b)
{
  const fj_problem *p = &d->p;
  int sinks = b->gsinks != NULL;
  bwd_host h;
  memset(&h, 0, sizeof h);
  int rc = bwd_download(c, ctx, d, b, &h);
  fj_problem hp = cli_host_problem(d);
  if (!rc && fj_reference_bwd(&hp, d->hq, d->hk, d->hv, b->hdo, h.want[0],
                              h.want[1], h.want[2],
                              sinks ? h.rsinks : NULL) != FJ_OK) {
    fprintf(stderr, "flashjit run: the reference failed: %s\n",
            fj_errmsg(NULL));
    rc = EXIT_FAIL;
  }
  if (!rc) {
    bwd_errs e;
    memset(&e, 0, sizeof e);
    compare_grad(d, h.got[0], h.want[0], p->q_stride, p->heads_q, p->seq_q,
                 &e.g[0], &e);
    compare_grad(d, h.got[1], h.want[1], p->k_stride, p->heads_kv, p->seq_kv,
                 &e.g[1], &e);
    compare_grad(d, h.got[2], h.want[2], p->v_stride, p->heads_kv, p->seq_kv,
                 &e.g[2], &e);
    for (int i = 0; sinks && i < p->heads_q; i++)
      compare_one(h.gsinks[i], h.rsinks[i], &e.g[3], &e);
    rc = print_verdict(d, &e, sinks);
  }
  host_free(&h);
  return rc;
}

int cli_run_backward(cli *c, fj_ctx *ctx, run_data *d)
{
  CUDA_TRY(cudaSetDevice(c->device));
  bwd_data b;
  memset(&b, 0, sizeof b);
  int rc = cli_run_alloc(d, c->seed);
  if (!rc)
    rc = cli_run_mods(c, d, c->seed);
  /* --block-mask: both directions' lists built on the GPU (the backward
   * walks the transposed ones), and their download for --check. */
  if (!rc)
    rc = cli_run_block_mask(c, ctx, d);
  if (!rc)
    rc = bwd_alloc(c, d, &b);
  if (!rc)
    rc = bwd_report(c, ctx, d, &b);
  if (!rc)
    rc = bwd_timed(c, ctx, d, &b);
  if (!rc && c->check)
    rc = bwd_check(c, ctx, d, &b);
  bwd_free(&b);
  return rc;
}
