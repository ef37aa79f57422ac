/*
 * problem.c -- the checks of a problem that need no context (what
 * fj_problem_check and the float64 reference both demand; fj_problem_check
 * adds the target's rules) and the problem's derived facts (O's dtype,
 * V's head dim, where V lives).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ctx.h"
#include "mods.h"
#include "numbers.h"
#include "problem.h"

/* ---- checking a problem ----------------------------------------------------------
 * What fj_problem_check and fj_reference_fwd both demand of a problem,
 * before anything reads a tensor: the kernels and the reference index
 * with the same strides, so a problem one of them would run out of bounds
 * on is refused by both.
 */

int fj__dtype_bytes(fj_dtype d)
{
  return d == FJ_E4M3 ? 1 : d == FJ_F32 ? 4 : 2;
}

int fj__problem_dv(const fj_problem *p)
{
  return p->head_dim_v ? p->head_dim_v : p->head_dim;
}

int fj__problem_v_in_k(const fj_problem *p)
{
  return !memcmp(p->v_stride, p->k_stride, sizeof p->k_stride);
}

int fj__problem_mma_reads_v(const fj_problem *p)
{
  const int dv = fj__problem_dv(p);
  return dv == p->head_dim || (dv < p->head_dim && fj__problem_v_in_k(p));
}

fj_dtype fj__default_o_dtype(fj_dtype dtype)
{
  return dtype == FJ_E4M3 ? FJ_BF16 : dtype;
}

fj_dtype fj__o_dtype(const fj_problem *p)
{
  return p->o_dtype ? p->o_dtype : fj__default_o_dtype(p->dtype);
}

/* A dtype's name, or its number where it has none ("f32", "99"). */
static const char *dtype_text(fj_dtype d, char buf[16])
{
  if (fj__dtype_known(d))
    return fj_dtype_name(d);
  snprintf(buf, 16, "%d", (int)d);
  return buf;
}

fj_status fj__check_o_dtype(const fj_ctx *ctx, fj_dtype dtype, fj_dtype o)
{
  char buf[16];
  if (o == 0 || o == fj__default_o_dtype(dtype))
    return FJ_OK;
  if (o != FJ_F16 && o != FJ_BF16 && o != FJ_E4M3)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "o_dtype %s is invalid: 0 (dtype's), f16, bf16 or e4m3",
                    dtype_text(o, buf));
  if (dtype != FJ_E4M3)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "o_dtype %s with dtype %s is not implemented: a 16-bit "
                    "problem writes O in its dtype; FP8 attention (dtype "
                    "e4m3) writes bf16, f16 or e4m3",
                    fj_dtype_name(o), dtype_text(dtype, buf));
  return FJ_OK;
}

fj_status fj__check_types(const fj_ctx *ctx, fj_dtype dtype, fj_dtype kv,
                          fj_causal causal)
{
  char a[16], b[16];
  if (causal < FJ_CAUSAL_NONE || causal > FJ_CAUSAL_BOTTOM_RIGHT)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "causal %d is invalid: none, top-left or bottom-right",
                    (int)causal);
  if (dtype == FJ_E4M3 && kv != FJ_E4M3)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "kv_dtype %s is invalid with dtype e4m3: FP8 attention "
                    "takes Q, K and V in e4m3 (kv_dtype 0 or e4m3)",
                    dtype_text(kv, a));
  if (dtype == FJ_E4M3)
    return FJ_OK;
  if (dtype != FJ_F16 && dtype != FJ_BF16)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "dtype %s is invalid for Q and O: f16, bf16, or e4m3 (Q, K "
                    "and V in FP8, O in bf16)",
                    dtype_text(dtype, a));
  if (kv != dtype && kv != FJ_E4M3)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "kv_dtype %s is invalid with dtype %s: the same as dtype, "
                    "or e4m3",
                    dtype_text(kv, a), dtype_text(dtype, b));
  return FJ_OK;
}

static fj_status check_positive(const fj_ctx *ctx, const char *field,
                                int value, int max)
{
  if (value >= 1 && value <= max)
    return FJ_OK;
  return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "%s %d is invalid: must be in 1..%d", field, value, max);
}

