/*
 * flashjit.h -- the whole public API of flashjit.
 *
 * flashjit generates fused attention kernels (Q.K^T -> online softmax -> P.V)
 * at run time: it renders CUDA source from Lua-templated files, specialised
 * for one variant (head dim, tiles, warps, stages, swizzle, softmax path, MMA
 * family, causal mask, dtypes), compiles it with NVRTC, caches the cubin in
 * memory and on disk, and launches it through the CUDA Driver API.
 *
 * Conventions
 *  - Every fallible call returns an fj_status; FJ_OK is 0.  Results come back
 *    through trailing out-parameters, which are left untouched on failure.
 *  - fj_errmsg(ctx) gives the detailed message of the calling thread's last
 *    failure on that context (NVRTC log, Lua traceback, CUDA error name with
 *    the failing call).
 *  - Objects come in create/destroy pairs; destroy accepts NULL.
 *  - A context is thread-safe: any number of threads may use one context.
 *    A call that compiles a kernel (NVRTC: 0.2-2 s) holds up only the
 *    calls that need that same kernel, which wait for its compile rather
 *    than start another; the context's other calls go on meanwhile.
 *  - Nothing here prints, exits or aborts; diagnostics go to the optional log
 *    callback of fj_ctx_opts.
 *  - A NULL pointer never crashes a call.  Where a pointer is required, a
 *    call returning fj_status gives FJ_ERR_INVALID_ARG and the message
 *    "function: argument is NULL" (in fj_errmsg(NULL) when the context
 *    itself is NULL); a void call does nothing; a getter gives NULL (and a
 *    length of 0), or "" where it is documented never to be NULL.  Each
 *    function says which pointers may be NULL.  Pointers that are not NULL
 *    must point to what they claim: that cannot be checked.
 *  - Device pointers are plain `void *` (CUdeviceptr values, or the pointers
 *    that the CUDA runtime or PyTorch hand out: the context works in the
 *    device's primary context, so they can be passed straight in).
 */
#ifndef FLASHJIT_H
#define FLASHJIT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define FJ_API __attribute__((visibility("default")))
#else
#define FJ_API
#endif

#define FJ_VERSION_MAJOR 0
#define FJ_VERSION_MINOR 1
#define FJ_VERSION_PATCH 0
/* The layout of the public structs: bumped whenever one changes (a field
 * added, removed, retyped or moved), so that a binding that mirrors them
 * (python/flashjit/_capi.py) can refuse a library of another layout
 * instead of reading past a struct (fj_abi_version). */
#define FJ_ABI_VERSION 13

/* ------------------------------------------------------------------------ */
/* Status codes                                                              */
/* ------------------------------------------------------------------------ */

/*
 * The one list of status codes.  Values are explicit and only ever appended,
 * so that a number seen in a log keeps its meaning across versions.
 */
#define FJ_STATUS_MAP(X)                                                     \
  X(OK, 0, "success")                                                        \
  X(ERR_INVALID_ARG, 1, "invalid argument")                                  \
  X(ERR_UNSUPPORTED, 2, "unsupported variant or problem")                    \
  X(ERR_RESOURCES, 3, "variant exceeds a hardware limit")                    \
  X(ERR_NO_DEVICE, 4, "no CUDA device or driver")                            \
  X(ERR_COMPILE_ONLY, 5, "operation needs a GPU context")                    \
  X(ERR_CUDA, 6, "CUDA driver call failed")                                  \
  X(ERR_COMPILE, 7, "kernel compilation failed")                             \
  X(ERR_TEMPLATE, 8, "template rendering failed")                            \
  X(ERR_LAYOUT, 9, "fragment layout probe failed")                           \
  X(ERR_IO, 10, "file system error")                                         \
  X(ERR_NOMEM, 11, "out of memory")                                          \
  X(ERR_NOT_FOUND, 12, "not found")                                          \
  X(ERR_TUNE, 13, "autotuning failed")

typedef enum fj_status {
#define FJ_STATUS_ENUM_(name, value, text) FJ_##name = value,
  FJ_STATUS_MAP(FJ_STATUS_ENUM_)
#undef FJ_STATUS_ENUM_
} fj_status;

/* A short, static description of a status ("invalid argument").  Unknown
 * values give "unknown status".  Never NULL. */
FJ_API const char *fj_status_str(fj_status status);

/* "0.1.0".  Static. */
FJ_API const char *fj_version(void);

/* FJ_ABI_VERSION as the library was built with it. */
FJ_API int fj_abi_version(void);

/* ------------------------------------------------------------------------ */
/* Context                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct fj_ctx fj_ctx;

typedef enum fj_log_level {
  FJ_LOG_DEBUG = 0,
  FJ_LOG_INFO = 1,
  FJ_LOG_WARN = 2
} fj_log_level;

/* Receives the library's diagnostics (for example "disk cache is read-only:
 * using memory only").  Called from whichever thread made the call; the
 * message is only valid during the call.  It may run while the context's
 * lock is held: it must not call flashjit on the same context (that call
 * would wait for the lock forever), and a slow one holds up the context's
 * other threads -- hand the message on (copy it to a queue) rather than
 * write it out there. */
typedef void (*fj_log_fn)(void *user, fj_log_level level, const char *msg);

typedef struct fj_ctx_opts {
  /* CUDA device ordinal, or -1 for a compile-only context that needs no GPU
   * and no driver: render, compile and inspect only. Default 0. */
  int device;
  /* Target architecture, "sm_XY" or "sm_XYa".  NULL: the device's own
   * (sm_90a on compute capability 9.0).  Required when device is -1. */
  const char *arch;
  /* Disk cache directory, at most 4095 bytes.  NULL: $FLASHJIT_CACHE_DIR,
   * else $XDG_CACHE_HOME/flashjit, else ~/.cache/flashjit.  Entries are
   * read without blocking or following links: a file there that is not a
   * regular file of a plausible size is a miss, never a hang. */
  const char *cache_dir;
  /* 0 keeps the cache in memory only.  Default 1. */
  int disk_cache;
  /* 1 compiles every kernel in a child process, so that a crash of NVRTC
   * becomes FJ_ERR_COMPILE instead of taking the caller down.  Default 0;
   * tuning sweeps and fj_kernel_prepare isolate their compiles
   * regardless.  A child that uses no CPU for 10 s before it answers is
   * stuck (forked while a thread of the host that had used NVRTC was
   * exiting, it waits for ever on NVRTC's lock): it is stopped and the
   * compile started in a new one, twice at most; each child has 600 s
   * to answer. */
  int isolate_compile;
  /* Optional diagnostics sink and its user pointer. */
  fj_log_fn log;
  void *log_user;
  /* Compile-only contexts: the multiprocessors that plans (fj_attention_plan)
   * count on, 1..1024.  0 (default): the largest part of the target's
   * architecture (132 for sm_90: H100/H200 SXM; 108 for sm_80: A100; see
   * fj_attention_plan).  A GPU context uses its device's count and
   * refuses any other value. */
  int sm_count;
  /* 1 (fj_ctx_opts_init's default): the tiered JIT.  A dense
   * fj_attention_fwd call whose chosen kernel is in neither cache (nor the
   * kernel package) launches the problem's first kernel instead (CUDA
   * cores, loops not unrolled: about 0.2 s of NVRTC against 0.5-1.5 s;
   * fj_kernel_get_first shows it) and compiles the chosen kernel on a
   * thread of its own; the first call after that compile ended launches
   * the chosen kernel.  The first kernel is correct (its error against a
   * float reference is the chosen kernels', docs/PERF.md) but slow, and
   * its results round differently from the chosen kernel's: the same call
   * may give other low bits before and after the switch.  These calls
   * compile and wait as without tiers: fj_attention_fwd_plan/_variant,
   * calls on a stream being captured or from a thread that records
   * launches (a graph or a replay would keep the first kernel for good),
   * varlen, paged K/V, FP8, checked mode, problems with
   * fj_problem.deterministic set, and problems of more than 2^41 FLOPs
   * (4 B Hq Sq Skv D, half when causal: the first kernel would take
   * longer than the compile).  Time kernels after fj_ctx_tiers_wait, or
   * with tiers off.  0: every call compiles its chosen kernel and waits.
   * fj_ctx_destroy waits for the compiles still running.  The
   * environment's FLASHJIT_JIT_TIERS=1 (or 0) overrides it. */
  int jit_tiers;
  /* A read-only kernel package (fj_cache_package_seal; `flashjit cache
   * prewarm --package DIR`): a directory of compiled kernels consulted
   * after the disk cache and never written, so that a first call for the
   * kernels it holds compiles nothing.  NULL: $FLASHJIT_PACKAGE_DIR, else
   * none; "": none, whatever the environment says.  A package this context cannot use -- no manifest, made by
   * another NVRTC version or cache format, or holding no kernels for the
   * context's arch -- is left out with a warning through the log (the
   * context works as without it); a path over 4095 bytes is
   * FJ_ERR_INVALID_ARG.  A package is trusted no more than a shared cache
   * directory or an imported pack: each entry is read and checked as a
   * disk-cache entry is (checksum, and its whole key: source, NVRTC
   * version and options, arch, format; a render's metadata and source as
   * a render would have made them, a kernel's parts -- see "the cache's
   * trust model" in the README), so a foreign, damaged or crafted entry is
   * a miss, with a warning.  The string is copied. */
  const char *package_dir;
} fj_ctx_opts;

/* Fills opts with the defaults described above.  NULL: does nothing. */
FJ_API void fj_ctx_opts_init(fj_ctx_opts *opts);

/*
 * Creates a context.  opts may be NULL for the defaults.  On a GPU context
 * the driver (libcuda.so.1) is loaded on first need and the device's primary
 * context is retained.  Errors: FJ_ERR_INVALID_ARG (ctx NULL, bad arch
 * string or an arch this NVRTC does not target -- the message lists those
 * it does, from nvrtcGetSupportedArchs --, device below -1, device -1
 * without an arch, sm_count out of range or, on a GPU context, not the
 * device's, disk_cache, isolate_compile or jit_tiers other than 0 or 1,
 * $FLASHJIT_JIT_TIERS other than 0, 1 or empty, cache_dir "" or over 4095
 * bytes, package_dir over 4095 bytes), FJ_ERR_NO_DEVICE
 * (no driver or no such device), FJ_ERR_CUDA, FJ_ERR_NOMEM.
 * On failure *ctx is set to NULL and, where a message exists, it is available
 * from fj_errmsg(NULL).
 */
FJ_API fj_status fj_ctx_create(fj_ctx **ctx, const fj_ctx_opts *opts);

/* Destroys a context, its kernels and modules.  NULL is a no-op.  No other
 * thread may use the context during or after this call.  The compiles
 * still running -- the tiered JIT's (fj_ctx_opts.jit_tiers) and those
 * started ahead (fj_attention_bwd_prefetch's) -- are waited for, and
 * their kernels written to the disk cache, so the next run finds them. */
FJ_API void fj_ctx_destroy(fj_ctx *ctx);

/* Waits for the tiered JIT's background compiles (fj_ctx_opts.jit_tiers)
 * to end, so that the calls after it launch their chosen kernels: call it
 * after a warm-up and before timing or comparing bits.  Other threads'
 * calls on ctx wait meanwhile.  FJ_OK when nothing was compiling; a
 * compile that failed returns its error (the first one; the others are
 * dropped, and their calls compile again).  FJ_ERR_INVALID_ARG when ctx
 * is NULL. */
FJ_API fj_status fj_ctx_tiers_wait(fj_ctx *ctx);

/*
 * The detailed message of the calling thread's last failed call on ctx.
 * ctx NULL: of the thread's last failed call without a context --
 * fj_ctx_create, fj_reference_fwd, fj_reference_bwd, fj_reference_merge,
 * fj_convert, or any call that was given a NULL context.  Empty if that
 * call succeeded.  A thread keeps one message: a failed call on another
 * context (or without one) replaces it, and fj_errmsg(ctx) is then empty.
 * Never NULL.  Valid until the thread's next call into flashjit.
 */
FJ_API const char *fj_errmsg(const fj_ctx *ctx);

/* The target architecture of the context ("sm_90a").  Static for the
 * lifetime of ctx; "" for a NULL ctx. */
FJ_API const char *fj_ctx_arch(const fj_ctx *ctx);

/* 1 when the context has a GPU, 0 for a compile-only context (or NULL). */
FJ_API int fj_ctx_has_device(const fj_ctx *ctx);

typedef struct fj_device_info {
  char name[96];            /* "NVIDIA H200" */
  int ordinal;
  int cc_major, cc_minor;   /* compute capability */
  int sm_count;
  int smem_optin_bytes;     /* largest dynamic shared memory per block */
  int driver_version;       /* e.g. 13000 */
} fj_device_info;

/* Facts about the context's device.  FJ_ERR_COMPILE_ONLY on a compile-only
 * context; ctx and info must not be NULL. */
FJ_API fj_status fj_device_get(fj_ctx *ctx, fj_device_info *info);

/* ------------------------------------------------------------------------ */
/* Variants: one point in the specialisation space                           */
/* ------------------------------------------------------------------------ */

typedef enum fj_dtype {
  FJ_F16 = 1,
  FJ_BF16 = 2,
  /* FP8 (one byte an element, a float descale per (batch, KV head) or per
   * tensor: fj_problem.scale_layout).  As
   * kv_dtype: K and V of an f16 or bf16 problem, an FP8 KV cache
   * (contiguous, packed or paged): with 2-3 stages the mma family's ring
   * holds them in FP8 and converts each tile once for its 16-bit
   * products; with 1 stage (the wmma family's only way) they are
   * dequantised as they load.  As dtype: Q, K and V all
   * e4m3 on the wgmma family (sm_90a), whose products run in FP8; O is
   * then bfloat16, or fj_problem.o_dtype's (f16, or e4m3 with o_scale and
   * o_amax) (fj_problem's q_scale, k_scale, v_scale). */
  FJ_E4M3 = 3,
  FJ_F32 = 4    /* host-side conversion only */
} fj_dtype;

