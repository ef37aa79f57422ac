/*
 * variant.c -- the specialisation space: names, defaults, the rules each
 * axis must obey (with messages that name the axis, the value and the
 * limit), and the template parameters of a variant.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "axes.h"
#include "ctx.h"
#include "kernel.h"
#include "kparams.h"
#include "layout.h"
#include "problem.h"
#include "template.h"
#include "util.h"
#include "variant.h"

/* ---- names ---------------------------------------------------------------------
 * The enums' names are axes.c's; these are the variant's own. */

static const char *causal_short(fj_causal c)
{
  return c == FJ_CAUSAL_TOP_LEFT ? "tl" : c == FJ_CAUSAL_BOTTOM_RIGHT ? "br"
                                                                      : "nc";
}

fj_dtype fj__kv_dtype(const fj_variant *v)
{
  return v->kv_dtype ? v->kv_dtype : v->dtype;
}

int fj__head_dim_v(const fj_variant *v)
{
  return v->head_dim_v ? v->head_dim_v : v->head_dim;
}

fj_dtype fj__variant_o_dtype(const fj_variant *v)
{
  return v->o_dtype ? v->o_dtype : fj__default_o_dtype(v->dtype);
}

int fj__fp8_flush(const fj_variant *v)
{
  if (v->fp8_flush)
    return v->fp8_flush;
  /* Every key tile with 128-key tiles up to head dim 128; never with the
   * wider tiles plan.c takes (chosen for speed: at head dim 64 a second
   * accumulator would fit 192 keys; at 128 it does not) and above 128. */
  return v->head_dim <= 128 && v->tile_n <= 128 ? 1 : -1;
}

/* The modifications' part of a name: "_win", "_cap", "_bm" + a block
 * mask's block sizes, "_x" + a hash of the user's expressions and
 * parameters, "_sink", "_chk" (checked mode). */
static void mods_suffix(const fj_mods *m, char *buf, size_t size)
{
  char user[16] = "", blocks[24] = "";
  fj_mods_info mi;
  fj__mods_info(m, &mi);
  if (mi.user)
    snprintf(user, sizeof user, "_x%08x", (unsigned)(fj__mods_hash(m) & 0xffffffffu));
  if (mi.blocks)
    snprintf(blocks, sizeof blocks, "_bm%dx%d", mi.block_q, mi.block_kv);
  snprintf(buf, size, "%s%s%s%s%s%s", mi.window ? "_win" : "",
           mi.softcap ? "_cap" : "", blocks, user, mi.sinks ? "_sink" : "",
           mi.checked ? "_chk" : "");
}

int fj_variant_name(const fj_variant *v, char *buf, size_t size)
{
  char kv[16] = "", mods[64], dv[16] = "", od[16] = "";
  if (!v)
    return -1;
  if (!buf)
    size = 0;  /* snprintf's measuring call: nothing is written */
  if (fj__kv_dtype(v) != v->dtype)
    snprintf(kv, sizeof kv, "_kv%s", fj_dtype_name(fj__kv_dtype(v)));
  else if (v->dtype == FJ_E4M3 && fj__fp8_flush(v) > 0)
    snprintf(kv, sizeof kv, "_fl%d", fj__fp8_flush(v));
  else if (v->dtype == FJ_E4M3)
    snprintf(kv, sizeof kv, "_flnever");
  mods_suffix(v->mods, mods, sizeof mods);
  /* Split head dims name V's and O's after Q's and K's: "_d192_v128". */
  if (fj__head_dim_v(v) != v->head_dim)
    snprintf(dv, sizeof dv, "_v%d", fj__head_dim_v(v));
  /* O's element where it is not the dtype's own: "_oe4m3". */
  if (fj__variant_o_dtype(v) != fj__default_o_dtype(v->dtype))
    snprintf(od, sizeof od, "_o%s", fj_dtype_name(v->o_dtype));
  return snprintf(buf, size, "fj_attn_d%d%s_m%d_n%d_w%d_s%d_%s_%s_%s_%s_%s%s%s%s%s%s%s%s%s",
                  v->head_dim, dv, v->tile_m, v->tile_n, v->warps, v->stages,
                  fj_swizzle_name(v->swizzle), fj_softmax_name(v->softmax),
                  fj_mma_name(v->mma), causal_short(v->causal),
                  fj_dtype_name(v->dtype), kv, od, v->pack_gqa ? "_gqa" : "",
                  v->split_kv ? "_split" : "", v->varlen ? "_vl" : "",
                  v->paged ? "_paged" : "", mods, v->table_inside ? "_tin" : "");
}

/* ---- defaults ------------------------------------------------------------------- */

/* The defaults come from sweeps of every tile/warps/stages/swizzle/softmax
 * combination on an H200 (docs/PERF.md): register softmax with a two-stage
 * cp.async ring everywhere; 4 warps over 64 rows for head dims up to 64,
 * 8 warps over 128 rows above, key tiles as large as sm_80's 163 KB of
 * shared memory allows. */
