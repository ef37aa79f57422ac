/*
 * test_serving.c -- serving shapes without a GPU: what fj_attention_plan
 * decides (GQA packing, splits, grids, workspace) and refuses, and that the
 * kernels it names compile without spills, the combine kernels included.
 * Their results on a GPU are test_gpu.c's gpu_serving_* tests.
 */
#include <string.h>

#include "attention.h"
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
  CHECK(plan.grid[0] == (unsigned)plan.splits && plan.grid[1] == 8 && plan.grid[2] == 1);
  CHECK(plan.workspace_bytes == (size_t)plan.splits * 32 * 129 * 4);
  CHECK(plan.combine_grid[0] == 8 && plan.combine_threads == 128);
  size_t ws = 0;
  CHECK_OK(ctx, fj_attention_workspace_size(ctx, &p, &ws));
  CHECK(ws == plan.workspace_bytes);
  /* The split rule fills the multiprocessors it plans for: fewer splits
   * for fewer of them. */
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
        plan.splits * 8 >= 16 * plan.blocks_per_sm * 8 / 10);
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
 * without spills; so do their combine kernels. */
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
    fj_kernel *c;
    CHECK_OK(ctx, fj__combine_kernel(ctx, vs[i].head_dim, vs[i].dtype, &c));
    fj_kernel_resources(c, &r);
    printf("%s: %d registers, %d bytes spilled\n", fj_kernel_name(c),
           r.registers, r.spill_store_bytes);
    CHECK(r.spill_store_bytes == 0 && strstr(fj_kernel_ptx(c, NULL), "shfl.sync"));
  }
  fj_ctx_destroy(ctx);
  return 0;
}
