/*
 * mods.c -- score and mask modifications: the checks of fj_mods (the
 * expressions through expr.c's parser, the parameters, the built-ins), the
 * form a variant takes from them and the launch arguments of their values.
 */
#include "mods.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mods_memo.h"
#include "util.h"

void fj_mods_init(fj_mods *m)
{
  if (!m)
    return;
  memset(m, 0, sizeof *m);
  m->window_left = m->window_right = -1;
}

static int has_text(const char *s)
{
  return s && s[0];
}

static int user_on(const fj_mods *m)
{
  return has_text(m->score) || has_text(m->mask) || m->num_params > 0;
}

/* FLASHJIT_CHECK_BOUNDS=1 in the environment, read once a process (by
 * whichever thread plans first). */
static int check_bounds_env;
static pthread_once_t check_bounds_once = PTHREAD_ONCE_INIT;

static void check_bounds_read(void)
{
  const char *e = getenv("FLASHJIT_CHECK_BOUNDS");
  check_bounds_env = e && strcmp(e, "1") == 0;
}

/* Checked mode asked for, by m or the environment, and a tensor
 * parameter for it to check. */
static int checked_on(const fj_mods *m)
{
  pthread_once(&check_bounds_once, check_bounds_read);
  if (!m->checked && !check_bounds_env)
    return 0;
  for (int i = 0; m->params && i < m->num_params && i < FJ_MOD_PARAMS_MAX; i++)
    if (m->params[i].rank > 0)
      return 1;
  return 0;
}

void fj__mods_info(const fj_mods *m, fj_mods_info *out)
{
  memset(out, 0, sizeof *out);
  out->reads = out->score_reads = out->distance_reads = -1;
  if (!m)
    return;
  out->window = m->window_left != -1 || m->window_right != -1;
  out->softcap = m->softcap > 0.f;
  out->user = user_on(m);
  out->blocks = m->block_mask != NULL;
  out->sinks = m->sinks != NULL;
  out->on = out->window || out->softcap || out->user || out->blocks ||
            out->sinks;
  out->checked = checked_on(m);
  out->block_q = out->blocks ? m->block_mask->block_q : 0;
  out->block_kv = out->blocks ? m->block_mask->block_kv : 0;
}

/*
 * A softcapped score lies in [-c, c] (tanh.approx's |y| <= 1), so the
 * softmax may take its exponentials against a fixed shift instead of the
 * running row max: no max to reduce, and O is never rescaled.  With shift
 * c - K, P = e^(s - shift) lies in [e^(-2c + K), e^K].  K = clamp(2c - 70,
 * 0, 40) keeps P within [e^-70, e^40] for every c <= 55: e^40 and a row
 * sum of 2^31 such terms stay far inside float's range, and e^-70 (4e-31)
 * times a value of 1e-6 is still a normal float in the product P V.  The
 * price: O's float accumulators hold sum |V| up to about 1e21 over a
 * row's keys at cap 55 (e^40 each), not 3e38 -- far above any real V.
 * Only where P is bfloat16 (float's exponent range); half's range (2^-24
 * to 65504, 28 units of e) holds no such span, so f16 kernels and caps
 * over 55 keep the running max.  A shift of 0 says so (every fixed shift
 * is positive: c for c <= 35, 70 - c above).
 */
float fj__mods_softcap_shift(const fj_mods *m, fj_dtype dtype)
{
  if (!m || !(m->softcap > 0.f) || dtype != FJ_BF16 || !(m->softcap <= 55.f))
    return 0.f;
  float k = 2.f * m->softcap - 70.f;
  return m->softcap - (k < 0.f ? 0.f : k);
}

/* Parses m's score (score 1) or mask expression and adds the reads of
 * tensor parameters it makes per element to *reads: the calls whose
 * indices use kv (name 4 of fj__mods_names); a read of q, b or h alone is
 * the same for a row's every key, and is hoisted.  *reads packs three
 * counts of 10 bits (a read takes at least three characters, t(...), so
 * two expressions of FJ_MOD_EXPR_MAX characters make at most 682): every
 * expression's reads (the lowest), the score's, and the score's reads at
 * a distance (fj__expr_distance_reads).  An absent expression passes and
 * reads nothing.  0 when it passes; -1 with the parser's message in err
 * where it is refused. */