typedef enum fj_mma {
  FJ_MMA_WMMA = 1,  /* nvcuda::wmma 16x16x16 fragments */
  FJ_MMA_SYNC = 2,  /* mma.sync.m16n8k16 via inline PTX */
  FJ_MMA_WGMMA = 3  /* wgmma on sm_90a */
} fj_mma;

typedef enum fj_softmax {
  FJ_SOFTMAX_SMEM = 1,  /* store S to shared memory, softmax there */
  FJ_SOFTMAX_REGS = 2   /* softmax on the accumulator fragments via the LUT */
} fj_softmax;

typedef enum fj_swizzle {
  FJ_SWIZZLE_NONE = 1,
  FJ_SWIZZLE_PAD = 2,  /* pad each shared-memory row by 16 bytes */
  FJ_SWIZZLE_XOR = 3   /* XOR-permute 16-byte chunks within a row */
} fj_swizzle;

/* Causal masking.  Query row i may see key j when
 *   TOP_LEFT:     j <= i                      (PyTorch's is_causal)
 *   BOTTOM_RIGHT: j <= i + seq_kv - seq_q     (FlashAttention >= 2.1)
 * The two agree when seq_q == seq_kv.  A row that sees no key gives zeros
 * in O and -inf in the log-sum-exp. */
typedef enum fj_causal {
  FJ_CAUSAL_NONE = 0,
  FJ_CAUSAL_TOP_LEFT = 1,
  FJ_CAUSAL_BOTTOM_RIGHT = 2
} fj_causal;

/* Score and mask modifications: defined with the problem, below. */
typedef struct fj_mods fj_mods;

/* The largest head dims: Q's and K's (MLA's latent rows with their rotary
 * part), V's and O's.  Above 256 only the mma family runs them. */
#define FJ_HEAD_DIM_MAX 576
#define FJ_HEAD_DIM_V_MAX 512

typedef struct fj_variant {
  int head_dim;          /* Q and K (and V and O unless head_dim_v says
                            otherwise): a multiple of 8 from 8 to
                            FJ_HEAD_DIM_MAX; above 256 the mma family's,
                            with tile_m 16 or 32 and warps that split the
                            key tiles (and, where V has more than 256
                            columns, V's columns) */
  int tile_m;            /* query rows per thread block */
  int tile_n;            /* key rows per inner iteration */
  int warps;             /* warps per thread block */
  int stages;            /* 1 = synchronous loads, 2-3 = cp.async ring */
  fj_swizzle swizzle;
  fj_softmax softmax;
  fj_mma mma;
  fj_causal causal;
  fj_dtype dtype;        /* Q and O (and K/V unless kv_dtype says otherwise) */
  fj_dtype kv_dtype;     /* K and V; 0 means the same as dtype */
  /* 1: GQA packing (mma family).  The heads_q / heads_kv query heads that
   * share a KV head become rows of one tile -- row r is query position
   * r / group of head kv_head * group + r % group -- so that K and V are
   * read once per KV head.  For few query positions (decode, speculative
   * decode, small chunks).  0: one query head per block.  Named "_gqa". */
  int pack_gqa;
  /* 1: split-KV (mma family).  Each block covers one of fj_plan.splits key
   * ranges and writes float32 partial rows and their log-sum-exp to a
   * workspace; a combine kernel merges them in a fixed order (so results do
   * not depend on timing).  For grids that would not fill the GPU.  Named
   * "_split". */
  int split_kv;
  /* 1: variable lengths (mma family): each sequence's lengths and first
   * rows come from the problem's cu_seqlens_q, cu_seqlens_kv and
   * seqused_kv (device arrays read by the kernel); blocks past a
   * sequence's end return at once.  Set from the problem, not tuned.
   * Named "_vl". */
  int varlen;
  /* 1: paged K/V (mma family): key rows are found through the problem's
   * block table.  Set from the problem, not tuned.  Named "_paged". */
  int paged;
  /* Score and mask modifications (fj_mods): NULL for none.  The variant
   * takes their *form* -- the expressions' text, the parameters' names,
   * types and ranks, whether a window and a softcap are on -- and the
   * problem at launch their values; fj_attention_variant copies the
   * problem's pointer here.  A kernel keeps its own copy of the form, so
   * the fj_mods need only outlive the calls that take this variant.
   * Named "_win" (window), "_cap" (softcap) and "_x" + 8 hex digits (a
   * hash of the user expressions and parameters). */
  const fj_mods *mods;
  /* dtype e4m3 (the wgmma family): how often the FP8 tensor cores' partial
   * of O joins a float32 accumulator, in key tiles: 1..16, or -1 never
   * (FlashAttention-3's way: O stays in the tensor cores' accumulator,
   * whose additions keep about 22 bits, so its error grows with the
   * keys).  0: the library's default: 1 with 128-key tiles up to head
   * dim 128 (its error does not grow with the keys); never with the
   * wider key tiles the library takes at head dims 64 and 128 (chosen
   * for speed; at head dim 128, 192 keys, the error at 128k keys was
   * 1.04x its error at 4k) and at head dims 192 and 256, where a second
   * accumulator does not fit the registers.  Named
   * "_fl" + N, or "_flnever".  Must be 0 for other dtypes. */
  int fp8_flush;
  /* V's and O's head dim where it differs from Q's and K's (head_dim):
   * split head dims, as DeepSeek's MLA prefill has (Q K^T over 192, V and
   * O 128).  0 (or head_dim): the same.  A multiple of 8 from 8 to
   * FJ_HEAD_DIM_V_MAX; it must be the problem's (fj_problem.head_dim_v).
   * The wgmma family on sm_90a with dtype f16 or bf16 takes one that
   * differs (both at most 256), and the mma family one below head_dim,
   * which it reads as the first head_dim_v columns of K's rows (MLA's
   * latent cache: the problem's v must be k); FJ_ERR_UNSUPPORTED
   * otherwise, naming the value and the limit.  Named "_v" + N where it
   * differs. */
  int head_dim_v;
  /* O's element (fj_problem.o_dtype; it must be the problem's): 0 for
   * dtype's (bf16 for dtype e4m3).  FP8 attention (dtype e4m3) writes
   * FJ_BF16, FJ_F16 or FJ_E4M3.  Named "_o" + its name where it is not
   * the default ("_oe4m3"). */
  fj_dtype o_dtype;
  /* 1: every read the kernel's tiles make of the score expression's
   * distance table -- a read T(A..., q - kv + X), as a relative-position
   * bias makes, which the wgmma and mma families take per tile at a row
   * pointer -- lies within T's extents for the problem: the kernel reads
   * the table without its path that checks each element against the
   * extents (a third of such a forward's compile).  Set from the problem,
   * not tuned: fj_attention_variant proves it on the host from the
   * lengths (plus 256: a tile's padding), heads, batch, the indices'
   * scalar parameters and T's extents, where the indices read no tensor;
   * a launch whose problem the proof fails refuses a variant with it
   * (FJ_ERR_INVALID_ARG).  0 otherwise.  Named "_tin".  The wgmma
   * backward's plan (fj_attention_bwd_plan) sets it likewise for its
   * tiles, and fj_attention_bwd_run refuses a plan whose problem the
   * proof fails. */
  int table_inside;
} fj_variant;

/* Fills v (pack_gqa, split_kv, varlen and paged 0) with the WMMA family's default variant for a head dim, dtype and
 * causal mode: register softmax, a portable choice that fits every target
 * from sm_80 on -- for dtype FJ_E4M3, whose only family is wgmma, that
 * family's (tile_m 128, tile_n 128, 12 warps, XOR swizzle, sm_90a); above
 * head dim 256, the mma family's (tile_m 16, tile_n 64, 4 warps).
 * fj_attention_variant gives the choice fj_attention_fwd
 * makes for a problem on a context's device: on sm_90a the wgmma family
 * (head dims 64 to 256, f16/bf16 K/V, problems with at least one
 * 128-row block per multiprocessor), else on sm_80 and newer the mma
 * family (mma.sync) with its own tiles, on sm_75 this default (one stage
 * for FP8 K/V there); a tuned entry where the tuning database has one.  v NULL:
 * does nothing.  Values out of range are kept as given, for
 * fj_variant_check to refuse. */
FJ_API void fj_variant_default(fj_variant *v, int head_dim, fj_dtype dtype,
                               fj_causal causal);

/*
 * Checks a variant against the generator's rules and the context's
 * architecture without compiling it.  FJ_ERR_INVALID_ARG for a value out of
 * range, FJ_ERR_UNSUPPORTED for an axis value not implemented,
 * FJ_ERR_RESOURCES for a combination that needs more shared memory or
 * registers than the target has; the message names the axis, the value and
 * the limit.
 */
FJ_API fj_status fj_variant_check(fj_ctx *ctx, const fj_variant *v);

/* Writes the variant's canonical name (also the kernel's symbol), e.g.
 * "fj_attn_d64_m64_n64_w4_s1_pad_smem_wmma_nc_f16" (then "_gqa" and
 * "_split" where those are set).  Returns the length it
 * needs, as snprintf does: buf NULL or size 0 only measures (nothing is
 * written whatever size says).  -1 for a NULL v.  Values out of range are
 * named "?". */
FJ_API int fj_variant_name(const fj_variant *v, char *buf, size_t size);

/* Names of enumeration values as the CLI spells them ("bf16", "xor",
 * "regs", "mma", "bottom-right").  Static; "?" for unknown values. */
FJ_API const char *fj_dtype_name(fj_dtype d);
FJ_API const char *fj_mma_name(fj_mma m);
FJ_API const char *fj_softmax_name(fj_softmax s);
FJ_API const char *fj_swizzle_name(fj_swizzle s);
FJ_API const char *fj_causal_name(fj_causal c);

/*
 * The variant's tunable axes, in one table: the library names, checks and
 * stores them from it (the tuning database's keys), the CLI makes its
 * options and their help of it, and the Python package reads it through
 * fj_axis_get.  FJ_VARIANT_AXES(X) calls X(field, flag, kind, names, doc)
 * once per axis, in this order:
 *   field  the fj_variant member (an int or an enum); its spelling is the
 *          axis's name: the tuning database's key, Python's keyword
 *   flag   the command line's option, without its dashes
 *   kind   FJ_AXIS_INT, FJ_AXIS_NAMED (an enum whose values 1, 2, ... have
 *          the names NAMES(V) gives, V(name) each) or FJ_AXIS_SWITCH (0/1)
 *   names  FJ_SWIZZLE_NAMES, FJ_SOFTMAX_NAMES, FJ_MMA_NAMES; FJ_NO_NAMES
 *   doc    one line: what it sets, what it may be
 * Axes are only ever appended.
 */
#define FJ_SWIZZLE_NAMES(V) V("none") V("pad") V("xor")
#define FJ_SOFTMAX_NAMES(V) V("smem") V("regs")
#define FJ_MMA_NAMES(V) V("wmma") V("mma") V("wgmma")
#define FJ_NO_NAMES(V)
#define FJ_VARIANT_AXES(X)                                                     \
  X(tile_m, "tile-m", FJ_AXIS_INT, FJ_NO_NAMES,                                \
    "query rows per block, a multiple of 16 up to 256")                       \
  X(tile_n, "tile-n", FJ_AXIS_INT, FJ_NO_NAMES,                                \
    "key rows per iteration, a multiple of 16 up to 256")                     \
  X(warps, "warps", FJ_AXIS_INT, FJ_NO_NAMES,                                  \
    "warps per block: 4 or 8 (wmma, mma; 2 for mma's V above 256 columns); 8, 12 or 16 (wgmma)")               \
  X(stages, "stages", FJ_AXIS_INT, FJ_NO_NAMES,                                \
    "1 = synchronous loads, 2-3 = cp.async ring; wgmma 2-4 (TMA ring)")       \
  X(swizzle, "swizzle", FJ_AXIS_NAMED, FJ_SWIZZLE_NAMES,                       \
    "shared-memory layout of the tiles")                                      \
  X(softmax, "softmax", FJ_AXIS_NAMED, FJ_SOFTMAX_NAMES,                       \
    "where the softmax runs (smem: wmma only)")                               \
  X(mma, "mma", FJ_AXIS_NAMED, FJ_MMA_NAMES, "the template family")            \
  X(pack_gqa, "pack-gqa", FJ_AXIS_SWITCH, FJ_NO_NAMES,                         \
    "GQA packing: the query heads of a KV head as rows of one tile (mma)")    \
  X(split_kv, "split-kv", FJ_AXIS_SWITCH, FJ_NO_NAMES,                         \
    "split-KV: key ranges over several blocks, then a combine (mma)")

typedef enum fj_axis_kind {
  FJ_AXIS_INT = 1,    /* an integer the rules bound (fj_variant_check) */
  FJ_AXIS_NAMED = 2,  /* an enum: values 1..nvalues, each with a name */
  FJ_AXIS_SWITCH = 3  /* 0 or 1 */
} fj_axis_kind;

/* One row of FJ_VARIANT_AXES.  The strings are static. */
typedef struct fj_axis_info {
  const char *name;   /* "tile_m": the field, the database key, the keyword */
  const char *flag;   /* "tile-m": the CLI's option without its dashes */
  fj_axis_kind kind;
  const char *values; /* FJ_AXIS_NAMED: "none|pad|xor", value 1 first; else "" */
  int nvalues;        /* FJ_AXIS_NAMED: how many names; else 0 */
  size_t offset;      /* offsetof(fj_variant, <name>); the member is an int
                         or an enum */
  const char *doc;    /* one line */
} fj_axis_info;

/* How many rows FJ_VARIANT_AXES has.  Thread-safe, like the two below. */
FJ_API int fj_axis_count(void);
/* Fills *info with row i (0 <= i < fj_axis_count()).  FJ_ERR_INVALID_ARG
 * for i out of range or info NULL (fj_errmsg(NULL) says which). */
FJ_API fj_status fj_axis_get(int i, fj_axis_info *info);
/* The name of a FJ_AXIS_NAMED axis's value: static; "?" for an unknown
 * axis or value, or an axis without names. */
