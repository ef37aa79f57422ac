/*
 * backward.c -- the attention backward: which problems it takes, its plan
 * (the main kernel: templates/attention_bwd_wgmma.cu on sm_90a where it
 * takes the problem, else attention_bwd_mma.cu; between bwd_rows.cu's
 * preprocess and postprocess), its workspace and its three launches.  Its
 * public functions are in flashjit.h.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "attention.h"
#include "backward.h"
#include "ctx.h"
#include "devptr.h"
#include "driver.h"
#include "kernel.h"
#include "kparams.h"
#include "mods.h"
#include "mods_kernel.h"
#include "plan.h"
#include "problem.h"
#include "rel_table.h"
#include "tunedb.h"
#include "util.h"
#include "variant.h"
#include "workspace.h"

/* The main kernel's tiles: 64 query rows by 64 keys, 8 warps (mma); 64
 * query rows by 128 keys, a producer and two consumer warpgroups (wgmma;
 * 64 keys for head dims above 128, whose consumers split by role -- or,
 * without a window or a block mask, 128 keys split over a pair of blocks,
 * a cluster of two that share dS so that each adds part of dQ's columns:
 * pair_ok, bwd_pair).
 * The workspace's rows are padded to whole query tiles (BWD_TILE). */
#define BWD_TILE 64
#define BWD_WARPS 8
#define BWD_WG_TILE_N 128
#define BWD_WG_WARPS 12
/* Rows a block of the pre- and postprocess covers, and its warps (each
 * takes BWD_ROWS / BWD_ROW_WARPS rows, their loads issued together). */
#define BWD_ROWS 16
#define BWD_ROW_WARPS 4

static fj_status unsupported(const fj_ctx *ctx, const char *what)
{
  return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                  "the backward does not take %s yet", what);
}

/* A block mask's arrays as the backward walks them, checked where a call
 * launches (a plan, like the forward's, takes a mask of NULL arrays for
 * inspection): by its transposed lists (a key block's query blocks), which
 * must be there, with full ones exactly where the forward's lists have
 * full ones (else the backward would drop or add blocks the forward
 * computed). */
static fj_status check_block_lists(const fj_ctx *ctx, const char *who,
                                   const fj_problem *p)
{
  const fj_block_mask *bm = p->mods ? p->mods->block_mask : NULL;
  if (!bm)
    return FJ_OK;
  fj_status st = fj__mods_check_blocks_data(ctx, p->mods);
  if (st != FJ_OK)
    return st;
  if (!bm->q_num || !bm->q_indices)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "%s: mods.block_mask->%s is NULL: the backward walks each "
                    "key block's query blocks (q_num, q_indices; "
                    "fj_block_mask_build fills them)",
                    who, bm->q_num ? "q_indices" : "q_num");
  if (!bm->full_num != !bm->full_q_num)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "%s: mods.block_mask->%s is NULL but %s is not: full "
                    "blocks need their lists in both directions "
                    "(fj_block_mask_build fills them)",
                    who, bm->full_num ? "full_q_num" : "full_num",
                    bm->full_num ? "full_num" : "full_q_num");
  return FJ_OK;
}

/* What the backward takes of a problem the forward takes.  Score and mask
 * expressions are taken (the mma family applies the score expression's
 * derivative, src/expr_grad.c), and the float tensor parameters'
 * gradients where fj_mods.param_grads asks (in the deterministic mode
 * through the workspace's fixed-point words: pgrad_elems);
 * block masks (their arrays: check_block_lists, at a call). */
static size_t pad_rows(const fj_problem *p);
static size_t pgrad_offset(const fj_problem *p);
static size_t pgrad_elems(const fj_problem *p);

/* What the backward counts in 32-bit ints whatever its kernel, and its
 * workspace's bytes: a problem past them is refused with the value and
 * the limit (fj__plan_fill refuses the forward's; fill_plan the main
 * kernel's own counts). */
static fj_status check_counts(fj_ctx *ctx, const fj_problem *p)
{
  uint64_t rows = pad_rows(p), blocks = (rows + BWD_ROWS - 1) / BWD_ROWS;
  if (blocks > INT32_MAX)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "batch %d x heads_q %d x seq_q %d (in query tiles of %d) "
                    "= %llu rows: the backward's row kernels take at most "
                    "%llu (%d blocks of %d)",
                    p->batch, p->heads_q, p->seq_q, BWD_TILE,
                    (unsigned long long)rows,
                    (unsigned long long)INT32_MAX * BWD_ROWS, INT32_MAX,
                    BWD_ROWS);
  size_t pg = pgrad_elems(p), bytes;
  if (pg && (__builtin_mul_overflow(pg, 2 * sizeof(long long), &bytes) ||
             __builtin_add_overflow(bytes, pgrad_offset(p), &bytes) ||
             bytes > (size_t)INT64_MAX))
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "the deterministic mode's parameter gradients: %llu "
                    "elements of 16 bytes of workspace each, past 2^63 bytes",
                    (unsigned long long)pg);
  return FJ_OK;
}

static fj_status check_problem(fj_ctx *ctx, const fj_problem *p)
{
  fj_status st = fj_problem_check(ctx, p);
  if (st != FJ_OK)
    return st;
  fj_mods_info mi;
  fj__mods_info(p->mods, &mi);
  st = fj__mods_check_grads(ctx, p->mods, "fj_attention_bwd");
  if (st != FJ_OK)
    return st;
  if (p->block_table)
    return unsupported(ctx, "paged K/V (block_table)");
  if (fj__problem_dv(p) != p->head_dim)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "the backward does not take head_dim_v %d with head_dim "
                    "%d yet: one head dim for Q, K, V and O (head_dim_v 0)",
                    fj__problem_dv(p), p->head_dim);
  if (p->dtype == FJ_E4M3)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "the backward does not take dtype e4m3 (FP8 attention "
                    "runs forward only): f16 or bf16");
  if (p->kv_dtype != 0 && p->kv_dtype != p->dtype)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "the backward does not take kv_dtype %s: K and V in "
                    "dtype %s",
                    fj_dtype_name(p->kv_dtype), fj_dtype_name(p->dtype));
  if (ctx->sm < 80)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "the backward needs sm_80 or newer (mma.sync); the "
                    "target is %s",
                    ctx->arch);
  return check_counts(ctx, p);
}

/* Whether the wide wgmma kernel takes p's key tiles in pairs (a cluster
 * of two blocks, 64 keys each, exchanging dS: each adds dQ over both
 * tiles' 128 keys for part of its columns, half the float32 additions):
 * every head dim above 128 (at 129-192 three panels of dQ's columns, block
 * 1's consumer 1 adding none; above 192 four, one per consumer of the
 * pair), with or without a causal mask, in the deterministic mode too
 * (its turns then count pairs), but not under a window (at 256 1.03 of
 * the 64-key kernel's time under one of 512) nor a block mask (whose walks
 * differ per key block).  Measured on the H100 (docs/PERF.md T21): at 192
 * 0.87-0.90 of the 64-key kernel's time without a mask or under a causal
 * one, 0.71 with GQA, 0.75-0.85 in the deterministic mode; at 256
 * 0.89-0.92, 0.71-0.82 deterministic.  FLASHJIT_BWD_PAIR=0 in the
 * environment turns it off, =1 on under a window too. */
static int pair_ok(const fj_problem *p, const fj_mods_info *mi)
{
  const char *e = getenv("FLASHJIT_BWD_PAIR");
  if (p->head_dim <= 128 || mi->block_kv != 0 || (e && strcmp(e, "0") == 0))
    return 0;
  return !mi->window || (e && strcmp(e, "1") == 0);
}

