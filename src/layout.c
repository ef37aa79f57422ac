/*
 * layout.c -- the fragment-layout table (the LUT).
 *
 * The CUDA guide leaves the mapping from a WMMA fragment's elements to tile
 * positions unspecified, so flashjit observes it: templates/lut_probe.cu
 * tags every slot (or every tile element), one warp stores or loads the
 * fragment, and this file inverts what comes back into map[lane][slot] =
 * row * 16 + col, checks that it covers the tile, and caches it per device,
 * arch and driver -- in the context and on disk.  The first use on a device
 * probes every kind at once (one module, one launch per kind).
 *
 * The mma.sync kinds (sm_80 and newer) are what the mma family's own loads
 * and instruction produce (templates/mma_frag.cuh, shared with the probe):
 * operand tables from ldmatrix of tagged tiles, accumulator tables from an
 * mma whose product encodes each element's position, then checked against
 * two products of small integers computed here.
 *
 * The wgmma kinds (sm_90a) come from one warpgroup's m64nN products: the
 * 16-bit ones through m64nNk16, the e4m3 ones through m64nNk32 with every
 * input exact in e4m3 (integers up to 16).  The 8-bit A operand is the one
 * table of another shape: 16 rows x 32 columns, 16 slots per lane.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "ctx.h"
#include "driver.h"
#include "kernel.h"
#include "layout.h"
#include "template.h"
#include "util.h"

/* out[0..511]: the table; out[512]: slots per lane; out[513..1024]: the
 * mma accumulators' check products (K-style B, then V-style B).  The wgmma
 * kinds (one warpgroup) write out[round * 8192 + thread * 64 + register]
 * and the slots at out[32768]. */
enum {
  PROBE_FLOATS = FJ_LUT_PROBE_FLOATS,
  PROBE_CHECK = 513,
  WG_ROUND = 8192,
  WG_SLOTS = 32768
};

static int is_accumulator(fj_frag frag)
{
  return frag == FJ_FRAG_WMMA_ACC_F32 || frag == FJ_FRAG_MMA_ACC_F16 ||
         frag == FJ_FRAG_MMA_ACC_BF16 || frag == FJ_FRAG_WGMMA_ACC_F16 ||
         frag == FJ_FRAG_WGMMA_ACC_BF16 || frag == FJ_FRAG_WGMMA_ACC_E4M3;
}

static int is_wgmma(fj_frag frag)
{
  return frag >= FJ_FRAG_WGMMA_ACC_F16 && frag <= FJ_FRAG_WGMMA_A8;
}

/* The columns of a kind's tile: warp 0's 16 rows of the 8-bit A span one
 * k32 step; every other tile is 16 x 16. */
static int tile_cols(fj_frag frag)
{
  return frag == FJ_FRAG_WGMMA_A8 ? 32 : 16;
}

static int is_mma(fj_frag frag)
{
  return frag >= FJ_FRAG_MMA_ACC_F16 && frag <= FJ_FRAG_MMA_B_ROW;
}

static int is_bf16_wmma(fj_frag frag)
{
  return frag == FJ_FRAG_WMMA_A_BF16_ROW || frag == FJ_FRAG_WMMA_B_BF16_COL ||
         frag == FJ_FRAG_WMMA_B_BF16_ROW;
}

/* bf16 fragments and mma.sync m16n8k16 need sm_80; so do their tables.
 * wgmma exists only on sm_90a. */
static int available(const fj_ctx *ctx, fj_frag frag)
{
  if (is_wgmma(frag))
    return ctx->sm == 90 && ctx->arch_specific;
  return (!is_mma(frag) && !is_bf16_wmma(frag)) || ctx->sm >= 80;
}

/* ---- validation ---------------------------------------------------------------- */

