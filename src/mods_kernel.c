/*
 * mods_kernel.c -- a problem's expressions as a kernel takes them: parsed
 * once, their facts read off the trees (expr.c), printed as CUDA with the
 * family's names substituted, and handed to templates/mods.lua as one
 * table, mod_facts.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expr_grad.h"
#include "mods_kernel.h"

/* The name indices of fj__mods_names. */
static fj_expr_vars vars_of(int score)
{
  fj_expr_vars v = {0, 1, 2, 3, 4, score ? 5 : -1};
  return v;
}

/* Copies len bytes of s into k's arena as a string; NULL when it is full
 * (the bound FJ_MODS_CUDA_MAX says it cannot be). */
static const char *keep(fj_mods_kform *k, const char *s, size_t len)
{
  if (k->used + len + 1 > sizeof k->arena)
    return NULL;
  char *at = k->arena + k->used;
  memcpy(at, s, len);
  at[len] = '\0';
  k->used += len + 1;
  return at;
}

/* The user's text on one line: each run of whitespace one space, so that
 * it fits in a // comment of the generated code. */
static const char *one_line(fj_mods_kform *k, const char *text)
{
  char line[FJ_MOD_EXPR_MAX + 1];
  size_t n = 0;
  for (const char *c = text; *c && n < FJ_MOD_EXPR_MAX; c++) {
    int space = *c == ' ' || *c == '\t' || *c == '\n' || *c == '\r';
    if (!space)
      line[n++] = *c;
    else if (n && line[n - 1] != ' ')
      line[n++] = ' ';
  }
  return keep(k, line, n);
}

/* Subtree at of e printed as CUDA into k's arena (NULL: out of room). */
static const char *print(fj_mods_kform *k, const fj_expr *e, int at,
                         const fj_expr_print *o)
{
  fj_buf b = {0};
  const char *s = NULL;
  if (fj__expr_print_cuda(e, at, o, &b) == 0 && b.data)
    s = keep(k, b.data, b.len);
  fj__buf_free(&b);
  return s;
}

/* Line and column (from 1) of offset pos in text. */
static void line_col(const char *text, int pos, int *line, int *col)
{
  int start = 0;
  *line = 1;
  for (int i = 0; i < pos; i++)
    if (text[i] == '\n') {
      (*line)++;
      start = i + 1;
    }
  *col = pos - start + 1;
}

/* dg's pieces as CUDA: the call, X (its last index with the distance as
 * 0) and the indices before the last. */
static int print_dg(fj_mods_kform *k, const fj_mods *m, const fj_expr *e,
                    const fj_expr_print *o, fj_mods_kexpr *x)
{
  const fj_expr_facts *f = &x->f;
  fj_expr_subst zero = {f->dg_dist, "0"};
  fj_expr_print ox = *o;
  ox.subs = &zero;
  ox.nsubs = 1;
  x->dg_call = print(k, e, f->dg, o);
  x->dg_x = print(k, e, f->dg_x, &ox);
  int ok = x->dg_call && x->dg_x;
  for (int i = 0; i + 1 < f->dg_rank; i++)
    ok &= (x->dg_uniform[i] = print(k, e, fj__expr_kid(e, f->dg, i), o)) != NULL;
  x->dg_param = f->dg_name - fj__mods_first_param(1);
  line_col(m->score, f->dg_pos, &x->dg_line, &x->dg_col);
  return ok ? 0 : -1;
}

/* The score's derivative as CUDA with o's substitutions into k's arena,
 * as *t; NULL where it is longer than FJ_MODS_GRAD_MAX or the arena is
 * full (the forward needs none: only a backward refuses the expression
 * then).  -1 when memory ran out deriving it: no refusal, which would
 * send a backward's plan on to another kernel. */
static int print_grad(fj_mods_kform *k, const fj_expr *e,
                      const fj_expr_print *o, int s, const char **t)
{
  fj_buf b = {0};
  int rc = fj__expr_grad_cuda(e, s, o, &b);
  *t = NULL;
  if (rc == 0 && b.data && b.len <= FJ_MODS_GRAD_MAX)
    *t = keep(k, b.data, b.len);
  fj__buf_free(&b);
  return rc;
}

