/*
 * cache_pack.c -- moving a disk cache between machines: prewarming it
 * (every variant of a list made ready, with the combine kernels that split
 * variants launch), exporting its compiler entries into one checksummed
 * file, and importing such a file into another cache directory.
 *
 * A pack is a header, then one record per entry: the entry's file name,
 * size and checksum, then the entry file's bytes exactly as the cache
 * wrote them.  Import checks everything before it writes anything -- the
 * header, every record, every entry as the cache itself would read it,
 * the name against the hash of the entry's key, then the whole file's
 * checksum -- so that a damaged or foreign file installs nothing.  Each
 * entry then lands by temporary file and rename, as the cache writes its
 * own, and a valid entry already there is never replaced.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attention.h"
#include "cache.h"
#include "compile.h"
#include "ctx.h"
#include "entry.h"
#include "mods.h"
#include "rel_table.h"
#include "template.h"
#include "util.h"
#include "variant.h"

#define PACK_MAGIC "FJPACK01"
/* The largest pack read: a few thousand kernels of a few MB each. */
#define PACK_MAX ((uint64_t)4 << 30)
#define PACK_ENTRIES_MAX 1000000u
/* An entry's file name: 32 hex digits of its key's hash, then ".fjc". */
#define NAME_LEN 36

typedef struct pack_header {
  char magic[8];
  uint32_t version;       /* FJ_CACHE_PACK_VERSION */
  uint32_t cache_format;  /* FJ_FORMAT_VERSION of the entries */
  char nvrtc[16];         /* the NVRTC that compiled them, NUL-padded */
  uint32_t count;
  uint32_t reserved;
  uint64_t body_len;      /* bytes after the header */
  uint64_t checksum;      /* XXH3-64 of those bytes */
} pack_header;

typedef struct pack_record {
  uint32_t name_len;
  uint32_t reserved;
  uint64_t size;
  uint64_t checksum;  /* XXH3-64 of the entry's bytes */
} pack_record;

_Static_assert(sizeof(pack_header) == 56, "pack_header has no padding");
_Static_assert(sizeof(pack_record) == 24, "pack_record has no padding");

/* ---- prewarm ------------------------------------------------------------------ */

/* Variant i's name is new among those before it. */
static int first_of_name(const fj_variant *vs, size_t i)
{
  char a[160], b[160];
  fj_variant_name(&vs[i], a, sizeof a);
  for (size_t j = 0; j < i; j++)
    if (fj_variant_name(&vs[j], b, sizeof b) > 0 && !strcmp(a, b))
      return 0;
  return 1;
}

/* One combine kernel, its blocks `cols` of O's columns, counted in *ready
 * unless seen[] has it already. */
static fj_status prewarm_combine(fj_ctx *ctx, const fj_variant *v, int cols,
                                 fj_kernel **seen, size_t *nseen, int *ready)
{
  fj_kernel *k;
  pthread_mutex_lock(&ctx->lock);
  fj_status st = fj__combine_kernel(ctx, v, cols, &k);
  pthread_mutex_unlock(&ctx->lock);
  if (st != FJ_OK)
    return st;
  size_t j = 0;
  while (j < *nseen && seen[j] != k)
    j++;
  if (j == *nseen) {
    seen[(*nseen)++] = k;
    (*ready)++;
  }
  return FJ_OK;
}

/* The combine kernels of the split variants that were made ready; the
 * first failure's status (its message on ctx).  A variant does not say
 * the problem, hence not the columns its plans give a combine block
 * (fj__combine_cols: O's head dim, or 128 where O is wider and the row
 * blocks are fewer than the multiprocessors): each variant's one-slice
 * kernel, and for O wider than 128 columns the one of 128-column slices
 * too.  *ready counts distinct kernels: fj__combine_kernel's own memory
 * cache, keyed by everything the combine is rendered from, hands variants
 * that share one the same kernel. */
