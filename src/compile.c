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
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nvrtc.h>

#include "compile.h"
#include "ctx.h"
#include "util.h"

#ifndef FJ_CUDA_INCLUDE_DIR
#define FJ_CUDA_INCLUDE_DIR "/usr/local/cuda/include"
#endif

enum {
  CHILD_TIMEOUT_MS = 600 * 1000,
  /* How often the parent also asks whether a child has exited: its pipe's
   * EOF can be late (below, service). */
  CHILD_POLL_MS = 200,
  /* Starts of one job's child, the first included, when a child is stuck
   * (below, child_stuck). */
  CHILD_TRIES = 3
};

void (*fj__compile_child_hook)(void);
/* A child that has used no CPU time for this long is stuck (child_stuck). */
int fj__compile_stuck_ms = 10 * 1000;

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

static char nvrtc_version_text[32];
static int nvrtc_major, nvrtc_minor;
static pthread_once_t nvrtc_version_once = PTHREAD_ONCE_INIT;

static void nvrtc_version_read(void)
{
  if (nvrtcVersion(&nvrtc_major, &nvrtc_minor) == NVRTC_SUCCESS)
    snprintf(nvrtc_version_text, sizeof nvrtc_version_text, "%d.%d",
             nvrtc_major, nvrtc_minor);
}

/* Once per process: contexts on several devices ask from several threads
 * at once, and a reader must never see the text half written. */
const char *fj__nvrtc_version(void)
{
  pthread_once(&nvrtc_version_once, nvrtc_version_read);
  return nvrtc_version_text[0] ? nvrtc_version_text : "unknown";
}

/* NVRTC 12.9 and later keep their own cache of compiled programs: a hit
 * runs no ptxas, so its log lacks the "-Xptxas -v" lines the resource
 * report reads (registers and spills would read 0), and its time is not a
 * compile's.  The library has its own cache; NVRTC's is turned off. */
static int nvrtc_has_cache(void)
{
  pthread_once(&nvrtc_version_once, nvrtc_version_read);
  return nvrtc_major > 12 || (nvrtc_major == 12 && nvrtc_minor >= 9);
}

/* NVRTC 12.8 and later take --Ofast-compile: a quick kernel's (the
 * tiered JIT's first: a small CUDA-core kernel, 300 -> 170 ms to compile
 * on a 2-core machine with "min", NVVM a third of its time; no local
 * memory; the same arithmetic, its loops less unrolled: docs/PERF.md J12).
 * "mid" put its arrays in local memory. */
static int nvrtc_has_fast_compile(void)
{
  pthread_once(&nvrtc_version_once, nvrtc_version_read);
  return nvrtc_major > 12 || (nvrtc_major == 12 && nvrtc_minor >= 8);
}

void fj__nvrtc_options(const char *arch, int quick, fj_nvrtc_opts *o)
{
  static const char *const fixed[] = {"-default-device", "-std=c++17",
                                      "-lineinfo", "-Xptxas", "-v"};
  pthread_once(&include_once, find_include);
  snprintf(o->arch, sizeof o->arch, "--gpu-architecture=%s", arch);
  o->argc = 0;
  o->argv[o->argc++] = o->arch;
  for (size_t i = 0; i < FJ_ARRAY_LEN(fixed); i++)
    o->argv[o->argc++] = fixed[i];
  if (nvrtc_has_cache())
    o->argv[o->argc++] = "--no-cache";
  if (quick && nvrtc_has_fast_compile())
    o->argv[o->argc++] = "--Ofast-compile=min";
  if (include_opt[0])
    o->argv[o->argc++] = include_opt;
}

/* NVRTC's targets (nvrtcGetSupportedArchs: 75, 80, ...); their count, 0
 * when NVRTC cannot say. */
static int nvrtc_archs(int *archs, int max)
{
  int n = 0;
  if (nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n < 1 || n > max ||
      nvrtcGetSupportedArchs(archs) != NVRTC_SUCCESS)
    return 0;
  return n;
}

/* The base architectures with an arch-specific ('a') target. */
static int has_specific(int sm)
{
  static const int a[] = {90, 100, 101, 103, 110, 120, 121};
  for (size_t i = 0; i < FJ_ARRAY_LEN(a); i++)
    if (a[i] == sm)
      return 1;
  return 0;
}

