/*
 * test_mods.c -- score and mask modifications without a GPU: what
 * fj_mods_check and fj_problem_check refuse (status and message), the
 * reference's semantics of every built-in and of user expressions against
 * values worked out here by their formulas, and the kernels that carry
 * them (both fast families, no spills; values are launch arguments, so a
 * changed value compiles nothing).  Their results on a GPU are
 * test_gpu_mods.c's.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "mods.h"
#include "mods_cases.h"
#include "rel_table.h"
#include "locked.h"
#include "runner.h"

/* ---- refusals ------------------------------------------------------------------- */

#define CHECK_MODS(m, text)                                                \
  do {                                                                     \
    CHECK_ST(NULL, fj_mods_check(m), FJ_ERR_INVALID_ARG);                  \
    CHECK_MSG(NULL, text);                                                 \
  } while (0)

int test_mods_refusals(void)
{
  fj_mods m;
  float slopes[8] = {0};
  fj_mod_param prm[2] = {
      {"slopes", FJ_MOD_F32, 1, {8, 0, 0, 0}, slopes, 0},
      {"cap", FJ_MOD_F32, 0, {0}, NULL, 30},
  };
  fj_mods_init(&m);
  CHECK_OK(NULL, fj_mods_check(&m));
  CHECK_ST(NULL, fj_mods_check(NULL), FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "fj_mods_check: m is NULL");
  /* Expressions: statements, braces, preprocessor lines, unknown names. */
  m.score = "s; return 0";
  CHECK_MODS(&m, "mods.score: ';' at column 2");
  m.score = "s + {1}";
  CHECK_MODS(&m, "'{' at column 5");
  m.score = "#define X 1\ns";
  CHECK_MODS(&m, "'#' at column 1");
  m.score = "s + asm(\"\")";
  CHECK_MODS(&m, "column 5");
  m.score = "printf(\"x\")";
  CHECK_MODS(&m, "'printf' at column 1");
  m.score = "s * 0.5";
  CHECK_MODS(&m, "0.5f");
  m.score = "   ";
  CHECK_MODS(&m, "mods.score: empty expression");
  char longtext[FJ_MOD_EXPR_MAX + 8];
  memset(longtext, ' ', sizeof longtext - 1);
  longtext[0] = 's';
  longtext[sizeof longtext - 1] = 0;
  m.score = longtext;
  CHECK_MODS(&m, "mods.score is 1031 characters long; the limit is 1024");
  m.score = NULL;
  m.mask = "s > 0.f";  /* the mask has no score */
  CHECK_MODS(&m, "mods.mask: 's' at column 1");
  m.mask = "q >= kv";
  CHECK_OK(NULL, fj_mods_check(&m));
  /* Parameters: names, types, ranks, extents, data, values. */
  m.params = prm;
  m.num_params = 2;
  m.score = "s - slopes(h) * (float)abs(q - kv) + cap";
  CHECK_OK(NULL, fj_mods_check(&m));
  m.score = "s + slopes(h, q)";
  CHECK_MODS(&m, "slopes");
  m.score = "s + slopes";
  CHECK_MODS(&m, "'slopes' at column 5");
  m.score = NULL;
  prm[1].name = "slopes";
  CHECK_MODS(&m, "mods.params[1].name \"slopes\" is also params[0]'s");
  prm[1].name = "tanhf";
  CHECK_MODS(&m, "mods.params[1].name \"tanhf\" is reserved");
  prm[1].name = "fj_x";
  CHECK_MODS(&m, "\"fj_x\" is reserved");
  prm[1].name = "2x";
  CHECK_MODS(&m, "mods.params[1].name \"2x\" is not a name");
  prm[1].name = NULL;
  CHECK_MODS(&m, "mods.params[1].name is NULL");
  prm[1].name = "cap";
  prm[1].type = FJ_MOD_F16;
  CHECK_MODS(&m, "mods.params[1] (cap): a scalar's type is f16; f32 or i32");
  prm[1].type = FJ_MOD_I32;
  prm[1].value = 2.5;
  CHECK_MODS(&m, "mods.params[1] (cap): value 2.5 is not an int32");
  prm[1].value = 3e9;
  CHECK_MODS(&m, "value 3e+09 is not an int32");
  prm[1] = (fj_mod_param){"cap", FJ_MOD_F32, 5, {0}, NULL, 30};
  CHECK_MODS(&m, "mods.params[1] (cap): rank 5 is outside 0..4");
  prm[1].rank = 0;
  prm[0].extents[0] = 0;
  CHECK_MODS(&m, "mods.params[0] (slopes): extents[0] = 0 is outside 1..2147483647");
  prm[0].extents[0] = 8;
  prm[0].data = NULL;
  CHECK_MODS(&m, "mods.params[0] (slopes): a tensor's data is NULL");
  prm[0].data = (const char *)slopes + 1;
  CHECK_MODS(&m, "is not 4-byte aligned");
  prm[0].data = slopes;
  m.num_params = 9;
  CHECK_MODS(&m, "mods.num_params 9 is outside 0..8");
  m.num_params = 2;
  m.params = NULL;
  CHECK_MODS(&m, "mods.params is NULL with num_params 2");
  m.params = prm;
  /* The built-ins. */
  m.window_left = -2;
  CHECK_MODS(&m, "mods.window_left -2 is outside -1 (unbounded)..1073741824");
  m.window_left = 128;
  m.window_right = FJ_WINDOW_MAX + 1;
  CHECK_MODS(&m, "mods.window_right 1073741825 is outside");
  m.window_right = 0;
  m.softcap = -1.f;
  CHECK_MODS(&m, "mods.softcap -1 is invalid");
  m.softcap = NAN;
  CHECK_MODS(&m, "mods.softcap nan is invalid");
  m.softcap = 30.f;
  CHECK_OK(NULL, fj_mods_check(&m));
  /* With the causal mask: the window's right side is the diagonal. */
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  fj_problem p;
  fj_problem_init(&p, 1, 8, 8, 256, 256, 64, FJ_F16, FJ_BHSD);
  p.mods = &m;
  p.causal = FJ_CAUSAL_BOTTOM_RIGHT;
  m.window_right = 5;
  CHECK_ST(ctx, fj_problem_check(ctx, &p), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "mods.window_right 5 with causal bottom-right: a causal mask hides every key right of the diagonal; use window_right 0 or -1");
  m.window_right = -1;
  CHECK_OK(ctx, fj_problem_check(ctx, &p));
  /* The wmma family has no modifications. */
  fj_variant v;
  fj_variant_default(&v, 64, FJ_F16, FJ_CAUSAL_NONE);
  v.mods = &m;
  CHECK_ST(ctx, fj_variant_check(ctx, &v), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "mods (window, softcap, score and mask expressions) are implemented for mma mma and mma wgmma");
  /* Sinks: the wmma family is refused naming them; a pointer that cannot
   * hold float32s is refused (the reference and the launches check data). */
  static const float sinks[2] = {0.5f, 1.f};
  fj_mods_init(&m);
  m.sinks = sinks;
  CHECK_OK(NULL, fj_mods_check(&m));
  CHECK_ST(ctx, fj_variant_check(ctx, &v), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "mods.sinks (attention sinks) are implemented for mma mma and mma wgmma; this variant is mma wmma");
  m.sinks = (const float *)((const char *)sinks + 2);
  CHECK_MODS(&m, "mods.sinks");
  CHECK_MSG(NULL, "is not 4-byte aligned: float32 [heads_q]");
  fj_ctx_destroy(ctx);
  return 0;
}

/* ---- the reference's semantics --------------------------------------------------------- */

enum { RS = 6, RD = 16 };

/* A problem of one head whose scores are known: Q row i is (1, 0, ...),
 * key j is (kq[j], 0, ...), so with scale 1 the score of (i, j) is kq[j];
 * V row j holds j + 1 in every column. */
typedef struct ref_case {
  fj_problem p;
  uint16_t q[RS * RD], k[RS * RD], v[RS * RD];
  double out[RS * RD], lse[RS];
} ref_case;

static void ref_init(ref_case *c, int sq, int skv, const double *kq)
{
  float f[RS * RD];
  fj_problem_init(&c->p, 1, 1, 1, sq, skv, RD, FJ_F16, FJ_BHSD);
  c->p.scale = 1.f;
  for (int i = 0; i < RS * RD; i++)
    f[i] = i % RD == 0 ? 1.f : 0.f;
  fj_convert(FJ_F16, c->q, FJ_F32, f, RS * RD);
  for (int i = 0; i < RS * RD; i++)
    f[i] = i % RD == 0 ? (float)kq[i / RD] : 0.f;
  fj_convert(FJ_F16, c->k, FJ_F32, f, RS * RD);
  for (int i = 0; i < RS * RD; i++)
    f[i] = (float)(i / RD + 1);
  fj_convert(FJ_F16, c->v, FJ_F32, f, RS * RD);
}

/* What row i must be: softmax over the keys `keep` allows of score(j),
 * applied to V's j + 1 -- computed here, by the formula. */
typedef int (*keep_fn)(int i, int j, const void *u);
typedef double (*score_fn)(int i, int j, double s, const void *u);

