/*
 * reference.c -- the float64 attention reference, forward and backward,
 * that tests, the CLI and embedders check kernels against (number formats:
 * numbers.c; a problem's checks: problem.c).
 */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctx.h"
#include "expr_grad.h"
#include "mods.h"
#include "numbers.h"
#include "problem.h"
#include "reference.h"

/* ---- the float64 reference ------------------------------------------------------- */

/* A problem's modifications as the reference applies them: the user's
 * expressions parsed (expr.c evaluates them on the host: an oracle
 * independent of the generated code), the built-ins by their formulas. */
/* One read, in the score expression, of a float tensor parameter that has
 * a gradient (fj_mods.param_grads): the score's derivative with respect to
 * the value it fetches and its indices, each printed by expr_grad.c or
 * expr.c and parsed back, so that the evaluator computes them. */
#define REF_READS_MAX 16
typedef struct ref_read {
  int param, rank;
  fj_expr *d;
  fj_expr *idx[FJ_EXPR_RANK_MAX];
} ref_read;

typedef struct ref_mods {
  const fj_mods *m;
  fj_mods_info info;          /* m's facts */
  fj_expr *score, *mask;
  /* The score expression's derivative with respect to s (expr_grad.c's
   * text, parsed back), for the backward; NULL without a score
   * expression. */
  fj_expr *dscore;
  ref_read reads[REF_READS_MAX];  /* the reads with gradients */
  int nreads;
  int left, right;            /* -1: unbounded */
  double softcap;             /* 0: none */
} ref_mods;

typedef struct ref_head {
  const fj_problem *p;
  const ref_mods *mods;
  int b, hq, hk;
  const void *q, *k, *v;
  int64_t qoff;               /* element offset of this head's row 0 */
  int64_t koff, voff;         /* of key 0 (paged: of page 0's head) */
  const int32_t *pages;       /* paged: this sequence's row of the table */
  int64_t ooff;               /* of this head's row 0 in O (and dO) */
  int len_kv, causal_off;     /* this sequence's keys and mask offset */
  double kscale, vscale;
  fj_dtype qdt, kv;           /* Q's (and dO's) and K/V's element types */
  double sink;                /* this head's sink logit; -inf: none */
} ref_head;

/* The element type of the float64 path's inputs (fj__reference_fwd64,
 * fj__reference_bwd64): never a problem's, which fj__check_types bounds. */
#define F64_INPUT ((fj_dtype)64)

static double elem(fj_dtype d, const void *base, int64_t i)
{
  if (d == F64_INPUT)
    return ((const double *)base)[i];
  return (double)fj__to_float(d, base, (size_t)i);
}

/* Where key j of the head starts in K (s: k_stride, off: koff) or V. */
static int64_t key_at(const ref_head *h, const int64_t s[3], int64_t off, int j)
{
  if (!h->pages)
    return off + (int64_t)j * s[2];
  int ps = h->p->page_size;
  return off + (int64_t)h->pages[j / ps] * s[0] + (int64_t)(j % ps) * s[2];
}

/* What expr.c's tensor reader is given: the parameters, and the name
 * index of the first in the expression's list. */
typedef struct ref_params {
  const fj_mods *m;
  int first;
} ref_params;

/* A tensor parameter's element for expr.c: 0 outside the extents. */
static fj_expr_value read_param(void *user, int name, const int32_t *idx)
{
  const ref_params *rp = user;
  const fj_mod_param *t = &rp->m->params[name - rp->first];
  fj_expr_value v = {t->type == FJ_MOD_I32, 0, 0.f};
  int64_t flat = 0;
  for (int d = 0; d < t->rank; d++) {
    if (idx[d] < 0 || idx[d] >= t->extents[d])
      return v;
    flat = flat * t->extents[d] + idx[d];
  }
  switch (t->type) {
  case FJ_MOD_I32: v.i = ((const int32_t *)t->data)[flat]; break;
  case FJ_MOD_F32: v.f = ((const float *)t->data)[flat]; break;
  case FJ_MOD_F16: v.f = fj__half_to_float(((const uint16_t *)t->data)[flat]); break;
  case FJ_MOD_BF16: v.f = fj__bf16_to_float(((const uint16_t *)t->data)[flat]); break;
  }
  return v;
}

/* Evaluates a user expression at (b, h, hkv, q, kv) and, for the score, s,
 * with the values in the order of fj__mods_names. */
static fj_expr_value eval_mod(const ref_head *h, const fj_expr *e, int score,
                              float sv, int q, int kv)
{
  const fj_mods *m = h->mods->m;
  fj_expr_value vals[FJ_MOD_NAMES_MAX] = {{0}};
  int vars[5] = {h->b, h->hq, h->hk, q, kv}, n = 0;
  for (int i = 0; i < 5; i++)
    vals[n++] = (fj_expr_value){1, vars[i], 0.f};
  if (score)
    vals[n++] = (fj_expr_value){0, 0, sv};
  for (int i = 0; i < m->num_params; i++) {
    const fj_mod_param *t = &m->params[i];
    vals[n++] = (fj_expr_value){t->type == FJ_MOD_I32, (int32_t)t->value,
                                (float)t->value};
  }
  ref_params rp = {m, fj__mods_first_param(score)};
  fj_expr_env env = {vals, read_param, &rp};
  return fj__expr_eval(e, &env);
}

/* A block mask's word on (row, j) (host arrays here): 0 when j's block
 * is in neither list of row's query block, 1 in the partial list, 2 in the
 * full one; counts clamped as the kernels clamp them. */
static int ref_block(const ref_head *h, int row, int j)
{
  const fj_block_mask *bm = h->mods->m->block_mask;
  int64_t r = ((int64_t)(bm->batch > 1 ? h->b : 0) * bm->heads +
               (bm->heads > 1 ? h->hq : 0)) * bm->q_blocks + row / bm->block_q;
  int kb = j / bm->block_kv, kvb = bm->kv_blocks;
  const int32_t *num[2] = {bm->kv_num, bm->full_num};
  const int32_t *idx[2] = {bm->kv_indices, bm->full_indices};
  for (int f = 0; f < 2; f++) {
    if (!num[f])
      continue;
    int n = num[f][r] < 0 ? 0 : num[f][r] > kvb ? kvb : num[f][r];
    for (int i = 0; i < n; i++)
      if (idx[f][r * kvb + i] == kb)
        return f + 1;
  }
  return 0;
}

/* Whether row sees key j: the sequence end, the causal mask, the window
 * (their formulas), the block mask's lists, then the user's mask
 * expression (not on a block the block mask lists as full). */
