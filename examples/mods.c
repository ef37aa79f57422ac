/*
 * mods.c -- your own attention: four modifications compiled into the
 * kernel -- ALiBi (a slopes tensor), the softcap (built in), document
 * masking (document ids) and a relative-position bias table.
 *
 * Without a GPU it plans and compiles each for sm_90a (the wgmma family)
 * and prints the variant, its resources and the user's expression as the
 * kernel carries it.  With one it runs each on the device and checks a few
 * rows of every head against fj_reference_fwd, which evaluates the same
 * expressions on the host.
 *
 *   build/flashjit-mods-example
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "flashjit.h"

enum { B = 1, H = 16, S = 2048, D = 128, ROWS = 8 };

typedef struct example {
  const char *name;
  fj_causal causal;
  fj_mods mods;
  fj_mod_param params[1];
} example;

/* The four modifications; tensors are filled in host memory here, their
 * device copies made by the caller. */
static void examples_init(example ex[4], float *slopes, int32_t *doc, float *bias)
{
  for (int h = 0; h < H; h++)
    slopes[h] = powf(2.f, -8.f * (float)(h + 1) / H);
  for (int i = 0; i < S; i++)
    doc[i] = i / 300;  /* documents of 300 tokens */
  for (int i = 0; i < H * 2 * S; i++)
    bias[i] = 0.1f * sinf((float)i);
  memset(ex, 0, 4 * sizeof *ex);
  for (int i = 0; i < 4; i++) {
    fj_mods_init(&ex[i].mods);
    ex[i].causal = FJ_CAUSAL_BOTTOM_RIGHT;
  }
  ex[0].name = "ALiBi";
  ex[0].mods.score = "s + slopes(h) * (float)(kv - q)";
  ex[0].params[0] = (fj_mod_param){"slopes", FJ_MOD_F32, 1, {H}, slopes, 0};
  ex[1].name = "softcap 30";
  ex[1].mods.softcap = 30.f;
  ex[2].name = "documents";
  ex[2].mods.mask = "doc(q) == doc(kv)";
  ex[2].params[0] = (fj_mod_param){"doc", FJ_MOD_I32, 1, {S}, doc, 0};
  ex[3].name = "relative bias";
  ex[3].causal = FJ_CAUSAL_NONE;
  ex[3].mods.score = "s + bias(h, q - kv + 2048)";
  ex[3].params[0] = (fj_mod_param){"bias", FJ_MOD_F32, 2, {H, 2 * S}, bias, 0};
  for (int i = 0; i < 4; i++) {
    ex[i].mods.params = ex[i].params;
    ex[i].mods.num_params = ex[i].params[0].name ? 1 : 0;
  }
}

static void problem_of(const example *e, const fj_mods *m, fj_problem *p)
{
  fj_problem_init(p, B, H, H, S, S, D, FJ_F16, FJ_BHSD);
  p->causal = e->causal;
  p->mods = m;
}

/* Plans and compiles e for the context's target; prints what it got. */
static int inspect(fj_ctx *ctx, const example *e)
{
  fj_problem p;
  fj_plan plan;
  fj_kernel *k;
  fj_resources r;
  char name[200];
  problem_of(e, &e->mods, &p);
  if (fj_attention_plan(ctx, &p, &plan) != FJ_OK ||
      fj_kernel_get(ctx, &plan.variant, &k) != FJ_OK) {
    fprintf(stderr, "%s: %s\n", e->name, fj_errmsg(ctx));
    return 1;
  }
  fj_variant_name(&plan.variant, name, sizeof name);
  fj_kernel_resources(k, &r);
  printf("%-14s %s: %d registers, %d bytes spilled, %.0f ms to compile\n",
         e->name, name, r.registers, r.spill_store_bytes, r.compile_ms);
  /* The user's expression, as the kernel carries it. */
  const char *src = fj_kernel_source(k, NULL), *at = strstr(src, "#line 1 \"");
  if (at) {
    const char *end = strchr(strchr(at, '\n') + 1, '\n');
    printf("%-14s %.*s\n", "", (int)(end - at), at);
  }
  return 0;
}

/* A device copy of a host array. */
static void *upload(const void *host, size_t bytes)
{
  void *dev = NULL;
  if (cudaMalloc(&dev, bytes) != cudaSuccess ||
      cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess)
    return NULL;
  return dev;
}

