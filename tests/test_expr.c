/*
 * test_expr.c -- the expression language of score and mask modifications
 * (expr.c) without a GPU: every refusal with its message and column, the
 * limits on length and nesting, the types the checker gives, and what the
 * evaluator computes, tensor reads and short-circuits included.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "expr.h"
#include "runner.h"

/* The names a score expression of a problem with four parameters has. */
enum { S, B, H, HKV, Q, KV, SLOPE, SHIFT, BIAS, DOC, NNAMES };

static const fj_expr_name names[NNAMES] = {
  [S] = {"s", -1, 0},       [B] = {"b", -1, 1},      [H] = {"h", -1, 1},
  [HKV] = {"hkv", -1, 1},   [Q] = {"q", -1, 1},      [KV] = {"kv", -1, 1},
  [SLOPE] = {"slope", 0, 0}, [SHIFT] = {"shift", 0, 1},
  [BIAS] = {"bias", 2, 0},  [DOC] = {"doc", 1, 1},
};

/* 1 when text is refused with a one-line message containing want. */
static int refused(const char *text, const char *want)
{
  char err[512];
  fj_expr *e = fj__expr_parse(text, "score", names, NNAMES, err, sizeof err);
  if (e) {
    fprintf(stderr, "accepted: %s\n", text);
    fj__expr_free(e);
    return 0;
  }
  if (!strstr(err, want) || strchr(err, '\n')) {
    fprintf(stderr, "refusal of \"%s\"\n  is: %s\n  lacks: %s\n", text, err,
            want);
    return 0;
  }
  return 1;
}

#define REFUSED(text, want) CHECK(refused(text, want))

/* Tensor reads, recorded: bias(i, j) is 100 i + j within 8 x 8, doc(i) is
 * i / 4 within 0..63, 0 outside (as the library's callback would). */
typedef struct reads {
  int n;
  int name[8];
  int32_t idx[8][FJ_EXPR_RANK_MAX];
} reads;

static fj_expr_value read_tensor(void *user, int name, const int32_t *idx)
{
  reads *r = user;
  if (r->n < 8) {
    r->name[r->n] = name;
    memcpy(r->idx[r->n], idx, (name == BIAS ? 2 : 1) * sizeof *idx);
  }
  r->n++;
  fj_expr_value v = {name == DOC, 0, 0.0f};
  if (name == BIAS && idx[0] >= 0 && idx[0] < 8 && idx[1] >= 0 && idx[1] < 8)
    v.f = (float)(100 * idx[0] + idx[1]);
  if (name == DOC && idx[0] >= 0 && idx[0] < 64)
    v.i = idx[0] / 4;
  return v;
}

/* Parses and evaluates text with s 1.5, b 0, h 3, hkv 1, q 10, kv 4,
 * slope 0.25, shift -7; 0 on success (printed otherwise). */
static int run(const char *text, fj_expr_value *out, reads *r)
{
  static const fj_expr_value vals[NNAMES] = {
    [S] = {0, 0, 1.5f}, [B] = {1, 0, 0.0f},  [H] = {1, 3, 0.0f},
    [HKV] = {1, 1, 0.0f}, [Q] = {1, 10, 0.0f}, [KV] = {1, 4, 0.0f},
    [SLOPE] = {0, 0, 0.25f}, [SHIFT] = {1, -7, 0.0f},
  };
  char err[512];
  fj_expr *e = fj__expr_parse(text, "score", names, NNAMES, err, sizeof err);
  if (!e) {
    fprintf(stderr, "refused: %s\n", err);
    return 1;
  }
  reads none = {0};
  fj_expr_env env = {vals, read_tensor, r ? r : &none};
  *out = fj__expr_eval(e, &env);
  int same = out->is_int == fj__expr_is_int(e);
  fj__expr_free(e);
  if (!same)
    fprintf(stderr, "%s: the value's type is not the tree's\n", text);
  return !same;
}

static int gives_int(const char *text, int32_t want)
{
  fj_expr_value v;
  if (run(text, &v, NULL))
    return 0;
  if (v.is_int && v.i == want)
    return 1;
  fprintf(stderr, "%s gave %s %d / %g, want int %d\n", text,
          v.is_int ? "int" : "float", v.i, (double)v.f, want);
  return 0;
}

static int gives_float(const char *text, float want)
{
  fj_expr_value v;
  if (run(text, &v, NULL))
    return 0;
  if (!v.is_int && (v.f == want || (isnan(v.f) && isnan(want))))
    return 1;
  fprintf(stderr, "%s gave %s %d / %.9g, want float %.9g\n", text,
          v.is_int ? "int" : "float", v.i, (double)v.f, (double)want);
  return 0;
}

#define INT_IS(text, want) CHECK(gives_int(text, want))
#define FLOAT_IS(text, want) CHECK(gives_float(text, want))

/* 1 when text parses and its type is is_int. */
static int typed(const char *text, int is_int)
{
  char err[512];
  fj_expr *e = fj__expr_parse(text, "mask", names, NNAMES, err, sizeof err);
  if (!e) {
    fprintf(stderr, "refused: %s\n", err);
    return 0;
  }
  int got = fj__expr_is_int(e);
  fj__expr_free(e);
  if (got != is_int)
    fprintf(stderr, "%s is %s\n", text, got ? "int" : "float");
  return got == is_int;
}

#define TYPE_IS(text, is_int) CHECK(typed(text, is_int))

