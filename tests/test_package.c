/*
 * test_package.c -- the read-only kernel package (fj_ctx_opts.package_dir,
 * fj_cache_package_seal): a context with a package plans and gets the
 * README's quick-start kernels without one NVRTC call and without a
 * render, never writes into the package, and copies nothing into its own
 * cache; a package it cannot use (another NVRTC, another arch, no
 * manifest) is left out with a warning that says why; a damaged or
 * foreign entry is a miss; a seal over another toolkit's package is
 * refused.  On a GPU: the first attention call with a package compiles
 * nothing, the layout probe included, and is right.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "compile.h"
#include "ctx.h"
#include "gpu_case.h"
#include "package.h"
#include "util.h"
#include "runner.h"

static char warning[1024];

static void capture(void *user, fj_log_level level, const char *msg)
{
  (void)user;
  if (level == FJ_LOG_WARN)
    snprintf(warning, sizeof warning, "%s", msg);
}

static fj_ctx *pkg_ctx(const char *arch, const char *dir, const char *pkg)
{
  fj_ctx_opts o;
  fj_ctx_opts_init(&o);
  o.device = -1;
  o.arch = arch;
  o.cache_dir = dir;
  o.package_dir = pkg;
  o.log = capture;
  fj_ctx *ctx = NULL;
  warning[0] = '\0';
  if (fj_ctx_create(&ctx, &o) != FJ_OK)
    fprintf(stderr, "%s\n", fj_errmsg(NULL));
  return ctx;
}

/* The README's quick-start calls (Python): (2, 8, 4096, 128) bf16 causal
 * top-left, and its GQA call (2 KV heads) bottom-right. */
static void quick_start(fj_problem *p, int which)
{
  fj_problem_init(p, 2, 8, which ? 2 : 8, 4096, 4096, 128, FJ_BF16, FJ_BHSD);
  p->causal = which ? FJ_CAUSAL_BOTTOM_RIGHT : FJ_CAUSAL_TOP_LEFT;
}

/* A package of the quick start's picks for arch in dir, sealed; the
 * variants in vs[2].  0, or 1 (printed). */
static int make_package(const char *arch, const char *dir, fj_variant vs[2],
                        fj_package_report *r)
{
  fj_ctx *ctx = pkg_ctx(arch, dir, NULL);
  CHECK(ctx);
  for (int i = 0; i < 2; i++) {
    fj_problem p;
    fj_plan plan;
    quick_start(&p, i);
    CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
    vs[i] = plan.variant;
  }
  fj_prepare_opts po = {1, NULL, NULL};
  CHECK_OK(ctx, fj_cache_prewarm(ctx, vs, 2, &po, NULL, NULL));
  CHECK_OK(ctx, fj_cache_package_seal(ctx, r));
  fj_ctx_destroy(ctx);
  return 0;
}

/* The names, sizes and times of dir's files, as one string. */
static void snapshot(const char *dir, char *out, size_t size)
{
  fj_buf b = {0};
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL) {
    char path[4200];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (e->d_name[0] != '.' && lstat(path, &st) == 0)
      fj__buf_appendf(&b, "%s %lld %lld.%09ld\n", e->d_name,
                      (long long)st.st_size, (long long)st.st_mtim.tv_sec,
                      st.st_mtim.tv_nsec);
  }
  if (d)
    closedir(d);
  snprintf(out, size, "%s", b.data ? b.data : "");
  fj__buf_free(&b);
}

static int count_entries(const char *dir)
{
  int n = 0;
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL)
    n += strlen(e->d_name) > 4 &&
         !strcmp(e->d_name + strlen(e->d_name) - 4, ".fjc");
  if (d)
    closedir(d);
  return n;
}

