/*
 * cache.h -- the disk cache: single-file entries (header, key text, label,
 * checksum, payload) written atomically, keyed by everything an entry
 * depends on, the compiler's identity included; and the context's hit and
 * miss counters.
 */
#ifndef FJ_CACHE_H
#define FJ_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "ctx.h"

/* Bumped whenever the cache file format, the kernel ABI or the meaning of a
 * rendered template changes, so that older disk entries become misses. */
#define FJ_FORMAT_VERSION 3  /* 3: fj_kmeta's quick in render entries */

typedef struct fj_cache_key {
  char text[512];  /* everything the entry depends on */
  char hex[33];    /* XXH3-128 of text: the file name */
} fj_cache_key;

/* The key of an entry of `kind` for arch: the source's hash, NVRTC's
 * version and options (quick: a kernel's meta.quick's), the format
 * version, and `extra`. */
void fj__cache_key(fj_cache_key *key, const char *kind, const char *arch,
                   int quick, const char *source_hash, const char *extra);
fj_status fj__cache_open(fj_ctx *ctx);
void fj__cache_close(fj_cache *c);
/* 1 and the payload (malloc'd) on a valid hit; 0 on a miss, which also
 * covers corrupt, truncated and stale entries (counted as disk_rejects and
 * logged).  The payload is the caller's to check as input (entry.c). */
int fj__cache_load(fj_ctx *ctx, const char *kind, const fj_cache_key *key,
                   void **payload, size_t *len);
/* The path of key's entry file in dir (a cache directory or a kernel
 * package). */
void fj__cache_entry_path(const char *dir, const fj_cache_key *key,
                          char *out, size_t size);
/* The one reader of entry files, for the disk cache and the kernel
 * package (package.c) alike: the file at path read bounded and only if it
 * is a regular file (fj__open_file), its header, lengths and checksum
 * checked, its kind and whole key text compared with kind and key.  1 and
 * the payload (malloc'd); 0 with why empty when there is no file, or 0
 * with what is wrong with it in why ("is corrupt or stale (...)"). */
int fj__cache_entry_load(const char *path, const char *kind,
                         const fj_cache_key *key, void **payload, size_t *len,
                         char *why, size_t n);
/* Writes atomically (temp file + rename); failures are logged, counted and
 * otherwise ignored: the cache is an optimisation. */
void fj__cache_store(fj_ctx *ctx, const char *kind, const char *label,
                     const fj_cache_key *key, const void *payload, size_t len);
/* A store that never reached fj__cache_store (memory for its payload ran
 * out): logged and counted as a failed write, so that a prewarm, whose
 * work is the disk's entries, fails instead of sealing a package without
 * the entry. */
void fj__cache_store_lost(fj_ctx *ctx, const char *kind, const char *label);
void fj__cache_count(fj_ctx *ctx, fj_cache_origin origin);
/* A kernel the kernel package (package.c) answered; fj__cache_count
 * counted it as a disk hit. */
void fj__cache_count_package(fj_ctx *ctx);
/* The tiered JIT's counters (fj_cache_stats): a call the first kernel
 * answered, a compile started in the background.  ctx->lock held. */
void fj__cache_count_tier(fj_ctx *ctx, int first_launch, int background);

/* ---- whole entry files, for cache packs (cache_pack.c) ---- */

/* The largest entry file read or written. */
#define FJ_CACHE_ENTRY_MAX ((uint64_t)256 << 20)

/* An entry file's fields, pointing into its bytes. */
typedef struct fj_entry_view {
  const char *kind, *label, *key, *payload;
  uint32_t kind_len, label_len, key_len;
  uint64_t payload_len;
} fj_entry_view;

/* Checks the bytes of an entry file as a read of it would (magic, format,
 * lengths, checksum); NULL and the fields in *v when it is valid, else
 * what is wrong ("is corrupt or stale (...)"). */
const char *fj__cache_entry_parse(const void *data, size_t len,
                                  fj_entry_view *v);
/* 1 when an entry's key text names this process's cache format and NVRTC
 * version; an entry of another is never looked up (stale).  Otherwise 0,
 * and what made it in `why` ("made by NVRTC 11.8; this process has
 * 13.0"). */
int fj__cache_key_current(const char *key, size_t len, char *why,
                          size_t why_size);
/* Writes the bytes of an entry file as `name` in the cache directory,
 * atomically (temp file + rename); 0, or -1 with errno. */
int fj__cache_install(fj_ctx *ctx, const char *name, const void *data,
                      size_t len);

#endif /* FJ_CACHE_H */
