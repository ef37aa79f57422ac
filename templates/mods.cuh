{#
  mods.cuh: the score and mask functions of a problem's modifications
  (mods.lua), in two parts.  part "decls" (after common.cuh): the
  parameters' launch block fj::ModArgs -- a scalar in 8 bytes, a tensor as
  an accessor of 24 (pointer, 4 extents) that reads 0 for an index outside
  its extents -- and the functions' declarations.  part "defs" (the end of
  the file): their definitions, each user expression as its tree prints
  it in CUDA (src/mods_kernel.c; the user's text in a comment above)
  after a #line naming it, so that a compiler message says "score(1)" or
  "mask(1)".  In checked mode (mods.checked)
  the expressions read tensors through lambdas that record the first read
  out of range (parameter index, indices) in the block's last field,
  fj_oob, a device record the host reads after the launch.
#}
{% if part == "decls" then %}
{%   if mods.bf16 and dtype ~= "bf16" then %}
#include <cuda_bf16.h>
{%   end %}
namespace fj {
{%   for _, t in ipairs(mods.params) do %}
{%     if t.rank > 0 then %}
{%       local idx = {} ; local args = {} ; local oob = {} %}
{%       for d = 0, t.rank - 1 do args[#args + 1] = "int i" .. d ; oob[#oob + 1] = ("(unsigned)i%d < (unsigned)e[%d]"):format(d, d) end %}
{%       local flat = "(long long)i0" %}
{%       for d = 1, t.rank - 1 do flat = ("(%s * e[%d] + i%d)"):format(flat, d, d) end %}
{%       local R = t.type == "i32" and "int" or "float" %}
// Parameter {{ t.name }}: a rank-{{ t.rank }} {{ t.type }} tensor; an index outside its extents reads 0.
{%       if t.shared then %}
// Read where reads repeat across a tile's scores (by the mask, or by the
// score at a row's indices only): the load always happens, of element 0
// for an index outside (extents are at least 1), and a select gives 0 --
// straight-line code, so that the compiler shares the reads of one element
// between the elements of a tile (one load per key column, not one per
// score) and hoists those of a row out of the key loop.
{%       end %}
struct ModTensor_{{ t.name }} {
  const {{ mods.ctype[t.type] }} *data;
  int e[4];
  __device__ __forceinline__ {{ R }} operator()({{ table.concat(args, ", ") }}) const {
{%       if t.shared then %}
    const bool in = {{ table.concat(oob, " && ") }};
    const {{ R }} v = {{ t.read:format("data + (in ? " .. flat .. " : 0ll)") }};
    return in ? v : ({{ R }})0;
{%       else %}
    if (!({{ table.concat(oob, " && ") }})) return 0;
    return {{ t.read:format("data + " .. flat) }};
{%       end %}
  }
};
{%     end %}
{%   end %}
{%   if mods.args then %}
// The parameters' values: launch arguments (src/mods.c's fj__mods_args).
struct ModArgs {
{%     local bytes = 0 %}
{%     for _, t in ipairs(mods.params) do %}
{%       if t.rank == 0 then bytes = bytes + 8 %}
  {{ mods.ctype[t.type] }} {{ t.name }}; int {{ t.name }}_pad_;
{%       else bytes = bytes + 24 %}
  ModTensor_{{ t.name }} {{ t.name }};
{%       end %}
{%     end %}
{%     if mods.checked then bytes = bytes + 8 %}
  unsigned *fj_oob;  // checked mode: the record of the first read out of range
{%     end %}
};
static_assert(sizeof(ModArgs) == {{ bytes }}, "host and device disagree on the parameters' block");
{%     if mods.pgrads then %}

// The parameters' gradients (fj_mods.param_grads): a float32 array per
// parameter, NULL where it has none, and in the deterministic mode its
// words of fixed point in the workspace (w, two an element; NULL in the
// other mode: float32 atomics into g) -- src/backward.c's fj_mod_grads.
struct ModGrads {
  float *g[8];
  long long *w[8];
};
static_assert(sizeof(ModGrads) == 128, "host and device disagree on the gradients' block");
// Adds v at element at of parameter i's gradient: float32 atomics, or the
// deterministic mode's words (bwd_common.cuh's pgrad_words_add) for the
// values they hold.
__device__ __forceinline__ void pgrad_add(const ModGrads &mg, int i, long long at, float v) {
  if (mg.w[i] && pgrad_fixed(v))
    pgrad_words_add(mg.w[i] + 2 * at, v);
  else
    atomicAdd(mg.g[i] + at, v);
}
{%     end %}
{%     if mods.checked then %}

// Checked mode: the first read out of range wins the record (word 0 from 0
// to 1); its parameter and indices follow.  Rare, so out of line.
__device__ __noinline__ void oob_record(unsigned *rec, int param, int i0, int i1, int i2, int i3) {
  if (atomicCAS(rec, 0u, 1u) != 0u) return;
  rec[1] = (unsigned)param;
  rec[2] = (unsigned)i0;
  rec[3] = (unsigned)i1;
  rec[4] = (unsigned)i2;
  rec[5] = (unsigned)i3;
}
{%     end %}
{%   end %}
{%   if mods.softcap then %}
// tanh by the special-function unit (tanh.approx.f32, sm_75 on: relative
// error about 2^-11), as FlashAttention's softcap: one instruction where
// tanhf takes a polynomial and the exact form an ex2 and a division --
// the softmax's own ex2 shares the same unit.
__device__ __forceinline__ float softcap_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
{%   end %}
{%   if mods.score or mods.mask then %}
// The expressions' int operations where C leaves a result undefined, with
// the results src/expr.h gives them (and the host's evaluator computes):
// + - * and negation wrap around; x / 0 and x % 0 are 0, INT_MIN / -1 is
// INT_MIN; a shift count outside 0..31 shifts every bit out (>> keeps the
// sign).  Written so that the compiler has nothing undefined to fold.
__device__ __forceinline__ int iadd(int a, int b) { return (int)((unsigned)a + (unsigned)b); }
__device__ __forceinline__ int isub(int a, int b) { return (int)((unsigned)a - (unsigned)b); }
__device__ __forceinline__ int imul(int a, int b) { return (int)((unsigned)a * (unsigned)b); }
__device__ __forceinline__ int ineg(int a) { return (int)(0u - (unsigned)a); }
__device__ __forceinline__ int iabs(int a) { return a < 0 ? ineg(a) : a; }
__device__ __forceinline__ int idiv(int a, int b) { return b == 0 ? 0 : b == -1 ? ineg(a) : a / b; }
__device__ __forceinline__ int imod(int a, int b) { return b == 0 || b == -1 ? 0 : a % b; }
__device__ __forceinline__ int ishl(int a, int b) { return (unsigned)b > 31u ? 0 : (int)((unsigned)a << b); }
__device__ __forceinline__ int ishr(int a, int b) { return a >> ((unsigned)b > 31u ? 31 : b); }
{%   end %}
}  // namespace fj
{%   if mods.score then %}
__device__ __forceinline__ float fj_score_mod(float s, int b, int h, int hkv, int q, int kv, {{ mods.kvq and (mods.kvq_scale and "float fj_skvq, " or "float fj_kvq, ") or "" }}{{ mods.dg and mods.dg.value .. " fj_dg, " or "" }}const fj::Params &fj_p{{ mods.args and ", const fj::ModArgs &fj_ma" or "" }});
{%   end %}
{%   if #mods.pgrads_each > 0 then %}
__device__ __forceinline__ void fj_param_grads(float fj_ds, float s, int b, int h, int hkv, int q, int kv, const fj::Params &fj_p, const fj::ModArgs &fj_ma, const fj::ModGrads &fj_mg);
{%   end %}
{%   if mods.pgrads_nsum > 0 then %}
__device__ __forceinline__ void fj_param_dsum(float fj_ds, float s, int b, int h, int hkv, int q, int kv, const fj::Params &fj_p, const fj::ModArgs &fj_ma, float (&fj_acc)[{{ mods.pgrads_nsum }}]);
__device__ __forceinline__ void fj_param_flush(const float (&fj_acc)[{{ mods.pgrads_nsum }}], int b, int h, int hkv, const fj::Params &fj_p, const fj::ModArgs &fj_ma, const fj::ModGrads &fj_mg);
{%   end %}
{%   if mods.grad then %}
__device__ __forceinline__ float fj_score_grad(float s, int b, int h, int hkv, int q, int kv, {{ mods.kvq and (mods.kvq_scale and "float fj_skvq, " or "float fj_kvq, ") or "" }}{{ mods.dg and mods.dg.value .. " fj_dg, " or "" }}const fj::Params &fj_p{{ mods.args and ", const fj::ModArgs &fj_ma" or "" }});
{%   end %}
{%   if mods.kvq_scale then %}
__device__ __forceinline__ float fj_kvq_scale(int b, int h, int hkv, const fj::Params &fj_p{{ mods.args and ", const fj::ModArgs &fj_ma" or "" }});
{%   end %}
{%   if mods.dg then %}
__device__ __forceinline__ const {{ mods.ctype[mods.dg.param.type] }} *fj_dg_row(int b, int h, int hkv, int fj_d, int fj_lo, int fj_hi, const fj::Params &fj_p, const fj::ModArgs &fj_ma, bool &fj_in);
__device__ __forceinline__ {{ mods.dg.value }} fj_dg_read(int b, int h, int hkv, int q, int kv, const fj::Params &fj_p, const fj::ModArgs &fj_ma);
{%   end %}
{%   if mods.mask then %}
__device__ __forceinline__ bool fj_mask_mod(int b, int h, int hkv, int q, int kv{{ mods.args and ", const fj::ModArgs &fj_ma" or "" }});
{%   end %}
{%   if mods.rt_fill then %}
__device__ __forceinline__ float fj_rt_value(int h, int q, int kv, const fj::Params &fj_p, const fj::ModArgs &fj_ma);
{%   end %}
{% else %}
{%
  -- The parameters as locals of a function, read from the launch block.
  local function locals()
    for _, t in ipairs(mods.params) do
      if t.rank == 0 then
%}
  const {{ mods.ctype[t.type] }} {{ t.name }} = fj_ma.{{ t.name }};
  (void){{ t.name }};
{%    elseif mods.checked then %}
{%      local args, idx, oob = {}, {}, {} %}
{%      for d = 0, t.rank - 1 do args[#args + 1] = "int i" .. d ; idx[#idx + 1] = "i" .. d ; oob[#oob + 1] = ("(unsigned)i%d >= (unsigned)fj_ma.%s.e[%d]"):format(d, t.name, d) end %}
{%      for d = t.rank, 3 do idx[#idx + 1] = "0" end %}
  // Parameter {{ t.name }} (index {{ t.index }}), checked: a read out of range is recorded.
  const auto {{ t.name }} = [&]({{ table.concat(args, ", ") }}) {
    if ({{ table.concat(oob, " || ") }}) fj::oob_record(fj_ma.fj_oob, {{ t.index }}, {{ table.concat(idx, ", ") }});
    return fj_ma.{{ t.name }}({{ table.concat(idx, ", ", 1, t.rank) }});
  };
  (void){{ t.name }};
{%    else %}
  const fj::ModTensor_{{ t.name }} &{{ t.name }} = fj_ma.{{ t.name }};
  (void){{ t.name }};
{%
      end
    end
  end
%}

// ---- score and mask modifications (fj_mods) --------------------------------
{%   if mods.kvq_scale then %}
// The factor F of the score expression's F * (float)(kv - q), once a row
// and tile (mods.lua's kvq_scale).
__device__ __forceinline__ float fj_kvq_scale(int b, int h, int hkv, const fj::Params &fj_p{{ mods.args and ", const fj::ModArgs &fj_ma" or "" }}) {
  (void)b; (void)h; (void)hkv; (void)fj_p;
{%     locals() %}
  return (float)({{ mods.kvq_scale }});
}
{%   end %}
{%   if mods.dg then %}
{%     local dg, t = mods.dg, mods.dg.param %}
{%     local flat = nil %}
{%     for k = 1, t.rank do %}
{%       local i = k < t.rank and ("fj_i%d"):format(k - 1) or "fj_il" %}
{%       flat = flat and ("(%s * %s.e[%d] + %s)"):format(flat, t.name, k - 1, i) or ("(long long)" .. i) %}
{%     end %}
// The distance table (mods.lua's dg): the score expression's
// {{ dg.call }}, at distance fj_d = q - kv, is the element at the
// pointer this returns plus {{ dg.sign > 0 and "-" or "" }}(kv - kv0) for the key kv0 the distance fj_d was
// taken at; fj_in says whether the elements at offsets fj_lo..fj_hi from it all
// lie within {{ t.name }}'s extents (then no score of the tile needs a test).
__device__ __forceinline__ const {{ mods.ctype[t.type] }} *fj_dg_row(int b, int h, int hkv, int fj_d, int fj_lo, int fj_hi, const fj::Params &fj_p, const fj::ModArgs &fj_ma, bool &fj_in) {
  (void)b; (void)h; (void)hkv; (void)fj_p;
{%     locals() %}
{%     for k = 1, t.rank - 1 do %}
  const int fj_i{{ k - 1 }} = ({{ dg.uniform[k] }});
{%     end %}
  // The last index at the distance: the expression's own + and - wrap
  // (fj::iadd: the host evaluator's meaning), so this does too.  The
  // offsets are added to the pointer, unwrapped: fj_in tests them as 64-bit
  // integers, so that the fast path reads exactly the elements the
  // wrapped indices name.
  const int fj_il = {{ dg.sign > 0 and "fj::iadd(fj_d, " .. dg.x .. ")" or "fj::isub(" .. dg.x .. ", fj_d)" }};
  fj_in = {% for k = 1, t.rank - 1 do %}(unsigned)fj_i{{ k - 1 }} < (unsigned){{ t.name }}.e[{{ k - 1 }}] && {% end %}(long long)fj_il + fj_lo >= 0ll &&
          (long long)fj_il + fj_hi < (long long){{ t.name }}.e[{{ t.rank - 1 }}];
  return {{ t.name }}.data + {{ flat }};
}

// The same element through the accessor, as the user wrote it (a tile
// partly outside the table).
__device__ __forceinline__ {{ dg.value }} fj_dg_read(int b, int h, int hkv, int q, int kv, const fj::Params &fj_p, const fj::ModArgs &fj_ma) {
  (void)b; (void)h; (void)hkv; (void)q; (void)kv; (void)fj_p;
{%     locals() %}
  return
#line {{ dg.line }} "score"
{{ (" "):rep(dg.col - 1) }}{{ dg.call }}
  ;
}
{%   end %}
{%   if mods.rt_fill then %}
// The relative table's element (src/mods_kernel.h): the score
// expression's subtree that depends on the query head and the distance
// kv - q alone, as its tree prints it.
__device__ __forceinline__ float fj_rt_value(int h, int q, int kv, const fj::Params &fj_p, const fj::ModArgs &fj_ma) {
  (void)h; (void)q; (void)kv; (void)fj_p;
{%     locals() %}
  return (float)(
#line 1 "score (its relative table)"
{{ mods.rt }}
  );
}
{%   end %}
{%   if mods.score then %}
// The score of (q, kv) from s, the scaled score{{ mods.score_text and ": the user's expression" or "" }}{{ mods.softcap and ", then softcap * tanhf(s / softcap)" or "" }}.
__device__ __forceinline__ float fj_score_mod(float s, int b, int h, int hkv, int q, int kv, {{ mods.kvq and (mods.kvq_scale and "float fj_skvq, " or "float fj_kvq, ") or "" }}{{ mods.dg and mods.dg.value .. " fj_dg, " or "" }}const fj::Params &fj_p{{ mods.args and ", const fj::ModArgs &fj_ma" or "" }}) {
  (void)b; (void)h; (void)hkv; (void)q; (void)kv; (void)fj_p;
{%     locals() %}
{%     if mods.score_text then %}
  // The user's expression: {{ mods.score_text }}
  // as its tree prints it{{ mods.kvq and ", with its (float)(kv - q) as fj_kvq (the same distance, built per element from one conversion a row and tile: mods.lua's kvq)" or "" }}{{ mods.kvq_scale and (", and " .. mods.kvq_scale .. " * fj_kvq as fj_skvq") or "" }}{{ mods.dg and (", with its " .. mods.dg.call .. " as fj_dg (the same element, read by the family: fj_dg_row, fj_dg_read)") or "" }}.
  s = (
#line 1 "score"
{{ mods.kernel_score_text }}
  );
{%     end %}
{%     if mods.fold then %}
  // The built-in softcap (fj_mods.softcap): softcap * tanh(s / softcap),
  // with s / softcap already in s and the softmax's scale multiplying by
  // softcap.
  s = fj::softcap_tanh(s);
{%     elseif mods.softcap then %}
  // The built-in softcap (fj_mods.softcap): softcap * tanh(s / softcap).
  s = fj_p.softcap * fj::softcap_tanh(s * fj_p.softcap_inv);
{%     end %}
  return s;
}
{%   end %}
{%   if mods.grad then %}
// The derivative of the user's score expression with respect to s, at the
// raw scaled score s (src/expr_grad.c: the chain rule on its tree; the
// derivative of the branch a ?: takes; int parts and floorf, ceilf,
// roundf, truncf contribute 0), with the same names as fj_score_mod.
__device__ __forceinline__ float fj_score_grad(float s, int b, int h, int hkv, int q, int kv, {{ mods.kvq and (mods.kvq_scale and "float fj_skvq, " or "float fj_kvq, ") or "" }}{{ mods.dg and mods.dg.value .. " fj_dg, " or "" }}const fj::Params &fj_p{{ mods.args and ", const fj::ModArgs &fj_ma" or "" }}) {
  (void)s; (void)b; (void)h; (void)hkv; (void)q; (void)kv; (void)fj_p;
{%     locals() %}
  return (float)(
#line 1 "score'"
{{ mods.kernel_grad_text }}
  );
}
{%   end %}
{%
  -- A read's indices as fj_i0.. (C declarations), whether they lie within
  -- its tensor's extents, and its element's offset.
  local function read_index(r)
    local t = mods.params[r.param + 1]
    local flat, inb, decl = "(long long)fj_i0", {}, {}
    for d = 1, r.rank - 1 do flat = ("(%s * %s.e[%d] + fj_i%d)"):format(flat, t.name, d, d) end
    for d = 0, r.rank - 1 do
      inb[#inb + 1] = ("(unsigned)fj_i%d < (unsigned)%s.e[%d]"):format(d, t.name, d)
      decl[#decl + 1] = ("const int fj_i%d = (%s);"):format(d, r.idx[d + 1])
    end
    return t, table.concat(decl, " "), table.concat(inb, " && "), flat
  end
%}
{%   if #mods.pgrads_each > 0 then %}
// The parameters' gradients at one score: fj_ds, d loss / d score, times
// the score's derivative with respect to the value each read of a
// parameter with a gradient fetched (src/expr_grad.c), added at the
// indices it read -- nothing for a read outside the extents.  s is the
// raw scaled score.
__device__ __forceinline__ void fj_param_grads(float fj_ds, float s, int b, int h, int hkv, int q, int kv, const fj::Params &fj_p, const fj::ModArgs &fj_ma, const fj::ModGrads &fj_mg) {
  (void)s; (void)b; (void)h; (void)hkv; (void)q; (void)kv; (void)fj_p;
{%     locals() %}
{%     for _, r in ipairs(mods.pgrads_each) do %}
{%       local t, decl, inb, flat = read_index(r) %}
  {
    // A read of {{ t.name }}.
    {{ decl }}
    if ({{ inb }})
      fj::pgrad_add(fj_mg, {{ r.param }}, {{ flat }}, fj_ds * (float)(
#line 1 "score' by {{ t.name }}"
{{ r.d }}
      ));
  }
{%     end %}
}
{%   end %}
{%   if mods.pgrads_nsum > 0 then %}
// The reads whose indices use none of q, kv and s (one element per batch
// and query head: a slope per head): fj_param_dsum adds fj_ds times the
// score's derivative with respect to each one's value into fj_acc, and
// fj_param_flush adds a warp's sums at their elements, one atomic each,
// from lane 0 (every lane of the warp calls it).
__device__ __forceinline__ void fj_param_dsum(float fj_ds, float s, int b, int h, int hkv, int q, int kv, const fj::Params &fj_p, const fj::ModArgs &fj_ma, float (&fj_acc)[{{ mods.pgrads_nsum }}]) {
  (void)s; (void)b; (void)h; (void)hkv; (void)q; (void)kv; (void)fj_p;
{%     locals() %}
{%     for u, r in ipairs(mods.pgrads_sum) do %}
  fj_acc[{{ u - 1 }}] += fj_ds * (float)(
#line 1 "score' by {{ mods.params[r.param + 1].name }}"
{{ r.d }}
  );
{%     end %}
}

__device__ __forceinline__ void fj_param_flush(const float (&fj_acc)[{{ mods.pgrads_nsum }}], int b, int h, int hkv, const fj::Params &fj_p, const fj::ModArgs &fj_ma, const fj::ModGrads &fj_mg) {
  (void)b; (void)h; (void)hkv; (void)fj_p;
{%     locals() %}
{%     for u, r in ipairs(mods.pgrads_sum) do %}
{%       local t, decl, inb, flat = read_index(r) %}
  {
    // The read of {{ t.name }} at one element for the batch and head.
    float v = fj_acc[{{ u - 1 }}];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    {{ decl }}
    if (threadIdx.x % 32 == 0 && {{ inb }}) fj::pgrad_add(fj_mg, {{ r.param }}, {{ flat }}, v);
  }
{%     end %}
}
{%   end %}
{%   if mods.mask then %}
// Whether q sees kv: the user's mask expression,
// {{ mods.mask_text }}
// as its tree prints it.
__device__ __forceinline__ bool fj_mask_mod(int b, int h, int hkv, int q, int kv{{ mods.args and ", const fj::ModArgs &fj_ma" or "" }}) {
  (void)b; (void)h; (void)hkv; (void)q; (void)kv;
{%     locals() %}
  return (
#line 1 "mask"
{{ mods.mask_cuda }}
  );
}
{%   end %}
{% end %}
