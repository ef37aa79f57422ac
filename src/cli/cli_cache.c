/*
 * cli_cache.c -- `flashjit cache`: prints the disk cache's directory, lists
 * or counts its entries, or clears it; prewarms it with the library's picks
 * (or the tuning database's variants, or the backward's kernels) for an
 * arch; exports it to one file and imports such a file.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

typedef struct cache_tally {
  int entries, invalid, kernels, luts;
  uint64_t bytes;
} cache_tally;

static int list_entry(void *user, const fj_cache_entry *e)
{
  (void)user;
  char when[32];
  time_t t = (time_t)e->mtime;
  strftime(when, sizeof when, "%Y-%m-%d %H:%M", localtime(&t));
  printf("%-40s %-6s %9llu %s %s%s%s\n", e->file, e->kind,
         (unsigned long long)e->bytes, when, e->valid ? "" : "(invalid: ",
         e->label, e->valid ? "" : ")");
  return 0;
}

static int tally_entry(void *user, const fj_cache_entry *e)
{
  cache_tally *t = user;
  t->entries++;
  t->bytes += e->bytes;
  t->invalid += !e->valid;
  t->kernels += e->valid && strcmp(e->kind, "kernel") == 0;
  t->luts += e->valid && strcmp(e->kind, "lut") == 0;
  return 0;
}

/* ---- prewarm ------------------------------------------------------------------ */

enum { LIST_MAX = 16 };

/* A comma-separated list of --name's values: each looked up in table (or,
 * table NULL, a count in 1..256); 0 and *n items, or the exit status. */
/* What a list takes, for its refusal: the table's names, or head dims. */
static const char *list_names(const name_value *table, size_t ntable, char *buf,
                              size_t size)
{
  if (!table)
    return "head dims in 1..256";
  size_t at = 0;
  buf[0] = 0;
  for (size_t i = 0; i < ntable && at < size; i++)
    at += (size_t)snprintf(buf + at, size - at, "%s%s", i ? ", " : "", table[i].name);
  return buf;
}

static int parse_list(const cli *c, const char *name, const char *text,
                      const name_value *table, size_t ntable, int *out,
                      int *n)
{
  char q[300];
  *n = 0;
  for (const char *p = text;; p++) {
    size_t len = strcspn(p, ",");
    char item[32];
    snprintf(item, sizeof item, "%.*s", (int)(len < 31 ? len : 31), p);
    if (len >= 31)
      snprintf(item + 24, sizeof item - 24, "...");
    int v = -1;
    if (len < 31 && table && cli_parse_name(table, ntable, item, &v) != 0)
      v = -1;
    else if (len < 31 && !table)
      v = cli_parse_count(p, len);
    char qi[300], names[128];
    if (v < 0 || (!table && (v < 1 || v > 256)))
      return cli_usage_error(
          c, "invalid value '%s' for --%s%s%s%s: expected a comma-separated "
             "list of %s", cli_quote(item, qi, sizeof qi), name,
          strchr(text, ',') ? " (in '" : "",
          strchr(text, ',') ? cli_quote(text, q, sizeof q) : "",
          strchr(text, ',') ? "')" : "", list_names(table, ntable, names, sizeof names));
    if (*n == LIST_MAX)
      return cli_usage_error(c, "--%s has more than %d values", name,
                             LIST_MAX);
    out[(*n)++] = v;
    if (!p[len])
      return 0;
    p += len;
  }
}

/* The lists of prewarm: its head dims, dtypes and masks. */
typedef struct warm_lists {
  int heads[LIST_MAX], dtypes[LIST_MAX], causals[LIST_MAX];
  int nheads, ndtypes, ncausals;
} warm_lists;

static int parse_lists(const cli *c, warm_lists *w)
{
  static const name_value dts[] = {
      {"f16", FJ_F16}, {"bf16", FJ_BF16}, {"e4m3", FJ_E4M3}};
  static const name_value cs[] = {{"none", FJ_CAUSAL_NONE},
                                  {"top-left", FJ_CAUSAL_TOP_LEFT},
                                  {"bottom-right", FJ_CAUSAL_BOTTOM_RIGHT}};
  int rc = parse_list(c, "head-dim",
                      c->heads_list ? c->heads_list
                                    : c->package ? "64,128,256" : "64,128",
                      NULL, 0, w->heads, &w->nheads);
  if (!rc)
    rc = parse_list(c, "dtype", c->dtypes_list ? c->dtypes_list : "f16,bf16",
                    dts, 3, w->dtypes, &w->ndtypes);
  if (!rc)
    rc = parse_list(c, "causal",
                    c->causals_list ? c->causals_list
                    : c->package    ? "none,top-left,bottom-right"
                                    : "none,top-left",
                    cs, 3, w->causals, &w->ncausals);
  return rc;
}

