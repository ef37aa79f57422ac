/*
 * test_hardening.c -- the library against hostile input, as table-driven
 * corpora: every public function with NULL in each pointer argument and
 * with bad values; bad problems for the float64 reference and for
 * fj_problem_check; hostile files in the disk cache's directory.  Each case
 * runs in a child process with a time limit, so that a crash or a hang is
 * counted as one failed case instead of ending (or stalling) the test.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runner.h"

/* ---- running cases in children ----------------------------------------------------- */

typedef enum outcome { PASSED, WRONG, CRASHED, HUNG } outcome;

typedef struct tally {
  int cases, crashes, hangs, wrong;
} tally;

/* A child that reads a hostile file whole must fail to allocate, not take
 * the machine's memory (sanitizers reserve far more address space). */
static void limit_memory(void)
{
#ifndef FJT_SANITIZED
  struct rlimit r = {(rlim_t)1 << 30, (rlim_t)1 << 30};
  setrlimit(RLIMIT_AS, &r);
#endif
}

/* Runs fn(arg) in a child that has `seconds` to exit: its status is fn's
 * result (0 passed), a signal is a crash, SIGALRM a hang. */
static outcome bounded(int (*fn)(const void *), const void *arg, int seconds)
{
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    return WRONG;
  }
  if (pid == 0) {
    limit_memory();
    alarm((unsigned)seconds);
    int rc = fn(arg);
    fflush(stdout);
    fflush(stderr);
    _exit(rc ? 1 : 0);  /* not exit(): the parent owns the temporary files */
  }
  int ws = 0;
  while (waitpid(pid, &ws, 0) < 0 && errno == EINTR)
    ;
  if (WIFSIGNALED(ws))
    return WTERMSIG(ws) == SIGALRM ? HUNG : CRASHED;
  return WIFEXITED(ws) && WEXITSTATUS(ws) == 0 ? PASSED : WRONG;
}

/* Counts a case; a wrong one has printed why from its child. */
static void count(tally *t, const char *name, outcome o, int seconds)
{
  t->cases++;
  t->wrong += o == WRONG;
  t->crashes += o == CRASHED;
  t->hangs += o == HUNG;
  if (o == HUNG)
    fprintf(stderr, "  %s: did not finish within %d s\n", name, seconds);
  else if (o == CRASHED)
    fprintf(stderr, "  %s: CRASHED\n", name);
}

static int report(const tally *t)
{
  printf("%d cases, %d crashes, %d wrong statuses", t->cases, t->crashes,
         t->wrong);
  if (t->hangs)
    printf(", %d hangs", t->hangs);
  printf("\n");
  return t->crashes || t->wrong || t->hangs ? 1 : 0;
}

/* Where a case's message is read: the context's, or the one of calls that
 * have no context (fj_errmsg(NULL)). */
typedef enum msg_on { MSG_NONE, MSG_CTX, MSG_NULL } msg_on;

/* A wrapper's status when a function without one did not do as its
 * comment in flashjit.h says. */
#define NOT_AS_DOCUMENTED ((fj_status)1000)

/* Compares a status and a message with what a case wants; 0 when they
 * match, else prints both. */
static int expect(const char *name, fj_status got, fj_status want,
                  const char *msg, const char *fragment)
{
  if (got != want) {
    fprintf(stderr, "  %s: status %d (%s), want %d (%s); message: %s\n",
            name, (int)got, fj_status_str(got), (int)want,
            fj_status_str(want), msg);
    return 1;
  }
  if (fragment && !strstr(msg, fragment)) {
    fprintf(stderr, "  %s: message lacks \"%s\": %s\n", name, fragment, msg);
    return 1;
  }
  return 0;
}

/* ---- api_null_corpus --------------------------------------------------------------- */

/* What the wrappers share: a compile-only context (memory cache), a
 * kernel compiled on it, and a valid variant and problem. */
static struct fixture {
  fj_ctx *ctx;
  fj_kernel *kernel;
  fj_variant v;
  fj_problem p;
} fx;

static _Alignas(16) char devmem[256];  /* stands in for device pointers */

static int visit_none(void *user, const fj_cache_entry *e)
{
  (void)user;
  (void)e;
  return 0;
}

static int tune_visit_none(void *user, const fj_tune_entry *e)
{
  (void)user;
  (void)e;
  return 0;
}

static fj_status verdict(int as_documented)
{
  return as_documented ? FJ_OK : NOT_AS_DOCUMENTED;
}

/* Context */
static fj_status ctx_opts_init_null(void)
{
  fj_ctx_opts_init(NULL);
  return FJ_OK;
}
static fj_status ctx_create_out_null(void) { return fj_ctx_create(NULL, NULL); }
static fj_status ctx_create_with(int device, const char *arch, const char *dir)
{
  fj_ctx_opts o;
  fj_ctx_opts_init(&o);
  o.device = device;
  o.arch = arch;
  o.cache_dir = dir;
  fj_ctx *c = (fj_ctx *)devmem;
  fj_status st = fj_ctx_create(&c, &o);
  if (st != FJ_OK && c != NULL)
    return NOT_AS_DOCUMENTED;  /* *ctx is NULL on failure */
  fj_ctx_destroy(c);
  return st;
}
static fj_status ctx_create_device_m2(void)
{
  return ctx_create_with(-2, "sm_90", NULL);
}
static fj_status ctx_create_no_arch(void) { return ctx_create_with(-1, NULL, NULL); }
static fj_status ctx_create_empty_arch(void) { return ctx_create_with(-1, "", NULL); }
/* About 6000 bytes of short components under a temporary directory: a
 * truncated copy would still be a directory that can be created. */
static char long_dir[6100];
static fj_status ctx_create_dir_too_long(void)
{
  return ctx_create_with(-1, "sm_90", long_dir);
}
static fj_status ctx_destroy_null(void)
{
  fj_ctx_destroy(NULL);
  return FJ_OK;
}
static fj_status errmsg_null(void) { return verdict(fj_errmsg(NULL) != NULL); }
static fj_status ctx_arch_null(void)
{
  const char *a = fj_ctx_arch(NULL);
  return verdict(a && !*a);
}
static fj_status ctx_has_device_null(void)
{
  return verdict(fj_ctx_has_device(NULL) == 0);
}
static fj_status device_get_ctx_null(void)
{
  fj_device_info info;
  return fj_device_get(NULL, &info);
}
static fj_status device_get_info_null(void) { return fj_device_get(fx.ctx, NULL); }
static fj_status status_str_bad(void)
{
  return verdict(!strcmp(fj_status_str((fj_status)-1), "unknown status"));
}

