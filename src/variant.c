/*
 * variant.c -- the specialisation space: names, defaults, the rules each
 * axis must obey (with messages that name the axis, the value and the
 * limit), and the template parameters of a variant.
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* ---- names --------------------------------------------------------------------- */

const char *fj_dtype_name(fj_dtype d)
{
  switch (d) {
  case FJ_F16: return "f16";
  case FJ_BF16: return "bf16";
  case FJ_E4M3: return "e4m3";
  case FJ_F32: return "f32";
  }
  return "?";
}

const char *fj_mma_name(fj_mma m)
{
  switch (m) {
  case FJ_MMA_WMMA: return "wmma";
  case FJ_MMA_SYNC: return "mma";
  case FJ_MMA_WGMMA: return "wgmma";
  }
  return "?";
}

const char *fj_softmax_name(fj_softmax s)
{
  switch (s) {
  case FJ_SOFTMAX_SMEM: return "smem";
  case FJ_SOFTMAX_REGS: return "regs";
  }
  return "?";
}

const char *fj_swizzle_name(fj_swizzle s)
{
  switch (s) {
  case FJ_SWIZZLE_NONE: return "none";
  case FJ_SWIZZLE_PAD: return "pad";
  case FJ_SWIZZLE_XOR: return "xor";
  }
  return "?";
}

const char *fj_causal_name(fj_causal c)
{
  switch (c) {
  case FJ_CAUSAL_NONE: return "none";
  case FJ_CAUSAL_TOP_LEFT: return "top-left";
  case FJ_CAUSAL_BOTTOM_RIGHT: return "bottom-right";
  }
  return "?";
}

static const char *causal_short(fj_causal c)
{
  return c == FJ_CAUSAL_TOP_LEFT ? "tl" : c == FJ_CAUSAL_BOTTOM_RIGHT ? "br"
                                                                      : "nc";
}

fj_dtype fj__kv_dtype(const fj_variant *v)
{
  return v->kv_dtype ? v->kv_dtype : v->dtype;
}

int fj__dtype_bytes(fj_dtype d)
{
  return d == FJ_E4M3 ? 1 : d == FJ_F32 ? 4 : 2;
}

int fj_variant_name(const fj_variant *v, char *buf, size_t size)
{
  char kv[16] = "";
  if (fj__kv_dtype(v) != v->dtype)
    snprintf(kv, sizeof kv, "_kv%s", fj_dtype_name(fj__kv_dtype(v)));
  return snprintf(buf, size, "fj_attn_d%d_m%d_n%d_w%d_s%d_%s_%s_%s_%s_%s%s",
                  v->head_dim, v->tile_m, v->tile_n, v->warps, v->stages,
                  fj_swizzle_name(v->swizzle), fj_softmax_name(v->softmax),
                  fj_mma_name(v->mma), causal_short(v->causal),
                  fj_dtype_name(v->dtype), kv);
}

/* ---- defaults ------------------------------------------------------------------- */

void fj_variant_default(fj_variant *v, int head_dim, fj_dtype dtype,
                        fj_causal causal)
{
  memset(v, 0, sizeof *v);
  v->head_dim = head_dim;
  v->tile_m = 64;
  v->tile_n = 64;
  v->warps = 4;
  v->stages = 1;
  v->swizzle = FJ_SWIZZLE_PAD;
  v->softmax = FJ_SOFTMAX_SMEM;
  v->mma = FJ_MMA_WMMA;
  v->causal = causal;
  v->dtype = dtype;
  v->kv_dtype = 0;
}

/* ---- rules ----------------------------------------------------------------------- */

static const int head_dims[] = {32, 64, 96, 128, 160, 192, 256};

static int valid_head_dim(int d)
{
  for (size_t i = 0; i < FJ_ARRAY_LEN(head_dims); i++)
    if (head_dims[i] == d)
      return 1;
  return 0;
}

static fj_status check_range(const fj_ctx *ctx, const char *axis, int value,
                             int lo, int hi, int multiple)
{
  if (value >= lo && value <= hi && value % multiple == 0)
    return FJ_OK;
  return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "%s %d is invalid: must be a multiple of %d in %d..%d", axis,
                  value, multiple, lo, hi);
}

static fj_status check_enums(const fj_ctx *ctx, const fj_variant *v)
{
  if (v->swizzle < FJ_SWIZZLE_NONE || v->swizzle > FJ_SWIZZLE_XOR)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "swizzle %d is invalid: none, pad or xor", (int)v->swizzle);
  if (v->softmax != FJ_SOFTMAX_SMEM && v->softmax != FJ_SOFTMAX_REGS)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "softmax %d is invalid: smem or regs", (int)v->softmax);
  if (v->mma < FJ_MMA_WMMA || v->mma > FJ_MMA_WGMMA)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "mma %d is invalid: wmma, mma or wgmma", (int)v->mma);
  if (v->causal < FJ_CAUSAL_NONE || v->causal > FJ_CAUSAL_BOTTOM_RIGHT)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "causal %d is invalid: none, top-left or bottom-right",
                    (int)v->causal);
  if (v->dtype != FJ_F16 && v->dtype != FJ_BF16)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "dtype %s is invalid for Q and O: f16 or bf16",
                    fj_dtype_name(v->dtype));
  fj_dtype kv = fj__kv_dtype(v);
  if (kv != v->dtype && kv != FJ_E4M3)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "kv_dtype %s is invalid with dtype %s: the same as dtype, "
                    "or e4m3",
                    fj_dtype_name(kv), fj_dtype_name(v->dtype));
  return FJ_OK;
}

