/*
 * test_cache.c -- the disk cache: hits and misses across contexts, corrupt
 * and truncated entries (misses that get rewritten), a directory that
 * cannot be used, several processes compiling into one directory at once,
 * listing and clearing, and the render index (a disk hit without a
 * render).  Every kernel leaves two entries: kind "kernel" (the cubin) and
 * kind "render" (the index).  Cache packs: prewarm, export and import,
 * with the compiles counted, and every refusal of a damaged or foreign
 * pack.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "attention.h"
#include "cache.h"
#include "compile.h"
#include "template.h"
#include "util.h"
#include "locked.h"
#include "runner.h"

static char warning[1024];

static void capture(void *user, fj_log_level level, const char *msg)
{
  (void)user;
  if (level == FJ_LOG_WARN)
    snprintf(warning, sizeof warning, "%s", msg);
}

static fj_ctx *logged_ctx(const char *arch, const char *dir)
{
  fj_ctx_opts o;
  fj_ctx_opts_init(&o);
  o.device = -1;
  o.arch = arch;
  o.cache_dir = dir;
  o.log = capture;
  fj_ctx *ctx = NULL;
  warning[0] = '\0';
  if (fj_ctx_create(&ctx, &o) != FJ_OK)
    fprintf(stderr, "%s\n", fj_errmsg(NULL));
  return ctx;
}

/* Gets the default d64 f16 kernel and returns how it was found. */
static int origin_of(fj_ctx *ctx, int head_dim)
{
  fj_variant v;
  fj_variant_default(&v, head_dim, FJ_F16, FJ_CAUSAL_NONE);
  fj_kernel *k;
  if (fj_kernel_get(ctx, &v, &k) != FJ_OK) {
    fprintf(stderr, "%s\n", fj_errmsg(ctx));
    return -1;
  }
  fj_resources r;
  fj_kernel_resources(k, &r);
  return (int)r.cache;
}

/* Counts files in dir: entries (*.fjc) and temporaries (.tmp-*); first
 * gets the path of the first entry. */
static void count_files(const char *dir, int *entries, int *temps,
                        char *first, size_t size)
{
  *entries = *temps = 0;
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL) {
    size_t n = strlen(e->d_name);
    if (n > 4 && !strcmp(e->d_name + n - 4, ".fjc")) {
      if (first && !*entries)
        snprintf(first, size, "%s/%s", dir, e->d_name);
      (*entries)++;
    }
    *temps += !strncmp(e->d_name, ".tmp-", 5);
  }
  if (d)
    closedir(d);
}

int test_cache_hit_miss(void)
{
  const char *dir = fjt_tmpdir();
  fj_ctx *a = logged_ctx("sm_90a", dir);
  CHECK(a && fj_cache_dir(a) && !strcmp(fj_cache_dir(a), dir));
  CHECK(origin_of(a, 64) == FJ_CACHE_MISS);
  CHECK(origin_of(a, 64) == FJ_CACHE_MEMORY);
  fj_ctx *b = logged_ctx("sm_90a", dir);
  CHECK(origin_of(b, 64) == FJ_CACHE_DISK);
  fj_ctx *c = logged_ctx("sm_80", dir);  /* another arch: another key */
  CHECK(origin_of(c, 64) == FJ_CACHE_MISS);
  fj_cache_stats s;
  fj_cache_stats_get(a, &s);
  CHECK(s.misses == 1 && s.memory_hits == 1 && s.disk_writes == 2);
  fj_cache_stats_get(b, &s);
  CHECK(s.disk_hits == 1 && s.misses == 0 && s.disk_writes == 0);
  CHECK(b->renders == 0);  /* the render index had the source */
  int entries, temps;
  count_files(dir, &entries, &temps, NULL, 0);
  CHECK(entries == 4 && temps == 0);
  CHECK(warning[0] == '\0');
  fj_ctx_destroy(a);
  fj_ctx_destroy(b);
  fj_ctx_destroy(c);
  return 0;
}

typedef struct find_kind {
  const char *kind;
  char file[256];
} find_kind;