/* The reads of the parameters with gradients: their derivatives and
 * indices as CUDA, printed plain of substitutions (fj_param_grads takes
 * none of the family's names).  0; -1 out of room, or too many reads
 * (x->npg -1: the backward refuses). */
static int print_pgrads(fj_mods_kform *k, const fj_mods *m, const fj_expr *e,
                        const fj_expr_name *names, fj_mods_kexpr *x)
{
  fj_expr_print o = {names, NULL, NULL, 0, 0};
  x->npg = 0;
  for (int i = 0; i < m->num_params; i++) {
    if (!fj__mods_has_grad(m, i))
      continue;
    int nodes[FJ_MODS_PGRADS_MAX];
    int n = fj__expr_reads_of(e, fj__mods_first_param(1) + i, nodes,
                              FJ_MODS_PGRADS_MAX);
    if (x->npg + n > FJ_MODS_PGRADS_MAX)
      return x->npg = -1;
    for (int r = 0; r < n; r++) {
      fj_mods_pgrad *pg = &x->pg[x->npg++];
      fj_buf b = {0};
      const fj_expr_vars v = vars_of(1);
      const int varying[3] = {v.q, v.kv, v.s};
      pg->param = i;
      pg->rank = m->params[i].rank;
      pg->uniform = 1;
      for (int d = 0; d < pg->rank; d++)
        pg->uniform &= !fj__expr_node_uses(e, fj__expr_kid(e, nodes[r], d), varying, 3);
      if (fj__expr_grad_read_cuda(e, nodes[r], &o, &b) == 0 && b.data &&
          b.len <= FJ_MODS_GRAD_MAX)
        pg->d = keep(k, b.data, b.len);
      fj__buf_free(&b);
      int ok = pg->d != NULL;
      for (int d = 0; ok && d < pg->rank; d++)
        ok = (pg->idx[d] = print(k, e, fj__expr_kid(e, nodes[r], d), &o)) != NULL;
      if (!ok)
        return x->npg = -1;
    }
  }
  return 0;
}

/* The whole expression as the kernel pastes it, with the subtrees the
 * family passes as its names. */
static int print_kernel(fj_mods_kform *k, const fj_expr *e,
                        const fj_expr_name *names, int score,
                        fj_mods_kexpr *x)
{
  fj_expr_vars v = vars_of(score);
  fj_expr_subst subs[2];
  int n = 0;
  if (x->f.dg >= 0)
    subs[n++] = (fj_expr_subst){x->f.dg, "fj_dg"};
  if (x->f.rt >= 0)
    subs[n++] = (fj_expr_subst){x->f.rt, "fj_dg"};
  if (x->f.kvq_scale >= 0)
    subs[n++] = (fj_expr_subst){x->f.kvq_scale, "fj_skvq"};
  fj_expr_print o = {names, score ? &v : NULL, subs, n, 0};
  x->cuda = print(k, e, -1, &o);
  int nomem = score && print_grad(k, e, &o, v.s, &x->grad) != 0;
  o.nsubs = 0;
  if (x->f.kvq_scale >= 0)
    x->factor = print(k, e, x->f.kvq_factor, &o);
  if (!x->cuda || nomem || (x->f.kvq_scale >= 0 && !x->factor))
    return -1;
  return 0;
}

/* The relative table (fj_expr_facts' rt) in dg's place: its subtree as
 * CUDA for the kernel that fills the table (rt_cuda: of h, q, kv and the
 * parameters, which templates/rel_table.cu evaluates at q 0, kv the
 * distance), and dg's pieces for a read of the table, the parameter
 * FJ_MODS_RT_NAME after the user's: [heads_q][seq_q + seq_kv - 1], the
 * distance kv - q at column kv - q + seq_q - 1. */
static int print_rt(fj_mods_kform *k, const fj_mods *m, const fj_expr *e,
                    const fj_expr_name *names, fj_mods_kexpr *x)
{
  char off[64], call[128];
  int no = snprintf(off, sizeof off, "((fj_p.seq_q + %d) / %d * %d - 1)",
                    FJ_MODS_RT_PAD - 1, FJ_MODS_RT_PAD, FJ_MODS_RT_PAD);
  int nc = snprintf(call, sizeof call, FJ_MODS_RT_NAME "(h, fj::isub(%s, fj::isub(q, kv)))", off);
  x->rt_cuda = print(k, e, x->f.rt, &(fj_expr_print){names, NULL, NULL, 0, 0});
  x->dg_call = keep(k, call, (size_t)nc);
  x->dg_x = keep(k, off, (size_t)no);
  x->dg_uniform[0] = keep(k, "h", 1);
  x->dg_param = m->num_params;
  x->f.dg_rank = 2;
  x->f.dg_sign = -1;
  line_col(m->score, x->f.rt_pos, &x->dg_line, &x->dg_col);
  return x->rt_cuda && x->dg_call && x->dg_x && x->dg_uniform[0] ? 0 : -1;
}