static fj_status check_axes(const fj_ctx *ctx, const fj_variant *v)
{
  if (!valid_head_dim(v->head_dim))
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "head_dim %d is invalid: one of 32, 64, 96, 128, 160, "
                    "192, 256",
                    v->head_dim);
  fj_status st = check_range(ctx, "tile_m", v->tile_m, 16, 256, 16);
  if (st == FJ_OK)
    st = check_range(ctx, "tile_n", v->tile_n, 16, 256, 16);
  if (st == FJ_OK)
    st = check_range(ctx, "warps", v->warps, 1, 16, 1);
  if (st == FJ_OK)
    st = check_range(ctx, "stages", v->stages, 1, 4, 1);
  return st == FJ_OK ? check_enums(ctx, v) : st;
}

/* Axis values that are valid but not generated (yet). */
static fj_status check_implemented(const fj_ctx *ctx, const fj_variant *v)
{
  if (v->mma != FJ_MMA_WMMA)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "mma %s is not implemented yet: wmma is",
                    fj_mma_name(v->mma));
  if (fj__kv_dtype(v) == FJ_E4M3)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "kv_dtype e4m3 is not implemented yet: f16 and bf16 are");
  if (v->warps != 4 && v->warps != 8)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "warps %d is not implemented: 4 or 8", v->warps);
  if (v->dtype == FJ_BF16 && ctx->sm < 80)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "dtype bf16 needs sm_80 or newer; the target is %s",
                    ctx->arch);
  return FJ_OK;
}

fj_status fj__variant_validate(const fj_ctx *ctx, const fj_variant *v)
{
  fj_status st = check_axes(ctx, v);
  return st == FJ_OK ? check_implemented(ctx, v) : st;
}

/* ---- template parameters ------------------------------------------------------------ */

static const char *template_of(const fj_variant *v)
{
  (void)v;
  return "attention_wmma.cu";
}

size_t fj__variant_params(const fj_ctx *ctx, const fj_variant *v,
                          char symbol[128], fj_param *p, size_t max)
{
  fj_variant_name(v, symbol, 128);
  fj_param all[] = {
      {"template", FJ_PARAM_STR, 0, template_of(v), NULL},
      {"symbol", FJ_PARAM_STR, 0, symbol, NULL},
      {"arch", FJ_PARAM_STR, 0, ctx->arch, NULL},
      {"sm", FJ_PARAM_INT, ctx->sm, NULL, NULL},
      {"version", FJ_PARAM_STR, 0, fj_version(), NULL},
      {"params_bytes", FJ_PARAM_INT, (long long)fj__kparams_size(), NULL,
       NULL},
      {"head_dim", FJ_PARAM_INT, v->head_dim, NULL, NULL},
      {"tile_m", FJ_PARAM_INT, v->tile_m, NULL, NULL},
      {"tile_n", FJ_PARAM_INT, v->tile_n, NULL, NULL},
      {"warps", FJ_PARAM_INT, v->warps, NULL, NULL},
      {"stages", FJ_PARAM_INT, v->stages, NULL, NULL},
      {"swizzle", FJ_PARAM_STR, 0, fj_swizzle_name(v->swizzle), NULL},
      {"softmax", FJ_PARAM_STR, 0, fj_softmax_name(v->softmax), NULL},
      {"mma", FJ_PARAM_STR, 0, fj_mma_name(v->mma), NULL},
      {"causal", FJ_PARAM_STR, 0, fj_causal_name(v->causal), NULL},
      {"dtype", FJ_PARAM_STR, 0, fj_dtype_name(v->dtype), NULL},
      {"kv_dtype", FJ_PARAM_STR, 0, fj_dtype_name(fj__kv_dtype(v)), NULL},
  };
  size_t n = FJ_ARRAY_LEN(all) < max ? FJ_ARRAY_LEN(all) : max;
  memcpy(p, all, n * sizeof *p);
  return n;
}

/* Validates, renders and builds a variant's kernel; ctx->lock held. */
fj_status fj__variant_kernel(fj_ctx *ctx, const fj_variant *v, fj_kernel **k)
{
  fj_status st = fj__variant_validate(ctx, v);
  if (st != FJ_OK)
    return st;
  char symbol[128];
  fj_param params[24];
  size_t n = fj__variant_params(ctx, v, symbol, params, FJ_ARRAY_LEN(params));
  return fj__kernel_build(ctx, template_of(v), params, n, k);
}

fj_status fj_kernel_get(fj_ctx *ctx, const fj_variant *v, fj_kernel **k)
{
  if (!ctx || !v || !k)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG, "fj_kernel_get: NULL argument");
  fj__clear_error(ctx);
  pthread_mutex_lock(&ctx->lock);
  fj_status st = fj__variant_kernel(ctx, v, k);
  pthread_mutex_unlock(&ctx->lock);
  return st;
}

fj_status fj_variant_check(fj_ctx *ctx, const fj_variant *v)
{
  if (!ctx || !v)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG, "fj_variant_check: NULL argument");
  fj__clear_error(ctx);
  fj_status st = fj__variant_validate(ctx, v);
  if (st != FJ_OK)
    return st;
  char symbol[128];
  fj_param params[24];
  size_t n = fj__variant_params(ctx, v, symbol, params, FJ_ARRAY_LEN(params));
  fj_buf src = {0};
  fj_kmeta meta;
  pthread_mutex_lock(&ctx->lock);
  st = fj__render(ctx, template_of(v), params, n, &src, &meta);
  pthread_mutex_unlock(&ctx->lock);
  fj__buf_free(&src);
  return st == FJ_OK ? fj__check_smem(ctx, &meta) : st;
}
