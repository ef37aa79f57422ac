/*
 * tune.h -- what the forward's tuner (tune.c) shares with the backward's
 * (tune_bwd.c): the options' check, random inputs on the device, and the
 * device-side comparison of one output with another (templates/compare.cu).
 */
#ifndef FJ_TUNE_H
#define FJ_TUNE_H

#include <stddef.h>
#include <stdint.h>

#include "ctx.h"

/* The variants a tune of p times, at most max into out: the heuristic's
 * first, then the families' spaces (tune.c says which). */
size_t fj__tune_candidates(fj_ctx *ctx, const fj_problem *p, fj_variant *out,
                           size_t max);

/* FJ_ERR_INVALID_ARG, the message starting with `who`, for options out of
 * range (iters outside 0..256, a negative warmup or workers). */
fj_status fj__tune_check_opts(const fj_ctx *ctx, const char *who,
                              const fj_tune_opts *o);

/* n random values in [-scale, scale) from *state (xorshift), converted to
 * dt, into new device memory at *dst (the caller frees it).  The caller
 * has entered the CUDA context. */
fj_status fj__tune_upload_random(fj_ctx *ctx, uint64_t *dst, fj_dtype dt,
                                 size_t n, float scale, uint64_t *state);

/* The comparison kernel's function for elements of dt (built or fetched;
 * the caller has entered the CUDA context, without ctx->lock). */
fj_status fj__tune_compare_fn(fj_ctx *ctx, fj_dtype dt, void **fn);

/* A tune's progress through its options' callback: `total` steps, the
 * compiles the first half (fj__tune_compile_progress, a compile's
 * callback with the steps as its user pointer), then one step
 * (fj__tune_step) per candidate checked and timed. */
typedef struct fj_tune_steps {
  const fj_tune_opts *o;
  size_t done, total;
} fj_tune_steps;
void fj__tune_step(fj_tune_steps *s);

/* Counts candidate `what`'s status st (not FJ_OK) in r: a refusal
 * (FJ_ERR_UNSUPPORTED, FJ_ERR_RESOURCES: the template's rules, shared
 * memory, a launch the driver or the library refuses) as refused, anything
 * else as failed; either way the library's log says which and why (ctx's
 * last message: info for a refusal, a warning for a failure), so no
 * candidate drops out silently. */
void fj__tune_count(const fj_ctx *ctx, fj_tune_report *r, fj_status st,
                    const char *what, const char *why);
void fj__tune_compile_progress(void *steps, size_t done, size_t total);

/* The median time of `iters` (0: 10; at most 256, as
 * fj__tune_check_opts allows) calls of run(arg) between events e0 and
 * e1, after `warmup` more.  The caller has entered the CUDA context. */
typedef fj_status (*fj_tune_launch)(void *arg);
fj_status fj__tune_median(fj_ctx *ctx, void *e0, void *e1, int warmup,
                          int iters, fj_tune_launch run, void *arg,
                          double *median);

/* ||out - ref|| / ||ref|| over n elements of out and ref in device memory
 * (fn's dtype), into *rel; +inf where out has a non-finite element.  sums
 * is device scratch of 3 doubles.  Synchronous. */
fj_status fj__tune_distance(fj_ctx *ctx, void *fn, uint64_t out, uint64_t ref,
                            size_t n, uint64_t sums, double *rel);

#endif /* FJ_TUNE_H */