/* Whether variant v is the wide wgmma kernel's pair (its tile_n 128). */
static int bwd_pair(const fj_variant *v)
{
  return v->mma == FJ_MMA_WGMMA && v->head_dim > 128 &&
         v->tile_n == BWD_WG_TILE_N;
}

/* The keys one block of v's main kernel keeps (a pair splits its tile). */
static int block_keys(const fj_variant *v)
{
  return bwd_pair(v) ? v->tile_n / 2 : v->tile_n;
}

/* The main kernel's variant of family mma (FJ_MMA_WGMMA or FJ_MMA_SYNC). */
static void main_variant(const fj_problem *p, fj_mma mma, int stages,
                         fj_variant *v)
{
  int wg = mma == FJ_MMA_WGMMA;
  fj_mods_info mi;
  fj__mods_info(p->mods, &mi);
  memset(v, 0, sizeof *v);
  v->head_dim = p->head_dim;
  v->tile_m = BWD_TILE;
  v->tile_n = wg && (p->head_dim <= 128 || pair_ok(p, &mi)) ? BWD_WG_TILE_N
                                                            : BWD_TILE;
  v->warps = wg ? BWD_WG_WARPS : BWD_WARPS;
  v->stages = stages;
  v->swizzle = FJ_SWIZZLE_XOR;
  v->softmax = FJ_SOFTMAX_REGS;
  v->mma = mma;
  v->causal = p->causal;
  v->dtype = p->dtype;
  v->varlen = fj__problem_varlen(p);
  v->mods = p->mods;
}

/* Sets the value of parameter `key` of vp (one the variant's list has). */
static void set_param(fj_vparams *vp, const char *key, const char *s)
{
  for (size_t i = 0; i < vp->n; i++)
    if (strcmp(vp->p[i].key, key) == 0)
      vp->p[i].s = s;
}

/* The main kernel's template parameters: the forward variant's, with the
 * backward's template, symbol and parameter block; ctx->lock held. */
static fj_status main_params(fj_ctx *ctx, const fj_variant *v, fj_vparams *vp)
{
  fj_status st = fj__variant_params(ctx, v, vp);
  if (st != FJ_OK)
    return st;
  /* fj_attn_... becomes fj_bwd_attn_... (names are far shorter than the
   * buffer; a cut one would only be refused by the cache's checks). */
  char name[sizeof vp->symbol - 8];
  memcpy(name, vp->symbol, sizeof name - 1);
  name[sizeof name - 1] = '\0';
  snprintf(vp->symbol, sizeof vp->symbol, "fj_bwd_%s", name + 3);
  vp->template_name = v->mma == FJ_MMA_WGMMA ? "attention_bwd_wgmma.cu"
                                             : "attention_bwd_mma.cu";
  /* The parameters' gradients make another kernel (fj_param_grads), one
   * per set of parameters that have them (mod_facts' pgrads): "_pg" and
   * that set's bits, so that the name tells the kernels apart. */
  unsigned grads = 0;
  for (int i = 0; v->mods && i < v->mods->num_params && i < FJ_MOD_PARAMS_MAX; i++)
    if (fj__mods_has_grad(v->mods, i))
      grads |= 1u << i;
  if (grads) {
    size_t len = strlen(vp->symbol);
    snprintf(vp->symbol + len, sizeof vp->symbol - len, "_pg%x", grads);
  }
  set_param(vp, "template", vp->template_name);
  set_param(vp, "symbol", vp->symbol);
  if (vp->n >= FJ_ARRAY_LEN(vp->p))
    return fj__fail(ctx, FJ_ERR_TEMPLATE, "too many template parameters");
  fj_param extra = {"bwd_params_bytes", FJ_PARAM_INT,
                    (long long)sizeof(fj_bwd_kparams), NULL, NULL};
  vp->p[vp->n++] = extra;
  return FJ_OK;
}

/* How main_kernel and row_kernel make a kernel: rendered (meta only),
 * built, or its compile started ahead of use (fj__kernel_ahead). */
enum { BWD_RENDER, BWD_BUILD, BWD_AHEAD };

/* The main kernel, made as `how` says; ctx->lock held. */
static fj_status main_kernel(fj_ctx *ctx, const fj_variant *v, int how,
                             fj_kmeta *meta, fj_kernel **k)
{
  fj_vparams vp;
  fj_status st = main_params(ctx, v, &vp);
  if (st != FJ_OK)
    return st;
  if (how == BWD_AHEAD)
    return fj__kernel_ahead(ctx, vp.template_name, vp.p, vp.n);
  if (how == BWD_BUILD)
    return fj__kernel_build(ctx, vp.template_name, vp.p, vp.n, k);
  fj_buf src = {0};
  st = fj__render(ctx, vp.template_name, vp.p, vp.n, &src, meta);
  fj__buf_free(&src);
  return st;
}

/* The preprocess or postprocess kernel (which: "pre", "post"), built or
 * (how BWD_AHEAD) its compile started ahead of use; a postprocess reads
 * dQ's accumulator in tiles where `tiled` (1: the wgmma kernel's, 2: the
 * wide wgmma kernel's, bwd_common.cuh's dq_tile_off4); ctx->lock held. */
static fj_status row_kernel(fj_ctx *ctx, const fj_problem *p,
                            const char *which, int tiled, int how,
                            fj_kernel **k)
{
  char symbol[64];
  fj_mods_info mi;
  fj__mods_info(p->mods, &mi);
  int sinks = mi.sinks && strcmp(which, "post") == 0;
  tiled = strcmp(which, "post") == 0 ? tiled : 0;
  int varlen = fj__problem_varlen(p);
  snprintf(symbol, sizeof symbol, "fj_bwd_%s_d%d_%s%s%s%s", which,
           p->head_dim, fj_dtype_name(p->dtype), sinks ? "_sink" : "",
           tiled == 2 ? "_tiled4" : tiled ? "_tiled" : "", varlen ? "_vl" : "");
  fj_param params[] = {
      {"template", FJ_PARAM_STR, 0, "bwd_rows.cu", NULL},
      {"symbol", FJ_PARAM_STR, 0, symbol, NULL},
      {"arch", FJ_PARAM_STR, 0, ctx->arch, NULL},
      {"sm", FJ_PARAM_INT, ctx->sm, NULL, NULL},
      {"version", FJ_PARAM_STR, 0, fj_version(), NULL},
      {"params_bytes", FJ_PARAM_INT, (long long)sizeof(fj_kparams), NULL, NULL},
      {"bwd_params_bytes", FJ_PARAM_INT, (long long)sizeof(fj_bwd_kparams),
       NULL, NULL},
      {"head_dim", FJ_PARAM_INT, p->head_dim, NULL, NULL},
      {"dtype", FJ_PARAM_STR, 0, fj_dtype_name(p->dtype), NULL},
      {"varlen", FJ_PARAM_BOOL, varlen, NULL, NULL},
      {"sinks", FJ_PARAM_BOOL, sinks, NULL, NULL},
      {"which", FJ_PARAM_STR, 0, which, NULL},
      {"tiled", FJ_PARAM_INT, tiled, NULL, NULL},
      {"rows", FJ_PARAM_INT, BWD_ROWS, NULL, NULL},
      {"warps", FJ_PARAM_INT, BWD_ROW_WARPS, NULL, NULL},
  };
  if (how == BWD_AHEAD)
    return fj__kernel_ahead(ctx, "bwd_rows.cu", params, FJ_ARRAY_LEN(params));
  return fj__kernel_build(ctx, "bwd_rows.cu", params, FJ_ARRAY_LEN(params), k);
}

