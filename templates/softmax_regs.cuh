{#
  softmax_regs.cuh: one step of the online softmax on accumulator registers,
  shared by every family that keeps S in registers (mma, wgmma, wmma regs).
  For each of MR row slices of 16 rows and NJ tiles of 16 columns:
    score    score_step, the slice's score step (score_regs.cuh, rendered
             by the family for slice "mi": pieces.lua's softmax_step), which
             leaves each element its modified score or -inf;
    max      the raw row max as a balanced tree over the lane's slots, then
             the XOR shuffles of the lanes that share the row (rows.masks);
    exp      p = 2^(s * sl2 - max * sl2): one FMA and one ex2 per element;
             a row that has seen only hidden keys keeps max -inf, and then
             subtracts 0 so that exp2 gives 0, never NaN; a row whose max
             has magnitude 2^12 or more (1e30 from a score expression) has
             its scores less the max first (one vote a slice and tile, the
             subtraction only where some row of the warp needs it): the
             rounding of max * sl2 would otherwise be P's exponent at the
             max (gpu_mods_int_ops' "score: shifts by 32, 40"); only where
             a score expression can make such scores (mods.score: its
             registers cost the mma family's widest picks spills
             elsewhere);
    sum      per-lane partial row sums (the lanes are reduced once, in the
             epilogue), as a tree per 16 columns;
    pack     optional: P of tile j as A-operand registers while it is hot,
             register r = pack.P(mi, j, r) holding the two 16-bit elements of
             A slots 2r and 2r + 1, which are accumulator slots
             pack.from[2r] and pack.from[2r + 1] of the same lane (the
             probed tables say so: lut.lua's a_from_acc);
    shift    p_shift (or nil): P = 2^(s * sl2 - max * sl2 + p_shift), so that
             P reaches 2^p_shift (FP8's P keeps e4m3's normal range); the
             row sums carry the same factor (the epilogue's p_shift);
    rescale  O *= 2^(old max - new max), or (rescale = nil) the factors left
             in `alpha(mi, c)` for a caller that must wait before touching O,
             and (rescaled = a bool's name) whether it must rescale at all.
    exchange optional code that replaces each row class c's max of this
             warp's scores, mx<c> (after the lanes' shuffles), by the
             max over the warps that share the rows (the mma family's
             CS, whose warps each see a share of the keys); every warp
             must run it (it may synchronise the block).
             With lazy = k, a warp keeps its rows' max (alpha 1, no rescale)
             until one grows by more than 2^k, so P may reach 2^k.
  With a softcap on bfloat16 P (mods.bounded), where the host's fixed shift
  holds (mods.fixed_on), max and rescale give way to that shift; such a
  kernel rounds P to bfloat16 before the sum (packing first where it packs),
  so that the row sum is the sum of the P that P.V multiplies: one visible
  key gives V exactly.
  Which slot holds which (row, column), and which lanes share a row, come
  from the probed accumulator table (acc, rows: lut.lua), never from an
  assumed layout.  Expressions in: S(mi, j, i), m(mi, c), l(mi, c),
  row0(mi) (the absolute row of the lane's first slot in slice mi), c0 (its
  column in a tile), n0 (the tile's first key), sl2.
#}
{%
  local NC = #rows.classes
  local function tree(op, terms)
    while #terms > 1 do
      local nxt = {}
      for i = 1, #terms, 2 do
        if terms[i + 1] == nil then nxt[#nxt + 1] = terms[i]
        elseif op == "add" then nxt[#nxt + 1] = ("(%s + %s)"):format(terms[i], terms[i + 1])
        else nxt[#nxt + 1] = ("%s(%s, %s)"):format(op, terms[i], terms[i + 1]) end
      end
      terms = nxt
    end
    return terms[1]
  end
  -- The slots of row class c over every tile, or over tile j only.
  local function class_terms(c, j)
    local js, terms = { j }, {}
    if not j then
      for jj = 0, NJ - 1 do js[#js + 1] = tostring(jj) end
    end
    for _, jj in ipairs(js) do
      for _, i in ipairs(rows.classes[c].slots) do
        terms[#terms + 1] = S("mi", jj, i)
      end
    end
    return terms
  end
  local depth = 0
  while (1 << depth) < NJ * #rows.classes[1].slots do depth = depth + 1 end
  local fixed = mods and mods.bounded
  -- Lazy rescale (the family's `lazy`, or nil): how far in base-2 units
  -- a row's max may grow before the row takes the new max and O its
  -- rescale.
  local LAZY = lazy
  -- Rows whose max may be huge and finite: a score expression's.
  local big = mods and mods.score
%}
#pragma unroll
    for (int mi = 0; mi < {{ MR }}; ++mi) {
{% if score_step then %}
{{ score_step }}
{% end %}
{% for c = 1, NC do %}
      float mu{{ c }}{{ rescale and ", alpha" .. c or "" }};
{% end %}
      bool rs = true;  // O needs the rescale
{% if fixed then %}
      // Bounded scores (mods.lua's bounded): where the host gave a fixed
      // shift, the exponentials take it as the row max (scores exceed it by
      // at most a bound the host chose: src/mods.c), so there is no max to
      // reduce and O is never rescaled.
      if ({{ mods.fixed_on }}) {
{%   for c = 1, NC do %}
        {{ m("mi", c) }} = {{ mods.fixed_m }};
        mu{{ c }} = {{ m("mi", c) }} * {{ sl2 }};
        {{ rescale and "alpha" .. c or alpha("mi", c) }} = 1.f;
{%   end %}
        rs = false;
      } else {
{% end %}
      // The row max as a balanced tree (depth {{ depth }}), then across the lanes
      // that share the row (XOR {{ table.concat(rows.masks, ", ") }}).
{% for c = 1, NC do %}
      float mx{{ c }} = {{ tree("fmaxf", class_terms(c)) }};
{% end %}
{% for c = 1, NC do %}
{%   for _, x in ipairs(rows.masks) do %}
      mx{{ c }} = fmaxf(mx{{ c }}, __shfl_xor_sync(0xffffffffu, mx{{ c }}, {{ x }}));
{%   end %}
{%   if not exchange then %}
      const float mn{{ c }} = fmaxf({{ m("mi", c) }}, mx{{ c }});
{%   end %}
{% end %}
{% if exchange then %}
{{ exchange }}
{%   for c = 1, NC do %}
      const float mn{{ c }} = fmaxf({{ m("mi", c) }}, mx{{ c }});
{%   end %}
{% end %}
{% if LAZY then %}
      // Lazy rescale: unless the max of some row of this warp grew by more
      // than 2^{{ LAZY }} (in base-2 units), the rows keep their old max and O its
      // scale; P then reaches at most 2^{{ LAZY }}, which every 16-bit type holds.
      // (A row that saw only hidden keys has -inf - -inf = NaN: no growth.)
      rs = __any_sync(0xffffffffu, {% for c = 1, NC do %}mn{{ c }} * {{ sl2 }} - {{ m("mi", c) }} * {{ sl2 }} > {{ LAZY }}.f || {% end %}false);
{% end %}
{% for c = 1, NC do %}
      const float mk{{ c }} = {{ LAZY and "rs ? mn" .. c .. " : " .. m("mi", c) or "mn" .. c }};
      // A row that has seen only hidden keys keeps max -inf; subtracting 0
      // instead keeps exp2 at 0 rather than NaN.
      mu{{ c }} = mk{{ c }} == FJ_NEG_INF ? 0.f : mk{{ c }} * {{ sl2 }};
{%   if big then %}
      // O's factor 2^ea{{ c }}, from the old max to the new{{ LAZY and " (1 where the warp keeps its maxes)" or "" }}.
      float ea{{ c }} = {{ LAZY and "!rs ? 0.f : " or "" }}fmaf({{ m("mi", c) }}, {{ sl2 }}, -mu{{ c }});
{%   else %}
      {{ rescale and "alpha" .. c or alpha("mi", c) }} = fj::fast_exp2({{ m("mi", c) }} * {{ sl2 }} - mu{{ c }});
      {{ m("mi", c) }} = mk{{ c }};
{%   end %}
{% end %}
{% if big then %}
      // A max of magnitude 2^12 or more (a score expression's s - 1e30f,
      // say): mu is max * sl2 rounded, and P at the max, 2^(max * sl2 - mu),
      // would be 2 to that rounding error, about 2^72 at 1e30 (P inf or 0,
      // the row NaN or 0; below 2^12 the error is under 2^-12 and cancels
      // in O / l).  Such rows (rare: one vote a slice and tile) take their
      // scores less the max and mu = 0, so P is 2^0 = 1 at the max, as in
      // the reference, and O's factor loses the same error: (old max - max)
      // * sl2 exactly, 0 where the max is kept.
      if (__any_sync(0xffffffffu, {% for c = 1, NC do %}fj::big_max(mk{{ c }}) || {% end %}false)) {
{% for c = 1, NC do %}
        const float off{{ c }} = fj::big_max(mk{{ c }}) ? mk{{ c }} : 0.f;
        if (off{{ c }} != 0.f) {
          {{ LAZY and "if (rs) " or "" }}ea{{ c }} -= fmaf(mk{{ c }}, {{ sl2 }}, -mu{{ c }});
          mu{{ c }} = 0.f;
        }
{% end %}
#pragma unroll
        for (int j = 0; j < {{ NJ }}; ++j) {
{% for i = 0, acc.slots - 1 do %}
          {{ S("mi", "j", i) }} -= off{{ rows.class_of[i] }};
{% end %}
        }
      }
{% end %}
{% for c = 1, big and NC or 0 do %}
      {{ rescale and "alpha" .. c or alpha("mi", c) }} = fj::fast_exp2(ea{{ c }});
      {{ m("mi", c) }} = mk{{ c }};
{% end %}
{% if fixed then %}
      }
{% end %}
{% if p_shift then %}
{%   for c = 1, NC do %}
      mu{{ c }} -= {{ p_shift }}.f;  // P up to 2^{{ p_shift }}
{%   end %}
{% end %}
{% if rescaled then %}
      {{ rescaled }} = rs;
{% end %}
{% for c = 1, NC do %}
      float sum{{ c }} = 0.f;
{% end %}
#pragma unroll
      for (int j = 0; j < {{ NJ }}; ++j) {
{% for i = 0, acc.slots - 1 do %}
        {{ S("mi", "j", i) }} = fj::fast_exp2(fmaf({{ S("mi", "j", i) }}, {{ sl2 }}, -mu{{ rows.class_of[i] }}));
{% end %}
{% if fixed then %}
        // Bounded scores: against the fixed shift P is no longer 1 at the
        // row's max, so its rounding to bfloat16 in P.V would not cancel
        // against a row sum of the float values (a row of one key would
        // return V times P's rounding error).  The sum takes P as P.V
        // will: rounded to bfloat16{{ pack and ", read back from the packed registers" or "" }}.
{%   if pack then %}
{%     for r = 0, 3 do %}
        {{ pack.P("mi", "j", r) }} = fj::pack2({{ S("mi", "j", pack.from[2 * r]) }}, {{ S("mi", "j", pack.from[2 * r + 1]) }});
        {{ S("mi", "j", pack.from[2 * r]) }} = __uint_as_float({{ pack.P("mi", "j", r) }} << 16);
        {{ S("mi", "j", pack.from[2 * r + 1]) }} = __uint_as_float({{ pack.P("mi", "j", r) }} & 0xffff0000u);
{%     end %}
{%   else %}
{%     for i = 0, acc.slots - 1 do %}
        {{ S("mi", "j", i) }} = __bfloat162float(__float2bfloat16_rn({{ S("mi", "j", i) }}));
{%     end %}
{%   end %}
{% end %}
{% for c = 1, NC do %}
        sum{{ c }} += {{ tree("add", class_terms(c, "j")) }};
{% end %}
{% if pack and not fixed then %}
        // P as the A operand at once (half the registers of S): A slot s
        // is accumulator slot{% for x = 0, 7 do if pack.from[x] then %} {{ x }}<-{{ pack.from[x] }}{% end end %}.
{%   for r = 0, 3 do %}
        {{ pack.P("mi", "j", r) }} = fj::pack2({{ S("mi", "j", pack.from[2 * r]) }}, {{ S("mi", "j", pack.from[2 * r + 1]) }});
{%   end %}
{% end %}
      }
{% for c = 1, NC do %}
      {{ l("mi", c) }} = {{ l("mi", c) }} * {{ rescale and "alpha" .. c or alpha("mi", c) }} + sum{{ c }};
{% end %}
{% if rescale then %}
      if (rs)
#pragma unroll
      for (int d = 0; d < {{ rescale.ND }}; ++d) {
{%   for i = 0, acc.slots - 1 do %}
        {{ rescale.O("mi", "d", i) }} *= alpha{{ rows.class_of[i] }};
{%   end %}
      }
{% end %}
    }