static int parse_expr(const fj_mods *m, int score, int *reads, char *err,
                      size_t errsize)
{
  const char *text = score ? m->score : m->mask;
  if (!has_text(text))
    return 0;
  fj_expr_name names[FJ_MOD_NAMES_MAX];
  int n = fj__mods_names(m, score, names);
  fj_expr *e = fj__expr_parse(text, score ? "score" : "mask", names, n, err,
                              errsize);
  if (!e)
    return -1;
  *reads += fj__expr_reads_using(e, 4) * (score ? 1 << 10 | 1 : 1);
  if (score)
    *reads += fj__expr_distance_reads(e, 3, 4, 5) << 20;
  /* Bit 30: the score has a relative table's subtree (fj_expr_facts' rt). */
  fj_expr_vars v = {0, 1, 2, 3, 4, 5};
  fj_expr_facts f;
  if (score && fj__expr_facts(e, &v, &f) == 0 && f.rt >= 0)
    *reads |= 1 << 30;
  fj__expr_free(e);
  return 0;
}

/* A form this thread checked is remembered with its reads (mods_memo.h);
 * one it did not is parsed here (an expression refused counts none). */
static int packed_reads(const fj_mods *m)
{
  if (!m || (!m->params && !has_text(m->score)))
    return 0;
  int reads = 0;
  if (fj__mods_memo_find(m, &reads))
    return reads;
  char err[512];
  parse_expr(m, 1, &reads, err, sizeof err);
  parse_expr(m, 0, &reads, err, sizeof err);
  return reads;
}

static int rt_refused(void);

/* With a relative table (fj__mods_rt_on) the kernels' reads by key: the
 * table's at a distance in place of those of its subtree. */
static void rt_reads(const fj_mods *m, fj_mods_info *out)
{
  fj_expr_name names[FJ_MOD_NAMES_MAX];
  int n = fj__mods_names(m, 1, names);
  fj_expr *e = fj__expr_parse(m->score, "score", names, n, NULL, 0);
  fj_expr_vars v = {0, 1, 2, 3, 4, 5};
  fj_expr_facts f;
  if (e && fj__expr_facts(e, &v, &f) == 0 && f.rt >= 0) {
    int inside = fj__expr_reads_using_in(e, f.rt, 4);
    out->reads += 1 - inside;
    out->score_reads += 1 - inside;
    out->distance_reads = 1;
  }
  fj__expr_free(e);
}

void fj__mods_info_reads(const fj_mods *m, fj_mods_info *out)
{
  fj__mods_info(m, out);
  int reads = packed_reads(m);
  out->reads = reads & 0x3ff;
  out->score_reads = reads >> 10 & 0x3ff;
  out->distance_reads = reads >> 20 & 0x3ff;
  if (reads >> 30 & 1 && fj__mods_rt_on(m))
    rt_reads(m, out);
}

/* FLASHJIT_REL_TABLE=0 in the environment: no relative tables (for A/B
 * runs; the form's hash says so, so that kernels of either kind never
 * meet in a cache). */
static int rt_refused(void)
{
  const char *e = getenv("FLASHJIT_REL_TABLE");
  return e && strcmp(e, "0") == 0;
}

int fj__mods_rt_on(const fj_mods *m)
{
  fj_mods_info mi;
  fj__mods_info(m, &mi);
  if (!mi.user || !has_text(m->score) || mi.checked ||
      m->num_params >= FJ_MOD_PARAMS_MAX || rt_refused())
    return 0;
  return packed_reads(m) >> 30 & 1;
}

/* ---- built-ins ------------------------------------------------------------------ */

static const fj_mod_builtin builtins[] = {
    {"alibi", "s + slopes(h) * (float)(kv - q)", NULL, "slopes:f32[heads_q]", NULL,
     "ALiBi: a linear bias per query head; the standard slopes are "
     "2^(-8 (h + 1) / heads_q)"},
    {"alibi-standard", "s + exp2f(-8.f * (float)(h + 1) / (float)heads) * (float)(kv - q)",
     NULL, "heads:i32", NULL,
     "ALiBi with the standard slopes computed in the kernel (heads: heads_q)"},
    {"relative-bias", "s + bias(h, q - kv + max_distance)", NULL,
     "bias:f32[heads_q,2*max_distance+1], max_distance:i32", NULL,
     "a learned bias per query head and distance; distances past the table "
     "read 0"},
    {"t5",
     "s + bias(h, (kv - q > 0 ? 16 : 0) + (abs(kv - q) < 8 ? abs(kv - q) : "
     "min(15, 8 + (int)(logf((float)abs(kv - q) / 8.f) / logf(16.f) * 8.f))))",
     NULL, "bias:f32[heads_q,32]", NULL,
     "T5's bucketed relative position bias (bidirectional: 32 buckets, 8 "
     "exact distances a side, logarithmic to 128); the kernels read it from "
     "a table of every distance built once a launch"},
    {"documents", NULL, "doc(q) == doc(kv)", "doc:i32[seq_kv]", NULL,
     "document masking: a query sees the keys of its own document (ids per "
     "position; with fj_block_mask_build, only the blocks on the diagonal "
     "run)"},
    {"prefix-lm", NULL, "kv < prefix(b) || kv <= q", "prefix:i32[batch]", NULL,
     "prefix-LM: the first prefix(b) keys are seen by every query, the rest "
     "causally"},
    {"softcap", "softcap * tanhf(s / softcap)", NULL, "", "softcap",
     "logit soft-capping (Gemma 2, Grok), after the score expression; the "
     "kernels take tanh.approx.f32"},
    {"window", NULL, "kv >= q + off - window_left && kv <= q + off + window_right",
     "", "window_left/window_right",
     "sliding window around the causal diagonal (off: 0 top-left, seq_kv - "
     "seq_q bottom-right); -1 unbounded; tiles outside are never loaded"},
    {"causal", NULL, "kv <= q + off", "", "fj_problem.causal",
     "causal mask, top-left (off 0) or bottom-right (off seq_kv - seq_q)"},
    {"sinks", NULL, NULL, "", "sinks",
     "attention sinks: exp(sinks[h]) joins each row's softmax denominator "
     "with no value row"},
};

