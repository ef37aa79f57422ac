/*
 * locked.h -- for the tests that call the library's internals directly:
 * an internal call whose contract says "ctx->lock held" (fj__kernel_build
 * and what builds through it releases the lock while NVRTC runs), made
 * with the lock held.
 */
#ifndef FJT_LOCKED_H
#define FJT_LOCKED_H

#include <pthread.h>

#include "ctx.h"

static inline fj_status fjt_unlock(fj_ctx *ctx, fj_status st)
{
  pthread_mutex_unlock(&ctx->lock);
  return st;
}

/* expr, evaluated with ctx->lock held; its status. */
#define FJT_LOCKED(ctx, expr) \
  (pthread_mutex_lock(&(ctx)->lock), fjt_unlock((ctx), (expr)))

#endif /* FJT_LOCKED_H */
