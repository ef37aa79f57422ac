/*
 * plan.c -- what to launch for a problem: the heuristic's variant (family,
 * tiles, GQA packing), the number of key splits, the grids and the
 * workspace.  Pure arithmetic on the problem, the target and what the
 * kernel's template said of itself (threads, shared memory); nothing here
 * touches a device.
 */
#include <math.h>
#include <string.h>

#include "ctx.h"
#include "mods.h"
#include "plan.h"
#include "rel_table.h"
#include "template.h"
#include "variant.h"

/* ---- the heuristic's variant ---------------------------------------------------- */

/* Whether 128-row blocks would be fewer than the multiprocessors (the
 * device's, or on a compile-only context those it plans for). */
static int few_blocks(const fj_ctx *ctx, const fj_problem *p)
{
  long blocks = (long)p->batch * p->heads_q * ((p->seq_q + 127) / 128);
  return blocks < fj__sm_count(ctx);
}

int fj__problem_varlen(const fj_problem *p)
{
  return p->cu_seqlens_q || p->cu_seqlens_kv || p->seqused_kv ||
         p->block_table;
}

int fj__problem_paged(const fj_problem *p)
{
  return p->block_table != NULL;
}

int fj__decode_rows(const fj_problem *p)
{
  /* Block masks take neither GQA packing nor splits (yet). */
  fj_mods_info mi;
  fj__mods_info(p->mods, &mi);
  if (mi.blocks)
    return 0;
  long rows = (long)p->seq_q * (p->heads_q / p->heads_kv);
  if (p->seq_q > 16 || rows > 128)
    return 0;
  return rows <= 64 ? 64 : 128;
}

/* Whether the target is the one whose choices were timed (sm_90a: the
 * H100 and H200 of docs/PERF.md): there the rules stand as measured,
 * and a rule made for another target's resources leaves them alone. */
static int measured(const fj_ctx *ctx)
{
  return ctx->sm == 90 && ctx->arch_specific;
}

/* The head dim the mma family's products see: a multiple of 8 but not of
 * 16 is padded to the next multiple of 16 (attention_mma.cu), and takes
 * the tiles of that one. */
static int mma_dim(int d)
{
  return (d + 15) / 16 * 16;
}

/* The mma family where the target has mma.sync m16n8k16 (sm_80 on), with
 * the shapes that ran fastest in the H200 sweeps of docs/PERF.md (S = 4096
 * and 16384, causal and not): up to head_dim 128 each of 4 warps owns 32
 * rows (K and V fragments serve two row slices); above, 8 warps own 16 rows
 * each and the S(t + 1) pipeline runs.  All fit sm_80's shared memory
 * except head_dim 256 with 64-key tiles, taken only where it fits. */
static void mma_choice(const fj_ctx *ctx, const fj_problem *p, fj_variant *v)
{
  int d = mma_dim(v->head_dim);
  v->mma = FJ_MMA_SYNC;
  v->softmax = FJ_SOFTMAX_REGS;
  v->tile_m = 128;
  v->warps = d <= 128 ? 4 : 8;
  v->tile_n = d <= 64 ? 128 : 64;
  v->swizzle = d <= 64 ? FJ_SWIZZLE_XOR : FJ_SWIZZLE_PAD;
  if (d > 192 && !(v->stages == 2 && fj__smem_limit(ctx) >= 210 * 1024))
    v->tile_n = 32;
  /* Causal head dims up to 64: a third stage ran 5% faster (S = 4096). */
  if (d <= 64 && v->causal != FJ_CAUSAL_NONE && v->stages == 2)
    v->stages = 3;
  /* The 32-row warps at head dims 64-128 are the H200's shape (sm_90a).
   * Elsewhere ptxas spills them at 255 registers: 64-80 bytes at head dim
   * 128 on sm_80, 8-20 on sm_90 and sm_100-110; 4-16 at head dim 64 on
   * sm_80, sm_86, sm_89 and sm_100 (sm_110 with the causal third stage).
   * 16-row warps (8 of them) keep 200-250 and spill nothing.  The causal
   * three-stage kernel at head dim 64 on sm_80 and sm_87 (255, no spill)
   * stays, but not with FP8 K/V, whose conversion spills 8 bytes there.
   * Not timed: no part but the H100 and H200 was measured. */
  int keep3 = ctx->sm < 90 && v->stages == 3 && v->kv_dtype != FJ_E4M3 &&
              fj__variant_tiles_smem(v) <= fj__smem_limit(ctx);
  if (!measured(ctx) && d >= 64 && d <= 128 && !keep3)
    v->warps = 8;
  /* Fewer 128-row blocks than multiprocessors: 64-row blocks of 4 warps,
   * 16 rows each, twice as many blocks. */
  if (few_blocks(ctx, p)) {
    v->tile_m = 64;
    v->warps = 4;
  }
}

static int blocks_per_sm(const fj_ctx *ctx, unsigned threads, unsigned smem);
static int split_rule(long blocks, int sms, int slots, int tiles_kv);

/* Wide and split head dims on the mma family (head_dim above 256, or
 * head_dim_v below head_dim: MLA, V read from K's rows): 16-row tiles
 * (the GQA-packed rows of a decode) whose 4 warps split each 64-key tile,
 * and V's columns where it has more than 256 (attention_mma.cu's KS and
 * CS), two stages; where those do not fit the shared memory one stage,
 * then (V above 256 columns) 2 warps and 32-key tiles in the XOR layout,
 * two stages or one.
 * Not timed yet beyond MLA's decode (docs/PERF.md). */
