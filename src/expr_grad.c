/*
 * expr_grad.c -- the derivative of a score expression with respect to its
 * score s, generated symbolically from the parsed tree as an expression of
 * the same language (expr.h), for the backward pass: dS is multiplied by
 * it where the forward applied the expression.  The same rules give the
 * derivative with respect to the value one tensor read fetches (that read
 * as the variable, s and every other read held fixed), from which a
 * parameter's gradient is built.
 *
 * The rules, node by node (u, v a node's operands; du, dv their
 * derivatives):
 *   s: 1; literals, other variables, parameters and tensor reads: 0;
 *   every int-valued node: 0 (the int parts have no derivative: (int)s,
 *   comparisons, && || !, the int operators);
 *   (float) u: du;  -u: -du;  c ? u : v: c ? du : dv (the branch taken);
 *   u + v, u - v: du + dv, du - dv;  u * v: du v + u dv;
 *   u / v: (du - (u / v) dv) / v;
 *   expf exp2f logf log2f sqrtf rsqrtf tanhf sinf cosf erff: f'(u) du;
 *   fabsf, float abs: u < 0 ? -du : du;
 *   fminf, float min: u <= v (or v NaN, which fminf passes over) ? du : dv,
 *   fmaxf, float max likewise with >=;
 *   powf(u, v): v powf(u, v - 1) du + powf(u, v) logf(u) dv;
 *   floorf ceilf roundf truncf: 0, their derivative wherever they have one
 *   (they step at the integers, and a gradient through a step is 0 almost
 *   everywhere).
 * Subtrees whose derivative is 0 are left out of sums and products, so the
 * result reads like a hand-written one for small expressions.  Operands
 * that appear as values print through fj__expr_print_cuda with the
 * caller's options (the kernel's substitutions included), an int operand
 * cast to float so that the derivative is float throughout.  The text is
 * at most a few times the expression's times its depth.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expr.h"
#include "expr_grad.h"
#include "expr_tree.h"

typedef struct grad {
  const fj_expr *e;
  const fj_expr_print *o;
  fj_buf *out;
  unsigned char *zero;  /* per node: its derivative is identically 0 */
  int s;                /* the name index of the variable s, or -1 */
  int read;             /* or the node of a tensor read, or -1 */
  int failed;
} grad;

static void put(grad *g, const char *text)
{
  if (fj__buf_append(g->out, text, strlen(text)))
    g->failed = 1;
}

/* Node k's value, as float: an int operand becomes (float)(...). */
static void value(grad *g, int k)
{
  int cast = g->e->nodes[k].is_int;
  put(g, cast ? "((float)" : "");
  if (fj__expr_print_cuda(g->e, k, g->o, g->out))
    g->failed = 1;
  put(g, cast ? ")" : "");
}

/* Whether node k is the variable differentiated by: s, or the read. */
static int is_s(const grad *g, int k)
{
  if (g->read >= 0)
    return k == g->read;
  return g->e->nodes[k].op == OP_VAR && g->e->nodes[k].ref == g->s;
}

static int steps(int fn)
{
  return fn == FN_FLOORF || fn == FN_CEILF || fn == FN_ROUNDF ||
         fn == FN_TRUNCF;
}

/* Whether node k's derivative is 0, its children's already known. */
static int zero_of(const grad *g, int k)
{
  const node *nd = &g->e->nodes[k];
  if (nd->is_int)
    return 1;
  if (is_s(g, k))
    return 0;
  switch (nd->op) {
  case OP_VAR: case OP_INT: case OP_FLOAT: case OP_TENSOR: return 1;
  case OP_COND: return g->zero[nd->kid[1]] && g->zero[nd->kid[2]];
  case OP_CALL:
    if (steps(nd->ref))
      return 1;
    break;
  }
  for (int i = 0; i < nd->nkids; i++)
    if (!g->zero[nd->kid[i]])
      return 0;
  return 1;
}

static void deriv(grad *g, int k);

/* d(k), or 0.0f where it is 0. */
static void deriv_or_zero(grad *g, int k)
{
  if (g->zero[k])
    put(g, "0.0f");
  else
    deriv(g, k);
}