/* seq_q rounded up to whole query tiles: the workspace's rows a (batch,
 * head). */
static int seq_pad(const fj_problem *p)
{
  return (int)(((int64_t)p->seq_q + BWD_TILE - 1) / BWD_TILE * BWD_TILE);
}

/* The workspace's rows: every (batch, head)'s padded rows. */
static size_t pad_rows(const fj_problem *p)
{
  return (size_t)p->batch * (size_t)p->heads_q * (size_t)seq_pad(p);
}

/* dQ's accumulator's floats a row: the head dim rounded up to whole
 * tiles of 64 columns (the wgmma kernel's tiles cover its padded
 * panels; the mma kernel's rows of head_dim lie within). */
static size_t acc_width(const fj_problem *p)
{
  return (size_t)(p->head_dim + 63) / 64 * 64;
}

/* dQ's tiles of 64 rows by 64 columns (bwd_common.cuh's dq_tile_base):
 * one turn counter each. */
static size_t dq_tiles(const fj_problem *p)
{
  return pad_rows(p) / BWD_TILE * (acc_width(p) / 64);
}

/* A tensor parameter's elements (SIZE_MAX where they overflow it). */
static size_t param_elems(const fj_mod_param *t)
{
  size_t e = 1;
  for (int d = 0; d < t->rank && d < 4; d++)
    if (__builtin_mul_overflow(e, (size_t)t->extents[d], &e))
      return SIZE_MAX;
  return e;
}

/* The elements of the parameters with a gradient, in the deterministic
 * mode (0 in the other, whose atomics add into the gradients directly):
 * two int64 words each in the workspace (bwd_common.cuh's
 * pgrad_words_add), after the turns. */
static size_t pgrad_elems(const fj_problem *p)
{
  size_t n = 0;
  for (int i = 0; p->deterministic && p->mods && i < p->mods->num_params &&
                  i < FJ_MOD_PARAMS_MAX;
       i++)
    if (fj__mods_has_grad(p->mods, i) &&
        __builtin_add_overflow(n, param_elems(&p->mods->params[i]), &n))
      return SIZE_MAX;
  return n;
}

/* delta, LSE2 and dQ's accumulator, then its tiles' turns, each 16-byte
 * aligned (rows are multiples of 64). */
static size_t rows_bytes(const fj_problem *p)
{
  return pad_rows(p) * sizeof(float) * (2 + acc_width(p)) +
         dq_tiles(p) * sizeof(int);
}

/* Where the parameters' words start in the workspace: after the rest,
 * 16-byte aligned. */
static size_t pgrad_offset(const fj_problem *p)
{
  return (rows_bytes(p) + 15) / 16 * 16;
}

/* The workspace p's launches use: rows_bytes, then in the deterministic
 * mode the parameters' gradients' words. */
static size_t rest_of(const fj_problem *p)
{
  size_t pg = pgrad_elems(p);
  return pg ? pgrad_offset(p) + pg * 2 * sizeof(long long) : rows_bytes(p);
}

/* With the score expression's relative table last (rel_table.h: rt of
 * its bytes). */
static size_t with_table(size_t rest, size_t rt)
{
  return rt ? fj__plan_rt_offset(rest) + rt : rest;
}

/* The workspace p's launches use, its relative table included. */
static size_t workspace_of(const fj_problem *p)
{
  return with_table(rest_of(p), fj__rt_bytes(p));
}

/* The deterministic mode under a block mask: the mma family's alone (its
 * turns replay each key tile's walk of the lists: bwd_common.cuh's
 * qlist_visits). */
static int det_blocks(const fj_problem *p)
{
  return p->deterministic && p->mods && p->mods->block_mask;
}

/* FJ_ERR_UNSUPPORTED where main kernel family mma is wgmma and p is
 * det_blocks' (a tuner's candidate, a caller's plan), else FJ_OK. */
static fj_status det_blocks_refuse(const fj_ctx *ctx, const char *who,
                                   const fj_problem *p, fj_mma mma)
{
  if (mma != FJ_MMA_WGMMA || !det_blocks(p))
    return FJ_OK;
  return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                  "%s: the wgmma backward does not take deterministic with "
                  "mods.block_mask: the mma family's does (the library's "
                  "own plan for the problem takes it)",
                  who);
}

/* Whether the wgmma backward's main kernel (v) reads p's distance table
 * within its extents (fj__mods_table_inside) at every position its tiles
 * reach: query tiles of tile_m rows from each sequence's start, key tiles
 * of tile_n (a pair's 128), up to the sequences' ends rounded up to them
 * (the tiles read every element before the mask rule hides any).  Its
 * kernel then reads the table at the row pointer alone.  The mma family
 * reads it through the accessor whatever the variant says. */
static int bwd_table_inside(const fj_problem *p, const fj_variant *v)
{
  if (v->mma != FJ_MMA_WGMMA || v->tile_m < 1 || v->tile_n < 1)
    return 0;
  long long tm = v->tile_m, tn = v->tile_n;
  return fj__mods_table_inside(p, ((long long)p->seq_q + tm - 1) / tm * tm,
                               ((long long)p->seq_kv + tn - 1) / tn * tn);
}

/* The plan's sizes for main kernel v, its kernel's metadata given, and
 * its table_inside proved for p (the memo keeps choices without it: they
 * hold for problems of other lengths and tables). */
static fj_status fill_plan(fj_ctx *ctx, const fj_problem *p,
                           const fj_variant *v, const fj_kmeta *meta,
                           fj_bwd_plan *plan)
{
  /* The main kernel counts its blocks (bwd_common.cuh's kv_tile) in
   * 32-bit ints; a key tile's steps too (query tiles of 64 rows times the
   * group's heads), whose count check_counts' bound on the rows keeps
   * under 2^29. */
  uint64_t tn = (uint64_t)v->tile_n;
  uint64_t tiles = ((uint64_t)p->seq_kv + tn - 1) / tn *
                   (uint64_t)(v->tile_n / block_keys(v));
  uint64_t blocks = tiles * (uint64_t)p->heads_kv * (uint64_t)p->batch;
  if (blocks > INT32_MAX)
    return fj__fail(ctx, FJ_ERR_UNSUPPORTED,
                    "%llu key tiles x heads_kv %d x batch %d = %llu blocks: "
                    "the backward's main kernel counts at most %d",
                    (unsigned long long)tiles, p->heads_kv, p->batch,
                    (unsigned long long)blocks, INT32_MAX);
  size_t rows = pad_rows(p);
  memset(plan, 0, sizeof *plan);
  plan->variant = *v;
  plan->variant.mods = NULL;  /* the problem's, not kept */
  plan->variant.table_inside = bwd_table_inside(p, v);
  /* A pair's two blocks are consecutive in x (the cluster's). */
  plan->grid[0] = (unsigned)((p->seq_kv + v->tile_n - 1) / v->tile_n *
                             (v->tile_n / block_keys(v)));
  plan->grid[1] = (unsigned)p->heads_kv;
  plan->grid[2] = (unsigned)p->batch;
  plan->threads = (unsigned)meta->threads;
  plan->smem_bytes = (unsigned)meta->smem_bytes;
  plan->rows_grid = (unsigned)((rows + BWD_ROWS - 1) / BWD_ROWS);
  plan->workspace_bytes = workspace_of(p);
  return FJ_OK;
}