const fj_mod_builtin *fj_mod_builtins(int *count)
{
  if (count)
    *count = (int)FJ_ARRAY_LEN(builtins);
  return builtins;
}

const fj_mod_builtin *fj_mod_builtin_find(const char *name)
{
  for (size_t i = 0; name && i < FJ_ARRAY_LEN(builtins); i++)
    if (strcmp(builtins[i].name, name) == 0)
      return &builtins[i];
  return NULL;
}

/* ---- names ---------------------------------------------------------------------- */

static const char *type_name(fj_mod_type t)
{
  switch (t) {
  case FJ_MOD_F32: return "f32";
  case FJ_MOD_I32: return "i32";
  case FJ_MOD_F16: return "f16";
  case FJ_MOD_BF16: return "bf16";
  }
  return "?";
}

const char *fj__mods_type_name(fj_mod_type t)
{
  return type_name(t);
}

int fj__mods_first_param(int score)
{
  return score ? 6 : 5;
}

int fj__mods_names(const fj_mods *m, int score, fj_expr_name *names)
{
  static const char *const vars[] = {"b", "h", "hkv", "q", "kv"};
  int n = 0;
  for (size_t i = 0; i < FJ_ARRAY_LEN(vars); i++)
    names[n++] = (fj_expr_name){vars[i], -1, 1};
  if (score)
    names[n++] = (fj_expr_name){"s", -1, 0};
  for (int i = 0; m && i < m->num_params && i < FJ_MOD_PARAMS_MAX; i++) {
    const fj_mod_param *p = &m->params[i];
    names[n++] = (fj_expr_name){p->name, p->rank, p->type == FJ_MOD_I32};
  }
  return n;
}

/* Names a parameter may not take: the variables, the functions and
 * keywords of the expressions, C++'s keywords, and what the generated code
 * reserves (fj..., CUDA..., a leading underscore). */
static const char *reserved(const char *name)
{
  static const char *const vars[] = {"s", "b", "h", "hkv", "q", "kv"};
  /* Macros of the C and CUDA headers (NVRTC defines NULL itself): the
   * kernel declares each parameter under its name, which the
   * preprocessor would replace. */
  static const char *const macros[] = {
      "NULL", "INFINITY", "NAN", "HUGE_VAL", "HUGE_VALF", "HUGE_VALL",
      "EOF", "assert", "offsetof", "errno", "isnan", "isinf", "isfinite",
      "isnormal", "signbit", "fpclassify", "CHAR_BIT", "CHAR_MIN",
      "CHAR_MAX", "SCHAR_MIN", "SCHAR_MAX", "UCHAR_MAX", "SHRT_MIN",
      "SHRT_MAX", "USHRT_MAX", "INT_MIN", "INT_MAX", "UINT_MAX", "LONG_MIN",
      "LONG_MAX", "ULONG_MAX", "LLONG_MIN", "LLONG_MAX", "ULLONG_MAX",
      "FLT_MIN", "FLT_MAX", "FLT_EPSILON", "DBL_MIN", "DBL_MAX",
      "DBL_EPSILON", "SIZE_MAX", "INT32_MIN", "INT32_MAX", "UINT32_MAX",
      "INT64_MIN", "INT64_MAX", "UINT64_MAX", "M_PI", "M_E", "M_LN2",
      "M_SQRT2", "RAND_MAX", "EXIT_SUCCESS", "EXIT_FAILURE"};
  for (size_t i = 0; i < FJ_ARRAY_LEN(vars); i++)
    if (strcmp(name, vars[i]) == 0)
      return "a variable of the expressions";
  for (size_t i = 0; i < FJ_ARRAY_LEN(macros); i++)
    if (strcmp(name, macros[i]) == 0)
      return "a macro of the C or CUDA headers";
  const char *why = fj__expr_reserved(name);
  if (why)
    return why;
  if (!strncmp(name, "fj", 2) || !strncmp(name, "FJ", 2) ||
      !strncmp(name, "CUDA", 4) || !strncmp(name, "cuda", 4))
    return "a name of the generated code (fj..., FJ..., CUDA..., cuda...)";
  return NULL;
}