int test_package_first_call(void)
{
  char pkg[4096], own[4096], before[8192], after[8192];
  snprintf(pkg, sizeof pkg, "%s", fjt_tmpdir());
  fj_variant vs[2];
  fj_package_report r;
  if (make_package("sm_90a", pkg, vs, &r))
    return 1;
  /* Two kernels and the probe, each with its render-index entry. */
  printf("package: %d entries, %llu bytes, probe %d\n", r.entries,
         (unsigned long long)r.bytes, r.probe);
  CHECK(r.entries == 6 && r.probe == 1 && r.bytes > 0);
  snapshot(pkg, before, sizeof before);
  snprintf(own, sizeof own, "%s", fjt_tmpdir());
  fj_ctx *ctx = pkg_ctx("sm_90a", own, pkg);
  CHECK(ctx && fj_cache_package_dir(ctx) &&
        !strcmp(fj_cache_package_dir(ctx), pkg));
  unsigned long nvrtc = fj__nvrtc_compiles();
  for (int i = 0; i < 2; i++) {
    fj_problem p;
    fj_plan plan;
    fj_kernel *k;
    quick_start(&p, i);
    CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
    CHECK_OK(ctx, fj_kernel_get(ctx, &plan.variant, &k));
    fj_resources res;
    fj_kernel_resources(k, &res);
    CHECK(res.cache == FJ_CACHE_DISK && res.registers > 0);
  }
  fj_cache_stats s;
  fj_cache_stats_get(ctx, &s);
  printf("NVRTC calls %lu, renders %ld, misses %llu, package hits %llu\n",
         fj__nvrtc_compiles() - nvrtc, ctx->renders,
         (unsigned long long)s.misses, (unsigned long long)s.package_hits);
  CHECK(fj__nvrtc_compiles() == nvrtc);  /* no NVRTC call at all */
  CHECK(ctx->renders == 0);              /* the render index came too */
  CHECK(s.misses == 0 && s.package_hits == 2 && s.disk_hits == 2);
  CHECK(s.disk_writes == 0 && count_entries(own) == 0);
  snapshot(pkg, after, sizeof after);
  CHECK(!strcmp(before, after));  /* the package was not written */
  /* The same cubin as the package's maker compiled. */
  fj_ctx *maker = pkg_ctx("sm_90a", pkg, NULL);
  fj_kernel *a, *b;
  CHECK_OK(maker, fj_kernel_get(maker, &vs[0], &a));
  CHECK_OK(ctx, fj_kernel_get(ctx, &vs[0], &b));
  size_t la, lb;
  const void *ca = fj_kernel_cubin(a, &la), *cb = fj_kernel_cubin(b, &lb);
  CHECK(la == lb && la > 0 && !memcmp(ca, cb, la));
  fj_ctx_destroy(maker);
  fj_ctx_destroy(ctx);
  /* The environment names a package when the options do not. */
  setenv("FLASHJIT_PACKAGE_DIR", pkg, 1);
  ctx = pkg_ctx("sm_90a", NULL, NULL);
  unsetenv("FLASHJIT_PACKAGE_DIR");
  CHECK(ctx && fj_cache_package_dir(ctx) &&
        !strcmp(fj_cache_package_dir(ctx), pkg));
  fj_ctx_destroy(ctx);
  return 0;
}

#ifndef FJT_CLI
#define FJT_CLI ""
#endif

/* `flashjit cache prewarm --package dir` on sm_90a at head dim 64, bf16,
 * top-left, with --backward when bwd (a package compiles into its own
 * directory); its output in dir.log.  0 when it succeeded. */
static int cli_package(const char *cli, const char *dir, int bwd)
{
  char log[4300];
  snprintf(log, sizeof log, "%s.log", dir);
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execl(cli, "flashjit", "cache", "prewarm", "--package", dir, "--arch",
          "sm_90a", "--head-dim", "64", "--dtype", "bf16", "--causal",
          "top-left", "--workers", "2", bwd ? "--backward" : (char *)NULL,
          (char *)NULL);
    _exit(127);
  }
  int ws = 0;
  return pid > 0 && waitpid(pid, &ws, 0) == pid && WIFEXITED(ws) &&
                 WEXITSTATUS(ws) == 0
             ? 0
             : 1;
}