/* Statements, C's other tokens and the characters that have no place. */
static int refusals_tokens(void)
{
  REFUSED("s * 2.f;", "score: ';' at column 8: an expression, not a statement");
  REFUSED("s\n;", "score: ';' at column 3: an expression, not a statement");
  REFUSED("{ s }", "score: '{' at column 1: braces make a block");
  REFUSED("s }", "score: '}' at column 3: braces");
  REFUSED("#define X 1", "score: '#' at column 1: preprocessor directives");
  REFUSED("bias[h][q]", "score: '[' at column 5: a tensor is read with a call, "
                        "not brackets: bias(i, j)");
  REFUSED("q]", "score: ']' at column 2");
  REFUSED("s.x", "score: '.' at column 2: member access");
  REFUSED("s->x", "score: '->' at column 2: member access");
  REFUSED("s = 1.f", "score: '=' at column 3: assignment has no place");
  REFUSED("s += 1.f", "score: '+=' at column 3: assignment");
  REFUSED("q <<= 1", "score: '<<=' at column 3: assignment");
  REFUSED("q >>= 1", "score: '>>=' at column 3: assignment");
  REFUSED("q |= 1", "score: '|=' at column 3: assignment");
  REFUSED("q++", "score: '++' at column 2: increment and decrement assign");
  REFUSED("--q", "score: '--' at column 1: increment");
  REFUSED("q--1", "score: '--' at column 2");
  REFUSED("q, kv", "score: ',' at column 2: a comma only separates a call's arguments");
  REFUSED("(q, kv)", "score: ',' at column 3: a comma only separates");
  REFUSED("q ? 1, 2 : 3", "score: ',' at column 6: a comma");
  REFUSED("\"q\"", "score: '\"' at column 1: string and character literals");
  REFUSED("'q'", "score: \"'\" at column 1: string and character literals");
  REFUSED("q \\\n+ 1", "score: '\\' at column 3: a backslash");
  REFUSED("q @ kv", "score: '@' at column 3 is not a character of C's expressions");
  REFUSED("$q", "score: '$' at column 1 is not");
  REFUSED("q`", "score: '`' at column 2 is not");
  REFUSED("s * \xc3\xa9", "score: byte 0xc3 at column 5: only ASCII");
  REFUSED("s\x01", "score: byte 0x01 at column 2: a control character");
  REFUSED("s\x7f", "score: byte 0x7f at column 2: a control character");
  REFUSED("s\f", "score: byte 0x0c at column 2");
  REFUSED("q // note", "score: '//' at column 3: comments are not allowed");
  REFUSED("q /* note */", "score: '/*' at column 3: comments");
  REFUSED("q/*kv", "score: '/*' at column 2");
  REFUSED("q ::kv", "score: '::' at column 3: C++ scope resolution");
  REFUSED("q <: 2 :>", "score: ':' at column 4: expected an operand");
  REFUSED("&q", "score: '&' at column 1: expected an operand");
  REFUSED("*doc", "score: '*' at column 1: expected an operand");
  return 0;
}

/* Names: keywords, unknown names and the misuse of known ones. */
static int refusals_names(void)
{
  REFUSED("asm(\"trap;\")", "score: 'asm' at column 1 is a C, C++ or CUDA keyword");
  REFUSED("__asm__ volatile(\"trap;\")", "score: '__asm__' at column 1 is a C");
  REFUSED("sizeof(q)", "score: 'sizeof' at column 1 is a C, C++ or CUDA keyword");
  REFUSED("q and kv", "score: 'and' at column 3 is a C, C++ or CUDA keyword");
  REFUSED("threadIdx", "score: 'threadIdx' at column 1 is a C");
  REFUSED("s + printf(q)",
          "score: 'printf' at column 5 is not a name this expression may use "
          "(variables s, b, h, hkv, q, kv; parameters slope, shift, "
          "bias(i, j), doc(i); functions: those of fj_mods in flashjit.h)");
  REFUSED("s * x", "score: 'x' at column 5 is not a name");
  REFUSED("float(q)", "score: 'float' at column 1 is a type: use it only in a cast, (float) x");
  REFUSED("q + int", "score: 'int' at column 5 is a type");
  REFUSED("(double)q", "score: 'double' at column 2 is a C, C++ or CUDA keyword");
  REFUSED("(float q)", "score: 'q' at column 8: expected ')' to close the cast");
  REFUSED("tanhf", "score: 'tanhf' at column 1 is a function: call it, tanhf(x)");
  REFUSED("fminf + 1", "score: 'fminf' at column 1 is a function: call it, fminf(x, y)");
  REFUSED("tanhf(s, q)", "score: 'tanhf' at column 1 takes 1 argument, not 2");
  REFUSED("powf(s)", "score: 'powf' at column 1 takes 2 arguments, not 1");
  REFUSED("expf()", "score: 'expf' at column 1 takes 1 argument, not 0");
  REFUSED("min(q, s)", "score: 'min' at column 1 mixes int and float arguments, "
                       "which CUDA cannot resolve: cast one, (float) x, or use fminf");
  REFUSED("max(1.f, kv)", "score: 'max' at column 1 mixes int and float arguments");
  REFUSED("max(1.f, kv)", "use fmaxf");
  REFUSED("h(1)", "score: 'h' at column 1 is a variable, not a function or a tensor");
  REFUSED("slope (1)", "score: 'slope' at column 1 is a scalar parameter, not a tensor");
  REFUSED("s + bias", "score: 'bias' at column 5 is a tensor of rank 2: read it as bias(i, j)");
  REFUSED("doc", "score: 'doc' at column 1 is a tensor of rank 1: read it as doc(i)");
  REFUSED("bias(h)", "score: 'bias' at column 1 is a tensor of rank 2: it takes 2 indices, not 1");
  REFUSED("doc(q, kv)", "score: 'doc' at column 1 is a tensor of rank 1: it takes 1 index, not 2");
  REFUSED("bias(h, q *\n 0.5f)", "score: 'q *  0.5f' at column 9: an index of bias "
                                 "must be int, not float (cast: (int) x)");
  REFUSED("doc(s)", "score: 's' at column 5: an index of doc must be int");
  return 0;
}

/* Literals: the f suffix, int32's range, C's malformed numbers. */
static int refusals_literals(void)
{
  REFUSED("s * 0.5", "score: '0.5' at column 5: write 0.5f: a floating literal "
                     "without f is a double in C (slow on the GPU)");
  REFUSED("1e3", "score: '1e3' at column 1: write 1e3f: a floating literal without f");
  REFUSED("s + 1.", "score: '1.' at column 5: write 1.f:");
  REFUSED(".5", "score: '.5' at column 1: write .5f:");
  REFUSED("2f", "score: '2f' at column 1 is not a C literal: write 2.f");
  REFUSED("010", "score: '010' at column 1: C reads a leading 0 as octal");
  REFUSED("2147483648", "score: '2147483648' at column 1 is outside int32's range");
  REFUSED("-2147483648", "score: '2147483648' at column 2 is outside int32's range");
  REFUSED("0x80000000", "score: '0x80000000' at column 1 is outside int32's range");
  REFUSED("99999999999999999999999", "is outside int32's range");
  REFUSED("12u", "score: '12u' at column 1 is not a number of the language");
  REFUSED("1L", "score: '1L' at column 1 is not a number");
  REFUSED("0x1p3f", "score: '0x1p3f' at column 1 is not a number");
  REFUSED("0x1e+1", "score: '0x1e+1' at column 1 is not a number");
  REFUSED("0xg", "score: '0xg' at column 1 is not a number");
  REFUSED("0x", "score: '0x' at column 1 is not a number");
  REFUSED("1.2.3f", "score: '1.2.3f' at column 1 is not a number");
  REFUSED("1e+f", "score: '1e+f' at column 1 is not a number");
  REFUSED("2q", "score: '2q' at column 1 is not a number");
  REFUSED("1e39f", "score: '1e39f' at column 1 is outside float's range");
  return 0;
}

