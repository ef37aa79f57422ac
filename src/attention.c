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
#include "cache.h"
#include "ctx.h"
#include "devptr.h"
#include "driver.h"
#include "kernel.h"
#include "kparams.h"
#include "launch_record.h"
#include "mods.h"
#include "plan.h"
#include "problem.h"
#include "rel_table.h"
#include "tier.h"
#include "tunedb.h"
#include "variant.h"
#include "workspace.h"

/* The dispatch caches of fj_attention_fwd: a launch that finds its kernel
 * here skips parameters, rendering keys and the kernel map; a problem
 * whose class was seen skips the heuristic and the tuning database. */
enum { FJ_HOT = 16 };
typedef struct fj_hot {
  fj_variant v;
  uint64_t mods;    /* the hash of v.mods' form when it was stored */
  fj_kernel *kernel;
  void *function;
} fj_hot;
enum { FJ_KEY = 10 };
typedef struct fj_pick {
  int key[FJ_KEY];  /* head dim, dtypes, mask, sequence buckets, GQA ratio,
                       the heuristic's class (plan.c), the mods' form, V's
                       head dim */
  fj_variant v;
  fj_kmeta meta;    /* what v's template said of its kernel */
  fj_choice from;
} fj_pick;
/* The split-KV combine kernels, by O's head dim (V's: the combine's rows
 * are O's), the columns a block takes (the plan's combine_cols), dtype,
 * varlen and sinks. */
typedef struct fj_hot_combine {
  int head_dim_v;
  int cols;
  fj_dtype dtype;
  int varlen;
  int sinks;
  void *function;
} fj_hot_combine;

/* Plans of recent problems, by the problem's bytes and, for one with
 * modifications, a copy of what p->mods says (in mods[slot]: the list
 * moves entries to the front, the copies stay put), and the tuning
 * database's generation they were chosen under. */
enum { FJ_PLANS = 4 };
typedef struct fj_hot_plan {
  fj_problem p;
  fj_plan plan;
  unsigned generation;
  int slot;
} fj_hot_plan;

/* Tensor maps of recent TMA launches, by everything they encode: a launch
 * over the same tensors reuses them (encoding one costs host time). */
enum { FJ_MAPS = 12 };
typedef struct fj_hot_map {
  fj_tmap map;
  fj_tmap_desc desc;
} fj_hot_map;

/* Relative tables' kernels (rel_table.h) by their mods' form's hash. */
typedef struct fj_hot_rt {
  uint64_t mods;
  void *function;
} fj_hot_rt;

struct fj_dispatch {
  fj_hot_map maps[FJ_MAPS];  /* most recent first; first for alignment */
  int nmaps;
  fj_hot hot[FJ_HOT];   /* variant -> loaded kernel, most recent first */
  int nhot;
  fj_hot_combine combine[FJ_HOT];
  int ncombine;
  fj_hot_rt rt[FJ_HOT];  /* a form's relative table -> its kernel's function */
  int nrt;
  fj_pick picks[FJ_HOT]; /* problem class -> chosen variant */
  int npicks;
  fj_hot_plan plans[FJ_PLANS];  /* problem -> plan, most recent first */
  int nplans;
  fj_mods_copy mods[FJ_PLANS];  /* by fj_hot_plan.slot */
  unsigned generation;  /* of the tuning database the picks came from */
};

void fj__dispatch_free(fj_dispatch *d)
{
  free(d);
}

/* The context's dispatch caches, created on first use; ctx->lock held.
 * Aligned as the tensor maps in it must be (64 bytes). */
static fj_dispatch *dispatch(fj_ctx *ctx)
{
  size_t bytes = (sizeof(fj_dispatch) + 63) / 64 * 64;
  if (!ctx->dispatch && (ctx->dispatch = aligned_alloc(64, bytes)))
    memset(ctx->dispatch, 0, bytes);
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
  if (order == FJ_BSHD || order == FJ_THD) {
    s[0] = order == FJ_THD ? 0 : product(seq, heads, d);
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
  if (order != FJ_BHSD && order != FJ_BSHD && order != FJ_THD)
    return;
  contiguous(p->q_stride, heads_q, seq_q, head_dim, order);
  contiguous(p->o_stride, heads_q, seq_q, head_dim, order);
  contiguous(p->k_stride, heads_kv, seq_kv, head_dim, order);
  contiguous(p->v_stride, heads_kv, seq_kv, head_dim, order);
}

/* The checks that need no context come from problem.c, shared with
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
  /* The default variant has one head dim: head_dim_v's range is
   * fj__problem_check_common's, which family takes a split one the
   * plan's (fj__heuristic) and its variant's rules. */
  fj_variant_default(&v, p->head_dim, p->dtype, p->causal);
  v.kv_dtype = p->kv_dtype;
  if ((st = fj__variant_validate(ctx, &v)) != FJ_OK)
    return st;
  return fj__check_scales(ctx, p, p->k_scale, p->v_scale);
}

/* ---- choosing a variant ----------------------------------------------------------- */

/* What the choice depends on: the tuning database's problem class, and
 * the heuristic's own distinctions (plan.c). */
static void pick_key(const fj_ctx *ctx, const fj_problem *p, int key[FJ_KEY])
{
  key[0] = p->head_dim;
  key[1] = (int)p->dtype | (int)fj__o_dtype(p) << 8;  /* O's element too */
  key[2] = (int)(p->kv_dtype ? p->kv_dtype : p->dtype);
  key[3] = (int)p->causal;
  key[4] = fj__log2_floor(p->seq_q);
  key[5] = fj__log2_floor(p->seq_kv);
  key[6] = p->heads_q / p->heads_kv;
  key[7] = fj__plan_class(ctx, p);
  /* Modifications of one class may be tuned apart: their form's hash. */
  key[8] = (int)(unsigned)fj__mods_hash(p->mods);
  /* Split head dims (192 / 128) never share a pick with one head dim. */
  key[9] = fj__problem_dv(p);
}

/* The variant for p (the tuning database, else the heuristic) and what its
 * template says of its kernel (rendered once per problem class). */