static int check_rows(const ref_case *c, const double *kq, keep_fn keep,
                      score_fn score, const void *u)
{
  for (int i = 0; i < c->p.seq_q; i++) {
    double mx = -HUGE_VAL, sum = 0, acc = 0;
    for (int j = 0; j < c->p.seq_kv; j++)
      if (keep(i, j, u))
        mx = fmax(mx, score(i, j, kq[j], u));
    for (int j = 0; j < c->p.seq_kv; j++)
      if (keep(i, j, u)) {
        double w = exp(score(i, j, kq[j], u) - mx);
        sum += w;
        acc += w * (j + 1);
      }
    double want = sum > 0 ? acc / sum : 0, lse = sum > 0 ? mx + log(sum) : -HUGE_VAL;
    if (fabs(c->out[i * RD] - want) > 1e-6 || fabs(c->out[i * RD + 5] - want) > 1e-6 ||
        !(c->lse[i] == lse || fabs(c->lse[i] - lse) < 1e-6)) {
      fprintf(stderr, "row %d: out %.9g lse %.9g, want %.9g lse %.9g\n", i,
              c->out[i * RD], c->lse[i], want, lse);
      return 1;
    }
  }
  return 0;
}

typedef struct win { int off, left, right, causal; } win;

static int keep_window(int i, int j, const void *u)
{
  const win *w = u;
  int d = i + w->off;
  return (w->left < 0 || j >= d - w->left) && (w->right < 0 || j <= d + w->right) &&
         (!w->causal || j <= d);
}

static int keep_all(int i, int j, const void *u)
{
  (void)i, (void)j, (void)u;
  return 1;
}

static double plain(int i, int j, double s, const void *u)
{
  (void)i, (void)j, (void)u;
  return s;
}

static double capped(int i, int j, double s, const void *u)
{
  (void)i, (void)j;
  double cap = *(const double *)u;
  return cap * tanh(s / cap);
}

/* The built-ins: windows (both alignments, both sides, with and without
 * the causal mask) and the softcap, against their formulas. */
int test_mods_reference_builtins(void)
{
  static const double kq[RS] = {0.5, -1, 2, 0.25, 3, -0.5};
  static const int shapes[][2] = {{RS, RS}, {3, RS}, {RS, 3}};
  static const int sides[][2] = {{2, 0}, {1, 1}, {0, 0}, {-1, 1}, {3, -1}, {0, 2}};
  ref_case c;
  fj_mods m;
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (size_t w = 0; w < sizeof sides / sizeof sides[0]; w++)
      for (int causal = 0; causal < 3; causal++) {
        if (causal && sides[w][1] > 0)
          continue;
        int sq = shapes[s][0], skv = shapes[s][1];
        ref_init(&c, sq, skv, kq);
        fj_mods_init(&m);
        m.window_left = sides[w][0];
        m.window_right = sides[w][1];
        c.p.mods = &m;
        c.p.causal = causal == 1 ? FJ_CAUSAL_TOP_LEFT
                     : causal == 2 ? FJ_CAUSAL_BOTTOM_RIGHT : FJ_CAUSAL_NONE;
        /* The diagonal: top-left only when the causal mask says so. */
        win wn = {causal == 1 ? 0 : skv - sq, sides[w][0], sides[w][1], causal != 0};
        CHECK_OK(NULL, fj_reference_fwd(&c.p, c.q, c.k, c.v, NULL, NULL, 0, sq, c.out, c.lse));
        if (check_rows(&c, kq, keep_window, plain, &wn)) {
          fprintf(stderr, "shape %dx%d window (%d, %d) causal %d\n", sq, skv,
                  sides[w][0], sides[w][1], causal);
          return 1;
        }
      }
  /* Softcap 2 (scores up to 3, so the cap bends them), with a window. */
  double cap = 2;
  ref_init(&c, RS, RS, kq);
  fj_mods_init(&m);
  m.softcap = 2.f;
  c.p.mods = &m;
  CHECK_OK(NULL, fj_reference_fwd(&c.p, c.q, c.k, c.v, NULL, NULL, 0, RS, c.out, c.lse));
  CHECK(check_rows(&c, kq, keep_all, capped, &cap) == 0);
  return 0;
}

typedef struct user { const float *bias; float slope; } user;

static double alibi(int i, int j, double s, const void *u)
{
  const user *x = u;
  return s - (double)x->slope * fabs((double)(i - j));
}

static double biased(int i, int j, double s, const void *u)
{
  const user *x = u;
  int at = i - j + 2;  /* the table's index; 0 outside 0..4 */
  return s + (at >= 0 && at < 5 ? (double)x->bias[at] : 0.0);
}

static int keep_doc(int i, int j, const void *u)
{
  const int *doc = u;
  return doc[i] == doc[j];
}

static int keep_none(int i, int j, const void *u)
{
  (void)i, (void)j, (void)u;
  return 0;
}

/* User expressions through the reference's evaluator: ALiBi with a scalar,
 * a bias table read past both ends, document ids, a mask that hides
 * everything. */
int test_mods_reference_user(void)
{
  static const double kq[RS] = {0.5, -1, 2, 0.25, 3, -0.5};
  static const float bias[5] = {0.5f, -2.f, 1.f, 0.75f, -0.25f};
  static const int32_t doc[RS] = {0, 0, 1, 1, 1, 2};
  ref_case c;
  fj_mods m;
  user u = {bias, 0.5f};
  fj_mod_param prm[2] = {{"slope", FJ_MOD_F32, 0, {0}, NULL, 0.5}};
  ref_init(&c, RS, RS, kq);
  fj_mods_init(&m);
  m.score = "s - slope * (float)abs(q - kv)";
  m.params = prm;
  m.num_params = 1;
  c.p.mods = &m;
  CHECK_OK(NULL, fj_reference_fwd(&c.p, c.q, c.k, c.v, NULL, NULL, 0, RS, c.out, c.lse));
  CHECK(check_rows(&c, kq, keep_all, alibi, &u) == 0);
  prm[0] = (fj_mod_param){"table", FJ_MOD_F32, 1, {5}, bias, 0};
  m.score = "s + table(q - kv + 2)";
  CHECK_OK(NULL, fj_reference_fwd(&c.p, c.q, c.k, c.v, NULL, NULL, 0, RS, c.out, c.lse));
  CHECK(check_rows(&c, kq, keep_all, biased, &u) == 0);
  prm[0] = (fj_mod_param){"doc", FJ_MOD_I32, 1, {RS}, doc, 0};
  m.score = NULL;
  m.mask = "doc(q) == doc(kv)";
  CHECK_OK(NULL, fj_reference_fwd(&c.p, c.q, c.k, c.v, NULL, NULL, 0, RS, c.out, c.lse));
  CHECK(check_rows(&c, kq, keep_doc, plain, doc) == 0);
  m.mask = "false";
  CHECK_OK(NULL, fj_reference_fwd(&c.p, c.q, c.k, c.v, NULL, NULL, 0, RS, c.out, c.lse));
  CHECK(check_rows(&c, kq, keep_none, plain, NULL) == 0);
  CHECK(c.out[0] == 0.0 && isinf(c.lse[0]) && c.lse[0] < 0);
  /* The reference reads tensors from host memory: NULL data is refused. */
  prm[0].data = NULL;
  CHECK_ST(NULL, fj_reference_fwd(&c.p, c.q, c.k, c.v, NULL, NULL, 0, RS, c.out, c.lse),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "mods.params[0] (doc): a tensor's data is NULL");
  return 0;
}

/* ---- kernels ------------------------------------------------------------------------ */

/* The kernel fj_attention_plan picks for a problem with mods m, compiled:
 * no spills, the user's text pasted after its #line. */
/* (4, 16, 4096, 128) bf16, causal bottom-right, with m: a score
 * expression and n parameters (the prefill shape the compile tests pick
 * kernels for). */
static void prefill_mods(fj_problem *p, fj_mods *m, const char *score,
                         const fj_mod_param *prm, int n)
{
  fj_problem_init(p, 4, 16, 16, 4096, 4096, 128, FJ_BF16, FJ_BHSD);
  p->causal = FJ_CAUSAL_BOTTOM_RIGHT;
  p->mods = m;
  fj_mods_init(m);
  m->score = score;
  m->params = prm;
  m->num_params = n;
}

/* text with each run of whitespace one space, as the kernel's comment
 * shows the user's expression. */
static const char *one_line(const char *text, char *buf, size_t size)
{
  size_t n = 0;
  for (; *text && n + 1 < size; text++)
    if (!strchr(" \t\n\r", *text))
      buf[n++] = *text;
    else if (n && buf[n - 1] != ' ')
      buf[n++] = ' ';
  buf[n] = '\0';
  return buf;
}

/* Spill bytes compile_pick lets pass: 0 but where a test says why. */
static int spill_slack;

static int compile_pick(fj_ctx *ctx, const fj_problem *p, fj_mma family,
                        fj_kernel **out)
{
  char line[FJ_MOD_EXPR_MAX + 1];
  fj_plan plan;
  fj_resources r;
  CHECK_OK(ctx, fj_attention_plan(ctx, p, &plan));
  CHECK(plan.variant.mma == family);
  CHECK_OK(ctx, fj_kernel_get(ctx, &plan.variant, out));
  fj_kernel_resources(*out, &r);
  const char *src = fj_kernel_source(*out, NULL);
  char name[160];
  fj_variant_name(&plan.variant, name, sizeof name);
  printf("%s: %d registers, %d/%d spill bytes\n", name, r.registers,
         r.spill_store_bytes, r.spill_load_bytes);
  CHECK(r.spill_store_bytes <= spill_slack && r.spill_load_bytes <= spill_slack);
  if (p->mods->score && p->mods->score[0]) {
    CHECK(strstr(src, "#line 1 \"score\"\n"));
    CHECK(strstr(src, one_line(p->mods->score, line, sizeof line)));
    CHECK(strstr(name, "_x"));
  }
  if (p->mods->softcap > 0)
    CHECK(strstr(src, "softcap * tanh(s / softcap)") && strstr(name, "_cap"));
  if (p->mods->window_left >= 0)
    CHECK(strstr(name, "_win"));
  return 0;
}

