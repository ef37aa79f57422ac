/*
 * test_gpu_mods.c -- score and mask modifications on a GPU (label gpu;
 * skipped where there is none), against the float64 reference, whose
 * semantics test_mods.c checks against the formulas: the window (both
 * sides, both alignments, with and without the causal mask), the softcap
 * with inputs x30 on both of its softmax paths (a fixed shift, the running
 * max), ALiBi from a slopes tensor, a bias table read past both
 * ends, document ids, masks that hide whole rows, whole tiles and all tiles
 * but one, integer arithmetic and ternaries -- on the library's choice (the
 * wgmma family on sm_90a prefill) and on the mma family, prefill and decode
 * (GQA packing, split-KV).  Attention sinks (per-head logits in the
 * denominator) on both families, with rows that see no key (O 0, LSE the
 * sink), GQA-packed decode and split-KV decode whose later splits have no
 * keys.  Outputs are poisoned before each launch.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "gpu_case.h"
#include "runner.h"

/* A tensor parameter in both memories: host for the reference, device for
 * the kernel. */
typedef struct twin {
  fj_mod_param host[FJ_MOD_PARAMS_MAX], dev[FJ_MOD_PARAMS_MAX];
  void *buf[FJ_MOD_PARAMS_MAX];
  void *sinks;  /* the device copy of hm.sinks */
  fj_mods hm, dm;
} twin;

static size_t elem_bytes(fj_mod_type t)
{
  return t == FJ_MOD_F16 || t == FJ_MOD_BF16 ? 2 : 4;
}

/* Adds a tensor parameter with host data `data` (n elements of type t). */
static int twin_tensor(twin *w, const char *name, fj_mod_type t, int rank,
                       const int64_t *ext, const void *data)
{
  int i = w->hm.num_params++;
  size_t n = 1;
  fj_mod_param p = {name, t, rank, {0}, data, 0};
  for (int d = 0; d < rank; d++) {
    p.extents[d] = ext[d];
    n *= (size_t)ext[d];
  }
  w->host[i] = w->dev[i] = p;
  if (cudaMalloc(&w->buf[i], n * elem_bytes(t)) != cudaSuccess ||
      cudaMemcpy(w->buf[i], data, n * elem_bytes(t), cudaMemcpyHostToDevice) != cudaSuccess)
    return 1;
  w->dev[i].data = w->buf[i];
  w->dm.num_params = w->hm.num_params;
  return 0;
}

static void twin_scalar(twin *w, const char *name, fj_mod_type t, double value)
{
  int i = w->hm.num_params++;
  w->host[i] = w->dev[i] = (fj_mod_param){name, t, 0, {0}, NULL, value};
  w->dm.num_params = w->hm.num_params;
}

static void twin_init(twin *w, const char *score, const char *mask)
{
  memset(w, 0, sizeof *w);
  fj_mods_init(&w->hm);
  w->hm.score = score;
  w->hm.mask = mask;
  w->hm.params = w->host;
  w->dm = w->hm;
  w->dm.params = w->dev;
}

static void twin_free(twin *w)
{
  for (int i = 0; i < FJ_MOD_PARAMS_MAX; i++)
    cudaFree(w->buf[i]);
  cudaFree(w->sinks);
}

