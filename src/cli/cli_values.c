/*
 * cli_values.c -- the value setters of the flag table: strict numbers
 * (digits and an optional '-', nothing else), names from a list, shapes,
 * --varlen, --splits, paths.  Each refuses a bad value in one line naming
 * the option, the value and what is allowed.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli_flags.h"

static int *field(cli *c, const flag_def *f)
{
  return (int *)(void *)((char *)c + f->offset);
}

const char *cli_flag_spelling(const flag_def *f, char *buf, size_t size)
{
  snprintf(buf, size, "%s%s", f->name[1] ? "--" : "-", f->name);
  return buf;
}

int cli_bad_value(const cli *c, const flag_def *f, const char *value,
                  const char *allowed)
{
  char q[300], name[48];
  return cli_usage_error(c, "invalid value '%s' for %s: %s",
                         cli_quote(value, q, sizeof q),
                         cli_flag_spelling(f, name, sizeof name), allowed);
}

/* A decimal int: an optional '-', then 1 to 10 digits (no blank, no '+',
 * nothing after them), within int's range; 0, or -1. */
static int parse_int(const char *s, int *out)
{
  const char *d = s + (s[0] == '-');
  size_t len = strlen(d);
  if (len == 0 || len > 10 || strspn(d, "0123456789") != len)
    return -1;
  long long v = strtoll(s, NULL, 10);
  if (v < INT_MIN || v > INT_MAX)
    return -1;
  *out = (int)v;
  return 0;
}

int cli_set_int(cli *c, const flag_def *f, const char *value)
{
  int v;
  char allowed[96];
  if (f->lo <= f->hi)
    snprintf(allowed, sizeof allowed, "expected an integer in %d..%d", f->lo,
             f->hi);
  else
    snprintf(allowed, sizeof allowed, "expected an integer (digits, an "
                                      "optional '-')");
  if (parse_int(value, &v) != 0 || (f->lo <= f->hi && (v < f->lo || v > f->hi)))
    return cli_bad_value(c, f, value, allowed);
  *field(c, f) = v;
  return 0;
}

/* --warps: the counts some family implements; which family takes which
 * is the library's to say. */
int cli_set_warps(cli *c, const flag_def *f, const char *value)
{
  int n = cli_parse_count(value, strlen(value));
  if (n != 2 && n != 4 && n != 8 && n != 12 && n != 16)
    return cli_bad_value(c, f, value, "expected 4 or 8 (wmma, mma; 2 for "
                                      "mma's head dims above 256) or 8, 12 "
                                      "or 16 (wgmma: a producer and 1-3 "
                                      "consumer warpgroups)");
  c->v.warps = n;
  return 0;
}

int cli_parse_name(const name_value *table, size_t n, const char *s,
                   int *out)
{
  for (size_t i = 0; i < n; i++)
    if (strcmp(table[i].name, s) == 0) {
      *out = table[i].value;
      return 0;
    }
  return -1;
}

int cli_set_name(cli *c, const flag_def *f, const char *value)
{
  if (cli_parse_name(f->names, f->nnames, value, field(c, f)) == 0)
    return 0;
  char allowed[128] = "one of";
  for (size_t i = 0; i < f->nnames; i++)
    snprintf(allowed + strlen(allowed), sizeof allowed - strlen(allowed),
             "%s %s", i ? "," : "", f->names[i].name);
  return cli_bad_value(c, f, value, allowed);
}

/* The library's axis whose option f is, or -1. */
static int axis_of_flag(const flag_def *f, fj_axis_info *a)
{
  for (int i = 0; i < fj_axis_count(); i++)
    if (fj_axis_get(i, a) == FJ_OK && !strcmp(a->flag, f->name))
      return i;
  return -1;
}

int cli_set_axis(cli *c, const flag_def *f, const char *value)
{
  fj_axis_info a;
  int axis = axis_of_flag(f, &a), v = fj_axis_value(axis, value);
  if (v) {
    *field(c, f) = v;
    return 0;
  }
  char allowed[128] = "one of";
  for (int i = 1; i <= a.nvalues; i++)
    snprintf(allowed + strlen(allowed), sizeof allowed - strlen(allowed),
             "%s %s", i > 1 ? "," : "", fj_axis_value_name(axis, i));
  return cli_bad_value(c, f, value, allowed);
}

int cli_set_axis_int(cli *c, const flag_def *f, const char *value)
{
  return f->offset == OFF(v.warps) ? cli_set_warps(c, f, value)
                                   : cli_set_int(c, f, value);
}

int cli_set_switch(cli *c, const flag_def *f, const char *value)
{
  (void)value;
  *field(c, f) = 1;
  return 0;
}

/* --causal alone means PyTorch's top-left alignment. */
int cli_set_causal(cli *c, const flag_def *f, const char *value)
{
  if (!value) {
    c->v.causal = FJ_CAUSAL_TOP_LEFT;
    return 0;
  }
  return cli_set_name(c, f, value);
}

/* One count: digits only (no sign, no blank), at most INT_MAX; -1 for
 * anything else. */
int cli_parse_count(const char *s, size_t len)
{
  long long v = 0;
  if (len == 0 || len > 10)
    return -1;
  for (size_t i = 0; i < len; i++) {
    if (s[i] < '0' || s[i] > '9')
      return -1;
    v = v * 10 + (s[i] - '0');
  }
  return v > INT_MAX ? -1 : (int)v;
}

