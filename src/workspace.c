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
  return b;
}

static fj_status grow(fj_ctx *ctx, fj_wspace *w, fj_wbuf *b, size_t bytes)
{
  size_t want = b->bytes ? b->bytes : 1u << 20;
  while (want < bytes)
    want = want > SIZE_MAX / 2 ? bytes : want * 2;
  uint64_t *r = realloc(w->retired, (w->nretired + 1) * sizeof *r);
  if (!r)
    return fj__fail(ctx, FJ_ERR_NOMEM, "out of memory");
  w->retired = r;
  uint64_t ptr;
  fj_status st = fj__cu_alloc(ctx, want, &ptr);
  if (st != FJ_OK)
    return st;
  if (b->ptr)
    w->retired[w->nretired++] = b->ptr;
  b->ptr = ptr;
  b->bytes = want;
  return FJ_OK;
}

fj_status fj__workspace(fj_ctx *ctx, void *stream, size_t bytes,
                        uint64_t *dptr)
{
  pthread_mutex_lock(&ctx->lock);
  fj_status st = FJ_OK;
  if (!ctx->workspaces && !(ctx->workspaces = calloc(1, sizeof *ctx->workspaces)))
    st = fj__fail(ctx, FJ_ERR_NOMEM, "out of memory");
  fj_wbuf *b = st == FJ_OK ? entry(ctx->workspaces, stream) : NULL;
  if (st == FJ_OK && !b)
    st = fj__fail(ctx, FJ_ERR_NOMEM, "out of memory");
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
      st = grow(ctx, ctx->workspaces, b, bytes);
  }
  if (st == FJ_OK)
    *dptr = b->ptr;
  pthread_mutex_unlock(&ctx->lock);
  return st;
}

void fj__workspace_free(fj_ctx *ctx)
{
  fj_wspace *w = ctx->workspaces;
  if (!w)
    return;
  if (fj__cu_enter(ctx) == FJ_OK) {
    for (size_t i = 0; i < w->nlive; i++)
      fj__cu_free(w->live[i].ptr);
    for (size_t i = 0; i < w->nretired; i++)
      fj__cu_free(w->retired[i]);
    fj__cu_leave(ctx);
  }
  free(w->live);
  free(w->retired);
  free(w);
  ctx->workspaces = NULL;
}
