/*
 * runner.h -- what every test file shares: the check macros and a few
 * helpers.  A test is `int test_NAME(void)` returning 0 (pass), 1 (fail) or
 * FJT_SKIP; each check prints where and why it failed and returns 1.
 */
#ifndef FJ_TEST_RUNNER_H
#define FJ_TEST_RUNNER_H

#include <stdio.h>
#include <string.h>

#include "flashjit.h"

#define FJT_SKIP 77

#define TEST(name, label) int test_##name(void);
#include "test_list.h"
#undef TEST

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__,    \
              #cond);                                                      \
      return 1;                                                            \
    }                                                                      \
  } while (0)

/* Checks a status, printing the library's message when it differs. */
#define CHECK_ST(ctx, expr, want)                                          \
  do {                                                                     \
    fj_status got_ = (expr);                                               \
    if (got_ != (want)) {                                                  \
      fprintf(stderr, "%s:%d: %s returned %d (%s), want %d (%s)\n%s\n",    \
              __FILE__, __LINE__, #expr, (int)got_, fj_status_str(got_),   \
              (int)(want), fj_status_str(want), fj_errmsg(ctx));           \
      return 1;                                                            \
    }                                                                      \
  } while (0)

#define CHECK_OK(ctx, expr) CHECK_ST(ctx, expr, FJ_OK)

/* Checks that the last message on ctx contains a piece of text. */
#define CHECK_MSG(ctx, text)                                               \
  do {                                                                     \
    const char *msg_ = fj_errmsg(ctx);                                     \
    if (!strstr(msg_, (text))) {                                           \
      fprintf(stderr, "%s:%d: message lacks \"%s\":\n%s\n", __FILE__,      \
              __LINE__, (text), msg_);                                     \
      return 1;                                                            \
    }                                                                      \
  } while (0)

/* A fresh directory under $TMPDIR (or /tmp), removed when the test exits. */
const char *fjt_tmpdir(void);
/* Writes a file; 0 on success. */
int fjt_write_file(const char *path, const void *data, size_t len);
/* A compile-only context for arch with its cache in dir (NULL: memory). */
fj_ctx *fjt_ctx(const char *arch, const char *dir);
/* fjt_ctx with a log callback (log NULL: none). */
fj_ctx *fjt_ctx_log(const char *arch, const char *dir, fj_log_fn log,
                    void *user);
/* A GPU context on device 0: 0, or FJT_SKIP (no device, reason given),
 * or 1 (another failure, printed). */
int fjt_gpu_ctx(const char *dir, fj_ctx **ctx);
/* The same, the library's diagnostics to log (with user). */
int fjt_gpu_ctx_log(const char *dir, fj_log_fn log, void *user, fj_ctx **ctx);
/* Skips the running test for the reason printf would print from fmt: prints
 * "SKIP: reason" (ctest's summary lists it, tests/skip_reasons.sh) and
 * returns FJT_SKIP.  A test that returns FJT_SKIP without calling it
 * fails: a skip always says why. */
int fjt_skip(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
/* Source of the tests' data files (the crash anchor, goldens). */
const char *fjt_data_dir(void);

#endif