/* Runs e on the device and compares rows 0..ROWS-1 of every head with the
 * reference; the largest error in units of the output's scale. */
static int run_one(fj_ctx *ctx, const example *e, const uint16_t *q,
                   const uint16_t *k, const uint16_t *v, void *dq, void *dk,
                   void *dv, void *dout)
{
  fj_mods dm = e->mods;
  fj_mod_param dp[1] = {e->params[0]};
  size_t n = (size_t)B * H * S * D, bytes = 1;
  for (int d = 0; d < dp[0].rank; d++)
    bytes *= (size_t)dp[0].extents[d];
  if (dp[0].rank)
    dp[0].data = upload(e->params[0].data, bytes * 4);
  dm.params = dp;
  fj_problem p;
  problem_of(e, &dm, &p);
  uint16_t *o = malloc(n * 2);
  double *ref = malloc(sizeof *ref * (size_t)(B * H * ROWS * D));
  int bad = fj_attention_fwd(ctx, &p, dq, dk, dv, dout, NULL, NULL) != FJ_OK ||
            cudaMemcpy(o, dout, n * 2, cudaMemcpyDeviceToHost) != cudaSuccess;
  if (bad)
    fprintf(stderr, "%s: %s\n", e->name, fj_errmsg(ctx));
  p.mods = &e->mods;  /* the reference reads the tensors from host memory */
  if (!bad && fj_reference_fwd(&p, q, k, v, NULL, NULL, 0, ROWS, ref, NULL) != FJ_OK) {
    fprintf(stderr, "%s: %s\n", e->name, fj_errmsg(NULL));
    bad = 1;
  }
  double worst = 0;
  for (int h = 0; !bad && h < H; h++)
    for (int r = 0; r < ROWS; r++)
      for (int x = 0; x < D; x++) {
        float got;
        fj_convert(FJ_F32, &got, FJ_F16, o + ((size_t)h * S + (size_t)r) * D + x, 1);
        worst = fmax(worst, fabs((double)got - ref[((size_t)h * ROWS + (size_t)r) * D + (size_t)x]));
      }
  if (!bad)
    printf("%-14s max |O - reference| over %d rows x %d heads: %.2e %s\n", e->name,
           ROWS, H, worst, worst < 1e-2 ? "ok" : "FAIL");
  cudaFree((void *)dp[0].data);
  free(o);
  free(ref);
  return bad || !(worst < 1e-2);
}

static uint16_t *random_f16(size_t n, unsigned seed)
{
  float *f = malloc(n * sizeof *f);
  uint16_t *h = malloc(n * 2);
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    f[i] = (float)(seed >> 8) / 8388608.f - 1.f;
  }
  fj_convert(FJ_F16, h, FJ_F32, f, n);
  free(f);
  return h;
}

int main(void)
{
  static float slopes[H], bias[H * 2 * S];
  static int32_t doc[S];
  example ex[4];
  examples_init(ex, slopes, doc, bias);
  fj_ctx_opts o;
  fj_ctx_opts_init(&o);
  fj_ctx *ctx;
  int gpu = fj_ctx_create(&ctx, &o) == FJ_OK;
  if (!gpu) {
    printf("no GPU (%s): compiling for sm_90a only\n", fj_errmsg(NULL));
    o.device = -1;
    o.arch = "sm_90a";
    if (fj_ctx_create(&ctx, &o) != FJ_OK) {
      fprintf(stderr, "%s\n", fj_errmsg(NULL));
      return 1;
    }
  }
  int bad = 0;
  for (int i = 0; i < 4; i++)
    bad |= inspect(ctx, &ex[i]);
  if (gpu && !bad) {
    size_t n = (size_t)B * H * S * D;
    uint16_t *q = random_f16(n, 1), *k = random_f16(n, 2), *v = random_f16(n, 3);
    void *dq = upload(q, n * 2), *dk = upload(k, n * 2), *dv = upload(v, n * 2), *dout = NULL;
    cudaMalloc(&dout, n * 2);
    for (int i = 0; i < 4; i++)
      bad |= run_one(ctx, &ex[i], q, k, v, dq, dk, dv, dout);
    cudaFree(dq);
    cudaFree(dk);
    cudaFree(dv);
    cudaFree(dout);
    free(q);
    free(k);
    free(v);
  }
  fj_ctx_destroy(ctx);
  return bad;
}
