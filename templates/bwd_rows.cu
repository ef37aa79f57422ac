{#
  bwd_rows.cu: the backward's kernels over query rows: `rows` rows a block
  of `warps` warps (the host's BWD_ROWS and BWD_ROW_WARPS), each warp
  rows / warps of them, its loads for all of them issued before their sums
  or stores, a row's elements over the warp's lanes; which = "pre" or
  "post".  A lane reads 4 consecutive
  elements at once (8 bytes of O, dO and dQ, 16 of the accumulator) where
  the tensors' addresses and strides allow it (checked once a block: 8-byte
  aligned, strides multiples of 4 elements), else one at a time:
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
  Where g.pg_words is given (the parameters' gradients in the
  deterministic mode), the preprocess clears those words and the
  postprocess adds each element's value (bwd_common.cuh's pgrad_value) to
  its gradient, the launch's threads taking the elements in turn.
  Parameters: head_dim, dtype, sinks, varlen, which, tiled (0, 1, 2),
  rows (a divisor of 64: a block's rows share their (batch, head)), warps
  (dividing rows).
#}
{%
  local D = head_dim
  local WARPS = warps
  local RW = rows // WARPS               -- rows a warp
  local PER = (D + 31) // 32             -- elements a lane a row, one at a time
  local AW = (D + 63) // 64 * 64
  local GUARD = D % 32 == 0 and "true" or ("lane + 32 * i < %d"):format(D)
  -- Vectors of 4: a row's D / 4 of them over the warp's lanes, NV a lane
  -- (the last one guarded where D / 4 is not a multiple of 32); the
  -- accumulator's AW / 4 to clear.
  local NV = (D // 4 + 31) // 32
  local VGUARD = (D // 4) % 32 == 0 and "true" or ("lane + 32 * i < %d"):format(D // 4)
  local NZ = (AW // 4 + 31) // 32
  local ZGUARD = (AW // 4) % 32 == 0 and "true" or ("lane + 32 * i < %d"):format(AW // 4)
  if rows % WARPS ~= 0 or 64 % rows ~= 0 then
    refuse(("rows %d over warps %d: the row kernels take a divisor of 64 rows a block, a multiple of its warps"):format(rows, WARPS))
  end
  if D % 4 ~= 0 or (tiled == 2 and D % 16 ~= 0) then
    refuse(("head_dim %d: the row kernels take multiples of 4 (16 from the wide kernel's tiles)"):format(D))
  end
  if dtype ~= "f16" and dtype ~= "bf16" then
    refuse(("dtype %s: the row kernels take f16 and bf16 (their vectors are 4 elements of 2 bytes)"):format(dtype))
  end
  meta.symbol = symbol
  meta.threads = 32 * WARPS
  meta.smem_bytes = 0
  meta.rows_per_block = rows
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
namespace fj {
// A row of the kernel's: f = (b * heads_q + h) * seq_pad + row over the
// padded rows (in: f is one of them), and where its queries lie (r: the
// row of Q, O, dO and dQ; live: a query of the sequence).
struct RowAt {
  long long f, bh, r;
  int b, h, row;
  bool in, live;
};
// Row i of block `block`'s {{ rows }} (rows in the same (batch, head): seq_pad is a
// multiple of 64, which {{ rows }} divides), its (batch, head) and sequence found
// once a block.
struct BlockRows {
  RowAt first;
  int len_q;
};
__device__ __forceinline__ BlockRows block_rows(const Params &p, const BwdParams &g, long long block) {
  BlockRows br;
  RowAt &a = br.first;
  a.f = block * {{ rows }};
  a.in = a.f < (long long)p.batch * p.heads_q * g.seq_pad;
  a.row = (int)(a.f % g.seq_pad);
  a.bh = a.f / g.seq_pad;
  a.h = (int)(a.bh % p.heads_q);
  a.b = (int)(a.bh / p.heads_q);
{% if varlen then %}
  const Seq seq = seq_of(p, a.in ? a.b : 0);
  br.len_q = seq.len_q;
  a.r = seq.q_row0 + a.row;
{% else %}
  br.len_q = p.seq_q;
  a.r = a.row;
{% end %}
  a.live = false;
  return br;
}
__device__ __forceinline__ RowAt row_at(const BlockRows &br, int i) {
  RowAt a = br.first;
  a.f += i;
  a.row += i;
  a.r += i;
  a.live = a.in && a.row < br.len_q;
  return a;
}
// Whether a tensor (its base and strides, elements) takes 4-element
// vectors: 8-byte aligned, every stride a multiple of 4.
__device__ __forceinline__ bool vec4_ok(const void *base, const long long *stride) {
  return ((reinterpret_cast<unsigned long long>(base) & 7ull) |
          (unsigned long long)((stride[0] | stride[1] | stride[2]) & 3)) == 0;
}
// 4 elements at x (8-byte aligned) as floats; 4 floats stored there.
__device__ __forceinline__ void load4(const elem_t *x, float (&v)[4]) {
  const uint2 u = *reinterpret_cast<const uint2 *>(x);
  const elem2_t lo = *reinterpret_cast<const elem2_t *>(&u.x), hi = *reinterpret_cast<const elem2_t *>(&u.y);
  v[0] = __low2float(lo);
  v[1] = __high2float(lo);
  v[2] = __low2float(hi);
  v[3] = __high2float(hi);
}
__device__ __forceinline__ void store4(elem_t *x, float a, float b, float c, float d) {
  const elem2_t lo = to_elem2(a, b), hi = to_elem2(c, d);
  *reinterpret_cast<uint2 *>(x) = make_uint2(*reinterpret_cast<const unsigned *>(&lo),
                                             *reinterpret_cast<const unsigned *>(&hi));
}
}  // namespace fj

namespace fj {
// The deterministic mode's parameter gradients (BwdParams.pg_words): the
// words cleared before the main kernel, their values added to the
// gradients after it.
__device__ __forceinline__ void pgrad_words(const BwdParams &g) {
  const long long n = g.pg_end[7];
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n;
       e += (long long)gridDim.x * blockDim.x) {
{% if which == "pre" then %}
    reinterpret_cast<longlong2 *>(g.pg_words)[e] = make_longlong2(0, 0);
{% else %}
    // The parameter whose elements hold e (static indices: no copy of g).
    float *out = g.pg_out[0];
    long long base = 0;
#pragma unroll
    for (int j = 0; j < 7; ++j)
      if (e >= g.pg_end[j]) { out = g.pg_out[j + 1]; base = g.pg_end[j]; }
    out += e - base;
    *out = (float)((double)*out + pgrad_value(g.pg_words + 2 * e));
{% end %}
  }
}
}  // namespace fj

extern "C" __global__ void __launch_bounds__({{ 32 * WARPS }})
{{ symbol }}(const fj::Params p, const fj::BwdParams g) {
  using fj::elem_t;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
{% if which == "post" and sinks then %}
  if (blockIdx.x < p.heads_q && g.dsinks) sink_grad(p, g, blockIdx.x);
{% end %}
  // This warp's rows: {{ RW }} of the block's {{ rows }}, {{ WARPS }} apart.
  const fj::BlockRows br = fj::block_rows(p, g, blockIdx.x);
  fj::RowAt at[{{ RW }}];
#pragma unroll
  for (int k = 0; k < {{ RW }}; ++k) at[k] = fj::row_at(br, warp + {{ WARPS }} * k);
{% if which == "pre" then %}
  float sum[{{ RW }}];
  if (fj::vec4_ok(p.o, p.o_stride) && fj::vec4_ok(g.dout, g.do_stride)) {
    // Every row's O and dO loaded before any is summed.
    float x[{{ RW }}][{{ NV }}][4], y[{{ RW }}][{{ NV }}][4];
#pragma unroll
    for (int k = 0; k < {{ RW }}; ++k) {
      const elem_t *o = fj::head_rows<const elem_t>(p.o, p.o_stride, at[k].b, at[k].h) + at[k].r * p.o_stride[2];
      const elem_t *dout = fj::head_rows<const elem_t>(g.dout, g.do_stride, at[k].b, at[k].h) + at[k].r * g.do_stride[2];
#pragma unroll
      for (int i = 0; i < {{ NV }}; ++i) {
        if (at[k].live && {{ VGUARD }}) {
          fj::load4(o + 4 * (lane + 32 * i), x[k][i]);
          fj::load4(dout + 4 * (lane + 32 * i), y[k][i]);
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e) x[k][i][e] = y[k][i][e] = 0.f;
        }
      }
    }
#pragma unroll
    for (int k = 0; k < {{ RW }}; ++k) {
      sum[k] = 0.f;
#pragma unroll
      for (int i = 0; i < {{ NV }}; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) sum[k] += x[k][i][e] * y[k][i][e];
    }
  } else {
#pragma unroll
    for (int k = 0; k < {{ RW }}; ++k) {
      const elem_t *o = fj::head_rows<const elem_t>(p.o, p.o_stride, at[k].b, at[k].h) + at[k].r * p.o_stride[2];
      const elem_t *dout = fj::head_rows<const elem_t>(g.dout, g.do_stride, at[k].b, at[k].h) + at[k].r * g.do_stride[2];
      sum[k] = 0.f;
#pragma unroll
      for (int i = 0; i < {{ PER }}; ++i)
        if (at[k].live && {{ GUARD }}) sum[k] += fj::from_elem(o[lane + 32 * i]) * fj::from_elem(dout[lane + 32 * i]);
    }
  }
#pragma unroll
  for (int k = 0; k < {{ RW }}; ++k) {
    if (!at[k].in) continue;  // the same for the whole warp
    const float total = fj::warp_sum(sum[k]);
    const long long f = at[k].f, bh = at[k].bh;
    const int row = at[k].row;
    float4 *const acc = reinterpret_cast<float4 *>(g.dq_acc + f * {{ AW }});
#pragma unroll
    for (int i = 0; i < {{ NZ }}; ++i)
      if ({{ ZGUARD }}) acc[lane + 32 * i] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (lane == 0) {
      const float lse = at[k].live ? g.lse[bh * p.seq_q + row] : FJ_NEG_INF;
      // A loss that uses the LSE too: dS = P (dP - delta + dlse).  A row that
      // saw no key (P = 0) keeps delta 0, whatever dlse (or dO) holds there:
      // 0 (dP - NaN) would be NaN.
      g.delta[f] = at[k].live && lse != FJ_NEG_INF
                       ? (g.dlse ? total - g.dlse[bh * p.seq_q + row] : total) : 0.f;
      // exp2(s - LSE2) is 0 where no key was seen (and on padding rows).
      g.lse2[f] = lse == FJ_NEG_INF ? __int_as_float(0x7f800000) : lse * 1.44269504089f;
    }
    if ((row & 63) == 0 && lane < {{ (D + 63) // 64 }})
      g.dq_turns[fj::dq_tile_base(bh, row, 0, g.seq_pad, {{ D }}) / 4096 + lane] = 0;
  }
{% else %}
{%   -- Vector c4 (columns 4 c4 .. 4 c4 + 3) of row k's accumulator, a float4:
     -- tiled 2 keeps columns c0, c0 + 1, c0 + 8, c0 + 9 (c0 = 16 (c4 / 4) +
     -- 2 (c4 % 4)) in one 16-byte chunk, so its vector c4 is those.
  local function acc_at(k, c)
    if tiled == 0 then
      return ("g.dq_acc + at[%s].f * %d + 4 * (%s)"):format(k, D, c)
    elseif tiled == 1 then
      return ("g.dq_acc + fj::dq_tile_base(at[%s].bh, at[%s].row & ~63, (4 * (%s)) & ~63, g.seq_pad, %d) + fj::dq_tile_off(at[%s].row, (4 * (%s)) & 63)"):format(k, k, c, D, k, c)
    end
    return ("g.dq_acc + fj::dq_tile_base(at[%s].bh, at[%s].row & ~63, c0 & ~63, g.seq_pad, %d) + fj::dq_tile_off4(at[%s].row, c0 & 63)"):format(k, k, D, k)
  end
%}
  if (fj::vec4_ok(g.dq, g.dq_stride)) {
    // Every row's accumulator loaded before any is stored.
    float4 a[{{ RW }}][{{ NV }}];
#pragma unroll
    for (int k = 0; k < {{ RW }}; ++k)
#pragma unroll
      for (int i = 0; i < {{ NV }}; ++i) {
        const int c4 = lane + 32 * i;
{%   if tiled == 2 then %}
        const int c0 = 16 * (c4 >> 2) + 2 * (c4 & 3);
{%   end %}
        a[k][i] = at[k].live && {{ VGUARD }} ? *reinterpret_cast<const float4 *>({{ acc_at("k", "c4") }})
                                             : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
    for (int k = 0; k < {{ RW }}; ++k) {
      if (!at[k].live) continue;
      elem_t *dq = fj::head_rows<elem_t>(g.dq, g.dq_stride, at[k].b, at[k].h) + at[k].r * g.dq_stride[2];
#pragma unroll
      for (int i = 0; i < {{ NV }}; ++i) {
        const int c4 = lane + 32 * i;
        if ({{ VGUARD }}) {
          const float4 v = a[k][i];
{%   if tiled == 2 then %}
          const int c0 = 16 * (c4 >> 2) + 2 * (c4 & 3);
          *reinterpret_cast<fj::elem2_t *>(dq + c0) = fj::to_elem2(v.x * g.scale, v.y * g.scale);
          *reinterpret_cast<fj::elem2_t *>(dq + c0 + 8) = fj::to_elem2(v.z * g.scale, v.w * g.scale);
{%   else %}
          fj::store4(dq + 4 * c4, v.x * g.scale, v.y * g.scale, v.z * g.scale, v.w * g.scale);
{%   end %}
        }
      }
    }
  } else {
#pragma unroll
    for (int k = 0; k < {{ RW }}; ++k) {
      if (!at[k].live) continue;
      const int row = at[k].row;
      const long long f = at[k].f, bh = at[k].bh;
      (void)f; (void)bh; (void)row;
      elem_t *dq = fj::head_rows<elem_t>(g.dq, g.dq_stride, at[k].b, at[k].h) + at[k].r * g.dq_stride[2];
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
    }
  }
{% end %}
  if (g.pg_words) fj::pgrad_words(g);
}
