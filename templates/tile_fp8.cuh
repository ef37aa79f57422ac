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
  The including template passes THREADS, S, tile_n, head_dim (as the
  variant), paged, BMASK and sm (>= 89: the hardware's e4m3x2 conversion;
  below it, the same values by bit arithmetic).
#}
{% local C8 = head_dim // 16 %}
{% local XW8 = 1 %}
{% while XW8 < 8 and C8 % (XW8 * 2) == 0 do XW8 = XW8 * 2 end %}
{% local XM8 = XW8 - 1 %}
namespace fj {

// Byte offset of 16-byte chunk c of row r in an FP8 slot.
__device__ __forceinline__ int off8(int r, int c) {
  return r * {{ head_dim }} + ((c ^ (r & {{ XM8 }})) << 4);
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

// One 16-byte chunk i of rows r0 .. of an FP8 slot, loaded (dequant_rows's
// order: rows r0 + i % 8 + 8 k of chunk i / 8 % {{ C8 }}, eight rows of one chunk
// a quarter-warp, whose loads and stores then fall in distinct banks).
__device__ __forceinline__ uint4 chunk8_load(const unsigned char *src, int r0, int i) {
  return *reinterpret_cast<const uint4 *>(src + off8(r0 + i % 8 + 8 * (i / {{ 8 * C8 }}), i / 8 % {{ C8 }}));
}

// Chunk i of chunk8_load (raw) converted into its place in a 16-bit tile.
__device__ __forceinline__ void chunk8_store(elem_t *dst, int r0, int i, uint4 raw) {
  const int r = r0 + i % 8 + 8 * (i / {{ 8 * C8 }}), c = i / 8 % {{ C8 }};
  const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
  unsigned o[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) o[e] = e4m3x2_to_elem2((unsigned short)(w[e / 2] >> (16 * (e % 2))));
  *reinterpret_cast<uint4 *>(dst + tile_off(r, c * 16)) = make_uint4(o[0], o[1], o[2], o[3]);
  *reinterpret_cast<uint4 *>(dst + tile_off(r, c * 16 + 8)) = make_uint4(o[4], o[5], o[6], o[7]);
}

// Rows r0 .. r0 + ROWS - 1 of one or two FP8 slots (src0, src1; src1
// NULL: one) as the same rows of 16-bit tiles (dst0, dst1), by NT
// threads, this one number tid, which takes chunks tid, tid + NT, ...
// (chunk8_load's order).  Every load is issued before the first
// conversion, so their latencies overlap; the registers hold them all.
// r0 is a multiple of 8.
template <int ROWS, int NT>
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
      chunk8_store(dst0, r0, tid + n * NT, raw[0][n]);
      if (src1) chunk8_store(dst1, r0, tid + n * NT, raw[1][n]);
    }
}

// A whole FP8 slot as a 16-bit tile by the block, a chunk at a time (where
// registers are scarce: the 32-row warps of prefill tiles).
__device__ __forceinline__ void dequant_tile(elem_t *dst, const unsigned char *src) {
  for (int i = threadIdx.x; i < {{ tile_n * C8 }}; i += {{ THREADS }}) chunk8_store(dst, 0, i, chunk8_load(src, 0, i));
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
  dequant_tile(s_k, k8 + (t % {{ S }}) * {{ tile_n * head_dim }});
  dequant_tile(s_v, v8 + (t % {{ S }}) * {{ tile_n * head_dim }});
  __syncthreads();
}

}  // namespace fj
