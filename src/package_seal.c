/*
 * package_seal.c -- making a prewarmed disk cache directory a kernel
 * package (fj_cache_package_seal): the layout probe's kernel for the arch
 * added, so that a GPU context's first use compiles nothing either; the
 * manifest written (package.c); the package's size counted.
 */
#include <pthread.h>
#include <string.h>

#include "cache.h"
#include "ctx.h"
#include "kernel.h"
#include "layout.h"
#include "package.h"
#include "util.h"

typedef struct seal_count {
  fj_package_report *r;
} seal_count;

/* Kernels and render-index entries of this NVRTC and format; others are
 * never looked up (fj_cache_entry.valid says so). */
static int count_entry(void *user, const fj_cache_entry *e)
{
  fj_package_report *r = ((seal_count *)user)->r;
  if (e->valid && (!strcmp(e->kind, "kernel") || !strcmp(e->kind, "render"))) {
    r->entries++;
    r->bytes += e->bytes;
  }
  return 0;
}

fj_status fj_cache_package_seal(fj_ctx *ctx, fj_package_report *report)
{
  if (!ctx)
    return fj__null_arg(NULL, "fj_cache_package_seal", "ctx");
  fj__clear_error(ctx);
  if (ctx->package) {
    char shown[160];
    fj__quote(fj_cache_package_dir(ctx), shown, sizeof shown);
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "fj_cache_package_seal: the context reads the kernel "
                    "package %s, so its prewarm may have found kernels there "
                    "instead of writing them into this one: make a package "
                    "with package_dir \"\" (no package read)",
                    shown);
  }
  const char *dir = fj_cache_dir(ctx);
  if (!dir)
    return fj__fail(ctx, FJ_ERR_NOT_FOUND,
                    "fj_cache_package_seal: the disk cache is disabled (the "
                    "package is the cache directory)");
  fj_package_report r = {0, 0, 0};
  fj_kernel *k;
  fj_cache_stats before, after;
  fj_cache_stats_get(ctx, &before);
  pthread_mutex_lock(&ctx->lock);
  fj_status st = fj__layout_probe_kernel(ctx, &k);
  pthread_mutex_unlock(&ctx->lock);
  fj_cache_stats_get(ctx, &after);
  r.probe = st == FJ_OK;
  /* The probe's entries are the package's as the prewarm's are: one that
   * stayed in memory is a package without it, never sealed. */
  if (st == FJ_OK && after.disk_errors != before.disk_errors)
    st = fj__fail(ctx, FJ_ERR_IO,
                  "fj_cache_package_seal: the layout probe's cache entries "
                  "could not be written to %s (the log names each): not "
                  "sealed", dir);
  /* Counted before the manifest is written: a seal that fails leaves
   * none. */
  seal_count sc = {&r};
  if (st == FJ_OK)
    st = fj_cache_list(ctx, count_entry, &sc);
  if (st == FJ_OK)
    st = fj__package_manifest_add(ctx, dir, ctx->arch);
  if (report)
    *report = r;
  return st;
}
