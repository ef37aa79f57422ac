/*
 * test_head_dim_v.c -- split head dims (fj_problem.head_dim_v, issue 34):
 * Q K^T over head_dim, P V and O over head_dim_v, as DeepSeek's MLA
 * prefill has (192 / 128).  CPU: every refusal (one line naming the value
 * and the limit), the names, the plan and its memory of picks, the wgmma
 * kernels compiling for sm_90a without spills, and the float64 reference
 * against itself and a naive loop; and the mma family's head dims padded
 * to 16 columns (padded_heads_compile).  The GPU tests, gpu_head_dim_v
 * and gpu_wide_heads, are test_gpu.c's.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_case.h"
#include "runner.h"
#include "tier.h"
#include "tune.h"
#include "variant.h"

/* V and O contiguous in the problem's order with head_dim_v columns. */
void fjt_split_problem(fj_problem *p, int b, int hq, int hkv, int sq, int skv,
                       int d, int dv, fj_dtype dt, fj_order order)
{
  fj_problem w;
  fj_problem_init(p, b, hq, hkv, sq, skv, d, dt, order);
  fj_problem_init(&w, b, hq, hkv, sq, skv, dv, dt, order);
  p->head_dim_v = dv;
  memcpy(p->v_stride, w.v_stride, sizeof w.v_stride);
  memcpy(p->o_stride, w.o_stride, sizeof w.o_stride);
}

/* The explicit variants gpu_head_dim_v runs beside the library's choice:
 * other tiles, warpgroups and stages than the plan's, f16 and bf16, every
 * mask. */
static const struct {
  int d, dv, tile_m, tile_n, warps, stages;
  fj_dtype dt;
  fj_causal m;
} explicit_cases[] = {
    {192, 128, 128, 64, 12, 3, FJ_BF16, FJ_CAUSAL_TOP_LEFT},
    {192, 128, 64, 128, 8, 2, FJ_F16, FJ_CAUSAL_NONE},
    {128, 64, 192, 96, 16, 2, FJ_F16, FJ_CAUSAL_BOTTOM_RIGHT},
    {96, 64, 128, 128, 12, 2, FJ_BF16, FJ_CAUSAL_NONE},
    {256, 128, 128, 64, 12, 2, FJ_F16, FJ_CAUSAL_BOTTOM_RIGHT},
    {64, 128, 64, 192, 8, 2, FJ_BF16, FJ_CAUSAL_TOP_LEFT},
};

size_t fjt_head_dim_v_variants(fj_variant *out, size_t max)
{
  size_t n = sizeof explicit_cases / sizeof explicit_cases[0];
  for (size_t i = 0; i < n && i < max; i++) {
    fj_variant *v = &out[i];
    fj_variant_default(v, explicit_cases[i].d, explicit_cases[i].dt,
                       explicit_cases[i].m);
    v->head_dim_v = explicit_cases[i].dv;
    v->mma = FJ_MMA_WGMMA;
    v->swizzle = FJ_SWIZZLE_XOR;
    v->tile_m = explicit_cases[i].tile_m;
    v->tile_n = explicit_cases[i].tile_n;
    v->warps = explicit_cases[i].warps;
    v->stages = explicit_cases[i].stages;
  }
  return n < max ? n : max;
}

/* p's plan on ctx fails with want and a message holding text. */
static int plan_refused(fj_ctx *ctx, const fj_problem *p, fj_status want,
                        const char *text)
{
  fj_plan plan;
  CHECK_ST(ctx, fj_attention_plan(ctx, p, &plan), want);
  CHECK_MSG(ctx, text);
  CHECK(!strchr(fj_errmsg(ctx), '\n'));
  return 0;
}

static int variant_refused(fj_ctx *ctx, const fj_variant *v, fj_status want,
                           const char *text)
{
  CHECK_ST(ctx, fj_variant_check(ctx, v), want);
  CHECK_MSG(ctx, text);
  CHECK(!strchr(fj_errmsg(ctx), '\n'));
  return 0;
}

/* Values out of range, on the problem and on the variant. */
static int range_refusals(fj_ctx *ctx)
{
  static const int bad[] = {130, 520, -8, 4, 7};
  fj_problem p;
  fj_variant v;
  char want[96];
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    fjt_split_problem(&p, 1, 2, 2, 64, 64, 192, 128, FJ_F16, FJ_BHSD);
    p.head_dim_v = bad[i];
    snprintf(want, sizeof want, "head_dim_v %d is invalid: a multiple of 8 "
             "from 8 to 512, or 0 (head_dim)", bad[i]);
    CHECK_ST(ctx, fj_problem_check(ctx, &p), FJ_ERR_INVALID_ARG);
    CHECK_MSG(ctx, want);
    CHECK_ST(NULL, fj_problem_check_lengths(&p), FJ_ERR_INVALID_ARG);
    CHECK_MSG(NULL, want);
    fj_variant_default(&v, 192, FJ_F16, FJ_CAUSAL_NONE);
    v.head_dim_v = bad[i];
    CHECK(variant_refused(ctx, &v, FJ_ERR_INVALID_ARG, want) == 0);
  }
  return 0;
}

/* p's plan on ctx: the mma family with V read from K's rows (head_dim_v
 * kept), what the wgmma family does not take. */
