{#
  attention_wgmma.cu: the Hopper family (sm_90a), FlashAttention-3 style.

  A thread block covers tile_m = 64 x C query rows of one (batch, head) with
  C consumer warpgroups and one producer warpgroup (warps = 4 (C + 1)):
    producer   one thread issues TMA loads: Q once, then K and V tile by
               tile into rings of `stages` slots.  Each slot has a "full"
               mbarrier (the producer's arrival plus the tile's bytes) and
               an "empty" one (one arrival per consumer warp); the
               producer's registers go to the consumers (setmaxnreg).
    consumers  each owns 64 rows.  S = Q K^T by wgmma from shared memory
               (both operands K-major), the online softmax on the S
               registers (softmax_regs.cuh), P converted in registers into
               the A operand, O += P V by wgmma with A from registers and V
               read MN-major (transposed) from shared memory.
  Overlap: S(t) = Q K(t) is issued before O += P(t - 1) V(t - 1), so the
  softmax of tile t runs while the tensor cores finish tile t - 1; O is
  rescaled once that product has landed.  With two or more consumer
  warpgroups they take turns to issue their products (ping-pong, named
  barriers), so one warpgroup's softmax runs under another's products.
  The grid is persistent: one block per multiprocessor walks the work tiles
  (block.cuh's order), and the producer loads the next tile's Q and K/V
  while the consumers finish the last products and the epilogue of this one.
  Tiles arrive in shared memory as panels of 64 columns in the 128-byte
  swizzle (wgmma.cuh); sequence tails come from the TMA's zero fill, and
  only tiles that cross the sequence end or the causal diagonal are
  masked.  varlen and block masks: the blocks claim work tiles from a
  counter (block.cuh's claim: sequences of unequal lengths, or lists of
  unequal lengths, make a static walk uneven).  The producer claims the
  next item (and reads its list's counts) while the consumers finish the
  last one, and hands it over
  through a record in the workspace and an "item" barrier; the consumers
  read the next record before the epilogue of the last tile, so that
  neither read waits at a tile's start.  A varlen tile reads its
  sequence's lengths and first rows (fj::seq_of).  Packed tensors are one batch of their total rows, so
  a box starts at the sequence's first row plus the tile's, and rows past
  the sequence (the next one's, or the TMA's zeros past the tensor) are
  masked keys or query rows never stored.  Which (row, column) each accumulator register holds, which lanes
  share a row and how S becomes the A operand come from the probed wgmma
  tables (lut.lua); the probe ran these very instructions and descriptors.
#}
{%
  local L = import("lut.lua")
  local VL = varlen
  -- A varlen tile's sequence lengths and mask offset are locals.
  local mrule = import("mask.lua").new(causal, false,
                                       VL and { q = "len_q", kv = "len_kv", off = "causal_off" } or nil,
                                       window)
  local mods = import("mods.lua").new{ score = score_mod, mask = mask_mod, params = mod_params,
                                       softcap = softcap, sinks = sinks, checked = checked,
                                       bounded = dtype == "bf16" }
  local D, BM, BN, S = head_dim, tile_m, tile_n, stages
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
  local PANELS = D // 64
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
  local PINGPONG = C >= 2 and D <= 128
  local function no(fmt, ...) refuse(fmt:format(...)) end

  if softmax ~= "regs" then
    no("softmax %s: the wgmma family keeps the softmax in registers (softmax regs)", softmax)
  end
  if swizzle ~= "xor" then
    no("swizzle %s: the wgmma family reads tiles in the 128-byte XOR swizzle that TMA writes (swizzle xor)", swizzle)
  end
  if D % 64 ~= 0 then
    no("head_dim %d is not implemented for the wgmma family: 64, 128, 192 or 256 (tiles are panels of 64 columns)", D)
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

  -- Registers: the producer gives its registers to the consumers.  Per
  -- consumer thread O (D/2), S (BN/2) and P (BN/4) stay live.
  local REGS = ({ [1] = { 0, 255 }, [2] = { 24, 240 }, [3] = { 32, 160 } })[C]
  -- A producer that walks a block mask's lists, claims its tiles and reads
  -- the next one's counts early holds more than 24 (ptxas spilled 16
  -- bytes there, and 8-20 at 32): 40, the consumers 232, exactly the 168 x
  -- 384 the block starts with.
  if C == 2 and BMASK then REGS = { 40, 232 } end
  local need = D // 2 + BN // 2 + BN // 4 + 24
  if need > REGS[2] then
    no("head_dim %d and tile_n %d need about %d registers per consumer thread for O, S and P; %d consumer warpgroups have %d (over by %d): use a smaller tile_n or fewer warps",
       D, BN, need, C, REGS[2], need - REGS[2])
  end

  -- The layout tables: the accumulator and the register A operand.
  local acc, qa, rows, p_from = L.softmax_tables(lut_acc, lut_a, "wgmma", refuse)
  local NC = #rows.classes

  -- Shared memory: Q, the K and V rings (each slot PANELS panels of 128-byte
  -- rows, 1024-byte aligned), then the barriers; 1024 bytes of slack to
  -- align the base.
  local plan, offset = {}, 0
  local function region(name, bytes, align)
    offset = (offset + align - 1) // align * align
    plan[#plan + 1] = { name = name, offset = offset, bytes = bytes }
    offset = offset + bytes
    return plan[#plan].offset
  end
  local Q_PANEL, KV_PANEL = BM * 128, BN * 128
  local KV_SLOT = PANELS * KV_PANEL
  local OFF_Q = region("q", PANELS * Q_PANEL, 1024)
  local OFF_K = region("k", S * KV_SLOT, 1024)
  local OFF_V = region("v", S * KV_SLOT, 1024)
  -- O leaves through shared memory where a consumer warp's 16 rows of 64
  -- columns (pieces.lua's STAGE_WARP: epilogue_regs.cuh's stage) fit beside the
  -- rings in sm_90's 227 KB: whole 128-byte row segments instead of 4-byte
  -- pairs; and only where each lane's slots stay in its warp's 16 rows and
  -- a tile's 16 columns.
  local BAR_BYTES = 8 * ((DYNAMIC and 3 or 2) + 4 * S)
  local PC = import("pieces.lua")
  local STAGE_WARP = PC.STAGE_WARP
  local STAGE_BYTES = STAGE_WARP * 4 * C
  local STAGE_O = true
  local STAGED = STAGE_O and offset + STAGE_BYTES + BAR_BYTES + 1024 <= 227 * 1024
  for lane = 0, 31 do
    for s = 0, acc.slots - 1 do
      local r, c = acc.base[lane][1] + acc.drow[s], acc.base[lane][2] + acc.dcol[s]
      if r < 0 or r >= 16 or c < 0 or c >= 16 then STAGED = false end
    end
  end
  local OFF_STAGE = STAGED and region("o_stage", STAGE_BYTES, 16) or nil
  -- (a dynamic walk's item barrier last)
  local OFF_BAR = region("barriers", BAR_BYTES, 8)
  meta.symbol = symbol
  meta.threads = THREADS
  meta.smem_bytes = offset + 1024
  meta.rows_per_block = BM
  meta.tma = 1
  -- 2: a dynamic walk, whose counter (Params::work[0]) the host zeroes;
  -- Params::work[4 + 4 block ...] holds each block's current item record.
  meta.persistent = DYNAMIC and 2 or PERSISTENT and 1 or 0
  meta.isolate = 1  -- NVRTC 13.0's PTX compiler can crash on wgmma code

  local T = dtype
  local with = PC.with
  local frag = PC.regs{
    acc = acc, rows = rows, MR = 1, mrule = mrule, mods = mods,
    row0 = function(mi) return "m0 + wr + acc_r" end,
    head = function(r) return "blk.h" end,
  }
  -- The head of a work tile, the same in the producer and the consumers
  -- (they must agree on every tile and count): the block, the number of
  -- work tiles started before it (kq, for Q's phase), the keys it sees.
  -- A dynamic walk passes the claimed item (kq is then the loop's count).
  local function tile_head(item, counts)
%}
        fj::Block blk;
{%   if item then %}
        fj::item_of(p, {{ item }}, blk);
{%   else %}
        FJ_BLOCK(blk);
{%   end %}
{%   if VL then %}
        // This tile's sequence{{ item and "" or "; tiles past its end have nothing to do" }}.
        const fj::Seq seq = fj::seq_of(p, blk.b);
        const int len_q = seq.len_q, len_kv = seq.len_kv;
        const int causal_off = {{ mrule.bottom_right and "len_kv - len_q" or "0" }};
        (void)causal_off;
{%     if not item then %}
        if (blk.m0 >= len_q) continue;
{%     end %}
{%   end %}
{%   if not item then %}
        const unsigned kq = (unsigned)k++;
{%   end %}
        const int m0 = blk.m0;
{%   if BMASK then %}
        // The key tiles the caller's block mask lists: partial blocks, then full ones.
        const fj::BlockList bl = fj::block_list(p, blk{{ counts and ", " .. counts or "" }});
        const int ntiles = bl.n * {{ BMASK.kv // BN }};
{%   else %}
        // Keys this block can see: all of them, or up to its last row's diagonal{{ mrule.window and " or window, from the window's left side of its first row" or "" }}.
        const int n_end = {{ mrule.keys_end("m0 + " .. BM) }};
        const int t_first = {{ mrule.keys_begin("m0") }} / {{ BN }};
        const int ntiles = n_end > t_first * {{ BN }} ? (n_end - t_first * {{ BN }} + {{ BN - 1 }}) / {{ BN }} : 0;
{%   end %}
{%
  end
%}
{{ include("common.cuh") }}
{{ include("block.cuh", { BM = BM, BN = BN, DYNAMIC = DYNAMIC, BMASK = BMASK, VL = VL }) }}
{% if mods.any then %}
{{ include("mods.cuh", { mods = mods, part = "decls" }) }}
{% end %}
{{ include("wgmma.cuh", { spin_limit = WGMMA_SPIN_LIMIT or 0, forms = {
     { t = T, n = BN, a = "ss", tb = 0 }, { t = T, n = D, a = "rs", tb = 1 } } }) }}
// shared memory: {{ meta.smem_bytes }} bytes{% for _, r in ipairs(plan) do %}; {{ r.name }} @{{ r.offset }}{% end %} (+ alignment)
// registers: producer {{ REGS[1] > 0 and REGS[1] or "as compiled" }}, consumers {{ REGS[2] }}

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
{% if DYNAMIC then %}

// The work item the producer hands the consumers: the block's record
// after the counter in the workspace (16 bytes at p.work + 4 + 4 block):
// the item, then with a block mask its list's counts (partial, all).
// Stored before the item barrier is arrived on (a release) and read after
// it is waited for (an acquire).  Global rather than shared memory:
// compute-sanitizer's racecheck does not see an mbarrier order
// shared-memory stores.
struct Item { int w, np, n, pad; };
__device__ __forceinline__ void put_item(const Params &p, int w, int np, int n) {
  asm volatile("st.volatile.global.v4.b32 [%0], { %1, %2, %3, %4 };\n"
               :: "l"(p.work + 4 + 4 * blockIdx.x), "r"(w), "r"(np), "r"(n), "r"(0) : "memory");
}
__device__ __forceinline__ Item get_item(const Params &p) {
  Item it;
  asm volatile("ld.volatile.global.v4.b32 { %0, %1, %2, %3 }, [%4];\n"
               : "=r"(it.w), "=r"(it.np), "=r"(it.n), "=r"(it.pad) : "l"(p.work + 4 + 4 * blockIdx.x) : "memory");
  return it;
}
{% end %}
}  // namespace fj

extern "C" __global__ void __launch_bounds__({{ THREADS }}, 1)
{{ symbol }}(const fj::Params p, const __grid_constant__ fj::TensorMaps maps{{ mods.kernel_param }}) {
  using fj::elem_t;
  extern __shared__ __align__(1024) unsigned char smem[];
  const unsigned base = fj::smem_base(smem);
  const unsigned sq = base + {{ OFF_Q }}, sk = base + {{ OFF_K }}, sv = base + {{ OFF_V }};
  // Barriers: Q full and Q empty, then full K, empty K, full V, empty V per
  // ring slot.  The ring runs on across the work tiles a block takes: K/V
  // tile number `it` (counted over the block's life) lives in slot it % S
  // with phase parity (it / S) & 1.
  const unsigned bar_q = base + {{ OFF_BAR }}, q_empty = bar_q + 8u;
{% if DYNAMIC then %}
  // A dynamic walk's item barrier (the producer's arrival: the record is written).
  const unsigned bar_item = bar_q + {{ 8 * (2 + 4 * S) }}u;
{% end %}
#define FJ_FULL_K(i) (bar_q + 8u * (2u + (i)))
#define FJ_EMPTY_K(i) (bar_q + 8u * (2u + {{ S }}u + (i)))
#define FJ_FULL_V(i) (bar_q + 8u * (2u + {{ 2 * S }}u + (i)))
#define FJ_EMPTY_V(i) (bar_q + 8u * (2u + {{ 3 * S }}u + (i)))
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4;
{% if DYNAMIC then %}
  // A dynamic walk: the producer claims each work item (block.cuh's claim)
  // and hands it to the consumers through the item barrier (fj::put_item);
  // -1 ends the walk.
{% elseif PERSISTENT then %}
  // A persistent grid (block.cuh's tile order): every warpgroup walks the
  // same tiles, so producer and consumers agree without talking.
  const int total = fj::pairs_total(p);
  int k = 0;  // work tiles this block has started
#define FJ_TILES for (int pair = blockIdx.x; pair < total; pair += gridDim.x) for (int half = 0; half < 2; ++half)
#define FJ_BLOCK(blk) if (!fj::tile_of(p, pair, half, blk)) continue
{% else %}
  int k = 0;
#define FJ_TILES for (int once = 0; once < 1; ++once)
#define FJ_BLOCK(blk) blk = fj::block_of(p)
{% end %}

  if (threadIdx.x == 0) {
    fj::mbar_init(bar_q, 1);
    fj::mbar_init(q_empty, {{ 4 * C }});
{% if DYNAMIC then %}
    fj::mbar_init(bar_item, 1);
{% end %}
#pragma unroll
    for (int i = 0; i < {{ S }}; ++i) {
      fj::mbar_init(FJ_FULL_K(i), 1);
      fj::mbar_init(FJ_EMPTY_K(i), {{ 4 * C }});
      fj::mbar_init(FJ_FULL_V(i), 1);
      fj::mbar_init(FJ_EMPTY_V(i), {{ 4 * C }});
    }
    fj::mbar_init_fence();
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
{% if DYNAMIC then %}
      for (unsigned kq = 0;; ++kq) {
        const int w = fj::claim(p);
{% if BMASK then %}
        // The item's list counts are read while the consumers finish the
        // last item; the end (-1) reads item 0's, unused.  Only the counts
        // wait (with its first key tile too ptxas spilled 8 bytes at 40
        // registers).
        int np, n;
        {
          fj::Block b0;
          fj::item_of(p, w < 0 ? 0 : w, b0);
          const fj::BlockList l0 = fj::block_list(p, b0);
          np = l0.np;
          n = l0.n;
        }
{% end %}
        // Q's buffer and the item record are free once every consumer warp
        // has finished its last S of the previous work tile.
        fj::mbar_wait(q_empty, (kq & 1u) ^ 1u);
        fj::put_item(p, w, {{ BMASK and "np, n" or "0, 0" }});
        fj::mbar_arrive(bar_item);
        if (w < 0) break;
{% tile_head("w", BMASK and "np, n" or nil) %}
{% else %}
      FJ_TILES {
{% tile_head() %}
{% end %}
{% if VL then %}
        const int q_row = (int)seq.q_row0 + m0, q_b = packed_q ? 0 : blk.b;
        const int kv_row = (int)seq.kv_row0, kv_b = packed_kv ? 0 : blk.b;
{% else %}
        const int q_row = m0, q_b = blk.b, kv_row = 0, kv_b = blk.b;
{% end %}
{% if not DYNAMIC then %}
        // Q's buffer is free once every consumer warp has finished its last
        // S of the previous work tile (at once for the first).
        fj::mbar_wait(q_empty, (kq & 1u) ^ 1u);
{% end %}
        fj::mbar_expect(bar_q, {{ BM * D * 2 }}u);
#pragma unroll
        for (int pn = 0; pn < {{ PANELS }}; ++pn)
          fj::tma_load4(sq + pn * {{ Q_PANEL }}, mq, bar_q, pn * 64, q_row, blk.h, q_b);
        for (int t = 0; t < ntiles; ++t, ++it) {
          const unsigned slot = it % {{ S }}u, ph = (it / {{ S }}u) & 1u;
          // A slot is free once every consumer warp has released it; in the
          // first round the "preceding phase" test passes at once.
          fj::mbar_wait(FJ_EMPTY_K(slot), ph ^ 1u);
          fj::mbar_expect(FJ_FULL_K(slot), {{ BN * D * 2 }}u);
#pragma unroll
          for (int pn = 0; pn < {{ PANELS }}; ++pn)
            fj::tma_load4(sk + slot * {{ KV_SLOT }} + pn * {{ KV_PANEL }}, mk, FJ_FULL_K(slot), pn * 64, kv_row + {{ N0("t") }}, blk.hk, kv_b);
          fj::mbar_wait(FJ_EMPTY_V(slot), ph ^ 1u);
          fj::mbar_expect(FJ_FULL_V(slot), {{ BN * D * 2 }}u);
#pragma unroll
          for (int pn = 0; pn < {{ PANELS }}; ++pn)
            fj::tma_load4(sv + slot * {{ KV_SLOT }} + pn * {{ KV_PANEL }}, mv, FJ_FULL_V(slot), pn * 64, kv_row + {{ N0("t") }}, blk.hk, kv_b);
        }
      }
    }
  } else {
  // ---- consumers ----------------------------------------------------------
{% if REGS[1] > 0 then %}
  fj::regs_up<{{ REGS[2] }}>();
{% end %}
  const int cw = wg - 1;                       // this consumer warpgroup
  const int wr = cw * 64 + (warp % 4) * 16;    // this warp's first row in the tile
  const int acc_r = fj_base_acc[lane] & 15, acc_c = fj_base_acc[lane] >> 4;
{% if mods.score then %}
  // A score function sees the scaled score, so the softmax works on its
  // results in natural units (mods.lua: with the softcap alone, the cap
  // folded into both scales).
  const float qk_scale = {{ mods.qk_scale("p.scale_log2 * 0.69314718056f") }};
  const float sl2 = {{ mods.sl2 }};
{% else %}
  const float sl2 = p.scale_log2;
{% end %}
  // Descriptors: Q's 64 rows of this warpgroup (K-major, k16 steps 32 bytes
  // apart within a panel), K (K-major) and V (MN-major, panels
  // {{ KV_PANEL }} bytes apart) of a ring slot.
  const unsigned qa = sq + cw * 64 * 128;
#define FJ_Q_DESC(kk) fj::wg_desc(qa + ((kk) / 4) * {{ Q_PANEL }} + ((kk) % 4) * 32, 16, 1024)
#define FJ_K_DESC(slot, kk) fj::wg_desc(sk + (slot) * {{ KV_SLOT }} + ((kk) / 4) * {{ KV_PANEL }} + ((kk) % 4) * 32, 16, 1024)
#define FJ_V_DESC(slot, kk) fj::wg_desc(sv + (slot) * {{ KV_SLOT }} + (kk) * 2048, {{ KV_PANEL }}, 1024)
{% if PINGPONG then %}
  // Ping-pong: the consumer warpgroups take turns to issue their products
  // (named barrier 1 + w is warpgroup w's turn), so one's softmax runs
  // while another's products occupy the tensor cores.  Warpgroup 0 starts.
  if (cw == {{ C - 1 }}) fj::bar_arrive(1, {{ 256 }});
#define FJ_TURN_TAKE() fj::bar_sync(1 + cw, 256)
#define FJ_TURN_PASS() fj::bar_arrive(1 + (cw + 1) % {{ C }}, 256)
{% else %}
#define FJ_TURN_TAKE() ((void)0)
#define FJ_TURN_PASS() ((void)0)
{% end %}

  float o[{{ D // 16 }}][8];
  float s[{{ BN // 16 }}][8];
  unsigned pk[{{ BN // 16 }}][4];
  float row_m[1][{{ NC }}], row_l[1][{{ NC }}];
  unsigned it = 0;
{%
  -- S = Q K(slot)^T, issued (not waited for).
  local function qk(slot)
%}
    fj::wg_fence();
#pragma unroll
    for (int kk = 0; kk < {{ D // 16 }}; ++kk) fj::wg_ss_{{ T }}_{{ BN }}(s, FJ_Q_DESC(kk), FJ_K_DESC({{ slot }}, kk), kk);
    fj::wg_commit();
{%
  end
  -- O += P V(slot), issued.
  local function pv(slot)
%}
    fj::wg_fence();
#pragma unroll
    for (int kk = 0; kk < {{ BN // 16 }}; ++kk) fj::wg_rs_{{ T }}_{{ D }}_t(o, pk[kk], FJ_V_DESC({{ slot }}, kk), 1);
    fj::wg_commit();
{%
  end
  -- Compiler fences on registers a wgmma owns (wgmma.cuh's wg_hold).
  local function hold(name, n)
%}
#pragma unroll
    for (int j = 0; j < {{ n }}; ++j)
#pragma unroll
      for (int i = 0; i < 8; ++i) fj::wg_hold({{ name }}[j][i]);
{%
  end
  -- The online softmax of S for key tile t (at n0); rescale: O now, or
  -- (false) the factors kept in alpha for after the pending P V.
  local function softmax(t, rescale)
%}
{%   if BMASK then %}
    const bool bm_part = fj::list_partial(bl, {{ t }});  // the mask expression applies
    (void)bm_part;
{%   end %}
    const bool need_mask = {{ mrule.tile_partial("n0", BN, "m0 + cw * 64", "m0 + cw * 64 + 63") }};
{{ PC.softmax_step(with(frag, {
     NJ = BN // 16, mask = "branch",
     S = function(mi, j, i) return ("s[%s][%d]"):format(j, i) end,
     alpha = function(mi, c) return ("alpha[%d]"):format(c - 1) end, rescaled = not rescale and "resc" or nil,
     rescale = rescale and { ND = D // 16, O = function(mi, d, i) return ("o[%s][%d]"):format(d, i) end } or nil })) }}
{%
  end
  -- P as A-operand registers: register r of k-step j holds A slots 2r and
  -- 2r + 1, which are accumulator slots p_from[2r] and p_from[2r + 1] of
  -- S's tile j (lut.lua).
  local function pack()
%}
#pragma unroll
    for (int j = 0; j < {{ BN // 16 }}; ++j) {
{%   for r = 0, 3 do %}
      pk[j][{{ r }}] = fj::pack2(s[j][{{ p_from[2 * r] }}], s[j][{{ p_from[2 * r + 1] }}]);
{%   end %}
    }
{%
  end
  -- A ring slot released by this warp (its part of the product is done).
  local function release(bar)
%}
    __syncwarp();
    if (lane == 0) fj::mbar_arrive({{ bar }});
{% end %}

{% if DYNAMIC then %}
  fj::mbar_wait(bar_item, 0u);
  fj::Item item = fj::get_item(p);
  for (unsigned kq = 0;; ++kq) {
  const int w = item.w;
  if (w < 0) break;
{% tile_head("w", BMASK and "item.np, item.n" or nil) %}
{% else %}
  FJ_TILES {
{% tile_head() %}
{% end %}
#pragma unroll
  for (int d = 0; d < {{ D // 16 }}; ++d)
#pragma unroll
    for (int i = 0; i < 8; ++i) o[d][i] = 0.f;
#pragma unroll
  for (int c = 0; c < {{ NC }}; ++c) { row_m[0][c] = FJ_NEG_INF; row_l[0][c] = 0.f; }

  fj::mbar_wait(bar_q, kq & 1u);
  if (ntiles == 0) {
{% release("q_empty") %}
  } else {
    // Tile 0: S, the softmax, P.
    const int n0 = {{ N0("0") }};
    const unsigned slot = it % {{ S }}u;
    fj::mbar_wait(FJ_FULL_K(slot), (it / {{ S }}u) & 1u);
    FJ_TURN_TAKE();
{% qk("slot") %}
    FJ_TURN_PASS();
    fj::wg_wait<0>();
{% hold("s", BN // 16) %}
{% release("FJ_EMPTY_K(slot)") %}
    if (ntiles == 1) {
{% release("q_empty") %}
    }
{% softmax("0", true) %}
{% pack() %}
  }
  for (int t = 1; t < ntiles; ++t) {
    const int n0 = {{ N0("t") }};
    const unsigned cur = it + t, prev = cur - 1;
    const unsigned slot = cur % {{ S }}u, pslot = prev % {{ S }}u;
    // S(t) and O += P(t - 1) V(t - 1) in flight together; the softmax of
    // S(t) runs while the second finishes.
    fj::mbar_wait(FJ_FULL_K(slot), (cur / {{ S }}u) & 1u);
    FJ_TURN_TAKE();
{% qk("slot") %}
    fj::mbar_wait(FJ_FULL_V(pslot), (prev / {{ S }}u) & 1u);
{% pv("pslot") %}
    FJ_TURN_PASS();
    fj::wg_wait<1>();
{% hold("s", BN // 16) %}
{% release("FJ_EMPTY_K(slot)") %}
    if (t == ntiles - 1) {
{% release("q_empty") %}
    }
    float alpha[{{ NC }}];
    bool resc;
{% softmax("t", false) %}
    fj::wg_wait<0>();
{% hold("o", D // 16) %}
{% release("FJ_EMPTY_V(pslot)") %}
    // Not under the softcap's fixed shift (softmax_regs.cuh's `rescaled`).
    if (resc)
#pragma unroll
    for (int d = 0; d < {{ D // 16 }}; ++d) {
{% for i = 0, acc.slots - 1 do %}
      o[d][{{ i }}] *= alpha[{{ rows.class_of[i] - 1 }}];
{% end %}
    }
{% pack() %}
  }
  if (ntiles > 0) {
    // The last tile's O += P V.
    const unsigned last = it + ntiles - 1, lslot = last % {{ S }}u;
    fj::mbar_wait(FJ_FULL_V(lslot), (last / {{ S }}u) & 1u);
    FJ_TURN_TAKE();
{% pv("lslot") %}
    FJ_TURN_PASS();
    fj::wg_wait<0>();
{% hold("o", D // 16) %}
{% release("FJ_EMPTY_V(lslot)") %}
  }
  it += ntiles;
{% if DYNAMIC then %}
  // The next item, read now so that the read's latency hides under this
  // tile's epilogue: its record is written once every consumer warp has
  // released Q (this tile's last S), and the item barrier says so.
  fj::mbar_wait(bar_item, (kq + 1u) & 1u);
  item = fj::get_item(p);
{% end %}

  // O = O / l and the log-sum-exp (epilogue_regs.cuh).
  elem_t *o_out = fj::head_rows<elem_t>(p.o, p.o_stride, blk.b, blk.h){{ VL and " + seq.q_row0 * p.o_stride[2]" or "" }};
{{ include("epilogue_regs.cuh", with(frag, {
     ND = D // 16, out_scale = "1.f", rows_end = VL and "len_q" or nil,
     sinks = mods.sinks,
     stage = STAGED and { addr = ("(base + %du + (cw * 4 + warp %% 4) * %du)"):format(OFF_STAGE, STAGE_WARP),
                          row0 = "m0 + wr", lrow = "acc_r" } or nil,
     O = function(mi, d, i) return ("o[%s][%d]"):format(d, i) end })) }}
  }
  }
#undef FJ_TILES
#undef FJ_BLOCK
#undef FJ_TURN_TAKE
#undef FJ_TURN_PASS
#undef FJ_FULL_K
#undef FJ_EMPTY_K
#undef FJ_FULL_V
#undef FJ_EMPTY_V
#undef FJ_Q_DESC
#undef FJ_K_DESC
#undef FJ_V_DESC
}
{% if mods.any then %}
{{ include("mods.cuh", { mods = mods, part = "defs" }) }}
{% end %}
