/*
 * test_gpu_backward.c -- the backward on a GPU against the float64
 * reference (fj_reference_bwd): dQ, dK, dV and the sinks' gradient over
 * head dims, dtypes, masks (causal both alignments with unequal lengths,
 * a window, a softcap), GQA and MQA, tails, large logits and rows that see
 * no key.  The forward (fj_attention_fwd) gives O and the LSE; gradients
 * are poisoned with NaN before every run; inputs are fresh random normals.
 * A loss that uses the LSE too (fj_problem.dlse).
 * The tuner's pick (fj_tune_bwd, the database's backward entries); score
 * and mask expressions; block masks the library builds, whose transposed
 * lists are checked against its rows' lists.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "reference.h"
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
  int deterministic;    /* fj_problem.deterministic */
  /* Varlen: b sequences of lq[i] queries and lkv[i] keys, packed (FJ_THD);
   * used[i] > 0: seqused_kv (the sequence sees its first used[i] keys). */
  int lq[4], lkv[4], used[4];
  int dlse;             /* the loss uses the LSE too: fj_problem.dlse; 2:
                           NaN at rows that see no key (bottom-right,
                           sq > skv: the first sq - skv), which must not
                           reach the gradients */
} bwd_case;

/* A case's problem, its inputs (host and device), the forward's O and LSE,
 * and the gradients of the last backward (device, then host). */
typedef struct bwd_run {
  fj_problem p;
  fj_mods m;
  float sinks_h[64];
  size_t nq, nk;
  void *q, *k, *v, *dout;                     /* host */
  void *sinks_d, *q_d, *k_d, *v_d, *do_d, *o_d, *lse_d;
  int32_t cuq[5], cukv[5], used[4];          /* host varlen arrays */
  float *dlse_h;                              /* fj_problem.dlse, host */
  void *dlse_d;
  void *cuq_d, *cukv_d, *used_d;
  void *gq, *gk, *gv, *gs;                    /* device gradients */
  void *hq, *hk, *hv;                         /* host gradients */
  float hs[64];
  fj_bwd_plan plan;
} bwd_run;

static void run_free(bwd_run *r)
{
  void *dev[] = {r->sinks_d, r->q_d, r->k_d, r->v_d, r->do_d, r->o_d,
                 r->lse_d, r->gq, r->gk, r->gv, r->gs, r->cuq_d, r->cukv_d,
                 r->used_d, r->dlse_d};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
    cudaFree(dev[i]);
  void *host[] = {r->q, r->k, r->v, r->dout, r->hq, r->hk, r->hv, r->dlse_h};
  for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
    free(host[i]);
}

/* The inputs of r's problem (rows_q and rows_kv rows: packed or batch x
 * sequence; Q scaled by q_scale), its gradients' buffers, its forward's
 * O and LSE and the backward's plan.  0: ready. */
static int run_tensors(fj_ctx *ctx, bwd_run *r, size_t rows_q, size_t rows_kv,
                       float q_scale, uint64_t *seed)
{
  const fj_problem *p = &r->p;
  r->nq = rows_q * (size_t)p->heads_q * (size_t)p->head_dim;
  r->nk = rows_kv * (size_t)p->heads_kv * (size_t)p->head_dim;
  size_t nl = (size_t)p->batch * (size_t)p->heads_q * (size_t)p->seq_q;
  r->q = random_host(p->dtype, r->nq, q_scale, seed);
  r->k = random_host(p->dtype, r->nk, 1.f, seed);
  r->v = random_host(p->dtype, r->nk, 1.f, seed);
  r->dout = random_host(p->dtype, r->nq, 1.f, seed);
  r->q_d = upload(r->q, r->nq * 2);
  r->k_d = upload(r->k, r->nk * 2);
  r->v_d = upload(r->v, r->nk * 2);
  r->do_d = upload(r->dout, r->nq * 2);
  r->o_d = upload(NULL, r->nq * 2);
  r->lse_d = upload(NULL, nl * 4);
  r->gq = upload(NULL, r->nq * 2);
  r->gk = upload(NULL, r->nk * 2);
  r->gv = upload(NULL, r->nk * 2);
  r->hq = malloc(r->nq * 2);
  r->hk = malloc(r->nk * 2);
  r->hv = malloc(r->nk * 2);
  fj_status st = fj_attention_fwd(ctx, p, r->q_d, r->k_d, r->v_d, r->o_d,
                                  r->lse_d, NULL);
  if (st == FJ_OK)
    st = fj_attention_bwd_plan(ctx, p, &r->plan);
  if (st != FJ_OK)
    fprintf(stderr, "forward or plan: %s\n", fj_errmsg(ctx));
  return st != FJ_OK;
}

/* The case's inputs and its forward.  0: ready. */
static int run_setup(fj_ctx *ctx, const bwd_case *bc, uint64_t *seed,
                     bwd_run *r)
{
  memset(r, 0, sizeof *r);
  fj_problem *p = &r->p;
  int varlen = bc->lq[0] > 0;
  fj_problem_init(p, bc->b, bc->hq, bc->hkv, bc->sq, bc->skv, bc->d, bc->dt,
                  varlen ? FJ_THD : FJ_BSHD);
  p->causal = bc->causal;
  size_t rows_q = (size_t)bc->b * (size_t)bc->sq,
         rows_kv = (size_t)bc->b * (size_t)bc->skv;
  if (varlen) {
    int any_used = 0;
    r->cuq[0] = r->cukv[0] = 0;
    for (int i = 0; i < bc->b; i++) {
      r->cuq[i + 1] = r->cuq[i] + bc->lq[i];
      r->cukv[i + 1] = r->cukv[i] + bc->lkv[i];
      r->used[i] = bc->used[i] > 0 ? bc->used[i] : bc->lkv[i];
      any_used |= bc->used[i] > 0;
    }
    rows_q = (size_t)r->cuq[bc->b];
    rows_kv = (size_t)r->cukv[bc->b];
    r->cuq_d = upload(r->cuq, sizeof(int32_t) * (size_t)(bc->b + 1));
    r->cukv_d = upload(r->cukv, sizeof(int32_t) * (size_t)(bc->b + 1));
    p->cu_seqlens_q = r->cuq_d;
    p->cu_seqlens_kv = r->cukv_d;
    p->total_q = (int)rows_q;
    p->total_kv = (int)rows_kv;
    if (any_used) {
      r->used_d = upload(r->used, sizeof(int32_t) * (size_t)bc->b);
      p->seqused_kv = r->used_d;
    }
  }
  p->deterministic = bc->deterministic;
  fj_mods_init(&r->m);
  if (bc->window_left >= 0 || bc->softcap > 0 || bc->sinks) {
    if (bc->window_left >= 0) {
      r->m.window_left = bc->window_left;
      r->m.window_right = 0;
    }
    r->m.softcap = bc->softcap;
    p->mods = &r->m;
  }
  if (bc->sinks) {
    for (int h = 0; h < bc->hq; h++)
      r->sinks_h[h] = (float)(0.5 * normal(seed));
    r->sinks_d = upload(r->sinks_h, (size_t)bc->hq * sizeof(float));
    r->m.sinks = r->sinks_d;
  }
  r->gs = bc->sinks ? upload(NULL, (size_t)bc->hq * 4) : NULL;
  if (bc->dlse) {
    size_t nl = (size_t)bc->b * (size_t)bc->hq * (size_t)bc->sq;
    r->dlse_h = malloc(nl * sizeof(float));
    for (size_t i = 0; i < nl; i++)
      r->dlse_h[i] = bc->dlse == 2 && (int)(i % (size_t)bc->sq) < bc->sq - bc->skv
                         ? NAN : (float)normal(seed);
    r->dlse_d = upload(r->dlse_h, nl * sizeof(float));
    p->dlse = r->dlse_d;
  }
  return run_tensors(ctx, r, rows_q, rows_kv, bc->in_scale, seed);
}

