/*
 * expr.h -- the expression language of score and mask modifications
 * (fj_mods): the gatekeeper that accepts a user's C expression only when it
 * is a pure expression of the small grammar below, type-checked, before the
 * text is pasted verbatim into generated CUDA; and an evaluator of the
 * parsed tree that computes on the CPU what the GPU computes, for the
 * reference implementation.
 *
 * The grammar: int literals (decimal or hex, no suffix, at most INT32_MAX),
 * float literals with an f suffix (0.5f, 1.f, .5f, 1e-3f), true and false,
 * the names the caller gives, the built-in functions
 *   float, 1 argument: expf exp2f logf log2f sqrtf rsqrtf tanhf sinf cosf
 *                      fabsf floorf ceilf roundf truncf erff
 *   float, 2 arguments: fminf fmaxf powf
 *   int or float (all arguments one type): abs(x), min(x, y), max(x, y)
 * casts (float) and (int), the unary operators + - ! ~, the binary
 * operators of C except assignment and the comma, and ?:, with C's
 * precedence, associativity and types on int32 and float.  Everything else
 * is refused with one line naming the offending token and its column.
 *
 * Thread safety: parsing keeps no state between calls; a parsed tree is
 * never changed, so threads may evaluate one tree at the same time.
 */
#ifndef FJ_EXPR_H
#define FJ_EXPR_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

/* Characters an expression may have (flashjit.h's FJ_MOD_EXPR_MAX). */
#define FJ_EXPR_LEN_MAX 1024
/* How deeply parentheses, calls, unary operators, casts and the branches
 * of ?: may nest; the parser's recursion is bounded by it. */
#define FJ_EXPR_DEPTH_MAX 64
/* The largest rank of a tensor parameter. */
#define FJ_EXPR_RANK_MAX 4

/* A name an expression may use. */
typedef struct fj_expr_name {
  const char *name;
  /* -1: a variable; 0: a scalar parameter; 1..FJ_EXPR_RANK_MAX: a tensor
   * parameter, used only as a call with exactly `rank` int arguments:
   * bias(h, q - kv). */
  int rank;
  /* 1: int valued (the variables b, h, hkv, q, kv; I32 parameters); 0:
   * float (the variable s; F32, F16 and BF16 parameters). */
  int is_int;
} fj_expr_name;

/* A parsed, type-checked expression: one malloc'd block. */
typedef struct fj_expr fj_expr;

/* A value: i when is_int, else f (the other field is 0). */
typedef struct fj_expr_value {
  int is_int;
  int32_t i;
  float f;
} fj_expr_value;

/*
 * Parses and type-checks text.  what names the expression in messages
 * ("score", "mask"; NULL: "expression").  names/nnames say what
 * identifiers mean besides the built-in functions and keywords, which are
 * looked up first: keep names apart from them (fj__expr_reserved).
 *
 * Returns the tree, which the caller frees with fj__expr_free, or NULL
 * with one line (no newline) in err (errsize bytes, truncated to fit; err
 * may be NULL), of the form
 *     score: ';' at column 12: an expression, not a statement
 * Columns count bytes from the start of the text, from 1; a newline counts
 * as one.  Running out of memory gives NULL and "score: out of memory".
 */
fj_expr *fj__expr_parse(const char *text, const char *what,
                        const fj_expr_name *names, int nnames, char *err,
                        size_t errsize);
/* Frees a tree; NULL is a no-op. */
void fj__expr_free(fj_expr *e);
/* Whether the expression reads name index `name` (a variable or a
 * parameter); NULL: 0. */
int fj__expr_uses(const fj_expr *e, int name);
/* Whether the subtree at node k names `name` (a variable or a tensor
 * parameter); k outside e: 0. */
int fj__expr_subtree_uses(const fj_expr *e, int k, int name);
/* Tensor reads (calls) of e whose indices use variable `name`. */
int fj__expr_reads_using(const fj_expr *e, int name);
/* Those of them in the subtree at node k (k outside e: 0). */
int fj__expr_reads_using_in(const fj_expr *e, int k, int name);
/* Tensor reads of e at a distance: T(A..., q - kv + X) or T(A..., kv - q
 * + X), with X a chain of + and - (possibly none) and the other indices,
 * like X, free of variables q, kv and s (name indices) -- a
 * relative-position bias, which the kernels read per tile at a row
 * pointer and constant offsets (templates/mods.lua's dg). */