static fj_status check_sizes(const fj_ctx *ctx, const fj_problem *p)
{
  /* batch and heads become grid dimensions (at most 65535); no kernel has
   * a head dim above FJ_HEAD_DIM_MAX (the target's rules say which
   * exist). */
  fj_status st = check_positive(ctx, "batch", p->batch, 65535);
  if (st == FJ_OK)
    st = check_positive(ctx, "heads_q", p->heads_q, 65535);
  if (st == FJ_OK)
    st = check_positive(ctx, "heads_kv", p->heads_kv, p->heads_q);
  if (st == FJ_OK)
    st = check_positive(ctx, "seq_q", p->seq_q, 1 << 30);
  if (st == FJ_OK)
    st = check_positive(ctx, "seq_kv", p->seq_kv, 1 << 30);
  if (st == FJ_OK)
    st = check_positive(ctx, "head_dim", p->head_dim, FJ_HEAD_DIM_MAX);
  /* V's and O's head dim: 0 (the same), or one a kernel could have. */
  if (st == FJ_OK && p->head_dim_v != 0 &&
      (p->head_dim_v < 8 || p->head_dim_v > FJ_HEAD_DIM_V_MAX || p->head_dim_v % 8 != 0))
    st = fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "head_dim_v %d is invalid: a multiple of 8 from 8 to %d, "
                  "or 0 (head_dim)",
                  p->head_dim_v, FJ_HEAD_DIM_V_MAX);
  if (st == FJ_OK && p->heads_q % p->heads_kv != 0)
    st = fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "heads_kv %d does not divide heads_q %d (GQA needs "
                  "heads_q = k * heads_kv)",
                  p->heads_kv, p->heads_q);
  return st;
}

/* One tensor of a problem, as the stride checks see it. */
typedef struct tensor {
  const char *name;  /* "q" */
  const int64_t *s;  /* element strides of batch, head, seq */
  int64_t ext[3];    /* extents of batch, head, seq */
  int esize;         /* bytes per element */
} tensor;

static const char *const dim_names[3] = {"batch", "head", "seq"};

/* The extents the strides must serve.  Varlen tensors are one run of
 * rows, at most batch x the longest sequence; paged K and V are pages
 * of page_size rows. */
static void tensors_of(const fj_problem *p, tensor t[4])
{
  int qb_ = fj__dtype_bytes(p->dtype), ob = fj__dtype_bytes(fj__o_dtype(p));
  int kv = fj__dtype_bytes(p->kv_dtype ? p->kv_dtype : p->dtype);
  int64_t qb = p->batch, qs = p->seq_q, kb = p->batch, ks = p->seq_kv;
  if (p->cu_seqlens_q) {
    qb = 1;
    qs = (int64_t)p->batch * p->seq_q;
  }
  if (p->block_table) {
    kb = p->num_pages;
    ks = p->page_size;
  } else if (p->cu_seqlens_kv) {
    kb = 1;
    ks = (int64_t)p->batch * p->seq_kv;
  }
  tensor all[4] = {{"q", p->q_stride, {qb, p->heads_q, qs}, qb_},
                   {"k", p->k_stride, {kb, p->heads_kv, ks}, kv},
                   {"v", p->v_stride, {kb, p->heads_kv, ks}, kv},
                   {"o", p->o_stride, {qb, p->heads_q, qs}, ob}};
  memcpy(t, all, sizeof all);
}

static fj_status check_negative(const fj_ctx *ctx, const tensor *t)
{
  for (int i = 0; i < 3; i++)
    if (t->s[i] < 0)
      return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                      "%s_stride[%d] (%s) = %lld is negative", t->name, i,
                      dim_names[i], (long long)t->s[i]);
  return FJ_OK;
}

/* Every stride 0 while some extent is above 1: what fj_problem_init leaves
 * for an unknown order.  No layout worth running is all broadcasts. */
static int strides_unset(const tensor t[4])
{
  int set = 0, wide = 0;
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 3; j++) {
      set |= t[i].s[j] != 0;
      wide |= t[i].ext[j] > 1;
    }
  return !set && wide;
}

/* The byte offset of the tensor's last element must fit in a signed 64-bit
 * integer: the kernels and the reference index with those. */
static fj_status check_span(const fj_ctx *ctx, const tensor *t, int head_dim)
{
  int64_t end = (int64_t)head_dim * t->esize;
  for (int i = 0; i < 3; i++) {
    int64_t step;
    if (__builtin_mul_overflow(t->s[i], (t->ext[i] - 1) * t->esize,
                               &step) ||
        __builtin_add_overflow(end, step, &end))
      return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                      "%s_stride[%d] (%s) = %lld with extent %lld: the byte "
                      "offset of %s's last element would overflow 64 bits "
                      "(the kernels index with signed 64-bit offsets)",
                      t->name, i, dim_names[i], (long long)t->s[i],
                      (long long)t->ext[i], t->name);
  }
  return FJ_OK;
}

