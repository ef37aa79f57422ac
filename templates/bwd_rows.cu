{#
  bwd_rows.cu: the backward's kernels over query rows, one warp a row (4
  rows a block), which = "pre" or "post":
    pre   before the main kernel: delta = rowsum(dO o O) in float32 (less
          dlse, the loss's gradient at the LSE, where g.dlse is given), the
          row's LSE * log2(e) (LSE2; +inf where the row saw no key), the
          row's dQ accumulator cleared (the main kernel adds into it), and
          the first row of each 64 clears its dQ tiles' turns (the
          deterministic mode's).  Rows past a sequence's end (varlen) get
          delta 0 and LSE2 +inf, as do the padding rows up to g.seq_pad.
    post  after it: dQ = scale * the accumulator, in the inputs' dtype at
          dQ's strides; rows past a sequence's end are not written.  The
          accumulator is read row by row, or in tiles (tiled: the wgmma
          backward's layout, bwd_common.cuh's dq_tile_off; tiled 2: the
          wide kernel's, dq_tile_off4).  The
          preprocess's clearing covers either: AW floats (the head dim
          rounded up to 64, the tiles' width) at f * AW.  With
          attention sinks, block h (< heads_q) also writes the sink's
          gradient: the sink enters only each row's denominator, so
            d sink[h] = -sum over rows of exp(sink[h] - lse) * delta,
          summed in one fixed order (bit-identical run to run), into
          g.dsinks[h] when it is not NULL.
  Parameters: head_dim, dtype, sinks, varlen, which, tiled (0, 1, 2).
#}
{%
  local D = head_dim
  local WARPS = 4
  local PER = (D + 31) // 32
  local AW = (D + 63) // 64 * 64
  local GUARD = D % 32 == 0 and "true" or ("lane + 32 * i < %d"):format(D)
  meta.symbol = symbol
  meta.threads = 32 * WARPS
  meta.smem_bytes = 0
  meta.rows_per_block = WARPS
%}
{{ include("common.cuh") }}
{{ include("block.cuh", { BM = 64, BN = 64 }) }}
{{ include("bwd_common.cuh") }}

{% if which == "post" and sinks then %}
namespace fj {
// The sink's gradient of query head h over every row of every batch, in
// one order: each thread's rows in turn, then the warps' sums in turn.
__device__ __forceinline__ void sink_grad(const Params &p, const BwdParams &g, int h) {
  __shared__ float part[{{ WARPS }}];
  float sum = 0.f;
  for (long long t = threadIdx.x; t < (long long)p.batch * g.seq_pad; t += {{ 32 * WARPS }}) {
    const int b = (int)(t / g.seq_pad), row = (int)(t % g.seq_pad);
{%   if varlen then %}
    if (row >= seq_of(p, b).len_q) continue;
{%   else %}
    if (row >= p.seq_q) continue;
{%   end %}
    const long long bh = (long long)b * p.heads_q + h;
    const float lse = g.lse[bh * p.seq_q + row], delta = g.delta[bh * g.seq_pad + row];
    if (lse > FJ_NEG_INF && delta != 0.f) sum -= __expf(p.sinks[h] - lse) * delta;
  }
  sum = warp_sum(sum);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float all = 0.f;
    for (int w = 0; w < {{ WARPS }}; ++w) all += part[w];
    g.dsinks[h] = all;
  }
}
}  // namespace fj

{% end %}
extern "C" __global__ void __launch_bounds__({{ 32 * WARPS }})
{{ symbol }}(const fj::Params p, const fj::BwdParams g) {
  using fj::elem_t;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Padded rows: f = (b * heads_q + h) * seq_pad + row.
  const long long f = (long long)blockIdx.x * {{ WARPS }} + warp;
  if (f >= (long long)p.batch * p.heads_q * g.seq_pad) return;
  const int row = (int)(f % g.seq_pad);
  const long long bh = f / g.seq_pad;
  const int h = (int)(bh % p.heads_q), b = (int)(bh / p.heads_q);
  (void)h;
{% if varlen then %}
  const fj::Seq seq = fj::seq_of(p, b);
  const bool live = row < seq.len_q;
  const long long r = seq.q_row0 + row;
{% else %}
  const bool live = row < p.seq_q;
  const long long r = row;
{% end %}
{% if which == "post" and sinks then %}
  if (blockIdx.x < p.heads_q && g.dsinks) sink_grad(p, g, blockIdx.x);
{% end %}
{% if which == "pre" then %}
  const elem_t *o = fj::head_rows<const elem_t>(p.o, p.o_stride, b, h) + r * p.o_stride[2];
  const elem_t *dout = fj::head_rows<const elem_t>(g.dout, g.do_stride, b, h) + r * g.do_stride[2];
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < {{ PER }}; ++i)
    if (live && {{ GUARD }}) sum += fj::from_elem(o[lane + 32 * i]) * fj::from_elem(dout[lane + 32 * i]);
  sum = fj::warp_sum(sum);
  float *const acc = g.dq_acc + f * {{ AW }};
#pragma unroll
  for (int i = 0; i < {{ AW // 32 }}; ++i) acc[lane + 32 * i] = 0.f;
  if (lane == 0) {
    const float lse = live ? g.lse[bh * p.seq_q + row] : FJ_NEG_INF;
    // A loss that uses the LSE too: dS = P (dP - delta + dlse).  A row that
    // saw no key (P = 0) keeps delta 0, whatever dlse (or dO) holds there:
    // 0 (dP - NaN) would be NaN.
    g.delta[f] = live && lse != FJ_NEG_INF
                     ? (g.dlse ? sum - g.dlse[bh * p.seq_q + row] : sum) : 0.f;
    // exp2(s - LSE2) is 0 where no key was seen (and on padding rows).
    g.lse2[f] = lse == FJ_NEG_INF ? __int_as_float(0x7f800000) : lse * 1.44269504089f;
  }
  if ((row & 63) == 0 && lane < {{ (D + 63) // 64 }})
    g.dq_turns[fj::dq_tile_base(bh, row, 0, g.seq_pad, {{ D }}) / 4096 + lane] = 0;
{% else %}
  if (!live) return;
  elem_t *dq = fj::head_rows<elem_t>(g.dq, g.dq_stride, b, h) + r * g.dq_stride[2];
{%   if tiled > 0 then %}
  // The accumulator in tiles (bwd_common.cuh's dq_tile_off: the wgmma
  // backward's layout).
#pragma unroll
  for (int i = 0; i < {{ PER }}; ++i) {
    const int c = lane + 32 * i;
    if ({{ GUARD }})
      dq[c] = fj::to_elem(g.dq_acc[fj::dq_tile_base(bh, row & ~63, c & ~63, g.seq_pad, {{ D }}) + fj::dq_tile_off{{ tiled == 2 and "4" or "" }}(row, c & 63)] * g.scale);
  }
{%   else %}
  const float *const acc = g.dq_acc + f * {{ D }};
#pragma unroll
  for (int i = 0; i < {{ PER }}; ++i)
    if ({{ GUARD }}) dq[lane + 32 * i] = fj::to_elem(acc[lane + 32 * i] * g.scale);
{%   end %}
{% end %}
}
