/*
 * expr_grad.h -- the derivative of a score expression with respect to its
 * score s, generated from the parsed tree (expr_grad.c has the rules), for
 * the backward pass.
 *
 * Thread safety: keeps no state; the tree is only read.
 */
#ifndef FJ_EXPR_GRAD_H
#define FJ_EXPR_GRAD_H

#include "expr.h"
#include "util.h"

/*
 * Appends to out d e / d s, with s the variable of name index s, as an
 * expression of the same language whose value is float: printed as
 * fj__expr_print_cuda prints (o's names, substitutions and form apply to
 * the operands it repeats), so that with o->plain it parses back with
 * e's names and evaluates with fj__expr_eval.  An expression that does
 * not depend on s (or only through int parts and floorf, ceilf, roundf,
 * truncf) gives 0.0f.  0, or -1 out of memory (out then holds a part).
 */
int fj__expr_grad_cuda(const fj_expr *e, int s, const fj_expr_print *o,
                       fj_buf *out);

/*
 * The same with respect to the value of the tensor read at node `read`
 * (fj__expr_reads_of), the other reads and s held fixed: how the score
 * changes with the element that read fetches, for a parameter's gradient.
 * -1 where read is not a tensor read of e, or out of memory.
 */
int fj__expr_grad_read_cuda(const fj_expr *e, int read,
                            const fj_expr_print *o, fj_buf *out);

/* Whether the subtree at node `at` reads one of the n variables names
 * (name indices), tensor reads' indices included. */
int fj__expr_node_uses(const fj_expr *e, int at, const int *names, int n);

/* The nodes of e's reads of tensor `name` (a name index), in the tree's
 * post-order: up to max into nodes; returns how many there are. */
int fj__expr_reads_of(const fj_expr *e, int name, int *nodes, int max);

#endif /* FJ_EXPR_GRAD_H */
