/*
 * cli_mods.c -- the options of score and mask modifications (run, plan,
 * emit): --score-mod, --mask-mod, --window, --softcap, --sinks, --param, parsed
 * into the cli's fj_mods and checked by the library before any GPU work.
 */
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

/* One side of --window: -1, or digits only up to FJ_WINDOW_MAX; -2 for
 * anything else. */
static int parse_side(const char *s, size_t len)
{
  if (len == 2 && s[0] == '-' && s[1] == '1')
    return -1;
  int v = cli_parse_count(s, len);
  return v < 0 || v > FJ_WINDOW_MAX ? -2 : v;
}

/* --window LEFT,RIGHT: exactly two sides. */
int cli_set_window(cli *c, const flag_def *f, const char *value)
{
  size_t len = strcspn(value, ",");
  int left = parse_side(value, len);
  int right = value[len] ? parse_side(value + len + 1, strlen(value + len + 1))
                         : -2;
  if (left < -1 || right < -1) {
    char allowed[128];
    snprintf(allowed, sizeof allowed,
             "expected LEFT,RIGHT: two integers, each -1 (unbounded) or "
             "0..%d, digits only",
             FJ_WINDOW_MAX);
    return cli_bad_value(c, f, value, allowed);
  }
  c->mods.window_left = left;
  c->mods.window_right = right;
  return 0;
}

/* A float32 as strtod reads it, the whole text, finite (no leading blank,
 * no nan or inf, nothing past float32's range); 0, or -1. */
static int parse_f32(const char *s, double *out)
{
  char *end;
  if (!s[0] || isspace((unsigned char)s[0]))
    return -1;
  double v = strtod(s, &end);
  if (*end || !isfinite(v) || fabs(v) > (double)FLT_MAX)
    return -1;
  *out = v;
  return 0;
}

/* --softcap C: a finite cap above 0 (as a float32: 1e-50 is refused, not
 * turned into 0, which would mean no softcap). */
int cli_set_softcap(cli *c, const flag_def *f, const char *value)
{
  double v;
  if (parse_f32(value, &v) != 0 || !((float)v > 0.f))
    return cli_bad_value(c, f, value,
                     "expected a finite number above 0 (the cap, e.g. 30)");
  if ((float)v < FLT_MIN) {
    char allowed[160];
    snprintf(allowed, sizeof allowed,
             "expected a finite number above 0 (the cap, e.g. 30), not a "
             "float32 denormal: at least %g", (double)FLT_MIN);
    return cli_bad_value(c, f, value, allowed);
  }
  c->mods.softcap = (float)v;
  return 0;
}

/* --o-scale F: an e4m3 O's scale, finite and above 0. */
int cli_set_o_scale(cli *c, const flag_def *f, const char *value)
{
  double v;
  if (parse_f32(value, &v) != 0 || !((float)v >= FLT_MIN))
    return cli_bad_value(c, f, value,
                         "expected a finite number above 0, not a float32 "
                         "denormal (O's scale, e.g. 8)");
  c->o_scale = (float)v;
  return 0;
}

/* --sinks VALUE: one finite logit for every head.  The form needs only a
 * pointer that is not NULL; run fills heads_q copies (cli_run_mods). */
int cli_set_sinks(cli *c, const flag_def *f, const char *value)
{
  double v;
  if (parse_f32(value, &v) != 0)
    return cli_bad_value(c, f, value,
                         "expected a finite number (the sink logit, e.g. "
                         "0.5 or -2)");
  c->sink = (float)v;
  c->mods.sinks = &c->sink;
  return 0;
}

/* --block-mask Q,KV: the block sizes of a block mask the library builds
 * from the mask (64, 128 or 256 each). */
