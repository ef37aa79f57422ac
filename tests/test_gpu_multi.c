/*
 * test_gpu_multi.c -- several GPUs in one process (label gpu; they skip,
 * exit 77, saying so, where fewer than two devices are visible): one
 * context per device, each probing its own layout tables; calls made from
 * a thread whose current device is the other one; two threads launching
 * on both devices at once; memory of the wrong device refused with a
 * message before anything is written; two processes tuning on devices 0
 * and 1 into one tuning database.  Outputs are poisoned (0xff: NaN) before
 * every run and checked against the float64 reference.
 */
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "layout.h"
#include "runner.h"

/* ---- contexts ------------------------------------------------------------------- */

static int visible_devices(void)
{
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess)
    n = 0;
  return n;
}

static int need_two(void)
{
  int n = visible_devices();
  if (n >= 2)
    return 0;
  return fjt_skip("%d CUDA device(s) visible; this test needs 2 (the "
                  "nvidia-h200-x2 machines)", n);
}

/* Contexts on devices 0 and 1 (dir NULL: memory-only caches): 0, or
 * FJT_SKIP with fewer than two devices, or 1 (printed). */
static int two_contexts(const char *dir, fj_ctx *ctx[2])
{
  ctx[0] = ctx[1] = NULL;
  int rc = need_two();
  for (int d = 0; d < 2 && !rc; d++) {
    fj_ctx_opts o;
    fj_ctx_opts_init(&o);
    o.device = d;
    o.cache_dir = dir;
    o.disk_cache = dir != NULL;
    o.jit_tiers = 0;  /* the chosen kernels (fjt_gpu_ctx) */
    if (fj_ctx_create(&ctx[d], &o) != FJ_OK) {
      fprintf(stderr, "context on device %d: %s\n", d, fj_errmsg(NULL));
      rc = 1;
    }
  }
  if (rc) {
    fj_ctx_destroy(ctx[0]);
    fj_ctx_destroy(ctx[1]);
  }
  return rc;
}

/* The runtime's current device (its primary context made current). */
static int use_device(int d)
{
  return cudaSetDevice(d) != cudaSuccess || cudaFree(NULL) != cudaSuccess;
}

static int current_device(void)
{
  int d = -1;
  cudaGetDevice(&d);
  return d;
}

/* ---- one problem, its inputs on one device, its reference ------------------------ */

typedef struct mcase {
  fj_problem p;
  int dev;
  size_t nq, nk, no;   /* elements of Q, of K (and V), of O */
  void *q, *k, *v;     /* host, in p.dtype */
  double *ref;         /* O in float64, [b][h][row][d] (BHSD) */
  void *dq, *dk, *dv;  /* on dev */
} mcase;

static double uniform(uint64_t *s)
{
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return ((double)(*s >> 11) / 9007199254740992.0) * 2 - 1;
}

static void *random_host(fj_dtype dt, size_t n, uint64_t *seed)
{
  float *f = malloc(n * sizeof *f);
  void *out = malloc(n * 2);
  for (size_t i = 0; f && i < n; i++)
    f[i] = (float)uniform(seed);
  if (f && out)
    fj_convert(dt, out, FJ_F32, f, n);
  free(f);
  return out;
}

