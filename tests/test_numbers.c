/*
 * test_numbers.c -- the layout tables' validation, the host number formats
 * and the float64 reference, all on the CPU.
 */
#include <fenv.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"
#include "numbers.h"
#include "runner.h"

int test_lut_reference(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  fj_lut acc, a;
  CHECK_OK(ctx, fj_layout_get(ctx, FJ_FRAG_WMMA_ACC_F32, &acc));
  CHECK(acc.origin == FJ_LUT_REFERENCE && acc.slots == 8);
  /* g = lane / 4, t = lane % 4: lane 5 (g 1, t 1), slot 6 -> (9, 10). */
  CHECK(acc.map[5][6] == 9 * 16 + 10);
  CHECK(acc.map[0][0] == 0 && acc.map[0][1] == 1 && acc.map[0][2] == 8 * 16);
  CHECK_OK(ctx, fj_layout_get(ctx, FJ_FRAG_WMMA_A_F16_ROW, &a));
  CHECK(a.slots == 16);
  for (int lane = 0; lane < 32; lane++)
    for (int s = 0; s < 8; s++) {
      CHECK(a.map[lane][s] == acc.map[lane][s]);
      CHECK(a.map[lane][s + 8] == a.map[lane][s]);
    }
  /* B (k, n): lane 5 (g 1, t 1) slot 3 -> (2 + 1 + 8, 1) = (11, 1). */
  fj_lut b;
  CHECK_OK(ctx, fj_layout_get(ctx, FJ_FRAG_WMMA_B_F16_COL, &b));
  CHECK(b.slots == 16 && b.map[5][3] == 11 * 16 + 1 && b.map[5][11] == b.map[5][3]);
  CHECK_OK(ctx, fj_layout_get(ctx, FJ_FRAG_WMMA_B_BF16_ROW, &b));
  CHECK(b.slots == 8 && b.map[5][3] == 11 * 16 + 1);
  char why[256];
  for (int f = 1; f <= FJ_FRAG_COUNT; f++) {
    CHECK_OK(ctx, fj_layout_get(ctx, (fj_frag)f, &b));
    CHECK(fj__lut_validate(&b, why, sizeof why) == 0);
  }
  CHECK(!strcmp(fj_frag_name(FJ_FRAG_WMMA_B_BF16_ROW), "wmma_b_bf16_row"));
  fj_ctx_destroy(ctx);
  return 0;
}

/* The e4m3 kinds on a compile-only sm_90a context: the accumulator is the
 * 16-bit one's table; the 8-bit A is warp 0's 16 x 32 (16 slots per lane)
 * as the PTX ISA draws wgmma's m64nNk32 A, each element held once. */
