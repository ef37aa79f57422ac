/*
 * kernel.c -- from template parameters to a loaded kernel: the memory cache
 * (template + parameters -> kernel), then the disk cache (keyed by the
 * rendered source, NVRTC options, arch, NVRTC version and format), then
 * NVRTC.  Kernels live as long as their context.
 *
 * The render index spares a disk hit the render (Lua, 1-2 ms): a disk entry
 * of kind "render", keyed by the built-in templates' hash and the memory
 * key (every parameter, a table's whole contents: what the C side printed
 * for the template), holds the rendered source and its metadata.  With that source the
 * kernel's own key is computed as always.  Templates from
 * FLASHJIT_TEMPLATE_DIR are always rendered: they may change under us.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "compile.h"
#include "ctx.h"
#include "driver.h"
#include "entry.h"
#include "kernel.h"
#include "kparams.h"
#include "mods.h"
#include "mods_kernel.h"
#include "package.h"
#include "template.h"
#include "util.h"

enum { KMAP_BUCKETS = 512 };

/* A kernel under its memory key, or (kernel NULL) a mark that one thread
 * compiles that key with the context's lock released (fj__kernel_build):
 * a build of the same key waits for it, on `compiled`. */
typedef struct kentry {
  char *key;
  fj_kernel *kernel;
  struct kentry *next;
} kentry;

struct fj_kmap {
  kentry *buckets[KMAP_BUCKETS];
  pthread_cond_t compiled;  /* a mark went: its kernel is in, or failed */
};

/* ---- the memory cache ----------------------------------------------------------- */

static int key_kid(fj_buf *key, const fj_param *p);

/* The key's pieces, written without printf (a call's kernels are looked
 * up by their keys on every launch): a string, and a number as "%lld" or
 * "%016llx" would print it. */
static int key_str(fj_buf *key, const char *s)
{
  return fj__buf_append(key, s ? s : "(null)", strlen(s ? s : "(null)"));
}

static int key_int(fj_buf *key, long long v)
{
  char d[24], *e = d + sizeof d, *c = e;
  unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v
                                : (unsigned long long)v;
  do
    *--c = (char)('0' + u % 10);
  while (u /= 10);
  if (v < 0)
    *--c = '-';
  return fj__buf_append(key, c, (size_t)(e - c));
}

static int key_hex(fj_buf *key, uint64_t v)
{
  char d[16];
  for (int i = 15; i >= 0; i--, v >>= 4)
    d[i] = "0123456789abcdef"[v & 15];
  return fj__buf_append(key, d, sizeof d);
}

/* "|name=" of a parameter. */
static int key_name(fj_buf *key, const char *name)
{
  return key_str(key, "|") || key_str(key, name) || key_str(key, "=");
}

static uint64_t lut_hash(const fj_param *p)
{
  return fj__hash64(p->lut->map, sizeof p->lut->map);
}

/* A table parameter's part of a key: every kid, whole.  Its contents are
 * what the C side printed for the template (the expressions' CUDA and
 * facts: mods_kernel.c), so the key -- the render index's too -- changes
 * whenever that printing does, not only when the templates or the user's
 * texts do. */
static int key_table(fj_buf *key, const fj_param *p)
{
  const fj_param *kid = fj_param_kids(p);
  int bad = key_str(key, "{");
  for (long long i = 0; i < p->i && !bad; i++)
    bad = (i && key_str(key, ",")) ||
          key_str(key, kid[i].key ? kid[i].key : "") || key_str(key, "=") ||
          key_kid(key, &kid[i]);
  return bad || key_str(key, "}");
}

/* A table's kid, typed as the template receives it; a string with its
 * length (printed CUDA may hold any separator), nil as ~. */
static int key_kid(fj_buf *key, const fj_param *p)
{
  switch (p->type) {
  case FJ_PARAM_STR:
    return p->s ? key_str(key, "s") || key_int(key, (long long)strlen(p->s)) ||
                      key_str(key, ":") || key_str(key, p->s)
                : key_str(key, "~");
  case FJ_PARAM_BOOL:
    return key_str(key, p->i ? "b1" : "b0");
  case FJ_PARAM_TABLE:
    return key_table(key, p);
  case FJ_PARAM_LUT:
    return key_str(key, "l") || key_hex(key, lut_hash(p));
  case FJ_PARAM_INT:
    break;
  }
  return key_str(key, "i") || key_int(key, p->i);
}

/* The memory-cache key: the template name and every parameter, in the order
 * given (callers always build parameters in one fixed order). */
static int memory_key(fj_buf *key, const char *name, const fj_param *p,
                      size_t n)
{
  int bad = key_str(key, name);
  for (size_t i = 0; i < n && !bad; i++) {
    bad = key_name(key, p[i].key);
    if (bad)
      break;
    if (p[i].type == FJ_PARAM_STR)
      bad = key_str(key, p[i].s);
    else if (p[i].type == FJ_PARAM_LUT)
      bad = key_hex(key, lut_hash(&p[i]));
    else if (p[i].type == FJ_PARAM_TABLE)
      bad = key_table(key, &p[i]);
    else
      bad = key_int(key, p[i].i);
  }
  return bad;
}