static void wide_choice(const fj_ctx *ctx, const fj_problem *p,
                        fj_variant *v)
{
  v->mma = FJ_MMA_SYNC;
  v->softmax = FJ_SOFTMAX_REGS;
  v->pack_gqa = fj__decode_rows(p) && p->heads_q > p->heads_kv;
  v->tile_m = 16;
  v->warps = 4;
  v->tile_n = 64;
  v->stages = 2;
  v->swizzle = FJ_SWIZZLE_PAD;
  int limit = fj__smem_limit(ctx);
  if (fj__variant_tiles_smem(v) > limit)
    v->stages = 1;
  if (fj__variant_tiles_smem(v) > limit && fj__problem_dv(p) > 256) {
    /* Two warps hold 256 of O's columns each: with the padded layout
     * ptxas spilled 12-68 bytes at head dim 512 (sm_86, sm_89, sm_120),
     * with the XOR swizzle none (by the resource report; not run). */
    v->warps = 2;
    v->tile_n = 32;
    v->stages = 2;
    v->swizzle = FJ_SWIZZLE_XOR;
    if (fj__variant_tiles_smem(v) > limit)
      v->stages = 1;
  }
}

/* The key tiles each block of a 16-row decode tile (KS, below) walks with
 * `stages` stages: the keys' tiles over the split rule's count, the rule
 * given the multiprocessors' room for blocks of that shared memory (one
 * block a KV head and batch index: the packed rows fit one tile). */
static int ks_walk(const fj_ctx *ctx, const fj_problem *p, const fj_variant *v,
                   int stages)
{
  fj_variant w = *v;
  w.tile_m = 16;
  w.stages = stages;
  unsigned smem = (unsigned)fj__variant_tiles_smem(&w);
  int tiles_kv = (p->seq_kv + v->tile_n - 1) / v->tile_n;
  int splits = p->splits >= 1
                   ? p->splits
                   : split_rule((long)p->batch * p->heads_kv, fj__sm_count(ctx),
                                fj__sm_count(ctx) * blocks_per_sm(ctx, 128, smem),
                                tiles_kv);
  return tiles_kv / splits;
}

/* Few query rows per KV head (fj__decode_rows): the query heads of a KV
 * head packed into the rows of one tile, 16 rows a warp (one slice), the
 * XOR swizzle, and
 * the largest key tiles with which ptxas keeps the packed, split kernel
 * free of spills on sm_90 (128 keys at head dim 64 and below, 32 at 160
 * and 256, else 64; 64 for paged K/V; 32 where 64 does not fit the
 * shared memory). */
static void decode_choice(const fj_ctx *ctx, const fj_problem *p,
                          fj_variant *v)
{
  int rows = fj__decode_rows(p), d = mma_dim(v->head_dim);
  v->pack_gqa = p->heads_q > p->heads_kv;
  v->tile_m = rows;
  v->warps = rows / 16;
  v->tile_n = d <= 64 ? 128 : d == 160 || d == 256 ? 32 : 64;
  /* Paged rows each find their page: at 128 keys ptxas spills (d64); a
   * third stage hides more of the lookups (344 against 365 us on the
   * H200, (64, 32/8, 1/4096, 128) bf16, pages of 16). */
  if (v->paged) {
    v->tile_n = v->tile_n > 64 ? 64 : v->tile_n;
    v->stages = 3;
  }
  /* A score or mask function per element: at 128 keys a window with the
   * softcap spills 16 bytes (d64). */
  fj_mods_info mi;
  fj__mods_info(p->mods, &mi);
  if (mi.user || mi.softcap)
    v->tile_n = v->tile_n > 64 ? 64 : v->tile_n;
  /* XOR: 257 us against pad's 273 on the H200 (64, 32/8, 1/4096, 128);
   * at head dims 192 and 256 ptxas spills with it. */
  v->swizzle = d >= 192 ? FJ_SWIZZLE_PAD : FJ_SWIZZLE_XOR;
  if (fj__variant_tiles_smem(v) > fj__smem_limit(ctx))
    v->tile_n = 32;
  /* Up to 16 packed rows: one 16-row tile whose 4 warps split each key
   * tile (attention_mma.cu's KS), so that a warp computes a quarter of
   * what a 64-row tile's warp does for the same keys.  Only on the
   * cp.async ring (2 or 3 stages), FP8 K/V's included (tile_fp8.cuh). */
  if ((long)p->seq_q * (p->heads_q / p->heads_kv) <= 16 &&
      v->tile_n % 64 == 0 && v->stages >= 2) {
    v->tile_m = 16;
    v->warps = 4;
    /* A long walk takes a third stage: where each block still walks 16
     * key tiles or more once the split rule has divided the keys, the
     * loads run two tiles ahead.  The batched decode (64, 32/8, 1/4096,
     * 128) bf16 on the H200: 242.9 us against 257.3 with two (`flashjit
     * run`, one call; under ncu two stages' 69.6 KB and 165 registers
     * let 3 blocks share a multiprocessor, so 512 blocks made 1.29
     * waves, and three stages' 102 KB make 1.94).  The single decode's
     * split kernel walks 2 tiles and keeps two (16.9 against 18.5 us). */
    if (v->stages == 2 && ks_walk(ctx, p, v, 3) >= 16)
      v->stages = 3;
  }
}