static fj_status choose(fj_ctx *ctx, const fj_problem *p, fj_variant *v,
                        fj_choice *from, fj_kmeta *meta)
{
  int key[FJ_KEY];
  pick_key(ctx, p, key);
  pthread_mutex_lock(&ctx->lock);
  fj_dispatch *d = dispatch(ctx);
  if (d && d->generation != ctx->tunedb_generation) {
    d->npicks = 0;  /* the tuning database changed since these were chosen */
    d->generation = ctx->tunedb_generation;
  }
  for (int i = 0; d && i < d->npicks; i++)
    if (!memcmp(d->picks[i].key, key, sizeof key)) {
      fj_mods_info mi;
      fj__mods_info(p->mods, &mi);
      *v = d->picks[i].v;
      v->mods = mi.on ? p->mods : NULL;  /* this problem's */
      *meta = d->picks[i].meta;
      if (from)
        *from = d->picks[i].from;
      pthread_mutex_unlock(&ctx->lock);
      return FJ_OK;
    }
  fj__heuristic(ctx, p, v);
  /* Splits asked for need the family the heuristic chose for them. */
  unsigned gen = ctx->tunedb_generation;
  fj_choice c = p->splits < 2 && !v->varlen && !v->paged &&
                       fj__tune_lookup(ctx, p, v)
                    ? FJ_CHOICE_TUNED
                    : FJ_CHOICE_HEURISTIC;
  fj_status st = fj__variant_meta(ctx, v, meta);
  /* Kept only if no tuning result came in meanwhile (the layout probe's
   * build releases the lock: fj__kernel_build): a pick of the database
   * before it must not pass for one of the database after. */
  if (st == FJ_OK && d && d->generation == gen && ctx->tunedb_generation == gen) {
    fj_pick *pk = &d->picks[d->npicks < FJ_HOT ? d->npicks++ : FJ_HOT - 1];
    memcpy(pk->key, key, sizeof key);
    pk->v = *v;
    pk->meta = *meta;
    pk->from = c;
  }
  pthread_mutex_unlock(&ctx->lock);
  if (from)
    *from = c;
  return st;
}

static int table_inside(const fj_problem *p, const fj_variant *v);

/* The plan of the chosen variant: split-KV where the problem asks for
 * splits or, on the mma family, where the split rule wants more than one. */
static fj_status plan_problem(fj_ctx *ctx, const fj_problem *p, fj_plan *plan)
{
  fj_variant v;
  fj_kmeta meta;
  fj_choice from;
  const char *misfit = fj__split_misfit(ctx, p);
  if (misfit)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "head_dim_v %d with head_dim %d runs on mma wgmma only, "
                    "which does not take %s",
                    fj__problem_dv(p), p->head_dim, misfit);
  fj_status st = choose(ctx, p, &v, &from, &meta);
  if (st != FJ_OK)
    return st;
  /* The distance table's reads, proved within it for this problem (the
   * choice is shared by a class of problems; the proof is not). */
  v.table_inside = table_inside(p, &v);
  if (p->splits >= 2 && v.mma != FJ_MMA_SYNC)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "splits %d: split-KV is implemented for mma mma (sm_80 "
                    "and newer); the target %s runs mma %s",
                    p->splits, ctx->arch, fj_mma_name(v.mma));
  /* The rule is tried for decode shapes, and for others with 16 key tiles
   * or more (shorter walks gain less than the combine costs). */
  fj_mods_info mi;
  fj__mods_info(p->mods, &mi);
  int tuned_split = v.split_kv;
  int long_kv = (p->seq_kv + v.tile_n - 1) / v.tile_n >= 16;
  if (v.mma == FJ_MMA_SYNC && !mi.blocks &&
      (p->splits >= 2 || (p->splits == 0 && (fj__decode_rows(p) || long_kv))))
    v.split_kv = 1;
  if ((st = fj__plan_fill(ctx, p, &v, &meta, plan)) != FJ_OK)
    return st;
  if (plan->splits == 1 && p->splits == 0 && v.split_kv && !tuned_split) {
    /* The rule wants no split: the one-kernel variant, unless tuned so. */
    fj_variant one = v;
    one.split_kv = 0;
    if ((st = fj__plan_fill(ctx, p, &one, &meta, plan)) != FJ_OK)
      return st;
  }
  plan->from = from;
  return FJ_OK;
}

/* The plan of a problem planned before, into *plan (moved to the front);
 * 0 if none, with the generation a new plan will be chosen under in *gen.
 * A problem with modifications is found only where p->mods says what it
 * said then: the same pointer, and the same contents behind it. */
static int recent_plan(fj_ctx *ctx, const fj_problem *p, fj_plan *plan,
                       unsigned *gen)
{
  pthread_mutex_lock(&ctx->lock);
  fj_dispatch *d = dispatch(ctx);
  int found = 0;
  *gen = ctx->tunedb_generation;
  for (int i = 0; d && i < d->nplans && !found; i++)
    if (d->plans[i].generation == *gen &&
        !memcmp(&d->plans[i].p, p, sizeof *p) &&
        (!p->mods || fj__mods_copy_same(&d->mods[d->plans[i].slot], p->mods))) {
      fj_hot_plan h = d->plans[i];
      memmove(&d->plans[1], &d->plans[0], (size_t)i * sizeof d->plans[0]);
      d->plans[0] = h;
      *plan = h.plan;
      found = 1;
    }
  pthread_mutex_unlock(&ctx->lock);
  return found;
}

/* Keeps a plan made under generation gen at the front, the oldest falling
 * off (its copy's slot taken over).  (Chosen under a later generation, it
 * is kept under the earlier one and never found: a miss, not a stale
 * plan.) */
static void remember_plan(fj_ctx *ctx, const fj_problem *p,
                          const fj_plan *plan, unsigned gen)
{
  pthread_mutex_lock(&ctx->lock);
  fj_dispatch *d = dispatch(ctx);
  if (d) {
    int keep = d->nplans < FJ_PLANS ? d->nplans : FJ_PLANS - 1;
    int slot = d->nplans < FJ_PLANS ? d->nplans : d->plans[FJ_PLANS - 1].slot;
    fj_mods_copy copy;  /* the slot may hold the oldest's until it goes */
    if (!p->mods || fj__mods_copy(&copy, p->mods) == 0) {
      if (p->mods)
        d->mods[slot] = copy;
      memmove(&d->plans[1], &d->plans[0], (size_t)keep * sizeof d->plans[0]);
      d->plans[0].p = *p;
      d->plans[0].plan = *plan;
      d->plans[0].generation = gen;
      d->plans[0].slot = slot;
      d->nplans = keep + 1;
    }
  }
  pthread_mutex_unlock(&ctx->lock);
}

/* fj_attention_fwd's problem check and plan.  A problem whose bytes
 * repeat a recent one's (and whose modifications, if any, say what they
 * said then) skips both: the check reads only the problem, what its mods
 * point to and the context's target, the plan those and the tuning
 * database, whose generation the memory is kept under, so both would
 * decide again what they decided (two thirds of what a plain call did
 * before its launch path: docs/PERF.md). */
static fj_status checked_plan(fj_ctx *ctx, const fj_problem *p, fj_plan *plan)
{
  unsigned gen = 0;
  if (recent_plan(ctx, p, plan, &gen))
    return FJ_OK;
  fj_status st = fj_problem_check(ctx, p);
  if (st == FJ_OK)
    st = plan_problem(ctx, p, plan);
  if (st == FJ_OK)
    remember_plan(ctx, p, plan, gen);
  return st;
}

fj_status fj_attention_variant(fj_ctx *ctx, const fj_problem *p,
                               fj_variant *v, fj_choice *from)
{
  if (!ctx || !p || !v)
    return fj__null_arg(ctx, "fj_attention_variant",
                        !ctx ? "ctx" : !p ? "p" : "v");
  fj_plan plan;
  fj_status st = fj_attention_plan(ctx, p, &plan);
  if (st == FJ_OK) {
    *v = plan.variant;
    if (from)
      *from = plan.from;
  }
  return st;
}

