/*
 * cache.c -- the disk cache: one file per entry, named by the hash of its
 * key, holding a header, the full key text, a label, a checksum and the
 * payload.  Entries are written to a temporary file and renamed into place,
 * so a reader sees a whole entry or none, and processes sharing a directory
 * never see each other's partial writes.  Anything wrong with an entry --
 * bad magic, other format, truncation, checksum, a different key behind the
 * same name -- makes it a miss; the caller compiles and rewrites it.
 *
 * The memory cache of kernels lives in kernel.c; this file also keeps the
 * context's hit/miss counters.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache.h"
#include "compile.h"
#include "ctx.h"
#include "util.h"

#define ENTRY_MAGIC "FJCACHE1"
#define ENTRY_SUFFIX ".fjc"
#define TEMP_PREFIX ".tmp-"

typedef struct entry_header {
  char magic[8];
  uint32_t format;
  uint32_t kind_len;
  uint32_t label_len;
  uint32_t key_len;
  uint64_t payload_len;
  uint64_t checksum;  /* XXH3-64 of everything after the header */
} entry_header;

struct fj_cache {
  char dir[4096];
  int enabled;   /* entries are read */
  int writable;  /* entries are written */
  fj_cache_stats stats;
};

static uint64_t temp_counter;

/* ---- opening ------------------------------------------------------------------ */

static int default_dir(char *out, size_t size)
{
  const char *v = getenv("FLASHJIT_CACHE_DIR");
  if (v && *v)
    return snprintf(out, size, "%s", v) >= (int)size;
  v = getenv("XDG_CACHE_HOME");
  if (v && *v)
    return snprintf(out, size, "%s/flashjit", v) >= (int)size;
  v = getenv("HOME");
  if (v && *v)
    return snprintf(out, size, "%s/.cache/flashjit", v) >= (int)size;
  return -1;
}

fj_status fj__cache_open(fj_ctx *ctx)
{
  fj_cache *c = calloc(1, sizeof *c);
  if (!c)
    return fj__fail(ctx, FJ_ERR_NOMEM, "out of memory");
  ctx->cache = c;
  if (!ctx->opts.disk_cache)
    return FJ_OK;
  if (ctx->opts.cache_dir)
    snprintf(c->dir, sizeof c->dir, "%s", ctx->opts.cache_dir);
  else if (default_dir(c->dir, sizeof c->dir) != 0) {
    fj__log(ctx, FJ_LOG_WARN, "no cache directory (set FLASHJIT_CACHE_DIR "
                              "or HOME): caching in memory only");
    return FJ_OK;
  }
  if (fj__mkdirs(c->dir) != 0) {
    fj__log(ctx, FJ_LOG_WARN,
            "cache directory %s cannot be created (%s): caching in memory "
            "only",
            c->dir, strerror(errno));
    return FJ_OK;
  }
  c->enabled = 1;
  c->writable = access(c->dir, W_OK) == 0;
  if (!c->writable)
    fj__log(ctx, FJ_LOG_WARN,
            "cache directory %s is not writable: reading existing entries, "
            "keeping new ones in memory only",
            c->dir);
  c->stats.disk_enabled = 1;
  return FJ_OK;
}

void fj__cache_close(fj_cache *c)
{
  free(c);
}

const char *fj_cache_dir(const fj_ctx *ctx)
{
  return ctx && ctx->cache && ctx->cache->enabled ? ctx->cache->dir : NULL;
}

void fj__cache_count(fj_ctx *ctx, fj_cache_origin origin)
{
  fj_cache_stats *s = &ctx->cache->stats;
  if (origin == FJ_CACHE_MEMORY)
    s->memory_hits++;
  else if (origin == FJ_CACHE_DISK)
    s->disk_hits++;
  else
    s->misses++;
}

void fj_cache_stats_get(fj_ctx *ctx, fj_cache_stats *stats)
{
  pthread_mutex_lock(&ctx->lock);
  *stats = ctx->cache->stats;
  pthread_mutex_unlock(&ctx->lock);
}

/* ---- keys ---------------------------------------------------------------------- */

void fj__cache_key(fj_cache_key *key, const char *kind, const char *arch,
                   const char *source_hash, const char *extra)
{
  fj_nvrtc_opts o;
  fj__nvrtc_options(arch, &o);
  int n = snprintf(key->text, sizeof key->text,
                   "flashjit format=%d\nkind=%s\nnvrtc=%s\nsource=%s\n%s\n"
                   "options=",
                   FJ_FORMAT_VERSION, kind, fj__nvrtc_version(), source_hash,
                   extra ? extra : "");
  for (int i = 0; i < o.argc && n > 0 && (size_t)n < sizeof key->text; i++)
    n += snprintf(key->text + n, sizeof key->text - (size_t)n, "%s%s",
                  i ? " " : "", o.argv[i]);
  fj__hash_hex(key->text, strlen(key->text), key->hex);
}

