// flashjit generated kernel: fj_attn_d128_m128_n176_w12_s2_xor_regs_wgmma_nc_f16
// variant: head_dim=128 tile_m=128 tile_n=176 warps=12 stages=2 swizzle=xor softmax=regs mma=wgmma causal=none dtype=f16 kv_dtype=f16
// target: sm_90a; rendered by flashjit 0.1.0 from templates/attention_wgmma.cu
#include <cuda_fp16.h>

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

typedef __half elem_t;
typedef __half2 elem2_t;
__device__ __forceinline__ elem_t to_elem(float x) { return __float2half_rn(x); }
__device__ __forceinline__ elem2_t to_elem2(float a, float b) { return __floats2half2_rn(a, b); }
__device__ __forceinline__ float from_elem(elem_t x) { return __half2float(x); }

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

namespace fj {

// Byte offset of element (r, c) in a 128-byte-swizzled panel (c < 64).
__device__ __forceinline__ unsigned sw128(int r, int c) {
  return (unsigned)(r * 128 + ((((c >> 3) ^ (r & 7)) << 4) | ((c & 7) << 1)));
}

// Plain shared-space stores and loads at shared-space addresses (the
// epilogue's staging of O: epilogue_regs.cuh's `stage`).
__device__ __forceinline__ void st_shared_b32(unsigned a, unsigned v) {
  asm volatile("st.shared.b32 [%0], %1;\n" :: "r"(a), "r"(v) : "memory");
}
__device__ __forceinline__ void st_shared_b16(unsigned a, unsigned short v) {
  asm volatile("st.shared.b16 [%0], %1;\n" :: "r"(a), "h"(v) : "memory");
}
__device__ __forceinline__ void st_shared_b8(unsigned a, unsigned char v) {
  asm volatile("st.shared.b8 [%0], %1;\n" :: "r"(a), "h"((unsigned short)v) : "memory");
}
__device__ __forceinline__ float ld_shared_f32(unsigned a) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(a) : "memory");
  return v;
}
__device__ __forceinline__ uint4 ld_shared_v4(unsigned a) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 { %0, %1, %2, %3 }, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a) : "memory");
  return v;
}

// A shared-memory matrix descriptor, 128-byte swizzle.
__device__ __forceinline__ unsigned long long wg_desc(unsigned saddr, unsigned lead, unsigned stride) {
  return (unsigned long long)((saddr & 0x3FFFFu) >> 4) | ((unsigned long long)(lead >> 4) << 16) |
         ((unsigned long long)(stride >> 4) << 32) | (1ull << 62);
}
// Descriptor d moved `bytes` (a multiple of 16) on: an add to its start
// address field alone.  Exact, with no carry out of the field: shared-space
// addresses lie below 2^18, so the field (address >> 4, bits 0-13) of the
// base and of base + bytes are the base's and base + bytes' own.  One
// 64-bit add (not the halves split and joined, which made ptxas move the
// high word anew for every wgmma: 56 instructions a step at d128).
__device__ __forceinline__ unsigned long long wg_desc_at(unsigned long long d, unsigned bytes) {
  return d + (unsigned long long)(bytes >> 4);
}
// The same as two 32-bit halves, the low one added to and the high one
// kept: what the forward's main loop compiles best with (nvdisasm at bf16
// d128: 21 R2UR against 27 with the 64-bit add; FP8 d256 causal spills
// none against 16 bytes), where the backward's compiles best with the
// 64-bit add above.
__device__ __forceinline__ unsigned long long wg_desc_at_lo(unsigned long long d, unsigned bytes) {
  const unsigned lo = (unsigned)d + (bytes >> 4), hi = (unsigned)(d >> 32);
  return (unsigned long long)hi << 32 | lo;
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}
// Keeps the compiler from moving register work on an accumulator across
// the wgmma that owns it (it cannot see the asynchrony).
__device__ __forceinline__ void wg_hold(float &x) { asm volatile("" : "+f"(x) :: "memory"); }

// A value the compiler cannot see through (nor fold, nor hoist out of a loop).
__device__ __forceinline__ unsigned opaque_u32(unsigned a) {
  unsigned b;
  asm volatile("mov.b32 %0, %1;" : "=r"(b) : "r"(a));
  return b;
}

// wgmma.wait_group 0 at the top of a block of its own.  ptxas moves a wait
// to the top of its block, above any work that touches no register of the
// pending wgmmas (the forward's softmax, which the wait should overlap with
// O += P V), but not across a branch: this waits on both sides of one
// whose condition neither NVVM nor ptxas can fold (u, through opaque_u32,
// against ~0u), so the work before it in the source stays before it.
// u must be the same in every thread of the warpgroup (the wait is
// .aligned over it): a loop counter, say.  Either side waits.
__device__ __forceinline__ void wg_wait0_split(unsigned u) {
  if (opaque_u32(u) != ~0u)
    asm volatile("wgmma.wait_group.sync.aligned 0;  // split" ::: "memory");
  else
    asm volatile("wgmma.wait_group.sync.aligned 0;  // split, other side" ::: "memory");
}

