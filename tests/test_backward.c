/*
 * test_backward.c -- the backward's plan, kernels and refusals without a
 * GPU: every kernel of a plan compiles for sm_80 and sm_90a with no spills
 * over head dims, dtypes and masks, and what the backward does not take
 * yet is refused with a message that says what; its prewarm into a disk
 * cache, the tuner's refusals and its entries in the tuning database.
 */
#include <stdlib.h>
#include <string.h>

#include "backward.h"
#include "tunedb.h"
#include "util.h"
#include "runner.h"

/* Plans p's backward on ctx and compiles its three kernels: 0 when each
 * compiles without spilling (the resources printed). */
static int compile_all(fj_ctx *ctx, const fj_problem *p, const char *what)
{
  unsetenv("FLASHJIT_BWD_PAIR");  /* the library's own choice, checked below */
  fj_bwd_plan plan;
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, p, &plan));
  /* sm_90a's head dims 64-256 on wgmma (128-key tiles; 64 above 128, where
   * the consumers split by role), with or without expressions, but for
   * the parameters' gradients above head dim 128; the rest on mma (64-key
   * tiles). */
  const fj_mods *m = p->mods;
  int pgrads = m && m->param_grads;
  int tile_n = p->head_dim <= 128 ? 128 : 64;  /* a block mask's blocks: whole key tiles */
  int wg = strcmp(fj_ctx_arch(ctx), "sm_90a") == 0 && p->head_dim >= 64 &&
           !(pgrads && p->head_dim > 128) &&
           !(m && m->block_mask && m->block_mask->block_kv % tile_n);
  /* Above head dim 128 a pair of blocks (a cluster of two) splits a key
   * tile of 128, causal or not, deterministic or not, but under a window
   * or a block mask. */
  int pair = wg && p->head_dim > 128 &&
             !(m && (m->block_mask || m->window_left != -1 || m->window_right != -1));
  CHECK(plan.variant.mma == (wg ? FJ_MMA_WGMMA : FJ_MMA_SYNC));
  CHECK(plan.variant.tile_n == (wg && (p->head_dim <= 128 || pair) ? 128 : 64));
  CHECK(plan.grid[0] == (unsigned)((p->seq_kv + plan.variant.tile_n - 1) /
                                   plan.variant.tile_n * (pair ? 2 : 1)));
  CHECK(plan.grid[1] == (unsigned)p->heads_kv && plan.grid[2] == (unsigned)p->batch);
  /* delta, LSE2 and dQ's accumulator (rows of the head dim rounded up to
   * 64) over rows padded to 64, then a turn counter per dQ tile of 64 x 64 */
  size_t rows = (size_t)p->batch * (size_t)p->heads_q *
                (size_t)((p->seq_q + 63) / 64 * 64);
  size_t width = (size_t)(p->head_dim + 63) / 64 * 64;
  CHECK(plan.workspace_bytes ==
        rows * (width + 2) * sizeof(float) + rows / 64 * (width / 64) * sizeof(int));
  for (int i = 0; i < FJ_BWD_KERNELS; i++) {
    fj_kernel *k;
    CHECK_OK(ctx, fj_attention_bwd_kernel(ctx, p, &plan, i, &k));
    fj_resources r;
    fj_kernel_resources(k, &r);
    printf("%-12s %-7s %-40s regs=%3d smem=%6d spill=%d/%d\n", what,
           fj_ctx_arch(ctx), fj_kernel_name(k), r.registers,
           r.shared_static + r.shared_dynamic, r.spill_store_bytes,
           r.spill_load_bytes);
    CHECK(r.spill_store_bytes == 0 && r.spill_load_bytes == 0);
    if (i == 2) {
      /* The postprocess reads dQ's accumulator as the main kernel adds
       * into it: rows (mma), tiles (wgmma), permuted tiles (wide wgmma). */
      const char *src = fj_kernel_source(k, NULL);
      const char *call = !wg ? NULL
                         : p->head_dim <= 128 ? "dq_tile_off(row"
                                              : "dq_tile_off4(row";
      CHECK(call ? strstr(src, call) != NULL
                 : strstr(src, "dq_tile_off(row") == NULL &&
                       strstr(src, "dq_tile_off4(row") == NULL);
    }
  }
  return 0;
}

int test_backward_compile(void)
{
  static const char *const archs[] = {"sm_80", "sm_90a"};
  for (int a = 0; a < 2; a++) {
    fj_ctx *ctx = fjt_ctx(archs[a], NULL);
    CHECK(ctx != NULL);
    fj_mods m;
    fj_mods_init(&m);
    for (int c = 0; c < 6; c++) {
      static const int dims[6] = {64, 128, 256, 32, 96, 128};
      fj_problem p;
      fj_problem_init(&p, 2, 8, 2, 300, 500, dims[c], c % 2 ? FJ_F16 : FJ_BF16,
                      FJ_BSHD);
      p.causal = c == 1 ? FJ_CAUSAL_TOP_LEFT : c == 2 ? FJ_CAUSAL_BOTTOM_RIGHT
                                                      : FJ_CAUSAL_NONE;
      if (c == 3 || c == 5) {  /* a window and a softcap (mma, wgmma) */
        m.window_left = 100;
        m.window_right = 0;
        m.softcap = 30.f;
        p.mods = &m;
      }
      if (compile_all(ctx, &p, p.mods ? "window+cap" : "plain") != 0) {
        fj_ctx_destroy(ctx);
        return 1;
      }
      p.mods = NULL;
    }
    fj_ctx_destroy(ctx);
  }
  return 0;
}

/* Issue 31: at head dim 64 the wgmma backward holds each consumer's 64
 * keys of K and V as register A operands, so S^T and dP^T are the rs form
 * (one word of the probed A table a register); the kernel compiles
 * without spilling and without ptxas serialising its wgmmas.  Head dims
 * whose dK and dV leave no room (96, 128) keep both operands in shared
 * memory.  The wide kernels (192, 256: 64-key tiles under a window, the
 * cluster pair otherwise; padded, 160 and 224) are not serialised
 * either (the pair was, by a fence ptxas put after a spin, until its
 * own; the padded ones were, by their last tiles of dK and dV never
 * stored, until the epilogue held them). */
/* Prints k's registers and spills; 0 where it spills nothing and ptxas
 * serialised none of its wgmmas. */
static int compiled_clean(fj_kernel *k)
{
  fj_resources r;
  fj_kernel_resources(k, &r);
  printf("%-60s regs=%3d spill=%d/%d\n", fj_kernel_name(k), r.registers,
         r.spill_store_bytes, r.spill_load_bytes);
  CHECK(r.spill_store_bytes == 0 && r.spill_load_bytes == 0);
  const char *log = fj_kernel_log(k);
  CHECK(log != NULL && strstr(log, "serialized") == NULL);
  return 0;
}

