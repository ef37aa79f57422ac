/*
 * mods.h -- score and mask modifications (fj_mods): their checks, the form
 * that belongs to a variant (expressions, parameters' names, types and
 * ranks, which built-ins are on) and the values that are launch arguments.
 */
#ifndef FJ_MODS_H
#define FJ_MODS_H

#include <stddef.h>
#include <stdint.h>

#include "ctx.h"
#include "expr.h"

/*
 * What a problem's modifications are, analysed once (fj__mods_info): the
 * facts the plan, the variant, the launch and the reference decide by.  A
 * caller takes it once per function (or receives it) and reads fields.
 */
typedef struct fj_mods_info {
  int window;   /* a window bounded on some side */
  int softcap;  /* softcap > 0 */
  int user;     /* an expression or a parameter */
  int blocks;   /* a block mask */
  int sinks;    /* sinks != NULL */
  int on;       /* any of the five */
  /* Checked mode (m->checked, or FLASHJIT_CHECK_BOUNDS=1 in the
   * environment) where it has something to check: a tensor parameter. */
  int checked;
  int block_q, block_kv;  /* a block mask's block sizes (form), 0 without */
  /* Reads of tensor parameters the expressions make per element (calls
   * whose indices use kv): each holds a load in flight.  score_reads
   * counts the score expression's alone (a bias table's: __ldg per score;
   * the mask's share a key column's load); distance_reads, of the score's,
   * those at a distance, T(A..., q - kv + X): a relative-position bias
   * (expr.h's fj__expr_distance_reads); with a relative table
   * (fj__mods_rt_on) the table's read, at a distance, counts in place of
   * its subtree's.  Counting them takes a parse where this thread has not
   * checked the form (mods_memo.h), so only fj__mods_info_reads counts
   * them; fj__mods_info leaves them -1. */
  int reads, score_reads, distance_reads;
} fj_mods_info;

/* Fills out for m (NULL: every fact 0) but its reads (-1): reads of m's
 * fields only, no parse and no hash, cheap enough for every launch. */
void fj__mods_info(const fj_mods *m, fj_mods_info *out);
/* fj__mods_info with the reads counted (NULL m, or no parameters: 0);
 * for the plan, which runs once per problem. */
void fj__mods_info_reads(const fj_mods *m, fj_mods_info *out);

/* Whether the kernels of m's form read a relative table (expr.h's
 * fj_expr_facts rt: a score subtree of the query head and the distance
 * alone, computed once a launch by templates/rel_table.cu into the
 * workspace, mods_kernel.h's FJ_MODS_RT_NAME): the score has one, m is not
 * checked (its reads record what they miss) and leaves a parameter's
 * place free.  A form this thread checked is looked up, not parsed. */
int fj__mods_rt_on(const fj_mods *m);

/* The softcap's fixed shift of the exponentials, in score units, or 0 for
 * the running max (see mods.c); 0 for a NULL m. */
float fj__mods_softcap_shift(const fj_mods *m, fj_dtype dtype);
/* A block size a block mask may have: 64, 128 or 256. */
int fj__block_size_ok(int n);

/* fj_mods_check with the message on ctx (NULL: the thread's), all but the
 * tensors' data pointers (a plan or a variant needs none); those are
 * fj__mods_check_data's, for launches and the reference. */
fj_status fj__mods_check(const fj_ctx *ctx, const fj_mods *m);
/* m's param_grads for a backward named `who`: pointers only for float
 * tensors (FJ_ERR_INVALID_ARG).  NULL m or param_grads: FJ_OK. */
fj_status fj__mods_check_grads(const fj_ctx *ctx, const fj_mods *m,
                               const char *who);
/* Whether parameter i of m has a gradient pointer. */
int fj__mods_has_grad(const fj_mods *m, int i);
fj_status fj__mods_check_data(const fj_ctx *ctx, const fj_mods *m);
/* A block mask against a problem's sizes (batch 1 or batch, heads 1 or
 * heads_q, the block counts its sequences need), and its arrays (not NULL,
 * full ones both or neither, aligned). */
fj_status fj__mods_check_blocks(const fj_ctx *ctx, const fj_mods *m,
                                int batch, int heads_q, int seq_q, int seq_kv);
fj_status fj__mods_check_blocks_data(const fj_ctx *ctx, const fj_mods *m);

/* A hash of the form (0 for mods that are off), and whether two mods have
 * the same form (the same kernel serves both): NULL, or the first part of
 * the form that differs ("the score expression", ...). */
uint64_t fj__mods_hash(const fj_mods *m);
const char *fj__mods_form_diff(const fj_mods *a, const fj_mods *b);

/* A copy of everything an fj_mods says, what its pointers point to
 * included (the texts, the parameters and their names, the block mask's
 * fields; device memory is named by its address only): the problem check
 * and the plan read nothing else of it, so two mods with equal copies are
 * checked and planned alike. */
typedef struct fj_mods_copy {
  fj_mods m;
  fj_mod_param params[FJ_MOD_PARAMS_MAX];
  char names[FJ_MOD_PARAMS_MAX][FJ_MOD_NAME_MAX + 1];
  fj_block_mask block_mask;
  char score[FJ_MOD_EXPR_MAX + 1];
  char mask[FJ_MOD_EXPR_MAX + 1];
} fj_mods_copy;

/* Copies m into c: 0, or -1 where m does not fit (a text or a name over
 * its limit, num_params outside 0..FJ_MOD_PARAMS_MAX: mods the check
 * refuses, never kept). */
int fj__mods_copy(fj_mods_copy *c, const fj_mods *m);
/* Whether m says today what it said when c was copied from it. */
int fj__mods_copy_same(const fj_mods_copy *c, const fj_mods *m);

/* The names an expression may use: b, h, hkv, q, kv, then s for the
 * score, then the parameters in order, so that name index
 * fj__mods_first_param(score) + i is parameter i.  Returns the count. */
#define FJ_MOD_NAMES_MAX (6 + FJ_MOD_PARAMS_MAX)
int fj__mods_names(const fj_mods *m, int score, fj_expr_name *names);
int fj__mods_first_param(int score);

/* A parameter type's name: f32, i32, f16 or bf16. */
const char *fj__mods_type_name(fj_mod_type t);

/* The parameter list as templates/mods.lua reads it, "name:type:rank"
 * joined by ';' (type f32, i32, f16 or bf16); "" for none. */
void fj__mods_param_list(const fj_mods *m, char *buf, size_t size);

/* The launch arguments of the parameters: fj::ModArgs (mods.lua), a
 * scalar in 8 bytes (the value in the first 4), a tensor in 24 (pointer,
 * then 4 int32 extents).  Returns the bytes written (0: no parameters). */
/* oob, the address of checked mode's record (0 outside checked mode:
 * nothing appended), follows the parameters in 8 bytes: 6 words, set by
 * the kernel -- 1 once something is recorded, the parameter's index, 4
 * indices.  The caller gives one exactly where the kernel's form is
 * checked (fj_mods_info's checked). */
#define FJ_MOD_ARGS_MAX (FJ_MOD_PARAMS_MAX * 24 + 8)
#define FJ_MOD_OOB_WORDS 6
size_t fj__mods_args(const fj_mods *m, uint64_t oob,
                     unsigned char out[FJ_MOD_ARGS_MAX]);
/* The message of a recorded read (rec: FJ_MOD_OOB_WORDS words) into buf:
 * "mods.params[1] (bias): read at (3, 5000), outside its extents (16,
 * 4096)". */
void fj__mods_oob_message(const fj_mods *m, const uint32_t *rec, char *buf,
                          size_t size);

#endif /* FJ_MODS_H */