static int in_list(const int *xs, int n, int x)
{
  for (int i = 0; i < n; i++)
    if (xs[i] == x)
      return 1;
  return 0;
}

/* The problem shapes whose picks prewarm compiles: they lead the library
 * to different kernels (on sm_90a: the wgmma family, the mma family, and
 * the mma family packed for GQA with split-KV and its combine kernel). */
static const struct {
  const char *what;
  int batch, heads_q, heads_kv, seq_q, seq_kv;
} warm_shapes[] = {
    {"long prefill", 2, 16, 16, 4096, 4096},
    {"short prefill (few blocks)", 1, 8, 8, 512, 512},
    {"decode with GQA", 4, 32, 8, 1, 4096},
    /* A package (--package) adds the shapes of the README's and the
     * examples' calls, so that their first call compiles nothing: the
     * Python quick start (and its GQA call), examples/gpt_flashjit.py's
     * defaults, examples/gpt_train.py's (batch 8: on sm_90a the wgmma
     * family, where batch 2 takes the mma family), examples/demo.c's. */
    {"README quick start", 2, 8, 8, 4096, 4096},
    {"README quick start, GQA", 2, 8, 2, 4096, 4096},
    {"gpt_flashjit.py", 2, 8, 2, 512, 512},
    {"gpt_train.py", 8, 8, 2, 512, 512},
    {"demo.c, GQA", 4, 32, 8, 4096, 4096},
    {"demo.c, prefill", 4, 16, 16, 4096, 4096},
};
enum { NSHAPES = sizeof warm_shapes / sizeof warm_shapes[0], NPLAIN = 3 };

/* A prewarm problem: shape s at head dim d, dtype dt (e4m3: FP8
 * attention), K and V in kv (0: dt's; e4m3 under a 16-bit dt: an FP8 KV
 * cache), mask m; FP8 descales point at a placeholder (planning checks
 * only that they are there). */
static void warm_problem(fj_problem *p, int s, int d, fj_dtype dt, fj_dtype kv,
                         fj_causal m)
{
  static const float placeholder[1];
  fj_problem_init(p, warm_shapes[s].batch, warm_shapes[s].heads_q,
                  warm_shapes[s].heads_kv, warm_shapes[s].seq_q,
                  warm_shapes[s].seq_kv, d, dt, FJ_BHSD);
  p->causal = m;
  p->kv_dtype = dt == FJ_E4M3 ? 0 : kv;
  if (dt == FJ_E4M3 || p->kv_dtype == FJ_E4M3)
    p->k_scale = p->v_scale = placeholder;
  if (dt == FJ_E4M3)
    p->q_scale = placeholder;
}

/* The library's picks for every combination; 0, or the exit status.
 * FP8 attention (dtype e4m3) where the arch has no FP8 family (a package's
 * sm_80) is skipped and counted in *skipped. */
static int picks(const cli *c, fj_ctx *ctx, const warm_lists *w,
                 fj_variant *vs, size_t *n, int *skipped)
{
  *n = 0;
  for (int h = 0; h < w->nheads; h++)
    for (int d = 0; d < w->ndtypes; d++)
      for (int m = 0; m < w->ncausals; m++)
        for (int s = 0; s < (c->package ? NSHAPES : NPLAIN); s++) {
          fj_problem p;
          warm_problem(&p, s, w->heads[h], (fj_dtype)w->dtypes[d], c->v.kv_dtype,
                       (fj_causal)w->causals[m]);
          fj_plan plan;
          fj_status st = fj_attention_plan(ctx, &p, &plan);
          if (st == FJ_ERR_UNSUPPORTED && p.dtype == FJ_E4M3 && c->package) {
            (*skipped)++;
            continue;
          }
          if (st != FJ_OK)
            return cli_fj_error(c, ctx, st);
          vs[(*n)++] = plan.variant;
        }
  return 0;
}