static int ref_visible(const ref_head *h, int row, int j)
{
  const ref_mods *rm = h->mods;
  int diag = row + h->causal_off;
  if (j >= h->len_kv || (h->p->causal != FJ_CAUSAL_NONE && j > diag))
    return 0;
  if (rm->info.window && ((rm->left >= 0 && j < diag - rm->left) ||
                     (rm->right >= 0 && j > diag + rm->right)))
    return 0;
  int block = rm->info.blocks ? ref_block(h, row, j) : 1;
  if (block != 1)
    return block == 2;
  if (rm->mask) {
    fj_expr_value k = eval_mod(h, rm->mask, 0, 0.f, row, j);
    return k.is_int ? k.i != 0 : k.f != 0.f;
  }
  return 1;
}

/* The score of (row, j) from the scaled score x: the user's expression
 * (in float32, as the kernel computes it), then the softcap's formula. */
static double ref_score(const ref_head *h, int row, int j, double x)
{
  const ref_mods *rm = h->mods;
  if (rm->score) {
    fj_expr_value v = eval_mod(h, rm->score, 1, (float)x, row, j);
    x = v.is_int ? (double)v.i : (double)v.f;
  }
  if (rm->softcap > 0)
    x = rm->softcap * tanh(x / rm->softcap);
  return x;
}

/* One output row: O[row] and its log-sum-exp, over the keys it may see
 * (s[j] = -inf for a hidden key); raw (NULL: not kept) gets the scaled
 * scores before the score functions, which the backward's derivative
 * reads. */
static void ref_row(const ref_head *h, int row, double scale, double *s,
                    double *raw, double *out, double *lse)
{
  const fj_problem *p = h->p;
  int d = p->head_dim, dv = fj__problem_dv(p), last = h->len_kv - 1;
  double mx = -HUGE_VAL;
  for (int j = 0; j <= last; j++) {
    s[j] = -HUGE_VAL;
    if (!ref_visible(h, row, j))
      continue;
    double acc = 0;
    int64_t kj = key_at(h, p->k_stride, h->koff, j);
    for (int e = 0; e < d; e++)
      acc += elem(h->qdt, h->q, h->qoff + (int64_t)row * p->q_stride[2] + e) *
             elem(h->kv, h->k, kj + e);
    if (raw)
      raw[j] = acc * h->kscale * scale;
    s[j] = ref_score(h, row, j, acc * h->kscale * scale);
    mx = s[j] > mx ? s[j] : mx;
  }
  /* A sink joins the denominator with no value row: it takes part in the
   * max (so that exp cannot overflow) and adds exp(sink - mx) to the sum
   * below.  A row that sees no key then gets O = 0 and LSE = the sink. */
  const double sink = h->sink;
  if (isnan(sink)) {  /* as the kernels: NaN in, NaN out */
    for (int e = 0; e < dv; e++)
      out[e] = NAN;
    if (lse)
      *lse = NAN;
    return;
  }
  if (sink > mx)
    mx = sink;
  memset(out, 0, sizeof *out * (size_t)dv);
  double sum = sink == -HUGE_VAL ? 0.0 : sink == mx ? 1.0 : exp(sink - mx);
  for (int j = 0; j <= last && mx > -HUGE_VAL; j++) {
    if (s[j] == -HUGE_VAL)
      continue;
    double w = exp(s[j] - mx);
    int64_t vj = key_at(h, p->v_stride, h->voff, j);
    sum += w;
    for (int e = 0; e < dv; e++)
      out[e] += w * elem(h->kv, h->v, vj + e);
  }
  for (int e = 0; e < dv && sum > 0; e++)
    out[e] *= h->vscale / sum;
  if (lse)
    *lse = sum > 0 ? mx + log(sum) : -HUGE_VAL;
}

/* ---- varlen and paged index arrays -------------------------------------------- */

/* A prefix-sum array: starts at 0 or more, never decreases, and each
 * step (a sequence's length) is at most max. */
static fj_status check_prefix(const char *name, const int32_t *cu, int batch,
                              int max, const char *max_name)
{
  if (cu[0] < 0)
    return fj__fail(NULL, FJ_ERR_INVALID_ARG,
                    "%s[0] = %d is negative: the first sequence starts at "
                    "row 0 or later",
                    name, cu[0]);
  for (int b = 0; b < batch; b++) {
    int64_t len = (int64_t)cu[b + 1] - cu[b];
    if (len < 0)
      return fj__fail(NULL, FJ_ERR_INVALID_ARG,
                      "%s is not increasing: %s[%d] = %d < %s[%d] = %d", name,
                      name, b + 1, cu[b + 1], name, b, cu[b]);
    if (len > max)
      return fj__fail(NULL, FJ_ERR_INVALID_ARG,
                      "%s: sequence %d has %lld rows, more than %s %d", name,
                      b, (long long)len, max_name, max);
  }
  return FJ_OK;
}

/* The last sequence ends within the packed tensor's rows. */
static fj_status check_end(const char *name, const int32_t *cu, int batch,
                           const char *total_name, int total)
{
  if (cu[batch] <= total)
    return FJ_OK;
  return fj__fail(NULL, FJ_ERR_INVALID_ARG,
                  "%s[%d] = %d is past the packed tensor's end: %s is %d",
                  name, batch, cu[batch], total_name, total);
}

/* Sequence b's keys: seqused_kv, else cu_seqlens_kv's step, else seq_kv. */
static int kv_len(const fj_problem *p, int b)
{
  if (p->seqused_kv)
    return p->seqused_kv[b];
  if (p->cu_seqlens_kv)
    return p->cu_seqlens_kv[b + 1] - p->cu_seqlens_kv[b];
  return p->seq_kv;
}

fj_status fj_problem_check_lengths(const fj_problem *p)
{
  fj__clear_error(NULL);
  if (!p)
    return fj__null_arg(NULL, "fj_problem_check_lengths", "p");
  fj_status st = fj__problem_check_common(NULL, p);
  if (st == FJ_OK && p->cu_seqlens_q)
    st = check_prefix("cu_seqlens_q", p->cu_seqlens_q, p->batch, p->seq_q,
                      "seq_q");
  if (st == FJ_OK && p->cu_seqlens_kv)
    st = check_prefix("cu_seqlens_kv", p->cu_seqlens_kv, p->batch, p->seq_kv,
                      "seq_kv");
  if (st == FJ_OK && p->total_q)
    st = check_end("cu_seqlens_q", p->cu_seqlens_q, p->batch, "total_q",
                   p->total_q);
  if (st == FJ_OK && p->total_kv)
    st = check_end("cu_seqlens_kv", p->cu_seqlens_kv, p->batch, "total_kv",
                   p->total_kv);
  for (int b = 0; st == FJ_OK && p->seqused_kv && b < p->batch; b++)
    if (p->seqused_kv[b] < 0 || p->seqused_kv[b] > p->seq_kv)
      st = fj__fail(NULL, FJ_ERR_INVALID_ARG,
                    "seqused_kv[%d] = %d is invalid: must be in 0..seq_kv %d",
                    b, p->seqused_kv[b], p->seq_kv);
  for (int b = 0; st == FJ_OK && p->block_table && b < p->batch; b++) {
    int used = (kv_len(p, b) + p->page_size - 1) / p->page_size;
    const int32_t *row = p->block_table + (int64_t)b * p->max_pages;
    for (int i = 0; i < used; i++)
      if (row[i] < 0 || row[i] >= p->num_pages) {
        st = fj__fail(NULL, FJ_ERR_INVALID_ARG,
                      "block_table[%d][%d] = %d is not a page: must be in "
                      "0..num_pages - 1 = %d",
                      b, i, row[i], p->num_pages - 1);
        break;
      }
  }
  return st;
}

