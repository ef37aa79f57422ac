/*
 * test_gpu_backward.c -- the backward on a GPU against the float64
 * reference (fj_reference_bwd): dQ, dK, dV and the sinks' gradient over
 * head dims, dtypes, masks (causal both alignments with unequal lengths,
 * a window, a softcap), GQA and MQA, tails, large logits and rows that see
 * no key.  The forward (fj_attention_fwd) gives O and the LSE; gradients
 * are poisoned with NaN before every run; inputs are fresh random normals.
 * The tuner's pick (fj_tune_bwd, the database's backward entries).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "tunedb.h"
#include "runner.h"

static double normal(uint64_t *s)
{
  double u[2];
  for (int i = 0; i < 2; i++) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    u[i] = ((double)(*s >> 11) + 0.5) / 9007199254740992.0;
  }
  return sqrt(-2 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

/* n random 16-bit elements of dtype dt (times scale), on the host. */
static void *random_host(fj_dtype dt, size_t n, float scale, uint64_t *seed)
{
  float *f = malloc(n * sizeof *f);
  void *out = malloc(n * 2);
  for (size_t i = 0; i < n; i++)
    f[i] = (float)(normal(seed) * (double)scale);
  fj_convert(dt, out, FJ_F32, f, n);
  free(f);
  return out;
}

static void *upload(const void *host, size_t bytes)
{
  void *d = NULL;
  if (cudaMalloc(&d, bytes) != cudaSuccess)
    return NULL;
  if (host)
    cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice);
  else
    cudaMemset(d, 0xff, bytes);  /* NaN in f16, bf16 and float32 */
  return d;
}

/* ||got - want|| / ||want|| over n floats of got (16-bit, dtype dt) and
 * want (float32); a non-finite element gives +inf. */
static double rel_err(fj_dtype dt, const void *got, const float *want, size_t n)
{
  float *g = malloc(n * sizeof *g);
  fj_convert(FJ_F32, g, dt, got, n);
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(g[i])) {
      free(g);
      return INFINITY;
    }
    double d = (double)g[i] - (double)want[i];
    num += d * d;
    den += (double)want[i] * (double)want[i];
  }
  free(g);
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

typedef struct bwd_case {
  int b, hq, hkv, sq, skv, d;
  fj_dtype dt;
  fj_causal causal;
  int window_left;      /* -1: none */
  float softcap;        /* 0: none */
  int sinks;
  float in_scale;       /* Q is multiplied by it */
} bwd_case;