/* Variants */
static fj_status variant_default_null(void)
{
  fj_variant_default(NULL, 64, FJ_F16, FJ_CAUSAL_NONE);
  return FJ_OK;
}
static fj_status variant_default_garbage(void)
{
  fj_variant v;
  fj_variant_default(&v, -5, (fj_dtype)99, (fj_causal)-1);
  return fj_variant_check(fx.ctx, &v);
}
static fj_status variant_check_ctx_null(void) { return fj_variant_check(NULL, &fx.v); }
static fj_status variant_check_v_null(void) { return fj_variant_check(fx.ctx, NULL); }
static fj_status variant_name_v_null(void)
{
  char buf[64] = "x";
  return verdict(fj_variant_name(NULL, buf, sizeof buf) == -1);
}
static fj_status variant_name_measure(void)
{
  char buf[160];
  int n = fj_variant_name(&fx.v, buf, sizeof buf);
  return verdict(n > 0 && fj_variant_name(&fx.v, NULL, 0) == n &&
                 (size_t)n == strlen(buf));
}
static fj_status variant_name_buf_null_size(void)
{
  int n = fj_variant_name(&fx.v, NULL, 100);  /* snprintf would write */
  return verdict(n > 0 && n == fj_variant_name(&fx.v, NULL, 0));
}
static fj_status variant_name_truncated(void)
{
  char buf[5];
  int n = fj_variant_name(&fx.v, buf, sizeof buf);
  return verdict(n > 5 && !strcmp(buf, "fj_a"));
}
static fj_status variant_name_bad_enums(void)
{
  fj_variant v = fx.v;
  v.swizzle = (fj_swizzle)-7;
  v.mma = (fj_mma)42;
  v.dtype = (fj_dtype)0;
  v.kv_dtype = (fj_dtype)77;
  char buf[160];
  int n = fj_variant_name(&v, buf, sizeof buf);
  return verdict(n > 0 && strchr(buf, '?'));
}
static fj_status enum_names_out_of_range(void)
{
  const char *names[] = {fj_dtype_name((fj_dtype)-1),
                         fj_mma_name((fj_mma)0),
                         fj_softmax_name((fj_softmax)99),
                         fj_swizzle_name((fj_swizzle)-3),
                         fj_causal_name((fj_causal)3),
                         fj_frag_name((fj_frag)0),
                         fj_frag_name((fj_frag)(FJ_FRAG_COUNT + 1)),
                         fj_frag_name((fj_frag)-1)};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!names[i] || strcmp(names[i], "?"))
      return NOT_AS_DOCUMENTED;
  return FJ_OK;
}

/* Kernels */
static fj_status kernel_get_ctx_null(void)
{
  fj_kernel *k;
  return fj_kernel_get(NULL, &fx.v, &k);
}
static fj_status kernel_get_v_null(void)
{
  fj_kernel *k;
  return fj_kernel_get(fx.ctx, NULL, &k);
}
static fj_status kernel_get_out_null(void)
{
  return fj_kernel_get(fx.ctx, &fx.v, NULL);
}
static fj_status kernel_source_null(void)
{
  size_t len = 123;
  return verdict(fj_kernel_source(NULL, &len) == NULL && len == 0 &&
                 fj_kernel_source(NULL, NULL) == NULL);
}
static fj_status kernel_ptx_null(void)
{
  size_t len = 123;
  return verdict(fj_kernel_ptx(NULL, &len) == NULL && len == 0 &&
                 fj_kernel_ptx(NULL, NULL) == NULL);
}
static fj_status kernel_cubin_null(void)
{
  size_t len = 123;
  return verdict(fj_kernel_cubin(NULL, &len) == NULL && len == 0 &&
                 fj_kernel_cubin(NULL, NULL) == NULL);
}
static fj_status kernel_getters_len_null(void)
{
  return verdict(fj_kernel_source(fx.kernel, NULL) &&
                 fj_kernel_ptx(fx.kernel, NULL) &&
                 fj_kernel_cubin(fx.kernel, NULL));
}
static fj_status kernel_log_null(void)
{
  const char *s = fj_kernel_log(NULL);
  return verdict(s && !*s);
}
static fj_status kernel_name_null(void)
{
  const char *s = fj_kernel_name(NULL);
  return verdict(s && !*s);
}
static fj_status kernel_resources_k_null(void)
{
  fj_resources r;
  memset(&r, 0x5a, sizeof r);
  fj_kernel_resources(NULL, &r);
  return FJ_OK;
}
static fj_status kernel_resources_res_null(void)
{
  fj_kernel_resources(fx.kernel, NULL);
  return FJ_OK;
}
static fj_status prepare_ctx_null(void)
{
  return fj_kernel_prepare(NULL, &fx.v, 1, NULL, NULL);
}
static fj_status prepare_variants_null(void)
{
  return fj_kernel_prepare(fx.ctx, NULL, 1, NULL, NULL);
}
static fj_status prepare_none(void)
{
  return fj_kernel_prepare(fx.ctx, NULL, 0, NULL, NULL);
}
static fj_status prepare_n_negative(void)
{
  /* A negative int that became a size_t. */
  int n = -1;
  return fj_kernel_prepare(fx.ctx, &fx.v, (size_t)n, NULL, NULL);
}
static fj_status prepare_workers_negative(void)
{
  fj_prepare_opts o = {-3, NULL, NULL};
  return fj_kernel_prepare(fx.ctx, &fx.v, 1, &o, NULL);
}

/* Problems and attention */
static fj_status problem_init_null(void)
{
  fj_problem_init(NULL, 1, 1, 1, 1, 1, 64, FJ_F16, FJ_BHSD);
  return FJ_OK;
}
static fj_status problem_check_ctx_null(void) { return fj_problem_check(NULL, &fx.p); }
static fj_status problem_check_p_null(void) { return fj_problem_check(fx.ctx, NULL); }
static fj_status attention_variant_ctx_null(void)
{
  fj_variant v;
  return fj_attention_variant(NULL, &fx.p, &v, NULL);
}
static fj_status attention_variant_p_null(void)
{
  fj_variant v;
  return fj_attention_variant(fx.ctx, NULL, &v, NULL);
}
static fj_status attention_variant_v_null(void)
{
  fj_choice from;
  return fj_attention_variant(fx.ctx, &fx.p, NULL, &from);
}
static fj_status attention_variant_from_null(void)
{
  fj_variant v;
  return fj_attention_variant(fx.ctx, &fx.p, &v, NULL);
}
static fj_status fwd(fj_ctx *ctx, const fj_problem *p, int null_arg)
{
  const void *t[4] = {devmem, devmem, devmem, devmem};
  if (null_arg >= 0)
    t[null_arg] = NULL;
  return fj_attention_fwd(ctx, p, t[0], t[1], t[2], (void *)(uintptr_t)t[3],
                          NULL, NULL);
}
static fj_status fwd_ctx_null(void) { return fwd(NULL, &fx.p, -1); }
static fj_status fwd_p_null(void) { return fwd(fx.ctx, NULL, -1); }
static fj_status fwd_q_null(void) { return fwd(fx.ctx, &fx.p, 0); }
static fj_status fwd_k_null(void) { return fwd(fx.ctx, &fx.p, 1); }
static fj_status fwd_v_null(void) { return fwd(fx.ctx, &fx.p, 2); }
static fj_status fwd_o_null(void) { return fwd(fx.ctx, &fx.p, 3); }
static fj_status fwd_lse_stream_null(void) { return fwd(fx.ctx, &fx.p, -1); }
static fj_status fwd_variant_v_null(void)
{
  return fj_attention_fwd_variant(fx.ctx, &fx.p, NULL, devmem, devmem, devmem,
                                  devmem, NULL, NULL);
}
static fj_status fwd_variant_vptr_null(void)
{
  return fj_attention_fwd_variant(fx.ctx, &fx.p, &fx.v, devmem, devmem, NULL,
                                  devmem, NULL, NULL);
}
static fj_status fwd_variant_ctx_null(void)
{
  return fj_attention_fwd_variant(NULL, &fx.p, &fx.v, devmem, devmem, devmem,
                                  devmem, NULL, NULL);
}
/* fj_attention_merge, one NULL at a time (0 ctx, 1 p, 2 o_parts, 3
 * lse_parts, 4 o; -1 none: a compile-only context refuses to launch). */