/* The kernel's entry under key (compiling 0), or the mark of its compile
 * (compiling 1); NULL if none. */
static kentry *kmap_entry(const fj_kmap *m, const fj_buf *key, int compiling)
{
  if (!m)
    return NULL;
  for (kentry *e = m->buckets[fj__hash64(key->data, key->len) % KMAP_BUCKETS];
       e; e = e->next)
    if ((e->kernel == NULL) == compiling && strcmp(e->key, key->data) == 0)
      return e;
  return NULL;
}

static fj_kernel *kmap_find(const fj_kmap *m, const fj_buf *key)
{
  kentry *e = kmap_entry(m, key, 0);
  return e ? e->kernel : NULL;
}

static fj_kmap *kmap(fj_ctx *ctx)
{
  if (!ctx->kernels && (ctx->kernels = calloc(1, sizeof *ctx->kernels)) &&
      pthread_cond_init(&ctx->kernels->compiled, NULL) != 0) {
    free(ctx->kernels);
    ctx->kernels = NULL;
  }
  return ctx->kernels;
}

/* Enters k (NULL: a compile's mark) under a copy of key; NULL without
 * memory. */
static kentry *kmap_add(fj_ctx *ctx, const fj_buf *key, fj_kernel *k)
{
  fj_kmap *m = kmap(ctx);
  kentry *e = m ? malloc(sizeof *e) : NULL;
  if (!e || !(e->key = fj__strdup(key->data))) {
    free(e);
    return NULL;
  }
  size_t b = fj__hash64(key->data, key->len) % KMAP_BUCKETS;
  e->kernel = k;
  e->next = m->buckets[b];
  m->buckets[b] = e;
  return e;
}

/* Takes a compile's mark out and wakes the builds waiting on it. */
static void kmap_unmark(fj_ctx *ctx, kentry *mark)
{
  fj_kmap *m = ctx->kernels;
  for (kentry **e = &m->buckets[fj__hash64(mark->key, strlen(mark->key)) %
                                KMAP_BUCKETS];
       *e; e = &(*e)->next)
    if (*e == mark) {
      *e = mark->next;
      break;
    }
  free(mark->key);
  free(mark);
  pthread_cond_broadcast(&m->compiled);
}

/* Marks key as compiling and releases ctx->lock, for a wait on NVRTC
 * (compile_unlocked, fj__kjob_finish): a build of the same key waits for
 * the mark to go.  NULL, the lock kept, without memory for the mark. */
static kentry *unlock_marked(fj_ctx *ctx, const fj_buf *key)
{
  kentry *mark = kmap_add(ctx, key, NULL);
  if (mark)
    pthread_mutex_unlock(&ctx->lock);
  return mark;
}

/* unlock_marked's end: the lock taken again, the mark gone. */
static void relock_unmark(fj_ctx *ctx, kentry *mark)
{
  if (mark) {
    pthread_mutex_lock(&ctx->lock);
    kmap_unmark(ctx, mark);
  }
}

void fj__kmap_free(fj_kmap *m)
{
  if (!m)
    return;
  for (size_t b = 0; b < KMAP_BUCKETS; b++)
    for (kentry *e = m->buckets[b], *next; e; e = next) {
      next = e->next;
      fj__kernel_free(e->kernel);
      free(e->key);
      free(e);
    }
  pthread_cond_destroy(&m->compiled);
  free(m);
}

void fj__kernel_free(fj_kernel *k)
{
  if (!k)
    return;
  fj__cu_module_unload(k->module);
  fj__compiled_free(&k->out);
  free(k->source);
  free(k);
}

/* ---- the shared-memory check ------------------------------------------------------ */

fj_status fj__check_smem(const fj_ctx *ctx, const fj_kmeta *meta)
{
  int limit = fj__smem_limit(ctx);
  if (meta->smem_bytes <= limit)
    return FJ_OK;
  return fj__fail(ctx, FJ_ERR_RESOURCES,
                  "%s needs %d bytes of shared memory per block; %s allows "
                  "%d (over by %d): use smaller tiles",
                  meta->symbol, meta->smem_bytes, ctx->arch, limit,
                  meta->smem_bytes - limit);
}

/* ---- the render index ------------------------------------------------------------ */

/* The key of a memory key's index entry for template name; 0 when there
 * is none to use. */
