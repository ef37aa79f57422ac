/*
 * attention.c -- the attention forward: problem validation, the choice of
 * variant, and the launch.  The kernel parameter block below is mirrored by
 * fj::Params in templates/common.cuh, whose static_assert checks the size
 * the host passes in.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <stdlib.h>

#include "attention.h"
#include "ctx.h"
#include "driver.h"
#include "kernel.h"
#include "kparams.h"
#include "reference.h"
#include "tunedb.h"
#include "variant.h"

/* The dispatch caches of fj_attention_fwd: a launch that finds its kernel
 * here skips parameters, rendering keys and the kernel map; a problem
 * whose class was seen skips the heuristic and the tuning database. */
enum { FJ_HOT = 16 };
typedef struct fj_hot {
  fj_variant v;
  fj_kernel *kernel;
  void *function;
} fj_hot;
typedef struct fj_pick {
  int key[9];  /* head dim, dtypes, mask, sequence buckets, GQA ratio,
                  fewer 128-row blocks than multiprocessors, TMA fits */
  fj_variant v;
  fj_choice from;
} fj_pick;

struct fj_dispatch {
  fj_hot hot[FJ_HOT];   /* variant -> loaded kernel, most recent first */
  int nhot;
  fj_pick picks[FJ_HOT]; /* problem class -> chosen variant */
  int npicks;
  unsigned generation;  /* of the tuning database the picks came from */
};

void fj__dispatch_free(fj_dispatch *d)
{
  free(d);
}

/* The context's dispatch caches, created on first use; ctx->lock held. */
static fj_dispatch *dispatch(fj_ctx *ctx)
{
  if (!ctx->dispatch)
    ctx->dispatch = calloc(1, sizeof *ctx->dispatch);
  return ctx->dispatch;
}

/* ---- problems ------------------------------------------------------------------- */

/* a * b * c, or INT64_MAX where that overflows: sizes that large are
 * refused by fj_problem_check, which then names them. */
static int64_t product(int64_t a, int64_t b, int64_t c)
{
  int64_t ab, abc;
  if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, &abc))
    return INT64_MAX;
  return abc;
}

static void contiguous(int64_t s[3], int heads, int seq, int d,
                       fj_order order)
{
  if (order == FJ_BSHD) {
    s[0] = product(seq, heads, d);
    s[1] = d;
    s[2] = product(heads, d, 1);
  } else {
    s[0] = product(heads, seq, d);
    s[1] = product(seq, d, 1);
    s[2] = d;
  }
}

void fj_problem_init(fj_problem *p, int batch, int heads_q, int heads_kv,
                     int seq_q, int seq_kv, int head_dim, fj_dtype dtype,
                     fj_order order)
{
  if (!p)
    return;
  memset(p, 0, sizeof *p);
  p->batch = batch;
  p->heads_q = heads_q;
  p->heads_kv = heads_kv;
  p->seq_q = seq_q;
  p->seq_kv = seq_kv;
  p->head_dim = head_dim;
  p->dtype = dtype;
  /* An unknown order gets no layout guessed for it: the strides stay 0,
   * which fj_problem_check refuses with the reason. */
  if (order != FJ_BHSD && order != FJ_BSHD)
    return;
  contiguous(p->q_stride, heads_q, seq_q, head_dim, order);
  contiguous(p->o_stride, heads_q, seq_q, head_dim, order);
  contiguous(p->k_stride, heads_kv, seq_kv, head_dim, order);
  contiguous(p->v_stride, heads_kv, seq_kv, head_dim, order);
}

/* The checks that need no context come from reference.c, shared with
 * fj_reference_fwd; the target's rules (head dims, dtypes on this arch)
 * are the variant rules of the default variant. */
fj_status fj_problem_check(fj_ctx *ctx, const fj_problem *p)
{
  if (!ctx || !p)
    return fj__null_arg(ctx, "fj_problem_check", ctx ? "p" : "ctx");
  fj__clear_error(ctx);
  fj_status st = fj__problem_check_common(ctx, p);
  if (st != FJ_OK)
    return st;
  fj_variant v;
  fj_variant_default(&v, p->head_dim, p->dtype, p->causal);
  v.kv_dtype = p->kv_dtype;
  if ((st = fj__variant_validate(ctx, &v)) != FJ_OK)
    return st;
  return fj__check_scales(ctx, p, p->k_scale, p->v_scale);
}

/* ---- choosing a variant ----------------------------------------------------------- */

/* Whether 128-row blocks would be fewer than the device's multiprocessors
 * (never on a compile-only context). */
