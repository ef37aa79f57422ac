/*
 * cli_args.c -- the command line of the flashjit tool: the parser of the
 * flags, their checks, the defaults, the error messages and the
 * context every subcommand opens (the table: cli_flag_table.c; the help:
 * cli_help.c).
 *
 * The contract: every bad value exits with status 2 and one line naming
 * the option, the value and what is allowed, before any GPU or compiler
 * work; nothing is silently capped, replaced or ignored.
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "cli_flags.h"

/* ---- messages ----------------------------------------------------------------- */

/* Writes s into out (size bytes) as it may appear inside one line of a
 * message: control characters escaped (\n, \t, \xNN), and cut after 200
 * bytes with the length said, so that a value never breaks the line. */
const char *cli_quote(const char *s, char *out, size_t size)
{
  size_t n = 0, len = strlen(s);
  out[0] = '\0';
  for (size_t i = 0; i < len && i < 200 && n + 8 < size; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (ch == '\n' || ch == '\t')
      n += (size_t)snprintf(out + n, size - n, "\\%c", ch == '\n' ? 'n' : 't');
    else if (ch < 0x20 || ch == 0x7f)
      n += (size_t)snprintf(out + n, size - n, "\\x%02x", ch);
    else
      out[n++] = (char)ch, out[n] = '\0';
  }
  if (len > 200 && n + 24 < size)
    snprintf(out + n, size - n, "... (%zu bytes)", len);
  return out;
}

