/*
 * cli_run.c -- `flashjit run`: runs attention on the GPU and times it (and
 * with --check compares it with the reference), or with --sweep times every
 * variant of the sweep on the problem.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda.h>

#include "cli.h"

static fj_status run_once(const cli *c, fj_ctx *ctx, run_data *d, float *lse)
{
  return cli_launch_one(ctx, d, c->variant_given ? &c->v : NULL, lse);
}

static int cmp_float(const void *a, const void *b)
{
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

fj_status cli_time_calls(cli_call_fn call, void *arg, int warmup, int iters,
                         cli_timing *t)
{
  cudaEvent_t e0, e1;
  float *ms = calloc((size_t)iters, sizeof *ms);
  if (!ms || cudaEventCreate(&e0) != cudaSuccess ||
      cudaEventCreate(&e1) != cudaSuccess) {
    free(ms);
    return FJ_ERR_NOMEM;
  }
  fj_status st = FJ_OK;
  for (int i = 0; i < warmup && st == FJ_OK; i++)
    st = call(arg);
  for (int i = 0; i < iters && st == FJ_OK; i++) {
    cudaEventRecord(e0, NULL);
    st = call(arg);
    cudaEventRecord(e1, NULL);
    cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms[i], e0, e1);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  qsort(ms, (size_t)iters, sizeof *ms, cmp_float);
  t->median_ms = ms[iters / 2];
  t->min_ms = ms[0];
  free(ms);
  return st;
}

/* One launch of a variant (NULL: the library's choice), for
 * cli_time_calls. */
typedef struct fwd_call {
  fj_ctx *ctx;
  run_data *d;
  const fj_variant *v;
} fwd_call;

static fj_status call_fwd(void *arg)
{
  fwd_call *f = arg;
  return cli_launch_one(f->ctx, f->d, f->v, NULL);
}

/* Median and minimum of `iters` launches of v (NULL: the library's
 * choice), each between two events, after `warmup` untimed ones. */
static fj_status time_variant(fj_ctx *ctx, run_data *d, const fj_variant *v,
                              int warmup, int iters, cli_timing *t)
{
  fwd_call f = {ctx, d, v};
  return cli_time_calls(call_fwd, &f, warmup, iters, t);
}

/* The bare launches beside the library's call: what one call of the
 * library launched (fj_launch_record), launched again with the driver's
 * own entry points, taken from the runtime (the CLI links no driver). */
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned,
                              unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);
typedef CUresult (*memset32_fn)(CUdeviceptr, unsigned, size_t, CUstream);
typedef struct bare {
  launch_fn launch;
  memset32_fn memset32;
  fj_launches rec;
} bare;

static int entry_point(const char *symbol, void *fn, size_t size)
{
  void *p = NULL;
  enum cudaDriverEntryPointQueryResult found;
  if (cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault,
                                       &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess || !p)
    return 0;
  memcpy(fn, &p, size);
  return 1;
}

/* One call's launches as the library made them, counter zeroing
 * included; the first failure's result. */
static CUresult bare_call(const bare *b)
{
  const fj_launches *r = &b->rec;
  CUresult res = CUDA_SUCCESS;
  if (r->zero_words)
    res = b->memset32((CUdeviceptr)r->zero_at, 0, r->zero_words,
                      (CUstream)r->launch[0].stream);
  for (int i = 0; i < r->count && res == CUDA_SUCCESS; i++) {
    const fj_launch_rec *l = &r->launch[i];
    res = b->launch((CUfunction)l->function, l->grid[0], l->grid[1],
                    l->grid[2], l->block[0], l->block[1], l->block[2],
                    l->smem_bytes, (CUstream)l->stream, (void **)l->args,
                    NULL);
  }
  return res;
}

/* The record of one call of v (NULL: the library's choice), the entry
 * points, and one bare call that ran; 0 (why in *why) where one is
 * missing. */
