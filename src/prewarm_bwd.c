/*
 * prewarm_bwd.c -- fj_cache_prewarm_bwd: the backward's kernels of a list
 * of problems into the disk cache ahead of use (a training job's, shipped
 * in an export pack): each problem planned as fj_attention_bwd_plan plans
 * it, the distinct main kernels compiled at once in child processes
 * (fj__kernel_build_many), then each problem's preprocess and postprocess
 * (small, shared by many problems) built as fj_attention_bwd_kernel builds
 * them.  Works on compile-only contexts.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backward.h"
#include "ctx.h"
#include "kernel.h"
#include "rel_table.h"
#include "util.h"
#include "variant.h"

/* The most problems one call takes, as fj_cache_prewarm's variants. */
enum { PREWARM_MAX = 65536 };

/* One problem's backward: its plan, its main kernel's parameters and the
 * first problem with the same main kernel (itself if none). */
typedef struct warm_item {
  fj_bwd_plan plan;
  fj_vparams vp;
  size_t first;
  fj_status st;
  char *message;  /* the first failure's, malloc'd */
} warm_item;

typedef struct warm_run {
  fj_ctx *ctx;
  const fj_problem *p;
  size_t n;
  warm_item *it;
  fj_build *b;
  const fj_kernel **ready;  /* distinct kernels made ready */
  size_t nready;
} warm_run;

static void fail_item(fj_ctx *ctx, warm_item *it, fj_status st)
{
  it->st = st;
  if (!it->message)
    it->message = fj__strdup(fj_errmsg(ctx));
}

static void add_ready(warm_run *w, const fj_kernel *k)
{
  for (size_t i = 0; i < w->nready; i++)
    if (w->ready[i] == k)
      return;
  w->ready[w->nready++] = k;
}

/* Every problem's plan and main kernel's parameters; a repeated main
 * kernel (by its symbol) points at its first problem. */
static void plan_all(warm_run *w)
{
  for (size_t i = 0; i < w->n; i++) {
    warm_item *it = &w->it[i];
    it->first = i;
    fj_status st = fj_attention_bwd_plan(w->ctx, &w->p[i], &it->plan);
    if (st != FJ_OK) {
      fail_item(w->ctx, it, st);
      continue;
    }
    pthread_mutex_lock(&w->ctx->lock);
    st = fj__bwd_main_params(w->ctx, &w->p[i], &it->plan, &it->vp);
    pthread_mutex_unlock(&w->ctx->lock);
    if (st != FJ_OK) {
      fail_item(w->ctx, it, st);
      continue;
    }
    for (size_t j = 0; j < i && it->first == i; j++)
      if (w->it[j].st == FJ_OK && !strcmp(w->it[j].vp.symbol, it->vp.symbol))
        it->first = j;
  }
}

/* The distinct main kernels, compiled at once; each problem takes its
 * first's result. */
static void build_mains(warm_run *w, const fj_prepare_opts *opts)
{
  for (size_t i = 0; i < w->n; i++) {
    const warm_item *it = &w->it[i];
    fj_build *b = &w->b[i];
    b->template_name = it->vp.template_name;
    b->params = it->vp.p;
    b->nparams = it->vp.n;
    /* A status other than FJ_OK skips the item: failures, repeats. */
    b->status = it->st != FJ_OK ? it->st
                : it->first != i ? FJ_ERR_NOT_FOUND
                                 : FJ_OK;
  }
  int workers = opts && opts->workers > 0 ? opts->workers : 0;
  if (!workers) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    workers = cpus < 1 ? 1 : cpus > 16 ? 16 : (int)cpus;
  }
  fj__kernel_build_many(w->ctx, w->b, w->n, workers,
                        opts ? opts->progress : NULL, opts ? opts->user : NULL);
  for (size_t i = 0; i < w->n; i++) {
    warm_item *it = &w->it[i];
    const fj_build *b = &w->b[it->first];
    if (it->st == FJ_OK && b->status != FJ_OK) {
      it->st = b->status;
      it->message = fj__strdup(b->message ? b->message : "?");
    } else if (it->st == FJ_OK) {
      add_ready(w, b->kernel);
    }
  }
}

/* Each problem's preprocess and postprocess, built (or found) in this
 * process: a handful of small kernels that many problems share; and its
 * score expression's relative table's kernel, where its kernels read one
 * (fj_attention_bwd launches it first). */
