/*
 * package.h -- a read-only kernel package: a directory of disk-cache
 * entries (compiled kernels and the render index, as a prewarmed cache
 * holds them) with a manifest naming the NVRTC version, the cache format
 * and the architectures they were made for.  A context consults it after
 * its own disk cache and never writes it.
 */
#ifndef FJ_PACKAGE_H
#define FJ_PACKAGE_H

#include <stddef.h>

#include "cache.h"
#include "ctx.h"

/* The manifest's file name inside a package directory. */
#define FJ_PACKAGE_MANIFEST "flashjit-package.txt"
/* The manifest's first line; its version is bumped when its meaning
 * changes. */
#define FJ_PACKAGE_MAGIC "flashjit package 1"

/* The package of fj_ctx_opts.package_dir, else $FLASHJIT_PACKAGE_DIR,
 * else none.  A package this context cannot use -- no manifest, another
 * NVRTC version or cache format, not made for the context's arch -- is
 * logged as a warning and left out; only a path over 4095 bytes fails
 * (FJ_ERR_INVALID_ARG). */
fj_status fj__package_open(fj_ctx *ctx);
void fj__package_close(fj_package *p);
/* 1 and the payload (malloc'd) when the package holds an entry of this
 * kind ("kernel" or "render": no other kind is looked up) under this key,
 * read by the disk cache's reader (fj__cache_entry_load); 0 otherwise (a
 * missing entry silently, a corrupt or foreign one with a warning).  The
 * payload is the caller's to check as input, as a disk-cache entry's is
 * (entry.c).  Counts nothing. */
int fj__package_load(fj_ctx *ctx, const char *kind, const fj_cache_key *key,
                     void **payload, size_t *len);
/* Whether the manifest of dir says this process can use the package for
 * arch: 1, or 0 with the reason in why ("has no manifest", "was made by
 * NVRTC 12.8; this process has 13.0", "holds no kernels for sm_80 (it
 * has sm_90a)"). */
int fj__package_usable(const char *dir, const char *arch, char *why,
                       size_t n);
/* Writes (or extends) dir's manifest with arch, atomically: a temporary
 * file renamed into place.  A manifest of another NVRTC version or cache
 * format is refused (FJ_ERR_INVALID_ARG, naming both): one package holds
 * one toolkit's kernels. */
fj_status fj__package_manifest_add(fj_ctx *ctx, const char *dir,
                                   const char *arch);

#endif /* FJ_PACKAGE_H */
