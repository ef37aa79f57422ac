{#
  attention_wmma.cu: the WMMA attention family.

  softmax = "smem" is the seeds' Stage-2 flow.  Per key tile the block runs
  three phases separated by barriers, every intermediate in shared memory:
    A  S = Q K^T       16x16 WMMA tiles spread over the warps, S stored as float
    B  online softmax  one warp per row: running max m and sum l, P = exp2(S - m)
                       stored in the element type, O's row rescaled by
                       exp2(m_old - m_new)
    C  O += P V        16x16 WMMA output tiles, accumulators loaded from and
                       stored back to O in shared memory
  and at the end O / l is written out (zeros where l = 0: no visible key).
#}
{%
  local D, BM, BN, W = head_dim, tile_m, tile_n, warps
  local THREADS = 32 * W
  if D % 16 ~= 0 then refuse(("head_dim %d: the WMMA family needs a multiple of 16"):format(D)) end
  if BM % 16 ~= 0 or BN % 16 ~= 0 then
    refuse(("tile_m %d / tile_n %d: the WMMA family needs multiples of 16"):format(BM, BN))
  end
  if softmax ~= "smem" then refuse(("softmax %s is not implemented in the WMMA family yet"):format(softmax)) end
  if stages ~= 1 then refuse(("stages %d is not implemented in the WMMA family yet (1 is)"):format(stages)) end
  if swizzle == "xor" then refuse("swizzle xor is not implemented in the WMMA family yet (none, pad are)") end

  -- Row strides (in elements) of the shared-memory tiles.  "pad" adds 16
  -- bytes to each row so that consecutive rows start in different banks.
  local pad = swizzle == "pad"
  local LDQ = D + (pad and 8 or 0)     -- Q, K, V rows: elem_t
  local LDS = BN + (pad and 4 or 0)    -- S rows: float
  local LDP = BN + (pad and 8 or 0)    -- P rows: elem_t
  local LDO = D + (pad and 4 or 0)     -- O rows: float

  -- Shared-memory plan: each region 128-byte aligned (WMMA wants 32).
  local plan, offset = {}, 0
  local function region(name, bytes)
    plan[#plan + 1] = { name = name, offset = offset, bytes = bytes }
    offset = offset + (bytes + 127) // 128 * 128
  end
  region("q", BM * LDQ * 2)
  region("k", BN * LDQ * 2)
  region("v", BN * LDQ * 2)
  region("s", BM * LDS * 4)
  region("p", BM * LDP * 2)
  region("o", BM * LDO * 4)
  region("m", BM * 4)
  region("l", BM * 4)
  meta.symbol = symbol
  meta.threads = THREADS
  meta.smem_bytes = offset
  meta.rows_per_block = BM
  local CHUNKS = D // 8   -- 16-byte chunks per row
  local causal_mask = causal ~= "none"
%}
{{ include("common.cuh") }}
// shared memory: {{ offset }} bytes{% for _, r in ipairs(plan) do %}; {{ r.name }} @{{ r.offset }}{% end %}

namespace fj {

// Copies rows [row0, row0 + ROWS) of one head into a shared tile with row
// stride LD; rows at or past `rows` are zero-filled (sequence tails).
template <int ROWS, int LD>
__device__ __forceinline__ void load_tile(elem_t *dst, const elem_t *src, long long stride,
                                          int row0, int rows) {
  for (int i = threadIdx.x; i < ROWS * {{ CHUNKS }}; i += {{ THREADS }}) {
    int r = i / {{ CHUNKS }}, c = i % {{ CHUNKS }};
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (row0 + r < rows) val = *reinterpret_cast<const uint4 *>(src + (long long)(row0 + r) * stride + c * 8);
    *reinterpret_cast<uint4 *>(dst + r * LD + c * 8) = val;
  }
}

}  // namespace fj

extern "C" __global__ void __launch_bounds__({{ THREADS }})
{{ symbol }}(const fj::Params p) {
  using namespace nvcuda;
  using fj::elem_t;
  extern __shared__ __align__(128) unsigned char smem[];
{% for _, r in ipairs(plan) do %}
{%   local ty = (r.name == "s" or r.name == "o" or r.name == "m" or r.name == "l") and "float" or "elem_t" %}
  {{ ty }} *const s_{{ r.name }} = reinterpret_cast<{{ ty }} *>(smem + {{ r.offset }});
{% end %}

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Heaviest causal blocks (the last rows) first.
  const int m0 = (gridDim.x - 1 - blockIdx.x) * {{ BM }};
  const int h = blockIdx.y, b = blockIdx.z, hk = h / p.group;
  const elem_t *q = static_cast<const elem_t *>(p.q) + b * p.q_stride[0] + h * p.q_stride[1];
  const elem_t *k = static_cast<const elem_t *>(p.k) + b * p.k_stride[0] + hk * p.k_stride[1];
  const elem_t *v = static_cast<const elem_t *>(p.v) + b * p.v_stride[0] + hk * p.v_stride[1];

  fj::load_tile<{{ BM }}, {{ LDQ }}>(s_q, q, p.q_stride[2], m0, p.seq_q);
  for (int i = threadIdx.x; i < {{ BM * LDO }}; i += {{ THREADS }}) s_o[i] = 0.f;
  for (int i = threadIdx.x; i < {{ BM }}; i += {{ THREADS }}) { s_m[i] = FJ_NEG_INF; s_l[i] = 0.f; }

  // Keys this block can see: all of them, or up to its last row's diagonal.
  int n_end = p.seq_kv;
{% if causal_mask then %}
  n_end = min(n_end, min(m0 + {{ BM }}, p.seq_q) - 1 + p.causal_offset + 1);
{% end %}
  for (int n0 = 0; n0 < n_end; n0 += {{ BN }}) {
    __syncthreads();  // the previous tile's phase C is done with K, V, P
    fj::load_tile<{{ BN }}, {{ LDQ }}>(s_k, k, p.k_stride[2], n0, p.seq_kv);
    fj::load_tile<{{ BN }}, {{ LDQ }}>(s_v, v, p.v_stride[2], n0, p.seq_kv);
    __syncthreads();

    // Phase A: S = Q K^T.
    for (int t = warp; t < {{ (BM // 16) * (BN // 16) }}; t += {{ W }}) {
      const int i = t / {{ BN // 16 }}, j = t % {{ BN // 16 }};
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.f);
#pragma unroll
      for (int kk = 0; kk < {{ D // 16 }}; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, elem_t, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, elem_t, wmma::col_major> bt;
        wmma::load_matrix_sync(a, s_q + i * 16 * {{ LDQ }} + kk * 16, {{ LDQ }});
        wmma::load_matrix_sync(bt, s_k + j * 16 * {{ LDQ }} + kk * 16, {{ LDQ }});
        wmma::mma_sync(acc, a, bt, acc);
      }
      wmma::store_matrix_sync(s_s + i * 16 * {{ LDS }} + j * 16, acc, {{ LDS }}, wmma::mem_row_major);
    }
    __syncthreads();

    // Phase B: online softmax, one warp per row.
    for (int r = warp; r < {{ BM }}; r += {{ W }}) {
      const int row = m0 + r;
      float x[{{ (BN + 31) // 32 }}];
      float mx = FJ_NEG_INF;
#pragma unroll
      for (int t = 0; t < {{ (BN + 31) // 32 }}; ++t) {
        const int c = lane + 32 * t, j = n0 + c;
        float s = FJ_NEG_INF;
        if (c < {{ BN }} && j < p.seq_kv{% if causal_mask then %} && j <= row + p.causal_offset{% end %})
          s = s_s[r * {{ LDS }} + c] * p.scale_log2;
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
      for (int t = 0; t < {{ (BN + 31) // 32 }}; ++t) {
        const int c = lane + 32 * t;
        const float e = fj::fast_exp2(x[t] - m_use);
        if (c < {{ BN }}) s_p[r * {{ LDP }} + c] = fj::to_elem(e);
        sum += e;
      }
      sum = fj::warp_sum(sum);
      const float alpha = fj::fast_exp2(m_old - m_use);
      for (int d = lane; d < {{ D }}; d += 32) s_o[r * {{ LDO }} + d] *= alpha;
      __syncwarp();
      if (lane == 0) { s_m[r] = m_new; s_l[r] = s_l[r] * alpha + sum; }
    }
    __syncthreads();

    // Phase C: O += P V.
    for (int t = warp; t < {{ (BM // 16) * (D // 16) }}; t += {{ W }}) {
      const int i = t / {{ D // 16 }}, d = t % {{ D // 16 }};
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, s_o + i * 16 * {{ LDO }} + d * 16, {{ LDO }}, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < {{ BN // 16 }}; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, elem_t, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, elem_t, wmma::row_major> bv;
        wmma::load_matrix_sync(a, s_p + i * 16 * {{ LDP }} + kk * 16, {{ LDP }});
        wmma::load_matrix_sync(bv, s_v + kk * 16 * {{ LDQ }} + d * 16, {{ LDQ }});
        wmma::mma_sync(acc, a, bv, acc);
      }
      wmma::store_matrix_sync(s_o + i * 16 * {{ LDO }} + d * 16, acc, {{ LDO }}, wmma::mem_row_major);
    }
  }
  __syncthreads();

  // O = O / l, 16 bytes per store; log-sum-exp in natural log.
  elem_t *o = static_cast<elem_t *>(p.o) + b * p.o_stride[0] + h * p.o_stride[1];
  for (int i = threadIdx.x; i < {{ BM * CHUNKS }}; i += {{ THREADS }}) {
    const int r = i / {{ CHUNKS }}, c = i % {{ CHUNKS }};
    if (m0 + r >= p.seq_q) continue;
    const float l = s_l[r], inv = l > 0.f ? 1.f / l : 0.f;
    __align__(16) elem_t out[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) out[e] = fj::to_elem(s_o[r * {{ LDO }} + c * 8 + e] * inv);
    *reinterpret_cast<uint4 *>(o + (long long)(m0 + r) * p.o_stride[2] + c * 8) =
        *reinterpret_cast<const uint4 *>(out);
  }
  if (p.lse) {
    for (int r = threadIdx.x; r < {{ BM }}; r += {{ THREADS }}) {
      if (m0 + r >= p.seq_q) continue;
      const float l = s_l[r];
      p.lse[((long long)b * p.heads_q + h) * p.seq_q + m0 + r] =
          l > 0.f ? (s_m[r] + __log2f(l)) * 0.69314718056f : FJ_NEG_INF;
    }
  }
}
