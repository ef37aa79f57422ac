/*
 * cli.h -- what the files of the flashjit command-line tool share: the parsed
 * command line, the problem of `run` and `tune`, and the helpers that more
 * than one subcommand calls.
 */
#ifndef FLASHJIT_CLI_H
#define FLASHJIT_CLI_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "flashjit.h"

/* Exit status: 0 success, 1 failure (a check that FAILs, a compile error,
 * no GPU), 2 bad input (unknown flag, bad value, a refused variant). */
enum { EXIT_FAIL = 1, EXIT_USAGE = 2 };

enum {
  CMD_EMIT = 1,
  CMD_RUN = 2,
  CMD_LUT = 4,
  CMD_CACHE = 8,
  CMD_TUNE = 16,
  CMD_PLAN = 32,
  CMD_VARIANT = CMD_EMIT | CMD_RUN,
  CMD_PROBLEM = CMD_RUN | CMD_TUNE | CMD_PLAN,
  CMD_MODS = CMD_EMIT | CMD_RUN | CMD_PLAN | CMD_TUNE,
  CMD_ALL = 63
};

/* One entry of --varlen: a sequence's queries and keys. */
typedef struct seq_len {
  int q, kv;
} seq_len;

/* One --param as given: its own copy of the text, into which the
 * parameter's name points (cut at its ':' or '='), and for a tensor read
 * from a file, the file (NULL: random from --seed). */
typedef struct param_arg {
  char *text;        /* owned; cli_release frees it */
  const char *file;  /* into text */
} param_arg;

typedef struct cli {
  const char *cmd_name;
  unsigned cmd;
  const char *action;     /* cache dir|ls|stats|clear|prune|prewarm|export|import */
  const char *cache_file; /* cache export|import FILE */
  /* variant */
  fj_variant v;
  int variant_given;      /* a structural axis given (--tile-m ...): emit
                             and run take c->v, not the library's choice */
  /* context */
  const char *arch;
  int device;
  const char *cache_dir;
  int no_disk_cache;
  int isolate;
  int jit_tiers;          /* --jit-tiers (run) */
  int first;              /* --first (emit): the tiered JIT's first kernel */
  int rel_table;          /* --rel-table (emit): the relative table's kernel */
  int backward;           /* --backward (emit, plan): the backward's kernels */
  int deterministic;      /* --deterministic (run, plan with --backward):
                             fj_problem.deterministic */
  int verbose;
  /* emit */
  const char *what;
  const char *out_file;
  int sweep;
  int workers;
  unsigned long long given[2];  /* bit i % 64 of word i / 64: flags[i]
                                   appeared */
  /* run */
  int shape[4];           /* B, H, S, D */
  int shape_given;
  int seq_kv;
  int heads_kv;
  const char *varlen;     /* --varlen as given, for the report */
  seq_len *lens;          /* --varlen's entries (owned; cli_release frees) */
  int nlens;
  int page_size;          /* --page-size: 0 for dense K/V */
  int latent;             /* --latent: V is K's first head_dim_v columns */
  int splits;             /* fj_problem.splits: 0 auto */
  int sms;                /* plan: multiprocessors of a compile-only target */
  fj_order order;
  fj_scale_layout scale_layout;  /* --fp8-scales */
  float o_scale;                 /* --o-scale (run; an e4m3 O's) */
  int check;
  int iters;
  int warmup;
  int seed;
  /* --score-mod, --mask-mod, --window, --softcap, --param (run, plan,
   * emit): one fj_mods whose params are `params`, tensors without data
   * (run uploads copies: run_data) */
  fj_mods mods;
  fj_mod_param params[FJ_MOD_PARAMS_MAX];
  param_arg param_args[FJ_MOD_PARAMS_MAX];
  /* --sinks VALUE: one logit for every head; mods.sinks points here (a
   * pointer that only switches the form on: run uploads heads_q copies) */
  float sink;
  fj_block_mask bmask;    /* --block-mask: sizes here, the rest per problem */
  int mods_on;            /* some modification is on: problem.mods and
                             variant.mods point at mods */
  /* lut */
  const char *frag;
  /* cache prewarm: the lists as given (cli_cache.c parses them) */
  const char *heads_list;
  const char *dtypes_list;
  const char *causals_list;
  int from_tune_db;
  int verify;        /* cache import --verify */
  const char *package;    /* prewarm --package DIR */
  /* tune */
  int show;
  int no_save;
} cli;

