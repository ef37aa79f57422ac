/*
 * test_expr_grad.c -- the derivative of score expressions (expr_grad.c)
 * without a GPU: the generated text parses back, and its value, through
 * the host evaluator, matches a central finite difference of the
 * expression at many scores, for every documented operator and function;
 * the texts of a few simple cases; the kernel's form with its
 * substitutions.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "expr.h"
#include "expr_grad.h"
#include "runner.h"

enum { S, B, H, HKV, Q, KV, SLOPE, SHIFT, BIAS, DOC, NNAMES };

static const fj_expr_name names[NNAMES] = {
  [S] = {"s", -1, 0},       [B] = {"b", -1, 1},      [H] = {"h", -1, 1},
  [HKV] = {"hkv", -1, 1},   [Q] = {"q", -1, 1},      [KV] = {"kv", -1, 1},
  [SLOPE] = {"slope", 0, 0}, [SHIFT] = {"shift", 0, 1},
  [BIAS] = {"bias", 2, 0},  [DOC] = {"doc", 1, 1},
};

/* bias(i, j) = 0.01 (10 i + j) - 0.3 within 8 x 8, doc(i) = i / 4 within
 * 0..63; 0 outside. */
static fj_expr_value read_tensor(void *user, int name, const int32_t *idx)
{
  (void)user;
  fj_expr_value v = {name == DOC, 0, 0.f};
  if (name == BIAS && idx[0] >= 0 && idx[0] < 8 && idx[1] >= 0 && idx[1] < 8)
    v.f = 0.01f * (float)(10 * idx[0] + idx[1]) - 0.3f;
  if (name == DOC && idx[0] >= 0 && idx[0] < 64)
    v.i = idx[0] / 4;
  return v;
}

static fj_expr *parse(const char *text)
{
  char err[512];
  fj_expr *e = fj__expr_parse(text, "score", names, NNAMES, err, sizeof err);
  if (!e)
    fprintf(stderr, "%s: %s\n", text, err);
  return e;
}

/* The derivative's text in the form that parses back (NULL: failed). */
static char *grad_text(const fj_expr *e)
{
  fj_expr_print o = {names, NULL, NULL, 0, 1};
  fj_buf b = {0};
  if (fj__expr_grad_cuda(e, S, &o, &b) || !b.data) {
    fj__buf_free(&b);
    return NULL;
  }
  return fj__buf_take(&b);
}

/* The float value of e at score s, the other variables from row (q, kv). */
static double at(const fj_expr *e, float s, int q, int kv)
{
  fj_expr_value vals[NNAMES] = {
    [S] = {0, 0, s},     [B] = {1, 1, 0.f},   [H] = {1, 3, 0.f},
    [HKV] = {1, 1, 0.f}, [Q] = {1, q, 0.f},   [KV] = {1, kv, 0.f},
    [SLOPE] = {0, 0, 0.25f}, [SHIFT] = {1, 2, 0.f}};
  fj_expr_env env = {vals, read_tensor, NULL};
  fj_expr_value v = fj__expr_eval(e, &env);
  return v.is_int ? (double)v.i : (double)v.f;
}

/* Compares the derivative d with finite differences of f at scores
 * across [-3, 3]: points where the left and right differences disagree (a
 * kink, a step, a branch switching) are passed over, but at least half must
 * be compared.  Returns the mismatches (printed), or -1 when too few points
 * were smooth. */
static int compare(const char *text, const fj_expr *f, const fj_expr *d, int q,
                   int kv)
{
  int bad = 0, used = 0, points = 0;
  for (double s0 = -3.05; s0 <= 3.0; s0 += 0.1375, points++) {
    /* The steps as the float scores they reach. */
    float s = (float)s0, step = 2e-3f * fmaxf(1.f, fabsf(s));
    float sr = s + step, sl = s - step;
    double hr = (double)sr - (double)s, hl = (double)s - (double)sl;
    double fr = at(f, sr, q, kv), fl = at(f, sl, q, kv), f0 = at(f, s, q, kv);
    double right = (fr - f0) / hr, left = (f0 - fl) / hl;
    double fd = (fr - fl) / (hr + hl);
    if (!isfinite(fd) || fabs(right - left) > 2e-2 * (1.0 + fabs(fd)))
      continue;
    used++;
    double g = at(d, s, q, kv);
    if (!(fabs(g - fd) <= 3e-3 * (1.0 + fabs(fd)))) {
      if (bad++ < 3)
        fprintf(stderr, "%s at s = %g (q %d, kv %d): derivative %.7g, finite "
                "difference %.7g\n", text, (double)s, q, kv, g, fd);
    }
  }
  return used * 2 < points ? -1 : bad;
}

