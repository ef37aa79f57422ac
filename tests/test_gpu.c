/*
 * test_gpu.c -- tests that need a GPU (label gpu; they skip, exit 77, where
 * there is none): the fragment-layout probe, and attention forward against
 * the float64 reference across the variant space: every axis value, the
 * cross product head_dim x dtype x causal x softmax x stages, sequence
 * lengths that are not multiples of the tiles, GQA, FP8 K/V, large logits,
 * rows that see no key, two threads on one context (their workspaces; a
 * compile beside launches).  Output and log-sum-exp are poisoned with NaN
 * before every run; inputs are fresh random normals.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "gpu_case.h"
#include "layout.h"
#include "util.h"
#include "runner.h"

/* ---- the resource report ---------------------------------------------------- */

/* The same kernel compiled in two fresh contexts (memory caches only) has
 * the same report, read from ptxas's lines in the log: NVRTC 12.9 and later
 * would serve the second compile from their own cache, with no ptxas lines
 * (registers read 0), were it not turned off (compile.c). */
int test_gpu_resources_fresh(void)
{
  fj_variant v;
  fj_variant_default(&v, 64, FJ_F16, FJ_CAUSAL_NONE);
  int regs[2] = {0, 0};
  for (int round = 0; round < 2; round++) {
    fj_ctx *ctx;
    int rc = fjt_gpu_ctx(NULL, &ctx);
    if (rc)
      return rc;
    fj_kernel *k;
    CHECK_OK(ctx, fj_kernel_get(ctx, &v, &k));
    fj_resources r;
    fj_kernel_resources(k, &r);
    const char *log = fj_kernel_log(k);
    printf("round %d: %s registers=%d barriers=%d compile_ms=%.1f\n", round,
           fj_kernel_name(k), r.registers, r.barriers, r.compile_ms);
    CHECK(r.cache == FJ_CACHE_MISS);
    CHECK(log && strstr(log, " registers"));
    CHECK(r.registers > 0);
    regs[round] = r.registers;
    fj_ctx_destroy(ctx);
  }
  CHECK(regs[0] == regs[1]);
  return 0;
}

/* ---- the layout probe ------------------------------------------------------ */

static void print_lut_rows(const fj_lut *l, int lanes)
{
  for (int lane = 0; lane < lanes; lane++) {
    printf("  %s lane %2d:", fj_frag_name(l->frag), lane);
    for (int s = 0; s < l->slots; s++)
      printf(" (%d,%d)", l->map[lane][s] / l->cols, l->map[lane][s] % l->cols);
    printf("\n");
  }
}

int test_gpu_lut_probe(void)
{
  const char *dir = fjt_tmpdir();
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(dir, &ctx);
  if (rc)
    return rc;
  fj_lut first[FJ_FRAG_COUNT + 1];
  char why[256];
  for (int f = 1; f <= FJ_FRAG_COUNT; f++) {
    fj_lut *l = &first[f];
    CHECK_OK(ctx, fj_layout_get(ctx, (fj_frag)f, l));
    CHECK(l->origin == FJ_LUT_PROBED && l->frag == (fj_frag)f);
    CHECK(fj__lut_validate(l, why, sizeof why) == 0);
    print_lut_rows(l, 4);
  }
  /* What the reference says the H200 showed; reported, not required. */
  for (int f = 1; f <= FJ_FRAG_COUNT; f++) {
    fj_lut ref;
    fj__lut_reference((fj_frag)f, &ref);
    int same = ref.slots == first[f].slots &&
               !memcmp(ref.map, first[f].map, sizeof ref.map);
    printf("%s matches the reference table: %s\n", fj_frag_name((fj_frag)f),
           same ? "yes" : "no");
  }
  fj_ctx_destroy(ctx);
  /* A second context on the same cache reads the probe from disk. */
  CHECK(fjt_gpu_ctx(dir, &ctx) == 0);
  for (int f = 1; f <= FJ_FRAG_COUNT; f++) {
    fj_lut l;
    CHECK_OK(ctx, fj_layout_get(ctx, (fj_frag)f, &l));
    CHECK(l.origin == FJ_LUT_CACHED);
    CHECK(memcmp(l.map, first[f].map, sizeof l.map) == 0);
  }
  fj_ctx_destroy(ctx);
  return 0;
}

/* The e4m3 kinds on an sm_90a device (skipped elsewhere): probed, valid,
 * and the very tables the reference gives a compile-only context (the
 * FP8 kernels' code generation is checked against those); a second
 * context reads them from the disk cache. */
int test_gpu_lut_e4m3(void)
{
  static const fj_frag kinds[] = {FJ_FRAG_WGMMA_ACC_E4M3, FJ_FRAG_WGMMA_A8};
  const char *dir = fjt_tmpdir();
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(dir, &ctx);
  if (rc)
    return rc;
  if (strcmp(fj_ctx_arch(ctx), "sm_90a") != 0) {
    printf("SKIP: the e4m3 wgmma kinds need sm_90a; this device is %s\n",
           fj_ctx_arch(ctx));
    fj_ctx_destroy(ctx);
    return FJT_SKIP;
  }
  char why[256];
  for (int pass = 0; pass < 2; pass++) {
    for (size_t i = 0; i < FJ_ARRAY_LEN(kinds); i++) {
      fj_lut l, ref;
      CHECK_OK(ctx, fj_layout_get(ctx, kinds[i], &l));
      CHECK(l.origin == (pass ? FJ_LUT_CACHED : FJ_LUT_PROBED));
      CHECK(fj__lut_validate(&l, why, sizeof why) == 0);
      fj__lut_reference(kinds[i], &ref);
      int same = ref.rows == l.rows && ref.cols == l.cols &&
                 ref.slots == l.slots && !memcmp(ref.map, l.map, sizeof l.map);
      if (!same) {
        printf("%s differs from the reference table:\n", fj_frag_name(kinds[i]));
        print_lut_rows(&l, 32);
      }
      CHECK(same);
    }
    fj_ctx_destroy(ctx);
    if (pass == 0)
      CHECK(fjt_gpu_ctx(dir, &ctx) == 0);
  }
  return 0;
}

/* ---- one attention case --------------------------------------------------------- */


typedef struct errors {
  double rel, lse_max;
  size_t nonfinite, empty_rows_nonzero;
} errors;

static double normal(uint64_t *s)
{
  double u[2];
  for (int i = 0; i < 2; i++) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    u[i] = ((double)(*s >> 11) + 0.5) / 9007199254740992.0;
  }
  return sqrt(-2 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

static void *random_tensor(fj_dtype dt, size_t n, float scale, uint64_t *seed)
{
  float *f = malloc(n * sizeof *f);
  void *out = malloc(n * 2);
  for (size_t i = 0; i < n; i++)
    f[i] = (float)normal(seed) * scale;
  fj_convert(dt, out, FJ_F32, f, n);
  free(f);
  return out;
}

static size_t span(const int64_t s[3], int b, int h, int seq, int d)
{
  return (size_t)((b - 1) * s[0] + (h - 1) * s[1] + (seq - 1) * s[2] + d);
}

static int upload(void **dev, const void *host, size_t bytes)
{
  return cudaMalloc(dev, bytes) != cudaSuccess ||
         cudaMemcpy(*dev, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess;
}

static int case_setup(gpu_case *c, uint64_t *seed)
{
  fj_problem *p = &c->p;
  fj_dtype kv = p->kv_dtype ? p->kv_dtype : p->dtype;
  /* V and O have head_dim_v columns (split head dims). */
  int dv = p->head_dim_v ? p->head_dim_v : p->head_dim;
  if (c->latent)
    memcpy(p->v_stride, p->k_stride, sizeof p->k_stride);
  c->nq = span(p->q_stride, p->batch, p->heads_q, p->seq_q, p->head_dim);
  c->nk = span(p->k_stride, p->batch, p->heads_kv, p->seq_kv, p->head_dim);
  c->nv = span(p->v_stride, p->batch, p->heads_kv, p->seq_kv, dv);
  size_t no = span(p->o_stride, p->batch, p->heads_q, p->seq_q, dv);
  c->nlse = (size_t)p->batch * (size_t)p->heads_q * (size_t)p->seq_q;
  c->qbytes = (no > c->nq ? no : c->nq) * 2;
  c->kvbytes = c->nk * (size_t)(kv == FJ_E4M3 ? 1 : 2);
  c->vbytes = c->nv * (size_t)(kv == FJ_E4M3 ? 1 : 2);
  /* FP8 attention (dtype e4m3): Q like FP8 K/V below; O is bf16. */
  int q8 = p->dtype == FJ_E4M3;
  c->q = random_tensor(p->dtype, c->nq, (c->input_scale ? c->input_scale : 1) * (q8 ? 40.f : 1.f),
                       seed);
  /* FP8 K/V: values spread over the format's range, with per-head scales
   * that bring them back to unit size. */
  c->k = random_tensor(kv, c->nk, kv == FJ_E4M3 ? 40.f : 1.f, seed);
  c->v = c->latent ? NULL : random_tensor(kv, c->nv, kv == FJ_E4M3 ? 40.f : 1.f, seed);
  c->o = malloc(c->qbytes);
  c->lse = malloc(c->nlse * sizeof(float));
  int bad = upload(&c->dq, c->q, c->nq * (q8 ? 1 : 2)) || upload(&c->dk, c->k, c->kvbytes) ||
            (!c->latent && upload(&c->dv, c->v, c->vbytes)) ||
            cudaMalloc(&c->dout, c->qbytes) ||
            cudaMalloc((void **)&c->dlse, c->nlse * sizeof(float));
  if (kv == FJ_E4M3) {
    size_t ns = (size_t)p->batch * (size_t)p->heads_kv;
    c->ks = malloc(ns * sizeof(float));
    c->vs = malloc(ns * sizeof(float));
    for (size_t i = 0; i < ns; i++) {
      c->ks[i] = (float)(0.02 + 0.01 * (double)(i % 3));
      c->vs[i] = (float)(0.03 - 0.005 * (double)(i % 4));
    }
    bad = bad || upload(&c->dks, c->ks, ns * sizeof(float)) ||
          upload(&c->dvs, c->vs, ns * sizeof(float));
    p->k_scale = c->dks;
    p->v_scale = c->dvs;
    if (q8) {
      c->qs = malloc(ns * sizeof(float));
      for (size_t i = 0; i < ns; i++)
        c->qs[i] = (float)(0.025 + 0.005 * (double)(i % 5));
      bad = bad || upload(&c->dqs, c->qs, ns * sizeof(float));
      p->q_scale = c->dqs;
    }
  }
  /* Poison: 0xff bytes are NaN in f16, bf16 and float32. */
  return bad || cudaMemset(c->dout, 0xff, c->qbytes) ||
         cudaMemset(c->dlse, 0xff, c->nlse * sizeof(float));
}

static void case_free(gpu_case *c)
{
  void *dev[] = {c->dq, c->dk, c->dv, c->dout, c->dlse, c->dks, c->dvs, c->dqs};
  void *host[] = {c->q, c->k, c->v, c->o, c->lse, c->ks, c->vs, c->qs};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) {
    cudaFree(dev[i]);
    free(host[i]);
  }
  memset(c, 0, sizeof *c);
}

/* ---- the reference, on several threads ----------------------------------------------- */

typedef struct ref_job {
  const gpu_case *c;
  int r0, r1;
  double *out, *lse;
  fj_status st;
} ref_job;

static void *ref_thread(void *arg)
{
  ref_job *j = arg;
  fj_problem p = j->c->p;
  if (j->c->host_mods)
    p.mods = j->c->host_mods;  /* tensor parameters in host memory */
  if (p.dtype == FJ_E4M3)
    p.q_scale = j->c->qs;      /* host memory for the reference */
  j->st = fj_reference_fwd(&p, j->c->q, j->c->k, j->c->latent ? j->c->k : j->c->v, j->c->ks,
                           j->c->vs, j->r0, j->r1, j->out, j->lse);
  return NULL;
}

static float out_at(const gpu_case *c, int b, int h, int row, int x)
{
  const fj_problem *p = &c->p;
  size_t at = (size_t)(b * p->o_stride[0] + h * p->o_stride[1] +
                       row * p->o_stride[2] + x);
  float f;
  fj_convert(FJ_F32, &f, p->dtype == FJ_E4M3 ? FJ_BF16 : p->dtype, (const uint16_t *)c->o + at, 1);
  return f;
}

/* Compares rows [r0, r1) of O and LSE with their reference. */
static void compare(const gpu_case *c, const ref_job *j, errors *e,
                    double *d2, double *r2)
{
  const fj_problem *p = &c->p;
  int rows = j->r1 - j->r0, dim = p->head_dim_v ? p->head_dim_v : p->head_dim;
  for (int b = 0; b < p->batch; b++)
    for (int h = 0; h < p->heads_q; h++)
      for (int r = 0; r < rows; r++) {
        size_t ri = (size_t)(b * p->heads_q + h) * (size_t)rows + (size_t)r;
        double want_lse = j->lse[ri];
        int empty = isinf(want_lse) && want_lse < 0;
        for (int x = 0; x < dim; x++) {
          double got = out_at(c, b, h, j->r0 + r, x);
          double want = j->out[ri * (size_t)dim + (size_t)x];
          e->nonfinite += isfinite(got) ? 0u : 1u;
          e->empty_rows_nonzero += empty && got != 0.0 ? 1u : 0u;
          *d2 += (got - want) * (got - want);
          *r2 += want * want;
        }
        double got = c->lse[(size_t)(b * p->heads_q + h) * (size_t)p->seq_q +
                            (size_t)(j->r0 + r)];
        if (empty)
          e->nonfinite += isinf(got) && got < 0 ? 0u : 1u;
        else if (!isfinite(got))
          e->nonfinite++;
        else
          e->lse_max = fmax(e->lse_max, fabs(got - want_lse));
      }
}

enum { REF_THREADS = 16 };

static int check_case(const gpu_case *c, errors *e)
{
  const fj_problem *p = &c->p;
  ref_job jobs[REF_THREADS];
  pthread_t t[REF_THREADS];
  int parts = p->seq_q < REF_THREADS ? p->seq_q : REF_THREADS;
  size_t per = (size_t)p->batch * (size_t)p->heads_q;
  for (int i = 0; i < parts; i++) {
    jobs[i].c = c;
    jobs[i].r0 = p->seq_q * i / parts;
    jobs[i].r1 = p->seq_q * (i + 1) / parts;
    size_t rows = per * (size_t)(jobs[i].r1 - jobs[i].r0);
    jobs[i].out = malloc(rows * (size_t)(p->head_dim_v ? p->head_dim_v : p->head_dim) *
                         sizeof(double));
    jobs[i].lse = malloc(rows * sizeof(double));
    pthread_create(&t[i], NULL, ref_thread, &jobs[i]);
  }
  double d2 = 0, r2 = 0;
  int bad = 0;
  memset(e, 0, sizeof *e);
  for (int i = 0; i < parts; i++) {
    pthread_join(t[i], NULL);
    bad |= jobs[i].st != FJ_OK;
    compare(c, &jobs[i], e, &d2, &r2);
    free(jobs[i].out);
    free(jobs[i].lse);
  }
  e->rel = r2 > 0 ? sqrt(d2 / r2) : sqrt(d2);
  return bad;
}

/* Launches a case with a variant (NULL: the library's choice) and copies O
 * and the log-sum-exp back. */
static int launch_case(fj_ctx *ctx, gpu_case *c, const fj_variant *v,
                       void *stream, const char *label)
{
  cudaMemset(c->dout, 0xff, c->qbytes);
  cudaMemset(c->dlse, 0xff, c->nlse * sizeof(float));
  cudaStream_t cs = NULL;
  cudaGraph_t g = NULL;
  if (c->capture && (cudaDeviceSynchronize() != cudaSuccess ||
                     cudaStreamCreate(&cs) != cudaSuccess ||
                     cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal) != cudaSuccess)) {
    fprintf(stderr, "%s: cannot begin a capture\n", label);
    return 1;
  }
  if (c->capture)
    stream = cs;
  void *dv = c->latent ? c->dk : c->dv;
  fj_status st = v ? fj_attention_fwd_variant(ctx, &c->p, v, c->dq, c->dk,
                                              dv, c->dout, c->dlse, stream)
                   : fj_attention_fwd(ctx, &c->p, c->dq, c->dk, dv,
                                      c->dout, c->dlse, stream);
  if (c->capture) {
    cudaGraphExec_t ge;
    int ok = cudaStreamEndCapture(cs, &g) == cudaSuccess && st == FJ_OK &&
             cudaGraphInstantiate(&ge, g, 0) == cudaSuccess;
    if (ok) {
      ok = cudaGraphLaunch(ge, cs) == cudaSuccess;
      cudaStreamSynchronize(cs);
      cudaGraphExecDestroy(ge);
    }
    cudaGraphDestroy(g);
    if (!ok && st == FJ_OK) {
      fprintf(stderr, "%s: the captured graph did not run\n", label);
      cudaStreamDestroy(cs);
      return 1;
    }
  }
  cudaError_t ce = cudaStreamSynchronize((cudaStream_t)stream);
  if (cs)
    cudaStreamDestroy(cs);
  if (ce == cudaSuccess)
    ce = cudaDeviceSynchronize();
  if (st != FJ_OK || ce != cudaSuccess) {
    fprintf(stderr, "%s: %s %s\n", label, fj_errmsg(ctx), cudaGetErrorString(ce));
    return 1;
  }
  cudaMemcpy(c->o, c->dout, c->qbytes, cudaMemcpyDeviceToHost);
  cudaMemcpy(c->lse, c->dlse, c->nlse * sizeof(float), cudaMemcpyDeviceToHost);
  return 0;
}

