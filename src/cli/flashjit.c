/*
 * flashjit -- the command-line tool.  Uses only include/flashjit.h (and the
 * CUDA runtime for device memory and events in `run`, as any embedder
 * would).  main() parses and dispatches; one function per subcommand.
 *
 * Exit status: 0 success, 1 failure (a check that FAILs, a compile error,
 * no GPU), 2 bad input (unknown flag, bad value, a refused variant).
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "flashjit.h"

enum { EXIT_FAIL = 1, EXIT_USAGE = 2 };

enum {
  CMD_EMIT = 1,
  CMD_RUN = 2,
  CMD_LUT = 4,
  CMD_CACHE = 8,
  CMD_TUNE = 16,
  CMD_VARIANT = CMD_EMIT | CMD_RUN,
  CMD_PROBLEM = CMD_RUN | CMD_TUNE,
  CMD_ALL = 31
};

typedef struct cli {
  const char *cmd_name;
  unsigned cmd;
  const char *action;     /* cache dir|ls|stats|clear */
  /* variant */
  fj_variant v;
  int variant_given;      /* any variant flag seen */
  int head_dim_given;
  /* context */
  const char *arch;
  int device;
  const char *cache_dir;
  int no_disk_cache;
  int isolate;
  int verbose;
  /* emit */
  const char *what;
  const char *out_file;
  int sweep;
  int workers;
  unsigned long long given;  /* bit i: flags[i] appeared */
  /* run */
  int shape[4];           /* B, H, S, D */
  int shape_given;
  int seq_kv;
  int heads_kv;
  fj_order order;
  int check;
  int iters;
  int warmup;
  int seed;
  /* lut */
  const char *frag;
  /* tune */
  int show;
  int no_save;
} cli;

/* ---- messages ----------------------------------------------------------------- */

static int usage_error(const cli *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int usage_error(const cli *c, const char *fmt, ...)
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
static int fj_error(const cli *c, const fj_ctx *ctx, fj_status st)
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

typedef struct name_value {
  const char *name;
  int value;
} name_value;

static int parse_name(const name_value *table, size_t n, const char *s,
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

typedef struct flag_def flag_def;
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

static int bad_value(const cli *c, const flag_def *f, const char *value,
                     const char *allowed)
{
  return usage_error(c, "invalid value '%s' for --%s: %s", value, f->name,
                     allowed);
}

static int set_int(cli *c, const flag_def *f, const char *value)
{
  if (parse_int(value, field(c, f)) != 0)
    return bad_value(c, f, value, "expected an integer");
  if (f->cmds == CMD_VARIANT)
    c->variant_given = 1;
  return 0;
}

static int set_name(cli *c, const flag_def *f, const char *value)
{
  if (parse_name(f->names, f->nnames, value, field(c, f)) == 0) {
    if (f->cmds == CMD_VARIANT)
      c->variant_given = 1;
    return 0;
  }
  char allowed[128] = "one of";
  for (size_t i = 0; i < f->nnames; i++)
    snprintf(allowed + strlen(allowed), sizeof allowed - strlen(allowed),
             "%s %s", i ? "," : "", f->names[i].name);
  return bad_value(c, f, value, allowed);
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
    return bad_value(c, f, value,
                     "expected B,H,S,D: four positive integers, e.g. 1,8,512,64");
  c->shape_given = 1;
  return 0;
}

static int set_string(cli *c, const flag_def *f, const char *value)
{
  const char **slot = (const char **)(void *)((char *)c + f->offset);
  *slot = value;
  return 0;
}

#define OFF(field_) offsetof(cli, field_)
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
    {"causal", 2, CMD_VARIANT | CMD_TUNE, set_causal, OFF(v.causal), NAMES(causals),
     "causal mask; --causal=bottom-right for FlashAttention's alignment"},
    {"dtype", 1, CMD_VARIANT | CMD_TUNE, set_name, OFF(v.dtype), NAMES(dtypes),
     "f16 | bf16 (Q, O; K, V unless --kv-dtype)"},
    {"kv-dtype", 1, CMD_VARIANT | CMD_TUNE, set_name, OFF(v.kv_dtype), NAMES(kv_dtypes),
     "f16 | bf16 | e4m3"},
    {"arch", 1, CMD_EMIT | CMD_LUT, set_string, OFF(arch), NULL, 0,
     "target, sm_XY or sm_XYa (emit: default sm_90a)"},
    {"what", 1, CMD_EMIT, set_string, OFF(what), NULL, 0,
     "source | ptx | cubin | resources | log"},
    {"o", 1, CMD_EMIT, set_string, OFF(out_file), NULL, 0, "write to FILE"},
    {"sweep", 0, CMD_EMIT | CMD_RUN, set_switch, OFF(sweep), NULL, 0,
     "every tile/warps/stages/swizzle/softmax combination not fixed by a "
     "flag: compiled (emit) or timed (run), one line each"},
    {"workers", 1, CMD_EMIT | CMD_RUN | CMD_TUNE, set_int, OFF(workers), NULL, 0,
     "compiler processes at once for --sweep (default: one per CPU)"},
    {"shape", 1, CMD_PROBLEM, set_shape, 0, NULL, 0, "B,H,S,D"},
    {"seq-kv", 1, CMD_PROBLEM, set_int, OFF(seq_kv), NULL, 0,
     "key/value length (default S)"},
    {"heads-kv", 1, CMD_PROBLEM, set_int, OFF(heads_kv), NULL, 0,
     "K/V heads, dividing H (GQA; default H)"},
    {"layout", 1, CMD_PROBLEM, set_name, OFF(order), NAMES(layouts), "bhsd | bshd"},
    {"check", 0, CMD_RUN, set_switch, OFF(check), NULL, 0,
     "compare with the float64 reference"},
    {"iters", 1, CMD_PROBLEM, set_int, OFF(iters), NULL, 0, "timed runs (20)"},
    {"warmup", 1, CMD_RUN, set_int, OFF(warmup), NULL, 0,
     "untimed runs after the first (3)"},
    {"seed", 1, CMD_RUN, set_int, OFF(seed), NULL, 0, "input seed (1)"},
    {"frag", 1, CMD_LUT, set_string, OFF(frag), NULL, 0,
     "one fragment kind (default: all)"},
    {"show", 0, CMD_TUNE, set_switch, OFF(show), NULL, 0,
     "list the tuning database instead of tuning"},
    {"no-save", 0, CMD_TUNE, set_switch, OFF(no_save), NULL, 0,
     "tune without recording the winner"},
    {"device", 1, CMD_PROBLEM | CMD_LUT, set_int, OFF(device), NULL, 0,
     "CUDA device ordinal (0)"},
    {"cache-dir", 1, CMD_ALL, set_string, OFF(cache_dir), NULL, 0,
     "disk cache directory"},
    {"no-disk-cache", 0, CMD_ALL, set_switch, OFF(no_disk_cache), NULL, 0,
     "cache in memory only"},
    {"isolate", 0, CMD_EMIT | CMD_RUN, set_switch, OFF(isolate), NULL, 0,
     "compile in a child process"},
    {"verbose", 0, CMD_ALL, set_switch, OFF(verbose), NULL, 0,
     "print the library's log"},
};

static const flag_def *find_flag(const char *name, size_t len)
{
  for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
    if (strlen(flags[i].name) == len && strncmp(flags[i].name, name, len) == 0)
      return &flags[i];
  return NULL;
}

static int flag_given(const cli *c, const char *name)
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
    return usage_error(c, "unknown option '%s' (see 'flashjit %s --help')",
                       arg, c->cmd_name);
  const char *value = eq ? eq + 1 : NULL;
  if (f->needs_value == 1 && !value) {
    if (*i + 1 >= argc)
      return usage_error(c, "option --%s needs a value: %s", f->name, f->help);
    value = argv[++*i];
  }
  if (f->needs_value == 0 && value)
    return usage_error(c, "option --%s takes no value", f->name);
  c->given |= 1ull << (f - flags);
  return f->fn(c, f, value);
}

