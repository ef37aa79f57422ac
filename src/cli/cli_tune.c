/*
 * cli_tune.c -- `flashjit tune`: autotunes a problem class on the GPU with a
 * progress bar and records the winner (with --backward, the backward's main
 * kernel), or with --show lists the database.
 */
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

typedef struct tune_progress_state {
  double start;
} tune_progress_state;

static double wall_s(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Both reports' last lines: the candidates' counts (the refusals'
 * reasons are in the library's log: info, --verbose; the failures'
 * always: warnings), then the times and where the result went. */
static void print_tail(const cli *c, const fj_tune_report *r, fj_ctx *ctx,
                       int saved)
{
  printf("candidates %d: refused %d, failed %d, wrong output %d, timed %d%s\n",
         r->candidates, r->refused, r->failed, r->wrong, r->timed,
         r->refused && !c->verbose ? " (--verbose says why each was refused)"
                                   : "");
  printf("compile %.1f s, total %.1f s%s%s\n", r->compile_s, r->total_s,
         saved ? "; recorded in " : "", saved ? fj_cache_dir(ctx) : "");
}

/* A bar with an ETA on a terminal; a plain line every tenth otherwise. */
static void tune_progress(void *user, size_t done, size_t total)
{
  tune_progress_state *s = user;
  double elapsed = wall_s() - s->start, frac = total ? (double)done / (double)total : 1;
  double eta = frac > 0 ? elapsed / frac - elapsed : 0;
  if (isatty(STDERR_FILENO)) {
    char bar[41];
    int fill = (int)(frac * 40);
    for (int i = 0; i < 40; i++)
      bar[i] = i < fill ? '#' : '.';
    bar[40] = '\0';
    fprintf(stderr, "\rtuning [%s] %zu/%zu %s, %.0f s left   ", bar, done, total,
            done * 2 <= total ? "compiling" : "timing", eta);
  } else if (total && (done * 10 / total != (done - 1) * 10 / total || done == total)) {
    fprintf(stderr, "tuning: %zu/%zu steps, %.0f s elapsed, about %.0f s left\n",
            done, total, elapsed, eta);
  }
}

static int show_entry(void *user, const fj_tune_entry *e)
{
  (void)user;
  const fj_variant *v = &e->variant;
  printf("%s\n    m%d n%d w%d s%d %s %s %s: %.3f ms (heuristic %.3f ms, %.2fx) "
         "tuned on %s, %s\n",
         e->key, v->tile_m, v->tile_n, v->warps, v->stages,
         fj_swizzle_name(v->swizzle), fj_softmax_name(v->softmax),
         fj_mma_name(v->mma), e->ms, e->default_ms,
         e->ms > 0 ? e->default_ms / e->ms : 0, e->shape ? e->shape : "?",
         e->date ? e->date : "?");
  return 0;
}

static int tune_show(cli *c)
{
  fj_ctx *ctx;
  int rc = cli_open_ctx(c, -1, "sm_90a", &ctx);
  if (rc)
    return rc;
  fj_status st = fj_tune_list(ctx, show_entry, NULL);
  if (st != FJ_OK)
    rc = cli_fj_error(c, ctx, st);
  fj_ctx_destroy(ctx);
  return rc;
}

static void tune_print(const cli *c, const run_data *d, const fj_variant *best,
                       const fj_tune_report *r, fj_ctx *ctx, int saved)
{
  char name[160];
  fj_variant_name(best, name, sizeof name);
  printf("best:      %s %.3f ms (%.1f TFLOP/s)\n", name, r->best_ms,
         cli_tflops(d, r->best_ms));
  printf("heuristic: %.3f ms (%.1f TFLOP/s): the best is %.2fx faster\n",
         r->default_ms, cli_tflops(d, r->default_ms),
         r->default_ms / r->best_ms);
  print_tail(c, r, ctx, saved);
}

/* tune --backward's report: the winner's main kernel, against the
 * plan's own choice; TFLOP/s as run --backward counts them. */
static void tune_print_bwd(const cli *c, const run_data *d,
                           const fj_bwd_plan *best, const fj_tune_report *r,
                           fj_ctx *ctx, int saved)
{
  fj_kernel *k;
  const fj_variant *v = &best->variant;
  int named = fj_attention_bwd_kernel(ctx, &d->p, best, 1, &k) == FJ_OK;
  printf("best:      %s (mma %s, %d stage%s) %.3f ms (%.1f TFLOP/s)\n",
         named ? fj_kernel_name(k) : "?", fj_mma_name(v->mma), v->stages,
         v->stages == 1 ? "" : "s", r->best_ms,
         2.5 * cli_tflops(d, r->best_ms));
  printf("heuristic: %.3f ms (%.1f TFLOP/s): the best is %.2fx faster\n",
         r->default_ms, 2.5 * cli_tflops(d, r->default_ms),
         r->default_ms / r->best_ms);
  print_tail(c, r, ctx, saved);
}

/* Runs the tuner (the forward's, or with --backward the backward's) with
 * the progress bar; prints its report. */
static int tune_run(cli *c, fj_ctx *ctx, run_data *d)
{
  tune_progress_state ps = {wall_s()};
  fj_tune_opts o;
  fj_tune_opts_init(&o);
  o.iters = c->iters > 0 ? c->iters : 10;
  o.workers = c->workers;
  o.save = !c->no_save;
  o.progress = tune_progress;
  o.user = &ps;
  fj_variant best;
  fj_bwd_plan best_bwd;
  fj_tune_report r;
  fj_status st = c->backward ? fj_tune_bwd(ctx, &d->p, &o, &best_bwd, &r)
                             : fj_tune(ctx, &d->p, &o, &best, &r);
  if (isatty(STDERR_FILENO))
    fputc('\n', stderr);
  if (st != FJ_OK)
    return cli_fj_error(c, ctx, st);
  int saved = o.save && fj_cache_dir(ctx);
  if (c->backward)
    tune_print_bwd(c, d, &best_bwd, &r, ctx, saved);
  else
    tune_print(c, d, &best, &r, ctx, saved);
  return 0;
}

int cli_cmd_tune(cli *c)
{
  if (c->show)
    return tune_show(c);
  if (!c->shape_given)
    return cli_usage_error(c, "--shape B,H,S,D is required (or --show)");
  run_data d;
  fj_ctx *ctx;
  c->variant_given = 0;
  int rc = cli_problem_on_device(c, &d, &ctx);
  if (rc)
    return rc;
  /* The expressions' parameters (random from --seed, or --param's files)
   * and the block mask, on the device: the candidates read them. */
  CUDA_TRY(cudaSetDevice(c->device));
  if ((rc = cli_run_mods(c, &d, c->seed)) != 0 ||
      (rc = cli_run_block_mask(c, ctx, &d)) != 0) {
    cli_run_free(&d);
    fj_ctx_destroy(ctx);
    return rc;
  }
  rc = tune_run(c, ctx, &d);
  cli_run_free(&d);
  fj_ctx_destroy(ctx);
  return rc;
}