/* What shapes the main kernel's choice and source (the built-in
 * modifications' values are launch arguments), and the tuning database's
 * class (sequence-length buckets, GQA ratio). */
typedef struct bwd_key {
  int head_dim, dtype, causal, window, softcap, sinks, checked;
  /* a score expression, a mask expression, the parameters that have
   * gradients (a bit each; their form's hash, below, keeps apart choices
   * the tuning database makes per expression); a block mask's sizes,
   * likewise (0 without one) */
  int score, mask, pgrads;
  int block_q, block_kv;
  int varlen;  /* 1 varlen; 2 varlen whose packed tensors lack a total */
  int q_log2, kv_log2, gqa;
  int pair;  /* pair_ok: the wide kernel's tiles in pairs */
  int det_blocks;  /* deterministic under a block mask: the mma family's
                      turns alone count a block mask's walks */
  /* 18 ints: no padding before mods, which memo_find compares with the
   * rest (key_of's memset zeroes it all the same) */
  /* the form's hash, as the tuning database's class has it (|mods=):
   * expressions of one presence may be tuned apart */
  uint64_t mods;
} bwd_key;

/* The context's memo of recent choices: a plan renders the main template
 * (milliseconds), which a training step would pay every call. */
#define BWD_MEMO 16
/* And the functions of recent launches, as fj_attention_fwd's dispatch
 * keeps its own: a launch whose problem's key and plan's variant are
 * here takes its three kernels without building their parameters and
 * memory keys (tens of microseconds a call on a training step's path). */
#define BWD_HOT 8
typedef struct bwd_hot {
  bwd_key key;
  fj_variant v;  /* mods: the problem's pointer, as launched */
  void *fn[FJ_BWD_KERNELS];
  unsigned smem;  /* the main kernel's own shared memory */
} bwd_hot;
struct fj_bwd_memo {
  int n;
  unsigned generation;  /* ctx->tunedb_generation the choices were made in */
  struct {
    bwd_key key;
    fj_variant v;  /* mods NULL */
    fj_kmeta meta;
  } e[BWD_MEMO];
  int nhot;
  bwd_hot hot[BWD_HOT];  /* most recent first */
};

/* A varlen problem whose packed tensors lack their totals: TMA, which must
 * know where a tensor ends, cannot load them (the mma family can). */
static int untotalled(const fj_problem *p)
{
  return (p->cu_seqlens_q && p->total_q < 1) ||
         (p->cu_seqlens_kv && p->total_kv < 1);
}

static bwd_key key_of(const fj_problem *p)
{
  fj_mods_info mi;
  fj__mods_info(p->mods, &mi);
  bwd_key k;
  memset(&k, 0, sizeof k);
  k.head_dim = p->head_dim;
  k.dtype = (int)p->dtype;
  k.causal = (int)p->causal;
  k.window = mi.window;
  k.softcap = mi.softcap;
  k.sinks = mi.sinks;
  k.checked = mi.checked;
  k.score = p->mods && p->mods->score && p->mods->score[0];
  k.mask = p->mods && p->mods->mask && p->mods->mask[0];
  /* Which parameters have gradients, a bit each: each set is its own
   * main kernel (main_params' "_pg" suffix), which the recent launches'
   * list (ready) must tell apart for one fj_mods whose param_grads change. */
  for (int i = 0; p->mods && i < p->mods->num_params && i < FJ_MOD_PARAMS_MAX; i++)
    k.pgrads |= fj__mods_has_grad(p->mods, i) << i;
  k.block_q = mi.block_q;
  k.block_kv = mi.block_kv;
  k.varlen = !fj__problem_varlen(p) ? 0 : untotalled(p) ? 2 : 1;
  k.q_log2 = fj__log2_floor(p->seq_q);
  k.kv_log2 = fj__log2_floor(p->seq_kv);
  k.gqa = p->heads_q / p->heads_kv;
  k.pair = pair_ok(p, &mi);  /* the mods' facts key_of has read */
  k.det_blocks = det_blocks(p);
  k.mods = fj__mods_hash(p->mods);
  return k;
}

/* The memo's entry for p, or NULL; ctx->lock held. */
static int memo_find(const fj_ctx *ctx, const bwd_key *k, fj_variant *v,
                     fj_kmeta *meta)
{
  const fj_bwd_memo *m = ctx->bwd_memo;
  if (m && m->generation != ctx->tunedb_generation)
    return 0;  /* a tuning result was recorded since */
  for (int i = 0; m && i < m->n; i++)
    if (!memcmp(&m->e[i].key, k, sizeof *k)) {
      *v = m->e[i].v;
      *meta = m->e[i].meta;
      return 1;
    }
  return 0;
}

/* Remembers a choice (the oldest goes when the memo is full); ctx->lock
 * held.  Without memory the plan is only slower. */
static void memo_add(fj_ctx *ctx, const bwd_key *k, const fj_variant *v,
                     const fj_kmeta *meta)
{
  if (!ctx->bwd_memo && !(ctx->bwd_memo = calloc(1, sizeof *ctx->bwd_memo)))
    return;
  fj_bwd_memo *m = ctx->bwd_memo;
  if (m->generation != ctx->tunedb_generation) {
    m->n = 0;
    m->generation = ctx->tunedb_generation;
  }
  if (m->n == BWD_MEMO) {
    memmove(&m->e[0], &m->e[1], (BWD_MEMO - 1) * sizeof m->e[0]);
    m->n--;
  }
  m->e[m->n].key = *k;
  m->e[m->n].v = *v;
  m->e[m->n].v.mods = NULL;
  m->e[m->n].meta = *meta;
  m->n++;
}

/* Whether the wgmma kernel may take p (k its key): TMA must know where the
 * packed tensors end, the parameters' gradients above head dim 128 only
 * the mma family adds, a block mask's key blocks must be whole key tiles
 * (128 keys; 64 above head dim 128) -- the wgmma template refuses the
 * rest too; asked here, the plan does not render it to learn that --, and
 * the deterministic mode under a block mask is the mma family's (its
 * turns replay each key tile's walk of the lists: bwd_common.cuh's
 * qlist_visits; checked refuses a wgmma plan for it). */
static int wgmma_may(const fj_ctx *ctx, const fj_problem *p, const bwd_key *k)
{
  int tile_n = p->head_dim <= 128 ? BWD_WG_TILE_N : BWD_TILE;
  return fj__arch_has(ctx, FJ_ARCH_WGMMA) && !untotalled(p) &&
         !(k->pgrads && p->head_dim > 128) && k->block_kv % tile_n == 0 &&
         !k->det_blocks;
}

/* The main kernel of family mma with `stages` for p, rendered (not
 * built) and checked against the target's shared memory (the kernel's
 * own check); ctx->lock held. */
static fj_status try_main(fj_ctx *ctx, const fj_problem *p, fj_mma mma,
                          int stages, fj_variant *v, fj_kmeta *meta)
{
  main_variant(p, mma, stages, v);
  fj_status st = main_kernel(ctx, v, BWD_RENDER, meta, NULL);
  return st == FJ_OK ? fj__check_smem(ctx, meta) : st;
}

/* The tuning database's pick where it has one for p (fj_tune_bwd's; only
 * its family and stages are taken, and only where the target renders
 * them); else the wgmma kernel where the target has wgmma and its
 * template takes p (wgmma_may; head dims 64 to 256 in multiples of 16,
 * 16-bit types: it refuses the rest), else two stages of Q and dO on mma
 * where the architecture's shared memory holds them, else one; ctx->lock
 * held.  Memory running out ends the search: another kernel picked for
 * it would be a plan that differs by the allocator's luck. */