/* Both fast families compile every kind of modification without spills;
 * changed values (a scalar, a tensor's extents, the window's sizes, the
 * softcap) reuse the kernel -- but where extents decide whether a distance
 * table is proved inside (table_inside); a changed expression compiles
 * another. */
int test_mods_compile(void)
{
  static const char *const archs[] = {"sm_80", "sm_90a"};
  fj_mod_param prm[2] = {
      {"bias", FJ_MOD_F16, 2, {16, 8192}, NULL, 0},
      {"doc", FJ_MOD_I32, 1, {4096}, NULL, 0},
  };
  for (int a = 0; a < 2; a++) {
    fj_ctx *ctx = fjt_ctx(archs[a], NULL);
    CHECK(ctx);
    fj_problem p;
    fj_mods m;
    fj_kernel *k1, *k2;
    fj_problem_init(&p, 4, 16, 16, 4096, 4096, 128, FJ_BF16, FJ_BHSD);
    p.causal = FJ_CAUSAL_BOTTOM_RIGHT;
    p.mods = &m;
    fj_mma family = a ? FJ_MMA_WGMMA : FJ_MMA_SYNC;
    /* Window and softcap together. */
    fj_mods_init(&m);
    m.window_left = 1024;
    m.softcap = 30.f;
    CHECK(compile_pick(ctx, &p, family, &k1) == 0);
    fj_cache_stats before, after;
    fj_cache_stats_get(ctx, &before);
    m.window_left = 77;
    m.softcap = 50.f;
    CHECK(compile_pick(ctx, &p, family, &k2) == 0);
    fj_cache_stats_get(ctx, &after);
    CHECK(k2 == k1 && after.misses == before.misses);
    /* A bias table and document ids. */
    fj_mods_init(&m);
    m.score = "s + bias(h, q - kv + 4096)";
    m.mask = "doc(q) == doc(kv)";
    m.params = prm;
    m.num_params = 2;
    CHECK(compile_pick(ctx, &p, family, &k1) == 0);
    CHECK(strstr(fj_kernel_source(k1, NULL), "#line 1 \"mask\"\n(doc(q) == doc(kv))"));
    fj_cache_stats_get(ctx, &before);
    prm[0].extents[1] = 9000;
    CHECK(compile_pick(ctx, &p, family, &k2) == 0);
    fj_cache_stats_get(ctx, &after);
    CHECK(k2 == k1 && after.misses == before.misses);
    m.score = "s + bias(h, q - kv + 4095)";
    CHECK(compile_pick(ctx, &p, family, &k2) == 0);
    fj_cache_stats_get(ctx, &after);
    CHECK(k2 != k1 && after.misses == before.misses + 1);
    /* Extents decide one thing of the kernel: whether the table is proved
     * inside (fj_variant.table_inside, the wgmma pick's 128-key tiles
     * here; the mma family's bound takes a tile more, past this table). */
    fj_kernel *k3;
    prm[0].extents[1] = 100;
    CHECK(compile_pick(ctx, &p, family, &k3) == 0);
    fj_cache_stats_get(ctx, &before);
    CHECK((k3 != k2) == (a == 1) && before.misses == after.misses + (a == 1));
    prm[0].extents[1] = 8192;
    /* Parameter names the generated code also uses for its own (the
     * kernel's parameter block is p) are the user's inside the functions. */
    fj_mod_param own[2] = {{"p", FJ_MOD_F32, 0, {0}, NULL, 2}, {"blk", FJ_MOD_I32, 0, {0}, NULL, 3}};
    fj_mods_init(&m);
    m.score = "s * p + (float)blk";
    m.mask = "kv != blk";
    m.softcap = 20.f;
    m.params = own;
    m.num_params = 2;
    CHECK(compile_pick(ctx, &p, family, &k2) == 0);
    prm[0].extents[1] = 8192;
    fj_ctx_destroy(ctx);
  }
  return 0;
}

/* The dispatch cache keeps one variant per problem class: modifications
 * the heuristic tells apart (a left window edge, two tensor reads per
 * element, block sizes) must be different classes, so that a problem
 * planned after the others gets the variant a fresh context gives it. */
int test_mods_plan_cache(void)
{
  static _Alignas(16) int32_t arr[64];
  fj_mod_param doc = {"doc", FJ_MOD_I32, 1, {2048, 0, 0, 0}, arr, 0};
  fj_block_mask bm = {128, 128, 1, 1, 16, 16, arr, arr, NULL, NULL, NULL, NULL, NULL, NULL};
  enum { N = 8 };
  fj_mods m[N];
  for (int i = 0; i < N; i++)
    fj_mods_init(&m[i]);
  m[1].window_right = 0;
  m[2].window_left = 1024;
  m[3].softcap = 30.f;
  m[4].mask = "doc(q) == doc(kv)";
  m[5].mask = "doc(kv) == doc(kv + 1)";
  for (int i = 4; i < N; i++) {
    m[i].params = &doc;
    m[i].num_params = 1;
  }
  m[6].mask = m[7].mask = m[4].mask;
  m[6].block_mask = &bm;
  fj_block_mask bm64 = bm;
  bm64.block_kv = 64;
  bm64.kv_blocks = 32;
  m[7].block_mask = &bm64;
  fj_problem p[N];
  char want[N][160];
  for (int i = 0; i < N; i++) {
    fj_problem_init(&p[i], 2, 8, 8, 2048, 2048, 128, FJ_BF16, FJ_BSHD);
    p[i].causal = FJ_CAUSAL_TOP_LEFT;
    p[i].mods = i ? &m[i] : NULL;
    fj_ctx *fresh = fjt_ctx("sm_90a", NULL);
    fj_plan plan;
    CHECK(fresh);
    CHECK_OK(fresh, fj_attention_plan(fresh, &p[i], &plan));
    fj_variant_name(&plan.variant, want[i], sizeof want[i]);
    fj_ctx_destroy(fresh);
  }
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  for (int pass = 0; pass < 2; pass++)
    for (int j = 0; j < N; j++) {
      int i = pass ? N - 1 - j : j;
      fj_plan plan;
      char name[160];
      CHECK_OK(ctx, fj_attention_plan(ctx, &p[i], &plan));
      fj_variant_name(&plan.variant, name, sizeof name);
      if (strcmp(name, want[i])) {
        fprintf(stderr, "case %d: %s after the others, %s fresh\n", i, name,
                want[i]);
        return 1;
      }
    }
  fj_ctx_destroy(ctx);
  return 0;
}

/* A variant serves a problem whose modifications have its form: the same
 * expressions, parameters' names, types and ranks, and the same kinds on
 * (the values may differ).  With no parameters, a NULL array and an empty
 * one are the same form (the CLI's variant flags and its problem differed
 * so, and a softcap run of a given variant was refused).  A refusal names
 * what differs. */
