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
#}
{%
  local NC, L = #rows.classes, import("lut.lua")
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
    const float inv{{ c }} = l{{ c }} > 0.f ? {{ out_scale }} / l{{ c }} : 0.f;
{% end %}
#pragma unroll
    for (int d = 0; d < {{ ND }}; ++d) {
{% for _, pr in ipairs(L.pairs(acc, false)) do %}
{%   local s = pr[1] %}
      {
        const int row = {{ row0("mi") }} + {{ acc.drow[s] }}, col = d * 16 + {{ c0 }} + {{ acc.dcol[s] }};
        if ({{ out.valid("row") }}) {
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
    {{ out.lse_always and "" or "if (p.lse) " }}{
{% for c = 1, NC do %}
      {
        const int row = {{ row0("mi") }} + {{ rows.classes[c].drow }};
        if (lane == leader && {{ out.valid("row") }})
          {{ out.lse("row") }} =
              l{{ c }} > 0.f ? ({{ m("mi", c) }} * {{ sl2 }} + __log2f(l{{ c }})) * 0.69314718056f : FJ_NEG_INF;
      }
{% end %}
    }
  }
