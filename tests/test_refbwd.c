/*
 * test_refbwd.c -- the float64 reference's backward (fj_reference_bwd):
 * its gradients against central differences of L = sum(dout . O) (plus
 * sum(dlse . LSE) where the problem has dlse) through the reference's
 * forward, on float64 inputs (reference.h's
 * fj__reference_fwd64/_bwd64: 16-bit inputs cannot be nudged by a small
 * step); the public float32 call against that path; its refusals.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "numbers.h"
#include "reference.h"
#include "runner.h"

/* A small problem with its inputs as doubles, BHSD (so that the
 * reference's [batch][head][row][dim] output is O's layout too). */
typedef struct gproblem {
  fj_problem p;
  fj_mods m;
  float sinks[4];
  float dlse[64];  /* the loss's weights of the LSEs, where p.dlse is set */
  double *q, *k, *v, *dout;
  size_t nq, nkv;
  /* The central differences' step and the largest relative error taken:
   * 1e-5 and 1e-6, except where a score expression computes in float32
   * (the reference's, as the kernels'), whose rounding a step of 1e-5
   * would see. */
  double step, tol;
} gproblem;

/* Uniform in [-a, a), from a fixed sequence. */
static double next_value(uint32_t *state, double a)
{
  *state = *state * 1664525u + 1013904223u;
  return a * ((double)(*state >> 8) / 8388608.0 - 1.0);
}

static void fill(double *x, size_t n, uint32_t *state, double a)
{
  for (size_t i = 0; i < n; i++)
    x[i] = next_value(state, a);
}

/* batch 2, heads 2 on 1 KV head (GQA 2:1), head dim 8; the sequence
 * lengths as given.  0 on success. */
static int gproblem_init(gproblem *g, int sq, int skv)
{
  fj_problem_init(&g->p, 2, 2, 1, sq, skv, 8, FJ_F16, FJ_BHSD);
  fj_mods_init(&g->m);
  g->p.mods = &g->m;
  g->step = 1e-5;
  g->tol = 1e-6;
  g->nq = (size_t)2 * 2 * (size_t)sq * 8;
  g->nkv = (size_t)2 * 1 * (size_t)skv * 8;
  g->q = malloc(sizeof(double) * (2 * g->nq + 2 * g->nkv));
  if (!g->q)
    return 1;
  g->k = g->q + g->nq;
  g->v = g->k + g->nkv;
  g->dout = g->v + g->nkv;
  uint32_t state = (uint32_t)(sq * 131 + skv);
  fill(g->q, g->nq, &state, 1.5);  /* scores of a few units: P not flat */
  fill(g->k, g->nkv, &state, 1.5);
  fill(g->v, g->nkv, &state, 1.0);
  fill(g->dout, g->nq, &state, 1.0);
  for (size_t i = 0; i < sizeof g->dlse / sizeof g->dlse[0]; i++)
    g->dlse[i] = (float)next_value(&state, 1.0);
  return 0;
}

/* L = sum(dout . O) + sum(dlse . LSE) over the rows that see a key, or
 * NAN where the forward fails. */
static double loss(const gproblem *g, double *o)
{
  double lse[64];
  if (fj__reference_fwd64(&g->p, g->q, g->k, g->v, o, lse) != FJ_OK)
    return NAN;
  double l = 0;
  for (size_t i = 0; i < g->nq; i++)
    l += g->dout[i] * o[i];
  for (size_t i = 0; g->p.dlse && i < g->nq / 8; i++)
    if (isfinite(lse[i]))
      l += (double)g->dlse[i] * lse[i];
  return l;
}

/* max |analytic - central difference| / max |analytic| over one array's
 * elements, stepping each by h. */
static double fd_error(gproblem *g, double *x, const double *grad, size_t n,
                       double *o)
{
  const double h = g->step;
  double worst = 0, big = 0;
  for (size_t i = 0; i < n; i++) {
    double x0 = x[i];
    x[i] = x0 + h;
    double up = loss(g, o);
    x[i] = x0 - h;
    double down = loss(g, o);
    x[i] = x0;
    double diff = fabs((up - down) / (2 * h) - grad[i]);
    worst = diff > worst || isnan(diff) ? diff : worst;
    big = fabs(grad[i]) > big ? fabs(grad[i]) : big;
  }
  return big > 0 ? worst / big : worst;
}

/* The sinks' gradients by steps of 2^-13, exact in float32 for the
 * sinks used here. */
static double fd_sinks(gproblem *g, const double *grad, double *o)
{
  const float h = 0x1p-13f;
  double worst = 0, big = 0;
  for (int i = 0; i < g->p.heads_q; i++) {
    float s0 = g->sinks[i];
    g->sinks[i] = s0 + h;
    double up = loss(g, o);
    g->sinks[i] = s0 - h;
    double down = loss(g, o);
    g->sinks[i] = s0;
    double diff = fabs((up - down) / (2.0 * (double)h) - grad[i]);
    worst = diff > worst || isnan(diff) ? diff : worst;
    big = fabs(grad[i]) > big ? fabs(grad[i]) : big;
  }
  return big > 0 ? worst / big : worst;
}

/* The gradients, finite and checked against central differences; with
 * sinks, theirs too.  The worst relative error is printed. */
static int gradcheck(gproblem *g, const char *name)
{
  int sinks = g->m.sinks != NULL;
  double *dq = malloc(sizeof(double) * (2 * g->nq + 2 * g->nkv + 4));
  if (!dq)
    return 1;
  double *dk = dq + g->nq, *dv = dk + g->nkv, *o = dv + g->nkv;
  double ds[4] = {0};
  fj_status st = fj__reference_bwd64(&g->p, g->q, g->k, g->v, g->dout, dq,
                                     dk, dv, ds);
  int bad = st != FJ_OK;
  for (size_t i = 0; !bad && i < g->nq + 2 * g->nkv; i++)
    bad = !isfinite(dq[i]);
  double e[4] = {0};
  if (!bad) {
    e[0] = fd_error(g, g->q, dq, g->nq, o);
    e[1] = fd_error(g, g->k, dk, g->nkv, o);
    e[2] = fd_error(g, g->v, dv, g->nkv, o);
    e[3] = sinks ? fd_sinks(g, ds, o) : 0;
  }
  printf("  %-28s dq %.1e dk %.1e dv %.1e dsinks %.1e\n", name, e[0], e[1],
         e[2], e[3]);
  free(dq);
  if (bad)
    fprintf(stderr, "%s: status %d or a gradient not finite: %s\n", name,
            (int)st, fj_errmsg(NULL));
  for (int i = 0; i < 4; i++)
    bad |= !(e[i] < g->tol);
  return bad;
}

