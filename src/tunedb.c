/*
 * tunedb.c -- the tuning database: one JSON file (jansson, from Debian) in
 * the cache directory, {"format": 1, "entries": {key: entry}}, the key
 * naming the device, arch, driver and problem class.  Writes take a lock
 * file, merge into what is on disk, and rename a temporary into place.
 * Two processes tuning at once (one per GPU, say) each keep the other's
 * entries: the lock serialises the read-merge-rename, and a reader sees the
 * old file or the new one, never a half-written one.
 * The attention forward looks entries up; the tuner (tune.c) records them.
 * The file is read as the cache's entries are (util.c's bounded reads): a
 * FIFO, a link or a file over DB_MAX is ignored, never waited on.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "axes.h"
#include "ctx.h"
#include "mods.h"
#include "plan.h"
#include "tunedb.h"
#include "util.h"
#include "variant.h"

#define DB_FORMAT 1
#define DB_FILE "tune.json"
/* The largest database read: an entry takes about 300 bytes. */
#define DB_MAX ((uint64_t)64 << 20)

/* ---- problem classes ------------------------------------------------------------ */

/* device|arch|driver|d128|f16|kv=f16|causal=none|q=2^11|k=2^11|gqa=1, and
 * with modifications |mods=<their form's hash> (the expressions, the
 * parameters' names, types and ranks, the built-ins on, the block sizes:
 * what the kernel is compiled for, not the values); the backward's
 * entries end in |bwd, so that no forward lookup can find one. */
static void class_key(const fj_ctx *ctx, const fj_problem *p, int backward,
                      char *out, size_t size)
{
  fj_dtype kv = p->kv_dtype ? p->kv_dtype : p->dtype;
  fj_mods_info mi;
  fj__mods_info(p->mods, &mi);
  int n = snprintf(out, size, "%s|%s|%d|d%d|%s|kv=%s|causal=%s|q=2^%d|k=2^%d|gqa=%d",
                   ctx->dev.name, ctx->arch, ctx->dev.driver_version, p->head_dim,
                   fj_dtype_name(p->dtype), fj_dtype_name(kv),
                   fj_causal_name(p->causal), fj__log2_floor(p->seq_q), fj__log2_floor(p->seq_kv),
                   p->heads_q / p->heads_kv);
  /* Split head dims: V's and O's (MLA's prefill: 192 / 128), and |vk
   * where V is K's first columns (K's strides, MLA's cache): only there
   * may the mma family win, which reads V so. */
  if (fj__problem_dv(p) != p->head_dim && n > 0 && (size_t)n < size)
    n += snprintf(out + n, size - (size_t)n, "|dv=%d%s", fj__problem_dv(p),
                  fj__problem_v_in_k(p) ? "|vk" : "");
  if (mi.on && n > 0 && (size_t)n < size)
    n += snprintf(out + n, size - (size_t)n, "|mods=%016llx",
                  (unsigned long long)fj__mods_hash(p->mods));
  if (backward && n > 0 && (size_t)n < size)
    snprintf(out + n, size - (size_t)n, "|bwd");
}

/* ---- the database ------------------------------------------------------------------ */

static int db_path(const fj_ctx *ctx, char *out, size_t size)
{
  const char *dir = fj_cache_dir(ctx);
  if (!dir)
    return -1;
  snprintf(out, size, "%s/%s", dir, DB_FILE);
  return 0;
}

/* Whether a read failing with err says the file is no database (a link,
 * not a regular file, too large), rather than that this process could
 * not read it (memory, file descriptors, the disk). */
static int not_a_db(int err)
{
  return err == ELOOP || err == EINVAL || err == EFBIG;
}

/* The file's entries object, or a new empty one if there is no valid file
 * (a file that is no database is logged: it is ignored, not waited on);
 * NULL with errno when the file could not be read, which is no empty
 * database: a store would write the file anew with its one entry, a
 * listing list none. */