static int bare_prepare(fj_ctx *ctx, run_data *d, const fj_variant *v,
                        bare *b, const char **why)
{
  fj_launch_record(&b->rec);
  fj_status st = cli_launch_one(ctx, d, v, NULL);
  fj_launch_record(NULL);
  *why = "the call recorded no launch";
  if (st != FJ_OK || b->rec.count == 0)
    return 0;
  *why = "the runtime gave no cuLaunchKernel or cuMemsetD32Async";
  if (!entry_point("cuLaunchKernel", &b->launch, sizeof b->launch) ||
      !entry_point("cuMemsetD32Async", &b->memset32, sizeof b->memset32))
    return 0;
  *why = "the bare launch failed";
  return bare_call(b) == CUDA_SUCCESS &&
         cudaDeviceSynchronize() == cudaSuccess;
}

enum { HOST_CALLS = 128, HOST_ROUNDS = 9 };

/* Microseconds per call of one round: HOST_CALLS calls queued without
 * waiting (fewer than the launch queue holds), after the GPU went idle;
 * the library's calls, or with b the bare launches. */
static double host_round(fj_ctx *ctx, run_data *d, const fj_variant *v,
                         const bare *b)
{
  cudaDeviceSynchronize();
  struct timespec a, z;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (int i = 0; i < HOST_CALLS; i++) {
    if (b)
      bare_call(b);
    else
      cli_launch_one(ctx, d, v, NULL);
  }
  clock_gettime(CLOCK_MONOTONIC, &z);
  return ((double)(z.tv_sec - a.tv_sec) * 1e9 +
          (double)(z.tv_nsec - a.tv_nsec)) / 1e3 / HOST_CALLS;
}

/* The words for the bare launches of r: "cuLaunchKernel", "2 x
 * cuLaunchKernel", with "cuMemsetD32Async + " before a zeroed counter. */
static void bare_words(const fj_launches *r, char *buf, size_t size)
{
  snprintf(buf, size, "%s%s%s", r->zero_words ? "cuMemsetD32Async + " : "",
           r->count == 2 ? "2 x " : "", "cuLaunchKernel");
}

/* Host time per call after the kernel is in the memory cache, the
 * library's (cuLaunchKernel included) and, in the same rounds, that of
 * bare launches of the very kernels, grids and arguments the library
 * launched, on the same stream: the best of HOST_ROUNDS rounds each,
 * the two taking turns to go first. */
static void host_times(fj_ctx *ctx, run_data *d, const fj_variant *v)
{
  bare *b = malloc(sizeof *b);
  const char *why = "out of memory";
  int have_bare = b && bare_prepare(ctx, d, v, b, &why);
  double lib = INFINITY, raw = INFINITY;
  for (int r = 0; r < HOST_ROUNDS; r++)
    for (int turn = 0; turn < 2; turn++) {
      int bare_now = (turn ^ (r & 1)) == 1;
      if (bare_now && !have_bare)
        continue;
      double us = host_round(ctx, d, v, bare_now ? b : NULL);
      double *best = bare_now ? &raw : &lib;
      *best = us < *best ? us : *best;
    }
  cudaDeviceSynchronize();
  printf("host: %.2f us per call (memory hit, cuLaunchKernel included)", lib);
  if (have_bare) {
    char words[64];
    bare_words(&b->rec, words, sizeof words);
    printf("; bare %s %.2f us; library %.2f us above it", words, raw,
           lib - raw);
  } else {
    printf("; no bare launch to compare: %s", why);
  }
  printf(" (best of %d interleaved rounds of %d calls, queued without "
         "waiting)\n",
         HOST_ROUNDS, HOST_CALLS);
  free(b);
}

static int run_timed(const cli *c, fj_ctx *ctx, run_data *d)
{
  int iters = c->iters > 0 ? c->iters : 20;
  cli_timing t;
  fj_status st = time_variant(ctx, d, c->variant_given ? &c->v : NULL,
                              c->warmup, iters, &t);
  if (st != FJ_OK)
    return cli_fj_error(c, ctx, st);
  CUDA_TRY(cudaGetLastError());
  printf("time: median %.1f us, min %.1f us over %d runs; %.1f TFLOP/s\n",
         t.median_ms * 1e3, t.min_ms * 1e3, iters,
         cli_tflops(d, t.median_ms));
  host_times(ctx, d, c->variant_given ? &c->v : NULL);
  return 0;
}

/* The report's words for the layout and, with --varlen or --page-size,
 * the sequences' lengths and the pages. */