static int plan_mma(fj_ctx *ctx, const fj_problem *p)
{
  fj_plan plan;
  CHECK_ST(ctx, fj_attention_plan(ctx, p, &plan), FJ_OK);
  CHECK(plan.variant.mma == FJ_MMA_SYNC);
  CHECK(plan.variant.head_dim_v == p->head_dim_v);
  return 0;
}

/* What takes one head dim only (the wmma family, FP8, the wgmma family's
 * GQA packing and split-KV), and what the mma family takes instead of the
 * wgmma family (V as K's first columns: splits, pages, strides TMA cannot
 * encode, sm_80), or refuses (head_dim_v above head_dim). */
static int family_refusals(fj_ctx *ctx90, fj_ctx *ctx80)
{
  fj_problem p;
  fjt_split_problem(&p, 2, 8, 8, 1024, 1024, 192, 128, FJ_F16, FJ_BHSD);
  CHECK(plan_mma(ctx80, &p) == 0);
  fj_problem up = p;
  fjt_split_problem(&up, 2, 8, 8, 1024, 1024, 64, 128, FJ_F16, FJ_BHSD);
  CHECK(plan_refused(ctx80, &up, FJ_ERR_UNSUPPORTED,
                     "head_dim_v 128 with head_dim 64 is not implemented "
                     "for mma mma: it reads V as the first head_dim_v "
                     "columns of K's rows") == 0);
  fj_variant v;
  fj_variant_default(&v, 192, FJ_F16, FJ_CAUSAL_NONE);
  v.head_dim_v = 128;
  CHECK(variant_refused(ctx90, &v, FJ_ERR_UNSUPPORTED,
                        "head_dim_v 128 with head_dim 192 is not implemented "
                        "for mma wmma") == 0);
  CHECK_MSG(ctx90, "split head dims run on mma wgmma (sm_90a) with dtype f16 "
                   "or bf16");
  v.mma = FJ_MMA_SYNC;
  v.tile_m = 16;
  v.warps = 4;
  CHECK_ST(ctx90, fj_variant_check(ctx90, &v), FJ_OK);
  v.head_dim_v = 256;
  CHECK(variant_refused(ctx90, &v, FJ_ERR_UNSUPPORTED, "so head_dim_v is at most "
                        "head_dim") == 0);
  fjt_head_dim_v_variants(&v, 1);
  v.pack_gqa = 1;
  CHECK(variant_refused(ctx90, &v, FJ_ERR_UNSUPPORTED,
                        "head_dim_v 128 with head_dim 192 is not implemented "
                        "for pack_gqa") == 0);
  v.pack_gqa = 0;
  v.split_kv = 1;
  CHECK(variant_refused(ctx90, &v, FJ_ERR_UNSUPPORTED, "for split_kv") == 0);
  v.split_kv = 0;
  v.dtype = FJ_E4M3;
  v.tile_n = 128;
  CHECK(variant_refused(ctx90, &v, FJ_ERR_UNSUPPORTED,
                        "head_dim_v 128 with head_dim 192 is not implemented "
                        "for FP8 (e4m3)") == 0);
  /* Head dims above 256: the mma family's alone. */
  fj_variant_default(&v, 576, FJ_BF16, FJ_CAUSAL_NONE);
  v.head_dim_v = 512;
  CHECK(v.mma == FJ_MMA_SYNC && v.tile_m == 16);
  CHECK_ST(ctx90, fj_variant_check(ctx90, &v), FJ_OK);
  v.mma = FJ_MMA_WGMMA;
  CHECK(variant_refused(ctx90, &v, FJ_ERR_UNSUPPORTED,
                        "head_dim 576 with head_dim_v 512 is not implemented "
                        "for mma wgmma: head dims above 256 run on mma mma") == 0);
  /* The problems: FP8 (Q, K and V; K and V alone) refused; splits,
   * pages and what TMA cannot take go to the mma family. */
  static const float scales[1];
  fj_problem f = p;
  f.dtype = FJ_E4M3;
  f.q_scale = f.k_scale = f.v_scale = scales;
  CHECK(plan_refused(ctx90, &f, FJ_ERR_UNSUPPORTED, "for FP8 (e4m3)") == 0);
  f.dtype = FJ_F16;
  f.kv_dtype = FJ_E4M3;
  CHECK(plan_refused(ctx90, &f, FJ_ERR_UNSUPPORTED, "for FP8 (e4m3)") == 0);
  f = p;
  f.splits = 2;
  CHECK(plan_mma(ctx90, &f) == 0);
  static const int32_t table[1];
  f = p;
  f.block_table = f.seqused_kv = table;
  f.page_size = 16;
  f.max_pages = 64;
  f.num_pages = 64;
  memset(f.k_stride, 0, sizeof f.k_stride);
  f.k_stride[0] = 16 * 8 * 192;
  f.k_stride[1] = 192;
  f.k_stride[2] = 8 * 192;
  memcpy(f.v_stride, f.k_stride, sizeof f.v_stride);
  CHECK(plan_mma(ctx90, &f) == 0);
  f = p;
  f.k_stride[1] = 0;
  CHECK(plan_mma(ctx90, &f) == 0);
  /* Where the wgmma family must run (head_dim_v above head_dim), what TMA
   * cannot take is named. */
  f = up;
  f.k_stride[1] = 0;
  CHECK(plan_refused(ctx90, &f, FJ_ERR_UNSUPPORTED,
                     "head_dim_v 128 with head_dim 64 runs on mma wgmma "
                     "only, which does not take a stride of 0") == 0);
  return 0;
}

