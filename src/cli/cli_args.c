/*
 * cli_args.c -- the command line of the flashjit tool: the flag table, its
 * value parsers and checks, the defaults, the error messages and the
 * context every subcommand opens (the help: cli_help.c).
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

/* ---- the flags ---------------------------------------------------------------------- */

static const name_value dtypes[] = {{"f16", FJ_F16}, {"bf16", FJ_BF16}};
static const name_value kv_dtypes[] = {
    {"f16", FJ_F16}, {"bf16", FJ_BF16}, {"e4m3", FJ_E4M3}};
static const name_value causals[] = {{"top-left", FJ_CAUSAL_TOP_LEFT},
                                     {"bottom-right", FJ_CAUSAL_BOTTOM_RIGHT},
                                     {"none", FJ_CAUSAL_NONE}};
static const name_value layouts[] = {{"bhsd", FJ_BHSD}, {"bshd", FJ_BSHD}};

#define NAMES(t) .names = t, .nnames = sizeof(t) / sizeof((t)[0])
/* A flag whose value the library checks (no range here). */
#define LIB .lo = 1, .hi = 0
/* The structural axes, one flag per row of the library's table
 * (FJ_VARIANT_AXES): with any of them, emit and run take the variant the
 * flags describe instead of the library's choice.  A named axis's
 * placeholder is its names with '|' between them. */
#define AXIS_PIPED(s) "|" s
#define AXIS(field_, flag_, kind_, names_, doc_)                              \
  {flag_, kind_ != FJ_AXIS_SWITCH, CMD_VARIANT,                              \
   kind_ == FJ_AXIS_SWITCH ? cli_set_switch                                  \
   : kind_ == FJ_AXIS_NAMED ? cli_set_axis : cli_set_axis_int,               \
   OFF(v.field_), LIB,                                                       \
   .arg = kind_ == FJ_AXIS_NAMED ? ("" names_(AXIS_PIPED)) + 1               \
          : kind_ == FJ_AXIS_INT ? "N" : NULL,                               \
   .help = doc_},

