/*
 * test_family.c -- the kernel family without a GPU: a sample of the variant
 * space compiled for sm_80 and sm_90 (the resource gate: every default
 * variant has zero spills), the refusals of combinations that cannot work,
 * and what the generator does when a layout table is not what it needs.
 */
#include <stdlib.h>
#include <string.h>

#include "compile.h"
#include "layout.h"
#include "template.h"
#include "tune.h"
#include "tunedb.h"
#include "util.h"
#include "variant.h"
#include "runner.h"


static const int dims[] = {32, 64, 96, 128, 160, 192, 256};

/* Variant i of a sample spread over every axis: each head dim with both
 * softmax paths, stages 1-3, the three swizzles, both dtypes, the three
 * masks, 4 and 8 warps, tiles from 16 to 128, and FP8 K/V. */
static void sample(size_t i, fj_variant *v)
{
  int d = dims[i % 7];
  fj_dtype dt = (i / 7) % 2 ? FJ_BF16 : FJ_F16;
  fj_causal m = (fj_causal)((i / 3) % 3);
  fj_variant_default(v, d, dt, m);
  v->softmax = (i / 2) % 2 ? FJ_SOFTMAX_REGS : FJ_SOFTMAX_SMEM;
  v->stages = 1 + (int)(i % 3);
  v->swizzle = (fj_swizzle)(1 + (i / 4) % 3);
  v->warps = i % 5 == 4 ? 8 : 4;
  v->tile_n = d > 128 ? 32 : (i % 4 == 1 ? 128 : i % 4 == 2 ? 16 : 64);
  v->tile_m = v->softmax == FJ_SOFTMAX_REGS ? 16 * v->warps
                                            : (i % 6 == 5 ? 32 : 64);
  if (i % 11 == 3) {  /* FP8 K/V: dequantised on load, one stage */
    v->kv_dtype = FJ_E4M3;
    v->stages = 1;
  }
}

static void print_line(const fj_variant *v, fj_status st, fj_kernel *k,
                       fj_ctx *ctx)
{
  char name[160];
  fj_variant_name(v, name, sizeof name);
  if (st != FJ_OK) {
    printf("%-58s refused (%s)\n", name, fj_status_str(st));
    return;
  }
  fj_resources r;
  fj_kernel_resources(k, &r);
  printf("%-58s %s regs=%3d smem=%6d spill=%d/%d\n", name, fj_ctx_arch(ctx),
         r.registers, r.shared_static + r.shared_dynamic, r.spill_store_bytes,
         r.spill_load_bytes);
}

/* The sample, then every default variant (head dim x dtype x mask), which
 * must compile with no spills. */
static int family_sample(const char *arch)
{
  enum { SAMPLE = 48, DEFAULTS = 7 * 2 * 3 };
  fj_ctx *ctx = fjt_ctx(arch, NULL);
  CHECK(ctx);
  fj_variant vs[SAMPLE + DEFAULTS];
  fj_status st[SAMPLE + DEFAULTS];
  for (size_t i = 0; i < SAMPLE; i++)
    sample(i, &vs[i]);
  for (size_t i = 0; i < DEFAULTS; i++)
    fj_variant_default(&vs[SAMPLE + i], dims[i / 6], i % 2 ? FJ_BF16 : FJ_F16,
                       (fj_causal)((i / 2) % 3));
  fj_prepare_opts o = {2, NULL, NULL};
  fj_kernel_prepare(ctx, vs, SAMPLE + DEFAULTS, &o, st);
  int compiled = 0, axes_seen[8][4] = {{0}};
  for (size_t i = 0; i < SAMPLE + DEFAULTS; i++) {
    fj_kernel *k = NULL;
    if (st[i] == FJ_OK)
      CHECK_OK(ctx, fj_kernel_get(ctx, &vs[i], &k));
    print_line(&vs[i], st[i], k, ctx);
    /* Refusals in the sample are resource limits only (sm_80's smaller
     * shared memory); everything else, and every default, must compile. */
    CHECK(st[i] == FJ_OK || (st[i] == FJ_ERR_RESOURCES && i < SAMPLE));
    if (st[i] != FJ_OK)
      continue;
    compiled += i < SAMPLE;
    axes_seen[0][vs[i].softmax]++;
    axes_seen[1][vs[i].stages]++;
    axes_seen[2][vs[i].swizzle]++;
    axes_seen[3][vs[i].causal]++;
    axes_seen[4][vs[i].dtype]++;
    fj_resources r;
    fj_kernel_resources(k, &r);
    if (i >= SAMPLE)
      CHECK(r.spill_store_bytes == 0 && r.spill_load_bytes == 0);
  }
  printf("%s: %d of %d sampled variants compiled\n", arch, compiled, SAMPLE);
  CHECK(compiled >= 40);
  for (int a = 1; a <= 3; a++)
    CHECK(axes_seen[1][a] && axes_seen[2][a]);
  CHECK(axes_seen[0][1] && axes_seen[0][2] && axes_seen[3][0] &&
        axes_seen[3][1] && axes_seen[3][2] && axes_seen[4][1] && axes_seen[4][2]);
  fj_ctx_destroy(ctx);
  return 0;
}

int test_family_sample_sm80(void)
{
  return family_sample("sm_80");
}

int test_family_sample_sm90(void)
{
  return family_sample("sm_90");
}

/* The library's pick for every head dim x dtype x mask of a 2 x 8 x 2048
 * problem (which must be of family `mma`), then a sample of other shapes
 * of that family, shapes[i] = {d, tile_m, tile_n, warps, stages}; the
 * sample's swizzle rotates, or is xor for the wgmma family. */
static int picks_and_sample(fj_ctx *ctx, const int *pdims, size_t ndims,
                            fj_order order, fj_mma mma,
                            const int (*shapes)[5], size_t nsample,
                            fj_variant *vs)
{
  size_t picks = ndims * 6;
  for (size_t i = 0; i < picks; i++) {
    fj_problem p;
    fj_problem_init(&p, 2, 8, 8, 2048, 2048, pdims[i / 6], i % 2 ? FJ_BF16 : FJ_F16, order);
    p.causal = (fj_causal)((i / 2) % 3);
    CHECK_OK(ctx, fj_attention_variant(ctx, &p, &vs[i], NULL));
    CHECK(vs[i].mma == mma);
  }
  for (size_t i = 0; i < nsample; i++) {
    fj_variant *v = &vs[picks + i];
    fj_variant_default(v, shapes[i][0], i % 2 ? FJ_BF16 : FJ_F16, (fj_causal)(i % 3));
    v->mma = mma;
    v->swizzle = mma == FJ_MMA_WGMMA ? FJ_SWIZZLE_XOR
                                     : (fj_swizzle)(FJ_SWIZZLE_NONE + (int)(i % 3));
    v->tile_m = shapes[i][1];
    v->tile_n = shapes[i][2];
    v->warps = shapes[i][3];
    v->stages = shapes[i][4];
  }
  return 0;
}

/* The mma family: what the library picks on its own for every head dim x
 * dtype x mask (compiled for sm_80 and sm_90, spills at most 128 bytes),
 * and a sample of the family's shapes, pipelined or not. */
