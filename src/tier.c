/*
 * tier.c -- the tiered JIT (fj_ctx_opts.jit_tiers).  A call whose chosen
 * kernel is in neither cache starts that kernel's compile on a thread of
 * its own and launches the problem's first kernel: CUDA cores, loops left
 * rolled, about 0.2 s of NVRTC against the chosen kernel's 0.5-1.5 s
 * (docs/PERF.md).  Each later call
 * asks whether the compile has ended (an atomic load); once it has, the
 * kernel joins the caches as any other and the call launches it.  The
 * compiles in flight are kept per variant (and modifications' form), so a
 * burst of calls starts one.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "kernel.h"
#include "mods.h"
#include "tier.h"
#include "variant.h"

/* At most this many compiles in flight per context; a further one waits
 * for its compile as without tiers. */
enum { TIER_JOBS = 16 };

typedef struct tier_job {
  fj_variant v;  /* v.mods is not kept: the form's hash stands for it */
  uint64_t mods;
  fj_kjob *job;
} tier_job;

struct fj_tier {
  tier_job jobs[TIER_JOBS];
  int n;
};

double fj__tier_flops(const fj_problem *p)
{
  double sq = p->seq_q, skv = p->seq_kv, pairs = sq * skv;
  if (p->causal != FJ_CAUSAL_NONE) {
    /* Row i sees clamp(i + a, 0, Skv) keys, a = 1 (top-left) or
     * Skv - Sq + 1 (bottom-right): zero, then a + i, then Skv. */
    double a = p->causal == FJ_CAUSAL_BOTTOM_RIGHT ? skv - sq + 1 : 1;
    double lo = fmax(0, 1 - a), hi = fmin(sq, fmax(lo, skv - a + 1));
    pairs = (hi - lo) * (lo + hi - 1 + 2 * a) / 2 + (sq - hi) * skv;
  }
  return 4.0 * p->batch * p->heads_q * pairs * p->head_dim;
}

int fj__tier_serves(const fj_ctx *ctx, const fj_problem *p,
                    const fj_variant *v)
{
  fj_dtype kv = p->kv_dtype ? p->kv_dtype : p->dtype;
  fj_mods_info mi;
  fj__mods_info(p->mods, &mi);
  /* The portable kernel reads 16-bit Q, K and V of one head dim.  A
   * deterministic problem's bits must not depend on when a compile ends;
   * a problem too large for the first kernel would wait longer on it than
   * on the compile. */
  return ctx->opts.jit_tiers && !v->varlen && !v->paged && kv == p->dtype &&
         !p->deterministic && fj__tier_flops(p) <= FJ_TIER_MAX_FLOPS &&
         fj__problem_dv(p) == p->head_dim &&
         p->dtype != FJ_E4M3 &&
         !p->cu_seqlens_q && !p->cu_seqlens_kv && !p->block_table &&
         !mi.checked &&
         p->head_dim % 32 == 0 && p->heads_q <= 65535 && p->batch <= 65535;
}

/* The index of v's compile in flight (its modifications' form hashed to
 * mods), or -1. */
static int pending(const fj_tier *t, const fj_variant *v, uint64_t mods)
{
  fj_variant b = *v;
  b.mods = NULL;
  for (int i = 0; t && i < t->n; i++)
    if (t->jobs[i].mods == mods && !memcmp(&t->jobs[i].v, &b, sizeof b))
      return i;
  return -1;
}

/* Job i, taken out of the table. */
static fj_kjob *take(fj_tier *t, int i)
{
  fj_kjob *job = t->jobs[i].job;
  t->jobs[i] = t->jobs[--t->n];
  return job;
}

fj_status fj__tier_kernel(fj_ctx *ctx, const fj_variant *v, fj_kernel **k,
                          fj_kjob **fresh)
{
  *k = NULL;
  *fresh = NULL;
  fj_tier *t = ctx->tier;
  int i = pending(t, v, fj__mods_hash(v->mods));
  if (i >= 0) {
    if (!fj__kjob_done(t->jobs[i].job))
      return FJ_OK;
    fj_kjob *job = take(t, i);
    fj__log(ctx, FJ_LOG_INFO, "tiered JIT: %s compiled in the background",
            fj__kjob_symbol(job));
    return fj__kjob_finish(ctx, job, k);
  }
  fj_status st = fj__variant_validate(ctx, v);
  fj_vparams vp;
  if (st == FJ_OK)
    st = fj__variant_params(ctx, v, &vp);
  fj_kjob *job = NULL;
  if (st == FJ_OK)
    st = fj__kernel_build_async(ctx, vp.template_name, vp.p, vp.n, k, &job);
  if (st != FJ_OK || !job)
    return st;
  /* Read again: the layout probe's build (fj__variant_params, a context's
   * first) may have let another thread make the table. */
  t = ctx->tier;
  if (!t)
    t = ctx->tier = calloc(1, sizeof *t);
  if (!t || t->n == TIER_JOBS) {  /* no room: compile and wait */
    st = fj__kjob_start(ctx, job);
    return st == FJ_OK ? fj__kjob_finish(ctx, job, k) : st;
  }
  *fresh = job;
  return FJ_OK;
}