void fj_variant_default(fj_variant *v, int head_dim, fj_dtype dtype,
                        fj_causal causal)
{
  int small = head_dim <= 64;
  if (!v)
    return;
  memset(v, 0, sizeof *v);
  v->head_dim = head_dim;
  v->tile_m = small ? 64 : 128;
  v->tile_n = small ? 128 : head_dim > 192 ? 32 : 64;
  /* bf16 at head_dim 160 with 64-key tiles reaches 255 registers and
   * spills (8 bytes on sm_90, 52 on sm_80); 32-key tiles do not. */
  if (dtype == FJ_BF16 && head_dim == 160)
    v->tile_n = 32;
  v->warps = small ? 4 : 8;
  v->stages = 2;
  v->swizzle = FJ_SWIZZLE_PAD;
  v->softmax = FJ_SOFTMAX_REGS;
  v->mma = FJ_MMA_WMMA;
  v->causal = causal;
  v->dtype = dtype;
  v->kv_dtype = 0;
  /* FP8 attention (Q, K, V e4m3) has one family: its 128 x 128 tiles,
   * two consumer warpgroups. */
  if (dtype == FJ_E4M3) {
    v->mma = FJ_MMA_WGMMA;
    v->swizzle = FJ_SWIZZLE_XOR;
    v->tile_m = 128;
    v->tile_n = 128;
    v->warps = 12;
  } else if (head_dim > 256) {
    /* Above 256 the mma family alone: 16 rows, 4 warps that split each
     * 64-key tile (and V's columns), as the plan's wide_choice. */
    v->mma = FJ_MMA_SYNC;
    v->tile_m = 16;
    v->tile_n = 64;
    v->warps = 4;
  }
}

/* ---- rules ----------------------------------------------------------------------- */

/* Head dims: multiples of 8 (16-byte rows of 16-bit elements) up to 576
 * (V's up to 512).  Each family takes those its instructions cover (the
 * templates' refusals): wgmma any up to 256, padding to 64-column panels;
 * mma's forward any up to the limits, padding to 16 columns (with FP8
 * K/V multiples of 16); wmma multiples of 16 up to 256;
 * the backward any up to 256 (mma padding to 32 columns, wgmma to 64). */
/* Q's and K's head dim up to 576 (MLA's latent rows with their rotary
 * part), V's and O's up to 512; above 256 the mma family alone. */
static int valid_head_dim(int d, int most)
{
  return d >= 8 && d <= most && d % 8 == 0;
}

static fj_status check_range(const fj_ctx *ctx, const char *axis, int value,
                             int lo, int hi, int multiple)
{
  if (value >= lo && value <= hi && value % multiple == 0)
    return FJ_OK;
  if (multiple == 1)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG, "%s %d is invalid: must be in %d..%d",
                    axis, value, lo, hi);
  return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "%s %d is invalid: must be a multiple of %d in %d..%d", axis,
                  value, multiple, lo, hi);
}

/* A named axis's value out of its names: "swizzle 9 is invalid: none, pad
 * or xor". */
static fj_status check_named(const fj_ctx *ctx, const fj_axis_info *a, int value)
{
  char allowed[128] = "";
  if (value >= 1 && value <= a->nvalues)
    return FJ_OK;
  for (int i = 1; i <= a->nvalues; i++)
    snprintf(allowed + strlen(allowed), sizeof allowed - strlen(allowed), "%s%s",
             i == 1 ? "" : i == a->nvalues ? " or " : ", ",
             fj_axis_value_name(fj__axis_find(a->name), i));
  return fj__fail(ctx, FJ_ERR_INVALID_ARG, "%s %d is invalid: %s", a->name,
                  value, allowed);
}

/* The switches (the table's, then varlen and paged, which the problem
 * sets), then the named axes, then the element types and the mask. */
static fj_status check_enums(const fj_ctx *ctx, const fj_variant *v)
{
  fj_axis_info a;
  for (int i = 0; i < fj_axis_count(); i++)
    if (fj_axis_get(i, &a) == FJ_OK && a.kind == FJ_AXIS_SWITCH &&
        fj__axis_of(v, i) != 0 && fj__axis_of(v, i) != 1)
      return fj__fail(ctx, FJ_ERR_INVALID_ARG, "%s %d is invalid: 0 or 1",
                      a.name, fj__axis_of(v, i));
  const struct { const char *name; int value; } flags[] = {
      {"varlen", v->varlen}, {"paged", v->paged}};
  for (size_t i = 0; i < FJ_ARRAY_LEN(flags); i++)
    if (flags[i].value != 0 && flags[i].value != 1)
      return fj__fail(ctx, FJ_ERR_INVALID_ARG, "%s %d is invalid: 0 or 1",
                      flags[i].name, flags[i].value);
  for (int i = 0; i < fj_axis_count(); i++) {
    fj_status st = fj_axis_get(i, &a) == FJ_OK && a.kind == FJ_AXIS_NAMED
                       ? check_named(ctx, &a, fj__axis_of(v, i)) : FJ_OK;
    if (st != FJ_OK)
      return st;
  }
  return fj__check_types(ctx, v->dtype, fj__kv_dtype(v), v->causal);
}