/* The backward (library and reference), the tuner, the tiered JIT's
 * portable kernel, and a variant that is not the problem's. */
static int other_refusals(fj_ctx *ctx)
{
  fj_problem p;
  fjt_split_problem(&p, 1, 4, 4, 256, 256, 192, 128, FJ_BF16, FJ_BSHD);
  fj_bwd_plan bp;
  CHECK_ST(ctx, fj_attention_bwd_plan(ctx, &p, &bp), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "the backward does not take head_dim_v 128 with head_dim "
                 "192 yet");
  fj_problem small;
  fjt_split_problem(&small, 1, 1, 1, 2, 2, 16, 8, FJ_F16, FJ_BHSD);
  uint16_t in[64] = {0};
  float g[64];
  CHECK_ST(NULL, fj_reference_bwd(&small, in, in, in, in, g, g, g, NULL),
           FJ_ERR_UNSUPPORTED);
  CHECK_MSG(NULL, "head_dim_v 8 with head_dim 16 is not implemented in the "
                  "backward");
  /* Tuned as any problem (the database's class says |dv=128): only a GPU
   * context tunes.  Its candidates: the wgmma family's alone where V is
   * not in K's rows (the mma family's launches would be refused), both
   * families' with V as K's first columns (MLA's latent cache). */
  fj_variant best;
  CHECK_ST(ctx, fj_tune(ctx, &p, NULL, &best, NULL), FJ_ERR_COMPILE_ONLY);
  static fj_variant cands[384];
  size_t nc = fj__tune_candidates(ctx, &p, cands, 384), sync = 0;
  for (size_t i = 0; i < nc; i++)
    sync += cands[i].mma != FJ_MMA_WGMMA;
  CHECK(nc > 1 && sync == 0 && cands[0].head_dim_v == 128);
  fj_problem lat = p;
  memcpy(lat.v_stride, lat.k_stride, sizeof lat.k_stride);
  nc = fj__tune_candidates(ctx, &lat, cands, 384);
  sync = 0;
  for (size_t i = 0; i < nc; i++)
    sync += cands[i].mma == FJ_MMA_SYNC;
  CHECK(sync > 0);
  /* The portable first kernel has one head dim: it never serves. */
  fj_ctx_opts o;
  fj_ctx_opts_init(&o);
  o.device = -1;
  o.arch = "sm_90a";
  o.jit_tiers = 1;
  fj_ctx *tiers;
  CHECK_OK(NULL, fj_ctx_create(&tiers, &o));
  fj_plan plan;
  CHECK_OK(tiers, fj_attention_plan(tiers, &p, &plan));
  CHECK(!fj__tier_serves(tiers, &p, &plan.variant));
  fj_kernel *first;
  CHECK_ST(tiers, fj_kernel_get_first(tiers, &plan.variant, &first),
           FJ_ERR_UNSUPPORTED);
  CHECK_MSG(tiers, "fj_kernel_get_first: head_dim_v 128 with head_dim 192: "
                   "the tiered JIT's first kernel takes one head dim");
  fj_problem same;
  fj_problem_init(&same, 1, 4, 4, 256, 256, 128, FJ_BF16, FJ_BSHD);
  CHECK_OK(tiers, fj_attention_plan(tiers, &same, &plan));
  CHECK(fj__tier_serves(tiers, &same, &plan.variant));
  fj_ctx_destroy(tiers);
  /* A variant of another head_dim_v than the problem's is named so. */
  fj_variant v;
  fjt_head_dim_v_variants(&v, 1);
  v.dtype = FJ_BF16;
  v.causal = FJ_CAUSAL_NONE;
  v.head_dim_v = 0;
  static uint64_t buf[64];
  CHECK_ST(ctx, fj_attention_fwd_variant(ctx, &p, &v, buf, buf, buf, buf,
                                         NULL, NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "variant (head_dim 192, head_dim_v 192, dtype bf16, kv "
                 "bf16, causal none) does not match the problem (head_dim "
                 "192, head_dim_v 128,");
  return 0;
}

int test_head_dim_v_refusals(void)
{
  fj_ctx *ctx90 = fjt_ctx("sm_90a", NULL), *ctx80 = fjt_ctx("sm_80", NULL);
  CHECK(ctx90 && ctx80);
  int bad = range_refusals(ctx90) || family_refusals(ctx90, ctx80) ||
            other_refusals(ctx90);
  fj_ctx_destroy(ctx90);
  fj_ctx_destroy(ctx80);
  return bad;
}

/* ---- names and plans ----------------------------------------------------------- */

static int name_is(const fj_variant *v, const char *want)
{
  char name[160];
  fj_variant_name(v, name, sizeof name);
  if (strcmp(name, want)) {
    fprintf(stderr, "name %s, want %s\n", name, want);
    return 1;
  }
  return 0;
}

/* Names gain "_v<N>" only where head_dim_v differs; the plan of a split
 * problem is the wgmma family's, and two problems apart only in
 * head_dim_v never share a pick (the plan remembers its picks). */
int test_head_dim_v_names(void)
{
  fj_variant v;
  fj_variant_default(&v, 64, FJ_F16, FJ_CAUSAL_NONE);
  CHECK(name_is(&v, "fj_attn_d64_m64_n128_w4_s2_pad_regs_wmma_nc_f16") == 0);
  v.head_dim_v = 64;
  CHECK(name_is(&v, "fj_attn_d64_m64_n128_w4_s2_pad_regs_wmma_nc_f16") == 0);
  fjt_head_dim_v_variants(&v, 1);
  CHECK(name_is(&v, "fj_attn_d192_v128_m128_n64_w12_s3_xor_regs_wgmma_tl_bf16") == 0);
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  fj_problem p[3];
  fjt_split_problem(&p[0], 2, 16, 16, 4096, 4096, 192, 128, FJ_BF16, FJ_BSHD);
  fj_problem_init(&p[1], 2, 16, 16, 4096, 4096, 192, FJ_BF16, FJ_BSHD);
  p[2] = p[1];
  p[2].head_dim_v = 192;  /* the same as 0 */
  static const char *const want[3] = {
      "fj_attn_d192_v128_m128_n96_w12_s2_xor_regs_wgmma_nc_bf16",
      "fj_attn_d192_m128_n96_w12_s2_xor_regs_wgmma_nc_bf16",
      "fj_attn_d192_m128_n96_w12_s2_xor_regs_wgmma_nc_bf16"};
  for (int round = 0; round < 2; round++)
    for (int i = 0; i < 3; i++) {
      fj_plan plan;
      CHECK_OK(ctx, fj_attention_plan(ctx, &p[i], &plan));
      CHECK(name_is(&plan.variant, want[i]) == 0);
    }
  /* Decode and small shapes of a split problem take the wgmma family too
   * (no GQA packing: one query head a block). */
  fj_problem d;
  fjt_split_problem(&d, 1, 16, 2, 1, 3000, 192, 128, FJ_F16, FJ_BHSD);
  fj_plan plan;
  CHECK_OK(ctx, fj_attention_plan(ctx, &d, &plan));
  CHECK(plan.variant.mma == FJ_MMA_WGMMA && !plan.variant.pack_gqa &&
        plan.variant.head_dim_v == 128 && plan.splits == 1);
  fj_ctx_destroy(ctx);
  return 0;
}

/* ---- the kernels compile for sm_90a -------------------------------------------- */

static int dv_of(const fj_variant *v)
{
  return v->head_dim_v ? v->head_dim_v : v->head_dim;
}

static int compiles(fj_ctx *ctx, const fj_variant *v)
{
  fj_kernel *k;
  CHECK_OK(ctx, fj_kernel_get(ctx, v, &k));
  fj_resources r;
  fj_kernel_resources(k, &r);
  printf("%s: %d registers, %d/%d spill bytes, %d bytes of shared memory\n",
         fj_kernel_name(k), r.registers, r.spill_store_bytes,
         r.spill_load_bytes, r.shared_dynamic);
  CHECK(r.spill_store_bytes == 0 && r.spill_load_bytes == 0);
  const char *src = fj_kernel_source(k, NULL);
  char line[64];
  snprintf(line, sizeof line, " head_dim_v=%d ", dv_of(v));
  CHECK(strstr(src, line));
  return 0;
}

/* The library's choices for the GPU test's head dims, with and without a
 * causal mask, and its explicit variants: all compile without spills. */
int test_head_dim_v_compile(void)
{
  static const int dims[][2] = {{192, 128}, {128, 64}, {96, 64}, {256, 128}, {64, 128}};
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
    for (int causal = 0; causal < 2; causal++) {
      fj_problem p;
      fjt_split_problem(&p, 2, 16, 4, 3000, 3000, dims[i][0], dims[i][1],
                        causal ? FJ_BF16 : FJ_F16, FJ_BHSD);
      p.causal = causal ? FJ_CAUSAL_BOTTOM_RIGHT : FJ_CAUSAL_NONE;
      fj_plan plan;
      CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
      CHECK(plan.variant.mma == FJ_MMA_WGMMA);
      CHECK(compiles(ctx, &plan.variant) == 0);
    }
  fj_variant vs[8];
  size_t n = fjt_head_dim_v_variants(vs, 8);
  for (size_t i = 0; i < n; i++)
    CHECK(compiles(ctx, &vs[i]) == 0);
  /* Packed sequences with their totals: the wgmma family's varlen walk
   * (not run on a GPU by gpu_head_dim_v). */
  static const int32_t cu[3];
  fj_problem p;
  fjt_split_problem(&p, 2, 16, 16, 1024, 1024, 192, 128, FJ_BF16, FJ_THD);
  p.causal = FJ_CAUSAL_BOTTOM_RIGHT;
  p.cu_seqlens_q = p.cu_seqlens_kv = cu;
  p.total_q = p.total_kv = 2048;
  fj_plan plan;
  CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
  CHECK(plan.variant.mma == FJ_MMA_WGMMA && plan.variant.varlen);
  CHECK(compiles(ctx, &plan.variant) == 0);
  fj_ctx_destroy(ctx);
  return 0;
}

/* Wide heads and MLA's latent cache on the mma family, compiled without a
 * GPU for sm_80, sm_86 and sm_90a: the library's plans (MLA's decode contiguous,
 * paged and speculative; head dims 512 and 320) are the mma family's, compile
 * without spills, and launch with the shared memory the kernel asks for
 * (the plan's estimate, fj__variant_tiles_smem, is the template's); the
 * latent kernels have no V ring, the wide ones the warps' exchange. */
int test_wide_heads_compile(void)
{
  /* sm_86: a part of about 100 KB a block, where the plan falls back. */
  static const char *const archs[] = {"sm_80", "sm_86", "sm_90a"};
  static const int32_t table[1];
  for (size_t a = 0; a < 3; a++) {
    fj_ctx *ctx = fjt_ctx(archs[a], NULL);
    CHECK(ctx);
    for (int i = 0; i < 5; i++) {
      fj_problem p;
      if (i < 3) {  /* MLA: 16 heads over one latent head, v = k */
        fjt_split_problem(&p, 8, 16, 1, i == 2 ? 2 : 1, 4096, 576, 512, FJ_BF16, FJ_BSHD);
        memcpy(p.v_stride, p.k_stride, sizeof p.v_stride);
        p.causal = i == 2 ? FJ_CAUSAL_BOTTOM_RIGHT : FJ_CAUSAL_NONE;
        if (i == 1) {
          p.block_table = p.seqused_kv = table;
          p.page_size = 64;
          p.max_pages = 64;
          p.num_pages = 512;
          int64_t st[3] = {64 * 576, 576, 576};
          memcpy(p.k_stride, st, sizeof st);
          memcpy(p.v_stride, st, sizeof st);
        }
      } else {
        fj_problem_init(&p, 2, 8, 4, 1024, 1024, i == 3 ? 512 : 320, FJ_F16, FJ_BHSD);
        p.causal = FJ_CAUSAL_TOP_LEFT;
      }
      fj_plan plan;
      CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
      CHECK(plan.variant.mma == FJ_MMA_SYNC && plan.variant.tile_m == 16);
      fj_kernel *k;
      CHECK_OK(ctx, fj_kernel_get(ctx, &plan.variant, &k));
      fj_resources r;
      fj_kernel_resources(k, &r);
      printf("%s %s: %d registers, %d/%d spill bytes, %d bytes of shared memory (plan %u)\n",
             archs[a], fj_kernel_name(k), r.registers, r.spill_store_bytes,
             r.spill_load_bytes, r.shared_dynamic, plan.smem_bytes);
      CHECK(r.spill_store_bytes == 0 && r.spill_load_bytes == 0);
      CHECK((unsigned)r.shared_dynamic == plan.smem_bytes);
      fj_variant v = plan.variant;
      CHECK(fj__variant_tiles_smem(&v) == r.shared_dynamic);
      const char *src = fj_kernel_source(k, NULL);
      CHECK(!strstr(src, "; v @") == (i < 3));   /* V is K's tile */
      CHECK(strstr(src, "; xp @") != NULL);       /* V above 256 columns */
    }
    fj_ctx_destroy(ctx);
  }
  return 0;
}

/* ---- head dims padded to 16 columns (the mma family) ------------------------------ */

/* A paged decode's K and V: pages of 16 tokens of one KV head's rows. */
static void make_paged(fj_problem *p, const int32_t *table)
{
  int d = p->head_dim;
  p->block_table = p->seqused_kv = table;
  p->page_size = 16;
  p->max_pages = 256;
  p->num_pages = 256 * p->batch;
  int64_t st[3] = {16 * p->heads_kv * (int64_t)d, d, p->heads_kv * (int64_t)d};
  memcpy(p->k_stride, st, sizeof st);
  memcpy(p->v_stride, st, sizeof st);
}

/* Problem i of padded_cases for head dim d (dv: V's, 0 for d): prefill
 * (causal), a GQA decode (packed and split) and a paged one; split head
 * dims as MLA's decode (v = k). */
static void padded_problem(fj_problem *p, int d, int dv, int kind,
                           const int32_t *table)
{
  if (dv) {
    fjt_split_problem(p, 8, 16, 1, 1, 4096, d, dv, FJ_BF16, FJ_BSHD);
    memcpy(p->v_stride, p->k_stride, sizeof p->v_stride);
  } else if (kind == 0) {
    fj_problem_init(p, 2, 8, 8, 1024, 1024, d, FJ_BF16, FJ_BHSD);
    p->causal = FJ_CAUSAL_TOP_LEFT;
  } else {
    fj_problem_init(p, 8, 32, 8, 1, 4096, d, FJ_BF16, FJ_BSHD);
    if (kind == 2)
      make_paged(p, table);
  }
}

/* p's plan on sm_90a is the mma family's with the same tiles, packing,
 * splits and grid as q's (q: the head dim p's pads to). */
static int plans_alike(fj_ctx *ctx, const fj_problem *p, const fj_problem *q)
{
  fj_plan a, b;
  CHECK_OK(ctx, fj_attention_plan(ctx, p, &a));
  CHECK_OK(ctx, fj_attention_plan(ctx, q, &b));
  char name[160];
  fj_variant_name(&a.variant, name, sizeof name);
  printf("d%d (%d,%d/%d,%d/%d) splits %d: %s, %d splits, grid %u,%u,%u\n",
         p->head_dim, p->batch, p->heads_q, p->heads_kv, p->seq_q, p->seq_kv,
         p->splits, name, a.splits, a.grid[0], a.grid[1], a.grid[2]);
  CHECK(a.variant.mma == FJ_MMA_SYNC && b.variant.mma == FJ_MMA_SYNC);
  CHECK(a.variant.pack_gqa == b.variant.pack_gqa &&
        a.variant.split_kv == b.variant.split_kv);
  CHECK(a.variant.tile_m == b.variant.tile_m &&
        a.variant.tile_n == b.variant.tile_n &&
        a.variant.warps == b.variant.warps &&
        a.variant.stages == b.variant.stages);
  CHECK(a.splits == b.splits && a.rows == b.rows &&
        !memcmp(a.grid, b.grid, sizeof a.grid));
  return 0;
}

/* On sm_90a the decodes of head dims padded to 16 columns (40, 72, 88),
 * and their problems that ask for splits, are the mma family's, packed
 * and split as the head dim they pad to (48, 80, 96): a single decode
 * (8 query heads over one KV head, 30000 keys: packed, split), a batched
 * GQA one (64, 32/8, 1/4096: packed, not split) and 4 asked-for splits,
 * of a decode and of a prefill.  A prefill without splits follows the
 * rule of d + 8 too: the mma family's where it is too small for 128-row
 * blocks, the wgmma family's when long. */
int test_padded_heads_plan(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  static const int dims[] = {40, 72, 88};
  for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
    int d = dims[i];
    fj_problem p, q;
    fj_plan plan;
    fj_problem_init(&p, 1, 8, 1, 1, 30000, d, FJ_F16, FJ_BHSD);
    fj_problem_init(&q, 1, 8, 1, 1, 30000, d + 8, FJ_F16, FJ_BHSD);
    CHECK(plans_alike(ctx, &p, &q) == 0);
    CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
    CHECK(plan.variant.pack_gqa && plan.rows == 8 && plan.splits > 1 &&
          plan.variant.split_kv);
    p.splits = q.splits = 4;
    CHECK(plans_alike(ctx, &p, &q) == 0);
    CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
    CHECK(plan.splits == 4 && plan.variant.pack_gqa);
    fj_problem_init(&p, 64, 32, 8, 1, 4096, d, FJ_BF16, FJ_BSHD);
    fj_problem_init(&q, 64, 32, 8, 1, 4096, d + 8, FJ_BF16, FJ_BSHD);
    CHECK(plans_alike(ctx, &p, &q) == 0);
    CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
    CHECK(plan.variant.pack_gqa && plan.rows == 4 && plan.splits == 1 &&
          plan.variant.tile_m == 16);
    fj_problem_init(&p, 2, 8, 8, 1000, 1000, d, FJ_F16, FJ_BHSD);
    p.splits = 4;
    CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
    CHECK(plan.variant.mma == FJ_MMA_SYNC && plan.splits == 4 &&
          plan.variant.split_kv);
    /* Without splits: too small for a 128-row block per multiprocessor,
     * the mma family's 64-row blocks as at d + 8; a long prefill wgmma. */
    p.splits = 0;
    fj_problem_init(&q, 2, 8, 8, 1000, 1000, d + 8, FJ_F16, FJ_BHSD);
    CHECK(plans_alike(ctx, &p, &q) == 0);
    fj_problem_init(&p, 4, 16, 16, 4096, 4096, d, FJ_F16, FJ_BHSD);
    CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
    CHECK(plan.variant.mma == FJ_MMA_WGMMA && plan.splits == 1);
  }
  fj_ctx_destroy(ctx);
  return 0;
}

