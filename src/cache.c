/*
 * cache.c -- the disk cache: one file per entry, named by the hash of its
 * key, holding a header, the full key text, a label, a checksum and the
 * payload.  Entries are written to a temporary file and renamed into place,
 * so a reader sees a whole entry or none, and processes sharing a directory
 * never see each other's partial writes.  Anything wrong with an entry --
 * bad magic, other format, truncation, checksum, a different key behind the
 * same name -- makes it a miss; the caller compiles and rewrites it.
 * Files are read bounded and without blocking: anything in the directory
 * that is not a regular file of a plausible size (a FIFO, a link, a
 * device, a 2 GB file) is refused before its contents are read, and a
 * header's lengths are checked against the file's size before anything is
 * allocated for them.
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
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "compile.h"
#include "ctx.h"
#include "util.h"

#define ENTRY_MAGIC "FJCACHE1"
#define ENTRY_SUFFIX ".fjc"
#define TEMP_PREFIX ".tmp-"
/* A temporary file this old is a stray (its writer died before the
 * rename): fj_cache_clear removes it, not younger ones. */
#define TEMP_STALE_S 600
/* The largest entry read: a kernel's cubin, PTX and log take a few MB. */
#define ENTRY_MAX FJ_CACHE_ENTRY_MAX

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

/* ---- opening ------------------------------------------------------------------ */

/* The default directory from the environment: 0, -1 when none is set,
 * or 1 when it is too long (*from names the variable). */
static int default_dir(char *out, size_t size, const char **from)
{
  const char *v = getenv(*from = "FLASHJIT_CACHE_DIR");
  if (v && *v)
    return snprintf(out, size, "%s", v) >= (int)size;
  v = getenv(*from = "XDG_CACHE_HOME");
  if (v && *v)
    return snprintf(out, size, "%s/flashjit", v) >= (int)size;
  v = getenv(*from = "HOME");
  if (v && *v)
    return snprintf(out, size, "%s/.cache/flashjit", v) >= (int)size;
  return -1;
}

/* The directory from the environment, or a warning why there is none. */
static int env_dir(fj_ctx *ctx, fj_cache *c)
{
  const char *from;
  int rc = default_dir(c->dir, sizeof c->dir, &from);
  if (rc < 0)
    fj__log(ctx, FJ_LOG_WARN, "no cache directory (set FLASHJIT_CACHE_DIR "
                              "or HOME): caching in memory only");
  else if (rc > 0)
    fj__log(ctx, FJ_LOG_WARN, "the cache directory from $%s is over %zu "
                              "bytes: caching in memory only",
            from, sizeof c->dir - 1);
  return rc;
}

fj_status fj__cache_open(fj_ctx *ctx)
{
  fj_cache *c = calloc(1, sizeof *c);
  if (!c)
    return fj__fail(ctx, FJ_ERR_NOMEM, "out of memory");
  ctx->cache = c;
  if (!ctx->opts.disk_cache)
    return FJ_OK;
  if (ctx->opts.cache_dir && strlen(ctx->opts.cache_dir) >= sizeof c->dir)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "cache_dir is %zu bytes long: at most %zu",
                    strlen(ctx->opts.cache_dir), sizeof c->dir - 1);
  if (ctx->opts.cache_dir)
    snprintf(c->dir, sizeof c->dir, "%s", ctx->opts.cache_dir);
  else if (env_dir(ctx, c) != 0)
    return FJ_OK;
  char shown[160];
  fj__quote(c->dir, shown, sizeof shown);
  if (fj__mkdirs(c->dir) != 0) {
    fj__log(ctx, FJ_LOG_WARN,
            "cache directory %s cannot be created (%s): caching in memory "
            "only",
            shown, strerror(errno));
    return FJ_OK;
  }
  c->enabled = 1;
  c->writable = access(c->dir, W_OK) == 0;
  if (!c->writable)
    fj__log(ctx, FJ_LOG_WARN,
            "cache directory %s is not writable: reading existing entries, "
            "keeping new ones in memory only",
            shown);
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

void fj__cache_count_package(fj_ctx *ctx)
{
  ctx->cache->stats.package_hits++;
}

void fj__cache_count_tier(fj_ctx *ctx, int first_launch, int background)
{
  ctx->cache->stats.first_launches += (uint64_t)first_launch;
  ctx->cache->stats.background_compiles += (uint64_t)background;
}