int test_lut_reference_e4m3(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  fj_lut acc, acc16, a8;
  char why[256];
  CHECK_OK(ctx, fj_layout_get(ctx, FJ_FRAG_WGMMA_ACC_E4M3, &acc));
  CHECK_OK(ctx, fj_layout_get(ctx, FJ_FRAG_WGMMA_ACC_F16, &acc16));
  CHECK(acc.origin == FJ_LUT_REFERENCE && acc.frag == FJ_FRAG_WGMMA_ACC_E4M3);
  CHECK(acc.rows == 16 && acc.cols == 16 && acc.slots == 8 && acc.lanes == 32);
  CHECK(fj__lut_validate(&acc, why, sizeof why) == 0);
  CHECK(!memcmp(acc.map, acc16.map, sizeof acc.map));
  CHECK_OK(ctx, fj_layout_get(ctx, FJ_FRAG_WGMMA_A8, &a8));
  CHECK(a8.origin == FJ_LUT_REFERENCE && a8.frag == FJ_FRAG_WGMMA_A8);
  CHECK(a8.rows == 16 && a8.cols == 32 && a8.slots == 16 && a8.lanes == 32);
  CHECK(fj__lut_validate(&a8, why, sizeof why) == 0);
  int held[16 * 32] = {0};
  for (int lane = 0; lane < 32; lane++)
    for (int s = 0; s < 16; s++) {
      int row = lane / 4 + (s % 8 < 4 ? 0 : 8);
      int col = 4 * (lane % 4) + s % 4 + (s < 8 ? 0 : 16);
      CHECK(a8.map[lane][s] == row * 32 + col);
      held[a8.map[lane][s]]++;
    }
  for (int e = 0; e < 16 * 32; e++)
    CHECK(held[e] == 1);
  /* Lane 6 (g 1, t 2) slot 13 (register 3, byte 1): (9, 8 + 1 + 16). */
  CHECK(a8.map[6][13] == 9 * 32 + 25);
  CHECK(!strcmp(fj_frag_name(FJ_FRAG_WGMMA_ACC_E4M3), "wgmma_acc_e4m3"));
  CHECK(!strcmp(fj_frag_name(FJ_FRAG_WGMMA_A8), "wgmma_a8"));
  CHECK(FJ_FRAG_COUNT == FJ_FRAG_WGMMA_A8);
  fj_ctx_destroy(ctx);
  /* wgmma kinds need sm_90a. */
  ctx = fjt_ctx("sm_90", NULL);
  CHECK(ctx);
  CHECK_ST(ctx, fj_layout_get(ctx, FJ_FRAG_WGMMA_A8, &a8), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "fragment kind wgmma_a8 needs sm_90a (wgmma); the target is sm_90");
  CHECK_ST(ctx, fj_layout_get(ctx, FJ_FRAG_WGMMA_ACC_E4M3, &acc), FJ_ERR_UNSUPPORTED);
  fj_ctx_destroy(ctx);
  return 0;
}

/* What a device whose e4m3 wgmma layouts are the reference tables writes
 * for the accumulator's probe (lut_probe.cu: rounds 0 and 1 each
 * register's row and column, round 2 the check product over k < 128) and
 * the 8-bit A's (D = A . I read through the accumulator; the tags 1 +
 * slot, 1 + thread % 16, 1 + thread / 16). */
static void synth_acc_e4m3(const fj_lut *acc, float *out)
{
  for (int t = 0; t < 128; t++)
    for (int i = 0; i < 64; i++) {
      int e = acc->map[t % 32][i % 8];
      int m = e / 16 + 16 * (t / 32), n = e % 16 + 16 * (i / 8);
      double sum = 0;
      for (int k = 0; k < 128; k++)
        sum += ((m * 7 + k * 3) % 9 - 4) * ((k * 5 + n * 13) % 9 - 4);
      out[t * 64 + i] = (float)m;
      out[8192 + t * 64 + i] = (float)n;
      out[2 * 8192 + t * 64 + i] = (float)sum;
    }
  out[32768] = 8.f;
}

static void synth_a8(const fj_lut *acc, const fj_lut *a8, float *out)
{
  static int owner[64 * 32];
  for (int t = 0; t < 128; t++)
    for (int s = 0; s < 16; s++) {
      int e = a8->map[t % 32][s];
      owner[(e / 32 + 16 * (t / 32)) * 32 + e % 32] = t * 16 + s;
    }
  for (int t = 0; t < 128; t++)
    for (int i = 0; i < 16; i++) {
      int e = acc->map[t % 32][i % 8];
      int o = owner[(e / 16 + 16 * (t / 32)) * 32 + e % 16 + 16 * (i / 8)];
      out[t * 64 + i] = (float)(o % 16 + 1);
      out[8192 + t * 64 + i] = (float)(o / 16 % 16 + 1);
      out[2 * 8192 + t * 64 + i] = (float)(o / 256 + 1);
    }
  out[32768] = 16.f;
}

/* The host half of the e4m3 probes, on outputs made here: the reference
 * tables come back from what a device with those layouts writes, and a
 * wrong product, a tag twice, a warp off the pattern or an unfinished
 * probe is refused with what is wrong. */
