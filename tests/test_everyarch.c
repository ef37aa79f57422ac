/*
 * test_everyarch.c -- the library's own choice on every architecture NVRTC
 * targets, without a GPU: for each target (every sm_XY[a] a compile-only
 * context accepts, sm_75 to sm_121a), every documented head dim, both
 * dtypes, with and without a causal mask, and the serving shapes (dense
 * with GQA, few blocks, packed decode with split-KV, varlen, paged decode
 * and prefill), fj_attention_plan's variant compiles without spilling --
 * or the plan is refused with a message that says which feature the
 * target lacks (bf16 before sm_80).  Each distinct kernel compiles once,
 * in child processes, into a cache shared across the test.
 */
#include <stdlib.h>
#include <string.h>

#include "ctx.h"
#include "runner.h"

enum { SHAPES = 6, DIMS = 7, PROBLEMS = SHAPES * DIMS * 2 * 2 };

static const int32_t dummy[1];

static const char *const shape_names[SHAPES] = {
    "dense-gqa", "few-blocks", "decode", "varlen", "paged-decode", "paged"};

/* Problem i of the matrix: shape, head dim, dtype, mask.  Decode shapes
 * take the bottom-right diagonal (their queries are the sequence's
 * last), the others top-left. */
static void problem_of(int i, fj_problem *p, const char **shape)
{
  static const int dims[DIMS] = {32, 64, 96, 128, 160, 192, 256};
  int s = i % SHAPES, d = dims[i / SHAPES % DIMS];
  fj_dtype dt = i / (SHAPES * DIMS) % 2 ? FJ_BF16 : FJ_F16;
  int causal = i / (SHAPES * DIMS * 2) % 2;
  static const int sizes[SHAPES][5] = {
      {2, 16, 4, 4096, 4096}, {1, 8, 8, 512, 512},  {8, 32, 8, 1, 4096},
      {4, 16, 16, 2048, 2048}, {8, 32, 8, 1, 4096}, {2, 16, 4, 1024, 4096}};
  const int *x = sizes[s];
  fj_problem_init(p, x[0], x[1], x[2], x[3], x[4], d, dt,
                  s == 3 ? FJ_THD : FJ_BHSD);
  int decode = x[3] == 1;
  p->causal = !causal ? FJ_CAUSAL_NONE
              : decode ? FJ_CAUSAL_BOTTOM_RIGHT : FJ_CAUSAL_TOP_LEFT;
  if (s == 3) {
    p->cu_seqlens_q = p->cu_seqlens_kv = dummy;
    p->total_q = p->total_kv = x[0] * x[3];
  }
  if (s >= 4) {
    int ps = 16;
    p->block_table = p->seqused_kv = dummy;
    p->page_size = ps;
    p->max_pages = (x[4] + ps - 1) / ps;
    p->num_pages = x[0] * p->max_pages;
    int64_t st[3] = {(int64_t)ps * x[2] * d, d, (int64_t)x[2] * d};
    memcpy(p->k_stride, st, sizeof st);
    memcpy(p->v_stride, st, sizeof st);
  }
  *shape = shape_names[s];
}

/* The targets: every sm_XY and sm_XYa from sm_75 on that a compile-only
 * context accepts (the NVRTC the library loaded says which). */
static int targets(char out[][16], int max)
{
  int n = 0;
  for (int sm = 75; sm <= 130 && n < max; sm++)
    for (int a = 0; a < 2 && n < max; a++) {
      fj_ctx_opts o;
      fj_ctx_opts_init(&o);
      o.device = -1;
      snprintf(out[n], 16, "sm_%d%s", sm, a ? "a" : "");
      o.arch = out[n];
      o.disk_cache = 0;
      fj_ctx *ctx = NULL;
      if (fj_ctx_create(&ctx, &o) == FJ_OK)
        n++;
      fj_ctx_destroy(ctx);
    }
  return n;
}

/* Whether refusal of problem p on ctx is one the issue allows: a feature
 * the target does not have, named in the message. */
static int refusal_allowed(const fj_ctx *ctx, const fj_problem *p)
{
  const char *msg = fj_errmsg(ctx);
  if (p->dtype == FJ_BF16 && !fj__arch_has(ctx, FJ_ARCH_BF16))
    return strstr(msg, "bf16 needs sm_80") != NULL;
  /* sm_75's wmma family takes dense problems only. */
  return (p->cu_seqlens_q || p->block_table) &&
         !fj__arch_has(ctx, FJ_ARCH_MMA_SYNC) &&
         strstr(msg, "has no mma.sync m16n8k16 (sm_80 and newer), so its "
                     "only family is wmma") != NULL;
}