/* One expression: its derivative parses back and matches the finite
 * differences at two (q, kv) pairs; 1 on failure. */
static int check_fd(const char *text)
{
  fj_expr *f = parse(text);
  char *dt = f ? grad_text(f) : NULL;
  fj_expr *d = dt ? parse(dt) : NULL;
  int r1 = d ? compare(text, f, d, 5, 2) : 1;
  int r2 = d ? compare(text, f, d, 2, 5) : 1;
  if (r1 < 0 || r2 < 0)
    fprintf(stderr, "%s: too few smooth points to compare\n", text);
  if (r1 || r2)
    fprintf(stderr, "  derivative: %s\n", dt ? dt : "(none)");
  fj__expr_free(f);
  fj__expr_free(d);
  free(dt);
  return r1 != 0 || r2 != 0;
}

int test_expr_grad_fd(void)
{
  static const char *const exprs[] = {
    "s", "-s", "s * s", "s * s * s - 2.0f * s", "s + (float)(kv - q)",
    "slope * (float)(kv - q) + s", "s * slope", "-(s * slope)", "s / slope",
    "30.0f * tanhf(s / 30.0f)", "2.0f * tanhf(s / 2.0f)", "tanhf(s)",
    "1.0f / s", "s / (1.0f + s * s)", "(s + 1.0f) / (s * s + 2.0f)",
    "expf(s * 0.5f)", "exp2f(s)", "logf(fabsf(s) + 1.0f)",
    "log2f(s * s + 1.0f)", "sqrtf(s * s + 2.0f)", "rsqrtf(s * s + 1.0f)",
    "sinf(s) * cosf(2.0f * s)", "cosf(s)", "fabsf(s)", "abs(s - 1.0f)",
    "erff(s)", "erff(s * 0.7f) + s", "fminf(s, 1.0f)", "fmaxf(s * 2.0f, s)",
    "min(s, 0.5f)", "max(s, -s)", "fminf(2.0f, s * s)",
    "powf(fabsf(s) + 1.0f, 1.5f)", "powf(2.0f, s)",
    "powf(s * s + 1.0f, s / 4.0f)", "powf(s * s + 1.0f, 3)",
    "q >= kv ? s : s * 0.5f", "s > 0.0f ? s : 0.1f * s",
    "q > kv && s > 0.0f ? s * s : -s", "q < kv ? 1.0f : s",
    "floorf(s) + s", "roundf(s * 4.0f) / 4.0f", "ceilf(s)", "truncf(s) * s",
    "(float)((int)s) + 2.0f * s", "s + bias(h, q - kv)",
    "s * bias(h, kv - q) + (float)doc(kv)", "(float)h * s / 3.0f",
    "h * s / 3", "(s + (float)h) / (float)(shift + 1)",
    "s - (float)(q - kv) * slope + bias(h % 8, abs(q - kv))",
    "s * s > 1.0f ? 2.0f * tanhf(s / 2.0f) : s",
    "(float)(int)(s * 3.0f) / 3.0f + s * s",
    "expf(-s * s) * sinf(3.0f * s) + logf(2.0f + sinf(s))",
    "(float)s", "s * (float)(q >= kv)",
  };
  int failed = 0;
  for (size_t i = 0; i < FJ_ARRAY_LEN(exprs); i++)
    failed += check_fd(exprs[i]);
  CHECK(failed == 0);
  return 0;
}

/* The comparison can fail: a wrong derivative (of s * s for s * s * s,
 * of tanh without its square) is caught. */