/* The largest power of two up to tile that divides block (a power of
 * two): a tile size that walks a block mask's blocks whole. */
static int fit_block(int tile, int block)
{
  int t = 16;
  while (t * 2 <= tile && block % (t * 2) == 0)
    t *= 2;
  return t;
}

/* The tiles as the target's shared memory takes them: where Q and the K
 * and V rings (fj__variant_tiles_smem) pass the per-block limit (the
 * parts of ~100 KB: sm_86, sm_89, sm_120; sm_75's 64 KB), first the third
 * stage goes, then key tiles narrow to 32, then 128-row blocks become 64
 * rows of 4 warps (16 rows each), then 16-key tiles, then synchronous
 * loads.  A choice that fits is left as it is: no pick on sm_80 or sm_90
 * changes here.  Not timed on those parts (none was measured): chosen by
 * the resource report, which the tuner refines on the user's GPU. */
static void fit_smem(const fj_ctx *ctx, fj_variant *v)
{
  int limit = fj__smem_limit(ctx);
  while (fj__variant_tiles_smem(v) > limit) {
    int ks = v->tile_m == 16;  /* the warps split 64-key tiles */
    if (v->stages > 2)
      v->stages--;
    else if (v->tile_n > 32 && !ks)
      v->tile_n /= 2;
    else if (v->tile_m > 64) {
      v->tile_m = 64;
      v->warps = 4;
    } else if (v->tile_n > 16 && !ks)
      v->tile_n /= 2;
    else if (v->stages > 1)
      v->stages = 1;
    else
      return;  /* refused by the kernel's check, with the numbers */
  }
}

/* Whether the wgmma family takes the head dim on sm_90a: from 64 up (it
 * pads to 64-column panels), and below where it is not a multiple of 16
 * (the mma family pads those to 16 columns now; sm_90a keeps the wgmma
 * family's prefill picks, not compared with it yet). */
static int wgmma_head_dim(int d)
{
  return d % 8 == 0 && d <= 256 && (d >= 64 || d % 16 != 0);
}

/* The head dim the wgmma family's tiles have: whole 64-column panels. */
static int wgmma_panels(int d)
{
  return (d + 63) / 64 * 64;
}

/* Whether the wgmma family can take the problem: sm_90a, its head dims
 * (wgmma_head_dim), the same dtype for K/V, K/V not paged (the mma family's
 * for now), packed sequences with their totals (TMA must know where a
 * tensor ends), and strides TMA can encode (none zero where the extent is
 * above 1; packed tensors are one batch of their total rows). */
static int wgmma_fits(const fj_ctx *ctx, const fj_problem *p)
{
  /* Split head dims (head_dim_v) up to 256: any of them (the mma family
   * takes those below head_dim only, reading V from K's rows). */
  int split = fj__problem_dv(p) != p->head_dim;
  if (!fj__arch_has(ctx, FJ_ARCH_WGMMA) ||
      p->head_dim > 256 || fj__problem_dv(p) > 256 ||
      (!split && !wgmma_head_dim(p->head_dim)) ||
      (split && p->dtype == FJ_E4M3) ||
      (p->kv_dtype && p->kv_dtype != p->dtype) || p->block_table ||
      (p->cu_seqlens_q && p->total_q < 1) ||
      (p->cu_seqlens_kv && p->total_kv < 1))
    return 0;
  int bq = p->cu_seqlens_q ? 1 : p->batch, bkv = p->cu_seqlens_kv ? 1 : p->batch;
  const int64_t *s[4] = {p->q_stride, p->k_stride, p->v_stride, p->o_stride};
  int ext[4][3] = {{bq, p->heads_q, p->seq_q},
                   {bkv, p->heads_kv, p->seq_kv},
                   {bkv, p->heads_kv, p->seq_kv},
                   {bq, p->heads_q, p->seq_q}};
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 3; j++)
      if (s[i][j] == 0 && ext[i][j] > 1)
        return 0;
  return 1;
}

const char *fj__split_misfit(const fj_ctx *ctx, const fj_problem *p)
{
  fj_dtype kv = p->kv_dtype ? p->kv_dtype : p->dtype;
  /* head_dim_v below head_dim, or above 256: the mma family's (which
   * reads V from K's rows; its variant's rules name what it refuses). */
  if (fj__problem_dv(p) < p->head_dim || p->head_dim > 256 ||
      fj__problem_dv(p) > 256)
    return NULL;
  if (fj__problem_dv(p) == p->head_dim || !fj__arch_has(ctx, FJ_ARCH_WGMMA) ||
      p->dtype == FJ_E4M3 || kv != p->dtype || p->block_table ||
      wgmma_fits(ctx, p))
    return NULL;  /* fits, or the variant's rules name why not */
  if ((p->cu_seqlens_q && p->total_q < 1) ||
      (p->cu_seqlens_kv && p->total_kv < 1))
    return "packed sequences without their totals (total_q, total_kv: TMA "
           "must know where a tensor ends)";
  return "a stride of 0 (a broadcast) where the extent is above 1, which "
         "TMA cannot encode";
}