/* The offset of a cli field, for the flag and sweep-axis tables. */
#define OFF(field_) offsetof(cli, field_)

/* The index arrays of a varlen or paged problem (NULL where the problem
 * has none): on the host, or their copies on the device. */
typedef struct seq_index {
  int32_t *cu_q, *cu_kv, *used_kv, *table;
} seq_index;

/* Rows r0..r1 - 1 of sequences b0..b1 - 1, which the check compares, and
 * their float64 reference ([b1 - b0][heads_q][r1 - r0][head_dim]). */
typedef struct check_block {
  int b0, b1, r0, r1;
  double *ref, *lse;
} check_block;

/* The problem of `run` and `tune` and, for `run`, its buffers. */
/* V's and O's head dim: head_dim_v, or head_dim where it is 0. */
static inline int cli_head_dim_v(const fj_problem *p)
{
  return p->head_dim_v ? p->head_dim_v : p->head_dim;
}

/* O's element: o_dtype, or dtype's where it is 0 (bf16 for e4m3). */
static inline fj_dtype cli_o_dtype(const fj_problem *p)
{
  if (p->o_dtype)
    return p->o_dtype;
  return p->dtype == FJ_E4M3 ? FJ_BF16 : p->dtype;
}

typedef struct run_data {
  fj_problem p;               /* its index arrays: the device's (dix) */
  seq_index hix, dix;         /* --varlen, --page-size */
  size_t nq, nk, nv, no;      /* elements (V: nv, head_dim_v columns) */
  void *hq, *hk, *hv, *ho;    /* host, in the problem's dtypes */
  void *dq, *dk, *dv, *dout;  /* device */
  float *dlse, *hlse;
  float *hks, *hvs, *dks, *dvs;  /* FP8 K/V scales */
  float *hqs, *dqs;              /* FP8 attention (--dtype e4m3): Q's scales */
  /* The modifications with --param's tensors in host memory (for the
   * reference) and in device memory (p.mods points at dmods). */
  fj_mods hmods, dmods;
  fj_mod_param hparams[FJ_MOD_PARAMS_MAX], dparams[FJ_MOD_PARAMS_MAX];
  float *hsinks, *dsinks;        /* --sinks: heads_q logits each */
  fj_block_mask dbm, hbm;        /* --block-mask: built, and downloaded */
  void *dbm_buf, *hbm_buf;
  size_t esize, kvsize;
  check_block *blocks;           /* rows the check covers, computed once */
  int nblocks;
  int sampled;                   /* 1: some rows of each sequence, not all */
  int latent;                    /* --latent: hv and dv are hk and dk */
  /* FP8 attention (--dtype e4m3): O's amax, and an e4m3 O's scale
   * (--o-scale), device floats (p.o_amax, p.o_scale). */
  float o_scale;
  float *damax, *dos;
} run_data;

/* ---- cli_args.c: the command line ------------------------------------------------ */

/* Parses argv: 0 to run c->cmd, -1 after help/version, else the exit status. */
int cli_parse(cli *c, int argc, char **argv);

/* s as it may appear inside a one-line message: control characters
 * escaped, cut after 200 bytes (the length said); written into out. */
const char *cli_quote(const char *s, char *out, size_t size);

/* text with every control character escaped (\n, \t, \xNN), into out. */
const char *cli_one_line(const char *text, char *out, size_t size);

/* Prints "flashjit CMD: message" on stderr in one line (control characters
 * escaped); returns EXIT_USAGE. */
