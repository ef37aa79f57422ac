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
--   mods.grad             a backward asked for the score expression's
--                          derivative (new{ grad = true }) and there is a
--                          score expression: mods.apply_grad(glv, lv, ...)
--                          (apply_score's arguments) is the statement that
--                          sets glv to d score / d s at lv * qk_scale, the
--                          raw score, before apply_score changes lv
--                          (mods.cuh's fj_score_grad, the CUDA that
--                          src/expr_grad.c generated)
--   mods.grad_const        the derivative is a finite number (no guard
--                          against inf or NaN where P is 0 is needed)
--   mods.pgrads           (with mods.grad) the score expression's reads of
--                          float tensor parameters with gradients
--                          (fj_mods.param_grads), { { param, rank, d, idx },
--                          ... }, or nil: mods.grads_param is the kernel's
--                          parameter fj::ModGrads fj_mg (their pointers),
--                          and mods.apply_pgrads(ds, s, q, h, kv) the
--                          statement that adds ds times each read's
--                          derivative at the indices read (mods.cuh's
--                          fj_param_grads, float32 atomics).  Reads whose
--                          indices use none of q, kv and s (a slope per
--                          head) are summed instead into the family's
--                          float mods.pgrads_acc[mods.pgrads_nsum] (zeroed
--                          where its (batch, query head) starts), which
--                          mods.pgrads_flush(h) adds, a warp's sum in one
--                          atomic (fj_param_flush: every lane of the warp
--                          runs it)
--   mods.qk_scale(base), mods.sl2   the family's scale of the scores into the
--                          score function, and the softmax's log2 scale
--   mods.sinks             attention sinks are on: no element work; the
--                          epilogue (or split-KV's combine) adds p.sinks[h]
--                          to each row's denominator
--   mods.kvq               the score expression's (float)(kv - q) (or q -
--                          kv), ALiBi's distance, is the float fj_kvq, which
--                          the family passes to apply_score as `kvq`: one
--                          conversion a row and tile, one add an element
--                          (mods.kernel_score_text is the kernel's CUDA)
--   mods.kvq_scale         nil, or the CUDA of F in the expression's F *
--                          fj_kvq (ALiBi's slope), which the kernel text
--                          reads as fj_skvq: the family passes `kvq` as
--                          that product (fj_kvq_scale, mods.cuh, gives F)
--   mods.rt                the score's relative table (src/mods_kernel.h):
--                          the CUDA of its subtree of h, q, kv and the
--                          parameters (they appear only as kv - q or q -
--                          kv), which templates/rel_table.cu evaluates into
--                          the table, the parameter fj_rt after the user's;
--                          the kernels read the table as mods.dg (nil:
--                          none).  new{ rt_fill = true } (rel_table.cu)
--                          defines fj_rt_value(h, q, kv, fj_p, fj_ma), the
--                          subtree's value
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
-- The expressions arrive checked and analysed: src/mods_kernel.c parsed
-- them (src/expr.c's parser accepted them and nothing else), read the
-- facts below off their trees and printed them as CUDA with the family's
-- names substituted, and hands them over as the template parameter
-- mod_facts -- { score = { text1, cuda, kvq, kvq_scale, dg, ... }, mask =
-- { text1, cuda }, params = { { name, type, rank, index, shared }, ... } }
-- (src/mods_kernel.h).  Nothing here reads the user's text; mods.cuh
-- pastes the printed CUDA after a #line naming the expression.

local M = {}

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
  R.softcap = o.softcap and true or false
  R.sinks = o.sinks and true or false
  -- Checked mode: a tensor read out of range is recorded (mods.cuh).
  R.checked = o.checked and true or false
  local facts = mod_facts or {}
  -- The C side's facts of each expression given (o.score, o.mask: the
  -- family passes the parameters score_mod and mask_mod through).
  local SF = (o.score and o.score ~= "") and facts.score or nil
  local MF = (o.mask and o.mask ~= "") and facts.mask or nil
  if (o.score and o.score ~= "" and not SF) or (o.mask and o.mask ~= "" and not MF) then
    refuse("mods: an expression without its facts (mod_facts, src/mods_kernel.c)")
  end
  R.score_text = SF and SF.text1
  R.mask_text = MF and MF.text1
  R.params = {}
  for k, p in ipairs(facts.params or {}) do
    R.params[k] = { name = p.name, type = p.type, rank = p.rank, index = p.index, shared = p.shared }
  end
  -- ALiBi's distance, (float)(kv - q) or (float)(q - kv), as fj_kvq (or
  -- (0.f-fj_kvq), not (-fj_kvq): on the diagonal fj_kvq is +0, and
  -- (float)(q - kv) is +0 there too, which a division sees): a float the
  -- family builds per element from one conversion a row and tile plus the
  -- column's constant, one add where the integer subtraction and the
  -- conversion took three instructions (ALiBi's cost went mostly there).
  -- Exact while |kv - q| and the tile's first distance stay below 2^24
  -- (beyond, rounded twice where the text rounds once).
  R.kernel_score_text = SF and SF.cuda
  R.kvq = SF and SF.kvq or false
  -- ALiBi's product F * fj_kvq, with F the product's left operand, free
  -- of q, kv and s: the family takes F once a row and tile (fj_kvq_scale,
  -- mods.cuh) and the product per element as fmaf(F, the column's
  -- constant, F times the row's distance), one FMA where the add, the
  -- multiply and the score's add took three -- the same product but for
  -- the rounding of F times the row's part (within an ulp of it).  Only
  -- where that product is the expression's only use of the distance, and
  -- not in checked mode; the kernel's CUDA reads it as fj_skvq.
  R.kvq_scale = SF and SF.kvq_scale
  -- A distance table: the score expression's first read of a tensor at
  -- T(A..., q - kv + X) or T(A..., kv - q + X) (X a chain of + and -,
  -- possibly none; A and X free of q, kv and s) -- the relative-position
  -- bias.  Along a lane's scores of a tile only the distance changes, by a
  -- constant per element, so the family reads the element at a row pointer
  -- plus an immediate offset where the whole tile lies within the extents
  -- (one branch a tile), instead of an index, a bounds test and a 64-bit
  -- address per score (about 9 instructions of the relative bias's 10 over
  -- the plain kernel: docs/PERF.md).  The kernel's CUDA reads the call as
  -- the value fj_dg.  Not in checked mode, whose reads record what they
  -- miss.  dg.x, dg.uniform[k] and dg.call are CUDA; dg.line and dg.col
  -- say where the call starts in the user's text.
  if SF and SF.dg then
    local d = SF.dg
    local t = R.params[d.param + 1]
    -- inside: the variant's table_inside (fj_variant): the host proved
    -- every read a tile makes within the table, so the families read it
    -- at the row pointer alone, with no path through the accessor.
    R.dg = { name = t.name, param = t, sign = d.sign, x = d.x, uniform = d.uniform or {},
             call = d.call, line = d.line, col = d.col,
             value = t.type == "i32" and "int" or "float",
             inside = table_inside and true or false }
  end
  -- The relative table's subtree (its read is mods.dg, above).
  R.rt = SF and SF.rt or nil
  R.rt_fill = o.rt_fill and R.rt ~= nil
  -- Facts for later use: whether the score reads s, and whether it
  -- depends on nothing but s, h, the parameters and kv - q.
  R.uses_s = SF and SF.uses_s or false
  R.rel_only = SF and SF.rel_only or false
  R.mask_cuda = MF and MF.cuda
  -- The score expression's derivative, for a backward that asks for it.
  R.grad = (o.grad and SF) and true or false
  R.kernel_grad_text = SF and SF.grad
  -- A derivative that is a finite number (ALiBi's and a bias table's 1):
  -- times P = 0 it is 0, so a family need not guard it against inf or NaN.
  local gnum = R.kernel_grad_text and tonumber((R.kernel_grad_text:match("^%s*(.-)f?%s*$")))
  R.grad_const = gnum ~= nil and gnum == gnum and gnum ~= math.huge and gnum ~= -math.huge
  if R.grad and not R.kernel_grad_text then
    refuse("score': the expression's derivative as CUDA is too long for the backward (src/mods_kernel.h's FJ_MODS_GRAD_MAX); write it with less nesting")
  end
  -- The parameters' gradients: the reads that add to them.
  if R.grad and SF.pgrads == false then
    refuse("mods.param_grads: the score expression reads the parameters with gradients more than 8 times, or their derivatives are too long (src/mods_kernel.h's FJ_MODS_PGRADS_MAX)")
  end
  R.pgrads = R.grad and SF.pgrads and #SF.pgrads > 0 and SF.pgrads or nil
  R.grads_param = R.pgrads and ", const fj::ModGrads fj_mg" or ""
  -- Those read at one element per (batch, query head), summed before
  -- their atomics, and the others, one atomic per score.
  R.pgrads_each, R.pgrads_sum = {}, {}
  for _, r in ipairs(R.pgrads or {}) do
    table.insert(r.uniform and R.pgrads_sum or R.pgrads_each, r)
  end
  R.pgrads_nsum = #R.pgrads_sum
  R.pgrads_acc = "fj_pga"
  R.score = R.score_text ~= nil or R.softcap
  R.mask = R.mask_text ~= nil
  R.any = R.score or R.mask
  -- Only expressions read the parameters: without one the kernel takes
  -- no fj::ModArgs (and mods.cuh's declarations are not included).
  R.args = #R.params > 0 and R.any
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
      -- indices that change from score to score (they use kv or s: the C
      -- side's per-score fact, p.shared false); read only at a row's or a
      -- head's indices (ALiBi's slopes(h)), or only by the mask, plain
      -- loads (READ above): one per row.
      p.read = p.shared and READ[p.type] or LDG[p.type]
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
  -- The declarations of a family's scales (C statements, indent spaces
  -- before the lines after the first): qk_scale into the score function
  -- where one runs, and sl2, the softmax's log2 scale; factor multiplies
  -- the problem's scale (FP8 K's " * k_scale"), or ""; qk_name (default
  -- qk_scale) names the first, for a family that scales it again where the
  -- score function runs (FP8 attention: by each work tile's descales,
  -- into a qk_scale of its own).
  function R.scales(indent, factor, qk_name)
    local pad = (" "):rep(indent)
    if R.score then
      return table.concat({
        "// A score function sees the scaled score, so the softmax works on its",
        pad .. "// results in natural units (mods.lua: with the softcap alone, the cap",
        pad .. "// folded into both scales).",
        pad .. ("const float %s = %s;"):format(qk_name or "qk_scale", R.qk_scale("p.scale_log2 * 0.69314718056f" .. factor)),
        pad .. ("const float sl2 = %s;"):format(R.sl2) }, "\n")
    end
    return ("const float sl2 = p.scale_log2%s;"):format(factor)
  end
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
  function R.apply_grad(glv, lv, q, h, kv, visible, kvq, dg)
    return only_visible(("%s = fj_score_grad(%s * qk_scale, %s, %s, %s, %s, %s, %s%sp%s);"):format(
      glv, lv, B, h, HKV, q, kv, R.kvq and kvq .. ", " or "", R.dg and dg .. ", " or "", MA), visible)
  end
  function R.apply_pgrads(ds, s, q, h, kv)
    local out = {}
    if #R.pgrads_each > 0 then
      out[#out + 1] = ("fj_param_grads(%s, %s, %s, %s, %s, %s, %s, p, fj_ma, fj_mg);"):format(ds, s, B, h, HKV, q, kv)
    end
    if R.pgrads_nsum > 0 then
      out[#out + 1] = ("fj_param_dsum(%s, %s, %s, %s, %s, %s, %s, p, fj_ma, %s);"):format(ds, s, B, h, HKV, q, kv, R.pgrads_acc)
    end
    return #out > 1 and ("{ %s }"):format(table.concat(out, " ")) or out[1]
  end
  function R.pgrads_flush(h)
    return ("fj_param_flush(%s, %s, %s, %s, p, fj_ma, fj_mg);"):format(R.pgrads_acc, B, h, HKV)
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
