/*
 * cli_args.c -- the command line of the flashjit tool: the flag table, its
 * value parsers and checks, the defaults, the help, the error messages and
 * the context every subcommand opens.
 */
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

/* ---- messages ----------------------------------------------------------------- */

int cli_usage_error(const cli *c, const char *fmt, ...)
{
  va_list ap;
  fprintf(stderr, "flashjit%s%s: ", c->cmd_name ? " " : "",
          c->cmd_name ? c->cmd_name : "");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  return EXIT_USAGE;
}

/* Reports a library failure: bad input exits 2, anything else 1. */
int cli_fj_error(const cli *c, const fj_ctx *ctx, fj_status st)
{
  const char *msg = fj_errmsg(ctx);
  fprintf(stderr, "flashjit %s: %s\n", c->cmd_name ? c->cmd_name : "",
          *msg ? msg : fj_status_str(st));
  int bad_input = st == FJ_ERR_INVALID_ARG || st == FJ_ERR_UNSUPPORTED ||
                  st == FJ_ERR_RESOURCES;
  return bad_input ? EXIT_USAGE : EXIT_FAIL;
}

static void log_stderr(void *user, fj_log_level level, const char *msg)
{
  const cli *c = user;
  if (level >= FJ_LOG_WARN || c->verbose)
    fprintf(stderr, "flashjit: %s%s\n", level >= FJ_LOG_WARN ? "warning: " : "",
            msg);
}

/* ---- value parsers --------------------------------------------------------------- */

static int parse_int(const char *s, int *out)
{
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < INT_MIN || v > INT_MAX)
    return -1;
  *out = (int)v;
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

static const name_value dtypes[] = {{"f16", FJ_F16}, {"bf16", FJ_BF16}};
static const name_value kv_dtypes[] = {
    {"f16", FJ_F16}, {"bf16", FJ_BF16}, {"e4m3", FJ_E4M3}};
static const name_value swizzles[] = {
    {"none", FJ_SWIZZLE_NONE}, {"pad", FJ_SWIZZLE_PAD}, {"xor", FJ_SWIZZLE_XOR}};
static const name_value softmaxes[] = {
    {"smem", FJ_SOFTMAX_SMEM}, {"regs", FJ_SOFTMAX_REGS}};
static const name_value mmas[] = {
    {"wmma", FJ_MMA_WMMA}, {"mma", FJ_MMA_SYNC}, {"wgmma", FJ_MMA_WGMMA}};
static const name_value causals[] = {{"top-left", FJ_CAUSAL_TOP_LEFT},
                                     {"bottom-right", FJ_CAUSAL_BOTTOM_RIGHT},
                                     {"none", FJ_CAUSAL_NONE}};
static const name_value layouts[] = {{"bhsd", FJ_BHSD}, {"bshd", FJ_BSHD}};

/* ---- flags ------------------------------------------------------------------------- */

typedef int (*flag_fn)(cli *c, const flag_def *f, const char *value);

struct flag_def {
  const char *name;
  int needs_value;  /* 1: --flag V or --flag=V; 0: a switch; 2: --flag[=V] */
  unsigned cmds;
  flag_fn fn;
  size_t offset;    /* of the int field, for set_int */
  const name_value *names;
  size_t nnames;
  const char *help;
};

static int *field(cli *c, const flag_def *f)
{
  return (int *)(void *)((char *)c + f->offset);
}

int cli_bad_value(const cli *c, const flag_def *f, const char *value,
                  const char *allowed)
{
  return cli_usage_error(c, "invalid value '%s' for --%s: %s", value,
                         f->name, allowed);
}

static int set_int(cli *c, const flag_def *f, const char *value)
{
  if (parse_int(value, field(c, f)) != 0)
    return cli_bad_value(c, f, value, "expected an integer");
  if (f->cmds == CMD_VARIANT)
    c->variant_given = 1;
  return 0;
}

static int set_name(cli *c, const flag_def *f, const char *value)
{
  if (cli_parse_name(f->names, f->nnames, value, field(c, f)) == 0) {
    if (f->cmds == CMD_VARIANT)
      c->variant_given = 1;
    return 0;
  }
  char allowed[128] = "one of";
  for (size_t i = 0; i < f->nnames; i++)
    snprintf(allowed + strlen(allowed), sizeof allowed - strlen(allowed),
             "%s %s", i ? "," : "", f->names[i].name);
  return cli_bad_value(c, f, value, allowed);
}

