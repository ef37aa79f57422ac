/*
 * tune_bwd.c -- fj_tune_bwd: times the main kernels the backward's plan
 * could take for a problem (the wgmma family's on sm_90a, the mma family's
 * with two stages of Q and dO and with one), each launched through
 * fj_attention_bwd_run on random inputs after one forward, checks each
 * one's dQ, dK and dV against the plan's own choice (templates/compare.cu
 * through tune.c), and records the fastest in the tuning database under
 * the backward's key (tunedb.c), where fj_attention_bwd_plan finds it.
 * The main kernels are compiled in child processes (fj__kernel_build_many)
 * as the forward's tuner compiles its candidates.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backward.h"
#include "ctx.h"
#include "driver.h"
#include "kernel.h"
#include "mods.h"
#include "tune.h"
#include "tunedb.h"
#include "util.h"
#include "variant.h"

/* The families and stages of the plan's choice, in the plan's order: the
 * first that renders and fits is the plan's own (the heuristic's). */
static const struct {
  fj_mma mma;
  int stages;
  const char *name;  /* as the log names the candidate */
} space[] = {{FJ_MMA_WGMMA, 2, "the wgmma backward, 2 stages"},
             {FJ_MMA_SYNC, 2, "the mma backward, 2 stages"},
             {FJ_MMA_SYNC, 1, "the mma backward, 1 stage"}};
enum { NSPACE = sizeof space / sizeof space[0] };

typedef struct bwd_tune {
  fj_ctx *ctx;
  const fj_problem *p;
  const fj_tune_opts *o;
  /* inputs: Q, K, V, O, dO, the LSE; outputs dQ, dK, dV (and dsinks),
   * and the first candidate's outputs (the reference) */
  uint64_t q, k, v, out, dout, lse, grad[3], ref[3], dsinks, sums;
  size_t n[3];           /* elements of dQ's, dK's and dV's spans */
  void *compare_fn, *e0, *e1;
  fj_tune_steps steps;
} bwd_tune;

/* One candidate: its plan, and its main kernel's parameters for the
 * batch compile. */
typedef struct bwd_cand {
  fj_bwd_plan plan;
  fj_vparams vp;
  fj_status st;
  const char *name;  /* space's */
} bwd_cand;

static size_t span(const int64_t s[3], int b, int h, int seq, int d)
{
  return (size_t)((b - 1) * s[0] + (h - 1) * s[1] + (seq - 1) * s[2] + d);
}


/* ---- inputs ------------------------------------------------------------------------ */

/* Random Q, K, V and dO, then O and the LSE from one forward; the
 * gradients' buffers and the reference's. */