int fj__lut_validate(const fj_lut *lut, char *buf, size_t size)
{
  int tile = lut->rows * lut->cols;
  int seen[16 * 32] = {0};
  if (lut->slots < 1 || lut->slots > FJ_LUT_MAX_SLOTS || lut->rows != 16 ||
      lut->cols != tile_cols(lut->frag)) {
    snprintf(buf, size, "%s: %d slots per lane for a %dx%d tile",
             fj_frag_name(lut->frag), lut->slots, lut->rows, lut->cols);
    return -1;
  }
  for (int lane = 0; lane < 32; lane++)
    for (int s = 0; s < lut->slots; s++) {
      int e = lut->map[lane][s];
      if (e >= tile) {
        snprintf(buf, size, "%s: lane %d slot %d holds element %d, outside "
                            "the %d-element tile",
                 fj_frag_name(lut->frag), lane, s, e, tile);
        return -1;
      }
      seen[e]++;
    }
  /* An accumulator holds each element exactly once (32 lanes x 8 slots);
   * an operand fragment may hold copies, but must cover every element. */
  for (int e = 0; e < tile; e++) {
    int bad = is_accumulator(lut->frag) ? seen[e] != 1 : seen[e] < 1;
    if (bad) {
      snprintf(buf, size, "%s: tile element (%d, %d) is held %d times",
               fj_frag_name(lut->frag), e / lut->cols, e % lut->cols,
               seen[e]);
      return -1;
    }
  }
  return 0;
}

/* An empty table of a kind (16 rows, tile_cols columns), 32 lanes. */
static void table_init(fj_lut *lut, fj_frag frag, int slots)
{
  memset(lut, 0, sizeof *lut);
  lut->frag = frag;
  lut->rows = 16;
  lut->cols = tile_cols(frag);
  lut->lanes = 32;
  lut->slots = slots;
}

/* ---- the reference tables ------------------------------------------------------ */

static int is_operand_b(fj_frag frag)
{
  return frag == FJ_FRAG_WMMA_B_F16_COL || frag == FJ_FRAG_WMMA_B_F16_ROW ||
         frag == FJ_FRAG_WMMA_B_BF16_COL || frag == FJ_FRAG_WMMA_B_BF16_ROW ||
         frag == FJ_FRAG_MMA_B_COL || frag == FJ_FRAG_MMA_B_ROW;
}

/* What the probe showed on an NVIDIA H200 (sm_90, driver 580.159.04), used
 * only where nothing can be observed (a compile-only context); the e4m3
 * kinds' tables are the PTX ISA's, not yet probed on a GPU.  With
 * g = lane / 4, t = lane % 4 and i = slot % 8:
 *   accumulator and matrix_a:  (row, col) = (g + 8((i >> 1) & 1),
 *                                            2t + (i & 1) + 8(i >> 2))
 *   matrix_b (k, n), either memory order: (2t + (i & 1) + 8((i >> 1) & 1),
 *                                          g + 8(i >> 2))
 * The half operands hold 16 slots whose 8-15 repeat 0-7; the bf16 operands
 * and the accumulator hold 8.  The mma kinds (8 slots) follow the same
 * formulas, as the PTX ISA's fragment figures for m16n8k16 and ldmatrix
 * give them for the loads of templates/mma_frag.cuh; so do the wgmma
 * accumulators, e4m3's included.  The 8-bit A (16 slots, 32 columns), as
 * the PTX ISA's figure for wgmma's m64nNk32 A gives it:
 *   (row, col) = (g + 8((slot >> 2) & 1), 4t + (slot & 3) + 16(slot >> 3)) */
static int reference_element(fj_frag frag, int lane, int slot)
{
  int g = lane / 4, t = lane % 4, i = slot % 8;
  int low = 8 * ((i >> 1) & 1), high = 8 * (i >> 2);
  if (frag == FJ_FRAG_WGMMA_A8)
    return (g + 8 * ((slot >> 2) & 1)) * 32 + 4 * t + (slot & 3) +
           16 * (slot >> 3);
  if (is_operand_b(frag))
    return (2 * t + (i & 1) + low) * 16 + g + high;
  return (g + low) * 16 + 2 * t + (i & 1) + high;
}

static int reference_slots(fj_frag frag)
{
  int half = frag == FJ_FRAG_WMMA_A_F16_ROW || frag == FJ_FRAG_WMMA_B_F16_COL ||
             frag == FJ_FRAG_WMMA_B_F16_ROW;
  return half || frag == FJ_FRAG_WGMMA_A8 ? 16 : 8;
}

