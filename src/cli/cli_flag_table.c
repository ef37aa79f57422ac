/*
 * cli_flag_table.c -- the flag table of the flashjit tool: every option,
 * the commands that take it, its setter, its placeholder and its help (the
 * variant's axes from the library's table, FJ_VARIANT_AXES).
 */
#include <limits.h>
#include <stddef.h>

#include "cli.h"
#include "cli_flags.h"

/* ---- the flags ---------------------------------------------------------------------- */

static const name_value dtypes[] = {
    {"f16", FJ_F16}, {"bf16", FJ_BF16}, {"e4m3", FJ_E4M3}};
static const name_value kv_dtypes[] = {
    {"f16", FJ_F16}, {"bf16", FJ_BF16}, {"e4m3", FJ_E4M3}};
static const name_value o_dtypes[] = {
    {"f16", FJ_F16}, {"bf16", FJ_BF16}, {"e4m3", FJ_E4M3}};
static const name_value causals[] = {{"top-left", FJ_CAUSAL_TOP_LEFT},
                                     {"bottom-right", FJ_CAUSAL_BOTTOM_RIGHT},
                                     {"none", FJ_CAUSAL_NONE}};
static const name_value layouts[] = {{"bhsd", FJ_BHSD}, {"bshd", FJ_BSHD}};
static const name_value scale_layouts[] = {{"head", FJ_SCALE_PER_HEAD},
                                           {"tensor", FJ_SCALE_PER_TENSOR}};

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

