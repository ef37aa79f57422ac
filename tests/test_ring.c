/*
 * test_ring.c -- context parallelism without a GPU: ring attention's
 * schedule (python/flashjit/_ring.py, as tests/data/ring_schedule.txt
 * holds its output for a list of cases; python/tests/test_ring.py checks
 * the file against the code) run with the float64 reference, one
 * fj__reference_fwd64 per call and fj_reference_merge per rank in the
 * schedule's order, against the reference over the whole sequence, for
 * every case: masks (none, causal, windows with and without it), the
 * contiguous and zigzag orders, GQA, softcap, uneven shards, empty ones
 * and steps that see no key.  The backward the same way
 * (fj__reference_bwd_part64 per call, with the rank's merged O and LSE;
 * dQ summed on its rank, dK and dV on their shard in the ring's order).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "reference.h"
#include "runner.h"

enum { RING_WORLD_MAX = 8, RING_CALLS_MAX = 256, RING_LINE = 512 };

typedef struct ring_call {
  int rank, step, src, q_lo, q_hi, k_lo, k_hi, causal, wl, wr;
} ring_call;

/* One case of the golden file: the problem's sizes, the global mask, each
 * rank's segments (start, length), the calls. */
typedef struct ring_case {
  char name[64];
  int world, seq, causal, left, right;
  int batch, hq, hkv, dim;
  double softcap;
  int nseg[RING_WORLD_MAX], seg[RING_WORLD_MAX][2][2];
  int len[RING_WORLD_MAX];
  ring_call call[RING_CALLS_MAX];
  int ncalls;
} ring_case;

/* Reads the next case from f; 1 read, 0 at the end, -1 malformed (said). */
static int read_case(FILE *f, ring_case *c)
{
  char line[RING_LINE];
  memset(c, 0, sizeof *c);
  while (fgets(line, sizeof line, f)) {
    if (line[0] == '#' || line[0] == '\n')
      continue;
    if (!strncmp(line, "case ", 5)) {
      if (sscanf(line, "case %63s world %d seq %d causal %d left %d right %d batch %d "
                 "heads %d %d dim %d softcap %lf", c->name, &c->world, &c->seq, &c->causal,
                 &c->left, &c->right, &c->batch, &c->hq, &c->hkv, &c->dim, &c->softcap) != 11 ||
          c->world < 1 || c->world > RING_WORLD_MAX)
        break;
    } else if (!strncmp(line, "shard ", 6)) {
      int r, n, s[4] = {0};
      if (sscanf(line, "shard %d %d %d %d %d %d", &r, &n, &s[0], &s[1], &s[2], &s[3]) < 4 ||
          r < 0 || r >= c->world || n < 1 || n > 2)
        break;
      c->nseg[r] = n;
      for (int i = 0; i < n; i++) {
        c->seg[r][i][0] = s[2 * i];
        c->seg[r][i][1] = s[2 * i + 1];
        c->len[r] += s[2 * i + 1];
      }
    } else if (!strncmp(line, "call ", 5)) {
      ring_call *k = &c->call[c->ncalls];
      if (c->ncalls == RING_CALLS_MAX ||
          sscanf(line, "call %d %d %d %d %d %d %d %d %d %d", &k->rank, &k->step, &k->src,
                 &k->q_lo, &k->q_hi, &k->k_lo, &k->k_hi, &k->causal, &k->wl, &k->wr) != 10)
        break;
      c->ncalls++;
    } else if (!strncmp(line, "end", 3)) {
      return 1;
    } else {
      break;
    }
  }
  if (feof(f) && !c->name[0])
    return 0;
  fprintf(stderr, "ring_schedule.txt: malformed near: %s", line);
  return -1;
}

static double next_value(uint64_t *s)
{
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(*s >> 11) / 4503599627370496.0 - 1.0;  /* [-1, 1) */
}

/* The case's tensors, BHSD, float64: global Q, K, V, dO, and each rank's
 * shard of them (its segments' rows, in order). */