/* (pre du post) * d(u), the chain rule: just the factor where u is s. */
static void chain(grad *g, int u, void (*factor)(grad *, int, int), int fn)
{
  if (is_s(g, u)) {
    factor(g, u, fn);
    return;
  }
  put(g, "(");
  factor(g, u, fn);
  put(g, " * ");
  deriv(g, u);
  put(g, ")");
}

/* f'(u) of the one-argument functions, @ standing for u. */
static void factor1(grad *g, int u, int fn)
{
  static const struct { int fn; const char *text; } rules[] = {
    {FN_EXPF, "expf(@)"},
    {FN_EXP2F, "(0.693147182f * exp2f(@))"},
    {FN_LOGF, "(1.0f / @)"},
    {FN_LOG2F, "(1.44269502f / @)"},
    {FN_SQRTF, "(0.5f / sqrtf(@))"},
    {FN_RSQRTF, "((-0.5f * rsqrtf(@)) / @)"},
    {FN_TANHF, "(1.0f - (tanhf(@) * tanhf(@)))"},
    {FN_SINF, "cosf(@)"},
    {FN_COSF, "(-sinf(@))"},
    {FN_ERFF, "(1.12837917f * expf((-(@ * @))))"},
    {FN_FABSF, "((@ < 0.0f) ? -1.0f : 1.0f)"},
    {FN_ABS, "((@ < 0.0f) ? -1.0f : 1.0f)"},
  };
  for (size_t i = 0; i < FJ_ARRAY_LEN(rules); i++) {
    if (rules[i].fn != fn)
      continue;
    for (const char *c = rules[i].text; *c; c++) {
      if (*c == '@') {
        value(g, u);
      } else if (fj__buf_append(g->out, c, 1)) {
        g->failed = 1;
      }
    }
    return;
  }
  g->failed = 1;  /* a function the rules above lack: never generated */
}

/* fminf/fmaxf (and float min/max): the derivative of the operand taken. */
static void deriv_minmax(grad *g, const node *nd, int is_min)
{
  int u = nd->kid[0], v = nd->kid[1];
  put(g, "(((");
  value(g, u);
  put(g, is_min ? " <= " : " >= ");
  value(g, v);
  put(g, ") || (");
  value(g, v);
  put(g, " != ");
  value(g, v);
  put(g, ")) ? ");
  deriv_or_zero(g, u);
  put(g, " : ");
  deriv_or_zero(g, v);
  put(g, ")");
}

/* powf(u, v): v powf(u, v - 1) du + powf(u, v) logf(u) dv. */
static void deriv_pow(grad *g, const node *nd)
{
  int u = nd->kid[0], v = nd->kid[1], both = !g->zero[u] && !g->zero[v];
  put(g, both ? "(" : "");
  if (!g->zero[u]) {
    put(g, "((");
    value(g, v);
    put(g, " * powf(");
    value(g, u);
    put(g, ", (");
    value(g, v);
    put(g, " - 1.0f))) * ");
    deriv(g, u);
    put(g, ")");
  }
  put(g, both ? " + " : "");
  if (!g->zero[v]) {
    put(g, "((powf(");
    value(g, u);
    put(g, ", ");
    value(g, v);
    put(g, ") * logf(");
    value(g, u);
    put(g, ")) * ");
    deriv(g, v);
    put(g, ")");
  }
  put(g, both ? ")" : "");
}

static void deriv_call(grad *g, const node *nd)
{
  switch (nd->ref) {
  case FN_FMINF: case FN_MIN: deriv_minmax(g, nd, 1); return;
  case FN_FMAXF: case FN_MAX: deriv_minmax(g, nd, 0); return;
  case FN_POWF: deriv_pow(g, nd); return;
  }
  chain(g, nd->kid[0], factor1, nd->ref);
}

/* du + dv or du - dv, a 0 term left out. */
static void deriv_sum(grad *g, const node *nd)
{
  int u = nd->kid[0], v = nd->kid[1], minus = nd->op == OP_SUB;
  if (g->zero[v]) {
    deriv(g, u);
    return;
  }
  if (g->zero[u]) {
    put(g, minus ? "(-" : "");
    deriv(g, v);
    put(g, minus ? ")" : "");
    return;
  }
  put(g, "(");
  deriv(g, u);
  put(g, minus ? " - " : " + ");
  deriv(g, v);
  put(g, ")");
}

/* One term of a product's derivative: the other operand times d(k) (just
 * the operand where k is s). */
