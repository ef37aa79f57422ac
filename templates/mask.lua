-- mask.lua: which keys a query row may see, as C expressions -- the one
-- rule every attention family applies.  Row i (absolute, in the query
-- sequence) sees key j when
--   j < p.seq_kv                      always (the sequence end), and
--   j <= i + p.causal_offset          under a causal mask (the offset is 0
--                                     for top-left, seq_kv - seq_q for
--                                     bottom-right; the host sets it).
-- With a sliding window (fj_mods' window_left/right, launch arguments in
-- p.window_left/_right) row i sees keys i + offset - left .. i + offset +
-- right; a causal mask is the right side 0.
-- A family asks four things of the rule: where a block of rows starts and
-- how far it reaches (so tiles outside are never loaded), whether a key
-- tile needs per-element masking at all, and, per row, the first column it
-- may see and the first it may not.
--
-- Under GQA packing (attention_mma.cu's pack_gqa) the rows of a tile are
-- packed rows R = position * group + head in group: the rule then applies
-- to the position R / p.group.  A varlen or paged kernel passes `lens`,
-- the names of its sequence's lengths and offset ({ q = "len_q", kv =
-- "len_kv", off = "causal_off" }) in place of p.seq_q, p.seq_kv and
-- p.causal_offset.
--
--   local mask = import("mask.lua").new(causal, packed, lens, window)
--   mask.keys_begin(first)       the first key that rows >= first may see
--   mask.keys_end(last)          exclusive end of the keys that rows < last
--                                may see
--   mask.tile_partial(n0, bn, m, m_last)  true when some key of tile
--                                [n0, n0 + bn) is hidden from some row in
--                                m..m_last
--   mask.row_first(row, n0, c0)  the first column (from n0 + c0) that row
--                                may see; nil without a left side
--   mask.row_limit(row, n0, c0)  the first column, counted from n0 + c0,
--                                that `row` may not see
--   mask.visible(row, key)       one element's test
--   mask.used(row, key)          whether the result uses the element: a row
--                                inside the sequence that may see the key
--   mask.pos(row)                the query position of a (packed) row
--   mask.rows_begin(n0)          the first row that may see some key >= n0
--   mask.rows_end(n_end)         exclusive end of the rows that may see
--                                some key < n_end
-- The first two give a query tile its key range (the forward walks keys);
-- the last two give a key tile its query range (the backward walks rows),
-- from the same sides, so both directions skip the same tiles.

local M = {}

function M.new(causal, packed, lens, window)
  local R = { causal = causal ~= "none", window = window and true or false }
  local Q, KV, OFF = "p.seq_q", "p.seq_kv", "p.causal_offset"
  if lens then Q, KV, OFF = lens.q, lens.kv, lens.off end
  -- The diagonal the causal mask and the window share: bottom-right unless
  -- the causal mask is top-left (the host's causal_offset says the same).
  R.bottom_right = causal == "bottom-right" or (causal == "none" and R.window)
  -- The window's sides (the host passes -1 as FJ_WINDOW_MAX and a causal
  -- mask as a right side of 0); without one, causal is the right side 0.
  local RIGHT = R.window and "p.window_right" or (R.causal and "0" or nil)
  local LEFT = R.window and "p.window_left" or nil
  R.bounded = RIGHT ~= nil
  R.left = LEFT ~= nil  -- a window's left side: rows stop seeing old keys
  R.kv = KV            -- the keys' end
  local function plus_right(x)
    return R.window and ("%s + %s"):format(x, RIGHT) or x
  end
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
    if not RIGHT then return KV end
    return ("min(%s, %s)"):format(KV, plus_right(("min(%s, %s) + %s"):format(pos_end(last), Q, OFF)))
  end

  -- The first key row `first` (and every later row) may see: 0 without a
  -- window's left side.
  function R.keys_begin(first)
    if not LEFT then return "0" end
    return ("max(0, %s + %s - %s)"):format(pos(first), OFF, LEFT)
  end

  -- Row i sees some key >= n0 when its right side reaches n0: pos(i) + off
  -- + right >= n0 (in 64 bits under a window, whose sides reach 2^30).
  function R.rows_begin(n0)
    if not RIGHT then return "0" end
    local first = R.window and ("(int)max(0ll, (long long)%s - %s - %s)"):format(n0, OFF, RIGHT)
                            or ("max(0, %s - %s)"):format(n0, OFF)
    return packed and ("%s * p.group"):format(first) or first
  end

  -- Row i sees some key < n_end when its left side lies below n_end:
  -- pos(i) + off - left < n_end (in 64 bits: the window's sides reach 2^30).
  function R.rows_end(n_end)
    local last = Q
    if LEFT then
      last = ("(int)min((long long)%s, (long long)%s - %s + %s)"):format(Q, n_end, OFF, LEFT)
    end
    return packed and ("%s * p.group"):format(last) or last
  end

  function R.tile_partial(n0, bn, m, m_last)
    local t = ("%s + %d > %s"):format(n0, bn, KV)
    if RIGHT then
      t = t .. (" || %s + %d > %s"):format(n0, bn - 1, plus_right(("%s + %s"):format(pos(m), OFF)))
    end
    if LEFT then
      t = t .. (" || %s < %s + %s - %s"):format(n0, pos(m_last), OFF, LEFT)
    end
    return t
  end

  function R.row_limit(row, n0, c0)
    local lim = ("%s - %s - %s"):format(KV, n0, c0)
    if not RIGHT then return lim end
    return ("min(%s, %s + 1 - %s - %s)"):format(lim, plus_right(("%s + %s"):format(pos(row), OFF)), n0, c0)
  end

  -- The first column, counted from n0 + c0, that `row` may see (nil
  -- without a window's left side).
  function R.row_first(row, n0, c0)
    if not LEFT then return nil end
    return ("%s + %s - %s - %s - %s"):format(pos(row), OFF, LEFT, n0, c0)
  end

  function R.visible(row, key)
    local v = ("%s < %s"):format(key, KV)
    if RIGHT then v = v .. (" && %s <= %s"):format(key, plus_right(("%s + %s"):format(pos(row), OFF))) end
    if LEFT then v = v .. (" && %s >= %s + %s - %s"):format(key, pos(row), OFF, LEFT) end
    return v
  end

  function R.used(row, key)
    return ("%s < %s && %s"):format(pos(row), Q, R.visible(row, key))
  end

  return R
end

return M
