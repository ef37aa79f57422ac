/*
 * test_tier.c -- the tiered JIT (fj_ctx_opts.jit_tiers, src/tier.c).  CPU:
 * the first kernel (templates/attention_simt.cu) of every built-in
 * modification and of plain problems compiles for sm_80 and sm_90a without
 * spills and carries the user's text, compiled quick (meta.quick: NVRTC's
 * --Ofast-compile=min from NVRTC 12.8 on, the chosen kernels never); the
 * option and its environment
 * variable refuse bad values.  GPU: with tiers on and empty caches, each
 * case's first call is answered by the first kernel, checked against the
 * float64 reference like any kernel (outputs poisoned); the calls after it
 * are too, until the chosen kernel's background compile has ended and it
 * takes over (checked again).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "compile.h"
#include "gpu_case.h"
#include "kernel.h"
#include "mods_cases.h"
#include "runner.h"
#include "tier.h"

/* The first kernel of p (its library choice's variant); no spills, its
 * name and text what the problem says. */
static int first_of(fj_ctx *ctx, const fj_problem *p, fj_kernel **k)
{
  fj_plan plan;
  CHECK_OK(ctx, fj_attention_plan(ctx, p, &plan));
  CHECK_OK(ctx, fj_kernel_get_first(ctx, &plan.variant, k));
  fj_resources r;
  fj_kernel_resources(*k, &r);
  const char *src = fj_kernel_source(*k, NULL);
  printf("%s (%s): %d registers, %d/%d spill bytes, compile %.0f ms\n",
         fj_kernel_name(*k), fj_ctx_arch(ctx), r.registers,
         r.spill_store_bytes, r.spill_load_bytes, r.compile_ms);
  CHECK(!strncmp(fj_kernel_name(*k), "fj_simt_d", 9));
  CHECK(r.spill_store_bytes == 0 && r.spill_load_bytes == 0);
  CHECK((*k)->meta.quick == 1);
  CHECK(r.threads == 256);
  const fj_mods *m = p->mods;
  if (m && m->score && m->score[0])
    CHECK(strstr(src, "#line 1 \"score\"\n") && strstr(src, m->score));
  if (m && m->mask && m->mask[0])
    CHECK(strstr(src, "#line 1 \"mask\"\n") && strstr(src, m->mask));
  if (m && m->softcap > 0)
    CHECK(strstr(fj_kernel_name(*k), "_cap"));
  return 0;
}

/* Whether NVRTC's options for arch (quick or not) name --Ofast-compile. */
static int fast_compile_opt(const char *arch, int quick)
{
  fj_nvrtc_opts o;
  fj__nvrtc_options(arch, quick, &o);
  for (int i = 0; i < o.argc; i++)
    if (!strncmp(o.argv[i], "--Ofast-compile", 15))
      return 1;
  return 0;
}

