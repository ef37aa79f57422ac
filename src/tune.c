/*
 * tune.c -- autotuning: fj_tune enumerates the variants of a problem, lets
 * fj_kernel_prepare compile them in parallel child processes (so that a
 * compiler crash costs one candidate), runs each on random inputs, checks
 * its output against the default variant's with a reduction kernel on the
 * device (templates/compare.cu), times it with events, keeps the fastest
 * and records it in the tuning database (tunedb.c).  It launches through
 * the public attention entry, above which it sits.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctx.h"
#include "driver.h"
#include "kernel.h"
#include "mods.h"
#include "plan.h"
#include "tune.h"
#include "tunedb.h"
#include "util.h"
#include "variant.h"

/* ---- tuning ------------------------------------------------------------------------ */

void fj_tune_opts_init(fj_tune_opts *o)
{
  if (!o)
    return;
  memset(o, 0, sizeof *o);
  o->iters = 10;
  o->warmup = 2;
  o->save = 1;
}

typedef struct tune_run {
  fj_ctx *ctx;
  const fj_problem *p;   /* with the tuner's own scales for FP8 */
  fj_problem prob;
  const fj_tune_opts *o;
  uint64_t q, k, v, out, ref, sums, scales;
  size_t nout;           /* elements of the output span */
  int v_is_k;            /* split head dims with V in K's rows (MLA): v = k */
  void *compare_fn, *e0, *e1;
  fj_tune_steps steps;
} tune_run;

/* The most timed launches per candidate (time_one keeps them on the
 * stack). */
enum { ITERS_MAX = 256 };

/* Options that mean nothing are refused, not replaced: 0 iters is the
 * documented default, a negative count or one over the limit an error. */
fj_status fj__tune_check_opts(const fj_ctx *ctx, const char *who,
                              const fj_tune_opts *o)
{
  if (o->iters < 0 || o->iters > ITERS_MAX)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "%s: iters %d is invalid: must be in 0..%d (0: the "
                    "default, 10)",
                    who, o->iters, ITERS_MAX);
  if (o->warmup < 0)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "%s: warmup %d is invalid: must be 0 or more", who,
                    o->warmup);
  if (o->workers < 0)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "%s: workers %d is invalid: 0 (one per CPU, at most "
                    "16) or more",
                    who, o->workers);
  return FJ_OK;
}

static size_t span(const int64_t s[3], int b, int h, int seq, int d)
{
  return (size_t)((b - 1) * s[0] + (h - 1) * s[1] + (seq - 1) * s[2] + d);
}

fj_status fj__tune_upload_random(fj_ctx *ctx, uint64_t *dst, fj_dtype dt,
                                 size_t n, float scale, uint64_t *state)
{
  float *f = malloc(n * sizeof *f);
  void *h = malloc(n * 2 + 16);
  fj_status st = f && h ? fj__cu_alloc(ctx, n * (size_t)fj__dtype_bytes(dt), dst)
                        : fj__fail(ctx, FJ_ERR_NOMEM, "out of memory");
  for (size_t i = 0; st == FJ_OK && i < n; i++) {
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    f[i] = ((float)(x >> 40) / 16777216.0f * 2.0f - 1.0f) * scale;
  }
  if (st == FJ_OK)
    fj_convert(dt, h, FJ_F32, f, n);
  if (st == FJ_OK)
    st = fj__cu_copy_to_device(ctx, *dst, h, n * (size_t)fj__dtype_bytes(dt));
  free(f);
  free(h);
  return st;
}

/* FP8 K/V (and Q, for FP8 attention): values over e4m3's range with
 * per-head scales of 1/64 -- the tuner's own, whatever the caller's. */
static fj_status fp8_scales(tune_run *t)
{
  size_t n = (size_t)t->prob.batch * (size_t)t->prob.heads_kv, bytes = n * sizeof(float);
  float *s = malloc(bytes);
  if (!s)
    return fj__fail(t->ctx, FJ_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < n; i++)
    s[i] = 1.0f / 64;
  fj_status st = fj__cu_alloc(t->ctx, 3 * bytes, &t->scales);
  for (size_t i = 0; i < 3 && st == FJ_OK; i++)
    st = fj__cu_copy_to_device(t->ctx, t->scales + i * bytes, s, bytes);
  t->prob.k_scale = (const void *)(uintptr_t)t->scales;
  t->prob.v_scale = (const void *)(uintptr_t)(t->scales + bytes);
  t->prob.q_scale = t->prob.dtype == FJ_E4M3 ? (const void *)(uintptr_t)(t->scales + 2 * bytes)
                                             : NULL;
  t->prob.scale_layout = FJ_SCALE_PER_HEAD;
  free(s);
  return st;
}

