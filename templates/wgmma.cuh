{#
  wgmma.cuh: Hopper's own machinery in inline PTX (sm_90a), shared by the
  layout probe (lut_probe.cu) and the wgmma family (attention_wgmma.cu), so
  that the tables and check products the probe reads back describe exactly
  the instructions and descriptors the kernels issue.

  Tiles live in shared memory as panels of 128-byte rows (64 16-bit or 128
  8-bit columns): a panel of R rows is R x 128 bytes, 1024-byte aligned, in
  the 128-byte swizzle (16-byte chunk c of row r stored at chunk c ^ (r %
  8)) -- what a TMA box of R rows of 128 bytes with
  CU_TENSOR_MAP_SWIZZLE_128B writes, and what a wgmma descriptor of layout
  type 1 reads.  Descriptors (64 bits): start address >> 4 in bits 0-13,
  leading byte offset >> 4 in 16-29, stride byte offset >> 4 in 32-45,
  layout type in 62-63 (1: 128-byte swizzle).
    K-major (Q as A, K as B): 8-row groups 1024 bytes apart (the stride
      offset); a k step (32 bytes of the element) is 32 bytes further along
      the row.
    MN-major (V as B, transposed; 16-bit types only): the 64-column panels
      `panel` bytes apart (the leading offset), 8-row groups along k 1024
      bytes apart (the stride offset); a k16 step is 16 rows, 2048 bytes, on.
  Parameters: forms, the wgmma wrappers to emit, each
    { t = "f16" | "bf16" | "e4m3" | "e5m2", n = N, a = "ss" | "rs", tb = 0 | 1,
      k = K, ta = 0 | 1 };
  K is the instruction's reduction, 32 bytes of the element: 16 for the
  16-bit types (the default), 32 for e4m3 and e5m2 (their default); another
  K is refused.  tb = 1: B read MN-major (transposed, a V tile as stored);
  its wrapper's name ends in _t.  ta = 1 (ss only): A read MN-major too
  (the backward's dS^T for dQ); its name ends in _tt (tb must be 1).  The
  8-bit types have no transpose (the PTX ISA gives their wgmma no
  imm-trans operands): both operands K-major, a form with tb or ta 1 is
  refused.  A form's wrapper is wg_<a>_<t>_<N>[_t|_tt]:
    wg_ss_*(d, da, db, scale_d), wg_rs_*(d, a[4], db, scale_d), d the f32
    accumulators d[N / 16][8]; an RS form's a[4] is the thread's A
    fragment, four 32-bit registers (two 16-bit or four 8-bit elements
    each, the lowest first).
  Any 8-bit form also brings the 8-bit helpers: sw128_b8 (a byte
  element's place in a swizzled panel) and pack4_e4m3 / pack4_e5m2 (four
  floats as one register of 8-bit elements, what an RS form's a[] holds).
  spin_limit, 0 or the tries after which an mbarrier wait traps.
#}
namespace fj {

// Byte offset of element (r, c) in a 128-byte-swizzled panel (c < 64).
__device__ __forceinline__ unsigned sw128(int r, int c) {
  return (unsigned)(r * 128 + ((((c >> 3) ^ (r & 7)) << 4) | ((c & 7) << 1)));
}

// Plain shared-space stores and loads at shared-space addresses (the
// epilogue's staging of O: epilogue_regs.cuh's `stage`).
__device__ __forceinline__ void st_shared_b32(unsigned a, unsigned v) {
  asm volatile("st.shared.b32 [%0], %1;\n" :: "r"(a), "r"(v) : "memory");
}
__device__ __forceinline__ void st_shared_b16(unsigned a, unsigned short v) {
  asm volatile("st.shared.b16 [%0], %1;\n" :: "r"(a), "h"(v) : "memory");
}
__device__ __forceinline__ void st_shared_b8(unsigned a, unsigned char v) {
  asm volatile("st.shared.b8 [%0], %1;\n" :: "r"(a), "h"((unsigned short)v) : "memory");
}
__device__ __forceinline__ float ld_shared_f32(unsigned a) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(a) : "memory");
  return v;
}
__device__ __forceinline__ uint4 ld_shared_v4(unsigned a) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 { %0, %1, %2, %3 }, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a) : "memory");
  return v;
}

