/*
 * compile.c -- NVRTC: options, logs, PTX and cubin, the resource report, and
 * compilation in a child process.
 *
 * NVRTC runs inside the caller's process and can crash it (NVRTC 13.0 dies
 * with SIGSEGV on some wgmma code that nvcc compiles), so a compile can run
 * in a forked child that sends the results back over a pipe; a crashed child
 * becomes FJ_ERR_COMPILE naming the signal.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nvrtc.h>

#include "internal.h"

#ifndef FJ_CUDA_INCLUDE_DIR
#define FJ_CUDA_INCLUDE_DIR "/usr/local/cuda/include"
#endif

enum { CHILD_TIMEOUT_MS = 600 * 1000 };

/* ---- options ------------------------------------------------------------- */

static char include_opt[4200];
static pthread_once_t include_once = PTHREAD_ONCE_INIT;

static int has_mma_header(const char *dir)
{
  char path[4200];
  struct stat st;
  snprintf(path, sizeof path, "%.4000s/mma.h", dir);
  return stat(path, &st) == 0;
}

/* NVRTC has cuda_fp16.h and friends built in but not mma.h, so it needs the
 * toolkit's include directory: the first of $FLASHJIT_CUDA_INCLUDE,
 * $CUDA_HOME/include, $CUDA_PATH/include, the toolkit found at build time
 * and /usr/local/cuda/include that holds mma.h. */
static void find_include(void)
{
  static const char *const env[] = {"FLASHJIT_CUDA_INCLUDE", "CUDA_HOME",
                                     "CUDA_PATH"};
  char dir[4096];
  for (size_t i = 0; i < FJ_ARRAY_LEN(env); i++) {
    const char *v = getenv(env[i]);
    if (!v || !*v)
      continue;
    snprintf(dir, sizeof dir, "%s%s", v, i == 0 ? "" : "/include");
    if (has_mma_header(dir)) {
      snprintf(include_opt, sizeof include_opt, "-I%s", dir);
      return;
    }
  }
  static const char *const fixed[] = {FJ_CUDA_INCLUDE_DIR,
                                      "/usr/local/cuda/include"};
  for (size_t i = 0; i < FJ_ARRAY_LEN(fixed); i++)
    if (has_mma_header(fixed[i])) {
      snprintf(include_opt, sizeof include_opt, "-I%s", fixed[i]);
      return;
    }
}

void fj__nvrtc_options(const char *arch, fj_nvrtc_opts *o)
{
  static const char *const fixed[] = {"-default-device", "-std=c++17",
                                      "-lineinfo", "-Xptxas", "-v"};
  pthread_once(&include_once, find_include);
  snprintf(o->arch, sizeof o->arch, "--gpu-architecture=%s", arch);
  o->argc = 0;
  o->argv[o->argc++] = o->arch;
  for (size_t i = 0; i < FJ_ARRAY_LEN(fixed); i++)
    o->argv[o->argc++] = fixed[i];
  if (include_opt[0])
    o->argv[o->argc++] = include_opt;
}

const char *fj__nvrtc_version(void)
{
  static char text[32];
  int major = 0, minor = 0;
  if (!text[0] && nvrtcVersion(&major, &minor) == NVRTC_SUCCESS)
    snprintf(text, sizeof text, "%d.%d", major, minor);
  return text[0] ? text : "unknown";
}

/* ---- compiling in this process -------------------------------------------- */

/* Result of one compile, as it crosses the pipe from a child. */
typedef struct job {
  fj_status status;
  fj_buf msg;
  fj_compiled out;
} job;

static char *nvrtc_log(nvrtcProgram prog)
{
  size_t n = 0;
  if (nvrtcGetProgramLogSize(prog, &n) != NVRTC_SUCCESS || n == 0)
    return fj__strdup("");
  char *log = calloc(1, n + 1);
  if (log && nvrtcGetProgramLog(prog, log) != NVRTC_SUCCESS)
    log[0] = '\0';
  return log;
}