static int identifier(const char *s)
{
  if (!((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z')))
    return 0;
  for (const char *c = s; *c; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
          (*c >= '0' && *c <= '9') || *c == '_'))
      return 0;
  return 1;
}

/* ---- checks --------------------------------------------------------------------- */

static fj_status check_name(const fj_ctx *ctx, const fj_mods *m, int i)
{
  const char *name = m->params[i].name;
  if (!name)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG, "mods.params[%d].name is NULL", i);
  if (!name[0] || strlen(name) > FJ_MOD_NAME_MAX || !identifier(name))
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "mods.params[%d].name \"%.40s\" is not a name: a letter, "
                    "then letters, digits or '_', at most %d characters",
                    i, name, FJ_MOD_NAME_MAX);
  const char *why = reserved(name);
  if (why)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "mods.params[%d].name \"%s\" is reserved: %s", i, name,
                    why);
  for (int j = 0; j < i; j++)
    if (m->params[j].name && strcmp(m->params[j].name, name) == 0)
      return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                      "mods.params[%d].name \"%s\" is also params[%d]'s", i,
                      name, j);
  return FJ_OK;
}

static fj_status check_scalar(const fj_ctx *ctx, const fj_mod_param *p, int i)
{
  if (p->type != FJ_MOD_F32 && p->type != FJ_MOD_I32)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "mods.params[%d] (%s): a scalar's type is %s; f32 or i32",
                    i, p->name, type_name(p->type));
  if (p->type == FJ_MOD_I32 &&
      !(p->value >= INT32_MIN && p->value <= INT32_MAX && p->value == floor(p->value)))
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "mods.params[%d] (%s): value %g is not an int32", i,
                    p->name, p->value);
  if (p->type == FJ_MOD_F32 && !(fabs(p->value) <= (double)FLT_MAX))
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "mods.params[%d] (%s): value %g is not a finite float32 "
                    "(|value| at most %g)",
                    i, p->name, p->value, (double)FLT_MAX);
  /* A denormal keeps its meaning (the kernels are compiled without
   * flushing denormals, as the host's evaluator runs); a value float32
   * rounds to 0 would not. */
  if (p->type == FJ_MOD_F32 && p->value != 0 && (float)p->value == 0.f)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "mods.params[%d] (%s): value %g would be 0 as a float32 "
                    "(|value| at least %g, float32's smallest denormal, or 0)",
                    i, p->name, p->value, (double)FLT_TRUE_MIN);
  return FJ_OK;
}

typedef struct extents_buf {
  char text[96];
} extents_buf;

/* "[E0,E1,...]" of a tensor parameter. */
static extents_buf extents_text(const fj_mod_param *p)
{
  extents_buf b;
  size_t n = 0;
  b.text[n++] = '[';
  for (int d = 0; d < p->rank && d < 4; d++)
    n += (size_t)snprintf(b.text + n, sizeof b.text - n, "%s%lld", d ? "," : "",
                          (long long)p->extents[d]);
  snprintf(b.text + n, sizeof b.text - n, "]");
  return b;
}

static fj_status check_tensor(const fj_ctx *ctx, const fj_mod_param *p, int i)
{
  if (p->type < FJ_MOD_F32 || p->type > FJ_MOD_BF16)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "mods.params[%d] (%s): type %d is unknown: f32, i32, f16 "
                    "or bf16",
                    i, p->name, (int)p->type);
  for (int d = 0; d < p->rank; d++)
    if (p->extents[d] < 1 || p->extents[d] > INT32_MAX)
      return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                      "mods.params[%d] (%s): extents[%d] = %lld is outside "
                      "1..%d",
                      i, p->name, d, (long long)p->extents[d], INT32_MAX);
  /* The kernels index a tensor with signed 64-bit byte offsets: its bytes
   * must count in int64 (four extents of 2^31 - 1 would not). */
  int64_t esize = p->type == FJ_MOD_F32 || p->type == FJ_MOD_I32 ? 4 : 2;
  int64_t bytes = esize;
  for (int d = 0; d < p->rank; d++) {
    if (bytes > INT64_MAX / p->extents[d])
      return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                      "mods.params[%d] (%s): extents %s take more than %lld "
                      "bytes (a tensor's byte offsets are signed 64-bit)",
                      i, p->name, extents_text(p).text, (long long)INT64_MAX);
    bytes *= p->extents[d];
  }
  return FJ_OK;
}