/* Whether target a checks problem i.  Every head dim and shape on every
 * target; of the four dtype and mask pairs one, turning with the target,
 * the head dim and the shape, so that the targets of a family between
 * them cover all four (a quarter of the compiles: the suite's time on
 * two cores).  FLASHJIT_EVERYARCH_FULL=1 checks the whole product. */
static int covered(int a, int i)
{
  const char *full = getenv("FLASHJIT_EVERYARCH_FULL");
  if (full && *full == '1')
    return 1;
  int s = i % SHAPES, d = i / SHAPES % DIMS, pair = i / (SHAPES * DIMS);
  return pair == (a + d + s) % 4;
}

/* The plans of the matrix on target a: the distinct variants into vs
 * (first problem of each in first), *bad counting unexplained refusals. */
static size_t plan_all(fj_ctx *ctx, int a, fj_variant *vs, int *first,
                       int *bad)
{
  size_t n = 0;
  for (int i = 0; i < PROBLEMS; i++) {
    if (!covered(a, i))
      continue;
    fj_problem p;
    const char *shape;
    fj_plan plan;
    problem_of(i, &p, &shape);
    if (fj_attention_plan(ctx, &p, &plan) != FJ_OK) {
      if (!refusal_allowed(ctx, &p)) {
        fprintf(stderr, "%s %s d%d: refused: %s\n", fj_ctx_arch(ctx), shape,
                p.head_dim, fj_errmsg(ctx));
        (*bad)++;
      }
      continue;
    }
    size_t j = 0;
    while (j < n && memcmp(&vs[j], &plan.variant, sizeof plan.variant) != 0)
      j++;
    if (j == n) {
      first[n] = i;
      vs[n++] = plan.variant;
    }
  }
  return n;
}

/* Compiles the variants (child processes, the shared cache) and checks
 * each for spills and the target's shared memory; returns failures. */
static int check_all(fj_ctx *ctx, const fj_variant *vs, const int *first,
                     size_t n)
{
  fj_status each[PROBLEMS];
  fj_prepare_opts o = {0, NULL, NULL};
  fj_cache_prewarm(ctx, vs, n, &o, each, NULL);
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    fj_problem p;
    const char *shape;
    problem_of(first[i], &p, &shape);
    char name[160];
    fj_variant_name(&vs[i], name, sizeof name);
    fj_kernel *k;
    fj_status st = each[i] == FJ_OK ? fj_kernel_get(ctx, &vs[i], &k) : each[i];
    if (st != FJ_OK) {
      fprintf(stderr, "%s %s: %s: %s\n", fj_ctx_arch(ctx), shape, name,
              fj_status_str(st));
      bad++;
      continue;
    }
    fj_resources r;
    fj_kernel_resources(k, &r);
    /* The one measured exception: sm_90a's head-dim-160 varlen pick
     * without a mask keeps 64-key tiles, which spill 8 bytes and ran 2%
     * faster than the spill-free 32 on the H100 (src/plan.c). */
    int measured = !strcmp(fj_ctx_arch(ctx), "sm_90a") && vs[i].head_dim == 160 &&
                   vs[i].varlen && vs[i].causal == FJ_CAUSAL_NONE &&
                   vs[i].tile_n == 64 && r.spill_store_bytes <= 8;
    int spill = !measured && (r.spill_store_bytes || r.spill_load_bytes);
    int smem = r.shared_static + r.shared_dynamic;
    printf("%-7s %-12s %-56s regs=%3d smem=%6d spill=%d/%d%s\n",
           fj_ctx_arch(ctx), shape, name, r.registers, smem,
           r.spill_store_bytes, r.spill_load_bytes, spill ? "  SPILLS" : "");
    bad += spill || smem > fj__smem_limit(ctx);
  }
  return bad;
}

/* FLASHJIT_EVERYARCH, when set, names the only target to check (one
 * family's arch while tuning its rules). */
int test_everyarch_picks(void)
{
  static char archs[64][16];
  int na = targets(archs, 64), bad = 0;
  const char *only = getenv("FLASHJIT_EVERYARCH");
  CHECK(na >= 10);  /* sm_75 ... sm_121a with NVRTC 12.8 or newer */
  const char *dir = fjt_tmpdir();
  CHECK(dir != NULL);
  for (int a = 0; a < na; a++) {
    if (only && *only && strcmp(only, archs[a]) != 0)
      continue;
    fj_ctx *ctx = fjt_ctx(archs[a], dir);
    CHECK(ctx != NULL);
    static fj_variant vs[PROBLEMS];
    static int first[PROBLEMS];
    size_t n = plan_all(ctx, a, vs, first, &bad);
    bad += check_all(ctx, vs, first, n);
    fj_ctx_destroy(ctx);
  }
  if (bad)
    fprintf(stderr, "%d picks refused or spilling\n", bad);
  CHECK(bad == 0);
  return 0;
}