int test_backward_kv_regs(void)
{
  unsetenv("FLASHJIT_BWD_PAIR");
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx != NULL);
  static const struct {
    int d;
    fj_dtype dt;
    fj_causal causal;
    int window_left;
    float softcap;
  } cases[] = {
      {64, FJ_BF16, FJ_CAUSAL_NONE, -1, 0},
      {64, FJ_F16, FJ_CAUSAL_TOP_LEFT, 100, 30.f},
      {96, FJ_F16, FJ_CAUSAL_NONE, -1, 0},
      {128, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT, -1, 0},
      {192, FJ_BF16, FJ_CAUSAL_TOP_LEFT, -1, 30.f},
      {256, FJ_F16, FJ_CAUSAL_BOTTOM_RIGHT, -1, 0},
      {256, FJ_BF16, FJ_CAUSAL_NONE, -1, 0},
      {224, FJ_BF16, FJ_CAUSAL_TOP_LEFT, -1, 0},
      {160, FJ_F16, FJ_CAUSAL_NONE, -1, 0},
      {224, FJ_F16, FJ_CAUSAL_NONE, -1, 0},
      {256, FJ_BF16, FJ_CAUSAL_TOP_LEFT, 100, 0},  /* a window: 64-key tiles */
      {224, FJ_F16, FJ_CAUSAL_BOTTOM_RIGHT, 100, 20.f},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    fj_problem p;
    fj_mods m;
    fj_problem_init(&p, 2, 8, 2, 700, 700, cases[c].d, cases[c].dt, FJ_BSHD);
    p.causal = cases[c].causal;
    fj_mods_init(&m);
    m.window_left = cases[c].window_left;
    m.window_right = cases[c].window_left < 0 ? -1 : 0;
    m.softcap = cases[c].softcap;
    p.mods = &m;
    fj_bwd_plan plan;
    CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &plan));
    CHECK(plan.variant.mma == FJ_MMA_WGMMA);
    fj_kernel *k;
    CHECK_OK(ctx, fj_attention_bwd_kernel(ctx, &p, &plan, 1, &k));
    const char *src = fj_kernel_source(k, NULL), *t = cases[c].dt == FJ_F16 ? "f16" : "bf16";
    char s_rs[64], dp_rs[64], s_ss[64];
    snprintf(s_rs, sizeof s_rs, "fj::wg_rs_%s_64(s, ka[kk], FJ_QB(slot, kk), kk);", t);
    snprintf(dp_rs, sizeof dp_rs, "fj::wg_rs_%s_64(dp, va[kk], FJ_DOB(slot, kk), kk);", t);
    snprintf(s_ss, sizeof s_ss, "fj::wg_ss_%s_64(s, FJ_KA(kk), FJ_QB(slot, kk), kk);", t);
    int regs = cases[c].d == 64, wide = cases[c].d > 128;
    CHECK(!strstr(src, s_rs) == !regs && !strstr(src, dp_rs) == !regs);
    CHECK(wide || (strstr(src, s_ss) == NULL) == regs);
    CHECK(!strstr(src, "unsigned ka[4][4], va[4][4];") == !regs);
    /* every consumer's descriptors as a base's plus the k step's offset
     * (one uniform add a step, not wg_desc's masks and shifts) */
    CHECK(strstr(src, "#define FJ_KA(kk) fj::wg_desc_at(") != NULL);
    /* the pair above head dim 128 without a window */
    CHECK(!strstr(src, "__cluster_dims__") == !(cases[c].d > 128 && cases[c].window_left < 0));
    CHECK(compiled_clean(k) == 0);
  }
  /* The pair at head dims 129-192 (three panels of dQ: block 1's
   * consumer 1 adds none, and loads the other tile's panel 2 twice so
   * that both blocks expect as many bytes): the library's choice,
   * rendered without spills or serialised wgmmas. */
  static const int pair_dims[] = {192, 160};
  for (size_t c = 0; c < sizeof pair_dims / sizeof pair_dims[0]; c++) {
    fj_problem p;
    fj_problem_init(&p, 2, 8, 2, 700, 700, pair_dims[c], FJ_BF16, FJ_BSHD);
    p.causal = c ? FJ_CAUSAL_NONE : FJ_CAUSAL_TOP_LEFT;
    p.deterministic = 1;
    fj_bwd_plan plan;
    CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &plan));
    CHECK(plan.variant.mma == FJ_MMA_WGMMA && plan.variant.tile_n == 128);
    fj_kernel *k;
    CHECK_OK(ctx, fj_attention_bwd_kernel(ctx, &p, &plan, 1, &k));
    const char *src = fj_kernel_source(k, NULL);
    CHECK(strstr(src, "__cluster_dims__") != NULL);
    CHECK(strstr(src, "Head dim 192: block 1's consumer 1 has no panel of dQ") != NULL);
    CHECK(strstr(src, "min(2 * (int)crank + pn, 2)") != NULL);
    CHECK(compiled_clean(k) == 0);
  }
  /* and FLASHJIT_BWD_PAIR=0 keeps 64-key tiles there */
  setenv("FLASHJIT_BWD_PAIR", "0", 1);
  {
    fj_problem p;
    fj_problem_init(&p, 2, 8, 2, 700, 700, 192, FJ_BF16, FJ_BSHD);
    p.deterministic = 1;
    fj_bwd_plan plan;
    CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &plan));
    CHECK(plan.variant.tile_n == 64);
  }
  unsetenv("FLASHJIT_BWD_PAIR");
  fj_ctx_destroy(ctx);
  return 0;
}

/* fj_variant.table_inside in the backward: the plan proves a distance
 * table's reads within its extents for the wgmma backward's tiles (query
 * tiles of 64 rows, key tiles of 128, a pair's too), and the main kernel
 * then reads it at the row pointer alone; a table one element short: no
 * proof, the accessor path kept; a plan whose proof the problem fails is
 * refused at fj_attention_bwd_run, naming the rule. */
/* A causal bf16 problem of seq positions at head dim d whose score
 * expression reads prm (bias, [16, n]) at q - kv + 4096. */
static void bias_problem(fj_problem *p, fj_mods *m, const fj_mod_param *prm, int seq, int d)
{
  fj_problem_init(p, 1, 16, 4, seq, seq, d, FJ_BF16, FJ_BSHD);
  p->causal = FJ_CAUSAL_TOP_LEFT;
  fj_mods_init(m);
  m->score = "s + bias(h, q - kv + 4096)";
  m->params = prm;
  m->num_params = 1;
  p->mods = m;
}

int test_backward_table_inside(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx != NULL);
  static const struct {
    int64_t e0, e1;
    int seq, d, want;
  } cases[] = {
      {16, 8192, 4096, 128, 1},
      {16, 8191, 4096, 128, 0},
      /* 4000 queries and keys: the pair's tiles reach key 4095, query
       * 4031 -- q - kv + 4096 within 1..8127 */
      {16, 8128, 4000, 256, 1},
      {16, 8127, 4000, 256, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fj_mod_param prm[1] = {{"bias", FJ_MOD_F32, 2, {cases[i].e0, cases[i].e1, 0, 0}, NULL, 0}};
    fj_problem p;
    fj_mods m;
    bias_problem(&p, &m, prm, cases[i].seq, cases[i].d);
    fj_bwd_plan plan;
    CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &plan));
    char name[160];
    fj_variant_name(&plan.variant, name, sizeof name);
    if (plan.variant.mma != FJ_MMA_WGMMA || plan.variant.table_inside != cases[i].want ||
        !strstr(name, "_tin") != !cases[i].want) {
      fprintf(stderr, "bias [%lld, %lld], %d positions, d%d: %s table_inside %d, want %d\n",
              (long long)cases[i].e0, (long long)cases[i].e1, cases[i].seq, cases[i].d, name,
              plan.variant.table_inside, cases[i].want);
      return 1;
    }
    if (i < 2) {
      fj_kernel *k;
      CHECK_OK(ctx, fj_attention_bwd_kernel(ctx, &p, &plan, 1, &k));
      const char *src = fj_kernel_source(k, NULL);
      CHECK(!strstr(src, "constexpr bool dgfast = true;") == !cases[i].want);
      CHECK(!strstr(src, "__all_sync(0xffffffffu, dgin)") == !!cases[i].want);
    }
  }
  /* The first case's plan claimed for a table one element short. */
  fj_mod_param prm[1] = {{"bias", FJ_MOD_F32, 2, {16, 8192, 0, 0}, NULL, 0}};
  fj_problem p;
  fj_mods m;
  bias_problem(&p, &m, prm, 4096, 128);
  fj_bwd_plan plan;
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &plan));
  CHECK(plan.variant.table_inside == 1);
  prm[0].extents[1] = 8191;
  char dummy[16] __attribute__((aligned(16)));
  float lse[1];
  CHECK(fj_attention_bwd_run(ctx, &p, &plan, dummy, dummy, dummy, dummy, dummy, lse, dummy,
                             dummy, dummy, NULL, NULL, 0, NULL) == FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "table_inside 1 does not hold for the problem");
  CHECK(!strchr(fj_errmsg(ctx), '\n'));
  fj_ctx_destroy(ctx);
  return 0;
}

/* Score and mask expressions: their backward runs on both families (mma
 * on sm_80, wgmma on sm_90a), its main kernel carries the derivative after #line 1
 * "score'" (fj_score_grad) and the mask function, and every kernel
 * compiles without spilling.  A derivative too long for the kernel is
 * refused, in one line, while the forward of the same expression plans. */
int test_backward_exprs_compile(void)
{
  static float table[4 * 64];
  static int32_t docs[512];
  const fj_mod_param params[2] = {
      {"rel", FJ_MOD_F32, 2, {4, 64, 0, 0}, table, 0},
      {"doc", FJ_MOD_I32, 1, {512, 0, 0, 0}, docs, 0}};
  static const struct {
    const char *score, *mask;
    int d;
    fj_dtype dt;
  } cases[] = {
      {"s + rel(h, q - kv + 32)", NULL, 64, FJ_BF16},
      {"20.0f * tanhf(s / 20.0f)", "doc(q) == doc(kv)", 128, FJ_F16},
      {"q >= kv ? s : 0.5f * s - 1.0f / (s * s + 1.0f)", NULL, 256, FJ_BF16},
      {NULL, "doc(q) == doc(kv)", 96, FJ_F16},
      /* parameters that no expression reads */
      {NULL, NULL, 64, FJ_BF16},
  };
  static const char *const archs[] = {"sm_80", "sm_90a"};
  for (int a = 0; a < 2; a++) {
    fj_ctx *ctx = fjt_ctx(archs[a], NULL);
    CHECK(ctx != NULL);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
      fj_problem p;
      fj_mods m;
      fj_problem_init(&p, 1, 4, 2, 300, 300, cases[c].d, cases[c].dt, FJ_BSHD);
      fj_mods_init(&m);
      m.score = cases[c].score;
      m.mask = cases[c].mask;
      m.params = params;
      m.num_params = 2;
      p.mods = &m;
      fj_bwd_plan plan;
      CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &plan));
      CHECK(plan.variant.mma == (a == 1 ? FJ_MMA_WGMMA : FJ_MMA_SYNC));
      fj_kernel *k;
      CHECK_OK(ctx, fj_attention_bwd_kernel(ctx, &p, &plan, 1, &k));
      const char *src = fj_kernel_source(k, NULL);
      CHECK(!strstr(src, "#line 1 \"score'\"") == !cases[c].score);
      CHECK(!strstr(src, "fj_score_grad(") == !cases[c].score);
      CHECK(!strstr(src, "#line 1 \"mask\"") == !cases[c].mask);
      int rc = compile_all(ctx, &p, cases[c].score ? "score" : cases[c].mask ? "mask" : "params");
      if (rc) {
        fj_ctx_destroy(ctx);
        return rc;
      }
    }
    fj_ctx_destroy(ctx);
  }
  /* s * s * ... * s: a product of 250 factors, whose derivative repeats
   * every prefix (about 100 KB of CUDA). */
  char text[1024];
  strcpy(text, "s");
  for (int i = 1; i < 250; i++)
    strcat(text, "*s");
  fj_ctx *ctx = fjt_ctx("sm_80", NULL);
  CHECK(ctx != NULL);
  fj_problem p;
  fj_mods m;
  fj_problem_init(&p, 1, 4, 4, 128, 128, 64, FJ_BF16, FJ_BSHD);
  fj_mods_init(&m);
  m.score = text;
  p.mods = &m;
  fj_plan fwd;
  fj_bwd_plan plan;
  CHECK_OK(ctx, fj_attention_plan(ctx, &p, &fwd));
  fj_status st = fj_attention_bwd_plan(ctx, &p, &plan);
  CHECK(st != FJ_OK);
  CHECK_MSG(ctx, "score': the expression's derivative as CUDA is too long for the "
                 "backward");
  CHECK(!strchr(fj_errmsg(ctx), '\n'));
  fj_ctx_destroy(ctx);
  return 0;
}