fj_status fj__tier_wait(fj_ctx *ctx, const fj_variant *v, fj_kernel **k)
{
  int i = pending(ctx->tier, v, fj__mods_hash(v->mods));
  return i >= 0 ? fj__kjob_finish(ctx, take(ctx->tier, i), k)
                : fj__variant_kernel(ctx, v, k);
}

fj_status fj__tier_start(fj_ctx *ctx, const fj_variant *v, fj_kjob *job)
{
  fj_tier *t = ctx->tier;
  /* The first kernel's compile let the context's other threads in
   * (fj__kernel_build): one of them may have started v's compile, or
   * filled the table.  This one is dropped then; a later call of v finds
   * that compile, or (the table full) compiles v and waits. */
  if (!t || t->n == TIER_JOBS || pending(t, v, fj__mods_hash(v->mods)) >= 0) {
    fj__kjob_drop(job);
    return FJ_OK;
  }
  fj__log(ctx, FJ_LOG_INFO, "tiered JIT: %s compiles in the background",
          fj__kjob_symbol(job));
  fj_status st = fj__kjob_start(ctx, job);
  if (st != FJ_OK)
    return st;
  tier_job *j = &t->jobs[t->n++];
  j->v = *v;
  j->v.mods = NULL;
  j->mods = fj__mods_hash(v->mods);
  j->job = job;
  fj__cache_count_tier(ctx, 0, 1);
  return FJ_OK;
}

fj_status fj__tier_first(fj_ctx *ctx, const fj_variant *v, fj_kernel **k)
{
  fj_vparams vp;
  fj_status st = fj__variant_simt_params(ctx, v, &vp);
  return st == FJ_OK ? fj__kernel_build(ctx, vp.template_name, vp.p, vp.n, k)
                     : st;
}

fj_status fj_kernel_get_first(fj_ctx *ctx, const fj_variant *v, fj_kernel **k)
{
  if (!ctx || !v || !k)
    return fj__null_arg(ctx, "fj_kernel_get_first",
                        !ctx ? "ctx" : !v ? "v" : "kernel");
  fj__clear_error(ctx);
  pthread_mutex_lock(&ctx->lock);
  fj_status st = fj__variant_validate(ctx, v);
  /* The portable kernel has one head dim for Q, K, V and O. */
  if (st == FJ_OK && fj__head_dim_v(v) != v->head_dim)
    st = fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                  "fj_kernel_get_first: head_dim_v %d with head_dim %d: the "
                  "tiered JIT's first kernel takes one head dim (head_dim_v "
                  "0); a split problem waits for its chosen kernel",
                  fj__head_dim_v(v), v->head_dim);
  if (st == FJ_OK)
    st = fj__tier_first(ctx, v, k);
  pthread_mutex_unlock(&ctx->lock);
  return st;
}

fj_status fj_ctx_tiers_wait(fj_ctx *ctx)
{
  if (!ctx)
    return fj__null_arg(NULL, "fj_ctx_tiers_wait", "ctx");
  fj__clear_error(ctx);
  pthread_mutex_lock(&ctx->lock);
  fj_status first = FJ_OK;
  char *why = NULL;  /* the first failure's message */
  fj_tier *t = ctx->tier;
  /* Taken out first: each wait lets the context's other threads in. */
  fj_kjob *jobs[TIER_JOBS];
  int n = t ? t->n : 0;
  for (int i = 0; i < n; i++)
    jobs[i] = t->jobs[i].job;
  if (t)
    t->n = 0;
  for (int i = 0; i < n; i++) {
    fj_kernel *k;
    fj_status st = fj__kjob_finish(ctx, jobs[i], &k);
    if (st != FJ_OK && first == FJ_OK) {
      first = st;
      why = strdup(fj_errmsg(ctx));
    }
  }
  if (first != FJ_OK)
    fj__fail(ctx, first, "%s", why ? why : "compile failed");
  free(why);
  pthread_mutex_unlock(&ctx->lock);
  return first;
}

void fj__tier_free(fj_ctx *ctx)
{
  /* Each compile is joined and finished, not dropped: a program that
   * exits while its chosen kernel compiles still leaves it in the disk
   * cache for its next run. */
  fj_tier *t = ctx->tier;
  pthread_mutex_lock(&ctx->lock);
  for (int i = 0; t && i < t->n; i++) {
    fj_kernel *k;
    (void)fj__kjob_finish(ctx, t->jobs[i].job, &k);
  }
  pthread_mutex_unlock(&ctx->lock);
  free(t);
  ctx->tier = NULL;
}