static const flag_def flags[] = {
    {"head-dim", 1, CMD_VARIANT, cli_set_int, OFF(v.head_dim), LIB, .arg = "D",
     .help = "head dimension: 32, 64, 96, 128, 160, 192, 256 (default 64, "
             "or --shape's D)"},
    FJ_VARIANT_AXES(AXIS)
    {"causal", 2, CMD_VARIANT | CMD_TUNE | CMD_PLAN, cli_set_causal,
     OFF(v.causal), NAMES(causals), .arg = "[=top-left|bottom-right|none]",
     .help = "causal mask; alone: top-left (PyTorch's); default none"},
    {"dtype", 1, CMD_VARIANT | CMD_TUNE | CMD_PLAN, cli_set_name, OFF(v.dtype),
     NAMES(dtypes), .arg = "f16|bf16",
     .help = "Q and O (K and V unless --kv-dtype); default f16"},
    {"kv-dtype", 1, CMD_VARIANT | CMD_TUNE | CMD_PLAN, cli_set_name,
     OFF(v.kv_dtype), NAMES(kv_dtypes), .arg = "f16|bf16|e4m3",
     .help = "K and V (default: --dtype)"},
    {"arch", 1, CMD_EMIT | CMD_PLAN | CMD_CACHE, cli_set_string, OFF(arch), .arg = "sm_XY[a]",
     .help = "target architecture (default sm_90a)"},
    {"arch", 1, CMD_LUT, cli_set_string, OFF(arch), .arg = "sm_XY[a]",
     .help = "print that target's reference tables instead of probing the GPU"},
    {"what", 1, CMD_EMIT, cli_set_string, OFF(what),
     .arg = "source|ptx|cubin|resources|log|name",
     .help = "what to print (default source)"},
    {"o", 1, CMD_EMIT, cli_set_out, OFF(out_file), .arg = "FILE",
     .help = "write to FILE instead of stdout"},
    {"sweep", 0, CMD_EMIT, cli_set_switch, OFF(sweep),
     .help = "compile every tile/warps/stages/swizzle/softmax combination not "
             "fixed by a flag (wgmma: warpgroups, key tiles, stages), one line "
             "each"},
    {"sweep", 0, CMD_RUN, cli_set_switch, OFF(sweep),
     .help = "time every combination emit --sweep compiles, one line each, "
             "the fastest last"},
    {"workers", 1, CMD_EMIT | CMD_RUN, cli_set_int, OFF(workers), .lo = 1, .hi = 64,
     .arg = "N", .help = "compiler processes at once for --sweep (default: one "
                         "per CPU)"},
    {"workers", 1, CMD_TUNE | CMD_CACHE, cli_set_int, OFF(workers), .lo = 1, .hi = 64, .arg = "N",
     .help = "compiler processes at once (default: one per CPU, at most 16)"},
    {"shape", 1, CMD_PROBLEM, cli_set_shape, 0, .arg = "B,H,S,D",
     .help = "batch, query heads, query length, head dim (required)"},
    {"shape", 1, CMD_EMIT, cli_set_shape, 0, .arg = "B,H,S,D",
     .help = "show the library's choice for this problem (default 2,16,4096,"
             "D; with --varlen B items, S their longest); no variant flags"},
    {"seq-kv", 1, CMD_PROBLEM | CMD_EMIT, cli_set_int, OFF(seq_kv), LIB,
     .arg = "N", .help = "key/value length (default S)"},
    {"heads-kv", 1, CMD_PROBLEM | CMD_EMIT, cli_set_int, OFF(heads_kv), LIB,
     .arg = "N", .help = "K/V heads, dividing H (GQA; default H)"},
    {"layout", 1, CMD_PROBLEM, cli_set_name, OFF(order), NAMES(layouts),
     .arg = "bhsd|bshd", .help = "Q and O (K and V unless paged); default bhsd"},
    {"varlen", 1, CMD_EMIT | CMD_RUN | CMD_PLAN, cli_set_varlen, 0,
     .arg = "Q1[:K1],...",
     .help = "a variable-length batch, one item per sequence (B items): Q "
             "queries (at most S) and K keys (at most --seq-kv; default Q); Q "
             "and O packed (thd), K and V too unless paged (default: fixed "
             "lengths)"},
    {"page-size", 1, CMD_RUN, cli_set_page_size, OFF(page_size), .arg = "N",
     .help = "paged K/V, pages of N tokens (a power of two in 1..4096, layout "
             "nhd) in a block table shuffled from --seed (default: not paged)"},
    {"page-size", 1, CMD_EMIT | CMD_PLAN, cli_set_page_size, OFF(page_size),
     .arg = "N", .help = "paged K/V, pages of N tokens (a power of two in "
                         "1..4096, layout nhd; default: not paged)"},
    {"score-mod", 1, CMD_MODS, cli_set_string, OFF(mods.score), .arg = "EXPR",
     .help = "a C expression for each score, of s (scale x q.k), b, h, hkv, "
             "q, kv (positions in the sequence) and the --param names, e.g. "
             "'s + bias(h, q - kv + 8)' (default: none)"},
    {"mask-mod", 1, CMD_MODS, cli_set_string, OFF(mods.mask), .arg = "EXPR",
     .help = "a C expression, true where query q may see key kv, of b, h, "
             "hkv, q, kv and the --param names, e.g. 'doc(q) == doc(kv)' "
             "(default: none)"},
    {"window", 1, CMD_MODS, cli_set_window, 0, .arg = "LEFT,RIGHT",
     .help = "sliding window, query q sees keys q + off - LEFT .. q + off + "
             "RIGHT (off: the causal diagonal's, bottom-right without "
             "--causal); each -1 (unbounded) or 0..1073741824 (default -1,-1: "
             "none)"},
    {"softcap", 1, CMD_MODS, cli_set_softcap, 0, .arg = "C",
     .help = "logit soft-capping, C * tanh(s / C) after --score-mod; C "
             "finite, above 0 (default: none)"},
    {"sinks", 1, CMD_MODS, cli_set_sinks, 0, .arg = "VALUE",
     .help = "attention sinks: a logit VALUE (natural units, like the scaled "
             "scores) for every query head, in each row's softmax "
             "denominator with no value row; finite (default: none)"},
    {"block-mask", 1, CMD_MODS, cli_set_block_mask, 0, .arg = "Q,KV",
     .help = "a block mask of blocks of Q query rows and KV keys (each 64, "
             "128 or 256), built by the library on the GPU from the mask "
             "(--mask-mod, --causal, --window): key blocks the mask hides "
             "are skipped, blocks it keeps whole skip --mask-mod (default: "
             "none)"},
    {"mod", 1, CMD_MODS, cli_set_mod, 0, .arg = "NAME",
     .help = "a built-in written as an expression: alibi, alibi-standard, "
             "relative-bias, documents, prefix-lm (its parameters by "
             "--param); --mod list prints each with its expression"},
    {"checked", 0, CMD_MODS, cli_set_checked, 0,
     .help = "checked mode: a tensor --param read outside its extents is "
             "reported after the call (the tensor, the indices, the "
             "extents); each call waits for its kernels"},
    {"param", 1, CMD_RUN | CMD_TUNE, cli_set_param, 0, .arg = "SPEC",
     .help = "a parameter of the expressions, repeatable up to 8 times: "
             "NAME=VALUE (f32 if VALUE has '.', 'e' or 'E', else i32), "
             "NAME:f32=VALUE, NAME:i32=VALUE; a tensor NAME:DTYPE[E0,...] "
             "(DTYPE f32, f16, bf16 or i32; 1 to 4 extents) of random values "
             "from --seed (floats uniform in [-1, 1), i32 uniform in "
             "0..E0-1), or NAME:DTYPE[E0,...]@FILE read from FILE (raw "
             "little-endian, exactly E0 x ... x the element size bytes) "
             "(default: none)"},
    {"param", 1, CMD_EMIT | CMD_PLAN, cli_set_param, 0, .arg = "SPEC",
     .help = "a parameter of the expressions, repeatable up to 8 times: "
             "NAME=VALUE (f32 if VALUE has '.', 'e' or 'E', else i32), "
             "NAME:f32=VALUE, NAME:i32=VALUE; a tensor NAME:DTYPE[E0,...] "
             "(DTYPE f32, f16, bf16 or i32; 1 to 4 extents; only the extents "
             "are used) or NAME:DTYPE[E0,...]@FILE (FILE checked to hold "
             "exactly E0 x ... x the element size bytes) (default: none)"},
    {"splits", 1, CMD_RUN | CMD_PLAN | CMD_EMIT, cli_set_splits, OFF(splits),
     .arg = "N|auto", .help = "key splits (split-KV) per row tile, 1..256 "
                              "(default auto)"},
    {"sms", 1, CMD_PLAN | CMD_EMIT, cli_set_int, OFF(sms), .lo = 1, .hi = 1024, .arg = "N",
     .help = "multiprocessors to plan for (default: the arch's largest part)"},
    {"check", 0, CMD_RUN, cli_set_switch, OFF(check),
     .help = "compare with the float64 reference"},
    {"iters", 1, CMD_RUN, cli_set_int, OFF(iters), .lo = 1, .hi = 100000, .arg = "N",
     .help = "timed runs (default 20; with --sweep 10 per variant)"},
    {"iters", 1, CMD_TUNE, cli_set_int, OFF(iters), .lo = 1, .hi = 256, .arg = "N",
     .help = "timed runs per candidate (default 10)"},
    {"warmup", 1, CMD_RUN, cli_set_int, OFF(warmup), .lo = 0, .hi = 100000, .arg = "N",
     .help = "untimed runs before the timed ones (default 3; with --sweep 2)"},
    {"seed", 1, CMD_RUN, cli_set_int, OFF(seed), .lo = 0, .hi = INT_MAX, .arg = "N",
     .help = "seed of the random inputs and --param tensors (default 1)"},
    {"frag", 1, CMD_LUT, cli_set_string, OFF(frag), .arg = "KIND",
     .help = "one fragment kind, e.g. wmma_acc_f32 (default: all)"},
    {"head-dim", 1, CMD_CACHE, cli_set_string, OFF(heads_list), .arg = "D,...",
     .help = "prewarm: head dims, 1..256 each (default 64,128)"},
    {"dtype", 1, CMD_CACHE, cli_set_string, OFF(dtypes_list),
     .arg = "f16|bf16,...", .help = "prewarm: dtypes (default f16,bf16)"},
    {"causal", 1, CMD_CACHE, cli_set_string, OFF(causals_list),
     .arg = "none|top-left|bottom-right,...",
     .help = "prewarm: causal masks (default none,top-left)"},
    {"from-tune-db", 0, CMD_CACHE, cli_set_switch, OFF(from_tune_db),
     .help = "prewarm: every variant the tuning database has for --arch "
             "(--head-dim, --dtype, --causal filter them when given) instead "
             "of the library's picks"},
    {"show", 0, CMD_TUNE, cli_set_switch, OFF(show),
     .help = "list the tuning database instead of tuning"},
    {"no-save", 0, CMD_TUNE, cli_set_switch, OFF(no_save),
     .help = "tune without recording the winner"},
    {"device", 1, CMD_RUN | CMD_TUNE | CMD_LUT, cli_set_int, OFF(device), .lo = 0, .hi = INT_MAX, .arg = "N", .help = "CUDA device ordinal (default 0)"},
    {"device", 1, CMD_PLAN, cli_set_int, OFF(device), .lo = 0, .hi = INT_MAX, .arg = "N",
     .help = "plan for that GPU instead of --arch and --sms"},
    {"cache-dir", 1, CMD_ALL, cli_set_path, OFF(cache_dir), .arg = "DIR",
     .help = "disk cache directory (default $FLASHJIT_CACHE_DIR, else "
             "$XDG_CACHE_HOME/flashjit, else ~/.cache/flashjit)"},
    {"no-disk-cache", 0, CMD_ALL, cli_set_switch, OFF(no_disk_cache),
     .help = "cache in memory only"},
    {"isolate", 0, CMD_EMIT | CMD_RUN, cli_set_switch, OFF(isolate),
     .help = "compile in a child process"},
    {"jit-tiers", 0, CMD_RUN, cli_set_switch, OFF(jit_tiers),
     .help = "the tiered JIT: where the chosen kernel is not compiled yet, "
             "the first kernel answers while it compiles in the background "
             "(fj_ctx_opts.jit_tiers)"},
    {"first", 0, CMD_EMIT, cli_set_switch, OFF(first),
     .help = "the tiered JIT's first kernel for the problem or variant "
             "(CUDA cores, loops not unrolled) instead of the kernel itself"},
    {"verbose", 0, CMD_ALL, cli_set_switch, OFF(verbose),
     .help = "print the library's log"},
};
enum { NFLAGS = sizeof flags / sizeof flags[0] };

