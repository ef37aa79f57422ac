// flashjit generated kernel: fj_attn_d128_m64_n64_w4_s2_pad_regs_mma_br_bf16_gqa_split
// variant: head_dim=128 tile_m=64 tile_n=64 warps=4 stages=2 swizzle=pad softmax=regs mma=mma causal=bottom-right dtype=bf16 kv_dtype=bf16 pack_gqa split_kv
// target: sm_90a; rendered by flashjit 0.1.0 from templates/attention_mma.cu
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace fj {

struct Params {
  const void *q, *k, *v;
  void *o;
  float *lse;               // nullable: [batch][heads_q][seq_q]
  const float *k_scale;     // FP8 K/V: [batch][heads_kv]
  const float *v_scale;
  long long q_stride[3], k_stride[3], v_stride[3], o_stride[3];  // b, h, s
  int batch, heads_q, heads_kv, seq_q, seq_kv;
  int group;                // heads_q / heads_kv
  int causal_offset;        // key j visible to row i when j <= i + offset
  float scale_log2;         // softmax scale * log2(e)
  int splits;               // split-KV: key ranges per row tile
  float *o_part;            // split-KV: [splits][batch][heads_q][seq_q][head_dim]
  float *lse_part;          // split-KV: [splits][batch][heads_q][seq_q]
  // Varlen (cu_seqlens_q / _kv: [batch + 1] prefix sums, seqused_kv:
  // [batch] key counts) and paged K/V (block_table: [batch][max_pages]
  // page numbers, pages of 2^page_shift keys); NULL where absent.
  const int *cu_seqlens_q, *cu_seqlens_kv, *seqused_kv, *block_table;
  int max_pages, page_shift, num_pages;
  // Built-in modifications (fj_mods): the window's sides (FJ_WINDOW_MAX
  // for an unbounded side; a causal mask's right side is 0) and the
  // softcap with its reciprocal, and the softcap's fixed shift of the
  // exponentials in score units (0: the running max; mods.lua's bounded).
  int window_left, window_right;
  float softcap, softcap_inv, softcap_shift;
  int combine_warps;  // split-KV: the combine's warps a row (1, 2 or 4)
  // A dynamic walk of work tiles (block.cuh's claim): the counter, zeroed
  // before each launch.
  unsigned *work;
  // A block mask (fj_block_mask; NULL where absent): the counts and lists
  // of batch b, head h start at query block b * bm_stride_b + h *
  // bm_stride_h (0 for a dimension the mask broadcasts).
  const int *bm_num, *bm_idx, *bm_full_num, *bm_full_idx;
  int bm_stride_b, bm_stride_h, bm_q_blocks, bm_kv_blocks;
  const float *sinks;       // attention sinks: [heads_q] logits, or NULL
  // FP8 attention (dtype e4m3): Q's descales [batch][heads_kv], and V^T in
  // the workspace, [batch][heads_kv][head_dim][vt_keys] bytes.
  const float *q_scale;
  unsigned char *vt;
  int vt_keys;
  int scale_per_head;       // FP8 descales: 1 per (batch, KV head), 0 one a tensor
  // FP8 attention: an e4m3 O's scale (NULL: 1), and where max |O| goes
  // (NULL: not kept; the host zeroes it before the launch).
  const float *o_scale;
  float *o_amax;
};
static_assert(sizeof(Params) == 384, "host and device disagree on the parameter block");

// The index of batch b's KV head hk in the FP8 descales (q_scale, k_scale,
// v_scale): [batch][heads_kv], or 0 for one a tensor.
__device__ __forceinline__ int scale_at(const Params &p, int b, int hk) {
  return (b * p.heads_kv + hk) * p.scale_per_head;
}

typedef __nv_bfloat16 elem_t;
typedef __nv_bfloat162 elem2_t;
__device__ __forceinline__ elem_t to_elem(float x) { return __float2bfloat16_rn(x); }
__device__ __forceinline__ elem2_t to_elem2(float a, float b) { return __floats2bfloat162_rn(a, b); }
__device__ __forceinline__ float from_elem(elem_t x) { return __bfloat162float(x); }

// -inf without <math.h> (NVRTC has no INFINITY macro of its own).
#define FJ_NEG_INF (__int_as_float(0xff800000u))

__device__ __forceinline__ float warp_max(float x) {
  for (int m = 16; m > 0; m >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, m));
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int m = 16; m > 0; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}

