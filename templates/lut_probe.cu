{#
  lut_probe.cu: the introspection kernels behind the fragment-layout table.
  One kernel per fragment kind, launched with one warp, writing into
  out[513]: what the tile or the lanes hold, and out[512] = num_elements.

  Accumulator: every lane fills each slot with the tag lane * 32 + slot and
  stores the fragment row-major; out[row * 16 + col] is the tag that landed
  there.

  Operands: a tile in shared memory holds row * 16 + col at element (row,
  col) of the logical matrix (A: m x k, B: k x n), laid out row- or
  column-major as the fragment expects; after load_matrix_sync every lane
  writes its slots: out[lane * 16 + slot] is the (row, col) it holds.
  All tags are integers below 1024, exact in float, half and bf16.

  mma.sync (sm_80 and newer), through mma_frag.cuh -- the very loads and
  instruction the mma family runs:
    operands: the tile holds row * 16 + col of the logical matrix (A: m x k,
      B: k x n; K-style B stored n-major, V-style k-major); after ldmatrix
      out[lane * 16 + slot] is the (row, col) the slot holds;
    accumulators: A and B loaded the same way, A[m][0] = m, A[m][1] = 1,
      B[0][n] = 16, B[1][n] = n and zeros elsewhere, so each slot of
      D = A . B holds 16 m + n: out[lane * 16 + slot] is its (row, col).
      Then two products of small integers (fj_probe_a, fj_probe_b below; the
      host has the same formulas) through K-style and V-style B:
      out[513 + lane * 8 + slot] and out[769 + lane * 8 + slot], which the
      host checks against the table, element by element.
#}
{% meta.symbol = "fj_probe_wmma_acc_f32"; meta.threads = 32; meta.smem_bytes = 0; meta.rows_per_block = 0 %}
// flashjit fragment-layout probe for {{ arch }}; rendered by flashjit {{ version }}
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>
using namespace nvcuda;

extern "C" __global__ void fj_probe_wmma_acc_f32(float *out) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> f;
  for (int i = 0; i < f.num_elements; ++i) f.x[i] = (float)(threadIdx.x * 32 + i);
  wmma::store_matrix_sync(out, f, 16, wmma::mem_row_major);
  if (threadIdx.x == 0) out[512] = (float)f.num_elements;
}
{%
  local operands = {
    { "a_f16_row", "matrix_a", "__half", "row_major", "__float2half", "__half2float" },
    { "b_f16_col", "matrix_b", "__half", "col_major", "__float2half", "__half2float" },
    { "b_f16_row", "matrix_b", "__half", "row_major", "__float2half", "__half2float" },
    { "a_bf16_row", "matrix_a", "__nv_bfloat16", "row_major", "__float2bfloat16", "__bfloat162float" },
    { "b_bf16_col", "matrix_b", "__nv_bfloat16", "col_major", "__float2bfloat16", "__bfloat162float" },
    { "b_bf16_row", "matrix_b", "__nv_bfloat16", "row_major", "__float2bfloat16", "__bfloat162float" },
  }
%}
{% for _, o in ipairs(operands) do %}
{%   local name, use, ty, order, to, from = unpack(o) %}
{%   if ty == "__half" or sm >= 80 then  -- bf16 fragments need sm_80 %}

extern "C" __global__ void fj_probe_wmma_{{ name }}(float *out) {
  __shared__ __align__(32) {{ ty }} tile[256];
  // Element (row, col) of the logical 16x16 matrix holds row * 16 + col.
  for (int e = threadIdx.x; e < 256; e += 32) {
    const int row = e / 16, col = e % 16;
    tile[{{ order == "row_major" and "row * 16 + col" or "col * 16 + row" }}] = {{ to }}((float)e);
  }
  __syncwarp();
  wmma::fragment<wmma::{{ use }}, 16, 16, 16, {{ ty }}, wmma::{{ order }}> f;
  wmma::load_matrix_sync(f, tile, 16);
  for (int i = 0; i < f.num_elements; ++i) out[threadIdx.x * 16 + i] = {{ from }}(f.x[i]);
  if (threadIdx.x == 0) out[512] = (float)f.num_elements;
}
{%   end %}
{% end %}
{% if sm >= 80 then %}