// A shared-space address the compiler cannot fold into a constant: NVRTC
// 13.0's PTX compiler crashes on wgmma whose descriptors are constants.
__device__ __forceinline__ unsigned smem_opaque(const void *p) {
  return opaque_u32((unsigned)__cvta_generic_to_shared(p));
}

// Generic-proxy writes to shared memory, made visible to wgmma and TMA.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// ---- mbarriers (shared-space addresses) ----
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also expects `bytes` of transactions (a TMA load's).
__device__ __forceinline__ void mbar_expect(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
__device__ __forceinline__ unsigned mbar_test(unsigned bar, unsigned parity) {
  unsigned done;
  asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }\n"
               : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  return done;
}
// Waits for the phase of parity `parity` to complete.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  while (!mbar_test(bar, parity)) {
  }
}

// ---- TMA: a box of a rank-4 tensor map into shared memory ----
__device__ __forceinline__ void tma_load4(unsigned dst, const void *map, unsigned bar, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, { %2, %3, %4, %5 }], [%6];\n"
               :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar) : "memory");
}

// ---- a bulk copy of `bytes` (a multiple of 16, both ends 16-byte aligned)
// of global memory into shared memory, counted on barrier `bar` ----
__device__ __forceinline__ void bulk_load(unsigned dst, const void *src, unsigned bytes, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// ---- bulk reduce-adds: `bytes` (a multiple of 16, both ends 16-byte
// aligned) of float32 in shared memory added into global memory by the
// TMA unit; a thread's groups of them, committed, are waited for until
// they have read shared memory (bulk_wait_read) or completed (bulk_wait),
// all but the N most recent ----
__device__ __forceinline__ void bulk_reduce_add_f32(float *dst, unsigned src, unsigned bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
               :: "l"(dst), "r"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N = 0> __device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" :: "n"(N) : "memory");
}
template <int N = 0> __device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" :: "n"(N) : "memory");
}
// Orders the TMA unit's accesses of global memory with this thread's own
// (both ways): after a bulk_wait, before a release; after an acquire,
// before the next bulk operation.
__device__ __forceinline__ void fence_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }
__device__ __forceinline__ void st_shared_v2_f32(unsigned a, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], { %1, %2 };\n" :: "r"(a), "f"(x), "f"(y) : "memory");
}

// ---- registers moved between warpgroups ----
template <int N> __device__ __forceinline__ void regs_up() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(N));
}
template <int N> __device__ __forceinline__ void regs_down() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(N));
}

// ---- named barriers: ids 1.. (0 is __syncthreads') ----
__device__ __forceinline__ void bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void wg_ss_f16_176(float (&d)[11][8], unsigned long long da, unsigned long long db, int scale_d) {
  asm volatile("{ .reg .pred p; setp.ne.b32 p, %90, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n176k16.f32.f16.f16 { %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87 }, %88, %89, p, 1, 1, 0, 0; }\n"
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[0][4]), "+f"(d[0][5]), "+f"(d[0][6]), "+f"(d[0][7]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[1][4]), "+f"(d[1][5]), "+f"(d[1][6]), "+f"(d[1][7]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[2][4]), "+f"(d[2][5]), "+f"(d[2][6]), "+f"(d[2][7]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[3][4]), "+f"(d[3][5]), "+f"(d[3][6]), "+f"(d[3][7]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[4][4]), "+f"(d[4][5]), "+f"(d[4][6]), "+f"(d[4][7]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[5][4]), "+f"(d[5][5]), "+f"(d[5][6]), "+f"(d[5][7]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[6][4]), "+f"(d[6][5]), "+f"(d[6][6]), "+f"(d[6][7]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[7][4]), "+f"(d[7][5]), "+f"(d[7][6]), "+f"(d[7][7]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[8][4]), "+f"(d[8][5]), "+f"(d[8][6]), "+f"(d[8][7]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[9][4]), "+f"(d[9][5]), "+f"(d[9][6]), "+f"(d[9][7]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[10][4]), "+f"(d[10][5]), "+f"(d[10][6]), "+f"(d[10][7])
               : "l"(da), "l"(db), "r"(scale_d));
}
__device__ __forceinline__ void wg_rs_f16_128_t(float (&d)[8][8], const unsigned (&a)[4], unsigned long long db, int scale_d) {
  asm volatile("{ .reg .pred p; setp.ne.b32 p, %69, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 { %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63 }, { %64, %65, %66, %67 }, %68, p, 1, 1, 1; }\n"
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[0][4]), "+f"(d[0][5]), "+f"(d[0][6]), "+f"(d[0][7]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[1][4]), "+f"(d[1][5]), "+f"(d[1][6]), "+f"(d[1][7]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[2][4]), "+f"(d[2][5]), "+f"(d[2][6]), "+f"(d[2][7]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[3][4]), "+f"(d[3][5]), "+f"(d[3][6]), "+f"(d[3][7]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[4][4]), "+f"(d[4][5]), "+f"(d[4][6]), "+f"(d[4][7]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[5][4]), "+f"(d[5][5]), "+f"(d[5][6]), "+f"(d[5][7]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[6][4]), "+f"(d[6][5]), "+f"(d[6][6]), "+f"(d[6][7]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[7][4]), "+f"(d[7][5]), "+f"(d[7][6]), "+f"(d[7][7])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}

}  // namespace fj