/* Where the grammar wants something else, and the types operators need. */
static int refusals_grammar(void)
{
  REFUSED("q +", "score: unexpected end at column 4: expected an operand");
  REFUSED("q + \n", "score: unexpected end at column 6: expected an operand");
  REFUSED("(q + 1", "score: unexpected end at column 7: expected an operator or ')'");
  REFUSED("(q kv)", "score: 'kv' at column 4: expected an operator or ')'");
  REFUSED("q kv", "score: 'kv' at column 3: expected an operator or the end");
  REFUSED("2 (kv)", "score: '(' at column 3: expected an operator or the end");
  REFUSED("(q) (kv)", "score: '(' at column 5: expected an operator or the end");
  REFUSED("q)", "score: ')' at column 2 closes no '('");
  REFUSED("q : kv", "score: ':' at column 3 has no '?' before it");
  REFUSED("q ? kv", "score: unexpected end at column 7: expected an operator or ':'");
  REFUSED("q ? : kv", "score: ':' at column 5: expected an operand");
  REFUSED("expf(", "score: unexpected end at column 6: expected an operand");
  REFUSED("fminf(s,)", "score: ')' at column 9: expected an operand");
  REFUSED("fminf(s kv)", "score: 'kv' at column 9: expected an operator, ',' or ')'");
  REFUSED("()", "score: ')' at column 2: expected an operand");
  REFUSED("s % 2", "score: '%' at column 3 needs int operands, not float");
  REFUSED("q % 2.f", "score: '%' at column 3 needs int operands");
  REFUSED("s << 1", "score: '<<' at column 3 needs int operands");
  REFUSED("q >> s", "score: '>>' at column 3 needs int operands");
  REFUSED("q & s", "score: '&' at column 3 needs int operands");
  REFUSED("1.f ^ q", "score: '^' at column 5 needs int operands");
  REFUSED("q | 1.f", "score: '|' at column 3 needs int operands");
  REFUSED("~s", "score: '~' at column 1 needs an int operand, not float");
  return 0;
}

int test_expr_refusals(void)
{
  return refusals_tokens() || refusals_names() || refusals_literals() ||
         refusals_grammar();
}

/* A string of n copies of open, then middle, then n copies of close. */
static char *nest(int n, const char *open, const char *middle,
                  const char *close)
{
  size_t lo = strlen(open), lm = strlen(middle), lc = strlen(close);
  char *s = malloc((size_t)n * (lo + lc) + lm + 1);
  if (!s)
    return NULL;
  char *w = s;
  for (int i = 0; i < n; i++, w += lo)
    memcpy(w, open, lo);
  memcpy(w, middle, lm);
  w += lm;
  for (int i = 0; i < n; i++, w += lc)
    memcpy(w, close, lc);
  *w = '\0';
  return s;
}

/* 1 when nest(n, ...) is accepted (want 1) or refused with want_msg. */
static int nested(int n, const char *open, const char *middle,
                  const char *close, const char *want_msg)
{
  char *s = nest(n, open, middle, close);
  if (!s)
    return 0;
  int ok;
  if (want_msg) {
    ok = refused(s, want_msg);
  } else {
    fj_expr_value v;
    ok = !run(s, &v, NULL);
  }
  free(s);
  return ok;
}

int test_expr_limits(void)
{
  char err[128];
  CHECK(!fj__expr_parse("", "score", names, NNAMES, err, sizeof err));
  CHECK(strcmp(err, "score: empty expression") == 0);
  CHECK(!fj__expr_parse(" \t\r\n ", "mask", names, NNAMES, err, sizeof err));
  CHECK(strcmp(err, "mask: empty expression") == 0);
  CHECK(!fj__expr_parse(NULL, NULL, NULL, 0, err, sizeof err));
  CHECK(strcmp(err, "expression: empty expression") == 0);
  /* A message is cut to the buffer, and no buffer is fine. */
  CHECK(!fj__expr_parse("q;", "score", names, NNAMES, err, 10));
  CHECK(strcmp(err, "score: ';") == 0);
  CHECK(!fj__expr_parse("q;", "score", names, NNAMES, NULL, 0));
  /* 1024 characters, the limit: 512 ones added, a 511-deep tree. */
  char *s = nest(511, "1+", "1", "");
  CHECK(s && strlen(s) == 1023);
  fj_expr *e = fj__expr_parse(s, "score", names, NNAMES, err, sizeof err);
  free(s);
  CHECK(e);
  fj_expr_value v = fj__expr_eval(e, NULL);
  CHECK(v.is_int && v.i == 512);
  fj__expr_free(e);
  s = nest(511, "1+", "1 ", "");
  CHECK(s && strlen(s) == 1024);
  e = fj__expr_parse(s, "score", names, NNAMES, err, sizeof err);
  free(s);
  CHECK(e);
  fj__expr_free(e);
  s = nest(511, "1+", "1  ", "");
  CHECK(s && refused(s, "score: 1025 characters, over the limit of 1024"));
  free(s);
  /* Nesting: 64 levels of each kind, no more, and no crash far past it. */
  CHECK(nested(64, "(", "q", ")", NULL));
  CHECK(nested(65, "(", "q", ")", "score: 'q' at column 66: nested deeper than 64 levels"));
  CHECK(nested(500, "(", "q", ")", "nested deeper than 64 levels"));
  CHECK(nested(64, "- ", "q", "", NULL));
  CHECK(nested(65, "- ", "q", "", "score: 'q' at column 131: nested deeper"));
  CHECK(nested(1000, "!", "q", "", "nested deeper than 64 levels"));
  CHECK(nested(64, "abs(", "q", ")", NULL));
  CHECK(nested(65, "abs(", "q", ")", "nested deeper than 64 levels"));
  CHECK(nested(200, "(int)", "s", "", "score: '(' at column 326: nested deeper"));
  CHECK(nested(64, "q?1:", "0", "", NULL));
  CHECK(nested(250, "q?1:", "0", "", "nested deeper than 64 levels"));
  CHECK(nested(150, "q?", "1", ":0", "nested deeper than 64 levels"));
  CHECK(nested(340, "(", "", "", "nested deeper than 64 levels"));
  return 0;
}