/* Sinks: host (the reference's) and a device copy (the kernel's) of n. */
static int twin_sinks(twin *w, const float *host, int n)
{
  size_t bytes = (size_t)n * sizeof *host;
  if (cudaMalloc(&w->sinks, bytes) != cudaSuccess ||
      cudaMemcpy(w->sinks, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess)
    return 1;
  w->hm.sinks = host;
  w->dm.sinks = w->sinks;
  return 0;
}

/* The problem's splits for the cases that follow (0: the library's). */
static int case_splits;

/* The mma family's variant for p (on sm_90a the library would pick the
 * wgmma family for prefill): 8 warps over 128 rows, 2 stages. */
static void mma_variant(const fj_problem *p, fj_variant *v)
{
  fj_variant_default(v, p->head_dim, p->dtype, p->causal);
  v->mma = FJ_MMA_SYNC;
  v->softmax = FJ_SOFTMAX_REGS;
  v->swizzle = FJ_SWIZZLE_XOR;
  v->tile_m = 128;
  v->warps = 8;
  v->stages = 2;
  v->tile_n = p->head_dim <= 64 ? 128 : 64;
  v->mods = p->mods;
}

typedef struct mod_case {
  const char *name;
  int b, hq, hkv, sq, skv, d;
  fj_dtype dt;
  fj_causal causal;
  float input_scale;
} mod_case;

/* Runs a case with the twin's mods on the library's choice and, where that
 * is not the mma family, on the mma family too. */
static int run_mod_case(fj_ctx *ctx, const mod_case *mc, twin *w, uint64_t *seed)
{
  int bad = 0;
  for (int family = 0; family < 2; family++) {
    gpu_case c;
    memset(&c, 0, sizeof c);
    fj_problem_init(&c.p, mc->b, mc->hq, mc->hkv, mc->sq, mc->skv, mc->d, mc->dt, FJ_BHSD);
    c.p.causal = mc->causal;
    c.p.splits = case_splits;
    c.p.mods = &w->dm;
    c.host_mods = &w->hm;
    c.input_scale = mc->input_scale;
    fj_plan plan;
    if (fj_attention_plan(ctx, &c.p, &plan) != FJ_OK) {
      fprintf(stderr, "%s: plan: %s\n", mc->name, fj_errmsg(ctx));
      return 1;
    }
    fj_variant v = plan.variant;
    if (family == 1) {
      if (plan.variant.mma == FJ_MMA_SYNC)
        break;  /* the library's choice was the mma family already */
      mma_variant(&c.p, &v);
    }
    char name[200], label[320];
    fj_variant_name(&v, name, sizeof name);
    snprintf(label, sizeof label, "%s: %s (%d,%d/%d,%d/%d,%d)", mc->name, name,
             mc->b, mc->hq, mc->hkv, mc->sq, mc->skv, mc->d);
    bad |= fjt_gpu_run(ctx, &c, family ? &v : NULL, NULL, seed, label,
                       family ? "mma" : "auto");
  }
  return bad;
}

/* A distance table that covers every position its kernel's tiles reach
 * ("bias", e0 x e1 floats): the plan proves it (fj_variant.table_inside:
 * the kernel reads it at its row pointer alone), and the case runs as the
 * others, on the mma family's variant too (no proof: the accessor path). */
static int inside_case(fj_ctx *ctx, const mod_case *mc, const char *score, int64_t e0,
                       int64_t e1, uint64_t *seed)
{
  float *tab = malloc((size_t)(e0 * e1) * sizeof *tab);
  if (!tab)
    return 1;
  for (int64_t i = 0; i < e0 * e1; i++)
    tab[i] = (float)((i * 29) % 89) / 44.f - 1.f;
  twin w;
  twin_init(&w, score, NULL);
  int bad = twin_tensor(&w, "bias", FJ_MOD_F32, 2, (int64_t[]){e0, e1}, tab);
  fj_problem p;
  fj_problem_init(&p, mc->b, mc->hq, mc->hkv, mc->sq, mc->skv, mc->d, mc->dt, FJ_BHSD);
  p.causal = mc->causal;
  p.mods = &w.dm;
  fj_plan plan;
  if (!bad && (fj_attention_plan(ctx, &p, &plan) != FJ_OK || !plan.variant.table_inside)) {
    fprintf(stderr, "%s: the plan does not prove the table inside (%s)\n", mc->name,
            fj_errmsg(ctx));
    bad = 1;
  }
  bad |= run_mod_case(ctx, mc, &w, seed);
  twin_free(&w);
  free(tab);
  return bad;
}

static int window_case(fj_ctx *ctx, const mod_case *mc, int left, int right,
                       uint64_t *seed)
{
  twin w;
  twin_init(&w, NULL, NULL);
  w.hm.window_left = w.dm.window_left = left;
  w.hm.window_right = w.dm.window_right = right;
  int bad = run_mod_case(ctx, mc, &w, seed);
  twin_free(&w);
  return bad;
}

int test_gpu_mods_builtins(void)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(fjt_tmpdir(), &ctx);
  if (rc)
    return rc;
  uint64_t seed = 31;
  int bad = 0;
  const mod_case pre = {"window", 2, 8, 8, 640, 640, 128, FJ_BF16, FJ_CAUSAL_NONE, 1};
  bad |= window_case(ctx, &pre, 128, 0, &seed);
  bad |= window_case(ctx, &pre, 0, 0, &seed);
  bad |= window_case(ctx, &pre, 100, 37, &seed);
  bad |= window_case(ctx, &pre, -1, 200, &seed);
  const mod_case tl = {"window top-left", 2, 8, 8, 640, 640, 128, FJ_F16, FJ_CAUSAL_TOP_LEFT, 1};
  bad |= window_case(ctx, &tl, 0, 0, &seed);
  bad |= window_case(ctx, &tl, 200, -1, &seed);
  /* Sq != Skv both ways, GQA 4:1, bottom-right alignment. */
  const mod_case ne = {"window sq<skv", 1, 8, 2, 300, 700, 64, FJ_F16, FJ_CAUSAL_NONE, 1};
  bad |= window_case(ctx, &ne, 100, 50, &seed);
  const mod_case ne2 = {"window sq>skv", 1, 8, 2, 700, 300, 64, FJ_F16, FJ_CAUSAL_BOTTOM_RIGHT, 1};
  bad |= window_case(ctx, &ne2, 64, -1, &seed);
  /* Softcap 30 and 50 with logits x30. */
  static const float caps[2] = {30.f, 50.f};
  for (int i = 0; i < 2; i++) {
    const mod_case sc = {i ? "softcap 50" : "softcap 30", 2, 8, 8, 512, 512, 128,
                         FJ_BF16, i ? FJ_CAUSAL_BOTTOM_RIGHT : FJ_CAUSAL_NONE, 30};
    twin w;
    twin_init(&w, NULL, NULL);
    w.hm.softcap = w.dm.softcap = caps[i];
    bad |= run_mod_case(ctx, &sc, &w, &seed);
    twin_free(&w);
  }
  /* The softcap's two softmax paths (mods.c's fixed shift): bfloat16 caps
   * up to 55 shift by a constant (45: by 25), a cap of 80 and f16 keep
   * the running max; every score at -cap (P at e^-70 under the shift);
   * rows that see no key under the shift (O 0, LSE -inf). */
  static const struct {
    const char *name, *score, *mask;
    float cap;
    fj_dtype dt;
  } paths[] = {
      {"softcap 45 (shift 25)", NULL, NULL, 45.f, FJ_BF16},
      {"softcap 80 (running max)", NULL, NULL, 80.f, FJ_BF16},
      {"softcap 30 f16 (running max)", NULL, NULL, 30.f, FJ_F16},
      {"softcap 50, every score at -cap", "s - 1000.f", NULL, 50.f, FJ_BF16},
      {"softcap 30, rows that see no key", NULL, "q % 7 != 3", 30.f, FJ_BF16},
  };
  for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
    const mod_case sc = {paths[i].name, 2, 16, 16, 1100, 1100, 128, paths[i].dt, FJ_CAUSAL_TOP_LEFT, 30};
    twin w;
    twin_init(&w, paths[i].score, paths[i].mask);
    w.hm.softcap = w.dm.softcap = paths[i].cap;
    bad |= run_mod_case(ctx, &sc, &w, &seed);
    twin_free(&w);
  }
  /* Window and softcap at once. */
  const mod_case both = {"window+softcap", 1, 16, 4, 1000, 1000, 128, FJ_F16, FJ_CAUSAL_BOTTOM_RIGHT, 30};
  twin w;
  twin_init(&w, NULL, NULL);
  w.hm.softcap = w.dm.softcap = 30.f;
  w.hm.window_left = w.dm.window_left = 333;
  bad |= run_mod_case(ctx, &both, &w, &seed);
  twin_free(&w);
  fjt_gpu_print_worst();
  fj_ctx_destroy(ctx);
  return bad;
}

