/*
 * test_gpu_exact.c -- issue 35, class 5: exact where exactness is
 * expected.  A row whose visible keys all have the same score (one key,
 * two equal keys, every key equal) must return that V row exactly, in the
 * output's dtype: the softmax weights are then equal and sum to one, and
 * nothing rounds.  With bfloat16 and a softcap of 55 or less the kernels
 * take their exponentials against a fixed shift (P is not 1 at the row's
 * max), so P's rounding to bfloat16 must be the sum's too.  The cases run
 * on the library's choice (wgmma on sm_90a) and on the mma family, with
 * and without the modifications (softcap on both softmax paths, windows,
 * both causal alignments), f16 and bf16; the float64 reference agrees on
 * the host (test hostile_b_reference_exact, no GPU needed).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "runner.h"

/* One exactness case: the problem's shape and masks; keys_equal: every
 * key of a (batch, head) has the same K and V row (else each key its
 * own random rows, and the window (0, 0) shows each row one key). */
typedef struct exact_case {
  const char *name;
  int sq, skv, d;
  fj_dtype dt;
  fj_causal causal;
  int keys_equal;
  int wl, wr;   /* window; -1 -1: none */
  float cap;    /* softcap; 0: none */
} exact_case;

static uint64_t rng(uint64_t *s)
{
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 33;
}

/* n random 16-bit values of dtype dt, about uniform in [-amp, amp]. */
static void fill(uint16_t *x, size_t n, fj_dtype dt, float amp, uint64_t *s)
{
  float *f = malloc(n * sizeof *f);
  for (size_t i = 0; i < n; i++)
    f[i] = amp * ((float)(rng(s) % 2001) / 1000.f - 1.f);
  fj_convert(dt, x, FJ_F32, f, n);
  free(f);
}

/* The key a row's output must equal: with every key equal, key 0; with a
 * window (0, 0), the row's own diagonal key (bottom-right alignment
 * without a causal mask: q + skv - sq). */
static int key_of(const exact_case *c, int q)
{
  if (c->keys_equal)
    return 0;
  return c->causal == FJ_CAUSAL_TOP_LEFT ? q : q + c->skv - c->sq;
}

/* The host inputs of case c (b = 2, 4 query heads over 2 KV heads, BSHD). */
typedef struct exact_inputs {
  fj_problem p;
  fj_mods m;
  uint16_t *q, *k, *v;
  size_t nq, nk;
} exact_inputs;

enum { EB = 2, EHQ = 4, EHKV = 2 };

static void inputs_make(const exact_case *c, exact_inputs *in, uint64_t *seed)
{
  const int d = c->d;
  fj_problem_init(&in->p, EB, EHQ, EHKV, c->sq, c->skv, d, c->dt, FJ_BSHD);
  in->p.causal = c->causal;
  fj_mods_init(&in->m);
  in->m.window_left = c->wl;
  in->m.window_right = c->wr;
  in->m.softcap = c->cap;
  in->p.mods = &in->m;
  in->nq = (size_t)EB * (size_t)c->sq * EHQ * (size_t)d;
  in->nk = (size_t)EB * (size_t)c->skv * EHKV * (size_t)d;
  in->q = malloc(in->nq * 2);
  in->k = malloc(in->nk * 2);
  in->v = malloc(in->nk * 2);
  /* Scores of a few tens: the softcap's tanh bends them, the fixed
   * shift's P runs far from 1. */
  fill(in->q, in->nq, c->dt, 3.f, seed);
  fill(in->k, in->nk, c->dt, 3.f, seed);
  fill(in->v, in->nk, c->dt, 4.f, seed);
  if (c->keys_equal)
    for (int bb = 0; bb < EB; bb++)
      for (int j = 1; j < c->skv; j++) {
        size_t row = (size_t)(bb * c->skv + j) * EHKV * (size_t)d;
        size_t first = (size_t)(bb * c->skv) * EHKV * (size_t)d;
        memcpy(in->k + row, in->k + first, (size_t)EHKV * (size_t)d * 2);
        memcpy(in->v + row, in->v + first, (size_t)EHKV * (size_t)d * 2);
      }
}

static void inputs_free(exact_inputs *in)
{
  free(in->q);
  free(in->k);
  free(in->v);
}

/* The index in V of the element output element (bb, i, h, x) must equal. */
static size_t v_index(const exact_case *c, int bb, int i, int h, int x)
{
  return ((size_t)(bb * c->skv + key_of(c, i)) * EHKV +
          (size_t)(h / (EHQ / EHKV))) * (size_t)c->d + (size_t)x;
}

/* The elements of o (n, BSHD like q) that differ from their V element;
 * the first in *first. */
