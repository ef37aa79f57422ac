/*
 * test_merge.c -- partial attention results merged (fj_reference_merge,
 * fj_attention_merge): key ranges of the float64 reference merged back
 * into the whole, with and without sinks; rows no part saw, NaN, varlen
 * rows past the end; the refusals of both forms (parts, alignment, the
 * problem); the GPU kernel against the float64 form, f16 and bf16, 1-256
 * parts, with sinks, BSHD strides.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "reference.h"
#include "runner.h"

static double next_value(uint64_t *s)
{
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(*s >> 11) / 4503599627370496.0 - 1.0;  /* [-1, 1) */
}

enum { MB = 2, MH = 2, MS = 5, MD = 8, MK = 12 };

/* Full attention over MK keys beside its three key ranges merged (with
 * sinks: the full problem's sinks, the merge's; the ranges' without). */
static int merge_split_keys(const float *sinks)
{
  static double q[MB * MH * MS * MD], kv[2][MB * MH * MK * MD];
  uint64_t seed = 7;
  for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
    q[i] = 2 * next_value(&seed);
  for (int t = 0; t < 2; t++)
    for (size_t i = 0; i < sizeof kv[0] / sizeof kv[0][0]; i++)
      kv[t][i] = 2 * next_value(&seed);
  fj_problem p;
  fj_mods m;
  fj_mods_init(&m);
  m.sinks = sinks;
  fj_problem_init(&p, MB, MH, MH, MS, MK, MD, FJ_F16, FJ_BHSD);
  p.mods = &m;
  static double full[MB * MH * MS * MD], full_lse[MB * MH * MS];
  CHECK_OK(NULL, fj__reference_fwd64(&p, q, kv[0], kv[1], full, full_lse));
  /* Keys 0-3, 4-4 (one key), 5-11; and a fourth part that saw nothing. */
  static const int cut[4][2] = {{0, 4}, {4, 5}, {5, 12}, {0, 0}};
  static double po[4][MB * MH * MS * MD], pl[4][MB * MH * MS];
  for (int s = 0; s < 4; s++) {
    int n = cut[s][1] - cut[s][0];
    for (int i = 0; !n && i < MB * MH * MS; i++)
      pl[s][i] = -HUGE_VAL;  /* its O stays 0 */
    if (!n)
      continue;
    fj_problem ps;
    fj_problem_init(&ps, MB, MH, MH, MS, n, MD, FJ_F16, FJ_BHSD);
    for (int i = 0; i < 3; i++)
      ps.k_stride[i] = ps.v_stride[i] = p.k_stride[i];
    const size_t off = (size_t)cut[s][0] * MD;
    CHECK_OK(NULL, fj__reference_fwd64(&ps, q, kv[0] + off, kv[1] + off, po[s], pl[s]));
  }
  static double out[MB * MH * MS * MD], lse[MB * MH * MS];
  CHECK_OK(NULL, fj_reference_merge(&p, 4, po[0], pl[0], out, lse));
  double worst = 0;
  for (size_t i = 0; i < sizeof out / sizeof out[0]; i++)
    worst = fmax(worst, fabs(out[i] - full[i]));
  for (size_t i = 0; i < sizeof lse / sizeof lse[0]; i++)
    worst = fmax(worst, fabs(lse[i] - full_lse[i]));
  printf("merge of 4 parts%s: max |diff| %.1e\n", sinks ? " with sinks" : "", worst);
  CHECK(worst < 1e-13);
  return 0;
}