static fj_status check_axes(const fj_ctx *ctx, const fj_variant *v)
{
  if (!valid_head_dim(v->head_dim, FJ_HEAD_DIM_MAX))
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "head_dim %d is invalid: a multiple of 8 from 8 to %d",
                    v->head_dim, FJ_HEAD_DIM_MAX);
  if (v->head_dim_v != 0 && !valid_head_dim(v->head_dim_v, FJ_HEAD_DIM_V_MAX))
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "head_dim_v %d is invalid: a multiple of 8 from 8 to %d, "
                    "or 0 (head_dim)",
                    v->head_dim_v, FJ_HEAD_DIM_V_MAX);
  fj_status st = check_range(ctx, "tile_m", v->tile_m, 16, 256, 16);
  if (st == FJ_OK)
    st = check_range(ctx, "tile_n", v->tile_n, 16, 256, 16);
  /* 1..16 are warps a block may have (those not generated are refused
   * as not implemented, below); the message names those that are. */
  if (st == FJ_OK && (v->warps < 1 || v->warps > 16))
    st = fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "warps %d is invalid: 4 or 8 (wmma, mma), or 8, 12 or 16 "
                  "(wgmma)",
                  v->warps);
  if (st == FJ_OK)
    st = check_range(ctx, "stages", v->stages, 1, 4, 1);
  if (st == FJ_OK && v->fp8_flush != 0 && v->dtype != FJ_E4M3)
    st = fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "fp8_flush %d is invalid with dtype %s: it is the FP8 "
                  "accumulation's (dtype e4m3); 0 otherwise",
                  v->fp8_flush, fj_dtype_name(v->dtype));
  if (st == FJ_OK && (v->fp8_flush < -1 || v->fp8_flush > 16))
    st = fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "fp8_flush %d is invalid: 1..16 key tiles, -1 (never) or 0 "
                  "(the library's default)",
                  v->fp8_flush);
  if (st == FJ_OK)
    st = fj__check_o_dtype(ctx, v->dtype, v->o_dtype);
  if (st == FJ_OK && (v->table_inside < 0 || v->table_inside > 1))
    st = fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "table_inside %d is invalid: 0 or 1 (set from the problem)",
                  v->table_inside);
  if (st == FJ_OK && v->table_inside &&
      (!v->mods || !v->mods->score || !v->mods->score[0] ||
       (v->mma != FJ_MMA_WGMMA && v->mma != FJ_MMA_SYNC)))
    st = fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "table_inside 1 is invalid here: it is for a score "
                  "expression's distance table on mma wgmma or mma (this "
                  "variant: %s, mma %s)",
                  v->mods && v->mods->score && v->mods->score[0]
                      ? "a score expression"
                      : "no score expression",
                  fj_mma_name(v->mma));
  return st == FJ_OK ? check_enums(ctx, v) : st;
}

/* The wgmma family: sm_90a only; a producer warpgroup and 1-3 consumer
 * warpgroups; tiles in the 128-byte swizzle TMA writes.  The template adds
 * the rules that depend on tiles and resources. */
static fj_status check_wgmma(const fj_ctx *ctx, const fj_variant *v)
{
  if (!fj__arch_has(ctx, FJ_ARCH_WGMMA))
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "mma wgmma (wgmma.mma_async, TMA) needs sm_90a; the "
                    "target is %s",
                    ctx->arch);
  if (v->warps != 8 && v->warps != 12 && v->warps != 16)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "warps %d is not implemented for mma wgmma: 8, 12 or 16 "
                    "(a producer warpgroup and 1-3 consumer warpgroups)",
                    v->warps);
  if (fj__kv_dtype(v) == FJ_E4M3 && v->dtype != FJ_E4M3)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "kv_dtype e4m3 with dtype %s is not implemented for mma "
                    "wgmma: use mma mma or wmma (or dtype e4m3: Q, K and V in "
                    "FP8)",
                    fj_dtype_name(v->dtype));
  return FJ_OK;
}

/* Split head dims (head_dim_v != head_dim): the wgmma family's forward
 * in f16 or bf16, one query head a block, one kernel (no split-KV), on
 * dense or varlen K/V; the mma family's with head_dim_v below head_dim,
 * V read as K's first columns (attention_mma.cu's VK: MLA), 16-bit; the
 * rest has one head dim throughout.  Head dims above 256: the mma
 * family's. */