int cli_usage_error(const cli *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Reports a library failure: bad input exits 2, anything else 1. */
int cli_fj_error(const cli *c, const fj_ctx *ctx, fj_status st);

/* Whether --name appeared on the command line. */
int cli_flag_given(const cli *c, const char *name);

/* The option parsers' shared pieces (cli_args.c): a table of names and
 * their values, a flag's definition (opaque outside cli_args.c), the
 * usage error of a bad value, a name looked up in a table (0, or -1), one
 * count of digits only up to INT_MAX (-1 for anything else). */
typedef struct name_value {
  const char *name;
  int value;
} name_value;
typedef struct flag_def flag_def;
int cli_bad_value(const cli *c, const flag_def *f, const char *value,
                  const char *allowed);  /* cli_values.c */
int cli_parse_name(const name_value *table, size_t n, const char *s, int *out);
int cli_parse_count(const char *s, size_t len);

/* The options of modifications (cli_mods.c): --window, --softcap, --sinks
 * and --param as flag setters, whether some modification is on, and the check
 * once every flag is in (0, or the exit status). */
int cli_set_window(cli *c, const flag_def *f, const char *value);
int cli_set_softcap(cli *c, const flag_def *f, const char *value);
int cli_set_o_scale(cli *c, const flag_def *f, const char *value);
int cli_set_block_mask(cli *c, const flag_def *f, const char *value);
int cli_set_checked(cli *c, const flag_def *f, const char *value);
int cli_set_mod(cli *c, const flag_def *f, const char *value);
/* A problem's block mask (--block-mask): its shape for p; run builds its
 * lists on the GPU (cli_problem.c). */
void cli_block_mask_shape(cli *c, const fj_problem *p);
int cli_set_sinks(cli *c, const flag_def *f, const char *value);
int cli_set_param(cli *c, const flag_def *f, const char *value);
int cli_mods_active(const fj_mods *m);
int cli_finish_mods(cli *c);

/* "f32", "f16", "bf16", "i32" ("?" for others). */
const char *cli_mod_type_name(fj_mod_type t);

/* Bytes of a --param tensor's data (SIZE_MAX when they would not fit in
 * a size_t). */
size_t cli_param_bytes(const fj_mod_param *p);

/* Frees what cli_parse allocated (--varlen's entries, --param's texts). */
void cli_release(cli *c);

/* Opens a context (device, or arch compile-only); 0 or the exit status. */
int cli_open_ctx(cli *c, int device, const char *arch, fj_ctx **ctx);

/* ---- cli_emit.c: emit, and the sweep that run shares ------------------------------ */

/* flashjit emit: one variant's source, PTX, cubin, resources or log. */
int cli_cmd_emit(cli *c);

/* Compiles the sweep's variants in parallel; their count (0: out of memory). */
size_t cli_sweep_prepare(const cli *c, fj_ctx *ctx, fj_variant **vs,
                         fj_status **st);

/* The line of a sweep's variant that did not build or run (status st):
 * "refused" with the check's message, or "failed" with the status where
 * the check accepts it.  Returns 1 for failed (the sweep exits 1), 0. */
int cli_sweep_unbuilt(fj_ctx *ctx, const fj_variant *v, fj_status st,
                      const char *name);

/* A sweep that could not do what it should have: one line on stderr,
 * "flashjit <who> --sweep: <why>"; returns EXIT_FAIL. */
int cli_sweep_failed(const char *who, const char *why);

/* ---- cli_problem.c: the problem, its inputs and the reference check ---------------- */

/* Reports a failed CUDA runtime call; returns EXIT_FAIL. */
int cli_cuda_failed(const char *what, cudaError_t e);

#define CUDA_TRY(call)                   \
  do {                                   \
    cudaError_t e_ = (call);             \
    if (e_ != cudaSuccess)               \
      return cli_cuda_failed(#call, e_); \
  } while (0)

/* The problem of --shape and friends (not checked); 0 or the exit status.
 * With --varlen or --page-size its index arrays point at a placeholder (the
 * plan looks only at which are set): cli_problem_on_device fills them. */
int cli_problem(cli *c, fj_problem *p);

/* Sequence b's queries and keys in d's problem (the host index arrays). */
int cli_len_q(const run_data *d, int b);
int cli_len_kv(const run_data *d, int b);

/* The problem of --shape, checked with no GPU, and a context on the device. */
int cli_problem_on_device(cli *c, run_data *d, fj_ctx **ctx);

/* Random inputs from seed, on the host and on the current device. */
int cli_run_alloc(run_data *d, int seed);
/* The seeded random numbers of the inputs (xorshift, reproducible from
 * --seed): the state seed starts from, the next 64 bits, uniform floats in
 * [-1, 1), n of them times scale converted to dtype (malloc'd). */
uint64_t cli_seed_state(int seed);
uint64_t cli_next_u64(uint64_t *state);
float cli_next_uniform(uint64_t *state);
void *cli_random_tensor(fj_dtype dtype, size_t n, float scale, uint64_t *state);
/* d's problem with the host index arrays in place of the device's (for
 * the reference). */
fj_problem cli_host_problem(const run_data *d);
/* Pages of n tokens that len keys take. */
long long cli_pages_for(long long len, int n);
/* The host index arrays of d's problem where cli_problem set a
 * placeholder (--varlen, --page-size), checked as the library checks
 * them; 0 or the exit status.  cli_index_free frees them. */
int cli_index_make(const cli *c, run_data *d, int seed);
void cli_index_free(seq_index *ix);
/* Frees --block-mask's lists (cli_run_block_mask's). */
void cli_free_blocks(run_data *d);

/* --param's tensors (random from seed, or read from their files) on the
 * host and on the current device, and d's problem pointing at them. */
int cli_run_mods(const cli *c, run_data *d, int seed);

/* Frees what cli_run_alloc and the check allocated. */
void cli_run_free(run_data *d);
/* --block-mask: the problem's lists built on the GPU (and downloaded for
 * the reference); 0 or the exit status. */
int cli_run_block_mask(const cli *c, fj_ctx *ctx, run_data *d);

/* One launch: variant v, or the library's choice when v is NULL. */
fj_status cli_launch_one(fj_ctx *ctx, run_data *d, const fj_variant *v,
                         float *lse);

/* Runs v and compares it with the float64 reference; 0 on PASS. */
int cli_check_variant(const cli *c, fj_ctx *ctx, run_data *d,
                      const fj_variant *v, int quiet, double *rel_out);

/* The problem's rate in TFLOP/s at ms milliseconds a call (from each
 * sequence's own lengths). */
double cli_tflops(const run_data *d, double ms);

/* ---- the other subcommands, one file each ----------------------------------------- */

/* flashjit run (cli_run.c): time a variant on the GPU, check it, or sweep. */
int cli_cmd_run(cli *c);

/* run's timing (cli_run.c): the median and minimum of `iters` calls of
 * call(arg), each between two events on the default stream, after
 * `warmup` untimed ones; the first failing call's status. */
typedef struct cli_timing {
  double median_ms, min_ms;
} cli_timing;
typedef fj_status (*cli_call_fn)(void *arg);
fj_status cli_time_calls(cli_call_fn call, void *arg, int warmup, int iters,
                         cli_timing *t);

/* run's first lines (cli_run.c): the device, and the problem with its
 * layout and modifications. */
void cli_print_problem(const cli *c, fj_ctx *ctx, const run_data *d);

/* flashjit run --backward (cli_run_bwd.c): the library's backward after
 * one forward, timed, and with --check against the float64 reference;
 * d's problem is on the device (cli_problem_on_device). */
int cli_run_backward(cli *c, fj_ctx *ctx, run_data *d);

/* What run --backward and tune --backward refuse before a GPU is looked
 * for (cli_run_bwd.c): the backward's plan of p on ctx (compile-only),
 * and with --check a problem too large for the host's reference; 0 or
 * the exit status. */
int cli_backward_validate(cli *c, fj_ctx *ctx, const fj_problem *p);

/* flashjit tune (cli_tune.c): autotune a problem, or list the database. */
int cli_cmd_tune(cli *c);

/* flashjit cache (cli_cache.c): dir, ls, stats or clear the disk cache;
 * prewarm it, export it to a file or import one. */
int cli_cmd_cache(cli *c);

/* flashjit lut (cli_lut.c): print the fragment-layout tables. */
int cli_cmd_lut(cli *c);

/* flashjit plan (cli_plan.c): what the library would launch, no GPU. */
int cli_cmd_plan(cli *c);

/* The modifications that are on, as key=value (window=128,0 softcap=30
 * score_mod=... mask_mod=... params=NAME:TYPE:RANK,...), each between
 * before and after (cli_plan.c; run's report prints them too). */
void cli_mods_print(const cli *c, const char *before, const char *after);

#endif