static fj_status inputs_make(bwd_tune *t)
{
  const fj_problem *p = t->p;
  size_t nq = span(p->q_stride, p->batch, p->heads_q, p->seq_q, p->head_dim);
  size_t nk = span(p->k_stride, p->batch, p->heads_kv, p->seq_kv, p->head_dim);
  size_t nv = span(p->v_stride, p->batch, p->heads_kv, p->seq_kv, p->head_dim);
  size_t no = span(p->o_stride, p->batch, p->heads_q, p->seq_q, p->head_dim);
  size_t nlse = (size_t)p->batch * (size_t)p->heads_q * (size_t)p->seq_q;
  size_t es = (size_t)fj__dtype_bytes(p->dtype);
  fj_mods_info mi;
  fj__mods_info(p->mods, &mi);
  t->n[0] = nq;
  t->n[1] = nk;
  t->n[2] = nv;
  uint64_t state = UINT64_C(0x2545f4914f6cdd1d);
  fj_status st = fj__tune_upload_random(t->ctx, &t->q, p->dtype, nq, 1.f, &state);
  if (st == FJ_OK)
    st = fj__tune_upload_random(t->ctx, &t->k, p->dtype, nk, 1.f, &state);
  if (st == FJ_OK)
    st = fj__tune_upload_random(t->ctx, &t->v, p->dtype, nv, 1.f, &state);
  if (st == FJ_OK)
    st = fj__tune_upload_random(t->ctx, &t->dout, p->dtype, no, 1.f, &state);
  if (st == FJ_OK)
    st = fj__cu_alloc(t->ctx, no * es, &t->out);
  if (st == FJ_OK)
    st = fj__cu_alloc(t->ctx, nlse * sizeof(float), &t->lse);
  for (int i = 0; i < 3 && st == FJ_OK; i++)
    if ((st = fj__cu_alloc(t->ctx, t->n[i] * es, &t->grad[i])) == FJ_OK)
      st = fj__cu_alloc(t->ctx, t->n[i] * es, &t->ref[i]);
  if (st == FJ_OK && mi.sinks)
    st = fj__cu_alloc(t->ctx, (size_t)p->heads_q * sizeof(float), &t->dsinks);
  if (st == FJ_OK)
    st = fj__cu_alloc(t->ctx, 3 * sizeof(double), &t->sums);
  /* The forward's O and LSE from its chosen kernel, compiled here, not in
   * the background beside the tuner's compiles (deterministic keeps the
   * tiered JIT away). */
  fj_problem fp = *p;
  fp.deterministic = 1;
  if (st == FJ_OK)
    st = fj_attention_fwd(t->ctx, &fp, (void *)(uintptr_t)t->q,
                          (void *)(uintptr_t)t->k, (void *)(uintptr_t)t->v,
                          (void *)(uintptr_t)t->out,
                          (float *)(uintptr_t)t->lse, NULL);
  return st;
}

static void inputs_free(bwd_tune *t)
{
  uint64_t all[] = {t->q, t->k, t->v, t->out, t->dout, t->lse, t->grad[0],
                    t->grad[1], t->grad[2], t->ref[0], t->ref[1], t->ref[2],
                    t->dsinks, t->sums};
  for (size_t i = 0; i < FJ_ARRAY_LEN(all); i++)
    fj__cu_free(all[i]);
  fj__cu_event_destroy(t->e0);
  fj__cu_event_destroy(t->e1);
}

/* ---- candidates -------------------------------------------------------------------- */

/* Plans every family and stages of the space the target has; a refusal
 * (the template's, the shared memory's) is counted, not fatal.  Returns
 * how many were enumerated. */
static int candidates(bwd_tune *t, bwd_cand *c, fj_tune_report *r)
{
  int n = 0;
  for (int i = 0; i < NSPACE; i++) {
    if (space[i].mma == FJ_MMA_WGMMA && !fj__arch_has(t->ctx, FJ_ARCH_WGMMA))
      continue;
    c[n].name = space[i].name;
    c[n].st = fj__bwd_plan_candidate(t->ctx, t->p, space[i].mma,
                                     space[i].stages, &c[n].plan);
    if (c[n].st != FJ_OK)
      fj__tune_count(t->ctx, r, c[n].st, space[i].name,
                     fj_errmsg(t->ctx));
    n++;
  }
  return n;
}

/* Compiles the main kernels of the planned candidates at once, in child
 * processes; a failure marks its candidate. */
static void compile(bwd_tune *t, bwd_cand *c, int n, fj_tune_report *r)
{
  fj_build b[NSPACE];
  memset(b, 0, sizeof b);
  pthread_mutex_lock(&t->ctx->lock);
  for (int i = 0; i < n; i++) {
    b[i].status = c[i].st;
    if (c[i].st == FJ_OK)
      b[i].status = fj__bwd_main_params(t->ctx, t->p, &c[i].plan, &c[i].vp);
    b[i].template_name = c[i].vp.template_name;
    b[i].params = c[i].vp.p;
    b[i].nparams = c[i].vp.n;
  }
  pthread_mutex_unlock(&t->ctx->lock);
  double t0 = fj__now_ms();
  int workers = t->o->workers;
  fj__kernel_build_many(t->ctx, b, (size_t)n, workers > 0 ? workers : NSPACE,
                        fj__tune_compile_progress, &t->steps);
  r->compile_s = (fj__now_ms() - t0) / 1e3;
  for (int i = 0; i < n; i++) {
    if (c[i].st == FJ_OK && b[i].status != FJ_OK) {
      c[i].st = b[i].status;
      fj__tune_count(t->ctx, r, c[i].st, c[i].name, b[i].message);
    }
    free(b[i].message);
  }
}