static int nvrtc_outputs(nvrtcProgram prog, fj_compiled *out)
{
  size_t n = 0;
  if (nvrtcGetPTXSize(prog, &n) != NVRTC_SUCCESS || !(out->ptx = calloc(1, n + 1)))
    return -1;
  if (nvrtcGetPTX(prog, out->ptx) != NVRTC_SUCCESS)
    return -1;
  out->ptx_len = strlen(out->ptx);
  if (nvrtcGetCUBINSize(prog, &out->cubin_len) != NVRTC_SUCCESS ||
      !(out->cubin = malloc(out->cubin_len ? out->cubin_len : 1)))
    return -1;
  return nvrtcGetCUBIN(prog, out->cubin) == NVRTC_SUCCESS ? 0 : -1;
}

static void compile_here(const char *name, const char *src, const char *arch,
                         job *j)
{
  nvrtcProgram prog;
  nvrtcResult r = nvrtcCreateProgram(&prog, src, name, 0, NULL, NULL);
  if (r != NVRTC_SUCCESS) {
    j->status = FJ_ERR_COMPILE;
    fj__buf_appendf(&j->msg, "nvrtcCreateProgram(%s) failed: %s", name,
                    nvrtcGetErrorString(r));
    return;
  }
  fj_nvrtc_opts o;
  fj__nvrtc_options(arch, &o);
  double t0 = fj__now_ms();
  r = nvrtcCompileProgram(prog, o.argc, o.argv);
  j->out.ms = fj__now_ms() - t0;
  /* The log first: on failure it is the whole explanation. */
  j->out.log = nvrtc_log(prog);
  if (r != NVRTC_SUCCESS) {
    j->status = r == NVRTC_ERROR_INVALID_OPTION ? FJ_ERR_INVALID_ARG
                                                : FJ_ERR_COMPILE;
    fj__buf_appendf(&j->msg, "NVRTC %s failed to compile %s for %s: %s\n%s",
                    fj__nvrtc_version(), name, arch, nvrtcGetErrorString(r),
                    j->out.log ? j->out.log : "");
  } else if (nvrtc_outputs(prog, &j->out) != 0) {
    j->status = FJ_ERR_COMPILE;
    fj__buf_appendf(&j->msg, "NVRTC compiled %s but its outputs could not "
                             "be read",
                    name);
  }
  nvrtcDestroyProgram(&prog);
}

/* ---- compiling in a child process ------------------------------------------ */

