-- pieces.lua: how a family describes its registers to the shared device
-- pieces (softmax_regs.cuh, epilogue_regs.cuh), which receive these fields
-- through include():
--   acc, rows    the analysed accumulator table and its row classes (lut.lua)
--   MR           row slices of 16 rows per warp
--   mrule        the mask rule (mask.lua)
--   row0(mi)     the absolute row of the lane's first slot in slice mi
--   m(mi, c), l(mi, c)   the running max and sum of row class c
--   c0, n0, sl2  the lane's first column in a tile, the tile's first key,
--                the softmax scale in log2 units
-- regs{...} fills the fields every family names the same way; with(t, x)
-- is t with x's fields added, for one include's own parameters;
-- softmax_step(t) is one online-softmax step (softmax_regs.cuh) over the
-- score step (score_regs.cuh), both given t; indent(text, n) indents
-- the lines of a piece's text after the first by n spaces (not the
-- preprocessor's); piece(text) drops a rendered piece's last newline.

local M = {}

-- O staged through shared memory (epilogue_regs.cuh's stage): a warp's 16
-- rows of ROW_BYTES (64 16-bit columns), rows STAGE_ROW bytes apart (128 of data and 16 of
-- padding, so that eight rows fall on eight different sets of banks);
-- STAGE_WARP bytes a warp (the last row needs no padding).
M.ROW_BYTES = 128
M.STAGE_ROW = M.ROW_BYTES + 16
M.STAGE_WARP = 15 * M.STAGE_ROW + M.ROW_BYTES

function M.with(t, extra)
  local c = {}
  for k, v in pairs(t) do c[k] = v end
  for k, v in pairs(extra) do c[k] = v end
  return c
end

function M.regs(fields)
  return M.with({
    c0 = "acc_c", n0 = "n0", sl2 = "sl2",
    m = function(mi, c) return ("row_m[%s][%d]"):format(mi, c - 1) end,
    l = function(mi, c) return ("row_l[%s][%d]"):format(mi, c - 1) end,
  }, fields)
end

-- The shared address of the 16x16 fragment at tile (r0, c0) for a lane
-- of the mma families' ldmatrix loads (mma_frag.cuh), in tiles of LD
-- elements a row: unswizzled, the lane's part is one register (lane_off)
-- and the rest an immediate; under xor (tile_io.cuh's tile_off) the chunk
-- index needs the row (lane_r, lane_c).
function M.ldsm_addr(swizzle, LD)
  return function(base, lane, r0, c0)
    if swizzle == "xor" then
      return ("%s + 2 * fj::tile_off(%s + %s_r, %s + %s_c)"):format(base, r0, lane, c0, lane)
    end
    return ("%s + %s_off + 2 * ((%s) * %d + %s)"):format(base, lane, r0, LD, c0)
  end
end

-- The score step of slice "mi", then the online softmax over it: the two
-- pieces a family's main loop runs on every key tile.
function M.softmax_step(t)
  local score = include("score_regs.cuh", t):gsub("\n$", "")
  return include("softmax_regs.cuh", M.with(t, { score_step = score ~= "" and score or nil }))
end

-- What every backward main kernel refuses (attention_bwd_mma.cu,
-- attention_bwd_wgmma.cu), from the kernel's own parameters (imports see
-- them as include() does): block masks unless the family walks their
-- transposed lists (o.blocks: bwd_common.cuh's QWalk), score and mask
-- expressions unless the family applies them (o.exprs: it multiplies dS
-- by the score expression's derivative), and anything but a dense problem
-- of one dtype.
function M.bwd_scope(o)
  if (block_kv or 0) > 0 and not (o and o.blocks) then
    refuse("this backward family takes no block mask yet (attention_bwd_mma.cu does)")
  end
  if not (o and o.exprs) and ((score_mod or "") ~= "" or (mask_mod or "") ~= "") then
    refuse("this backward family takes no score or mask expressions (attention_bwd_mma.cu does)")
  end
  if paged or pack_gqa or split_kv or kv_dtype ~= dtype then
    refuse(("the backward takes dense or varlen problems of one dtype (no %s)"):format(paged and "paged K/V"
      or pack_gqa and "pack_gqa" or split_kv and "split_kv" or "FP8 K/V"))
  end
end

-- The backward's mask rule: a varlen kernel's on its sequence's lengths
-- (bwd_seq's len_q, len_kv, causal_off).
function M.bwd_mask(mask)
  return mask.new(causal, false, varlen and { q = "len_q", kv = "len_kv", off = "causal_off" } or nil, window)
end

-- The backward's sequence of batch b (varlen: common.cuh's seq_of; else
-- the problem's lengths): len_q, len_kv, causal_off, q_row0, kv_row0 --
-- and kv_rows, the key rows the block writes dK and dV for (a packed
-- sequence's own rows, else every row up to seq_kv; those past len_kv,
-- which no query sees, get gradient 0).
function M.bwd_seq(mrule)
  if not varlen then
    return "const int len_q = p.seq_q, len_kv = p.seq_kv, kv_rows = p.seq_kv;\n  const long long q_row0 = 0, kv_row0 = 0;\n  (void)len_q; (void)len_kv; (void)q_row0; (void)kv_row0;"
  end
  return table.concat({
    "const fj::Seq seq = fj::seq_of(p, b);",
    "const int len_q = seq.len_q, len_kv = seq.len_kv;",
    ("const int causal_off = %s;"):format(mrule.bottom_right and "len_kv - len_q" or "0"),
    "const int kv_rows = p.cu_seqlens_kv ? min(max(p.cu_seqlens_kv[b + 1] - p.cu_seqlens_kv[b], 0), p.seq_kv) : p.seq_kv;",
    "const long long q_row0 = seq.q_row0, kv_row0 = seq.kv_row0;",
    "(void)causal_off;" }, "\n  ")
end

function M.indent(text, n)
  local pad = (" "):rep(n)
  return (text:gsub("\n([^#])", "\n" .. pad .. "%1"))
end

-- A piece's text to stand on the line of a {{ }} tag (its last newline is
-- the tag line's own).
function M.piece(text)
  return (text:gsub("\n$", ""))
end

return M