// Whether an online softmax's row max x is so large in magnitude (2^12 or
// more, not -inf) that the row subtracts it from its scores before the
// exponentials (softmax_regs.cuh): x * log2(e) rounded is off by 2^-12 or
// more, which would scale P at the max.
__device__ __forceinline__ bool big_max(float x) {
  return fabsf(x) >= 4096.f && x != FJ_NEG_INF;
}

// 2^x through the SFU; exp2(-inf) is 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 1 / x correctly rounded, as 1.f / x is, for normal x and a normal result;
// denormals flush to zero.  The epilogues' row sums are at least 1 (the row
// max's own term), so the results are 1.f / x's; without the denormal path
// ptxas emits no slow-path call, which needs registers of its own where a
// kernel has none to spare (fewer instructions in every epilogue).
__device__ __forceinline__ float rcp_ftz(float x) {
  float y;
  asm("rcp.rn.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace fj

namespace fj {

struct Block {
  int m0;  // first query row
  int h;   // query head
  int hk;  // its KV head
  int b;   // batch index
  int split;  // which of p.splits key ranges
};

__device__ __forceinline__ Block block_of(const Params &p) {
  Block blk;
  blk.split = blockIdx.x % p.splits;
  blk.m0 = (gridDim.x / p.splits - 1 - blockIdx.x / p.splits) * 64;
  blk.hk = blockIdx.y;
  blk.h = blk.hk * p.group;
  blk.b = blockIdx.z;
  return blk;
}

// A persistent grid walks units of work: first the pairs of row tiles of
// each (batch, head) -- the last with the first, the second last with the
// second, ... -- which under a causal mask all hold the same work, then,
// when the row tiles are odd in number, each head's middle tile alone.  A
// static walk (block k takes units k, k + gridDim.x, ...) then balances the
// multiprocessors, and the pairs of one head are consecutive, so the blocks
// working at one time share its K and V in L2.
__device__ __forceinline__ int pairs_total(const Params &p) {
  return ((p.seq_q + 63) / 64 + 1) / 2 * p.heads_q * p.batch;
}

// Half h of unit u (the heavier tile first); false where a unit has no
// second half.  One division: units below `paired` are pairs, the rest
// each head's middle tile (full == the pairs a head has).
__device__ __forceinline__ bool tile_of(const Params &p, int u, int h, Block &blk) {
  const int nm = (p.seq_q + 63) / 64, full = nm / 2;
  const int paired = full * p.heads_q * p.batch;
  const bool single = u >= paired;
  if (single && h) return false;
  const int per = single ? 1 : full, base = single ? paired : 0;
  const int hb = (u - base) / per, j = u - base - hb * per;
  blk.m0 = (single ? full : h ? j : nm - 1 - j) * 64;
  blk.h = hb % p.heads_q;
  blk.b = hb / p.heads_q;
  blk.hk = blk.h / p.group;
  return true;
}

// Row 0 of one head of a tensor with strides (batch, head, seq).
template <typename T>
__device__ __forceinline__ T *head_rows(const void *base, const long long *stride, int b, int h) {
  return static_cast<T *>(const_cast<void *>(base)) + b * stride[0] + h * stride[1];
}

}  // namespace fj

// shared memory: 87040 bytes; q @0; k @17408; v @52224

// From the accumulator table: each lane's base (row | col << 4); slot s adds
// (drow, dcol) = (0, 0) (0, 1) (8, 0) (8, 1) (0, 8) (0, 9) (8, 8) (8, 9).
__constant__ unsigned char fj_base_acc[32] = { 0, 32, 64, 96, 1, 33, 65, 97, 2, 34, 66, 98, 3, 35, 67, 99, 4, 36, 68, 100, 5, 37, 69, 101, 6, 38, 70, 102, 7, 39, 71, 103 };

namespace fj {

// Lane l's row and column in a stored 16x16 tile for ldmatrix.x4.
// Row-major operands (A, and V through .trans): matrices (0-7, 0-7),
// (8-15, 0-7), (0-7, 8-15), (8-15, 8-15).
__device__ __forceinline__ int ldm_row_rm(int lane) { return lane & 15; }
__device__ __forceinline__ int ldm_col_rm(int lane) { return (lane >> 4) << 3; }
// n-major B (K): matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7),
// (n 8-15, k 8-15).
__device__ __forceinline__ int ldm_row_nm(int lane) { return (lane & 7) | ((lane >> 4) << 3); }
__device__ __forceinline__ int ldm_col_nm(int lane) { return lane & 8; }

// Shared-space addresses (32-bit), so that the constant part of a fragment's
// position folds into the instruction's immediate offset.
__device__ __forceinline__ unsigned smem_addr(const void *p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void ldsm_x4(unsigned r[4], unsigned a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 { %0, %1, %2, %3 }, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned r[4], unsigned a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 { %0, %1, %2, %3 }, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

// c[0..7] += A . B for a 16x16 accumulator tile, f16 inputs.  Not
// volatile: a pure function of its registers, free to be scheduled.
__device__ __forceinline__ void mma_tile_f16(float c[8], const unsigned a[4], const unsigned b[4]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
               "{ %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, { %0, %1, %2, %3 };\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
               "{ %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, { %0, %1, %2, %3 };\n"
               : "+f"(c[4]), "+f"(c[5]), "+f"(c[6]), "+f"(c[7])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[2]), "r"(b[3]));
}
// c[0..7] += A . B for a 16x16 accumulator tile, bf16 inputs.  Not
// volatile: a pure function of its registers, free to be scheduled.
__device__ __forceinline__ void mma_tile_bf16(float c[8], const unsigned a[4], const unsigned b[4]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{ %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, { %0, %1, %2, %3 };\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{ %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, { %0, %1, %2, %3 };\n"
               : "+f"(c[4]), "+f"(c[5]), "+f"(c[6]), "+f"(c[7])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[2]), "r"(b[3]));
}

}  // namespace fj

namespace fj {

// Element offset of (r, c) in a Q, K or V tile.
__device__ __forceinline__ int tile_off(int r, int c) {
  return r * 136 + c;
}

// 16-byte global -> shared copy; src_bytes 0 writes zeros (sequence tails).
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(s), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
}

// One 16-byte chunk of a tile row: from g where `in`, else zeros (sequence
// tails).  `any` is an address that may be read: the copy of nothing still
// names one.
__device__ __forceinline__ void copy16(elem_t *d, const elem_t *g, const elem_t *any, bool in) {
  cp_async16(d, in ? g : any, in ? 16 : 0);
}

// Copies rows [row0, row0 + ROWS) of one head (row stride `stride`
// elements) into a shared tile; rows at or past `rows` become zeros.
// Thread i copies chunk i % 16 of rows i / 16 + 8 n: a row's swizzle
// repeats every 8 rows, so every copy after the first is a constant
// offset in shared memory and a pointer step in global memory.
template <int ROWS>
__device__ __forceinline__ void load_tile(elem_t *dst, const elem_t *src, long long stride,
                                          int row0, int rows) {
  const int r = threadIdx.x / 16, c = threadIdx.x % 16;
  elem_t *d = dst + tile_off(r, c * 8);
  const elem_t *g = src + (long long)(row0 + r) * stride + c * 8;
  const long long step = stride * 8;
#pragma unroll
  for (int n = 0; n < (ROWS + 7) / 8; ++n) {
    if (ROWS % 8 != 0 && r + n * 8 >= ROWS) break;
    const bool in = row0 + r + n * 8 < rows;
    copy16(d + n * 1088, g, src, in);
    g += step;
  }
}

// GQA-packed rows (pack_gqa): tile row r is packed row R = row0 + r, query
// position R / group of head R % group counted from `src`'s head; packed
// rows at or past `rows` become zeros.
template <int ROWS>
__device__ __forceinline__ void load_tile_packed(elem_t *dst, const elem_t *src, long long head_stride,
                                                 long long seq_stride, int group, int row0, int rows) {
  for (int i = threadIdx.x; i < ROWS * 16; i += 128) {
    const int r = i / 16, c = i % 16, R = row0 + r;
    elem_t *d = dst + tile_off(r, c * 8);
    const bool in = R < rows;
    const elem_t *g = src + (long long)(R % group) * head_stride + (long long)(R / group) * seq_stride + c * 8;
    copy16(d, g, src, in);
  }
}

// K and V rows as stored in global memory.
typedef elem_t kv_t;

// Where key row j of one head of K (or V) is.
struct KvSrc {
  const kv_t *base;   // row 0 (paged: token 0 of page 0)
  long long stride;   // between rows (paged: tokens of a page)
};

// Key tile t of one head's K or V into its slot of a ring.
__device__ __forceinline__ void ring_load(elem_t *ring, const KvSrc &src, int t, int rows) {
  load_tile<64>(ring + (t % 2) * 8704, src.base, src.stride, t * 64, rows);
}

// After Q's copies have been issued: tiles 0 .. 0 of K and V in
// flight, one cp.async group each (empty groups keep the count uniform),
// and Q landed.
__device__ __forceinline__ void kv_start(elem_t *s_k, elem_t *s_v, const KvSrc &k, const KvSrc &v,
                                         int rows, int ntiles) {
  cp_async_commit();  // Q's group
#pragma unroll
  for (int t = 0; t < 1; ++t) {
    if (t < ntiles) {
      ring_load(s_k, k, t, rows);
      ring_load(s_v, v, t, rows);
    }
    cp_async_commit();
  }
  cp_async_wait<1>();
}

// Key tile t's K and V resident and visible to the whole block.  One stage
// copies them once the previous tile is no longer read; more stages start
// tile t + 1 and wait for tile t.  Before a slot is refilled the
// caller synchronises (at the end of each iteration).
__device__ __forceinline__ void kv_ready(elem_t *s_k, elem_t *s_v, const KvSrc &k, const KvSrc &v,
                                         int rows, int t, int ntiles) {
  const int nt = t + 1;
  if (nt < ntiles) {
    ring_load(s_k, k, nt, rows);
    ring_load(s_v, v, nt, rows);
  }
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();
}

}  // namespace fj


namespace fj {
// Two floats as the A-operand register of two 16-bit elements (the first low).
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  const elem2_t e = to_elem2(lo, hi);
  return *reinterpret_cast<const unsigned *>(&e);
}
}  // namespace fj