/* A window bounded on the left: its tiles cross the window's edge. */
static int left_window(const fj_mods *m)
{
  return m && m->window_left >= 0;
}

/* The wgmma family (sm_90a): two consumer warpgroups of 64 rows (three at
 * head dim 64), key tiles as large as registers and shared memory allow,
 * two stages -- FlashAttention-3's shapes, with the key tiles the H200
 * sweeps of docs/PERF.md preferred. */
/* Short sequences: keys of at most 512 (2) or 1024 (1) in a dense problem,
 * where a tile's worth of padding or of the causal diagonal's masked
 * work is a large part of a row's; 0 otherwise. */
static int short_keys(const fj_problem *p)
{
  if (fj__problem_varlen(p))
    return 0;
  return p->seq_kv <= 512 ? 2 : p->seq_kv <= 1024 ? 1 : 0;
}

static void wgmma_choice(fj_variant *v, const fj_problem *p)
{
  /* A padded head dim (80, 96, 160, ...) takes its panels' tiles; split
   * head dims (192 / 128) those of the wider (a safe start: V's narrower
   * ring leaves room that larger key tiles could take). */
  int dv = wgmma_panels(fj__head_dim_v(v));
  int d = wgmma_panels(v->head_dim) > dv ? wgmma_panels(v->head_dim) : dv;
  fj_mods_info mi;
  fj__mods_info_reads(v->mods, &mi);
  v->mma = FJ_MMA_WGMMA;
  v->softmax = FJ_SOFTMAX_REGS;
  v->swizzle = FJ_SWIZZLE_XOR;
  v->stages = 2;
  v->pack_gqa = 0;  /* a decode shape the mma family cannot take */
  v->tile_m = d == 64 ? 192 : 128;
  v->warps = d == 64 ? 16 : 12;
  /* Head dim 128: 192-key tiles ran fastest while O left from registers;
   * with O staged through shared memory (templates/epilogue_regs.cuh's
   * stage), for which 192 keys leave no room, 160 (the H200, (4, 16, 4096,
   * 128) bf16: 792-797 us against 806-809 at 192, 798-803 at 176).  With
   * a causal mask ptxas spills 8 bytes at 192, so 176 (staged). */
  v->tile_n = d == 64    ? 128
              : d == 128 ? (v->causal ? 176 : 160)
              : d == 192 ? 96
                         : 80;
  /* Short sequences take tiles that divide them and meet the causal
   * diagonal whole: what `flashjit tune` found on the H200 for 16k tokens
   * at S = 512 and 1024, bf16 (docs/PERF.md, "Short sequences"): at head
   * dim 128 128-key tiles with a causal mask or 512 keys (1.18-1.28x the
   * tiles above; 1024 keys without a mask: a tie); at 256 64-key tiles
   * (1.03-1.30x); at 192 64-key tiles causal at 512 (1.10x; a tie at
   * 1024); at 64 two consumer warpgroups, not three, causal (1.13-1.16x;
   * a tie without a mask), with four stages (the H100, 2026-12-06: 1.03x
   * two stages at both lengths; docs/PERF.md, "Short sequences"). */
  int short_kv = short_keys(p);
  if (short_kv) {
    int causal = v->causal != FJ_CAUSAL_NONE;
    if (d == 64 && causal) {
      v->tile_m = 128;
      v->warps = 12;
      v->stages = 4;
    } else if (d == 128 && (causal || short_kv == 2)) {
      v->tile_n = 128;
    } else if (d == 192 && causal && short_kv == 2) {
      v->tile_n = 64;
    } else if (d == 256) {
      v->tile_n = 64;
    }
  }
  /* FP8 (dtype e4m3): key tiles fixed per head dim and mask, never chosen
   * by length, so that decode and prefill of one model round alike (the
   * key tile decides P's and O's rounding; README, "FP8"); two consumer
   * warpgroups.  Wider than 128 keys, O's FP8 partial stays in the
   * tensor cores' accumulator (variant.c's fp8_flush default: never).
   * The widths are the fastest of 128-256 on the H100 (docs/PERF.md F4,
   * with their error at 128k keys); head dims 192 and 256 keep 128 keys,
   * and so do expressions, softcap and block masks (with the softcap the
   * wider tiles passed their checks but ran 1.05-1.2x slower at d64 and
   * 1.02-1.03x at d128 on the H100, PERF.md F5; block sizes 192 does not
   * divide). */
  if (v->dtype == FJ_E4M3) {
    int masked = v->causal != FJ_CAUSAL_NONE || mi.window;
    v->tile_m = 128;
    v->warps = 12;
    v->tile_n = 128;
    if (!mi.user && !mi.softcap && !mi.blocks) {
      if (v->head_dim == 64)
        v->tile_n = masked ? 192 : 256;
      else if (v->head_dim == 128)
        v->tile_n = 192;
    }
    return;
  }
  /* A score or mask function holds more registers per element of S: with
   * the tiles above the softcap or a bias table spills 12-120 bytes (at
   * head dim 128, none with 144 keys); these leave room for user
   * expressions. */
  if (mi.user || mi.softcap)
    v->tile_n = d == 64 ? 96 : d == 128 ? 128 : d == 192 ? 80 : 64;
  /* A window's tiles cross its left edge as well as the diagonal: with 128
   * keys less of them is masked work (window 1024, causal, S = 4096 on the
   * H200: 259 us against 287 with 176). */
  if (d == 128 && left_window(v->mods))
    v->tile_n = v->tile_n > 128 ? 128 : v->tile_n;
  /* One bias table read per score (its index uses the key): at head dim
   * 128, 96-key tiles (relative bias, causal, (4, 16, 4096, 128) bf16 on
   * the H200: 741 us against 848 with 128; 80 keys 767) -- unless it reads
   * at a distance, bias(h, q - kv + X), at a row pointer and constant
   * offsets (templates/mods.lua's dg; not in checked mode): then 128 keys, as other
   * expressions (a prototype of it on the H200: 541 us at 128 keys, 593
   * at 96, 590 at 176). */
  int reads = mi.reads;
  int distance = mi.distance_reads && !mi.checked;
  if (d == 128 && reads == 1 && mi.score_reads == 1 && !distance && !mi.blocks)
    v->tile_n = 96;
  /* At head dim 64 such a read spills at 96 keys and at 128 for some
   * forms and types (4-184 bytes: kv - q in f32, q - kv in bf16), none at
   * 80. */
  if (d == 64 && reads == 1 && distance)
    v->tile_n = 80;
  /* Reads of tensor parameters per element hold their loads in flight:
   * two or more (a bias table with document ids: three) spill 16-336
   * bytes above these tiles. */
  if (reads >= 2)
    v->tile_n = d == 256 ? 48 : 64;
  /* A block mask's blocks hold whole tiles: two consumer warpgroups (128
   * rows) at head dim 64, and the largest power of two up to the tile
   * above that divides its key blocks. */
  if (mi.blocks) {
    if (mi.block_q % v->tile_m) {
      v->tile_m = 128;
      v->warps = 12;
    }
    v->tile_n = fit_block(v->tile_n, mi.block_kv);
  }
}