typedef struct ring_data {
  double *q, *k, *v, *dout;
  double *lq[RING_WORLD_MAX], *lk[RING_WORLD_MAX], *lv[RING_WORLD_MAX];
  double *ldout[RING_WORLD_MAX];
} ring_data;

static double *rows_of(const ring_case *c, const double *x, int heads, int r)
{
  size_t d = (size_t)c->dim, n = (size_t)c->len[r];
  double *out = malloc(sizeof *out * ((size_t)c->batch * (size_t)heads * n * d + 1));
  for (int bh = 0; bh < c->batch * heads; bh++) {
    size_t at = 0;
    for (int s = 0; s < c->nseg[r]; s++)
      for (int i = 0; i < c->seg[r][s][1]; i++, at++)
        memcpy(out + ((size_t)bh * n + at) * d,
               x + ((size_t)bh * (size_t)c->seq + (size_t)(c->seg[r][s][0] + i)) * d,
               sizeof *out * d);
  }
  return out;
}

static void data_make(const ring_case *c, ring_data *t)
{
  size_t nq = (size_t)c->batch * (size_t)c->hq * (size_t)c->seq * (size_t)c->dim;
  size_t nk = (size_t)c->batch * (size_t)c->hkv * (size_t)c->seq * (size_t)c->dim;
  uint64_t seed = 0x5eed + (uint64_t)c->seq * 977 + (uint64_t)c->world;
  double *all = malloc(sizeof *all * (2 * nq + 2 * nk));
  t->q = all;
  t->k = all + nq;
  t->v = t->k + nk;
  t->dout = t->v + nk;
  for (size_t i = 0; i < 2 * nq + 2 * nk; i++)
    all[i] = 2.0 * next_value(&seed);  /* scores of a few units: P not flat */
  for (int r = 0; r < c->world; r++) {
    t->lq[r] = rows_of(c, t->q, c->hq, r);
    t->lk[r] = rows_of(c, t->k, c->hkv, r);
    t->lv[r] = rows_of(c, t->v, c->hkv, r);
    t->ldout[r] = rows_of(c, t->dout, c->hq, r);
  }
}

static void data_free(const ring_case *c, ring_data *t)
{
  free(t->q);
  for (int r = 0; r < c->world; r++) {
    free(t->lq[r]);
    free(t->lk[r]);
    free(t->lv[r]);
    free(t->ldout[r]);
  }
}

/* A BHSD problem of rows x keys over tensors of rq and rk rows (a slice's
 * strides are its tensor's), with the mask and the case's softcap. */
static void problem_of(const ring_case *c, int rows, int keys, int rq, int rk,
                       fj_causal causal, int wl, int wr, fj_problem *p, fj_mods *m)
{
  fj_problem_init(p, c->batch, c->hq, c->hkv, rows, keys, c->dim, FJ_F16, FJ_BHSD);
  int64_t d = c->dim;
  int64_t qs[3] = {c->hq * rq * d, rq * d, d}, ks[3] = {c->hkv * rk * d, rk * d, d};
  memcpy(p->q_stride, qs, sizeof qs);
  memcpy(p->o_stride, qs, sizeof qs);
  memcpy(p->k_stride, ks, sizeof ks);
  memcpy(p->v_stride, ks, sizeof ks);
  p->causal = causal;
  fj_mods_init(m);
  m->window_left = wl;
  m->window_right = wr;
  m->softcap = (float)c->softcap;
  p->mods = m;
}

/* A call's problem: its rows of rank r's shard over its keys of the
 * source's. */
static void call_problem(const ring_case *c, const ring_call *k, fj_problem *p,
                         fj_mods *m)
{
  problem_of(c, k->q_hi - k->q_lo, k->k_hi - k->k_lo, c->len[k->rank], c->len[k->src],
             k->causal ? FJ_CAUSAL_BOTTOM_RIGHT : FJ_CAUSAL_NONE, k->wl, k->wr, p, m);
}