void fj__lut_reference(fj_frag frag, fj_lut *lut)
{
  table_init(lut, frag, reference_slots(frag));
  lut->origin = FJ_LUT_REFERENCE;
  /* No device was seen: the name says so before it names the GPU whose
   * probe the table repeats -- or, for the e4m3 kinds, that no GPU has
   * shown it yet (test gpu_lut_e4m3 compares a probe with it). */
  int unseen = frag == FJ_FRAG_WGMMA_ACC_E4M3 || frag == FJ_FRAG_WGMMA_A8;
  snprintf(lut->device, sizeof lut->device, "%s",
           unseen ? "none (a reference table: the PTX ISA's m64nNk32 layout, "
                    "not yet seen on a GPU)"
                  : "none (a reference table: what an NVIDIA H200 showed)");
  for (int lane = 0; lane < 32; lane++)
    for (int s = 0; s < lut->slots; s++)
      lut->map[lane][s] = (uint16_t)reference_element(frag, lane, s);
}

/* ---- probing --------------------------------------------------------------------- */

/* The inputs of the probe's check products (templates/lut_probe.cu); the
 * e4m3 product's A is probe_a8, in [-4, 4] like probe_b. */
static double probe_a(int m, int k) { return (m * 7 + k * 3) % 11 - 5; }
static double probe_a8(int m, int k) { return (m * 7 + k * 3) % 9 - 4; }
static double probe_b(int k, int n) { return (k * 5 + n * 13) % 9 - 4; }

/* An mma accumulator table is right only if the products land where it
 * says: every slot of both check products equals the exact sum. */
static int check_products(const fj_lut *lut, const float *out, char *why,
                          size_t size)
{
  static const char *const style[2] = {"K-style (n-major) B",
                                       "V-style (k-major) B"};
  for (int p = 0; p < 2; p++)
    for (int lane = 0; lane < 32; lane++)
      for (int s = 0; s < lut->slots; s++) {
        int e = lut->map[lane][s], m = e / 16, n = e % 16;
        double want = 0;
        for (int k = 0; k < 16; k++)
          want += probe_a(m, k) * probe_b(k, n);
        float got = out[PROBE_CHECK + p * 256 + lane * 8 + s];
        if ((double)got != want) {
          snprintf(why, size, "%s: with a %s, lane %d slot %d (element "
                              "(%d, %d) by the table) holds %g, not %g",
                   fj_frag_name(lut->frag), style[p], lane, s, m, n,
                   (double)got, want);
          return -1;
        }
      }
  return 0;
}

/* ---- the wgmma kinds: a warpgroup's m64n128 accumulator ------------------ */

/* Where thread t's register i sits in the warpgroup's tile, by warp 0's
 * table: warp w holds rows 16w on, register group i / 8 columns 16 (i / 8)
 * on. */
static void wg_position(const fj_lut *lut, int t, int i, int *row, int *col)
{
  int e = lut->map[t % 32][i % 8];
  *row = e / 16 + 16 * (t / 32);
  *col = e % 16 + 16 * (i / 8);
}

static int wg_integer(float v, int lo, int hi)
{
  return v == floorf(v) && v >= (float)lo && v < (float)hi;
}

/* One check product of a wgmma accumulator probe: round `round` holds the
 * sum over k < depth of a(m, k) * probe_b(k, n), B stored as `style` says. */
typedef struct wg_product {
  int round, depth;
  double (*a)(int m, int k);
  const char *style;
} wg_product;

/* The 16-bit kinds: rounds 2 (K-style B) and 3 (V-style B, MN-major, two
 * panels) over k < 64; e4m3: round 2 (K-major B; no transpose) over k < 128. */
static const wg_product wg_products_16[] = {
    {2, 64, probe_a, "K-major B"}, {3, 64, probe_a, "MN-major B (two panels)"}};
static const wg_product wg_products_8[] = {{2, 128, probe_a8, "K-major B"}};

/* Every register of each product equals the exact sum. */
static int wg_check_products(const fj_lut *lut, const float *out, char *why,
                             size_t size)
{
  int e4m3 = lut->frag == FJ_FRAG_WGMMA_ACC_E4M3;
  const wg_product *ps = e4m3 ? wg_products_8 : wg_products_16;
  size_t np = e4m3 ? FJ_ARRAY_LEN(wg_products_8) : FJ_ARRAY_LEN(wg_products_16);
  for (size_t p = 0; p < np; p++)
    for (int t = 0; t < 128; t++)
      for (int i = 0; i < 64; i++) {
        int m, n;
        wg_position(lut, t, i, &m, &n);
        double want = 0;
        for (int k = 0; k < ps[p].depth; k++)
          want += ps[p].a(m, k) * probe_b(k, n);
        float got = out[ps[p].round * WG_ROUND + t * 64 + i];
        if ((double)got != want) {
          snprintf(why, size, "%s: with a %s, thread %d register %d (element "
                              "(%d, %d) by the table) holds %g, not %g",
                   fj_frag_name(lut->frag), ps[p].style, t, i, m, n,
                   (double)got, want);
          return -1;
        }
      }
  return 0;
}

