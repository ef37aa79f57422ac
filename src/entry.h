/*
 * entry.h -- the payloads of the disk cache's compiler entries: a kernel's
 * (its log, PTX, cubin and compile time) and a render's (the template's
 * metadata and the rendered source), written, read, and checked as what
 * this library could have made before anything from a cache directory, a
 * kernel package or a cache pack reaches NVRTC or the driver.
 */
#ifndef FJ_ENTRY_H
#define FJ_ENTRY_H

#include <stddef.h>

#include "compile.h"
#include "template.h"
#include "util.h"

/* A kernel entry's payload from c; 0, or -1 out of memory. */
int fj__kernel_payload(const fj_compiled *c, fj_buf *out);
/* A kernel entry's payload into c (each part malloc'd); 0, or -1 when it
 * is not one (c left empty). */
int fj__kernel_payload_read(const void *payload, size_t len, fj_compiled *c);
/* A kernel entry's payload from outside this process's compiles (the disk
 * cache, a kernel package, a cache pack) checked as input and read into
 * c: NULL, or what is wrong (c left empty) -- not a kernel's parts, or an
 * empty PTX or cubin, which no compile makes. */
const char *fj__kernel_payload_check(const void *payload, size_t len,
                                     fj_compiled *c);

/* A render entry's payload: the metadata, then the source. */
int fj__render_payload(const fj_kmeta *meta, const char *src, size_t len,
                       fj_buf *out);
/* Checks a render entry's payload as a render would have made it: its
 * metadata by the template's rules (fj__kmeta_wrong) and its source by
 * fj__source_wrong.  NULL with *meta, *src and *len filled (src points
 * into payload, not NUL-terminated), or what is wrong (in why, n bytes). */
const char *fj__render_payload_read(const void *payload, size_t len,
                                    fj_kmeta *meta, const char **src,
                                    size_t *src_len, char *why, size_t n);
/* What is wrong with a rendered source that did not come from this
 * process's render: NULL when it includes nothing but the toolkit headers
 * the templates include (<cuda_fp16.h>, <cuda_bf16.h>, <cuda_fp8.h>,
 * <mma.h>) and has no other preprocessor directive than #define, #undef,
 * #line and #pragma unroll; a NUL byte, a trigraph, a line continuation,
 * _Pragma and __has_include are refused too (each could name or read a
 * file of the host, whose text NVRTC would print in its log).  Else why,
 * written into why (n bytes). */
const char *fj__source_wrong(const char *src, size_t len, char *why,
                             size_t n);

#endif /* FJ_ENTRY_H */
