/*
 * demo.c -- flashjit embedded in a small program: the main job of the
 * README's quick start.
 *
 * 1. With no GPU needed: a compile-only context renders and compiles a few
 *    variants for sm_90a and sm_80 -- the forward's, and the main kernel of
 *    the backward's -- and prints what a reader of generated kernels wants
 *    to see: registers, shared memory, spills, the compile time, whether
 *    the cache had it, the head of the source and which matrix
 *    instructions the PTX holds.
 * 2. Where a GPU exists: the fragment-layout table the library observed,
 *    then attention forward on random inputs, checked against the float64
 *    reference (relative error, PASS/FAIL), and timed; then one backward
 *    (dQ, dK, dV from the forward's O and LSE), checked and timed too.
 *
 * Exit status 0 when everything that could run passed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "flashjit.h"

/* Counts the lines of the PTX that mention an instruction. */
static int count_lines(const char *text, const char *what)
{
  int n = 0;
  for (const char *p = strstr(text, what); p; p = strstr(p + 1, what))
    n++;
  return n;
}

static void print_head(const char *src, int lines)
{
  for (const char *p = src; *p && lines > 0; lines--) {
    const char *nl = strchr(p, '\n');
    int len = nl ? (int)(nl - p) : (int)strlen(p);
    printf("    | %.*s\n", len, p);
    p += len + (nl != NULL);
  }
}

static void print_kernel(fj_ctx *ctx, fj_kernel *k, int show_source)
{
  fj_resources r;
  fj_kernel_resources(k, &r);
  const char *ptx = fj_kernel_ptx(k, NULL);
  printf("  %-52s %-7s regs=%3d smem=%6d spills=%d/%d compile=%6.1f ms %s; "
         "PTX: %d wmma.mma, %d mma.sync, %d wgmma.mma_async, %d "
         "cp.async.bulk.tensor\n",
         fj_kernel_name(k), fj_ctx_arch(ctx), r.registers,
         r.shared_static + r.shared_dynamic, r.spill_store_bytes,
         r.spill_load_bytes, r.compile_ms,
         r.cache == FJ_CACHE_MISS ? "(compiled)" : "(cached)",
         count_lines(ptx, "wmma.mma"), count_lines(ptx, "\tmma.sync"),
         count_lines(ptx, "wgmma.mma_async"),
         count_lines(ptx, "cp.async.bulk.tensor"));
  if (show_source)
    print_head(fj_kernel_source(k, NULL), 4);
}

static int inspect(fj_ctx *ctx, const fj_variant *v, int show_source)
{
  fj_kernel *k;
  fj_status st = fj_kernel_get(ctx, v, &k);
  if (st != FJ_OK) {
    fprintf(stderr, "demo: %s\n", fj_errmsg(ctx));
    return 1;
  }
  print_kernel(ctx, k, show_source);
  return 0;
}

/* The main kernel of what fj_attention_bwd would launch for p. */
static int inspect_backward(fj_ctx *ctx, const fj_problem *p)
{
  fj_bwd_plan plan;
  fj_kernel *k;
  fj_status st = fj_attention_bwd_plan(ctx, p, &plan);
  if (st == FJ_OK)
    st = fj_attention_bwd_kernel(ctx, p, &plan, 1, &k);
  if (st != FJ_OK) {
    fprintf(stderr, "demo: %s\n", fj_errmsg(ctx));
    return 1;
  }
  print_kernel(ctx, k, 0);
  return 0;
}

static int compile_only(void)
{
  static const char *const archs[] = {"sm_90a", "sm_80"};
  int bad = 0;
  printf("== compile-only: render, compile, inspect (no GPU needed)\n");
  for (size_t a = 0; a < 2; a++) {
    fj_ctx_opts o;
    fj_ctx_opts_init(&o);
    o.device = -1;
    o.arch = archs[a];
    fj_ctx *ctx;
    if (fj_ctx_create(&ctx, &o) != FJ_OK) {
      fprintf(stderr, "demo: %s\n", fj_errmsg(NULL));
      return 1;
    }
    /* What fj_attention_fwd would launch for two problems on this target:
     * the wgmma family on sm_90a, the mma family on sm_80. */
    fj_problem p;
    fj_variant v;
    fj_problem_init(&p, 4, 16, 16, 4096, 4096, 64, FJ_F16, FJ_BHSD);
    bad |= fj_attention_variant(ctx, &p, &v, NULL) != FJ_OK ||
           inspect(ctx, &v, a == 0);
    fj_problem_init(&p, 4, 32, 8, 4096, 4096, 128, FJ_BF16, FJ_BSHD);
    p.causal = FJ_CAUSAL_TOP_LEFT;
    bad |= fj_attention_variant(ctx, &p, &v, NULL) != FJ_OK ||
           inspect(ctx, &v, 0);
    /* And its backward's main kernel (wgmma on sm_90a, mma on sm_80). */
    bad |= inspect_backward(ctx, &p);
    fj_ctx_destroy(ctx);
  }
  return bad;
}

