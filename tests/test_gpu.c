/*
 * test_gpu.c -- tests that need a GPU (label gpu; they skip, exit 77, where
 * there is none): the fragment-layout probe, and attention forward against
 * the float64 reference over dtypes, head dims, masks, layouts and sequence
 * lengths that are not multiples of the tiles.  Output and log-sum-exp are
 * poisoned with NaN before every run; inputs are fresh random normals.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "../src/internal.h"
#include "runner.h"

/* ---- the layout probe ------------------------------------------------------ */

static void print_lut_rows(const fj_lut *l, int lanes)
{
  for (int lane = 0; lane < lanes; lane++) {
    printf("  %s lane %2d:", fj_frag_name(l->frag), lane);
    for (int s = 0; s < l->slots; s++)
      printf(" (%d,%d)", l->map[lane][s] / 16, l->map[lane][s] % 16);
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
  fj_lut ref;
  fj__lut_reference(FJ_FRAG_WMMA_ACC_F32, &ref);
  printf("accumulator matches the reference table: %s\n",
         memcmp(ref.map, first[FJ_FRAG_WMMA_ACC_F32].map, sizeof ref.map) ? "no" : "yes");
  int same = 1;
  for (int lane = 0; lane < 32; lane++)
    for (int s = 0; s < 8; s++)
      same &= first[FJ_FRAG_WMMA_A_F16_ROW].map[lane][s] ==
              first[FJ_FRAG_WMMA_ACC_F32].map[lane][s];
  printf("matrix_a (f16) slots 0-7 hold the accumulator's elements: %s\n",
         same ? "yes" : "no");
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

/* ---- attention against the reference ------------------------------------------ */

typedef struct gpu_case {
  fj_problem p;
  uint16_t *q, *k, *v, *o;      /* host copies, in the problem's dtype */
  float *lse;
  size_t nq, nk, nlse;
  void *dq, *dk, *dv, *dout;
  float *dlse;
} gpu_case;

static double normal(uint64_t *s)
{
  double u[2];
  for (int i = 0; i < 2; i++) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    u[i] = ((double)(*s >> 11) + 0.5) / 9007199254740992.0;
  }
  return sqrt(-2 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

static uint16_t *random_tensor(fj_dtype dt, size_t n, uint64_t *seed)
{
  float *f = malloc(n * sizeof *f);
  uint16_t *out = malloc(n * sizeof *out);
  for (size_t i = 0; i < n; i++)
    f[i] = (float)normal(seed);
  fj_convert(dt, out, FJ_F32, f, n);
  free(f);
  return out;
}

static size_t span(const int64_t s[3], int b, int h, int seq, int d)
{
  return (size_t)((b - 1) * s[0] + (h - 1) * s[1] + (seq - 1) * s[2] + d);
}

static int case_setup(gpu_case *c, uint64_t *seed)
{
  fj_problem *p = &c->p;
  c->nq = span(p->q_stride, p->batch, p->heads_q, p->seq_q, p->head_dim);
  c->nk = span(p->k_stride, p->batch, p->heads_kv, p->seq_kv, p->head_dim);
  c->nlse = (size_t)p->batch * (size_t)p->heads_q * (size_t)p->seq_q;
  c->q = random_tensor(p->dtype, c->nq, seed);
  c->k = random_tensor(p->dtype, c->nk, seed);
  c->v = random_tensor(p->dtype, c->nk, seed);
  c->o = malloc(c->nq * 2);
  c->lse = malloc(c->nlse * sizeof(float));
  int bad = cudaMalloc(&c->dq, c->nq * 2) || cudaMalloc(&c->dk, c->nk * 2) ||
            cudaMalloc(&c->dv, c->nk * 2) || cudaMalloc(&c->dout, c->nq * 2) ||
            cudaMalloc((void **)&c->dlse, c->nlse * sizeof(float));
  bad = bad || cudaMemcpy(c->dq, c->q, c->nq * 2, cudaMemcpyHostToDevice) ||
        cudaMemcpy(c->dk, c->k, c->nk * 2, cudaMemcpyHostToDevice) ||
        cudaMemcpy(c->dv, c->v, c->nk * 2, cudaMemcpyHostToDevice);
  /* Poison: 0xff bytes are NaN in f16, bf16 and float32. */
  bad = bad || cudaMemset(c->dout, 0xff, c->nq * 2) ||
        cudaMemset(c->dlse, 0xff, c->nlse * sizeof(float));
  return bad;
}

static void case_free(gpu_case *c)
{
  cudaFree(c->dq);
  cudaFree(c->dk);
  cudaFree(c->dv);
  cudaFree(c->dout);
  cudaFree(c->dlse);
  free(c->q);
  free(c->k);
  free(c->v);
  free(c->o);
  free(c->lse);
}

typedef struct ref_job {
  const gpu_case *c;
  int r0, r1;
  double *out, *lse;
  fj_status st;
} ref_job;

static void *ref_thread(void *arg)
{
  ref_job *j = arg;
  j->st = fj_reference_fwd(&j->c->p, j->c->q, j->c->k, j->c->v, NULL, NULL,
                           j->r0, j->r1, j->out, j->lse);
  return NULL;
}

typedef struct errors {
  double rel, lse_max;
  size_t nonfinite;
} errors;

/* Compares rows [r0, r1) of O and LSE with their reference. */
static void compare(const gpu_case *c, const ref_job *j, errors *e,
                    double *d2, double *r2)
{
  const fj_problem *p = &c->p;
  int rows = j->r1 - j->r0, dim = p->head_dim;
  for (int b = 0; b < p->batch; b++)
    for (int h = 0; h < p->heads_q; h++)
      for (int r = 0; r < rows; r++) {
        size_t ri = (size_t)(b * p->heads_q + h) * (size_t)rows + (size_t)r;
        size_t base = (size_t)(b * p->o_stride[0] + h * p->o_stride[1] +
                               (j->r0 + r) * p->o_stride[2]);
        for (int x = 0; x < dim; x++) {
          float f;
          fj_convert(FJ_F32, &f, p->dtype, &c->o[base + (size_t)x], 1);
          double want = j->out[ri * (size_t)dim + (size_t)x], got = f;
          e->nonfinite += isfinite(got) ? 0u : 1u;
          *d2 += (got - want) * (got - want);
          *r2 += want * want;
        }
        double want = j->lse[ri];
        double got = c->lse[(size_t)(b * p->heads_q + h) * (size_t)p->seq_q +
                            (size_t)(j->r0 + r)];
        if (isinf(want) && want < 0)
          e->nonfinite += isinf(got) && got < 0 ? 0u : 1u;
        else if (!isfinite(got))
          e->nonfinite++;
        else
          e->lse_max = fmax(e->lse_max, fabs(got - want));
      }
}

enum { REF_THREADS = 8 };

static int check_case(gpu_case *c, errors *e)
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
    jobs[i].out = malloc(rows * (size_t)p->head_dim * sizeof(double));
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

/* Runs one case with a variant (NULL: the library's choice) and checks it. */
static int run_case(fj_ctx *ctx, gpu_case *c, const fj_variant *v,
                    void *stream, uint64_t *seed, const char *label)
{
  errors e;
  if (case_setup(c, seed)) {
    fprintf(stderr, "%s: CUDA setup failed\n", label);
    return 1;
  }
  fj_status st = v ? fj_attention_fwd_variant(ctx, &c->p, v, c->dq, c->dk,
                                              c->dv, c->dout, c->dlse, stream)
                   : fj_attention_fwd(ctx, &c->p, c->dq, c->dk, c->dv,
                                      c->dout, c->dlse, stream);
  cudaError_t ce = cudaStreamSynchronize((cudaStream_t)stream);
  if (ce == cudaSuccess)
    ce = cudaDeviceSynchronize();
  if (st != FJ_OK || ce != cudaSuccess) {
    fprintf(stderr, "%s: %s %s\n", label, fj_errmsg(ctx),
            cudaGetErrorString(ce));
    case_free(c);
    return 1;
  }
  cudaMemcpy(c->o, c->dout, c->nq * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(c->lse, c->dlse, c->nlse * sizeof(float), cudaMemcpyDeviceToHost);
  int bad = check_case(c, &e);
  bad |= e.nonfinite != 0 || !(e.rel < 1e-2) || !(e.lse_max < 1e-2);
  printf("%-72s rel_err=%.2e lse_max_err=%.1e nonfinite=%zu %s\n", label,
         e.rel, e.lse_max, e.nonfinite, bad ? "FAIL" : "ok");
  case_free(c);
  return bad;
}

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
            char label[160], name[128];
            fj_variant_name(&v, name, sizeof name);
            snprintf(label, sizeof label, "%s %s sq=%d skv=%d", name,
                     order ? "bshd" : "bhsd", sq, skv);
            failed += run_case(ctx, &c, &v, NULL, &seed, label);
            cases++;
          }
  printf("%d of %d cases passed\n", cases - failed, cases);
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
                        "auto (2,8/2,512,64) f16 bshd scale=0.3, own stream");
  memset(&c, 0, sizeof c);
  fj_problem_init(&c.p, 1, 4, 4, 333, 1025, 128, FJ_BF16, FJ_BHSD);
  c.p.causal = FJ_CAUSAL_BOTTOM_RIGHT;
  failed += run_case(ctx, &c, NULL, stream, &seed,
                     "auto (1,4,333/1025,128) bf16 bottom-right, own stream");
  cudaStreamDestroy(stream);
  fj_ctx_destroy(ctx);
  return failed != 0;
}