static json_t *db_read(const fj_ctx *ctx, const char *path)
{
  json_error_t err;
  size_t len = 0;
  char *text = path ? fj__file_read(path, DB_MAX, &len) : NULL;
  if (path && !text && errno != ENOENT && !not_a_db(errno))
    return NULL;
  if (path && !text && errno != ENOENT) {
    char why[128];
    fj__open_why(errno, len, DB_MAX, why, sizeof why);
    fj__log(ctx, FJ_LOG_WARN, "tuning database %s %s: ignored", path, why);
  }
  json_t *root = text ? json_loadb(text, len, 0, &err) : NULL;
  int nomem = text && !root && json_error_code(&err) == json_error_out_of_memory;
  free(text);
  if (nomem) {
    errno = ENOMEM;
    return NULL;
  }
  json_t *entries = root ? json_object_get(root, "entries") : NULL;
  if (!json_is_object(entries) ||
      json_integer_value(json_object_get(root, "format")) != DB_FORMAT)
    entries = NULL;
  json_t *out = entries ? json_incref(entries) : json_object();
  json_decref(root);
  return out;
}

static json_t *db_entries(fj_ctx *ctx)
{
  if (!ctx->tunedb) {
    char path[4200];
    ctx->tunedb =
        db_read(ctx, db_path(ctx, path, sizeof path) == 0 ? path : NULL);
  }
  return ctx->tunedb;
}

void fj__tunedb_free(void *db)
{
  json_decref(db);
}

/* A variant's axes as an object, a key per row of FJ_VARIANT_AXES (named
 * axes by their value's name), in the table's order. */
static json_t *variant_json(const fj_variant *v)
{
  json_t *o = json_object();
  fj_axis_info a;
  for (int i = 0; o && i < fj_axis_count(); i++) {
    int x = fj__axis_of(v, i);
    if (fj_axis_get(i, &a) != FJ_OK ||
        json_object_set_new(o, a.name, a.kind == FJ_AXIS_NAMED
                                           ? json_string(fj_axis_value_name(i, x))
                                           : json_integer(x)) != 0) {
      json_decref(o);
      return NULL;
    }
  }
  return o;
}

/* One axis of an entry's variant onto v; 0 on success.  Switches are
 * absent from databases written before them (0). */
static int axis_from_json(json_t *j, const fj_axis_info *a, int axis, fj_variant *v)
{
  json_t *x = json_object_get(j, a->name);
  if (a->kind == FJ_AXIS_NAMED)
    return (*fj__axis_field(v, axis) = fj_axis_value(axis, json_string_value(x))) ? 0 : -1;
  if (!x && a->kind == FJ_AXIS_SWITCH)
    return *fj__axis_field(v, axis) = 0;
  if (!json_is_integer(x) || json_integer_value(x) < INT_MIN ||
      json_integer_value(x) > INT_MAX)
    return -1;
  *fj__axis_field(v, axis) = (int)json_integer_value(x);
  return 0;
}

/* Reads an entry's variant onto v (which holds the problem's head dim,
 * dtypes and mask); 0 on success. */
static int variant_from_json(json_t *j, fj_variant *v)
{
  fj_axis_info a;
  if (!json_is_object(j))
    return -1;
  for (int i = 0; i < fj_axis_count(); i++)
    if (fj_axis_get(i, &a) != FJ_OK || axis_from_json(j, &a, i, v) != 0)
      return -1;
  return 0;
}

/* The value of enumeration name's spelling among first..last (name(v)
 * gives each), or 0 where none has it. */
static int enum_value(const char *text, int first, int last,
                      const char *(*name)(int))
{
  for (int v = first; v <= last; v++)
    if (!strcmp(text, name(v)))
      return v;
  return 0;
}

static const char *dtype_name(int d) { return fj_dtype_name((fj_dtype)d); }
static const char *causal_name(int c) { return fj_causal_name((fj_causal)c); }

/* The problem class's head dim, dtypes and mask (class_key's fields after
 * device|arch|driver|) onto v: an entry's axes alone are no variant, and
 * `cache prewarm --from-tune-db` prewarms what fj_tune_list gives.  A key
 * of another form leaves v as it is.  A class with modifications
 * (|mods=<hash>) gives its fields too, but not the expressions, which the
 * key names by their hash alone: v is the plain dense kernel of the
 * class, which the prewarm skips (cli_cache.c's key_extra), as it skips
 * any key with fields after gqa= (|dv=: a split head_dim_v). */