int test_mods_variant_match(void)
{
  static _Alignas(16) char buf[64];
  fj_mod_param none[1];
  fj_mods pm, vm;
  fj_mods_init(&pm);
  pm.score = "s * 0.5f";
  pm.softcap = 30.f;
  pm.params = none;  /* num_params 0: the array is never read */
  vm = pm;
  vm.params = NULL;
  vm.softcap = 50.f;  /* a value, not the form */
  CHECK(fj__mods_form_diff(&vm, &pm) == NULL);
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  fj_problem p;
  fj_problem_init(&p, 1, 2, 2, 256, 256, 64, FJ_F16, FJ_BHSD);
  p.mods = &pm;
  fj_variant var;
  CHECK_OK(ctx, fj_attention_variant(ctx, &p, &var, NULL));
  var.mods = &vm;
  CHECK_ST(ctx, fj_attention_fwd_variant(ctx, &p, &var, buf, buf, buf, buf, NULL, NULL),
           FJ_ERR_COMPILE_ONLY);
  struct {
    const char *score;
    float softcap;
    int window_right;
    const char *differs;
  } cases[] = {
      {"s + 1.f", 30.f, -1, "they differ in the score expression"},
      {"s * 0.5f", 0.f, -1, "they differ in whether a softcap is on"},
      {"s * 0.5f", 30.f, 0, "they differ in whether a window is on"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    vm = pm;
    vm.score = cases[i].score;
    vm.softcap = cases[i].softcap;
    vm.window_right = cases[i].window_right;
    CHECK_ST(ctx, fj_attention_fwd_variant(ctx, &p, &var, buf, buf, buf, buf, NULL, NULL),
             FJ_ERR_INVALID_ARG);
    CHECK_MSG(ctx, "variant's modifications (on) are not the problem's (on)");
    CHECK_MSG(ctx, cases[i].differs);
  }
  float x[4] = {0};
  fj_mod_param a = {"x", FJ_MOD_F32, 1, {4, 0, 0, 0}, x, 0}, b = a;
  b.name = "y";
  vm = pm;
  vm.num_params = pm.num_params = 1;
  vm.params = &b;
  pm.params = &a;
  CHECK_ST(ctx, fj_attention_fwd_variant(ctx, &p, &var, buf, buf, buf, buf, NULL, NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "they differ in a parameter's name, type or rank");
  fj_ctx_destroy(ctx);
  return 0;
}

/* Decode shapes (the mma family's GQA packing and split-KV) take the
 * window and the softcap as well. */
int test_mods_compile_decode(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  fj_problem p;
  fj_mods m;
  fj_kernel *k;
  fj_problem_init(&p, 1, 32, 8, 1, 32768, 128, FJ_BF16, FJ_BHSD);
  p.causal = FJ_CAUSAL_BOTTOM_RIGHT;
  fj_mods_init(&m);
  m.window_left = 4096;
  m.softcap = 50.f;
  p.mods = &m;
  CHECK(compile_pick(ctx, &p, FJ_MMA_SYNC, &k) == 0);
  fj_ctx_destroy(ctx);
  return 0;
}

/* ---- attention sinks ---------------------------------------------------------------- */

enum { SH = 3, SS = 6, SD = 16 };

/* Three query heads over one KV head; Q, K and V of varied values. */
typedef struct sink_case {
  fj_problem p;
  uint16_t q[SH * SS * SD], k[SS * SD], v[SS * SD];
  double out[SH * SS * SD], lse[SH * SS];
} sink_case;

static void sink_init(sink_case *c)
{
  float f[SH * SS * SD];
  fj_problem_init(&c->p, 1, SH, 1, SS, SS, SD, FJ_F16, FJ_BHSD);
  for (int i = 0; i < SH * SS * SD; i++)
    f[i] = (float)((i * 37) % 23) / 11.f - 1.f;
  fj_convert(FJ_F16, c->q, FJ_F32, f, SH * SS * SD);
  for (int i = 0; i < SS * SD; i++)
    f[i] = (float)((i * 53) % 29) / 14.f - 1.f;
  fj_convert(FJ_F16, c->k, FJ_F32, f, SS * SD);
  for (int i = 0; i < SS * SD; i++)
    f[i] = (float)((i * 17) % 31) / 8.f - 2.f;
  fj_convert(FJ_F16, c->v, FJ_F32, f, SS * SD);
}

static int near(double got, double want)
{
  return got == want || fabs(got - want) <= 1e-9 * (1 + fabs(want));
}

/* with: the reference with sinks; base: without.  Each row against the
 * hand formula O_s = O e^L / (e^L + e^sink), L_s = log(e^L + e^sink); a row
 * that sees no key (L = -inf): O_s = 0, L_s = sink. */
static int check_sinks(const sink_case *with, const sink_case *base,
                       const float *sinks)
{
  for (int h = 0; h < SH; h++)
    for (int r = 0; r < SS; r++) {
      double L = base->lse[h * SS + r], sk = (double)sinks[h];
      double keep = isinf(L) ? 0.0 : exp(L) / (exp(L) + exp(sk));
      double Ls = isinf(L) ? sk : log(exp(L) + exp(sk));
      int bad = !near(with->lse[h * SS + r], Ls);
      for (int x = 0; x < SD; x++) {
        size_t at = (size_t)(h * SS + r) * SD + (size_t)x;
        bad |= !near(with->out[at], base->out[at] * keep);
      }
      if (bad) {
        fprintf(stderr, "head %d row %d: lse %.12g want %.12g, out[0] %.12g want %.12g\n",
                h, r, with->lse[h * SS + r], Ls, with->out[(h * SS + r) * SD],
                base->out[(h * SS + r) * SD] * keep);
        return 1;
      }
    }
  return 0;
}

/* The reference with sinks against the formula: per head, with the causal
 * mask, with a row that sees no key (O 0, LSE the sink, never NaN); a -inf
 * sink is none; a large one neither overflows nor gives NaN. */
int test_mods_reference_sinks(void)
{
  static sink_case base, with;
  static const float sinks[SH] = {0.5f, -3.f, 4.f};
  static const float none[SH] = {-INFINITY, -INFINITY, -INFINITY};
  static const float big[SH] = {700.f, 80.f, -700.f};
  fj_mods m;
  static const char *const masks[] = {NULL, "q != 2", "false"};
  for (int causal = 0; causal < 2; causal++)
    for (int k = 0; k < 3; k++) {
      sink_init(&base);
      sink_init(&with);
      base.p.causal = with.p.causal = causal ? FJ_CAUSAL_TOP_LEFT : FJ_CAUSAL_NONE;
      fj_mods_init(&m);
      m.mask = masks[k];
      base.p.mods = &m;
      CHECK_OK(NULL, fj_reference_fwd(&base.p, base.q, base.k, base.v, NULL, NULL, 0, SS, base.out, base.lse));
      fj_mods ms = m;
      ms.sinks = sinks;
      with.p.mods = &ms;
      CHECK_OK(NULL, fj_reference_fwd(&with.p, with.q, with.k, with.v, NULL, NULL, 0, SS, with.out, with.lse));
      if (check_sinks(&with, &base, sinks)) {
        fprintf(stderr, "causal %d mask %s\n", causal, masks[k] ? masks[k] : "none");
        return 1;
      }
      /* The masked row 2 (and every row under "false"): O 0, LSE the sink. */
      if (k) {
        for (int h = 0; h < SH; h++) {
          CHECK(with.lse[h * SS + 2] == (double)sinks[h]);
          for (int x = 0; x < SD; x++)
            CHECK(with.out[(h * SS + 2) * SD + x] == 0.0);
        }
      }
    }
  /* A -inf sink adds nothing: the same as no sinks, bit for bit. */
  sink_init(&base);
  sink_init(&with);
  CHECK_OK(NULL, fj_reference_fwd(&base.p, base.q, base.k, base.v, NULL, NULL, 0, SS, base.out, base.lse));
  fj_mods_init(&m);
  m.sinks = none;
  with.p.mods = &m;
  CHECK_OK(NULL, fj_reference_fwd(&with.p, with.q, with.k, with.v, NULL, NULL, 0, SS, with.out, with.lse));
  CHECK(memcmp(with.out, base.out, sizeof base.out) == 0);
  CHECK(memcmp(with.lse, base.lse, sizeof base.lse) == 0);
  /* Sinks of +-700: finite results (exp(700) alone would be 1e304). */
  m.sinks = big;
  CHECK_OK(NULL, fj_reference_fwd(&with.p, with.q, with.k, with.v, NULL, NULL, 0, SS, with.out, with.lse));
  for (int h = 0; h < SH; h++)
    for (int r = 0; r < SS; r++) {
      CHECK(isfinite(with.lse[h * SS + r]));
      CHECK(fabs(with.out[(h * SS + r) * SD]) <= fabs(base.out[(h * SS + r) * SD]) + 1e-12);
    }
  CHECK(with.lse[0] == 700.0 && fabs(with.out[0]) < 1e-290);
  CHECK(near(with.lse[2 * SS], base.lse[2 * SS]));  /* -700: nothing */
  return 0;
}

/* The kernels with sinks: an mma (sm_80) and a wgmma (sm_90a) "_sink"
 * variant and a split, packed decode one, no spills, the sink read in the
 * epilogue (not in a split's partial kernel, whose combine reads it); the
 * variant's name and kernel differ with and without sinks, and not with
 * other sink values or another array. */
int test_mods_compile_sinks(void)
{
  static const char *const archs[] = {"sm_80", "sm_90a"};
  static const float s1[16] = {0.5f}, s2[16] = {-1.f};
  for (int a = 0; a < 2; a++) {
    fj_ctx *ctx = fjt_ctx(archs[a], NULL);
    CHECK(ctx);
    fj_problem p;
    fj_mods m;
    fj_kernel *k1, *k2, *k0;
    fj_problem_init(&p, 4, 16, 16, 4096, 4096, 128, FJ_BF16, FJ_BHSD);
    p.causal = FJ_CAUSAL_BOTTOM_RIGHT;
    fj_mods_init(&m);
    m.sinks = s1;
    p.mods = &m;
    fj_mma family = a ? FJ_MMA_WGMMA : FJ_MMA_SYNC;
    CHECK(compile_pick(ctx, &p, family, &k1) == 0);
    CHECK(strstr(fj_kernel_name(k1), "_sink"));
    CHECK(strstr(fj_kernel_source(k1, NULL), "p.sinks[blk.h]"));
    fj_cache_stats before, after;
    fj_cache_stats_get(ctx, &before);
    m.sinks = s2;
    CHECK(compile_pick(ctx, &p, family, &k2) == 0);
    fj_cache_stats_get(ctx, &after);
    CHECK(k2 == k1 && after.misses == before.misses);
    /* Without sinks: another variant and kernel. */
    fj_plan with, without;
    CHECK_OK(ctx, fj_attention_plan(ctx, &p, &with));
    p.mods = NULL;
    CHECK_OK(ctx, fj_attention_plan(ctx, &p, &without));
    char n1[160], n0[160];
    fj_variant_name(&with.variant, n1, sizeof n1);
    fj_variant_name(&without.variant, n0, sizeof n0);
    CHECK(strstr(n1, "_sink") && !strstr(n0, "_sink"));
    CHECK_OK(ctx, fj_kernel_get(ctx, &without.variant, &k0));
    CHECK(k0 != k1 && !strstr(fj_kernel_source(k0, NULL), "sinks["));
    fj_ctx_destroy(ctx);
  }
  /* Decode, GQA 4:1 packed and split: each packed row's own head; the
   * partials leave the sink to the combine, which has its own. */
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  fj_problem p;
  fj_mods m;
  fj_kernel *k, *c;
  fj_problem_init(&p, 1, 32, 8, 1, 32768, 128, FJ_BF16, FJ_BHSD);
  p.causal = FJ_CAUSAL_BOTTOM_RIGHT;
  fj_mods_init(&m);
  m.sinks = s1;
  p.mods = &m;
  CHECK(compile_pick(ctx, &p, FJ_MMA_SYNC, &k) == 0);
  fj_plan plan;
  CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
  CHECK(plan.variant.pack_gqa && plan.variant.split_kv);
  CHECK(strstr(fj_kernel_name(k), "_gqa_split_sink"));
  CHECK(!strstr(fj_kernel_source(k, NULL), "sinks["));
  CHECK_OK(ctx, FJT_LOCKED(ctx, fj__combine_kernel(ctx, &plan.variant, plan.combine_cols, &c)));
  CHECK(strstr(fj_kernel_name(c), "_sink"));
  CHECK(strstr(fj_kernel_source(c, NULL), "p.sinks[h]"));
  /* The same decode without splits: the packed rows' heads. */
  p.splits = 1;
  CHECK(compile_pick(ctx, &p, FJ_MMA_SYNC, &k) == 0);
  CHECK(strstr(fj_kernel_name(k), "_gqa_sink"));
  CHECK(strstr(fj_kernel_source(k, NULL), "p.sinks[blk.h + (m0 + wr"));
  fj_ctx_destroy(ctx);
  return 0;
}

/* Checked mode: a kernel of its own ("_chk") whose tensor reads go
 * through the recording lambdas, on both fast families without spills;
 * nothing to check (no tensor) leaves the kernel as it was; the
 * environment variable turns it on for every problem. */
int test_mods_checked(void)
{
  static const char *const archs[] = {"sm_80", "sm_90a"};
  fj_mod_param prm[2] = {
      {"bias", FJ_MOD_F16, 2, {16, 8192}, NULL, 0},
      {"scale", FJ_MOD_F32, 0, {0}, NULL, 0.5},
  };
  for (int a = 0; a < 2; a++) {
    fj_ctx *ctx = fjt_ctx(archs[a], NULL);
    CHECK(ctx);
    fj_problem p;
    fj_mods m;
    fj_kernel *k;
    prefill_mods(&p, &m, "s * scale + bias(h, q - kv + 4096)", prm, 2);
    m.checked = 1;
    CHECK(compile_pick(ctx, &p, a ? FJ_MMA_WGMMA : FJ_MMA_SYNC, &k) == 0);
    const char *src = fj_kernel_source(k, NULL);
    CHECK(strstr(fj_kernel_name(k), "_chk"));
    CHECK(strstr(src, "fj::oob_record(fj_ma.fj_oob, 0, i0, i1, 0, 0)"));
    CHECK(strstr(src, "unsigned *fj_oob;"));
    /* A scalar alone has nothing to check. */
    m.score = "s * scale";
    m.num_params = 2;
    prm[0].rank = 0;
    prm[0].type = FJ_MOD_F32;
    CHECK(compile_pick(ctx, &p, a ? FJ_MMA_WGMMA : FJ_MMA_SYNC, &k) == 0);
    CHECK(!strstr(fj_kernel_name(k), "_chk") && !strstr(fj_kernel_source(k, NULL), "fj_oob"));
    prm[0] = (fj_mod_param){"bias", FJ_MOD_F16, 2, {16, 8192}, NULL, 0};
    m.checked = 2;
    CHECK_ST(ctx, fj_problem_check(ctx, &p), FJ_ERR_INVALID_ARG);
    CHECK_MSG(ctx, "mods.checked 2 is invalid: 0 (off) or 1 (on)");
    fj_ctx_destroy(ctx);
  }
  return 0;
}

/* FLASHJIT_CHECK_BOUNDS=1, read once at the library's first look (so set
 * before anything here, in this test's own process): checked on without
 * mods.checked. */
int test_mods_checked_env(void)
{
  fj_mod_param prm[1] = {{"bias", FJ_MOD_F16, 2, {16, 8192}, NULL, 0}};
  setenv("FLASHJIT_CHECK_BOUNDS", "1", 1);
  fj_ctx *ctx = fjt_ctx("sm_80", NULL);
  CHECK(ctx);
  fj_problem p;
  fj_mods m;
  fj_variant v;
  fj_problem_init(&p, 4, 16, 16, 4096, 4096, 128, FJ_BF16, FJ_BHSD);
  fj_mods_init(&m);
  m.score = "s + bias(h, q - kv + 4096)";
  m.params = prm;
  m.num_params = 1;
  p.mods = &m;
  CHECK_OK(ctx, fj_attention_variant(ctx, &p, &v, NULL));
  char name[200];
  fj_variant_name(&v, name, sizeof name);
  CHECK(strstr(name, "_chk"));
  fj_ctx_destroy(ctx);
  return 0;
}

const fjt_builtin_case fjt_builtin_cases[FJT_BUILTIN_CASES] = {
      {"alibi", {{"slopes", FJ_MOD_F32, 1, {16}, NULL, 0}}, 1},
      {"alibi-standard", {{"heads", FJ_MOD_I32, 0, {0}, NULL, 16}}, 1},
      {"relative-bias", {{"bias", FJ_MOD_F32, 2, {16, 8193}, NULL, 0},
                         {"max_distance", FJ_MOD_I32, 0, {0}, NULL, 4096}}, 2},
      {"t5", {{"bias", FJ_MOD_F32, 2, {16, 32}, NULL, 0}}, 1},
      {"documents", {{"doc", FJ_MOD_I32, 1, {4096}, NULL, 0}}, 1},
      {"prefix-lm", {{"prefix", FJ_MOD_I32, 1, {4}, NULL, 0}}, 1},
};

/* The relative table (issue 33, item 5): T5's bucketed bias is a subtree
 * of the query head and the distance alone, which the library evaluates
 * once a launch into a table at the end of the workspace
 * (templates/rel_table.cu) and the kernels read in its place: the
 * forward's on both families and the backward's, each with the table's
 * parameter after the user's; the table's own kernel compiles clean.
 * Checked mode, eight parameters and ALiBi take none. */
int test_mods_rel_table(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL), *ctx80 = fjt_ctx("sm_80", NULL);
  CHECK(ctx && ctx80);
  const fj_mod_builtin *t5 = fj_mod_builtin_find("t5");
  CHECK(t5 && t5->score);
  fj_mod_param prm[FJ_MOD_PARAMS_MAX] = {{"bias", FJ_MOD_F32, 2, {16, 32}, NULL, 0}};
  fj_problem p;
  fj_mods m;
  prefill_mods(&p, &m, t5->score, prm, 1);
  CHECK(fj__mods_rt_on(&m));
  /* 4096: a multiple of 256; keys a tile of 256 past (the mma family's) */
  size_t table = ((size_t)16 * (4096 + 4096 + 256 - 1) * 4 + 15) / 16 * 16;
  CHECK(fj__rt_bytes(&p) == table);
  fj_plan plan;
  size_t ws = 0;
  CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
  CHECK_OK(ctx, fj_attention_workspace_size(ctx, &p, &ws));
  CHECK(ws == plan.workspace_bytes && ws >= table && (ws - table) % 16 == 0);
  /* The forward on both families: the subtree is the table's read. */
  for (int a = 0; a < 2; a++) {
    fj_ctx *c = a ? ctx80 : ctx;
    fj_kernel *k;
    CHECK_OK(c, fj_attention_plan(c, &p, &plan));
    CHECK(plan.variant.mma == (a ? FJ_MMA_SYNC : FJ_MMA_WGMMA));
    /* The table's read counts as one at a distance: 128-key tiles at
     * head dim 128 on wgmma, as the relative bias's (not T5's 96). */
    CHECK(a || plan.variant.tile_n == 128);
    /* Every tile's distance lies in the table, but the forward keeps
     * its test (table_inside 0: faster on the H100); the backward below
     * takes the proof. */
    CHECK(plan.variant.table_inside == 0);
    CHECK_OK(c, fj_kernel_get(c, &plan.variant, &k));
    const char *src = fj_kernel_source(k, NULL);
    CHECK(strstr(src, "ModTensor_fj_rt fj_rt;") && strstr(src, "(s + fj_dg)"));
    CHECK(strstr(src, "fj_rt(h, fj::isub(((fj_p.seq_q + 255) / 256 * 256 - 1), fj::isub(q, kv)))"));
    fj_resources r;
    fj_kernel_resources(k, &r);
    CHECK(r.spill_store_bytes == 0 && r.spill_load_bytes == 0);
  }
  /* The table's kernel: the subtree, evaluated per head and distance;
   * the public door to it names the same. */
  fj_kernel *rk, *pk;
  CHECK_OK(ctx, FJT_LOCKED(ctx, fj__rt_kernel(ctx, &p, &rk)));
  CHECK_OK(ctx, fj_rel_table_kernel(ctx, &p, &pk));
  CHECK(!strcmp(fj_kernel_name(pk), fj_kernel_name(rk)));
  CHECK(fj_rel_table_kernel(ctx, &p, NULL) == FJ_ERR_INVALID_ARG);
  CHECK(strstr(fj_errmsg(ctx), "fj_rel_table_kernel") && strstr(fj_errmsg(ctx), "k"));
  /* FLASHJIT_REL_TABLE=0: none, under a form of its own (its kernels
   * never meet the table's in a cache). */
  uint64_t with = fj__mods_hash(&m);
  setenv("FLASHJIT_REL_TABLE", "0", 1);
  CHECK(!fj__mods_rt_on(&m) && fj__rt_bytes(&p) == 0 && fj__mods_hash(&m) != with);
  unsetenv("FLASHJIT_REL_TABLE");
  CHECK(fj__mods_rt_on(&m) && fj__mods_hash(&m) == with);
  const char *rsrc = fj_kernel_source(rk, NULL);
  CHECK(strstr(rsrc, "fj_rt_value(h, 0, (int)(i - ((p.seq_q + 255) / 256 * 256 - 1)), p, fj_ma)") && strstr(rsrc, "logf("));
  fj_resources rr;
  fj_kernel_resources(rk, &rr);
  CHECK(rr.spill_store_bytes == 0);
  /* The backward reads it too, its workspace holding it last. */
  fj_bwd_plan bp;
  fj_kernel *bk;
  CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &bp));
  CHECK(bp.workspace_bytes >= table && (bp.workspace_bytes - table) % 16 == 0);
  CHECK(bp.variant.table_inside == 1);
  CHECK_OK(ctx, fj_attention_bwd_kernel(ctx, &p, &bp, 1, &bk));
  CHECK(strstr(fj_kernel_source(bk, NULL), "ModTensor_fj_rt fj_rt;"));
  /* None in checked mode, with eight parameters, or for ALiBi. */
  m.checked = 1;
  CHECK(!fj__mods_rt_on(&m) && fj__rt_bytes(&p) == 0);
  m.checked = 0;
  for (int i = 1; i < FJ_MOD_PARAMS_MAX; i++) {
    static const char *const names[] = {"", "u1", "u2", "u3", "u4", "u5", "u6", "u7"};
    prm[i] = (fj_mod_param){names[i], FJ_MOD_I32, 0, {0}, NULL, 1};
  }
  m.num_params = FJ_MOD_PARAMS_MAX;
  CHECK(!fj__mods_rt_on(&m));
  m.num_params = 1;
  prm[0] = (fj_mod_param){"slopes", FJ_MOD_F32, 1, {16}, NULL, 0};
  m.score = "s + slopes(h) * (float)(kv - q)";
  CHECK(!fj__mods_rt_on(&m));
  CHECK(fj_rel_table_kernel(ctx, &p, &pk) == FJ_ERR_NOT_FOUND);
  CHECK(strstr(fj_errmsg(ctx), "read no relative table"));
  /* A score without parameters takes one: the table, its kernels' only
   * parameter. */
  m.score = "s - logf(1.f + (float)abs(kv - q))";
  m.params = NULL;
  m.num_params = 0;
  CHECK(fj__mods_rt_on(&m));
  CHECK_OK(ctx80, fj_attention_plan(ctx80, &p, &plan));
  fj_kernel *k0;
  CHECK_OK(ctx80, fj_kernel_get(ctx80, &plan.variant, &k0));
  CHECK(strstr(fj_kernel_source(k0, NULL), "ModTensor_fj_rt fj_rt;\n};"));
  /* A mask alone takes none: no parameter after the user's, where checked
   * mode's record must follow them. */
  fj_mod_param doc = {"doc", FJ_MOD_I32, 1, {4096}, NULL, 0};
  fj_mods_init(&m);
  m.mask = "doc(q) == doc(kv)";
  m.params = &doc;
  m.num_params = 1;
  m.checked = 1;
  CHECK(!fj__mods_rt_on(&m));
  CHECK_OK(ctx80, fj_attention_plan(ctx80, &p, &plan));
  CHECK_OK(ctx80, fj_kernel_get(ctx80, &plan.variant, &k0));
  CHECK(!strstr(fj_kernel_source(k0, NULL), "fj_rt"));
  fj_ctx_destroy(ctx);
  fj_ctx_destroy(ctx80);
  return 0;
}