static fj_status plan_locked(fj_ctx *ctx, const fj_problem *p,
                             fj_bwd_plan *plan)
{
  fj_variant v;
  fj_kmeta meta;
  fj_status st = FJ_ERR_UNSUPPORTED;
  bwd_key key = key_of(p);
  if (memo_find(ctx, &key, &v, &meta))
    return fill_plan(ctx, p, &v, &meta, plan);
  fj_mma mma;
  int stages;
  unsigned gen = ctx->tunedb_generation;
  int wgmma = wgmma_may(ctx, p, &key);
  if (fj__tune_lookup_bwd(ctx, p, &mma, &stages) &&
      (mma == FJ_MMA_SYNC || (mma == FJ_MMA_WGMMA && wgmma)) &&
      stages >= 1 && stages <= 2)
    st = try_main(ctx, p, mma, stages, &v, &meta);
  if (st != FJ_OK && st != FJ_ERR_NOMEM && wgmma)
    st = try_main(ctx, p, FJ_MMA_WGMMA, 2, &v, &meta);
  for (stages = 2; stages >= 1 && st != FJ_OK && st != FJ_ERR_NOMEM; stages--)
    st = try_main(ctx, p, FJ_MMA_SYNC, stages, &v, &meta);
  if (st == FJ_OK) {
    /* Remembered only if no tuning result came in while try_main's
     * layout probe (a context's first) had the lock released. */
    if (ctx->tunedb_generation == gen)
      memo_add(ctx, &key, &v, &meta);
    st = fill_plan(ctx, p, &v, &meta, plan);
  }
  return st;
}

fj_status fj_attention_bwd_plan(fj_ctx *ctx, const fj_problem *p,
                                fj_bwd_plan *plan)
{
  if (!ctx || !p || !plan)
    return fj__null_arg(ctx, "fj_attention_bwd_plan",
                        !ctx ? "ctx" : !p ? "p" : "plan");
  fj__clear_error(ctx);
  fj_status st = check_problem(ctx, p);
  if (st != FJ_OK)
    return st;
  pthread_mutex_lock(&ctx->lock);
  st = plan_locked(ctx, p, plan);
  pthread_mutex_unlock(&ctx->lock);
  return st;
}

fj_status fj__bwd_plan_candidate(fj_ctx *ctx, const fj_problem *p,
                                 fj_mma mma, int stages, fj_bwd_plan *plan)
{
  fj_variant v;
  fj_kmeta meta;
  fj_status st = check_problem(ctx, p);
  if (st == FJ_OK)
    st = det_blocks_refuse(ctx, "fj_tune_bwd", p, mma);
  if (st != FJ_OK)
    return st;
  pthread_mutex_lock(&ctx->lock);
  st = try_main(ctx, p, mma, stages, &v, &meta);
  if (st == FJ_OK)
    st = fill_plan(ctx, p, &v, &meta, plan);
  pthread_mutex_unlock(&ctx->lock);
  return st;
}

fj_status fj__bwd_main_params(fj_ctx *ctx, const fj_problem *p,
                              const fj_bwd_plan *plan, fj_vparams *vp)
{
  fj_variant v = plan->variant;
  v.mods = p->mods;
  return main_params(ctx, &v, vp);
}

/* ---- the call ---------------------------------------------------------------------- */

typedef struct bwd_args {
  const void *q, *k, *v, *o, *dout;
  const float *lse;
  void *dq, *dk, *dv;
  float *dsinks;
} bwd_args;

/* Every pointer there must be; gradients need strides of their own. */
static fj_status check_args(const fj_ctx *ctx, const char *who,
                            const fj_problem *p, const bwd_args *a)
{
  const char *names[] = {"q", "k", "v", "o", "dout", "lse", "dq", "dk", "dv"};
  const void *ptrs[] = {a->q, a->k, a->v, a->o, a->dout, a->lse,
                        a->dq, a->dk, a->dv};
  for (size_t i = 0; i < FJ_ARRAY_LEN(ptrs); i++)
    if (!ptrs[i])
      return fj__null_arg(ctx, who, names[i]);
  const struct { const char *name; const int64_t *s; int heads; } g[] = {
      {"q_stride", p->q_stride, p->heads_q},
      {"k_stride", p->k_stride, p->heads_kv},
      {"v_stride", p->v_stride, p->heads_kv}};
  /* Packed sequences (varlen) have no batch stride. */
  const int bq = p->cu_seqlens_q ? 1 : p->batch,
            bkv = p->cu_seqlens_kv ? 1 : p->batch;
  const int extent[3][3] = {{bq, p->heads_q, p->seq_q},
                            {bkv, p->heads_kv, p->seq_kv},
                            {bkv, p->heads_kv, p->seq_kv}};
  for (int t = 0; t < 3; t++)
    for (int d = 0; d < 3; d++)
      if (g[t].s[d] == 0 && extent[t][d] > 1)
        return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                        "%s: %s[%d] is 0 (a broadcast input): its gradient "
                        "is laid out by the same strides and needs its own rows",
                        who, g[t].name, d);
  /* The kernels move rows in 16-byte pieces (TMA boxes on wgmma). */
  const struct { const char *name; const void *ptr; const int64_t *s; } t[] = {
      {"q", a->q, p->q_stride},   {"k", a->k, p->k_stride},
      {"v", a->v, p->v_stride},   {"o", a->o, p->o_stride},
      {"dout", a->dout, p->o_stride}, {"dq", a->dq, p->q_stride},
      {"dk", a->dk, p->k_stride}, {"dv", a->dv, p->v_stride}};
  for (size_t i = 0; i < FJ_ARRAY_LEN(t); i++) {
    fj_status st = fj__check_alignment(ctx, t[i].name, t[i].ptr, t[i].s,
                                       p->dtype);
    if (st != FJ_OK)
      return st;
  }
  fj_mods_info mi;
  fj__mods_info(p->mods, &mi);
  if (a->dsinks && !mi.sinks)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "%s: dsinks is given but the problem has no sinks "
                    "(fj_mods.sinks)",
                    who);
  return check_block_lists(ctx, who, p);
}

/* The main kernel's launch order (bwd_common.cuh's kv_tile).  Under a
 * causal mask with GQA a block walks the query tiles of a whole group, so
 * the first key tiles of the last heads would start late and run alone:
 * there sections of (batch, KV head)s of four waves of key tiles or more,
 * longest first within each (at (1, 32/8, 8192, 128) on the H200: 0.87x
 * cuDNN's speed in the plain order, 0.97x).  Otherwise one head's key
 * tiles after another's, whose blocks share Q and dO in L2: measured
 * faster than any longest-first order without GQA (perf-history.md,
 * 2026-11-26, third section). */
static int section_of(const fj_ctx *ctx, const fj_problem *p,
                      const fj_bwd_plan *plan)
{
  int64_t heads = (int64_t)p->batch * p->heads_kv, tiles = plan->grid[0];
  if (p->causal == FJ_CAUSAL_NONE || p->heads_q == p->heads_kv || tiles < 1)
    return 1;
  int64_t s = (4 * (int64_t)fj__sm_count(ctx) + tiles - 1) / tiles;
  return (int)(s < 1 ? 1 : s > heads ? heads : s);
}