/* Block masks on the mma backward: the plan's kernel walks the transposed
 * lists (bwd_common.cuh's QWalk), its name carries the block sizes, the
 * mask expression runs only on partial tiles, and it compiles without
 * spills on sm_80 and sm_90a, with both stage counts (the walk's two
 * forms: prefetching the next step or not), with and without a mask
 * expression, GQA, a mask of one list per head. */
int test_backward_block_mask_compile(void)
{
  static int32_t docs[1024], lists[64];
  const fj_mod_param doc = {"doc", FJ_MOD_I32, 1, {1024, 0, 0, 0}, docs, 0};
  static const struct {
    const char *arch, *mask;
    int bq, bkv, heads, d, stages;
    fj_dtype dt;
    fj_mma mma;
  } cases[] = {
      {"sm_90a", "doc(q) == doc(kv)", 128, 128, 1, 64, 2, FJ_BF16, FJ_MMA_SYNC},
      {"sm_80", "kv + 64 >= q && kv <= q + h", 64, 256, 8, 128, 1, FJ_F16, FJ_MMA_SYNC},
      {"sm_80", NULL, 256, 64, 1, 96, 2, FJ_BF16, FJ_MMA_SYNC},
      /* wgmma: 128-key tiles (d64-128), 64 above */
      {"sm_90a", "doc(q) == doc(kv)", 128, 128, 1, 128, 2, FJ_BF16, FJ_MMA_WGMMA},
      {"sm_90a", "kv + 64 >= q && kv <= q + h", 64, 256, 8, 64, 2, FJ_F16, FJ_MMA_WGMMA},
      {"sm_90a", NULL, 256, 64, 1, 192, 2, FJ_BF16, FJ_MMA_WGMMA},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    fj_ctx *ctx = fjt_ctx(cases[c].arch, NULL);
    CHECK(ctx != NULL);
    fj_problem p;
    fj_mods m;
    fj_block_mask bm = {cases[c].bq, cases[c].bkv, 1, cases[c].heads,
                        (1000 + cases[c].bq - 1) / cases[c].bq,
                        (1000 + cases[c].bkv - 1) / cases[c].bkv,
                        lists, lists, lists, lists, lists, lists, lists, lists};
    fj_problem_init(&p, 2, 8, 2, 1000, 1000, cases[c].d, cases[c].dt, FJ_BSHD);
    p.causal = FJ_CAUSAL_BOTTOM_RIGHT;
    fj_mods_init(&m);
    m.mask = cases[c].mask;
    m.params = &doc;
    m.num_params = cases[c].mask ? 1 : 0;
    m.block_mask = &bm;
    p.mods = &m;
    fj_bwd_plan plan;
    CHECK_OK(ctx, fj__bwd_plan_candidate(ctx, &p, cases[c].mma, cases[c].stages, &plan));
    fj_kernel *k;
    CHECK_OK(ctx, fj_attention_bwd_kernel(ctx, &p, &plan, 1, &k));
    char want[24];
    snprintf(want, sizeof want, "_bm%dx%d", cases[c].bq, cases[c].bkv);
    CHECK(strstr(fj_kernel_name(k), want) != NULL);
    const char *src = fj_kernel_source(k, NULL);
    CHECK(strstr(src, "fj::qwalk_next(p, b, hk, n0, m_first, m_first + nq * 64, ") != NULL);
    CHECK(strstr(src, "const bool bm_part = cur.part;") != NULL);
    /* The mask expression behind the partial tiles' guard, if any. */
    CHECK(!strstr(src, "if (bm_part) {") == !cases[c].mask);
    /* The deterministic mode's turns: the mma family's replay each key
     * tile's walk (qlist_visits); the wgmma family's has none (the host
     * plans mma for it and refuses a wgmma plan). */
    CHECK((strstr(src, "fj::qlist_visits(p, b, h, t0, ") != NULL) ==
          (cases[c].mma == FJ_MMA_SYNC));
    CHECK((strstr(src, "fj::dq_turn_wait(turn, rank)") != NULL) ==
          (cases[c].mma == FJ_MMA_SYNC));
    fj_resources r;
    fj_kernel_resources(k, &r);
    printf("%-7s %-60s regs=%3d spill=%d/%d\n", cases[c].arch, fj_kernel_name(k),
           r.registers, r.spill_store_bytes, r.spill_load_bytes);
    CHECK(r.spill_store_bytes == 0 && r.spill_load_bytes == 0);
    /* The plan's own choice compiles too (its pre- and postprocess). */
    if ((c == 0 || c == 3) && compile_all(ctx, &p, "block mask")) {
      fj_ctx_destroy(ctx);
      return 1;
    }
    fj_ctx_destroy(ctx);
  }
  return 0;
}

/* The parameters' gradients (fj_mods.param_grads): the main kernel adds
 * them in fj_param_grads (an atomic a score for a read whose indices move
 * with q, kv or s; a warp's sum for the others), named _pg, compiles without spilling on both targets; an
 * int tensor's or a scalar's gradient is refused with what it is.  In the
 * deterministic mode the same kernel adds them as fixed point into the
 * workspace (16 bytes an element of each parameter with a gradient, after
 * the rest). */
int test_backward_param_grads_compile(void)
{
  static float slope[4], rel[4 * 64], grads_s[4], grads_r[4 * 64];
  static int32_t docs[512];
  const fj_mod_param params[4] = {
      {"slope", FJ_MOD_F32, 1, {4, 0, 0, 0}, slope, 0},
      {"rel", FJ_MOD_BF16, 2, {4, 64, 0, 0}, rel, 0},
      {"doc", FJ_MOD_I32, 1, {512, 0, 0, 0}, docs, 0},
      {"z", FJ_MOD_F32, 0, {0, 0, 0, 0}, NULL, 0.5}};
  float *grads[4] = {grads_s, grads_r, NULL, NULL};
  static const char *const archs[] = {"sm_80", "sm_90a"};
  for (int a = 0; a < 2; a++) {
    fj_ctx *ctx = fjt_ctx(archs[a], NULL);
    CHECK(ctx != NULL);
    /* 192: on mma on sm_90a too (the wide wgmma kernel adds none). */
    static const int dims[] = {64, 128, 192};
    for (int di = 0; di < 3; di++) {
      const int d = dims[di];
      fj_problem p;
      fj_mods m;
      fj_problem_init(&p, 1, 4, 2, 300, 300, d, FJ_BF16, FJ_BSHD);
      fj_mods_init(&m);
      m.score = "s * (1.0f + z * slope(h)) + rel(h, q - kv + 32) + slope(h) * (float)(kv - q)";
      m.mask = "doc(q) == doc(kv)";
      m.params = params;
      m.num_params = 4;
      m.param_grads = grads;
      p.mods = &m;
      fj_bwd_plan plan;
      CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &plan));
      fj_kernel *k;
      CHECK_OK(ctx, fj_attention_bwd_kernel(ctx, &p, &plan, 1, &k));
      const char *src = fj_kernel_source(k, NULL);
      CHECK(strstr(src, plan.variant.mma == FJ_MMA_WGMMA ? "fj_param_grads(dse, sr0, "
                                                         : "fj_param_grads(dse, sraw[j][0]") != NULL);
      CHECK(strstr(src, "fj::pgrad_add(fj_mg, 0, ") && strstr(src, "fj::pgrad_add(fj_mg, 1, ") &&
            !strstr(src, "fj::pgrad_add(fj_mg, 2, "));
      /* slope(h) is one element per head: summed, a warp's sum one atomic. */
      CHECK(strstr(src, "fj_param_flush(fj_pga, blk.b, h, blk.hk") != NULL);
      CHECK(strstr(fj_kernel_name(k), "_pg") != NULL);
      int rc = compile_all(ctx, &p, "param grads");
      if (rc) {
        fj_ctx_destroy(ctx);
        return rc;
      }
      /* Without gradients: another kernel, without the atomics. */
      m.param_grads = NULL;
      CHECK_OK(ctx, fj_attention_bwd_kernel(ctx, &p, &plan, 1, &k));
      CHECK(!strstr(fj_kernel_source(k, NULL), "fj_param_grads") &&
            !strstr(fj_kernel_name(k), "_pg"));
      m.param_grads = grads;
      /* Deterministic: the same main kernel, the words after the rest. */
      CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &plan));
      const size_t ws = plan.workspace_bytes;
      char name[256];
      CHECK_OK(ctx, fj_attention_bwd_kernel(ctx, &p, &plan, 1, &k));
      snprintf(name, sizeof name, "%s", fj_kernel_name(k));
      p.deterministic = 1;
      CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &plan));
      CHECK(plan.workspace_bytes >= ws + 16 * (4 + 4 * 64) &&
            plan.workspace_bytes <= ws + 16 + 16 * (4 + 4 * 64));
      CHECK_OK(ctx, fj_attention_bwd_kernel(ctx, &p, &plan, 1, &k));
      CHECK(strcmp(fj_kernel_name(k), name) == 0);
      p.deterministic = 0;
      grads[2] = grads_s;
      CHECK_ST(ctx, fj_attention_bwd_plan(ctx, &p, &plan), FJ_ERR_INVALID_ARG);
      CHECK_MSG(ctx, "mods.param_grads[2] is given for doc, an i32 tensor");
      grads[2] = NULL;
      grads[3] = grads_s;
      CHECK_ST(ctx, fj_attention_bwd_plan(ctx, &p, &plan), FJ_ERR_INVALID_ARG);
      CHECK_MSG(ctx, "mods.param_grads[3] is given for z, a scalar");
      grads[3] = NULL;
    }
    fj_ctx_destroy(ctx);
  }
  return 0;
}