int test_lut_decode_e4m3(void)
{
  static float out[FJ_LUT_PROBE_FLOATS];
  static fj_lut luts[FJ_FRAG_COUNT + 1];
  fj_lut ref, got;
  char why[256];
  fj__lut_reference(FJ_FRAG_WGMMA_ACC_E4M3, &ref);
  synth_acc_e4m3(&ref, out);
  CHECK(fj__lut_decode(FJ_FRAG_WGMMA_ACC_E4M3, out, luts, &got, why, sizeof why) == 0);
  CHECK(got.slots == 8 && got.cols == 16 && !memcmp(got.map, ref.map, sizeof ref.map));
  out[2 * 8192 + 77 * 64 + 5] += 1.f;
  CHECK(fj__lut_decode(FJ_FRAG_WGMMA_ACC_E4M3, out, luts, &got, why, sizeof why) != 0);
  CHECK(strstr(why, "wgmma_acc_e4m3: with a K-major B, thread 77 register 5"));
  luts[FJ_FRAG_WGMMA_ACC_E4M3] = ref;
  fj_lut a8;
  fj__lut_reference(FJ_FRAG_WGMMA_A8, &a8);
  synth_a8(&ref, &a8, out);
  CHECK(fj__lut_decode(FJ_FRAG_WGMMA_A8, out, luts, &got, why, sizeof why) == 0);
  CHECK(got.slots == 16 && got.rows == 16 && got.cols == 32 &&
        !memcmp(got.map, a8.map, sizeof a8.map));
  /* Another valid A layout (lanes 0 and 1 swapped) is read as it is. */
  fj_lut other = a8;
  for (int s = 0; s < 16; s++) {
    other.map[0][s] = a8.map[1][s];
    other.map[1][s] = a8.map[0][s];
  }
  synth_a8(&ref, &other, out);
  CHECK(fj__lut_decode(FJ_FRAG_WGMMA_A8, out, luts, &got, why, sizeof why) == 0);
  CHECK(!memcmp(got.map, other.map, sizeof other.map));
  synth_a8(&ref, &a8, out);
  out[8192 + 3 * 64 + 2] = out[8192 + 3 * 64 + 3];
  out[3 * 64 + 2] = out[3 * 64 + 3];
  out[2 * 8192 + 3 * 64 + 2] = out[2 * 8192 + 3 * 64 + 3];
  CHECK(fj__lut_decode(FJ_FRAG_WGMMA_A8, out, luts, &got, why, sizeof why) != 0);
  CHECK(strstr(why, "wgmma_a8: thread") && strstr(why, "appears twice"));
  synth_a8(&ref, &a8, out);
  out[2 * 8192 + 40 * 64 + 9] = 9.f;  /* a thread 128 or more */
  CHECK(fj__lut_decode(FJ_FRAG_WGMMA_A8, out, luts, &got, why, sizeof why) != 0);
  CHECK(strstr(why, "wgmma_a8: thread 40 register 9"));
  CHECK(strstr(why, "no (thread, slot)"));
  /* Warp 1 holding lane 0's and lane 1's slots the other way round. */
  for (int s = 0; s < 16; s++) {
    other.map[0][s] = a8.map[0][s];
    other.map[1][s] = a8.map[1][s];
  }
  synth_a8(&ref, &other, out);
  {
    static int owner[64 * 32];
    for (int t = 0; t < 128; t++)
      for (int s = 0; s < 16; s++) {
        int lane = t % 32;
        if (t / 32 == 1 && lane < 2)
          lane ^= 1;
        int e = a8.map[lane][s];
        owner[(e / 32 + 16 * (t / 32)) * 32 + e % 32] = t * 16 + s;
      }
    for (int t = 32; t < 64; t++)
      for (int i = 0; i < 16; i++) {
        int e = ref.map[t % 32][i % 8];
        int o = owner[(e / 16 + 16) * 32 + e % 16 + 16 * (i / 8)];
        out[t * 64 + i] = (float)(o % 16 + 1);
        out[8192 + t * 64 + i] = (float)(o / 16 % 16 + 1);
        out[2 * 8192 + t * 64 + i] = (float)(o / 256 + 1);
      }
  }
  CHECK(fj__lut_decode(FJ_FRAG_WGMMA_A8, out, luts, &got, why, sizeof why) != 0);
  CHECK(strstr(why, "wgmma_a8: thread 32 slot 0 holds (16, 4), not warp 0's lane 0 slot 0 shifted by 16 rows"));
  synth_a8(&ref, &a8, out);
  out[32768] = 8.f;
  CHECK(fj__lut_decode(FJ_FRAG_WGMMA_A8, out, luts, &got, why, sizeof why) != 0);
  CHECK(strstr(why, "wgmma_a8: the probe did not finish (out[32768] = 8)"));
  return 0;
}