/* ---- on a GPU ------------------------------------------------------------- */

static void fill_random(uint16_t *dst, size_t n, fj_dtype dtype,
                        unsigned *seed)
{
  float *f = malloc(n * sizeof *f);
  for (size_t i = 0; i < n; i++) {
    *seed = *seed * 1664525u + 1013904223u;
    f[i] = (float)(*seed >> 8) / 8388608.0f - 1.0f;
  }
  fj_convert(dtype, dst, FJ_F32, f, n);
  free(f);
}

/* Runs one problem, checks every row against the float64 reference. */
static int run_and_check(fj_ctx *ctx, const fj_problem *p)
{
  size_t rows_q = (size_t)p->batch * (size_t)p->heads_q * (size_t)p->seq_q;
  size_t rows_k = (size_t)p->batch * (size_t)p->heads_kv * (size_t)p->seq_kv;
  size_t nq = rows_q * (size_t)p->head_dim, nk = rows_k * (size_t)p->head_dim;
  uint16_t *q = malloc(nq * 2), *k = malloc(nk * 2), *v = malloc(nk * 2),
           *o = malloc(nq * 2);
  double *ref = malloc(nq * sizeof *ref);
  unsigned seed = 7;
  fill_random(q, nq, p->dtype, &seed);
  fill_random(k, nk, p->dtype, &seed);
  fill_random(v, nk, p->dtype, &seed);
  void *dq, *dk, *dv, *dout;
  cudaMalloc(&dq, nq * 2);
  cudaMalloc(&dk, nk * 2);
  cudaMalloc(&dv, nk * 2);
  cudaMalloc(&dout, nq * 2);
  cudaMemcpy(dq, q, nq * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dk, k, nk * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dv, v, nk * 2, cudaMemcpyHostToDevice);
  cudaMemset(dout, 0xff, nq * 2);  /* NaN poison: unwritten output shows */

  fj_variant var;
  fj_attention_variant(ctx, p, &var, NULL);
  fj_status st = fj_attention_fwd(ctx, p, dq, dk, dv, dout, NULL, NULL);
  /* With the tiered JIT (on by default), that first call may have run the
   * quick-to-compile first kernel while the chosen one compiles in the
   * background: wait for it, so that the loop below times the kernel
   * named on the line. */
  if (st == FJ_OK)
    st = fj_ctx_tiers_wait(ctx);
  cudaError_t ce = cudaDeviceSynchronize();
  cudaEvent_t e0, e1;
  float ms = 0;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0, NULL);
  for (int i = 0; i < 10 && st == FJ_OK; i++)
    st = fj_attention_fwd(ctx, p, dq, dk, dv, dout, NULL, NULL);
  cudaEventRecord(e1, NULL);
  cudaEventSynchronize(e1);
  cudaEventElapsedTime(&ms, e0, e1);
  cudaMemcpy(o, dout, nq * 2, cudaMemcpyDeviceToHost);
  int bad = st != FJ_OK || ce != cudaSuccess;
  if (bad)
    fprintf(stderr, "demo: %s %s\n", fj_errmsg(ctx), cudaGetErrorString(ce));
  /* The reference is [batch][head][row][dim]; O is laid out as p says. */
  fj_reference_fwd(p, q, k, v, NULL, NULL, 0, p->seq_q, ref, NULL);
  double d2 = 0, r2 = 0;
  int nonfinite = 0;
  for (size_t i = 0; i < nq; i++) {
    size_t d = i % (size_t)p->head_dim, row = i / (size_t)p->head_dim;
    size_t s = row % (size_t)p->seq_q, bh = row / (size_t)p->seq_q;
    size_t b = bh / (size_t)p->heads_q, h = bh % (size_t)p->heads_q;
    size_t at = b * (size_t)p->o_stride[0] + h * (size_t)p->o_stride[1] +
                s * (size_t)p->o_stride[2] + d;
    float f;
    fj_convert(FJ_F32, &f, p->dtype, &o[at], 1);
    double x = f;
    nonfinite += !isfinite(x);
    d2 += (x - ref[i]) * (x - ref[i]);
    r2 += ref[i] * ref[i];
  }
  double rel = sqrt(d2 / r2);
  bad |= nonfinite || !(rel < 1e-2);
  char name[160];
  fj_variant_name(&var, name, sizeof name);
  printf("  (%d,%d,%d,%d) %s causal=%s: %s rel_err=%.2e %.1f us -> %s\n",
         p->batch, p->heads_q, p->seq_q, p->head_dim, fj_dtype_name(p->dtype),
         fj_causal_name(p->causal), name, rel, (double)ms * 100.0,
         bad ? "FAIL" : "PASS");
  cudaFree(dq);
  cudaFree(dk);
  cudaFree(dv);
  cudaFree(dout);
  free(q);
  free(k);
  free(v);
  free(o);
  free(ref);
  return bad;
}