void fj__heuristic_sync(const fj_ctx *ctx, const fj_problem *p, fj_variant *v)
{
  fj_mods_info mi;
  fj__mods_info(p->mods, &mi);
  fj_variant_default(v, p->head_dim, p->dtype, p->causal);
  v->kv_dtype = p->kv_dtype == p->dtype ? 0 : p->kv_dtype;
  v->head_dim_v = fj__problem_dv(p) == p->head_dim ? 0 : fj__problem_dv(p);
  v->o_dtype = fj__o_dtype(p) == fj__default_o_dtype(p->dtype) ? 0 : fj__o_dtype(p);
  v->varlen = fj__problem_varlen(p);
  v->paged = fj__problem_paged(p);
  v->mods = mi.on ? p->mods : NULL;
  /* Without mma.sync m16n8k16 (sm_75) the WMMA family's defaults stand,
   * with synchronous loads where cp.async is missing too, and FP8 K/V
   * dequantised as they load (the mma family's FP8 ring is its own:
   * tile_fp8.cuh). */
  if (!fj__arch_has(ctx, FJ_ARCH_MMA_SYNC)) {
    if (!fj__arch_has(ctx, FJ_ARCH_CP_ASYNC) || v->kv_dtype == FJ_E4M3)
      v->stages = 1;
    fit_smem(ctx, v);
    return;
  }
  if (p->head_dim > 256 || fj__problem_dv(p) != p->head_dim) {
    wide_choice(ctx, p, v);
    return;
  }
  mma_choice(ctx, p, v);
  if (fj__decode_rows(p)) {
    decode_choice(ctx, p, v);
  } else if (v->varlen) {
    /* Varlen blocks keep their sequence's lengths and first rows live:
     * with two 16-row slices a warp ptxas spills 12-44 bytes at head
     * dims 64-256 (sm_90), with one it does not; above 192, 32-key
     * tiles.  At head dim 160 64-key tiles spill 8 bytes without a mask
     * (sm_80, sm_87, sm_90 and sm_90a): 32-key tiles, but on sm_90a,
     * where the 64-key tiles measured 2% faster all the same (the H100,
     * docs/PERF.md: 422-424 us against 431-433). */
    int d = mma_dim(v->head_dim);
    v->warps = v->tile_m / 16;
    if (d > 192 || (d == 160 && !v->causal && !measured(ctx)))
      v->tile_n = 32;
    /* Paged rows find their pages: with the causal third stage at head
     * dim 64 ptxas for Blackwell (sm_100) spills 4 bytes; two stages do
     * not. */
    if (v->paged && v->stages == 3 && ctx->sm >= 100)
      v->stages = 2;
  } else if (mi.user || mi.softcap) {
    /* A score or mask function per element: with two 16-row slices a warp
     * ptxas spills 24-120 bytes at head dim 128 (sm_80); with one, none. */
    int d = mma_dim(v->head_dim);
    v->warps = v->tile_m / 16;
    /* A bias table with a document mask still spills 12-20 bytes at head
     * dims 96-128 with 64-key tiles, the softcap 16 at head dim 160, ALiBi
     * 52 at head dim 64 with 128 (sm_80). */
    if (d <= 64 && v->tile_n > 64)
      v->tile_n = 64;
    else if (d >= (mi.user ? 96 : 160))
      v->tile_n = 32;
  }
  /* A block mask's blocks hold whole tiles (64-row tiles for 64-row
   * blocks: 16-row warps keep 4 warps). */
  if (mi.blocks) {
    if (mi.block_q % v->tile_m) {
      v->tile_m = 64;
      v->warps = 4;
    }
    v->tile_n = fit_block(v->tile_n, mi.block_kv);
  }
  fit_smem(ctx, v);
}

