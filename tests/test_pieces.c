/*
 * test_pieces.c -- the device pieces' contracts, checked in a Lua state of
 * the test's own over the built-in templates/ files: the mask rule's two
 * directions (mask.lua: the key range of a query tile for the forward, the
 * query range of a key tile for the backward) agree with its element test,
 * and the producer's rings (tma_ring.lua) and the budget (budget.lua) take
 * any element width and refuse with the value and the limit; FP8's P
 * operand from the accumulator (lut.lua's p8_from_acc) on the reference
 * tables; the mma family's FP8 products read from the ring (lut.lua's
 * fp8_b_isa and fp8_v_cols, tile_fp8.cuh's k8_pair, v8_pair, q_perm16 and
 * off8) emulated lane by lane.
 */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "layout.h"
#include "runner.h"
#include "template.h"

/* fj_text(name): a built-in template file's text. */
static int l_text(lua_State *L)
{
  size_t len = 0;
  const char *text = fj__template_text(luaL_checkstring(L, 1), &len);
  if (!text)
    return luaL_error(L, "no template %s", lua_tostring(L, 1));
  lua_pushlstring(L, text, len);
  return 1;
}

/* What the sandbox gives a template, enough for the pieces' Lua modules,
 * and an evaluator of the mask rule's C expressions on integers. */
static const char PRELUDE[] =
    "function import(name)\n"
    "  return assert(load(fj_text(name), '=' .. name, 't', _ENV))()\n"
    "end\n"
    "function refuse(why) error({ why = why }, 0) end\n"
    "function eval(expr, vars)\n"
    "  local e = expr:gsub('%(int%)', ''):gsub('%(long long%)', '')\n"
    "  e = e:gsub('(%d+)ll', '%1'):gsub('p%.', 'p_')\n"
    "  e = e:gsub('&&', ' and '):gsub('||', ' or ')\n"
    "  local env = setmetatable({ min = math.min, max = math.max },\n"
    "                           { __index = vars })\n"
    "  return assert(load('return ' .. e, '=expr', 't', env))()\n"
    "end\n";


/* Runs chunk in a fresh state with the reference table of each kind in
 * frags[0..n) as global LUT_<name> (LUT_wgmma_a8, ...): 0 when it returns
 * without an error (its message printed otherwise). */
static int run_lua_luts(const char *name, const char *chunk,
                        const fj_frag *frags, size_t n)
{
  lua_State *L = luaL_newstate();
  if (!L)
    return 1;
  luaL_openlibs(L);
  lua_register(L, "fj_text", l_text);
  for (size_t i = 0; i < n; i++) {
    fj_lut lut;
    char global[64];
    fj__lut_reference(frags[i], &lut);
    fj__lut_push(L, &lut);
    snprintf(global, sizeof global, "LUT_%s", fj_frag_name(frags[i]));
    lua_setglobal(L, global);
  }
  int bad = luaL_dostring(L, PRELUDE) != LUA_OK ||
            luaL_loadbuffer(L, chunk, strlen(chunk), name) != LUA_OK ||
            lua_pcall(L, 0, 0, 0) != LUA_OK;
  if (bad) {
    const char *msg = lua_tostring(L, -1);
    if (!msg && lua_istable(L, -1)) {
      lua_getfield(L, -1, "why");
      msg = lua_tostring(L, -1);
    }
    fprintf(stderr, "%s: %s\n", name, msg ? msg : "(an error object)");
  }
  lua_close(L);
  return bad;
}

/* Runs chunk in a fresh state (see run_lua_luts). */
static int run_lua(const char *name, const char *chunk)
{
  return run_lua_luts(name, chunk, NULL, 0);
}

/* For every mask (causal alignments, windows, unequal lengths), every
 * visible (row, key) lies in the key range of its row and in the query
 * range of its key; and each range's ends are tight: the first row of a
 * key's range sees a key at or after it, the last sees one before its end. */