static fj_status prewarm_combines(fj_ctx *ctx, const fj_variant *vs,
                                  const fj_status *each, size_t n, int *ready)
{
  fj_status first = FJ_OK;
  fj_kernel **seen = calloc(n ? 2 * n : 1, sizeof *seen);
  size_t nseen = 0;
  if (!seen)
    return fj__fail(ctx, FJ_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < n; i++) {
    if (each[i] != FJ_OK || !vs[i].split_kv)
      continue;
    int dv = fj__head_dim_v(&vs[i]);
    fj_status st = prewarm_combine(ctx, &vs[i], dv, seen, &nseen, ready);
    if (st == FJ_OK && dv > 128)
      st = prewarm_combine(ctx, &vs[i], 128, seen, &nseen, ready);
    if (st != FJ_OK && first == FJ_OK)
      first = st;
  }
  free(seen);
  return first;
}

/* The relative tables' kernels (rel_table.h) of the variants made ready
 * whose score expressions take one, once a form, counted in *ready: a
 * call with such an expression launches its table's kernel first. */
static fj_status prewarm_tables(fj_ctx *ctx, const fj_variant *vs,
                                const fj_status *each, size_t n, int *ready)
{
  fj_status first = FJ_OK;
  for (size_t i = 0; i < n; i++) {
    if (each[i] != FJ_OK || !fj__mods_rt_on(vs[i].mods))
      continue;
    uint64_t form = fj__mods_hash(vs[i].mods);
    int again = 0;
    for (size_t j = 0; j < i && !again; j++)
      again = each[j] == FJ_OK && fj__mods_rt_on(vs[j].mods) &&
              fj__mods_hash(vs[j].mods) == form;
    if (again)
      continue;
    /* The table's kernel reads nothing of the problem but its mods. */
    fj_problem p;
    memset(&p, 0, sizeof p);
    p.mods = vs[i].mods;
    fj_kernel *k;
    pthread_mutex_lock(&ctx->lock);
    fj_status st = fj__rt_kernel(ctx, &p, &k);
    pthread_mutex_unlock(&ctx->lock);
    if (st == FJ_OK)
      (*ready)++;
    else if (first == FJ_OK)
      first = st;
  }
  return first;
}

static fj_status prewarm_unique(fj_ctx *ctx, const fj_variant *vs, size_t n,
                                const fj_prepare_opts *opts, fj_status *each,
                                fj_prewarm_report *r)
{
  fj_cache_stats before, after;
  fj_cache_stats_get(ctx, &before);
  fj_status st = fj_kernel_prepare(ctx, vs, n, opts, each);
  int ready = 0;
  for (size_t i = 0; i < n; i++)
    ready += each[i] == FJ_OK;
  r->variants = (int)n;
  r->failed = (int)n - ready;
  /* The split variants that were made ready need their combine kernels
   * whatever happened to the others. */
  fj_status cst = prewarm_combines(ctx, vs, each, n, &ready);
  st = st == FJ_OK ? cst : st;
  cst = prewarm_tables(ctx, vs, each, n, &ready);
  st = st == FJ_OK ? cst : st;
  fj_cache_stats_get(ctx, &after);
  r->kernels = ready;
  r->compiled = (int)(after.misses - before.misses);
  r->compiled = r->compiled > ready ? ready : r->compiled;
  r->cached = ready - r->compiled;
  /* A prewarm is for the disk: kernels that stayed in memory (a full or
   * read-only file system) are a failure, not a success. */
  uint64_t lost = after.disk_errors - before.disk_errors;
  if (st == FJ_OK && lost)
    st = fj__fail(ctx, FJ_ERR_IO,
                  "fj_cache_prewarm: %llu cache entries could not be written "
                  "to the disk cache (a full or read-only file system? the "
                  "log names each): the kernels are in memory only",
                  (unsigned long long)lost);
  return st;
}

