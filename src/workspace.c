/*
 * workspace.c -- the context's device scratch memory, one buffer per
 * stream (workspace.h).  Buffers grow by doubling and are freed only with
 * the context: a CUDA graph captured with one keeps its address.
 */
#include <stdlib.h>

#include "ctx.h"
#include "driver.h"
#include "workspace.h"

typedef struct fj_wbuf {
  void *stream;
  uint64_t ptr;
  size_t bytes;
} fj_wbuf;

struct fj_wspace {
  fj_wbuf *live;     /* one per stream */
  size_t nlive;
  uint64_t *retired; /* outgrown buffers, freed with the context */
  size_t nretired;
};

static fj_wbuf *find(fj_wspace *w, void *stream)
{
  for (size_t i = 0; i < w->nlive; i++)
    if (w->live[i].stream == stream)
      return &w->live[i];
  return NULL;
}

/* The stream's entry, added empty if it has none; NULL when out of memory. */
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
                    "%zu): run the call once before capturing, or pass a "
                    "workspace to fj_attention_fwd_plan",
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
