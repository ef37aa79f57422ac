{#
  attention_wmma.cu: the WMMA attention family (16x16x16 fragments).

  One thread block covers tile_m query rows of one (batch, head) and walks
  the key/value tiles (tile_n rows each) that its rows may see.  Two softmax
  paths:

  softmax = "smem", the seeds' Stage-2: per key tile three phases separated
  by block barriers, every intermediate in shared memory --
    A  S = Q K^T       16x16 tiles spread over the warps, S stored as float
    B  online softmax  a warp per row: running max m and sum l, P = exp2(S - m)
                       in the element type, O's row rescaled by exp2(m_old - m)
    C  O += P V        16x16 output tiles, accumulators loaded from and stored
                       back to O in shared memory

  softmax = "regs", the seeds' Stage-3: each warp owns 16 query rows; S, P and
  O stay in accumulator fragments.  Which slot of a fragment holds which
  (row, col), which lanes share a row (the shuffle masks of the row max and
  sum) and whether P can feed P.V straight from registers all come from the
  probed layout table (lut.lua), never from an assumed layout.

  K and V move through a ring of `stages` shared buffers: 1 loads them
  synchronously, 2-3 prefetch the next tiles with 16-byte cp.async copies.
  swizzle "pad" adds 16 bytes to each shared row; "xor" permutes the 16-byte
  chunks of a row by the row number, and fragments are then loaded element
  by element from the probed operand layouts (load_matrix_sync reads only
  plain strided tiles).  FP8 (e4m3) K/V are dequantised to the element type
  as they load (exactly: every e4m3 value is a half and a bf16 value); their
  per-(batch, head) scales multiply the softmax scale and the output.
#}
{%
  local L = import("lut.lua")
  local mrule = import("mask.lua").new(causal)
  local D, BM, BN, W, S = head_dim, tile_m, tile_n, warps, stages
  local THREADS = 32 * W
  local regs, xor, fp8 = softmax == "regs", swizzle == "xor", kv_dtype == "e4m3"
  local function no(fmt, ...) refuse(fmt:format(...)) end

  if D % 16 ~= 0 then no("head_dim %d: the WMMA family needs a multiple of 16", D) end
  if BM % 16 ~= 0 or BN % 16 ~= 0 then no("tile_m %d / tile_n %d: the WMMA family needs multiples of 16", BM, BN) end
  if regs and BM ~= 16 * W then
    no("softmax regs: tile_m %d must be 16 x warps = %d (each warp owns 16 query rows)", BM, 16 * W)
  end
  if S > 1 and sm < 80 then no("stages %d needs cp.async (sm_80 or newer); the target is %s", S, arch) end
  if S > 3 then no("stages %d is not implemented: 1, 2 or 3", S) end
  if fp8 and S > 1 then
    no("kv_dtype e4m3 is dequantised as it loads, so it takes stages 1 (not %d)", S)
  end

  -- Shared tiles of Q, K, V: row stride LD elements; "pad" adds 16 bytes.
  -- "xor" permutes chunk c of row r to c ^ (r & XM), XM + 1 the largest power
  -- of two (at most 8) that divides the chunks per row.
  local CHUNKS = D // 8
  local XW = 1
  while XW < 8 and CHUNKS % (XW * 2) == 0 do XW = XW * 2 end
  local XM = XW - 1
  local LD = D + (swizzle == "pad" and 8 or 0)
  local LDS = BN + (swizzle == "none" and 0 or 4)   -- S rows (float)
  local LDP = BN + (swizzle == "none" and 0 or 8)   -- P rows (elem_t)
  local LDO = D + (swizzle == "none" and 0 or 4)    -- O rows (float)

  -- What the layout tables allow.  softmax regs and swizzle xor cannot work
  -- without separable tables and refuse; the other variants fall back to
  -- load_matrix_sync.
  local acc, rows, qa, kb, vb, p_from
  local tables_ok = true
  local function table_of(lut, what)
    local info, why = L.analyse(lut, what)
    if not info then
      if regs or xor then no("%s: %s", regs and "softmax regs" or "swizzle xor", why) end
      tables_ok = false
    end
    return info
  end
  acc = table_of(lut_acc, "the accumulator")
  qa = table_of(lut_a, "matrix_a")
  kb = table_of(lut_bk, "matrix_b (col_major)")
  vb = table_of(lut_bv, "matrix_b (row_major)")
  if regs then
    local why
    rows, why = L.rows(acc, "the accumulator")
    if not rows then no("softmax regs: %s", why) end
    p_from = L.a_from_acc(qa, acc)
  end
  local p_in_regs = regs and p_from ~= nil
  -- How the shared pieces (softmax_regs.cuh, epilogue_regs.cuh) reach the
  -- regs path's fragments: one slice of 16 rows per warp.
  local PC = import("pieces.lua")
  local with = PC.with
  local frag = regs and PC.regs{
    acc = acc, rows = rows, MR = 1, mrule = mrule,
    row0 = function(mi) return "m0 + wr + acc_r" end,
  }

  -- Registers of the regs path per thread: O, S, and Q when it stays in
  -- registers; refused when even without Q it cannot fit.
  local a_regs = dtype == "f16" and 8 or 4
  local o_regs, s_regs, q_regs = (D // 16) * 8, (BN // 16) * 8, (D // 16) * a_regs
  local QREGS = regs and D <= 128 and o_regs + s_regs + q_regs + 40 <= 200
  if regs and o_regs + s_regs + 40 > 255 then
    no("softmax regs with head_dim %d and tile_n %d needs about %d registers per thread for O and S; the limit is 255 (over by %d): use a smaller tile_n or softmax smem",
       D, BN, o_regs + s_regs + 40, o_regs + s_regs + 40 - 255)
  end

  -- The shared-memory plan, each region 128-byte aligned.
  local plan, offset = {}, 0
  local function region(name, bytes, ty)
    plan[#plan + 1] = { name = name, offset = offset, bytes = bytes, ty = ty }
    offset = offset + (bytes + 127) // 128 * 128
  end
  region("q", BM * LD * 2, "elem_t")
  region("k", S * BN * LD * 2, "elem_t")
  region("v", S * BN * LD * 2, "elem_t")
  if not regs then
    region("s", BM * LDS * 4, "float")
    region("p", BM * LDP * 2, "elem_t")
    region("o", BM * LDO * 4, "float")
    region("m", BM * 4, "float")
    region("l", BM * 4, "float")
  elseif not p_in_regs then
    region("p", W * 16 * LDP * 2, "elem_t")
  end
  meta.symbol = symbol
  meta.threads = THREADS
  meta.smem_bytes = offset
  meta.rows_per_block = BM

  -- Operand fragments are loaded with one ldmatrix.x4 wherever the probed
  -- layout is what ldmatrix produces (L.ldmatrix checks it lane by lane):
  -- it reads any row layout, swizzled or not, and on sm_90 load_matrix_sync
  -- of bf16 compiles to plain loads and movmatrix transposes instead.
  -- Otherwise load_matrix_sync, or under xor element by element.
  local ldm = {}
  if tables_ok then
    ldm.q, ldm.k, ldm.v = L.ldmatrix(qa, false), L.ldmatrix(kb, true), L.ldmatrix(vb, false)
  end
  -- The per-lane row and column of an ldmatrix source address: lanes 8i..8i+7
  -- give the rows of the 8x8 quadrant that fills register i.
  local function ldm_lane(plan, name)
    local qr, qc = 0, 0
    for i = 0, 3 do
      qr = qr | (plan.quad[i][1] << i)
      qc = qc | (plan.quad[i][2] << i)
    end
    return ("const int %s_r = ((%d >> (lane >> 3)) & 1) * 8 + (lane & 7), %s_c = ((%d >> (lane >> 3)) & 1) * 8;")
      :format(name, qr, name, qc)
  end
  local function ldm_load(frag, info, plan, name, tile, r0, c0, off)
    local out = {
      ("{ unsigned r_[4]; fj::ldmatrix_x4%s(r_, %s + %s(%s + %s_r, %s + %s_c));")
        :format(plan.trans and "_trans" or "", tile, off or "fj::tile_off", r0, name, c0, name) }
    for i = 0, 3 do
      local s = plan.quad[i][3]
      out[#out + 1] = ("fj::split(r_[%d], %s.x[%d], %s.x[%d]);"):format(i, frag, s, frag, s + 1)
    end
    for s = 0, info.slots - 1 do
      if info.dup[s] then out[#out + 1] = ("%s.x[%d] = %s.x[%d];"):format(frag, s, frag, info.dup[s]) end
    end
    return table.concat(out, " ") .. " }"
  end

  -- Element by element: `info` the operand's table, tile a swizzled shared
  -- tile, (r0, c0) the tile position of the fragment's logical (0, 0),
  -- `br`/`bc` the lane's base; transposed for a col_major B (logical (k, n)
  -- is tile (n, k)).
  local function manual_load(frag, info, tile, r0, c0, br, bc, transposed)
    local out = {}
    for _, pr in ipairs(L.pairs(info, transposed)) do
      local s = pr[1]
      local dr, dc = info.drow[s], info.dcol[s]
      local r, c
      if transposed then
        r = ("%s + %s + %d"):format(r0, bc, dc); c = ("%s + %s + %d"):format(c0, br, dr)
      else
        r = ("%s + %s + %d"):format(r0, br, dr); c = ("%s + %s + %d"):format(c0, bc, dc)
      end
      if #pr == 2 then
        out[#out + 1] = ("{ const elem2_t e = *reinterpret_cast<const elem2_t *>(%s + fj::tile_off(%s, %s)); %s.x[%d] = e.x; %s.x[%d] = e.y; }")
          :format(tile, r, c, frag, s, frag, pr[2])
      else
        out[#out + 1] = ("%s.x[%d] = %s[fj::tile_off(%s, %s)];"):format(frag, s, tile, r, c)
      end
    end
    for s = 0, info.slots - 1 do
      if info.dup[s] then out[#out + 1] = ("%s.x[%d] = %s.x[%d];"):format(frag, s, frag, info.dup[s]) end
    end
    return table.concat(out, "\n        ")
  end

  -- Fragment loads from the Q, K and V tiles (ldm LD): load_matrix_sync, or
  -- element by element under xor.
  local function load_q(frag, tile, r0, c0)
    if ldm.q then return ldm_load(frag, qa, ldm.q, "lq", tile, r0, c0) end
    if xor then return manual_load(frag, qa, tile, r0, c0, "qa_r", "qa_c", false) end
    return ("wmma::load_matrix_sync(%s, %s + (%s) * %d + %s, %d);"):format(frag, tile, r0, LD, c0, LD)
  end
  local function load_k(frag, tile, n0, k0)   -- B = K^T: logical (k, n) = K[n][k]
    if ldm.k then return ldm_load(frag, kb, ldm.k, "lk", tile, n0, k0) end
    if xor then return manual_load(frag, kb, tile, n0, k0, "kb_k", "kb_n", true) end
    return ("wmma::load_matrix_sync(%s, %s + (%s) * %d + %s, %d);"):format(frag, tile, n0, LD, k0, LD)
  end
  local function load_v(frag, tile, k0, n0)   -- B = V: logical (k, n) = V[k][n]
    if ldm.v then return ldm_load(frag, vb, ldm.v, "lv", tile, k0, n0) end
    if xor then return manual_load(frag, vb, tile, k0, n0, "vb_k", "vb_n", false) end
    return ("wmma::load_matrix_sync(%s, %s + (%s) * %d + %s, %d);"):format(frag, tile, k0, LD, n0, LD)
  end
  local function load_p(frag, tile, r0, c0)   -- A = P from its (unswizzled) tile
    if ldm.q then return ldm_load(frag, qa, ldm.q, "lq", tile, r0, c0, "fj::p_off") end
    return ("wmma::load_matrix_sync(%s, %s + (%s) * %d + %s, %d);"):format(frag, tile, r0, LDP, c0, LDP)
  end
%}
{{ include("common.cuh") }}
{{ include("block.cuh", { BM = BM }) }}
{% if fp8 then %}
#include <cuda_fp8.h>
{% end %}
// shared memory: {{ offset }} bytes{% for _, r in ipairs(plan) do %}; {{ r.name }} @{{ r.offset }}{% end %}

{% if tables_ok then %}
// Fragment layouts from the layout tables: each lane's base (row | col << 4);
// slot s adds a compile-time delta.
__constant__ unsigned char fj_base_acc[32] = { {{ L.base_bytes(acc) }} };
__constant__ unsigned char fj_base_a[32] = { {{ L.base_bytes(qa) }} };
__constant__ unsigned char fj_base_bk[32] = { {{ L.base_bytes(kb) }} };
__constant__ unsigned char fj_base_bv[32] = { {{ L.base_bytes(vb) }} };
{% end %}

namespace fj {

// Element offset of (r, c) in a P tile.
__device__ __forceinline__ int p_off(int r, int c) { return r * {{ LDP }} + c; }

{% if ldm.q or ldm.k or ldm.v then %}
// ldmatrix: lane l names the row of 8x8 matrix l / 8 that it loads.
__device__ __forceinline__ void ldmatrix_x4(unsigned r[4], const elem_t *row) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 { %0, %1, %2, %3 }, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned r[4], const elem_t *row) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 { %0, %1, %2, %3 }, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
// The two 16-bit halves of a register: the lower is the first element.
template <typename T> __device__ __forceinline__ void split(unsigned r, T &lo, T &hi) {
  const elem2_t e = *reinterpret_cast<const elem2_t *>(&r);
  lo = e.x;
  hi = e.y;
}
{% end %}
}  // namespace fj

{{ include("tile_io.cuh", { LD = LD, XM = XM, THREADS = THREADS, S = S, fp8 = fp8 }) }}

// Minimum one block per multiprocessor: without it ptxas keeps a register
// budget of its own and spills long-lived values (seen at 96 registers for
// head_dim 32) instead of using the registers it may have.
extern "C" __global__ void __launch_bounds__({{ THREADS }}, 1)
{{ symbol }}(const fj::Params p) {
  using namespace nvcuda;
  using fj::elem_t;
  using fj::elem2_t;
  typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, elem_t, wmma::row_major> frag_a;
  typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, elem_t, wmma::col_major> frag_bk;
  typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, elem_t, wmma::row_major> frag_bv;
  typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;
  extern __shared__ __align__(128) unsigned char smem[];
{% for _, r in ipairs(plan) do %}
  {{ r.ty }} *const s_{{ r.name }} = reinterpret_cast<{{ r.ty }} *>(smem + {{ r.offset }});
{% end %}

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  (void)warp; (void)lane;
  const fj::Block blk = fj::block_of(p);
  const int m0 = blk.m0;
  const elem_t *q = fj::head_rows<const elem_t>(p.q, p.q_stride, blk.b, blk.h);
  const fj::kv_t *k = fj::head_rows<const fj::kv_t>(p.k, p.k_stride, blk.b, blk.hk);
  const fj::kv_t *v = fj::head_rows<const fj::kv_t>(p.v, p.v_stride, blk.b, blk.hk);
{% if fp8 then %}
  const int at_scale = fj::scale_at(p, blk.b, blk.hk);
  const float k_scale = p.k_scale[at_scale], v_scale = p.v_scale[at_scale];
  const float sl2 = p.scale_log2 * k_scale;
{% else %}
  const float sl2 = p.scale_log2;
{% end %}
{% if tables_ok then %}
  const int qa_r = fj_base_a[lane] & 15, qa_c = fj_base_a[lane] >> 4;
  const int kb_k = fj_base_bk[lane] & 15, kb_n = fj_base_bk[lane] >> 4;
  const int vb_k = fj_base_bv[lane] & 15, vb_n = fj_base_bv[lane] >> 4;
  (void)qa_r; (void)qa_c; (void)kb_k; (void)kb_n; (void)vb_k; (void)vb_n;
{% end %}
{% if ldm.q then %}
  {{ ldm_lane(ldm.q, "lq") }}
{% end %}
{% if ldm.k then %}
  {{ ldm_lane(ldm.k, "lk") }}
{% end %}
{% if ldm.v then %}
  {{ ldm_lane(ldm.v, "lv") }}
{% end %}

  // Keys this block can see: all of them, or up to its last row's diagonal.
  const int n_end = {{ mrule.keys_end("m0 + " .. BM) }};
  const int ntiles = n_end > 0 ? (n_end + {{ BN - 1 }}) / {{ BN }} : 0;

  fj::load_tile<{{ BM }}>(s_q, q, p.q_stride[2], m0, p.seq_q);
  const fj::KvSrc ksrc = {k, p.k_stride[2]}, vsrc = {v, p.v_stride[2]};
  fj::kv_start(s_k, s_v, ksrc, vsrc, p.seq_kv, ntiles);
{% if not regs then %}
  for (int i = threadIdx.x; i < {{ BM * LDO }}; i += {{ THREADS }}) s_o[i] = 0.f;
  for (int i = threadIdx.x; i < {{ BM }}; i += {{ THREADS }}) { s_m[i] = FJ_NEG_INF; s_l[i] = 0.f; }
{% else %}
  // This warp's 16 query rows, in registers.
  const int wr = warp * 16;
  const int acc_r = fj_base_acc[lane] & 15, acc_c = fj_base_acc[lane] >> 4;
  frag_c o[{{ D // 16 }}];
#pragma unroll
  for (int d = 0; d < {{ D // 16 }}; ++d) wmma::fill_fragment(o[d], 0.f);
  // Running max (raw scores) and sum of each row class: rows acc_r +{% for c = 1, #rows.classes do %} {{ rows.classes[c].drow }}{% end %}.
  float row_m[1][{{ #rows.classes }}], row_l[1][{{ #rows.classes }}];
#pragma unroll
  for (int c = 0; c < {{ #rows.classes }}; ++c) { row_m[0][c] = FJ_NEG_INF; row_l[0][c] = 0.f; }
{% end %}
  __syncthreads();
{% if QREGS then %}
  frag_a qf[{{ D // 16 }}];
#pragma unroll
  for (int kk = 0; kk < {{ D // 16 }}; ++kk) {
    {{ load_q("qf[kk]", "s_q", "wr", "kk * 16") }}
  }
{% end %}

  for (int t = 0; t < ntiles; ++t) {
    const int n0 = t * {{ BN }};
    fj::kv_ready(s_k, s_v, ksrc, vsrc, p.seq_kv, t, ntiles);
    const elem_t *kt = s_k + (t % {{ S }}) * {{ BN * LD }}, *vt = s_v + (t % {{ S }}) * {{ BN * LD }};
    // Masks only where a key is past the end or above some row's diagonal.
    const bool need_mask = {{ mrule.tile_partial("n0", BN, "m0") }};
    (void)need_mask;
{% if not regs then %}

    // Phase A: S = Q K^T.
    for (int tt = warp; tt < {{ (BM // 16) * (BN // 16) }}; tt += {{ W }}) {
      const int i = tt / {{ BN // 16 }}, j = tt % {{ BN // 16 }};
      frag_c acc;
      wmma::fill_fragment(acc, 0.f);
#pragma unroll
      for (int kk = 0; kk < {{ D // 16 }}; ++kk) {
        frag_a a;
        frag_bk bt;
        {{ load_q("a", "s_q", "i * 16", "kk * 16") }}
        {{ load_k("bt", "kt", "j * 16", "kk * 16") }}
        wmma::mma_sync(acc, a, bt, acc);
      }
      wmma::store_matrix_sync(s_s + i * 16 * {{ LDS }} + j * 16, acc, {{ LDS }}, wmma::mem_row_major);
    }
    __syncthreads();

    // Phase B: online softmax, one warp per row.
    for (int r = warp; r < {{ BM }}; r += {{ W }}) {
      const int row = m0 + r;
      (void)row;
      float x[{{ (BN + 31) // 32 }}];
      float mx = FJ_NEG_INF;
#pragma unroll
      for (int u = 0; u < {{ (BN + 31) // 32 }}; ++u) {
        const int c = lane + 32 * u, j = n0 + c;
        float s = FJ_NEG_INF;
        if (c < {{ BN }} && (!need_mask || ({{ mrule.visible("row", "j") }})))
          s = s_s[r * {{ LDS }} + c] * sl2;
        x[u] = s;
        mx = fmaxf(mx, s);
      }
      mx = fj::warp_max(mx);
      const float m_old = s_m[r], m_new = fmaxf(m_old, mx);
      // While a row has seen only masked keys its max is -inf; subtracting 0
      // instead keeps exp2 at 0 rather than NaN.
      const float m_use = m_new == FJ_NEG_INF ? 0.f : m_new;
      float sum = 0.f;
#pragma unroll
      for (int u = 0; u < {{ (BN + 31) // 32 }}; ++u) {
        const int c = lane + 32 * u;
        const float e = fj::fast_exp2(x[u] - m_use);
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
    for (int tt = warp; tt < {{ (BM // 16) * (D // 16) }}; tt += {{ W }}) {
      const int i = tt / {{ D // 16 }}, d = tt % {{ D // 16 }};
      frag_c acc;
      wmma::load_matrix_sync(acc, s_o + i * 16 * {{ LDO }} + d * 16, {{ LDO }}, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < {{ BN // 16 }}; ++kk) {
        frag_a a;
        frag_bv bv;
        {{ load_p("a", "s_p", "i * 16", "kk * 16") }}
        {{ load_v("bv", "vt", "kk * 16", "d * 16") }}
        wmma::mma_sync(acc, a, bv, acc);
      }
      wmma::store_matrix_sync(s_o + i * 16 * {{ LDO }} + d * 16, acc, {{ LDO }}, wmma::mem_row_major);
    }
{% else %}

    // S = Q K^T for this warp's 16 rows.
    frag_c sc[{{ BN // 16 }}];
#pragma unroll
    for (int j = 0; j < {{ BN // 16 }}; ++j) wmma::fill_fragment(sc[j], 0.f);
#pragma unroll
    for (int kk = 0; kk < {{ D // 16 }}; ++kk) {
{%   if not QREGS then %}
      frag_a qk;
      {{ load_q("qk", "s_q", "wr", "kk * 16") }}
{%   end %}
#pragma unroll
      for (int j = 0; j < {{ BN // 16 }}; ++j) {
        frag_bk bt;
        {{ load_k("bt", "kt", "j * 16", "kk * 16") }}
        wmma::mma_sync(sc[j], {{ QREGS and "qf[kk]" or "qk" }}, bt, sc[j]);
      }
    }

    // The online softmax on the fragments (softmax_regs.cuh), O rescaled.
{{ PC.softmax_step(with(frag, {
     NJ = BN // 16, mask = "branch",
     S = function(mi, j, i) return ("sc[%s].x[%d]"):format(j, i) end,
     rescale = { ND = D // 16, O = function(mi, d, i) return ("o[%s].x[%d]"):format(d, i) end } })) }}

    // O += P V, P taken from S's fragments.
{%   if p_in_regs then %}
    // The probe shows each A-operand slot holding the element of an
    // accumulator slot of the same lane: P never leaves registers.
{%   else %}
    // The A-operand layout differs from the accumulator's: P goes through
    // this warp's shared tile, written element by element from the table.
    elem_t *pw = s_p + warp * {{ 16 * LDP }};
    __syncwarp();
#pragma unroll
    for (int j = 0; j < {{ BN // 16 }}; ++j) {
{%     for i = 0, acc.slots - 1 do %}
      pw[(acc_r + {{ acc.drow[i] }}) * {{ LDP }} + j * 16 + acc_c + {{ acc.dcol[i] }}] = fj::to_elem(sc[j].x[{{ i }}]);
{%     end %}
    }
    __syncwarp();
{%   end %}
#pragma unroll
    for (int kk = 0; kk < {{ BN // 16 }}; ++kk) {
      frag_a pa;
{%   if p_in_regs then %}
{%     for _, pr in ipairs(L.pairs(qa, false)) do %}
{%       if #pr == 2 then %}
      { const elem2_t e = fj::to_elem2(sc[kk].x[{{ p_from[pr[1]] }}], sc[kk].x[{{ p_from[pr[2]] }}]); pa.x[{{ pr[1] }}] = e.x; pa.x[{{ pr[2] }}] = e.y; }
{%       else %}
      pa.x[{{ pr[1] }}] = fj::to_elem(sc[kk].x[{{ p_from[pr[1]] }}]);
{%       end %}
{%     end %}
{%     for s = 0, qa.slots - 1 do if qa.dup[s] then %}
      pa.x[{{ s }}] = pa.x[{{ qa.dup[s] }}];
{%     end end %}
{%   else %}
      {{ load_p("pa", "pw", "0", "kk * 16") }}
{%   end %}
#pragma unroll
      for (int d = 0; d < {{ D // 16 }}; ++d) {
        frag_bv bv;
        {{ load_v("bv", "vt", "kk * 16", "d * 16") }}
        wmma::mma_sync(o[d], pa, bv, o[d]);
      }
    }
{% end %}
{% if S > 1 then %}
    __syncthreads();  // tile t's buffers are refilled next iteration
{% end %}
  }
{% if S > 1 then %}
  fj::cp_async_wait<0>();
{% end %}

  elem_t *o_out = fj::head_rows<elem_t>(p.o, p.o_stride, blk.b, blk.h);
{% if not regs then %}
  __syncthreads();
  // O = O / l, 16 bytes per store; log-sum-exp in natural log.
  for (int i = threadIdx.x; i < {{ BM * CHUNKS }}; i += {{ THREADS }}) {
    const int r = i / {{ CHUNKS }}, c = i % {{ CHUNKS }};
    if (m0 + r >= p.seq_q) continue;
    const float l = s_l[r];
    const float inv = l > 0.f ? {{ fp8 and "v_scale" or "1.f" }} / l : 0.f;
    __align__(16) elem_t out[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) out[e] = fj::to_elem(s_o[r * {{ LDO }} + c * 8 + e] * inv);
    *reinterpret_cast<uint4 *>(o_out + (long long)(m0 + r) * p.o_stride[2] + c * 8) =
        *reinterpret_cast<const uint4 *>(out);
  }
  if (p.lse) {
    for (int r = threadIdx.x; r < {{ BM }}; r += {{ THREADS }}) {
      if (m0 + r >= p.seq_q) continue;
      const float l = s_l[r];
      p.lse[((long long)blk.b * p.heads_q + blk.h) * p.seq_q + m0 + r] =
          l > 0.f ? (s_m[r] + __log2f(l)) * 0.69314718056f : FJ_NEG_INF;
    }
  }
{% else %}
  // O = O / l and the log-sum-exp from the fragments (epilogue_regs.cuh).
{{ include("epilogue_regs.cuh", with(frag, {
     ND = D // 16, out_scale = fp8 and "v_scale" or "1.f",
     O = function(mi, d, i) return ("o[%s].x[%d]"):format(d, i) end })) }}
{% end %}
}
