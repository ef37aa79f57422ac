/*
 * tune.c -- autotuning and the tuning database.
 *
 * fj_tune enumerates the variants of a problem, lets fj_kernel_prepare
 * compile them in parallel child processes (so that a compiler crash costs
 * one candidate), runs each on random inputs, checks its output against the
 * default variant's with a reduction kernel on the device
 * (templates/compare.cu), times it with events and keeps the fastest.
 *
 * The database is one JSON file (jansson, from Debian) in the cache
 * directory: {"format": 1, "entries": {key: entry}}, the key naming the
 * device, arch, driver and problem class.  Writes take a lock file, merge
 * into what is on disk, and rename a temporary into place.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "internal.h"

#define DB_FORMAT 1
#define DB_FILE "tune.json"

/* ---- problem classes ------------------------------------------------------------ */

static int bucket(int n)
{
  int b = 0;
  while ((1 << (b + 1)) <= n)
    b++;
  return b;
}

/* device|arch|driver|d128|f16|kv=f16|causal=none|q=2^11|k=2^11|gqa=1 */
static void class_key(const fj_ctx *ctx, const fj_problem *p, char *out,
                      size_t size)
{
  fj_dtype kv = p->kv_dtype ? p->kv_dtype : p->dtype;
  snprintf(out, size, "%s|%s|%d|d%d|%s|kv=%s|causal=%s|q=2^%d|k=2^%d|gqa=%d",
           ctx->dev.name, ctx->arch, ctx->dev.driver_version, p->head_dim,
           fj_dtype_name(p->dtype), fj_dtype_name(kv),
           fj_causal_name(p->causal), bucket(p->seq_q), bucket(p->seq_kv),
           p->heads_q / p->heads_kv);
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

/* The file's entries object, or a new empty one if there is no valid file. */
static json_t *db_read(const char *path)
{
  json_error_t err;
  json_t *root = path ? json_load_file(path, 0, &err) : NULL;
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
    ctx->tunedb = db_read(db_path(ctx, path, sizeof path) == 0 ? path : NULL);
  }
  return ctx->tunedb;
}

void fj__tunedb_free(void *db)
{
  json_decref(db);
}

static json_t *variant_json(const fj_variant *v)
{
  return json_pack("{s:i, s:i, s:i, s:i, s:s, s:s, s:s}", "tile_m",
                   v->tile_m, "tile_n", v->tile_n, "warps", v->warps,
                   "stages", v->stages, "swizzle", fj_swizzle_name(v->swizzle),
                   "softmax", fj_softmax_name(v->softmax), "mma",
                   fj_mma_name(v->mma));
}

static int name_value(const char *s, const char *const *names, int n)
{
  for (int i = 0; i < n; i++)
    if (s && !strcmp(s, names[i]))
      return i + 1;
  return 0;
}

/* Reads an entry's variant onto v (which holds the problem's head dim,
 * dtypes and mask); 0 on success. */
static int variant_from_json(json_t *j, fj_variant *v)
{
  static const char *const swizzles[] = {"none", "pad", "xor"};
  static const char *const softmaxes[] = {"smem", "regs"};
  static const char *const mmas[] = {"wmma", "mma", "wgmma"};
  const char *swz = NULL, *sm = NULL, *mma = NULL;
  if (json_unpack(j, "{s:i, s:i, s:i, s:i, s:s, s:s, s:s}", "tile_m",
                  &v->tile_m, "tile_n", &v->tile_n, "warps", &v->warps,
                  "stages", &v->stages, "swizzle", &swz, "softmax", &sm,
                  "mma", &mma) != 0)
    return -1;
  v->swizzle = (fj_swizzle)name_value(swz, swizzles, 3);
  v->softmax = (fj_softmax)name_value(sm, softmaxes, 2);
  v->mma = (fj_mma)name_value(mma, mmas, 3);
  return v->swizzle && v->softmax && v->mma ? 0 : -1;
}

int fj__tune_lookup(fj_ctx *ctx, const fj_problem *p, fj_variant *v)
{
  char key[512];
  if (!ctx->has_device)
    return 0;
  class_key(ctx, p, key, sizeof key);
  json_t *e = json_object_get(db_entries(ctx), key);
  fj_variant tuned = *v;
  if (!e || variant_from_json(json_object_get(e, "variant"), &tuned) != 0 ||
      fj__variant_validate(ctx, &tuned) != FJ_OK)
    return 0;
  *v = tuned;
  return 1;
}