{{ include("mma_frag.cuh") }}

// The check products' inputs; src/layout.c has the same formulas.
__device__ __forceinline__ float fj_probe_a(int m, int k) { return (float)((m * 7 + k * 3) % 11 - 5); }
__device__ __forceinline__ float fj_probe_b(int k, int n) { return (float)((k * 5 + n * 13) % 9 - 4); }

// Writes the 8 slots of r[4] (two 16-bit elements each, the lower first).
__device__ __forceinline__ void fj_probe_put(float *out, const unsigned r[4]) {
  for (int i = 0; i < 4; ++i) {
    const __half *e = reinterpret_cast<const __half *>(&r[i]);
    out[threadIdx.x * 16 + 2 * i] = __half2float(e[0]);
    out[threadIdx.x * 16 + 2 * i + 1] = __half2float(e[1]);
  }
  if (threadIdx.x == 0) out[512] = 8.f;
}

{%
  -- The operand probes: the tag each stored element holds (B stored
  -- n-major holds logical (k, n) at stored (n, k)), and the load the
  -- kernels use for that operand.
  local operand_probes = {
    { "a", "e", "ldsm_x4", "rm" },
    { "b_col", "(e % 16) * 16 + e / 16", "ldsm_x4", "nm" },
    { "b_row", "e", "ldsm_x4_t", "rm" },
  }
%}
{%   for _, o in ipairs(operand_probes) do %}
{%     local name, tag, load, lanes = unpack(o) %}

extern "C" __global__ void fj_probe_mma_{{ name }}(float *out) {
  __shared__ __align__(16) __half tile[256];
  for (int e = threadIdx.x; e < 256; e += 32) tile[e] = __float2half((float)({{ tag }}));
  __syncwarp();
  unsigned r[4];
  fj::{{ load }}(r, fj::smem_addr(tile + fj::ldm_row_{{ lanes }}(threadIdx.x) * 16 + fj::ldm_col_{{ lanes }}(threadIdx.x)));
  fj_probe_put(out, r);
}
{%   end %}
{%   for _, t in ipairs({ { "f16", "__half", "__float2half" }, { "bf16", "__nv_bfloat16", "__float2bfloat16" } }) do %}
{%     local name, ty, to = t[1], t[2], t[3] %}

extern "C" __global__ void fj_probe_mma_acc_{{ name }}(float *out) {
  __shared__ __align__(16) {{ ty }} a[256], bk[256], bv[256];
  const int lane = threadIdx.x;
  unsigned ra[4], rb[4];
  for (int round = 0; round < 3; ++round) {
    // Round 0 the encoding product, rounds 1-2 the checks (K-, V-style B).
    for (int e = lane; e < 256; e += 32) {
      const int r = e / 16, c = e % 16;
      a[e] = {{ to }}(round ? fj_probe_a(r, c) : c == 0 ? (float)r : c == 1 ? 1.f : 0.f);
      // bk stored (n, k) = (r, c); bv stored (k, n) = (r, c).
      bk[e] = {{ to }}(round ? fj_probe_b(c, r) : c == 0 ? 16.f : c == 1 ? (float)r : 0.f);
      bv[e] = {{ to }}(round ? fj_probe_b(r, c) : r == 0 ? 16.f : r == 1 ? (float)c : 0.f);
    }
    __syncwarp();
    fj::ldsm_x4(ra, fj::smem_addr(a + fj::ldm_row_rm(lane) * 16 + fj::ldm_col_rm(lane)));
    if (round < 2) fj::ldsm_x4(rb, fj::smem_addr(bk + fj::ldm_row_nm(lane) * 16 + fj::ldm_col_nm(lane)));
    else fj::ldsm_x4_t(rb, fj::smem_addr(bv + fj::ldm_row_rm(lane) * 16 + fj::ldm_col_rm(lane)));
    float c[8] = { 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f };
    fj::mma_tile_{{ name }}(c, ra, rb);
    for (int s = 0; s < 8; ++s) {
      if (round == 0) out[lane * 16 + s] = c[s];
      else out[513 + (round - 1) * 256 + lane * 8 + s] = c[s];
    }
    __syncwarp();
  }
  if (lane == 0) out[512] = 8.f;
}
{%   end %}
{% end %}