/* The log's "ahead" lines: how many compiles fj_attention_bwd_prefetch
 * started. */
static void count_ahead(void *user, fj_log_level level, const char *msg)
{
  (void)level;
  if (strstr(msg, "ahead of its first use"))
    ++*(int *)user;
}

/* fj_attention_bwd_prefetch starts the backward's kernels compiling and
 * returns before they are done; fj_attention_bwd_kernel then takes those
 * compiles (the same kernels as a context without the prefetch builds),
 * and a second prefetch starts nothing (the kernels are in the memory
 * cache); a problem the backward refuses is refused here too. */
int test_backward_prefetch(void)
{
  int started = 0;
  fj_ctx *ctx = fjt_ctx_log("sm_90a", NULL, count_ahead, &started);
  fj_ctx *plain = fjt_ctx("sm_90a", NULL);
  CHECK(plain != NULL);
  CHECK(ctx != NULL);
  fj_problem p;
  fj_mods m;
  fj_problem_init(&p, 1, 4, 2, 300, 300, 128, FJ_BF16, FJ_BSHD);
  fj_mods_init(&m);
  m.score = "s * 0.5f";
  p.mods = &m;
  fj_bwd_plan plan;
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &plan));
  double t0 = fj__now_ms();
  CHECK_OK(ctx, fj_attention_bwd_prefetch(ctx, &p));
  double t_prefetch = fj__now_ms() - t0;
  CHECK(started == FJ_BWD_KERNELS);
  for (int i = 0; i < FJ_BWD_KERNELS; i++) {
    fj_kernel *k, *want;
    CHECK_OK(ctx, fj_attention_bwd_kernel(ctx, &p, &plan, i, &k));
    CHECK_OK(plain, fj_attention_bwd_kernel(plain, &p, &plan, i, &want));
    CHECK(strcmp(fj_kernel_name(k), fj_kernel_name(want)) == 0);
    CHECK(strcmp(fj_kernel_source(k, NULL), fj_kernel_source(want, NULL)) == 0);
  }
  double t_all = fj__now_ms() - t0;
  printf("prefetch returned after %.0f ms; its %d kernels ready after %.0f ms\n",
         t_prefetch, FJ_BWD_KERNELS, t_all);
  CHECK(t_prefetch < t_all / 2);
  CHECK_OK(ctx, fj_attention_bwd_prefetch(ctx, &p));
  CHECK(started == FJ_BWD_KERNELS);
  p.head_dim_v = 64;
  CHECK_ST(ctx, fj_attention_bwd_prefetch(ctx, &p), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "the backward does not take head_dim_v 64 with head_dim 128");
  CHECK_ST(ctx, fj_attention_bwd_prefetch(ctx, NULL), FJ_ERR_INVALID_ARG);
  fj_ctx_destroy(ctx);
  fj_ctx_destroy(plain);
  return 0;
}

/* ---- the deterministic mode's descending walk -------------------------------
 * A host replica of the wgmma backward's walks and dQ ranks under a mask
 * with a right side (attention_bwd_wgmma.cu's STEP_AT and DESC,
 * scheduler.cuh's kv_rank, mask.lua's query range of a key tile), one KV
 * head of `group` query heads: the plain walk (heads outer, query tiles
 * ascending, later key tiles first, launched last first) and the
 * descending one (g.deterministic 3: query tiles descending, heads inner,
 * earlier key tiles first, launched first first). */
typedef struct walk_case {
  int q, kv, off;     /* lengths; the diagonal's offset (p.causal_offset) */
  int right, left;    /* the window's sides (a causal mask: right 0); left -1: none */
  int bm, bn, group;  /* query tile, key tile (a pair's 128), heads a KV head */
} walk_case;

/* mask.lua's rows_begin and rows_end. */
static int walk_rows_begin(const walk_case *c, int n0)
{
  long long f = (long long)n0 - c->off - c->right;
  return f > 0 ? (int)f : 0;
}

static int walk_rows_end(const walk_case *c, int n_end)
{
  long long l = (long long)n_end - c->off + c->left;
  return c->left < 0 || l > c->q ? c->q : (int)l;
}

/* Key tile t's query range (scheduler.cuh's kv_head): nq tiles from m_first. */
static int walk_range(const walk_case *c, int t, int *m_first)
{
  int t0 = t * c->bn, m_end = walk_rows_end(c, t0 + c->bn);
  *m_first = walk_rows_begin(c, t0) / c->bm * c->bm;
  return m_end > *m_first && t0 < c->kv ? (m_end - *m_first + c->bm - 1) / c->bm : 0;
}

/* kv_rank's walks: whether key tile t walks query tile m0. */
static int walk_holds(const walk_case *c, int t, int m0)
{
  int t0 = t * c->bn;
  return t0 < c->kv && walk_rows_begin(c, t0) / c->bm * c->bm <= m0 &&
         m0 < walk_rows_end(c, t0 + c->bn);
}

typedef struct walk_step { int h, qt, rank; } walk_step;

/* Key tile t's steps (nq * group of them, into s) as its kernel walks
 * them, each with the rank kv_rank gives it: edge carried as the kernel
 * carries it.  Returns the steps. */
static int walk_steps(const walk_case *c, int tiles, int t, int desc, walk_step *s)
{
  int m_first, nq = walk_range(c, t, &m_first), steps = nq * c->group;
  int wn = desc ? c->group : nq, m_from = desc ? m_first + (nq - 1) * c->bm : m_first;
  int edge = 0;
  for (int i = 0; i < steps; i++) {
    int wa = i / wn, wc = i - wa * wn;
    int m0 = desc ? m_from - wa * c->bm : m_from + wc * c->bm;
    s[i].h = desc ? wc : wa;
    s[i].qt = m0 / c->bm;
    if (desc) {
      if (i == 0)
        edge = t;
      while (edge > 0 && walk_holds(c, edge - 1, m0))
        --edge;
      s[i].rank = t - edge;
    } else {
      if (wc == 0)
        edge = t;
      while (edge + 1 < tiles && walk_holds(c, edge + 1, m0))
        ++edge;
      s[i].rank = edge - t;
    }
  }
  return steps;
}

#define WALK_MAX_TILES 40
#define WALK_MAX_STEPS 512

/* The key tiles' blocks, launched in kv_tile's order (last_first: the last
 * key tile first) with at most `resident` at once, each taking a step a
 * round where its dQ tile's turn has come (dq_turn_wait: as many adds as
 * its rank, made in earlier rounds), then counting its add
 * (dq_turn_done).  The rounds it takes, or -1 where no resident block can
 * move (a deadlock); *bad set where a dQ tile's adds did not come in its
 * ranks' order or a turn ends short of its key tiles. */