// shared memory: 232400 bytes; q @0; k @32768; v @122880; o_stage @212992; barriers @231296 (+ alignment)
// registers: producer 24, consumers 240
// pieces: tma_ring.lua (producer), scheduler.cuh, mainloop_fwd.cuh, score_regs.cuh, softmax_regs.cuh, epilogue_regs.cuh, budget.lua

// From the accumulator table: each lane's base (row | col << 4); slot s adds
// (drow, dcol) = (0, 0) (0, 1) (8, 0) (8, 1) (0, 8) (0, 9) (8, 8) (8, 9); register 8j + s of
// a warp's slice sits 16j columns on.
__constant__ unsigned char fj_base_acc[32] = { 0, 32, 64, 96, 1, 33, 65, 97, 2, 34, 66, 98, 3, 35, 67, 99, 4, 36, 68, 100, 5, 37, 69, 101, 6, 38, 70, 102, 7, 39, 71, 103 };

namespace fj {
// A tensor map (CUtensorMap): 128 opaque bytes the host encodes.
struct __align__(64) TensorMap { unsigned long long opaque[16]; };
struct TensorMaps { TensorMap q, k, v; };

// Two floats as the A-operand register of two 16-bit elements (the first low).
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  const elem2_t e = to_elem2(lo, hi);
  return *reinterpret_cast<const unsigned *>(&e);
}

// The shared-space base, rounded up to 1024 bytes (the swizzle's period).
__device__ __forceinline__ unsigned smem_base(const void *p) {
  return (smem_opaque(p) + 1023u) & ~1023u;
}

}  // namespace fj