/* The GPT examples' attention (head dim 64, 8/2 heads, 512 tokens, bf16,
 * causal top-left, BSHD): examples/gpt_flashjit.py's batch 2 and
 * examples/gpt_train.py's batch 8, which take different forward kernels
 * on sm_90a.  With the package that `cache prewarm --package` (then
 * `--backward`) makes for their head dim, dtype and mask, a context plans
 * and gets their forward kernels and the backward's three without one
 * NVRTC call or render (issue 36's bar: the GPT example's calls compile
 * nothing). */
int test_package_examples(void)
{
  const char *cli = getenv("FJT_CLI");
  if (!cli || !*cli)
    cli = FJT_CLI;
  if (!*cli || access(cli, X_OK) != 0)
    return fjt_skip("no flashjit command-line tool (built without "
                    "FLASHJIT_BUILD_CLI; FJT_CLI names one)");
  char pkg[4200], own[4096];
  snprintf(pkg, sizeof pkg, "%s/pkg", fjt_tmpdir());
  CHECK(cli_package(cli, pkg, 0) == 0);
  CHECK(cli_package(cli, pkg, 1) == 0);
  snprintf(own, sizeof own, "%s", fjt_tmpdir());
  fj_ctx *ctx = pkg_ctx("sm_90a", own, pkg);
  CHECK(ctx && fj_cache_package_dir(ctx) && warning[0] == '\0');
  unsigned long nvrtc = fj__nvrtc_compiles();
  char names[2][160];
  for (int i = 0; i < 2; i++) {
    fj_problem p;
    fj_problem_init(&p, i ? 8 : 2, 8, 2, 512, 512, 64, FJ_BF16, FJ_BSHD);
    p.causal = FJ_CAUSAL_TOP_LEFT;
    fj_plan plan;
    fj_kernel *k;
    CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
    CHECK_OK(ctx, fj_kernel_get(ctx, &plan.variant, &k));
    snprintf(names[i], sizeof names[i], "%s", fj_kernel_name(k));
    fj_bwd_plan bp;
    CHECK_OK(ctx, fj_attention_bwd_plan(ctx, &p, &bp));
    for (int w = 0; w < FJ_BWD_KERNELS; w++)
      CHECK_OK(ctx, fj_attention_bwd_kernel(ctx, &p, &bp, w, &k));
  }
  printf("forward kernels: %s (batch 2), %s (batch 8)\n", names[0], names[1]);
  fj_cache_stats s;
  fj_cache_stats_get(ctx, &s);
  printf("NVRTC calls %lu, renders %ld, misses %llu, package hits %llu\n",
         fj__nvrtc_compiles() - nvrtc, ctx->renders,
         (unsigned long long)s.misses, (unsigned long long)s.package_hits);
  CHECK(strcmp(names[0], names[1]) != 0);  /* two forward kernels */
  CHECK(fj__nvrtc_compiles() == nvrtc);
  CHECK(ctx->renders == 0);
  CHECK(s.misses == 0 && s.package_hits >= 5);
  fj_ctx_destroy(ctx);
  return 0;
}

/* Rewrites the manifest's nvrtc= line. */
static int set_manifest_nvrtc(const char *dir, const char *version)
{
  char path[4200];
  size_t len = 0;
  snprintf(path, sizeof path, "%s/%s", dir, FJ_PACKAGE_MANIFEST);
  char *text = fj__file_read(path, 1 << 16, &len);
  if (!text)
    return -1;
  fj_buf b = {0};
  for (char *p = text; *p;) {
    size_t n = strcspn(p, "\n");
    if (!strncmp(p, "nvrtc=", 6))
      fj__buf_appendf(&b, "nvrtc=%s\n", version);
    else
      fj__buf_appendf(&b, "%.*s\n", (int)n, p);
    p += n + (p[n] != '\0');
  }
  free(text);
  chmod(path, 0644);
  int rc = fjt_write_file(path, b.data, b.len);
  fj__buf_free(&b);
  return rc;
}