static int write_all(int fd, const void *p, size_t n)
{
  const char *c = p;
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return -1;
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

static int write_blob(int fd, const void *p, uint64_t n)
{
  return write_all(fd, &n, sizeof n) || (n && write_all(fd, p, (size_t)n));
}

/* In the child: compile, then send status, time and the four blobs. */
static void child_main(int fd, const char *name, const char *src,
                       const char *arch)
{
  job j = {FJ_OK, {0}, {0}};
  compile_here(name, src, arch, &j);
  int32_t st = (int32_t)j.status;
  const char *log = j.out.log ? j.out.log : "";
  int bad = write_all(fd, &st, sizeof st) ||
            write_all(fd, &j.out.ms, sizeof j.out.ms) ||
            write_blob(fd, j.msg.data, j.msg.len) ||
            write_blob(fd, log, strlen(log)) ||
            write_blob(fd, j.out.ptx, j.out.ptx_len) ||
            write_blob(fd, j.out.cubin, j.out.cubin_len);
  _exit(bad ? 3 : 0);
}

/* Reads exactly n bytes, waiting at most until deadline (ms, monotonic). */
static int read_all(int fd, void *p, size_t n, double deadline)
{
  char *c = p;
  while (n > 0) {
    int left = (int)(deadline - fj__now_ms());
    struct pollfd pfd = {fd, POLLIN, 0};
    if (left <= 0 || poll(&pfd, 1, left) <= 0) {
      if (errno == EINTR && left > 0)
        continue;
      errno = ETIMEDOUT;
      return -1;
    }
    ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return -1;
    c += r;
    n -= (size_t)r;
  }
  return 0;
}

static int read_blob(int fd, char **out, size_t *len, double deadline)
{
  uint64_t n;
  if (read_all(fd, &n, sizeof n, deadline) || n > ((uint64_t)1 << 32))
    return -1;
  *out = malloc((size_t)n + 1);
  if (!*out || read_all(fd, *out, (size_t)n, deadline))
    return -1;
  (*out)[n] = '\0';
  if (len)
    *len = (size_t)n;
  return 0;
}

static int read_job(int fd, job *j)
{
  double deadline = fj__now_ms() + CHILD_TIMEOUT_MS;
  int32_t st;
  char *msg = NULL, *cubin = NULL;
  size_t msg_len = 0;
  if (read_all(fd, &st, sizeof st, deadline) ||
      read_all(fd, &j->out.ms, sizeof j->out.ms, deadline) ||
      read_blob(fd, &msg, &msg_len, deadline) ||
      read_blob(fd, &j->out.log, NULL, deadline) ||
      read_blob(fd, &j->out.ptx, &j->out.ptx_len, deadline) ||
      read_blob(fd, &cubin, &j->out.cubin_len, deadline)) {
    free(msg);
    free(cubin);
    return -1;
  }
  j->out.cubin = cubin;
  j->status = (fj_status)st;
  fj__buf_append(&j->msg, msg, msg_len);
  free(msg);
  return 0;
}

static void child_verdict(pid_t pid, int got_all, const char *name, job *j)
{
  int ws = 0;
  if (!got_all)
    kill(pid, SIGKILL);
  while (waitpid(pid, &ws, 0) < 0 && errno == EINTR)
    ;
  if (got_all && WIFEXITED(ws) && WEXITSTATUS(ws) == 0)
    return;
  fj__compiled_free(&j->out);
  j->status = FJ_ERR_COMPILE;
  j->msg.len = 0;
  if (WIFSIGNALED(ws))
    fj__buf_appendf(&j->msg, "NVRTC crashed while compiling %s: the "
                             "compiler process was killed by signal %d (%s)",
                    name, WTERMSIG(ws), strsignal(WTERMSIG(ws)));
  else
    fj__buf_appendf(&j->msg, "the compiler process for %s %s", name,
                    got_all ? "exited with an error"
                            : "sent no result in time and was stopped");
}

static void compile_isolated(const char *name, const char *src,
                             const char *arch, job *j)
{
  int fds[2];
  if (pipe(fds) != 0) {
    j->status = FJ_ERR_COMPILE;
    fj__buf_appendf(&j->msg, "pipe() failed: %s", strerror(errno));
    return;
  }
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    child_main(fds[1], name, src, arch);
  }
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    j->status = FJ_ERR_COMPILE;
    fj__buf_appendf(&j->msg, "fork() failed: %s", strerror(errno));
    return;
  }
  double t0 = fj__now_ms();
  int got_all = read_job(fds[0], j) == 0;
  close(fds[0]);
  child_verdict(pid, got_all, name, j);
  if (j->status == FJ_OK && j->out.ms <= 0)
    j->out.ms = fj__now_ms() - t0;
}

/* ---- entry points ----------------------------------------------------------- */

fj_status fj__compile(const fj_ctx *ctx, const char *name, const char *src,
                      const char *arch, int isolate, fj_compiled *out)
{
  job j = {FJ_OK, {0}, {0}};
  if (isolate)
    compile_isolated(name, src, arch, &j);
  else
    compile_here(name, src, arch, &j);
  if (j.status != FJ_OK) {
    fj__compiled_free(&j.out);
    fj_status st = fj__fail(ctx, j.status, "%s",
                            j.msg.data ? j.msg.data : "compile failed");
    fj__buf_free(&j.msg);
    return st;
  }
  fj__buf_free(&j.msg);
  *out = j.out;
  return FJ_OK;
}

void fj__compiled_free(fj_compiled *c)
{
  free(c->log);
  free(c->ptx);
  free(c->cubin);
  memset(c, 0, sizeof *c);
}

/* ---- the resource report ------------------------------------------------------ */

/* The integer just before `what` in the log ("128 bytes smem" -> 128). */
static int number_before(const char *log, const char *what)
{
  const char *p = strstr(log, what);
  if (!p)
    return 0;
  while (p > log && p[-1] == ' ')
    p--;
  while (p > log && p[-1] >= '0' && p[-1] <= '9')
    p--;
  return atoi(p);
}

void fj__parse_resources(const char *log, fj_resources *res)
{
  if (!log)
    return;
  res->registers = number_before(log, "registers");
  res->barriers = number_before(log, "barriers");
  res->shared_static = number_before(log, "bytes smem");
  res->local_bytes = number_before(log, "bytes stack frame");
  res->spill_store_bytes = number_before(log, "bytes spill stores");
  res->spill_load_bytes = number_before(log, "bytes spill loads");
}
