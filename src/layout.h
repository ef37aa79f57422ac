/*
 * layout.h -- the fragment-layout tables (the LUT): probed on the device
 * by templates/lut_probe.cu, validated, cached per device, arch and driver;
 * the reference tables for compile-only contexts.
 */
#ifndef FJ_LAYOUT_H
#define FJ_LAYOUT_H

#include <stddef.h>

#include "ctx.h"

/* fj_layout_get with ctx->lock held. */
fj_status fj__layout_locked(fj_ctx *ctx, fj_frag frag, fj_lut *lut);
/* Checks that a table covers the tile; message in buf on failure. */
int fj__lut_validate(const fj_lut *lut, char *buf, size_t size);
/* The layout probe's kernel for the context's arch (templates/lut_probe.cu),
 * built as a GPU context's first use builds it: a package seals it in
 * (package_seal.c).  ctx->lock held. */
fj_status fj__layout_probe_kernel(fj_ctx *ctx, fj_kernel **k);
/* The reference table of a fragment kind (what the H200 showed). */
void fj__lut_reference(fj_frag frag, fj_lut *lut);
/* The floats a probe kernel writes (templates/lut_probe.cu). */
#define FJ_LUT_PROBE_FLOATS 32769
/* The table of kind frag from its probe's output (FJ_LUT_PROBE_FLOATS
 * floats): 0, or -1 with why.  luts[f] holds the kinds probed before (an
 * A operand of wgmma reads through its accumulator's table).  Tests feed
 * it outputs of their own making. */
int fj__lut_decode(fj_frag frag, const float *out, const fj_lut *luts,
                   fj_lut *lut, char *why, size_t size);

#endif /* FJ_LAYOUT_H */
