// flashjit generated kernel: fj_attn_d128_m128_n64_w8_s2_xor_regs_wmma_tl_bf16
// variant: head_dim=128 tile_m=128 tile_n=64 warps=8 stages=2 swizzle=xor softmax=regs mma=wmma causal=top-left dtype=bf16 kv_dtype=bf16
// target: sm_90a; rendered by flashjit 0.1.0 from templates/attention_wmma.cu
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>

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
};

__device__ __forceinline__ Block block_of(const Params &p) {
  Block blk;
  blk.m0 = (gridDim.x - 1 - blockIdx.x) * 128;
  blk.h = blockIdx.y;
  blk.b = blockIdx.z;
  blk.hk = blk.h / p.group;
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
  return ((p.seq_q + 127) / 128 + 1) / 2 * p.heads_q * p.batch;
}

// Half h of unit u (the heavier tile first); false where a unit has no
// second half.  One division: units below `paired` are pairs, the rest
// each head's middle tile (full == the pairs a head has).
__device__ __forceinline__ bool tile_of(const Params &p, int u, int h, Block &blk) {
  const int nm = (p.seq_q + 127) / 128, full = nm / 2;
  const int paired = full * p.heads_q * p.batch;
  const bool single = u >= paired;
  if (single && h) return false;
  const int per = single ? 1 : full, base = single ? paired : 0;
  const int hb = (u - base) / per, j = u - base - hb * per;
  blk.m0 = (single ? full : h ? j : nm - 1 - j) * 128;
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

// shared memory: 98304 bytes; q @0; k @32768; v @65536

// Fragment layouts from the layout tables: each lane's base (row | col << 4);
// slot s adds a compile-time delta.
__constant__ unsigned char fj_base_acc[32] = { 0, 32, 64, 96, 1, 33, 65, 97, 2, 34, 66, 98, 3, 35, 67, 99, 4, 36, 68, 100, 5, 37, 69, 101, 6, 38, 70, 102, 7, 39, 71, 103 };
__constant__ unsigned char fj_base_a[32] = { 0, 32, 64, 96, 1, 33, 65, 97, 2, 34, 66, 98, 3, 35, 67, 99, 4, 36, 68, 100, 5, 37, 69, 101, 6, 38, 70, 102, 7, 39, 71, 103 };
__constant__ unsigned char fj_base_bk[32] = { 0, 2, 4, 6, 16, 18, 20, 22, 32, 34, 36, 38, 48, 50, 52, 54, 64, 66, 68, 70, 80, 82, 84, 86, 96, 98, 100, 102, 112, 114, 116, 118 };
__constant__ unsigned char fj_base_bv[32] = { 0, 2, 4, 6, 16, 18, 20, 22, 32, 34, 36, 38, 48, 50, 52, 54, 64, 66, 68, 70, 80, 82, 84, 86, 96, 98, 100, 102, 112, 114, 116, 118 };

namespace fj {

// Element offset of (r, c) in a P tile.
__device__ __forceinline__ int p_off(int r, int c) { return r * 72 + c; }

// ldmatrix: lane l names the row of 8x8 matrix l / 8 that it loads.
__device__ __forceinline__ void ldmatrix_x4(unsigned r[4], const elem_t *row) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 { %0, %1, %2, %3 }, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned r[4], const elem_t *row) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 { %0, %1, %2, %3 }, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
// The two 16-bit halves of a register: the lower is the first element.
template <typename T> __device__ __forceinline__ void split(unsigned r, T &lo, T &hi) {
  const elem2_t e = *reinterpret_cast<const elem2_t *>(&r);
  lo = e.x;
  hi = e.y;
}
}  // namespace fj