/* Rounds 0 and 1 hold each register's row and column: warp 0's first 16
 * columns become the table, every other register must follow it. */
static int invert_wgmma_acc(fj_frag frag, const float *out, fj_lut *lut,
                            char *why, size_t size)
{
  table_init(lut, frag, 8);
  for (int t = 0; t < 128; t++)
    for (int i = 0; i < 64; i++) {
      float r = out[t * 64 + i], c = out[WG_ROUND + t * 64 + i];
      if (!wg_integer(r, 0, 64) || !wg_integer(c, 0, 128)) {
        snprintf(why, size, "%s: thread %d register %d holds (%g, %g), no "
                            "element of the 64x128 tile",
                 fj_frag_name(frag), t, i, (double)r, (double)c);
        return -1;
      }
      if (t < 32 && i < 8) {
        if (r >= 16 || c >= 16) {
          snprintf(why, size, "%s: lane %d register %d holds (%g, %g), "
                              "outside warp 0's first 16x16 corner",
                   fj_frag_name(frag), t, i, (double)r, (double)c);
          return -1;
        }
        lut->map[t][i] = (uint16_t)(r * 16 + c);
      }
    }
  if (fj__lut_validate(lut, why, size) != 0)
    return -1;
  for (int t = 0; t < 128; t++)
    for (int i = 0; i < 64; i++) {
      int r, c;
      wg_position(lut, t, i, &r, &c);
      if ((float)r != out[t * 64 + i] || (float)c != out[WG_ROUND + t * 64 + i]) {
        snprintf(why, size, "%s: thread %d register %d holds (%g, %g), not "
                            "(%d, %d) as warp 0's table repeated by warp and "
                            "column group says",
                 fj_frag_name(frag), t, i, (double)out[t * 64 + i],
                 (double)out[WG_ROUND + t * 64 + i], r, c);
        return -1;
      }
    }
  return wg_check_products(lut, out, why, size);
}

/* D = A . I: columns 0-15 of D hold A, whose slot s of thread t was tagged
 * t * 8 + s; the accumulator table (already validated) says where each D
 * register sits, so where each tag landed is where that A slot sits. */
static int invert_wgmma_a(const float *out, const fj_lut *acc, fj_lut *lut,
                          char *why, size_t size)
{
  int pos[128][8], seen[128][8] = {{0}};
  table_init(lut, FJ_FRAG_WGMMA_A, 8);
  for (int t = 0; t < 128; t++)
    for (int i = 0; i < 32; i++) {
      int r, c;
      wg_position(acc, t, i, &r, &c);
      float v = out[t * 64 + i];
      if (c >= 16 ? v != 0.f : !wg_integer(v, 0, 1024)) {
        snprintf(why, size, "wgmma_a: thread %d register %d (element (%d, "
                            "%d)) holds %g, no tag",
                 t, i, r, c, (double)v);
        return -1;
      }
      if (c >= 16)
        continue;
      int tag = (int)v;
      if (seen[tag / 8][tag % 8]++) {
        snprintf(why, size, "wgmma_a: thread %d slot %d appears twice",
                 tag / 8, tag % 8);
        return -1;
      }
      pos[tag / 8][tag % 8] = r * 16 + c;
    }
  for (int t = 0; t < 128; t++)
    for (int s = 0; s < 8; s++) {
      int want = pos[t % 32][s] + 16 * 16 * (t / 32);
      if (!seen[t][s] || pos[t][s] != want) {
        snprintf(why, size, "wgmma_a: thread %d slot %d is %s, not warp 0's "
                            "lane %d slot %d shifted by %d rows",
                 t, s, seen[t][s] ? "elsewhere" : "missing", t % 32, s,
                 16 * (t / 32));
        return -1;
      }
      if (t < 32)
        lut->map[t][s] = (uint16_t)pos[t][s];
    }
  return fj__lut_validate(lut, why, size);
}