static int few_blocks(const fj_ctx *ctx, const fj_problem *p)
{
  long blocks = (long)p->batch * p->heads_q * ((p->seq_q + 127) / 128);
  return ctx->has_device && blocks < ctx->dev.sm_count;
}

/* The mma family where the target has mma.sync m16n8k16 (sm_80 on), with
 * the shapes that ran fastest in the H200 sweeps of docs/PERF.md (S = 4096
 * and 16384, causal and not): up to head_dim 128 each of 4 warps owns 32
 * rows (K and V fragments serve two row slices); above, 8 warps own 16 rows
 * each and the S(t + 1) pipeline runs.  All fit sm_80's shared memory
 * except head_dim 256 with 64-key tiles, taken only where it fits. */
static void mma_choice(const fj_ctx *ctx, const fj_problem *p, fj_variant *v)
{
  int d = v->head_dim;
  v->mma = FJ_MMA_SYNC;
  v->softmax = FJ_SOFTMAX_REGS;
  v->tile_m = 128;
  v->warps = d <= 128 ? 4 : 8;
  v->tile_n = d <= 64 ? 128 : 64;
  v->swizzle = d <= 64 ? FJ_SWIZZLE_XOR : FJ_SWIZZLE_PAD;
  if (d > 192 && !(v->stages == 2 && fj__smem_limit(ctx) >= 210 * 1024))
    v->tile_n = 32;
  /* Causal head dims up to 64: a third stage ran 5% faster (S = 4096). */
  if (d <= 64 && v->causal != FJ_CAUSAL_NONE && v->stages == 2)
    v->stages = 3;
  /* Fewer 128-row blocks than multiprocessors: 64-row blocks of 4 warps,
   * 16 rows each, twice as many blocks. */
  if (few_blocks(ctx, p)) {
    v->tile_m = 64;
    v->warps = 4;
  }
}

/* Whether the wgmma family can take the problem: sm_90a, head dims in
 * panels of 64, the same dtype for K/V, and strides TMA can encode (none
 * zero where the extent is above 1). */
static int wgmma_fits(const fj_ctx *ctx, const fj_problem *p)
{
  if (ctx->sm != 90 || !ctx->arch_specific || p->head_dim % 64 != 0 ||
      (p->kv_dtype && p->kv_dtype != p->dtype))
    return 0;
  const int64_t *s[4] = {p->q_stride, p->k_stride, p->v_stride, p->o_stride};
  int ext[4][3] = {{p->batch, p->heads_q, p->seq_q},
                   {p->batch, p->heads_kv, p->seq_kv},
                   {p->batch, p->heads_kv, p->seq_kv},
                   {p->batch, p->heads_q, p->seq_q}};
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 3; j++)
      if (s[i][j] == 0 && ext[i][j] > 1)
        return 0;
  return 1;
}

/* The wgmma family (sm_90a): two consumer warpgroups of 64 rows (three at
 * head dim 64), key tiles as large as registers and shared memory allow,
 * two stages -- FlashAttention-3's shapes, with the key tiles the H200
 * sweeps of docs/PERF.md preferred. */
static void wgmma_choice(fj_variant *v)
{
  int d = v->head_dim;
  v->mma = FJ_MMA_WGMMA;
  v->softmax = FJ_SOFTMAX_REGS;
  v->swizzle = FJ_SWIZZLE_XOR;
  v->stages = 2;
  v->tile_m = d == 64 ? 192 : 128;
  v->warps = d == 64 ? 16 : 12;
  /* Head dim 128: 192-key tiles ran fastest; with a causal mask ptxas
   * spills 8 bytes there, so 176. */
  v->tile_n = d == 64    ? 128
              : d == 128 ? (v->causal ? 176 : 192)
              : d == 192 ? 96
                         : 80;
}

void fj__heuristic_sync(const fj_ctx *ctx, const fj_problem *p, fj_variant *v)
{
  fj_variant_default(v, p->head_dim, p->dtype, p->causal);
  v->kv_dtype = p->kv_dtype == p->dtype ? 0 : p->kv_dtype;
  if (v->kv_dtype == FJ_E4M3)
    v->stages = 1;  /* FP8 K/V are dequantised as they load */
  /* Before sm_80 the WMMA family's defaults stand as they are. */
  if (ctx->sm >= 80)
    mma_choice(ctx, p, v);
}

void fj__heuristic(const fj_ctx *ctx, const fj_problem *p, fj_variant *v)
{
  fj__heuristic_sync(ctx, p, v);
  /* Problems too small to give every multiprocessor a 128-row block keep
   * the mma family's 64-row blocks. */
  if (wgmma_fits(ctx, p) && !few_blocks(ctx, p))
    wgmma_choice(v);
}

