/*
 * test_compile.c -- NVRTC without a GPU: attention kernels for sm_80 and
 * sm_90, the layout probe module, the compile log on failure, a compiler
 * crash contained in a child process, a child's pipe held open by another
 * process, a stuck child started again, one thread's compile beside the context's other threads, and
 * the resource report.
 */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "compile.h"
#include "ctx.h"
#include "kernel.h"
#include "template.h"
#include "util.h"
#include "locked.h"
#include "runner.h"

static int check_kernel(fj_ctx *ctx, const fj_variant *v, const char *sm)
{
  fj_kernel *k;
  CHECK_OK(ctx, fj_kernel_get(ctx, v, &k));
  size_t cubin_len = 0, ptx_len = 0;
  const unsigned char *cubin = fj_kernel_cubin(k, &cubin_len);
  const char *ptx = fj_kernel_ptx(k, &ptx_len);
  CHECK(cubin_len > 1000 && memcmp(cubin, "\177ELF", 4) == 0);
  CHECK(ptx_len == strlen(ptx));
  CHECK(strstr(ptx, sm));
  CHECK(strstr(ptx, "wmma.mma.sync"));
  CHECK(strstr(ptx, fj_kernel_name(k)));
  CHECK(strstr(fj_kernel_log(k), "ptxas info"));
  fj_resources r;
  fj_kernel_resources(k, &r);
  CHECK(r.registers > 16 && r.registers <= 255);
  CHECK(r.threads == 32 * v->warps);
  CHECK(r.shared_dynamic > 16384);
  CHECK(r.spill_store_bytes == 0 && r.spill_load_bytes == 0);
  CHECK(r.cubin_bytes == cubin_len && r.ptx_bytes == ptx_len);
  CHECK(r.compile_ms > 0 && r.cache == FJ_CACHE_MISS);
  return 0;
}

int test_compile_sm80_sm90(void)
{
  static const char *const archs[][2] = {{"sm_80", ".target sm_80"},
                                         {"sm_90", ".target sm_90"}};
  for (int a = 0; a < 2; a++) {
    fj_ctx *ctx = fjt_ctx(archs[a][0], NULL);
    CHECK(ctx);
    fj_variant v;
    fj_variant_default(&v, 64, FJ_F16, FJ_CAUSAL_NONE);
    CHECK(check_kernel(ctx, &v, archs[a][1]) == 0);
    fj_variant_default(&v, 128, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT);
    CHECK(check_kernel(ctx, &v, archs[a][1]) == 0);
    fj_ctx_destroy(ctx);
  }
  return 0;
}

/* The e4m3 probes on sm_90a: wgmma.cuh's 8-bit forms (m64nNk32, no
 * transpose immediates: the scales end the operands), the RS form's four A
 * registers, and pack4_e4m3's conversions, through ptxas into the cubin. */
static int lut_probe_fp8(fj_kernel *k, const char *ptx)
{
  static const char *const want[] = {
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3",
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3",
      "cvt.rn.satfinite.e4m3x2.f32",
  };
  for (size_t i = 0; i < FJ_ARRAY_LEN(want); i++) {
    const char *at = strstr(ptx, want[i]);
    CHECK(at);
    const char *end = strchr(at, ';');
    /* d, a, b, p, 1, 1; -- no transpose immediates after the scales */
    CHECK(end && (i == 2 || (end - at > 7 && !strncmp(end - 7, "p, 1, 1", 7))));
  }
  size_t cubin_len = 0;
  CHECK(fj_kernel_cubin(k, &cubin_len) && cubin_len > 1000);
  return 0;
}

/* The layout probe module compiles wherever it may run: every probe kernel
 * from sm_80 on; on sm_75 only the f16 WMMA ones (bf16 fragments and
 * mma.sync m16n8k16 need sm_80). */