typedef struct tune_pick {
  const char *arch;
  const warm_lists *w;
  int filter_heads, filter_dtypes, filter_causals;
  fj_variant *vs;
  size_t n, cap;
  int mods, other;  /* entries skipped: with modifications, of other classes */
} tune_pick;

/* What a forward's key holds after its class's last plain field (gqa=N):
 * nothing (0: the class is the variant's head dim, dtypes and mask, which
 * fj_tune_list restores), |mods=<hash> (1: modifications, whose
 * expressions the database does not hold), or anything else (2: a
 * head_dim_v, or a key of a form this build does not read). */
static int key_extra(const char *key)
{
  const char *g = strstr(key, "|gqa=");
  if (!g)
    return 2;
  g += 5;
  while (*g >= '0' && *g <= '9')
    g++;
  return !*g ? 0 : !strncmp(g, "|mods=", 6) ? 1 : 2;
}

/* One tuning entry, taken when its key's arch (device|arch|...) is ours,
 * it is the forward's (a backward's key ends in |bwd: its variant is a
 * main kernel of the backward's), its class restores into a variant
 * whole (key_extra; the others are counted: a plain dense kernel of the
 * class is one nobody asks for) and it passes the lists that were
 * given. */
static int tune_visit(void *user, const fj_tune_entry *e)
{
  tune_pick *t = user;
  const char *bar = strchr(e->key, '|');
  size_t len = strlen(t->arch), klen = strlen(e->key);
  const fj_variant *v = &e->variant;
  if (!bar || strncmp(bar + 1, t->arch, len) != 0 || bar[1 + len] != '|')
    return 0;
  if (klen >= 4 && !strcmp(e->key + klen - 4, "|bwd"))
    return 0;
  int extra = key_extra(e->key);
  t->mods += extra == 1;
  t->other += extra == 2;
  if (extra)
    return 0;
  if ((t->filter_heads && !in_list(t->w->heads, t->w->nheads, v->head_dim)) ||
      (t->filter_dtypes && !in_list(t->w->dtypes, t->w->ndtypes, (int)v->dtype)) ||
      (t->filter_causals &&
       !in_list(t->w->causals, t->w->ncausals, (int)v->causal)))
    return 0;
  if (t->n == t->cap)
    return 1;
  t->vs[t->n++] = *v;
  return 0;
}

/* Drops repeated variants (by name), keeping the first of each. */
static size_t dedupe(fj_variant *vs, size_t n)
{
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    char a[160], b[160];
    int seen = 0;
    fj_variant_name(&vs[i], a, sizeof a);
    for (size_t j = 0; j < m && !seen; j++)
      seen = fj_variant_name(&vs[j], b, sizeof b) > 0 && !strcmp(a, b);
    if (!seen)
      vs[m++] = vs[i];
  }
  return m;
}

static void warm_progress(void *user, size_t done, size_t total)
{
  (void)user;
  fprintf(stderr, "flashjit cache prewarm: %zu/%zu compiled\n", done, total);
}

/* Prints each variant's status and the summary; the exit status. */
static int warm_report(const cli *c, fj_ctx *ctx, const fj_variant *vs,
                       size_t n, const fj_status *each,
                       const fj_prewarm_report *r, fj_status st)
{
  for (size_t i = 0; i < n; i++) {
    char name[160];
    fj_variant_name(&vs[i], name, sizeof name);
    printf("%s %s\n", each[i] == FJ_OK ? "ok    " : "FAILED", name);
  }
  printf("prewarm %s: %d variants, %d kernels: %d compiled, %d already "
         "cached, %d failed\n",
         fj_ctx_arch(ctx), r->variants, r->kernels, r->compiled, r->cached,
         r->failed);
  return st == FJ_OK ? 0 : cli_fj_error(c, ctx, st);
}

/* ---- prewarm --backward ---------------------------------------------------------- */

/* The backward's problems: the long prefill's shape for every head dim,
 * dtype and mask of the lists (its kernels do not depend on the sizes). */
static size_t bwd_problems(const warm_lists *w, fj_problem *ps)
{
  size_t n = 0;
  for (int h = 0; h < w->nheads; h++)
    for (int d = 0; d < w->ndtypes; d++)
      for (int m = 0; m < w->ncausals; m++, n++) {
        fj_problem_init(&ps[n], warm_shapes[0].batch, warm_shapes[0].heads_q,
                        warm_shapes[0].heads_kv, warm_shapes[0].seq_q,
                        warm_shapes[0].seq_kv, w->heads[h],
                        (fj_dtype)w->dtypes[d], FJ_BHSD);
        ps[n].causal = (fj_causal)w->causals[m];
      }
  return n;
}