fj_status fj__mods_check_data(const fj_ctx *ctx, const fj_mods *m)
{
  /* The sinks are float32s: a pointer that is not 4-byte aligned cannot
   * be one (what it points to, and that it has heads_q of them, cannot be
   * checked). */
  if (m && (uintptr_t)m->sinks % 4)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "mods.sinks %p is not 4-byte aligned: float32 [heads_q]",
                    (const void *)m->sinks);
  for (int i = 0; m && i < m->num_params; i++) {
    const fj_mod_param *p = &m->params[i];
    size_t align = p->type == FJ_MOD_F32 || p->type == FJ_MOD_I32 ? 4 : 2;
    if (p->rank == 0)
      continue;
    if (!p->data)
      return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                      "mods.params[%d] (%s): a tensor's data is NULL", i,
                      p->name);
    if ((uintptr_t)p->data % align)
      return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                      "mods.params[%d] (%s): data %p is not %zu-byte aligned",
                      i, p->name, p->data, align);
  }
  return FJ_OK;
}

/* The parameters: their count, then each one's name (skipped where
 * form_good says this thread found the form good before), rank and value,
 * in that order. */
static fj_status check_params(const fj_ctx *ctx, const fj_mods *m,
                              int form_good)
{
  if (m->num_params < 0 || m->num_params > FJ_MOD_PARAMS_MAX)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "mods.num_params %d is outside 0..%d", m->num_params,
                    FJ_MOD_PARAMS_MAX);
  if (m->num_params > 0 && !m->params)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "mods.params is NULL with num_params %d", m->num_params);
  for (int i = 0; i < m->num_params; i++) {
    const fj_mod_param *p = &m->params[i];
    fj_status st = form_good ? FJ_OK : check_name(ctx, m, i);
    if (st != FJ_OK)
      return st;
    if (p->rank < 0 || p->rank > 4)
      return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                      "mods.params[%d] (%s): rank %d is outside 0..4", i,
                      p->name, p->rank);
    st = p->rank == 0 ? check_scalar(ctx, p, i) : check_tensor(ctx, p, i);
    if (st != FJ_OK)
      return st;
  }
  return FJ_OK;
}

/* One expression, adding its per-element tensor reads to *reads. */
static fj_status check_expr(const fj_ctx *ctx, const fj_mods *m, int score,
                            int *reads)
{
  const char *text = score ? m->score : m->mask;
  const char *what = score ? "score" : "mask";
  if (!has_text(text))
    return FJ_OK;
  size_t len = strlen(text);
  if (len > FJ_MOD_EXPR_MAX)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "mods.%s is %zu characters long; the limit is %d", what,
                    len, FJ_MOD_EXPR_MAX);
  char err[512];
  if (parse_expr(m, score, reads, err, sizeof err))
    return fj__fail(ctx, FJ_ERR_INVALID_ARG, "mods.%s", err);
  return FJ_OK;
}

/* The parameters and expressions.  Their form -- names, types, ranks, the
 * texts -- is checked once per thread: a form found good is remembered
 * (mods_memo.h), and a call that repeats it checks only the values. */
static fj_status check_user(const fj_ctx *ctx, const fj_mods *m)
{
  int good = user_on(m) && fj__mods_memo_find(m, NULL), reads = 0;
  fj_status st = check_params(ctx, m, good);
  if (good || st != FJ_OK)
    return st;
  st = check_expr(ctx, m, 1, &reads);
  if (st == FJ_OK)
    st = check_expr(ctx, m, 0, &reads);
  if (st == FJ_OK && user_on(m))
    fj__mods_memo_add(m, reads);
  return st;
}

int fj__block_size_ok(int n)
{
  return n == 64 || n == 128 || n == 256;
}

/* A block mask on its own: its sizes and pointers (fj__mods_check_blocks
 * checks it against a problem). */
static fj_status check_block_mask(const fj_ctx *ctx, const fj_block_mask *bm)
{
  if (!fj__block_size_ok(bm->block_q) || !fj__block_size_ok(bm->block_kv))
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "mods.block_mask->block_%s %d is not a block size: 64, "
                    "128 or 256",
                    fj__block_size_ok(bm->block_q) ? "kv" : "q",
                    fj__block_size_ok(bm->block_q) ? bm->block_kv : bm->block_q);
  const int dims[4] = {bm->batch, bm->heads, bm->q_blocks, bm->kv_blocks};
  static const char *const names[4] = {"batch", "heads", "q_blocks", "kv_blocks"};
  for (int i = 0; i < 4; i++)
    if (dims[i] < 1)
      return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                      "mods.block_mask->%s %d is below 1", names[i], dims[i]);
  /* The kernels step from one batch index's lists to the next by heads x
   * q_blocks entries (the transposed lists': heads x kv_blocks), a 32-bit
   * stride (fj_kparams' bm_stride_b). */
  const int blocks = bm->q_blocks > bm->kv_blocks ? bm->q_blocks : bm->kv_blocks;
  const int64_t per_b = (int64_t)bm->heads * blocks;
  if (bm->batch > 1 && per_b > INT32_MAX)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "mods.block_mask->heads %d x %d blocks = %lld entries a "
                    "batch index: the kernels step at most %d (batch 1, one "
                    "mask for every batch index, takes any)",
                    bm->heads, blocks, (long long)per_b, INT32_MAX);
  return FJ_OK;
}