fj_status fj_cache_prewarm(fj_ctx *ctx, const fj_variant *variants, size_t n,
                           const fj_prepare_opts *opts, fj_status *each,
                           fj_prewarm_report *report)
{
  if (!ctx || (!variants && n))
    return fj__null_arg(ctx, "fj_cache_prewarm", ctx ? "variants" : "ctx");
  fj__clear_error(ctx);
  if (n > 65536)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "fj_cache_prewarm: n = %zu variants is more than one "
                    "call takes (at most 65536)", n);
  fj_variant *uniq = malloc((n ? n : 1) * sizeof *uniq);
  fj_status *st_u = malloc((n ? n : 1) * sizeof *st_u);
  if (!uniq || !st_u) {
    free(uniq);
    free(st_u);
    return fj__fail(ctx, FJ_ERR_NOMEM, "out of memory");
  }
  size_t m = 0;
  for (size_t i = 0; i < n; i++)
    if (first_of_name(variants, i)) {
      st_u[m] = FJ_ERR_INVALID_ARG;  /* until fj_kernel_prepare says */
      uniq[m++] = variants[i];
    }
  fj_prewarm_report r = {0};
  fj_status st = prewarm_unique(ctx, uniq, m, opts, st_u, &r);
  if (each)
    for (size_t i = 0; i < n; i++) {
      /* A duplicate takes the status of its first occurrence. */
      char a[160], b[160];
      fj_variant_name(&variants[i], a, sizeof a);
      each[i] = FJ_ERR_NOT_FOUND;
      for (size_t j = 0; j < m; j++)
        if (fj_variant_name(&uniq[j], b, sizeof b) > 0 && !strcmp(a, b)) {
          each[i] = st_u[j];
          break;
        }
    }
  if (report)
    *report = r;
  free(uniq);
  free(st_u);
  return st;
}

/* ---- export ------------------------------------------------------------------- */

/* The key of an entry made by this process's NVRTC and cache format. */
static int key_is_current(const fj_entry_view *v)
{
  char why[128];
  return fj__cache_key_current(v->key, v->key_len, why, sizeof why);
}

static int kind_is_compiled(const fj_entry_view *v)
{
  return (v->kind_len == 6 && !memcmp(v->kind, "kernel", 6)) ||
         (v->kind_len == 6 && !memcmp(v->kind, "render", 6));
}

typedef struct export_state {
  fj_ctx *ctx;
  fj_buf body;
  uint32_t count;
  int skipped;
  int nomem;
  int err;           /* errno of an entry that could not be read again */
  char bad[80];      /* its file name */
} export_state;

/* One file of the cache directory into the pack, if it belongs there. */
static int export_visit(void *user, const fj_cache_entry *e)
{
  export_state *x = user;
  char path[4400];
  snprintf(path, sizeof path, "%s/%s", fj_cache_dir(x->ctx), e->file);
  size_t len = 0;
  int wanted = e->valid && strlen(e->file) == NAME_LEN;
  char *data = wanted ? fj__file_read(path, FJ_CACHE_ENTRY_MAX, &len) : NULL;
  /* An entry that memory could not hold is no "other file": the pack
   * would lack it, and say it was made. */
  if (wanted && !data && errno == ENOMEM)
    return x->nomem = 1;
  /* Nor is one the disk would not give back (short of file descriptors,
   * an I/O error); one removed since the listing (a prune) is gone. */
  if (wanted && !data && errno != ENOENT) {
    x->err = errno;
    snprintf(x->bad, sizeof x->bad, "%s", e->file);
    return 1;
  }
  fj_entry_view v;
  if (!data || fj__cache_entry_parse(data, len, &v) || !kind_is_compiled(&v) ||
      !key_is_current(&v)) {
    x->skipped++;
    free(data);
    return 0;
  }
  pack_record r = {NAME_LEN, 0, len, fj__hash64(data, len)};
  x->nomem = fj__buf_append(&x->body, &r, sizeof r) ||
             fj__buf_append(&x->body, e->file, NAME_LEN) ||
             fj__buf_append(&x->body, data, len);
  x->count++;
  free(data);
  return x->nomem || x->count >= PACK_ENTRIES_MAX;
}

/* FJ_OK when path is free or a regular file (what the rename may
 * replace); else the refusal.  A device, a directory, a FIFO, a socket or
 * a symbolic link is never replaced: as root, a pack written over
 * /dev/null would turn it into a file. */
static fj_status export_target(fj_ctx *ctx, const char *path)
{
  struct stat st;
  if (lstat(path, &st) != 0)
    return errno == ENOENT ? FJ_OK
                           : fj__fail(ctx, FJ_ERR_IO,
                                      "cannot write the cache pack %s: %s",
                                      path, strerror(errno));
  if (S_ISREG(st.st_mode))
    return FJ_OK;
  const char *what = S_ISDIR(st.st_mode)    ? "a directory"
                     : S_ISLNK(st.st_mode)  ? "a symbolic link"
                     : S_ISCHR(st.st_mode)  ? "a character device"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                     : S_ISFIFO(st.st_mode) ? "a FIFO"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : "not a regular file";
  return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "fj_cache_export: %s is %s: a pack replaces only a regular "
                  "file (nothing written)", path, what);
}