static void print_flags(unsigned cmd)
{
  for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
    if (flags[i].cmds & cmd)
      printf("  --%-15s %s\n", flags[i].name, flags[i].help);
}

/* ---- context ------------------------------------------------------------------------ */

static int open_ctx(cli *c, int device, const char *arch, fj_ctx **ctx)
{
  fj_ctx_opts o;
  fj_ctx_opts_init(&o);
  o.device = device;
  o.arch = arch;
  o.cache_dir = c->cache_dir;
  o.disk_cache = !c->no_disk_cache;
  o.isolate_compile = c->isolate;
  o.log = log_stderr;
  o.log_user = c;
  fj_status st = fj_ctx_create(ctx, &o);
  return st == FJ_OK ? 0 : fj_error(c, NULL, st);
}

/* ---- emit ------------------------------------------------------------------------------ */

static int write_out(const cli *c, const void *data, size_t len, int binary)
{
  FILE *f = stdout;
  if (c->out_file && !(f = fopen(c->out_file, "wb"))) {
    fprintf(stderr, "flashjit emit: cannot write %s: %s\n", c->out_file,
            strerror(errno));
    return EXIT_FAIL;
  }
  if (binary && f == stdout && isatty(STDOUT_FILENO)) {
    fprintf(stderr, "flashjit emit: the cubin is binary: use -o FILE or a "
                    "redirection\n");
    return EXIT_USAGE;
  }
  int bad = fwrite(data, 1, len, f) != len;
  if (f != stdout)
    bad |= fclose(f) != 0;
  else
    bad |= fflush(f) != 0;
  if (bad) {
    fprintf(stderr, "flashjit emit: write failed: %s\n", strerror(errno));
    return EXIT_FAIL;
  }
  return 0;
}

static int print_resources(const cli *c, const fj_kernel *k,
                           const char *arch)
{
  fj_resources r;
  fj_kernel_resources(k, &r);
  char text[1024];
  int n = snprintf(
      text, sizeof text,
      "variant=%s\narch=%s\nregisters=%d\nshared_bytes=%d\nshared_static=%d\n"
      "shared_dynamic=%d\nspill_store_bytes=%d\nspill_load_bytes=%d\n"
      "local_bytes=%d\nthreads=%d\nbarriers=%d\ncubin_bytes=%zu\n"
      "ptx_bytes=%zu\ncompile_ms=%.1f\ncache=%s\n",
      fj_kernel_name(k), arch, r.registers, r.shared_static + r.shared_dynamic,
      r.shared_static, r.shared_dynamic, r.spill_store_bytes,
      r.spill_load_bytes, r.local_bytes, r.threads, r.barriers, r.cubin_bytes,
      r.ptx_bytes, r.compile_ms, r.cache == FJ_CACHE_MISS ? "miss" : "hit");
  return write_out(c, text, (size_t)n, 0);
}

static int emit_what(const cli *c, const fj_kernel *k, const char *arch)
{
  size_t len;
  const char *w = c->what ? c->what : "source";
  if (strcmp(w, "source") == 0) {
    const char *s = fj_kernel_source(k, &len);
    return write_out(c, s, len, 0);
  }
  if (strcmp(w, "ptx") == 0) {
    const char *s = fj_kernel_ptx(k, &len);
    return write_out(c, s, len, 0);
  }
  if (strcmp(w, "cubin") == 0) {
    const void *b = fj_kernel_cubin(k, &len);
    return write_out(c, b, len, 1);
  }
  if (strcmp(w, "log") == 0) {
    const char *s = fj_kernel_log(k);
    return write_out(c, s, strlen(s), 0);
  }
  if (strcmp(w, "resources") == 0)
    return print_resources(c, k, arch);
  return usage_error(c, "invalid value '%s' for --what: one of source, ptx, "
                        "cubin, resources, log",
                     w);
}

/* ---- emit --sweep -------------------------------------------------------------- */

/* The structural axes a sweep varies, each unless fixed by a flag. */
typedef struct sweep_axis {
  const char *flag;
  size_t offset;
  int values[4];
  int count;
} sweep_axis;

static const sweep_axis sweep_axes[] = {
    {"tile-m", OFF(v.tile_m), {64, 128}, 2},
    {"tile-n", OFF(v.tile_n), {32, 64, 128}, 3},
    {"warps", OFF(v.warps), {4, 8}, 2},
    {"stages", OFF(v.stages), {1, 2, 3}, 3},
    {"swizzle", OFF(v.swizzle), {FJ_SWIZZLE_NONE, FJ_SWIZZLE_PAD, FJ_SWIZZLE_XOR}, 3},
    {"softmax", OFF(v.softmax), {FJ_SOFTMAX_SMEM, FJ_SOFTMAX_REGS}, 2},
};
enum { SWEEP_AXES = sizeof sweep_axes / sizeof sweep_axes[0] };

