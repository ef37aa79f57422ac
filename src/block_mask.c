/*
 * block_mask.c -- fj_block_mask_build: a problem's mask (the user's mask
 * expression with the causal mask, the window and the sequence ends)
 * evaluated per block on the GPU by templates/block_mask.cu, which stores
 * per query block the lists of partial and full key blocks that the
 * forward walks, and per key block those of query blocks that the
 * backward walks (fj_block_mask).  The checks of a block mask a
 * caller passes are mods.c's.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashjit.h"

#include "attention.h"
#include "block_mask.h"
#include "devptr.h"
#include "driver.h"
#include "expr.h"
#include "kernel.h"
#include "mods.h"
#include "util.h"

/* The problem as the builder reads it: p without a block mask of its own
 * (a mask is built from the expression, not from an older mask). */
typedef struct bm_problem {
  fj_problem p;
  fj_mods mods;
} bm_problem;

/* The mask's batch and heads: 1 where its expression does not read b
 * (respectively h or hkv), so that one list serves them all. */
static fj_status mask_dims(const fj_ctx *ctx, const fj_problem *p, int *batch,
                           int *heads)
{
  *batch = 1;
  *heads = 1;
  const fj_mods *m = p->mods;
  if (!m || !m->mask || !m->mask[0])
    return FJ_OK;
  fj_expr_name names[FJ_MOD_NAMES_MAX];
  int n = fj__mods_names(m, 0, names);
  char err[512];
  fj_expr *e = fj__expr_parse(m->mask, "mask", names, n, err, sizeof err);
  if (!e)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG, "mods.%s", err);
  /* Name indices 0, 1, 2: b, h, hkv (fj__mods_names). */
  if (fj__expr_uses(e, 0))
    *batch = p->batch;
  if (fj__expr_uses(e, 1) || fj__expr_uses(e, 2))
    *heads = p->heads_q;
  fj__expr_free(e);
  return FJ_OK;
}

/* The shape of the mask: its dimensions and the bytes of its arrays.  The
 * buffer holds the counts -- num [rows], q_num [cols] (the two the kernel
 * counts in, zeroed by one memset), full_num [rows], full_q_num [cols] --
 * then, 16-byte aligned, the index lists: idx and full_idx [rows][kv_blocks],
 * q_idx and full_q_idx [cols][q_blocks] (rows x kv_blocks = cols x
 * q_blocks elements each). */
typedef struct bm_shape {
  int batch, heads, q_blocks, kv_blocks;
  size_t rows;         /* batch x heads x q_blocks */
  size_t cols;         /* batch x heads x kv_blocks */
  size_t idx_offset;   /* the index lists' first byte (16-aligned) */
  size_t bytes;
} bm_shape;

static fj_status shape_of(fj_ctx *ctx, const char *fn, const fj_problem *p,
                          int block_q, int block_kv, bm_problem *bp,
                          bm_shape *s)
{
  if (!fj__block_size_ok(block_q) || !fj__block_size_ok(block_kv))
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "%s: block_%s %d is not a block size: 64, 128 or 256", fn,
                    fj__block_size_ok(block_q) ? "kv" : "q",
                    fj__block_size_ok(block_q) ? block_kv : block_q);
  bp->p = *p;
  if (p->mods) {
    bp->mods = *p->mods;
    bp->mods.block_mask = NULL;
    bp->p.mods = &bp->mods;
  }
  fj_status st = fj_problem_check(ctx, &bp->p);
  if (st != FJ_OK)
    return st;
  if (p->cu_seqlens_q || p->cu_seqlens_kv || p->seqused_kv || p->block_table)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "%s: a varlen or paged problem takes no block mask (its "
                    "sequences are already block-diagonal)",
                    fn);
  if ((st = mask_dims(ctx, &bp->p, &s->batch, &s->heads)) != FJ_OK)
    return st;
  s->q_blocks = (p->seq_q + block_q - 1) / block_q;
  s->kv_blocks = (p->seq_kv + block_kv - 1) / block_kv;
  /* One thread block per pair of blocks (grid x), heads (y), batch (z). */
  if ((int64_t)s->q_blocks * s->kv_blocks > INT32_MAX)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "%s: %d query blocks x %d key blocks is above the "
                    "builder's %d pairs of blocks; take larger blocks",
                    fn, s->q_blocks, s->kv_blocks, INT32_MAX);
  s->rows = (size_t)s->batch * (size_t)s->heads * (size_t)s->q_blocks;
  s->cols = (size_t)s->batch * (size_t)s->heads * (size_t)s->kv_blocks;
  /* The four index lists take 16 bytes a (query block, key block) pair of
   * each batch and head: up to 2^67 bytes, which a size_t would wrap
   * round to a small size. */
  double lists = 16.0 * (double)s->rows * (double)s->kv_blocks;
  if (lists > 0x1p63)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "%s: batch %d x heads %d x %d query blocks x %d key "
                    "blocks take %.3g bytes of lists, more than 2^63; "
                    "take larger blocks",
                    fn, s->batch, s->heads, s->q_blocks, s->kv_blocks, lists);
  s->idx_offset = (2 * (s->rows + s->cols) * sizeof(int32_t) + 15) / 16 * 16;
  s->bytes = s->idx_offset + 4 * s->rows * (size_t)s->kv_blocks * sizeof(int32_t);
  return FJ_OK;
}