/* The largest relative error per axis value, for the summary. */
static double worst[64];
static const char *worst_name[64];
static int nworst;
static pthread_mutex_t worst_lock = PTHREAD_MUTEX_INITIALIZER;  /* cases on threads */

static void note_worst(const char *axis, double rel)
{
  pthread_mutex_lock(&worst_lock);
  int i = 0;
  while (i < nworst && strcmp(worst_name[i], axis))
    i++;
  if (i < nworst)
    worst[i] = fmax(worst[i], rel);
  else if (nworst < 64) {
    worst_name[nworst] = axis;
    worst[nworst++] = rel;
  }
  pthread_mutex_unlock(&worst_lock);
}

static void print_worst(void)
{
  for (int i = 0; i < nworst; i++)
    printf("max rel_err %-22s %.2e\n", worst_name[i], worst[i]);
  nworst = 0;
}

static int verdict(const gpu_case *c, const errors *e, const char *label)
{
  fj_dtype kv = c->p.kv_dtype ? c->p.kv_dtype : c->p.dtype;
  /* FP8 attention rounds P to e4m3 (3 mantissa bits) as well. */
  double limit = c->p.dtype == FJ_E4M3 ? 5e-2 : kv == FJ_E4M3 ? 3e-2 : 1e-2;
  int bad = e->nonfinite != 0 || e->empty_rows_nonzero != 0 ||
            !(e->rel < limit) || !(e->lse_max < 1e-2);
  printf("%-76s rel_err=%.2e lse_err=%.1e nonfinite=%zu %s\n", label, e->rel,
         e->lse_max, e->nonfinite + e->empty_rows_nonzero, bad ? "FAIL" : "ok");
  return bad;
}

/* With o_gaps: the elements of O's buffer that no row of O holds (the gaps
 * between rows) still hold the poison, 0xffff; 1 (printed) where a store
 * reached one. */
static int gaps_written(const gpu_case *c, const char *label)
{
  const fj_problem *p = &c->p;
  size_t n = c->qbytes / 2, written = 0, first = 0;
  int dv = p->head_dim_v ? p->head_dim_v : p->head_dim;
  unsigned char *in_o = calloc(n, 1);
  if (!in_o)
    return 1;
  for (int b = 0; b < p->batch; b++)
    for (int h = 0; h < p->heads_q; h++)
      for (int i = 0; i < p->seq_q; i++)
        memset(in_o + (size_t)(b * p->o_stride[0] + h * p->o_stride[1] +
                               i * p->o_stride[2]),
               1, (size_t)dv);
  const uint16_t *o = c->o;
  for (size_t e = 0; e < n; e++)
    if (!in_o[e] && o[e] != 0xffff && written++ == 0)
      first = e;
  free(in_o);
  if (written)
    fprintf(stderr, "%s: %zu elements between O's rows written (the first at "
            "element %zu: 0x%04x); they must keep the poison 0xffff\n",
            label, written, first, o[first]);
  return written != 0;
}

/* Runs one case with a variant (NULL: the library's choice) and checks it
 * against the reference; the case's inputs are made here and freed. */
static int run_case(fj_ctx *ctx, gpu_case *c, const fj_variant *v,
                    void *stream, uint64_t *seed, const char *label,
                    const char *axis)
{
  errors e;
  if (case_setup(c, seed)) {
    fprintf(stderr, "%s: CUDA setup failed\n", label);
    case_free(c);
    return 1;
  }
  int bad = launch_case(ctx, c, v, stream, label) || check_case(c, &e) ||
            (c->o_gaps && gaps_written(c, label));
  if (!bad) {
    bad = verdict(c, &e, label);
    note_worst(axis, e.rel);
  }
  case_free(c);
  return bad;
}

static void variant_label(char *buf, size_t size, const fj_variant *v,
                          const fj_problem *p, const char *extra)
{
  char name[128];
  fj_variant_name(v, name, sizeof name);
  snprintf(buf, size, "%s sq=%d skv=%d h=%d/%d%s", name, p->seq_q, p->seq_kv,
           p->heads_q, p->heads_kv, extra);
}

/* Compiles a set of variants up front, 16 compiler processes at once. */
static int prepare(fj_ctx *ctx, const fj_variant *vs, size_t n)
{
  fj_prepare_opts o = {16, NULL, NULL};
  double t0 = fj__now_ms();
  fj_status st = fj_kernel_prepare(ctx, vs, n, &o, NULL);
  printf("prepared %zu variants in %.1f s\n", n, (fj__now_ms() - t0) / 1e3);
  if (st != FJ_OK)
    fprintf(stderr, "%s\n", fj_errmsg(ctx));
  return st != FJ_OK;
}

/* ---- the vertical slice's matrix: dtype x head dim x mask x layout x seq ---------- */

static const int seq_cases[][2] = {{1, 1},     {17, 17},  {100, 100},
                                   {1000, 1000}, {17, 100}, {100, 17},
                                   {1000, 777}};

int test_gpu_attention_matrix(void)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(fjt_tmpdir(), &ctx);
  if (rc)
    return rc;
  static const fj_dtype dtypes[] = {FJ_F16, FJ_BF16};
  static const int dims[] = {64, 128};
  static const fj_causal masks[] = {FJ_CAUSAL_NONE, FJ_CAUSAL_TOP_LEFT,
                                    FJ_CAUSAL_BOTTOM_RIGHT};
  uint64_t seed = 12345;
  int failed = 0, cases = 0;
  for (size_t a = 0; a < 2; a++)
    for (size_t d = 0; d < 2; d++)
      for (size_t m = 0; m < 3; m++)
        for (int order = 0; order < 2; order++)
          for (size_t s = 0; s < sizeof seq_cases / sizeof seq_cases[0]; s++) {
            gpu_case c;
            memset(&c, 0, sizeof c);
            int sq = seq_cases[s][0], skv = seq_cases[s][1];
            fj_problem_init(&c.p, 2, 4, 2, sq, skv, dims[d], dtypes[a],
                            (fj_order)order);
            c.p.causal = masks[m];
            fj_variant v;
            fj_variant_default(&v, dims[d], dtypes[a], masks[m]);
            char label[200];
            variant_label(label, sizeof label, &v, &c.p, order ? " bshd" : " bhsd");
            failed += run_case(ctx, &c, &v, NULL, &seed, label, "default");
            cases++;
          }
  printf("%d of %d cases passed\n", cases - failed, cases);
  print_worst();
  fj_ctx_destroy(ctx);
  return failed != 0;
}

/* The library's own choice, on a stream of the caller's, with GQA 4:1. */
int test_gpu_attention_auto(void)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(fjt_tmpdir(), &ctx);
  if (rc)
    return rc;
  uint64_t seed = 777;
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream) == cudaSuccess);
  gpu_case c;
  memset(&c, 0, sizeof c);
  fj_problem_init(&c.p, 2, 8, 2, 512, 512, 64, FJ_F16, FJ_BSHD);
  c.p.scale = 0.3f;
  int failed = run_case(ctx, &c, NULL, stream, &seed,
                        "auto (2,8/2,512,64) f16 bshd scale=0.3, own stream", "auto");
  memset(&c, 0, sizeof c);
  fj_problem_init(&c.p, 1, 4, 4, 333, 1025, 128, FJ_BF16, FJ_BHSD);
  c.p.causal = FJ_CAUSAL_BOTTOM_RIGHT;
  failed += run_case(ctx, &c, NULL, stream, &seed,
                     "auto (1,4,333/1025,128) bf16 bottom-right, own stream", "auto");
  cudaStreamDestroy(stream);
  fj_ctx_destroy(ctx);
  return failed != 0;
}

/* ---- the kernel family: the cross product ------------------------------------------- */

static const int all_dims[] = {32, 64, 96, 128, 160, 192, 256};
static const fj_causal all_masks[] = {FJ_CAUSAL_NONE, FJ_CAUSAL_TOP_LEFT,
                                      FJ_CAUSAL_BOTTOM_RIGHT};

/* The default tiles for a head dim and softmax path, with the given stages. */
static void family_variant(fj_variant *v, int d, fj_dtype dt, fj_causal m,
                           fj_softmax sm, int stages)
{
  fj_variant_default(v, d, dt, m);
  v->softmax = sm;
  v->stages = stages;
  if (sm == FJ_SOFTMAX_REGS) {
    v->warps = 4;
    v->tile_m = 64;
    v->tile_n = d > 128 ? 32 : 64;
  } else {
    v->tile_m = 64;
    v->tile_n = d > 128 ? 32 : 64;
  }
}

static int cross_index(size_t i, fj_variant *v)
{
  /* i over dims(7) x dtypes(2) x masks(3) x softmax(2) x stages(3) */
  size_t st = i % 3, sm = (i / 3) % 2, m = (i / 6) % 3, dt = (i / 18) % 2,
         d = i / 36;
  if (d >= 7)
    return 0;
  family_variant(v, all_dims[d], dt ? FJ_BF16 : FJ_F16, all_masks[m],
                 sm ? FJ_SOFTMAX_REGS : FJ_SOFTMAX_SMEM, (int)st + 1);
  return 1;
}

/* Compares two runs' outputs on one case: max |a - b| / max |a|. */
static double output_diff(const gpu_case *c, const void *other)
{
  double diff = 0, top = 0;
  for (size_t i = 0; i < c->nq; i++) {
    float a, b;
    fj_convert(FJ_F32, &a, c->p.dtype, (const uint16_t *)c->o + i, 1);
    fj_convert(FJ_F32, &b, c->p.dtype, (const uint16_t *)other + i, 1);
    if (isnan(a) || isnan(b))
      continue;
    diff = fmax(diff, fabs((double)a - (double)b));
    top = fmax(top, fabs((double)a));
  }
  return top > 0 ? diff / top : diff;
}

/* smem and regs on the same inputs (two shapes), each checked against the
 * reference and against each other. */
static int cross_pair(fj_ctx *ctx, const fj_variant *smem, const fj_variant *regs,
                      uint64_t *seed, double *worst_pair)
{
  static const int shapes[2][4] = {{65, 127, 2, 1}, {127, 65, 4, 2}};
  int failed = 0;
  for (int s = 0; s < 2; s++) {
    gpu_case c;
    memset(&c, 0, sizeof c);
    fj_problem_init(&c.p, 1, shapes[s][2], shapes[s][3], shapes[s][0],
                    shapes[s][1], smem->head_dim, smem->dtype, (fj_order)s);
    c.p.causal = smem->causal;
    if (case_setup(&c, seed)) {
      case_free(&c);
      return 1;
    }
    errors e;
    char label[200];
    void *first = malloc(c.qbytes);
    for (int path = 0; path < 2; path++) {
      const fj_variant *v = path ? regs : smem;
      variant_label(label, sizeof label, v, &c.p, s ? " bshd" : " bhsd");
      int bad = launch_case(ctx, &c, v, NULL, label) || check_case(&c, &e);
      bad = bad || verdict(&c, &e, label);
      note_worst(path ? "softmax=regs" : "softmax=smem", e.rel);
      failed += bad;
      if (path == 0)
        memcpy(first, c.o, c.qbytes);
    }
    double d = output_diff(&c, first);
    *worst_pair = fmax(*worst_pair, d);
    if (!(d < 1e-2)) {
      printf("regs and smem disagree: max diff %.2e of max |O|\n", d);
      failed++;
    }
    free(first);
    case_free(&c);
  }
  return failed;
}

int test_gpu_family_cross(void)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(fjt_tmpdir(), &ctx);
  if (rc)
    return rc;
  fj_variant vs[252];
  size_t n = 0;
  for (size_t i = 0; cross_index(i, &vs[n]); i++)
    n++;
  CHECK(n == 252);
  CHECK(prepare(ctx, vs, n) == 0);
  uint64_t seed = 4242;
  int failed = 0;
  double worst_pair = 0;
  /* Groups of six: smem with stages 1-3, then regs with stages 1-3. */
  for (size_t g = 0; g < n; g += 6)
    for (size_t st = 0; st < 3; st++)
      failed += cross_pair(ctx, &vs[g + st], &vs[g + 3 + st], &seed, &worst_pair);
  printf("cross product: %zu variants x 2 shapes, %d failures; regs vs smem "
         "max diff %.2e of max |O|\n",
         n, failed, worst_pair);
  print_worst();
  fj_ctx_destroy(ctx);
  return failed != 0;
}

/* ---- every axis value at least once ---------------------------------------------------- */

typedef struct axis_case {
  const char *axis;
  int d, tile_m, tile_n, warps, stages;
  fj_swizzle swz;
  fj_softmax sm;
  fj_dtype dt, kv;
  fj_causal m;
  int b, hq, hkv, sq, skv;
  float input_scale;
} axis_case;

static const axis_case axis_cases[] = {
    {"swizzle=none", 64, 64, 64, 4, 2, FJ_SWIZZLE_NONE, FJ_SOFTMAX_SMEM, FJ_F16, 0, FJ_CAUSAL_NONE, 1, 2, 2, 130, 200, 0},
    {"swizzle=none", 128, 64, 64, 4, 3, FJ_SWIZZLE_NONE, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_TOP_LEFT, 1, 2, 2, 200, 130, 0},
    {"swizzle=pad", 96, 64, 32, 4, 1, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 1, 100, 300, 0},
    {"swizzle=xor", 64, 64, 64, 4, 1, FJ_SWIZZLE_XOR, FJ_SOFTMAX_SMEM, FJ_BF16, 0, FJ_CAUSAL_NONE, 2, 2, 1, 129, 129, 0},
    {"swizzle=xor", 128, 64, 64, 4, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_TOP_LEFT, 1, 4, 2, 257, 257, 0},
    {"swizzle=xor", 96, 64, 32, 4, 3, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_NONE, 1, 2, 2, 70, 333, 0},
    {"swizzle=xor", 32, 64, 64, 4, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_SMEM, FJ_F16, 0, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 2, 300, 100, 0},
    {"swizzle=xor", 160, 64, 32, 4, 1, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_NONE, 1, 2, 2, 90, 90, 0},
    {"swizzle=xor", 192, 64, 32, 4, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_SMEM, FJ_BF16, 0, FJ_CAUSAL_TOP_LEFT, 1, 2, 2, 90, 90, 0},
    {"warps=8", 64, 128, 64, 8, 2, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_TOP_LEFT, 1, 2, 2, 300, 300, 0},
    {"warps=8", 128, 64, 64, 8, 1, FJ_SWIZZLE_PAD, FJ_SOFTMAX_SMEM, FJ_BF16, 0, FJ_CAUSAL_NONE, 1, 2, 2, 200, 200, 0},
    {"tile_n=16", 64, 64, 16, 4, 2, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_NONE, 1, 2, 2, 100, 100, 0},
    {"tile_n=16", 64, 32, 16, 4, 1, FJ_SWIZZLE_PAD, FJ_SOFTMAX_SMEM, FJ_F16, 0, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 2, 50, 70, 0},
    {"tile_n=128", 64, 64, 128, 4, 2, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_TOP_LEFT, 1, 2, 2, 300, 300, 0},
    {"tile_n=48", 64, 64, 48, 4, 1, FJ_SWIZZLE_PAD, FJ_SOFTMAX_SMEM, FJ_F16, 0, FJ_CAUSAL_NONE, 1, 2, 2, 100, 100, 0},
    {"tile_m=16", 64, 16, 64, 4, 2, FJ_SWIZZLE_PAD, FJ_SOFTMAX_SMEM, FJ_F16, 0, FJ_CAUSAL_TOP_LEFT, 1, 2, 2, 100, 100, 0},
    {"tile_m=128", 64, 128, 32, 4, 3, FJ_SWIZZLE_PAD, FJ_SOFTMAX_SMEM, FJ_BF16, 0, FJ_CAUSAL_NONE, 1, 2, 2, 300, 300, 0},
    {"gqa=8:1", 128, 64, 64, 4, 2, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_TOP_LEFT, 2, 16, 2, 200, 200, 0},
    {"gqa=8:1", 64, 64, 64, 4, 1, FJ_SWIZZLE_PAD, FJ_SOFTMAX_SMEM, FJ_BF16, 0, FJ_CAUSAL_NONE, 1, 8, 1, 100, 150, 0},
    {"kv=e4m3", 64, 64, 64, 4, 1, FJ_SWIZZLE_PAD, FJ_SOFTMAX_SMEM, FJ_F16, FJ_E4M3, FJ_CAUSAL_NONE, 2, 2, 2, 200, 200, 0},
    {"kv=e4m3", 128, 64, 64, 4, 1, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_BF16, FJ_E4M3, FJ_CAUSAL_TOP_LEFT, 2, 4, 2, 200, 300, 0},
    {"kv=e4m3", 256, 64, 32, 4, 1, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, FJ_E4M3, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 2, 100, 100, 0},
    {"kv=e4m3", 96, 64, 32, 4, 1, FJ_SWIZZLE_NONE, FJ_SOFTMAX_SMEM, FJ_BF16, FJ_E4M3, FJ_CAUSAL_NONE, 1, 2, 1, 65, 65, 0},
    {"inputs x30", 64, 64, 64, 4, 2, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_NONE, 1, 2, 2, 300, 300, 30},
    {"inputs x30", 128, 64, 64, 4, 1, FJ_SWIZZLE_PAD, FJ_SOFTMAX_SMEM, FJ_BF16, 0, FJ_CAUSAL_TOP_LEFT, 1, 2, 2, 300, 300, 30},
    {"inputs x30", 256, 64, 32, 4, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 2, 200, 250, 30},
    {"no visible key", 64, 64, 64, 4, 2, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 2, 300, 40, 0},
    {"no visible key", 128, 64, 32, 4, 1, FJ_SWIZZLE_PAD, FJ_SOFTMAX_SMEM, FJ_BF16, 0, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 2, 250, 1, 0},
};