static fj_status check_rows(int row_begin, int row_end, int seq_q)
{
  if (row_begin < 0 || row_begin > seq_q)
    return fj__fail(NULL, FJ_ERR_INVALID_ARG,
                    "fj_reference_fwd: row_begin %d is invalid: must be in "
                    "0..seq_q %d",
                    row_begin, seq_q);
  if (row_end < row_begin || row_end > seq_q)
    return fj__fail(NULL, FJ_ERR_INVALID_ARG,
                    "fj_reference_fwd: row_end %d is invalid: must be in "
                    "row_begin %d..seq_q %d",
                    row_end, row_begin, seq_q);
  return FJ_OK;
}

/* Text that expr_grad.c or expr.c printed (b), parsed back with the score
 * expression's names; NULL when b is empty (out of memory). */
static fj_expr *parse_printed(const ref_mods *rm, const fj_buf *b)
{
  fj_expr_name names[FJ_MOD_NAMES_MAX];
  int n = fj__mods_names(rm->m, 1, names);
  char err[512];
  return b->data ? fj__expr_parse(b->data, "score'", names, n, err, sizeof err)
                 : NULL;
}

/* Read node k of parameter i (its gradient's read): derivative, indices. */
static int ref_read_open(ref_mods *rm, int i, int k, const fj_expr_print *o)
{
  ref_read *r = &rm->reads[rm->nreads++];
  fj_buf b = {0};
  int ok = fj__expr_grad_read_cuda(rm->score, k, o, &b) == 0 &&
           (r->d = parse_printed(rm, &b)) != NULL;
  r->param = i;
  r->rank = rm->m->params[i].rank;
  for (int d = 0; ok && d < r->rank; d++) {
    fj__buf_free(&b);
    ok = fj__expr_print_cuda(rm->score, fj__expr_kid(rm->score, k, d), o,
                             &b) == 0 &&
         (r->idx[d] = parse_printed(rm, &b)) != NULL;
  }
  fj__buf_free(&b);
  return ok ? 0 : -1;
}

/* The reads of the parameters that have gradients. */
static fj_status ref_reads_open(ref_mods *rm, const fj_expr_print *o)
{
  for (int i = 0; i < rm->m->num_params; i++) {
    if (!fj__mods_has_grad(rm->m, i))
      continue;
    int nodes[REF_READS_MAX];
    int n = fj__expr_reads_of(rm->score, fj__mods_first_param(1) + i, nodes,
                              REF_READS_MAX);
    if (rm->nreads + n > REF_READS_MAX)
      return fj__fail(NULL, FJ_ERR_UNSUPPORTED,
                      "mods.param_grads: the score expression reads the "
                      "parameters with gradients more than %d times",
                      REF_READS_MAX);
    for (int r = 0; r < n; r++)
      if (ref_read_open(rm, i, nodes[r], o))
        return fj__fail(NULL, FJ_ERR_NOMEM,
                        "mods.param_grads: out of memory for a derivative");
  }
  return FJ_OK;
}

static void ref_mods_close(ref_mods *rm);

/* The score expression's derivative (expr_grad.c), printed in the form
 * that parses back and parsed with the expression's names: the evaluator
 * then computes it as it computes the expression; and the derivatives of
 * the parameters' reads that have gradients. */
static fj_status ref_derive(ref_mods *rm)
{
  fj_expr_name names[FJ_MOD_NAMES_MAX];
  fj__mods_names(rm->m, 1, names);
  fj_expr_print o = {names, NULL, NULL, 0, 1};
  fj_buf b = {0};
  /* s is name 5 (fj__mods_names: b, h, hkv, q, kv, s, the parameters). */
  if (fj__expr_grad_cuda(rm->score, 5, &o, &b) == 0)
    rm->dscore = parse_printed(rm, &b);
  fj__buf_free(&b);
  fj_status st = rm->dscore ? ref_reads_open(rm, &o)
                            : fj__fail(NULL, FJ_ERR_NOMEM,
                                       "mods.score: out of memory for the "
                                       "expression's derivative");
  if (st != FJ_OK)
    ref_mods_close(rm);
  return st;
}

/* The reference's view of p's modifications (parsed expressions). */
static fj_status ref_mods_open(const fj_mods *m, ref_mods *rm)
{
  static const fj_mods none = {NULL, NULL, NULL, 0, -1, -1, 0.f, NULL, NULL, 0, NULL};
  const char *texts[2] = {m ? m->score : NULL, m ? m->mask : NULL};
  fj_expr **trees[2] = {&rm->score, &rm->mask};
  memset(rm, 0, sizeof *rm);
  rm->m = m ? m : &none;
  fj__mods_info(m, &rm->info);
  rm->left = m ? m->window_left : -1;
  rm->right = m ? m->window_right : -1;
  rm->softcap = rm->info.softcap ? (double)m->softcap : 0.0;
  for (int i = 0; i < 2; i++) {
    if (!texts[i] || !texts[i][0])
      continue;
    fj_expr_name names[FJ_MOD_NAMES_MAX];
    char err[512];
    int n = fj__mods_names(m, i == 0, names);
    *trees[i] = fj__expr_parse(texts[i], i == 0 ? "score" : "mask", names, n,
                               err, sizeof err);
    if (!*trees[i]) {
      fj__expr_free(rm->score);
      return fj__fail(NULL, FJ_ERR_INVALID_ARG, "mods.%s", err);
    }
  }
  return rm->score ? ref_derive(rm) : FJ_OK;
}

static void ref_mods_close(ref_mods *rm)
{
  for (int i = 0; i < rm->nreads; i++) {
    fj__expr_free(rm->reads[i].d);
    for (int d = 0; d < FJ_EXPR_RANK_MAX; d++)
      fj__expr_free(rm->reads[i].idx[d]);
  }
  rm->nreads = 0;
  fj__expr_free(rm->dscore);
  fj__expr_free(rm->score);
  fj__expr_free(rm->mask);
  rm->dscore = rm->score = rm->mask = NULL;
}

