/*
 * reference.h -- host number formats: f16, bf16 and e4m3 to and from float
 * with round-to-nearest-even (the float64 attention reference itself is
 * public: fj_reference_fwd).
 */
#ifndef FJ_REFERENCE_H
#define FJ_REFERENCE_H

#include <stdint.h>

float fj__half_to_float(uint16_t h);
uint16_t fj__float_to_half(float f);
float fj__bf16_to_float(uint16_t h);
uint16_t fj__float_to_bf16(float f);
float fj__e4m3_to_float(uint8_t v);
uint8_t fj__float_to_e4m3(float f);

#endif /* FJ_REFERENCE_H */
