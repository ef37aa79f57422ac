/*
 * mods_kernel.h -- a problem's expressions as a kernel takes them: the
 * facts that shape it (expr.h's fj_expr_facts, with checked mode's rules
 * applied) and the expressions printed as CUDA from their trees, with the
 * subtrees the family computes per tile (ALiBi's distance, its product
 * with the slope, a distance table's read) as the names it passes.  The
 * templates (templates/mods.lua) receive these as the parameter mod_facts
 * and never read the user's text.
 *
 * Thread safety: the functions keep no state; each fills the caller's
 * struct.
 */
#ifndef FJ_MODS_KERNEL_H
#define FJ_MODS_KERNEL_H

#include <stddef.h>

#include "mods.h"
#include "template.h"

/* Bytes an expression printed as CUDA may take: an operator of two
 * characters with its operand ("+1") prints as at most a function's name
 * of 9 characters, a comma, a space and a parenthesis (fj::iadd(x, 1)),
 * under seven times the text. */
#define FJ_MODS_CUDA_MAX (8 * FJ_MOD_EXPR_MAX + 64)

/* Bytes a score expression's derivative as CUDA may take: it repeats
 * operands, a few times the expression's text (expr_grad.c). */
#define FJ_MODS_GRAD_MAX (3 * FJ_MODS_CUDA_MAX)

/* Reads of parameters with gradients (fj_mods.param_grads) a backward
 * kernel takes: each adds to its parameter's gradient with an atomic. */
#define FJ_MODS_PGRADS_MAX 8

/* One read of a float tensor parameter with a gradient, as CUDA: the
 * score's derivative with respect to the value it fetches (expr_grad.c)
 * and its indices, printed without the family's substitutions. */
typedef struct fj_mods_pgrad {
  int param, rank;
  /* The indices use none of q, kv and s: the same element for a whole
   * (batch, query head) -- a slope per head -- which a kernel sums over
   * its scores before one atomic. */
  int uniform;
  const char *d, *idx[FJ_EXPR_RANK_MAX];
} fj_mods_pgrad;

/* One expression (score or mask) as the kernel takes it. */
typedef struct fj_mods_kexpr {
  int on;             /* the expression is given */
  /* The tree's facts; in checked mode (fj_mods_info's checked), whose reads
   * record what they miss, and for the mask, kvq_scale and dg are -1. */
  fj_expr_facts f;
  const char *text1;  /* the user's text on one line (comments only) */
  /* The expression as CUDA: (float)(kv - q) as fj_kvq, (float)(q - kv) as
   * (0.f-fj_kvq), kvq_scale's product as fj_skvq, dg's read as fj_dg. */
  const char *cuda;
  const char *factor;  /* kvq_scale's F as CUDA, or NULL */
  /* The score's derivative with respect to s as CUDA (expr_grad.c), with
   * the same substitutions as cuda, for the backward; NULL for the mask,
   * or where it is over FJ_MODS_GRAD_MAX bytes (the backward refuses). */
  const char *grad;
  /* The score's reads of parameters with gradients (npg of them), or
   * npg -1 where they are more than FJ_MODS_PGRADS_MAX or their CUDA does
   * not fit (the backward refuses). */
  fj_mods_pgrad pg[FJ_MODS_PGRADS_MAX];
  int npg;
  /* dg's read as CUDA (the call as written), X, and the indices before
   * the last; its parameter's index (0-based) and where the call starts
   * in the user's text (line and column from 1). */
  const char *dg_call, *dg_x, *dg_uniform[FJ_EXPR_RANK_MAX - 1];
  int dg_param, dg_line, dg_col;
  /* The relative table (f.rt >= 0, where fj__mods_rt_on): its subtree as
   * CUDA, of h, q, kv and the parameters, which templates/rel_table.cu
   * evaluates per query head and distance into the table; the kernels
   * read the table in dg's place (the dg pieces above name it: parameter
   * FJ_MODS_RT_NAME, index m->num_params). */
  const char *rt_cuda;
} fj_mods_kexpr;

