{#
  attention_bwd_mma.cu: the backward's main kernel on mma.sync m16n8k16
  (sm_80 and newer), FlashAttention-2 style with K and V stationary.

  A block keeps one key tile of tile_n keys of one (batch, KV head) in
  shared memory -- K and V -- and walks, for each query head of the KV
  head's group, the query tiles of tile_m rows that see it (the mask
  rule's query range of a key tile: mask.lua's rows_begin / rows_end).
  For each query tile it loads Q and dO (and the rows' LSE and delta),
  then:
    S = Q K^T and dP = dO V^T          each warp 16 rows x half the keys
    the score step (score_regs.cuh)    the same as the forward's: softcap,
                                       causal, window, sequence ends
    P = exp(S - LSE), dS = P (dP - delta) [ (1 - tanh^2) under a softcap ]
    P and dS to shared memory          [query][key], 16-bit
    dV += P^T dO, dK += dS^T Q         each warp 16 keys x half the head dim,
                                       P^T and dS^T read by ldmatrix.trans
    dQ += dS K                         each warp 16 rows x half the head dim,
                                       added into g.dq_acc (float32 atomics;
                                       deterministic: in key-tile order)
  and at the end writes dK (times the softmax scale) and dV, summed over
  the group's query heads in registers, so GQA needs no reduction kernel.
  The preprocess (bwd_rows.cu "pre": delta, dQ's accumulator cleared, the sinks'
  gradient) runs before and the postprocess (bwd_rows.cu "post": dQ) after.
  Rows that see no key (LSE -inf) get P = 0 and gradients 0, never NaN.
  Which (row, column) each accumulator register holds comes from the
  probed mma tables (lut.lua), as in the forward.
  Varlen: a block keeps a key tile of its own sequence (rows from the
  sequence's first; loads stop at its lengths).
  Parameters: the forward's mma variant axes (head_dim, tile_m, tile_n,
  warps 8, stages 1 or 2, swizzle), causal, window, softcap, dtype.
#}
{%
  local L = import("lut.lua")
  local PC = import("pieces.lua")
  local D, BM, BN, S, W = head_dim, tile_m, tile_n, stages, warps
  local THREADS = 32 * W
  local mrule = PC.bwd_mask(import("mask.lua"))
  local mods = import("mods.lua").new{ softcap = softcap }
  local function no(fmt, ...) refuse(fmt:format(...)) end
  PC.bwd_scope()
  if W ~= 8 then no("warps %d: the mma backward runs 8 warps (4 row groups x 2 halves)", W) end
  if BM ~= 64 or BN ~= 64 then no("tile_m %d, tile_n %d: the mma backward takes 64 x 64 tiles", BM, BN) end
  if D % 32 ~= 0 or D > 256 then no("head_dim %d: the mma backward takes multiples of 32 up to 256", D) end
  if S < 1 or S > 2 then no("stages %d: the mma backward takes 1 or 2", S) end
  -- dQ's product in chunks of DQT tiles of 16 columns (all of a warp's
  -- half up to 5 tiles, else the largest divisor up to 4), so that head
  -- dim 256 holds dK and dV (D/32 tiles of 8 each), S and dP (two tiles
  -- each) and one chunk.
  local NT = D // 32
  local DQT = NT
  if NT > 5 then
    DQT = 4
    while NT % DQT ~= 0 do DQT = DQT - 1 end
  end
  local need = 2 * NT * 8 + DQT * 8 + 32 + 48
  if need > 255 then
    no("head_dim %d needs about %d registers per thread for dK, dV, dQ, S and dP; the limit is 255 (over by %d)", D, need, need - 255)
  end

  local acc, qa, rows, p_from = L.softmax_tables(lut_acc, lut_a, "mma", refuse)
  -- P^T and dS^T as A operands from [query][key] tiles: ldmatrix.trans
  -- must fill the A fragment from the transposed storage (lut.lua).
  local at = L.ldmatrix(qa, true)
  if not at then
    refuse("the mma backward: the probed A operand cannot be loaded by ldmatrix from a transposed tile")
  end
  local QR, QC = 0, 0
  for i = 0, 3 do
    QR = QR | ((at.quad[i][1] & 1) << i)
    QC = QC | ((at.quad[i][2] & 1) << i)
  end
  local NC = #rows.classes
  local DH = D // 2          -- the head-dim half a warp owns in dK, dV and dQ

  -- Shared memory: K and V (stationary), S stages of Q and dO, P and dS
  -- ([query][key]), the rows' LSE and delta.
  local CHUNKS = D // 8
  local XW = 1
  while XW < 8 and CHUNKS % (XW * 2) == 0 do XW = XW * 2 end
  local XM = XW - 1
  local LD = D + (swizzle == "pad" and 8 or 0)
  local LDP = BN + 8          -- P and dS rows, padded: no bank conflicts
  local B = import("budget.lua").new{ smem_limit = 1 << 30, slack = 0 }
  local OFF_K = B.region("k", BN * LD * 2, 128)
  local OFF_V = B.region("v", BN * LD * 2, 128)
  local OFF_Q = B.region("q", S * BM * LD * 2, 128)
  local OFF_DO = B.region("do", S * BM * LD * 2, 128)
  local OFF_P = B.region("p", BM * LDP * 2, 128)
  local OFF_DS = B.region("ds", BM * LDP * 2, 128)
  local OFF_L = B.region("lse_delta", S * 2 * BM * 4, 16)
  meta.symbol = symbol
  meta.threads = THREADS
  meta.smem_bytes = B.total()
  meta.rows_per_block = BN

  local T = dtype
  local frag = PC.regs{
    acc = acc, rows = rows, MR = 1, mrule = mrule, mods = mods,
    row0 = function(mi) return "m0 + wr + acc_r" end,
    head = function(r) return "h" end,
  }
  local addr = PC.ldsm_addr(swizzle, LD)
%}
{{ include("common.cuh") }}
{{ include("block.cuh", { BM = BM, BN = BN }) }}
{{ include("bwd_common.cuh") }}
{% if mods.any then %}
{{ include("mods.cuh", { mods = mods, part = "decls" }) }}
{% end %}
{{ B.comment() }}

