/*
 * variant.h -- the specialisation space: each axis's rules (messages name
 * the axis, the value and the limit), and a variant's template parameters
 * and kernel.
 */
#ifndef FJ_VARIANT_H
#define FJ_VARIANT_H

#include <stddef.h>

#include "ctx.h"
#include "kernel.h"
#include "mods.h"
#include "mods_kernel.h"
#include "problem.h"
#include "template.h"

/* Axis rules and what is implemented; the message names axis and limit. */
fj_status fj__variant_validate(const fj_ctx *ctx, const fj_variant *v);

/* The template parameters of a variant, with the storage they point to. */
typedef struct fj_vparams {
  const char *template_name;
  char symbol[128];
  fj_lut luts[4];  /* accumulator, A, B col_major (K), B row_major (V) */
  fj_param p[48];
  size_t n;
  char mod_params[FJ_MOD_PARAMS_MAX * (FJ_MOD_NAME_MAX + 12) + 1];
  fj_mods_kparam mod_facts;  /* the expressions' facts (mods_kernel.h) */
} fj_vparams;

/* The parameters of the tiered JIT's first kernel for v's problem
 * (templates/attention_simt.cu): head dim, causal, dtype and the
 * modifications; the variant's tiles and family do not enter. */
fj_status fj__variant_simt_params(fj_ctx *ctx, const fj_variant *v,
                                  fj_vparams *out);
/* Fills out for v; variants that read the layout tables fetch them, which
 * probes the device on first use.  ctx->lock held. */
fj_status fj__variant_params(fj_ctx *ctx, const fj_variant *v,
                             fj_vparams *out);
/* Validates and renders a variant (no compile): what its template says of
 * its kernel, checked against the target's shared memory; ctx->lock held. */
fj_status fj__variant_meta(fj_ctx *ctx, const fj_variant *v, fj_kmeta *meta);
/* Validates and builds a variant's kernel; ctx->lock held. */
fj_status fj__variant_kernel(fj_ctx *ctx, const fj_variant *v, fj_kernel **k);
/* Shared memory of a wmma or mma variant's tiles as its template lays
 * them out: Q, then the K and V rings of `stages` buffers, each padded
 * row by 8 elements under swizzle pad and each region 128-byte aligned.
 * The wmma family's softmax smem adds its score tiles, which this does
 * not count; the kernel's check (kernel.c) has the template's exact
 * number. */
int fj__variant_tiles_smem(const fj_variant *v);
/* The columns of an mma variant's shared tile rows (attention_mma.cu's
 * DT): Q's and K's head dim and V's rounded up to the products' 16 (V's
 * above 256 columns to 16 a warp, its warps splitting them), the wider. */
int fj__mma_tile_cols(const fj_variant *v);
/* o_dtype with 0 resolved: dtype's, bf16 for dtype e4m3. */
fj_dtype fj__variant_o_dtype(const fj_variant *v);
/* kv_dtype with 0 resolved to dtype. */
fj_dtype fj__kv_dtype(const fj_variant *v);
/* head_dim_v with 0 resolved to head_dim: V's and O's columns. */
int fj__head_dim_v(const fj_variant *v);
/* dtype e4m3: the key tiles between flushes of O's FP8 partial into its
 * float32 accumulator (fp8_flush resolved: 1..16, or -1 never). */
int fj__fp8_flush(const fj_variant *v);

#endif /* FJ_VARIANT_H */