/* The relative table's parameter: after the user's (whose names may not
 * start with fj), a float32 tensor [heads_q][Q + K - 1] in the workspace,
 * Q seq_q rounded up to FJ_MODS_RT_PAD and K seq_kv rounded up to it and
 * one more FJ_MODS_RT_PAD (the mma family's tiles read a tile past the
 * keys), the distance kv - q at column kv - q + Q - 1: every read of tiles
 * of up to FJ_MODS_RT_PAD rows and keys lies in it (fj__mods_table_inside
 * says so at once). */
#define FJ_MODS_RT_NAME "fj_rt"
#define FJ_MODS_RT_PAD 256

typedef struct fj_mods_kform {
  fj_mods_kexpr score, mask;
  /* Per parameter: a tensor the score expression reads at indices that
   * change from score to score (fj__expr_per_score: they use kv or s). */
  int per_score[FJ_MOD_PARAMS_MAX];
  char arena[5 * FJ_MODS_CUDA_MAX + 2 * FJ_MODS_GRAD_MAX];  /* the texts above */
  size_t used;
} fj_mods_kform;

/* Fills k for m (m's expressions passed fj__mods_check; NULL m: nothing
 * on).  0, or -1 with one line in err: out of memory, or an expression
 * the parser refuses. */
int fj__mods_kform(const fj_mods *m, fj_mods_kform *k, char *err,
                   size_t errsize);

/* The template parameter mod_facts: a table
 *   { score = { text1, cuda, kvq, kvq_scale, dg = { param, sign, x,
 *               uniform = {...}, call, line, col }, uses_s, rel_only,
 *               grad, pgrads = { { param, rank, uniform, d, idx = {...} },
 *               ... } },
 *     mask = { text1, cuda }, params = { { name, type, rank, index,
 *     shared }, ... } }
 * (score, mask absent where not given). */
#define FJ_MODS_KPARAMS (56 + 6 * FJ_MOD_PARAMS_MAX + 10 * FJ_MODS_PGRADS_MAX)
typedef struct fj_mods_kparam {
  fj_mods_kform form;
  fj_param kids[FJ_MODS_KPARAMS];
  size_t n;
  fj_param param;  /* the table, key "mod_facts" */
} fj_mods_kparam;

/* Fills out for m: 0, or -1 with one line in err (fj__mods_kform's). */
int fj__mods_kparam(const fj_mods *m, fj_mods_kparam *out, char *err,
                    size_t errsize);

/*
 * Whether every read of p's score expression's distance table (its
 * T(A..., q - kv + X) read, fj_expr_facts' dg) that a kernel's tiles make
 * lies within T's extents: the indices A and X evaluated on the host for
 * every batch index and head they name (q and kv 0, the scalar
 * parameters' values), the last index X + (q - kv) over the query
 * positions 0..q_end - 1 and keys 0..kv_end - 1 that the kernel's tiles
 * reach (a last tile's padding included).  1 proves it: the kernel may
 * read the table without checking each element (fj_variant.table_inside).
 * 0 where it fails or cannot be shown: no such read, checked mode, or an
 * index that reads a tensor (its value is on the device).  A thread
 * parses each score expression once (a few trees kept), and remembers its
 * last proofs by what they read (the expression, the parameters' extents
 * and values, these sizes): 2 us a proof, under 1 us repeated.
 */
int fj__mods_table_inside(const fj_problem *p, long long q_end, long long kv_end);
/* FJ_MODS_RT_PAD's multiple of n: the relative table's Q, and K less a
 * FJ_MODS_RT_PAD. */
long long fj__mods_rt_pad(long long n);
/* FJ_ERR_INVALID_ARG for a launch whose `what` ("variant", "...: the
 * plan") claims table_inside where the problem fails the proof; `setter`
 * names the call that sets it from the problem. */
fj_status fj__mods_table_inside_fail(const fj_ctx *ctx, const char *what,
                                     const char *setter);

#endif /* FJ_MODS_KERNEL_H */