// From the accumulator table: each lane's base (row | col << 4); slot s adds
// (drow, dcol) = {% for s = 0, acc.slots - 1 do %}({{ acc.drow[s] }}, {{ acc.dcol[s] }}){{ s < acc.slots - 1 and " " or "" }}{% end %}.
__constant__ unsigned char fj_base_acc[32] = { {{ L.base_bytes(acc) }} };

{{ include("mma_frag.cuh") }}
{{ include("tile_io.cuh", { LD = LD, XM = XM, THREADS = THREADS, S = S }) }}

extern "C" __global__ void __launch_bounds__({{ THREADS }}, 1)
{{ symbol }}(const fj::Params p, const fj::BwdParams g{{ mods.kernel_param }}) {
  using fj::elem_t;
  extern __shared__ __align__(128) unsigned char smem[];
  elem_t *const s_k = reinterpret_cast<elem_t *>(smem + {{ OFF_K }});
  elem_t *const s_v = reinterpret_cast<elem_t *>(smem + {{ OFF_V }});
  elem_t *const s_q = reinterpret_cast<elem_t *>(smem + {{ OFF_Q }});
  elem_t *const s_do = reinterpret_cast<elem_t *>(smem + {{ OFF_DO }});
  elem_t *const s_p = reinterpret_cast<elem_t *>(smem + {{ OFF_P }});
  elem_t *const s_ds = reinterpret_cast<elem_t *>(smem + {{ OFF_DS }});
  float *const s_ld = reinterpret_cast<float *>(smem + {{ OFF_L }});  // per stage: LSE * log2(e), then delta

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const fj::KvTile kt = fj::kv_tile(g.section, {{ mrule.bounded and "g.deterministic" or "false" }});  // bwd_common.cuh's launch order
  const int nt = kt.n, n0 = nt * {{ BN }}, hk = kt.hk, b = kt.b;
  fj::Block blk;  // the modifications' view of the block (mods.lua): batch and KV head
  blk.b = b;
  blk.hk = hk;
  blk.h = blk.m0 = 0;
  // S and dP: rows wr.. of the query tile, keys kw.. of the key tile.
  const int wr = (warp % 4) * 16, kw = (warp / 4) * {{ BN // 2 }};
  // dK and dV: keys kr.., and dQ too: head-dim columns dc..
  const int kr = (warp % 4) * 16, dc = (warp / 4) * {{ DH }};
  const int acc_r = fj_base_acc[lane] & 15, acc_c = fj_base_acc[lane] >> 4;
  const int rm_r = fj::ldm_row_rm(lane), rm_c = fj::ldm_col_rm(lane);
  const int nm_r = fj::ldm_row_nm(lane), nm_c = fj::ldm_col_nm(lane);
  // The transposed A operand's source rows and columns (lut.lua's ldmatrix plan).
  const int at_r = (({{ QR }} >> (lane >> 3)) & 1) * 8 + (lane & 7), at_c = (({{ QC }} >> (lane >> 3)) & 1) * 8;
  const unsigned rm_off = 2 * (rm_r * {{ LD }} + rm_c), nm_off = 2 * (nm_r * {{ LD }} + nm_c);
  (void)rm_off; (void)nm_off;
  const unsigned sk_u = fj::smem_addr(s_k), sv_u = fj::smem_addr(s_v);
  const unsigned sp_u = fj::smem_addr(s_p), sds_u = fj::smem_addr(s_ds);
  {{ mods.scales(2, "") }}

  // K and V of this key tile, for the whole walk.
  // This block's sequence (varlen: its own rows and lengths).
  {{ PC.bwd_seq(mrule) }}
  const elem_t *kg = fj::head_rows<const elem_t>(p.k, p.k_stride, b, hk) + kv_row0 * p.k_stride[2];
  const elem_t *vg = fj::head_rows<const elem_t>(p.v, p.v_stride, b, hk) + kv_row0 * p.v_stride[2];
  fj::load_tile<{{ BN }}>(s_k, kg, p.k_stride[2], n0, len_kv);
  fj::load_tile<{{ BN }}>(s_v, vg, p.v_stride[2], n0, len_kv);

  // The query rows that see this key tile, in whole row tiles (the
  // scheduler's head of a key tile: mask.lua's rows_begin / rows_end).
{{ PC.piece(include("scheduler.cuh", { part = "kv_head", mrule = mrule, BM = BM, BN = BN })) }}
  const int steps = nq * p.group;  // (query head of the group, row tile) pairs

  float dk[{{ DH // 16 }}][8], dv[{{ DH // 16 }}][8];
#pragma unroll
  for (int d = 0; d < {{ DH // 16 }}; ++d)
#pragma unroll
    for (int i = 0; i < 8; ++i) dk[d][i] = dv[d][i] = 0.f;

  // Step i's Q and dO rows, LSE and delta into stage i % S.
  auto load_step = [&](int i) {
    const int st = i % {{ S }}, hq = hk * p.group + i / nq, mq = m_first + (i % nq) * {{ BM }};
    const elem_t *qg = fj::head_rows<const elem_t>(p.q, p.q_stride, b, hq) + q_row0 * p.q_stride[2];
    const elem_t *dg = fj::head_rows<const elem_t>(g.dout, g.do_stride, b, hq) + q_row0 * g.do_stride[2];
    fj::load_tile<{{ BM }}>(s_q + st * {{ BM * LD }}, qg, p.q_stride[2], mq, len_q);
    fj::load_tile<{{ BM }}>(s_do + st * {{ BM * LD }}, dg, g.do_stride[2], mq, len_q);
    if (threadIdx.x < {{ BM }}) {
      const int r = mq + threadIdx.x;
      // The preprocess's padded rows: a row past the end, or one that saw
      // no key, has LSE2 +inf, so P = 0.
      const long long f = ((long long)b * p.heads_q + hq) * g.seq_pad + r;
      s_ld[st * {{ 2 * BM }} + threadIdx.x] = g.lse2[f];
      s_ld[st * {{ 2 * BM }} + {{ BM }} + threadIdx.x] = g.delta[f];
    }
  };
{% if S > 1 then %}
  if (steps > 0) load_step(0);
  fj::cp_async_commit();
{% end %}

  int edge = 0;  // the deterministic mode's (scheduler.cuh's kv_rank)
  for (int i = 0; i < steps; ++i) {
    const int st = i % {{ S }}, h = hk * p.group + i / nq, m0 = m_first + (i % nq) * {{ BM }};
{% if S > 1 then %}
    // The next step's tiles load while this one computes.
    if (i + 1 < steps) load_step(i + 1);
    fj::cp_async_commit();
    fj::cp_async_wait<1>();
{% else %}
    load_step(i);
{% end %}
    __syncthreads();
    const unsigned sq_u = fj::smem_addr(s_q + st * {{ BM * LD }}), sdo_u = fj::smem_addr(s_do + st * {{ BM * LD }});
    const float *s_lse = s_ld + st * {{ 2 * BM }}, *s_delta = s_lse + {{ BM }};

    // S = Q K^T and dP = dO V^T on this warp's rows and keys.
    float s[{{ BN // 32 }}][8], dp[{{ BN // 32 }}][8];
#pragma unroll
    for (int j = 0; j < {{ BN // 32 }}; ++j)
#pragma unroll
      for (int e = 0; e < 8; ++e) s[j][e] = dp[j][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < {{ D // 16 }}; ++kk) {
      unsigned qf[4], df[4];
      fj::ldsm_x4(qf, {{ addr("sq_u", "rm", "wr", "kk * 16") }});
      fj::ldsm_x4(df, {{ addr("sdo_u", "rm", "wr", "kk * 16") }});
#pragma unroll
      for (int j = 0; j < {{ BN // 32 }}; ++j) {
        unsigned kf[4], vf[4];
        fj::ldsm_x4(kf, {{ addr("sk_u", "nm", "kw + j * 16", "kk * 16") }});
        fj::ldsm_x4(vf, {{ addr("sv_u", "nm", "kw + j * 16", "kk * 16") }});
        fj::mma_tile_{{ T }}(s[j], qf, kf);
        fj::mma_tile_{{ T }}(dp[j], df, vf);
      }
    }

    // The score step (score_regs.cuh), then P and dS, into shared memory.
    const int key0 = n0 + kw;
    {
      const int mi = 0;
      (void)mi;
      const int n0 = key0;  // the score step's first key of the tile
      const bool need_mask = {{ mrule.tile_partial("n0", BN // 2, "m0 + wr", "m0 + wr + 15") }};
{{ PC.piece(include("score_regs.cuh", PC.with(frag, { NJ = BN // 32, mask = "branch",
     S = function(mi, j, i) return ("s[%s][%d]"):format(j, i) end }))) }}
    }
#pragma unroll
    for (int j = 0; j < {{ BN // 32 }}; ++j) {
{% for i = 0, acc.slots - 1 do %}
{%   local r = ("wr + acc_r + %d"):format(acc.drow[i]) %}
{%   local c = ("kw + j * 16 + acc_c + %d"):format(acc.dcol[i]) %}
      {
        const float pe = fj::fast_exp2(fmaf(s[j][{{ i }}], sl2, -s_lse[{{ r }}]));
        float dse = pe * (dp[j][{{ i }}] - s_delta[{{ r }}]);
{%   if mods.softcap then %}
        // d(cap tanh(x / cap)) / dx; a hidden element's -inf counts as -1 (its P is 0).
        const float th = fmaxf(s[j][{{ i }}], -1.f);
        dse *= 1.f - th * th;
{%   end %}
        s_p[({{ r }}) * {{ LDP }} + {{ c }}] = fj::to_elem(pe);
        s_ds[({{ r }}) * {{ LDP }} + {{ c }}] = fj::to_elem(dse);
      }
{% end %}
    }
    __syncthreads();

    // dV += P^T dO and dK += dS^T Q: keys kr.., head-dim columns dc..
#pragma unroll
    for (int kk = 0; kk < {{ BM // 16 }}; ++kk) {
      unsigned pf[4], sf[4];
      fj::ldsm_x4_t(pf, sp_u + 2 * ((kk * 16 + at_r) * {{ LDP }} + kr + at_c));
      fj::ldsm_x4_t(sf, sds_u + 2 * ((kk * 16 + at_r) * {{ LDP }} + kr + at_c));
#pragma unroll
      for (int d = 0; d < {{ DH // 16 }}; ++d) {
        unsigned of[4], qf[4];
        fj::ldsm_x4_t(of, {{ addr("sdo_u", "rm", "kk * 16", "dc + d * 16") }});
        fj::ldsm_x4_t(qf, {{ addr("sq_u", "rm", "kk * 16", "dc + d * 16") }});
        fj::mma_tile_{{ T }}(dv[d], pf, of);
        fj::mma_tile_{{ T }}(dk[d], sf, qf);
      }
    }

    // dQ += dS K: rows wr.., columns dc.., {{ DQT * 16 }} at a time, into the
    // float32 accumulator; in the deterministic mode once the key tiles
    // before this one that walk these rows have added theirs (their turn
    // counter, bwd_common.cuh), so every element's sum has one order.
    const long long bh = (long long)b * p.heads_q + h;
    float *dq_rows = g.dq_acc + bh * g.seq_pad * {{ D }};
    int *const turn = g.dq_turns + fj::dq_tile_base(bh, m0, 0, g.seq_pad, {{ D }}) / 4096;
    if (g.deterministic) {
      if (threadIdx.x == 0) {
        int rank = 0;
{{ PC.piece(include("scheduler.cuh", { part = "kv_rank", mrule = mrule, BM = BM, BN = BN })) }}
        fj::dq_turn_wait(turn, rank);
      }
      __syncthreads();
    }
#pragma unroll
    for (int dq0 = 0; dq0 < {{ NT }}; dq0 += {{ DQT }}) {
      float dq[{{ DQT }}][8];
#pragma unroll
      for (int d = 0; d < {{ DQT }}; ++d)
#pragma unroll
        for (int e = 0; e < 8; ++e) dq[d][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < {{ BN // 16 }}; ++kk) {
        unsigned af[4];
        fj::ldsm_x4(af, sds_u + 2 * ((wr + rm_r) * {{ LDP }} + kk * 16 + rm_c));
#pragma unroll
        for (int d = 0; d < {{ DQT }}; ++d) {
          unsigned kf[4];
          fj::ldsm_x4_t(kf, {{ addr("sk_u", "rm", "kk * 16", "dc + (dq0 + d) * 16") }});
          fj::mma_tile_{{ T }}(dq[d], af, kf);
        }
      }
#pragma unroll
      for (int d = 0; d < {{ DQT }}; ++d) {
{% for i = 0, acc.slots - 1 do %}
        {
          const int r = m0 + wr + acc_r + {{ acc.drow[i] }};
          if (r < len_q) atomicAdd(dq_rows + (long long)r * {{ D }} + dc + (dq0 + d) * 16 + acc_c + {{ acc.dcol[i] }}, dq[d][{{ i }}]);
        }
{% end %}
      }
    }
    // Every thread's additions done at the GPU before the turn passes on.
    if (g.deterministic) __threadfence();
    __syncthreads();  // P, dS and this stage are read before they are written again
    if (g.deterministic && threadIdx.x == 0) fj::dq_turn_done(turn);
  }

  // dK (times the softmax scale) and dV, keys past the sequence not written.
  elem_t *dkg = fj::head_rows<elem_t>(g.dk, g.dk_stride, b, hk) + kv_row0 * g.dk_stride[2];
  elem_t *dvg = fj::head_rows<elem_t>(g.dv, g.dv_stride, b, hk) + kv_row0 * g.dv_stride[2];
#pragma unroll
  for (int d = 0; d < {{ DH // 16 }}; ++d) {
{% for i = 0, acc.slots - 1 do %}
    {
      const int r = n0 + kr + acc_r + {{ acc.drow[i] }}, c = dc + d * 16 + acc_c + {{ acc.dcol[i] }};
      if (r < kv_rows) {
        dkg[(long long)r * g.dk_stride[2] + c] = fj::to_elem(dk[d][{{ i }}] * g.scale);
        dvg[(long long)r * g.dv_stride[2] + c] = fj::to_elem(dv[d][{{ i }}]);
      }
    }
{% end %}
  }
}
{% if mods.any then %}
{{ include("mods.cuh", { mods = mods, part = "defs" }) }}
{% end %}