static int find_visit(void *user, const fj_cache_entry *e)
{
  find_kind *f = user;
  if (e->valid && !strcmp(e->kind, f->kind))
    snprintf(f->file, sizeof f->file, "%s", e->file);
  return 0;
}

/* Damages the kernel entry of dir with fn, then expects a miss that
 * rewrites the entry, and a clean hit after that. */
static int damaged_entry_is_rewritten(void (*damage)(const char *path))
{
  const char *dir = fjt_tmpdir();
  fj_ctx *a = logged_ctx("sm_90", dir);
  CHECK(origin_of(a, 64) == FJ_CACHE_MISS);
  char path[4300];
  int entries, temps;
  count_files(dir, &entries, &temps, NULL, 0);
  CHECK(entries == 2);
  find_kind f = {"kernel", ""};
  CHECK_OK(a, fj_cache_list(a, find_visit, &f));
  CHECK(f.file[0]);
  snprintf(path, sizeof path, "%s/%s", dir, f.file);
  damage(path);
  fj_ctx *b = logged_ctx("sm_90", dir);
  CHECK(origin_of(b, 64) == FJ_CACHE_MISS);
  CHECK(strstr(warning, "corrupt or stale"));
  fj_cache_stats s;
  fj_cache_stats_get(b, &s);
  CHECK(s.disk_rejects == 1 && s.disk_writes == 1);
  fj_ctx *c = logged_ctx("sm_90", dir);
  CHECK(origin_of(c, 64) == FJ_CACHE_DISK);
  fj_ctx_destroy(a);
  fj_ctx_destroy(b);
  fj_ctx_destroy(c);
  return 0;
}

static void flip_byte(const char *path)
{
  size_t len;
  char *data = fj__file_read(path, (uint64_t)1 << 30, &len);
  data[len - 100] ^= 0x5a;
  fjt_write_file(path, data, len);
  free(data);
}

static void truncate_half(const char *path)
{
  size_t len;
  char *data = fj__file_read(path, (uint64_t)1 << 30, &len);
  fjt_write_file(path, data, len / 2);
  free(data);
}

static void garbage(const char *path)
{
  fjt_write_file(path, "not a cache entry", 17);
}

int test_cache_corrupt_entry(void)
{
  CHECK(damaged_entry_is_rewritten(flip_byte) == 0);
  CHECK(damaged_entry_is_rewritten(garbage) == 0);
  return 0;
}

int test_cache_truncated_entry(void)
{
  CHECK(damaged_entry_is_rewritten(truncate_half) == 0);
  return 0;
}

int test_cache_unwritable_dir(void)
{
  /* A directory that cannot be created (its parent is a file). */
  const char *dir = fjt_tmpdir();
  char file[4300], below[4400];
  snprintf(file, sizeof file, "%s/file", dir);
  snprintf(below, sizeof below, "%s/cache", file);
  CHECK(fjt_write_file(file, "x", 1) == 0);
  fj_ctx *a = logged_ctx("sm_90", below);
  CHECK(a && fj_cache_dir(a) == NULL);
  CHECK(strstr(warning, "cannot be created") && strstr(warning, "memory only"));
  CHECK(origin_of(a, 64) == FJ_CACHE_MISS);
  CHECK(origin_of(a, 64) == FJ_CACHE_MEMORY);
  fj_ctx_destroy(a);
  /* A read-only directory (permissions do not bind root: skipped there). */
  if (geteuid() == 0) {
    printf("note: running as root, the read-only directory case is skipped\n");
    return 0;
  }
  const char *ro = fjt_tmpdir();
  CHECK(chmod(ro, 0555) == 0);
  fj_ctx *b = logged_ctx("sm_90", ro);
  CHECK(b && strstr(warning, "not writable"));
  CHECK(origin_of(b, 64) == FJ_CACHE_MISS);
  int entries, temps;
  count_files(ro, &entries, &temps, NULL, 0);
  CHECK(entries == 0 && temps == 0);
  fj_ctx_destroy(b);
  return 0;
}