static int index_key(fj_ctx *ctx, const char *name, const fj_buf *mkey,
                     fj_cache_key *key)
{
  const char *dir = getenv("FLASHJIT_TEMPLATE_DIR");
  if (!ctx->cache || (dir && *dir))
    return 0;
  if (!ctx->templates_hash[0]) {
    fj_buf all = {0};
    for (size_t i = 0; i < fj__embedded_count; i++)
      if (fj__buf_appendf(&all, "%s %016llx\n", fj__embedded[i].name,
                          (unsigned long long)fj__hash64(fj__embedded[i].data,
                                                         fj__embedded[i].len))) {
        fj__buf_free(&all);
        fj__cache_store_lost(ctx, "render", name);
        return 0;
      }
    fj__hash_hex(all.data, all.len, ctx->templates_hash);
    fj__buf_free(&all);
  }
  char mhash[33], extra[48];
  fj__hash_hex(mkey->data, mkey->len, mhash);
  snprintf(extra, sizeof extra, "templates=%s", ctx->templates_hash);
  fj__cache_key(key, "render", ctx->arch, 0, mhash, extra);
  return 1;
}

/* Where a compiler entry was found: nowhere, the disk cache, the kernel
 * package. */
enum { FROM_NONE, FROM_DISK, FROM_PACKAGE };

/* The entry of `kind` under key: the disk cache's, else the kernel
 * package's (package.c); FROM_* and the payload (malloc'd).  Both read the
 * file by the cache's one reader (fj__cache_entry_load); the payload is
 * the caller's to check (entry.c), the same checks whichever answered. */
static int entry_load(fj_ctx *ctx, const char *kind, const fj_cache_key *key,
                      void **payload, size_t *len)
{
  if (fj__cache_load(ctx, kind, key, payload, len))
    return FROM_DISK;
  if (fj__package_load(ctx, kind, key, payload, len))
    return FROM_PACKAGE;
  return FROM_NONE;
}

static const char *from_where(int from)
{
  return from == FROM_PACKAGE ? " (kernel package)" : "";
}

/* The kernel (source and metadata, not compiled) from the index, or NULL.
 * An entry is held to what a render could have made (entry.c): the index
 * lives in a directory other processes and imported packs write, or in a
 * kernel package shipped from elsewhere, so its metadata and source are
 * checked as input before they size a launch or reach NVRTC; one that
 * fails is a miss, rendered again (and rewritten in the disk cache; a
 * package is never written). */
static fj_kernel *index_load(fj_ctx *ctx, const fj_cache_key *key)
{
  void *payload = NULL;
  size_t len = 0, src_len = 0;
  const char *src;
  char why[200];
  int from = entry_load(ctx, "render", key, &payload, &len);
  if (from == FROM_NONE)
    return NULL;
  fj_kernel *k = calloc(1, sizeof *k);
  if (k && fj__render_payload_read(payload, len, &k->meta, &src, &src_len,
                                   why, sizeof why)) {
    fj__log(ctx, FJ_LOG_WARN, "render index entry %s%s ignored: %s",
            key->hex, from_where(from), why);
    src = NULL;
  }
  if (k && src && (k->source = malloc(src_len + 1)) != NULL) {
    k->source_len = src_len;
    memcpy(k->source, src, src_len);
    k->source[src_len] = '\0';
  }
  free(payload);
  /* A shared-memory refusal is the render path's to report. */
  if (k && (!k->source || fj__check_smem(ctx, &k->meta) != FJ_OK)) {
    fj__clear_error(ctx);
    fj__kernel_free(k);
    k = NULL;
  }
  return k;
}

static void index_store(fj_ctx *ctx, const fj_cache_key *key, const fj_kernel *k)
{
  fj_buf b = {0};
  if (fj__render_payload(&k->meta, k->source, k->source_len, &b) == 0)
    fj__cache_store(ctx, "render", k->meta.symbol, key, b.data, b.len);
  else
    fj__cache_store_lost(ctx, "render", k->meta.symbol);
  fj__buf_free(&b);
}

/* ---- building ---------------------------------------------------------------------- */


/* NVRTC reads the source as a C string: one with a NUL byte in it would
 * compile as the text before it (an empty module, for a NUL first), so
 * such a render, or an empty one, is the template's error. */
static fj_status check_text(const fj_ctx *ctx, const char *name,
                            const char *src, size_t len)
{
  const char *nul = memchr(src, '\0', len);
  if (nul)
    return fj__fail(ctx, FJ_ERR_TEMPLATE,
                    "template %s rendered a NUL byte at offset %zu of %zu: "
                    "CUDA source is text",
                    name, (size_t)(nul - src), len);
  if (len == 0)
    return fj__fail(ctx, FJ_ERR_TEMPLATE,
                    "template %s rendered nothing: no kernel to compile", name);
  return FJ_OK;
}

/* Renders a kernel's source and checks it fits; not compiled yet.  The
 * render index answers first where it can, and learns what it did not
 * know. */