void fj__heuristic(const fj_ctx *ctx, const fj_problem *p, fj_variant *v)
{
  fj__heuristic_sync(ctx, p, v);
  fj_mods_info mi;
  fj__mods_info(p->mods, &mi);
  /* Problems too small to give every multiprocessor a 128-row block keep
   * the mma family's 64-row blocks; decode shapes and asked-for splits
   * keep its packing and split-KV; block masks of 64-row blocks its
   * 64-row tiles. */
  /* FP8 attention runs on the wgmma family alone. */
  /* Split head dims (head_dim_v) run on wgmma whatever the shape -- but
   * for asked-for splits, which the mma family takes (split head dims
   * with V read from K's rows).  A head dim that is not a multiple of 16
   * follows the rule of the next one up (the mma family pads it to 16
   * columns, the wgmma family to its panels): decodes keep the mma
   * family's packing and split-KV, problems too small for 128-row blocks
   * its 64-row blocks (at (1,8,512,40) 64 blocks, where wgmma's 192-row
   * blocks made 16 of 132). */
  int wgmma = wgmma_fits(ctx, p);
  if (p->dtype == FJ_E4M3 ||
      (wgmma && p->splits < 2 && fj__problem_dv(p) != p->head_dim) ||
      (wgmma && !few_blocks(ctx, p) && !fj__decode_rows(p) && p->splits < 2 &&
       mi.block_q != 64))
    wgmma_choice(v, p);
}

/* Whether the heuristic gives a decode problem a third stage: decode_choice
 * decides it from the batch and the split rule, which the pick's key does
 * not hold otherwise. */
static int decode_stages3(const fj_ctx *ctx, const fj_problem *p)
{
  if (!fj__decode_rows(p))
    return 0;
  fj_variant v;
  fj__heuristic_sync(ctx, p, &v);
  return v.stages == 3;
}

/* Whether decode_choice may give p one 16-row tile whose warps split the
 * keys (its packed rows up to 16): seq_q 2 and 3 at GQA 8 share a
 * sequence bucket, not that choice. */
static int decode_ks(const fj_problem *p)
{
  return fj__decode_rows(p) &&
         (long)p->seq_q * (p->heads_q / p->heads_kv) <= 16;
}

int fj__plan_wgmma_fits(const fj_ctx *ctx, const fj_problem *p)
{
  return wgmma_fits(ctx, p);
}

int fj__plan_class(const fj_ctx *ctx, const fj_problem *p)
{
  fj_mods_info mi;
  fj__mods_info_reads(p->mods, &mi);
  return few_blocks(ctx, p) | wgmma_fits(ctx, p) << 1 |
         fj__decode_rows(p) << 2 | (p->splits >= 2) << 10 |
         fj__problem_varlen(p) << 11 | fj__problem_paged(p) << 12 |
         mi.on << 13 | mi.user << 14 | mi.softcap << 15 | (mi.reads >= 2) << 16 |
         mi.block_q / 64 << 17 | mi.block_kv / 64 << 20 |
         left_window(p->mods) << 23 | decode_stages3(ctx, p) << 24 |
         short_keys(p) << 25 | decode_ks(p) << 27;
}

/* ---- splits, grids, workspace ------------------------------------------------------ */

size_t fj__plan_vt_bytes(const fj_problem *p, const fj_variant *v)
{
  if (v->dtype != FJ_E4M3)
    return 0;
  return (size_t)p->batch * (size_t)p->heads_kv * (size_t)p->head_dim *
         (size_t)((p->seq_kv + 127) / 128 * 128);
}

/* Blocks of a kernel one multiprocessor holds: by shared memory (each
 * block takes 1 KB more, which the driver reserves), threads and
 * registers (the architecture's table, counting 256 a thread: launch
 * bounds of one block let ptxas take them all). */
static int blocks_per_sm(const fj_ctx *ctx, unsigned threads, unsigned smem)
{
  const fj_arch_info *a = fj__arch(ctx);
  int warps = (int)(threads + 31) / 32;
  int by_smem = fj__smem_sm(ctx) / ((int)smem + 1024);
  int by_threads = a->threads_sm / (int)threads;
  int by_regs = a->regs_sm / (warps * 32 * 256);
  int n = by_smem < by_threads ? by_smem : by_threads;
  n = n < by_regs ? n : by_regs;
  return n < 1 ? 1 : n;
}

int fj__combine_warps(int splits)
{
  return splits <= 4 ? 1 : splits <= 8 ? 2 : 4;
}

uint64_t fj__combine_blocks(uint64_t rows, int splits)
{
  uint64_t per_block = 4 / (uint64_t)fj__combine_warps(splits);
  return (rows + per_block - 1) / per_block;
}

/* Slices pay only where the row blocks leave multiprocessors idle
 * (bench/mla_compare.py on an H200: MLA's decode of 16 rows at 128
 * splits, 16 blocks, 6% faster in slices of 128; batched decodes of 1024
 * rows at 2 splits, 256 blocks, 2-3.5% slower): where the row blocks
 * fill the GPU, a block keeps its rows' whole O, the kernel as it was
 * before slices. */
