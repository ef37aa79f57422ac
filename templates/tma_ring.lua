-- tma_ring.lua: the producer piece -- TMA loads of streamed tensors into
-- rings of mbarrier-guarded shared-memory slots (wgmma.cuh's tma_load4 and
-- mbarriers), for any list of tensors and any element width.
--
-- Contract.  A tile of `rows` x `cols` elements of `elem` bytes arrives as
-- panels of 128-byte rows (the 128-byte swizzle TMA writes and wgmma reads:
-- 128 / elem columns a panel), each panel rows x 128 bytes, 1024-byte
-- aligned; a slot holds the tile's panels one after another.  Each slot has
-- two mbarriers: "full" (one arrival, the producer's, plus the tile's bytes
-- as transactions) and "empty" (one arrival per consumer warp, `arrivals`
-- in all).  Tile number `it` (counted over a block's life) lives in slot
-- it % slots; its full barrier completes phase (it / slots) & 1, and the
-- producer refills the slot once the empty barrier has completed the phase
-- before (in the first round that test passes at once).  The host's tensor
-- map has boxes of 128 / elem columns by `rows` rows (src/attention.c).
--
--   local TR = import("tma_ring.lua")
--   local bars = TR.barriers()                  -- 8-byte mbarriers, in order
--   local q = TR.ring{ name = "q", elem = 2, rows = BM, cols = D, slots = 1,
--                      arrivals = 4 * C, smem = "sq", map = "mq", bars = bars }
--   q.bytes                     the ring's shared memory (for budget.lua)
--   q.panels, q.panel_bytes, q.slot_bytes, q.panel_cols
--   q.full(slot), q.empty(slot) the barriers' shared-space addresses (C)
--   q.slot_addr(slot, pn)       panel pn of a slot (C)
--   q.wait_empty(slot, parity)  the producer's wait before refilling (C)
--   q.fill(slot, coords, extra) expect the tile's bytes (and `extra` more:
--                               other copies the caller issues on the
--                               slot's barrier), issue its panels' loads;
--                               coords(pn) gives the box's four
--                               coordinates (C statement)
--   q.wait_full(slot, parity)   a consumer's wait for the tile (C)
--   q.release(slot)             a consumer warp's arrival: its part is done
--   TR.decls(rings, bars)       declares the barriers' names: one-slot
--                               rings' (q_full, q_empty), and macros of the
--                               slot for the others' (FJ_K_FULL(slot));
--                               TR.undefs(rings) ends the macros
--   TR.init(rings, extra)       the barriers' initialisation (one thread),
--                               extra: { { addr, count }, ... } of other
--                               barriers of the plan
--   bars.count                  how many barriers the plan holds
--   bars.base                   the name the kernel gives the first one

local M = {}

-- The element sizes the pieces take (bytes).  The 16-bit types are what the
-- forward runs today; the 8-bit ones are the FP8 producer's.
M.ELEM = { f16 = 2, bf16 = 2, e4m3 = 1, e5m2 = 1 }
-- A swizzled row: the 128-byte swizzle's span (pieces.lua's).
M.ROW_BYTES = import("pieces.lua").ROW_BYTES

function M.barriers(base)
  local BR = { count = 0, base = base or "bars" }
  -- count barriers from here on; returns the first's index
  function BR.take(n)
    local i = BR.count
    BR.count = BR.count + n
    return i
  end
  function BR.at(i)
    return ("(%s + 8u * (%s))"):format(BR.base, i)
  end
  return BR
end