fj_status fj_block_mask_size(fj_ctx *ctx, const fj_problem *p, int block_q,
                             int block_kv, size_t *bytes)
{
  if (!ctx || !p || !bytes)
    return fj__null_arg(ctx, "fj_block_mask_size",
                        !ctx ? "ctx" : !p ? "p" : "bytes");
  fj__clear_error(ctx);
  bm_problem bp;
  bm_shape s;
  fj_status st = shape_of(ctx, "fj_block_mask_size", p, block_q, block_kv,
                          &bp, &s);
  if (st == FJ_OK)
    *bytes = s.bytes;
  return st;
}

/* The builder's kernel for the problem's mask form and the block sizes,
 * compiled or fetched from the caches (no GPU needed); ctx->lock held. */
static fj_status builder(fj_ctx *ctx, const fj_problem *p, int block_q,
                         int block_kv, fj_kernel **k)
{
  const fj_mods *m = p->mods;
  fj_mods_info mi;
  fj__mods_info(m, &mi);
  char symbol[96];
  int user = m && ((m->mask && m->mask[0]) || m->num_params > 0);
  char hash[16] = "";
  if (user)
    snprintf(hash, sizeof hash, "_x%08x", (unsigned)(fj__mods_hash(m) & 0xffffffffu));
  snprintf(symbol, sizeof symbol, "fj_block_mask_q%d_kv%d_%s%s%s", block_q,
           block_kv,
           p->causal == FJ_CAUSAL_TOP_LEFT      ? "tl"
           : p->causal == FJ_CAUSAL_BOTTOM_RIGHT ? "br"
                                                 : "nc",
           mi.window ? "_win" : "", hash);
  const fj_param own[] = {
      {"causal", FJ_PARAM_STR, 0, fj_causal_name(p->causal), NULL},
      {"window", FJ_PARAM_BOOL, mi.window, NULL, NULL},
      {"mask_mod", FJ_PARAM_STR, 0, m && m->mask ? m->mask : "", NULL},
      {"block_q", FJ_PARAM_INT, block_q, NULL, NULL},
      {"block_kv", FJ_PARAM_INT, block_kv, NULL, NULL},
  };
  return fj__kernel_build_mods(ctx, "block_mask.cu", symbol, m, own,
                               FJ_ARRAY_LEN(own), k);
}

fj_status fj__block_mask_kernel(fj_ctx *ctx, const fj_problem *p, int block_q,
                                int block_kv, fj_kernel **k)
{
  bm_problem bp;
  bm_shape s;
  fj_status st = shape_of(ctx, "fj_block_mask_build", p, block_q, block_kv,
                          &bp, &s);
  if (st != FJ_OK)
    return st;
  pthread_mutex_lock(&ctx->lock);
  st = builder(ctx, &bp.p, block_q, block_kv, k);
  pthread_mutex_unlock(&ctx->lock);
  return st;
}

/* templates/block_mask.cu's fj::MaskOut. */
typedef struct bm_out {
  uint64_t num, full_num, idx, full_idx;
  uint64_t q_num, full_q_num, q_idx, full_q_idx;
  int32_t kv_blocks, q_blocks;
} bm_out;

/* The mask's arrays in buf (bm_shape's layout). */
typedef struct bm_arrays {
  int32_t *num, *full_num, *idx, *full_idx;
  int32_t *q_num, *full_q_num, *q_idx, *full_q_idx;
} bm_arrays;

static bm_arrays arrays_in(void *buf, const bm_shape *s)
{
  unsigned char *base = buf;
  size_t list = s->rows * (size_t)s->kv_blocks;
  bm_arrays a;
  a.num = (int32_t *)base;
  a.q_num = a.num + s->rows;
  a.full_num = a.q_num + s->cols;
  a.full_q_num = a.full_num + s->rows;
  a.idx = (int32_t *)(base + s->idx_offset);
  a.full_idx = a.idx + list;
  a.q_idx = a.full_idx + list;
  a.full_q_idx = a.q_idx + list;
  return a;
}