static fj_status inputs_make(tune_run *t)
{
  const fj_problem *p = &t->prob;
  fj_dtype kv = p->kv_dtype ? p->kv_dtype : p->dtype;
  const int dv = fj__problem_dv(p);
  size_t nq = span(p->q_stride, p->batch, p->heads_q, p->seq_q, p->head_dim);
  size_t nk = span(p->k_stride, p->batch, p->heads_kv, p->seq_kv, p->head_dim);
  size_t nv = span(p->v_stride, p->batch, p->heads_kv, p->seq_kv, dv);
  t->nout = span(p->o_stride, p->batch, p->heads_q, p->seq_q, dv);
  /* Split head dims whose V has K's strides are MLA's latent cache: V the
   * first head_dim_v columns of K's rows, as the mma family requires
   * (variant.c); the candidates of both families read it so. */
  t->v_is_k = dv < p->head_dim && fj__problem_v_in_k(p);
  uint64_t state = UINT64_C(0x2545f4914f6cdd1d);
  float kvs = kv == FJ_E4M3 ? 64.f : 1.f;
  fj_status st = fj__tune_upload_random(t->ctx, &t->q, p->dtype, nq,
                                        p->dtype == FJ_E4M3 ? 64.f : 1.f, &state);
  if (st == FJ_OK)
    st = fj__tune_upload_random(t->ctx, &t->k, kv, nk, kvs, &state);
  if (st == FJ_OK && t->v_is_k)
    t->v = t->k;
  else if (st == FJ_OK)
    st = fj__tune_upload_random(t->ctx, &t->v, kv, nv, kvs, &state);
  if (st == FJ_OK)
    st = fj__cu_alloc(t->ctx, t->nout * 2, &t->out);
  if (st == FJ_OK)
    st = fj__cu_alloc(t->ctx, t->nout * 2, &t->ref);
  if (st == FJ_OK)
    st = fj__cu_alloc(t->ctx, 3 * sizeof(double), &t->sums);
  if (st == FJ_OK && kv == FJ_E4M3)
    st = fp8_scales(t);
  return st;
}

static void inputs_free(tune_run *t)
{
  if (t->v_is_k)
    t->v = 0;  /* k's */
  uint64_t *all[] = {&t->q, &t->k, &t->v, &t->out, &t->ref, &t->sums, &t->scales};
  for (size_t i = 0; i < FJ_ARRAY_LEN(all); i++)
    fj__cu_free(*all[i]);
  fj__cu_event_destroy(t->e0);
  fj__cu_event_destroy(t->e1);
}

fj_status fj__tune_compare_fn(fj_ctx *ctx, fj_dtype dt, void **fn)
{
  fj_param params[] = {
      {"arch", FJ_PARAM_STR, 0, ctx->arch, NULL},
      {"version", FJ_PARAM_STR, 0, fj_version(), NULL},
      {"dtype", FJ_PARAM_STR, 0, fj_dtype_name(dt), NULL},
  };
  fj_kernel *k;
  pthread_mutex_lock(&ctx->lock);
  fj_status st = fj__kernel_build(ctx, "compare.cu", params,
                                  FJ_ARRAY_LEN(params), &k);
  if (st == FJ_OK)
    st = fj__kernel_function(ctx, k, fn);
  pthread_mutex_unlock(&ctx->lock);
  return st;
}

fj_status fj__tune_distance(fj_ctx *ctx, void *fn, uint64_t out, uint64_t ref,
                            size_t n, uint64_t sums, double *rel)
{
  double h[3] = {0, 0, 0};
  unsigned long long count = n;
  void *args[] = {&out, &ref, &count, &sums};
  fj_launch l = {fn, {264, 1, 1}, {256, 1, 1}, 0, NULL, args, 0};
  fj_status st = fj__cu_memset(ctx, sums, 0, sizeof h);
  if (st == FJ_OK)
    st = fj__cu_launch(ctx, &l);
  if (st == FJ_OK)
    st = fj__cu_copy_to_host(ctx, h, sums, sizeof h);
  *rel = h[2] > 0 ? HUGE_VAL : sqrt(h[0] / (h[1] > 0 ? h[1] : 1));
  return st;
}

