/*
 * workspace.h -- device memory the context lends to launches that need
 * scratch space (split-KV partials): one buffer per stream and thread, so
 * that one thread's launches on a stream reuse it in stream order, and
 * launches on two streams, or two threads' on one stream (enqueued with no
 * lock between their launches), never share one.
 */
#ifndef FJ_WORKSPACE_H
#define FJ_WORKSPACE_H

#include <stddef.h>
#include <stdint.h>

#include "ctx.h"

/* At least `bytes` of device memory for the calling thread's work on
 * `stream`; the caller has
 * entered the CUDA context.  A buffer is never freed before the context is
 * (a captured graph may hold its address): growing one retires the old.
 * While the stream is being captured nothing is allocated, and a request
 * the stream's buffer cannot hold fails with FJ_ERR_INVALID_ARG. */
fj_status fj__workspace(fj_ctx *ctx, void *stream, size_t bytes,
                        uint64_t *dptr);
/* Frees every buffer (fj_ctx_destroy). */
void fj__workspace_free(fj_ctx *ctx);

#endif /* FJ_WORKSPACE_H */