static fj_status kernel_render(fj_ctx *ctx, const char *name,
                               const fj_param *params, size_t n,
                               const fj_buf *mkey, fj_kernel **out)
{
  fj_cache_key ik;
  int indexed = index_key(ctx, name, mkey, &ik);
  if (indexed && (*out = index_load(ctx, &ik)) != NULL)
    return FJ_OK;
  fj_kernel *k = calloc(1, sizeof *k);
  if (!k)
    return fj__fail(ctx, FJ_ERR_NOMEM, "out of memory");
  fj_buf src = {0};
  ctx->renders++;
  fj_status st = fj__render(ctx, name, params, n, &src, &k->meta);
  if (st == FJ_OK)
    st = fj__check_smem(ctx, &k->meta);
  k->source_len = src.len;
  k->source = fj__buf_take(&src);
  if (st == FJ_OK && !k->source)
    st = fj__fail(ctx, FJ_ERR_NOMEM, "out of memory");
  if (st == FJ_OK)
    st = check_text(ctx, name, k->source, k->source_len);
  if (st != FJ_OK) {
    fj__kernel_free(k);
    return st;
  }
  if (indexed)
    index_store(ctx, &ik, k);
  *out = k;
  return FJ_OK;
}

/* How k compiles (fj__compile's flags): in a child process where the
 * context or its template asks; quick where its template does. */
static int compile_flags(const fj_ctx *ctx, const fj_kernel *k)
{
  return (ctx->opts.isolate_compile || k->meta.isolate ? FJ_COMPILE_ISOLATE : 0) |
         (k->meta.quick ? FJ_COMPILE_QUICK : 0);
}

static void disk_key(const fj_ctx *ctx, const fj_kernel *k, fj_cache_key *key)
{
  char src_hash[33];
  fj__hash_hex(k->source, k->source_len, src_hash);
  fj__cache_key(key, "kernel", ctx->arch, k->meta.quick, src_hash, k->meta.symbol);
}

/* 1 when the disk cache, else the kernel package, had the kernel's cubin,
 * PTX and log, and they are a kernel's parts (entry.c; else a miss,
 * compiled again).  A package's kernel is not copied into the disk cache:
 * the package stays where it is, read as fast. */
static int from_disk(fj_ctx *ctx, fj_kernel *k, const fj_cache_key *key)
{
  void *payload = NULL;
  size_t len = 0;
  int from = entry_load(ctx, "kernel", key, &payload, &len);
  if (from == FROM_NONE)
    return 0;
  const char *why = fj__kernel_payload_check(payload, len, &k->out);
  free(payload);
  if (why) {
    fj__log(ctx, FJ_LOG_WARN, "kernel entry %s%s ignored: %s", key->hex,
            from_where(from), why);
    return 0;
  }
  __atomic_store_n(&k->origin, FJ_CACHE_DISK, __ATOMIC_RELAXED);
  if (from == FROM_PACKAGE)
    fj__cache_count_package(ctx);
  return 1;
}

static void to_disk(fj_ctx *ctx, fj_kernel *k, const fj_cache_key *key)
{
  fj_buf b = {0};
  __atomic_store_n(&k->origin, FJ_CACHE_MISS, __ATOMIC_RELAXED);
  if (fj__kernel_payload(&k->out, &b) == 0)
    fj__cache_store(ctx, "kernel", k->meta.symbol, key, b.data, b.len);
  else
    fj__cache_store_lost(ctx, "kernel", k->meta.symbol);
  fj__buf_free(&b);
}

/* Fills the resource report and counts how the kernel was found. */
static void finish(fj_ctx *ctx, fj_kernel *k)
{
  fj_resources *r = &k->res;
  fj__parse_resources(k->out.log, k->meta.symbol, r);
  r->shared_dynamic = k->meta.smem_bytes;
  r->threads = k->meta.threads;
  r->cubin_bytes = k->out.cubin_len;
  r->ptx_bytes = k->out.ptx_len;
  r->compile_ms = k->out.ms;
  fj__cache_count(ctx, (fj_cache_origin)__atomic_load_n(&k->origin, __ATOMIC_RELAXED));
}

/* Inserts a finished kernel under key, unless another thread got there
 * first: then that one is kept and k freed.  Returns the kept one. */
static fj_kernel *keep(fj_ctx *ctx, fj_buf *key, fj_kernel *k)
{
  fj_kernel *there = kmap_find(ctx->kernels, key);
  if (there) {
    fj__kernel_free(k);
    return there;
  }
  if (!kmap_add(ctx, key, k)) {
    fj__kernel_free(k);
    return NULL;
  }
  return k;
}

static fj_kjob *ahead_take(fj_ctx *ctx, const fj_buf *key);

/* NVRTC on k with ctx->lock released, so that the context's other threads
 * launch meanwhile: the key marked as compiling, a build of the same key
 * waits for this one instead of compiling it too (without memory for the
 * mark, compiled with the lock held). */