/* One line per problem: its three kernels (memory hits now), or why it
 * failed. */
static void bwd_line(fj_ctx *ctx, const fj_problem *p, fj_status st)
{
  fj_bwd_plan plan;
  const char *names[FJ_BWD_KERNELS] = {"?", "?", "?"};
  if (st == FJ_OK)
    st = fj_attention_bwd_plan(ctx, p, &plan);
  for (int i = 0; i < FJ_BWD_KERNELS && st == FJ_OK; i++) {
    fj_kernel *k;
    if ((st = fj_attention_bwd_kernel(ctx, p, &plan, i, &k)) == FJ_OK)
      names[i] = fj_kernel_name(k);
  }
  if (st == FJ_OK)
    printf("ok     %s %s %s\n", names[0], names[1], names[2]);
  else
    printf("FAILED backward d%d %s causal=%s: %s\n", p->head_dim,
           fj_dtype_name(p->dtype), fj_causal_name(p->causal),
           fj_status_str(st));
}

/* Prints each problem's line and the summary, then the call's failure as
 * cli_fj_error reports one (its message kept before the lines' calls
 * replaced it); the exit status. */
static int warm_report_bwd(const cli *c, fj_ctx *ctx, const fj_problem *ps,
                           size_t n, const fj_status *each,
                           const fj_prewarm_report *r, fj_status st)
{
  size_t len = strlen(fj_errmsg(ctx));
  char *why = malloc(len + 1);
  if (why)
    memcpy(why, fj_errmsg(ctx), len + 1);
  for (size_t i = 0; i < n; i++)
    bwd_line(ctx, &ps[i], each[i]);
  printf("prewarm %s (backward): %d variants, %d kernels: %d compiled, %d "
         "already cached, %d failed\n",
         fj_ctx_arch(ctx), r->variants, r->kernels, r->compiled, r->cached,
         r->failed);
  int rc = 0;
  const char *msg = why && *why ? why : fj_status_str(st);
  if (st == FJ_ERR_UNSUPPORTED || st == FJ_ERR_INVALID_ARG ||
      st == FJ_ERR_RESOURCES) {
    rc = cli_usage_error(c, "%s", msg);
  } else if (st != FJ_OK) {
    fprintf(stderr, "flashjit cache: %s\n", msg);
    rc = EXIT_FAIL;
  }
  free(why);
  return rc;
}

static int cache_prewarm_bwd(cli *c, fj_ctx *ctx, const warm_lists *w)
{
  size_t cap = (size_t)w->nheads * (size_t)w->ndtypes * (size_t)w->ncausals;
  fj_problem *ps = calloc(cap, sizeof *ps);
  fj_status *each = calloc(cap, sizeof *each);
  int rc = EXIT_FAIL;
  if (!ps || !each) {
    fprintf(stderr, "flashjit cache: out of memory\n");
  } else {
    size_t n = bwd_problems(w, ps);
    fj_prepare_opts po = {c->workers, warm_progress, NULL};
    fj_prewarm_report r;
    fj_status st = fj_cache_prewarm_bwd(ctx, ps, n, &po, each, &r);
    rc = warm_report_bwd(c, ctx, ps, n, each, &r, st);
  }
  free(ps);
  free(each);
  return rc;
}