/* v's kernel compiles without spills, with the shared memory smem (the
 * plan's) that fj__variant_tiles_smem counts; a padded head dim zeroes its
 * tiles' pad. */
static int padded_compiles(fj_ctx *ctx, const char *arch, const fj_variant *v,
                           unsigned smem)
{
  fj_kernel *k;
  CHECK_OK(ctx, fj_kernel_get(ctx, v, &k));
  fj_resources r;
  fj_kernel_resources(k, &r);
  printf("%s %s: %d registers, %d/%d spill bytes, %d bytes of shared memory\n",
         arch, fj_kernel_name(k), r.registers, r.spill_store_bytes,
         r.spill_load_bytes, r.shared_dynamic);
  CHECK(r.spill_store_bytes == 0 && r.spill_load_bytes == 0);
  CHECK((unsigned)r.shared_dynamic == smem);
  CHECK(fj__variant_tiles_smem(v) == r.shared_dynamic);
  int padded = fj__mma_tile_cols(v) > v->head_dim;
  CHECK(!strstr(fj_kernel_source(k, NULL), "fj::zero_pad(s_k") == !padded);
  return 0;
}

/* gpu_wide_heads' explicit variants at padded head dims (both swizzles,
 * head dims 8 and 24, O's rows apart): each passes fj_variant_check,
 * compiles as padded_compiles says, and its problem passes every check
 * of a launch but the device (FJ_ERR_COMPILE_ONLY: the variant matches
 * the problem, O's strides and the splits are taken). */