fj_status fj__mods_check_blocks(const fj_ctx *ctx, const fj_mods *m,
                                int batch, int heads_q, int seq_q, int seq_kv)
{
  if (!m || !m->block_mask)
    return FJ_OK;
  const fj_block_mask *bm = m->block_mask;
  if (bm->batch != 1 && bm->batch != batch)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "mods.block_mask->batch %d: 1 (one mask for every batch "
                    "index) or the problem's batch %d",
                    bm->batch, batch);
  if (bm->heads != 1 && bm->heads != heads_q)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "mods.block_mask->heads %d: 1 (one mask for every head) "
                    "or the problem's heads_q %d",
                    bm->heads, heads_q);
  const int qb = (seq_q + bm->block_q - 1) / bm->block_q;
  const int kb = (seq_kv + bm->block_kv - 1) / bm->block_kv;
  if (bm->q_blocks != qb || bm->kv_blocks != kb)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "mods.block_mask is %d x %d blocks of %d x %d; seq_q %d "
                    "and seq_kv %d need %d x %d",
                    bm->q_blocks, bm->kv_blocks, bm->block_q, bm->block_kv,
                    seq_q, seq_kv, qb, kb);
  return FJ_OK;
}

fj_status fj__mods_check_blocks_data(const fj_ctx *ctx, const fj_mods *m)
{
  if (!m || !m->block_mask)
    return FJ_OK;
  const fj_block_mask *bm = m->block_mask;
  if (!bm->kv_num || !bm->kv_indices)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "mods.block_mask->%s is NULL: the partial blocks' counts "
                    "and indices are required",
                    bm->kv_num ? "kv_indices" : "kv_num");
  /* Counts and indices go in pairs: the full lists, and each of the
   * transposed lists (the backward's, which it requires itself). */
  const void *arr[8] = {bm->kv_num,     bm->kv_indices, bm->full_num,
                        bm->full_indices, bm->q_num,    bm->q_indices,
                        bm->full_q_num, bm->full_q_indices};
  static const char *const names[8] = {"kv_num", "kv_indices", "full_num",
                                       "full_indices", "q_num", "q_indices",
                                       "full_q_num", "full_q_indices"};
  static const char *const what[4] = {"", "full blocks", "the transposed lists",
                                      "full blocks of the transposed lists"};
  for (int i = 2; i < 8; i += 2)
    if (!arr[i] != !arr[i + 1])
      return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                      "mods.block_mask->%s is NULL but %s is not: give both "
                      "(%s) or neither",
                      names[arr[i] ? i + 1 : i], names[arr[i] ? i : i + 1],
                      what[i / 2]);
  for (int i = 0; i < 8; i++)
    if ((uintptr_t)arr[i] % 4)
      return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                      "mods.block_mask->%s %p is not 4-byte aligned", names[i],
                      arr[i]);
  return FJ_OK;
}

static fj_status check_builtins(const fj_ctx *ctx, const fj_mods *m)
{
  const int side[2] = {m->window_left, m->window_right};
  for (int i = 0; i < 2; i++)
    if (side[i] < -1 || side[i] > FJ_WINDOW_MAX)
      return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                      "mods.window_%s %d is outside -1 (unbounded)..%d",
                      i ? "right" : "left", side[i], FJ_WINDOW_MAX);
  if (m->checked != 0 && m->checked != 1)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "mods.checked %d is invalid: 0 (off) or 1 (on)",
                    m->checked);
  if (!(m->softcap >= 0.f && m->softcap <= FLT_MAX))
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "mods.softcap %g is invalid: 0 (none) or a finite "
                    "positive cap",
                    (double)m->softcap);
  /* A denormal cap: s / softcap overflows where s is not tiny, and 0 / it
   * is fine, so scores become inf, NaN or the cap at random. */
  if (m->softcap > 0.f && m->softcap < FLT_MIN)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "mods.softcap %g is invalid: a float32 denormal; a cap is "
                    "0 (none) or at least %g",
                    (double)m->softcap, (double)FLT_MIN);
  return FJ_OK;
}

fj_status fj__mods_check(const fj_ctx *ctx, const fj_mods *m)
{
  if (!m)
    return FJ_OK;
  fj_status st = check_builtins(ctx, m);
  if (st == FJ_OK && m->block_mask)
    st = check_block_mask(ctx, m->block_mask);
  return st == FJ_OK ? check_user(ctx, m) : st;
}