static fj_status merge(int null_arg)
{
  void *a[5] = {fx.ctx, &fx.p, devmem, devmem, devmem};
  if (null_arg >= 0)
    a[null_arg] = NULL;
  return fj_attention_merge(a[0], a[1], 2, a[2], a[3], a[4], NULL, NULL);
}
static fj_status merge_ctx_null(void) { return merge(0); }
static fj_status merge_p_null(void) { return merge(1); }
static fj_status merge_o_parts_null(void) { return merge(2); }
static fj_status merge_lse_parts_null(void) { return merge(3); }
static fj_status merge_o_null(void) { return merge(4); }
static fj_status merge_compile_only(void) { return merge(-1); }
static fj_status reference_merge_null(int which)
{
  static double parts[2 * 64], lse[2], out[64];
  fj_problem p;
  fj_problem_init(&p, 1, 1, 1, 1, 1, 64, FJ_F16, FJ_BHSD);
  const double *in[2] = {parts, lse};
  if (which < 2)
    in[which] = NULL;
  return fj_reference_merge(which == 3 ? NULL : &p, 2, in[0], in[1],
                            which == 2 ? NULL : out, NULL);
}
static fj_status reference_merge_o_parts_null(void) { return reference_merge_null(0); }
static fj_status reference_merge_lse_parts_null(void) { return reference_merge_null(1); }
static fj_status reference_merge_out_null(void) { return reference_merge_null(2); }
static fj_status reference_merge_p_null(void) { return reference_merge_null(3); }

/* The reference, one NULL at a time (bad problems: reference_bad_problems). */
static fj_status reference_null(int which)
{
  static uint16_t q[1 * 64], k[1 * 64], v[1 * 64];
  static double out[64], lse[1];
  fj_problem p;
  fj_problem_init(&p, 1, 1, 1, 1, 1, 64, FJ_F16, FJ_BHSD);
  const void *in[3] = {q, k, v};
  double *o = out;
  if (which < 3)
    in[which] = NULL;
  else if (which == 3)
    o = NULL;
  return fj_reference_fwd(which == 4 ? NULL : &p, in[0], in[1], in[2], NULL,
                          NULL, 0, 1, o, lse);
}
static fj_status reference_q_null(void) { return reference_null(0); }
static fj_status reference_k_null(void) { return reference_null(1); }
static fj_status reference_v_null(void) { return reference_null(2); }
static fj_status reference_out_null(void) { return reference_null(3); }
static fj_status reference_p_null(void) { return reference_null(4); }

static fj_status convert_dst_null(void)
{
  float f[4] = {0};
  return fj_convert(FJ_F16, NULL, FJ_F32, f, 4);
}
static fj_status convert_src_null(void)
{
  uint16_t h[4];
  return fj_convert(FJ_F16, h, FJ_F32, NULL, 4);
}
static fj_status convert_from_bad(void)
{
  uint16_t h[4] = {0}, g[4];
  return fj_convert(FJ_F16, g, (fj_dtype)99, h, 4);
}
static fj_status convert_to_bad(void)
{
  uint16_t h[4] = {0}, g[4];
  return fj_convert((fj_dtype)-1, g, FJ_F16, h, 4);
}
static fj_status convert_nothing(void)
{
  return fj_convert(FJ_F16, NULL, FJ_F32, NULL, 0);
}

/* Tuning */
static fj_status tune_opts_init_null(void)
{
  fj_tune_opts_init(NULL);
  return FJ_OK;
}
static fj_status tune_ctx_null(void) { return fj_tune(NULL, &fx.p, NULL, NULL, NULL); }
static fj_status tune_p_null(void) { return fj_tune(fx.ctx, NULL, NULL, NULL, NULL); }
static fj_status tune_compile_only(void)
{
  return fj_tune(fx.ctx, &fx.p, NULL, NULL, NULL);
}
static fj_status tune_with(int iters, int warmup, int workers)
{
  fj_tune_opts o;
  fj_tune_opts_init(&o);
  o.iters = iters;
  o.warmup = warmup;
  o.workers = workers;
  return fj_tune(fx.ctx, &fx.p, &o, NULL, NULL);
}
static fj_status tune_iters_negative(void) { return tune_with(-1, 2, 0); }
static fj_status tune_iters_huge(void) { return tune_with(100000, 2, 0); }
static fj_status tune_warmup_negative(void) { return tune_with(10, -2, 0); }
static fj_status tune_workers_negative(void) { return tune_with(10, 2, -4); }
static fj_status tune_bwd_ctx_null(void)
{
  return fj_tune_bwd(NULL, &fx.p, NULL, NULL, NULL);
}
static fj_status tune_bwd_p_null(void)
{
  return fj_tune_bwd(fx.ctx, NULL, NULL, NULL, NULL);
}
static fj_status tune_bwd_compile_only(void)
{
  return fj_tune_bwd(fx.ctx, &fx.p, NULL, NULL, NULL);
}
static fj_status tune_list_ctx_null(void)
{
  return fj_tune_list(NULL, tune_visit_none, NULL);
}
static fj_status tune_list_fn_null(void) { return fj_tune_list(fx.ctx, NULL, NULL); }

/* The layout tables */
static fj_status layout_ctx_null(void)
{
  fj_lut lut;
  return fj_layout_get(NULL, FJ_FRAG_WMMA_ACC_F32, &lut);
}
static fj_status layout_lut_null(void)
{
  return fj_layout_get(fx.ctx, FJ_FRAG_WMMA_ACC_F32, NULL);
}
static fj_status layout_frag(int frag)
{
  fj_lut lut;
  return fj_layout_get(fx.ctx, (fj_frag)frag, &lut);
}
static fj_status layout_frag_0(void) { return layout_frag(0); }
static fj_status layout_frag_99(void) { return layout_frag(99); }
static fj_status layout_frag_negative(void) { return layout_frag(-1); }

/* The cache */
static fj_status cache_dir_null(void) { return verdict(fj_cache_dir(NULL) == NULL); }
static fj_status cache_stats_ctx_null(void)
{
  fj_cache_stats s;
  fj_cache_stats_get(NULL, &s);
  return FJ_OK;
}
static fj_status cache_stats_out_null(void)
{
  fj_cache_stats_get(fx.ctx, NULL);
  return FJ_OK;
}
static fj_status cache_list_ctx_null(void)
{
  return fj_cache_list(NULL, visit_none, NULL);
}
static fj_status cache_list_fn_null(void) { return fj_cache_list(fx.ctx, NULL, NULL); }
static fj_status cache_list_memory(void)
{
  return fj_cache_list(fx.ctx, visit_none, NULL);
}
static fj_status cache_clear_ctx_null(void) { return fj_cache_clear(NULL, NULL); }
static fj_status cache_clear_memory(void) { return fj_cache_clear(fx.ctx, NULL); }

typedef struct api_case {
  const char *name;
  fj_status (*call)(void);
  fj_status want;
  msg_on on;
  const char *msg;  /* a fragment of the message, or NULL */
} api_case;

#define OK_(fn) {#fn, fn, FJ_OK, MSG_NONE, NULL}
#define BAD_(fn, on, msg) {#fn, fn, FJ_ERR_INVALID_ARG, on, msg}