int test_expr_types(void)
{
  TYPE_IS("q", 1);
  TYPE_IS("s", 0);
  TYPE_IS("shift", 1);
  TYPE_IS("slope", 0);
  TYPE_IS("q + 1", 1);
  TYPE_IS("q + 1.f", 0);
  TYPE_IS("q * slope", 0);
  TYPE_IS("q / 2", 1);
  TYPE_IS("q < s", 1);
  TYPE_IS("s == s", 1);
  TYPE_IS("s && s", 1);
  TYPE_IS("s || 0", 1);
  TYPE_IS("!s", 1);
  TYPE_IS("-s", 0);
  TYPE_IS("+q", 1);
  TYPE_IS("(float)q", 0);
  TYPE_IS("(int)s", 1);
  TYPE_IS("(int)s * 2", 1);
  TYPE_IS("(int)s * 2.f", 0);
  TYPE_IS("(float)(q / 2)", 0);
  TYPE_IS("min(q, kv)", 1);
  TYPE_IS("min(s, 1.f)", 0);
  TYPE_IS("abs(q - kv)", 1);
  TYPE_IS("abs(s)", 0);
  TYPE_IS("fminf(q, kv)", 0);
  TYPE_IS("expf(q)", 0);
  TYPE_IS("bias(h, q - kv)", 0);
  TYPE_IS("doc(q)", 1);
  TYPE_IS("doc(q) == doc(kv)", 1);
  TYPE_IS("true", 1);
  TYPE_IS("false || true", 1);
  TYPE_IS("q ? s : 1", 0);
  TYPE_IS("q ? 1 : s", 0);
  TYPE_IS("s ? 1 : 2", 1);
  TYPE_IS("q ? 1 : q ? 2 : 0.5f", 0);
  TYPE_IS("bias(doc(q), (int)s)", 0);
  /* Whitespace of four kinds, and the grammar's whole range at once. */
  TYPE_IS(" q\t>=\r\nkv ", 1);
  TYPE_IS("q >= kv && (doc(q) == doc(kv) || kv <= 0x10) && !(q - kv > 1024)", 1);
  /* The names the language keeps for itself. */
  CHECK(fj__expr_reserved("expf") && strstr(fj__expr_reserved("expf"), "function"));
  CHECK(fj__expr_reserved("min") && fj__expr_reserved("true"));
  CHECK(fj__expr_reserved("int") && fj__expr_reserved("asm"));
  CHECK(fj__expr_reserved("and") && fj__expr_reserved("threadIdx"));
  CHECK(fj__expr_reserved("__x") && fj__expr_reserved("_X"));
  CHECK(!fj__expr_reserved("bias") && !fj__expr_reserved("_x"));
  CHECK(!fj__expr_reserved("slopes") && !fj__expr_reserved("expff"));
  return 0;
}

static int eval_arith(void)
{
  INT_IS("1 + 2 * 3", 7);
  INT_IS("(1 + 2) * 3", 9);
  INT_IS("-2 / 2 * 3", -3);
  INT_IS("7 % -3", 1);
  INT_IS("-7 % 3", -1);
  INT_IS("-7 / 2", -3);
  INT_IS("1 << 3 + 1", 16);
  INT_IS("10 - 4 - 3", 3);
  INT_IS("2 & 3 | 4 ^ 1", 7);
  INT_IS("1 < 2 == 1", 1);
  INT_IS("3 > 2 > 1", 0);
  INT_IS("1 || 0 && 0", 1);
  INT_IS("q - kv * 2 >= 2", 1);
  INT_IS("~0", -1);
  INT_IS("!q", 0);
  INT_IS("!!q", 1);
  INT_IS("- -q", 10);
  INT_IS("+q", 10);
  INT_IS("0x10 + 0XfF", 271);
  INT_IS("2147483647", INT32_MAX);
  /* Division by zero, INT32_MIN / -1, wrap-around (operands that vary:
   * kv is 4; the same with constants is refused, test_hostile_a.c). */
  INT_IS("q / (kv - 4)", 0);
  INT_IS("q % (kv - 4)", 0);
  INT_IS("(-2147483647 - 1) / (3 - kv)", INT32_MIN);
  INT_IS("(-2147483647 - 1) % (3 - kv)", 0);
  INT_IS("2147483647 + (kv - 3)", INT32_MIN);
  INT_IS("-2147483647 - (kv - 2)", INT32_MAX);
  INT_IS("0x7fffffff * (kv - 2)", -2);
  INT_IS("65536 * (65532 + kv)", 0);
  INT_IS("-(-2147483647 - kv / 4)", INT32_MIN);
  INT_IS("abs(-2147483647 - 1)", INT32_MIN);
  /* Shifts: counts outside 0..31 shift everything out; >> keeps the sign. */
  INT_IS("1 << 31", INT32_MIN);
  INT_IS("1 << (28 + kv)", 0);
  INT_IS("1 << (3 - kv)", 0);
  INT_IS("1 << q", 1024);
  INT_IS("-8 >> 1", -4);
  INT_IS("-1 >> 31", -1);
  INT_IS("-8 >> (36 + kv)", -1);
  INT_IS("8 >> (36 + kv)", 0);
  INT_IS("8 >> (3 - kv)", 0);
  INT_IS("-3 << 1", -6);
  return 0;
}

static int eval_floats(void)
{
  FLOAT_IS("0.5f + .5f", 1.0f);
  FLOAT_IS("1.f", 1.0f);
  FLOAT_IS("1e-3f", 1e-3f);
  FLOAT_IS("2.5e+2F", 250.0f);
  FLOAT_IS("0.1f", 0.1f);
  FLOAT_IS("3.4028235e38f", 3.4028235e38f);
  FLOAT_IS("1e-50f", 0.0f);
  FLOAT_IS("s * slope + shift", 1.5f * 0.25f - 7.0f);
  FLOAT_IS("q / 4.f", 2.5f);
  FLOAT_IS("-s", -1.5f);
  FLOAT_IS("s / 0", INFINITY);
  FLOAT_IS("0.f / 0", NAN);
  /* Casts bind tighter than binary operators and convert as the GPU. */
  FLOAT_IS("(float)q / 4", 2.5f);
  INT_IS("q / 4", 2);
  FLOAT_IS("(float)(q / 4)", 2.0f);
  INT_IS("(int)2.7f", 2);
  INT_IS("(int)-2.7f", -2);
  INT_IS("(int)s * 2", 2);
  INT_IS("(int)1e10f", INT32_MAX);
  INT_IS("(int)-1e10f", INT32_MIN);
  INT_IS("(int)2147483648.f", INT32_MAX);
  INT_IS("(int)2147483520.f", 2147483520);
  INT_IS("(int)-2147483648.f", INT32_MIN);
  INT_IS("(int)(0.f / 0.f)", 0);
  INT_IS("(int)(s / 0)", INT32_MAX);
  INT_IS("(int)q", 10);
  FLOAT_IS("(float)16777217", 16777216.0f);
  INT_IS("16777217 == 16777216.f", 1);
  INT_IS("16777217 == 16777216", 0);
  /* The ternary: only C's precedence, and float when either branch is. */
  INT_IS("1 ? 2 : 0 ? 3 : 4", 2);
  INT_IS("0 ? 2 : 0 ? 3 : 4", 4);
  INT_IS("q > 5 ? 1 : 2", 1);
  FLOAT_IS("q > 5 ? 1 : 0.5f", 1.0f);
  FLOAT_IS("q < 5 ? 1 : 0.5f", 0.5f);
  FLOAT_IS("s ? 3 : 0.5f", 3.0f);
  INT_IS("0.f ? 3 : 4", 4);
  INT_IS("true + true", 2);
  INT_IS("false", 0);
  INT_IS("q > kv == true", 1);
  INT_IS("s > 1.f && slope < 1.f", 1);
  INT_IS("s < slope", 0);
  INT_IS("0.f / 0.f != 0.f / 0.f", 1);
  INT_IS("0.f / 0.f == 0.f / 0.f", 0);
  INT_IS("(0.f / 0.f) <= 1.f", 0);
  return 0;
}