fj_status fj_attention_plan(fj_ctx *ctx, const fj_problem *p, fj_plan *plan)
{
  if (!ctx || !p || !plan)
    return fj__null_arg(ctx, "fj_attention_plan",
                        !ctx ? "ctx" : !p ? "p" : "plan");
  fj__clear_error(ctx);
  fj_plan out;
  fj_status st = fj_problem_check(ctx, p);
  if (st == FJ_OK)
    st = plan_problem(ctx, p, &out);
  if (st == FJ_OK)
    *plan = out;
  return st;
}

fj_status fj_attention_workspace_size(fj_ctx *ctx, const fj_problem *p,
                                      size_t *bytes)
{
  if (!ctx || !p || !bytes)
    return fj__null_arg(ctx, "fj_attention_workspace_size",
                        !ctx ? "ctx" : !p ? "p" : "bytes");
  fj_plan plan;
  fj_status st = fj_attention_plan(ctx, p, &plan);
  if (st == FJ_OK)
    *bytes = plan.workspace_bytes;
  return st;
}

/* ---- launching ------------------------------------------------------------------- */

/* Whether variant v's kernel reads p's distance table within its extents
 * (fj__mods_table_inside) at every position its tiles reach: rows in
 * tiles of tile_m from each sequence's start (GQA packing: group rows a
 * position), keys in tiles of tile_n, anywhere below the sequence's end
 * plus a tile where split-KV ranges may start between tiles (the mma
 * family). */
static int table_inside(const fj_problem *p, const fj_variant *v)
{
  if (v->mma != FJ_MMA_WGMMA && v->mma != FJ_MMA_SYNC)
    return 0;
  /* A relative table's reads keep their test in the forward: with the
   * proof, T5's forward at (2, 16, 2048, 128) bf16 took 154.5-155.5 us
   * against 146.1-150.9 (H100, 2026-12-07), where the backward's fell
   * 15% (it takes the proof: backward.c). */
  if (fj__mods_rt_on(p->mods))
    return 0;
  long long tm = v->tile_m, tn = v->tile_n, g = p->heads_q / p->heads_kv;
  long long rows = v->pack_gqa ? (long long)p->seq_q * g : p->seq_q;
  long long rows_end = (rows + tm - 1) / tm * tm;
  long long q_end = v->pack_gqa ? (rows_end - 1) / g + 1 : rows_end;
  long long kv_end = v->mma == FJ_MMA_SYNC ? (long long)p->seq_kv + tn
                                           : ((long long)p->seq_kv + tn - 1) / tn * tn;
  return fj__mods_table_inside(p, q_end, kv_end);
}

static fj_status check_match(const fj_ctx *ctx, const fj_problem *p,
                             const fj_variant *v)
{
  fj_dtype pkv = p->kv_dtype ? p->kv_dtype : p->dtype;
  if (v->head_dim != p->head_dim || fj__head_dim_v(v) != fj__problem_dv(p) ||
      v->dtype != p->dtype || fj__kv_dtype(v) != pkv ||
      v->causal != p->causal)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "variant (head_dim %d, head_dim_v %d, dtype %s, kv %s, "
                    "causal %s) does not match the problem (head_dim %d, "
                    "head_dim_v %d, dtype %s, kv %s, causal %s)",
                    v->head_dim, fj__head_dim_v(v), fj_dtype_name(v->dtype),
                    fj_dtype_name(fj__kv_dtype(v)), fj_causal_name(v->causal),
                    p->head_dim, fj__problem_dv(p), fj_dtype_name(p->dtype),
                    fj_dtype_name(pkv), fj_causal_name(p->causal));
  if (fj__variant_o_dtype(v) != fj__o_dtype(p))
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "variant (o_dtype %s) does not match the problem "
                    "(o_dtype %s)",
                    fj_dtype_name(fj__variant_o_dtype(v)),
                    fj_dtype_name(fj__o_dtype(p)));
  if (v->paged != fj__problem_paged(p) ||
      (fj__problem_varlen(p) && !v->varlen))
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "variant (varlen %d, paged %d) does not match the "
                    "problem (%s, %s): a varlen problem needs a varlen "
                    "variant, a paged one a paged variant",
                    v->varlen, v->paged,
                    fj__problem_varlen(p) ? "varlen" : "fixed lengths",
                    fj__problem_paged(p) ? "paged" : "dense K/V");
  const char *differs = fj__mods_form_diff(v->mods, p->mods);
  if (differs) {
    fj_mods_info vi, pi;
    fj__mods_info(v->mods, &vi);
    fj__mods_info(p->mods, &pi);
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "variant's modifications (%s) are not the problem's (%s): "
                    "they differ in %s; a variant takes the expressions, "
                    "parameters' names, types and ranks, window, softcap and "
                    "sinks of its problem (fj_attention_variant sets them)",
                    vi.on ? "on" : "none", pi.on ? "on" : "none", differs);
  }
  if (v->mma == FJ_MMA_WGMMA && ((p->cu_seqlens_q && p->total_q < 1) ||
                                 (p->cu_seqlens_kv && p->total_kv < 1)))
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "%s 0 with %s: the wgmma family loads packed rows by "
                    "TMA, which must know where the tensor ends; set the "
                    "packed tensor's rows (or take the mma family)",
                    p->cu_seqlens_q && p->total_q < 1 ? "total_q" : "total_kv",
                    p->cu_seqlens_q && p->total_q < 1 ? "cu_seqlens_q"
                                                       : "cu_seqlens_kv");
  return FJ_OK;
}

/* The kernels move rows in 16-byte pieces: base pointers 16-byte aligned,
 * every stride a whole number of 16-byte pieces. */
fj_status fj__check_alignment(const fj_ctx *ctx, const char *name,
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
  /* per16 is a power of two: a mask, not a 64-bit division, on every
   * call's twelve strides. */
  for (int i = 0; i < 3; i++)
    if ((s[i] & (per16 - 1)) != 0)
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
  fj_status st = fj__check_alignment(ctx, "q", q, p->q_stride, p->dtype);
  if (st == FJ_OK)
    st = fj__check_alignment(ctx, "k", k, p->k_stride, kv);
  if (st == FJ_OK)
    st = fj__check_alignment(ctx, "v", v, p->v_stride, kv);
  if (st == FJ_OK)
    st = fj__check_alignment(ctx, "o", o, p->o_stride, fj__o_dtype(p));
  /* One float each (o_amax raised by atomics). */
  const void *one[2] = {p->o_scale, p->o_amax};
  for (int i = 0; i < 2 && st == FJ_OK; i++)
    if ((uintptr_t)one[i] % 4)
      st = fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "%s = %p is not 4-byte aligned: it points at a float",
                    i ? "o_amax" : "o_scale", one[i]);
  if (st == FJ_OK)
    st = fj__mods_check_blocks_data(ctx, p->mods);
  return st == FJ_OK ? fj__mods_check_data(ctx, p->mods) : st;
}

