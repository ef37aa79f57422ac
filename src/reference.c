/*
 * reference.c -- host-side number formats (f16, bf16, e4m3 with
 * round-to-nearest-even) and the float64 attention reference that tests,
 * the CLI and embedders check kernels against.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctx.h"
#include "reference.h"

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

uint8_t fj__float_to_e4m3(float f)
{
  uint8_t sign = signbit(f) ? 0x80 : 0;
  float a = fabsf(f);
  if (isnan(f))
    return 0x7f;
  if (a >= 464.0f)  /* saturate: the format has no infinity */
    return (uint8_t)(sign | 0x7e);
  /* Search the 127 non-negative finite codes for the nearest, ties to the
   * even code: simple, exact, and only used on the host. */
  uint8_t best = 0;
  float best_err = INFINITY;
  for (int c = 0; c < 0x7f; c++) {
    float err = fabsf(fj__e4m3_to_float((uint8_t)c) - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = (uint8_t)c;
      best_err = err;
    }
  }
  return (uint8_t)(sign | best);
}

static float to_float(fj_dtype d, const void *src, size_t i)
{
  switch (d) {
  case FJ_F16: return fj__half_to_float(((const uint16_t *)src)[i]);
  case FJ_BF16: return fj__bf16_to_float(((const uint16_t *)src)[i]);
  case FJ_E4M3: return fj__e4m3_to_float(((const uint8_t *)src)[i]);
  case FJ_F32: return ((const float *)src)[i];
  }
  return NAN;
}

fj_status fj_convert(fj_dtype to, void *dst, fj_dtype from, const void *src,
                     size_t n)
{
  int known = (to >= FJ_F16 && to <= FJ_F32) && (from >= FJ_F16 && from <= FJ_F32);
  if (!known || (!dst && n) || (!src && n))
    return fj__fail(NULL, FJ_ERR_INVALID_ARG,
                    "fj_convert: unknown dtype pair %d -> %d or NULL buffer",
                    (int)from, (int)to);
  for (size_t i = 0; i < n; i++) {
    float f = to_float(from, src, i);
    switch (to) {
    case FJ_F16: ((uint16_t *)dst)[i] = fj__float_to_half(f); break;
    case FJ_BF16: ((uint16_t *)dst)[i] = fj__float_to_bf16(f); break;
    case FJ_E4M3: ((uint8_t *)dst)[i] = fj__float_to_e4m3(f); break;
    case FJ_F32: ((float *)dst)[i] = f; break;
    }
  }
  return FJ_OK;
}

/* ---- the float64 reference ------------------------------------------------------- */

typedef struct ref_head {
  const fj_problem *p;
  const void *q, *k, *v;
  int64_t qoff, koff, voff;   /* element offsets of this (batch, head) */
  double kscale, vscale;
  fj_dtype kv;
} ref_head;

static double elem(fj_dtype d, const void *base, int64_t i)
{
  return (double)to_float(d, base, (size_t)i);
}

/* One output row: O[row] and its log-sum-exp, over the keys it may see. */
static void ref_row(const ref_head *h, int row, double scale, double *s,
                    double *out, double *lse)
{
  const fj_problem *p = h->p;
  int d = p->head_dim, last = p->seq_kv - 1;
  if (p->causal != FJ_CAUSAL_NONE) {
    int off = p->causal == FJ_CAUSAL_BOTTOM_RIGHT ? p->seq_kv - p->seq_q : 0;
    if (row + off < last)
      last = row + off;
  }
  double mx = -HUGE_VAL;
  for (int j = 0; j <= last; j++) {
    double acc = 0;
    for (int e = 0; e < d; e++)
      acc += elem(p->dtype, h->q, h->qoff + (int64_t)row * p->q_stride[2] + e) *
             elem(h->kv, h->k, h->koff + (int64_t)j * p->k_stride[2] + e);
    s[j] = acc * h->kscale * scale;
    mx = s[j] > mx ? s[j] : mx;
  }
  memset(out, 0, sizeof *out * (size_t)d);
  double sum = 0;
  for (int j = 0; j <= last; j++) {
    double w = exp(s[j] - mx);
    sum += w;
    for (int e = 0; e < d; e++)
      out[e] += w * elem(h->kv, h->v, h->voff + (int64_t)j * p->v_stride[2] + e);
  }
  for (int e = 0; e < d && sum > 0; e++)
    out[e] *= h->vscale / sum;
  if (lse)
    *lse = sum > 0 ? mx + log(sum) : -HUGE_VAL;
}

fj_status fj_reference_fwd(const fj_problem *p, const void *q, const void *k,
                           const void *v, const float *k_scale,
                           const float *v_scale, int row_begin, int row_end,
                           double *out, double *out_lse)
{
  if (!p || !q || !k || !v || !out || row_begin < 0 || row_end > p->seq_q ||
      row_begin > row_end || p->heads_kv < 1 || p->heads_q % p->heads_kv)
    return fj__fail(NULL, FJ_ERR_INVALID_ARG,
                    "fj_reference_fwd: bad arguments (rows %d..%d of %d)",
                    row_begin, row_end, p ? p->seq_q : 0);
  fj_dtype kv = p->kv_dtype ? p->kv_dtype : p->dtype;
  if (kv == FJ_E4M3 && (!k_scale || !v_scale))
    return fj__fail(NULL, FJ_ERR_INVALID_ARG,
                    "fj_reference_fwd: e4m3 K/V need host scales");
  double scale = p->scale != 0.f ? (double)p->scale : 1.0 / sqrt(p->head_dim);
  double *s = malloc(sizeof *s * (size_t)p->seq_kv);
  if (!s)
    return fj__fail(NULL, FJ_ERR_NOMEM, "out of memory");
  int rows = row_end - row_begin, group = p->heads_q / p->heads_kv;
  for (int b = 0; b < p->batch; b++)
    for (int hq = 0; hq < p->heads_q; hq++) {
      int hk = hq / group;
      ref_head h = {p, q, k, v,
                    b * p->q_stride[0] + hq * p->q_stride[1],
                    b * p->k_stride[0] + hk * p->k_stride[1],
                    b * p->v_stride[0] + hk * p->v_stride[1],
                    kv == FJ_E4M3 ? (double)k_scale[b * p->heads_kv + hk] : 1.0,
                    kv == FJ_E4M3 ? (double)v_scale[b * p->heads_kv + hk] : 1.0, kv};
      size_t base = ((size_t)b * (size_t)p->heads_q + (size_t)hq) * (size_t)rows;
      for (int r = 0; r < rows; r++)
        ref_row(&h, row_begin + r, scale, s,
                out + (base + (size_t)r) * (size_t)p->head_dim,
                out_lse ? out_lse + base + (size_t)r : NULL);
    }
  free(s);
  return FJ_OK;
}