/* One case: sizes, then the changes from a plain problem. */
typedef struct gcase {
  const char *name;
  int sq, skv;
  fj_causal causal;
  int left, right;     /* the window; -1 -1: none */
  float softcap, scale;
  int sinks;
  const char *mask;
} gcase;

static int run_case(const gcase *c, int dlse)
{
  gproblem g;
  if (gproblem_init(&g, c->sq, c->skv))
    return 1;
  if (dlse)
    g.p.dlse = g.dlse;
  g.p.causal = c->causal;
  g.p.scale = c->scale;
  g.m.window_left = c->left;
  g.m.window_right = c->right;
  g.m.softcap = c->softcap;
  g.m.mask = c->mask;
  if (c->sinks) {
    g.sinks[0] = 0.75f;   /* near the scores, so that both matter */
    g.sinks[1] = -0.5f;
    g.m.sinks = g.sinks;
  }
  int bad = gradcheck(&g, c->name);
  free(g.q);
  return bad;
}

int test_refbwd_gradcheck(void)
{
  static const gcase cases[] = {
      {"plain", 5, 7, FJ_CAUSAL_NONE, -1, -1, 0, 0, 0, NULL},
      {"scale 0.7", 5, 7, FJ_CAUSAL_NONE, -1, -1, 0, 0.7f, 0, NULL},
      {"top-left, sq < skv", 5, 7, FJ_CAUSAL_TOP_LEFT, -1, -1, 0, 0, 0, NULL},
      {"top-left, sq > skv", 7, 5, FJ_CAUSAL_TOP_LEFT, -1, -1, 0, 0, 0, NULL},
      {"bottom-right, sq < skv", 5, 7, FJ_CAUSAL_BOTTOM_RIGHT, -1, -1, 0, 0,
       0, NULL},
      {"bottom-right, sq > skv", 7, 5, FJ_CAUSAL_BOTTOM_RIGHT, -1, -1, 0, 0,
       0, NULL},
      {"window 2, 1", 5, 7, FJ_CAUSAL_NONE, 2, 1, 0, 0, 0, NULL},
      {"causal window 1", 7, 5, FJ_CAUSAL_TOP_LEFT, 1, 0, 0, 0, 0, NULL},
      {"softcap 1.5", 5, 7, FJ_CAUSAL_NONE, -1, -1, 1.5f, 0, 0, NULL},
      {"sinks", 5, 7, FJ_CAUSAL_NONE, -1, -1, 0, 0, 1, NULL},
      {"sinks, bottom-right", 7, 5, FJ_CAUSAL_BOTTOM_RIGHT, -1, -1, 0, 0, 1,
       NULL},
      {"all: softcap sinks window", 5, 7, FJ_CAUSAL_BOTTOM_RIGHT, 3, 0, 2.0f,
       0.5f, 1, NULL},
      {"mask expression", 5, 7, FJ_CAUSAL_NONE, -1, -1, 0, 0, 0,
       "(q + kv) % 3 != 1"},
  };
  int bad = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    bad |= run_case(&cases[i], 0);
  /* The loss uses the LSEs too (fj_problem.dlse). */
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    bad |= run_case(&cases[i], 1);
  return bad;
}

/* Score expressions: the reference's backward multiplies dS by the
 * expression's derivative (expr_grad.c) at the raw score; central
 * differences of the forward (which evaluates the expression in float32)
 * with steps of 1e-3, within 2e-3.  Parameters: a float slope table per
 * head, an int document table per key. */
int test_refbwd_score_exprs(void)
{
  static const float slopes[2] = {0.5f, -0.25f};
  static const int32_t docs[7] = {0, 0, 0, 1, 1, 2, 2};
  static const float bias[2][16] = {
      {0.1f, -0.2f, 0.3f, 0.05f, -0.4f, 0.2f, 0.0f, 0.15f,
       -0.1f, 0.25f, -0.3f, 0.35f, 0.1f, -0.05f, 0.2f, -0.15f},
      {0.2f, 0.1f, -0.1f, 0.0f, 0.3f, -0.2f, 0.1f, 0.05f,
       0.15f, -0.25f, 0.2f, 0.1f, -0.35f, 0.3f, 0.0f, 0.05f}};
  fj_mod_param params[3] = {
      {"slope", FJ_MOD_F32, 1, {2, 0, 0, 0}, slopes, 0},
      {"doc", FJ_MOD_I32, 1, {7, 0, 0, 0}, docs, 0},
      {"rel", FJ_MOD_F32, 2, {2, 16, 0, 0}, bias, 0}};
  static const struct {
    const char *name, *score, *mask;
    float softcap;
  } cases[] = {
      {"alibi table", "s + slope(h) * (float)(kv - q)", NULL, 0},
      {"user softcap", "3.0f * tanhf(s / 3.0f)", NULL, 0},
      {"relative bias", "s + rel(h, q - kv + 8)", NULL, 0},
      {"guarded 1/x", "s - 1.0f / (s * s + 1.0f)", NULL, 0},
      {"ternary, powf", "q >= kv ? s * s * 0.5f : powf(fabsf(s) + 1.0f, 1.5f)",
       NULL, 0},
      {"expression, softcap", "s * 1.5f + (float)(q - kv) * 0.1f", NULL, 2.0f},
      {"document mask", "s * slope(h)", "doc(q) == doc(kv)", 0},
  };
  int bad = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    gproblem g;
    if (gproblem_init(&g, 5, 7))
      return 1;
    g.m.score = cases[i].score;
    g.m.mask = cases[i].mask;
    g.m.softcap = cases[i].softcap;
    g.m.params = params;
    g.m.num_params = 3;
    g.step = 1e-3;
    g.tol = 2e-3;
    bad |= gradcheck(&g, cases[i].name);
    free(g.q);
  }
  return bad;
}