static void layout_words(const cli *c, const run_data *d, char *buf,
                         size_t size)
{
  const fj_problem *p = &d->p;
  int n = snprintf(buf, size, "layout=%s",
                   c->lens ? "thd" : c->order == FJ_BSHD ? "bshd" : "bhsd");
  if (c->lens && n >= 0 && (size_t)n < size)
    n += snprintf(buf + n, size - (size_t)n, " varlen=%s", c->varlen);
  if (p->block_table && n >= 0 && (size_t)n < size)
    snprintf(buf + n, size - (size_t)n, " pages=%d page_size=%d max_pages=%d",
             p->num_pages, p->page_size, p->max_pages);
}

static uint64_t first_launches(fj_ctx *ctx)
{
  fj_cache_stats s;
  fj_cache_stats_get(ctx, &s);
  return s.first_launches;
}

/* --jit-tiers: whether the first kernel answered the first call; if so,
 * calls every 20 ms until the chosen kernel answers (at most 120 s), so
 * that what follows (the check, the timing) is the chosen kernel's. */
static int run_tiers(cli *c, fj_ctx *ctx, run_data *d,
                     const struct timespec *start)
{
  uint64_t n = first_launches(ctx);
  if (!n) {
    printf("tiered JIT: the chosen kernel answered the first call\n");
    return 0;
  }
  for (;;) {
    struct timespec nap = {0, 20000000}, z;
    nanosleep(&nap, NULL);
    fj_status st = run_once(c, ctx, d, NULL);
    if (st != FJ_OK)
      return cli_fj_error(c, ctx, st);
    CUDA_TRY(cudaDeviceSynchronize());
    clock_gettime(CLOCK_MONOTONIC, &z);
    double ms = (double)(z.tv_sec - start->tv_sec) * 1e3 +
                (double)(z.tv_nsec - start->tv_nsec) * 1e-6;
    uint64_t now = first_launches(ctx);
    if (now == n) {
      printf("tiered JIT: the first kernel answered %llu calls; the chosen "
             "kernel answered after %.1f ms\n",
             (unsigned long long)n, ms);
      return 0;
    }
    n = now;
    if (ms > 120e3) {
      fprintf(stderr, "flashjit run: the chosen kernel did not take over in "
                      "120 s\n");
      return EXIT_FAIL;
    }
  }
}

void cli_print_problem(const cli *c, fj_ctx *ctx, const run_data *d)
{
  fj_device_info info;
  fj_device_get(ctx, &info);
  char layout[256];
  layout_words(c, d, layout, sizeof layout);
  char dv[24] = "";
  if (cli_head_dim_v(&d->p) != d->p.head_dim)
    snprintf(dv, sizeof dv, " Dv=%d", cli_head_dim_v(&d->p));
  printf("device: %s (%s)\nproblem: B=%d H=%d Hkv=%d Sq=%d Skv=%d D=%d%s %s "
         "causal=%s %s",
         info.name, fj_ctx_arch(ctx), d->p.batch, d->p.heads_q,
         d->p.heads_kv, d->p.seq_q, d->p.seq_kv, d->p.head_dim, dv,
         fj_dtype_name(d->p.dtype), fj_causal_name(d->p.causal), layout);
  cli_mods_print(c, " ", "");
  printf("\n");
}

static int run_report(cli *c, fj_ctx *ctx, run_data *d)
{
  fj_variant v = c->v;
  fj_choice from = FJ_CHOICE_HEURISTIC;
  fj_status st = c->variant_given ? fj_problem_check(ctx, &d->p)
                                  : fj_attention_variant(ctx, &d->p, &v, &from);
  if (st != FJ_OK)
    return cli_fj_error(c, ctx, st);
  char name[160];
  fj_variant_name(&v, name, sizeof name);
  cli_print_problem(c, ctx, d);
  printf("variant: %s (%s)\n", name,
         c->variant_given ? "given" : from == FJ_CHOICE_TUNED ? "tuned"
                                                              : "heuristic");
  struct timespec a, z;
  clock_gettime(CLOCK_MONOTONIC, &a);
  st = run_once(c, ctx, d, NULL);
  if (st != FJ_OK)
    return cli_fj_error(c, ctx, st);
  CUDA_TRY(cudaDeviceSynchronize());
  clock_gettime(CLOCK_MONOTONIC, &z);
  printf("first call (compile or cache fetch, load, run): %.1f ms\n",
         (double)(z.tv_sec - a.tv_sec) * 1e3 +
             (double)(z.tv_nsec - a.tv_nsec) * 1e-6);
  return c->jit_tiers ? run_tiers(c, ctx, d, &a) : 0;
}