int cli_set_block_mask(cli *c, const flag_def *f, const char *value)
{
  size_t len = strcspn(value, ",");
  int q = cli_parse_count(value, len);
  int kv = value[len] ? cli_parse_count(value + len + 1, strlen(value + len + 1)) : -1;
  int ok_q = q == 64 || q == 128 || q == 256, ok_kv = kv == 64 || kv == 128 || kv == 256;
  if (!ok_q || !ok_kv)
    return cli_bad_value(c, f, value,
                         "expected Q,KV: the rows and keys of a block, each "
                         "64, 128 or 256");
  memset(&c->bmask, 0, sizeof c->bmask);
  c->bmask.block_q = q;
  c->bmask.block_kv = kv;
  c->bmask.batch = c->bmask.heads = c->bmask.q_blocks = c->bmask.kv_blocks = 1;
  c->mods.block_mask = &c->bmask;
  return 0;
}

/* --mod NAME: a built-in written as an expression (fj_mod_builtins) as
 * the score or mask expression; its parameters come with --param.  --mod
 * list prints the built-ins, each with its expression, and ends. */
int cli_set_mod(cli *c, const flag_def *f, const char *value)
{
  int n;
  const fj_mod_builtin *all = fj_mod_builtins(&n);
  if (!strcmp(value, "list")) {
    for (int i = 0; i < n; i++) {
      const fj_mod_builtin *b = &all[i];
      printf("%s\n  %s: %s\n", b->name, b->score ? "score" : b->mask ? "mask" : "softmax",
             b->score ? b->score : b->mask ? b->mask : "exp(sinks[h]) in the denominator");
      if (b->params[0])
        printf("  params: %s\n", b->params);
      if (b->field)
        printf("  set by: %s (not --mod)\n", b->field);
      printf("  %s\n", b->about);
    }
    return -1;
  }
  const fj_mod_builtin *b = fj_mod_builtin_find(value);
  if (!b || b->field) {
    char allowed[512];
    size_t used = (size_t)snprintf(allowed, sizeof allowed, "expected list or one of");
    for (int i = 0; i < n && used < sizeof allowed; i++)
      if (!all[i].field)
        used += (size_t)snprintf(allowed + used, sizeof allowed - used, " %s", all[i].name);
    if (b && used < sizeof allowed)
      snprintf(allowed + used, sizeof allowed - used, " (%s is set by %s)", b->name,
               b->field);
    return cli_bad_value(c, f, value, allowed);
  }
  if (b->score)
    c->mods.score = b->score;
  if (b->mask)
    c->mods.mask = b->mask;
  return 0;
}

/* --checked: checked mode (a flag without a value). */
int cli_set_checked(cli *c, const flag_def *f, const char *value)
{
  (void)f;
  (void)value;
  c->mods.checked = 1;
  return 0;
}

void cli_block_mask_shape(cli *c, const fj_problem *p)
{
  if (!c->mods.block_mask)
    return;
  c->bmask.batch = c->bmask.heads = 1;
  c->bmask.q_blocks = (p->seq_q + c->bmask.block_q - 1) / c->bmask.block_q;
  c->bmask.kv_blocks = (p->seq_kv + c->bmask.block_kv - 1) / c->bmask.block_kv;
}

/* An int32 in decimal: an optional '-', then digits only; 0, or -1. */
static int parse_i32(const char *s, double *out)
{
  int neg = s[0] == '-';
  const char *digits = neg ? s + 1 : s;
  size_t len = strlen(digits);
  long long v = 0;
  if (len == 0 || len > 10)
    return -1;
  for (size_t i = 0; i < len; i++) {
    if (!isdigit((unsigned char)digits[i]))
      return -1;
    v = v * 10 + (digits[i] - '0');
  }
  v = neg ? -v : v;
  if (v < INT32_MIN || v > INT32_MAX)
    return -1;
  *out = (double)v;
  return 0;
}

static const name_value mod_types[] = {{"f32", FJ_MOD_F32},
                                       {"f16", FJ_MOD_F16},
                                       {"bf16", FJ_MOD_BF16},
                                       {"i32", FJ_MOD_I32}};