static fj_status check_split_dims(const fj_ctx *ctx, const fj_variant *v)
{
  int dv = fj__head_dim_v(v);
  int fp8 = v->dtype == FJ_E4M3 || fj__kv_dtype(v) == FJ_E4M3;
  if ((v->head_dim > 256 || dv > 256) && v->mma != FJ_MMA_SYNC) {
    char with[32] = "";
    if (dv != v->head_dim)
      snprintf(with, sizeof with, " with head_dim_v %d", dv);
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "head_dim %d%s is not implemented for mma %s: head dims "
                    "above 256 run on mma mma (sm_80 and newer)",
                    v->head_dim, with, fj_mma_name(v->mma));
  }
  /* Split head dims whose V is above 256 columns and padded (504 under
   * 576: the warps split V's columns, padded to 16 a warp) gave wrong
   * results on the H200 (gpu_wide_heads, gpu_mla_paged, 2026-12-05);
   * one head dim padded above 256 (264, 272, 520) and 576/512 are right. */
  if (dv != v->head_dim && dv > 256 && dv % 16 != 0)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "head_dim_v %d with head_dim %d is not implemented: above "
                    "256 a split head_dim_v must be a multiple of 16 (512 "
                    "for MLA's 576)",
                    dv, v->head_dim);
  if (dv != v->head_dim && v->mma == FJ_MMA_SYNC) {
    if (fp8)
      return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                      "head_dim_v %d with head_dim %d is not implemented for "
                      "FP8 (e4m3) on mma mma: 16-bit K/V",
                      dv, v->head_dim);
    if (dv > v->head_dim)
      return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                      "head_dim_v %d with head_dim %d is not implemented for "
                      "mma mma: it reads V as the first head_dim_v columns "
                      "of K's rows (MLA's latent cache, v = k), so head_dim_v "
                      "is at most head_dim; mma wgmma (sm_90a) takes more",
                      dv, v->head_dim);
    return FJ_OK;
  }
  const char *what = fp8                      ? "FP8 (e4m3)"
                     : v->paged               ? "paged K/V"
                     : v->mma != FJ_MMA_WGMMA ? fj_mma_name(v->mma)
                     : v->pack_gqa            ? "pack_gqa"
                     : v->split_kv            ? "split_kv"
                                              : NULL;
  if (dv == v->head_dim || !what)
    return FJ_OK;
  return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                  "head_dim_v %d with head_dim %d is not implemented for %s%s: "
                  "split head dims run on mma wgmma (sm_90a) with dtype f16 "
                  "or bf16, one kernel per query head (no pack_gqa, split_kv "
                  "or paged K/V), or on mma mma with V as K's first columns",
                  dv, v->head_dim,
                  !fp8 && !v->paged && v->mma != FJ_MMA_WGMMA ? "mma " : "",
                  what);
}

/* Axis values that are valid but not generated (yet).  The templates add
 * the rules that depend on combinations (refuse() in templates/). */
static fj_status check_implemented(const fj_ctx *ctx, const fj_variant *v)
{
  fj_status sd = check_split_dims(ctx, v);
  if (sd != FJ_OK)
    return sd;
  /* The wgmma family takes varlen (packed sequences), not the others.  A
   * paged problem is varlen too: named by what it is, paged. */
  const char *axis = v->pack_gqa ? "pack_gqa" : v->split_kv ? "split_kv"
                     : v->paged ? "paged"
                     : v->varlen && v->mma != FJ_MMA_WGMMA ? "varlen" : NULL;
  fj_mods_info mi;
  fj__mods_info(v->mods, &mi);
  if (mi.sinks && v->mma == FJ_MMA_WMMA)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "mods.sinks (attention sinks) are implemented for mma mma "
                    "and mma wgmma; this variant is mma wmma");
  if (mi.on && v->mma == FJ_MMA_WMMA)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "mods (window, softcap, score and mask expressions) are "
                    "implemented for mma mma and mma wgmma; this variant is "
                    "mma wmma");
  if (axis && v->mma != FJ_MMA_SYNC)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "%s is implemented for mma mma only (the mma.sync "
                    "family%s); this variant is mma %s%s%s%s",
                    axis, !strcmp(axis, "varlen") ? "; varlen for wgmma too" : "",
                    fj_mma_name(v->mma),
                    fj__arch_has(ctx, FJ_ARCH_MMA_SYNC) ? "" : "; the target ",
                    fj__arch_has(ctx, FJ_ARCH_MMA_SYNC) ? "" : ctx->arch,
                    fj__arch_has(ctx, FJ_ARCH_MMA_SYNC)
                        ? ""
                        : " has no mma.sync m16n8k16 (sm_80 and newer), so "
                          "its only family is wmma");
  if (v->dtype == FJ_E4M3 && v->mma != FJ_MMA_WGMMA)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "dtype e4m3 (Q, K and V in FP8) is implemented for mma "
                    "wgmma only (sm_90a); this variant is mma %s (kv_dtype "
                    "e4m3 with f16 or bf16 Q takes mma mma and wmma)",
                    fj_mma_name(v->mma));
  if (v->mma == FJ_MMA_WGMMA)
    return check_wgmma(ctx, v);
  if (v->mma == FJ_MMA_SYNC && !fj__arch_has(ctx, FJ_ARCH_MMA_SYNC))
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "mma mma (mma.sync m16n8k16) needs sm_80 or newer; the "
                    "target is %s",
                    ctx->arch);
  /* Two warps: the mma family's wide heads (V above 256 columns), whose
   * warps split V's columns, where four do not fit the shared memory. */
  int wide = v->mma == FJ_MMA_SYNC && fj__head_dim_v(v) > 256;
  if (v->warps != 4 && v->warps != 8 && !(wide && v->warps == 2))
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "warps %d is not implemented: 4 or 8%s", v->warps,
                    wide ? " (or 2 where head_dim_v is above 256)" : "");
  if (v->dtype == FJ_BF16 && !fj__arch_has(ctx, FJ_ARCH_BF16))
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "dtype bf16 needs sm_80 or newer; the target is %s",
                    ctx->arch);
  return FJ_OK;
}