static fj_status compile_unlocked(fj_ctx *ctx, const fj_buf *key, fj_kernel *k)
{
  kentry *mark = unlock_marked(ctx, key);
  fj__log(ctx, FJ_LOG_DEBUG, "compiling %s (NVRTC%s)", k->meta.symbol,
          mark ? "" : ", the context's lock held");
  fj_status st = fj__compile(ctx, k->meta.symbol, k->source, ctx->arch,
                             compile_flags(ctx, k), &k->out);
  relock_unmark(ctx, mark);
  return st;
}

/* ctx->lock held; released while NVRTC runs (compile_unlocked). */
fj_status fj__kernel_build(fj_ctx *ctx, const char *name,
                           const fj_param *params, size_t n, fj_kernel **out)
{
  fj_buf key = {0};
  fj_kernel *k = NULL;
  fj_kjob *job = NULL;
  fj_status st = memory_key(&key, name, params, n)
                     ? fj__fail(ctx, FJ_ERR_NOMEM, "out of memory")
                     : FJ_OK;
  /* Another thread compiling this kernel: its result, once it is in. */
  while (st == FJ_OK && !(k = kmap_find(ctx->kernels, &key)) &&
         kmap_entry(ctx->kernels, &key, 1))
    pthread_cond_wait(&ctx->kernels->compiled, &ctx->lock);
  if (k) {
    __atomic_store_n(&k->origin, FJ_CACHE_MEMORY, __ATOMIC_RELAXED);
    fj__cache_count(ctx, FJ_CACHE_MEMORY);
  } else if (st == FJ_OK && (job = ahead_take(ctx, &key)) != NULL) {
    st = fj__kjob_finish(ctx, job, &k);  /* its compile, started ahead */
  } else if (st == FJ_OK &&
             (st = kernel_render(ctx, name, params, n, &key, &k)) == FJ_OK) {
    fj_cache_key dk;
    disk_key(ctx, k, &dk);
    if (!from_disk(ctx, k, &dk)) {
      st = compile_unlocked(ctx, &key, k);
      if (st == FJ_OK)
        to_disk(ctx, k, &dk);
    }
    if (st == FJ_OK) {
      finish(ctx, k);
      if (!(k = keep(ctx, &key, k)))
        st = fj__fail(ctx, FJ_ERR_NOMEM, "out of memory");
    } else {
      fj__kernel_free(k);
    }
  }
  fj__buf_free(&key);
  if (st == FJ_OK)
    *out = k;
  return st;
}

/* ---- building in the background ---------------------------------------------------- */

/* A kernel compiling on a thread of its own: rendered, keyed, its source
 * the thread's input; the thread writes only status, message, out and
 * done. */
struct fj_kjob {
  fj_buf key;
  fj_kernel *k;
  fj_cache_key dk;
  int flags;  /* fj__compile's */
  const fj_ctx *ctx;
  pthread_t thread;
  fj_status status;
  char *message;
  _Atomic int done;
  int joined;  /* no thread to join (it never started) */
};

static void *kjob_run(void *arg)
{
  fj_kjob *j = arg;
  j->status = fj__compile(j->ctx, j->k->meta.symbol, j->k->source,
                          j->ctx->arch, j->flags, &j->k->out);
  if (j->status != FJ_OK)
    j->message = fj__strdup(fj_errmsg(j->ctx));
  atomic_store(&j->done, 1);
  return NULL;
}

fj_status fj__kernel_build_async(fj_ctx *ctx, const char *name,
                                 const fj_param *params, size_t n,
                                 fj_kernel **out, fj_kjob **job)
{
  *out = NULL;
  *job = NULL;
  fj_kjob *j = calloc(1, sizeof *j);
  if (!j || memory_key(&j->key, name, params, n)) {
    if (j)
      fj__buf_free(&j->key);
    free(j);
    return fj__fail(ctx, FJ_ERR_NOMEM, "out of memory");
  }
  fj_status st = FJ_OK;
  if ((*out = kmap_find(ctx->kernels, &j->key)) != NULL) {
    __atomic_store_n(&(*out)->origin, FJ_CACHE_MEMORY, __ATOMIC_RELAXED);
    fj__cache_count(ctx, FJ_CACHE_MEMORY);
  } else if (kmap_entry(ctx->kernels, &j->key, 1)) {
    /* another thread compiles it now (fj__kernel_build): neither */
  } else if ((st = kernel_render(ctx, name, params, n, &j->key, &j->k)) ==
             FJ_OK) {
    disk_key(ctx, j->k, &j->dk);
    if (from_disk(ctx, j->k, &j->dk)) {
      finish(ctx, j->k);
      if (!(*out = keep(ctx, &j->key, j->k)))
        st = fj__fail(ctx, FJ_ERR_NOMEM, "out of memory");
      j->k = NULL;
    } else {
      j->ctx = ctx;
      j->flags = compile_flags(ctx, j->k);
      *job = j;
      return FJ_OK;
    }
  }
  fj__kernel_free(j->k);
  fj__buf_free(&j->key);
  free(j);
  return st;
}