extern "C" __global__ void __launch_bounds__(384, 1)
fj_attn_d128_m128_n176_w12_s2_xor_regs_wgmma_nc_f16(const fj::Params p, const __grid_constant__ fj::TensorMaps maps) {
  using fj::elem_t;
  extern __shared__ __align__(1024) unsigned char smem[];
  const unsigned base = fj::smem_base(smem);
  const unsigned sq = base + 0, sk = base + 32768, sv = base + 122880;
  // Barriers (tma_ring.lua): Q's full and empty, then K's full and empty
  // and V's per ring slot.  The ring runs on across the work tiles a block
  // takes: K/V tile number `it` (counted over the block's life) lives in
  // slot it % S with phase parity (it / S) & 1.
  const unsigned bars = base + 231296;
  const unsigned q_full = bars, q_empty = bars + 8u;
#define FJ_K_FULL(i) (bars + 8u * (2u + (i)))
#define FJ_K_EMPTY(i) (bars + 8u * (4u + (i)))
#define FJ_V_FULL(i) (bars + 8u * (6u + (i)))
#define FJ_V_EMPTY(i) (bars + 8u * (8u + (i)))
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4;
  // A persistent grid (block.cuh's tile order): every warpgroup walks the
  // same tiles, so producer and consumers agree without talking.
  const int total = fj::pairs_total(p);
  int k = 0;  // work tiles this block has started
#define FJ_TILES for (int pair = blockIdx.x; pair < total; pair += gridDim.x)
#define FJ_BLOCK(blk) if (!fj::tile_of(p, pair, half, blk)) continue

  if (threadIdx.x == 0) {
    fj::mbar_init(q_full, 1);
    fj::mbar_init(q_empty, 8);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      fj::mbar_init(FJ_K_FULL(i), 1);
      fj::mbar_init(FJ_K_EMPTY(i), 8);
      fj::mbar_init(FJ_V_FULL(i), 1);
      fj::mbar_init(FJ_V_EMPTY(i), 8);
    }
    fj::mbar_init_fence();
  }
  __syncthreads();

  // Each warpgroup's role is one branch of this if/else, so that ptxas
  // applies setmaxnreg (it ignores it otherwise).
  if (wg == 0) {
    // ---- producer: one thread issues every load --------------------------
    fj::regs_down<24>();
    if (warp == 0 && lane == 0) {
      const void *mq = &maps.q, *mk = &maps.k, *mv = &maps.v;
      unsigned it = 0;
      FJ_TILES
#pragma unroll 1
      for (int half = 0; half < 2; ++half) {
        fj::Block blk;
        FJ_BLOCK(blk);
        const unsigned kq = (unsigned)k++;
        const int m0 = blk.m0;
        // Keys this block can see: all of them, or up to its last row's diagonal.
        const int n_end = p.seq_kv;
        const int t_first = 0 / 176;
        const int ntiles = n_end > t_first * 176 ? (n_end - t_first * 176 + 175) / 176 : 0;
        const int q_row = m0, q_b = blk.b, kv_row = 0, kv_b = blk.b;
        // Q's buffer is free once every consumer warp has finished its last
        // S of the previous work tile (at once for the first).
        fj::mbar_wait(q_empty, (kq & 1u) ^ 1u);
        fj::mbar_expect(q_full, 32768u);
#pragma unroll
        for (int pn = 0; pn < 2; ++pn)
          fj::tma_load4(sq + pn * 16384, mq, q_full, pn * 64, q_row, blk.h, q_b);
        for (int t = 0; t < ntiles; ++t, ++it) {
          const unsigned slot = it % 2u, ph = (it / 2u) & 1u;
          // A slot is free once every consumer warp has released it; in the
          // first round the "preceding phase" test passes at once.
          fj::mbar_wait(FJ_K_EMPTY(slot), ph ^ 1u);
          fj::mbar_expect(FJ_K_FULL(slot), 45056u);
#pragma unroll
          for (int pn = 0; pn < 2; ++pn)
            fj::tma_load4(sk + (slot) * 45056 + pn * 22528, mk, FJ_K_FULL(slot), pn * 64, kv_row + (t_first + t) * 176, blk.hk, kv_b);
          fj::mbar_wait(FJ_V_EMPTY(slot), ph ^ 1u);
          fj::mbar_expect(FJ_V_FULL(slot), 45056u);
#pragma unroll
          for (int pn = 0; pn < 2; ++pn)
            fj::tma_load4(sv + (slot) * 45056 + pn * 22528, mv, FJ_V_FULL(slot), pn * 64, kv_row + (t_first + t) * 176, blk.hk, kv_b);
        }
      }
    }
  } else {
  // ---- consumers ----------------------------------------------------------
  fj::regs_up<240>();
  // This consumer warpgroup, read from lane 0 so that the compiler knows
  // it is the same in every lane: its descriptors live in uniform registers.
  const int cw = __shfl_sync(0xffffffffu, wg - 1, 0);
  const int wr = cw * 64 + (warp % 4) * 16;    // this warp's first row in the tile
  const int acc_r = fj_base_acc[lane] & 15, acc_c = fj_base_acc[lane] >> 4;
  const float sl2 = p.scale_log2;
  const unsigned qa = sq + cw * 64 * 128;
  // Descriptors: Q's 64 rows of this warpgroup and K (both K-major, k
  // steps 32 bytes apart within a panel), V (MN-major, panels 22528
  // bytes apart) of a ring slot.
#define FJ_Q_DESC(kk) fj::wg_desc_at_lo(fj::wg_desc(qa, 16, 1024), ((kk) / 4) * 16384 + ((kk) % 4) * 32)
#define FJ_K_DESC(slot, kk) fj::wg_desc_at_lo(fj::wg_desc(sk, 16, 1024), (slot) * 45056 + ((kk) / 4) * 22528 + ((kk) % 4) * 32)
#define FJ_V_DESC(slot, kk) fj::wg_desc_at_lo(fj::wg_desc(sv, 22528, 1024), (slot) * 45056 + (kk) * 2048)
  // Ping-pong: the consumer warpgroups take turns to issue their products
  // (named barrier 1 + w is warpgroup w's turn), so one's softmax runs
  // while another's products occupy the tensor cores.  Warpgroup 0 starts.
  if (cw == 1) fj::bar_arrive(1, 256);

  float o[8][8];
  float s[11][8];
  unsigned pk[11][4];
  float row_m[1][2], row_l[1][2];
  unsigned it = 0;
  FJ_TILES
#pragma unroll 1
  for (int half = 0; half < 2; ++half) {
        fj::Block blk;
        FJ_BLOCK(blk);
        const unsigned kq = (unsigned)k++;
        const int m0 = blk.m0;
        // Keys this block can see: all of them, or up to its last row's diagonal.
        const int n_end = p.seq_kv;
        const int t_first = 0 / 176;
        const int ntiles = n_end > t_first * 176 ? (n_end - t_first * 176 + 175) / 176 : 0;
#pragma unroll
  for (int d = 0; d < 8; ++d)
#pragma unroll
    for (int i = 0; i < 8; ++i) o[d][i] = 0.f;
#pragma unroll
  for (int c = 0; c < 2; ++c) { row_m[0][c] = FJ_NEG_INF; row_l[0][c] = 0.f; }

  fj::mbar_wait(q_full, kq & 1u);
  if (ntiles == 0) {
    __syncwarp();
    if (lane == 0) fj::mbar_arrive(q_empty);
  } else {
    // Tile 0: S, the softmax, P.
    const int n0 = t_first * 176;
    const unsigned slot = it % 2u;
    fj::mbar_wait(FJ_K_FULL(slot), (it / 2u) & 1u);
    fj::bar_sync(1 + cw, 256);
    fj::wg_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) fj::wg_ss_f16_176(s, FJ_Q_DESC(kk), FJ_K_DESC(slot, kk), kk);
    fj::wg_commit();
    fj::bar_arrive(1 + (cw + 1) % 2, 256);
    fj::wg_wait<0>();
#pragma unroll
    for (int j = 0; j < 11; ++j)
#pragma unroll
      for (int i = 0; i < 8; ++i) fj::wg_hold(s[j][i]);
    __syncwarp();
    if (lane == 0) fj::mbar_arrive(FJ_K_EMPTY(slot));
    if (ntiles == 1) {
      __syncwarp();
      if (lane == 0) fj::mbar_arrive(q_empty);
    }
    const bool need_mask = n0 + 176 > p.seq_kv;
#pragma unroll
    for (int mi = 0; mi < 1; ++mi) {
      // Per row, the first column of this tile (counted from the lane's
      // first) that the row may not see: the sequence end, the diagonal or
      // the window's right side.
      const int lim1 = p.seq_kv - n0 - acc_c;
      const int lim2 = p.seq_kv - n0 - acc_c;
      if (need_mask) {
#pragma unroll
        for (int j = 0; j < 11; ++j) {
          if (j * 16 + 0 >= lim1) s[j][0] = FJ_NEG_INF;
          if (j * 16 + 1 >= lim1) s[j][1] = FJ_NEG_INF;
          if (j * 16 + 0 >= lim2) s[j][2] = FJ_NEG_INF;
          if (j * 16 + 1 >= lim2) s[j][3] = FJ_NEG_INF;
          if (j * 16 + 8 >= lim1) s[j][4] = FJ_NEG_INF;
          if (j * 16 + 9 >= lim1) s[j][5] = FJ_NEG_INF;
          if (j * 16 + 8 >= lim2) s[j][6] = FJ_NEG_INF;
          if (j * 16 + 9 >= lim2) s[j][7] = FJ_NEG_INF;
        }
      }
      float mu1, alpha1;
      float mu2, alpha2;
      bool rs = true;  // O needs the rescale
      // The row max as a balanced tree (depth 6), then across the lanes
      // that share the row (XOR 1, 2).
      float mx1 = fmaxf(fmaxf(fmaxf(fmaxf(fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[0][4], s[0][5])), fmaxf(fmaxf(s[1][0], s[1][1]), fmaxf(s[1][4], s[1][5]))), fmaxf(fmaxf(fmaxf(s[2][0], s[2][1]), fmaxf(s[2][4], s[2][5])), fmaxf(fmaxf(s[3][0], s[3][1]), fmaxf(s[3][4], s[3][5])))), fmaxf(fmaxf(fmaxf(fmaxf(s[4][0], s[4][1]), fmaxf(s[4][4], s[4][5])), fmaxf(fmaxf(s[5][0], s[5][1]), fmaxf(s[5][4], s[5][5]))), fmaxf(fmaxf(fmaxf(s[6][0], s[6][1]), fmaxf(s[6][4], s[6][5])), fmaxf(fmaxf(s[7][0], s[7][1]), fmaxf(s[7][4], s[7][5]))))), fmaxf(fmaxf(fmaxf(fmaxf(s[8][0], s[8][1]), fmaxf(s[8][4], s[8][5])), fmaxf(fmaxf(s[9][0], s[9][1]), fmaxf(s[9][4], s[9][5]))), fmaxf(fmaxf(s[10][0], s[10][1]), fmaxf(s[10][4], s[10][5]))));
      float mx2 = fmaxf(fmaxf(fmaxf(fmaxf(fmaxf(fmaxf(s[0][2], s[0][3]), fmaxf(s[0][6], s[0][7])), fmaxf(fmaxf(s[1][2], s[1][3]), fmaxf(s[1][6], s[1][7]))), fmaxf(fmaxf(fmaxf(s[2][2], s[2][3]), fmaxf(s[2][6], s[2][7])), fmaxf(fmaxf(s[3][2], s[3][3]), fmaxf(s[3][6], s[3][7])))), fmaxf(fmaxf(fmaxf(fmaxf(s[4][2], s[4][3]), fmaxf(s[4][6], s[4][7])), fmaxf(fmaxf(s[5][2], s[5][3]), fmaxf(s[5][6], s[5][7]))), fmaxf(fmaxf(fmaxf(s[6][2], s[6][3]), fmaxf(s[6][6], s[6][7])), fmaxf(fmaxf(s[7][2], s[7][3]), fmaxf(s[7][6], s[7][7]))))), fmaxf(fmaxf(fmaxf(fmaxf(s[8][2], s[8][3]), fmaxf(s[8][6], s[8][7])), fmaxf(fmaxf(s[9][2], s[9][3]), fmaxf(s[9][6], s[9][7]))), fmaxf(fmaxf(s[10][2], s[10][3]), fmaxf(s[10][6], s[10][7]))));
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
      for (int j = 0; j < 11; ++j) {
        s[j][0] = fj::fast_exp2(fmaf(s[j][0], sl2, -mu1));
        s[j][1] = fj::fast_exp2(fmaf(s[j][1], sl2, -mu1));
        s[j][2] = fj::fast_exp2(fmaf(s[j][2], sl2, -mu2));
        s[j][3] = fj::fast_exp2(fmaf(s[j][3], sl2, -mu2));
        s[j][4] = fj::fast_exp2(fmaf(s[j][4], sl2, -mu1));
        s[j][5] = fj::fast_exp2(fmaf(s[j][5], sl2, -mu1));
        s[j][6] = fj::fast_exp2(fmaf(s[j][6], sl2, -mu2));
        s[j][7] = fj::fast_exp2(fmaf(s[j][7], sl2, -mu2));
        sum1 += ((s[j][0] + s[j][1]) + (s[j][4] + s[j][5]));
        sum2 += ((s[j][2] + s[j][3]) + (s[j][6] + s[j][7]));
      }
      row_l[mi][0] = row_l[mi][0] * alpha1 + sum1;
      row_l[mi][1] = row_l[mi][1] * alpha2 + sum2;
      if (rs)
#pragma unroll
      for (int d = 0; d < 8; ++d) {
        o[d][0] *= alpha1;
        o[d][1] *= alpha1;
        o[d][2] *= alpha2;
        o[d][3] *= alpha2;
        o[d][4] *= alpha1;
        o[d][5] *= alpha1;
        o[d][6] *= alpha2;
        o[d][7] *= alpha2;
      }
    }

