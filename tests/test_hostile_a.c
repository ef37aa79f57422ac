/*
 * test_hostile_a.c -- the C API against issue 35's classes 1, 3 and 6, as
 * table-driven corpora: every documented limit at the limit and one past
 * it (the planner at 2^30 included), expressions whose int operations C
 * leaves undefined, names the preprocessor would replace, values float32
 * cannot hold, and statuses that must tell the truth (context options, a
 * template that renders a NUL, a prewarm whose writes fail, a quoted cache
 * directory, a paged problem's refusal).  Each case runs in a child
 * process with a time limit, so that a hang or a crash counts as one
 * failed case.
 */
#include <dirent.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runner.h"

#define FJ_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---- children --------------------------------------------------------------------- */

typedef struct tally {
  int cases, wrong, crashes, hangs;
} tally;

/* Runs fn(arg) in a child with `seconds` to finish; counts the outcome. */
static void run_case(tally *t, const char *what, int (*fn)(const void *),
                     const void *arg, int seconds)
{
  fflush(stdout);
  fflush(stderr);
  t->cases++;
  pid_t pid = fork();
  if (pid < 0) {
    t->wrong++;
    return;
  }
  if (pid == 0) {
    alarm((unsigned)seconds);
    int rc = fn(arg);
    fflush(stdout);
    fflush(stderr);
    _exit(rc ? 1 : 0);
  }
  int ws = 0;
  while (waitpid(pid, &ws, 0) < 0 && errno == EINTR)
    ;
  if (WIFSIGNALED(ws) && WTERMSIG(ws) == SIGALRM) {
    t->hangs++;
    fprintf(stderr, "  %s: did not finish within %d s\n", what, seconds);
  } else if (WIFSIGNALED(ws)) {
    t->crashes++;
    fprintf(stderr, "  %s: CRASHED (signal %d)\n", what, WTERMSIG(ws));
  } else if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
    t->wrong++;
  }
}

static int tally_ok(const tally *t, const char *corpus)
{
  printf("%s: %d cases: wrong=%d crashes=%d hangs=%d\n", corpus, t->cases,
         t->wrong, t->crashes, t->hangs);
  return t->wrong || t->crashes || t->hangs ? 1 : 0;
}

/* A status and a message: FJ_OK, or the status with text in the message
 * (one line). */
static int outcome_is(fj_ctx *ctx, const char *what, fj_status got,
                      fj_status want, const char *text)
{
  const char *msg = fj_errmsg(ctx);
  if (got != want) {
    fprintf(stderr, "  %s: %s, want %s: %s\n", what, fj_status_str(got),
            fj_status_str(want), msg);
    return 1;
  }
  if (want != FJ_OK && (!strstr(msg, text) || strchr(msg, '\n'))) {
    fprintf(stderr, "  %s: message lacks \"%s\" (or is not one line): %s\n",
            what, text, msg);
    return 1;
  }
  return 0;
}

/* ---- problems and modifications ------------------------------------------------------ */

/* One problem: the sizes (0: 1, 1, heads_q, 64, seq_q, 64), optionally a
 * paged cache, a window, a softcap, a scale, expressions and one
 * parameter; planned on a compile-only sm_90a context. */
typedef struct pcase {
  const char *what;
  int batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, splits;
  int page_size, max_pages;  /* page_size 0: not paged */
  int win, wl, wr;           /* win: the window is set */
  float softcap, scale;
  const char *score, *mask;
  const char *pname;         /* NULL: no parameter */
  fj_mod_type ptype;
  int prank;
  int64_t ext[4];
  double pvalue;
  int nparams;               /* 0: pname's one; more: copies named p0, p1, ... */
  fj_status want;
  const char *text;
} pcase;

static const int32_t fake_table[4];
static const float fake_data[4];

static int fill_param(fj_mod_param *prm, const pcase *c, char names[][8])
{
  int n = c->nparams ? c->nparams : c->pname ? 1 : 0;
  for (int i = 0; i < n; i++) {
    memset(&prm[i], 0, sizeof prm[i]);
    snprintf(names[i], 8, "p%d", i % 10);
    prm[i].name = c->nparams ? names[i] : c->pname;
    prm[i].type = c->nparams ? FJ_MOD_F32 : c->ptype;
    prm[i].rank = c->nparams ? 0 : c->prank;
    memcpy(prm[i].extents, c->ext, sizeof c->ext);
    prm[i].data = prm[i].rank ? fake_data : NULL;
    prm[i].value = c->nparams ? 1.0 : c->pvalue;
  }
  return n;
}

