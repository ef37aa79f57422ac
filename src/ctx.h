/*
 * ctx.h -- the context every module receives, the per-thread error
 * messages, the log, and facts about the target architecture.  The
 * context's parts that belong to one module are opaque pointers here,
 * owned and freed by that module (lifecycle.c opens and closes them all).
 */
#ifndef FJ_CTX_H
#define FJ_CTX_H

#include <pthread.h>
#include <stdint.h>

#include "flashjit.h"

typedef struct fj_cache fj_cache;       /* cache.c */
typedef struct fj_tpl fj_tpl;           /* template.c */
typedef struct fj_kmap fj_kmap;         /* kernel.c */
typedef struct fj_dispatch fj_dispatch; /* attention.c */
typedef struct fj_wspace fj_wspace;     /* workspace.c */
typedef struct fj_tier fj_tier;         /* tier.c */
typedef struct fj_bwd_memo fj_bwd_memo; /* backward.c */
typedef struct fj_package fj_package;   /* package.c */
typedef struct fj_ahead fj_ahead;       /* kernel.c */

struct fj_ctx {
  uint64_t serial;  /* identifies the context in thread-local messages */
  pthread_mutex_t lock;
  fj_ctx_opts opts;
  char arch[16];    /* "sm_90a" */
  int sm;           /* 90 */
  int arch_specific; /* 1 for the "a" targets */
  int has_device;
  fj_device_info dev;
  void *cu_ctx;     /* CUcontext: the device's primary context */
  int devices;      /* CUDA devices the process sees (driver.c); with two or
                       more, a launch checks where its pointers live */
  fj_tpl *tpl;      /* Lua state, created on first render */
  fj_cache *cache;
  fj_package *package; /* package.c: a read-only kernel package, or NULL */
  fj_kmap *kernels; /* variant -> kernel */
  fj_lut luts[FJ_FRAG_COUNT + 1];   /* layout.c: the tables, once known */
  int lut_ready[FJ_FRAG_COUNT + 1];
  void *tunedb;     /* tunedb.c: the database's entries (json_t), read once */
  unsigned tunedb_generation; /* tunedb.c: bumped by every recorded result */
  fj_dispatch *dispatch; /* attention.c: what recent launches chose */
  fj_wspace *workspaces; /* workspace.c: device memory per stream */
  fj_tier *tier;    /* tier.c: the background compiles of the tiered JIT */
  fj_ahead *ahead;  /* kernel.c: compiles started ahead of their first use */
  fj_bwd_memo *bwd_memo; /* backward.c: the backward's recent choices */
  long renders;     /* templates rendered (the render index saves some) */
  char templates_hash[33]; /* the built-in templates, "" until needed */
};

/* Records a failure on the calling thread and returns status. */
fj_status fj__fail(const fj_ctx *ctx, fj_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* FJ_ERR_INVALID_ARG for a NULL argument, "fn: arg is NULL" (ctx NULL:
 * the message of calls without a context, fj_errmsg(NULL)). */
fj_status fj__null_arg(const fj_ctx *ctx, const char *fn, const char *arg);
/* Appends a further line to the calling thread's current message. */
void fj__fail_more(const fj_ctx *ctx, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Clears the calling thread's message for ctx (called on entry). */
void fj__clear_error(const fj_ctx *ctx);
/* Sets the serial that tags ctx's messages (once it is handed out). */
void fj__ctx_serial(fj_ctx *ctx);
void fj__log(const fj_ctx *ctx, fj_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Parses "sm_XY" / "sm_XYa"; 0 on success. */
int fj__parse_arch(const char *arch, int *sm, int *specific);
/* Chooses and checks ctx->arch (the device's own when arch is NULL). */
fj_status fj__ctx_set_arch(fj_ctx *ctx, const char *arch);
/* What the library knows of a target architecture: one row per compute
 * capability NVRTC targets (ctx.c's table, from the CUDA programming
 * guide's table of compute capabilities), read by the heuristic
 * (plan.c), the tuner's space (tune.c) and the refusals (variant.c,
 * kernel.c) alike.  Where a device exists its attributes stand in for
 * the limits it reports (fj__smem_limit, fj__sm_count). */
typedef struct fj_arch_info {
  int sm;             /* 86: compute capability x 10 */
  const char *parts;  /* "A10, A40, RTX 30" */
  int smem_block;     /* opt-in dynamic shared memory per block, bytes */
  int smem_sm;        /* shared memory per multiprocessor, bytes */
  int regs_sm;        /* 32-bit registers per multiprocessor */
  int regs_thread;    /* registers one thread may take */
  int threads_sm;     /* resident threads per multiprocessor */
  int sm_count;       /* multiprocessors of the largest part */
  unsigned features;  /* FJ_ARCH_* */
} fj_arch_info;

/* The instructions a kernel family needs.  WGMMA (and TMA with it) only on
 * an arch-specific ("a") target of a row that lists it. */
enum {
  FJ_ARCH_CP_ASYNC = 1u << 0, /* cp.async: the 2-3 stage rings (sm_80) */
  FJ_ARCH_MMA_SYNC = 1u << 1, /* mma.sync m16n8k16: the mma family (sm_80) */
  FJ_ARCH_BF16 = 1u << 2,     /* bf16 tensor-core operands (sm_80) */
  FJ_ARCH_FP8 = 1u << 3,      /* cvt of e4m3 pairs in hardware (sm_89) */
  FJ_ARCH_WGMMA = 1u << 4     /* wgmma.mma_async and TMA (sm_90a only) */
};

/* The row of compute capability sm (the nearest lower one for a number
 * the table lacks; sm_75's below it). */
const fj_arch_info *fj__arch_info(int sm);
/* The context's row. */
const fj_arch_info *fj__arch(const fj_ctx *ctx);
/* Whether the context's target has feature (FJ_ARCH_*): WGMMA needs the
 * "a" target too. */
int fj__arch_has(const fj_ctx *ctx, unsigned feature);
/* Largest dynamic shared memory per block on the context's target: the
 * device's attribute, else the table's. */
int fj__smem_limit(const fj_ctx *ctx);
/* Shared memory of one multiprocessor: the device's per-block limit plus
 * the 1 KB the driver reserves a block, else the table's. */
int fj__smem_sm(const fj_ctx *ctx);
/* Multiprocessors: the device's, else fj_ctx_opts.sm_count, else the
 * largest part of the target's architecture. */
int fj__sm_count(const fj_ctx *ctx);

#endif /* FJ_CTX_H */