/* Element (b, h, row) of a [batch][heads][rows][dim] array. */
static size_t at(const ring_case *c, int heads, int rows, int b, int h, int row)
{
  return (((size_t)b * (size_t)heads + (size_t)h) * (size_t)rows + (size_t)row) *
         (size_t)c->dim;
}

/* Rank r's forward: each call's O and LSE into a part (its other rows 0
 * and -inf), the parts merged in order.  o [batch][hq][len][dim], lse
 * [batch][hq][len]. */
static int rank_forward(const ring_case *c, const ring_data *t, int r, double *o,
                        double *lse)
{
  int n = c->len[r], nparts = 0, hq = c->hq;
  for (int i = 0; i < c->ncalls; i++)
    nparts += c->call[i].rank == r;
  size_t rows = (size_t)c->batch * (size_t)hq * (size_t)n, d = (size_t)c->dim;
  double *po = calloc((size_t)nparts * rows * d + 1, sizeof *po);
  double *pl = malloc(sizeof *pl * ((size_t)nparts * rows + 1));
  double *co = malloc(sizeof *co * (rows * d + 1)), *cl = malloc(sizeof *cl * (rows + 1));
  for (size_t i = 0; i < (size_t)nparts * rows; i++)
    pl[i] = -HUGE_VAL;
  int part = 0;
  for (int s = 0; s < c->world; s++)
    for (int i = 0; i < c->ncalls; i++) {
      const ring_call *k = &c->call[i];
      if (k->rank != r || k->step != s)
        continue;
      fj_problem p;
      fj_mods m;
      call_problem(c, k, &p, &m);
      int lq = k->q_hi - k->q_lo;
      CHECK_OK(NULL, fj__reference_fwd64(&p, t->lq[r] + (size_t)k->q_lo * d,
                                         t->lk[k->src] + (size_t)k->k_lo * d,
                                         t->lv[k->src] + (size_t)k->k_lo * d, co, cl));
      for (int b = 0; b < c->batch; b++)
        for (int h = 0; h < hq; h++)
          for (int row = 0; row < lq; row++) {
            size_t f = ((size_t)b * (size_t)hq + (size_t)h) * (size_t)n +
                       (size_t)(k->q_lo + row);
            memcpy(po + ((size_t)part * rows + f) * d, co + at(c, hq, lq, b, h, row),
                   sizeof *po * d);
            pl[(size_t)part * rows + f] = cl[at(c, hq, lq, b, h, row) / d];
          }
      part++;
    }
  fj_problem p;
  fj_mods m;
  problem_of(c, n, n, n, n, FJ_CAUSAL_NONE, -1, -1, &p, &m);
  if (n > 0 && nparts > 0)
    CHECK_OK(NULL, fj_reference_merge(&p, nparts, po, pl, o, lse));
  for (size_t i = 0; nparts == 0 && i < rows; i++) {
    memset(o + i * d, 0, sizeof *o * d);
    lse[i] = -HUGE_VAL;
  }
  free(po);
  free(pl);
  free(co);
  free(cl);
  return 0;
}

/* The global row of rank r's local row i. */
static int global_row(const ring_case *c, int r, int i)
{
  for (int s = 0; s < c->nseg[r]; s++) {
    if (i < c->seg[r][s][1])
      return c->seg[r][s][0] + i;
    i -= c->seg[r][s][1];
  }
  return -1;
}

/* max |got - want| over rank r's rows of a [batch][heads][rows][width]
 * array (width 1: the LSE), infinities equal. */
static double rank_diff(const ring_case *c, int r, int heads, int width, const double *got,
                        const double *want)
{
  double worst = 0;
  int n = c->len[r];
  for (int bh = 0; bh < c->batch * heads; bh++)
    for (int i = 0; i < n; i++) {
      const double *g = got + ((size_t)bh * (size_t)n + (size_t)i) * (size_t)width;
      const double *w = want + ((size_t)bh * (size_t)c->seq +
                                (size_t)global_row(c, r, i)) * (size_t)width;
      for (int e = 0; e < width; e++) {
        double x = g[e] == w[e] ? 0 : fabs(g[e] - w[e]);
        worst = x > worst || isnan(x) ? x : worst;
      }
    }
  return worst;
}