/* The 8-bit A: D = A . I (m64n32k32) holds A itself; register i of thread
 * t sits where the e4m3 accumulator table says, and its rounds' tags (1 +
 * the slot, 1 + t % 16, 1 + t / 16) name the A slot that landed there. */
static int a8_tags(const float *out, int t, int i, int *thread, int *slot)
{
  float s = out[t * 64 + i], lo = out[WG_ROUND + t * 64 + i],
        hi = out[2 * WG_ROUND + t * 64 + i];
  if (!wg_integer(s, 1, 17) || !wg_integer(lo, 1, 17) || !wg_integer(hi, 1, 9))
    return -1;
  *slot = (int)s - 1;
  *thread = ((int)hi - 1) * 16 + (int)lo - 1;
  return 0;
}

/* Where each A slot landed (pos[thread][slot] = row * 32 + col of the
 * 64x32 tile), each exactly once. */
static int a8_positions(const float *out, const fj_lut *acc, int pos[128][16],
                        char *why, size_t size)
{
  int seen[128][16] = {{0}};
  for (int t = 0; t < 128; t++)
    for (int i = 0; i < 16; i++) {
      int r, c, owner, slot;
      wg_position(acc, t, i, &r, &c);
      if (a8_tags(out, t, i, &owner, &slot) != 0) {
        snprintf(why, size, "wgmma_a8: thread %d register %d (element (%d, "
                            "%d)) holds the tags %g, %g, %g: no (thread, slot)",
                 t, i, r, c, (double)out[t * 64 + i],
                 (double)out[WG_ROUND + t * 64 + i],
                 (double)out[2 * WG_ROUND + t * 64 + i]);
        return -1;
      }
      if (seen[owner][slot]++) {
        snprintf(why, size, "wgmma_a8: thread %d slot %d appears twice",
                 owner, slot);
        return -1;
      }
      pos[owner][slot] = r * 32 + c;
    }
  return 0;  /* 2048 registers, no pair twice: every pair exactly once */
}

/* Every warp holds warp 0's pattern 16 rows down; warp 0's rows are the
 * table. */
static int invert_wgmma_a8(const float *out, const fj_lut *acc, fj_lut *lut,
                           char *why, size_t size)
{
  int pos[128][16];
  table_init(lut, FJ_FRAG_WGMMA_A8, 16);
  if (a8_positions(out, acc, pos, why, size) != 0)
    return -1;
  for (int t = 0; t < 128; t++)
    for (int s = 0; s < 16; s++) {
      int want = pos[t % 32][s] + 16 * 32 * (t / 32);
      if (pos[t % 32][s] >= 16 * 32 || pos[t][s] != want) {
        snprintf(why, size, "wgmma_a8: thread %d slot %d holds (%d, %d), "
                            "not warp 0's lane %d slot %d shifted by %d rows",
                 t, s, pos[t][s] / 32, pos[t][s] % 32, t % 32, s,
                 16 * (t / 32));
        return -1;
      }
      if (t < 32)
        lut->map[t][s] = (uint16_t)pos[t][s];
    }
  return fj__lut_validate(lut, why, size);
}

/* Turns one probe's output into a table. */
static int invert(fj_frag frag, const float *out, fj_lut *lut, char *why,
                  size_t size)
{
  table_init(lut, frag, (int)out[512]);
  if (lut->slots < 1 || lut->slots > FJ_LUT_MAX_SLOTS) {
    snprintf(why, size, "%s: the probe reports %d elements per lane",
             fj_frag_name(frag), lut->slots);
    return -1;
  }
  if (frag == FJ_FRAG_WMMA_ACC_F32) {
    int filled[32][FJ_LUT_MAX_SLOTS] = {{0}};
    for (int e = 0; e < 256; e++) {
      int tag = (int)out[e], lane = tag / 32, slot = tag % 32;
      if (out[e] != (float)tag || tag < 0 || lane >= 32 || slot >= lut->slots ||
          filled[lane][slot]++) {
        snprintf(why, size, "%s: tile element (%d, %d) holds tag %g, which "
                            "is no (lane, slot) or appears twice",
                 fj_frag_name(frag), e / 16, e % 16, (double)out[e]);
        return -1;
      }
      lut->map[lane][slot] = (uint16_t)e;
    }
  } else {
    for (int lane = 0; lane < 32; lane++)
      for (int s = 0; s < lut->slots; s++) {
        float v = out[lane * 16 + s];
        if (v < 0 || v > 255 || v != floorf(v)) {
          snprintf(why, size, "%s: lane %d slot %d holds %g, no tile element",
                   fj_frag_name(frag), lane, s, (double)v);
          return -1;
        }
        lut->map[lane][s] = (uint16_t)v;
      }
  }
  if (fj__lut_validate(lut, why, size) != 0)
    return -1;
  return is_mma(frag) && is_accumulator(frag) ? check_products(lut, out, why, size)
                                              : 0;
}