/* --shape B,H,S,D: exactly four counts of 1 or more, nothing else. */
int cli_set_shape(cli *c, const flag_def *f, const char *value)
{
  const char *p = value;
  int n = 0, ok = 1;
  for (; n < 4 && ok; n++) {
    size_t len = strcspn(p, ",");
    c->shape[n] = cli_parse_count(p, len);
    ok = c->shape[n] >= 1 && (n == 3 ? p[len] == '\0' : p[len] == ',');
    p += len + (p[len] == ',');
  }
  if (!ok)
    return cli_bad_value(c, f, value,
                         "expected B,H,S,D: four integers of 1 or more, "
                         "digits only, e.g. 1,8,512,64");
  c->shape_given = 1;
  return 0;
}

/* --splits N | auto. */
int cli_set_splits(cli *c, const flag_def *f, const char *value)
{
  if (!strcmp(value, "auto")) {
    c->splits = 0;
    return 0;
  }
  int n = cli_parse_count(value, strlen(value));
  if (n < 1 || n > FJ_SPLITS_MAX) {
    char allowed[64];
    snprintf(allowed, sizeof allowed, "expected auto or an integer in 1..%d",
             FJ_SPLITS_MAX);
    return cli_bad_value(c, f, value, allowed);
  }
  c->splits = n;
  return 0;
}

/* One item of --varlen, "Q" or "Q:K" (K defaults to Q); 0, or -1. */
static int parse_seq_len(const char *s, size_t len, seq_len *out)
{
  const char *colon = memchr(s, ':', len);
  size_t qlen = colon ? (size_t)(colon - s) : len;
  out->q = cli_parse_count(s, qlen);
  out->kv = colon ? cli_parse_count(colon + 1, len - qlen - 1) : out->q;
  return out->q < 0 || out->kv < 0 ? -1 : 0;
}

/* --varlen Q1[:K1],Q2[:K2],...: one item per sequence, each parsed here;
 * their count and bounds are checked against --shape by cli_problem.  The
 * variant becomes a varlen one. */
int cli_set_varlen(cli *c, const flag_def *f, const char *value)
{
  size_t n = 1;
  for (const char *s = value; *s; s++)
    n += *s == ',';
  seq_len *lens = calloc(n, sizeof *lens);
  if (!lens) {
    fprintf(stderr, "flashjit %s: out of memory\n", c->cmd_name);
    return EXIT_FAIL;
  }
  const char *item = value;
  for (size_t i = 0; i < n; i++) {
    size_t len = strcspn(item, ",");
    if (parse_seq_len(item, len, &lens[i]) != 0) {
      char why[160];
      snprintf(why, sizeof why,
               "item %zu ('%.*s') is not Q or Q:K (queries and keys of a "
               "sequence: integers 0..%d, digits only)",
               i + 1, (int)(len < 32 ? len : 32), item, INT_MAX);
      free(lens);
      return cli_bad_value(c, f, value, why);
    }
    item += len + 1;
  }
  free(c->lens);
  c->lens = lens;
  c->nlens = (int)n;
  c->varlen = value;
  c->v.varlen = 1;
  return 0;
}

/* --page-size N: paged K/V.  Only a number is checked here: the library
 * (fj_problem_check) names a page size it refuses.  The variant becomes a
 * paged one, and a varlen one (the keys' lengths come from seqused_kv). */
int cli_set_page_size(cli *c, const flag_def *f, const char *value)
{
  if (parse_int(value, &c->page_size) != 0) {
    char allowed[64];
    snprintf(allowed, sizeof allowed,
             "expected an integer (a power of two in 1..%d)", FJ_PAGE_SIZE_MAX);
    return cli_bad_value(c, f, value, allowed);
  }
  c->v.varlen = c->v.paged = 1;
  return 0;
}

int cli_set_string(cli *c, const flag_def *f, const char *value)
{
  const char **slot = (const char **)(void *)((char *)c + f->offset);
  *slot = value;
  return 0;
}

/* --score-mod EXPR, --mask-mod EXPR: some text.  The library reads ""
 * as no expression, but one given on the command line and empty (an
 * unset shell variable) is a mistake, refused as a blank one is. */
int cli_set_expr(cli *c, const flag_def *f, const char *value)
{
  if (!value[0])
    return cli_bad_value(c, f, value,
                         "expected a C expression, not an empty one (leave "
                         "the option out for none)");
  return cli_set_string(c, f, value);
}

/* A path: not empty, shorter than PATH_MAX (a longer one would be cut or
 * refused by the system later, after the work is done). */
int cli_set_path(cli *c, const flag_def *f, const char *value)
{
  char allowed[96];
  size_t len = strlen(value);
  if (len > 0 && len < PATH_MAX)
    return cli_set_string(c, f, value);
  snprintf(allowed, sizeof allowed, "expected a path of 1..%d bytes (this is "
                                    "%zu)", PATH_MAX - 1, len);
  return cli_bad_value(c, f, value, allowed);
}

/* -o FILE: a path whose directory exists, checked before anything is
 * compiled. */
int cli_set_out(cli *c, const flag_def *f, const char *value)
{
  int rc = cli_set_path(c, f, value);
  if (rc)
    return rc;
  char dir[PATH_MAX], why[PATH_MAX + 64];
  snprintf(dir, sizeof dir, "%s", value);
  char *slash = strrchr(dir, '/');
  if (!slash)
    snprintf(dir, sizeof dir, ".");
  else
    slash[slash == dir] = '\0';  /* "/x" keeps "/" */
  struct stat st;
  int err = stat(dir, &st) != 0 ? errno : S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
  if (!err)
    return 0;
  snprintf(why, sizeof why, "its directory '%s' cannot be used: %s", dir,
           strerror(err));
  return cli_bad_value(c, f, value, why);
}