fj_status fj__kjob_start(fj_ctx *ctx, fj_kjob *j)
{
  if (pthread_create(&j->thread, NULL, kjob_run, j) == 0)
    return FJ_OK;
  fj_kernel *k;
  j->status = fj__fail(ctx, FJ_ERR_NOMEM,
                       "cannot start a thread for the compile of %s",
                       j->k->meta.symbol);
  j->message = fj__strdup(fj_errmsg(ctx));
  atomic_store(&j->done, 1);
  j->joined = 1;
  return fj__kjob_finish(ctx, j, &k);
}

void fj__kjob_drop(fj_kjob *j)
{
  fj__kernel_free(j->k);
  fj__buf_free(&j->key);
  free(j);
}

int fj__kjob_done(const fj_kjob *job)
{
  return atomic_load(&((fj_kjob *)job)->done);
}

const char *fj__kjob_symbol(const fj_kjob *job)
{
  return job->k->meta.symbol;
}

fj_status fj__kjob_finish(fj_ctx *ctx, fj_kjob *j, fj_kernel **out)
{
  if (!j->joined) {
    /* A compile still running is waited for with ctx->lock released, its
     * key marked as compile_unlocked marks it. */
    kentry *mark = fj__kjob_done(j) ? NULL : unlock_marked(ctx, &j->key);
    if (mark)
      fj__log(ctx, FJ_LOG_DEBUG, "waiting for %s's compile", j->k->meta.symbol);
    pthread_join(j->thread, NULL);
    relock_unmark(ctx, mark);
  }
  fj_status st = j->status;
  if (st == FJ_OK) {
    to_disk(ctx, j->k, &j->dk);
    finish(ctx, j->k);
    if (!(*out = keep(ctx, &j->key, j->k)))
      st = fj__fail(ctx, FJ_ERR_NOMEM, "out of memory");
  } else {
    st = fj__fail(ctx, st, "%s", j->message ? j->message : "compile failed");
    fj__kernel_free(j->k);
  }
  free(j->message);
  fj__buf_free(&j->key);
  free(j);
  return st;
}

/* ---- building many at once ----------------------------------------------------------- */

typedef struct batch_item {
  fj_build *b;
  fj_buf key;
  fj_kernel *k;
  fj_cache_key dk;
} batch_item;

static void failed(fj_ctx *ctx, fj_build *b, fj_status st)
{
  b->status = st;
  free(b->message);
  b->message = fj__strdup(fj_errmsg(ctx));
}

/* Phase 1, locked: memory hits, rendering, disk hits.  Returns how many
 * items still need NVRTC, gathered into jobs. */
static size_t batch_prepare(fj_ctx *ctx, batch_item *it, size_t n,
                            fj_compile_job *jobs, size_t *job_of)
{
  size_t njobs = 0;
  for (size_t i = 0; i < n; i++) {
    fj_build *b = it[i].b;
    if (b->status != FJ_OK)
      continue;
    if (memory_key(&it[i].key, b->template_name, b->params, b->nparams)) {
      failed(ctx, b, fj__fail(ctx, FJ_ERR_NOMEM, "out of memory"));
      continue;
    }
    if ((b->kernel = kmap_find(ctx->kernels, &it[i].key)) != NULL)
      continue;
    fj_status st = kernel_render(ctx, b->template_name, b->params, b->nparams,
                                 &it[i].key, &it[i].k);
    if (st != FJ_OK) {
      failed(ctx, b, st);
      continue;
    }
    disk_key(ctx, it[i].k, &it[i].dk);
    if (from_disk(ctx, it[i].k, &it[i].dk))
      continue;
    fj_compile_job j = {it[i].k->meta.symbol, it[i].k->source, ctx->arch,
                        it[i].k->meta.quick, FJ_OK, NULL, {0}};
    jobs[njobs] = j;
    job_of[njobs++] = i;
  }
  return njobs;
}

/* Phase 3, locked: results into kernels, the disk cache and the map. */
static void batch_finish(fj_ctx *ctx, batch_item *it, size_t n,
                         fj_compile_job *jobs, const size_t *job_of,
                         size_t njobs)
{
  for (size_t j = 0; j < njobs; j++) {
    batch_item *x = &it[job_of[j]];
    x->k->out = jobs[j].out;
    if (jobs[j].status == FJ_OK) {
      to_disk(ctx, x->k, &x->dk);
    } else {
      failed(ctx, x->b, fj__fail(ctx, jobs[j].status, "%s",
                                 jobs[j].message ? jobs[j].message : "?"));
      fj__kernel_free(x->k);
      x->k = NULL;
    }
    free(jobs[j].message);
  }
  for (size_t i = 0; i < n; i++) {
    if (it[i].k) {
      finish(ctx, it[i].k);
      if (!(it[i].b->kernel = keep(ctx, &it[i].key, it[i].k)))
        failed(ctx, it[i].b, fj__fail(ctx, FJ_ERR_NOMEM, "out of memory"));
    }
    fj__buf_free(&it[i].key);
  }
}