/* ||got - want|| / ||want|| over n elements of got (dtype) and want
 * (float32); a non-finite element gives +inf. */
static double rel_err(fj_dtype dtype, const uint16_t *got, const float *want,
                      size_t n)
{
  double d2 = 0, r2 = 0;
  for (size_t i = 0; i < n; i++) {
    float f;
    fj_convert(FJ_F32, &f, dtype, &got[i], 1);
    double x = f, y = want[i];
    if (!isfinite(x))
      return (double)INFINITY;
    d2 += (x - y) * (x - y);
    r2 += y * y;
  }
  return r2 > 0 ? sqrt(d2 / r2) : sqrt(d2);
}

/* The backward's tensors: Q, K, V and dO on the host and the device, O
 * and the LSE (the forward's), dQ, dK and dV (the backward's). */
typedef struct bwd_io {
  size_t n[4];      /* elements of q, k, v (and dk, dv), dout (and o, dq) */
  uint16_t *h[4];   /* q, k, v, dout on the host */
  void *d[4], *o, *g[3];
  float *lse;
} bwd_io;

static void bwd_io_make(bwd_io *io, const fj_problem *p)
{
  size_t rows_q = (size_t)p->batch * (size_t)p->heads_q * (size_t)p->seq_q;
  size_t nq = rows_q * (size_t)p->head_dim;
  size_t nk = (size_t)p->batch * (size_t)p->heads_kv * (size_t)p->seq_kv *
              (size_t)p->head_dim;
  unsigned seed = 11;
  const size_t n[4] = {nq, nk, nk, nq};
  memcpy(io->n, n, sizeof n);
  for (int i = 0; i < 4; i++) {
    io->h[i] = malloc(n[i] * 2);
    fill_random(io->h[i], n[i], p->dtype, &seed);
    cudaMalloc(&io->d[i], n[i] * 2);
    cudaMemcpy(io->d[i], io->h[i], n[i] * 2, cudaMemcpyHostToDevice);
  }
  cudaMalloc(&io->o, nq * 2);
  cudaMalloc((void **)&io->lse, rows_q * sizeof(float));
  for (int i = 0; i < 3; i++) {
    cudaMalloc(&io->g[i], n[i] * 2);
    cudaMemset(io->g[i], 0xff, n[i] * 2);  /* NaN poison */
  }
}

static void bwd_io_free(bwd_io *io)
{
  for (int i = 0; i < 4; i++) {
    free(io->h[i]);
    cudaFree(io->d[i]);
  }
  for (int i = 0; i < 3; i++)
    cudaFree(io->g[i]);
  cudaFree(io->o);
  cudaFree(io->lse);
}

static fj_status backward(fj_ctx *ctx, const fj_problem *p, const bwd_io *io)
{
  return fj_attention_bwd(ctx, p, io->d[0], io->d[1], io->d[2], io->o,
                          io->d[3], io->lse, io->g[0], io->g[1], io->g[2],
                          NULL, NULL);
}

/* Relative errors of dQ, dK and dV against the float64 reference; 0 when
 * each is under 1e-2. */
static int check_grads(const fj_problem *p, const bwd_io *io, double e[3])
{
  float *want[3];
  uint16_t *got[3];
  for (int i = 0; i < 3; i++) {
    want[i] = malloc(io->n[i] * sizeof(float));
    got[i] = malloc(io->n[i] * 2);
    cudaMemcpy(got[i], io->g[i], io->n[i] * 2, cudaMemcpyDeviceToHost);
  }
  int bad = fj_reference_bwd(p, io->h[0], io->h[1], io->h[2], io->h[3],
                             want[0], want[1], want[2], NULL) != FJ_OK;
  for (int i = 0; i < 3; i++) {
    e[i] = bad ? (double)INFINITY : rel_err(p->dtype, got[i], want[i], io->n[i]);
    bad |= !(e[i] < 1e-2);
    free(want[i]);
    free(got[i]);
  }
  return bad;
}