/* Four processes compile the same two kernels into one directory at once;
 * every one succeeds, one entry per kernel remains, no temporary is left,
 * and a fifth context hits. */
int test_cache_processes(void)
{
  const char *dir = fjt_tmpdir();
  pid_t pids[4];
  for (int i = 0; i < 4; i++) {
    pids[i] = fork();
    CHECK(pids[i] >= 0);
    if (pids[i] == 0) {
      fj_ctx *ctx = logged_ctx("sm_90", dir);
      int first = i % 2 ? 64 : 128, second = i % 2 ? 128 : 64;
      int ok = ctx && origin_of(ctx, first) >= 0 && origin_of(ctx, second) >= 0;
      fj_ctx_destroy(ctx);
      _exit(ok ? 0 : 1);
    }
  }
  for (int i = 0; i < 4; i++) {
    int ws;
    CHECK(waitpid(pids[i], &ws, 0) == pids[i]);
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  }
  int entries, temps;
  count_files(dir, &entries, &temps, NULL, 0);
  CHECK(entries == 4 && temps == 0);
  fj_ctx *ctx = logged_ctx("sm_90", dir);
  CHECK(origin_of(ctx, 64) == FJ_CACHE_DISK);
  CHECK(origin_of(ctx, 128) == FJ_CACHE_DISK);
  fj_ctx_destroy(ctx);
  return 0;
}

typedef struct seen {
  int entries, valid, kernels;
} seen;

static int visit(void *user, const fj_cache_entry *e)
{
  seen *s = user;
  s->entries++;
  s->valid += e->valid;
  s->kernels += e->valid && !strcmp(e->kind, "kernel") &&
                !strncmp(e->label, "fj_attn_", 8) && e->bytes > 1000;
  return 0;
}

int test_cache_list_clear(void)
{
  const char *dir = fjt_tmpdir();
  fj_ctx *ctx = logged_ctx("sm_90", dir);
  CHECK(origin_of(ctx, 64) == FJ_CACHE_MISS);
  CHECK(origin_of(ctx, 32) == FJ_CACHE_MISS);
  /* A stray temporary an hour old goes; a young one (another process's
   * write on its way to a rename) stays. */
  char stray[4300], young[4300];
  snprintf(stray, sizeof stray, "%s/.tmp-1-2-abc", dir);
  snprintf(young, sizeof young, "%s/.tmp-1-3-abc", dir);
  CHECK(fjt_write_file(stray, "partial", 7) == 0);
  CHECK(fjt_write_file(young, "partial", 7) == 0);
  struct timespec old_times[2] = {{time(NULL) - 3600, 0}, {time(NULL) - 3600, 0}};
  CHECK(utimensat(AT_FDCWD, stray, old_times, 0) == 0);
  seen s = {0};
  CHECK_OK(ctx, fj_cache_list(ctx, visit, &s));
  CHECK(s.entries == 4 && s.valid == 4 && s.kernels == 2);
  int removed = -1;
  CHECK_OK(ctx, fj_cache_clear(ctx, &removed));
  CHECK(removed == 5);
  struct stat sb;
  CHECK(lstat(stray, &sb) != 0 && lstat(young, &sb) == 0);
  memset(&s, 0, sizeof s);
  CHECK_OK(ctx, fj_cache_list(ctx, visit, &s));
  CHECK(s.entries == 0);
  /* The memory cache still serves the kernels handed out. */
  CHECK(origin_of(ctx, 64) == FJ_CACHE_MEMORY);
  fj_ctx_destroy(ctx);
  /* A memory-only context has no disk cache to list. */
  fj_ctx *mem = fjt_ctx("sm_90", NULL);
  CHECK(mem && fj_cache_dir(mem) == NULL);
  CHECK_ST(mem, fj_cache_list(mem, visit, &s), FJ_ERR_NOT_FOUND);
  CHECK_MSG(mem, "disk cache is disabled");
  fj_ctx_destroy(mem);
  return 0;
}

/* The label of the last entry a visit saw that is not valid. */
static int last_invalid(void *user, const fj_cache_entry *e)
{
  if (!e->valid)
    snprintf(user, 200, "%s", e->label);
  return 0;
}

