/*
 * reference.h -- host number formats: f16, bf16 and e4m3 to and from float
 * with round-to-nearest-even; the checks of a problem that need no context,
 * shared by fj_problem_check and the float64 reference (which is public:
 * fj_reference_fwd, fj_reference_bwd; its float64-input path is the
 * tests').
 */
#ifndef FJ_REFERENCE_H
#define FJ_REFERENCE_H

#include <stdint.h>

#include "ctx.h"

float fj__half_to_float(uint16_t h);
uint16_t fj__float_to_half(float f);
float fj__bf16_to_float(uint16_t h);
uint16_t fj__float_to_bf16(float f);
float fj__e4m3_to_float(uint8_t v);
uint8_t fj__float_to_e4m3(float f);
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

/* How many threads the calling thread's last fj_reference_fwd or _bwd
 * (or their float64 forms) spread its (batch, head) items over: up to
 * FLASHJIT_REFERENCE_THREADS (1-64), else the online processors up to
 * 16, fewer where their scratch would pass 1 GiB; the backward keeps to
 * one where items add into the same elements (sinks' or parameters'
 * gradients, pages or rows that strides share, a packed sequence's used
 * keys past its own). */
int fj__reference_last_threads(void);

/* fj_reference_fwd (all rows) and fj_reference_bwd on float64 inputs --
 * q, k, v and dout as double in p's strides, whatever p's dtype says --
 * with float64 gradients (dsinks: double [heads_q], may be NULL): for
 * checks by finite differences, which need inputs finer than 16 bits.
 * Messages name these functions. */
fj_status fj__reference_fwd64(const fj_problem *p, const double *q,
                              const double *k, const double *v, double *out,
                              double *out_lse);
fj_status fj__reference_bwd64(const fj_problem *p, const double *q,
                              const double *k, const double *v,
                              const double *dout, double *dq, double *dk,
                              double *dv, double *dsinks);

/* fj__reference_bwd64's gradients of one part of the keys of a merged
 * attention (a ring step over one shard, a split; fj_attention_merge):
 * with P = exp(S - lse) from the merged row's log-sum-exp and Delta =
 * dout . o from the merged O, instead of the part's own, as
 * fj_attention_bwd computes them when given the merged O and LSE.  The
 * parts' gradients then sum to the merged attention's.  o: float64 in
 * p->o_stride (as dout); lse: float64 [batch][heads_q][seq_q]; a row whose
 * lse is -inf adds nothing.  No sinks' gradient. */
fj_status fj__reference_bwd_part64(const fj_problem *p, const double *q,
                                   const double *k, const double *v,
                                   const double *dout, const double *o,
                                   const double *lse, double *dq, double *dk,
                                   double *dv);

#endif /* FJ_REFERENCE_H */