void fj_cache_stats_get(fj_ctx *ctx, fj_cache_stats *stats)
{
  if (!ctx || !stats)
    return;
  pthread_mutex_lock(&ctx->lock);
  *stats = ctx->cache->stats;
  pthread_mutex_unlock(&ctx->lock);
}

/* ---- keys ---------------------------------------------------------------------- */

void fj__cache_key(fj_cache_key *key, const char *kind, const char *arch,
                   int quick, const char *source_hash, const char *extra)
{
  fj_nvrtc_opts o;
  fj__nvrtc_options(arch, quick, &o);
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

/* The value of `name=` in a key's text, up to its line's end, into out. */
static void key_field(const char *key, size_t len, const char *name,
                      char *out, size_t size)
{
  size_t nl = strlen(name);
  snprintf(out, size, "?");
  for (size_t i = 0; i + nl <= len; i++)
    if ((i == 0 || key[i - 1] == '\n') && !memcmp(key + i, name, nl)) {
      size_t j = i + nl;
      while (j < len && key[j] != '\n')
        j++;
      snprintf(out, size, "%.*s", (int)(j - i - nl), key + i + nl);
      return;
    }
}

int fj__cache_key_current(const char *key, size_t len, char *why,
                          size_t why_size)
{
  char format[32], nvrtc[64], mine[32];
  key_field(key, len, "flashjit format=", format, sizeof format);
  key_field(key, len, "nvrtc=", nvrtc, sizeof nvrtc);
  snprintf(mine, sizeof mine, "%d", FJ_FORMAT_VERSION);
  if (strcmp(format, mine) != 0) {
    snprintf(why, why_size, "made for cache format %s; this process has %s",
             format, mine);
    return 0;
  }
  if (strcmp(nvrtc, fj__nvrtc_version()) != 0) {
    snprintf(why, why_size, "made by NVRTC %s; this process has %s", nvrtc,
             fj__nvrtc_version());
    return 0;
  }
  return 1;
}

/* ---- reading ------------------------------------------------------------------- */

void fj__cache_entry_path(const char *dir, const fj_cache_key *key,
                          char *out, size_t size)
{
  snprintf(out, size, "%s/%s%s", dir, key->hex, ENTRY_SUFFIX);
}

/* An entry read and checked: its header and pointers into body. */
typedef struct entry_file {
  entry_header h;
  char *body;  /* malloc'd: kind, label, key text, payload */
  const char *kind, *label, *key, *payload;
} entry_file;

/* Checks a header against its file's size before anything is allocated:
 * every length within the file and, summed, exactly the rest of it.  Each
 * is at most ENTRY_MAX, so the sum cannot wrap around.  NULL if it fits,
 * else what is wrong. */
static const char *header_wrong(const entry_header *h, uint64_t size)
{
  uint64_t body = size - sizeof *h;
  if (memcmp(h->magic, ENTRY_MAGIC, 8) != 0)
    return "is corrupt or stale (not a flashjit cache entry: bad magic)";
  if (h->format != FJ_FORMAT_VERSION)
    return "is corrupt or stale (another format version)";
  if (h->kind_len > body || h->label_len > body || h->key_len > body ||
      h->payload_len > body ||
      (uint64_t)h->kind_len + h->label_len + h->key_len + h->payload_len != body)
    return "is corrupt or stale (truncated, or its lengths do not match its "
           "size)";
  return NULL;
}

static const char BODY_NOMEM[] = "cannot be read (out of memory)";

/* The body after a header that fits, checked against its checksum; NULL
 * with *why if it cannot be read or is not what the header says (BODY_NOMEM
 * when memory ran out: otherwise the entry is corrupt). */
static char *body_read(int fd, const entry_header *h, const char **why)
{
  size_t len = (size_t)(h->payload_len + h->kind_len + h->label_len +
                        h->key_len);
  char *body = malloc(len + 1);
  if (!body) {
    *why = BODY_NOMEM;
    return NULL;
  }
  if (fj__read_all(fd, body, len) != 0 ||
      fj__hash64(body, len) != h->checksum) {
    *why = "is corrupt or stale (its checksum does not match)";
    free(body);
    return NULL;
  }
  return body;
}

const char *fj__cache_entry_parse(const void *data, size_t len,
                                  fj_entry_view *v)
{
  entry_header h;
  if (len < sizeof h)
    return "is corrupt or stale (shorter than a header: truncated)";
  memcpy(&h, data, sizeof h);
  const char *why = header_wrong(&h, len);
  if (why)
    return why;
  const char *body = (const char *)data + sizeof h;
  if (fj__hash64(body, len - sizeof h) != h.checksum)
    return "is corrupt or stale (its checksum does not match)";
  v->kind = body;
  v->label = v->kind + h.kind_len;
  v->key = v->label + h.label_len;
  v->payload = v->key + h.key_len;
  v->kind_len = h.kind_len;
  v->label_len = h.label_len;
  v->key_len = h.key_len;
  v->payload_len = h.payload_len;
  return NULL;
}

/* Whether open's errno says the process, not the file, is short of
 * something: the file may be a good entry. */
static int open_short(int err)
{
  return err == ENOMEM || err == EMFILE || err == ENFILE;
}

/* Reads and checks the entry at path.  0 on success; else -1 with why
 * saying what is wrong with the file, or empty when there is no file; or
 * -2 with why and errno (ENOMEM, EMFILE, ENFILE) when the file could not
 * be checked: memory or descriptors ran out, and it may be whole. */
static int entry_read(const char *path, entry_file *e, char *why, size_t n)
{
  const char *reason = "is corrupt or stale (shorter than a header: truncated)";
  uint64_t size = 0;
  memset(e, 0, sizeof *e);
  why[0] = '\0';
  int fd = fj__open_file(path, ENTRY_MAX, &size);
  if (fd < 0) {
    int err = errno;
    if (err != ENOENT)
      fj__open_why(err, size, ENTRY_MAX, why, n);
    errno = err;
    return open_short(err) ? -2 : -1;
  }
  if (size >= sizeof e->h && fj__read_all(fd, &e->h, sizeof e->h) == 0 &&
      !(reason = header_wrong(&e->h, size)))
    e->body = body_read(fd, &e->h, &reason);
  close(fd);
  if (!e->body) {
    snprintf(why, n, "%s", reason);
    errno = ENOMEM;
    return reason == BODY_NOMEM ? -2 : -1;
  }
  e->kind = e->body;
  e->label = e->kind + e->h.kind_len;
  e->key = e->label + e->h.label_len;
  e->payload = e->key + e->h.key_len;
  return 0;
}

static int field_is(const char *p, uint32_t len, const char *want)
{
  return strlen(want) == len && memcmp(p, want, len) == 0;
}

int fj__cache_entry_load(const char *path, const char *kind,
                         const fj_cache_key *key, void **payload, size_t *len,
                         char *why, size_t n)
{
  entry_file e;
  if (entry_read(path, &e, why, n) != 0)
    return 0;  /* why is empty when there is no file: a plain miss */
  if (!(field_is(e.kind, e.h.kind_len, kind) &&
        field_is(e.key, e.h.key_len, key->text))) {
    free(e.body);
    snprintf(why, n, "is corrupt or stale (another key under its name)");
    return 0;
  }
  /* The payload moves to the front of the body, which the caller frees:
   * no second copy of a cubin. */
  *len = (size_t)e.h.payload_len;
  memmove(e.body, e.payload, *len);
  *payload = e.body;
  return 1;
}

int fj__cache_load(fj_ctx *ctx, const char *kind, const fj_cache_key *key,
                   void **payload, size_t *len)
{
  fj_cache *c = ctx->cache;
  if (!c->enabled)
    return 0;
  char path[4200], why[128];
  fj__cache_entry_path(c->dir, key, path, sizeof path);
  if (fj__cache_entry_load(path, kind, key, payload, len, why, sizeof why))
    return 1;
  if (why[0]) {
    c->stats.disk_rejects++;
    fj__log(ctx, FJ_LOG_WARN, "cache entry %s %s: ignored", path, why);
  }
  return 0;
}

/* ---- writing ------------------------------------------------------------------- */

/* Writes parts into the directory's file `name` through a temporary file
 * and a rename, so that a reader sees the whole file or none; 0, or -1
 * with errno (the temporary removed). */
static int write_atomic(const fj_cache *c, const char *name,
                        const void *const *parts, const size_t *sizes,
                        size_t n)
{
  char tmp[4400], path[4300];
  /* Only the name's hash: a temporary must not end as an entry does. */
  char id[FJ_TEMP_ID_MAX];
  fj__temp_id(id);
  snprintf(tmp, sizeof tmp, "%s/" TEMP_PREFIX "%s-%.32s", c->dir, id, name);
  snprintf(path, sizeof path, "%s/%s", c->dir, name);
  return fj__write_replace(tmp, path, 0644, parts, sizes, n);
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
  const void *parts[] = {&h, kind, label, key->text, payload};
  size_t sizes[] = {sizeof h, h.kind_len, h.label_len, h.key_len, len};
  /* Hashed in place: a copy that memory could not hold once gave the
   * entry a checksum of 0, written as a corrupt entry (and, in a kernel
   * package, sealed as one). */
  h.checksum = fj__hash64_parts(parts + 1, sizes + 1, FJ_ARRAY_LEN(parts) - 1);
  char name[64], path[4200];
  snprintf(name, sizeof name, "%s%s", key->hex, ENTRY_SUFFIX);
  if (write_atomic(c, name, parts, sizes, FJ_ARRAY_LEN(parts)) != 0) {
    int err = errno;
    c->stats.disk_errors++;
    fj__cache_entry_path(c->dir, key, path, sizeof path);
    fj__log(ctx, FJ_LOG_WARN,
            "cannot write cache entry %s (%s): kept in memory only", path,
            strerror(err));
    return;
  }
  c->stats.disk_writes++;
}

void fj__cache_store_lost(fj_ctx *ctx, const char *kind, const char *label)
{
  fj_cache *c = ctx->cache;
  if (!c || !c->enabled || !c->writable)
    return;
  c->stats.disk_errors++;
  fj__log(ctx, FJ_LOG_WARN,
          "cannot write the %s cache entry of %s (out of memory): kept in "
          "memory only", kind, label);
}

int fj__cache_install(fj_ctx *ctx, const char *name, const void *data,
                      size_t len)
{
  const void *parts[] = {data};
  size_t sizes[] = {len};
  return write_atomic(ctx->cache, name, parts, sizes, 1);
}

/* ---- listing and clearing -------------------------------------------------------- */

static int name_cmp(const void *a, const void *b)
{
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void free_names(char **names, size_t n)
{
  for (size_t i = 0; i < n; i++)
    free(names[i]);
  free(names);
}

/* The sorted names of the directory's entries (and temporaries if asked);
 * -1 with errno if the directory cannot be read (ENOMEM: nor held). */
static int dir_names(const char *dir, int temps, char ***out, size_t *count)
{
  DIR *d = opendir(dir);
  if (!d)
    return -1;
  char **names = NULL;
  size_t n = 0, cap = 0;
  int nomem = 0;
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
      if (!p) {
        nomem = 1;
        break;
      }
      names = p;
    }
    /* A name left out would be an entry left out of a listing, an
     * export or a clear that still succeeds: all or nothing. */
    if (!(names[n] = fj__strdup(e->d_name))) {
      nomem = 1;
      break;
    }
    n++;
  }
  closedir(d);
  if (nomem) {
    free_names(names, n);
    errno = ENOMEM;
    return -1;
  }
  if (names)
    qsort(names, n, sizeof *names, name_cmp);
  *out = names;
  *count = n;
  return 0;
}