/* The checks of a problem that the forward and the backward share: what
 * fj_problem_check_lengths checks (the problem, then its host index
 * arrays), then the modifications' host arrays. */
static fj_status problem_check(const fj_problem *p)
{
  fj_status st = fj_problem_check_lengths(p);
  if (st == FJ_OK)
    st = fj__mods_check_data(NULL, p->mods);
  return st == FJ_OK ? fj__mods_check_blocks_data(NULL, p->mods) : st;
}

/* Everything the forward checks before a tensor is touched. */
static fj_status reference_check(const char *fn, const fj_problem *p,
                                 const void *q, const void *k, const void *v,
                                 const float *k_scale, const float *v_scale,
                                 int row_begin, int row_end, const double *out)
{
  const char *null = !p ? "p" : !q ? "q" : !k ? "k" : !v ? "v" : !out ? "out"
                                                                      : NULL;
  if (null)
    return fj__null_arg(NULL, fn, null);
  fj_status st = problem_check(p);
  if (st == FJ_OK)
    st = check_rows(row_begin, row_end, p->seq_q);
  return st == FJ_OK ? fj__check_scales(NULL, p, k_scale, v_scale) : st;
}

/* One call's fixed facts: the problem and its modifications, the inputs
 * and their element types, the scale, and which corner the mask's
 * diagonal starts from. */
typedef struct ref_run {
  const fj_problem *p;
  ref_mods rm;
  const void *q, *k, *v;
  const float *k_scale, *v_scale;
  fj_dtype qdt, kv;
  double scale;
  int bottom_right;
} ref_run;

static fj_status run_open(ref_run *r, const fj_problem *p, const void *q,
                          const void *k, const void *v, const float *k_scale,
                          const float *v_scale, int f64)
{
  fj_dtype kv = p->kv_dtype ? p->kv_dtype : p->dtype;
  *r = (ref_run){.p = p, .q = q, .k = k, .v = v, .k_scale = k_scale,
                 .v_scale = v_scale, .qdt = f64 ? F64_INPUT : p->dtype,
                 .kv = f64 ? F64_INPUT : kv};
  r->scale = p->scale != 0.f ? (double)p->scale : 1.0 / sqrt(p->head_dim);
  fj_status st = ref_mods_open(p->mods, &r->rm);
  r->bottom_right = p->causal == FJ_CAUSAL_BOTTOM_RIGHT ||
                    (p->causal == FJ_CAUSAL_NONE && r->rm.info.window);
  return st;
}

/* Where sequence b's rows start: Q's and O's row 0 (*q0, *o0) and K's
 * and V's key 0 (*k0, *v0; paged: 0, the table says the rest). */
static void seq_offsets(const fj_problem *p, int b, int64_t off[4])
{
  off[0] = (int64_t)b * p->q_stride[0];
  off[1] = (int64_t)b * p->o_stride[0];
  off[2] = (int64_t)b * p->k_stride[0];
  off[3] = (int64_t)b * p->v_stride[0];
  if (p->cu_seqlens_q) {
    off[0] = (int64_t)p->cu_seqlens_q[b] * p->q_stride[2];
    off[1] = (int64_t)p->cu_seqlens_q[b] * p->o_stride[2];
  }
  if (p->block_table) {
    off[2] = off[3] = 0;
  } else if (p->cu_seqlens_kv) {
    off[2] = (int64_t)p->cu_seqlens_kv[b] * p->k_stride[2];
    off[3] = (int64_t)p->cu_seqlens_kv[b] * p->v_stride[2];
  }
}

/* Fills *h for query head hq of sequence b; returns the sequence's rows. */
static int head_init(const ref_run *r, int b, int hq, ref_head *h)
{
  const fj_problem *p = r->p;
  int hk = hq / (p->heads_q / p->heads_kv);
  /* The FP8 descales' entry: this (batch, KV head)'s, or the tensor's. */
  int64_t kvh = p->scale_layout == FJ_SCALE_PER_TENSOR ? 0 : (int64_t)b * p->heads_kv + hk;
  int len_q = p->cu_seqlens_q ? p->cu_seqlens_q[b + 1] - p->cu_seqlens_q[b]
                              : p->seq_q;
  int len_kv = kv_len(p, b), fp8 = r->kv == FJ_E4M3;
  int64_t off[4];
  seq_offsets(p, b, off);
  *h = (ref_head){
      .p = p, .mods = &r->rm, .b = b, .hq = hq, .hk = hk,
      .q = r->q, .k = r->k, .v = r->v,
      .qoff = off[0] + hq * p->q_stride[1],
      .koff = off[2] + hk * p->k_stride[1],
      .voff = off[3] + hk * p->v_stride[1],
      .pages = p->block_table ? p->block_table + (int64_t)b * p->max_pages
                              : NULL,
      .ooff = off[1] + hq * p->o_stride[1],
      .len_kv = len_kv, .causal_off = r->bottom_right ? len_kv - len_q : 0,
      .kscale = (fp8 ? (double)r->k_scale[kvh] : 1.0) *
                (r->qdt == FJ_E4M3 ? (double)((const float *)p->q_scale)[kvh] : 1.0),
      .vscale = fp8 ? (double)r->v_scale[kvh] : 1.0,
      .qdt = r->qdt, .kv = r->kv,
      .sink = r->rm.info.sinks ? (double)p->mods->sinks[hq]
                                      : -HUGE_VAL};
  return len_q;
}

/* ---- threads ------------------------------------------------------------------ */

/* The reference spreads its items -- (batch, head) pairs -- over threads,
 * each with its own scratch, the caller's among them; each item is
 * computed exactly as on one thread, so the results are the same bits.
 * FLASHJIT_REFERENCE_THREADS (1 to 64) says how many, else the online
 * processors up to 16.  A thread that cannot have its scratch or cannot
 * be started leaves its items to the others. */
#define REF_THREADS_MAX 64
#define REF_SCRATCH_BUDGET ((size_t)1 << 30)

static int ref_threads(int64_t items, size_t scratch_bytes)
{
  const char *e = getenv("FLASHJIT_REFERENCE_THREADS");
  char *end = NULL;
  long n = e && *e ? strtol(e, &end, 10) : 0;
  if (n < 1 || n > REF_THREADS_MAX || (end && *end)) {
    n = sysconf(_SC_NPROCESSORS_ONLN);
    n = n < 1 ? 1 : n > 16 ? 16 : n;
  }
  /* Each thread's scratch within REF_SCRATCH_BUDGET in all. */
  if (scratch_bytes && (size_t)n * scratch_bytes > REF_SCRATCH_BUDGET)
    n = (long)(REF_SCRATCH_BUDGET / scratch_bytes);
  n = n < 1 ? 1 : n;
  return (int)(items < n ? (items < 1 ? 1 : items) : n);
}