/* ---- measuring --------------------------------------------------------------------- */

/* One backward of candidate c into dq, dk, dv (g: three device buffers). */
static fj_status launch(bwd_tune *t, const bwd_cand *c, const uint64_t g[3])
{
  return fj_attention_bwd_run(
      t->ctx, t->p, &c->plan, (void *)(uintptr_t)t->q, (void *)(uintptr_t)t->k,
      (void *)(uintptr_t)t->v, (void *)(uintptr_t)t->out,
      (void *)(uintptr_t)t->dout, (const float *)(uintptr_t)t->lse,
      (void *)(uintptr_t)g[0], (void *)(uintptr_t)g[1], (void *)(uintptr_t)g[2],
      (float *)(uintptr_t)t->dsinks, NULL, 0, NULL);
}

/* Runs c on poisoned outputs (NaN, so that an unwritten element shows)
 * into the reference's buffers (ref 1) or the gradients', and with the
 * latter, its largest relative distance from the reference. */
static fj_status run_checked(bwd_tune *t, const bwd_cand *c, int ref,
                             double *rel)
{
  const uint64_t *g = ref ? t->ref : t->grad;
  size_t es = (size_t)fj__dtype_bytes(t->p->dtype);
  fj_status st = FJ_OK;
  for (int i = 0; i < 3 && st == FJ_OK; i++)
    st = fj__cu_memset(t->ctx, g[i], 0xff, t->n[i] * es);
  if (st == FJ_OK)
    st = launch(t, c, g);
  *rel = 0;
  for (int i = 0; i < 3 && st == FJ_OK && !ref; i++) {
    double d;
    st = fj__tune_distance(t->ctx, t->compare_fn, t->grad[i], t->ref[i],
                           t->n[i], t->sums, &d);
    *rel = d > *rel || isnan(d) ? d : *rel;
  }
  return st == FJ_OK ? fj__cu_sync(t->ctx) : st;
}

/* One backward of a candidate into the run's gradients (fj__tune_median's). */
typedef struct timed_cand {
  bwd_tune *t;
  const bwd_cand *c;
} timed_cand;

static fj_status launch_timed(void *arg)
{
  timed_cand *tc = arg;
  return launch(tc->t, tc->c, tc->t->grad);
}

/* Median of `iters` backwards between events, after `warmup` more. */
static fj_status time_one(bwd_tune *t, const bwd_cand *c, double *median)
{
  timed_cand tc = {t, c};
  return fj__tune_median(t->ctx, t->e0, t->e1, t->o->warmup, t->o->iters,
                         launch_timed, &tc, median);
}

/* Checks and times every compiled candidate; the first that compiled
 * (the plan's own choice) is the reference.  *best gets the fastest. */
static fj_status measure(bwd_tune *t, const bwd_cand *c, int n,
                         fj_tune_report *r, int *best)
{
  /* bf16 rounds P and dS to 8 bits on their way through shared memory:
   * two kernels differ by about the error each has (test_gpu_backward.c). */
  double tol = t->p->dtype == FJ_BF16 ? 3e-2 : 1e-2, best_ms = INFINITY;
  int ref = -1;
  for (int i = 0; i < n; i++, fj__tune_step(&t->steps)) {
    if (c[i].st != FJ_OK)
      continue;
    double rel = 0, ms = 0;
    fj_status st = run_checked(t, &c[i], ref < 0, &rel);
    if (st == FJ_OK && !(rel < tol)) {
      r->wrong++;
      continue;
    }
    if (st == FJ_OK)
      st = time_one(t, &c[i], &ms);
    if (st != FJ_OK && ref < 0)
      return st;  /* without the reference nothing can be checked */
    if (st != FJ_OK) {
      fj__tune_count(t->ctx, r, st, c[i].name, fj_errmsg(t->ctx));
      continue;
    }
    r->timed++;
    if (ref < 0) {
      ref = i;
      r->default_ms = ms;
    }
    if (ms < best_ms || *best < 0) {
      best_ms = ms;
      *best = i;
    }
  }
  r->best_ms = best_ms;
  return ref >= 0 ? FJ_OK
                  : fj__fail(t->ctx, FJ_ERR_TUNE,
                             "fj_tune_bwd: no main kernel of the backward "
                             "compiled for this problem (%s)",
                             fj_errmsg(t->ctx));
}