static int cache_prewarm(cli *c, fj_ctx *ctx)
{
  warm_lists w;
  size_t cap = (size_t)LIST_MAX * LIST_MAX * 3 * NSHAPES + 4096, n = 0;
  int skipped_mods = 0, skipped_other = 0, skipped_fp8 = 0;
  int rc = parse_lists(c, &w);
  fj_variant *vs = rc ? NULL : calloc(cap, sizeof *vs);
  fj_status *each = rc ? NULL : calloc(cap, sizeof *each);
  if (!rc && (!vs || !each)) {
    fprintf(stderr, "flashjit cache: out of memory\n");
    rc = EXIT_FAIL;
  }
  if (!rc && c->backward) {
    rc = cache_prewarm_bwd(c, ctx, &w);
  } else if (!rc && c->from_tune_db) {
    tune_pick t = {fj_ctx_arch(ctx), &w, c->heads_list != NULL,
                   c->dtypes_list != NULL, c->causals_list != NULL, vs, 0, cap,
                   0, 0};
    fj_status st = fj_tune_list(ctx, tune_visit, &t);
    rc = st == FJ_OK ? 0 : cli_fj_error(c, ctx, st);
    n = t.n;
    skipped_mods = t.mods;
    skipped_other = t.other;
  } else if (!rc) {
    rc = picks(c, ctx, &w, vs, &n, &skipped_fp8);
  }
  if (!rc && !c->backward) {
    n = dedupe(vs, n);
    fj_prepare_opts po = {c->workers, warm_progress, NULL};
    fj_prewarm_report r;
    fj_status st = fj_cache_prewarm(ctx, vs, n, &po, each, &r);
    rc = warm_report(c, ctx, vs, n, each, &r, st);
    if (skipped_mods)
      printf("%d entries with modifications skipped: their expressions are "
             "not in the database\n", skipped_mods);
    if (skipped_other)
      printf("%d entries of classes a variant cannot hold skipped (a "
             "head_dim_v, or a key this flashjit does not read)\n",
             skipped_other);
    if (skipped_fp8)
      printf("%d FP8 attention problems skipped: dtype e4m3 runs on sm_90a, "
             "not %s\n", skipped_fp8, fj_ctx_arch(ctx));
  }
  free(vs);
  free(each);
  return rc;
}

/* prewarm --package DIR: for each arch, a context whose disk cache is the
 * package, the picks prewarmed there, then sealed (the probe kernel, the
 * manifest); the exit status. */
static int cache_package(cli *c)
{
  static const char *const both[] = {"sm_80", "sm_90a"};
  const char *one[] = {c->arch};
  const char *const *archs = c->arch ? one : both;
  size_t n = c->arch ? 1 : 2;
  int rc = 0;
  c->cache_dir = c->package;
  for (size_t i = 0; i < n && !rc; i++) {
    fj_ctx *ctx;
    if ((rc = cli_open_ctx(c, -1, archs[i], &ctx)) != 0)
      break;
    rc = cache_prewarm(c, ctx);
    fj_package_report r;
    fj_status st = rc ? FJ_OK : fj_cache_package_seal(ctx, &r);
    if (st != FJ_OK)
      rc = cli_fj_error(c, ctx, st);
    else if (!rc)
      printf("package %s: sealed for %s; %d entries, %llu bytes in all\n",
             c->package, archs[i], r.entries, (unsigned long long)r.bytes);
    fj_ctx_destroy(ctx);
  }
  return rc;
}

/* ---- export and import ---------------------------------------------------------- */

static int cache_export(cli *c, fj_ctx *ctx)
{
  fj_cache_pack_report r;
  fj_status st = fj_cache_export(ctx, c->cache_file, &r);
  if (st != FJ_OK)
    return cli_fj_error(c, ctx, st);
  printf("exported %d entries from %s to %s (%d other files left out)\n",
         r.entries, fj_cache_dir(ctx), c->cache_file, r.skipped);
  return 0;
}

static int cache_import(cli *c, fj_ctx *ctx)
{
  fj_cache_pack_report r;
  fj_status st = fj_cache_import_ex(
      ctx, c->cache_file, c->verify ? FJ_CACHE_IMPORT_VERIFY : 0, &r);
  if (st != FJ_OK)
    return cli_fj_error(c, ctx, st);
  printf("imported %s into %s: %d entries%s: %d installed, %d already there, "
         "%d kept (a different valid entry was there)\n",
         c->cache_file, fj_cache_dir(ctx), r.entries,
         c->verify ? " (every kernel recompiled and compared)" : "",
         r.installed, r.present, r.kept);
  return 0;
}

/* ---- the command ---------------------------------------------------------------- */

/* The action's arguments and options make sense together; 0 or the exit
 * status. */