FJ_API const char *fj_axis_value_name(int axis, int value);
/* The value a name has on axis (1..nvalues), 0 for none (name NULL, an
 * unknown name, an axis without names). */
FJ_API int fj_axis_value(int axis, const char *name);

/* ------------------------------------------------------------------------ */
/* Kernels: rendered, compiled, cached                                       */
/* ------------------------------------------------------------------------ */

typedef struct fj_kernel fj_kernel;

typedef enum fj_cache_origin {
  FJ_CACHE_MISS = 0,    /* compiled by this call */
  FJ_CACHE_MEMORY = 1,  /* found in this context's memory cache */
  FJ_CACHE_DISK = 2     /* loaded from the disk cache */
} fj_cache_origin;

typedef struct fj_resources {
  int registers;           /* per thread */
  int shared_static;       /* bytes of static shared memory */
  int shared_dynamic;      /* bytes of dynamic shared memory per launch */
  int spill_store_bytes;
  int spill_load_bytes;
  int local_bytes;         /* stack frame per thread */
  int threads;             /* per block */
  int barriers;
  size_t cubin_bytes;
  size_t ptx_bytes;
  double compile_ms;       /* NVRTC wall time when it was compiled */
  fj_cache_origin cache;   /* how the kernel's last lookup found it (a
                              lookup on another thread may have been
                              the last) */
} fj_resources;

/*
 * Renders, compiles (or fetches from the caches) and returns the kernel of a
 * variant.  The kernel belongs to ctx and stays valid until ctx is
 * destroyed; do not free it.  On a GPU context the module is not loaded
 * until the kernel is first launched.  Errors: those of fj_variant_check,
 * FJ_ERR_TEMPLATE, FJ_ERR_COMPILE (with the NVRTC log in fj_errmsg).  No
 * argument may be NULL.
 */
FJ_API fj_status fj_kernel_get(fj_ctx *ctx, const fj_variant *v,
                               fj_kernel **kernel);

/*
 * The tiered JIT's first kernel (fj_ctx_opts.jit_tiers) for the problem
 * variant v serves: templates/attention_simt.cu, specialised only by v's
 * head dim, causal mask, dtype and modifications (v's tiles and family do
 * not enter).  Like fj_kernel_get otherwise: inspect its source, PTX and
 * resources on any context.
 */
FJ_API fj_status fj_kernel_get_first(fj_ctx *ctx, const fj_variant *v,
                                     fj_kernel **kernel);

/* The rendered CUDA source, NUL-terminated; *len gets its length if len is
 * not NULL.  Owned by the kernel.  k NULL: NULL, and *len 0. */
FJ_API const char *fj_kernel_source(const fj_kernel *k, size_t *len);
/* The PTX NVRTC produced, NUL-terminated.  Owned by the kernel.  k NULL:
 * NULL, and *len 0. */
FJ_API const char *fj_kernel_ptx(const fj_kernel *k, size_t *len);
/* The cubin for the context's arch.  Owned by the kernel.  k NULL: NULL,
 * and *len 0. */
FJ_API const void *fj_kernel_cubin(const fj_kernel *k, size_t *len);
/* NVRTC's log, including ptxas's resource lines.  Owned by the kernel.
 * Never NULL: "" when there is none, or for a NULL k. */
FJ_API const char *fj_kernel_log(const fj_kernel *k);
/* The kernel's symbol name (the variant's canonical name).  Never NULL: ""
 * for a NULL k. */
FJ_API const char *fj_kernel_name(const fj_kernel *k);
/* Registers, shared memory, spills, sizes, compile time, cache origin.
 * Does nothing when k or res is NULL. */
FJ_API void fj_kernel_resources(const fj_kernel *k, fj_resources *res);

/* Progress of long work: `done` of `total` steps finished.  Called on the
 * thread that made the call. */
typedef void (*fj_progress_fn)(void *user, size_t done, size_t total);

typedef struct fj_prepare_opts {
  int workers;              /* compiler processes at once; 0: one per CPU,
                               at most 16; negative: FJ_ERR_INVALID_ARG */
  fj_progress_fn progress;  /* optional, once per compiled variant */
  void *user;
} fj_prepare_opts;

/*
 * Makes many variants ready ahead of use (a cache warm-up, or a tuning
 * sweep): renders each, takes what the memory and disk caches hold, and
 * compiles the rest with NVRTC in child processes, several at once, so that
 * a compiler crash fails one variant, not the caller.  The kernels then come
 * from fj_kernel_get or a launch without compiling.  each (optional, n
 * entries) gets every variant's status.  Returns FJ_OK when all succeeded,
 * else the first failure's status; fj_errmsg names how many failed and the
 * first failure.  opts may be NULL; variants only when n is 0.  n is at
 * most 65536 (a larger n, such as a negative count turned size_t, is
 * FJ_ERR_INVALID_ARG).
 */
FJ_API fj_status fj_kernel_prepare(fj_ctx *ctx, const fj_variant *variants,
                                   size_t n, const fj_prepare_opts *opts,
                                   fj_status *each);

/* ------------------------------------------------------------------------ */
/* Attention forward                                                         */
/* ------------------------------------------------------------------------ */

typedef enum fj_order {
  FJ_BHSD = 0,  /* [batch][heads][seq][head_dim] */
  FJ_BSHD = 1,  /* [batch][seq][heads][head_dim] */
  FJ_THD = 2    /* [tokens][heads][head_dim]: the sequences packed one after
                   another (batch strides 0), for cu_seqlens_q/_kv */
} fj_order;

/* How an FP8 problem's descales are laid out (fj_problem.scale_layout). */
typedef enum fj_scale_layout {
  FJ_SCALE_PER_HEAD = 0,   /* [batch][heads_kv] floats */
  FJ_SCALE_PER_TENSOR = 1  /* one float */
} fj_scale_layout;

typedef struct fj_problem {
  int batch;
  int heads_q;
  int heads_kv;       /* divides heads_q: GQA / MQA */
  int seq_q;
  int seq_kv;
  int head_dim;       /* Q's and K's (V's and O's too unless head_dim_v) */
  fj_dtype dtype;     /* Q and O; FJ_E4M3: Q (and K, V) FP8, O o_dtype's */
  fj_dtype kv_dtype;  /* 0: same as dtype; FJ_E4M3 for FP8 K/V */
  fj_causal causal;
  float scale;        /* softmax scale, above 0; 0 means 1/sqrt(head_dim) */
  /* Element strides (not bytes) of batch, head and sequence position; the
   * head dimension is contiguous.  A stride of 0 in Q, K or V broadcasts
   * along that dimension (as torch's expand() makes: inputs are only
   * read); O's rows must not overlap. */
  int64_t q_stride[3];
  int64_t k_stride[3];
  int64_t v_stride[3];
  int64_t o_stride[3];
  /* FP8 K/V only: device pointers to float scales, one per (batch, kv head),
   * batch-major: k = k_fp8 * k_scale[b * heads_kv + h] -- or one each
   * where scale_layout is FJ_SCALE_PER_TENSOR (below). */
  const void *k_scale;
  const void *v_scale;
  /* Split-KV: the key ranges each row tile is split into, merged by a
   * combine kernel.  0 (fj_problem_init's): the library's choice
   * (fj_attention_plan); 1: never split; 2..FJ_SPLITS_MAX: exactly that
   * many (ranges past the last key are empty and merge as nothing). */
  int splits;
  /* Variable-length batches.  All NULL: every sequence has seq_q queries
   * and seq_kv keys.  Otherwise device arrays of int32, and seq_q and
   * seq_kv are upper bounds of the lengths (they size the grid and the
   * log-sum-exp); a length may be 0.
   *   cu_seqlens_q[batch + 1]: sequence b's queries are rows
   *     cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of Q and O, counted in
   *     q_stride[2] and o_stride[2]; their batch strides must be 0
   *     (FJ_THD: the tokens of all sequences packed);
   *   cu_seqlens_kv[batch + 1]: the same for K and V;
   *   seqused_kv[batch]: sequence b sees its first seqused_kv[b] keys
   *     (taking precedence over cu_seqlens_kv's lengths: a cache with
   *     room to grow).
   * The log-sum-exp keeps its [batch][heads_q][seq_q] layout; entries past
   * a sequence's end are not written.  Causal masks align each sequence's
   * own ends (bottom-right: its last query sees its last key).  The
   * kernels clamp a length to 0..seq_q (seq_kv) and read nothing past it;
   * fj_problem_check_lengths checks host copies of the arrays. */
  const int32_t *cu_seqlens_q;
  const int32_t *cu_seqlens_kv;
  const int32_t *seqused_kv;
  /* A paged KV cache: block_table non-NULL.  K and V are num_pages pages
   * of page_size tokens: k_stride[0] and v_stride[0] step a page, [1] a
   * head, [2] a token within the page.  The [num_pages][page_size]
   * [heads_kv][head_dim] layout of vLLM and FlashInfer (NHD) has strides
   * {page_size * heads_kv * head_dim, head_dim, heads_kv * head_dim}.
   * Key j of sequence b is token j % page_size of page
   * block_table[b * max_pages + j / page_size]; the sequence's keys number
   * seqused_kv[b] (NULL: seq_kv each), and cu_seqlens_kv must be NULL.
   * A table entry outside 0..num_pages - 1 is read as page 0, never past
   * the cache (fj_problem_check_lengths reports it). */
  const int32_t *block_table;  /* device int32[batch][max_pages] */
  int max_pages;  /* the table's columns; max_pages * page_size >= seq_kv */
  int page_size;  /* tokens a page: a power of two, 1..FJ_PAGE_SIZE_MAX */
  int num_pages;  /* pages in K and in V */
  /* Score and mask modifications (fj_mods, below): NULL for none.  The
   * pointer, and what it points to, must stay valid for each call that
   * takes the problem (nothing is kept after it returns). */
  const fj_mods *mods;
  /* Varlen: the rows the packed tensors hold, Q and O (total_q, with
   * cu_seqlens_q) and K and V (total_kv, with cu_seqlens_kv); 0: not
   * given.  The wgmma family loads rows by TMA, which must know where a
   * tensor ends (rows past it come back as zeros): a varlen problem whose
   * packed tensors lack their totals takes the mma family.  The last
   * sequence must end within them (fj_problem_check_lengths checks
   * cu_seqlens_q[batch] <= total_q). */
  int total_q;
  int total_kv;
  /* The backward only: nonzero makes dq, dk, dv and dsinks bit-identical
   * from run to run (same problem, inputs and context target): each query
   * tile's dq is added by the key tiles that see it one after another in
   * a fixed key order, the parameters' gradients (fj_mods.param_grads) are
   * summed as integers (fixed point), and the sinks' gradient is summed
   * in row order.
   * It costs the waits between those additions.  0: dq's additions run in
   * whatever order the GPU makes them.  The forward's kernels are
   * deterministic either way; for the forward it keeps the tiered JIT
   * (fj_ctx_opts.jit_tiers) away: the call waits for its chosen kernel
   * instead of being answered by the first kernel, whose results round
   * differently, so that its bits never depend on when a compile ended. */
  int deterministic;
  /* dtype FJ_E4M3 only: a device pointer to Q's float descales, one per
   * (batch, KV head), batch-major like k_scale (FlashAttention-3's
   * q_descale): q = q_fp8 * q_scale[b * heads_kv + h / (heads_q /
   * heads_kv)] (one float where scale_layout is FJ_SCALE_PER_TENSOR).  The scores are (q . k) * scale with q and k so
   * dequantised, and O = P V with V dequantised by v_scale.  For
   * fj_reference_fwd it is host memory (as mods->sinks is). */
  const void *q_scale;
  /* V's and O's head dim: 0 (fj_problem_init's) means head_dim.  Split
   * head dims, as DeepSeek's MLA prefill has (Q and K 192 columns, V and
   * O 128): S = Q K^T runs over head_dim, O = P V has head_dim_v columns,
   * and v_stride and o_stride are the caller's (fj_problem_init makes
   * them for head_dim: a caller with contiguous V and O sets them for
   * head_dim_v).  A multiple of 8 from 8 to FJ_HEAD_DIM_V_MAX (head_dim up
   * to FJ_HEAD_DIM_MAX).  The default scale stays 1/sqrt(head_dim).  One
   * that differs from head_dim runs
   *   - on the wgmma family (sm_90a, both at most 256) with dtype f16 or
   *     bf16, dense or varlen, one kernel;
   *   - on the mma family (sm_80 and newer; MLA's decode, 576 / 512) where
   *     head_dim_v is below head_dim and V is the first head_dim_v columns
   *     of K's rows: the caller passes v = k (the same pointer, and
   *     v_stride = k_stride), and only K's rows are read.  GQA packing,
   *     split-KV and paged K/V (16-bit) are taken there.
   * Refused with FJ_ERR_UNSUPPORTED, naming the value and the limit,
   * elsewhere: the wmma family, FP8 (dtype or kv_dtype e4m3) and the
   * backward.  fj_tune tunes it as a class of its own (with v_stride =
   * k_stride, its inputs put V in K's rows, as the mma family reads it).
   * The tiered JIT's portable first kernel does not serve such a problem
   * (its chosen kernel answers at once).  fj_reference_fwd takes it (out
   * rows of head_dim_v). */
  int head_dim_v;
  /* FP8 only (dtype or kv_dtype e4m3): how q_scale, k_scale and v_scale
   * hold their descales, the three alike.  FJ_SCALE_PER_HEAD (0,
   * fj_problem_init's): one float per (batch, KV head), batch-major, as
   * above.  FJ_SCALE_PER_TENSOR: one float each, for every batch and head
   * (vLLM's k_scale and v_scale; a torch descale expanded from one
   * element to (batch, heads_kv) has this layout).  Ignored for 16-bit
   * problems. */
  fj_scale_layout scale_layout;
  /* O's element.  0 (fj_problem_init's): dtype's, bfloat16 for dtype
   * e4m3.  FP8 attention (dtype FJ_E4M3) may write FJ_BF16, FJ_F16 or
   * FJ_E4M3 -- then O = e4m3(O * o_scale), rounded to nearest even and
   * saturated to +-448, one byte an element (o_stride in elements, as
   * always).  A 16-bit problem writes its dtype (o_dtype 0 or the same);
   * anything else is refused, naming the combination. */
  fj_dtype o_dtype;
  /* o_dtype e4m3 only: a device pointer to one float, O's scale (cuDNN's
   * scale_o; a training recipe's 448 / amax); NULL: 1. */
  const void *o_scale;
  /* dtype e4m3 only, or NULL: a device pointer to one float that receives
   * max |O| over every row and column of the output, before o_scale
   * (cuDNN's amax_o), so that a recipe can choose the next call's scale.
   * Each call sets it to 0 on its stream before its kernel raises it (a
   * replayed launch record does too: fj_launches.zero_at). */
  void *o_amax;
  /* The backward only, or NULL: the gradient of the loss at the
   * forward's log-sum-exp, float32 laid out as lse ([batch][heads_q]
   * [seq_q]; entries of rows past a sequence's end are not read), device
   * memory -- for a loss that uses the LSE besides O (partial attentions
   * merged by their LSEs, a penalty on the LSE).  The LSE's derivative at
   * score s[i][j] is P[i][j] (a sink's at the sink: its share), so
   * fj_attention_bwd adds dlse[i] * P[i][j] to dS[i][j]: it subtracts
   * dlse[i] from the row's rowsum(dO o O).  NULL: the loss uses O only.
   * The forward ignores it; for fj_reference_bwd it is host memory. */
  const float *dlse;
} fj_problem;