/* cli.given has a bit per flag. */
_Static_assert(NFLAGS <= 128, "cli.given holds 128 flags");

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
  for (size_t i = 0; i < NFLAGS; i++)
    if (strlen(flags[i].name) == len && strncmp(flags[i].name, name, len) == 0) {
      if (flags[i].cmds & c->cmd)
        return &flags[i];
      any = any ? any : &flags[i];
    }
  return any;
}

int cli_flag_given(const cli *c, const char *name)
{
  const flag_def *f = find_flag(c, name, strlen(name));
  return f && given_bit(c, (size_t)(f - flags));
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
  size_t bit = (size_t)(f - flags);
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
  o.sm_count = device < 0 ? c->sms : 0;
  o.log = log_stderr;
  o.log_user = c;
  fj_status st = fj_ctx_create(ctx, &o);
  return st == FJ_OK ? 0 : cli_fj_error(c, NULL, st);
}

/* ---- commands, help, defaults ----------------------------------------------------- */

/* Each subcommand's name, its bit in flag_def.cmds (what main() dispatches
 * on) and its line in the help. */
static const struct {
  const char *name;
  unsigned cmd;
  const char *synopsis;
} commands[] = {
    {"emit", CMD_EMIT,
     "render and compile a kernel -- the library's choice for a problem, or "
     "the variant the flags describe -- and print its source, PTX, cubin, "
     "resources or log (no GPU needed)"},
    {"run", CMD_RUN,
     "run attention on the GPU: time it, and with --check compare it with "
     "the float64 reference"},
    {"plan", CMD_PLAN,
     "print what the library would launch for a problem: variant, grid, "
     "splits, GQA packing, workspace (no GPU needed)"},
    {"lut", CMD_LUT,
     "print the fragment-layout tables (probed on the GPU; --arch gives the "
     "reference)"},
    {"cache", CMD_CACHE,
     "dir | ls | stats | clear | prune | prewarm | export FILE | import FILE: "
     "the disk cache (prune removes corrupt and stale entries; prewarm "
     "compiles the library's picks for --arch, no GPU needed; export and "
     "import move it between machines)"},
    {"tune", CMD_TUNE,
     "autotune a problem class on the GPU and record the winner (--show "
     "lists the database)"},
};
enum { NCOMMANDS = sizeof commands / sizeof commands[0] };