/* The named built-ins written as expressions (fj_mod_builtins) compile on
 * both fast families without spills, with the parameters they list. */
int test_mods_builtins_compile(void)
{
  static const char *const archs[] = {"sm_80", "sm_90a"};
  const fjt_builtin_case *cases = fjt_builtin_cases;
  int n;
  const fj_mod_builtin *all = fj_mod_builtins(&n);
  int expressions = 0;
  for (int i = 0; i < n; i++)
    expressions += !all[i].field;
  CHECK(expressions == FJT_BUILTIN_CASES);
  CHECK(!fj_mod_builtin_find("nothing") && fj_mod_builtin_find("softcap")->field);
  for (int a = 0; a < 2; a++) {
    fj_ctx *ctx = fjt_ctx(archs[a], NULL);
    CHECK(ctx);
    for (size_t i = 0; i < FJT_BUILTIN_CASES; i++) {
      const fj_mod_builtin *b = fj_mod_builtin_find(cases[i].name);
      CHECK(b && !b->field);
      fj_problem p;
      fj_mods m;
      fj_kernel *k;
      prefill_mods(&p, &m, b->score, cases[i].prm, cases[i].n);
      m.mask = b->mask;
      CHECK(compile_pick(ctx, &p, a ? FJ_MMA_WGMMA : FJ_MMA_SYNC, &k) == 0);
      CHECK(strstr(fj_kernel_source(k, NULL), b->score ? b->score : b->mask));
    }
    fj_ctx_destroy(ctx);
  }
  return 0;
}