#define FJ_PAGE_SIZE_MAX 4096

/* ------------------------------------------------------------------------ */
/* Score and mask modifications                                               */
/* ------------------------------------------------------------------------ */

/*
 * A problem may change the attention scores and hide pairs of (query, key)
 * with C expressions that are compiled into its kernel (README: "Your own
 * attention").  For query position q and key position kv (absolute
 * positions within the sequence, counted from 0) of batch b, query head h
 * and its KV head hkv:
 *
 *   s  = scale * (Q[q] . K[kv])             the scaled score
 *   s' = score(s, b, h, hkv, q, kv)          the score expression, if any
 *   s' = softcap * tanhf(s' / softcap)       if softcap > 0
 *   s' = -inf  where the mask expression is false, or outside the causal
 *              mask, the window or the sequence
 *   O[q] = sum_kv softmax(s')[kv] V[kv]
 *
 * Rows whose every key is hidden get O = 0 and a log-sum-exp of -inf.
 *
 * The expressions are C expressions (not statements) over the int
 * variables b, h, hkv, q, kv, the float s (score only), the parameters,
 * int literals and float literals with an f suffix (0.5f: an unsuffixed
 * one is a double in C), the operators of C except assignment,
 * increment, member access and the comma, casts to (float) and (int),
 * true and false, and the functions expf exp2f logf log2f sqrtf rsqrtf
 * tanhf sinf cosf fabsf fminf fmaxf floorf ceilf roundf truncf powf erff
 * abs min max.  Anything else -- a semicolon, a brace, a preprocessor
 * line, `asm`, an unknown name -- is refused with the token and its
 * column.  Integer arithmetic is C's on 32-bit ints, with a meaning
 * where C has none, the same in the kernels and in fj_reference_fwd: +,
 * -, * and negation wrap around (two's complement); x / 0 and x % 0 give
 * 0, INT_MIN / -1 gives INT_MIN and INT_MIN % -1 gives 0; a shift count
 * outside 0..31 gives 0 for << and 0 or -1 (the sign) for >>, which is
 * arithmetic; abs(INT_MIN) is INT_MIN; (int) of a float truncates toward
 * zero, saturating, NaN giving 0.  Where those operands are constants
 * the expression is refused instead (a divisor of 0, a shift count
 * outside 0..31, a constant result outside int32), naming the operator,
 * its column and the value.  A parameter may not be named like a macro
 * of the C or CUDA headers (NULL, INFINITY, assert, INT_MAX, ...).
 *
 * Parameters reach the expressions by name.  A scalar (rank 0) is a float
 * (FJ_MOD_F32) or an int (FJ_MOD_I32).  A tensor (rank 1 to 4; f32, f16,
 * bf16 or i32, row-major contiguous, device memory) is read by calling it
 * with one int index per dimension: `slopes(h)`, `bias(h, q - kv + 4096)`;
 * it gives a float (an int for i32).  An index outside the extents reads
 * 0 and never touches memory outside the tensor.  The kernels may run the
 * expressions on pairs the result does not use (rows past the sequence,
 * keys past it or outside the causal mask or window): such reads are as
 * safe, and their values are discarded.
 *
 * What belongs to the kernel (a change compiles another): the expressions'
 * text, each parameter's name, type and rank, and whether the window and
 * the softcap are on.  What is a launch argument (a change compiles
 * nothing): scalar values, tensor pointers and extents, the window's sizes
 * and the softcap's value.
 */
typedef enum fj_mod_type {
  FJ_MOD_F32 = 1,
  FJ_MOD_I32 = 2,
  FJ_MOD_F16 = 3,   /* tensors only */
  FJ_MOD_BF16 = 4   /* tensors only */
} fj_mod_type;

#define FJ_MOD_PARAMS_MAX 8     /* parameters per problem */
#define FJ_MOD_EXPR_MAX 1024    /* characters an expression may have */
#define FJ_MOD_NAME_MAX 31      /* characters a parameter's name may have */
#define FJ_WINDOW_MAX (1 << 30) /* the largest window size */

typedef struct fj_mod_param {
  const char *name;     /* a C identifier, not a variable, function or
                           keyword the expressions know */
  fj_mod_type type;
  int rank;             /* 0: a scalar; 1..4: a tensor */
  int64_t extents[4];   /* a tensor's extents, 1..INT32_MAX each */
  const void *data;     /* a tensor's device memory (host memory for
                           fj_reference_fwd and _bwd) */
  double value;         /* a scalar's value (an I32 scalar: an integer in
                           int32's range) */
} fj_mod_param;

struct fj_mods {
  const char *score;    /* score expression, or NULL / "" for none */
  const char *mask;     /* mask expression (true keeps the pair), or NULL /
                           "" for none */
  const fj_mod_param *params;
  int num_params;       /* 0..FJ_MOD_PARAMS_MAX */
  /* A sliding window (built in, with tile skipping): query q sees keys
   * q + off - window_left .. q + off + window_right, where off is the
   * causal mask's diagonal (0 top-left, seq_kv - seq_q bottom-right; with
   * no causal mask, bottom-right as FlashAttention aligns it).  -1: that
   * side unbounded; both -1 (fj_mods_init's): no window.  0..FJ_WINDOW_MAX
   * otherwise.  A causal mask is the window (-1, 0): with one, window_right
   * must be -1 or 0. */
  int window_left;
  int window_right;
  /* > 0: logit soft-capping, softcap * tanh(s / softcap), applied after
   * the score expression (Gemma 2's 50, Grok's 30).  0: none.  The
   * kernels take tanh from the special-function unit (tanh.approx.f32,
   * relative error about 2^-11, as FlashAttention does): a capped score
   * is within about softcap * 2^-11 of the exact one. */
  float softcap;
  /* Attention sinks (GPT-OSS, StreamingLLM): a per-query-head logit that
   * joins every row's softmax denominator but has no value row:
   *   O[q] = sum_kv exp(s'[kv]) V[kv] / (exp(sink[h]) + sum_kv exp(s'[kv]))
   * with s' the modified score (natural units, after the scale), and the
   * log-sum-exp log(exp(sink[h]) + sum_kv exp(s'[kv])).  Device memory,
   * float32 [heads_q] (host memory for fj_reference_fwd and _bwd); NULL:
   * none.
   * Whether sinks are on belongs to the kernel (named "_sink"); the values
   * are a launch argument. */
  const float *sinks;
  /* A block mask (fj_block_mask, below): which key blocks each query block
   * computes at all, and which of those skip the per-element mask.  NULL:
   * none.  Its block sizes belong to the kernel (named "_bm" + sizes);
   * its arrays are launch arguments. */
  const struct fj_block_mask *block_mask;
  /* 1: checked mode.  A tensor parameter read outside its extents still
   * reads 0, and the call that launched the kernel waits for it and
   * returns FJ_ERR_INVALID_ARG naming the first such read: the tensor,
   * its indices and its extents.  In checked mode the expressions run only
   * on pairs the result uses, so every read reported is the expression's
   * own.  For finding bad indices, not for speed
   * (each call synchronises its stream).  0: off, unless the environment
   * sets FLASHJIT_CHECK_BOUNDS=1 (read once, at the first call that
   * looks).  A problem without a tensor parameter has nothing to check.
   * Named "_chk". */
  int checked;
  /* Gradients of the score expression's float tensor parameters, for the
   * backward (fj_attention_bwd, fj_reference_bwd; the forward ignores
   * it): NULL (none), or num_params pointers, each NULL or float32 memory
   * holding parameter i's extents, contiguous and row-major, to which the
   * backward *adds* d loss / d parameter at each element the score
   * expression read for a pair the result uses (a read outside the
   * extents adds nothing; the mask expression's reads add nothing).
   * Device memory for fj_attention_bwd, host memory for fj_reference_bwd.
   * Only F32, F16 and BF16 tensors have a gradient: a pointer for an I32
   * tensor or a scalar is FJ_ERR_INVALID_ARG.  fj_attention_bwd adds with
   * float32 atomics, whose order varies run to run; with
   * fj_problem.deterministic, as 64-bit fixed point in the workspace (16
   * bytes an element of each parameter with a gradient: integers, whose
   * sum is the same in any order), added to the gradient once at the end:
   * bit-identical run to run, exact to 2^-56 of each value, for values and
   * sums below 2^38 in magnitude (a value beyond, or inf or NaN, is added
   * as float32, as in the other mode; a sum past 2^39 wraps, undetected).  Which parameters have a gradient
   * belongs to the backward's kernel. */
  float *const *param_grads;
};

/*
 * A block mask (FlexAttention's BlockMask layout): per query block of
 * block_q rows, the key blocks of block_kv keys that the mask keeps in
 * part ("partial": the kernel applies the mask expression per element)
 * and those it keeps whole ("full": no per-element mask expression; the
 * built-in causal mask, window and sequence ends still apply).  Key
 * blocks in neither list are never loaded.  Each key block should appear
 * at most once in the two lists of a query block.
 *
 * Arrays are int32 in device memory, row-major:
 *   kv_num [batch][heads][q_blocks]            partial key blocks per query block
 *   kv_indices [batch][heads][q_blocks][kv_blocks]   their indices, first kv_num used
 *   full_num, full_indices                     the same for full blocks (both NULL: none)
 * batch is 1 (one mask for every batch index) or the problem's batch;
 * heads 1 or the problem's heads_q.  q_blocks = ceil(seq_q / block_q),
 * kv_blocks = ceil(seq_kv / block_kv).  Counts are clamped to 0..kv_blocks
 * and an index outside 0..kv_blocks - 1 reads no keys: a bad array gives
 * wrong results, never a read outside the tensors.
 *
 * The same blocks the other way round (FlexAttention's q_num_blocks,
 * q_indices, full_q_num_blocks, full_q_indices): per key block, the query
 * blocks that keep it in part and whole, each list ascending:
 *   q_num [batch][heads][kv_blocks]            partial query blocks per key block
 *   q_indices [batch][heads][kv_blocks][q_blocks]   their indices, first q_num used
 *   full_q_num, full_q_indices                 the same for full blocks
 * The backward (fj_attention_bwd), which keeps a key tile and walks the
 * query tiles that see it, reads these; the forward ignores them.  The
 * backward needs q_num and q_indices, and full_q_num and full_q_indices
 * exactly where full_num and full_indices are given (both NULL: none),
 * and takes the two directions to describe the same blocks: where they
 * disagree, its gradients are those of the mask the transposed lists
 * describe.  Counts and indices are clamped as above.
 * fj_block_mask_build fills both directions.
 *
 * block_q and block_kv are 64, 128 or 256 (FlexAttention's default is
 * 128, 128).  The kernel's tiles must divide them: fj_attention_fwd picks
 * such a variant, and a given variant whose tile_m does not divide
 * block_q or whose tile_n does not divide block_kv is refused, naming
 * both.  The backward's tiles (64 x 64) divide every block size.
 */
typedef struct fj_block_mask {
  int block_q, block_kv;
  int batch, heads;
  int q_blocks, kv_blocks;
  const int32_t *kv_num;
  const int32_t *kv_indices;
  const int32_t *full_num;
  const int32_t *full_indices;
  /* the transposed lists (the backward's; NULL where not given) */
  const int32_t *q_num;
  const int32_t *q_indices;
  const int32_t *full_q_num;
  const int32_t *full_q_indices;
} fj_block_mask;

/* Fills m with no expressions, no parameters, no window and no softcap.
 * m NULL: does nothing. */
FJ_API void fj_mods_init(fj_mods *m);

/*
 * Checks mods on their own: the expressions' grammar and names, the
 * parameters (names unique and not reserved, types, ranks, extents, a
 * tensor's data not NULL, an integer scalar's value), the window and the
 * softcap.  FJ_ERR_INVALID_ARG with a message naming the expression or
 * field, the offending token and its column or the value and the limit,
 * in fj_errmsg(NULL).  fj_problem_check makes this check for p->mods.
 */
FJ_API fj_status fj_mods_check(const fj_mods *m);

/*
 * The named built-in modifications, as the expressions the kernels use:
 * the ones that are expressions (ALiBi, a relative-position bias table,
 * document masking, prefix-LM) to paste into fj_mods.score / .mask with
 * the parameters listed, and, for reading, the built-in fields' own
 * formulas (softcap, window, causal, sinks: set through their fields).
 * Returns the table (static storage) and its length in *count (count may
 * be NULL).  fj_mod_builtin_find: the entry of that name, or NULL.
 */
