/*
 * test_errors.c -- every way to call the library wrongly gets a status and
 * a message that names the bad value and the limit; nothing crashes.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "runner.h"

/* The public structs' sizes at FJ_ABI_VERSION 13 (x86-64, LP64).  A struct
 * that changes makes this fail until FJ_ABI_VERSION is bumped and the
 * table rewritten for it, so that bindings (python/flashjit/_capi.py) see
 * the change through fj_abi_version() instead of reading past a struct. */
int test_abi_sizes(void)
{
  static const struct {
    const char *name;
    size_t size, pinned;
  } sizes[] = {
      {"fj_cache_entry", sizeof(fj_cache_entry), 48},
      {"fj_cache_pack_report", sizeof(fj_cache_pack_report), 20},
      {"fj_cache_stats", sizeof(fj_cache_stats), 80},
      {"fj_ctx_opts", sizeof(fj_ctx_opts), 64},
      {"fj_package_report", sizeof(fj_package_report), 24},
      {"fj_device_info", sizeof(fj_device_info), 120},
      {"fj_lut", sizeof(fj_lut), 1144},
      {"fj_mod_param", sizeof(fj_mod_param), 64},
      {"fj_mods", sizeof(fj_mods), 72},
      {"fj_mod_builtin", sizeof(fj_mod_builtin), 48},
      {"fj_block_mask", sizeof(fj_block_mask), 88},
      {"fj_bwd_plan", sizeof(fj_bwd_plan), 120},
      {"fj_plan", sizeof(fj_plan), 160},
      {"fj_prepare_opts", sizeof(fj_prepare_opts), 24},
      {"fj_prewarm_report", sizeof(fj_prewarm_report), 20},
      {"fj_problem", sizeof(fj_problem), 280},
      {"fj_resources", sizeof(fj_resources), 64},
      {"fj_tune_entry", sizeof(fj_tune_entry), 128},
      {"fj_tune_opts", sizeof(fj_tune_opts), 32},
      {"fj_tune_report", sizeof(fj_tune_report), 56},
      {"fj_variant", sizeof(fj_variant), 88},
  };
  CHECK(FJ_ABI_VERSION == 13 && fj_abi_version() == FJ_ABI_VERSION);
  if (sizeof(void *) != 8)
    return 0;  /* the table is LP64's */
  int changed = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    if (sizes[i].size != sizes[i].pinned) {
      fprintf(stderr, "%s is %zu bytes; ABI %d pinned %zu: bump FJ_ABI_VERSION "
                      "(and _capi.ABI_VERSION) and rewrite this table\n",
              sizes[i].name, sizes[i].size, FJ_ABI_VERSION, sizes[i].pinned);
      changed = 1;
    }
  CHECK(!changed);
  return 0;
}

int test_errors_ctx(void)
{
  fj_ctx *ctx = (fj_ctx *)1;
  fj_ctx_opts o;
  fj_ctx_opts_init(&o);
  o.device = -1;
  o.arch = "sm_1";
  CHECK_ST(NULL, fj_ctx_create(&ctx, &o), FJ_ERR_INVALID_ARG);
  CHECK(ctx == NULL);
  CHECK_MSG(NULL, "invalid arch 'sm_1'");
  o.arch = "sm_60";
  CHECK_ST(NULL, fj_ctx_create(&ctx, &o), FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "sm_75 and newer");
  o.arch = "sm_80a";
  CHECK_ST(NULL, fj_ctx_create(&ctx, &o), FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "start at sm_90a");
  o.arch = "compute_90";
  CHECK_ST(NULL, fj_ctx_create(&ctx, &o), FJ_ERR_INVALID_ARG);
  o.arch = NULL;
  CHECK_ST(NULL, fj_ctx_create(&ctx, &o), FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "compile-only context (device -1) needs an arch");
  o.device = -2;
  CHECK_ST(NULL, fj_ctx_create(&ctx, &o), FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "device -2 is invalid");
  CHECK_ST(NULL, fj_ctx_create(NULL, &o), FJ_ERR_INVALID_ARG);
  fj_ctx_destroy(NULL);  /* a no-op */
  /* A compile-only context answers questions about a device clearly. */
  ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  fj_device_info info;
  CHECK_ST(ctx, fj_device_get(ctx, &info), FJ_ERR_COMPILE_ONLY);
  CHECK_MSG(ctx, "compile-only context (arch sm_90a) has no device");
  CHECK(!fj_ctx_has_device(ctx) && !strcmp(fj_ctx_arch(ctx), "sm_90a"));
  fj_ctx_destroy(ctx);
  /* Status text comes from the one list. */
  CHECK(!strcmp(fj_status_str(FJ_OK), "success"));
  CHECK(!strcmp(fj_status_str(FJ_ERR_RESOURCES), "variant exceeds a hardware limit"));
  CHECK(!strcmp(fj_status_str((fj_status)999), "unknown status"));
  return 0;
}