static int set_switch(cli *c, const flag_def *f, const char *value)
{
  (void)value;
  *field(c, f) = 1;
  return 0;
}

static int set_head_dim(cli *c, const flag_def *f, const char *value)
{
  c->head_dim_given = 1;
  return set_int(c, f, value);
}

/* --causal alone means PyTorch's top-left alignment. */
static int set_causal(cli *c, const flag_def *f, const char *value)
{
  if (!value) {
    c->v.causal = FJ_CAUSAL_TOP_LEFT;
    return 0;
  }
  return set_name(c, f, value);
}

static int set_shape(cli *c, const flag_def *f, const char *value)
{
  int n = 0;
  const char *p = value;
  char part[32];
  while (n < 4) {
    size_t len = strcspn(p, ",");
    if (len == 0 || len >= sizeof part)
      break;
    memcpy(part, p, len);
    part[len] = '\0';
    if (parse_int(part, &c->shape[n]) != 0 || c->shape[n] < 1)
      break;
    n++;
    p += len;
    if (*p != ',')
      break;
    p++;
  }
  if (n != 4 || *p)
    return cli_bad_value(c, f, value,
                     "expected B,H,S,D: four positive integers, e.g. 1,8,512,64");
  c->shape_given = 1;
  return 0;
}

/* A variant switch (--pack-gqa, --split-kv). */
static int set_variant_switch(cli *c, const flag_def *f, const char *value)
{
  c->variant_given = 1;
  return set_switch(c, f, value);
}

/* --splits N | auto. */
static int set_splits(cli *c, const flag_def *f, const char *value)
{
  if (!strcmp(value, "auto")) {
    c->splits = 0;
    return 0;
  }
  if (parse_int(value, &c->splits) != 0 || c->splits < 1 ||
      c->splits > FJ_SPLITS_MAX)
    return cli_bad_value(c, f, value, "expected auto or an integer in 1..256");
  return 0;
}

/* One count of --varlen: digits only (no sign, no blank), at most INT_MAX;
 * -1 for anything else. */
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
 * variant (emit, or run with variant flags) becomes a varlen one. */
static int set_varlen(cli *c, const flag_def *f, const char *value)
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
static int set_page_size(cli *c, const flag_def *f, const char *value)
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

static int set_string(cli *c, const flag_def *f, const char *value)
{
  const char **slot = (const char **)(void *)((char *)c + f->offset);
  *slot = value;
  return 0;
}

#define NAMES(t) t, sizeof(t) / sizeof((t)[0])