static int mma_choices(const char *arch)
{
  enum { PICKS = 7 * 2 * 3, SAMPLE = 8 };
  static const int shapes[SAMPLE][5] = {  /* d, tile_m, tile_n, warps, stages */
      {64, 128, 128, 8, 3}, {64, 128, 64, 4, 3}, {128, 128, 64, 8, 3}, {128, 128, 64, 4, 2},
      {256, 128, 32, 8, 3}, {96, 64, 32, 4, 1}, {160, 128, 32, 8, 2}, {32, 128, 128, 4, 2}};
  fj_ctx *ctx = fjt_ctx(arch, NULL);
  CHECK(ctx);
  fj_variant vs[PICKS + SAMPLE];
  fj_status st[PICKS + SAMPLE];
  CHECK(picks_and_sample(ctx, dims, 7, FJ_BHSD, FJ_MMA_SYNC, shapes, SAMPLE, vs) == 0);
  fj_prepare_opts o = {2, NULL, NULL};
  fj_kernel_prepare(ctx, vs, PICKS + SAMPLE, &o, st);
  for (size_t i = 0; i < PICKS + SAMPLE; i++) {
    fj_kernel *k = NULL;
    if (st[i] == FJ_OK)
      CHECK_OK(ctx, fj_kernel_get(ctx, &vs[i], &k));
    print_line(&vs[i], st[i], k, ctx);
    /* sm_80's 163 KB refuses the largest pipelined sample; nothing else. */
    CHECK(st[i] == FJ_OK || (st[i] == FJ_ERR_RESOURCES && i >= PICKS));
    if (st[i] != FJ_OK)
      continue;
    fj_resources r;
    fj_kernel_resources(k, &r);
    /* The fastest shapes on the H200 sit at 255 registers; ptxas spills a
     * few words in some (up to 72 bytes seen).  A gate against more. */
    if (i < PICKS)
      CHECK(r.spill_store_bytes <= 128 && r.spill_load_bytes <= 128);
    /* Before sm_90 the picks at head dims 96-128 take 16-row warps, which
     * spill nothing (32-row ones spilled 64-80 bytes on sm_80). */
    if (i < PICKS && strcmp(arch, "sm_80") == 0 && vs[i].head_dim >= 96 &&
        vs[i].head_dim <= 128)
      CHECK(r.spill_store_bytes == 0 && r.spill_load_bytes == 0);
  }
  fj_ctx_destroy(ctx);
  return 0;
}

int test_family_mma_sm80_sm90(void)
{
  return mma_choices("sm_80") || mma_choices("sm_90");
}

/* The kernel of a variant fj_kernel_prepare built (status st), its line
 * printed; NULL where it failed. */
static fj_kernel *prepared(fj_ctx *ctx, const fj_variant *v, fj_status st)
{
  fj_kernel *k = NULL;
  if (st == FJ_OK && fj_kernel_get(ctx, v, &k) != FJ_OK)
    k = NULL;
  print_line(v, st, k, ctx);
  return k;
}

/* v compiled alone (o's workers), or NULL where it fails or spills. */
static fj_kernel *compiled_unspilled(fj_ctx *ctx, const fj_variant *v,
                                     const fj_prepare_opts *o)
{
  fj_status st;
  fj_kernel_prepare(ctx, v, 1, o, &st);
  fj_kernel *k = prepared(ctx, v, st);
  fj_resources r;
  if (k)
    fj_kernel_resources(k, &r);
  return k && r.spill_store_bytes == 0 ? k : NULL;
}

/* The wgmma family on sm_90a: the library's pick for every head dim it
 * takes x dtype x mask, and a sample of its other shapes (one and three
 * consumer warpgroups, 3 and 4 stages, the smallest and largest key
 * tiles).  Each compiles with no spills and no serialised wgmma, and its
 * PTX holds the Hopper instructions: wgmma, TMA, setmaxnreg (where there
 * are two or more consumer warpgroups). */
int test_family_wgmma_sm90a(void)
{
  enum { PICKS = 4 * 2 * 3, SAMPLE = 6 };
  static const int wdims[] = {64, 128, 192, 256};
  static const int shapes[SAMPLE][5] = {  /* d, tile_m, tile_n, warps, stages */
      {128, 64, 128, 8, 3}, {64, 192, 128, 16, 4}, {64, 64, 192, 8, 2},
      {128, 128, 64, 12, 4}, {256, 128, 64, 12, 2}, {192, 128, 64, 12, 3}};
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  fj_variant vs[PICKS + SAMPLE];
  fj_status st[PICKS + SAMPLE];
  CHECK(picks_and_sample(ctx, wdims, 4, FJ_BSHD, FJ_MMA_WGMMA, shapes, SAMPLE, vs) == 0);
  fj_prepare_opts o = {2, NULL, NULL};
  fj_kernel_prepare(ctx, vs, PICKS + SAMPLE, &o, st);
  for (size_t i = 0; i < PICKS + SAMPLE; i++) {
    fj_kernel *k = prepared(ctx, &vs[i], st[i]);
    CHECK(k);
    fj_resources r;
    fj_kernel_resources(k, &r);
    CHECK(r.spill_store_bytes == 0 && r.spill_load_bytes == 0);
    const char *ptx = fj_kernel_ptx(k, NULL), *log = fj_kernel_log(k);
    CHECK(strstr(ptx, "wgmma.mma_async") && strstr(ptx, "cp.async.bulk.tensor"));
    CHECK(vs[i].warps == 8 || strstr(ptx, "setmaxnreg.inc"));
    if (strstr(log, "serialized") || strstr(log, "setmaxnreg' ignored"))
      printf("%s", log);
    CHECK(!strstr(log, "serialized") && !strstr(log, "setmaxnreg' ignored"));
  }
  fj_ctx_destroy(ctx);
  return 0;
}