static void class_from_key(const char *key, fj_variant *v)
{
  const char *p = key;
  for (int bars = 0; p && bars < 3; bars++)
    p = strchr(p, '|') ? strchr(p, '|') + 1 : NULL;
  char dt[16], kv[16], causal[16];
  int d;
  if (!p || sscanf(p, "d%d|%15[^|]|kv=%15[^|]|causal=%15[^|]", &d, dt, kv,
                   causal) != 4)
    return;
  int dtype = enum_value(dt, FJ_F16, FJ_F32, dtype_name);
  int kvt = enum_value(kv, FJ_F16, FJ_F32, dtype_name);
  int c = enum_value(causal, FJ_CAUSAL_NONE, FJ_CAUSAL_BOTTOM_RIGHT, causal_name);
  if (!dtype || !kvt || (!c && strcmp(causal, "none") != 0))
    return;
  v->head_dim = d;
  v->dtype = (fj_dtype)dtype;
  v->kv_dtype = kvt == dtype ? 0 : (fj_dtype)kvt;
  v->causal = (fj_causal)c;
}

/* The entry's variant for p's class (forward or backward) onto *v; 0 if
 * there is none or it does not read as a variant. */
static int lookup(fj_ctx *ctx, const fj_problem *p, int backward,
                  fj_variant *v)
{
  char key[512];
  if (!ctx->has_device)
    return 0;
  class_key(ctx, p, backward, key, sizeof key);
  json_t *e = json_object_get(db_entries(ctx), key);
  return e && variant_from_json(json_object_get(e, "variant"), v) == 0;
}

int fj__tune_lookup(fj_ctx *ctx, const fj_problem *p, fj_variant *v)
{
  fj_variant tuned = *v;  /* head_dim_v as the problem's (class |dv=) */
  if (!lookup(ctx, p, 0, &tuned) || fj__variant_validate(ctx, &tuned) != FJ_OK)
    return 0;
  /* A class tuned on dense tensors to wgmma does not fit a member whose
   * strides TMA cannot encode (a broadcast Q, K or V): the heuristic's.
   * Nor does an mma pick of split head dims one whose V is not in K's
   * rows (the class says |vk; a database edited by hand may not). */
  if (tuned.mma == FJ_MMA_WGMMA && !fj__plan_wgmma_fits(ctx, p))
    return 0;
  if (tuned.mma == FJ_MMA_SYNC && !fj__problem_mma_reads_v(p))
    return 0;
  *v = tuned;
  return 1;
}

int fj__tune_lookup_bwd(fj_ctx *ctx, const fj_problem *p, fj_mma *mma,
                        int *stages)
{
  fj_variant tuned;
  memset(&tuned, 0, sizeof tuned);
  if (!lookup(ctx, p, 1, &tuned))
    return 0;
  *mma = tuned.mma;
  *stages = tuned.stages;
  return 1;
}