int test_pieces_mask_directions(void)
{
  static const char chunk[] =
      "local M = import('mask.lua')\n"
      "local n = 0\n"
      "for _, sizes in ipairs({ {7, 7}, {5, 9}, {9, 5}, {16, 16}, {1, 12} }) do\n"
      " local Q, KV = sizes[1], sizes[2]\n"
      " for _, causal in ipairs({ 'none', 'top-left', 'bottom-right' }) do\n"
      "  for _, w in ipairs({ false, {0, 0}, {2, 0}, {5, 3}, {0, 4} }) do\n"
      "   local r = M.new(causal, false, nil, w and true or nil)\n"
      "   local br = causal == 'bottom-right' or (causal == 'none' and w)\n"
      "   local v = { p_seq_q = Q, p_seq_kv = KV,\n"
      "               p_causal_offset = br and KV - Q or 0,\n"
      "               p_window_left = w and w[1] or 0,\n"
      "               p_window_right = w and w[2] or 0 }\n"
      "   local function at(e, x) v.x = x; return eval(e, v) end\n"
      "   for i = 0, Q - 1 do\n"
      "    local kb, ke = at(r.keys_begin('x'), i), at(r.keys_end('x'), i + 1)\n"
      "    for j = 0, KV - 1 do\n"
      "     v.i, v.j = i, j\n"
      "     if eval(r.visible('i', 'j'), v) then\n"
      "      n = n + 1\n"
      "      local rb, re = at(r.rows_begin('x'), j), at(r.rows_end('x'), j + 1)\n"
      "      assert(j >= kb and j < ke, ('key %d of row %d outside [%d, %d) (%s, %s)'):format(j, i, kb, ke, causal, tostring(w)))\n"
      "      assert(i >= rb and i < re, ('row %d of key %d outside [%d, %d) (%s, %s)'):format(i, j, rb, re, causal, tostring(w)))\n"
      "     end\n"
      "    end\n"
      "   end\n"
      "   for j = 0, KV - 1 do\n"
      "    local rb, re = at(r.rows_begin('x'), j), at(r.rows_end('x'), j + 1)\n"
      "    local function sees(i, lo, hi)\n"
      "     for jj = lo, hi do v.i, v.j = i, jj; if eval(r.visible('i', 'j'), v) then return true end end\n"
      "    end\n"
      "    if rb < Q and rb < re then\n"
      "     assert(sees(rb, j, KV - 1), ('row %d, first of key %d, sees nothing from it'):format(rb, j))\n"
      "     assert(sees(re - 1, 0, j), ('row %d, last of key %d, sees nothing up to it'):format(re - 1, j))\n"
      "    end\n"
      "   end\n"
      "  end\n"
      " end\n"
      "end\n"
      "assert(n > 500, 'only ' .. n .. ' visible pairs checked')\n";
  CHECK(run_lua("mask_directions", chunk) == 0);
  return 0;
}

/* A ring of 1-byte (e4m3) or 2-byte elements: panels of 128-byte rows, the
 * transaction bytes, the box's columns, the barriers' order; a head dim
 * that is not whole panels is refused with the value. */
