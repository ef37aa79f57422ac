/*
 * test_keys.c -- tables keyed short of what they hold (81d3067, the audit
 * after f720fcf): a table that finds an entry by fewer facts than the
 * entry was made from hands one problem another's kernel or choice.
 * Without a GPU, each failing before its fix: the prewarm's combines
 * apart by sinks (and by the columns a block takes, both widths of a wide
 * O), the backward's main kernels apart by the set of parameters with
 * gradients, the forward's picks apart by the 16-row split-keys decode,
 * and a tuned wgmma pick kept from a problem whose strides TMA cannot
 * encode.
 */
#include <string.h>

#include "ctx.h"
#include "tunedb.h"
#include "runner.h"

/* ---- the prewarm's combines ------------------------------------------------------ */

/* The labels in a disk cache of the kernels whose names start with
 * prefix (the combines', the relative tables'), concatenated with '|'. */
typedef struct combines_seen {
  const char *prefix;
  char labels[512];
} combines_seen;

static int combine_visit(void *user, const fj_cache_entry *e)
{
  combines_seen *s = user;
  if (e->valid && !strcmp(e->kind, "kernel") &&
      !strncmp(e->label, s->prefix, strlen(s->prefix))) {
    size_t n = strlen(s->labels);
    snprintf(s->labels + n, sizeof s->labels - n, "|%s|", e->label);
  }
  return 0;
}

/* Two split decodes alike but for sinks need two combines (fj_combine_d64_
 * f16 and its _sink); the prewarm once found the second's by head dim,
 * dtype and varlen alone, so the sinks combine never reached the disk
 * and the fleet's first sinks decode compiled it. */
int test_keys_prewarm_sinks(void)
{
  static const float sinks[8] = {0.5f};
  const char *dir = fjt_tmpdir();
  fj_ctx *ctx = fjt_ctx("sm_80", dir);
  CHECK(ctx);
  fj_problem p;
  fj_mods m;
  fj_plan plain, sunk;
  fj_problem_init(&p, 2, 8, 2, 1, 4096, 64, FJ_F16, FJ_BHSD);
  CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plain));
  fj_mods_init(&m);
  m.sinks = sinks;
  p.mods = &m;
  CHECK_OK(ctx, fj_attention_plan(ctx, &p, &sunk));
  CHECK(plain.variant.split_kv && sunk.variant.split_kv);
  fj_variant vs[2] = {plain.variant, sunk.variant};
  fj_status each[2];
  fj_prewarm_report r;
  CHECK_OK(ctx, fj_cache_prewarm(ctx, vs, 2, NULL, each, &r));
  CHECK(each[0] == FJ_OK && each[1] == FJ_OK);
  /* Two variants and a combine each. */
  CHECK(r.variants == 2 && r.failed == 0);
  CHECK(r.kernels == 4 && r.compiled == 4);
  combines_seen s = {"fj_combine_", ""};
  CHECK_OK(ctx, fj_cache_list(ctx, combine_visit, &s));
  CHECK(strstr(s.labels, "|fj_combine_d64_f16|") &&
        strstr(s.labels, "|fj_combine_d64_f16_sink|"));
  fj_ctx_destroy(ctx);
  return 0;
}

/* A split decode of O wider than 128 columns launches one of two combines
 * by its rows (fj__combine_cols): the one-slice fj_combine_d256_f16 where
 * the row blocks fill the GPU, fj_combine_d256_f16_c128 where they do
 * not.  A variant does not say the rows, so the prewarm makes both. */
int test_keys_prewarm_slices(void)
{
  const char *dir = fjt_tmpdir();
  fj_ctx *ctx = fjt_ctx("sm_80", dir);
  CHECK(ctx);
  fj_problem p;
  fj_plan plan;
  fj_problem_init(&p, 2, 8, 2, 1, 4096, 256, FJ_F16, FJ_BHSD);
  CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
  CHECK(plan.variant.split_kv && plan.combine_cols == 128);
  fj_status each[1];
  fj_prewarm_report r;
  CHECK_OK(ctx, fj_cache_prewarm(ctx, &plan.variant, 1, NULL, each, &r));
  CHECK(each[0] == FJ_OK && r.variants == 1 && r.failed == 0);
  /* The variant and its two combines. */
  CHECK(r.kernels == 3 && r.compiled == 3);
  combines_seen s = {"fj_combine_", ""};
  CHECK_OK(ctx, fj_cache_list(ctx, combine_visit, &s));
  CHECK(strstr(s.labels, "|fj_combine_d256_f16|") &&
        strstr(s.labels, "|fj_combine_d256_f16_c128|"));
  fj_ctx_destroy(ctx);
  return 0;
}

/* A score expression that takes a relative table (rel_table.h): its call
 * launches the table's kernel first, so the prewarm makes it too, once a
 * form (T5 at two head dims: two variants, their combines where they
 * split, one table kernel). */