static const api_case api_cases[] = {
    OK_(ctx_opts_init_null),
    BAD_(ctx_create_out_null, MSG_NULL, "fj_ctx_create: ctx is NULL"),
    BAD_(ctx_create_device_m2, MSG_NULL, "device -2 is invalid"),
    BAD_(ctx_create_no_arch, MSG_NULL, "needs an arch"),
    BAD_(ctx_create_empty_arch, MSG_NULL, "invalid arch ''"),
    BAD_(ctx_create_dir_too_long, MSG_NULL, "bytes long: at most 4095"),
    OK_(ctx_destroy_null),
    OK_(errmsg_null),
    OK_(ctx_arch_null),
    OK_(ctx_has_device_null),
    BAD_(device_get_ctx_null, MSG_NULL, "fj_device_get: ctx is NULL"),
    BAD_(device_get_info_null, MSG_CTX, "fj_device_get: info is NULL"),
    OK_(status_str_bad),
    OK_(variant_default_null),
    BAD_(variant_default_garbage, MSG_CTX, "head_dim -5 is invalid"),
    BAD_(variant_check_ctx_null, MSG_NULL, "fj_variant_check: ctx is NULL"),
    BAD_(variant_check_v_null, MSG_CTX, "fj_variant_check: v is NULL"),
    OK_(variant_name_v_null),
    OK_(variant_name_measure),
    OK_(variant_name_buf_null_size),
    OK_(variant_name_truncated),
    OK_(variant_name_bad_enums),
    OK_(enum_names_out_of_range),
    BAD_(kernel_get_ctx_null, MSG_NULL, "fj_kernel_get: ctx is NULL"),
    BAD_(kernel_get_v_null, MSG_CTX, "fj_kernel_get: v is NULL"),
    BAD_(kernel_get_out_null, MSG_CTX, "fj_kernel_get: kernel is NULL"),
    OK_(kernel_source_null),
    OK_(kernel_ptx_null),
    OK_(kernel_cubin_null),
    OK_(kernel_getters_len_null),
    OK_(kernel_log_null),
    OK_(kernel_name_null),
    OK_(kernel_resources_k_null),
    OK_(kernel_resources_res_null),
    BAD_(prepare_ctx_null, MSG_NULL, "fj_kernel_prepare: ctx is NULL"),
    BAD_(prepare_variants_null, MSG_CTX, "fj_kernel_prepare: variants is NULL"),
    OK_(prepare_none),
    BAD_(prepare_n_negative, MSG_CTX, "n = 18446744073709551615"),
    BAD_(prepare_workers_negative, MSG_CTX, "workers -3 is invalid"),
    OK_(problem_init_null),
    BAD_(problem_check_ctx_null, MSG_NULL, "fj_problem_check: ctx is NULL"),
    BAD_(problem_check_p_null, MSG_CTX, "fj_problem_check: p is NULL"),
    BAD_(attention_variant_ctx_null, MSG_NULL, "fj_attention_variant: ctx is NULL"),
    BAD_(attention_variant_p_null, MSG_CTX, "fj_attention_variant: p is NULL"),
    BAD_(attention_variant_v_null, MSG_CTX, "fj_attention_variant: v is NULL"),
    OK_(attention_variant_from_null),
    BAD_(fwd_ctx_null, MSG_NULL, "fj_attention_fwd: ctx is NULL"),
    BAD_(fwd_p_null, MSG_CTX, "fj_attention_fwd: p is NULL"),
    BAD_(fwd_q_null, MSG_CTX, "q is NULL"),
    BAD_(fwd_k_null, MSG_CTX, "k is NULL"),
    BAD_(fwd_v_null, MSG_CTX, "v is NULL"),
    BAD_(fwd_o_null, MSG_CTX, "o is NULL"),
    {"fwd_lse_stream_null", fwd_lse_stream_null, FJ_ERR_COMPILE_ONLY, MSG_CTX,
     "compile-only"},
    BAD_(fwd_variant_ctx_null, MSG_NULL, "fj_attention_fwd_variant: ctx is NULL"),
    BAD_(fwd_variant_v_null, MSG_CTX, "v (the variant) is NULL"),
    BAD_(fwd_variant_vptr_null, MSG_CTX, "v is NULL"),
    BAD_(reference_p_null, MSG_NULL, "fj_reference_fwd: p is NULL"),
    BAD_(reference_q_null, MSG_NULL, "fj_reference_fwd: q is NULL"),
    BAD_(reference_k_null, MSG_NULL, "fj_reference_fwd: k is NULL"),
    BAD_(reference_v_null, MSG_NULL, "fj_reference_fwd: v is NULL"),
    BAD_(reference_out_null, MSG_NULL, "fj_reference_fwd: out is NULL"),
    BAD_(merge_ctx_null, MSG_NULL, "fj_attention_merge: ctx is NULL"),
    BAD_(merge_p_null, MSG_CTX, "fj_attention_merge: p is NULL"),
    BAD_(merge_o_parts_null, MSG_CTX, "fj_attention_merge: o_parts is NULL"),
    BAD_(merge_lse_parts_null, MSG_CTX, "fj_attention_merge: lse_parts is NULL"),
    BAD_(merge_o_null, MSG_CTX, "fj_attention_merge: o is NULL"),
    {"merge_compile_only", merge_compile_only, FJ_ERR_COMPILE_ONLY, MSG_CTX,
     "compile-only"},
    BAD_(reference_merge_p_null, MSG_NULL, "fj_reference_merge: p is NULL"),
    BAD_(reference_merge_o_parts_null, MSG_NULL, "fj_reference_merge: o_parts is NULL"),
    BAD_(reference_merge_lse_parts_null, MSG_NULL,
         "fj_reference_merge: lse_parts is NULL"),
    BAD_(reference_merge_out_null, MSG_NULL, "fj_reference_merge: out is NULL"),
    BAD_(convert_dst_null, MSG_NULL, "fj_convert: dst is NULL"),
    BAD_(convert_src_null, MSG_NULL, "fj_convert: src is NULL"),
    BAD_(convert_from_bad, MSG_NULL, "from 99 is invalid"),
    BAD_(convert_to_bad, MSG_NULL, "to -1 is invalid"),
    OK_(convert_nothing),
    OK_(tune_opts_init_null),
    BAD_(tune_ctx_null, MSG_NULL, "fj_tune: ctx is NULL"),
    BAD_(tune_p_null, MSG_CTX, "fj_tune: p is NULL"),
    {"tune_compile_only", tune_compile_only, FJ_ERR_COMPILE_ONLY, MSG_CTX,
     "compile-only"},
    BAD_(tune_iters_negative, MSG_CTX, "iters -1 is invalid"),
    BAD_(tune_iters_huge, MSG_CTX, "iters 100000 is invalid"),
    BAD_(tune_warmup_negative, MSG_CTX, "warmup -2 is invalid"),
    BAD_(tune_workers_negative, MSG_CTX, "workers -4 is invalid"),
    BAD_(tune_bwd_ctx_null, MSG_NULL, "fj_tune_bwd: ctx is NULL"),
    BAD_(tune_bwd_p_null, MSG_CTX, "fj_tune_bwd: p is NULL"),
    {"tune_bwd_compile_only", tune_bwd_compile_only, FJ_ERR_COMPILE_ONLY,
     MSG_CTX, "compile-only"},
    BAD_(tune_list_ctx_null, MSG_NULL, "fj_tune_list: ctx is NULL"),
    BAD_(tune_list_fn_null, MSG_CTX, "fj_tune_list: fn is NULL"),
    BAD_(layout_ctx_null, MSG_NULL, "fj_layout_get: ctx is NULL"),
    BAD_(layout_lut_null, MSG_CTX, "fj_layout_get: lut is NULL"),
    BAD_(layout_frag_0, MSG_CTX, "fragment kind 0 is invalid"),
    BAD_(layout_frag_99, MSG_CTX, "fragment kind 99 is invalid"),
    BAD_(layout_frag_negative, MSG_CTX, "fragment kind -1 is invalid"),
    OK_(cache_dir_null),
    OK_(cache_stats_ctx_null),
    OK_(cache_stats_out_null),
    BAD_(cache_list_ctx_null, MSG_NULL, "fj_cache_list: ctx is NULL"),
    BAD_(cache_list_fn_null, MSG_CTX, "fj_cache_list: fn is NULL"),
    {"cache_list_memory", cache_list_memory, FJ_ERR_NOT_FOUND, MSG_CTX,
     "disk cache is disabled"},
    BAD_(cache_clear_ctx_null, MSG_NULL, "fj_cache_clear: ctx is NULL"),
    {"cache_clear_memory", cache_clear_memory, FJ_ERR_NOT_FOUND, MSG_CTX,
     "disk cache is disabled"},
};