typedef struct fj_mod_builtin {
  const char *name;     /* "alibi", "documents", ... */
  const char *score;    /* the score expression, or NULL */
  const char *mask;     /* the mask expression, or NULL */
  const char *params;   /* the parameters it reads: "slopes:f32[heads_q]" */
  const char *field;    /* NULL, or the fj_mods field that is this built-in
                           ("softcap", "window_left/window_right", ...):
                           its formula is for reading, not for pasting */
  const char *about;    /* one line */
} fj_mod_builtin;

FJ_API const fj_mod_builtin *fj_mod_builtins(int *count);
FJ_API const fj_mod_builtin *fj_mod_builtin_find(const char *name);

/*
 * Block masks built by the library: fj_block_mask_build evaluates p's mask
 * -- p->mods' mask expression with its parameters, the causal mask, the
 * window and the sequence ends -- at every (query, key) pair on the GPU,
 * one thread block per row of blocks, and keeps per block only whether
 * it is empty, partial or full: the dense mask never exists.  The result
 * (*out, whose arrays point into buf) serves every later call with the
 * same shape, mask and parameters' values: every layer, every step.
 *
 * Its batch is 1 unless the mask expression reads b, and its heads 1
 * unless it reads h or hkv, so that a mask the same for every head is
 * built once.  block_q and block_kv: 64, 128 or 256.  The problem's
 * other fields (tensors, dtypes) are not read; varlen and paged problems
 * are refused.
 *
 * Both directions are built in the one launch: per query block its key
 * blocks (the forward's lists) and per key block its query blocks (the
 * backward's q_num, q_indices, full_q_num, full_q_indices).
 *
 * fj_block_mask_size: the device bytes the mask takes.
 * fj_block_mask_build: fills buf (device memory of at least that size,
 * 16-byte aligned) on stream, asynchronously like a kernel launch (so
 * graph capturable), and *out at once.  Needs a GPU context.
 */
FJ_API fj_status fj_block_mask_size(fj_ctx *ctx, const fj_problem *p,
                                    int block_q, int block_kv, size_t *bytes);
FJ_API fj_status fj_block_mask_build(fj_ctx *ctx, const fj_problem *p,
                                     int block_q, int block_kv, void *buf,
                                     size_t bytes, fj_block_mask *out,
                                     void *stream);

#define FJ_SPLITS_MAX 256

/* Fills p for contiguous tensors in the given order, with dtype for all of
 * Q, K, V, O, no causal mask and the default scale.  p NULL: does nothing.
 * FJ_THD (packed tokens) leaves the varlen arrays for the caller to set.
 * An order that is none of FJ_BHSD, FJ_BSHD, FJ_THD gets no layout guessed: the
 * strides are left 0, and fj_problem_check refuses the problem, saying
 * that they were never set (unless every batch, head and sequence extent
 * is 1, where no layout is needed). */
FJ_API void fj_problem_init(fj_problem *p, int batch, int heads_q,
                            int heads_kv, int seq_q, int seq_kv,
                            int head_dim, fj_dtype dtype, fj_order order);

/*
 * Validates a problem: positive sizes (batch and heads at most 65535,
 * sequences at most 2^30), heads_kv dividing heads_q, a head dim and dtypes
 * the context's target supports, head_dim_v 0 or a multiple of 8 from 8 to
 * FJ_HEAD_DIM_V_MAX (which family takes a split one is the plan's to say), a known mask, a finite scale, FP8 scales
 * for e4m3 K/V, splits 0..FJ_SPLITS_MAX, the varlen and paged fields
 * consistent (batch strides 0 with cu_seqlens, a power-of-two page size,
 * a block table long enough for seq_kv, no cu_seqlens_kv with pages; the
 * arrays themselves are device memory: see fj_problem_check_lengths), and strides: none negative,
 * not all 0 (fj_problem_init's unknown order), every tensor's last element within signed 64-bit byte
 * offsets (what the kernels index with), and O's rows apart -- from the
 * smallest stride out, each dimension of extent above 1 steps past all
 * the elements inside it (rows that interleave without meeting are
 * refused too).  The message names the field, its value and the limit.
 * ctx and p must not be NULL.
 */
FJ_API fj_status fj_problem_check(fj_ctx *ctx, const fj_problem *p);

/*
 * Checks the index arrays of a varlen or paged problem, given as HOST
 * copies in p (cu_seqlens_q, cu_seqlens_kv, seqused_kv, block_table): the
 * prefix sums start at 0 or more and never decrease, every length is
 * within seq_q / seq_kv, and every table entry a sequence uses is a page
 * in 0..num_pages - 1.  The kernels cannot report these (they clamp
 * instead): a caller that wants the check runs it on the host before
 * uploading.  FJ_ERR_INVALID_ARG with the first bad entry, its index and
 * the limit in fj_errmsg(NULL); FJ_OK for a problem with no arrays.
 */
FJ_API fj_status fj_problem_check_lengths(const fj_problem *p);

typedef enum fj_choice {
  FJ_CHOICE_HEURISTIC = 0,
  FJ_CHOICE_TUNED = 1
} fj_choice;

/* The variant fj_attention_fwd would use for p, and where it came from
 * (from may be NULL; ctx, p and v may not). */
FJ_API fj_status fj_attention_variant(fj_ctx *ctx, const fj_problem *p,
                                      fj_variant *v, fj_choice *from);

/*
 * What fj_attention_fwd launches for a problem: the attention kernel's
 * variant and grid, and for split-KV the number of key ranges, the combine
 * kernel's grid and the workspace it needs.
 *
 * The choice: problems with few query rows per KV head (seq_q x group at
 * most 128 and seq_q at most 16: decode, speculative decode) take the mma
 * family with GQA packing; others the family the context's target runs
 * best (fj_variant_default); split head dims (head_dim_v) the wgmma family
 * on sm_90a whatever the shape, with the tiles of the wider head dim,
 * where it takes them (both at most 256, dense or packed, no splits asked
 * for); head dims above 256 and the other split ones the mma family's
 * 16-row tiles whose warps split the keys (and V's columns above 256),
 * V read from K's rows where head_dim_v is below head_dim.  Splits (problem.splits 0): none when the
 * grid already fills the multiprocessors (0.8 of a wave or more); one
 * block a multiprocessor where that fills 90% of them and leaves each
 * block 32 key tiles or more (a long decode: 16 splits for 8 KV heads
 * on 132 multiprocessors);
 * otherwise the fewest (for decode shapes, or 16 key tiles or more; none for 4 or
 * fewer), at most 128 and at most the key tiles, whose
 * waves are at least 85% as full as the best count's -- FlashAttention's
 * rule, with the blocks each multiprocessor holds (shared memory, and 255
 * registers a thread) counted.  A compile-only context plans for
 * fj_ctx_opts.sm_count multiprocessors, or its architecture's largest
 * part (sm_75 72, sm_80 108, sm_86 and sm_88 84, sm_87 16, sm_89 128,
 * sm_90 132, sm_100 and sm_103 148, sm_110 20, sm_120 170, sm_121 48).
 * Renders the kernel (for its shared memory) but does not compile it.  ctx, p and plan may not be NULL.
 */
typedef struct fj_plan {
  fj_variant variant;      /* the attention kernel */
  fj_choice from;          /* heuristic or tuned */
  int splits;              /* key ranges per row tile; 1: no combine */
  int rows;                /* rows the kernel's tiles cover per (batch, KV
                              head) when packed (seq_q x group), else per
                              (batch, query head) (seq_q) */
  unsigned grid[3];        /* the attention kernel's grid */
  unsigned threads;        /* its block */
  unsigned smem_bytes;     /* its dynamic shared memory */
  int blocks_per_sm;       /* how many of its blocks a multiprocessor holds
                              (what the split rule counted) */
  int sm_count;            /* the multiprocessors planned for */
  unsigned combine_grid[3];    /* splits > 1: the combine kernel's grid */
  unsigned combine_threads;
  int combine_cols;        /* splits > 1: O's columns a combine block takes
                              (combine_grid[1] slices of them): head_dim_v,
                              or 128 where O is wider and the row blocks
                              (combine_grid[0]) are fewer than sm_count */
  size_t workspace_bytes;  /* splits > 1: float32 partial rows and their
                              log-sum-exp; the wgmma family's varlen
                              kernels: 16 + 4 x grid[0], the counter their
                              blocks claim work tiles from (zeroed by each
                              call, in stream order) and each block's
                              current tile; 0 otherwise */
} fj_plan;

FJ_API fj_status fj_attention_plan(fj_ctx *ctx, const fj_problem *p,
                                   fj_plan *plan);

/* The workspace fj_attention_fwd_plan needs for p: plan.workspace_bytes
 * (0 when the library's choice needs none). */
FJ_API fj_status fj_attention_workspace_size(fj_ctx *ctx, const fj_problem *p,
                                             size_t *bytes);

/*
 * O = softmax(scale * Q K^T [masked]) V for every (batch, head).
 * q, k, v, o are device pointers laid out as p's strides say; lse, if not
 * NULL, receives the natural-log sum-exp of each row as float32,
 * [batch][heads_q][seq_q] contiguous.  stream is a CUstream / cudaStream_t
 * (NULL: the legacy default stream).  The call is asynchronous like a kernel
 * launch.  Picks the variant (tuning database, else the heuristic),
 * compiles or fetches it, and launches it.  lse and stream may be NULL;
 * the rest may not (FJ_ERR_INVALID_ARG naming the argument).  Device
 * memory of a device other than the context's (any pointer of the call:
 * tensors, workspace, scales, varlen and paged arrays, the arrays of
 * p->mods) is refused before anything is queued, FJ_ERR_INVALID_ARG
 * naming the argument and both devices; managed and page-locked host
 * memory pass.  The call runs in the context's CUDA context whatever
 * context the calling thread has current; stream must belong to the
 * context's device.
 */
FJ_API fj_status fj_attention_fwd(fj_ctx *ctx, const fj_problem *p,
                                  const void *q, const void *k, const void *v,
                                  void *o, float *lse, void *stream);

/*
 * Runs a plan (from fj_attention_plan for the same problem; its variant and
 * splits may be changed: a split variant runs with 1 or more splits, an
 * unsplit one with 1).  workspace: device memory of at least
 * plan->workspace_bytes, 16-byte aligned, used only by this call's kernels
 * in stream order -- a caller that captures CUDA graphs passes its own.
 * NULL: the context's, one per stream and calling thread, grown as
 * needed and freed with the context (never while a captured graph may
 * still use it); while the
 * stream is being captured it cannot grow, and a call that needs more than
 * that stream's workspace already holds fails with FJ_ERR_INVALID_ARG
 * saying so.  workspace_bytes is ignored for a NULL workspace.
 */
FJ_API fj_status fj_attention_fwd_plan(fj_ctx *ctx, const fj_problem *p,
                                       const fj_plan *plan, const void *q,
                                       const void *k, const void *v, void *o,
                                       float *lse, void *workspace,
                                       size_t workspace_bytes, void *stream);

/* As fj_attention_fwd, with the variant given (its head_dim, head_dim_v,
 * dtypes and causal mode must match the problem; a NULL v is named "v (the variant)",
 * a NULL v_ptr "v").  A split_kv variant splits as problem.splits says (0:
 * the plan's rule); an unsplit one refuses splits above 1. */
FJ_API fj_status fj_attention_fwd_variant(fj_ctx *ctx, const fj_problem *p,
                                          const fj_variant *v, const void *q,
                                          const void *k, const void *v_ptr,
                                          void *o, float *lse, void *stream);

/* ------------------------------------------------------------------------ */
/* Merging partial results: split-KV's combine, for any caller                */

/*
 * Merges `parts` partial results of attention over the same query rows,
 * each over its own disjoint set of keys -- split-KV's key ranges, the
 * steps of a ring over sequence shards (context parallelism), a KV cache
 * held in pieces -- into the attention over all of those keys, on the
 * GPU, with the kernel that merges split-KV's partials
 * (templates/combine.cu).  For each row (b, h, i) of p:
 *
 *   lse = log(sum_s exp(lse_s))          natural log; the max taken first
 *   O   = sum_s exp(lse_s - lse) O_s
 *
 * where O_s is part s's output, normalised over its own keys, and lse_s
 * the natural-log sum-exp of the row's scaled (and modified) scores over
 * those keys: what fj_attention_fwd writes to o and lse.  The LSE
 * conventions are fj_attention_fwd's: natural log, float32, and -inf for
 * a part that saw no key of the row, which adds nothing (its O_s must be
 * finite: fj_attention_fwd writes 0).  A row that no part saw gets O = 0
 * and lse = -inf; a NaN lse_s makes its row NaN.  The sum runs over the
 * parts in their order, part 0 first, in float32, the same order every
 * run: the result does not depend on timing.  With sinks
 * (p->mods->sinks, device memory, float32 [heads_q]) the row's head's
 * sink joins once, lse = log(exp(sink[h]) + sum_s exp(lse_s)), so the
 * parts must leave it out; a row no part saw then gets O = 0 and lse =
 * the sink.
 *
 * p describes O: batch, heads_q, seq_q, head_dim (head_dim_v where it is
 * set: O's columns, the parts' too), dtype (O is f16 or
 * bf16; bf16 for an e4m3 problem, as its attention writes), o_stride,
 * and for varlen rows cu_seqlens_q (device memory; a row past its
 * sequence's end is not written).  The rest of p is checked as
 * fj_problem_check checks it, and not used.  Layouts, those of the
 * split-KV workspace (fj_plan.workspace_bytes):
 *   o_parts    float32 [parts][batch][heads_q][seq_q][head_dim], contiguous
 *   lse_parts  float32 [parts][batch][heads_q][seq_q], contiguous
 *   o          p's dtype in p->o_stride
 *   lse        float32 [batch][heads_q][seq_q], or NULL
 * o and lse must not overlap the parts.  parts: 1..FJ_SPLITS_MAX.
 * Asynchronous on stream like fj_attention_fwd (NULL: the legacy default
 * stream); memory of another device is refused as it refuses it.  A
 * compile-only context builds the kernel (into the caches, as
 * fj_cache_prewarm would) and then returns FJ_ERR_COMPILE_ONLY.  Errors:
 * FJ_ERR_INVALID_ARG for a NULL ctx, p, o_parts, lse_parts or o, parts
 * out of range, a float32 pointer not 4-byte aligned or o not 2-byte
 * aligned, and what fj_problem_check refuses (the message names the
 * argument, its value and the limit); FJ_ERR_UNSUPPORTED for more rows
 * than one grid merges.  fj_reference_merge is its float64 form on the
 * host.
 */