static int eval_functions(void)
{
  /* The expected values from the C library at run time: the compiler
   * would fold tanhf(1.5f) itself, perhaps rounded otherwise. */
  volatile float s = 1.5f;
  FLOAT_IS("tanhf(s)", tanhf(s));
  FLOAT_IS("50.f * tanhf(s / 50.f)", 50.0f * tanhf(s / 50.0f));
  FLOAT_IS("expf(0)", 1.0f);
  FLOAT_IS("exp2f(q)", 1024.0f);
  FLOAT_IS("logf(1)", 0.0f);
  FLOAT_IS("log2f(8.f)", 3.0f);
  FLOAT_IS("sqrtf(16)", 4.0f);
  FLOAT_IS("rsqrtf(4.0f)", 0.5f);
  FLOAT_IS("sinf(0)", 0.0f);
  FLOAT_IS("cosf(0)", 1.0f);
  FLOAT_IS("fabsf(-s)", 1.5f);
  FLOAT_IS("floorf(-s)", -2.0f);
  FLOAT_IS("ceilf(s)", 2.0f);
  FLOAT_IS("roundf(2.5f)", 3.0f);
  FLOAT_IS("truncf(-s)", -1.0f);
  FLOAT_IS("erff(0)", 0.0f);
  FLOAT_IS("fminf(s, q)", 1.5f);
  FLOAT_IS("fmaxf(s, q)", 10.0f);
  FLOAT_IS("fminf(0.f / 0.f, s)", 1.5f);
  FLOAT_IS("powf(2, 10)", 1024.0f);
  INT_IS("abs(-3)", 3);
  INT_IS("abs(q - kv * 4)", 6);
  FLOAT_IS("abs(-s)", 1.5f);
  INT_IS("min(q, kv)", 4);
  INT_IS("max(q, kv)", 10);
  INT_IS("min(shift, 0)", -7);
  FLOAT_IS("min(s, slope)", 0.25f);
  FLOAT_IS("max(s, slope)", 1.5f);
  FLOAT_IS("s - slope * (float)abs(q - kv)", 1.5f - 0.25f * 6.0f);
  return 0;
}

int test_expr_eval(void)
{
  return eval_arith() || eval_floats() || eval_functions();
}

/* Evaluates text, recording reads into r (zeroed first). */
static int run_reads(const char *text, fj_expr_value *v, reads *r)
{
  memset(r, 0, sizeof *r);
  return run(text, v, r);
}

int test_expr_reads(void)
{
  fj_expr_value v;
  reads r;
  CHECK(!run_reads("s + bias(h, q - kv)", &v, &r));
  CHECK(r.n == 1 && r.name[0] == BIAS && r.idx[0][0] == 3 && r.idx[0][1] == 6);
  CHECK(!v.is_int && v.f == 1.5f + 306.0f);
  /* Outside the extents: the callback's 0. */
  CHECK(!run_reads("bias(h, kv - q)", &v, &r));
  CHECK(r.n == 1 && r.idx[0][0] == 3 && r.idx[0][1] == -6 && v.f == 0.0f);
  CHECK(!run_reads("doc(q) == doc(kv + 4)", &v, &r));
  CHECK(r.n == 2 && r.name[0] == DOC && r.idx[0][0] == 10 && r.idx[1][0] == 8);
  CHECK(v.is_int && v.i == 1);
  CHECK(!run_reads("bias(doc(q * 2), (int)(s * 2.f))", &v, &r));
  CHECK(r.n == 2 && r.name[0] == DOC && r.idx[0][0] == 20 &&
        r.name[1] == BIAS && r.idx[1][0] == 5 && r.idx[1][1] == 3);
  CHECK(!v.is_int && v.f == 503.0f);
  /* && || ?: read only what they evaluate. */
  CHECK(!run_reads("q < 0 && doc(q)", &v, &r));
  CHECK(r.n == 0 && v.is_int && v.i == 0);
  CHECK(!run_reads("q > 0 || doc(q)", &v, &r));
  CHECK(r.n == 0 && v.is_int && v.i == 1);
  CHECK(!run_reads("q > 0 && doc(q)", &v, &r));
  CHECK(r.n == 1 && v.i == 1);
  CHECK(!run_reads("q > 0 ? 1 : doc(kv)", &v, &r));
  CHECK(r.n == 0 && v.i == 1);
  CHECK(!run_reads("q < 0 ? doc(q) : doc(kv)", &v, &r));
  CHECK(r.n == 1 && r.idx[0][0] == 4 && v.i == 1);
  CHECK(!run_reads("q < 0 ? bias(0, 0) : doc(kv)", &v, &r));
  CHECK(r.n == 1 && r.name[0] == DOC && !v.is_int && v.f == 1.0f);
  /* No environment: every name and element reads 0. */
  fj_expr *e = fj__expr_parse("q + doc(kv) + 1", "mask", names, NNAMES, NULL, 0);
  CHECK(e);
  v = fj__expr_eval(e, NULL);
  fj__expr_free(e);
  CHECK(v.is_int && v.i == 1);
  v = fj__expr_eval(NULL, NULL);
  CHECK(v.is_int && v.i == 0);
  fj__expr_free(NULL);
  return 0;
}

/* Reads at a distance (fj__expr_distance_reads): T(A..., q - kv + X) or
 * kv - q, X a chain of + and - free of q, kv and s, the other indices
 * too; anything else is an ordinary read. */
