/*
 * expr.c -- the expression language of score and mask modifications.  A
 * tokenizer and a precedence-climbing parser accept only the grammar that
 * expr.h describes: the text goes verbatim into generated CUDA, so whatever
 * the parser does not understand is refused, never passed on.  Types are
 * checked as the tree is built.  The evaluator computes on the CPU what the
 * GPU computes, for the reference implementation.
 *
 * The tree is one array of nodes in post-order (children before parents),
 * allocated once: every node takes at least one token of the text, so the
 * text's length bounds the count.
 */
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expr.h"
#include "expr_tree.h"
#include "util.h"

/* ---- what the language knows ---------------------------------------------- */

/* overloaded: int arguments give an int (abs, min, max); the others take
 * ints converted to float, as C does. */
static const struct func {
  const char *name;
  int nargs;
  int overloaded;
} funcs[FN_COUNT] = {
  [FN_EXPF] = {"expf", 1, 0},     [FN_EXP2F] = {"exp2f", 1, 0},
  [FN_LOGF] = {"logf", 1, 0},     [FN_LOG2F] = {"log2f", 1, 0},
  [FN_SQRTF] = {"sqrtf", 1, 0},   [FN_RSQRTF] = {"rsqrtf", 1, 0},
  [FN_TANHF] = {"tanhf", 1, 0},   [FN_SINF] = {"sinf", 1, 0},
  [FN_COSF] = {"cosf", 1, 0},     [FN_FABSF] = {"fabsf", 1, 0},
  [FN_FLOORF] = {"floorf", 1, 0}, [FN_CEILF] = {"ceilf", 1, 0},
  [FN_ROUNDF] = {"roundf", 1, 0}, [FN_TRUNCF] = {"truncf", 1, 0},
  [FN_ERFF] = {"erff", 1, 0},     [FN_FMINF] = {"fminf", 2, 0},
  [FN_FMAXF] = {"fmaxf", 2, 0},   [FN_POWF] = {"powf", 2, 0},
  [FN_ABS] = {"abs", 1, 1},       [FN_MIN] = {"min", 2, 1},
  [FN_MAX] = {"max", 2, 1},
};

typedef enum opclass { ARITH, INTS, LOGIC } opclass;

/* C's binary operators, by precedence (higher binds tighter); all are
 * left-associative. */
static const struct binop {
  const char *text;
  int prec;
  int op;
  opclass cls;
} binops[] = {
  {"*", 10, OP_MUL, ARITH}, {"/", 10, OP_DIV, ARITH}, {"%", 10, OP_MOD, INTS},
  {"+", 9, OP_ADD, ARITH},  {"-", 9, OP_SUB, ARITH},
  {"<<", 8, OP_SHL, INTS},  {">>", 8, OP_SHR, INTS},
  {"<", 7, OP_LT, LOGIC},   {"<=", 7, OP_LE, LOGIC},
  {">", 7, OP_GT, LOGIC},   {">=", 7, OP_GE, LOGIC},
  {"==", 6, OP_EQ, LOGIC},  {"!=", 6, OP_NE, LOGIC},
  {"&", 5, OP_BAND, INTS},  {"^", 4, OP_XOR, INTS},   {"|", 3, OP_BOR, INTS},
  {"&&", 2, OP_AND, LOGIC}, {"||", 1, OP_OR, LOGIC},
};

static const char R_ASSIGN[] =
    ": assignment has no place in an expression (compare with ==)";
static const char R_STEP[] =
    ": increment and decrement assign (write q + 1; a minus sign before a "
    "negative operand needs a space: q - -1)";
static const char R_MEMBER[] = ": member access has no place in an expression";
static const char R_COMMENT[] = ": comments are not allowed in an expression";
static const char R_BRACE[] =
    ": braces make a block or an initializer, not an expression";
static const char R_INDEX[] =
    ": a tensor is read with a call, not brackets: bias(i, j)";
static const char R_QUOTE[] =
    ": string and character literals have no place in an expression";
static const char R_FOREIGN[] = " is not a character of C's expressions";
static const char R_KEYWORD[] =
    " is a C, C++ or CUDA keyword, which an expression may not use";

/* Every punctuator C could read here, longest first (C takes the longest
 * token it can), and why the refused ones are refused.  C++'s digraphs
 * (<: <% %: ...) need no entry: in each, the second character stands where
 * the grammar wants an operand, so the parser refuses them all. */
static const struct punct {
  const char *text;
  const char *refusal;
} puncts[] = {
  {"<<=", R_ASSIGN}, {">>=", R_ASSIGN},
  {"<<", NULL}, {">>", NULL}, {"<=", NULL}, {">=", NULL}, {"==", NULL},
  {"!=", NULL}, {"&&", NULL}, {"||", NULL},
  {"//", R_COMMENT}, {"/*", R_COMMENT}, {"++", R_STEP}, {"--", R_STEP},
  {"->", R_MEMBER},
  {"::", ": C++ scope resolution has no place in an expression"},
  {"+=", R_ASSIGN}, {"-=", R_ASSIGN}, {"*=", R_ASSIGN}, {"/=", R_ASSIGN},
  {"%=", R_ASSIGN}, {"&=", R_ASSIGN}, {"|=", R_ASSIGN}, {"^=", R_ASSIGN},
  {"+", NULL}, {"-", NULL}, {"*", NULL}, {"/", NULL}, {"%", NULL},
  {"<", NULL}, {">", NULL}, {"!", NULL}, {"~", NULL}, {"&", NULL},
  {"|", NULL}, {"^", NULL}, {"?", NULL}, {":", NULL}, {"(", NULL},
  {")", NULL}, {",", NULL},
  {"=", R_ASSIGN},
  {";", ": an expression, not a statement"},
  {"{", R_BRACE}, {"}", R_BRACE},
  {"#", ": preprocessor directives are not allowed in an expression"},
  {"[", R_INDEX}, {"]", R_INDEX},
  {".", ": member access has no place in an expression (a float literal "
        "needs a digit beside its point: .5f)"},
  {"'", R_QUOTE}, {"\"", R_QUOTE},
  {"\\", ": a backslash (an escape or a line continuation) has no place in "
         "an expression"},
  {"@", R_FOREIGN}, {"$", R_FOREIGN}, {"`", R_FOREIGN},
};

/* Words no expression may use, whatever the caller's names: those of C,
 * C++ (the alternative operators included, which C++ reads as operators)
 * and CUDA, and CUDA's built-in variables.  true, false, float and int
 * are the language's own and handled apart. */
static const char *const keywords[] = {
  "auto", "break", "case", "char", "const", "continue", "default", "do",
  "double", "else", "enum", "extern", "for", "goto", "if", "inline", "long",
  "register", "restrict", "return", "short", "signed", "sizeof", "static",
  "struct", "switch", "typedef", "union", "unsigned", "void", "volatile",
  "while", "_Alignas", "_Alignof", "_Atomic", "_Bool", "_Complex",
  "_Generic", "_Imaginary", "_Noreturn", "_Static_assert", "_Thread_local",
  "alignas", "alignof", "and", "and_eq", "asm", "bitand", "bitor", "bool",
  "catch", "char8_t", "char16_t", "char32_t", "class", "compl", "concept",
  "const_cast", "consteval", "constexpr", "constinit", "co_await",
  "co_return", "co_yield", "decltype", "delete", "dynamic_cast", "explicit",
  "export", "friend", "mutable", "namespace", "new", "noexcept", "not",
  "not_eq", "nullptr", "operator", "or", "or_eq", "private", "protected",
  "public", "reinterpret_cast", "requires", "static_assert", "static_cast",
  "template", "this", "thread_local", "throw", "try", "typeid", "typename",
  "using", "virtual", "wchar_t", "xor", "xor_eq", "typeof", "__asm",
  "__asm__", "__typeof__", "__attribute__", "__global__", "__device__",
  "__host__", "__shared__", "__constant__", "__managed__", "__restrict__",
  "__forceinline__", "__noinline__", "threadIdx", "blockIdx", "blockDim",
  "gridDim", "warpSize",
};

static const char *const index_lists[FJ_EXPR_RANK_MAX + 1] = {
  "", "i", "i, j", "i, j, k", "i, j, k, l"};

/* Character classes of the C locale, whatever the process's locale. */
static int is_digit(char c)
{
  return c >= '0' && c <= '9';
}