/* FLASHJIT_BWD_ROTATE=0 in the environment, read once a process. */
static int rotate_off;
static pthread_once_t rotate_once = PTHREAD_ONCE_INIT;

static void rotate_read(void)
{
  const char *e = getenv("FLASHJIT_BWD_ROTATE");
  rotate_off = e && !strcmp(e, "0");
}

/* The deterministic mode's rotation (attention_bwd_wgmma.cu's ROT):
 * where every key tile walks every query tile -- no causal mask, no
 * window, dense, no expressions or softcap (the kernel's ROT); the wgmma
 * kernels -- key tile t of T starts its walk at query tile t nq / T, so a
 * dQ tile's adds come one a step in that rotation's order instead of each
 * key tile waiting on the one launched before it at every step.  A key
 * tile then waits on tiles launched after it: all of a head's key tiles
 * must be resident at once, so T at most the multiprocessors (one block
 * of the 12-warp kernels a multiprocessor) and, for the wide kernel's
 * pairs (clusters of two blocks), at most twice the clusters the driver
 * says can be resident (fn: the main kernel), the plain launch order
 * (section 1: a head's key tiles consecutive) and, for the kernel's
 * 32-bit rank, T nq < 2^31.
 * FLASHJIT_BWD_ROTATE=0 turns it off (a GPU shared by MPS with fewer
 * multiprocessors than it reports).  Where the kernel was not rendered
 * with ROT it takes 2 as 1; its order of the adds is then the plain one.
 * Either way the bits repeat run to run. */
static int rotates(const fj_ctx *ctx, const fj_problem *p,
                   const fj_bwd_plan *plan, int section, void *fn)
{
  pthread_once(&rotate_once, rotate_read);
  int off = rotate_off;
  fj_mods_info mi;
  fj__mods_info(p->mods, &mi);
  int64_t tiles = plan->grid[0], nq = ((int64_t)p->seq_q + 63) / 64;
  if (off || !p->deterministic || plan->variant.mma != FJ_MMA_WGMMA ||
      p->causal != FJ_CAUSAL_NONE || mi.window || mi.user || mi.softcap ||
      mi.blocks || fj__problem_varlen(p) || section != 1 ||
      tiles > fj__sm_count(ctx) || tiles * nq >= ((int64_t)1 << 31))
    return 0;
  if (!bwd_pair(&plan->variant))
    return 1;
  fj_launch l = {fn,   {plan->grid[0], plan->grid[1], plan->grid[2]},
                 {plan->threads, 1, 1}, plan->smem_bytes, NULL, NULL, 0};
  return 2 * (int64_t)fj__cu_resident_clusters(&l) >= tiles;
}

/* The deterministic mode's descending walk (attention_bwd_wgmma.cu's
 * DESC): under a mask with a right side (causal, or a window bounded on
 * the right) with GQA, the later-first order of the turns launches the
 * shortest walks first and the longest (the first key tiles': the group's
 * heads times their query tiles) last -- 2.27x the default mode's time at
 * (1, 32/8, 8192, 128) causal on the H100 (5940 against 2610 us), where
 * 1.16-1.31x without GQA.  Under g.deterministic 3 every key tile walks
 * its query tiles from the last to the first, the group's heads inner, a
 * dQ tile's turns go to earlier key tiles first and the blocks launch
 * first key tiles first (kv_tile), so that a key tile waits only on tiles
 * launched before it and the longest walks start first: 1.30x there
 * (3386 us).  The wgmma kernels without a block mask (whose deterministic
 * mode is the mma family's).  FLASHJIT_BWD_DESCEND=0 in the environment
 * returns to the plain order (read at every launch that could descend,
 * for A/B runs in one process; no other launch reads it). */
static int descends(const fj_problem *p, const fj_bwd_plan *plan)
{
  if (!p->deterministic || p->heads_q == p->heads_kv ||
      plan->variant.mma != FJ_MMA_WGMMA || det_blocks(p))
    return 0;
  const char *e = getenv("FLASHJIT_BWD_DESCEND");
  if (e && strcmp(e, "0") == 0)
    return 0;
  return p->causal != FJ_CAUSAL_NONE ||
         (p->mods && p->mods->window_right >= 0);
}

static void fill_bwd_params(fj_bwd_kparams *g, const fj_problem *p,
                            const bwd_args *a, uint64_t ws)
{
  size_t rows = pad_rows(p);
  memset(g, 0, sizeof *g);
  g->dout = a->dout;
  g->dq = a->dq;
  g->dk = a->dk;
  g->dv = a->dv;
  g->lse = a->lse;
  g->dlse = p->dlse;
  g->delta = (float *)(uintptr_t)ws;
  g->lse2 = (float *)(uintptr_t)(ws + rows * sizeof(float));
  g->dq_acc = (float *)(uintptr_t)(ws + 2 * rows * sizeof(float));
  g->dq_turns = (int *)(uintptr_t)(ws + (2 + acc_width(p)) * rows *
                                            sizeof(float));
  g->seq_pad = seq_pad(p);
  g->deterministic = p->deterministic != 0;
  g->dsinks = a->dsinks;
  for (int i = 0; i < 3; i++) {
    g->do_stride[i] = p->o_stride[i];
    g->dq_stride[i] = p->q_stride[i];
    g->dk_stride[i] = p->k_stride[i];
    g->dv_stride[i] = p->v_stride[i];
  }
  g->scale = p->scale > 0.f ? p->scale : 1.f / sqrtf((float)p->head_dim);
  /* The deterministic mode's words for the parameters' gradients, each
   * parameter's elements after the last's (pg_end: cumulative, the
   * parameters without one adding none). */
  if (pgrad_elems(p)) {
    g->pg_words = (long long *)(uintptr_t)(ws + pgrad_offset(p));
    long long end = 0;
    for (int i = 0; i < FJ_MOD_PARAMS_MAX; i++) {
      if (i < p->mods->num_params && fj__mods_has_grad(p->mods, i)) {
        g->pg_out[i] = p->mods->param_grads[i];
        end += (long long)param_elems(&p->mods->params[i]);
      }
      g->pg_end[i] = end;
    }
  }
}

/* A block mask's lists as the backward walks them (kparams.h): the
 * transposed ones, per key block, in the fields the forward gives its
 * query blocks' lists. */
static void fill_bwd_blocks(fj_kparams *kp, const fj_problem *p)
{
  const fj_block_mask *bm = p->mods ? p->mods->block_mask : NULL;
  if (!bm)
    return;
  kp->bm_num = bm->q_num;
  kp->bm_idx = bm->q_indices;
  kp->bm_full_num = bm->full_q_num;
  kp->bm_full_idx = bm->full_q_indices;
  kp->bm_stride_h = bm->heads > 1 ? bm->kv_blocks : 0;
  kp->bm_stride_b = bm->batch > 1 ? bm->heads * bm->kv_blocks : 0;
}

/* Kernel `which` of the plan (0 pre, 1 main, 2 post); ctx->lock held. */
static fj_status bwd_kernel(fj_ctx *ctx, const fj_problem *p,
                            const fj_bwd_plan *plan, int which, int how,
                            fj_kernel **k)
{
  fj_variant v = plan->variant;
  v.mods = p->mods;
  if (which == 1)
    return main_kernel(ctx, &v, how, NULL, k);
  /* The wgmma kernel adds dQ in tiles (templates/bwd_common.cuh), the
   * wide one (head dims above 128) with the columns of each 16 permuted. */
  int tiled = plan->variant.mma != FJ_MMA_WGMMA ? 0
              : plan->variant.head_dim <= 128 ? 1 : 2;
  return row_kernel(ctx, p, which == 0 ? "pre" : "post", tiled, how, k);
}

