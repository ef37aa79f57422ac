-- mods.lua: a problem's score and mask modifications (fj_mods) as the
-- kernel applies them, element by element, to the scaled scores -- the one
-- mechanism for the user's expressions and the built-in softcap (the
-- built-in window is a mask rule: mask.lua, with tile skipping).
--
--   local mods = import("mods.lua").new{ score = score_mod, mask = mask_mod,
--                                        params = mod_params, softcap = softcap,
--                                        sinks = sinks, bounded = bf16 P,
--                                        b = "blk.b", hkv = "blk.hk" }
--   mods.score             a score function runs (an expression or softcap)
--   mods.mask              a mask expression runs
--   mods.any               either: the family applies them per element
--   mods.args              the kernel takes fj::ModArgs (parameters exist)
--   mods.kernel_param      its declaration in the kernel's parameter list
--   mods.apply_score(lv, q, h, kv, visible, kvq, dg), mods.apply_mask(...)
--                          the statement for one element: lv becomes the
--                          score function of lv * qk_scale; lv becomes -inf
--                          where the mask expression is false.  In checked
--                          mode they run only where `visible` (mask.lua's
--                          mask.used: the row is in the sequence and the
--                          built-in rules let it see the key) holds, so that a
--                          read they record is one of a pair the result
--                          uses; otherwise they run on every element and
--                          the built-in mask hides the rest afterwards
--   mods.mask_guard        nil, or a C bool the family sets (a block mask:
--                          whether the tile is of a partial block); the
--                          family runs the mask statements of a tile only
--                          where it holds, under one branch
--   mods.qk_scale(base), mods.sl2   the family's scale of the scores into the
--                          score function, and the softmax's log2 scale
--   mods.sinks             attention sinks are on: no element work; the
--                          epilogue (or split-KV's combine) adds p.sinks[h]
--                          to each row's denominator
--   mods.kvq               the score expression's (float)(kv - q) (or q -
--                          kv), ALiBi's distance, is the float fj_kvq, which
--                          the family passes to apply_score as `kvq`: one
--                          conversion a row and tile, one add an element
--                          (mods.kernel_score_text is the rewritten text)
--   mods.kvq_scale         nil, or the text F of the expression's F *
--                          fj_kvq (ALiBi's slope), which the kernel text
--                          reads as fj_skvq: the family passes `kvq` as
--                          that product (fj_kvq_scale, mods.cuh, gives F)
--   mods.dg                the score expression reads a distance table,
--                          T(A..., q - kv + X) (or kv - q), as the value
--                          fj_dg, which the family passes to apply_score
--                          as `dg`: where a lane's tile lies within T's
--                          extents (fj_dg_row, mods.cuh) an element is
--                          mods.dg_load(row pointer, constant offset),
--                          elsewhere fj_dg_read (the call as written);
--                          mods.dg.sign is +1 for q - kv, -1 for kv - q
--   mods.bounded           the softcap bounds every score (|score| <= cap)
--                          and P is bfloat16 (new{ bounded = ... } says so):
--                          where the C bool mods.fixed_on holds (the host's
--                          p.softcap_shift, src/mods.c), the softmax takes
--                          its exponentials against the fixed running max
--                          mods.fixed_m (in the units it keeps scores in)
--                          instead of reducing a row max, and never
--                          rescales O
--
-- The expressions arrive checked (src/expr.c's parser accepted them and
-- nothing else); mods.cuh pastes them, each after a #line naming it, so
-- that NVRTC's messages point into the user's own text.

local M = {}

-- Whether text names any of the identifiers in list (whole words).
local function names_any(text, list)
  for _, n in ipairs(list) do
    if text:find("%f[%w_]" .. n .. "%f[^%w_]") then return true end
  end
  return false
end

-- text with its characters a..b replaced by the name to, padded with
-- spaces to their length (NVRTC's columns stay the user's).
local function put(text, a, b, to)
  return text:sub(1, a - 1) .. to .. (" "):rep(b - a + 1 - #to) .. text:sub(b + 1)
end

-- "name:type:rank;..." (src/mods.c) as a list.
local function param_list(text)
  local list = {}
  for item in (text or ""):gmatch("[^;]+") do
    local name, ty, rank = item:match("^([%w_]+):(%w+):(%d)$")
    if not name then refuse(("mod_params: \"%s\" is not name:type:rank"):format(item)) end
    list[#list + 1] = { name = name, type = ty, rank = tonumber(rank), index = #list }
  end
  return list
end

local CTYPE = { f32 = "float", i32 = "int", f16 = "__half", bf16 = "__nv_bfloat16" }
-- A tensor element at address %s as the expression's int or float:
-- plain loads, which the compiler shares and hoists, where reads repeat
-- across a tile's scores (the mask's doc(kv) per key column, doc(q) and a
-- score's slopes(h) per row); CUDA's __ldg (LDG: an asm volatile, which
-- the compiler may neither share between the scores of a tile nor move
-- out of the key loop) for a score expression's reads that index by key
-- or score (a bias table's bias(h, q - kv)): there plain loads gain
-- nothing to share and all issue early, holding registers (ptxas spilled
-- 8-20 bytes with the relative-position bias at 128-key wgmma tiles).
local READ = { f32 = "*(%s)", i32 = "*(%s)", f16 = "__half2float(*(%s))", bf16 = "__bfloat162float(*(%s))" }
local LDG = { f32 = "__ldg(%s)", i32 = "__ldg(%s)",
              f16 = "__half2float(__ldg(%s))", bf16 = "__bfloat162float(__ldg(%s))" }

function M.new(o)
  local R = {}
  R.score_text = (o.score and o.score ~= "") and o.score or nil
  R.mask_text = (o.mask and o.mask ~= "") and o.mask or nil
  R.softcap = o.softcap and true or false
  R.sinks = o.sinks and true or false
  -- Checked mode: a tensor read out of range is recorded (mods.cuh).
  R.checked = o.checked and true or false
  R.params = param_list(o.params)
  -- ALiBi's distance, (float)(kv - q) or (float)(q - kv), as fj_kvq (or
  -- its negation): a float the family builds per element from one
  -- conversion a row and tile plus the column's constant, one add where the
  -- integer subtraction and the conversion took three instructions (ALiBi's
  -- cost went mostly there).  Exact while |kv - q| and the tile's first
  -- distance stay below 2^24 (beyond, rounded twice where the text rounds
  -- once).  The text keeps its length (the name padded with spaces), so
  -- NVRTC's columns are still the user's.
  local function kvq_form(text)
    local out, i = {}, 1
    while true do
      local a, b = text:find("(float)", i, true)
      if not a then break end
      -- "(float)", then "(" x "-" y ")" with spaces anywhere between.
      local j = b + 1
      local function at(c)  -- past the spaces, whether c is next
        while text:sub(j, j):match("%s") do j = j + 1 end
        return text:sub(j, j) == c
      end
      local function name()  -- past the spaces, the identifier there
        at("")
        local k = j
        while text:sub(j, j):match("[%w_]") do j = j + 1 end
        return text:sub(k, j - 1)
      end
      local ok = at("(")
      j = j + 1
      local x = name()
      ok = ok and at("-")
      j = j + 1
      local y = name()
      ok = ok and at(")")
      -- (0.f - fj_kvq), not (-fj_kvq): on the diagonal fj_kvq is +0, and
      -- (float)(q - kv) is +0 there too, which a division sees.  A span
      -- with a line break stays as written (NVRTC's lines stay the user's).
      if ok and ((x == "kv" and y == "q") or (x == "q" and y == "kv"))
         and not text:sub(a, j):find("\n") then
        local to = x == "kv" and "fj_kvq" or "(0.f-fj_kvq)"
        out[#out + 1] = text:sub(i, a - 1) .. to .. (" "):rep(j - a + 1 - #to)
        i = j + 1
      else
        out[#out + 1] = text:sub(i, b)
        i = b + 1
      end
    end
    out[#out + 1] = text:sub(i)
    return table.concat(out)
  end
  R.kernel_score_text = R.score_text and kvq_form(R.score_text)
  R.kvq = R.kernel_score_text ~= R.score_text
  -- ALiBi's product F * fj_kvq, with F the complete left operand (a name,
  -- a call, a parenthesised group or a literal, after nothing that binds
  -- tighter than *) and free of q, kv and s: the family takes F once a row
  -- and tile (fj_kvq_scale, mods.cuh) and the product per element as
  -- fmaf(F, the column's constant, F times the row's distance), one FMA
  -- where the add, the multiply and the score's add took three -- the
  -- same product but for the rounding of F times the row's part (within
  -- an ulp of it).  Only where that product is the text's only use of
  -- fj_kvq, and not in checked mode; the text becomes fj_skvq (padded).
  local function kvq_scale_form(text)
    if R.checked or not text then return nil end
    local a, b = text:find("fj_kvq", 1, true)
    if not a or text:find("fj_kvq", b + 1, true) then return nil end
    -- Back from "fj_kvq" over spaces to "*", then over F.
    local k = a - 1
    while k > 0 and text:sub(k, k):match("%s") do k = k - 1 end
    if text:sub(k, k) ~= "*" then return nil end
    k = k - 1
    while k > 0 and text:sub(k, k):match("%s") do k = k - 1 end
    local e = k  -- F's last character
    if text:sub(k, k) == ")" then  -- a group, or a call's arguments
      local depth = 0
      while k > 0 do
        local ch = text:sub(k, k)
        if ch == ")" then depth = depth + 1 elseif ch == "(" then depth = depth - 1 end
        if depth == 0 then break end
        k = k - 1
      end
      if k == 0 then return nil end
      k = k - 1
    end
    while k > 0 and text:sub(k, k):match("[%w_%.]") do k = k - 1 end
    local f = text:sub(k + 1, e)
    -- What stands before F: nothing, or an operator looser than *.
    local j = k
    while j > 0 and text:sub(j, j):match("%s") do j = j - 1 end
    local before = text:sub(j, j)
    if j > 0 and not before:match("[%+%-%(,%?:<>=&|%^]") then return nil end
    if f == "" then return nil end
    -- A number after + or - may be an exponent's tail (1e-3f): not taken.
    if f:match("^[%d%.]") and before:match("[%+%-]") then return nil end
    if names_any(f, { "q", "kv", "s", "fj_dg" }) or text:sub(k + 1, b):find("\n") then return nil end
    return { factor = f, text = put(text, k + 1, b, "fj_skvq") }
  end
  -- A distance table: the score expression's first read of a tensor at
  -- T(A..., q - kv + X) or T(A..., kv - q + X) (the difference possibly
  -- in parentheses; X optional, a chain of + and -, and
  -- with A free of q, kv and s; the parser made every index an int) --
  -- the relative-position bias.  Along a lane's scores of a tile only the
  -- distance changes, by a constant per element, so the family reads the
  -- element at a row pointer plus an immediate offset where the whole tile
  -- lies within the extents (one branch a tile), instead of an index, a
  -- bounds test and a 64-bit address per score (about 9 instructions of
  -- the relative bias's 10 over the plain kernel: docs/PERF.md).  The call
  -- becomes the value fj_dg (padded: NVRTC's columns stay the user's).
  -- Not in checked mode, whose reads record what they miss.
  local function dg_form(text)
    if R.checked or not text then return nil end
    local tensors = {}
    for _, p in ipairs(R.params) do
      if p.rank > 0 then tensors[p.name] = p end
    end
    local pos = 1
    while true do
      -- The next name; a tensor's call runs to its closing parenthesis.
      local a, e = text:find("[%w_]+", pos)
      if not a then return nil end
      local name = text:sub(a, e)
      local t, b, args = tensors[name], nil, nil
      if t then
        local k = e + 1
        while text:sub(k, k):match("%s") do k = k + 1 end
        local depth = 0
        for j = k, #text do
          local ch = text:sub(j, j)
          if ch == "(" then depth = depth + 1 elseif ch == ")" then depth = depth - 1 end
          if depth == 0 then b = j break end
        end
        args = b and text:sub(k, b)
      end
      if t and b and not text:sub(a, b):find("\n") then
        -- The indices, split at the commas outside parentheses.
        local inner, idx, depth, from = args:sub(2, -2), {}, 0, 1
        for k = 1, #inner do
          local ch = inner:sub(k, k)
          if ch == "(" then depth = depth + 1
          elseif ch == ")" then depth = depth - 1
          elseif ch == "," and depth == 0 then
            idx[#idx + 1] = inner:sub(from, k - 1)
            from = k + 1
          end
        end
        idx[#idx + 1] = inner:sub(from)
        local last = idx[#idx]
        -- "x - y" at the front, then the rest.
        local k = 1
        local function word()
          while last:sub(k, k):match("%s") do k = k + 1 end
          local from = k
          while last:sub(k, k):match("[%w_]") do k = k + 1 end
          return last:sub(from, k - 1)
        end
        local function past(ch)  -- past the spaces, whether ch is next (then past it)
          while last:sub(k, k):match("%s") do k = k + 1 end
          if last:sub(k, k) ~= ch then return false end
          k = k + 1
          return true
        end
        local paren = past("(")
        local x = word()
        local y = past("-") and word() or nil
        if paren and not past(")") then y = nil end
        local rest = last:sub(k)
        local sign = (x == "q" and y == "kv") and 1 or (x == "kv" and y == "q") and -1 or nil
        -- X: + or - at the front, then nothing that binds looser than
        -- them outside parentheses, so that q - kv + X is (q - kv) + X.
        local ok = sign and (rest:match("^%s*$") or rest:match("^%s*[%+%-]"))
        ok = ok and not rest:gsub("%b()", ""):find("[<>=&|%^%?:!,]")
        -- (fj_kvq: a (float)(kv - q) kvq_form rewrote.)
        local varying = { "q", "kv", "s", "fj_kvq" }
        ok = ok and not names_any(rest, varying)
        for k = 1, #idx - 1 do
          ok = ok and not names_any(idx[k], varying)
        end
        if ok then
          local dg = { name = name, param = t, sign = sign,
                       x = rest:match("^%s*$") and "0" or rest:match("^%s*%+%s*(.*)$") or "0 " .. rest:match("^%s*(.*)$"),
                       uniform = {}, call = text:sub(a, b) }
          for k = 1, #idx - 1 do dg.uniform[k] = idx[k] end
          -- Where the call starts: its line and column in the user's text.
          local before = text:sub(1, a - 1)
          local _, nl = before:gsub("\n", "")
          dg.line = nl + 1
          dg.col = a - (before:match(".*\n()") or 1) + 1
          dg.value = t.type == "i32" and "int" or "float"
          dg.text = put(text, a, b, "fj_dg")
          return dg
        end
      end
      pos = e + 1
    end
  end
  R.dg = dg_form(R.kernel_score_text)
  if R.dg then R.kernel_score_text = R.dg.text end
  local sc = R.kvq and kvq_scale_form(R.kernel_score_text)
  if sc then
    R.kvq_scale = sc.factor
    R.kernel_score_text = sc.text
  end
  R.score = R.score_text ~= nil or R.softcap
  R.mask = R.mask_text ~= nil
  R.any = R.score or R.mask
  R.args = #R.params > 0
  R.kernel_param = R.args and ", const fj::ModArgs fj_ma" or ""
  R.ctype = CTYPE
  for _, p in ipairs(R.params) do
    if not CTYPE[p.type] then refuse(("mod_params: type %s of %s is unknown"):format(p.type, p.name)) end
    if p.rank == 0 and p.type ~= "f32" and p.type ~= "i32" then
      refuse(("mod_params: scalar %s is %s; f32 or i32"):format(p.name, p.type))
    end
    if p.type == "bf16" then R.bf16 = true end
    if p.rank > 0 then
      -- __ldg (LDG above) only for a tensor the score expression reads at
      -- indices that change from score to score (their text names kv or
      -- s); read only at a row's or a head's indices (ALiBi's slopes(h)),
      -- or only by the mask, plain loads (READ above): one per row.
      local per_score = false
      for args in (R.score_text or ""):gmatch("%f[%w_]" .. p.name .. "%s*(%b())") do
        if args:find("%f[%w_]kv%f[^%w_]") or args:find("%f[%w_]s%f[^%w_]") then per_score = true end
      end
      p.shared = not per_score
      p.read = per_score and LDG[p.type] or READ[p.type]
    end
  end
  -- The softcap alone folds its cap into the scales: the score function
  -- gives tanh(s / cap), and the softmax multiplies by cap log2(e) in the
  -- one FMA it makes anyway (two multiplies an element fewer).
  R.fold = R.softcap and not R.score_text
  function R.qk_scale(base)
    return R.fold and base .. " * p.softcap_inv" or base
  end
  R.sl2 = R.fold and "1.44269504089f * p.softcap" or "1.44269504089f"
  R.bounded = R.softcap and o.bounded and true or false
  R.fixed_on = "p.softcap_shift > 0.f"
  R.fixed_m = R.fold and "p.softcap_shift * p.softcap_inv" or "p.softcap_shift"
  local B, HKV = o.b or "blk.b", o.hkv or "blk.hk"
  R.b, R.hkv = B, HKV
  local MA = R.args and ", fj_ma" or ""

  local function only_visible(body, visible)
    if R.checked and visible then return ("if (%s) { %s }"):format(visible, body) end
    return body
  end
  function R.apply_score(lv, q, h, kv, visible, kvq, dg)
    return only_visible(("%s = fj_score_mod(%s * qk_scale, %s, %s, %s, %s, %s, %s%sp%s);"):format(
      lv, lv, B, h, HKV, q, kv, R.kvq and kvq .. ", " or "", R.dg and dg .. ", " or "", MA), visible)
  end
  -- The distance table's element for a lane's score: at the row pointer
  -- ptr plus a constant (the fast path), or through the accessor.
  function R.dg_load(ptr, off)
    return LDG[R.dg.param.type]:format(("%s + (%s)"):format(ptr, off))
  end
  -- The row pointer ptr of head h at distance d (q - kv), and in whether
  -- the offsets lo..hi from it lie within the table (mods.cuh's fj_dg_row).
  function R.dg_row(ptr, inb, h, d, lo, hi)
    return ("const auto *%s = fj_dg_row(%s, %s, %s, %s, %d, %d, p, fj_ma, %s);"):format(
      ptr, B, h, HKV, d, lo, hi, inb)
  end
  function R.dg_read(q, h, kv)
    return ("fj_dg_read(%s, %s, %s, %s, %s, p, fj_ma)"):format(B, h, HKV, q, kv)
  end
  function R.apply_mask(lv, q, h, kv, visible)
    return only_visible(("if (!fj_mask_mod(%s, %s, %s, %s, %s%s)) %s = FJ_NEG_INF;"):format(
      B, h, HKV, q, kv, MA, lv), visible)
  end
  return R
end

return M