/* Writes header and body to path through a temporary beside it. */
static fj_status write_pack(fj_ctx *ctx, const char *path,
                            const pack_header *h, const fj_buf *body)
{
  char tmp[4400], id[FJ_TEMP_ID_MAX];
  fj__temp_id(id);
  snprintf(tmp, sizeof tmp, "%s.tmp-%s", path, id);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  int bad = fd < 0 || fj__write_all(fd, h, sizeof *h) ||
            fj__write_all(fd, body->data, body->len);
  int err = errno;
  if (fd >= 0 && close(fd) != 0 && !bad)
    bad = 1, err = errno;
  /* Checked again just before the rename: the path may have become
   * something else while the pack was written. */
  if (!bad && export_target(ctx, path) != FJ_OK) {
    unlink(tmp);
    return FJ_ERR_INVALID_ARG;
  }
  if (!bad && rename(tmp, path) != 0)
    bad = 1, err = errno;
  if (!bad)
    return FJ_OK;
  if (fd >= 0)
    unlink(tmp);
  return fj__fail(ctx, FJ_ERR_IO, "cannot write the cache pack %s: %s", path,
                  strerror(err));
}

static void pack_header_init(pack_header *h, uint32_t count,
                             const fj_buf *body)
{
  memset(h, 0, sizeof *h);
  memcpy(h->magic, PACK_MAGIC, 8);
  h->version = FJ_CACHE_PACK_VERSION;
  h->cache_format = FJ_FORMAT_VERSION;
  snprintf(h->nvrtc, sizeof h->nvrtc, "%s", fj__nvrtc_version());
  h->count = count;
  h->body_len = body->len;
  h->checksum = fj__hash64(body->data ? body->data : "", body->len);
}

fj_status fj_cache_export(fj_ctx *ctx, const char *path,
                          fj_cache_pack_report *report)
{
  if (!ctx || !path)
    return fj__null_arg(ctx, "fj_cache_export", ctx ? "path" : "ctx");
  fj__clear_error(ctx);
  if (!*path)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "fj_cache_export: the path is empty");
  export_state x = {ctx, {0}, 0, 0, 0, 0, ""};
  fj_status st = export_target(ctx, path);
  if (st != FJ_OK) {
    if (report)
      memset(report, 0, sizeof *report);
    return st;
  }
  st = fj_cache_list(ctx, export_visit, &x);
  if (st == FJ_OK && x.nomem)
    st = fj__fail(ctx, FJ_ERR_NOMEM, "out of memory packing %u entries",
                  x.count);
  if (st == FJ_OK && x.err)
    st = fj__fail(ctx, FJ_ERR_IO, "cannot read the cache entry %s/%s: %s "
                  "(nothing written)", fj_cache_dir(ctx), x.bad,
                  strerror(x.err));
  if (st == FJ_OK) {
    pack_header h;
    pack_header_init(&h, x.count, &x.body);
    st = write_pack(ctx, path, &h, &x.body);
  }
  fj__buf_free(&x.body);
  if (report) {
    memset(report, 0, sizeof *report);
    report->entries = st == FJ_OK ? (int)x.count : 0;
    report->skipped = x.skipped;
  }
  return st;
}

/* ---- import ------------------------------------------------------------------- */

/* What is wrong with a pack's header, for a file of `size` bytes: 0, or
 * FJ_ERR_INVALID_ARG with the message. */
static fj_status header_check(fj_ctx *ctx, const char *path,
                              const pack_header *h, size_t size)
{
  char theirs[sizeof h->nvrtc + 1];
  if (memcmp(h->magic, PACK_MAGIC, 8) != 0)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "%s is not a flashjit cache pack (bad magic: expected "
                    "'%s')", path, PACK_MAGIC);
  memcpy(theirs, h->nvrtc, sizeof h->nvrtc);
  theirs[sizeof h->nvrtc] = '\0';
  for (char *p = theirs; *p; p++)
    *p = *p < 0x20 || *p == 0x7f ? '?' : *p;
  if (h->version != FJ_CACHE_PACK_VERSION ||
      h->cache_format != FJ_FORMAT_VERSION ||
      strcmp(theirs, fj__nvrtc_version()) != 0)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "%s was exported by NVRTC %s (pack format %u, cache "
                    "format %u); this process has NVRTC %s (pack format %d, "
                    "cache format %d): not imported",
                    path, theirs, h->version, h->cache_format,
                    fj__nvrtc_version(), FJ_CACHE_PACK_VERSION,
                    FJ_FORMAT_VERSION);
  if (h->body_len != size - sizeof *h)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "%s is truncated or damaged: its header says %llu bytes "
                    "of entries, the file has %zu",
                    path, (unsigned long long)h->body_len, size - sizeof *h);
  if (h->count > PACK_ENTRIES_MAX)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "%s says it holds %u entries: at most %u", path, h->count,
                    PACK_ENTRIES_MAX);
  return FJ_OK;
}