int test_lut_validate(void)
{
  fj_lut lut;
  char why[256];
  fj__lut_reference(FJ_FRAG_WMMA_ACC_F32, &lut);
  CHECK(fj__lut_validate(&lut, why, sizeof why) == 0);
  /* Two slots on one element: not a bijection. */
  lut.map[3][1] = lut.map[3][0];
  CHECK(fj__lut_validate(&lut, why, sizeof why) != 0);
  CHECK(strstr(why, "wmma_acc_f32: tile element"));
  CHECK(strstr(why, "is held 2 times") || strstr(why, "is held 0 times"));
  fj__lut_reference(FJ_FRAG_WMMA_ACC_F32, &lut);
  lut.map[31][7] = 256;
  CHECK(fj__lut_validate(&lut, why, sizeof why) != 0);
  CHECK(strstr(why, "lane 31 slot 7 holds element 256, outside"));
  /* An operand may repeat elements but must cover the tile. */
  fj__lut_reference(FJ_FRAG_WMMA_A_F16_ROW, &lut);
  CHECK(fj__lut_validate(&lut, why, sizeof why) == 0);
  for (int s = 0; s < 16; s++)
    lut.map[0][s] = 1;
  CHECK(fj__lut_validate(&lut, why, sizeof why) != 0);
  CHECK(strstr(why, "(0, 0) is held 0 times"));
  /* The 8-bit A's tile is 16 x 32, and only its. */
  fj__lut_reference(FJ_FRAG_WGMMA_A8, &lut);
  CHECK(fj__lut_validate(&lut, why, sizeof why) == 0);
  lut.map[31][15] = 16 * 32;
  CHECK(fj__lut_validate(&lut, why, sizeof why) != 0);
  CHECK(strstr(why, "wgmma_a8: lane 31 slot 15 holds element 512, outside the 512-element tile"));
  fj__lut_reference(FJ_FRAG_WGMMA_A8, &lut);
  lut.map[0][1] = lut.map[0][0];
  CHECK(fj__lut_validate(&lut, why, sizeof why) != 0);
  CHECK(strstr(why, "wgmma_a8: tile element (0, 1) is held 0 times"));
  fj__lut_reference(FJ_FRAG_WGMMA_A8, &lut);
  lut.cols = 16;
  CHECK(fj__lut_validate(&lut, why, sizeof why) != 0);
  CHECK(strstr(why, "wgmma_a8: 16 slots per lane for a 16x16 tile"));
  fj__lut_reference(FJ_FRAG_WGMMA_ACC_E4M3, &lut);
  lut.cols = 32;
  CHECK(fj__lut_validate(&lut, why, sizeof why) != 0);
  CHECK(strstr(why, "wgmma_acc_e4m3: 8 slots per lane for a 16x32 tile"));
  return 0;
}

/* The e4m3 codes of the subnormal midpoints (0.5 to 7.5 times 2^-9, and
 * the one between 7 and 8, 2^-6's code) and of a float either side of
 * each, both signs, under every rounding mode fesetround takes: the same
 * bytes as under FE_TONEAREST (the conversion rounds by bits, ties to
 * even, whatever the caller's mode). */