/* The wgmma family's rules, each refusal naming the value and the limit. */
int test_family_wgmma_refusals(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  fj_variant v;
  fj_variant_default(&v, 128, FJ_F16, FJ_CAUSAL_NONE);
  v.mma = FJ_MMA_WGMMA;
  v.swizzle = FJ_SWIZZLE_XOR;
  v.tile_m = 128;
  v.warps = 12;
  v.tile_n = 128;
  CHECK_OK(ctx, fj_variant_check(ctx, &v));
  v.warps = 4;
  CHECK_ST(ctx, fj_variant_check(ctx, &v), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "warps 4 is not implemented for mma wgmma: 8, 12 or 16");
  v.warps = 16;
  CHECK_ST(ctx, fj_variant_check(ctx, &v), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "tile_m 128 with warps 16: each of the 3 consumer warpgroups owns 64 rows, so tile_m is 192");
  v.warps = 12;
  v.swizzle = FJ_SWIZZLE_PAD;
  CHECK_ST(ctx, fj_variant_check(ctx, &v), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "swizzle pad: the wgmma family reads tiles in the 128-byte XOR swizzle");
  v.swizzle = FJ_SWIZZLE_XOR;
  v.stages = 1;
  CHECK_ST(ctx, fj_variant_check(ctx, &v), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "stages 1: the wgmma family takes 2, 3 or 4");
  v.stages = 2;
  v.tile_n = 256;
  CHECK_ST(ctx, fj_variant_check(ctx, &v), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "head_dim 128 and tile_n 256 need about");
  v.tile_n = 176;
  v.stages = 3;
  CHECK_ST(ctx, fj_variant_check(ctx, &v), FJ_ERR_RESOURCES);
  CHECK_MSG(ctx, "sm_90a allows 232448 (over by");
  fj_variant_default(&v, 96, FJ_F16, FJ_CAUSAL_NONE);
  v.mma = FJ_MMA_WGMMA;
  v.swizzle = FJ_SWIZZLE_XOR;
  v.tile_m = 128;
  v.warps = 12;
  /* Head dim 96 pads to two panels; in FP8 it is refused. */
  CHECK_OK(ctx, fj_variant_check(ctx, &v));
  v.dtype = FJ_E4M3;
  CHECK_ST(ctx, fj_variant_check(ctx, &v), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "head_dim 96 with dtype e4m3 is not implemented: 64, 128, 192 or 256");
  v.dtype = FJ_F16;
  v.head_dim = 128;
  v.kv_dtype = FJ_E4M3;
  CHECK_ST(ctx, fj_variant_check(ctx, &v), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "kv_dtype e4m3 with dtype f16 is not implemented for mma wgmma");
  fj_ctx_destroy(ctx);
  /* wgmma exists on sm_90a only. */
  ctx = fjt_ctx("sm_90", NULL);
  CHECK(ctx);
  v.kv_dtype = 0;
  CHECK_ST(ctx, fj_variant_check(ctx, &v), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "mma wgmma (wgmma.mma_async, TMA) needs sm_90a; the target is sm_90");
  fj_lut lut;
  CHECK_ST(ctx, fj_layout_get(ctx, FJ_FRAG_WGMMA_A, &lut), FJ_ERR_UNSUPPORTED);
  fj_ctx_destroy(ctx);
  return 0;
}

/* The wgmma family's picks for short sequences (plan.c's short_keys:
 * 16k tokens at S = 512 and 1024, what `flashjit tune` found), beside
 * the same head dims at S = 2048; the causal d64 pick with its four
 * stages compiles with no spills. */
int test_family_wgmma_short(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  static const struct {
    int d, s;
    fj_causal c;
    int tile_m, tile_n, warps, stages;
  } rule[] = {
      {64, 512, FJ_CAUSAL_TOP_LEFT, 128, 128, 12, 4},   {64, 1024, FJ_CAUSAL_TOP_LEFT, 128, 128, 12, 4},
      {64, 2048, FJ_CAUSAL_TOP_LEFT, 192, 128, 16, 2},  {64, 512, FJ_CAUSAL_NONE, 192, 128, 16, 2},
      {128, 512, FJ_CAUSAL_NONE, 128, 128, 12, 2},      {128, 1024, FJ_CAUSAL_NONE, 128, 160, 12, 2},
      {128, 1024, FJ_CAUSAL_TOP_LEFT, 128, 128, 12, 2}, {128, 2048, FJ_CAUSAL_TOP_LEFT, 128, 176, 12, 2},
      {256, 1024, FJ_CAUSAL_NONE, 128, 64, 12, 2},      {256, 2048, FJ_CAUSAL_NONE, 128, 80, 12, 2},
  };
  fj_prepare_opts o = {1, NULL, NULL};
  for (size_t i = 0; i < FJ_ARRAY_LEN(rule); i++) {
    fj_problem p;
    fj_problem_init(&p, 16384 / rule[i].s, 2048 / rule[i].d, 2048 / rule[i].d, rule[i].s,
                    rule[i].s, rule[i].d, FJ_BF16, FJ_BHSD);
    p.causal = rule[i].c;
    fj_variant v;
    fj_choice from;
    CHECK_OK(ctx, fj_attention_variant(ctx, &p, &v, &from));
    int as_ruled = v.mma == FJ_MMA_WGMMA && v.tile_m == rule[i].tile_m &&
                   v.tile_n == rule[i].tile_n && v.warps == rule[i].warps &&
                   v.stages == rule[i].stages;
    if (!as_ruled)
      printf("d%d S=%d causal %d: m%d n%d w%d s%d\n", rule[i].d, rule[i].s, (int)rule[i].c,
             v.tile_m, v.tile_n, v.warps, v.stages);
    CHECK(as_ruled);
    if (i == 0)
      CHECK(compiled_unspilled(ctx, &v, &o));
  }
  fj_ctx_destroy(ctx);
  return 0;
}

/* ---- refusals ------------------------------------------------------------------ */

static int refused(fj_ctx *ctx, const fj_variant *v, fj_status want,
                   const char *text)
{
  CHECK_ST(ctx, fj_variant_check(ctx, v), want);
  CHECK_MSG(ctx, text);
  return 0;
}

/* FP8 attention (dtype e4m3) on sm_90a, compiled without a GPU: head dims
 * 128 and 256 with every mask and the flush settings, each with no spills,
 * FP8 wgmma for both products and its _vt pass; then its refusals. */
static void fp8_variant(fj_variant *v, int d, fj_causal m, int flush)
{
  fj_variant_default(v, d, FJ_E4M3, m);  /* the wgmma family's 128 x 128 */
  v->fp8_flush = flush;
}

/* The reference reads one descale a tensor where scale_layout says so:
 * the first entry of each array, for every (batch, KV head) -- the same
 * result as per-head arrays that hold it everywhere, another than the
 * arrays' own per-head values. */
static int fp8_reference_per_tensor(void)
{
  enum { B = 2, H = 2, S = 5, D = 16, N = B * H * S * D };
  static uint8_t q8[N], k8[N], v8[N];
  static float qf[N], kf[N], vf[N];
  for (int i = 0; i < N; i++) {
    qf[i] = (float)((i * 37) % 23 - 11);
    kf[i] = (float)((i * 53) % 19 - 9);
    vf[i] = (float)((i * 29) % 17 - 8);
  }
  CHECK(fj_convert(FJ_E4M3, q8, FJ_F32, qf, N) == FJ_OK);
  CHECK(fj_convert(FJ_E4M3, k8, FJ_F32, kf, N) == FJ_OK);
  CHECK(fj_convert(FJ_E4M3, v8, FJ_F32, vf, N) == FJ_OK);
  float qs[B * H] = {0.05f, 0.07f, 0.02f, 0.03f}, ks[B * H] = {0.04f, 0.01f, 0.06f, 0.02f},
        vs[B * H] = {0.5f, 0.25f, 2.f, 1.f};
  float qs1[B * H], ks1[B * H], vs1[B * H];
  for (int i = 0; i < B * H; i++) {
    qs1[i] = qs[0];
    ks1[i] = ks[0];
    vs1[i] = vs[0];
  }
  static double o_tensor[N], o_heads[N], o_own[N], lse[B * H * S];
  fj_problem p;
  fj_problem_init(&p, B, H, H, S, S, D, FJ_E4M3, FJ_BHSD);
  p.scale_layout = FJ_SCALE_PER_TENSOR;
  p.q_scale = qs;
  CHECK_OK(NULL, fj_reference_fwd(&p, q8, k8, v8, ks, vs, 0, S, o_tensor, lse));
  p.scale_layout = FJ_SCALE_PER_HEAD;
  p.q_scale = qs1;
  CHECK_OK(NULL, fj_reference_fwd(&p, q8, k8, v8, ks1, vs1, 0, S, o_heads, lse));
  p.q_scale = qs;
  CHECK_OK(NULL, fj_reference_fwd(&p, q8, k8, v8, ks, vs, 0, S, o_own, lse));
  CHECK(memcmp(o_tensor, o_heads, sizeof o_tensor) == 0);
  CHECK(memcmp(o_tensor, o_own, sizeof o_tensor) != 0);
  return 0;
}