/* The softcap's fixed shift (mods.c): for bfloat16 and caps up to 55 it
 * keeps every exponential of a score in [-cap, cap] within [e^-70, e^40];
 * f16, larger caps and no softcap keep the running max (0); the launch
 * block carries it.  The bfloat16
 * kernels of both families carry the fixed path, without spills; the f16
 * ones do not. */
int test_mods_softcap_shift(void)
{
  fj_mods m;
  fj_mods_init(&m);
  CHECK(fj__mods_softcap_shift(NULL, FJ_BF16) == 0.f);
  CHECK(fj__mods_softcap_shift(&m, FJ_BF16) == 0.f);
  for (int i = 1; i <= 220; i++) {
    m.softcap = 0.25f * (float)i;
    const float c = m.softcap, sh = fj__mods_softcap_shift(&m, FJ_BF16);
    if (!(sh > 0.f && sh <= c && -c - sh >= -70.001f && c - sh <= 40.001f)) {
      fprintf(stderr, "softcap %g: shift %g puts P in [e^%g, e^%g]\n",
              (double)c, (double)sh, (double)(-c - sh), (double)(c - sh));
      return 1;
    }
    CHECK(fj__mods_softcap_shift(&m, FJ_F16) == 0.f);
  }
  static const float over[] = {55.25f, 80.f, 1e30f};
  for (size_t i = 0; i < sizeof over / sizeof over[0]; i++) {
    m.softcap = over[i];
    CHECK(fj__mods_softcap_shift(&m, FJ_BF16) == 0.f);
  }
  /* The launch block carries it (fj__fill_params): 30 for a cap of 30 in
   * bfloat16, 0 in f16. */
  for (int dt = 0; dt < 2; dt++) {
    fj_problem p;
    fj_kparams kp;
    fj_problem_init(&p, 1, 2, 2, 64, 64, 64, dt ? FJ_BF16 : FJ_F16, FJ_BHSD);
    fj_mods_init(&m);
    m.softcap = 30.f;
    p.mods = &m;
    memset(&kp, 0xff, sizeof kp);
    fj__fill_params(&kp, &p, NULL, NULL, NULL, NULL, NULL);
    CHECK(kp.softcap == 30.f && kp.softcap_shift == (dt ? 30.f : 0.f));
  }
  static const char *const archs[] = {"sm_80", "sm_90a"};
  for (int a = 0; a < 2; a++) {
    fj_ctx *ctx = fjt_ctx(archs[a], NULL);
    CHECK(ctx);
    for (int dt = 0; dt < 2; dt++) {
      fj_problem p;
      fj_kernel *k;
      fj_problem_init(&p, 4, 16, 16, 4096, 4096, 128, dt ? FJ_BF16 : FJ_F16, FJ_BHSD);
      p.causal = FJ_CAUSAL_TOP_LEFT;
      fj_mods_init(&m);
      m.softcap = 30.f;
      p.mods = &m;
      CHECK(compile_pick(ctx, &p, a ? FJ_MMA_WGMMA : FJ_MMA_SYNC, &k) == 0);
      CHECK(!strstr(fj_kernel_source(k, NULL), "p.softcap_shift > 0.f") == !dt);
    }
    fj_ctx_destroy(ctx);
  }
  return 0;
}

/* Whether the line after fj_score_mod's #line 1 "score" in src is want,
 * the expression as its tree prints it (mods_kernel.c). */
static int score_line_is(const char *src, const char *score, const char *want)
{
  static const char *const def = "__device__ __forceinline__ float fj_score_mod(float s";
  const char *fn = strstr(src, def);  /* the declaration, then the definition */
  const char *line = fn && (fn = strstr(fn + 1, def)) ? strstr(fn, "#line 1 \"score\"\n") : NULL;
  CHECK(line && want);
  line += strlen("#line 1 \"score\"\n");
  if (strncmp(line, want, strlen(want)) != 0 || line[strlen(want)] != '\n') {
    fprintf(stderr, "%s: the kernel's line is \"%.*s\"\n", score, (int)strcspn(line, "\n"), line);
    return 1;
  }
  return 0;
}