int test_pieces_ring_elem(void)
{
  static const char chunk[] =
      "local TR = import('tma_ring.lua')\n"
      "local bars = TR.barriers('bars')\n"
      "local q = TR.ring{ name = 'q', elem = 1, rows = 64, cols = 256, slots = 1,\n"
      "                   arrivals = 8, smem = 'sq', map = 'mq', bars = bars }\n"
      "local k = TR.ring{ name = 'k', elem = 2, rows = 128, cols = 256, slots = 3,\n"
      "                   arrivals = 8, smem = 'sk', map = 'mk', bars = bars }\n"
      "assert(q.panel_cols == 128 and q.panels == 2 and q.panel_bytes == 8192)\n"
      "assert(q.slot_bytes == 16384 and q.bytes == 16384 and q.tx_bytes == 16384)\n"
      "assert(k.panel_cols == 64 and k.panels == 4 and k.slot_bytes == 65536)\n"
      "assert(k.bytes == 3 * 65536 and k.tx_bytes == 65536)\n"
      "assert(bars.count == 2 + 6, bars.count)\n"
      "assert(q.full(0) == 'q_full' and q.empty(0) == 'q_empty')\n"
      "assert(k.full('s') == 'FJ_K_FULL(s)' and k.empty('s') == 'FJ_K_EMPTY(s)')\n"
      "local decls = TR.decls({ q, k }, bars)\n"
      "assert(decls == 'const unsigned q_full = bars, q_empty = bars + 8u;\\n'\n"
      "  .. '#define FJ_K_FULL(i) (bars + 8u * (2u + (i)))\\n'\n"
      "  .. '#define FJ_K_EMPTY(i) (bars + 8u * (5u + (i)))', decls)\n"
      "assert(TR.undefs({ q, k }) == '#undef FJ_K_FULL\\n#undef FJ_K_EMPTY')\n"
      "local fill = q.fill(0, function(pn) return pn .. ' * ' .. q.panel_cols end)\n"
      "assert(fill:find('mbar_expect(q_full, 16384u)', 1, true), fill)\n"
      "assert(fill:find('pn < 2', 1, true) and fill:find('pn * 128', 1, true), fill)\n"
      "local init = TR.init({ q, k }, { { 'bar_item', 1 } })\n"
      "assert(init:find('mbar_init(q_empty, 8)', 1, true) and init:find('i < 3', 1, true), init)\n"
      "local ok, e = pcall(TR.ring, { name = 'v', elem = 2, rows = 64, cols = 96, slots = 2,\n"
      "                               arrivals = 8, smem = 'sv', map = 'mv', bars = bars })\n"
      "assert(not ok and e.why:find('96 columns of 2 bytes', 1, true), e and e.why)\n"
      "assert(e.why:find('multiple of 64', 1, true), e.why)\n";
  CHECK(run_lua("ring_elem", chunk) == 0);
  return 0;
}

/* The budget: regions aligned in order, the total with its slack, what
 * fits, the register split, and a refusal naming the need and the limit. */
int test_pieces_budget(void)
{
  static const char chunk[] =
      "local B = import('budget.lua').new{}\n"
      "assert(B.region('q', 100, 1024) == 0 and B.region('k', 5000, 1024) == 1024)\n"
      "assert(B.region('bars', 24, 8) == 6024 and B.total() == 6048 + 1024)\n"
      "assert(B.fits(227 * 1024 - 7072) and not B.fits(227 * 1024 - 7071))\n"
      "assert(B.comment() == '// shared memory: 7072 bytes; q @0; k @1024; bars @6024 (+ alignment)')\n"
      "local r = B.regs(2)\n"
      "assert(r[1] == 24 and r[2] == 240)\n"
      "assert(B.regs(2, { producer = 40, consumer = 232 })[2] == 232)\n"
      "B.regs(3)\n"
      "local ok, e = pcall(B.check_regs, 200, 'head_dim 256 and tile_n 128', 'O, S and P', 'use fewer')\n"
      "assert(not ok and e.why == 'head_dim 256 and tile_n 128 need about 200 registers per '\n"
      "  .. 'consumer thread for O, S and P; 3 consumer warpgroups have 160 (over by 40): use fewer', e.why)\n"
      "assert(pcall(B.check_regs, 160, 'x', 'y', 'z'))\n"
      "assert(not pcall(B.regs, 4))\n";
  CHECK(run_lua("budget", chunk) == 0);
  return 0;
}