static int walk_simulate(const walk_case *c, int desc, int last_first, int resident, int *bad)
{
  static walk_step s[WALK_MAX_TILES][WALK_MAX_STEPS];
  static int turn[8][64], next_turn[8][64];
  int tiles = (c->kv + c->bn - 1) / c->bn, n[WALK_MAX_TILES], at[WALK_MAX_TILES];
  int slot[WALK_MAX_TILES], launched = 0, done = 0, visits[8][64];
  memset(turn, 0, sizeof turn);
  memset(visits, 0, sizeof visits);
  for (int t = 0; t < tiles; t++) {
    n[t] = walk_steps(c, tiles, t, desc, s[t]);
    at[t] = 0;
    for (int i = 0; i < n[t]; i++)
      visits[s[t][i].h][s[t][i].qt]++;
  }
  for (int r = 0; r < resident; r++)
    slot[r] = -1;
  int rounds = 0;
  while (done < tiles) {
    memcpy(next_turn, turn, sizeof turn);
    int moved = 0;
    for (int r = 0; r < resident; r++) {
      if (slot[r] < 0 && launched < tiles)
        slot[r] = last_first ? tiles - 1 - launched++ : launched++;
      int t = slot[r];
      if (t < 0)
        continue;
      if (at[t] < n[t]) {
        const walk_step *w = &s[t][at[t]];
        if (turn[w->h][w->qt] < w->rank)
          continue;
        *bad |= turn[w->h][w->qt] != w->rank;
        next_turn[w->h][w->qt]++;
        at[t]++;
        moved = 1;
      }
      if (at[t] == n[t]) {
        slot[r] = -1;
        done++;
        moved = 1;
      }
    }
    memcpy(turn, next_turn, sizeof turn);
    rounds++;
    if (!moved)
      return -1;
  }
  for (int h = 0; h < c->group; h++)
    for (int qt = 0; qt < 64; qt++)
      *bad |= turn[h][qt] != visits[h][qt];
  return rounds;
}

/* One case of the descending walk's ranks: at every dQ tile, those of
 * the key tiles that add into it are 0..n-1, each the number of those
 * before it (a key tile waits only on lower-indexed ones, which kv_tile
 * launches before it), edge carried over the walk as the kernel carries
 * it; the blocks finish one resident at a time in the first-first order
 * (and, where some dQ tile takes two key tiles' adds, deadlock in the
 * last-first one: the simulation sees a deadlock), as the plain walk's do
 * in its own order. */
static int walk_check(const walk_case *c)
{
  static walk_step s[WALK_MAX_STEPS];
  static int seen[8][64][WALK_MAX_TILES];
  int tiles = (c->kv + c->bn - 1) / c->bn, qtiles = (c->q + c->bm - 1) / c->bm, m_first;
  CHECK(tiles <= WALK_MAX_TILES && qtiles <= 64 && c->group <= 8);
  memset(seen, 0, sizeof seen);
  for (int t = 0; t < tiles; t++) {
    CHECK(walk_range(c, t, &m_first) * c->group <= WALK_MAX_STEPS);
    int n = walk_steps(c, tiles, t, 1, s);
    for (int i = 0; i < n; i++) {
      /* the query tiles descend, the heads inner */
      CHECK(s[i].h == i % c->group);
      CHECK(i == 0 || s[i].qt == s[i - 1].qt - (s[i].h == 0));
      int before = 0;
      for (int u = 0; u < t; u++)
        before += walk_holds(c, u, s[i].qt * c->bm);
      CHECK(walk_holds(c, t, s[i].qt * c->bm) && s[i].rank == before);
      CHECK(!seen[s[i].h][s[i].qt][s[i].rank]);
      seen[s[i].h][s[i].qt][s[i].rank] = 1;
    }
  }
  /* every dQ tile's ranks 0..n-1 without a gap */
  int shared = 0;  /* some dQ tile takes two key tiles' adds */
  for (int h = 0; h < c->group; h++)
    for (int qt = 0; qt < qtiles; qt++) {
      int n = 0;
      for (int t = 0; t < tiles; t++)
        n += walk_holds(c, t, qt * c->bm);
      shared |= n > 1;
      for (int r = 0; r < WALK_MAX_TILES; r++)
        CHECK(seen[h][qt][r] == (r < n));
    }
  /* One block resident at a time: each finishes on the turns of those
   * before it alone.  A quarter of the key tiles resident (waves): the
   * rounds each order takes, for the record. */
  int bad = 0, quarter = tiles > 4 ? tiles / 4 : 1;
  int one = walk_simulate(c, 1, 0, 1, &bad), waves = walk_simulate(c, 1, 0, quarter, &bad);
  int plain_one = walk_simulate(c, 0, 1, 1, &bad), plain_waves = walk_simulate(c, 0, 1, quarter, &bad);
  CHECK(one > 0 && waves > 0 && plain_one > 0 && plain_waves > 0 && !bad);
  CHECK((walk_simulate(c, 1, 1, 1, &bad) < 0) == shared);
  printf("descending walk q%d kv%d off%d right%d left%d bn%d group%d: %d key tiles; "
         "rounds with %d resident %d (plain %d)\n",
         c->q, c->kv, c->off, c->right, c->left, c->bn, c->group, tiles, quarter,
         waves, plain_waves);
  return 0;
}

/* The kernel's text that the replica follows, causal with GQA in the
 * deterministic mode: the narrow kernel's (a division a step), the wide
 * one's (counted: kv_next; its turns passed at once) and the pair's
 * (ranks over tiles of 128). */
static int walk_text(void)
{
  unsetenv("FLASHJIT_BWD_PAIR");
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx != NULL);
  static const int dims[3] = {128, 192, 256};
  for (int d = 0; d < 3; d++) {
    fj_problem p;
    fj_problem_init(&p, 1, 8, 2, 700, 700, dims[d], FJ_BF16, FJ_BSHD);
    p.causal = FJ_CAUSAL_TOP_LEFT;
    p.deterministic = 1;
    fj_bwd_plan plan;
    fj_kernel *k;
    CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &plan));
    CHECK_OK(ctx, fj_attention_bwd_kernel(ctx, &p, &plan, 1, &k));
    const char *src = fj_kernel_source(k, NULL);
    const char *nt = dims[d] > 128 ? "(nt >> 1)" : "nt";  /* pairs above 128 */
    char want[3][96];
    snprintf(want[0], sizeof want[0], "if (i == 0) edge = %s;", nt);
    snprintf(want[1], sizeof want[1], "rank = %s - edge;", nt);
    snprintf(want[2], sizeof want[2], "rank = edge - %s;", nt);
    for (int i = 0; i < 3; i++)
      CHECK(strstr(src, want[i]) != NULL);
    CHECK(strstr(src, "const bool desc = g.deterministic == 3;") != NULL);
    CHECK(strstr(src, "while (edge > 0 && walks(edge - 1)) --edge;") != NULL);
    CHECK(strstr(src, "fj::kv_tile(g.section, g.deterministic && g.deterministic != 3") != NULL);
    if (dims[d] == 128) {
      CHECK(strstr(src, "const int wn = desc ? p.group : nq, m_from = desc ? m_first + (nq - 1) * 64 : m_first;") != NULL);
      CHECK(strstr(src, "const int wa = i / wn, wc = i - wa * wn, h = hk * p.group + (desc ? wc : wa), "
                        "m0 = desc ? m_from - wa * 64 : m_from + wc * 64;") != NULL);
      CHECK(strstr(src, "if (wc == 0) edge = nt;") != NULL);
    } else {
      CHECK(strstr(src, "iq = desc ? nq - 1 : 0, hq = 0; i < steps; ++i, fj::kv_next(iq, hq, nq, p.group, desc)") != NULL);
      CHECK(strstr(src, "const bool late = !desc;") != NULL);
    }
  }
  fj_ctx_destroy(ctx);
  return 0;
}

/* The descending walk's ranks (walk_check) under causal masks of both
 * alignments with unequal lengths, windows with and without a left side,
 * key tiles of 128 and 64; then the kernel's text (walk_text). */