fj_status fj_attention_bwd_kernel(fj_ctx *ctx, const fj_problem *p,
                                  const fj_bwd_plan *plan, int which,
                                  fj_kernel **kernel)
{
  if (!ctx || !p || !plan || !kernel)
    return fj__null_arg(ctx, "fj_attention_bwd_kernel",
                        !ctx ? "ctx" : !p ? "p" : !plan ? "plan" : "kernel");
  fj__clear_error(ctx);
  if (which < 0 || which >= FJ_BWD_KERNELS)
    return fj__fail(ctx, FJ_ERR_INVALID_ARG,
                    "fj_attention_bwd_kernel: which %d is invalid: 0 (the "
                    "preprocess), 1 (the main kernel) or 2 (the postprocess)",
                    which);
  fj_status st = check_problem(ctx, p);
  if (st != FJ_OK)
    return st;
  pthread_mutex_lock(&ctx->lock);
  st = bwd_kernel(ctx, p, plan, which, BWD_BUILD, kernel);
  pthread_mutex_unlock(&ctx->lock);
  return st;
}

fj_status fj_attention_bwd_prefetch(fj_ctx *ctx, const fj_problem *p)
{
  if (!ctx || !p)
    return fj__null_arg(ctx, "fj_attention_bwd_prefetch", ctx ? "p" : "ctx");
  fj__clear_error(ctx);
  fj_status st = check_problem(ctx, p);
  if (st != FJ_OK)
    return st;
  fj_bwd_plan plan;
  pthread_mutex_lock(&ctx->lock);
  st = plan_locked(ctx, p, &plan);
  /* The main kernel first: the longest compile. */
  static const int order[FJ_BWD_KERNELS] = {1, 0, 2};
  for (int i = 0; i < FJ_BWD_KERNELS && st == FJ_OK; i++)
    st = bwd_kernel(ctx, p, &plan, order[i], BWD_AHEAD, NULL);
  pthread_mutex_unlock(&ctx->lock);
  return st;
}

/* The three kernels' functions, from the recent launches' where p's key
 * and the plan's variant are there (moved to the front), else built and
 * remembered; ctx->lock held. */
static fj_status ready(fj_ctx *ctx, const fj_problem *p,
                       const fj_bwd_plan *plan, void *fn[3], unsigned *smem)
{
  bwd_key key = key_of(p);
  fj_variant v = plan->variant;
  v.mods = p->mods;
  fj_bwd_memo *m = ctx->bwd_memo;
  for (int i = 0; m && i < m->nhot; i++)
    if (!memcmp(&m->hot[i].key, &key, sizeof key) &&
        !memcmp(&m->hot[i].v, &v, sizeof v)) {
      memcpy(fn, m->hot[i].fn, sizeof m->hot[i].fn);
      *smem = m->hot[i].smem;
      if (i) {
        bwd_hot h = m->hot[i];
        memmove(&m->hot[1], &m->hot[0], (size_t)i * sizeof m->hot[0]);
        m->hot[0] = h;
      }
      return FJ_OK;
    }
  fj_status st = FJ_OK;
  for (int i = 0; i < FJ_BWD_KERNELS && st == FJ_OK; i++) {
    fj_kernel *k = NULL;
    st = bwd_kernel(ctx, p, plan, i, BWD_BUILD, &k);
    if (st == FJ_OK)
      st = fj__kernel_function(ctx, k, &fn[i]);
    if (st == FJ_OK && i == 1)
      *smem = (unsigned)k->meta.smem_bytes;
  }
  if (st == FJ_OK && m) {
    int keep = m->nhot < BWD_HOT ? m->nhot++ : BWD_HOT - 1;
    memmove(&m->hot[1], &m->hot[0], (size_t)keep * sizeof m->hot[0]);
    m->hot[0].key = key;
    m->hot[0].v = v;
    memcpy(m->hot[0].fn, fn, sizeof m->hot[0].fn);
    m->hot[0].smem = *smem;
  }
  return st;
}

/* The wgmma kernel's tensor maps: Q and dO in boxes of a query tile, K
 * and V of a key tile. */
static fj_status bwd_maps(fj_ctx *ctx, const fj_problem *p,
                          const fj_bwd_plan *plan, const bwd_args *a,
                          fj_bwd_tmaps *m)
{
  const int d = p->head_dim, tm = plan->variant.tile_m,
            tn = block_keys(&plan->variant);
  /* Packed sequences are one batch of their total rows. */
  int sq = p->cu_seqlens_q ? p->total_q : p->seq_q;
  int bq = p->cu_seqlens_q ? 1 : p->batch;
  int skv = p->cu_seqlens_kv ? p->total_kv : p->seq_kv;
  int bkv = p->cu_seqlens_kv ? 1 : p->batch;
  fj_status st = fj__tensor_map(ctx, a->q, p->dtype, p->q_stride, d, sq,
                                p->heads_q, bq, tm, &m->q);
  if (st == FJ_OK)
    st = fj__tensor_map(ctx, a->k, p->dtype, p->k_stride, d, skv,
                        p->heads_kv, bkv, tn, &m->k);
  if (st == FJ_OK)
    st = fj__tensor_map(ctx, a->v, p->dtype, p->v_stride, d, skv,
                        p->heads_kv, bkv, tn, &m->v);
  if (st == FJ_OK)
    st = fj__tensor_map(ctx, a->dout, p->dtype, p->o_stride, d, sq,
                        p->heads_q, bq, tm, &m->dout);
  return st;
}

/* The main kernel's fj::ModGrads (templates/mods.cuh): a gradient
 * pointer per parameter, NULL where it has none, and in the deterministic
 * mode its words in the workspace (g->pg_words, fill_bwd_params'). */
typedef struct fj_mod_grads {
  float *g[FJ_MOD_PARAMS_MAX];
  long long *w[FJ_MOD_PARAMS_MAX];
} fj_mod_grads;

static void mod_grads(const fj_mods *m, const fj_bwd_kparams *g,
                      fj_mod_grads *mg)
{
  memset(mg, 0, sizeof *mg);
  for (int i = 0; m && i < m->num_params && i < FJ_MOD_PARAMS_MAX; i++)
    if (fj__mods_has_grad(m, i)) {
      mg->g[i] = m->param_grads[i];
      if (g->pg_words)
        mg->w[i] = g->pg_words + 2 * (i ? g->pg_end[i - 1] : 0);
    }
}

/* The gradients' pointers, as the library checks every pointer it is
 * given. */
static fj_status check_grads(fj_ctx *ctx, const char *who, const fj_mods *m)
{
  static const char *const names[FJ_MOD_PARAMS_MAX] = {
      "mods.param_grads[0]", "mods.param_grads[1]", "mods.param_grads[2]",
      "mods.param_grads[3]", "mods.param_grads[4]", "mods.param_grads[5]",
      "mods.param_grads[6]", "mods.param_grads[7]"};
  fj_devptr list[FJ_MOD_PARAMS_MAX];
  size_t n = 0;
  for (int i = 0; m && i < m->num_params && i < FJ_MOD_PARAMS_MAX; i++)
    if (fj__mods_has_grad(m, i))
      list[n++] = (fj_devptr){names[i], -1, m->param_grads[i]};
  return n ? fj__devptr_check_list(ctx, who, list, n) : FJ_OK;
}

