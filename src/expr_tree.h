/*
 * expr_tree.h -- the parsed expression's tree, private to the modules that
 * walk it: expr.c (parser, analyses, printer, evaluator) and expr_grad.c
 * (the derivative).  Everyone else goes through expr.h.
 *
 * The tree is one array of nodes in post-order (children before parents),
 * allocated once.
 */
#ifndef FJ_EXPR_TREE_H
#define FJ_EXPR_TREE_H

#include <stdint.h>

#include "expr.h"

enum op_code {
  OP_INT, OP_FLOAT, OP_VAR, OP_TENSOR, OP_CALL, OP_TO_FLOAT, OP_TO_INT,
  OP_NEG, OP_NOT, OP_BNOT, OP_COND, OP_AND, OP_OR,
  /* Binary operators on numbers: arithmetic, int only, then comparisons
   * (eval_binary relies on the comparisons coming last). */
  OP_MUL, OP_DIV, OP_ADD, OP_SUB,
  OP_MOD, OP_SHL, OP_SHR, OP_BAND, OP_XOR, OP_BOR,
  OP_LT, OP_LE, OP_GT, OP_GE, OP_EQ, OP_NE
};

typedef struct node {
  int op;
  int is_int;                  /* the type of the node's value */
  int nkids;
  int kid[FJ_EXPR_RANK_MAX];   /* node indices */
  int ref;                     /* OP_VAR, OP_TENSOR: a name; OP_CALL: a fn */
  int konst;                   /* no variable or tensor below: a constant */
  int pos;                     /* OP_TENSOR: where its name starts in the text */
  int32_t i;                   /* OP_INT */
  float f;                     /* OP_FLOAT */
} node;

struct fj_expr {
  int root;
  int n;
  node nodes[];
};

enum fn {
  FN_EXPF, FN_EXP2F, FN_LOGF, FN_LOG2F, FN_SQRTF, FN_RSQRTF, FN_TANHF,
  FN_SINF, FN_COSF, FN_FABSF, FN_FLOORF, FN_CEILF, FN_ROUNDF, FN_TRUNCF,
  FN_ERFF, FN_FMINF, FN_FMAXF, FN_POWF, FN_ABS, FN_MIN, FN_MAX, FN_COUNT
};

#endif /* FJ_EXPR_TREE_H */