int test_expr_distance_reads(void)
{
  static const struct {
    const char *text;
    int reads;
  } cases[] = {
      {"s + bias(h, q - kv)", 1},
      {"s + bias(h, kv - q + shift)", 1},
      {"s + bias(h / 2, q - kv + shift - 3 * shift) * doc(kv - q)", 2},
      {"s + bias(h, (q - kv) + 1)", 1},
      {"s + bias(h, shift + q - kv)", 0},   /* (shift + q) - kv */
      {"s + bias(h, q - kv * 2)", 0},
      {"s + bias(q, kv - q)", 0},
      {"s + bias(h, q - kv + (int)s)", 0},
      {"s + bias(h, q - kv + kv)", 0},
      {"s + bias(h, q + kv)", 0},
      {"s + bias(h, q - h)", 0},
      {"s + bias(h, -(q - kv))", 0},
      {"s + slope * (float)(q - kv)", 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char err[256];
    fj_expr *e = fj__expr_parse(cases[i].text, "score", names, NNAMES, err, sizeof err);
    CHECK(e);
    int n = fj__expr_distance_reads(e, Q, KV, S);
    fj__expr_free(e);
    if (n != cases[i].reads) {
      fprintf(stderr, "%s: %d reads at a distance, not %d\n", cases[i].text, n,
              cases[i].reads);
      return 1;
    }
  }
  CHECK(fj__expr_distance_reads(NULL, Q, KV, S) == 0);
  return 0;
}

/* ---- the kernels' facts and the CUDA printer ------------------------------ */

static const fj_expr_vars vars = {B, H, HKV, Q, KV, S};

static fj_expr *parse_ok(const char *text)
{
  char err[256];
  fj_expr *e = fj__expr_parse(text, "score", names, NNAMES, err, sizeof err);
  if (!e)
    fprintf(stderr, "%s: %s\n", text, err);
  return e;
}

/* Subtree `at` of e printed (-1: all), with kvq forms as fj_kvq. */
static char *printed_as(const fj_expr *e, int at, int kvq, const fj_expr_subst *subs,
                        int nsubs, int plain)
{
  fj_buf b = {0};
  fj_expr_print o = {names, kvq ? &vars : NULL, subs, nsubs, plain};
  if (fj__expr_print_cuda(e, at, &o, &b) != 0)
    return NULL;
  return fj__buf_take(&b);
}

/* The same in the kernel's form. */
static char *printed(const fj_expr *e, int at, int kvq, const fj_expr_subst *subs,
                     int nsubs)
{
  return printed_as(e, at, kvq, subs, nsubs, 0);
}

/* Per tensor, whether a score's read of it changes from score to score
 * (indices using kv or s, nested reads included): the kernels' __ldg or
 * shared plain loads (mods.lua's p.shared). */
int test_expr_facts_per_score(void)
{
  static const struct {
    const char *text;
    int bias, doc;
  } cases[] = {
      {"s + bias(h, q - kv)", 1, 0},
      {"s + bias(h, q) + (float)doc(q)", 0, 0},
      {"s + bias(h, doc(kv))", 1, 1},
      {"s + bias(h, (int)s)", 1, 0},
      {"s * bias(b, hkv) + (float)doc(h)", 0, 0},
      {"doc(q) == doc(kv) ? s : bias(0, 0)", 0, 1},
      {"s + slope", 0, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fj_expr *e = parse_ok(cases[i].text);
    CHECK(e);
    int bias = fj__expr_per_score(e, BIAS, &vars), doc = fj__expr_per_score(e, DOC, &vars);
    fj__expr_free(e);
    if (bias != cases[i].bias || doc != cases[i].doc) {
      fprintf(stderr, "%s: per score bias %d doc %d, not %d %d\n", cases[i].text,
              bias, doc, cases[i].bias, cases[i].doc);
      return 1;
    }
  }
  return 0;
}

/* The distance table (mods.lua's dg): the first read in the text's order
 * at T(A..., q - kv + X) or kv - q, its sign, X (printed with the distance
 * as 0), its uniform indices, where it starts; refused where X or an A
 * reads q, kv or s, where X has an operator looser than + and -, or the
 * distance is not at X's front. */
int test_expr_facts_dg(void)
{
  static const struct {
    const char *text;
    int sign;          /* 0: no distance read */
    const char *x, *a; /* X and the first index, printed */
    int pos;
  } cases[] = {
      {"s + bias(h, q - kv)", 1, "0", "h", 4},
      {"s + bias(h, kv - q + shift)", -1, "fj::iadd(0, shift)", "h", 4},
      {"s + bias(h / 2, q - kv + shift - 3 * shift) * (float)doc(kv - q)", 1,
       "fj::isub(fj::iadd(0, shift), fj::imul(3, shift))", "fj::idiv(h, 2)", 4},
      {"s + bias(h, (q - kv) + 1)", 1, "fj::iadd(0, 1)", "h", 4},
      {"s + bias(h, (q - kv + 1))", 1, "fj::iadd(0, 1)", "h", 4},
      {"s+bias(h,q-kv+\n 1)", 1, "fj::iadd(0, 1)", "h", 2},
      /* The first of two in the text's order; a nested one first. */
      {"s + (float)doc(kv - q) + bias(h, q - kv)", -1, "0", NULL, 11},
      {"s + bias(doc(kv - q), q - kv)", -1, "0", NULL, 9},
      {"s + bias(h, shift + q - kv)", 0, NULL, NULL, 0},
      {"s + bias(h, q - kv * 2)", 0, NULL, NULL, 0},
      {"s + bias(q, kv - q)", 0, NULL, NULL, 0},
      {"s + bias(h, q - kv + (int)s)", 0, NULL, NULL, 0},
      {"s + bias(h, q - kv + kv)", 0, NULL, NULL, 0},
      {"s + bias(h, q - kv + h & 3)", 0, NULL, NULL, 0},
      {"s + bias(h, q - kv << 1)", 0, NULL, NULL, 0},
      {"s + bias(h, q - kv < 4 ? 1 : 2)", 0, NULL, NULL, 0},
      {"s + bias(h, -(q - kv))", 0, NULL, NULL, 0},
      {"s + bias(h, q - kv + (int)(float)(kv - q))", 0, NULL, NULL, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fj_expr *e = parse_ok(cases[i].text);
    CHECK(e);
    fj_expr_facts f;
    CHECK(fj__expr_facts_no_rt(e, &vars, &f) == 0);
    int ok = (f.dg >= 0) == (cases[i].sign != 0);
    if (ok && f.dg >= 0) {
      fj_expr_subst zero = {f.dg_dist, "0"};
      char *x = printed(e, f.dg_x, 0, &zero, 1);
      char *a = printed(e, fj__expr_kid(e, f.dg, 0), 0, NULL, 0);
      ok = f.dg_sign == cases[i].sign && f.dg_name == (cases[i].a ? BIAS : DOC) &&
           f.dg_rank == (cases[i].a ? 2 : 1) && x && !strcmp(x, cases[i].x) &&
           (!cases[i].a || (a && !strcmp(a, cases[i].a))) && f.dg_pos == cases[i].pos;
      if (!ok)
        fprintf(stderr, "%s: sign %d X %s A %s at %d\n", cases[i].text, f.dg_sign,
                x ? x : "?", a ? a : "?", f.dg_pos);
      free(x);
      free(a);
    }
    fj__expr_free(e);
    if (!ok) {
      fprintf(stderr, "%s: distance read %d, want sign %d\n", cases[i].text, f.dg,
              cases[i].sign);
      return 1;
    }
  }
  return 0;
}

/* ALiBi's distance (kvq) in both orders, with and without spaces, inside
 * a call; its product F * (float)(kv - q) (kvq_scale) where F, the
 * product's left operand, is free of q, kv and s and the distance is the
 * expression's only one: F a name, a call, a group, a literal, a cast;
 * not with F reading s, q or kv, the distance on the left, (q - kv), or a
 * second distance. */
int test_expr_facts_kvq(void)
{
  static const struct {
    const char *text;
    int kvq;
    const char *factor;  /* NULL: no kvq_scale */
    const char *cuda;    /* printed with the kvq forms as fj_kvq */
  } cases[] = {
      {"s + slope * (float)(kv - q)", 1, "slope", "(s + (slope * fj_kvq))"},
      {"s+slope*(float)(kv-q)", 1, "slope", "(s + (slope * fj_kvq))"},
      {"s + bias(h, 0) * (float)( kv - q )", 1, "bias(h, 0)", NULL},
      {"s - (slope + 0.5f) * (float)(kv - q)", 1, "(slope + 0.5f)", NULL},
      {"s + 1e-3f * (float)(kv - q)", 1, "0.001f", NULL},
      {"s + (float)h * (float)(kv - q)", 1, "((float)h)", NULL},
      {"s + slope / 2.f * (float)(kv - q)", 1, "(slope / 2.0f)", NULL},
      {"s + expf((float)(kv - q))", 1, NULL, "(s + expf(fj_kvq))"},
      {"s / (float)(q - kv)", 1, NULL, "(s / (0.f-fj_kvq))"},
      {"s + slope * (float)(q - kv)", 1, NULL, "(s + (slope * (0.f-fj_kvq)))"},
      {"s * 2.f * (float)(kv - q)", 1, NULL, NULL},
      {"s + (float)q * (float)(kv - q)", 1, NULL, NULL},
      {"s + (float)(kv - q) * slope", 1, NULL, "(s + (fj_kvq * slope))"},
      {"s + slope * (float)(kv - q) + (float)(kv - q)", 2, NULL, NULL},
      {"s + slope * (float)(kv - q - 1)", 0, NULL, "(s + (slope * ((float)fj::isub(fj::isub(kv, q), 1))))"},
      {"s + slope * (float)kv", 0, NULL, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fj_expr *e = parse_ok(cases[i].text);
    CHECK(e);
    fj_expr_facts f;
    CHECK(fj__expr_facts_no_rt(e, &vars, &f) == 0);
    char *factor = f.kvq_factor >= 0 ? printed(e, f.kvq_factor, 1, NULL, 0) : NULL;
    char *cuda = printed(e, -1, 1, NULL, 0);
    int ok = f.kvq == cases[i].kvq && (f.kvq_scale >= 0) == (cases[i].factor != NULL) &&
             (!cases[i].factor || (factor && !strcmp(factor, cases[i].factor))) &&
             (!cases[i].cuda || (cuda && !strcmp(cuda, cases[i].cuda)));
    if (!ok)
      fprintf(stderr, "%s: kvq %d, factor %s, printed %s\n", cases[i].text, f.kvq,
              factor ? factor : "none", cuda ? cuda : "?");
    free(factor);
    free(cuda);
    fj__expr_free(e);
    CHECK(ok);
  }
  return 0;
}

/* Whether the value depends on nothing but s, h, the parameters and kv -
 * q (uses_s apart). */
int test_expr_facts_rel(void)
{
  static const struct {
    const char *text;
    int rel, uses_s;
  } cases[] = {
      {"s + bias(h, q - kv + 4096)", 1, 1},
      {"s + slope * (float)(kv - q)", 1, 1},
      {"bias(h, kv - q) * 2.f", 1, 0},
      {"s + bias(h, abs(q - kv) < 8 ? q - kv : 8)", 1, 1},
      {"s + (float)doc(kv)", 0, 1},
      {"s + bias(h, q - kv + q)", 0, 1},
      {"s + (float)b", 0, 1},
      {"s + (float)hkv", 0, 1},
      {"(float)(q - kv + kv)", 0, 0},
      {"s * slope", 1, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fj_expr *e = parse_ok(cases[i].text);
    CHECK(e);
    fj_expr_facts f;
    CHECK(fj__expr_facts(e, &vars, &f) == 0);
    fj__expr_free(e);
    if (f.rel_only != cases[i].rel || f.uses_s != cases[i].uses_s) {
      fprintf(stderr, "%s: rel_only %d uses_s %d\n", cases[i].text, f.rel_only, f.uses_s);
      return 1;
    }
  }
  return 0;
}

/* The relative table's subtree (rt): a float of h, the parameters and
 * the distance alone that costs more than the kernels' own forms -- a
 * read through a bucket table, a clamp, a function of the distance, two
 * distance reads -- and none for ALiBi, a plain distance read, a subtree
 * that reads s, b, hkv, q or kv outside a distance, or beside a distance
 * read outside it (dg keeps that); where taken, dg is -1 and kvq counts
 * the distances outside it. */
int test_expr_facts_rt(void)
{
  static const struct {
    const char *text;
    const char *rt; /* the subtree, printed plain; NULL: none */
    int kvq;
  } cases[] = {
      {"s + bias(h, doc(kv - q + 128))", "bias(h, doc(((kv - q) + 128)))", 0},
      {"s + bias(h, min(max(kv - q, -64), 64) + 64)", "bias(h, (min(max((kv - q), (-64)), 64) + 64))", 0},
      {"s + logf(1.f + fabsf((float)(kv - q)))", "logf((1.0f + fabsf(((float)(kv - q)))))", 0},
      {"s * expf(0.1f * (float)(q - kv))", "expf((0.1f * ((float)(q - kv))))", 0},
      {"bias(h, q - kv) + bias(h, kv - q)", "(bias(h, (q - kv)) + bias(h, (kv - q)))", 0},
      {"s + (float)doc(kv) + bias(h, doc(kv - q))", "bias(h, doc((kv - q)))", 0},
      {"s + (float)b * bias(h, doc(kv - q)) + slope * (float)(kv - q)", "bias(h, doc((kv - q)))", 1},
      {"s + slope * (float)(kv - q)", NULL, 1},
      {"s + bias(h, q - kv + 64)", NULL, 0},
      {"s + bias(h, q - kv) + bias(h, kv - q)", NULL, 0},
      {"s + bias(h, q - kv) + bias(h, doc(kv - q))", NULL, 0},
      {"s + bias(h, doc(kv - q + (int)s))", NULL, 0},
      {"s + bias(hkv, doc(kv - q))", NULL, 0},
      {"s + bias(h, doc(kv - q + q))", NULL, 0},
      {"s + (float)doc(kv - q)", NULL, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fj_expr *e = parse_ok(cases[i].text);
    CHECK(e);
    fj_expr_facts f, plain;
    CHECK(fj__expr_facts(e, &vars, &f) == 0);
    CHECK(fj__expr_facts_no_rt(e, &vars, &plain) == 0);
    char *rt = f.rt >= 0 ? printed_as(e, f.rt, 0, NULL, 0, 1) : NULL;
    int ok = (f.rt >= 0) == (cases[i].rt != NULL) && f.kvq == cases[i].kvq &&
             (!rt || !strcmp(rt, cases[i].rt)) && (f.rt < 0 || f.dg < 0) &&
             plain.rt < 0 && (f.rt >= 0 || f.dg == plain.dg);
    if (!ok)
      fprintf(stderr, "%s: rt %s, kvq %d, dg %d (without the table %d)\n", cases[i].text,
              rt ? rt : "none", f.kvq, f.dg, plain.dg);
    free(rt);
    fj__expr_free(e);
    CHECK(ok);
  }
  /* The mask takes none (no s among its names). */
  fj_expr *e = parse_ok("bias(h, doc(kv - q)) > 0.f");
  CHECK(e);
  fj_expr_vars mask_vars = vars;
  mask_vars.s = -1;
  fj_expr_facts f;
  CHECK(fj__expr_facts(e, &mask_vars, &f) == 0 && f.rt == -1);
  fj__expr_free(e);
  return 0;
}

/* A tensor element as a function of its indices, both types. */
static fj_expr_value grid_read(void *user, int name, const int32_t *idx)
{
  (void)user;
  uint32_t x = (uint32_t)name * 2654435761u ^ (uint32_t)idx[0] * 40503u ^
               (uint32_t)idx[1] * 9973u;
  fj_expr_value v = {names[name].is_int, (int32_t)(x % 97) - 48,
                     (float)(x % 1000) / 37.f - 13.f};
  return v;
}

static int same_value(fj_expr_value a, fj_expr_value b)
{
  if (a.is_int != b.is_int)
    return 0;
  if (a.is_int)
    return a.i == b.i;
  return (isnan(a.f) && isnan(b.f)) || memcmp(&a.f, &b.f, sizeof a.f) == 0;
}

/* e and its printed form evaluate alike over a grid of the variables. */
static int round_trip(const char *text)
{
  fj_expr *e = parse_ok(text);
  CHECK(e);
  char *cuda = printed_as(e, -1, 0, NULL, 0, 1);
  CHECK(cuda);
  fj_expr *back = parse_ok(cuda);
  char *again = back ? printed_as(back, -1, 0, NULL, 0, 1) : NULL;
  int ok = back && again && !strcmp(again, cuda);
  static const float ss[] = {-3.5f, 0.f, 0.1f, 7.25f};
  static const int32_t ints[] = {0, 1, 5, 17, 4095};
  fj_expr_value vals[NNAMES] = {{0, 0, 0.f}};
  vals[SLOPE] = (fj_expr_value){0, 0, 0.3f};
  vals[SHIFT] = (fj_expr_value){1, 7, 0.f};
  fj_expr_env env = {vals, grid_read, NULL};
  for (int i = 0; ok && i < 4 * 5 * 5 * 5; i++) {
    vals[S] = (fj_expr_value){0, 0, ss[i % 4]};
    vals[H] = (fj_expr_value){1, ints[i / 4 % 5], 0.f};
    vals[Q] = (fj_expr_value){1, ints[i / 20 % 5], 0.f};
    vals[KV] = (fj_expr_value){1, ints[i / 100 % 5], 0.f};
    vals[B] = vals[HKV] = vals[H];
    ok = same_value(fj__expr_eval(e, &env), fj__expr_eval(back, &env));
  }
  if (!ok)
    fprintf(stderr, "%s: printed %s, reprinted %s\n", text, cuda, again ? again : "?");
  free(cuda);
  free(again);
  fj__expr_free(back);
  fj__expr_free(e);
  return ok ? 0 : 1;
}

/* The printer: every expression of a corpus (this file's and the built-ins'
 * forms) printed, parsed back and printed again gives the same text, and
 * the two trees evaluate to the same bits over a grid of the variables. */
int test_expr_print_round_trip(void)
{
  static const char *const corpus[] = {
      "s + slope * (float)(kv - q)",
      "s + bias(h, q - kv + shift)",
      "s - 0.5f * bias(h / 2, (kv - q) - 7)",
      "q >= kv && doc(q) == doc(kv) ? s : -1e30f",
      "s * 0.1f + 1.17549435e-38f - 3.40282347e+38f / 1e20f + .5f + 1.f",
      "(int)s * 2 + (int)(s * 2.f) % 3 - -1",
      "s / (float)(q - kv) + (float)(~q ^ kv | h & 3) + (float)(q << 2 >> 1)",
      "!(q < kv) || q != kv ? fminf(s, 2.f) : fmaxf(s, powf(2.f, s))",
      "a ? b : c ? d : e",
      "-s - -s + +s * -(-s)",
      "min(q, kv) + max(h, 1) + abs(q - kv) + (float)min(h, 2) + min(s, 1.f)",
      "expf(s) + exp2f(s) + logf(fabsf(s) + 1.f) + log2f(2.f) + sqrtf(fabsf(s))",
      "rsqrtf(2.f) + tanhf(s) + sinf(s) + cosf(s) + floorf(s) + ceilf(s) + roundf(s) + truncf(s) + erff(s)",
      "true + false * 2 - 2147483647 + 0x7fffffff",
      "s + bias(h, (kv - q) < 0 ? ((q - kv) < 8 ? (q - kv) : min(15, 8 + (int)(logf((float)(q - kv) / 8.f) / logf(16.f) * 8.f))) : 16 + ((kv - q) < 8 ? (kv - q) : min(15, 8 + (int)(logf((float)(kv - q) / 8.f) / logf(16.f) * 8.f))))",
      "s + slope * (float)h * 0.333333343f",
      "(float)(q - kv) * (float)(kv - q) + 1e-45f",
  };
  for (size_t i = 0; i < sizeof corpus / sizeof corpus[0]; i++) {
    if (strstr(corpus[i], "a ?"))
      CHECK(round_trip("q > 0 ? q : kv > 0 ? kv : h") == 0);
    else
      CHECK(round_trip(corpus[i]) == 0);
  }
  return 0;
}