static int e4m3_any_rounding_mode(void)
{
  static const int modes[] = {FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO};
  float probe[8 * 3 * 2];
  uint8_t want[8 * 3 * 2];
  int n = 0;
  for (int c = 0; c < 8; c++) {
    float mid = ((float)c + 0.5f) / 512.0f;  /* exact */
    float p3[3] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, 1.0f)};
    for (int i = 0; i < 3; i++) {
      probe[n++] = p3[i];
      probe[n++] = -p3[i];
    }
  }
  for (int i = 0; i < n; i++)
    want[i] = fj__float_to_e4m3(probe[i]);
  /* Ties to the even code: 0.5 -> 0, 1.5 -> 2, ..., 7.5 -> 8 (2^-6). */
  for (int c = 0; c < 8; c++)
    CHECK(want[6 * c] == (uint8_t)((c + 1) / 2 * 2) &&
          want[6 * c + 1] == (0x80 | want[6 * c]));
  int bad = 0;
  for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
    CHECK(fesetround(modes[m]) == 0);
    for (int i = 0; i < n && !bad; i++) {
      uint8_t got = fj__float_to_e4m3(probe[i]);
      if (got != want[i]) {
        fprintf(stderr, "e4m3 of %a under rounding mode %d: 0x%02x, under "
                "FE_TONEAREST 0x%02x\n", (double)probe[i], modes[m], got,
                want[i]);
        bad = 1;
      }
    }
    fesetround(FE_TONEAREST);
  }
  return bad;
}

int test_convert_formats(void)
{
  /* f16: exact values, round to nearest even, overflow, subnormals. */
  CHECK(fj__float_to_half(1.0f) == 0x3c00);
  CHECK(fj__float_to_half(-2.0f) == 0xc000);
  CHECK(fj__float_to_half(65504.0f) == 0x7bff);
  CHECK(fj__float_to_half(65520.0f) == 0x7c00);
  CHECK(fj__float_to_half(1.0f + 1.0f / 2048) == 0x3c00);      /* tie: even */
  CHECK(fj__float_to_half(1.0f + 3.0f / 2048) == 0x3c02);      /* tie: even */
  CHECK(fj__float_to_half(5.960464477539063e-08f) == 0x0001);  /* 2^-24 */
  CHECK(fj__half_to_float(0x0001) == 5.960464477539063e-08f);
  CHECK(isnan(fj__half_to_float(fj__float_to_half(NAN))));
  for (uint32_t h = 0; h < 0x7c00; h += 7)
    CHECK(fj__float_to_half(fj__half_to_float((uint16_t)h)) == h);
  /* bf16 */
  CHECK(fj__float_to_bf16(1.0f) == 0x3f80);
  CHECK(fj__float_to_bf16(1.0f + 1.0f / 256) == 0x3f80);       /* tie: even */
  CHECK(fj__bf16_to_float(0x4049) == 3.140625f);
  /* e4m3: 448 is the largest finite value; it saturates. */
  CHECK(fj__float_to_e4m3(448.0f) == 0x7e);
  CHECK(fj__float_to_e4m3(1000.0f) == 0x7e);
  CHECK(fj__float_to_e4m3(-1.0f) == 0xb8);
  CHECK(fj__e4m3_to_float(0x01) == 0.001953125f);              /* 2^-9 */
  CHECK(isnan(fj__e4m3_to_float(0x7f)));
  for (int c = 0; c < 0x7f; c++)
    CHECK(fj__float_to_e4m3(fj__e4m3_to_float((uint8_t)c)) == c);
  /* Nearest code, ties to the even one, against a search of all codes:
   * every midpoint between neighbours and a point either side of it. */
  for (int c = 0; c < 0x7e; c++) {
    float lo = fj__e4m3_to_float((uint8_t)c), hi = fj__e4m3_to_float((uint8_t)(c + 1));
    float mid = 0.5f * (lo + hi);
    float probe[3] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, 1000.0f)};
    for (int i = 0; i < 3; i++) {
      uint8_t best = 0;
      float best_err = INFINITY;
      for (int k = 0; k < 0x7f; k++) {
        float err = fabsf(fj__e4m3_to_float((uint8_t)k) - probe[i]);
        if (err < best_err || (err == best_err && (k & 1) == 0)) {
          best = (uint8_t)k;
          best_err = err;
        }
      }
      CHECK(fj__float_to_e4m3(probe[i]) == best);
      CHECK(fj__float_to_e4m3(-probe[i]) == (0x80 | best));
    }
  }
  CHECK(fj__float_to_e4m3(460.0f) == 0x7e && fj__float_to_e4m3(470.0f) == 0x7e);
  CHECK(fj__float_to_e4m3(INFINITY) == 0x7e && fj__float_to_e4m3(-INFINITY) == 0xfe);
  CHECK(fj__float_to_e4m3(1e-30f) == 0 && fj__float_to_e4m3(-0.0f) == 0x80);
  CHECK(e4m3_any_rounding_mode() == 0);
  /* through the public entry point */
  float in[3] = {0.5f, -3.0f, 1e-3f}, back[3];
  uint16_t h[3];
  CHECK(fj_convert(FJ_BF16, h, FJ_F32, in, 3) == FJ_OK);
  CHECK(fj_convert(FJ_F32, back, FJ_BF16, h, 3) == FJ_OK);
  CHECK(back[0] == 0.5f && back[1] == -3.0f && fabsf(back[2] - 1e-3f) < 1e-5f);
  CHECK(fj_convert((fj_dtype)9, h, FJ_F32, in, 3) == FJ_ERR_INVALID_ARG);
  return 0;
}