/* One expression: parsed, its facts, its texts; the score's per-score
 * reads into k->per_score.  checked: m's form is checked (fj_mods_info). */
static int kexpr(const fj_mods *m, int score, int checked, fj_mods_kform *k,
                 char *err, size_t errsize)
{
  const char *text = score ? m->score : m->mask;
  fj_mods_kexpr *x = score ? &k->score : &k->mask;
  fj_expr_name names[FJ_MOD_NAMES_MAX];
  int n = fj__mods_names(m, score, names);
  fj_expr *e = fj__expr_parse(text, score ? "score" : "mask", names, n, err,
                              errsize);
  if (!e)
    return -1;
  fj_expr_vars v = vars_of(score);
  int rc = fj__expr_facts(e, &v, &x->f);
  /* The relative table takes a parameter's place after the user's, and
   * none in checked mode (fj__mods_rt_on). */
  if (rc == 0 && x->f.rt >= 0 && !fj__mods_rt_on(m))
    rc = fj__expr_facts_no_rt(e, &v, &x->f);
  /* Checked mode's reads record what they miss: each read stays a read
   * of the accessor, where the record is made. */
  if (!score || checked)
    x->f.kvq_scale = x->f.kvq_factor = x->f.dg = -1;
  x->on = 1;
  x->text1 = one_line(k, text);
  if (rc == 0)
    rc = print_kernel(k, e, names, score, x);
  if (rc == 0 && x->f.dg >= 0)
    rc = print_dg(k, m, e, &(fj_expr_print){names, &v, NULL, 0, 0}, x);
  else if (rc == 0 && x->f.rt >= 0)
    rc = print_rt(k, m, e, names, x);
  /* Reads past the limit or out of room leave npg -1, which only the
   * backward refuses. */
  if (rc == 0 && score)
    print_pgrads(k, m, e, names, x);
  for (int i = 0; score && i < m->num_params && i < FJ_MOD_PARAMS_MAX; i++)
    k->per_score[i] = fj__expr_per_score(e, fj__mods_first_param(1) + i, &v);
  fj__expr_free(e);
  if (rc || !x->text1)
    snprintf(err, errsize, "%s: out of memory printing the expression",
             score ? "score" : "mask");
  return rc || !x->text1 ? -1 : 0;
}

static int has_text(const char *s)
{
  return s && s[0];
}

int fj__mods_kform(const fj_mods *m, fj_mods_kform *k, char *err,
                   size_t errsize)
{
  memset(k, 0, offsetof(fj_mods_kform, arena));
  k->used = 0;
  k->score.f.dg = k->score.f.kvq_scale = k->score.f.rt = -1;
  k->mask.f.dg = k->mask.f.kvq_scale = k->mask.f.rt = -1;
  fj_mods_info mi;
  fj__mods_info(m, &mi);
  if (m && has_text(m->score) && kexpr(m, 1, mi.checked, k, err, errsize))
    return -1;
  if (m && has_text(m->mask) && kexpr(m, 0, mi.checked, k, err, errsize))
    return -1;
  return 0;
}

/* ---- the template parameter ------------------------------------------------ */

/* n contiguous parameters of out's (a table's fields); NULL when full. */
static fj_param *take(fj_mods_kparam *out, size_t n)
{
  if (out->n + n > FJ_MODS_KPARAMS)
    return NULL;
  fj_param *p = &out->kids[out->n];
  memset(p, 0, n * sizeof *p);
  out->n += n;
  return p;
}

static fj_param str(const char *key, const char *s)
{
  return (fj_param){key, FJ_PARAM_STR, 0, s, NULL};
}

static fj_param num(const char *key, fj_param_type type, long long i)
{
  return (fj_param){key, type, i, NULL, NULL};
}

