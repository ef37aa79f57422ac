{#
  mainloop_fwd.cuh: the forward's main loop on wgmma (sm_90a), both sides:
  what the producer loads for one work tile, and what a consumer
  warpgroup computes from it -- S = Q K^T, the score step and the online
  softmax (pieces.lua's softmax_step), O += P V -- with the overlap and the
  ping-pong.  A backward main loop is its sibling: it reads the same
  pieces (tma_ring.lua's rings, scheduler.cuh's heads, the score step).

  Contract.
    producer_tile   one thread's loads of a work tile: Q into ring q (its
                    one slot, after `q.wait_empty` unless the walk waited:
                    q_waited), then K and V of each key tile into rings k
                    and v, tile `it` (counted over the block's life) in
                    slot it % S.  Reads blk, m0, ntiles and the key range
                    (scheduler.cuh's head), q_row, q_b, kv_row, kv_b.
    consumer_setup  a consumer warpgroup's registers: o[DV/16][8], s[BN/16][8],
                    pk[BN/16][4] (P as the A operand), row_m and row_l per
                    row class, and it (the K/V tiles consumed); its scales,
                    the descriptors and the ping-pong turns (named barriers
                    1..C, 256 threads each, where pingpong).
    consumer_tile   one work tile: O and the row statistics cleared, Q
                    waited for (parity kq & 1), S(t) issued before
                    O += P(t - 1) V(t - 1) so the softmax of tile t runs
                    while the tensor cores finish t - 1; each ring slot
                    released by every consumer warp once its product has
                    landed, Q's once the last S has; it advanced by ntiles.
                    Leaves O unnormalised and row_m/row_l for the epilogue.
    consumer_end    after the walk: the setup's macros end.
  Registers per consumer thread: about DV/2 + BN/2 + BN/4 (O, S, P);
  shared memory: the rings'; barriers: the rings' and the turns.
  Parameters: q, k, v (rings), D (the tiles' head dim), DR (the
  problem's, at most D: S takes its k steps), DV (V's and O's tiles'
  head dim: ring v's columns, O's and P V's N), BN, S, C, T (the element type's name in
  wgmma.cuh's forms), KSTEP (elements of one wgmma k step), pingpong,
  frag (pieces.lua's regs), mods, mrule, BMASK, N0, acc, rows, p_from,
  user_expr (a user's score or mask expression: the descriptors' and
  the P V wait's forms that cost no registers; else O += P V is waited
  for where ptxas keeps it, after the softmax's exponentials: wgmma.cuh's
  wg_wait0_split, where a plain wait is hoisted above them).
  FP8 (dtype e4m3): ring v holds V^T (DV rows of BN keys in whole
  128-key boxes, K-major like K);
  P (up to 2^frag.p_shift) goes into the A operand as e4m3 (p_from:
  lut.lua's p8_from_acc, { group, slot } per A slot); each work tile sets
  sl2_t (the softmax scale with Q's and K's descales); the epilogue's
  out_scale is V's descale (read there: no register held through the
  loop).  TWO: O += P V lands in a second
  accumulator op, added into o every FLUSH key tiles and at the end
  (FP8's tensor cores keep about 22 bits when they add).
#}
{%
  local PC = import("pieces.lua")
  local NC = #rows.classes
  -- wgmma k steps of S (those that hold the problem's DR columns: a
  -- padded head dim's last panel is part zeros) and of P V.
  local NK_QK, NK_PV = (DR + KSTEP - 1) // KSTEP, BN // KSTEP
  local KB = KSTEP * q.elem                      -- bytes of one k step along a row
  local PER_PANEL = q.panel_cols // KSTEP        -- k steps in a 128-byte panel
  -- Descriptors: Q's 64 rows of this warpgroup and K (both K-major, k
  -- steps KB bytes apart within a panel), V (MN-major: panels apart by the
  -- leading offset, a k step KSTEP rows of 128 bytes on) of a ring slot.
  -- Each as its base's descriptor plus the k step's (and slot's) byte
  -- offset (wgmma.cuh's wg_desc_at: one add), so that a product's base is
  -- made once and each k step's descriptor by one uniform add (wg_desc_at_lo), not
  -- wg_desc's masks and shifts anew.
  -- A user's expression (user_expr) keeps wg_desc's whole form per k step
  -- and a per-lane warpgroup index: the uniform registers' form costs its
  -- registers 12-48 spilled bytes at head dim 128 (tests/test_mods.c).
  local function desc(base, lead, off)
    if user_expr then return ("fj::wg_desc(%s + %s, %d, 1024)"):format(base, off, lead) end
    return ("fj::wg_desc_at_lo(fj::wg_desc(%s, %d, 1024), %s)"):format(base, lead, off)
  end
  -- K-major (Q, K, FP8's V^T): k step kk's bytes into slot `slot` (nil: Q's).
  local function kmajor(r, slot, kk)
    local at = ("((%s) / %d) * %d + ((%s) %% %d) * %d"):format(kk, PER_PANEL, r.panel_bytes, kk, PER_PANEL, KB)
    return slot and ("(%s) * %d + %s"):format(slot, r.slot_bytes, at) or at
  end
  local function qdesc(kk) return desc("qa", 16, kmajor(q, nil, kk)) end
  local function kdesc(slot, kk) return desc("sk", 16, kmajor(k, slot, kk)) end
  local function vdesc(slot, kk)
    if FP8 then return desc("sv", 16, kmajor(v, slot, kk)) end  -- V^T: K-major, as K
    return desc("sv", v.panel_bytes, ("(%s) * %d + (%s) * %d"):format(slot, v.slot_bytes, kk, KSTEP * v.panel_bytes // v.rows))
  end
  -- O += P V's accumulator: o, or FP8's second one.
  local OP = TWO and "op" or "o"
  local function turn(what)
    if not pingpong then return "" end
    return what == "take" and "fj::bar_sync(1 + cw, 256);" or ("fj::bar_arrive(1 + (cw + 1) %% %d, 256);"):format(C)
  end
%}
{% if part == "producer_tile" then %}
{%   if not q_waited then %}
        // Q's buffer is free once every consumer warp has finished its last
        // S of the previous work tile (at once for the first).
        {{ q.wait_empty(0, "(kq & 1u) ^ 1u") }}
{%   end %}
        {{ PC.indent(q.fill(0, function(pn) return ("%s * %d, q_row, blk.h, q_b"):format(pn, q.panel_cols) end), 8) }}
        for (int t = 0; t < ntiles; ++t, ++it) {
          const unsigned slot = it % {{ S }}u, ph = (it / {{ S }}u) & 1u;
          // A slot is free once every consumer warp has released it; in the
          // first round the "preceding phase" test passes at once.
{%   for _, r in ipairs({ k, v }) do %}
          {{ r.wait_empty("slot", "ph ^ 1u") }}
{%     if FP8 and r == v then %}
          {{ PC.indent(r.fill("slot", function(pn) return ("%s * %d + %s, 0, blk.hk, kv_b"):format(pn, r.panel_cols, N0("t")) end), 10) }}
{%     else %}
          {{ PC.indent(r.fill("slot", function(pn) return ("%s * %d, kv_row + %s, blk.hk, kv_b"):format(pn, r.panel_cols, N0("t")) end), 10) }}
{%     end %}
{%   end %}
        }
{% elseif part == "consumer_setup" then %}
  // This consumer warpgroup, read from lane 0 so that the compiler knows
  // it is the same in every lane: its descriptors live in uniform registers.
{% if user_expr then %}
  const int cw = wg - 1;
{% else %}
  const int cw = __shfl_sync(0xffffffffu, wg - 1, 0);
{% end %}
  const int wr = cw * 64 + (warp % 4) * 16;    // this warp's first row in the tile
  const int acc_r = fj_base_acc[lane] & 15, acc_c = fj_base_acc[lane] >> 4;
  {{ mods.scales(2, "", FP8 and "qk_scale0" or nil) }}
  const unsigned qa = sq + cw * 64 * {{ q.panel_bytes // q.rows }};
  // Descriptors: Q's 64 rows of this warpgroup and K (both K-major, k
  // steps {{ KB }} bytes apart within a panel), V (MN-major, panels {{ v.panel_bytes }}
  // bytes apart) of a ring slot.
#define FJ_Q_DESC(kk) {{ qdesc("kk") }}
#define FJ_K_DESC(slot, kk) {{ kdesc("slot", "kk") }}
#define FJ_V_DESC(slot, kk) {{ vdesc("slot", "kk") }}
{%   if pingpong then %}
  // Ping-pong: the consumer warpgroups take turns to issue their products
  // (named barrier 1 + w is warpgroup w's turn), so one's softmax runs
  // while another's products occupy the tensor cores.  Warpgroup 0 starts.
  if (cw == {{ C - 1 }}) fj::bar_arrive(1, {{ 256 }});
{%   end %}

  float o[{{ DV // 16 }}][8];
{%   if TWO then %}
  float op[{{ DV // 16 }}][8];  // O += P V lands here; added into o every {{ FLUSH }} key tiles
{%   end %}
  float s[{{ BN // 16 }}][8];
  unsigned pk[{{ NK_PV }}][4];
  float row_m[1][{{ NC }}], row_l[1][{{ NC }}];
  unsigned it = 0;
{% elseif part == "consumer_tile" then %}
{%
  -- S = Q K(slot)^T, issued (not waited for).
  local function qk(slot)
%}
    fj::wg_fence();
#pragma unroll
    for (int kk = 0; kk < {{ NK_QK }}; ++kk) fj::wg_ss_{{ T }}_{{ BN }}(s, FJ_Q_DESC(kk), FJ_K_DESC({{ slot }}, kk), kk);
    fj::wg_commit();
{%
  end
  -- O += P V(slot), issued.
  local function pv(slot)
%}
    fj::wg_fence();
{%   if FP8 then %}
#pragma unroll
    for (int kk = 0; kk < {{ NK_PV }}; ++kk) fj::wg_rs_{{ T }}_{{ DV }}({{ OP }}, pk[kk], FJ_V_DESC({{ slot }}, kk), {{ TWO and "kk > 0 || pv_run > 0" or "1" }});
{%   else %}
#pragma unroll
    for (int kk = 0; kk < {{ NK_PV }}; ++kk) fj::wg_rs_{{ T }}_{{ DV }}_t(o, pk[kk], FJ_V_DESC({{ slot }}, kk), 1);
{%   end %}
    fj::wg_commit();
{%
  end
  -- Compiler fences on registers a wgmma owns (wgmma.cuh's wg_hold).
  local function hold(name, n)
%}
#pragma unroll
    for (int j = 0; j < {{ n }}; ++j)
#pragma unroll
      for (int i = 0; i < 8; ++i) fj::wg_hold({{ name }}[j][i]);
{%
  end
  -- The score step and online softmax of S for key tile t (at n0);
  -- rescale: O now, or (false) the factors kept in alpha for after the
  -- pending P V.
  local function softmax(t, rescale)
%}
{%   if BMASK then %}
    const bool bm_part = fj::list_partial(bl, {{ t }});  // the mask expression applies
    (void)bm_part;
{%   end %}
    const bool need_mask = {{ mrule.tile_partial("n0", BN, "m0 + cw * 64", "m0 + cw * 64 + 63") }};
{{ PC.softmax_step(PC.with(frag, {
     NJ = BN // 16, mask = "branch",
     S = function(mi, j, i) return ("s[%s][%d]"):format(j, i) end,
     alpha = function(mi, c) return ("alpha[%d]"):format(c - 1) end, rescaled = not rescale and "resc" or nil,
     rescale = rescale and { ND = DV // 16, O = function(mi, d, i) return ("o[%s][%d]"):format(d, i) end } or nil })) }}
{%
  end
  -- P as A-operand registers: register r of k-step j holds A slots 2r and
  -- 2r + 1, which are accumulator slots p_from[2r] and p_from[2r + 1] of
  -- S's tile j (lut.lua).
  local function pack()
%}
{%   if FP8 then %}
    // P (up to 256: frag.p_shift) as FP8 A operands: k step j is S's 16-column groups 2j
    // and 2j + 1; A slot 4r + b (byte b of register r) takes group g slot i
    // as p8_from_acc pairs them (V^T's keys follow: the _vt kernel).
#pragma unroll
    for (int j = 0; j < {{ NK_PV }}; ++j) {
{%     for r = 0, 3 do %}
{%       local f = function(b) local e = p_from[4 * r + b]; return ("s[2 * j + %d][%d]"):format(e[1], e[2]) end %}
      pk[j][{{ r }}] = fj::pack4_e4m3({{ f(0) }}, {{ f(1) }}, {{ f(2) }}, {{ f(3) }});
{%     end %}
    }
{%   else %}
#pragma unroll
    for (int j = 0; j < {{ NK_PV }}; ++j) {
{%     for r = 0, 3 do %}
      pk[j][{{ r }}] = fj::pack2(s[j][{{ p_from[2 * r] }}], s[j][{{ p_from[2 * r + 1] }}]);
{%     end %}
    }
{%   end %}
{%
  end
  -- FP8's two accumulators: after O += P V has landed, op joins o every
  -- FLUSH tiles (at once when last), and the next product starts op anew.
  local function flush(last)
    if not TWO then return end
%}
    if ({{ last and "true" or ("++pv_run == %d"):format(FLUSH) }}) {
#pragma unroll
      for (int d = 0; d < {{ DV // 16 }}; ++d)
#pragma unroll
        for (int i = 0; i < 8; ++i) o[d][i] += op[d][i];
      pv_run = 0;
    }
{% end %}
#pragma unroll
  for (int d = 0; d < {{ DV // 16 }}; ++d)
#pragma unroll
    for (int i = 0; i < 8; ++i) o[d][i] = 0.f;
#pragma unroll
  for (int c = 0; c < {{ NC }}; ++c) { row_m[0][c] = FJ_NEG_INF; row_l[0][c] = 0.f; }
{% if FP8 then %}
  // The descales of this (batch, KV head): Q's and K's join the softmax
  // scale, V's the epilogue's.
{%   if mods.score then %}
  // A score function (or the softcap) sees the scaled score: the
  // descales join its input's scale, and the softmax takes its results in
  // natural units (sl2).
  const float qk_scale = qk_scale0 * p.q_scale[fj::scale_at(p, blk.b, blk.hk)] * p.k_scale[fj::scale_at(p, blk.b, blk.hk)];
  const float sl2_t = sl2;
{%   else %}
  const float sl2_t = sl2 * p.q_scale[fj::scale_at(p, blk.b, blk.hk)] * p.k_scale[fj::scale_at(p, blk.b, blk.hk)];
{%   end %}
{% end %}
{% if TWO then %}
  int pv_run = 0;  // key tiles in op since it last joined o
{% end %}

  {{ q.wait_full(0, "kq & 1u") }}
  if (ntiles == 0) {
    {{ PC.indent(q.release(0), 4) }}
  } else {
    // Tile 0: S, the softmax, P.
    const int n0 = {{ N0("0") }};
    const unsigned slot = it % {{ S }}u;
    {{ k.wait_full("slot", ("(it / %du) & 1u"):format(S)) }}
    {{ turn("take") }}
{% qk("slot") %}
    {{ turn("pass") }}
    fj::wg_wait<0>();
{% hold("s", BN // 16) %}
    {{ PC.indent(k.release("slot"), 4) }}
    if (ntiles == 1) {
      {{ PC.indent(q.release(0), 6) }}
    }
{% softmax("0", true) %}
{% pack() %}
  }
  for (int t = 1; t < ntiles; ++t) {
    const int n0 = {{ N0("t") }};
    const unsigned cur = it + t, prev = cur - 1;
    const unsigned slot = cur % {{ S }}u, pslot = prev % {{ S }}u;
    // S(t) and O += P(t - 1) V(t - 1) in flight together; the softmax of
    // S(t) runs while the second finishes.
    {{ k.wait_full("slot", ("(cur / %du) & 1u"):format(S)) }}
    {{ turn("take") }}
{% qk("slot") %}
    {{ v.wait_full("pslot", ("(prev / %du) & 1u"):format(S)) }}
{% pv("pslot") %}
    {{ turn("pass") }}
    fj::wg_wait<1>();
{% hold("s", BN // 16) %}
    {{ PC.indent(k.release("slot"), 4) }}
    if (t == ntiles - 1) {
      {{ PC.indent(q.release(0), 6) }}
    }
    float alpha[{{ NC }}];
    bool resc;
{% softmax("t", false) %}
{% if not user_expr then %}
    // O += P(t - 1) V(t - 1) waited for after the softmax, not before its
    // exponentials (wgmma.cuh's wg_wait0_split).
    fj::wg_wait0_split((unsigned)t);
{% else %}
    fj::wg_wait<0>();
{% end %}
{% hold(OP, DV // 16) %}
    {{ PC.indent(v.release("pslot"), 4) }}
{% flush(false) %}
    // Not under the softcap's fixed shift (softmax_regs.cuh's `rescaled`).
    if (resc)
#pragma unroll
    for (int d = 0; d < {{ DV // 16 }}; ++d) {
{% for i = 0, acc.slots - 1 do %}
      o[d][{{ i }}] *= alpha[{{ rows.class_of[i] - 1 }}];
{% end %}
    }
{% if TWO and FLUSH > 1 then %}
    // The partial, where it holds tiles not yet added (after a flush it is
    // rewritten whole).
    if (resc && pv_run != 0)
#pragma unroll
    for (int d = 0; d < {{ DV // 16 }}; ++d) {
{%   for i = 0, acc.slots - 1 do %}
      op[d][{{ i }}] *= alpha[{{ rows.class_of[i] - 1 }}];
{%   end %}
    }
{% end %}
{% pack() %}
  }
  if (ntiles > 0) {
    // The last tile's O += P V.
    const unsigned last = it + ntiles - 1, lslot = last % {{ S }}u;
    {{ v.wait_full("lslot", ("(last / %du) & 1u"):format(S)) }}
    {{ turn("take") }}
{% pv("lslot") %}
    {{ turn("pass") }}
    fj::wg_wait<0>();
{% hold(OP, DV // 16) %}
    {{ PC.indent(v.release("lslot"), 4) }}
{% flush(true) %}
  }
  it += ntiles;
{% elseif part == "consumer_end" then %}
#undef FJ_Q_DESC
#undef FJ_K_DESC
#undef FJ_V_DESC
{% end %}