/* Cases with known answers: one key gives V; equal scores give the mean of
 * V; a causal row sees only the keys up to its diagonal. */
int test_reference_small(void)
{
  enum { S = 3, D = 32 };
  fj_problem p;
  fj_problem_init(&p, 1, 1, 1, S, S, D, FJ_F16, FJ_BHSD);
  uint16_t q[S * D], k[S * D], v[S * D];
  float f[S * D];
  for (int i = 0; i < S * D; i++)
    f[i] = 0.0f;
  fj_convert(FJ_F16, q, FJ_F32, f, S * D);
  fj_convert(FJ_F16, k, FJ_F32, f, S * D);
  for (int i = 0; i < S * D; i++)
    f[i] = (float)(i / D + 1);  /* V row j holds j + 1 */
  fj_convert(FJ_F16, v, FJ_F32, f, S * D);
  double out[S * D], lse[S];
  CHECK(fj_reference_fwd(&p, q, k, v, NULL, NULL, 0, S, out, lse) == FJ_OK);
  for (int e = 0; e < D; e++)
    CHECK(fabs(out[e] - 2.0) < 1e-12);            /* mean of 1, 2, 3 */
  CHECK(fabs(lse[0] - log(3.0)) < 1e-12);
  p.causal = FJ_CAUSAL_TOP_LEFT;
  CHECK(fj_reference_fwd(&p, q, k, v, NULL, NULL, 0, S, out, lse) == FJ_OK);
  CHECK(fabs(out[0] - 1.0) < 1e-12);              /* row 0 sees key 0 */
  CHECK(fabs(out[D] - 1.5) < 1e-12);              /* row 1: keys 0, 1 */
  CHECK(fabs(out[2 * D] - 2.0) < 1e-12);
  /* Bottom-right with seq_q > seq_kv: the first row sees nothing. */
  fj_problem_init(&p, 1, 1, 1, S, S - 1, D, FJ_F16, FJ_BHSD);
  p.causal = FJ_CAUSAL_BOTTOM_RIGHT;
  CHECK(fj_reference_fwd(&p, q, k, v, NULL, NULL, 0, S, out, lse) == FJ_OK);
  CHECK(out[0] == 0.0 && isinf(lse[0]) && lse[0] < 0);
  CHECK(fabs(out[D] - 1.0) < 1e-12);
  /* Rows outside the problem are refused. */
  CHECK(fj_reference_fwd(&p, q, k, v, NULL, NULL, 0, S + 1, out, lse) ==
        FJ_ERR_INVALID_ARG);
  return 0;
}