static const flag_def flags[] = {
    {"head-dim", 1, CMD_VARIANT, set_head_dim, OFF(v.head_dim), NULL, 0,
     "head dimension (32, 64, 96, 128, 160, 192, 256)"},
    {"tile-m", 1, CMD_VARIANT, set_int, OFF(v.tile_m), NULL, 0,
     "query rows per block"},
    {"tile-n", 1, CMD_VARIANT, set_int, OFF(v.tile_n), NULL, 0,
     "key rows per iteration"},
    {"warps", 1, CMD_VARIANT, set_int, OFF(v.warps), NULL, 0, "warps per block"},
    {"stages", 1, CMD_VARIANT, set_int, OFF(v.stages), NULL, 0,
     "1 = synchronous loads, 2-3 = cp.async ring"},
    {"swizzle", 1, CMD_VARIANT, set_name, OFF(v.swizzle), NAMES(swizzles),
     "none | pad | xor"},
    {"softmax", 1, CMD_VARIANT, set_name, OFF(v.softmax), NAMES(softmaxes),
     "smem | regs"},
    {"mma", 1, CMD_VARIANT, set_name, OFF(v.mma), NAMES(mmas),
     "wmma | mma | wgmma"},
    {"causal", 2, CMD_VARIANT | CMD_TUNE | CMD_PLAN, set_causal, OFF(v.causal), NAMES(causals),
     "causal mask; --causal=bottom-right for FlashAttention's alignment"},
    {"dtype", 1, CMD_VARIANT | CMD_TUNE | CMD_PLAN, set_name, OFF(v.dtype), NAMES(dtypes),
     "f16 | bf16 (Q, O; K, V unless --kv-dtype)"},
    {"kv-dtype", 1, CMD_VARIANT | CMD_TUNE | CMD_PLAN, set_name, OFF(v.kv_dtype), NAMES(kv_dtypes),
     "f16 | bf16 | e4m3"},
    {"arch", 1, CMD_EMIT | CMD_LUT | CMD_PLAN, set_string, OFF(arch), NULL, 0,
     "target, sm_XY or sm_XYa (emit, plan: default sm_90a)"},
    {"what", 1, CMD_EMIT, set_string, OFF(what), NULL, 0,
     "source | ptx | cubin | resources | log"},
    {"o", 1, CMD_EMIT, set_string, OFF(out_file), NULL, 0, "write to FILE"},
    {"sweep", 0, CMD_EMIT | CMD_RUN, set_switch, OFF(sweep), NULL, 0,
     "every tile/warps/stages/swizzle/softmax combination not fixed by a "
     "flag: compiled (emit) or timed (run), one line each"},
    {"workers", 1, CMD_EMIT | CMD_RUN | CMD_TUNE, set_int, OFF(workers), NULL, 0,
     "compiler processes at once for --sweep (default: one per CPU)"},
    {"pack-gqa", 0, CMD_VARIANT, set_variant_switch, OFF(v.pack_gqa), NULL, 0,
     "GQA packing: the query heads of a KV head as rows of one tile (mma)"},
    {"split-kv", 0, CMD_VARIANT, set_variant_switch, OFF(v.split_kv), NULL, 0,
     "split-KV: key ranges over several blocks, then a combine (mma)"},
    {"shape", 1, CMD_PROBLEM, set_shape, 0, NULL, 0, "B,H,S,D"},
    {"seq-kv", 1, CMD_PROBLEM, set_int, OFF(seq_kv), NULL, 0,
     "key/value length (default S)"},
    {"heads-kv", 1, CMD_PROBLEM, set_int, OFF(heads_kv), NULL, 0,
     "K/V heads, dividing H (GQA; default H)"},
    {"layout", 1, CMD_PROBLEM, set_name, OFF(order), NAMES(layouts),
     "bhsd | bshd (Q and O; K and V unless paged)"},
    {"varlen", 1, CMD_EMIT | CMD_RUN | CMD_PLAN, set_varlen, 0, NULL, 0,
     "Q1[:K1],Q2[:K2],...: a variable-length batch, one item per sequence "
     "(B items): Q queries (at most S) and K keys (at most --seq-kv; default "
     "Q); Q and O packed (thd), K and V too unless paged (emit: a varlen "
     "variant; the mma family unless --mma)"},
    {"page-size", 1, CMD_EMIT | CMD_RUN | CMD_PLAN, set_page_size,
     OFF(page_size), NULL, 0,
     "N: paged K/V, pages of N tokens (a power of two in 1..4096, layout "
     "nhd) in a block table shuffled from --seed (emit: a paged variant; "
     "the mma family unless --mma)"},
    {"score-mod", 1, CMD_MODS, set_string, OFF(mods.score), NULL, 0,
     "EXPR: a C expression for each score, of s (scale x q.k), b, h, hkv, "
     "q, kv (positions in the sequence) and the --param names, e.g. "
     "'s + bias(h, q - kv + 8)' (default: none; the mma family unless "
     "--mma)"},
    {"mask-mod", 1, CMD_MODS, set_string, OFF(mods.mask), NULL, 0,
     "EXPR: a C expression, true where query q may see key kv, of b, h, "
     "hkv, q, kv and the --param names, e.g. 'doc(q) == doc(kv)' (default: "
     "none; the mma family unless --mma)"},
    {"window", 1, CMD_MODS, cli_set_window, 0, NULL, 0,
     "LEFT,RIGHT: sliding window, query q sees keys q + off - LEFT .. q + "
     "off + RIGHT (off: the causal diagonal's, bottom-right without "
     "--causal); each -1 (unbounded) or 0..1073741824 (default -1,-1: "
     "none)"},
    {"softcap", 1, CMD_MODS, cli_set_softcap, 0, NULL, 0,
     "C: logit soft-capping, C * tanh(s / C) after --score-mod; C finite, "
     "above 0 (default: none)"},
    {"param", 1, CMD_MODS, cli_set_param, 0, NULL, 0,
     "SPEC: a parameter of the expressions, repeatable up to 8 times: "
     "NAME=VALUE (f32 if VALUE has '.', 'e' or 'E', else i32), "
     "NAME:f32=VALUE, NAME:i32=VALUE; a tensor NAME:DTYPE[E0,...] (DTYPE "
     "f32, f16, bf16 or i32; 1 to 4 extents) of random values from --seed "
     "(floats uniform in [-1, 1), i32 uniform in 0..E0-1), or "
     "NAME:DTYPE[E0,...]@FILE read from FILE (raw little-endian, exactly "
     "E0 x ... x the element size bytes); plan and emit use only the "
     "extents (default: none)"},
    {"splits", 1, CMD_RUN | CMD_PLAN, set_splits, OFF(splits), NULL, 0,
     "N | auto: key splits (split-KV) per row tile, 1..256 (default auto)"},
    {"sms", 1, CMD_PLAN, set_int, OFF(sms), NULL, 0,
     "N: multiprocessors to plan for without a GPU (default: the arch's "
     "largest part)"},
    {"check", 0, CMD_RUN, set_switch, OFF(check), NULL, 0,
     "compare with the float64 reference"},
    {"iters", 1, CMD_PROBLEM, set_int, OFF(iters), NULL, 0, "timed runs (20)"},
    {"warmup", 1, CMD_RUN, set_int, OFF(warmup), NULL, 0,
     "untimed runs after the first (3)"},
    {"seed", 1, CMD_RUN, set_int, OFF(seed), NULL, 0,
     "seed of the random inputs and --param tensors (1)"},
    {"frag", 1, CMD_LUT, set_string, OFF(frag), NULL, 0,
     "one fragment kind (default: all)"},
    {"show", 0, CMD_TUNE, set_switch, OFF(show), NULL, 0,
     "list the tuning database instead of tuning"},
    {"no-save", 0, CMD_TUNE, set_switch, OFF(no_save), NULL, 0,
     "tune without recording the winner"},
    {"device", 1, CMD_PROBLEM | CMD_LUT, set_int, OFF(device), NULL, 0,
     "CUDA device ordinal (0; plan: plan for that device instead of --arch)"},
    {"cache-dir", 1, CMD_ALL, set_string, OFF(cache_dir), NULL, 0,
     "disk cache directory"},
    {"no-disk-cache", 0, CMD_ALL, set_switch, OFF(no_disk_cache), NULL, 0,
     "cache in memory only"},
    {"isolate", 0, CMD_EMIT | CMD_RUN, set_switch, OFF(isolate), NULL, 0,
     "compile in a child process"},
    {"verbose", 0, CMD_ALL, set_switch, OFF(verbose), NULL, 0,
     "print the library's log"},
};