/* Entries of another NVRTC version or cache format are whole but never
 * looked up: fj_cache_list marks them stale, saying which, and
 * fj_cache_prune removes them with the corrupt ones and keeps the rest. */
int test_cache_stale_prune(void)
{
  const char *dir = fjt_tmpdir();
  fj_ctx *ctx = logged_ctx("sm_90", dir);
  CHECK(origin_of(ctx, 64) == FJ_CACHE_MISS);
  /* An entry as an NVRTC 11.8 would have keyed it, and one of format 1. */
  fj_cache_key old;
  snprintf(old.text, sizeof old.text,
           "flashjit format=%d\nkind=kernel\nnvrtc=11.8\nsource=x\n\noptions=",
           FJ_FORMAT_VERSION);
  fj__hash_hex(old.text, strlen(old.text), old.hex);
  fj__cache_store(ctx, "kernel", "fj_attn_old", &old, "cubin", 5);
  seen s = {0};
  char label[200] = "";
  CHECK_OK(ctx, fj_cache_list(ctx, visit, &s));
  CHECK(s.entries == 3 && s.valid == 2);
  CHECK_OK(ctx, fj_cache_list(ctx, last_invalid, label));
  char want[120];
  snprintf(want, sizeof want, "is stale (made by NVRTC 11.8; this process has %s)",
           fj__nvrtc_version());
  CHECK(strcmp(label, want) == 0);
  fj_cache_key fmt;
  snprintf(fmt.text, sizeof fmt.text, "flashjit format=1\nkind=kernel\nnvrtc=%s\n",
           fj__nvrtc_version());
  fj__hash_hex(fmt.text, strlen(fmt.text), fmt.hex);
  fj__cache_store(ctx, "kernel", "fj_attn_fmt", &fmt, "cubin", 5);
  CHECK_OK(ctx, fj_cache_list(ctx, last_invalid, label));
  snprintf(want, sizeof want, "is stale (made for cache format 1; this process has %d)",
           FJ_FORMAT_VERSION);
  CHECK(strcmp(label, want) == 0);
  /* A corrupt file too; prune takes those three and keeps the kernel and
   * its render index, which still hit. */
  char junk[4300];
  snprintf(junk, sizeof junk, "%s/%032d.fjc", dir, 7);
  CHECK(fjt_write_file(junk, "junk", 4) == 0);
  int removed = -1;
  CHECK_OK(ctx, fj_cache_prune(ctx, &removed));
  CHECK(removed == 3);
  memset(&s, 0, sizeof s);
  CHECK_OK(ctx, fj_cache_list(ctx, visit, &s));
  CHECK(s.entries == 2 && s.valid == 2);
  fj_ctx_destroy(ctx);
  ctx = logged_ctx("sm_90", dir);
  CHECK(origin_of(ctx, 64) == FJ_CACHE_DISK);
  CHECK_ST(NULL, fj_cache_prune(NULL, NULL), FJ_ERR_INVALID_ARG);
  fj_ctx_destroy(ctx);
  fj_ctx *mem = fjt_ctx("sm_90", NULL);
  CHECK_ST(mem, fj_cache_prune(mem, &removed), FJ_ERR_NOT_FOUND);
  fj_ctx_destroy(mem);
  return 0;
}

/* The render index: a second context finds the kernel on disk without
 * rendering, with the same source; a damaged index entry only costs the
 * render; templates from FLASHJIT_TEMPLATE_DIR are always rendered. */