static int plan_case(const void *arg)
{
  const pcase *c = arg;
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  if (!ctx)
    return 1;
  int hq = c->heads_q ? c->heads_q : 1, sq = c->seq_q ? c->seq_q : 64;
  fj_problem p;
  fj_problem_init(&p, c->batch ? c->batch : 1, hq, c->heads_kv ? c->heads_kv : hq,
                  sq, c->seq_kv ? c->seq_kv : sq, c->head_dim ? c->head_dim : 64,
                  FJ_F16, FJ_BHSD);
  p.splits = c->splits;
  if (c->scale != 0.f)
    p.scale = c->scale;
  if (c->page_size) {
    p.block_table = fake_table;
    p.page_size = c->page_size;
    p.max_pages = c->max_pages ? c->max_pages : 1;
    p.num_pages = p.max_pages;
    int64_t hk = p.heads_kv, d = p.head_dim;
    int64_t s[3] = {c->page_size * hk * d, d, hk * d};
    memcpy(p.k_stride, s, sizeof s);
    memcpy(p.v_stride, s, sizeof s);
  }
  fj_mods m;
  fj_mod_param prm[FJ_MOD_PARAMS_MAX + 2];
  char names[FJ_MOD_PARAMS_MAX + 2][8];
  fj_mods_init(&m);
  m.score = c->score;
  m.mask = c->mask;
  m.softcap = c->softcap;
  if (c->win) {
    m.window_left = c->wl;
    m.window_right = c->wr;
  }
  m.params = prm;
  m.num_params = fill_param(prm, c, names);
  if (c->score || c->mask || c->win || c->softcap != 0.f || m.num_params)
    p.mods = &m;
  fj_plan plan;
  fj_status st = fj_attention_plan(ctx, &p, &plan);
  int rc = outcome_is(ctx, c->what, st, c->want, c->text);
  fj_ctx_destroy(ctx);
  return rc;
}

#define OK FJ_OK, NULL
#define BAD(text) FJ_ERR_INVALID_ARG, text
#define P1 .pname = "x", .ptype = FJ_MOD_F32
#define T1 .pname = "t", .ptype = FJ_MOD_F32, .prank = 1

/* Every documented limit of a problem (flashjit.h: batch and heads at most
 * 65535, sequences 2^30, head dims to 256, splits FJ_SPLITS_MAX, pages
 * FJ_PAGE_SIZE_MAX, windows FJ_WINDOW_MAX, FJ_MOD_PARAMS_MAX parameters,
 * extents INT32_MAX) at the limit and one past it.  The planner used to
 * loop for ever at 2^30 (a shift past 31 bits). */