/* One bad axis at a time, from the default variant. */
static int refuse(fj_ctx *ctx, void (*edit)(fj_variant *), fj_status want,
                  const char *text)
{
  fj_variant v;
  fj_variant_default(&v, 64, FJ_F16, FJ_CAUSAL_NONE);
  edit(&v);
  CHECK_ST(ctx, fj_variant_check(ctx, &v), want);
  CHECK_MSG(ctx, text);
  fj_kernel *k = NULL;
  CHECK_ST(ctx, fj_kernel_get(ctx, &v, &k), want);
  CHECK(k == NULL);
  return 0;
}

static void head_dim_7(fj_variant *v) { v->head_dim = 7; }
static void head_dim_84(fj_variant *v) { v->head_dim = 84; }
static void tile_m_neg(fj_variant *v) { v->tile_m = -16; }
static void tile_n_17(fj_variant *v) { v->tile_n = 17; }
static void tile_m_big(fj_variant *v) { v->tile_m = 512; }
static void warps_0(fj_variant *v) { v->warps = 0; }
static void warps_3(fj_variant *v) { v->warps = 3; }
static void stages_9(fj_variant *v) { v->stages = 9; }
static void swizzle_9(fj_variant *v) { v->swizzle = (fj_swizzle)9; }
static void mma_wgmma(fj_variant *v) { v->mma = FJ_MMA_WGMMA; }
static void dtype_f32(fj_variant *v) { v->dtype = FJ_F32; }
static void kv_bf16(fj_variant *v) { v->kv_dtype = FJ_BF16; }
static void causal_7(fj_variant *v) { v->causal = (fj_causal)7; }
static void too_big(fj_variant *v)
{
  v->softmax = FJ_SOFTMAX_SMEM;
  v->head_dim = 256;
  v->tile_m = 256;
  v->tile_n = 256;
  v->warps = 8;
}

/* Architectures NVRTC does not target are refused when the context is
 * made, in one line listing the targets this NVRTC has; those it targets
 * pass. */
int test_errors_arch_nvrtc(void)
{
  static const char *const bad[] = {"sm_99", "sm_101", "sm_125", "sm_81",
                                    "sm_99a", "sm_89a", "sm_9999"};
  static const char *const good[] = {"sm_75", "sm_80", "sm_86", "sm_89",
                                     "sm_90", "sm_90a", "sm_100a", "sm_120"};
  fj_ctx *ctx;
  fj_ctx_opts o;
  fj_ctx_opts_init(&o);
  o.device = -1;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    o.arch = bad[i];
    CHECK_ST(NULL, fj_ctx_create(&ctx, &o), FJ_ERR_INVALID_ARG);
    CHECK(ctx == NULL && !strchr(fj_errmsg(NULL), '\n'));
    CHECK_MSG(NULL, bad[i]);
  }
  o.arch = "sm_125";
  CHECK_ST(NULL, fj_ctx_create(&ctx, &o), FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "arch 'sm_125' is not a target of NVRTC");
  CHECK_MSG(NULL, "sm_80, ");
  CHECK_MSG(NULL, "sm_90[a]");
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    o.arch = good[i];
    CHECK_OK(NULL, fj_ctx_create(&ctx, &o));
    fj_ctx_destroy(ctx);
  }
  return 0;
}

