/*
 * test_cache.c -- the disk cache: hits and misses across contexts, corrupt
 * and truncated entries (misses that get rewritten), a directory that
 * cannot be used, several processes compiling into one directory at once,
 * listing and clearing, and the render index (a disk hit without a
 * render).  Every kernel leaves two entries: kind "kernel" (the cubin) and
 * kind "render" (the index).
 */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "template.h"
#include "util.h"
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
  char stray[4300];
  snprintf(stray, sizeof stray, "%s/.tmp-1-2-abc", dir);
  CHECK(fjt_write_file(stray, "partial", 7) == 0);
  seen s = {0};
  CHECK_OK(ctx, fj_cache_list(ctx, visit, &s));
  CHECK(s.entries == 4 && s.valid == 4 && s.kernels == 2);
  int removed = -1;
  CHECK_OK(ctx, fj_cache_clear(ctx, &removed));
  CHECK(removed == 5);
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