// Minimum one block per multiprocessor, so that ptxas budgets registers for
// O, S and Q instead of spilling.
extern "C" __global__ void __launch_bounds__(128, 1)
fj_attn_d128_m64_n64_w4_s2_pad_regs_mma_br_bf16_gqa_split(const fj::Params p) {
  using fj::elem_t;
  extern __shared__ __align__(128) unsigned char smem[];
  elem_t *const s_q = reinterpret_cast<elem_t *>(smem + 0);
  elem_t *const s_k = reinterpret_cast<elem_t *>(smem + 17408);
  elem_t *const s_v = reinterpret_cast<elem_t *>(smem + 52224);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const fj::Block blk = fj::block_of(p);
  const int m0 = blk.m0;
  const elem_t *q = fj::head_rows<const elem_t>(p.q, p.q_stride, blk.b, blk.h);
  fj::KvSrc ksrc = {fj::head_rows<const fj::kv_t>(p.k, p.k_stride, blk.b, blk.hk), p.k_stride[2]};
  fj::KvSrc vsrc = {fj::head_rows<const fj::kv_t>(p.v, p.v_stride, blk.b, blk.hk), p.v_stride[2]};
  const float sl2 = p.scale_log2;
  const int acc_r = fj_base_acc[lane] & 15, acc_c = fj_base_acc[lane] >> 4;
  // ldmatrix source rows and columns of this lane (mma_frag.cuh).
  const int rm_r = fj::ldm_row_rm(lane), rm_c = fj::ldm_col_rm(lane);
  const int nm_r = fj::ldm_row_nm(lane), nm_c = fj::ldm_col_nm(lane);
  const unsigned rm_off = 2 * (rm_r * 136 + rm_c), nm_off = 2 * (nm_r * 136 + nm_c);
  const unsigned sq_u = fj::smem_addr(s_q), sk_u = fj::smem_addr(s_k), sv_u = fj::smem_addr(s_v);
  (void)rm_off; (void)nm_off;

  // Keys this block can see: all of them, or up to its last row's diagonal.
  const int n_end = min(p.seq_kv, min(((m0 + 64) - 1) / p.group + 1, p.seq_q) + p.causal_offset);
  const int t_first = 0 / 64;
  const int all_tiles = n_end > t_first * 64 ? (n_end - t_first * 64 + 63) / 64 : 0;
  // This block's share: range blk.split of p.splits, in whole key tiles
  // (empty where the splits outnumber the tiles); K and V start at kv0.
  const int per_split = (all_tiles + p.splits - 1) / p.splits;
  const int t_begin = min(all_tiles, blk.split * per_split);
  const int ntiles = min(all_tiles, t_begin + per_split) - t_begin;
  const int kv0 = (t_first + t_begin) * 64, kv_rows = p.seq_kv - kv0;
  ksrc.base += (long long)kv0 * ksrc.stride;
  vsrc.base += (long long)kv0 * vsrc.stride;

  fj::load_tile_packed<64>(s_q, q, p.q_stride[1], p.q_stride[2], p.group, m0, p.seq_q * p.group);
  // Prologue of the pipeline: group P = {Q, K(0)}, then groups g_i =
  // {K(i + 1), V(i)} for i < 1 (empty ones keep the count uniform).
  if (ntiles > 0) fj::ring_load(s_k, ksrc, 0, kv_rows);
  fj::cp_async_commit();
#pragma unroll
  for (int i = 0; i < 1; ++i) {
    if (i + 1 < ntiles) fj::ring_load(s_k, ksrc, i + 1, kv_rows);
    if (i < ntiles) fj::ring_load(s_v, vsrc, i, kv_rows);
    fj::cp_async_commit();
  }
  fj::cp_async_wait<1>();  // Q and K(0) have landed
  __syncthreads();

  // This warp's rows: wr + 16 mi + (the accumulator's row), mi < 1.
  const int wr = warp * 16;
  float o[1][8][8];
  float row_m[1][2], row_l[1][2];
#pragma unroll
  for (int mi = 0; mi < 1; ++mi) {
#pragma unroll
    for (int d = 0; d < 8; ++d)
#pragma unroll
      for (int s = 0; s < 8; ++s) o[mi][d][s] = 0.f;
#pragma unroll
    for (int c = 0; c < 2; ++c) { row_m[mi][c] = FJ_NEG_INF; row_l[mi][c] = 0.f; }
  }
  unsigned qf[1][8][4];
#pragma unroll
  for (int mi = 0; mi < 1; ++mi)
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
      fj::ldsm_x4(qf[mi][kk], sq_u + rm_off + 2 * ((wr + mi * 16) * 136 + kk * 16));

  // Software pipeline: S(t + 1) = Q K(t + 1) is issued beside the softmax
  // of S(t) and P(t) V(t), so the tensor cores work while the softmax's
  // arithmetic runs.  K runs one tile ahead of V: iteration t waits for
  // g_t = {K(t + 1), V(t)} and refills the buffers of K(t) and V(t - 1)
  // with g_{t + 1}.  (Past the last tile S(t + 1) reads a stale
  // buffer and is discarded.)
  float sc[1][4][8];
  {
#pragma unroll
    for (int mi = 0; mi < 1; ++mi)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int s = 0; s < 8; ++s) sc[mi][j][s] = 0.f;
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        unsigned kf[4];
        fj::ldsm_x4(kf, sk_u + nm_off + 2 * ((j * 16) * 136 + kk * 16));
#pragma unroll
        for (int mi = 0; mi < 1; ++mi) fj::mma_tile_bf16(sc[mi][j], qf[mi][kk], kf);
      }
    }
  }
  for (int t = 0; t < ntiles; ++t) {
    const int n0 = kv0 + t * 64;  // this warp's first key
    fj::cp_async_wait<0>();  // g_t has landed
    __syncthreads();                    // ... for every thread; K(t), V(t - 1) are free
    {
      const int i = t + 1;
      if (i + 1 < ntiles) fj::ring_load(s_k, ksrc, i + 1, kv_rows);
      if (i < ntiles) fj::ring_load(s_v, vsrc, i, kv_rows);
      fj::cp_async_commit();
    }
    const unsigned kn = sk_u + ((t + 1) % 2) * 17408, vt = sv_u + (t % 2) * 17408;
    float sn[1][4][8];
#pragma unroll
    for (int mi = 0; mi < 1; ++mi)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int s = 0; s < 8; ++s) sn[mi][j][s] = 0.f;
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        unsigned kf[4];
        fj::ldsm_x4(kf, kn + nm_off + 2 * ((j * 16) * 136 + kk * 16));