fj_status fj__variant_validate(const fj_ctx *ctx, const fj_variant *v)
{
  fj_status st = check_axes(ctx, v);
  if (st == FJ_OK)
    st = fj__mods_check(ctx, v->mods);
  return st == FJ_OK ? check_implemented(ctx, v) : st;
}

static int aligned128(int bytes)
{
  return (bytes + 127) / 128 * 128;
}

static int round_up(int x, int m)
{
  return (x + m - 1) / m * m;
}

int fj__mma_tile_cols(const fj_variant *v)
{
  int dv = fj__head_dim_v(v);
  int d = round_up(v->head_dim, 16);
  dv = round_up(dv, dv > 256 && v->warps > 0 ? 16 * v->warps : 16);
  return d > dv ? d : dv;
}

/* The mma family's 16-row tiles whose warps split the keys, over FP8 K/V
 * on the pipelined cp.async ring (attention_mma.cu's KS, PIPE and REGS):
 * the products read the FP8 rings themselves, with no 16-bit tiles --
 * where the probed B tables are the PTX ISA's, which the template checks
 * and this assumes (elsewhere the template's plan differs from this one
 * and the launch takes the template's). */
static int fp8_regs(const fj_variant *v)
{
  int dvp = round_up(fj__head_dim_v(v), 16);
  int warps = v->warps > 0 ? v->warps : 1;
  int s_regs = v->tile_n / warps / 16 * 8;
  return v->mma == FJ_MMA_SYNC && v->tile_m == 16 && warps > 1 &&
         fj__head_dim_v(v) == v->head_dim &&  /* the template's gate */
         dvp <= 256 && dvp / 2 + 2 * s_regs + 40 <= 240;
}

int fj__variant_tiles_smem(const fj_variant *v)
{
  int cols = v->mma == FJ_MMA_SYNC ? fj__mma_tile_cols(v) : v->head_dim;
  int ld = cols + (v->swizzle == FJ_SWIZZLE_PAD ? 8 : 0);
  /* The mma family's split head dims read V from K's tiles (VK); above
   * 256 columns of V its warps trade row maxima and P (CS). */
  int dv = fj__head_dim_v(v);
  if (v->mma == FJ_MMA_SYNC && (dv != v->head_dim || dv > 256)) {
    int kv = aligned128(v->stages * v->tile_n * ld * 2);
    int rows = v->tile_m / 16;
    /* (2: the row classes of an mma accumulator, lut.lua's) */
    int cs = dv > 256 ? aligned128(rows * v->warps * 2 * 32 * 4) +
                            aligned128(rows * (v->tile_n / 16) * 32 * 16)
                      : 0;
    return aligned128(v->tile_m * ld * 2) + kv + (dv != v->head_dim ? 0 : kv) + cs;
  }
  int elem = 2;  /* e4m3 K/V reach the products in Q's type */
  int q = aligned128(v->tile_m * ld * elem);
  /* FP8 K/V on the cp.async ring (tile_fp8.cuh): FP8 rings of the stages,
   * beside two 16-bit tiles of K and one of V unless the products read
   * the rings (fp8_regs); under bf16 queries a float a warp (Q's largest
   * magnitude: tile_fp8.cuh's q_to_f16). */
  if (fj__kv_dtype(v) == FJ_E4M3 && v->dtype != FJ_E4M3 && v->stages > 1) {
    int rings = 2 * aligned128(v->stages * v->tile_n * v->head_dim);
    int qx = v->dtype == FJ_BF16 ? aligned128(v->warps * 4) : 0;
    if (fp8_regs(v))
      return q + rings + qx;
    return q + aligned128(2 * v->tile_n * ld * elem) +
           aligned128(v->tile_n * ld * elem) + rings + qx;
  }
  return q + 2 * aligned128(v->stages * v->tile_n * ld * elem);
}

/* ---- template parameters ------------------------------------------------------------ */

static const char *template_of(const fj_variant *v)
{
  return v->mma == FJ_MMA_WGMMA  ? "attention_wgmma.cu"
         : v->mma == FJ_MMA_SYNC ? "attention_mma.cu"
                                 : "attention_wmma.cu";
}