/* cli.given has a bit per flag. */
_Static_assert(sizeof flags / sizeof flags[0] <= 64, "cli.given holds 64 flags");

static const flag_def *find_flag(const char *name, size_t len)
{
  for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
    if (strlen(flags[i].name) == len && strncmp(flags[i].name, name, len) == 0)
      return &flags[i];
  return NULL;
}

int cli_flag_given(const cli *c, const char *name)
{
  const flag_def *f = find_flag(name, strlen(name));
  return f && (c->given >> (f - flags)) & 1;
}

/* Parses one flag at argv[*i]; advances *i past its value. */
static int parse_flag(cli *c, int argc, char **argv, int *i)
{
  const char *arg = argv[*i];
  const char *name = arg + (arg[1] == '-' ? 2 : 1);
  const char *eq = strchr(name, '=');
  size_t len = eq ? (size_t)(eq - name) : strlen(name);
  const flag_def *f = find_flag(name, len);
  if (!f || !(f->cmds & c->cmd))
    return cli_usage_error(c, "unknown option '%s' (see 'flashjit %s --help')",
                           arg, c->cmd_name);
  const char *value = eq ? eq + 1 : NULL;
  if (f->needs_value == 1 && !value) {
    if (*i + 1 >= argc)
      return cli_usage_error(c, "option --%s needs a value: %s", f->name,
                             f->help);
    value = argv[++*i];
  }
  if (f->needs_value == 0 && value)
    return cli_usage_error(c, "option --%s takes no value", f->name);
  c->given |= 1ull << (f - flags);
  return f->fn(c, f, value);
}