#pragma unroll
    for (int j = 0; j < 11; ++j) {
      pk[j][0] = fj::pack2(s[j][0], s[j][1]);
      pk[j][1] = fj::pack2(s[j][2], s[j][3]);
      pk[j][2] = fj::pack2(s[j][4], s[j][5]);
      pk[j][3] = fj::pack2(s[j][6], s[j][7]);
    }
  }
  for (int t = 1; t < ntiles; ++t) {
    const int n0 = (t_first + t) * 176;
    const unsigned cur = it + t, prev = cur - 1;
    const unsigned slot = cur % 2u, pslot = prev % 2u;
    // S(t) and O += P(t - 1) V(t - 1) in flight together; the softmax of
    // S(t) runs while the second finishes.
    fj::mbar_wait(FJ_K_FULL(slot), (cur / 2u) & 1u);
    fj::bar_sync(1 + cw, 256);
    fj::wg_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) fj::wg_ss_f16_176(s, FJ_Q_DESC(kk), FJ_K_DESC(slot, kk), kk);
    fj::wg_commit();
    fj::mbar_wait(FJ_V_FULL(pslot), (prev / 2u) & 1u);
    fj::wg_fence();
#pragma unroll
    for (int kk = 0; kk < 11; ++kk) fj::wg_rs_f16_128_t(o, pk[kk], FJ_V_DESC(pslot, kk), 1);
    fj::wg_commit();
    fj::bar_arrive(1 + (cw + 1) % 2, 256);
    fj::wg_wait<1>();