#define table fj_param_table

/* dg = { param, sign, x, uniform = {...}, call, line, col } */
static int dg_table(fj_mods_kparam *out, const fj_mods_kexpr *x, fj_param *at)
{
  int nu = x->f.dg_rank - 1;
  fj_param *u = take(out, (size_t)(nu > 0 ? nu : 0));
  fj_param *d = take(out, 7);
  if (!u || !d)
    return -1;
  for (int i = 0; i < nu; i++)
    u[i] = str(NULL, x->dg_uniform[i]);
  d[0] = num("param", FJ_PARAM_INT, x->dg_param);
  d[1] = num("sign", FJ_PARAM_INT, x->f.dg_sign);
  d[2] = str("x", x->dg_x);
  d[3] = table("uniform", u, (size_t)(nu > 0 ? nu : 0));
  d[4] = str("call", x->dg_call);
  d[5] = num("line", FJ_PARAM_INT, x->dg_line);
  d[6] = num("col", FJ_PARAM_INT, x->dg_col);
  *at = table("dg", d, 7);
  return 0;
}

/* pgrads = { { param, rank, uniform, d, idx = {...} }, ... } (npg -1: pgrads =
 * false, which the backward refuses). */
static int pgrads_table(fj_mods_kparam *out, const fj_mods_kexpr *x,
                        fj_param *at)
{
  if (x->npg < 0) {
    *at = num("pgrads", FJ_PARAM_BOOL, 0);
    return 0;
  }
  fj_param *list = take(out, (size_t)x->npg);
  if (!list)
    return -1;
  for (int r = 0; r < x->npg; r++) {
    const fj_mods_pgrad *pg = &x->pg[r];
    fj_param *idx = take(out, (size_t)pg->rank), *f = take(out, 5);
    if (!idx || !f)
      return -1;
    for (int d = 0; d < pg->rank; d++)
      idx[d] = str(NULL, pg->idx[d]);
    f[0] = num("param", FJ_PARAM_INT, pg->param);
    f[1] = num("rank", FJ_PARAM_INT, pg->rank);
    f[2] = str("d", pg->d);
    f[3] = table("idx", idx, (size_t)pg->rank);
    f[4] = num("uniform", FJ_PARAM_BOOL, pg->uniform);
    list[r] = table(NULL, f, 5);
  }
  *at = table("pgrads", list, (size_t)x->npg);
  return 0;
}

/* score = { text1, cuda, kvq, kvq_scale, dg, uses_s, rel_only, grad,
 * pgrads } (dg, kvq_scale and grad nil where not taken; pgrads only where
 * a parameter has a gradient); mask = { text1, cuda }. */
static int expr_table(fj_mods_kparam *out, const fj_mods_kexpr *x,
                      const char *key, fj_param *at)
{
  fj_param *t = take(out, 10);
  if (!t)
    return -1;
  t[0] = str("text1", x->text1);
  t[1] = str("cuda", x->cuda);
  t[2] = num("kvq", FJ_PARAM_BOOL, x->f.kvq > 0);
  t[3] = str("kvq_scale", x->factor);
  t[4] = str("dg", NULL);
  t[5] = num("uses_s", FJ_PARAM_BOOL, x->f.uses_s);
  t[6] = num("rel_only", FJ_PARAM_BOOL, x->f.rel_only);
  t[7] = str("grad", x->grad);
  t[8] = str("pgrads", NULL);
  t[9] = str("rt", x->rt_cuda);
  *at = table(key, t, 10);
  if (x->npg != 0 && pgrads_table(out, x, &t[8]))
    return -1;
  return x->f.dg >= 0 || x->f.rt >= 0 ? dg_table(out, x, &t[4]) : 0;
}

/* params = { { name, type, rank, index, shared }, ... }: the user's, then
 * the relative table where the score takes one (a float32 tensor of rank
 * 2, read per score). */