int test_backward_descend_ranks(void)
{
  static const walk_case cases[] = {
      {700, 700, 0, 0, -1, 64, 128, 4},         /* causal top-left */
      {500, 900, 400, 0, -1, 64, 128, 2},       /* bottom-right, more keys */
      {900, 500, 0, 0, -1, 64, 128, 4},         /* top-left, more queries */
      {900, 500, -400, 0, -1, 64, 64, 3},       /* bottom-right: rows that see no key */
      {1100, 1100, 0, 0, 300, 64, 128, 4},      /* a window of 300 on the left */
      {2048, 2048, 0, 200, 100, 64, 128, 2},    /* both sides */
      {1500, 1300, -200, 50, -1, 64, 64, 8},    /* a right side alone */
      {2048, 2048, 0, 0, 0, 64, 128, 4},        /* the diagonal alone */
      {777, 1000, 223, 0, -1, 64, 128, 2},      /* a pair's tiles of 128 */
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
    if (walk_check(&cases[k]))
      return 1;
  return walk_text();
}

/* A plan remembers its choice per context (backward.c's memo), never its
 * sizes: problems that differ in lengths, heads or modifications each get
 * their own grid, workspace and kernel. */
int test_backward_memo(void)
{
  unsetenv("FLASHJIT_BWD_PAIR");
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx != NULL);
  fj_problem p;
  fj_bwd_plan a, b;
  char na[256], nb[256];
  fj_problem_init(&p, 2, 8, 4, 1000, 1000, 128, FJ_BF16, FJ_BSHD);
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &a));
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &b));
  CHECK(memcmp(&a, &b, sizeof a) == 0);
  fj_problem_init(&p, 3, 8, 2, 300, 5000, 128, FJ_BF16, FJ_BSHD);
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &b));
  CHECK(b.grid[0] == (5000 + 127) / 128 && b.grid[1] == 2 && b.grid[2] == 3);
  CHECK(b.workspace_bytes == (size_t)3 * 8 * 320 * 130 * sizeof(float) +
                               (size_t)3 * 8 * 5 * 2 * sizeof(int));
  fj_variant_name(&a.variant, na, sizeof na);
  fj_variant_name(&b.variant, nb, sizeof nb);
  CHECK(strcmp(na, nb) == 0);
  fj_mods m;
  fj_mods_init(&m);
  m.softcap = 20.f;
  p.mods = &m;
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &b));
  fj_kernel *k;
  CHECK_OK(ctx, fj_attention_bwd_kernel(ctx, &p, &b, 1, &k));
  CHECK(strstr(fj_kernel_name(k), "_cap") != NULL);
  p.mods = NULL;
  /* Head dim 96 runs padded to 128 on wgmma; 256 without a mask on a pair
   * of blocks (a tile of 128 keys, 64 each: two blocks a tile), but in the
   * deterministic mode (64-key tiles, one block each). */
  p.head_dim = 96;
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &b));
  CHECK(b.variant.mma == FJ_MMA_WGMMA && b.variant.head_dim == 96 && b.variant.tile_n == 128);
  CHECK(b.workspace_bytes == (size_t)3 * 8 * 320 * 130 * sizeof(float) +
                               (size_t)3 * 8 * 5 * 2 * sizeof(int));
  fj_problem_init(&p, 3, 8, 2, 300, 5000, 256, FJ_BF16, FJ_BSHD);
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &b));
  CHECK(b.variant.mma == FJ_MMA_WGMMA && b.variant.tile_n == 128 && b.grid[0] == (5000 + 127) / 128 * 2);
  fj_kernel *pk;
  CHECK_OK(ctx, fj_attention_bwd_kernel(ctx, &p, &b, 1, &pk));
  CHECK(strstr(fj_kernel_source(pk, NULL), "__cluster_dims__(2, 1, 1)") != NULL);
  /* The deterministic mode takes the pair too: its dQ tiles' turns count
   * pairs (one add a pair a tile, four warps an add), the rank over tiles
   * of 128 keys; without a mask, where the host rotates (g.deterministic
   * 2), each pair starts its walk at its own query tile and the turns
   * pass a step late; the arrival on the other block's out_free is
   * relaxed (a release waited for the step's dQ additions). */
  p.deterministic = 1;
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &b));
  CHECK(b.variant.mma == FJ_MMA_WGMMA && b.variant.head_dim == 256 && b.variant.tile_n == 128 &&
        b.grid[0] == (5000 + 127) / 128 * 2);
  const char *src = fj_kernel_source(pk, NULL);
  CHECK(strstr(src, "fj::dq_turn_wait_from(turn + c0 / 64, 4 * rank, seen)") != NULL);
  CHECK(strstr(src, "rank = edge - (nt >> 1);") == NULL);  /* no causal mask: earlier pairs first */
  CHECK(strstr(src, "rank = (nt >> 1) - edge;") != NULL);
  CHECK(strstr(src, "while (edge < (nt >> 1) && !walks(edge)) ++edge;") != NULL);
  CHECK(strstr(src, "rank = (nt >> 1) < A ? A - 1 - (nt >> 1) : A + T - 1 - (nt >> 1);") != NULL);
  CHECK(strstr(src, "int qt = g.deterministic == 2 ? (int)((unsigned)((nt >> 1) * nq) / (gridDim.x >> 1)) : 0;") != NULL);
  CHECK(strstr(src, "const bool late = g.deterministic == 2 && (int)(gridDim.x >> 1) <= nq;") != NULL);
  CHECK(strstr(src, "mbarrier.arrive.relaxed.cluster.shared::cluster.b64") != NULL);
  CHECK(strstr(src, "__CUDACC_VER_MINOR__ >= 8") != NULL);  /* PTX ISA 8.6's; a release before */
  /* Under a causal mask the pair too; under a window 64-key tiles, one
   * block each (the pair was slower there). */
  p.deterministic = 0;
  p.causal = FJ_CAUSAL_TOP_LEFT;
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &b));
  CHECK(b.variant.tile_n == 128 && b.grid[0] == (5000 + 127) / 128 * 2);
  /* Causal: later pairs first, over half the grid's width. */
  CHECK_OK(ctx, fj_attention_bwd_kernel(ctx, &p, &b, 1, &pk));
  src = fj_kernel_source(pk, NULL);
  CHECK(strstr(src, "while (edge + 1 < ((int)gridDim.x >> 1) && walks(edge + 1)) ++edge;") != NULL);
  CHECK(strstr(src, "rank = edge - (nt >> 1);") != NULL);
  CHECK(strstr(src, "const bool late = !desc;") != NULL);  /* later pairs start their walks later (not in the descending walk) */
  CHECK(strstr(src, "int qt =") == NULL);                 /* no rotation under a mask */
  fj_mods wm;
  fj_mods_init(&wm);
  wm.window_left = 512;
  wm.window_right = 0;
  p.mods = &wm;
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &b));
  CHECK(b.variant.tile_n == 64 && b.grid[0] == (5000 + 63) / 64);
  /* FLASHJIT_BWD_PAIR=1: the pair under the window too (the memo keeps
   * the choices apart; deterministic too), =0: 64-key tiles without one
   * too. */
  setenv("FLASHJIT_BWD_PAIR", "1", 1);
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &b));
  CHECK(b.variant.tile_n == 128 && b.grid[0] == (5000 + 127) / 128 * 2);
  p.deterministic = 1;
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &b));
  CHECK(b.variant.tile_n == 128);
  p.deterministic = 0;
  p.mods = NULL;
  p.causal = FJ_CAUSAL_NONE;
  setenv("FLASHJIT_BWD_PAIR", "0", 1);
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &b));
  CHECK(b.variant.tile_n == 64 && b.grid[0] == (5000 + 63) / 64);
  unsetenv("FLASHJIT_BWD_PAIR");
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &b));
  CHECK(b.variant.tile_n == 128);
  fj_ctx_destroy(ctx);
  return 0;
}