static int api_run(const void *arg)
{
  const api_case *c = arg;
  fj_status got = c->call();
  const char *msg = c->on == MSG_CTX    ? fj_errmsg(fx.ctx)
                    : c->on == MSG_NULL ? fj_errmsg(NULL)
                                        : "";
  return expect(c->name, got, c->want, msg, c->msg);
}

int test_api_null_corpus(void)
{
  size_t n = (size_t)snprintf(long_dir, sizeof long_dir, "%s", fjt_tmpdir());
  while (n + 3 < 6000) {
    memcpy(long_dir + n, "/d", 3);
    n += 2;
  }
  fx.ctx = fjt_ctx("sm_90a", NULL);
  CHECK(fx.ctx);
  fj_variant_default(&fx.v, 64, FJ_F16, FJ_CAUSAL_NONE);
  CHECK_OK(fx.ctx, fj_kernel_get(fx.ctx, &fx.v, &fx.kernel));
  fj_problem_init(&fx.p, 1, 2, 2, 64, 64, 64, FJ_F16, FJ_BHSD);
  CHECK_OK(fx.ctx, fj_problem_check(fx.ctx, &fx.p));
  tally t = {0};
  for (size_t i = 0; i < sizeof api_cases / sizeof api_cases[0]; i++)
    count(&t, api_cases[i].name, bounded(api_run, &api_cases[i], 30), 30);
  fj_ctx_destroy(fx.ctx);
  return report(&t);
}

/* ---- reference_bad_problems -------------------------------------------------------- */

enum { RB = 1, RHQ = 2, RHKV = 1, RS = 8, RD = 32 };

/* Everything fj_reference_fwd takes, valid until a case edits it. */
typedef struct ref_args {
  fj_problem p;
  const void *q, *k, *v;
  const float *ks, *vs;
  int r0, r1;
  double *out, *lse;
  int null_problem;
} ref_args;

static uint16_t ref_q[RB * RHQ * RS * RD], ref_kv[RB * RHKV * RS * RD];
static double ref_out[RB * RHQ * RS * RD], ref_lse[RB * RHQ * RS];
static const float ref_scales[RB * RHKV] = {1.0f};

static void ref_valid(ref_args *a)
{
  memset(a, 0, sizeof *a);
  fj_problem_init(&a->p, RB, RHQ, RHKV, RS, RS, RD, FJ_F16, FJ_BHSD);
  a->q = ref_q;
  a->k = a->v = ref_kv;
  a->r0 = 0;
  a->r1 = RS;
  a->out = ref_out;
  a->lse = ref_lse;
}

typedef struct ref_case {
  const char *name;
  void (*edit)(ref_args *a);
  const char *msg;  /* NULL: the case is valid */
} ref_case;

static void r_valid(ref_args *a) { (void)a; }
static void r_valid_e4m3(ref_args *a)
{
  a->p.kv_dtype = FJ_E4M3;
  a->ks = a->vs = ref_scales;
}
static void r_head_dim_neg(ref_args *a) { a->p.head_dim = -1; }
static void r_head_dim_0(ref_args *a) { a->p.head_dim = 0; }
static void r_head_dim_huge(ref_args *a) { a->p.head_dim = 100000; }
static void r_batch_0(ref_args *a) { a->p.batch = 0; }
static void r_batch_neg(ref_args *a) { a->p.batch = -3; }
static void r_heads_q_0(ref_args *a) { a->p.heads_q = 0; }
static void r_heads_kv_0(ref_args *a) { a->p.heads_kv = 0; }
static void r_heads_kv_above(ref_args *a) { a->p.heads_kv = 3; }
static void r_heads_kv_divide(ref_args *a)
{
  a->p.heads_q = 3;
  a->p.heads_kv = 2;
}
static void r_seq_q_0(ref_args *a) { a->p.seq_q = 0; a->r1 = 0; }
static void r_seq_q_neg(ref_args *a) { a->p.seq_q = -1; a->r1 = 0; }
static void r_seq_kv_0(ref_args *a) { a->p.seq_kv = 0; }
static void r_seq_kv_neg(ref_args *a) { a->p.seq_kv = -7; }
static void r_q_stride_neg(ref_args *a) { a->p.q_stride[2] = -32; }
static void r_k_stride_neg(ref_args *a) { a->p.k_stride[0] = -1; }
static void r_v_stride_min(ref_args *a) { a->p.v_stride[1] = INT64_MIN; }
static void r_q_stride_overflow(ref_args *a)
{
  a->p.batch = 3;
  a->p.q_stride[0] = INT64_MAX / 2;
}
static void r_k_stride_overflow(ref_args *a) { a->p.k_stride[2] = INT64_MAX; }
static void r_o_overlap(ref_args *a) { a->p.o_stride[2] = 0; }
static void r_row_begin_neg(ref_args *a) { a->r0 = -1; }
static void r_row_end_above(ref_args *a) { a->r1 = RS + 1; }
static void r_rows_reversed(ref_args *a)
{
  a->r0 = 5;
  a->r1 = 4;
}
static void r_q_null(ref_args *a) { a->q = NULL; }
static void r_k_null(ref_args *a) { a->k = NULL; }
static void r_v_null(ref_args *a) { a->v = NULL; }
static void r_out_null(ref_args *a) { a->out = NULL; }
static void r_p_null(ref_args *a) { a->null_problem = 1; }
static void r_e4m3_no_scales(ref_args *a) { a->p.kv_dtype = FJ_E4M3; }
static void r_e4m3_no_v_scale(ref_args *a)
{
  a->p.kv_dtype = FJ_E4M3;
  a->ks = ref_scales;
}
static void r_dtype_99(ref_args *a) { a->p.dtype = (fj_dtype)99; }
static void r_dtype_f32(ref_args *a) { a->p.dtype = FJ_F32; }
static void r_kv_dtype_other(ref_args *a) { a->p.kv_dtype = FJ_BF16; }
static void r_causal_7(ref_args *a) { a->p.causal = (fj_causal)7; }
static void r_scale_nan(ref_args *a) { a->p.scale = NAN; }
static void r_scale_inf(ref_args *a) { a->p.scale = INFINITY; }