int test_expr_grad_fd_catches(void)
{
  const char *pairs[][2] = {{"s * s * s", "2.0f * s"},
                            {"tanhf(s)", "1.0f - tanhf(s)"},
                            {"exp2f(s)", "exp2f(s)"}};
  for (size_t i = 0; i < FJ_ARRAY_LEN(pairs); i++) {
    fj_expr *f = parse(pairs[i][0]), *d = parse(pairs[i][1]);
    CHECK(f && d);
    fprintf(stderr, "(expected mismatches follow)\n");
    int bad = compare(pairs[i][0], f, d, 5, 2);
    fj__expr_free(f);
    fj__expr_free(d);
    CHECK(bad > 0);
  }
  return 0;
}

/* Texts: zero terms left out, s's own derivative a plain 1. */
int test_expr_grad_text(void)
{
  static const char *const cases[][2] = {
    {"s", "1.0f"},
    {"s + bias(h, q - kv)", "1.0f"},
    {"s * 2.0f", "2.0f"},
    {"floorf(s)", "0.0f"},
    {"(float)(q - kv)", "0.0f"},
    {"(float)((int)s)", "0.0f"},
    {"h * s", "((float)h)"},
    {"s - slope", "1.0f"},
    {"slope - s", "(-1.0f)"},
    {"expf(s)", "expf(s)"},
    {"tanhf(s)", "(1.0f - (tanhf(s) * tanhf(s)))"},
    {"q >= kv ? s : 0.0f", "((q >= kv) ? 1.0f : 0.0f)"},
    {"1.0f / s", "((-((1.0f / s) * 1.0f)) / s)"},
  };
  for (size_t i = 0; i < FJ_ARRAY_LEN(cases); i++) {
    fj_expr *e = parse(cases[i][0]);
    CHECK(e);
    char *t = grad_text(e);
    fj__expr_free(e);
    if (!t || strcmp(t, cases[i][1]) != 0) {
      fprintf(stderr, "d/ds %s: %s, want %s\n", cases[i][0], t ? t : "(none)",
              cases[i][1]);
      free(t);
      return 1;
    }
    free(t);
  }
  return 0;
}

/* The kernel's form: the family's substitutions (ALiBi's distance as
 * fj_kvq) and int operations as mods.cuh's functions. */
int test_expr_grad_kernel_form(void)
{
  fj_expr *e = parse("s * (float)(kv - q) + s * (float)(h + 1) * s");
  CHECK(e);
  fj_expr_vars v = {B, H, HKV, Q, KV, S};
  fj_expr_print o = {names, &v, NULL, 0, 0};
  fj_buf b = {0};
  CHECK(fj__expr_grad_cuda(e, S, &o, &b) == 0 && b.data);
  int ok = strstr(b.data, "fj_kvq") && strstr(b.data, "fj::iadd(h, 1)") &&
           !strstr(b.data, "kv - q");
  if (!ok)
    fprintf(stderr, "kernel form: %s\n", b.data);
  fj__buf_free(&b);
  fj__expr_free(e);
  CHECK(ok);
  return 0;
}

/* The bias element a perturbation shifts (test_expr_grad_reads): its
 * indices and the shift; bias(i, j) is read_tensor's otherwise. */
typedef struct nudge {
  int32_t i, j;
  float by;
} nudge;

static fj_expr_value read_nudged(void *user, int name, const int32_t *idx)
{
  const nudge *n = user;
  fj_expr_value v = read_tensor(NULL, name, idx);
  if (name == BIAS && idx[0] == n->i && idx[1] == n->j)
    v.f += n->by;
  return v;
}

static double at_nudged(const fj_expr *e, float s, const nudge *n)
{
  fj_expr_value vals[NNAMES] = {
    [S] = {0, 0, s},     [B] = {1, 1, 0.f},   [H] = {1, 3, 0.f},
    [HKV] = {1, 1, 0.f}, [Q] = {1, 5, 0.f},   [KV] = {1, 2, 0.f},
    [SLOPE] = {0, 0, 0.25f}, [SHIFT] = {1, 2, 0.f}};
  fj_expr_env env = {vals, read_nudged, (void *)n};
  fj_expr_value v = fj__expr_eval(e, &env);
  return v.is_int ? (double)v.i : (double)v.f;
}

/* The int value of e's subtree at node k (an index of a read), at
 * at_nudged's variables. */
static int index_at(const fj_expr *e, int k)
{
  fj_expr_print o = {names, NULL, NULL, 0, 1};
  fj_buf b = {0};
  nudge none = {0, 0, 0.f};
  fj_expr *x = fj__expr_print_cuda(e, k, &o, &b) == 0 && b.data ? parse(b.data) : NULL;
  int v = x ? (int)at_nudged(x, 0.f, &none) : -1;
  fj__expr_free(x);
  fj__buf_free(&b);
  return v;
}