static long differ(const exact_case *c, const uint16_t *o,
                   const uint16_t *v, long *first)
{
  long wrong = 0;
  for (int bb = 0; bb < EB; bb++)
    for (int i = 0; i < c->sq; i++)
      for (int h = 0; h < EHQ; h++)
        for (int x = 0; x < c->d; x++) {
          size_t at = ((size_t)(bb * c->sq + i) * EHQ + (size_t)h) * (size_t)c->d + (size_t)x;
          if (o[at] != v[v_index(c, bb, i, h, x)] && !wrong++)
            *first = (long)at;
        }
  return wrong;
}

/* Runs c with variant v (NULL: the library's choice): every element of O
 * equal, bit for bit, to V's row of the row's key.  0, or 1 (printed). */
static int exact_run(fj_ctx *ctx, const exact_case *c, const fj_variant *v,
                     uint64_t *seed)
{
  exact_inputs in;
  inputs_make(c, &in, seed);
  uint16_t *o = malloc(in.nq * 2);
  void *dq = NULL, *dk = NULL, *dv = NULL, *dout = NULL;
  int bad = cudaMalloc(&dq, in.nq * 2) || cudaMalloc(&dk, in.nk * 2) ||
            cudaMalloc(&dv, in.nk * 2) || cudaMalloc(&dout, in.nq * 2) ||
            cudaMemcpy(dq, in.q, in.nq * 2, cudaMemcpyHostToDevice) ||
            cudaMemcpy(dk, in.k, in.nk * 2, cudaMemcpyHostToDevice) ||
            cudaMemcpy(dv, in.v, in.nk * 2, cudaMemcpyHostToDevice) ||
            cudaMemset(dout, 0xff, in.nq * 2);  /* poisoned: NaN */
  fj_status st = bad ? FJ_ERR_CUDA
                 : v ? fj_attention_fwd_variant(ctx, &in.p, v, dq, dk, dv, dout, NULL, NULL)
                     : fj_attention_fwd(ctx, &in.p, dq, dk, dv, dout, NULL, NULL);
  if (st == FJ_OK && (cudaDeviceSynchronize() ||
                      cudaMemcpy(o, dout, in.nq * 2, cudaMemcpyDeviceToHost)))
    st = FJ_ERR_CUDA;
  long first = 0, wrong = st == FJ_OK ? differ(c, o, in.v, &first) : 0;
  printf("%-4s %-52s %s: %ld of %zu elements differ from V%s\n",
         st == FJ_OK && !wrong ? "ok" : "FAIL", c->name, !v ? "chosen" : v->mma == FJ_MMA_WGMMA ? "wgmma " : "mma   ",
         wrong, in.nq, st == FJ_OK ? "" : " (call failed)");
  if (st != FJ_OK)
    printf("     %s\n", fj_errmsg(ctx));
  else if (wrong)
    printf("     the first at element %ld: 0x%04x\n", first, o[first]);
  cudaFree(dq);
  cudaFree(dk);
  cudaFree(dv);
  cudaFree(dout);
  free(o);
  inputs_free(&in);
  return st != FJ_OK || wrong;
}

static const exact_case exact_cases[] = {
    /* one key a row: a window (0, 0) on random keys */
    {"one key (window 0,0), bf16", 256, 256, 128, FJ_BF16, FJ_CAUSAL_NONE, 0, 0, 0, 0},
    {"one key (window 0,0), bf16, softcap 15", 256, 256, 128, FJ_BF16, FJ_CAUSAL_NONE, 0, 0, 0, 15},
    {"one key (window 0,0), bf16, softcap 50", 256, 256, 128, FJ_BF16, FJ_CAUSAL_NONE, 0, 0, 0, 50},
    {"one key (window 0,0), bf16, softcap 55, d64", 256, 384, 64, FJ_BF16, FJ_CAUSAL_NONE, 0, 0, 0, 55},
    {"one key (window 0,0), bf16, softcap 100", 256, 256, 128, FJ_BF16, FJ_CAUSAL_NONE, 0, 0, 0, 100},
    {"one key (window 0,0), f16, softcap 30", 256, 256, 128, FJ_F16, FJ_CAUSAL_NONE, 0, 0, 0, 30},
    {"one key (causal top-left, window 0), bf16, softcap 30", 256, 256, 128, FJ_BF16, FJ_CAUSAL_TOP_LEFT, 0, 0, 0, 30},
    {"one key (causal bottom-right, window 0), cap 15, d64", 200, 300, 64, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, 15},
    /* one key: seq_kv 1 */
    {"seq_kv 1, bf16, softcap 15", 128, 1, 128, FJ_BF16, FJ_CAUSAL_NONE, 1, -1, -1, 15},
    {"seq_kv 1, bf16", 128, 1, 128, FJ_BF16, FJ_CAUSAL_NONE, 1, -1, -1, 0},
    /* two equal keys: a window (1, 0) over equal keys */
    {"two equal keys (window 1,0), bf16, softcap 15", 256, 256, 128, FJ_BF16, FJ_CAUSAL_NONE, 1, 1, 0, 15},
    {"two equal keys (window 1,0), bf16, softcap 50", 256, 256, 64, FJ_BF16, FJ_CAUSAL_NONE, 1, 1, 0, 50},
    /* every key equal: rows see 1 .. n of them (causal) or all */
    {"all keys equal, causal, bf16, softcap 15", 256, 256, 128, FJ_BF16, FJ_CAUSAL_TOP_LEFT, 1, -1, -1, 15},
    {"all keys equal, bf16, softcap 50", 256, 512, 128, FJ_BF16, FJ_CAUSAL_NONE, 1, -1, -1, 50},
    {"all keys equal, bf16, softcap 30, d256", 128, 256, 256, FJ_BF16, FJ_CAUSAL_NONE, 1, -1, -1, 30},
    {"all keys equal, causal, bf16", 256, 256, 128, FJ_BF16, FJ_CAUSAL_TOP_LEFT, 1, -1, -1, 0},
    {"all keys equal, causal, f16, softcap 30", 256, 256, 64, FJ_F16, FJ_CAUSAL_TOP_LEFT, 1, -1, -1, 30},
    /* decode: GQA packing and split-KV with their combine (the choice) */
    {"decode, all 4096 keys equal, bf16, softcap 15", 1, 4096, 128, FJ_BF16, FJ_CAUSAL_NONE, 1, -1, -1, 15},
    {"decode, one key, bf16, softcap 50", 1, 1, 128, FJ_BF16, FJ_CAUSAL_NONE, 1, -1, -1, 50},
};

