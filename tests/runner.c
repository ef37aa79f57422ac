/*
 * runner.c -- the one test binary.  `fj_tests NAME` runs one test (ctest
 * runs each in its own process, with a timeout); `fj_tests` lists them;
 * `fj_tests --label cpu` runs a whole label in this process.
 */
#define _XOPEN_SOURCE 700
#include <execinfo.h>
#include <ftw.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runner.h"

static const struct {
  const char *name;
  const char *label;
  int (*fn)(void);
} tests[] = {
#define TEST(name, label) {#name, #label, test_##name},
#include "test_list.h"
#undef TEST
};

static char tmp_root[4096];
/* Whether the running test gave a reason for skipping (fjt_skip). */
static int skip_said;

static int remove_one(const char *path, const struct stat *st, int flag,
                      struct FTW *ftw)
{
  (void)st;
  (void)flag;
  (void)ftw;
  chmod(path, 0700);
  return remove(path);
}

static void cleanup(void)
{
  if (tmp_root[0] && !getenv("FJT_KEEP"))
    nftw(tmp_root, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

const char *fjt_tmpdir(void)
{
  static int n;
  static char dir[4200];
  if (!tmp_root[0]) {
    const char *t = getenv("TMPDIR");
    snprintf(tmp_root, sizeof tmp_root, "%s/fjtest-XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(tmp_root)) {
      perror("mkdtemp");
      exit(1);
    }
    atexit(cleanup);
  }
  snprintf(dir, sizeof dir, "%s/d%d", tmp_root, n++);
  mkdir(dir, 0755);
  return dir;
}

int fjt_write_file(const char *path, const void *data, size_t len)
{
  FILE *f = fopen(path, "wb");
  if (!f)
    return -1;
  int bad = fwrite(data, 1, len, f) != len;
  return fclose(f) != 0 || bad;
}

fj_ctx *fjt_ctx(const char *arch, const char *dir)
{
  return fjt_ctx_log(arch, dir, NULL, NULL);
}

fj_ctx *fjt_ctx_log(const char *arch, const char *dir, fj_log_fn log,
                    void *user)
{
  fj_ctx_opts o;
  fj_ctx_opts_init(&o);
  o.device = -1;
  o.arch = arch;
  o.cache_dir = dir;
  o.disk_cache = dir != NULL;
  o.log = log;
  o.log_user = user;
  fj_ctx *ctx = NULL;
  if (fj_ctx_create(&ctx, &o) != FJ_OK)
    fprintf(stderr, "fjt_ctx(%s): %s\n", arch, fj_errmsg(NULL));
  return ctx;
}

int fjt_gpu_ctx(const char *dir, fj_ctx **ctx)
{
  return fjt_gpu_ctx_log(dir, NULL, NULL, ctx);
}

int fjt_gpu_ctx_log(const char *dir, fj_log_fn log, void *user, fj_ctx **ctx)
{
  fj_ctx_opts o;
  fj_ctx_opts_init(&o);
  o.log = log;
  o.log_user = user;
  o.cache_dir = dir;
  o.disk_cache = dir != NULL;
  /* The GPU tests check the chosen kernels; test_tier.c's cases check the
   * tiered JIT, on by default, and its default. */
  o.jit_tiers = 0;
  fj_status st = fj_ctx_create(ctx, &o);
  if (st == FJ_ERR_NO_DEVICE)
    return fjt_skip("no GPU: %s", fj_errmsg(NULL));
  if (st != FJ_OK) {
    fprintf(stderr, "GPU context: %s\n", fj_errmsg(NULL));
    return 1;
  }
  return 0;
}

const char *fjt_data_dir(void)
{
  const char *dir = getenv("FJT_DATA_DIR");
  return dir && *dir ? dir : FJT_DATA_DIR;
}

int fjt_skip(const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  fputs("SKIP: ", stdout);
  vprintf(fmt, ap);
  putchar('\n');
  va_end(ap);
  skip_said = 1;
  return FJT_SKIP;
}

static int run(size_t i)
{
  skip_said = 0;
  int rc = tests[i].fn();
  if (rc == FJT_SKIP && !skip_said) {
    printf("%s skipped without a reason (a test skips through fjt_skip)\n",
           tests[i].name);
    rc = 1;
  }
  printf("%s %s\n", rc == 0 ? "ok  " : rc == FJT_SKIP ? "skip" : "FAIL",
         tests[i].name);
  fflush(stdout);
  return rc;
}

/* A crashing test prints where (ctest shows it with --output-on-failure). */
static void on_crash(int sig)
{
  void *frames[64];
  int n = backtrace(frames, 64);
  static const char head[] = "test crashed; backtrace:\n";
  write(2, head, sizeof head - 1);
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

int main(int argc, char **argv)
{
  size_t n = sizeof tests / sizeof tests[0];
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGSEGV, on_crash);
  signal(SIGBUS, on_crash);
  signal(SIGABRT, on_crash);
  if (argc < 2) {
    for (size_t i = 0; i < n; i++)
      printf("%s %s\n", tests[i].label, tests[i].name);
    return 0;
  }
  if (argc == 3 && !strcmp(argv[1], "--label")) {
    int failed = 0;
    for (size_t i = 0; i < n; i++)
      if (!strcmp(tests[i].label, argv[2]))
        failed += run(i) == 1;
    return failed != 0;
  }
  for (size_t i = 0; i < n; i++)
    if (!strcmp(tests[i].name, argv[1]))
      return run(i);
  fprintf(stderr, "no test named %s\n", argv[1]);
  return 2;
}
