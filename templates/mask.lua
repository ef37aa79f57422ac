-- mask.lua: which keys a query row may see, as C expressions -- the one
-- rule every attention family applies.  Row i (absolute, in the query
-- sequence) sees key j when
--   j < p.seq_kv                      always (the sequence end), and
--   j <= i + p.causal_offset          under a causal mask (the offset is 0
--                                     for top-left, seq_kv - seq_q for
--                                     bottom-right; the host sets it).
-- A family asks three things of the rule: how far a block of rows reaches
-- (so tiles past it are never loaded), whether a key tile needs per-element
-- masking at all, and, per row, the first column it may not see.
--
-- Under GQA packing (attention_mma.cu's pack_gqa) the rows of a tile are
-- packed rows R = position * group + head in group: the rule then applies
-- to the position R / p.group.  A varlen or paged kernel passes `lens`,
-- the names of its sequence's lengths and offset ({ q = "len_q", kv =
-- "len_kv", off = "causal_off" }) in place of p.seq_q, p.seq_kv and
-- p.causal_offset.
--
--   local mask = import("mask.lua").new(causal, packed, lens)
--   mask.keys_end(last)          exclusive end of the keys that rows < last
--                                may see
--   mask.tile_partial(n0, bn, m) true when some key of tile [n0, n0 + bn)
--                                is hidden from some row >= m
--   mask.row_limit(row, n0, c0)  the first column, counted from n0 + c0,
--                                that `row` may not see
--   mask.visible(row, key)       one element's test
--   mask.pos(row)                the query position of a (packed) row

local M = {}

function M.new(causal, packed, lens)
  local R = { causal = causal ~= "none" }
  local Q, KV, OFF = "p.seq_q", "p.seq_kv", "p.causal_offset"
  if lens then Q, KV, OFF = lens.q, lens.kv, lens.off end
  -- The query position of a (packed) row, and the end of the positions of
  -- rows before `last`.
  local function pos(row)
    return packed and ("(%s) / p.group"):format(row) or row
  end
  local function pos_end(last)
    return packed and ("((%s) - 1) / p.group + 1"):format(last) or last
  end

  R.pos = pos

  function R.keys_end(last)
    if not R.causal then return KV end
    return ("min(%s, min(%s, %s) + %s)"):format(KV, pos_end(last), Q, OFF)
  end

  function R.tile_partial(n0, bn, m)
    local t = ("%s + %d > %s"):format(n0, bn, KV)
    if R.causal then
      t = t .. (" || %s + %d > %s + %s"):format(n0, bn - 1, pos(m), OFF)
    end
    return t
  end

  function R.row_limit(row, n0, c0)
    local lim = ("%s - %s - %s"):format(KV, n0, c0)
    if not R.causal then return lim end
    return ("min(%s, %s + %s + 1 - %s - %s)"):format(lim, pos(row), OFF, n0, c0)
  end

  function R.visible(row, key)
    local v = ("%s < %s"):format(key, KV)
    if R.causal then v = v .. (" && %s <= %s + %s"):format(key, pos(row), OFF) end
    return v
  end

  return R
end

return M