static void now_iso(char *out, size_t size)
{
  time_t t = time(NULL);
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(out, size, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* Writes root to a new file at tmp: whatever was there (a stale temporary,
 * a link, a FIFO) is removed, not written through or waited on. */
static int db_dump(const json_t *root, const char *tmp)
{
  unlink(tmp);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    return -1;
  int bad = json_dumpfd(root, fd, JSON_INDENT(1) | JSON_SORT_KEYS) != 0;
  int err = errno;
  if (close(fd) != 0 && !bad) {
    bad = 1;
    err = errno;
  }
  errno = err;
  return bad ? -1 : 0;
}

/* Merges one entry into the file under a lock, atomically. */
static fj_status db_store(fj_ctx *ctx, const char *key, json_t *entry)
{
  json_object_set(db_entries(ctx), key, entry);
  char path[4200], lock[4300], tmp[4300];
  if (db_path(ctx, path, sizeof path) != 0)
    return FJ_OK;  /* memory only: kept in the context */
  snprintf(lock, sizeof lock, "%s.lock", path);
  char id[FJ_TEMP_ID_MAX];
  fj__temp_id(id);
  snprintf(tmp, sizeof tmp, "%s.tmp-%s", path, id);
  int fd = open(lock, O_CREAT | O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0 || flock(fd, LOCK_EX) != 0) {
    fj__log(ctx, FJ_LOG_WARN, "cannot lock %s (%s): tuning result kept in "
                              "memory only", lock, strerror(errno));
    if (fd >= 0)
      close(fd);
    return FJ_OK;
  }
  json_t *entries = db_read(ctx, path);
  if (!entries) {
    fj__log(ctx, FJ_LOG_WARN, "cannot read %s (%s): tuning result kept in "
                              "memory only", path, strerror(errno));
    flock(fd, LOCK_UN);
    close(fd);
    return FJ_OK;
  }
  json_object_set(entries, key, entry);
  /* What other processes recorded (another GPU's tuner, say) is the
   * context's to use from now on too. */
  json_decref(ctx->tunedb);
  ctx->tunedb = json_incref(entries);
  json_t *root = json_pack("{s:i, s:o}", "format", DB_FORMAT, "entries", entries);
  int bad = db_dump(root, tmp) != 0 || rename(tmp, path) != 0;
  if (bad) {
    fj__log(ctx, FJ_LOG_WARN, "cannot write %s (%s): tuning result kept in "
                              "memory only", path, strerror(errno));
    unlink(tmp);
  }
  json_decref(root);
  flock(fd, LOCK_UN);
  close(fd);
  return FJ_OK;
}

static int key_cmp(const void *a, const void *b)
{
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

fj_status fj_tune_list(fj_ctx *ctx, fj_tune_visit_fn fn, void *user)
{
  if (!ctx || !fn)
    return fj__null_arg(ctx, "fj_tune_list", ctx ? "fn" : "ctx");
  fj__clear_error(ctx);
  char path[4200];
  if (db_path(ctx, path, sizeof path) != 0 || access(path, R_OK) != 0)
    return fj__fail(ctx, FJ_ERR_NOT_FOUND, "no tuning database (%s)",
                    fj_cache_dir(ctx) ? path : "the disk cache is disabled");
  json_t *entries = db_read(ctx, path);
  if (!entries)
    return fj__fail(ctx, errno == ENOMEM ? FJ_ERR_NOMEM : FJ_ERR_IO,
                    "cannot read the tuning database %s: %s", path,
                    strerror(errno));
  size_t count = json_object_size(entries);
  const char **keys = calloc(count + 1, sizeof *keys);
  if (!keys) {
    json_decref(entries);
    return fj__fail(ctx, FJ_ERR_NOMEM, "out of memory for %zu tuning entries",
                    count);
  }
  size_t n = 0;
  const char *key;
  json_t *e;
  json_object_foreach(entries, key, e)
    keys[n++] = key;
  qsort(keys, n, sizeof *keys, key_cmp);
  for (size_t i = 0; i < n; i++) {
    e = json_object_get(entries, keys[i]);
    fj_tune_entry te;
    memset(&te, 0, sizeof te);
    te.key = keys[i];
    class_from_key(keys[i], &te.variant);
    variant_from_json(json_object_get(e, "variant"), &te.variant);
    te.ms = json_real_value(json_object_get(e, "ms"));
    te.default_ms = json_real_value(json_object_get(e, "default_ms"));
    te.shape = json_string_value(json_object_get(e, "shape"));
    te.date = json_string_value(json_object_get(e, "date"));
    if (fn(user, &te))
      break;
  }
  free(keys);
  json_decref(entries);
  return FJ_OK;
}

/* Records v for p's class, the forward's or the backward's. */
static fj_status record(fj_ctx *ctx, const fj_problem *p, int backward,
                        const fj_variant *v, double ms, double default_ms)
{
  char key[512], date[32], shape[96];
  class_key(ctx, p, backward, key, sizeof key);
  now_iso(date, sizeof date);
  snprintf(shape, sizeof shape, "%d,%d/%d,%d/%d,%d", p->batch, p->heads_q,
           p->heads_kv, p->seq_q, p->seq_kv, p->head_dim);
  json_t *e = json_pack("{s:o, s:f, s:f, s:s, s:s}", "variant", variant_json(v),
                        "ms", ms, "default_ms", default_ms, "shape", shape,
                        "date", date);
  if (!e)
    return fj__fail(ctx, FJ_ERR_NOMEM, "cannot build the tuning entry");
  pthread_mutex_lock(&ctx->lock);
  fj_status st = db_store(ctx, key, e);
  ctx->tunedb_generation++;  /* the dispatch caches' choices are stale */
  pthread_mutex_unlock(&ctx->lock);
  json_decref(e);
  return st;
}


fj_status fj__tune_record(fj_ctx *ctx, const fj_problem *p,
                          const fj_variant *v, double ms, double default_ms)
{
  return record(ctx, p, 0, v, ms, default_ms);
}

fj_status fj__tune_record_bwd(fj_ctx *ctx, const fj_problem *p,
                              const fj_variant *v, double ms,
                              double default_ms)
{
  return record(ctx, p, 1, v, ms, default_ms);
}
