/*
 * merge.c -- partial attention results merged into one (fj_attention_merge
 * on the GPU, fj_reference_merge on the host): the combine of split-KV
 * (templates/combine.cu) offered to callers that split the keys
 * themselves -- context parallelism's ring steps, a KV cache held in
 * pieces.  Both forms take the split-KV workspace's layout and sum the
 * parts in their order, part 0 first.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attention.h"
#include "ctx.h"
#include "devptr.h"
#include "driver.h"
#include "kernel.h"
#include "kparams.h"
#include "mods.h"
#include "plan.h"
#include "problem.h"

/* The part count both forms check (1..FJ_SPLITS_MAX); fn names the
 * call. */
static fj_status check_parts(const fj_ctx *ctx, const char *fn, int parts)
{
  if (parts < 1 || parts > FJ_SPLITS_MAX)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "%s: parts %d is invalid: 1..%d (FJ_SPLITS_MAX)", fn,
                    parts, FJ_SPLITS_MAX);
  return FJ_OK;
}

/* The GPU form's pointers: float32 parts, O's 16-bit elements. */
static fj_status check_aligned(const fj_ctx *ctx, const char *name,
                               const void *ptr, unsigned bytes,
                               const char *what)
{
  if ((uintptr_t)ptr % bytes)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "fj_attention_merge: %s %p is not %u-byte aligned (%s)",
                    name, ptr, bytes, what);
  return FJ_OK;
}

/* The rows the combine covers and its grid: 4 / fj__combine_warps rows a
 * block of 128 threads, y the slices of their columns, *cols wide, as
 * plan.c plans split-KV's. */
static fj_status merge_grid(const fj_ctx *ctx, const fj_problem *p, int parts,
                            unsigned grid[2], int *cols)
{
  uint64_t rows = (uint64_t)p->batch * (uint64_t)p->heads_q *
                  (uint64_t)p->seq_q;
  uint64_t per_block = 4 / (uint64_t)fj__combine_warps(parts);
  uint64_t blocks = fj__combine_blocks(rows, parts);
  if (blocks > INT32_MAX)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "fj_attention_merge: %llu rows of %d parts: one grid "
                    "merges at most %llu",
                    (unsigned long long)rows, parts,
                    (unsigned long long)INT32_MAX * per_block);
  int dv = fj__problem_dv(p);
  *cols = fj__combine_cols(ctx, rows, parts, dv);
  grid[0] = (unsigned)blocks;
  grid[1] = (unsigned)fj__combine_slices(dv, *cols);
  return FJ_OK;
}

/* Everything fj_attention_merge checks before it builds a kernel. */
static fj_status merge_check(fj_ctx *ctx, const fj_problem *p, int parts,
                             const float *o_parts, const float *lse_parts,
                             const void *o, const float *lse)
{
  fj_status st = fj_problem_check(ctx, p);
  /* The combine writes 16-bit O (an e4m3 O's scale is not its). */
  if (st == FJ_OK && fj__o_dtype(p) == FJ_E4M3)
    st = fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                  "fj_attention_merge: o_dtype e4m3 is not implemented: the "
                  "merge writes O in f16 or bf16 (merge in bf16, then "
                  "quantise)");
  if (st == FJ_OK)
    st = check_parts(ctx, "fj_attention_merge", parts);
  if (st == FJ_OK)
    st = check_aligned(ctx, "o_parts", o_parts, 4, "float32");
  if (st == FJ_OK)
    st = check_aligned(ctx, "lse_parts", lse_parts, 4, "float32");
  if (st == FJ_OK)
    st = check_aligned(ctx, "o", o, 2, "16-bit elements");
  if (st == FJ_OK && lse)
    st = check_aligned(ctx, "lse", lse, 4, "float32");
  return st;
}

/* The combine kernel's variant for p: its head dim, O's dtype, varlen
 * rows and the sinks (the mods' other fields do not enter its name). */
static void merge_variant(const fj_problem *p, fj_variant *v)
{
  memset(v, 0, sizeof *v);
  v->head_dim = fj__problem_dv(p);  /* O's columns */
  v->dtype = fj__o_dtype(p);
  v->varlen = p->cu_seqlens_q != NULL;
  v->mods = p->mods;
}

/* The pointers of the call, on the context's device, then the kernel's
 * function and its launch; the CUDA context entered. */
static fj_status merge_launch(fj_ctx *ctx, const fj_problem *p,
                              const fj_variant *v, int parts,
                              const float *o_parts, const float *lse_parts,
                              void *o, float *lse, const unsigned grid[2],
                              int cols, void *stream)
{
  fj_devptr ptrs[FJ_DEVPTR_MAX];
  size_t n = fj__devptr_list(p, NULL, NULL, NULL, o, lse, NULL, ptrs);
  ptrs[n++] = (fj_devptr){"o_parts", -1, o_parts};
  ptrs[n++] = (fj_devptr){"lse_parts", -1, lse_parts};
  fj_status st = fj__devptr_check_list(ctx, "fj_attention_merge", ptrs, n);
  void *fn = NULL;
  if (st == FJ_OK) {
    pthread_mutex_lock(&ctx->lock);
    st = fj__combine_function(ctx, v, cols, &fn);
    pthread_mutex_unlock(&ctx->lock);
  }
  if (st != FJ_OK)
    return st;
  fj_kparams kp;
  fj__fill_params(&kp, p, NULL, NULL, NULL, o, lse);
  kp.splits = parts;
  kp.combine_warps = fj__combine_warps(parts);
  kp.o_part = (float *)(uintptr_t)o_parts;  /* only read */
  kp.lse_part = (float *)(uintptr_t)lse_parts;
  void *args[1] = {&kp};
  fj_launch l = {fn, {grid[0], grid[1], 1}, {128, 1, 1}, 0, stream, args, 0};
  return fj__cu_launch(ctx, &l);
}