/* The fragment kinds a variant's family and element type use: how many
 * (the wgmma family reads B from shared memory through descriptors, which
 * the probe's check products cover, so it has no B tables). */
static int frags_of(const fj_variant *v, fj_frag out[4])
{
  int bf = v->dtype == FJ_BF16;
  if (v->mma == FJ_MMA_WGMMA) {
    int f8 = v->dtype == FJ_E4M3;
    out[0] = f8 ? FJ_FRAG_WGMMA_ACC_E4M3
                : bf ? FJ_FRAG_WGMMA_ACC_BF16 : FJ_FRAG_WGMMA_ACC_F16;
    out[1] = f8 ? FJ_FRAG_WGMMA_A8 : FJ_FRAG_WGMMA_A;
    return 2;
  }
  if (v->mma == FJ_MMA_SYNC) {
    out[0] = bf ? FJ_FRAG_MMA_ACC_BF16 : FJ_FRAG_MMA_ACC_F16;
    out[1] = FJ_FRAG_MMA_A;
    out[2] = FJ_FRAG_MMA_B_COL;
    out[3] = FJ_FRAG_MMA_B_ROW;
    return 4;
  }
  out[0] = FJ_FRAG_WMMA_ACC_F32;
  out[1] = bf ? FJ_FRAG_WMMA_A_BF16_ROW : FJ_FRAG_WMMA_A_F16_ROW;
  out[2] = bf ? FJ_FRAG_WMMA_B_BF16_COL : FJ_FRAG_WMMA_B_F16_COL;
  out[3] = bf ? FJ_FRAG_WMMA_B_BF16_ROW : FJ_FRAG_WMMA_B_F16_ROW;
  return 4;
}

static void add(fj_vparams *o, const char *key, fj_param_type type,
                long long i, const char *s, const fj_lut *lut)
{
  fj_param p = {key, type, i, s, lut};
  if (o->n < FJ_ARRAY_LEN(o->p))
    o->p[o->n++] = p;
}

static fj_status add_luts(fj_ctx *ctx, const fj_variant *v, fj_vparams *o)
{
  static const char *const keys[4] = {"lut_acc", "lut_a", "lut_bk", "lut_bv"};
  fj_frag frags[4];
  int n = frags_of(v, frags);
  for (int i = 0; i < n; i++) {
    fj_status st = fj__layout_locked(ctx, frags[i], &o->luts[i]);
    if (st != FJ_OK)
      return st;
    add(o, keys[i], FJ_PARAM_LUT, 0, NULL, &o->luts[i]);
  }
  return FJ_OK;
}

/* The modifications' form: the expressions' text, the parameter list,
 * the built-ins that are on (the values are launch arguments), and the
 * facts the kernel is shaped by (mods_kernel.h). */
static fj_status add_mods(const fj_ctx *ctx, fj_vparams *o, const fj_mods *m)
{
  fj_mods_info mi;
  fj__mods_info(m, &mi);
  if (!mi.on)
    return FJ_OK;
  char err[512];
  if (fj__mods_kparam(m, &o->mod_facts, err, sizeof err))
    return fj__fail(ctx, FJ_ERR_NOMEM, "%s", err);
  if (o->n < FJ_ARRAY_LEN(o->p))
    o->p[o->n++] = o->mod_facts.param;
  fj__mods_param_list(m, o->mod_params, sizeof o->mod_params);
  add(o, "window", FJ_PARAM_BOOL, mi.window, NULL, NULL);
  add(o, "softcap", FJ_PARAM_BOOL, mi.softcap, NULL, NULL);
  add(o, "sinks", FJ_PARAM_BOOL, mi.sinks, NULL, NULL);
  add(o, "score_mod", FJ_PARAM_STR, 0, m->score ? m->score : "", NULL);
  add(o, "mask_mod", FJ_PARAM_STR, 0, m->mask ? m->mask : "", NULL);
  add(o, "mod_params", FJ_PARAM_STR, 0, o->mod_params, NULL);
  add(o, "block_q", FJ_PARAM_INT, mi.block_q, NULL, NULL);
  add(o, "block_kv", FJ_PARAM_INT, mi.block_kv, NULL, NULL);
  add(o, "checked", FJ_PARAM_BOOL, mi.checked, NULL, NULL);
  return FJ_OK;
}

/* What every kernel's parameters begin with: its template and symbol
 * (o's), the target, the library's version, the parameter block's size. */
static void add_head(const fj_ctx *ctx, fj_vparams *o)
{
  add(o, "template", FJ_PARAM_STR, 0, o->template_name, NULL);
  add(o, "symbol", FJ_PARAM_STR, 0, o->symbol, NULL);
  add(o, "arch", FJ_PARAM_STR, 0, ctx->arch, NULL);
  add(o, "sm", FJ_PARAM_INT, ctx->sm, NULL, NULL);
  add(o, "version", FJ_PARAM_STR, 0, fj_version(), NULL);
  add(o, "params_bytes", FJ_PARAM_INT, (long long)sizeof(fj_kparams), NULL, NULL);
}