#pragma unroll
        for (int mi = 0; mi < 1; ++mi) fj::mma_tile_bf16(sn[mi][j], qf[mi][kk], kf);
      }
    }
    unsigned pk[1][4][4];
#pragma unroll
    for (int mi = 0; mi < 1; ++mi) {
      // Per row, the first column of this tile (counted from the lane's
      // first) that the row may not see: the sequence end, the diagonal or
      // the window's right side.
      const int lim1 = min(p.seq_kv - n0 - acc_c, (m0 + wr + mi * 16 + acc_r + 0) / p.group + p.causal_offset + 1 - n0 - acc_c);
      const int lim2 = min(p.seq_kv - n0 - acc_c, (m0 + wr + mi * 16 + acc_r + 8) / p.group + p.causal_offset + 1 - n0 - acc_c);
      {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (j * 16 + 0 >= lim1) sc[mi][j][0] = FJ_NEG_INF;
          if (j * 16 + 1 >= lim1) sc[mi][j][1] = FJ_NEG_INF;
          if (j * 16 + 0 >= lim2) sc[mi][j][2] = FJ_NEG_INF;
          if (j * 16 + 1 >= lim2) sc[mi][j][3] = FJ_NEG_INF;
          if (j * 16 + 8 >= lim1) sc[mi][j][4] = FJ_NEG_INF;
          if (j * 16 + 9 >= lim1) sc[mi][j][5] = FJ_NEG_INF;
          if (j * 16 + 8 >= lim2) sc[mi][j][6] = FJ_NEG_INF;
          if (j * 16 + 9 >= lim2) sc[mi][j][7] = FJ_NEG_INF;
        }
      }
      float mu1, alpha1;
      float mu2, alpha2;
      bool rs = true;  // O needs the rescale
      // The row max as a balanced tree (depth 4), then across the lanes
      // that share the row (XOR 1, 2).
      float mx1 = fmaxf(fmaxf(fmaxf(fmaxf(sc[mi][0][0], sc[mi][0][1]), fmaxf(sc[mi][0][4], sc[mi][0][5])), fmaxf(fmaxf(sc[mi][1][0], sc[mi][1][1]), fmaxf(sc[mi][1][4], sc[mi][1][5]))), fmaxf(fmaxf(fmaxf(sc[mi][2][0], sc[mi][2][1]), fmaxf(sc[mi][2][4], sc[mi][2][5])), fmaxf(fmaxf(sc[mi][3][0], sc[mi][3][1]), fmaxf(sc[mi][3][4], sc[mi][3][5]))));
      float mx2 = fmaxf(fmaxf(fmaxf(fmaxf(sc[mi][0][2], sc[mi][0][3]), fmaxf(sc[mi][0][6], sc[mi][0][7])), fmaxf(fmaxf(sc[mi][1][2], sc[mi][1][3]), fmaxf(sc[mi][1][6], sc[mi][1][7]))), fmaxf(fmaxf(fmaxf(sc[mi][2][2], sc[mi][2][3]), fmaxf(sc[mi][2][6], sc[mi][2][7])), fmaxf(fmaxf(sc[mi][3][2], sc[mi][3][3]), fmaxf(sc[mi][3][6], sc[mi][3][7]))));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      const float mn1 = fmaxf(row_m[mi][0], mx1);
      mx2 = fmaxf(mx2, __shfl_xor_sync(0xffffffffu, mx2, 1));
      mx2 = fmaxf(mx2, __shfl_xor_sync(0xffffffffu, mx2, 2));
      const float mn2 = fmaxf(row_m[mi][1], mx2);
      // Lazy rescale: unless the max of some row of this warp grew by more
      // than 2^8 (in base-2 units), the rows keep their old max and O its
      // scale; P then reaches at most 2^8, which every 16-bit type holds.
      // (A row that saw only hidden keys has -inf - -inf = NaN: no growth.)
      rs = __any_sync(0xffffffffu, mn1 * sl2 - row_m[mi][0] * sl2 > 8.f || mn2 * sl2 - row_m[mi][1] * sl2 > 8.f || false);
      const float mk1 = rs ? mn1 : row_m[mi][0];
      // A row that has seen only hidden keys keeps max -inf; subtracting 0
      // instead keeps exp2 at 0 rather than NaN.
      mu1 = mk1 == FJ_NEG_INF ? 0.f : mk1 * sl2;
      alpha1 = fj::fast_exp2(row_m[mi][0] * sl2 - mu1);
      row_m[mi][0] = mk1;
      const float mk2 = rs ? mn2 : row_m[mi][1];
      // A row that has seen only hidden keys keeps max -inf; subtracting 0
      // instead keeps exp2 at 0 rather than NaN.
      mu2 = mk2 == FJ_NEG_INF ? 0.f : mk2 * sl2;
      alpha2 = fj::fast_exp2(row_m[mi][1] * sl2 - mu2);
      row_m[mi][1] = mk2;
      float sum1 = 0.f;
      float sum2 = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        sc[mi][j][0] = fj::fast_exp2(fmaf(sc[mi][j][0], sl2, -mu1));
        sc[mi][j][1] = fj::fast_exp2(fmaf(sc[mi][j][1], sl2, -mu1));
        sc[mi][j][2] = fj::fast_exp2(fmaf(sc[mi][j][2], sl2, -mu2));
        sc[mi][j][3] = fj::fast_exp2(fmaf(sc[mi][j][3], sl2, -mu2));
        sc[mi][j][4] = fj::fast_exp2(fmaf(sc[mi][j][4], sl2, -mu1));
        sc[mi][j][5] = fj::fast_exp2(fmaf(sc[mi][j][5], sl2, -mu1));
        sc[mi][j][6] = fj::fast_exp2(fmaf(sc[mi][j][6], sl2, -mu2));
        sc[mi][j][7] = fj::fast_exp2(fmaf(sc[mi][j][7], sl2, -mu2));
        sum1 += ((sc[mi][j][0] + sc[mi][j][1]) + (sc[mi][j][4] + sc[mi][j][5]));
        sum2 += ((sc[mi][j][2] + sc[mi][j][3]) + (sc[mi][j][6] + sc[mi][j][7]));
        // P as the A operand at once (half the registers of S): A slot s
        // is accumulator slot 0<-0 1<-1 2<-2 3<-3 4<-4 5<-5 6<-6 7<-7.
        pk[mi][j][0] = fj::pack2(sc[mi][j][0], sc[mi][j][1]);
        pk[mi][j][1] = fj::pack2(sc[mi][j][2], sc[mi][j][3]);
        pk[mi][j][2] = fj::pack2(sc[mi][j][4], sc[mi][j][5]);
        pk[mi][j][3] = fj::pack2(sc[mi][j][6], sc[mi][j][7]);
      }
      row_l[mi][0] = row_l[mi][0] * alpha1 + sum1;
      row_l[mi][1] = row_l[mi][1] * alpha2 + sum2;
      if (rs)
