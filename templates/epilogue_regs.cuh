{#
  epilogue_regs.cuh: the end of every family that keeps O in registers
  (mma, wgmma, wmma regs).  The per-lane row sums are reduced over the
  lanes that share each row; O = O * out_scale / l is written, two
  neighbouring columns per store where the table shows a pair; rows past
  seq_q are skipped.  One lane per row group (the lowest) writes the
  natural-log sum-exp, float32, [batch][heads_q][seq_q]: -inf for a row
  that saw no key (its O is 0).  Expressions in: O(mi, d, i) for MR row
  slices of ND tiles of 16 columns, m(mi, c) and l(mi, c) (raw running max
  and sum of row class c), row0(mi) and c0 (the lane's first slot), sl2,
  out_scale; the block is `blk` (block.cuh) and the output rows start at
  `o_out`; rows_end (default p.seq_q) is where the rows end (a varlen
  sequence's own length).  A family whose rows are not one head's positions (GQA packing)
  or that writes split-KV partials passes `out`, functions of a row
  expression: valid(r) (C bool), ptr(r) (the row's first element), lse(r)
  (the lvalue of its log-sum-exp), f32 (write float32, not elem_t) and
  lse_always (no `if (p.lse)`).
  stage (one head's rows, MR = 1; the family includes wgmma.cuh): O goes
  out through shared memory, a warp's 16 rows one panel of 64 columns at a
  time (out_elem: the output element's bytes, default 2).  stage.addr is the warp's pieces.lua STAGE_WARP bytes (shared
  space, 16-byte aligned), stage.lrow the lane's first row among the
  warp's 16 (row0(mi) is stage.row0 + stage.lrow).  Rows are STAGE_ROW
  (144) bytes apart: a row's four lanes fill 16 bytes, and eight rows fall
  on eight different sets of four banks, so the lanes' pair stores have no
  bank conflicts; each lane's addresses are one base plus constants.  Read
  back 16 bytes a lane, O is stored in whole 128-byte row segments, eight
  lanes a row, instead of 4-byte pairs over eight rows' lines per store
  (about four times the L1 wavefronts; the stores cost 20-27 us of a
  250-800 us wgmma kernel, docs/PERF.md).
  sinks (C: the family's head(r), the query head of a row): each row's
  sink p.sinks[head(row)] joins its denominator (fj_mods.sinks).  The sink
  is a natural-units logit; the row's max in base-2 units is b = m * sl2,
  so the sink's term is 2^(sink log2(e) - b) in the units of l.  Both are
  taken relative to M = max(b, sink log2(e)) so that nothing overflows:
    l' = l 2^(b - M) + 2^(sink log2(e) - M),  O = O 2^(b - M) / l',
    LSE = (M + log2(l')) ln(2).
  A row that saw no key (b = -inf, l = 0) gets O = 0 and LSE = the sink.
  Split-KV partials never pass it: the combine adds the sink once.
  cols (or nil: all 16 ND): the columns O has, a multiple of 8 below 16
  ND -- a family whose tiles pad the head dim stores only these.
  cols_split: the warps split a row's columns (c0 carries the warp's
  first), and cols counts the whole row's: each store is checked against
  it.
  p_shift (or nil): the main loop's P and row sums carry 2^p_shift
  (softmax_regs.cuh's shift): the row's base-2 max is m * sl2 - p_shift.
  amax (or nil): a C pointer expression (float *, may be NULL at run
  time): max |O| over the rows and columns stored, before post_scale, is
  raised there (an unsigned atomicMax of the float's bits: every value is
  at least 0, which the host wrote first).  post_scale (or nil): a C
  float expression each stored value is multiplied by after amax took it
  (FP8 attention's o_scale for an e4m3 O).
  ocols (or nil: the accumulator's own columns): O's columns permuted in
  registers (the mma family's FP8 V read from its ring: lut.lua's
  fp8_v_cols): slot s of a 16-column tile holds column c0 + ocols.dcol[s],
  and ocols.pairs lists the slots stored together (neighbours, the even
  column first); c0 is then the permuted base.  Not with stage or cols.
#}
{%
  local NC, L = #rows.classes, import("lut.lua")
  local PC = import("pieces.lua")
  local SR = PC.STAGE_ROW
  -- The staged element's bytes (the output's: 2 for f16 and bf16), the
  -- columns of one staged row (PC.ROW_BYTES of them) and the 16-column
  -- tiles in it.
  local OE = out_elem or 2
  -- A row's base-2 max as the sums count it.
  local function mbase(c)
    return ("%s * %s%s"):format(m("mi", c), sl2, p_shift and (" - %d.f"):format(p_shift) or "")
  end
  -- The staged stores of a pair and of one element, by their bits.
  local ST2, ST1 = 16 * OE, 8 * OE
  local UINT = { [8] = "unsigned char", [16] = "unsigned short", [32] = "unsigned" }
  local ROW_COLS = PC.ROW_BYTES // OE
  local TILES = ROW_COLS // 16
  -- The columns stored: 16-column tiles (ND_OUT, the last one partial
  -- where COLS is not a multiple of 16) and staged panels (PN_OUT).
  local COLS = cols or 16 * ND
  if COLS % 8 ~= 0 or (COLS > 16 * ND and not cols_split) then error("epilogue_regs.cuh: cols must be a multiple of 8 up to 16 ND") end
  if cols and stage and cols_split then error("epilogue_regs.cuh: cols_split is not for staged stores") end
  if ocols and (stage or cols) then error("epilogue_regs.cuh: ocols takes neither stage nor cols") end
  -- Each slot's column in a tile and the slots stored together.
  local DCOL = ocols and ocols.dcol or acc.dcol
  local PAIRS = ocols and ocols.pairs or L.pairs(acc, false)
  local ND_OUT = cols_split and ND or (COLS + 15) // 16
  -- Stores checked by column: a partial last tile, or the warps' columns
  -- past the row's (cols_split).
  local CHECK = COLS % 16 ~= 0 or (cols and cols_split)
  local PN_OUT = (COLS + ROW_COLS - 1) // ROW_COLS
  -- A family's own rows (packed, partials) find their first element by
  -- divisions: their stores go row by row (below).
  local BY_ROW = out ~= nil
  local out = out or {
    valid = function(r) return ("%s < %s"):format(r, rows_end or "p.seq_q") end,
    ptr = function(r) return ("o_out + (long long)%s * p.o_stride[2]"):format(r) end,
    lse = function(r) return ("p.lse[((long long)blk.b * p.heads_q + blk.h) * p.seq_q + %s]"):format(r) end,
  }
  -- What is stored: one element, a pair, and their conversions from float.
  local T = out.f32 and { one = "float", two = "float2", make1 = "", make2 = "make_float2" }
                     or { one = "elem_t", two = "fj::elem2_t", make1 = "fj::to_elem", make2 = "fj::to_elem2" }
%}
  // One lane per row group writes the log-sum-exp: the group's lowest.
  int leader = lane;
{% if amax then %}
  float o_max = 0.f;  // max |O| of this lane's stored elements
{% end %}
{% for _, x in ipairs(rows.offsets) do %}
  leader = min(leader, lane ^ {{ x }});
{% end %}
#pragma unroll
  for (int mi = 0; mi < {{ MR }}; ++mi) {
{% for c = 1, NC do %}
    float l{{ c }} = {{ l("mi", c) }};
{%   for _, x in ipairs(rows.masks) do %}
    l{{ c }} += __shfl_xor_sync(0xffffffffu, l{{ c }}, {{ x }});
{%   end %}
{%   if sinks then %}
    // The sink of this row's head, in base-2 units, against the row max
    // (-inf for a row that saw no key, known by its sum of 0: the
    // softcap's fixed shift gives such a row a finite max; a -inf sink
    // adds 0, +inf gives O = 0 and LSE +inf, a NaN sink NaN).
    const float sk{{ c }} = p.sinks[{{ head(("%s + %d"):format(row0("mi"), rows.classes[c].drow)) }}] * 1.44269504089f;
    const float mb{{ c }} = l{{ c }} > 0.f ? {{ mbase(c) }} : FJ_NEG_INF;
    const float mt{{ c }} = fmaxf(mb{{ c }}, sk{{ c }});
    const float mz{{ c }} = mt{{ c }} == FJ_NEG_INF ? 0.f : mt{{ c }};
    const float a{{ c }} = fj::fast_exp2(mb{{ c }} - mz{{ c }});
    l{{ c }} = l{{ c }} * a{{ c }} + (sk{{ c }} >= mb{{ c }} ? (sk{{ c }} == FJ_NEG_INF ? 0.f : 1.f) : fj::fast_exp2(sk{{ c }} - mz{{ c }}));
    {{ post_scale and "float" or "const float" }} inv{{ c }} = !(l{{ c }} <= 0.f) ? {{ out_scale }} * a{{ c }} / l{{ c }} : 0.f;
{%   else %}
    {{ post_scale and "float" or "const float" }} inv{{ c }} = l{{ c }} > 0.f ? {{ out_scale == "1.f" and ("fj::rcp_ftz(l%d)"):format(c) or ("%s / l%d"):format(out_scale, c) }} : 0.f;
{%   end %}
{% end %}
{% if amax then %}
    if ({{ amax }}) {
#pragma unroll
      for (int d = 0; d < {{ ND_OUT }}; ++d) {
{%   for s = 0, acc.slots - 1 do %}
        if ({{ out.valid(("%s + %d"):format(row0("mi"), acc.drow[s])) }}{{ CHECK and (" && d * 16 + %s + %d < %d"):format(c0, DCOL[s], COLS) or "" }})
          o_max = fmaxf(o_max, fabsf({{ O("mi", "d", s) }} * inv{{ rows.class_of[s] }}));
{%   end %}
      }
    }
{% end %}
{% if post_scale then %}
{%   for c = 1, NC do %}
    inv{{ c }} *= {{ post_scale }};
{%   end %}
{% end %}
{% if BY_ROW then %}
    // One branch per row and its first element once: the stores of a row
    // share them (a packed row's head and position are divisions, which
    // the compiler would repeat per store under separate conditions).
{% for c = 1, NC do %}
    {
      const int row = {{ row0("mi") }} + {{ rows.classes[c].drow }};
      if ({{ out.valid("row") }}) {
        {{ T.one }} *const out = {{ out.ptr("row") }} + {{ c0 }};
#pragma unroll
        for (int d = 0; d < {{ ND_OUT }}; ++d) {
{%   for _, pr in ipairs(PAIRS) do %}
{%     local s = pr[1] %}
{%     if rows.class_of[s] == c then %}
{%       if CHECK then %}
          if (d * 16 + {{ c0 }} + {{ DCOL[s] }} < {{ COLS }})
{%       end %}
{%       if #pr == 2 then %}
          *reinterpret_cast<{{ T.two }} *>(out + d * 16 + {{ DCOL[s] }}) =
              {{ T.make2 }}({{ O("mi", "d", s) }} * inv{{ c }}, {{ O("mi", "d", pr[2]) }} * inv{{ c }});
{%       else %}
          out[d * 16 + {{ DCOL[s] }}] = {{ T.make1 }}({{ O("mi", "d", s) }} * inv{{ c }});
{%       end %}
{%     end %}
{%   end %}
        }
      }
    }
{% end %}
{% elseif stage then %}
{%   if MR ~= 1 then error("epilogue_regs.cuh: stage takes one row slice (MR = 1)") end %}
    // Through shared memory, a panel of 64 columns at a time (see the top).
    {
      const unsigned st_lane = {{ stage.addr }} + {{ stage.lrow }} * {{ SR }}u + {{ c0 }} * {{ OE }}u;
      const unsigned ld_lane = {{ stage.addr }} + (lane / 8) * {{ SR }}u + (lane % 8) * 16u;
#pragma unroll
      for (int pn = 0; pn < {{ PN_OUT }}; ++pn) {
#pragma unroll
        for (int dd = 0; dd < {{ TILES }}; ++dd) {
          const int d = pn * {{ TILES }} + dd;
{% for _, pr in ipairs(L.pairs(acc, false)) do %}
{%   local s = pr[1] %}
          {
            const unsigned at = st_lane + dd * {{ 16 * OE }}u + {{ acc.drow[s] * SR + acc.dcol[s] * OE }}u;
{%   if #pr == 2 then %}
            const fj::elem2_t e = fj::to_elem2({{ O("mi", "d", s) }} * inv{{ rows.class_of[s] }},
                                               {{ O("mi", "d", pr[2]) }} * inv{{ rows.class_of[s] }});
            fj::st_shared_b{{ ST2 }}(at, *reinterpret_cast<const {{ UINT[ST2] }} *>(&e));
{%   else %}
            const elem_t e = fj::to_elem({{ O("mi", "d", s) }} * inv{{ rows.class_of[s] }});
            fj::st_shared_b{{ ST1 }}(at, *reinterpret_cast<const {{ UINT[ST1] }} *>(&e));
{%   end %}
          }
{% end %}
        }
        __syncwarp();
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int row = {{ stage.row0 }} + i * 4 + lane / 8;
          const uint4 v = fj::ld_shared_v4(ld_lane + i * {{ 4 * SR }}u);
{% if COLS % ROW_COLS ~= 0 then %}
          if (pn * {{ ROW_COLS }} + (lane % 8) * {{ 16 // OE }} >= {{ COLS }}) continue;  // the pad
{% end %}
          if ({{ out.valid("row") }})
            *reinterpret_cast<uint4 *>({{ out.ptr("row") }} + pn * {{ ROW_COLS }} + (lane % 8) * {{ 16 // OE }}) = v;
        }
        __syncwarp();  // read before the next panel is written
      }
    }
{% else %}
    // Store by store (one head's rows: no division to share; grouped by
    // row, the mma family at 255 registers spilled).
#pragma unroll
    for (int d = 0; d < {{ ND_OUT }}; ++d) {
{% for _, pr in ipairs(PAIRS) do %}
{%   local s = pr[1] %}
      {
        const int row = {{ row0("mi") }} + {{ acc.drow[s] }}, col = d * 16 + {{ c0 }} + {{ DCOL[s] }};
        if ({{ out.valid("row") }}{{ CHECK and (" && col < %d"):format(COLS) or "" }}) {
          {{ T.one }} *dst = {{ out.ptr("row") }} + col;
{%   if #pr == 2 then %}
          *reinterpret_cast<{{ T.two }} *>(dst) = {{ T.make2 }}({{ O("mi", "d", s) }} * inv{{ rows.class_of[s] }},
                                                               {{ O("mi", "d", pr[2]) }} * inv{{ rows.class_of[s] }});
{%   else %}
          *dst = {{ T.make1 }}({{ O("mi", "d", s) }} * inv{{ rows.class_of[s] }});
{%   end %}
        }
      }
{% end %}
    }
{% end %}
    {{ out.lse_always and "" or "if (p.lse) " }}{
{% for c = 1, NC do %}
      {
        const int row = {{ row0("mi") }} + {{ rows.classes[c].drow }};
        if (lane == leader && {{ out.valid("row") }})
{%   if sinks then %}
          {{ out.lse("row") }} = !(l{{ c }} <= 0.f) ? (mz{{ c }} + __log2f(l{{ c }})) * 0.69314718056f : FJ_NEG_INF;
{%   else %}
          {{ out.lse("row") }} =
              l{{ c }} > 0.f ? ({{ mbase(c) }} + __log2f(l{{ c }})) * 0.69314718056f : FJ_NEG_INF;
{%   end %}
      }
{% end %}
    }
  }
{% if amax then %}
  // The warp's max |O|, raised into *amax by one lane.
  if ({{ amax }}) {
#pragma unroll
    for (int x = 16; x > 0; x >>= 1) o_max = fmaxf(o_max, __shfl_xor_sync(0xffffffffu, o_max, x));
    if (lane == 0) atomicMax(reinterpret_cast<unsigned *>({{ amax }}), __float_as_uint(o_max));
  }
{% end %}