namespace fj {

// Element offset of (r, c) in a Q, K or V tile.
__device__ __forceinline__ int tile_off(int r, int c) {
  return r * 128 + ((((c >> 3) ^ (r & 7)) << 3) | (c & 7));
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
// Thread i copies chunk i % 16 of rows i / 16 + 16 n: a row's swizzle
// repeats every 16 rows, so every copy after the first is a constant
// offset in shared memory and a pointer step in global memory.
template <int ROWS>
__device__ __forceinline__ void load_tile(elem_t *dst, const elem_t *src, long long stride,
                                          int row0, int rows) {
  const int r = threadIdx.x / 16, c = threadIdx.x % 16;
  elem_t *d = dst + tile_off(r, c * 8);
  const elem_t *g = src + (long long)(row0 + r) * stride + c * 8;
  const long long step = stride * 16;
#pragma unroll
  for (int n = 0; n < (ROWS + 15) / 16; ++n) {
    if (ROWS % 16 != 0 && r + n * 16 >= ROWS) break;
    const bool in = row0 + r + n * 16 < rows;
    copy16(d + n * 2048, g, src, in);
    g += step;
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
  load_tile<64>(ring + (t % 2) * 8192, src.base, src.stride, t * 64, rows);
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


// Minimum one block per multiprocessor: without it ptxas keeps a register
// budget of its own and spills long-lived values (seen at 96 registers for
// head_dim 32) instead of using the registers it may have.
extern "C" __global__ void __launch_bounds__(256, 1)
fj_attn_d128_m128_n64_w8_s2_xor_regs_wmma_tl_bf16(const fj::Params p) {
  using namespace nvcuda;
  using fj::elem_t;
  using fj::elem2_t;
  typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, elem_t, wmma::row_major> frag_a;
  typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, elem_t, wmma::col_major> frag_bk;
  typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, elem_t, wmma::row_major> frag_bv;
  typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;
  extern __shared__ __align__(128) unsigned char smem[];
  elem_t *const s_q = reinterpret_cast<elem_t *>(smem + 0);
  elem_t *const s_k = reinterpret_cast<elem_t *>(smem + 32768);
  elem_t *const s_v = reinterpret_cast<elem_t *>(smem + 65536);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  (void)warp; (void)lane;
  const fj::Block blk = fj::block_of(p);
  const int m0 = blk.m0;
  const elem_t *q = fj::head_rows<const elem_t>(p.q, p.q_stride, blk.b, blk.h);
  const fj::kv_t *k = fj::head_rows<const fj::kv_t>(p.k, p.k_stride, blk.b, blk.hk);
  const fj::kv_t *v = fj::head_rows<const fj::kv_t>(p.v, p.v_stride, blk.b, blk.hk);
  const float sl2 = p.scale_log2;
  const int qa_r = fj_base_a[lane] & 15, qa_c = fj_base_a[lane] >> 4;
  const int kb_k = fj_base_bk[lane] & 15, kb_n = fj_base_bk[lane] >> 4;
  const int vb_k = fj_base_bv[lane] & 15, vb_n = fj_base_bv[lane] >> 4;
  (void)qa_r; (void)qa_c; (void)kb_k; (void)kb_n; (void)vb_k; (void)vb_n;
  const int lq_r = ((10 >> (lane >> 3)) & 1) * 8 + (lane & 7), lq_c = ((12 >> (lane >> 3)) & 1) * 8;
  const int lk_r = ((12 >> (lane >> 3)) & 1) * 8 + (lane & 7), lk_c = ((10 >> (lane >> 3)) & 1) * 8;
  const int lv_r = ((10 >> (lane >> 3)) & 1) * 8 + (lane & 7), lv_c = ((12 >> (lane >> 3)) & 1) * 8;

  // Keys this block can see: all of them, or up to its last row's diagonal.
  const int n_end = min(p.seq_kv, min(m0 + 128, p.seq_q) + p.causal_offset);
  const int ntiles = n_end > 0 ? (n_end + 63) / 64 : 0;

  fj::load_tile<128>(s_q, q, p.q_stride[2], m0, p.seq_q);
  const fj::KvSrc ksrc = {k, p.k_stride[2]}, vsrc = {v, p.v_stride[2]};
  fj::kv_start(s_k, s_v, ksrc, vsrc, p.seq_kv, ntiles);
  // This warp's 16 query rows, in registers.
  const int wr = warp * 16;
  const int acc_r = fj_base_acc[lane] & 15, acc_c = fj_base_acc[lane] >> 4;
  frag_c o[8];
#pragma unroll
  for (int d = 0; d < 8; ++d) wmma::fill_fragment(o[d], 0.f);
  // Running max (raw scores) and sum of each row class: rows acc_r + 0 8.
  float row_m[1][2], row_l[1][2];
#pragma unroll
  for (int c = 0; c < 2; ++c) { row_m[0][c] = FJ_NEG_INF; row_l[0][c] = 0.f; }
  __syncthreads();
  frag_a qf[8];
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    { unsigned r_[4]; fj::ldmatrix_x4(r_, s_q + fj::tile_off(wr + lq_r, kk * 16 + lq_c)); fj::split(r_[0], qf[kk].x[0], qf[kk].x[1]); fj::split(r_[1], qf[kk].x[2], qf[kk].x[3]); fj::split(r_[2], qf[kk].x[4], qf[kk].x[5]); fj::split(r_[3], qf[kk].x[6], qf[kk].x[7]); }
  }

  for (int t = 0; t < ntiles; ++t) {
    const int n0 = t * 64;
    fj::kv_ready(s_k, s_v, ksrc, vsrc, p.seq_kv, t, ntiles);
    const elem_t *kt = s_k + (t % 2) * 8192, *vt = s_v + (t % 2) * 8192;
    // Masks only where a key is past the end or above some row's diagonal.
    const bool need_mask = n0 + 64 > p.seq_kv || n0 + 63 > m0 + p.causal_offset;
    (void)need_mask;

    // S = Q K^T for this warp's 16 rows.
    frag_c sc[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) wmma::fill_fragment(sc[j], 0.f);
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        frag_bk bt;
        { unsigned r_[4]; fj::ldmatrix_x4(r_, kt + fj::tile_off(j * 16 + lk_r, kk * 16 + lk_c)); fj::split(r_[0], bt.x[0], bt.x[1]); fj::split(r_[1], bt.x[2], bt.x[3]); fj::split(r_[2], bt.x[4], bt.x[5]); fj::split(r_[3], bt.x[6], bt.x[7]); }
        wmma::mma_sync(sc[j], qf[kk], bt, sc[j]);
      }
    }

    // The online softmax on the fragments (softmax_regs.cuh), O rescaled.
#pragma unroll
    for (int mi = 0; mi < 1; ++mi) {
      // Per row, the first column of this tile (counted from the lane's
      // first) that the row may not see: the sequence end, the diagonal or
      // the window's right side.
      const int lim1 = min(p.seq_kv - n0 - acc_c, m0 + wr + acc_r + 0 + p.causal_offset + 1 - n0 - acc_c);
      const int lim2 = min(p.seq_kv - n0 - acc_c, m0 + wr + acc_r + 8 + p.causal_offset + 1 - n0 - acc_c);
      if (need_mask) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (j * 16 + 0 >= lim1) sc[j].x[0] = FJ_NEG_INF;
          if (j * 16 + 1 >= lim1) sc[j].x[1] = FJ_NEG_INF;
          if (j * 16 + 0 >= lim2) sc[j].x[2] = FJ_NEG_INF;
          if (j * 16 + 1 >= lim2) sc[j].x[3] = FJ_NEG_INF;
          if (j * 16 + 8 >= lim1) sc[j].x[4] = FJ_NEG_INF;
          if (j * 16 + 9 >= lim1) sc[j].x[5] = FJ_NEG_INF;
          if (j * 16 + 8 >= lim2) sc[j].x[6] = FJ_NEG_INF;
          if (j * 16 + 9 >= lim2) sc[j].x[7] = FJ_NEG_INF;
        }
      }
      float mu1, alpha1;
      float mu2, alpha2;
      bool rs = true;  // O needs the rescale
      // The row max as a balanced tree (depth 4), then across the lanes
      // that share the row (XOR 1, 2).
      float mx1 = fmaxf(fmaxf(fmaxf(fmaxf(sc[0].x[0], sc[0].x[1]), fmaxf(sc[0].x[4], sc[0].x[5])), fmaxf(fmaxf(sc[1].x[0], sc[1].x[1]), fmaxf(sc[1].x[4], sc[1].x[5]))), fmaxf(fmaxf(fmaxf(sc[2].x[0], sc[2].x[1]), fmaxf(sc[2].x[4], sc[2].x[5])), fmaxf(fmaxf(sc[3].x[0], sc[3].x[1]), fmaxf(sc[3].x[4], sc[3].x[5]))));
      float mx2 = fmaxf(fmaxf(fmaxf(fmaxf(sc[0].x[2], sc[0].x[3]), fmaxf(sc[0].x[6], sc[0].x[7])), fmaxf(fmaxf(sc[1].x[2], sc[1].x[3]), fmaxf(sc[1].x[6], sc[1].x[7]))), fmaxf(fmaxf(fmaxf(sc[2].x[2], sc[2].x[3]), fmaxf(sc[2].x[6], sc[2].x[7])), fmaxf(fmaxf(sc[3].x[2], sc[3].x[3]), fmaxf(sc[3].x[6], sc[3].x[7]))));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      const float mn1 = fmaxf(row_m[mi][0], mx1);
      mx2 = fmaxf(mx2, __shfl_xor_sync(0xffffffffu, mx2, 1));
      mx2 = fmaxf(mx2, __shfl_xor_sync(0xffffffffu, mx2, 2));
      const float mn2 = fmaxf(row_m[mi][1], mx2);
      const float mk1 = mn1;
      // A row that has seen only hidden keys keeps max -inf; subtracting 0
      // instead keeps exp2 at 0 rather than NaN.
      mu1 = mk1 == FJ_NEG_INF ? 0.f : mk1 * sl2;
      alpha1 = fj::fast_exp2(row_m[mi][0] * sl2 - mu1);
      row_m[mi][0] = mk1;
      const float mk2 = mn2;
      // A row that has seen only hidden keys keeps max -inf; subtracting 0
      // instead keeps exp2 at 0 rather than NaN.
      mu2 = mk2 == FJ_NEG_INF ? 0.f : mk2 * sl2;
      alpha2 = fj::fast_exp2(row_m[mi][1] * sl2 - mu2);
      row_m[mi][1] = mk2;
      float sum1 = 0.f;
      float sum2 = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        sc[j].x[0] = fj::fast_exp2(fmaf(sc[j].x[0], sl2, -mu1));
        sc[j].x[1] = fj::fast_exp2(fmaf(sc[j].x[1], sl2, -mu1));
        sc[j].x[2] = fj::fast_exp2(fmaf(sc[j].x[2], sl2, -mu2));
        sc[j].x[3] = fj::fast_exp2(fmaf(sc[j].x[3], sl2, -mu2));
        sc[j].x[4] = fj::fast_exp2(fmaf(sc[j].x[4], sl2, -mu1));
        sc[j].x[5] = fj::fast_exp2(fmaf(sc[j].x[5], sl2, -mu1));
        sc[j].x[6] = fj::fast_exp2(fmaf(sc[j].x[6], sl2, -mu2));
        sc[j].x[7] = fj::fast_exp2(fmaf(sc[j].x[7], sl2, -mu2));
        sum1 += ((sc[j].x[0] + sc[j].x[1]) + (sc[j].x[4] + sc[j].x[5]));
        sum2 += ((sc[j].x[2] + sc[j].x[3]) + (sc[j].x[6] + sc[j].x[7]));
      }
      row_l[mi][0] = row_l[mi][0] * alpha1 + sum1;
      row_l[mi][1] = row_l[mi][1] * alpha2 + sum2;
      if (rs)
#pragma unroll
      for (int d = 0; d < 8; ++d) {
        o[d].x[0] *= alpha1;
        o[d].x[1] *= alpha1;
        o[d].x[2] *= alpha2;
        o[d].x[3] *= alpha2;
        o[d].x[4] *= alpha1;
        o[d].x[5] *= alpha1;
        o[d].x[6] *= alpha2;
        o[d].x[7] *= alpha2;
      }
    }


    // O += P V, P taken from S's fragments.
    // The probe shows each A-operand slot holding the element of an
    // accumulator slot of the same lane: P never leaves registers.
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      frag_a pa;
      { const elem2_t e = fj::to_elem2(sc[kk].x[0], sc[kk].x[1]); pa.x[0] = e.x; pa.x[1] = e.y; }
      { const elem2_t e = fj::to_elem2(sc[kk].x[2], sc[kk].x[3]); pa.x[2] = e.x; pa.x[3] = e.y; }
      { const elem2_t e = fj::to_elem2(sc[kk].x[4], sc[kk].x[5]); pa.x[4] = e.x; pa.x[5] = e.y; }
      { const elem2_t e = fj::to_elem2(sc[kk].x[6], sc[kk].x[7]); pa.x[6] = e.x; pa.x[7] = e.y; }