/* The file name an entry's key gives it; 0 when name is that. */
static int name_wrong(const char *name, const fj_entry_view *v)
{
  char hex[33];
  fj__hash_hex(v->key, v->key_len, hex);
  return memcmp(name, hex, 32) != 0 || memcmp(name + 32, ".fjc", 4) != 0;
}

/* One record of the pack at *off: NULL and the entry's name and bytes, or
 * what is wrong with it. */
static const char *record_read(const char *data, size_t size, size_t *off,
                               const char **name, const char **bytes,
                               uint64_t *len)
{
  pack_record r;
  if (size - *off < sizeof r)
    return "its record runs past the end of the file (truncated)";
  memcpy(&r, data + *off, sizeof r);
  *off += sizeof r;
  if (r.name_len != NAME_LEN || r.size > FJ_CACHE_ENTRY_MAX ||
      size - *off < NAME_LEN || size - *off - NAME_LEN < r.size)
    return "its name or size is out of bounds, or it runs past the end of "
           "the file (truncated or damaged)";
  *name = data + *off;
  *bytes = *name + NAME_LEN;
  *len = r.size;
  *off += NAME_LEN + (size_t)r.size;
  if (fj__hash64(*bytes, (size_t)r.size) != r.checksum)
    return "its checksum does not match";
  return NULL;
}

static int kind_is(const fj_entry_view *v, const char *kind)
{
  return v->kind_len == strlen(kind) && !memcmp(v->kind, kind, v->kind_len);
}

/* An entry's payload checked as its reader will take it -- a render's
 * metadata and source as a render would have made them, a kernel's parts
 * -- so that nothing a template would be refused, and no source that
 * includes a file of the host, lands: NULL, or what is wrong (in why). */
static const char *payload_wrong(const fj_entry_view *v, char *why, size_t n)
{
  if (kind_is(v, "render")) {
    fj_kmeta m;
    const char *src;
    size_t src_len;
    return fj__render_payload_read(v->payload, (size_t)v->payload_len, &m,
                                   &src, &src_len, why, n);
  }
  fj_compiled c;
  const char *bad =
      fj__kernel_payload_check(v->payload, (size_t)v->payload_len, &c);
  fj__compiled_free(&c);
  return bad;
}

/* An entry's bytes checked as the cache would read them, and against the
 * pack: NULL, or what is wrong. */
static const char *entry_wrong(const char *name, const char *bytes,
                               uint64_t len, char *label, size_t label_size,
                               char *why, size_t why_size)
{
  fj_entry_view v;
  const char *bad = fj__cache_entry_parse(bytes, (size_t)len, &v);
  if (bad)
    return bad;
  snprintf(label, label_size, " (%.*s)",
           (int)(v.label_len < 120 ? v.label_len : 120), v.label);
  for (char *p = label; *p; p++)
    *p = *p < 0x20 || *p == 0x7f ? '?' : *p;
  if (!kind_is_compiled(&v))
    return "is not a compiler entry (kernel or render)";
  if (!key_is_current(&v))
    return "was made by another NVRTC or cache format";
  if (name_wrong(name, &v))
    return "has a name that is not the hash of its key";
  return payload_wrong(&v, why, why_size);
}

