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
/* Tensor reads (calls) of e whose indices use variable `name`. */
int fj__expr_reads_using(const fj_expr *e, int name);
/* Tensor reads of e at a distance: T(A..., q - kv + X) or T(A..., kv - q
 * + X), with X a chain of + and - (possibly none) and the other indices,
 * like X, free of variables q, kv and s (name indices) -- a
 * relative-position bias, which the kernels read per tile at a row
 * pointer and constant offsets (templates/mods.lua's dg). */
int fj__expr_distance_reads(const fj_expr *e, int q, int kv, int s);
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
 * Evaluates e as the GPU does: float arithmetic in float32 (without the
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

#endif /* FJ_EXPR_H */