FJ_API fj_status fj_attention_merge(fj_ctx *ctx, const fj_problem *p,
                                    int parts, const float *o_parts,
                                    const float *lse_parts, void *o,
                                    float *lse, void *stream);

/* ------------------------------------------------------------------------ */
/* The backward                                                               */

/*
 * What the backward launches for a problem: a preprocess (delta =
 * rowsum(dO o O), dQ's float32 accumulator cleared), the main kernel (K
 * and V stationary; dK and dV summed over each GQA group in registers, dQ
 * added into the accumulator, in key-tile order under p->deterministic)
 * and a postprocess (dQ in the inputs' dtype, the sinks' gradient).
 */
typedef struct fj_bwd_plan {
  fj_variant variant;      /* the main kernel's tiles and axes */
  unsigned grid[3];        /* its grid: blocks of key tiles (two a tile
                              for a cluster pair), KV heads, batch */
  unsigned threads;        /* its block */
  unsigned smem_bytes;     /* its dynamic shared memory */
  unsigned rows_grid;      /* the pre- and postprocess' blocks (16 rows each) */
  size_t workspace_bytes;  /* delta, LSE2 and dQ's accumulator, float32,
                              over rows padded to 64, a counter per
                              64 x 64 tile of dQ (deterministic turns),
                              and in deterministic mode 16 bytes per
                              element of each parameter with a gradient
                              (fj_mods.param_grads) */
} fj_bwd_plan;

/* The plan of the backward of p (no compile; a compile-only context plans
 * too).  The main kernel is the tuning database's pick where fj_tune_bwd
 * recorded one for p's class on this GPU (its family and stages, where
 * the target still takes them), else the wgmma family's
 * (warp-specialised, TMA, 64 x 128 tiles; 64 x 64 above head dim 128,
 * and without a window or block mask there 64 x 128 split over a
 * cluster of two blocks, grid[0] counting blocks) on
 * sm_90a for head dims 64 to 256 in multiples of 16, else the mma
 * family's (64 x 64 tiles, two stages of Q and dO where the shared memory
 * holds them, else one).  Score and mask expressions (fj_mods.score,
 * .mask) run on both families: dS is multiplied by the
 * score expression's derivative with respect to s, generated from the
 * expression (the chain rule; the branch a ?: takes; int parts and floorf,
 * ceilf, roundf, truncf contribute 0), at the raw scaled score;
 * `flashjit emit --backward` shows it after #line 1 "score'".  The
 * float tensor parameters' gradients are added where fj_mods.param_grads
 * asks (float32 atomics at the indices each read used; fixed point in
 * the workspace in deterministic mode; on the mma family above head dim
 * 128).  A context remembers its
 * choices (until a tuning result is recorded), so a repeated plan renders
 * nothing.  A block mask (fj_mods.block_mask) runs on the wgmma family
 * where its key blocks are whole key tiles (block_kv a multiple of 128
 * up to head dim 128, of 64 above), else on the mma family; either
 * walks each key tile's query blocks from the mask's transposed
 * lists (q_num, q_indices; fj_attention_bwd and _run refuse a mask
 * without them, FJ_ERR_INVALID_ARG); in deterministic mode on the mma
 * family (each key tile's turn counts the visits of its query tile by the
 * key tiles before it, replaying their walks of the same lists; _run
 * refuses a wgmma plan there, FJ_ERR_UNSUPPORTED).  Refused, FJ_ERR_UNSUPPORTED
 * with the reason: paged problems, FP8, head dims above 256, architectures
 * before sm_80 (head dims that are not multiples of 32 run padded to the
 * next one on the mma family, 64-column panels on wgmma), and sizes its
 * kernels cannot count in 32-bit ints: batch x heads_q x seq_q rounded up
 * to 64 above (2^31 - 1) x 16 rows, key tiles x heads_kv x batch above
 * 2^31 - 1 blocks, a deterministic mode's parameter gradients past 2^63
 * bytes of workspace.  Varlen problems (cu_seqlens,
 * seqused_kv) run on either family; on wgmma only with total_q and
 * total_kv given where Q or K is packed.  ctx, p and plan may not be
 * NULL. */
FJ_API fj_status fj_attention_bwd_plan(fj_ctx *ctx, const fj_problem *p,
                                       fj_bwd_plan *plan);

/* Starts compiling, each on a thread of its own, those of the backward's
 * three kernels for p (as fj_attention_bwd_plan chooses them) that the
 * caches lack, and returns without waiting: a later fj_attention_bwd or
 * fj_attention_bwd_kernel of p waits for those compiles instead of
 * starting its own.  For a training step's first forward: its backward's
 * compile then overlaps the forward's compile and run.  A context keeps
 * a handful under way (beyond, nothing more starts; the call compiles as
 * without).  Errors: p's (as fj_attention_bwd_plan's) and a failure to
 * render; a compile's failure is reported by the call that waits for it.
 * Works on compile-only contexts. */
FJ_API fj_status fj_attention_bwd_prefetch(fj_ctx *ctx, const fj_problem *p);

/* The backward's kernels, for inspection (no GPU needed): which 0 is the
 * preprocess, 1 the main kernel, 2 the postprocess, of the plan's variant
 * for p.  Built (compiled or fetched from the caches) like fj_kernel_get's;
 * the kernel belongs to the context.  FJ_ERR_INVALID_ARG for which outside
 * 0..2. */
#define FJ_BWD_KERNELS 3
FJ_API fj_status fj_attention_bwd_kernel(fj_ctx *ctx, const fj_problem *p,
                                         const fj_bwd_plan *plan, int which,
                                         fj_kernel **kernel);

/*
 * The kernel that fills p's score expression's relative table before the
 * attention kernels of p's forward and backward (README, "Relative
 * tables": the score's subtree of the query head and the distance alone,
 * evaluated once a launch into the workspace), compiled or fetched from
 * the caches (no GPU needed), for reading (fj_kernel_source, ...).  The
 * kernel belongs to ctx (valid until fj_ctx_destroy; never freed by the
 * caller); threads may call this at once on one context.
 * FJ_ERR_NOT_FOUND where p's kernels read none (no such subtree, checked
 * mode, eight parameters of the user's, FLASHJIT_REL_TABLE=0);
 * FJ_ERR_INVALID_ARG for a NULL argument or a problem fj_problem_check
 * refuses, with one line naming it.  CLI: flashjit emit --rel-table.
 */
FJ_API fj_status fj_rel_table_kernel(fj_ctx *ctx, const fj_problem *p,
                                     fj_kernel **k);

/*
 * The gradients of attention: given the forward's inputs q, k, v, its
 * output o and log-sum-exp lse (fj_attention_fwd's, natural log,
 * [batch][heads_q][seq_q] float32) and dout, the gradient of the loss at
 * O (laid out as p->o_stride says), writes dq, dk, dv in p's dtype, laid
 * out as p's q_stride, k_stride and v_stride say (dk and dv have heads_kv
 * heads: the gradients summed over each GQA group), so none of those
 * strides may be 0 (a broadcast input has no gradient of its own there).
 * dsinks, if not NULL, receives the gradient of p->mods's sinks, float32
 * [heads_q] (it needs sinks).  Every mask and built-in modification the
 * forward takes, expressions and block masks included (see
 * fj_attention_bwd_plan).  dq's additions run in whatever order the GPU
 * makes them (float32 reduce-adds): dq may differ in its last bits from
 * run to run, unless p->deterministic asks for one order (dk, dv and
 * dsinks are the same bits every run either way).  Asynchronous like fj_attention_fwd, on the
 * context's workspace for the stream (as fj_attention_fwd_plan's NULL
 * workspace); stream may be NULL.
 */
FJ_API fj_status fj_attention_bwd(fj_ctx *ctx, const fj_problem *p,
                                  const void *q, const void *k, const void *v,
                                  const void *o, const void *dout,
                                  const float *lse, void *dq, void *dk,
                                  void *dv, float *dsinks, void *stream);

/* fj_attention_bwd with a plan (fj_attention_bwd_plan's, for the same
 * problem) and a caller's workspace of at least plan->workspace_bytes,
 * 16-byte aligned (NULL: the context's): nothing is allocated, so a
 * captured graph may replay it. */
FJ_API fj_status fj_attention_bwd_run(fj_ctx *ctx, const fj_problem *p,
                                      const fj_bwd_plan *plan, const void *q,
                                      const void *k, const void *v,
                                      const void *o, const void *dout,
                                      const float *lse, void *dq, void *dk,
                                      void *dv, float *dsinks, void *workspace,
                                      size_t workspace_bytes, void *stream);

/* The bytes of kernel arguments a launch record holds (the parameter
 * block, the tensor maps and the modifications' values fit in it). */
#define FJ_LAUNCH_PARAMS_BYTES 2048

/* One kernel launch as cuLaunchKernel takes it. */
typedef struct fj_launch_rec {
  void *function;        /* CUfunction, the context's: valid until
                            fj_ctx_destroy */
  unsigned grid[3];
  unsigned block[3];
  unsigned smem_bytes;   /* dynamic shared memory */
  void *stream;          /* the call's */
  void *args[3];         /* kernelParams, pointing into the record's params
                            (so valid in the record that was filled, not in
                            a copy of it) */
} fj_launch_rec;

/* What one attention call launched, filled by the calls of a thread that
 * records (fj_launch_record). */
typedef struct fj_launches {
  int count;             /* 0: nothing recorded (a failed or checked call,
                            or one whose score expression's relative
                            table was built first: README); 1; 2: a
                            split-KV call, the attention kernel and then
                            the combine, or FP8 attention (dtype e4m3),
                            its V^T pass and then the attention kernel */
  uint64_t zero_at;      /* not 0: before the launches the call set
                            zero_words 32-bit words at this device address
                            to 0 on the stream (a dynamic walk's counter,
                            or FP8 attention's o_amax: never both;
                            cuMemsetD32Async); a replay must too */
  size_t zero_words;
  fj_launch_rec launch[2];
  unsigned char params[FJ_LAUNCH_PARAMS_BYTES];  /* what args point at */
} fj_launches;

/*
 * Launch records: from this call on, each fj_attention_fwd,
 * fj_attention_fwd_plan and fj_attention_fwd_variant of the calling thread
 * (on any context) writes into *rec the kernels it launched, with their
 * grids, blocks, shared memory, stream and a copy of their arguments, so
 * that the caller can launch the very same kernels itself: time a bare
 * cuLaunchKernel beside the library's call (flashjit run does), or add
 * them to a graph of its own.  rec NULL stops recording.  rec stays the
 * caller's and must outlive the recording; one thread's record is not
 * shared with others.  A call that fails, whether refused before its
 * launches or at one of them, leaves count 0 and zero_at 0.  A call in
 * checked mode (fj_mods.checked) records count 0: its record
 * of out-of-range reads is freed when it returns; so does a call that
 * builds its score expression's relative table (a kernel of its own
 * before the attention kernel, README's "Relative tables").  The arguments name the
 * call's memory (tensors, and the context's workspace for split-KV, which
 * stays while the context lives and the stream's workspace is not grown),
 * so a replay is valid while that memory is.  Recording costs a copy of
 * about 1 KB per call; a thread that does not record pays a test.
 */
FJ_API void fj_launch_record(fj_launches *rec);

/*
 * Float64 reference on the host, for checking.  q, k, v are host arrays in
 * p's dtypes and strides (FP8 K/V: the scales are host arrays too);
 * out receives O in float64 for rows [row_begin, row_end) of every
 * (batch, head), [batch][heads_q][row_end-row_begin][head_dim_v] (head_dim_v
 * 0: head_dim); out_lse, if
 * not NULL, the matching log-sum-exp values.  Before any memory is touched
 * it checks what fj_problem_check checks without a context (sizes, head
 * dim 1..FJ_HEAD_DIM_MAX, dtypes, mask, scale, strides), 0 <= row_begin
 * <= row_end <= seq_q, that p, q, k, v and out are not NULL, and the scales for e4m3
 * K/V: FJ_ERR_INVALID_ARG, with the message in fj_errmsg(NULL).  For a
 * varlen or paged problem, p's cu_seqlens_q, cu_seqlens_kv, seqused_kv
 * and block_table are host arrays here, checked first as
 * fj_problem_check_lengths checks them; rows are counted within each
 * sequence, and a row past its sequence's end gets O = 0 and a NaN
 * log-sum-exp (it has no output).
 */
FJ_API fj_status fj_reference_fwd(const fj_problem *p, const void *q,
                                  const void *k, const void *v,
                                  const float *k_scale, const float *v_scale,
                                  int row_begin, int row_end, double *out,
                                  double *out_lse);