int cli_usage_error(const cli *c, const char *fmt, ...)
{
  char text[2048], line[2400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  fprintf(stderr, "flashjit%s%s: %s\n", c->cmd_name ? " " : "",
          c->cmd_name ? c->cmd_name : "", cli_one_line(text, line, sizeof line));
  return EXIT_USAGE;
}

/* Reports a library failure: bad input exits 2 (in one line: a control
 * character the message echoes is escaped), anything else 1 (the whole
 * message: an NVRTC log, a Lua traceback). */
int cli_fj_error(const cli *c, const fj_ctx *ctx, fj_status st)
{
  const char *msg = fj_errmsg(ctx);
  int bad_input = st == FJ_ERR_INVALID_ARG || st == FJ_ERR_UNSUPPORTED ||
                  st == FJ_ERR_RESOURCES;
  if (bad_input)
    return cli_usage_error(c, "%s", *msg ? msg : fj_status_str(st));
  fprintf(stderr, "flashjit %s: %s\n", c->cmd_name ? c->cmd_name : "",
          *msg ? msg : fj_status_str(st));
  return EXIT_FAIL;
}

/* text with every control character escaped, whole (up to size). */
const char *cli_one_line(const char *text, char *out, size_t size)
{
  size_t n = 0;
  for (const unsigned char *s = (const unsigned char *)text; *s && n + 5 < size;
       s++) {
    if (*s == '\n' || *s == '\t')
      out[n++] = '\\', out[n++] = *s == '\n' ? 'n' : 't';
    else if (*s < 0x20 || *s == 0x7f)
      n += (size_t)snprintf(out + n, size - n, "\\x%02x", *s);
    else
      out[n++] = (char)*s;
  }
  out[n] = '\0';
  return out;
}

static void log_stderr(void *user, fj_log_level level, const char *msg)
{
  const cli *c = user;
  if (level >= FJ_LOG_WARN || c->verbose)
    fprintf(stderr, "flashjit: %s%s\n", level >= FJ_LOG_WARN ? "warning: " : "",
            msg);
}

static int given_bit(const cli *c, size_t i)
{
  return (int)((c->given[i / 64] >> (i % 64)) & 1);
}

/* The entry of --name for c's command (several entries may share a name,
 * each with its own help); with none for the command, the first of that
 * name (for the message); NULL for an unknown name. */
static const flag_def *find_flag(const cli *c, const char *name, size_t len)
{
  const flag_def *any = NULL;
  for (size_t i = 0; i < cli_nflags; i++)
    if (strlen(cli_flags[i].name) == len && strncmp(cli_flags[i].name, name, len) == 0) {
      if (cli_flags[i].cmds & c->cmd)
        return &cli_flags[i];
      any = any ? any : &cli_flags[i];
    }
  return any;
}

int cli_flag_given(const cli *c, const char *name)
{
  const flag_def *f = find_flag(c, name, strlen(name));
  return f && given_bit(c, (size_t)(f - cli_flags));
}

/* The flag argv[*i] names, or NULL after a message (*rc the status). */
static const flag_def *flag_of(cli *c, const char *arg, int *rc)
{
  int dashes = arg[1] == '-' ? 2 : 1;
  const char *name = arg + dashes;
  size_t len = strcspn(name, "=");
  const flag_def *f = find_flag(c, name, len);
  char q[300];
  *rc = 0;
  if (f && (f->cmds & c->cmd) && dashes == (f->name[1] ? 2 : 1))
    return f;
  if (f && (f->cmds & c->cmd))
    *rc = cli_usage_error(c, "unknown option '%s': %s takes %s", cli_quote(arg, q, sizeof q),
                          f->name, f->name[1] ? "two dashes (--)" : "one dash (-o)");
  else
    *rc = cli_usage_error(c, "unknown option '%s' (see 'flashjit %s --help')",
                          cli_quote(arg, q, sizeof q), c->cmd_name);
  return NULL;
}

/* Parses one flag at argv[*i]; advances *i past its value. */
static int parse_flag(cli *c, int argc, char **argv, int *i)
{
  int rc;
  const flag_def *f = flag_of(c, argv[*i], &rc);
  if (!f)
    return rc;
  const char *eq = strchr(argv[*i], '=');
  const char *value = eq ? eq + 1 : NULL;
  char name[48], help[600];
  cli_flag_spelling(f, name, sizeof name);
  if (f->needs_value == 1 && !value) {
    if (*i + 1 >= argc)
      return cli_usage_error(c, "option %s needs a value: %s %s (%s)", name,
                             name, f->arg, cli_quote(f->help, help, sizeof help));
    value = argv[++*i];
  }
  if (f->needs_value == 0 && value)
    return cli_usage_error(c, "option %s takes no value", name);
  size_t bit = (size_t)(f - cli_flags);
  if (given_bit(c, bit) && f->fn != cli_set_param)
    return cli_usage_error(c, "option %s is given twice (once only)", name);
  c->given[bit / 64] |= 1ull << (bit % 64);
  return f->fn(c, f, value);
}

void cli_release(cli *c)
{
  free(c->lens);
  c->lens = NULL;
  c->nlens = 0;
  for (int i = 0; i < c->mods.num_params; i++)
    free(c->param_args[i].text);
  c->mods.num_params = 0;
}

/* ---- context ------------------------------------------------------------------------ */

int cli_open_ctx(cli *c, int device, const char *arch, fj_ctx **ctx)
{
  fj_ctx_opts o;
  fj_ctx_opts_init(&o);
  o.device = device;
  o.arch = arch;
  o.cache_dir = c->cache_dir;
  o.disk_cache = !c->no_disk_cache;
  o.isolate_compile = c->isolate;
  o.jit_tiers = c->jit_tiers;
  /* A package is made from compiles, never from another package's
   * kernels ($FLASHJIT_PACKAGE_DIR ignored). */
  o.package_dir = c->package ? "" : NULL;
  o.sm_count = device < 0 ? c->sms : 0;
  o.log = log_stderr;
  o.log_user = c;
  fj_status st = fj_ctx_create(ctx, &o);
  return st == FJ_OK ? 0 : cli_fj_error(c, NULL, st);
}

/* ---- defaults --------------------------------------------------------------------- */

static void cli_defaults(cli *c)
{
  memset(c, 0, sizeof *c);
  fj_variant_default(&c->v, 64, FJ_F16, FJ_CAUSAL_NONE);
  c->warmup = 3;
  c->seed = 1;
  c->order = FJ_BHSD;
  c->o_scale = 1.f;
  fj_mods_init(&c->mods);
}

/* The option of the library's axis i (FJ_VARIANT_AXES): any of them
 * makes emit and run take the variant the flags describe. */
static const char *axis_flag(int i)
{
  fj_axis_info a;
  return fj_axis_get(i, &a) == FJ_OK ? a.flag : "";
}

/* The first axis whose option was given, or NULL. */
static const char *axis_given(const cli *c)
{
  for (int i = 0; i < fj_axis_count(); i++)
    if (cli_flag_given(c, axis_flag(i)))
      return axis_flag(i);
  return NULL;
}

/* The default variant for the head dim, dtype and mask asked for, with the
 * variant flags that were given on top. */
static void apply_defaults(cli *c)
{
  fj_variant given = c->v;
  fj_variant_default(&c->v, given.head_dim, given.dtype, given.causal);
  c->v.kv_dtype = given.kv_dtype;
  c->v.head_dim_v = given.head_dim_v;
  c->v.o_dtype = given.o_dtype;
  c->v.fp8_flush = given.fp8_flush;
  if (cli_flag_given(c, "fp8-flush"))
    c->variant_given = 1;
  if (given.kv_dtype == FJ_E4M3)
    c->v.stages = 1;  /* as the library's own choice does */
  c->v.varlen = given.varlen;
  c->v.paged = given.paged;
  /* Varlen, paged K/V and modifications are the mma family's (mma.sync;
   * modifications the wgmma family's too) -- except FP8 attention's
   * modifications (dtype e4m3 is the wgmma family's alone). */
  if ((given.varlen || given.paged ||
       (cli_mods_active(&c->mods) && given.dtype != FJ_E4M3)) &&
      !cli_flag_given(c, "mma"))
    c->v.mma = FJ_MMA_SYNC;
  /* Split head dims are the wgmma family's, or with --latent (V as K's
   * first columns) the mma family's; above 256 the mma family's alone. */
  if (given.head_dim_v && given.head_dim_v != given.head_dim &&
      !cli_flag_given(c, "mma"))
    c->v.mma = c->latent || given.head_dim > 256 || given.head_dim_v > 256
                   ? FJ_MMA_SYNC
                   : FJ_MMA_WGMMA;
  for (int i = 0; i < fj_axis_count(); i++) {
    const flag_def *f = find_flag(c, axis_flag(i), strlen(axis_flag(i)));
    if (cli_flag_given(c, axis_flag(i))) {
      c->variant_given = 1;
      *(int *)(void *)((char *)c + f->offset) =
          *(const int *)(const void *)((const char *)&given + (f->offset - OFF(v)));
    }
  }
  /* The wgmma family reads tiles only in the 128-byte swizzle, and its
   * usual shape is two consumer warpgroups of 64 rows. */
  if (c->v.mma == FJ_MMA_WGMMA) {
    if (!cli_flag_given(c, "swizzle"))
      c->v.swizzle = FJ_SWIZZLE_XOR;
    if (!cli_flag_given(c, "tile-m") && !cli_flag_given(c, "warps")) {
      c->v.tile_m = 128;
      c->v.warps = 12;
    }
  }
}

/* The first of the named flags that was given, or NULL. */
static const char *first_given(const cli *c, const char *const *names, size_t n)
{
  for (size_t i = 0; i < n; i++)
    if (cli_flag_given(c, names[i]))
      return names[i];
  return NULL;
}

/* Flags that do not combine: refused rather than ignored. */
static int check_combinations(cli *c)
{
  static const char *const problem[] = {"shape", "seq-kv", "heads-kv", "splits",
                                        "sms"};
  static const char *const tune_show[] = {"shape", "seq-kv", "heads-kv", "layout",
                                          "causal", "dtype", "kv-dtype", "workers",
                                          "iters", "no-save", "device", "backward",
                                          "seed"};
  const char *p, *a = axis_given(c);
  if (c->cmd == CMD_EMIT && c->sweep && (c->what || c->out_file))
    return cli_usage_error(c, "%s does not apply with --sweep (it prints one "
                              "line of resources per variant)",
                           c->what ? "--what" : "-o");
  if (c->cmd == CMD_EMIT && c->sweep && c->first)
    return cli_usage_error(c, "--first does not apply with --sweep (the "
                              "first kernel has no tiles to sweep)");
  if ((c->cmd & (CMD_EMIT | CMD_RUN)) && !c->sweep && cli_flag_given(c, "workers"))
    return cli_usage_error(c, "--workers applies only with --sweep");
  if (c->cmd == CMD_EMIT &&
      (p = first_given(c, problem, sizeof problem / sizeof problem[0])) &&
      (a || c->sweep))
    return cli_usage_error(c, "--%s picks the library's choice for a problem: "
                              "it does not combine with %s%s",
                           p, c->sweep ? "--sweep" : "--", c->sweep ? "" : a);
  if (c->deterministic && !c->backward)
    return cli_usage_error(c, "--deterministic is the backward's mode "
                              "(fj_problem.deterministic): give --backward too");
  if (c->cmd == CMD_RUN && c->backward && (a || c->sweep || c->jit_tiers))
    return cli_usage_error(c, "--backward runs the library's backward for "
                              "--shape's problem: it takes no --%s",
                           a ? a : c->sweep ? "sweep" : "jit-tiers");
  if (c->cmd == CMD_TUNE && c->show &&
      (p = first_given(c, tune_show, sizeof tune_show / sizeof tune_show[0])))
    return cli_usage_error(c, "--%s does not apply with --show (it lists the "
                              "database)", p);
  if (c->cmd == CMD_LUT && c->arch && cli_flag_given(c, "device"))
    return cli_usage_error(c, "--arch prints reference tables: it takes no "
                              "--device");
  return 0;
}

/* The flags after the command name; -1 when --help printed the help. */
static int parse_args(cli *c, int argc, char **argv, int cmd)
{
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
    char q[300];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      cli_print_help(cmd);
      return -1;
    }
    if (a[0] == '-' && a[1]) {
      int rc = parse_flag(c, argc, argv, &i);
      if (rc)
        return rc;
    } else if (c->cmd == CMD_CACHE && !c->action) {
      c->action = a;
    } else if (c->cmd == CMD_CACHE && !c->cache_file) {
      c->cache_file = a;  /* export|import FILE; cli_cmd_cache checks */
    } else {
      return cli_usage_error(c, "unexpected argument '%s'",
                             cli_quote(a, q, sizeof q));
    }
  }
  apply_defaults(c);
  int rc = check_combinations(c);
  return rc ? rc : cli_finish_mods(c);
}