static int log2_floor(int n)
{
  int b = 0;
  while ((1 << (b + 1)) <= n)
    b++;
  return b;
}

/* What the choice depends on: the tuning database's problem class, and
 * whether 128-row blocks would leave multiprocessors idle. */
static void pick_key(const fj_ctx *ctx, const fj_problem *p, int key[9])
{
  key[0] = p->head_dim;
  key[1] = (int)p->dtype;
  key[2] = (int)(p->kv_dtype ? p->kv_dtype : p->dtype);
  key[3] = (int)p->causal;
  key[4] = log2_floor(p->seq_q);
  key[5] = log2_floor(p->seq_kv);
  key[6] = p->heads_q / p->heads_kv;
  key[7] = few_blocks(ctx, p);
  key[8] = wgmma_fits(ctx, p);
}

fj_status fj__choose(fj_ctx *ctx, const fj_problem *p, fj_variant *v,
                     fj_choice *from)
{
  int key[9];
  pick_key(ctx, p, key);
  pthread_mutex_lock(&ctx->lock);
  fj_dispatch *d = dispatch(ctx);
  if (d && d->generation != ctx->tunedb_generation) {
    d->npicks = 0;  /* the tuning database changed since these were chosen */
    d->generation = ctx->tunedb_generation;
  }
  for (int i = 0; d && i < d->npicks; i++)
    if (!memcmp(d->picks[i].key, key, sizeof key)) {
      *v = d->picks[i].v;
      if (from)
        *from = d->picks[i].from;
      pthread_mutex_unlock(&ctx->lock);
      return FJ_OK;
    }
  fj__heuristic(ctx, p, v);
  fj_choice c = fj__tune_lookup(ctx, p, v) ? FJ_CHOICE_TUNED : FJ_CHOICE_HEURISTIC;
  if (d) {
    fj_pick *pk = &d->picks[d->npicks < FJ_HOT ? d->npicks++ : FJ_HOT - 1];
    memcpy(pk->key, key, sizeof key);
    pk->v = *v;
    pk->from = c;
  }
  pthread_mutex_unlock(&ctx->lock);
  if (from)
    *from = c;
  return FJ_OK;
}

fj_status fj_attention_variant(fj_ctx *ctx, const fj_problem *p,
                               fj_variant *v, fj_choice *from)
{
  if (!ctx || !p || !v)
    return fj__null_arg(ctx, "fj_attention_variant",
                        !ctx ? "ctx" : !p ? "p" : "v");
  fj__clear_error(ctx);
  fj_status st = fj_problem_check(ctx, p);
  return st == FJ_OK ? fj__choose(ctx, p, v, from) : st;
}

/* ---- launching ------------------------------------------------------------------- */

static fj_status check_match(const fj_ctx *ctx, const fj_problem *p,
                             const fj_variant *v)
{
  fj_dtype pkv = p->kv_dtype ? p->kv_dtype : p->dtype;
  if (v->head_dim != p->head_dim || v->dtype != p->dtype ||
      fj__kv_dtype(v) != pkv || v->causal != p->causal)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "variant (head_dim %d, dtype %s, kv %s, causal %s) does "
                    "not match the problem (head_dim %d, dtype %s, kv %s, "
                    "causal %s)",
                    v->head_dim, fj_dtype_name(v->dtype),
                    fj_dtype_name(fj__kv_dtype(v)), fj_causal_name(v->causal),
                    p->head_dim, fj_dtype_name(p->dtype), fj_dtype_name(pkv),
                    fj_causal_name(p->causal));
  return FJ_OK;
}

/* The kernels move rows in 16-byte pieces: base pointers 16-byte aligned,
 * every stride a whole number of 16-byte pieces. */
static fj_status check_alignment(const fj_ctx *ctx, const char *name,
                                 const void *ptr, const int64_t s[3],
                                 fj_dtype dtype)
{
  int per16 = 16 / fj__dtype_bytes(dtype);
  if (!ptr)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG, "%s is NULL", name);
  if ((uintptr_t)ptr % 16 != 0)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "%s = %p is not 16-byte aligned: the vectorised loads "
                    "need it",
                    name, ptr);
  for (int i = 0; i < 3; i++)
    if (s[i] % per16 != 0)
      return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                      "%s_stride[%d] = %lld is not a multiple of %d elements "
                      "(16 bytes): the vectorised loads need it",
                      name, i, (long long)s[i], per16);
  return FJ_OK;
}

