/*
 * test_gpu_int_ops.c -- the expressions' int operations where C has no
 * meaning (issue 35, class 3) on a GPU: division and remainder by 0,
 * INT_MIN / -1, overflow of +, - and *, negation and abs of INT_MIN,
 * shifts by 32 or more or by a negative count, (int) of a float out of
 * range or NaN.  Each case's mask shows a row one key (or none) that those
 * operations choose, or its score leaves one of two keys a weight above 0,
 * so a row's output is that key's V row exactly: the kernel's O must equal
 * the float64 reference's (src/reference.c, the host's evaluator), rounded
 * to the output's dtype, element for element -- on the library's choice,
 * the mma family and (sm_90a) the wgmma family.  The operands are
 * parameters (constants would be refused at check time).  mods_int_ops_reference
 * checks, without a GPU, that the reference gives the documented results.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "runner.h"

#define LEN(a) (sizeof(a) / sizeof((a)[0]))

enum { IB = 1, IH = 2, IS = 300, ID = 64 };

/* A case: its mask and score, and the key the documented meaning of its
 * operations shows row q (-1: none). */
typedef struct int_case {
  const char *name, *mask, *score;
  int (*key)(int q);
} int_case;

static int key_same(int q) { return q; }
static int key_even_rows(int q) { return q % 2 ? -1 : q; }
static int key_first_moves(int q) { return q ? q : 1; }
static int key_mul(int q) { return q == 0 || q % 2 ? q + 1 : q; }
static int key_odd_next(int q) { return q + q % 2; }
static int key_even_next(int q) { return q && q % 2 == 0 ? q + 1 : q; }
static int key_next(int q) { return q + 1; }

/* The score cases' mask: a row sees its own key and the next; the score
 * leaves `kv == X` its score and gives the other -1e30 (weight 0). */
#define TWO_KEYS "kv == q || kv == q + 1"
#define ONLY(x) "kv == (" x ") ? s : s - 1e30f"

static const int_case int_cases[] = {
    {"x / 0 (odd rows see no key)", "kv == q / z + q + 1000 * (q & 1)", NULL, key_even_rows},
    {"x % 0", "kv == q % z + q", NULL, key_same},
    {"INT_MIN / -1", "kv == (imin / m1 == imin ? q : q + 1)", NULL, key_same},
    {"INT_MIN % -1, x % -1, x / -1", "kv == q % m1 + imin % m1 - q / m1", NULL, key_same},
    {"+ overflows", "kv == (q + big < big ? q : q + 1)", NULL, key_first_moves},
    {"- overflows", "kv == (imin - q > 0 ? q : q + 1)", NULL, key_first_moves},
    {"* overflows", "kv == (q * big < 0 ? q : q + 1)", NULL, key_mul},
    {"-INT_MIN, abs(INT_MIN)", "kv == (-imin == imin && abs(imin) < 0 ? q : q + 1)", NULL, key_same},
    {"<< by 32, 40, -1", "kv == (q << s32) + (q << s40) + ((q + 1) << sneg) + q", NULL, key_same},
    {">> by 32, 40, -1", "kv == ((-1 - q) >> s32) + (imin >> s40) + (q >> sneg) + q + 2", NULL, key_same},
    {"(int) of 1e10f, -1e10f, NaN",
     "kv == ((int)huge == big && (int)(-huge) == imin ? q : q + 1) + (int)(huge * huge * 0.f)", NULL, key_same},
    {"score: x / 0, x % 0", TWO_KEYS, ONLY("q + (q / z == 0 ? q % 2 : 1 - q % 2) + q % z"), key_odd_next},
    {"score: * overflows", TWO_KEYS, ONLY("q + (q * big < 0 ? 1 : 0)"), key_even_next},
    {"score: shifts by 32, 40", TWO_KEYS, ONLY("q + ((q << s32) == 0 && (q >> s40) == 0 ? 1 : 0)"), key_next},
};

/* The parameters every case gets (the operands). */
static const fj_mod_param int_params[] = {
    {"z", FJ_MOD_I32, 0, {0}, NULL, 0},
    {"m1", FJ_MOD_I32, 0, {0}, NULL, -1},
    {"big", FJ_MOD_I32, 0, {0}, NULL, 2147483647.0},
    {"imin", FJ_MOD_I32, 0, {0}, NULL, -2147483648.0},
    {"s32", FJ_MOD_I32, 0, {0}, NULL, 32},
    {"s40", FJ_MOD_I32, 0, {0}, NULL, 40},
    {"sneg", FJ_MOD_I32, 0, {0}, NULL, -1},
    {"huge", FJ_MOD_F32, 0, {0}, NULL, 1e10},
};

/* The key row q sees: the case's, where it lies in the sequence; a
 * score case's row sees only its own key where the next is past the end. */
static int key_of(const int_case *c, int q)
{
  int k = c->key(q);
  if (c->score && k >= IS)
    return q;
  return k >= 0 && k < IS ? k : -1;
}

typedef struct int_inputs {
  fj_problem p;
  fj_mods m;
  uint16_t q[IB * IS * IH * ID], k[IB * IS * IH * ID], v[IB * IS * IH * ID];
} int_inputs;

