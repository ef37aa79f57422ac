// flashjit generated kernel: fj_attn_d64_m64_n64_w4_s1_pad_smem_wmma_nc_f16
// variant: head_dim=64 tile_m=64 tile_n=64 warps=4 stages=1 swizzle=pad softmax=smem mma=wmma causal=none dtype=f16 kv_dtype=f16
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
};
static_assert(sizeof(Params) == 184, "host and device disagree on the parameter block");

typedef __half elem_t;
__device__ __forceinline__ elem_t to_elem(float x) { return __float2half_rn(x); }
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

// 2^x through the SFU; exp2(-inf) is 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace fj

// shared memory: 72192 bytes; q @0; k @9216; v @18432; s @27648; p @45056; o @54272; m @71680; l @71936

namespace fj {

// Copies rows [row0, row0 + ROWS) of one head into a shared tile with row
// stride LD; rows at or past `rows` are zero-filled (sequence tails).
template <int ROWS, int LD>
__device__ __forceinline__ void load_tile(elem_t *dst, const elem_t *src, long long stride,
                                          int row0, int rows) {
  for (int i = threadIdx.x; i < ROWS * 8; i += 128) {
    int r = i / 8, c = i % 8;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (row0 + r < rows) val = *reinterpret_cast<const uint4 *>(src + (long long)(row0 + r) * stride + c * 8);
    *reinterpret_cast<uint4 *>(dst + r * LD + c * 8) = val;
  }
}

}  // namespace fj