fj_status fj__nvrtc_check_arch(const char *arch, int sm, int specific)
{
  int archs[64], n = nvrtc_archs(archs, 64), known = n == 0;
  char list[512] = "";
  size_t len = 0;
  for (int i = 0; i < n; i++) {
    known |= archs[i] == sm && (!specific || has_specific(sm));
    len += (size_t)snprintf(list + len, sizeof list - len, "%ssm_%d%s",
                            i ? ", " : "", archs[i],
                            has_specific(archs[i]) ? "[a]" : "");
    if (len >= sizeof list)
      break;
  }
  if (known)
    return FJ_OK;
  return fj__fail(NULL, FJ_ERR_INVALID_ARG,
                  "arch '%s' is not a target of NVRTC %s: one of %s", arch,
                  fj__nvrtc_version(), list);
}

/* ---- compiling in this process -------------------------------------------- */

static _Atomic unsigned long nvrtc_compiles;

unsigned long fj__nvrtc_compiles(void)
{
  return atomic_load(&nvrtc_compiles);
}

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
                         int quick, job *j)
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
  fj__nvrtc_options(arch, quick, &o);
  double t0 = fj__now_ms();
  atomic_fetch_add(&nvrtc_compiles, 1);
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
  } else if (!j->out.log) {
    /* A kernel's log is never NULL past here: the resource report and
     * the cache's payload read it. */
    j->status = FJ_ERR_NOMEM;
    fj__buf_appendf(&j->msg, "out of memory reading NVRTC's log for %s",
                    name);
  } else if (nvrtc_outputs(prog, &j->out) != 0) {
    j->status = FJ_ERR_COMPILE;
    fj__buf_appendf(&j->msg, "NVRTC compiled %s but its outputs could not "
                             "be read",
                    name);
  }
  nvrtcDestroyProgram(&prog);
}

/* ---- compiling in child processes ------------------------------------------
 * Each child compiles one source and writes its result to a pipe: status,
 * time, then message, log, PTX and cubin as length-prefixed blobs; then it
 * exits.  The parent runs up to `workers` children at once from one thread,
 * reading every pipe as data arrives (poll), so that no child blocks on a
 * full pipe, and parses a child's bytes once it has closed its end.
 */

static int write_blob(int fd, const void *p, uint64_t n)
{
  return fj__write_all(fd, &n, sizeof n) || (n && fj__write_all(fd, p, (size_t)n));
}

/* In the child: compile, send, exit without running the parent's atexit
 * handlers.  Crash signals get their default action first: the host may
 * have installed handlers of its own (a Python fault handler, a sanitizer)
 * that must not run here, and the parent reads the signal a crash sends. */
static void child_main(int fd, const char *name, const char *src,
                       const char *arch, int quick)
{
  static const int crash_signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
  for (size_t i = 0; i < FJ_ARRAY_LEN(crash_signals); i++)
    signal(crash_signals[i], SIG_DFL);
  if (fj__compile_child_hook)
    fj__compile_child_hook();
  job j = {FJ_OK, {0}, {0}};
  compile_here(name, src, arch, quick, &j);
  int32_t st = (int32_t)j.status;
  const char *log = j.out.log ? j.out.log : "";
  int bad = fj__write_all(fd, &st, sizeof st) ||
            fj__write_all(fd, &j.out.ms, sizeof j.out.ms) ||
            write_blob(fd, j.msg.data, j.msg.len) ||
            write_blob(fd, log, strlen(log)) ||
            write_blob(fd, j.out.ptx, j.out.ptx_len) ||
            write_blob(fd, j.out.cubin, j.out.cubin_len);
  _exit(bad ? 3 : 0);
}

typedef struct child {
  pid_t pid;
  int fd;          /* -1 once everything it sent has been read */
  int reaped;      /* 1 once waitpid has returned its status */
  int status;      /* waitpid's status, when reaped */
  int nomem;       /* 1 once memory for what it sent ran out */
  size_t index;    /* the job it compiles */
  double deadline;
  fj_buf bytes;    /* everything it sent */
  int tries;       /* children started for the job, this one included */
  long long ticks; /* its CPU time when last read (clock ticks), or -1 */
  double ticked;   /* when that CPU time last grew */
} child;

static int take(const char **p, const char *end, void *dst, size_t n)
{
  if ((size_t)(end - *p) < n)
    return -1;
  memcpy(dst, *p, n);
  *p += n;
  return 0;
}

static int take_blob(const char **p, const char *end, char **out, size_t *len)
{
  uint64_t n;
  if (take(p, end, &n, sizeof n) || n > (uint64_t)(end - *p))
    return -1;
  if (!(*out = malloc((size_t)n + 1)))
    return -1;
  memcpy(*out, *p, (size_t)n);
  (*out)[n] = '\0';
  *p += n;
  if (len)
    *len = (size_t)n;
  return 0;
}

