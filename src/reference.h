/*
 * reference.h -- the float64 reference's internal entries (the public ones:
 * fj_reference_fwd, fj_reference_bwd; the float64-input path is the
 * tests').
 */
#ifndef FJ_REFERENCE_H
#define FJ_REFERENCE_H

#include <stdint.h>

#include "ctx.h"

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