static fj_status check_pointers(const fj_ctx *ctx, const fj_problem *p,
                                const void *q, const void *k, const void *v,
                                const void *o)
{
  fj_dtype kv = p->kv_dtype ? p->kv_dtype : p->dtype;
  fj_status st = check_alignment(ctx, "q", q, p->q_stride, p->dtype);
  if (st == FJ_OK)
    st = check_alignment(ctx, "k", k, p->k_stride, kv);
  if (st == FJ_OK)
    st = check_alignment(ctx, "v", v, p->v_stride, kv);
  if (st == FJ_OK)
    st = check_alignment(ctx, "o", o, p->o_stride, p->dtype);
  return st;
}

static void fill_params(fj_kparams *kp, const fj_problem *p, const void *q,
                        const void *k, const void *v, void *o, float *lse)
{
  memset(kp, 0, sizeof *kp);
  kp->q = q;
  kp->k = k;
  kp->v = v;
  kp->o = o;
  kp->lse = lse;
  kp->k_scale = p->k_scale;
  kp->v_scale = p->v_scale;
  for (int i = 0; i < 3; i++) {
    kp->q_stride[i] = p->q_stride[i];
    kp->k_stride[i] = p->k_stride[i];
    kp->v_stride[i] = p->v_stride[i];
    kp->o_stride[i] = p->o_stride[i];
  }
  kp->batch = p->batch;
  kp->heads_q = p->heads_q;
  kp->heads_kv = p->heads_kv;
  kp->seq_q = p->seq_q;
  kp->seq_kv = p->seq_kv;
  kp->group = p->heads_q / p->heads_kv;
  kp->causal_offset =
      p->causal == FJ_CAUSAL_BOTTOM_RIGHT ? p->seq_kv - p->seq_q : 0;
  double scale = p->scale != 0.f ? (double)p->scale : 1.0 / sqrt(p->head_dim);
  kp->scale_log2 = (float)(scale * 1.4426950408889634);
}

/* The kernel and its function, built and loaded if needed; ctx->lock held
 * and the CUDA context entered.  The launches of the last few variants
 * are remembered as they are (variant in, function out), so that a launch
 * that repeats one costs a comparison, not a parameter build. */
static fj_status ready_kernel(fj_ctx *ctx, const fj_variant *v,
                              fj_kernel **k, void **fn)
{
  fj_dispatch *d = dispatch(ctx);
  for (int i = 0; d && i < d->nhot; i++)
    if (!memcmp(&d->hot[i].v, v, sizeof *v)) {
      *k = d->hot[i].kernel;
      *fn = d->hot[i].function;
      return FJ_OK;
    }
  fj_status st = fj__variant_kernel(ctx, v, k);
  if (st == FJ_OK)
    st = fj__kernel_function(ctx, *k, fn);
  if (st == FJ_OK && d) {
    fj_hot *h = &d->hot[d->nhot < FJ_HOT ? d->nhot++ : FJ_HOT - 1];
    h->v = *v;
    h->kernel = *k;
    h->function = *fn;
  }
  return st;
}

/* One rank-4 tensor map (head dim, sequence, heads, batch) of a tensor
 * with element strides s, boxes of 64 columns by `rows` rows in the 128-byte
 * swizzle.  A dimension of extent 1 may have any stride; TMA wants one it
 * can encode. */
static fj_status tensor_map(const fj_ctx *ctx, const void *base, fj_dtype dt,
                            const int64_t s[3], int d, int seq, int heads,
                            int batch, int rows, fj_tmap *out)
{
  int64_t esz = fj__dtype_bytes(dt);
  fj_tmap_desc m = {(uint64_t)(uintptr_t)base, dt, 4, {d, seq, heads, batch},
                    {s[2] * esz, s[1] * esz, s[0] * esz}, {64, rows, 1, 1},
                    128};
  for (int i = 0; i < 3; i++)
    if (m.dims[i + 1] == 1 && m.strides[i] == 0)
      m.strides[i] = 16;
  return fj__cu_tensor_map(ctx, &m, out);
}

/* The tensor maps of a TMA kernel: Q in boxes of the block's rows, K and V
 * in boxes of tile_n rows. */
static fj_status tensor_maps(const fj_ctx *ctx, const fj_problem *p,
                             const fj_variant *v, const fj_kernel *kern,
                             const void *q, const void *k, const void *vp,
                             fj_tmaps *maps)
{
  fj_status st = tensor_map(ctx, q, p->dtype, p->q_stride, p->head_dim,
                            p->seq_q, p->heads_q, p->batch,
                            kern->meta.rows_per_block, &maps->q);
  if (st == FJ_OK)
    st = tensor_map(ctx, k, p->dtype, p->k_stride, p->head_dim, p->seq_kv,
                    p->heads_kv, p->batch, v->tile_n, &maps->k);
  if (st == FJ_OK)
    st = tensor_map(ctx, vp, p->dtype, p->v_stride, p->head_dim, p->seq_kv,
                    p->heads_kv, p->batch, v->tile_n, &maps->v);
  return st;
}