#pragma unroll
    for (int j = 0; j < 11; ++j)
#pragma unroll
      for (int i = 0; i < 8; ++i) fj::wg_hold(s[j][i]);
    __syncwarp();
    if (lane == 0) fj::mbar_arrive(FJ_K_EMPTY(slot));
    if (t == ntiles - 1) {
      __syncwarp();
      if (lane == 0) fj::mbar_arrive(q_empty);
    }
    float alpha[2];
    bool resc;
    const bool need_mask = n0 + 176 > p.seq_kv;
#pragma unroll
    for (int mi = 0; mi < 1; ++mi) {
      // Per row, the first column of this tile (counted from the lane's
      // first) that the row may not see: the sequence end, the diagonal or
      // the window's right side.
      const int lim1 = p.seq_kv - n0 - acc_c;
      const int lim2 = p.seq_kv - n0 - acc_c;
      if (need_mask) {
#pragma unroll
        for (int j = 0; j < 11; ++j) {
          if (j * 16 + 0 >= lim1) s[j][0] = FJ_NEG_INF;
          if (j * 16 + 1 >= lim1) s[j][1] = FJ_NEG_INF;
          if (j * 16 + 0 >= lim2) s[j][2] = FJ_NEG_INF;
          if (j * 16 + 1 >= lim2) s[j][3] = FJ_NEG_INF;
          if (j * 16 + 8 >= lim1) s[j][4] = FJ_NEG_INF;
          if (j * 16 + 9 >= lim1) s[j][5] = FJ_NEG_INF;
          if (j * 16 + 8 >= lim2) s[j][6] = FJ_NEG_INF;
          if (j * 16 + 9 >= lim2) s[j][7] = FJ_NEG_INF;
        }
      }
      float mu1;
      float mu2;
      bool rs = true;  // O needs the rescale
      // The row max as a balanced tree (depth 6), then across the lanes
      // that share the row (XOR 1, 2).
      float mx1 = fmaxf(fmaxf(fmaxf(fmaxf(fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[0][4], s[0][5])), fmaxf(fmaxf(s[1][0], s[1][1]), fmaxf(s[1][4], s[1][5]))), fmaxf(fmaxf(fmaxf(s[2][0], s[2][1]), fmaxf(s[2][4], s[2][5])), fmaxf(fmaxf(s[3][0], s[3][1]), fmaxf(s[3][4], s[3][5])))), fmaxf(fmaxf(fmaxf(fmaxf(s[4][0], s[4][1]), fmaxf(s[4][4], s[4][5])), fmaxf(fmaxf(s[5][0], s[5][1]), fmaxf(s[5][4], s[5][5]))), fmaxf(fmaxf(fmaxf(s[6][0], s[6][1]), fmaxf(s[6][4], s[6][5])), fmaxf(fmaxf(s[7][0], s[7][1]), fmaxf(s[7][4], s[7][5]))))), fmaxf(fmaxf(fmaxf(fmaxf(s[8][0], s[8][1]), fmaxf(s[8][4], s[8][5])), fmaxf(fmaxf(s[9][0], s[9][1]), fmaxf(s[9][4], s[9][5]))), fmaxf(fmaxf(s[10][0], s[10][1]), fmaxf(s[10][4], s[10][5]))));
      float mx2 = fmaxf(fmaxf(fmaxf(fmaxf(fmaxf(fmaxf(s[0][2], s[0][3]), fmaxf(s[0][6], s[0][7])), fmaxf(fmaxf(s[1][2], s[1][3]), fmaxf(s[1][6], s[1][7]))), fmaxf(fmaxf(fmaxf(s[2][2], s[2][3]), fmaxf(s[2][6], s[2][7])), fmaxf(fmaxf(s[3][2], s[3][3]), fmaxf(s[3][6], s[3][7])))), fmaxf(fmaxf(fmaxf(fmaxf(s[4][2], s[4][3]), fmaxf(s[4][6], s[4][7])), fmaxf(fmaxf(s[5][2], s[5][3]), fmaxf(s[5][6], s[5][7]))), fmaxf(fmaxf(fmaxf(s[6][2], s[6][3]), fmaxf(s[6][6], s[6][7])), fmaxf(fmaxf(s[7][2], s[7][3]), fmaxf(s[7][6], s[7][7]))))), fmaxf(fmaxf(fmaxf(fmaxf(s[8][2], s[8][3]), fmaxf(s[8][6], s[8][7])), fmaxf(fmaxf(s[9][2], s[9][3]), fmaxf(s[9][6], s[9][7]))), fmaxf(fmaxf(s[10][2], s[10][3]), fmaxf(s[10][6], s[10][7]))));
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
      alpha[0] = fj::fast_exp2(row_m[mi][0] * sl2 - mu1);
      row_m[mi][0] = mk1;
      const float mk2 = rs ? mn2 : row_m[mi][1];
      // A row that has seen only hidden keys keeps max -inf; subtracting 0
      // instead keeps exp2 at 0 rather than NaN.
      mu2 = mk2 == FJ_NEG_INF ? 0.f : mk2 * sl2;
      alpha[1] = fj::fast_exp2(row_m[mi][1] * sl2 - mu2);
      row_m[mi][1] = mk2;
      resc = rs;
      float sum1 = 0.f;
      float sum2 = 0.f;