typedef struct ref_work {
  void (*run)(void *job, int64_t item, void *scratch);
  void *(*scratch_new)(void *job);  /* NULL: out of memory */
  void (*scratch_free)(void *scratch);
  void *job;
  int64_t items;
  atomic_llong next;                /* the next item to claim */
  atomic_llong done;                /* items run */
} ref_work;

static void *ref_worker(void *arg)
{
  ref_work *w = arg;
  void *scratch = w->scratch_new(w->job);
  if (!scratch)
    return NULL;
  for (long long i; (i = atomic_fetch_add(&w->next, 1)) < w->items;) {
    w->run(w->job, i, scratch);
    atomic_fetch_add(&w->done, 1);
  }
  w->scratch_free(scratch);
  return NULL;
}

/* How many threads the calling thread's last reference run used. */
static _Thread_local int last_threads;

int fj__reference_last_threads(void)
{
  return last_threads;
}

/* Runs every item of w on up to `threads` threads; 0, or -1 where no
 * thread had its scratch (some items did not run: out of memory). */
static int ref_parallel(ref_work *w, int threads)
{
  pthread_t t[REF_THREADS_MAX];
  int started = 0;
  atomic_init(&w->next, 0);
  atomic_init(&w->done, 0);
  while (started < threads - 1 &&
         pthread_create(&t[started], NULL, ref_worker, w) == 0)
    started++;
  ref_worker(w);
  for (int i = 0; i < started; i++)
    pthread_join(t[i], NULL);
  last_threads = started + 1;
  return atomic_load(&w->done) == w->items ? 0 : -1;
}

/* ---- forward ------------------------------------------------------------------ */

/* The forward's items: (b, hq), the rows [row_begin, row_end) of each;
 * scratch: one row's scores. */
typedef struct fwd_job {
  const ref_run *r;
  int row_begin, row_end;
  double *out, *out_lse;
} fwd_job;

static void *fwd_scratch(void *job)
{
  const fwd_job *j = job;
  return malloc(sizeof(double) * ((size_t)j->r->p->seq_kv + 1));
}

static void fwd_item(void *job, int64_t item, void *scratch)
{
  const fwd_job *j = job;
  const ref_run *r = j->r;
  const fj_problem *p = r->p;
  int b = (int)(item / p->heads_q), hq = (int)(item % p->heads_q);
  size_t rows = (size_t)(j->row_end - j->row_begin), d = (size_t)fj__problem_dv(p);
  ref_head h;
  int len_q = head_init(r, b, hq, &h);
  size_t base = (size_t)item * rows;
  for (size_t i = 0; i < rows; i++) {
    int row = j->row_begin + (int)i;
    double *o = j->out + (base + i) * d;
    double *l = j->out_lse ? j->out_lse + base + i : NULL;
    if (row < len_q) {
      ref_row(&h, row, r->scale, scratch, NULL, o, l);
    } else {  /* past the sequence's end: no such row */
      memset(o, 0, sizeof *o * d);
      if (l)
        *l = NAN;
    }
  }
}

static fj_status reference_fwd(const ref_run *r, const char *fn, int row_begin,
                               int row_end, double *out, double *out_lse)
{
  const fj_problem *p = r->p;
  fwd_job job = {r, row_begin, row_end, out, out_lse};
  ref_work w = {.run = fwd_item, .scratch_new = fwd_scratch, .scratch_free = free,
                .job = &job, .items = (int64_t)p->batch * p->heads_q};
  if (ref_parallel(&w, ref_threads(w.items, 0)) != 0)
    return fj__fail(NULL, FJ_ERR_NOMEM, "%s: out of memory for %d scores",
                    fn, p->seq_kv);
  return FJ_OK;
}

/* The forward of fj_reference_fwd (f64 0: p's types, the scales) and of
 * fj__reference_fwd64 (f64 1: float64 inputs, every row). */
static fj_status fwd_entry(const char *fn, const fj_problem *p, const void *q,
                           const void *k, const void *v, const float *k_scale,
                           const float *v_scale, int row_begin, int row_end,
                           double *out, double *out_lse, int f64)
{
  fj__clear_error(NULL);
  if (f64 && p)
    row_end = p->seq_q;
  fj_status st = reference_check(fn, p, q, k, v, k_scale, v_scale, row_begin,
                                 row_end, out);
  if (st != FJ_OK)
    return st;
  ref_run r;
  if ((st = run_open(&r, p, q, k, v, k_scale, v_scale, f64)) != FJ_OK)
    return st;
  st = reference_fwd(&r, fn, row_begin, row_end, out, out_lse);
  ref_mods_close(&r.rm);
  return st;
}

fj_status fj_reference_fwd(const fj_problem *p, const void *q, const void *k,
                           const void *v, const float *k_scale,
                           const float *v_scale, int row_begin, int row_end,
                           double *out, double *out_lse)
{
  return fwd_entry("fj_reference_fwd", p, q, k, v, k_scale, v_scale,
                   row_begin, row_end, out, out_lse, 0);
}

fj_status fj__reference_fwd64(const fj_problem *p, const double *q,
                              const double *k, const double *v, double *out,
                              double *out_lse)
{
  return fwd_entry("fj__reference_fwd64", p, q, k, v, NULL, NULL, 0, 0, out,
                   out_lse, 1);
}

/* ---- the float64 reference's backward ------------------------------------------
 * The gradients of L = sum(dO . O), row by row: ref_row recomputes the
 * scores and the forward, then, for each key j the row sees, with
 * P_j = exp(s_j - LSE), dP_j = dO . V_j and Delta = dO . O:
 *   dV_j += P_j dO,   dS_j = P_j (dP_j - Delta) [x (1 - (s_j / c)^2)]
 *                               {x f'(x_j)},
 *   dQ += scale dS_j K_j,   dK_j += scale dS_j Q,
 * and a sink's logit gets -exp(sink - LSE) Delta.  The bracket is the
 * softcap's derivative, c tanh(x / c)' = 1 - tanh^2, read off the capped
 * score itself; the brace the score expression f's derivative (expr_grad.c)
 * at the raw scaled score x_j.  A float tensor parameter with a gradient
 * (fj_mods.param_grads) gets, per element a read fetched, dS_j before the
 * brace times the score's derivative with respect to that value.
 */