/* Rows the parts did not see, NaN, varlen rows past the end. */
static int merge_edges(void)
{
  fj_problem p;
  fj_problem_init(&p, 1, 2, 2, 3, 3, 4, FJ_BF16, FJ_BHSD);
  double po[2][6][4], pl[2][6], out[6][4], lse[6];
  for (int s = 0; s < 2; s++)
    for (int i = 0; i < 6; i++) {
      pl[s][i] = -HUGE_VAL;
      for (int e = 0; e < 4; e++)
        po[s][i][e] = 1e300 * (s + 1);  /* never read: its LSE is -inf */
    }
  pl[1][0] = 0.5;  /* row 0: one part */
  for (int e = 0; e < 4; e++)
    po[1][0][e] = e;
  pl[0][1] = NAN;  /* row 1: NaN */
  CHECK_OK(NULL, fj_reference_merge(&p, 2, &po[0][0][0], pl[0], &out[0][0], lse));
  CHECK(lse[0] == 0.5 && out[0][3] == 3 && out[0][0] == 0);
  CHECK(isnan(lse[1]) && isnan(out[1][0]));
  CHECK(lse[2] == -HUGE_VAL && out[2][0] == 0 && out[2][3] == 0);  /* no part */
  /* A sink: a row no part saw gets O = 0 and the sink. */
  float sinks[2] = {0.25f, -1.0f};
  fj_mods m;
  fj_mods_init(&m);
  m.sinks = sinks;
  p.mods = &m;
  CHECK_OK(NULL, fj_reference_merge(&p, 2, &po[0][0][0], pl[0], &out[0][0], lse));
  CHECK(out[2][0] == 0 && lse[2] == 0.25 && lse[5] == -1.0);
  CHECK(fabs(lse[0] - log(exp(0.5) + exp(0.25))) < 1e-15);
  CHECK(fabs(out[0][3] - 3 * exp(0.5 - lse[0])) < 1e-15);
  /* Varlen: sequence 0 has 2 rows; its row 2 is no row. */
  int32_t cu[2] = {0, 2};
  p.mods = NULL;
  p.cu_seqlens_q = cu;
  for (int i = 0; i < 3; i++)  /* packed rows (FJ_THD): batch strides 0 */
    p.q_stride[i] = p.o_stride[i] = 4 * i;
  CHECK_OK(NULL, fj_reference_merge(&p, 2, &po[0][0][0], pl[0], &out[0][0], lse));
  CHECK(isnan(lse[2]) && out[2][0] == 0 && lse[0] == 0.5);
  return 0;
}

static int merge_refusals(void)
{
  fj_problem p;
  fj_problem_init(&p, 1, 1, 1, 1, 1, 8, FJ_F16, FJ_BHSD);
  double po[8], pl[1] = {0}, out[8];
  CHECK_ST(NULL, fj_reference_merge(&p, 0, po, pl, out, NULL), FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "fj_reference_merge: parts 0 is invalid: 1..256 (FJ_SPLITS_MAX)");
  CHECK_ST(NULL, fj_reference_merge(&p, 257, po, pl, out, NULL), FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "parts 257 is invalid");
  CHECK_ST(NULL, fj_reference_merge(&p, 1, NULL, pl, out, NULL), FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "fj_reference_merge: o_parts is NULL");
  p.head_dim = 0;
  CHECK_ST(NULL, fj_reference_merge(&p, 1, po, pl, out, NULL), FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "head_dim");
  return 0;
}

int test_merge_reference(void)
{
  float sinks[MH] = {0.5f, -2.0f};
  CHECK(!merge_split_keys(NULL));
  CHECK(!merge_split_keys(sinks));
  CHECK(!merge_edges());
  return merge_refusals();
}

/* fj_attention_merge without a GPU: its refusals, then its kernel built
 * and the launch refused. */