/* o as fj__variant_params and fj__variant_simt_params begin it: no
 * parameters yet.  Not the whole struct zeroed: its tables and the
 * modifications' facts are over 100 kB, filled where used. */
static void vparams_start(fj_vparams *o, const char *template_name)
{
  o->template_name = template_name;
  o->symbol[0] = '\0';
  o->n = 0;
  o->mod_params[0] = '\0';
}

fj_status fj__variant_params(fj_ctx *ctx, const fj_variant *v,
                             fj_vparams *o)
{
  vparams_start(o, template_of(v));
  fj_variant_name(v, o->symbol, sizeof o->symbol);
  add_head(ctx, o);
  add(o, "head_dim", FJ_PARAM_INT, v->head_dim, NULL, NULL);
  /* V's and O's head dim, where it differs (the others' parameters, and
   * so their sources and cache keys, stay as they were). */
  if (fj__head_dim_v(v) != v->head_dim)
    add(o, "head_dim_v", FJ_PARAM_INT, fj__head_dim_v(v), NULL, NULL);
  add(o, "tile_m", FJ_PARAM_INT, v->tile_m, NULL, NULL);
  add(o, "tile_n", FJ_PARAM_INT, v->tile_n, NULL, NULL);
  add(o, "warps", FJ_PARAM_INT, v->warps, NULL, NULL);
  add(o, "stages", FJ_PARAM_INT, v->stages, NULL, NULL);
  add(o, "swizzle", FJ_PARAM_STR, 0, fj_swizzle_name(v->swizzle), NULL);
  add(o, "softmax", FJ_PARAM_STR, 0, fj_softmax_name(v->softmax), NULL);
  add(o, "mma", FJ_PARAM_STR, 0, fj_mma_name(v->mma), NULL);
  add(o, "causal", FJ_PARAM_STR, 0, fj_causal_name(v->causal), NULL);
  add(o, "dtype", FJ_PARAM_STR, 0, fj_dtype_name(v->dtype), NULL);
  add(o, "kv_dtype", FJ_PARAM_STR, 0, fj_dtype_name(fj__kv_dtype(v)), NULL);
  add(o, "pack_gqa", FJ_PARAM_BOOL, v->pack_gqa, NULL, NULL);
  add(o, "split_kv", FJ_PARAM_BOOL, v->split_kv, NULL, NULL);
  add(o, "varlen", FJ_PARAM_BOOL, v->varlen, NULL, NULL);
  add(o, "paged", FJ_PARAM_BOOL, v->paged, NULL, NULL);
  if (v->dtype == FJ_E4M3)
    add(o, "fp8_flush", FJ_PARAM_INT, fj__fp8_flush(v), NULL, NULL);
  /* O's element where it is not the default (FP8 attention's f16 or
   * e4m3): the others' sources stay as they were. */
  if (fj__variant_o_dtype(v) != fj__default_o_dtype(v->dtype))
    add(o, "o_dtype", FJ_PARAM_STR, 0, fj_dtype_name(fj__variant_o_dtype(v)), NULL);
  /* The distance table proved within its extents (the others' sources
   * stay as they were). */
  if (v->table_inside)
    add(o, "table_inside", FJ_PARAM_BOOL, 1, NULL, NULL);
  fj_status st = add_mods(ctx, o, v->mods);
  if (st != FJ_OK)
    return st;
  /* Every variant reads the layout tables (for its fragment loads, and the
   * register softmax for its shuffles); the source is the same wherever the
   * tables are. */
  return add_luts(ctx, v, o);
}

fj_status fj__variant_simt_params(fj_ctx *ctx, const fj_variant *v,
                                  fj_vparams *o)
{
  char mods[64];
  vparams_start(o, "attention_simt.cu");
  mods_suffix(v->mods, mods, sizeof mods);
  snprintf(o->symbol, sizeof o->symbol, "fj_simt_d%d_%s_%s%s", v->head_dim,
           causal_short(v->causal), fj_dtype_name(v->dtype), mods);
  add_head(ctx, o);
  add(o, "head_dim", FJ_PARAM_INT, v->head_dim, NULL, NULL);
  add(o, "causal", FJ_PARAM_STR, 0, fj_causal_name(v->causal), NULL);
  add(o, "dtype", FJ_PARAM_STR, 0, fj_dtype_name(v->dtype), NULL);
  return add_mods(ctx, o, v->mods);
}

/* Validates, renders and builds a variant's kernel; ctx->lock held. */
fj_status fj__variant_kernel(fj_ctx *ctx, const fj_variant *v, fj_kernel **k)
{
  fj_status st = fj__variant_validate(ctx, v);
  if (st != FJ_OK)
    return st;
  fj_vparams vp;
  st = fj__variant_params(ctx, v, &vp);
  return st == FJ_OK ? fj__kernel_build(ctx, vp.template_name, vp.p, vp.n, k)
                     : st;
}