/* One backward after the forward that gives it O and the LSE: dQ, dK and
 * dV against the float64 reference (fj_reference_bwd), then timed.  The
 * problem is dense (its tensors hold every element their strides
 * address). */
static int backward_and_check(fj_ctx *ctx, const fj_problem *p)
{
  bwd_io io;
  bwd_io_make(&io, p);
  fj_status st = fj_attention_fwd(ctx, p, io.d[0], io.d[1], io.d[2], io.o,
                                  io.lse, NULL);
  /* No forward compile left running beside the backward's timed loop. */
  if (st == FJ_OK)
    st = fj_ctx_tiers_wait(ctx);
  if (st == FJ_OK)
    st = backward(ctx, p, &io);
  cudaError_t ce = cudaDeviceSynchronize();
  double e[3] = {0, 0, 0};
  int bad = st != FJ_OK || ce != cudaSuccess || check_grads(p, &io, e);
  cudaEvent_t e0, e1;
  float ms = 0;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0, NULL);
  for (int i = 0; i < 10 && st == FJ_OK; i++)
    st = backward(ctx, p, &io);
  cudaEventRecord(e1, NULL);
  cudaEventSynchronize(e1);
  cudaEventElapsedTime(&ms, e0, e1);
  if (st != FJ_OK || ce != cudaSuccess)
    fprintf(stderr, "demo: %s %s\n", fj_errmsg(ctx), cudaGetErrorString(ce));
  fj_bwd_plan plan;
  fj_kernel *k = NULL;
  if (fj_attention_bwd_plan(ctx, p, &plan) == FJ_OK)
    fj_attention_bwd_kernel(ctx, p, &plan, 1, &k);
  printf("  backward (%d,%d/%d,%d,%d) %s causal=%s: %s dq %.2e dk %.2e dv "
         "%.2e %.1f us -> %s\n",
         p->batch, p->heads_q, p->heads_kv, p->seq_q, p->head_dim,
         fj_dtype_name(p->dtype), fj_causal_name(p->causal),
         k ? fj_kernel_name(k) : "?", e[0], e[1], e[2], (double)ms * 100.0,
         bad || st != FJ_OK ? "FAIL" : "PASS");
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  bwd_io_free(&io);
  return bad || st != FJ_OK;
}

static int on_gpu(void)
{
  fj_ctx *ctx;
  fj_status st = fj_ctx_create(&ctx, NULL);
  if (st == FJ_ERR_NO_DEVICE) {
    printf("== no GPU here (%s): the run-and-check part is skipped\n",
           fj_errmsg(NULL));
    return 0;
  }
  if (st != FJ_OK) {
    fprintf(stderr, "demo: %s\n", fj_errmsg(NULL));
    return 1;
  }
  fj_device_info info;
  fj_device_get(ctx, &info);
  printf("== on %s (%s)\n", info.name, fj_ctx_arch(ctx));
  fj_lut lut;
  if (fj_layout_get(ctx, FJ_FRAG_WMMA_ACC_F32, &lut) != FJ_OK) {
    fprintf(stderr, "demo: %s\n", fj_errmsg(ctx));
    fj_ctx_destroy(ctx);
    return 1;
  }
  printf("  accumulator layout (%s): lane 0 holds",
         lut.origin == FJ_LUT_PROBED ? "probed now" : "cached probe");
  for (int s = 0; s < lut.slots; s++)
    printf(" (%d,%d)", lut.map[0][s] / 16, lut.map[0][s] % 16);
  printf("\n");
  fj_problem p;
  fj_problem_init(&p, 1, 8, 8, 512, 512, 64, FJ_F16, FJ_BHSD);
  int bad = run_and_check(ctx, &p);
  fj_problem_init(&p, 2, 4, 2, 1000, 777, 128, FJ_BF16, FJ_BSHD);
  p.causal = FJ_CAUSAL_BOTTOM_RIGHT;
  bad |= run_and_check(ctx, &p);
  fj_problem_init(&p, 1, 4, 2, 256, 256, 64, FJ_F16, FJ_BSHD);
  p.causal = FJ_CAUSAL_TOP_LEFT;
  bad |= backward_and_check(ctx, &p);
  fj_ctx_destroy(ctx);
  return bad;
}

int main(void)
{
  int bad = compile_only();
  bad |= on_gpu();
  printf("%s\n", bad ? "demo: FAILED" : "demo: ok");
  return bad;
}