int fj__expr_distance_reads(const fj_expr *e, int q, int kv, int s);
/* The variables' name indices for the analyses below (-1: not a name of
 * the expression; a mask has no s). */
typedef struct fj_expr_vars {
  int b, h, hkv, q, kv, s;
} fj_expr_vars;

/* Whether e reads tensor `name` at indices that use kv or s, so that the
 * read changes from score to score (a bias table's bias(h, q - kv)); a
 * tensor read only at a row's or a head's indices is shared by a tile's
 * scores. */
int fj__expr_per_score(const fj_expr *e, int name, const fj_expr_vars *v);
/* Whether node k is (float)(kv - q) (1), (float)(q - kv) (-1), or
 * neither (0): ALiBi's distance, which the kernels build per tile. */
int fj__expr_kvq_sign(const fj_expr *e, int k, const fj_expr_vars *v);
/* Child i of node k. */
int fj__expr_kid(const fj_expr *e, int k, int i);

/*
 * What shapes a kernel, read off a score or mask expression's tree.  Node
 * indices (-1: none) name subtrees, which fj__expr_print_cuda prints.
 */
typedef struct fj_expr_facts {
  /* (float)(kv - q) and (float)(q - kv) subtrees (fj__expr_kvq_sign): the
   * kernel passes the distance as the float fj_kvq. */
  int kvq;
  /* The product F * (float)(kv - q) where that is the only kvq subtree
   * and F (kvq_factor, its left operand, any subtree) is free of q, kv
   * and s: ALiBi's slope times the distance, which the family builds as
   * one FMA an element from F taken once a row and tile. */
  int kvq_scale, kvq_factor;
  /* The first tensor read in the text's order at a distance, T(A..., q -
   * kv + X) or T(A..., kv - q + X): X a chain of + and - (possibly none)
   * and the A free of q, kv and s (fj__expr_distance_reads' form).  dg_name
   * is T's name index, dg_rank its rank (the A are the read's first
   * dg_rank - 1 children), dg_x its last index, dg_dist the distance
   * within it (X prints as dg_x with dg_dist as 0), dg_sign +1 for q - kv
   * and -1 for kv - q, dg_pos where the call starts in the text. */
  int dg, dg_name, dg_rank, dg_x, dg_dist, dg_sign, dg_pos;
  /* Whether the expression reads s, and whether its value depends on
   * nothing but s, h, the parameters and kv - q (q and kv appear only as
   * q - kv or kv - q; b and hkv never). */
  int uses_s, rel_only;
  /* A score's relative table: the first subtree in pre-order that is a
   * float of h, the parameters and the distance alone (q and kv only as kv
   * - q or q - kv; no s, b or hkv), uses the distance, and costs more per
   * element than the kernels' own forms -- a function of the distance, or
   * a tensor read at indices that use it other than in dg's form: a
   * bucketed bias bias(h, bkt(kv - q + 128)), a log-distance bias.  Its
   * values per (query head, distance) can be computed once per launch into
   * a table that the kernels read in dg's place (mods_kernel.h).  -1: none,
   * for the mask, and where a read in dg's form lies outside it (dg keeps
   * it).  Where it is taken, dg is -1 and kvq and kvq_scale count only
   * what lies outside it.  rt_pos: where it starts in the text (its first
   * tensor read's name; 0 if it reads none). */
  int rt, rt_pos;
} fj_expr_facts;

/* Fills f for e (NULL: no facts); 0, or -1 out of memory. */
int fj__expr_facts(const fj_expr *e, const fj_expr_vars *v, fj_expr_facts *f);
/* The same without the relative table (rt -1; dg, kvq and kvq_scale as
 * the whole expression has them): for kernels that cannot take it. */