static fj_status launch(fj_ctx *ctx, const char *who, const fj_problem *p,
                        const fj_bwd_plan *plan, const bwd_args *a, void *ws,
                        size_t ws_bytes, void *stream)
{
  void *fn[3];
  fj_kparams kp;
  fj_bwd_kparams g;
  unsigned char mod_args[FJ_MOD_ARGS_MAX];
  uint64_t base = (uint64_t)(uintptr_t)ws;
  fj_status st = fj__cu_enter(ctx);
  if (st != FJ_OK)
    return st;
  st = fj__devptr_check_call(ctx, who, p, a->q, a->k, a->v, a->o, a->lse, ws);
  if (st == FJ_OK) {
    const fj_devptr more[] = {{"dout", -1, a->dout}, {"dq", -1, a->dq},
                              {"dk", -1, a->dk}, {"dv", -1, a->dv},
                              {"dsinks", -1, a->dsinks},
                              {"dlse", -1, p->dlse}};
    st = fj__devptr_check_list(ctx, who, more, FJ_ARRAY_LEN(more));
  }
  if (st == FJ_OK)
    st = check_grads(ctx, who, p->mods);
  /* The main kernel's own shared memory (its meta's): a caller's plan may
   * be another problem's, whose modifications size it otherwise. */
  unsigned smem = plan->smem_bytes;
  void *rt_fn = NULL;
  size_t rest = rest_of(p), rt = st == FJ_OK ? fj__rt_bytes(p) : 0;
  if (st == FJ_OK) {
    pthread_mutex_lock(&ctx->lock);
    st = ready(ctx, p, plan, fn, &smem);
    /* The score expression's relative table: its own kernel, first. */
    if (st == FJ_OK && rt)
      st = fj__rt_function(ctx, p, &rt_fn);
    pthread_mutex_unlock(&ctx->lock);
  }
  /* What p itself needs, should the plan be another problem's (a plan
   * made without the deterministic mode's words, say): never less. */
  size_t need = with_table(rest, rt);
  if (need < plan->workspace_bytes)
    need = plan->workspace_bytes;
  if (st == FJ_OK && !ws)
    st = fj__workspace(ctx, stream, need, &base);
  else if (st == FJ_OK && ws_bytes < need)
    st = fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "%s: workspace_bytes %zu is too small: delta and dQ's "
                  "accumulator need %zu",
                  who, ws_bytes, need);
  else if (st == FJ_OK && base % 16)
    st = fj__fail(ctx, FJ_ERR_INVALID_ARG,
                  "%s: workspace %p is not 16-byte aligned", who, ws);
  fj_bwd_tmaps maps;
  int wg = plan->variant.mma == FJ_MMA_WGMMA;
  if (st == FJ_OK && wg)
    st = bwd_maps(ctx, p, plan, a, &maps);
  if (st == FJ_OK) {
    fj__fill_params(&kp, p, a->q, a->k, a->v, (void *)(uintptr_t)a->o, NULL);
    fill_bwd_blocks(&kp, p);
    fill_bwd_params(&g, p, a, base);
    g.section = section_of(ctx, p, plan);
    if (rotates(ctx, p, plan, g.section, fn[1]))
      g.deterministic = 2;
    else if (descends(p, plan)) {
      g.deterministic = 3;
      /* `flashjit run --backward --deterministic --verbose` shows it. */
      fj__log(ctx, FJ_LOG_DEBUG, "%s: the deterministic mode's descending "
              "walk", who);
    }
    /* The mma kernel takes the parameters' gradients last where it has
     * any (a kernel reads as many arguments as it has). */
    fj_mod_grads mg;
    mod_grads(p->mods, &g, &mg);
    void *args[4] = {&kp, &g, mod_args, &mg};
    /* The wgmma kernel takes its tensor maps before the modifications'. */
    void *wg_args[5] = {&kp, &g, &maps, mod_args, &mg};
    size_t used = fj__mods_args(p->mods, 0, mod_args);
    if (rt_fn)
      st = fj__rt_pass(ctx, p, rt_fn, base + fj__plan_rt_offset(rest), used,
                       mod_args, &kp, stream);
    const unsigned rows = plan->rows_grid;
    fj_launch l[3] = {
        {fn[0], {rows, 1, 1}, {32 * BWD_ROW_WARPS, 1, 1}, 0, stream, args, 0},
        {fn[1], {plan->grid[0], plan->grid[1], plan->grid[2]},
         {plan->threads, 1, 1}, smem, stream,
         wg ? wg_args : args, 0},
        {fn[2], {rows, 1, 1}, {32 * BWD_ROW_WARPS, 1, 1}, 0, stream, args, 0}};
    for (int i = 0; i < 3 && st == FJ_OK; i++)
      st = fj__cu_launch(ctx, &l[i]);
  }
  fj__cu_leave(ctx);
  return st;
}

static fj_status checked(fj_ctx *ctx, const char *who, const fj_problem *p,
                         const fj_bwd_plan *plan, const bwd_args *a,
                         void *ws, size_t ws_bytes, void *stream)
{
  fj_status st = check_args(ctx, who, p, a);
  if (st == FJ_OK)
    st = det_blocks_refuse(ctx, who, p, plan->variant.mma);
  if (st == FJ_OK && !ctx->has_device)
    st = fj__fail(ctx, FJ_ERR_COMPILE_ONLY,
                  "cannot launch on a compile-only context (arch %s)",
                  ctx->arch);
  return st == FJ_OK ? launch(ctx, who, p, plan, a, ws, ws_bytes, stream) : st;
}

fj_status fj_attention_bwd_run(fj_ctx *ctx, const fj_problem *p,
                               const fj_bwd_plan *plan, const void *q,
                               const void *k, const void *v, const void *o,
                               const void *dout, const float *lse, void *dq,
                               void *dk, void *dv, float *dsinks,
                               void *workspace, size_t workspace_bytes,
                               void *stream)
{
  if (!ctx || !p || !plan)
    return fj__null_arg(ctx, "fj_attention_bwd_run",
                        !ctx ? "ctx" : !p ? "p" : "plan");
  fj__clear_error(ctx);
  bwd_args a = {q, k, v, o, dout, lse, dq, dk, dv, dsinks};
  fj_status st = check_problem(ctx, p);
  /* A caller's plan may claim a proof its problem fails (a plan of
   * another problem); fj_attention_bwd's own plan proved it. */
  if (st == FJ_OK && plan->variant.table_inside &&
      !bwd_table_inside(p, &plan->variant))
    st = fj__mods_table_inside_fail(ctx, "fj_attention_bwd_run: the plan",
                                    "fj_attention_bwd_plan");
  return st == FJ_OK ? checked(ctx, "fj_attention_bwd_run", p, plan, &a,
                               workspace, workspace_bytes, stream)
                     : st;
}

fj_status fj_attention_bwd(fj_ctx *ctx, const fj_problem *p, const void *q,
                           const void *k, const void *v, const void *o,
                           const void *dout, const float *lse, void *dq,
                           void *dk, void *dv, float *dsinks, void *stream)
{
  if (!ctx || !p)
    return fj__null_arg(ctx, "fj_attention_bwd", ctx ? "p" : "ctx");
  fj_bwd_plan plan;
  fj_status st = fj_attention_bwd_plan(ctx, p, &plan);
  bwd_args a = {q, k, v, o, dout, lse, dq, dk, dv, dsinks};
  return st == FJ_OK ? checked(ctx, "fj_attention_bwd", p, &plan, &a, NULL,
                               0, stream)
                     : st;
}