static void axis_variant(const axis_case *a, fj_mma mma, fj_variant *v)
{
  fj_variant_default(v, a->d, a->dt, a->m);
  v->mma = mma;
  v->tile_m = a->tile_m;
  v->tile_n = a->tile_n;
  v->warps = a->warps;
  v->stages = a->stages;
  v->swizzle = a->swz;
  v->softmax = a->sm;
  v->kv_dtype = a->kv == a->dt ? 0 : a->kv;
}

/* Every case of a table with one family, each checked against the reference. */
static int run_axes(const axis_case *cases, size_t n, fj_mma mma)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(fjt_tmpdir(), &ctx);
  if (rc)
    return rc;
  fj_variant vs[64];
  CHECK(n <= 64);
  for (size_t i = 0; i < n; i++)
    axis_variant(&cases[i], mma, &vs[i]);
  CHECK(prepare(ctx, vs, n) == 0);
  uint64_t seed = 99;
  int failed = 0;
  for (size_t i = 0; i < n; i++) {
    const axis_case *a = &cases[i];
    gpu_case c;
    memset(&c, 0, sizeof c);
    fj_problem_init(&c.p, a->b, a->hq, a->hkv, a->sq, a->skv, a->d, a->dt,
                    (fj_order)(i % 2));
    c.p.causal = a->m;
    c.p.kv_dtype = a->kv;
    c.input_scale = a->input_scale;
    char label[200];
    variant_label(label, sizeof label, &vs[i], &c.p, i % 2 ? " bshd" : " bhsd");
    failed += run_case(ctx, &c, &vs[i], NULL, &seed, label, a->axis);
  }
  print_worst();
  fj_ctx_destroy(ctx);
  return failed != 0;
}

int test_gpu_family_axes(void)
{
  return run_axes(axis_cases, sizeof axis_cases / sizeof axis_cases[0],
                  FJ_MMA_WMMA);
}

/* ---- the mma family: every axis value, and its cross product ---------------------------- */

/* tile_m / warps: 16 rows per warp (m64 w4, m128 w8) or 32 (m128 w4); with
 * 3 stages the family pipelines S(t + 1) beside the softmax where the
 * registers allow (m128 w8 at head_dim <= 128 here). */
static const axis_case mma_cases[] = {
    {"mma swizzle=none", 64, 64, 64, 4, 2, FJ_SWIZZLE_NONE, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_NONE, 1, 2, 2, 130, 200, 0},
    {"mma swizzle=pad", 96, 128, 32, 8, 3, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 1, 100, 300, 0},
    {"mma swizzle=xor", 128, 128, 64, 8, 3, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_TOP_LEFT, 1, 4, 2, 257, 257, 0},
    {"mma swizzle=xor", 32, 128, 128, 4, 1, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_NONE, 2, 2, 1, 129, 129, 0},
    {"mma swizzle=xor", 160, 64, 32, 4, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_NONE, 1, 2, 2, 90, 90, 0},
    {"mma 32 rows/warp", 64, 128, 128, 4, 2, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_TOP_LEFT, 1, 2, 2, 300, 300, 0},
    {"mma 32 rows/warp", 128, 128, 64, 4, 3, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_NONE, 1, 2, 2, 200, 333, 0},
    {"mma 32 rows/warp", 64, 128, 64, 4, 3, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 2, 333, 200, 0},
    {"mma pipelined", 64, 128, 128, 8, 3, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_TOP_LEFT, 2, 2, 2, 1000, 1000, 0},
    {"mma pipelined", 256, 128, 32, 8, 3, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 2, 300, 500, 0},
    {"mma pipelined", 128, 128, 64, 8, 3, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_NONE, 1, 2, 2, 1, 65, 0},
    {"mma tile_n=16", 64, 64, 16, 4, 2, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_NONE, 1, 2, 2, 100, 100, 0},
    {"mma tile_n=48", 192, 64, 48, 4, 1, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_TOP_LEFT, 1, 2, 2, 100, 100, 0},
    {"mma gqa=8:1", 128, 128, 64, 8, 2, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_TOP_LEFT, 2, 16, 2, 200, 200, 0},
    {"mma gqa=8:1", 64, 64, 64, 4, 3, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_NONE, 1, 8, 1, 100, 150, 0},
    {"mma kv=e4m3", 64, 64, 64, 4, 1, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_F16, FJ_E4M3, FJ_CAUSAL_NONE, 2, 2, 2, 200, 200, 0},
    {"mma kv=e4m3", 256, 64, 32, 4, 1, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_BF16, FJ_E4M3, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 2, 100, 100, 0},
    {"mma inputs x30", 64, 128, 64, 8, 3, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_NONE, 1, 2, 2, 300, 300, 30},
    {"mma inputs x30", 256, 64, 32, 4, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 2, 200, 250, 30},
    {"mma no visible key", 64, 128, 64, 8, 3, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 2, 300, 40, 0},
    {"mma no visible key", 128, 64, 32, 4, 1, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 2, 250, 1, 0},
};

int test_gpu_mma_axes(void)
{
  return run_axes(mma_cases, sizeof mma_cases / sizeof mma_cases[0], FJ_MMA_SYNC);
}

/* FP8 K/V with 16-bit queries on the mma family's cp.async ring
 * (templates/tile_fp8.cuh): each swizzle, 2 and 3 stages, the software
 * pipeline (16-row warps) and the plain ring (32-row warps), warps that
 * split the keys (tile_m 16), tails, GQA, both causal alignments and rows
 * that see no key. */
static const axis_case fp8_ring_cases[] = {
    {"fp8 ring xor", 64, 64, 64, 4, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, FJ_E4M3, FJ_CAUSAL_NONE, 2, 2, 2, 200, 200, 0},
    {"fp8 ring pipelined", 128, 128, 64, 8, 3, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_BF16, FJ_E4M3, FJ_CAUSAL_TOP_LEFT, 1, 4, 2, 257, 300, 0},
    {"fp8 ring plain", 128, 128, 64, 4, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_BF16, FJ_E4M3, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 2, 300, 333, 0},
    {"fp8 ring pad", 256, 64, 32, 4, 3, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_BF16, FJ_E4M3, FJ_CAUSAL_NONE, 1, 2, 2, 100, 170, 0},
    {"fp8 ring none", 96, 64, 32, 4, 2, FJ_SWIZZLE_NONE, FJ_SOFTMAX_REGS, FJ_F16, FJ_E4M3, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 1, 65, 65, 0},
    {"fp8 ring warps split keys", 128, 16, 64, 4, 3, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_BF16, FJ_E4M3, FJ_CAUSAL_NONE, 2, 8, 2, 5, 1000, 0},
    {"fp8 ring warps split keys", 64, 16, 128, 4, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, FJ_E4M3, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 2, 16, 333, 0},
    {"fp8 ring gqa=8:1", 64, 128, 128, 8, 3, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, FJ_E4M3, FJ_CAUSAL_TOP_LEFT, 2, 16, 2, 200, 200, 0},
    {"fp8 ring inputs x30", 128, 64, 64, 4, 3, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_BF16, FJ_E4M3, FJ_CAUSAL_NONE, 1, 2, 2, 300, 300, 30},
    {"fp8 ring no visible key", 64, 128, 64, 8, 3, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_F16, FJ_E4M3, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 2, 300, 40, 0},
    {"fp8 ring one key", 128, 64, 64, 4, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_BF16, FJ_E4M3, FJ_CAUSAL_NONE, 1, 2, 2, 70, 1, 0},
    /* Warps that split the keys read the FP8 ring itself (attention_mma.cu's
     * REGS): an odd number of 16-dim blocks (the last by ldmatrix.x2), Q
     * from shared memory each tile (d256), the ring's swizzle for 2 chunks
     * a row (d32) and for 6 (d96: the plain one). */
    {"fp8 ring split keys d64", 64, 16, 128, 4, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, FJ_E4M3, FJ_CAUSAL_BOTTOM_RIGHT, 2, 4, 2, 3, 901, 0},
    {"fp8 ring split keys d80", 80, 16, 64, 4, 3, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_BF16, FJ_E4M3, FJ_CAUSAL_NONE, 1, 8, 2, 5, 777, 0},
    {"fp8 ring split keys d256", 256, 16, 64, 4, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, FJ_E4M3, FJ_CAUSAL_BOTTOM_RIGHT, 1, 4, 2, 16, 300, 0},
    {"fp8 ring split keys d32", 32, 16, 64, 4, 3, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_BF16, FJ_E4M3, FJ_CAUSAL_NONE, 2, 4, 4, 9, 515, 30},
    {"fp8 ring split keys d96", 96, 16, 64, 4, 3, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, FJ_E4M3, FJ_CAUSAL_TOP_LEFT, 1, 2, 1, 16, 200, 0},
};

static int serving_case_kv(fj_ctx *ctx, int b, int hq, int hkv, int sq, int skv,
                           int d, fj_dtype dt, fj_dtype kv, fj_causal m, int splits,
                           fj_order order, uint64_t *seed, const char *axis);

/* One descale a tensor (fj_problem.scale_layout FJ_SCALE_PER_TENSOR) with
 * the library's choice: a decode (split-KV, GQA packing) and a prefill.
 * case_setup's descales differ by (batch, KV head), so a kernel that read
 * any but the first disagrees with the reference, which reads the first.
 * dt: Q's dtype (FJ_E4M3: FP8 attention, else FP8 K/V). */
static int fp8_per_tensor(fj_ctx *ctx, fj_dtype dt, uint64_t *seed)
{
  static const int cases[][6] = {{2, 32, 8, 1, 4096, 128}, {2, 8, 2, 300, 513, 128}};
  int failed = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const int *s = cases[i];
    gpu_case c;
    memset(&c, 0, sizeof c);
    fj_problem_init(&c.p, s[0], s[1], s[2], s[3], s[4], s[5], dt, (fj_order)i);
    c.p.kv_dtype = FJ_E4M3;
    c.p.causal = i ? FJ_CAUSAL_BOTTOM_RIGHT : FJ_CAUSAL_NONE;
    c.p.scale_layout = FJ_SCALE_PER_TENSOR;
    char label[160];
    snprintf(label, sizeof label, "(%d,%d/%d,%d/%d,%d) %s scales per tensor", s[0], s[1], s[2],
             s[3], s[4], s[5], fj_dtype_name(dt));
    failed += run_case(ctx, &c, NULL, NULL, seed, label, "fp8 per tensor");
  }
  return failed;
}

/* FP8 K/V on the ring: the explicit variants above, then the library's
 * own choice (a 16-row decode tile whose warps split the keys, split-KV,
 * GQA packing; prefill's tiles) over decode and prefill shapes, and
 * descales per tensor. */
int test_gpu_fp8_kv(void)
{
  int failed = run_axes(fp8_ring_cases, sizeof fp8_ring_cases / sizeof fp8_ring_cases[0],
                        FJ_MMA_SYNC);
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(fjt_tmpdir(), &ctx);
  if (rc)
    return rc;
  /* batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, bf16, causal, splits. */
  static const int cases[][9] = {
      {3, 32, 8, 1, 1, 64, 0, 0, 0},      {2, 32, 8, 4, 17, 128, 1, 2, 1},
      {1, 32, 8, 1, 4096, 256, 0, 0, 3},  {1, 32, 8, 4, 16384, 128, 1, 0, 0},
      {1, 32, 1, 1, 17, 128, 1, 0, 64},   {2, 32, 1, 4, 4096, 64, 0, 2, 0},
      {1, 8, 1, 1, 16384, 64, 1, 0, 0},   {2, 8, 8, 1, 4096, 128, 0, 0, 0},
      {1, 8, 8, 4, 1, 256, 1, 2, 0},      {2, 32, 4, 1, 1000, 128, 1, 0, 7},
      /* Prefill shapes: the library's tiles over FP8 K/V. */
      {1, 8, 2, 700, 700, 128, 1, 1, 0},  {2, 4, 4, 300, 513, 64, 0, 2, 0},
      {1, 4, 1, 129, 257, 256, 1, 0, 0},
  };
  enum { N = sizeof cases / sizeof cases[0] };
  static const float one = 1.f;
  fj_variant vs[N];
  for (int i = 0; i < N; i++) {
    const int *c = cases[i];
    fj_problem p;
    fj_problem_init(&p, c[0], c[1], c[2], c[3], c[4], c[5], c[6] ? FJ_BF16 : FJ_F16, FJ_BHSD);
    p.kv_dtype = FJ_E4M3;
    p.k_scale = p.v_scale = &one;
    p.causal = (fj_causal)c[7];
    p.splits = c[8];
    fj_plan plan;
    CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
    vs[i] = plan.variant;
  }
  CHECK(prepare(ctx, vs, N) == 0);
  uint64_t seed = 808;
  for (int i = 0; i < N; i++) {
    const int *c = cases[i];
    failed += serving_case_kv(ctx, c[0], c[1], c[2], c[3], c[4], c[5], c[6] ? FJ_BF16 : FJ_F16,
                              FJ_E4M3, (fj_causal)c[7], c[8], (fj_order)(i % 2), &seed,
                              i < 10 ? "fp8 decode" : "fp8 prefill");
  }
  printf("%d fp8 library-choice cases\n", (int)N);
  failed += fp8_per_tensor(ctx, FJ_BF16, &seed);
  print_worst();
  fj_ctx_destroy(ctx);
  return failed != 0;
}

/* One small FP8-ring case per path (pipelined, plain ring, warps that split
 * the keys, split-KV decode) for compute-sanitizer. */
int test_gpu_sanitize_fp8_kv(void)
{
  static const axis_case small[] = {
      {"fp8 ring pipelined", 128, 128, 64, 8, 3, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_BF16, FJ_E4M3, FJ_CAUSAL_TOP_LEFT, 1, 2, 1, 130, 150, 0},
      {"fp8 ring plain", 128, 128, 64, 4, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, FJ_E4M3, FJ_CAUSAL_NONE, 1, 2, 2, 70, 90, 0},
      {"fp8 ring warps split keys", 128, 16, 64, 4, 3, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_BF16, FJ_E4M3, FJ_CAUSAL_NONE, 1, 2, 2, 3, 200, 0},
      {"fp8 ring split keys d80", 80, 16, 64, 4, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, FJ_E4M3, FJ_CAUSAL_NONE, 1, 2, 1, 4, 150, 0},
  };
  int failed = run_axes(small, sizeof small / sizeof small[0], FJ_MMA_SYNC);
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(fjt_tmpdir(), &ctx);
  if (rc)
    return rc;
  uint64_t seed = 3;
  failed += serving_case_kv(ctx, 1, 32, 8, 1, 700, 128, FJ_BF16, FJ_E4M3,
                            FJ_CAUSAL_NONE, 4, FJ_BHSD, &seed, "fp8 decode split");
  fj_ctx_destroy(ctx);
  return failed != 0;
}

/* A cross product's variants on two problems each, shapes[s] = {seq_q,
 * seq_kv, heads_q, heads_kv}, the first BHSD, the second BSHD; returns the
 * failures and prints "<axis> product: ...". */
static int cross_run(fj_ctx *ctx, const fj_variant *vs, size_t n,
                     const int shapes[2][4], uint64_t seed, const char *axis)
{
  int failed = 0;
  for (size_t i = 0; i < n; i++)
    for (int s = 0; s < 2; s++) {
      gpu_case c;
      memset(&c, 0, sizeof c);
      fj_problem_init(&c.p, 1, shapes[s][2], shapes[s][3], shapes[s][0],
                      shapes[s][1], vs[i].head_dim, vs[i].dtype, (fj_order)s);
      c.p.causal = vs[i].causal;
      char label[200];
      variant_label(label, sizeof label, &vs[i], &c.p, s ? " bshd" : " bhsd");
      failed += run_case(ctx, &c, &vs[i], NULL, &seed, label, axis);
    }
  printf("%s product: %zu variants x 2 shapes, %d failures\n", axis, n, failed);
  print_worst();
  return failed;
}

