{#
  bwd_post.cu: the backward's last kernel.  One warp a query row (4 rows a
  block): dQ = scale * the float32 accumulator the main kernel added into,
  written in the inputs' dtype at dQ's strides.  Rows past a sequence's end
  (varlen) are no rows: nothing is written.
  Parameters: head_dim, dtype, varlen.
#}
{%
  local D = head_dim
  local WARPS = 4
  local PER = (D + 31) // 32
  local GUARD = D % 32 == 0 and "true" or ("lane + 32 * i < %d"):format(D)
  meta.symbol = symbol
  meta.threads = 32 * WARPS
  meta.smem_bytes = 0
  meta.rows_per_block = WARPS
%}
{{ include("common.cuh") }}
{{ include("block.cuh", { BM = 64, BN = 64 }) }}
{{ include("bwd_common.cuh") }}

extern "C" __global__ void __launch_bounds__({{ 32 * WARPS }})
{{ symbol }}(const fj::Params p, const fj::BwdParams g) {
  using fj::elem_t;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const long long f = (long long)blockIdx.x * {{ WARPS }} + warp;  // (b * heads_q + h) * seq_q + row
  if (f >= (long long)p.batch * p.heads_q * p.seq_q) return;
  const int row = (int)(f % p.seq_q);
  const long long bh = f / p.seq_q;
  const int h = (int)(bh % p.heads_q), b = (int)(bh / p.heads_q);
{% if varlen then %}
  const fj::Seq seq = fj::seq_of(p, b);
  if (row >= seq.len_q) return;
  const long long r = seq.q_row0 + row;
{% else %}
  const long long r = row;
{% end %}
  elem_t *dq = fj::head_rows<elem_t>(g.dq, g.dq_stride, b, h) + r * g.dq_stride[2];
  const float *acc = g.dq_acc + f * {{ D }};
#pragma unroll
  for (int i = 0; i < {{ PER }}; ++i)
    if ({{ GUARD }}) dq[lane + 32 * i] = fj::to_elem(acc[lane + 32 * i] * g.scale);
}