/* The derivative with respect to the element (i, j) of bias: the sum of
 * the derivatives with respect to each read that fetches it (at q 5, kv 2,
 * h 3), against a central difference that shifts that element alone. */
static int check_read_fd(const char *text, int32_t i, int32_t j)
{
  fj_expr *e = parse(text);
  int nodes[4], n = e ? fj__expr_reads_of(e, BIAS, nodes, 4) : 0;
  fj_expr *d[4] = {NULL, NULL, NULL, NULL};
  fj_expr_print o = {names, NULL, NULL, 0, 1};
  int bad = !e || n < 1 || n > 4, hits = 0;
  for (int r = 0; !bad && r < n; r++) {
    if (index_at(e, fj__expr_kid(e, nodes[r], 0)) != i ||
        index_at(e, fj__expr_kid(e, nodes[r], 1)) != j)
      continue;
    fj_buf b = {0};
    bad = fj__expr_grad_read_cuda(e, nodes[r], &o, &b) != 0 || !b.data ||
          !(d[r] = parse(b.data));
    fj__buf_free(&b);
    hits++;
  }
  bad |= hits == 0;
  for (double s0 = -2.5; !bad && s0 <= 2.5; s0 += 0.5) {
    const float step = 1e-3f;
    nudge up = {i, j, step}, down = {i, j, -step}, none = {i, j, 0.f};
    double fd = (at_nudged(e, (float)s0, &up) - at_nudged(e, (float)s0, &down)) /
                (2.0 * (double)step);
    double g = 0;
    for (int r = 0; r < n; r++)
      g += d[r] ? at_nudged(d[r], (float)s0, &none) : 0.0;
    if (!(fabs(g - fd) <= 3e-3 * (1.0 + fabs(fd)))) {
      fprintf(stderr, "d/d bias(%d, %d) of %s at s = %g: %.7g, finite difference "
              "%.7g\n", (int)i, (int)j, text, s0, g, fd);
      bad = 1;
    }
  }
  for (int r = 0; r < 4; r++)
    fj__expr_free(d[r]);
  fj__expr_free(e);
  return bad;
}

int test_expr_grad_reads(void)
{
  static const struct {
    const char *text;
    int32_t i, j;
  } cases[] = {
    {"s + bias(h, q - kv)", 3, 3},
    {"s * bias(h, q - kv)", 3, 3},
    {"s * bias(h, q - kv) + 2.0f * bias(h, kv - q + 3)", 3, 3},
    {"s * bias(h, q - kv) + 2.0f * bias(h, kv - q + 3)", 3, 0},
    {"tanhf(bias(h, q - kv) * s) + expf(bias(1, h))", 3, 3},
    {"tanhf(bias(h, q - kv) * s) + expf(bias(1, h))", 1, 3},
    {"q >= kv ? s / (1.0f + bias(h, q - kv) * bias(h, q - kv)) : s", 3, 3},
    {"powf(fabsf(s) + 1.0f, bias(h, q - kv))", 3, 3},
    {"fmaxf(s, bias(h, q - kv) * 10.0f)", 3, 3},
  };
  int failed = 0;
  for (size_t c = 0; c < FJ_ARRAY_LEN(cases); c++)
    failed += check_read_fd(cases[c].text, cases[c].i, cases[c].j);
  /* An int tensor's read has no derivative; a node that is no read is
   * refused. */
  fj_expr *e = parse("s + (float)doc(kv)");
  CHECK(e);
  int node;
  CHECK(fj__expr_reads_of(e, DOC, &node, 1) == 1);
  fj_expr_print o = {names, NULL, NULL, 0, 1};
  fj_buf b = {0};
  CHECK(fj__expr_grad_read_cuda(e, node, &o, &b) == 0 && b.data &&
        strcmp(b.data, "0.0f") == 0);
  fj__buf_free(&b);
  CHECK(fj__expr_grad_read_cuda(e, 0, &o, &b) == -1);
  fj__buf_free(&b);
  fj__expr_free(e);
  CHECK(failed == 0);
  return 0;
}