fj_status fj__kernel_build_many(fj_ctx *ctx, fj_build *builds, size_t n,
                                int workers, fj_progress_fn progress,
                                void *user)
{
  batch_item *it = calloc(n ? n : 1, sizeof *it);
  fj_compile_job *jobs = calloc(n ? n : 1, sizeof *jobs);
  size_t *job_of = calloc(n ? n : 1, sizeof *job_of);
  if (!it || !jobs || !job_of) {
    free(it);
    free(jobs);
    free(job_of);
    return fj__fail(ctx, FJ_ERR_NOMEM, "out of memory");
  }
  for (size_t i = 0; i < n; i++)
    it[i].b = &builds[i];
  pthread_mutex_lock(&ctx->lock);
  size_t njobs = batch_prepare(ctx, it, n, jobs, job_of);
  pthread_mutex_unlock(&ctx->lock);
  /* NVRTC runs in children while the context stays usable. */
  fj__compile_many(jobs, njobs, workers, progress, user);
  pthread_mutex_lock(&ctx->lock);
  batch_finish(ctx, it, n, jobs, job_of, njobs);
  pthread_mutex_unlock(&ctx->lock);
  free(it);
  free(jobs);
  free(job_of);
  return FJ_OK;
}

fj_status fj__kernel_symbol(fj_ctx *ctx, fj_kernel *k, const char *symbol,
                            void **function)
{
  if (!k->module) {
    fj_status st = fj__cu_module_load(ctx, k->out.cubin, &k->module);
    if (st != FJ_OK)
      return st;
  }
  /* The template's dynamic shared memory is its main kernel's; another
   * kernel of the module (FP8 attention's _vt pass) launches with none. */
  int main_kernel = !strcmp(symbol, k->meta.symbol);
  return fj__cu_function(ctx, k->module, symbol,
                         main_kernel ? (unsigned)k->meta.smem_bytes : 0, function);
}

fj_status fj__kernel_vt_function(fj_ctx *ctx, fj_kernel *k, void **function)
{
  if (!k->vt_function) {
    char name[sizeof k->meta.symbol + 4];
    snprintf(name, sizeof name, "%s_vt", k->meta.symbol);
    fj_status st = fj__kernel_symbol(ctx, k, name, &k->vt_function);
    if (st != FJ_OK)
      return st;
  }
  *function = k->vt_function;
  return FJ_OK;
}

fj_status fj__kernel_function(fj_ctx *ctx, fj_kernel *k, void **function)
{
  if (!k->function) {
    fj_status st = fj__kernel_symbol(ctx, k, k->meta.symbol, &k->function);
    if (st != FJ_OK)
      return st;
  }
  *function = k->function;
  return FJ_OK;
}

/* ---- public getters ------------------------------------------------------------------ */

/* A NULL kernel has nothing: NULL and a length of 0, "" for the strings
 * documented as never NULL. */
const char *fj_kernel_source(const fj_kernel *k, size_t *len)
{
  if (len)
    *len = k ? k->source_len : 0;
  return k ? k->source : NULL;
}

const char *fj_kernel_ptx(const fj_kernel *k, size_t *len)
{
  if (len)
    *len = k ? k->out.ptx_len : 0;
  return k ? k->out.ptx : NULL;
}

const void *fj_kernel_cubin(const fj_kernel *k, size_t *len)
{
  if (len)
    *len = k ? k->out.cubin_len : 0;
  return k ? k->out.cubin : NULL;
}

const char *fj_kernel_log(const fj_kernel *k)
{
  return k && k->out.log ? k->out.log : "";
}

const char *fj_kernel_name(const fj_kernel *k)
{
  return k ? k->meta.symbol : "";
}

void fj_kernel_resources(const fj_kernel *k, fj_resources *res)
{
  if (k && res) {
    *res = k->res;
    res->cache = (fj_cache_origin)__atomic_load_n(&k->origin, __ATOMIC_RELAXED);
  }
}

/* ---- compiles ahead of use ------------------------------------------------------------ */

/* The compiles fj__kernel_ahead started, in start order (TIER_JOBS-like:
 * a handful; a training step's first forward starts its backward's). */
enum { AHEAD_MAX = 8 };

struct fj_ahead {
  fj_kjob *jobs[AHEAD_MAX];
  int n;
};

static void ahead_remove(fj_ahead *a, int i)
{
  memmove(&a->jobs[i], &a->jobs[i + 1], (size_t)(a->n - i - 1) * sizeof a->jobs[0]);
  a->n--;
}

/* The index of the compile ahead of the kernel with memory key `key`, or
 * -1. */
static int ahead_index(const fj_ahead *a, const fj_buf *key)
{
  for (int i = 0; a && i < a->n; i++) {
    const fj_buf *k = &a->jobs[i]->key;
    if (k->len == key->len && !memcmp(k->data, key->data, key->len))
      return i;
  }
  return -1;
}