int test_tier_first_compile(void)
{
  static const char *const archs[] = {"sm_80", "sm_90a"};
  int major = 0, minor = 0;
  CHECK(sscanf(fj__nvrtc_version(), "%d.%d", &major, &minor) == 2);
  int has = major > 12 || (major == 12 && minor >= 8);
  CHECK(fast_compile_opt("sm_90a", 1) == has && !fast_compile_opt("sm_90a", 0));
  /* A chosen kernel is never quick. */
  {
    fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
    CHECK(ctx);
    fj_problem p;
    fj_problem_init(&p, 1, 8, 8, 512, 512, 64, FJ_BF16, FJ_BSHD);
    fj_plan plan;
    fj_kernel *k;
    CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
    CHECK_OK(ctx, fj_kernel_get(ctx, &plan.variant, &k));
    CHECK(k->meta.quick == 0);
    fj_ctx_destroy(ctx);
  }
  const fjt_builtin_case *builtins = fjt_builtin_cases;
  for (int a = 0; a < 2; a++) {
    fj_ctx *ctx = fjt_ctx(archs[a], NULL);
    CHECK(ctx);
    fj_kernel *k;
    for (size_t i = 0; i < FJT_BUILTIN_CASES; i++) {
      const fj_mod_builtin *b = fj_mod_builtin_find(builtins[i].name);
      CHECK(b && !b->field);
      fj_problem p;
      fj_mods m;
      fj_problem_init(&p, 4, 16, 16, 4096, 4096, 128, FJ_BF16, FJ_BHSD);
      p.causal = FJ_CAUSAL_BOTTOM_RIGHT;
      p.mods = &m;
      fj_mods_init(&m);
      m.score = b->score;
      m.mask = b->mask;
      m.params = builtins[i].prm;
      m.num_params = builtins[i].n;
      if (first_of(ctx, &p, &k))
        return 1;
    }
    /* The built-in window, softcap and sinks at once; plain problems of
     * the smallest and largest head dims. */
    static const float sinks[16];
    fj_problem p;
    fj_mods m;
    fj_problem_init(&p, 1, 16, 2, 1000, 3000, 64, FJ_F16, FJ_BSHD);
    p.mods = &m;
    fj_mods_init(&m);
    m.window_left = 256;
    m.window_right = 0;
    m.softcap = 30.f;
    m.sinks = sinks;
    if (first_of(ctx, &p, &k))
      return 1;
    CHECK(strstr(fj_kernel_name(k), "_win") && strstr(fj_kernel_name(k), "_sink"));
    fj_problem_init(&p, 2, 8, 8, 100, 100, 32, FJ_F16, FJ_BHSD);
    if (first_of(ctx, &p, &k))
      return 1;
    fj_problem_init(&p, 2, 8, 8, 100, 100, 256, FJ_BF16, FJ_BHSD);
    p.causal = FJ_CAUSAL_TOP_LEFT;
    if (first_of(ctx, &p, &k))
      return 1;
    fj_ctx_destroy(ctx);
  }
  return 0;
}

int test_tier_opts(void)
{
  fj_ctx_opts o;
  fj_ctx_opts_init(&o);
  CHECK(o.jit_tiers == 1);  /* on by default */
  CHECK_ST(NULL, fj_ctx_tiers_wait(NULL), FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "fj_ctx_tiers_wait: ctx is NULL");
  o.device = -1;
  o.arch = "sm_90a";
  o.disk_cache = 0;
  o.jit_tiers = 2;
  fj_ctx *ctx;
  CHECK_ST(NULL, fj_ctx_create(&ctx, &o), FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "jit_tiers 2 is invalid");
  CHECK(ctx == NULL);
  o.jit_tiers = 1;
  CHECK_OK(NULL, fj_ctx_create(&ctx, &o));
  fj_ctx_destroy(ctx);
  CHECK(setenv("FLASHJIT_JIT_TIERS", "yes", 1) == 0);
  fj_status st = fj_ctx_create(&ctx, &o);
  int said = strstr(fj_errmsg(NULL), "FLASHJIT_JIT_TIERS=yes is invalid: 0 or 1") != NULL;
  unsetenv("FLASHJIT_JIT_TIERS");
  CHECK(st == FJ_ERR_INVALID_ARG && said);
  /* NULL arguments of the inspection call. */
  CHECK_OK(NULL, fj_ctx_create(&ctx, &o));
  fj_variant v;
  fj_variant_default(&v, 64, FJ_F16, FJ_CAUSAL_NONE);
  fj_kernel *k;
  CHECK_ST(ctx, fj_kernel_get_first(ctx, NULL, &k), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "fj_kernel_get_first: v is NULL");
  CHECK_ST(ctx, fj_kernel_get_first(ctx, &v, NULL), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "fj_kernel_get_first: kernel is NULL");
  /* A variant the checks refuse is refused here too. */
  v.head_dim = 44;
  CHECK_ST(ctx, fj_kernel_get_first(ctx, &v, &k), FJ_ERR_INVALID_ARG);
  /* Nothing compiling: returns at once. */
  CHECK_OK(ctx, fj_ctx_tiers_wait(ctx));
  /* Which calls the first kernel may answer: up to 2^41 FLOPs (4 B Hq D
   * times the (query, key) pairs the causal mask leaves), not
   * deterministic problems. */
  struct {
    int b, sq, skv;
    fj_causal causal;
    int deterministic, serves;
  } rule[] = {
      {4, 8192, 8192, FJ_CAUSAL_NONE, 0, 1},        /* 2^41 exactly */
      {5, 8192, 8192, FJ_CAUSAL_NONE, 0, 0},        /* above */
      {5, 8192, 8192, FJ_CAUSAL_TOP_LEFT, 0, 1},    /* about half: below */
      {7, 8192, 8192, FJ_CAUSAL_BOTTOM_RIGHT, 0, 1},
      {8, 8192, 8192, FJ_CAUSAL_BOTTOM_RIGHT, 0, 0}, /* S(S+1)/2 pairs: above */
      /* Few queries at the end of many keys see nearly all of them, and
       * many queries over few keys most of them: not half. */
      {5, 1024, 65536, FJ_CAUSAL_BOTTOM_RIGHT, 0, 0},
      {4, 16384, 4096, FJ_CAUSAL_TOP_LEFT, 0, 1},
      {5, 16384, 4096, FJ_CAUSAL_TOP_LEFT, 0, 0},
      {1, 300, 300, FJ_CAUSAL_NONE, 1, 0},          /* deterministic */
      {1, 300, 300, FJ_CAUSAL_NONE, 0, 1},
  };
  for (size_t i = 0; i < sizeof rule / sizeof rule[0]; i++) {
    fj_problem p;
    fj_problem_init(&p, rule[i].b, 16, 16, rule[i].sq, rule[i].skv, 128, FJ_BF16, FJ_BHSD);
    p.causal = rule[i].causal;
    p.deterministic = rule[i].deterministic;
    fj_plan plan;
    CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
    if (fj__tier_serves(ctx, &p, &plan.variant) != rule[i].serves) {
      fprintf(stderr, "rule %zu (b %d, %.3g FLOPs, causal %d, deterministic %d): "
              "served %d, expected %d\n", i, rule[i].b, fj__tier_flops(&p),
              (int)p.causal, p.deterministic, !rule[i].serves, rule[i].serves);
      return 1;
    }
  }
  fj_ctx_destroy(ctx);
  /* Off: nothing is served. */
  o.jit_tiers = 0;
  CHECK_OK(NULL, fj_ctx_create(&ctx, &o));
  fj_problem p;
  fj_problem_init(&p, 1, 16, 16, 300, 300, 128, FJ_BF16, FJ_BHSD);
  fj_plan plan;
  CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
  CHECK(!fj__tier_serves(ctx, &p, &plan.variant));
  fj_ctx_destroy(ctx);
  return 0;
}