static int check_action(cli *c)
{
  static const char *const actions[] = {"dir",     "ls",     "stats",  "clear",
                                        "prune",   "prewarm", "export", "import"};
  static const char *const warm_only[] = {"arch",         "head-dim",
                                          "dtype",        "causal",
                                          "from-tune-db", "workers",
                                          "backward",     "package",
                                          "kv-dtype"};
  const char *a = c->action;
  char q[300];
  int known = 0;
  for (size_t i = 0; a && i < sizeof actions / sizeof *actions; i++)
    known |= !strcmp(a, actions[i]);
  if (!known)
    return cli_usage_error(c, "expected one of dir, ls, stats, clear, prune, "
                              "prewarm, export, import%s%s%s",
                           a ? " (not '" : "", a ? cli_quote(a, q, sizeof q) : "",
                           a ? "')" : "");
  int takes_file = !strcmp(a, "export") || !strcmp(a, "import");
  if (takes_file && !c->cache_file)
    return cli_usage_error(c, "cache %s needs a FILE: flashjit cache %s FILE",
                           a, a);
  if (!takes_file && c->cache_file)
    return cli_usage_error(c, "unexpected argument '%s'",
                           cli_quote(c->cache_file, q, sizeof q));
  if (takes_file && !*c->cache_file)
    return cli_usage_error(c, "invalid FILE '' for cache %s: expected a path "
                              "of 1..4095 bytes", a);
  for (size_t i = 0; strcmp(a, "prewarm") && i < sizeof warm_only / sizeof *warm_only; i++)
    if (cli_flag_given(c, warm_only[i]))
      return cli_usage_error(c, "--%s applies only to cache prewarm",
                             warm_only[i]);
  if (c->backward && c->from_tune_db)
    return cli_usage_error(c, "--backward prewarms the backward's kernels of "
                              "the lists: it does not combine with "
                              "--from-tune-db (the forward's tuned variants)");
  if ((c->backward || c->from_tune_db) && cli_flag_given(c, "kv-dtype"))
    return cli_usage_error(c, "--kv-dtype (FP8 KV caches under 16-bit "
                              "queries) is for the forward's picks: not with "
                              "--%s",
                           c->backward ? "backward" : "from-tune-db");
  if (strcmp(a, "import") && cli_flag_given(c, "verify"))
    return cli_usage_error(c, "--verify applies only to cache import");
  static const char *const not_package[] = {"cache-dir", "no-disk-cache",
                                            "from-tune-db"};
  for (size_t i = 0; c->package && i < 3; i++)
    if (cli_flag_given(c, not_package[i]))
      return cli_usage_error(c, "--%s does not go with --package (a "
                                "package holds the library's picks, "
                                "compiled into its own directory)",
                             not_package[i]);
  return 0;
}

int cli_cmd_cache(cli *c)
{
  int rc = check_action(c);
  if (rc)
    return rc;
  const char *a = c->action;
  if (c->package)
    return cache_package(c);
  fj_ctx *ctx;
  rc = cli_open_ctx(c, -1, c->arch ? c->arch : "sm_90a", &ctx);
  if (rc)
    return rc;
  const char *dir = fj_cache_dir(ctx);
  fj_status st = FJ_OK;
  if (!strcmp(a, "prewarm")) {
    rc = dir ? cache_prewarm(c, ctx)
             : cli_usage_error(c, "prewarm needs the disk cache (it is "
                                  "disabled: drop --no-disk-cache)");
  } else if (!strcmp(a, "export")) {
    rc = cache_export(c, ctx);
  } else if (!strcmp(a, "import")) {
    rc = cache_import(c, ctx);
  } else if (!strcmp(a, "dir")) {
    printf("%s\n", dir ? dir : "(disk cache disabled)");
  } else if (!strcmp(a, "ls")) {
    st = fj_cache_list(ctx, list_entry, NULL);
  } else if (!strcmp(a, "stats")) {
    cache_tally t = {0};
    st = fj_cache_list(ctx, tally_entry, &t);
    if (st == FJ_OK)
      printf("dir=%s\nentries=%d\nkernels=%d\nluts=%d\ninvalid=%d\nbytes=%llu\n",
             dir, t.entries, t.kernels, t.luts, t.invalid,
             (unsigned long long)t.bytes);
  } else if (!strcmp(a, "prune")) {
    int removed = 0;
    st = fj_cache_prune(ctx, &removed);
    if (st == FJ_OK)
      printf("removed %d unusable entr%s (corrupt or stale) from %s\n", removed,
             removed == 1 ? "y" : "ies", dir);
  } else {
    int removed = 0;
    st = fj_cache_clear(ctx, &removed);
    if (st == FJ_OK)
      printf("removed %d file(s) from %s\n", removed, dir);
  }
  if (st != FJ_OK)
    rc = cli_fj_error(c, ctx, st);
  fj_ctx_destroy(ctx);
  return rc;
}