static int upload(void **dev, const void *host, size_t bytes)
{
  return cudaMalloc(dev, bytes) != cudaSuccess ||
         cudaMemcpy(*dev, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess;
}

/* Inputs of a BHSD problem on device dev, and its reference. */
static int mcase_init(mcase *c, int dev, const fj_problem *p, uint64_t seed)
{
  memset(c, 0, sizeof *c);
  c->p = *p;
  c->dev = dev;
  c->nq = (size_t)p->batch * (size_t)p->heads_q * (size_t)p->seq_q * (size_t)p->head_dim;
  c->nk = (size_t)p->batch * (size_t)p->heads_kv * (size_t)p->seq_kv * (size_t)p->head_dim;
  c->no = c->nq;
  c->q = random_host(p->dtype, c->nq, &seed);
  c->k = random_host(p->dtype, c->nk, &seed);
  c->v = random_host(p->dtype, c->nk, &seed);
  c->ref = malloc(c->no * sizeof *c->ref);
  if (!c->q || !c->k || !c->v || !c->ref)
    return 1;
  fj_status st = fj_reference_fwd(p, c->q, c->k, c->v, NULL, NULL, 0,
                                  p->seq_q, c->ref, NULL);
  if (st != FJ_OK) {
    fprintf(stderr, "reference: %s\n", fj_errmsg(NULL));
    return 1;
  }
  return use_device(dev) || upload(&c->dq, c->q, c->nq * 2) ||
         upload(&c->dk, c->k, c->nk * 2) || upload(&c->dv, c->v, c->nk * 2);
}

static void mcase_free(mcase *c)
{
  cudaSetDevice(c->dev);
  cudaFree(c->dq);
  cudaFree(c->dk);
  cudaFree(c->dv);
  free(c->q);
  free(c->k);
  free(c->v);
  free(c->ref);
}

/* Relative error of an output (host copy, p.dtype) against the reference;
 * a non-finite value (the poison left unwritten) makes it infinite. */
static double rel_error(const mcase *c, const void *out)
{
  double d2 = 0, r2 = 0;
  for (size_t i = 0; i < c->no; i++) {
    float f;
    fj_convert(FJ_F32, &f, c->p.dtype, (const uint16_t *)out + i, 1);
    if (!isfinite(f))
      return INFINITY;
    d2 += ((double)f - c->ref[i]) * ((double)f - c->ref[i]);
    r2 += c->ref[i] * c->ref[i];
  }
  return sqrt(d2 / (r2 > 0 ? r2 : 1));
}

/* Waits for stream on c's device, copies dout back and checks it. */
static int verify(const mcase *c, const void *dout, cudaStream_t stream,
                  void *host, const char *label)
{
  cudaError_t e = cudaSetDevice(c->dev);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(host, dout, c->no * 2, cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) {
    fprintf(stderr, "%s: %s\n", label, cudaGetErrorString(e));
    return 1;
  }
  double rel = rel_error(c, host);
  if (!(rel < 1e-2)) {
    fprintf(stderr, "%s: rel_err=%.2e FAIL\n", label, rel);
    return 1;
  }
  return 0;
}

/* An output buffer on c's device, poisoned. */
static int poisoned(const mcase *c, void **dout)
{
  return cudaSetDevice(c->dev) != cudaSuccess ||
         cudaMalloc(dout, c->no * 2) != cudaSuccess ||
         cudaMemset(*dout, 0xff, c->no * 2) != cudaSuccess;
}

/* Whether every byte of dout (on device dev) is still the poison. */
static int untouched(int dev, const void *dout, size_t bytes)
{
  unsigned char *h = malloc(bytes);
  int same = h && cudaSetDevice(dev) == cudaSuccess &&
             cudaDeviceSynchronize() == cudaSuccess &&
             cudaMemcpy(h, dout, bytes, cudaMemcpyDeviceToHost) == cudaSuccess;
  for (size_t i = 0; same && i < bytes; i++)
    same = h[i] == 0xff;
  free(h);
  return same;
}

/* Device 0's problem and device 1's: different kernels, so that each
 * context's caches hold their own. */
static void problems(fj_problem p[2])
{
  fj_problem_init(&p[0], 1, 4, 4, 256, 256, 64, FJ_F16, FJ_BHSD);
  fj_problem_init(&p[1], 2, 8, 2, 200, 333, 128, FJ_BF16, FJ_BHSD);
  p[1].causal = FJ_CAUSAL_BOTTOM_RIGHT;
}

/* ---- two contexts, each on its own device ------------------------------------------ */

/* Each context probes its tables from a thread whose current device is
 * the other one, and leaves that device current. */
static int probe_from_other(fj_ctx *ctx[2], fj_lut luts[2][FJ_FRAG_COUNT + 1])
{
  char why[256];
  for (int d = 0; d < 2; d++) {
    CHECK(use_device(1 - d) == 0);
    for (int f = 1; f <= FJ_FRAG_COUNT; f++) {
      fj_lut *l = &luts[d][f];
      CHECK_OK(ctx[d], fj_layout_get(ctx[d], (fj_frag)f, l));
      CHECK(l->origin == FJ_LUT_PROBED && l->frag == (fj_frag)f);
      CHECK(fj__lut_validate(l, why, sizeof why) == 0);
    }
    CHECK(current_device() == 1 - d);
  }
  return 0;
}

int test_gpu_multi_contexts(void)
{
  fj_ctx *ctx[2];
  int rc = two_contexts(NULL, ctx);  /* memory-only: each must probe */
  if (rc)
    return rc;
  fj_device_info info[2];
  for (int d = 0; d < 2; d++) {
    CHECK_OK(ctx[d], fj_device_get(ctx[d], &info[d]));
    CHECK(info[d].ordinal == d);
    printf("context %d: device %d, %s, %s\n", d, info[d].ordinal,
           info[d].name, fj_ctx_arch(ctx[d]));
  }
  static fj_lut luts[2][FJ_FRAG_COUNT + 1];
  CHECK(probe_from_other(ctx, luts) == 0);
  int same = 1;
  for (int f = 1; f <= FJ_FRAG_COUNT; f++)
    same &= luts[0][f].slots == luts[1][f].slots &&
            !memcmp(luts[0][f].map, luts[1][f].map, sizeof luts[0][f].map);
  printf("%d fragment kinds probed on each device; the tables agree: %s\n",
         FJ_FRAG_COUNT, same ? "yes" : "no");
  if (!strcmp(info[0].name, info[1].name))
    CHECK(same);  /* one model, one layout */
  /* One problem on each, called while the other device is current; NULL
   * stream: the legacy stream of the context's own device. */
  fj_problem p[2];
  problems(p);
  mcase c[2];
  void *out[2] = {NULL, NULL}, *host[2];
  int failed = 0;
  for (int d = 0; d < 2; d++) {
    CHECK(mcase_init(&c[d], d, &p[d], 100 + (uint64_t)d) == 0);
    CHECK(poisoned(&c[d], &out[d]) == 0);
    host[d] = malloc(c[d].no * 2);
  }
  for (int d = 0; d < 2; d++) {
    CHECK(use_device(1 - d) == 0);
    CHECK_OK(ctx[d], fj_attention_fwd(ctx[d], &c[d].p, c[d].dq, c[d].dk,
                                      c[d].dv, out[d], NULL, NULL));
    CHECK(current_device() == 1 - d);
    char label[64];
    snprintf(label, sizeof label, "device %d, called from device %d", d, 1 - d);
    CHECK(cudaSetDevice(d) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess);
    int bad = verify(&c[d], out[d], NULL, host[d], label);
    printf("%s: %s\n", label, bad ? "FAIL" : "ok");
    failed += bad;
  }
  for (int d = 0; d < 2; d++) {
    cudaSetDevice(d);
    cudaFree(out[d]);
    free(host[d]);
    mcase_free(&c[d]);
  }
  /* Destroyed from a thread whose current device is the other one. */
  use_device(1);
  fj_ctx_destroy(ctx[0]);
  use_device(0);
  fj_ctx_destroy(ctx[1]);
  return failed != 0;
}

/* ---- two threads launching on both devices at once ----------------------------------- */

enum { ITERS = 300 };

typedef struct worker {
  int t;
  fj_ctx **ctx;
  const mcase *c;         /* the two devices' problems */
  void *out[2];           /* this thread's outputs, one per device */
  cudaStream_t stream[2];
  void *host[2];
  int failures, calls;
  char first[512];
} worker;

/* Iteration j: device (t + j) % 2, every other pair of calls made while
 * the other device is current; the output poisoned before, checked
 * after. */
static int one_iteration(worker *w, int j)
{
  int d = (w->t + j) % 2;
  const mcase *c = &w->c[d];
  if (cudaSetDevice(d) != cudaSuccess ||
      cudaMemsetAsync(w->out[d], 0xff, c->no * 2, w->stream[d]) != cudaSuccess)
    return 1;
  if (j % 4 >= 2 && cudaSetDevice(1 - d) != cudaSuccess)
    return 1;
  fj_status st = fj_attention_fwd(w->ctx[d], &c->p, c->dq, c->dk, c->dv,
                                  w->out[d], NULL, w->stream[d]);
  w->calls++;
  if (st != FJ_OK) {
    snprintf(w->first, sizeof w->first, "thread %d call %d on device %d: %s",
             w->t, j, d, fj_errmsg(w->ctx[d]));
    return 1;
  }
  char label[64];
  snprintf(label, sizeof label, "thread %d call %d on device %d", w->t, j, d);
  return verify(c, w->out[d], w->stream[d], w->host[d], label);
}

static void *work(void *arg)
{
  worker *w = arg;
  for (int j = 0; j < ITERS && w->failures < 5; j++)
    w->failures += one_iteration(w, j);
  return NULL;
}

static int worker_init(worker *w, int t, fj_ctx **ctx, const mcase *c)
{
  memset(w, 0, sizeof *w);
  w->t = t;
  w->ctx = ctx;
  w->c = c;
  for (int d = 0; d < 2; d++) {
    if (poisoned(&c[d], &w->out[d]) ||
        cudaStreamCreate(&w->stream[d]) != cudaSuccess ||
        !(w->host[d] = malloc(c[d].no * 2)))
      return 1;
  }
  return 0;
}

static void worker_free(worker *w)
{
  for (int d = 0; d < 2; d++) {
    cudaSetDevice(d);
    cudaStreamDestroy(w->stream[d]);
    cudaFree(w->out[d]);
    free(w->host[d]);
  }
}

int test_gpu_multi_threads(void)
{
  fj_ctx *ctx[2];
  int rc = two_contexts(fjt_tmpdir(), ctx);
  if (rc)
    return rc;
  fj_problem p[2];
  problems(p);
  mcase c[2];
  for (int d = 0; d < 2; d++)
    CHECK(mcase_init(&c[d], d, &p[d], 200 + (uint64_t)d) == 0);
  worker w[2];
  pthread_t th[2];
  for (int t = 0; t < 2; t++)
    CHECK(worker_init(&w[t], t, ctx, c) == 0);
  for (int t = 0; t < 2; t++)
    CHECK(pthread_create(&th[t], NULL, work, &w[t]) == 0);
  int failed = 0;
  for (int t = 0; t < 2; t++) {
    pthread_join(th[t], NULL);
    printf("thread %d: %d calls on both devices, %d wrong or failed\n", t,
           w[t].calls, w[t].failures);
    if (w[t].first[0])
      fprintf(stderr, "%s\n", w[t].first);
    failed += w[t].failures != 0 || w[t].calls != ITERS;
    worker_free(&w[t]);
  }
  for (int d = 0; d < 2; d++)
    mcase_free(&c[d]);
  fj_ctx_destroy(ctx[0]);
  fj_ctx_destroy(ctx[1]);
  return failed != 0;
}

/* ---- memory of the wrong device ---------------------------------------------------- */

/* A call that must be refused, naming its argument, with o untouched. */
#define REFUSED(ctx, call, text, odev, o, bytes)                           \
  do {                                                                     \
    CHECK_ST(ctx, call, FJ_ERR_INVALID_ARG);                               \
    CHECK_MSG(ctx, text);                                                  \
    printf("refused: %s\n", fj_errmsg(ctx));                              \
    CHECK(untouched(odev, o, bytes));                                      \
  } while (0)

/* A decode problem whose plan needs a workspace: a workspace of device 1
 * is refused.  Skipped (said so) where the plan needs none. */
static int wrong_workspace(fj_ctx *ctx0)
{
  fj_problem p;
  fj_problem_init(&p, 1, 8, 8, 1, 4096, 128, FJ_F16, FJ_BHSD);
  fj_plan plan;
  CHECK_OK(ctx0, fj_attention_plan(ctx0, &p, &plan));
  if (!plan.workspace_bytes) {
    printf("note: the decode plan needs no workspace here; not checked\n");
    return 0;
  }
  size_t nq = 8 * 128 * 2, nk = (size_t)8 * 4096 * 128 * 2;
  void *q, *k, *o, *ws;
  CHECK(use_device(0) == 0 && cudaMalloc(&q, nq) == cudaSuccess &&
        cudaMalloc(&k, nk) == cudaSuccess && cudaMalloc(&o, nq) == cudaSuccess);
  CHECK(cudaMemset(q, 0, nq) == cudaSuccess && cudaMemset(k, 0, nk) == cudaSuccess &&
        cudaMemset(o, 0xff, nq) == cudaSuccess);
  CHECK(use_device(1) == 0 && cudaMalloc(&ws, plan.workspace_bytes) == cudaSuccess);
  REFUSED(ctx0, fj_attention_fwd_plan(ctx0, &p, &plan, q, k, k, o, NULL, ws,
                                      plan.workspace_bytes, NULL),
          "fj_attention_fwd_plan: workspace is memory of device 1; this "
          "context runs on device 0", 0, o, nq);
  cudaFree(ws);
  cudaSetDevice(0);
  cudaFree(q);
  cudaFree(k);
  cudaFree(o);
  return 0;
}

/* A tensor parameter of a modification on device 1. */
static int wrong_param(fj_ctx *ctx0, const mcase *c, void *o)
{
  float *bias;
  CHECK(use_device(1) == 0 &&
        cudaMalloc((void **)&bias, 4 * sizeof(float)) == cudaSuccess);
  fj_mod_param param;
  memset(&param, 0, sizeof param);
  param.name = "bias";
  param.type = FJ_MOD_F32;
  param.rank = 1;
  param.extents[0] = 4;
  param.data = bias;
  fj_mods m;
  fj_mods_init(&m);
  m.score = "s + bias(h)";
  m.params = &param;
  m.num_params = 1;
  fj_problem p = c->p;
  p.mods = &m;
  REFUSED(ctx0, fj_attention_fwd(ctx0, &p, c->dq, c->dk, c->dv, o, NULL, NULL),
          "fj_attention_fwd: mods.params[0] is memory of device 1; this "
          "context runs on device 0", 0, o, c->no * 2);
  cudaSetDevice(1);
  cudaFree(bias);
  return 0;
}

/* Managed memory allocated while device 1 was current runs on device 0
 * (it migrates); the output is right. */
static int managed_passes(fj_ctx *ctx0, const mcase *c, void *o, void *host)
{
  int concurrent = 0;
  cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, 0);
  if (!concurrent) {
    printf("note: no concurrent managed access; managed memory not checked\n");
    return 0;
  }
  void *mq;
  CHECK(use_device(1) == 0 && cudaMallocManaged(&mq, c->nq * 2, cudaMemAttachGlobal) == cudaSuccess);
  memcpy(mq, c->q, c->nq * 2);
  CHECK(use_device(0) == 0 && cudaMemset(o, 0xff, c->no * 2) == cudaSuccess);
  CHECK_OK(ctx0, fj_attention_fwd(ctx0, &c->p, mq, c->dk, c->dv, o, NULL, NULL));
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(verify(c, o, NULL, host, "managed q") == 0);
  printf("managed memory of device 1's making: accepted, output right\n");
  cudaFree(mq);
  return 0;
}