/* The check above can fail: the derivative left out (a score expression
 * whose derivative is far from 1, its gradients taken as if it were s),
 * the finite differences disagree. */
int test_refbwd_score_exprs_catch(void)
{
  gproblem g, h;
  if (gproblem_init(&g, 5, 7) || gproblem_init(&h, 5, 7))
    return 1;
  g.m.score = "s * 3.0f";   /* the forward the differences see */
  g.step = h.step = 1e-3;
  double *grad = malloc(sizeof(double) * (2 * g.nq + 2 * g.nkv + 4));
  CHECK(grad != NULL);
  double *dk = grad + g.nq, *dv = dk + g.nkv, *o = dv + g.nkv;
  /* h has no expression: its gradients lack the factor 3. */
  CHECK_OK(NULL, fj__reference_bwd64(&h.p, h.q, h.k, h.v, h.dout, grad, dk,
                                     dv, NULL));
  double e = fd_error(&g, g.q, grad, g.nq, o);
  CHECK_OK(NULL, fj__reference_bwd64(&g.p, g.q, g.k, g.v, g.dout, grad, dk,
                                     dv, NULL));
  double ok = fd_error(&g, g.q, grad, g.nq, o);
  printf("  without the derivative %.1e, with it %.1e\n", e, ok);
  free(grad);
  free(g.q);
  free(h.q);
  CHECK(e > 0.1 && ok < 2e-3);
  return 0;
}

/* The float tensor parameters' gradients (fj_mods.param_grads): a slope
 * per head, a relative bias table and a per-key bias, each read by a score
 * expression, against central differences of the float64 forward over
 * every element (steps of 2^-10, whose float32 values are exact); an
 * element no pair reads gets 0.  The int parameter doc has none. */
static int param_case(const char *name, const char *score, const char *mask,
                      float softcap)
{
  gproblem g;
  if (gproblem_init(&g, 5, 7))
    return 1;
  float slope[2] = {0.5f, -0.25f}, keyb[8], rel[2][16];
  static const int32_t docs[8] = {0, 0, 0, 1, 1, 2, 2, 2};
  for (int i = 0; i < 8; i++)
    keyb[i] = 0.1f * (float)(i % 3) - 0.15f;
  for (int i = 0; i < 32; i++)
    rel[i / 16][i % 16] = 0.05f * (float)((i * 7) % 11) - 0.25f;
  fj_mod_param params[4] = {
      {"slope", FJ_MOD_F32, 1, {2, 0, 0, 0}, slope, 0},
      {"keyb", FJ_MOD_F32, 1, {8, 0, 0, 0}, keyb, 0},
      {"rel", FJ_MOD_F32, 2, {2, 16, 0, 0}, rel, 0},
      {"doc", FJ_MOD_I32, 1, {8, 0, 0, 0}, docs, 0}};
  float gs[2] = {0}, gk[8] = {0}, gr[32] = {0};
  float *const grads[4] = {gs, gk, gr, NULL};
  float *const vals[3] = {slope, keyb, &rel[0][0]};
  const int counts[3] = {2, 8, 32};
  g.m.score = score;
  g.m.mask = mask;
  g.m.softcap = softcap;
  g.m.params = params;
  g.m.num_params = 4;
  g.m.param_grads = grads;
  double *buf = malloc(sizeof(double) * (2 * g.nq + 2 * g.nkv));
  int bad = !buf;
  double *dk = buf + g.nq, *dv = dk + g.nkv, *o = dv + g.nkv;
  if (!bad)
    bad = fj__reference_bwd64(&g.p, g.q, g.k, g.v, g.dout, buf, dk, dv,
                              NULL) != FJ_OK;
  double worst = 0, big = 0;
  for (int t = 0; t < 3 && !bad; t++)
    for (int i = 0; i < counts[t]; i++) {
      const float h = 0x1p-10f, x0 = vals[t][i];
      vals[t][i] = x0 + h;
      double up = loss(&g, o);
      vals[t][i] = x0 - h;
      double down = loss(&g, o);
      vals[t][i] = x0;
      double want = (up - down) / (2.0 * (double)h), got = (double)grads[t][i];
      double e = fabs(got - want);
      worst = e > worst || isnan(e) ? e : worst;
      big = fabs(want) > big ? fabs(want) : big;
    }
  double rel_e = big > 0 ? worst / big : worst;
  printf("  %-28s dparams %.1e (largest %.2f)\n", name, rel_e, big);
  if (bad)
    fprintf(stderr, "%s: %s\n", name, fj_errmsg(NULL));
  free(buf);
  free(g.q);
  return bad || !(rel_e < 2e-3) || !(big > 0.01);
}

int test_refbwd_param_grads(void)
{
  int bad = 0;
  bad |= param_case("alibi slopes", "s + slope(h) * (float)(kv - q)", NULL, 0);
  bad |= param_case("key bias, scaled", "s * (1.0f + keyb(kv)) + keyb(kv)", NULL, 0);
  bad |= param_case("relative bias", "s + rel(h, q - kv + 6)", NULL, 0);
  bad |= param_case("bias past the table", "s + rel(h, q - kv + 12)", NULL, 0);
  bad |= param_case("all, softcap, mask",
                    "tanhf(slope(h)) * s + rel(h, kv - q + 4) * keyb(kv)",
                    "doc(q) == doc(kv) || kv <= 1", 2.0f);
  return bad;
}