/*
 * Float64 reference of the backward on the host, for checking: the
 * gradients of L = sum(dout . O), O being fj_reference_fwd's output for
 * the same problem (recomputed here row by row, with the same mask,
 * window, softcap, sinks, GQA, scale, varlen and paged rules; neither O
 * nor the log-sum-exp is taken).  q, k, v and dout are host arrays in p's
 * dtype (K/V: kv_dtype) and strides, dout in o_stride's.  dq, dk and dv
 * receive the gradients as float32 in q's, k's and v's strides: every
 * element the problem addresses is written (0 where nothing depends on
 * it: keys no row sees, a row that sees no key, dense keys past
 * seqused_kv), others are left alone; an element that strides address
 * more than once (a stride of 0, a page two sequences share) receives the
 * sum of its gradients, and dk, dv sum a GQA group's query heads.
 * dsinks, if not NULL, receives float32 [heads_q]: with p->mods->sinks,
 * the sink logits' gradients, summed over batch and rows; without, 0.
 * With p->dlse (host float32 in lse's layout) the loss's gradient at the
 * log-sum-exp is taken too.  A score expression's gradient goes through its derivative with respect
 * to s (the one fj_attention_bwd applies, evaluated on the host in float32
 * as the expression is); with fj_mods.param_grads (host float32 arrays)
 * the float tensor parameters' gradients are added there, through the
 * expression's derivatives with respect to each value it read.  A mask
 * expression only decides which keys a row sees, as a block mask does
 * (read as the forward's reference reads it: the query blocks' lists,
 * host memory; with transposed lists given too, FJ_ERR_INVALID_ARG where
 * they describe other blocks than the rows' lists, naming the first).
 * Computed in float64 throughout; it touches no memory but the arrays
 * given (and the calling thread's message).  Both references spread their
 * (batch, head) items over threads (FLASHJIT_REFERENCE_THREADS, 1-64;
 * default the online processors up to 16), each item computed as on one
 * thread, so the results do not depend on the count; the backward keeps
 * to the calling thread where items add into the same elements (sinks,
 * parameters' gradients, shared pages, strides that repeat, a packed
 * sequence's seqused_kv past its own keys).  Errors:
 * those of fj_reference_fwd for the problem and for p, q, k, v, dout, dq,
 * dk or dv NULL (FJ_ERR_INVALID_ARG naming it); FJ_ERR_UNSUPPORTED for
 * e4m3 K/V; FJ_ERR_NOMEM.  The message is in
 * fj_errmsg(NULL).
 */
FJ_API fj_status fj_reference_bwd(const fj_problem *p, const void *q,
                                  const void *k, const void *v,
                                  const void *dout, float *dq, float *dk,
                                  float *dv, float *dsinks);

/*
 * fj_attention_merge on the host in float64, for checking it and for
 * callers without a GPU: the same formulas over the parts in the same
 * order, on double arrays in the same layouts -- o_parts
 * [parts][batch][heads_q][seq_q][head_dim] and lse_parts
 * [parts][batch][heads_q][seq_q], contiguous -- into out
 * [batch][heads_q][seq_q][head_dim] (fj_reference_fwd's layout, whatever
 * p->o_stride says) and out_lse [batch][heads_q][seq_q] (may be NULL).
 * A part whose lse_s is -inf is skipped (its O_s is not read).  The sinks
 * (p->mods->sinks) and cu_seqlens_q are host arrays here, as for
 * fj_reference_fwd; a row past its sequence's end gets O = 0 and a NaN
 * log-sum-exp.  Checks p as fj_reference_fwd does (no context), parts
 * 1..FJ_SPLITS_MAX, and that p, o_parts, lse_parts and out are not NULL:
 * FJ_ERR_INVALID_ARG, with the message in fj_errmsg(NULL).  Touches no
 * memory but the arrays given (and the calling thread's message).
 */
FJ_API fj_status fj_reference_merge(const fj_problem *p, int parts,
                                    const double *o_parts,
                                    const double *lse_parts, double *out,
                                    double *out_lse);

/* Converts n host values between dtypes (float32 <-> f16, bf16, e4m3) with
 * round-to-nearest-even.  FJ_ERR_INVALID_ARG for an unknown dtype, or a
 * NULL dst or src with n above 0; the message is in fj_errmsg(NULL). */
FJ_API fj_status fj_convert(fj_dtype to, void *dst, fj_dtype from,
                            const void *src, size_t n);

/* ------------------------------------------------------------------------ */
/* Autotuning                                                                */
/* ------------------------------------------------------------------------ */

typedef struct fj_tune_opts {
  int iters;               /* timed launches per candidate, at most 256;
                              default (and 0) 10 */
  int warmup;              /* untimed launches first, 0 or more; default 2 */
  int workers;             /* compiler processes at once; 0: one per CPU, at
                              most 16 */
  int save;                /* 1 (default): record the winner in the tuning
                              database */
  fj_progress_fn progress; /* optional: steps done of total (compiles, then
                              timings) */
  void *user;
} fj_tune_opts;

typedef struct fj_tune_report {
  int candidates;      /* variants enumerated */
  int refused;         /* refused (the rules, shared memory, a launch the
                          driver refuses); the log (FJ_LOG_INFO) says why */
  int failed;          /* failed to compile or to run otherwise; the log
                          (FJ_LOG_WARN) says which and why */
  int wrong;           /* output differed from the default variant's */
  int timed;           /* candidates that ran and could win */
  double best_ms;      /* median time of the winner */
  double default_ms;   /* median time of the heuristic's variant */
  double compile_s;    /* wall time compiling */
  double total_s;      /* wall time of the whole tune */
} fj_tune_report;

/* Fills opts with the defaults above.  NULL: does nothing. */
FJ_API void fj_tune_opts_init(fj_tune_opts *opts);

/*
 * Tunes one problem class on the context's device: enumerates the variants
 * for p (tile sizes, warps, stages, swizzle, softmax path), drops those the
 * rules or the device's limits refuse, compiles the rest in child processes
 * in parallel, runs each on random inputs, checks its output against the
 * default variant's (relative error under 1e-2), and picks the fastest by
 * median time; exact ties go to the candidate enumerated first.  The winner
 * goes into the tuning database (tune.json in the cache directory, written
 * atomically) under the device, arch, driver and the problem class (head
 * dim, dtypes, causal mode, sequence-length bucket, GQA ratio), where
 * fj_attention_fwd finds it.  best, report and opts may be NULL; options
 * out of range (negative counts, iters over 256) are FJ_ERR_INVALID_ARG.
 * Needs a GPU context; allocates its own inputs (about 4 x the problem's
 * size) -- for FP8 (dtype or kv_dtype e4m3) its own descales too, so
 * that q_scale, k_scale and v_scale may be NULL; an O other than the
 * default (o_dtype) is tuned as the default's (FJ_ERR_UNSUPPORTED asks
 * for it).  A problem with modifications (mods) is tuned with the caller's
 * parameters and block mask, which must hold valid device memory, and its
 * entry is of its form (expressions, parameters' names, types and ranks,
 * built-ins, block sizes), so other forms of its class keep theirs; in
 * checked mode it is FJ_ERR_UNSUPPORTED.  Varlen and paged problems are
 * not tuned yet: FJ_ERR_UNSUPPORTED saying so (they run the heuristic's
 * pick).
 */
FJ_API fj_status fj_tune(fj_ctx *ctx, const fj_problem *p,
                         const fj_tune_opts *opts, fj_variant *best,
                         fj_tune_report *report);

/*
 * Tunes the backward of p on the context's device: the main kernels
 * fj_attention_bwd_plan could take (the wgmma family's on sm_90a, the mma
 * family's with two stages and with one), the ones the target refuses
 * counted as refused, are compiled in child processes, run through
 * fj_attention_bwd_run on random inputs (after one fj_attention_fwd for
 * O and the LSE), checked against the plan's own choice (dQ, dK and dV
 * each within a relative error of 1e-2, 3e-2 in bf16) and timed with
 * events (median of opts->iters); the fastest goes into the tuning
 * database under p's class with the key ending in "|bwd" (so that the
 * forward never takes it), where fj_attention_bwd_plan finds it.  best
 * (optional) gets the winner's plan for p; report (optional) the counts
 * and times of fj_tune_report (default_ms: the plan's own choice).
 * opts may be NULL, and is checked as fj_tune checks it (messages start
 * "fj_tune_bwd:").  Errors: what fj_attention_bwd_plan refuses (with its
 * message), FJ_ERR_UNSUPPORTED in checked mode, FJ_ERR_COMPILE_ONLY on a
 * compile-only context, FJ_ERR_TUNE when no candidate could run.  A
 * problem with sinks is tuned with the caller's (device memory), and
 * dsinks computed.  Allocates its own inputs and outputs (Q, K, V, O,
 * dO, and dQ, dK, dV twice: about 11 x Q's size without GQA).
 */
FJ_API fj_status fj_tune_bwd(fj_ctx *ctx, const fj_problem *p,
                             const fj_tune_opts *opts, fj_bwd_plan *best,
                             fj_tune_report *report);

typedef struct fj_tune_entry {
  const char *key;      /* device|arch|driver|problem class; a class with
                           modifications ends in "|mods=<hash>" (of their
                           form: the expressions are not in the database);
                           a backward's entry (fj_tune_bwd's) ends in
                           "|bwd" and its variant is the main kernel's */
  fj_variant variant;   /* the winner: the class's head dim, dtypes and
                           mask (from the key) with the tuned axes */
  double ms;            /* the winner's median time when tuned */
  double default_ms;    /* the heuristic's, for comparison */
  const char *shape;    /* the problem tuned on, "B,Hq/Hkv,Sq/Skv,D" */
  const char *date;     /* ISO 8601, UTC */
} fj_tune_entry;

typedef int (*fj_tune_visit_fn)(void *user, const fj_tune_entry *entry);

/* Visits the tuning database's entries in key order (FJ_ERR_NOT_FOUND if
 * there is none).  A file that is damaged, not a regular file, or over 64
 * MiB lists as empty (and is logged); one this process cannot read is
 * FJ_ERR_NOMEM or FJ_ERR_IO (memory, file descriptors, the disk).  The
 * entry's strings are valid during the call only. */
FJ_API fj_status fj_tune_list(fj_ctx *ctx, fj_tune_visit_fn fn, void *user);

/* ------------------------------------------------------------------------ */
/* The fragment-layout table (the LUT)                                       */
/* ------------------------------------------------------------------------ */

typedef enum fj_frag {
  FJ_FRAG_WMMA_ACC_F32 = 1,    /* accumulator, 16x16x16, float */
  FJ_FRAG_WMMA_A_F16_ROW = 2,  /* matrix_a, half, row_major */
  FJ_FRAG_WMMA_B_F16_COL = 3,  /* matrix_b, half, col_major */
  FJ_FRAG_WMMA_B_F16_ROW = 4,  /* matrix_b, half, row_major */
  FJ_FRAG_WMMA_A_BF16_ROW = 5, /* matrix_a, bf16, row_major */
  FJ_FRAG_WMMA_B_BF16_COL = 6,
  FJ_FRAG_WMMA_B_BF16_ROW = 7,
  /* mma.sync.m16n8k16, as the mma family loads and uses it.  Each table is
   * a 16x16 tile of 8 slots per lane: slots 0-3 the first n8 (or k8) half,
   * 4-7 the second.  ldmatrix moves 16-bit elements whatever their type, so
   * the operand tables serve f16 and bf16 alike; the accumulators are
   * probed through the mma of each input type. */
  FJ_FRAG_MMA_ACC_F16 = 8,     /* f32 accumulator of two f16 mma (n 0-7, 8-15) */
  FJ_FRAG_MMA_ACC_BF16 = 9,    /* the same, bf16 inputs */
  FJ_FRAG_MMA_A = 10,          /* A (m x k) by ldmatrix.x4 from row-major rows */
  FJ_FRAG_MMA_B_COL = 11,      /* B (k x n) by ldmatrix.x4 from n-major rows (K) */
  FJ_FRAG_MMA_B_ROW = 12,      /* B (k x n) by ldmatrix.x4.trans from k-major rows (V) */
  /* wgmma.mma_async m64nNk16 (sm_90a), as the wgmma family issues it.  A
   * warpgroup's accumulator is four warps' 16-row slices; each table is
   * warp 0's 16x16 corner (8 slots per lane), and the probe checks that
   * every warp w holds rows 16w + the same pattern and that column group
   * j of 16 (registers 8j..8j + 7) repeats it 16j columns on. */
  FJ_FRAG_WGMMA_ACC_F16 = 13,  /* f32 accumulator, f16 inputs */
  FJ_FRAG_WGMMA_ACC_BF16 = 14, /* the same, bf16 inputs */
  FJ_FRAG_WGMMA_A = 15,        /* A (m64 x k16) from registers (the RS form) */
  /* wgmma.mma_async m64nNk32 of e4m3 inputs (both K-major, no transpose). */
  FJ_FRAG_WGMMA_ACC_E4M3 = 16, /* f32 accumulator, e4m3 inputs (as 13) */
  FJ_FRAG_WGMMA_A8 = 17        /* A (m64 x k32) of 8-bit elements from
                                  registers (the RS form): warp 0's 16 rows x
                                  32 columns, 16 slots per lane, slot 4r + b
                                  the byte b (0 the lowest) of register r */
} fj_frag;

#define FJ_FRAG_COUNT 17
#define FJ_LUT_MAX_SLOTS 16

typedef enum fj_lut_origin {
  FJ_LUT_PROBED = 1,    /* measured on this device by this process */
  FJ_LUT_CACHED = 2,    /* measured on this device earlier, read from disk */
  FJ_LUT_REFERENCE = 3  /* compile-only context: the table seen on an H200,
                           not observed here */
} fj_lut_origin;

typedef struct fj_lut {
  fj_frag frag;
  int rows, cols;        /* the tile: 16 x 16 (16 x 32 for wgmma_a8) */
  int lanes;             /* 32 */
  int slots;             /* elements per lane (fragment num_elements) */
  /* map[lane][slot] = row * cols + col of the tile element in that slot */
  uint16_t map[32][FJ_LUT_MAX_SLOTS];
  fj_lut_origin origin;
  char device[96];       /* device the table was measured on */
} fj_lut;

/*
 * The register layout of a fragment kind.  On a GPU context the first call
 * per kind runs a probe kernel (or reads an earlier probe of the same
 * device, arch and driver from the disk cache), inverts what it stored and
 * checks that it covers the tile (the accumulator: each element exactly
 * once).  A compile-only context returns the reference table, marked so.
 * Errors: FJ_ERR_LAYOUT when the probe's result is not a valid layout;
 * FJ_ERR_UNSUPPORTED for a kind the target cannot run (bf16 and mma.sync
 * kinds before sm_80, wgmma kinds anywhere but sm_90a).
 */