/* ---- reading ------------------------------------------------------------------- */

static void entry_path(const fj_cache *c, const char *hex, char *out,
                       size_t size)
{
  snprintf(out, size, "%s/%s%s", c->dir, hex, ENTRY_SUFFIX);
}

/* Checks a whole entry in memory; fills the pointers into it on success. */
static int entry_parse(const char *data, size_t len, const char **kind,
                       const char **label, const char **key,
                       const char **payload, entry_header *h)
{
  if (len < sizeof *h)
    return -1;
  memcpy(h, data, sizeof *h);
  if (memcmp(h->magic, ENTRY_MAGIC, 8) != 0 || h->format != FJ_FORMAT_VERSION)
    return -1;
  uint64_t body = (uint64_t)h->kind_len + h->label_len + h->key_len +
                  h->payload_len;
  if (body != len - sizeof *h)
    return -1;
  const char *p = data + sizeof *h;
  if (fj__hash64(p, (size_t)body) != h->checksum)
    return -1;
  *kind = p;
  *label = p + h->kind_len;
  *key = *label + h->label_len;
  *payload = *key + h->key_len;
  return 0;
}

static int field_is(const char *p, uint32_t len, const char *want)
{
  return strlen(want) == len && memcmp(p, want, len) == 0;
}

int fj__cache_load(fj_ctx *ctx, const char *kind, const fj_cache_key *key,
                   void **payload, size_t *len)
{
  fj_cache *c = ctx->cache;
  if (!c->enabled)
    return 0;
  char path[4200];
  entry_path(c, key->hex, path, sizeof path);
  size_t n = 0;
  char *data = fj__file_read(path, &n);
  if (!data)
    return 0;
  const char *k, *label, *text, *pl;
  entry_header h;
  int ok = entry_parse(data, n, &k, &label, &text, &pl, &h) == 0 &&
           field_is(k, h.kind_len, kind) &&
           field_is(text, h.key_len, key->text);
  if (ok && (*payload = fj__memdup(pl, (size_t)h.payload_len)) != NULL)
    *len = (size_t)h.payload_len;
  else {
    ok = 0;
    c->stats.disk_rejects++;
    fj__log(ctx, FJ_LOG_WARN, "cache entry %s is corrupt or stale: ignored",
            path);
  }
  free(data);
  return ok;
}

/* ---- writing ------------------------------------------------------------------- */

static int write_entry(int fd, const entry_header *h, const char *kind,
                       const char *label, const char *key, const void *payload)
{
  const void *parts[] = {h, kind, label, key, payload};
  size_t sizes[] = {sizeof *h, h->kind_len, h->label_len, h->key_len,
                    (size_t)h->payload_len};
  for (size_t i = 0; i < FJ_ARRAY_LEN(parts); i++)
    if (fj__write_all(fd, parts[i], sizes[i]) != 0)
      return -1;
  return 0;
}

static uint64_t entry_checksum(const char *kind, const char *label,
                               const char *key, const void *payload,
                               size_t len)
{
  fj_buf b = {0};
  if (fj__buf_append(&b, kind, strlen(kind)) ||
      fj__buf_append(&b, label, strlen(label)) ||
      fj__buf_append(&b, key, strlen(key)) ||
      fj__buf_append(&b, payload, len)) {
    fj__buf_free(&b);
    return 0;
  }
  uint64_t sum = fj__hash64(b.data, b.len);
  fj__buf_free(&b);
  return sum;
}