/* Every record and entry of the pack, then the whole file's checksum. */
static fj_status pack_verify(fj_ctx *ctx, const char *path, const char *data,
                             size_t size, const pack_header *h)
{
  size_t off = sizeof *h;
  for (uint32_t i = 0; i < h->count; i++) {
    const char *name = "?", *bytes;
    char label[160] = "", shown[40], buf[240];
    uint64_t len;
    const char *why = record_read(data, size, &off, &name, &bytes, &len);
    if (!why)
      why = entry_wrong(name, bytes, len, label, sizeof label, buf,
                        sizeof buf);
    if (why) {
      snprintf(shown, sizeof shown, "%.*s", name[0] == '?' ? 1 : NAME_LEN,
               name);
      for (char *p = shown; *p; p++)
        *p = *p < 0x20 || *p == 0x7f ? '?' : *p;
      return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                      "%s: entry %u of %u, %s%s, %s: nothing imported", path,
                      i + 1, h->count, shown, label, why);
    }
  }
  if (off != size)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "%s has %zu bytes after its %u entries (damaged): nothing "
                    "imported", path, size - off, h->count);
  if (fj__hash64(data + sizeof *h, size - sizeof *h) != h->checksum)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "%s is corrupt: its checksum does not match: nothing "
                    "imported", path);
  return FJ_OK;
}

/* Installs one verified entry unless a valid one is already there. */
static fj_status install_one(fj_ctx *ctx, const char *name, const char *bytes,
                             size_t len, fj_cache_pack_report *r)
{
  char path[4400], fname[NAME_LEN + 1];
  memcpy(fname, name, NAME_LEN);
  fname[NAME_LEN] = '\0';
  snprintf(path, sizeof path, "%s/%s", fj_cache_dir(ctx), fname);
  size_t have_len = 0;
  char *have = fj__file_read(path, FJ_CACHE_ENTRY_MAX, &have_len);
  fj_entry_view v;
  int valid = have && !fj__cache_entry_parse(have, have_len, &v);
  int same = valid && have_len == len && !memcmp(have, bytes, len);
  free(have);
  if (same || valid) {
    r->present += same;
    r->kept += !same;
    return FJ_OK;
  }
  if (fj__cache_install(ctx, fname, bytes, len) != 0)
    return fj__fail(ctx, FJ_ERR_IO, "cannot write cache entry %s: %s", path,
                    strerror(errno));
  r->installed++;
  return FJ_OK;
}

static fj_status pack_install(fj_ctx *ctx, const char *data,
                              const pack_header *h, fj_cache_pack_report *r)
{
  size_t off = sizeof *h;
  for (uint32_t i = 0; i < h->count; i++) {
    pack_record rec;
    memcpy(&rec, data + off, sizeof rec);
    const char *name = data + off + sizeof rec;
    off += sizeof rec + NAME_LEN + (size_t)rec.size;
    fj_status st = install_one(ctx, name, name + NAME_LEN, (size_t)rec.size, r);
    if (st != FJ_OK)
      return st;
  }
  return FJ_OK;
}

/* ---- --verify: the cubins recompiled from the pack's own sources ------------------ */

/* One entry of a verified pack. */
typedef struct pack_item {
  const char *name;  /* NAME_LEN bytes, not terminated */
  fj_entry_view v;
  int matched;       /* a kernel: a render entry's source compiled to it */
} pack_item;

/* The entries of a pack pack_verify passed, in order. */
static void pack_items(const char *data, const pack_header *h, pack_item *it)
{
  size_t off = sizeof *h;
  for (uint32_t i = 0; i < h->count; i++) {
    pack_record rec;
    memcpy(&rec, data + off, sizeof rec);
    it[i].name = data + off + sizeof rec;
    fj__cache_entry_parse(it[i].name + NAME_LEN, (size_t)rec.size, &it[i].v);
    off += sizeof rec + NAME_LEN + (size_t)rec.size;
  }
}

/* The target in a key's options ("--gpu-architecture=sm_90a ..."); 0, or
 * -1 when the key names none. */
static int key_arch(const fj_entry_view *v, char *out, size_t n)
{
  static const char opt[] = "--gpu-architecture=";
  const char *k = v->key, *end = v->key + v->key_len;
  for (; end - k >= (ptrdiff_t)sizeof opt; k++)
    if (!memcmp(k, opt, sizeof opt - 1)) {
      k += sizeof opt - 1;
      size_t len = 0;
      while (k + len < end && k[len] != ' ' && k[len] != '\n')
        len++;
      if (!len || len >= n)
        return -1;
      snprintf(out, n, "%.*s", (int)len, k);
      return 0;
    }
  return -1;
}