int test_cache_render_index(void)
{
  const char *dir = fjt_tmpdir();
  fj_ctx *a = logged_ctx("sm_90", dir);
  fj_variant v;
  fj_variant_default(&v, 128, FJ_BF16, FJ_CAUSAL_TOP_LEFT);
  fj_kernel *ka, *kb;
  CHECK_OK(a, fj_kernel_get(a, &v, &ka));
  CHECK(a->renders == 1);
  fj_ctx *b = logged_ctx("sm_90", dir);
  CHECK_OK(b, fj_kernel_get(b, &v, &kb));
  fj_resources r;
  fj_kernel_resources(kb, &r);
  CHECK(r.cache == FJ_CACHE_DISK && b->renders == 0);
  size_t la, lb;
  const char *sa = fj_kernel_source(ka, &la), *sb = fj_kernel_source(kb, &lb);
  CHECK(la == lb && memcmp(sa, sb, la) == 0);
  CHECK(r.threads == 256 && r.shared_dynamic > 0);
  find_kind f = {"render", ""};
  CHECK_OK(b, fj_cache_list(b, find_visit, &f));
  CHECK(f.file[0]);
  char path[4300];
  snprintf(path, sizeof path, "%s/%s", dir, f.file);
  flip_byte(path);
  fj_ctx *c = logged_ctx("sm_90", dir);
  CHECK_OK(c, fj_kernel_get(c, &v, &kb));
  fj_kernel_resources(kb, &r);
  CHECK(r.cache == FJ_CACHE_DISK && c->renders == 1);
  /* A copy of the built-in templates as an override directory. */
  const char *tdir = fjt_tmpdir();
  for (size_t i = 0; i < fj__embedded_count; i++) {
    snprintf(path, sizeof path, "%s/%s", tdir, fj__embedded[i].name);
    CHECK(fjt_write_file(path, fj__embedded[i].data, fj__embedded[i].len) == 0);
  }
  setenv("FLASHJIT_TEMPLATE_DIR", tdir, 1);
  fj_ctx *d = logged_ctx("sm_90", dir);
  CHECK_OK(d, fj_kernel_get(d, &v, &kb));
  unsetenv("FLASHJIT_TEMPLATE_DIR");
  CHECK(d->renders == 1);
  fj_ctx_destroy(a);
  fj_ctx_destroy(b);
  fj_ctx_destroy(c);
  fj_ctx_destroy(d);
  return 0;
}

/* Renders lut_probe.cu in ctx with a table parameter (which the template
 * ignores) holding cuda as the C side's printed expression; how many
 * renders it took. */
static long render_with_facts(fj_ctx *ctx, const char *cuda)
{
  const fj_param expr[] = {{"cuda", FJ_PARAM_STR, 0, cuda, NULL},
                           {"kvq", FJ_PARAM_BOOL, 1, NULL, NULL}};
  const fj_param facts[] = {fj_param_table("score", expr, 2),
                            {"mask", FJ_PARAM_STR, 0, NULL, NULL}};
  const fj_param params[] = {{"arch", FJ_PARAM_STR, 0, ctx->arch, NULL},
                             {"version", FJ_PARAM_STR, 0, fj_version(), NULL},
                             {"sm", FJ_PARAM_INT, ctx->sm, NULL, NULL},
                             fj_param_table("mod_facts", facts, 2)};
  fj_kernel *k;
  long before = ctx->renders;
  if (FJT_LOCKED(ctx, fj__kernel_build(ctx, "lut_probe.cu", params, 4, &k)) != FJ_OK) {
    fprintf(stderr, "render_with_facts: %s\n", fj_errmsg(ctx));
    return -1;
  }
  return ctx->renders - before;
}

/* The render index's key follows what the C side prints into a table
 * parameter (mods_kernel.c's mod_facts: the expressions as CUDA), not only
 * the templates and the user's texts: a library whose printer changed
 * renders again rather than take an older render of the same expression
 * from the disk cache.  The table's contents count, nested, to the last
 * space. */
int test_cache_render_index_facts(void)
{
  const char *dir = fjt_tmpdir();
  static const char *const printed[] = {
      "fj::iadd(q, 1)", "(q + 1)", "fj::iadd(q, 1) ",
  };
  fj_ctx *a = logged_ctx("sm_80", dir);
  CHECK(a);
  for (size_t i = 0; i < FJ_ARRAY_LEN(printed); i++) {
    fj_ctx *b = logged_ctx("sm_80", dir);
    CHECK(b);
    long renders = render_with_facts(b, printed[i]);
    fj_ctx_destroy(b);
    if (renders != 1) {
      fprintf(stderr, "facts \"%s\": %ld renders, want 1 (an older "
                      "render was taken)\n", printed[i], renders);
      return 1;
    }
  }
  /* The same printing again: the index answers. */
  CHECK(render_with_facts(a, printed[1]) == 0);
  fj_ctx_destroy(a);
  return 0;
}