int test_keys_prewarm_tables(void)
{
  const char *dir = fjt_tmpdir();
  fj_ctx *ctx = fjt_ctx("sm_80", dir);
  CHECK(ctx);
  const fj_mod_builtin *t5 = fj_mod_builtin_find("t5");
  CHECK(t5 && t5->score);
  fj_mod_param bias = {"bias", FJ_MOD_F32, 2, {8, 32}, NULL, 0};
  fj_mods m;
  fj_mods_init(&m);
  m.score = t5->score;
  m.params = &bias;
  m.num_params = 1;
  fj_problem p;
  fj_plan a, b;
  fj_problem_init(&p, 2, 8, 8, 512, 512, 64, FJ_F16, FJ_BHSD);
  p.mods = &m;
  CHECK_OK(ctx, fj_attention_plan(ctx, &p, &a));
  fj_problem_init(&p, 2, 8, 8, 512, 512, 128, FJ_F16, FJ_BHSD);
  p.mods = &m;
  CHECK_OK(ctx, fj_attention_plan(ctx, &p, &b));
  fj_variant vs[2] = {a.variant, b.variant};
  fj_status each[2];
  fj_prewarm_report r;
  CHECK_OK(ctx, fj_cache_prewarm(ctx, vs, 2, NULL, each, &r));
  CHECK(each[0] == FJ_OK && each[1] == FJ_OK);
  CHECK(r.variants == 2 && r.failed == 0);
  /* The variants, a combine each that splits, the one table kernel. */
  int want = 2 + a.variant.split_kv + b.variant.split_kv + 1;
  CHECK(r.kernels == want && r.compiled == want);
  combines_seen s = {"fj_rel_table_", ""};
  CHECK_OK(ctx, fj_cache_list(ctx, combine_visit, &s));
  CHECK(strstr(s.labels, "|fj_rel_table_x"));
  fj_ctx_destroy(ctx);
  return 0;
}

/* ---- the backward's main kernel -------------------------------------------------- */

/* One score expression reading two float tensors, gradients for a alone
 * and then for a and bb: two main kernels (the second adds bb's
 * gradient), which were both named "_pg" -- one symbol for two kernels.
 * Now "_pg" and the set's bits: _pg1 and _pg3. */
int test_keys_backward_param_grads(void)
{
  static float a[4], bb[4], ga[4], gbb[4];
  const fj_mod_param params[2] = {
      {"a", FJ_MOD_F32, 1, {4, 0, 0, 0}, a, 0},
      {"bb", FJ_MOD_F32, 1, {4, 0, 0, 0}, bb, 0}};
  float *only_a[2] = {ga, NULL}, *both[2] = {ga, gbb};
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  fj_problem p;
  fj_mods m;
  fj_problem_init(&p, 1, 4, 2, 300, 300, 64, FJ_BF16, FJ_BSHD);
  fj_mods_init(&m);
  m.score = "s + a(h) + bb(h)";
  m.params = params;
  m.num_params = 2;
  p.mods = &m;
  fj_kernel *k[2];
  float *const *grads[2] = {only_a, both};
  for (int i = 0; i < 2; i++) {
    m.param_grads = grads[i];
    fj_bwd_plan plan;
    CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &plan));
    CHECK_OK(ctx, fj_attention_bwd_kernel(ctx, &p, &plan, 1, &k[i]));
    const char *src = fj_kernel_source(k[i], NULL);
    CHECK(strstr(src, "fj::pgrad_add(fj_mg, 0, ") != NULL);
    CHECK(i ? strstr(src, "fj::pgrad_add(fj_mg, 1, ") != NULL
            : strstr(src, "fj::pgrad_add(fj_mg, 1, ") == NULL);
    fj_resources r;
    fj_kernel_resources(k[i], &r);
    printf("param grads %s: %s (%s) regs=%d spill=%d/%d\n", i ? "a, bb" : "a",
           fj_kernel_name(k[i]), fj_mma_name(plan.variant.mma), r.registers,
           r.spill_store_bytes, r.spill_load_bytes);
    CHECK(r.registers > 0 && r.spill_store_bytes == 0 && r.spill_load_bytes == 0);
  }
  CHECK(k[0] != k[1]);
  CHECK(strcmp(fj_kernel_name(k[0]), fj_kernel_name(k[1])) != 0);
  CHECK(strstr(fj_kernel_name(k[0]), "_pg1") && strstr(fj_kernel_name(k[1]), "_pg3"));
  fj_ctx_destroy(ctx);
  return 0;
}

/* ---- the forward's picks --------------------------------------------------------- */

/* What a context picks for the decode (1, 32/4, seq_q/1000, 128) bf16 on
 * sm_90a: the chosen variant's name. */
