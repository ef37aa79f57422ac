{#
  attention_bwd_wgmma.cu: the backward's main kernel on wgmma (sm_90a),
  FlashAttention-3 style: warp-specialised, TMA rings, products on
  wgmma with P and dS as register operands.

  A block keeps one key tile of tile_n = 128 keys of one (batch, KV head)
  -- K and V, loaded once -- and walks, for each query head of the KV
  head's group, the query tiles of tile_m = 64 rows that see the key tile
  (scheduler.cuh's kv_head: mask.lua's query range of a key tile).  A
  producer warpgroup (one thread) loads Q and dO of each step into rings
  of 2 slots (tma_ring.lua), with the rows' LSE * log2(e) and delta (bulk
  copies from the preprocess's padded rows, on Q's barrier).  Two consumer
  warpgroups each own 64 of the keys and compute, transposed so that the
  keys are the products' rows (M):
    S^T = K Q^T, dP^T = V dO^T            wgmma, both operands in shared memory;
                                          at head dim 64 K and V from
                                          registers (KV_REGS: the
                                          warpgroup's 64 keys of each
                                          loaded once as A operands)
    the score step on S^T                 softcap; mask.lua's rule per element
    P^T = exp2(S^T sl2 - LSE2[query])     (rows that see no key: LSE2 = +inf)
    dV += P^T dO                          P^T as the register A operand
    dS^T = P^T (dP^T - delta[query]) [(1 - tanh^2) under a softcap]
    dK += dS^T Q                          dS^T as the register A operand
    dS^T to shared memory                 [key][query], 128-byte swizzle
    dQ += dS K                            dS read transposed (MN-major A);
                                          staged in shared memory, then
                                          added by the producer's second
                                          warp (the dQ writer): one TMA
                                          bulk reduce-add (float32) a
                                          64 x 64 tile into g.dq_acc (the
                                          postprocess scales)
  dQ is split between the consumers by columns (each D/2, whole panels of
  64) or, where half the head dim is not a whole panel, by turns (the
  consumer of the step's parity does all of it), so each step's dS is
  written by both before either reads it: named barrier 1 and two dS
  buffers.  Each consumer's dQ staging buffer passes to the writer and back
  through a pair of mbarriers (full: staged; empty: read by the TMA unit),
  so the consumers never wait on a reduce-add.  In the deterministic mode
  (g.deterministic) the writer adds a tile only in its key tile's turn
  (scheduler.cuh's kv_rank: later key tiles first under a causal mask or
  a window's right side, earlier ones first otherwise -- or, with
  g.deterministic 2 where ROT holds, in the order a rotation of the walks
  brings them (ROT below), or with g.deterministic 3 under a mask with a
  right side, earlier ones first over a descending walk (DESC below);
  bwd_common.cuh's dq_turn_wait) and passes the turn on once the add has
  completed.  Blocks start in bwd_common.cuh's
  kv_tile order (first key tiles first: the longest walks under a causal
  mask, a section at a time).  dK (times the softmax scale) and dV stay in registers over the
  walk, summed over the group's query heads, so GQA needs no reduction.
  Which (row, column) each accumulator register holds and how it becomes
  the A operand come from the probed wgmma tables (lut.lua).
  compute-sanitizer's racecheck reports the bulk copies of a slot's LSE2
  and delta against the consumers' reads of the rows the slot held before:
  it does not follow the mbarriers' order (the reads precede the
  consumers' arrivals on the slot's empty barrier, the copies follow the
  producer's wait on it), as with the forward's shared-memory handoffs.
  Varlen (cu_seqlens_q / _kv, seqused_kv): a block keeps a key tile of
  its own sequence, whose rows TMA loads from the sequence's first (rows
  past its end, of the next sequence or past total, are masked: keys by
  the mask rule on the sequence's lengths, queries by their LSE2 +inf in
  the workspace's padded rows).
  Head dims that are not whole 64-column panels run padded (DR, the head
  dim rounded up to 64): TMA reads zeros past the head dim into the
  panels, S^T and dP^T take only the k steps that hold it, dK and dV are
  stored only over it.
  Wide heads (DR 192 and 256): dK and dV of 64 keys take DR registers a
  thread, more than a consumer has beside S^T and dP^T, so the two
  consumers split the step by role over one key tile of tile_n = 64:
    consumer 0: S^T, P^T, dV += P^T dO    (dV in registers)
    consumer 1: dP^T, dS^T, dK += dS^T Q  (dK in registers)
  P^T (times the softcap's 1 - tanh^2: the factor dS^T takes) passes from
  consumer 0 to consumer 1 through shared memory, float32, each thread's
  values at its own places (the two accumulators' layouts are the same),
  behind named barrier 1; dS^T is written by consumer 1 and read by both
  for dQ behind named barriers 2 and 4 (each consumer arrives at the one
  the other waits at; one dS^T buffer: neither consumer starts the next
  step's before both have passed barrier 1 again).  dQ goes by
  columns (consumer 0 the first 128, consumer 1 the rest; 64 columns at a
  time), each consumer adding its part into g.dq_acc from its registers
  (red.global.add.v4.f32 in the permuted tiles of bwd_common.cuh's
  dq_tile_off4: no staging buffer fits beside the rings); in the
  deterministic mode each consumer warp adds its rows of a dQ tile in its
  key tile's turn (kv_rank, as the writer does; a turn counts four warps)
  and passes the turn on at once or, where the next key tile in the
  order is a step or more behind (a mask's right side, the rotation), a
  step late, when its additions are complete (pass_turns).  Each role
  walks the steps in a loop of its own.
  The pair (tile_n 128 at head dims above 128, PAIR; the host takes it
  there without a window or a block mask: src/backward.c's pair_ok): a
  cluster of two
  blocks splits a key tile of 128, 64 keys each (block rank r, kv_tile's
  width 2), both walking the query range of the whole tile, so that each
  adds dQ over all 128 keys for half of its columns -- half the float32
  additions of one block per key tile of 64.  Per step, consumer 1 copies
  its dS^T into the other block's ds_in (one bulk copy, counted on that
  block's in_full barrier, which its own consumer 1 expects), and consumer
  c adds columns 128 r + 64 c: dS K over its own keys, then, once in_full
  completes, over the other's (their columns of this half loaded once
  into k_peer; at head dims 129-192, three panels, block 1's consumer 1
  adds none and block 1 loads the other tile's panel 2 twice, so that
  both blocks expect as many bytes).  Each consumer warp that has read
  ds_in (or, adding none, at once) arrives on the other block's
  out_free; consumer 1 waits for its own out_free (the copy it sent
  read, the other's ds_in free) before it writes dS^T again.  dO
  has one slot (its shared memory holds ds_in and k_peer), released as
  soon as dP^T and dV have read it.  The blocks meet at cluster barriers
  at the start (each one's barriers initialised before the other
  signals them) and at the end (neither leaves while the other may
  still copy into it).  In the deterministic mode a dQ tile takes one
  add a pair (its 64 columns are one consumer's of one block), in the
  pairs' turns (kv_rank over tiles of 128 keys: nt / 2 of half the
  grid's width; a pair rotates as one key tile).  Not with a block mask.
  Score and mask expressions (mods.lua: the user's, with their
  parameters) run on S^T tile by tile of 16 queries, in the loop that
  makes P^T: each element's derivative of the score expression at its raw
  score (mods.cuh's fj_score_grad, generated by src/expr_grad.c) is taken
  before the expression changes it, and dS^T is multiplied by it where P^T
  is not 0 (elsewhere dS^T is 0); a query past the sequence gets P^T 0
  whatever the expression made of its padding's score.  The wide kernel
  hands consumer 1 P^T times that derivative.  The parameters' gradients
  (mods.param_grads: fp32 atomics at the indices read, dS^T before the
  derivative) run on the narrow kernel only.  Along a lane's elements of a
  step only kv - q changes, by a constant of the slot and tile, so ALiBi's
  distance and a distance table's row pointer are taken once a step.
  Block masks (block_q, block_kv: whole key tiles a key block): each role
  walks the query tiles its key block's transposed lists name within the
  mask rule's query range (bwd_common.cuh's QWalk: partial blocks, then
  full ones, per query head of the group); the mask expression runs on a
  partial block's tiles only.  Not in the deterministic mode (the host
  refuses it; the turns count the rule's key tiles).
  Parameters: head_dim (a multiple of 16 from 64 to 256), tile_m 64,
  tile_n 128 (wide heads: 64, or 128 for the pair), warps 12,
  stages 2, causal, window,
  softcap, dtype (f16, bf16), varlen, the modifications (score_mod,
  mask_mod, mod_params), a block mask's block_q and block_kv (0: none).
#}
{%
  local L = import("lut.lua")
  local PC = import("pieces.lua")
  local TR = import("tma_ring.lua")
  local D, BM, BN, S = head_dim, tile_m, tile_n, stages
  local DR = (D + 63) // 64 * 64    -- the padded head dim (whole panels)
  local WIDE = DR > 128             -- consumers split by role
  local mrule = PC.bwd_mask(import("mask.lua"))
  local mods = import("mods.lua").new{ score = score_mod, mask = mask_mod, params = mod_params,
                                       softcap = softcap, grad = true }
  local function no(fmt, ...) refuse(fmt:format(...)) end
  PC.bwd_scope{ exprs = true, blocks = true }
  -- A block mask (block_q, block_kv): each role walks the query tiles its
  -- key block's transposed lists name (bwd_common.cuh's QWalk); the mask
  -- expression runs on a partial block's tiles only.
  local BMASK = (block_kv or 0) > 0 and { q = block_q, kv = block_kv } or nil
  if BMASK then mods.mask_guard = "bm_part" end
  -- The user's expressions (mods.lua) run tile by tile of 16 queries in
  -- the P^T loop (user_tile below), so that only 8 elements' derivatives
  -- and raw scores live at a time beside dK, dV, S^T and dP^T.
  local USER = (mods.score_text or mods.mask_text) and true or false
  local ELEM = TR.ELEM[dtype]
  if ELEM ~= 2 then no("dtype %s: the wgmma backward takes f16 and bf16", dtype) end
  local C = warps // 4 - 1          -- consumer warpgroups
  local THREADS = 32 * warps
  if C ~= 2 then no("warps %d: the wgmma backward runs 12 warps (a producer and two consumer warpgroups)", warps) end
  if D % 16 ~= 0 or D < 64 or D > 256 then
    no("head_dim %d: the wgmma backward takes multiples of 16 from 64 to 256 (the mma backward takes the others)", D)
  end
  if WIDE and mods.pgrads then
    no("head_dim %d: the parameters' gradients (mods.param_grads) run on the mma backward above head dim 128", D)
  end
  -- The pair (PAIR): a cluster of two blocks splits a key tile of 128,
  -- 64 keys each; each hands the other its dS^T and adds dQ over all 128
  -- keys for half of the columns (DR 256: a panel per consumer; DR 192:
  -- block 0's consumers the first two panels, block 1's consumer 0 the
  -- third, its consumer 1 none).
  local PAIR = WIDE and BN == 128
  if WIDE and BN ~= 64 and not PAIR then
    no("tile_n %d: at head_dim %d the consumers split one key tile of 64 by role (128: a pair of blocks)", BN, D)
  end
  if PAIR and DR ~= 256 and DR ~= 192 then no("tile_n 128 at head_dim %d: a pair of blocks splits dQ's three or four panels (head dims above 128)", D) end
  if PAIR and BMASK then no("tile_n 128: a pair of blocks walks one query range, not a block mask's lists (tile_n 64)") end
  local BK = PAIR and 64 or BN       -- the keys a block keeps
  if not WIDE and BN ~= 64 * C then no("tile_n %d: each of the %d consumer warpgroups owns 64 keys, so tile_n is %d", BN, C, 64 * C) end
  if BM ~= 64 then no("tile_m %d: the wgmma backward walks query tiles of 64 rows", BM) end
  if BMASK and (BMASK.q % BM ~= 0 or BMASK.kv % BN ~= 0) then
    no("tile_m %d and tile_n %d must divide the block mask's blocks (%d query rows, %d keys)", BM, BN, BMASK.q, BMASK.kv)
  end
  if S ~= 2 then no("stages %d: the wgmma backward keeps 2 slots of Q and dO", S) end
  local KSTEP = 32 // ELEM
  local PP = TR.ROW_BYTES // (KSTEP * ELEM)     -- k steps in a 128-byte panel row
  -- The k steps of S^T and dP^T that hold the head dim (the rest of its
  -- panels are zeros).
  local KS = D // KSTEP
  -- dQ by columns where half the head dim is whole panels, else by turns.
  local DQ_COLS = (DR // 2) % (TR.ROW_BYTES // ELEM) == 0
  local DQN = DQ_COLS and DR // 2 or DR
  -- The wide kernel's dQ: consumer 0 the first 128 columns, consumer 1 the
  -- rest (DR 256: 128 each; DR 192: 64), 64 at a time, so that a consumer
  -- holds 32 registers of dQ beside its dK or dV.
  local DQ_PARTS = WIDE and { { c0 = 0, n = 128 }, { c0 = 128, n = DR - 128 } } or {}

  local B = import("budget.lua").new{}
  -- The producer's second warp (the dQ writer) walks the deterministic
  -- mode's turns too: at head dim 64, where the consumers need far fewer
  -- than 240, it gets 40 registers (24 spilled under a window).
  local REGS = B.regs(C, D == 64 and { producer = 40, consumer = 232 } or nil)
  if WIDE then
    -- Per consumer thread: dV or dK (DR/2), then S^T or dP^T (BM/2; its
    -- operand BM/4) or 64 columns of dQ (32), and the addresses.
    B.check_regs(DR // 2 + BM // 2 + BM // 4 + 24, ("head_dim %d"):format(D),
                 "dK or dV, S or dP, and dQ", "the mma backward takes it")
  else
    -- Per consumer thread: dK and dV (DR/2 each), S^T and dP^T (BM/2 each;
    -- P^T and dS^T as operands, BM/4 each, and dQ, DQN/2, take their place).
    B.check_regs(DR + BM + 24, ("head_dim %d"):format(D), "dK, dV, S and dP",
                 "the mma backward takes it")
  end

  local acc, qa, rows, p_from = L.softmax_tables(lut_acc, lut_a, "wgmma", refuse)
  -- K and V in registers (issue 31).  S^T = K Q^T and dP^T = V dO^T with
  -- both operands in shared memory read (64 + BM) rows of a k step for a
  -- 64 x BM product: at BM = 64, 4 KB for 131k FLOP, as many bytes a clock
  -- as shared memory delivers while the tensor cores run at full rate.  K
  -- and V stay in a block for its whole walk, so where a consumer thread
  -- has room for them -- 4 registers a k step each, 8 KS beside dK, dV,
  -- S^T and dP^T: DR 64 -- its warpgroup's 64 keys of both are loaded once
  -- as A fragments, and S^T and dP^T take the rs form, which reads only Q
  -- or dO from shared memory (a quarter less a step).  The probed A table
  -- (qa) says which elements a register holds: register r, slots 2r and
  -- 2r + 1, the lower half first (as P^T is packed), loaded as one 32-bit
  -- word where the table puts the two side by side in one row at an even
  -- column in every lane (lut.lua's pairs); a table that does not keeps
  -- the ss form, as does any head dim whose dK and dV leave no room.
  -- (Measured with NVRTC 13.0: the consumers' highest register goes from
  -- R172 to R205 of the 232 they have, R228 under a score expression with
  -- a derivative kept per tile; no spills.)
  local function a_words(info)
    local ps = L.pairs(info)
    if #ps ~= 4 then return false end
    for r = 0, 3 do
      if ps[r + 1][1] ~= 2 * r or ps[r + 1][2] ~= 2 * r + 1 then return false end
    end
    return true
  end
  local KV_REGS = not WIDE and DR == 64 and a_words(qa) and DR + BM + 24 + 8 * KS <= REGS[2]
  local pairs = L.pairs(acc)
  -- The wide kernel's dQ additions: a lane's slots of one row, columns c,
  -- c+1, c+8, c+9 (two pairs 8 columns apart), one red.v4 each
  -- (bwd_common.cuh's dq_tile_off4 keeps them one 16-byte chunk).
  local quads = {}
  for _, a in ipairs(WIDE and pairs or {}) do
    for _, b in ipairs(pairs) do
      if acc.drow[b[1]] == acc.drow[a[1]] and acc.dcol[b[1]] == acc.dcol[a[1]] + 8 then
        quads[#quads + 1] = { a[1], a[2], b[1], b[2] }
      end
    end
  end
  if WIDE and #quads * 2 ~= #pairs then no("the accumulator table's pairs do not make rows of four (c, c+1, c+8, c+9)") end
  -- The wide kernel's additions of a 64 x 64 dQ tile from registers
  -- (dq[4][8]) at `tile`: one red.global.add.v4.f32 a quad of a lane's
  -- slots, in bwd_common.cuh's dq_tile_off4 order.
  local function red_tile()
    local out = { "#pragma unroll", "for (int j = 0; j < 4; ++j) {" }
    for _, q4 in ipairs(quads) do
      out[#out + 1] = ("  fj::red_add_v4_f32(tile + fj::dq_tile_off4(wr + acc_r + %d, j * 16 + acc_c + %d),"):format(
        acc.drow[q4[1]], acc.dcol[q4[1]])
      out[#out + 1] = ("                     dq[j][%d], dq[j][%d], dq[j][%d], dq[j][%d]);"):format(q4[1], q4[2], q4[3], q4[4])
    end
    out[#out + 1] = "}"
    return table.concat(out, "\n")
  end
  -- The wide kernel's deterministic mode: a step's dQ turns (pend, null
  -- once passed on).  A block's float32 additions of a step (32 KB) drain
  -- at about the pace the step computes (ncu: a release a step after them
  -- still waits), and a fence that waits for them before the turn passes
  -- cost each step that much (1.3-1.5x the default mode's time at head
  -- dim 256).  Where the next key tile in a dQ tile's order runs a step or
  -- more behind this one -- under a mask with a right side (later key
  -- tiles first, each starting its walk BN / BM query tiles later) or
  -- rotated (g.deterministic 2, T <= nq: LATE) -- the turns pass late
  -- (`late`): while the next step's dQ product runs, when the additions
  -- are complete; elsewhere at once, each key tile waiting on the one
  -- before it at every step.  Each warp
  -- waits for a turn and passes it on by itself (a turn counts four warps
  -- a key tile), so that no warp waits on the others' fences.  The text of
  -- consumer `role`'s part `part`, `pad` spaces in.
  local function pass_turns(role, part, pad)
    local L = { "if (pend) {", "  fj::fence_gpu();", "  __syncwarp();", "  if (lane == 0) {" }
    if PAIR then
      L[#L + 1] = ("    fj::dq_turn_pass(pend + 2 * (int)crank + %d);"):format(role)
    else
      for c0 = part.c0, part.c0 + part.n - 1, 64 do
        L[#L + 1] = ("    fj::dq_turn_pass(pend + %d);"):format(c0 // 64)
      end
    end
    L[#L + 1] = "  }"
    L[#L + 1] = "  pend = nullptr;"
    L[#L + 1] = "}"
    return table.concat(L, "\n" .. (" "):rep(pad))
  end
  -- The distinct columns of a lane's slots in a tile of 16 (their LSE2 and
  -- delta are read once a tile).
  local cols, seen = {}, {}
  for i = 0, acc.slots - 1 do
    if not seen[acc.dcol[i]] then seen[acc.dcol[i]] = true; cols[#cols + 1] = acc.dcol[i] end
  end
  -- The narrow kernel reads them two at a time where a lane's columns c
  -- and c + 1 are both its own at an even c in every lane (one 8-byte load:
  -- the rows' LSE2 and delta are float32 from an 8-byte-aligned start);
  -- lane_cols(x, base) declares x<column> for each of the lane's columns of
  -- tile j.
  local even = not mods.pgrads
  for lane = 0, 31 do
    if acc.base[lane][2] % 2 ~= 0 then even = false end
  end
  local function lane_cols(x, base)
    local out = {}
    for _, c in ipairs(cols) do
      if even and c % 2 == 0 and seen[c + 1] then
        out[#out + 1] = ("const float2 %s_v%d = fj::ld_shared_v2_f32(%s + 4 * (j * 16 + %d));"):format(x, c, base, c)
        out[#out + 1] = ("const float %s%d = %s_v%d.x, %s%d = %s_v%d.y;"):format(x, c, x, c, x, c + 1, x, c)
      elseif not (even and c % 2 == 1 and seen[c - 1]) then
        out[#out + 1] = ("const float %s%d = fj::ld_shared_f32(%s + 4 * (j * 16 + %d));"):format(x, c, base, c)
      end
    end
    return table.concat(out, "\n")
  end
  -- A lane's stores of dS^T and of dQ's staging at tile j of 16 queries
  -- (XJ): where every lane's columns lie below 16 (base + dcol), column
  -- j * 16 + c puts j in bits the swizzles only XOR (sw128's chunk c >> 3:
  -- 2 j ^ ...; dq_tile_off's chunk c >> 2: 4 j ^ ...), so the address at
  -- tile j is the address at tile 0 XOR 32 j (dS^T) or 64 j (dQ, from a
  -- 256-byte-aligned buffer): one register a slot pair, one instruction a
  -- store.
  local XJ = not mods.pgrads
  for lane = 0, 31 do
    for i = 0, acc.slots - 1 do
      if acc.base[lane][2] + acc.dcol[i] >= 16 then XJ = false end
    end
  end
  -- P^T before dS^T (SPLIT): the narrow kernel with the built-in score step
  -- only waits for S^T, makes P^T while the tensor cores run dP^T, then
  -- waits for dP^T.  A softcap's 1 - tanh^2 and the expressions'
  -- derivatives, which dS^T takes per element, would have to live across
  -- the wait (32 registers more): those keep the one loop after both.
  local SPLIT = not WIDE and not USER and not mods.softcap
  -- dQ before dK (DQ_FIRST): dK issued behind dQ, so that dQ is staged
  -- while the tensor cores run dK; dQ's 32 registers then live beside
  -- dS^T's operand.  The parameters' gradients' kernel has no room for
  -- that (it spills, as it does with any of this kernel's other steps
  -- below, so it takes none of them: its consumers are the ones before):
  -- it issues dK with dV and stages dQ after both.
  local DQ_FIRST = not mods.pgrads

  -- The producer's rings: K and V (one slot, loaded once), Q and dO (S
  -- slots, one step each).
  local bars = TR.barriers("bars")
  local function ring(name, rows_, slots)
    return TR.ring{ name = name, elem = ELEM, rows = rows_, cols = DR, slots = slots, arrivals = 4 * C,
                    smem = "s" .. name, map = "m" .. name, bars = bars }
  end
  local k, v = ring("k", BK, 1), ring("v", BK, 1)
  -- The boxes' coordinates (column, row, head, batch); varlen: a packed
  -- sequence's rows from its first.
  local KC = varlen and "%s * %d, (int)kv_row0 + n0, hk, kv_tb" or "%s * %d, n0, hk, b"
  local QC = varlen and "%s * %d, (int)q_row0 + m0, h, q_tb" or "%s * %d, m0, h, b"
  -- The pair keeps one slot of dO (released as soon as dP^T and dV have
  -- read it): its shared memory holds the other block's dS^T and keys.
  local q, dout = ring("q", BM, S), ring("dout", BM, PAIR and 1 or S)
  local DSLOT, DPH = PAIR and "0" or "slot", PAIR and "dph" or "ph"
  -- Shared memory: the rings, the dS^T buffers (BN key rows of BM query
  -- columns: one panel; two, or one for the wide kernel, whose consumers
  -- both finish a step's dQ before the next step's dS^T: barrier 1), each
  -- slot's LSE2 and delta rows.
  local DS_BYTES = BK * BM * ELEM
  local LD_BYTES = 2 * BM * 4
  local OFF_K = B.region("k", k.bytes, 1024)
  local OFF_V = B.region("v", v.bytes, 1024)
  local OFF_Q = B.region("q", q.bytes, 1024)
  local OFF_DO = B.region("dout", dout.bytes, 1024)
  local OFF_DS = B.region("ds", (WIDE and 1 or 2) * DS_BYTES, 1024)
  local DQ_STAGE, OFF_DQ, OFF_DQBAR, OFF_PX = 0, 0, 0, 0
  if WIDE then
    -- P^T's handoff: BN x BM floats, a thread's value r at r * 128 + its
    -- place in the warpgroup.
    OFF_PX = B.region("p_handoff", BK * BM * 4, 16)
  else
    -- dQ's staging: a buffer per consumer of BM rows of DQN floats, laid
    -- out as the accumulator's tiles are (bwd_common.cuh's dq_tile_off), so
    -- that one bulk reduce-add moves it whole.
    if DQN ~= 64 or BM ~= 64 then no("dQ's tiles are 64 x 64 floats (head_dim %d, tile_m %d)", D, BM) end
    DQ_STAGE = BM * DQN * 4
    -- 256-byte aligned: a lane's stores of one row pair move by XOR (XJ below).
    OFF_DQ = B.region("dq_stage", C * DQ_STAGE, mods.pgrads and 128 or 256)
  end
  local OFF_DSIN, OFF_KP, OFF_PBAR = 0, 0, 0
  if PAIR then
    -- The other block's dS^T (its bulk copy of its buffer), and its keys'
    -- columns of this block's half of dQ (two panels, loaded once).
    OFF_DSIN = B.region("ds_in", DS_BYTES, 1024)
    OFF_KP = B.region("k_peer", 2 * k.panel_bytes, 1024)
  end
  -- A step's dS^T to the other block, and this block's expectation of
  -- the other's (one thread; at `pad` spaces).
  local function send_ds(pad)
    return ("fj::bulk_to_peer(fj::peer_addr(sds_in, crank ^ 1u), sds, %du, fj::peer_addr(in_full, crank ^ 1u));\n%sfj::mbar_expect(in_full, %du);")
        :format(DS_BYTES, (" "):rep(pad), DS_BYTES)
  end
  local OFF_LD = B.region("lse_delta", S * LD_BYTES, 16)
  local OFF_BAR = B.region("barriers", 8 * bars.count, 8)
  if PAIR then
    -- in_full: the other block's dS^T arrived (this block's expect, its
    -- bytes); out_free: the other block has read the dS^T this one sent
    -- (an arrival from each of its consumer warps).
    OFF_PBAR = B.region("pair_barriers", 16, 8)
  end
  if not WIDE then
    -- dQ's staging handoff: full (staged) and empty (read) per consumer.
    OFF_DQBAR = B.region("dq_barriers", 8 * 2 * C, 8)
  end
  meta.symbol = symbol
  meta.threads = THREADS
  meta.smem_bytes = B.total()
  meta.rows_per_block = BK
  meta.tma = 1
  meta.isolate = 1  -- NVRTC 13.0's PTX compiler can crash on wgmma code

  local T = dtype
  -- Descriptors.  K-major (A: K or V, this warpgroup's 64 keys; B: Q or
  -- dO of a slot): k step kk is 32 bytes along a panel row, panels apart.
  local function kmajor(base, panel_bytes, kk)
    return ("fj::wg_desc(%s + ((%s) / %d) * %d + ((%s) %% %d) * %d, 16, 1024)"):format(
      base, kk, PP, panel_bytes, kk, PP, KSTEP * ELEM)
  end
  -- MN-major (B: Q or dO for dK and dV, K for dQ; A: dS^T for dQ): a k
  -- step is KSTEP rows of 128 bytes on; panels (64 columns) panel_bytes apart.
  local function mnmajor(base, panel_bytes, kk)
    return ("fj::wg_desc(%s + (%s) * %d, %d, 1024)"):format(base, kk, KSTEP * TR.ROW_BYTES, panel_bytes)
  end
  -- The same descriptors as the base's descriptor plus the k step's byte
  -- offset (wg_desc_at below: one add to the start address field),
  -- so that the compiler makes a product's base descriptor once and each k
  -- step's with one instruction, not the masks and shifts of wg_desc
  -- anew (every consumer's but the parameters' gradients'; in the wide
  -- kernel, with its role read from lane 0, they are uniform registers:
  -- 4 instructions between its S^T's wgmmas instead of 13 with a chain
  -- through R2UR, in the SASS at d256).
  local function kmajor_at(base, panel_bytes, kk)
    return ("fj::wg_desc_at(fj::wg_desc(%s, 16, 1024), ((%s) / %d) * %d + ((%s) %% %d) * %d)"):format(
      base, kk, PP, panel_bytes, kk, PP, KSTEP * ELEM)
  end
  local function mnmajor_at(base, panel_bytes, kk)
    return ("fj::wg_desc_at(fj::wg_desc(%s, %d, 1024), (%s) * %d)"):format(base, panel_bytes, kk, KSTEP * TR.ROW_BYTES)
  end
  -- A role's loop over its steps: STEP_FOR opens it, STEP_AT names the
  -- step's query head h and first row m0, STEP_NEXT (a block mask's walk)
  -- moves on before the loop's end.
  -- Without a block mask the step's query tile iq and head hq of the
  -- group are counted along (i / nq and i % nq cost a division a step,
  -- some 25 instructions under a causal mask, where the consumers use m0)
  -- where the registers hold two more: the wide kernel and head dim 64
  -- (at 96-128 they spill 4 bytes).
  local COUNT = not BMASK and (WIDE or DR == 64)
  -- DESC: under a mask with a right side (no block mask), the
  -- deterministic mode's descending walk, a runtime choice (desc:
  -- g.deterministic 3, which the host sets with GQA:
  -- backward.c's descends).  Every role then
  -- walks its query tiles from the last to the first, the group's heads
  -- inner (query tile iq of head hq: kv_next), the dQ tiles' turns go to
  -- earlier key tiles first (scheduler.cuh's kv_rank with desc) and the
  -- blocks launch first key tiles first (kv_tile): a key tile waits only
  -- on tiles launched before it, the longest walks under a causal mask
  -- (the first key tiles', group x their query tiles) start first instead
  -- of last, and the key tiles of a head reach a query tile at the same
  -- step (under a window's left side the earlier ones sooner), so that
  -- each add waits for the one before it alone.  Without a
  -- count (96-128) the step is divided out of i by wn, the walk's inner
  -- count (the group, or nq in the plain walk), from m_from, its first
  -- row: in place of nq and m_first, which the producer's 24 registers
  -- then no longer hold (the walk from nq and m_first spilled 4 bytes
  -- there), and the writer's kv_rank takes wc == 0 for a head's first step
  -- of the plain walk, not i % nq (which spilled 4 bytes under a window).
  local DESC = not BMASK and mrule.bounded
  local STEP_FOR = BMASK and "for (int i = 0; have; ++i) {"
                   or COUNT and DESC and "for (int i = 0, iq = desc ? nq - 1 : 0, hq = 0; i < steps; ++i, fj::kv_next(iq, hq, nq, p.group, desc)) {"
                   or COUNT and "for (int i = 0, iq = 0, hq = 0; i < steps; ++i, hq += iq + 1 == nq, iq = iq + 1 == nq ? 0 : iq + 1) {"
                   or "for (int i = 0; i < steps; ++i) {"
  local STEP_AT = BMASK and "const int h = hk * p.group + cur.g, m0 = cur.m0;"
                  or COUNT and ("const int h = hk * p.group + hq, m0 = m_first + iq * %d;"):format(BM)
                  or DESC and ("const int wa = i / wn, wc = i - wa * wn, h = hk * p.group + (desc ? wc : wa), m0 = desc ? m_from - wa * %d : m_from + wc * %d;"):format(BM, BM)
                  or ("const int h = hk * p.group + i / nq, m0 = m_first + (i %% nq) * %d;"):format(BM)
  -- ROT: where every key tile walks every query tile (no causal mask, no
  -- window, dense, no expressions: the narrow kernel's consumers then
  -- name no query row), the deterministic mode may start key tile t's
  -- walk at query tile rot = t nq / T (g.deterministic 2; the host sets it
  -- only where all of a head's T key tiles can be resident at once), so
  -- that a dQ tile's adds come one a step in a rotation instead of each
  -- key tile waiting on the one before it at every step (scheduler.cuh's
  -- kv_rank with rot).  The producer and the writer address by the
  -- rotated row (STEP_AT_ROT); the narrow kernel's consumers' STEP_AT_C
  -- names no m0, so a consumer that used it would not compile; the wide
  -- kernel's consumers, which add dQ themselves, walk the rotation too.
  -- A pair rotates as one key tile of 128 (RNT of RTILES).  Elsewhere 2 is
  -- taken as 1.
  local ROT = not BMASK and not mrule.bounded and not mrule.left and not varlen and
              not mods.any and not mods.pgrads
  local RNT = PAIR and "(nt >> 1)" or "nt"
  -- The wide kernel's deterministic turns pass a step late (pass_turns)
  -- under a mask with a right side, or rotated where the rotation's
  -- starts are all different (T <= nq: tiles that start at one query tile
  -- would each wait a step for the one before); else at once (the
  -- descending walk too: the key tile before reaches a query tile at the
  -- same step, or sooner).
  local LATE = mrule.bounded and (DESC and "!desc" or "true")
               or ROT and ("g.deterministic == 2 && (int)%s <= nq"):format(PAIR and "(gridDim.x >> 1)" or "gridDim.x")
               or "false"
  -- (qt, the step's query tile, is carried from step to step: the
  -- producer's warpgroup has 24 registers at head dim 128, and a rotation
  -- recomputed from i each step spilled there.)
  local HQ = COUNT and "hq" or "i / nq"
  local STEP_AT_ROT = ROT and
    ("const int h = hk * p.group + %s, m0 = m_first + qt * %d;\n        qt = qt + 1 < nq ? qt + 1 : 0;"):format(HQ, BM)
  local STEP_AT_C = ROT and (WIDE and STEP_AT_ROT or ("const int h = hk * p.group + %s; (void)h;"):format(HQ)) or STEP_AT
  local ROT_AT = ROT and ("int qt = g.deterministic == 2 ? (int)((unsigned)(%s * nq) / %s) : 0;  // the rotation's first query tile (ROT; T nq < 2^31, the host's condition)"):format(RNT, PAIR and "(gridDim.x >> 1)" or "gridDim.x")
  local STEP_NEXT = BMASK and ("have = fj::qwalk_next(p, b, hk, n0, m_first, m_first + nq * %d, cur);"):format(BM)
  -- The four A-operand registers dst[0..3] of one 16-column tile, packed
  -- from accumulator values src[...] in the probed pairs (p_from): C
  -- statements, the lines after the first indented by pad.
  local function pack_a(dst, src, pad)
    local out = {}
    for r = 0, 3 do
      out[#out + 1] = ("%s[%d] = fj::pack2(%s[%d], %s[%d]);"):format(dst, r, src, p_from[2 * r], src, p_from[2 * r + 1])
    end
    return table.concat(out, "\n" .. (" "):rep(pad))
  end
  local function hold(name, n)
    return ("#pragma unroll\n    for (int j = 0; j < %d; ++j)\n#pragma unroll\n      for (int i = 0; i < 8; ++i) fj::wg_hold(%s[j][i]);"):format(n, name)
  end
  -- The score step on S^T (x: the accumulator's name; a register's key is
  -- its row, its query its column) of the 64 keys from k0 on: key0 and
  -- need_mask declared, the score expression (softcap) applied, then
  -- mask.lua's rule, on tiles that cross the sequence end, the diagonal or
  -- the window only.  The text for a line `pad` spaces in.
  -- mask.lua's rule on every element of S^T in x, in one branch where
  -- need_mask holds, through add: q(i) the query of slot i of tile j,
  -- extra(i) nil or more of its test.
  local function mask_tile(add, x, q, extra)
    add("// Only tiles that cross the sequence end, the diagonal or the window")
    add("// are masked (one branch, the same for the whole warpgroup).")
    add("if (need_mask) {")
    add("#pragma unroll")
    add("  for (int j = 0; j < %d; ++j) {", BM // 16)
    for i = 0, acc.slots - 1 do
      add("    if (!(%s%s)) %s[j][%d] = FJ_NEG_INF;", mrule.visible(q(i), ("key0 + %d"):format(acc.drow[i])),
          extra and extra(i) or "", x, i)
    end
    add("  }")
    add("}")
  end
  local function score_step(x, k0, pad)
    local L = {}
    local function add(fmt, ...) L[#L + 1] = fmt:format(...) end
    add("const int key0 = %s + wr + acc_r;", k0)
    add("const bool need_mask = %s;", mrule.tile_partial(k0, 64, "m0", ("m0 + %d"):format(BM - 1)))
    if mods.score then
      add("#pragma unroll")
      add("for (int j = 0; j < %d; ++j) {", BM // 16)
      for i = 0, acc.slots - 1 do
        add("  %s", mods.apply_score(("%s[j][%d]"):format(x, i), ("m0 + j * 16 + acc_c + %d"):format(acc.dcol[i]), "h",
                                     ("key0 + %d"):format(acc.drow[i]), nil))
      end
      add("}")
    end
    mask_tile(add, x, function(i) return ("m0 + j * 16 + acc_c + %d"):format(acc.dcol[i]) end)
    return PC.indent(table.concat(L, "\n"), pad)
  end
  -- The user's expressions on S^T of a step (USER): user_head(k0, pad,
  -- part) the step's declarations -- key0, need_mask as score_step's, the
  -- lane's first query mq0, and what mods.lua's fast paths take once a
  -- step (the distance kv - q at the lane's first element, ALiBi's slope,
  -- a distance table's row pointer, its lines asked for ahead: along a
  -- lane's elements only the distance changes, by a constant of the slot
  -- and tile), in two parts around the wait for the step's products
  -- (score_pre, score_head); then, inside the loop
  -- over tiles j of 16 queries, user_tile(x) each element's query uq<i>
  -- and key uk<i>, the derivative g<i> (mods.grad) and raw score sr<i>
  -- (mods.pgrads) at the element, the score and mask expressions, then
  -- mask.lua's rule where need_mask holds.  The text for lines `pad`
  -- spaces in.
  local function user_head(k0, pad, part)
    local L = {}
    local function add(fmt, ...) L[#L + 1] = fmt:format(...) end
    -- part "pre": what comes before the wait for the step's products where
    -- a distance table is read (score_pre); "post" the rest after it;
    -- nil: all of it after the wait.
    local pre = part ~= "post"
    local post = part ~= "pre"
    if not mods.dg then
      if part == "pre" then return "" end
      pre = true
    end
    if pre then
      add("const int key0 = %s + wr + acc_r;", k0)
      add("const int mq0 = %s;  // this lane's first query (slot i of tile j: + 16 j + its column)", mrule.pos("m0 + acc_c"))
    end
    if pre and mods.dg then
      -- A slot's element lies 16 j + its column - its row from the lane's
      -- first in q - kv.
      local lo, hi = math.huge, -math.huge
      for i = 0, acc.slots - 1 do
        for _, j in ipairs({ 0, BM // 16 - 1 }) do
          local off = mods.dg.sign * (16 * j + acc.dcol[i] - acc.drow[i])
          lo, hi = math.min(lo, off), math.max(hi, off)
        end
      end
      add("bool dgin;")
      add("%s", mods.dg_row("dgp", "dgin", "h", "mq0 - key0", lo, hi))
      if mods.dg.inside then
        -- Proved within the table on the host (fj_variant.table_inside):
        -- no path through the accessor.
        add("(void)dgin;")
        add("constexpr bool dgfast = true;  // proved on the host (fj_variant.table_inside)")
      else
        add("const bool dgfast = __all_sync(0xffffffffu, dgin);  // every lane's elements within the table")
      end
      -- The fast path's lines of the table, asked for here: before the wait
      -- for the step's products, which hide their latency (loaded after
      -- the wait, one L2 round trip a step went exposed: the bias table's
      -- backward cost 1.28x the plain one's).  Registers would hold them
      -- too, but spill at head dim 128.
      local es = mods.dg.param.type == "f32" and 4 or 2
      add("if (dgfast) {")
      local off = lo
      while off < hi do
        add("  fj::prefetch_l1(dgp + (%d));", off)
        off = off + 128 // es
      end
      add("  fj::prefetch_l1(dgp + (%d));", hi)
      add("}")
    end
    if not post then return PC.indent(table.concat(L, "\n"), pad) end
    -- Under a score expression the tile that crosses the query end is
    -- masked too (its padding's P^T must be 0 whatever the expression made
    -- of its score: +inf or NaN would meet its LSE2's +inf).
    add("const bool need_mask = %s%s;", mrule.tile_partial(k0, 64, "m0", ("m0 + %d"):format(BM - 1)),
        mods.grad and (" || m0 + %d > len_q"):format(BM) or "")
    if mods.kvq_scale then
      add("const float mskv = fj_kvq_scale(%s, h, %s, p%s);", mods.b, mods.hkv, mods.args and ", fj_ma" or "")
      add("const float mkvq = mskv * (float)(key0 - mq0);")
    elseif mods.kvq then
      add("const float mkvq = (float)(key0 - mq0);")
    end
    if mods.pgrads_nsum > 0 then
      add("float %s[%d] = {};  // the reads at one element a head, flushed after the step", mods.pgrads_acc, mods.pgrads_nsum)
    end
    return PC.indent(table.concat(L, "\n"), pad)
  end
  local function user_tile(x, pad, whole)
    local L = {}
    local function add(fmt, ...) L[#L + 1] = fmt:format(...) end
    for i = 0, acc.slots - 1 do
      add("const int uq%d = mq0 + j * 16 + %d, uk%d = key0 + %d;", i, acc.dcol[i], i, acc.drow[i])
    end
    if mods.dg then
      add("%s dgv[%d];", mods.dg.value, acc.slots)
      add("if (dgfast) {")
      for i = 0, acc.slots - 1 do
        local off = ("j * 16 + %d"):format(acc.dcol[i] - acc.drow[i])
        add("  dgv[%d] = %s;", i, mods.dg_load("dgp", mods.dg.sign > 0 and off or ("-(%s)"):format(off)))
      end
      if not mods.dg.inside then
        add("} else {")
        for i = 0, acc.slots - 1 do
          add("  dgv[%d] = %s;", i, mods.dg_read("uq" .. i, "h", "uk" .. i))
        end
      end
      add("}")
    end
    for i = 0, acc.slots - 1 do
      local lv = ("%s[j][%d]"):format(x, i)
      local kvq = mods.kvq_scale and ("fmaf(mskv, (float)(%d - j * 16), mkvq)"):format(acc.drow[i] - acc.dcol[i])
                  or ("mkvq + (float)(%d - j * 16)"):format(acc.drow[i] - acc.dcol[i])
      local dgv = mods.dg and ("dgv[%d]"):format(i)
      local q, kv = "uq" .. i, "uk" .. i
      if mods.pgrads then add("const float sr%d = %s * qk_scale;", i, lv) end
      if mods.grad and not whole then
        add("float g%d;", i)
        add("%s", mods.apply_grad("g" .. i, lv, q, "h", kv, nil, kvq, dgv))
      end
      if mods.score then add("%s", mods.apply_score(lv, q, "h", kv, nil, kvq, dgv)) end
    end
    if mods.mask then
      if mods.mask_guard then add("if (%s) {  // the mask expression on a partial block's tile only", mods.mask_guard) end
      for i = 0, acc.slots - 1 do
        add("%s%s", mods.mask_guard and "  " or "", mods.apply_mask(("%s[j][%d]"):format(x, i), "uq" .. i, "h", "uk" .. i, nil))
      end
      if mods.mask_guard then add("}") end
    end
    if not whole then
      add("if (need_mask) {")
      for i = 0, acc.slots - 1 do
        add("  if (!(%s%s)) %s[j][%d] = FJ_NEG_INF;", mrule.visible("uq" .. i, "uk" .. i),
            mods.grad and (" && uq%d < len_q"):format(i) or "", x, i)
      end
      add("}")
    end
    return PC.indent(table.concat(L, "\n"), pad)
  end
  -- The expressions on the whole of S^T at once, then the mask in one
  -- branch, as score_step (WHOLE): where no derivative needs keeping (a
  -- mask expression alone, or a derivative that is a number, as a bias's
  -- 1), so that the compiler does not turn a mask per tile of 16 into
  -- selects on every element.
  local WHOLE = USER and (not mods.grad or mods.grad_const) and not mods.pgrads
  local function user_whole(x, pad)
    local L = {}
    local function add(fmt, ...) L[#L + 1] = fmt:format(...) end
    add("#pragma unroll")
    add("for (int j = 0; j < %d; ++j) {", BM // 16)
    add("%s", user_tile(x, 2, true))
    add("}")
    mask_tile(add, x, function(i) return ("mq0 + j * 16 + %d"):format(acc.dcol[i]) end,
              mods.grad and function(i) return (" && mq0 + j * 16 + %d < len_q"):format(acc.dcol[i]) end)
    return PC.indent(table.concat(L, "\n"), pad)
  end
  -- What a step does to S^T (in x) before the loop over its tiles of 16
  -- queries: the built-in score step, or the user's expressions' head,
  -- and with WHOLE the expressions and the mask on all of it (else they
  -- run per tile: user_tile).
  local function score_head(x, k0, pad)
    if not USER then return score_step(x, k0, pad) end
    local head = user_head(k0, pad, "post")
    if not WHOLE then return head end
    return head .. "\n" .. (" "):rep(pad) .. user_whole(x, pad)
  end
  -- What of the user's expressions' head comes before the wait for the
  -- step's products (a distance table's row and its lines asked for: their
  -- latency runs under the products), or nothing.
  local function score_pre(k0, pad)
    return USER and user_head(k0, pad, "pre") or ""
  end
  -- P^T of slot i of tile j from its score in x (its query's LSE2 in
  -- l<column>).  The softcap's 1 - tanh^2 at the final score: th<i>,
  -- declared first (a hidden element's -inf counts as -1).
  local function p_elem(x, i)
    local out = {}
    if mods.softcap then
      out[#out + 1] = ("const float th%d = fmaxf(%s[j][%d]%s, -1.f);"):format(i, x, i, mods.fold and "" or " * p.softcap_inv")
    end
    out[#out + 1] = ("%s[j][%d] = fj::fast_exp2(fmaf(%s[j][%d], sl2, -l%d));"):format(x, i, x, i, acc.dcol[i])
    return table.concat(out, " ")
  end
  -- dS^T's factor beside dP^T - delta for slot i (P^T in x): P^T, times
  -- 1 - tanh^2 under a softcap, times the score expression's derivative
  -- where P^T is not 0 (elsewhere 0: a hidden element's derivative may be
  -- inf or NaN; not so a number's: mods.grad_const).
  local function ds_factor(x, i)
    local f = ("%s[j][%d]"):format(x, i)
    if mods.softcap then f = ("%s * (1.f - th%d * th%d)"):format(f, i, i) end
    if mods.grad and WHOLE then
      f = ("%s * (%s)"):format(f, mods.kernel_grad_text)
    elseif mods.grad and mods.grad_const then
      f = ("%s * g%d"):format(f, i)
    elseif mods.grad then
      f = ("(%s[j][%d] > 0.f ? %s * g%d : 0.f)"):format(x, i, f, i)
    end
    return f
  end
  -- The consumers' operand descriptors as macros: A, K and V's 64 keys from
  -- the addresses ka and va (K-major); B, Q and dO of a slot, K-major (S^T,
  -- dP^T) and MN-major (dK, dV); dS^T as dQ's A (MN-major, of buffer `buf`
  -- where there are two).  undefine() takes them back.
  local MACROS = { "FJ_KA", "FJ_VA", "FJ_QB", "FJ_DOB", "FJ_QT", "FJ_DOT", "FJ_DSA", "FJ_DSIN" }
  local function operands(ka, va, at)
    local qs = ("sq + (slot) * %d"):format(q.slot_bytes)
    local ds = PAIR and "sdout" or ("sdout + (slot) * %d"):format(dout.slot_bytes)
    local two = not WIDE
    local km, mn = at and kmajor_at or kmajor, at and mnmajor_at or mnmajor
    return table.concat({
      "#define FJ_KA(kk) " .. km(ka, k.panel_bytes, "kk"),
      "#define FJ_VA(kk) " .. km(va, v.panel_bytes, "kk"),
      "#define FJ_QB(slot, kk) " .. km(qs, q.panel_bytes, "kk"),
      "#define FJ_DOB(slot, kk) " .. km(ds, dout.panel_bytes, "kk"),
      "#define FJ_QT(slot, kk) " .. mn(qs, q.panel_bytes, "kk"),
      "#define FJ_DOT(slot, kk) " .. mn(ds, dout.panel_bytes, "kk"),
      two and ("#define FJ_DSA(buf, kk) " .. mn(("sds + (buf) * %d"):format(DS_BYTES), DS_BYTES, "kk"))
          or ("#define FJ_DSA(kk) " .. mn("sds", DS_BYTES, "kk")),
      PAIR and ("#define FJ_DSIN(kk) " .. mn("sds_in", DS_BYTES, "kk")) or "" }, "\n")
  end
  local function undefine(extra)
    local out = {}
    for _, m in ipairs(MACROS) do out[#out + 1] = "#undef " .. m end
    for _, m in ipairs(extra or {}) do out[#out + 1] = "#undef " .. m end
    return table.concat(out, "\n")
  end
%}
{{ include("common.cuh") }}
{{ include("block.cuh", { BM = BM, BN = BN }) }}
{{ include("bwd_common.cuh", { BMASK = BMASK, BM = BM }) }}
{% if mods.any then %}
{{ include("mods.cuh", { mods = mods, part = "decls" }) }}
{% end %}
{%
  local forms = { { t = T, n = BM, a = "ss", tb = 0 }, { t = T, n = DR, a = "rs", tb = 1 },
                  { t = T, n = WIDE and 64 or DQN, a = "ss", ta = 1, tb = 1 } }
  -- S^T and dP^T with K and V from registers (KV_REGS).
  if KV_REGS then forms[#forms + 1] = { t = T, n = BM, a = "rs", tb = 0 } end
%}
{{ include("wgmma.cuh", { spin_limit = WGMMA_SPIN_LIMIT or 0, forms = forms }) }}
{{ B.comment() }}
// registers: producer {{ REGS[1] }}, consumers {{ REGS[2] }}; dQ split {{ WIDE and ("by role: columns 0-127 and 128-%d"):format(DR - 1) or DQ_COLS and "by columns" or "by turns" }}
// pieces: tma_ring.lua (producer), scheduler.cuh (kv_head), mask.lua, budget.lua, wgmma.cuh
{% if KV_REGS then %}
// K and V of each consumer's 64 keys held as A operands (loaded once): S^T and dP^T read only Q and dO from shared memory
{% end %}

// From the accumulator table: each lane's base (row | col << 4); slot s adds
// (drow, dcol) = {% for s = 0, acc.slots - 1 do %}({{ acc.drow[s] }}, {{ acc.dcol[s] }}){{ s < acc.slots - 1 and " " or "" }}{% end %}; register 8j + s of
// a warp's slice sits 16j columns on.
__constant__ unsigned char fj_base_acc[32] = { {{ L.base_bytes(acc) }} };

namespace fj {
struct __align__(64) TensorMap { unsigned long long opaque[16]; };
// The backward's tensor maps: Q, K, V, dO (src/backward.c's fj_bwd_tmaps).
struct BwdMaps { TensorMap q, k, v, dout; };

__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  const elem2_t e = to_elem2(lo, hi);
  return *reinterpret_cast<const unsigned *>(&e);
}
__device__ __forceinline__ unsigned smem_base(const void *p) {
  return (smem_opaque(p) + 1023u) & ~1023u;
}
{% if KV_REGS then %}
// A 32-bit word of shared memory: two 16-bit elements of K or V, one
// register of an A operand.
__device__ __forceinline__ unsigned ld_shared_b32(unsigned a) {
  unsigned v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(a) : "memory");
  return v;
}
{% end %}
{% if not WIDE then %}
// Two adjacent floats of shared memory (8-byte aligned): a lane's LSE2 or
// delta of two neighbouring query columns.
__device__ __forceinline__ float2 ld_shared_v2_f32(unsigned a) {
  float2 v;
  asm volatile("ld.shared.v2.f32 { %0, %1 }, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(a) : "memory");
  return v;
}
{% end %}
{% if PAIR then %}
// ---- the pair: a cluster of two blocks ----
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Every thread of both blocks (release, then acquire: the barriers'
// initialisation seen by the other block; neither block's shared memory
// goes while the other may still write it).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// The address in the other block (rank `to`) of shared-space address a.
__device__ __forceinline__ unsigned peer_addr(unsigned a, unsigned to) {
  unsigned r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(to));
  return r;
}
// An arrival on the other block's barrier (remote: a mapa address),
// relaxed where NVRTC knows it (PTX ISA 8.6, CUDA 12.8): it says that this
// warp's wgmmas have read the other block's dS^T here (async-proxy reads,
// complete at their wait, which a release would not order anyway), and,
// to the other block, that its copy of that dS^T has read its buffer --
// which the copy completed before its bytes counted on this block's
// in_full, waited for before: an order the hardware keeps, where the PTX
// model would ask for a release.  A release waited for every float32
// addition of dQ the thread had in flight (MEMBAR.GPU: ncu put some 3.5%
// of each consumer's stall samples there, 5-10% of the pair's time).
__device__ __forceinline__ void mbar_arrive_peer(unsigned remote) {
#if __CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 8)
  asm volatile("mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [%0];\n" :: "r"(remote) : "memory");
#else
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" :: "r"(remote) : "memory");
#endif
}
// A wait on this block's barrier for arrivals from the other block
// (acquire at cluster scope).
__device__ __forceinline__ void mbar_wait_cluster(unsigned bar, unsigned parity) {
  unsigned done;
  do {
    asm volatile("{ .reg .pred p;\n"
                 "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p; }\n" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  } while (!done);
}
// `bytes` of this block's shared memory copied into the other block's (dst,
// remote), counted there on its barrier `bar` (remote) as transactions.
__device__ __forceinline__ void bulk_to_peer(unsigned dst, unsigned src, unsigned bytes, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               :: "r"(dst), "r"(src), "r"(bytes), "r"(bar) : "memory");
}
{% end %}
{% if DESC and COUNT then %}
// The next step of a key tile's walk, query tile iq of head hq of the
// group: the heads outer, the query tiles ascending; or (desc, DESC) the
// query tiles descending, the heads inner.
__device__ __forceinline__ void kv_next(int &iq, int &hq, int nq, int group, bool desc) {
  if (desc) {
    hq = hq + 1 == group ? 0 : hq + 1;
    iq -= hq == 0;
  } else {
    hq += iq + 1 == nq;
    iq = iq + 1 == nq ? 0 : iq + 1;
  }
}
{% end %}
{% if WIDE then %}
// Adds four floats at a 16-byte-aligned global address (sm_90's vector
// reduction: dQ's additions from the consumers' registers).
__device__ __forceinline__ void red_add_v4_f32(float *a, float x, float y, float z, float w) {
  asm volatile("red.global.add.v4.f32 [%0], { %1, %2, %3, %4 };\n" :: "l"(a), "f"(x), "f"(y), "f"(z), "f"(w) : "memory");
}
{% end %}
}  // namespace fj

extern "C" __global__ void {{ PAIR and "__cluster_dims__(2, 1, 1) " or "" }}__launch_bounds__({{ THREADS }}, 1)
{{ symbol }}(const fj::Params p, const fj::BwdParams g, const __grid_constant__ fj::BwdMaps maps{{ mods.kernel_param }}{{ mods.grads_param }}) {
  using fj::elem_t;
  extern __shared__ __align__(1024) unsigned char smem[];
  const unsigned base = fj::smem_base(smem);
  const unsigned sk = base + {{ OFF_K }}, sv = base + {{ OFF_V }}, sq = base + {{ OFF_Q }}, sdout = base + {{ OFF_DO }};
{% if WIDE then %}
  const unsigned sds = base + {{ OFF_DS }}, sld = base + {{ OFF_LD }}, spx = base + {{ OFF_PX }};
  const unsigned bars = base + {{ OFF_BAR }};
{% else %}
  const unsigned sds = base + {{ OFF_DS }}, sld = base + {{ OFF_LD }}, sdq = base + {{ OFF_DQ }};
  const unsigned bars = base + {{ OFF_BAR }};
  const unsigned dq_full = base + {{ OFF_DQBAR }}, dq_empty = dq_full + {{ 8 * C }}u;  // + 8 cw
{% end %}
  {{ PC.indent(TR.decls({ k, v, q, dout }, bars), 2) }}
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4;
  const fj::KvTile kt = fj::kv_tile(g.section, {{ DESC and "g.deterministic && g.deterministic != 3" or mrule.bounded and "g.deterministic" or "false" }}{{ PAIR and ", 2" or "" }});  // bwd_common.cuh's launch order
  const int nt = kt.n, n0 = nt * {{ BK }}, hk = kt.hk, b = kt.b;
{% if PAIR then %}
  // The pair: this block's rank in the cluster (its key tile's parity),
  // the pair's first key, and the pair's barriers and buffers.
  const unsigned crank = fj::cluster_rank();
  const int n0p = (nt & ~1) * 64;
  const unsigned in_full = base + {{ OFF_PBAR }}, out_free = in_full + 8u;
  const unsigned sds_in = base + {{ OFF_DSIN }}, skp = base + {{ OFF_KP }};
{% end %}
  fj::Block blk;  // the modifications' view of the block (mods.lua)
  blk.b = b;
  blk.hk = hk;
  blk.h = blk.m0 = 0;
{%
  -- The query tiles that see this key tile (scheduler.cuh's kv_head), in
  -- each role's branch: a value carried across setmaxnreg spills.
  local function walk()
%}
  {{ PC.bwd_seq(mrule) }}
{% if varlen then %}
  // TMA coordinates: packed sequences are rows of one batch.
  const int q_tb = p.cu_seqlens_q ? 0 : b, kv_tb = p.cu_seqlens_kv ? 0 : b;
{% end %}
{{ PC.piece(include("scheduler.cuh", { part = "kv_head", mrule = mrule, BM = BM, BN = BN, N0 = PAIR and "n0p" or nil })) }}
{% if BMASK then %}
    // The block mask's walk (bwd_common.cuh): the query tiles its key
    // block's transposed lists name, per query head of the group, within
    // that range.
    fj::QWalk cur = fj::qwalk_start();
    bool have = fj::qwalk_next(p, b, hk, n0, m_first, m_first + nq * {{ BM }}, cur);
{% else %}
    const int steps = nq * p.group;  // (query head of the group, row tile) pairs
{% end %}
{% if DESC then %}
    const bool desc = g.deterministic == 3;  // the descending walk (DESC)
{%   if not COUNT then %}
    const int wn = desc ? p.group : nq, m_from = desc ? m_first + (nq - 1) * {{ BM }} : m_first;  // the walk's inner count and first row
{%   end %}
{% end %}
{%
  end
%}
  if (threadIdx.x == 0) {
    {{ PC.indent(TR.init({ k, v, q, dout }, PAIR and { { "in_full", 1 }, { "out_free", 4 * C } } or WIDE and {}
                         or { { "dq_full", 1 }, { "dq_full + 8u", 1 }, { "dq_empty", 1 }, { "dq_empty + 8u", 1 } }), 4) }}
  }
{% if PAIR then %}
  fj::cluster_sync();  // both blocks' barriers ready before either signals the other's
{% else %}
  __syncthreads();
{% end %}

  if (wg == 0) {
    // ---- producer: one thread issues every load --------------------------
    fj::regs_down<{{ REGS[1] }}>();
    if (warp == 0 && lane == 0) {
{% walk() %}
      const void *mk = &maps.k, *mv = &maps.v, *mq = &maps.q, *mdout = &maps.dout;
      {{ PC.indent(k.fill(0, function(pn) return (KC):format(pn, k.panel_cols) end, PAIR and 2 * k.panel_bytes or nil), 6) }}
{% if PAIR then %}
      // The other key tile's columns of this block's half of dQ (panels
      // 2 rank and 2 rank + 1), on K's barrier.{{ DR == 192 and " At head dim 192 block 1\n      // has one (panel 2), loaded twice so that both blocks expect as many\n      // bytes: its consumer 1 adds no dQ." or "" }}
#pragma unroll
      for (int pn = 0; pn < 2; ++pn)
        fj::tma_load4(skp + pn * {{ k.panel_bytes }}u, mk, {{ k.full(0) }}, {{ (KC:gsub("n0", "(n0 ^ 64)")):format(DR == 192 and "min(2 * (int)crank + pn, 2)" or "(2 * (int)crank + pn)", k.panel_cols) }});
{% end %}
      {{ PC.indent(v.fill(0, function(pn) return (KC):format(pn, v.panel_cols) end), 6) }}
{% if ROT then %}
      {{ ROT_AT }}
{% end %}
      {{ STEP_FOR }}
        const unsigned slot = i % {{ S }}, ph = (i / {{ S }}) & 1u;
        {{ ROT and STEP_AT_ROT or STEP_AT }}
        // The rows' LSE2 and delta (padded rows: no tail) ride on Q's barrier.
        const long long f = ((long long)b * p.heads_q + h) * g.seq_pad + m0;
        {{ q.wait_empty("slot", "ph ^ 1u") }}
        {{ PC.indent(q.fill("slot", function(pn) return (QC):format(pn, q.panel_cols) end, LD_BYTES), 8) }}
        fj::bulk_load(sld + slot * {{ LD_BYTES }}u, g.lse2 + f, {{ BM * 4 }}u, {{ q.full("slot") }});
        fj::bulk_load(sld + slot * {{ LD_BYTES }}u + {{ BM * 4 }}u, g.delta + f, {{ BM * 4 }}u, {{ q.full("slot") }});
{% if PAIR then %}
        const unsigned dph = (unsigned)i & 1u;  // dO's one slot
{% end %}
        {{ dout.wait_empty(DSLOT, DPH .. " ^ 1u") }}
        {{ PC.indent(dout.fill(DSLOT, function(pn) return (QC):format(pn, dout.panel_cols) end), 8) }}
{% if BMASK then %}
        {{ STEP_NEXT }}
{% end %}
      }
{% if not WIDE then %}
    } else if (warp == 1 && lane == 0) {
      // ---- dQ's writer: each consumer's staged tile, one bulk reduce-add --
{% walk() %}
{% if not BMASK then %}
      int edge = 0;  // the deterministic mode's (scheduler.cuh's kv_rank)
{% end %}
{% if ROT then %}
      {{ ROT_AT }}
{% end %}
      {{ STEP_FOR }}
        {{ ROT and STEP_AT_ROT or STEP_AT }}
        const long long bh = (long long)b * p.heads_q + h;
{% if not BMASK then %}
        int *const turn = g.dq_turns + fj::dq_tile_base(bh, m0, 0, g.seq_pad, {{ D }}) / 4096;
        int rank = 0;
        if (g.deterministic) {
{{ PC.piece(include("scheduler.cuh", { part = "kv_rank", mrule = mrule, BM = BM, BN = BN, rot = ROT, desc = DESC,
                                       FIRST = DESC and not COUNT and "wc == 0" or nil })) }}
        }
{% end %}
{% local adders = DQ_COLS and { "0", "1" } or { "(i & 1)" } %}
{% local uses = DQ_COLS and "(unsigned)i" or "(unsigned)(i >> 1)" %}
{% if not BMASK then %}
        // The step's turns read ahead, together (relaxed: their latencies
        // run beside each other and beside the wait for the consumers'
        // tiles), then waited for from what was seen (bwd_common.cuh's
        // dq_turn_wait_from: an acquire only where it must spin).
        int seen[{{ #adders }}];
{%   for j, cw in ipairs(adders) do %}
        seen[{{ j - 1 }}] = g.deterministic ? fj::dq_turn_peek(turn + {{ DQ_COLS and cw or "0" }}) : 0;
{%   end %}
{% end %}
{% for j, cw in ipairs(adders) do %}
        fj::mbar_wait(dq_full + 8u * {{ cw }}, {{ uses }} & 1u);
{%   if not BMASK then %}
        if (g.deterministic) {
          fj::dq_turn_wait_from(turn + {{ DQ_COLS and cw or "0" }}, rank, seen[{{ j - 1 }}]);
          fj::fence_async_global();
        }
{%   end %}
        fj::bulk_reduce_add_f32(g.dq_acc + fj::dq_tile_base(bh, m0, {{ DQ_COLS and ("%s * %d"):format(cw, DQN) or "0" }}, g.seq_pad, {{ D }}),
                                sdq + {{ cw }} * {{ DQ_STAGE }}u, {{ DQ_STAGE }}u);
        fj::bulk_commit();
{% end %}
{% for j, cw in ipairs(adders) do %}
        fj::bulk_wait_read<{{ #adders - j }}>();
        fj::mbar_arrive(dq_empty + 8u * {{ cw }});
{% end %}
{% if not BMASK then %}
        if (g.deterministic) {
          // Complete, then visible to the next key tile's acquire: one
          // fence for the step's turns, then each passed relaxed (a
          // release apiece cost a MEMBAR.ALL.GPU each, the writer's
          // largest stall where two columns' turns pass a step: ncu, d96).
          fj::bulk_wait();
          fj::fence_async_global();
          fj::fence_gpu();
{%   for j, cw in ipairs(adders) do %}
          fj::dq_turn_pass(turn + {{ DQ_COLS and cw or "0" }});
{%   end %}
        }
{% end %}
{% if BMASK then %}
        {{ STEP_NEXT }}
{% end %}
      }
      // The last reductions complete before the block ends.
      fj::bulk_wait();
{% end %}
    }
  } else {
{% if WIDE then %}
    // ---- consumers, split by role (wide heads) ------------------------------
    fj::regs_up<{{ REGS[2] }}>();
{% walk() %}
    // The role, read from lane 0 so that the compiler knows it is the same
    // in every lane: each role's descriptors are then made in uniform
    // registers (as the narrow kernel's).
    const int cw = __shfl_sync(0xffffffffu, wg - 1, 0);  // 0: S^T, P^T, dV; 1: dP^T, dS^T, dK
    const int tid = threadIdx.x % 128; // this thread's place in its warpgroup (P^T's handoff)
    const int wr = (warp % 4) * 16;    // this warp's first row of a product
    const int acc_r = fj_base_acc[lane] & 15, acc_c = fj_base_acc[lane] >> 4;
    {{ mods.scales(4, "") }}
    // The operands (the tile's 64 keys of K and V); dQ's B, K's columns,
    // is each part's.
{{ operands("ska", "sva", true) }}

    float acc[{{ DR // 16 }}][8];  // dV (consumer 0) or dK (consumer 1)
#pragma unroll
    for (int d = 0; d < {{ DR // 16 }}; ++d)
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[d][i] = 0.f;
    {{ k.wait_full(0, "0") }}
    {{ v.wait_full(0, "0") }}

    // Each role its own walk of the steps (one loop with both roles' values
    // live spills).
{% for role = 0, 1 do %}
{%   local part = DQ_PARTS[role + 1] %}
    {{ role == 0 and "if (cw == 0) {" or "} else {" }}
{%   if not BMASK then %}
      int edge = 0;  // the deterministic mode's (scheduler.cuh's kv_rank)
      int *pend = nullptr;  // the last step's dQ turns, not yet passed on (pass_turns)
      const bool late = {{ LATE }};  // passed a step late (pass_turns)
{%   end %}
{%   if ROT then %}
      {{ ROT_AT }}
{%   end %}
      {{ STEP_FOR }}
        const unsigned ska = fj::opaque_u32(sk), sva = fj::opaque_u32(sv);
        const unsigned slot = i % {{ S }}, ph = (i / {{ S }}) & 1u;
{% if PAIR then %}
        const unsigned dph = (unsigned)i & 1u;  // dO's one slot; the pair's barriers' phase
{% end %}
        {{ STEP_AT_C }}
{% if BMASK then %}
        const bool bm_part = cur.part;  // the mask expression applies (a partial block)
        (void)bm_part;
{% end %}
        const unsigned lse2 = sld + slot * {{ LD_BYTES }}u + 4 * acc_c, delta = lse2 + {{ BM * 4 }}u;
        float x[{{ BM // 16 }}][8];     // S^T (consumer 0) or dP^T (consumer 1)
        unsigned op[{{ BM // 16 }}][4]; // P^T or dS^T as A operands
        {{ q.wait_full("slot", "ph") }}
        {{ dout.wait_full(DSLOT, DPH) }}
{%   if role == 0 then %}
        fj::wg_fence();
#pragma unroll
        for (int kk = 0; kk < {{ KS }}; ++kk) fj::wg_ss_{{ T }}_{{ BM }}(x, FJ_KA(kk), FJ_QB(slot, kk), kk);
        fj::wg_commit();
        {{ score_pre("n0", 8) }}
        fj::wg_wait<0>();
    {{ hold("x", BM // 16) }}
        // The score step on S^T (a register's key is its row, its query its
        // column), then P^T = exp2(S^T sl2 - LSE2): the dV operand, and
        // consumer 1's factor of dS^T{{ mods.softcap and " (times 1 - tanh^2)" or "" }}.
        {{ score_head("x", "n0", 8) }}
#pragma unroll
        for (int j = 0; j < {{ BM // 16 }}; ++j) {
{% for _, c in ipairs(cols) do %}
          const float l{{ c }} = fj::ld_shared_f32(lse2 + 4 * (j * 16 + {{ c }}));
{% end %}
{%     if USER then %}
{%       if not WHOLE then %}
          {{ user_tile("x", 10) }}
{%       end %}
{%       for i = 0, acc.slots - 1 do %}
          {{ p_elem("x", i) }}
          fj::st_shared_b32(spx + 4u * (unsigned)((j * 8 + {{ i }}) * 128 + tid), __float_as_uint({{ ds_factor("x", i) }}));
{%       end %}
{%     else %}
{% for i = 0, acc.slots - 1 do %}
{%   if mods.softcap then %}
          const float th{{ i }} = fmaxf(x[j][{{ i }}], -1.f);  // a hidden element's -inf counts as -1
{%   end %}
          x[j][{{ i }}] = fj::fast_exp2(fmaf(x[j][{{ i }}], sl2, -l{{ acc.dcol[i] }}));
          fj::st_shared_b32(spx + 4u * (unsigned)((j * 8 + {{ i }}) * 128 + tid), __float_as_uint(x[j][{{ i }}]{{ mods.softcap and (" * (1.f - th%d * th%d)"):format(i, i) or "" }}));
{% end %}
{%     end %}
          {{ pack_a("op[j]", "x[j]", 10) }}
        }
        fj::bar_arrive(1, 256);  // P^T handed over
        // dV += P^T dO.
        fj::wg_fence();
#pragma unroll
        for (int kk = 0; kk < {{ BM // KSTEP }}; ++kk) fj::wg_rs_{{ T }}_{{ DR }}_t(acc, op[kk], FJ_DOT(slot, kk), 1);
        fj::wg_commit();
{%     if PAIR then %}
        // dO read: its one slot back to the producer (consumer 1 has read
        // it for dP^T).
        fj::wg_wait<0>();
      {{ hold("acc", DR // 16) }}
        {{ PC.indent(dout.release("0"), 8) }}
{%     end %}
{%   else %}
        fj::wg_fence();
#pragma unroll
        for (int kk = 0; kk < {{ KS }}; ++kk) fj::wg_ss_{{ T }}_{{ BM }}(x, FJ_VA(kk), FJ_DOB(slot, kk), kk);
        fj::wg_commit();
        fj::wg_wait<0>();
    {{ hold("x", BM // 16) }}
{%     if PAIR then %}
        {{ PC.indent(dout.release("0"), 8) }}
        // The other block has read the dS^T this one sent last step: the
        // copy has read this block's buffer, and the other's is free.
        if (tid == 0) fj::mbar_wait_cluster(out_free, dph ^ 1u);
{%     end %}
        fj::bar_sync(1, 256);  // P^T handed over
        // dS^T = P^T (dP^T - delta), then dK += dS^T Q.
#pragma unroll
        for (int j = 0; j < {{ BM // 16 }}; ++j) {
{% for _, c in ipairs(cols) do %}
          const float d{{ c }} = fj::ld_shared_f32(delta + 4 * (j * 16 + {{ c }}));
{% end %}
{% for i = 0, acc.slots - 1 do %}
          x[j][{{ i }}] = fj::ld_shared_f32(spx + 4u * (unsigned)((j * 8 + {{ i }}) * 128 + tid)) * (x[j][{{ i }}] - d{{ acc.dcol[i] }});
{% end %}
          {{ pack_a("op[j]", "x[j]", 10) }}
        }
        fj::wg_fence();
#pragma unroll
        for (int kk = 0; kk < {{ BM // KSTEP }}; ++kk) fj::wg_rs_{{ T }}_{{ DR }}_t(acc, op[kk], FJ_QT(slot, kk), 1);
        fj::wg_commit();
        // dS^T to shared memory ([key][query], swizzled) for dQ.
#pragma unroll
        for (int j = 0; j < {{ BM // 16 }}; ++j) {
{% for _, pr in ipairs(pairs) do %}
{%   local reg %}
{%   for r = 0, 3 do if p_from[2 * r] == pr[1] and p_from[2 * r + 1] == pr[2] then reg = r end end %}
          fj::st_shared_b32(sds + fj::sw128(wr + acc_r + {{ acc.drow[pr[1]] }}, j * 16 + acc_c + {{ acc.dcol[pr[1]] }}),
                            {{ reg and ("op[j][%d]"):format(reg) or ("fj::pack2(x[j][%d], x[j][%d])"):format(pr[1], pr[2]) }});
{% end %}
        }
        fj::fence_async_smem();
{%     if PAIR then %}
        // This step's dS^T to the other block as soon as this warpgroup
        // has written it (named barrier 3: consumer 1's threads), before
        // it waits for consumer 0 at barrier 2; and this block's
        // expectation of the other's.  The deterministic mode sends after
        // barrier 2, as before: early it ran 2-4% slower (PERF.md T15).
        if (!g.deterministic) {
          fj::bar_sync(3, 128);
          if (tid == 0) {
            {{ send_ds(12) }}
          }
        }
{%     end %}
{%   end %}
        // dS^T written (and visible to wgmma) before either reads it: each
        // role arrives at the barrier the other waits at (named barriers 2
        // and 4), so that no barrier is waited at from two places in the
        // code, which an aligned bar.sync forbids (synccheck's "divergent
        // threads in block").
        fj::bar_arrive({{ role == 0 and 2 or 4 }}, 256);
        fj::bar_sync({{ role == 0 and 4 or 2 }}, 256);
{%   if PAIR and role == 1 then %}
        if (g.deterministic && tid == 0) {
          {{ send_ds(10) }}
        }
{%   end %}
        const long long bh = (long long)b * p.heads_q + h;
{%   if not BMASK then %}
        int *const turn = g.dq_turns + fj::dq_tile_base(bh, m0, 0, g.seq_pad, {{ D }}) / 4096;
        int rank = 0;
        if (g.deterministic) {
{{ PC.piece(include("scheduler.cuh", { part = "kv_rank", mrule = mrule, BM = BM, BN = BN, rot = ROT, desc = DESC,
                                       NT = PAIR and "(nt >> 1)" or nil, TILES = PAIR and "((int)gridDim.x >> 1)" or nil })) }}
        }
{%   end %}
{%   if PAIR then %}
{%     if DR == 192 and role == 1 then %}
        // Head dim 192: block 1's consumer 1 has no panel of dQ (columns
        // 192-255); it only tells the other block its dS^T is not read here.
        if (crank != 0u) {
          __syncwarp();
          if (lane == 0) fj::mbar_arrive_peer(fj::peer_addr(out_free, crank ^ 1u));
        } else
{%     end %}
        {
          // dQ += dS K over the pair's 128 keys, columns c0..c0 + 63: this
          // block's keys, then the other's (its dS^T, once copied here).
          const int c0 = (int)crank * 128 + {{ role * 64 }};
          const int seen = g.deterministic && lane == 0 ? fj::dq_turn_peek(turn + c0 / 64) : 0;
          float dq[4][8];
          fj::wg_fence();
#pragma unroll
          for (int kk = 0; kk < {{ BK // KSTEP }}; ++kk)
            fj::wg_ss_{{ T }}_64_tt(dq, FJ_DSA(kk), {{ mnmajor_at(("ska + (2 * crank + %d) * %d"):format(role, k.panel_bytes), k.panel_bytes, "kk") }}, kk);
          fj::wg_commit();
          fj::mbar_wait(in_full, dph);
          fj::wg_fence();  // (else ptxas fences after the spin itself, serializing every wgmma)
#pragma unroll
          for (int kk = 0; kk < {{ BK // KSTEP }}; ++kk)
            fj::wg_ss_{{ T }}_64_tt(dq, FJ_DSIN(kk), {{ mnmajor_at(("skp + %d"):format(role * k.panel_bytes), k.panel_bytes, "kk") }}, 1);
          fj::wg_commit();
          if (late) {
            // The last step's turns, while the products run.
            {{ pass_turns(role, part, 12) }}
          }
          fj::wg_wait<0>();
    {{ hold("dq", 4) }}
          // The other block's dS^T read: its buffer here is free again.
          __syncwarp();
          if (lane == 0) fj::mbar_arrive_peer(fj::peer_addr(out_free, crank ^ 1u));
          float *const tile = g.dq_acc + fj::dq_tile_base(bh, m0, c0, g.seq_pad, {{ D }});
          if (g.deterministic) {
            // This dQ tile's turn: one add a pair, in the pairs' order,
            // each warp's (four a pair: pass_turns).
            if (lane == 0) fj::dq_turn_wait_from(turn + c0 / 64, 4 * rank, seen);
            __syncwarp();
            pend = turn;
          }
          {{ PC.indent(red_tile(), 10) }}
          if (!late) {
            {{ pass_turns(role, part, 12) }}
          }
        }
{%   end %}
{%   for c0 = part.c0, PAIR and part.c0 - 1 or part.c0 + part.n - 1, 64 do %}
        {
          // dQ += dS K, columns {{ c0 }}-{{ c0 + 63 }}, added from the registers.
{%     if not BMASK then %}
          const int seen = g.deterministic && lane == 0 ? fj::dq_turn_peek(turn + {{ c0 // 64 }}) : 0;
{%     end %}
          float dq[4][8];
          fj::wg_fence();
#pragma unroll
          for (int kk = 0; kk < {{ BN // KSTEP }}; ++kk)
            fj::wg_ss_{{ T }}_64_tt(dq, FJ_DSA(kk), {{ mnmajor_at(("ska + %d"):format(c0 // 64 * k.panel_bytes), k.panel_bytes, "kk") }}, kk);
          fj::wg_commit();
{%     if not BMASK and c0 == part.c0 then %}
          if (late) {
            // The last step's turns, while the product runs.
            {{ pass_turns(role, part, 12) }}
          }
{%     end %}
          fj::wg_wait<0>();
    {{ hold("dq", 4) }}
          float *const tile = g.dq_acc + fj::dq_tile_base(bh, m0, {{ c0 }}, g.seq_pad, {{ D }});
{%     if not BMASK then %}
          if (g.deterministic) {
            // This dQ tile's turn, each warp's (four a key tile:
            // pass_turns).
            if (lane == 0) fj::dq_turn_wait_from(turn + {{ c0 // 64 }}, 4 * rank, seen);
            __syncwarp();
            pend = turn;
          }
{%     end %}
          {{ PC.indent(red_tile(), 10) }}
{%     if not BMASK and c0 + 64 >= part.c0 + part.n then %}
          if (!late) {
            {{ pass_turns(role, part, 12) }}
          }
{%     end %}
        }
{%   end %}
        fj::wg_wait<0>();
      {{ hold("acc", DR // 16) }}
        {{ PC.indent(q.release("slot"), 6) }}
{%   if not PAIR then %}
        {{ PC.indent(dout.release("slot"), 6) }}
{%   end %}
{%   if BMASK then %}
        {{ STEP_NEXT }}
{%   end %}
      }
{%   if not BMASK then %}
      // The last step's turns.
      {{ pass_turns(role, part, 6) }}
{%   end %}
{% end %}
    }

    // dV (consumer 0) or dK times the softmax scale (consumer 1) over the
    // head dim; keys past the sequence not written.  Every tile held first:
    // a padded head dim's last tiles, never stored, would otherwise be dead
    // outputs of the step's wgmmas, and ptxas serializes all of them for it
    // (C7511 at head dims 144-176 and 208-240).
    {{ hold("acc", DR // 16) }}
    const float out_scale = cw == 0 ? 1.f : g.scale;
    const long long os = cw == 0 ? g.dv_stride[2] : g.dk_stride[2];
    elem_t *const og = cw == 0 ? fj::head_rows<elem_t>(g.dv, g.dv_stride, b, hk) + kv_row0 * os
                               : fj::head_rows<elem_t>(g.dk, g.dk_stride, b, hk) + kv_row0 * os;
#pragma unroll
    for (int d = 0; d < {{ D // 16 }}; ++d) {
{% for _, pr in ipairs(pairs) do %}
      {
        const int r = n0 + wr + acc_r + {{ acc.drow[pr[1]] }}, c = d * 16 + acc_c + {{ acc.dcol[pr[1]] }};
        if (r < kv_rows)
          *reinterpret_cast<unsigned *>(og + (long long)r * os + c) = fj::pack2(acc[d][{{ pr[1] }}] * out_scale, acc[d][{{ pr[2] }}] * out_scale);
      }
{% end %}
    }
{{ undefine() }}
{% else %}
    // ---- consumers --------------------------------------------------------
    fj::regs_up<{{ REGS[2] }}>();
{% walk() %}
    // This consumer warpgroup, read from lane 0 so that the compiler knows
    // it is the same in every lane: the descriptors of K's and V's rows of
    // it (and all that follows from it) are then made in uniform registers.
{% if mods.pgrads then %}
    const int cw = wg - 1;                          // this consumer warpgroup
{% else %}
    const int cw = __shfl_sync(0xffffffffu, wg - 1, 0);
{% end %}
    const int kw = cw * 64;                         // its first key in the tile
    const int wr = (warp % 4) * 16;                 // this warp's first row of a product
    const int acc_r = fj_base_acc[lane] & 15, acc_c = fj_base_acc[lane] >> 4;
    {{ mods.scales(4, "") }}
    // The operands (this warpgroup's 64 rows of K and V), and dQ's B, K's
    // columns (MN-major).
{{ operands(("ska + %d * kw"):format(TR.ROW_BYTES), ("sva + %d * kw"):format(TR.ROW_BYTES), not mods.pgrads) }}
#define FJ_KB(kk) {{ (mods.pgrads and mnmajor or mnmajor_at)(DQ_COLS and ("ska + cw * %d"):format((DQN // 64) * k.panel_bytes) or "ska", k.panel_bytes, "kk") }}

    float dk[{{ DR // 16 }}][8], dv[{{ DR // 16 }}][8];
#pragma unroll
    for (int d = 0; d < {{ DR // 16 }}; ++d)
#pragma unroll
      for (int i = 0; i < 8; ++i) dk[d][i] = dv[d][i] = 0.f;
    {{ k.wait_full(0, "0") }}
    {{ v.wait_full(0, "0") }}
{% if KV_REGS then %}
    // This warpgroup's 64 keys of K and V as the A operands of S^T and dP^T
    // for the whole walk: word r of k step kk holds A slots 2r and 2r + 1
    // of the probed table, whose lane bases are the accumulator's (lut.lua's
    // a_from_acc checks it lane for lane), in the tile's one panel.
    unsigned ka[{{ KS }}][4], va[{{ KS }}][4];
#pragma unroll
    for (int kk = 0; kk < {{ KS }}; ++kk) {
{%   for r = 0, 3 do %}
      {
        const unsigned e = fj::sw128(kw + wr + acc_r + {{ qa.drow[2 * r] }}, kk * {{ KSTEP }} + acc_c + {{ qa.dcol[2 * r] }});
        ka[kk][{{ r }}] = fj::ld_shared_b32(sk + e);
        va[kk][{{ r }}] = fj::ld_shared_b32(sv + e);
      }
{%   end %}
    }
{% end %}

    {{ STEP_FOR }}
{% if KV_REGS then %}
      // K's address (dQ's B) made anew each step, so that the compiler does
      // not keep every k step's descriptor of it in registers across it.
      const unsigned ska = fj::opaque_u32(sk);
{% else %}
      // K's and V's addresses made anew each step, so that the compiler does
      // not keep every k step's descriptor of them in registers across it.
      const unsigned ska = fj::opaque_u32(sk), sva = fj::opaque_u32(sv);
{% end %}
      const unsigned slot = i % {{ S }}, ph = (i / {{ S }}) & 1u, buf = i & 1;
      {{ STEP_AT }}
{% if BMASK then %}
      const bool bm_part = cur.part;  // the mask expression applies (a partial block)
      (void)bm_part;
{% end %}
      (void)h;
      float s[{{ BM // 16 }}][8], dp[{{ BM // 16 }}][8];
      {{ q.wait_full("slot", "ph") }}
      fj::wg_fence();
#pragma unroll
{% if KV_REGS then %}
      for (int kk = 0; kk < {{ KS }}; ++kk) fj::wg_rs_{{ T }}_{{ BM }}(s, ka[kk], FJ_QB(slot, kk), kk);
{% else %}
      for (int kk = 0; kk < {{ KS }}; ++kk) fj::wg_ss_{{ T }}_{{ BM }}(s, FJ_KA(kk), FJ_QB(slot, kk), kk);
{% end %}
      fj::wg_commit();
      {{ dout.wait_full("slot", "ph") }}
#pragma unroll
{% if KV_REGS then %}
      for (int kk = 0; kk < {{ KS }}; ++kk) fj::wg_rs_{{ T }}_{{ BM }}(dp, va[kk], FJ_DOB(slot, kk), kk);
{% else %}
      for (int kk = 0; kk < {{ KS }}; ++kk) fj::wg_ss_{{ T }}_{{ BM }}(dp, FJ_VA(kk), FJ_DOB(slot, kk), kk);
{% end %}
      fj::wg_commit();
{% if SPLIT then %}
      // S^T done (dP^T may still run): the score step and P^T on the CUDA
      // cores while the tensor cores take dP^T.
      {{ score_pre("n0 + kw", 6) }}
      fj::wg_wait<1>();
    {{ hold("s", BM // 16) }}
      const unsigned lse2 = sld + slot * {{ LD_BYTES }}u + 4 * acc_c, delta = lse2 + {{ BM * 4 }}u;
      {{ score_head("s", "n0 + kw", 6) }}
      // P^T = exp2(S^T sl2 - LSE2) (a register's key is its row, its query
      // its column), packed as dV's A operand, and kept in float32 for
      // dS^T.
      unsigned pk[{{ BM // 16 }}][4], dsk[{{ BM // 16 }}][4];
#pragma unroll
      for (int j = 0; j < {{ BM // 16 }}; ++j) {
        {{ PC.indent(lane_cols("l", "lse2"), 8) }}
{% for i = 0, acc.slots - 1 do %}
        s[j][{{ i }}] = fj::fast_exp2(fmaf(s[j][{{ i }}], sl2, -l{{ acc.dcol[i] }}));
{% end %}
        {{ pack_a("pk[j]", "s[j]", 8) }}
      }
      // dV += P^T dO, issued behind dP^T: the compiler cannot move P^T's
      // work past it, nor the tensor cores idle between the two.
      fj::wg_fence();
#pragma unroll
      for (int kk = 0; kk < {{ BM // KSTEP }}; ++kk) fj::wg_rs_{{ T }}_{{ DR }}_t(dv, pk[kk], FJ_DOT(slot, kk), 1);
      fj::wg_commit();
      // dP^T done (dV may still run).
      fj::wg_wait<1>();
    {{ hold("dp", BM // 16) }}
      // dS^T = P^T (dP^T - delta), tile by tile of 16 queries, packed as
      // dK's A operand.
#pragma unroll
      for (int j = 0; j < {{ BM // 16 }}; ++j) {
        {{ PC.indent(lane_cols("d", "delta"), 8) }}
{% for i = 0, acc.slots - 1 do %}
        dp[j][{{ i }}] = s[j][{{ i }}] * (dp[j][{{ i }}] - d{{ acc.dcol[i] }});
{% end %}
        {{ pack_a("dsk[j]", "dp[j]", 8) }}
      }
{% else %}
      {{ score_pre("n0 + kw", 6) }}
      fj::wg_wait<0>();
    {{ hold("s", BM // 16) }}
    {{ hold("dp", BM // 16) }}

      // Tile by tile of 16 queries, so that S^T and dP^T die as their
      // operands are made: the score step on S^T (a register's key is its
      // row, its query its column), P^T = exp2(S^T sl2 - LSE2), dS^T = P^T
      // (dP^T - delta){{ mods.softcap and " (1 - tanh^2)" or "" }}, both packed as A operands.
      const unsigned lse2 = sld + slot * {{ LD_BYTES }}u + 4 * acc_c, delta = lse2 + {{ BM * 4 }}u;
      {{ score_head("s", "n0 + kw", 6) }}
      unsigned pk[{{ BM // 16 }}][4], dsk[{{ BM // 16 }}][4];
#pragma unroll
      for (int j = 0; j < {{ BM // 16 }}; ++j) {
        {{ PC.indent(lane_cols("l", "lse2"), 8) }}
        {{ PC.indent(lane_cols("d", "delta"), 8) }}
{% if USER then %}
{%   if not WHOLE then %}
        {{ user_tile("s", 8) }}
{%   end %}
{%   for i = 0, acc.slots - 1 do %}
        {{ p_elem("s", i) }}
{%     if mods.pgrads then %}
        {
          // The parameters' gradients take dS^T before the derivative, at the raw score (fj_param_grads).
          const float dse = s[j][{{ i }}] * (dp[j][{{ i }}] - d{{ acc.dcol[i] }}){{ mods.softcap and (" * (1.f - th%d * th%d)"):format(i, i) or "" }};
          if (s[j][{{ i }}] > 0.f) {{ mods.apply_pgrads("dse", "sr" .. i, "uq" .. i, "h", "uk" .. i) }}
          dp[j][{{ i }}] = {{ mods.grad_const and ("dse * g%d"):format(i) or ("s[j][%d] > 0.f ? dse * g%d : 0.f"):format(i, i) }};
        }
{%     else %}
        dp[j][{{ i }}] = (dp[j][{{ i }}] - d{{ acc.dcol[i] }}) * {{ ds_factor("s", i) }};
{%     end %}
{%   end %}
{% else %}
{% for i = 0, acc.slots - 1 do %}
{%   if mods.softcap then %}
        // d(cap tanh(x / cap)) / dx = 1 - tanh^2 (a hidden element's -inf
        // counts as -1: its P is 0).
        const float th{{ i }} = fmaxf(s[j][{{ i }}], -1.f);
{%   end %}
        s[j][{{ i }}] = fj::fast_exp2(fmaf(s[j][{{ i }}], sl2, -l{{ acc.dcol[i] }}));
        dp[j][{{ i }}] = s[j][{{ i }}] * (dp[j][{{ i }}] - d{{ acc.dcol[i] }}){{ mods.softcap and (" * (1.f - th%d * th%d)"):format(i, i) or "" }};
{% end %}
{% end %}
{% for r = 0, 3 do %}
        pk[j][{{ r }}] = fj::pack2(s[j][{{ p_from[2 * r] }}], s[j][{{ p_from[2 * r + 1] }}]);
        dsk[j][{{ r }}] = fj::pack2(dp[j][{{ p_from[2 * r] }}], dp[j][{{ p_from[2 * r + 1] }}]);
{% end %}
      }
{% if mods.pgrads_nsum > 0 then %}
      {{ mods.pgrads_flush("h") }}
{% end %}
      // dV += P^T dO{{ DQ_FIRST and "" or ", dK += dS^T Q" }} issued; dS^T to shared memory meanwhile.
      fj::wg_fence();
#pragma unroll
      for (int kk = 0; kk < {{ BM // KSTEP }}; ++kk) fj::wg_rs_{{ T }}_{{ DR }}_t(dv, pk[kk], FJ_DOT(slot, kk), 1);
{%   if not DQ_FIRST then %}
#pragma unroll
      for (int kk = 0; kk < {{ BM // KSTEP }}; ++kk) fj::wg_rs_{{ T }}_{{ DR }}_t(dk, dsk[kk], FJ_QT(slot, kk), 1);
{%   end %}
      fj::wg_commit();
{% end %}
      // dS^T to shared memory ([key][query], swizzled) for dQ.
      const unsigned ds_rows = sds + buf * {{ DS_BYTES }}u;
{% if XJ then %}
{%   for n, pr in ipairs(pairs) do %}
      const unsigned ds_at{{ n }} = ds_rows + fj::sw128(kw + wr + acc_r + {{ acc.drow[pr[1]] }}, acc_c + {{ acc.dcol[pr[1]] }});
{%   end %}
{% end %}
#pragma unroll
      for (int j = 0; j < {{ BM // 16 }}; ++j) {
{% for n, pr in ipairs(pairs) do %}
{%   local reg %}
{%   for r = 0, 3 do if p_from[2 * r] == pr[1] and p_from[2 * r + 1] == pr[2] then reg = r end end %}
{%   if XJ then %}
        fj::st_shared_b32(ds_at{{ n }} ^ (unsigned)(j * 32),
{%   else %}
        fj::st_shared_b32(ds_rows + fj::sw128(kw + wr + acc_r + {{ acc.drow[pr[1]] }}, j * 16 + acc_c + {{ acc.dcol[pr[1]] }}),
{%   end %}
                          {{ reg and ("dsk[j][%d]"):format(reg) or ("fj::pack2(dp[j][%d], dp[j][%d])"):format(pr[1], pr[2]) }});
{% end %}
      }
      // Both warpgroups' dS^T written (and visible to wgmma) before dQ reads it.
      fj::fence_async_smem();
      fj::bar_sync(1, {{ 128 * C }});
{% local dk_issue = ("fj::wg_fence();\n#pragma unroll\nfor (int kk = 0; kk < %d; ++kk) fj::wg_rs_%s_%d_t(dk, dsk[kk], FJ_QT(slot, kk), 1);\nfj::wg_commit();"):format(BM // KSTEP, T, DR) %}
{% if DQ_COLS then %}
      {
{% else %}
      if ((i & 1) == cw) {
{% end %}
{% if DQ_FIRST then %}
        // dQ += dS K, then dK += dS^T Q behind it: dQ is staged while the
        // tensor cores run dK.
{% else %}
        // dQ += dS K.
{% end %}
        float dq[{{ DQN // 16 }}][8];
        fj::wg_fence();
#pragma unroll
        for (int kk = 0; kk < {{ BN // KSTEP }}; ++kk) fj::wg_ss_{{ T }}_{{ DQN }}_tt(dq, FJ_DSA(buf, kk), FJ_KB(kk), kk);
        fj::wg_commit();
{% if DQ_FIRST then %}
        {{ PC.indent(dk_issue, 8) }}
        // dV and dQ done (dK may still run).
        fj::wg_wait<1>();
{% else %}
        fj::wg_wait<0>();
{% end %}
    {{ hold("dq", DQN // 16) }}
        // dQ's float32 reductions: staged in this warpgroup's buffer as
        // the accumulator's tile (bwd_common.cuh's dq_tile_off) once the
        // writer's last reduce-add has read it, then handed to the writer.
        fj::mbar_wait(dq_empty + 8u * cw, ({{ DQ_COLS and "(unsigned)i" or "(unsigned)(i >> 1)" }} & 1u) ^ 1u);
        const unsigned stage = sdq + cw * {{ DQ_STAGE }}u;
{% if XJ then %}
{%   for n, pr in ipairs(pairs) do %}
        const unsigned dq_at{{ n }} = stage + 4u * (unsigned)fj::dq_tile_off(wr + acc_r + {{ acc.drow[pr[1]] }}, acc_c + {{ acc.dcol[pr[1]] }});
{%   end %}
{% end %}
#pragma unroll
        for (int j = 0; j < {{ DQN // 16 }}; ++j) {
{% for n, pr in ipairs(pairs) do %}
{%   if XJ then %}
          fj::st_shared_v2_f32(dq_at{{ n }} ^ (unsigned)(j * 64), dq[j][{{ pr[1] }}], dq[j][{{ pr[2] }}]);
{%   else %}
          fj::st_shared_v2_f32(stage + 4u * (unsigned)fj::dq_tile_off(wr + acc_r + {{ acc.drow[pr[1]] }}, j * 16 + acc_c + {{ acc.dcol[pr[1]] }}), dq[j][{{ pr[1] }}], dq[j][{{ pr[2] }}]);
{%   end %}
{% end %}
        }
        fj::fence_async_smem();
        fj::bar_sync(2 + cw, 128);
        if (threadIdx.x % 128 == 0) fj::mbar_arrive(dq_full + 8u * cw);
      }
{% if DQ_FIRST and not DQ_COLS then %}
      else {
        // dK += dS^T Q (the other consumer's turn at dQ).
        {{ PC.indent(dk_issue, 8) }}
      }
{% end %}
      fj::wg_wait<0>();
    {{ hold("dv", DR // 16) }}
    {{ hold("dk", DR // 16) }}
      {{ PC.indent(q.release("slot"), 6) }}
      {{ PC.indent(dout.release("slot"), 6) }}
{% if BMASK then %}
      {{ STEP_NEXT }}
{% end %}
    }

    // dK (times the softmax scale) and dV; keys past the sequence not written.
    elem_t *dkg = fj::head_rows<elem_t>(g.dk, g.dk_stride, b, hk) + kv_row0 * g.dk_stride[2];
    elem_t *dvg = fj::head_rows<elem_t>(g.dv, g.dv_stride, b, hk) + kv_row0 * g.dv_stride[2];
#pragma unroll
    for (int d = 0; d < {{ D // 16 }}; ++d) {
{% for _, pr in ipairs(pairs) do %}
      {
        const int r = n0 + kw + wr + acc_r + {{ acc.drow[pr[1]] }}, c = d * 16 + acc_c + {{ acc.dcol[pr[1]] }};
        if (r < kv_rows) {
          *reinterpret_cast<unsigned *>(dkg + (long long)r * g.dk_stride[2] + c) = fj::pack2(dk[d][{{ pr[1] }}] * g.scale, dk[d][{{ pr[2] }}] * g.scale);
          *reinterpret_cast<unsigned *>(dvg + (long long)r * g.dv_stride[2] + c) = fj::pack2(dv[d][{{ pr[1] }}], dv[d][{{ pr[2] }}]);
        }
      }
{% end %}
    }
{{ undefine({ "FJ_KB" }) }}
{% end %}
  }
{% if PAIR then %}
  // Neither block of the pair ends while the other may still copy into
  // its shared memory or arrive on its barriers.
  fj::cluster_sync();
{% end %}
{{ TR.undefs({ k, v, q, dout }) }}
}
{% if mods.any then %}
{{ include("mods.cuh", { mods = mods, part = "defs" }) }}
{% end %}