/* Parses what a child sent into j; -1 if it is incomplete. */
static int parse_child(const fj_buf *b, job *j)
{
  const char *p = b->data, *end = b->data + b->len;
  int32_t st;
  char *msg = NULL, *cubin = NULL;
  size_t msg_len = 0;
  int bad = !p || take(&p, end, &st, sizeof st) ||
            take(&p, end, &j->out.ms, sizeof j->out.ms) ||
            take_blob(&p, end, &msg, &msg_len) ||
            take_blob(&p, end, &j->out.log, NULL) ||
            take_blob(&p, end, &j->out.ptx, &j->out.ptx_len) ||
            take_blob(&p, end, &cubin, &j->out.cubin_len);
  j->out.cubin = cubin;
  if (!bad) {
    j->status = (fj_status)st;
    fj__buf_append(&j->msg, msg, msg_len);
  }
  free(msg);
  return bad ? -1 : 0;
}

/* Reaps a child and turns what it sent (or how it died) into its result. */
static void child_finish(child *c, const char *name, job *j)
{
  int ws = c->status;
  if (c->fd >= 0) {  /* stopped early: timed out */
    if (!c->reaped)
      kill(c->pid, SIGKILL);
    close(c->fd);
  }
  while (!c->reaped && waitpid(c->pid, &ws, 0) < 0 && errno == EINTR)
    ;
  int parsed = c->fd < 0 && !c->nomem && WIFEXITED(ws) &&
               WEXITSTATUS(ws) == 0 && parse_child(&c->bytes, j) == 0;
  fj__buf_free(&c->bytes);
  if (parsed)
    return;
  fj__compiled_free(&j->out);
  j->status = c->nomem ? FJ_ERR_NOMEM : FJ_ERR_COMPILE;
  j->msg.len = 0;
  if (c->nomem)
    fj__buf_appendf(&j->msg, "out of memory reading the compiler process's "
                             "result for %s", name);
  else if (WIFSIGNALED(ws) && c->fd < 0)
    fj__buf_appendf(&j->msg, "NVRTC crashed while compiling %s: the "
                             "compiler process was killed by signal %d (%s)",
                    name, WTERMSIG(ws), strsignal(WTERMSIG(ws)));
  else
    fj__buf_appendf(&j->msg, "the compiler process for %s %s", name,
                    c->fd >= 0 ? "sent no result in time and was stopped"
                               : "exited without a result");
}

/* NVRTC and fork() in one process: a child forked while another thread
 * of the parent is inside NVRTC would inherit NVRTC's locks held by a
 * thread it does not have, and wait on them for ever (the backward's
 * compiles ahead, kernel.c, run in-process and isolated compiles on
 * threads side by side).  An in-process compile holds the guard shared;
 * a fork holds it alone, around the fork only.  The child never takes it
 * (its copy stays held by the forking thread).  A host thread that used
 * NVRTC takes NVRTC's lock again as it exits, which no guard here covers:
 * a child forked then is stuck, and started again (child_stuck). */
static pthread_rwlock_t fork_guard = PTHREAD_RWLOCK_INITIALIZER;

static int child_start(child *c, size_t index, const fj_compile_job *jb)
{
  int fds[2];
  if (pipe(fds) != 0)
    return -1;
  pthread_rwlock_wrlock(&fork_guard);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    child_main(fds[1], jb->name, jb->src, jb->arch, jb->quick);
  }
  pthread_rwlock_unlock(&fork_guard);
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    return -1;
  }
  memset(c, 0, sizeof *c);
  c->pid = pid;
  c->fd = fds[0];
  c->index = index;
  c->tries = 1;
  c->ticks = -1;
  c->ticked = fj__now_ms();
  c->deadline = c->ticked + CHILD_TIMEOUT_MS;
  return 0;
}

/* The child's CPU time, user and system, in clock ticks (Linux's
 * /proc/PID/stat, fields 14 and 15); -1 where it cannot be read. */
static long long child_ticks(pid_t pid)
{
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0)
    return -1;
  buf[n] = '\0';
  /* After the command's name, in parentheses that it may itself contain:
   * fields 3 (the state) to 13, then utime and stime. */
  const char *p = strrchr(buf, ')');
  for (int field = 2; p && field < 14; field++)
    p = strchr(p + 1, ' ');
  if (!p)
    return -1;
  char *end;
  unsigned long long utime = strtoull(p + 1, &end, 10);
  if (end == p + 1 || *end != ' ')
    return -1;
  const char *q = end + 1;
  unsigned long long stime = strtoull(q, &end, 10);
  if (end == q)
    return -1;
  return (long long)(utime + stime);
}

