-- budget.lua: what a kernel built from pieces may spend -- the shared-memory
-- plan and the register split between a producer warpgroup and its
-- consumers -- computed in one place from the pieces a kernel uses, so that
-- every refusal names the value and the limit.
--
--   local B = import("budget.lua").new{ smem_limit = bytes, slack = 1024 }
--   B.region(name, bytes, align)  places a region after the last (aligned),
--                                 returns its offset from the 1024-aligned base
--   B.fits(extra)                 whether extra more bytes (after the regions,
--                                 with the slack) stay within the limit
--   B.total()                     the bytes a launch asks for: the regions and
--                                 the slack that aligns the base
--   B.comment()                   the plan as one comment line for the kernel
--   B.regs(consumers, extra)      the setmaxnreg split { producer, consumer }
--                                 for 1-3 consumer warpgroups (extra: a
--                                 producer that needs more, see below)
--   B.check_regs(need, who, what, hint)  refuses when a consumer thread
--                                 needs more registers than the split gives
--                                 it: "<who> need about <need> registers per
--                                 consumer thread for <what>; ..."
-- (The host refuses a plan over the architecture's shared memory with the
-- value and the limit: src/kernel.c, from meta.smem_bytes = B.total().)
--
-- Regions are laid out in the order they are asked for; nothing is
-- reordered, so the kernel's offsets are those the comment prints.

local M = {}

-- sm_90's shared memory per block (227 KB) and its register file (64K
-- 32-bit registers per multiprocessor; a block of 128 (C + 1) threads at
-- one block per multiprocessor splits it as the table below).
M.SM90_SMEM = 227 * 1024

-- Shared memory per multiprocessor by compute capability (src/ctx.c's
-- arch_table, kept in step), for a kernel's blocks a multiprocessor holds.
function M.smem_sm(sm)
  if sm == 75 then return 64 * 1024 end
  if sm == 80 or sm == 87 then return 164 * 1024 end
  if sm == 86 or sm == 88 or sm == 89 or sm >= 120 then return 100 * 1024 end
  return 228 * 1024
end

-- setmaxnreg's split per consumer warpgroups: the producer gives its
-- registers to the consumers (24 or 32 left to it), whose count must be a
-- multiple of 8 with the block's total within 64K.
local SPLIT = { [1] = { 0, 255 }, [2] = { 24, 240 }, [3] = { 32, 160 } }

function M.new(o)
  local B = { plan = {}, offset = 0, limit = o.smem_limit or M.SM90_SMEM, slack = o.slack or 1024 }

  function B.region(name, bytes, align)
    B.offset = (B.offset + align - 1) // align * align
    B.plan[#B.plan + 1] = { name = name, offset = B.offset, bytes = bytes }
    B.offset = B.offset + bytes
    return B.plan[#B.plan].offset
  end

  function B.fits(extra)
    return B.offset + (extra or 0) + B.slack <= B.limit
  end

  function B.total()
    return B.offset + B.slack
  end

  function B.comment()
    local parts = { ("// shared memory: %d bytes"):format(B.total()) }
    for _, r in ipairs(B.plan) do parts[#parts + 1] = ("; %s @%d"):format(r.name, r.offset) end
    return table.concat(parts) .. " (+ alignment)"
  end

  -- The register split.  A producer with more to do than issue loads (one
  -- that walks a block mask's lists, claims its tiles and reads the next
  -- one's counts) passes extra = { producer = n, consumer = m }, at most the
  -- 64K the block starts with.
  function B.regs(consumers, extra)
    local r = SPLIT[consumers]
    if not r then refuse(("%d consumer warpgroups: the register split takes 1, 2 or 3"):format(consumers)) end
    B.consumers = consumers
    B.split = extra and { extra.producer, extra.consumer } or { r[1], r[2] }
    -- A block starts with the registers its launch bounds give each of
    -- its threads (64K over 128 (C + 1), down to a multiple of 8);
    -- setmaxnreg.inc waits for more than that forever.
    local have = (65536 // (128 * (consumers + 1))) // 8 * 8 * (consumers + 1)
    if B.split[1] + consumers * B.split[2] > have then
      refuse(("register split %d + %d x %d: over the %d a thread of each warpgroup the block starts with"):format(
        B.split[1], consumers, B.split[2], have))
    end
    return B.split
  end

  function B.check_regs(need, who, what, hint)
    local have = B.split[2]
    if need > have then
      refuse(("%s need about %d registers per consumer thread for %s; %d consumer warpgroups have %d (over by %d): %s"):format(
        who, need, what, B.consumers, have, need - have, hint))
    end
  end

  return B
end

return M