#pragma unroll
      for (int j = 0; j < 11; ++j) {
        s[j][0] = fj::fast_exp2(fmaf(s[j][0], sl2, -mu1));
        s[j][1] = fj::fast_exp2(fmaf(s[j][1], sl2, -mu1));
        s[j][2] = fj::fast_exp2(fmaf(s[j][2], sl2, -mu2));
        s[j][3] = fj::fast_exp2(fmaf(s[j][3], sl2, -mu2));
        s[j][4] = fj::fast_exp2(fmaf(s[j][4], sl2, -mu1));
        s[j][5] = fj::fast_exp2(fmaf(s[j][5], sl2, -mu1));
        s[j][6] = fj::fast_exp2(fmaf(s[j][6], sl2, -mu2));
        s[j][7] = fj::fast_exp2(fmaf(s[j][7], sl2, -mu2));
        sum1 += ((s[j][0] + s[j][1]) + (s[j][4] + s[j][5]));
        sum2 += ((s[j][2] + s[j][3]) + (s[j][6] + s[j][7]));
      }
      row_l[mi][0] = row_l[mi][0] * alpha[0] + sum1;
      row_l[mi][1] = row_l[mi][1] * alpha[1] + sum2;
    }

    // O += P(t - 1) V(t - 1) waited for after the softmax, not before its
    // exponentials (wgmma.cuh's wg_wait0_split).
    fj::wg_wait0_split((unsigned)t);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int i = 0; i < 8; ++i) fj::wg_hold(o[j][i]);
    __syncwarp();
    if (lane == 0) fj::mbar_arrive(FJ_V_EMPTY(pslot));
    // Not under the softcap's fixed shift (softmax_regs.cuh's `rescaled`).
    if (resc)