int fj__combine_cols(const fj_ctx *ctx, uint64_t rows, int splits,
                     int head_dim_v)
{
  if (head_dim_v > 128 &&
      fj__combine_blocks(rows, splits) < (uint64_t)fj__sm_count(ctx))
    return 128;
  return head_dim_v;
}

int fj__combine_slices(int head_dim_v, int cols)
{
  return (head_dim_v + cols - 1) / cols;
}

/* FlashAttention's rule: no split when the grid fills 80% of a wave or
 * the keys are 4 tiles or fewer; long walks one block a multiprocessor
 * (below); otherwise, of the counts up to 128 and the key tiles that
 * change the tiles per split, the smallest whose waves are at least 85%
 * as full as the best count's. */
static int split_search(long blocks, int sms, int slots, int tiles_kv)
{
  if (blocks >= 0.8 * slots || tiles_kv <= 4)
    return 1;
  /* Long walks one block a multiprocessor where that fills 90% of them:
   * the blocks then end together, where at two a multiprocessor those
   * that share one end last.  (1, 32/8, 1/32768, 128) bf16: 16 splits
   * 50.7 us against the 29 below's 52.7 on an H100, 38.8 against 40.3
   * on the H200 (graph replays, bench/decode_probe.py --long); at 4096
   * keys 16 and 32 tie (12.0, 12.2 us).  Walks under 32 key tiles a
   * block (measured at 4 and 32 to 64) keep the count below. */
  long one = sms / blocks < 128 ? sms / blocks : 128;
  if (one > 1 && blocks * one >= 0.9 * sms && tiles_kv / one >= 32)
    return (int)one;
  int top = tiles_kv < 128 ? tiles_kv : 128;
  double eff[129] = {0}, best = 0;
  for (int s = 1; s <= top; s++) {
    int eligible = s == 1 || (tiles_kv + s - 1) / s != (tiles_kv + s - 2) / (s - 1);
    if (!eligible)
      continue;
    double waves = (double)blocks * s / slots;
    eff[s] = waves / ceil(waves);
    best = eff[s] > best ? eff[s] : best;
  }
  for (int s = 1; s <= top; s++)
    if (eff[s] >= 0.85 * best)
      return s;
  return 1;
}

/* split_search, which loops over up to 128 counts, is a pure function
 * of its three numbers, and every call of one shape asks it the same:
 * a thread keeps its last answer (a decode call's host time was a third
 * this loop). */
static int split_rule(long blocks, int sms, int slots, int tiles_kv)
{
  static _Thread_local struct {
    long blocks;
    int sms, slots, tiles_kv, splits;
  } last;
  if (last.splits && last.blocks == blocks && last.sms == sms &&
      last.slots == slots && last.tiles_kv == tiles_kv)
    return last.splits;
  int splits = split_search(blocks, sms, slots, tiles_kv);
  last.blocks = blocks;
  last.sms = sms;
  last.slots = slots;
  last.tiles_kv = tiles_kv;
  last.splits = splits;
  return splits;
}

static fj_status fill(const fj_ctx *ctx, const fj_problem *p,
                      const fj_variant *v, const fj_kmeta *m, fj_plan *plan);

fj_status fj__plan_fill(const fj_ctx *ctx, const fj_problem *p,
                        const fj_variant *v, const fj_kmeta *m,
                        fj_plan *plan)
{
  fj_status st = fill(ctx, p, v, m, plan);
  /* The score expression's relative table last (rel_table.h), 16-byte
   * aligned: fj__plan_rt_offset. */
  size_t rt = st == FJ_OK ? fj__rt_bytes(p) : 0;
  if (rt)
    plan->workspace_bytes = fj__plan_rt_offset(plan->workspace_bytes) + rt;
  return st;
}

size_t fj__plan_rt_offset(size_t before)
{
  return (before + 15) / 16 * 16;
}

