/*
 * test_block_mask.c -- block masks (fj_block_mask) without a GPU: what the
 * checks refuse (status and message), the reference's reading of the
 * lists against masks written out here by hand (a block listed nowhere
 * hides its keys, a full block skips the mask expression), the size and
 * shape fj_block_mask_size gives, and the kernels that walk the lists and
 * the builder's kernel, compiled for both fast families without spills.
 * The results on a GPU are test_gpu_mods.c's.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "block_mask.h"
#include "runner.h"

/* A block mask's arrays on the host: [rows][kvb] lists, counts per row,
 * and the transposed ones: [cols][qb] lists, counts per column. */
typedef struct host_mask {
  fj_block_mask bm;
  int32_t *num, *idx, *full_num, *full_idx;
  int32_t *q_num, *q_idx, *full_q_num, *full_q_idx;
} host_mask;

/* Lists built by testing every pair of every block with keep(q, kv) (the
 * brute force the builder kernel avoids), for a mask of one batch index
 * and one head (rows = q_blocks, cols = kv_blocks), in both directions. */
static void host_lists(host_mask *m, int bq, int bkv, int seq_q, int seq_kv,
                       int (*keep)(int q, int kv))
{
  int qb = (seq_q + bq - 1) / bq, kb = (seq_kv + bkv - 1) / bkv;
  size_t n = (size_t)qb * (size_t)kb;
  int32_t **arr[8] = {&m->num, &m->full_num, &m->idx, &m->full_idx,
                      &m->q_num, &m->full_q_num, &m->q_idx, &m->full_q_idx};
  const size_t len[8] = {(size_t)qb, (size_t)qb, n, n, (size_t)kb, (size_t)kb, n, n};
  for (int i = 0; i < 8; i++)
    *arr[i] = calloc(len[i], 4);
  for (int i = 0; i < qb; i++)
    for (int j = 0; j < kb; j++) {
      int any = 0, all = 1;
      for (int q = i * bq; q < (i + 1) * bq && q < seq_q; q++)
        for (int kv = j * bkv; kv < (j + 1) * bkv && kv < seq_kv; kv++) {
          any |= keep(q, kv);
          all &= keep(q, kv);
        }
      /* i ascends within each column's lists, j within each row's. */
      if (any && all) {
        m->full_idx[i * kb + m->full_num[i]++] = j;
        m->full_q_idx[j * qb + m->full_q_num[j]++] = i;
      } else if (any) {
        m->idx[i * kb + m->num[i]++] = j;
        m->q_idx[j * qb + m->q_num[j]++] = i;
      }
    }
  m->bm = (fj_block_mask){bq, bkv, 1, 1, qb, kb, m->num, m->idx, m->full_num,
                          m->full_idx, m->q_num, m->q_idx, m->full_q_num,
                          m->full_q_idx};
}

static void host_free(host_mask *m)
{
  int32_t *arr[8] = {m->num, m->full_num, m->idx, m->full_idx,
                     m->q_num, m->full_q_num, m->q_idx, m->full_q_idx};
  for (int i = 0; i < 8; i++)
    free(arr[i]);
}

/* ---- refusals ------------------------------------------------------------------- */