/* fj_variant.table_inside: the plan proves a distance table's reads
 * within its extents from the problem's lengths (rounded up to the
 * tiles), heads and the indices' scalar values, and the kernel then has
 * no accessor path in its score step; a table one element short, a head
 * short, an index that reads a tensor, checked mode, a length whose last
 * tile reaches past the table: no proof.  A variant that claims it for a
 * problem the proof fails is refused at launch, naming the rule. */
int test_mods_table_inside(void)
{
  static const struct {
    const char *score;
    int64_t e0, e1;  /* bias's extents */
    int seq, offv;   /* both lengths; off's value */
    int checked, want;
  } cases[] = {
      {"s + bias(h, q - kv + 4096)", 16, 8192, 4096, 0, 0, 1},
      {"s + bias(h, q - kv + 4096)", 16, 8191, 4096, 0, 0, 0},
      {"s + bias(h, q - kv + 4096)", 15, 8192, 4096, 0, 0, 0},
      {"s + bias(h, q - kv + 4096)", 16, 8192, 4096, 0, 1, 0},
      /* 4000 keys reach 4095 in 128-key tiles: offset 4000 is short. */
      {"s + bias(h, q - kv + 4096)", 16, 8192, 4000, 0, 0, 1},
      {"s + bias(h, q - kv + 4000)", 16, 8001, 4000, 0, 0, 0},
      /* A scalar in X, and kv - q. */
      {"s + bias(h, q - kv + off)", 16, 8192, 4096, 4096, 0, 1},
      {"s + bias(h, q - kv + off)", 16, 8192, 4096, 4094, 0, 0},
      {"s + bias(h / 2, kv - q + 4095)", 8, 8192, 4096, 0, 0, 1},
      /* An index that reads a tensor: its value is on the device. */
      {"s + bias(h, q - kv + (int)tab(h))", 16, 8192, 4096, 0, 0, 0},
  };
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fj_mod_param prm[3] = {{"bias", FJ_MOD_F32, 2, {cases[i].e0, cases[i].e1}, NULL, 0},
                           {"off", FJ_MOD_I32, 0, {0}, NULL, cases[i].offv},
                           {"tab", FJ_MOD_F32, 1, {16}, NULL, 0}};
    fj_problem p;
    fj_mods m;
    prefill_mods(&p, &m, cases[i].score, prm, 3);
    p.causal = FJ_CAUSAL_TOP_LEFT;
    p.seq_q = p.seq_kv = cases[i].seq;
    m.checked = cases[i].checked;
    fj_plan plan;
    CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
    char name[160];
    fj_variant_name(&plan.variant, name, sizeof name);
    if (plan.variant.table_inside != cases[i].want ||
        !strstr(name, "_tin") != !cases[i].want) {
      fprintf(stderr, "%s over [%lld, %lld], %d positions: table_inside %d (%s), want %d\n",
              cases[i].score, (long long)cases[i].e0, (long long)cases[i].e1, cases[i].seq,
              plan.variant.table_inside, name, cases[i].want);
      return 1;
    }
  }
  /* The kernel with the proof reads the table at its row pointer alone. */
  fj_mod_param prm[1] = {{"bias", FJ_MOD_F32, 2, {16, 8192}, NULL, 0}};
  fj_problem p;
  fj_mods m;
  fj_kernel *k;
  prefill_mods(&p, &m, "s + bias(h, q - kv + 4096)", prm, 1);
  p.causal = FJ_CAUSAL_TOP_LEFT;
  CHECK(compile_pick(ctx, &p, FJ_MMA_WGMMA, &k) == 0);
  const char *src = fj_kernel_source(k, NULL);
  CHECK(strstr(src, "Proved within the table on the host"));
  CHECK(!strstr(src, "if (__all_sync(0xffffffffu, dgin"));
  /* Claimed for a problem whose table is one element short: refused at
   * launch (before anything else of the launch is looked at). */
  fj_plan plan;
  CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
  CHECK(plan.variant.table_inside == 1);
  fj_mod_param shortp[1] = {{"bias", FJ_MOD_F32, 2, {16, 8191}, NULL, 0}};
  m.params = shortp;
  char dummy[16] __attribute__((aligned(16)));
  CHECK(fj_attention_fwd_variant(ctx, &p, &plan.variant, dummy, dummy, dummy, dummy, NULL,
                                 NULL) == FJ_ERR_INVALID_ARG);
  CHECK(strstr(fj_errmsg(ctx), "table_inside 1 does not hold for the problem"));
  /* The variant's own rule: 0 or 1, and only with a score expression. */
  fj_variant v = plan.variant;
  v.table_inside = 2;
  CHECK(fj_variant_check(ctx, &v) == FJ_ERR_INVALID_ARG);
  v.table_inside = 1;
  v.mods = NULL;
  CHECK(fj_variant_check(ctx, &v) == FJ_ERR_INVALID_ARG);
  CHECK(strstr(fj_errmsg(ctx), "table_inside 1 is invalid here"));
  fj_ctx_destroy(ctx);
  return 0;
}

/* A distance table (mods.lua's dg): the score expression's first read
 * T(A..., q - kv + X) (or kv - q, the difference possibly in parentheses)
 * becomes fj_dg in the kernel's printed expression, read per tile at a
 * row pointer (fj_dg_row) where the tile lies in the table and through
 * the call as its tree prints it (fj_dg_read, after a #line at the call's
 * line and column) elsewhere; other forms stay reads.  A call across a
 * line break is a distance read too (the kernel prints the tree, not the
 * text).  The planner knows the form (128-key wgmma tiles, not 96).  Both
 * families compile without spills. */
int test_mods_distance(void)
{
  static const struct {
    const char *score, *kernel;  /* kernel: fj_score_mod's line, as printed */
    int dg;                      /* read at a row pointer */
    const char *call;            /* the call fj_dg_read makes */
    int tile_n;                  /* the wgmma pick's key tile */
  } cases[] = {
      {"s + bias(h, q - kv + 4096)", "(s + fj_dg)", 1, "bias(h, fj::iadd(fj::isub(q, kv), 4096))", 128},
      {"s - 0.5f * bias(h / 2, (kv - q) - 7)", "(s - (0.5f * fj_dg))", 1,
       "bias(fj::idiv(h, 2), fj::isub(fj::isub(kv, q), 7))", 128},
      /* A parameter named like the row function's own arguments. */
      {"s + bias(h, q - kv) * hi", "(s + (fj_dg * hi))", 1, "bias(h, fj::isub(q, kv))", 128},
      {"s + bias(h, q - kv * 2)", "(s + bias(h, fj::isub(q, fj::imul(kv, 2))))", 0, NULL, 96},
      /* A distance inside X (ALiBi's float distance, not uniform): a
       * subtree of the distance alone, the relative table's read. */
      {"s + bias(h, q - kv + (int)(float)(kv - q))", "(s + fj_dg)", 1,
       "fj_rt(h, fj::isub(((fj_p.seq_q + 255) / 256 * 256 - 1), fj::isub(q, kv)))", 128},
      {"s + bias(h, q - kv +\n 1)", "(s + fj_dg)", 1, "bias(h, fj::iadd(fj::isub(q, kv), 1))", 128},
  };
  static const char *const archs[] = {"sm_80", "sm_90a"};
  const fj_mod_param prm[2] = {{"bias", FJ_MOD_F32, 2, {16, 8193}, NULL, 0},
                               {"hi", FJ_MOD_F32, 0, {0}, NULL, 0.5}};
  for (int a = 0; a < 2; a++) {
    fj_ctx *ctx = fjt_ctx(archs[a], NULL);
    CHECK(ctx);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      fj_problem p;
      fj_mods m;
      fj_kernel *k;
      prefill_mods(&p, &m, cases[i].score, prm, 2);
      CHECK(compile_pick(ctx, &p, a ? FJ_MMA_WGMMA : FJ_MMA_SYNC, &k) == 0);
      const char *src = fj_kernel_source(k, NULL);
      CHECK(score_line_is(src, cases[i].score, cases[i].kernel) == 0);
      CHECK(!strstr(src, "fj_dg_row(") == !cases[i].dg);
      if (cases[i].call) {
        /* The call as printed, at its column of line 1. */
        char at[160];
        snprintf(at, sizeof at, "#line 1 \"score\"\n%*s%s\n",
                 (int)(strstr(cases[i].score, "bias") - cases[i].score), "",
                 cases[i].call);
        if (!strstr(src, at)) {
          fprintf(stderr, "%s: no \"%s\" in the kernel\n", cases[i].score, at);
          return 1;
        }
      }
      if (a == 1) {
        fj_plan plan;
        CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
        CHECK(plan.variant.tile_n == cases[i].tile_n);
      }
    }
    if (a == 1) {
      /* Head dim 64, the forms whose 96- and 128-key kernels spill
       * (kv - q in f32, q - kv in bf16): 80 keys, without spills. */
      static const struct {
        const char *score;
        fj_mod_type t;
      } d64[] = {{"s + bias(h, kv - q + 64)", FJ_MOD_F32}, {"s + bias(h, q - kv + 4096)", FJ_MOD_BF16}};
      for (int i = 0; i < 2; i++) {
        fj_problem p;
        fj_mods m;
        fj_kernel *k;
        fj_mod_param one = {"bias", d64[i].t, 2, {16, 8193}, NULL, 0};
        prefill_mods(&p, &m, d64[i].score, &one, 1);
        p.head_dim = 64;
        p.causal = i == 0 ? FJ_CAUSAL_TOP_LEFT : FJ_CAUSAL_NONE;
        CHECK(compile_pick(ctx, &p, FJ_MMA_WGMMA, &k) == 0);
        CHECK(strstr(fj_kernel_source(k, NULL), "fj_dg_row("));
      }
    }
    fj_ctx_destroy(ctx);
  }
  return 0;
}

