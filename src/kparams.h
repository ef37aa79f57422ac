/*
 * kparams.h -- the parameter block every attention kernel receives, the
 * ABI between the host and templates/common.cuh's fj::Params (whose
 * static_assert checks the size the host renders into it).  Families that
 * load tiles through TMA take the tensor maps as further parameters.
 */
#ifndef FJ_KPARAMS_H
#define FJ_KPARAMS_H

#include <stdint.h>

typedef struct fj_kparams {
  const void *q, *k, *v;
  void *o;
  float *lse;
  const void *k_scale, *v_scale;
  long long q_stride[3], k_stride[3], v_stride[3], o_stride[3];
  int batch, heads_q, heads_kv, seq_q, seq_kv, group, causal_offset;
  float scale_log2;
  int splits;        /* split-KV: key ranges per row tile (1: none) */
  float *o_part;     /* split-KV: [splits][batch][heads_q][seq_q][head_dim] */
  float *lse_part;   /* split-KV: [splits][batch][heads_q][seq_q] */
  /* Varlen and paged problems (fj_problem's arrays; NULL where absent). */
  const int32_t *cu_seqlens_q, *cu_seqlens_kv, *seqused_kv, *block_table;
  int max_pages;     /* the block table's columns */
  int page_shift;    /* log2(page_size) */
  int num_pages;
  /* Built-in modifications (fj_mods): the window's sides, FJ_WINDOW_MAX
   * for an unbounded side and 0 for a causal mask's right side; the softcap
   * and its reciprocal (0 when off), and the softcap's fixed shift of the
   * exponentials (fj__mods_softcap_shift; 0: the running max). */
  int window_left, window_right;
  float softcap, softcap_inv, softcap_shift;
  int combine_warps; /* split-KV: the combine's warps a row (1, 2 or 4) */
  /* A dynamic walk of work tiles (the wgmma family's varlen kernels):
   * the counter the blocks claim tiles from, zeroed before each launch. */
  unsigned *work;
  /* A block mask (fj_block_mask; NULL where absent): the counts and
   * lists of batch b, head h start at query block b * bm_stride_b +
   * h * bm_stride_h (0 for a dimension the mask broadcasts).  The
   * backward's main kernel walks the other direction and gets the
   * transposed lists here instead (q_num, q_indices, full_q_num,
   * full_q_indices): its strides count key blocks, each list holds
   * bm_q_blocks entries (src/backward.c's fill_bwd_blocks). */
  const int32_t *bm_num, *bm_idx, *bm_full_num, *bm_full_idx;
  int bm_stride_b, bm_stride_h, bm_q_blocks, bm_kv_blocks;
  /* Attention sinks (fj_mods.sinks): [heads_q] logits, or NULL. */
  const float *sinks;
  /* FP8 attention (dtype e4m3): Q's descales ([batch][heads_kv]), and V
   * transposed into the workspace for the tensor cores' K-major B --
   * [batch][heads_kv][head_dim][vt_keys] bytes, vt_keys seq_kv rounded up
   * to 128, each 32 keys in the order the P operand takes them (the
   * kernel's _vt pass writes it). */
  const void *q_scale;
  unsigned char *vt;
  int vt_keys;
  /* FP8: the descales' index is (b * heads_kv + h) * scale_per_head --
   * 1 for fj_problem's FJ_SCALE_PER_HEAD, 0 for FJ_SCALE_PER_TENSOR. */
  int scale_per_head;
  /* FP8 attention: O's scale (one float; NULL: 1) for an e4m3 O, and
   * where max |O| goes (one float, zeroed before the launch; NULL: not
   * kept). */
  const void *o_scale;
  void *o_amax;
} fj_kparams;

/* The backward's own parameter block, after the forward's fj_kparams
 * (templates/bwd_common.cuh's fj::BwdParams, checked by size the same
 * way). */
typedef struct fj_bwd_kparams {
  const void *dout;
  void *dq, *dk, *dv;
  const float *lse;
  const float *dlse;  /* the loss's gradient at lse (fj_problem.dlse) or NULL */
  /* The workspace's rows are padded: seq_pad (seq_q rounded up to 64) a
   * (batch, head); rows past seq_q hold delta 0 and LSE2 +inf. */
  float *delta;   /* rowsum(dO o O), float32 [batch][heads_q][seq_pad] */
  float *lse2;    /* LSE * log2(e), +inf where LSE is -inf, same rows */
  float *dq_acc;  /* float32 [batch][heads_q][seq_pad][head_dim] */
  float *dsinks;  /* [heads_q] or NULL */
  int *dq_turns;  /* per dQ tile: the key tiles that added (deterministic) */
  /* The parameters' gradients in the deterministic mode (NULL words
   * elsewhere): two int64 words of fixed point per element of each
   * parameter with a gradient, in order (pg_end[i]: the elements of
   * parameters 0..i), added into pg_out[i] by the postprocess. */
  long long *pg_words;
  float *pg_out[8];
  long long pg_end[8];
  long long do_stride[3], dq_stride[3], dk_stride[3], dv_stride[3];
  float scale;
  int seq_pad;
  int deterministic;  /* 1: dQ added in a fixed order; 2: in the rotation's
                         (backward.c's rotates); 3: over the descending
                         walk (backward.c's descends) */
  int section;  /* (batch, KV head)s a section of the main kernel's order */
  int pad_;     /* zero: the size a multiple of 8, as fj::BwdParams' */
} fj_bwd_kparams;

/* CUtensorMap: 128 opaque bytes, 64-byte aligned (cuda.h's own type is not
 * needed by the modules that only pass maps along). */
typedef struct fj_tmap {
  _Alignas(64) uint64_t opaque[16];
} fj_tmap;

/* The tensor maps of a TMA kernel: Q, K, V, in that order. */
typedef struct fj_tmaps {
  fj_tmap q, k, v;
} fj_tmaps;

/* The wgmma backward's tensor maps (templates/attention_bwd_wgmma.cu's
 * fj::BwdMaps): Q and dO in boxes of a query tile's rows, K and V of a
 * key tile's. */
typedef struct fj_bwd_tmaps {
  fj_tmap q, k, v, dout;
} fj_bwd_tmaps;

#endif /* FJ_KPARAMS_H */