/* ---- cache packs ------------------------------------------------------------ */

/* The variants of the pack tests: sm_80's decode pick with GQA (mma,
 * packed, split: a combine kernel too) and the default d64 kernel. */
static int pack_variants(fj_ctx *ctx, fj_variant vs[2])
{
  fj_problem p;
  fj_problem_init(&p, 2, 8, 2, 1, 4096, 64, FJ_F16, FJ_BHSD);
  fj_plan plan;
  CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
  CHECK(plan.variant.pack_gqa && plan.variant.split_kv && plan.splits > 1);
  vs[0] = plan.variant;
  fj_variant_default(&vs[1], 64, FJ_F16, FJ_CAUSAL_NONE);
  return 0;
}

/* The bytes of a file (malloc'd), or NULL. */
static char *slurp(const char *path, size_t *len)
{
  return fj__file_read(path, (uint64_t)1 << 31, len);
}

int test_cache_pack_round_trip(void)
{
  char a_dir[4200], b_dir[4200], pack[4200];
  snprintf(a_dir, sizeof a_dir, "%s", fjt_tmpdir());
  snprintf(b_dir, sizeof b_dir, "%s", fjt_tmpdir());
  snprintf(pack, sizeof pack, "%s/fleet.fjpack", fjt_tmpdir());
  fj_ctx *a = fjt_ctx("sm_80", a_dir);
  CHECK(a);
  fj_variant vs[3];
  CHECK(pack_variants(a, vs) == 0);
  vs[2] = vs[0];  /* a duplicate is prepared once */
  fj_prepare_opts po = {2, NULL, NULL};
  fj_status each[3];
  fj_prewarm_report pr;
  CHECK_OK(a, fj_cache_prewarm(a, vs, 3, &po, each, &pr));
  CHECK(each[0] == FJ_OK && each[1] == FJ_OK && each[2] == FJ_OK);
  /* Two variants and the combine kernel of the split one. */
  CHECK(pr.variants == 2 && pr.kernels == 3 && pr.compiled == 3 &&
        pr.cached == 0 && pr.failed == 0);
  fj_ctx *a2 = fjt_ctx("sm_80", a_dir);  /* a second process's view */
  CHECK_OK(a2, fj_cache_prewarm(a2, vs, 2, NULL, NULL, &pr));
  CHECK(pr.compiled == 0 && pr.cached == 3);
  fj_cache_pack_report r;
  CHECK_OK(a, fj_cache_export(a, pack, &r));
  CHECK(r.entries == 6 && r.skipped == 0);  /* a kernel and a render each */

  /* A fresh directory with the pack imported: no compile, no render. */
  fj_ctx *b = fjt_ctx("sm_80", b_dir);
  CHECK_OK(b, fj_cache_import(b, pack, &r));
  CHECK(r.entries == 6 && r.installed == 6 && r.present == 0 && r.kept == 0);
  fj_kernel *k;
  for (int i = 0; i < 2; i++)
    CHECK_OK(b, fj_kernel_get(b, &vs[i], &k));
  CHECK_OK(b, FJT_LOCKED(b, fj__combine_kernel(b, &vs[0], 64, &k)));  /* d64: one slice */
  fj_cache_stats s;
  fj_cache_stats_get(b, &s);
  CHECK(s.misses == 0 && s.disk_hits == 3 && s.disk_rejects == 0);
  CHECK(b->renders == 0);
  CHECK_OK(b, fj_cache_import(b, pack, &r));  /* again: all there */
  CHECK(r.installed == 0 && r.present == 6 && r.kept == 0);

  /* A valid but different entry under one of the names is kept. */
  find_kind f = {"kernel", ""};
  CHECK_OK(b, fj_cache_list(b, find_visit, &f));
  char path[4600];
  snprintf(path, sizeof path, "%s/%s", b_dir, f.file);
  size_t len;
  char *bytes = slurp(path, &len);
  CHECK(bytes && len > 200);
  bytes[len - 9] ^= 0x5a;  /* the payload's compile time: still unpacks */
  uint64_t sum = fj__hash64(bytes + 40, len - 40);
  memcpy(bytes + 32, &sum, sizeof sum);  /* entry_header.checksum */
  CHECK(fjt_write_file(path, bytes, len) == 0);
  CHECK_OK(b, fj_cache_import(b, pack, &r));
  CHECK(r.installed == 0 && r.present == 5 && r.kept == 1);
  size_t len2;
  char *after = slurp(path, &len2);
  CHECK(after && len2 == len && !memcmp(after, bytes, len));
  free(after);
  free(bytes);
  fj_ctx_destroy(a);
  fj_ctx_destroy(a2);
  fj_ctx_destroy(b);
  return 0;
}