#pragma unroll
      for (int d = 0; d < 8; ++d) {
        o[mi][d][0] *= alpha1;
        o[mi][d][1] *= alpha1;
        o[mi][d][2] *= alpha2;
        o[mi][d][3] *= alpha2;
        o[mi][d][4] *= alpha1;
        o[mi][d][5] *= alpha1;
        o[mi][d][6] *= alpha2;
        o[mi][d][7] *= alpha2;
      }
    }

#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
      for (int d = 0; d < 8; ++d) {
        unsigned vf[4];
        fj::ldsm_x4_t(vf, vt + rm_off + 2 * ((kk * 16) * 136 + d * 16));
#pragma unroll
        for (int mi = 0; mi < 1; ++mi) fj::mma_tile_bf16(o[mi][d], pk[mi][kk], vf);
      }
    }
#pragma unroll
    for (int mi = 0; mi < 1; ++mi)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int s = 0; s < 8; ++s) sc[mi][j][s] = sn[mi][j][s];
  }
  fj::cp_async_wait<0>();

  // The combine kernel may be scheduled now (launched to start early, it
  // waits for this grid's end before it reads the partials).
  asm volatile("griddepcontrol.launch_dependents;");
  // The row sums, so far per lane, over the lanes that share each row; then
  // O = O / l and the log-sum-exp (epilogue_regs.cuh).
  // Defined here, not before the walk: live across it, it spilled.
  const long long part0 = (long long)blk.split * p.batch * p.heads_q * p.seq_q;
  // One lane per row group writes the log-sum-exp: the group's lowest.
  int leader = lane;
  leader = min(leader, lane ^ 1);
  leader = min(leader, lane ^ 2);
  leader = min(leader, lane ^ 3);
