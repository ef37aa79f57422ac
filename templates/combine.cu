{#
  combine.cu: the second kernel of split-KV.  The attention kernel's p.splits
  blocks of a row tile wrote each row's O / l over their key range and its
  natural-log sum-exp as float32 partials ([split][batch][heads_q][seq_q],
  then head_dim floats a row).  Here p.combine_warps warps (1, 2 or 4, by
  the plan from the split count) merge one row, 4 / p.combine_warps rows a
  block.  A block takes cols of its rows' columns (the host's
  fj__combine_cols): head_dim, the whole row (one slice, blockIdx.y
  unused), or where the row blocks are fewer than the multiprocessors
  and O is wider, 128: slice blockIdx.y, so that a wide O (MLA's 512
  columns) spreads over more blocks than rows / 4.  Warp w of a row
  takes splits w, w + warps, ... :
    lse = log(sum_s exp(lse_s))        (max first: no overflow)
    O   = sum_s exp(lse_s - lse) O_s   each warp its splits in order, then
                                       the warps' sums in warp order,
  the same order every run (the warps per row depend on the split count
  alone; each slice's block finds the row's lse and weights alike, and a
  column's sum does not depend on the slice that holds it), and writes
  its columns of O in the output's dtype and strides, and the LSE if
  asked (slice 0).  A range that saw no key (lse_s = -inf) adds nothing;
  a row no range saw gets O = 0 and LSE -inf, as the one-kernel path
  gives.  For varlen problems (varlen) a row past its sequence's end is
  no row: skipped, and O's rows start at the sequence's first.  With
  attention sinks (sinks), the row's head's sink joins here, once (the
  partials leave it out):
    lse = log(exp(sink[h]) + sum_s exp(lse_s)),
  so that the weights exp(lse_s - lse) sum to less than 1; a row no range
  saw gets O = 0 and LSE = the sink.  On sm_90 and newer the kernel is
  launched to start early (programmatic dependent launch) and waits for
  the attention kernel's writes before its first read.
  Parameters: head_dim, cols, dtype, varlen, sinks, sm, symbol.
#}
{%
  local D, C = head_dim, cols
  if C < 1 or C > D then
    error(("combine.cu: cols %d is not in 1..head_dim %d"):format(C, D))
  end
  local PER = (C + 31) // 32
  local WARPS = 4
  -- Sliced: columns c0 + lane + 32 i of the slice that starts at c0, and
  -- the LSE written by slice 0; one slice: columns lane + 32 i, the code
  -- the same as before slices were (no c0).
  local SLICED = C < D
  -- A warp's splits whose partials are loaded at once: 8, or 32 where the
  -- combine is sliced -- there the row blocks are fewer than the
  -- multiprocessors (plan.c's fj__combine_cols), so the loads in flight
  -- set the pace: MLA's single decode over 32k keys, 128 splits of 16
  -- rows x 512 floats (4 MB), took 23.7-23.9 us a call with 8 and
  -- 20.9-21.1 with 32 on an H100 (bench/probes/s39b.sh).  The sums' order
  -- is the same either way.
  local UNROLL = SLICED and 32 or 8
  local C0 = SLICED and "c0 + " or ""
  local LSE_LANE = SLICED and "lane == 0 && blockIdx.y == 0" or "lane == 0"
  -- Guarded where the slice is not a multiple of 32 wide, or the last one
  -- ends past head_dim.
  local guards = {}
  if C % 32 ~= 0 then guards[#guards + 1] = ("lane + 32 * i < %d"):format(C) end
  if D % C ~= 0 then guards[#guards + 1] = ("c0 + lane + 32 * i < %d"):format(D) end
  local GUARD = #guards > 0 and table.concat(guards, " && ") or "true"
  meta.symbol = symbol
  meta.threads = 32 * WARPS
  meta.smem_bytes = 0
  meta.rows_per_block = WARPS
%}
{{ include("common.cuh") }}

// A warp loads the partial rows of {{ UNROLL }} of its splits at once, with
// their log-sum-exps, before it needs their weights: the first ones while
// the row's log-sum-exp is still being found.
extern "C" __global__ void __launch_bounds__({{ 32 * WARPS }})
{{ symbol }}(const fj::Params p) {
{% if sm >= 90 then %}
  // Launched early: the partials are whole only once the attention kernel
  // has ended.
  asm volatile("griddepcontrol.wait;" ::: "memory");
{% end %}
  const int wpr = p.combine_warps, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int part = warp % wpr;
  const long long rows = (long long)p.batch * p.heads_q * p.seq_q;
  const long long f = (long long)blockIdx.x * ({{ WARPS }} / wpr) + warp / wpr;
  // Warps past the last row still reach the block's barrier.
  bool live = f < rows;
  // f = (b * heads_q + h) * seq_q + row.
  const int row = live ? (int)(f % p.seq_q) : 0;
  const long long bh = live ? f / p.seq_q : 0;
  const int h = (int)(bh % p.heads_q), b = (int)(bh / p.heads_q);
{% if varlen then %}
  const fj::Seq seq = fj::seq_of(p, b);
  live = live && row < seq.len_q;
  const long long row0 = seq.q_row0;
{% else %}
  const long long row0 = 0;
{% end %}
  const float *lse_s = p.lse_part + f;
{% if SLICED then %}
  const int c0 = blockIdx.y * {{ C }};  // the slice's first column
{% end %}
  const float *src = p.o_part + f * {{ D }} + {{ C0 }}lane;
  const long long step = rows * {{ D }};
  const int mine = live ? (p.splits - part + wpr - 1) / wpr : 0;
  float x[{{ UNROLL }}][{{ PER }}], l[{{ UNROLL }}];
  // Splits part + wpr k for k in k0 .. k0 + {{ UNROLL - 1 }}: 0 and -inf
  // past this warp's last.
  auto load = [&](int k0) {
#pragma unroll
    for (int u = 0; u < {{ UNROLL }}; ++u) {
      const bool in = k0 + u < mine;
      const long long s = part + (long long)wpr * (k0 + u);
      l[u] = in ? lse_s[s * rows] : FJ_NEG_INF;
#pragma unroll
      for (int i = 0; i < {{ PER }}; ++i)
        x[u][i] = in && {{ GUARD }} ? src[s * step + 32 * i] : 0.f;
    }
  };
  load(0);

  float mx = FJ_NEG_INF;
  if (live)
    for (int s = lane; s < p.splits; s += 32) mx = fmaxf(mx, lse_s[(long long)s * rows]);
  mx = fj::warp_max(mx);
{% if sinks then %}
  // The sink takes part in the max (no overflow) and adds its own term
  // (0 for a -inf sink; a NaN sink makes the row NaN).
  const float sink = live ? p.sinks[h] : 0.f, mk = mx;
  mx = fmaxf(mx, sink);
{% end %}
  float sum = 0.f;
  if (live && mx != FJ_NEG_INF)
    for (int s = lane; s < p.splits; s += 32) sum += expf(lse_s[(long long)s * rows] - mx);
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
  for (int k0 = 0; k0 < mine; k0 += {{ UNROLL }}) {
    if (k0 > 0) load(k0);
#pragma unroll
    for (int u = 0; u < {{ UNROLL }}; ++u) {
      // 0 for a range that saw no key (its partial is 0, never NaN).
      const float w = l[u] == FJ_NEG_INF ? 0.f : expf(l[u] - lse);
#pragma unroll
      for (int i = 0; i < {{ PER }}; ++i) acc[i] = fmaf(w, x[u][i], acc[i]);
    }
  }
  if (wpr > 1) {  // the same for the whole block
    __shared__ float part_sum[{{ WARPS }}][{{ 32 * PER }}];
#pragma unroll
    for (int i = 0; i < {{ PER }}; ++i) part_sum[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    for (int w = 1; part == 0 && w < wpr; ++w)
#pragma unroll
      for (int i = 0; i < {{ PER }}; ++i) acc[i] += part_sum[warp + w][lane + 32 * i];
  }
  if (!live || part != 0) return;

  fj::elem_t *dst = static_cast<fj::elem_t *>(p.o) + b * p.o_stride[0] + h * p.o_stride[1] + (row0 + row) * p.o_stride[2];
#pragma unroll
  for (int i = 0; i < {{ PER }}; ++i)
    if ({{ GUARD }}) dst[{{ C0 }}lane + 32 * i] = fj::to_elem(acc[i]);
  if (p.lse && {{ LSE_LANE }}) p.lse[f] = lse;
}