/* What the backward does not take (yet): FP8 K/V, split head dims. */
static fj_status bwd_unsupported(const char *fn, const fj_problem *p)
{
  if (p->dtype == FJ_E4M3)
    return fj__fail(NULL, FJ_ERR_UNSUPPORTED,
                    "%s: dtype e4m3 is not implemented in the backward (FP8 "
                    "attention runs forward only): f16 or bf16",
                    fn);
  if (p->kv_dtype == FJ_E4M3)
    return fj__fail(NULL, FJ_ERR_UNSUPPORTED,
                    "%s: kv_dtype e4m3 is not implemented in the backward: "
                    "K and V in dtype (f16 or bf16)",
                    fn);
  if (fj__problem_dv(p) != p->head_dim)
    return fj__fail(NULL, FJ_ERR_UNSUPPORTED,
                    "%s: head_dim_v %d with head_dim %d is not implemented in "
                    "the backward: one head dim (head_dim_v 0)",
                    fn, fj__problem_dv(p), p->head_dim);
  return FJ_OK;
}

/* The states (0 none, 1 partial, 2 full) of one (batch, head)'s blocks,
 * [q_blocks][kv_blocks], from one direction of a block mask's lists: the
 * rows' (by query block; cols 0) or the transposed ones (by key block),
 * counts clamped and indices out of range dropped as the kernels do. */
static void block_states(const fj_block_mask *bm, int64_t first, int cols,
                         int8_t *out)
{
  int n = cols ? bm->kv_blocks : bm->q_blocks, len = cols ? bm->q_blocks
                                                          : bm->kv_blocks;
  const int32_t *num[2] = {cols ? bm->q_num : bm->kv_num,
                           cols ? bm->full_q_num : bm->full_num};
  const int32_t *idx[2] = {cols ? bm->q_indices : bm->kv_indices,
                           cols ? bm->full_q_indices : bm->full_indices};
  memset(out, 0, (size_t)bm->q_blocks * (size_t)bm->kv_blocks);
  for (int f = 0; f < 2; f++)
    for (int r = 0; num[f] && r < n; r++) {
      int64_t at = first + r;
      int c = num[f][at] < 0 ? 0 : num[f][at] > len ? len : num[f][at];
      for (int i = 0; i < c; i++) {
        int32_t e = idx[f][at * len + i];
        if (e >= 0 && e < len)
          out[cols ? (int64_t)e * bm->kv_blocks + r
                   : (int64_t)r * bm->kv_blocks + e] = (int8_t)(f + 1);
      }
    }
}

/* Where a block mask has transposed lists (the kernels' backward walks
 * them), they must describe the blocks its rows' lists do, which this
 * reference reads: FJ_ERR_INVALID_ARG naming the first block where not. */
static fj_status bwd_blocks_agree(const char *fn, const fj_block_mask *bm)
{
  static const char *const kind[3] = {"none", "partial", "full"};
  size_t n = (size_t)bm->q_blocks * (size_t)bm->kv_blocks;
  int8_t *rows = malloc(n), *cols = malloc(n);
  fj_status st = rows && cols ? FJ_OK
                 : fj__fail(NULL, FJ_ERR_NOMEM,
                            "%s: out of memory for a block mask of %zu blocks",
                            fn, n);
  const int64_t lists = (int64_t)bm->batch * bm->heads;
  for (int64_t bh = 0; st == FJ_OK && bh < lists; bh++) {
    block_states(bm, bh * bm->q_blocks, 0, rows);
    block_states(bm, bh * bm->kv_blocks, 1, cols);
    for (size_t i = 0; i < n; i++)
      if (rows[i] != cols[i]) {
        st = fj__fail(NULL, FJ_ERR_INVALID_ARG,
                      "%s: mods.block_mask's lists disagree at batch %d, head "
                      "%d, query block %d, key block %d: %s by kv_num and "
                      "kv_indices, %s by q_num and q_indices",
                      fn, (int)(bh / bm->heads), (int)(bh % bm->heads),
                      (int)(i / (size_t)bm->kv_blocks),
                      (int)(i % (size_t)bm->kv_blocks), kind[(int)rows[i]],
                      kind[(int)cols[i]]);
        break;
      }
  }
  free(rows);
  free(cols);
  return st;
}

static fj_status bwd_check(const char *fn, const fj_problem *p,
                           const void *const in[4], void *const out[3])
{
  static const char *const names[7] = {"q", "k", "v", "dout",
                                       "dq", "dk", "dv"};
  if (!p)
    return fj__null_arg(NULL, fn, "p");
  for (int i = 0; i < 7; i++)
    if (!(i < 4 ? in[i] : out[i - 4]))
      return fj__null_arg(NULL, fn, names[i]);
  fj_status st = problem_check(p);
  if (st == FJ_OK)
    st = fj__mods_check_grads(NULL, p->mods, fn);
  const fj_block_mask *bm = p->mods ? p->mods->block_mask : NULL;
  if (st == FJ_OK && bm && bm->q_num)
    st = bwd_blocks_agree(fn, bm);
  return st == FJ_OK ? bwd_unsupported(fn, p) : st;
}

/* Where the backward writes: float32 arrays (fj_reference_bwd) or float64
 * ones (fj__reference_bwd64), in Q's, K's and V's strides. */
typedef struct ref_grads {
  void *dq, *dk, *dv, *dsinks;
  int f64;
} ref_grads;

/* Element i of a gradient array becomes x, or x is added to it. */
static void grad_put(const ref_grads *g, void *base, int64_t i, double x,
                     int add)
{
  if (g->f64) {
    double *e = (double *)base + i;
    *e = add ? *e + x : x;
  } else {
    float *e = (float *)base + i;
    *e = (float)(add ? (double)*e + x : x);
  }
}

/* Zeroes every gradient element the problem addresses before anything is
 * added: an element that strides repeat (a broadcast, a page that two
 * sequences share) then receives the sum of its gradients.  Dense K and V
 * get every one of their seq_kv rows (those past seqused_kv stay 0). */
static void grads_zero(const ref_run *r, const ref_grads *g)
{
  const fj_problem *p = r->p;
  int d = p->head_dim, group = p->heads_q / p->heads_kv;
  for (int b = 0; b < p->batch; b++)
    for (int hq = 0; hq < p->heads_q; hq++) {
      ref_head h;
      int len_q = head_init(r, b, hq, &h);
      int keys = p->cu_seqlens_kv || p->block_table ? h.len_kv : p->seq_kv;
      for (int row = 0; row < len_q; row++)
        for (int e = 0; e < d; e++)
          grad_put(g, g->dq, h.qoff + (int64_t)row * p->q_stride[2] + e, 0, 0);
      for (int j = 0; j < keys && hq % group == 0; j++)
        for (int e = 0; e < d; e++) {
          grad_put(g, g->dk, key_at(&h, p->k_stride, h.koff, j) + e, 0, 0);
          grad_put(g, g->dv, key_at(&h, p->v_stride, h.voff, j) + e, 0, 0);
        }
    }
}