int test_gpu_mods_user(void)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(fjt_tmpdir(), &ctx);
  if (rc)
    return rc;
  uint64_t seed = 77;
  int bad = 0;
  twin w;
  /* ALiBi: slopes 2^(-8(h+1)/H), GQA 8:1, causal. */
  float slopes[16];
  for (int h = 0; h < 16; h++)
    slopes[h] = powf(2.f, -8.f * (float)(h + 1) / 16.f);
  const mod_case al = {"alibi", 2, 16, 2, 512, 512, 128, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT, 1};
  twin_init(&w, "s - slopes(h) * (float)abs(q - kv)", NULL);
  bad |= twin_tensor(&w, "slopes", FJ_MOD_F32, 1, (int64_t[]){16}, slopes);
  bad |= run_mod_case(ctx, &al, &w, &seed);
  twin_free(&w);
  /* The built-in ALiBi's text, whose (float)(kv - q) the kernel builds per
   * element from a float a row (mods.lua's kvq), and (float)(q - kv): both
   * families, Sq < Skv bottom-right, keys past a tile's diagonal. */
  static const char *const dists[] = {"s + slopes(h) * (float)(kv - q)",
                                      "s - slopes(h) * (float)( q-kv )"};
  for (int i = 0; i < 2; i++) {
    const mod_case ak = {dists[i], 2, 16, 16, 1000, 1100, 128, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT, 1};
    twin_init(&w, dists[i], NULL);
    bad |= twin_tensor(&w, "slopes", FJ_MOD_F32, 1, (int64_t[]){16}, slopes);
    bad |= run_mod_case(ctx, &ak, &w, &seed);
    twin_free(&w);
  }
  /* A bias table too short for every distance: reads at negative and
   * past-the-end indices give 0. */
  enum { BW = 500 };
  uint16_t *bias = malloc(8 * BW * sizeof *bias);
  float *bf = malloc(8 * BW * sizeof *bf);
  for (int i = 0; i < 8 * BW; i++)
    bf[i] = (float)((i * 37) % 101) / 25.f - 2.f;
  fj_convert(FJ_F16, bias, FJ_F32, bf, 8 * BW);
  const mod_case bt = {"bias table", 1, 8, 8, 600, 600, 64, FJ_F16, FJ_CAUSAL_NONE, 1};
  twin_init(&w, "s + bias(h, q - kv + 250) * hscale", NULL);
  bad |= twin_tensor(&w, "bias", FJ_MOD_F16, 2, (int64_t[]){8, BW}, bias);
  twin_scalar(&w, "hscale", FJ_MOD_F32, 1.5);
  bad |= run_mod_case(ctx, &bt, &w, &seed);
  twin_free(&w);
  free(bias);
  free(bf);
  /* Document ids (documents of 100 keys), causal. */
  int32_t doc[1024];
  for (int i = 0; i < 1024; i++)
    doc[i] = i / 100;
  const mod_case dc = {"documents", 2, 8, 4, 1024, 1024, 128, FJ_F16, FJ_CAUSAL_BOTTOM_RIGHT, 1};
  twin_init(&w, NULL, "doc(q) == doc(kv)");
  bad |= twin_tensor(&w, "doc", FJ_MOD_I32, 1, (int64_t[]){1024}, doc);
  bad |= run_mod_case(ctx, &dc, &w, &seed);
  twin_free(&w);
  /* Masks that hide whole rows, whole tiles, all tiles but one, nothing. */
  static const char *const masks[] = {"q % 5 != 2", "kv / 64 != 1", "kv / 64 == 3", "true"};
  const mod_case mk = {"mask", 1, 8, 8, 333, 517, 64, FJ_BF16, FJ_CAUSAL_NONE, 1};
  for (int i = 0; i < 4; i++) {
    twin_init(&w, NULL, masks[i]);
    bad |= run_mod_case(ctx, &mk, &w, &seed);
    twin_free(&w);
  }
  /* A distance table (mods.lua's dg): i32, kv - q in parentheses, a head
   * index of its own; distances from -606 to 592 over a table of 700:
   * tiles read at the row pointer and tiles through the accessor. */
  enum { DW = 700 };
  int32_t *rel = malloc(8 * DW * sizeof *rel);
  for (int i = 0; i < 8 * DW; i++)
    rel[i] = (i * 53) % 201 - 100;
  const mod_case dt = {"distance table", 1, 16, 16, 600, 600, 128, FJ_BF16, FJ_CAUSAL_NONE, 1};
  twin_init(&w, "s + 0.01f * (float)rel(h / 2, (kv - q) - 7)", NULL);
  bad |= twin_tensor(&w, "rel", FJ_MOD_I32, 2, (int64_t[]){8, DW}, rel);
  bad |= run_mod_case(ctx, &dt, &w, &seed);
  twin_free(&w);
  free(rel);
  /* A table over every distance the tiles reach, rows and keys past the
   * sequences' ends included (from -1163 to 1151 on either family). */
  const mod_case ti = {"table inside", 2, 16, 16, 1100, 1100, 128, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT, 1};
  bad |= inside_case(ctx, &ti, "s + bias(h, q - kv + 1200)", 16, 2400, &seed);
  /* Relative tables (rel_table.h): T5's buckets (the built-in) with GQA,
   * Sq < Skv bottom-right, and a decode row; a log-distance bias times a
   * scalar -- each evaluated once a launch per head and distance into
   * the workspace and read in the expression's place. */
  float t5b[16 * 32];
  for (int i = 0; i < 16 * 32; i++)
    t5b[i] = (float)((i * 29) % 61) / 20.f - 1.5f;
  const mod_case t5c[] = {{"t5", 2, 16, 4, 700, 1000, 128, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT, 1},
                          {"t5 decode", 3, 16, 4, 1, 1500, 128, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT, 1}};
  for (int i = 0; i < 2; i++) {
    twin_init(&w, fj_mod_builtin_find("t5")->score, NULL);
    bad |= twin_tensor(&w, "bias", FJ_MOD_F32, 2, (int64_t[]){16, 32}, t5b);
    bad |= run_mod_case(ctx, &t5c[i], &w, &seed);
    twin_free(&w);
  }
  const mod_case lg = {"log distance", 1, 8, 8, 333, 333, 64, FJ_F16, FJ_CAUSAL_NONE, 1};
  twin_init(&w, "s - slope * logf(1.f + fabsf((float)(kv - q)))", NULL);
  twin_scalar(&w, "slope", FJ_MOD_F32, 0.5);
  bad |= run_mod_case(ctx, &lg, &w, &seed);
  twin_free(&w);
  /* No parameters of the user's: the table is the kernels' only one. */
  const mod_case ln = {"log distance, no parameters", 1, 8, 2, 300, 400, 128, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT, 1};
  twin_init(&w, "s - logf(1.f + (float)abs(kv - q))", NULL);
  bad |= run_mod_case(ctx, &ln, &w, &seed);
  twin_free(&w);
  /* Integer arithmetic, a ternary, tanhf; a scalar int. */
  const mod_case ar = {"arith", 1, 8, 8, 400, 400, 128, FJ_F16, FJ_CAUSAL_TOP_LEFT, 3};
  twin_init(&w, "(q - kv) % period == 0 ? s * 0.5f : s + tanhf(s)", "(q ^ kv) != 7");
  twin_scalar(&w, "period", FJ_MOD_I32, 3);
  bad |= run_mod_case(ctx, &ar, &w, &seed);
  twin_free(&w);
  fjt_gpu_print_worst();
  fj_ctx_destroy(ctx);
  return bad;
}