extern "C" __global__ void __launch_bounds__(128)
fj_attn_d64_m64_n64_w4_s1_pad_smem_wmma_nc_f16(const fj::Params p) {
  using namespace nvcuda;
  using fj::elem_t;
  extern __shared__ __align__(128) unsigned char smem[];
  elem_t *const s_q = reinterpret_cast<elem_t *>(smem + 0);
  elem_t *const s_k = reinterpret_cast<elem_t *>(smem + 9216);
  elem_t *const s_v = reinterpret_cast<elem_t *>(smem + 18432);
  float *const s_s = reinterpret_cast<float *>(smem + 27648);
  elem_t *const s_p = reinterpret_cast<elem_t *>(smem + 45056);
  float *const s_o = reinterpret_cast<float *>(smem + 54272);
  float *const s_m = reinterpret_cast<float *>(smem + 71680);
  float *const s_l = reinterpret_cast<float *>(smem + 71936);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Heaviest causal blocks (the last rows) first.
  const int m0 = (gridDim.x - 1 - blockIdx.x) * 64;
  const int h = blockIdx.y, b = blockIdx.z, hk = h / p.group;
  const elem_t *q = static_cast<const elem_t *>(p.q) + b * p.q_stride[0] + h * p.q_stride[1];
  const elem_t *k = static_cast<const elem_t *>(p.k) + b * p.k_stride[0] + hk * p.k_stride[1];
  const elem_t *v = static_cast<const elem_t *>(p.v) + b * p.v_stride[0] + hk * p.v_stride[1];

  fj::load_tile<64, 72>(s_q, q, p.q_stride[2], m0, p.seq_q);
  for (int i = threadIdx.x; i < 4352; i += 128) s_o[i] = 0.f;
  for (int i = threadIdx.x; i < 64; i += 128) { s_m[i] = FJ_NEG_INF; s_l[i] = 0.f; }

  // Keys this block can see: all of them, or up to its last row's diagonal.
  int n_end = p.seq_kv;
  for (int n0 = 0; n0 < n_end; n0 += 64) {
    __syncthreads();  // the previous tile's phase C is done with K, V, P
    fj::load_tile<64, 72>(s_k, k, p.k_stride[2], n0, p.seq_kv);
    fj::load_tile<64, 72>(s_v, v, p.v_stride[2], n0, p.seq_kv);
    __syncthreads();

    // Phase A: S = Q K^T.
    for (int t = warp; t < 16; t += 4) {
      const int i = t / 4, j = t % 4;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.f);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, elem_t, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, elem_t, wmma::col_major> bt;
        wmma::load_matrix_sync(a, s_q + i * 16 * 72 + kk * 16, 72);
        wmma::load_matrix_sync(bt, s_k + j * 16 * 72 + kk * 16, 72);
        wmma::mma_sync(acc, a, bt, acc);
      }
      wmma::store_matrix_sync(s_s + i * 16 * 68 + j * 16, acc, 68, wmma::mem_row_major);
    }
    __syncthreads();

    // Phase B: online softmax, one warp per row.
    for (int r = warp; r < 64; r += 4) {
      const int row = m0 + r;
      float x[2];
      float mx = FJ_NEG_INF;
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        const int c = lane + 32 * t, j = n0 + c;
        float s = FJ_NEG_INF;
        if (c < 64 && j < p.seq_kv)
          s = s_s[r * 68 + c] * p.scale_log2;
        x[t] = s;
        mx = fmaxf(mx, s);
      }
      mx = fj::warp_max(mx);
      const float m_old = s_m[r], m_new = fmaxf(m_old, mx);
      // While a row has seen only masked keys its max is -inf; subtracting 0
      // instead keeps exp2 at 0 rather than NaN.
      const float m_use = m_new == FJ_NEG_INF ? 0.f : m_new;
      float sum = 0.f;
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        const int c = lane + 32 * t;
        const float e = fj::fast_exp2(x[t] - m_use);
        if (c < 64) s_p[r * 72 + c] = fj::to_elem(e);
        sum += e;
      }
      sum = fj::warp_sum(sum);
      const float alpha = fj::fast_exp2(m_old - m_use);
      for (int d = lane; d < 64; d += 32) s_o[r * 68 + d] *= alpha;
      __syncwarp();
      if (lane == 0) { s_m[r] = m_new; s_l[r] = s_l[r] * alpha + sum; }
    }
    __syncthreads();

    // Phase C: O += P V.
    for (int t = warp; t < 16; t += 4) {
      const int i = t / 4, d = t % 4;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, s_o + i * 16 * 68 + d * 16, 68, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, elem_t, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, elem_t, wmma::row_major> bv;
        wmma::load_matrix_sync(a, s_p + i * 16 * 72 + kk * 16, 72);
        wmma::load_matrix_sync(bv, s_v + kk * 16 * 72 + d * 16, 72);
        wmma::mma_sync(acc, a, bv, acc);
      }
      wmma::store_matrix_sync(s_o + i * 16 * 68 + d * 16, acc, 68, wmma::mem_row_major);
    }
  }
  __syncthreads();

  // O = O / l, 16 bytes per store; log-sum-exp in natural log.
  elem_t *o = static_cast<elem_t *>(p.o) + b * p.o_stride[0] + h * p.o_stride[1];
  for (int i = threadIdx.x; i < 512; i += 128) {
    const int r = i / 8, c = i % 8;
    if (m0 + r >= p.seq_q) continue;
    const float l = s_l[r], inv = l > 0.f ? 1.f / l : 0.f;
    __align__(16) elem_t out[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) out[e] = fj::to_elem(s_o[r * 68 + c * 8 + e] * inv);
    *reinterpret_cast<uint4 *>(o + (long long)(m0 + r) * p.o_stride[2] + c * 8) =
        *reinterpret_cast<const uint4 *>(out);
  }
  if (p.lse) {
    for (int r = threadIdx.x; r < 64; r += 128) {
      if (m0 + r >= p.seq_q) continue;
      const float l = s_l[r];
      p.lse[((long long)b * p.heads_q + h) * p.seq_q + m0 + r] =
          l > 0.f ? (s_m[r] + __log2f(l)) * 0.69314718056f : FJ_NEG_INF;
    }
  }
}