#pragma unroll
      for (int d = 0; d < 8; ++d) {
        frag_bv bv;
        { unsigned r_[4]; fj::ldmatrix_x4_trans(r_, vt + fj::tile_off(kk * 16 + lv_r, d * 16 + lv_c)); fj::split(r_[0], bv.x[0], bv.x[1]); fj::split(r_[1], bv.x[2], bv.x[3]); fj::split(r_[2], bv.x[4], bv.x[5]); fj::split(r_[3], bv.x[6], bv.x[7]); }
        wmma::mma_sync(o[d], pa, bv, o[d]);
      }
    }
    __syncthreads();  // tile t's buffers are refilled next iteration
  }
  fj::cp_async_wait<0>();

  elem_t *o_out = fj::head_rows<elem_t>(p.o, p.o_stride, blk.b, blk.h);
  // O = O / l and the log-sum-exp from the fragments (epilogue_regs.cuh).
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
    // Store by store (one head's rows: no division to share; grouped by
    // row, the mma family at 255 registers spilled).
#pragma unroll
    for (int d = 0; d < 8; ++d) {
      {
        const int row = m0 + wr + acc_r + 0, col = d * 16 + acc_c + 0;
        if (row < p.seq_q) {
          elem_t *dst = o_out + (long long)row * p.o_stride[2] + col;
          *reinterpret_cast<fj::elem2_t *>(dst) = fj::to_elem2(o[d].x[0] * inv1,
                                                               o[d].x[1] * inv1);
        }
      }
      {
        const int row = m0 + wr + acc_r + 8, col = d * 16 + acc_c + 0;
        if (row < p.seq_q) {
          elem_t *dst = o_out + (long long)row * p.o_stride[2] + col;
          *reinterpret_cast<fj::elem2_t *>(dst) = fj::to_elem2(o[d].x[2] * inv2,
                                                               o[d].x[3] * inv2);
        }
      }
      {
        const int row = m0 + wr + acc_r + 0, col = d * 16 + acc_c + 8;
        if (row < p.seq_q) {
          elem_t *dst = o_out + (long long)row * p.o_stride[2] + col;
          *reinterpret_cast<fj::elem2_t *>(dst) = fj::to_elem2(o[d].x[4] * inv1,
                                                               o[d].x[5] * inv1);
        }
      }
      {
        const int row = m0 + wr + acc_r + 8, col = d * 16 + acc_c + 8;
        if (row < p.seq_q) {
          elem_t *dst = o_out + (long long)row * p.o_stride[2] + col;
          *reinterpret_cast<fj::elem2_t *>(dst) = fj::to_elem2(o[d].x[6] * inv2,
                                                               o[d].x[7] * inv2);
        }
      }
    }
    if (p.lse) {
      {
        const int row = m0 + wr + acc_r + 0;
        if (lane == leader && row < p.seq_q)
          p.lse[((long long)blk.b * p.heads_q + blk.h) * p.seq_q + row] =
              l1 > 0.f ? (row_m[mi][0] * sl2 + __log2f(l1)) * 0.69314718056f : FJ_NEG_INF;
      }
      {
        const int row = m0 + wr + acc_r + 8;
        if (lane == leader && row < p.seq_q)
          p.lse[((long long)blk.b * p.heads_q + blk.h) * p.seq_q + row] =
              l2 > 0.f ? (row_m[mi][1] * sl2 + __log2f(l2)) * 0.69314718056f : FJ_NEG_INF;
      }
    }
  }

}