/* Decode and speculative decode: GQA packing (h from the packed row) and
 * split-KV with the window, the softcap and ALiBi. */
int test_gpu_mods_decode(void)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(fjt_tmpdir(), &ctx);
  if (rc)
    return rc;
  uint64_t seed = 5;
  int bad = 0;
  float slopes[32];
  for (int h = 0; h < 32; h++)
    slopes[h] = powf(2.f, -8.f * (float)(h + 1) / 32.f);
  static const int sqs[3] = {1, 4, 16};
  for (int i = 0; i < 3; i++) {
    const mod_case dec = {"decode", 2, 32, 8, sqs[i], 4096, 128, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT, 30};
    twin w;
    twin_init(&w, "s - slopes(h) * (float)(q - kv)", NULL);
    bad |= twin_tensor(&w, "slopes", FJ_MOD_F32, 1, (int64_t[]){32}, slopes);
    w.hm.softcap = w.dm.softcap = 30.f;
    w.hm.window_left = w.dm.window_left = i == 0 ? 1000 : 100;
    bad |= run_mod_case(ctx, &dec, &w, &seed);
    twin_free(&w);
  }
  /* A distance table under GQA packing (a row's head and position from
   * the packed row; q counts the query rows from 0): kv - q - 500 from
   * -515 to 3595, and q - kv + 3500 from -595 to 3515, over a table of
   * 3000, so that some tiles lie in it and some do not. */
  enum { TW = 3000 };
  float *tab = malloc(32 * TW * sizeof *tab);
  for (int i = 0; i < 32 * TW; i++)
    tab[i] = (float)((i * 37) % 101) / 50.f - 1.f;
  for (int i = 0; i < 3; i++) {
    const mod_case dec = {"decode distance", 2, 32, 8, sqs[i], 4096, 128, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT, 1};
    twin w;
    twin_init(&w, i == 1 ? "s + bias(h, q - kv + 3500)" : "s + bias(h, kv - q - 500)", NULL);
    bad |= twin_tensor(&w, "bias", FJ_MOD_F32, 2, (int64_t[]){32, TW}, tab);
    bad |= run_mod_case(ctx, &dec, &w, &seed);
    twin_free(&w);
  }
  free(tab);
  /* The same under GQA packing and split-KV, over a table that covers
   * every distance: proved inside. */
  const mod_case din = {"decode table inside", 2, 32, 8, 1, 4096, 128, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT, 1};
  bad |= inside_case(ctx, &din, "s + bias(h, q - kv + 4200)", 32, 8400, &seed);
  fjt_gpu_print_worst();
  fj_ctx_destroy(ctx);
  return bad;
}

/* Sinks per head, from -3 to 4.5 in steps of 0.5 (beside scores of size
 * about 1, and x30: from negligible to dominant). */
static void sink_values(float *sinks, int n)
{
  for (int h = 0; h < n; h++)
    sinks[h] = -3.f + 0.5f * (float)(h % 16);
}

static int sink_case(fj_ctx *ctx, const mod_case *mc, const char *mask,
                     uint64_t *seed)
{
  float sinks[64];
  twin w;
  sink_values(sinks, mc->hq);
  twin_init(&w, NULL, mask);
  int bad = twin_sinks(&w, sinks, mc->hq);
  if (!bad)
    bad = run_mod_case(ctx, mc, &w, seed);
  twin_free(&w);
  return bad;
}

/* Attention sinks: prefill on the library's choice (large enough for the
 * wgmma family on sm_90a, which must then be the one) and on the mma
 * family; rows and tiles that see no key; with the softcap and a window;
 * decode GQA-packed with and without splits, the splits outnumbering the
 * key tiles (later splits see no key: the combine still adds each sink
 * once). */
int test_gpu_mods_sinks(void)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(fjt_tmpdir(), &ctx);
  if (rc)
    return rc;
  uint64_t seed = 123;
  int bad = 0;
  const mod_case pre = {"sinks", 2, 16, 16, 1100, 1100, 128, FJ_BF16, FJ_CAUSAL_NONE, 1};
  if (strcmp(fj_ctx_arch(ctx), "sm_90a") == 0) {
    fj_problem p;
    fj_plan plan;
    fj_mods m;
    static const float one[16];
    fj_mods_init(&m);
    m.sinks = one;
    fj_problem_init(&p, pre.b, pre.hq, pre.hkv, pre.sq, pre.skv, pre.d, pre.dt, FJ_BHSD);
    p.mods = &m;
    CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
    CHECK(plan.variant.mma == FJ_MMA_WGMMA);
  }
  bad |= sink_case(ctx, &pre, NULL, &seed);
  const mod_case br = {"sinks causal x30", 2, 16, 4, 1100, 1300, 128, FJ_F16, FJ_CAUSAL_BOTTOM_RIGHT, 30};
  bad |= sink_case(ctx, &br, NULL, &seed);
  const mod_case d64 = {"sinks d64", 1, 8, 8, 333, 517, 64, FJ_BF16, FJ_CAUSAL_NONE, 1};
  bad |= sink_case(ctx, &d64, NULL, &seed);
  /* Rows that see no key (q % 5 == 2), a tile that sees none, every row. */
  static const char *const masks[] = {"q % 5 != 2", "kv / 64 != 1", "false"};
  for (int i = 0; i < 3; i++)
    bad |= sink_case(ctx, &d64, masks[i], &seed);
  const mod_case mk = {"sinks masked rows", 2, 16, 16, 1100, 1100, 128, FJ_BF16, FJ_CAUSAL_TOP_LEFT, 1};
  bad |= sink_case(ctx, &mk, masks[0], &seed);
  /* With the softcap and a window (the softcap folds into sl2). */
  {
    float sinks[16];
    twin w;
    const mod_case sc = {"sinks+softcap+window", 1, 16, 4, 1000, 1000, 128, FJ_F16, FJ_CAUSAL_BOTTOM_RIGHT, 30};
    sink_values(sinks, 16);
    twin_init(&w, NULL, NULL);
    w.hm.softcap = w.dm.softcap = 30.f;
    w.hm.window_left = w.dm.window_left = 333;
    bad |= twin_sinks(&w, sinks, 16) || run_mod_case(ctx, &sc, &w, &seed);
    twin_free(&w);
    /* bfloat16: the softcap's fixed shift, with rows that see no key (O 0,
     * LSE the sink); then sinks far below the shift (-100 against 30:
     * 2^-330 flushes to 0), whose rows that see no key still have the sink
     * as their LSE. */
    for (int far = 0; far < 2; far++) {
      const mod_case sb = {far ? "sinks -100+softcap bf16, masked rows"
                               : "sinks+softcap bf16, masked rows",
                           1, 16, 4, 1000, 1000, 128, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT, 30};
      for (int h = 0; far && h < 16; h++)
        sinks[h] = -100.f - (float)h;
      twin_init(&w, NULL, "q % 5 != 2");
      w.hm.softcap = w.dm.softcap = 30.f;
      bad |= twin_sinks(&w, sinks, 16) || run_mod_case(ctx, &sb, &w, &seed);
      twin_free(&w);
    }
  }
  /* Decode: GQA 4:1 packed (each packed row's own head's sink), one
   * kernel and split: 3 splits, and 16 splits over 5 key tiles. */
  static const int splits[] = {1, 0, 3, 16};
  static const int sqs[] = {1, 4};
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 2; j++) {
      const mod_case dec = {i == 3 ? "sinks decode, empty splits" : "sinks decode",
                            2, 32, 8, sqs[j], i == 3 ? 300 : 4096, 128, FJ_BF16,
                            FJ_CAUSAL_BOTTOM_RIGHT, 1};
      case_splits = splits[i];
      bad |= sink_case(ctx, &dec, NULL, &seed);
    }
  /* A decode whose rows see no key, split: O 0 and LSE the sink from the
   * combine alone. */
  const mod_case none = {"sinks decode masked", 1, 32, 8, 1, 700, 128, FJ_BF16, FJ_CAUSAL_NONE, 1};
  case_splits = 4;
  bad |= sink_case(ctx, &none, "false", &seed);
  case_splits = 0;
  fjt_gpu_print_worst();
  fj_ctx_destroy(ctx);
  return bad;
}