/* run --sweep: every combination emit --sweep would compile, timed on this
 * problem (and checked with --check), one line each, the fastest last.
 * Returns 1 when the variant failed (to build though the check accepts it,
 * to launch, or the --check), 0 when it ran or was refused. */
static int sweep_time_line(const cli *c, fj_ctx *ctx, run_data *d,
                            const fj_variant *v, fj_status st, double *best_ms,
                            fj_variant *best)
{
  char name[160];
  fj_variant_name(v, name, sizeof name);
  cli_timing t;
  if (st == FJ_OK)
    st = time_variant(ctx, d, v, cli_flag_given(c, "warmup") ? c->warmup : 2,
                      c->iters > 0 ? c->iters : 10, &t);
  if (st != FJ_OK)
    return cli_sweep_unbuilt(ctx, v, st, name);
  double rel = 0;
  int fail = c->check ? cli_check_variant(c, ctx, d, v, 1, &rel) : 0;
  printf("%-56s %9.1f us %7.1f TFLOP/s", name, t.median_ms * 1e3,
         cli_tflops(d, t.median_ms));
  if (c->check)
    printf("  rel_err=%.2e %s", rel, fail ? "FAIL" : "ok");
  printf("\n");
  if (!fail && t.median_ms < *best_ms) {
    *best_ms = t.median_ms;
    *best = *v;
  }
  return fail != 0;
}

static int run_sweep(const cli *c, fj_ctx *ctx, run_data *d)
{
  fj_variant *vs, best;
  fj_status *st;
  size_t n = cli_sweep_prepare(c, ctx, &vs, &st);
  if (!n)
    return cli_sweep_failed("run", "its variants: out of memory");
  double best_ms = INFINITY;
  size_t failed = 0;
  for (size_t i = 0; i < n; i++)
    failed += (size_t)sweep_time_line(c, ctx, d, &vs[i], st[i], &best_ms, &best);
  if (isfinite(best_ms)) {
    char name[160];
    fj_variant_name(&best, name, sizeof name);
    printf("fastest: %s %.1f us %.1f TFLOP/s\n", name, best_ms * 1e3,
           cli_tflops(d, best_ms));
  }
  free(vs);
  free(st);
  if (failed) {
    char line[120];
    snprintf(line, sizeof line, "%zu of its %zu variants failed (the lines "
             "marked failed or FAIL)", failed, n);
    return cli_sweep_failed("run", line);
  }
  return 0;
}

/* A timed (and, with --check, checked) run of one variant, or a sweep. */
static int run_on_device(cli *c, fj_ctx *ctx, run_data *d)
{
  CUDA_TRY(cudaSetDevice(c->device));
  int rc = cli_run_alloc(d, c->seed);
  if (!rc)
    rc = cli_run_mods(c, d, c->seed);
  if (!rc)
    rc = cli_run_block_mask(c, ctx, d);
  if (rc)
    return rc;
  if (c->sweep)
    return run_sweep(c, ctx, d);
  double rel;
  if ((rc = run_report(c, ctx, d)) == 0 && (rc = run_timed(c, ctx, d)) == 0 &&
      c->check)
    rc = cli_check_variant(c, ctx, d, c->variant_given ? &c->v : NULL, 0,
                           &rel);
  return rc;
}

int cli_cmd_run(cli *c)
{
  if (!c->shape_given)
    return cli_usage_error(c, "--shape B,H,S,D is required");
  run_data d;
  fj_ctx *ctx;
  int rc = cli_problem_on_device(c, &d, &ctx);
  if (rc)
    return rc;
  rc = c->backward ? cli_run_backward(c, ctx, &d) : run_on_device(c, ctx, &d);
  cli_run_free(&d);
  fj_ctx_destroy(ctx);
  return rc;
}

