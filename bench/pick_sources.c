/*
 * pick_sources.c -- writes the rendered CUDA source of the library's picks
 * (every family and the backward's three kernels) into a directory, one
 * file per kernel, for bench/compile_cost.sh to time NVRTC on.  Public API
 * only; compile-only contexts, so no GPU is needed.  fj_kernel_get
 * compiles each kernel once on the way (there is no render-only call);
 * point FLASHJIT_CACHE_DIR at a scratch directory.
 *
 *   cc -O2 bench/pick_sources.c -Iinclude -Lbuild -lflashjit \
 *      -Wl,-rpath,$PWD/build -o /tmp/pick_sources
 *   FLASHJIT_CACHE_DIR=/tmp/ps-cache /tmp/pick_sources DIR [all]
 *
 * Writes DIR/<arch>__<kernel>.cu and prints one line per file: the file,
 * then the problem it came from.  Without `all`, a representative set
 * (head dims 64, 128, 256 of the long bf16 causal prefill on each family,
 * decode, the backward); with it, every head dim, dtype and mask of the
 * long prefill as well.
 */
#include <stdio.h>
#include <string.h>

#include "flashjit.h"

typedef struct pick {
  const char *arch;
  int b, h, hkv, s, skv, d;
  fj_dtype dtype;
  fj_causal causal;
  int backward;
} pick;

static const pick picks[] = {
    {"sm_90a", 2, 16, 16, 4096, 4096, 64, FJ_BF16, FJ_CAUSAL_TOP_LEFT, 0},
    {"sm_90a", 2, 16, 16, 4096, 4096, 128, FJ_BF16, FJ_CAUSAL_TOP_LEFT, 0},
    {"sm_90a", 2, 16, 16, 4096, 4096, 256, FJ_BF16, FJ_CAUSAL_TOP_LEFT, 0},
    {"sm_90a", 2, 16, 16, 4096, 4096, 128, FJ_BF16, FJ_CAUSAL_NONE, 0},
    {"sm_90a", 64, 32, 8, 1, 4096, 128, FJ_BF16, FJ_CAUSAL_NONE, 0},
    {"sm_90a", 1, 8, 8, 512, 512, 64, FJ_F16, FJ_CAUSAL_NONE, 0},
    {"sm_80", 2, 16, 16, 4096, 4096, 64, FJ_BF16, FJ_CAUSAL_TOP_LEFT, 0},
    {"sm_80", 2, 16, 16, 4096, 4096, 128, FJ_BF16, FJ_CAUSAL_TOP_LEFT, 0},
    {"sm_80", 2, 16, 16, 4096, 4096, 256, FJ_BF16, FJ_CAUSAL_TOP_LEFT, 0},
    {"sm_75", 2, 16, 16, 4096, 4096, 64, FJ_F16, FJ_CAUSAL_TOP_LEFT, 0},
    {"sm_75", 2, 16, 16, 4096, 4096, 128, FJ_F16, FJ_CAUSAL_TOP_LEFT, 0},
    {"sm_90a", 2, 16, 16, 4096, 4096, 64, FJ_BF16, FJ_CAUSAL_TOP_LEFT, 1},
    {"sm_90a", 2, 16, 16, 4096, 4096, 128, FJ_BF16, FJ_CAUSAL_TOP_LEFT, 1},
    {"sm_90a", 2, 16, 16, 4096, 4096, 256, FJ_BF16, FJ_CAUSAL_TOP_LEFT, 1},
};

static int write_source(const char *dir, const char *arch, const fj_kernel *k,
                        const pick *p)
{
  char path[4096];
  size_t len = 0;
  const char *src = fj_kernel_source(k, &len);
  snprintf(path, sizeof path, "%s/%s__%s.cu", dir, arch, fj_kernel_name(k));
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(src, 1, len, f) != len || fclose(f) != 0) {
    fprintf(stderr, "pick_sources: cannot write %s\n", path);
    return 1;
  }
  printf("%s\t%s %d,%d/%d,%d/%d,%d %s%s%s\n", path, arch, p->b, p->h, p->hkv,
         p->s, p->skv, p->d, p->dtype == FJ_BF16 ? "bf16" : "f16",
         p->causal ? " causal" : "", p->backward ? " backward" : "");
  return 0;
}

static int one(const char *dir, const pick *p)
{
  fj_ctx_opts o;
  fj_ctx_opts_init(&o);
  o.device = -1;
  o.arch = p->arch;
  fj_ctx *ctx;
  if (fj_ctx_create(&ctx, &o) != FJ_OK) {
    fprintf(stderr, "pick_sources: %s\n", fj_errmsg(NULL));
    return 1;
  }
  fj_problem pr;
  fj_problem_init(&pr, p->b, p->h, p->hkv, p->s, p->skv, p->d, p->dtype,
                  FJ_BSHD);
  pr.causal = p->causal;
  int bad = 0;
  fj_kernel *k;
  if (p->backward) {
    fj_bwd_plan bp;
    bad = fj_attention_bwd_plan(ctx, &pr, &bp) != FJ_OK;
    for (int w = 0; w < FJ_BWD_KERNELS && !bad; w++)
      bad = fj_attention_bwd_kernel(ctx, &pr, &bp, w, &k) != FJ_OK ||
            write_source(dir, p->arch, k, p);
  } else {
    fj_plan plan;
    bad = fj_attention_plan(ctx, &pr, &plan) != FJ_OK ||
          fj_kernel_get(ctx, &plan.variant, &k) != FJ_OK ||
          write_source(dir, p->arch, k, p);
  }
  if (bad && fj_errmsg(ctx)[0])
    fprintf(stderr, "pick_sources: %s\n", fj_errmsg(ctx));
  fj_ctx_destroy(ctx);
  return bad;
}

int main(int argc, char **argv)
{
  if (argc < 2) {
    fprintf(stderr, "usage: pick_sources DIR [all]\n");
    return 2;
  }
  int bad = 0;
  for (size_t i = 0; i < sizeof picks / sizeof picks[0]; i++)
    bad |= one(argv[1], &picks[i]);
  if (argc > 2 && !strcmp(argv[2], "all"))
    for (int a = 0; a < 2; a++)
      for (int d = 64; d <= 256; d *= 2)
        for (int t = 0; t < 2; t++)
          for (int c = 0; c < 2; c++) {
            pick p = {a ? "sm_80" : "sm_90a", 2, 16, 16, 4096, 4096, d,
                      t ? FJ_BF16 : FJ_F16,
                      c ? FJ_CAUSAL_TOP_LEFT : FJ_CAUSAL_NONE, 0};
            bad |= one(argv[1], &p);
          }
  return bad;
}