/* Whether t's rows lie apart: taken from the smallest stride out, each
 * dimension of extent above 1 must step past all the elements inside it
 * (rows that interleave without meeting count as overlapping).  -1 where
 * they do, else the first dimension that does not, and the elements
 * inside it (*inside). */
static int rows_overlap(const tensor *t, int head_dim, int64_t *inside)
{
  int order[3] = {0, 1, 2};
  for (int i = 1; i < 3; i++)
    for (int j = i; j > 0 && t->s[order[j]] < t->s[order[j - 1]]; j--) {
      int x = order[j];
      order[j] = order[j - 1];
      order[j - 1] = x;
    }
  *inside = head_dim;
  for (int n = 0; n < 3; n++) {
    int i = order[n];
    if (t->ext[i] <= 1)
      continue;
    if (t->s[i] < *inside)
      return i;
    *inside += (t->ext[i] - 1) * t->s[i];  /* check_span bounds it */
  }
  return -1;
}

/* O's rows must lie apart, or two blocks write one place at once.  (Rows
 * that interleave without meeting are refused too: no kernel writes such
 * a layout.)  Q, K and V are only read: a stride of 0 there broadcasts, as
 * torch's expand() does. */
static fj_status check_rows_apart(const fj_ctx *ctx, const tensor *t,
                                  int head_dim)
{
  int64_t inside;
  int i = rows_overlap(t, head_dim, &inside);
  if (i < 0)
    return FJ_OK;
  return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "%s_stride[%d] (%s) = %lld with extent %lld is less than "
                  "the %lld elements inside each step: rows of O would "
                  "overlap",
                  t->name, i, dim_names[i], (long long)t->s[i],
                  (long long)t->ext[i], (long long)inside);
}

static fj_status check_strides(const fj_ctx *ctx, const fj_problem *p)
{
  tensor t[4];
  tensors_of(p, t);
  fj_status st = FJ_OK;
  for (int i = 0; i < 4 && st == FJ_OK; i++)
    st = check_negative(ctx, &t[i]);
  if (st == FJ_OK && strides_unset(t))
    st = fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "the strides of q, k, v and o are all 0: never set "
                  "(fj_problem_init leaves them 0 for an order that is "
                  "neither FJ_BHSD nor FJ_BSHD)");
  /* Q and K have head_dim columns, V and O head_dim_v. */
  for (int i = 0; i < 4 && st == FJ_OK; i++)
    st = check_span(ctx, &t[i], i < 2 ? p->head_dim : fj__problem_dv(p));
  return st == FJ_OK ? check_rows_apart(ctx, &t[3], fj__problem_dv(p)) : st;
}

/* The varlen and paged fields agree with each other and with the strides
 * (the arrays' contents are fj_problem_check_lengths's). */
/* A packed tensor's total rows: 0 (not given), or positive with its
 * cu_seqlens array. */
static fj_status check_total(const fj_ctx *ctx, const char *name, int total,
                             const int32_t *cu, const char *cu_name)
{
  if (total < 0)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "%s %d is negative: the rows of the packed tensor, or 0 "
                    "(not given)",
                    name, total);
  if (total && !cu)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "%s %d without %s: a total counts the rows of packed "
                    "sequences (leave it 0)",
                    name, total, cu_name);
  return FJ_OK;
}

