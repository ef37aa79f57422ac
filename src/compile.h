/*
 * compile.h -- NVRTC: the options, one compile (in this process or a child
 * one), many compiles in parallel children, and the resource report read
 * from ptxas's log.
 */
#ifndef FJ_COMPILE_H
#define FJ_COMPILE_H

#include <stddef.h>

#include "ctx.h"

typedef struct fj_compiled {
  char *log;
  char *ptx;
  size_t ptx_len;
  void *cubin;
  size_t cubin_len;
  double ms;
} fj_compiled;

typedef struct fj_nvrtc_opts {
  char arch[48];
  const char *argv[12];
  int argc;
} fj_nvrtc_opts;

/* The options passed to NVRTC for arch; quick (a template's meta.quick):
 * with NVRTC's least optimisation too (--Ofast-compile=min, NVRTC 12.8
 * on; the same arithmetic, loops less unrolled). */
void fj__nvrtc_options(const char *arch, int quick, fj_nvrtc_opts *o);
/* FJ_OK when NVRTC targets arch (sm and specific as fj__parse_arch gives
 * them), else FJ_ERR_INVALID_ARG with a one-line message listing the
 * targets this NVRTC has (nvrtcGetSupportedArchs).  An NVRTC that cannot
 * say passes every arch. */
fj_status fj__nvrtc_check_arch(const char *arch, int sm, int specific);
/* nvrtcCompileProgram calls this process made itself (compiles in child
 * processes are not counted here: the caches' misses count every
 * kernel).  For tests that prove a path compiles nothing. */
unsigned long fj__nvrtc_compiles(void);
/* "13.0" ("unknown" if NVRTC cannot say). */
const char *fj__nvrtc_version(void);

/* One compile of a batch (fj__compile_many): inputs, then the result;
 * message is malloc'd on failure. */
typedef struct fj_compile_job {
  const char *name;
  const char *src;
  const char *arch;
  int quick;  /* fj__nvrtc_options' */
  fj_status status;
  char *message;
  fj_compiled out;
} fj_compile_job;

/* Compiles n sources, each in a child process, up to `workers` at once;
 * progress (optional) is called from this thread as jobs finish. */
void fj__compile_many(fj_compile_job *jobs, size_t n, int workers,
                      fj_progress_fn progress, void *user);
/* Tests only: called in each compile child before it compiles (a test
 * makes the child leave a process holding its pipe). */
extern void (*fj__compile_child_hook)(void);
/* Milliseconds without CPU time after which a compiler process that has
 * sent nothing is stuck: stopped, and the job's compile started again in
 * a new one, twice at most (10 s; tests shorten it). */
extern int fj__compile_stuck_ms;
/* fj__compile's flags. */
enum {
  FJ_COMPILE_ISOLATE = 1,  /* NVRTC in a child process */
  FJ_COMPILE_QUICK = 2     /* fj__nvrtc_options' quick */
};
/* Compiles src for arch with flags (FJ_COMPILE_*; 1 is FJ_COMPILE_ISOLATE). */
fj_status fj__compile(const fj_ctx *ctx, const char *name, const char *src,
                      const char *arch, int flags, fj_compiled *out);
void fj__compiled_free(fj_compiled *c);
/* Reads registers, barriers, shared memory, spills and stack frame from a
 * ptxas -v log: of entry function `symbol` where the module has several
 * (FP8 attention's _vt pass beside its kernel), of every line where
 * symbol is NULL or the log names no entry function. */
void fj__parse_resources(const char *log, const char *symbol,
                         fj_resources *res);

#endif /* FJ_COMPILE_H */