static const ref_case ref_cases[] = {
    {"valid", r_valid, NULL},
    {"valid_e4m3", r_valid_e4m3, NULL},
    {"head_dim_negative", r_head_dim_neg, "head_dim -1 is invalid"},
    {"head_dim_0", r_head_dim_0, "head_dim 0 is invalid"},
    {"head_dim_huge", r_head_dim_huge, "head_dim 100000 is invalid"},
    {"batch_0", r_batch_0, "batch 0 is invalid"},
    {"batch_negative", r_batch_neg, "batch -3 is invalid"},
    {"heads_q_0", r_heads_q_0, "heads_q 0 is invalid"},
    {"heads_kv_0", r_heads_kv_0, "heads_kv 0 is invalid"},
    {"heads_kv_above_heads_q", r_heads_kv_above, "heads_kv 3 is invalid"},
    {"heads_kv_not_dividing", r_heads_kv_divide,
     "heads_kv 2 does not divide heads_q 3"},
    {"seq_q_0", r_seq_q_0, "seq_q 0 is invalid"},
    {"seq_q_negative", r_seq_q_neg, "seq_q -1 is invalid"},
    {"seq_kv_0", r_seq_kv_0, "seq_kv 0 is invalid"},
    {"seq_kv_negative", r_seq_kv_neg, "seq_kv -7 is invalid"},
    {"q_stride_negative", r_q_stride_neg, "q_stride[2] (seq) = -32 is negative"},
    {"k_stride_negative", r_k_stride_neg, "k_stride[0] (batch) = -1 is negative"},
    {"v_stride_int64_min", r_v_stride_min,
     "v_stride[1] (head) = -9223372036854775808 is negative"},
    {"q_stride_overflow", r_q_stride_overflow, "q_stride[0] (batch) = 4611686018427387903"},
    {"k_stride_overflow", r_k_stride_overflow, "k_stride[2] (seq) = 9223372036854775807"},
    {"o_rows_overlap", r_o_overlap, "o_stride[2] (seq) = 0"},
    {"row_begin_negative", r_row_begin_neg, "row_begin -1 is invalid"},
    {"row_end_above_seq_q", r_row_end_above, "row_end 9 is invalid"},
    {"rows_reversed", r_rows_reversed, "row_end 4 is invalid"},
    {"q_null", r_q_null, "q is NULL"},
    {"k_null", r_k_null, "k is NULL"},
    {"v_null", r_v_null, "v is NULL"},
    {"out_null", r_out_null, "out is NULL"},
    {"problem_null", r_p_null, "p is NULL"},
    {"e4m3_without_scales", r_e4m3_no_scales, "k_scale is NULL"},
    {"e4m3_without_v_scale", r_e4m3_no_v_scale, "v_scale is NULL"},
    {"dtype_99", r_dtype_99, "dtype 99 is invalid"},
    {"dtype_f32", r_dtype_f32, "dtype f32 is invalid"},
    {"kv_dtype_bf16_with_f16", r_kv_dtype_other, "kv_dtype bf16 is invalid"},
    {"causal_7", r_causal_7, "causal 7 is invalid"},
    {"scale_nan", r_scale_nan, "scale nan is not finite"},
    {"scale_inf", r_scale_inf, "scale inf is not finite"},
};

static int ref_run(const void *arg)
{
  const ref_case *c = arg;
  ref_args a;
  ref_valid(&a);
  c->edit(&a);
  fj_status st = fj_reference_fwd(a.null_problem ? NULL : &a.p, a.q, a.k, a.v,
                                  a.ks, a.vs, a.r0, a.r1, a.out, a.lse);
  return expect(c->name, st, c->msg ? FJ_ERR_INVALID_ARG : FJ_OK,
                fj_errmsg(NULL), c->msg);
}

int test_reference_bad_problems(void)
{
  tally t = {0};
  for (size_t i = 0; i < sizeof ref_cases / sizeof ref_cases[0]; i++)
    count(&t, ref_cases[i].name, bounded(ref_run, &ref_cases[i], 30), 30);
  return report(&t);
}

/* ---- problem_check_corpus ---------------------------------------------------------- */

typedef struct pc_case {
  const char *name;
  void (*make)(fj_problem *p);
  const char *msg;  /* NULL: the problem is valid */
} pc_case;

enum { PB = 2, PH = 8, PHKV = 2, PSQ = 128, PSK = 256, PD = 64 };

static void pc_bhsd(fj_problem *p)
{
  fj_problem_init(p, PB, PH, PHKV, PSQ, PSK, PD, FJ_F16, FJ_BHSD);
}
static void pc_bshd(fj_problem *p)
{
  fj_problem_init(p, PB, PH, PHKV, PSQ, PSK, PD, FJ_BF16, FJ_BSHD);
}
/* One [batch][seq][3][heads][head_dim] tensor holds Q, K and V. */
static void pc_packed_qkv(fj_problem *p)
{
  fj_problem_init(p, PB, PH, PH, PSQ, PSQ, PD, FJ_F16, FJ_BSHD);
  int64_t s[3] = {(int64_t)PSQ * 3 * PH * PD, PD, 3 * PH * PD};
  memcpy(p->q_stride, s, sizeof s);
  memcpy(p->k_stride, s, sizeof s);
  memcpy(p->v_stride, s, sizeof s);
}
static void pc_kv_batch_broadcast(fj_problem *p)
{
  pc_bhsd(p);
  p->k_stride[0] = p->v_stride[0] = 0;
}
static void pc_kv_head_broadcast(fj_problem *p)
{
  pc_bshd(p);
  p->k_stride[1] = p->v_stride[1] = 0;
}
static void pc_o_padded_rows(fj_problem *p)
{
  pc_bhsd(p);
  p->o_stride[2] = 2 * PD;
  p->o_stride[1] = (int64_t)PSQ * 2 * PD;
  p->o_stride[0] = (int64_t)PH * PSQ * 2 * PD;
}
static void pc_one_row_zero_strides(fj_problem *p)
{
  fj_problem_init(p, 1, 1, 1, 1, 1, PD, FJ_F16, FJ_BHSD);
  memset(p->q_stride, 0, sizeof p->q_stride);
  memset(p->k_stride, 0, sizeof p->k_stride);
  memset(p->v_stride, 0, sizeof p->v_stride);
  memset(p->o_stride, 0, sizeof p->o_stride);
}
static void pc_far_apart_batches(fj_problem *p)
{
  pc_bhsd(p);
  p->o_stride[0] = (int64_t)1 << 40;
}
static void pc_unknown_order(fj_problem *p)
{
  fj_problem_init(p, PB, PH, PHKV, PSQ, PSK, PD, FJ_F16, (fj_order)7);
}
static void pc_unknown_order_negative(fj_problem *p)
{
  fj_problem_init(p, 1, 1, 1, 16, 16, PD, FJ_F16, (fj_order)-1);
}
static void pc_o_seq_zero(fj_problem *p)
{
  pc_bhsd(p);
  p->o_stride[2] = 0;
}
static void pc_o_seq_short(fj_problem *p)
{
  pc_bhsd(p);
  p->o_stride[2] = PD / 2;
}
static void pc_o_head_short(fj_problem *p)
{
  pc_bhsd(p);
  p->o_stride[1] = 100 * PD;
}
static void pc_o_batch_short(fj_problem *p)
{
  pc_bhsd(p);
  p->o_stride[0] = (int64_t)4 * PSQ * PD;  /* half of the 8 heads' span */
}
static void pc_o_batch_zero(fj_problem *p)
{
  pc_bshd(p);
  p->o_stride[0] = 0;
}
static void pc_o_bshd_seq_short(fj_problem *p)
{
  pc_bshd(p);
  p->o_stride[2] = PD;
}
static void pc_o_same_strides(fj_problem *p)
{
  pc_bhsd(p);
  p->o_stride[1] = p->o_stride[2];
}
static void pc_q_overflow(fj_problem *p)
{
  pc_bhsd(p);
  p->q_stride[0] = INT64_MAX / 2;
}
static void pc_k_overflow(fj_problem *p)
{
  pc_bhsd(p);
  p->k_stride[2] = INT64_MAX;
}
static void pc_o_overflow(fj_problem *p)
{
  pc_bhsd(p);
  p->o_stride[0] = INT64_MAX - 5;
}
static void pc_largest_sizes(fj_problem *p)
{
  fj_problem_init(p, 65535, 65535, 65535, 1 << 30, 1 << 30, 256, FJ_F16,
                  FJ_BHSD);
}
static void pc_v_negative(fj_problem *p)
{
  pc_bhsd(p);
  p->v_stride[1] = -64;
}
static void pc_batch_above(fj_problem *p)
{
  fj_problem_init(p, 70000, 1, 1, 16, 16, PD, FJ_F16, FJ_BHSD);
}
static void pc_head_dim_negative(fj_problem *p)
{
  fj_problem_init(p, 1, 1, 1, 16, 16, -64, FJ_F16, FJ_BHSD);
}
static void pc_dtype_0(fj_problem *p)
{
  pc_bhsd(p);
  p->dtype = (fj_dtype)0;
}
static void pc_e4m3_no_scales(fj_problem *p)
{
  pc_bhsd(p);
  p->kv_dtype = FJ_E4M3;
}
static void pc_scale_inf(fj_problem *p)
{
  pc_bhsd(p);
  p->scale = -INFINITY;
}