static void times(grad *g, int other, int k)
{
  if (is_s(g, k)) {
    value(g, other);
    return;
  }
  put(g, "(");
  value(g, other);
  put(g, " * ");
  deriv(g, k);
  put(g, ")");
}

static void deriv_mul(grad *g, const node *nd)
{
  int u = nd->kid[0], v = nd->kid[1], both = !g->zero[u] && !g->zero[v];
  put(g, both ? "(" : "");
  if (!g->zero[u])
    times(g, v, u);
  put(g, both ? " + " : "");
  if (!g->zero[v])
    times(g, u, v);
  put(g, both ? ")" : "");
}

/* (du - (u / v) dv) / v: divided by v twice rather than by v * v, which
 * leaves float's range sooner. */
static void deriv_div(grad *g, const node *nd)
{
  int u = nd->kid[0], v = nd->kid[1];
  put(g, "(");
  if (g->zero[v]) {
    deriv(g, u);
  } else {
    put(g, "(");
    if (!g->zero[u]) {
      deriv(g, u);
      put(g, " - ");
    } else {
      put(g, "-");
    }
    put(g, "((");
    value(g, u);
    put(g, " / ");
    value(g, v);
    put(g, ") * ");
    deriv(g, v);
    put(g, "))");
  }
  put(g, " / ");
  value(g, v);
  put(g, ")");
}

/* Appends d(k) for a node whose derivative is not 0. */
static void deriv(grad *g, int k)
{
  const node *nd = &g->e->nodes[k];
  if (is_s(g, k)) {
    put(g, "1.0f");
    return;
  }
  switch (nd->op) {
  case OP_TO_FLOAT: deriv(g, nd->kid[0]); return;
  case OP_NEG:
    put(g, "(-");
    deriv(g, nd->kid[0]);
    put(g, ")");
    return;
  case OP_COND:
    put(g, "(");
    if (fj__expr_print_cuda(g->e, nd->kid[0], g->o, g->out))
      g->failed = 1;
    put(g, " ? ");
    deriv_or_zero(g, nd->kid[1]);
    put(g, " : ");
    deriv_or_zero(g, nd->kid[2]);
    put(g, ")");
    return;
  case OP_CALL: deriv_call(g, nd); return;
  case OP_ADD: case OP_SUB: deriv_sum(g, nd); return;
  case OP_MUL: deriv_mul(g, nd); return;
  case OP_DIV: deriv_div(g, nd); return;
  }
  g->failed = 1;  /* an int node, whose derivative zero_of says is 0 */
}

static int derive(const fj_expr *e, int s, int read, const fj_expr_print *o,
                  fj_buf *out)
{
  if (!e || e->n < 1)
    return -1;
  grad g = {e, o, out, calloc((size_t)e->n, 1), s, read, 0};
  if (!g.zero)
    return -1;
  for (int k = 0; k < e->n; k++)
    g.zero[k] = (unsigned char)zero_of(&g, k);
  deriv_or_zero(&g, e->root);
  free(g.zero);
  return g.failed ? -1 : 0;
}

int fj__expr_grad_cuda(const fj_expr *e, int s, const fj_expr_print *o,
                       fj_buf *out)
{
  return derive(e, s, -1, o, out);
}

int fj__expr_grad_read_cuda(const fj_expr *e, int read,
                            const fj_expr_print *o, fj_buf *out)
{
  if (!e || read < 0 || read >= e->n || e->nodes[read].op != OP_TENSOR)
    return -1;
  return derive(e, -1, read, o, out);
}

int fj__expr_node_uses(const fj_expr *e, int at, const int *names, int n)
{
  const node *nd = &e->nodes[at];
  for (int i = 0; nd->op == OP_VAR && i < n; i++)
    if (nd->ref == names[i])
      return 1;
  for (int k = 0; k < nd->nkids; k++)
    if (fj__expr_node_uses(e, nd->kid[k], names, n))
      return 1;
  return 0;
}

int fj__expr_reads_of(const fj_expr *e, int name, int *nodes, int max)
{
  int n = 0;
  for (int k = 0; e && k < e->n; k++) {
    if (e->nodes[k].op != OP_TENSOR || e->nodes[k].ref != name)
      continue;
    if (n < max)
      nodes[n] = k;
    n++;
  }
  return n;
}