static void print_flags(unsigned cmd)
{
  for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
    if (flags[i].cmds & cmd)
      printf("  --%-15s %s\n", flags[i].name, flags[i].help);
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
     "render and compile a variant; print its source, PTX, cubin, resources "
     "or log (no GPU needed)"},
    {"run", CMD_RUN,
     "run attention on the GPU: time it, and with --check compare it with "
     "the float64 reference"},
    {"lut", CMD_LUT,
     "print the fragment-layout table (probed on the GPU; --arch gives the "
     "reference)"},
    {"cache", CMD_CACHE, "dir | ls | stats | clear"},
    {"tune", CMD_TUNE,
     "autotune a problem class on the GPU and record the winner (--show "
     "lists the database)"},
    {"plan", CMD_PLAN,
     "print what the library would launch for a problem: variant, grid, "
     "splits, GQA packing, workspace (no GPU needed)"},
};

static void print_help(const char *cmd)
{
  printf("usage: flashjit <command> [options]   (flashjit %s)\n\n", fj_version());
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
    if (cmd && strcmp(cmd, commands[i].name) != 0)
      continue;
    printf("  %-6s %s\n", commands[i].name, commands[i].synopsis);
    if (cmd)
      print_flags(commands[i].cmd);
  }
  if (!cmd)
    printf("\n'flashjit <command> --help' lists a command's options.\n");
}

static void cli_defaults(cli *c)
{
  memset(c, 0, sizeof *c);
  fj_variant_default(&c->v, 64, FJ_F16, FJ_CAUSAL_NONE);
  c->warmup = 3;
  c->order = FJ_BHSD;
  fj_mods_init(&c->mods);
}

/* The default variant for the head dim, dtype and mask asked for, with the
 * variant flags that were given on top. */
static void apply_defaults(cli *c)
{
  fj_variant given = c->v;
  fj_variant_default(&c->v, given.head_dim, given.dtype, given.causal);
  static const char *const axes[] = {"tile-m", "tile-n", "warps", "stages",
                                     "swizzle", "softmax", "mma", "kv-dtype",
                                     "pack-gqa", "split-kv"};
  if (given.kv_dtype == FJ_E4M3)
    c->v.stages = 1;  /* as the library's own choice does */
  c->v.varlen = given.varlen;
  c->v.paged = given.paged;
  /* Varlen, paged K/V and modifications are the mma family's (mma.sync;
   * modifications the wgmma family's too). */
  if ((given.varlen || given.paged || cli_mods_active(&c->mods)) &&
      !cli_flag_given(c, "mma"))
    c->v.mma = FJ_MMA_SYNC;
  for (size_t i = 0; i < sizeof axes / sizeof axes[0]; i++) {
    const flag_def *f = find_flag(axes[i], strlen(axes[i]));
    if (cli_flag_given(c, axes[i]))
      *field(c, f) = *(const int *)(const void *)((const char *)&given +
                                                  (f->offset - OFF(v)));
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

/* The flags after the command name; -1 when --help printed the help. */
static int parse_args(cli *c, int argc, char **argv)
{
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      print_help(c->cmd_name);
      return -1;
    }
    if (a[0] == '-' && a[1]) {
      int rc = parse_flag(c, argc, argv, &i);
      if (rc)
        return rc;
    } else if (c->cmd == CMD_CACHE && !c->action) {
      c->action = a;
    } else {
      return cli_usage_error(c, "unexpected argument '%s'", a);
    }
  }
  apply_defaults(c);
  return cli_finish_mods(c);
}

int cli_parse(cli *c, int argc, char **argv)
{
  cli_defaults(c);
  if (argc < 2)
    return cli_usage_error(c, "usage: flashjit <command> [options]; "
                              "commands: emit, run, plan, lut, cache, tune (see "
                              "flashjit --help)");
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "help") ||
      !strcmp(argv[1], "-h")) {
    print_help(argc > 2 ? argv[2] : NULL);
    return -1;
  }
  if (!strcmp(argv[1], "--version")) {
    printf("flashjit %s\n", fj_version());
    return -1;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(argv[1], commands[i].name)) {
      c->cmd_name = commands[i].name;
      c->cmd = commands[i].cmd;
      return parse_args(c, argc, argv);
    }
  return cli_usage_error(
      c, "unknown command '%s': one of emit, run, plan, lut, cache, tune",
      argv[1]);
}
