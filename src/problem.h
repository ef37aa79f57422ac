/*
 * problem.h -- the checks of a problem that need no context, shared by
 * fj_problem_check and the float64 reference, and a problem's derived
 * facts (problem.c).
 */
#ifndef FJ_PROBLEM_H
#define FJ_PROBLEM_H

#include "ctx.h"

/* Bytes of one element of d. */
int fj__dtype_bytes(fj_dtype d);
/* O's element where o_dtype does not say: dtype's, bf16 for FP8
 * attention (dtype e4m3). */
fj_dtype fj__default_o_dtype(fj_dtype dtype);
/* O's element type: o_dtype, else fj__default_o_dtype(dtype). */
fj_dtype fj__o_dtype(const fj_problem *p);
/* o_dtype against dtype (fj_problem's and fj_variant's rule): 0 or the
 * default, or FP8 attention's bf16, f16 or e4m3; the message names both. */
fj_status fj__check_o_dtype(const fj_ctx *ctx, fj_dtype dtype, fj_dtype o);
/* The problem's head_dim_v with 0 resolved to head_dim: V's and O's
 * columns. */
int fj__problem_dv(const fj_problem *p);
/* Whether V has K's strides: with split head dims, V as the first
 * head_dim_v columns of K's rows (MLA's latent cache, as the mma family
 * reads it). */
int fj__problem_v_in_k(const fj_problem *p);
/* Whether the mma family can read p's V: one head dim, or split head
 * dims with V in K's rows (fj__problem_v_in_k; variant.c's rule). */
int fj__problem_mma_reads_v(const fj_problem *p);

/* The element types and the mask: f16 or bf16 for Q and O, K and V the
 * same or e4m3 (kv_dtype resolved: never 0), a known causal mode.  The
 * message names the field and its value. */
fj_status fj__check_types(const fj_ctx *ctx, fj_dtype dtype, fj_dtype kv_dtype,
                          fj_causal causal);
/* Everything about a problem that needs no context: sizes, the head dim's
 * range, types, mask, scale, strides (none negative, not all left 0 by
 * fj_problem_init's unknown order), every tensor's last element within
 * 64-bit byte offsets, and O's rows apart.  ctx only says whose message it
 * is (NULL: fj_errmsg(NULL)). */
fj_status fj__problem_check_common(const fj_ctx *ctx, const fj_problem *p);
/* FP8 K/V need both scale arrays (the problem's on the device, or the
 * reference's on the host). */
fj_status fj__check_scales(const fj_ctx *ctx, const fj_problem *p,
                           const void *k_scale, const void *v_scale);
/* Whether Q's, K's and V's rows are apart (no two rows of one tensor
 * share an element), as check_strides measures them. */
int fj__problem_rows_apart(const fj_problem *p);

#endif