int test_gpu_multi_wrong_device(void)
{
  fj_ctx *ctx[2];
  int rc = two_contexts(fjt_tmpdir(), ctx);
  if (rc)
    return rc;
  fj_problem p[2];
  problems(p);
  mcase c;
  CHECK(mcase_init(&c, 0, &p[0], 300) == 0);
  void *o0, *o1, *q1, *host = malloc(c.no * 2);
  float *lse1;
  size_t nlse = (size_t)p[0].batch * (size_t)p[0].heads_q * (size_t)p[0].seq_q;
  CHECK(poisoned(&c, &o0) == 0);
  CHECK(use_device(1) == 0 && upload(&q1, c.q, c.nq * 2) == 0 &&
        cudaMalloc(&o1, c.no * 2) == cudaSuccess &&
        cudaMemset(o1, 0xff, c.no * 2) == cudaSuccess &&
        cudaMalloc((void **)&lse1, nlse * sizeof(float)) == cudaSuccess);
  /* From device 0's side, with device 0 current, then device 1. */
  CHECK(use_device(0) == 0);
  REFUSED(ctx[0], fj_attention_fwd(ctx[0], &c.p, q1, c.dk, c.dv, o0, NULL, NULL),
          "fj_attention_fwd: q is memory of device 1; this context runs on "
          "device 0", 0, o0, c.no * 2);
  CHECK(use_device(1) == 0);
  REFUSED(ctx[0], fj_attention_fwd(ctx[0], &c.p, c.dq, c.dk, c.dv, o1, NULL, NULL),
          "fj_attention_fwd: o is memory of device 1; this context runs on "
          "device 0", 1, o1, c.no * 2);
  REFUSED(ctx[0], fj_attention_fwd(ctx[0], &c.p, c.dq, c.dk, c.dv, o0, lse1, NULL),
          "fj_attention_fwd: lse is memory of device 1; this context runs on "
          "device 0", 0, o0, c.no * 2);
  fj_variant v;
  CHECK_OK(ctx[0], fj_attention_variant(ctx[0], &c.p, &v, NULL));
  REFUSED(ctx[0], fj_attention_fwd_variant(ctx[0], &c.p, &v, c.dq, q1, c.dv, o0, NULL, NULL),
          "fj_attention_fwd_variant: k is memory of device 1; this context "
          "runs on device 0", 0, o0, c.no * 2);
  /* From device 1's side: all of device 0's memory is the wrong one. */
  REFUSED(ctx[1], fj_attention_fwd(ctx[1], &c.p, c.dq, c.dk, c.dv, o1, NULL, NULL),
          "fj_attention_fwd: q is memory of device 0; this context runs on "
          "device 1", 1, o1, c.no * 2);
  int failed = wrong_workspace(ctx[0]) || wrong_param(ctx[0], &c, o0) ||
               managed_passes(ctx[0], &c, o0, host);
  /* The right memory after all that: the contexts still work. */
  CHECK(use_device(0) == 0 && cudaMemset(o0, 0xff, c.no * 2) == cudaSuccess);
  CHECK(use_device(1) == 0);
  CHECK_OK(ctx[0], fj_attention_fwd(ctx[0], &c.p, c.dq, c.dk, c.dv, o0, NULL, NULL));
  CHECK(use_device(0) == 0 && cudaDeviceSynchronize() == cudaSuccess);
  failed |= verify(&c, o0, NULL, host, "device 0 after the refusals");
  cudaFree(o0);
  cudaSetDevice(1);
  cudaFree(o1);
  cudaFree(q1);
  cudaFree(lse1);
  free(host);
  mcase_free(&c);
  fj_ctx_destroy(ctx[0]);
  fj_ctx_destroy(ctx[1]);
  return failed;
}