/* All combinations, written into out (NULL: only counted). */
static size_t sweep_variants(const cli *c, fj_variant *out)
{
  size_t n = 1, count[SWEEP_AXES];
  for (size_t a = 0; a < SWEEP_AXES; a++) {
    count[a] = flag_given(c, sweep_axes[a].flag) ? 1 : (size_t)sweep_axes[a].count;
    n *= count[a];
  }
  for (size_t i = 0; out && i < n; i++) {
    cli tmp = *c;
    size_t rest = i;
    for (size_t a = 0; a < SWEEP_AXES; a++) {
      if (count[a] > 1)
        *(int *)(void *)((char *)&tmp + sweep_axes[a].offset) =
            sweep_axes[a].values[rest % count[a]];
      rest /= count[a];
    }
    out[i] = tmp.v;
  }
  return n;
}

static void sweep_progress(void *user, size_t done, size_t total)
{
  (void)user;
  if (isatty(STDERR_FILENO))
    fprintf(stderr, "\rcompiling: %zu/%zu", done, total);
  else if (done == total || done % 25 == 0)
    fprintf(stderr, "compiling: %zu/%zu\n", done, total);
}

static void sweep_line(fj_ctx *ctx, const fj_variant *v, fj_status st)
{
  char name[160];
  fj_variant_name(v, name, sizeof name);
  fj_kernel *k;
  if (st == FJ_OK)
    st = fj_kernel_get(ctx, v, &k);
  if (st != FJ_OK) {
    char why[160];
    fj_variant_check(ctx, v);
    snprintf(why, sizeof why, "%s", fj_errmsg(ctx));
    why[strcspn(why, "\n")] = '\0';
    printf("%-56s refused: %s\n", name, why);
    return;
  }
  fj_resources r;
  fj_kernel_resources(k, &r);
  printf("%-56s regs=%3d smem=%6d spill=%d/%d local=%d compile_ms=%.0f\n", name,
         r.registers, r.shared_static + r.shared_dynamic, r.spill_store_bytes,
         r.spill_load_bytes, r.local_bytes, r.compile_ms);
}

/* The sweep's variants, compiled in parallel; *st gets each one's status.
 * Returns how many (0 when out of memory). */
static size_t sweep_prepare(const cli *c, fj_ctx *ctx, fj_variant **vs,
                            fj_status **st)
{
  size_t n = sweep_variants(c, NULL);
  *vs = calloc(n, sizeof **vs);
  *st = calloc(n, sizeof **st);
  if (!*vs || !*st) {
    free(*vs);
    free(*st);
    return 0;
  }
  sweep_variants(c, *vs);
  fj_prepare_opts o = {c->workers, sweep_progress, NULL};
  fj_kernel_prepare(ctx, *vs, n, &o, *st);
  if (isatty(STDERR_FILENO))
    fputc('\n', stderr);
  return n;
}

static int emit_sweep(cli *c, fj_ctx *ctx)
{
  fj_variant *vs;
  fj_status *st;
  size_t n = sweep_prepare(c, ctx, &vs, &st);
  if (!n)
    return EXIT_FAIL;
  for (size_t i = 0; i < n; i++)
    sweep_line(ctx, &vs[i], st[i]);
  free(vs);
  free(st);
  return 0;
}

static int cmd_emit(cli *c)
{
  if (c->what && strcmp(c->what, "source") && strcmp(c->what, "ptx") &&
      strcmp(c->what, "cubin") && strcmp(c->what, "log") &&
      strcmp(c->what, "resources"))
    return usage_error(c, "invalid value '%s' for --what: one of source, ptx, "
                          "cubin, resources, log",
                       c->what);
  fj_ctx *ctx;
  int rc = open_ctx(c, -1, c->arch ? c->arch : "sm_90a", &ctx);
  if (rc)
    return rc;
  if (c->sweep) {
    rc = emit_sweep(c, ctx);
    fj_ctx_destroy(ctx);
    return rc;
  }
  fj_kernel *k;
  fj_status st = fj_kernel_get(ctx, &c->v, &k);
  rc = st == FJ_OK ? emit_what(c, k, fj_ctx_arch(ctx)) : fj_error(c, ctx, st);
  fj_ctx_destroy(ctx);
  return rc;
}

/* ---- run ------------------------------------------------------------------------------- */

typedef struct run_data {
  fj_problem p;
  size_t nq, nk, no;          /* elements */
  void *hq, *hk, *hv, *ho;    /* host, in the problem's dtypes */
  void *dq, *dk, *dv, *dout;  /* device */
  float *dlse, *hlse;
  float *hks, *hvs, *dks, *dvs;  /* FP8 K/V scales */
  size_t esize, kvsize;
  int nranges, ranges[3][2];     /* rows the check covers */
  double *ref[3], *ref_lse[3];   /* their reference */
} run_data;

static int cuda_failed(const char *what, cudaError_t e)
{
  fprintf(stderr, "flashjit run: %s failed: %s (%s)\n", what,
          cudaGetErrorName(e), cudaGetErrorString(e));
  return EXIT_FAIL;
}

