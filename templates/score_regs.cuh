{#
  score_regs.cuh: the score step on accumulator registers -- what the
  scores of one row slice become before any softmax: the problem's score
  and mask expressions (mods.lua's object: built-ins such as the softcap,
  and the user's), then the mask rule (mask.lua: sequence ends, the causal
  diagonal, the window).  Shared by every family that keeps S in
  registers, and by the forward's online softmax (softmax_regs.cuh) and a
  backward's recomputation of P = exp(S - LSE) alike, so both see the same
  scores.

  Contract.  Emits statements for row slice "mi" (the caller's loop
  variable) of NJ tiles of 16 columns; reads and writes S(mi, j, i) in
  place: a hidden element becomes -inf, a modified one its modified score
  (in natural units: mods.qk_scale folded into the expression's input).
  No shared memory, no barriers; registers: one query position, head and
  limit per row class, and a distance table's row pointers.
    mask     "none", "always" (no branch) or "branch" (only where the C
             bool `need_mask` holds);
    mods     mods.lua's object (nil: none), with head(row) the query head
             of a row; row0(mi), c0, n0 as pieces.lua says.
    G        (a backward, where mods.grad) G(mi, j, i): where the
             derivative of the score expression at the element's raw
             score goes, set before the expression changes S; an element
             the score step leaves alone (checked mode's hidden ones)
             keeps the value the caller gave it.
  Which slot holds which (row, column) comes from the probed accumulator
  table (acc, rows: lut.lua).
#}
{%
  local NC = #rows.classes
%}
{% if mods and mods.any then %}
      // The problem's score and mask functions (mods.cuh) on every
      // element, at its query position, query head and key.
{%   for c = 1, NC do %}
{%     local row = ("%s + %d"):format(row0("mi"), rows.classes[c].drow) %}
      const int mq{{ c }} = {{ mrule.pos(row) }}, mh{{ c }} = {{ head(row) }};
{%     if mods.kvq_scale then %}
      // The expression's factor F of F * (kv - q), and F times the distance
      // at the lane's first column: an element's product is one FMA with
      // its column's constant (mods.lua's kvq_scale).
      const float mskv{{ c }} = fj_kvq_scale({{ mods.b }}, mh{{ c }}, {{ mods.hkv }}, p{{ mods.args and ", fj_ma" or "" }});
      const float mkvq{{ c }} = mskv{{ c }} * (float)({{ n0 }} + {{ c0 }} - mq{{ c }});
{%     elseif mods.kvq then %}
      // The distance kv - q at the lane's first column, as a float: an
      // element's adds its column's constant (mods.lua's kvq).
      const float mkvq{{ c }} = (float)({{ n0 }} + {{ c0 }} - mq{{ c }});
{%     end %}
{%   end %}
{%
  -- The statements of one part on every element of the slice; dg(i, c,
  -- key): a distance table's element for slot i of row class c.
  local function elements(part, dg)
%}
#pragma unroll
      for (int j = 0; j < {{ NJ }}; ++j) {
{%   for i = 0, acc.slots - 1 do %}
{%     local c = rows.class_of[i] %}
{%     local key = ("%s + %s + j * 16 + %d"):format(n0, c0, acc.dcol[i]) %}
{%     local used = mrule.used(("%s + %d"):format(row0("mi"), rows.classes[c].drow), key) %}
{%     local kvq = mods.kvq_scale and ("fmaf(mskv%d, (float)(j * 16 + %d), mkvq%d)"):format(c, acc.dcol[i], c)
                                   or ("mkvq%d + (float)(j * 16 + %d)"):format(c, acc.dcol[i]) %}
{%     if part == "score" and G and mods.grad then %}
        {{ mods.apply_grad(G("mi", "j", i), S("mi", "j", i), "mq" .. c, "mh" .. c, key, used, kvq, dg and dg(i, c, key)) }}
{%     end %}
        {{ mods["apply_" .. part](S("mi", "j", i), "mq" .. c, "mh" .. c, key, used, kvq, dg and dg(i, c, key)) }}
{%   end %}
      }
{%
  end
%}
{%   for _, part in ipairs({ "score", "mask" }) do %}
{%     if mods[part] then %}
{%       local guard = part == "mask" and mods.mask_guard %}
{%       if guard then %}
      // The mask expression on a partial block's tile only.
      if ({{ guard }}) {
{%       end %}
{%       if part == "score" and mods.dg then %}
{%         local lo, hi = math.huge, -math.huge %}
{%         for i = 0, acc.slots - 1 do %}
{%           for _, jj in ipairs({ 0, NJ - 1 }) do %}
{%             local off = -mods.dg.sign * (16 * jj + acc.dcol[i]) %}
{%             lo, hi = math.min(lo, off), math.max(hi, off) %}
{%           end %}
{%         end %}
      // The distance table (mods.lua's dg): a lane's element of key kv
      // lies {{ mods.dg.sign > 0 and "before" or "after" }} the row's pointer at its first column by
      // kv's column, a constant of the slot.  Where the tile's elements of
      // every lane of the warp lie within the table, they are read at those
      // constants; elsewhere through the accessor.
{%         local fast = {} %}
{%         for c = 1, NC do %}
      bool dgin{{ c }};
      {{ mods.dg_row("dgp" .. c, "dgin" .. c, "mh" .. c, ("mq%d - (%s + %s)"):format(c, n0, c0), lo, hi) }}
{%           fast[#fast + 1] = "dgin" .. c %}
{%         end %}
{%         local function at_row(i, c) return mods.dg_load("dgp" .. c, ("%s(j * 16 + %d)"):format(mods.dg.sign > 0 and "-" or "", acc.dcol[i])) end %}
{%         if mods.dg.inside then %}
      // Proved within the table on the host (fj_variant.table_inside).
      (void)({{ table.concat(fast, " && ") }});
      {
{%           elements(part, at_row) %}
      }
{%         else %}
      if (__all_sync(0xffffffffu, {{ table.concat(fast, " && ") }})) {
{%           elements(part, at_row) %}
      } else {
{%           elements(part, function(i, c, key) return mods.dg_read("mq" .. c, "mh" .. c, key) end) %}
      }
{%         end %}
{%       else %}
{%         elements(part) %}
{%       end %}
{%       if guard then %}
      }
{%       end %}
{%     end %}
{%   end %}
{% end %}
{% if mask ~= "none" then %}
      // Per row, the first column of this tile (counted from the lane's
      // first) that the row may not see: the sequence end, the diagonal or
      // the window's right side{{ mrule.window and "; and the first it may see (the window's left side)" or "" }}.
{%   for c = 1, NC do %}
{%     local row = ("%s + %d"):format(row0("mi"), rows.classes[c].drow) %}
      const int lim{{ c }} = {{ mrule.row_limit(row, n0, c0) }};
{%     if mrule.row_first(row, n0, c0) then %}
      const int first{{ c }} = {{ mrule.row_first(row, n0, c0) }};
{%     end %}
{%   end %}
      {{ mask == "branch" and "if (need_mask) " or "" }}{
#pragma unroll
        for (int j = 0; j < {{ NJ }}; ++j) {
{%   for i = 0, acc.slots - 1 do %}
{%     local col, c = ("j * 16 + %d"):format(acc.dcol[i]), rows.class_of[i] %}
          if ({{ col }} >= lim{{ c }}{{ mrule.window and (" || %s < first%d"):format(col, c) or "" }}) {{ S("mi", "j", i) }} = FJ_NEG_INF;
{%   end %}
        }
      }
{% end %}