/* The backward's scratch: one row's scores, O, dO and dQ, one KV head's
 * dK and dV ([seq_kv][head_dim], summed over its query heads), the
 * sinks' gradients, and the row's raw scores (before the score
 * functions). */
typedef struct bwd_buf {
  double *s, *o, *dout, *dq;
  double *dk, *dv;
  double *dsink;
  double *raw;
} bwd_buf;

/* The scratch's doubles. */
static size_t bwd_buf_doubles(const fj_problem *p)
{
  size_t n = (size_t)p->seq_kv, d = (size_t)p->head_dim;
  return 2 * n + 4 * d + 2 * n * d + (size_t)p->heads_q;
}

static double *bwd_buf_alloc(const fj_problem *p, bwd_buf *w)
{
  size_t n = (size_t)p->seq_kv, d = (size_t)p->head_dim;
  size_t hq = (size_t)p->heads_q;
  double *all = calloc(bwd_buf_doubles(p), sizeof *all);
  if (all)
    *w = (bwd_buf){all, all + n, all + n + d, all + n + 2 * d,
                   all + n + 3 * d, all + n + 3 * d + n * d,
                   all + n + 3 * d + 2 * n * d,
                   all + n + 3 * d + 2 * n * d + hq};
  return all;
}

/* The score expression's derivative at key j of row (1 without one):
 * at the raw score, in float32, as the evaluator computes the expression. */
static double score_slope(const ref_head *h, int row, int j, const bwd_buf *w)
{
  const fj_expr *d = h->mods->dscore;
  if (!d)
    return 1.0;
  fj_expr_value v = eval_mod(h, d, 1, (float)w->raw[j], row, j);
  return v.is_int ? (double)v.i : (double)v.f;
}

/* The parameters' gradients at key j of row: each read with a gradient
 * adds ds (d loss / d score) times the score's derivative with respect to
 * the value it fetched, at the indices it read (nothing outside the
 * extents), into fj_mods.param_grads. */
static void ref_param_grads(const ref_head *h, int row, int j, double ds,
                            const bwd_buf *w)
{
  const ref_mods *rm = h->mods;
  for (int r = 0; r < rm->nreads; r++) {
    const ref_read *rd = &rm->reads[r];
    const fj_mod_param *t = &rm->m->params[rd->param];
    int64_t flat = 0;
    int in = 1;
    for (int d = 0; d < rd->rank; d++) {
      fj_expr_value i = eval_mod(h, rd->idx[d], 1, (float)w->raw[j], row, j);
      in &= i.i >= 0 && i.i < t->extents[d];
      flat = flat * t->extents[d] + i.i;
    }
    if (!in)
      continue;
    fj_expr_value v = eval_mod(h, rd->d, 1, (float)w->raw[j], row, j);
    float *g = rm->m->param_grads[rd->param] + flat;
    *g = (float)((double)*g + ds * (v.is_int ? (double)v.i : (double)v.f));
  }
}

/* Key j's part of the row's gradients (pj: its probability). */
static void bwd_key(const ref_head *h, int row, int j, int64_t qrow, double pj,
                    double delta, double scale, bwd_buf *w)
{
  const fj_problem *p = h->p;
  int d = p->head_dim;
  int64_t kj = key_at(h, p->k_stride, h->koff, j);
  int64_t vj = key_at(h, p->v_stride, h->voff, j);
  double dp = 0, *dk = w->dk + (size_t)j * (size_t)d;
  double *dv = w->dv + (size_t)j * (size_t)d;
  for (int e = 0; e < d; e++) {
    dp += w->dout[e] * elem(h->kv, h->v, vj + e);
    dv[e] += pj * w->dout[e];
  }
  double ds = pj * (dp - delta), cap = h->mods->softcap;
  if (cap > 0)
    ds *= 1.0 - (w->s[j] / cap) * (w->s[j] / cap);
  ref_param_grads(h, row, j, ds, w);
  ds *= scale * score_slope(h, row, j, w);
  for (int e = 0; e < d; e++) {
    w->dq[e] += ds * elem(h->kv, h->k, kj + e);
    dk[e] += ds * elem(h->qdt, h->q, qrow + e);
  }
}

/* One part of a merged attention's keys (fj__reference_bwd_part64): the
 * merged O, in o_stride, and its log-sum-exp [batch][heads_q][seq_q]. */
typedef struct ref_merged {
  const double *o, *lse;
} ref_merged;

/* One query row's gradients: dQ written, dK, dV and the sink's added to
 * the scratch.  A row that sees no key (and has no sink) depends on no
 * input: its gradients stay 0.  With mg, P and Delta come from the merged
 * O and log-sum-exp instead of the row's own. */
static void bwd_row(const ref_head *h, int row, double scale, const void *dout,
                    const ref_merged *mg, const ref_grads *g, bwd_buf *w)
{
  const fj_problem *p = h->p;
  int d = p->head_dim;
  double lse, delta = 0;
  ref_row(h, row, scale, w->s, w->raw, w->o, &lse);
  int64_t qrow = h->qoff + (int64_t)row * p->q_stride[2];
  int64_t orow = h->ooff + (int64_t)row * p->o_stride[2];
  if (mg) {
    lse = mg->lse[((int64_t)h->b * p->heads_q + h->hq) * p->seq_q + row];
    for (int e = 0; e < d; e++)
      w->o[e] = mg->o[orow + e];
  }
  if (lse == -HUGE_VAL)
    return;
  for (int e = 0; e < d; e++) {
    w->dout[e] = elem(h->qdt, dout, orow + e);
    delta += w->dout[e] * w->o[e];
    w->dq[e] = 0;
  }
  /* A loss that uses the LSE too: its derivative at s[j] is P[j]. */
  if (p->dlse)
    delta -= (double)p->dlse[((int64_t)h->b * p->heads_q + h->hq) * p->seq_q + row];
  for (int j = 0; j < h->len_kv; j++)
    if (w->s[j] != -HUGE_VAL)
      bwd_key(h, row, j, qrow, exp(w->s[j] - lse), delta, scale, w);
  if (h->sink != -HUGE_VAL)
    w->dsink[h->hq] -= exp(h->sink - lse) * delta;
  for (int e = 0; e < d; e++)
    grad_put(g, g->dq, qrow + e, w->dq[e], 1);
}

