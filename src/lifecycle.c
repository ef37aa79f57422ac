/*
 * lifecycle.c -- creating and destroying a context: the top of the
 * library's layers, the one file that opens and closes every module's part
 * of a context (driver, cache, templates, kernels, tuning database,
 * dispatch caches).
 */
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "cache.h"
#include "compile.h"
#include "ctx.h"
#include "driver.h"
#include "kernel.h"
#include "package.h"
#include "template.h"
#include "tier.h"
#include "tunedb.h"
#include "util.h"
#include "workspace.h"

void fj_ctx_opts_init(fj_ctx_opts *opts)
{
  if (!opts)
    return;
  memset(opts, 0, sizeof *opts);
  opts->device = 0;
  opts->disk_cache = 1;
  opts->jit_tiers = 1;
}

static fj_status ctx_init(fj_ctx *ctx, const fj_ctx_opts *opts)
{
  if (opts->device < -1)
    return fj__fail(NULL, FJ_ERR_INVALID_ARG,
                    "device %d is invalid: use an ordinal >= 0, or -1 for a "
                    "compile-only context",
                    opts->device);
  if (opts->device == -1 && !opts->arch)
    return fj__fail(NULL, FJ_ERR_INVALID_ARG,
                    "a compile-only context (device -1) needs an arch, e.g. "
                    "sm_90a");
  if (opts->sm_count < 0 || opts->sm_count > 1024)
    return fj__fail(NULL, FJ_ERR_INVALID_ARG,
                    "sm_count %d is invalid: 0 (the device's, or the "
                    "architecture's largest part) or 1..1024",
                    opts->sm_count);
  if (opts->disk_cache != 0 && opts->disk_cache != 1)
    return fj__fail(NULL, FJ_ERR_INVALID_ARG,
                    "disk_cache %d is invalid: 0 (memory only) or 1 (the "
                    "disk cache)",
                    opts->disk_cache);
  if (opts->isolate_compile != 0 && opts->isolate_compile != 1)
    return fj__fail(NULL, FJ_ERR_INVALID_ARG,
                    "isolate_compile %d is invalid: 0 (in this process) or 1 "
                    "(in a child process)",
                    opts->isolate_compile);
  /* "" is no directory: it would turn the disk cache off unsaid. */
  if (opts->cache_dir && !opts->cache_dir[0])
    return fj__fail(NULL, FJ_ERR_INVALID_ARG,
                    "cache_dir \"\" is empty: a directory, NULL for the "
                    "default one, or disk_cache 0 for memory only");
  if (opts->jit_tiers != 0 && opts->jit_tiers != 1)
    return fj__fail(NULL, FJ_ERR_INVALID_ARG,
                    "jit_tiers %d is invalid: 0 (compile, then launch) or 1 "
                    "(the first kernel while the chosen one compiles)",
                    opts->jit_tiers);
  ctx->opts = *opts;
  const char *tiers = getenv("FLASHJIT_JIT_TIERS");
  if (tiers && (!strcmp(tiers, "0") || !strcmp(tiers, "1")))
    ctx->opts.jit_tiers = tiers[0] == '1';
  else if (tiers && *tiers)
    return fj__fail(NULL, FJ_ERR_INVALID_ARG,
                    "FLASHJIT_JIT_TIERS=%s is invalid: 0 or 1", tiers);
  ctx->opts.arch = NULL;
  ctx->opts.cache_dir = NULL;
  if (opts->device >= 0) {
    fj_status st = fj__cu_open_device(ctx);
    if (st != FJ_OK)
      return st;
    ctx->has_device = 1;
    if (opts->sm_count && opts->sm_count != ctx->dev.sm_count)
      return fj__fail(NULL, FJ_ERR_INVALID_ARG,
                      "sm_count %d is invalid on a GPU context: device %d "
                      "has %d multiprocessors (leave it 0)",
                      opts->sm_count, opts->device, ctx->dev.sm_count);
  }
  fj_status st = fj__ctx_set_arch(ctx, opts->arch);
  /* An arch asked for must be one NVRTC targets, said up front. */
  if (st == FJ_OK && opts->arch)
    st = fj__nvrtc_check_arch(opts->arch, ctx->sm, ctx->arch_specific);
  if (st != FJ_OK)
    return st;
  if (opts->cache_dir && !(ctx->opts.cache_dir = fj__strdup(opts->cache_dir)))
    return fj__fail(NULL, FJ_ERR_NOMEM, "out of memory");
  st = fj__cache_open(ctx);
  if (st == FJ_OK)
    st = fj__package_open(ctx);
  /* The package's path is copied there; the caller's string is not kept. */
  ctx->opts.package_dir = NULL;
  return st;
}

fj_status fj_ctx_create(fj_ctx **out, const fj_ctx_opts *opts)
{
  fj__clear_error(NULL);
  if (!out)
    return fj__null_arg(NULL, "fj_ctx_create", "ctx");
  *out = NULL;
  fj_ctx_opts defaults;
  if (!opts) {
    fj_ctx_opts_init(&defaults);
    opts = &defaults;
  }
  fj_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx)
    return fj__fail(NULL, FJ_ERR_NOMEM, "out of memory");
  pthread_mutex_init(&ctx->lock, NULL);
  /* Serial 0 until the context exists for the caller: messages of a failed
   * creation belong to fj_errmsg(NULL). */
  fj_status st = ctx_init(ctx, opts);
  if (st != FJ_OK) {
    fj_ctx_destroy(ctx);
    return st;
  }
  fj__ctx_serial(ctx);
  *out = ctx;
  return FJ_OK;
}

void fj_ctx_destroy(fj_ctx *ctx)
{
  if (!ctx)
    return;
  fj__tier_free(ctx);  /* its compiles end before the caches close */
  fj__kernel_ahead_free(ctx);
  fj__workspace_free(ctx);
  /* Modules are unloaded from their own context, whichever context the
   * calling thread has current (another device's, or none). */
  int entered = ctx->has_device && fj__cu_enter(ctx) == FJ_OK;
  fj__kmap_free(ctx->kernels);
  if (entered)
    fj__cu_leave(ctx);
  fj__tunedb_free(ctx->tunedb);
  fj__dispatch_free(ctx->dispatch);
  free(ctx->bwd_memo);
  fj__tpl_close(ctx->tpl);
  fj__cache_close(ctx->cache);
  fj__package_close(ctx->package);
  if (ctx->has_device)
    fj__cu_close_device(ctx);
  free((char *)ctx->opts.cache_dir);
  pthread_mutex_destroy(&ctx->lock);
  free(ctx);
}