int fj__mods_has_grad(const fj_mods *m, int i)
{
  return m && m->param_grads && i >= 0 && i < m->num_params &&
         m->param_grads[i] != NULL;
}

fj_status fj__mods_check_grads(const fj_ctx *ctx, const fj_mods *m,
                               const char *who)
{
  for (int i = 0; m && m->param_grads && i < m->num_params; i++) {
    const fj_mod_param *p = &m->params[i];
    if (!m->param_grads[i])
      continue;
    if (p->rank < 1 || p->type == FJ_MOD_I32)
      return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                      "%s: mods.param_grads[%d] is given for %s, %s: only "
                      "float tensors (f32, f16, bf16) have a gradient",
                      who, i, p->name ? p->name : "(null)",
                      p->rank < 1 ? "a scalar" : "an i32 tensor");
  }
  return FJ_OK;
}

fj_status fj_mods_check(const fj_mods *m)
{
  if (!m)
    return fj__null_arg(NULL, "fj_mods_check", "m");
  fj__clear_error(NULL);
  fj_status st = fj__mods_check(NULL, m);
  if (st == FJ_OK)
    st = fj__mods_check_blocks_data(NULL, m);
  return st == FJ_OK ? fj__mods_check_data(NULL, m) : st;
}

/* ---- the form ------------------------------------------------------------------- */

void fj__mods_param_list(const fj_mods *m, char *buf, size_t size)
{
  size_t used = 0;
  buf[0] = 0;
  for (int i = 0; m && i < m->num_params && used < size; i++) {
    const fj_mod_param *p = &m->params[i];
    int n = snprintf(buf + used, size - used, "%s%s:%s:%d", i ? ";" : "",
                     p->name, type_name(p->type), p->rank);
    used += n > 0 ? (size_t)n : 0;
  }
}

/* An expression's text, "" for none. */
static const char *text_of(const char *s)
{
  return has_text(s) ? s : "";
}

/* The form, piece by piece (each string with its NUL, so that pieces
 * cannot run into each other): what a kernel is specialised for.  Hashed
 * on every launch of a modified problem (the dispatch cache), so without
 * building a string. */
uint64_t fj__mods_hash(const fj_mods *m)
{
  fj_mods_info mi;
  fj__mods_info(m, &mi);
  if (!mi.on)
    return 0;
  const int flags[2] = {mi.window, mi.softcap};
  uint64_t h = fj__hash64(flags, sizeof flags);
  h = fj__hash64_seed(text_of(m->score), strlen(text_of(m->score)) + 1, h);
  h = fj__hash64_seed(text_of(m->mask), strlen(text_of(m->mask)) + 1, h);
  for (int i = 0; m->params && i < m->num_params && i < FJ_MOD_PARAMS_MAX; i++) {
    const fj_mod_param *p = &m->params[i];
    const int tr[2] = {(int)p->type, p->rank};
    const char *name = p->name ? p->name : "";
    h = fj__hash64_seed(name, strlen(name) + 1, h);
    h = fj__hash64_seed(tr, sizeof tr, h);
  }
  /* Sinks and block masks add a piece each when on (none when off, so
   * that the hashes -- and the "_x" names -- of mods without them are what
   * they were). */
  if (mi.sinks)
    h = fj__hash64_seed("sinks", 6, h);
  if (mi.blocks) {
    const int blocks[2] = {mi.block_q, mi.block_kv};
    h = fj__hash64_seed(blocks, sizeof blocks, h);
  }
  if (mi.checked)
    h = fj__hash64_seed("checked", 8, h);
  if (has_text(m->score) && rt_refused())
    h = fj__hash64_seed("no relative table", 18, h);
  return h ? h : 1;
}

const char *fj__mods_form_diff(const fj_mods *a, const fj_mods *b)
{
  if (a == b)
    return NULL;
  fj_mods_info ia, ib;
  fj__mods_info(a, &ia);
  fj__mods_info(b, &ib);
  if (!ia.on || !ib.on)
    return ia.on == ib.on ? NULL : "whether modifications are on";
  if (ia.window != ib.window)
    return "whether a window is on";
  if (ia.softcap != ib.softcap)
    return "whether a softcap is on";
  if (ia.block_q != ib.block_q || ia.block_kv != ib.block_kv)
    return "the block mask's block sizes";
  if (ia.checked != ib.checked)
    return "whether checked mode is on";
  if (ia.sinks != ib.sinks)
    return "whether sinks are on";
  if (strcmp(text_of(a->score), text_of(b->score)))
    return "the score expression";
  if (strcmp(text_of(a->mask), text_of(b->mask)))
    return "the mask expression";
  if (a->num_params != b->num_params)
    return "the number of parameters";
  /* The parameters' array is read only up to num_params: with none, a
   * NULL array and an empty one are the same form. */
  if (a->num_params > 0 && (!a->params || !b->params))
    return a->params == b->params ? NULL : "the parameters (one array is NULL)";
  for (int i = 0; i < a->num_params && i < FJ_MOD_PARAMS_MAX; i++) {
    const fj_mod_param *pa = &a->params[i], *pb = &b->params[i];
    if (pa->type != pb->type || pa->rank != pb->rank ||
        strcmp(pa->name ? pa->name : "", pb->name ? pb->name : ""))
      return "a parameter's name, type or rank";
  }
  return NULL;
}