static uint64_t rng(uint64_t *s)
{
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 33;
}

static void fill(uint16_t *x, size_t n, uint64_t *s)
{
  float *f = malloc(n * sizeof *f);
  for (size_t i = 0; i < n; i++)
    f[i] = 2.f * ((float)(rng(s) % 2001) / 1000.f - 1.f);
  fj_convert(FJ_F16, x, FJ_F32, f, n);
  free(f);
}

static void inputs_make(const int_case *c, int_inputs *in)
{
  uint64_t seed = 35;
  fj_problem_init(&in->p, IB, IH, IH, IS, IS, ID, FJ_F16, FJ_BSHD);
  fj_mods_init(&in->m);
  in->m.mask = c->mask;
  in->m.score = c->score;
  in->m.params = int_params;
  in->m.num_params = (int)LEN(int_params);
  in->p.mods = &in->m;
  fill(in->q, LEN(in->q), &seed);
  fill(in->k, LEN(in->k), &seed);
  fill(in->v, LEN(in->v), &seed);
}

/* The reference's O (BSHD, as the kernels write it) rounded to f16; the
 * reference writes [batch][head][row][dim].  0, or 1 (printed). */
static int reference_f16(const int_inputs *in, uint16_t *o)
{
  enum { N = IB * IH * IS * ID };
  double *ref = malloc(N * sizeof *ref);
  float *f = malloc(N * sizeof *f);
  int bad = !ref || !f ||
            fj_reference_fwd(&in->p, in->q, in->k, in->v, NULL, NULL, 0, IS,
                             ref, NULL) != FJ_OK;
  if (bad)
    fprintf(stderr, "reference: %s\n", fj_errmsg(NULL));
  for (int b = 0; !bad && b < IB; b++)
    for (int h = 0; h < IH; h++)
      for (int i = 0; i < IS; i++)
        for (int x = 0; x < ID; x++)
          f[((b * IS + i) * IH + h) * ID + x] = (float)ref[((b * IH + h) * IS + i) * ID + x];
  if (!bad)
    fj_convert(FJ_F16, o, FJ_F32, f, N);
  free(ref);
  free(f);
  return bad;
}

/* How many elements of o (f16, BSHD) differ in value from want's. */
static long differ(const uint16_t *o, const uint16_t *want, long *first)
{
  enum { N = IB * IH * IS * ID };
  static float a[N], b[N];
  fj_convert(FJ_F32, a, FJ_F16, o, N);
  fj_convert(FJ_F32, b, FJ_F16, want, N);
  long wrong = 0;
  for (long i = 0; i < N; i++)
    if (!(a[i] == b[i]) && !wrong++)
      *first = i;
  return wrong;
}

/* ---- without a GPU: the reference gives the documented keys -------------- */

int test_mods_int_ops_reference(void)
{
  static int_inputs in;
  static uint16_t o[IB * IS * IH * ID], want[IB * IS * IH * ID];
  int failed = 0;
  for (size_t c = 0; c < LEN(int_cases); c++) {
    inputs_make(&int_cases[c], &in);
    CHECK(reference_f16(&in, o) == 0);
    for (int b = 0; b < IB; b++)
      for (int i = 0; i < IS; i++)
        for (int h = 0; h < IH; h++) {
          int key = key_of(&int_cases[c], i);
          uint16_t *row = want + ((b * IS + i) * IH + h) * ID;
          if (key < 0)
            memset(row, 0, ID * sizeof *row);
          else
            memcpy(row, in.v + ((b * IS + key) * IH + h) * ID, ID * sizeof *row);
        }
    long first = 0, wrong = differ(o, want, &first);
    if (wrong) {
      fprintf(stderr, "%s: %ld elements of the reference differ from the "
                      "documented key's V, the first at %ld (row %ld)\n",
              int_cases[c].name, wrong, first, first / (IH * ID));
      failed++;
    }
  }
  return failed != 0;
}

/* ---- on a GPU: the kernels agree with the reference ------------------------ */

/* The mma family's variant, 8 warps over 128 rows; or the wgmma
 * family's, 12 warps (the library picks smaller mma tiles for this
 * problem, on sm_90a too). */
static void family_of(fj_variant *v, const fj_mods *m, fj_mma mma)
{
  fj_variant_default(v, ID, FJ_F16, FJ_CAUSAL_NONE);
  v->mma = mma;
  v->softmax = FJ_SOFTMAX_REGS;
  v->swizzle = FJ_SWIZZLE_XOR;
  v->tile_m = 128;
  v->warps = mma == FJ_MMA_WGMMA ? 12 : 8;
  v->stages = 2;
  v->tile_n = 128;
  v->mods = m;
}

/* ---- without a GPU: a row max of -1e30 in the online softmax ------------- */

/* The score cases leave some rows one visible key in a tile, at s - 1e30f:
 * the last row of a key tile where its key is the next tile's, and the
 * last row.  The softmax took P = 2^(x * sl2 - mu), one FMA, with mu the
 * max times sl2 rounded: at the max, P was 2 to that rounding error, about
 * 2^72 at -1e30 -- P inf, and the row NaN ("score: shifts by 32, 40" on an
 * H200: 640, 384 and 384 elements, the last rows of the key tiles and row
 * 299).  The arithmetic, then the kernels' rule (softmax_regs.cuh): a row
 * whose max has magnitude 2^12 or more (common.cuh's big_max) takes its
 * scores less the max. */