FJ_API fj_status fj_layout_get(fj_ctx *ctx, fj_frag frag, fj_lut *lut);

/* "wmma_acc_f32", "wmma_a_f16_row", ...  Static; "?" for unknown. */
FJ_API const char *fj_frag_name(fj_frag frag);

/* ------------------------------------------------------------------------ */
/* Cache                                                                     */
/* ------------------------------------------------------------------------ */

/* The disk cache directory, or NULL when the context caches in memory only
 * (disabled, or the directory could not be used), or ctx is NULL. */
FJ_API const char *fj_cache_dir(const fj_ctx *ctx);

typedef struct fj_cache_stats {
  uint64_t memory_hits;
  uint64_t disk_hits;
  uint64_t misses;
  uint64_t disk_writes;
  uint64_t disk_rejects;  /* entries found corrupt, truncated or stale, or
                             no regular file of at most 256 MiB (a FIFO, a
                             link, a directory) */
  uint64_t disk_errors;   /* failed writes */
  int disk_enabled;
  /* The tiered JIT (fj_ctx_opts.jit_tiers): calls the first kernel
   * answered, and kernels whose compile started in the background. */
  uint64_t first_launches;
  uint64_t background_compiles;
  /* Kernels loaded from the kernel package (fj_ctx_opts.package_dir);
   * disk_hits counts them too. */
  uint64_t package_hits;
} fj_cache_stats;

/* This context's counters since it was created.  Does nothing when ctx or
 * stats is NULL. */
FJ_API void fj_cache_stats_get(fj_ctx *ctx, fj_cache_stats *stats);

typedef struct fj_cache_entry {
  const char *file;     /* file name inside the cache directory */
  const char *kind;     /* "kernel", "render" (a rendered source: the
                           render index), "lut" */
  const char *label;    /* the variant name or fragment kind; for an
                           invalid entry, what is wrong with it */
  uint64_t bytes;       /* file size (a symbolic link's own) */
  int64_t mtime;        /* seconds since the epoch */
  int valid;            /* 0 if the entry is corrupt or truncated, no
                           regular file of at most 256 MiB, or stale: made
                           by another NVRTC version or cache format, so
                           never looked up (its label says which) */
} fj_cache_entry;

/* Called once per entry; return non-zero to stop.  The entry's strings are
 * only valid during the call. */
typedef int (*fj_cache_visit_fn)(void *user, const fj_cache_entry *entry);

/* Visits the disk cache's entries in file-name order.  Files are read
 * without blocking and without following links.  ctx and fn must not be
 * NULL; FJ_ERR_NOT_FOUND when the disk cache is disabled; FJ_ERR_NOMEM
 * (or FJ_ERR_IO, out of file descriptors) when the directory or an entry
 * could not be read whole, never an entry left out. */
FJ_API fj_status fj_cache_list(fj_ctx *ctx, fj_cache_visit_fn fn, void *user);

/* Removes every entry (and stray temporary file: one left for ten minutes
 * or more -- a younger one may be another process's write in progress)
 * from the disk cache.  The memory cache is kept: kernels already handed
 * out stay valid.  *removed (optional: removed may be NULL) gets the
 * number of files removed. */
FJ_API fj_status fj_cache_clear(fj_ctx *ctx, int *removed);

/* Removes the entries this process cannot use -- corrupt, truncated, not
 * regular files, or stale (another NVRTC version or cache format, as
 * fj_cache_list marks them) -- and keeps the rest.  *removed (optional)
 * gets how many.  Errors: FJ_ERR_INVALID_ARG (ctx NULL), FJ_ERR_NOT_FOUND
 * (the disk cache is disabled), FJ_ERR_IO (the directory cannot be read,
 * a file cannot be removed: the message names it), FJ_ERR_NOMEM (memory
 * ran out reading the directory or an entry: an entry that could not be
 * checked is kept, and the rest pruned).  Safe beside other
 * processes using the directory: an entry being written is a temporary
 * file, which prune leaves alone. */
FJ_API fj_status fj_cache_prune(fj_ctx *ctx, int *removed);

/* ---- Moving caches between machines: prewarm, export, import ---- */

typedef struct fj_prewarm_report {
  int variants;  /* distinct variants asked for (duplicates counted once) */
  int kernels;   /* kernels made ready: the variants', the split-KV
                    combine kernels their split variants launch, and the
                    relative tables' kernels of those whose score
                    expressions take one (README) */
  int compiled;  /* kernels NVRTC compiled during the call */
  int cached;    /* kernels the memory or disk cache already had */
  int failed;    /* variants refused or failed to compile */
} fj_prewarm_report;

/*
 * Fills the disk cache ahead of use, for a fleet of machines: makes every
 * variant ready as fj_kernel_prepare does (rendered, taken from the caches
 * or compiled in child processes, `opts->workers` at once), and for each
 * split_kv variant also the combine kernel its launches need (one per head
 * dim, dtype and varlen; compiled in this process, or in a child one
 * with fj_ctx_opts.isolate_compile), and for each variant whose score
 * expression takes a relative table that table's kernel (one per
 * expression's form, likewise).  Duplicate variants (by name) are
 * prepared once.  Works on compile-only contexts: no GPU is needed.
 * each (optional: n entries) gets every variant's status; report
 * (optional) the counts above -- compiled and cached come from the
 * context's counters, so compiles other threads make on the same context
 * meanwhile are counted too.  Returns FJ_OK when every variant succeeded
 * and every entry reached the disk, else as fj_kernel_prepare (the first
 * failure, and how many, in fj_errmsg), or FJ_ERR_IO when entries could
 * not be written (a full file system: the kernels stayed in memory).  ctx may not be NULL; variants only when n is 0; opts may be
 * NULL.  n is at most 65536.
 */
FJ_API fj_status fj_cache_prewarm(fj_ctx *ctx, const fj_variant *variants,
                                  size_t n, const fj_prepare_opts *opts,
                                  fj_status *each, fj_prewarm_report *report);

/*
 * fj_cache_prewarm for the backward: makes ready the three kernels
 * fj_attention_bwd would launch for each of n problems (what
 * fj_attention_bwd_plan picks for it on this context, and
 * fj_attention_bwd_kernel gives): the distinct main kernels compiled in
 * child processes, `opts->workers` at once (progress once per main
 * kernel), then the preprocess and postprocess kernels in this process
 * (or a child one with fj_ctx_opts.isolate_compile), and a relative
 * table's kernel where a problem's score expression takes one.  Works on
 * compile-only contexts: no GPU is needed.  Problems whose three kernels
 * are the same (only their sizes differ) are prepared once.  each
 * (optional: n entries) gets every problem's status; report (optional):
 * variants counts the distinct backwards asked for (a refused problem is
 * one), kernels the distinct kernels made ready, compiled and cached as
 * fj_cache_prewarm's, failed the backwards refused or failed.  Returns
 * FJ_OK when every problem succeeded and every entry reached the disk;
 * else the first failure's status, with how many failed and that
 * problem's message (what fj_attention_bwd_plan refuses: user
 * expressions, varlen, FP8, ...), or FJ_ERR_IO when entries could not be
 * written.  ctx may not be NULL; problems only when n is 0; opts may be
 * NULL (negative workers: FJ_ERR_INVALID_ARG).  n is at most 65536.
 */
FJ_API fj_status fj_cache_prewarm_bwd(fj_ctx *ctx, const fj_problem *problems,
                                      size_t n, const fj_prepare_opts *opts,
                                      fj_status *each,
                                      fj_prewarm_report *report);

/* The kernel package the context consults after its disk cache
 * (fj_ctx_opts.package_dir or $FLASHJIT_PACKAGE_DIR), or NULL when it has
 * none (none given, or the one given could not be used: the log says
 * why), or ctx is NULL.  Static for the lifetime of ctx. */
FJ_API const char *fj_cache_package_dir(const fj_ctx *ctx);

typedef struct fj_package_report {
  int entries;     /* valid kernel and render-index entries in the package */
  uint64_t bytes;  /* their size on disk */
  int probe;       /* 1: the layout probe kernel for the arch is there */
} fj_package_report;

/*
 * Makes the context's disk cache directory a kernel package for the
 * context's arch (fj_ctx_opts.package_dir): compiles the layout probe
 * kernel a GPU context of that arch runs on its first use (so that a
 * first call compiles nothing at all), then writes or extends the
 * manifest (flashjit-package.txt: the NVRTC version, the cache format,
 * the library's version and each arch sealed).  Fill the directory first
 * with fj_cache_prewarm on a context of each arch whose cache_dir is the
 * package's and that reads no package itself (package_dir ""); seal each;
 * ship the directory as it is.  Entries of another
 * NVRTC or format in the directory are counted out, never looked up.
 * report (optional) gets the package's entries and bytes.  Errors:
 * FJ_ERR_INVALID_ARG (ctx NULL; the context reads a kernel package, whose
 * kernels its prewarm found there instead of compiling them into its
 * directory; the directory already holds a package of another NVRTC
 * version or cache format), FJ_ERR_NOT_FOUND (the disk
 * cache is disabled), FJ_ERR_IO (the manifest, or the probe kernel's
 * entries, cannot be written: then no manifest is), the probe kernel's
 * compile errors.
 */
FJ_API fj_status fj_cache_package_seal(fj_ctx *ctx, fj_package_report *report);

/* The file format of fj_cache_export, checked by fj_cache_import. */
#define FJ_CACHE_PACK_VERSION 1

typedef struct fj_cache_pack_report {
  int entries;    /* export: entries written; import: entries in the file */
  int skipped;    /* export: files left out -- invalid, of another NVRTC
                     version or cache format, or not compiler output (the
                     layout probes' "lut" entries belong to one GPU) */
  int installed;  /* import: entries written into the cache directory */
  int present;    /* import: the same entry (byte for byte) already there */
  int kept;       /* import: another valid entry already there under the
                     same key, kept (never overwritten) */
} fj_cache_pack_report;

/*
 * Writes the disk cache's valid compiler entries ("kernel": cubin, PTX and
 * log; "render": the rendered source, which spares a render) made by this
 * process's NVRTC and cache format into one file at path, for
 * fj_cache_import on other machines.  The file: a header (magic
 * "FJPACK01", FJ_CACHE_PACK_VERSION, the cache format, the NVRTC version,
 * the entry count, the length and XXH3-64 checksum of the rest), then per
 * entry its file name, size and XXH3-64 checksum and the entry file's
 * bytes.  The file is written to a temporary beside path and renamed onto
 * it, so a reader never sees part of one; only a regular file is ever
 * replaced.  report may be NULL.  Errors:
 * FJ_ERR_INVALID_ARG (ctx or path NULL, or path empty, or path is a
 * directory, device, FIFO, socket or symbolic link: nothing written),
 * FJ_ERR_NOT_FOUND (the disk cache is disabled), FJ_ERR_IO (the
 * directory or the file cannot be read or written; the message names the
 * path and the system's reason).  Thread-safe; entries other processes
 * write meanwhile may or may not be included.
 */
FJ_API fj_status fj_cache_export(fj_ctx *ctx, const char *path,
                                 fj_cache_pack_report *report);

/*
 * Installs the entries of a file from fj_cache_export into the context's
 * disk cache directory.  The whole file is checked before anything is
 * written: FJ_ERR_INVALID_ARG, with a one-line message naming the file and
 * what is wrong, when it cannot be read (missing, not a regular file, over
 * 4 GiB), is shorter than its header or than its header says (truncated),
 * has another magic (not a pack), another pack version or cache format, or
 * was exported by another NVRTC version (both versions named: its cubins
 * would never be looked up here), or an entry is corrupt (its index, file
 * name and what is wrong: its checksum, its contents, a name that is not
 * the hash of its key, a render entry whose metadata a template would be
 * refused or whose source includes anything but the toolkit headers the
 * templates include, a kernel entry whose parts are not a kernel's); then
 * the whole-file checksum.  Each entry is then
 * written atomically (temporary file + rename); an identical entry already
 * there is left alone (present), and so is a valid entry that differs
 * (kept: never overwritten); an invalid one is replaced.  A context that
 * later needs one of these kernels loads it from disk and never calls
 * NVRTC for it.  report may be NULL (it is filled as far as the call got,
 * on failure too).  Other errors: FJ_ERR_NOT_FOUND (the disk cache is
 * disabled), FJ_ERR_IO (the directory is not writable, a write failed:
 * entries written before it stay, each whole).  Thread-safe; processes
 * may import into one directory at once.
 */
FJ_API fj_status fj_cache_import(fj_ctx *ctx, const char *path,
                                 fj_cache_pack_report *report);

/* fj_cache_import_ex's flags. */
#define FJ_CACHE_IMPORT_VERIFY 1u

/*
 * fj_cache_import with flags (0: the same call).  FJ_CACHE_IMPORT_VERIFY
 * trusts no cubin of the pack: each kernel entry is compiled again, by
 * this process's NVRTC in child processes, from the pack's render entry
 * whose source it was compiled from, and its PTX and cubin must equal the
 * entry's byte for byte; a kernel entry without its rendered source in
 * the pack, one that differs, or a source that does not compile refuses
 * the whole file (FJ_ERR_INVALID_ARG naming the entry: nothing
 * imported).  This proves the cubins are what the pack's sources compile
 * to; the sources themselves are checked as on every import (metadata in
 * the template's ranges, no header but the toolkit's four) but are not
 * rendered again: whoever made the pack chose the code (README, "The
 * cache's trust model").  It costs a compile of every kernel.  Unknown
 * flag bits: FJ_ERR_INVALID_ARG.  Otherwise as fj_cache_import.
 */
FJ_API fj_status fj_cache_import_ex(fj_ctx *ctx, const char *path,
                                    unsigned flags,
                                    fj_cache_pack_report *report);

#ifdef __cplusplus
}
#endif

#endif /* FLASHJIT_H */