int cli_parse(cli *c, int argc, char **argv)
{
  cli_defaults(c);
  char q[300];
  if (argc < 2)
    return cli_usage_error(c, "usage: flashjit <command> [options]; "
                              "commands: emit, run, plan, lut, cache, tune (see "
                              "flashjit --help)");
  if (!strcmp(argv[1], "help") && argc > 3)
    return cli_usage_error(c, "unexpected argument '%s' after help COMMAND",
                           cli_quote(argv[3], q, sizeof q));
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
      !strcmp(argv[1], "help"))
    return cli_help_command(c, argc > 2 ? argv[2] : NULL);
  if (!strcmp(argv[1], "--version") && argc > 2)
    return cli_usage_error(c, "unexpected argument '%s' after --version",
                           cli_quote(argv[2], q, sizeof q));
  if (!strcmp(argv[1], "--version")) {
    printf("flashjit %s\n", fj_version());
    return -1;
  }
  for (int i = 0; i < cli_ncommands; i++)
    if (!strcmp(argv[1], cli_commands[i].name)) {
      c->cmd_name = cli_commands[i].name;
      c->cmd = cli_commands[i].cmd;
      return parse_args(c, argc, argv, i);
    }
  return cli_usage_error(
      c, "unknown command '%s': one of emit, run, plan, lut, cache, tune",
      cli_quote(argv[1], q, sizeof q));
}