/* ALiBi's distance (mods.lua's kvq): (float)(kv - q) and (float)(q - kv)
 * print as fj_kvq and (0.f-fj_kvq) (+0 on the diagonal, as written) in
 * the kernel, with or without spaces and across lines; near misses print
 * as written.  Its product F * fj_kvq, where F is the product's left
 * operand (any subtree: a name, a call, a group, a literal, a cast) free of
 * q, kv and s and the product the expression's only use of the distance,
 * prints as fj_skvq (mods.lua's kvq_scale: F a row, fj_kvq_scale); a
 * factor that reads s, or two distances, stay products.  The kernels of
 * both families compile without spills. */
int test_mods_kvq(void)
{
  static const struct {
    const char *score, *kernel;  /* kernel: the line after #line 1 "score" */
    const char *factor;          /* F of fj_kvq_scale, or NULL */
  } cases[] = {
      {"s + slopes(h) * (float)(kv - q)", "(s + fj_skvq)", "slopes(h)"},
      {"s - (slopes(h) + 0.5f)*(float)(kv-q)", "(s - fj_skvq)", "(slopes(h) + 0.5f)"},
      {"s - slopes(h)*(float)( q-kv )+(float)(kv-q)",
       "((s - (slopes(h) * (0.f-fj_kvq))) + fj_kvq)", NULL},
      {"s * 2.f * (float)(kv - q)", "((s * 2.0f) * fj_kvq)", NULL},
      {"s + 1e-3f * (float)(kv - q)", "(s + fj_skvq)", "0.001f"},
      {"s + (float)h * (float)(kv - q)", "(s + fj_skvq)", "((float)h)"},
      {"s + slopes(h) * (float)(kv - q - 1)", "(s + (slopes(h) * ((float)fj::isub(fj::isub(kv, q), 1))))", NULL},
      {"s + slopes(h) * (float)(kv) - (float)(q)", "((s + (slopes(h) * ((float)kv))) - ((float)q))", NULL},
      {"s + slopes(h) * (float)(kv\n - q)", "(s + fj_skvq)", "slopes(h)"},
      /* Inside a call, and a distance on the product's left: no F. */
      /* a function of the distance alone: the relative table's read */
      {"s + expf((float)(kv - q))", "(s + fj_dg)", NULL},
      {"s + (float)(kv - q) * slopes(h)", "(s + (fj_kvq * slopes(h)))", NULL},
  };
  static const char *const archs[] = {"sm_80", "sm_90a"};
  fj_mod_param prm = {"slopes", FJ_MOD_F32, 1, {16}, NULL, 0};
  for (int a = 0; a < 2; a++) {
    fj_ctx *ctx = fjt_ctx(archs[a], NULL);
    CHECK(ctx);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      fj_problem p;
      fj_mods m;
      fj_kernel *k;
      prefill_mods(&p, &m, cases[i].score, &prm, 1);
      CHECK(compile_pick(ctx, &p, a ? FJ_MMA_WGMMA : FJ_MMA_SYNC, &k) == 0);
      const char *src = fj_kernel_source(k, NULL);
      CHECK(score_line_is(src, cases[i].score, cases[i].kernel) == 0);
      CHECK(!strstr(src, "float fj_kvq,") == !(strstr(cases[i].kernel, "fj_kvq") && !cases[i].factor));
      if (cases[i].factor) {
        char ret[96];
        snprintf(ret, sizeof ret, "return (float)(%s);", cases[i].factor);
        CHECK(strstr(src, "float fj_skvq,") && strstr(src, ret));
      } else {
        CHECK(!strstr(src, "fj_kvq_scale("));
      }
    }
    fj_ctx_destroy(ctx);
  }
  return 0;
}

/* Whether the kernel reads tensor name with the shared plain loads (a
 * read the tile's scores share), not __ldg per score (mods.lua's p.shared,
 * from the tree's per-score fact). */
static int reads_shared(const char *src, const char *name)
{
  char head[64];
  snprintf(head, sizeof head, "struct ModTensor_%s {", name);
  const char *at = strstr(src, head);
  const char *end = at ? strstr(at, "};") : NULL;
  const char *in = at ? strstr(at, "const bool in =") : NULL;
  return in && in < end;
}

/* Long expressions render and compile with no instruction budget of the
 * renderer in the way (mods.lua reads facts, not text): a T5-style
 * bucketed relative bias written inline (235 characters), and a
 * 1000-character expression with six tensor reads; both families (mma on
 * sm_80, wgmma on sm_90a), no spills.  The reads' loads follow the tree:
 * per score where the indices use kv, shared where they do not. */
int test_mods_long_exprs(void)
{
  static const char t5[] =
      "s + 0.5f * rel_bias(h, (kv - q) < 0 ? ((q - kv) < 8 ? (q - kv) : min(15, 8 + "
      "(int)(logf((float)(q - kv) / 8.f) / logf(16.f) * 8.f))) : 16 + ((kv - q) < 8 ? "
      "(kv - q) : min(15, 8 + (int)(logf((float)(kv - q) / 8.f) / logf(16.f) * 8.f))))";
  static char big[FJ_MOD_EXPR_MAX + 1];
  int n = snprintf(big, sizeof big,
                   "s + slopes(h) * (float)(kv - q) + bias(h, q - kv + 4096) + "
                   "rel_bias(h, min(31, abs(kv - q))) + w(kv) * g(h, q) + (float)idx(kv)");
  for (int k = 1; n < 990; k++)
    n += snprintf(big + n, sizeof big - (size_t)n, " + 0.0625f * (float)((q + kv + %d) & 7)", k);
  const fj_mod_param prm[6] = {
      {"slopes", FJ_MOD_F32, 1, {16}, NULL, 0},
      {"bias", FJ_MOD_F32, 2, {16, 8193}, NULL, 0},
      {"rel_bias", FJ_MOD_F32, 2, {16, 32}, NULL, 0},
      {"w", FJ_MOD_F16, 1, {4096}, NULL, 0},
      {"g", FJ_MOD_BF16, 2, {16, 4096}, NULL, 0},
      {"idx", FJ_MOD_I32, 1, {4096}, NULL, 0}};
  CHECK(strlen(t5) == 235 && n >= 990 && n <= FJ_MOD_EXPR_MAX);
  static const char *const archs[] = {"sm_80", "sm_90a"};
  for (int a = 0; a < 2; a++) {
    fj_ctx *ctx = fjt_ctx(archs[a], NULL);
    CHECK(ctx);
    for (int i = 0; i < 2; i++) {
      fj_problem p;
      fj_mods m;
      fj_kernel *k;
      prefill_mods(&p, &m, i ? big : t5, i ? prm : &prm[2], i ? 6 : 1);
      /* The 1000 characters on wgmma sit at its 168 registers: since int
       * subtraction wraps around (fj::isub, defined where C's overflows),
       * ptxas spills 8 bytes there (none with C's kv - q, which the
       * compiler may assume does not overflow). */
      spill_slack = a && i ? 8 : 0;
      int rc = compile_pick(ctx, &p, a ? FJ_MMA_WGMMA : FJ_MMA_SYNC, &k);
      spill_slack = 0;
      CHECK(rc == 0);
      const char *src = fj_kernel_source(k, NULL);
      CHECK(!reads_shared(src, "rel_bias"));
      if (i) {
        CHECK(reads_shared(src, "slopes") && reads_shared(src, "g"));
        CHECK(!reads_shared(src, "w") && !reads_shared(src, "idx"));
        CHECK(strstr(src, "fj_dg_row(") && strstr(src, "float fj_skvq,"));
      }
    }
    fj_ctx_destroy(ctx);
  }
  return 0;
}

/* Score expressions whose derivative in s is a long text (a clamp blended
 * with s: 140 bytes of CUDA; a sum of 500 s) plan on both fast families,
 * forward and backward: the renderer's bound on mods.lua's match of that
 * text counts the blanks the text has, not its length cubed (it refused
 * every derivative past about 115 bytes, so these 46-character
 * expressions could not run). */
int test_mods_score_derivative_text(void)
{
  static char sum[FJ_MOD_EXPR_MAX + 1];
  int n = snprintf(sum, sizeof sum, "s");
  while (n + 2 <= 1001)
    n += snprintf(sum + n, sizeof sum - (size_t)n, "+s");
  const char *const exprs[] = {
      "fminf(fmaxf(s, -10.0f), 10.0f) * 0.5f + s * 0.5f",
      "expf(-s*s/100.0f) * s + tanhf(s) * logf(1.0f + fabsf(s))", sum};
  static const char *const archs[] = {"sm_80", "sm_90a"};
  for (int a = 0; a < 2; a++) {
    fj_ctx *ctx = fjt_ctx(archs[a], NULL);
    CHECK(ctx);
    for (size_t i = 0; i < sizeof exprs / sizeof exprs[0]; i++) {
      fj_problem p;
      fj_mods m;
      fj_plan plan;
      fj_bwd_plan bplan;
      prefill_mods(&p, &m, exprs[i], NULL, 0);
      CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
      CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &bplan));
      p.seq_q = p.seq_kv = 512;  /* a short prefill: the mma family */
      CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
    }
    fj_ctx_destroy(ctx);
  }
  return 0;
}