/* FP8 attention's O (o_dtype, o_scale, o_amax): the choice follows the
 * problem (named "_oe4m3", a pick of its own), the e4m3 O compiles with
 * no spills beyond the bf16 O's and raises the amax by an atomic max;
 * what does not apply is refused by name.  p: a valid FP8 problem. */
static int fp8_out_rules(fj_ctx *ctx, fj_problem *p)
{
  static float one;
  fj_variant v;
  fj_choice from;
  p->o_dtype = FJ_E4M3;
  p->o_scale = p->o_amax = &one;
  CHECK_OK(ctx, fj_problem_check(ctx, p));
  CHECK_OK(ctx, fj_attention_variant(ctx, p, &v, &from));
  CHECK(v.o_dtype == FJ_E4M3);
  char name[160];
  fj_variant_name(&v, name, sizeof name);
  CHECK(strstr(name, "_e4m3_flnever_oe4m3"));
  for (int d = 128; d <= 256; d += 128) {
    fj_variant w;
    fp8_variant(&w, d, FJ_CAUSAL_TOP_LEFT, 0);
    w.o_dtype = FJ_E4M3;
    fj_kernel *k;
    CHECK_OK(ctx, fj_kernel_get(ctx, &w, &k));
    fj_resources r;
    fj_kernel_resources(k, &r);
    CHECK(r.spill_store_bytes <= (d == 256 ? 24 : 0));
    const char *ptx = fj_kernel_ptx(k, NULL);
    CHECK(strstr(ptx, "atom.global.max.u32") && strstr(ptx, "st.shared.b16"));
  }
  p->o_dtype = FJ_F16;
  CHECK_ST(ctx, fj_problem_check(ctx, p), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "o_scale is for an e4m3 O (o_dtype e4m3); O is f16: pass NULL");
  p->o_scale = NULL;
  CHECK_OK(ctx, fj_problem_check(ctx, p));
  p->o_dtype = (fj_dtype)99;
  CHECK_ST(ctx, fj_problem_check(ctx, p), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "o_dtype 99 is invalid: 0 (dtype's), f16, bf16 or e4m3");
  fj_problem q = *p;
  q.dtype = q.kv_dtype = FJ_BF16;
  q.o_dtype = FJ_E4M3;
  q.o_amax = NULL;
  CHECK_ST(ctx, fj_problem_check(ctx, &q), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "o_dtype e4m3 with dtype bf16 is not implemented: a 16-bit problem writes O in its dtype");
  q.o_dtype = 0;
  q.o_amax = &one;
  CHECK_ST(ctx, fj_problem_check(ctx, &q), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "o_amax is for FP8 attention (dtype e4m3); dtype is bf16: pass NULL");
  q.o_amax = NULL;
  q.o_dtype = FJ_BF16;  /* its own dtype: the default, said */
  CHECK_OK(ctx, fj_problem_check(ctx, &q));
  /* The tuner tunes the default O's tiles, which an e4m3 O takes. */
  p->o_dtype = FJ_E4M3;
  CHECK_ST(ctx, fj_tune(ctx, p, NULL, NULL, NULL), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "tuning o_dtype e4m3 is not implemented: tune the problem with o_dtype 0 (bf16)");
  /* O's scale and amax are floats: 4-byte aligned, checked at the call. */
  static _Alignas(16) char buf[64];
  fj_variant w;
  CHECK_OK(ctx, fj_attention_variant(ctx, p, &w, &from));
  p->o_scale = buf + 2;
  CHECK_ST(ctx, fj_attention_fwd_variant(ctx, p, &w, buf, buf, buf, buf, NULL, NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "o_scale = ");
  CHECK_MSG(ctx, "is not 4-byte aligned: it points at a float");
  p->o_scale = buf;
  p->o_amax = buf + 1;
  CHECK_ST(ctx, fj_attention_fwd_variant(ctx, p, &w, buf, buf, buf, buf, NULL, NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "o_amax = ");
  p->o_amax = buf;
  CHECK_ST(ctx, fj_attention_fwd_variant(ctx, p, &w, buf, buf, buf, buf, NULL, NULL),
           FJ_ERR_COMPILE_ONLY);
  /* A variant must write the problem's O. */
  p->o_dtype = 0;
  p->o_scale = p->o_amax = NULL;
  v.o_dtype = FJ_E4M3;
  CHECK_ST(ctx, fj_attention_fwd_variant(ctx, p, &v, buf, buf, buf, buf, NULL, NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "variant (o_dtype e4m3) does not match the problem (o_dtype bf16)");
  return 0;
}

int test_family_fp8_sm90a(void)
{
  static const struct { int d; fj_causal m; int flush; } picks[] = {
      {128, FJ_CAUSAL_NONE, 0}, {128, FJ_CAUSAL_TOP_LEFT, 0},
      {128, FJ_CAUSAL_BOTTOM_RIGHT, 1}, {128, FJ_CAUSAL_NONE, -1},
      {256, FJ_CAUSAL_NONE, 0}, {256, FJ_CAUSAL_TOP_LEFT, 0},
      /* 64 and 192: Q and K padded to 128 and 256, P V and O not. */
      {64, FJ_CAUSAL_TOP_LEFT, 0}, {192, FJ_CAUSAL_NONE, 0}};
  enum { N = sizeof picks / sizeof picks[0] };
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  fj_variant vs[N];
  fj_status st[N];
  for (int i = 0; i < N; i++)
    fp8_variant(&vs[i], picks[i].d, picks[i].m, picks[i].flush);
  fj_prepare_opts o = {2, NULL, NULL};
  fj_kernel_prepare(ctx, vs, N, &o, st);
  for (int i = 0; i < N; i++) {
    fj_kernel *k = prepared(ctx, &vs[i], st[i]);
    CHECK(k);
    fj_resources r;
    fj_kernel_resources(k, &r);
    /* Head dim 256 holds O (128 registers), S (64) and P (16) in its 240:
     * ptxas spills a few bytes there (0-4 unmasked, 8 causal on NVRTC
     * 13.0); head dim 128 none. */
    CHECK(r.spill_store_bytes <= (picks[i].d > 128 ? 24 : 0));
    const char *ptx = fj_kernel_ptx(k, NULL), *log = fj_kernel_log(k);
    char want[96];
    /* P V's N: the head dim in 64s (64 and 192 take no padded columns). */
    snprintf(want, sizeof want, "m64n%dk32.f32.e4m3.e4m3", (picks[i].d + 63) / 64 * 64);
    CHECK(strstr(ptx, "m64n128k32.f32.e4m3.e4m3") && strstr(ptx, want));
    CHECK(strstr(ptx, "cvt.rn.satfinite.e4m3x2.f32"));
    char name[160];
    fj_variant_name(&vs[i], name, sizeof name);
    strcat(name, "_vt");
    CHECK(strstr(ptx, name));
    CHECK(!strstr(log, "serialized") && !strstr(log, "setmaxnreg' ignored"));
  }
  fj_variant v;
  fp8_variant(&v, 160, FJ_CAUSAL_NONE, 0);
  CHECK(refused(ctx, &v, FJ_ERR_UNSUPPORTED, "head_dim 160 with dtype e4m3 is not implemented: 64, 128, 192 or 256") == 0);
  fp8_variant(&v, 128, FJ_CAUSAL_NONE, 0);
  v.tile_n = 176;
  CHECK(refused(ctx, &v, FJ_ERR_UNSUPPORTED, "tile_n 176 with dtype e4m3: FP8 attention takes key tiles of 128 (the default) to 256 in steps of 32") == 0);
  /* Key tiles of 192 (opt-in): S at N 192, P V at the head dim; one
   * accumulator only (two would not fit the registers). */
  fp8_variant(&v, 128, FJ_CAUSAL_TOP_LEFT, -1);
  v.tile_n = 192;
  fj_kernel *wide = compiled_unspilled(ctx, &v, &o);
  CHECK(wide);
  const char *wptx = fj_kernel_ptx(wide, NULL);
  CHECK(strstr(wptx, "m64n192k32.f32.e4m3.e4m3") && strstr(wptx, "m64n128k32.f32.e4m3.e4m3"));
  /* 224 (FlashAttention-3's FP8 d128 tile): seven k steps of P V, the
   * last V^T box half read. */
  v.tile_n = 224;
  fj_kernel *w224 = compiled_unspilled(ctx, &v, &o);
  CHECK(w224);
  CHECK(strstr(fj_kernel_ptx(w224, NULL), "m64n224k32.f32.e4m3.e4m3"));
  fp8_variant(&v, 128, FJ_CAUSAL_NONE, 1);
  v.tile_n = 192;
  CHECK(refused(ctx, &v, FJ_ERR_UNSUPPORTED, "tile_n 192 with FP8's two accumulators need about") == 0);
  fp8_variant(&v, 128, FJ_CAUSAL_NONE, 0);
  v.kv_dtype = FJ_F16;
  CHECK(refused(ctx, &v, FJ_ERR_INVALID_ARG, "kv_dtype f16 is invalid with dtype e4m3") == 0);
  fp8_variant(&v, 128, FJ_CAUSAL_NONE, 17);
  CHECK(refused(ctx, &v, FJ_ERR_INVALID_ARG, "fp8_flush 17 is invalid: 1..16 key tiles, -1 (never)") == 0);
  fp8_variant(&v, 256, FJ_CAUSAL_NONE, 4);
  CHECK(refused(ctx, &v, FJ_ERR_UNSUPPORTED, "with FP8's two accumulators") == 0);
  fp8_variant(&v, 128, FJ_CAUSAL_NONE, 0);
  v.mma = FJ_MMA_SYNC;
  v.warps = 4;
  CHECK(refused(ctx, &v, FJ_ERR_UNSUPPORTED, "dtype e4m3 (Q, K and V in FP8) is implemented for mma wgmma only") == 0);
  /* Score expressions and the softcap at head dims up to 128: the
   * descales join the score function's input scale, per work tile; above
   * 128 they are refused (the consumers' registers would spill). */
  /* Either alone compiles without spills; both together spill a few
   * bytes at d128 under a causal mask (12-60 on NVRTC 13.0). */
  fj_mods m;
  for (int i = 0; i < 6; i++) {
    fj_mods_init(&m);
    m.score = i % 3 != 1 ? "s - 0.125f * (float)(q - kv)" : NULL;
    m.softcap = i % 3 != 0 ? 30.f : 0.f;
    fp8_variant(&v, i < 3 ? 64 : 128, FJ_CAUSAL_TOP_LEFT, 0);
    v.mods = &m;
    fj_kernel *k;
    CHECK_OK(ctx, fj_kernel_get(ctx, &v, &k));
    fj_resources r;
    fj_kernel_resources(k, &r);
    CHECK(r.spill_store_bytes <= (i == 5 ? 64 : 0));
    CHECK(strstr(fj_kernel_source(k, NULL), "const float qk_scale = qk_scale0 * p.q_scale["));
    CHECK(strstr(fj_kernel_source(k, NULL), "const float sl2_t = sl2;"));
  }
  fp8_variant(&v, 256, FJ_CAUSAL_NONE, 0);
  v.mods = &m;
  CHECK(refused(ctx, &v, FJ_ERR_UNSUPPORTED, "dtype e4m3 with a score expression or softcap at head_dim 256 is not implemented: up to 128") == 0);
  fj_variant_default(&v, 128, FJ_F16, FJ_CAUSAL_NONE);
  v.fp8_flush = 2;
  CHECK(refused(ctx, &v, FJ_ERR_INVALID_ARG, "fp8_flush 2 is invalid with dtype f16") == 0);
  /* The problem: its three descales, and no backward. */
  fj_problem p;
  fj_problem_init(&p, 1, 2, 2, 256, 256, 128, FJ_E4M3, FJ_BHSD);
  static float scale[2];
  p.k_scale = p.v_scale = scale;
  CHECK_ST(ctx, fj_problem_check(ctx, &p), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "dtype e4m3 needs q_scale, k_scale and v_scale: q_scale is NULL");
  p.q_scale = scale;
  CHECK_OK(ctx, fj_problem_check(ctx, &p));
  fj_variant chosen;
  fj_choice from;
  CHECK_OK(ctx, fj_attention_variant(ctx, &p, &chosen, &from));
  CHECK(chosen.mma == FJ_MMA_WGMMA && chosen.dtype == FJ_E4M3 && chosen.tile_n == 192);
  CHECK(chosen.o_dtype == 0);
  /* The key tiles, fixed per head dim and mask (plan.c), and the flush
   * they leave: every tile where two accumulators fit, else never. */
  /* mods: 0 none, 1 softcap, 2 a window (a mask without causal), 3 a
   * score expression. */
  static const struct {
    int d;
    fj_causal c;
    int mods, n, flush;
  } rule[] = {
      {64, FJ_CAUSAL_NONE, 0, 256, -1},         {64, FJ_CAUSAL_TOP_LEFT, 0, 192, -1},
      {64, FJ_CAUSAL_BOTTOM_RIGHT, 0, 192, -1}, {128, FJ_CAUSAL_NONE, 0, 192, -1},
      {128, FJ_CAUSAL_TOP_LEFT, 0, 192, -1},    {192, FJ_CAUSAL_NONE, 0, 128, -1},
      {256, FJ_CAUSAL_TOP_LEFT, 0, 128, -1},    {64, FJ_CAUSAL_NONE, 1, 128, 1},
      {128, FJ_CAUSAL_TOP_LEFT, 1, 128, 1},     {64, FJ_CAUSAL_NONE, 2, 192, -1},
      {128, FJ_CAUSAL_NONE, 2, 192, -1},        {64, FJ_CAUSAL_NONE, 3, 128, 1},
  };
  fj_mods mods[4];
  for (int i = 0; i < 4; i++)
    fj_mods_init(&mods[i]);
  mods[1].softcap = 30.0f;
  mods[2].window_left = 256;
  mods[2].window_right = 0;
  mods[3].score = "s * 0.5f";
  /* Each at three lengths (heads q/kv, seq q/kv) -- a short prefill, a
   * decode step over a long cache (GQA), a long prefill: the tile never
   * follows the length, so that a model's decode and prefill round alike
   * (README, FP8). */
  static const int len[][4] = {{2, 2, 256, 256}, {8, 2, 1, 8192}, {16, 4, 16384, 16384}};
  for (size_t i = 0; i < FJ_ARRAY_LEN(rule); i++)
    for (size_t l = 0; l < FJ_ARRAY_LEN(len); l++) {
      fj_problem r;
      fj_problem_init(&r, 1, len[l][0], len[l][1], len[l][2], len[l][3], rule[i].d, FJ_E4M3,
                      FJ_BHSD);
      r.q_scale = r.k_scale = r.v_scale = scale;
      r.causal = rule[i].c;
      r.mods = rule[i].mods ? &mods[rule[i].mods] : NULL;
      CHECK_OK(ctx, fj_attention_variant(ctx, &r, &chosen, &from));
      CHECK(chosen.tile_n == rule[i].n);
      CHECK(fj__fp8_flush(&chosen) == rule[i].flush);
      /* The library's own picks compile with no spills (once each). */
      if (l == 0 && !rule[i].mods && rule[i].d <= 128)
        CHECK(compiled_unspilled(ctx, &chosen, &o));
      /* A tune keeps the key tile and flush (tune.c): they decide the
       * rounding, which must not follow a tuned length class. */
      if (l == 1) {
        fj_variant cand[384];
        size_t nc = fj__tune_candidates(ctx, &r, cand, FJ_ARRAY_LEN(cand)), others = 0;
        CHECK(nc > 1);
        for (size_t j = 0; j < nc; j++)
          if (cand[j].mma == FJ_MMA_WGMMA) {
            CHECK(cand[j].tile_n == chosen.tile_n);
            CHECK(fj__fp8_flush(&cand[j]) == rule[i].flush);
            others += cand[j].stages != chosen.stages || cand[j].tile_m != chosen.tile_m;
          }
        CHECK(others > 0);
      }
    }
  CHECK(fp8_out_rules(ctx, &p) == 0);
  fj_bwd_plan bp;
  CHECK_ST(ctx, fj_attention_bwd_plan(ctx, &p, &bp), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "the backward does not take dtype e4m3");
  fj_ctx_destroy(ctx);
  /* On another target there is no FP8 family. */
  ctx = fjt_ctx("sm_80", NULL);
  CHECK_ST(ctx, fj_problem_check(ctx, &p), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "needs sm_90a");
  fj_ctx_destroy(ctx);
  return 0;
}

int test_family_refusals(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  fj_variant v;
  fj_variant_default(&v, 64, FJ_F16, FJ_CAUSAL_NONE);
  v.softmax = FJ_SOFTMAX_REGS;
  v.tile_m = 128;
  v.warps = 4;
  CHECK(refused(ctx, &v, FJ_ERR_UNSUPPORTED,
                "softmax regs: tile_m 128 must be 16 x warps = 64") == 0);
  fj_variant_default(&v, 64, FJ_F16, FJ_CAUSAL_NONE);
  v.kv_dtype = FJ_E4M3;
  v.stages = 2;
  CHECK(refused(ctx, &v, FJ_ERR_UNSUPPORTED,
                "kv_dtype e4m3 is dequantised as it loads, so it takes stages 1 (not 2)") == 0);
  fj_variant_default(&v, 64, FJ_F16, FJ_CAUSAL_NONE);
  v.stages = 4;
  CHECK(refused(ctx, &v, FJ_ERR_UNSUPPORTED, "stages 4 is not implemented: 1, 2 or 3") == 0);
  fj_variant_default(&v, 256, FJ_F16, FJ_CAUSAL_NONE);
  v.softmax = FJ_SOFTMAX_REGS;
  v.tile_m = 64;
  v.warps = 4;
  v.tile_n = 256;
  CHECK(refused(ctx, &v, FJ_ERR_UNSUPPORTED,
                "needs about 296 registers per thread for O and S; the limit is 255 (over by 41)") == 0);
  fj_variant_default(&v, 128, FJ_F16, FJ_CAUSAL_NONE);
  v.softmax = FJ_SOFTMAX_SMEM;
  v.stages = 3;
  v.tile_n = 128;
  CHECK(refused(ctx, &v, FJ_ERR_RESOURCES, "sm_90a allows 232448 (over by") == 0);
  fj_ctx_destroy(ctx);
  /* cp.async needs sm_80. */
  ctx = fjt_ctx("sm_75", NULL);
  CHECK(ctx);
  fj_variant_default(&v, 64, FJ_F16, FJ_CAUSAL_NONE);
  v.softmax = FJ_SOFTMAX_SMEM;
  v.stages = 2;
  CHECK(refused(ctx, &v, FJ_ERR_UNSUPPORTED, "stages 2 needs cp.async (sm_80 or newer); the target is sm_75") == 0);
  v.mma = FJ_MMA_SYNC;
  CHECK(refused(ctx, &v, FJ_ERR_UNSUPPORTED, "mma mma (mma.sync m16n8k16) needs sm_80 or newer; the target is sm_75") == 0);
  fj_lut lut;
  CHECK_ST(ctx, fj_layout_get(ctx, FJ_FRAG_MMA_A, &lut), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "fragment kind mma_a needs sm_80 or newer (bf16 fragments, mma.sync m16n8k16); the target is sm_75");
  fj_ctx_destroy(ctx);
  /* wgmma fragments need sm_90a, whatever else the target has. */
  ctx = fjt_ctx("sm_80", NULL);
  CHECK(ctx);
  CHECK_ST(ctx, fj_layout_get(ctx, FJ_FRAG_WGMMA_ACC_F16, &lut), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "fragment kind wgmma_acc_f16 needs sm_90a (wgmma); the target is sm_80");
  fj_ctx_destroy(ctx);
  /* The mma family's own rules. */
  ctx = fjt_ctx("sm_90", NULL);
  fj_variant_default(&v, 64, FJ_F16, FJ_CAUSAL_NONE);
  v.mma = FJ_MMA_SYNC;
  v.softmax = FJ_SOFTMAX_SMEM;
  CHECK(refused(ctx, &v, FJ_ERR_UNSUPPORTED, "softmax smem: the mma family keeps the softmax in registers") == 0);
  v.softmax = FJ_SOFTMAX_REGS;
  v.tile_m = 64;
  v.warps = 8;
  CHECK(refused(ctx, &v, FJ_ERR_UNSUPPORTED, "tile_m 64 with warps 8: each warp owns 16 or 32 rows, so tile_m is 128 or 256") == 0);
  fj_variant_default(&v, 256, FJ_F16, FJ_CAUSAL_NONE);
  v.mma = FJ_MMA_SYNC;
  v.tile_m = 128;
  v.warps = 4;
  v.tile_n = 64;
  CHECK(refused(ctx, &v, FJ_ERR_UNSUPPORTED, "32 rows per warp need about 360 registers per thread for O and S; the limit is 255 (over by 105)") == 0);
  fj_ctx_destroy(ctx);
  /* FP8 rows move in 16-byte pieces: strides in multiples of 16 elements. */
  ctx = fjt_ctx("sm_90a", NULL);
  fj_problem p;
  fj_problem_init(&p, 1, 2, 2, 64, 64, 64, FJ_F16, FJ_BHSD);
  p.kv_dtype = FJ_E4M3;
  static float scale[2];
  p.k_scale = p.v_scale = scale;
  p.k_stride[2] = 72;
  static _Alignas(16) char buf[64];
  CHECK_ST(ctx, fj_attention_fwd(ctx, &p, buf, buf, buf, buf, NULL, NULL), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "k_stride[2] = 72 is not a multiple of 16 elements");
  p.k_stride[2] = 64;
  p.k_scale = NULL;
  CHECK_ST(ctx, fj_problem_check(ctx, &p), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "kv_dtype e4m3 needs k_scale and v_scale");
  p.k_scale = scale;
  p.scale_layout = (fj_scale_layout)7;
  CHECK_ST(ctx, fj_problem_check(ctx, &p), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "scale_layout 7 is invalid: FJ_SCALE_PER_HEAD (0) or FJ_SCALE_PER_TENSOR (1)");
  p.kv_dtype = FJ_F16;  /* 16-bit problems ignore it */
  CHECK_OK(ctx, fj_problem_check(ctx, &p));
  fj_ctx_destroy(ctx);
  return fp8_reference_per_tensor();
}

/* ---- when the layout table is not what the generator needs ---------------------------- */

/* Renders a regs variant with one of its tables edited by `edit`. */
static fj_status render_edited(fj_ctx *ctx, int table, void (*edit)(fj_lut *),
                               fj_buf *out)
{
  fj_variant v;
  fj_variant_default(&v, 64, FJ_F16, FJ_CAUSAL_TOP_LEFT);
  v.softmax = FJ_SOFTMAX_REGS;
  v.swizzle = FJ_SWIZZLE_XOR;
  v.tile_m = 64;
  v.warps = 4;
  fj_vparams vp;
  fj_kmeta meta;
  fj_status st = fj__variant_params(ctx, &v, &vp);
  if (st != FJ_OK)
    return st;
  edit(&vp.luts[table]);
  return fj__render(ctx, vp.template_name, vp.p, vp.n, out, &meta);
}

/* Lane 5 holds slots 0 and 3 the other way round: still a valid table, but
 * not base + delta. */
static void not_separable(fj_lut *l)
{
  uint16_t t = l->map[5][0];
  l->map[5][0] = l->map[5][3];
  l->map[5][3] = t;
}

/* The A operand laid out like B (k, n): valid and separable, but its slots
 * do not hold the accumulator's elements. */
static void a_like_b(fj_lut *l)
{
  fj__lut_reference(FJ_FRAG_WMMA_B_F16_COL, l);
  l->frag = FJ_FRAG_WMMA_A_F16_ROW;
}

/* B's first two slots swapped: separable, but not what ldmatrix yields. */
static void not_ldmatrix(fj_lut *l)
{
  for (int lane = 0; lane < 32; lane++) {
    uint16_t t = l->map[lane][0];
    l->map[lane][0] = l->map[lane][1];
    l->map[lane][1] = t;
    l->map[lane][8] = l->map[lane][0];
    l->map[lane][9] = l->map[lane][1];
  }
}

int test_family_lut_disagrees(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  fj_buf src = {0};
  /* Not separable: refused, with the reason and the table's device. */
  CHECK_ST(ctx, render_edited(ctx, 0, not_separable, &src), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "softmax regs: the accumulator (wmma_acc_f32 on none (a reference table: "
                 "what an NVIDIA H200 showed)) "
                 "is not separable: lane 5 slot");
  /* A does not hold S's elements: P goes through shared memory. */
  CHECK_OK(ctx, render_edited(ctx, 1, a_like_b, &src));
  CHECK(strstr(src.data, "P goes through"));
  CHECK(!strstr(src.data, "P never leaves registers"));
  fj_compiled out = {0};
  CHECK_OK(ctx, fj__compile(ctx, "p_smem.cu", src.data, "sm_90a", 0, &out));
  fj__compiled_free(&out);
  /* The unedited tables: P stays in registers, fragments come by ldmatrix. */
  fj_variant v;
  fj_variant_default(&v, 64, FJ_F16, FJ_CAUSAL_TOP_LEFT);
  v.softmax = FJ_SOFTMAX_REGS;
  v.swizzle = FJ_SWIZZLE_XOR;
  fj_kernel *k;
  CHECK_OK(ctx, fj_kernel_get(ctx, &v, &k));
  CHECK(strstr(fj_kernel_source(k, NULL), "P never leaves registers"));
  CHECK(strstr(fj_kernel_source(k, NULL), "fj::ldmatrix_x4_trans(r_, vt"));
  /* B not in ldmatrix's layout: loaded element by element, and it compiles. */
  CHECK_OK(ctx, render_edited(ctx, 2, not_ldmatrix, &src));
  CHECK(strstr(src.data, "bt.x[0] = kt[fj::tile_off("));
  CHECK(!strstr(src.data, "ldmatrix_x4(r_, kt"));
  CHECK_OK(ctx, fj__compile(ctx, "elementwise.cu", src.data, "sm_90a", 0, &out));
  fj__compiled_free(&out);
  fj__buf_free(&src);
  fj_ctx_destroy(ctx);
  return 0;
}

/* ---- the tuning database --------------------------------------------------------------- */

typedef struct tune_seen {
  int n;
  fj_variant v;
  double ms, default_ms;
  char key[256];
  const char *match;  /* tune_visit_match's */
} tune_seen;

static int tune_visit(void *user, const fj_tune_entry *e)
{
  tune_seen *s = user;
  if (s->n++ == 0) {
    s->v = e->variant;
    s->ms = e->ms;
    s->default_ms = e->default_ms;
    snprintf(s->key, sizeof s->key, "%s", e->key);
  }
  return 0;
}

/* Counts the entries and keeps the last one visited whose key holds
 * s->match (|mods=, |dv=). */
static int tune_visit_match(void *user, const fj_tune_entry *e)
{
  tune_seen *s = user;
  s->n++;
  if (strstr(e->key, s->match)) {
    s->v = e->variant;
    s->ms = e->ms;
    snprintf(s->key, sizeof s->key, "%s", e->key);
  }
  return 0;
}

int test_tune_database(void)
{
  const char *dir = fjt_tmpdir();
  fj_ctx *ctx = fjt_ctx("sm_90a", dir);
  CHECK(ctx);
  tune_seen s = {0};
  CHECK_ST(ctx, fj_tune_list(ctx, tune_visit, &s), FJ_ERR_NOT_FOUND);
  CHECK_MSG(ctx, "no tuning database");
  /* An entry as fj_tune writes it. */
  const char *db =
      "{\"format\": 1, \"entries\": {\"NVIDIA H200|sm_90a|13000|d128|f16|kv=f16|"
      "causal=none|q=2^12|k=2^12|gqa=1\": {\"variant\": {\"tile_m\": 128, "
      "\"tile_n\": 64, \"warps\": 8, \"stages\": 3, \"swizzle\": \"xor\", "
      "\"softmax\": \"regs\", \"mma\": \"wmma\"}, \"ms\": 2.25, "
      "\"default_ms\": 2.5, \"shape\": \"4,16/16,4096/4096,128\", "
      "\"date\": \"2026-11-22T15:00:00Z\"}}}";
  char path[4300];
  snprintf(path, sizeof path, "%s/tune.json", dir);
  CHECK(fjt_write_file(path, db, strlen(db)) == 0);
  CHECK_OK(ctx, fj_tune_list(ctx, tune_visit, &s));
  CHECK(s.n == 1 && s.v.tile_m == 128 && s.v.tile_n == 64 && s.v.warps == 8);
  CHECK(s.v.stages == 3 && s.v.swizzle == FJ_SWIZZLE_XOR && s.v.softmax == FJ_SOFTMAX_REGS);
  CHECK(s.ms == 2.25 && s.default_ms == 2.5 && strstr(s.key, "|d128|f16|"));
  /* The class's head dim, dtypes and mask come from the key: the axes
   * alone made variants of head dim 0, which `cache prewarm
   * --from-tune-db` failed, every one. */
  CHECK(s.v.head_dim == 128 && s.v.dtype == FJ_F16 && s.v.kv_dtype == 0 &&
        s.v.causal == FJ_CAUSAL_NONE);
  /* A damaged file lists as empty rather than failing. */
  CHECK(fjt_write_file(path, "{not json", 9) == 0);
  memset(&s, 0, sizeof s);
  CHECK_OK(ctx, fj_tune_list(ctx, tune_visit, &s));
  CHECK(s.n == 0);
  /* What fj_tune records, read back: the write path merges under a lock. */
  fj_problem rec;
  fj_problem_init(&rec, 2, 8, 2, 1024, 2048, 96, FJ_BF16, FJ_BSHD);
  rec.causal = FJ_CAUSAL_BOTTOM_RIGHT;
  fj_variant rv;
  fj_variant_default(&rv, 96, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT);
  rv.stages = 3;
  rv.swizzle = FJ_SWIZZLE_NONE;
  CHECK_OK(ctx, fj__tune_record(ctx, &rec, &rv, 1.5, 1.75));
  memset(&s, 0, sizeof s);
  CHECK_OK(ctx, fj_tune_list(ctx, tune_visit, &s));
  CHECK(s.n == 1 && s.ms == 1.5 && s.default_ms == 1.75);
  CHECK(strstr(s.key, "|d96|bf16|kv=bf16|causal=bottom-right|q=2^10|k=2^11|gqa=4"));
  CHECK(s.v.tile_m == rv.tile_m && s.v.tile_n == rv.tile_n && s.v.warps == rv.warps &&
        s.v.stages == 3 && s.v.swizzle == FJ_SWIZZLE_NONE && s.v.softmax == rv.softmax &&
        s.v.mma == FJ_MMA_WMMA);
  CHECK(s.v.head_dim == 96 && s.v.dtype == FJ_BF16 && s.v.kv_dtype == 0 &&
        s.v.causal == FJ_CAUSAL_BOTTOM_RIGHT);
  char name[160];
  fj_variant_name(&s.v, name, sizeof name);
  fj_variant_name(&rv, path, sizeof path);
  CHECK(strcmp(name, path) == 0);
  CHECK_OK(ctx, fj_variant_check(ctx, &s.v));
  /* With modifications the key ends in |mods= and 16 hex digits (their
   * form's hash): what `cache prewarm --from-tune-db` skips and counts,
   * since the expressions are not in the database (cli.sh). */
  fj_mods m;
  fj_mods_init(&m);
  m.window_left = 256;
  rec.mods = &m;
  rec.seq_q = 16384;  /* a class of its own */
  CHECK_OK(ctx, fj__tune_record(ctx, &rec, &rv, 1.25, 1.5));
  tune_seen last = {.match = "|mods="};
  CHECK_OK(ctx, fj_tune_list(ctx, tune_visit_match, &last));
  const char *mods = strstr(last.key, "|gqa=4|mods=");
  CHECK(last.n == 2 && mods && strlen(mods) == strlen("|gqa=4|mods=") + 16);
  CHECK(last.v.head_dim == 96 && last.ms == 1.25);
  /* Split head dims (MLA's prefill): |dv= after gqa=, a class of its own
   * that the prewarm skips (its variant would lose head_dim_v). */
  fj_problem split;
  fj_problem_init(&split, 2, 8, 2, 1024, 2048, 192, FJ_BF16, FJ_BSHD);
  split.causal = FJ_CAUSAL_BOTTOM_RIGHT;
  split.head_dim_v = 128;
  const int64_t vs[3] = {2048 * 2 * 128, 128, 2 * 128}, os[3] = {1024 * 8 * 128, 128, 8 * 128};
  memcpy(split.v_stride, vs, sizeof vs);
  memcpy(split.o_stride, os, sizeof os);
  fj_variant sv;
  fj_variant_default(&sv, 192, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT);
  sv.head_dim_v = 128;
  CHECK_OK(ctx, fj__tune_record(ctx, &split, &sv, 1.0, 1.25));
  last = (tune_seen){.match = "|dv="};
  CHECK_OK(ctx, fj_tune_list(ctx, tune_visit_match, &last));
  CHECK(last.n == 3 && last.ms == 1.0 && strstr(last.key, "|d192|bf16|") &&
        strstr(last.key, "|gqa=4|dv=128") && !strstr(last.key, "mods=") &&
        !strstr(last.key, "|vk"));
  /* V in K's rows (MLA's cache: K's strides) is a class apart, |vk: only
   * there may the mma family's pick serve. */
  memcpy(split.v_stride, split.k_stride, sizeof split.k_stride);
  split.seq_q = 512;
  CHECK_OK(ctx, fj__tune_record(ctx, &split, &sv, 0.5, 0.75));
  last = (tune_seen){.match = "|dv="};
  CHECK_OK(ctx, fj_tune_list(ctx, tune_visit_match, &last));
  CHECK(last.n == 4 && strstr(last.key, "|gqa=4|dv=128|vk"));
  /* Tuning needs a device. */
  fj_problem p;
  fj_problem_init(&p, 1, 2, 2, 64, 64, 64, FJ_F16, FJ_BHSD);
  CHECK_ST(ctx, fj_tune(ctx, &p, NULL, NULL, NULL), FJ_ERR_COMPILE_ONLY);
  CHECK_MSG(ctx, "needs a GPU context");
  fj_ctx_destroy(ctx);
  return 0;
}