const char *cli_mod_type_name(fj_mod_type t)
{
  for (size_t i = 0; i < sizeof mod_types / sizeof mod_types[0]; i++)
    if (mod_types[i].value == (int)t)
      return mod_types[i].name;
  return "?";
}

size_t cli_param_bytes(const fj_mod_param *p)
{
  size_t n = p->type == FJ_MOD_F16 || p->type == FJ_MOD_BF16 ? 2 : 4;
  for (int d = 0; d < p->rank; d++) {
    size_t e = (size_t)p->extents[d];
    if (e && n > SIZE_MAX / e)
      return SIZE_MAX;
    n *= e;
  }
  return n;
}

/* A scalar's VALUE; a parameter without a type takes f32 when VALUE looks
 * like a float ('.', 'e' or 'E'), else i32.  NULL, or what is wrong. */
static const char *param_value(fj_mod_param *p, const char *value)
{
  if (!p->type)
    p->type = strpbrk(value, ".eE") ? FJ_MOD_F32 : FJ_MOD_I32;
  if (p->type == FJ_MOD_I32)
    return parse_i32(value, &p->value) == 0
               ? NULL
               : "VALUE is not an i32 (digits, an optional '-', "
                 "-2147483648..2147483647)";
  return parse_f32(value, &p->value) == 0
             ? NULL
             : "VALUE is not an f32 (a finite float32)";
}

/* A tensor's "E0,...]" and what follows it: nothing, or @FILE (*file). */
static const char *param_extents(fj_mod_param *p, const char *s,
                                 const char **file)
{
  const char *close = strchr(s, ']');
  if (!close)
    return "no ']' after the extents";
  for (const char *e = s; e <= close; e++) {
    size_t len = strcspn(e, ",]");
    int x = cli_parse_count(e, len);
    if (x < 1 || p->rank == 4)
      return "the extents are not 1 to 4 integers in 1..2147483647";
    p->extents[p->rank++] = x;
    e += len;
  }
  if (close[1] == '@' && close[2])
    *file = close + 2;
  else if (close[1])
    return "after ']' comes nothing or @FILE";
  return NULL;
}

/* Parses one --param spec in text (a copy: the name is cut off in place).
 * NULL, or what is wrong. */
static const char *parse_param(char *text, fj_mod_param *p, const char **file)
{
  size_t len = strcspn(text, ":=");
  char sep = text[len];
  if (!sep)
    return "no '=VALUE' or ':TYPE' after NAME";
  text[len] = '\0';
  p->name = text;
  char *rest = text + len + 1;
  if (sep == '=')
    return param_value(p, rest);
  size_t tlen = strcspn(rest, "[=");
  char open = rest[tlen];
  int type;
  rest[tlen] = '\0';
  if (cli_parse_name(mod_types, sizeof mod_types / sizeof mod_types[0], rest,
                 &type) != 0)
    return "TYPE is not f32, f16, bf16 or i32";
  p->type = (fj_mod_type)type;
  if (open == '=')
    return p->type == FJ_MOD_F32 || p->type == FJ_MOD_I32
               ? param_value(p, rest + tlen + 1)
               : "a scalar's TYPE is f32 or i32";
  if (open != '[')
    return "no '=VALUE' or '[E0,...]' after TYPE";
  return param_extents(p, rest + tlen + 1, file);
}