/* An entry that could not be checked (entry_read's -2, err its errno):
 * an error, not an invalid entry. */
static fj_status entry_unchecked(fj_ctx *ctx, const char *path, int err,
                                 const char *why)
{
  return fj__fail(ctx, err == ENOMEM ? FJ_ERR_NOMEM : FJ_ERR_IO,
                  "cache entry %s %s", path, why);
}

/* One entry for the visitor: its size and time as the directory has them
 * (lstat: a link is not followed), valid only if it reads as an entry.
 * Non-zero to stop: the visitor's, or 1 with *status when the entry
 * could not be checked. */
static int visit_entry(fj_ctx *ctx, const char *name, fj_cache_visit_fn fn,
                       void *user, fj_status *status)
{
  char path[4200], why[128];
  snprintf(path, sizeof path, "%s/%s", ctx->cache->dir, name);
  struct stat st;
  if (lstat(path, &st) != 0)
    return 0;  /* removed since the directory was read */
  entry_file e;
  char kind_s[32] = "?", label_s[256] = "?";
  fj_cache_entry ce = {name, kind_s, label_s, (uint64_t)st.st_size,
                       (int64_t)st.st_mtime, 0};
  int r = entry_read(path, &e, why, sizeof why);
  if (r == -2) {
    *status = entry_unchecked(ctx, path, errno, why);
    return 1;
  }
  if (r == 0) {
    char made[128];
    snprintf(kind_s, sizeof kind_s, "%.*s", (int)e.h.kind_len, e.kind);
    snprintf(label_s, sizeof label_s, "%.*s", (int)e.h.label_len, e.label);
    ce.valid = fj__cache_key_current(e.key, e.h.key_len, made, sizeof made);
    /* A stale entry is whole but never looked up: said so. */
    if (!ce.valid)
      snprintf(label_s, sizeof label_s, "is stale (%s)", made);
    free(e.body);
  } else {
    /* An invalid entry's label says what is wrong with it. */
    snprintf(label_s, sizeof label_s, "%s", why[0] ? why : "cannot be read");
  }
  return fn(user, &ce);
}