/* The full sequence's reference: O, LSE and the gradients. */
typedef struct ring_full {
  double *o, *lse, *dq, *dk, *dv;
} ring_full;

static int full_reference(const ring_case *c, const ring_data *t, ring_full *f)
{
  size_t nq = (size_t)c->batch * (size_t)c->hq * (size_t)c->seq * (size_t)c->dim;
  size_t nk = (size_t)c->batch * (size_t)c->hkv * (size_t)c->seq * (size_t)c->dim;
  f->o = malloc(sizeof(double) * (2 * nq + 2 * nk + nq / (size_t)c->dim));
  f->dq = f->o + nq;
  f->dk = f->dq + nq;
  f->dv = f->dk + nk;
  f->lse = f->dv + nk;
  fj_problem p;
  fj_mods m;
  problem_of(c, c->seq, c->seq, c->seq, c->seq,
             c->causal ? FJ_CAUSAL_TOP_LEFT : FJ_CAUSAL_NONE, c->left, c->right, &p, &m);
  CHECK_OK(NULL, fj__reference_fwd64(&p, t->q, t->k, t->v, f->o, f->lse));
  CHECK_OK(NULL, fj__reference_bwd64(&p, t->q, t->k, t->v, t->dout, f->dq, f->dk, f->dv,
                                     NULL));
  return 0;
}

/* Adds rows lo..hi - 1 of a call's gradient (in its tensor's layout, of
 * n rows) into acc. */
static void add_rows(const ring_case *c, int heads, int n, int lo, int hi, const double *g,
                     double *acc)
{
  for (int bh = 0; bh < c->batch * heads; bh++)
    for (int i = lo; i < hi; i++)
      for (int e = 0; e < c->dim; e++) {
        size_t x = ((size_t)bh * (size_t)n + (size_t)i) * (size_t)c->dim + (size_t)e;
        acc[x] += g[x];
      }
}

/* The ring's backward, all ranks: per step, per rank, each call's
 * gradients from the rank's merged O and LSE; dQ summed on its rank, dK
 * and dV on their shard in the ring's order (the source's own rank first,
 * then one rank on a step). */
static int ring_backward(const ring_case *c, const ring_data *t, double *const o[],
                         double *const lse[], double *dq[], double *dk[], double *dv[])
{
  size_t d = (size_t)c->dim;
  for (int s = 0; s < c->world; s++)
    for (int i = 0; i < c->ncalls; i++) {
      const ring_call *k = &c->call[i];
      if (k->step != s)
        continue;
      int r = k->rank, n = c->len[r], nk = c->len[k->src], lq = k->q_hi - k->q_lo;
      fj_problem p;
      fj_mods m;
      call_problem(c, k, &p, &m);
      size_t gq = (size_t)c->batch * (size_t)c->hq * (size_t)n * d;
      size_t gk = (size_t)c->batch * (size_t)c->hkv * (size_t)nk * d;
      double *g = calloc(gq + 2 * gk + (size_t)c->batch * (size_t)c->hq * (size_t)lq + 1,
                         sizeof *g);
      double *l = g + gq + 2 * gk;
      for (int bh = 0; bh < c->batch * c->hq; bh++)  /* the call's rows' LSE */
        memcpy(l + (size_t)bh * (size_t)lq, lse[r] + (size_t)bh * (size_t)n + (size_t)k->q_lo,
               sizeof *l * (size_t)lq);
      CHECK_OK(NULL, fj__reference_bwd_part64(
                         &p, t->lq[r] + (size_t)k->q_lo * d,
                         t->lk[k->src] + (size_t)k->k_lo * d,
                         t->lv[k->src] + (size_t)k->k_lo * d,
                         t->ldout[r] + (size_t)k->q_lo * d, o[r] + (size_t)k->q_lo * d, l,
                         g + (size_t)k->q_lo * d, g + gq + (size_t)k->k_lo * d,
                         g + gq + gk + (size_t)k->k_lo * d));
      add_rows(c, c->hq, n, k->q_lo, k->q_hi, g, dq[r]);
      add_rows(c, c->hkv, nk, k->k_lo, k->k_hi, g + gq, dk[k->src]);
      add_rows(c, c->hkv, nk, k->k_lo, k->k_hi, g + gq + gk, dv[k->src]);
      free(g);
    }
  return 0;
}