int test_hostile_a_limits(void)
{
  static const pcase cases[] = {
      {"batch 65535", .batch = 65535, .want = OK},
      {"batch 65536", .batch = 65536, .want = BAD("batch 65536 is invalid: must be in 1..65535")},
      {"heads_q 65535", .heads_q = 65535, .want = OK},
      {"heads_q 65536", .heads_q = 65536, .want = BAD("heads_q 65536 is invalid: must be in 1..65535")},
      {"heads_kv 1 of 65535", .heads_q = 65535, .heads_kv = 1, .want = OK},
      {"heads_kv past heads_q", .heads_q = 8, .heads_kv = 9, .want = BAD("heads_kv 9 is invalid: must be in 1..8")},
      {"seq_q 2^30", .seq_q = 1 << 30, .want = OK},
      {"seq_q 2^30 + 1", .seq_q = (1 << 30) + 1, .want = BAD("seq_q 1073741825 is invalid: must be in 1..1073741824")},
      {"seq_kv 2^30", .seq_q = 1, .seq_kv = 1 << 30, .want = OK},
      {"seq_kv 2^30 decode GQA", .heads_q = 32, .heads_kv = 8, .seq_q = 1, .seq_kv = 1 << 30, .want = OK},
      {"seq_kv 2^30 + 1", .seq_q = 1, .seq_kv = (1 << 30) + 1, .want = BAD("seq_kv 1073741825 is invalid: must be in 1..1073741824")},
      {"both 2^30", .seq_q = 1 << 30, .seq_kv = 1 << 30, .want = OK},
      {"seq_q INT_MAX", .seq_q = INT32_MAX, .want = BAD("seq_q 2147483647 is invalid")},
      {"seq_q 2^30 splits 256", .seq_q = 1, .seq_kv = 1 << 30, .splits = 256, .want = OK},
      {"splits 257", .splits = 257, .want = BAD("splits 257 is invalid")},
      {"splits -1", .splits = -1, .want = BAD("splits -1 is invalid")},
      {"head_dim 256", .head_dim = 256, .want = OK},
      {"head_dim 577", .head_dim = 577, .want = BAD("head_dim 577 is invalid: must be in 1..576")},
      {"head_dim 257", .head_dim = 257, .want = BAD("head_dim 257 is invalid: a multiple of 8 from 8 to 576")},
      {"page 4096", .seq_q = 1, .seq_kv = 4096, .page_size = 4096, .want = OK},
      {"page 4096 at 2^30 keys", .seq_q = 1, .seq_kv = 1 << 30, .page_size = 4096,
       .max_pages = 1 << 18, .want = OK},
      {"page 8192", .seq_q = 1, .seq_kv = 8192, .page_size = 8192,
       .want = BAD("page_size 8192 is invalid: a power of two in 1..4096")},
      {"page 1 at 2^30 keys", .seq_q = 1, .seq_kv = 1 << 30, .page_size = 1,
       .max_pages = 1 << 30, .want = OK},
      {"window 2^30", .win = 1, .wl = 1 << 30, .wr = 1 << 30, .want = OK},
      {"window 2^30 + 1", .win = 1, .wl = (1 << 30) + 1, .wr = 0,
       .want = BAD("mods.window_left 1073741825 is outside -1 (unbounded)..1073741824")},
      {"window right -2", .win = 1, .wl = 0, .wr = -2,
       .want = BAD("mods.window_right -2 is outside")},
      {"window at 2^30 keys", .seq_q = 1 << 30, .win = 1, .wl = 1 << 30, .wr = 0, .want = OK},
      {"8 params", .score = "s + p0 + p7", .nparams = 8, .want = OK},
      {"9 params", .score = "s", .nparams = 9, .want = BAD("mods.num_params 9 is outside 0..8")},
      {"extent INT32_MAX", .score = "s + t(0)", T1, .ext = {INT32_MAX}, .want = OK},
      {"extent INT32_MAX + 1", .score = "s + t(0)", T1, .ext = {(int64_t)INT32_MAX + 1},
       .want = BAD("extents[0] = 2147483648 is outside 1..2147483647")},
      {"extent 0", .score = "s + t(0)", T1, .ext = {0}, .want = BAD("extents[0] = 0 is outside")},
      {"name of 31", .score = "s + abcdefghijklmnopqrstuvwxyz01234",
       .pname = "abcdefghijklmnopqrstuvwxyz01234", .ptype = FJ_MOD_F32, .want = OK},
      {"name of 32", .score = "s",
       .pname = "abcdefghijklmnopqrstuvwxyz012345", .ptype = FJ_MOD_F32,
       .want = BAD("at most 31 characters")},
      {"scale FLT_MIN", .scale = FLT_MIN, .want = OK},
  };
  tally t = {0};
  for (size_t i = 0; i < FJ_ARRAY_LEN(cases); i++)
    run_case(&t, cases[i].what, plan_case, &cases[i], 60);
  return tally_ok(&t, "hostile_a_limits");
}

/* An expression of exactly n characters, and one of n + 1: "s + 0.f + ...". */
static int expr_length_case(const void *arg)
{
  int n = *(const int *)arg;
  char text[FJ_MOD_EXPR_MAX + 2];
  memset(text, ' ', (size_t)n);
  text[0] = 's';
  text[n] = '\0';
  pcase c = {"expression length", .score = text};
  c.want = n <= FJ_MOD_EXPR_MAX ? FJ_OK : FJ_ERR_INVALID_ARG;
  c.text = "mods.score is 1025 characters long; the limit is 1024";
  return plan_case(&c);
}

/* Options of a context at their limits: sm_count 1..1024, a cache_dir
 * of 4095 bytes (4096 refused); prepare's n of 65536 (65537 refused). */