/* What param_grads may not hold: a gradient for an int tensor or a
 * scalar. */
int test_refbwd_param_grads_refused(void)
{
  fj_problem p;
  fj_problem_init(&p, 1, 1, 1, 4, 4, 8, FJ_F16, FJ_BHSD);
  static const uint16_t x[32] = {0};
  float g[3][32], gp[8]; /* dQ, dK, dV: seq 4 x head_dim 8 each */
  static const int32_t docs[4] = {0};
  fj_mod_param params[2] = {{"doc", FJ_MOD_I32, 1, {4, 0, 0, 0}, docs, 0},
                            {"z", FJ_MOD_F32, 0, {0, 0, 0, 0}, NULL, 0.5}};
  float *grads[2] = {gp, NULL};
  fj_mods m;
  fj_mods_init(&m);
  m.score = "s * z + (float)doc(q)";
  m.params = params;
  m.num_params = 2;
  m.param_grads = (float *const *)grads;
  p.mods = &m;
  CHECK_ST(NULL, fj_reference_bwd(&p, x, x, x, x, g[0], g[1], g[2], NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "fj_reference_bwd: mods.param_grads[0] is given for doc, an "
                  "i32 tensor: only float tensors (f32, f16, bf16) have a "
                  "gradient");
  grads[0] = NULL;
  grads[1] = gp;
  CHECK_ST(NULL, fj_reference_bwd(&p, x, x, x, x, g[0], g[1], g[2], NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "mods.param_grads[1] is given for z, a scalar");
  grads[1] = NULL;
  CHECK_OK(NULL, fj_reference_bwd(&p, x, x, x, x, g[0], g[1], g[2], NULL));
  return 0;
}

/* Rows that see no key: bottom-right with seq_q 7 > seq_kv 5 hides every
 * key from rows 0 and 1.  Their dQ is exactly 0, and nothing is NaN; with
 * a sink as well (those rows' softmax is then the sink alone). */
int test_refbwd_empty_rows(void)
{
  gproblem g;
  if (gproblem_init(&g, 7, 5))
    return 1;
  g.p.causal = FJ_CAUSAL_BOTTOM_RIGHT;
  double dq[2 * 2 * 7 * 8], dk[2 * 5 * 8], dv[2 * 5 * 8], ds[2];
  for (int with_sinks = 0; with_sinks < 2; with_sinks++) {
    g.sinks[0] = g.sinks[1] = 0.25f;
    g.m.sinks = with_sinks ? g.sinks : NULL;
    CHECK_OK(NULL, fj__reference_bwd64(&g.p, g.q, g.k, g.v, g.dout, dq, dk,
                                       dv, ds));
    for (size_t i = 0; i < g.nq; i++) {
      size_t row = i / 8 % 7;
      CHECK(isfinite(dq[i]));
      CHECK(row >= 2 || dq[i] == 0.0);
      CHECK(row < 3 || dq[i] != 0.0);  /* row 2 sees one key: P = 1, dS = 0
                                          without a sink */
    }
    for (size_t i = 0; i < g.nkv; i++)
      CHECK(isfinite(dk[i]) && isfinite(dv[i]));
    CHECK(isfinite(ds[0]) && isfinite(ds[1]));
  }
  /* A window (0, 0) without a causal mask is aligned bottom-right too:
   * the same rows see nothing. */
  g.p.causal = FJ_CAUSAL_NONE;
  g.m.window_left = g.m.window_right = 0;
  CHECK_OK(NULL, fj__reference_bwd64(&g.p, g.q, g.k, g.v, g.dout, dq, dk,
                                     dv, NULL));
  for (size_t i = 0; i < g.nq; i++)
    CHECK(i / 8 % 7 >= 2 || dq[i] == 0.0);
  free(g.q);
  return 0;
}

/* Converts a double array to f16 and back, so that both paths read the
 * same values. */
static void round_f16(double *x, uint16_t *h, size_t n)
{
  for (size_t i = 0; i < n; i++) {
    h[i] = fj__float_to_half((float)x[i]);
    x[i] = (double)fj__half_to_float(h[i]);
  }
}

/* Element (b, h, s, e) of a BSHD tensor with H heads and S rows. */
static size_t bshd(size_t b, size_t h, size_t s, size_t e, size_t H, size_t S)
{
  return ((b * S + s) * H + h) * 8 + e;
}

/* A float32 result is the double one rounded: within 2^-24 of it. */
static int close_to(float got, double want)
{
  return fabs((double)got - want) <= 0x1p-24 * fabs(want);
}

/* The public call on f16 inputs in BSHD order equals the float64 path on
 * the same values in BHSD order, to float32's rounding; its dsinks too. */
int test_refbwd_public(void)
{
  enum { SQ = 5, SKV = 7 };
  gproblem g;
  if (gproblem_init(&g, SQ, SKV))
    return 1;
  g.p.causal = FJ_CAUSAL_BOTTOM_RIGHT;
  g.sinks[0] = 0.5f;
  g.sinks[1] = -1.0f;
  g.m.sinks = g.sinks;
  static uint16_t hq[2 * 2 * SQ * 8], hk[2 * SKV * 8], hv[2 * SKV * 8],
      hd[2 * 2 * SQ * 8], tq[2 * 2 * SQ * 8], tk[2 * SKV * 8],
      tv[2 * SKV * 8], td[2 * 2 * SQ * 8];
  round_f16(g.q, hq, g.nq);
  round_f16(g.k, hk, g.nkv);
  round_f16(g.v, hv, g.nkv);
  round_f16(g.dout, hd, g.nq);
  static double dq[2 * 2 * SQ * 8], dk[2 * SKV * 8], dv[2 * SKV * 8];
  double ds[2];
  CHECK_OK(NULL, fj__reference_bwd64(&g.p, g.q, g.k, g.v, g.dout, dq, dk,
                                     dv, ds));
  /* The same problem, BSHD. */
  fj_problem p = g.p;
  fj_problem_init(&p, 2, 2, 1, SQ, SKV, 8, FJ_F16, FJ_BSHD);
  p.causal = g.p.causal;
  p.mods = &g.m;
  for (size_t b = 0; b < 2; b++)
    for (size_t s = 0; s < SKV; s++)
      for (size_t e = 0; e < 8; e++) {
        size_t from = (b * SKV + s) * 8 + e, to = bshd(b, 0, s, e, 1, SKV);
        tk[to] = hk[from];
        tv[to] = hv[from];
        for (size_t h = 0; h < 2 && s < SQ; h++) {
          from = ((b * 2 + h) * SQ + s) * 8 + e;
          tq[bshd(b, h, s, e, 2, SQ)] = hq[from];
          td[bshd(b, h, s, e, 2, SQ)] = hd[from];
        }
      }
  static float fq[2 * 2 * SQ * 8], fk[2 * SKV * 8], fv[2 * SKV * 8];
  float fs[2];
  CHECK_OK(NULL, fj_reference_bwd(&p, tq, tk, tv, td, fq, fk, fv, fs));
  for (size_t b = 0; b < 2; b++)
    for (size_t s = 0; s < SKV; s++)
      for (size_t e = 0; e < 8; e++) {
        size_t from = (b * SKV + s) * 8 + e, to = bshd(b, 0, s, e, 1, SKV);
        CHECK(close_to(fk[to], dk[from]));
        CHECK(close_to(fv[to], dv[from]));
        for (size_t h = 0; h < 2 && s < SQ; h++) {
          from = ((b * 2 + h) * SQ + s) * 8 + e;
          to = bshd(b, h, s, e, 2, SQ);
          CHECK(close_to(fq[to], dq[from]));
        }
      }
  for (int h = 0; h < 2; h++)
    CHECK(close_to(fs[h], ds[h]) && ds[h] != 0.0);
  /* Without sinks, dsinks receives 0. */
  g.m.sinks = NULL;
  fs[0] = fs[1] = 1.0f;
  CHECK_OK(NULL, fj_reference_bwd(&p, tq, tk, tv, td, fq, fk, fv, fs));
  CHECK(fs[0] == 0.0f && fs[1] == 0.0f);
  free(g.q);
  return 0;
}

/* A varlen batch: each sequence's gradients are those of the dense
 * problem of that sequence alone, bit for bit; rows past total_q and
 * keys past the last sequence are left alone. */
int test_refbwd_varlen(void)
{
  enum { SQ = 6, SKV = 7, D = 8 };
  static const int32_t cu_q[3] = {0, 4, 10}, cu_kv[3] = {0, 7, 12};
  double q[12 * 2 * D], k[13 * D], v[13 * D], dout[12 * 2 * D];
  double dq[12 * 2 * D], dk[13 * D], dv[13 * D];
  uint32_t state = 7;
  fill(q, 12 * 2 * D, &state, 1.5);
  fill(k, 13 * D, &state, 1.5);
  fill(v, 13 * D, &state, 1.0);
  fill(dout, 12 * 2 * D, &state, 1.0);
  for (int i = 0; i < 12 * 2 * D; i++)
    dq[i] = 99;
  for (int i = 0; i < 13 * D; i++)
    dk[i] = dv[i] = 99;
  /* Without, then with expressions of the positions (which count from
   * each sequence's start: the packed sequences' gradients are the
   * sequences' own). */
  for (int with_mods = 0; with_mods < 2; with_mods++) {
    fj_mods m;
    fj_mods_init(&m);
    m.score = "s + 0.25f * (float)(kv - q) + (float)h * 0.5f";
    m.mask = "(q + kv) % 4 != 1";
    fj_problem p;
    fj_problem_init(&p, 2, 2, 1, SQ, SKV, D, FJ_F16, FJ_THD);
    p.cu_seqlens_q = cu_q;
    p.cu_seqlens_kv = cu_kv;
    p.causal = FJ_CAUSAL_BOTTOM_RIGHT;
    p.mods = with_mods ? &m : NULL;
    CHECK_OK(NULL, fj__reference_bwd64(&p, q, k, v, dout, dq, dk, dv, NULL));
    for (int b = 0; b < 2; b++) {
      int lq = cu_q[b + 1] - cu_q[b], lk = cu_kv[b + 1] - cu_kv[b];
      fj_problem one;
      fj_problem_init(&one, 1, 2, 1, lq, lk, D, FJ_F16, FJ_BSHD);
      one.causal = p.causal;
      one.mods = p.mods;
      double oq[6 * 2 * D], ok[7 * D], ov[7 * D];
      const double *sq = q + cu_q[b] * 2 * D, *sd = dout + cu_q[b] * 2 * D;
      CHECK_OK(NULL, fj__reference_bwd64(&one, sq, k + cu_kv[b] * D,
                                         v + cu_kv[b] * D, sd, oq, ok, ov,
                                         NULL));
      size_t nq = sizeof(double) * (size_t)(lq * 2 * D);
      size_t nk = sizeof(double) * (size_t)(lk * D);
      CHECK(memcmp(oq, dq + cu_q[b] * 2 * D, nq) == 0);
      CHECK(memcmp(ok, dk + cu_kv[b] * D, nk) == 0);
      CHECK(memcmp(ov, dv + cu_kv[b] * D, nk) == 0);
    }
    CHECK(dq[10 * 2 * D] == 99 && dk[12 * D] == 99 && dv[12 * D] == 99);
  }
  return 0;
}

/* Each NULL argument named; the problem checked as the forward checks it;
 * what the backward does not take refused with FJ_ERR_UNSUPPORTED. */
int test_refbwd_errors(void)
{
  fj_problem p;
  fj_problem_init(&p, 1, 1, 1, 2, 2, 8, FJ_F16, FJ_BHSD);
  uint16_t x[16] = {0};
  float g[3][16];
  const void *in[4] = {x, x, x, x};
  float *out[3] = {g[0], g[1], g[2]};
  static const char *const names[7] = {"q", "k", "v", "dout",
                                       "dq", "dk", "dv"};
  for (int i = 0; i < 7; i++) {
    const void *a[4] = {in[0], in[1], in[2], in[3]};
    float *b[3] = {out[0], out[1], out[2]};
    if (i < 4)
      a[i] = NULL;
    else
      b[i - 4] = NULL;
    CHECK_ST(NULL, fj_reference_bwd(&p, a[0], a[1], a[2], a[3], b[0], b[1],
                                    b[2], NULL),
             FJ_ERR_INVALID_ARG);
    char want[64];
    snprintf(want, sizeof want, "fj_reference_bwd: %s is NULL", names[i]);
    CHECK_MSG(NULL, want);
  }
  CHECK_ST(NULL, fj_reference_bwd(NULL, x, x, x, x, g[0], g[1], g[2], NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "fj_reference_bwd: p is NULL");
  CHECK_OK(NULL, fj_reference_bwd(&p, x, x, x, x, g[0], g[1], g[2], NULL));
  CHECK(strcmp(fj_errmsg(NULL), "") == 0);
  /* The problem's own checks, as the forward's. */
  p.head_dim = 0;
  CHECK_ST(NULL, fj_reference_bwd(&p, x, x, x, x, g[0], g[1], g[2], NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "head_dim 0 is invalid");
  p.head_dim = 8;
  /* A score expression is taken, and a block mask (by its rows' lists;
   * transposed lists given must agree with them); FP8 K/V: refused. */
  fj_mods m;
  fj_mods_init(&m);
  m.score = "s * 0.5f";
  p.mods = &m;
  CHECK_OK(NULL, fj_reference_bwd(&p, x, x, x, x, g[0], g[1], g[2], NULL));
  m.score = NULL;
  static const int32_t one[1] = {1}, zero[1] = {0};
  fj_block_mask bm;
  memset(&bm, 0, sizeof bm);
  bm.batch = bm.heads = bm.q_blocks = bm.kv_blocks = 1;
  bm.block_q = bm.block_kv = 128;
  bm.kv_num = one;
  bm.kv_indices = zero;
  m.block_mask = &bm;
  CHECK_OK(NULL, fj_reference_bwd(&p, x, x, x, x, g[0], g[1], g[2], NULL));
  bm.q_num = zero;
  bm.q_indices = zero;
  CHECK_ST(NULL, fj_reference_bwd(&p, x, x, x, x, g[0], g[1], g[2], NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "fj_reference_bwd: mods.block_mask's lists disagree at "
                  "batch 0, head 0, query block 0, key block 0: partial by "
                  "kv_num and kv_indices, none by q_num and q_indices");
  bm.q_num = one;
  CHECK_OK(NULL, fj_reference_bwd(&p, x, x, x, x, g[0], g[1], g[2], NULL));
  bm.q_indices = NULL;
  CHECK_ST(NULL, fj_reference_bwd(&p, x, x, x, x, g[0], g[1], g[2], NULL),
           FJ_ERR_INVALID_ARG);
  CHECK_MSG(NULL, "mods.block_mask->q_indices is NULL but q_num is not: give "
                  "both (the transposed lists) or neither");
  m.block_mask = NULL;
  m.mask = "kv <= q";  /* a mask expression is taken */
  CHECK_OK(NULL, fj_reference_bwd(&p, x, x, x, x, g[0], g[1], g[2], NULL));
  p.mods = NULL;
  p.kv_dtype = FJ_E4M3;
  CHECK_ST(NULL, fj_reference_bwd(&p, x, x, x, x, g[0], g[1], g[2], NULL),
           FJ_ERR_UNSUPPORTED);
  CHECK_MSG(NULL, "fj_reference_bwd: kv_dtype e4m3 is not implemented in "
                  "the backward");
  return 0;
}

/* ---- block masks ---------------------------------------------------------------
 * A block mask whose lists are exact (a block partial where the mask
 * expression hides some pair the built-in rules keep, full where it hides
 * none) changes nothing: the gradients equal the expression's alone, bit
 * for bit.  A block left out of both directions' lists hides its pairs,
 * as the expression extended to hide them does. */

/* A pair's fate under the whole mask: -1 hidden by a built-in rule, 0 by
 * the expression, 1 kept. */
typedef int (*bm_fate)(int h, int q, int kv);

/* Block lists of one batch index and `heads` heads, both directions, from
 * every pair's fate; arrays in one allocation (free(bm->kv_num)). */
static int exact_lists(fj_block_mask *bm, int heads, int bq, int bkv, int sq,
                       int skv, bm_fate fate)
{
  int qb = (sq + bq - 1) / bq, kb = (skv + bkv - 1) / bkv;
  size_t rows = (size_t)heads * (size_t)qb, cols = (size_t)heads * (size_t)kb;
  size_t list = rows * (size_t)kb;
  int32_t *a = calloc(2 * (rows + cols) + 4 * list, sizeof *a);
  if (!a)
    return 1;
  int32_t *num = a, *full_num = num + rows, *q_num = full_num + rows,
          *full_q_num = q_num + cols, *idx = full_q_num + cols,
          *full_idx = idx + list, *q_idx = full_idx + list,
          *full_q_idx = q_idx + list;
  for (int h = 0; h < heads; h++)
    for (int i = 0; i < qb; i++)
      for (int j = 0; j < kb; j++) {
        int any = 0, all = 1;
        for (int q = i * bq; q < (i + 1) * bq && q < sq; q++)
          for (int kv = j * bkv; kv < (j + 1) * bkv && kv < skv; kv++) {
            int f = fate(h, q, kv);
            any |= f == 1;
            all &= f != 0;
          }
        size_t r = (size_t)h * (size_t)qb + (size_t)i,
               c = (size_t)h * (size_t)kb + (size_t)j;
        if (any && all) {
          full_idx[r * (size_t)kb + (size_t)full_num[r]++] = j;
          full_q_idx[c * (size_t)qb + (size_t)full_q_num[c]++] = i;
        } else if (any) {
          idx[r * (size_t)kb + (size_t)num[r]++] = j;
          q_idx[c * (size_t)qb + (size_t)q_num[c]++] = i;
        }
      }
  *bm = (fj_block_mask){bq, bkv, 1, heads, qb, kb, num, idx, full_num,
                        full_idx, q_num, q_idx, full_q_num, full_q_idx};
  return 0;
}

/* Removes block (i, j) of head h from both directions' partial lists;
 * 0 where it was there. */
static int drop_block(fj_block_mask *bm, int h, int i, int j)
{
  int32_t *num = (int32_t *)bm->kv_num, *idx = (int32_t *)bm->kv_indices;
  int32_t *q_num = (int32_t *)bm->q_num, *q_idx = (int32_t *)bm->q_indices;
  size_t r = (size_t)h * (size_t)bm->q_blocks + (size_t)i,
         c = (size_t)h * (size_t)bm->kv_blocks + (size_t)j;
  int found = 0;
  for (int e = 0; e < num[r]; e++)
    if (idx[r * (size_t)bm->kv_blocks + (size_t)e] == j) {
      memmove(idx + r * (size_t)bm->kv_blocks + e, idx + r * (size_t)bm->kv_blocks + e + 1,
              (size_t)(num[r] - e - 1) * sizeof *idx);
      num[r]--;
      found++;
      break;
    }
  for (int e = 0; e < q_num[c]; e++)
    if (q_idx[c * (size_t)bm->q_blocks + (size_t)e] == i) {
      memmove(q_idx + c * (size_t)bm->q_blocks + e, q_idx + c * (size_t)bm->q_blocks + e + 1,
              (size_t)(q_num[c] - e - 1) * sizeof *q_idx);
      q_num[c]--;
      found++;
      break;
    }
  return found != 2;
}

/* The three gradients of g's problem (float64, into out: nq + 2 nkv). */
static int grads_of(const gproblem *g, double *out)
{
  fj_status st = fj__reference_bwd64(&g->p, g->q, g->k, g->v, g->dout, out,
                                     out + g->nq, out + g->nq + g->nkv, NULL);
  if (st != FJ_OK)
    fprintf(stderr, "fj__reference_bwd64: %s\n", fj_errmsg(NULL));
  return st != FJ_OK;
}

/* Documents of 70 positions under a bottom-right causal mask (seq 200 /
 * 170: off -30); and a mask of its own per head. */
static int doc_fate(int h, int q, int kv)
{
  (void)h;
  return kv > q - 30 ? -1 : q / 70 == kv / 70;
}
static int head_fate(int h, int q, int kv)
{
  return (kv + h * 37) % 5 != 0 || q == kv;
}

int test_refbwd_block_mask(void)
{
  static const struct {
    const char *mask, *dropped;
    fj_causal causal;
    int heads, bq, bkv;
    bm_fate fate;
  } cases[] = {
      {"q / 70 == kv / 70", "q / 70 == kv / 70 && !(q / 64 == %d && kv / 64 == %d)",
       FJ_CAUSAL_BOTTOM_RIGHT, 1, 64, 64, doc_fate},
      {"(kv + h * 37) % 5 != 0 || q == kv",
       "((kv + h * 37) %% 5 != 0 || q == kv) && !(h == 1 && q / 128 == %d && kv / 64 == %d)",
       FJ_CAUSAL_NONE, 2, 128, 64, head_fate},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    gproblem g;
    CHECK(gproblem_init(&g, 200, 170) == 0);
    g.p.causal = cases[c].causal;
    size_t n = g.nq + 2 * g.nkv;
    double *want = malloc(2 * n * sizeof *want), *got = want + n;
    fj_block_mask bm;
    CHECK(want && exact_lists(&bm, cases[c].heads, cases[c].bq, cases[c].bkv,
                              200, 170, cases[c].fate) == 0);
    g.m.mask = cases[c].mask;
    CHECK(grads_of(&g, want) == 0);
    g.m.block_mask = &bm;
    CHECK(grads_of(&g, got) == 0);
    CHECK(memcmp(want, got, n * sizeof *want) == 0);
    /* The first partial block of the last head's lists dropped. */
    int h = cases[c].heads - 1, i = -1, j = -1;
    for (int r = 0; r < bm.q_blocks && i < 0; r++)
      if (bm.kv_num[(size_t)h * (size_t)bm.q_blocks + (size_t)r] > 0) {
        i = r;
        j = bm.kv_indices[((size_t)h * (size_t)bm.q_blocks + (size_t)r) * (size_t)bm.kv_blocks];
      }
    CHECK(i >= 0 && drop_block(&bm, h, i, j) == 0);
    CHECK(grads_of(&g, got) == 0);
    CHECK(memcmp(want, got, n * sizeof *want) != 0);
    char text[160];
    snprintf(text, sizeof text, cases[c].dropped, i, j);
    g.m.mask = text;
    g.m.block_mask = NULL;
    CHECK(grads_of(&g, want) == 0);
    CHECK(memcmp(want, got, n * sizeof *want) == 0);
    printf("  %-36s heads %d, blocks %dx%d: equal; block (%d, %d) of head %d dropped: equal\n",
           cases[c].mask, cases[c].heads, cases[c].bq, cases[c].bkv, i, j, h);
    free((void *)bm.kv_num);
    free(want);
    free(g.q);
  }
  return 0;
}

/* Paged K/V: the gradients land in the pages the table names, equal bit
 * for bit to the dense problem's at the same keys. */
int test_refbwd_paged(void)
{
  enum { SQ = 5, SKV = 8, D = 8, PS = 4 };
  static const int32_t table[2][2] = {{3, 1}, {0, 2}};
  double q[2 * SQ * 2 * D], dout[2 * SQ * 2 * D], k[2 * SKV * D],
      v[2 * SKV * D], pk[4 * PS * D], pv[4 * PS * D];
  double dq[2 * SQ * 2 * D], dk[2 * SKV * D], dv[2 * SKV * D],
      pdq[2 * SQ * 2 * D], pdk[4 * PS * D], pdv[4 * PS * D];
  uint32_t state = 11;
  fill(q, 2 * SQ * 2 * D, &state, 1.5);
  fill(dout, 2 * SQ * 2 * D, &state, 1.0);
  fill(k, 2 * SKV * D, &state, 1.5);
  fill(v, 2 * SKV * D, &state, 1.0);
  for (int b = 0; b < 2; b++)
    for (int s = 0; s < SKV; s++)
      for (int e = 0; e < D; e++) {
        int at = (table[b][s / PS] * PS + s % PS) * D + e;
        pk[at] = k[(b * SKV + s) * D + e];
        pv[at] = v[(b * SKV + s) * D + e];
      }
  fj_problem p;
  fj_problem_init(&p, 2, 2, 1, SQ, SKV, D, FJ_F16, FJ_BSHD);
  p.causal = FJ_CAUSAL_BOTTOM_RIGHT;
  CHECK_OK(NULL, fj__reference_bwd64(&p, q, k, v, dout, dq, dk, dv, NULL));
  p.block_table = &table[0][0];
  p.page_size = PS;
  p.max_pages = 2;
  p.num_pages = 4;
  p.k_stride[0] = p.v_stride[0] = PS * D;
  CHECK_OK(NULL, fj__reference_bwd64(&p, q, pk, pv, dout, pdq, pdk, pdv,
                                     NULL));
  CHECK(memcmp(dq, pdq, sizeof dq) == 0);
  for (int b = 0; b < 2; b++)
    for (int s = 0; s < SKV; s++)
      for (int e = 0; e < D; e++) {
        int at = (table[b][s / PS] * PS + s % PS) * D + e;
        CHECK(pdk[at] == dk[(b * SKV + s) * D + e]);
        CHECK(pdv[at] == dv[(b * SKV + s) * D + e]);
      }
  return 0;
}

/* The reference on several threads (FLASHJIT_REFERENCE_THREADS): the
 * forward's O and LSE and the backward's gradients bit for bit those of
 * one thread -- dense GQA with a mask and a score expression, varlen;
 * and where items' gradients add into the same elements, which keep the
 * backward to one thread: keys broadcast over heads (a stride of 0), a
 * packed sequence whose used keys (seqused_kv) run into the next's. */
int test_refbwd_threads(void)
{
  enum { B = 3, HQ = 4, HKV = 2, SQ = 37, SKV = 53, D = 16 };
  enum { NQ = B * HQ * SQ * D, NKV = B * HKV * SKV * D };
  static uint16_t q[NQ], k[NKV], v[NKV], dout[NQ];
  static double o[2][NQ], lse[2][B * HQ * SQ];
  static float dq[2][NQ], dk[2][NKV], dv[2][NKV];
  uint32_t state = 11;
  for (int i = 0; i < NQ; i++) {
    q[i] = fj__float_to_half((float)next_value(&state, 1.5));
    dout[i] = fj__float_to_half((float)next_value(&state, 1.0));
  }
  for (int i = 0; i < NKV; i++) {
    k[i] = fj__float_to_half((float)next_value(&state, 1.5));
    v[i] = fj__float_to_half((float)next_value(&state, 1.0));
  }
  static const int32_t cu_q[B + 1] = {0, 30, 31, 60}, cu_kv[B + 1] = {0, 53, 60, 100};
  static const int32_t used[B] = {53, 40, 40};  /* the second's 40 keys: 33 of the third's */
  fj_mods m;
  fj_mods_init(&m);
  m.score = "s + 0.125f * (float)(kv - q) - (float)h * 0.25f";
  for (int form = 0; form < 4; form++) {
    fj_problem p;
    fj_problem_init(&p, B, HQ, HKV, SQ, SKV, D, FJ_F16, form % 2 ? FJ_THD : FJ_BHSD);
    p.causal = FJ_CAUSAL_BOTTOM_RIGHT;
    p.mods = form == 0 ? &m : NULL;
    if (form == 1 || form == 3) {
      p.cu_seqlens_q = cu_q;
      p.cu_seqlens_kv = cu_kv;
      p.seqused_kv = form == 3 ? used : NULL;
    }
    if (form == 2)
      p.k_stride[1] = p.v_stride[1] = 0;  /* both KV heads read head 0 */
    for (int t = 0; t < 2; t++) {
      setenv("FLASHJIT_REFERENCE_THREADS", t ? "5" : "1", 1);
      memset(dq[t], 0, sizeof dq[t]);
      memset(dk[t], 0, sizeof dk[t]);
      memset(dv[t], 0, sizeof dv[t]);
      CHECK_OK(NULL, fj_reference_fwd(&p, q, k, v, NULL, NULL, 0, SQ, o[t], lse[t]));
      CHECK(fj__reference_last_threads() == (t ? 5 : 1));
      CHECK_OK(NULL, fj_reference_bwd(&p, q, k, v, dout, dq[t], dk[t], dv[t], NULL));
      /* B x HKV = 6 items; where their gradients meet, one thread */
      CHECK(fj__reference_last_threads() == (t && form < 2 ? 5 : 1));
    }
    CHECK(memcmp(o[0], o[1], sizeof o[0]) == 0);
    CHECK(memcmp(lse[0], lse[1], sizeof lse[0]) == 0);
    CHECK(memcmp(dq[0], dq[1], sizeof dq[0]) == 0);
    CHECK(memcmp(dk[0], dk[1], sizeof dk[0]) == 0);
    CHECK(memcmp(dv[0], dv[1], sizeof dv[0]) == 0);
    /* Not all zeros: the items ran. */
    double sum = 0;
    for (int i = 0; i < NKV; i++)
      sum += fabs((double)dk[1][i]);
    CHECK(sum > 0);
  }
  unsetenv("FLASHJIT_REFERENCE_THREADS");
  return 0;
}