/* Whether a child that has sent nothing yet is stuck: its CPU time has not
 * grown for fj__compile_stuck_ms.  NVRTC takes a lock of its own when a
 * thread that used it exits (its thread-local data's destructor): a child
 * forked at that moment -- the host's threads come and go as they like;
 * fork_guard covers compiles, not exits -- inherits the lock held by a
 * thread it does not have, and waits for it for ever, using no CPU.  A
 * compile uses CPU all along, even when it shares the machine with many. */
static int child_stuck(child *c, double now)
{
  if (c->bytes.len || c->fd < 0)
    return 0;
  long long t = child_ticks(c->pid);
  if (t < 0)
    return 0;  /* no /proc: the deadline alone */
  if (t != c->ticks) {
    c->ticks = t;
    c->ticked = now;
    return 0;
  }
  return now - c->ticked >= fj__compile_stuck_ms;
}

/* Stops a stuck child and starts the job's next; 0 when one started. */
static int child_restart(child *c, const fj_compile_job *jb)
{
  kill(c->pid, SIGKILL);
  close(c->fd);
  int ws;
  while (!c->reaped && waitpid(c->pid, &ws, 0) < 0 && errno == EINTR)
    ;
  fj__buf_free(&c->bytes);
  int tries = c->tries;
  if (child_start(c, c->index, jb) != 0) {
    /* Nothing to read: finished now, as a child without a result. */
    c->fd = -1;
    c->reaped = 1;
    c->deadline = 0;
    return -1;
  }
  c->tries = tries + 1;
  return 0;
}

/* Reads what is there; 1 once there is no more (the child closed its end,
 * or a non-blocking read found the pipe empty) and the pipe is closed; -1
 * when memory for it ran out (c->nomem). */
static int child_read(child *c)
{
  char chunk[65536];
  ssize_t r = read(c->fd, chunk, sizeof chunk);
  if (r < 0 && errno == EINTR)
    return 0;
  if (r > 0) {
    if (!fj__buf_append(&c->bytes, chunk, (size_t)r))
      return 0;
    c->nomem = 1;
    return -1;
  }
  close(c->fd);
  c->fd = -1;
  return 1;
}

/* A child that has exited has sent everything (its writes completed before
 * _exit), yet its pipe's EOF can wait on another holder of the write end:
 * a process the host forked between our pipe() and close() inherits it and
 * may live on.  So a child's exit also ends its read: what the pipe holds
 * is taken without blocking, and the result is complete.  1 when it has
 * exited (reaped, its pipe drained and closed). */
static int child_exited(child *c)
{
  int ws = 0;
  pid_t got = waitpid(c->pid, &ws, WNOHANG);
  /* ECHILD: a host that ignores SIGCHLD has the system reap its children;
   * the result then stands or falls by what the child sent. */
  if (got == 0 || (got < 0 && errno != ECHILD))
    return 0;
  c->reaped = 1;
  c->status = ws;
  int flags = fcntl(c->fd, F_GETFL);
  if (flags >= 0)
    fcntl(c->fd, F_SETFL, flags | O_NONBLOCK);
  while (child_read(c) == 0)  /* ends at an empty pipe (EAGAIN) or EOF */
    ;
  if (c->fd >= 0) {  /* memory ran out: the rest is not read */
    close(c->fd);
    c->fd = -1;
  }
  return 1;
}

static void job_done(fj_compile_job *jb, job *j)
{
  jb->status = j->status;
  jb->out = j->out;
  jb->message = j->status == FJ_OK ? NULL : fj__buf_take(&j->msg);
  fj__buf_free(&j->msg);
}

/* Waits for output from the running children; finishes those done. */
static size_t service(child *run, size_t *nrun, fj_compile_job *jobs)
{
  struct pollfd pfd[64];
  double now = fj__now_ms(), next = now + CHILD_POLL_MS;
  for (size_t i = 0; i < *nrun; i++) {
    pfd[i].fd = run[i].fd;
    pfd[i].events = POLLIN;
    pfd[i].revents = 0;
    if (run[i].deadline < next)
      next = run[i].deadline;
  }
  poll(pfd, (nfds_t)*nrun, next > now ? (int)(next - now) + 1 : 0);
  size_t finished = 0;
  now = fj__now_ms();
  for (size_t i = 0; i < *nrun;) {
    child *c = &run[i];
    int closed = (pfd[i].revents & (POLLIN | POLLHUP | POLLERR)) ? child_read(c) : 0;
    if (closed == 0 && !pfd[i].revents)
      closed = child_exited(c);
    if (closed == 0 && c->tries < CHILD_TRIES && child_stuck(c, now) &&
        child_restart(c, &jobs[c->index]) == 0) {
      pfd[i].fd = c->fd;
      pfd[i].revents = 0;
      i++;
      continue;
    }
    if (closed == 0 && now < c->deadline) {
      i++;
      continue;
    }
    job j = {FJ_OK, {0}, {0}};
    fj_compile_job *jb = &jobs[c->index];
    child_finish(c, jb->name, &j);
    job_done(jb, &j);
    run[i] = run[--*nrun];
    pfd[i] = pfd[*nrun];
    finished++;
  }
  return finished;
}