/* A text into out (size bytes); -1 where it does not fit. */
static int copy_text(char *out, size_t size, const char *text)
{
  size_t n = text ? strlen(text) : 0;
  if (n >= size)
    return -1;
  memcpy(out, text ? text : "", n + 1);
  return 0;
}

int fj__mods_copy(fj_mods_copy *c, const fj_mods *m)
{
  if (m->num_params < 0 || m->num_params > FJ_MOD_PARAMS_MAX ||
      (m->num_params > 0 && !m->params) ||
      copy_text(c->score, sizeof c->score, m->score) ||
      copy_text(c->mask, sizeof c->mask, m->mask))
    return -1;
  memcpy(&c->m, m, sizeof *m);
  for (int i = 0; i < m->num_params; i++) {
    memcpy(&c->params[i], &m->params[i], sizeof c->params[i]);
    if (copy_text(c->names[i], sizeof c->names[i], m->params[i].name))
      return -1;
  }
  if (m->block_mask)
    memcpy(&c->block_mask, m->block_mask, sizeof c->block_mask);
  return 0;
}

/* Whether text is what copy holds (NULL as ""). */
static int same_text(const char *copy, const char *text)
{
  return !strcmp(copy, text ? text : "");
}

int fj__mods_copy_same(const fj_mods_copy *c, const fj_mods *m)
{
  if (memcmp(&c->m, m, sizeof *m) || !same_text(c->score, m->score) ||
      !same_text(c->mask, m->mask) ||
      (m->block_mask &&
       memcmp(&c->block_mask, m->block_mask, sizeof c->block_mask)))
    return 0;
  for (int i = 0; i < m->num_params; i++)
    if (memcmp(&c->params[i], &m->params[i], sizeof c->params[i]) ||
        !same_text(c->names[i], m->params[i].name))
      return 0;
  return 1;
}

/* ---- launch arguments ----------------------------------------------------------- */

size_t fj__mods_args(const fj_mods *m, uint64_t oob,
                     unsigned char out[FJ_MOD_ARGS_MAX])
{
  size_t at = 0;
  for (int i = 0; m && i < m->num_params && i < FJ_MOD_PARAMS_MAX; i++) {
    const fj_mod_param *p = &m->params[i];
    if (p->rank == 0) {
      memset(out + at, 0, 8);
      if (p->type == FJ_MOD_I32) {
        int32_t v = (int32_t)p->value;
        memcpy(out + at, &v, 4);
      } else {
        float v = (float)p->value;
        memcpy(out + at, &v, 4);
      }
      at += 8;
      continue;
    }
    uint64_t ptr = (uint64_t)(uintptr_t)p->data;
    int32_t ext[4] = {1, 1, 1, 1};
    for (int d = 0; d < p->rank; d++)
      ext[d] = (int32_t)p->extents[d];
    memcpy(out + at, &ptr, 8);
    memcpy(out + at + 8, ext, 16);
    at += 24;
  }
  if (oob) {
    memcpy(out + at, &oob, 8);
    at += 8;
  }
  return at;
}

void fj__mods_oob_message(const fj_mods *m, const uint32_t *rec, char *buf,
                          size_t size)
{
  int i = (int)rec[1];
  if (!m || i < 0 || i >= m->num_params || m->params[i].rank < 1) {
    snprintf(buf, size, "a tensor parameter was read out of range (record %u)",
             rec[1]);
    return;
  }
  const fj_mod_param *p = &m->params[i];
  char at[64] = "", ext[96] = "";
  size_t ua = 0, ue = 0;
  for (int d = 0; d < p->rank; d++) {
    ua += (size_t)snprintf(at + ua, sizeof at - ua, "%s%d", d ? ", " : "",
                           (int32_t)rec[2 + d]);
    ue += (size_t)snprintf(ext + ue, sizeof ext - ue, "%s%lld", d ? ", " : "",
                           (long long)p->extents[d]);
  }
  snprintf(buf, size,
           "mods.params[%d] (%s): read at (%s), outside its extents (%s); "
           "the read gave 0",
           i, p->name, at, ext);
}