function M.ring(o)
  local R = { name = o.name, elem = o.elem, rows = o.rows, cols = o.cols, slots = o.slots,
              arrivals = o.arrivals }
  if (o.cols * o.elem) % M.ROW_BYTES ~= 0 then
    refuse(("%s: %d columns of %d bytes are not whole 128-byte swizzled rows (a multiple of %d columns)"):format(
      o.name, o.cols, o.elem, M.ROW_BYTES // o.elem))
  end
  R.panel_cols = M.ROW_BYTES // o.elem
  R.panels = o.cols * o.elem // M.ROW_BYTES
  R.panel_bytes = o.rows * M.ROW_BYTES
  R.slot_bytes = R.panels * R.panel_bytes
  R.bytes = o.slots * R.slot_bytes
  R.tx_bytes = o.rows * o.cols * o.elem
  local bars = o.bars
  local full0, empty0 = bars.take(o.slots), bars.take(o.slots)
  -- A ring of one slot names its two barriers (TR.decls declares them).
  R.names = o.slots == 1 and { o.name .. "_full", o.name .. "_empty", full0, empty0 } or nil
  -- A ring of several slots names its barriers by macros (TR.decls):
  -- FJ_K_FULL(slot), FJ_K_EMPTY(slot).
  R.macros = o.slots > 1 and { ("FJ_%s_FULL"):format(o.name:upper()), ("FJ_%s_EMPTY"):format(o.name:upper()),
                               full0, empty0 } or nil
  local function at(first, slot)
    if R.names then return first == full0 and R.names[1] or R.names[2] end
    return ("%s(%s)"):format(first == full0 and R.macros[1] or R.macros[2], slot)
  end
  function R.full(slot) return at(full0, slot) end
  function R.empty(slot) return at(empty0, slot) end
  function R.slot_addr(slot, pn)
    local s = o.slots == 1 and o.smem or ("%s + (%s) * %d"):format(o.smem, slot, R.slot_bytes)
    return ("%s + %s * %d"):format(s, pn, R.panel_bytes)
  end
  function R.wait_empty(slot, parity)
    return ("fj::mbar_wait(%s, %s);"):format(R.empty(slot), parity)
  end
  function R.fill(slot, coords, extra_bytes)
    local lines = {
      ("fj::mbar_expect(%s, %du);"):format(R.full(slot), R.tx_bytes + (extra_bytes or 0)),
      "#pragma unroll",
      ("for (int pn = 0; pn < %d; ++pn)"):format(R.panels),
      ("  fj::tma_load4(%s, %s, %s, %s);"):format(R.slot_addr(slot, "pn"), o.map, R.full(slot), coords("pn")),
    }
    return table.concat(lines, "\n")
  end
  function R.wait_full(slot, parity)
    return ("fj::mbar_wait(%s, %s);"):format(R.full(slot), parity)
  end
  function R.release(slot)
    return ("__syncwarp();\nif (lane == 0) fj::mbar_arrive(%s);"):format(R.empty(slot))
  end
  return R
end

-- The names of the rings' barriers, declared once: one-slot rings' as
-- constants, the others' as macros of the slot (TR.undefs ends them).
function M.decls(rings, bars)
  local parts, lines = {}, {}
  for _, r in ipairs(rings) do
    if r.names then
      local function addr(i) return i == 0 and bars.base or ("%s + %du"):format(bars.base, 8 * i) end
      parts[#parts + 1] = ("%s = %s, %s = %s"):format(r.names[1], addr(r.names[3]), r.names[2], addr(r.names[4]))
    else
      for k = 1, 2 do
        lines[#lines + 1] = ("#define %s(i) %s"):format(r.macros[k], bars.at(("%du + (i)"):format(r.macros[k + 2])))
      end
    end
  end
  if #parts > 0 then table.insert(lines, 1, "const unsigned " .. table.concat(parts, ", ") .. ";") end
  return table.concat(lines, "\n")
end

function M.undefs(rings)
  local lines = {}
  for _, r in ipairs(rings) do
    if r.macros then
      lines[#lines + 1] = ("#undef %s\n#undef %s"):format(r.macros[1], r.macros[2])
    end
  end
  return table.concat(lines, "\n")
end

-- The barriers' initialisation: rings of one slot first, then the other
-- barriers, then the rings of more slots in one loop over their slots.
function M.init(rings, extra)
  local lines = {}
  for _, r in ipairs(rings) do
    if r.slots == 1 then
      lines[#lines + 1] = ("fj::mbar_init(%s, 1);"):format(r.full(0))
      lines[#lines + 1] = ("fj::mbar_init(%s, %d);"):format(r.empty(0), r.arrivals)
    end
  end
  for _, e in ipairs(extra or {}) do
    lines[#lines + 1] = ("fj::mbar_init(%s, %d);"):format(e[1], e[2])
  end
  local many
  for _, r in ipairs(rings) do
    if r.slots > 1 then
      if many and many ~= r.slots then error("tma_ring.init: rings of several slots have one slot count") end
      many = r.slots
    end
  end
  if many then
    lines[#lines + 1] = "#pragma unroll"
    lines[#lines + 1] = ("for (int i = 0; i < %d; ++i) {"):format(many)
    for _, r in ipairs(rings) do
      if r.slots > 1 then
        lines[#lines + 1] = ("  fj::mbar_init(%s, 1);"):format(r.full("i"))
        lines[#lines + 1] = ("  fj::mbar_init(%s, %d);"):format(r.empty("i"), r.arrivals)
      end
    end
    lines[#lines + 1] = "}"
  end
  lines[#lines + 1] = "fj::mbar_init_fence();"
  return table.concat(lines, "\n")
end

return M