static void print_flags(unsigned cmd)
{
  for (size_t i = 0; i < NFLAGS; i++) {
    const flag_def *f = &flags[i];
    if (!(f->cmds & cmd))
      continue;
    char left[64], name[48];
    snprintf(left, sizeof left, "%s%s%s", cli_flag_spelling(f, name, sizeof name),
             f->arg && f->needs_value == 1 ? " " : "", f->arg ? f->arg : "");
    printf("  %-26s %s\n", left, f->help);
  }
}

static void print_help(int i)
{
  printf("usage: flashjit %s%s [options]   (flashjit %s)\n\n",
         commands[i].name, commands[i].cmd == CMD_CACHE
             ? " dir|ls|stats|clear|prune|prewarm|export FILE|import FILE" : "",
         fj_version());
  printf("%s\n\noptions:\n", commands[i].synopsis);
  print_flags(commands[i].cmd);
}

static void print_overview(void)
{
  printf("usage: flashjit <command> [options]   (flashjit %s)\n\n", fj_version());
  for (size_t i = 0; i < NCOMMANDS; i++)
    printf("  %-6s %s\n", commands[i].name, commands[i].synopsis);
  printf("\n'flashjit <command> --help' lists a command's options.  Bad input "
         "exits with status 2 and one line naming the bad value.\n");
}

