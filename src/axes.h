/*
 * axes.h -- the library's vocabulary: the names of the public enums'
 * values (declared in flashjit.h: fj_dtype_name ... fj_frag_name).
 */
#ifndef FJ_AXES_H
#define FJ_AXES_H

#include "flashjit.h"

#endif /* FJ_AXES_H */