/* ---- one tuning database, two processes, two GPUs ------------------------------------- */

#ifndef FJT_CLI
#define FJT_CLI ""
#endif

/* `flashjit tune` of shape on device dev, into dir, its output in
 * dir/tune-<dev>.log; the child's pid. */
static pid_t tune_process(const char *cli, const char *dir, int dev,
                          const char *shape)
{
  char device[16], log[4300];
  snprintf(device, sizeof device, "%d", dev);
  snprintf(log, sizeof log, "%s/tune-%d.log", dir, dev);
  pid_t pid = fork();
  if (pid == 0) {
    /* Only async-signal-safe calls between fork and exec: this process
     * has CUDA initialised. */
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execl(cli, "flashjit", "tune", "--shape", shape, "--device", device,
          "--cache-dir", dir, "--iters", "3", "--workers", "8", (char *)NULL);
    _exit(127);
  }
  return pid;
}

static void print_log(const char *dir, int dev)
{
  char path[4300], line[512];
  snprintf(path, sizeof path, "%s/tune-%d.log", dir, dev);
  FILE *f = fopen(path, "r");
  while (f && fgets(line, sizeof line, f))
    printf("  [device %d] %s", dev, line);
  if (f)
    fclose(f);
}

typedef struct tuned {
  int n, shape256, shape512;
} tuned;

