/*
 * axes.c -- the library's vocabulary: the names of the public enums'
 * values (dtypes, families, softmax, swizzle, causal masks, fragment
 * kinds).  It sits below every module that prints or parses a name, so
 * that naming a value never calls up into variant.c or layout.c (which
 * made circles: reference.c -> variant.c -> reference.c, template.c ->
 * layout.c -> kernel.c -> template.c).
 */
#include "axes.h"

/* ---- the enums ---------------------------------------------------------------------- */

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

/* ---- fragment kinds ------------------------------------------------------------ */

static const char *const frag_names[FJ_FRAG_COUNT + 1] = {
    "?",          "wmma_acc_f32",  "wmma_a_f16_row", "wmma_b_f16_col",
    "wmma_b_f16_row", "wmma_a_bf16_row", "wmma_b_bf16_col", "wmma_b_bf16_row",
    "mma_acc_f16", "mma_acc_bf16", "mma_a", "mma_b_col", "mma_b_row",
    "wgmma_acc_f16", "wgmma_acc_bf16", "wgmma_a",
};

const char *fj_frag_name(fj_frag frag)
{
  return frag >= 1 && frag <= FJ_FRAG_COUNT ? frag_names[frag] : "?";
}