/* ---- the call ---------------------------------------------------------------------- */

static fj_status tune_body(bwd_tune *t, fj_bwd_plan *best, fj_tune_report *r)
{
  bwd_cand *c = calloc(NSPACE, sizeof *c);
  if (!c)
    return fj__fail(t->ctx, FJ_ERR_NOMEM, "out of memory");
  int n = candidates(t, c, r), win = -1;
  r->candidates = n;
  t->steps.total = 2 * (size_t)n;
  compile(t, c, n, r);
  t->steps.done = (size_t)n;
  fj_status st = measure(t, c, n, r, &win);
  if (st == FJ_OK && best)
    *best = c[win].plan;
  if (st == FJ_OK && t->o->save)
    st = fj__tune_record_bwd(t->ctx, t->p, &c[win].plan.variant, r->best_ms,
                             r->default_ms);
  free(c);
  return st;
}

/* What fj_tune_bwd refuses before touching the GPU: what the backward
 * refuses, and checked mode. */
static fj_status check_problem(fj_ctx *ctx, const fj_problem *p)
{
  fj_bwd_plan plan;
  fj_status st = fj_attention_bwd_plan(ctx, p, &plan);
  fj_mods_info mi;
  fj__mods_info(st == FJ_OK ? p->mods : NULL, &mi);
  if (st == FJ_OK && mi.checked)
    st = fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                  "fj_tune_bwd: tuning in checked mode (mods.checked or "
                  "FLASHJIT_CHECK_BOUNDS=1) is not meaningful: each call "
                  "waits for its kernels; tune with checked mode off");
  if (st == FJ_OK && !ctx->has_device)
    st = fj__fail(ctx, FJ_ERR_COMPILE_ONLY,
                  "fj_tune_bwd: this needs a GPU context (it runs the "
                  "candidates); the context is compile-only (arch %s)",
                  ctx->arch);
  return st;
}

fj_status fj_tune_bwd(fj_ctx *ctx, const fj_problem *p,
                      const fj_tune_opts *opts, fj_bwd_plan *best,
                      fj_tune_report *report)
{
  fj_tune_opts defaults;
  fj_tune_report r;
  memset(&r, 0, sizeof r);
  if (!ctx || !p)
    return fj__null_arg(ctx, "fj_tune_bwd", ctx ? "p" : "ctx");
  fj__clear_error(ctx);
  if (!opts) {
    fj_tune_opts_init(&defaults);
    opts = &defaults;
  }
  double t0 = fj__now_ms();
  fj_status st = fj__tune_check_opts(ctx, "fj_tune_bwd", opts);
  if (st == FJ_OK)
    st = check_problem(ctx, p);
  bwd_tune t;
  memset(&t, 0, sizeof t);
  t.ctx = ctx;
  /* The candidates run on the tuner's own inputs: the caller's dlse (its
   * loss's gradient at the LSE, maybe host memory) is nobody's here. */
  fj_problem tp = *p;
  tp.dlse = NULL;
  t.p = &tp;
  t.o = opts;
  t.steps.o = opts;
  if (st == FJ_OK && (st = fj__cu_enter(ctx)) == FJ_OK) {
    if ((st = inputs_make(&t)) == FJ_OK &&
        (st = fj__tune_compare_fn(ctx, p->dtype, &t.compare_fn)) == FJ_OK &&
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