static int tuned_entry(void *user, const fj_tune_entry *e)
{
  tuned *t = user;
  t->n++;
  t->shape256 += e->shape && !strcmp(e->shape, "1,4/4,256/256,64");
  t->shape512 += e->shape && !strcmp(e->shape, "1,4/4,512/512,64");
  printf("entry: %s (%s)\n", e->key, e->shape ? e->shape : "?");
  return 0;
}

int test_gpu_multi_tunedb(void)
{
  int rc = need_two();
  if (rc)
    return rc;
  const char *cli = getenv("FJT_CLI");
  if (!cli || !*cli)
    cli = FJT_CLI;
  if (!*cli || access(cli, X_OK) != 0)
    return fjt_skip("no flashjit command-line tool (built without "
                    "FLASHJIT_BUILD_CLI; FJT_CLI names one)");
  const char *dir = fjt_tmpdir();
  /* Two problem classes (2^8 and 2^9 rows): identical GPUs share an
   * entry's key, so one class each shows both entries kept. */
  pid_t pids[2] = {tune_process(cli, dir, 0, "1,4,256,64"),
                   tune_process(cli, dir, 1, "1,4,512,64")};
  int failed = 0;
  for (int d = 0; d < 2; d++) {
    int ws = 0;
    CHECK(pids[d] > 0 && waitpid(pids[d], &ws, 0) == pids[d]);
    int ok = WIFEXITED(ws) && WEXITSTATUS(ws) == 0;
    printf("flashjit tune on device %d: %s\n", d, ok ? "ok" : "FAILED");
    if (!ok)
      print_log(dir, d);
    failed += !ok;
  }
  CHECK(failed == 0);
  fj_ctx *ctx = fjt_ctx("sm_90a", dir);
  CHECK(ctx);
  tuned t = {0, 0, 0};
  CHECK_OK(ctx, fj_tune_list(ctx, tuned_entry, &t));
  CHECK(t.n == 2 && t.shape256 == 1 && t.shape512 == 1);
  fj_ctx_destroy(ctx);
  return 0;
}