static uint64_t addr(const void *p)
{
  return (uint64_t)(uintptr_t)p;
}

fj_status fj_block_mask_build(fj_ctx *ctx, const fj_problem *p, int block_q,
                              int block_kv, void *buf, size_t bytes,
                              fj_block_mask *out, void *stream)
{
  if (!ctx || !p || !buf || !out)
    return fj__null_arg(ctx, "fj_block_mask_build",
                        !ctx ? "ctx" : !p ? "p" : !buf ? "buf" : "out");
  fj__clear_error(ctx);
  bm_problem bp;
  bm_shape s;
  fj_status st = shape_of(ctx, "fj_block_mask_build", p, block_q, block_kv,
                          &bp, &s);
  if (st != FJ_OK)
    return st;
  if (bytes < s.bytes)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "fj_block_mask_build: bytes %zu is below the %zu the "
                    "mask needs (fj_block_mask_size)",
                    bytes, s.bytes);
  if ((uintptr_t)buf % 16)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "fj_block_mask_build: buf %p is not 16-byte aligned", buf);
  if ((st = fj__mods_check_data(ctx, bp.p.mods)) != FJ_OK)
    return st;
  /* Compiled first: a compile-only context checks the expression's kernel
   * (FJ_ERR_COMPILE with NVRTC's message) before it refuses to launch. */
  fj_kernel *kern;
  pthread_mutex_lock(&ctx->lock);
  st = builder(ctx, &bp.p, block_q, block_kv, &kern);
  pthread_mutex_unlock(&ctx->lock);
  if (st != FJ_OK)
    return st;
  if (!ctx->has_device)
    return fj__fail(ctx, FJ_ERR_COMPILE_ONLY,
                    "fj_block_mask_build: the mask's kernel %s compiled; "
                    "cannot launch it on a compile-only context (arch %s)",
                    kern->meta.symbol, ctx->arch);
  bm_arrays a = arrays_in(buf, &s);
  fj_kparams kp;
  fj__fill_params(&kp, &bp.p, NULL, NULL, NULL, NULL, NULL);
  bm_out o = {addr(a.num), addr(a.full_num), addr(a.idx), addr(a.full_idx),
              addr(a.q_num), addr(a.full_q_num), addr(a.q_idx),
              addr(a.full_q_idx), s.kv_blocks, s.q_blocks};
  unsigned char mod_args[FJ_MOD_ARGS_MAX];
  void *args[3] = {&kp, &o, mod_args};
  fj__mods_args(bp.p.mods, 0, mod_args);  /* 0: its kernel is never checked */
  void *fn = NULL;
  if ((st = fj__cu_enter(ctx)) != FJ_OK)
    return st;
  /* buf and the parameters: this device's memory (the list leaves out
   * the attention tensors, which are NULL here). */
  fj_devptr ptrs[FJ_DEVPTR_MAX + 1];
  size_t n = fj__devptr_list(&bp.p, NULL, NULL, NULL, NULL, NULL, NULL, ptrs);
  ptrs[n++] = (fj_devptr){"buf", -1, buf};
  st = fj__devptr_check_list(ctx, "fj_block_mask_build", ptrs, n);
  if (st == FJ_OK) {
    pthread_mutex_lock(&ctx->lock);
    st = fj__kernel_function(ctx, kern, &fn);
    pthread_mutex_unlock(&ctx->lock);
  }
  /* The counts start at 0: the kernel counts each row's (column's) blocks
   * in them until its last block replaces the count with the list's.
   * num and q_num lie together. */
  if (st == FJ_OK)
    st = fj__cu_memset32_async(ctx, addr(a.num), 0, s.rows + s.cols, stream);
  if (st == FJ_OK) {
    fj_launch l = {fn, {(unsigned)(s.q_blocks * s.kv_blocks), (unsigned)s.heads,
                        (unsigned)s.batch},
                   {256, 1, 1}, 0, stream, args, 0};
    st = fj__cu_launch(ctx, &l);
  }
  fj__cu_leave(ctx);
  if (st != FJ_OK)
    return st;
  *out = (fj_block_mask){block_q, block_kv, s.batch, s.heads, s.q_blocks,
                         s.kv_blocks, a.num, a.idx, a.full_num, a.full_idx,
                         a.q_num, a.q_idx, a.full_q_num, a.full_q_idx};
  return FJ_OK;
}