/* Imports `pack` into a fresh directory expecting a refusal whose message
 * has `text`, and nothing installed. */
static int refused(const char *pack, const char *text)
{
  const char *dir = fjt_tmpdir();
  fj_ctx *c = fjt_ctx("sm_80", dir);
  CHECK(c);
  fj_cache_pack_report r;
  CHECK_ST(c, fj_cache_import(c, pack, &r), FJ_ERR_INVALID_ARG);
  CHECK_MSG(c, text);
  CHECK(!strchr(fj_errmsg(c), '\n'));
  CHECK(r.installed == 0);
  int entries, temps;
  count_files(dir, &entries, &temps, NULL, 0);
  CHECK(entries == 0 && temps == 0);
  fj_ctx_destroy(c);
  return 0;
}

/* Writes a copy of data with one change into dir/name; returns its path. */
static const char *variant_file(const char *dir, const char *name,
                                const char *data, size_t len, size_t at,
                                const void *put, size_t put_len, char *out,
                                size_t size)
{
  char *copy = malloc(len);
  memcpy(copy, data, len);
  if (put_len)
    memcpy(copy + at, put, put_len);
  snprintf(out, size, "%s/%s", dir, name);
  fjt_write_file(out, copy, at < len && !put_len ? at : len);
  free(copy);
  return out;
}