/* head_dim x dtype x causal x stages, the tiles and swizzle rotating
 * through the family's shapes; two problems each (65 x 127 BHSD, 127 x 65
 * BSHD with GQA 2:1), checked against the reference. */
static int mma_cross_index(size_t i, fj_variant *v)
{
  static const int tiles[3][2] = {{64, 4}, {128, 8}, {128, 4}};
  size_t st = i % 3, m = (i / 3) % 3, dt = (i / 9) % 2, d = i / 18;
  if (d >= 7)
    return 0;
  int dim = all_dims[d];
  fj_variant_default(v, dim, dt ? FJ_BF16 : FJ_F16, all_masks[m]);
  v->mma = FJ_MMA_SYNC;
  v->softmax = FJ_SOFTMAX_REGS;
  v->stages = (int)st + 1;
  size_t shape = (i / 2) % (dim > 128 ? 2 : 3);  /* 32 rows per warp up to 128 */
  v->tile_m = tiles[shape][0];
  v->warps = tiles[shape][1];
  v->tile_n = dim > 128 ? 32 : 64;
  v->swizzle = (fj_swizzle)(FJ_SWIZZLE_NONE + (int)(i % 3));
  return 1;
}

int test_gpu_mma_cross(void)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(fjt_tmpdir(), &ctx);
  if (rc)
    return rc;
  fj_variant vs[126];
  size_t n = 0;
  for (size_t i = 0; n < 126 && mma_cross_index(i, &vs[n]); i++)
    n++;
  CHECK(n == 126);
  CHECK(prepare(ctx, vs, n) == 0);
  static const int shapes[2][4] = {{65, 127, 2, 2}, {127, 65, 4, 2}};
  int failed = cross_run(ctx, vs, n, shapes, 2468, "mma cross");
  fj_ctx_destroy(ctx);
  return failed != 0;
}

/* ---- the wgmma family (sm_90a): every axis value, and its cross product ------------------ */

/* Whether the device runs the wgmma family (FJT_SKIP, with why, if not). */
static int wgmma_device(fj_ctx **ctx)
{
  int rc = fjt_gpu_ctx(fjt_tmpdir(), ctx);
  if (rc)
    return rc;
  if (strcmp(fj_ctx_arch(*ctx), "sm_90a") != 0) {
    rc = fjt_skip("the wgmma family needs sm_90a; this device is %s",
                  fj_ctx_arch(*ctx));
    fj_ctx_destroy(*ctx);
    return rc;
  }
  return 0;
}

/* tile_m = 64 x consumer warpgroups, warps = 4 x (warpgroups + 1). */
static const axis_case wgmma_cases[] = {
    {"wgmma d64 3 warpgroups", 64, 192, 128, 16, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_NONE, 1, 2, 2, 400, 400, 0},
    {"wgmma d64 tile_n=192", 64, 128, 192, 12, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_TOP_LEFT, 1, 2, 2, 333, 333, 0},
    {"wgmma d64 tile_n=224", 64, 64, 224, 8, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 2, 300, 700, 0},
    {"wgmma d128 tile_n=176", 128, 128, 176, 12, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_NONE, 1, 2, 2, 500, 500, 0},
    {"wgmma d128 1 warpgroup", 128, 64, 128, 8, 3, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 1, 200, 300, 0},
    {"wgmma d192", 192, 128, 96, 12, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_TOP_LEFT, 1, 2, 2, 300, 300, 0},
    {"wgmma d256 tile_n=80", 256, 128, 80, 12, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_NONE, 1, 2, 2, 257, 257, 0},
    {"wgmma d256 tile_n=64", 256, 128, 64, 12, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 2, 200, 333, 0},
    {"wgmma stages=3", 128, 128, 128, 12, 3, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 2, 300, 700, 0},
    {"wgmma stages=4", 64, 128, 128, 12, 4, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_NONE, 2, 2, 2, 700, 700, 0},
    {"wgmma tile_n=64", 128, 128, 64, 12, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_TOP_LEFT, 1, 2, 2, 129, 129, 0},
    {"wgmma gqa=8:1", 128, 128, 128, 12, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_TOP_LEFT, 2, 16, 2, 300, 300, 0},
    {"wgmma gqa=8:1", 64, 192, 128, 16, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_NONE, 1, 8, 1, 100, 150, 0},
    {"wgmma inputs x30", 128, 128, 176, 12, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_NONE, 1, 2, 2, 300, 300, 30},
    {"wgmma inputs x30", 256, 128, 80, 12, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 2, 200, 250, 30},
    {"wgmma no visible key", 128, 128, 128, 12, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 2, 300, 40, 0},
    {"wgmma no visible key", 64, 192, 128, 16, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 2, 250, 1, 0},
    {"wgmma seq 1", 128, 128, 176, 12, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_NONE, 1, 2, 2, 1, 1, 0},
    {"wgmma seq 4097", 128, 128, 128, 12, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_TOP_LEFT, 1, 2, 2, 4097, 4097, 0},
};

int test_gpu_wgmma_axes(void)
{
  fj_ctx *ctx;
  int rc = wgmma_device(&ctx);
  if (rc)
    return rc;
  fj_ctx_destroy(ctx);
  return run_axes(wgmma_cases, sizeof wgmma_cases / sizeof wgmma_cases[0],
                  FJ_MMA_WGMMA);
}

/* ---- every head dim: the wgmma family's padded panels, the mma family's k16 steps ---- */

/* Head dims between the wgmma family's 64-column panels (the TMA's zero
 * fill pads them; only the problem's columns are stored), below 64 where
 * the mma family cannot take them (not multiples of 16), and each mask,
 * GQA, tails and both layouts (run_axes alternates them). */
static const axis_case pad_cases[] = {
    {"wgmma pad d8", 8, 192, 128, 16, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_NONE, 1, 2, 2, 300, 300, 0},
    {"wgmma pad d40", 40, 192, 128, 16, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_TOP_LEFT, 1, 4, 2, 333, 333, 0},
    {"wgmma pad d72", 72, 128, 160, 12, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 2, 200, 450, 0},
    {"wgmma pad d80", 80, 128, 176, 12, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_TOP_LEFT, 2, 4, 1, 300, 300, 0},
    {"wgmma pad d80", 80, 128, 160, 12, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_NONE, 1, 2, 2, 257, 257, 30},
    {"wgmma pad d96", 96, 128, 160, 12, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_NONE, 1, 2, 2, 500, 500, 0},
    {"wgmma pad d96", 96, 128, 176, 12, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_TOP_LEFT, 1, 8, 2, 300, 300, 0},
    {"wgmma pad d96", 96, 64, 128, 8, 3, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 1, 100, 333, 0},
    {"wgmma pad d112", 112, 128, 128, 12, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_NONE, 1, 2, 2, 129, 129, 0},
    {"wgmma pad d144", 144, 128, 96, 12, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_TOP_LEFT, 1, 2, 2, 300, 300, 0},
    {"wgmma pad d160", 160, 128, 96, 12, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_BOTTOM_RIGHT, 1, 4, 2, 250, 400, 0},
    {"wgmma pad d200", 200, 128, 80, 12, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_NONE, 1, 2, 2, 200, 200, 0},
    {"wgmma pad d248", 248, 128, 64, 12, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_TOP_LEFT, 1, 2, 2, 257, 257, 0},
};

/* Multiples of 16 the mma family takes as they are (k16 steps, 8-column
 * loads). */
static const axis_case k16_cases[] = {
    {"mma d48", 48, 64, 64, 4, 2, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_NONE, 1, 2, 2, 130, 200, 0},
    {"mma d80", 80, 128, 64, 8, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_TOP_LEFT, 1, 4, 2, 257, 257, 0},
    {"mma d112", 112, 128, 64, 8, 3, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 1, 100, 300, 0},
    {"mma d144", 144, 64, 32, 4, 2, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_NONE, 2, 2, 2, 90, 90, 0},
    {"mma d208", 208, 64, 32, 4, 2, FJ_SWIZZLE_PAD, FJ_SOFTMAX_REGS, FJ_F16, 0, FJ_CAUSAL_TOP_LEFT, 1, 2, 2, 100, 100, 0},
    {"mma d240", 240, 64, 32, 4, 1, FJ_SWIZZLE_XOR, FJ_SOFTMAX_REGS, FJ_BF16, 0, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 2, 70, 130, 0},
};

/* The library's own choice at head dims between the old list's: prefill
 * (wgmma on sm_90a), decode (mma's split-KV and its combine, the padded
 * head dim 40 too). */
static int head_dims_auto(fj_ctx *ctx, uint64_t *seed)
{
  static const struct {
    int b, hq, hkv, sq, skv, d;
    fj_dtype dt;
    fj_causal m;
  } cases[] = {
      {1, 4, 4, 1500, 1500, 96, FJ_BF16, FJ_CAUSAL_TOP_LEFT},
      {2, 2, 2, 777, 777, 80, FJ_F16, FJ_CAUSAL_NONE},
      {1, 4, 2, 600, 900, 160, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT},
      {4, 8, 2, 1, 3000, 80, FJ_BF16, FJ_CAUSAL_NONE},
      {2, 8, 8, 1, 2000, 40, FJ_F16, FJ_CAUSAL_BOTTOM_RIGHT},
  };
  int failed = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    gpu_case c;
    memset(&c, 0, sizeof c);
    fj_problem_init(&c.p, cases[i].b, cases[i].hq, cases[i].hkv, cases[i].sq,
                    cases[i].skv, cases[i].d, cases[i].dt, (fj_order)(i % 2));
    c.p.causal = cases[i].m;
    char label[120];
    snprintf(label, sizeof label, "auto (%d,%d/%d,%d/%d,%d) %s %s", cases[i].b,
             cases[i].hq, cases[i].hkv, cases[i].sq, cases[i].skv, cases[i].d,
             fj_dtype_name(cases[i].dt), fj_causal_name(cases[i].m));
    failed += run_case(ctx, &c, NULL, NULL, seed, label, "auto");
  }
  return failed;
}

int test_gpu_head_dims(void)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(fjt_tmpdir(), &ctx);
  if (rc)
    return rc;
  int wgmma = strcmp(fj_ctx_arch(ctx), "sm_90a") == 0;
  uint64_t seed = 5150;
  int failed = head_dims_auto(ctx, &seed);
  fj_ctx_destroy(ctx);
  failed += run_axes(k16_cases, sizeof k16_cases / sizeof k16_cases[0],
                     FJ_MMA_SYNC);
  if (wgmma)
    failed += run_axes(pad_cases, sizeof pad_cases / sizeof pad_cases[0],
                       FJ_MMA_WGMMA);
  else
    printf("the wgmma family's padded head dims need sm_90a: not run here\n");
  return failed != 0;
}

/* ---- split head dims (head_dim_v): MLA's 192 / 128 and its kin ----------------- */

/* The shapes split cases rotate through: GQA, lengths that are no
 * multiple of any tile, more queries than keys (bottom-right: rows that
 * see no key), and one of several row tiles a head. */
static const int split_shapes[][5] = {
    {2, 4, 2, 333, 333}, {1, 8, 2, 257, 517}, {1, 4, 4, 700, 300}, {1, 16, 16, 1024, 1024}};

/* A split case of shape i (round robin), layout and dtype alternating. */
static void split_case(gpu_case *c, int i, int d, int dv, fj_dtype dt,
                       fj_causal m, char *label, size_t size, const char *who)
{
  const int *s = split_shapes[i % 4];
  fj_order order = (fj_order)(i % 2);
  memset(c, 0, sizeof *c);
  fjt_split_problem(&c->p, s[0], s[1], s[2], s[3], s[4], d, dv, dt, order);
  c->p.causal = m;
  snprintf(label, size, "%s d%d/v%d (%d,%d/%d,%d/%d) %s %s %s", who, d, dv,
           s[0], s[1], s[2], s[3], s[4], fj_dtype_name(dt), fj_causal_name(m),
           order ? "bshd" : "bhsd");
}

/* The library's choice for each head dim pair and mask. */
static int head_dim_v_auto(fj_ctx *ctx, uint64_t *seed)
{
  static const int dims[][2] = {{192, 128}, {128, 64}, {96, 64}, {256, 128}, {64, 128}};
  int failed = 0, i = 0;
  for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
    for (size_t m = 0; m < 3; m++, i++) {
      gpu_case c;
      char label[160];
      split_case(&c, i, dims[d][0], dims[d][1], (i / 2) % 2 ? FJ_BF16 : FJ_F16,
                 all_masks[m], label, sizeof label, "auto");
      failed += run_case(ctx, &c, NULL, NULL, seed, label, "head_dim_v auto");
    }
  return failed;
}

/* Split head dims on the wgmma family (sm_90a; skipped elsewhere, saying
 * so): the library's choice at 192/128, 128/64, 96/64, 256/128 and 64/128
 * with every mask, and explicit variants (other tiles, warpgroups,
 * stages), over GQA, tails and both layouts, against the reference. */
int test_gpu_head_dim_v(void)
{
  fj_ctx *ctx;
  int rc = wgmma_device(&ctx);
  if (rc)
    return rc;
  uint64_t seed = 3434;
  int failed = head_dim_v_auto(ctx, &seed);
  fj_variant vs[8];
  size_t n = fjt_head_dim_v_variants(vs, 8);
  if (prepare(ctx, vs, n)) {
    failed++;
  } else {
    for (size_t i = 0; i < n; i++) {
      gpu_case c;
      char label[160], name[128];
      fj_variant_name(&vs[i], name, sizeof name);
      split_case(&c, (int)i + 1, vs[i].head_dim, vs[i].head_dim_v,
                 vs[i].dtype, vs[i].causal, label, sizeof label, name);
      failed += run_case(ctx, &c, &vs[i], NULL, &seed, label,
                         "head_dim_v variants");
    }
  }
  print_worst();
  fj_ctx_destroy(ctx);
  return failed != 0;
}

/* ---- wide heads (above 256) and MLA's latent cache on the mma family --------------- */

/* One wide case: shape (b, hq/hkv, sq/skv), head dims d/dv, V read from K's
 * rows where latent; variant (tile_m, tile_n, warps, stages, splits, the
 * swizzle sw, 0 for pad) where tile_m is not 0, else the library's choice;
 * O's rows dv + o_gap apart, the gap poisoned and checked unchanged. */
typedef struct wide_case {
  int b, hq, hkv, sq, skv, d, dv, latent;
  fj_dtype dt;
  fj_causal m;
  fj_order order;
  int tile_m, tile_n, warps, stages, splits;
  fj_swizzle sw;
  int o_gap;
} wide_case;