/* The disk cache's file names, for listing and clearing. */
static fj_status cache_names(fj_ctx *ctx, int temps, char ***names, size_t *n)
{
  fj_cache *c = ctx->cache;
  if (!c->enabled)
    return fj__fail(ctx, FJ_ERR_NOT_FOUND, "the disk cache is disabled");
  if (dir_names(c->dir, temps, names, n) != 0)
    return fj__fail(ctx, errno == ENOMEM ? FJ_ERR_NOMEM : FJ_ERR_IO,
                    "cannot read %s: %s", c->dir, strerror(errno));
  return FJ_OK;
}

fj_status fj_cache_list(fj_ctx *ctx, fj_cache_visit_fn fn, void *user)
{
  if (!ctx || !fn)
    return fj__null_arg(ctx, "fj_cache_list", ctx ? "fn" : "ctx");
  fj__clear_error(ctx);
  size_t n = 0;
  char **names = NULL;
  fj_status st = cache_names(ctx, 0, &names, &n);
  for (size_t i = 0; st == FJ_OK && i < n; i++)
    if (visit_entry(ctx, names[i], fn, user, &st))
      break;
  free_names(names, n);
  return st;
}

/* Whether a file of the cache directory is an entry this process can
 * use: whole, and of its format and NVRTC version; -1 when it could not
 * be checked (*st gets the error unless it holds one). */