static fj_status launch(tune_run *t, const fj_variant *v, uint64_t out)
{
  return fj_attention_fwd_variant(t->ctx, &t->prob, v, (void *)(uintptr_t)t->q,
                                  (void *)(uintptr_t)t->k, (void *)(uintptr_t)t->v,
                                  (void *)(uintptr_t)out, NULL, NULL);
}

static int cmp_float(const void *a, const void *b)
{
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

fj_status fj__tune_median(fj_ctx *ctx, void *e0, void *e1, int warmup,
                          int iters, fj_tune_launch run, void *arg,
                          double *median)
{
  iters = iters > 0 ? iters : 10;
  float ms[ITERS_MAX] = {0};  /* a failed launch leaves the rest unset */
  fj_status st = FJ_OK;
  for (int i = 0; i < warmup && st == FJ_OK; i++)
    st = run(arg);
  for (int i = 0; i < iters && st == FJ_OK; i++) {
    st = fj__cu_event_record(ctx, e0, NULL);
    if (st == FJ_OK)
      st = run(arg);
    if (st == FJ_OK)
      st = fj__cu_event_record(ctx, e1, NULL);
    if (st == FJ_OK)
      st = fj__cu_event_ms(ctx, e0, e1, &ms[i]);
  }
  qsort(ms, (size_t)iters, sizeof *ms, cmp_float);
  *median = ms[iters / 2];
  return st;
}

/* One launch of a candidate into the run's output (fj__tune_median's). */
typedef struct timed_variant {
  tune_run *t;
  const fj_variant *v;
} timed_variant;

static fj_status launch_timed(void *arg)
{
  timed_variant *tv = arg;
  return launch(tv->t, tv->v, tv->t->out);
}

/* Median of `iters` launches between events, after `warmup` more. */
static fj_status time_one(tune_run *t, const fj_variant *v, double *median)
{
  timed_variant tv = {t, v};
  return fj__tune_median(t->ctx, t->e0, t->e1, t->o->warmup, t->o->iters,
                         launch_timed, &tv, median);
}

/* The wgmma family's space (sm_90a): 1-3 consumer warpgroups, key tiles of
 * 64 to 256, 2-4 stages; the template refuses what does not fit.  FP8
 * (dtype e4m3) keeps the heuristic's key tile and flush: they decide its
 * rounding, which must not follow the length class a tuned pick is kept
 * for (a model's decode and prefill round alike; README, FP8). */
static size_t wgmma_candidates(const fj_variant *base, fj_variant *out,
                               size_t n, size_t max)
{
  static const int tn[] = {64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256};
  for (int c = 1; c <= 3; c++)
    for (size_t b = 0; b < sizeof tn / sizeof tn[0]; b++)
      for (int st = 2; st <= 4 && n < max &&
                       (base->dtype != FJ_E4M3 || tn[b] == base->tile_n);
           st++) {
        fj_variant v = *base;
        v.mma = FJ_MMA_WGMMA;
        v.softmax = FJ_SOFTMAX_REGS;
        v.swizzle = FJ_SWIZZLE_XOR;
        v.tile_m = 64 * c;
        v.warps = 4 * (c + 1);
        v.tile_n = tn[b];
        v.stages = st;
        if (memcmp(&v, &out[0], sizeof v) != 0)
          out[n++] = v;
      }
  return n;
}

/* Whether the target's row of the architecture table (ctx.h) allows v:
 * rings of 2-3 stages need cp.async, and the tiles must fit the shared
 * memory of a block -- the numbers the heuristic fits its choice to and
 * the kernel's check refuses by, so the tuner compiles nothing the
 * target could not launch. */
static int target_allows(const fj_ctx *ctx, const fj_variant *v)
{
  return (v->stages == 1 || fj__arch_has(ctx, FJ_ARCH_CP_ASYNC)) &&
         fj__variant_tiles_smem(v) <= fj__smem_limit(ctx);
}

/* The candidates: the heuristic's choice first (ties go to it), then every
 * tile/warps/stages/swizzle/softmax combination of the family without TMA
 * (for decode shapes also 16-row tiles, whose warps split the keys) --
 * not for split head dims whose V is not in K's rows, which that family
 * cannot read (variant.c; its launches would be refused) --, then, on
 * sm_90a, the wgmma family's space. */
size_t fj__tune_candidates(fj_ctx *ctx, const fj_problem *p, fj_variant *out,
                           size_t max)
{
  static const int tm[] = {16, 64, 128}, tn[] = {32, 64, 128}, w[] = {4, 8};
  size_t n = 0;
  fj_variant base;
  fj__heuristic(ctx, p, &out[n++]);
  fj__heuristic_sync(ctx, p, &base);
  for (int a = !fj__problem_mma_reads_v(p) ? 3 : fj__decode_rows(p) ? 0 : 1;
       a < 3; a++)
    for (int b = 0; b < 3; b++)
      for (int c = 0; c < 2; c++)
        for (int st = 1; st <= 3; st++)
          for (int sw = FJ_SWIZZLE_NONE; sw <= FJ_SWIZZLE_XOR; sw++)
            for (int sm = FJ_SOFTMAX_SMEM; sm <= FJ_SOFTMAX_REGS && n < max; sm++) {
              fj_variant v = base;
              v.tile_m = tm[a];
              v.tile_n = tn[b];
              v.warps = w[c];
              v.stages = st;
              v.swizzle = (fj_swizzle)sw;
              v.softmax = (fj_softmax)sm;
              if (memcmp(&v, &out[0], sizeof v) != 0 && target_allows(ctx, &v))
                out[n++] = v;
            }
  if (out[0].mma == FJ_MMA_WGMMA)
    n = wgmma_candidates(&out[0], out, n, max);
  return n;
}

void fj__tune_step(fj_tune_steps *s)
{
  s->done++;
  if (s->o->progress)
    s->o->progress(s->o->user, s->done, s->total);
}

void fj__tune_count(const fj_ctx *ctx, fj_tune_report *r, fj_status st,
                    const char *what, const char *why)
{
  int refused = st == FJ_ERR_UNSUPPORTED || st == FJ_ERR_RESOURCES;
  if (refused)
    r->refused++;
  else
    r->failed++;
  fj__log(ctx, refused ? FJ_LOG_INFO : FJ_LOG_WARN, "tune: %s %s: %s",
          what && *what ? what : "a candidate", refused ? "refused" : "failed",
          why && *why ? why : fj_status_str(st));
}

void fj__tune_compile_progress(void *steps, size_t done, size_t total)
{
  fj_tune_steps *s = steps;
  (void)total;
  if (s->o->progress && done <= s->total / 2)
    s->o->progress(s->o->user, done, s->total);
}

/* fj__tune_count for candidate v, named as fj_variant_name names it. */
static void count_variant(tune_run *t, fj_tune_report *r, const fj_variant *v,
                          fj_status st, const char *why)
{
  char name[160];
  fj_variant_name(v, name, sizeof name);
  fj__tune_count(t->ctx, r, st, name, why);
}

/* Checks and times every compiled candidate; the first (the heuristic's)
 * becomes the reference.  *best gets the fastest index. */
static fj_status measure(tune_run *t, const fj_variant *vs, const fj_status *ok,
                         size_t n, fj_tune_report *r, size_t *best)
{
  double best_ms = INFINITY;
  for (size_t i = 0; i < n; i++, fj__tune_step(&t->steps)) {
    if (ok[i] != FJ_OK)
      continue;
    double rel = 0, ms = 0;
    uint64_t dst = i == 0 ? t->ref : t->out;
    fj_status st = fj__cu_memset(t->ctx, dst, 0, t->nout * 2);
    if (st == FJ_OK)
      st = launch(t, &vs[i], dst);
    if (st == FJ_OK && i > 0)
      st = fj__tune_distance(t->ctx, t->compare_fn, t->out, t->ref, t->nout,
                             t->sums, &rel);
    if (st == FJ_OK && !(rel < 1e-2)) {
      r->wrong++;
      continue;
    }
    if (st == FJ_OK)
      st = time_one(t, &vs[i], &ms);
    if (st != FJ_OK) {
      if (i == 0)
        return st;  /* without the reference nothing can be checked */
      count_variant(t, r, &vs[i], st, fj_errmsg(t->ctx));
      continue;
    }
    r->timed++;
    if (i == 0)
      r->default_ms = ms;
    if (ms < best_ms) {
      best_ms = ms;
      *best = i;
    }
  }
  r->best_ms = best_ms;
  return FJ_OK;
}

static fj_status save(tune_run *t, const fj_variant *v, const fj_tune_report *r)
{
  return fj__tune_record(t->ctx, t->p, v, r->best_ms, r->default_ms);
}

static fj_status tune_body(tune_run *t, fj_variant *best, fj_tune_report *r)
{
  enum { MAX = 384 };
  fj_variant *vs = calloc(MAX, sizeof *vs);
  fj_status *ok = calloc(MAX, sizeof *ok);
  if (!vs || !ok) {
    free(vs);
    free(ok);
    return fj__fail(t->ctx, FJ_ERR_NOMEM, "out of memory");
  }
  size_t n = fj__tune_candidates(t->ctx, t->p, vs, MAX), win = 0;
  r->candidates = (int)n;
  t->steps.total = 2 * n;
  double t0 = fj__now_ms();
  fj_prepare_opts po = {t->o->workers, fj__tune_compile_progress, &t->steps};
  fj_kernel_prepare(t->ctx, vs, n, &po, ok);
  r->compile_s = (fj__now_ms() - t0) / 1e3;
  for (size_t i = 0; i < n; i++)
    if (ok[i] != FJ_OK)
      count_variant(t, r, &vs[i], ok[i], NULL);
  t->steps.done = n;
  fj_status st = ok[0] == FJ_OK ? measure(t, vs, ok, n, r, &win)
                                : fj__fail(t->ctx, FJ_ERR_TUNE,
                                           "the default variant did not compile");
  if (st == FJ_OK && best)
    *best = vs[win];
  if (st == FJ_OK && t->o->save)
    st = save(t, &vs[win], r);
  free(vs);
  free(ok);
  return st;
}

fj_status fj_tune(fj_ctx *ctx, const fj_problem *p, const fj_tune_opts *opts,
                  fj_variant *best, fj_tune_report *report)
{
  fj_tune_opts defaults;
  fj_tune_report r;
  memset(&r, 0, sizeof r);
  if (!ctx || !p)
    return fj__null_arg(ctx, "fj_tune", ctx ? "p" : "ctx");
  fj__clear_error(ctx);
  if (!opts) {
    fj_tune_opts_init(&defaults);
    opts = &defaults;
  }
  fj_status st = fj__tune_check_opts(ctx, "fj_tune", opts);
  if (st != FJ_OK)
    return st;
  tune_run t = {.ctx = ctx, .p = p, .prob = *p, .o = opts, .steps = {opts, 0, 0}};
  double t0 = fj__now_ms();
  t.prob.o_amax = NULL;  /* the candidates' amax is nobody's */
  /* FP8 scales come from the tuner's own inputs. */
  static const float placeholder[1];
  fj_problem check = *p;
  if ((check.kv_dtype ? check.kv_dtype : check.dtype) == FJ_E4M3)
    check.k_scale = check.v_scale = placeholder;
  if (check.dtype == FJ_E4M3)
    check.q_scale = placeholder;
  st = fj_problem_check(ctx, &check);
  /* The tuner makes its own dense inputs; a varlen or paged problem's
   * arrays are the caller's. */
  if (st == FJ_OK && fj__problem_varlen(p))
    st = fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                  "tuning a varlen or paged problem is not implemented: "
                  "tune the dense problem of its longest sequence");
  /* Its outputs are 16-bit; FP8 attention's tiles are O's element's
   * alike. */
  if (st == FJ_OK && fj__o_dtype(p) != fj__default_o_dtype(p->dtype))
    st = fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                  "tuning o_dtype %s is not implemented: tune the problem with "
                  "o_dtype 0 (bf16), whose tiles an %s O takes alike",
                  fj_dtype_name(fj__o_dtype(p)), fj_dtype_name(fj__o_dtype(p)));
  /* Modifications are tuned with the caller's parameters and block mask
   * (the candidates read them as the calls will); checked mode waits for
   * every launch, so its times would say nothing. */
  fj_mods_info mi;  /* of mods that passed their check only */
  fj__mods_info(st == FJ_OK ? p->mods : NULL, &mi);
  if (st == FJ_OK && mi.checked)
    st = fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                  "tuning in checked mode (mods.checked or "
                  "FLASHJIT_CHECK_BOUNDS=1) is not meaningful: each call "
                  "waits for its kernels; tune with checked mode off");
  if (st == FJ_OK && (st = fj__cu_enter(ctx)) == FJ_OK) {
    if ((st = inputs_make(&t)) == FJ_OK &&
        (st = fj__tune_compare_fn(ctx, fj__o_dtype(&t.prob), &t.compare_fn)) == FJ_OK &&
        (st = fj__cu_event_create(ctx, &t.e0)) == FJ_OK &&
        (st = fj__cu_event_create(ctx, &t.e1)) == FJ_OK)
      st = tune_body(&t, best, &r);
    inputs_free(&t);
    fj__cu_leave(ctx);
  }
  r.total_s = (fj__now_ms() - t0) / 1e3;
  if (report)
    *report = r;
  return st;
}