static int decode_pick(fj_ctx *ctx, int seq_q, char *name, size_t size)
{
  fj_problem p;
  fj_plan plan;
  fj_problem_init(&p, 1, 32, 4, seq_q, 1000, 128, FJ_BF16, FJ_BSHD);
  CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
  fj_variant_name(&plan.variant, name, size);
  printf("seq_q %d: %s (tile_m %d, warps %d)\n", seq_q, name,
         plan.variant.tile_m, plan.variant.warps);
  return 0;
}

/* seq_q 2 and 3 at GQA 8 share the pick memo's sequence bucket (2^1) but
 * not the decode's choice: 16 packed rows make one 16-row tile whose
 * warps split the keys, 24 a 64-row tile.  The memo's class once lacked
 * that fact, and the second of the two took the first's tiles. */
int test_keys_decode_ks_class(void)
{
  char fresh[2][160], name[160];
  for (int i = 0; i < 2; i++) {
    fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
    CHECK(ctx);
    CHECK(decode_pick(ctx, 2 + i, fresh[i], sizeof fresh[i]) == 0);
    fj_ctx_destroy(ctx);
  }
  CHECK(strcmp(fresh[0], fresh[1]) != 0);
  /* In one context, either order: each its own fresh choice. */
  for (int first = 0; first < 2; first++) {
    fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
    CHECK(ctx);
    for (int j = 0; j < 2; j++) {
      int i = j ? 1 - first : first;
      CHECK(decode_pick(ctx, 2 + i, name, sizeof name) == 0);
      CHECK(strcmp(name, fresh[i]) == 0);
    }
    fj_ctx_destroy(ctx);
  }
  return 0;
}

/* ---- a tuned wgmma pick and TMA's strides ---------------------------------------- */

/* The database is read on GPU contexts only: a compile-only context
 * stands for an H100 here (its facts as the driver gives them), the
 * layout tables taken first from the reference (a GPU context probes
 * them), and stops standing for it before it is destroyed. */
static void pose_as_h100(fj_ctx *ctx)
{
  fj_lut lut;
  for (int f = 1; f <= FJ_FRAG_COUNT; f++)
    (void)fj_layout_get(ctx, (fj_frag)f, &lut);
  fj_device_info h100 = {"NVIDIA H100 80GB HBM3", 0, 9, 0, 132, 232448, 13000};
  ctx->dev = h100;
  ctx->has_device = 1;
}

/* A class tuned to wgmma (on dense tensors) does not fit a member whose K
 * and V broadcast over the batch (stride 0, batch 2: no TMA descriptor
 * encodes it): that one takes the heuristic's mma pick, while the dense
 * member takes the tuned one (the entry is read). */
int test_keys_tuned_broadcast(void)
{
  const char *dir = fjt_tmpdir();
  fj_ctx *ctx = fjt_ctx("sm_90a", dir);
  CHECK(ctx);
  pose_as_h100(ctx);
  fj_problem dense, bcast;
  fj_plan plan;
  fj_problem_init(&dense, 2, 16, 16, 1024, 1024, 128, FJ_BF16, FJ_BSHD);
  CHECK_OK(ctx, fj_attention_plan(ctx, &dense, &plan));
  CHECK(plan.variant.mma == FJ_MMA_WGMMA && plan.from == FJ_CHOICE_HEURISTIC);
  /* Another wgmma variant than the heuristic's, so that the tuned one
   * shows. */
  fj_variant tuned = plan.variant;
  tuned.tile_n = tuned.tile_n == 128 ? 64 : 128;
  CHECK_OK(ctx, fj_variant_check(ctx, &tuned));
  CHECK_OK(ctx, fj__tune_record(ctx, &dense, &tuned, 1.0, 1.25));
  char want[160], got[160];
  fj_variant_name(&tuned, want, sizeof want);
  CHECK_OK(ctx, fj_attention_plan(ctx, &dense, &plan));
  fj_variant_name(&plan.variant, got, sizeof got);
  CHECK(plan.from == FJ_CHOICE_TUNED && strcmp(got, want) == 0);
  /* The same class with K and V broadcast over the batch. */
  bcast = dense;
  bcast.k_stride[0] = 0;
  bcast.v_stride[0] = 0;
  fj_status st = fj_attention_plan(ctx, &bcast, &plan);
  ctx->has_device = 0;
  CHECK_OK(ctx, st);
  fj_variant_name(&plan.variant, got, sizeof got);
  printf("broadcast K and V: %s (%s)\n", got,
         plan.from == FJ_CHOICE_TUNED ? "tuned" : "heuristic");
  CHECK(plan.variant.mma == FJ_MMA_SYNC && plan.from == FJ_CHOICE_HEURISTIC);
  fj_ctx_destroy(ctx);
  return 0;
}