/* The built-in modifications' launch arguments: an unbounded side of the
 * window as FJ_WINDOW_MAX, a causal mask as the right side 0. */
static void fill_mods(fj_kparams *kp, const fj_problem *p,
                      const fj_mods_info *mi)
{
  const fj_mods *m = p->mods;
  kp->window_left = kp->window_right = FJ_WINDOW_MAX;
  if (mi->window) {
    if (m->window_left >= 0)
      kp->window_left = m->window_left;
    if (m->window_right >= 0)
      kp->window_right = m->window_right;
  }
  if (p->causal != FJ_CAUSAL_NONE)
    kp->window_right = 0;
  /* The kernels add a side to a row's diagonal (up to seq_kv - 1) in
   * 32-bit ints: a side of FJ_WINDOW_MAX (2^30, also an unbounded one)
   * with seq_kv 2^30 makes 2^31, and the last row tile's keys_end wraps
   * negative (its rows see no key).  FJ_WINDOW_MAX - 1 hides and shows
   * the same keys: a side of 2^30 reaches past 2^30 - 1 only from a row
   * whose diagonal lies below 0 (above seq_kv - 1 for the left side),
   * where no key (0 .. seq_kv - 1 <= 2^30 - 1) is 2^30 away. */
  if (kp->window_left > FJ_WINDOW_MAX - 1)
    kp->window_left = FJ_WINDOW_MAX - 1;
  if (kp->window_right > FJ_WINDOW_MAX - 1)
    kp->window_right = FJ_WINDOW_MAX - 1;
  if (mi->softcap) {
    kp->softcap = m->softcap;
    kp->softcap_inv = 1.f / m->softcap;
    kp->softcap_shift = fj__mods_softcap_shift(m, p->dtype);
  }
  if (mi->blocks) {
    const fj_block_mask *bm = m->block_mask;
    kp->bm_num = bm->kv_num;
    kp->bm_idx = bm->kv_indices;
    kp->bm_full_num = bm->full_num;
    kp->bm_full_idx = bm->full_indices;
    kp->bm_stride_h = bm->heads > 1 ? bm->q_blocks : 0;
    kp->bm_stride_b = bm->batch > 1 ? bm->heads * bm->q_blocks : 0;
    kp->bm_q_blocks = bm->q_blocks;
    kp->bm_kv_blocks = bm->kv_blocks;
  }
  /* The sinks: read by the epilogue of a one-kernel variant, by the
   * combine of a split one (never by the partial kernels). */
  kp->sinks = mi->sinks ? m->sinks : NULL;
}

void fj__fill_params(fj_kparams *kp, const fj_problem *p, const void *q,
                     const void *k, const void *v, void *o, float *lse)
{
  fj_mods_info mi;
  fj__mods_info(p->mods, &mi);
  memset(kp, 0, sizeof *kp);
  kp->q = q;
  kp->k = k;
  kp->v = v;
  kp->o = o;
  kp->lse = lse;
  kp->k_scale = p->k_scale;
  kp->v_scale = p->v_scale;
  kp->q_scale = p->q_scale;
  kp->vt_keys = (p->seq_kv + 127) / 128 * 128;
  kp->scale_per_head = p->scale_layout != FJ_SCALE_PER_TENSOR;
  kp->o_scale = p->o_scale;
  kp->o_amax = p->o_amax;
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
  /* The diagonal of the causal mask and the window: bottom-right unless
   * the mask is top-left. */
  kp->causal_offset = p->causal == FJ_CAUSAL_BOTTOM_RIGHT ||
                              (p->causal == FJ_CAUSAL_NONE && mi.window)
                          ? p->seq_kv - p->seq_q
                          : 0;
  fill_mods(kp, p, &mi);
  double scale = p->scale != 0.f ? (double)p->scale : 1.0 / sqrt(p->head_dim);
  kp->scale_log2 = (float)(scale * 1.4426950408889634);
  kp->splits = 1;
  kp->cu_seqlens_q = p->cu_seqlens_q;
  kp->cu_seqlens_kv = p->cu_seqlens_kv;
  kp->seqused_kv = p->seqused_kv;
  kp->block_table = p->block_table;
  kp->max_pages = p->max_pages;
  kp->num_pages = p->num_pages;
  while (p->page_size > 1 << kp->page_shift)
    kp->page_shift++;
}

/* The kernel and its function, built and loaded if needed; ctx->lock held
 * and the CUDA context entered.  The launches of the last few variants
 * are remembered as they are (variant in, function out), so that a launch
 * that repeats one costs a comparison, not a parameter build. */
static int hot_kernel(fj_ctx *ctx, const fj_variant *v, uint64_t mods,
                      fj_kernel **k, void **fn)
{
  fj_dispatch *d = dispatch(ctx);
  for (int i = 0; d && i < d->nhot; i++)
    if (!memcmp(&d->hot[i].v, v, sizeof *v) && d->hot[i].mods == mods) {
      *k = d->hot[i].kernel;
      *fn = d->hot[i].function;
      return 1;
    }
  return 0;
}

/* k's function, loaded if needed, and remembered for v. */
static fj_status keep_hot(fj_ctx *ctx, const fj_variant *v, uint64_t mods,
                          fj_kernel *k, void **fn)
{
  fj_dispatch *d = dispatch(ctx);
  fj_status st = fj__kernel_function(ctx, k, fn);
  if (st == FJ_OK && d) {
    fj_hot *h = &d->hot[d->nhot < FJ_HOT ? d->nhot++ : FJ_HOT - 1];
    h->v = *v;
    h->mods = mods;
    h->kernel = k;
    h->function = *fn;
  }
  return st;
}

fj_status fj_rel_table_kernel(fj_ctx *ctx, const fj_problem *p, fj_kernel **k)
{
  if (!ctx || !p || !k)
    return fj__null_arg(ctx, "fj_rel_table_kernel",
                        !ctx ? "ctx" : !p ? "p" : "k");
  fj__clear_error(ctx);
  fj_status st = fj_problem_check(ctx, p);
  if (st != FJ_OK)
    return st;
  if (!fj__rt_bytes(p))
    return fj__fail(ctx, FJ_ERR_NOT_FOUND,
                    "fj_rel_table_kernel: the problem's kernels read no "
                    "relative table (its score expression has no subtree of "
                    "the query head and the distance alone that costs more "
                    "than a read at a distance, or it is checked, has eight "
                    "parameters, or FLASHJIT_REL_TABLE=0)");
  pthread_mutex_lock(&ctx->lock);
  st = fj__rt_kernel(ctx, p, k);
  pthread_mutex_unlock(&ctx->lock);
  return st;
}

fj_status fj__rt_function(fj_ctx *ctx, const fj_problem *p, void **fn)
{
  fj_dispatch *d = dispatch(ctx);
  uint64_t mods = fj__mods_hash(p->mods);
  for (int i = 0; d && i < d->nrt; i++)
    if (d->rt[i].mods == mods) {
      *fn = d->rt[i].function;
      return FJ_OK;
    }
  fj_kernel *k;
  fj_status st = fj__rt_kernel(ctx, p, &k);
  if (st == FJ_OK)
    st = fj__kernel_function(ctx, k, fn);
  if (st == FJ_OK && d) {
    int at = d->nrt < FJ_HOT ? d->nrt++ : FJ_HOT - 1;
    memmove(&d->rt[1], &d->rt[0], (size_t)at * sizeof d->rt[0]);
    d->rt[0] = (fj_hot_rt){mods, *fn};
  }
  return st;
}