/* A tensor's FILE: a regular file of exactly the tensor's bytes. */
static int check_param_file(const cli *c, const flag_def *f, const char *spec,
                            const fj_mod_param *p, const char *file)
{
  struct stat st;
  char why[512], ext[64] = "";
  for (int d = 0; d < p->rank; d++)
    snprintf(ext + strlen(ext), sizeof ext - strlen(ext), "%s%lld",
             d ? " x " : "", (long long)p->extents[d]);
  size_t bytes = cli_param_bytes(p);
  if (stat(file, &st) != 0)
    snprintf(why, sizeof why, "cannot read FILE '%s': %s", file,
             strerror(errno));
  else if (!S_ISREG(st.st_mode))
    snprintf(why, sizeof why, "FILE '%s' is not a regular file", file);
  else if (bytes == SIZE_MAX || (unsigned long long)st.st_size != bytes)
    snprintf(why, sizeof why,
             "FILE '%s' has %lld bytes; %s %s values take %s%zu (raw, "
             "little-endian)",
             file, (long long)st.st_size, ext, cli_mod_type_name(p->type),
             bytes == SIZE_MAX ? "more than " : "", bytes);
  else
    return 0;
  return cli_bad_value(c, f, spec, why);
}

/* --param SPEC, up to FJ_MOD_PARAMS_MAX times: a scalar or a tensor (see
 * the help).  The spec's form and a file's size are checked here; names,
 * and everything else about the modifications, by fj_mods_check once all
 * flags are in (finish_mods). */
int cli_set_param(cli *c, const flag_def *f, const char *value)
{
  int n = c->mods.num_params;
  char why[320];
  if (n == FJ_MOD_PARAMS_MAX) {
    snprintf(why, sizeof why, "more than %d parameters (at most %d --param)",
             FJ_MOD_PARAMS_MAX, FJ_MOD_PARAMS_MAX);
    return cli_bad_value(c, f, value, why);
  }
  char *text = strdup(value);
  if (!text) {
    fprintf(stderr, "flashjit %s: out of memory\n", c->cmd_name);
    return EXIT_FAIL;
  }
  fj_mod_param *p = &c->params[n];
  const char *file = NULL;
  memset(p, 0, sizeof *p);
  const char *wrong = parse_param(text, p, &file);
  int rc = 0;
  if (wrong) {
    snprintf(why, sizeof why,
             "%s (expected NAME=VALUE, NAME:f32=VALUE, NAME:i32=VALUE, "
             "NAME:DTYPE[E0,...] or NAME:DTYPE[E0,...]@FILE; DTYPE f32, "
             "f16, bf16 or i32)",
             wrong);
    rc = cli_bad_value(c, f, value, why);
  } else if (file) {
    rc = check_param_file(c, f, value, p, file);
  }
  if (rc) {
    free(text);
    return rc;
  }
  c->param_args[n] = (param_arg){text, file};
  c->mods.params = c->params;
  c->mods.num_params = n + 1;
  return 0;
}

/* Whether some modification is on (what the library names "_win", "_cap",
 * "_x..." and "_sink"). */
int cli_mods_active(const fj_mods *m)
{
  return m->window_left != -1 || m->window_right != -1 || m->softcap > 0.f ||
         m->sinks || m->block_mask || m->checked ||
         (m->score && m->score[0]) || (m->mask && m->mask[0]) ||
         m->num_params > 0;
}

/* The modifications, once all flags are in: checked by the library before
 * any GPU or compiler work (the tensors with a placeholder for their data:
 * only run has any), then the variant's (problem.mods: cli_problem). */
int cli_finish_mods(cli *c)
{
  static const int32_t placeholder[1];
  c->mods_on = cli_mods_active(&c->mods);
  if (!c->mods_on)
    return 0;
  fj_mod_param params[FJ_MOD_PARAMS_MAX];
  fj_mods check = c->mods;
  memcpy(params, c->params, sizeof params);
  for (int i = 0; i < check.num_params; i++)
    if (params[i].rank > 0)
      params[i].data = placeholder;
  check.params = params;
  fj_block_mask bm;  /* run builds the lists: placeholders for the check */
  if (check.block_mask) {
    bm = *check.block_mask;
    bm.kv_num = bm.kv_indices = placeholder;
    check.block_mask = &bm;
  }
  fj_status st = fj_mods_check(&check);
  if (st != FJ_OK)
    return cli_fj_error(c, NULL, st);
  c->v.mods = &c->mods;
  return 0;
}

