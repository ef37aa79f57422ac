/*
 * axes.h -- the library's vocabulary: the variant's axes (the public
 * FJ_VARIANT_AXES table, fj_axis_get) and the names of the public enums'
 * values (fj_dtype_name ... fj_frag_name, flashjit.h).
 */
#ifndef FJ_AXES_H
#define FJ_AXES_H

#include "flashjit.h"

/* The axes' numbers, in FJ_VARIANT_AXES's order: FJ__AXIS_TILE_M, ... */
enum {
#define X(field, flag, kind, names, doc) FJ__AXIS_##field,
  FJ_VARIANT_AXES(X)
#undef X
  FJ__AXIS_COUNT
};

/* The axis called name ("tile_m"), or -1. */
int fj__axis_find(const char *name);
/* The member of v that axis is (an int or an enum, as an int). */
int *fj__axis_field(fj_variant *v, int axis);
int fj__axis_of(const fj_variant *v, int axis);

#endif /* FJ_AXES_H */