/* FP8's P from S (lut.lua's p8_from_acc) on the reference tables: each A
 * slot takes one S slot, the same in every lane, the keys' order sigma is
 * 4t + {0, 1, 2, 3} -> 2t + {0, 1, 8, 9} (+ 16 for columns 16-31), and the
 * pairing holds element by element in every lane (A's (row, col) holds S's
 * (row, sigma[col])).  A doctored A table whose lanes hold other columns
 * in different rows, or rows S's lane does not hold, is refused. */
int test_pieces_p8_from_acc(void)
{
  static const fj_frag frags[] = {FJ_FRAG_WGMMA_ACC_E4M3, FJ_FRAG_WGMMA_A8};
  static const char chunk[] =
      "local L = import('lut.lua')\n"
      "local acc = assert(L.analyse(LUT_wgmma_acc_e4m3, 'acc'))\n"
      "local a8 = assert(L.analyse(LUT_wgmma_a8, 'a8'))\n"
      "local from, sigma = L.p8_from_acc(a8, acc)\n"
      "assert(from, sigma)\n"
      "for t = 0, 3 do\n"
      " for h = 0, 1 do\n"
      "  local c, want = 4 * t + 16 * h, 2 * t + 16 * h\n"
      "  assert(sigma[c] == want and sigma[c + 1] == want + 1, c)\n"
      "  assert(sigma[c + 2] == want + 8 and sigma[c + 3] == want + 9, c)\n"
      " end\n"
      "end\n"
      "local taken = {}\n"
      "for s = 0, 15 do\n"
      " local j, i = from[s][1], from[s][2]\n"
      " assert(j >= 0 and j <= 1 and i >= 0 and i <= 7 and not taken[8 * j + i], s)\n"
      " taken[8 * j + i] = true\n"
      " for lane = 0, 31 do\n"
      "  local ar, ac = L.rc(LUT_wgmma_a8, lane, s)\n"
      "  local sr, sc = L.rc(LUT_wgmma_acc_e4m3, lane, i)\n"
      "  assert(ar == sr and sigma[ac] == sc + 16 * j, ('lane %d slot %d'):format(lane, s))\n"
      " end\n"
      "end\n"
      "-- slots 0-3 take S's 0, 1, 4, 5 (row g), 4-7 take 2, 3, 6, 7 (row g + 8)\n"
      "local want = { 0, 1, 4, 5, 2, 3, 6, 7 }\n"
      "for s = 0, 15 do assert(from[s][1] == s // 8 and from[s][2] == want[s % 8 + 1], s) end\n"
      "-- Lane l's columns turned by its row group: column 4 of row 0 is lane\n"
      "-- 1's, of row 1 lane 4's, which pair it with different keys.\n"
      "local function doctored(f)\n"
      " local t = { frag = 'wgmma_a8', slots = 16, rows = 16, cols = 32, device = 'x', map = {} }\n"
      " for lane = 0, 31 do for s = 0, 15 do\n"
      "  local r, c = f(lane, s)\n"
      "  t.map[lane * 16 + s + 1] = r * 32 + c\n"
      " end end\n"
      " return assert(L.analyse(t, 'doctored'))\n"
      "end\n"
      "local turned = doctored(function(l, s)\n"
      " local g, t = l // 4, (l % 4 + l // 4) % 4\n"
      " return g + 8 * (s // 4 % 2), 4 * t + s % 4 + 16 * (s // 8)\n"
      "end)\n"
      "local f, why = L.p8_from_acc(turned, acc)\n"
      "assert(f == nil and why:find('A column 4 would hold S column 2 (lane 1, row 0) and S column 0 (lane 4, row 1)', 1, true), why)\n"
      "local shifted = doctored(function(l, s)\n"
      " return (l // 4 + 1) % 8 + 8 * (s // 4 % 2), 4 * (l % 4) + s % 4 + 16 * (s // 8)\n"
      "end)\n"
      "f, why = L.p8_from_acc(shifted, acc)\n"
      "assert(f == nil and why:find('lane 0 holds 0 elements of row 0 as the 8-bit A and 8', 1, true), why)\n";
  CHECK(run_lua_luts("p8_from_acc", chunk, frags, FJ_ARRAY_LEN(frags)) == 0);
  return 0;
}