static fj_status ready_kernel(fj_ctx *ctx, const fj_variant *v,
                              fj_kernel **k, void **fn)
{
  uint64_t mods = fj__mods_hash(v->mods);
  if (hot_kernel(ctx, v, mods, k, fn))
    return FJ_OK;
  /* A compile of v already running for the tiered JIT is joined, not
   * started again (fj__variant_kernel where none is). */
  fj_status st = fj__tier_wait(ctx, v, k);
  return st == FJ_OK ? keep_hot(ctx, v, mods, *k, fn) : st;
}

/* ready_kernel under the tiered JIT (tier.c): where v's kernel is still to
 * be compiled (and the stream is not being captured, nor the thread
 * recording), the problem's first kernel, its function and its plan in
 * *first (a block of 8 warps per 8 rows of a head), and *is_first
 * set; ctx->lock held and the CUDA context entered. */
static fj_status ready_tiered(fj_ctx *ctx, const fj_problem *p,
                              const fj_variant *v, void *stream, fj_kernel **k,
                              void **fn, fj_plan *first, int *is_first)
{
  uint64_t mods = fj__mods_hash(v->mods);
  *is_first = 0;
  if (hot_kernel(ctx, v, mods, k, fn))
    return FJ_OK;
  /* A graph being captured, or a launch record, would keep the first
   * kernel for good: those calls wait for the chosen one. */
  int capturing = 0;
  fj_status st = fj__cu_capturing(ctx, stream, &capturing);
  if (st != FJ_OK)
    return st;
  if (capturing || fj__launch_recording()) {
    st = fj__tier_wait(ctx, v, k);
    return st == FJ_OK ? keep_hot(ctx, v, mods, *k, fn) : st;
  }
  fj_kjob *fresh;
  st = fj__tier_kernel(ctx, v, k, &fresh);
  if (st != FJ_OK || *k)
    return st == FJ_OK ? keep_hot(ctx, v, mods, *k, fn) : st;
  /* The first kernel's compile, then the chosen one's, not both at once. */
  if ((st = fj__tier_first(ctx, v, k)) == FJ_OK)
    st = fj__kernel_function(ctx, *k, fn);
  int origin = *k ? __atomic_load_n(&(*k)->origin, __ATOMIC_RELAXED) : 0;
  if (st == FJ_OK && origin != FJ_CACHE_MEMORY)
    fj__log(ctx, FJ_LOG_INFO, "tiered JIT: %s answers (%s)", (*k)->meta.symbol,
            origin == FJ_CACHE_DISK ? "from the disk cache" : "compiled");
  fj_status st2 = fresh ? fj__tier_start(ctx, v, fresh) : FJ_OK;
  if (st != FJ_OK || st2 != FJ_OK)
    return st != FJ_OK ? st : st2;
  if ((*k)->meta.rows_per_block < 1)
    return fj__fail(ctx, FJ_ERR_TEMPLATE,
                    "%s says it covers %d query rows a block "
                    "(meta.rows_per_block): an attention kernel covers "
                    "1..65536", (*k)->meta.symbol, (*k)->meta.rows_per_block);
  fj__cache_count_tier(ctx, 1, 0);
  memset(first, 0, sizeof *first);
  first->variant = *v;
  first->splits = 1;
  first->rows = p->seq_q;
  first->grid[0] = (unsigned)((p->seq_q + (*k)->meta.rows_per_block - 1) /
                              (*k)->meta.rows_per_block);
  first->grid[1] = (unsigned)p->heads_q;
  first->grid[2] = (unsigned)p->batch;
  first->threads = (unsigned)(*k)->meta.threads;
  first->smem_bytes = (unsigned)(*k)->meta.smem_bytes;
  /* Its workspace: a relative table alone (rel_table.h). */
  first->workspace_bytes = fj__rt_bytes(p);
  *is_first = 1;
  return FJ_OK;
}

fj_status fj__combine_kernel(fj_ctx *ctx, const fj_variant *v, int cols,
                             fj_kernel **k)
{
  char symbol[64], slice[16] = "";
  fj_mods_info mi;
  fj__mods_info(v->mods, &mi);
  int sinks = mi.sinks;
  /* O's columns: the attention variant's head_dim_v. */
  int d = fj__head_dim_v(v);
  /* A block's slice of them: a sliced kernel is named apart, for the
   * caches and `flashjit plan`; one slice keeps the plain name. */
  if (cols != d)
    snprintf(slice, sizeof slice, "_c%d", cols);
  snprintf(symbol, sizeof symbol, "fj_combine_d%d_%s%s%s%s", d,
           fj_dtype_name(v->dtype), v->varlen ? "_vl" : "",
           sinks ? "_sink" : "", slice);
  fj_param params[] = {
      {"template", FJ_PARAM_STR, 0, "combine.cu", NULL},
      {"symbol", FJ_PARAM_STR, 0, symbol, NULL},
      {"arch", FJ_PARAM_STR, 0, ctx->arch, NULL},
      {"sm", FJ_PARAM_INT, ctx->sm, NULL, NULL},
      {"version", FJ_PARAM_STR, 0, fj_version(), NULL},
      {"params_bytes", FJ_PARAM_INT, (long long)sizeof(fj_kparams), NULL, NULL},
      {"head_dim", FJ_PARAM_INT, d, NULL, NULL},
      /* A block's columns: the plan's grid y is their slices. */
      {"cols", FJ_PARAM_INT, cols, NULL, NULL},
      {"dtype", FJ_PARAM_STR, 0, fj_dtype_name(v->dtype), NULL},
      {"varlen", FJ_PARAM_BOOL, v->varlen, NULL, NULL},
      {"sinks", FJ_PARAM_BOOL, sinks, NULL, NULL},
  };
  return fj__kernel_build(ctx, "combine.cu", params, FJ_ARRAY_LEN(params), k);
}

fj_status fj__combine_function(fj_ctx *ctx, const fj_variant *v, int cols,
                               void **fn)
{
  fj_mods_info mi;
  fj__mods_info(v->mods, &mi);
  fj_dispatch *d = dispatch(ctx);
  /* By O's columns, as fj__combine_kernel renders it: 576/504 and
   * 576/512 share head_dim, not their combine (until 2026-12-05 the key
   * was head_dim, and a context that had run one took its combine for
   * the other: wrong O and writes past it); and by the columns a block
   * takes, the plan's, which its grid's y counts slices of. */
  int dv = fj__head_dim_v(v);
  for (int i = 0; d && i < d->ncombine; i++)
    if (d->combine[i].head_dim_v == dv && d->combine[i].cols == cols &&
        d->combine[i].dtype == v->dtype && d->combine[i].varlen == v->varlen &&
        d->combine[i].sinks == mi.sinks) {
      *fn = d->combine[i].function;
      return FJ_OK;
    }
  fj_kernel *k;
  fj_status st = fj__combine_kernel(ctx, v, cols, &k);
  if (st == FJ_OK)
    st = fj__kernel_function(ctx, k, fn);
  if (st == FJ_OK && d) {
    fj_hot_combine *h =
        &d->combine[d->ncombine < FJ_HOT ? d->ncombine++ : FJ_HOT - 1];
    h->head_dim_v = dv;
    h->cols = cols;
    h->dtype = v->dtype;
    h->varlen = v->varlen;
    h->sinks = mi.sinks;
    h->function = *fn;
  }
  return st;
}