void fj__cache_store(fj_ctx *ctx, const char *kind, const char *label,
                     const fj_cache_key *key, const void *payload, size_t len)
{
  fj_cache *c = ctx->cache;
  if (!c->enabled || !c->writable)
    return;
  entry_header h;
  memcpy(h.magic, ENTRY_MAGIC, 8);
  h.format = FJ_FORMAT_VERSION;
  h.kind_len = (uint32_t)strlen(kind);
  h.label_len = (uint32_t)strlen(label);
  h.key_len = (uint32_t)strlen(key->text);
  h.payload_len = len;
  h.checksum = entry_checksum(kind, label, key->text, payload, len);
  char tmp[4300], path[4200];
  snprintf(tmp, sizeof tmp, "%s/" TEMP_PREFIX "%ld-%llu-%s", c->dir,
           (long)getpid(),
           (unsigned long long)__atomic_add_fetch(&temp_counter, 1,
                                                  __ATOMIC_RELAXED),
           key->hex);
  entry_path(c, key->hex, path, sizeof path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
  int bad = fd < 0 || write_entry(fd, &h, kind, label, key->text, payload);
  int err = errno;
  if (fd >= 0 && close(fd) != 0 && !bad) {
    bad = 1;
    err = errno;
  }
  if (!bad && rename(tmp, path) != 0) {
    bad = 1;
    err = errno;
  }
  if (bad) {
    unlink(tmp);
    c->stats.disk_errors++;
    fj__log(ctx, FJ_LOG_WARN,
            "cannot write cache entry %s (%s): kept in memory only", path,
            strerror(err));
    return;
  }
  c->stats.disk_writes++;
}

/* ---- listing and clearing -------------------------------------------------------- */

static int name_cmp(const void *a, const void *b)
{
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The sorted names of the directory's entries (and temporaries if asked);
 * -1 with errno if the directory cannot be read. */
static int dir_names(const char *dir, int temps, char ***out, size_t *count)
{
  DIR *d = opendir(dir);
  if (!d)
    return -1;
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    size_t len = strlen(e->d_name);
    int entry = len > 4 && strcmp(e->d_name + len - 4, ENTRY_SUFFIX) == 0;
    int temp = temps && strncmp(e->d_name, TEMP_PREFIX, 5) == 0;
    if (!entry && !temp)
      continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 64;
      char **p = realloc(names, cap * sizeof *names);
      if (!p)
        break;
      names = p;
    }
    if ((names[n] = fj__strdup(e->d_name)) != NULL)
      n++;
  }
  closedir(d);
  if (names)
    qsort(names, n, sizeof *names, name_cmp);
  *out = names;
  *count = n;
  return 0;
}

static void free_names(char **names, size_t n)
{
  for (size_t i = 0; i < n; i++)
    free(names[i]);
  free(names);
}

static int visit_entry(const fj_cache *c, const char *name,
                       fj_cache_visit_fn fn, void *user)
{
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", c->dir, name);
  struct stat st;
  if (stat(path, &st) != 0)
    return 0;
  size_t n = 0;
  char *data = fj__file_read(path, &n);
  const char *kind, *label, *key, *payload;
  entry_header h;
  char kind_s[32] = "?", label_s[256] = "?";
  fj_cache_entry e = {name, kind_s, label_s, (uint64_t)st.st_size,
                      (int64_t)st.st_mtime, 0};
  if (data && entry_parse(data, n, &kind, &label, &key, &payload, &h) == 0) {
    snprintf(kind_s, sizeof kind_s, "%.*s", (int)h.kind_len, kind);
    snprintf(label_s, sizeof label_s, "%.*s", (int)h.label_len, label);
    e.valid = 1;
  }
  free(data);
  return fn(user, &e);
}

/* The disk cache's file names, for listing and clearing. */
static fj_status cache_names(fj_ctx *ctx, int temps, char ***names, size_t *n)
{
  fj_cache *c = ctx->cache;
  if (!c->enabled)
    return fj__fail(ctx, FJ_ERR_NOT_FOUND, "the disk cache is disabled");
  if (dir_names(c->dir, temps, names, n) != 0)
    return fj__fail(ctx, FJ_ERR_IO, "cannot read %s: %s", c->dir,
                    strerror(errno));
  return FJ_OK;
}

fj_status fj_cache_list(fj_ctx *ctx, fj_cache_visit_fn fn, void *user)
{
  if (!ctx || !fn)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG, "fj_cache_list: NULL argument");
  fj__clear_error(ctx);
  size_t n = 0;
  char **names = NULL;
  fj_status st = cache_names(ctx, 0, &names, &n);
  for (size_t i = 0; st == FJ_OK && i < n; i++)
    if (visit_entry(ctx->cache, names[i], fn, user))
      break;
  free_names(names, n);
  return st;
}

fj_status fj_cache_clear(fj_ctx *ctx, int *removed)
{
  if (!ctx)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG, "fj_cache_clear: ctx is NULL");
  fj__clear_error(ctx);
  fj_cache *c = ctx->cache;
  size_t n = 0;
  char **names = NULL;
  fj_status st = cache_names(ctx, 1, &names, &n);
  if (st != FJ_OK)
    return st;
  int count = 0;
  for (size_t i = 0; i < n; i++) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", c->dir, names[i]);
    if (unlink(path) == 0)
      count++;
    else if (errno != ENOENT && st == FJ_OK)
      st = fj__fail(ctx, FJ_ERR_IO, "cannot remove %s: %s", path,
                    strerror(errno));
  }
  free_names(names, n);
  if (removed)
    *removed = count;
  return st;
}