fj_status fj_attention_merge(fj_ctx *ctx, const fj_problem *p, int parts,
                             const float *o_parts, const float *lse_parts,
                             void *o, float *lse, void *stream)
{
  if (!ctx || !p || !o_parts || !lse_parts || !o)
    return fj__null_arg(ctx, "fj_attention_merge",
                        !ctx         ? "ctx"
                        : !p         ? "p"
                        : !o_parts   ? "o_parts"
                        : !lse_parts ? "lse_parts"
                                     : "o");
  fj__clear_error(ctx);
  unsigned grid[2] = {0, 0};
  int cols = 0;
  fj_status st = merge_check(ctx, p, parts, o_parts, lse_parts, o, lse);
  if (st == FJ_OK)
    st = merge_grid(ctx, p, parts, grid, &cols);
  if (st != FJ_OK)
    return st;
  /* Built first: a compile-only context makes the kernel (for the disk
   * cache, or a look at it) before it refuses to launch. */
  fj_variant v;
  merge_variant(p, &v);
  fj_kernel *kern;
  pthread_mutex_lock(&ctx->lock);
  st = fj__combine_kernel(ctx, &v, cols, &kern);
  pthread_mutex_unlock(&ctx->lock);
  if (st != FJ_OK)
    return st;
  if (!ctx->has_device)
    return fj__fail(ctx, FJ_ERR_COMPILE_ONLY,
                    "fj_attention_merge: the merge's kernel %s compiled; "
                    "cannot launch it on a compile-only context (arch %s)",
                    kern->meta.symbol, ctx->arch);
  if ((st = fj__cu_enter(ctx)) != FJ_OK)
    return st;
  st = merge_launch(ctx, p, &v, parts, o_parts, lse_parts, o, lse, grid,
                    cols, stream);
  fj__cu_leave(ctx);
  return st;
}

/* ---- the float64 form --------------------------------------------------------- */

/* One row: parts s at lse[s * rows] and o[s * rows * d], the sink (-inf:
 * none), into out[0..d) and *lse_out.  The formulas of combine.cu, in
 * float64: the max first, a part at -inf skipped, NaN carried. */
static void merge_row(int parts, size_t rows, int d, const double *o,
                      const double *l, double sink, double *out,
                      double *lse_out)
{
  double mx = sink;
  for (int s = 0; s < parts; s++)
    mx = l[(size_t)s * rows] > mx || isnan(l[(size_t)s * rows])
             ? l[(size_t)s * rows]
             : mx;
  memset(out, 0, sizeof *out * (size_t)d);
  if (isnan(mx) || isnan(sink)) {
    for (int e = 0; e < d; e++)
      out[e] = NAN;
    if (lse_out)
      *lse_out = NAN;
    return;
  }
  double sum = mx == -HUGE_VAL || sink == -HUGE_VAL ? 0.0 : exp(sink - mx);
  for (int s = 0; s < parts && mx > -HUGE_VAL; s++)
    if (l[(size_t)s * rows] != -HUGE_VAL)
      sum += exp(l[(size_t)s * rows] - mx);
  double lse = sum > 0 ? mx + log(sum) : -HUGE_VAL;
  for (int s = 0; s < parts && sum > 0; s++) {
    double ls = l[(size_t)s * rows];
    if (ls == -HUGE_VAL)
      continue;
    double w = exp(ls - lse);
    const double *os = o + (size_t)s * rows * (size_t)d;
    for (int e = 0; e < d; e++)
      out[e] += w * os[e];
  }
  if (lse_out)
    *lse_out = lse;
}

/* Whether row i of sequence b is a row (varlen: within its length). */
static int row_exists(const fj_problem *p, int b, int i)
{
  return !p->cu_seqlens_q || i < p->cu_seqlens_q[b + 1] - p->cu_seqlens_q[b];
}

fj_status fj_reference_merge(const fj_problem *p, int parts,
                             const double *o_parts, const double *lse_parts,
                             double *out, double *out_lse)
{
  const char *fn = "fj_reference_merge";
  fj__clear_error(NULL);
  if (!p || !o_parts || !lse_parts || !out)
    return fj__null_arg(NULL, fn,
                        !p           ? "p"
                        : !o_parts   ? "o_parts"
                        : !lse_parts ? "lse_parts"
                                     : "out");
  fj_status st = fj_problem_check_lengths(p);
  if (st == FJ_OK)
    st = fj__mods_check_data(NULL, p->mods);
  if (st == FJ_OK)
    st = check_parts(NULL, fn, parts);
  if (st != FJ_OK)
    return st;
  fj_mods_info mi;
  fj__mods_info(p->mods, &mi);
  size_t rows = (size_t)p->batch * (size_t)p->heads_q * (size_t)p->seq_q;
  int d = fj__problem_dv(p);  /* O's columns */
  for (size_t f = 0; f < rows; f++) {
    int i = (int)(f % (size_t)p->seq_q);
    int h = (int)(f / (size_t)p->seq_q % (size_t)p->heads_q);
    int b = (int)(f / (size_t)p->seq_q / (size_t)p->heads_q);
    double *o = out + f * (size_t)d, *l = out_lse ? out_lse + f : NULL;
    if (!row_exists(p, b, i)) {  /* as fj_reference_fwd: no such row */
      memset(o, 0, sizeof *o * (size_t)d);
      if (l)
        *l = NAN;
      continue;
    }
    double sink = mi.sinks ? (double)p->mods->sinks[h] : -HUGE_VAL;
    merge_row(parts, rows, d, o_parts + f * (size_t)d, lse_parts + f, sink,
              o, l);
  }
  return FJ_OK;
}