/* What the backward does not take, each refused with what it is. */
int test_backward_refusals(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx != NULL);
  fj_problem p;
  fj_bwd_plan plan;
  fj_mods m;
  fj_problem_init(&p, 1, 4, 4, 128, 128, 64, FJ_BF16, FJ_BHSD);
  fj_mods_init(&m);
  /* Score and mask expressions are taken, on wgmma on sm_90a. */
  m.score = "s * 0.5f";
  m.mask = "q >= kv";
  p.mods = &m;
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &plan));
  CHECK(plan.variant.mma == FJ_MMA_WGMMA);
  static const int32_t cu_dummy[4] = {0, 0, 0, 0};
  fj_mods_init(&m);
  m.window_left = 64;
  fj_block_mask bm;
  memset(&bm, 0, sizeof bm);
  bm.block_q = bm.block_kv = 128;
  bm.batch = bm.heads = bm.q_blocks = bm.kv_blocks = 1;
  bm.kv_num = bm.kv_indices = cu_dummy;
  m.block_mask = &bm;
  /* A block mask in the deterministic mode: the mma family's (a wgmma
   * plan of the same problem is refused at the call, in one line); a call
   * needs the transposed lists (full ones where the rows' lists have full
   * ones), named before anything launches. */
  p.deterministic = 1;
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &plan));
  CHECK(plan.variant.mma == FJ_MMA_SYNC);
  p.deterministic = 0;
  fj_bwd_plan wg;
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &wg));
  p.deterministic = 1;
  if (wg.variant.mma == FJ_MMA_WGMMA) {
    bm.q_num = bm.q_indices = cu_dummy;
    char cargs[64];
    void *ca = cargs;
    CHECK_ST(ctx, fj_attention_bwd_run(ctx, &p, &wg, ca, ca, ca, ca, ca, (float *)ca, ca, ca,
                                       ca, NULL, NULL, 0, NULL),
             FJ_ERR_UNSUPPORTED);
    CHECK_MSG(ctx, "fj_attention_bwd_run: the wgmma backward does not take "
                   "deterministic with mods.block_mask");
    CHECK(!strchr(fj_errmsg(ctx), '\n'));
    bm.q_num = bm.q_indices = NULL;
  }
  p.deterministic = 0;
  char args[64];
  void *a = args;
  CHECK_ST(ctx, fj_attention_bwd(ctx, &p, a, a, a, a, a, (float *)a, a, a, a, NULL, NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "fj_attention_bwd: mods.block_mask->q_num is NULL: the "
                 "backward walks each key block's query blocks (q_num, "
                 "q_indices; fj_block_mask_build fills them)");
  bm.q_num = bm.q_indices = cu_dummy;
  bm.full_num = bm.full_indices = cu_dummy;
  CHECK_ST(ctx, fj_attention_bwd(ctx, &p, a, a, a, a, a, (float *)a, a, a, a, NULL, NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "fj_attention_bwd: mods.block_mask->full_q_num is NULL but "
                 "full_num is not: full blocks need their lists in both "
                 "directions (fj_block_mask_build fills them)");
  bm.full_q_num = bm.full_q_indices = cu_dummy;
  CHECK_ST(ctx, fj_attention_bwd(ctx, &p, a, a, a, a, a, (float *)a, a, a, a, NULL, NULL),
           FJ_ERR_COMPILE_ONLY);
  /* Taken: by the wgmma family where its key blocks are whole key tiles
   * of 128, else by the mma family; the context's memo keeps the three
   * apart. */
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &plan));
  CHECK(plan.variant.mma == (bm.block_kv % 128 ? FJ_MMA_SYNC : FJ_MMA_WGMMA));
  bm.block_kv = 64;
  bm.kv_blocks = 2;
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &plan));
  CHECK(plan.variant.mma == FJ_MMA_SYNC && plan.variant.tile_n == 64);
  m.block_mask = NULL;
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &plan));
  CHECK(plan.variant.mma == FJ_MMA_WGMMA);
  p.mods = NULL;
  fj_problem_init(&p, 2, 4, 4, 128, 128, 64, FJ_BF16, FJ_THD);
  int32_t cu[3] = {0, 100, 200};
  p.cu_seqlens_q = p.cu_seqlens_kv = cu;
  p.total_q = p.total_kv = 200;
  /* Varlen plans: TMA (wgmma on sm_90a) needs the packed totals, the mma
   * family does not; a paged K/V is refused. */
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &plan));
  CHECK(plan.variant.varlen == 1);
  CHECK(plan.variant.mma == (strcmp(fj_ctx_arch(ctx), "sm_90a") == 0 ? FJ_MMA_WGMMA : FJ_MMA_SYNC));
  p.total_q = p.total_kv = 0;
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &plan));
  CHECK(plan.variant.mma == FJ_MMA_SYNC && plan.variant.varlen == 1);
  p.cu_seqlens_kv = NULL;
  int32_t table[2] = {0, 1};
  p.block_table = table;
  p.max_pages = 2;
  p.page_size = 64;
  p.num_pages = 2;
  CHECK_ST(ctx, fj_attention_bwd_plan(ctx, &p, &plan), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "paged K/V");
  fj_problem_init(&p, 1, 4, 4, 128, 128, 64, FJ_BF16, FJ_BHSD);
  CHECK_ST(ctx, fj_attention_bwd_plan(NULL, &p, &plan), FJ_ERR_INVALID_ARG);
  CHECK_ST(ctx, fj_attention_bwd_plan(ctx, &p, NULL), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "plan");
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &plan));
  fj_kernel *k;
  CHECK_ST(ctx, fj_attention_bwd_kernel(ctx, &p, &plan, 3, &k), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "which 3 is invalid");
  /* Arguments: a missing gradient, a broadcast input, dsinks without
   * sinks, and no device to launch on (each named before any launch). */
  char buf[64];
  void *d = buf;
  CHECK_ST(ctx, fj_attention_bwd(ctx, &p, d, d, d, d, d, (float *)d, d, NULL, d, NULL, NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "dk");
  p.k_stride[1] = 0;
  CHECK_ST(ctx, fj_attention_bwd(ctx, &p, d, d, d, d, d, (float *)d, d, d, d, NULL, NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "k_stride[1] is 0 (a broadcast input)");
  fj_problem_init(&p, 1, 4, 4, 128, 128, 64, FJ_BF16, FJ_BHSD);
  CHECK_ST(ctx, fj_attention_bwd(ctx, &p, d, d, d, d, d, (float *)d, d, d, d, (float *)d, NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "dsinks is given but the problem has no sinks");
  CHECK_ST(ctx, fj_attention_bwd(ctx, &p, d, d, d, d, d, (float *)d, d, d, d, NULL, NULL),
           FJ_ERR_COMPILE_ONLY);
  fj_ctx_destroy(ctx);
  /* Before sm_80 there is no mma.sync. */
  ctx = fjt_ctx("sm_75", NULL);
  CHECK(ctx != NULL);
  CHECK_ST(ctx, fj_attention_bwd_plan(ctx, &p, &plan), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "needs sm_80 or newer");
  fj_ctx_destroy(ctx);
  return 0;
}

/* Whether the kernel is a cache hit (disk or memory). */
static int hit(const fj_kernel *k)
{
  fj_resources r;
  fj_kernel_resources(k, &r);
  return r.cache != FJ_CACHE_MISS;
}

/* fj_cache_prewarm_bwd on a compile-only context: the distinct backwards
 * of a list (a repeat of other sizes prepared once), into a fresh disk
 * cache where a new context then finds all three kernels of each; again,
 * nothing compiles; a refused problem is named with its reason. */
int test_backward_prewarm(void)
{
  const char *dir = fjt_tmpdir();
  fj_ctx *ctx = fjt_ctx("sm_80", dir);
  CHECK(ctx != NULL);
  fj_problem ps[3];
  fj_problem_init(&ps[0], 2, 8, 2, 300, 300, 64, FJ_F16, FJ_BSHD);
  fj_problem_init(&ps[1], 2, 8, 8, 300, 300, 64, FJ_F16, FJ_BSHD);
  ps[1].causal = FJ_CAUSAL_TOP_LEFT;
  fj_problem_init(&ps[2], 1, 4, 4, 4096, 4096, 64, FJ_F16, FJ_BHSD);
  fj_status each[3];
  fj_prewarm_report r;
  fj_prepare_opts po = {2, NULL, NULL};
  CHECK_OK(ctx, fj_cache_prewarm_bwd(ctx, ps, 3, &po, each, &r));
  CHECK(each[0] == FJ_OK && each[1] == FJ_OK && each[2] == FJ_OK);
  /* two mains, one preprocess and one postprocess (d64, f16, mma) */
  CHECK(r.variants == 2 && r.kernels == 4 && r.compiled == 4 && r.cached == 0 &&
        r.failed == 0);
  fj_ctx_destroy(ctx);
  ctx = fjt_ctx("sm_80", dir);
  CHECK(ctx != NULL);
  for (int i = 0; i < 3; i++) {
    fj_bwd_plan plan;
    CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &ps[i], &plan));
    for (int w = 0; w < FJ_BWD_KERNELS; w++) {
      fj_kernel *k;
      CHECK_OK(ctx, fj_attention_bwd_kernel(ctx, &ps[i], &plan, w, &k));
      CHECK(hit(k));
    }
  }
  CHECK_OK(ctx, fj_cache_prewarm_bwd(ctx, ps, 3, NULL, NULL, &r));
  CHECK(r.variants == 2 && r.kernels == 4 && r.compiled == 0 && r.cached == 4);
  /* A problem the backward refuses: the others are still prepared. */
  ps[1].head_dim_v = 32;
  CHECK_ST(ctx, fj_cache_prewarm_bwd(ctx, ps, 2, NULL, each, &r),
           FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "fj_cache_prewarm_bwd: 1 of 2 problems failed; the first, "
                 "problems[1]: the backward does not take head_dim_v 32 "
                 "with head_dim 64");
  CHECK(each[0] == FJ_OK && each[1] == FJ_ERR_UNSUPPORTED);
  CHECK(r.variants == 2 && r.failed == 1 && r.kernels == 3);
  /* T5's buckets: the backward launches its relative table's kernel
   * first, so the prewarm makes it beside the three. */
  fj_mod_param bias = {"bias", FJ_MOD_F32, 2, {4, 32}, NULL, 0};
  fj_mods t5;
  fj_mods_init(&t5);
  t5.score = fj_mod_builtin_find("t5")->score;
  t5.params = &bias;
  t5.num_params = 1;
  fj_problem_init(&ps[2], 1, 4, 4, 300, 300, 64, FJ_F16, FJ_BSHD);
  ps[2].mods = &t5;
  CHECK_OK(ctx, fj_cache_prewarm_bwd(ctx, &ps[2], 1, NULL, each, &r));
  CHECK(each[0] == FJ_OK && r.variants == 1 && r.kernels == 4);
  fj_kernel *table;
  CHECK_OK(ctx, fj_rel_table_kernel(ctx, &ps[2], &table));
  CHECK(hit(table));
  /* Arguments. */
  CHECK_ST(NULL, fj_cache_prewarm_bwd(NULL, ps, 1, NULL, NULL, NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_ST(ctx, fj_cache_prewarm_bwd(ctx, NULL, 1, NULL, NULL, NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "problems");
  CHECK_ST(ctx, fj_cache_prewarm_bwd(ctx, ps, 65537, NULL, NULL, NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "n = 65537 problems is more than one call takes (at most 65536)");
  po.workers = -1;
  CHECK_ST(ctx, fj_cache_prewarm_bwd(ctx, ps, 1, &po, NULL, NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "workers -1 is invalid");
  CHECK_OK(ctx, fj_cache_prewarm_bwd(ctx, NULL, 0, NULL, NULL, &r));
  CHECK(r.variants == 0 && r.kernels == 0);
  fj_ctx_destroy(ctx);
  return 0;
}

typedef struct bwd_seen {
  int fwd, bwd;
} bwd_seen;

static int count_entry(void *user, const fj_tune_entry *e)
{
  bwd_seen *s = user;
  size_t n = strlen(e->key);
  if (n >= 4 && !strcmp(e->key + n - 4, "|bwd"))
    s->bwd += e->variant.mma == FJ_MMA_SYNC && e->variant.stages == 1;
  else
    s->fwd++;
  return 0;
}

/* fj_tune_bwd's refusals without a GPU, and the database's backward
 * entries: keyed apart from the forward's (both kept for one class). */
int test_backward_tune(void)
{
  const char *dir = fjt_tmpdir();
  fj_ctx *ctx = fjt_ctx("sm_90a", dir);
  CHECK(ctx != NULL);
  fj_problem p;
  fj_problem_init(&p, 1, 4, 4, 256, 256, 64, FJ_BF16, FJ_BHSD);
  CHECK_ST(NULL, fj_tune_bwd(NULL, &p, NULL, NULL, NULL), FJ_ERR_INVALID_ARG);
  CHECK_ST(ctx, fj_tune_bwd(ctx, NULL, NULL, NULL, NULL), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "fj_tune_bwd");
  fj_tune_opts o;
  fj_tune_opts_init(&o);
  o.iters = 300;
  CHECK_ST(ctx, fj_tune_bwd(ctx, &p, &o, NULL, NULL), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "fj_tune_bwd: iters 300 is invalid: must be in 0..256");
  fj_tune_opts_init(&o);
  o.warmup = -1;
  CHECK_ST(ctx, fj_tune_bwd(ctx, &p, &o, NULL, NULL), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "fj_tune_bwd: warmup -1 is invalid");
  fj_tune_report r;
  memset(&r, 0x7f, sizeof r);
  CHECK_ST(ctx, fj_tune_bwd(ctx, &p, NULL, NULL, &r), FJ_ERR_COMPILE_ONLY);
  CHECK_MSG(ctx, "needs a GPU context");
  CHECK(r.candidates == 0 && r.timed == 0);
  fj_mods m;
  fj_mods_init(&m);
  m.mask = "q >= kv";  /* taken: the tuner then needs its GPU */
  p.mods = &m;
  CHECK_ST(ctx, fj_tune_bwd(ctx, &p, NULL, NULL, NULL), FJ_ERR_COMPILE_ONLY);
  CHECK_MSG(ctx, "needs a GPU context");
  p.mods = NULL;
  /* The candidates the tuner counts: a family's template refusing a head
   * dim is a refusal (FJ_ERR_UNSUPPORTED), not a failure. */
  static const int dims[] = {32, 64, 96, 128, 192, 256};
  for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
    fj_problem c;
    fj_bwd_plan plan;
    fj_problem_init(&c, 1, 4, 4, 256, 256, dims[i], FJ_BF16, FJ_BHSD);
    fj_status st = fj__bwd_plan_candidate(ctx, &c, FJ_MMA_WGMMA, 2, &plan);
    printf("d%d wgmma: %s %s\n", dims[i], fj_status_str(st),
           st == FJ_OK ? "" : fj_errmsg(ctx));
    CHECK(dims[i] >= 64 ? st == FJ_OK : st == FJ_ERR_UNSUPPORTED);
    CHECK_OK(ctx, fj__bwd_plan_candidate(ctx, &c, FJ_MMA_SYNC, 1, &plan));
    CHECK(plan.variant.mma == FJ_MMA_SYNC && plan.variant.stages == 1 &&
          plan.variant.head_dim == dims[i]);
  }
  fj_variant v;
  fj_variant_default(&v, 64, FJ_BF16, FJ_CAUSAL_NONE);
  CHECK_OK(ctx, fj__tune_record(ctx, &p, &v, 1.0, 1.0));
  v.mma = FJ_MMA_SYNC;
  v.stages = 1;
  CHECK_OK(ctx, fj__tune_record_bwd(ctx, &p, &v, 2.0, 2.5));
  bwd_seen s = {0, 0};
  CHECK_OK(ctx, fj_tune_list(ctx, count_entry, &s));
  CHECK(s.fwd == 1 && s.bwd == 1);
  fj_ctx_destroy(ctx);
  return 0;
}

/* What the backward's kernels count in 32-bit ints, and its workspace's
 * bytes: a problem past them is refused at the plan in one line naming
 * the count and the limit, where the kernels would have wrapped (the row
 * kernels' grid, the main kernel's block count, the deterministic
 * parameter gradients' words), and the block mask's stride between batch
 * indices, forward and backward alike; a problem just inside is planned.
 * Only sizes are read: no memory is touched. */
int test_backward_counts(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx != NULL);
  fj_problem p;
  fj_bwd_plan plan;
  /* 32 x 1024 x 2^20 rows: 2^31 blocks of 16 rows for the row kernels. */
  fj_problem_init(&p, 32, 1024, 1024, 1 << 20, 1 << 20, 64, FJ_BF16, FJ_BHSD);
  CHECK_ST(ctx, fj_attention_bwd_plan(ctx, &p, &plan), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "batch 32 x heads_q 1024 x seq_q 1048576 (in query tiles of 64) = "
                 "34359738368 rows: the backward's row kernels take at most 34359738352 "
                 "(2147483647 blocks of 16)");
  CHECK(!strchr(fj_errmsg(ctx), '\n'));
  p.batch = 31;
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &plan));
  CHECK(plan.rows_grid == (unsigned)(31ull * 1024 * (1 << 20) / 16));
  /* 2^30 keys in tiles of 128 over 256 heads: 2^31 blocks. */
  fj_problem_init(&p, 1, 256, 256, 256, 1 << 30, 64, FJ_BF16, FJ_BHSD);
  CHECK_ST(ctx, fj_attention_bwd_plan(ctx, &p, &plan), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "8388608 key tiles x heads_kv 256 x batch 1 = 2147483648 blocks: the "
                 "backward's main kernel counts at most 2147483647");
  /* The deterministic mode's words for a float table of 2^60 elements
   * with a gradient: 2^64 bytes. */
  static const int32_t dummy[4] = {0, 0, 0, 0};
  float *grads[1] = {(float *)(uintptr_t)dummy};
  fj_mod_param t = {"t", FJ_MOD_F32, 2, {1 << 30, 1 << 30, 0, 0}, dummy, 0};
  fj_mods m;
  fj_mods_init(&m);
  m.score = "s + t(q, kv)";
  m.params = &t;
  m.num_params = 1;
  m.param_grads = grads;
  fj_problem_init(&p, 1, 4, 4, 128, 128, 64, FJ_BF16, FJ_BHSD);
  p.mods = &m;
  p.deterministic = 1;
  CHECK_ST(ctx, fj_attention_bwd_plan(ctx, &p, &plan), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "the deterministic mode's parameter gradients: 1152921504606846976 "
                 "elements of 16 bytes of workspace each, past 2^63 bytes");
  /* A block mask of 128 heads x 2^24 query blocks a batch index of 2:
   * its stride, 2^31 entries, is refused by both directions' plans. */
  fj_block_mask bm;
  memset(&bm, 0, sizeof bm);
  bm.block_q = bm.block_kv = 64;
  bm.batch = 2;
  bm.heads = 128;
  bm.q_blocks = 1 << 24;
  bm.kv_blocks = 1;
  bm.kv_num = bm.kv_indices = bm.q_num = bm.q_indices = dummy;
  fj_mods_init(&m);
  m.mask = "q + b + h >= kv";
  m.block_mask = &bm;
  fj_problem_init(&p, 2, 128, 128, 1 << 30, 64, 64, FJ_BF16, FJ_BHSD);
  p.mods = &m;
  fj_plan fwd;
  CHECK_ST(ctx, fj_attention_plan(ctx, &p, &fwd), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "mods.block_mask->heads 128 x 16777216 blocks = 2147483648 entries a "
                 "batch index: the kernels step at most 2147483647");
  CHECK_ST(ctx, fj_attention_bwd_plan(ctx, &p, &plan), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "mods.block_mask->heads 128 x 16777216 blocks");
  fj_ctx_destroy(ctx);
  return 0;
}

/* A context destroyed while its prefetched backward compiles leaves the
 * kernels in its disk cache (its compiles are joined and kept, as the
 * tiered JIT's are): the next context on the directory finds all three
 * there without compiling. */
int test_backward_prefetch_kept(void)
{
  const char *dir = fjt_tmpdir();
  fj_ctx *ctx = fjt_ctx("sm_90a", dir);
  CHECK(ctx != NULL);
  fj_problem p;
  fj_problem_init(&p, 1, 4, 2, 300, 300, 64, FJ_BF16, FJ_BSHD);
  p.causal = FJ_CAUSAL_TOP_LEFT;
  CHECK_OK(ctx, fj_attention_bwd_prefetch(ctx, &p));
  fj_ctx_destroy(ctx);
  fj_ctx *next = fjt_ctx("sm_90a", dir);
  CHECK(next != NULL);
  fj_bwd_plan plan;
  CHECK_OK(next, fj_attention_bwd_plan(next, &p, &plan));
  for (int i = 0; i < FJ_BWD_KERNELS; i++) {
    fj_kernel *k;
    CHECK_OK(next, fj_attention_bwd_kernel(next, &p, &plan, i, &k));
    fj_resources r;
    fj_kernel_resources(k, &r);
    CHECK(r.cache == FJ_CACHE_DISK);
  }
  fj_ctx_destroy(next);
  return 0;
}