static int params_table(fj_mods_kparam *out, const fj_mods *m, fj_param *at)
{
  int n = m ? m->num_params : 0;
  int rt = out->form.score.on && out->form.score.f.rt >= 0;
  fj_param *list = take(out, (size_t)(n + rt));
  if (!list)
    return -1;
  for (int i = 0; i < n + rt; i++) {
    const fj_mod_param *p = i < n ? &m->params[i] : NULL;
    fj_param *f = take(out, 5);
    if (!f)
      return -1;
    f[0] = str("name", p ? p->name : FJ_MODS_RT_NAME);
    f[1] = str("type", p ? fj__mods_type_name(p->type) : "f32");
    f[2] = num("rank", FJ_PARAM_INT, p ? p->rank : 2);
    f[3] = num("index", FJ_PARAM_INT, i);
    f[4] = num("shared", FJ_PARAM_BOOL, p && !out->form.per_score[i]);
    list[i] = table(NULL, f, 5);
  }
  *at = table("params", list, (size_t)(n + rt));
  return 0;
}

int fj__mods_kparam(const fj_mods *m, fj_mods_kparam *out, char *err,
                    size_t errsize)
{
  out->n = 0;
  if (fj__mods_kform(m, &out->form, err, errsize))
    return -1;
  fj_param *root = take(out, 3);
  if (!root)
    return -1;
  int rc = 0;
  root[0] = str("score", NULL);
  root[1] = str("mask", NULL);
  if (out->form.score.on)
    rc |= expr_table(out, &out->form.score, "score", &root[0]);
  if (out->form.mask.on)
    rc |= expr_table(out, &out->form.mask, "mask", &root[1]);
  rc |= params_table(out, m, &root[2]);
  out->param = table("mod_facts", root, 3);
  if (rc)
    snprintf(err, errsize, "mod_facts: over %d template parameters",
             FJ_MODS_KPARAMS);
  return rc ? -1 : 0;
}

/* ---- the distance table's reads, proved within its extents ------------------- */

/* A tensor read among the indices: its value is on the device, unknown
 * here, so the proof fails. */
static fj_expr_value unknown_read(void *user, int name, const int32_t *idx)
{
  (void)name;
  (void)idx;
  *(int *)user = 1;
  fj_expr_value v = {1, 0, 0.f};
  return v;
}

/* fj__mods_table_inside's proof for p's sizes and m's values, from the
 * score's tree e and its facts f (dg >= 0). */
static int prove_inside(const fj_problem *p, const fj_mods *m, long long q_end,
                        long long kv_end, const fj_expr *e, const fj_expr_facts *fp)
{
  const fj_expr_facts f = *fp;
  fj_expr_vars vars = vars_of(1);
  int first = fj__mods_first_param(1);
  const fj_mod_param *t = &m->params[f.dg_name - first];
  int ok = t->rank == f.dg_rank && t->rank >= 1;
  /* The scalar parameters' values; variables set per (b, h) below, q and
   * kv 0: X is the last index with the distance 0. */
  fj_expr_value vals[FJ_MOD_NAMES_MAX];
  memset(vals, 0, sizeof vals);
  for (int i = 0; ok && i < m->num_params && first + i < FJ_MOD_NAMES_MAX; i++) {
    const fj_mod_param *a = &m->params[i];
    vals[first + i].is_int = a->type == FJ_MOD_I32;
    if (a->rank == 0 && a->type == FJ_MOD_I32)
      vals[first + i].i = (int32_t)a->value;
    else if (a->rank == 0)
      vals[first + i].f = (float)a->value;
  }
  for (int v = 0; v < 5; v++)
    vals[v].is_int = 1;
  vals[5].is_int = 0;
  int unknown = 0;
  fj_expr_env env = {vals, unknown_read, &unknown};
  /* The distance q - kv over the positions the tiles reach. */
  long long dmin = -(kv_end - 1), dmax = q_end - 1;
  long long lo = f.dg_sign > 0 ? dmin : -dmax, hi = f.dg_sign > 0 ? dmax : -dmin;
  /* Only the indices that name b (or h, hkv) need every batch index (or
   * head). */
  int idx[FJ_EXPR_RANK_MAX];
  int nidx = 0;
  for (int i = 0; ok && i + 1 < t->rank; i++)
    idx[nidx++] = fj__expr_kid(e, f.dg, i);
  if (ok)
    idx[nidx++] = f.dg_x;
  int use_b = 0, use_h = 0;
  for (int i = 0; ok && i < nidx; i++) {
    use_b |= fj__expr_subtree_uses(e, idx[i], vars.b);
    use_h |= fj__expr_subtree_uses(e, idx[i], vars.h) || fj__expr_subtree_uses(e, idx[i], vars.hkv);
  }
  int group = p->heads_q / p->heads_kv;
  int nb = use_b ? p->batch : 1, nh = use_h ? p->heads_q : 1;
  for (int b = 0; ok && b < nb; b++)
    for (int h = 0; ok && h < nh; h++) {
      vals[vars.b].i = b;
      vals[vars.h].i = h;
      vals[vars.hkv].i = group > 0 ? h / group : 0;
      for (int i = 0; ok && i < nidx; i++) {
        fj_expr_value x = fj__expr_eval_at(e, idx[i], &env);
        long long e_i = t->extents[i];
        if (!x.is_int || unknown)
          ok = 0;
        else if (i + 1 < nidx)
          ok = x.i >= 0 && x.i < e_i;
        else
          ok = (long long)x.i + lo >= 0 && (long long)x.i + hi < e_i;
      }
    }
  return ok;
}