static int ctx_limit_case(const void *arg)
{
  int which = *(const int *)arg;
  fj_ctx_opts o;
  fj_ctx_opts_init(&o);
  o.device = -1;
  o.arch = "sm_90a";
  char dir[4200];
  fj_ctx *ctx = NULL;
  fj_status st;
  if (which < 2) {
    o.sm_count = which ? 1025 : 1024;
    o.disk_cache = 0;
    st = fj_ctx_create(&ctx, &o);
    fj_ctx_destroy(ctx);
    return outcome_is(NULL, "sm_count", st, which ? FJ_ERR_INVALID_ARG : FJ_OK,
                      "sm_count 1025 is invalid");
  }
  if (which < 4) {
    size_t len = which == 2 ? 4095 : 4096;
    snprintf(dir, sizeof dir, "%s/", fjt_tmpdir());
    memset(dir + strlen(dir), 'd', len - strlen(dir));
    dir[len] = '\0';
    o.cache_dir = dir;
    st = fj_ctx_create(&ctx, &o);
    fj_ctx_destroy(ctx);
    return outcome_is(NULL, "cache_dir length", st,
                      which == 2 ? FJ_OK : FJ_ERR_INVALID_ARG,
                      "cache_dir is 4096 bytes long: at most 4095");
  }
  ctx = fjt_ctx("sm_90a", NULL);
  fj_variant v;
  fj_variant_default(&v, 64, FJ_F16, FJ_CAUSAL_NONE);
  st = fj_kernel_prepare(ctx, &v, which == 4 ? 65537 : (size_t)-1, NULL, NULL);
  int rc = outcome_is(ctx, "prepare n", st, FJ_ERR_INVALID_ARG, "65536");
  fj_ctx_destroy(ctx);
  return rc;
}

int test_hostile_a_limits_more(void)
{
  tally t = {0};
  static const int lens[] = {FJ_MOD_EXPR_MAX, FJ_MOD_EXPR_MAX + 1};
  for (int i = 0; i < 2; i++)
    run_case(&t, "expression length", expr_length_case, &lens[i], 60);
  static const int which[] = {0, 1, 2, 3, 4, 5};
  for (int i = 0; i < 6; i++)
    run_case(&t, "context limits", ctx_limit_case, &which[i], 60);
  return tally_ok(&t, "hostile_a_limits_more");
}

/* ---- expressions -------------------------------------------------------------------- */

/* Class 3: the int operations C leaves undefined are refused where their
 * operands are constants (they would otherwise be folded by NVRTC as it
 * likes), and names the preprocessor replaces, values float32 cannot
 * hold and tensors whose bytes overflow int64 are refused with the value
 * and the limit. */
