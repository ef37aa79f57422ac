/*
 * workspace.c -- the context's device scratch memory, one buffer per
 * stream and thread (workspace.h).  Buffers grow by doubling and are freed
 * only with the context: a CUDA graph captured with one keeps its address.
 */
#include <pthread.h>
#include <stdlib.h>

#include "ctx.h"
#include "driver.h"
#include "workspace.h"

typedef struct fj_wbuf {
  void *stream;
  pthread_t thread;  /* whose calls on the stream take it */
  uint64_t ptr;
  size_t bytes;
  /* The fused combine's counters (fj__workspace_counters): apart from the
   * buffer above, which every kind of call writes, and 0 between calls. */
  uint64_t counters;
  size_t counter_bytes;
} fj_wbuf;

struct fj_wspace {
  fj_wbuf *live;     /* one per (stream, thread) */
  size_t nlive;
  uint64_t *retired; /* outgrown buffers, freed with the context */
  size_t nretired;
};

/* The calling thread's buffer for stream.  By thread too: two threads'
 * calls on one stream (the default stream, say) enqueue their launches
 * without a lock between them, so one buffer would take the second call's
 * partials (or counter, or V^T) before the first call's kernels read
 * them. */
static fj_wbuf *find(fj_wspace *w, void *stream)
{
  pthread_t self = pthread_self();
  for (size_t i = 0; i < w->nlive; i++)
    if (w->live[i].stream == stream && pthread_equal(w->live[i].thread, self))
      return &w->live[i];
  return NULL;
}

/* The entry of (stream, this thread), added empty if it has none; NULL
 * when out of memory. */
static fj_wbuf *entry(fj_wspace *w, void *stream)
{
  fj_wbuf *b = find(w, stream);
  if (b)
    return b;
  fj_wbuf *grown = realloc(w->live, (w->nlive + 1) * sizeof *grown);
  if (!grown)
    return NULL;
  w->live = grown;
  b = &w->live[w->nlive++];
  b->stream = stream;
  b->thread = pthread_self();
  b->ptr = 0;
  b->bytes = 0;
  b->counters = 0;
  b->counter_bytes = 0;
  return b;
}

/* The calling thread's entry for stream, the context's list made on
 * first use; NULL (and *st set) when out of memory.  ctx->lock held. */
static fj_wbuf *stream_entry(fj_ctx *ctx, void *stream, fj_status *st)
{
  fj_wbuf *b = NULL;
  if (ctx->workspaces || (ctx->workspaces = calloc(1, sizeof *ctx->workspaces)))
    b = entry(ctx->workspaces, stream);
  *st = b ? FJ_OK : fj__fail(ctx, FJ_ERR_NOMEM, "out of memory");
  return b;
}

/* Grows the buffer *ptr of *have bytes to `bytes` or more, doubling from
 * *have (or `first`); the old buffer is retired, not freed. */
static fj_status grow(fj_ctx *ctx, fj_wspace *w, uint64_t *ptr, size_t *have,
                      size_t bytes, size_t first)
{
  size_t want = *have ? *have : first;
  while (want < bytes)
    want = want > SIZE_MAX / 2 ? bytes : want * 2;
  uint64_t *r = realloc(w->retired, (w->nretired + 1) * sizeof *r);
  if (!r)
    return fj__fail(ctx, FJ_ERR_NOMEM, "out of memory");
  w->retired = r;
  uint64_t fresh;
  fj_status st = fj__cu_alloc(ctx, want, &fresh);
  if (st != FJ_OK)
    return st;
  if (*ptr)
    w->retired[w->nretired++] = *ptr;
  *ptr = fresh;
  *have = want;
  return FJ_OK;
}

fj_status fj__workspace(fj_ctx *ctx, void *stream, size_t bytes,
                        uint64_t *dptr)
{
  pthread_mutex_lock(&ctx->lock);
  fj_status st;
  fj_wbuf *b = stream_entry(ctx, stream, &st);
  if (st == FJ_OK && b->bytes < bytes) {
    int capturing = 0;
    st = fj__cu_capturing(ctx, stream, &capturing);
    if (st == FJ_OK && capturing)
      st = fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "the call needs a workspace of %zu bytes and stream %p "
                    "is being captured into a CUDA graph, where the context "
                    "cannot allocate (its workspace for that stream holds "
                    "%zu): run the call once on this thread and stream before "
                    "capturing, or pass a workspace to fj_attention_fwd_plan",
                    bytes, stream, b->bytes);
    if (st == FJ_OK)
      st = grow(ctx, ctx->workspaces, &b->ptr, &b->bytes, bytes, 1u << 20);
  }
  if (st == FJ_OK)
    *dptr = b->ptr;
  pthread_mutex_unlock(&ctx->lock);
  return st;
}

fj_status fj__workspace_counters(fj_ctx *ctx, void *stream, size_t words,
                                 uint64_t *dptr)
{
  *dptr = 0;
  pthread_mutex_lock(&ctx->lock);
  fj_status st;
  fj_wbuf *b = stream_entry(ctx, stream, &st);
  size_t bytes = words * sizeof(unsigned);
  if (st == FJ_OK && b->counter_bytes < bytes) {
    int capturing = 0;
    st = fj__cu_capturing(ctx, stream, &capturing);
    if (st == FJ_OK && !capturing)
      st = grow(ctx, ctx->workspaces, &b->counters, &b->counter_bytes, bytes, 4096);
    /* Zeroed in stream order, before the call's kernel counts (a failed
     * zeroing leaves none, so the next call grows them again). */
    if (st == FJ_OK && !capturing &&
        (st = fj__cu_memset32_async(ctx, b->counters, 0, b->counter_bytes / 4,
                                    stream)) != FJ_OK)
      b->counter_bytes = 0;
  }
  if (st == FJ_OK && b->counter_bytes >= bytes)
    *dptr = b->counters;
  pthread_mutex_unlock(&ctx->lock);
  return st;
}

void fj__workspace_free(fj_ctx *ctx)
{
  fj_wspace *w = ctx->workspaces;
  if (!w)
    return;
  if (fj__cu_enter(ctx) == FJ_OK) {
    for (size_t i = 0; i < w->nlive; i++) {
      fj__cu_free(w->live[i].ptr);
      fj__cu_free(w->live[i].counters);
    }
    for (size_t i = 0; i < w->nretired; i++)
      fj__cu_free(w->retired[i]);
    fj__cu_leave(ctx);
  }
  free(w->live);
  free(w->retired);
  free(w);
  ctx->workspaces = NULL;
}