static int padded_gpu_variants(fj_ctx *ctx, const char *arch)
{
  enum { MAX = 32 };
  fj_problem p[MAX];
  fj_variant v[MAX];
  size_t n = fjt_padded_variants(p, v, MAX);
  CHECK(n >= 20 && n <= MAX);
  int xor = 0, narrow = 0, gaps = 0;
  for (size_t i = 0; i < n; i++) {
    CHECK_OK(ctx, fj_variant_check(ctx, &v[i]));
    CHECK(padded_compiles(ctx, arch, &v[i],
                          (unsigned)fj__variant_tiles_smem(&v[i])) == 0);
    /* 16-byte aligned, never read. */
    void *q = (void *)(uintptr_t)0x100000, *o = (void *)(uintptr_t)0x300000;
    void *k = (void *)(uintptr_t)0x200000, *vp = (void *)(uintptr_t)0x400000;
    if (p[i].head_dim_v && p[i].head_dim_v != p[i].head_dim)
      vp = k;  /* V is K's rows */
    CHECK_ST(ctx, fj_attention_fwd_variant(ctx, &p[i], &v[i], q, k, vp, o,
                                           NULL, NULL),
             FJ_ERR_COMPILE_ONLY);
    xor += v[i].swizzle == FJ_SWIZZLE_XOR;
    narrow += v[i].head_dim < 32;
    gaps += p[i].o_stride[2] % dv_of(&v[i]) != 0 ||
            p[i].o_stride[1] % dv_of(&v[i]) != 0;
  }
  printf("%s: %zu explicit variants of gpu_wide_heads, %d xor, %d of head "
         "dim 8 or 24, %d with O's rows apart\n", arch, n, xor, narrow, gaps);
  CHECK(xor >= 5 && narrow >= 6 && gaps == 2);
  return 0;
}