fj_status fj_kernel_get(fj_ctx *ctx, const fj_variant *v, fj_kernel **k)
{
  if (!ctx || !v || !k)
    return fj__null_arg(ctx, "fj_kernel_get",
                        !ctx ? "ctx" : !v ? "v" : "kernel");
  fj__clear_error(ctx);
  pthread_mutex_lock(&ctx->lock);
  fj_status st = fj__variant_kernel(ctx, v, k);
  pthread_mutex_unlock(&ctx->lock);
  return st;
}

fj_status fj__variant_meta(fj_ctx *ctx, const fj_variant *v, fj_kmeta *meta)
{
  fj_status st = fj__variant_validate(ctx, v);
  if (st != FJ_OK)
    return st;
  fj_vparams vp;
  fj_buf src = {0};
  st = fj__variant_params(ctx, v, &vp);
  if (st == FJ_OK)
    st = fj__render(ctx, vp.template_name, vp.p, vp.n, &src, meta);
  fj__buf_free(&src);
  return st == FJ_OK ? fj__check_smem(ctx, meta) : st;
}

fj_status fj_variant_check(fj_ctx *ctx, const fj_variant *v)
{
  if (!ctx || !v)
    return fj__null_arg(ctx, "fj_variant_check", ctx ? "v" : "ctx");
  fj__clear_error(ctx);
  fj_kmeta meta;
  pthread_mutex_lock(&ctx->lock);
  fj_status st = fj__variant_meta(ctx, v, &meta);
  pthread_mutex_unlock(&ctx->lock);
  return st;
}

/* ---- many variants at once ------------------------------------------------------------ */

/* The most variants one call prepares: a tuning sweep has a few hundred;
 * far more is a negative count that became a size_t. */
enum { PREPARE_MAX = 65536 };

static int default_workers(void)
{
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : n > 16 ? 16 : (int)n;
}

/* Validation and parameters for every variant, under the lock (the layout
 * tables may be probed on the way). */
static void batch_params(fj_ctx *ctx, const fj_variant *vs, size_t n,
                         fj_vparams *vp, fj_build *b)
{
  pthread_mutex_lock(&ctx->lock);
  for (size_t i = 0; i < n; i++) {
    fj_status st = fj__variant_validate(ctx, &vs[i]);
    if (st == FJ_OK)
      st = fj__variant_params(ctx, &vs[i], &vp[i]);
    b[i].template_name = vp[i].template_name;
    b[i].params = vp[i].p;
    b[i].nparams = vp[i].n;
    b[i].status = st;
    if (st != FJ_OK)
      b[i].message = fj__strdup(fj_errmsg(ctx));
  }
  pthread_mutex_unlock(&ctx->lock);
}

/* Statuses out, failures counted, the first one's message kept. */
static fj_status batch_report(fj_ctx *ctx, const fj_variant *vs, fj_build *b,
                              size_t n, fj_status *each)
{
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; i++) {
    if (each)
      each[i] = b[i].status;
    if (b[i].status != FJ_OK && bad++ == 0)
      first = i;
  }
  fj_status st = FJ_OK;
  if (bad) {
    char name[160];
    fj_variant_name(&vs[first], name, sizeof name);
    st = fj__fail(ctx, b[first].status, "%zu of %zu variants failed; the "
                  "first, %s: %s", bad, n, name,
                  b[first].message ? b[first].message : "?");
  }
  for (size_t i = 0; i < n; i++)
    free(b[i].message);
  return st;
}

fj_status fj_kernel_prepare(fj_ctx *ctx, const fj_variant *variants, size_t n,
                            const fj_prepare_opts *opts, fj_status *each)
{
  if (!ctx || (!variants && n))
    return fj__null_arg(ctx, "fj_kernel_prepare", ctx ? "variants" : "ctx");
  fj__clear_error(ctx);
  if (n > PREPARE_MAX)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "fj_kernel_prepare: n = %zu variants is more than one "
                    "call takes (at most %d)",
                    n, PREPARE_MAX);
  if (opts && opts->workers < 0)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "fj_kernel_prepare: workers %d is invalid: 0 (one per "
                    "CPU, at most 16) or more",
                    opts->workers);
  fj_vparams *vp = calloc(n ? n : 1, sizeof *vp);
  fj_build *b = calloc(n ? n : 1, sizeof *b);
  if (!vp || !b) {
    free(vp);
    free(b);
    return fj__fail(ctx, FJ_ERR_NOMEM, "out of memory");
  }
  batch_params(ctx, variants, n, vp, b);
  int workers = opts && opts->workers > 0 ? opts->workers : default_workers();
  fj_status st = fj__kernel_build_many(ctx, b, n, workers,
                                       opts ? opts->progress : NULL,
                                       opts ? opts->user : NULL);
  if (st == FJ_OK)
    st = batch_report(ctx, variants, b, n, each);
  free(vp);
  free(b);
  return st;
}