static int is_hex(char c)
{
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static int is_alpha(char c)
{
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static int is_space(char c)
{
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Whether the n characters at s are the word w. */
static int word_is(const char *s, int n, const char *w)
{
  return strlen(w) == (size_t)n && memcmp(s, w, (size_t)n) == 0;
}

static int find_func(const char *s, int n)
{
  for (int k = 0; k < FN_COUNT; k++)
    if (word_is(s, n, funcs[k].name))
      return k;
  return -1;
}

static int is_keyword(const char *s, int n)
{
  for (size_t k = 0; k < FJ_ARRAY_LEN(keywords); k++)
    if (word_is(s, n, keywords[k]))
      return 1;
  return 0;
}

const char *fj__expr_reserved(const char *name)
{
  if (!name)
    return "no name";
  int n = (int)strnlen(name, FJ_EXPR_LEN_MAX + 1);
  if (find_func(name, n) >= 0)
    return "a built-in function";
  if (word_is(name, n, "true") || word_is(name, n, "false") ||
      word_is(name, n, "float") || word_is(name, n, "int"))
    return "a keyword of the expressions";
  if (is_keyword(name, n))
    return "a C, C++ or CUDA keyword";
  if (name[0] == '_' && (name[1] == '_' || (name[1] >= 'A' && name[1] <= 'Z')))
    return "reserved to the C implementation (a leading __ or _ and a capital)";
  return NULL;
}

/* ---- the parser's state and its messages ----------------------------------- */

typedef enum tok_kind { T_END, T_INT, T_FLOAT, T_NAME, T_PUNCT } tok_kind;

typedef struct token {
  tok_kind kind;
  int pos;    /* offset of the first character */
  int len;    /* 0 for T_END */
  int32_t i;  /* T_INT */
  float f;    /* T_FLOAT */
} token;

typedef struct parser {
  const char *text;
  int len;
  const char *what;
  const fj_expr_name *names;
  int nnames;
  int pos;       /* where the lexer goes on */
  int prev_end;  /* the end of the last token consumed */
  token tok;     /* the current token */
  fj_expr *e;
  int cap;       /* nodes e has room for */
  char *err;
  size_t errsize;
  int failed;
} parser;

/* The text from pos to end as a message shows it: at most 32 characters,
 * whitespace as spaces so that the message stays one line.  Bytes outside
 * printable ASCII only ever reach here alone (the lexer stops at them). */
static void describe(const parser *p, int pos, int end, char *out, size_t n)
{
  unsigned char c = (unsigned char)p->text[pos];
  if (end <= pos) {
    snprintf(out, n, "unexpected end");
  } else if (c >= 0x7f || c < 0x20) {
    snprintf(out, n, "byte 0x%02x", c);
  } else if (c == '\'' && end == pos + 1) {
    snprintf(out, n, "\"'\"");
  } else {
    /* end > pos here; clamped both ways so that the compiler sees it */
    int len = end - pos > 32 ? 32 : end - pos < 0 ? 0 : end - pos;
    char shown[33];
    for (int k = 0; k < len; k++)
      shown[k] = is_space(p->text[pos + k]) ? ' ' : p->text[pos + k];
    shown[len] = '\0';
    snprintf(out, n, "'%s%s'", shown, end - pos > 32 ? "..." : "");
  }
}

/* Writes "what: <text from pos to end> at column N<rest>" (the first
 * failure only) and returns -1, so that parsers can return its result. */
static int fail_span(parser *p, int pos, int end, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail_span(parser *p, int pos, int end, const char *fmt, ...)
{
  if (p->failed)
    return -1;
  p->failed = 1;
  if (!p->err || !p->errsize)
    return -1;
  char shown[48];
  describe(p, pos, end, shown, sizeof shown);
  int n = snprintf(p->err, p->errsize, "%s: %s at column %d", p->what, shown,
                   pos + 1);
  if (n >= 0 && (size_t)n < p->errsize) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err + n, p->errsize - (size_t)n, fmt, ap);
    va_end(ap);
  }
  return -1;
}

#define fail_tok(p, t, ...) fail_span(p, (t)->pos, (t)->pos + (t)->len, __VA_ARGS__)

/* A message with no token, such as the length's. */
static void fail_plain(parser *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void fail_plain(parser *p, const char *fmt, ...)
{
  p->failed = 1;
  if (!p->err || !p->errsize)
    return;
  int n = snprintf(p->err, p->errsize, "%s: ", p->what);
  if (n >= 0 && (size_t)n < p->errsize) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err + n, p->errsize - (size_t)n, fmt, ap);
    va_end(ap);
  }
}

/* ---- the tokenizer ------------------------------------------------------- */

static int bad_number(parser *p)
{
  return fail_tok(p, &p->tok, " is not a number of the language: an int is "
                              "written 12 or 0xC (no suffix), a float 1.5f");
}

/* Reports a value over INT32_MAX: C would give it a wider type. */
static int int_value(parser *p, int64_t v)
{
  if (v > INT32_MAX)
    return fail_tok(p, &p->tok, " is outside int32's range (the largest "
                                "int is 2147483647)");
  p->tok.kind = T_INT;
  p->tok.i = (int32_t)v;
  return 0;
}

static int hex_number(parser *p, const char *s, int n)
{
  int64_t v = 0;
  for (int k = 2; k < n; k++) {
    if (!is_hex(s[k]))
      return bad_number(p);
    if (v <= INT32_MAX)
      v = v * 16 + (is_digit(s[k]) ? s[k] - '0' : (s[k] | 0x20) - 'a' + 10);
  }
  return int_value(p, v);
}

static int decimal_number(parser *p, const char *s, int n)
{
  if (n > 1 && s[0] == '0')
    return fail_tok(p, &p->tok, ": C reads a leading 0 as octal: drop the "
                                "0s, or write hex (0x...)");
  int64_t v = 0;
  for (int k = 0; k < n && v <= INT32_MAX; k++)
    v = v * 10 + (s[k] - '0');
  return int_value(p, v);
}

/* The n characters at s as a float, read in the C locale whatever the
 * process's (a German locale would stop at the '.'): strtof rounds
 * correctly, as NVRTC does. */
static float parse_float(const char *s, int n)
{
  char buf[FJ_EXPR_LEN_MAX + 1];
  memcpy(buf, s, (size_t)n);
  buf[n] = '\0';
  locale_t c = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
  locale_t old = c ? uselocale(c) : (locale_t)0;
  float f = strtof(buf, NULL);
  if (c) {
    uselocale(old);
    freelocale(c);
  }
  return f;
}

/* Skips digits; returns how many. */
static int digits(const char *s, int n, int *k)
{
  int start = *k;
  while (*k < n && is_digit(s[*k]))
    (*k)++;
  return *k - start;
}

/* A floating literal: digits, a point and an exponent as C has them (a
 * point or an exponent needed), and the f suffix this language demands. */
static int float_number(parser *p, const char *s, int n)
{
  int k = 0, dot = 0, exp = 0;
  int mant = digits(s, n, &k);
  if (k < n && s[k] == '.') {
    dot = 1;
    k++;
    mant += digits(s, n, &k);
  }
  if (mant && k < n && (s[k] == 'e' || s[k] == 'E')) {
    k++;
    if (k < n && (s[k] == '+' || s[k] == '-'))
      k++;
    if (!digits(s, n, &k))
      return bad_number(p);
    exp = 1;
  }
  int suffix = k < n && (s[k] == 'f' || s[k] == 'F');
  if (!mant || k + suffix != n)
    return bad_number(p);
  if (!dot && !exp)
    return fail_tok(p, &p->tok, " is not a C literal: write %.*s.f", k, s);
  if (!suffix)
    return fail_tok(p, &p->tok, ": write %.*sf: a floating literal without "
                    "f is a double in C (slow on the GPU)", n, s);
  float f = parse_float(s, k);
  if (isinf(f))
    return fail_tok(p, &p->tok, " is outside float's range");
  p->tok.kind = T_FLOAT;
  p->tok.f = f;
  return 0;
}

/* A number is read as C's preprocessor reads one (digits, letters, points,
 * and a sign after e or p), so that what C takes as one malformed token --
 * 0x1e+1, 1.2.3 -- is refused whole here too. */
static int lex_number(parser *p, int i)
{
  const char *s = p->text;
  int j = i;
  while (j < p->len) {
    char c = s[j];
    if ((c == 'e' || c == 'E' || c == 'p' || c == 'P') &&
        (s[j + 1] == '+' || s[j + 1] == '-'))
      j += 2;
    else if (is_alpha(c) || is_digit(c) || c == '.')
      j++;
    else
      break;
  }
  p->tok.len = j - i;
  p->pos = j;
  const char *t = s + i;
  int n = j - i;
  if (n > 2 && t[0] == '0' && (t[1] == 'x' || t[1] == 'X'))
    return hex_number(p, t, n);
  int k = 0;
  if (digits(t, n, &k) == n)
    return decimal_number(p, t, n);
  return float_number(p, t, n);
}

static int lex_punct(parser *p, int i)
{
  unsigned char c = (unsigned char)p->text[i];
  p->tok.len = 1;
  if (c >= 0x80)
    return fail_tok(p, &p->tok, ": only ASCII is allowed in an expression");
  if (c < 0x20 || c == 0x7f)
    return fail_tok(p, &p->tok, ": a control character");
  for (size_t k = 0; k < FJ_ARRAY_LEN(puncts); k++) {
    size_t n = strlen(puncts[k].text);
    if (strncmp(p->text + i, puncts[k].text, n) != 0)
      continue;
    p->tok.kind = T_PUNCT;
    p->tok.len = (int)n;
    p->pos = i + (int)n;
    if (puncts[k].refusal)
      return fail_tok(p, &p->tok, "%s", puncts[k].refusal);
    return 0;
  }
  return fail_tok(p, &p->tok, "%s", R_FOREIGN);
}

/* Reads the next token into p->tok; -1 (reported) when it is refused. */
static int lex(parser *p)
{
  int i = p->pos;
  while (i < p->len && is_space(p->text[i]))
    i++;
  memset(&p->tok, 0, sizeof p->tok);
  p->tok.pos = i;
  p->pos = i;
  if (i >= p->len)
    return 0;
  char c = p->text[i];
  if (is_digit(c) || (c == '.' && is_digit(p->text[i + 1])))
    return lex_number(p, i);
  if (!is_alpha(c))
    return lex_punct(p, i);
  int j = i;
  while (j < p->len && (is_alpha(p->text[j]) || is_digit(p->text[j])))
    j++;
  p->tok.kind = T_NAME;
  p->tok.len = j - i;
  p->pos = j;
  return 0;
}

static int advance(parser *p)
{
  p->prev_end = p->tok.pos + p->tok.len;
  return lex(p);
}

static int tok_is(const parser *p, const char *punct)
{
  return p->tok.kind == T_PUNCT &&
         word_is(p->text + p->tok.pos, p->tok.len, punct);
}

/* The current token is not what the grammar wants here. */
static int expected(parser *p, const char *what)
{
  if (tok_is(p, ","))
    return fail_tok(p, &p->tok, ": a comma only separates a call's arguments");
  if (p->tok.kind == T_NAME && is_keyword(p->text + p->tok.pos, p->tok.len))
    return fail_tok(p, &p->tok, "%s", R_KEYWORD);
  return fail_tok(p, &p->tok, ": expected %s", what);
}

/* ---- building the tree --------------------------------------------------- */

static int add_node(parser *p, int op, int is_int, int nkids, const int *kids)
{
  /* Every node takes a token of its own, so this cannot fill up; the check
   * keeps a mistake from writing past the block. */
  if (p->e->n >= p->cap)
    return fail_tok(p, &p->tok, ": the expression has too many parts");
  node *n = &p->e->nodes[p->e->n];
  memset(n, 0, sizeof *n);
  n->op = op;
  n->is_int = is_int;
  n->nkids = nkids;
  n->konst = op != OP_VAR && op != OP_TENSOR;
  for (int k = 0; k < nkids; k++) {
    n->kid[k] = kids[k];
    n->konst &= p->e->nodes[kids[k]].konst;
  }
  return p->e->n++;
}

static int kid_is_int(const parser *p, int k)
{
  return p->e->nodes[k].is_int;
}

static int add_literal(parser *p, const token *t)
{
  int k = add_node(p, t->kind == T_INT ? OP_INT : OP_FLOAT,
                   t->kind == T_INT, 0, NULL);
  if (k >= 0) {
    p->e->nodes[k].i = t->i;
    p->e->nodes[k].f = t->f;
  }
  return k;
}

static int add_int(parser *p, int32_t v)
{
  int k = add_node(p, OP_INT, 1, 0, NULL);
  if (k >= 0)
    p->e->nodes[k].i = v;
  return k;
}

static fj_expr_value eval(const fj_expr *e, int k, const fj_expr_env *env);

/* Whether node k is a constant int, and its value. */
static int const_int(const parser *p, int k, int32_t *v)
{
  const node *n = &p->e->nodes[k];
  if (!n->konst || !n->is_int)
    return 0;
  *v = eval(p->e, k, NULL).i;
  return 1;
}

/* Int arithmetic of two constants that leaves int32 (C leaves it
 * undefined; the kernels and the evaluator wrap around, but a constant
 * that does is a mistake, not a meaning): the exact result, else 0. */
static int const_overflows(int op, int32_t a, int32_t b, int64_t *exact)
{
  switch (op) {
  case OP_ADD: *exact = (int64_t)a + b; break;
  case OP_SUB: *exact = (int64_t)a - b; break;
  case OP_MUL: *exact = (int64_t)a * b; break;
  case OP_DIV: *exact = b ? (int64_t)a / b : 0; break;
  case OP_NEG: *exact = -(int64_t)b; break;
  default: return 0;
  }
  return *exact < INT32_MIN || *exact > INT32_MAX;
}

/* The int operations whose meaning C leaves undefined, refused where the
 * operands are constants: a divisor of 0, a shift count outside 0..31, a
 * result outside int32.  (With operands that vary, the kernels and the
 * evaluator give the results expr.h lists.) */
static int check_const_op(parser *p, const token *t, int op, int l, int r)
{
  int32_t a = 0, b = 0;
  int64_t exact;
  int lc = l >= 0 && const_int(p, l, &a), rc = const_int(p, r, &b);
  if ((op == OP_DIV || op == OP_MOD) && rc && b == 0)
    return fail_tok(p, t, ": an int divided by the constant 0 (x / 0 and "
                          "x %% 0 would give 0; divide by a value that "
                          "cannot be 0)");
  if ((op == OP_SHL || op == OP_SHR) && rc && (b < 0 || b > 31))
    return fail_tok(p, t, ": a shift by %d; an int32 shifts by 0..31", (int)b);
  if ((l < 0 || lc) && rc && const_overflows(op, a, b, &exact))
    return fail_tok(p, t, ": the constant result %lld is outside int32's "
                          "range (-2147483648..2147483647)",
                    (long long)exact);
  return 0;
}

static int add_unary(parser *p, const token *t, int a)
{
  char c = p->text[t->pos];
  int is_int = kid_is_int(p, a);
  if (c == '+')
    return a;  /* C's unary plus changes nothing here (no promotions) */
  if (c == '-' && is_int && check_const_op(p, t, OP_NEG, -1, a))
    return -1;
  if (c == '-')
    return add_node(p, OP_NEG, is_int, 1, &a);
  if (c == '!')
    return add_node(p, OP_NOT, 1, 1, &a);
  if (!is_int)
    return fail_tok(p, t, " needs an int operand, not float");
  return add_node(p, OP_BNOT, 1, 1, &a);
}

static int add_binary(parser *p, const struct binop *b, const token *t, int l,
                      int r)
{
  int ints = kid_is_int(p, l) && kid_is_int(p, r);
  if (b->cls == INTS && !ints)
    return fail_tok(p, t, " needs int operands, not float (cast: (int) x)");
  if (ints && check_const_op(p, t, b->op, l, r))
    return -1;
  int kids[2] = {l, r};
  return add_node(p, b->op, b->cls == ARITH ? ints : 1, 2, kids);
}

/* ---- the parser ------------------------------------------------------------
 * Each function parses one level of C's grammar and returns the index of
 * its node, or -1 once the failure is reported.  depth counts nesting
 * (parentheses, calls, unary operators, casts, the branches of ?:), which
 * bounds the recursion: parse_unary refuses past FJ_EXPR_DEPTH_MAX, and a
 * level costs at most a dozen frames (one per precedence level).
 */

static int parse_ternary(parser *p, int depth);
static int parse_unary(parser *p, int depth);

typedef struct args {
  int n;
  int kid[FJ_EXPR_RANK_MAX];
  int pos[FJ_EXPR_RANK_MAX];  /* where each argument's text starts */
  int end[FJ_EXPR_RANK_MAX];  /* and ends */
} args;

/* A call's arguments, from the '(' (the current token) to the ')'.  Only
 * the first FJ_EXPR_RANK_MAX are kept; a->n counts them all. */
static int parse_args(parser *p, int depth, args *a)
{
  a->n = 0;
  if (advance(p))
    return -1;
  if (tok_is(p, ")"))
    return advance(p);
  for (;;) {
    int pos = p->tok.pos;
    int k = parse_ternary(p, depth + 1);
    if (k < 0)
      return -1;
    if (a->n < FJ_EXPR_RANK_MAX) {
      a->kid[a->n] = k;
      a->pos[a->n] = pos;
      a->end[a->n] = p->prev_end;
    }
    a->n++;
    if (tok_is(p, ")"))
      return advance(p);
    if (!tok_is(p, ","))
      return expected(p, "an operator, ',' or ')'");
    if (advance(p))
      return -1;
  }
}

static const char *plural(int n)
{
  return n == 1 ? "" : "s";
}

static int parse_call(parser *p, int fn, int depth)
{
  token t = p->tok;
  const struct func *f = &funcs[fn];
  if (advance(p))
    return -1;
  if (!tok_is(p, "("))
    return fail_tok(p, &t, " is a function: call it, %s(%s)", f->name,
                    f->nargs == 1 ? "x" : "x, y");
  args a;
  if (parse_args(p, depth, &a))
    return -1;
  if (a.n != f->nargs)
    return fail_tok(p, &t, " takes %d argument%s, not %d", f->nargs,
                    plural(f->nargs), a.n);
  int ints = 0;
  for (int k = 0; k < a.n; k++)
    ints += kid_is_int(p, a.kid[k]);
  if (f->overloaded && ints && ints < a.n)
    return fail_tok(p, &t, " mixes int and float arguments, which CUDA cannot "
                    "resolve: cast one, (float) x, or use %s",
                    fn == FN_MIN ? "fminf" : "fmaxf");
  int k = add_node(p, OP_CALL, f->overloaded && ints == a.n, a.n, a.kid);
  if (k >= 0)
    p->e->nodes[k].ref = fn;
  return k;
}

/* A tensor parameter: a call with one int index per dimension. */
static int parse_tensor(parser *p, const token *t, int name, int depth)
{
  const fj_expr_name *nm = &p->names[name];
  if (!tok_is(p, "("))
    return fail_tok(p, t, " is a tensor of rank %d: read it as %s(%s)",
                    nm->rank, nm->name, index_lists[nm->rank]);
  args a;
  if (parse_args(p, depth, &a))
    return -1;
  if (a.n != nm->rank)
    return fail_tok(p, t, " is a tensor of rank %d: it takes %d ind%s, not %d",
                    nm->rank, nm->rank, nm->rank == 1 ? "ex" : "ices", a.n);
  for (int k = 0; k < a.n; k++)
    if (!kid_is_int(p, a.kid[k]))
      return fail_span(p, a.pos[k], a.end[k], ": an index of %s must be "
                       "int, not float (cast: (int) x)", nm->name);
  int k = add_node(p, OP_TENSOR, nm->is_int != 0, a.n, a.kid);
  if (k >= 0) {
    p->e->nodes[k].ref = name;
    p->e->nodes[k].pos = t->pos;
  }
  return k;
}

/* The caller's names, of one kind, for the unknown-name message. */
static void list_names(const parser *p, fj_buf *b, int params)
{
  int n = 0;
  for (int k = 0; k < p->nnames; k++) {
    const fj_expr_name *nm = &p->names[k];
    if (!nm->name || (nm->rank >= 0) != params)
      continue;
    fj__buf_appendf(b, "%s%s", n++ ? ", " : params ? "parameters " :
                    "variables ", nm->name);
    if (nm->rank > 0 && nm->rank <= FJ_EXPR_RANK_MAX)
      fj__buf_appendf(b, "(%s)", index_lists[nm->rank]);
  }
  if (n)
    fj__buf_appendf(b, "; ");
}

static int unknown_name(parser *p, const token *t)
{
  fj_buf b = {0};
  fj__buf_appendf(&b, " is not a name this expression may use (");
  list_names(p, &b, 0);
  list_names(p, &b, 1);
  fj__buf_appendf(&b, "functions: those of fj_mods in flashjit.h)");
  int rc = fail_tok(p, t, "%s", b.data ? b.data :
                    " is not a name this expression may use");
  fj__buf_free(&b);
  return rc;
}

static int find_name(const parser *p, const token *t)
{
  for (int k = 0; k < p->nnames; k++)
    if (p->names[k].name &&
        word_is(p->text + t->pos, t->len, p->names[k].name))
      return k;
  return -1;
}

/* A name of the caller's: a variable, a scalar or a tensor. */
static int parse_user_name(parser *p, int name, int depth)
{
  token t = p->tok;
  const fj_expr_name *nm = &p->names[name];
  if (nm->rank < -1 || nm->rank > FJ_EXPR_RANK_MAX)
    return fail_tok(p, &t, " has rank %d, outside -1..%d", nm->rank,
                    FJ_EXPR_RANK_MAX);
  if (advance(p))
    return -1;
  if (nm->rank > 0)
    return parse_tensor(p, &t, name, depth);
  if (tok_is(p, "("))
    return fail_tok(p, &t, nm->rank < 0 ?
                    " is a variable, not a function or a tensor" :
                    " is a scalar parameter, not a tensor: use it without (...)");
  int k = add_node(p, OP_VAR, nm->is_int != 0, 0, NULL);
  if (k >= 0)
    p->e->nodes[k].ref = name;
  return k;
}

/* The language's own words first, so that no name of the caller's can
 * change what they mean; then the caller's names. */
static int parse_name(parser *p, int depth)
{
  token t = p->tok;
  const char *s = p->text + t.pos;
  if (word_is(s, t.len, "true") || word_is(s, t.len, "false"))
    return advance(p) ? -1 : add_int(p, s[0] == 't');
  if (word_is(s, t.len, "float") || word_is(s, t.len, "int"))
    return fail_tok(p, &t, " is a type: use it only in a cast, (%.*s) x",
                    t.len, s);
  if (is_keyword(s, t.len))
    return fail_tok(p, &t, "%s", R_KEYWORD);
  int fn = find_func(s, t.len);
  if (fn >= 0)
    return parse_call(p, fn, depth);
  int name = find_name(p, &t);
  if (name < 0)
    return unknown_name(p, &t);
  return parse_user_name(p, name, depth);
}

/* After a '(': OP_TO_FLOAT or OP_TO_INT when a cast's type name follows,
 * else -1. */
static int cast_op(const parser *p)
{
  if (p->tok.kind != T_NAME)
    return -1;
  const char *s = p->text + p->tok.pos;
  if (word_is(s, p->tok.len, "float"))
    return OP_TO_FLOAT;
  if (word_is(s, p->tok.len, "int"))
    return OP_TO_INT;
  return -1;
}

/* A parenthesized expression or a cast, from the '('.  A cast applies to
 * a unary expression, as in C: (int) s * 2 is ((int) s) * 2. */
static int parse_group(parser *p, int depth)
{
  if (advance(p))
    return -1;
  int cast = cast_op(p);
  if (cast >= 0) {
    if (advance(p))
      return -1;
    if (!tok_is(p, ")"))
      return expected(p, "')' to close the cast");
    if (advance(p))
      return -1;
    int a = parse_unary(p, depth + 1);
    return a < 0 ? -1 : add_node(p, cast, cast == OP_TO_INT, 1, &a);
  }
  int e = parse_ternary(p, depth + 1);
  if (e < 0)
    return -1;
  if (!tok_is(p, ")"))
    return expected(p, "an operator or ')'");
  return advance(p) ? -1 : e;
}

static int parse_primary(parser *p, int depth)
{
  token t = p->tok;
  switch (t.kind) {
  case T_INT:
  case T_FLOAT:
    return advance(p) ? -1 : add_literal(p, &t);
  case T_NAME:
    return parse_name(p, depth);
  case T_PUNCT:
    if (tok_is(p, "("))
      return parse_group(p, depth);
    break;
  case T_END:
    break;
  }
  return expected(p, "an operand");
}

static int parse_unary(parser *p, int depth)
{
  token t = p->tok;
  if (depth > FJ_EXPR_DEPTH_MAX)
    return fail_tok(p, &t, ": nested deeper than %d levels", FJ_EXPR_DEPTH_MAX);
  if (t.kind != T_PUNCT || t.len != 1 || !strchr("+-!~", p->text[t.pos]))
    return parse_primary(p, depth);
  if (advance(p))
    return -1;
  int a = parse_unary(p, depth + 1);
  return a < 0 ? -1 : add_unary(p, &t, a);
}

static const struct binop *find_binop(const parser *p)
{
  if (p->tok.kind != T_PUNCT)
    return NULL;
  for (size_t k = 0; k < FJ_ARRAY_LEN(binops); k++)
    if (tok_is(p, binops[k].text))
      return &binops[k];
  return NULL;
}

/* Operators of precedence minprec and higher, left-associative: the loop
 * takes operators of equal precedence, the recursion tighter ones. */
static int parse_binary(parser *p, int minprec, int depth)
{
  int left = parse_unary(p, depth);
  while (left >= 0) {
    const struct binop *b = find_binop(p);
    if (!b || b->prec < minprec)
      break;
    token t = p->tok;
    if (advance(p))
      return -1;
    int right = parse_binary(p, b->prec + 1, depth);
    if (right < 0)
      return -1;
    left = add_binary(p, b, &t, left, right);
  }
  return left;
}

/* cond ? a : b, right-associative; the middle operand is a whole
 * expression, as in C.  Either branch float makes the result float. */
static int parse_ternary(parser *p, int depth)
{
  int kids[3];
  kids[0] = parse_binary(p, 1, depth);
  if (kids[0] < 0 || !tok_is(p, "?"))
    return kids[0];
  if (advance(p))
    return -1;
  kids[1] = parse_ternary(p, depth + 1);
  if (kids[1] < 0)
    return -1;
  if (!tok_is(p, ":"))
    return expected(p, "an operator or ':'");
  if (advance(p))
    return -1;
  kids[2] = parse_ternary(p, depth + 1);
  if (kids[2] < 0)
    return -1;
  int is_int = kid_is_int(p, kids[1]) && kid_is_int(p, kids[2]);
  return add_node(p, OP_COND, is_int, 3, kids);
}

/* What follows a whole expression must be the end. */
static int trailing(parser *p)
{
  if (tok_is(p, ")"))
    return fail_tok(p, &p->tok, " closes no '('");
  if (tok_is(p, ":"))
    return fail_tok(p, &p->tok, " has no '?' before it");
  return expected(p, "an operator or the end");
}

static int blank(const char *s)
{
  while (is_space(*s))
    s++;
  return *s == '\0';
}

/* The text's checks before any token: length and emptiness. */
static int check_text(parser *p, const char *text)
{
  size_t len = strlen(text);
  if (len > FJ_EXPR_LEN_MAX) {
    fail_plain(p, "%zu characters, over the limit of %d", len,
               FJ_EXPR_LEN_MAX);
    return -1;
  }
  if (blank(text)) {
    fail_plain(p, "empty expression");
    return -1;
  }
  p->len = (int)len;
  return 0;
}

fj_expr *fj__expr_parse(const char *text, const char *what,
                        const fj_expr_name *names, int nnames, char *err,
                        size_t errsize)
{
  parser p = {.text = text ? text : "", .what = what ? what : "expression",
              .names = names, .nnames = names ? nnames : 0, .err = err,
              .errsize = errsize};
  if (err && errsize)
    err[0] = '\0';
  if (check_text(&p, p.text))
    return NULL;
  p.cap = p.len + 1;
  p.e = malloc(sizeof *p.e + (size_t)p.cap * sizeof(node));
  if (!p.e) {
    fail_plain(&p, "out of memory");
    return NULL;
  }
  p.e->n = 0;
  int root = lex(&p) ? -1 : parse_ternary(&p, 0);
  if (root >= 0 && p.tok.kind != T_END)
    root = trailing(&p);
  if (root < 0) {
    free(p.e);
    return NULL;
  }
  p.e->root = root;
  /* Give back the room the estimate took and the tree did not need. */
  fj_expr *small = realloc(p.e, sizeof *p.e + (size_t)p.e->n * sizeof(node));
  return small ? small : p.e;
}

void fj__expr_free(fj_expr *e)
{
  free(e);
}

int fj__expr_uses(const fj_expr *e, int name)
{
  for (int i = 0; e && i < e->n; i++)
    if ((e->nodes[i].op == OP_VAR || e->nodes[i].op == OP_TENSOR) &&
        e->nodes[i].ref == name)
      return 1;
  return 0;
}

int fj__expr_subtree_uses(const fj_expr *e, int k, int name)
{
  if (!e || k < 0 || k >= e->n)
    return 0;
  const node *nd = &e->nodes[k];
  if ((nd->op == OP_VAR || nd->op == OP_TENSOR) && nd->ref == name)
    return 1;
  for (int i = 0; i < nd->nkids; i++)
    if (fj__expr_subtree_uses(e, nd->kid[i], name))
      return 1;
  return 0;
}

static int is_var(const fj_expr *e, int k, int name)
{
  return e->nodes[k].op == OP_VAR && e->nodes[k].ref == name;
}

/* Per node, whether its subtree names one of the n variables (name
 * indices; -1 matches none): a malloc'd array, NULL out of memory.  The
 * nodes are in post-order, a node's children before it. */
static unsigned char *uses_of(const fj_expr *e, const int *names, int n)
{
  unsigned char *uses = calloc((size_t)e->n, 1);
  for (int i = 0; uses && i < e->n; i++) {
    const node *nd = &e->nodes[i];
    for (int k = 0; k < n; k++)
      uses[i] |= (unsigned char)is_var(e, i, names[k]);
    for (int k = 0; k < nd->nkids; k++)
      uses[i] |= uses[nd->kid[k]];
  }
  return uses;
}

int fj__expr_reads_using(const fj_expr *e, int name)
{
  unsigned char *uses = e && e->n ? uses_of(e, &name, 1) : NULL;
  if (!uses)
    return 0;
  int reads = 0;
  for (int i = 0; i < e->n; i++)
    reads += e->nodes[i].op == OP_TENSOR && uses[i];
  free(uses);
  return reads;
}

static int in_subtree(const fj_expr *e, int k, int j);

int fj__expr_reads_using_in(const fj_expr *e, int k, int name)
{
  unsigned char *uses = e && e->n && k >= 0 && k < e->n ? uses_of(e, &name, 1) : NULL;
  if (!uses)
    return 0;
  int reads = 0;
  for (int i = 0; i < e->n; i++)
    reads += e->nodes[i].op == OP_TENSOR && uses[i] && in_subtree(e, k, i);
  free(uses);
  return reads;
}

/* Whether node k is q - kv or kv - q. */
static int is_distance(const fj_expr *e, int k, int q, int kv)
{
  const node *nd = &e->nodes[k];
  return nd->op == OP_SUB && ((is_var(e, nd->kid[0], q) && is_var(e, nd->kid[1], kv)) ||
                              (is_var(e, nd->kid[0], kv) && is_var(e, nd->kid[1], q)));
}

int fj__expr_distance_reads(const fj_expr *e, int q, int kv, int s)
{
  const int varying[3] = {q, kv, s};
  unsigned char *uses = e && e->n ? uses_of(e, varying, 3) : NULL;
  if (!uses)
    return 0;
  int reads = 0;
  for (int i = 0; i < e->n; i++) {
    const node *nd = &e->nodes[i];
    if (nd->op != OP_TENSOR)
      continue;
    int ok = 1;
    for (int k = 0; k + 1 < nd->nkids; k++)
      ok &= !uses[nd->kid[k]];
    /* The last index: down the left operands of + and - to the distance,
     * the right ones free of q, kv and s. */
    int x = nd->kid[nd->nkids - 1];
    while (ok && !is_distance(e, x, q, kv) &&
           (e->nodes[x].op == OP_ADD || e->nodes[x].op == OP_SUB)) {
      ok = !uses[e->nodes[x].kid[1]];
      x = e->nodes[x].kid[0];
    }
    reads += ok && is_distance(e, x, q, kv);
  }
  free(uses);
  return reads;
}

/* ---- facts for the kernels ----------------------------------------------
 * What shapes a kernel, read off the tree once (templates/mods.lua takes
 * these facts and never reads the user's text). */

int fj__expr_per_score(const fj_expr *e, int name, const fj_expr_vars *v)
{
  const int varying[2] = {v->kv, v->s};
  unsigned char *uses = e && e->n ? uses_of(e, varying, 2) : NULL;
  if (!uses)
    return 0;
  int found = 0;
  for (int i = 0; i < e->n && !found; i++) {
    const node *nd = &e->nodes[i];
    found = nd->op == OP_TENSOR && nd->ref == name && uses[i];
  }
  free(uses);
  return found;
}

int fj__expr_kvq_sign(const fj_expr *e, int k, const fj_expr_vars *v)
{
  const node *nd = &e->nodes[k];
  if (nd->op != OP_TO_FLOAT || !is_distance(e, nd->kid[0], v->q, v->kv))
    return 0;
  return is_var(e, e->nodes[nd->kid[0]].kid[0], v->kv) ? 1 : -1;
}

/* The product F * (float)(kv - q), where that distance is the
 * expression's only one and F is free of q, kv and s: the family takes F
 * once a row and tile.  Only F on the left, as ALiBi writes it. */
static void find_kvq_scale(const fj_expr *e, const fj_expr_vars *v,
                           const unsigned char *uses, fj_expr_facts *f)
{
  int only = -1, count = 0;
  for (int i = 0; i < e->n; i++)
    if (fj__expr_kvq_sign(e, i, v)) {
      only = i;
      count++;
    }
  f->kvq = count;
  if (count != 1 || fj__expr_kvq_sign(e, only, v) != 1)
    return;
  for (int i = 0; i < e->n; i++) {
    const node *nd = &e->nodes[i];
    if (nd->op == OP_MUL && nd->kid[1] == only && !uses[nd->kid[0]]) {
      f->kvq_scale = i;
      f->kvq_factor = nd->kid[0];
    }
  }
}

/* Whether tensor read k is at a distance (fj__expr_distance_reads' form);
 * fills f's dg fields when it is. */
static int dg_read(const fj_expr *e, int k, const fj_expr_vars *v,
                   const unsigned char *uses, fj_expr_facts *f)
{
  const node *nd = &e->nodes[k];
  for (int i = 0; i + 1 < nd->nkids; i++)
    if (uses[nd->kid[i]])
      return 0;
  /* The last index: down the left operands of + and - to the distance,
   * the right ones (X) free of q, kv and s. */
  int x = nd->kid[nd->nkids - 1];
  while (!is_distance(e, x, v->q, v->kv)) {
    const node *c = &e->nodes[x];
    if ((c->op != OP_ADD && c->op != OP_SUB) || uses[c->kid[1]])
      return 0;
    x = c->kid[0];
  }
  f->dg = k;
  f->dg_name = nd->ref;
  f->dg_rank = nd->nkids;
  f->dg_x = nd->kid[nd->nkids - 1];
  f->dg_dist = x;
  f->dg_sign = is_var(e, e->nodes[x].kid[0], v->q) ? 1 : -1;
  f->dg_pos = nd->pos;
  return 1;
}

/* The first read at a distance in the text's order: the tree in
 * pre-order (a call's name comes before its arguments). */
static int find_dg(const fj_expr *e, int k, const fj_expr_vars *v,
                   const unsigned char *uses, fj_expr_facts *f)
{
  const node *nd = &e->nodes[k];
  if (nd->op == OP_TENSOR && dg_read(e, k, v, uses, f))
    return 1;
  for (int i = 0; i < nd->nkids; i++)
    if (find_dg(e, nd->kid[i], v, uses, f))
      return 1;
  return 0;
}

/* Whether the value depends on nothing but s, h, the parameters and the
 * distance: q and kv only as q - kv or kv - q, never b or hkv. */
static int rel_only(const fj_expr *e, const fj_expr_vars *v)
{
  unsigned char *rel = e->n > 0 ? malloc((size_t)e->n) : NULL;
  if (!rel)
    return 0;
  for (int i = 0; i < e->n; i++) {
    const node *nd = &e->nodes[i];
    int r = 1;
    if (nd->op == OP_VAR)
      r = nd->ref != v->q && nd->ref != v->kv && nd->ref != v->b &&
          nd->ref != v->hkv;
    for (int k = 0; k < nd->nkids; k++)
      r &= rel[nd->kid[k]];
    rel[i] = (unsigned char)(r || is_distance(e, i, v->q, v->kv));
  }
  int r = rel[e->root];
  free(rel);
  return r;
}

/* Where the subtree at node k starts in the text, as near as the tree
 * knows: its first tensor read's name in pre-order, else 0. */
static int first_pos(const fj_expr *e, int k)
{
  const node *nd = &e->nodes[k];
  if (nd->op == OP_TENSOR)
    return nd->pos;
  for (int i = 0; i < nd->nkids; i++) {
    int p = first_pos(e, nd->kid[i]);
    if (p > 0)
      return p;
  }
  return 0;
}

/* Whether node j lies in the subtree at node k. */
static int in_subtree(const fj_expr *e, int k, int j)
{
  if (k == j)
    return 1;
  const node *nd = &e->nodes[k];
  for (int i = 0; i < nd->nkids; i++)
    if (in_subtree(e, nd->kid[i], j))
      return 1;
  return 0;
}

/* The relative table's subtree (fj_expr_facts' rt): the first node in
 * pre-order whose value is a float, whose q and kv appear only in
 * distances (kv - q, q - kv) and which reads none of s, b and hkv
 * (table[i] from rel), which uses a distance (dist), and which costs more
 * per element than the kernels' own forms of it (cost): a function
 * called on something that uses a distance, or a tensor read at indices
 * that use one, other than in dg's form (T(A..., q - kv + X), which the
 * kernels read at a row pointer). */
static int find_rt(const fj_expr *e, int k, const unsigned char *table,
                   const unsigned char *dist, const unsigned char *cost)
{
  const node *nd = &e->nodes[k];
  if (!nd->is_int && table[k] && dist[k] && cost[k])
    return k;
  for (int i = 0; i < nd->nkids; i++) {
    int r = find_rt(e, nd->kid[i], table, dist, cost);
    if (r >= 0)
      return r;
  }
  return -1;
}

static int rel_table(const fj_expr *e, const fj_expr_vars *v,
                     const unsigned char *uses)
{
  unsigned char *m = calloc((size_t)e->n * 4, 1);
  if (!m)
    return -1;
  unsigned char *table = m, *dist = m + e->n, *cost = m + 2 * e->n;
  unsigned char *reads = m + 3 * e->n;  /* tensor reads that use a distance, up to 2 */
  for (int i = 0; i < e->n; i++) {
    const node *nd = &e->nodes[i];
    int t = 1, d = 0, c = 0, r = 0;
    if (nd->op == OP_VAR)
      t = nd->ref != v->q && nd->ref != v->kv && nd->ref != v->b &&
          nd->ref != v->hkv && nd->ref != v->s;
    for (int k = 0; k < nd->nkids; k++) {
      t &= table[nd->kid[k]];
      d |= dist[nd->kid[k]];
      c |= cost[nd->kid[k]];
      r += reads[nd->kid[k]];
    }
    if (is_distance(e, i, v->q, v->kv))
      t = d = 1;
    if (nd->op == OP_CALL && d)
      c = 1;
    if (nd->op == OP_TENSOR && d) {
      fj_expr_facts scratch;
      c |= !dg_read(e, i, v, uses, &scratch);
      r++;
    }
    /* Two reads at distances: the kernels read one at a row pointer. */
    c |= r >= 2;
    table[i] = (unsigned char)t;
    dist[i] = (unsigned char)d;
    cost[i] = (unsigned char)c;
    reads[i] = (unsigned char)(r > 2 ? 2 : r);
  }
  int r = find_rt(e, e->root, table, dist, cost);
  free(m);
  return r;
}

static int facts(const fj_expr *e, const fj_expr_vars *v, fj_expr_facts *f,
                 int want_rt)
{
  memset(f, 0, sizeof *f);
  f->kvq_scale = f->kvq_factor = f->dg = f->dg_name = f->dg_x = f->dg_dist = -1;
  f->rt = -1;
  if (!e)
    return 0;
  const int varying[3] = {v->q, v->kv, v->s};
  unsigned char *uses = uses_of(e, varying, 3);
  if (!uses)
    return -1;
  find_kvq_scale(e, v, uses, f);
  find_dg(e, e->root, v, uses, f);
  f->rt = want_rt && v->s >= 0 ? rel_table(e, v, uses) : -1;
  free(uses);
  /* The table takes dg's place: not beside a distance read outside it
   * (kept as dg); ALiBi's forms inside it are the table's. */
  if (f->rt >= 0 && f->dg >= 0 && !in_subtree(e, f->rt, f->dg))
    f->rt = -1;
  if (f->rt >= 0) {
    f->dg = f->dg_name = f->dg_x = f->dg_dist = -1;
    f->dg_rank = f->dg_sign = f->dg_pos = 0;
    if (f->kvq_scale >= 0 && in_subtree(e, f->rt, f->kvq_scale))
      f->kvq_scale = f->kvq_factor = -1;
    for (int i = 0; i < e->n; i++)
      if (fj__expr_kvq_sign(e, i, v) && in_subtree(e, f->rt, i))
        f->kvq--;
    f->rt_pos = first_pos(e, f->rt);
  }
  f->uses_s = fj__expr_uses(e, v->s);
  f->rel_only = rel_only(e, v);
  return 0;
}

int fj__expr_facts(const fj_expr *e, const fj_expr_vars *v, fj_expr_facts *f)
{
  return facts(e, v, f, 1);
}

int fj__expr_facts_no_rt(const fj_expr *e, const fj_expr_vars *v,
                         fj_expr_facts *f)
{
  return facts(e, v, f, 0);
}

int fj__expr_kid(const fj_expr *e, int k, int i)
{
  return e->nodes[k].kid[i];
}

/* ---- printing as CUDA --------------------------------------------------- */

typedef struct printer {
  const fj_expr *e;
  const fj_expr_print *o;
  fj_buf *out;
  int failed;
} printer;

static void put(printer *pr, const char *s)
{
  if (fj__buf_append(pr->out, s, strlen(s)))
    pr->failed = 1;
}

/* The shortest of %.6g..%.9g that reads back as f (%.9g always does):
 * the literal keeps its value exactly, in the C locale whatever the
 * process's, with a point or an exponent and the f suffix. */
static void float_text(float f, char out[40])
{
  locale_t c = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
  locale_t old = c ? uselocale(c) : (locale_t)0;
  for (int prec = 6; prec <= 9; prec++) {
    snprintf(out, 32, "%.*g", prec, (double)f);
    if (strtof(out, NULL) == f)
      break;
  }
  if (c) {
    uselocale(old);
    freelocale(c);
  }
  if (!strpbrk(out, ".e"))
    strcat(out, ".0");
  strcat(out, "f");
}

static const char *binop_text(int op)
{
  for (size_t k = 0; k < FJ_ARRAY_LEN(binops); k++)
    if (binops[k].op == op)
      return binops[k].text;
  return "?";
}

static void print_node(printer *pr, int k);

/* The int operations C leaves undefined for some operands (overflow, a
 * divisor of 0, a shift count outside 0..31) print as the functions of
 * templates/mods.cuh that give expr.h's results, the evaluator's: NVRTC
 * would otherwise fold them as it likes (kv / 0 == 0 to false). */
static const char *int_fn_text(int op)
{
  switch (op) {
  case OP_ADD: return "fj::iadd(";
  case OP_SUB: return "fj::isub(";
  case OP_MUL: return "fj::imul(";
  case OP_DIV: return "fj::idiv(";
  case OP_MOD: return "fj::imod(";
  case OP_SHL: return "fj::ishl(";
  case OP_SHR: return "fj::ishr(";
  }
  return NULL;
}

/* name(a, b, ...) */
static void print_call(printer *pr, const char *name, const node *nd)
{
  put(pr, name);
  put(pr, "(");
  for (int i = 0; i < nd->nkids; i++) {
    put(pr, i ? ", " : "");
    print_node(pr, nd->kid[i]);
  }
  put(pr, ")");
}

/* (pre kid) */
static void print_unary(printer *pr, const char *pre, int kid)
{
  put(pr, "(");
  put(pr, pre);
  print_node(pr, kid);
  put(pr, ")");
}

/* A node the caller replaces (a substitution, a distance as fj_kvq):
 * its text, else NULL. */
static const char *replaced(const printer *pr, int k)
{
  for (int i = 0; i < pr->o->nsubs; i++)
    if (pr->o->subs[i].node == k)
      return pr->o->subs[i].text;
  int sign = pr->o->kvq ? fj__expr_kvq_sign(pr->e, k, pr->o->kvq) : 0;
  /* (0.f-fj_kvq), not (-fj_kvq): on the diagonal fj_kvq is +0, and
   * (float)(q - kv) is +0 there too, which a division sees. */
  return sign > 0 ? "fj_kvq" : sign < 0 ? "(0.f-fj_kvq)" : NULL;
}

static void print_node(printer *pr, int k)
{
  const node *nd = &pr->e->nodes[k];
  const char *sub = replaced(pr, k);
  char num[40];
  if (sub) {
    put(pr, sub);
    return;
  }
  switch (nd->op) {
  case OP_INT:
    snprintf(num, sizeof num, "%d", (int)nd->i);
    put(pr, num);
    return;
  case OP_FLOAT:
    float_text(nd->f, num);
    put(pr, num);
    return;
  case OP_VAR: put(pr, pr->o->names[nd->ref].name); return;
  case OP_TENSOR: print_call(pr, pr->o->names[nd->ref].name, nd); return;
  case OP_CALL:
    print_call(pr, nd->is_int && nd->ref == FN_ABS && !pr->o->plain ? "fj::iabs"
                                                   : funcs[nd->ref].name, nd);
    return;
  case OP_TO_FLOAT: print_unary(pr, "(float)", nd->kid[0]); return;
  case OP_TO_INT:
    /* cvt.rzi.s32.f32: toward zero, saturating, NaN 0 (C: undefined). */
    if (!pr->e->nodes[nd->kid[0]].is_int && !pr->o->plain) {
      print_call(pr, "__float2int_rz", nd);
      return;
    }
    print_unary(pr, "(int)", nd->kid[0]);
    return;
  case OP_NEG:
    if (nd->is_int && !pr->o->plain) {
      print_call(pr, "fj::ineg", nd);
      return;
    }
    print_unary(pr, "-", nd->kid[0]);
    return;
  case OP_NOT: print_unary(pr, "!", nd->kid[0]); return;
  case OP_BNOT: print_unary(pr, "~", nd->kid[0]); return;
  case OP_COND:
    put(pr, "(");
    print_node(pr, nd->kid[0]);
    put(pr, " ? ");
    print_node(pr, nd->kid[1]);
    put(pr, " : ");
    print_node(pr, nd->kid[2]);
    put(pr, ")");
    return;
  }
  const char *fn = nd->is_int && !pr->o->plain ? int_fn_text(nd->op) : NULL;
  if (fn) {
    put(pr, fn);
    print_node(pr, nd->kid[0]);
    put(pr, ", ");
    print_node(pr, nd->kid[1]);
    put(pr, ")");
    return;
  }
  put(pr, "(");
  print_node(pr, nd->kid[0]);
  put(pr, " ");
  put(pr, binop_text(nd->op));
  put(pr, " ");
  print_node(pr, nd->kid[1]);
  put(pr, ")");
}

int fj__expr_print_cuda(const fj_expr *e, int at, const fj_expr_print *o,
                        fj_buf *out)
{
  if (!e)
    return -1;
  printer pr = {e, o, out, 0};
  print_node(&pr, at < 0 ? e->root : at);
  return pr.failed ? -1 : 0;
}

int fj__expr_is_int(const fj_expr *e)
{
  return e ? e->nodes[e->root].is_int : 0;
}

/* ---- the evaluator ------------------------------------------------------- */

static fj_expr_value vint(int32_t i)
{
  fj_expr_value v = {1, i, 0.0f};
  return v;
}

static fj_expr_value vflt(float f)
{
  fj_expr_value v = {0, 0, f};
  return v;
}

static float to_float(fj_expr_value v)
{
  return v.is_int ? (float)v.i : v.f;
}

/* (int) of a float as the GPU's cvt.rzi.s32.f32: toward zero, saturating,
 * NaN 0 (C leaves the out-of-range cases undefined). */
static int32_t float_to_int(float f)
{
  if (isnan(f))
    return 0;
  if (f >= 2147483648.0f)
    return INT32_MAX;
  if (f <= -2147483648.0f)
    return INT32_MIN;
  return (int32_t)f;
}

static int32_t to_int(fj_expr_value v)
{
  return v.is_int ? v.i : float_to_int(v.f);
}

static fj_expr_value as_type(fj_expr_value v, int is_int)
{
  return is_int ? vint(to_int(v)) : vflt(to_float(v));
}

static int truth(fj_expr_value v)
{
  return v.is_int ? v.i != 0 : v.f != 0.0f;
}

/* Negation wrapping around, as the GPU's (INT32_MIN stays). */
static int32_t wrap_neg(int32_t a)
{
  return (int32_t)(0u - (uint32_t)a);
}

/* int32 arithmetic as the GPU does it, with the cases C leaves undefined
 * given the values expr.h lists: + - * wrap around, x / 0 and x % 0 are 0,
 * shift counts outside 0..31 shift everything out. */
static int32_t int_op(int op, int32_t a, int32_t b)
{
  uint32_t ua = (uint32_t)a, ub = (uint32_t)b;
  int wide = b < 0 || b > 31;
  switch (op) {
  case OP_ADD: return (int32_t)(ua + ub);
  case OP_SUB: return (int32_t)(ua - ub);
  case OP_MUL: return (int32_t)(ua * ub);
  case OP_DIV: return b == 0 ? 0 : b == -1 ? wrap_neg(a) : a / b;
  case OP_MOD: return b == 0 || b == -1 ? 0 : a % b;
  case OP_SHL: return wide ? 0 : (int32_t)(ua << b);
  case OP_SHR:
    if (wide)
      return a < 0 ? -1 : 0;
    return a < 0 ? ~(~a >> b) : a >> b;  /* arithmetic, portably */
  case OP_BAND: return a & b;
  case OP_XOR: return a ^ b;
  case OP_BOR: return a | b;
  }
  return 0;
}

static float float_op(int op, float a, float b)
{
  switch (op) {
  case OP_ADD: return a + b;
  case OP_SUB: return a - b;
  case OP_MUL: return a * b;
  case OP_DIV: return a / b;
  }
  return 0.0f;
}

/* Both int: compared as ints; else both as floats (C converts an int
 * operand to float first), and a double holds every such value exactly. */
static int compare(int op, fj_expr_value l, fj_expr_value r)
{
  int ints = l.is_int && r.is_int;
  double a = ints ? (double)l.i : (double)to_float(l);
  double b = ints ? (double)r.i : (double)to_float(r);
  switch (op) {
  case OP_LT: return a < b;
  case OP_LE: return a <= b;
  case OP_GT: return a > b;
  case OP_GE: return a >= b;
  case OP_EQ: return a == b;
  case OP_NE: return a != b;
  }
  return 0;
}

static float float_fn1(int fn, float x)
{
  switch (fn) {
  case FN_EXPF: return expf(x);
  case FN_EXP2F: return exp2f(x);
  case FN_LOGF: return logf(x);
  case FN_LOG2F: return log2f(x);
  case FN_SQRTF: return sqrtf(x);
  case FN_RSQRTF: return 1.0f / sqrtf(x);
  case FN_TANHF: return tanhf(x);
  case FN_SINF: return sinf(x);
  case FN_COSF: return cosf(x);
  case FN_FABSF:
  case FN_ABS: return fabsf(x);
  case FN_FLOORF: return floorf(x);
  case FN_CEILF: return ceilf(x);
  case FN_ROUNDF: return roundf(x);
  case FN_TRUNCF: return truncf(x);
  case FN_ERFF: return erff(x);
  }
  return 0.0f;
}

/* CUDA's float min and max are fminf and fmaxf. */
static float float_fn2(int fn, float x, float y)
{
  switch (fn) {
  case FN_FMINF:
  case FN_MIN: return fminf(x, y);
  case FN_FMAXF:
  case FN_MAX: return fmaxf(x, y);
  case FN_POWF: return powf(x, y);
  }
  return 0.0f;
}

static int32_t int_fn(int fn, int32_t a, int32_t b)
{
  switch (fn) {
  case FN_ABS: return a < 0 ? wrap_neg(a) : a;
  case FN_MIN: return a < b ? a : b;
  case FN_MAX: return a > b ? a : b;
  }
  return 0;
}

static fj_expr_value eval_call(const fj_expr *e, const node *n,
                               const fj_expr_env *env)
{
  fj_expr_value a = eval(e, n->kid[0], env);
  fj_expr_value b = n->nkids > 1 ? eval(e, n->kid[1], env) : vint(0);
  if (n->is_int)
    return vint(int_fn(n->ref, a.i, b.i));
  if (n->nkids == 1)
    return vflt(float_fn1(n->ref, to_float(a)));
  return vflt(float_fn2(n->ref, to_float(a), to_float(b)));
}

static fj_expr_value eval_tensor(const fj_expr *e, const node *n,
                                 const fj_expr_env *env)
{
  int32_t idx[FJ_EXPR_RANK_MAX] = {0};
  for (int k = 0; k < n->nkids; k++)
    idx[k] = eval(e, n->kid[k], env).i;  /* indices are int: the parser's rule */
  if (!env || !env->read)
    return as_type(vint(0), n->is_int);
  return as_type(env->read(env->user, n->ref, idx), n->is_int);
}

static fj_expr_value eval_binary(const fj_expr *e, const node *n,
                                 const fj_expr_env *env)
{
  fj_expr_value l = eval(e, n->kid[0], env);
  fj_expr_value r = eval(e, n->kid[1], env);
  if (n->op >= OP_LT)
    return vint(compare(n->op, l, r));
  if (n->is_int)
    return vint(int_op(n->op, l.i, r.i));
  return vflt(float_op(n->op, to_float(l), to_float(r)));
}

static fj_expr_value eval(const fj_expr *e, int k, const fj_expr_env *env)
{
  const node *n = &e->nodes[k];
  fj_expr_value a;
  switch (n->op) {
  case OP_INT: return vint(n->i);
  case OP_FLOAT: return vflt(n->f);
  case OP_VAR:
    a = env && env->vals ? env->vals[n->ref] : vint(0);
    return as_type(a, n->is_int);
  case OP_TENSOR: return eval_tensor(e, n, env);
  case OP_CALL: return eval_call(e, n, env);
  case OP_TO_FLOAT: return vflt(to_float(eval(e, n->kid[0], env)));
  case OP_TO_INT: return vint(to_int(eval(e, n->kid[0], env)));
  case OP_NEG:
    a = eval(e, n->kid[0], env);
    return a.is_int ? vint(wrap_neg(a.i)) : vflt(-a.f);
  case OP_NOT: return vint(!truth(eval(e, n->kid[0], env)));
  case OP_BNOT: return vint(~eval(e, n->kid[0], env).i);
  /* C's own && || ?: skip what the expression's would skip. */
  case OP_AND:
    return vint(truth(eval(e, n->kid[0], env)) &&
                truth(eval(e, n->kid[1], env)));
  case OP_OR:
    return vint(truth(eval(e, n->kid[0], env)) ||
                truth(eval(e, n->kid[1], env)));
  case OP_COND:
    a = eval(e, n->kid[truth(eval(e, n->kid[0], env)) ? 1 : 2], env);
    return as_type(a, n->is_int);
  }
  return eval_binary(e, n, env);
}

fj_expr_value fj__expr_eval(const fj_expr *e, const fj_expr_env *env)
{
  return e ? eval(e, e->root, env) : vint(0);
}

fj_expr_value fj__expr_eval_at(const fj_expr *e, int k, const fj_expr_env *env)
{
  return e && k >= 0 && k < e->n ? eval(e, k, env) : vint(0);
}