/* ---- on a GPU ---------------------------------------------------------------- */

typedef struct tier_case {
  const char *name;
  int b, hq, hkv, sq, skv, d;
  fj_dtype dt;
  fj_causal causal;
  float input_scale;
  const char *score, *mask;
  float softcap;
  int window_left, window_right;
  int sinks;
} tier_case;

static double seconds(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t firsts(fj_ctx *ctx)
{
  fj_cache_stats s;
  fj_cache_stats_get(ctx, &s);
  return s.first_launches;
}

/* How tier_run makes its calls: as they come; captured into a CUDA graph;
 * from a thread that records its launches; with fj_problem.deterministic
 * (those three must wait for the chosen kernel); as they come, with
 * fj_ctx_tiers_wait after the first (the second must be the chosen
 * kernel's). */
enum { CALLS_PLAIN, CALLS_CAPTURED, CALLS_RECORDED, CALLS_DETERMINISTIC, CALLS_WAITED };

static const char *const calls_name[] = {"plain", "captured", "recorded",
                                         "deterministic", "waited"};

/* One case: its first call on the first kernel, then calls until the
 * chosen kernel answers (at most 120 s), each checked; captured or
 * recorded, one call, on the chosen kernel. */
static int tier_run_as(fj_ctx *ctx, const tier_case *tc, const fj_mods *hm,
                       const fj_mods *dm, uint64_t *seed, int how)
{
  gpu_case c;
  char label[200];
  int bad = 0;
  double t0 = seconds();
  for (int call = 0;; call++) {
    memset(&c, 0, sizeof c);
    fj_problem_init(&c.p, tc->b, tc->hq, tc->hkv, tc->sq, tc->skv, tc->d, tc->dt, FJ_BHSD);
    c.p.causal = tc->causal;
    c.p.mods = dm;
    c.host_mods = hm;
    c.input_scale = tc->input_scale;
    c.capture = how == CALLS_CAPTURED;
    c.p.deterministic = how == CALLS_DETERMINISTIC;
    int waits = how != CALLS_PLAIN && how != CALLS_WAITED;
    uint64_t before = firsts(ctx);
    snprintf(label, sizeof label, "%s, call %d", tc->name, call + 1);
    fj_launches rec;
    if (how == CALLS_RECORDED)
      fj_launch_record(&rec);
    bad |= fjt_gpu_run(ctx, &c, NULL, NULL, seed, label,
                       waits ? "chosen" : call ? "later" : "first");
    fj_launch_record(NULL);
    uint64_t first = firsts(ctx) - before;
    if (waits) {
      if (first) {
        fprintf(stderr, "%s: the first kernel answered a %s call\n", tc->name,
                calls_name[how]);
        return 1;
      }
      if (how == CALLS_RECORDED && rec.count != 1) {
        fprintf(stderr, "%s: the record holds %d launches\n", tc->name, rec.count);
        return 1;
      }
      printf("%s: the chosen kernel answered the %s call\n", tc->name,
             calls_name[how]);
      return bad;
    }
    if (how == CALLS_WAITED && call == 1) {
      if (first) {
        fprintf(stderr, "%s: the first kernel answered after fj_ctx_tiers_wait\n",
                tc->name);
        return 1;
      }
      printf("%s: the chosen kernel answered the call after fj_ctx_tiers_wait\n",
             tc->name);
      return bad;
    }
    if (call == 0 && first != 1) {
      fprintf(stderr, "%s: the first call did not run the first kernel\n", tc->name);
      return 1;
    }
    if (how == CALLS_WAITED) {
      fj_status st = fj_ctx_tiers_wait(ctx);
      if (st != FJ_OK) {
        fprintf(stderr, "%s: fj_ctx_tiers_wait: %s\n", tc->name, fj_errmsg(ctx));
        return 1;
      }
      continue;
    }
    if (!first) {
      printf("%s: the chosen kernel answered call %d, %.2f s after the first\n",
             tc->name, call + 1, seconds() - t0);
      return bad;
    }
    if (seconds() - t0 > 120) {
      fprintf(stderr, "%s: the chosen kernel did not take over in 120 s\n", tc->name);
      return 1;
    }
    struct timespec nap = {0, 200000000};
    nanosleep(&nap, NULL);
  }
}

/* A device copy of host; 0 on success. */
static int device_copy(void **dev, const void *host, size_t bytes)
{
  return cudaMalloc(dev, bytes) != cudaSuccess ||
         cudaMemcpy(*dev, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess;
}

static int tier_run(fj_ctx *ctx, const tier_case *tc, const fj_mods *hm,
                    const fj_mods *dm, uint64_t *seed)
{
  return tier_run_as(ctx, tc, hm, dm, seed, CALLS_PLAIN);
}

/* One plain call of (1, h, 300, 300, d) bf16 causal with deterministic
 * det; 0 when right. */
static int keep_call(fj_ctx *ctx, int h, int d, int det, uint64_t *seed,
                     const char *label)
{
  gpu_case c;
  memset(&c, 0, sizeof c);
  fj_problem_init(&c.p, 1, h, h, 300, 300, d, FJ_BF16, FJ_BHSD);
  c.p.causal = FJ_CAUSAL_TOP_LEFT;
  c.p.deterministic = det;
  return fjt_gpu_run(ctx, &c, NULL, NULL, seed, label, det ? "chosen" : "first");
}

/* A call the first kernel does not answer (deterministic) joins its
 * variant's compile already running instead of compiling it again (so
 * fj_ctx_tiers_wait finds nothing left: no count moves); a context
 * destroyed while a compile runs leaves that kernel in the disk cache
 * (the next context's first call finds it there: no first kernel). */
static int tier_keeps(uint64_t *seed)
{
  const char *dir = fjt_tmpdir();
  fj_ctx_opts o;
  fj_ctx_opts_init(&o);
  o.cache_dir = dir;
  o.jit_tiers = 1;
  fj_ctx *ctx;
  CHECK_OK(NULL, fj_ctx_create(&ctx, &o));
  int bad = keep_call(ctx, 4, 128, 0, seed, "joined: first call");
  CHECK(firsts(ctx) == 1);
  bad |= keep_call(ctx, 4, 128, 1, seed, "joined: the same problem, deterministic");
  fj_cache_stats s0, s1;
  fj_cache_stats_get(ctx, &s0);
  CHECK(s0.first_launches == 1 && s0.background_compiles == 1);
  CHECK_OK(ctx, fj_ctx_tiers_wait(ctx));
  fj_cache_stats_get(ctx, &s1);
  if (s1.misses != s0.misses || s1.memory_hits != s0.memory_hits) {
    fprintf(stderr, "joined: fj_ctx_tiers_wait finished a second compile of the "
            "variant (misses %llu -> %llu)\n", (unsigned long long)s0.misses,
            (unsigned long long)s1.misses);
    bad = 1;
  }
  bad |= keep_call(ctx, 4, 64, 0, seed, "kept: first call, then destroyed");
  CHECK(firsts(ctx) == 2);
  fj_ctx_destroy(ctx);  /* its d64 compile still running, likely */
  CHECK_OK(NULL, fj_ctx_create(&ctx, &o));
  bad |= keep_call(ctx, 4, 64, 0, seed, "kept: the next context's first call");
  fj_cache_stats_get(ctx, &s1);
  if (s1.first_launches != 0 || s1.disk_hits < 1) {
    fprintf(stderr, "kept: the chosen kernel was not on disk (first launches %llu, "
            "disk hits %llu)\n", (unsigned long long)s1.first_launches,
            (unsigned long long)s1.disk_hits);
    bad = 1;
  }
  fj_ctx_destroy(ctx);
  printf("tiers: a deterministic call joined the running compile; a destroyed "
         "context's compile reached the disk cache\n");
  return bad;
}

static void sink_values(float *s, int n)
{
  for (int i = 0; i < n; i++)
    s[i] = (float)(i % 5) - 2.5f;
}

int test_gpu_jit_tiers(void)
{
  fj_ctx_opts o;
  fj_ctx_opts_init(&o);
  o.cache_dir = fjt_tmpdir();
  o.jit_tiers = 1;
  fj_ctx *ctx;
  fj_status st = fj_ctx_create(&ctx, &o);
  if (st == FJ_ERR_NO_DEVICE)
    return fjt_skip("no GPU: %s", fj_errmsg(NULL));
  CHECK_OK(NULL, st);
  /* Distinct problems (each its own chosen variant, so each first call
   * has a compile to wait for): tails, Sq != Skv both ways, GQA 8:1, head
   * dims 32 to 256, both dtypes and alignments, the built-ins, a bias
   * table read past both ends, ALiBi's product, a mask that hides whole
   * rows, inputs x30; then a caller's block mask. */
  static const tier_case cases[] = {
      {"plain sq<skv", 1, 8, 8, 200, 333, 128, FJ_F16, FJ_CAUSAL_NONE, 1, NULL, NULL, 0, -1, -1, 0},
      {"causal bottom-right sq>skv GQA 8:1", 2, 16, 2, 333, 100, 64, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT, 1, NULL, NULL, 0, -1, -1, 0},
      {"causal top-left d256", 1, 4, 4, 300, 300, 256, FJ_F16, FJ_CAUSAL_TOP_LEFT, 1, NULL, NULL, 0, -1, -1, 0},
      {"d32 window 100,37", 2, 4, 4, 257, 257, 32, FJ_BF16, FJ_CAUSAL_NONE, 1, NULL, NULL, 0, 100, 37, 0},
      {"softcap 30 x30, sinks", 1, 8, 4, 500, 500, 128, FJ_BF16, FJ_CAUSAL_TOP_LEFT, 30, NULL, NULL, 30.f, -1, -1, 1},
      {"bias table past both ends, rows with no key", 1, 8, 8, 300, 300, 128, FJ_BF16, FJ_CAUSAL_NONE, 1,
       "s + bias(h, q - kv + 100)", "q % 7 != 3", 0, -1, -1, 0},
      {"ALiBi product, window", 1, 8, 8, 400, 400, 64, FJ_F16, FJ_CAUSAL_BOTTOM_RIGHT, 1,
       "s + slopes(h) * (float)(kv - q)", NULL, 0, 200, -1, 0},
      /* relative tables (rel_table.h): the first kernel reads the table
       * too, built in a workspace of its own plan; one with parameters,
       * one whose table is the kernels' only parameter */
      {"relative table, clamped bias", 1, 8, 8, 300, 350, 128, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT, 1,
       "s + bias(h, min(max(kv - q, -100), 99) + 100)", NULL, 0, -1, -1, 0},
      {"relative table, no parameters", 2, 8, 4, 257, 257, 64, FJ_F16, FJ_CAUSAL_NONE, 1,
       "s - logf(1.f + (float)abs(kv - q))", NULL, 0, -1, -1, 0},
      /* a decode row: the chosen variant splits, the first kernel's plan
       * holds the table alone */
      {"relative table, decode", 4, 8, 2, 1, 2000, 128, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT, 1,
       "s + bias(h, min(max(kv - q, -100), 99) + 100)", NULL, 0, -1, -1, 0},
  };
  uint64_t seed = 5;
  int bad = 0;
  float bias[8 * 200], slopes[8], sinks[8];
  for (int i = 0; i < 8 * 200; i++)
    bias[i] = (float)((i * 37) % 101) / 50.f - 1.f;
  for (int i = 0; i < 8; i++)
    slopes[i] = 1.f / (float)(2 << i);
  sink_values(sinks, 8);
  void *dbias = NULL, *dslopes = NULL, *dsinks = NULL;
  if (device_copy(&dbias, bias, sizeof bias) || device_copy(&dslopes, slopes, sizeof slopes) ||
      device_copy(&dsinks, sinks, sizeof sinks)) {
    fprintf(stderr, "device copies failed\n");
    return 1;
  }
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const tier_case *tc = &cases[i];
    fj_mod_param hp[1], dp[1];
    fj_mods hm, dm;
    fj_mods_init(&hm);
    hm.score = tc->score;
    hm.mask = tc->mask;
    hm.softcap = tc->softcap;
    hm.window_left = tc->window_left;
    hm.window_right = tc->window_right;
    if (tc->score && strstr(tc->score, "bias")) {
      hp[0] = (fj_mod_param){"bias", FJ_MOD_F32, 2, {8, 200}, bias, 0};
      hm.params = hp;
      hm.num_params = 1;
    } else if (tc->score && strstr(tc->score, "slopes")) {
      hp[0] = (fj_mod_param){"slopes", FJ_MOD_F32, 1, {8}, slopes, 0};
      hm.params = hp;
      hm.num_params = 1;
    }
    if (tc->sinks)
      hm.sinks = sinks;
    dm = hm;
    if (hm.num_params) {
      dp[0] = hp[0];
      dp[0].data = strstr(tc->score, "bias") ? dbias : dslopes;
      dm.params = dp;
    }
    if (tc->sinks)
      dm.sinks = dsinks;
    bad |= tier_run(ctx, tc, &hm, &dm, &seed);
  }
  /* A caller's block mask (test_gpu_block_mask's lists): query block 0
   * sees key block 2 only (partial: the expression applies), block 1 key
   * blocks 0 and 3 (full), block 2 nothing (O = 0, LSE = -inf), block 3
   * every key block, with a full count past the key blocks and unread
   * indices out of range. */
  int32_t hnum[4] = {1, 0, 0, 0}, hfull_num[4] = {0, 2, 0, 99};
  int32_t hidx[16] = {2, -1, 7};
  int32_t hfull[16] = {0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3};
  int32_t all[40];
  memcpy(all, hnum, sizeof hnum);
  memcpy(all + 4, hfull_num, sizeof hfull_num);
  memcpy(all + 8, hidx, sizeof hidx);
  memcpy(all + 24, hfull, sizeof hfull);
  int32_t *dbuf = NULL;
  CHECK(device_copy((void **)&dbuf, all, sizeof all) == 0);
  const tier_case lc = {"caller's block mask", 4, 16, 16, 500, 480, 128, FJ_BF16, FJ_CAUSAL_NONE, 1,
                        NULL, "kv % 3 != 1", 0, -1, -1, 0};
  fj_block_mask hb = {128, 128, 1, 1, 4, 4, hnum, hidx, hfull_num, hfull, NULL, NULL, NULL, NULL};
  fj_block_mask db = {128, 128, 1, 1, 4, 4, dbuf, dbuf + 8, dbuf + 4, dbuf + 24, NULL, NULL, NULL, NULL};
  fj_mods hm, dm;
  fj_mods_init(&hm);
  hm.mask = lc.mask;
  dm = hm;
  hm.block_mask = &hb;
  dm.block_mask = &db;
  bad |= tier_run(ctx, &lc, &hm, &dm, &seed);
  cudaFree(dbuf);
  /* A stream being captured and a recording thread wait for the chosen
   * kernel (a graph or a replay would keep the first for good); the
   * captured graph's result is checked like the others. */
  const tier_case cap = {"captured", 2, 8, 8, 300, 300, 64, FJ_BF16, FJ_CAUSAL_TOP_LEFT, 1,
                         NULL, NULL, 20.f, -1, -1, 0};
  const tier_case recd = {"recorded", 2, 8, 8, 300, 300, 96, FJ_F16, FJ_CAUSAL_NONE, 1,
                          NULL, NULL, 0, 50, 50, 0};
  for (int i = 0; i < 2; i++) {
    const tier_case *tc = i ? &recd : &cap;
    fj_mods_init(&hm);
    hm.softcap = tc->softcap;
    hm.window_left = tc->window_left;
    hm.window_right = tc->window_right;
    dm = hm;
    bad |= tier_run_as(ctx, tc, &hm, &dm, &seed, i ? CALLS_RECORDED : CALLS_CAPTURED);
  }
  fj_cache_stats s;
  fj_cache_stats_get(ctx, &s);
  printf("first launches %llu, background compiles %llu\n",
         (unsigned long long)s.first_launches,
         (unsigned long long)s.background_compiles);
  CHECK(s.background_compiles == sizeof cases / sizeof cases[0] + 1);
  fj_ctx_destroy(ctx);
  /* The defaults (fj_ctx_opts_init's, untouched: tiers on): a first call
   * answered by the first kernel; fj_ctx_tiers_wait, after which the
   * chosen kernel answers; a deterministic problem waits for its chosen
   * kernel.  Fresh problems, a fresh cache. */
  fj_ctx_opts_init(&o);
  o.cache_dir = fjt_tmpdir();
  /* The library's defaults, not the environment's. */
  unsetenv("FLASHJIT_JIT_TIERS");
  unsetenv("FLASHJIT_PACKAGE_DIR");
  CHECK_OK(NULL, fj_ctx_create(&ctx, &o));
  const tier_case dflt[3] = {
      {"default options", 1, 8, 8, 190, 190, 128, FJ_BF16, FJ_CAUSAL_BOTTOM_RIGHT, 1, NULL, NULL, 0, -1, -1, 0},
      {"default options, waited", 2, 4, 2, 260, 140, 64, FJ_F16, FJ_CAUSAL_NONE, 1, NULL, NULL, 0, -1, -1, 0},
      {"default options, deterministic", 1, 4, 4, 230, 230, 256, FJ_BF16, FJ_CAUSAL_TOP_LEFT, 1, NULL, NULL, 0, -1, -1, 0},
  };
  fj_mods_init(&hm);
  bad |= tier_run_as(ctx, &dflt[0], &hm, &hm, &seed, CALLS_PLAIN);
  bad |= tier_run_as(ctx, &dflt[1], &hm, &hm, &seed, CALLS_WAITED);
  bad |= tier_run_as(ctx, &dflt[2], &hm, &hm, &seed, CALLS_DETERMINISTIC);
  CHECK_OK(ctx, fj_ctx_tiers_wait(ctx));  /* nothing left: returns at once */
  bad |= tier_keeps(&seed);
  fjt_gpu_print_worst();
  cudaFree(dbias);
  cudaFree(dslopes);
  cudaFree(dsinks);
  fj_ctx_destroy(ctx);
  return bad;
}