/* That compile, taken off the list (the caller finishes it), or NULL. */
static fj_kjob *ahead_take(fj_ctx *ctx, const fj_buf *key)
{
  int i = ahead_index(ctx->ahead, key);
  if (i < 0)
    return NULL;
  fj_kjob *j = ctx->ahead->jobs[i];
  ahead_remove(ctx->ahead, i);
  return j;
}

fj_status fj__kernel_ahead(fj_ctx *ctx, const char *name,
                           const fj_param *params, size_t n)
{
  if (!ctx->ahead && !(ctx->ahead = calloc(1, sizeof *ctx->ahead)))
    return FJ_OK;  /* nothing ahead: the build compiles as without */
  fj_ahead *a = ctx->ahead;
  /* Compiles that ended join the caches now, making room. */
  for (int i = 0; i < a->n;) {
    if (!fj__kjob_done(a->jobs[i])) {
      i++;
      continue;
    }
    fj_kjob *j = a->jobs[i];
    fj_kernel *k;
    ahead_remove(a, i);
    if (fj__kjob_finish(ctx, j, &k) != FJ_OK)
      fj__clear_error(ctx);  /* the build of that kernel meets it again */
  }
  if (a->n == AHEAD_MAX)
    return FJ_OK;
  fj_buf key = {0};
  if (memory_key(&key, name, params, n)) {
    fj__buf_free(&key);
    return fj__fail(ctx, FJ_ERR_NOMEM, "out of memory");
  }
  int pending = ahead_index(a, &key);
  fj__buf_free(&key);
  if (pending >= 0)
    return FJ_OK;  /* already under way */
  fj_kernel *k;
  fj_kjob *job;
  fj_status st = fj__kernel_build_async(ctx, name, params, n, &k, &job);
  if (st != FJ_OK || !job)
    return st;  /* a failure to render, or a kernel the caches had */
  fj__log(ctx, FJ_LOG_DEBUG, "compiling %s ahead of its first use", fj__kjob_symbol(job));
  if ((st = fj__kjob_start(ctx, job)) == FJ_OK)
    a->jobs[a->n++] = job;
  return st;
}

void fj__kernel_ahead_free(fj_ctx *ctx)
{
  /* Each compile is joined and finished, as the tiered JIT's are: a
   * program that ends while a kernel compiles ahead (a backward
   * prefetched, never run) still leaves it in the disk cache. */
  fj_ahead *a = ctx->ahead;
  pthread_mutex_lock(&ctx->lock);
  for (int i = 0; a && i < a->n; i++) {
    fj_kernel *k;
    if (fj__kjob_finish(ctx, a->jobs[i], &k) != FJ_OK)
      fj__clear_error(ctx);
  }
  pthread_mutex_unlock(&ctx->lock);
  free(a);
  ctx->ahead = NULL;
}

fj_status fj__kernel_build_mods(fj_ctx *ctx, const char *name,
                                const char *symbol, const fj_mods *m,
                                const fj_param *extra, size_t n,
                                fj_kernel **out)
{
  enum { COMMON = 9, EXTRA_MAX = 8 };
  if (n > EXTRA_MAX)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG, "%s: %zu parameters of its own, "
                    "more than %d", name, n, (int)EXTRA_MAX);
  char params[FJ_MOD_PARAMS_MAX * (FJ_MOD_NAME_MAX + 8) + 1];
  fj__mods_param_list(m, params, sizeof params);
  /* The expressions' facts (mods_kernel.h): heap, for their texts' room. */
  fj_mods_kparam *facts = malloc(sizeof *facts);
  char err[512] = "out of memory";
  if (!facts || fj__mods_kparam(m, facts, err, sizeof err)) {
    free(facts);
    return fj__fail(ctx, FJ_ERR_NOMEM, "%s", err);
  }
  fj_param list[COMMON + EXTRA_MAX] = {
      {"template", FJ_PARAM_STR, 0, name, NULL},
      {"symbol", FJ_PARAM_STR, 0, symbol, NULL},
      {"arch", FJ_PARAM_STR, 0, ctx->arch, NULL},
      {"sm", FJ_PARAM_INT, ctx->sm, NULL, NULL},
      {"version", FJ_PARAM_STR, 0, fj_version(), NULL},
      {"params_bytes", FJ_PARAM_INT, (long long)sizeof(fj_kparams), NULL, NULL},
      {"dtype", FJ_PARAM_STR, 0, "f16", NULL},  /* common.cuh's; no tensor is read */
      {"mod_params", FJ_PARAM_STR, 0, params, NULL},
      facts->param,
  };
  memcpy(list + COMMON, extra, n * sizeof *extra);
  fj_status st = fj__kernel_build(ctx, name, list, COMMON + n, out);
  free(facts);
  return st;
}