int test_merge_errors(void)
{
  fj_ctx *ctx = fjt_ctx("sm_90a", NULL);
  CHECK(ctx);
  fj_problem p;
  fj_problem_init(&p, 1, 4, 4, 100, 100, 128, FJ_BF16, FJ_BSHD);
  static _Alignas(16) float buf[64];
  void *o = buf;
  CHECK_ST(ctx, fj_attention_merge(ctx, &p, 0, buf, buf, o, NULL, NULL), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "fj_attention_merge: parts 0 is invalid: 1..256 (FJ_SPLITS_MAX)");
  CHECK_ST(ctx, fj_attention_merge(ctx, &p, 300, buf, buf, o, NULL, NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "parts 300 is invalid");
  CHECK_ST(ctx, fj_attention_merge(ctx, &p, 2, (float *)((char *)buf + 2), buf, o, NULL, NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "o_parts");
  CHECK_MSG(ctx, "is not 4-byte aligned (float32)");
  CHECK_ST(ctx, fj_attention_merge(ctx, &p, 2, buf, buf, (char *)o + 1, NULL, NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "is not 2-byte aligned (16-bit elements)");
  CHECK_ST(ctx, fj_attention_merge(ctx, &p, 2, buf, buf, o, (float *)((char *)buf + 1), NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "fj_attention_merge: lse");
  p.heads_kv = 3;
  CHECK_ST(ctx, fj_attention_merge(ctx, &p, 2, buf, buf, o, NULL, NULL), FJ_ERR_INVALID_ARG);
  CHECK_MSG(ctx, "heads_kv");
  p.heads_kv = 4;
  CHECK_ST(ctx, fj_attention_merge(ctx, &p, 2, buf, buf, o, NULL, NULL), FJ_ERR_COMPILE_ONLY);
  CHECK_MSG(ctx, "fj_attention_merge: the merge's kernel fj_combine_d128_bf16 compiled");
  /* O of 512 columns: 16 rows of 128 parts (16 blocks, fewer than sm_90a's
   * 132 multiprocessors) in slices of 128 columns, split-KV's rule; 64 x
   * 16 rows of 2 parts (256 blocks) one slice, the plain kernel. */
  fj_problem_init(&p, 1, 16, 16, 1, 100, 512, FJ_BF16, FJ_BSHD);
  CHECK_ST(ctx, fj_attention_merge(ctx, &p, 128, buf, buf, o, NULL, NULL), FJ_ERR_COMPILE_ONLY);
  CHECK_MSG(ctx, "the merge's kernel fj_combine_d512_bf16_c128 compiled");
  p.batch = 64;
  CHECK_ST(ctx, fj_attention_merge(ctx, &p, 2, buf, buf, o, NULL, NULL), FJ_ERR_COMPILE_ONLY);
  CHECK_MSG(ctx, "the merge's kernel fj_combine_d512_bf16 compiled");
  /* FP8 attention's e4m3 O is not the merge's (its f16 or bf16 O is). */
  fj_problem_init(&p, 1, 4, 4, 100, 100, 128, FJ_E4M3, FJ_BSHD);
  p.q_scale = p.k_scale = p.v_scale = buf;
  p.o_dtype = FJ_E4M3;
  CHECK_ST(ctx, fj_attention_merge(ctx, &p, 2, buf, buf, o, NULL, NULL), FJ_ERR_UNSUPPORTED);
  CHECK_MSG(ctx, "fj_attention_merge: o_dtype e4m3 is not implemented: the merge writes O in "
                 "f16 or bf16");
  fj_ctx_destroy(ctx);
  return 0;
}

/* ---- on a GPU ---------------------------------------------------------------------------- */

static void *gpu_copy(const void *host, size_t bytes)
{
  void *d = NULL;
  if (cudaMalloc(&d, bytes) != cudaSuccess)
    return NULL;
  cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice);
  return d;
}

/* One merge on the GPU (parts float32, O in dt, BSHD, with or without
 * sinks) against fj_reference_merge; returns the relative error of O
 * (+inf where a check fails), the largest LSE difference in *lse_err. */
static double gpu_merge_case(fj_ctx *ctx, fj_dtype dt, int parts, int sinks,
                             double *lse_err)
{
  enum { B = 2, H = 3, S = 37, D = 96 };
  size_t rows = (size_t)B * H * S, n = rows * D;
  float *po = malloc(sizeof *po * (size_t)parts * n), *pl = malloc(sizeof *pl * (size_t)parts * rows);
  double *po64 = malloc(sizeof *po64 * (size_t)parts * n), *pl64 = malloc(sizeof *pl64 * (size_t)parts * rows);
  uint64_t seed = (uint64_t)(parts * 31 + sinks);
  for (size_t i = 0; i < (size_t)parts * n; i++)
    po64[i] = po[i] = (float)next_value(&seed);
  for (size_t i = 0; i < (size_t)parts * rows; i++) {
    /* Every fifth entry saw no key (O 0); row 7 of every part none. */
    int none = i % 5 == 3 || i % rows == 7;
    pl64[i] = pl[i] = none ? -INFINITY : (float)(4 * next_value(&seed));
    for (size_t e = 0; none && e < D; e++)
      po64[i * D + e] = po[i * D + e] = 0;
  }
  float sk[H] = {0.5f, -1.5f, 2.0f};
  fj_mods m;
  fj_mods_init(&m);
  fj_problem p;
  fj_problem_init(&p, B, H, H, S, S, D, dt, FJ_BSHD);
  p.mods = &m;
  double *ref = malloc(sizeof *ref * n), *ref_lse = malloc(sizeof *ref_lse * rows);
  m.sinks = sinks ? sk : NULL;
  fj_status rst = fj_reference_merge(&p, parts, po64, pl64, ref, ref_lse);
  void *dpo = gpu_copy(po, sizeof *po * (size_t)parts * n);
  void *dpl = gpu_copy(pl, sizeof *pl * (size_t)parts * rows);
  void *dsk = gpu_copy(sk, sizeof sk), *dout = NULL, *dlse = NULL;
  cudaMalloc(&dout, n * 2);
  cudaMalloc(&dlse, rows * 4);
  cudaMemset(dout, 0xff, n * 2);  /* NaN: unwritten elements show */
  m.sinks = sinks ? dsk : NULL;
  fj_status st = fj_attention_merge(ctx, &p, parts, dpo, dpl, dout, dlse, NULL);
  uint16_t *o16 = malloc(n * 2);
  float *o32 = malloc(n * 4), *lse = malloc(rows * 4);
  cudaMemcpy(o16, dout, n * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(lse, dlse, rows * 4, cudaMemcpyDeviceToHost);
  fj_convert(FJ_F32, o32, dt, o16, n);
  double num = 0, den = 0, le = 0;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int s = 0; s < S; s++) {
        size_t f = ((size_t)b * H + (size_t)h) * S + (size_t)s;  /* BHSD, the reference's */
        size_t g = (((size_t)b * S + (size_t)s) * H + (size_t)h) * D;  /* BSHD */
        for (int e = 0; e < D; e++) {
          double x = (double)o32[g + (size_t)e] - ref[f * D + (size_t)e];
          num += x * x;
          den += ref[f * D + (size_t)e] * ref[f * D + (size_t)e];
        }
        double got = (double)lse[f];
        double y = isinf(ref_lse[f]) && got == ref_lse[f] ? 0 : fabs(got - ref_lse[f]);
        le = y > le || isnan(y) ? y : le;
      }
  void *dev[5] = {dpo, dpl, dsk, dout, dlse};
  for (int i = 0; i < 5; i++)
    cudaFree(dev[i]);
  void *host[9] = {po, pl, po64, pl64, ref, ref_lse, o16, o32, lse};
  for (int i = 0; i < 9; i++)
    free(host[i]);
  *lse_err = le;
  if (st != FJ_OK || rst != FJ_OK) {
    fprintf(stderr, "merge: %s\n", fj_errmsg(st != FJ_OK ? ctx : NULL));
    return (double)INFINITY;
  }
  double e = den > 0 ? sqrt(num / den) : sqrt(num);
  return isnan(e) ? (double)INFINITY : e;
}

int test_gpu_merge(void)
{
  fj_ctx *ctx;
  int rc = fjt_gpu_ctx(NULL, &ctx);
  if (rc)
    return rc;
  static const int parts[] = {1, 2, 3, 5, 8, 9, 31, 256};
  int bad = 0;
  for (int dt = 0; dt < 2; dt++)
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
      for (int sinks = 0; sinks < 2; sinks++) {
        double le, e = gpu_merge_case(ctx, dt ? FJ_BF16 : FJ_F16, parts[i], sinks, &le);
        int ok = e < (dt ? 8e-3 : 1e-3) && le < 1e-5;
        printf("%s merge %s parts %3d%s: rel_err %.2e, max |dLSE| %.1e\n", ok ? "ok" : "FAIL",
               dt ? "bf16" : "f16", parts[i], sinks ? " sinks" : "", e, le);
        bad += !ok;
      }
  fj_ctx_destroy(ctx);
  CHECK(bad == 0);
  return 0;
}