void fj__compile_many(fj_compile_job *jobs, size_t n, int workers,
                      fj_progress_fn progress, void *user)
{
  child run[64];
  size_t nrun = 0, next = 0, done = 0;
  if (workers < 1)
    workers = 1;
  if (workers > 64)
    workers = 64;
  while (done < n) {
    while (nrun < (size_t)workers && next < n) {
      if (child_start(&run[nrun], next, &jobs[next]) == 0) {
        jobs[next].status = FJ_OK;
        nrun++;
      } else {
        fj_buf m = {0};
        fj__buf_appendf(&m, "cannot start a compiler process: %s",
                        strerror(errno));
        jobs[next].status = FJ_ERR_COMPILE;
        jobs[next].message = fj__buf_take(&m);
        done++;
      }
      next++;
    }
    size_t finished = nrun ? service(run, &nrun, jobs) : 0;
    done += finished;
    if (finished && progress)
      progress(user, done, n);
  }
}

/* ---- entry points ----------------------------------------------------------- */

fj_status fj__compile(const fj_ctx *ctx, const char *name, const char *src,
                      const char *arch, int flags, fj_compiled *out)
{
  job j = {FJ_OK, {0}, {0}};
  int quick = (flags & FJ_COMPILE_QUICK) != 0;
  if (flags & FJ_COMPILE_ISOLATE) {
    fj_compile_job jb = {name, src, arch, quick, FJ_OK, NULL, {0}};
    fj__compile_many(&jb, 1, 1, NULL, NULL);
    j.status = jb.status;
    j.out = jb.out;
    if (jb.message)
      fj__buf_appendf(&j.msg, "%s", jb.message);
    free(jb.message);
  } else {
    pthread_rwlock_rdlock(&fork_guard);
    compile_here(name, src, arch, quick, &j);
    pthread_rwlock_unlock(&fork_guard);
  }
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

/* The integer just before `what` on a line ("128 bytes smem" -> 128);
 * keeps *out when the line lacks it. */
static void number_before(const char *line, const char *end, const char *what,
                          int *out)
{
  size_t n = strlen(what);
  for (const char *p = line; p + n <= end; p++) {
    if (memcmp(p, what, n) != 0)
      continue;
    const char *q = p;
    while (q > line && q[-1] == ' ')
      q--;
    const char *digits = q;
    while (digits > line && digits[-1] >= '0' && digits[-1] <= '9')
      digits--;
    if (digits < q) {
      *out = atoi(digits);
      return;
    }
  }
}

/* Reads the lines ptxas -v writes ("ptxas info : Used 80 registers, used 1
 * barriers, 1024 bytes smem" and "ptxas . 0 bytes stack frame, 0 bytes
 * spill stores, 0 bytes spill loads"), ignoring compiler warnings. */
void fj__parse_resources(const char *log, const char *symbol,
                         fj_resources *res)
{
  int mine = 1;  /* the lines belong to `symbol`'s entry function */
  for (const char *line = log; line && *line;) {
    const char *end = strchr(line, '\n');
    if (!end)
      end = line + strlen(line);
    const char *entry = strstr(line, "entry function '");
    if (symbol && entry && entry < end) {
      entry += strlen("entry function '");
      size_t n = strlen(symbol);
      mine = entry + n < end && !strncmp(entry, symbol, n) && entry[n] == '\'';
    }
    if (mine && strncmp(line, "ptxas", 5) == 0) {
      number_before(line, end, " registers", &res->registers);
      number_before(line, end, " barriers", &res->barriers);
      number_before(line, end, " bytes smem", &res->shared_static);
      number_before(line, end, " bytes stack frame", &res->local_bytes);
      number_before(line, end, " bytes spill stores", &res->spill_store_bytes);
      number_before(line, end, " bytes spill loads", &res->spill_load_bytes);
    }
    line = *end ? end + 1 : end;
  }
}