/* Adds a KV head's summed dK and dV to the arrays and clears them. */
static void bwd_flush_kv(const ref_head *h, const ref_grads *g, bwd_buf *w)
{
  const fj_problem *p = h->p;
  size_t d = (size_t)p->head_dim;
  for (int j = 0; j < h->len_kv; j++) {
    int64_t kj = key_at(h, p->k_stride, h->koff, j);
    int64_t vj = key_at(h, p->v_stride, h->voff, j);
    for (size_t e = 0; e < d; e++) {
      grad_put(g, g->dk, kj + (int64_t)e, w->dk[(size_t)j * d + e], 1);
      grad_put(g, g->dv, vj + (int64_t)e, w->dv[(size_t)j * d + e], 1);
    }
  }
  memset(w->dk, 0, sizeof *w->dk * (size_t)p->seq_kv * d);
  memset(w->dv, 0, sizeof *w->dv * (size_t)p->seq_kv * d);
}

/* The backward's items: (b, hk), its group's query heads' rows, then the
 * KV head's dK and dV; scratch: a bwd_buf. */
typedef struct bwd_job {
  const ref_run *r;
  const void *dout;
  const ref_merged *mg;
  const ref_grads *g;
} bwd_job;

typedef struct bwd_scratch {
  bwd_buf w;
  double *all;
} bwd_scratch;

static void *bwd_scratch_new(void *job)
{
  const bwd_job *j = job;
  bwd_scratch *sc = malloc(sizeof *sc);
  if (sc && !(sc->all = bwd_buf_alloc(j->r->p, &sc->w))) {
    free(sc);
    sc = NULL;
  }
  return sc;
}

static void bwd_scratch_free(void *scratch)
{
  bwd_scratch *sc = scratch;
  free(sc->all);
  free(sc);
}

static void bwd_item(void *job, int64_t item, void *scratch)
{
  const bwd_job *j = job;
  const fj_problem *p = j->r->p;
  bwd_buf *w = &((bwd_scratch *)scratch)->w;
  int b = (int)(item / p->heads_kv), hk = (int)(item % p->heads_kv);
  int group = p->heads_q / p->heads_kv;
  ref_head h;
  for (int hq = hk * group; hq < (hk + 1) * group; hq++) {
    int len_q = head_init(j->r, b, hq, &h);
    for (int row = 0; row < len_q; row++)
      bwd_row(&h, row, j->r->scale, j->dout, j->mg, j->g, w);
  }
  bwd_flush_kv(&h, j->g, w);
}

/* Whether the backward's items may run on several threads: each writes
 * only its own elements of dQ, dK and dV (their rows apart, no shared
 * pages) and nothing the others add to (no sinks' or parameters'
 * gradients, summed over every item). */
static int bwd_items_apart(const ref_run *r)
{
  const fj_problem *p = r->p;
  if (p->block_table || r->rm.info.sinks || r->rm.nreads)
    return 0;
  /* A packed sequence whose used keys run past its own rows into the
   * next's. */
  for (int b = 0; p->cu_seqlens_kv && p->seqused_kv && b < p->batch; b++)
    if (p->seqused_kv[b] > p->cu_seqlens_kv[b + 1] - p->cu_seqlens_kv[b])
      return 0;
  return fj__problem_rows_apart(p);
}

static fj_status reference_bwd(const ref_run *r, const char *fn,
                               const void *dout, const ref_merged *mg,
                               const ref_grads *g)
{
  const fj_problem *p = r->p;
  grads_zero(r, g);
  bwd_job job = {r, dout, mg, g};
  ref_work w = {.run = bwd_item, .scratch_new = bwd_scratch_new,
                .scratch_free = bwd_scratch_free, .job = &job,
                .items = (int64_t)p->batch * p->heads_kv};
  bwd_scratch *one = NULL;
  int ok;
  if (bwd_items_apart(r)) {
    size_t per = sizeof(double) * bwd_buf_doubles(p);
    ok = ref_parallel(&w, ref_threads(w.items, per)) == 0;
  } else if ((ok = (one = bwd_scratch_new(&job)) != NULL)) {
    /* One thread, the items in order: the sinks' and the parameters'
     * gradients are sums over all of them. */
    for (int64_t i = 0; i < w.items; i++)
      bwd_item(&job, i, one);
    last_threads = 1;
  }
  if (!ok)
    return fj__fail(NULL, FJ_ERR_NOMEM,
                    "%s: out of memory for the gradients of %d keys", fn,
                    p->seq_kv);
  /* Without sinks (every case on threads) their gradients are 0. */
  for (int hq = 0; g->dsinks && hq < p->heads_q; hq++)
    grad_put(g, g->dsinks, hq, one ? one->w.dsink[hq] : 0, 0);
  if (one)
    bwd_scratch_free(one);
  return FJ_OK;
}

/* The backward of fj_reference_bwd (f64 0) and of fj__reference_bwd64
 * (f64 1: float64 inputs and gradients). */
static fj_status bwd_entry(const char *fn, const fj_problem *p,
                           const void *const in[4], void *const out[3],
                           void *dsinks, const ref_merged *mg, int f64)
{
  fj__clear_error(NULL);
  fj_status st = bwd_check(fn, p, in, out);
  if (st != FJ_OK)
    return st;
  ref_run r;
  if ((st = run_open(&r, p, in[0], in[1], in[2], NULL, NULL, f64)) != FJ_OK)
    return st;
  ref_grads g = {out[0], out[1], out[2], dsinks, f64};
  st = reference_bwd(&r, fn, in[3], mg, &g);
  ref_mods_close(&r.rm);
  return st;
}

fj_status fj_reference_bwd(const fj_problem *p, const void *q, const void *k,
                           const void *v, const void *dout, float *dq,
                           float *dk, float *dv, float *dsinks)
{
  const void *in[4] = {q, k, v, dout};
  void *out[3] = {dq, dk, dv};
  return bwd_entry("fj_reference_bwd", p, in, out, dsinks, NULL, 0);
}

fj_status fj__reference_bwd64(const fj_problem *p, const double *q,
                              const double *k, const double *v,
                              const double *dout, double *dq, double *dk,
                              double *dv, double *dsinks)
{
  const void *in[4] = {q, k, v, dout};
  void *out[3] = {dq, dk, dv};
  return bwd_entry("fj__reference_bwd64", p, in, out, dsinks, NULL, 1);
}

fj_status fj__reference_bwd_part64(const fj_problem *p, const double *q,
                                   const double *k, const double *v,
                                   const double *dout, const double *o,
                                   const double *lse, double *dq, double *dk,
                                   double *dv)
{
  const void *in[4] = {q, k, v, dout};
  void *out[3] = {dq, dk, dv};
  if (!o || !lse) {
    fj__clear_error(NULL);
    return fj__null_arg(NULL, "fj__reference_bwd_part64", !o ? "o" : "lse");
  }
  ref_merged mg = {o, lse};
  return bwd_entry("fj__reference_bwd_part64", p, in, out, NULL, &mg, 1);
}