/* The grid: (row tiles, heads, batch), or for a persistent kernel one
 * block per multiprocessor, at most one per pair of work tiles. */
static fj_status grid(const fj_ctx *ctx, const fj_problem *p,
                      const fj_kmeta *m, unsigned g[3])
{
  unsigned rows = (unsigned)m->rows_per_block;
  unsigned tiles_m = ((unsigned)p->seq_q + rows - 1) / rows;
  if (!m->persistent) {
    g[0] = tiles_m;
    g[1] = (unsigned)p->heads_q;
    g[2] = (unsigned)p->batch;
    return FJ_OK;
  }
  /* The kernel walks the row tiles of each head in pairs (block.cuh). */
  uint64_t total = (uint64_t)((tiles_m + 1) / 2) * (uint64_t)p->heads_q *
                   (uint64_t)p->batch;
  if (total > INT32_MAX)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "%llu pairs of work tiles of %u rows: a persistent kernel "
                    "counts at most %d",
                    (unsigned long long)total, rows, INT32_MAX);
  g[0] = (unsigned)(total < (uint64_t)ctx->dev.sm_count ? total
                                                        : (uint64_t)ctx->dev.sm_count);
  return FJ_OK;
}

static fj_status launch(fj_ctx *ctx, const fj_problem *p, const fj_variant *v,
                        const void *q, const void *k, const void *vp, void *o,
                        float *lse, void *stream)
{
  fj_kernel *kern;
  void *fn;
  fj_kparams kp;
  fj_tmaps maps;
  void *args[] = {&kp, &maps};
  fj_status st = fj__cu_enter(ctx);
  if (st != FJ_OK)
    return st;
  pthread_mutex_lock(&ctx->lock);
  st = ready_kernel(ctx, v, &kern, &fn);
  pthread_mutex_unlock(&ctx->lock);
  if (st == FJ_OK && kern->meta.tma)
    st = tensor_maps(ctx, p, v, kern, q, k, vp, &maps);
  if (st == FJ_OK) {
    fill_params(&kp, p, q, k, vp, o, lse);
    fj_launch l = {fn, {1, 1, 1}, {(unsigned)kern->meta.threads, 1, 1},
                   (unsigned)kern->meta.smem_bytes, stream, args};
    st = grid(ctx, p, &kern->meta, l.grid);
    if (st == FJ_OK)
      st = fj__cu_launch(ctx, &l);
  }
  fj__cu_leave(ctx);
  return st;
}

/* The checks every launch makes, then the launch. */
static fj_status checked_launch(fj_ctx *ctx, const fj_problem *p,
                                const fj_variant *v, const void *q,
                                const void *k, const void *vp, void *o,
                                float *lse, void *stream)
{
  fj_status st = check_match(ctx, p, v);
  if (st == FJ_OK)
    st = check_pointers(ctx, p, q, k, vp, o);
  if (st == FJ_OK && !ctx->has_device)
    st = fj__fail(ctx, FJ_ERR_COMPILE_ONLY,
                  "cannot launch on a compile-only context (arch %s)",
                  ctx->arch);
  return st == FJ_OK ? launch(ctx, p, v, q, k, vp, o, lse, stream) : st;
}

fj_status fj_attention_fwd_variant(fj_ctx *ctx, const fj_problem *p,
                                   const fj_variant *v, const void *q,
                                   const void *k, const void *vp, void *o,
                                   float *lse, void *stream)
{
  if (!ctx || !p || !v)
    return fj__null_arg(ctx, "fj_attention_fwd_variant",
                        !ctx ? "ctx" : !p ? "p" : "v (the variant)");
  fj__clear_error(ctx);
  fj_status st = fj_problem_check(ctx, p);
  return st == FJ_OK ? checked_launch(ctx, p, v, q, k, vp, o, lse, stream)
                     : st;
}

fj_status fj_attention_fwd(fj_ctx *ctx, const fj_problem *p, const void *q,
                           const void *k, const void *v, void *o, float *lse,
                           void *stream)
{
  fj_variant var;
  if (!ctx || !p)
    return fj__null_arg(ctx, "fj_attention_fwd", ctx ? "p" : "ctx");
  fj_status st = fj_attention_variant(ctx, p, &var, NULL);
  return st == FJ_OK ? checked_launch(ctx, p, &var, q, k, v, o, lse, stream)
                     : st;
}