// A shared-memory matrix descriptor, 128-byte swizzle.
__device__ __forceinline__ unsigned long long wg_desc(unsigned saddr, unsigned lead, unsigned stride) {
  return (unsigned long long)((saddr & 0x3FFFFu) >> 4) | ((unsigned long long)(lead >> 4) << 16) |
         ((unsigned long long)(stride >> 4) << 32) | (1ull << 62);
}
// Descriptor d moved `bytes` (a multiple of 16) on: an add to its start
// address field alone.  Exact, with no carry out of the field: shared-space
// addresses lie below 2^18, so the field (address >> 4, bits 0-13) of the
// base and of base + bytes are the base's and base + bytes' own.  One
// 64-bit add (not the halves split and joined, which made ptxas move the
// high word anew for every wgmma: 56 instructions a step at d128).
__device__ __forceinline__ unsigned long long wg_desc_at(unsigned long long d, unsigned bytes) {
  return d + (unsigned long long)(bytes >> 4);
}
// The same as two 32-bit halves, the low one added to and the high one
// kept: what the forward's main loop compiles best with (nvdisasm at bf16
// d128: 21 R2UR against 27 with the 64-bit add; FP8 d256 causal spills
// none against 16 bytes), where the backward's compiles best with the
// 64-bit add above.
__device__ __forceinline__ unsigned long long wg_desc_at_lo(unsigned long long d, unsigned bytes) {
  const unsigned lo = (unsigned)d + (bytes >> 4), hi = (unsigned)(d >> 32);
  return (unsigned long long)hi << 32 | lo;
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}
// Keeps the compiler from moving register work on an accumulator across
// the wgmma that owns it (it cannot see the asynchrony).
__device__ __forceinline__ void wg_hold(float &x) { asm volatile("" : "+f"(x) :: "memory"); }

// A value the compiler cannot see through (nor fold, nor hoist out of a loop).
__device__ __forceinline__ unsigned opaque_u32(unsigned a) {
  unsigned b;
  asm volatile("mov.b32 %0, %1;" : "=r"(b) : "r"(a));
  return b;
}

// wgmma.wait_group 0 at the top of a block of its own.  ptxas moves a wait
// to the top of its block, above any work that touches no register of the
// pending wgmmas (the forward's softmax, which the wait should overlap with
// O += P V), but not across a branch: this waits on both sides of one
// whose condition neither NVVM nor ptxas can fold (u, through opaque_u32,
// against ~0u), so the work before it in the source stays before it.
// u must be the same in every thread of the warpgroup (the wait is
// .aligned over it): a loop counter, say.  Either side waits.
__device__ __forceinline__ void wg_wait0_split(unsigned u) {
  if (opaque_u32(u) != ~0u)
    asm volatile("wgmma.wait_group.sync.aligned 0;  // split" ::: "memory");
  else
    asm volatile("wgmma.wait_group.sync.aligned 0;  // split, other side" ::: "memory");
}

// A shared-space address the compiler cannot fold into a constant: NVRTC
// 13.0's PTX compiler crashes on wgmma whose descriptors are constants.
__device__ __forceinline__ unsigned smem_opaque(const void *p) {
  return opaque_u32((unsigned)__cvta_generic_to_shared(p));
}

// Generic-proxy writes to shared memory, made visible to wgmma and TMA.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// ---- mbarriers (shared-space addresses) ----
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also expects `bytes` of transactions (a TMA load's).
__device__ __forceinline__ void mbar_expect(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
__device__ __forceinline__ unsigned mbar_test(unsigned bar, unsigned parity) {
  unsigned done;
  asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }\n"
               : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  return done;
}
// Waits for the phase of parity `parity` to complete.
{% if spin_limit > 0 then %}
// A wait that never ends is a bug (a phase or byte count wrong): this build
// traps after {{ spin_limit }} tries, so the launch fails instead of hanging.
// (The trap costs registers: ptxas then serialises wgmma and spills, so
// only debugging builds have it.)
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  for (unsigned i = 0; !mbar_test(bar, parity); ++i)
    if (i == {{ spin_limit }}u) __trap();
}
{% else %}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  while (!mbar_test(bar, parity)) {
  }
}
{% end %}

// ---- TMA: a box of a rank-4 tensor map into shared memory ----
__device__ __forceinline__ void tma_load4(unsigned dst, const void *map, unsigned bar, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, { %2, %3, %4, %5 }], [%6];\n"
               :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar) : "memory");
}

// ---- a bulk copy of `bytes` (a multiple of 16, both ends 16-byte aligned)
// of global memory into shared memory, counted on barrier `bar` ----
__device__ __forceinline__ void bulk_load(unsigned dst, const void *src, unsigned bytes, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// ---- bulk reduce-adds: `bytes` (a multiple of 16, both ends 16-byte
// aligned) of float32 in shared memory added into global memory by the
// TMA unit; a thread's groups of them, committed, are waited for until
// they have read shared memory (bulk_wait_read) or completed (bulk_wait),
// all but the N most recent ----
__device__ __forceinline__ void bulk_reduce_add_f32(float *dst, unsigned src, unsigned bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
               :: "l"(dst), "r"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N = 0> __device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" :: "n"(N) : "memory");
}
template <int N = 0> __device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" :: "n"(N) : "memory");
}
// Orders the TMA unit's accesses of global memory with this thread's own
// (both ways): after a bulk_wait, before a release; after an acquire,
// before the next bulk operation.
__device__ __forceinline__ void fence_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }
__device__ __forceinline__ void st_shared_v2_f32(unsigned a, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], { %1, %2 };\n" :: "r"(a), "f"(x), "f"(y) : "memory");
}

// ---- registers moved between warpgroups ----
template <int N> __device__ __forceinline__ void regs_up() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(N));
}
template <int N> __device__ __forceinline__ void regs_down() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(N));
}

// ---- named barriers: ids 1.. (0 is __syncthreads') ----
__device__ __forceinline__ void bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}