static const wide_case wide_cases[] = {
    /* MLA's decode: 16 and 128 query heads over one latent head. */
    {2, 16, 1, 1, 1000, 576, 512, 1, FJ_BF16, FJ_CAUSAL_NONE, FJ_BSHD, 0, 0, 0, 0, 0, 0, 0},
    {1, 128, 1, 1, 777, 576, 512, 1, FJ_F16, FJ_CAUSAL_NONE, FJ_BSHD, 0, 0, 0, 0, 0, 0, 0},
    /* Speculative decode (bottom-right), and a prefill of the latent rows. */
    {2, 16, 1, 4, 1000, 576, 512, 1, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT, FJ_BSHD, 0, 0, 0, 0, 0, 0, 0},
    {1, 8, 1, 300, 300, 576, 512, 1, FJ_BF16, FJ_CAUSAL_TOP_LEFT, FJ_BHSD, 0, 0, 0, 0, 0, 0, 0},
    /* One head dim above 256: 512 and 320, prefill and decode. */
    {1, 4, 2, 300, 333, 512, 512, 0, FJ_F16, FJ_CAUSAL_TOP_LEFT, FJ_BHSD, 0, 0, 0, 0, 0, 0, 0},
    {2, 4, 4, 100, 700, 320, 320, 0, FJ_BF16, FJ_CAUSAL_NONE, FJ_BSHD, 0, 0, 0, 0, 0, 0, 0},
    {4, 32, 8, 1, 2000, 512, 512, 0, FJ_BF16, FJ_CAUSAL_NONE, FJ_BHSD, 0, 0, 0, 0, 0, 0, 0},
    /* head_dim above 256, V's 256 (the warps split keys only: KS). */
    {1, 8, 2, 64, 500, 384, 256, 1, FJ_BF16, FJ_CAUSAL_NONE, FJ_BHSD, 0, 0, 0, 0, 0, 0, 0},
    /* Split head dims of MLA's prefill on the mma family (V from K). */
    {2, 4, 2, 333, 333, 192, 128, 1, FJ_F16, FJ_CAUSAL_TOP_LEFT, FJ_BHSD, 16, 64, 4, 2, 0, 0, 0},
    /* Explicit variants: 32-row tiles (two row slices a warp), two warps
     * of 32 keys, one stage, forced splits. */
    {1, 128, 1, 1, 777, 576, 512, 1, FJ_BF16, FJ_CAUSAL_NONE, FJ_BSHD, 32, 64, 4, 2, 3, 0, 0},
    {2, 16, 1, 2, 1000, 576, 512, 1, FJ_F16, FJ_CAUSAL_BOTTOM_RIGHT, FJ_BSHD, 16, 32, 2, 2, 5, 0, 0},
    {2, 16, 1, 1, 513, 576, 512, 1, FJ_BF16, FJ_CAUSAL_NONE, FJ_BSHD, 16, 64, 4, 1, 7, 0, 0},
    {1, 4, 2, 200, 333, 512, 512, 0, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT, FJ_BHSD, 32, 64, 4, 1, 0, 0, 0},
    /* Head dims that are a multiple of 8 but not of 16, which the mma
     * family pads to 16 columns, and 272, whose warps split V's columns
     * in padded tiles (17 tiles of 16): prefill (explicit variants up to
     * 256, which sm_90a's library choice gives the wgmma family; above,
     * the library's choice), decode (GQA packed, split), and split head
     * dims from K's rows. */
    {2, 4, 2, 333, 333, 40, 40, 0, FJ_F16, FJ_CAUSAL_TOP_LEFT, FJ_BHSD, 64, 64, 4, 2, 0, 0, 0},
    {1, 4, 4, 300, 517, 40, 40, 0, FJ_BF16, FJ_CAUSAL_NONE, FJ_BSHD, 128, 128, 4, 3, 0, 0, 0},
    {2, 4, 2, 257, 257, 72, 72, 0, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT, FJ_BSHD, 128, 64, 8, 2, 0, 0, 0},
    {1, 8, 8, 200, 333, 72, 72, 0, FJ_F16, FJ_CAUSAL_NONE, FJ_BHSD, 64, 64, 4, 1, 0, 0, 0},
    {1, 4, 2, 300, 300, 264, 264, 0, FJ_F16, FJ_CAUSAL_TOP_LEFT, FJ_BHSD, 0, 0, 0, 0, 0, 0, 0},
    {2, 4, 4, 100, 700, 264, 264, 0, FJ_BF16, FJ_CAUSAL_NONE, FJ_BSHD, 0, 0, 0, 0, 0, 0, 0},
    {1, 4, 2, 129, 250, 272, 272, 0, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT, FJ_BHSD, 0, 0, 0, 0, 0, 0, 0},
    {1, 4, 2, 100, 200, 520, 520, 0, FJ_F16, FJ_CAUSAL_TOP_LEFT, FJ_BSHD, 0, 0, 0, 0, 0, 0, 0},
    {4, 32, 8, 1, 2000, 40, 40, 0, FJ_BF16, FJ_CAUSAL_NONE, FJ_BHSD, 16, 64, 4, 2, 4, 0, 0},
    {4, 32, 8, 1, 2000, 72, 72, 0, FJ_F16, FJ_CAUSAL_NONE, FJ_BSHD, 64, 64, 4, 2, 3, 0, 0},
    {4, 32, 8, 1, 2000, 264, 264, 0, FJ_BF16, FJ_CAUSAL_NONE, FJ_BHSD, 0, 0, 0, 0, 0, 0, 0},
    {2, 32, 8, 3, 999, 264, 264, 0, FJ_F16, FJ_CAUSAL_BOTTOM_RIGHT, FJ_BHSD, 16, 64, 4, 1, 5, 0, 0},
    /* A split decode of 72/72 and then of 72/40 in one context (dtype,
     * varlen and sinks alike): each needs its own combine, which the
     * context's table of combines once found by head_dim alone, handing
     * the second the first's (O's rows 72 wide: wrong O, and writes past
     * it -- 576/504 after 576/512 on the H200, 2026-12-05). */
    {2, 16, 1, 1, 1000, 72, 72, 0, FJ_BF16, FJ_CAUSAL_NONE, FJ_BSHD, 16, 64, 4, 2, 3, 0, 0},
    {2, 16, 1, 1, 1000, 72, 40, 1, FJ_BF16, FJ_CAUSAL_NONE, FJ_BSHD, 16, 64, 4, 2, 3, 0, 0},
    {2, 4, 2, 333, 333, 72, 40, 1, FJ_F16, FJ_CAUSAL_TOP_LEFT, FJ_BHSD, 16, 64, 4, 2, 0, 0, 0},
    /* The XOR swizzle on padded tiles (chunk c of row r at c ^ (r & XM),
     * XM from the padded row's chunks): prefill with 4 and 8 warps and
     * three stages, a packed and split decode. */
    {2, 4, 2, 333, 333, 40, 40, 0, FJ_F16, FJ_CAUSAL_TOP_LEFT, FJ_BSHD, 128, 128, 4, 3, 0, FJ_SWIZZLE_XOR, 0},
    {2, 4, 2, 257, 257, 72, 72, 0, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT, FJ_BHSD, 128, 64, 8, 3, 0, FJ_SWIZZLE_XOR, 0},
    {4, 32, 8, 1, 2000, 72, 72, 0, FJ_F16, FJ_CAUSAL_NONE, FJ_BSHD, 16, 64, 4, 3, 3, FJ_SWIZZLE_XOR, 0},
    /* Head dim 8, one chunk a row (tile_io.cuh's load_tile whose threads
     * step by rows), and 24, three (its loop over every chunk, as 40 and
     * 72 take): prefill in both layouts, synchronous loads (one stage),
     * decodes packed and split; the library's choice of their decodes. */
    {2, 4, 2, 300, 517, 8, 8, 0, FJ_BF16, FJ_CAUSAL_TOP_LEFT, FJ_BHSD, 64, 64, 4, 2, 0, FJ_SWIZZLE_PAD, 0},
    {1, 8, 8, 129, 250, 8, 8, 0, FJ_F16, FJ_CAUSAL_NONE, FJ_BSHD, 128, 128, 4, 3, 0, FJ_SWIZZLE_XOR, 0},
    {4, 32, 8, 1, 2000, 8, 8, 0, FJ_BF16, FJ_CAUSAL_NONE, FJ_BHSD, 16, 128, 4, 2, 4, FJ_SWIZZLE_XOR, 0},
    {2, 4, 4, 333, 333, 24, 24, 0, FJ_F16, FJ_CAUSAL_BOTTOM_RIGHT, FJ_BSHD, 128, 128, 4, 3, 0, FJ_SWIZZLE_XOR, 0},
    {1, 4, 2, 200, 300, 24, 24, 0, FJ_BF16, FJ_CAUSAL_TOP_LEFT, FJ_BHSD, 64, 64, 4, 1, 0, FJ_SWIZZLE_PAD, 0},
    {2, 32, 8, 2, 999, 24, 24, 0, FJ_F16, FJ_CAUSAL_BOTTOM_RIGHT, FJ_BSHD, 16, 64, 4, 2, 5, FJ_SWIZZLE_PAD, 0},
    {4, 32, 8, 1, 2000, 8, 8, 0, FJ_F16, FJ_CAUSAL_NONE, FJ_BSHD, 0, 0, 0, 0, 0, 0, 0},
    {4, 32, 8, 1, 2000, 24, 24, 0, FJ_BF16, FJ_CAUSAL_NONE, FJ_BHSD, 0, 0, 0, 0, 0, 0, 0},
    /* O's rows 8 elements apart beyond head_dim_v, the padded tiles' 8
     * columns: a store of a pad column lands in the gap, which must keep
     * its poison.  The attention kernel's stores (prefill, explicit and
     * the library's choice: wgmma on sm_90a) and the combine's (a split
     * decode). */
    {2, 4, 2, 333, 333, 40, 40, 0, FJ_BF16, FJ_CAUSAL_TOP_LEFT, FJ_BHSD, 64, 64, 4, 2, 0, FJ_SWIZZLE_PAD, 8},
    {4, 32, 8, 1, 2000, 72, 72, 0, FJ_F16, FJ_CAUSAL_NONE, FJ_BSHD, 16, 64, 4, 2, 4, FJ_SWIZZLE_XOR, 8},
    {1, 4, 2, 300, 300, 40, 40, 0, FJ_F16, FJ_CAUSAL_NONE, FJ_BSHD, 0, 0, 0, 0, 0, 0, 8},
};

/* Case w's problem: O's strides those of rows dv + o_gap wide (the
 * contiguous ones scaled), V's K's where latent. */
static void wide_problem(const wide_case *w, fj_problem *p)
{
  fjt_split_problem(p, w->b, w->hq, w->hkv, w->sq, w->skv, w->d, w->dv, w->dt, w->order);
  if (w->dv == w->d)
    p->head_dim_v = 0;
  p->causal = w->m;
  p->splits = w->splits;
  for (int i = 0; i < 3; i++)
    p->o_stride[i] = p->o_stride[i] / w->dv * (w->dv + w->o_gap);
  if (w->latent)
    memcpy(p->v_stride, p->k_stride, sizeof p->k_stride);
}

/* Case w's explicit variant (w->tile_m not 0). */
static void wide_variant(const wide_case *w, fj_variant *v)
{
  fj_variant_default(v, w->d, w->dt, w->m);
  v->head_dim_v = w->dv == w->d ? 0 : w->dv;
  v->mma = FJ_MMA_SYNC;
  v->swizzle = w->sw ? w->sw : FJ_SWIZZLE_PAD;
  v->tile_m = w->tile_m;
  v->tile_n = w->tile_n;
  v->warps = w->warps;
  v->stages = w->stages;
  v->pack_gqa = w->hq > w->hkv && w->sq * (w->hq / w->hkv) <= 128;
  v->split_kv = w->splits > 1;
}

size_t fjt_padded_variants(fj_problem *p, fj_variant *v, size_t max)
{
  size_t n = 0;
  for (size_t i = 0; i < sizeof wide_cases / sizeof wide_cases[0]; i++) {
    const wide_case *w = &wide_cases[i];
    if (!w->tile_m || (w->d % 16 == 0 && w->dv % 16 == 0))
      continue;
    if (n < max) {
      wide_problem(w, &p[n]);
      wide_variant(w, &v[n]);
    }
    n++;
  }
  return n;
}

static int run_wide(fj_ctx *ctx, const wide_case *w, uint64_t *seed)
{
  gpu_case c;
  memset(&c, 0, sizeof c);
  wide_problem(w, &c.p);
  c.latent = w->latent;
  c.o_gaps = w->o_gap > 0;
  fj_variant v, *vp = NULL;
  char label[200], name[128] = "library's choice";
  if (w->tile_m) {
    wide_variant(w, &v);
    vp = &v;
  } else {
    fj_attention_variant(ctx, &c.p, &v, NULL);
  }
  fj_variant_name(&v, name, sizeof name);
  snprintf(label, sizeof label, "%s (%d,%d/%d,%d/%d) %s%s%s%s", name, w->b, w->hq, w->hkv,
           w->sq, w->skv, fj_causal_name(w->m), w->latent ? " latent" : "",
           w->o_gap ? " O rows gapped" : "", vp ? "" : " (library)");
  return run_case(ctx, &c, vp, NULL, seed, label, "wide heads");
}

/* Head dims above 256 (up to 576 / 512), MLA's latent cache (V as K's
 * first head_dim_v columns, v = k) and head dims padded to 16 columns on
 * the mma family (8 to 72, both swizzles; O's rows apart, the gap left
 * as it was), every target with mma.sync: the library's choice and
 * explicit variants, against the reference; and a launch whose v is not
 * k refused. */
int test_gpu_wide_heads(void)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(fjt_tmpdir(), &ctx);
  if (rc)
    return rc;
  uint64_t seed = 576;
  int failed = 0;
  for (size_t i = 0; i < sizeof wide_cases / sizeof wide_cases[0]; i++)
    failed += run_wide(ctx, &wide_cases[i], &seed);
  /* V apart from K with split head dims on the mma family: refused. */
  fj_problem p;
  fjt_split_problem(&p, 1, 16, 1, 1, 64, 576, 512, FJ_BF16, FJ_BSHD);
  void *q, *k, *v, *o;
  int bad = cudaMalloc(&q, 1 << 20) || cudaMalloc(&k, 1 << 20) ||
            cudaMalloc(&v, 1 << 20) || cudaMalloc(&o, 1 << 20);
  fj_status st = bad ? FJ_OK : fj_attention_fwd(ctx, &p, q, k, v, o, NULL, NULL);
  if (bad || st != FJ_ERR_INVALID_ARG || !strstr(fj_errmsg(ctx), "v must be k")) {
    fprintf(stderr, "a split head dim with v apart from k: %s (%s)\n", fj_status_str(st),
            fj_errmsg(ctx));
    failed++;
  } else {
    printf("v apart from k refused: %s\n", fj_errmsg(ctx));
  }
  cudaFree(q);
  cudaFree(k);
  cudaFree(v);
  cudaFree(o);
  print_worst();
  fj_ctx_destroy(ctx);
  return failed != 0;
}

/* For compute-sanitizer: small wide-head cases (the warps' shared row
 * maxima and P, V from K's tiles, 2 warps, 32-row tiles, splits). */
int test_gpu_sanitize_wide(void)
{
  static const wide_case small[] = {
      {1, 16, 1, 1, 200, 576, 512, 1, FJ_BF16, FJ_CAUSAL_NONE, FJ_BSHD, 0, 0, 0, 0, 2, 0, 0},
      {1, 2, 2, 40, 70, 512, 512, 0, FJ_F16, FJ_CAUSAL_TOP_LEFT, FJ_BHSD, 0, 0, 0, 0, 0, 0, 0},
      {1, 32, 1, 1, 150, 576, 512, 1, FJ_BF16, FJ_CAUSAL_NONE, FJ_BSHD, 32, 64, 4, 2, 0, 0, 0},
      {1, 16, 1, 2, 100, 576, 512, 1, FJ_F16, FJ_CAUSAL_BOTTOM_RIGHT, FJ_BSHD, 16, 32, 2, 2, 3, 0, 0},
  };
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(fjt_tmpdir(), &ctx);
  if (rc)
    return rc;
  uint64_t seed = 5760;
  int failed = 0;
  for (size_t i = 0; i < sizeof small / sizeof small[0]; i++)
    failed += run_wide(ctx, &small[i], &seed);
  fj_ctx_destroy(ctx);
  return failed != 0;
}

/* For compute-sanitizer: the library's choice at padded head dims and at
 * split ones, small problems in BSHD (O's rows of one position packed
 * head after head, so a store past a head's columns lands in the next
 * head's, or past the allocation at the last). */
int test_gpu_sanitize_pad(void)
{
  static const int dims[][2] = {{40, 40},  {72, 72},   {96, 96},  {160, 160},
                                {200, 200}, {192, 128}, {64, 128}, {96, 64}};
  fj_ctx *ctx;
  int rc = wgmma_device(&ctx);
  if (rc)
    return rc;
  uint64_t seed = 23;
  int failed = 0;
  for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
    gpu_case c;
    memset(&c, 0, sizeof c);
    fjt_split_problem(&c.p, 1, 2, 1, 70, 130, dims[i][0], dims[i][1], FJ_BF16,
                      FJ_BSHD);
    c.p.causal = i % 2 ? FJ_CAUSAL_BOTTOM_RIGHT : FJ_CAUSAL_NONE;
    char label[120];
    snprintf(label, sizeof label, "sanitize pad d%d/%d bshd %s", dims[i][0],
             dims[i][1], fj_causal_name(c.p.causal));
    failed += run_case(ctx, &c, NULL, NULL, &seed, label, "sanitize pad");
  }
  fj_ctx_destroy(ctx);
  return failed != 0;
}

/* head_dim x dtype x causal x stages (2-4), with the consumer warpgroups
 * (1-3) and key tiles rotating where registers and shared memory allow;
 * two problems each, checked against the reference. */
static int wgmma_cross_index(size_t i, fj_variant *v)
{
  static const int wdims[] = {64, 128, 192, 256};
  /* per head dim: { tile_m, warps, tile_n } choices that fit 2-4 stages */
  static const int shapes[4][3][3] = {
      {{192, 16, 128}, {128, 12, 128}, {64, 8, 192}},
      {{128, 12, 128}, {64, 8, 64}, {128, 12, 96}},
      {{128, 12, 64}, {64, 8, 64}, {128, 12, 48}},
      {{128, 12, 48}, {64, 8, 32}, {128, 12, 32}}};
  size_t st = i % 3, m = (i / 3) % 3, dt = (i / 9) % 2, d = i / 18;
  if (d >= 4)
    return 0;
  fj_variant_default(v, wdims[d], dt ? FJ_BF16 : FJ_F16, all_masks[m]);
  v->mma = FJ_MMA_WGMMA;
  v->softmax = FJ_SOFTMAX_REGS;
  v->swizzle = FJ_SWIZZLE_XOR;
  v->stages = (int)st + 2;
  const int *s = shapes[d][(i / 2) % 3];
  v->tile_m = s[0];
  v->warps = s[1];
  v->tile_n = s[2];
  return 1;
}

int test_gpu_wgmma_cross(void)
{
  fj_ctx *ctx;
  int rc = wgmma_device(&ctx);
  if (rc)
    return rc;
  fj_variant vs[72];
  size_t n = 0;
  for (size_t i = 0; n < 72 && wgmma_cross_index(i, &vs[n]); i++)
    n++;
  CHECK(n == 72);
  CHECK(prepare(ctx, vs, n) == 0);
  static const int shapes[2][4] = {{65, 127, 2, 2}, {130, 65, 4, 2}};
  int failed = cross_run(ctx, vs, n, shapes, 1357, "wgmma cross");
  fj_ctx_destroy(ctx);
  return failed != 0;
}