/* The kernel entry a render entry's source compiles to, by its key; its
 * index, or -1 when the pack has none. */
static long kernel_of(const pack_item *it, uint32_t n, const char *arch,
                      const fj_kmeta *m, const char *src, size_t src_len)
{
  char hash[33];
  fj_cache_key kk;
  fj__hash_hex(src, src_len, hash);
  fj__cache_key(&kk, "kernel", arch, m->quick, hash, m->symbol);
  for (uint32_t i = 0; i < n; i++)
    if (kind_is(&it[i].v, "kernel") && !memcmp(it[i].name, kk.hex, 32))
      return (long)i;
  return -1;
}

typedef struct verify_jobs {
  fj_compile_job *job;
  long *kernel;  /* the kernel entry each job's output must equal */
  size_t n;
} verify_jobs;

static void verify_jobs_free(verify_jobs *j)
{
  for (size_t i = 0; i < j->n; i++) {
    free((char *)j->job[i].name);
    free((char *)j->job[i].src);
    free((char *)j->job[i].arch);
    free(j->job[i].message);
    fj__compiled_free(&j->job[i].out);
  }
  free(j->job);
  free(j->kernel);
}

/* A compile job for each render entry whose kernel the pack holds. */
static int verify_jobs_make(pack_item *it, uint32_t n, verify_jobs *j)
{
  j->job = calloc(n ? n : 1, sizeof *j->job);
  j->kernel = calloc(n ? n : 1, sizeof *j->kernel);
  if (!j->job || !j->kernel)
    return -1;
  for (uint32_t i = 0; i < n; i++) {
    fj_kmeta m;
    const char *src;
    size_t src_len;
    char arch[32], why[8];
    if (!kind_is(&it[i].v, "render") ||
        fj__render_payload_read(it[i].v.payload, (size_t)it[i].v.payload_len,
                                &m, &src, &src_len, why, sizeof why) ||
        key_arch(&it[i].v, arch, sizeof arch) != 0)
      continue;
    long k = kernel_of(it, n, arch, &m, src, src_len);
    if (k < 0)
      continue;
    fj_compile_job *job = &j->job[j->n];
    job->name = fj__strdup(m.symbol);
    job->src = fj__memdup(src, src_len + 1);
    job->arch = fj__strdup(arch);
    job->quick = m.quick;
    if (!job->name || !job->src || !job->arch)
      return j->n++, -1;
    ((char *)job->src)[src_len] = '\0';
    j->kernel[j->n++] = k;
  }
  return 0;
}

/* What is wrong with a compile job's result against its kernel entry:
 * NULL, or why. */
static const char *verify_one(const fj_compile_job *job, const pack_item *k)
{
  if (job->status != FJ_OK)
    return "its rendered source does not compile here";
  fj_compiled c;
  if (fj__kernel_payload_read(k->v.payload, (size_t)k->v.payload_len, &c))
    return "its payload is not a kernel's";
  int same = c.cubin_len == job->out.cubin_len &&
             !memcmp(c.cubin, job->out.cubin, c.cubin_len) &&
             c.ptx_len == job->out.ptx_len &&
             !memcmp(c.ptx, job->out.ptx, c.ptx_len);
  fj__compiled_free(&c);
  return same ? NULL
              : "its PTX or cubin is not what its rendered source compiles "
                "to";
}

static fj_status verify_fail(fj_ctx *ctx, const char *path, uint32_t i,
                             uint32_t n, const pack_item *it, const char *why)
{
  int ll = (int)(it->v.label_len < 120 ? it->v.label_len : 120);
  return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "%s: entry %u of %u, %.*s (%.*s), %s: nothing imported "
                  "(--verify)", path, i + 1, n, NAME_LEN, it->name, ll,
                  it->v.label, why);
}

/* Every kernel entry of the pack recompiled from the pack's render entry
 * for it (in child processes) and compared byte for byte: a cubin is code
 * the GPU runs, and a checksum says only that the file arrived whole. */
