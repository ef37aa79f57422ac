/*
 * tier.h -- the tiered JIT (fj_ctx_opts.jit_tiers): where the kernel
 * chosen for a problem would have to be compiled first, the problem's
 * first kernel (templates/attention_simt.cu, compiled in a fraction of
 * the time) answers while the chosen one compiles on a thread of its own;
 * the first call after that compile ended launches the chosen kernel.
 */
#ifndef FJ_TIER_H
#define FJ_TIER_H

#include "ctx.h"
#include "kernel.h"

typedef struct fj_tier fj_tier;

/* The most work (fj__tier_flops) the first kernel takes on: it runs on
 * CUDA cores at about 7 TFLOP/s on an H200 (40 ms for (4, 16, 4096, 128)
 * causal, docs/PERF.md J3), so 2^41 FLOPs is about 0.3 s -- past that,
 * waiting for the chosen kernel's compile (0.5-1.5 s) costs less than
 * running it. */
#define FJ_TIER_MAX_FLOPS 2199023255552.0
/* p's attention FLOPs: 4 B Hq D times the (query, key) pairs the causal
 * mask leaves (all Sq Skv without one; a window or a mask expression is
 * not counted: there the estimate errs large). */
double fj__tier_flops(const fj_problem *p);
/* Whether the first kernel may answer p with variant v: the context asks
 * for tiers, the problem is dense (no varlen or pages), of f16 or bf16
 * K/V, not deterministic, not in checked mode, at most FJ_TIER_MAX_FLOPS
 * of work, with its heads and batch within a grid's y and z. */
int fj__tier_serves(const fj_ctx *ctx, const fj_problem *p,
                    const fj_variant *v);
/* v's kernel where it is ready: in memory, on disk, or its background
 * compile has ended (a failed one returns its error, once).  Otherwise
 * *k is NULL and either its compile runs in the background already, or
 * *fresh is that compile, rendered, for fj__tier_start (the caller builds
 * the first kernel before, so that the two compiles do not compete).
 * ctx->lock held. */
fj_status fj__tier_kernel(fj_ctx *ctx, const fj_variant *v, fj_kernel **k,
                          fj_kjob **fresh);
/* Starts fresh (fj__tier_kernel's) and keeps it for v's later calls. */
fj_status fj__tier_start(fj_ctx *ctx, const fj_variant *v, fj_kjob *fresh);
/* v's kernel, waited for: a compile in the background is joined, else
 * the kernel is built now (a stream being captured, or a recording
 * thread, must not keep the first kernel); ctx->lock held. */
fj_status fj__tier_wait(fj_ctx *ctx, const fj_variant *v, fj_kernel **k);
/* The first kernel of v's problem, built (or found) now; ctx->lock held. */
fj_status fj__tier_first(fj_ctx *ctx, const fj_variant *v, fj_kernel **k);
/* Waits for the compiles still running and keeps their kernels (the disk
 * cache writes them), then frees the table (fj_ctx_destroy). */
void fj__tier_free(fj_ctx *ctx);

#endif /* FJ_TIER_H */