/* The kernel entry of v in the package: its path. */
static int entry_of(fj_ctx *ctx, const fj_variant *v, char *path, size_t n)
{
  fj_kernel *k;
  if (fj_kernel_get(ctx, v, &k) != FJ_OK)
    return -1;
  char src_hash[33];
  fj_cache_key key;
  size_t len;
  const char *src = fj_kernel_source(k, &len);
  fj__hash_hex(src, len, src_hash);
  fj__cache_key(&key, "kernel", ctx->arch, 0 /* not a quick kernel */, src_hash,
                fj_kernel_name(k));
  snprintf(path, n, "%s/%s.fjc", fj_cache_dir(ctx), key.hex);
  return 0;
}

/* A context of arch with pkg: whether it took the package, and how v's
 * kernel was found. */
static int origin_with(const char *arch, const char *pkg, const fj_variant *v,
                       int *used)
{
  fj_ctx *ctx = pkg_ctx(arch, fjt_tmpdir(), pkg);
  fj_kernel *k;
  if (!ctx || fj_kernel_get(ctx, v, &k) != FJ_OK)
    return -1;
  *used = fj_cache_package_dir(ctx) != NULL;
  fj_resources r;
  fj_kernel_resources(k, &r);
  fj_ctx_destroy(ctx);
  return (int)r.cache;
}

int test_package_refusals(void)
{
  char pkg[4096], path[4200], other[4200];
  snprintf(pkg, sizeof pkg, "%s", fjt_tmpdir());
  fj_variant v, w;
  fj_variant_default(&v, 64, FJ_F16, FJ_CAUSAL_NONE);
  fj_variant_default(&w, 32, FJ_F16, FJ_CAUSAL_NONE);
  fj_ctx *maker = pkg_ctx("sm_80", pkg, NULL);
  CHECK(maker);
  fj_prepare_opts po = {1, NULL, NULL};
  fj_variant both[2] = {v, w};
  CHECK_OK(maker, fj_cache_prewarm(maker, both, 2, &po, NULL, NULL));
  CHECK_OK(maker, fj_cache_package_seal(maker, NULL));
  CHECK(entry_of(maker, &v, path, sizeof path) == 0);
  CHECK(entry_of(maker, &w, other, sizeof other) == 0);
  fj_ctx_destroy(maker);
  int used = -1;
  /* The package as made: used. */
  CHECK(origin_with("sm_80", pkg, &v, &used) == FJ_CACHE_DISK && used == 1);
  /* A context that reads a package seals none (its prewarm may have
   * found kernels there instead of writing them); "" reads no package,
   * whatever the environment says. */
  fj_ctx *reader = pkg_ctx("sm_80", fjt_tmpdir(), pkg);
  CHECK(reader && fj_cache_package_dir(reader));
  CHECK_ST(reader, fj_cache_package_seal(reader, NULL), FJ_ERR_INVALID_ARG);
  CHECK_MSG(reader, "make a package with package_dir \"\" (no package read)");
  fj_ctx_destroy(reader);
  setenv("FLASHJIT_PACKAGE_DIR", pkg, 1);
  reader = pkg_ctx("sm_80", fjt_tmpdir(), "");
  unsetenv("FLASHJIT_PACKAGE_DIR");
  CHECK(reader && !fj_cache_package_dir(reader));
  fj_ctx_destroy(reader);
  /* Another arch: the package holds none of its kernels. */
  CHECK(origin_with("sm_90a", pkg, &v, &used) == FJ_CACHE_MISS && used == 0);
  CHECK(strstr(warning, "holds no kernels for sm_90a (it has sm_80): not used"));
  /* Another NVRTC: never used, said once at the context's opening. */
  CHECK(set_manifest_nvrtc(pkg, "12.8") == 0);
  CHECK(origin_with("sm_80", pkg, &v, &used) == FJ_CACHE_MISS && used == 0);
  CHECK(strstr(warning, "was made by NVRTC 12.8; this process has"));
  /* ... and a seal over it is refused. */
  maker = pkg_ctx("sm_80", pkg, NULL);
  CHECK_ST(maker, fj_cache_package_seal(maker, NULL), FJ_ERR_INVALID_ARG);
  CHECK_MSG(maker, "already holds a package that was made by NVRTC 12.8");
  CHECK_MSG(maker, "build a package in an empty directory");
  fj_ctx_destroy(maker);
  CHECK(set_manifest_nvrtc(pkg, fj__nvrtc_version()) == 0);
  /* No manifest. */
  char manifest[4200], moved[4200];
  snprintf(manifest, sizeof manifest, "%s/%s", pkg, FJ_PACKAGE_MANIFEST);
  snprintf(moved, sizeof moved, "%s/moved", pkg);
  CHECK(rename(manifest, moved) == 0);
  CHECK(origin_with("sm_80", pkg, &v, &used) == FJ_CACHE_MISS && used == 0);
  CHECK(strstr(warning, "has no readable manifest flashjit-package.txt"));
  CHECK(rename(moved, manifest) == 0);
  /* An entry of another key under v's name: a miss, with a warning. */
  size_t len = 0, wlen = 0;
  char *mine = fj__file_read(path, 1 << 28, &len);
  char *theirs = fj__file_read(other, 1 << 28, &wlen);
  CHECK(mine && theirs);
  chmod(path, 0644);
  CHECK(fjt_write_file(path, theirs, wlen) == 0);
  CHECK(origin_with("sm_80", pkg, &v, &used) == FJ_CACHE_MISS && used == 1);
  CHECK(strstr(warning, "another key under its name): ignored"));
  /* A damaged entry (one payload byte): a miss, with a warning. */
  mine[len - 9] ^= 0x5a;
  CHECK(fjt_write_file(path, mine, len) == 0);
  CHECK(origin_with("sm_80", pkg, &v, &used) == FJ_CACHE_MISS && used == 1);
  CHECK(strstr(warning, "its checksum does not match): ignored"));
  free(mine);
  free(theirs);
  /* A path longer than a directory can be. */
  char *long_dir = malloc(5000);
  CHECK(long_dir);
  memset(long_dir, 'a', 4999);
  long_dir[4999] = '\0';
  fj_ctx_opts o;
  fj_ctx_opts_init(&o);
  o.device = -1;
  o.arch = "sm_80";
  o.package_dir = long_dir;
  fj_ctx *bad = NULL;
  CHECK_ST(NULL, fj_ctx_create(&bad, &o), FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "package_dir is 4999 bytes long: at most 4095");
  CHECK(bad == NULL);
  free(long_dir);
  return 0;
}