/* For compute-sanitizer: one small case per kind of modification. */
int test_gpu_sanitize_mods(void)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(fjt_tmpdir(), &ctx);
  if (rc)
    return rc;
  uint64_t seed = 9;
  int bad = 0;
  const mod_case sm = {"sanitize", 1, 4, 2, 200, 300, 128, FJ_F16, FJ_CAUSAL_NONE, 1};
  bad |= window_case(ctx, &sm, 50, 20, &seed);
  twin w;
  twin_init(&w, "s + bias(q - kv + 10)", "doc(q) == doc(kv)");
  float bias[32];
  int32_t doc[300];
  for (int i = 0; i < 32; i++)
    bias[i] = (float)i / 32.f;
  for (int i = 0; i < 300; i++)
    doc[i] = i / 70;
  bad |= twin_tensor(&w, "bias", FJ_MOD_F32, 1, (int64_t[]){32}, bias);
  bad |= twin_tensor(&w, "doc", FJ_MOD_I32, 1, (int64_t[]){300}, doc);
  w.hm.softcap = w.dm.softcap = 20.f;
  bad |= run_mod_case(ctx, &sm, &w, &seed);
  twin_free(&w);
  const mod_case dec = {"sanitize decode", 1, 8, 2, 1, 1000, 128, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT, 1};
  bad |= window_case(ctx, &dec, 300, -1, &seed);
  /* Large enough for the wgmma family on sm_90a (a 128-row block per
   * multiprocessor), with every kind of modification at once. */
  const mod_case wg = {"sanitize wgmma", 2, 16, 16, 1100, 1100, 128, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT, 1};
  int32_t doc2[1100];
  for (int i = 0; i < 1100; i++)
    doc2[i] = i / 300;
  twin_init(&w, "s + bias(q - kv + 10)", "doc(q) == doc(kv)");
  bad |= twin_tensor(&w, "bias", FJ_MOD_F32, 1, (int64_t[]){32}, bias);
  bad |= twin_tensor(&w, "doc", FJ_MOD_I32, 1, (int64_t[]){1100}, doc2);
  w.hm.softcap = w.dm.softcap = 20.f;
  w.hm.window_left = w.dm.window_left = 500;
  bad |= run_mod_case(ctx, &wg, &w, &seed);
  twin_free(&w);
  /* A distance table read at row pointers (distances up to 1099 + 1100
   * over a table of 1500: some tiles through the accessor). */
  float *tab = malloc(16 * 1500 * sizeof *tab);
  for (int i = 0; i < 16 * 1500; i++)
    tab[i] = (float)(i % 97) / 97.f - 0.5f;
  twin_init(&w, "s + bias(h, q - kv + 1100)", NULL);
  bad |= twin_tensor(&w, "bias", FJ_MOD_F32, 2, (int64_t[]){16, 1500}, tab);
  bad |= run_mod_case(ctx, &wg, &w, &seed);
  twin_free(&w);
  free(tab);
  fj_ctx_destroy(ctx);
  return bad;
}

/* ---- block masks ------------------------------------------------------------------ */

/* What a pair's fate is under a case's whole mask (the built-in rules and
 * the expression), by their formulas: -1 hidden by a built-in rule, 0
 * hidden by the expression, 1 kept. */
typedef int (*pair_fn)(int b, int h, int q, int kv, int sq, int skv);

/* The lists fj_block_mask_build should give, by testing every pair: a
 * block is partial when some pair is kept and the expression hides some
 * pair the built-in rules keep, full when some pair is kept and it hides
 * none.  Compared with the lists the builder wrote (downloaded into dl):
 * the number of rows that differ. */
static int compare_lists(const fj_block_mask *bm, pair_fn fate, int sq, int skv,
                         const int32_t *num, const int32_t *full_num,
                         const int32_t *idx, const int32_t *full_idx)
{
  int wrong = 0, kb = bm->kv_blocks;
  int32_t *want = malloc((size_t)kb * 2 * sizeof *want);
  for (int b = 0; b < bm->batch; b++)
    for (int h = 0; h < bm->heads; h++)
      for (int i = 0; i < bm->q_blocks; i++) {
        long long r = ((long long)b * bm->heads + h) * bm->q_blocks + i;
        int np = 0, nf = 0;
        for (int j = 0; j < kb; j++) {
          int any = 0, all = 1;
          for (int q = i * bm->block_q; q < (i + 1) * bm->block_q && q < sq; q++)
            for (int kv = j * bm->block_kv; kv < (j + 1) * bm->block_kv && kv < skv; kv++) {
              int f = fate(b, h, q, kv, sq, skv);
              any |= f == 1;
              all &= f != 0;
            }
          if (any)
            want[all ? kb + nf++ : np++] = j;
        }
        int ok = num[r] == np && full_num[r] == nf &&
                 !memcmp(idx + r * kb, want, (size_t)np * sizeof *want) &&
                 !memcmp(full_idx + r * kb, want + kb, (size_t)nf * sizeof *want);
        if (!ok && wrong++ < 3)
          fprintf(stderr, "block mask row (b %d, h %d, q block %d): %d partial, %d full; "
                          "want %d, %d\n", b, h, i, num[r], full_num[r], np, nf);
      }
  free(want);
  return wrong;
}