/* flashjit help [COMMAND] and flashjit --help. */
static int help_command(cli *c, const char *name)
{
  if (!name) {
    print_overview();
    return -1;
  }
  for (int i = 0; i < (int)NCOMMANDS; i++)
    if (!strcmp(name, commands[i].name)) {
      print_help(i);
      return -1;
    }
  char q[300];
  return cli_usage_error(c, "unknown command '%s' for help: one of emit, run, "
                            "plan, lut, cache, tune",
                         cli_quote(name, q, sizeof q));
}

static void cli_defaults(cli *c)
{
  memset(c, 0, sizeof *c);
  fj_variant_default(&c->v, 64, FJ_F16, FJ_CAUSAL_NONE);
  c->warmup = 3;
  c->seed = 1;
  c->order = FJ_BHSD;
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
  if (given.kv_dtype == FJ_E4M3)
    c->v.stages = 1;  /* as the library's own choice does */
  c->v.varlen = given.varlen;
  c->v.paged = given.paged;
  /* Varlen, paged K/V and modifications are the mma family's (mma.sync;
   * modifications the wgmma family's too). */
  if ((given.varlen || given.paged || cli_mods_active(&c->mods)) &&
      !cli_flag_given(c, "mma"))
    c->v.mma = FJ_MMA_SYNC;
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
                                          "iters", "no-save", "device"};
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
      print_help(cmd);
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
    return help_command(c, argc > 2 ? argv[2] : NULL);
  if (!strcmp(argv[1], "--version") && argc > 2)
    return cli_usage_error(c, "unexpected argument '%s' after --version",
                           cli_quote(argv[2], q, sizeof q));
  if (!strcmp(argv[1], "--version")) {
    printf("flashjit %s\n", fj_version());
    return -1;
  }
  for (int i = 0; i < (int)NCOMMANDS; i++)
    if (!strcmp(argv[1], commands[i].name)) {
      c->cmd_name = commands[i].name;
      c->cmd = commands[i].cmd;
      return parse_args(c, argc, argv, i);
    }
  return cli_usage_error(
      c, "unknown command '%s': one of emit, run, plan, lut, cache, tune",
      cli_quote(argv[1], q, sizeof q));
}