#pragma unroll
  for (int mi = 0; mi < 1; ++mi) {
    float l1 = row_l[mi][0];
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float inv1 = l1 > 0.f ? fj::rcp_ftz(l1) : 0.f;
    float l2 = row_l[mi][1];
    l2 += __shfl_xor_sync(0xffffffffu, l2, 1);
    l2 += __shfl_xor_sync(0xffffffffu, l2, 2);
    const float inv2 = l2 > 0.f ? fj::rcp_ftz(l2) : 0.f;
    // One branch per row and its first element once: the stores of a row
    // share them (a packed row's head and position are divisions, which
    // the compiler would repeat per store under separate conditions).
    {
      const int row = m0 + wr + mi * 16 + acc_r + 0;
      if (row < p.seq_q * p.group) {
        float *const out = p.o_part + (part0 + ((long long)blk.b * p.heads_q + blk.h + (row) % p.group) * p.seq_q + (row) / p.group) * 128 + acc_c;
#pragma unroll
        for (int d = 0; d < 8; ++d) {
          *reinterpret_cast<float2 *>(out + d * 16 + 0) =
              make_float2(o[mi][d][0] * inv1, o[mi][d][1] * inv1);
          *reinterpret_cast<float2 *>(out + d * 16 + 8) =
              make_float2(o[mi][d][4] * inv1, o[mi][d][5] * inv1);
        }
      }
    }
    {
      const int row = m0 + wr + mi * 16 + acc_r + 8;
      if (row < p.seq_q * p.group) {
        float *const out = p.o_part + (part0 + ((long long)blk.b * p.heads_q + blk.h + (row) % p.group) * p.seq_q + (row) / p.group) * 128 + acc_c;
#pragma unroll
        for (int d = 0; d < 8; ++d) {
          *reinterpret_cast<float2 *>(out + d * 16 + 0) =
              make_float2(o[mi][d][2] * inv2, o[mi][d][3] * inv2);
          *reinterpret_cast<float2 *>(out + d * 16 + 8) =
              make_float2(o[mi][d][6] * inv2, o[mi][d][7] * inv2);
        }
      }
    }
    {
      {
        const int row = m0 + wr + mi * 16 + acc_r + 0;
        if (lane == leader && row < p.seq_q * p.group)
          p.lse_part[part0 + ((long long)blk.b * p.heads_q + blk.h + (row) % p.group) * p.seq_q + (row) / p.group] =
              l1 > 0.f ? (row_m[mi][0] * sl2 + __log2f(l1)) * 0.69314718056f : FJ_NEG_INF;
      }
      {
        const int row = m0 + wr + mi * 16 + acc_r + 8;
        if (lane == leader && row < p.seq_q * p.group)
          p.lse_part[part0 + ((long long)blk.b * p.heads_q + blk.h + (row) % p.group) * p.seq_q + (row) / p.group] =
              l2 > 0.f ? (row_m[mi][1] * sl2 + __log2f(l2)) * 0.69314718056f : FJ_NEG_INF;
      }
    }
  }

}
