{#
  combine.cu: the second kernel of split-KV.  The attention kernel's p.splits
  blocks of a row tile wrote each row's O / l over their key range and its
  natural-log sum-exp as float32 partials ([split][batch][heads_q][seq_q],
  then head_dim floats a row).  Here one warp merges one row:
    lse = log(sum_s exp(lse_s))        (max first: no overflow)
    O   = sum_s exp(lse_s - lse) O_s   in split order, the same every run,
  and writes O in the output's dtype and strides, and the LSE if asked.  A
  range that saw no key (lse_s = -inf) adds nothing; a row no range saw
  gets O = 0 and LSE -inf, as the one-kernel path gives.  For varlen
  problems (varlen) a row past its sequence's end is no row: skipped, and
  O's rows start at the sequence's first.  With attention sinks (sinks),
  the row's head's sink joins here, once (the partials leave it out):
    lse = log(exp(sink[h]) + sum_s exp(lse_s)),
  so that the weights exp(lse_s - lse) sum to less than 1; a row no range
  saw gets O = 0 and LSE = the sink.
  Parameters: head_dim, dtype, varlen, sinks, symbol.
#}
{%
  local D = head_dim
  local PER = (D + 31) // 32
  local ROWS = 4  -- warps, one row each
  local UNROLL = 8  -- splits whose partials are loaded at once
  -- Columns lane + 32 i; guarded where head_dim is not a multiple of 32.
  local GUARD = D % 32 == 0 and "true" or ("lane + 32 * i < %d"):format(D)
  meta.symbol = symbol
  meta.threads = 32 * ROWS
  meta.smem_bytes = 0
  meta.rows_per_block = ROWS
%}
{{ include("common.cuh") }}

// Lanes hold the partial log-sum-exp of splits s = lane + 32 j; the weights
// reach every lane by shuffles, so the loads of O_s never wait on another
// load and run {{ UNROLL }} splits ahead.
extern "C" __global__ void __launch_bounds__({{ 32 * ROWS }})
{{ symbol }}(const fj::Params p) {
  const long long rows = (long long)p.batch * p.heads_q * p.seq_q;
  const long long f = (long long)blockIdx.x * {{ ROWS }} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (f >= rows) return;
  // f = (b * heads_q + h) * seq_q + row.
  const int row = (int)(f % p.seq_q);
  const long long bh = f / p.seq_q;
  const int h = (int)(bh % p.heads_q), b = (int)(bh / p.heads_q);
{% if varlen then %}
  const fj::Seq seq = fj::seq_of(p, b);
  if (row >= seq.len_q) return;
  const long long row0 = seq.q_row0;
{% else %}
  const long long row0 = 0;
{% end %}
  const float *lse_s = p.lse_part + f;
  float mx = FJ_NEG_INF;
  for (int s = lane; s < p.splits; s += 32) mx = fmaxf(mx, lse_s[s * rows]);
  mx = fj::warp_max(mx);
{% if sinks then %}
  // The sink takes part in the max (no overflow) and adds its own term
  // (0 for a -inf sink; a NaN sink makes the row NaN).
  const float sink = p.sinks[h], mk = mx;
  mx = fmaxf(mx, sink);
{% end %}
  float sum = 0.f;
  if (mx != FJ_NEG_INF)
    for (int s = lane; s < p.splits; s += 32) sum += expf(lse_s[s * rows] - mx);
  sum = fj::warp_sum(sum);
{% if sinks then %}
  sum += sink >= mk ? (sink == FJ_NEG_INF ? 0.f : 1.f) : expf(sink - mx);
  const float lse = !(sum <= 0.f) ? mx + logf(sum) : FJ_NEG_INF;
{% else %}
  const float lse = sum > 0.f ? mx + logf(sum) : FJ_NEG_INF;
{% end %}

  float acc[{{ PER }}];
#pragma unroll
  for (int i = 0; i < {{ PER }}; ++i) acc[i] = 0.f;
  const float *src = p.o_part + f * {{ D }} + lane;
  const long long step = rows * {{ D }};
  for (int s0 = 0; s0 < p.splits; s0 += 32) {
    // This lane's split's weight; 0 for a range that saw no key (its
    // partial is 0, never NaN) and for lanes past the last split.
    const float ls = s0 + lane < p.splits ? lse_s[(s0 + lane) * rows] : FJ_NEG_INF;
    const float w_lane = ls == FJ_NEG_INF ? 0.f : expf(ls - lse);
    const int n = min(32, p.splits - s0);
    int j = 0;
    for (; j + {{ UNROLL }} <= n; j += {{ UNROLL }}) {
      float x[{{ UNROLL }}][{{ PER }}];
#pragma unroll
      for (int u = 0; u < {{ UNROLL }}; ++u)
#pragma unroll
        for (int i = 0; i < {{ PER }}; ++i)
          x[u][i] = {{ GUARD }} ? src[(s0 + j + u) * step + 32 * i] : 0.f;
#pragma unroll
      for (int u = 0; u < {{ UNROLL }}; ++u) {
        const float w = __shfl_sync(0xffffffffu, w_lane, j + u);
#pragma unroll
        for (int i = 0; i < {{ PER }}; ++i) acc[i] = fmaf(w, x[u][i], acc[i]);
      }
    }
    for (; j < n; ++j) {
      const float w = __shfl_sync(0xffffffffu, w_lane, j);
#pragma unroll
      for (int i = 0; i < {{ PER }}; ++i)
        if ({{ GUARD }}) acc[i] = fmaf(w, src[(s0 + j) * step + 32 * i], acc[i]);
    }
  }

  fj::elem_t *dst = static_cast<fj::elem_t *>(p.o) + b * p.o_stride[0] + h * p.o_stride[1] + (row0 + row) * p.o_stride[2];
#pragma unroll
  for (int i = 0; i < {{ PER }}; ++i)
    if ({{ GUARD }}) dst[lane + 32 * i] = fj::to_elem(acc[i]);
  if (p.lse && lane == 0) p.lse[f] = lse;
}