/* What this thread remembers for fj__mods_table_inside, freed when it
 * exits: the score expressions it parsed (a tree a form: the text and the
 * parameters' names, types and ranks), and its proofs by what they read
 * -- each parameter's extents and value besides (not where its data lies:
 * a call may pass a new tensor of the same shape) and the problem's
 * sizes -- so that a launch checking a variant's table_inside, or a plan
 * of new lengths, parses nothing. */
enum { INSIDE_FORMS = 4, INSIDE_PROOFS = 8 };
typedef struct inside_param {
  char name[FJ_MOD_NAME_MAX + 1];
  fj_mod_type type;
  int rank;
  int64_t extents[4];
  double value;
} inside_param;
typedef struct inside_form {
  fj_expr *e;  /* NULL: unused */
  fj_expr_facts f;
  int num_params;
  char score[FJ_MOD_EXPR_MAX + 1];
  inside_param params[FJ_MOD_PARAMS_MAX];  /* names, types, ranks only */
} inside_form;
typedef struct inside_proof {
  int used, result, num_params;
  long long dims[5];
  char score[FJ_MOD_EXPR_MAX + 1];
  inside_param params[FJ_MOD_PARAMS_MAX];
} inside_proof;
typedef struct inside_cache {
  inside_form forms[INSIDE_FORMS];
  inside_proof proofs[INSIDE_PROOFS];
  int next_form, next_proof;
} inside_cache;

static pthread_key_t inside_key;
static pthread_once_t inside_once = PTHREAD_ONCE_INIT;
static int inside_key_ok;

static void inside_free(void *ptr)
{
  inside_cache *c = ptr;
  for (int i = 0; c && i < INSIDE_FORMS; i++)
    fj__expr_free(c->forms[i].e);
  free(c);
}

static void inside_make_key(void)
{
  inside_key_ok = pthread_key_create(&inside_key, inside_free) == 0;
}

/* This thread's cache, made on first use; NULL out of memory. */
static inside_cache *inside_cache_get(void)
{
  pthread_once(&inside_once, inside_make_key);
  if (!inside_key_ok)
    return NULL;
  inside_cache *c = pthread_getspecific(inside_key);
  if (!c && (c = calloc(1, sizeof *c)) && pthread_setspecific(inside_key, c)) {
    free(c);
    c = NULL;
  }
  return c;
}

/* m's parameter i as the cache keeps it (a NULL name as ""); values only
 * with `values`. */
static void inside_param_of(const fj_mods *m, int i, int values, inside_param *out)
{
  const fj_mod_param *a = &m->params[i];
  memset(out, 0, sizeof *out);
  snprintf(out->name, sizeof out->name, "%s", a->name ? a->name : "");
  out->type = a->type;
  out->rank = a->rank;
  if (values) {
    memcpy(out->extents, a->extents, sizeof out->extents);
    out->value = a->rank == 0 ? a->value : 0;
  }
}

/* Whether score, params (n of them) were kept from m. */
static int inside_same(const char *score, const inside_param *params, int n,
                       const fj_mods *m, int values)
{
  if (n != m->num_params || strcmp(score, m->score))
    return 0;
  for (int i = 0; i < n; i++) {
    inside_param a;
    inside_param_of(m, i, values, &a);
    if (memcmp(&a, &params[i], sizeof a))
      return 0;
  }
  return 1;
}

/* m's score tree and facts, parsed once per form; NULL where the parse
 * fails or memory runs out. *owned: the caller frees the tree (no cache). */