int test_compile_lut_probe(void)
{
  static const char *const archs[] = {"sm_75", "sm_80", "sm_90", "sm_90a"};
  for (int a = 0; a < 4; a++) {
    fj_ctx *ctx = fjt_ctx(archs[a], NULL);
    CHECK(ctx);
    fj_param params[] = {
        {"arch", FJ_PARAM_STR, 0, ctx->arch, NULL},
        {"version", FJ_PARAM_STR, 0, fj_version(), NULL},
        {"sm", FJ_PARAM_INT, ctx->sm, NULL, NULL},
    };
    fj_kernel *k;
    CHECK_OK(ctx, FJT_LOCKED(ctx, fj__kernel_build(ctx, "lut_probe.cu", params, 3, &k)));
    const char *ptx = fj_kernel_ptx(k, NULL);
    for (int f = 1; f <= FJ_FRAG_COUNT; f++) {
      char symbol[64];
      snprintf(symbol, sizeof symbol, "fj_probe_%s", fj_frag_name((fj_frag)f));
      const char *name = fj_frag_name((fj_frag)f);
      int needs_80 = !strncmp(name, "mma_", 4) || strstr(name, "bf16");
      int needs_90a = !strncmp(name, "wgmma_", 6);
      int missing = needs_90a ? a != 3 : needs_80 && ctx->sm < 80;
      CHECK((strstr(ptx, symbol) == NULL) == missing);
    }
    CHECK(strstr(ptx, "mma.sync.aligned.m16n8k16") == NULL || ctx->sm >= 80);
    CHECK((strstr(ptx, "wgmma.mma_async") == NULL) == (a != 3));
    if (a == 3)
      CHECK(lut_probe_fp8(k, ptx) == 0);
    fj_ctx_destroy(ctx);
  }
  return 0;
}

int test_compile_error_log(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90", NULL);
  CHECK(ctx);
  const char *src = "extern \"C\" __global__ void k(float *x) {\n"
                    "  x[0] = undefined_thing;\n}\n";
  for (int isolate = 0; isolate < 2; isolate++) {
    fj_compiled out = {0};
    CHECK_ST(ctx, fj__compile(ctx, "bad.cu", src, "sm_90", isolate, &out),
             FJ_ERR_COMPILE);
    CHECK_MSG(ctx, "failed to compile bad.cu for sm_90");
    CHECK_MSG(ctx, "bad.cu(2)");
    CHECK_MSG(ctx, "identifier \"undefined_thing\" is undefined");
    CHECK(out.cubin == NULL);
  }
  fj_ctx_destroy(ctx);
  return 0;
}

/* NVRTC 13.0 crashes on this file for sm_90a (nvcc and ptxas compile it):
 * in a child process the crash becomes an error naming the signal, and the
 * caller lives on to compile the next kernel. */
int test_compile_isolated_crash(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  char path[4300];
  snprintf(path, sizeof path, "%s/nvrtc-13.0-wgmma-crash.cu", fjt_data_dir());
  char *src = fj__file_read(path, (uint64_t)1 << 30, NULL);
  CHECK(src);
  fj_compiled out = {0};
  fj_status st = fj__compile(ctx, "crash.cu", src, "sm_90a", 1, &out);
  if (st == FJ_OK) {
    /* A later NVRTC may have fixed it; 13.0 must still crash. */
    printf("NVRTC %s compiled the crash anchor\n", fj__nvrtc_version());
    CHECK(strcmp(fj__nvrtc_version(), "13.0") != 0);
    fj__compiled_free(&out);
  } else {
    CHECK_ST(ctx, st, FJ_ERR_COMPILE);
#ifdef FJT_SANITIZED
    /* Under AddressSanitizer NVRTC's bug shows as an absurd allocation that
     * the sanitizer aborts before the segfault: contained all the same. */
    CHECK_MSG(ctx, "crash.cu");
#else
    CHECK_MSG(ctx, "NVRTC crashed while compiling crash.cu");
    CHECK_MSG(ctx, "signal 11");
#endif
  }
  free(src);
  /* Isolated and in-process compiles of a good kernel agree. */
  const char *good = "extern \"C\" __global__ void k(float *x) { x[threadIdx.x] *= 2.f; }\n";
  fj_compiled a = {0}, b = {0};
  CHECK_OK(ctx, fj__compile(ctx, "good.cu", good, "sm_90a", 1, &a));
  CHECK_OK(ctx, fj__compile(ctx, "good.cu", good, "sm_90a", 0, &b));
  CHECK(a.cubin_len == b.cubin_len && a.cubin_len > 0);
  CHECK(strcmp(a.ptx, b.ptx) == 0 && strstr(a.log, "ptxas info"));
  CHECK(a.ms > 0);
  fj__compiled_free(&a);
  fj__compiled_free(&b);
  fj_ctx_destroy(ctx);
  return 0;
}

/* The compile child leaves a process holding its pipe's write end (all
 * its descriptors but the standard ones) for 6 s: what a process the host
 * forks between the library's pipe() and close() would do. */