/* FP8 attention (dtype e4m3: Q, K, V in e4m3, O bf16) on the wgmma family:
 * head dims 64 to 256 (64 and 192 with Q K^T padded to 128 and 256, P V
 * and V^T's boxes at their own width), key tiles of 128 to 256, every
 * mask, GQA,
 * tails, both layouts, the flush
 * of O's FP8 partial every 1, 4 or 16 key tiles or never; then the
 * library's own choice.  Inputs spread over e4m3's range with descales
 * that bring them back to unit size; checked against the float64
 * reference of the dequantised inputs. */
static const struct {
  const char *axis;
  int d, flush, stages;
  fj_causal m;
  int b, hq, hkv, sq, skv;
  int n;  /* tile_n; 0: 128, the default */
} fp8_cases[] = {
    {"fp8 d128", 128, 0, 2, FJ_CAUSAL_NONE, 1, 2, 2, 300, 300, 0},
    {"fp8 d128", 128, 0, 2, FJ_CAUSAL_TOP_LEFT, 2, 4, 2, 257, 257, 0},
    {"fp8 d128", 128, 0, 3, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 1, 200, 700, 0},
    {"fp8 d128 flush=1", 128, 1, 2, FJ_CAUSAL_NONE, 1, 2, 2, 1000, 1000, 0},
    {"fp8 d128 flush=16", 128, 16, 2, FJ_CAUSAL_TOP_LEFT, 1, 2, 2, 1000, 2100, 0},
    {"fp8 d128 flush=never", 128, -1, 2, FJ_CAUSAL_NONE, 1, 2, 2, 500, 1500, 0},
    {"fp8 d128 gqa=8:1", 128, 0, 2, FJ_CAUSAL_TOP_LEFT, 1, 16, 2, 300, 300, 0},
    {"fp8 d128 seq 1", 128, 0, 2, FJ_CAUSAL_NONE, 1, 2, 2, 1, 1, 0},
    {"fp8 d128 no visible key", 128, 0, 2, FJ_CAUSAL_BOTTOM_RIGHT, 1, 2, 2, 300, 40, 0},
    {"fp8 d256", 256, 0, 2, FJ_CAUSAL_NONE, 1, 2, 2, 300, 300, 0},
    {"fp8 d256", 256, 0, 2, FJ_CAUSAL_BOTTOM_RIGHT, 2, 4, 2, 200, 333, 0},
    {"fp8 d256 stages=3", 256, -1, 3, FJ_CAUSAL_TOP_LEFT, 1, 2, 1, 129, 129, 0},
    /* 64 and 192: Q K^T padded to 128 and 256, P V at 64 and 192. */
    {"fp8 d64", 64, 0, 2, FJ_CAUSAL_TOP_LEFT, 2, 4, 2, 300, 300, 0},
    {"fp8 d64", 64, -1, 3, FJ_CAUSAL_NONE, 1, 2, 2, 200, 513, 0},
    {"fp8 d64 stages=4", 64, 1, 4, FJ_CAUSAL_BOTTOM_RIGHT, 1, 8, 2, 333, 1000, 0},
    {"fp8 d192", 192, 0, 2, FJ_CAUSAL_BOTTOM_RIGHT, 1, 4, 2, 257, 700, 0},
    {"fp8 d192", 192, -1, 2, FJ_CAUSAL_NONE, 2, 2, 1, 129, 300, 0},
    /* Key tiles of 192 and 256 (one accumulator: fp8_flush -1); V^T's
     * rows in 128-key boxes, the last tile's past the keys. */
    {"fp8 d128 tile_n=192", 128, -1, 2, FJ_CAUSAL_NONE, 1, 4, 2, 500, 1000, 192},
    {"fp8 d128 tile_n=192", 128, -1, 2, FJ_CAUSAL_BOTTOM_RIGHT, 2, 4, 4, 333, 700, 192},
    {"fp8 d128 tile_n=192", 128, -1, 3, FJ_CAUSAL_TOP_LEFT, 1, 2, 2, 1000, 1000, 192},
    {"fp8 d64 tile_n=256", 64, -1, 2, FJ_CAUSAL_TOP_LEFT, 1, 4, 2, 700, 700, 256},
    /* FlashAttention-3's FP8 tiles: 224 keys at head dim 128, 160 at 64
     * and 192 (each 5 or 7 k steps of 32, not a whole 128-key box). */
    {"fp8 d128 tile_n=224", 128, -1, 2, FJ_CAUSAL_NONE, 1, 4, 2, 700, 1000, 224},
    {"fp8 d128 tile_n=224", 128, -1, 2, FJ_CAUSAL_BOTTOM_RIGHT, 2, 4, 2, 333, 900, 224},
    {"fp8 d64 tile_n=160", 64, 1, 2, FJ_CAUSAL_TOP_LEFT, 1, 4, 2, 1000, 1000, 160},
    {"fp8 d192 tile_n=160", 192, -1, 2, FJ_CAUSAL_NONE, 1, 2, 2, 500, 777, 160},
};

int test_gpu_fp8_forward(void)
{
  fj_ctx *ctx;
  int rc = wgmma_device(&ctx);
  if (rc)
    return rc;
  size_t n = sizeof fp8_cases / sizeof fp8_cases[0];
  fj_variant vs[sizeof fp8_cases / sizeof fp8_cases[0]];
  for (size_t i = 0; i < n; i++) {
    fj_variant_default(&vs[i], fp8_cases[i].d, FJ_E4M3, fp8_cases[i].m);
    vs[i].stages = fp8_cases[i].stages;
    vs[i].fp8_flush = fp8_cases[i].flush;
    if (fp8_cases[i].n)
      vs[i].tile_n = fp8_cases[i].n;
  }
  CHECK(prepare(ctx, vs, n) == 0);
  uint64_t seed = 808;
  int failed = 0;
  /* Then the library's choice (its key tiles by head dim and mask) on the
   * problems of cases 1 (d128 causal), 9 (d256), 12 (d64 causal) and 13
   * (d64, no mask). */
  static const size_t own[] = {1, 9, 12, 13};
  for (size_t i = 0; i < n + FJ_ARRAY_LEN(own); i++) {
    size_t k = i < n ? i : own[i - n];
    gpu_case c;
    memset(&c, 0, sizeof c);
    fj_problem_init(&c.p, fp8_cases[k].b, fp8_cases[k].hq, fp8_cases[k].hkv,
                    fp8_cases[k].sq, fp8_cases[k].skv, fp8_cases[k].d, FJ_E4M3,
                    (fj_order)(i % 2));
    c.p.causal = fp8_cases[k].m;
    /* Labelled with the variant that runs: the case's, or the library's
     * (asked with placeholder descales: the choice does not read them). */
    fj_variant runs = vs[k];
    if (i >= n) {
      static const float one = 1.0f;
      fj_problem asked = c.p;
      asked.q_scale = asked.k_scale = asked.v_scale = &one;
      if (fj_attention_variant(ctx, &asked, &runs, NULL) != FJ_OK)
        runs = vs[k];
    }
    char label[200];
    variant_label(label, sizeof label, &runs, &c.p,
                  i >= n ? " (library's choice)" : i % 2 ? " bshd" : " bhsd");
    failed += run_case(ctx, &c, i < n ? &vs[i] : NULL, NULL, &seed, label,
                       i < n ? fp8_cases[i].axis : "fp8 auto");
  }
  failed += fp8_per_tensor(ctx, FJ_E4M3, &seed);
  print_worst();
  fj_ctx_destroy(ctx);
  return failed != 0;
}

/* FP8 attention with score expressions and the softcap (head dims up to
 * 128): the descales join the score function's input scale, and the
 * softmax takes its results in natural units.  Each alone and both, with
 * a mask expression, every causal alignment, GQA, tails, both layouts;
 * the library's choice, checked against the float64 reference of the
 * dequantised inputs. */
int test_gpu_fp8_mods(void)
{
  static const struct {
    const char *name;
    int d;
    fj_causal m;
    int b, hq, hkv, sq, skv;
    const char *score, *mask;
    float softcap;
  } cases[] = {
      {"fp8 softcap 30", 128, FJ_CAUSAL_NONE, 1, 4, 2, 300, 500, NULL, NULL, 30.f},
      {"fp8 softcap 5", 128, FJ_CAUSAL_TOP_LEFT, 2, 4, 4, 257, 257, NULL, NULL, 5.f},
      {"fp8 score linear bias", 128, FJ_CAUSAL_BOTTOM_RIGHT, 1, 8, 2, 200, 700,
       "s - 0.125f * (float)(q - kv) / 16.f", NULL, 0.f},
      {"fp8 score and softcap", 128, FJ_CAUSAL_TOP_LEFT, 1, 4, 2, 333, 333, "s * 1.5f", NULL, 20.f},
      {"fp8 score, mask, softcap d64", 64, FJ_CAUSAL_NONE, 1, 2, 2, 333, 400, "s * 1.5f",
       "kv % 5 != 2", 20.f},
      {"fp8 score d64 seq 1", 64, FJ_CAUSAL_NONE, 1, 2, 1, 1, 1, "s + 3.f", NULL, 0.f},
  };
  fj_ctx *ctx;
  int rc = wgmma_device(&ctx);
  if (rc)
    return rc;
  uint64_t seed = 919;
  int failed = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    gpu_case c;
    memset(&c, 0, sizeof c);
    fj_problem_init(&c.p, cases[i].b, cases[i].hq, cases[i].hkv, cases[i].sq, cases[i].skv,
                    cases[i].d, FJ_E4M3, (fj_order)(i % 2));
    c.p.causal = cases[i].m;
    fj_mods m;
    fj_mods_init(&m);
    m.score = cases[i].score;
    m.mask = cases[i].mask;
    m.softcap = cases[i].softcap;
    c.p.mods = &m;
    c.host_mods = &m;
    char label[200];
    snprintf(label, sizeof label, "%s (%d,%d/%d,%d/%d,%d) %s %s", cases[i].name, cases[i].b,
             cases[i].hq, cases[i].hkv, cases[i].sq, cases[i].skv, cases[i].d,
             fj_causal_name(cases[i].m), i % 2 ? "bshd" : "bhsd");
    failed += run_case(ctx, &c, NULL, NULL, &seed, label, "fp8 mods");
  }
  print_worst();
  fj_ctx_destroy(ctx);
  return failed != 0;
}

/* One FP8 attention call of c (inputs made) into out, O's element o (0:
 * bf16) with o_scale and o_amax as given; the amax first poisoned, so
 * that a call which did not zero it shows.  0 on success. */
static int fp8_out_call(fj_ctx *ctx, gpu_case *c, fj_dtype o, float *scale, float *amax,
                        void *out, float *lse)
{
  static const float poison = 1e30f;
  c->p.o_dtype = o;
  c->p.o_scale = scale;
  c->p.o_amax = amax;
  if (amax && cudaMemcpy(amax, &poison, 4, cudaMemcpyHostToDevice) != cudaSuccess)
    return 1;
  fj_status st = fj_attention_fwd(ctx, &c->p, c->dq, c->dk, c->dv, out, lse, NULL);
  if (st != FJ_OK) {
    fprintf(stderr, "fp8 out %s: %s\n", fj_dtype_name(o ? o : FJ_BF16), fj_errmsg(ctx));
    return 1;
  }
  return cudaDeviceSynchronize() != cudaSuccess;
}

/* FP8 attention's O in f16 and e4m3 (fj_problem.o_dtype, o_scale) and
 * its amax (o_amax), against the same kernel's bf16 O: the values before
 * rounding are the same, so
 *   - amax is max |O| within bf16's half step of the bf16 O's largest,
 *     and the same bits whatever O's element;
 *   - the f16 O is within a bf16 step of the bf16 O;
 *   - the e4m3 O is e4m3(O_bf16 x o_scale), or the other neighbour where
 *     the bf16 rounding put the value on an e4m3 midpoint (a tie);
 *   - the log-sum-exp is the same bits.
 * Head dims 128 and 256, GQA, tails, bottom-right causal. */