static const fj_expr *inside_tree(inside_cache *c, const fj_mods *m, fj_expr_facts *f,
                                  int *owned)
{
  *owned = 0;
  for (int i = 0; c && i < INSIDE_FORMS; i++) {
    inside_form *g = &c->forms[i];
    if (g->e && inside_same(g->score, g->params, g->num_params, m, 0)) {
      *f = g->f;
      return g->e;
    }
  }
  fj_expr_name names[FJ_MOD_NAMES_MAX];
  int n = fj__mods_names(m, 1, names);
  fj_expr *e = fj__expr_parse(m->score, "score", names, n, NULL, 0);
  fj_expr_vars vars = vars_of(1);
  /* The facts the kernel takes: dg inside a relative table's subtree is
   * the kernel's own read where the table is off (fj__mods_rt_on). */
  if (!e || (fj__mods_rt_on(m) ? fj__expr_facts : fj__expr_facts_no_rt)(e, &vars, f)) {
    fj__expr_free(e);
    return NULL;
  }
  if (!c) {
    *owned = 1;
    return e;
  }
  inside_form *g = &c->forms[c->next_form];
  c->next_form = (c->next_form + 1) % INSIDE_FORMS;
  fj__expr_free(g->e);
  g->e = e;
  g->f = *f;
  g->num_params = m->num_params;
  snprintf(g->score, sizeof g->score, "%s", m->score);
  for (int i = 0; i < m->num_params; i++)
    inside_param_of(m, i, 0, &g->params[i]);
  return e;
}

long long fj__mods_rt_pad(long long n)
{
  return (n + FJ_MODS_RT_PAD - 1) / FJ_MODS_RT_PAD * FJ_MODS_RT_PAD;
}

int fj__mods_table_inside(const fj_problem *p, long long q_end, long long kv_end)
{
  const fj_mods *m = p ? p->mods : NULL;
  fj_mods_info mi;
  fj__mods_info(m, &mi);
  if (!m || !mi.user || mi.checked || !has_text(m->score) || p->heads_kv < 1 ||
      m->num_params < 0 || m->num_params > FJ_MOD_PARAMS_MAX ||
      (m->num_params && !m->params) || strlen(m->score) > FJ_MOD_EXPR_MAX)
    return 0;
  /* A relative table holds every distance of tiles up to its padding
   * (FJ_MODS_RT_NAME): its reads lie within at every head. */
  if (fj__mods_rt_on(m))
    return q_end <= fj__mods_rt_pad(p->seq_q) &&
           kv_end <= fj__mods_rt_pad(p->seq_kv) + FJ_MODS_RT_PAD;
  inside_cache *c = inside_cache_get();
  long long dims[5] = {p->batch, p->heads_q, p->heads_kv, q_end, kv_end};
  for (int i = 0; c && i < INSIDE_PROOFS; i++) {
    const inside_proof *r = &c->proofs[i];
    if (r->used && !memcmp(r->dims, dims, sizeof dims) &&
        inside_same(r->score, r->params, r->num_params, m, 1))
      return r->result;
  }
  fj_expr_facts f;
  int owned;
  const fj_expr *e = inside_tree(c, m, &f, &owned);
  int result = e && f.dg >= 0 && prove_inside(p, m, q_end, kv_end, e, &f);
  if (owned)
    fj__expr_free((fj_expr *)e);
  if (c) {
    inside_proof *r = &c->proofs[c->next_proof];
    c->next_proof = (c->next_proof + 1) % INSIDE_PROOFS;
    r->used = 1;
    r->result = result;
    r->num_params = m->num_params;
    memcpy(r->dims, dims, sizeof dims);
    snprintf(r->score, sizeof r->score, "%s", m->score);
    for (int i = 0; i < m->num_params; i++)
      inside_param_of(m, i, 1, &r->params[i]);
  }
  return result;
}

fj_status fj__mods_table_inside_fail(const fj_ctx *ctx, const char *what,
                                     const char *setter)
{
  return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "%s's table_inside 1 does not hold for the problem: a read "
                  "of its score expression's distance table may fall "
                  "outside the table's extents, or the host cannot show it "
                  "does not (an index reads a tensor); %s sets it from the "
                  "problem",
                  what, setter);
}