/* A tensor map encoded before for the same description (moved to the
 * front), into *out; 0 if none. */
static int recent_map(fj_ctx *ctx, const fj_tmap_desc *m, fj_tmap *out)
{
  pthread_mutex_lock(&ctx->lock);
  fj_dispatch *d = dispatch(ctx);
  int found = 0;
  for (int i = 0; d && i < d->nmaps && !found; i++)
    if (!memcmp(&d->maps[i].desc, m, sizeof *m)) {
      fj_hot_map h = d->maps[i];
      memmove(&d->maps[1], &d->maps[0], (size_t)i * sizeof d->maps[0]);
      d->maps[0] = h;
      *out = h.map;
      found = 1;
    }
  pthread_mutex_unlock(&ctx->lock);
  return found;
}

/* Keeps a newly encoded map at the front, the oldest falling off. */
static void remember_map(fj_ctx *ctx, const fj_tmap_desc *m,
                         const fj_tmap *map)
{
  pthread_mutex_lock(&ctx->lock);
  fj_dispatch *d = dispatch(ctx);
  if (d) {
    int keep = d->nmaps < FJ_MAPS ? d->nmaps : FJ_MAPS - 1;
    memmove(&d->maps[1], &d->maps[0], (size_t)keep * sizeof d->maps[0]);
    d->maps[0].desc = *m;
    d->maps[0].map = *map;
    d->nmaps = keep + 1;
  }
  pthread_mutex_unlock(&ctx->lock);
}

/* One rank-4 tensor map (head dim, sequence, heads, batch) of a tensor
 * with element strides s, boxes of one 128-byte swizzled row (64 columns
 * of a 16-bit type, 128 of an 8-bit one: templates/tma_ring.lua's panels)
 * by `rows` rows in the 128-byte swizzle.  A dimension of extent 1 may have any stride; TMA wants one it
 * can encode. */
fj_status fj__tensor_map(fj_ctx *ctx, const void *base, fj_dtype dt,
                         const int64_t s[3], int d, int seq, int heads,
                         int batch, int rows, fj_tmap *out)
{
  int64_t esz = fj__dtype_bytes(dt);
  fj_tmap_desc m;
  memset(&m, 0, sizeof m);  /* compared whole, padding included */
  m.base = (uint64_t)(uintptr_t)base;
  m.dtype = dt;
  m.rank = 4;
  int64_t dims[4] = {d, seq, heads, batch};
  for (int i = 0; i < 4; i++) {
    m.dims[i] = dims[i];
    m.box[i] = i == 0 ? (int)(128 / esz) : i == 1 ? rows : 1;
  }
  for (int i = 0; i < 3; i++)
    m.strides[i] = m.dims[i + 1] == 1 && s[2 - i] == 0 ? 16 : s[2 - i] * esz;
  m.swizzle_bytes = 128;
  if (recent_map(ctx, &m, out))
    return FJ_OK;
  fj_status st = fj__cu_tensor_map(ctx, &m, out);
  if (st == FJ_OK)
    remember_map(ctx, &m, out);
  return st;
}

/* The tensor maps of a TMA kernel: Q in boxes of the block's rows, K and V
 * in boxes of tile_n rows; V of head_dim_v columns (the TMA reads zeros
 * past them into a padded panel, as past head_dim for Q and K). */
static fj_status tensor_maps(fj_ctx *ctx, const fj_problem *p,
                             const fj_variant *v, const fj_kernel *kern,
                             const void *q, const void *k, const void *vp,
                             fj_tmaps *maps)
{
  /* Packed sequences are one batch of their total rows. */
  int sq = p->cu_seqlens_q ? p->total_q : p->seq_q;
  int bq = p->cu_seqlens_q ? 1 : p->batch;
  int skv = p->cu_seqlens_kv ? p->total_kv : p->seq_kv;
  int bkv = p->cu_seqlens_kv ? 1 : p->batch;
  fj_status st = fj__tensor_map(ctx, q, p->dtype, p->q_stride, p->head_dim, sq,
                            p->heads_q, bq, kern->meta.rows_per_block,
                            &maps->q);
  if (st == FJ_OK)
    st = fj__tensor_map(ctx, k, p->dtype, p->k_stride, p->head_dim, skv,
                    p->heads_kv, bkv, v->tile_n, &maps->k);
  if (st == FJ_OK)
    st = fj__tensor_map(ctx, vp, p->dtype, p->v_stride, fj__problem_dv(p),
                    skv, p->heads_kv, bkv, v->tile_n, &maps->v);
  return st;
}

/* FP8 attention: V transposed into the workspace by the module's _vt
 * kernel (blocks of 128 keys x 64 of the head dim, one (batch, KV head)
 * each, 256 threads), and the tensor map the main kernel reads it by:
 * boxes of 128 keys (one 128-byte swizzled row) by the head dim. */
static fj_status vt_pass(fj_ctx *ctx, const fj_problem *p, void *vt_fn,
                         fj_kparams *kp, fj_tmaps *maps, void *stream)
{
  int64_t keys = kp->vt_keys, d = p->head_dim;
  int64_t s[3] = {(int64_t)p->heads_kv * d * keys, d * keys, keys};
  /* Boxes of head_dim rows: the kernel's V^T rows (its DV; FP8's head
   * dims are multiples of 64, P V and O unpadded). */
  fj_status st = fj__tensor_map(ctx, kp->vt, FJ_E4M3, s, kp->vt_keys,
                                p->head_dim, p->heads_kv, p->batch,
                                p->head_dim, &maps->v);
  void *args[1] = {kp};
  fj_launch l = {vt_fn, {(unsigned)(keys / 128), (unsigned)(d / 64),
                         (unsigned)(p->batch * p->heads_kv)},
                 {256, 1, 1}, 0, stream, args, 0};  /* launch_record.c's too */
  return st == FJ_OK ? fj__cu_launch(ctx, &l) : st;
}

/* The workspace of a launch: the caller's, or the context's for the
 * stream.  Split-KV partials: O's partial rows first, then their
 * log-sum-exp.  A dynamic walk: its counter, zeroed in stream order. */