#define CUDA_TRY(call)                   \
  do {                                   \
    cudaError_t e_ = (call);             \
    if (e_ != cudaSuccess)               \
      return cuda_failed(#call, e_);     \
  } while (0)

/* Elements spanned by a tensor with these strides (last index + 1). */
static size_t span(const int64_t s[3], int b, int h, int seq, int d)
{
  return (size_t)((b - 1) * s[0] + (h - 1) * s[1] + (seq - 1) * s[2] + d);
}

/* A small xorshift generator: inputs reproducible from --seed. */
static float next_uniform(uint64_t *state)
{
  uint64_t x = *state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  *state = x;
  return (float)((double)(x >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
}

static void *random_tensor(fj_dtype dtype, size_t n, float scale,
                           uint64_t *state)
{
  float *f = malloc(n * sizeof *f);
  void *out = malloc(n * 2 + 16);
  if (!f || !out) {
    free(f);
    free(out);
    return NULL;
  }
  for (size_t i = 0; i < n; i++)
    f[i] = next_uniform(state) * scale;
  fj_convert(dtype, out, FJ_F32, f, n);
  free(f);
  return out;
}

/* FP8 K/V: values spread over e4m3's range (x 64) with per-(batch, head)
 * scales of 1/64 that bring them back. */
static int run_fp8_scales(run_data *d)
{
  size_t n = (size_t)d->p.batch * (size_t)d->p.heads_kv;
  d->hks = malloc(n * sizeof(float));
  d->hvs = malloc(n * sizeof(float));
  if (!d->hks || !d->hvs)
    return EXIT_FAIL;
  for (size_t i = 0; i < n; i++)
    d->hks[i] = d->hvs[i] = 1.0f / 64;
  CUDA_TRY(cudaMalloc((void **)&d->dks, n * sizeof(float)));
  CUDA_TRY(cudaMalloc((void **)&d->dvs, n * sizeof(float)));
  CUDA_TRY(cudaMemcpy(d->dks, d->hks, n * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_TRY(cudaMemcpy(d->dvs, d->hvs, n * sizeof(float), cudaMemcpyHostToDevice));
  d->p.k_scale = d->dks;
  d->p.v_scale = d->dvs;
  return 0;
}

static int run_alloc(run_data *d, int seed)
{
  const fj_problem *p = &d->p;
  fj_dtype kv = p->kv_dtype ? p->kv_dtype : p->dtype;
  float kv_scale = kv == FJ_E4M3 ? 64.f : 1.f;
  d->esize = 2;
  d->kvsize = kv == FJ_E4M3 ? 1 : 2;
  d->nq = span(p->q_stride, p->batch, p->heads_q, p->seq_q, p->head_dim);
  d->nk = span(p->k_stride, p->batch, p->heads_kv, p->seq_kv, p->head_dim);
  d->no = span(p->o_stride, p->batch, p->heads_q, p->seq_q, p->head_dim);
  uint64_t state = UINT64_C(0x9e3779b97f4a7c15) ^ (uint64_t)seed;
  d->hq = random_tensor(p->dtype, d->nq, 1.f, &state);
  d->hk = random_tensor(kv, d->nk, kv_scale, &state);
  d->hv = random_tensor(kv, d->nk, kv_scale, &state);
  if (kv == FJ_E4M3 && run_fp8_scales(d))
    return EXIT_FAIL;
  d->ho = malloc(d->no * d->esize);
  size_t nlse = (size_t)p->batch * (size_t)p->heads_q * (size_t)p->seq_q;
  d->hlse = malloc(nlse * sizeof(float));
  if (!d->hq || !d->hk || !d->hv || !d->ho || !d->hlse) {
    fprintf(stderr, "flashjit run: out of host memory\n");
    return EXIT_FAIL;
  }
  CUDA_TRY(cudaMalloc(&d->dq, d->nq * d->esize));
  CUDA_TRY(cudaMalloc(&d->dk, d->nk * d->kvsize));
  CUDA_TRY(cudaMalloc(&d->dv, d->nk * d->kvsize));
  CUDA_TRY(cudaMalloc(&d->dout, d->no * d->esize));
  CUDA_TRY(cudaMalloc((void **)&d->dlse, nlse * sizeof(float)));
  CUDA_TRY(cudaMemcpy(d->dq, d->hq, d->nq * d->esize, cudaMemcpyHostToDevice));
  CUDA_TRY(cudaMemcpy(d->dk, d->hk, d->nk * d->kvsize, cudaMemcpyHostToDevice));
  CUDA_TRY(cudaMemcpy(d->dv, d->hv, d->nk * d->kvsize, cudaMemcpyHostToDevice));
  return 0;
}

static void run_free(run_data *d)
{
  free(d->hq);
  free(d->hk);
  free(d->hv);
  free(d->ho);
  free(d->hlse);
  free(d->hks);
  free(d->hvs);
  cudaFree(d->dks);
  cudaFree(d->dvs);
  for (int i = 0; i < 3; i++) {
    free(d->ref[i]);
    free(d->ref_lse[i]);
  }
  cudaFree(d->dq);
  cudaFree(d->dk);
  cudaFree(d->dv);
  cudaFree(d->dout);
  cudaFree(d->dlse);
}

/* One launch: variant v, or the library's choice when v is NULL. */
static fj_status launch_one(fj_ctx *ctx, run_data *d, const fj_variant *v,
                            float *lse)
{
  if (v)
    return fj_attention_fwd_variant(ctx, &d->p, v, d->dq, d->dk, d->dv,
                                    d->dout, lse, NULL);
  return fj_attention_fwd(ctx, &d->p, d->dq, d->dk, d->dv, d->dout, lse, NULL);
}

static fj_status run_once(const cli *c, fj_ctx *ctx, run_data *d, float *lse)
{
  return launch_one(ctx, d, c->variant_given ? &c->v : NULL, lse);
}

static int cmp_float(const void *a, const void *b)
{
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

static double problem_flops(const fj_problem *p)
{
  double f = 4.0 * p->batch * p->heads_q * (double)p->seq_q * p->seq_kv *
             p->head_dim;
  return p->causal != FJ_CAUSAL_NONE ? f / 2 : f;
}

typedef struct timing {
  double median_ms, min_ms;
} timing;

/* Median and minimum of `iters` launches of v (NULL: the library's
 * choice), each between two events, after `warmup` untimed ones. */
static fj_status time_variant(fj_ctx *ctx, run_data *d, const fj_variant *v,
                              int warmup, int iters, timing *t)
{
  cudaEvent_t e0, e1;
  float *ms = calloc((size_t)iters, sizeof *ms);
  if (!ms || cudaEventCreate(&e0) != cudaSuccess ||
      cudaEventCreate(&e1) != cudaSuccess) {
    free(ms);
    return FJ_ERR_NOMEM;
  }
  fj_status st = FJ_OK;
  for (int i = 0; i < warmup && st == FJ_OK; i++)
    st = launch_one(ctx, d, v, NULL);
  for (int i = 0; i < iters && st == FJ_OK; i++) {
    cudaEventRecord(e0, NULL);
    st = launch_one(ctx, d, v, NULL);
    cudaEventRecord(e1, NULL);
    cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms[i], e0, e1);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  qsort(ms, (size_t)iters, sizeof *ms, cmp_float);
  t->median_ms = ms[iters / 2];
  t->min_ms = ms[0];
  free(ms);
  return st;
}

static double tflops(const fj_problem *p, double ms)
{
  return problem_flops(p) / (ms * 1e-3) / 1e12;
}

/* Host time per call: launches queued without waiting, fewer than the
 * launch queue holds, after the kernel is in the memory cache; the best of
 * five rounds.  Includes cuLaunchKernel. */
static double host_us_per_call(fj_ctx *ctx, run_data *d, const fj_variant *v)
{
  enum { CALLS = 128, ROUNDS = 5 };
  double best = INFINITY;
  for (int r = 0; r < ROUNDS; r++) {
    cudaDeviceSynchronize();
    struct timespec a, z;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < CALLS; i++)
      launch_one(ctx, d, v, NULL);
    clock_gettime(CLOCK_MONOTONIC, &z);
    double us = ((double)(z.tv_sec - a.tv_sec) * 1e9 +
                 (double)(z.tv_nsec - a.tv_nsec)) / 1e3 / CALLS;
    best = us < best ? us : best;
  }
  cudaDeviceSynchronize();
  return best;
}

static int run_timed(const cli *c, fj_ctx *ctx, run_data *d)
{
  int iters = c->iters > 0 ? c->iters : 20;
  timing t;
  fj_status st = time_variant(ctx, d, c->variant_given ? &c->v : NULL,
                              c->warmup, iters, &t);
  if (st != FJ_OK)
    return fj_error(c, ctx, st);
  CUDA_TRY(cudaGetLastError());
  printf("time: median %.1f us, min %.1f us over %d runs; %.1f TFLOP/s\n",
         t.median_ms * 1e3, t.min_ms * 1e3, iters, tflops(&d->p, t.median_ms));
  printf("host: %.2f us per call (memory hit, cuLaunchKernel included)\n",
         host_us_per_call(ctx, d, c->variant_given ? &c->v : NULL));
  return 0;
}

/* Rows of every (batch, head) the check covers: all of them when the float64
 * reference is cheap, else three evenly spaced blocks (start, middle, end). */
static int check_ranges(const fj_problem *p, int ranges[3][2])
{
  double per_row = 2.0 * p->batch * p->heads_q * (double)p->seq_kv *
                   p->head_dim;
  int rows = (int)fmin((double)p->seq_q, 2e9 / per_row / 3);
  if (rows < 1)
    rows = 1;
  if ((double)p->seq_q * per_row <= 2e9 || rows * 3 >= p->seq_q) {
    ranges[0][0] = 0;
    ranges[0][1] = p->seq_q;
    return 1;
  }
  int mid = p->seq_q / 2 - rows / 2;
  int starts[3] = {0, mid, p->seq_q - rows};
  for (int i = 0; i < 3; i++) {
    ranges[i][0] = starts[i];
    ranges[i][1] = starts[i] + rows;
  }
  return 3;
}

typedef struct err_sum {
  double diff2, ref2, max_abs, lse_diff2, lse_ref2;
  size_t nonfinite, checked;
} err_sum;

static void compare_range(const run_data *d, const double *ref,
                          const double *ref_lse, int r0, int r1, err_sum *e)
{
  const fj_problem *p = &d->p;
  int rows = r1 - r0, dim = p->head_dim;
  float *row = malloc(sizeof *row * (size_t)dim);
  for (int b = 0; b < p->batch && row; b++)
    for (int h = 0; h < p->heads_q; h++)
      for (int r = 0; r < rows; r++) {
        size_t base = (size_t)(b * p->o_stride[0] + h * p->o_stride[1] +
                               (r0 + r) * p->o_stride[2]);
        fj_convert(FJ_F32, row, p->dtype, (const char *)d->ho + base * 2,
                   (size_t)dim);
        size_t ri = ((size_t)(b * p->heads_q + h) * (size_t)rows + (size_t)r);
        for (int x = 0; x < dim; x++) {
          double o = row[x], want = ref[ri * (size_t)dim + (size_t)x];
          if (!isfinite(o))
            e->nonfinite++;
          e->diff2 += (o - want) * (o - want);
          e->ref2 += want * want;
          e->max_abs = fmax(e->max_abs, fabs(o - want));
        }
        double l = d->hlse[(size_t)(b * p->heads_q + h) * (size_t)p->seq_q +
                           (size_t)(r0 + r)];
        if (isfinite(ref_lse[ri])) {
          e->lse_diff2 += (l - ref_lse[ri]) * (l - ref_lse[ri]);
          e->lse_ref2 += ref_lse[ri] * ref_lse[ri];
        } else if (isfinite(l)) {
          e->nonfinite++;
        }
        e->checked++;
      }
  free(row);
}

/* The float64 reference for the checked rows, computed once per run. */
static int reference_rows(run_data *d)
{
  const fj_problem *p = &d->p;
  if (d->nranges)
    return 0;
  d->nranges = check_ranges(p, d->ranges);
  for (int i = 0; i < d->nranges; i++) {
    int rows = d->ranges[i][1] - d->ranges[i][0];
    size_t cnt = (size_t)p->batch * (size_t)p->heads_q * (size_t)rows;
    d->ref[i] = malloc(cnt * (size_t)p->head_dim * sizeof(double));
    d->ref_lse[i] = malloc(cnt * sizeof(double));
    if (!d->ref[i] || !d->ref_lse[i] ||
        fj_reference_fwd(p, d->hq, d->hk, d->hv, d->hks, d->hvs,
                         d->ranges[i][0], d->ranges[i][1], d->ref[i],
                         d->ref_lse[i]) != FJ_OK) {
      fprintf(stderr, "flashjit run: the reference failed\n");
      return EXIT_FAIL;
    }
  }
  return 0;
}

/* Runs v (NULL: the library's choice) on poisoned outputs and compares O
 * and the log-sum-exp with the reference.  Prints one line unless quiet;
 * *rel gets the relative error.  0 on PASS. */
static int check_variant(const cli *c, fj_ctx *ctx, run_data *d,
                         const fj_variant *v, int quiet, double *rel_out)
{
  const fj_problem *p = &d->p;
  size_t nlse = (size_t)p->batch * (size_t)p->heads_q * (size_t)p->seq_q;
  /* Poison: 0xff bytes are NaN in f16 and bf16 (and in float32), so any
   * element the kernel fails to write shows up. */
  CUDA_TRY(cudaMemset(d->dout, 0xff, d->no * d->esize));
  CUDA_TRY(cudaMemset(d->dlse, 0xff, nlse * sizeof(float)));
  fj_status st = launch_one(ctx, d, v, d->dlse);
  if (st != FJ_OK)
    return fj_error(c, ctx, st);
  CUDA_TRY(cudaDeviceSynchronize());
  CUDA_TRY(cudaMemcpy(d->ho, d->dout, d->no * d->esize, cudaMemcpyDeviceToHost));
  CUDA_TRY(cudaMemcpy(d->hlse, d->dlse, nlse * sizeof(float),
                      cudaMemcpyDeviceToHost));
  if (reference_rows(d))
    return EXIT_FAIL;
  err_sum e = {0};
  for (int i = 0; i < d->nranges; i++)
    compare_range(d, d->ref[i], d->ref_lse[i], d->ranges[i][0],
                  d->ranges[i][1], &e);
  double rel = e.ref2 > 0 ? sqrt(e.diff2 / e.ref2) : sqrt(e.diff2);
  double lse_rel = e.lse_ref2 > 0 ? sqrt(e.lse_diff2 / e.lse_ref2) : 0;
  fj_dtype kv = p->kv_dtype ? p->kv_dtype : p->dtype;
  double limit = kv == FJ_E4M3 ? 3e-2 : 1e-2;
  int pass = e.nonfinite == 0 && rel < limit && lse_rel < 1e-3;
  *rel_out = rel;
  if (!quiet)
    printf("check: %zu of %d rows per (batch, head)%s; rel_err=%.3e "
           "max_abs_err=%.3e lse_rel_err=%.3e nonfinite=%zu -> %s\n",
           e.checked / (size_t)(p->batch * p->heads_q), p->seq_q,
           d->nranges > 1 ? " (start, middle, end)" : "", rel, e.max_abs,
           lse_rel, e.nonfinite, pass ? "PASS" : "FAIL");
  return pass ? 0 : EXIT_FAIL;
}

static int run_problem(cli *c, run_data *d)
{
  fj_problem *p = &d->p;
  int b = c->shape[0], h = c->shape[1], s = c->shape[2], dim = c->shape[3];
  int hkv = c->heads_kv ? c->heads_kv : h, skv = c->seq_kv ? c->seq_kv : s;
  if (c->head_dim_given && c->v.head_dim != dim)
    return usage_error(c, "--head-dim %d contradicts --shape's D = %d",
                       c->v.head_dim, dim);
  c->v.head_dim = dim;
  fj_problem_init(p, b, h, hkv, s, skv, dim, c->v.dtype, c->order);
  p->causal = c->v.causal;
  p->kv_dtype = c->v.kv_dtype;
  return 0;
}

static int run_report(cli *c, fj_ctx *ctx, run_data *d)
{
  fj_variant v = c->v;
  fj_choice from = FJ_CHOICE_HEURISTIC;
  fj_status st = c->variant_given ? fj_problem_check(ctx, &d->p)
                                  : fj_attention_variant(ctx, &d->p, &v, &from);
  if (st != FJ_OK)
    return fj_error(c, ctx, st);
  char name[160];
  fj_variant_name(&v, name, sizeof name);
  fj_device_info info;
  fj_device_get(ctx, &info);
  printf("device: %s (%s)\nproblem: B=%d H=%d Hkv=%d Sq=%d Skv=%d D=%d %s "
         "causal=%s layout=%s\nvariant: %s (%s)\n",
         info.name, fj_ctx_arch(ctx), d->p.batch, d->p.heads_q,
         d->p.heads_kv, d->p.seq_q, d->p.seq_kv, d->p.head_dim,
         fj_dtype_name(d->p.dtype), fj_causal_name(d->p.causal),
         c->order == FJ_BSHD ? "bshd" : "bhsd", name,
         c->variant_given ? "given" : from == FJ_CHOICE_TUNED ? "tuned"
                                                              : "heuristic");
  struct timespec a, z;
  clock_gettime(CLOCK_MONOTONIC, &a);
  st = run_once(c, ctx, d, NULL);
  if (st != FJ_OK)
    return fj_error(c, ctx, st);
  CUDA_TRY(cudaDeviceSynchronize());
  clock_gettime(CLOCK_MONOTONIC, &z);
  printf("first call (compile or cache fetch, load, run): %.1f ms\n",
         (double)(z.tv_sec - a.tv_sec) * 1e3 +
             (double)(z.tv_nsec - a.tv_nsec) * 1e-6);
  return 0;
}

/* run --sweep: every combination emit --sweep would compile, timed on this
 * problem (and checked with --check), one line each, the fastest last. */
static void sweep_time_line(const cli *c, fj_ctx *ctx, run_data *d,
                            const fj_variant *v, fj_status st, int iters,
                            double *best_ms, fj_variant *best)
{
  char name[160];
  fj_variant_name(v, name, sizeof name);
  timing t;
  if (st == FJ_OK)
    st = time_variant(ctx, d, v, 2, iters, &t);
  if (st != FJ_OK) {
    /* The batch compile kept no message per variant: ask again. */
    char why[160];
    int rechecked = fj_variant_check(ctx, v) != FJ_OK;
    snprintf(why, sizeof why, "%s", rechecked ? fj_errmsg(ctx) : fj_status_str(st));
    why[strcspn(why, "\n")] = '\0';
    printf("%-56s refused: %s\n", name, why);
    return;
  }
  double rel = 0;
  int fail = c->check ? check_variant(c, ctx, d, v, 1, &rel) : 0;
  printf("%-56s %9.1f us %7.1f TFLOP/s", name, t.median_ms * 1e3,
         tflops(&d->p, t.median_ms));
  if (c->check)
    printf("  rel_err=%.2e %s", rel, fail ? "FAIL" : "ok");
  printf("\n");
  if (!fail && t.median_ms < *best_ms) {
    *best_ms = t.median_ms;
    *best = *v;
  }
}

static int run_sweep(const cli *c, fj_ctx *ctx, run_data *d)
{
  fj_variant *vs, best;
  fj_status *st;
  size_t n = sweep_prepare(c, ctx, &vs, &st);
  if (!n)
    return EXIT_FAIL;
  double best_ms = INFINITY;
  for (size_t i = 0; i < n; i++)
    sweep_time_line(c, ctx, d, &vs[i], st[i], c->iters > 0 ? c->iters : 10,
                    &best_ms, &best);
  if (isfinite(best_ms)) {
    char name[160];
    fj_variant_name(&best, name, sizeof name);
    printf("fastest: %s %.1f us %.1f TFLOP/s\n", name, best_ms * 1e3,
           tflops(&d->p, best_ms));
  }
  free(vs);
  free(st);
  return 0;
}

/* Checks the problem before looking for a GPU, so that bad input is
 * reported as bad input on any machine. */
static int run_validate(cli *c, const fj_problem *p)
{
  fj_ctx *ctx;
  int rc = open_ctx(c, -1, "sm_90a", &ctx);
  if (rc)
    return rc;
  /* FP8 scales are allocated later; only their presence is checked here. */
  static const float placeholder[1];
  fj_problem check = *p;
  if (check.kv_dtype == FJ_E4M3)
    check.k_scale = check.v_scale = placeholder;
  fj_status st = fj_problem_check(ctx, &check);
  if (st != FJ_OK)
    rc = fj_error(c, ctx, st);
  fj_ctx_destroy(ctx);
  return rc;
}

/* A timed (and, with --check, checked) run of one variant, or a sweep. */
static int run_on_device(cli *c, fj_ctx *ctx, run_data *d)
{
  CUDA_TRY(cudaSetDevice(c->device));
  int rc = run_alloc(d, c->seed ? c->seed : 1);
  if (rc)
    return rc;
  if (c->sweep)
    return run_sweep(c, ctx, d);
  double rel;
  if ((rc = run_report(c, ctx, d)) == 0 && (rc = run_timed(c, ctx, d)) == 0 &&
      c->check)
    rc = check_variant(c, ctx, d, c->variant_given ? &c->v : NULL, 0, &rel);
  return rc;
}

/* The problem of --shape and friends, checked without a GPU, and a context
 * on the device (run and tune). */
static int problem_on_device(cli *c, run_data *d, fj_ctx **ctx)
{
  memset(d, 0, sizeof *d);
  int rc = run_problem(c, d);
  if (!rc)
    rc = run_validate(c, &d->p);
  return rc ? rc : open_ctx(c, c->device, NULL, ctx);
}

static int cmd_run(cli *c)
{
  if (!c->shape_given)
    return usage_error(c, "--shape B,H,S,D is required");
  run_data d;
  fj_ctx *ctx;
  int rc = problem_on_device(c, &d, &ctx);
  if (rc)
    return rc;
  rc = run_on_device(c, ctx, &d);
  run_free(&d);
  fj_ctx_destroy(ctx);
  return rc;
}

/* ---- lut --------------------------------------------------------------------------------- */

static const char *origin_text(fj_lut_origin o)
{
  switch (o) {
  case FJ_LUT_PROBED: return "probed on this device now";
  case FJ_LUT_CACHED: return "from the cache (probed on this device earlier)";
  case FJ_LUT_REFERENCE: return "reference table (compile-only: not observed)";
  }
  return "?";
}

static void print_lut(const fj_lut *l)
{
  printf("fragment %s: %dx%d tile, %d slots per lane; %s; device %s\n",
         fj_frag_name(l->frag), l->rows, l->cols, l->slots,
         origin_text(l->origin), l->device);
  printf("lane: (row,col) of slot 0..%d\n", l->slots - 1);
  for (int lane = 0; lane < 32; lane++) {
    printf("%4d:", lane);
    for (int s = 0; s < l->slots; s++)
      printf(" (%2d,%2d)", l->map[lane][s] / l->cols, l->map[lane][s] % l->cols);
    printf("\n");
  }
}

static int cmd_lut(cli *c)
{
  fj_ctx *ctx;
  int rc = open_ctx(c, c->arch ? -1 : c->device, c->arch, &ctx);
  if (rc)
    return rc;
  int shown = 0;
  for (int f = 1; f <= FJ_FRAG_COUNT && !rc; f++) {
    if (c->frag && strcmp(c->frag, fj_frag_name((fj_frag)f)) != 0)
      continue;
    fj_lut l;
    fj_status st = fj_layout_get(ctx, (fj_frag)f, &l);
    if ((st == FJ_ERR_COMPILE_ONLY || st == FJ_ERR_UNSUPPORTED) && !c->frag)
      continue;  /* no table for this kind here (no reference, or a kind
                    that needs sm_80); the others still print */
    if (st != FJ_OK)
      rc = fj_error(c, ctx, st);
    else
      print_lut(&l);
    shown++;
  }
  if (!shown && !rc)
    rc = usage_error(c, "unknown fragment kind '%s'", c->frag);
  fj_ctx_destroy(ctx);
  return rc;
}

/* ---- cache ------------------------------------------------------------------------------- */

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
  printf("%-40s %-6s %9llu %s %s%s\n", e->file, e->kind,
         (unsigned long long)e->bytes, when, e->label,
         e->valid ? "" : " (corrupt)");
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

static int cmd_cache(cli *c)
{
  const char *a = c->action;
  if (!a || (strcmp(a, "dir") && strcmp(a, "ls") && strcmp(a, "stats") &&
             strcmp(a, "clear")))
    return usage_error(c, "expected one of dir, ls, stats, clear%s%s%s",
                       a ? " (not '" : "", a ? a : "", a ? "')" : "");
  fj_ctx *ctx;
  int rc = open_ctx(c, -1, "sm_90a", &ctx);
  if (rc)
    return rc;
  const char *dir = fj_cache_dir(ctx);
  fj_status st = FJ_OK;
  if (!strcmp(a, "dir")) {
    printf("%s\n", dir ? dir : "(disk cache disabled)");
  } else if (!strcmp(a, "ls")) {
    st = fj_cache_list(ctx, list_entry, NULL);
  } else if (!strcmp(a, "stats")) {
    cache_tally t = {0};
    st = fj_cache_list(ctx, tally_entry, &t);
    if (st == FJ_OK)
      printf("dir=%s\nentries=%d\nkernels=%d\nluts=%d\ncorrupt=%d\nbytes=%llu\n",
             dir, t.entries, t.kernels, t.luts, t.invalid,
             (unsigned long long)t.bytes);
  } else {
    int removed = 0;
    st = fj_cache_clear(ctx, &removed);
    if (st == FJ_OK)
      printf("removed %d file(s) from %s\n", removed, dir);
  }
  if (st != FJ_OK)
    rc = fj_error(c, ctx, st);
  fj_ctx_destroy(ctx);
  return rc;
}

/* ---- tune ------------------------------------------------------------------------------------ */

typedef struct tune_progress_state {
  double start;
} tune_progress_state;

static double wall_s(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A bar with an ETA on a terminal; a plain line every tenth otherwise. */
static void tune_progress(void *user, size_t done, size_t total)
{
  tune_progress_state *s = user;
  double elapsed = wall_s() - s->start, frac = total ? (double)done / (double)total : 1;
  double eta = frac > 0 ? elapsed / frac - elapsed : 0;
  if (isatty(STDERR_FILENO)) {
    char bar[41];
    int fill = (int)(frac * 40);
    for (int i = 0; i < 40; i++)
      bar[i] = i < fill ? '#' : '.';
    bar[40] = '\0';
    fprintf(stderr, "\rtuning [%s] %zu/%zu %s, %.0f s left   ", bar, done, total,
            done * 2 <= total ? "compiling" : "timing", eta);
  } else if (total && (done * 10 / total != (done - 1) * 10 / total || done == total)) {
    fprintf(stderr, "tuning: %zu/%zu steps, %.0f s elapsed, about %.0f s left\n",
            done, total, elapsed, eta);
  }
}

static int show_entry(void *user, const fj_tune_entry *e)
{
  (void)user;
  const fj_variant *v = &e->variant;
  printf("%s\n    m%d n%d w%d s%d %s %s %s: %.3f ms (heuristic %.3f ms, %.2fx) "
         "tuned on %s, %s\n",
         e->key, v->tile_m, v->tile_n, v->warps, v->stages,
         fj_swizzle_name(v->swizzle), fj_softmax_name(v->softmax),
         fj_mma_name(v->mma), e->ms, e->default_ms,
         e->ms > 0 ? e->default_ms / e->ms : 0, e->shape ? e->shape : "?",
         e->date ? e->date : "?");
  return 0;
}

static int tune_show(cli *c)
{
  fj_ctx *ctx;
  int rc = open_ctx(c, -1, "sm_90a", &ctx);
  if (rc)
    return rc;
  fj_status st = fj_tune_list(ctx, show_entry, NULL);
  if (st != FJ_OK)
    rc = fj_error(c, ctx, st);
  fj_ctx_destroy(ctx);
  return rc;
}

static void tune_print(const run_data *d, const fj_variant *best,
                       const fj_tune_report *r, fj_ctx *ctx, int saved)
{
  char name[160], heur[160];
  fj_variant h;
  fj_variant_name(best, name, sizeof name);
  fj_attention_variant(ctx, &d->p, &h, NULL);
  fj_variant_name(&h, heur, sizeof heur);
  printf("best:      %s %.3f ms (%.1f TFLOP/s)\n", name, r->best_ms,
         tflops(&d->p, r->best_ms));
  printf("heuristic: %.3f ms (%.1f TFLOP/s): the best is %.2fx faster\n",
         r->default_ms, tflops(&d->p, r->default_ms), r->default_ms / r->best_ms);
  printf("candidates %d: refused %d, failed %d, wrong output %d, timed %d\n",
         r->candidates, r->refused, r->failed, r->wrong, r->timed);
  printf("compile %.1f s, total %.1f s%s%s\n", r->compile_s, r->total_s,
         saved ? "; recorded in " : "", saved ? fj_cache_dir(ctx) : "");
  (void)heur;
}

static int cmd_tune(cli *c)
{
  if (c->show)
    return tune_show(c);
  if (!c->shape_given)
    return usage_error(c, "--shape B,H,S,D is required (or --show)");
  run_data d;
  fj_ctx *ctx;
  c->variant_given = 0;
  int rc = problem_on_device(c, &d, &ctx);
  if (rc)
    return rc;
  tune_progress_state ps = {wall_s()};
  fj_tune_opts o;
  fj_tune_opts_init(&o);
  o.iters = c->iters > 0 ? c->iters : 10;
  o.workers = c->workers;
  o.save = !c->no_save;
  o.progress = tune_progress;
  o.user = &ps;
  fj_variant best;
  fj_tune_report r;
  fj_status st = fj_tune(ctx, &d.p, &o, &best, &r);
  if (isatty(STDERR_FILENO))
    fputc('\n', stderr);
  if (st != FJ_OK)
    rc = fj_error(c, ctx, st);
  else
    tune_print(&d, &best, &r, ctx, o.save && fj_cache_dir(ctx));
  fj_ctx_destroy(ctx);
  return rc;
}

/* ---- main ---------------------------------------------------------------------------------- */

static const struct {
  const char *name;
  unsigned cmd;
  int (*fn)(cli *);
  const char *synopsis;
} commands[] = {
    {"emit", CMD_EMIT, cmd_emit,
     "render and compile a variant; print its source, PTX, cubin, resources "
     "or log (no GPU needed)"},
    {"run", CMD_RUN, cmd_run,
     "run attention on the GPU: time it, and with --check compare it with "
     "the float64 reference"},
    {"lut", CMD_LUT, cmd_lut,
     "print the fragment-layout table (probed on the GPU; --arch gives the "
     "reference)"},
    {"cache", CMD_CACHE, cmd_cache, "dir | ls | stats | clear"},
    {"tune", CMD_TUNE, cmd_tune,
     "autotune a problem class on the GPU and record the winner (--show "
     "lists the database)"},
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
}

/* The default variant for the head dim, dtype and mask asked for, with the
 * variant flags that were given on top. */
static void apply_defaults(cli *c)
{
  fj_variant given = c->v;
  fj_variant_default(&c->v, given.head_dim, given.dtype, given.causal);
  static const char *const axes[] = {"tile-m", "tile-n", "warps", "stages",
                                     "swizzle", "softmax", "mma", "kv-dtype"};
  if (given.kv_dtype == FJ_E4M3)
    c->v.stages = 1;  /* as the library's own choice does */
  for (size_t i = 0; i < sizeof axes / sizeof axes[0]; i++) {
    const flag_def *f = find_flag(axes[i], strlen(axes[i]));
    if (flag_given(c, axes[i]))
      *field(c, f) = *(const int *)(const void *)((const char *)&given +
                                                  (f->offset - OFF(v)));
  }
}

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
      return usage_error(c, "unexpected argument '%s'", a);
    }
  }
  apply_defaults(c);
  return 0;
}

int main(int argc, char **argv)
{
  cli c;
  cli_defaults(&c);
  if (argc < 2)
    return usage_error(&c, "usage: flashjit <command> [options]; commands: "
                           "emit, run, lut, cache, tune (see flashjit --help)");
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "help") ||
      !strcmp(argv[1], "-h")) {
    print_help(argc > 2 ? argv[2] : NULL);
    return 0;
  }
  if (!strcmp(argv[1], "--version")) {
    printf("flashjit %s\n", fj_version());
    return 0;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(argv[1], commands[i].name)) {
      c.cmd_name = commands[i].name;
      c.cmd = commands[i].cmd;
      int rc = parse_args(&c, argc, argv);
      if (rc)
        return rc < 0 ? 0 : rc;
      return commands[i].fn(&c);
    }
  return usage_error(&c, "unknown command '%s': one of emit, run, lut, cache, tune",
                     argv[1]);
}
