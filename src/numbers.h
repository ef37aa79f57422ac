/*
 * numbers.h -- host number formats: f16, bf16 and e4m3 to and from float
 * with round-to-nearest-even (numbers.c).
 */
#ifndef FJ_NUMBERS_H
#define FJ_NUMBERS_H

#include <stddef.h>
#include <stdint.h>

#include "flashjit.h"

float fj__half_to_float(uint16_t h);
uint16_t fj__float_to_half(float f);
float fj__bf16_to_float(uint16_t h);
uint16_t fj__float_to_bf16(float f);
float fj__e4m3_to_float(uint8_t v);
uint8_t fj__float_to_e4m3(float f);
/* Element i of an array of type d as a float (NaN for an unknown d). */
float fj__to_float(fj_dtype d, const void *src, size_t i);
/* Whether d is one of f16, bf16, e4m3, f32. */
int fj__dtype_known(fj_dtype d);

#endif