int test_errors_variant(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  CHECK(refuse(ctx, head_dim_7, FJ_ERR_INVALID_ARG,
               "head_dim 7 is invalid: a multiple of 8 from 8 to 576") == 0);
  CHECK(refuse(ctx, head_dim_84, FJ_ERR_INVALID_ARG, "head_dim 84") == 0);
  CHECK(refuse(ctx, tile_m_neg, FJ_ERR_INVALID_ARG,
               "tile_m -16 is invalid: must be a multiple of 16 in 16..256") == 0);
  CHECK(refuse(ctx, tile_n_17, FJ_ERR_INVALID_ARG, "tile_n 17 is invalid") == 0);
  CHECK(refuse(ctx, tile_m_big, FJ_ERR_INVALID_ARG, "tile_m 512") == 0);
  CHECK(refuse(ctx, warps_0, FJ_ERR_INVALID_ARG,
               "warps 0 is invalid: 4 or 8 (wmma, mma), or 8, 12 or 16 (wgmma)") == 0);
  CHECK(refuse(ctx, warps_3, FJ_ERR_UNSUPPORTED, "warps 3 is not implemented") == 0);
  CHECK(refuse(ctx, stages_9, FJ_ERR_INVALID_ARG, "stages 9 is invalid") == 0);
  CHECK(refuse(ctx, swizzle_9, FJ_ERR_INVALID_ARG, "swizzle 9 is invalid") == 0);
  CHECK(refuse(ctx, mma_wgmma, FJ_ERR_UNSUPPORTED, "warps 4 is not implemented for mma wgmma: 8, 12 or 16") == 0);
  CHECK(refuse(ctx, dtype_f32, FJ_ERR_INVALID_ARG, "dtype f32 is invalid") == 0);
  CHECK(refuse(ctx, kv_bf16, FJ_ERR_INVALID_ARG, "kv_dtype bf16 is invalid with dtype f16") == 0);
  CHECK(refuse(ctx, causal_7, FJ_ERR_INVALID_ARG, "causal 7 is invalid") == 0);
  CHECK(refuse(ctx, too_big, FJ_ERR_RESOURCES, "bytes of shared memory per block; sm_90a allows 232448 (over by") == 0);
  fj_ctx_destroy(ctx);
  /* bf16 WMMA needs sm_80. */
  ctx = fjt_ctx("sm_75", NULL);
  CHECK(ctx);
  fj_variant v;
  fj_variant_default(&v, 64, FJ_BF16, FJ_CAUSAL_NONE);
  CHECK_ST(ctx, fj_variant_check(ctx, &v), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "bf16 needs sm_80 or newer; the target is sm_75");
  fj_ctx_destroy(ctx);
  return 0;
}

static int bad_problem(fj_ctx *ctx, const fj_problem *p, const char *text)
{
  CHECK_ST(ctx, fj_problem_check(ctx, p), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, text);
  return 0;
}