static int entry_usable(fj_ctx *ctx, const char *name, fj_status *st)
{
  char path[4200], why[128];
  snprintf(path, sizeof path, "%s/%s", ctx->cache->dir, name);
  entry_file e;
  int r = entry_read(path, &e, why, sizeof why);
  if (r == -2) {
    int err = errno;
    if (*st == FJ_OK)
      *st = entry_unchecked(ctx, path, err, why);
    return -1;
  }
  if (r != 0)
    return 0;
  int ok = fj__cache_key_current(e.key, e.h.key_len, why, sizeof why);
  free(e.body);
  return ok;
}

/* Removes the cache directory's files -- with temporaries (clear) or
 * only the entries this process cannot use (prune) -- counting them. */
static fj_status remove_files(fj_ctx *ctx, const char *who, int prune,
                              int *removed)
{
  if (!ctx)
    return fj__null_arg(NULL, who, "ctx");
  fj__clear_error(ctx);
  fj_cache *c = ctx->cache;
  size_t n = 0;
  char **names = NULL;
  fj_status st = cache_names(ctx, !prune, &names, &n);
  if (st != FJ_OK)
    return st;
  int count = 0;
  time_t now = time(NULL);
  for (size_t i = 0; i < n; i++) {
    if (prune && entry_usable(ctx, names[i], &st))
      continue;  /* usable, or kept unchecked */
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", c->dir, names[i]);
    /* A young temporary may be another process's write on its way to a
     * rename: only strays left for TEMP_STALE_S go. */
    struct stat sb;
    if (strncmp(names[i], TEMP_PREFIX, sizeof TEMP_PREFIX - 1) == 0 &&
        lstat(path, &sb) == 0 &&
        now - sb.st_mtime < TEMP_STALE_S)
      continue;
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

fj_status fj_cache_prune(fj_ctx *ctx, int *removed)
{
  return remove_files(ctx, "fj_cache_prune", 1, removed);
}

fj_status fj_cache_clear(fj_ctx *ctx, int *removed)
{
  return remove_files(ctx, "fj_cache_clear", 0, removed);
}