/* Head dims that are a multiple of 8 but not of 16, which the mma family
 * pads to 16 columns (attention_mma.cu's DP and DVP), and wide ones whose
 * warps split V's columns in padded tiles (272: 17 tiles of 16).  The
 * library's picks compile on sm_80 (prefill, a packed and split decode,
 * a paged one for a few) and on sm_90a where they go to the mma family
 * (decodes; a prefill too small for wgmma's 128-row blocks; above 256;
 * MLA's split head dims above 256), and so do the
 * GPU test's explicit variants at these head dims on both; FP8 K/V refuse
 * a padded head dim in one line. */
int test_padded_heads_compile(void)
{
  static const int dims[][3] = {
      /* d, dv, the paged decode too */
      {8, 0, 0},   {24, 0, 0},  {40, 0, 1},  {72, 0, 0},  {104, 0, 0},
      {136, 0, 0}, {200, 0, 1}, {264, 0, 1}, {272, 0, 0}, {520, 0, 0},
      {72, 40, 0},
  };
  static const char *const archs[] = {"sm_80", "sm_90a"};
  static const int32_t table[1];  /* never read: nothing runs */
  for (size_t a = 0; a < 2; a++) {
    fj_ctx *ctx = fjt_ctx(archs[a], NULL);
    CHECK(ctx);
    int ran = 0;
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
      for (int kind = 0; kind < (dims[i][1] ? 1 : dims[i][2] ? 3 : 2); kind++) {
        fj_problem p;
        padded_problem(&p, dims[i][0], dims[i][1], kind, table);
        fj_plan plan;
        CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
        /* sm_90a's wgmma family takes only the split head dims up to
         * 256 here: the prefill (2,8,1024) is too small for its 128-row
         * blocks, as at d + 8 (padded_heads_plan). */
        if (plan.variant.mma != FJ_MMA_SYNC) {
          CHECK(a == 1 && p.head_dim <= 256 && dims[i][1]);
          continue;
        }
        CHECK(padded_compiles(ctx, archs[a], &plan.variant, plan.smem_bytes) == 0);
        ran++;
      }
    CHECK(a == 0 ? ran == 24 : ran == 23);
    CHECK(padded_gpu_variants(ctx, archs[a]) == 0);
    /* A split head_dim_v above 256 that is not a multiple of 16 (504 under
     * 576: V's columns padded where the warps split them) gave wrong
     * results on the H200 (2026-12-05): refused, by name. */
    for (int dv = 264; dv <= 504; dv += 240) {
      fj_problem p;
      padded_problem(&p, dv == 264 ? 520 : 576, dv, 0, table);
      fj_plan plan;
      CHECK_ST(ctx, fj_attention_plan(ctx, &p, &plan), FJ_ERR_UNSUPPORTED);
      CHECK_MSG(ctx, "is not implemented: above 256 a split head_dim_v must be a multiple of 16");
    }
    fj_ctx_destroy(ctx);
  }
  /* FP8 K/V: a 16-byte chunk is 16 elements, so no padded head dim. */
  fj_ctx *ctx = fjt_ctx("sm_80", NULL);
  CHECK(ctx);
  static const float scales[8 * 8];
  fj_problem p;
  padded_problem(&p, 40, 0, 1, table);
  p.kv_dtype = FJ_E4M3;
  p.k_scale = p.v_scale = scales;
  CHECK(plan_refused(ctx, &p, FJ_ERR_UNSUPPORTED,
                     "head_dim 40 with kv_dtype e4m3 is not implemented: FP8 "
                     "K/V take a multiple of 16") == 0);
  /* The backward pads it too (the mma family's main kernel to 32
   * columns, its pad zeroed in shared memory: no spill); above 256 it
   * refuses in one line. */
  padded_problem(&p, 40, 0, 0, table);
  fj_bwd_plan bp;
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &bp));
  CHECK(bp.variant.mma == FJ_MMA_SYNC);
  fj_kernel *bk;
  CHECK_OK(ctx, fj_attention_bwd_kernel(ctx, &p, &bp, 1, &bk));
  CHECK(strstr(fj_kernel_source(bk, NULL), "fj::zero_pad(s_k, 64);") != NULL);
  fj_resources br;
  fj_kernel_resources(bk, &br);
  CHECK(br.spill_store_bytes == 0 && br.spill_load_bytes == 0);
  fj_problem_init(&p, 1, 2, 2, 64, 64, 264, FJ_F16, FJ_BSHD);
  CHECK_ST(ctx, fj_attention_bwd_plan(ctx, &p, &bp), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "head_dim 264: the mma backward takes multiples of 8 up to 256");
  CHECK(!strchr(fj_errmsg(ctx), '\n'));
  fj_ctx_destroy(ctx);
  return 0;
}

