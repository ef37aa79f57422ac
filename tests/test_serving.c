/*
 * test_serving.c -- serving shapes without a GPU: what fj_attention_plan
 * decides (GQA packing, splits, grids, workspace) and refuses, and that the
 * kernels it names compile without spills, the combine kernels included.
 * Their results on a GPU are test_gpu.c's gpu_serving_* tests.
 */
#include <math.h>
#include <string.h>

#include "attention.h"
#include "gpu_case.h"
#include "locked.h"
#include "runner.h"

static void decode_problem(fj_problem *p, int b, int hq, int hkv, int sq,
                           int skv, int d, fj_dtype dt)
{
  fj_problem_init(p, b, hq, hkv, sq, skv, d, dt, FJ_BHSD);
}

int test_serving_plan(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  fj_problem p;
  fj_plan plan;
  /* Decode, batch 1: packed rows (4 query heads of a KV head), split. */
  decode_problem(&p, 1, 32, 8, 1, 4096, 128, FJ_F16);
  CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
  CHECK(plan.variant.mma == FJ_MMA_SYNC && plan.variant.pack_gqa == 1 &&
        plan.variant.split_kv == 1 && plan.rows == 4);
  CHECK(plan.splits > 1 && plan.splits <= 64);
  /* Up to 16 packed rows: a 16-row tile whose 4 warps split the keys. */
  CHECK(plan.variant.tile_m == 16 && plan.variant.warps == 4);
  /* Each split walks 2 key tiles: two stages.  The same shape at batch
   * 64 is not split, and each block walks all 64 key tiles: three.  At
   * batch 5 (6 splits of 10 or 11 tiles) two again: batch 5 and 64 share
   * every other part of the pick's key (even the class: neither has
   * fewer blocks than multiprocessors), so this also checks that the
   * pick memory tells them apart, in both orders. */
  CHECK(plan.variant.stages == 2);
  {
    fj_problem pb = p, p5 = p;
    fj_plan planb, plan5;
    pb.batch = 64;
    p5.batch = 5;
    for (int round = 0; round < 2; round++) {
      CHECK_OK(ctx, fj_attention_plan(ctx, &pb, &planb));
      CHECK(planb.splits == 1 && !planb.variant.split_kv && planb.variant.stages == 3 &&
            planb.variant.tile_m == 16);
      CHECK_OK(ctx, fj_attention_plan(ctx, &p5, &plan5));
      CHECK(plan5.splits > 1 && plan5.variant.stages == 2);
    }
  }
  {
    /* FP8 K/V take the cp.async ring too (tile_fp8.cuh): the 16-row
     * tile whose warps split the keys, two or three stages. */
    static const float scales[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    fj_problem p8 = p;
    fj_plan plan8;
    p8.kv_dtype = FJ_E4M3;
    p8.k_scale = p8.v_scale = scales;  /* planned, never read */
    CHECK_OK(ctx, fj_attention_plan(ctx, &p8, &plan8));
    CHECK(plan8.variant.stages >= 2 && plan8.variant.tile_m == 16 &&
          plan8.variant.warps == 4 && plan8.variant.kv_dtype == FJ_E4M3);
  }
  CHECK(plan.grid[0] == (unsigned)plan.splits && plan.grid[1] == 8 && plan.grid[2] == 1);
  CHECK(plan.workspace_bytes == (size_t)plan.splits * 32 * 129 * 4);
  /* The combine: 32 rows, one warp a row up to 4 splits, two up to 8,
   * four past that; 128 threads a block; O's 128 columns one slice. */
  unsigned warps = plan.splits <= 4 ? 1 : plan.splits <= 8 ? 2 : 4;
  CHECK(plan.combine_grid[0] == 32 / (4 / warps) && plan.combine_threads == 128);
  CHECK(plan.combine_grid[1] == 1 && plan.combine_grid[2] == 1 &&
        plan.combine_cols == 128);
  {
    /* MLA's long decode (16 heads over one latent head, O 512 columns,
     * 128 splits): a row a block, 16 blocks on 132 multiprocessors, hence
     * 4 slices of 128 columns, its own kernel (_c128); O 496 columns too,
     * its last slice 112 wide. */
    fj_problem pm;
    fj_plan planm;
    fj_kernel *c;
    fj_resources r;
    fjt_split_problem(&pm, 1, 16, 1, 1, 32768, 576, 512, FJ_BF16, FJ_BSHD);
    memcpy(pm.v_stride, pm.k_stride, sizeof pm.v_stride);
    pm.splits = 128;
    CHECK_OK(ctx, fj_attention_plan(ctx, &pm, &planm));
    CHECK(planm.splits == 128 && planm.combine_grid[0] == 16 &&
          planm.combine_grid[1] == 4 && planm.combine_grid[2] == 1 &&
          planm.combine_cols == 128);
    CHECK_OK(ctx, FJT_LOCKED(ctx, fj__combine_kernel(ctx, &planm.variant, planm.combine_cols, &c)));
    CHECK(!strcmp(fj_kernel_name(c), "fj_combine_d512_bf16_c128"));
    fj_kernel_resources(c, &r);
    CHECK(r.spill_store_bytes == 0 && r.spill_load_bytes == 0);
    CHECK(strstr(fj_kernel_source(c, NULL), "blockIdx.y * 128;"));
    fjt_split_problem(&pm, 1, 16, 1, 1, 32768, 576, 496, FJ_BF16, FJ_BSHD);
    memcpy(pm.v_stride, pm.k_stride, sizeof pm.v_stride);
    CHECK_OK(ctx, fj_attention_plan(ctx, &pm, &planm));
    CHECK(planm.combine_grid[1] == 4 && planm.combine_cols == 128);
    CHECK_OK(ctx, FJT_LOCKED(ctx, fj__combine_kernel(ctx, &planm.variant, planm.combine_cols, &c)));
    CHECK(strstr(fj_kernel_source(c, NULL), "c0 + lane + 32 * i < 496"));
    /* Batched, 2 splits (a warp a row, 4 rows a block): 64 x 16 rows,
     * 256 blocks, fill the GPU: one slice, the plain kernel with no
     * slice in it.  At the edge, 33 x 16 rows are 132 blocks (one slice)
     * and 32 x 16 are 128 (slices). */
    fjt_split_problem(&pm, 64, 16, 1, 1, 4096, 576, 512, FJ_BF16, FJ_BSHD);
    memcpy(pm.v_stride, pm.k_stride, sizeof pm.v_stride);
    pm.splits = 2;
    CHECK_OK(ctx, fj_attention_plan(ctx, &pm, &planm));
    CHECK(planm.splits == 2 && planm.combine_grid[0] == 256 &&
          planm.combine_grid[1] == 1 && planm.combine_grid[2] == 1 &&
          planm.combine_cols == 512);
    CHECK_OK(ctx, FJT_LOCKED(ctx, fj__combine_kernel(ctx, &planm.variant, planm.combine_cols, &c)));
    CHECK(!strcmp(fj_kernel_name(c), "fj_combine_d512_bf16"));
    CHECK(!strstr(fj_kernel_source(c, NULL), "blockIdx.y"));
    pm.batch = 33;
    CHECK_OK(ctx, fj_attention_plan(ctx, &pm, &planm));
    CHECK(planm.combine_grid[0] == 132 && planm.combine_grid[1] == 1 &&
          planm.combine_cols == 512);
    pm.batch = 32;
    CHECK_OK(ctx, fj_attention_plan(ctx, &pm, &planm));
    CHECK(planm.combine_grid[0] == 128 && planm.combine_grid[1] == 4 &&
          planm.combine_cols == 128);
  }
  size_t ws = 0;
  CHECK_OK(ctx, fj_attention_workspace_size(ctx, &p, &ws));
  CHECK(ws == plan.workspace_bytes);
  /* The split rule fills the multiprocessors it plans for: fewer splits
   * for fewer of them -- at 16, one block each (8 heads x 2 splits: 32
   * of the 64 key tiles a block, a walk long enough for one a
   * multiprocessor). */
  int splits132 = plan.splits;
  fj_ctx_opts o;
  fj_ctx_opts_init(&o);
  o.device = -1;
  o.arch = "sm_90a";
  o.disk_cache = 0;
  o.sm_count = 16;
  fj_ctx *small;
  CHECK_OK(NULL, fj_ctx_create(&small, &o));
  CHECK_OK(small, fj_attention_plan(small, &p, &plan));
  CHECK(plan.sm_count == 16 && plan.splits < splits132 &&
        plan.splits == 2);
  /* Long single decodes one block a multiprocessor: 16 splits of 8
   * heads on 132 (32768 keys, 512 tiles of 64), where the slots' rule
   * took 29. */
  {
    fj_problem pl;
    fj_plan planl;
    decode_problem(&pl, 1, 32, 8, 1, 32768, 128, FJ_BF16);
    CHECK_OK(ctx, fj_attention_plan(ctx, &pl, &planl));
    CHECK(planl.sm_count == 132 && planl.variant.tile_n == 64 && planl.splits == 16 &&
          planl.grid[0] == 16 && planl.variant.stages == 3);
    pl.batch = 2;  /* 16 blocks: 8 splits */
    CHECK_OK(ctx, fj_attention_plan(ctx, &pl, &planl));
    CHECK(planl.splits == 8);
    pl.batch = 1;
    pl.seq_kv = 4096;  /* 64 tiles: 4 a block at 16, the slots' rule */
    CHECK_OK(ctx, fj_attention_plan(ctx, &pl, &planl));
    CHECK(planl.splits > 16);
  }
  fj_ctx_destroy(small);
  /* Batched decode fills the GPU by itself: packed, no split, no workspace. */
  decode_problem(&p, 64, 32, 8, 1, 4096, 128, FJ_BF16);
  CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
  CHECK(plan.variant.pack_gqa && !plan.variant.split_kv && plan.splits == 1 &&
        plan.workspace_bytes == 0 && plan.grid[1] == 8 && plan.grid[2] == 64);
  /* Speculative decode, 16 positions x group 8 = 128 packed rows. */
  decode_problem(&p, 2, 64, 8, 16, 1000, 64, FJ_F16);
  CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
  CHECK(plan.variant.pack_gqa && plan.variant.tile_m == 128 && plan.rows == 128);
  /* Asked-for splits, exactly; 1 means none. */
  decode_problem(&p, 2, 8, 8, 100, 100, 64, FJ_F16);
  p.splits = 7;
  CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
  CHECK(plan.splits == 7 && plan.variant.split_kv && plan.grid[0] == 14);
  decode_problem(&p, 1, 32, 8, 1, 4096, 128, FJ_F16);
  p.splits = 1;
  CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
  CHECK(plan.splits == 1 && !plan.variant.split_kv && plan.workspace_bytes == 0);
  /* Prefill keeps the wgmma family, unsplit; a short walk is not split. */
  decode_problem(&p, 4, 16, 16, 4096, 4096, 128, FJ_F16);
  CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
  CHECK(plan.variant.mma == FJ_MMA_WGMMA && plan.splits == 1 && !plan.variant.pack_gqa);
  decode_problem(&p, 1, 8, 8, 512, 512, 64, FJ_F16);
  CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
  CHECK(plan.splits == 1);
  /* Refusals name the value and the limit. */
  p.splits = -1;
  CHECK_ST(ctx, fj_attention_plan(ctx, &p, &plan), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "splits -1 is invalid: 0 (the library's choice), 1 (none) or 2..256");
  p.splits = 257;
  CHECK_ST(ctx, fj_attention_plan(ctx, &p, &plan), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "splits 257 is invalid");
  p.splits = 0;
  fj_variant v;
  fj_variant_default(&v, 64, FJ_F16, FJ_CAUSAL_NONE);
  v.pack_gqa = 1;
  CHECK_ST(ctx, fj_variant_check(ctx, &v), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "pack_gqa is implemented for mma mma only");
  v.pack_gqa = 2;
  CHECK_ST(ctx, fj_variant_check(ctx, &v), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "pack_gqa 2 is invalid: 0 or 1");
  plan.splits = 0;
  CHECK_ST(ctx, fj_attention_fwd_plan(ctx, &p, &plan, &p, &p, &p, &p, NULL, NULL, 0, NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "plan->splits 0 is invalid: 1..256");
  o.sm_count = -2;
  CHECK_ST(NULL, fj_ctx_create(&small, &o), FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "sm_count -2 is invalid");
  /* sm_75: no split-KV (the wmma family) -- said so. */
  fj_ctx *old = fjt_ctx("sm_75", NULL);
  CHECK(old);
  decode_problem(&p, 1, 8, 8, 1, 4096, 64, FJ_F16);
  p.splits = 4;
  CHECK_ST(old, fj_attention_plan(old, &p, &plan), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(old, "split-KV is implemented for mma mma (sm_80 and newer)");
  p.splits = 0;
  CHECK_OK(old, fj_attention_plan(old, &p, &plan));
  CHECK(plan.variant.mma == FJ_MMA_WMMA && plan.splits == 1);
  fj_ctx_destroy(old);
  fj_ctx_destroy(ctx);
  return 0;
}

/* The decode picks of three head dims in both dtypes compile for sm_90a
 * without spills; so do their combine kernels, for d256 both the plan's
 * (slices of 128 columns: 32 rows, fewer blocks than multiprocessors) and
 * the one-slice kernel of batches that fill the GPU. */
int test_serving_compile(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90a", fjt_tmpdir());
  CHECK(ctx);
  static const int dims[] = {64, 128, 256};
  fj_variant vs[6];
  for (int i = 0; i < 6; i++) {
    fj_problem p;
    fj_plan plan;
    decode_problem(&p, 1, 32, 8, 1, 4096, dims[i / 2], i % 2 ? FJ_BF16 : FJ_F16);
    CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
    CHECK(plan.variant.split_kv && plan.variant.pack_gqa);
    vs[i] = plan.variant;
  }
  fj_prepare_opts o = {2, NULL, NULL};
  CHECK_OK(ctx, fj_kernel_prepare(ctx, vs, 6, &o, NULL));
  for (int i = 0; i < 6; i++) {
    fj_kernel *k;
    fj_resources r;
    CHECK_OK(ctx, fj_kernel_get(ctx, &vs[i], &k));
    fj_kernel_resources(k, &r);
    printf("%s: %d registers, %d bytes spilled\n", fj_kernel_name(k),
           r.registers, r.spill_store_bytes);
    CHECK(r.spill_store_bytes == 0 && r.spill_load_bytes == 0);
    const int d = dims[i / 2], cols[2] = {d, 128};
    for (int j = 0; j < (d > 128 ? 2 : 1); j++) {
      fj_kernel *c;
      CHECK_OK(ctx, FJT_LOCKED(ctx, fj__combine_kernel(ctx, &vs[i], cols[j], &c)));
      fj_kernel_resources(c, &r);
      printf("%s: %d registers, %d bytes spilled\n", fj_kernel_name(c),
             r.registers, r.spill_store_bytes);
      CHECK(r.spill_store_bytes == 0 && strstr(fj_kernel_ptx(c, NULL), "shfl.sync"));
    }
  }
  fj_ctx_destroy(ctx);
  return 0;
}

/* ---- variable lengths and the paged KV cache -------------------------------------- */

/* Any non-NULL device pointer: planning only asks whether an array is
 * there. */
static const int32_t dummy[1];

/* A packed (FJ_THD) varlen problem with bounds sq and skv. */
static void varlen_problem(fj_problem *p, int b, int hq, int hkv, int sq,
                           int skv, int d)
{
  fj_problem_init(p, b, hq, hkv, sq, skv, d, FJ_F16, FJ_THD);
  p->cu_seqlens_q = p->cu_seqlens_kv = dummy;
}

/* Paged K/V in the NHD layout, pages of ps tokens. */
static void paged_problem(fj_problem *p, int b, int hq, int hkv, int sq,
                          int skv, int d, int ps)
{
  fj_problem_init(p, b, hq, hkv, sq, skv, d, FJ_BF16, FJ_BHSD);
  p->block_table = p->seqused_kv = dummy;
  p->page_size = ps;
  p->max_pages = (skv + ps - 1) / ps;
  p->num_pages = b * p->max_pages;
  int64_t s[3] = {(int64_t)ps * hkv * d, d, (int64_t)hkv * d};
  memcpy(p->k_stride, s, sizeof s);
  memcpy(p->v_stride, s, sizeof s);
}

/* What the plan makes of varlen and paged problems, and the refusals of
 * fields that contradict each other, each naming the value and the limit. */
int test_serving_varlen(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  fj_problem p;
  fj_plan plan;
  char name[160];
  /* Varlen prefill without the packed tensors' totals: the mma family
   * (TMA must know where a tensor ends), named _vl. */
  varlen_problem(&p, 16, 16, 16, 4096, 4096, 128);
  p.causal = FJ_CAUSAL_BOTTOM_RIGHT;
  CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
  fj_variant_name(&plan.variant, name, sizeof name);
  CHECK(plan.variant.mma == FJ_MMA_SYNC && plan.variant.varlen &&
        !plan.variant.paged && strstr(name, "_vl") && plan.grid[2] == 16);
  /* With both totals, the wgmma family's persistent grid; with one
   * missing, the mma family again. */
  p.total_q = p.total_kv = 16000;
  CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
  fj_variant_name(&plan.variant, name, sizeof name);
  CHECK(plan.variant.mma == FJ_MMA_WGMMA && plan.variant.varlen &&
        strstr(name, "_wgmma_br_f16_vl") && plan.grid[1] == 1 && plan.grid[2] == 1);
  /* Its blocks claim work tiles from a counter in the workspace, and
   * each block's producer hands its tile on through a word there. */
  CHECK(plan.workspace_bytes == 16 + 16 * 132 && plan.grid[0] == 132);
  fj_variant wv = plan.variant;
  p.total_kv = 0;
  CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
  CHECK(plan.variant.mma == FJ_MMA_SYNC);
  /* ...and a wgmma variant asked for by hand says what is missing. */
  CHECK_ST(ctx, fj_attention_fwd_variant(ctx, &p, &wv, &p, &p, &p, &p, NULL, NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "total_kv 0 with cu_seqlens_kv: the wgmma family loads packed rows by TMA");
  p.total_kv = -3;
  CHECK_ST(ctx, fj_problem_check(ctx, &p), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "total_kv -3 is negative");
  fj_problem_init(&p, 2, 8, 8, 100, 100, 64, FJ_F16, FJ_BHSD);
  p.total_q = 200;
  CHECK_ST(ctx, fj_problem_check(ctx, &p), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "total_q 200 without cu_seqlens_q");
  /* Paged K/V stay the mma family's, totals or not. */
  paged_problem(&p, 16, 16, 16, 4096, 4096, 128, 16);
  p.cu_seqlens_q = dummy;
  int64_t thd[3] = {0, 128, 16 * 128};
  memcpy(p.q_stride, thd, sizeof thd);
  memcpy(p.o_stride, thd, sizeof thd);
  p.total_q = 16000;
  CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
  CHECK(plan.variant.mma == FJ_MMA_SYNC && plan.variant.paged);
  /* Paged decode: packed, split where the rule wants it, named _paged. */
  paged_problem(&p, 1, 32, 8, 1, 4096, 128, 16);
  CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
  fj_variant_name(&plan.variant, name, sizeof name);
  CHECK(plan.variant.pack_gqa && plan.variant.split_kv && plan.variant.varlen &&
        plan.variant.paged && plan.splits > 1 && strstr(name, "_vl_paged"));
  /* A varlen problem runs only on a varlen variant; dense on any. */
  fj_variant v = plan.variant;
  v.paged = 0;
  CHECK_ST(ctx, fj_attention_fwd_variant(ctx, &p, &v, &p, &p, &p, &p, NULL, NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "a paged one a paged variant");
  /* The wgmma family refuses the axes by name. */
  v = wv;
  CHECK_OK(ctx, fj_variant_check(ctx, &v));
  v.paged = 1;
  CHECK_ST(ctx, fj_variant_check(ctx, &v), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "paged is implemented for mma mma only (the mma.sync family)");
  v.paged = 0;
  v.pack_gqa = 1;
  CHECK_ST(ctx, fj_variant_check(ctx, &v), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "pack_gqa is implemented for mma mma only (the mma.sync family)");
  v.pack_gqa = 0;
  v.varlen = 3;
  CHECK_ST(ctx, fj_variant_check(ctx, &v), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "varlen 3 is invalid: 0 or 1");
  /* Refusals. */
  varlen_problem(&p, 2, 8, 8, 100, 100, 64);
  p.q_stride[0] = 64;
  CHECK_ST(ctx, fj_problem_check(ctx, &p), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "q_stride[0] (batch) = 64 with cu_seqlens_q");
  static const int bad_sizes[] = {0, 3, 8192, -16};
  for (int i = 0; i < 4; i++) {
    paged_problem(&p, 2, 8, 8, 1, 100, 64, 16);
    p.page_size = bad_sizes[i];
    CHECK_ST(ctx, fj_problem_check(ctx, &p), FJ_ERR_INVALID_ARG);
    char want[80];
    snprintf(want, sizeof want, "page_size %d is invalid: a power of two in 1..4096",
             bad_sizes[i]);
    CHECK_MSG(ctx, want);
  }
  paged_problem(&p, 2, 8, 8, 1, 100, 64, 16);
  p.max_pages = 6;
  CHECK_ST(ctx, fj_problem_check(ctx, &p), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "block table too short: max_pages 6 x page_size 16 = 96 keys, less than seq_kv 100");
  paged_problem(&p, 2, 8, 8, 1, 100, 64, 16);
  p.cu_seqlens_kv = dummy;
  CHECK_ST(ctx, fj_problem_check(ctx, &p), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "cu_seqlens_kv with a block_table");
  paged_problem(&p, 2, 8, 8, 1, 100, 64, 16);
  p.num_pages = 0;
  CHECK_ST(ctx, fj_problem_check(ctx, &p), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "num_pages 0 is invalid");
  fj_problem_init(&p, 2, 8, 8, 1, 100, 64, FJ_F16, FJ_BHSD);
  p.page_size = 16;
  CHECK_ST(ctx, fj_problem_check(ctx, &p), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "page_size 16 without a block_table");
  /* No varlen on sm_75's wmma family: said so. */
  fj_ctx *old = fjt_ctx("sm_75", NULL);
  CHECK(old);
  varlen_problem(&p, 2, 8, 8, 100, 100, 64);
  CHECK_ST(old, fj_attention_plan(old, &p, &plan), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(old, "varlen is implemented for mma mma only");
  fj_ctx_destroy(old);
  fj_ctx_destroy(ctx);
  return 0;
}

/* fj_problem_check_lengths on host arrays: each bad entry named. */
int test_serving_lengths(void)
{
  fj_problem p;
  int32_t cu[4] = {0, 5, 5, 12}, used[3] = {3, 0, 7};
  varlen_problem(&p, 3, 4, 4, 8, 8, 64);
  p.cu_seqlens_q = p.cu_seqlens_kv = cu;
  CHECK_OK(NULL, fj_problem_check_lengths(&p));
  cu[2] = 4;
  CHECK_ST(NULL, fj_problem_check_lengths(&p), FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "cu_seqlens_q is not increasing: cu_seqlens_q[2] = 4 < cu_seqlens_q[1] = 5");
  cu[2] = 5;
  cu[3] = 14;
  CHECK_ST(NULL, fj_problem_check_lengths(&p), FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "cu_seqlens_q: sequence 2 has 9 rows, more than seq_q 8");
  cu[3] = 12;
  cu[0] = -1;
  CHECK_ST(NULL, fj_problem_check_lengths(&p), FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "cu_seqlens_q[0] = -1 is negative");
  cu[0] = 0;
  /* The last sequence ends within the packed tensor's rows. */
  p.total_q = 12;
  p.total_kv = 11;
  CHECK_ST(NULL, fj_problem_check_lengths(&p), FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "cu_seqlens_kv[3] = 12 is past the packed tensor's end: total_kv is 11");
  p.total_kv = 12;
  CHECK_OK(NULL, fj_problem_check_lengths(&p));
  p.seqused_kv = used;
  used[2] = 9;
  CHECK_ST(NULL, fj_problem_check_lengths(&p), FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "seqused_kv[2] = 9 is invalid: must be in 0..seq_kv 8");
  /* A table entry a sequence uses must be a page; unused ones are free. */
  int32_t table[3][2] = {{0, 99}, {-5, -5}, {1, 2}};
  used[2] = 7;
  paged_problem(&p, 3, 4, 4, 1, 8, 64, 4);
  p.block_table = &table[0][0];
  p.seqused_kv = used;
  p.num_pages = 3;
  CHECK_OK(NULL, fj_problem_check_lengths(&p));
  table[2][1] = 3;
  CHECK_ST(NULL, fj_problem_check_lengths(&p), FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "block_table[2][1] = 3 is not a page: must be in 0..num_pages - 1 = 2");
  CHECK_ST(NULL, fj_problem_check_lengths(NULL), FJ_ERR_INVALID_ARG);
  return 0;
}

/* The reference itself on varlen and paged problems: each sequence must
 * equal the dense reference of that sequence alone (built here from the
 * same values, laid out densely), and rows past a sequence's end get O 0
 * and a NaN log-sum-exp.  The GPU tests compare with this reference. */
int test_serving_reference(void)
{
  enum { B = 4, H = 2, D = 16, SQ = 6, SKV = 9, PS = 2, MP = 5, NP = 12 };
  /* Bottom-right offsets 3 and 4 (not both the bounds' 3), no queries, no keys. */
  static const int lq[B] = {6, 0, 3, 2}, lkv[B] = {9, 4, 7, 0};
  int32_t cuq[B + 1] = {0}, cukv[B + 1] = {0};
  for (int b = 0; b < B; b++) {
    cuq[b + 1] = cuq[b] + lq[b];
    cukv[b + 1] = cukv[b] + lkv[b];
  }
  /* Values: a fixed pattern per (token, head, column), in f16. */
  float qf[B * SQ * H * D], kf[NP * PS * H * D], vf[NP * PS * H * D];
  for (int i = 0; i < B * SQ * H * D; i++)
    qf[i] = (float)((i * 37) % 23) / 11.f - 1.f;
  for (int i = 0; i < NP * PS * H * D; i++) {
    kf[i] = (float)((i * 53) % 29) / 14.f - 1.f;
    vf[i] = (float)((i * 71) % 31) / 15.f - 1.f;
  }
  uint16_t q[B * SQ * H * D], k[NP * PS * H * D], v[NP * PS * H * D];
  fj_convert(FJ_F16, q, FJ_F32, qf, B * SQ * H * D);
  fj_convert(FJ_F16, k, FJ_F32, kf, NP * PS * H * D);
  fj_convert(FJ_F16, v, FJ_F32, vf, NP * PS * H * D);
  /* Pages out of order, one shared by sequences 0 and 1. */
  int32_t table[B][MP] = {{7, 3, 11, 0, 5}, {3, 9, 0, 0, 0}, {1, 2, 4, 6, 0}, {0, 0, 0, 0, 0}};
  double out[B * H * SQ * D], lse[B * H * SQ], one[H * SQ * D], one_lse[H * SQ];
  for (int paged = 0; paged < 2; paged++)
    for (int causal = 0; causal < 3; causal++) {
      fj_problem p;
      fj_problem_init(&p, B, H, H, SQ, SKV, D, FJ_F16, FJ_THD);
      p.causal = (fj_causal)causal;
      p.cu_seqlens_q = cuq;
      if (paged) {
        p.block_table = &table[0][0];
        p.seqused_kv = lkv;
        p.page_size = PS;
        p.max_pages = MP;
        p.num_pages = NP;
        int64_t s[3] = {PS * H * D, D, H * D};
        memcpy(p.k_stride, s, sizeof s);
        memcpy(p.v_stride, s, sizeof s);
      } else {
        p.cu_seqlens_kv = cukv;
      }
      CHECK_OK(NULL, fj_reference_fwd(&p, q, k, v, NULL, NULL, 0, SQ, out, lse));
      for (int b = 0; b < B; b++) {
        /* Sequence b alone, K and V gathered into a dense BSHD copy. */
        uint16_t kd[SKV * H * D + 1], vd[SKV * H * D + 1];
        for (int j = 0; j < lkv[b]; j++) {
          size_t src = (size_t)(paged ? (table[b][j / PS] * PS + j % PS) * H * D
                                      : (cukv[b] + j) * H * D);
          memcpy(kd + (size_t)j * H * D, k + src, sizeof(uint16_t) * H * D);
          memcpy(vd + (size_t)j * H * D, v + src, sizeof(uint16_t) * H * D);
        }
        if (lq[b] == 0)
          continue;
        fj_problem d;
        fj_problem_init(&d, 1, H, H, lq[b], lkv[b] ? lkv[b] : 1, D, FJ_F16, FJ_BSHD);
        d.causal = p.causal;
        if (lkv[b] == 0) {
          /* No keys: every row sees none (O 0, LSE -inf). */
          for (int h = 0; h < H; h++)
            for (int r = 0; r < lq[b]; r++) {
              size_t i = (size_t)((b * H + h) * SQ + r);
              CHECK(isinf(lse[i]) && lse[i] < 0);
              for (int e = 0; e < D; e++)
                CHECK(out[i * D + (size_t)e] == 0);
            }
          continue;
        }
        CHECK_OK(NULL, fj_reference_fwd(&d, q + (size_t)cuq[b] * H * D, kd, vd,
                                        NULL, NULL, 0, lq[b], one, one_lse));
        for (int h = 0; h < H; h++)
          for (int r = 0; r < SQ; r++) {
            size_t i = (size_t)((b * H + h) * SQ + r);
            if (r >= lq[b]) {
              CHECK(isnan(lse[i]) && out[i * D] == 0);
              continue;
            }
            size_t j = (size_t)(h * lq[b] + r);
            CHECK(lse[i] == one_lse[j] || (isinf(lse[i]) && isinf(one_lse[j])));
            CHECK(memcmp(out + i * D, one + j * D, sizeof(double) * D) == 0);
          }
      }
    }
  return 0;
}

/* The varlen and paged kernels the plan names compile without spills for
 * sm_90a and sm_80, and so do the varlen combine kernels. */
int test_serving_varlen_compile(void)
{
  static const char *const arches[] = {"sm_90a", "sm_80"};
  for (int a = 0; a < 2; a++) {
    fj_ctx *ctx = fjt_ctx(arches[a], fjt_tmpdir());
    CHECK(ctx);
    fj_problem ps[6];
    varlen_problem(&ps[0], 16, 16, 16, 4096, 4096, 128);
    ps[0].causal = FJ_CAUSAL_BOTTOM_RIGHT;
    paged_problem(&ps[1], 1, 32, 8, 1, 4096, 128, 16);
    paged_problem(&ps[2], 4, 8, 8, 1, 1000, 64, 1);
    ps[2].dtype = FJ_F16;
    paged_problem(&ps[3], 2, 32, 4, 4, 8192, 256, 64);
    /* With the totals: the wgmma family on sm_90a. */
    ps[4] = ps[0];
    ps[4].total_q = ps[4].total_kv = 16384;
    /* The batched paged decode of the bench (unsplit: two chunks a
     * thread in its paged copies). */
    paged_problem(&ps[5], 64, 32, 8, 1, 4096, 128, 16);
    fj_variant vs[6];
    int cols[6];
    for (int i = 0; i < 6; i++) {
      fj_plan plan;
      CHECK_OK(ctx, fj_attention_plan(ctx, &ps[i], &plan));
      CHECK(plan.variant.varlen && plan.variant.paged == (i > 0 && i != 4));
      vs[i] = plan.variant;
      cols[i] = plan.combine_cols;
    }
    CHECK(!vs[5].split_kv);
    CHECK(vs[1].split_kv && vs[3].split_kv && vs[3].pack_gqa);
    CHECK((vs[4].mma == FJ_MMA_WGMMA) == (a == 0));
    fj_prepare_opts o = {2, NULL, NULL};
    CHECK_OK(ctx, fj_kernel_prepare(ctx, vs, 6, &o, NULL));
    for (int i = 0; i < 6; i++) {
      fj_kernel *k;
      fj_resources r;
      CHECK_OK(ctx, fj_kernel_get(ctx, &vs[i], &k));
      fj_kernel_resources(k, &r);
      printf("%s %s: %d registers, %d bytes spilled\n", arches[a],
             fj_kernel_name(k), r.registers, r.spill_store_bytes);
      CHECK(r.spill_store_bytes == 0 && r.spill_load_bytes == 0);
      CHECK(strstr(fj_kernel_source(k, NULL), vs[i].paged ? "load_tile_paged" : "seq_of"));
      if (!vs[i].split_kv)
        continue;
      fj_kernel *c;
      CHECK_OK(ctx, FJT_LOCKED(ctx, fj__combine_kernel(ctx, &vs[i], cols[i], &c)));
      CHECK(strstr(fj_kernel_name(c), "_vl") && strstr(fj_kernel_source(c, NULL), "seq_of"));
    }
    fj_ctx_destroy(ctx);
  }
  return 0;
}