static fj_status workspace(fj_ctx *ctx, const fj_problem *p,
                           const fj_plan *plan, size_t rt, void *ws,
                           size_t ws_bytes, void *stream, fj_kparams *kp,
                           uint64_t *table)
{
  uint64_t base = (uint64_t)(uintptr_t)ws;
  fj_status st = FJ_OK;
  if (!ws)
    st = fj__workspace(ctx, stream, plan->workspace_bytes, &base);
  else if (ws_bytes < plan->workspace_bytes)
    st = fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "workspace_bytes %zu is too small: %s need %zu",
                  ws_bytes,
                  plan->variant.split_kv            ? "the splits"
                  : plan->variant.dtype == FJ_E4M3 ? "FP8 attention's V^T"
                  : rt                              ? "the score's relative table"
                                                    : "the work counter",
                  plan->workspace_bytes);
  else if (base % 16)
    st = fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "workspace %p is not 16-byte aligned", ws);
  if (st != FJ_OK)
    return st;
  /* The score expression's relative table last (fj__plan_fill: rt of
   * its bytes), the rest before it. */
  size_t rest = plan->workspace_bytes - rt;
  *table = rt ? base + rest : 0;
  /* FP8 attention: V^T first (fj__plan_vt_bytes). */
  size_t vt = fj__plan_vt_bytes(p, &plan->variant);
  kp->vt = vt ? (unsigned char *)(uintptr_t)base : NULL;
  base += vt;
  /* A table alone (the tiered JIT's first kernel's plan: ready_tiered),
   * or with V^T alone. */
  if (rest == 0 || (!plan->variant.split_kv && fj__plan_rt_offset(vt) >= rest))
    return FJ_OK;
  if (!plan->variant.split_kv) {
    kp->work = (unsigned *)(uintptr_t)base;
    return fj__cu_memset32_async(ctx, base, 0, 1, stream);
  }
  size_t rows = (size_t)plan->splits * (size_t)p->batch *
                (size_t)p->heads_q * (size_t)p->seq_q;
  kp->splits = plan->splits;
  kp->combine_warps = fj__combine_warps(plan->splits);
  kp->o_part = (float *)(uintptr_t)base;
  kp->lse_part = kp->o_part + rows * (size_t)fj__problem_dv(p);
  return FJ_OK;
}

/* Checked mode (fj_mods.checked): a record of 6 words for the kernel,
 * zeroed in stream order; the call waits for its kernels, so a stream
 * being captured is refused. */
static fj_status oob_start(fj_ctx *ctx, const char *who, void *stream,
                           uint64_t *oob)
{
  int capturing = 0;
  fj_status st = fj__cu_capturing(ctx, stream, &capturing);
  if (st == FJ_OK && capturing)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "%s: checked mode (mods.checked or FLASHJIT_CHECK_BOUNDS=1) "
                    "waits for each call's kernels; it cannot run while the "
                    "stream is being captured",
                    who);
  if (st == FJ_OK)
    st = fj__cu_alloc(ctx, FJ_MOD_OOB_WORDS * 4, oob);
  if (st == FJ_OK)
    st = fj__cu_memset32_async(ctx, *oob, 0, FJ_MOD_OOB_WORDS, stream);
  return st;
}

/* After the launches (status st): waits for them, reads the record and
 * frees it; a recorded read becomes FJ_ERR_INVALID_ARG naming it. */
static fj_status oob_finish(fj_ctx *ctx, const char *who, const fj_mods *m,
                            uint64_t oob, fj_status st)
{
  uint32_t rec[FJ_MOD_OOB_WORDS] = {0};
  fj_status s2 = fj__cu_sync(ctx);
  if (s2 == FJ_OK)
    s2 = fj__cu_copy_to_host(ctx, rec, oob, sizeof rec);
  fj__cu_free(oob);
  if (st != FJ_OK)
    return st;
  if (s2 != FJ_OK)
    return s2;
  if (!rec[0])
    return FJ_OK;
  char msg[256];
  fj__mods_oob_message(m, rec, msg, sizeof msg);
  return fj__fail(ctx, FJ_ERR_INVALID_ARG, "%s: checked mode: %s", who, msg);
}

/* Runs a plan: the attention kernel, and for a split variant the combine
 * after it, on one stream.  `fresh`: the plan was made for this call
 * (fj_attention_fwd) and is used as it is while the kernel's threads and
 * shared memory agree with it; otherwise (a caller's plan, or a variant
 * with a split count) only its variant and splits are taken and the rest
 * is planned again from the kernel. */
static fj_status launch(fj_ctx *ctx, const char *who, const fj_problem *p,
                        const fj_plan *given, int fresh, const void *q,
                        const void *k, const void *vp, void *o, float *lse,
                        void *ws, size_t ws_bytes, void *stream)
{
  fj_kernel *kern;
  void *fn, *combine_fn = NULL;
  fj_kparams kp;
  fj_tmaps maps;
  unsigned char mod_args[FJ_MOD_ARGS_MAX];
  fj_plan plan = *given;
  const fj_variant *v = &given->variant;
  void *args[3] = {&kp, &maps, mod_args};
  fj_status st = fj__cu_enter(ctx);
  if (st != FJ_OK)
    return st;
  /* Memory of another device is refused before anything is queued. */
  st = fj__devptr_check_call(ctx, who, p, q, k, vp, o, lse, ws);
  /* The tiered JIT answers fj_attention_fwd's own choices only. */
  int first = 0;
  pthread_mutex_lock(&ctx->lock);
  if (st == FJ_OK)
    st = fresh && fj__tier_serves(ctx, p, v)
             ? ready_tiered(ctx, p, v, stream, &kern, &fn, &plan, &first)
             : ready_kernel(ctx, v, &kern, &fn);
  fj_problem pp = *p;
  pp.splits = given->splits;
  if (st == FJ_OK && !first &&
      (!fresh || kern->meta.threads != (int)plan.threads ||
       kern->meta.smem_bytes != (int)plan.smem_bytes))
    st = fj__plan_fill(ctx, &pp, v, &kern->meta, &plan);
  /* The combine of the plan's columns: planned before it is fetched. */
  if (st == FJ_OK && v->split_kv && !first)
    st = fj__combine_function(ctx, v, plan.combine_cols, &combine_fn);
  /* FP8 attention: the module's pass that writes V^T (the template's
   * second kernel, <symbol>_vt). */
  void *vt_fn = NULL;
  if (st == FJ_OK && v->dtype == FJ_E4M3)
    st = fj__kernel_vt_function(ctx, kern, &vt_fn);
  /* The score expression's relative table: its own kernel, first. */
  void *rt_fn = NULL;
  size_t rt = st == FJ_OK ? fj__rt_bytes(p) : 0;
  if (rt)
    st = fj__rt_function(ctx, p, &rt_fn);
  pthread_mutex_unlock(&ctx->lock);
  if (st == FJ_OK && kern->meta.tma)
    st = tensor_maps(ctx, p, v, kern, q, k, vp, &maps);
  /* Checked mode: a zeroed record for the first read out of range. */
  uint64_t oob = 0;
  fj_mods_info mi;
  fj__mods_info(p->mods, &mi);
  int checked = st == FJ_OK && mi.checked;
  if (checked)
    st = oob_start(ctx, who, stream, &oob);
  /* The parameters' values follow the Params (and the tensor maps); kern
   * is unset where an earlier step failed. */
  /* A relative table's argument follows the user's (fj__rt_pass), even
   * where they have none. */
  size_t used = st == FJ_OK ? fj__mods_args(p->mods, oob, mod_args) : 0;
  if ((used > 0 || rt_fn) && !kern->meta.tma)
    args[1] = mod_args;
  uint64_t table = 0;
  if (st == FJ_OK) {
    fj__fill_params(&kp, p, q, k, vp, o, lse);
    if (plan.workspace_bytes)
      st = workspace(ctx, p, &plan, rt, ws, ws_bytes, stream, &kp, &table);
  }
  /* FP8 attention's max |O|: raised by the kernel from 0. */
  if (st == FJ_OK && kp.o_amax)
    st = fj__cu_memset32_async(ctx, (uint64_t)(uintptr_t)kp.o_amax, 0, 1, stream);
  if (st == FJ_OK && vt_fn)
    st = vt_pass(ctx, p, vt_fn, &kp, &maps, stream);
  if (st == FJ_OK && rt_fn)
    st = fj__rt_pass(ctx, p, rt_fn, table, used, mod_args, &kp, stream);
  if (st == FJ_OK) {
    fj_launch l = {fn, {plan.grid[0], plan.grid[1], plan.grid[2]},
                   {plan.threads, 1, 1}, plan.smem_bytes, stream, args, 0};
    st = fj__cu_launch(ctx, &l);
  }
  if (st == FJ_OK && combine_fn) {
    fj_launch l = {combine_fn,
                   {plan.combine_grid[0], plan.combine_grid[1], plan.combine_grid[2]},
                   {plan.combine_threads, 1, 1}, 0, stream, args,
                   /* combine.cu waits for the partials */ ctx->sm >= 90};
    st = fj__cu_launch(ctx, &l);
  }
  /* The record of what was launched: only where every launch was queued
   * (the public calls cleared it on entry), and not a relative table's
   * pass, which a record does not hold. */
  if (st == FJ_OK && !oob && !rt_fn && fj__launch_recording()) {
    fj_launch_note n = {&plan, fn, combine_fn, vt_fn,
                        {(unsigned)(kp.vt_keys / 128), (unsigned)(p->head_dim / 64),
                         (unsigned)(p->batch * p->heads_kv)},
                        stream, args, &kp, &maps, mod_args};
    fj__launch_record_note(&n);
  }
  if (oob)
    st = oob_finish(ctx, who, p->mods, oob, st);
  fj__cu_leave(ctx);
  return st;
}