/* ---- the reference ------------------------------------------------------------- */

static void fill(uint16_t *x, size_t n, uint64_t *s)
{
  for (size_t i = 0; i < n; i++) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    float f = (float)((double)(*s >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
    fj_convert(FJ_F16, &x[i], FJ_F32, &f, 1);
  }
}

static double h2d(uint16_t h)
{
  float f;
  fj_convert(FJ_F32, &f, FJ_F16, &h, 1);
  return f;
}

/* O of one row by the formula: scores over head_dim, values over
 * head_dim_v, bottom-right causal. */
static void naive_row(const fj_problem *p, const uint16_t *q,
                      const uint16_t *k, const uint16_t *v, int b, int h,
                      int i, double *o)
{
  int hk = h / (p->heads_q / p->heads_kv), dv = p->head_dim_v;
  double s[64], mx = -HUGE_VAL, sum = 0;
  for (int j = 0; j < p->seq_kv; j++) {
    s[j] = -HUGE_VAL;
    if (j > i + p->seq_kv - p->seq_q)
      continue;
    double acc = 0;
    for (int e = 0; e < p->head_dim; e++)
      acc += h2d(q[b * p->q_stride[0] + h * p->q_stride[1] + i * p->q_stride[2] + e]) *
             h2d(k[b * p->k_stride[0] + hk * p->k_stride[1] + j * p->k_stride[2] + e]);
    s[j] = acc / sqrt(p->head_dim);
    mx = fmax(mx, s[j]);
  }
  for (int e = 0; e < dv; e++)
    o[e] = 0;
  for (int j = 0; j < p->seq_kv; j++) {
    if (s[j] == -HUGE_VAL)
      continue;
    double w = exp(s[j] - mx);
    sum += w;
    for (int e = 0; e < dv; e++)
      o[e] += w * h2d(v[b * p->v_stride[0] + hk * p->v_stride[1] + j * p->v_stride[2] + e]);
  }
  for (int e = 0; e < dv; e++)
    o[e] /= sum;
}

/* head_dim_v = head_dim is the one-head-dim path bit for bit; a split
 * problem (24 / 16, GQA 2:1, bottom-right, BSHD) is the naive loop. */
int test_head_dim_v_reference(void)
{
  enum { B = 2, HQ = 4, HKV = 2, SQ = 5, SKV = 9, D = 24, DV = 16 };
  uint64_t seed = 34;
  uint16_t *q = malloc(B * HQ * SQ * D * 2), *k = malloc(B * HKV * SKV * D * 2);
  uint16_t *v = malloc(B * HKV * SKV * D * 2);
  double *o1 = malloc(sizeof(double) * B * HQ * SQ * D);
  double *o2 = malloc(sizeof(double) * B * HQ * SQ * D);
  double l1[B * HQ * SQ], l2[B * HQ * SQ];
  CHECK(q && k && v && o1 && o2);
  fill(q, B * HQ * SQ * D, &seed);
  fill(k, B * HKV * SKV * D, &seed);
  fill(v, B * HKV * SKV * D, &seed);
  fj_problem p;
  fj_problem_init(&p, B, HQ, HKV, SQ, SKV, D, FJ_F16, FJ_BSHD);
  p.causal = FJ_CAUSAL_BOTTOM_RIGHT;
  CHECK_OK(NULL, fj_reference_fwd(&p, q, k, v, NULL, NULL, 0, SQ, o1, l1));
  p.head_dim_v = D;
  CHECK_OK(NULL, fj_reference_fwd(&p, q, k, v, NULL, NULL, 0, SQ, o2, l2));
  CHECK(!memcmp(o1, o2, sizeof(double) * B * HQ * SQ * D));
  CHECK(!memcmp(l1, l2, sizeof l1));
  /* Split: V of DV columns, O's rows DV apart; the LSE is Q K^T's alone. */
  fjt_split_problem(&p, B, HQ, HKV, SQ, SKV, D, DV, FJ_F16, FJ_BSHD);
  p.causal = FJ_CAUSAL_BOTTOM_RIGHT;
  CHECK(p.v_stride[2] == HKV * DV && p.o_stride[2] == HQ * DV);
  CHECK_OK(NULL, fj_reference_fwd(&p, q, k, v, NULL, NULL, 1, SQ, o2, l2));
  double worst = 0;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < HQ; h++)
      for (int i = 1; i < SQ; i++) {
        double want[DV];
        naive_row(&p, q, k, v, b, h, i, want);
        size_t row = ((size_t)(b * HQ + h) * (SQ - 1) + (size_t)(i - 1));
        for (int e = 0; e < DV; e++)
          worst = fmax(worst, fabs(o2[row * DV + (size_t)e] - want[e]));
        CHECK(fabs(l2[row] - l1[(size_t)(b * HQ + h) * SQ + (size_t)i]) < 1e-12);
      }
  printf("split reference against the naive loop: max |diff| %.2e\n", worst);
  CHECK(worst < 1e-12);
  free(q);
  free(k);
  free(v);
  free(o1);
  free(o2);
  return 0;
}