static const pc_case pc_cases[] = {
    {"bhsd", pc_bhsd, NULL},
    {"bshd", pc_bshd, NULL},
    {"packed_qkv", pc_packed_qkv, NULL},
    {"kv_batch_broadcast", pc_kv_batch_broadcast, NULL},
    {"kv_head_broadcast", pc_kv_head_broadcast, NULL},
    {"o_padded_rows", pc_o_padded_rows, NULL},
    {"one_row_zero_strides", pc_one_row_zero_strides, NULL},
    {"far_apart_batches", pc_far_apart_batches, NULL},
    {"unknown_order", pc_unknown_order, "neither FJ_BHSD nor FJ_BSHD"},
    {"unknown_order_negative", pc_unknown_order_negative,
     "neither FJ_BHSD nor FJ_BSHD"},
    {"o_seq_stride_zero", pc_o_seq_zero, "o_stride[2] (seq) = 0"},
    {"o_seq_stride_short", pc_o_seq_short, "o_stride[2] (seq) = 32"},
    {"o_head_stride_short", pc_o_head_short, "o_stride[1] (head) = 6400"},
    {"o_batch_stride_short", pc_o_batch_short, "o_stride[0] (batch) = 32768"},
    {"o_batch_stride_zero", pc_o_batch_zero, "o_stride[0] (batch) = 0"},
    {"o_bshd_seq_stride_short", pc_o_bshd_seq_short, "o_stride[2] (seq) = 64"},
    {"o_equal_strides", pc_o_same_strides, "rows of O would overlap"},
    {"q_extent_overflow", pc_q_overflow, "q_stride[0] (batch) = 4611686018427387903"},
    {"k_extent_overflow", pc_k_overflow, "k_stride[2] (seq) = 9223372036854775807"},
    {"o_extent_overflow", pc_o_overflow, "o_stride[0] (batch) = 9223372036854775802"},
    {"largest_sizes_overflow", pc_largest_sizes, "overflow"},
    {"v_stride_negative", pc_v_negative, "v_stride[1] (head) = -64 is negative"},
    {"batch_above_limit", pc_batch_above, "batch 70000 is invalid: must be in 1..65535"},
    {"head_dim_negative", pc_head_dim_negative, "head_dim -64 is invalid"},
    {"dtype_0", pc_dtype_0, "dtype 0 is invalid"},
    {"e4m3_without_scales", pc_e4m3_no_scales, "needs k_scale and v_scale"},
    {"scale_minus_inf", pc_scale_inf, "scale -inf is not finite"},
};

static fj_ctx *pc_ctx;

static int pc_run(const void *arg)
{
  const pc_case *c = arg;
  fj_problem p;
  c->make(&p);
  fj_status st = fj_problem_check(pc_ctx, &p);
  return expect(c->name, st, c->msg ? FJ_ERR_INVALID_ARG : FJ_OK,
                fj_errmsg(pc_ctx), c->msg);
}

int test_problem_check_corpus(void)
{
  pc_ctx = fjt_ctx("sm_90a", NULL);
  CHECK(pc_ctx);
  tally t = {0};
  for (size_t i = 0; i < sizeof pc_cases / sizeof pc_cases[0]; i++)
    count(&t, pc_cases[i].name, bounded(pc_run, &pc_cases[i], 30), 30);
  fj_ctx_destroy(pc_ctx);
  return report(&t);
}

/* ---- cache_hostile_files ----------------------------------------------------------- */

/* The header of a cache entry, as src/cache.c writes it. */
typedef struct entry_header {
  char magic[8];
  uint32_t format;
  uint32_t kind_len;
  uint32_t label_len;
  uint32_t key_len;
  uint64_t payload_len;
  uint64_t checksum;
} entry_header;

enum { LIST_SECONDS = 5, GET_SECONDS = 30 };

/* The two files a kernel leaves (its cubin and its render index entry):
 * where valid copies lie, and the names the next lookup opens. */
static struct hostile {
  char valid_dir[4200];
  char names[2][128];
  fj_variant v;
  const char *dir;  /* the directory of the case being run */
} hf;

static int name_visit(void *user, const fj_cache_entry *e)
{
  (void)user;
  int i = !strcmp(e->kind, "kernel") ? 0 : !strcmp(e->kind, "render") ? 1 : -1;
  if (e->valid && i >= 0)
    snprintf(hf.names[i], sizeof hf.names[i], "%s", e->file);
  return 0;
}

static char *read_whole(const char *path, size_t *len)
{
  FILE *f = fopen(path, "rb");
  char *data = NULL;
  long n = -1;
  if (f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0 &&
      fseek(f, 0, SEEK_SET) == 0 && (data = malloc((size_t)n)) != NULL &&
      fread(data, 1, (size_t)n, f) != (size_t)n) {
    free(data);
    data = NULL;
  }
  if (f)
    fclose(f);
  *len = n > 0 ? (size_t)n : 0;
  return data;
}

/* A copy of the valid entry `i` at path, its header edited by fn. */
static int plant_copy(const char *path, int i, void (*edit)(entry_header *h))
{
  char src[4400];
  snprintf(src, sizeof src, "%s/%s", hf.valid_dir, hf.names[i]);
  size_t len;
  char *data = read_whole(src, &len);
  if (!data || len < sizeof(entry_header))
    return -1;
  entry_header h;
  memcpy(&h, data, sizeof h);
  if (edit)
    edit(&h);
  memcpy(data, &h, sizeof h);
  int rc = fjt_write_file(path, data, len);
  free(data);
  return rc;
}

static int plant_fifo(const char *path, int i)
{
  (void)i;
  return mkfifo(path, 0644);
}
static int plant_dev_zero(const char *path, int i)
{
  (void)i;
  return symlink("/dev/zero", path);
}
static int plant_link_to_valid(const char *path, int i)
{
  char target[4400];
  snprintf(target, sizeof target, "%s/%s", hf.valid_dir, hf.names[i]);
  return symlink(target, path);
}
static int plant_directory(const char *path, int i)
{
  (void)i;
  return mkdir(path, 0755);
}
/* A valid entry followed by a 2 GB hole: no disk is used. */
static int plant_sparse_2g(const char *path, int i)
{
  if (plant_copy(path, i, NULL))
    return -1;
  int fd = open(path, O_WRONLY);
  int rc = fd < 0 || ftruncate(fd, (off_t)2 << 30);
  if (fd >= 0)
    close(fd);
  return rc;
}
static void claim_more(entry_header *h) { h->payload_len += (uint64_t)1 << 30; }
static int plant_overclaim(const char *path, int i)
{
  return plant_copy(path, i, claim_more);
}
/* Lengths that sum to the file's size only modulo 2^64: the label claims
 * more bytes than the file has, the payload "negative" bytes. */
static void claim_wrapped(entry_header *h)
{
  uint64_t x = h->payload_len + 1000;
  h->label_len += (uint32_t)x;
  h->payload_len -= x;
}
static int plant_wrapped(const char *path, int i)
{
  return plant_copy(path, i, claim_wrapped);
}

typedef struct hostile_case {
  const char *name;
  int (*plant)(const char *path, int i);
  int replaced;        /* the library's write replaces the planted file */
  const char *reason;  /* in the warning that rejects it */
} hostile_case;

