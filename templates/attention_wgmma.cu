{#
  attention_wgmma.cu: the Hopper family (sm_90a), FlashAttention-3 style --
  the kernel shell that names its pieces:
    tma_ring.lua      the producer: TMA loads of Q, K and V into mbarrier
                      rings (Q one slot a work tile, K and V `stages` slots)
    scheduler.cuh     the persistent walk over query tiles (static pairs of
                      equal causal work, or claimed items for varlen and
                      block masks) and each tile's key range (mask.lua)
    mainloop_fwd.cuh  what the producer loads per tile, and the consumers'
                      S = Q K^T, score step, online softmax and O += P V,
                      overlapped and in ping-pong
    score_regs.cuh, softmax_regs.cuh   the score step, the online softmax
    epilogue_regs.cuh O = O / l (staged through shared memory where it
                      fits) and the log-sum-exp
    budget.lua        the shared-memory plan and the setmaxnreg split
  A thread block covers tile_m = 64 x C query rows of one (batch, head)
  with C consumer warpgroups and one producer warpgroup (warps = 4 (C +
  1)); one thread of the producer issues every load and the producer's
  registers go to the consumers.  Tiles arrive as panels of 128-byte rows
  in the 128-byte swizzle (wgmma.cuh); sequence tails come from the TMA's
  zero fill, and only tiles that cross the sequence end or the causal
  diagonal are masked.  Packed (varlen) tensors are one batch of their
  total rows, so a box starts at the sequence's first row plus the tile's,
  and rows past the sequence are masked keys or query rows never stored.
  Which (row, column) each accumulator register holds, which lanes share a
  row and how S becomes the A operand come from the probed wgmma tables
  (lut.lua); the probe ran these very instructions and descriptors.
#}
{%
  local L = import("lut.lua")
  local PC = import("pieces.lua")
  local TR = import("tma_ring.lua")
  local VL = varlen
  -- A varlen tile's sequence lengths and mask offset are locals.
  local mrule = import("mask.lua").new(causal, false,
                                       VL and { q = "len_q", kv = "len_kv", off = "causal_off" } or nil,
                                       window)
  local mods = import("mods.lua").new{ score = score_mod, mask = mask_mod, params = mod_params,
                                       softcap = softcap, sinks = sinks, checked = checked,
                                       bounded = dtype == "bf16" }
  local BM, BN, S = tile_m, tile_n, stages
  -- A caller's block mask lists each row tile's key tiles (block.cuh);
  -- the mask expression applies only on its partial blocks' tiles.
  local BMASK = (block_kv or 0) > 0 and { q = block_q, kv = block_kv } or nil
  if BMASK then mods.mask_guard = "bm_part" end
  -- The first key of key tile t (an expression) of a work tile.
  local function N0(t)
    if BMASK then return ("fj::list_n0(bl, %s)"):format(t) end
    return t == "0" and ("t_first * %d"):format(BN) or ("(t_first + %s) * %d"):format(t, BN)
  end
  local C = warps // 4 - 1          -- consumer warpgroups
  local THREADS = 32 * warps
  -- The element: its bytes, and the elements of one wgmma k step (32 bytes
  -- of the reduction: k16 for 16-bit types, k32 for 8-bit ones).
  local ELEM = TR.ELEM[dtype]
  local KSTEP = 32 // (ELEM or 2)
  -- The head dim: the problem's (DR: columns loaded and stored) and the
  -- tiles' (D: whole 128-byte swizzled panels).  A head dim between
  -- panels (80, 96, 160, ...) is padded: the TMA's boxes past DR read
  -- zeros, which add nothing to S; S = Q K^T takes the k steps that hold
  -- DR's columns, O += P V the whole padded width (its last columns are
  -- zeros, never stored).
  local PANEL = TR.ROW_BYTES // (ELEM or 2)
  local function panels(d) return (d + PANEL - 1) // PANEL * PANEL end
  local DR = head_dim
  local D = panels(DR)
  -- V's and O's head dim (head_dim_v: split head dims, as MLA's prefill
  -- has, 192 for Q K^T and 128 for P V), real (DVR) and padded (DV): the
  -- V ring, O's accumulator, P V's N and the epilogue's columns take it;
  -- Q's and K's rings and S's k steps take D.  nil: the same as head_dim.
  local DVR = head_dim_v or DR
  local DV = panels(DVR)
  local FP8 = dtype == "e4m3"
  -- FP8's V^T has the head dim as its rows (each 128 keys, one 128-byte
  -- panel), so P V and O take the head dim itself (a multiple of 64, one
  -- for Q, K and V: refused below otherwise), not 128-byte panels: 64 at
  -- 64 columns, 192 at 192 (not 128 and 256: a quarter to a half of P V's
  -- products on zeros).  The host's V^T boxes have head_dim rows
  -- (attention.c's vt_pass).
  if FP8 then DV = DVR end
  local SPLIT = DVR ~= DR
  -- FP8 attention (dtype e4m3): Q, K and V in e4m3, S = Q K^T and O += P V
  -- on FP8 wgmma (k32), both operands K-major -- so V arrives transposed
  -- (V^T, written into the workspace by this module's _vt kernel, each 32
  -- keys in the order the P operand takes them), P quantised to e4m3 in
  -- registers (up to 256, so that small P keeps e4m3's normal range: the
  -- row sums carry the same factor), and O's FP8 partial added
  -- into a float32 accumulator every FLUSH key tiles (-1: never).
  -- FP8 attention's O in e4m3 (o_dtype; nil: bf16): one byte an element.
  local O8 = o_dtype == "e4m3"
  local FLUSH = FP8 and fp8_flush or -1
  local TWO = FP8 and FLUSH > 0
  -- FP8: P = 2^(x - max + P_SHIFT) (the row sums count the same), and
  -- the max a warp's rows take moves only once one grows by more than
  -- 2^LAZY (O is rescaled only then): P stays within 2^8 = 256, in e4m3's
  -- normal range below its 448.  On the H200 (bench/fp8_compare.py, S
  -- 4096 / 16384): head dim 256 with 2^4 1164-1309 TF against 1127-1212
  -- without, both masks; head dim 128 with 2^2 +4-6% unmasked, -5-7%
  -- causal, so causal keeps every rescale there.  16-bit types: 2^8 (P up
  -- to 256; H100, 2026-12-05: 0.6-3.5% faster at head dims 64-256, with
  -- mainloop_fwd.cuh's wait after the softmax).  A user's expression keeps
  -- every rescale, and the main loop's forms that cost no registers
  -- (mainloop_fwd.cuh's user_expr): they would spill 8-48 bytes at head dim 128.
  local USER_EXPR = mods.score_text ~= nil or mods.mask_text ~= nil
  local LAZY = FP8 and (D > 128 and 4 or causal == "none" and 2 or 0)
               or (not USER_EXPR and 8 or nil)
  local P_SHIFT = FP8 and 8 - (LAZY or 0) or nil
  -- A persistent grid of one block per multiprocessor walks the work tiles
  -- in pairs of equal causal work (block.cuh);
  -- consumer warpgroups take turns to issue their products (ping-pong)
  -- where there are two or more and O leaves room (FlashAttention-3 turns
  -- it off above head dim 128).
  local PERSISTENT = true
  -- Varlen and block masks walk dynamically: blocks claim tiles from a
  -- counter (the static walk balances causal work only: the lengths of
  -- sequences and of a block mask's lists vary otherwise).
  local DYNAMIC = VL or BMASK ~= nil
  local PINGPONG = C >= 2 and D <= 128 and DV <= 128
  local function no(fmt, ...) refuse(fmt:format(...)) end

  if softmax ~= "regs" then
    no("softmax %s: the wgmma family keeps the softmax in registers (softmax regs)", softmax)
  end
  if swizzle ~= "xor" then
    no("swizzle %s: the wgmma family reads tiles in the 128-byte XOR swizzle that TMA writes (swizzle xor)", swizzle)
  end
  if not ELEM or (ELEM ~= 2 and not FP8) then
    no("dtype %s: the wgmma family's forward takes f16, bf16 and e4m3", dtype)
  end
  if FP8 and SPLIT then
    no("head_dim_v %d with head_dim %d and dtype e4m3 is not implemented: split head dims take f16 or bf16", DVR, DR)
  end
  if FP8 then
    if kv_dtype ~= "e4m3" then no("dtype e4m3 with kv_dtype %s: FP8 attention takes Q, K and V in e4m3", kv_dtype) end
    -- Q's and K's rows are whole 128-byte panels of one-byte elements: 64
    -- and 192 are padded to 128 and 256 there (TMA reads zeros past the
    -- head dim; S takes DR's k steps only); V^T and O take DV (above); the
    -- _vt pass takes the head dim 64 at a time.
    if DR % 64 ~= 0 then
      no("head_dim %d with dtype e4m3 is not implemented: 64, 128, 192 or 256 (V^T is written 64 of the head dim at a time)", DR)
    end
    if BN % 32 ~= 0 or BN < 128 or BN > 256 then
      no("tile_n %d with dtype e4m3: FP8 attention takes key tiles of 128 (the default) to 256 in steps of 32 (P V's k steps; V^T's rows load in 128-key boxes; fixed per head dim so that every length rounds alike)", BN)
    end
    if (mods.score or mods.softcap) and D > 128 then
      no("dtype e4m3 with a score expression or softcap at head_dim %d is not implemented: up to 128 (above, the consumers' registers spill)", DR)
    end
    if VL or BMASK then no("dtype e4m3 with %s is not implemented: dense problems", VL and "varlen" or "a block mask") end
  end
  if (DR * (ELEM or 2)) % 16 ~= 0 or D > 256 then
    no("head_dim %d is not implemented for the wgmma family: a multiple of %d up to 256 (rows of whole 16-byte TMA units; wgmma's N is at most 256)", DR, 16 // (ELEM or 2))
  end
  if (DVR * (ELEM or 2)) % 16 ~= 0 or DV > 256 then
    no("head_dim_v %d is not implemented for the wgmma family: a multiple of %d up to 256 (rows of whole 16-byte TMA units; wgmma's N is at most 256)", DVR, 16 // (ELEM or 2))
  end
  if BM ~= 64 * C then
    no("tile_m %d with warps %d: each of the %d consumer warpgroups owns 64 rows, so tile_m is %d", BM, warps, C, 64 * C)
  end
  if BN % 16 ~= 0 or BN > 256 then
    no("tile_n %d: the wgmma family needs a multiple of 16 up to 256 (wgmma's N)", BN)
  end
  if S < 2 or S > 4 then no("stages %d: the wgmma family takes 2, 3 or 4", S) end
  if BMASK and VL then no("a block mask with varlen is not implemented: block masks take dense problems") end
  if BMASK and (BMASK.q % BM ~= 0 or BMASK.kv % BN ~= 0) then
    no("tile_m %d and tile_n %d must divide the block mask's blocks (%d query rows, %d keys)", BM, BN, BMASK.q, BMASK.kv)
  end
  if paged or pack_gqa or split_kv then
    no("%s is the mma family's (mma mma): the wgmma family takes varlen", paged and "paged" or pack_gqa and "pack_gqa" or "split_kv")
  end

  -- The budget (budget.lua).  Registers: the producer gives its registers
  -- to the consumers.  A producer that walks a block mask's lists, claims
  -- its tiles and reads the next one's counts early holds more than 24
  -- (ptxas spilled 16 bytes there, and 8-20 at 32): 40, the consumers
  -- 232, exactly the 168 x 384 the block starts with.  Per consumer thread
  -- O (DV/2; FP8's O is not padded, so the text names DV), S (BN/2) and P
  -- (BN/4, FP8's BN/8) stay live.
  local B = import("budget.lua").new{}
  local REGS = B.regs(C, C == 2 and BMASK and { producer = 40, consumer = 232 } or nil)
  local function dim_text(name, real, padded)
    return ("%s %d%s"):format(name, real, real < padded and (" (padded to %d)"):format(padded) or "")
  end
  B.check_regs(DV // 2 * (TWO and 2 or 1) + BN // 2 + BN // (FP8 and 8 or 4) + 24,
               ("%s and tile_n %d%s"):format(SPLIT and dim_text("head_dim_v", DVR, DV) or dim_text("head_dim", DR, FP8 and DV or D), BN,
                                             TWO and " with FP8's two accumulators" or ""),
               TWO and "O (both), S and P" or "O, S and P",
               TWO and "use fp8_flush -1 (never) or a smaller head dim" or "use a smaller tile_n or fewer warps")

  -- The layout tables: the accumulator and the register A operand.  FP8's
  -- A operand holds other columns than the accumulator: P takes each lane's
  -- own S values in the order p8_from_acc pairs them, and V^T's keys are
  -- permuted to match (sigma: lut.lua).
  local acc, qa, rows, p_from, sigma
  if FP8 then
    local function need(info, why)
      if not info then refuse(("the wgmma family: %s"):format(why)) end
      return info
    end
    acc = need(L.analyse(lut_acc, "the wgmma e4m3 accumulator"))
    qa = need(L.analyse(lut_a, "the wgmma 8-bit A operand"))
    rows = need(L.rows(acc, "the wgmma e4m3 accumulator"))
    local why
    p_from, sigma = L.p8_from_acc(qa, acc)
    if not p_from then refuse(("the wgmma family: P cannot become the FP8 A operand lane for lane: %s"):format(sigma or "")) end
  else
    acc, qa, rows, p_from = L.softmax_tables(lut_acc, lut_a, "wgmma", refuse)
  end

  -- The producer's rings (tma_ring.lua): Q (one slot a work tile), K and
  -- V (S slots); their barriers, then a dynamic walk's item barrier.
  local bars = TR.barriers("bars")
  local function ring(name, rows_, slots, cols)
    return TR.ring{ name = name, elem = ELEM, rows = rows_, cols = cols or D, slots = slots, arrivals = 4 * C,
                    smem = "s" .. name, map = "m" .. name, bars = bars }
  end
  local q, k = ring("q", BM, 1), ring("k", BN, S)
  -- V (DV columns), or FP8's V^T: DV rows of tile_n keys
  -- (V^T's rows are whole 128-key boxes: a 160- to 256-key tile loads
  -- 256 keys, P V reads its first tile_n.)
  local v = FP8 and TR.ring{ name = "v", elem = ELEM, rows = DV, cols = (BN + 127) // 128 * 128, slots = S, arrivals = 4 * C,
                             smem = "sv", map = "mv", bars = bars } or ring("v", BN, S, DV)
  local ITEM = DYNAMIC and bars.at(("%du"):format(bars.take(1))) or nil

  -- Shared memory: Q, the K and V rings, 1024-byte aligned, then the
  -- barriers; 1024 bytes of slack align the base.
  local OFF_Q = B.region("q", q.bytes, 1024)
  local OFF_K = B.region("k", k.bytes, 1024)
  local OFF_V = B.region("v", v.bytes, 1024)
  -- O leaves through shared memory where a consumer warp's 16 rows of 64
  -- columns (pieces.lua's STAGE_WARP: epilogue_regs.cuh's stage) fit beside the
  -- rings in sm_90's 227 KB: whole 128-byte row segments instead of 4-byte
  -- pairs; and only where each lane's slots stay in its warp's 16 rows and
  -- a tile's 16 columns.
  local STAGE_WARP = PC.STAGE_WARP
  local STAGE_BYTES = STAGE_WARP * 4 * C
  local STAGED = B.fits(STAGE_BYTES + 8 * bars.count)
  for lane = 0, 31 do
    for s = 0, acc.slots - 1 do
      local r, c = acc.base[lane][1] + acc.drow[s], acc.base[lane][2] + acc.dcol[s]
      if r < 0 or r >= 16 or c < 0 or c >= 16 then STAGED = false end
    end
  end
  local OFF_STAGE = STAGED and B.region("o_stage", STAGE_BYTES, 16) or nil
  local OFF_BAR = B.region("barriers", 8 * bars.count, 8)
  meta.symbol = symbol
  meta.threads = THREADS
  meta.smem_bytes = B.total()
  meta.rows_per_block = BM
  meta.tma = 1
  -- 2: a dynamic walk, whose counter (Params::work[0]) the host zeroes;
  -- Params::work[4 + 4 block ...] holds each block's current item record.
  meta.persistent = DYNAMIC and 2 or PERSISTENT and 1 or 0
  meta.isolate = 1  -- NVRTC 13.0's PTX compiler can crash on wgmma code

  local T = dtype  -- the wgmma forms' input type
  local frag = PC.regs{
    acc = acc, rows = rows, MR = 1, mrule = mrule, mods = mods,
    sl2 = FP8 and "sl2_t" or "sl2", p_shift = P_SHIFT, lazy = LAZY and LAZY > 0 and LAZY or nil,
    row0 = function(mi) return "m0 + wr + acc_r" end,
    head = function(r) return "blk.h" end,
  }
  local sched = { mrule = mrule, BM = BM, BN = BN, BMASK = BMASK, VL = VL, DYNAMIC = DYNAMIC, PERSISTENT = PERSISTENT }
  local function scheduler(part, extra)
    return PC.piece(include("scheduler.cuh", PC.with(PC.with(sched, extra or {}), { part = part, sched = sched })))
  end
  local loop = { q = q, k = k, v = v, D = D, DR = DR, DV = DV, BN = BN, S = S, C = C, T = T, KSTEP = KSTEP, pingpong = PINGPONG,
                 frag = frag, mods = mods, mrule = mrule, BMASK = BMASK, N0 = N0, acc = acc, rows = rows, p_from = p_from,
                 FP8 = FP8, FLUSH = FLUSH, TWO = TWO, user_expr = USER_EXPR }
  local function mainloop(part, extra)
    return PC.piece(include("mainloop_fwd.cuh", PC.with(PC.with(loop, extra or {}), { part = part })))
  end
%}
{{ include("common.cuh") }}
{{ include("block.cuh", { BM = BM, BN = BN, DYNAMIC = DYNAMIC, BMASK = BMASK, VL = VL }) }}
{% if mods.any then %}
{{ include("mods.cuh", { mods = mods, part = "decls" }) }}
{% end %}
{{ include("wgmma.cuh", { spin_limit = WGMMA_SPIN_LIMIT or 0, forms = {
     { t = T, n = BN, a = "ss", tb = 0, k = KSTEP }, { t = T, n = DV, a = "rs", tb = FP8 and 0 or 1, k = KSTEP } } }) }}
{{ B.comment() }}
// registers: producer {{ REGS[1] > 0 and REGS[1] or "as compiled" }}, consumers {{ REGS[2] }}
// pieces: tma_ring.lua (producer), scheduler.cuh, mainloop_fwd.cuh, score_regs.cuh, softmax_regs.cuh, epilogue_regs.cuh, budget.lua

// From the accumulator table: each lane's base (row | col << 4); slot s adds
// (drow, dcol) = {% for s = 0, acc.slots - 1 do %}({{ acc.drow[s] }}, {{ acc.dcol[s] }}){{ s < acc.slots - 1 and " " or "" }}{% end %}; register 8j + s of
// a warp's slice sits 16j columns on.
__constant__ unsigned char fj_base_acc[32] = { {{ L.base_bytes(acc) }} };

namespace fj {
// A tensor map (CUtensorMap): 128 opaque bytes the host encodes.
struct __align__(64) TensorMap { unsigned long long opaque[16]; };
struct TensorMaps { TensorMap q, k, v; };

// Two floats as the A-operand register of two 16-bit elements (the first low).
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  const elem2_t e = to_elem2(lo, hi);
  return *reinterpret_cast<const unsigned *>(&e);
}

// The shared-space base, rounded up to 1024 bytes (the swizzle's period).
__device__ __forceinline__ unsigned smem_base(const void *p) {
  return (smem_opaque(p) + 1023u) & ~1023u;
}
{{ scheduler("device") }}
}  // namespace fj

extern "C" __global__ void __launch_bounds__({{ THREADS }}, 1)
{{ symbol }}(const fj::Params p, const __grid_constant__ fj::TensorMaps maps{{ mods.kernel_param }}) {
  using fj::elem_t;
  extern __shared__ __align__(1024) unsigned char smem[];
  const unsigned base = fj::smem_base(smem);
  const unsigned sq = base + {{ OFF_Q }}, sk = base + {{ OFF_K }}, sv = base + {{ OFF_V }};
  // Barriers (tma_ring.lua): Q's full and empty, then K's full and empty
  // and V's per ring slot.  The ring runs on across the work tiles a block
  // takes: K/V tile number `it` (counted over the block's life) lives in
  // slot it % S with phase parity (it / S) & 1.
  const unsigned bars = base + {{ OFF_BAR }};
  {{ PC.indent(TR.decls({ q, k, v }, bars), 2) }}
{% if DYNAMIC then %}
  // A dynamic walk's item barrier (the producer's arrival: the record is written).
  const unsigned bar_item = {{ ITEM }};
{% end %}
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4;
{{ scheduler("walk") }}

  if (threadIdx.x == 0) {
    {{ PC.indent(TR.init({ q, k, v }, DYNAMIC and { { "bar_item", 1 } } or nil), 4) }}
  }
  __syncthreads();

  // Each warpgroup's role is one branch of this if/else, so that ptxas
  // applies setmaxnreg (it ignores it otherwise).
  if (wg == 0) {
    // ---- producer: one thread issues every load --------------------------
{% if REGS[1] > 0 then %}
    fj::regs_down<{{ REGS[1] }}>();
{% end %}
    if (warp == 0 && lane == 0) {
      const void *mq = &maps.q, *mk = &maps.k, *mv = &maps.v;
{% if VL then %}
      // Packed sequences are batch 0 of their tensor, from their first row.
      const bool packed_q = p.cu_seqlens_q != nullptr, packed_kv = p.cu_seqlens_kv != nullptr;
{% end %}
      unsigned it = 0;
{{ scheduler("producer_walk", { free = q.wait_empty(0, "(kq & 1u) ^ 1u") }) }}
{% if VL then %}
        const int q_row = (int)seq.q_row0 + m0, q_b = packed_q ? 0 : blk.b;
        const int kv_row = (int)seq.kv_row0, kv_b = packed_kv ? 0 : blk.b;
{% else %}
        const int q_row = m0, q_b = blk.b, kv_row = 0, kv_b = blk.b;
{% end %}
{{ mainloop("producer_tile", { q_waited = DYNAMIC }) }}
      }
    }
  } else {
  // ---- consumers ----------------------------------------------------------
{% if REGS[1] > 0 then %}
  fj::regs_up<{{ REGS[2] }}>();
{% end %}
{{ mainloop("consumer_setup") }}
{{ scheduler("consumer_walk") }}
{{ mainloop("consumer_tile") }}
{{ scheduler("consumer_next") }}

  // O = O / l and the log-sum-exp (epilogue_regs.cuh); FP8 attention's
  // max |O| where p.o_amax asks, and an e4m3 O's scale.
  elem_t *o_out = fj::head_rows<elem_t>(p.o, p.o_stride, blk.b, blk.h){{ VL and " + seq.q_row0 * p.o_stride[2]" or "" }};
{% if O8 then %}
  const float o_scale = p.o_scale ? *p.o_scale : 1.f;
{% end %}
{{ include("epilogue_regs.cuh", PC.with(frag, {
     ND = DV // 16, cols = DVR < DV and DVR or nil, out_scale = FP8 and "p.v_scale[fj::scale_at(p, blk.b, blk.hk)]" or "1.f", out_elem = FP8 and (O8 and 1 or 2) or ELEM, rows_end = VL and "len_q" or nil,
     amax = FP8 and "p.o_amax" or nil, post_scale = O8 and "o_scale" or nil,
     sinks = mods.sinks,
     stage = STAGED and { addr = ("(base + %du + (cw * 4 + warp %% 4) * %du)"):format(OFF_STAGE, STAGE_WARP),
                          row0 = "m0 + wr", lrow = "acc_r" } or nil,
     O = function(mi, d, i) return ("o[%s][%d]"):format(d, i) end })) }}
  }
  }
{{ mainloop("consumer_end") }}
#undef FJ_TILES
#undef FJ_BLOCK
{{ TR.undefs({ q, k, v }) }}
}
{% if mods.any then %}
{{ include("mods.cuh", { mods = mods, part = "defs" }) }}
{% end %}
{% if FP8 then %}

// FP8 attention's V^T: V of one (batch, KV head), 128 keys by 64 of the
// head dim a block, transposed through shared memory into the workspace
// ([batch][heads_kv][head_dim][vt_keys] bytes), the keys of each 32 in the
// order the P operand takes them: column c holds key 32 (c / 32) +
// sigma[c % 32] (lut.lua's p8_from_acc).  Keys past seq_kv are 0.
// Shared memory holds the tile as [key][16 words of 4 dims], word w of key
// k at w ^ fj_vt_swz(k) (the reads below then meet at most two to a bank);
// a thread reads the 8 keys of 8 adjacent columns at 4 dims and writes
// them as 4 rows of 8 bytes after two 4 x 4 byte transposes (a warp's
// 32 threads: two rows' 128 bytes).
__device__ __forceinline__ int fj_vt_swz(int k) { return ((k >> 1) ^ ((k >> 5) << 2)) & 15; }

extern "C" __global__ void __launch_bounds__(256) {{ symbol }}_vt(const fj::Params p) {
  __shared__ __align__(16) unsigned t[128 * 16];
  const int b = blockIdx.z / p.heads_kv, hk = blockIdx.z % p.heads_kv;
  const int n0 = blockIdx.x * 128, d0 = blockIdx.y * 64;
  const unsigned char *v = static_cast<const unsigned char *>(p.v) + b * p.v_stride[0] + hk * p.v_stride[1] + d0;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int c = threadIdx.x + 256 * j, r = c / 4, q = c % 4;
    uint4 x = make_uint4(0u, 0u, 0u, 0u);
    if (n0 + r < p.seq_kv) x = *reinterpret_cast<const uint4 *>(v + (long long)(n0 + r) * p.v_stride[2] + q * 16);
    const int sw = fj_vt_swz(r);
    t[r * 16 + ((4 * q) ^ sw)] = x.x; t[r * 16 + ((4 * q + 1) ^ sw)] = x.y;
    t[r * 16 + ((4 * q + 2) ^ sw)] = x.z; t[r * 16 + ((4 * q + 3) ^ sw)] = x.w;
  }
  __syncthreads();
  const int dq = threadIdx.x / 16, cc = threadIdx.x % 16;  // dims 4 dq.., columns 8 cc..
  // Column 8 cc + j's key within its 32: sigma[8 (cc % 4) + j], the four
  // choices of each j packed in one word (immediates once unrolled).
  const unsigned keys_of[8] = { {% for j = 0, 7 do %}{{ ("0x%08xu"):format(sigma[j] | sigma[8 + j] << 8 | sigma[16 + j] << 16 | sigma[24 + j] << 24) }}{{ j < 7 and ", " or "" }}{% end %} };
  unsigned a[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int key = 32 * (cc / 4) + (int)((keys_of[j] >> (8 * (cc % 4))) & 0xffu);
    a[j] = t[key * 16 + (dq ^ fj_vt_swz(key))];
  }
  unsigned o[2][4];
#pragma unroll
  for (int g = 0; g < 2; ++g) {
    // Four keys' 4 dims each (byte i: dim i) into 4 dims' 4 keys each.
    const unsigned t0 = __byte_perm(a[4 * g], a[4 * g + 1], 0x5140), t1 = __byte_perm(a[4 * g], a[4 * g + 1], 0x7362);
    const unsigned u0 = __byte_perm(a[4 * g + 2], a[4 * g + 3], 0x5140), u1 = __byte_perm(a[4 * g + 2], a[4 * g + 3], 0x7362);
    o[g][0] = __byte_perm(t0, u0, 0x5410); o[g][1] = __byte_perm(t0, u0, 0x7632);
    o[g][2] = __byte_perm(t1, u1, 0x5410); o[g][3] = __byte_perm(t1, u1, 0x7632);
  }
  // head_dim (DR) rows a (batch, KV head), as the host lays them out (the
  // main kernel's boxes have as many rows: its DV).
  unsigned char *out = p.vt + ((long long)blockIdx.z * {{ DR }} + d0 + 4 * dq) * p.vt_keys + n0 + 8 * cc;
#pragma unroll
  for (int i = 0; i < 4; ++i)
    *reinterpret_cast<uint2 *>(out + (long long)i * p.vt_keys) = make_uint2(o[0][i], o[1][i]);
}
{% end %}