static void build_rows(warm_run *w)
{
  for (size_t i = 0; i < w->n; i++) {
    warm_item *it = &w->it[i];
    for (int which = 0; which < FJ_BWD_KERNELS && it->st == FJ_OK;
         which += 2) {
      fj_kernel *k;
      fj_status st = fj_attention_bwd_kernel(w->ctx, &w->p[i], &it->plan,
                                             which, &k);
      if (st == FJ_OK)
        add_ready(w, k);
      else
        fail_item(w->ctx, it, st);
    }
    fj_kernel *t;
    fj_status st = it->st == FJ_OK && fj__rt_bytes(&w->p[i])
                       ? fj_rel_table_kernel(w->ctx, &w->p[i], &t)
                       : FJ_ERR_NOT_FOUND;
    if (st == FJ_OK)
      add_ready(w, t);
    else if (st != FJ_ERR_NOT_FOUND)
      fail_item(w->ctx, it, st);
  }
}

/* The report's counts, each's statuses, and the call's status: the first
 * failure's (its message and how many failed), or FJ_ERR_IO where entries
 * did not reach the disk. */
static fj_status finish(warm_run *w, const fj_cache_stats *before,
                        fj_status *each, fj_prewarm_report *report)
{
  fj_prewarm_report r;
  fj_cache_stats after;
  memset(&r, 0, sizeof r);
  fj_cache_stats_get(w->ctx, &after);
  size_t bad = 0, first_bad = 0;
  for (size_t i = 0; i < w->n; i++) {
    const warm_item *it = &w->it[i];
    if (each)
      each[i] = it->st;
    if (it->st != FJ_OK && bad++ == 0)
      first_bad = i;
    if (it->first == i) {
      r.variants++;
      r.failed += it->st != FJ_OK;
    }
  }
  r.kernels = (int)w->nready;
  r.compiled = (int)(after.misses - before->misses);
  r.compiled = r.compiled > r.kernels ? r.kernels : r.compiled;
  r.cached = r.kernels - r.compiled;
  if (report)
    *report = r;
  uint64_t lost = after.disk_errors - before->disk_errors;
  if (bad)
    return fj__fail(w->ctx, w->it[first_bad].st,
                    "fj_cache_prewarm_bwd: %zu of %zu problems failed; the "
                    "first, problems[%zu]: %s",
                    bad, w->n, first_bad,
                    w->it[first_bad].message ? w->it[first_bad].message : "?");
  if (lost)
    return fj__fail(w->ctx, FJ_ERR_IO,
                    "fj_cache_prewarm_bwd: %llu cache entries could not be "
                    "written to the disk cache (a full or read-only file "
                    "system? the log names each): the kernels are in memory "
                    "only",
                    (unsigned long long)lost);
  return FJ_OK;
}

fj_status fj_cache_prewarm_bwd(fj_ctx *ctx, const fj_problem *problems,
                               size_t n, const fj_prepare_opts *opts,
                               fj_status *each, fj_prewarm_report *report)
{
  if (!ctx || (!problems && n))
    return fj__null_arg(ctx, "fj_cache_prewarm_bwd", ctx ? "problems" : "ctx");
  fj__clear_error(ctx);
  if (n > PREWARM_MAX)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "fj_cache_prewarm_bwd: n = %zu problems is more than one "
                    "call takes (at most %d)",
                    n, PREWARM_MAX);
  if (opts && opts->workers < 0)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "fj_cache_prewarm_bwd: workers %d is invalid: 0 (one "
                    "per CPU, at most 16) or more",
                    opts->workers);
  warm_run w;
  memset(&w, 0, sizeof w);
  w.ctx = ctx;
  w.p = problems;
  w.n = n;
  w.it = calloc(n ? n : 1, sizeof *w.it);
  w.b = calloc(n ? n : 1, sizeof *w.b);
  w.ready = calloc(3 * n + 1, sizeof *w.ready);
  fj_status st = FJ_OK;
  if (!w.it || !w.b || !w.ready) {
    st = fj__fail(ctx, FJ_ERR_NOMEM, "out of memory");
  } else {
    fj_cache_stats before;
    fj_cache_stats_get(ctx, &before);
    plan_all(&w);
    build_mains(&w, opts);
    build_rows(&w);
    st = finish(&w, &before, each, report);
  }
  for (size_t i = 0; w.it && i < n; i++) {
    free(w.it[i].message);
    free(w.b ? w.b[i].message : NULL);
  }
  free(w.it);
  free(w.b);
  free(w.ready);
  return st;
}