/* The mma family's variant for the case. */
static void mma_of(const exact_case *c, fj_variant *v, const fj_mods *m)
{
  fj_variant_default(v, c->d, c->dt, c->causal);
  v->mma = FJ_MMA_SYNC;
  v->softmax = FJ_SOFTMAX_REGS;
  v->swizzle = FJ_SWIZZLE_XOR;
  v->tile_m = 128;
  v->warps = 8;
  v->stages = 2;
  v->tile_n = c->d <= 64 ? 128 : 64;
  v->mods = m;
}

/* The wgmma family's variant for the case (sm_90a). */
static void wgmma_of(const exact_case *c, fj_variant *v, const fj_mods *m)
{
  mma_of(c, v, m);
  v->mma = FJ_MMA_WGMMA;
  v->warps = 12;
  v->tile_n = c->d <= 64 ? 128 : c->d <= 128 ? 64 : 32;
}

int test_gpu_exact_single_key(void)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(NULL, &ctx);
  if (rc)
    return rc;
  uint64_t seed = 35;
  int failed = 0;
  for (size_t i = 0; i < sizeof exact_cases / sizeof exact_cases[0]; i++) {
    const exact_case *c = &exact_cases[i];
    failed += exact_run(ctx, c, NULL, &seed);
    fj_mods m;
    fj_mods_init(&m);
    m.window_left = c->wl;
    m.window_right = c->wr;
    m.softcap = c->cap;
    fj_variant v;
    mma_of(c, &v, &m);
    failed += exact_run(ctx, c, &v, &seed);
    wgmma_of(c, &v, &m);
    if (c->sq >= 128 && fj_variant_check(ctx, &v) == FJ_OK)  /* sm_90a */
      failed += exact_run(ctx, c, &v, &seed);
  }
  fj_ctx_destroy(ctx);
  CHECK(failed == 0);
  return 0;
}

/* The float64 reference agrees: the same cases give V exactly once O is
 * rounded to the output's dtype (no GPU needed). */
int test_hostile_b_reference_exact(void)
{
  uint64_t seed = 35;
  for (size_t i = 0; i < sizeof exact_cases / sizeof exact_cases[0]; i++) {
    const exact_case *c = &exact_cases[i];
    exact_inputs in;
    inputs_make(c, &in, &seed);
    double *out = malloc(in.nq * sizeof *out);
    float *f = malloc(in.nq * sizeof *f);
    uint16_t *o = malloc(in.nq * 2);
    CHECK(fj_reference_fwd(&in.p, in.q, in.k, in.v, NULL, NULL, 0, c->sq,
                           out, NULL) == FJ_OK);
    /* out is [b][h][row][d]; o as the kernel writes it, BSHD. */
    for (int bb = 0; bb < EB; bb++)
      for (int h = 0; h < EHQ; h++)
        for (int r = 0; r < c->sq; r++)
          for (int x = 0; x < c->d; x++)
            f[((size_t)(bb * c->sq + r) * EHQ + (size_t)h) * (size_t)c->d + (size_t)x] =
                (float)out[(((size_t)bb * EHQ + (size_t)h) * (size_t)c->sq + (size_t)r) * (size_t)c->d + (size_t)x];
    CHECK(fj_convert(c->dt, o, FJ_F32, f, in.nq) == FJ_OK);
    long first = 0, wrong = differ(c, o, in.v, &first);
    if (wrong)
      fprintf(stderr, "%s: the reference differs from V in %ld elements\n",
              c->name, wrong);
    CHECK(wrong == 0);
    free(out);
    free(f);
    free(o);
    inputs_free(&in);
  }
  return 0;
}