/* ---- on a GPU ------------------------------------------------------------------ */

int test_gpu_package_first_call(void)
{
  fj_ctx *g;
  int rc = fjt_gpu_ctx(fjt_tmpdir(), &g);
  if (rc)
    return rc;
  char arch[16], pkg[4096];
  snprintf(arch, sizeof arch, "%s", fj_ctx_arch(g));
  fj_ctx_destroy(g);
  snprintf(pkg, sizeof pkg, "%s", fjt_tmpdir());
  fj_variant vs[2];
  fj_package_report r;
  if (make_package(arch, pkg, vs, &r))
    return 1;
  setenv("FLASHJIT_PACKAGE_DIR", pkg, 1);
  rc = fjt_gpu_ctx(fjt_tmpdir(), &g);
  unsetenv("FLASHJIT_PACKAGE_DIR");
  if (rc)
    return rc;
  CHECK(fj_cache_package_dir(g) != NULL);
  unsigned long nvrtc = fj__nvrtc_compiles();
  uint64_t seed = 36;
  int bad = 0;
  for (int i = 0; i < 2; i++) {
    gpu_case c;
    memset(&c, 0, sizeof c);
    quick_start(&c.p, i);
    bad |= fjt_gpu_run(g, &c, NULL, NULL, &seed,
                       i ? "quick start, GQA, from the package"
                         : "quick start, from the package", "package");
  }
  fj_cache_stats s;
  fj_cache_stats_get(g, &s);
  printf("NVRTC calls %lu, misses %llu, package hits %llu (the layout probe "
         "and the two kernels)\n", fj__nvrtc_compiles() - nvrtc,
         (unsigned long long)s.misses, (unsigned long long)s.package_hits);
  fj_ctx_destroy(g);
  CHECK(!bad);
  CHECK(fj__nvrtc_compiles() == nvrtc && s.misses == 0);
  CHECK(s.package_hits == 3);
  return 0;
}