int test_hostile_a_exprs(void)
{
  static const pcase cases[] = {
      {"kv / 0", .mask = "kv / 0 == 0", .want = BAD("'/' at column 4: an int divided by the constant 0")},
      {"kv % 0", .mask = "kv % 0 == 0", .want = BAD("'%' at column 4: an int divided by the constant 0")},
      {"kv / (1 - 1)", .mask = "kv / (1 - 1) == 0", .want = BAD("divided by the constant 0")},
      {"kv % (2 * 0)", .mask = "kv % (2 * 0) == 1", .want = BAD("divided by the constant 0")},
      {"q / -0", .mask = "q / -0 > 1", .want = BAD("divided by the constant 0")},
      {"kv << 32", .mask = "(kv << 32) == 0", .want = BAD("'<<' at column 5: a shift by 32; an int32 shifts by 0..31")},
      {"kv << -1", .mask = "(kv << -1) == 0", .want = BAD("a shift by -1")},
      {"kv >> 40", .mask = "(kv >> 40) == 0", .want = BAD("'>>' at column 5: a shift by 40")},
      {"kv >> (16 * 2)", .mask = "(kv >> (16 * 2)) == 0", .want = BAD("a shift by 32")},
      {"1 << 31", .mask = "(q & (1 << 31)) == 0", .want = OK},
      {"kv >> 31", .mask = "(kv >> 31) == 0", .want = OK},
      {"INT_MAX + 1", .mask = "2147483647 + 1 > 0", .want = BAD("the constant result 2147483648 is outside int32's range")},
      {"INT_MIN - 1", .mask = "-2147483647 - 2 < q", .want = BAD("the constant result -2147483649")},
      {"65536 * 65536", .mask = "65536 * 65536 > q", .want = BAD("the constant result 4294967296")},
      {"-INT_MIN", .mask = "-(-2147483647 - 1) > q", .want = BAD("the constant result 2147483648")},
      {"INT_MIN / -1", .mask = "(-2147483647 - 1) / -1 > q", .want = BAD("the constant result 2147483648")},
      {"INT_MIN fits", .mask = "-2147483647 - 1 < q", .want = OK},
      {"float division by 0.f", .score = "s / 0.f", .want = OK},
      {"kv / (q - q)", .mask = "kv / (q - q) == 0", .want = OK},
      {"q << kv", .mask = "(q << kv) != 0", .want = OK},
      {"param NULL", .score = "s + NULL", .pname = "NULL", .ptype = FJ_MOD_F32,
       .want = BAD("mods.params[0].name \"NULL\" is reserved: a macro of the C or CUDA headers")},
      {"param INFINITY", .score = "s", .pname = "INFINITY", .ptype = FJ_MOD_F32, .want = BAD("is reserved: a macro")},
      {"param NAN", .score = "s", .pname = "NAN", .ptype = FJ_MOD_F32, .want = BAD("is reserved: a macro")},
      {"param assert", .score = "s", .pname = "assert", .ptype = FJ_MOD_F32, .want = BAD("is reserved: a macro")},
      {"param INT_MAX", .score = "s", .pname = "INT_MAX", .ptype = FJ_MOD_I32, .want = BAD("is reserved: a macro")},
      {"param FLT_MAX", .score = "s", .pname = "FLT_MAX", .ptype = FJ_MOD_F32, .want = BAD("is reserved: a macro")},
      {"param M_PI", .score = "s", .pname = "M_PI", .ptype = FJ_MOD_F32, .want = BAD("is reserved: a macro")},
      {"param isnan", .score = "s", .pname = "isnan", .ptype = FJ_MOD_F32, .want = BAD("is reserved: a macro")},
      {"param nullptr", .score = "s", .pname = "nullptr", .ptype = FJ_MOD_F32, .want = BAD("is reserved")},
      {"param null", .score = "s + null", .pname = "null", .ptype = FJ_MOD_F32, .want = OK},
      {"f32 NaN", .score = "s + x", P1, .pvalue = NAN, .want = BAD("mods.params[0] (x): value nan is not a finite float32")},
      {"f32 inf", .score = "s + x", P1, .pvalue = INFINITY, .want = BAD("value inf is not a finite float32")},
      {"f32 -inf", .score = "s + x", P1, .pvalue = -INFINITY, .want = BAD("value -inf is not a finite float32")},
      {"f32 1e39", .score = "s + x", P1, .pvalue = 1e39, .want = BAD("value 1e+39 is not a finite float32")},
      {"f32 FLT_MAX", .score = "s + x", P1, .pvalue = FLT_MAX, .want = OK},
      /* A denormal keeps its meaning in the kernel; what float32 makes 0
       * does not. */
      {"f32 denormal", .score = "s + x", P1, .pvalue = 1e-40, .want = OK},
      {"f32 smallest denormal", .score = "s + x", P1, .pvalue = 0x1p-149, .want = OK},
      {"f32 1e-50", .score = "s + x", P1, .pvalue = 1e-50,
       .want = BAD("mods.params[0] (x): value 1e-50 would be 0 as a float32 (|value| at least 1.4013e-45")},
      {"f32 -2^-150", .score = "s + x", P1, .pvalue = -0x1p-150, .want = BAD("value -7.00649e-46 would be 0 as a float32")},
      {"f32 5e-324", .score = "s + x", P1, .pvalue = 5e-324, .want = BAD("would be 0 as a float32")},
      {"i32 NaN", .score = "s + (float)x", .pname = "x", .ptype = FJ_MOD_I32, .pvalue = NAN,
       .want = BAD("value nan is not an int32")},
      {"i32 2^31", .score = "s + (float)x", .pname = "x", .ptype = FJ_MOD_I32, .pvalue = 2147483648.0,
       .want = BAD("value 2.14748e+09 is not an int32")},
      {"extents overflow", .score = "s + t(0, 0, 0, 0)", .pname = "t", .ptype = FJ_MOD_F32, .prank = 4,
       .ext = {INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX},
       .want = BAD("extents [2147483647,2147483647,2147483647,2147483647] take more than 9223372036854775807 bytes")},
      {"extents overflow f16", .score = "s + t(0, 0, 0)", .pname = "t", .ptype = FJ_MOD_F16, .prank = 3,
       .ext = {INT32_MAX, INT32_MAX, 4}, .want = BAD("take more than 9223372036854775807 bytes")},
      {"extents fit", .score = "s + t(0, 0)", .pname = "t", .ptype = FJ_MOD_F32, .prank = 2,
       .ext = {INT32_MAX, 1 << 30}, .want = OK},
      {"softcap denormal", .softcap = 1e-40f, .want = BAD("mods.softcap 9.99995e-41 is invalid: a float32 denormal; a cap is 0 (none) or at least 1.17549e-38")},
      {"softcap FLT_MIN", .softcap = FLT_MIN, .want = OK},
      {"softcap NaN", .softcap = NAN, .want = BAD("mods.softcap nan is invalid")},
      {"softcap inf", .softcap = INFINITY, .want = BAD("mods.softcap inf is invalid")},
      {"scale denormal", .scale = 1e-40f, .want = BAD("scale 9.99995e-41 is a float32 denormal")},
      {"scale too large", .scale = 3e38f, .want = BAD("scale 3e+38 is too large: scale x log2(e) must be a finite float32")},
      {"scale 2.3e38", .scale = 2.3e38f, .want = OK},
      {"scale NaN", .scale = NAN, .want = BAD("scale nan is not finite")},
  };
  tally t = {0};
  for (size_t i = 0; i < FJ_ARRAY_LEN(cases); i++)
    run_case(&t, cases[i].what, plan_case, &cases[i], 60);
  return tally_ok(&t, "hostile_a_exprs");
}

