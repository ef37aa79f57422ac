/*
 * numbers.c -- host number formats: f16, bf16 and e4m3 to and from float
 * with round-to-nearest-even, and fj_convert over arrays of them.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ctx.h"
#include "numbers.h"

/* ---- formats ------------------------------------------------------------------- */

static uint32_t float_bits(float f)
{
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float bits_float(uint32_t u)
{
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

float fj__half_to_float(uint16_t h)
{
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  int exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0x1f)
    return bits_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    float f = ldexpf((float)mant, -24);
    return sign ? -f : f;
  }
  return bits_float(sign | ((uint32_t)(exp + 112) << 23) | (mant << 13));
}

uint16_t fj__float_to_half(float f)
{
  uint32_t u = float_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
  float a = fabsf(f);
  if (isnan(f))
    return (uint16_t)(sign | 0x7e00);
  if (a >= 65520.0f)  /* rounds to infinity */
    return (uint16_t)(sign | 0x7c00);
  if (a < 6.103515625e-05f) {  /* subnormal: multiples of 2^-24 */
    float q = nearbyintf(a * 16777216.0f);  /* ties to even */
    return (uint16_t)(sign | (uint16_t)q);
  }
  uint32_t ua = float_bits(a);
  uint32_t mant = ua & 0x7fffff;
  int exp = (int)(ua >> 23) - 127 + 15;
  uint32_t h = ((uint32_t)exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
    h++;
  return (uint16_t)(sign | h);
}

float fj__bf16_to_float(uint16_t h)
{
  return bits_float((uint32_t)h << 16);
}

uint16_t fj__float_to_bf16(float f)
{
  uint32_t u = float_bits(f);
  if (isnan(f))
    return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

/* OCP FP8 E4M3 ("fn"): bias 7, no infinities, 0x7f/0xff are NaN, largest
 * finite value 448. */
float fj__e4m3_to_float(uint8_t v)
{
  int sign = v & 0x80, exp = (v >> 3) & 0xf, mant = v & 7;
  float f;
  if (exp == 0xf && mant == 7)
    return NAN;
  if (exp == 0)
    f = ldexpf((float)mant, -9);
  else
    f = ldexpf(1.0f + (float)mant / 8.0f, exp - 7);
  return sign ? -f : f;
}

/* sig / 2^shift (shift 1..31) rounded to the nearest integer, ties to the
 * even one: by bits, whatever rounding mode the caller set (fesetround). */
static uint32_t round_shift(uint32_t sig, int shift)
{
  uint32_t q = sig >> shift, rem = sig & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1);
  return q + (rem > half || (rem == half && (q & 1u)));
}

uint8_t fj__float_to_e4m3(float f)
{
  uint8_t sign = signbit(f) ? 0x80 : 0;
  float a = fabsf(f);
  if (isnan(f))
    return 0x7f;
  if (a >= 448.0f)  /* saturate: the format has no infinity */
    return (uint8_t)(sign | 0x7e);
  /* The codes are monotonic in value: below 2^-6 (subnormals) a code is
   * a count of 2^-9; from 2^-6 on, code = 8 (e + 6) + m, where 2^e <= a <
   * 2^(e+1) and m in [8, 16] is a's 24-bit significand rounded to 4 bits
   * (m = 16 carries into the next exponent by itself). Ties go to the
   * even m, which is the even code, as round-to-nearest-even wants.
   * Both round by bits (round_shift): a float rounding (rintf) would
   * follow the caller's fesetround mode. */
  uint32_t bits;
  memcpy(&bits, &a, sizeof bits);
  int be = (int)(bits >> 23);  /* biased exponent: a = sig 2^(be - 150) */
  uint32_t sig = (bits & 0x7fffffu) | (be ? 0x800000u : 0u);
  int code;
  if (a < 0.015625f) {
    /* code = a 2^9 = sig 2^-(141 - be) rounded, be <= 120 here (a float
     * subnormal counts as be = 1); from a shift of 25 on (sig < 2^24) it
     * is below one half. */
    int shift = 141 - (be ? be : 1);
    code = shift > 24 ? 0 : (int)round_shift(sig, shift);
  } else {
    code = 8 * (be - 121) + (int)round_shift(sig, 20);
  }
  return (uint8_t)(sign | code);  /* below 448: m <= 14 at e = 8, code <= 0x7e */
}

float fj__to_float(fj_dtype d, const void *src, size_t i)
{
  switch (d) {
  case FJ_F16: return fj__half_to_float(((const uint16_t *)src)[i]);
  case FJ_BF16: return fj__bf16_to_float(((const uint16_t *)src)[i]);
  case FJ_E4M3: return fj__e4m3_to_float(((const uint8_t *)src)[i]);
  case FJ_F32: return ((const float *)src)[i];
  }
  return NAN;
}

int fj__dtype_known(fj_dtype d)
{
  return d >= FJ_F16 && d <= FJ_F32;
}

fj_status fj_convert(fj_dtype to, void *dst, fj_dtype from, const void *src,
                     size_t n)
{
  fj__clear_error(NULL);
  if (!fj__dtype_known(from) || !fj__dtype_known(to))
    return fj__fail(NULL, FJ_ERR_INVALID_ARG,
                    "fj_convert: %s %d is invalid: f16 (%d), bf16 (%d), e4m3 "
                    "(%d) or f32 (%d)",
                    fj__dtype_known(from) ? "to" : "from",
                    (int)(fj__dtype_known(from) ? to : from), (int)FJ_F16,
                    (int)FJ_BF16, (int)FJ_E4M3, (int)FJ_F32);
  if (n && (!dst || !src))
    return fj__null_arg(NULL, "fj_convert", dst ? "src" : "dst");
  for (size_t i = 0; i < n; i++) {
    float f = fj__to_float(from, src, i);
    switch (to) {
    case FJ_F16: ((uint16_t *)dst)[i] = fj__float_to_half(f); break;
    case FJ_BF16: ((uint16_t *)dst)[i] = fj__float_to_bf16(f); break;
    case FJ_E4M3: ((uint8_t *)dst)[i] = fj__float_to_e4m3(f); break;
    case FJ_F32: ((float *)dst)[i] = f; break;
    }
  }
  return FJ_OK;
}