static fj_status pack_recompile(fj_ctx *ctx, const char *path,
                                const char *data, const pack_header *h)
{
  pack_item *it = calloc(h->count ? h->count : 1, sizeof *it);
  verify_jobs j = {0};
  fj_status st = FJ_OK;
  if (it)
    pack_items(data, h, it);
  if (!it || verify_jobs_make(it, h->count, &j) != 0)
    st = fj__fail(ctx, FJ_ERR_NOMEM, "out of memory verifying %s", path);
  if (st == FJ_OK) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    fj__compile_many(j.job, j.n, cpus < 1 ? 1 : cpus > 16 ? 16 : (int)cpus,
                     NULL, NULL);
  }
  for (size_t i = 0; st == FJ_OK && i < j.n; i++) {
    const char *why = verify_one(&j.job[i], &it[j.kernel[i]]);
    if (why)
      st = verify_fail(ctx, path, (uint32_t)j.kernel[i], h->count,
                       &it[j.kernel[i]], why);
    it[j.kernel[i]].matched = 1;
  }
  for (uint32_t i = 0; st == FJ_OK && i < h->count; i++)
    if (kind_is(&it[i].v, "kernel") && !it[i].matched)
      st = verify_fail(ctx, path, i, h->count, &it[i],
                       "a kernel whose rendered source is not in the pack, "
                       "so it cannot be recompiled");
  verify_jobs_free(&j);
  free(it);
  return st;
}

/* Reads the pack's bytes into *data; FJ_OK or the failure. */
static fj_status pack_read(fj_ctx *ctx, const char *path, char **data,
                           size_t *size)
{
  char why[160];
  if ((*data = fj__file_read(path, PACK_MAX, size)) != NULL)
    return FJ_OK;
  int err = errno;
  if (err == ENOMEM)
    return fj__fail(ctx, FJ_ERR_NOMEM, "out of memory reading %s", path);
  fj__open_why(err, *size, PACK_MAX, why, sizeof why);
  return fj__fail(ctx, FJ_ERR_INVALID_ARG, "the cache pack %s %s", path, why);
}

/* The cache directory usable for writing; FJ_OK or the failure. */
static fj_status import_dir(fj_ctx *ctx)
{
  const char *dir = fj_cache_dir(ctx);
  if (!dir)
    return fj__fail(ctx, FJ_ERR_NOT_FOUND,
                    "the disk cache is disabled: nothing to import into");
  if (access(dir, W_OK) != 0)
    return fj__fail(ctx, FJ_ERR_IO, "cannot import into %s: %s", dir,
                    strerror(errno));
  return FJ_OK;
}

fj_status fj_cache_import(fj_ctx *ctx, const char *path,
                          fj_cache_pack_report *report)
{
  if (!ctx || !path)
    return fj__null_arg(ctx, "fj_cache_import", ctx ? "path" : "ctx");
  return fj_cache_import_ex(ctx, path, 0, report);
}

fj_status fj_cache_import_ex(fj_ctx *ctx, const char *path, unsigned flags,
                             fj_cache_pack_report *report)
{
  if (!ctx || !path)
    return fj__null_arg(ctx, "fj_cache_import_ex", ctx ? "path" : "ctx");
  fj__clear_error(ctx);
  if (flags & ~(unsigned)FJ_CACHE_IMPORT_VERIFY) {
    if (report)
      memset(report, 0, sizeof *report);
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "fj_cache_import_ex: flags = 0x%x has unknown bits "
                    "(known: FJ_CACHE_IMPORT_VERIFY = 0x%x)", flags,
                    (unsigned)FJ_CACHE_IMPORT_VERIFY);
  }
  fj_cache_pack_report r = {0};
  fj_status st = import_dir(ctx);
  size_t size = 0;
  char *data = NULL;
  pack_header h;
  if (st == FJ_OK)
    st = pack_read(ctx, path, &data, &size);
  if (st == FJ_OK && size < sizeof h)
    st = fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "%s is %zu bytes, shorter than a cache pack's header (%zu "
                  "bytes): truncated, or not a pack", path, size, sizeof h);
  if (st == FJ_OK) {
    memcpy(&h, data, sizeof h);
    st = header_check(ctx, path, &h, size);
  }
  if (st == FJ_OK) {
    r.entries = (int)h.count;
    st = pack_verify(ctx, path, data, size, &h);
  }
  if (st == FJ_OK && (flags & FJ_CACHE_IMPORT_VERIFY))
    st = pack_recompile(ctx, path, data, &h);
  if (st == FJ_OK)
    st = pack_install(ctx, data, &h, &r);
  free(data);
  if (report)
    *report = r;
  return st;
}
