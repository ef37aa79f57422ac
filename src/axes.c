/*
 * axes.c -- the library's vocabulary: the variant's axes (FJ_VARIANT_AXES,
 * flashjit.h, made into rows here) and the names of the public enums'
 * values (dtypes, families, softmax, swizzle, causal masks, fragment
 * kinds).  It sits below every module that prints or parses a name, so
 * that naming a value never calls up into variant.c or layout.c (which
 * made circles: reference.c -> variant.c -> reference.c, template.c ->
 * layout.c -> kernel.c -> template.c).
 */
#include <stddef.h>
#include <string.h>

#include "axes.h"
#include "ctx.h"

/* ---- the axes -------------------------------------------------------------------- */

/* Each axis's value names as a NULL-ended list, and as one string with a
 * '|' before each name (the first skipped by fj_axis_get). */
#define NAME_ITEM(s) s,
#define NAME_PIPED(s) "|" s
#define NAME_COUNT(s) +1

static const struct {
  fj_axis_info info;
  const char *const *names;
} axes[] = {
#define X(field, flag, kind, names, doc)                                       \
  {{#field, flag, kind, "" names(NAME_PIPED), 0 names(NAME_COUNT),             \
    offsetof(fj_variant, field), doc},                                         \
   (const char *const[]){names(NAME_ITEM) NULL}},
    FJ_VARIANT_AXES(X)
#undef X
};

enum { NAXES = (int)(sizeof axes / sizeof axes[0]) };

int fj_axis_count(void)
{
  return NAXES;
}

fj_status fj_axis_get(int i, fj_axis_info *info)
{
  if (!info)
    return fj__null_arg(NULL, "fj_axis_get", "info");
  if (i < 0 || i >= NAXES)
    return fj__fail(NULL, FJ_ERR_INVALID_ARG,
                    "fj_axis_get: axis %d is invalid: must be in 0..%d", i,
                    NAXES - 1);
  *info = axes[i].info;
  if (info->values[0] == '|')
    info->values++;
  return FJ_OK;
}

const char *fj_axis_value_name(int axis, int value)
{
  if (axis < 0 || axis >= NAXES || value < 1 || value > axes[axis].info.nvalues)
    return "?";
  return axes[axis].names[value - 1];
}

int fj_axis_value(int axis, const char *name)
{
  if (axis < 0 || axis >= NAXES || !name)
    return 0;
  for (int i = 0; i < axes[axis].info.nvalues; i++)
    if (!strcmp(name, axes[axis].names[i]))
      return i + 1;
  return 0;
}

int fj__axis_find(const char *name)
{
  for (int i = 0; i < NAXES; i++)
    if (!strcmp(name, axes[i].info.name))
      return i;
  return -1;
}

int *fj__axis_field(fj_variant *v, int axis)
{
  return (int *)(void *)((char *)v + axes[axis].info.offset);
}

int fj__axis_of(const fj_variant *v, int axis)
{
  return *(const int *)(const void *)((const char *)v + axes[axis].info.offset);
}

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
  return fj_axis_value_name(FJ__AXIS_mma, (int)m);
}

const char *fj_softmax_name(fj_softmax s)
{
  return fj_axis_value_name(FJ__AXIS_softmax, (int)s);
}

const char *fj_swizzle_name(fj_swizzle s)
{
  return fj_axis_value_name(FJ__AXIS_swizzle, (int)s);
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
    "wgmma_acc_f16", "wgmma_acc_bf16", "wgmma_a", "wgmma_acc_e4m3", "wgmma_a8",
};

const char *fj_frag_name(fj_frag frag)
{
  return frag >= 1 && frag <= FJ_FRAG_COUNT ? frag_names[frag] : "?";
}