/* The kernel's form of an expression: every int operation C leaves
 * undefined prints as the function that defines it (so that NVRTC has
 * nothing to fold as it likes), and the source compiles. */
int test_hostile_a_expr_kernel(void)
{
  fj_ctx *ctx = fjt_ctx("sm_80", NULL);
  CHECK(ctx);
  fj_problem p;
  fj_problem_init(&p, 1, 2, 2, 64, 64, 64, FJ_F16, FJ_BHSD);
  fj_mods m;
  fj_mods_init(&m);
  m.mask = "kv / (q + 1) != q % (kv + 1) && (q << (kv & 7)) >= (q >> 3) - kv * 2 "
           "&& abs(kv - q) < -kv + (int)(0.5f * (float)q) + 64";
  p.mods = &m;
  fj_plan plan;
  fj_kernel *k;
  CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
  CHECK_OK(ctx, fj_kernel_get(ctx, &plan.variant, &k));
  const char *src = fj_kernel_source(k, NULL);
  static const char *const forms[] = {
      "fj::idiv(kv, fj::iadd(q, 1))", "fj::imod(q, fj::iadd(kv, 1))",
      "fj::ishl(q, (kv & 7))", "fj::ishr(q, 3)", "fj::imul(kv, 2)",
      "fj::iabs(fj::isub(kv, q))", "fj::ineg(kv)", "__float2int_rz((0.5f * ((float)q)))",
      "__device__ __forceinline__ int idiv(int a, int b) { return b == 0 ? 0 : b == -1 ? ineg(a) : a / b; }",
  };
  for (size_t i = 0; i < FJ_ARRAY_LEN(forms); i++)
    if (!strstr(src, forms[i])) {
      fprintf(stderr, "the kernel lacks %s\n", forms[i]);
      return 1;
    }
  fj_resources r;
  fj_kernel_resources(k, &r);
  CHECK(r.cubin_bytes > 0);
  fj_ctx_destroy(ctx);
  return 0;
}

/* The same for the int arithmetic a family adds to an expression's: a
 * distance table's row (mods.cuh's fj_dg_row) takes the last index at the
 * tile's distance with the wrapping add of the expression's own + and -
 * (a shift near INT_MAX overflowed a plain int add), and tests the
 * offsets it adds to the pointer as 64-bit integers, unwrapped. */