int test_cache_pack_refusals(void)
{
  char dir[4200], tmp[4200], pack[4300], p[4300], want[200];
  snprintf(dir, sizeof dir, "%s", fjt_tmpdir());
  snprintf(tmp, sizeof tmp, "%s", fjt_tmpdir());
  snprintf(pack, sizeof pack, "%s/one.fjpack", tmp);
  fj_ctx *a = fjt_ctx("sm_80", dir);
  fj_variant v;
  fj_variant_default(&v, 64, FJ_F16, FJ_CAUSAL_NONE);
  fj_kernel *k;
  CHECK_OK(a, fj_kernel_get(a, &v, &k));
  fj_cache_pack_report r;
  CHECK_OK(a, fj_cache_export(a, pack, &r));
  CHECK(r.entries == 2);
  size_t len;
  char *data = slurp(pack, &len);
  CHECK(data && len > 200);
  CHECK(memcmp(data, "FJPACK01", 8) == 0);

  snprintf(p, sizeof p, "%s/missing", tmp);
  CHECK(refused(p, "cannot be read (No such file or directory)") == 0);
  CHECK(refused(variant_file(tmp, "short", data, len, 20, NULL, 0, p,
                             sizeof p),
                "is 20 bytes, shorter than a cache pack's header (56 "
                "bytes)") == 0);
  CHECK(refused(variant_file(tmp, "cut", data, len, len - 10, NULL, 0, p,
                             sizeof p),
                "is truncated or damaged: its header says") == 0);
  CHECK(refused(variant_file(tmp, "magic", data, len, 0, "XXPACK01", 8, p,
                             sizeof p),
                "is not a flashjit cache pack (bad magic") == 0);
  char nv[16] = "11.8";
  snprintf(want, sizeof want, "was exported by NVRTC 11.8 (pack format 1, "
                              "cache format %d); this process has NVRTC %s",
           FJ_FORMAT_VERSION, fj__nvrtc_version());
  CHECK(refused(variant_file(tmp, "nvrtc", data, len, 16, nv, sizeof nv, p,
                             sizeof p),
                want) == 0);
  uint32_t fmt = 99;
  CHECK(refused(variant_file(tmp, "format", data, len, 8, &fmt, 4, p,
                             sizeof p),
                "(pack format 99, cache format") == 0);
  /* A flipped byte inside the first entry's bytes: its checksum. */
  char flip = (char)(data[56 + 24 + 36 + 60] ^ 1);
  CHECK(refused(variant_file(tmp, "flip", data, len, 56 + 24 + 36 + 60,
                             &flip, 1, p, sizeof p),
                ", its checksum does not match: nothing imported") == 0);
  /* The whole file's checksum, when every entry reads well. */
  uint64_t sum;
  memcpy(&sum, data + 48, 8);
  sum ^= 1;
  CHECK(refused(variant_file(tmp, "sum", data, len, 48, &sum, 8, p, sizeof p),
                "is corrupt: its checksum does not match") == 0);

  /* Arguments and a disabled cache. */
  CHECK_ST(a, fj_cache_import(a, NULL, NULL), FJ_ERR_INVALID_ARG);
  CHECK_MSG(a, "fj_cache_import: path is NULL");
  CHECK_ST(NULL, fj_cache_export(NULL, pack, NULL), FJ_ERR_INVALID_ARG);
  CHECK_ST(a, fj_cache_export(a, "", NULL), FJ_ERR_INVALID_ARG);
  fj_ctx *m = fjt_ctx("sm_80", NULL);
  CHECK_ST(m, fj_cache_import(m, pack, NULL), FJ_ERR_NOT_FOUND);
  CHECK_MSG(m, "the disk cache is disabled");
  snprintf(p, sizeof p, "%s/no/such/dir/x.fjpack", tmp);
  CHECK_ST(a, fj_cache_export(a, p, NULL), FJ_ERR_IO);
  CHECK_MSG(a, "cannot write the cache pack");
  free(data);
  fj_ctx_destroy(a);
  fj_ctx_destroy(m);
  return 0;
}

/* A temporary file of the same name as another writer's (two processes
 * of one pid in their own pid namespaces): the write fails and leaves
 * the other's file alone; a name of its own is written and renamed into
 * place.  Temporaries are named by fj__temp_id: the pid, the process's
 * random tag (drawn once), then a count of its own. */
int test_cache_temp_names(void)
{
  const char *dir = fjt_tmpdir();
  char tmp[4300], path[4300];
  snprintf(tmp, sizeof tmp, "%s/.tmp-theirs", dir);
  snprintf(path, sizeof path, "%s/entry", dir);
  CHECK(fjt_write_file(tmp, "theirs", 6) == 0);
  const void *parts[1] = {"mine"};
  size_t sizes[1] = {4};
  CHECK(fj__write_replace(tmp, path, 0644, parts, sizes, 1) == -1);
  struct stat st;
  CHECK(stat(tmp, &st) == 0 && st.st_size == 6);
  CHECK(stat(path, &st) != 0);
  /* Created here, renamed into place. */
  unlink(tmp);
  CHECK(fj__write_replace(tmp, path, 0644, parts, sizes, 1) == 0);
  CHECK(stat(path, &st) == 0 && st.st_size == 4 && stat(tmp, &st) != 0);
  /* Two names of one process: its pid and tag, then their own counts. */
  char a[FJ_TEMP_ID_MAX], b[FJ_TEMP_ID_MAX];
  fj__temp_id(a);
  fj__temp_id(b);
  char pid[32];
  snprintf(pid, sizeof pid, "%ld-", (long)getpid());
  CHECK(strncmp(a, pid, strlen(pid)) == 0 && strcmp(a, b) != 0);
  CHECK(strlen(a) > strlen(pid) + 17 && strncmp(a, b, strlen(pid) + 17) == 0);
  return 0;
}