/* One backward into poisoned gradients, copied to the host.  0: ran. */
static int run_pass(fj_ctx *ctx, bwd_run *r)
{
  const fj_problem *p = &r->p;
  cudaMemset(r->gq, 0xff, r->nq * 2);
  cudaMemset(r->gk, 0xff, r->nk * 2);
  cudaMemset(r->gv, 0xff, r->nk * 2);
  if (r->gs)
    cudaMemset(r->gs, 0xff, (size_t)p->heads_q * 4);
  fj_status st = fj_attention_bwd(ctx, p, r->q_d, r->k_d, r->v_d, r->o_d,
                                  r->do_d, r->lse_d, r->gq, r->gk, r->gv,
                                  r->gs, NULL);
  if (st != FJ_OK) {
    fprintf(stderr, "backward: %s\n", fj_errmsg(ctx));
    return 1;
  }
  if (cudaDeviceSynchronize() != cudaSuccess) {
    fprintf(stderr, "backward: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 1;
  }
  cudaMemcpy(r->hq, r->gq, r->nq * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(r->hk, r->gk, r->nk * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(r->hv, r->gv, r->nk * 2, cudaMemcpyDeviceToHost);
  if (r->gs)
    cudaMemcpy(r->hs, r->gs, (size_t)p->heads_q * 4, cudaMemcpyDeviceToHost);
  return 0;
}

/* One case: forward, backward, reference, the verdict.  0: right. */
static int run_backward(fj_ctx *ctx, const bwd_case *bc, uint64_t *seed)
{
  bwd_run r;
  int rc = 1;
  if (run_setup(ctx, bc, seed, &r) || run_pass(ctx, &r))
    goto out;
  const size_t nq = r.nq, nk = r.nk;
  /* Zeros where the reference leaves an element alone (rows no sequence
   * addresses: the kernels write 0 there, past seqused_kv). */
  float *rq = calloc(nq, 4), *rk = calloc(nk, 4), *rv = calloc(nk, 4), rs[64];
  fj_problem hp = r.p;
  fj_mods hm = r.m;
  hp.dlse = r.dlse_h;
  if (hp.cu_seqlens_q) {
    hp.cu_seqlens_q = r.cuq;
    hp.cu_seqlens_kv = r.cukv;
    hp.seqused_kv = hp.seqused_kv ? r.used : NULL;
  }
  if (r.p.mods) {
    hm.sinks = bc->sinks ? r.sinks_h : NULL;
    hp.mods = &hm;
  }
  fj_status st = fj_reference_bwd(&hp, r.q, r.k, r.v, r.dout, rq, rk, rv,
                                  bc->sinks ? rs : NULL);
  if (st != FJ_OK) {
    fprintf(stderr, "reference: %s\n", fj_errmsg(NULL));
  } else {
    double eq = rel_err(bc->dt, r.hq, rq, nq), ek = rel_err(bc->dt, r.hk, rk, nk);
    double ev = rel_err(bc->dt, r.hv, rv, nk), es = 0;
    if (r.gs) {
      double num = 0, den = 0;
      for (int h = 0; h < bc->hq; h++) {
        double dd = (double)r.hs[h] - (double)rs[h];
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
    printf("%s %-5s d%-3d %s b%d h%d/%d s%d/%d %s%s%s%s%s x%.0f: dq %.2e dk %.2e dv %.2e\n",
           rc ? "FAIL" : "ok  ", fj_mma_name(r.plan.variant.mma), bc->d, fj_dtype_name(bc->dt), bc->b, bc->hq,
           bc->hkv, bc->sq, bc->skv, fj_causal_name(bc->causal),
           bc->window_left >= 0 ? " window" : "", bc->softcap > 0 ? " softcap" : "",
           bc->sinks ? " sinks" : "",
           bc->deterministic ? " deterministic" : bc->lq[0] ? " varlen" : bc->dlse ? " dlse" : "",
           (double)bc->in_scale, eq, ek, ev);
    if (r.gs)
      printf("       dsinks %.2e\n", es);
  }
  free(rq);
  free(rk);
  free(rv);
out:
  run_free(&r);
  return rc;
}

/* Whether the gradients of r's last pass equal those saved in `first`. */
static int same_bits(const bwd_run *r, void *const first[4])
{
  return !memcmp(first[0], r->hq, r->nq * 2) &&
         !memcmp(first[1], r->hk, r->nk * 2) &&
         !memcmp(first[2], r->hv, r->nk * 2) &&
         (!r->gs || !memcmp(first[3], r->hs, (size_t)r->p.heads_q * 4));
}

/* The case's backward `runs` times on the same inputs: in the
 * deterministic mode every run must give the first run's bits; the default
 * mode's differences are reported (atomics may or may not reorder).  0:
 * as required. */
static int run_repeats(fj_ctx *ctx, const bwd_case *bc, uint64_t *seed,
                       int runs)
{
  bwd_run r;
  void *first[4] = {NULL, NULL, NULL, NULL};
  int differ = 0, rc = 1;
  if (run_setup(ctx, bc, seed, &r) || run_pass(ctx, &r))
    goto out;
  first[0] = malloc(r.nq * 2);
  first[1] = malloc(r.nk * 2);
  first[2] = malloc(r.nk * 2);
  first[3] = malloc(64 * 4);
  memcpy(first[0], r.hq, r.nq * 2);
  memcpy(first[1], r.hk, r.nk * 2);
  memcpy(first[2], r.hv, r.nk * 2);
  memcpy(first[3], r.hs, 64 * 4);
  for (int i = 1; i < runs; i++) {
    if (run_pass(ctx, &r))
      goto out;
    differ += !same_bits(&r, first);
  }
  rc = bc->deterministic && differ > 0;
  printf("%s %-5s d%-3d %s h%d/%d s%d %s%s%s %s: %d of %d runs differ from the first\n",
         rc ? "FAIL" : "ok  ", fj_mma_name(r.plan.variant.mma), bc->d,
         fj_dtype_name(bc->dt), bc->hq, bc->hkv, bc->sq, fj_causal_name(bc->causal),
         bc->window_left >= 0 ? " window" : "", bc->sinks ? " sinks" : "",
         bc->deterministic ? "deterministic" : "default", differ, runs - 1);
out:
  for (int i = 0; i < 4; i++)
    free(first[i]);
  run_free(&r);
  return rc;
}

/* Where ctx's target is sm_90a, a context of plain sm_90 on the same
 * device (whose backward is the mma family's) in *plain; else NULL.  0:
 * done. */
static int plain_sm90(fj_ctx *ctx, fj_ctx **plain)
{
  *plain = NULL;
  if (strcmp(fj_ctx_arch(ctx), "sm_90a") != 0)
    return 0;
  fj_ctx_opts o;
  fj_ctx_opts_init(&o);
  o.arch = "sm_90";
  o.disk_cache = 0;
  o.jit_tiers = 0;  /* the chosen kernels (fjt_gpu_ctx) */
  CHECK(fj_ctx_create(plain, &o) == FJ_OK);
  return 0;
}

/* The cases on the device's own target (sm_90a: the wgmma backward for
 * head dims 64 to 256), then, on an sm_90a device, again on plain sm_90,
 * whose backward is the mma family's (head dims that are not multiples
 * of 32 padded to the next one). */
static int run_cases(const bwd_case *cases, size_t n)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(NULL, &ctx);
  if (rc)
    return rc;
  uint64_t seed = 20261126;
  int fails = 0, runs = 0;
  for (size_t i = 0; i < n; i++) {
    fails += run_backward(ctx, &cases[i], &seed);
    runs++;
  }
  fj_ctx *plain;
  rc = plain_sm90(ctx, &plain);
  fj_ctx_destroy(ctx);
  if (rc)
    return rc;
  if (plain) {
    printf("the mma family (sm_90):\n");
    for (size_t i = 0; i < n; i++) {
      fails += run_backward(plain, &cases[i], &seed);
      runs++;
    }
    fj_ctx_destroy(plain);
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
      {2, 4, 4, 256, 256, 64, FJ_BF16, NC, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {2, 4, 4, 256, 256, 64, FJ_F16, TL, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 4, 4, 300, 300, 128, FJ_BF16, TL, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 4, 4, 300, 300, 128, FJ_F16, NC, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 2, 2, 200, 200, 256, FJ_BF16, NC, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 2, 2, 200, 200, 256, FJ_F16, TL, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 2, 2, 130, 130, 32, FJ_BF16, TL, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 2, 2, 130, 130, 96, FJ_F16, NC, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 2, 2, 130, 130, 160, FJ_BF16, TL, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 2, 2, 130, 130, 192, FJ_F16, TL, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      /* head dims padded (mma: to 32 columns; wgmma: to 64-column panels) */
      {1, 4, 2, 200, 300, 40, FJ_BF16, TL, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 4, 4, 150, 150, 72, FJ_F16, NC, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 2, 2, 130, 257, 120, FJ_BF16, BR, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 2, 2, 100, 100, 8, FJ_F16, TL, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 2, 2, 140, 140, 56, FJ_BF16, NC, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 2, 2, 130, 130, 200, FJ_F16, TL, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      /* tails and unequal lengths both ways, both alignments */
      {1, 2, 2, 1, 1, 64, FJ_BF16, NC, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 2, 2, 17, 17, 64, FJ_BF16, TL, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 2, 2, 1000, 1000, 64, FJ_F16, TL, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 1, 1, 4097, 4097, 64, FJ_F16, TL, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},  /* one row past 64 x 64 tiles */
      {1, 2, 2, 100, 257, 128, FJ_BF16, BR, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 2, 2, 257, 100, 128, FJ_BF16, BR, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},  /* rows that see no key */
      {1, 2, 2, 257, 100, 128, FJ_BF16, TL, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      /* GQA 8:1 and MQA */
      {2, 16, 2, 200, 200, 64, FJ_BF16, TL, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 8, 1, 150, 333, 128, FJ_F16, NC, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      /* a window, a softcap, sinks, large logits */
      {1, 4, 4, 400, 400, 64, FJ_BF16, TL, 100, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 4, 4, 400, 400, 128, FJ_BF16, NC, -1, 30.f, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 4, 2, 300, 300, 64, FJ_F16, TL, -1, 0, 1, 1, 0, {0}, {0}, {0}, 0},
      {1, 4, 4, 256, 256, 128, FJ_BF16, NC, -1, 0, 0, 30, 0, {0}, {0}, {0}, 0},
      /* varlen: packed sequences (a tail of 1, an empty one), seqused_kv */
      {3, 4, 2, 300, 400, 64, FJ_BF16, TL, -1, 0, 0, 1, 0, {300, 1, 130}, {200, 400, 130}, {0}, 0},
      {3, 4, 4, 257, 257, 128, FJ_F16, BR, -1, 0, 0, 1, 0, {257, 0, 100}, {100, 50, 257}, {0}, 0},
      {2, 2, 2, 200, 300, 128, FJ_BF16, BR, 60, 0, 1, 1, 0, {200, 77}, {300, 100}, {0}, 0},
      {2, 4, 2, 190, 250, 64, FJ_F16, NC, -1, 20.f, 0, 1, 0, {190, 64}, {250, 128}, {180, 100}, 0},
      /* padded (96, 160, 224) and wide (192, 256) heads on wgmma: GQA, both
       * alignments, a window, a softcap, sinks, large logits, varlen */
      {1, 8, 2, 300, 300, 256, FJ_BF16, TL, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 4, 4, 257, 100, 192, FJ_BF16, BR, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 4, 4, 400, 400, 256, FJ_F16, BR, 100, 30.f, 1, 1, 0, {0}, {0}, {0}, 0},
      {1, 4, 4, 256, 256, 256, FJ_BF16, NC, -1, 0, 0, 30, 0, {0}, {0}, {0}, 0},
      {1, 4, 2, 333, 333, 224, FJ_F16, TL, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 6, 2, 200, 517, 96, FJ_BF16, NC, 64, 0, 1, 1, 0, {0}, {0}, {0}, 0},
      {3, 4, 2, 257, 257, 256, FJ_BF16, BR, -1, 0, 0, 1, 0, {257, 0, 100}, {100, 50, 257}, {0}, 0},
      {2, 2, 2, 200, 300, 160, FJ_F16, TL, -1, 0, 0, 1, 0, {200, 77}, {300, 100}, {290, 0}, 0},
      /* head dim 64 on wgmma, K and V as register operands (issue 31):
       * unequal lengths both ways, a softcap, large logits, varlen with
       * a window and sinks */
      {1, 2, 2, 100, 257, 64, FJ_F16, BR, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 2, 2, 257, 100, 64, FJ_BF16, BR, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},  /* rows that see no key */
      {1, 4, 4, 400, 400, 64, FJ_F16, NC, -1, 30.f, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 4, 4, 256, 256, 64, FJ_F16, NC, -1, 0, 0, 30, 0, {0}, {0}, {0}, 0},
      {2, 2, 2, 200, 300, 64, FJ_BF16, BR, 60, 0, 1, 1, 0, {200, 77}, {300, 100}, {0}, 0},
      /* a loss that uses the LSE too (fj_problem.dlse): the narrow and
       * wide wgmma kernels, rows that see no key, sinks, varlen */
      {2, 4, 2, 256, 256, 64, FJ_BF16, NC, -1, 0, 0, 1, 0, {0}, {0}, {0}, 1},
      {1, 4, 4, 257, 100, 128, FJ_F16, BR, -1, 0, 1, 1, 0, {0}, {0}, {0}, 1},
      {1, 2, 2, 200, 200, 256, FJ_BF16, TL, -1, 20.f, 0, 1, 0, {0}, {0}, {0}, 1},
      {3, 4, 2, 257, 257, 128, FJ_F16, BR, -1, 0, 1, 1, 0, {257, 0, 100}, {100, 50, 257}, {0}, 1},
      {1, 4, 2, 257, 100, 64, FJ_BF16, BR, -1, 0, 0, 1, 0, {0}, {0}, {0}, 2},
      {1, 2, 2, 190, 130, 256, FJ_F16, BR, -1, 0, 0, 1, 0, {0}, {0}, {0}, 2},
      /* head dims that are multiples of 16 but not 32, which the wgmma
       * backward plans on sm_90a (padded to its 64-column panels; the mma
       * family's, on plain sm_90, to 32 columns) */
      {1, 4, 2, 300, 300, 80, FJ_BF16, TL, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 4, 4, 257, 200, 112, FJ_F16, BR, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 2, 2, 200, 200, 144, FJ_BF16, NC, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 2, 2, 190, 250, 240, FJ_F16, TL, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      /* the pair (head dims above 192 without a mask: a cluster of two
       * blocks splits each key tile of 128): GQA with sinks and a key
       * tile of the last pair past the end, a last pair with one key,
       * varlen with an empty sequence, a softcap and dlse at 224 */
      {1, 8, 2, 300, 333, 256, FJ_BF16, NC, -1, 0, 1, 1, 0, {0}, {0}, {0}, 0},
      {1, 2, 2, 100, 129, 256, FJ_F16, NC, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {3, 4, 2, 257, 257, 224, FJ_F16, NC, -1, 20.f, 0, 1, 0, {257, 0, 100}, {100, 50, 257}, {0}, 1},
  };
  return run_cases(cases, sizeof cases / sizeof cases[0]);
}

/* The deterministic mode: right against the reference, and the same bits
 * over 10 runs; the default mode's run-to-run differences on the same
 * shapes, for comparison.  On the device's own family, then (families 2)
 * on an sm_90a device the mma family too (plain sm_90). */
/* Counts the launches that took the deterministic mode's descending walk
 * (backward.c's debug line). */
static void count_walks(void *user, fj_log_level level, const char *msg)
{
  if (level == FJ_LOG_DEBUG && strstr(msg, "descending walk"))
    ++*(int *)user;
}

/* run_deterministic's cases on the wgmma family (and, families 2, the mma
 * family's plain sm_90 context); walks, if not NULL, counts the launches
 * that took the descending walk. */
static int run_deterministic_counting(const bwd_case *cases, size_t n, int families,
                                      int *walks)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx_log(NULL, walks ? count_walks : NULL, walks, &ctx);
  if (rc)
    return rc;
  uint64_t seed = 20261127;
  int fails = 0;
  for (int fam = 0; fam < families; fam++) {
    if (fam == 1) {
      fj_ctx *plain;
      rc = plain_sm90(ctx, &plain);
      fj_ctx_destroy(ctx);
      if (rc)
        return rc;
      if (!(ctx = plain))
        break;
    }
    for (size_t i = 0; i < n; i++) {
      bwd_case dflt = cases[i];
      dflt.deterministic = 0;
      fails += run_backward(ctx, &cases[i], &seed);
      fails += run_repeats(ctx, &cases[i], &seed, 10);
      fails += run_repeats(ctx, &dflt, &seed, 10);
    }
  }
  if (ctx)
    fj_ctx_destroy(ctx);
  printf("deterministic backward: %d failed\n", fails);
  return fails != 0;
}

static int run_deterministic(const bwd_case *cases, size_t n, int families)
{
  return run_deterministic_counting(cases, n, families, NULL);
}

int test_gpu_backward_deterministic(void)
{
  static const bwd_case cases[] = {
      {1, 8, 8, 2048, 2048, 128, FJ_BF16, NC, -1, 0, 0, 1, 1, {0}, {0}, {0}, 0},
      /* The rotation (backward.c's rotates; no mask, dense, no
       * expressions or softcap, on wgmma): the plain order beside it
       * with GQA and a softcap, 8 key tiles over 11 query tiles; 16 key
       * tiles over 6 (rotations that tie), head dim 96. */
      {2, 8, 2, 700, 1000, 64, FJ_F16, NC, -1, 30.f, 0, 1, 1, {0}, {0}, {0}, 0},
      {1, 4, 4, 333, 2000, 96, FJ_BF16, NC, -1, 0, 0, 1, 1, {0}, {0}, {0}, 0},
      {1, 8, 2, 1500, 1500, 64, FJ_F16, TL, -1, 0, 1, 1, 1, {0}, {0}, {0}, 0},
      {1, 4, 4, 1100, 1100, 64, FJ_BF16, BR, 300, 0, 0, 1, 1, {0}, {0}, {0}, 0},
      {1, 4, 4, 700, 900, 128, FJ_F16, BR, 200, 30.f, 0, 1, 1, {0}, {0}, {0}, 0},
      {3, 4, 2, 900, 1000, 128, FJ_BF16, TL, -1, 0, 0, 1, 1, {900, 1, 600}, {1000, 700, 600}, {0}, 0},
      {1, 4, 4, 700, 700, 192, FJ_BF16, TL, -1, 0, 0, 1, 1, {0}, {0}, {0}, 0},
      {1, 4, 2, 600, 600, 256, FJ_BF16, NC, -1, 0, 0, 1, 1, {0}, {0}, {0}, 0},
      /* head dims the mma backward pads (on plain sm_90: 40 to 64, 72 to
       * 96; the wgmma kernel's panels on sm_90a for 72) */
      {1, 4, 2, 500, 500, 40, FJ_BF16, TL, -1, 0, 0, 1, 1, {0}, {0}, {0}, 0},
      {1, 4, 4, 400, 600, 72, FJ_F16, NC, -1, 0, 0, 1, 1, {0}, {0}, {0}, 0},
  };
  /* GQA under a mask with a right side, where the wgmma family takes the
   * descending walk (backward.c's descends, g.deterministic 3): causal
   * top-left at head dims 64 and 128, a window bottom-right at 96,
   * bottom-right with more keys and sinks, varlen, the wide kernel at 192
   * and the pair at 256 (ranked over 128-key tiles), then causal over
   * 2048 rows at 128; the descending walk, then the first four again in
   * the plain order (FLASHJIT_BWD_DESCEND=0: the narrow kernel's masks). */
  static const bwd_case bounded_gqa[] = {
      {1, 8, 2, 700, 700, 64, FJ_BF16, TL, -1, 0, 0, 1, 1, {0}, {0}, {0}, 0},
      {1, 8, 2, 1100, 1100, 96, FJ_F16, BR, 300, 0, 0, 1, 1, {0}, {0}, {0}, 0},
      {1, 4, 2, 777, 1000, 64, FJ_F16, BR, -1, 0, 1, 1, 1, {0}, {0}, {0}, 0},
      {3, 4, 2, 900, 1000, 128, FJ_BF16, TL, -1, 0, 0, 1, 1, {900, 1, 600}, {1000, 700, 600}, {0}, 0},
      {1, 8, 2, 700, 700, 192, FJ_BF16, TL, -1, 0, 0, 1, 1, {0}, {0}, {0}, 0},
      {1, 4, 2, 777, 1000, 256, FJ_F16, BR, -1, 0, 0, 1, 1, {0}, {0}, {0}, 0},
      {1, 8, 2, 2048, 2048, 128, FJ_BF16, TL, -1, 0, 0, 1, 1, {0}, {0}, {0}, 0},
  };
  int rc = run_deterministic(cases, sizeof cases / sizeof cases[0], 2);
  if (rc == FJT_SKIP)
    return rc;
  size_t nb = sizeof bounded_gqa / sizeof bounded_gqa[0];
  /* The caller's FLASHJIT_BWD_DESCEND, restored after. */
  const char *had = getenv("FLASHJIT_BWD_DESCEND");
  char *saved = had ? strdup(had) : NULL;
  unsetenv("FLASHJIT_BWD_DESCEND");
  int walks = 0, plain_walks = 0;
  printf("GQA under a bounded mask, the descending walk:\n");
  int rd = run_deterministic_counting(bounded_gqa, nb, 1, &walks);
  printf("the first four, the plain order (FLASHJIT_BWD_DESCEND=0):\n");
  setenv("FLASHJIT_BWD_DESCEND", "0", 1);
  int rp = run_deterministic_counting(bounded_gqa, 4, 1, &plain_walks);
  if (saved)
    setenv("FLASHJIT_BWD_DESCEND", saved, 1);
  else
    unsetenv("FLASHJIT_BWD_DESCEND");
  free(saved);
  /* Every case's deterministic launches took the walk (its checked run
   * and ten repeats: at least 11 a case), and none in the plain order. */
  printf("descending walks: %d launches (at least %zu), %d in the plain order (none)\n",
         walks, 11 * nb, plain_walks);
  int rw = walks < (int)(11 * nb) || plain_walks != 0;
  if (rw)
    printf("FAIL: the descending walk was not taken where it should be, or was where it "
           "should not\n");
  return rc || rd || rp || rw;
}

/* The wide kernel in turns (above head dim 128 on sm_90a; its consumers
 * add dQ themselves and pass a step's turns on at the next step): the
 * pair (above 192: a dQ tile's adds one a pair, ranked over 128-key
 * tiles) causal bottom-right with GQA and sinks (later pairs first, a
 * last pair with one key tile past the end), varlen top-left at 224 with
 * a softcap (a one-row and an empty sequence); the rotation (no mask,
 * dense: backward.c's rotates) on pairs with GQA, 11 pairs over 24 query
 * tiles, and on the 64-key tiles of head dim 192, 33 over 15.  A test of
 * its own, so that a device call can run it in a minute or two. */
int test_gpu_backward_deterministic_pair(void)
{
  static const bwd_case cases[] = {
      {1, 4, 2, 777, 1000, 256, FJ_F16, BR, -1, 0, 1, 1, 1, {0}, {0}, {0}, 0},
      {3, 4, 4, 700, 700, 224, FJ_BF16, TL, -1, 20.f, 0, 1, 1, {700, 1, 0}, {700, 129, 300}, {0}, 0},
      {1, 8, 2, 1500, 1300, 256, FJ_BF16, NC, -1, 0, 0, 1, 1, {0}, {0}, {0}, 0},
      {1, 4, 4, 900, 2100, 192, FJ_F16, NC, -1, 0, 0, 1, 1, {0}, {0}, {0}, 0},
  };
  return run_deterministic(cases, sizeof cases / sizeof cases[0], 1);
}

/* Small cases for compute-sanitizer. */
int test_gpu_sanitize_backward(void)
{
  static const bwd_case cases[] = {
      {1, 4, 2, 100, 130, 64, FJ_BF16, TL, -1, 0, 1, 1, 0, {0}, {0}, {0}, 0},
      {1, 4, 2, 100, 130, 96, FJ_F16, BR, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      {1, 4, 2, 100, 130, 256, FJ_BF16, TL, -1, 0, 1, 1, 0, {0}, {0}, {0}, 0},
      /* the cluster pair (no mask): its exchange of dS^T between blocks */
      {1, 4, 2, 100, 130, 256, FJ_BF16, NC, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
      /* head dim 192: the 64-key wide kernel, or the pair of three
       * panels where FLASHJIT_BWD_PAIR=1 asks */
      {1, 4, 2, 100, 130, 192, FJ_F16, NC, -1, 0, 0, 1, 0, {0}, {0}, {0}, 0},
  };
  return run_cases(cases, sizeof cases / sizeof cases[0]);
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

/* ---- score and mask expressions ---------------------------------------------
 * The backward with the user's expressions (fj_mods.score, .mask) against
 * the reference's, which applies the expression's derivative on the host
 * (evaluated, not compiled).  Every case offers the same parameters:
 * slope, float32 [heads]: ALiBi's slopes; rel, float32 [heads][1024]: a
 * relative-position bias read at q - kv + 512; doc, int32 [512]: a
 * document id per position (documents of 37 positions). */

#define MODS_SEQ 512

typedef struct mods_case {
  int b, hq, hkv, sq, skv, d;
  fj_dtype dt;
  fj_causal causal;
  const char *score, *mask;
  float softcap;
  /* Varlen (lq[0] > 0): b packed sequences of lq[i] queries and lkv[i]
   * keys, at most sq and skv (MODS_SEQ: the parameters' positions). */
  int lq[3], lkv[3];
} mods_case;

typedef struct mods_params {
  float slope[16];
  float rel[16 * 2 * MODS_SEQ];
  int32_t doc[MODS_SEQ];
  void *dev[3];
  fj_mod_param host_p[3], dev_p[3];
} mods_params;

static int mods_params_init(mods_params *mp, uint64_t *seed)
{
  memset(mp, 0, sizeof *mp);
  for (int h = 0; h < 16; h++)
    mp->slope[h] = exp2f(-8.f * (float)(h + 1) / 16.f);
  for (size_t i = 0; i < sizeof mp->rel / sizeof mp->rel[0]; i++)
    mp->rel[i] = (float)(0.5 * normal(seed));
  for (int i = 0; i < MODS_SEQ; i++)
    mp->doc[i] = i / 37;
  const void *host[3] = {mp->slope, mp->rel, mp->doc};
  const size_t bytes[3] = {sizeof mp->slope, sizeof mp->rel, sizeof mp->doc};
  const fj_mod_param shape[3] = {
      {"slope", FJ_MOD_F32, 1, {16, 0, 0, 0}, NULL, 0},
      {"rel", FJ_MOD_F32, 2, {16, 2 * MODS_SEQ, 0, 0}, NULL, 0},
      {"doc", FJ_MOD_I32, 1, {MODS_SEQ, 0, 0, 0}, NULL, 0}};
  for (int i = 0; i < 3; i++) {
    mp->dev[i] = upload(host[i], bytes[i]);
    if (!mp->dev[i])
      return 1;
    mp->host_p[i] = mp->dev_p[i] = shape[i];
    mp->host_p[i].data = host[i];
    mp->dev_p[i].data = mp->dev[i];
  }
  return 0;
}

static void mods_params_free(mods_params *mp)
{
  for (int i = 0; i < 3; i++)
    cudaFree(mp->dev[i]);
}

/* ||got - want|| / ||want|| over n floats. */
static double rel_err_f32(const float *got, const float *want, size_t n)
{
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)got[i] - (double)want[i];
    num += d * d;
    den += (double)want[i] * (double)want[i];
  }
  return isfinite(num) ? sqrt(num / (den > 0 ? den : 1)) : (double)INFINITY;
}

/* n elements of dtype dt (16-bit) as doubles; NULL if out of memory. */
static double *to_f64(fj_dtype dt, const void *x, size_t n)
{
  float *f = malloc(n * sizeof *f);
  double *d = malloc(n * sizeof *d);
  if (f && d) {
    fj_convert(FJ_F32, f, dt, x, n);
    for (size_t i = 0; i < n; i++)
      d[i] = f[i];
  }
  free(f);
  if (!f) {
    free(d);
    return NULL;
  }
  return d;
}

/* The parameters' gradients as a backward of this kind computes them:
 * each row's Delta = rowsum(dO o O) from the forward's 16-bit O (and its
 * LSE), as FlashAttention's, cuDNN's and FlexAttention's backward take it.
 * A sum over positions such as ALiBi's slope gradient cancels to a value
 * small next to that rounding (about 12% in bf16 at 256 keys against the
 * exact Delta), so the kernel is checked against this reference; dQ, dK
 * and dV against the exact one.  0: done. */
static int ref_grads_o16(const bwd_run *r, const fj_mods *hm, size_t nl)
{
  const fj_problem *p = &r->p;
  void *o = malloc(r->nq * 2);
  float *lse = malloc(nl * 4);
  double *lse64 = malloc(nl * sizeof *lse64);
  double *in[5] = {NULL, NULL, NULL, NULL, NULL};
  double *g[3] = {calloc(r->nq, 8), calloc(r->nk, 8), calloc(r->nk, 8)};
  int rc = 1;
  if (!o || !lse || !lse64 || !g[0] || !g[1] || !g[2] ||
      cudaMemcpy(o, r->o_d, r->nq * 2, cudaMemcpyDeviceToHost) != cudaSuccess ||
      cudaMemcpy(lse, r->lse_d, nl * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
    goto out;
  for (size_t i = 0; i < nl; i++)
    lse64[i] = lse[i];
  const void *src[5] = {r->q, r->k, r->v, r->dout, o};
  const size_t n[5] = {r->nq, r->nk, r->nk, r->nq, r->nq};
  for (int i = 0; i < 5; i++)
    if (!(in[i] = to_f64(p->dtype, src[i], n[i])))
      goto out;
  fj_problem hp = *p;
  hp.mods = hm;
  if (hp.cu_seqlens_q) {  /* the host's copies */
    hp.cu_seqlens_q = r->cuq;
    hp.cu_seqlens_kv = r->cukv;
  }
  rc = fj__reference_bwd_part64(&hp, in[0], in[1], in[2], in[3], in[4], lse64,
                                g[0], g[1], g[2]) != FJ_OK;
  if (rc)
    fprintf(stderr, "reference (Delta from O): %s\n", fj_errmsg(NULL));
out:
  for (int i = 0; i < 5; i++)
    free(in[i]);
  for (int i = 0; i < 3; i++)
    free(g[i]);
  free(o);
  free(lse);
  free(lse64);
  return rc;
}

/* The parameters' gradients of a case (pgrads): slope's and rel's, on the
 * device (zeroed: the backward adds) and the reference's on the host. */
typedef struct mods_grads {
  float *dev[2];
  float host[2][16 * 2 * MODS_SEQ];
  float got[2][16 * 2 * MODS_SEQ];
  float *dptr[3], *hptr[3];
} mods_grads;

static const size_t grad_count[2] = {16, 16 * 2 * MODS_SEQ};

static int mods_grads_init(mods_grads *mg)
{
  memset(mg, 0, sizeof *mg);
  for (int t = 0; t < 2; t++) {
    mg->dev[t] = upload(NULL, grad_count[t] * 4);
    if (!mg->dev[t] || cudaMemset(mg->dev[t], 0, grad_count[t] * 4) != cudaSuccess)
      return 1;
    mg->dptr[t] = mg->dev[t];
    mg->hptr[t] = mg->host[t];
  }
  return 0;
}

/* One case: forward and backward with the expressions on the device, the
 * reference with the same expressions on the host; with pgrads, slope's
 * and rel's gradients too (fj_mods.param_grads), or with pgrads 2 rel's
 * alone (slope's pointer NULL: its buffer must stay zero).  0: right. */
/* With det, the deterministic mode: the backward runs a second time with
 * the gradients cleared, which must give the same bits (dQ, dK, dV and
 * the parameters'). */
static int run_mods_case_det(fj_ctx *ctx, const mods_case *mc,
                             const mods_params *mp, uint64_t *seed,
                             int pgrads, int det)
{
  mods_grads *mg = pgrads ? malloc(sizeof *mg) : NULL;
  if (pgrads && (!mg || mods_grads_init(mg))) {
    fprintf(stderr, "out of memory for the parameters' gradients\n");
    return 1;
  }
  if (pgrads == 2)
    mg->dptr[0] = mg->hptr[0] = NULL;
  bwd_run r;
  memset(&r, 0, sizeof r);
  fj_problem *p = &r.p;
  int varlen = mc->lq[0] > 0;
  fj_problem_init(p, mc->b, mc->hq, mc->hkv, mc->sq, mc->skv, mc->d, mc->dt,
                  varlen ? FJ_THD : FJ_BSHD);
  p->causal = mc->causal;
  size_t rows_q = (size_t)mc->b * (size_t)mc->sq,
         rows_kv = (size_t)mc->b * (size_t)mc->skv;
  if (varlen) {
    for (int i = 0; i < mc->b; i++) {
      r.cuq[i + 1] = r.cuq[i] + mc->lq[i];
      r.cukv[i + 1] = r.cukv[i] + mc->lkv[i];
    }
    rows_q = (size_t)r.cuq[mc->b];
    rows_kv = (size_t)r.cukv[mc->b];
    r.cuq_d = upload(r.cuq, sizeof(int32_t) * (size_t)(mc->b + 1));
    r.cukv_d = upload(r.cukv, sizeof(int32_t) * (size_t)(mc->b + 1));
    p->cu_seqlens_q = r.cuq_d;
    p->cu_seqlens_kv = r.cukv_d;
    p->total_q = (int)rows_q;
    p->total_kv = (int)rows_kv;
  }
  fj_mods_init(&r.m);
  r.m.score = mc->score;
  r.m.mask = mc->mask;
  r.m.softcap = mc->softcap;
  r.m.params = mp->dev_p;
  r.m.num_params = 3;
  r.m.param_grads = pgrads ? mg->dptr : NULL;
  p->mods = &r.m;
  p->deterministic = det;
  size_t nl = (size_t)mc->b * (size_t)mc->hq * (size_t)mc->sq;
  int rc = 1;
  fj_status st;
  if (run_tensors(ctx, &r, rows_q, rows_kv, 1.f, seed))
    goto out;
  if (run_pass(ctx, &r))
    goto out;
  float *rq = calloc(r.nq, 4), *rk = calloc(r.nk, 4), *rv = calloc(r.nk, 4);
  fj_problem hp = r.p;
  fj_mods hm = r.m;
  if (varlen) {
    hp.cu_seqlens_q = r.cuq;
    hp.cu_seqlens_kv = r.cukv;
  }
  hm.params = mp->host_p;
  hm.param_grads = pgrads ? mg->hptr : NULL;
  hp.mods = &hm;
  st = fj_reference_bwd(&hp, r.q, r.k, r.v, r.dout, rq, rk, rv, NULL);
  if (st != FJ_OK) {
    fprintf(stderr, "reference: %s\n", fj_errmsg(NULL));
  } else {
    double eq = rel_err(mc->dt, r.hq, rq, r.nq);
    double ek = rel_err(mc->dt, r.hk, rk, r.nk);
    double ev = rel_err(mc->dt, r.hv, rv, r.nk);
    double tol = mc->dt == FJ_BF16 ? 3e-2 : 1e-2;  /* as run_backward's */
    double eg[2] = {0, 0};
    int o16 = 0;
    if (pgrads) {
      /* The parameters' reference again, Delta from the 16-bit O. */
      memset(mg->host, 0, sizeof mg->host);
      o16 = ref_grads_o16(&r, &hm, nl) == 0;
      eg[0] = eg[1] = INFINITY;
    }
    for (int t = 0; o16 && t < 2; t++) {
      cudaMemcpy(mg->got[t], mg->dev[t], grad_count[t] * 4, cudaMemcpyDeviceToHost);
      eg[t] = rel_err_f32(mg->got[t], mg->host[t], grad_count[t]);
      if (!mg->dptr[t]) {  /* no gradient asked for: nothing written */
        eg[t] = 0;
        for (size_t i = 0; i < grad_count[t]; i++)
          if (mg->got[t][i] != 0.f)
            eg[t] = INFINITY;
      }
    }
    rc = !(eq < tol && ek < tol && ev < tol && eg[0] < tol && eg[1] < tol);
    if (pgrads)
      printf("       dslope %.2e drel %.2e\n", eg[0], eg[1]);
    if (det && rc == 0) {
      /* Again from cleared gradients: the same bits everywhere. */
      void *first[3] = {malloc(r.nq * 2), malloc(r.nk * 2), malloc(r.nk * 2)};
      if (first[0] && first[1] && first[2]) {
        memcpy(first[0], r.hq, r.nq * 2);
        memcpy(first[1], r.hk, r.nk * 2);
        memcpy(first[2], r.hv, r.nk * 2);
        /* A plan made without the deterministic mode has no room for the
         * parameters' words: a caller's workspace of its size is refused,
         * named, before anything launches. */
        if (pgrads) {
          fj_bwd_plan loose;
          r.p.deterministic = 0;
          fj_status pst = fj_attention_bwd_plan(ctx, &r.p, &loose);
          r.p.deterministic = 1;
          void *ws = NULL;
          if (pst != FJ_OK || cudaMalloc(&ws, loose.workspace_bytes) != cudaSuccess ||
              fj_attention_bwd_run(ctx, &r.p, &loose, r.q_d, r.k_d, r.v_d, r.o_d, r.do_d,
                                   r.lse_d, r.gq, r.gk, r.gv, NULL, ws, loose.workspace_bytes,
                                   NULL) != FJ_ERR_INVALID_ARG ||
              !strstr(fj_errmsg(ctx), "is too small")) {
            printf("       a loose plan's workspace was not refused: %s\n", fj_errmsg(ctx));
            rc = 1;
          }
          cudaFree(ws);
        }
        for (int t = 0; pgrads && t < 2; t++)
          cudaMemset(mg->dev[t], 0, grad_count[t] * 4);
        int again = run_pass(ctx, &r) == 0 && !memcmp(first[0], r.hq, r.nq * 2) &&
                    !memcmp(first[1], r.hk, r.nk * 2) && !memcmp(first[2], r.hv, r.nk * 2);
        static float twice[16 * 2 * MODS_SEQ];
        for (int t = 0; again && pgrads && t < 2; t++) {
          cudaMemcpy(twice, mg->dev[t], grad_count[t] * 4, cudaMemcpyDeviceToHost);
          again = !memcmp(twice, mg->got[t], grad_count[t] * 4);
        }
        printf("       deterministic: the second run's bits %s\n", again ? "the same" : "DIFFER");
        rc |= !again;
      } else {
        rc = 1;
      }
      for (int i = 0; i < 3; i++)
        free(first[i]);
    }
    printf("%s %-5s %s d%-3d %s h%d/%d s%d/%d%s %s score '%s'%s%s%s: dq %.2e "
           "dk %.2e dv %.2e\n",
           rc ? "FAIL" : "ok  ", fj_mma_name(r.plan.variant.mma),
           fj_ctx_arch(ctx), mc->d, fj_dtype_name(mc->dt), mc->hq, mc->hkv,
           mc->sq, mc->skv, varlen ? " varlen" : "", fj_causal_name(mc->causal),
           mc->score ? mc->score : "", mc->mask ? " mask '" : "",
           mc->mask ? mc->mask : "", mc->softcap > 0 ? "' softcap" : "",
           eq, ek, ev);
  }
  free(rq);
  free(rk);
  free(rv);
out:
  run_free(&r);
  if (mg) {
    cudaFree(mg->dev[0]);
    cudaFree(mg->dev[1]);
    free(mg);
  }
  return rc;
}

static int run_mods_case(fj_ctx *ctx, const mods_case *mc,
                         const mods_params *mp, uint64_t *seed, int pgrads)
{
  return run_mods_case_det(ctx, mc, mp, seed, pgrads, 0);
}

/* One case of a set (its index i) on ctx; 0: passed. */
typedef int (*case_fn)(fj_ctx *ctx, size_t i, const mods_params *mp,
                       uint64_t *seed, const void *set);

/* A set's n cases on the device's own target, then, on an sm_90a device,
 * on plain sm_90 too (the mma family there), the parameters' tensors
 * drawn from `seed`; what: the summary line's name.  0: all passed. */
static int run_set(const char *what, size_t n, case_fn fn, const void *set,
                   uint64_t seed)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(NULL, &ctx);
  if (rc)
    return rc;
  mods_params *mp = malloc(sizeof *mp);
  CHECK(mp != NULL && mods_params_init(mp, &seed) == 0);
  int fails = 0, runs = 0;
  for (size_t i = 0; i < n; i++, runs++)
    fails += fn(ctx, i, mp, &seed, set);
  fj_ctx *plain;
  rc = plain_sm90(ctx, &plain);
  fj_ctx_destroy(ctx);
  if (rc)
    return rc;
  for (size_t i = 0; plain && i < n; i++, runs++)
    fails += fn(plain, i, mp, &seed, set);
  if (plain)
    fj_ctx_destroy(plain);
  mods_params_free(mp);
  free(mp);
  printf("backward with %s: %d runs, %d failed\n", what, runs, fails);
  return fails != 0;
}

typedef struct mods_set {
  const mods_case *cases;
  int pgrads, det;
} mods_set;

static int mods_case_fn(fj_ctx *ctx, size_t i, const mods_params *mp,
                        uint64_t *seed, const void *set)
{
  const mods_set *ms = set;
  return run_mods_case_det(ctx, &ms->cases[i], mp, seed, ms->pgrads, ms->det);
}

/* The expression cases: on sm_90a the wgmma family for head dims 64 to
 * 256 (the wide kernel above 128; the parameters' gradients there on
 * mma), on plain sm_90 the mma family. */
static int run_mods_cases(const mods_case *cases, size_t n, int pgrads)
{
  const mods_set set = {cases, pgrads, 0};
  return run_set("expressions", n, mods_case_fn, &set, 20261127);
}

#define ALIBI "s + slope(h) * (float)(kv - q)"
#define SOFTCAP "20.0f * tanhf(s / 20.0f)"
#define RELBIAS "s + rel(h, q - kv + 512)"
#define INVERSE "s - 2.0f / (s * s + 1.0f)"
#define BRANCH "q >= kv ? s * 1.5f : powf(fabsf(s) + 1.0f, 1.25f)"
/* T5's buckets (the built-in t5 over rel): a relative table's subtree,
 * evaluated once a launch into the workspace (rel_table.h). */
#define T5REL                                                              \
  "s + rel(h, (kv - q > 0 ? 16 : 0) + (abs(kv - q) < 8 ? abs(kv - q) : " \
  "min(15, 8 + (int)(logf((float)abs(kv - q) / 8.f) / logf(16.f) * 8.f))))"

int test_gpu_backward_mods(void)
{
  static const mods_case cases[] = {
      {2, 4, 4, 256, 256, 64, FJ_BF16, NC, ALIBI, NULL, 0, {0}, {0}},
      {1, 4, 2, 300, 300, 128, FJ_F16, TL, ALIBI, NULL, 0, {0}, {0}},
      {2, 4, 4, 256, 256, 64, FJ_F16, NC, SOFTCAP, NULL, 0, {0}, {0}},
      {1, 4, 4, 200, 333, 128, FJ_BF16, BR, SOFTCAP, NULL, 0, {0}, {0}},
      {1, 4, 4, 300, 300, 64, FJ_BF16, TL, RELBIAS, NULL, 0, {0}, {0}},
      {1, 8, 2, 190, 250, 128, FJ_F16, NC, RELBIAS, NULL, 0, {0}, {0}},
      {1, 4, 4, 257, 257, 64, FJ_F16, NC, INVERSE, NULL, 0, {0}, {0}},
      {1, 2, 2, 130, 130, 96, FJ_BF16, TL, INVERSE, NULL, 0, {0}, {0}},
      {1, 4, 4, 256, 256, 128, FJ_BF16, NC, BRANCH, NULL, 0, {0}, {0}},
      {1, 2, 2, 100, 100, 32, FJ_F16, NC, BRANCH, NULL, 0, {0}, {0}},
      /* a mask expression (documents), with and without a score one */
      {2, 4, 4, 300, 300, 64, FJ_BF16, NC, NULL, "doc(q) == doc(kv)", 0, {0}, {0}},
      {1, 4, 2, 257, 257, 128, FJ_F16, TL, ALIBI, "doc(q) == doc(kv)", 0, {0}, {0}},
      /* an expression and the built-in softcap after it */
      {1, 4, 4, 256, 256, 64, FJ_BF16, NC, "s * 1.5f + (float)(q - kv) * 0.01f",
       NULL, 10.f, {0}, {0}},
      /* padded and wide heads (the wgmma kernel's role split above 128) */
      {1, 4, 4, 256, 256, 96, FJ_BF16, NC, SOFTCAP, "doc(q) == doc(kv)", 0, {0}, {0}},
      {1, 4, 2, 200, 200, 192, FJ_BF16, TL, ALIBI, "doc(q) == doc(kv)", 0, {0}, {0}},
      {1, 2, 2, 130, 190, 256, FJ_F16, BR, RELBIAS, NULL, 10.f, {0}, {0}},
      {1, 2, 2, 190, 130, 256, FJ_BF16, NC, BRANCH, NULL, 0, {0}, {0}},
      /* head dim 64 (K and V as register operands): a derivative kept per
       * tile of 16 queries, a mask expression, bottom-right */
      {1, 4, 4, 300, 350, 64, FJ_F16, BR, BRANCH, "doc(q) == doc(kv)", 0, {0}, {0}},
      /* varlen: positions count from each sequence's start (an empty one,
       * a tail of 1); the narrow and wide wgmma kernels */
      {3, 4, 2, 300, 400, 64, FJ_BF16, TL, ALIBI, "doc(q) == doc(kv)", 0, {300, 1, 130}, {200, 400, 130}},
      {3, 4, 4, 257, 257, 128, FJ_F16, BR, RELBIAS, NULL, 0, {257, 0, 100}, {100, 50, 257}},
      {2, 2, 2, 200, 300, 256, FJ_BF16, BR, SOFTCAP, "doc(q) == doc(kv)", 0, {200, 77}, {300, 100}},
      /* relative tables: T5's buckets on the narrow, the wide and the mma
       * kernels, varlen; a bias read through a bucket table */
      {1, 4, 2, 300, 333, 128, FJ_BF16, BR, T5REL, NULL, 0, {0}, {0}},
      {1, 2, 2, 200, 200, 192, FJ_F16, NC, T5REL, NULL, 0, {0}, {0}},
      {1, 2, 2, 100, 130, 32, FJ_BF16, BR, T5REL, NULL, 0, {0}, {0}},
      {3, 4, 4, 257, 257, 128, FJ_F16, BR, T5REL, NULL, 0, {257, 0, 100}, {100, 50, 257}},
      {2, 4, 4, 257, 257, 64, FJ_BF16, TL, "s + rel(h, doc(abs(kv - q)) % 64)", NULL, 0, {0}, {0}},
  };
  return run_mods_cases(cases, sizeof cases / sizeof cases[0], 0);
}

/* The parameters' gradients (fj_mods.param_grads): ALiBi's slopes and a
 * relative bias table, read by score expressions, against the reference's
 * (float32 atomics on the device). */
int test_gpu_backward_param_grads(void)
{
  static const mods_case cases[] = {
      {2, 4, 4, 256, 256, 64, FJ_BF16, NC, ALIBI, NULL, 0, {0}, {0}},
      {1, 4, 2, 300, 300, 128, FJ_F16, TL, ALIBI, NULL, 0, {0}, {0}},
      {1, 4, 4, 300, 300, 64, FJ_BF16, TL, RELBIAS, NULL, 0, {0}, {0}},
      {1, 8, 2, 190, 250, 128, FJ_F16, NC, "s * (1.0f + 0.1f * slope(h)) + rel(h, kv - q + 512)",
       "doc(q) == doc(kv)", 0, {0}, {0}},
      {1, 4, 4, 256, 256, 64, FJ_BF16, BR, "s + rel(h, q - kv + 512) * 2.0f", NULL, 10.f, {0}, {0}},
      /* above head dim 128: the mma family on sm_90a too */
      {1, 2, 2, 130, 130, 192, FJ_BF16, TL, ALIBI, NULL, 0, {0}, {0}},
      /* varlen */
      {2, 4, 2, 300, 300, 64, FJ_BF16, TL, ALIBI, NULL, 0, {300, 41}, {200, 300}},
      /* T5's buckets: the score read from the relative table, the table's
       * gradient added at the buckets the expression reads */
      {1, 4, 4, 300, 300, 64, FJ_BF16, TL, T5REL, NULL, 0, {0}, {0}},
  };
  return run_mods_cases(cases, sizeof cases / sizeof cases[0], 1);
}

/* The parameters' gradients in the deterministic mode (fixed point in the
 * workspace, bwd_common.cuh's pgrad_words_add): against the reference as
 * above, and the same bits from a second run -- a slope per head (a
 * warp's sums), a table read per element, both with a mask expression,
 * above head dim 128 (the mma family), varlen. */
int test_gpu_backward_param_grads_deterministic(void)
{
  static const mods_case cases[] = {
      {2, 4, 4, 256, 256, 64, FJ_BF16, NC, ALIBI, NULL, 0, {0}, {0}},
      {1, 4, 4, 300, 300, 64, FJ_BF16, TL, RELBIAS, NULL, 0, {0}, {0}},
      {1, 8, 2, 190, 250, 128, FJ_F16, NC, "s * (1.0f + 0.1f * slope(h)) + rel(h, kv - q + 512)",
       "doc(q) == doc(kv)", 0, {0}, {0}},
      {1, 2, 2, 130, 130, 192, FJ_BF16, TL, ALIBI, NULL, 0, {0}, {0}},
      {2, 4, 2, 300, 300, 64, FJ_BF16, TL, RELBIAS, NULL, 0, {300, 41}, {200, 300}},
  };
  const mods_set set = {cases, 1, 1};
  return run_set("expressions, deterministic", sizeof cases / sizeof cases[0],
                 mods_case_fn, &set, 20261206);
}

/* One fj_mods whose param_grads change between calls on one context:
 * both gradients, then rel's alone, then both again (the context keeps the
 * backward's recent kernels by problem, and each set of parameters with a
 * gradient is a main kernel of its own: a launch must not take the last
 * set's).  run_mods_case's fj_mods is its own local, so the calls likely
 * see it at one address, as a caller that reuses its fj_mods would. */
int test_gpu_backward_param_grads_sets(void)
{
  static const mods_case c = {1, 8, 2, 190, 250, 128, FJ_F16, NC,
                              "s * (1.0f + 0.1f * slope(h)) + rel(h, kv - q + 512)",
                              "doc(q) == doc(kv)", 0, {0}, {0}};
  static const int sets[] = {1, 2, 1};
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(NULL, &ctx);
  if (rc)
    return rc;
  uint64_t seed = 20261206;
  mods_params *mp = malloc(sizeof *mp);
  CHECK(mp != NULL && mods_params_init(mp, &seed) == 0);
  int fails = 0;
  for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
    fails += run_mods_case(ctx, &c, mp, &seed, sets[i]);
  fj_ctx_destroy(ctx);
  mods_params_free(mp);
  free(mp);
  printf("parameters' gradient sets on one context: %d failed\n", fails);
  return fails != 0;
}

/* One small case with an expression that gives inf at the zero padding's
 * score (1 / s at s = 0 past the sequence's 100 rows and 130 keys), for
 * compute-sanitizer and for NaN: its gradients must stay finite. */
int test_gpu_sanitize_backward_mods(void)
{
  static const mods_case cases[] = {
      {1, 4, 2, 100, 130, 64, FJ_BF16, TL,
       "s + (fabsf(s) > 0.25f ? 0.01f / s : 0.04f * s) + 0.0f * (1.0f / s)",
       "doc(q) == doc(kv)", 0, {0}, {0}},
  };
  return run_mods_cases(cases, 1, 0);
}

/* ---- block masks ---------------------------------------------------------------
 * The backward with a block mask the library builds (fj_block_mask_build)
 * from the case's mask, against the reference with the mask's download
 * (which reads the rows' lists and refuses transposed lists that describe
 * other blocks).  The builder's transposed lists are checked first against
 * its rows' lists: the same blocks, each list ascending.  The mma family
 * runs them on every target (the plan refuses the wgmma one). */

typedef struct bm_case {
  int b, hq, hkv, sq, skv, d;
  fj_dtype dt;
  fj_causal causal;
  const char *mask;
  int bq, bkv;
  int heads;  /* the mask's heads the builder should give (1 or hq) */
  int det;    /* the deterministic mode: on the mma family, and the same
                 bits over three more runs */
} bm_case;

/* One direction's lists of (batch, head) bh as states [q_blocks][kv_blocks]
 * (0 none, 1 partial, 2 full); 1 where a list is out of order or names a
 * block twice or out of range. */
static int bm_states(const fj_block_mask *bm, int bh, int cols, unsigned char *out)
{
  int n = cols ? bm->kv_blocks : bm->q_blocks, len = cols ? bm->q_blocks : bm->kv_blocks;
  const int32_t *num[2] = {cols ? bm->q_num : bm->kv_num, cols ? bm->full_q_num : bm->full_num};
  const int32_t *idx[2] = {cols ? bm->q_indices : bm->kv_indices,
                           cols ? bm->full_q_indices : bm->full_indices};
  memset(out, 0, (size_t)bm->q_blocks * (size_t)bm->kv_blocks);
  for (int f = 0; f < 2; f++)
    for (int r = 0; r < n; r++) {
      long long at = (long long)bh * n + r;
      if (num[f][at] < 0 || num[f][at] > len)
        return 1;
      for (int i = 0; i < num[f][at]; i++) {
        int e = idx[f][at * len + i];
        if (e < 0 || e >= len || (i > 0 && e <= idx[f][at * len + i - 1]))
          return 1;
        unsigned char *s = &out[cols ? (size_t)e * (size_t)bm->kv_blocks + (size_t)r
                                     : (size_t)r * (size_t)bm->kv_blocks + (size_t)e];
        if (*s)
          return 1;
        *s = (unsigned char)(f + 1);
      }
    }
  return 0;
}

/* The builder's mask in both memories: dm (device, into *buf) and hm (its
 * download, into *hbuf); the two directions compared.  0: built, agreeing. */
static int bm_build(fj_ctx *ctx, const fj_problem *p, const bm_case *bc,
                    fj_block_mask *dm, fj_block_mask *hm, void **buf, void **hbuf)
{
  size_t bytes;
  *buf = *hbuf = NULL;
  if (fj_block_mask_size(ctx, p, bc->bq, bc->bkv, &bytes) != FJ_OK ||
      cudaMalloc(buf, bytes) != cudaSuccess ||
      fj_block_mask_build(ctx, p, bc->bq, bc->bkv, *buf, bytes, dm, NULL) != FJ_OK) {
    fprintf(stderr, "block mask: %s\n", fj_errmsg(ctx));
    return 1;
  }
  *hbuf = malloc(bytes);
  if (!*hbuf || cudaMemcpy(*hbuf, *buf, bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
    return 1;
  const char *d0 = *buf, *h0 = *hbuf;
  const int32_t **dev[8] = {&dm->kv_num, &dm->kv_indices, &dm->full_num, &dm->full_indices,
                            &dm->q_num, &dm->q_indices, &dm->full_q_num, &dm->full_q_indices};
  const int32_t **host[8] = {&hm->kv_num, &hm->kv_indices, &hm->full_num, &hm->full_indices,
                             &hm->q_num, &hm->q_indices, &hm->full_q_num, &hm->full_q_indices};
  *hm = *dm;
  for (int i = 0; i < 8; i++)
    *host[i] = (const int32_t *)(h0 + ((const char *)*dev[i] - d0));
  size_t n = (size_t)hm->q_blocks * (size_t)hm->kv_blocks;
  unsigned char *rows = malloc(n), *cols = malloc(n);
  int bad = !rows || !cols || hm->heads != bc->heads || hm->batch != 1, kept = 0, partial = 0;
  for (int bh = 0; !bad && bh < hm->batch * hm->heads; bh++) {
    bad = bm_states(hm, bh, 0, rows) || bm_states(hm, bh, 1, cols) || memcmp(rows, cols, n);
    for (size_t i = 0; i < n; i++) {
      kept += rows[i] != 0;
      partial += rows[i] == 1;
    }
  }
  printf("       block mask %dx%d, %d head(s): %d x %d blocks, %d kept (%d partial): %s\n",
         bc->bq, bc->bkv, hm->heads, hm->q_blocks, hm->kv_blocks, kept, partial,
         bad ? "TRANSPOSED LISTS WRONG" : "both directions agree");
  free(rows);
  free(cols);
  return bad;
}

/* One case: the mask built, forward and backward with it on the device,
 * the reference on the host.  0: right. */
static int run_bm_case(fj_ctx *ctx, const bm_case *bc, const mods_params *mp,
                       uint64_t *seed)
{
  bwd_run r;
  memset(&r, 0, sizeof r);
  fj_problem *p = &r.p;
  fj_problem_init(p, bc->b, bc->hq, bc->hkv, bc->sq, bc->skv, bc->d, bc->dt, FJ_BSHD);
  p->causal = bc->causal;
  fj_mods_init(&r.m);
  r.m.mask = bc->mask;
  r.m.params = mp->dev_p;
  r.m.num_params = 3;
  p->mods = &r.m;
  fj_block_mask dm, hm;
  void *buf = NULL, *hbuf = NULL;
  int rc = 1;
  if (bm_build(ctx, p, bc, &dm, &hm, &buf, &hbuf))
    goto out;
  r.m.block_mask = &dm;
  p->deterministic = bc->det;
  if (run_tensors(ctx, &r, (size_t)bc->b * (size_t)bc->sq,
                  (size_t)bc->b * (size_t)bc->skv, 1.f, seed))
    goto out;
  /* wgmma on sm_90a where the key blocks are whole key tiles, else mma */
  int wg_tile = bc->d <= 128 ? 128 : 64;
  int want_wg = strcmp(fj_ctx_arch(ctx), "sm_90a") == 0 && bc->bkv % wg_tile == 0 && !bc->det;
  if (r.plan.variant.mma != (want_wg ? FJ_MMA_WGMMA : FJ_MMA_SYNC)) {
    fprintf(stderr, "the plan's backward is %s's, not %s's\n", fj_mma_name(r.plan.variant.mma),
            want_wg ? "wgmma" : "mma");
    goto out;
  }
  if (run_pass(ctx, &r))
    goto out;
  float *rq = calloc(r.nq, 4), *rk = calloc(r.nk, 4), *rv = calloc(r.nk, 4);
  fj_problem hp = r.p;
  fj_mods hmods = r.m;
  hmods.params = mp->host_p;
  hmods.block_mask = &hm;
  hp.mods = &hmods;
  fj_status st = fj_reference_bwd(&hp, r.q, r.k, r.v, r.dout, rq, rk, rv, NULL);
  if (st != FJ_OK) {
    fprintf(stderr, "reference: %s\n", fj_errmsg(NULL));
  } else {
    double eq = rel_err(bc->dt, r.hq, rq, r.nq);
    double ek = rel_err(bc->dt, r.hk, rk, r.nk);
    double ev = rel_err(bc->dt, r.hv, rv, r.nk);
    double tol = bc->dt == FJ_BF16 ? 3e-2 : 1e-2;  /* as run_backward's */
    rc = !(eq < tol && ek < tol && ev < tol);
    /* The deterministic mode: three more runs, the first one's bits. */
    int differ = 0;
    void *first[4] = {malloc(r.nq * 2), malloc(r.nk * 2), malloc(r.nk * 2), NULL};
    if (bc->det && first[0] && first[1] && first[2]) {
      memcpy(first[0], r.hq, r.nq * 2);
      memcpy(first[1], r.hk, r.nk * 2);
      memcpy(first[2], r.hv, r.nk * 2);
      for (int i = 0; i < 3; i++)
        differ += run_pass(ctx, &r) || !same_bits(&r, first);
    } else if (bc->det) {
      differ = 1;
    }
    for (int i = 0; i < 3; i++)
      free(first[i]);
    rc |= differ != 0;
    printf("%s %-5s %s d%-3d %s b%d h%d/%d s%d/%d %s mask '%s' bm%dx%d%s: dq %.2e dk %.2e "
           "dv %.2e%s\n",
           rc ? "FAIL" : "ok  ", fj_mma_name(r.plan.variant.mma), fj_ctx_arch(ctx), bc->d,
           fj_dtype_name(bc->dt), bc->b, bc->hq, bc->hkv, bc->sq, bc->skv,
           fj_causal_name(bc->causal), bc->mask, bc->bq, bc->bkv,
           bc->det ? " deterministic" : "", eq, ek, ev,
           bc->det ? (differ ? "; reruns DIFFER" : "; 3 reruns the same bits") : "");
  }
  free(rq);
  free(rk);
  free(rv);
out:
  run_free(&r);
  cudaFree(buf);
  free(hbuf);
  return rc;
}

static int bm_case_fn(fj_ctx *ctx, size_t i, const mods_params *mp,
                      uint64_t *seed, const void *set)
{
  return run_bm_case(ctx, &((const bm_case *)set)[i], mp, seed);
}

/* The block-mask cases: on sm_90a the wgmma family where the key blocks
 * are whole key tiles (128 keys up to head dim 128, 64 above), else mma;
 * on plain sm_90 the mma family. */
static int run_bm_cases(const bm_case *cases, size_t n)
{
  return run_set("block masks", n, bm_case_fn, cases, 20261128);
}

#define DOCS "doc(q) == doc(kv)"
#define WINDOW "q - kv >= 0 && q - kv < 100"
#define PER_HEAD "(kv + h * 37) % 5 != 0 || q == kv"

int test_gpu_backward_block_mask(void)
{
  static const bm_case cases[] = {
      /* documents of 37 positions under a causal mask: both dtypes, d64
       * and d128, lengths not multiples of the blocks, GQA 4:1 */
      {2, 4, 4, 500, 500, 64, FJ_BF16, BR, DOCS, 128, 128, 1, 0},
      {1, 8, 2, 333, 333, 128, FJ_F16, TL, DOCS, 128, 128, 1, 0},
      {1, 8, 2, 300, 450, 64, FJ_F16, BR, DOCS, 64, 256, 1, 0},
      /* a window written as an expression (no built-in mask): blocks of
       * the diagonal partial, those inside the window full */
      {1, 4, 4, 512, 512, 128, FJ_BF16, NC, WINDOW, 64, 64, 1, 0},
      {2, 8, 2, 400, 300, 64, FJ_F16, NC, WINDOW, 256, 128, 1, 0},
      /* a mask that reads h: one list per query head, GQA 4:1 */
      {1, 8, 2, 257, 257, 64, FJ_BF16, NC, PER_HEAD, 64, 64, 8, 0},
      {1, 4, 1, 200, 300, 128, FJ_F16, BR, PER_HEAD, 128, 64, 4, 0},
      /* wide heads (the wgmma kernel's 64-key tiles on sm_90a) */
      {1, 4, 2, 300, 300, 192, FJ_BF16, TL, DOCS, 128, 64, 1, 0},
      {1, 4, 4, 260, 260, 256, FJ_F16, NC, PER_HEAD, 64, 128, 4, 0},
  };
  return run_bm_cases(cases, sizeof cases / sizeof cases[0]);
}

/* The deterministic mode under a block mask (the mma family: each key
 * tile's turn counts the earlier key tiles' visits of its query tile by
 * replaying their walks of the lists): right against the reference and the
 * same bits over reruns -- under causal masks (later key tiles first), a
 * mask every key tile of which adds into every query tile, GQA with a
 * list per query head, blocks of several tiles each way. */
#define DENSE "kv % 3 != 1"

int test_gpu_backward_block_mask_deterministic(void)
{
  static const bm_case cases[] = {
      {2, 4, 4, 500, 500, 64, FJ_BF16, BR, DOCS, 128, 128, 1, 1},
      {1, 8, 2, 700, 700, 128, FJ_F16, TL, DOCS, 64, 256, 1, 1},
      {1, 4, 4, 1024, 1024, 64, FJ_BF16, NC, DENSE, 128, 128, 1, 1},
      {1, 4, 2, 1100, 900, 128, FJ_BF16, NC, WINDOW, 64, 64, 1, 1},
      {1, 8, 2, 600, 600, 64, FJ_F16, BR, PER_HEAD, 64, 128, 8, 1},
      {1, 4, 2, 300, 300, 192, FJ_BF16, TL, DOCS, 128, 64, 1, 1},
  };
  return run_bm_cases(cases, sizeof cases / sizeof cases[0]);
}

/* One small case for compute-sanitizer: the builder's both directions and
 * the walk over a per-head mask with tails. */
int test_gpu_sanitize_backward_block_mask(void)
{
  static const bm_case cases[] = {
      {1, 4, 2, 100, 130, 64, FJ_BF16, TL, PER_HEAD, 64, 128, 4, 0},
  };
  return run_bm_cases(cases, 1);
}