/* The largest magnitude of a [batch][heads][seq][dim] array: the scale of
 * a gradient's error. */
static double magnitude(const double *x, size_t n)
{
  double m = 0;
  for (size_t i = 0; i < n; i++)
    m = fabs(x[i]) > m ? fabs(x[i]) : m;
  return m > 0 ? m : 1;
}

/* One case: the ring's O, LSE, dQ, dK, dV beside the full reference's. */
static int run_case(const ring_case *c)
{
  ring_data t;
  ring_full f;
  data_make(c, &t);
  if (full_reference(c, &t, &f))
    return 1;
  double *o[RING_WORLD_MAX], *lse[RING_WORLD_MAX], *dq[RING_WORLD_MAX];
  double *dk[RING_WORLD_MAX], *dv[RING_WORLD_MAX];
  size_t d = (size_t)c->dim, bq = (size_t)c->batch * (size_t)c->hq;
  size_t bk = (size_t)c->batch * (size_t)c->hkv;
  for (int r = 0; r < c->world; r++) {
    size_t n = (size_t)c->len[r];
    o[r] = malloc(sizeof(double) * (bq * n * d + bq * n + 1));
    lse[r] = o[r] + bq * n * d;
    dq[r] = calloc(bq * n * d + 2 * bk * n * d + 1, sizeof(double));
    dk[r] = dq[r] + bq * n * d;
    dv[r] = dk[r] + bk * n * d;
    if (rank_forward(c, &t, r, o[r], lse[r]))
      return 1;
  }
  if (ring_backward(c, &t, o, lse, dq, dk, dv))
    return 1;
  size_t nq = bq * (size_t)c->seq * d, nk = bk * (size_t)c->seq * d;
  double eo = 0, el = 0, eq = 0, ek = 0, ev = 0, mq = magnitude(f.dq, nq);
  double mk = magnitude(f.dk, nk), mv = magnitude(f.dv, nk);
  for (int r = 0; r < c->world; r++) {
    eo = fmax(eo, rank_diff(c, r, c->hq, c->dim, o[r], f.o));
    el = fmax(el, rank_diff(c, r, c->hq, 1, lse[r], f.lse));
    eq = fmax(eq, rank_diff(c, r, c->hq, c->dim, dq[r], f.dq) / mq);
    ek = fmax(ek, rank_diff(c, r, c->hkv, c->dim, dk[r], f.dk) / mk);
    ev = fmax(ev, rank_diff(c, r, c->hkv, c->dim, dv[r], f.dv) / mv);
    free(o[r]);
    free(dq[r]);
  }
  printf("%-28s world %d seq %3d calls %2d: |dO| %.1e |dLSE| %.1e dQ %.1e dK %.1e dV %.1e\n",
         c->name, c->world, c->seq, c->ncalls, eo, el, eq, ek, ev);
  free(f.o);
  data_free(c, &t);
  /* Float64 throughout: only the order of the sums differs. */
  CHECK(eo < 1e-12 && el < 1e-12);
  CHECK(eq < 1e-11 && ek < 1e-11 && ev < 1e-11);
  return 0;
}

int test_ring_reference(void)
{
  char path[4096];
  snprintf(path, sizeof path, "%s/ring_schedule.txt", fjt_data_dir());
  FILE *f = fopen(path, "r");
  CHECK(f != NULL);
  ring_case *c = malloc(sizeof *c);
  int n = 0, got, bad = 0;
  while ((got = read_case(f, c)) == 1) {
    bad |= run_case(c);
    n++;
  }
  fclose(f);
  free(c);
  printf("%d cases\n", n);
  CHECK(got == 0 && n >= 10 && !bad);
  return 0;
}