static fj_status check_seqs(const fj_ctx *ctx, const fj_problem *p)
{
  fj_status st = check_total(ctx, "total_q", p->total_q, p->cu_seqlens_q,
                             "cu_seqlens_q");
  if (st == FJ_OK)
    st = check_total(ctx, "total_kv", p->total_kv, p->cu_seqlens_kv,
                     "cu_seqlens_kv");
  if (st != FJ_OK)
    return st;
  if (p->cu_seqlens_q && (p->q_stride[0] || p->o_stride[0]))
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "%s_stride[0] (batch) = %lld with cu_seqlens_q: a "
                    "sequence's rows start at row cu_seqlens_q[b], so the "
                    "batch stride must be 0 (FJ_THD)",
                    p->q_stride[0] ? "q" : "o",
                    (long long)(p->q_stride[0] ? p->q_stride[0] : p->o_stride[0]));
  if (!p->block_table) {
    if (p->page_size || p->max_pages || p->num_pages)
      return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                      "%s %d without a block_table: paged K/V need "
                      "block_table (or leave page_size, max_pages and "
                      "num_pages 0)",
                      p->page_size ? "page_size" : p->max_pages ? "max_pages"
                                                                : "num_pages",
                      p->page_size ? p->page_size : p->max_pages ? p->max_pages
                                                                 : p->num_pages);
    if (p->cu_seqlens_kv && (p->k_stride[0] || p->v_stride[0]))
      return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                      "%s_stride[0] (batch) = %lld with cu_seqlens_kv: a "
                      "sequence's keys start at row cu_seqlens_kv[b], so the "
                      "batch stride must be 0 (FJ_THD)",
                      p->k_stride[0] ? "k" : "v",
                      (long long)(p->k_stride[0] ? p->k_stride[0] : p->v_stride[0]));
    return FJ_OK;
  }
  if (p->cu_seqlens_kv)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "cu_seqlens_kv with a block_table: paged keys are found "
                    "through the table; give their lengths in seqused_kv");
  if (p->page_size < 1 || p->page_size > FJ_PAGE_SIZE_MAX ||
      (p->page_size & (p->page_size - 1)))
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "page_size %d is invalid: a power of two in 1..%d",
                    p->page_size, FJ_PAGE_SIZE_MAX);
  if (p->max_pages < 1 || p->num_pages < 1)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "%s %d is invalid: a paged cache has at least one page",
                    p->max_pages < 1 ? "max_pages" : "num_pages",
                    p->max_pages < 1 ? p->max_pages : p->num_pages);
  if ((int64_t)p->max_pages * p->page_size < p->seq_kv)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "block table too short: max_pages %d x page_size %d = "
                    "%lld keys, less than seq_kv %d",
                    p->max_pages, p->page_size,
                    (long long)p->max_pages * p->page_size, p->seq_kv);
  if ((int64_t)p->batch * p->max_pages > INT32_MAX)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "batch %d x max_pages %d entries: a block table holds "
                    "at most %d",
                    p->batch, p->max_pages, INT32_MAX);
  return FJ_OK;
}

/* The modifications on their own, then with the causal mask: a causal
 * mask is the window's right side 0. */
static fj_status check_mods(const fj_ctx *ctx, const fj_problem *p)
{
  fj_status st = fj__mods_check(ctx, p->mods);
  fj_mods_info mi;  /* of mods that passed their check only */
  fj__mods_info(st == FJ_OK ? p->mods : NULL, &mi);
  if (st == FJ_OK && p->causal != FJ_CAUSAL_NONE && p->mods &&
      p->mods->window_right > 0)
    st = fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "mods.window_right %d with causal %s: a causal mask hides "
                  "every key right of the diagonal; use window_right 0 or -1",
                  p->mods->window_right, fj_causal_name(p->causal));
  if (st == FJ_OK && mi.blocks &&
      (p->cu_seqlens_q || p->cu_seqlens_kv || p->seqused_kv || p->block_table))
    st = fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                  "mods.block_mask with %s is not implemented: block masks "
                  "take dense problems (a varlen batch is already "
                  "block-diagonal)",
                  p->block_table ? "a paged K/V (block_table)" : "varlen "
                  "sequences (cu_seqlens / seqused_kv)");
  if (st == FJ_OK && mi.blocks && p->splits > 1)
    st = fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                  "splits %d with mods.block_mask is not implemented: 0 or 1",
                  p->splits);
  if (st == FJ_OK)
    st = fj__mods_check_blocks(ctx, p->mods, p->batch, p->heads_q, p->seq_q,
                               p->seq_kv);
  return st;
}

/* The largest scale whose product with log2(e), which the kernels take,
 * is a finite float32. */
#define SCALE_MAX ((double)FLT_MAX / 1.4426950408889634)

