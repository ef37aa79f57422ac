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
{% end %}
