/*
 * test_host.c -- the host's cost of a call, without a GPU: everything
 * fj_attention_fwd does before its launch path (the problem check, the
 * plan from the dispatch cache, the variant's match and the pointers'
 * checks), timed per call on a compile-only context for a plain problem
 * and for three kinds of modifications, with the steps of a modified
 * call one by one.  The times are printed, not asserted: a loaded
 * machine makes any bar on them flaky.  What is asserted is that the
 * repeated calls give the plan of the first.  (That the remembered checks
 * see every change is test_mods_memo.c's.)
 */
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "attention.h"
#include "mods.h"
#include "plan.h"
#include "runner.h"

enum { ROUNDS = 5, CALLS = 20000 };

static double now_us(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

/* One case: a problem, the modifications it points to, and what they
 * point to (aligned stand-ins for device memory, never read). */
typedef struct hcase {
  const char *name;
  fj_problem p;
  fj_mods m;
  fj_mod_param prm[1];
  fj_block_mask bm;
} hcase;

static _Alignas(16) int32_t fake[64];

static void base(hcase *c, const char *name)
{
  memset(c, 0, sizeof *c);
  c->name = name;
  fj_problem_init(&c->p, 2, 8, 8, 2048, 2048, 128, FJ_BF16, FJ_BSHD);
  fj_mods_init(&c->m);
}

/* The four cases: plain; documents (a mask expression with an i32 tensor
 * and a block mask); a relative bias (a score expression with an f32
 * rank-2 tensor); the softcap alone. */
static void make_cases(hcase c[4])
{
  base(&c[0], "plain");
  base(&c[1], "documents");
  c[1].prm[0] = (fj_mod_param){"doc", FJ_MOD_I32, 1, {2048, 0, 0, 0}, fake, 0};
  c[1].m.mask = "doc(q) == doc(kv)";
  c[1].m.params = c[1].prm;
  c[1].m.num_params = 1;
  c[1].bm = (fj_block_mask){128, 128, 1, 1, 16, 16, fake, fake, NULL, NULL};
  c[1].m.block_mask = &c[1].bm;
  c[1].p.mods = &c[1].m;
  base(&c[2], "bias");
  c[2].prm[0] = (fj_mod_param){"bias", FJ_MOD_F32, 2, {8, 8193, 0, 0}, fake, 0};
  c[2].m.score = "s + bias(h, q - kv + 4096)";
  c[2].m.params = c[2].prm;
  c[2].m.num_params = 1;
  c[2].p.mods = &c[2].m;
  base(&c[3], "softcap");
  c[3].m.softcap = 30.f;
  c[3].p.mods = &c[3].m;
}

typedef enum step {
  S_CHECK, S_PLAN, S_FWD, S_MODS_CHECK, S_CLASS, S_HASH, S_SAME, S_DATA,
  S_COUNT
} step;

static const char *const step_names[S_COUNT] = {
    "fj_problem_check", "fj_attention_plan",
    "fj_attention_fwd to the launch path", "  fj__mods_check",
    "  fj__plan_class", "  fj__mods_hash", "  fj__mods_same_form",
    "  the data checks"};

/* One step once; what it returns, so that the loop cannot drop it. */
static int run_step(fj_ctx *ctx, const hcase *c, const fj_plan *plan, step s)
{
  fj_plan out;
  const fj_mods *m = c->p.mods;
  switch (s) {
  case S_CHECK: return (int)fj_problem_check(ctx, &c->p);
  case S_PLAN: return (int)fj_attention_plan(ctx, &c->p, &out);
  case S_FWD:
    return (int)fj_attention_fwd(ctx, &c->p, fake, fake, fake, fake, NULL, NULL);
  case S_MODS_CHECK: return (int)fj__mods_check(ctx, m);
  case S_CLASS: return fj__plan_class(ctx, &c->p);
  case S_HASH: return (int)fj__mods_hash(m);
  case S_SAME: return fj__mods_same_form(plan->variant.mods, m);
  case S_DATA:
    return (int)fj__mods_check_blocks_data(ctx, m) + (int)fj__mods_check_data(ctx, m);
  default: return 0;
  }
}

/* Microseconds per call of one step: the best of ROUNDS loops of CALLS. */
static double time_step(fj_ctx *ctx, const hcase *c, const fj_plan *plan,
                        step s)
{
  double best = 1e30;
  volatile int sink = 0;
  for (int r = 0; r < ROUNDS; r++) {
    double t0 = now_us();
    for (int i = 0; i < CALLS; i++)
      sink += run_step(ctx, c, plan, s);
    double us = (now_us() - t0) / CALLS;
    best = us < best ? us : best;
  }
  (void)sink;
  return best;
}

/* The plan's variant (compared whole, as the dispatch cache does) and
 * launch shape. */
static int same_plan(const fj_plan *a, const fj_plan *b)
{
  return !memcmp(&a->variant, &b->variant, sizeof a->variant) &&
         a->splits == b->splits && !memcmp(a->grid, b->grid, sizeof a->grid) &&
         a->threads == b->threads && a->smem_bytes == b->smem_bytes &&
         a->workspace_bytes == b->workspace_bytes;
}

int test_host_call_cost(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  hcase c[4];
  make_cases(c);
  fj_plan plan[4];
  for (int i = 0; i < 4; i++) {
    /* The first plan renders the template; every later one must be it. */
    CHECK_OK(ctx, fj_attention_plan(ctx, &c[i].p, &plan[i]));
    CHECK_ST(ctx, fj_attention_fwd(ctx, &c[i].p, fake, fake, fake, fake, NULL, NULL),
             FJ_ERR_COMPILE_ONLY);
  }
  printf("%-38s", "us per call (best of 5 x 20000)");
  for (int i = 0; i < 4; i++)
    printf(" %10s", c[i].name);
  printf("\n");
  for (int s = 0; s < S_COUNT; s++) {
    printf("%-38s", step_names[s]);
    for (int i = 0; i < 4; i++)
      printf(" %10.3f", time_step(ctx, &c[i], &plan[i], (step)s));
    printf("\n");
  }
  for (int i = 0; i < 4; i++) {
    fj_plan again;
    CHECK_OK(ctx, fj_attention_plan(ctx, &c[i].p, &again));
    CHECK(same_plan(&again, &plan[i]));
  }
  fj_ctx_destroy(ctx);
  return 0;
}