int fj__expr_facts_no_rt(const fj_expr *e, const fj_expr_vars *v,
                         fj_expr_facts *f);

/* A subtree printed as the given text instead (a name the kernel passes). */
typedef struct fj_expr_subst {
  int node;
  const char *text;
} fj_expr_subst;

typedef struct fj_expr_print {
  const fj_expr_name *names;  /* the names the tree was parsed with */
  /* Not NULL: every kvq subtree prints as fj_kvq, or (0.f-fj_kvq) for
   * (float)(q - kv). */
  const fj_expr_vars *kvq;
  const fj_expr_subst *subs;
  int nsubs;
  /* 0 (the kernel's form): the int operations C leaves undefined for some
   * operands (+ - * / % << >>, negation, abs) as the functions of
   * templates/mods.cuh that define them, fj::iadd(a, b) ...; (int) of a
   * float as __float2int_rz.  1: C's operators as the language reads
   * them (a form that parses back, for tests). */
  int plain;
} fj_expr_print;

/*
 * Appends the subtree at node `at` (-1: the whole expression) to out as CUDA:
 * every operator's subexpression in parentheses, so that the text parses
 * back into the same tree whatever the reader's precedence; float literals
 * in the fewest digits that read back as the same float, with f; ints in
 * decimal; true and false as 1 and 0, the language's ints.  The result
 * parses with fj__expr_parse (with the names used) and evaluates the same
 * where no subtree was replaced.  0, or -1 out of memory.
 */
int fj__expr_print_cuda(const fj_expr *e, int at, const fj_expr_print *o,
                        fj_buf *out);

/* The type of the expression's value: 1 int, 0 float (NULL: 0). */
int fj__expr_is_int(const fj_expr *e);

/*
 * Why a parameter may not be called name, as a phrase ("a built-in
 * function", "a C, C++ or CUDA keyword", ...), or NULL when it may: the
 * built-in functions, true, false, float, int, the keywords of C, C++ and
 * CUDA (C++'s alternative operators such as `and` included) and CUDA's
 * built-in variables, and names that C reserves (starting with __ or with
 * _ and a capital).  The variables (s, b, h, ...) are the caller's to add.
 */
const char *fj__expr_reserved(const char *name);

typedef struct fj_expr_env {
  /* Per name index: the value of a variable or scalar parameter (NULL:
   * every one reads 0). */
  const fj_expr_value *vals;
  /* A tensor parameter's element: name index, `rank` indices.  Returns 0
   * (of the parameter's type) when an index is outside the extents: the
   * callback decides that.  NULL: every element reads 0. */
  fj_expr_value (*read)(void *user, int name, const int32_t *idx);
  void *user;
} fj_expr_env;

/*
 * Evaluates e as the GPU does (the kernels print the int operations as
 * templates/mods.cuh's functions that define the same results):
 * float arithmetic in float32 (without the
 * GPU's fused multiply-adds and approximate functions, so results may
 * differ by rounding), int arithmetic on int32 wrapping around.  Where C
 * leaves a result undefined the evaluator picks one and says so: x / 0 and
 * x % 0 give 0, INT32_MIN / -1 gives INT32_MIN and INT32_MIN % -1 gives 0;
 * a shift count outside 0..31 gives 0 for <<, and 0 or -1 (the sign) for
 * >>, which is arithmetic; (int) of a float truncates toward zero,
 * saturating, and NaN gives 0 (the GPU's cvt.rzi.s32.f32).  && and ||
 * short-circuit and ?: evaluates only the chosen branch, so a tensor read
 * they skip never reaches env->read.  A value from vals or read of the
 * other type than the name's is converted.  e NULL gives int 0.
 * Recursive: at most a few hundred frames deep, since the tree's depth is
 * bounded by FJ_EXPR_LEN_MAX.
 */
fj_expr_value fj__expr_eval(const fj_expr *e, const fj_expr_env *env);
/* fj__expr_eval of the subtree at node k (a node index of e's facts);
 * k outside e gives int 0. */
fj_expr_value fj__expr_eval_at(const fj_expr *e, int k, const fj_expr_env *env);

#endif /* FJ_EXPR_H */