/* The table of one kind from its probe's output; luts holds the kinds
 * probed before (each wgmma A operand reads through its accumulator's:
 * wgmma_a through wgmma_acc_f16's, wgmma_a8 through wgmma_acc_e4m3's). */
int fj__lut_decode(fj_frag frag, const float *out, const fj_lut *luts,
                   fj_lut *lut, char *why, size_t size)
{
  float slots = frag == FJ_FRAG_WGMMA_A8 ? 16.f : 8.f;
  if (is_wgmma(frag) && out[WG_SLOTS] != slots) {
    snprintf(why, size, "%s: the probe did not finish (out[%d] = %g)",
             fj_frag_name(frag), WG_SLOTS, (double)out[WG_SLOTS]);
    return -1;
  }
  if (frag == FJ_FRAG_WGMMA_A)
    return invert_wgmma_a(out, &luts[FJ_FRAG_WGMMA_ACC_F16], lut, why, size);
  if (frag == FJ_FRAG_WGMMA_A8)
    return invert_wgmma_a8(out, &luts[FJ_FRAG_WGMMA_ACC_E4M3], lut, why,
                           size);
  if (is_wgmma(frag))
    return invert_wgmma_acc(frag, out, lut, why, size);
  return invert(frag, out, lut, why, size);
}

static fj_status run_probe(fj_ctx *ctx, fj_kernel *k, fj_frag frag,
                           uint64_t dout, fj_lut *luts)
{
  char symbol[64], why[256];
  snprintf(symbol, sizeof symbol, "fj_probe_%s", fj_frag_name(frag));
  void *fn;
  fj_status st = fj__kernel_symbol(ctx, k, symbol, &fn);
  if (st != FJ_OK)
    return st;
  void *args[] = {&dout};
  fj_launch l = {fn, {1, 1, 1}, {is_wgmma(frag) ? 128u : 32u, 1, 1}, 0,
                 NULL, args, 0};
  fj_lut *lut = &luts[frag];
  float *out = malloc(PROBE_FLOATS * sizeof *out);
  if (!out)
    return fj__fail(ctx, FJ_ERR_NOMEM, "out of memory");
  if ((st = fj__cu_memset(ctx, dout, 0xff, PROBE_FLOATS * sizeof *out)) != FJ_OK ||
      (st = fj__cu_launch(ctx, &l)) != FJ_OK ||
      (st = fj__cu_sync(ctx)) != FJ_OK ||
      (st = fj__cu_copy_to_host(ctx, out, dout, PROBE_FLOATS * sizeof *out)) != FJ_OK) {
    free(out);
    return st;
  }
  int bad = fj__lut_decode(frag, out, luts, lut, why, sizeof why);
  free(out);
  if (bad)
    return fj__fail(ctx, FJ_ERR_LAYOUT, "fragment layout probe on %s: %s",
                    ctx->dev.name, why);
  lut->origin = FJ_LUT_PROBED;
  snprintf(lut->device, sizeof lut->device, "%s", ctx->dev.name);
  return FJ_OK;
}

static fj_status probe_all(fj_ctx *ctx, fj_kernel *k, fj_lut *luts)
{
  fj_status st = fj__cu_enter(ctx);
  if (st != FJ_OK)
    return st;
  uint64_t dout = 0;
  st = fj__cu_alloc(ctx, PROBE_FLOATS * sizeof(float), &dout);
  for (int f = 1; f <= FJ_FRAG_COUNT && st == FJ_OK; f++)
    if (available(ctx, (fj_frag)f))
      st = run_probe(ctx, k, (fj_frag)f, dout, luts);
    else
      fj__lut_reference((fj_frag)f, &luts[f]);  /* never handed out */
  fj__cu_free(dout);
  fj__cu_leave(ctx);
  return st;
}