int test_hostile_a_dg_kernel(void)
{
  static const struct {
    const char *score, *il;
  } cases[] = {
      {"s + bias(h, q - kv + shift)", "const int fj_il = fj::iadd(fj_d, fj::iadd(0, shift));"},
      {"s + bias(h, kv - q - shift)", "const int fj_il = fj::isub(fj::isub(0, shift), fj_d);"},
  };
  const fj_mod_param prm[2] = {{"bias", FJ_MOD_F32, 2, {2, 512}, fake_data, 0},
                               {"shift", FJ_MOD_I32, 0, {0}, NULL, 2147483647.0}};
  fj_ctx *ctx = fjt_ctx("sm_80", NULL);
  CHECK(ctx);
  for (size_t i = 0; i < FJ_ARRAY_LEN(cases); i++) {
    fj_problem p;
    fj_problem_init(&p, 1, 2, 2, 256, 256, 64, FJ_F16, FJ_BHSD);
    fj_mods m;
    fj_mods_init(&m);
    m.score = cases[i].score;
    m.params = prm;
    m.num_params = 2;
    p.mods = &m;
    fj_plan plan;
    fj_kernel *k;
    CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
    CHECK_OK(ctx, fj_kernel_get(ctx, &plan.variant, &k));
    const char *src = fj_kernel_source(k, NULL);
    const char *forms[] = {cases[i].il, "(long long)fj_il + fj_lo >= 0ll &&",
                           "(long long)fj_il + fj_hi < (long long)bias.e[1];"};
    for (size_t f = 0; f < FJ_ARRAY_LEN(forms); f++)
      if (!strstr(src, forms[f])) {
        fprintf(stderr, "%s: the kernel lacks %s\n", cases[i].score, forms[f]);
        return 1;
      }
  }
  fj_ctx_destroy(ctx);
  return 0;
}

/* ---- statuses ------------------------------------------------------------------------ */

static int opts_case(const void *arg)
{
  int which = *(const int *)arg;
  fj_ctx_opts o;
  fj_ctx_opts_init(&o);
  o.device = -1;
  o.arch = "sm_80";
  static const char *const texts[] = {
      "cache_dir \"\" is empty", "disk_cache -7 is invalid: 0 (memory only) or 1",
      "disk_cache 2 is invalid", "isolate_compile -1 is invalid",
      "isolate_compile 7 is invalid"};
  if (which == 0)
    o.cache_dir = "";
  else if (which == 1)
    o.disk_cache = -7;
  else if (which == 2)
    o.disk_cache = 2;
  else if (which == 3)
    o.isolate_compile = -1;
  else
    o.isolate_compile = 7;
  fj_ctx *ctx = NULL;
  fj_status st = fj_ctx_create(&ctx, &o);
  fj_ctx_destroy(ctx);
  return outcome_is(NULL, texts[which], st, FJ_ERR_INVALID_ARG, texts[which]);
}

/* Copies the source tree's templates into dir. */
static int copy_templates(const char *dir)
{
  char src[4200], from[4600], to[4600];
  snprintf(src, sizeof src, "%s/../../templates", fjt_data_dir());
  DIR *d = opendir(src);
  if (!d || mkdir(dir, 0700) != 0)
    return -1;
  int rc = 0;
  for (struct dirent *e; rc == 0 && (e = readdir(d)) != NULL;) {
    if (e->d_name[0] == '.')
      continue;
    snprintf(from, sizeof from, "%s/%s", src, e->d_name);
    snprintf(to, sizeof to, "%s/%s", dir, e->d_name);
    FILE *f = fopen(from, "rb");
    static char buf[1 << 20];
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f)
      fclose(f);
    rc = f ? fjt_write_file(to, buf, n) : -1;
  }
  closedir(d);
  return rc;
}

/* A template directory whose wgmma family renders a NUL byte first (the
 * rest as the built-in file): FJ_ERR_TEMPLATE, not an empty cubin. */
static int nul_template_case(const void *arg)
{
  (void)arg;
  char dir[4200], path[4300];
  snprintf(dir, sizeof dir, "%s/tpl", fjt_tmpdir());
  snprintf(path, sizeof path, "%s/attention_wgmma.cu", dir);
  static const char nul[] = "{{ \"\\0\" }}";
  static char text[1 << 20];
  memcpy(text, nul, sizeof nul - 1);
  FILE *f = copy_templates(dir) == 0 ? fopen(path, "rb") : NULL;
  size_t n = f ? fread(text + sizeof nul - 1, 1, sizeof text - sizeof nul, f) : 0;
  if (f)
    fclose(f);
  if (!n || fjt_write_file(path, text, n + sizeof nul - 1) != 0)
    return 1;
  setenv("FLASHJIT_TEMPLATE_DIR", dir, 1);
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  fj_variant v;
  fj_variant_default(&v, 64, FJ_F16, FJ_CAUSAL_NONE);
  v.mma = FJ_MMA_WGMMA;
  v.tile_m = 128;
  v.warps = 12;
  v.swizzle = FJ_SWIZZLE_XOR;
  fj_kernel *k;
  fj_status st = fj_kernel_get(ctx, &v, &k);
  int rc = outcome_is(ctx, "NUL template", st, FJ_ERR_TEMPLATE,
                      "template attention_wgmma.cu rendered a NUL byte at offset 0");
  fj_ctx_destroy(ctx);
  return rc;
}