int test_errors_problem(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  fj_problem p;
  fj_problem_init(&p, 2, 8, 8, 128, 128, 64, FJ_F16, FJ_BHSD);
  CHECK_OK(ctx, fj_problem_check(ctx, &p));
  p.batch = 0;
  CHECK(bad_problem(ctx, &p, "batch 0 is invalid: must be in 1..65535") == 0);
  p.batch = 2;
  p.heads_kv = 3;
  CHECK(bad_problem(ctx, &p, "heads_kv 3 does not divide heads_q 8") == 0);
  p.heads_kv = 16;
  CHECK(bad_problem(ctx, &p, "heads_kv 16 is invalid: must be in 1..8") == 0);
  p.heads_kv = 8;
  p.seq_q = -5;
  CHECK(bad_problem(ctx, &p, "seq_q -5 is invalid") == 0);
  p.seq_q = 128;
  p.head_dim = 584;
  CHECK(bad_problem(ctx, &p, "head_dim 584 is invalid: must be in 1..576") == 0);
  p.head_dim = 64;
  p.k_stride[2] = -64;
  CHECK(bad_problem(ctx, &p, "k_stride[2] (seq) = -64 is negative") == 0);
  p.k_stride[2] = 64;
  p.scale = NAN;
  CHECK(bad_problem(ctx, &p, "scale nan is not finite") == 0);
  p.scale = -0.125f;
  CHECK(bad_problem(ctx, &p, "scale -0.125 is negative: the softmax scale must be above 0") == 0);
  p.scale = 0;
  p.causal = (fj_causal)5;
  CHECK(bad_problem(ctx, &p, "causal 5 is invalid") == 0);
  CHECK_ST(ctx, fj_problem_check(ctx, NULL), FJ_ERR_INVALID_ARG);
  fj_ctx_destroy(ctx);
  return 0;
}