const flag_def cli_flags[] = {
    {"head-dim", 1, CMD_VARIANT, cli_set_int, OFF(v.head_dim), LIB, .arg = "D",
     .help = "head dimension: a multiple of 8 from 8 to 576 (above 256 the "
             "mma family; default 64, or --shape's D)"},
    {"head-dim-v", 1, CMD_VARIANT | CMD_TUNE | CMD_PLAN, cli_set_int,
     OFF(v.head_dim_v), LIB, .arg = "N",
     .help = "V's and O's head dimension where it differs from --head-dim, "
             "up to 512 (split head dims, as MLA's 192/128 on the wgmma "
             "family, sm_90a, f16 or bf16; below --head-dim on the mma "
             "family with --latent, as MLA's decode 576/512); default: the "
             "head dimension"},
    {"latent", 0, CMD_VARIANT | CMD_PLAN, cli_set_switch, OFF(latent),
     .help = "V is the first --head-dim-v columns of K's rows (MLA's latent "
             "cache: v = k, one tensor read), as the mma family's split head "
             "dims need"},
    FJ_VARIANT_AXES(AXIS)
    {"causal", 2, CMD_VARIANT | CMD_TUNE | CMD_PLAN, cli_set_causal,
     OFF(v.causal), NAMES(causals), .arg = "[=top-left|bottom-right|none]",
     .help = "causal mask; alone: top-left (PyTorch's); default none"},
    {"dtype", 1, CMD_VARIANT | CMD_TUNE | CMD_PLAN, cli_set_name, OFF(v.dtype),
     NAMES(dtypes), .arg = "f16|bf16|e4m3",
     .help = "Q and O (K and V unless --kv-dtype); e4m3: Q, K and V in FP8, "
             "O in bf16 (sm_90a); default f16"},
    {"kv-dtype", 1, CMD_VARIANT | CMD_TUNE | CMD_PLAN, cli_set_name,
     OFF(v.kv_dtype), NAMES(kv_dtypes), .arg = "f16|bf16|e4m3",
     .help = "K and V (default: --dtype)"},
    {"kv-dtype", 1, CMD_CACHE, cli_set_name, OFF(v.kv_dtype), NAMES(kv_dtypes),
     .arg = "e4m3",
     .help = "prewarm: K and V of the 16-bit --dtype entries in FP8 (FP8 KV "
             "caches; default: the dtype's own)"},
    {"o-dtype", 1, CMD_VARIANT | CMD_TUNE | CMD_PLAN, cli_set_name,
     OFF(v.o_dtype), NAMES(o_dtypes), .arg = "f16|bf16|e4m3",
     .help = "O, for --dtype e4m3 (default bf16; e4m3: O times --o-scale; "
             "run --check reports max |O|, the amax)"},
    {"fp8-flush", 1, CMD_VARIANT, cli_set_int, OFF(v.fp8_flush), LIB,
     .arg = "N",
     .help = "for --dtype e4m3: O's FP8 partial added into float32 every N "
             "key tiles, -1 never (FlashAttention-3's way); like the "
             "structural flags, takes the variant the flags describe "
             "(default 0: the library's, every tile with 128-key tiles up "
             "to head dim 128, never with the library's wider tiles or "
             "above)"},
    {"o-scale", 1, CMD_RUN, cli_set_o_scale, 0, .arg = "F",
     .help = "an e4m3 O's scale (--o-dtype e4m3): O is written as e4m3(O x "
             "F) (default 1)"},
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
             "each; exit 1 if one the check accepts fails to build"},
    {"sweep", 0, CMD_RUN, cli_set_switch, OFF(sweep),
     .help = "time every combination emit --sweep compiles, one line each, "
             "the fastest last; exit 1 if one fails to build, run or --check"},
    {"workers", 1, CMD_EMIT | CMD_RUN, cli_set_int, OFF(workers), .lo = 1, .hi = 64,
     .arg = "N", .help = "compiler processes at once for --sweep (default: one "
                         "per CPU, at most 16)"},
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
    {"fp8-scales", 1, CMD_PROBLEM, cli_set_name, OFF(scale_layout),
     NAMES(scale_layouts), .arg = "head|tensor",
     .help = "FP8 descales (--dtype or --kv-dtype e4m3): one per (batch, KV "
             "head) or one a tensor (default head)"},
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
    {"score-mod", 1, CMD_MODS, cli_set_expr, OFF(mods.score), .arg = "EXPR",
     .help = "a C expression for each score, of s (scale x q.k), b, h, hkv, "
             "q, kv (positions in the sequence) and the --param names, e.g. "
             "'s + bias(h, q - kv + 8)' (default: none)"},
    {"mask-mod", 1, CMD_MODS, cli_set_expr, OFF(mods.mask), .arg = "EXPR",
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
             "relative-bias, t5, documents, prefix-lm (its parameters by "
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
    {"seed", 1, CMD_TUNE, cli_set_int, OFF(seed), .lo = 0, .hi = INT_MAX, .arg = "N",
     .help = "seed of the random --param tensors (default 1; the tuner "
             "makes its own inputs)"},
    {"frag", 1, CMD_LUT, cli_set_string, OFF(frag), .arg = "KIND",
     .help = "one fragment kind, e.g. wmma_acc_f32 (default: all)"},
    {"head-dim", 1, CMD_CACHE, cli_set_string, OFF(heads_list), .arg = "D,...",
     .help = "prewarm: head dims, 1..256 each (default 64,128)"},
    {"dtype", 1, CMD_CACHE, cli_set_string, OFF(dtypes_list),
     .arg = "f16|bf16|e4m3,...",
     .help = "prewarm: dtypes (default f16,bf16; e4m3: FP8 attention, sm_90a, "
             "skipped and counted on a package's sm_80)"},
    {"causal", 1, CMD_CACHE, cli_set_string, OFF(causals_list),
     .arg = "none|top-left|bottom-right,...",
     .help = "prewarm: causal masks (default none,top-left)"},
    {"from-tune-db", 0, CMD_CACHE, cli_set_switch, OFF(from_tune_db),
     .help = "prewarm: every variant the tuning database has for --arch "
             "(--head-dim, --dtype, --causal filter them when given) instead "
             "of the library's picks; entries with modifications (not in "
             "the database) are skipped and counted"},
    {"verify", 0, CMD_CACHE, cli_set_switch, OFF(verify),
     .help = "import: compile every kernel of the pack again from its "
             "rendered source and refuse the file unless each PTX and cubin "
             "is the same (fj_cache_import_ex, FJ_CACHE_IMPORT_VERIFY)"},
    {"package", 1, CMD_CACHE, cli_set_path, OFF(package), .arg = "DIR",
     .help = "prewarm: build a read-only kernel package in DIR (for "
             "fj_ctx_opts.package_dir / $FLASHJIT_PACKAGE_DIR): the picks "
             "of --arch (default sm_80 and sm_90a, one after the other) for "
             "--head-dim (default 64,128,256), --dtype, --causal (default "
             "none,top-left,bottom-right) over the prewarm shapes and the "
             "README's and examples' shapes, the layout probe, a manifest"},
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
             "(fj_ctx_opts.jit_tiers, which the library turns on by default; "
             "the CLI keeps it off without this flag, so run times the "
             "chosen kernel)"},
    {"rel-table", 0, CMD_EMIT, cli_set_switch, OFF(rel_table),
     .help = "the kernel that fills the score expression's relative table "
             "(fj_rel_table_kernel: its subtree of the query head and the "
             "distance alone, evaluated once a launch) for --shape's "
             "problem, instead of the attention kernel"},
    {"first", 0, CMD_EMIT, cli_set_switch, OFF(first),
     .help = "the tiered JIT's first kernel for the problem or variant "
             "(CUDA cores, loops not unrolled) instead of the kernel itself"},
    {"backward", 0, CMD_EMIT | CMD_PLAN, cli_set_switch, OFF(backward),
     .help = "the backward of the problem (fj_attention_bwd): plan prints its "
             "three kernels, grid and workspace; emit the main kernel (with "
             "--what resources, all three)"},
    {"backward", 0, CMD_RUN, cli_set_switch, OFF(backward),
     .help = "run the library's backward (fj_attention_bwd) after one forward "
             "for O and the LSE: its kernels, first call, median time and "
             "TFLOP/s (2.5 x the forward's FLOPs); with --check dq, dk, dv "
             "(and dsinks) against the float64 reference, every element (B x "
             "H x Sq x Skv x D at most 536870912); no variant flags, --sweep "
             "or --jit-tiers"},
    {"deterministic", 0, CMD_RUN | CMD_PLAN, cli_set_switch, OFF(deterministic),
     .help = "with --backward: the backward's deterministic mode "
             "(fj_problem.deterministic: dq, dk, dv bit-identical run to "
             "run, dQ added in a fixed order); plan prints the mode, run "
             "times it"},
    {"backward", 0, CMD_TUNE, cli_set_switch, OFF(backward),
     .help = "tune the backward's main kernel (fj_tune_bwd: the families and "
             "stages its plan could take, checked against the plan's choice) "
             "and record the winner under the backward's own key"},
    {"backward", 0, CMD_CACHE, cli_set_switch, OFF(backward),
     .help = "prewarm: the backward's three kernels (preprocess, main, "
             "postprocess; fj_cache_prewarm_bwd) for the --head-dim, --dtype "
             "and --causal lists instead of the forward's picks; not with "
             "--from-tune-db"},
    {"verbose", 0, CMD_ALL, cli_set_switch, OFF(verbose),
     .help = "print the library's log"},
};
const size_t cli_nflags = sizeof cli_flags / sizeof cli_flags[0];

/* cli.given has a bit per flag. */
_Static_assert(sizeof cli_flags / sizeof cli_flags[0] <= 128, "cli.given holds 128 flags");