#pragma unroll
    for (int d = 0; d < 8; ++d) {
      o[d][0] *= alpha[0];
      o[d][1] *= alpha[0];
      o[d][2] *= alpha[1];
      o[d][3] *= alpha[1];
      o[d][4] *= alpha[0];
      o[d][5] *= alpha[0];
      o[d][6] *= alpha[1];
      o[d][7] *= alpha[1];
    }
#pragma unroll
    for (int j = 0; j < 11; ++j) {
      pk[j][0] = fj::pack2(s[j][0], s[j][1]);
      pk[j][1] = fj::pack2(s[j][2], s[j][3]);
      pk[j][2] = fj::pack2(s[j][4], s[j][5]);
      pk[j][3] = fj::pack2(s[j][6], s[j][7]);
    }
  }
  if (ntiles > 0) {
    // The last tile's O += P V.
    const unsigned last = it + ntiles - 1, lslot = last % 2u;
    fj::mbar_wait(FJ_V_FULL(lslot), (last / 2u) & 1u);
    fj::bar_sync(1 + cw, 256);
    fj::wg_fence();
#pragma unroll
    for (int kk = 0; kk < 11; ++kk) fj::wg_rs_f16_128_t(o, pk[kk], FJ_V_DESC(lslot, kk), 1);
    fj::wg_commit();
    fj::bar_arrive(1 + (cw + 1) % 2, 256);
    fj::wg_wait<0>();
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int i = 0; i < 8; ++i) fj::wg_hold(o[j][i]);
    __syncwarp();
    if (lane == 0) fj::mbar_arrive(FJ_V_EMPTY(lslot));
  }
  it += ntiles;


  // O = O / l and the log-sum-exp (epilogue_regs.cuh); FP8 attention's
  // max |O| where p.o_amax asks, and an e4m3 O's scale.
  elem_t *o_out = fj::head_rows<elem_t>(p.o, p.o_stride, blk.b, blk.h);
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
    // Through shared memory, a panel of 64 columns at a time (see the top).
    {
      const unsigned st_lane = (base + 212992u + (cw * 4 + warp % 4) * 2288u) + acc_r * 144u + acc_c * 2u;
      const unsigned ld_lane = (base + 212992u + (cw * 4 + warp % 4) * 2288u) + (lane / 8) * 144u + (lane % 8) * 16u;
#pragma unroll
      for (int pn = 0; pn < 2; ++pn) {
#pragma unroll
        for (int dd = 0; dd < 4; ++dd) {
          const int d = pn * 4 + dd;
          {
            const unsigned at = st_lane + dd * 32u + 0u;
            const fj::elem2_t e = fj::to_elem2(o[d][0] * inv1,
                                               o[d][1] * inv1);
            fj::st_shared_b32(at, *reinterpret_cast<const unsigned *>(&e));
          }
          {
            const unsigned at = st_lane + dd * 32u + 1152u;
            const fj::elem2_t e = fj::to_elem2(o[d][2] * inv2,
                                               o[d][3] * inv2);
            fj::st_shared_b32(at, *reinterpret_cast<const unsigned *>(&e));
          }
          {
            const unsigned at = st_lane + dd * 32u + 16u;
            const fj::elem2_t e = fj::to_elem2(o[d][4] * inv1,
                                               o[d][5] * inv1);
            fj::st_shared_b32(at, *reinterpret_cast<const unsigned *>(&e));
          }
          {
            const unsigned at = st_lane + dd * 32u + 1168u;
            const fj::elem2_t e = fj::to_elem2(o[d][6] * inv2,
                                               o[d][7] * inv2);
            fj::st_shared_b32(at, *reinterpret_cast<const unsigned *>(&e));
          }
        }
        __syncwarp();
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int row = m0 + wr + i * 4 + lane / 8;
          const uint4 v = fj::ld_shared_v4(ld_lane + i * 576u);
          if (row < p.seq_q)
            *reinterpret_cast<uint4 *>(o_out + (long long)row * p.o_stride[2] + pn * 64 + (lane % 8) * 8) = v;
        }
        __syncwarp();  // read before the next panel is written
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
  }
#undef FJ_Q_DESC
#undef FJ_K_DESC
#undef FJ_V_DESC
#undef FJ_TILES
#undef FJ_BLOCK
#undef FJ_K_FULL
#undef FJ_K_EMPTY
#undef FJ_V_FULL
#undef FJ_V_EMPTY
}