static void hold_pipe_hook(void)
{
  if (fork() == 0) {
    close(0);
    close(1);
    close(2);
    sleep(6);
    _exit(0);
  }
}

/* The compile ends when its child exits, not when the last holder of the
 * pipe lets go (before, it waited for that process: up to the 600 s
 * timeout, holding the context's lock). */
int test_compile_child_pipe_held(void)
{
  fj_ctx *ctx = fjt_ctx("sm_80", NULL);
  CHECK(ctx);
  const char *good = "extern \"C\" __global__ void k(float *x) { x[threadIdx.x] += 1.f; }\n";
  /* Then with SIGCHLD ignored, as some servers run: the system reaps the
   * child, and waitpid answers ECHILD. */
  for (int ignored = 0; ignored < 2; ignored++) {
    void (*was)(int) = signal(SIGCHLD, ignored ? SIG_IGN : SIG_DFL);
    fj__compile_child_hook = hold_pipe_hook;
    fj_compiled out = {0};
    double t0 = fj__now_ms();
    fj_status st = fj__compile(ctx, "held.cu", good, "sm_80", 1, &out);
    double ms = fj__now_ms() - t0;
    fj__compile_child_hook = NULL;
    signal(SIGCHLD, was);
    printf("isolated compile with its pipe held elsewhere%s: %.0f ms\n",
           ignored ? ", SIGCHLD ignored" : "", ms);
    CHECK_OK(ctx, st);
    CHECK(out.cubin_len > 0 && out.ptx && strstr(out.ptx, ".entry k"));
    CHECK(ms < 4000);
    fj__compiled_free(&out);
  }
  fj_ctx_destroy(ctx);
  return 0;
}

/* The first compile child of a run blocks for good without using CPU, as
 * one forked while a host thread that used NVRTC was exiting would (it
 * inherits NVRTC's lock held by a thread it does not have); later
 * children compile. */
static char stuck_marker[4200];

static void stuck_hook(void)
{
  int fd = open(stuck_marker, O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0)
    return;
  close(fd);
  for (;;)
    pause();
}

/* A stuck compile child is stopped after fj__compile_stuck_ms without CPU
 * time and the compile started again in a new one (before, the call
 * waited for the 600 s timeout and failed). */
int test_compile_child_stuck(void)
{
  fj_ctx *ctx = fjt_ctx("sm_80", NULL);
  CHECK(ctx);
  snprintf(stuck_marker, sizeof stuck_marker, "%s/stuck", fjt_tmpdir());
  const char *good = "extern \"C\" __global__ void k(float *x) { x[threadIdx.x] *= 2.f; }\n";
  int was = fj__compile_stuck_ms;
  fj__compile_stuck_ms = 1000;
  fj__compile_child_hook = stuck_hook;
  fj_compiled out = {0};
  double t0 = fj__now_ms();
  fj_status st = fj__compile(ctx, "stuck.cu", good, "sm_80", FJ_COMPILE_ISOLATE, &out);
  double ms = fj__now_ms() - t0;
  fj__compile_child_hook = NULL;
  fj__compile_stuck_ms = was;
  printf("isolated compile whose first child was stuck: %.0f ms\n", ms);
  CHECK_OK(ctx, st);
  CHECK(access(stuck_marker, F_OK) == 0);  /* the first child did block */
  CHECK(out.cubin_len > 0 && out.ptx && strstr(out.ptx, ".entry k"));
  CHECK(ms >= 1000 && ms < 30000);
  fj__compiled_free(&out);
  fj_ctx_destroy(ctx);
  return 0;
}

/* One thread's compile does not hold up the context's others: a thread
 * gets a kernel from the memory cache while another's NVRTC runs, and a
 * third that asks for the kernel being compiled waits for that compile
 * instead of starting its own (before, NVRTC ran under the context's
 * lock: every other call on the context waited for it). */
typedef struct compiling_seen {
  _Atomic int in_nvrtc;  /* the log said a compile started */
  _Atomic int done;      /* the compiling thread's call returned */
  fj_ctx *ctx;
  const fj_variant *v;
  fj_kernel *k;
  fj_status st;
} compiling_seen;

static void compile_log(void *user, fj_log_level level, const char *msg)
{
  (void)level;
  if (strstr(msg, "compiling fj_attn_"))
    atomic_store(&((compiling_seen *)user)->in_nvrtc, 1);
}