int test_errors_launch(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  fj_problem p;
  fj_problem_init(&p, 1, 2, 2, 64, 64, 64, FJ_F16, FJ_BHSD);
  /* Host addresses stand in for device pointers: every check below fails
   * before anything would touch them. */
  static _Alignas(16) char buf[64];
  void *q = buf, *k = buf, *v = buf, *o = buf;
  CHECK_ST(ctx, fj_attention_fwd(ctx, &p, q, k, v, o, NULL, NULL), FJ_ERR_COMPILE_ONLY);
  CHECK_MSG(ctx, "cannot launch on a compile-only context (arch sm_90a)");
  CHECK_ST(ctx, fj_attention_fwd(ctx, &p, NULL, k, v, o, NULL, NULL), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "q is NULL");
  CHECK_ST(ctx, fj_attention_fwd(ctx, &p, q, buf + 2, v, o, NULL, NULL), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "is not 16-byte aligned");
  p.v_stride[2] = 68;
  CHECK_ST(ctx, fj_attention_fwd(ctx, &p, q, k, v, o, NULL, NULL), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "v_stride[2] = 68 is not a multiple of 8 elements");
  p.v_stride[2] = 64;
  fj_variant var;
  fj_variant_default(&var, 128, FJ_F16, FJ_CAUSAL_NONE);
  CHECK_ST(ctx, fj_attention_fwd_variant(ctx, &p, &var, q, k, v, o, NULL, NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "variant (head_dim 128");
  CHECK_MSG(ctx, "does not match the problem (head_dim 64");
  CHECK_ST(ctx, fj_attention_fwd(NULL, &p, q, k, v, o, NULL, NULL), FJ_ERR_INVALID_ARG);
  CHECK_ST(ctx, fj_attention_fwd(ctx, NULL, q, k, v, o, NULL, NULL), FJ_ERR_INVALID_ARG);
  fj_lut lut;
  CHECK_ST(ctx, fj_layout_get(ctx, (fj_frag)0, &lut), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "fragment kind 0 is invalid");
  fj_ctx_destroy(ctx);
  return 0;
}

/* A failure on one thread is that thread's message, not another's. */
static void *fail_on_thread(void *arg)
{
  fj_ctx *ctx = arg;
  fj_variant v;
  fj_variant_default(&v, 7, FJ_F16, FJ_CAUSAL_NONE);
  fj_status st = fj_variant_check(ctx, &v);
  int ok = st == FJ_ERR_INVALID_ARG && strstr(fj_errmsg(ctx), "head_dim 7");
  return (void *)(intptr_t)ok;
}

int test_errors_thread_local(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90", NULL);
  CHECK(ctx);
  fj_variant v;
  fj_variant_default(&v, 64, FJ_F16, FJ_CAUSAL_NONE);
  v.tile_n = 3;
  CHECK_ST(ctx, fj_variant_check(ctx, &v), FJ_ERR_INVALID_ARG);
  pthread_t t;
  void *ok = NULL;
  CHECK(pthread_create(&t, NULL, fail_on_thread, ctx) == 0);
  CHECK(pthread_join(t, &ok) == 0 && ok);
  CHECK_MSG(ctx, "tile_n 3");  /* still this thread's own */
  /* A success clears it. */
  fj_variant_default(&v, 64, FJ_F16, FJ_CAUSAL_NONE);
  CHECK_OK(ctx, fj_variant_check(ctx, &v));
  CHECK(fj_errmsg(ctx)[0] == '\0');
  fj_ctx_destroy(ctx);
  return 0;
}

/* The axes' table (FJ_VARIANT_AXES): its rows through fj_axis_get, each
 * row's member, the names both ways, and the refusals' codes and
 * messages. */
int test_variant_axes(void)
{
  static const char *const names[] = {"tile_m", "tile_n", "warps", "stages",
      "swizzle", "softmax", "mma", "pack_gqa", "split_kv"};
  fj_axis_info a;
  fj_variant v;
  fj_variant_default(&v, 128, FJ_F16, FJ_CAUSAL_NONE);
  CHECK(fj_axis_count() == 9);
  for (int i = 0; i < fj_axis_count(); i++) {
    CHECK_OK(NULL, fj_axis_get(i, &a));
    CHECK(!strcmp(a.name, names[i]) && a.doc[0]);
    CHECK(*(const int *)(const void *)((const char *)&v + a.offset) != 0 ||
          a.kind == FJ_AXIS_SWITCH);
  }
  CHECK_OK(NULL, fj_axis_get(4, &a));
  CHECK(a.kind == FJ_AXIS_NAMED && a.nvalues == 3 && !strcmp(a.values, "none|pad|xor"));
  CHECK(!strcmp(a.flag, "swizzle") && a.offset == offsetof(fj_variant, swizzle));
  CHECK_OK(NULL, fj_axis_get(0, &a));
  CHECK(a.kind == FJ_AXIS_INT && !strcmp(a.values, "") && !strcmp(a.flag, "tile-m"));
  CHECK(!strcmp(fj_axis_value_name(6, FJ_MMA_WGMMA), "wgmma"));
  CHECK(!strcmp(fj_swizzle_name(FJ_SWIZZLE_XOR), "xor"));
  CHECK(!strcmp(fj_axis_value_name(6, 4), "?") && !strcmp(fj_axis_value_name(0, 1), "?"));
  CHECK(fj_axis_value(5, "regs") == FJ_SOFTMAX_REGS && fj_axis_value(5, "xor") == 0);
  CHECK(fj_axis_value(5, NULL) == 0 && fj_axis_value(99, "regs") == 0);
  CHECK_ST(NULL, fj_axis_get(9, &a), FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "fj_axis_get: axis 9 is invalid: must be in 0..8");
  CHECK_ST(NULL, fj_axis_get(-1, &a), FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "axis -1 is invalid");
  CHECK_ST(NULL, fj_axis_get(0, NULL), FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "fj_axis_get: info is NULL");
  /* fj_variant_check's messages come from the table's names. */
  fj_ctx *ctx;
  fj_ctx_opts o;
  fj_ctx_opts_init(&o);
  o.device = -1;
  o.arch = "sm_90a";
  o.disk_cache = 0;
  CHECK_OK(NULL, fj_ctx_create(&ctx, &o));
  v.softmax = (fj_softmax)7;
  CHECK_ST(ctx, fj_variant_check(ctx, &v), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "softmax 7 is invalid: smem or regs");
  v.softmax = FJ_SOFTMAX_REGS;
  v.mma = (fj_mma)0;
  CHECK_ST(ctx, fj_variant_check(ctx, &v), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "mma 0 is invalid: wmma, mma or wgmma");
  v.mma = FJ_MMA_SYNC;
  v.split_kv = 2;
  CHECK_ST(ctx, fj_variant_check(ctx, &v), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "split_kv 2 is invalid: 0 or 1");
  fj_ctx_destroy(ctx);
  return 0;
}