int test_gpu_fp8_out(void)
{
  fj_ctx *ctx;
  int rc = wgmma_device(&ctx);
  if (rc)
    return rc;
  uint64_t seed = 4242;
  int failed = 0;
  for (int d = 128; d <= 256; d += 128) {
    gpu_case c;
    memset(&c, 0, sizeof c);
    fj_problem_init(&c.p, 2, 8, 2, 300, 700, d, FJ_E4M3, FJ_BHSD);
    c.p.causal = FJ_CAUSAL_BOTTOM_RIGHT;
    CHECK(case_setup(&c, &seed) == 0);
    size_t n = c.nq, nl = c.nlse;
    float *dscale = NULL, *damax = NULL, *dlse2 = NULL;
    void *d8 = NULL;
    const float scale = 8.f;
    uint16_t *o16 = malloc(n * 2), *of16 = malloc(n * 2);
    uint8_t *o8 = malloc(n);
    float *lse = malloc(nl * 4), *lse2 = malloc(nl * 4), *f = malloc(n * 4), *g = malloc(n * 4);
    CHECK(o16 && of16 && o8 && lse && lse2 && f && g);
    CHECK(cudaMalloc((void **)&dscale, 4) == cudaSuccess && cudaMalloc((void **)&damax, 4) == cudaSuccess &&
          cudaMalloc((void **)&dlse2, nl * 4) == cudaSuccess && cudaMalloc(&d8, n) == cudaSuccess &&
          cudaMemcpy(dscale, &scale, 4, cudaMemcpyHostToDevice) == cudaSuccess);
    float amax = 0.f, amax8 = 0.f;
    /* bf16 with the amax. */
    CHECK(fp8_out_call(ctx, &c, 0, NULL, damax, c.dout, c.dlse) == 0);
    CHECK(cudaMemcpy(o16, c.dout, n * 2, cudaMemcpyDeviceToHost) == cudaSuccess &&
          cudaMemcpy(lse, c.dlse, nl * 4, cudaMemcpyDeviceToHost) == cudaSuccess &&
          cudaMemcpy(&amax, damax, 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    fj_convert(FJ_F32, f, FJ_BF16, o16, n);
    float big = 0.f;
    for (size_t i = 0; i < n; i++)
      big = fmaxf(big, fabsf(f[i]));
    int bad = !(fabsf(amax - big) <= big * (1.f / 256));
    printf("fp8 out d%d: amax %.6g, the bf16 O's largest %.6g\n", d, (double)amax, (double)big);
    /* f16, no amax. */
    CHECK(fp8_out_call(ctx, &c, FJ_F16, NULL, NULL, c.dout, dlse2) == 0);
    CHECK(cudaMemcpy(of16, c.dout, n * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
    fj_convert(FJ_F32, g, FJ_F16, of16, n);
    size_t off16 = 0, off8 = 0, ties = 0;
    for (size_t i = 0; i < n; i++)
      off16 += !(fabsf(g[i] - f[i]) <= fabsf(f[i]) * (1.f / 128) + 1e-6f);
    /* e4m3 times the scale, with the amax again. */
    CHECK(fp8_out_call(ctx, &c, FJ_E4M3, dscale, damax, d8, dlse2) == 0);
    CHECK(cudaMemcpy(o8, d8, n, cudaMemcpyDeviceToHost) == cudaSuccess &&
          cudaMemcpy(lse2, dlse2, nl * 4, cudaMemcpyDeviceToHost) == cudaSuccess &&
          cudaMemcpy(&amax8, damax, 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    /* want: e4m3(bf16 O x scale) (x, exact: the scale is a power of
     * two); g, f: got's and want's values. */
    uint8_t *want = malloc(n);
    float *x = malloc(n * 4);
    CHECK(want && x);
    for (size_t i = 0; i < n; i++)
      x[i] = f[i] * scale;
    fj_convert(FJ_E4M3, want, FJ_F32, x, n);
    fj_convert(FJ_F32, g, FJ_E4M3, o8, n);
    fj_convert(FJ_F32, f, FJ_E4M3, want, n);
    for (size_t i = 0; i < n; i++) {
      if (o8[i] == want[i])
        continue;
      /* Where the bf16 rounding put x on an e4m3 midpoint (every one is a
       * bf16 value), x ties to even; the kernel rounds O once and may
       * take the other neighbour.  Any other difference is wrong. */
      int adjacent = abs((int)o8[i] - (int)want[i]) == 1;
      if (adjacent && fabsf(g[i] - x[i]) == fabsf(f[i] - x[i]))
        ties++;
      else
        off8++;
    }
    bad |= off16 != 0 || off8 != 0 || memcmp(&amax, &amax8, 4) != 0 ||
           memcmp(lse, lse2, nl * 4) != 0;
    printf("fp8 out d%d: f16 %zu of %zu off the bf16 O; e4m3 %zu off e4m3(bf16 O x %g) (and %zu "
           "the other side of a tie); amax %s; lse %s -> %s\n",
           d, off16, n, off8, (double)scale, ties,
           memcmp(&amax, &amax8, 4) ? "differs" : "the same bits",
           memcmp(lse, lse2, nl * 4) ? "differs" : "the same bits", bad ? "FAIL" : "ok");
    failed += bad;
    /* Three stages at head dim 256 leave no room for O's staging: the
     * e4m3 pairs go out by the plain stores, the same bytes. */
    if (d == 256) {
      fj_variant v;
      CHECK_OK(ctx, fj_attention_variant(ctx, &c.p, &v, NULL));
      v.stages = 3;
      CHECK(cudaMemset(d8, 0xff, n) == cudaSuccess);
      fj_status st = fj_attention_fwd_variant(ctx, &c.p, &v, c.dq, c.dk, c.dv, d8, NULL, NULL);
      CHECK_OK(ctx, st);
      CHECK(cudaDeviceSynchronize() == cudaSuccess &&
            cudaMemcpy(want, d8, n, cudaMemcpyDeviceToHost) == cudaSuccess);
      int differ = memcmp(want, o8, n) != 0;
      printf("fp8 out d256, 3 stages (O stored pair by pair): %s -> %s\n",
             differ ? "other bytes than staged" : "the staged bytes", differ ? "FAIL" : "ok");
      failed += differ;
    }
    free(want), free(x);
    free(o16), free(of16), free(o8), free(lse), free(lse2), free(f), free(g);
    cudaFree(dscale), cudaFree(damax), cudaFree(dlse2), cudaFree(d8);
    c.p.o_scale = c.p.o_amax = NULL;
    case_free(&c);
  }
  fj_ctx_destroy(ctx);
  return failed != 0;
}

/* FP8 attention at long context: a needle.  Each of five heads has one
 * key whose score stands about 13 above the others' (whose spread is
 * 0.65), so that it takes about 0.7 of each row's softmax over 131072
 * keys, at position 1000, 4095, 16384, 65537 or 131071: early, the later
 * tiles add little to O; last, O's partial over 131071 keys is rescaled
 * by about e^-10 when it arrives.  Every query row is the same (q = 1),
 * so each head's output rows all equal one float64 row computed here;
 * O's relative error must stay under 2% at every position, for O's FP8
 * partial flushed every key tile and never (FlashAttention-3's way) at
 * head dim 128, and at 256 (never: its default). */
int test_gpu_fp8_needle(void)
{
  enum { H = 5, SQ = 64, SK = 131072 };
  static const int at[H] = {1000, 4095, 16384, 65537, 131071};
  fj_ctx *ctx;
  int rc = wgmma_device(&ctx);
  if (rc)
    return rc;
  int failed = 0;
  for (int run = 0; run < 3; run++) {
    const int d = run < 2 ? 128 : 256, flush = run == 0 ? 1 : -1;
    const size_t nk = (size_t)H * SK * (size_t)d, nq = (size_t)H * SQ * (size_t)d;
    float *f = malloc(nk * sizeof(float));
    uint8_t *k8 = malloc(nk), *v8 = malloc(nk), *q8 = malloc(nq);
    uint16_t *o = malloc(nq * 2);
    double *want = malloc((size_t)H * (size_t)d * sizeof(double));
    CHECK(f && k8 && v8 && q8 && o && want);
    uint64_t seed = 99 + (uint64_t)run;
    /* K and V: e4m3 over [-64, 64], descales 1/64; the needles' keys 64
     * in every column (1 once dequantised); Q all 16 (descale 1/16).  The
     * float64 row of each head as they come: s_j = 0.1 x sum_x k_jx, then
     * softmax and P V. */
    const double scale = 0.1;
    double *s = malloc((size_t)H * SK * sizeof(double));
    CHECK(s);
    for (int which = 0; which < 2; which++) {
      for (size_t i = 0; i < nk; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        f[i] = (float)(2.0 * ((double)(seed >> 11) * 0x1p-53) - 1.0) * 64.f;
      }
      if (which == 0)
        for (int h = 0; h < H; h++)
          for (int x = 0; x < d; x++)
            f[((size_t)h * SK + (size_t)at[h]) * (size_t)d + (size_t)x] = 64.f;
      fj_convert(FJ_E4M3, which ? v8 : k8, FJ_F32, f, nk);
      fj_convert(FJ_F32, f, FJ_E4M3, which ? v8 : k8, nk);  /* as dequantised, x 64 */
      for (int h = 0; h < H; h++) {
        const float *fh = f + (size_t)h * SK * (size_t)d;
        double *sh = s + (size_t)h * SK, *w = want + h * d;
        if (which == 0) {
          for (int j = 0; j < SK; j++) {
            double acc = 0.0;
            for (int x = 0; x < d; x++)
              acc += (double)fh[(size_t)j * (size_t)d + (size_t)x] / 64.0;
            sh[j] = acc * scale;
          }
          continue;
        }
        double m = -INFINITY, l = 0.0;
        for (int j = 0; j < SK; j++)
          m = fmax(m, sh[j]);
        for (int x = 0; x < d; x++)
          w[x] = 0.0;
        for (int j = 0; j < SK; j++) {
          double pj = exp(sh[j] - m);
          l += pj;
          for (int x = 0; x < d; x++)
            w[x] += pj * (double)fh[(size_t)j * (size_t)d + (size_t)x] / 64.0;
        }
        for (int x = 0; x < d; x++)
          w[x] /= l;
      }
    }
    free(s);
    for (size_t i = 0; i < nq; i++)
      f[i] = 16.f;
    fj_convert(FJ_E4M3, q8, FJ_F32, f, nq);
    void *dq = NULL, *dk = NULL, *dv = NULL, *dout = NULL;
    float *ds = NULL;
    const float scales[3] = {1.f / 16, 1.f / 64, 1.f / 64};
    float sc[3 * H];
    for (int i = 0; i < 3 * H; i++)
      sc[i] = scales[i / H];
    CHECK(cudaMalloc(&dq, nq) == cudaSuccess && cudaMalloc(&dk, nk) == cudaSuccess &&
          cudaMalloc(&dv, nk) == cudaSuccess && cudaMalloc(&dout, nq * 2) == cudaSuccess &&
          cudaMalloc((void **)&ds, sizeof sc) == cudaSuccess);
    CHECK(cudaMemcpy(dq, q8, nq, cudaMemcpyHostToDevice) == cudaSuccess &&
          cudaMemcpy(dk, k8, nk, cudaMemcpyHostToDevice) == cudaSuccess &&
          cudaMemcpy(dv, v8, nk, cudaMemcpyHostToDevice) == cudaSuccess &&
          cudaMemcpy(ds, sc, sizeof sc, cudaMemcpyHostToDevice) == cudaSuccess);
    fj_problem p;
    fj_problem_init(&p, 1, H, H, SQ, SK, d, FJ_E4M3, FJ_BHSD);
    p.scale = (float)scale;
    p.q_scale = ds;
    p.k_scale = ds + H;
    p.v_scale = ds + 2 * H;
    fj_variant v;
    fj_variant_default(&v, d, FJ_E4M3, FJ_CAUSAL_NONE);
    v.fp8_flush = flush;
    fj_status st = fj_attention_fwd_variant(ctx, &p, &v, dq, dk, dv, dout, NULL, NULL);
    if (st != FJ_OK)
      fprintf(stderr, "fp8 needle d%d: %s\n", d, fj_errmsg(ctx));
    CHECK(st == FJ_OK && cudaDeviceSynchronize() == cudaSuccess &&
          cudaMemcpy(o, dout, nq * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
    fj_convert(FJ_F32, f, FJ_BF16, o, nq);
    for (int h = 0; h < H; h++) {
      double rel = 0.0;
      for (int r = 0; r < SQ; r++) {
        double e2 = 0.0, w2 = 0.0;
        for (int x = 0; x < d; x++) {
          double g = f[((size_t)h * SQ + (size_t)r) * (size_t)d + (size_t)x], w = want[h * d + x];
          e2 += (g - w) * (g - w);
          w2 += w * w;
        }
        rel = fmax(rel, sqrt(e2 / w2));
      }
      int bad = !(rel < 2e-2);
      printf("fp8 needle d%d flush %s at %6d of %d keys: relative error %.3e -> %s\n", d,
             flush > 0 ? "1" : "never", at[h], SK, rel, bad ? "FAIL" : "ok");
      failed += bad;
    }
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(ds);
    free(f), free(k8), free(v8), free(q8), free(o), free(want);
  }
  fj_ctx_destroy(ctx);
  return failed != 0;
}

/* One wgmma variant per (head dim, stages, causal), small problems with
 * tails, for compute-sanitizer (memcheck, racecheck, synccheck). */
int test_gpu_sanitize_wgmma(void)
{
  fj_ctx *ctx;
  int rc = wgmma_device(&ctx);
  if (rc)
    return rc;
  fj_variant vs[36];
  size_t n = 0;
  for (size_t i = 0; n < 36; i++) {
    fj_variant v;
    if (!wgmma_cross_index(i, &v))
      break;
    if (v.dtype == FJ_BF16)
      continue;  /* one variant per (head dim, stages, causal) */
    vs[n++] = v;
  }
  CHECK(n == 36);
  CHECK(prepare(ctx, vs, n) == 0);
  uint64_t seed = 17;
  int failed = 0;
  for (size_t i = 0; i < n; i++) {
    gpu_case c;
    memset(&c, 0, sizeof c);
    fj_problem_init(&c.p, 1, 2, 1, 70, 130, vs[i].head_dim, vs[i].dtype, FJ_BSHD);
    c.p.causal = vs[i].causal;
    char label[200];
    variant_label(label, sizeof label, &vs[i], &c.p, "");
    failed += run_case(ctx, &c, &vs[i], NULL, &seed, label, "sanitize wgmma");
  }
  fj_ctx_destroy(ctx);
  return failed != 0;
}

/* ---- sequence lengths on the default variants ------------------------------------------- */

/* Every sequence length and unequal pair, head dims 64 and 128, both
 * dtypes, three masks: with the library's choice (wgmma false), or with
 * the wgmma family's own picks forced (wgmma true; skipped off sm_90a). */
static int seqlens(fj_ctx *ctx, int wgmma)
{
  static const int lens[] = {1, 17, 63, 64, 65, 127, 1000, 4097};
  static const int pairs[][2] = {{63, 4097}, {4097, 63}, {1000, 65}, {65, 1000}};
  uint64_t seed = 5;
  int failed = 0;
  for (int d = 0; d < 2; d++)
    for (int dt = 0; dt < 2; dt++)
      for (int m = 0; m < 3; m++) {
        int dim = d ? 128 : 64;
        fj_dtype dtype = dt ? FJ_BF16 : FJ_F16;
        size_t nl = sizeof lens / sizeof lens[0];
        size_t np = sizeof pairs / sizeof pairs[0];
        for (size_t i = 0; i < nl + np; i++) {
          int sq = i < nl ? lens[i] : pairs[i - nl][0];
          int skv = i < nl ? lens[i] : pairs[i - nl][1];
          gpu_case c;
          memset(&c, 0, sizeof c);
          fj_problem_init(&c.p, 1, 2, 1, sq, skv, dim, dtype, (fj_order)(i % 2));
          c.p.causal = all_masks[m];
          fj_variant v;
          fj_attention_variant(ctx, &c.p, &v, NULL);
          if (wgmma) {
            v.mma = FJ_MMA_WGMMA;
            v.softmax = FJ_SOFTMAX_REGS;
            v.swizzle = FJ_SWIZZLE_XOR;
            v.stages = 2;
            v.tile_m = d ? 128 : 192;
            v.warps = d ? 12 : 16;
            v.tile_n = d ? 192 : 128;
            v.pack_gqa = v.split_kv = 0;  /* the mma family's axes */
          }
          char label[200];
          variant_label(label, sizeof label, &v, &c.p, "");
          failed += run_case(ctx, &c, wgmma ? &v : NULL, NULL, &seed, label,
                             wgmma ? "wgmma seq lengths" : "seq lengths");
        }
      }
  print_worst();
  return failed;
}

int test_gpu_family_seqlens(void)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(fjt_tmpdir(), &ctx);
  if (rc)
    return rc;
  int failed = seqlens(ctx, 0);
  fj_ctx_destroy(ctx);
  return failed != 0;
}

int test_gpu_wgmma_seqlens(void)
{
  fj_ctx *ctx;
  int rc = wgmma_device(&ctx);
  if (rc)
    return rc;
  int failed = seqlens(ctx, 1);
  fj_ctx_destroy(ctx);
  return failed != 0;
}

/* ---- one variant per (stages, swizzle, softmax) and family, for compute-sanitizer ---------- */

int test_gpu_sanitize_set(void)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(fjt_tmpdir(), &ctx);
  if (rc)
    return rc;
  fj_variant vs[27];
  size_t n = 0;
  for (int st = 1; st <= 3; st++)
    for (int sw = FJ_SWIZZLE_NONE; sw <= FJ_SWIZZLE_XOR; sw++)
      for (int sm = FJ_SOFTMAX_SMEM; sm <= FJ_SOFTMAX_REGS; sm++) {
        fj_variant *v = &vs[n++];
        fj_variant_default(v, 64, (st + sw) % 2 ? FJ_BF16 : FJ_F16,
                           FJ_CAUSAL_BOTTOM_RIGHT);
        v->stages = st;
        v->swizzle = (fj_swizzle)sw;
        v->softmax = (fj_softmax)sm;
        v->tile_m = 64;
        v->tile_n = 32;
        v->warps = 4;
      }
  /* The mma family per (stages, swizzle): 16 rows per warp (pipelined from
   * 2 stages) and 32 rows per warp. */
  for (int st = 1; st <= 3; st++)
    for (int sw = FJ_SWIZZLE_NONE; sw <= FJ_SWIZZLE_XOR; sw++) {
      fj_variant *v = &vs[n++];
      fj_variant_default(v, 64, (st + sw) % 2 ? FJ_BF16 : FJ_F16,
                         FJ_CAUSAL_BOTTOM_RIGHT);
      v->mma = FJ_MMA_SYNC;
      v->softmax = FJ_SOFTMAX_REGS;
      v->stages = st;
      v->swizzle = (fj_swizzle)sw;
      v->tile_m = 128;
      v->tile_n = 32;
      v->warps = (st + sw) % 2 ? 8 : 4;
    }
  CHECK(prepare(ctx, vs, n) == 0);
  uint64_t seed = 3;
  int failed = 0;
  for (size_t i = 0; i < n; i++) {
    gpu_case c;
    memset(&c, 0, sizeof c);
    fj_problem_init(&c.p, 1, 2, 1, 70, 130, 64, vs[i].dtype, FJ_BSHD);
    c.p.causal = FJ_CAUSAL_BOTTOM_RIGHT;
    char label[200];
    variant_label(label, sizeof label, &vs[i], &c.p, "");
    failed += run_case(ctx, &c, &vs[i], NULL, &seed, label, "sanitize set");
  }
  fj_ctx_destroy(ctx);
  return failed != 0;
}

/* ---- the tuner ---------------------------------------------------------------------------- */

/* Tunes p on ctx (iters 3, `workers` compilers), which it destroys:
 * the report's counts printed, at least min_timed candidates timed, none
 * failed or wrong, the winner no slower than the heuristic's; then a new
 * context on dir finds the winner in the database and computes with it,
 * checked against the reference (run_case).  The winner in *best. */
static int tune_then_use(const char *dir, fj_ctx *ctx, const fj_problem *p, int workers,
                         int min_timed, uint64_t seed, const char *label, fj_variant *best)
{
  fj_tune_opts o;
  fj_tune_opts_init(&o);
  o.iters = 3;
  o.workers = workers;
  fj_tune_report r;
  CHECK_OK(ctx, fj_tune(ctx, p, &o, best, &r));
  char name[160];
  fj_variant_name(best, name, sizeof name);
  printf("tuned %s: %.3f ms (default %.3f ms); %d candidates, %d refused, %d failed, "
         "%d wrong, %d timed; compile %.1f s, total %.1f s\n",
         name, r.best_ms, r.default_ms, r.candidates, r.refused, r.failed, r.wrong,
         r.timed, r.compile_s, r.total_s);
  CHECK(r.timed >= min_timed && r.best_ms > 0 && r.best_ms <= r.default_ms);
  CHECK(r.failed == 0 && r.wrong == 0);
  fj_ctx_destroy(ctx);
  CHECK(fjt_gpu_ctx(dir, &ctx) == 0);
  fj_variant chosen;
  fj_choice from;
  CHECK_OK(ctx, fj_attention_variant(ctx, p, &chosen, &from));
  CHECK(from == FJ_CHOICE_TUNED && memcmp(&chosen, best, sizeof *best) == 0);
  gpu_case c;
  memset(&c, 0, sizeof c);
  c.p = *p;
  int failed = run_case(ctx, &c, NULL, NULL, &seed, label, "tuned");
  fj_ctx_destroy(ctx);
  return failed != 0;
}

int test_gpu_tune(void)
{
  const char *dir = fjt_tmpdir();
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(dir, &ctx);
  if (rc)
    return rc;
  fj_problem p;
  fj_problem_init(&p, 1, 4, 4, 256, 256, 64, FJ_BF16, FJ_BHSD);
  p.causal = FJ_CAUSAL_TOP_LEFT;
  fj_variant best;
  return tune_then_use(dir, ctx, &p, 16, 2, 11, "tuned variant, checked", &best);
}

/* Split head dims (MLA's prefill, 192 / 128) tune as a class of their own
 * (|dv=128): the winner right against the reference, then found by a new
 * context; on sm_90a the wgmma family's candidates. */
int test_gpu_tune_split(void)
{
  const char *dir = fjt_tmpdir();
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(dir, &ctx);
  if (rc)
    return rc;
  if (strcmp(fj_ctx_arch(ctx), "sm_90a") != 0) {
    fj_ctx_destroy(ctx);
    return fjt_skip("split head dims tune on sm_90a's wgmma family");
  }
  fj_problem p;
  fjt_split_problem(&p, 1, 4, 4, 512, 512, 192, 128, FJ_BF16, FJ_BSHD);
  p.causal = FJ_CAUSAL_TOP_LEFT;
  fj_variant best;
  rc = tune_then_use(dir, ctx, &p, 0, 1, 12, "tuned split variant, checked", &best);
  if (rc)
    return rc;
  CHECK(best.head_dim_v == 128);
  return 0;
}

/* ---- serving shapes: GQA packing and split-KV ------------------------------------ */

/* One decode-shaped case through the library's plan (splits as given: 0
 * auto), checked against the reference; the label shows the plan. */
static int serving_case_kv(fj_ctx *ctx, int b, int hq, int hkv, int sq, int skv,
                           int d, fj_dtype dt, fj_dtype kv, fj_causal m, int splits,
                           fj_order order, uint64_t *seed, const char *axis)
{
  gpu_case c;
  memset(&c, 0, sizeof c);
  fj_problem_init(&c.p, b, hq, hkv, sq, skv, d, dt, order);
  c.p.causal = m;
  c.p.splits = splits;
  c.p.kv_dtype = kv;
  /* The plan reads no scale; case_setup replaces these with device ones. */
  static const float one = 1.f;
  if (kv == FJ_E4M3)
    c.p.k_scale = c.p.v_scale = &one;
  fj_plan plan;
  if (fj_attention_plan(ctx, &c.p, &plan) != FJ_OK) {
    fprintf(stderr, "plan (%d,%d/%d,%d/%d,%d): %s\n", b, hq, hkv, sq, skv, d,
            fj_errmsg(ctx));
    return 1;
  }
  /* What the plan promises: packing for grouped decode, the splits asked. */
  int want_pack = hq > hkv && sq * (hq / hkv) <= 128 && sq <= 16;
  if (plan.variant.pack_gqa != want_pack || (splits && plan.splits != splits)) {
    fprintf(stderr, "plan: pack_gqa %d (want %d), splits %d (want %d)\n",
            plan.variant.pack_gqa, want_pack, plan.splits, splits);
    return 1;
  }
  char name[160], label[300];
  fj_variant_name(&plan.variant, name, sizeof name);
  snprintf(label, sizeof label, "%s (%d,%d/%d,%d/%d) splits=%d%s", name, b, hq,
           hkv, sq, skv, plan.splits, order == FJ_BSHD ? " bshd" : "");
  return run_case(ctx, &c, NULL, NULL, seed, label, axis);
}

static int serving_case(fj_ctx *ctx, int b, int hq, int hkv, int sq, int skv,
                        int d, fj_dtype dt, fj_causal m, int splits,
                        fj_order order, uint64_t *seed, const char *axis)
{
  return serving_case_kv(ctx, b, hq, hkv, sq, skv, d, dt, 0, m, splits, order,
                         seed, axis);
}

int test_gpu_serving_decode(void)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(fjt_tmpdir(), &ctx);
  if (rc)
    return rc;
  static const int groups[][2] = {{8, 8}, {32, 8}, {32, 4}, {32, 1}};
  static const int sqs[] = {1, 4, 16};
  static const int skvs[] = {1, 17, 4096, 32768};
  static const int dims[] = {64, 128, 256};
  static const int splits[] = {0, 1, 3, 64};
  uint64_t seed = 99;
  int failed = 0, cases = 0;
  /* Every (GQA, seq_q, seq_kv), the other axes turning over with it. */
  for (int g = 0; g < 4; g++)
    for (int s = 0; s < 3; s++)
      for (int k = 0; k < 4; k++, cases++) {
        int i = cases;
        int batch = skvs[k] >= 32768 ? 1 : 1 + i % 3;
        failed += serving_case(ctx, batch, groups[g][0], groups[g][1], sqs[s],
                               skvs[k], dims[i % 3], i % 2 ? FJ_BF16 : FJ_F16,
                               i % 4 == 1   ? FJ_CAUSAL_BOTTOM_RIGHT
                               : i % 4 == 3 ? FJ_CAUSAL_TOP_LEFT
                                            : FJ_CAUSAL_NONE,
                               splits[(i / 3) % 4], (fj_order)(i % 2), &seed,
                               "decode");
      }
  /* Split counts 1 to 64 on one decode shape, and ranges that are empty
   * (more splits than key tiles) or fully masked (top-left causal with
   * few queries: most keys are past every row's diagonal). */
  static const int counts[] = {1, 2, 3, 5, 8, 16, 31, 64};
  for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++, cases++)
    failed += serving_case(ctx, 2, 32, 8, 1, 4096, 128, FJ_BF16,
                           FJ_CAUSAL_NONE, counts[i], FJ_BHSD, &seed, "splits");
  failed += serving_case(ctx, 1, 8, 8, 1, 17, 128, FJ_F16, FJ_CAUSAL_NONE, 64,
                         FJ_BHSD, &seed, "splits");
  failed += serving_case(ctx, 1, 32, 8, 16, 4096, 128, FJ_F16,
                         FJ_CAUSAL_TOP_LEFT, 16, FJ_BSHD, &seed, "splits");
  failed += serving_case(ctx, 1, 32, 8, 16, 17, 64, FJ_BF16,
                         FJ_CAUSAL_BOTTOM_RIGHT, 8, FJ_BHSD, &seed, "splits");
  /* A long prefill-shaped problem that the rule splits (few row tiles,
   * many key tiles). */
  failed += serving_case(ctx, 1, 4, 4, 100, 32768, 128, FJ_F16,
                         FJ_CAUSAL_BOTTOM_RIGHT, 0, FJ_BHSD, &seed, "splits");
  cases += 4;
  printf("%d of %d cases passed\n", cases - failed, cases);
  print_worst();
  fj_ctx_destroy(ctx);
  return failed != 0;
}

/* Split-KV under CUDA-graph capture: the context's workspace after a run
 * outside the capture, a caller's workspace through fj_attention_fwd_plan,
 * and a clear refusal where the context would have to allocate while
 * capturing.  Replays must reproduce the eager result bit for bit. */
int test_gpu_serving_graph(void)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(fjt_tmpdir(), &ctx);
  if (rc)
    return rc;
  uint64_t seed = 5;
  gpu_case c;
  memset(&c, 0, sizeof c);
  fj_problem_init(&c.p, 2, 32, 8, 1, 4096, 128, FJ_BF16, FJ_BHSD);
  CHECK(case_setup(&c, &seed) == 0);
  fj_plan plan;
  CHECK_OK(ctx, fj_attention_plan(ctx, &c.p, &plan));
  CHECK(plan.splits > 1 && plan.workspace_bytes > 0);
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s) == cudaSuccess);
  /* Eager, twice: split-KV merges in a fixed order. */
  CHECK(launch_case(ctx, &c, NULL, s, "eager") == 0);
  void *eager = malloc(c.qbytes);
  memcpy(eager, c.o, c.qbytes);
  CHECK(launch_case(ctx, &c, NULL, s, "eager again") == 0);
  CHECK(memcmp(eager, c.o, c.qbytes) == 0);
  /* Captured with the context's workspace (grown by the eager runs). */
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CHECK(cudaMemset(c.dout, 0xff, c.qbytes) == cudaSuccess);
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  fj_status st = fj_attention_fwd(ctx, &c.p, c.dq, c.dk, c.dv, c.dout, c.dlse, s);
  CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess);
  CHECK_OK(ctx, st);
  CHECK(cudaGraphInstantiate(&ge, g, 0) == cudaSuccess);
  CHECK(cudaGraphLaunch(ge, s) == cudaSuccess && cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(cudaMemcpy(c.o, c.dout, c.qbytes, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(memcmp(eager, c.o, c.qbytes) == 0);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  /* A new stream has no workspace yet: refused while capturing. */
  cudaStream_t s2;
  CHECK(cudaStreamCreate(&s2) == cudaSuccess);
  CHECK(cudaStreamBeginCapture(s2, cudaStreamCaptureModeGlobal) == cudaSuccess);
  st = fj_attention_fwd(ctx, &c.p, c.dq, c.dk, c.dv, c.dout, c.dlse, s2);
  CHECK(cudaStreamEndCapture(s2, &g) == cudaSuccess);
  CHECK_ST(ctx, st, FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "being captured");
  printf("refused while capturing: %s\n", fj_errmsg(ctx));
  cudaGraphDestroy(g);
  /* The caller's workspace, on that stream, captured. */
  void *ws;
  CHECK(cudaMalloc(&ws, plan.workspace_bytes) == cudaSuccess);
  CHECK_ST(ctx, fj_attention_fwd_plan(ctx, &c.p, &plan, c.dq, c.dk, c.dv, c.dout,
                                      c.dlse, ws, plan.workspace_bytes - 1, s2),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "too small");
  CHECK(cudaMemset(c.dout, 0xff, c.qbytes) == cudaSuccess);
  CHECK(cudaStreamBeginCapture(s2, cudaStreamCaptureModeGlobal) == cudaSuccess);
  st = fj_attention_fwd_plan(ctx, &c.p, &plan, c.dq, c.dk, c.dv, c.dout, c.dlse,
                             ws, plan.workspace_bytes, s2);
  CHECK(cudaStreamEndCapture(s2, &g) == cudaSuccess);
  CHECK_OK(ctx, st);
  CHECK(cudaGraphInstantiate(&ge, g, 0) == cudaSuccess);
  CHECK(cudaGraphLaunch(ge, s2) == cudaSuccess && cudaStreamSynchronize(s2) == cudaSuccess);
  CHECK(cudaMemcpy(c.o, c.dout, c.qbytes, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(memcmp(eager, c.o, c.qbytes) == 0);
  printf("split-KV (%d splits, %zu workspace bytes): eager, captured with the "
         "context's and with a caller's workspace: identical\n",
         plan.splits, plan.workspace_bytes);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaFree(ws);
  free(eager);
  case_free(&c);
  cudaStreamDestroy(s);
  cudaStreamDestroy(s2);
  fj_ctx_destroy(ctx);
  return 0;
}

/* A small set for compute-sanitizer (memcheck, racecheck): GQA packing
 * with and without split-KV, empty and fully masked ranges, both layouts. */
int test_gpu_sanitize_serving(void)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(fjt_tmpdir(), &ctx);
  if (rc)
    return rc;
  uint64_t seed = 8;
  int failed = 0;
  failed += serving_case(ctx, 1, 8, 2, 3, 130, 64, FJ_F16,
                         FJ_CAUSAL_BOTTOM_RIGHT, 5, FJ_BSHD, &seed, "sanitize");
  failed += serving_case(ctx, 2, 4, 4, 1, 77, 128, FJ_BF16, FJ_CAUSAL_NONE, 3,
                         FJ_BHSD, &seed, "sanitize");
  failed += serving_case(ctx, 1, 16, 2, 4, 200, 64, FJ_BF16,
                         FJ_CAUSAL_TOP_LEFT, 64, FJ_BHSD, &seed, "sanitize");
  failed += serving_case(ctx, 2, 8, 1, 1, 300, 64, FJ_F16, FJ_CAUSAL_NONE, 1,
                         FJ_BSHD, &seed, "sanitize");
  fj_ctx_destroy(ctx);
  return failed != 0;
}

/* ---- for the other GPU test files (gpu_case.h) ---------------------------------- */

/* ---- two threads, one context, one stream ------------------------------------------- */

typedef struct ws_job {
  fj_ctx *ctx;
  int which, failed;
} ws_job;

/* Split decodes of one shape (thread 0's or thread 1's, their workspaces
 * of different sizes) on the default stream, again and again. */
static void *ws_thread(void *arg)
{
  ws_job *j = arg;
  uint64_t seed = 4242 + (uint64_t)j->which;
  for (int i = 0; i < 12; i++) {
    gpu_case c;
    memset(&c, 0, sizeof c);
    if (j->which == 0)
      fj_problem_init(&c.p, 4, 32, 8, 1, 3000, 128, FJ_BF16, FJ_BHSD);
    else
      fj_problem_init(&c.p, 2, 16, 4, 3, 2100, 64, FJ_F16, FJ_BSHD);
    c.p.splits = j->which ? 5 : 3;
    char label[64];
    snprintf(label, sizeof label, "thread %d call %d (split %d)", j->which, i,
             c.p.splits);
    j->failed += run_case(j->ctx, &c, NULL, NULL, &seed, label,
                          j->which ? "threads: thread 1" : "threads: thread 0");
  }
  return NULL;
}

/* A context is thread-safe (flashjit.h): two threads' split decodes on one
 * context and the default stream enqueue their launches without a lock
 * between them, so each thread must have its own workspace (workspace.c:
 * one per stream and thread) -- with one per stream, a thread's combine
 * could read the other's partials. */
int test_gpu_threads_workspace(void)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(fjt_tmpdir(), &ctx);
  if (rc)
    return rc;
  ws_job jobs[2] = {{ctx, 0, 0}, {ctx, 1, 0}};
  pthread_t t[2];
  for (int i = 0; i < 2; i++)
    pthread_create(&t[i], NULL, ws_thread, &jobs[i]);
  for (int i = 0; i < 2; i++)
    pthread_join(t[i], NULL);
  fj_ctx_destroy(ctx);
  int failed = jobs[0].failed + jobs[1].failed;
  printf("two threads on one stream: %d of 24 calls failed\n", failed);
  return failed != 0;
}

/* ---- a compile beside another thread's launches ------------------------------------ */

typedef struct compile_job {
  fj_ctx *ctx;
  _Atomic int in_nvrtc, done;
  int failed;
} compile_job;

static void compile_seen(void *user, fj_log_level level, const char *msg)
{
  (void)level;
  if (strstr(msg, "compiling fj_attn_d128"))
    atomic_store(&((compile_job *)user)->in_nvrtc, 1);
}

/* A problem whose kernel no call has built: compiled (NVRTC) on this
 * thread, checked against the reference. */
static void *compile_thread(void *arg)
{
  compile_job *j = arg;
  uint64_t seed = 515;
  gpu_case c;
  memset(&c, 0, sizeof c);
  fj_problem_init(&c.p, 1, 4, 4, 200, 300, 128, FJ_BF16, FJ_BHSD);
  c.p.causal = FJ_CAUSAL_BOTTOM_RIGHT;
  j->failed = run_case(j->ctx, &c, NULL, NULL, &seed, "compiling thread (d128)",
                       "threads: compile");
  atomic_store(&j->done, 1);
  return NULL;
}

/* One thread's compile holds up only the calls that need its kernel
 * (flashjit.h): while a thread compiles (NVRTC, without the context's
 * lock), another launches a kernel built before, checked, again and
 * again; at least one of those calls ends before the compile does. */
int test_gpu_threads_compile(void)
{
  compile_job j = {0};
  int rc = fjt_gpu_ctx_log(NULL, compile_seen, &j, &j.ctx);
  if (rc)
    return rc;
  uint64_t seed = 99;
  gpu_case c;
  memset(&c, 0, sizeof c);
  fj_problem_init(&c.p, 1, 2, 2, 64, 64, 64, FJ_F16, FJ_BHSD);
  int failed = run_case(j.ctx, &c, NULL, NULL, &seed, "built first (d64)",
                        "threads: launch");
  pthread_t t;
  if (failed || pthread_create(&t, NULL, compile_thread, &j) != 0) {
    fj_ctx_destroy(j.ctx);
    return 1;
  }
  while (!atomic_load(&j.in_nvrtc) && !atomic_load(&j.done))
    nanosleep(&(struct timespec){0, 1000000}, NULL);
  int during = 0, calls = 0;
  while (!atomic_load(&j.done) && calls < 1000) {
    memset(&c, 0, sizeof c);
    fj_problem_init(&c.p, 1, 2, 2, 64, 64, 64, FJ_F16, FJ_BHSD);
    failed += run_case(j.ctx, &c, NULL, NULL, &seed, "launched during the compile",
                       "threads: launch");
    calls++;
    during += !atomic_load(&j.done);
  }
  pthread_join(t, NULL);
  fj_ctx_destroy(j.ctx);
  printf("a compile on one thread: %d checked calls of a built kernel ended "
         "during it on another (%d failed; the compile's own call %s)\n",
         during, failed, j.failed ? "FAILED" : "ok");
  return failed || j.failed || during < 1;
}

int fjt_gpu_run(fj_ctx *ctx, gpu_case *c, const fj_variant *v, void *stream,
                uint64_t *seed, const char *label, const char *axis)
{
  return run_case(ctx, c, v, stream, seed, label, axis);
}

void fjt_gpu_print_worst(void)
{
  print_worst();
}
