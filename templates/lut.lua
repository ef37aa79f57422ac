-- lut.lua: what code generation reads from a probed fragment layout.
--
-- A table (from the C side) has `slots`, `cols` and `map`, with
-- map[lane * slots + slot + 1] = row * cols + col.  The generator needs four
-- facts from it, each checked here rather than assumed:
--   * which slots merely repeat others (the half operands hold 16 slots whose
--     8-15 repeat 0-7 on the H200), so that each element is loaded once;
--   * whether the layout is separable: (row, col)(lane, slot) =
--     base(lane) + delta(slot).  Generated code then holds one (row, col)
--     base per lane and adds compile-time deltas per slot;
--   * for the accumulator, which slots share a row within a lane (row
--     classes) and which lanes share a row: a set of XOR masks for the
--     shuffles of the row max and row sum (and the group's XOR offsets);
--   * whether an A-operand slot holds the same element as an accumulator
--     slot in the same lane, for every lane: then P = exp(S) can become the
--     A operand of P.V without leaving registers.
-- Anything that does not hold makes analyse() return nil and a reason, and
-- the template refuses the variant with it.

local M = {}

local function rc(lut, lane, slot)
  local e = lut.map[lane * lut.slots + slot + 1]
  return e // lut.cols, e % lut.cols
end
M.rc = rc

local function same_in_all_lanes(lut, a, b)
  for lane = 0, 31 do
    if lut.map[lane * lut.slots + a + 1] ~= lut.map[lane * lut.slots + b + 1] then
      return false
    end
  end
  return true
end

-- analyse(lut, what) -> info | nil, why
--   info.slots, info.dup[s] (an earlier slot s repeats, or nil),
--   info.distinct = { slots holding distinct elements, ascending },
--   info.base[lane] = { row, col }, info.drow[s], info.dcol[s]
function M.analyse(lut, what)
  local info = { slots = lut.slots, dup = {}, distinct = {}, base = {}, drow = {}, dcol = {} }
  for s = 0, lut.slots - 1 do
    for p = 0, s - 1 do
      if info.dup[p] == nil and same_in_all_lanes(lut, s, p) then
        info.dup[s] = p
        break
      end
    end
    if info.dup[s] == nil then info.distinct[#info.distinct + 1] = s end
  end
  local r0, c0 = rc(lut, 0, 0)
  for s = 0, lut.slots - 1 do
    local r, c = rc(lut, 0, s)
    info.drow[s], info.dcol[s] = r - r0, c - c0
  end
  for lane = 0, 31 do
    local br, bc = rc(lut, lane, 0)
    info.base[lane] = { br, bc }
    for s = 0, lut.slots - 1 do
      local r, c = rc(lut, lane, s)
      if r ~= br + info.drow[s] or c ~= bc + info.dcol[s] then
        return nil, ("%s (%s on %s) is not separable: lane %d slot %d holds (%d, %d), not base + delta")
          :format(what, lut.frag, lut.device, lane, s, r, c)
      end
    end
  end
  return info
end

-- The lane bases packed as row | col << 4, for a __constant__ table.
function M.base_bytes(info)
  local out = {}
  for lane = 0, 31 do
    out[#out + 1] = tostring(info.base[lane][1] + 16 * info.base[lane][2])
  end
  return table.concat(out, ", ")
end

local function xor_span(masks)
  local span = { [0] = true }
  for _, m in ipairs(masks) do
    local add = {}
    for v in pairs(span) do add[v ~ m] = true end
    for v in pairs(add) do span[v] = true end
  end
  return span
end

-- Rows of the accumulator: classes[c] = { drow = d, slots = {...} } (the
-- slots of a lane that share one row), class_of[s], and masks: XOR masks
-- such that the lanes holding a row are exactly lane ^ span(masks).
function M.rows(info, what)
  local classes, class_of = {}, {}
  for s = 0, info.slots - 1 do
    local found
    for c, cl in ipairs(classes) do
      if cl.drow == info.drow[s] then found = c end
    end
    if not found then
      classes[#classes + 1] = { drow = info.drow[s], slots = {} }
      found = #classes
    end
    class_of[s] = found
    table.insert(classes[found].slots, s)
  end
  -- Lanes that share lane 0's rows, as a set of XOR offsets from lane 0.
  local group = {}
  for lane = 0, 31 do
    if info.base[lane][1] == info.base[0][1] then group[#group + 1] = lane end
  end
  local masks, span = {}, { [0] = true }
  for _, lane in ipairs(group) do
    if not span[lane] then
      masks[#masks + 1] = lane
      span = xor_span(masks)
    end
  end
  local size = 0
  for _ in pairs(span) do size = size + 1 end
  if size ~= #group then
    return nil, ("%s: the lanes sharing a row do not form an XOR group"):format(what)
  end
  for lane = 0, 31 do
    for v in pairs(span) do
      if info.base[lane ~ v][1] ~= info.base[lane][1] then
        return nil, ("%s: lane %d and lane %d share no row, yet XOR %d joins them")
          :format(what, lane, lane ~ v, v)
      end
    end
  end
  -- Two lanes hold one row only through the same class and the same base.
  for l1 = 0, 31 do
    for l2 = 0, 31 do
      for c1, k1 in ipairs(classes) do
        for c2, k2 in ipairs(classes) do
          local r1, r2 = info.base[l1][1] + k1.drow, info.base[l2][1] + k2.drow
          if r1 == r2 and (c1 ~= c2 or info.base[l1][1] ~= info.base[l2][1]) then
            return nil, ("%s: row %d is held by lane %d and lane %d through different slots")
              :format(what, r1, l1, l2)
          end
        end
      end
    end
  end
  table.sort(masks)
  local offsets = {}
  for v in pairs(span) do if v ~= 0 then offsets[#offsets + 1] = v end end
  table.sort(offsets)
  return { classes = classes, class_of = class_of, masks = masks, offsets = offsets,
           group_size = size }
end

-- from[s] = the accumulator slot holding A slot s's element in the same lane
-- (for every lane), or nil if some slot has none.
function M.a_from_acc(a, acc)
  local from = {}
  for _, s in ipairs(a.distinct) do
    for t = 0, acc.slots - 1 do
      if a.drow[s] == acc.drow[t] and a.dcol[s] == acc.dcol[t] then
        from[s] = t
      end
    end
    if from[s] == nil then return nil end
  end
  for lane = 0, 31 do
    if a.base[lane][1] ~= acc.base[lane][1] or a.base[lane][2] ~= acc.base[lane][2] then
      return nil
    end
  end
  return from
end

-- p8_from_acc(a8, acc) -> from, sigma | nil, why
-- FP8's P operand: S's accumulator (acc = analyse of wgmma_acc_e4m3) as the
-- A operand of the next m64nNk32 (a8 = analyse of wgmma_a8), in registers.
-- One k step of P . V covers 32 keys: S's column groups j = 0, 1 of 16
-- (accumulator registers 8j + i of the 32-column chunk are slot i of group
-- j, 16j columns on).  FP8's A layout does not match the accumulator's, but
-- P . V sums over k, so a permutation of the 32 keys applied to P's columns
-- and to V's rows alike leaves the product unchanged: in each lane and
-- each row, the lane's A slots sorted by column take the row's accumulator
-- elements (both groups) sorted by column.
--   from[s] = { j, i }: A slot s (0..15; register s // 4, byte s % 4, the
--     lowest first) takes S's group j slot i -- the same in every lane;
--   sigma[c] (c = 0..31): the S column (key within the k step) whose value
--     sits at A column c -- the same in every row and lane holding column c.
-- The contract with V: the k step's B operand must hold key 32 * block +
-- sigma[c] at k = c, i.e. V^T (K-major) stores that key's column at column c
-- of each 32-key block.  nil and why where a lane's rows differ between the
-- tables or a column would need two keys.
function M.p8_from_acc(a8, acc)
  local from, sigma, where = {}, {}, {}
  for lane = 0, 31 do
    -- rows[r] = { a = { {col, slot}... }, s = { {col, j, i}... } }
    local rows, order = {}, {}
    local function row(r)
      if not rows[r] then rows[r] = { a = {}, s = {} }; order[#order + 1] = r end
      return rows[r]
    end
    for s = 0, a8.slots - 1 do
      local r, c = a8.base[lane][1] + a8.drow[s], a8.base[lane][2] + a8.dcol[s]
      table.insert(row(r).a, { c, s })
    end
    for j = 0, 1 do
      for i = 0, acc.slots - 1 do
        local r, c = acc.base[lane][1] + acc.drow[i], acc.base[lane][2] + acc.dcol[i] + 16 * j
        table.insert(row(r).s, { c, j, i })
      end
    end
    table.sort(order)
    for _, r in ipairs(order) do
      local a, s = rows[r].a, rows[r].s
      if #a ~= #s then
        return nil, ("lane %d holds %d elements of row %d as the 8-bit A and %d in S's two column groups")
          :format(lane, #a, r, #s)
      end
      table.sort(a, function(x, y) return x[1] < y[1] end)
      table.sort(s, function(x, y) return x[1] < y[1] end)
      for k = 1, #a do
        local c, slot, sc, j, i = a[k][1], a[k][2], s[k][1], s[k][2], s[k][3]
        if c < 0 or c > 31 or sc < 0 or sc > 31 then
          return nil, ("lane %d: A column %d or S column %d is outside the 32-column k step"):format(lane, c, sc)
        end
        if from[slot] and (from[slot][1] ~= j or from[slot][2] ~= i) then
          return nil, ("A slot %d takes S's group %d slot %d in lane %d but group %d slot %d in lane 0")
            :format(slot, j, i, lane, from[slot][1], from[slot][2])
        end
        from[slot] = from[slot] or { j, i }
        if sigma[c] and sigma[c] ~= sc then
          return nil, ("A column %d would hold S column %d (lane %d, row %d) and S column %d (lane %d, row %d): V cannot be stored for both")
            :format(c, sigma[c], where[c][1], where[c][2], sc, lane, r)
        end
        sigma[c], where[c] = sc, where[c] or { lane, r }
      end
    end
  end
  local used = {}
  for c = 0, 31 do
    if sigma[c] == nil or used[sigma[c]] then
      return nil, ("the keys' order is no permutation of the k step: A column %d holds %s")
        :format(c, sigma[c] == nil and "no S column" or ("S column %d twice"):format(sigma[c]))
    end
    used[sigma[c]] = true
  end
  return from, sigma
end

-- fp8_b_isa(bk, bv) -> true | nil, why
-- The mma family's FP8 products straight from the ring (attention_mma.cu's
-- REGS) read e4m3 bytes with the 16-bit B loads (mma_frag.cuh's ldmatrix
-- addressing, K non-transposed, V .trans) and convert them in registers.
-- ldmatrix moves 16-bit units, whatever they hold (the PTX ISA), so a
-- register's bytes are the two stored units the probed B tables place in
-- it; which FP8 element each converted pair then holds is derived in the
-- template from the ISA's m16n8k16 B layout: register i of lane (g, t) =
-- (l / 4, l % 4) holds (k, n) = (2t + e + 8 (i % 2), g + 8 (i // 2)), e =
-- 0, 1 in its low and high half.  This checks that both probed tables
-- (bk: K-style, n-major; bv: V-style, .trans) are exactly that; where not,
-- the template keeps the 16-bit tiles.
function M.fp8_b_isa(bk, bv)
  for _, x in ipairs({ { bk, "K-style B" }, { bv, "V-style B" } }) do
    local lut, what = x[1], x[2]
    if lut.slots < 8 then return nil, ("%s has %d slots, not 8"):format(what, lut.slots) end
    for lane = 0, 31 do
      local g, t = lane // 4, lane % 4
      for i = 0, 3 do
        for e = 0, 1 do
          local k, n = rc(lut, lane, 2 * i + e)
          if k ~= 2 * t + e + 8 * (i % 2) or n ~= g + 8 * (i // 2) then
            return nil, ("%s: lane %d slot %d holds (k %d, n %d), not the PTX ISA's (%d, %d)")
              :format(what, lane, 2 * i + e, k, n, 2 * t + e + 8 * (i % 2), g + 8 * (i // 2))
          end
        end
      end
    end
  end
  return true
end

-- fp8_v_cols(acc) -> { dcol = {[s] = ...}, pairs = { {s, s'} | {s} ... } } | nil, why
-- O's columns where FP8 V is read by ldmatrix.trans on bytes (REGS): in
-- each 16-column tile of O the mma's first 8 columns (B registers 0-1:
-- the accumulator's columns 0-7, mma_frag.cuh) hold the even head dims,
-- column c dim 2c, and the second 8 the odd ones, column 8 + c dim 2c + 1.
-- From the accumulator table: slot s of a lane holds dim 2 acc_c + dcol[s]
-- (acc_c the lane's base column, checked separable so), and pairs lists
-- the slots in pairs of neighbouring dims of one row (even dim first), so
-- that a store stays two elements.
function M.fp8_v_cols(acc)
  local dcol = {}
  local function dim(col) return col < 8 and 2 * col or 2 * (col - 8) + 1 end
  for s = 0, acc.slots - 1 do
    dcol[s] = dim(acc.base[0][2] + acc.dcol[s]) - 2 * acc.base[0][2]
  end
  for lane = 0, 31 do
    local bc = acc.base[lane][2]
    for s = 0, acc.slots - 1 do
      local c = bc + acc.dcol[s]
      if c < 0 or c > 15 or dim(c) ~= 2 * bc + dcol[s] then
        return nil, ("the accumulator's lane %d slot %d (column %d) breaks the even/odd dims' map"):format(lane, s, c)
      end
    end
  end
  local pairs_, used = {}, {}
  for _, s in ipairs(acc.distinct) do
    if not used[s] then
      used[s] = true
      local pr = { s }
      if dcol[s] % 2 == 0 then
        for _, u in ipairs(acc.distinct) do
          if not used[u] and acc.drow[u] == acc.drow[s] and dcol[u] == dcol[s] + 1 then
            pr[2], used[u] = u, true
            break
          end
        end
      end
      pairs_[#pairs_ + 1] = pr
    end
  end
  return { dcol = dcol, pairs = pairs_ }
end

-- The tables a register softmax with P in registers needs, each checked:
-- the accumulator and the A operand (analysed), the accumulator's row
-- classes and the A slot -> accumulator slot mapping of P.  refuse(why)
-- ends the render where one does not hold; family names the kernels in it.
function M.softmax_tables(lut_acc, lut_a, family, refuse)
  local function need(info, why)
    if not info then refuse(("the %s family: %s"):format(family, why)) end
    return info
  end
  local acc = need(M.analyse(lut_acc, ("the %s accumulator"):format(family)))
  local qa = need(M.analyse(lut_a, ("the %s A operand"):format(family)))
  local rows = need(M.rows(acc, ("the %s accumulator"):format(family)))
  local p_from = M.a_from_acc(qa, acc)
  if not p_from then
    refuse(("the %s family: the probed A operand (%s) does not take P from the accumulator (%s) lane for lane; P would have to go through shared memory")
      :format(family, lut_a.frag, lut_acc.frag))
  end
  return acc, qa, rows, p_from
end

-- Pairs of distinct slots (s, s + 1) that hold neighbouring elements of one
-- row at an even column in every lane: one 4-byte access instead of two.
-- `transposed` swaps rows and columns (a col_major B operand as stored).
function M.pairs(info, transposed)
  local out, i = {}, 1
  local d = info.distinct
  local function rowcol(s)
    if transposed then return info.dcol[s], info.drow[s] end
    return info.drow[s], info.dcol[s]
  end
  local even = true
  for lane = 0, 31 do
    local bc = transposed and info.base[lane][1] or info.base[lane][2]
    if bc % 2 ~= 0 then even = false end
  end
  while i <= #d do
    local s, t = d[i], d[i + 1]
    local r1, c1 = rowcol(s)
    if t == s + 1 and even and c1 % 2 == 0 then
      local r2, c2 = rowcol(t)
      if r2 == r1 and c2 == c1 + 1 then
        out[#out + 1] = { s, t }
        i = i + 2
        goto continue
      end
    end
    out[#out + 1] = { s }
    i = i + 1
    ::continue::
  end
  return out
end

-- ldmatrix(info, transposed) -> plan | nil
-- Whether ldmatrix.x4 (optionally .trans) fills the fragment: the PTX ISA
-- gives lane l of an 8x8 matrix the stored elements (l / 4, 2(l % 4) + e),
-- e = 0, 1 (with .trans: (2(l % 4) + e, l / 4)).  The fragment qualifies
-- when its distinct slots are 8, in pairs (2i, 2i + 1) that match register i
-- of some 8x8 quadrant (qr, qc) of the stored 16x16 tile in every lane.
-- `transposed`: the stored tile is the logical matrix transposed (a
-- col_major B, stored as K's rows).
function M.ldmatrix(info, transposed)
  if #info.distinct ~= 8 then return nil end
  local function stored(lane, s)
    local r = info.base[lane][1] + info.drow[s]
    local c = info.base[lane][2] + info.dcol[s]
    if transposed then return c, r end
    return r, c
  end
  for _, trans in ipairs({ false, true }) do
    local plan = { trans = trans, quad = {} }
    for i = 0, 3 do
      local s = info.distinct[2 * i + 1]
      if info.distinct[2 * i + 2] ~= s + 1 then return nil end
      local r0, c0 = stored(0, s)
      local qr, qc = r0 // 8, c0 // 8
      for lane = 0, 31 do
        for e = 0, 1 do
          local want_r, want_c
          if trans then
            want_r, want_c = qr * 8 + 2 * (lane % 4) + e, qc * 8 + lane // 4
          else
            want_r, want_c = qr * 8 + lane // 4, qc * 8 + 2 * (lane % 4) + e
          end
          local r, c = stored(lane, s + e)
          if r ~= want_r or c ~= want_c then plan = nil break end
        end
        if not plan then break end
      end
      if not plan then break end
      plan.quad[i] = { qr, qc, s }
    end
    if plan then return plan end
  end
  return nil
end

return M