static void *get_kernel(void *arg)
{
  compiling_seen *c = arg;
  c->st = fj_kernel_get(c->ctx, c->v, &c->k);
  atomic_store(&c->done, 1);
  return NULL;
}

int test_compile_threads(void)
{
  compiling_seen seen = {0};
  fj_ctx *ctx = fjt_ctx_log("sm_80", NULL, compile_log, &seen);
  CHECK(ctx);
  fj_variant small, big;
  fj_variant_default(&small, 64, FJ_F16, FJ_CAUSAL_NONE);
  fj_variant_default(&big, 128, FJ_F16, FJ_CAUSAL_BOTTOM_RIGHT);
  fj_kernel *ks, *again;
  CHECK_OK(ctx, fj_kernel_get(ctx, &small, &ks));
  atomic_store(&seen.in_nvrtc, 0);
  seen.ctx = ctx;
  seen.v = &big;
  pthread_t compiler, waiter;
  CHECK(pthread_create(&compiler, NULL, get_kernel, &seen) == 0);
  while (!atomic_load(&seen.in_nvrtc) && !atomic_load(&seen.done))
    nanosleep(&(struct timespec){0, 1000000}, NULL);
  double t0 = fj__now_ms();
  fj_status st = fj_kernel_get(ctx, &small, &again);
  double ms = fj__now_ms() - t0;
  int during = !atomic_load(&seen.done);
  compiling_seen second = {0};
  second.ctx = ctx;
  second.v = &big;
  int started = pthread_create(&waiter, NULL, get_kernel, &second) == 0;
  pthread_join(compiler, NULL);
  if (started)
    pthread_join(waiter, NULL);
  printf("a memory hit while another thread compiles: %.2f ms (compile "
         "still running: %s)\n", ms, during ? "yes" : "no");
  CHECK_OK(ctx, st);
  CHECK(again == ks);
  CHECK(during);
  CHECK(started);
  CHECK_OK(ctx, seen.st);
  CHECK_OK(ctx, second.st);
  CHECK(seen.k && second.k == seen.k);
  fj_cache_stats cs;
  fj_cache_stats_get(ctx, &cs);
  CHECK(cs.misses == 2);  /* small, big: the waiter compiled nothing */
  CHECK(cs.memory_hits == 2);
  fj_ctx_destroy(ctx);
  return 0;
}

int test_resources_parse(void)
{
  const char *log =
      "k.cu(3): warning #177-D: 12 registers of variable \"row\" unused\n"
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function 'fj_attn' for 'sm_90a'\n"
      "ptxas info    : Function properties for fj_attn\n"
      "ptxas         .     24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
      "ptxas info    : Used 168 registers, used 1 barriers, 2048 bytes smem, 400 bytes cmem[0]\n"
      "ptxas info    : Compile time = 16.970 ms\n";
  fj_resources r;
  memset(&r, 0, sizeof r);
  fj__parse_resources(log, NULL, &r);
  CHECK(r.registers == 168);
  CHECK(r.barriers == 1);
  CHECK(r.shared_static == 2048);
  CHECK(r.local_bytes == 24);
  CHECK(r.spill_store_bytes == 8);
  CHECK(r.spill_load_bytes == 12);
  memset(&r, 0, sizeof r);
  fj__parse_resources("", NULL, &r);
  CHECK(r.registers == 0 && r.shared_static == 0);
  /* Two entry functions (FP8 attention's _vt pass first): the kernel's own
   * lines only, whichever comes last. */
  static const char two[] =
      "ptxas info    : Compiling entry function 'fj_attn_vt' for 'sm_90a'\n"
      "ptxas         .     0 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
      "ptxas info    : Used 32 registers, used 1 barriers, 9216 bytes smem\n"
      "ptxas info    : Compiling entry function 'fj_attn' for 'sm_90a'\n"
      "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 168 registers, used 1 barriers\n";
  memset(&r, 0, sizeof r);
  fj__parse_resources(two, "fj_attn", &r);
  CHECK(r.registers == 168 && r.shared_static == 0 && r.spill_store_bytes == 0);
  memset(&r, 0, sizeof r);
  fj__parse_resources(two, "fj_attn_vt", &r);
  CHECK(r.registers == 32 && r.shared_static == 9216 && r.spill_store_bytes == 4);
  return 0;
}