static fj_status fill(const fj_ctx *ctx, const fj_problem *p,
                      const fj_variant *v, const fj_kmeta *m, fj_plan *plan)
{
  /* The kernel's metadata may come from a cache directory or a pack,
   * not from this process's render: what divides is checked here. */
  if (m->rows_per_block < 1)
    return fj__fail(ctx, FJ_ERR_TEMPLATE,
                    "%s says it covers %d query rows a block "
                    "(meta.rows_per_block): an attention kernel covers "
                    "1..65536", m->symbol, m->rows_per_block);
  int group = p->heads_q / p->heads_kv;
  unsigned per = (unsigned)m->rows_per_block;
  /* Packed rows (seq_q x group) are counted in 32-bit ints by the host
   * and the kernels (m0 + tile rows included): at most INT32_MAX - 65536
   * (seq_q up to 2^30 times a group up to 65535 would wrap). */
  int64_t rows64 = v->pack_gqa ? (int64_t)p->seq_q * group : p->seq_q;
  if (rows64 > INT32_MAX - 65536)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "pack_gqa with seq_q %d x group %d = %lld packed rows: "
                    "the kernels count at most %d; use pack_gqa 0",
                    p->seq_q, group, (long long)rows64, INT32_MAX - 65536);
  int rows = (int)rows64;
  uint64_t tiles_m = ((uint64_t)rows + per - 1) / per;
  plan->variant = *v;
  plan->rows = rows;
  plan->threads = (unsigned)m->threads;
  plan->smem_bytes = (unsigned)m->smem_bytes;
  plan->sm_count = fj__sm_count(ctx);
  plan->blocks_per_sm = blocks_per_sm(ctx, plan->threads, plan->smem_bytes);
  plan->splits = 1;
  memset(plan->grid, 0, sizeof plan->grid);
  memset(plan->combine_grid, 0, sizeof plan->combine_grid);
  plan->combine_threads = 0;
  plan->combine_cols = 0;
  plan->workspace_bytes = 0;
  if (p->splits > 1 && !v->split_kv)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "splits %d: the variant has no split-KV (split_kv 0); "
                    "use splits 0 or 1, or a split_kv variant",
                    p->splits);
  if (m->persistent) {
    /* The kernel walks the row tiles of each head in pairs (block.cuh);
     * a dynamic walk (2) claims them one by one from a counter in the
     * workspace (zeroed before each launch), and hands each block's item
     * from its producer to its consumers through the words after it. */
    uint64_t units = m->persistent == 2 ? tiles_m : (tiles_m + 1) / 2;
    uint64_t total = units * (uint64_t)p->heads_q * (uint64_t)p->batch;
    /* The kernels count units in ints and each block steps (or claims)
     * once past the last: total + the grid's blocks must fit. */
    if (total + (uint64_t)plan->sm_count > INT32_MAX)
      return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                      "%llu %s of %u rows: a persistent kernel counts at "
                      "most %d",
                      (unsigned long long)total,
                      m->persistent == 2 ? "work tiles" : "pairs of work tiles",
                      per, INT32_MAX - plan->sm_count);
    uint64_t sms = (uint64_t)plan->sm_count;
    plan->grid[0] = (unsigned)(total < sms ? total : sms);
    plan->grid[1] = plan->grid[2] = 1;
    /* The counter, then each block's record of its current item (16
     * bytes: the item and its block-mask list's counts). */
    plan->workspace_bytes = m->persistent == 2 ? 16 + 16 * (size_t)plan->grid[0] : 0;
    size_t vt = fj__plan_vt_bytes(p, v);
    /* FP8 attention's V^T pass: one grid row per (batch, KV head), its z. */
    if (vt && (int64_t)p->batch * p->heads_kv > 65535)
      return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                      "batch %d x heads_kv %d = %lld with dtype e4m3 is not "
                      "implemented: FP8 attention's V^T pass takes at most "
                      "65535 (batch, KV head)s",
                      p->batch, p->heads_kv,
                      (long long)p->batch * p->heads_kv);
    plan->workspace_bytes += vt;
    return FJ_OK;
  }
  long heads = v->pack_gqa ? p->heads_kv : p->heads_q;
  if (v->split_kv) {
    int tiles_kv = (p->seq_kv + v->tile_n - 1) / v->tile_n;
    long blocks = (long)tiles_m * heads * p->batch;
    plan->splits = p->splits >= 1 ? p->splits
                                  : split_rule(blocks, plan->sm_count,
                                               plan->sm_count * plan->blocks_per_sm,
                                               tiles_kv);
  }
  uint64_t gx = tiles_m * (uint64_t)plan->splits;
  if (gx > INT32_MAX)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "%llu row tiles of %u rows x %d splits: a grid counts "
                    "at most %d blocks across",
                    (unsigned long long)tiles_m, per, plan->splits, INT32_MAX);
  plan->grid[0] = (unsigned)gx;
  plan->grid[1] = (unsigned)heads;
  plan->grid[2] = (unsigned)p->batch;
  if (!v->split_kv)
    return FJ_OK;
  /* The combine: 4 / fj__combine_warps rows a block of 128 threads, y
   * the slices of their columns (combine.cu): 1, or at most 5 slices of
   * 128 of FJ_HEAD_DIM_MAX columns, far inside a grid's 65535. */
  uint64_t all = (uint64_t)p->batch * (uint64_t)p->heads_q * (uint64_t)p->seq_q;
  uint64_t per_block = 4 / (uint64_t)fj__combine_warps(plan->splits);
  if (fj__combine_blocks(all, plan->splits) > INT32_MAX)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "%llu rows: the split-KV combine of %d splits takes at "
                    "most %llu", (unsigned long long)all, plan->splits,
                    (unsigned long long)INT32_MAX * per_block);
  int dv = fj__head_dim_v(v);
  plan->combine_cols = fj__combine_cols(ctx, all, plan->splits, dv);
  plan->combine_grid[0] = (unsigned)fj__combine_blocks(all, plan->splits);
  plan->combine_grid[1] = (unsigned)fj__combine_slices(dv, plan->combine_cols);
  plan->combine_grid[2] = 1;
  plan->combine_threads = 128;
  uint64_t floats;
  if (__builtin_mul_overflow(all * (uint64_t)plan->splits,
                             (uint64_t)fj__problem_dv(p) + 1, &floats) ||
      floats > SIZE_MAX / sizeof(float))
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "splits %d over %llu rows need a workspace past what "
                    "64-bit sizes count",
                    plan->splits, (unsigned long long)all);
  plan->workspace_bytes = (size_t)floats * sizeof(float);
  return FJ_OK;
}