int test_block_mask_refusals(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  int32_t arr[64] = {0};
  fj_block_mask bm = {128, 128, 1, 1, 8, 8, arr, arr, NULL, NULL, NULL, NULL, NULL, NULL};
  fj_mods m;
  fj_problem p;
  fj_mods_init(&m);
  m.block_mask = &bm;
  fj_problem_init(&p, 2, 4, 4, 1000, 1000, 64, FJ_F16, FJ_BHSD);
  p.mods = &m;
  CHECK_OK(ctx, fj_problem_check(ctx, &p));
  bm.block_kv = 96;
  CHECK_ST(ctx, fj_problem_check(ctx, &p), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "mods.block_mask->block_kv 96 is not a block size: 64, 128 or 256");
  bm.block_kv = 128;
  bm.batch = 3;
  CHECK_ST(ctx, fj_problem_check(ctx, &p), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "mods.block_mask->batch 3: 1 (one mask for every batch index) or the problem's batch 2");
  bm.batch = 2;
  bm.heads = 0;
  CHECK_ST(ctx, fj_problem_check(ctx, &p), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "mods.block_mask->heads 0 is below 1");
  bm.heads = 4;
  bm.q_blocks = 7;
  CHECK_ST(ctx, fj_problem_check(ctx, &p), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "mods.block_mask is 7 x 8 blocks of 128 x 128; seq_q 1000 and seq_kv 1000 need 8 x 8");
  bm.q_blocks = 8;
  CHECK_OK(ctx, fj_problem_check(ctx, &p));
  /* The arrays: checked where they are needed (fj_mods_check, a launch). */
  bm.kv_indices = NULL;
  CHECK_ST(NULL, fj_mods_check(&m), FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "mods.block_mask->kv_indices is NULL");
  bm.kv_indices = arr;
  bm.full_num = arr;
  CHECK_ST(NULL, fj_mods_check(&m), FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "mods.block_mask->full_indices is NULL but full_num is not");
  bm.full_num = NULL;
  CHECK_OK(NULL, fj_mods_check(&m));
  /* What block masks do not take. */
  p.splits = 4;
  CHECK_ST(ctx, fj_problem_check(ctx, &p), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "splits 4 with mods.block_mask is not implemented");
  p.splits = 0;
  int32_t cu[3] = {0, 500, 1000};
  p.cu_seqlens_q = cu;
  CHECK(fj_problem_check(ctx, &p) != FJ_OK);
  p.cu_seqlens_q = NULL;
  /* A given variant whose tiles do not divide the blocks. */
  fj_variant v;
  CHECK_OK(ctx, fj_attention_variant(ctx, &p, &v, NULL));
  v.tile_n = 96;
  fj_kernel *k;
  CHECK(fj_kernel_get(ctx, &v, &k) != FJ_OK);
  CHECK_MSG(ctx, "tile_n 96 must divide the block mask's blocks (128 query rows, 128 keys)");
  /* The builder's arguments. */
  size_t bytes;
  CHECK_ST(ctx, fj_block_mask_size(ctx, &p, 32, 128, &bytes), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "fj_block_mask_size: block_q 32 is not a block size: 64, 128 or 256");
  CHECK_ST(ctx, fj_block_mask_size(ctx, &p, 128, 128, NULL), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "bytes is NULL");
  fj_block_mask out;
  CHECK_OK(ctx, fj_block_mask_size(ctx, &p, 128, 128, &bytes));
  CHECK_ST(ctx, fj_block_mask_build(ctx, &p, 128, 128, arr, bytes - 4, &out, NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "is below the");
  CHECK_ST(ctx, fj_block_mask_build(ctx, &p, 128, 128, (char *)arr + 4, bytes, &out, NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "is not 16-byte aligned");
  fj_ctx_destroy(ctx);
  return 0;
}

/* ---- sizes -------------------------------------------------------------------------- */

/* The mask's batch and heads follow what its expression reads; the bytes
 * are the counts of both directions (16-byte aligned) then the four index
 * lists. */
int test_block_mask_size(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  fj_mod_param doc = {"doc", FJ_MOD_I32, 1, {4096}, (void *)16, 0};
  fj_mods m;
  fj_problem p;
  fj_mods_init(&m);
  fj_problem_init(&p, 4, 16, 4, 4096, 3000, 128, FJ_BF16, FJ_BHSD);
  p.causal = FJ_CAUSAL_BOTTOM_RIGHT;
  p.mods = &m;
  static const struct {
    const char *mask;
    int batch, heads;
  } cases[] = {
      {NULL, 1, 1}, {"doc(q) == doc(kv)", 1, 1}, {"kv < 100 + h", 1, 16},
      {"(kv ^ hkv) & 1", 1, 16}, {"kv <= b * 1000", 4, 1}, {"b != h", 4, 16},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    m.mask = cases[i].mask;
    m.params = &doc;
    m.num_params = 1;
    size_t bytes;
    CHECK_OK(ctx, fj_block_mask_size(ctx, &p, 128, 64, &bytes));
    size_t rows = (size_t)cases[i].batch * (size_t)cases[i].heads * 32;
    size_t cols = (size_t)cases[i].batch * (size_t)cases[i].heads * 47;  /* 3000 keys */
    size_t want = ((rows + cols) * 8 + 15) / 16 * 16 + rows * 47 * 16;
    printf("mask %s: %zu bytes (want %zu)\n", cases[i].mask ? cases[i].mask : "(none)",
           bytes, want);
    CHECK(bytes == want);
  }
  /* Lists past 2^63 bytes are refused, naming the blocks, not sized by a
   * product that wrapped round (65535 batches and heads of 2^20 rows of 64
   * columns in 64-row blocks: 2^64 bytes, which was 5.6e14). */
  fj_problem_init(&p, 65535, 65535, 65535, 1 << 20, 1 << 20, 8, FJ_F16, FJ_BHSD);
  p.mods = &m;
  m.mask = "b != h";
  m.num_params = 0;
  size_t bytes = 0;
  CHECK_ST(ctx, fj_block_mask_size(ctx, &p, 64, 64, &bytes), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "fj_block_mask_size: batch 65535 x heads 65535 x 16384 query "
                 "blocks x 16384 key blocks take 1.84e+19 bytes of lists, more "
                 "than 2^63; take larger blocks");
  CHECK(bytes == 0);
  p.seq_q = p.seq_kv = 1 << 19;  /* 2^62 bytes: counted */
  CHECK_OK(ctx, fj_block_mask_size(ctx, &p, 64, 64, &bytes));
  CHECK(bytes > ((size_t)1 << 62));
  fj_ctx_destroy(ctx);
  return 0;
}

/* ---- the reference ------------------------------------------------------------------ */

#define RQ 200
#define RKV 170
#define RD 16
#define RB 64

/* Documents of 70 keys (and 70 queries), and the same with causal. */
static int doc_keep(int q, int kv) { return q / 70 == kv / 70; }

/* One reference run of a (1, 1, RQ, RKV, RD) problem with mods m. */
static int run_ref(fj_mods *m, const uint16_t *q, const uint16_t *k,
                   const uint16_t *v, double *out, double *lse)
{
  fj_problem p;
  fj_problem_init(&p, 1, 1, 1, RQ, RKV, RD, FJ_F16, FJ_BHSD);
  p.mods = m;
  fj_status st = fj_reference_fwd(&p, q, k, v, NULL, NULL, 0, RQ, out, lse);
  if (st != FJ_OK)
    fprintf(stderr, "fj_reference_fwd: %s\n", fj_errmsg(NULL));
  return st == FJ_OK ? 0 : -1;
}

static int same(const double *a, const double *b, size_t n)
{
  for (size_t i = 0; i < n; i++)
    if (!(a[i] == b[i]) && !(isinf(a[i]) && isinf(b[i]) && a[i] == b[i]))
      return 0;
  return 1;
}

/* Exact lists give the expression's result; a block left out hides its
 * keys; a partial block listed as full skips the expression there.  Each
 * against the reference of a mask expression written for that case. */
int test_block_mask_reference(void)
{
  static float fq[RQ * RD], fk[RKV * RD], fv[RKV * RD];
  static uint16_t q[RQ * RD], k[RKV * RD], v[RKV * RD];
  static double o1[RQ * RD], o2[RQ * RD], l1[RQ], l2[RQ];
  uint64_t st = 7;
  for (int i = 0; i < RQ * RD; i++)
    fq[i] = (float)((st = st * 6364136223846793005ull + 1) >> 40) / (1 << 24) - 0.5f;
  for (int i = 0; i < RKV * RD; i++) {
    fk[i] = (float)((st = st * 6364136223846793005ull + 1) >> 40) / (1 << 24) - 0.5f;
    fv[i] = (float)((st = st * 6364136223846793005ull + 1) >> 40) / (1 << 24) - 0.5f;
  }
  CHECK_OK(NULL, fj_convert(FJ_F16, q, FJ_F32, fq, RQ * RD));
  CHECK_OK(NULL, fj_convert(FJ_F16, k, FJ_F32, fk, RKV * RD));
  CHECK_OK(NULL, fj_convert(FJ_F16, v, FJ_F32, fv, RKV * RD));
  host_mask hm;
  host_lists(&hm, RB, RB, RQ, RKV, doc_keep);
  /* 4 x 3 blocks of 64: documents 0-69, 70-139, 140-199. */
  CHECK(hm.bm.q_blocks == 4 && hm.bm.kv_blocks == 3);
  CHECK(hm.full_num[0] == 1 && hm.full_idx[0] == 0 && hm.num[0] == 1 && hm.idx[0] == 1);
  fj_mods plain, listed;
  fj_mods_init(&plain);
  plain.mask = "q / 70 == kv / 70";
  listed = plain;
  listed.block_mask = &hm.bm;
  CHECK(run_ref(&plain, q, k, v, o1, l1) == 0);
  CHECK(run_ref(&listed, q, k, v, o2, l2) == 0);
  CHECK(same(o1, o2, RQ * RD) && same(l1, l2, RQ));
  /* Query block 1 (rows 64-127) without its partial key block 2 (keys
   * 128-169): rows 70-127 lose keys 128-139. */
  CHECK(hm.num[1] == 3 && hm.full_num[1] == 0 && hm.idx[1 * 3 + 0] == 0 &&
        hm.idx[1 * 3 + 2] == 2);
  hm.num[1] = 2;
  plain.mask = "q / 70 == kv / 70 && !(q / 64 == 1 && kv / 64 == 2)";
  CHECK(run_ref(&plain, q, k, v, o1, l1) == 0);
  CHECK(run_ref(&listed, q, k, v, o2, l2) == 0);
  CHECK(same(o1, o2, RQ * RD) && same(l1, l2, RQ));
  /* Query block 1's partial key block 0 listed as full instead: rows
   * 64-69 keep keys 0-63 and rows 70-127 see them too. */
  hm.idx[1 * 3 + 0] = 2;
  hm.full_idx[1 * 3 + hm.full_num[1]++] = 0;
  plain.mask = "q / 70 == kv / 70 || (q / 64 == 1 && kv / 64 == 0)";
  CHECK(run_ref(&plain, q, k, v, o1, l1) == 0);
  CHECK(run_ref(&listed, q, k, v, o2, l2) == 0);
  CHECK(same(o1, o2, RQ * RD) && same(l1, l2, RQ));
  /* Counts past the key blocks are clamped; every row of a query block
   * whose lists are empty has no key: O = 0, LSE = -inf. */
  hm.num[3] = 0;
  hm.full_num[3] = 0;
  hm.num[2] = 1000;
  CHECK(run_ref(&listed, q, k, v, o2, l2) == 0);
  CHECK(o2[192 * RD] == 0.0 && isinf(l2[192]) && l2[192] < 0);
  host_free(&hm);
  return 0;
}

/* ---- kernels ------------------------------------------------------------------------ */

/* The pick for a block-masked problem: tiles that divide the blocks, the
 * name's "_bm", the list walk in the source, no spills; other arrays (or
 * another mask of the same blocks) reuse it. */
int test_block_mask_compile(void)
{
  static const char *const archs[] = {"sm_80", "sm_90a"};
  static const int sizes[][2] = {{128, 128}, {64, 64}, {256, 128}, {128, 64}};
  fj_mod_param doc = {"doc", FJ_MOD_I32, 1, {4096}, NULL, 0};
  int32_t arr[4] = {0};
  for (int a = 0; a < 2; a++) {
    fj_ctx *ctx = fjt_ctx(archs[a], NULL);
    CHECK(ctx);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
      fj_block_mask bm = {sizes[i][0], sizes[i][1], 1, 1,
                          4096 / sizes[i][0], 4096 / sizes[i][1], arr, arr, arr, arr,
                          arr, arr, arr, arr};
      fj_mods m;
      fj_problem p;
      fj_mods_init(&m);
      m.mask = "doc(q) == doc(kv)";
      m.params = &doc;
      m.num_params = 1;
      m.block_mask = &bm;
      fj_problem_init(&p, 4, 16, 16, 4096, 4096, 128, FJ_BF16, FJ_BHSD);
      p.causal = FJ_CAUSAL_BOTTOM_RIGHT;
      p.mods = &m;
      fj_plan plan;
      CHECK_OK(ctx, fj_attention_plan(ctx, &p, &plan));
      const fj_variant *v = &plan.variant;
      char name[160];
      fj_variant_name(v, name, sizeof name);
      fj_kernel *k, *k2;
      CHECK_OK(ctx, fj_kernel_get(ctx, v, &k));
      fj_resources r;
      fj_kernel_resources(k, &r);
      printf("%s: %d registers, %d/%d spill bytes\n", name, r.registers,
             r.spill_store_bytes, r.spill_load_bytes);
      char bm_name[24];
      snprintf(bm_name, sizeof bm_name, "_bm%dx%d", sizes[i][0], sizes[i][1]);
      CHECK(strstr(name, bm_name));
      CHECK(sizes[i][0] % v->tile_m == 0 && sizes[i][1] % v->tile_n == 0);
      CHECK(v->mma == (a && sizes[i][0] >= 128 ? FJ_MMA_WGMMA : FJ_MMA_SYNC));
      CHECK(!v->split_kv && !v->pack_gqa);
      CHECK(r.spill_store_bytes == 0 && r.spill_load_bytes == 0);
      const char *src = fj_kernel_source(k, NULL);
      CHECK(strstr(src, "fj::list_n0(bl, t)") && strstr(src, "if (bm_part) {"));
      /* Other arrays, the same form: the same kernel, nothing compiled. */
      fj_cache_stats before, after;
      fj_cache_stats_get(ctx, &before);
      int32_t other[2];
      bm.kv_num = bm.kv_indices = other;
      bm.full_num = bm.full_indices = NULL;
      CHECK_OK(ctx, fj_kernel_get(ctx, v, &k2));
      fj_cache_stats_get(ctx, &after);
      CHECK(k2 == k && after.misses == before.misses);
      /* The builder's kernel compiles on a compile-only context, which
       * then refuses to launch it. */
      size_t bytes;
      CHECK_OK(ctx, fj_block_mask_size(ctx, &p, sizes[i][0], sizes[i][1], &bytes));
      void *buf = aligned_alloc(16, (bytes + 15) / 16 * 16);
      fj_block_mask out;
      doc.data = arr;
      CHECK_ST(ctx, fj_block_mask_build(ctx, &p, sizes[i][0], sizes[i][1], buf, bytes,
                                        &out, NULL),
               FJ_ERR_COMPILE_ONLY);
      CHECK_MSG(ctx, "fj_block_mask_build: the mask's kernel fj_block_mask_");
      /* That kernel lists both directions: each column's last block (its
       * count in q_num) turns the column's states into its lists. */
      fj_kernel *bk;
      CHECK_OK(ctx, fj__block_mask_kernel(ctx, &p, sizes[i][0], sizes[i][1], &bk));
      const char *bsrc = fj_kernel_source(bk, NULL);
      CHECK(strstr(bsrc, "clast = atomicAdd(out.q_num + col, 1) == out.q_blocks - 1;") &&
            strstr(bsrc, "fj::states_to_lists(cstate, out.full_q_idx + col * out.q_blocks"));
      doc.data = NULL;
      free(buf);
    }
    fj_ctx_destroy(ctx);
  }
  return 0;
}
