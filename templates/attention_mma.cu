{#
  attention_mma.cu: the mma.sync family (m16n8k16, inline PTX), FlashAttention-2
  style.

  One thread block covers tile_m query rows of one (batch, head); each warp
  owns 16 of them (or 32: two 16-row slices that share every K and V
  fragment it loads).  With tile_m 16 and several warps (KS, for decode's
  few rows), every warp has the 16 rows and its own share of each key
  tile's keys, with its own max, sums and O, merged after the walk.  Per
  key tile:
    S = Q K^T   Q fragments stay in registers for the whole walk (when they
                fit), K fragments come from shared memory by ldmatrix.x4;
    softmax     on the accumulators: raw row max through the lanes that share
                a row, p = 2^(s * scale - max * scale) as one FMA and one ex2,
                per-lane partial row sums (reduced across lanes once, at the
                end), O rescaled by 2^(old max - new max);
    O += P V    P converted in registers into the A operand (the accumulator
                of S holds exactly what an A fragment needs, lane for lane),
                V fragments by ldmatrix.x4.trans.
  K and V arrive through a ring of `stages` shared buffers (cp.async for 2-3),
  laid out plain, padded (+16 bytes a row) or XOR-swizzled by 16-byte chunk.
  Key tiles wholly above the causal diagonal are never loaded; masks apply
  only to tiles that cross the diagonal or the sequence end.

  Two axes serve few query rows (decode).  pack_gqa: the grid counts KV
  heads, and tile row R is query position R / group of the KV head's query
  head R % group, so K and V are read once for all of them.  split_kv: the
  p.splits blocks of one row tile each take an equal share of its key
  tiles and write O / l and the log-sum-exp as float32 partials
  (p.o_part, p.lse_part), which combine.cu merges.

  Wide heads (head_dim_v above 256: CS) keep no warp's O whole: with
  tile_m 16 or 32 every warp has all the rows, computes S for its share
  of each key tile's keys (as KS), and owns head_dim_v / warps of O's
  columns.  The warps' row maxima meet in shared memory before the
  exponentials (one max per row for all), P goes through shared memory as
  A-operand registers (every warp multiplies all of it by its columns of
  V), and the per-warp row sums add up after the walk.  Split head dims
  (head_dim_v below head_dim, VK) read V as the first head_dim_v columns
  of K's rows -- MLA's latent cache, where the caller passes v = k --, so
  only K's tiles are loaded.

  Head dims that are a multiple of 8 but not of 16 (40, 72, 264, ...)
  are padded to the next multiple of 16 (and V's above 256 to 16 columns
  a warp): a tile row has the padded width, the loads fill the head dim's
  columns, and the rest is zeroed once before them, so Q's and K's pad
  adds nothing to S; V's pad reaches only O's pad columns, never stored.
  FP8 K/V (a 16-byte chunk of 16 elements) take multiples of 16.

  Attention sinks (mods.sinks) enter at the end: the epilogue adds each
  row's sink, of its own query head (head(r): packed rows differ), to the
  row's denominator; split partials leave it to the combine.

  Two axes serve batches of unequal sequences.  varlen: each block reads
  its sequence's lengths and first rows (fj::seq_of) and returns at once
  past its end; the mask uses the sequence's own lengths.  paged: key rows
  are tokens of pages found through the block table (tile_io.cuh's
  load_tile_paged), one table entry per row loaded.

  Every register-level fact comes from the probed tables of the mma kinds
  (lut.lua): which (row, col) an accumulator slot holds (output addresses,
  masks), which lanes share a row (the XOR shuffles), and which accumulator
  slot feeds each A slot of P.  The probe runs the same loads and the same
  instruction (mma_frag.cuh) and checks its products, so the tables describe
  this kernel's fragments.
#}
{%
  local L = import("lut.lua")
  local PACK, SPLIT, PAGED = pack_gqa, split_kv, paged
  local VL = varlen or paged
  -- A varlen block's sequence lengths and mask offset are locals.
  local LEN_Q, LEN_KV = VL and "len_q" or "p.seq_q", VL and "len_kv" or "p.seq_kv"
  local mrule = import("mask.lua").new(causal, PACK,
                                       VL and { q = "len_q", kv = "len_kv", off = "causal_off" } or nil,
                                       window)
  -- The problem's score and mask functions (mods.lua); with a window or a
  -- split, a block's keys start at kv0 rather than 0.
  local mods = import("mods.lua").new{ score = score_mod, mask = mask_mod, params = mod_params,
                                       softcap = softcap, sinks = sinks, checked = checked,
                                       bounded = dtype == "bf16" }
  local D, BM, BN, W, S = head_dim, tile_m, tile_n, warps, stages
  -- V's and O's columns: head_dim_v where it differs (VK: then V is K's
  -- first DV columns), split over the warps where wide (CS: DVW each).
  local DV = head_dim_v or D
  local VK = DV ~= D
  local CS = DV > 256
  -- A caller's block mask lists each row tile's key tiles (block.cuh);
  -- the mask expression applies only on its partial blocks' tiles.
  local BMASK = (block_kv or 0) > 0 and { q = block_q, kv = block_kv } or nil
  if BMASK then mods.mask_guard = "bm_part" end
  local OFFSET = (split_kv or window) and not BMASK
  local THREADS = 32 * W
  local fp8 = kv_dtype == "e4m3"
  -- FP8 K/V on the cp.async ring (2 or 3 stages): FP8 rings, each tile
  -- dequantised once into the 16-bit tiles the products read
  -- (tile_fp8.cuh); with 1 stage they are dequantised as they load.
  local RING8 = fp8 and S > 1
  -- Under bf16 queries both products run in f16 (H16): an e4m3 pair
  -- becomes an f16 pair in one instruction, a bf16 pair in four (through
  -- float32).  P (at most 2^8: the lazy rescale) and e4m3 fit f16, whose
  -- 10 mantissa bits keep more of P than bf16's 7; Q's tile becomes f16
  -- times a power of two that brings its largest magnitude near f16's top
  -- (tile_fp8.cuh's q_to_f16: exact where bf16 is), and the score scale
  -- undoes it -- the scaled score equals bf16 Q's bit for bit.
  local H16 = RING8 and dtype == "bf16"
  local function no(fmt, ...) refuse(fmt:format(...)) end

  if softmax ~= "regs" then
    no("softmax %s: the mma family keeps the softmax in registers (softmax regs); smem is the wmma family's", softmax)
  end
  if fp8 and D % 16 ~= 0 then
    no("head_dim %d with kv_dtype e4m3 is not implemented: FP8 K/V take a multiple of 16 (a 16-byte chunk of e4m3 is 16 elements; 16-bit K/V take any multiple of 8)", D)
  end
  if VK and DV > D then
    no("head_dim_v %d above head_dim %d: the mma family reads V as the first head_dim_v columns of K's rows (MLA's latent cache), so head_dim_v is at most head_dim", DV, D)
  end
  if (VK or CS) and fp8 then
    no("head_dim_v %d with head_dim %d and kv_dtype e4m3 is not implemented: split and wide head dims take 16-bit K/V", DV, D)
  end
  if BN % 16 ~= 0 then no("tile_n %d: the mma family needs a multiple of 16", BN) end
  -- KS: 16 rows a block, each warp its share of every key tile (decode's
  -- few rows: a quarter of a tile's work a warp), merged after the walk.
  local KS = BM == 16 and W > 1 and not CS
  -- KW: the warps split each key tile (KS, CS).
  local KW = KS or CS
  local MR = KS and 1 or CS and BM // 16 or BM // (16 * W)
  -- Head dims that are a multiple of 8 but not of 16 are padded to the
  -- products' 16 columns: DP of Q and K, DVP of V and O (with CS a
  -- multiple of 16 a warp, so that the warps own equal columns).  A tile
  -- row has DT columns; the loads write the first D (tile_io.cuh), and
  -- the rest is zeroed once before them (zero_pad): Q's and K's pad meets
  -- in S = Q K^T, where uninitialised shared memory could hold NaN.  V's
  -- pad feeds only O's pad columns, which are never stored.
  local function up(x, m) return (x + m - 1) // m * m end
  local DP, DVP = up(D, 16), up(DV, CS and 16 * W or 16)
  local DT = math.max(DP, DVP)
  local DVW = CS and DVP // W or DVP
  if CS then
    if W < 2 or (BM ~= 16 and BM ~= 32) then
      no("head_dim_v %d (above 256) takes tile_m 16 or 32 with 2 or more warps, which split V's columns (got tile_m %d, warps %d)", DV, BM, W)
    end
    if BN % (16 * W) ~= 0 then
      no("head_dim_v %d with warps %d splits each key tile over the warps: tile_n %d must be a multiple of %d", DV, W, BN, 16 * W)
    end
    if BMASK then no("head_dim_v %d (above 256) with a block mask is not implemented", DV) end
  elseif not KS and (BM % (16 * W) ~= 0 or MR < 1 or MR > 2) then
    no("tile_m %d with warps %d: each warp owns 16 or 32 rows, so tile_m is %d or %d (or 16: the warps split each key tile)", BM, W, 16 * W, 32 * W)
  end
  if KS and BN % (16 * W) ~= 0 then
    no("tile_m 16 with warps %d splits each key tile over the warps: tile_n %d must be a multiple of %d", W, BN, 16 * W)
  end
  if KS and BMASK then
    no("tile_m 16 (warps splitting the keys) with a block mask is not implemented: tile_m 64 or more")
  end
  -- Key columns a warp computes per tile, in 16s.
  local NJ = (KW and BN // W or BN) // 16
  if S > 3 then no("stages %d is not implemented: 1, 2 or 3", S) end
  if BMASK and (PACK or SPLIT or VL) then
    no("a block mask with %s is not implemented: block masks take dense problems", PACK and "pack_gqa" or SPLIT and "split_kv" or "varlen or paged K/V")
  end
  if BMASK and (BMASK.q % BM ~= 0 or BMASK.kv % BN ~= 0) then
    no("tile_m %d and tile_n %d must divide the block mask's blocks (%d query rows, %d keys)", BM, BN, BMASK.q, BMASK.kv)
  end
  if fp8 and PAGED and not RING8 then
    no("kv_dtype e4m3 with paged K/V takes stages 2 or 3 (the FP8 ring); stages 1 dequantises as it loads, from contiguous rows only")
  end

  -- Registers per thread: O (MR x D/2 floats) and S (MR x BN/2) live across
  -- the softmax; Q (MR x D/4) stays resident when the total allows.
  local o_regs, s_regs, q_regs = MR * DVW // 2, MR * NJ * 8, MR * DP // 4
  if o_regs + s_regs + 40 > 255 then
    no("%s, tile_n %d and %d rows per warp need about %d registers per thread for O and S; the limit is 255 (over by %d): use a smaller tile_n or tile_m%s",
       CS and ("head_dim_v %d over %d warps (%d columns each)"):format(DV, W, DVW)
          or VK and ("head_dim_v %d"):format(DV) or ("head_dim %d"):format(D),
       BN, 16 * MR, o_regs + s_regs + 40, o_regs + s_regs + 40 - 255, CS and ", or more warps" or "")
  end
  -- With 2 or more stages K can run a tile ahead of V, so S(t + 1) is
  -- computed beside the softmax of tile t -- if both S fit in registers.
  -- (Not where V is K's tile: K's slot of tile t would be refilled before
  -- P(t) V(t).)
  local PIPE = S >= 2 and o_regs + 2 * s_regs + 40 <= 240 and not VK
  -- Paged K and V read each tile's page numbers a tile ahead, one row per
  -- lane (tile_io.cuh), where a warp's share of a tile fits in its lanes;
  -- V takes K's.  Two chunks a thread (one address for both) where
  -- registers allow: a split's bounds leave none (8 bytes spilled at head
  -- dim 128, sm_90a), so one there -- and one where a row has an odd
  -- number of chunks (a head dim that is not a multiple of 16).
  local TPR = (SPLIT or D % 16 ~= 0) and D // 8 or D // 16
  local PF = PAGED and S >= 2 and not RING8 and 32 % TPR == 0 and BN % (THREADS // TPR) == 0 and
             BN // (THREADS // TPR) * (32 // TPR) <= 32
  -- Rows of more than 32 chunks (head dims above 256): a warp a row, the
  -- page numbers a tile ahead too (tile_io.cuh's PF_WIDE).
  local PF_WIDE = PAGED and S >= 2 and not RING8 and D // 8 > 32 and BN % W == 0 and BN // W <= 32
  PF = PF or PF_WIDE
  -- The FP8 ring's paged rows the same way, on the pipelined ring (one
  -- 16-byte chunk a thread: tile_fp8.cuh's tile_pages8, ring8_paged).
  local C8 = D // 16
  if RING8 and PAGED and PIPE and 32 % C8 == 0 and BN % (THREADS // C8) == 0 and
     BN // (THREADS // C8) * (32 // C8) <= 32 then
    PF = true
  end
  local live = o_regs + s_regs * (PIPE and 2 or 1)
  local QREGS = live + q_regs + 40 <= 224

  -- The layout tables.
  local acc, qa, rows, p_from = L.softmax_tables(lut_acc, lut_a, "mma", refuse)
  -- REGS: the KS decode's products straight from the FP8 ring, under
  -- 16-bit queries (both products in f16): no 16-bit K and V tiles, each
  -- warp's keys read by ldmatrix on the FP8 bytes and converted in
  -- registers (tile_fp8.cuh's k8_pair, v8_pair), Q's tile permuted within
  -- each 16-column block to match K's registers, O's columns permuted
  -- within each 16-column tile and put back by the epilogue (OCOLS).  The
  -- register facts: the probed B tables, checked to be the PTX ISA's
  -- (lut.lua's fp8_b_isa; elsewhere the 16-bit tiles), and the ISA's
  -- ldmatrix (16-bit units, whatever they hold).  Only with the pipelined
  -- ring (PIPE): K(t + 1) is read from its slot while tile t's softmax
  -- runs, as the 16-bit ring's.  K's and V's head dims alike (DV == D);
  -- every width seen right on the GPU (gpu_fp8_kv's "split keys" d32,
  -- d64, d80, d96, d128, d256 and gpu_fp8_kv_paged, 2026-12-05).
  local OCOLS = KS and RING8 and PIPE and (dtype == "bf16" or dtype == "f16") and DV == D and
                L.fp8_b_isa(lut_bk, lut_bv) and L.fp8_v_cols(acc) or nil
  local REGS = OCOLS ~= nil
  local NC = #rows.classes
  -- CS: the rows' maxima over the warps (softmax_regs.cuh's exchange),
  -- each warp's mx of its keys in x_m, then the largest of them all, in
  -- every warp alike.
  local EXCHANGE
  if CS then
    local t = { "      // The row's max over every warp's keys (CS): one for all the warps." }
    for c = 1, NC do
      t[#t + 1] = ("      x_m[((mi * %d + warp) * %d + %d) * 32 + lane] = mx%d;"):format(W, NC, c - 1, c)
    end
    t[#t + 1] = "      __syncthreads();"
    for c = 1, NC do
      local terms = {}
      for w = 0, W - 1 do terms[#terms + 1] = ("x_m[(mi * %d + %d) * 32 + lane]"):format(W * NC, w * NC + c - 1) end
      local e = terms[1]
      for i = 2, #terms do e = ("fmaxf(%s, %s)"):format(e, terms[i]) end
      t[#t + 1] = ("      mx%d = %s;"):format(c, e)
    end
    EXCHANGE = table.concat(t, "\n")
  end

  -- Shared tiles: Q, then the K and V rings.  "xor" permutes chunk c of row
  -- r to c ^ (r & XM), XM + 1 the largest power of two (at most 8) dividing
  -- the chunks per row (DT's: the pad included).
  local CHUNKS = DT // 8
  local XW = 1
  while XW < 8 and CHUNKS % (XW * 2) == 0 do XW = XW * 2 end
  local XM = XW - 1
  local LD = DT + (swizzle == "pad" and 8 or 0)
  local plan, offset = {}, 0
  local function region(name, bytes, type)
    plan[#plan + 1] = { name = name, offset = offset, bytes = bytes, type = type }
    offset = offset + (bytes + 127) // 128 * 128
  end
  region("q", BM * LD * 2)
  if RING8 then
    -- The 16-bit tiles the products read (two of K: S(t + 1) is computed
    -- beside tile t's softmax), then the FP8 rings.
    if not REGS then
      region("k", 2 * BN * LD * 2)
      region("v", BN * LD * 2)
    end
    region("k8", S * BN * D, "unsigned char")
    region("v8", S * BN * D, "unsigned char")
    -- H16: the warps' largest magnitudes of Q (q_to_f16).
    if H16 then region("qx", W * 4, "float") end
  else
    region("k", S * BN * LD * 2)
    if not VK then region("v", S * BN * LD * 2) end
  end
  local KV_BYTES = offset - plan[2].offset
  -- CS: the warps' row maxima (and after the walk their row sums),
  -- [slice][warp][class][lane]; P of a tile as A-operand registers,
  -- [slice][16 keys][lane] of 16 bytes.
  if CS then
    region("xm", MR * W * NC * 32 * 4, "float")
    region("xp", MR * (BN // 16) * 32 * 16, "uint4")
  end
  -- KS: the warps' maxima, then warps 1.. their O and sums, merged through
  -- the K and V rings once the walk is done -- where V is K's tile (VK)
  -- and K's ring alone is too small, from Q's tile on (Q, just before it,
  -- is no longer read then).
  local MERGE_BYTES = (W * NC + (W - 1) * (DVP // 2 + NC)) * 32 * 4
  local MERGE_AT = REGS and "s_k8" or "s_k"
  if KS and VK and MERGE_BYTES > KV_BYTES then
    MERGE_AT, KV_BYTES = "s_q", KV_BYTES + plan[2].offset
  end
  if KS and MERGE_BYTES > KV_BYTES then
    no("tile_m 16 with warps %d at head_dim %d: the warps' merge needs %d bytes of shared memory, the K and V tiles have %d: more stages or a larger tile_n",
       W, D, MERGE_BYTES, KV_BYTES)
  end
  meta.symbol = symbol
  meta.threads = THREADS
  meta.smem_bytes = offset
  -- REGS: the blocks a multiprocessor holds by shared memory (1 KB
  -- reserved a block), up to 4; the launch bounds then cap the registers
  -- so that they hold as many (64K a multiprocessor: 128 a thread for 4
  -- blocks of 128 threads, 168 for 3), and below 160 Q is read from
  -- shared memory each tile rather than kept in registers (kept, ptxas
  -- spilled 24 bytes at d128 under 128 registers, sm_90a).  Paged rows'
  -- page numbers take more: up to 3 blocks there (at 4, 12 bytes spilled
  -- at d128, sm_90a).
  local MINB = 1
  if REGS then
    MINB = math.max(1, math.min(PAGED and 3 or 4, import("budget.lua").smem_sm(sm) // (offset + 1024)))
    local function cap() return math.min(255, 65536 // (MINB * THREADS) // 8 * 8) end
    -- O, both S and 40 more (at d256 under 168, 4 bytes spilled).
    while MINB > 1 and o_regs + 2 * s_regs + 40 > cap() do MINB = MINB - 1 end
    if cap() < 160 then QREGS = false end
  end
  meta.rows_per_block = BM
  -- The user's own expressions compile in a child process: a compiler crash
  -- on them is an error, never the host's death.
  if mods.score_text or mods.mask_text then meta.isolate = 1 end

  -- The shared address of the 16x16 fragment at tile (r0, c0) for this
  -- lane (pieces.lua's ldsm_addr).
  local addr = import("pieces.lua").ldsm_addr(swizzle, LD)

  -- How the shared pieces (softmax_regs.cuh, epilogue_regs.cuh) reach this
  -- family's registers: MR row slices of 16 rows per warp.
  local PC = import("pieces.lua")
  local with = PC.with
  local frag = PC.regs{
    acc = acc, rows = rows, MR = MR, mask = "always", mrule = mrule, mods = mods,
    row0 = function(mi) return ("m0 + wr + %s * 16 + acc_r"):format(mi) end,
    head = function(r) return PACK and ("blk.h + (%s) %% p.group"):format(r) or "blk.h" end,
  }

  local T = dtype

  -- Split-KV and windows: key tiles are counted from the block's first
  -- (kv0 on), the loads end at kv_rows.  KVROWS and N0 name what the walk
  -- uses.
  local KVROWS = OFFSET and "kv_rows" or LEN_KV
  local N0 = BMASK and "fj::list_n0(bl, t)" or OFFSET and ("kv0 + t * %d"):format(BN) or ("t * %d"):format(BN)
  -- FP8 K/V (RING8): tile_fp8.cuh's conversion of rows the products read
  -- next, then the threads that read them synchronised: with KS each warp
  -- converts the keys it alone reads (from k0 on), else the block all.
  -- parts: { dst, src[, cond] } each; with KS both in one call (their
  -- loads all in flight at once), else a chunk at a time (the 32-row
  -- warps of prefill tiles have no registers for more: 84-168 bytes
  -- spilled at head dims 64-128 on sm_90a).
  local function DEQUANT(parts, k0, pad)
    local nl = "\n" .. (" "):rep(pad or 2)
    local function src(x) return x[3] and ("%s ? %s : nullptr"):format(x[3], x[2]) or x[2] end
    local h = H16 and "true" or "false"
    if KS then
      local b = parts[2] or { "nullptr", "nullptr" }
      return ("fj::dequant_rows<%d, 32, %s>(%s, %s, %s, %s, %s, lane);"):format(NJ * 16, h, parts[1][1],
                                                                               src(parts[1]), b[1], src(b), k0)
             .. nl .. "__syncwarp();"
    end
    local out = {}
    for _, x in ipairs(parts) do
      out[#out + 1] = ("%sfj::dequant_tile<%s>(%s, %s);"):format(x[3] and ("if (%s) "):format(x[3]) or "", h,
                                                                 x[1], x[2])
    end
    return table.concat(out, nl) .. nl .. "__syncthreads();"
  end
  -- Paged rings (PF): the page numbers of key tile ti, a row a lane, and
  -- the copy of tile i of K or V ("k", "v") with them (pg).
  local function PAGES(ti)
    return ("fj::%s(ksrc, %s, %s)"):format(RING8 and "tile_pages8" or "tile_pages", ti, KVROWS)
  end
  local function PCOPY(which, i, pg)
    if RING8 then return ("fj::ring8_paged(s_%s8, %ssrc, %s, %s)"):format(which, which, i, pg) end
    return ("fj::copy_tile_paged(s_%s, %ssrc, %s, %s)"):format(which, which, i, pg)
  end
  -- The copy of key tile i of K or V ("k", "v") into its ring.
  local function LOAD(which, i)
    return ("fj::%s(s_%s%s, %ssrc, %s, %s)"):format(RING8 and "ring8_load" or "ring_load", which,
                                                    RING8 and "8" or "", which, i, KVROWS)
  end

  -- Where a row's output goes (epilogue_regs.cuh): the default (one head's
  -- rows of O, up to LEN_Q) unless rows are packed or the block writes
  -- partials.
  local out
  if PACK or SPLIT then
    local rows_end = PACK and LEN_Q .. " * p.group" or LEN_Q
    local function head(r) return PACK and ("blk.h + (%s) %% p.group"):format(r) or "blk.h" end
    -- The row's index in [batch][heads_q][seq_q].
    local function flat(r)
      return ("((long long)blk.b * p.heads_q + %s) * p.seq_q + %s"):format(head(r), mrule.pos(r))
    end
    out = { valid = function(r) return ("%s < %s"):format(r, rows_end) end }
    if SPLIT then
      out.f32, out.lse_always = true, true
      out.ptr = function(r) return ("p.o_part + (part0 + %s) * %d"):format(flat(r), DV) end
      out.lse = function(r) return ("p.lse_part[part0 + %s]"):format(flat(r)) end
    else
      out.ptr = function(r)
        return ("o_out + (long long)((%s) %% p.group) * p.o_stride[1] + (long long)(%s) * p.o_stride[2]"):format(r, mrule.pos(r))
      end
      out.lse = function(r) return ("p.lse[%s]"):format(flat(r)) end
    end
  end
%}
{{ include("common.cuh") }}
{{ include("block.cuh", { BM = BM, BN = BN, PACK = PACK, SPLIT = SPLIT, BMASK = BMASK }) }}
{% if mods.any then %}
{{ include("mods.cuh", { mods = mods, part = "decls" }) }}
{% end %}
{% if fp8 and not RING8 then %}
#include <cuda_fp8.h>
{% end %}
// shared memory: {{ offset }} bytes{% for _, r in ipairs(plan) do %}; {{ r.name }} @{{ r.offset }}{% end %}

// From the accumulator table: each lane's base (row | col << 4); slot s adds
// (drow, dcol) = {% for s = 0, acc.slots - 1 do %}({{ acc.drow[s] }}, {{ acc.dcol[s] }}){{ s < acc.slots - 1 and " " or "" }}{% end %}.
__constant__ unsigned char fj_base_acc[32] = { {{ L.base_bytes(acc) }} };

{{ include("mma_frag.cuh") }}
{{ include("tile_io.cuh", { LD = LD, XM = XM, THREADS = THREADS, S = S, fp8 = fp8, PF = PF and not RING8, PF_TPR = TPR, PF_WIDE = PF_WIDE, BMASK = BMASK, VK = VK,
                      PADC = DT > D and DT // 8 or nil }) }}
{% if RING8 then %}
{{ include("tile_fp8.cuh", { THREADS = THREADS, S = S, BMASK = BMASK, H16 = H16, PF = PF, REGS = REGS }) }}
{% end %}

namespace fj {
{% if H16 then %}
// Two floats as the A-operand register of two f16 elements (the first
// low): P for P V in f16 (H16).
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  const __half2 e = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const unsigned *>(&e);
}
{% else %}
// Two floats as the A-operand register of two 16-bit elements (the first low).
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  const elem2_t e = to_elem2(lo, hi);
  return *reinterpret_cast<const unsigned *>(&e);
}
{% end %}
}  // namespace fj

// Minimum one block per multiprocessor, so that ptxas budgets registers for
// O, S and Q instead of spilling{% if MINB > 1 then %} (here {{ MINB }}: as many as the shared memory holds){% end %}.
extern "C" __global__ void __launch_bounds__({{ THREADS }}, {{ MINB }})
{{ symbol }}(const fj::Params p{{ mods.kernel_param }}) {
  using fj::elem_t;
  extern __shared__ __align__(128) unsigned char smem[];
{% for _, r in ipairs(plan) do %}
  {{ r.type or "elem_t" }} *const s_{{ r.name }} = reinterpret_cast<{{ r.type or "elem_t" }} *>(smem + {{ r.offset }});
{% end %}

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const fj::Block blk = fj::block_of(p);
  const int m0 = blk.m0;
{% if VL then %}
  // This block's sequence; blocks past its end have nothing to do.
  const fj::Seq seq = fj::seq_of(p, blk.b);
  const int len_q = seq.len_q, len_kv = seq.len_kv;
  const int causal_off = {{ mrule.bottom_right and "len_kv - len_q" or "0" }};
  (void)causal_off;
  if (m0 >= {{ PACK and "len_q * p.group" or "len_q" }}) return;
  const elem_t *q = fj::head_rows<const elem_t>(p.q, p.q_stride, blk.b, blk.h) + seq.q_row0 * p.q_stride[2];
{%   if PAGED then %}
  const int *pages = p.block_table + (long long)blk.b * p.max_pages;
  fj::KvSrc ksrc = {static_cast<const fj::kv_t *>(p.k) + blk.hk * p.k_stride[1], p.k_stride[2],
                    p.k_stride[0], pages, p.page_shift, 0, p.num_pages - 1};
  fj::KvSrc vsrc = {static_cast<const fj::kv_t *>(p.v) + blk.hk * p.v_stride[1], p.v_stride[2],
                    p.v_stride[0], pages, p.page_shift, 0, p.num_pages - 1};
{%   else %}
  fj::KvSrc ksrc = {fj::head_rows<const fj::kv_t>(p.k, p.k_stride, blk.b, blk.hk) + seq.kv_row0 * p.k_stride[2], p.k_stride[2]};
  fj::KvSrc vsrc = {fj::head_rows<const fj::kv_t>(p.v, p.v_stride, blk.b, blk.hk) + seq.kv_row0 * p.v_stride[2], p.v_stride[2]};
{%   end %}
{% else %}
  const elem_t *q = fj::head_rows<const elem_t>(p.q, p.q_stride, blk.b, blk.h);
  fj::KvSrc ksrc = {fj::head_rows<const fj::kv_t>(p.k, p.k_stride, blk.b, blk.hk), p.k_stride[2]};
  fj::KvSrc vsrc = {fj::head_rows<const fj::kv_t>(p.v, p.v_stride, blk.b, blk.hk), p.v_stride[2]};
{% end %}
{% if fp8 then %}
  const int at_scale = fj::scale_at(p, blk.b, blk.hk);
  const float k_scale = p.k_scale[at_scale], v_scale = p.v_scale[at_scale];
{% end %}
  {{ H16 and "// The scales follow Q's conversion to f16 (H16), below." or mods.scales(2, fp8 and " * k_scale" or "") }}
  const int acc_r = fj_base_acc[lane] & 15, acc_c = fj_base_acc[lane] >> 4;
  // ldmatrix source rows and columns of this lane (mma_frag.cuh).
  const int rm_r = fj::ldm_row_rm(lane), rm_c = fj::ldm_col_rm(lane);
  const int nm_r = fj::ldm_row_nm(lane), nm_c = fj::ldm_col_nm(lane);
  const unsigned rm_off = 2 * (rm_r * {{ LD }} + rm_c), nm_off = 2 * (nm_r * {{ LD }} + nm_c);
  const unsigned sq_u = fj::smem_addr(s_q), sk_u = fj::smem_addr({{ REGS and "s_k8" or "s_k" }}), sv_u = {{ VK and "sk_u" or REGS and "fj::smem_addr(s_v8)" or "fj::smem_addr(s_v)" }};
  (void)rm_off; (void)nm_off;

{% if BMASK then %}
  // The key tiles the caller's block mask lists for this row tile: its
  // partial blocks, then its full ones.
  const fj::BlockList bl = fj::block_list(p, blk);
  ksrc.list = vsrc.list = bl;
  const int ntiles = bl.n * {{ BMASK.kv // BN }};
{% else %}
  // Keys this block can see: all of them, or up to its last row's diagonal{{ mrule.window and " or window, from the window's left side of its first row" or "" }}.
  const int n_end = {{ mrule.keys_end("m0 + " .. BM) }};
  const int t_first = {{ mrule.keys_begin("m0") }} / {{ BN }};
  const int all_tiles = n_end > t_first * {{ BN }} ? (n_end - t_first * {{ BN }} + {{ BN - 1 }}) / {{ BN }} : 0;
{% if OFFSET then %}
{%   if SPLIT then %}
  // This block's share: range blk.split of p.splits, in whole key tiles
  // (empty where the splits outnumber the tiles); K and V start at kv0.
  const int per_split = (all_tiles + p.splits - 1) / p.splits;
  const int t_begin = min(all_tiles, blk.split * per_split);
  const int ntiles = min(all_tiles, t_begin + per_split) - t_begin;
{%   else %}
  const int t_begin = 0, ntiles = all_tiles;
{%   end %}
  const int kv0 = (t_first + t_begin) * {{ BN }}, kv_rows = {{ LEN_KV }} - kv0;
{% if PAGED then %}
  ksrc.first = vsrc.first = kv0;
{% else %}
  ksrc.base += (long long)kv0 * ksrc.stride;
  vsrc.base += (long long)kv0 * vsrc.stride;
{% end %}
{% else %}
  const int ntiles = all_tiles;
{% end %}
{% end %}

{% if DT > D then %}
  // The tiles' pad columns, {{ D }} .. {{ DT - 1 }}, as zeros (the loads never write them).
  fj::zero_pad(s_q, {{ BM }});
  fj::zero_pad(s_k, {{ S * BN }});
{%   if not VK then %}
  fj::zero_pad(s_v, {{ S * BN }});
{%   end %}
{% end %}
{% if PACK then %}
  fj::load_tile_packed<{{ BM }}>(s_q, q, p.q_stride[1], p.q_stride[2], p.group, m0, {{ LEN_Q }} * p.group);
{% else %}
  fj::load_tile<{{ BM }}>(s_q, q, p.q_stride[2], m0, {{ LEN_Q }});
{% end %}
{% if PIPE then %}
  // Prologue of the pipeline: group P = {Q, K(0)}, then groups g_i =
  // {K(i + 1), V(i)} for i < {{ S - 1 }} (empty ones keep the count uniform).
{%   if PF then %}
  // Page numbers: pg_v those of the next V tile to load (K's of the
  // iteration before), pg_k those of the next K tile, read a tile ahead.
  int pg_v = {{ PAGES("0") }};
  if (ntiles > 0) {{ PCOPY("k", "0", "pg_v") }};
  fj::cp_async_commit();
#pragma unroll
  for (int i = 0; i < {{ S - 1 }}; ++i) {
    const int pg_n = {{ PAGES("i + 1") }};
    if (i + 1 < ntiles) {{ PCOPY("k", "i + 1", "pg_n") }};
    if (i < ntiles) {{ PCOPY("v", "i", "pg_v") }};
    pg_v = pg_n;
    fj::cp_async_commit();
  }
  int pg_k = {{ PAGES(tostring(S)) }};
{%   else %}
  if (ntiles > 0) {{ LOAD("k", "0") }};
  fj::cp_async_commit();
#pragma unroll
  for (int i = 0; i < {{ S - 1 }}; ++i) {
    if (i + 1 < ntiles) {{ LOAD("k", "i + 1") }};
    if (i < ntiles) {{ LOAD("v", "i") }};
    fj::cp_async_commit();
  }
{%   end %}
  fj::cp_async_wait<{{ S - 1 }}>();  // Q and K(0) have landed
{% else %}
{%   if PF then %}
  int kv_pages;  // the page numbers of the next tile to load (tile_io.cuh)
{%   end %}
{%   if RING8 then %}
  fj::kv_start8(s_k8, s_v8, ksrc, vsrc, {{ KVROWS }}, ntiles);
{%   else %}
  fj::kv_start(s_k, {{ VK and "s_k" or "s_v" }}, ksrc, vsrc, {{ KVROWS }}, ntiles{{ PF and ", kv_pages" or "" }});
{%   end %}
{% end %}
  __syncthreads();
{% if H16 then %}
  // Q in f16, times 2^e (tile_fp8.cuh); the score scale takes 2^-e.
{%   if REGS then %}
  // (Each 16-column block permuted too, as K's registers take it: REGS.)
{%   end %}
  const float q_unscale = fj::q_to_f16<{{ BM }}>(s_q, s_qx);
  {{ mods.scales(2, " * k_scale * q_unscale") }}
{% end %}
{% if REGS and not H16 then %}
  // Q's tile permuted within each 16-column block, as K's registers take
  // it (REGS: tile_fp8.cuh's q_perm).
  fj::q_perm<{{ BM }}>(s_q);
{% end %}
{% if RING8 and PIPE and not REGS then %}
  // K(0), which S(0) reads.
  {{ DEQUANT({ { "s_k", "s_k8" } }, "warp * " .. (NJ * 16)) }}
{% end %}

{% if KW then %}
  // Every warp has the tile's {{ 16 * MR }} rows (wr = 0) and keys kw .. kw + {{ NJ * 16 - 1 }}
  // of each key tile{{ CS and (", and O's columns cw .. cw + %d"):format(DVW - 1) or "" }}.
  const int wr = 0, kw = warp * {{ NJ * 16 }};
{%   if CS then %}
  const int cw = warp * {{ DVW }};
  float *const x_m = s_xm;  // [slice][warp][class][lane]
{%   end %}
{% else %}
  // This warp's rows: wr + 16 mi + (the accumulator's row), mi < {{ MR }}.
  const int wr = warp * {{ 16 * MR }};
{% end %}
  float o[{{ MR }}][{{ DVW // 16 }}][8];
  float row_m[{{ MR }}][{{ NC }}], row_l[{{ MR }}][{{ NC }}];
#pragma unroll
  for (int mi = 0; mi < {{ MR }}; ++mi) {
#pragma unroll
    for (int d = 0; d < {{ DVW // 16 }}; ++d)
#pragma unroll
      for (int s = 0; s < 8; ++s) o[mi][d][s] = 0.f;
#pragma unroll
    for (int c = 0; c < {{ NC }}; ++c) { row_m[mi][c] = FJ_NEG_INF; row_l[mi][c] = 0.f; }
  }
{%
  -- The three steps of a key tile, as macros (each call emits its text).
  -- qk: dst = Q K^T from the K tile at shared address kbuf.
  local function qk(dst, kbuf)
%}
#pragma unroll
    for (int mi = 0; mi < {{ MR }}; ++mi)
#pragma unroll
      for (int j = 0; j < {{ NJ }}; ++j)
#pragma unroll
        for (int s = 0; s < 8; ++s) {{ dst }}[mi][j][s] = 0.f;
{%   if REGS then %}
    // K's FP8 bytes by ldmatrix, two 16-dim blocks an x4 (tile_fp8.cuh's k8_pair).
{%     local NB = DP // 16 %}
{%     if NB >= 2 then %}
#pragma unroll
    for (int kk = 0; kk < {{ NB // 2 }}; ++kk) {
{%       if not QREGS then %}
      unsigned qk[{{ MR }}][2][4];
#pragma unroll
      for (int mi = 0; mi < {{ MR }}; ++mi) {
        fj::ldsm_x4(qk[mi][0], {{ addr("sq_u", "rm", "wr + mi * 16", "kk * 32") }});
        fj::ldsm_x4(qk[mi][1], {{ addr("sq_u", "rm", "wr + mi * 16", "kk * 32 + 16") }});
      }
{%       end %}
#pragma unroll
      for (int j = 0; j < {{ NJ }}; ++j) {
        unsigned r[4], kf[2][4];
        fj::ldsm_x4(r, {{ kbuf }} + fj::off8(kw + j * 16 + nm_r, 2 * kk + (nm_c >> 3)));
        fj::k8_pair(kf[0], r[0], r[2]);
        fj::k8_pair(kf[1], r[1], r[3]);
#pragma unroll
        for (int mi = 0; mi < {{ MR }}; ++mi) {
          fj::mma_tile_f16({{ dst }}[mi][j], {{ QREGS and "qf[mi][2 * kk]" or "qk[mi][0]" }}, kf[0]);
          fj::mma_tile_f16({{ dst }}[mi][j], {{ QREGS and "qf[mi][2 * kk + 1]" or "qk[mi][1]" }}, kf[1]);
        }
      }
    }
{%     end %}
{%     if NB % 2 == 1 then %}
    {
      // The last 16-dim block alone (x2: its keys 0-7 and 8-15).
{%       if not QREGS then %}
      unsigned qk[{{ MR }}][4];
#pragma unroll
      for (int mi = 0; mi < {{ MR }}; ++mi)
        fj::ldsm_x4(qk[mi], {{ addr("sq_u", "rm", "wr + mi * 16", tostring((NB - 1) * 16)) }});
{%       end %}
#pragma unroll
      for (int j = 0; j < {{ NJ }}; ++j) {
        unsigned r[2], kf[4];
        fj::ldsm_x2(r, {{ kbuf }} + fj::off8(kw + j * 16 + rm_r, {{ NB - 1 }}));
        fj::k8_pair(kf, r[0], r[1]);
#pragma unroll
        for (int mi = 0; mi < {{ MR }}; ++mi) fj::mma_tile_f16({{ dst }}[mi][j], {{ QREGS and ("qf[mi][%d]"):format(NB - 1) or "qk[mi]" }}, kf);
      }
    }
{%     end %}
{%   else %}
#pragma unroll
    for (int kk = 0; kk < {{ DP // 16 }}; ++kk) {
{%   if not QREGS then %}
      unsigned qk[{{ MR }}][4];
#pragma unroll
      for (int mi = 0; mi < {{ MR }}; ++mi)
        fj::ldsm_x4(qk[mi], {{ addr("sq_u", "rm", "wr + mi * 16", "kk * 16") }});
{%   end %}
#pragma unroll
      for (int j = 0; j < {{ NJ }}; ++j) {
        unsigned kf[4];
        fj::ldsm_x4(kf, {{ addr(kbuf, "nm", KW and "kw + j * 16" or "j * 16", "kk * 16") }});
#pragma unroll
        for (int mi = 0; mi < {{ MR }}; ++mi) fj::mma_tile_{{ H16 and "f16" or T }}({{ dst }}[mi][j], {{ QREGS and "qf[mi][kk]" or "qk[mi]" }}, kf);
      }
    }
{%   end %}
{%
  end
  -- softmax: the online softmax of src (softmax_regs.cuh), P packed as
  -- A-operand registers pk inside it, O rescaled lazily (only once a row's
  -- max grows past 2^8: 892 against 915 us on the d128 causal variant of
  -- bench/probes/lazy_rescale.runs; the wgmma family gained nothing).
  local function softmax(src, mask)
%}
{{ PC.softmax_step(with(frag, {
     NJ = NJ, mask = mask, lazy = 8, exchange = EXCHANGE,
     S = function(mi, j, i) return ("%s[%s][%s][%d]"):format(src, mi, j, i) end,
     rescale = { ND = DVW // 16, O = function(mi, d, i) return ("o[%s][%s][%d]"):format(mi, d, i) end },
     pack = { from = p_from, P = function(mi, j, r) return ("pk[%s][%s][%d]"):format(mi, j, r) end } })) }}
{%   if CS then %}
    // P to every warp: this warp's keys' A-operand registers.
#pragma unroll
    for (int mi = 0; mi < {{ MR }}; ++mi)
#pragma unroll
      for (int j = 0; j < {{ NJ }}; ++j)
        s_xp[(mi * {{ BN // 16 }} + warp * {{ NJ }} + j) * 32 + lane] = make_uint4(pk[mi][j][0], pk[mi][j][1], pk[mi][j][2], pk[mi][j][3]);
    __syncthreads();
{%   end %}
{%
  end
  -- pv: O += P V, P from pk in registers, V from the tile at vbuf.
  local function pv(vbuf)
%}
{%   if CS then %}
    // Every key of the tile against this warp's columns of V.
#pragma unroll
    for (int kk = 0; kk < {{ BN // 16 }}; ++kk) {
      unsigned pa[{{ MR }}][4];
#pragma unroll
      for (int mi = 0; mi < {{ MR }}; ++mi) {
        const uint4 x = s_xp[(mi * {{ BN // 16 }} + kk) * 32 + lane];
        pa[mi][0] = x.x; pa[mi][1] = x.y; pa[mi][2] = x.z; pa[mi][3] = x.w;
      }
#pragma unroll
      for (int d = 0; d < {{ DVW // 16 }}; ++d) {
        unsigned vf[4];
        fj::ldsm_x4_t(vf, {{ addr(vbuf, "rm", "kk * 16", "cw + d * 16") }});
#pragma unroll
        for (int mi = 0; mi < {{ MR }}; ++mi) fj::mma_tile_{{ T }}(o[mi][d], pa[mi], vf);
      }
    }
{%   elseif REGS then %}
    // V's FP8 bytes by ldmatrix.trans, two 16-dim blocks an x4
    // (tile_fp8.cuh's v8_pair): O's tile d holds dims 16 d + 2c (columns
    // c < 8) and 16 d + 2c + 1 (columns 8 + c), put back by the epilogue.
{%     local NB = DVP // 16 %}
#pragma unroll
    for (int kk = 0; kk < {{ NJ }}; ++kk) {
{%     if NB >= 2 then %}
#pragma unroll
      for (int d = 0; d < {{ NB // 2 }}; ++d) {
        unsigned r[4], vf[2][4];
        fj::ldsm_x4_t(r, {{ vbuf }} + fj::off8(kw + kk * 16 + rm_r, 2 * d + (rm_c >> 3)));
        fj::v8_pair(vf[0], r[0], r[1]);
        fj::v8_pair(vf[1], r[2], r[3]);
#pragma unroll
        for (int mi = 0; mi < {{ MR }}; ++mi) {
          fj::mma_tile_f16(o[mi][2 * d], pk[mi][kk], vf[0]);
          fj::mma_tile_f16(o[mi][2 * d + 1], pk[mi][kk], vf[1]);
        }
      }
{%     end %}
{%     if NB % 2 == 1 then %}
      {
        unsigned r[2], vf[4];
        fj::ldsm_x2_t(r, {{ vbuf }} + fj::off8(kw + kk * 16 + rm_r, {{ NB - 1 }}));
        fj::v8_pair(vf, r[0], r[1]);
#pragma unroll
        for (int mi = 0; mi < {{ MR }}; ++mi) fj::mma_tile_f16(o[mi][{{ NB - 1 }}], pk[mi][kk], vf);
      }
{%     end %}
    }
{%   else %}
#pragma unroll
    for (int kk = 0; kk < {{ NJ }}; ++kk) {
#pragma unroll
      for (int d = 0; d < {{ DVP // 16 }}; ++d) {
        unsigned vf[4];
        fj::ldsm_x4_t(vf, {{ addr(vbuf, "rm", KS and "kw + kk * 16" or "kk * 16", "d * 16") }});
#pragma unroll
        for (int mi = 0; mi < {{ MR }}; ++mi) fj::mma_tile_{{ H16 and "f16" or T }}(o[mi][d], pk[mi][kk], vf);
      }
    }
{%   end %}
{% end %}
{% if QREGS then %}
  unsigned qf[{{ MR }}][{{ DP // 16 }}][4];
#pragma unroll
  for (int mi = 0; mi < {{ MR }}; ++mi)
#pragma unroll
    for (int kk = 0; kk < {{ DP // 16 }}; ++kk)
      fj::ldsm_x4(qf[mi][kk], {{ addr("sq_u", "rm", "wr + mi * 16", "kk * 16") }});
{% end %}
{% if PIPE then %}

  // Software pipeline: S(t + 1) = Q K(t + 1) is issued beside the softmax
  // of S(t) and P(t) V(t), so the tensor cores work while the softmax's
  // arithmetic runs.  K runs one tile ahead of V: iteration t waits for
  // g_t = {K(t + 1), V(t)} and refills the buffers of K(t) and V(t - 1)
  // with g_{t + {{ S - 1 }}}.  (Past the last tile S(t + 1) reads a stale
  // buffer and is discarded.)
  float sc[{{ MR }}][{{ NJ }}][8];
  {
{%   qk("sc", "sk_u") %}
  }
  for (int t = 0; t < ntiles; ++t) {
    const int n0 = {{ N0 }}{{ KW and " + kw" or "" }};  // this warp's first key
{%   if BMASK then %}
    const bool bm_part = fj::list_partial(bl, t);  // the mask expression applies
    (void)bm_part;
{%   end %}
    fj::cp_async_wait<{{ S - 2 }}>();  // g_t has landed
    __syncthreads();                    // ... for every thread; K(t), V(t - 1) are free
    {
      const int i = t + {{ S - 1 }};
{%   if PF then %}
      if (i + 1 < ntiles) {{ PCOPY("k", "i + 1", "pg_k") }};
      if (i < ntiles) {{ PCOPY("v", "i", "pg_v") }};
      fj::cp_async_commit();
      pg_v = pg_k;
      pg_k = {{ PAGES("i + 2") }};  // in flight meanwhile
{%   else %}
      if (i + 1 < ntiles) {{ LOAD("k", "i + 1") }};
      if (i < ntiles) {{ LOAD("v", "i") }};
      fj::cp_async_commit();
{%   end %}
    }
{%   if REGS then %}
    // K(t + 1) and V(t) straight from their FP8 slots (REGS), neither of
    // them the ones being refilled.
    const unsigned kn = sk_u + ((t + 1) % {{ S }}) * {{ BN * D }}, vt = sv_u + (t % {{ S }}) * {{ BN * D }};
{%   elseif RING8 then %}
    // V(t) and K(t + 1) as 16-bit tiles: V's one (every warp is past P(t -
    // 1) V(t - 1)) and K's other (K(t)'s, read by S(t) last iteration).
    // Their FP8 slots are not the ones being refilled.
    {{ DEQUANT({ { "s_v", ("s_v8 + (t %% %d) * %d"):format(S, BN * D) },
                 { ("s_k + ((t + 1) %% 2) * %d"):format(BN * LD), ("s_k8 + ((t + 1) %% %d) * %d"):format(S, BN * D),
                   "t + 1 < ntiles" } }, "kw", 4) }}
    const unsigned kn = sk_u + ((t + 1) % 2) * {{ BN * LD * 2 }}, vt = sv_u;
{%   else %}
    const unsigned kn = sk_u + ((t + 1) % {{ S }}) * {{ BN * LD * 2 }}, vt = sv_u + (t % {{ S }}) * {{ BN * LD * 2 }};
{%   end %}
    float sn[{{ MR }}][{{ NJ }}][8];
{%   qk("sn", "kn") %}
    unsigned pk[{{ MR }}][{{ NJ }}][4];
{%   softmax("sc", "always") %}
{%   pv("vt") %}
#pragma unroll
    for (int mi = 0; mi < {{ MR }}; ++mi)
#pragma unroll
      for (int j = 0; j < {{ NJ }}; ++j)
#pragma unroll
        for (int s = 0; s < 8; ++s) sc[mi][j][s] = sn[mi][j][s];
  }
  fj::cp_async_wait<0>();
{% else %}

  for (int t = 0; t < ntiles; ++t) {
    const int n0 = {{ N0 }}{{ KW and " + kw" or "" }};  // this warp's first key
{%   if BMASK then %}
    const bool bm_part = fj::list_partial(bl, t);  // the mask expression applies
    (void)bm_part;
{%   end %}
{%   if RING8 then %}
    fj::kv_ready8(s_k, s_v, s_k8, s_v8, ksrc, vsrc, {{ KVROWS }}, t, ntiles);
    const unsigned kt = sk_u, vt = sv_u;
{%   else %}
    fj::kv_ready(s_k, {{ VK and "s_k" or "s_v" }}, ksrc, vsrc, {{ KVROWS }}, t, ntiles{{ PF and ", kv_pages" or "" }});
    const unsigned kt = sk_u + (t % {{ S }}) * {{ BN * LD * 2 }}, vt = sv_u + (t % {{ S }}) * {{ BN * LD * 2 }};
{%   end %}
    // Masks only where a key is past the end or above some row's diagonal.
    const bool need_mask = {{ mrule.tile_partial("n0", NJ * 16, "m0", "m0 + " .. (BM - 1)) }};

    float sc[{{ MR }}][{{ NJ }}][8];
{%   qk("sc", "kt") %}
    unsigned pk[{{ MR }}][{{ NJ }}][4];
{%   softmax("sc", "branch") %}
{%   pv("vt") %}
{%   if S > 1 then %}
    __syncthreads();  // tile t's buffers are refilled next iteration
{%   end %}
  }
{%   if S > 1 then %}
  fj::cp_async_wait<0>();
{%   end %}
{% end %}

{% if KS then %}
  // The warps saw different keys: merge their maxima, sums and O into warp
  // 0's, lane by lane (a lane holds the same rows and columns in every
  // warp), in warp order.
  __syncthreads();  // every warp is done with the K and V tiles
  float *const x_m = reinterpret_cast<float *>({{ MERGE_AT }});   // [warp][class][lane]
  float *const x_o = x_m + {{ W * NC * 32 }};            // [warp - 1][O, l][lane]
#pragma unroll
  for (int c = 0; c < {{ NC }}; ++c) x_m[(warp * {{ NC }} + c) * 32 + lane] = row_m[0][c];
  __syncthreads();
#pragma unroll
  for (int c = 0; c < {{ NC }}; ++c) {
    float mx = FJ_NEG_INF;
#pragma unroll
    for (int w = 0; w < {{ W }}; ++w) mx = fmaxf(mx, x_m[(w * {{ NC }} + c) * 32 + lane]);
    // This warp's share, scaled to the row's max (0 where it saw no key).
    const float f = row_m[0][c] == FJ_NEG_INF ? 0.f : fj::fast_exp2(row_m[0][c] * sl2 - mx * sl2);
    row_m[0][c] = mx;
    row_l[0][c] *= f;
#pragma unroll
    for (int d = 0; d < {{ DVP // 16 }}; ++d) {
{%   for i = 0, acc.slots - 1 do %}
      if (c == {{ rows.class_of[i] - 1 }}) o[0][d][{{ i }}] *= f;
{%   end %}
    }
  }
  if (warp > 0) {
#pragma unroll
    for (int d = 0; d < {{ DVP // 16 }}; ++d)
#pragma unroll
      for (int i = 0; i < 8; ++i) x_o[((warp - 1) * {{ DVP // 2 + NC }} + d * 8 + i) * 32 + lane] = o[0][d][i];
#pragma unroll
    for (int c = 0; c < {{ NC }}; ++c) x_o[((warp - 1) * {{ DVP // 2 + NC }} + {{ DVP // 2 }} + c) * 32 + lane] = row_l[0][c];
  }
  __syncthreads();
  if (warp > 0) return;
#pragma unroll
  for (int w = 0; w < {{ W - 1 }}; ++w) {
#pragma unroll
    for (int d = 0; d < {{ DVP // 16 }}; ++d)
#pragma unroll
      for (int i = 0; i < 8; ++i) o[0][d][i] += x_o[(w * {{ DVP // 2 + NC }} + d * 8 + i) * 32 + lane];
#pragma unroll
    for (int c = 0; c < {{ NC }}; ++c) row_l[0][c] += x_o[(w * {{ DVP // 2 + NC }} + {{ DVP // 2 }} + c) * 32 + lane];
  }
{% end %}
{% if CS then %}
  // The warps' row sums, each over its own keys at the same maxima, added
  // up in warp order (every warp the same total).
  __syncthreads();  // the last tile's maxima have been read
#pragma unroll
  for (int mi = 0; mi < {{ MR }}; ++mi)
#pragma unroll
    for (int c = 0; c < {{ NC }}; ++c) x_m[((mi * {{ W }} + warp) * {{ NC }} + c) * 32 + lane] = row_l[mi][c];
  __syncthreads();
#pragma unroll
  for (int mi = 0; mi < {{ MR }}; ++mi)
#pragma unroll
    for (int c = 0; c < {{ NC }}; ++c) {
      float l = 0.f;
#pragma unroll
      for (int w = 0; w < {{ W }}; ++w) l += x_m[((mi * {{ W }} + w) * {{ NC }} + c) * 32 + lane];
      row_l[mi][c] = l;
    }
{% end %}
{% if SPLIT and sm >= 90 then %}
  // The combine kernel may be scheduled now (launched to start early, it
  // waits for this grid's end before it reads the partials).
  asm volatile("griddepcontrol.launch_dependents;");
{% end %}
  // The row sums, so far per lane, over the lanes that share each row; then
  // O = O / l and the log-sum-exp (epilogue_regs.cuh).
{% if SPLIT then %}
  // Defined here, not before the walk: live across it, it spilled.
  const long long part0 = (long long)blk.split * p.batch * p.heads_q * p.seq_q;
{% else %}
  elem_t *o_out = fj::head_rows<elem_t>(p.o, p.o_stride, blk.b, blk.h){{ VL and " + seq.q_row0 * p.o_stride[2]" or "" }};
{% end %}
{{ include("epilogue_regs.cuh", with(frag, {
     ND = DVW // 16, out_scale = fp8 and "v_scale" or "1.f", out = out, rows_end = LEN_Q,
     c0 = CS and "(acc_c + cw)" or REGS and "(2 * acc_c)" or nil, ocols = OCOLS,
     cols = DV < DVP and DV or nil, cols_split = CS,
     sinks = mods.sinks and not SPLIT,
     O = function(mi, d, i) return ("o[%s][%s][%d]"):format(mi, d, i) end })) }}
}
{% if mods.any then %}
{{ include("mods.cuh", { mods = mods, part = "defs" }) }}
{% end %}