/* ---- caching --------------------------------------------------------------------- */

static void lut_key(const fj_ctx *ctx, const fj_kernel *probe,
                    fj_cache_key *key)
{
  char src_hash[33], extra[256];
  fj__hash_hex(probe->source, probe->source_len, src_hash);
  snprintf(extra, sizeof extra, "device=%s\ncc=%d.%d\ndriver=%d",
           ctx->dev.name, ctx->dev.cc_major, ctx->dev.cc_minor,
           ctx->dev.driver_version);
  fj__cache_key(key, "lut", ctx->arch, 0, src_hash, extra);
}

static int load_cached(fj_ctx *ctx, const fj_cache_key *key, fj_lut *luts)
{
  void *payload = NULL;
  size_t len = 0;
  char why[256];
  if (!fj__cache_load(ctx, "lut", key, &payload, &len))
    return 0;
  int ok = len == sizeof(fj_lut) * FJ_FRAG_COUNT;
  if (ok)
    memcpy(&luts[1], payload, len);
  for (int f = 1; ok && f <= FJ_FRAG_COUNT; f++) {
    ok = luts[f].frag == (fj_frag)f &&
         fj__lut_validate(&luts[f], why, sizeof why) == 0;
    luts[f].origin = FJ_LUT_CACHED;
  }
  free(payload);
  return ok;
}

fj_status fj__layout_probe_kernel(fj_ctx *ctx, fj_kernel **k)
{
  fj_param params[] = {
      {"arch", FJ_PARAM_STR, 0, ctx->arch, NULL},
      {"version", FJ_PARAM_STR, 0, fj_version(), NULL},
      {"sm", FJ_PARAM_INT, ctx->sm, NULL, NULL},
  };
  return fj__kernel_build(ctx, "lut_probe.cu", params, FJ_ARRAY_LEN(params),
                          k);
}

static fj_status probe_device(fj_ctx *ctx)
{
  fj_kernel *k;
  fj_status st = fj__layout_probe_kernel(ctx, &k);
  if (st != FJ_OK || ctx->lut_ready[1])
    return st;  /* (another thread probed while the probe compiled) */
  fj_cache_key key;
  fj_lut luts[FJ_FRAG_COUNT + 1];
  lut_key(ctx, k, &key);
  if (!load_cached(ctx, &key, luts)) {
    if ((st = probe_all(ctx, k, luts)) != FJ_OK)
      return st;
    fj__cache_store(ctx, "lut", ctx->dev.name, &key, &luts[1],
                    sizeof(fj_lut) * FJ_FRAG_COUNT);
  }
  for (int f = 1; f <= FJ_FRAG_COUNT; f++) {
    ctx->luts[f] = luts[f];
    ctx->lut_ready[f] = 1;
  }
  return FJ_OK;
}

fj_status fj__layout_locked(fj_ctx *ctx, fj_frag frag, fj_lut *lut)
{
  if (frag < 1 || frag > FJ_FRAG_COUNT)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "fragment kind %d is invalid: 1..%d", (int)frag,
                    FJ_FRAG_COUNT);
  if (!available(ctx, frag))
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    is_wgmma(frag)
                        ? "fragment kind %s needs sm_90a (wgmma); the target "
                          "is %s"
                        : "fragment kind %s needs sm_80 or newer (bf16 "
                          "fragments, mma.sync m16n8k16); the target is %s",
                    fj_frag_name(frag), ctx->arch);
  if (!ctx->lut_ready[frag]) {
    if (!ctx->has_device) {
      fj__lut_reference(frag, &ctx->luts[frag]);
      ctx->lut_ready[frag] = 1;
    } else {
      fj_status st = probe_device(ctx);
      if (st != FJ_OK)
        return st;
    }
  }
  *lut = ctx->luts[frag];
  return FJ_OK;
}

fj_status fj_layout_get(fj_ctx *ctx, fj_frag frag, fj_lut *lut)
{
  if (!ctx || !lut)
    return fj__null_arg(ctx, "fj_layout_get", ctx ? "lut" : "ctx");
  fj__clear_error(ctx);
  pthread_mutex_lock(&ctx->lock);
  fj_status st = fj__layout_locked(ctx, frag, lut);
  pthread_mutex_unlock(&ctx->lock);
  return st;
}
