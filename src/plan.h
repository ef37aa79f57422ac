/*
 * plan.h -- what to launch for a problem: the heuristic's variant, and
 * from a variant and its kernel's shape the splits, grids and workspace
 * (fj_plan).  Arithmetic only; attention.c adds the tuning database and
 * the launches.
 */
#ifndef FJ_PLAN_H
#define FJ_PLAN_H

#include "ctx.h"
#include "template.h"

/* The heuristic's variant for a problem on the context's target. */
void fj__heuristic(const fj_ctx *ctx, const fj_problem *p, fj_variant *v);
/* Its choice among the families without TMA (wmma, mma): the tuner's
 * starting point for their space. */
void fj__heuristic_sync(const fj_ctx *ctx, const fj_problem *p, fj_variant *v);
/* The rows of a decode-shaped problem's tile (64 or 128: the packed rows,
 * seq_q x group, fit one), or 0 for any other problem. */
int fj__decode_rows(const fj_problem *p);
/* Whether a problem has variable lengths (any of cu_seqlens_q,
 * cu_seqlens_kv, seqused_kv, or a block table), and paged K/V: the
 * variant axes varlen and paged it needs. */
int fj__problem_varlen(const fj_problem *p);
int fj__problem_paged(const fj_problem *p);
/* Why a split problem (head_dim_v) on an sm_90a target cannot take the
 * wgmma family, its only one, where the variant's rules would not say it
 * (packed sequences without their totals, strides TMA cannot encode); NULL
 * otherwise.  Static text. */
const char *fj__split_misfit(const fj_ctx *ctx, const fj_problem *p);
/* What the heuristic's choice depends on beyond the tuning database's
 * problem class, as one number (for the dispatch caches' keys). */
int fj__plan_class(const fj_ctx *ctx, const fj_problem *p);
/* Whether the wgmma family can take p on ctx's arch: its head dims, dtypes,
 * and strides TMA can encode (no broadcast dimension of extent above 1). */
int fj__plan_wgmma_fits(const fj_ctx *ctx, const fj_problem *p);
/* The split-KV combine's warps a row for `splits` splits (1, 2 or 4;
 * combine.cu): enough that each warp loads all its splits' partials at
 * once up to 32 splits. */
int fj__combine_warps(int splits);
/* The split-KV combine's blocks across (its grid's x) for `rows` rows of
 * `splits` splits: 4 / fj__combine_warps(splits) rows a block. */
uint64_t fj__combine_blocks(uint64_t rows, int splits);
/* The split-KV combine's columns a block (combine.cu's cols) for O's
 * head_dim_v columns over `rows` rows of `splits` splits: head_dim_v (one
 * slice: a block holds its rows' whole O), unless O is wider than 128
 * columns and the row blocks are fewer than ctx's multiprocessors, then
 * 128; and the slices a row takes for those columns, the grid's y. */
int fj__combine_cols(const fj_ctx *ctx, uint64_t rows, int splits,
                     int head_dim_v);
int fj__combine_slices(int head_dim_v, int cols);
/* FP8 attention (dtype e4m3): the bytes of V^T the workspace begins
 * with (kparams.h's vt); 0 for other variants. */
size_t fj__plan_vt_bytes(const fj_problem *p, const fj_variant *v);
/* The plan of variant v for p, its kernel's template having said m: splits
 * (problem.splits, else the rule), grids, workspace (the score
 * expression's relative table last, rel_table.h).  The caller fills
 * plan->from. */
fj_status fj__plan_fill(const fj_ctx *ctx, const fj_problem *p,
                        const fj_variant *v, const fj_kmeta *m,
                        fj_plan *plan);
/* Where a workspace's relative table starts after `before` bytes of the
 * rest: rounded up to 16. */
size_t fj__plan_rt_offset(size_t before);

#endif /* FJ_PLAN_H */