int test_mods_int_ops_softmax(void)
{
  volatile float max = -1e30f, sl2 = 1.44269504089f;
  float mu = max * sl2;
  CHECK(fabsf(fmaf(max, sl2, -mu)) > 128.f);  /* 2^that: inf or 0 */
  CHECK(exp2f(fmaf(max - max, sl2, -0.f)) == 1.f);
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  static int_inputs in;
  inputs_make(&int_cases[LEN(int_cases) - 1], &in);
  static const fj_mma fams[] = {FJ_MMA_SYNC, FJ_MMA_WGMMA};
  for (int f = 0; f < 2; f++) {
    fj_variant v;
    fj_kernel *k;
    family_of(&v, &in.m, fams[f]);
    CHECK_OK(ctx, fj_kernel_get(ctx, &v, &k));
    const char *src = fj_kernel_source(k, NULL);
    CHECK(strstr(src, "s - 1e+30f"));
    CHECK(strstr(src, "if (__any_sync(0xffffffffu, fj::big_max(mk1) || "));
    CHECK(strstr(src, "const float off1 = fj::big_max(mk1) ? mk1 : 0.f;"));
    CHECK(strstr(src, "-= off1;"));
    /* mu 0, and O's factor less the same rounding error. */
    CHECK(strstr(src, "ea1 -= fmaf(mk1, sl2, -mu1);\n          mu1 = 0.f;"));
    CHECK(strstr(src, "= fj::fast_exp2(ea1);"));
  }
  fj_ctx_destroy(ctx);
  return 0;
}

/* Runs c with v (NULL: the library's choice): O equal to the reference's,
 * element for element.  0, or 1 (printed). */
static int int_run(fj_ctx *ctx, const int_case *c, const fj_variant *v,
                   const int_inputs *in, const uint16_t *want)
{
  enum { N = IB * IH * IS * ID, BYTES = N * 2 };
  static uint16_t o[N];
  void *dq = NULL, *dk = NULL, *dv = NULL, *dout = NULL;
  int bad = cudaMalloc(&dq, BYTES) || cudaMalloc(&dk, BYTES) ||
            cudaMalloc(&dv, BYTES) || cudaMalloc(&dout, BYTES) ||
            cudaMemcpy(dq, in->q, BYTES, cudaMemcpyHostToDevice) ||
            cudaMemcpy(dk, in->k, BYTES, cudaMemcpyHostToDevice) ||
            cudaMemcpy(dv, in->v, BYTES, cudaMemcpyHostToDevice) ||
            cudaMemset(dout, 0xff, BYTES);  /* poisoned: NaN */
  fj_status st = bad ? FJ_ERR_CUDA
                 : v ? fj_attention_fwd_variant(ctx, &in->p, v, dq, dk, dv, dout, NULL, NULL)
                     : fj_attention_fwd(ctx, &in->p, dq, dk, dv, dout, NULL, NULL);
  if (st == FJ_OK && (cudaDeviceSynchronize() ||
                      cudaMemcpy(o, dout, BYTES, cudaMemcpyDeviceToHost)))
    st = FJ_ERR_CUDA;
  long first = 0, wrong = st == FJ_OK ? differ(o, want, &first) : 0;
  printf("%-4s %-40s %s: %ld of %d elements differ from the reference%s\n",
         st == FJ_OK && !wrong ? "ok" : "FAIL", c->name,
         !v ? "chosen" : v->mma == FJ_MMA_WGMMA ? "wgmma " : "mma   ",
         wrong, N, st == FJ_OK ? "" : " (call failed)");
  if (st != FJ_OK)
    printf("     %s\n", fj_errmsg(ctx));
  else if (wrong)
    printf("     the first at row %ld\n", first / (IH * ID));
  cudaFree(dq);
  cudaFree(dk);
  cudaFree(dv);
  cudaFree(dout);
  return st != FJ_OK || wrong;
}

int test_gpu_mods_int_ops(void)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(NULL, &ctx);
  if (rc)
    return rc;
  static int_inputs in;
  static uint16_t want[IB * IS * IH * ID];
  int failed = 0;
  for (size_t c = 0; c < LEN(int_cases); c++) {
    inputs_make(&int_cases[c], &in);
    CHECK(reference_f16(&in, want) == 0);
    failed += int_run(ctx, &int_cases[c], NULL, &in, want);
    fj_variant v;
    family_of(&v, &in.m, FJ_MMA_SYNC);
    failed += int_run(ctx, &int_cases[c], &v, &in, want);
    family_of(&v, &in.m, FJ_MMA_WGMMA);
    if (fj_variant_check(ctx, &v) == FJ_OK)  /* sm_90a */
      failed += int_run(ctx, &int_cases[c], &v, &in, want);
  }
  fj_ctx_destroy(ctx);
  CHECK(failed == 0);
  return 0;
}