/* A prewarm whose cache writes fail (a file size limit standing for a
 * full file system): FJ_ERR_IO with the count, not FJ_OK. */
static int prewarm_full_case(const void *arg)
{
  (void)arg;
  char dir[4200];
  snprintf(dir, sizeof dir, "%s/full", fjt_tmpdir());
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit r = {512, 512};
  setrlimit(RLIMIT_FSIZE, &r);
  fj_ctx *ctx = fjt_ctx("sm_80", dir);
  fj_variant v;
  fj_variant_default(&v, 64, FJ_F16, FJ_CAUSAL_NONE);
  fj_prewarm_report rep;
  fj_status st = fj_cache_prewarm(ctx, &v, 1, NULL, NULL, &rep);
  int rc = outcome_is(ctx, "prewarm, full", st, FJ_ERR_IO,
                      "could not be written to the disk cache");
  fj_ctx_destroy(ctx);
  return rc;
}

static void keep_log(void *user, fj_log_level level, const char *msg)
{
  (void)level;
  snprintf(user, 1024, "%s", msg);
}

/* A cache directory with a newline and a terminal escape, under a file
 * (so it cannot be created): the warning quotes it, one line. */
static int quoted_dir_case(const void *arg)
{
  (void)arg;
  char file[4200], dir[4300], log[1024] = "";
  snprintf(file, sizeof file, "%s/plain", fjt_tmpdir());
  if (fjt_write_file(file, "x", 1) != 0)
    return 1;
  snprintf(dir, sizeof dir, "%s/a\nb\033[31mc", file);
  fj_ctx_opts o;
  fj_ctx_opts_init(&o);
  o.device = -1;
  o.arch = "sm_80";
  o.cache_dir = dir;
  o.log = keep_log;
  o.log_user = log;
  fj_ctx *ctx = NULL;
  fj_status st = fj_ctx_create(&ctx, &o);
  fj_ctx_destroy(ctx);
  if (st != FJ_OK || !strstr(log, "/plain/a\\nb\\x1b[31mc\" cannot be created") ||
      strchr(log, '\n') || strchr(log, '\033')) {
    fprintf(stderr, "  quoted dir: %s: %s\n", fj_status_str(st), log);
    return 1;
  }
  return 0;
}

/* A paged problem on a target without mma.sync is refused as paged (it
 * is varlen too, which the message used to name). */
static int paged_case(const void *arg)
{
  (void)arg;
  fj_ctx *ctx = fjt_ctx("sm_75", NULL);
  fj_problem p;
  fj_problem_init(&p, 1, 1, 1, 1, 64, 64, FJ_F16, FJ_BHSD);
  p.block_table = fake_table;
  p.page_size = 16;
  p.max_pages = 4;
  p.num_pages = 4;
  int64_t s[3] = {16 * 64, 64, 64};
  memcpy(p.k_stride, s, sizeof s);
  memcpy(p.v_stride, s, sizeof s);
  fj_plan plan;
  fj_status st = fj_attention_plan(ctx, &p, &plan);
  int rc = outcome_is(ctx, "paged on sm_75", st, FJ_ERR_UNSUPPORTED,
                      "paged is implemented for mma mma only");
  if (rc == 0 && strstr(fj_errmsg(ctx), "varlen")) {
    fprintf(stderr, "  paged on sm_75 speaks of varlen: %s\n", fj_errmsg(ctx));
    rc = 1;
  }
  fj_ctx_destroy(ctx);
  return rc;
}

int test_hostile_a_statuses(void)
{
  tally t = {0};
  static const int which[] = {0, 1, 2, 3, 4};
  for (int i = 0; i < 5; i++)
    run_case(&t, "context options", opts_case, &which[i], 30);
  run_case(&t, "NUL template", nul_template_case, NULL, 120);
  run_case(&t, "prewarm, full", prewarm_full_case, NULL, 300);
  run_case(&t, "quoted dir", quoted_dir_case, NULL, 30);
  run_case(&t, "paged on sm_75", paged_case, NULL, 60);
  return tally_ok(&t, "hostile_a_statuses");
}