{%
  -- The forms, checked: an 8-bit type's K is 32 and it has no transpose.
  local K_OF = { f16 = 16, bf16 = 16, e4m3 = 32, e5m2 = 32 }
  local BYTE = { e4m3 = true, e5m2 = true }
  local any_byte = false
  for _, f in ipairs(forms) do
    local what = ("wgmma.cuh: form { t = %s, n = %s, a = %s, tb = %s, ta = %s, k = %s }")
      :format(tostring(f.t), tostring(f.n), tostring(f.a), tostring(f.tb or 0), tostring(f.ta or 0), tostring(f.k or K_OF[f.t]))
    if not K_OF[f.t] then
      refuse(what .. ": the types are f16, bf16, e4m3 and e5m2")
    end
    if (f.k or K_OF[f.t]) ~= K_OF[f.t] then
      refuse(("%s: %s takes k %d (32 bytes of the element)"):format(what, f.t, K_OF[f.t]))
    end
    if BYTE[f.t] and ((f.tb or 0) ~= 0 or (f.ta or 0) ~= 0) then
      refuse(("%s: %s operands have no transpose (K-major only; tb and ta must be 0)"):format(what, f.t))
    end
    any_byte = any_byte or BYTE[f.t] or false
  end
%}
{% if any_byte then %}
// ---- 8-bit elements (the forms include e4m3 or e5m2) ----
// Byte offset of 1-byte element (r, c) in a 128-byte-swizzled panel (c < 128).
__device__ __forceinline__ unsigned sw128_b8(int r, int c) {
  return (unsigned)(r * 128 + ((((c >> 4) ^ (r & 7)) << 4) | (c & 15)));
}
{%   for _, t in ipairs({ "e4m3", "e5m2" }) do %}
// Four floats as four {{ t }} bytes of one register, x0 in the lowest byte:
// rounded to nearest even, saturated to the largest finite value (NaN stays
// NaN).  cvt's .{{ t }}x2 puts its first source in the upper byte.
__device__ __forceinline__ unsigned pack4_{{ t }}(float x0, float x1, float x2, float x3) {
  unsigned r;
  asm("{ .reg .b16 lo, hi;\n"
      "cvt.rn.satfinite.{{ t }}x2.f32 lo, %2, %1;\n"
      "cvt.rn.satfinite.{{ t }}x2.f32 hi, %4, %3;\n"
      "mov.b32 %0, { lo, hi }; }\n"
      : "=r"(r) : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
  return r;
}
{%   end %}

{% end %}
{%
  -- wgmma.mma_async m64nNkK with f32 accumulators d[N / 16][8] (register
  -- i of the instruction is d[i / 8][i % 8]); scale_d 0 overwrites d.  The
  -- transpose immediates follow the scales for the 16-bit types only.
  local function operands(n, first)
    local out = {}
    for i = 0, n // 2 - 1 do out[#out + 1] = "%" .. (first + i) end
    return table.concat(out, ", ")
  end
  local function outputs(n)
    local out = {}
    for i = 0, n // 2 - 1 do out[#out + 1] = ('"+f"(d[%d][%d])'):format(i // 8, i % 8) end
    return table.concat(out, ", ")
  end
%}
{% for _, f in ipairs(forms) do %}
{%   local N, R, K = f.n, f.n // 2, K_OF[f.t] %}
{%   local ss_trans = BYTE[f.t] and "" or (", %d, %d"):format(f.ta or 0, f.tb or 0) %}
{%   local rs_trans = BYTE[f.t] and "" or (", %d"):format(f.tb or 0) %}
{%   if f.a == "ss" then %}
__device__ __forceinline__ void wg_ss_{{ f.t }}_{{ N }}{{ f.ta == 1 and "_tt" or f.tb == 1 and "_t" or "" }}(float (&d)[{{ N // 16 }}][8], unsigned long long da, unsigned long long db, int scale_d) {
  asm volatile("{ .reg .pred p; setp.ne.b32 p, %{{ R + 2 }}, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n{{ N }}k{{ K }}.f32.{{ f.t }}.{{ f.t }} { {{ operands(N, 0) }} }, %{{ R }}, %{{ R + 1 }}, p, 1, 1{{ ss_trans }}; }\n"
               : {{ outputs(N) }}
               : "l"(da), "l"(db), "r"(scale_d));
}
{%   else %}
__device__ __forceinline__ void wg_rs_{{ f.t }}_{{ N }}{{ f.tb == 1 and "_t" or "" }}(float (&d)[{{ N // 16 }}][8], const unsigned (&a)[4], unsigned long long db, int scale_d) {
  asm volatile("{ .reg .pred p; setp.ne.b32 p, %{{ R + 5 }}, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n{{ N }}k{{ K }}.f32.{{ f.t }}.{{ f.t }} { {{ operands(N, 0) }} }, { %{{ R }}, %{{ R + 1 }}, %{{ R + 2 }}, %{{ R + 3 }} }, %{{ R + 4 }}, p, 1, 1{{ rs_trans }}; }\n"
               : {{ outputs(N) }}
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}
{%   end %}
{% end %}

}  // namespace fj