/* The mma family's FP8 decode products straight from the ring
 * (attention_mma.cu's REGS), emulated lane by lane on the reference
 * tables: FP8 rows stored in the ring's swizzle (tile_fp8.cuh's off8 under
 * REGS), read by ldmatrix as the PTX ISA defines it (non-transposed: lane
 * l's register i is 4 bytes of row l / 4 of matrix i, from byte 4 (l % 4);
 * .trans: the 16-bit units (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4)),
 * with mma_frag.cuh's lane addressing; the bytes paired as k8_pair and
 * v8_pair pair them, each pair's place in the B operand from the probed
 * B tables (which (k, n) a slot holds), Q's tile permuted as q_perm16
 * does, O's slots put back by fp8_v_cols's columns.  S = Q K^T and O =
 * P V come out exact for head dims 16 to 256 (80: the odd block read by
 * ldmatrix.x2); eight rows of one chunk fall in distinct banks (the
 * conflict-free ldmatrix); a doctored B table is refused with its lane. */
int test_pieces_fp8_regs(void)
{
  static const fj_frag frags[] = {FJ_FRAG_MMA_ACC_BF16, FJ_FRAG_MMA_A, FJ_FRAG_MMA_B_COL,
                                  FJ_FRAG_MMA_B_ROW};
  static const char chunk[] =
      "local L = import('lut.lua')\n"
      "local acc = assert(L.analyse(LUT_mma_acc_bf16, 'acc'))\n"
      "assert(L.fp8_b_isa(LUT_mma_b_col, LUT_mma_b_row))\n"
      "local oc = assert(L.fp8_v_cols(acc))\n"
      "local want = { [0] = 0, 2, 0, 2, 1, 3, 1, 3 }\n"
      "for s = 0, 7 do assert(oc.dcol[s] == want[s], s) end\n"
      "assert(#oc.pairs == 4)\n"
      "for i, pr in ipairs(oc.pairs) do assert(pr[1] == i - 1 and pr[2] == i + 3, i) end\n"
      "local function rc(t, lane, s) return L.rc(t, lane, s) end\n"
      "for _, D in ipairs({ 16, 32, 64, 80, 96, 128, 256 }) do\n"
      " local C8 = D // 16\n"
      " local XW8 = 1\n"
      " while XW8 < 8 and C8 % (XW8 * 2) == 0 do XW8 = XW8 * 2 end\n"
      " local XS8 = (C8 < 8 and XW8 == C8) and ({ [1] = 3, [2] = 2, [4] = 1 })[C8] or 0\n"
      " local function off8(r, c) return r * D + ((c ~ ((r >> XS8) & (XW8 - 1))) << 4) end\n"
      " -- eight rows of a chunk: distinct 16-byte bank groups where the row\n"
      " -- length allows (a power of two of chunks, or a multiple of 8)\n"
      " if XW8 == C8 or C8 % 8 == 0 then\n"
      "  for r0 = 0, 8, 8 do for c = 0, C8 - 1 do\n"
      "   local seen = {}\n"
      "   for r = r0, r0 + 7 do\n"
      "    local b = off8(r, c) // 16 % 8\n"
      "    assert(not seen[b], ('d%d rows %d.. chunk %d: bank group %d twice'):format(D, r0, c, b))\n"
      "    seen[b] = true\n"
      "   end\n"
      "  end end\n"
      " end\n"
      " local function Q(m, d) return (m * 7 + d * 3) % 11 - 5 end\n"
      " local function K(n, d) return (n * 5 + d * 13) % 9 end\n"
      " local function V(n, d) return (n * 3 + d * 7) % 10 end\n"
      " local function P(m, n) return (m * 5 + n * 11) % 7 - 3 end\n"
      " local kr, vr = {}, {}\n"
      " for n = 0, 15 do for d = 0, D - 1 do\n"
      "  kr[off8(n, d // 16) + d % 16] = K(n, d)\n"
      "  vr[off8(n, d // 16) + d % 16] = V(n, d)\n"
      " end end\n"
      " -- ldmatrix: addr[lane] for the lanes naming matrix rows; nm registers\n"
      " local function ldsm(ring, addr, nm, trans)\n"
      "  local out = {}\n"
      "  for l = 0, 31 do\n"
      "   out[l] = {}\n"
      "   for i = 0, nm - 1 do\n"
      "    local g, t = l // 4, l % 4\n"
      "    local b = {}\n"
      "    if trans then\n"
      "     for h = 0, 1 do for e = 0, 1 do b[2 * h + e] = ring[addr[8 * i + 2 * t + h] + 2 * g + e] end end\n"
      "    else\n"
      "     for e = 0, 3 do b[e] = ring[addr[8 * i + g] + 4 * t + e] end\n"
      "    end\n"
      "    out[l][i] = b\n"
      "   end\n"
      "  end\n"
      "  return out\n"
      " end\n"
      " local function nm_r(l) return (l & 7) | ((l >> 4) << 3) end\n"
      " local function nm_c(l) return l & 8 end\n"
      " local function rm_r(l) return l & 15 end\n"
      " local function rm_c(l) return (l >> 4) << 3 end\n"
      " -- B of one 16-dim block from per-lane registers b[0..3] (each two\n"
      " -- values, low first), placed by the probed table\n"
      " local function bmat(lut, regs)\n"
      "  local B = {}\n"
      "  for l = 0, 31 do for s = 0, 7 do\n"
      "   local k, n = rc(lut, l, s)\n"
      "   local v = regs[l][s // 2][s % 2]\n"
      "   assert(B[k * 16 + n] == nil or B[k * 16 + n] == v)\n"
      "   B[k * 16 + n] = v\n"
      "  end end\n"
      "  return B\n"
      " end\n"
      " local function pairs2(a, b) return { [0] = { [0] = a[0], a[1] }, { [0] = a[2], a[3] }, { [0] = b[0], b[1] }, { [0] = b[2], b[3] } } end\n"
      " local function prmt3120(a) return { [0] = a[0], a[2], a[1], a[3] } end\n"
      " -- v8_pair: b[0], b[2] from keys 0-7, b[1], b[3] from keys 8-15\n"
      " local function vpair(a, b)\n"
      "  local x, y = prmt3120(a), prmt3120(b)\n"
      "  return { [0] = { [0] = x[0], x[1] }, { [0] = y[0], y[1] }, { [0] = x[2], x[3] }, { [0] = y[2], y[3] } }\n"
      " end\n"
      " -- the K and V blocks' B operands, x4 pairs then the odd one by x2\n"
      " local KB, VB = {}, {}\n"
      " for kk = 0, C8 // 2 - 1 do\n"
      "  local ka, va = {}, {}\n"
      "  for l = 0, 31 do\n"
      "   ka[l] = off8(nm_r(l), 2 * kk + (nm_c(l) >> 3))\n"
      "   va[l] = off8(rm_r(l), 2 * kk + (rm_c(l) >> 3))\n"
      "  end\n"
      "  local kreg, vreg = ldsm(kr, ka, 4, false), ldsm(vr, va, 4, true)\n"
      "  local k0, k1, v0, v1 = {}, {}, {}, {}\n"
      "  for l = 0, 31 do\n"
      "   local r = kreg[l]\n"
      "   k0[l], k1[l] = pairs2(r[0], r[2]), pairs2(r[1], r[3])\n"
      "   r = vreg[l]\n"
      "   v0[l], v1[l] = vpair(r[0], r[1]), vpair(r[2], r[3])\n"
      "  end\n"
      "  KB[2 * kk], KB[2 * kk + 1] = bmat(LUT_mma_b_col, k0), bmat(LUT_mma_b_col, k1)\n"
      "  VB[2 * kk], VB[2 * kk + 1] = bmat(LUT_mma_b_row, v0), bmat(LUT_mma_b_row, v1)\n"
      " end\n"
      " if C8 % 2 == 1 then\n"
      "  local a = {}\n"
      "  for l = 0, 31 do a[l] = off8(rm_r(l), C8 - 1) end\n"
      "  local kreg, vreg = ldsm(kr, a, 2, false), ldsm(vr, a, 2, true)\n"
      "  local k0, v0 = {}, {}\n"
      "  for l = 0, 31 do k0[l] = pairs2(kreg[l][0], kreg[l][1]); v0[l] = vpair(vreg[l][0], vreg[l][1]) end\n"
      "  KB[C8 - 1], VB[C8 - 1] = bmat(LUT_mma_b_col, k0), bmat(LUT_mma_b_row, v0)\n"
      " end\n"
      " -- S = Q K^T: A from Q's tile permuted (q_perm16: columns 0-7 of a\n"
      " -- block take dims 0 1 4 5 8 9 12 13, 8-15 dims 2 3 6 7 10 11 14 15)\n"
      " local perm = { [0] = 0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15 }\n"
      " for m = 0, 15 do for n = 0, 15 do\n"
      "  local s, ref = 0, 0\n"
      "  for b = 0, C8 - 1 do for k = 0, 15 do\n"
      "   s = s + Q(m, 16 * b + perm[k]) * KB[b][k * 16 + n]\n"
      "  end end\n"
      "  for d = 0, D - 1 do ref = ref + Q(m, d) * K(n, d) end\n"
      "  assert(s == ref, ('d%d S[%d][%d] = %d, not %d'):format(D, m, n, s, ref))\n"
      " end end\n"
      " -- O = P V: the accumulator tile of block b, slot s of lane l at its\n"
      " -- (row, col), stored at dim 16 b + 2 acc_c + dcol[s]\n"
      " for b = 0, C8 - 1 do\n"
      "  local got = {}\n"
      "  for l = 0, 31 do for s = 0, 7 do\n"
      "   local m, c = rc(LUT_mma_acc_bf16, l, s)\n"
      "   local o = 0\n"
      "   for k = 0, 15 do o = o + P(m, k) * VB[b][k * 16 + c] end\n"
      "   local d = 16 * b + 2 * acc.base[l][2] + oc.dcol[s]\n"
      "   assert(got[m * D + d] == nil, 'a dim twice')\n"
      "   got[m * D + d] = o\n"
      "  end end\n"
      "  for m = 0, 15 do for d = 16 * b, 16 * b + 15 do\n"
      "   local ref = 0\n"
      "   for k = 0, 15 do ref = ref + P(m, k) * V(k, d) end\n"
      "   assert(got[m * D + d] == ref, ('d%d O[%d][%d] = %s, not %d'):format(D, m, d, tostring(got[m * D + d]), ref))\n"
      "  end end\n"
      " end\n"
      "end\n"
      "-- a B table whose lanes are one row group off is refused\n"
      "local t = { frag = 'mma_b_col', slots = 8, rows = 16, cols = 16, device = 'x', map = {} }\n"
      "for l = 0, 31 do for s = 0, 7 do\n"
      " local k, n = rc(LUT_mma_b_col, (l + 4) % 32, s)\n"
      " t.map[l * 8 + s + 1] = k * 16 + n\n"
      "end end\n"
      "local ok, why = L.fp8_b_isa(t, LUT_mma_b_row)\n"
      "assert(ok == nil and why:find('K-style B: lane 0 slot 0 holds (k 0, n 1)', 1, true), why)\n";
  CHECK(run_lua_luts("fp8_regs", chunk, frags, FJ_ARRAY_LEN(frags)) == 0);
  return 0;
}