fj_status fj__problem_check_common(const fj_ctx *ctx, const fj_problem *p)
{
  fj_status st = check_sizes(ctx, p);
  if (st == FJ_OK)
    st = fj__check_types(ctx, p->dtype, p->kv_dtype ? p->kv_dtype : p->dtype,
                         p->causal);
  if (st == FJ_OK)
    st = fj__check_o_dtype(ctx, p->dtype, p->o_dtype);
  /* O's scale and amax are FP8 attention's, the scale its e4m3 O's. */
  if (st == FJ_OK && p->o_scale && fj__o_dtype(p) != FJ_E4M3)
    st = fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "o_scale is for an e4m3 O (o_dtype e4m3); O is %s: pass "
                  "NULL",
                  fj_dtype_name(fj__o_dtype(p)));
  if (st == FJ_OK && p->o_amax && p->dtype != FJ_E4M3)
    st = fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "o_amax is for FP8 attention (dtype e4m3); dtype is %s: "
                  "pass NULL",
                  fj_dtype_name(p->dtype));
  if (st == FJ_OK && !isfinite(p->scale))
    st = fj__fail(ctx, FJ_ERR_INVALID_ARG, "scale %g is not finite",
                  (double)p->scale);
  /* The kernels' online softmax keeps each row's largest raw score and
   * scales after it: a negative scale would turn it into the smallest,
   * and hidden keys' -inf into +inf. */
  if (st == FJ_OK && p->scale < 0.f)
    st = fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "scale %g is negative: the softmax scale must be above 0 "
                  "(0 means 1/sqrt(head_dim))",
                  (double)p->scale);
  /* The kernels take the scale times log2(e): a denormal scale loses its
   * bits there, and one above FLT_MAX / log2(e) becomes inf. */
  if (st == FJ_OK && p->scale > 0.f && p->scale < FLT_MIN)
    st = fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "scale %g is a float32 denormal: the softmax scale is 0 "
                  "(1/sqrt(head_dim)) or in %g..%g",
                  (double)p->scale, (double)FLT_MIN, SCALE_MAX);
  if (st == FJ_OK && (double)p->scale > SCALE_MAX)
    st = fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "scale %g is too large: scale x log2(e) must be a finite "
                  "float32, so the scale is at most %g",
                  (double)p->scale, SCALE_MAX);
  if (st == FJ_OK && (p->splits < 0 || p->splits > FJ_SPLITS_MAX))
    st = fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "splits %d is invalid: 0 (the library's choice), 1 (none) "
                  "or 2..%d",
                  p->splits, FJ_SPLITS_MAX);
  if (st == FJ_OK)
    st = check_seqs(ctx, p);
  if (st == FJ_OK)
    st = check_mods(ctx, p);
  return st == FJ_OK ? check_strides(ctx, p) : st;
}

fj_status fj__check_scales(const fj_ctx *ctx, const fj_problem *p,
                           const void *k_scale, const void *v_scale)
{
  fj_dtype kv = p->kv_dtype ? p->kv_dtype : p->dtype;
  if (kv == FJ_E4M3 && p->scale_layout != FJ_SCALE_PER_HEAD &&
      p->scale_layout != FJ_SCALE_PER_TENSOR)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "scale_layout %d is invalid: FJ_SCALE_PER_HEAD (0) or "
                    "FJ_SCALE_PER_TENSOR (1)",
                    (int)p->scale_layout);
  if (p->dtype == FJ_E4M3 && !p->q_scale)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "dtype e4m3 needs q_scale, k_scale and v_scale: q_scale "
                    "is NULL");
  /* The kernels index descales per (batch, KV head) in 32-bit ints. */
  int64_t bh = (int64_t)p->batch * p->heads_kv;
  if (kv == FJ_E4M3 && p->scale_layout == FJ_SCALE_PER_HEAD && bh > INT32_MAX)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "batch %d x heads_kv %d = %lld descales per (batch, head) "
                    "is not implemented: at most %d (or scale_layout "
                    "FJ_SCALE_PER_TENSOR)",
                    p->batch, p->heads_kv, (long long)bh, INT32_MAX);
  if (kv != FJ_E4M3 || (k_scale && v_scale))
    return FJ_OK;
  return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "%s e4m3 needs k_scale and v_scale: %s is NULL",
                  p->dtype == FJ_E4M3 ? "dtype" : "kv_dtype",
                  k_scale ? "v_scale" : "k_scale");
}

int fj__problem_rows_apart(const fj_problem *p)
{
  tensor t[4];
  tensors_of(p, t);
  int64_t inside;
  return rows_overlap(&t[0], p->head_dim, &inside) < 0 &&
         rows_overlap(&t[1], p->head_dim, &inside) < 0 &&
         rows_overlap(&t[2], fj__problem_dv(p), &inside) < 0;
}