/* The checks every launch makes, then the launch; `who` names the public
 * call in messages. */
static fj_status checked_launch(fj_ctx *ctx, const char *who,
                                const fj_problem *p,
                                const fj_plan *plan, int fresh,
                                const void *q, const void *k, const void *vp,
                                void *o, float *lse, void *ws,
                                size_t ws_bytes, void *stream)
{
  fj_status st = check_match(ctx, p, &plan->variant);
  /* A caller's variant or plan may claim a proof its problem fails; the
   * library's own plan proved it for this problem (plan_problem). */
  if (st == FJ_OK && !fresh && plan->variant.table_inside &&
      !table_inside(p, &plan->variant))
    st = fj__mods_table_inside_fail(ctx, "variant", "fj_attention_variant");
  if (st == FJ_OK)
    st = check_pointers(ctx, p, q, k, vp, o);
  /* The mma family's split head dims read V from K's rows (MLA). */
  const fj_variant *v = &plan->variant;
  if (st == FJ_OK && v->mma == FJ_MMA_SYNC && fj__head_dim_v(v) != v->head_dim &&
      (vp != k || !fj__problem_v_in_k(p)))
    st = fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "%s: head_dim_v %d with head_dim %d on mma mma reads V as "
                  "the first %d columns of K's rows (MLA's latent cache): v "
                  "must be k, with v_stride k_stride (v %p, k %p)",
                  who, fj__head_dim_v(v), v->head_dim, fj__head_dim_v(v), vp, k);
  if (st == FJ_OK && !ctx->has_device)
    st = fj__fail(ctx, FJ_ERR_COMPILE_ONLY,
                  "cannot launch on a compile-only context (arch %s)",
                  ctx->arch);
  return st == FJ_OK ? launch(ctx, who, p, plan, fresh, q, k, vp, o, lse, ws,
                              ws_bytes, stream)
                     : st;
}

fj_status fj_attention_fwd_variant(fj_ctx *ctx, const fj_problem *p,
                                   const fj_variant *v, const void *q,
                                   const void *k, const void *vp, void *o,
                                   float *lse, void *stream)
{
  fj__launch_record_clear();  /* a refused call launched nothing */
  if (!ctx || !p || !v)
    return fj__null_arg(ctx, "fj_attention_fwd_variant",
                        !ctx ? "ctx" : !p ? "p" : "v (the variant)");
  fj__clear_error(ctx);
  fj_plan plan = {.variant = *v, .splits = p->splits};
  fj_status st = fj_problem_check(ctx, p);
  return st == FJ_OK ? checked_launch(ctx, "fj_attention_fwd_variant", p,
                                      &plan, 0, q, k, vp, o, lse, NULL, 0,
                                      stream)
                     : st;
}

fj_status fj_attention_fwd_plan(fj_ctx *ctx, const fj_problem *p,
                                const fj_plan *plan, const void *q,
                                const void *k, const void *v, void *o,
                                float *lse, void *workspace,
                                size_t workspace_bytes, void *stream)
{
  fj__launch_record_clear();  /* a refused call launched nothing */
  if (!ctx || !p || !plan)
    return fj__null_arg(ctx, "fj_attention_fwd_plan",
                        !ctx ? "ctx" : !p ? "p" : "plan");
  fj__clear_error(ctx);
  fj_status st = fj_problem_check(ctx, p);
  if (st == FJ_OK && (plan->splits < 1 || plan->splits > FJ_SPLITS_MAX))
    st = fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "plan->splits %d is invalid: 1..%d", plan->splits,
                  FJ_SPLITS_MAX);
  return st == FJ_OK ? checked_launch(ctx, "fj_attention_fwd_plan", p, plan,
                                      0, q, k, v, o, lse, workspace,
                                      workspace_bytes, stream)
                     : st;
}

fj_status fj_attention_fwd(fj_ctx *ctx, const fj_problem *p, const void *q,
                           const void *k, const void *v, void *o, float *lse,
                           void *stream)
{
  fj__launch_record_clear();  /* a refused call launched nothing */
  if (!ctx || !p)
    return fj__null_arg(ctx, "fj_attention_fwd", ctx ? "p" : "ctx");
  fj__clear_error(ctx);
  fj_plan plan;
  fj_status st = checked_plan(ctx, p, &plan);
  return st == FJ_OK ? checked_launch(ctx, "fj_attention_fwd", p, &plan, 1,
                                      q, k, v, o, lse, NULL, 0, stream)
                     : st;
}