/* A block mask in both memories: the builder's (device) and its download
 * (host, for the reference). */
typedef struct twin_mask {
  fj_block_mask dev, host;
  void *buf;
  int32_t *hbuf;
} twin_mask;

/* Builds w's mask for mc on the GPU with blocks bq x bkv, downloads it and
 * checks its lists against fate's; w's mods then carry it. */
static int build_mask(fj_ctx *ctx, const mod_case *mc, twin *w, twin_mask *tm,
                      int bq, int bkv, pair_fn fate)
{
  fj_problem p;
  fj_problem_init(&p, mc->b, mc->hq, mc->hkv, mc->sq, mc->skv, mc->d, mc->dt, FJ_BHSD);
  p.causal = mc->causal;
  p.mods = &w->dm;
  size_t bytes;
  memset(tm, 0, sizeof *tm);
  if (fj_block_mask_size(ctx, &p, bq, bkv, &bytes) != FJ_OK ||
      cudaMalloc(&tm->buf, bytes) != cudaSuccess ||
      fj_block_mask_build(ctx, &p, bq, bkv, tm->buf, bytes, &tm->dev, NULL) != FJ_OK) {
    fprintf(stderr, "%s: block mask: %s\n", mc->name, fj_errmsg(ctx));
    return 1;
  }
  tm->hbuf = malloc(bytes);
  if (cudaMemcpy(tm->hbuf, tm->buf, bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
    return 1;
  const char *d0 = tm->buf;
  const char *h0 = (const char *)tm->hbuf;
#define HOST_OF(ptr) ((const int32_t *)(h0 + ((const char *)(ptr) - d0)))
  tm->host = tm->dev;
  tm->host.kv_num = HOST_OF(tm->dev.kv_num);
  tm->host.kv_indices = HOST_OF(tm->dev.kv_indices);
  tm->host.full_num = HOST_OF(tm->dev.full_num);
  tm->host.full_indices = HOST_OF(tm->dev.full_indices);
#undef HOST_OF
  int wrong = compare_lists(&tm->host, fate, mc->sq, mc->skv, tm->host.kv_num,
                            tm->host.full_num, tm->host.kv_indices, tm->host.full_indices);
  int kept = 0, full = 0;
  size_t rows = (size_t)tm->host.batch * (size_t)tm->host.heads * (size_t)tm->host.q_blocks;
  for (size_t r = 0; r < rows; r++) {
    kept += tm->host.kv_num[r] + tm->host.full_num[r];
    full += tm->host.full_num[r];
  }
  printf("%s: block mask %dx%d of %d x %d x %d x %d blocks: %d kept (%d full) of %zu, %s\n",
         mc->name, bq, bkv, tm->host.batch, tm->host.heads, tm->host.q_blocks,
         tm->host.kv_blocks, kept, full, rows * (size_t)tm->host.kv_blocks,
         wrong ? "LISTS WRONG" : "lists as computed here");
  w->dm.block_mask = &tm->dev;
  w->hm.block_mask = &tm->host;
  return wrong != 0;
}

static void free_mask(twin_mask *tm)
{
  cudaFree(tm->buf);
  free(tm->hbuf);
}

static const int32_t *g_doc;  /* the document ids of doc_fate */
static int doc_fate(int b, int h, int q, int kv, int sq, int skv)
{
  (void)b; (void)h;
  if (kv > q + skv - sq)  /* causal, bottom-right */
    return -1;
  return g_doc[q] == g_doc[kv];
}

static int head_fate(int b, int h, int q, int kv, int sq, int skv)
{
  (void)b; (void)sq; (void)skv;
  return (kv + h * 37) % 5 != 0 || q == kv || kv < 3;
}

static int causal_fate(int b, int h, int q, int kv, int sq, int skv)
{
  (void)b; (void)h;
  return kv > q + skv - sq ? -1 : 1;
}

/* Documents of 300 tokens under mc's causal mask: the ids (*doc, for the
 * caller to free), the twin's mask expression reading them, and the block
 * mask the library builds for it (128 x 128), its lists checked. */
static int doc_masked(fj_ctx *ctx, const mod_case *mc, twin *w, twin_mask *tm,
                      int32_t **doc)
{
  int32_t *ids = malloc((size_t)mc->skv * sizeof *ids);
  for (int i = 0; i < mc->skv; i++)
    ids[i] = i / 300;
  *doc = ids;
  g_doc = ids;
  twin_init(w, NULL, "doc(q) == doc(kv)");
  int bad = twin_tensor(w, "doc", FJ_MOD_I32, 1, (int64_t[]){mc->skv}, ids);
  return bad | build_mask(ctx, mc, w, tm, 128, 128, doc_fate);
}

/* Block masks built by the library (the lists checked against every pair
 * tested here) and given by the caller (lists that hide whole tiles, all
 * but one, whole rows), on both families, with sequence tails. */
int test_gpu_block_mask(void)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(fjt_tmpdir(), &ctx);
  if (rc)
    return rc;
  uint64_t seed = 31;
  int bad = 0;
  twin w;
  twin_mask tm;
  /* Documents of 300 tokens with causal: blocks of 128 (the wgmma
   * family's pick on sm_90a, and the mma family's). */
  const mod_case dc = {"documents", 2, 16, 16, 1100, 1100, 128, FJ_BF16,
                       FJ_CAUSAL_BOTTOM_RIGHT, 1};
  int32_t *doc;
  bad |= doc_masked(ctx, &dc, &w, &tm, &doc);
  bad |= run_mod_case(ctx, &dc, &w, &seed);
  /* The same lists with a score expression and inputs x30. */
  w.hm.score = w.dm.score = "s - 0.01f * (float)(q - kv)";
  const mod_case dc30 = {"documents x30", 2, 16, 16, 1100, 1100, 128, FJ_BF16,
                         FJ_CAUSAL_BOTTOM_RIGHT, 30};
  bad |= run_mod_case(ctx, &dc30, &w, &seed);
  free_mask(&tm);
  twin_free(&w);
  free(doc);
  /* A mask that reads h (one list per head), 64-row blocks (the mma
   * family), GQA 4:1, tails on both sides, no causal mask. */
  const mod_case hc = {"per head", 2, 8, 2, 333, 517, 64, FJ_F16, FJ_CAUSAL_NONE, 1};
  twin_init(&w, NULL, "(kv + h * 37) % 5 != 0 || q == kv || kv < 3");
  bad |= build_mask(ctx, &hc, &w, &tm, 64, 64, head_fate);
  bad |= run_mod_case(ctx, &hc, &w, &seed);
  free_mask(&tm);
  twin_free(&w);
  /* Causal alone: every block it reaches full (no expression). */
  const mod_case cc = {"causal only", 1, 8, 8, 700, 900, 128, FJ_F16,
                       FJ_CAUSAL_BOTTOM_RIGHT, 1};
  twin_init(&w, NULL, NULL);
  bad |= build_mask(ctx, &cc, &w, &tm, 128, 256, causal_fate);
  bad |= run_mod_case(ctx, &cc, &w, &seed);
  free_mask(&tm);
  twin_free(&w);
  /* The caller's lists: query block 0 sees key block 2 only (partial),
   * block 1 key blocks 0 and 3 (full), block 2 nothing (its rows: O = 0,
   * LSE = -inf), block 3 every key block (full), with indices out of range
   * and a count past the key blocks that the kernels must survive. */
  const mod_case uc = {"caller lists", 4, 16, 16, 500, 480, 128, FJ_BF16, FJ_CAUSAL_NONE, 1};
  int32_t hnum[4] = {1, 0, 0, 0}, hfull_num[4] = {0, 2, 0, 99};
  int32_t hidx[16] = {2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  int32_t hfull[16] = {0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3};
  /* Rows of query block 3 list key blocks 0-3 as full; row 0 also names -1
   * and 7 after its count (never read). */
  hidx[1] = -1;
  hidx[2] = 7;
  int32_t *dbuf;
  bad |= cudaMalloc((void **)&dbuf, 40 * sizeof *dbuf) != cudaSuccess;
  cudaMemcpy(dbuf, hnum, sizeof hnum, cudaMemcpyHostToDevice);
  cudaMemcpy(dbuf + 4, hfull_num, sizeof hfull_num, cudaMemcpyHostToDevice);
  cudaMemcpy(dbuf + 8, hidx, sizeof hidx, cudaMemcpyHostToDevice);
  cudaMemcpy(dbuf + 24, hfull, sizeof hfull, cudaMemcpyHostToDevice);
  twin_init(&w, NULL, "kv % 3 != 1");
  fj_block_mask hb = {128, 128, 1, 1, 4, 4, hnum, hidx, hfull_num, hfull, NULL, NULL, NULL, NULL};
  fj_block_mask db = {128, 128, 1, 1, 4, 4, dbuf, dbuf + 8, dbuf + 4, dbuf + 24, NULL, NULL, NULL, NULL};
  w.hm.block_mask = &hb;
  w.dm.block_mask = &db;
  bad |= run_mod_case(ctx, &uc, &w, &seed);
  /* An index out of range in a counted place: its tile reads nothing. */
  hidx[0] = 9;
  cudaMemcpy(dbuf + 8, hidx, sizeof hidx, cudaMemcpyHostToDevice);
  bad |= run_mod_case(ctx, &uc, &w, &seed);
  cudaFree(dbuf);
  twin_free(&w);
  fj_ctx_destroy(ctx);
  return bad;
}

/* Checked mode: a bias table read out of range is reported after the
 * launch (the tensor, the indices, the extents); in range, the call
 * succeeds.  Both families (the wgmma family at a size it is picked for). */
int test_gpu_mods_checked(void)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(fjt_tmpdir(), &ctx);
  if (rc)
    return rc;
  int bad = 0;
  static const int shapes[2][3] = {{1, 4, 200}, {2, 16, 1100}};  /* batch, heads, seq */
  for (int s = 0; s < 2; s++) {
    int B = shapes[s][0], H = shapes[s][1], S = shapes[s][2];
    size_t n = (size_t)B * (size_t)H * (size_t)S * 64;
    void *q, *o;
    float *bias;
    CHECK(cudaMalloc(&q, n * 2) == cudaSuccess && cudaMalloc(&o, n * 2) == cudaSuccess);
    CHECK(cudaMemset(q, 0, n * 2) == cudaSuccess);
    CHECK(cudaMalloc((void **)&bias, (size_t)H * 2 * (size_t)S * 4) == cudaSuccess);
    CHECK(cudaMemset(bias, 0, (size_t)H * 2 * (size_t)S * 4) == cudaSuccess);
    fj_mod_param prm = {"bias", FJ_MOD_F32, 2, {H, 100}, bias, 0};
    fj_mods m;
    fj_mods_init(&m);
    m.score = "s + bias(h, q - kv + 50)";
    m.params = &prm;
    m.num_params = 1;
    m.checked = 1;
    fj_problem p;
    fj_problem_init(&p, B, H, H, S, S, 64, FJ_F16, FJ_BHSD);
    p.causal = FJ_CAUSAL_BOTTOM_RIGHT;
    p.mods = &m;
    fj_variant v;
    CHECK_OK(ctx, fj_attention_variant(ctx, &p, &v, NULL));
    char name[200];
    fj_variant_name(&v, name, sizeof name);
    fj_status st = fj_attention_fwd(ctx, &p, q, q, q, o, NULL, NULL);
    printf("checked %s, table of 100: %s: %s\n", name, fj_status_str(st),
           st == FJ_OK ? "" : fj_errmsg(ctx));
    bad |= st != FJ_ERR_INVALID_ARG ||
           !strstr(fj_errmsg(ctx), "checked mode: mods.params[0] (bias): read at (") ||
           !strstr(fj_errmsg(ctx), "outside its extents (");
    /* Every distance inside the table: no report. */
    prm.extents[1] = 2 * S;
    m.score = "s + bias(h, q - kv + S)";
    fj_mod_param two[2] = {prm, {"S", FJ_MOD_I32, 0, {0}, NULL, S}};
    m.params = two;
    m.num_params = 2;
    st = fj_attention_fwd(ctx, &p, q, q, q, o, NULL, NULL);
    printf("checked %s, table of %d: %s %s\n", name, 2 * S, fj_status_str(st),
           st == FJ_OK ? "" : fj_errmsg(ctx));
    bad |= st != FJ_OK;
    /* A mask alone (documents; no score, so no relative table's parameter
     * before the record, which follows the user's): a read past the ids
     * is reported. */
    int32_t *doc;
    CHECK(cudaMalloc((void **)&doc, 100 * 4) == cudaSuccess);
    CHECK(cudaMemset(doc, 0, 100 * 4) == cudaSuccess);
    fj_mod_param ids = {"doc", FJ_MOD_I32, 1, {100}, doc, 0};
    fj_mods_init(&m);
    m.mask = "doc(q) == doc(kv)";
    m.params = &ids;
    m.num_params = 1;
    m.checked = 1;
    st = fj_attention_fwd(ctx, &p, q, q, q, o, NULL, NULL);
    printf("checked mask alone, ids of 100: %s: %s\n", fj_status_str(st),
           st == FJ_OK ? "" : fj_errmsg(ctx));
    bad |= st != FJ_ERR_INVALID_ARG ||
           !strstr(fj_errmsg(ctx), "checked mode: mods.params[0] (doc): read at (");
    cudaFree(doc);
    cudaFree(q);
    cudaFree(o);
    cudaFree(bias);
  }
  fj_ctx_destroy(ctx);
  return bad;
}

/* The tuner over a modified problem: its candidates run with the caller's
 * bias table; the winner is recorded under the mods' form, so a new
 * context finds it for that form and not for another expression of the
 * same class; checked mode is refused. */
int test_gpu_tune_mods(void)
{
  const char *dir = fjt_tmpdir();
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(dir, &ctx);
  if (rc)
    return rc;
  enum { H = 4, S = 256 };
  float host[H * 2 * S];
  uint64_t seed = 17;
  for (int i = 0; i < H * 2 * S; i++) {  /* small values in [-0.1, 0.1) */
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    host[i] = (float)((int)(seed >> 40) % 2001 - 1000) * 1e-4f;
  }
  float *bias;
  CHECK(cudaMalloc((void **)&bias, sizeof host) == cudaSuccess);
  CHECK(cudaMemcpy(bias, host, sizeof host, cudaMemcpyHostToDevice) == cudaSuccess);
  fj_mod_param prm = {"bias", FJ_MOD_F32, 2, {H, 2 * S}, bias, 0};
  fj_mods m;
  fj_mods_init(&m);
  m.score = "s + bias(h, q - kv + 256)";
  m.params = &prm;
  m.num_params = 1;
  fj_problem p;
  fj_problem_init(&p, 1, H, H, S, S, 64, FJ_BF16, FJ_BHSD);
  p.causal = FJ_CAUSAL_TOP_LEFT;
  p.mods = &m;
  fj_tune_opts o;
  fj_tune_opts_init(&o);
  o.iters = 3;
  o.workers = 16;
  fj_variant best;
  fj_tune_report r;
  CHECK_OK(ctx, fj_tune(ctx, &p, &o, &best, &r));
  char name[160], got[160];
  fj_variant_name(&best, name, sizeof name);
  printf("tuned %s: %.3f ms (default %.3f ms); %d candidates, %d refused, %d failed, "
         "%d wrong, %d timed\n", name, r.best_ms, r.default_ms, r.candidates,
         r.refused, r.failed, r.wrong, r.timed);
  CHECK(r.timed > 1 && r.best_ms > 0 && r.best_ms <= r.default_ms);
  CHECK(r.failed == 0 && r.wrong == 0);
  CHECK(strstr(name, "_x"));  /* the winner carries the expression */
  /* Checked mode is refused, naming it. */
  m.checked = 1;
  CHECK(fj_tune(ctx, &p, &o, NULL, NULL) == FJ_ERR_UNSUPPORTED &&
        strstr(fj_errmsg(ctx), "checked mode"));
  m.checked = 0;
  fj_ctx_destroy(ctx);
  /* A new context: the tuned entry for this form, the heuristic for another. */
  CHECK(fjt_gpu_ctx(dir, &ctx) == 0);
  fj_variant chosen;
  fj_choice from;
  CHECK_OK(ctx, fj_attention_variant(ctx, &p, &chosen, &from));
  fj_variant_name(&chosen, got, sizeof got);
  printf("same form: %s (%s)\n", got, from == FJ_CHOICE_TUNED ? "tuned" : "heuristic");
  CHECK(from == FJ_CHOICE_TUNED && strcmp(got, name) == 0);
  m.score = "s - bias(h, q - kv + 256)";
  CHECK_OK(ctx, fj_attention_variant(ctx, &p, &chosen, &from));
  fj_variant_name(&chosen, got, sizeof got);
  printf("another form: %s (%s)\n", got, from == FJ_CHOICE_TUNED ? "tuned" : "heuristic");
  CHECK(from == FJ_CHOICE_HEURISTIC);
  fj_ctx_destroy(ctx);
  cudaFree(bias);
  return 0;
}

/* For compute-sanitizer (bench/device_check.sh's sanitize part): the
 * builder and both families walking a library-built block mask, and a
 * caller's list with an index out of range, at small sizes. */
int test_gpu_sanitize_block_mask(void)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(fjt_tmpdir(), &ctx);
  if (rc)
    return rc;
  uint64_t seed = 5;
  int bad = 0;
  twin w;
  twin_mask tm;
  const mod_case dc = {"sanitize block mask", 2, 16, 16, 700, 700, 128, FJ_BF16,
                       FJ_CAUSAL_BOTTOM_RIGHT, 1};
  int32_t *doc;
  bad |= doc_masked(ctx, &dc, &w, &tm, &doc);
  bad |= run_mod_case(ctx, &dc, &w, &seed);
  /* An index out of range in the first row of lists (query block 0's one
   * key block, full under the causal mask): its rows then see no key. */
  int32_t far = 1 << 20;
  bad |= tm.host.full_num[0] != 1;
  cudaMemcpy((void *)tm.dev.full_indices, &far, 4, cudaMemcpyHostToDevice);
  ((int32_t *)tm.host.full_indices)[0] = far;
  bad |= run_mod_case(ctx, &dc, &w, &seed);
  free_mask(&tm);
  twin_free(&w);
  free(doc);
  fj_ctx_destroy(ctx);
  return bad;
}