/* One case: forward, backward, reference, the verdict.  0: right. */
static int run_backward(fj_ctx *ctx, const bwd_case *bc, uint64_t *seed)
{
  fj_problem p;
  fj_problem_init(&p, bc->b, bc->hq, bc->hkv, bc->sq, bc->skv, bc->d, bc->dt,
                  FJ_BSHD);
  p.causal = bc->causal;
  fj_mods m;
  fj_mods_init(&m);
  float sinks_h[64];
  void *sinks_d = NULL;
  if (bc->window_left >= 0 || bc->softcap > 0 || bc->sinks) {
    if (bc->window_left >= 0) {
      m.window_left = bc->window_left;
      m.window_right = 0;
    }
    m.softcap = bc->softcap;
    p.mods = &m;
  }
  if (bc->sinks) {
    for (int h = 0; h < bc->hq; h++)
      sinks_h[h] = (float)(0.5 * normal(seed));
    sinks_d = upload(sinks_h, (size_t)bc->hq * sizeof(float));
    m.sinks = sinks_d;
  }
  size_t nq = (size_t)bc->b * (size_t)bc->sq * (size_t)bc->hq * (size_t)bc->d;
  size_t nk = (size_t)bc->b * (size_t)bc->skv * (size_t)bc->hkv * (size_t)bc->d;
  size_t nl = (size_t)bc->b * (size_t)bc->hq * (size_t)bc->sq;
  void *q = random_host(bc->dt, nq, bc->in_scale, seed);
  void *k = random_host(bc->dt, nk, 1.f, seed);
  void *v = random_host(bc->dt, nk, 1.f, seed);
  void *dout = random_host(bc->dt, nq, 1.f, seed);
  void *dq_d = upload(q, nq * 2), *dk_d = upload(k, nk * 2), *dv_d = upload(v, nk * 2);
  void *ddo = upload(dout, nq * 2), *o_d = upload(NULL, nq * 2);
  void *lse_d = upload(NULL, nl * 4);
  void *gq = upload(NULL, nq * 2), *gk = upload(NULL, nk * 2), *gv = upload(NULL, nk * 2);
  void *gs = bc->sinks ? upload(NULL, (size_t)bc->hq * 4) : NULL;
  int rc = 1;
  fj_status st = fj_attention_fwd(ctx, &p, dq_d, dk_d, dv_d, o_d, lse_d, NULL);
  fj_bwd_plan plan;
  if (st == FJ_OK)
    st = fj_attention_bwd_plan(ctx, &p, &plan);
  if (st == FJ_OK)
    st = fj_attention_bwd(ctx, &p, dq_d, dk_d, dv_d, o_d, ddo, lse_d, gq, gk, gv,
                          gs, NULL);
  if (st != FJ_OK) {
    fprintf(stderr, "backward: %s\n", fj_errmsg(ctx));
    goto out;
  }
  if (cudaDeviceSynchronize() != cudaSuccess) {
    fprintf(stderr, "backward: %s\n", cudaGetErrorString(cudaGetLastError()));
    goto out;
  }
  void *hq_ = malloc(nq * 2), *hk_ = malloc(nk * 2), *hv_ = malloc(nk * 2);
  float hs[64];
  cudaMemcpy(hq_, gq, nq * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(hk_, gk, nk * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(hv_, gv, nk * 2, cudaMemcpyDeviceToHost);
  if (gs)
    cudaMemcpy(hs, gs, (size_t)bc->hq * 4, cudaMemcpyDeviceToHost);
  float *rq = malloc(nq * 4), *rk = malloc(nk * 4), *rv = malloc(nk * 4), rs[64];
  fj_problem hp = p;
  fj_mods hm = m;
  if (p.mods) {
    hm.sinks = bc->sinks ? sinks_h : NULL;
    hp.mods = &hm;
  }
  st = fj_reference_bwd(&hp, q, k, v, dout, rq, rk, rv, bc->sinks ? rs : NULL);
  if (st != FJ_OK) {
    fprintf(stderr, "reference: %s\n", fj_errmsg(NULL));
  } else {
    double eq = rel_err(bc->dt, hq_, rq, nq), ek = rel_err(bc->dt, hk_, rk, nk);
    double ev = rel_err(bc->dt, hv_, rv, nk), es = 0;
    if (gs) {
      double num = 0, den = 0;
      for (int h = 0; h < bc->hq; h++) {
        double dd = (double)hs[h] - (double)rs[h];
        num += dd * dd;
        den += (double)rs[h] * (double)rs[h];
      }
      es = isfinite(num) ? sqrt(num / (den > 0 ? den : 1)) : (double)INFINITY;
    }
    /* bf16 rounds P and dS to 8 bits of mantissa on their way through
     * shared memory: cuDNN's and FlashAttention's errors against a float64
     * reference are of the order of 1e-2 there. */
    double tol = bc->dt == FJ_BF16 ? 3e-2 : 1e-2;
    rc = !(eq < tol && ek < tol && ev < tol && es < tol);
    printf("%s %-5s d%-3d %s b%d h%d/%d s%d/%d %s%s%s%s x%.0f: dq %.2e dk %.2e dv %.2e%s%s\n",
           rc ? "FAIL" : "ok  ", fj_mma_name(plan.variant.mma), bc->d, fj_dtype_name(bc->dt), bc->b, bc->hq,
           bc->hkv, bc->sq, bc->skv, fj_causal_name(bc->causal),
           bc->window_left >= 0 ? " window" : "", bc->softcap > 0 ? " softcap" : "",
           bc->sinks ? " sinks" : "", (double)bc->in_scale, eq, ek, ev, "", "");
    if (gs)
      printf("       dsinks %.2e\n", es);
  }
  free(hq_);
  free(hk_);
  free(hv_);
  free(rq);
  free(rk);
  free(rv);
out:;
  void *dev[] = {dq_d, dk_d, dv_d, ddo, o_d, lse_d, gq, gk, gv, gs, sinks_d};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
    cudaFree(dev[i]);
  free(q);
  free(k);
  free(v);
  free(dout);
  return rc;
}

/* The cases on the device's own target (sm_90a: the wgmma backward for
 * head dims 64 and 128), then, on an sm_90a device, those head dims again
 * on plain sm_90, whose backward is the mma family's. */
static int run_cases(const bwd_case *cases, size_t n)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(NULL, &ctx);
  if (rc)
    return rc;
  uint64_t seed = 20261126;
  int fails = 0, runs = 0;
  for (size_t i = 0; i < n; i++, runs++)
    fails += run_backward(ctx, &cases[i], &seed);
  int hopper = strcmp(fj_ctx_arch(ctx), "sm_90a") == 0;
  fj_ctx_destroy(ctx);
  if (hopper) {
    fj_ctx_opts o;
    fj_ctx_opts_init(&o);
    o.arch = "sm_90";
    o.disk_cache = 0;
    CHECK(fj_ctx_create(&ctx, &o) == FJ_OK);
    printf("the mma family (sm_90):\n");
    for (size_t i = 0; i < n; i++)
      if (cases[i].d == 64 || cases[i].d == 128) {
        fails += run_backward(ctx, &cases[i], &seed);
        runs++;
      }
    fj_ctx_destroy(ctx);
  }
  printf("backward: %d runs, %d failed\n", runs, fails);
  return fails != 0;
}

#define TL FJ_CAUSAL_TOP_LEFT
#define BR FJ_CAUSAL_BOTTOM_RIGHT
#define NC FJ_CAUSAL_NONE

int test_gpu_backward(void)
{
  static const bwd_case cases[] = {
      /* every head dim, both dtypes, causal and not */
      {2, 4, 4, 256, 256, 64, FJ_BF16, NC, -1, 0, 0, 1},
      {2, 4, 4, 256, 256, 64, FJ_F16, TL, -1, 0, 0, 1},
      {1, 4, 4, 300, 300, 128, FJ_BF16, TL, -1, 0, 0, 1},
      {1, 4, 4, 300, 300, 128, FJ_F16, NC, -1, 0, 0, 1},
      {1, 2, 2, 200, 200, 256, FJ_BF16, NC, -1, 0, 0, 1},
      {1, 2, 2, 200, 200, 256, FJ_F16, TL, -1, 0, 0, 1},
      {1, 2, 2, 130, 130, 32, FJ_BF16, TL, -1, 0, 0, 1},
      {1, 2, 2, 130, 130, 96, FJ_F16, NC, -1, 0, 0, 1},
      {1, 2, 2, 130, 130, 160, FJ_BF16, TL, -1, 0, 0, 1},
      {1, 2, 2, 130, 130, 192, FJ_F16, TL, -1, 0, 0, 1},
      /* tails and unequal lengths both ways, both alignments */
      {1, 2, 2, 1, 1, 64, FJ_BF16, NC, -1, 0, 0, 1},
      {1, 2, 2, 17, 17, 64, FJ_BF16, TL, -1, 0, 0, 1},
      {1, 2, 2, 1000, 1000, 64, FJ_F16, TL, -1, 0, 0, 1},
      {1, 2, 2, 100, 257, 128, FJ_BF16, BR, -1, 0, 0, 1},
      {1, 2, 2, 257, 100, 128, FJ_BF16, BR, -1, 0, 0, 1},  /* rows that see no key */
      {1, 2, 2, 257, 100, 128, FJ_BF16, TL, -1, 0, 0, 1},
      /* GQA 8:1 and MQA */
      {2, 16, 2, 200, 200, 64, FJ_BF16, TL, -1, 0, 0, 1},
      {1, 8, 1, 150, 333, 128, FJ_F16, NC, -1, 0, 0, 1},
      /* a window, a softcap, sinks, large logits */
      {1, 4, 4, 400, 400, 64, FJ_BF16, TL, 100, 0, 0, 1},
      {1, 4, 4, 400, 400, 128, FJ_BF16, NC, -1, 30.f, 0, 1},
      {1, 4, 2, 300, 300, 64, FJ_F16, TL, -1, 0, 1, 1},
      {1, 4, 4, 256, 256, 128, FJ_BF16, NC, -1, 0, 0, 30},
  };
  return run_cases(cases, sizeof cases / sizeof cases[0]);
}

/* One small case for compute-sanitizer. */
int test_gpu_sanitize_backward(void)
{
  static const bwd_case cases[] = {
      {1, 4, 2, 100, 130, 64, FJ_BF16, TL, -1, 0, 1, 1},
  };
  return run_cases(cases, 1);
}

/* The tuner's pick: a backward entry of the tuning database decides the
 * plan's main kernel (its family and stages) and leaves the forward's
 * choice alone; fj_tune_bwd then times the candidates, records the
 * fastest, and the next plan takes it. */
int test_gpu_backward_tuned(void)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(fjt_tmpdir(), &ctx);
  if (rc)
    return rc;
  fj_problem p;
  fj_problem_init(&p, 1, 4, 2, 512, 512, 64, FJ_BF16, FJ_BSHD);
  p.causal = FJ_CAUSAL_TOP_LEFT;
  fj_plan fwd, fwd2;
  fj_bwd_plan plan, best;
  char a[160], b[160];
  CHECK_OK(ctx, fj_attention_plan(ctx, &p, &fwd));
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &plan));
  fj_variant v = plan.variant;
  v.mma = FJ_MMA_SYNC;
  v.stages = 1;
  CHECK_OK(ctx, fj__tune_record_bwd(ctx, &p, &v, 1.0, 2.0));
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &plan));
  CHECK(plan.variant.mma == FJ_MMA_SYNC && plan.variant.stages == 1 &&
        plan.variant.tile_n == 64);
  CHECK_OK(ctx, fj_attention_plan(ctx, &p, &fwd2));
  fj_variant_name(&fwd.variant, a, sizeof a);
  fj_variant_name(&fwd2.variant, b, sizeof b);
  CHECK(fwd2.from == FJ_CHOICE_HEURISTIC && strcmp(a, b) == 0);
  fj_tune_opts o;
  fj_tune_opts_init(&o);
  o.iters = 5;
  fj_tune_report r;
  CHECK_OK(ctx, fj_tune_bwd(ctx, &p, &o, &best, &r));
  int hopper = strcmp(fj_ctx_arch(ctx), "sm_90a") == 0;
  printf("tune_bwd on %s: %d candidates, refused %d, failed %d, wrong %d, "
         "timed %d; best %s s%d %.3f ms, the plan's own %.3f ms\n",
         fj_ctx_arch(ctx), r.candidates, r.refused, r.failed, r.wrong,
         r.timed, fj_mma_name(best.variant.mma), best.variant.stages,
         r.best_ms, r.default_ms);
  CHECK(r.candidates == (hopper ? 3 : 2) && r.wrong == 0 && r.failed == 0);
  CHECK(r.timed + r.refused == r.candidates && r.best_ms > 0 &&
        r.best_ms <= r.default_ms);
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &plan));
  CHECK(plan.variant.mma == best.variant.mma &&
        plan.variant.stages == best.variant.stages);
  fj_ctx_destroy(ctx);
  return 0;
}