static void now_iso(char *out, size_t size)
{
  time_t t = time(NULL);
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(out, size, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* Merges one entry into the file under a lock, atomically. */
static fj_status db_store(fj_ctx *ctx, const char *key, json_t *entry)
{
  json_object_set(db_entries(ctx), key, entry);
  char path[4200], lock[4300], tmp[4300];
  if (db_path(ctx, path, sizeof path) != 0)
    return FJ_OK;  /* memory only: kept in the context */
  snprintf(lock, sizeof lock, "%s.lock", path);
  snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
  int fd = open(lock, O_CREAT | O_RDWR, 0644);
  if (fd < 0 || flock(fd, LOCK_EX) != 0) {
    fj__log(ctx, FJ_LOG_WARN, "cannot lock %s (%s): tuning result kept in "
                              "memory only", lock, strerror(errno));
    if (fd >= 0)
      close(fd);
    return FJ_OK;
  }
  json_t *entries = db_read(path);
  json_object_set(entries, key, entry);
  json_t *root = json_pack("{s:i, s:o}", "format", DB_FORMAT, "entries", entries);
  int bad = json_dump_file(root, tmp, JSON_INDENT(1) | JSON_SORT_KEYS) != 0 ||
            rename(tmp, path) != 0;
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
    return fj__fail(ctx, FJ_ERR_INVALID_ARG, "fj_tune_list: NULL argument");
  fj__clear_error(ctx);
  char path[4200];
  if (db_path(ctx, path, sizeof path) != 0 || access(path, R_OK) != 0)
    return fj__fail(ctx, FJ_ERR_NOT_FOUND, "no tuning database (%s)",
                    fj_cache_dir(ctx) ? path : "the disk cache is disabled");
  json_t *entries = db_read(path);
  const char **keys = calloc(json_object_size(entries) + 1, sizeof *keys);
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

/* ---- tuning ------------------------------------------------------------------------ */

void fj_tune_opts_init(fj_tune_opts *o)
{
  memset(o, 0, sizeof *o);
  o->iters = 10;
  o->warmup = 2;
  o->save = 1;
}

typedef struct tune_run {
  fj_ctx *ctx;
  const fj_problem *p;   /* with the tuner's own scales for FP8 */
  fj_problem prob;
  const fj_tune_opts *o;
  uint64_t q, k, v, out, ref, sums, scales;
  size_t nout;           /* elements of the output span */
  fj_kernel *compare;
  void *compare_fn, *e0, *e1;
  size_t done, total;    /* progress steps */
} tune_run;

static size_t span(const int64_t s[3], int b, int h, int seq, int d)
{
  return (size_t)((b - 1) * s[0] + (h - 1) * s[1] + (seq - 1) * s[2] + d);
}

/* n random values in [-scale, scale), converted to dt, into device memory. */
static fj_status upload_random(fj_ctx *ctx, uint64_t *dst, fj_dtype dt,
                               size_t n, float scale, uint64_t *state)
{
  float *f = malloc(n * sizeof *f);
  void *h = malloc(n * 2 + 16);
  fj_status st = f && h ? fj__cu_alloc(ctx, n * (size_t)fj__dtype_bytes(dt), dst)
                        : fj__fail(ctx, FJ_ERR_NOMEM, "out of memory");
  for (size_t i = 0; st == FJ_OK && i < n; i++) {
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    f[i] = ((float)(x >> 40) / 16777216.0f * 2.0f - 1.0f) * scale;
  }
  if (st == FJ_OK)
    fj_convert(dt, h, FJ_F32, f, n);
  if (st == FJ_OK)
    st = fj__cu_copy_to_device(ctx, *dst, h, n * (size_t)fj__dtype_bytes(dt));
  free(f);
  free(h);
  return st;
}

/* FP8 K/V: values over e4m3's range with per-head scales of 1/64. */
static fj_status fp8_scales(tune_run *t)
{
  size_t n = (size_t)t->prob.batch * (size_t)t->prob.heads_kv;
  float *s = malloc(n * sizeof *s);
  if (!s)
    return fj__fail(t->ctx, FJ_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < n; i++)
    s[i] = 1.0f / 64;
  fj_status st = fj__cu_alloc(t->ctx, 2 * n * sizeof *s, &t->scales);
  if (st == FJ_OK)
    st = fj__cu_copy_to_device(t->ctx, t->scales, s, n * sizeof *s);
  if (st == FJ_OK)
    st = fj__cu_copy_to_device(t->ctx, t->scales + n * sizeof *s, s, n * sizeof *s);
  t->prob.k_scale = (const void *)(uintptr_t)t->scales;
  t->prob.v_scale = (const void *)(uintptr_t)(t->scales + n * sizeof *s);
  free(s);
  return st;
}

static fj_status inputs_make(tune_run *t)
{
  const fj_problem *p = &t->prob;
  fj_dtype kv = p->kv_dtype ? p->kv_dtype : p->dtype;
  size_t nq = span(p->q_stride, p->batch, p->heads_q, p->seq_q, p->head_dim);
  size_t nk = span(p->k_stride, p->batch, p->heads_kv, p->seq_kv, p->head_dim);
  t->nout = span(p->o_stride, p->batch, p->heads_q, p->seq_q, p->head_dim);
  uint64_t state = UINT64_C(0x2545f4914f6cdd1d);
  float kvs = kv == FJ_E4M3 ? 64.f : 1.f;
  fj_status st = upload_random(t->ctx, &t->q, p->dtype, nq, 1.f, &state);
  if (st == FJ_OK)
    st = upload_random(t->ctx, &t->k, kv, nk, kvs, &state);
  if (st == FJ_OK)
    st = upload_random(t->ctx, &t->v, kv, nk, kvs, &state);
  if (st == FJ_OK)
    st = fj__cu_alloc(t->ctx, t->nout * 2, &t->out);
  if (st == FJ_OK)
    st = fj__cu_alloc(t->ctx, t->nout * 2, &t->ref);
  if (st == FJ_OK)
    st = fj__cu_alloc(t->ctx, 3 * sizeof(double), &t->sums);
  if (st == FJ_OK && kv == FJ_E4M3)
    st = fp8_scales(t);
  return st;
}

static void inputs_free(tune_run *t)
{
  uint64_t *all[] = {&t->q, &t->k, &t->v, &t->out, &t->ref, &t->sums, &t->scales};
  for (size_t i = 0; i < FJ_ARRAY_LEN(all); i++)
    fj__cu_free(*all[i]);
  fj__cu_event_destroy(t->e0);
  fj__cu_event_destroy(t->e1);
}

/* The comparison kernel (templates/compare.cu) for the output dtype. */
static fj_status compare_kernel(tune_run *t)
{
  fj_param params[] = {
      {"arch", FJ_PARAM_STR, 0, t->ctx->arch, NULL},
      {"version", FJ_PARAM_STR, 0, fj_version(), NULL},
      {"dtype", FJ_PARAM_STR, 0, fj_dtype_name(t->prob.dtype), NULL},
  };
  pthread_mutex_lock(&t->ctx->lock);
  fj_status st = fj__kernel_build(t->ctx, "compare.cu", params,
                                  FJ_ARRAY_LEN(params), &t->compare);
  if (st == FJ_OK)
    st = fj__kernel_function(t->ctx, t->compare, &t->compare_fn);
  pthread_mutex_unlock(&t->ctx->lock);
  return st;
}

/* Relative distance of the output from the reference; non-finite -> inf. */
static fj_status distance(tune_run *t, double *rel)
{
  double sums[3] = {0, 0, 0};
  unsigned long long n = t->nout;
  void *args[] = {&t->out, &t->ref, &n, &t->sums};
  fj_launch l = {t->compare_fn, {264, 1, 1}, {256, 1, 1}, 0, NULL, args};
  fj_status st = fj__cu_memset(t->ctx, t->sums, 0, sizeof sums);
  if (st == FJ_OK)
    st = fj__cu_launch(t->ctx, &l);
  if (st == FJ_OK)
    st = fj__cu_copy_to_host(t->ctx, sums, t->sums, sizeof sums);
  *rel = sums[2] > 0 ? HUGE_VAL : sqrt(sums[0] / (sums[1] > 0 ? sums[1] : 1));
  return st;
}

static fj_status launch(tune_run *t, const fj_variant *v, uint64_t out)
{
  return fj_attention_fwd_variant(t->ctx, &t->prob, v, (void *)(uintptr_t)t->q,
                                  (void *)(uintptr_t)t->k, (void *)(uintptr_t)t->v,
                                  (void *)(uintptr_t)out, NULL, NULL);
}

static int cmp_float(const void *a, const void *b)
{
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* Median of `iters` launches between events, after `warmup` more. */
static fj_status time_one(tune_run *t, const fj_variant *v, double *median)
{
  int iters = t->o->iters > 0 ? t->o->iters : 10;
  float ms[256];
  if (iters > 256)
    iters = 256;
  fj_status st = FJ_OK;
  for (int i = 0; i < t->o->warmup && st == FJ_OK; i++)
    st = launch(t, v, t->out);
  for (int i = 0; i < iters && st == FJ_OK; i++) {
    st = fj__cu_event_record(t->ctx, t->e0, NULL);
    if (st == FJ_OK)
      st = launch(t, v, t->out);
    if (st == FJ_OK)
      st = fj__cu_event_record(t->ctx, t->e1, NULL);
    if (st == FJ_OK)
      st = fj__cu_event_ms(t->ctx, t->e0, t->e1, &ms[i]);
  }
  qsort(ms, (size_t)iters, sizeof *ms, cmp_float);
  *median = ms[iters / 2];
  return st;
}

/* The candidates: the heuristic's choice first (ties go to it), then every
 * tile/warps/stages/swizzle/softmax combination. */
static size_t candidates(fj_ctx *ctx, const fj_problem *p, fj_variant *out,
                         size_t max)
{
  static const int tm[] = {64, 128}, tn[] = {32, 64, 128}, w[] = {4, 8};
  size_t n = 0;
  fj__heuristic(ctx, p, &out[n++]);
  for (int a = 0; a < 2; a++)
    for (int b = 0; b < 3; b++)
      for (int c = 0; c < 2; c++)
        for (int st = 1; st <= 3; st++)
          for (int sw = FJ_SWIZZLE_NONE; sw <= FJ_SWIZZLE_XOR; sw++)
            for (int sm = FJ_SOFTMAX_SMEM; sm <= FJ_SOFTMAX_REGS && n < max; sm++) {
              fj_variant v = out[0];
              v.tile_m = tm[a];
              v.tile_n = tn[b];
              v.warps = w[c];
              v.stages = st;
              v.swizzle = (fj_swizzle)sw;
              v.softmax = (fj_softmax)sm;
              if (memcmp(&v, &out[0], sizeof v) != 0)
                out[n++] = v;
            }
  return n;
}

static void step(tune_run *t)
{
  t->done++;
  if (t->o->progress)
    t->o->progress(t->o->user, t->done, t->total);
}

static void compile_progress(void *user, size_t done, size_t total)
{
  tune_run *t = user;
  (void)total;
  if (t->o->progress && done <= t->total / 2)
    t->o->progress(t->o->user, done, t->total);
}

/* Checks and times every compiled candidate; the first (the heuristic's)
 * becomes the reference.  *best gets the fastest index. */
static fj_status measure(tune_run *t, const fj_variant *vs, const fj_status *ok,
                         size_t n, fj_tune_report *r, size_t *best)
{
  double best_ms = INFINITY;
  for (size_t i = 0; i < n; i++, step(t)) {
    if (ok[i] != FJ_OK)
      continue;
    double rel = 0, ms = 0;
    uint64_t dst = i == 0 ? t->ref : t->out;
    fj_status st = fj__cu_memset(t->ctx, dst, 0, t->nout * 2);
    if (st == FJ_OK)
      st = launch(t, &vs[i], dst);
    if (st == FJ_OK && i > 0)
      st = distance(t, &rel);
    if (st == FJ_OK && !(rel < 1e-2)) {
      r->wrong++;
      continue;
    }
    if (st == FJ_OK)
      st = time_one(t, &vs[i], &ms);
    if (st != FJ_OK) {
      if (i == 0)
        return st;  /* without the reference nothing can be checked */
      r->failed++;
      continue;
    }
    r->timed++;
    if (i == 0)
      r->default_ms = ms;
    if (ms < best_ms) {
      best_ms = ms;
      *best = i;
    }
  }
  r->best_ms = best_ms;
  return FJ_OK;
}

fj_status fj__tune_record(fj_ctx *ctx, const fj_problem *p,
                          const fj_variant *v, double ms, double default_ms)
{
  char key[512], date[32], shape[96];
  class_key(ctx, p, key, sizeof key);
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
  fj__picks_clear(ctx);
  pthread_mutex_unlock(&ctx->lock);
  json_decref(e);
  return st;
}

static fj_status save(tune_run *t, const fj_variant *v, const fj_tune_report *r)
{
  return fj__tune_record(t->ctx, t->p, v, r->best_ms, r->default_ms);
}

static fj_status tune_body(tune_run *t, fj_variant *best, fj_tune_report *r)
{
  enum { MAX = 256 };
  fj_variant *vs = calloc(MAX, sizeof *vs);
  fj_status *ok = calloc(MAX, sizeof *ok);
  if (!vs || !ok) {
    free(vs);
    free(ok);
    return fj__fail(t->ctx, FJ_ERR_NOMEM, "out of memory");
  }
  size_t n = candidates(t->ctx, t->p, vs, MAX), win = 0;
  r->candidates = (int)n;
  t->total = 2 * n;
  double t0 = fj__now_ms();
  fj_prepare_opts po = {t->o->workers, compile_progress, t};
  fj_kernel_prepare(t->ctx, vs, n, &po, ok);
  r->compile_s = (fj__now_ms() - t0) / 1e3;
  for (size_t i = 0; i < n; i++) {
    r->refused += ok[i] == FJ_ERR_UNSUPPORTED || ok[i] == FJ_ERR_RESOURCES;
    r->failed += ok[i] != FJ_OK && ok[i] != FJ_ERR_UNSUPPORTED &&
                 ok[i] != FJ_ERR_RESOURCES;
  }
  t->done = n;
  fj_status st = ok[0] == FJ_OK ? measure(t, vs, ok, n, r, &win)
                                : fj__fail(t->ctx, FJ_ERR_TUNE,
                                           "the default variant did not compile");
  if (st == FJ_OK && best)
    *best = vs[win];
  if (st == FJ_OK && t->o->save)
    st = save(t, &vs[win], r);
  free(vs);
  free(ok);
  return st;
}

fj_status fj_tune(fj_ctx *ctx, const fj_problem *p, const fj_tune_opts *opts,
                  fj_variant *best, fj_tune_report *report)
{
  fj_tune_opts defaults;
  fj_tune_report r;
  memset(&r, 0, sizeof r);
  if (!ctx || !p)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG, "fj_tune: NULL context or problem");
  fj__clear_error(ctx);
  if (!opts) {
    fj_tune_opts_init(&defaults);
    opts = &defaults;
  }
  tune_run t = {ctx, p, *p, opts, 0, 0, 0, 0, 0, 0, 0, 0, NULL, NULL, NULL,
                NULL, 0, 0};
  double t0 = fj__now_ms();
  /* FP8 scales come from the tuner's own inputs. */
  static const float placeholder[1];
  fj_problem check = *p;
  if (check.kv_dtype == FJ_E4M3)
    check.k_scale = check.v_scale = placeholder;
  fj_status st = fj_problem_check(ctx, &check);
  if (st == FJ_OK && (st = fj__cu_enter(ctx)) == FJ_OK) {
    if ((st = inputs_make(&t)) == FJ_OK && (st = compare_kernel(&t)) == FJ_OK &&
        (st = fj__cu_event_create(ctx, &t.e0)) == FJ_OK &&
        (st = fj__cu_event_create(ctx, &t.e1)) == FJ_OK)
      st = tune_body(&t, best, &r);
    inputs_free(&t);
    fj__cu_leave(ctx);
  }
  r.total_s = (fj__now_ms() - t0) / 1e3;
  if (report)
    *report = r;
  return st;
}
