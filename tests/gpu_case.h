/*
 * gpu_case.h -- one attention case on a GPU against the float64 reference
 * (test_gpu.c): random inputs, poisoned outputs, the reference on several
 * threads, the verdict.  Shared by the GPU test files.
 */
#ifndef FJ_TEST_GPU_CASE_H
#define FJ_TEST_GPU_CASE_H

#include <stddef.h>
#include <stdint.h>

#include "flashjit.h"

typedef struct gpu_case {
  fj_problem p;
  float input_scale;           /* Q is multiplied by it (large logits) */
  const fj_mods *host_mods;    /* the reference's p.mods (host tensors);
                                  NULL: p.mods */
  void *q, *k, *v, *o;         /* host copies, in the problem's dtypes */
  float *lse, *ks, *vs, *qs;   /* FP8 scales, host (qs: dtype e4m3) */
  size_t nq, nk, nlse, qbytes, kvbytes;  /* qbytes: O's buffer (Q's and
                                            O's extents, the larger) */
  void *dq, *dk, *dv, *dout, *dks, *dvs, *dqs;
  float *dlse;
  int capture;                 /* 1: the call is captured into a CUDA graph
                                  on a stream of its own, then the graph
                                  launched (the stream argument unused) */
  size_t nv, vbytes;           /* V: head_dim_v columns (p.head_dim_v) */
  int latent;                  /* 1: V is K's rows (their first head_dim_v
                                  columns; v = k, v_stride = k_stride):
                                  MLA's latent cache */
  int o_gaps;                  /* 1: every element of O's buffer outside
                                  O's rows (a gap o_stride leaves between
                                  them) must keep its poison */
} gpu_case;

/* Makes c's inputs (from seed), launches it with v (NULL: the library's
 * choice) on stream, checks O and the log-sum-exp against the reference,
 * prints one line with label, notes the error under axis, frees the
 * inputs.  0: right; 1: wrong or failed (printed). */
int fjt_gpu_run(fj_ctx *ctx, gpu_case *c, const fj_variant *v, void *stream,
                uint64_t *seed, const char *label, const char *axis);
/* The largest error per axis since the last call. */
void fjt_gpu_print_worst(void);

/* Split head dims (test_head_dim_v.c): p as fj_problem_init makes it, with
 * head_dim_v dv and V and O contiguous in that order for it; and the
 * explicit wgmma variants gpu_head_dim_v runs (head_dim_v_compile compiles
 * them without a GPU), up to max into out, how many. */
void fjt_split_problem(fj_problem *p, int b, int hq, int hkv, int sq, int skv,
                       int d, int dv, fj_dtype dt, fj_order order);
size_t fjt_head_dim_v_variants(fj_variant *out, size_t max);
/* gpu_wide_heads' explicit variants at padded head dims (test_gpu.c), each
 * with its problem (O's rows apart where the case says so), up to max
 * into p and v; how many there are.  padded_heads_compile compiles them
 * without a GPU. */
size_t fjt_padded_variants(fj_problem *p, fj_variant *v, size_t max);

#endif
