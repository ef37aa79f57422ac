{#
  tile_fp8.cuh: FP8 (e4m3) K and V on the cp.async ring of the mma family,
  for 16-bit queries over an FP8 KV cache.  Included after tile_io.cuh
  (KvSrc, tile_off, cp_async16), only with 2 or more stages.

  Contract.  Key tile t of K (or V) lands as FP8 rows in slot t % S of a
  ring of S slots (tile_n rows of head_dim bytes, no padding), issued by
  every thread of the block with cp.async (one group a tile, committed by
  the caller), half the bytes of a 16-bit ring.  Once the caller has waited
  for the group and synchronised the block, dequant_rows (all loads in
  flight at once) or dequant_tile (a chunk at a time) converts rows of the
  slot into a 16-bit tile of the layout the products read
  (tile_io.cuh's tile_off: padded or XOR-swizzled), exactly (every e4m3
  value is an f16 and a bf16); the descales stay outside (K's in the
  softmax scale, V's in the epilogue).  The caller synchronises the threads
  that converted rows with those that read them before the products: the
  block, or one warp where a warp reads only the rows it converted (the
  mma family's warps that split the keys).  Shared memory: the two FP8
  rings (2 S tile_n head_dim bytes) beside the 16-bit tiles the products
  read.  Both sides are laid out so that a quarter-warp's 16-byte accesses
  fall in distinct banks: an FP8 row's chunk c is stored at c ^ (row &
  XM8) (XM8 + 1 the largest power of two, at most 8, dividing the row's
  chunks), and the conversions take eight rows of one chunk at a time
  (chunk8_load's order).
  Under bf16 queries the products may run in f16 (H16): K's and V's
  tiles are then f16 (one conversion instruction a pair instead of four),
  and q_to_f16 turns Q's bf16 tile into f16 times a power of two, exactly
  wherever the scaled value is an f16 normal.
  The including template passes THREADS, S, H16, PF (paged rows' page numbers read a tile
  ahead: tile_pages8, ring8_paged), tile_n, head_dim (as the variant),
  paged, BMASK and sm (>= 89: the hardware's e4m3x2 conversion;
  below it, the same values by bit arithmetic).
  REGS (the mma family's 16-row decode tiles whose warps split the keys:
  attention_mma.cu): no 16-bit tiles; the products read the ring itself
  by ldmatrix, K non-transposed (k8_pair) and V transposed (v8_pair), and
  convert the bytes in registers, one e4m3x2 conversion a pair (f16: both
  products run in f16).  ldmatrix reads eight rows' 16-byte pieces of one
  chunk at once, so the ring's swizzle puts any eight consecutive rows
  (from a multiple of 8) of one chunk in distinct banks: with fewer than 8
  chunks a row (a power of two), chunk c of row r is stored at c ^ ((r /
  (8 / chunks)) % chunks) -- the rows that share a 128-byte line differ
  in r's low bits, the others in the XOR -- else as above.  Q's tile is
  permuted within every 16-column block to match K's registers (q_to_f16,
  q_perm).
#}
{% local C8 = head_dim // 16 %}
{% local XW8 = 1 %}
{% while XW8 < 8 and C8 % (XW8 * 2) == 0 do XW8 = XW8 * 2 end %}
{% local XM8 = XW8 - 1 %}
{% local XS8 = 0 %}
{% if REGS and C8 < 8 and XW8 == C8 then %}
{%   XS8 = ({ [1] = 3, [2] = 2, [4] = 1 })[C8] %}
{% end %}
namespace fj {

// Byte offset of 16-byte chunk c of row r in an FP8 slot.
__device__ __forceinline__ int off8(int r, int c) {
{% if XS8 > 0 then %}
  return r * {{ head_dim }} + ((c ^ ((r >> {{ XS8 }}) & {{ XM8 }})) << 4);
{% else %}
  return r * {{ head_dim }} + ((c ^ (r & {{ XM8 }})) << 4);
{% end %}
}

// Two e4m3 values (the first in the low byte) as an f16 pair, exactly.
__device__ __forceinline__ unsigned e4m3x2_to_f16x2(unsigned short x) {
{% if sm >= 89 then %}
  unsigned h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(x));
  return h;
{% else %}
  // Each byte's 7 magnitude bits placed 7 bits up are an f16 whose value
  // is the e4m3 value / 256 (the exponents' biases differ by 8; an e4m3
  // subnormal becomes an f16 subnormal), so one multiplication by 256
  // makes it exact; the sign moves to bit 15.
  const unsigned v = __byte_perm((unsigned)x, 0u, 0x1404);  // byte b at bits 16 b + 8
  const unsigned h = ((v >> 1) & 0x3fff3fffu) | (v & 0x80008000u);
  const __half2 r = __hmul2(*reinterpret_cast<const __half2 *>(&h), __half2(__float2half(256.f), __float2half(256.f)));
  return *reinterpret_cast<const unsigned *>(&r);
{% end %}
}

{% if REGS then %}
// Four e4m3 values (a register of an ldmatrix of FP8 bytes) as two f16
// pairs: bytes 0-1 (lo) and 2-3 (hi).
__device__ __forceinline__ void e4m3x4_to_f16x2x2(unsigned w, unsigned &lo, unsigned &hi) {
{% if sm >= 89 then %}
  // The halves named in PTX, so that the conversion reads the high one in
  // place (no shift before it).
  asm("{ .reg .b16 l, h;\n"
      "  mov.b32 {l, h}, %2;\n"
      "  cvt.rn.f16x2.e4m3x2 %0, l;\n"
      "  cvt.rn.f16x2.e4m3x2 %1, h; }" : "=r"(lo), "=r"(hi) : "r"(w));
{% else %}
  lo = e4m3x2_to_f16x2((unsigned short)w);
  hi = e4m3x2_to_f16x2((unsigned short)(w >> 16));
{% end %}
}

// One 16-dim block of 16 keys of FP8 K as an mma B operand (the K-style
// b[4] of mma_frag.cuh's mma_tile), from ldmatrix (non-transposed) of its
// keys 0-7 (r0) and 8-15 (r1).  Lane (g, t) = (l / 4, l % 4) holds in r0
// key g's dims 4t .. 4t + 3 (the PTX ISA's ldmatrix: stored 16-bit units
// 2t, 2t + 1 of row g); the B operand's register 0 is (k 2t, 2t + 1) and
// register 1 (k 2t + 8, 2t + 9) (lut.lua's fp8_b_isa checks the probed
// table is so).  So B's logical k 2t + e holds dim 4t + e and 2t + 8 + e
// dim 4t + 2 + e: Q's tile is stored in that order (q_perm16).
__device__ __forceinline__ void k8_pair(unsigned b[4], unsigned r0, unsigned r1) {
  e4m3x4_to_f16x2x2(r0, b[0], b[1]);
  e4m3x4_to_f16x2x2(r1, b[2], b[3]);
}

// One 16-dim block of 16 keys of FP8 V as the mma B operand of two n8
// tiles (V-style b[4]), from ldmatrix.trans of its keys 0-7 (r0) and 8-15
// (r1).  Lane (g, t) holds in r0 the 16-bit units (key 2t, unit g) and
// (key 2t + 1, unit g): bytes V[2t][2g], V[2t][2g + 1], V[2t + 1][2g],
// V[2t + 1][2g + 1].  One byte permutation pairs the keys; B register 0
// (k 2t, 2t + 1 of column g) then takes dim 2g for the first n8 tile (b[0],
// b[1]) and dim 2g + 1 for the second (b[2], b[3]): O's column c of the
// tile's first 8 is dim 2c, of the second 8 dim 2c + 1 (lut.lua's
// fp8_v_cols, the epilogue's ocols).
__device__ __forceinline__ void v8_pair(unsigned b[4], unsigned r0, unsigned r1) {
  e4m3x4_to_f16x2x2(__byte_perm(r0, 0u, 0x3120), b[0], b[2]);
  e4m3x4_to_f16x2x2(__byte_perm(r1, 0u, 0x3120), b[1], b[3]);
}

// ldmatrix of two 8x8 matrices (lanes 0-15 name their rows): a 16-dim
// block's keys 0-7 and 8-15 where the head dim has an odd number of them.
__device__ __forceinline__ void ldsm_x2(unsigned r[2], unsigned a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 { %0, %1 }, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}
__device__ __forceinline__ void ldsm_x2_t(unsigned r[2], unsigned a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 { %0, %1 }, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}

// A 16-column block of Q's tile (its two 16-byte chunks a, b: columns 0-7
// and 8-15, 16-bit) in k8_pair's order: logical columns 2t, 2t + 1 take
// dims 4t, 4t + 1 (chunk a), 2t + 8, 2t + 9 dims 4t + 2, 4t + 3 (chunk b).
__device__ __forceinline__ void q_perm16(uint4 &a, uint4 &b) {
  const uint4 x = a, y = b;
  a = make_uint4(x.x, x.z, y.x, y.z);
  b = make_uint4(x.y, x.w, y.y, y.w);
}

// Q's tile (ROWS rows of head_dim 16-bit elements at tile_off's places)
// permuted in place (q_perm16), for f16 queries (bf16 ones are permuted by
// q_to_f16).  Every thread of the block calls it once Q has landed and
// the block has synchronised; it synchronises the block before it returns.
template <int ROWS>
__device__ __forceinline__ void q_perm(elem_t *s_q) {
  constexpr int BL = {{ head_dim // 16 }};  // 16-column blocks a row
  for (int i = threadIdx.x; i < ROWS * BL; i += {{ THREADS }}) {
    uint4 *const a = reinterpret_cast<uint4 *>(s_q + tile_off(i / BL, i % BL * 16));
    uint4 *const b = reinterpret_cast<uint4 *>(s_q + tile_off(i / BL, i % BL * 16 + 8));
    uint4 x = *a, y = *b;
    q_perm16(x, y);
    *a = x;
    *b = y;
  }
  __syncthreads();
}

{% end %}
// Two e4m3 values as an elem_t pair.
__device__ __forceinline__ unsigned e4m3x2_to_elem2(unsigned short x) {
{% if dtype == "f16" then %}
  return e4m3x2_to_f16x2(x);
{% else %}
  const unsigned h = e4m3x2_to_f16x2(x);
  const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&h));
  const elem2_t e = __floats2bfloat162_rn(f.x, f.y);
  return *reinterpret_cast<const unsigned *>(&e);
{% end %}
}

// Key tile t of one head's FP8 K or V into its slot of an FP8 ring: rows
// at or past `rows` become zeros{{ paged and "; a paged row's page is found through the table" or "" }}.
{% local PER8 = THREADS // C8 %}
{% if THREADS % C8 == 0 and tile_n % PER8 == 0 then %}
// Thread i copies chunk i % {{ C8 }} of rows i / {{ C8 }} + {{ PER8 }} n{{ paged and " (its pages read first, all at once)" or "" }}.
__device__ __forceinline__ void ring8_load(unsigned char *ring8, const KvSrc &s, int t, int rows) {
  constexpr int N = {{ tile_n // PER8 }};
  const int r = threadIdx.x / {{ C8 }}, c = threadIdx.x % {{ C8 }};
  unsigned char *dst = ring8 + (t % {{ S }}) * {{ tile_n * head_dim }};
  const int row0 = {{ BMASK and "list_n0(s.list, t)" or ("t * " .. tile_n) }};
{%   if paged then %}
  int page[N];
#pragma unroll
  for (int n = 0; n < N; ++n) {
    const int j = row0 + r + n * {{ PER8 }};
    page[n] = j < rows ? s.page_of(s.first + j) : -1;
  }
#pragma unroll
  for (int n = 0; n < N; ++n) {
    const kv_t *src = s.row(s.first + row0 + r + n * {{ PER8 }}, page[n] < 0 ? 0 : page[n]);
    cp_async16(dst + off8(r + n * {{ PER8 }}, c), page[n] >= 0 ? src + c * 16 : s.base, page[n] >= 0 ? 16 : 0);
  }
{%   else %}
  const kv_t *g = s.base + (long long)(row0 + r) * s.stride + c * 16;
#pragma unroll
  for (int n = 0; n < N; ++n) {
    const bool in = row0 + r + n * {{ PER8 }} < rows;
    cp_async16(dst + off8(r + n * {{ PER8 }}, c), in ? g : s.base, in ? 16 : 0);
    g += s.stride * {{ PER8 }};
  }
{%   end %}
}
{% else %}
// Thread i copies chunks i, i + {{ THREADS }}, ... of the tile's {{ C8 }} a row.
__device__ __forceinline__ void ring8_load(unsigned char *ring8, const KvSrc &s, int t, int rows) {
  unsigned char *dst = ring8 + (t % {{ S }}) * {{ tile_n * head_dim }};
  const int row0 = {{ BMASK and "list_n0(s.list, t)" or ("t * " .. tile_n) }};
  for (int i = threadIdx.x; i < {{ tile_n * C8 }}; i += {{ THREADS }}) {
    const int r = i / {{ C8 }}, c = i % {{ C8 }}, j = row0 + r;
    const bool in = j < rows;
{%   if paged then %}
    const kv_t *src = s.row(s.first + j, in ? s.page_of(s.first + j) : 0) + c * 16;
{%   else %}
    const kv_t *src = s.base + (long long)j * s.stride + c * 16;
{%   end %}
    cp_async16(dst + off8(r, c), in ? src : s.base, in ? 16 : 0);
  }
}
{% end %}

{% if PF then %}
{%   local P8, RPW = THREADS // C8, 32 // C8 %}
{%   local NP = tile_n // P8 %}
// Paged FP8 rows on the pipelined ring (PF), as tile_io.cuh's 16-bit ones:
// a tile's page numbers are read a tile before its copies are issued, so
// no copy waits on the block table, and K and V share them.  Thread i
// copies chunk i % {{ C8 }} of rows i / {{ C8 }} + {{ P8 }} n; lane l of warp w holds
// the page of row {{ RPW }} w + l % {{ RPW }} + {{ P8 }} (l / {{ RPW }}) of its tile (the rows warp
// w's threads copy), -1 past `rows`.
__device__ __forceinline__ int tile_pages8(const KvSrc &s, int t, int rows) {
  const int lane = threadIdx.x % 32, n = lane / {{ RPW }};
  const int j = t * {{ tile_n }} + (threadIdx.x / 32) * {{ RPW }} + lane % {{ RPW }} + n * {{ P8 }};
  return n < {{ NP }} && j < rows ? s.page_of(s.first + j) : -1;
}

// Tile t of one head's paged FP8 K or V into its ring slot, each row's page
// taken from the lane that holds it (tile_pages8).
__device__ __forceinline__ void ring8_paged(unsigned char *ring8, const KvSrc &s, int t, int pages) {
  const int r = threadIdx.x / {{ C8 }}, c = threadIdx.x % {{ C8 }}, sub = (threadIdx.x % 32) / {{ C8 }};
  unsigned char *dst = ring8 + (t % {{ S }}) * {{ tile_n * head_dim }};
#pragma unroll
  for (int n = 0; n < {{ NP }}; ++n) {
    const int page = __shfl_sync(0xffffffffu, pages, n * {{ RPW }} + sub);
    const kv_t *src = s.row(s.first + t * {{ tile_n }} + r + n * {{ P8 }}, page < 0 ? 0 : page);
    cp_async16(dst + off8(r + n * {{ P8 }}, c), page >= 0 ? src + c * 16 : s.base, page >= 0 ? 16 : 0);
  }
}
{% end %}

// One 16-byte chunk i of rows r0 .. of an FP8 slot, loaded (dequant_rows's
// order: rows r0 + i % 8 + 8 k of chunk i / 8 % {{ C8 }}, eight rows of one chunk
// a quarter-warp, whose loads and stores then fall in distinct banks).
__device__ __forceinline__ uint4 chunk8_load(const unsigned char *src, int r0, int i) {
  return *reinterpret_cast<const uint4 *>(src + off8(r0 + i % 8 + 8 * (i / {{ 8 * C8 }}), i / 8 % {{ C8 }}));
}

// Chunk i of chunk8_load (raw) converted into its place in a 16-bit tile:
// elem_t, or f16 where H (the products in f16 under bf16 queries: H16).
template <bool H = false>
__device__ __forceinline__ void chunk8_store(elem_t *dst, int r0, int i, uint4 raw) {
  const int r = r0 + i % 8 + 8 * (i / {{ 8 * C8 }}), c = i / 8 % {{ C8 }};
  const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
  unsigned o[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const unsigned short x = (unsigned short)(w[e / 2] >> (16 * (e % 2)));
    o[e] = H ? e4m3x2_to_f16x2(x) : e4m3x2_to_elem2(x);
  }
  *reinterpret_cast<uint4 *>(dst + tile_off(r, c * 16)) = make_uint4(o[0], o[1], o[2], o[3]);
  *reinterpret_cast<uint4 *>(dst + tile_off(r, c * 16 + 8)) = make_uint4(o[4], o[5], o[6], o[7]);
}

// Rows r0 .. r0 + ROWS - 1 of one or two FP8 slots (src0, src1; src1
// NULL: one) as the same rows of 16-bit tiles (dst0, dst1), by NT
// threads, this one number tid, which takes chunks tid, tid + NT, ...
// (chunk8_load's order).  Every load is issued before the first
// conversion, so their latencies overlap; the registers hold them all.
// r0 is a multiple of 8.  H: both tiles f16 (chunk8_store's H).
template <int ROWS, int NT, bool H = false>
__device__ __forceinline__ void dequant_rows(elem_t *dst0, const unsigned char *src0, elem_t *dst1,
                                             const unsigned char *src1, int r0, int tid) {
  constexpr int ALL = ROWS * {{ C8 }}, N = (ALL + NT - 1) / NT;
  static_assert(ROWS % 8 == 0, "whole groups of eight rows");
  uint4 raw[2][N];
#pragma unroll
  for (int n = 0; n < N; ++n)
    if (ALL % NT == 0 || tid + n * NT < ALL) {
      raw[0][n] = chunk8_load(src0, r0, tid + n * NT);
      if (src1) raw[1][n] = chunk8_load(src1, r0, tid + n * NT);
    }
#pragma unroll
  for (int n = 0; n < N; ++n)
    if (ALL % NT == 0 || tid + n * NT < ALL) {
      chunk8_store<H>(dst0, r0, tid + n * NT, raw[0][n]);
      if (src1) chunk8_store<H>(dst1, r0, tid + n * NT, raw[1][n]);
    }
}

// A whole FP8 slot as a 16-bit tile by the block, a chunk at a time (where
// registers are scarce: the 32-row warps of prefill tiles); f16 where H.
template <bool H = false>
__device__ __forceinline__ void dequant_tile(elem_t *dst, const unsigned char *src) {
  for (int i = threadIdx.x; i < {{ tile_n * C8 }}; i += {{ THREADS }}) chunk8_store<H>(dst, 0, i, chunk8_load(src, 0, i));
}

// After Q's copies have been issued (the ring without the software
// pipeline): tiles 0 .. {{ S - 2 }} of K and V in flight, one cp.async
// group each (empty groups keep the count uniform), and Q landed.
__device__ __forceinline__ void kv_start8(unsigned char *k8, unsigned char *v8, const KvSrc &k,
                                          const KvSrc &v, int rows, int ntiles) {
  cp_async_commit();  // Q's group
#pragma unroll
  for (int t = 0; t < {{ S - 1 }}; ++t) {
    if (t < ntiles) {
      ring8_load(k8, k, t, rows);
      ring8_load(v8, v, t, rows);
    }
    cp_async_commit();
  }
  cp_async_wait<{{ S - 1 }}>();
}

// Key tile t's K and V as 16-bit tiles (s_k, s_v), visible to the whole
// block: tile t + {{ S - 1 }} is started into the slots tile t - 1 left (converted
// last iteration), tile t waited for and converted.  The caller
// synchronises before the next call overwrites s_k and s_v.
__device__ __forceinline__ void kv_ready8(elem_t *s_k, elem_t *s_v, unsigned char *k8, unsigned char *v8,
                                          const KvSrc &k, const KvSrc &v, int rows, int t, int ntiles) {
  const int nt = t + {{ S - 1 }};
  if (nt < ntiles) {
    ring8_load(k8, k, nt, rows);
    ring8_load(v8, v, nt, rows);
  }
  cp_async_commit();
  cp_async_wait<{{ S - 1 }}>();
  __syncthreads();
  dequant_tile<{{ H16 and "true" or "false" }}>(s_k, k8 + (t % {{ S }}) * {{ tile_n * head_dim }});
  dequant_tile<{{ H16 and "true" or "false" }}>(s_v, v8 + (t % {{ S }}) * {{ tile_n * head_dim }});
  __syncthreads();
}

{% if H16 then %}
// Q's tile (ROWS rows of head_dim bf16 at tile_off's places) as f16 in
// place, times 2^e: e brings its largest finite magnitude into [2^14,
// 2^15), so every value keeps its bits wherever the scaled value is an
// f16 normal (at least 2^-14: 2^-29 of the largest or more; the rest
// round as f16 subnormals), inf and NaN stay what they are.  Returns
// 2^-e (e at most 64, so that the score scale stays a float normal: a
// tile of zeros gives 2^-64), for the score scale: (2^e q) . k times 2^-e is q . k exactly, a power of two
// scaling each product and sum.  Every thread of the block calls it once
// Q has landed and the block has synchronised; red holds a float a warp;
// it synchronises the block before it returns.
template <int ROWS>
__device__ __forceinline__ float q_to_f16(elem_t *s_q, float *red) {
  constexpr int CH = {{ head_dim // 8 }};  // 16-byte chunks a row
  const float inf = __uint_as_float(0x7f800000u);
  float mx = 0.f;
  for (int i = threadIdx.x; i < ROWS * CH; i += {{ THREADS }}) {
    const uint4 x = *reinterpret_cast<const uint4 *>(s_q + tile_off(i / CH, i % CH * 8));
    const unsigned w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // a bf16 is a float's high half
      const float lo = fabsf(__uint_as_float(w[j] << 16)), hi = fabsf(__uint_as_float(w[j] & 0xffff0000u));
      mx = fmaxf(mx, fmaxf(lo < inf ? lo : 0.f, hi < inf ? hi : 0.f));
    }
  }
  mx = warp_max(mx);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = mx;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < {{ THREADS // 32 }}; ++w) mx = fmaxf(mx, red[w]);
  const int e = mx > 0.f ? min(14 - ((int)(__float_as_uint(mx) >> 23) - 127), 64) : 64;
  const float up = __uint_as_float((unsigned)(e + 127) << 23);
{% if REGS then %}
  // Each 16-column block's two chunks at once, permuted (q_perm16).
  for (int i = threadIdx.x; i < ROWS * CH / 2; i += {{ THREADS }}) {
    uint4 *const at0 = reinterpret_cast<uint4 *>(s_q + tile_off(i / (CH / 2), i % (CH / 2) * 16));
    uint4 *const at1 = reinterpret_cast<uint4 *>(s_q + tile_off(i / (CH / 2), i % (CH / 2) * 16 + 8));
    uint4 c[2] = {*at0, *at1};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      unsigned w[4] = {c[h].x, c[h].y, c[h].z, c[h].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const __half2 f = __floats2half2_rn(__uint_as_float(w[j] << 16) * up, __uint_as_float(w[j] & 0xffff0000u) * up);
        w[j] = *reinterpret_cast<const unsigned *>(&f);
      }
      c[h] = make_uint4(w[0], w[1], w[2], w[3]);
    }
    q_perm16(c[0], c[1]);
    *at0 = c[0];
    *at1 = c[1];
  }
{% else %}
  for (int i = threadIdx.x; i < ROWS * CH; i += {{ THREADS }}) {
    uint4 *const at = reinterpret_cast<uint4 *>(s_q + tile_off(i / CH, i % CH * 8));
    const uint4 x = *at;
    unsigned w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const __half2 h = __floats2half2_rn(__uint_as_float(w[j] << 16) * up, __uint_as_float(w[j] & 0xffff0000u) * up);
      w[j] = *reinterpret_cast<const unsigned *>(&h);
    }
    *at = make_uint4(w[0], w[1], w[2], w[3]);
  }
{% end %}
  __syncthreads();
  return __uint_as_float((unsigned)(127 - e) << 23);
}
{% end %}

}  // namespace fj