static const hostile_case hostile_cases[] = {
    {"fifo", plant_fifo, 1, "is not a regular file"},
    {"symlink_to_dev_zero", plant_dev_zero, 1, "is a symbolic link"},
    {"symlink_to_valid_entry", plant_link_to_valid, 1, "is a symbolic link"},
    {"sparse_2_gb", plant_sparse_2g, 1, "bytes, over the limit of 268435456"},
    {"header_claims_more", plant_overclaim, 1, "is corrupt or stale"},
    {"header_lengths_wrap", plant_wrapped, 1, "is corrupt or stale"},
    {"directory", plant_directory, 0, "is not a regular file"},
};

static char first_warning[1024];

static void keep_warning(void *user, fj_log_level level, const char *msg)
{
  (void)user;
  if (level == FJ_LOG_WARN && !first_warning[0])
    snprintf(first_warning, sizeof first_warning, "%s", msg);
}

static fj_ctx *hostile_ctx(void)
{
  fj_ctx_opts o;
  fj_ctx_opts_init(&o);
  o.device = -1;
  o.arch = "sm_90";
  o.cache_dir = hf.dir;
  o.log = keep_warning;
  fj_ctx *ctx = NULL;
  if (fj_ctx_create(&ctx, &o) != FJ_OK)
    fprintf(stderr, "  context: %s\n", fj_errmsg(NULL));
  return ctx;
}

typedef struct listed {
  int entries, valid;
} listed;

static int count_visit(void *user, const fj_cache_entry *e)
{
  listed *l = user;
  l->entries++;
  l->valid += e->valid;
  return 0;
}

/* Listing returns, and shows both planted files as invalid. */
static int hostile_list(const void *arg)
{
  (void)arg;
  fj_ctx *ctx = hostile_ctx();
  listed l = {0, 0};
  fj_status st = ctx ? fj_cache_list(ctx, count_visit, &l) : FJ_ERR_IO;
  if (st != FJ_OK || l.entries != 2 || l.valid != 0) {
    fprintf(stderr, "  list: status %d, %d entries, %d valid (want 2, 0): %s\n",
            (int)st, l.entries, l.valid, fj_errmsg(ctx));
    return 1;
  }
  fj_ctx_destroy(ctx);
  return 0;
}

/* The kernel comes back compiled: both planted files are misses, counted
 * as rejects, and rewritten where the library can replace them. */
static int hostile_get(const void *arg)
{
  const hostile_case *c = arg;
  fj_ctx *ctx = hostile_ctx();
  fj_kernel *k;
  fj_status st = ctx ? fj_kernel_get(ctx, &hf.v, &k) : FJ_ERR_IO;
  if (st != FJ_OK) {
    fprintf(stderr, "  get: %s: %s\n", fj_status_str(st), fj_errmsg(ctx));
    return 1;
  }
  fj_resources r;
  fj_kernel_resources(k, &r);
  fj_cache_stats s;
  fj_cache_stats_get(ctx, &s);
  listed l = {0, 0};
  fj_cache_list(ctx, count_visit, &l);
  int want_valid = c->replaced ? 2 : 0;
  if (r.cache != FJ_CACHE_MISS || s.disk_rejects != 2 || s.disk_hits != 0 ||
      l.valid != want_valid) {
    fprintf(stderr,
            "  get: origin %d (want %d), disk_rejects %llu (want 2), "
            "disk_hits %llu (want 0), %d valid entries after (want %d)\n",
            (int)r.cache, (int)FJ_CACHE_MISS,
            (unsigned long long)s.disk_rejects,
            (unsigned long long)s.disk_hits, l.valid, want_valid);
    return 1;
  }
  if (!strstr(first_warning, c->reason)) {
    fprintf(stderr, "  get: the warning lacks \"%s\": %s\n", c->reason,
            first_warning);
    return 1;
  }
  fj_ctx_destroy(ctx);
  return 0;
}

/* A tuning database that is no regular file lists as empty (as a damaged
 * one does), with a warning, at once. */
typedef struct tunedb_case {
  const char *name;
  int (*plant)(const char *path);
  const char *reason;
} tunedb_case;

static int plant_db_fifo(const char *path) { return mkfifo(path, 0644); }
static int plant_db_dev_zero(const char *path) { return symlink("/dev/zero", path); }
static int plant_db_sparse(const char *path)
{
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
  int rc = fd < 0 || ftruncate(fd, (off_t)1 << 30);
  if (fd >= 0)
    close(fd);
  return rc;
}

static const tunedb_case tunedb_cases[] = {
    {"fifo", plant_db_fifo, "is not a regular file"},
    {"symlink_to_dev_zero", plant_db_dev_zero, "is a symbolic link"},
    {"sparse_1_gb", plant_db_sparse, "bytes, over the limit of 67108864"},
};

static int count_tune(void *user, const fj_tune_entry *e)
{
  (void)e;
  ++*(int *)user;
  return 0;
}

static int tunedb_list(const void *arg)
{
  const tunedb_case *c = arg;
  fj_ctx *ctx = hostile_ctx();
  int n = 0;
  fj_status st = ctx ? fj_tune_list(ctx, count_tune, &n) : FJ_ERR_IO;
  if (st != FJ_OK || n != 0 || !strstr(first_warning, c->reason)) {
    fprintf(stderr, "  tune list: status %d, %d entries (want 0), warning "
            "\"%s\" (want \"%s\"): %s\n", (int)st, n, first_warning,
            c->reason, fj_errmsg(ctx));
    return 1;
  }
  fj_ctx_destroy(ctx);
  return 0;
}

static int plant_both(const hostile_case *c, const char *dir)
{
  for (int i = 0; i < 2; i++) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, hf.names[i]);
    if (c->plant(path, i) != 0) {
      fprintf(stderr, "  %s: cannot plant %s: %s\n", c->name, path,
              strerror(errno));
      return -1;
    }
  }
  return 0;
}

int test_cache_hostile_files(void)
{
  snprintf(hf.valid_dir, sizeof hf.valid_dir, "%s", fjt_tmpdir());
  fj_ctx *ctx = fjt_ctx("sm_90", hf.valid_dir);
  CHECK(ctx);
  fj_variant_default(&hf.v, 32, FJ_F16, FJ_CAUSAL_NONE);
  fj_kernel *k;
  CHECK_OK(ctx, fj_kernel_get(ctx, &hf.v, &k));
  CHECK_OK(ctx, fj_cache_list(ctx, name_visit, NULL));
  CHECK(hf.names[0][0] && hf.names[1][0]);
  fj_ctx_destroy(ctx);
  tally t = {0};
  for (size_t i = 0; i < sizeof hostile_cases / sizeof hostile_cases[0]; i++) {
    const hostile_case *c = &hostile_cases[i];
    char name[128];
    hf.dir = fjt_tmpdir();
    CHECK(plant_both(c, hf.dir) == 0);
    snprintf(name, sizeof name, "%s: fj_cache_list", c->name);
    count(&t, name, bounded(hostile_list, NULL, LIST_SECONDS), LIST_SECONDS);
    snprintf(name, sizeof name, "%s: fj_kernel_get", c->name);
    count(&t, name, bounded(hostile_get, c, GET_SECONDS), GET_SECONDS);
  }
  /* The tuning database lives in the same directory. */
  for (size_t i = 0; i < sizeof tunedb_cases / sizeof tunedb_cases[0]; i++) {
    const tunedb_case *c = &tunedb_cases[i];
    char name[128], path[4400];
    hf.dir = fjt_tmpdir();
    snprintf(path, sizeof path, "%s/tune.json", hf.dir);
    CHECK(c->plant(path) == 0);
    snprintf(name, sizeof name, "tune.json %s: fj_tune_list", c->name);
    count(&t, name, bounded(tunedb_list, c, LIST_SECONDS), LIST_SECONDS);
  }
  return report(&t);
}
