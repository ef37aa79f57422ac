/*
 * host_loop.c -- the host time of fj_attention_fwd up to its launch path,
 * on a compile-only context (no GPU needed): the problem check, the plan,
 * the variant's match and the pointers' checks, then the refusal to
 * launch (whose message is formatted each call, a cost the GPU path does
 * not have); fj_attention_bwd's the same way where a case says so.  Public API only, so one binary times any build of the
 * library: before and after a change, by LD_LIBRARY_PATH, alternately.
 *
 *   cc -O2 bench/host_loop.c -Iinclude -Lbuild -lflashjit -o /tmp/host_loop
 *   LD_LIBRARY_PATH=build /tmp/host_loop [CALLS [ROUNDS]]
 *
 * Prints, per case, microseconds per call: the best of ROUNDS (5) loops of
 * CALLS (200000) calls.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "flashjit.h"

/* Stand-ins for device memory, aligned as the checks want; never read. */
static _Alignas(16) int32_t fake[64];

enum { NCASES = 7 };

typedef struct hcase {
  const char *name;
  const char *arch;
  fj_problem p;
  fj_mods m;
  fj_mod_param param;
  fj_block_mask bm;
  int backward;  /* time fj_attention_bwd instead */
} hcase;

static double now_us(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

/* Plain on sm_90a (the wgmma family) and on sm_80 (mma), a split decode,
 * a softcap (modifications), and issue 33's documents (a mask expression
 * over a tensor parameter, a block mask with its transposed lists:
 * python/flashjit's call) beside plain causal, forward and backward. */
static void make_cases(hcase c[NCASES])
{
  c[0].name = "plain sm_90a (2,8,2048,128) bf16";
  c[0].arch = "sm_90a";
  fj_problem_init(&c[0].p, 2, 8, 8, 2048, 2048, 128, FJ_BF16, FJ_BSHD);
  c[1] = c[0];
  c[1].name = "plain sm_80 (2,8,2048,128) bf16";
  c[1].arch = "sm_80";
  c[2].name = "decode sm_90a (1,32/8,1,4096,128)";
  c[2].arch = "sm_90a";
  fj_problem_init(&c[2].p, 1, 32, 8, 1, 4096, 128, FJ_BF16, FJ_BSHD);
  c[3] = c[0];
  c[3].name = "softcap sm_90a (2,8,2048,128) bf16";
  fj_mods_init(&c[3].m);
  c[3].m.softcap = 30.f;
  c[3].p.mods = &c[3].m;
  c[4].name = "documents sm_90a (4,16,4096,128) fwd";
  c[4].arch = "sm_90a";
  fj_problem_init(&c[4].p, 4, 16, 16, 4096, 4096, 128, FJ_BF16, FJ_BHSD);
  c[4].p.causal = FJ_CAUSAL_TOP_LEFT;
  fj_mods_init(&c[4].m);
  c[4].m.mask = "doc(q) == doc(kv)";
  c[4].param = (fj_mod_param){"doc", FJ_MOD_I32, 1, {4096, 0, 0, 0}, fake, 0};
  c[4].m.params = &c[4].param;
  c[4].m.num_params = 1;
  c[4].bm = (fj_block_mask){128, 128, 1, 1, 32, 32, fake, fake, fake, fake,
                            fake, fake, fake, fake};
  c[4].m.block_mask = &c[4].bm;
  c[5] = c[4];
  c[5].name = "documents sm_90a (4,16,4096,128) bwd";
  c[5].backward = 1;
  c[6].name = "causal sm_90a (4,16,4096,128) bwd";
  c[6].arch = "sm_90a";
  fj_problem_init(&c[6].p, 4, 16, 16, 4096, 4096, 128, FJ_BF16, FJ_BHSD);
  c[6].p.causal = FJ_CAUSAL_TOP_LEFT;
  c[6].backward = 1;
}

static fj_status call(fj_ctx *ctx, const hcase *c)
{
  if (c->backward)
    return fj_attention_bwd(ctx, &c->p, fake, fake, fake, fake, fake,
                            (float *)fake, fake, fake, fake, NULL, NULL);
  return fj_attention_fwd(ctx, &c->p, fake, fake, fake, fake, NULL, NULL);
}

static double time_case(fj_ctx *ctx, const hcase *c, int calls, int rounds)
{
  double best = 1e30;
  for (int r = 0; r < rounds; r++) {
    double t0 = now_us();
    for (int i = 0; i < calls; i++)
      call(ctx, c);
    double us = (now_us() - t0) / calls;
    best = us < best ? us : best;
  }
  return best;
}

int main(int argc, char **argv)
{
  int calls = argc > 1 ? atoi(argv[1]) : 200000;
  int rounds = argc > 2 ? atoi(argv[2]) : 5;
  static hcase c[NCASES];
  make_cases(c);
  for (int i = 0; i < NCASES; i++) {
    fj_ctx_opts o;
    fj_ctx_opts_init(&o);
    o.device = -1;
    o.arch = c[i].arch;
    o.disk_cache = 0;
    fj_ctx *ctx;
    if (fj_ctx_create(&ctx, &o) != FJ_OK) {
      fprintf(stderr, "host_loop: %s\n", fj_errmsg(NULL));
      return 1;
    }
    /* The first call renders the template; it must reach the launch. */
    if (call(ctx, &c[i]) != FJ_ERR_COMPILE_ONLY) {
      fprintf(stderr, "host_loop: %s: %s\n", c[i].name, fj_errmsg(ctx));
      return 1;
    }
    printf("%-36s %.3f us\n", c[i].name,
           time_case(ctx, &c[i], calls, rounds));
    fj_ctx_destroy(ctx);
  }
  return 0;
}
