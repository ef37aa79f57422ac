{#
  tile_io.cuh: global -> shared copies of Q, K and V tiles, shared by the
  attention families.  The including template passes
    LD      the row stride of a shared tile in elements (padding included),
    XM      the XOR mask of the "xor" swizzle (chunk c of row r is stored at
            c ^ (r & XM)),
    THREADS the block's threads, S the stages (> 1: cp.async), fp8 (K/V in
            e4m3: with 1 stage dequantised as they load; with more, the
            ring's loads are tile_fp8.cuh's), BMASK (key tile t is tile t
            of a block mask's list, KvSrc.list: block.cuh), PF (paged K/V on the plain
            ring: page numbers read a tile ahead, shared by K and V;
            PF_TPR threads copy a row; PF_WIDE: a warp a row, for rows of
            more than 32 chunks), VK (V is K's tile: MLA's latent
            rows, whose first columns are V; kv_start and kv_ready load K
            alone), PADC (or nil: none) the chunks of a tile row where
            they are more than head_dim's (a head dim padded to the
            products' columns: zero_pad fills the rest with zeros).
  A row holds head_dim elements, head_dim / 8 chunks of 16 bytes; the
  loads write those alone, whatever a tile row's width.
  K and V move through rings of S slots of tile_n rows: key tile t lives in
  slot t % S.  kv_start and kv_ready run the plain ring (K and V of a tile
  together); ring_load serves templates that schedule K and V apart.  A
  KvSrc says where one head's key rows are: rows of one stride, or (paged)
  tokens of pages found through a row of the block table.
#}
{% local CHUNKS = head_dim // 8 %}
namespace fj {

// Element offset of (r, c) in a Q, K or V tile.
__device__ __forceinline__ int tile_off(int r, int c) {
{% if swizzle == "xor" then %}
  return r * {{ LD }} + ((((c >> 3) ^ (r & {{ XM }})) << 3) | (c & 7));
{% else %}
  return r * {{ LD }} + c;
{% end %}
}
{% if S > 1 then %}

// 16-byte global -> shared copy; src_bytes 0 writes zeros (sequence tails).
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(s), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
}
{% end %}

// One 16-byte chunk of a tile row: from g where `in`, else zeros (sequence
// tails).  `any` is an address that may be read: the copy of nothing still
// names one.
__device__ __forceinline__ void copy16(elem_t *d, const elem_t *g, const elem_t *any, bool in) {
{% if S > 1 then %}
  cp_async16(d, in ? g : any, in ? 16 : 0);
{% else %}
  (void)any;
  uint4 val = make_uint4(0u, 0u, 0u, 0u);
  if (in) val = *reinterpret_cast<const uint4 *>(g);
  *reinterpret_cast<uint4 *>(d) = val;
{% end %}
}

{% if PADC and PADC > CHUNKS then %}
// The pad of `rows` tile rows (chunks {{ CHUNKS }} .. {{ PADC - 1 }} of each: the head
// dim rounded up to the products' columns) as zeros.  Called once before
// the first loads, which never write it; the caller's next barrier makes
// it visible.
__device__ __forceinline__ void zero_pad(elem_t *dst, int rows) {
  for (int i = threadIdx.x; i < rows * {{ PADC - CHUNKS }}; i += {{ THREADS }}) {
    const int r = i / {{ PADC - CHUNKS }}, c = {{ CHUNKS }} + i % {{ PADC - CHUNKS }};
    *reinterpret_cast<uint4 *>(dst + tile_off(r, c * 8)) = make_uint4(0u, 0u, 0u, 0u);
  }
}

{% end %}
// Copies rows [row0, row0 + ROWS) of one head (row stride `stride`
// elements) into a shared tile; rows at or past `rows` become zeros.
{% local PER = THREADS // CHUNKS %}
{% if THREADS % CHUNKS == 0 and (swizzle ~= "xor" or PER % (XM + 1) == 0) then %}
// Thread i copies chunk i % {{ CHUNKS }} of rows i / {{ CHUNKS }} + {{ PER }} n: a row's swizzle
// repeats every {{ PER }} rows, so every copy after the first is a constant
// offset in shared memory and a pointer step in global memory.
template <int ROWS>
__device__ __forceinline__ void load_tile(elem_t *dst, const elem_t *src, long long stride,
                                          int row0, int rows) {
  const int r = threadIdx.x / {{ CHUNKS }}, c = threadIdx.x % {{ CHUNKS }};
  elem_t *d = dst + tile_off(r, c * 8);
  const elem_t *g = src + (long long)(row0 + r) * stride + c * 8;
  const long long step = stride * {{ PER }};
#pragma unroll
  for (int n = 0; n < (ROWS + {{ PER - 1 }}) / {{ PER }}; ++n) {
    if (ROWS % {{ PER }} != 0 && r + n * {{ PER }} >= ROWS) break;
    const bool in = row0 + r + n * {{ PER }} < rows;
    copy16(d + n * {{ PER * LD }}, g, src, in);
    g += step;
  }
}
{% elseif CHUNKS > 32 then %}
// Rows wider than a warp's chunks (head dims above 256): warp w copies
// rows w, w + {{ THREADS // 32 }}, ..., its lanes a row's chunks (no division per chunk).
template <int ROWS>
__device__ __forceinline__ void load_tile(elem_t *dst, const elem_t *src, long long stride,
                                          int row0, int rows) {
  const int lane = threadIdx.x % 32;
#pragma unroll 1
  for (int r = threadIdx.x / 32; r < ROWS; r += {{ THREADS // 32 }}) {
    const bool in = row0 + r < rows;
    const elem_t *g = src + (long long)(row0 + r) * stride;
#pragma unroll
    for (int c = lane; c < {{ CHUNKS }}; c += 32) copy16(dst + tile_off(r, c * 8), g + c * 8, src, in);
  }
}
{% else %}
template <int ROWS>
__device__ __forceinline__ void load_tile(elem_t *dst, const elem_t *src, long long stride,
                                          int row0, int rows) {
  for (int i = threadIdx.x; i < ROWS * {{ CHUNKS }}; i += {{ THREADS }}) {
    const int r = i / {{ CHUNKS }}, c = i % {{ CHUNKS }};
    elem_t *d = dst + tile_off(r, c * 8);
    const bool in = row0 + r < rows;
    copy16(d, src + (long long)(row0 + r) * stride + c * 8, src, in);
  }
}
{% end %}
{% if pack_gqa then %}

// GQA-packed rows (pack_gqa): tile row r is packed row R = row0 + r, query
// position R / group of head R % group counted from `src`'s head; packed
// rows at or past `rows` become zeros.
template <int ROWS>
__device__ __forceinline__ void load_tile_packed(elem_t *dst, const elem_t *src, long long head_stride,
                                                 long long seq_stride, int group, int row0, int rows) {
  for (int i = threadIdx.x; i < ROWS * {{ CHUNKS }}; i += {{ THREADS }}) {
    const int r = i / {{ CHUNKS }}, c = i % {{ CHUNKS }}, R = row0 + r;
    elem_t *d = dst + tile_off(r, c * 8);
    const bool in = R < rows;
    const elem_t *g = src + (long long)(R % group) * head_stride + (long long)(R / group) * seq_stride + c * 8;
    copy16(d, g, src, in);
  }
}
{% end %}
{% if fp8 and S == 1 then %}

// FP8 e4m3 rows: 16 bytes of global memory become two 16-byte chunks of
// elem_t in shared memory.  The conversion is exact.
template <int ROWS>
__device__ __forceinline__ void load_tile_fp8(elem_t *dst, const unsigned char *src, long long stride,
                                              int row0, int rows) {
  for (int i = threadIdx.x; i < ROWS * {{ head_dim // 16 }}; i += {{ THREADS }}) {
    const int r = i / {{ head_dim // 16 }}, c = i % {{ head_dim // 16 }};
    uint4 raw = make_uint4(0u, 0u, 0u, 0u);
    if (row0 + r < rows) raw = *reinterpret_cast<const uint4 *>(src + (long long)(row0 + r) * stride + c * 16);
    const unsigned short *pairs = reinterpret_cast<const unsigned short *>(&raw);
    __align__(16) elem_t out[16];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const __half2 h2 = __half2(__nv_cvt_fp8x2_to_halfraw2(pairs[e], __NV_E4M3));
{% if dtype == "f16" then %}
      out[2 * e] = __low2half(h2);
      out[2 * e + 1] = __high2half(h2);
{% else %}
      out[2 * e] = __float2bfloat16_rn(__low2float(h2));
      out[2 * e + 1] = __float2bfloat16_rn(__high2float(h2));
{% end %}
    }
    *reinterpret_cast<uint4 *>(dst + tile_off(r, c * 16)) = reinterpret_cast<const uint4 *>(out)[0];
    *reinterpret_cast<uint4 *>(dst + tile_off(r, c * 16 + 8)) = reinterpret_cast<const uint4 *>(out)[1];
  }
}
{% end %}

// K and V rows as stored in global memory.
typedef {{ fp8 and "unsigned char" or "elem_t" }} kv_t;

// Where key row j of one head of K (or V) is.
struct KvSrc {
  const kv_t *base;   // row 0 (paged: token 0 of page 0)
  long long stride;   // between rows (paged: tokens of a page)
{% if paged then %}
  long long page_stride;
  const int *pages;   // this sequence's row of the block table
  int shift;          // log2(page size)
  int first;          // key index of row 0 (a split's first key)
  int last_page;      // num_pages - 1: entries are clamped to it

  // The page of key index `key` (counted from the sequence's first), and
  // the first element of that key's row in it.
  __device__ __forceinline__ int page_of(int key) const {
    return min(max(__ldg(pages + (key >> shift)), 0), last_page);
  }
  __device__ __forceinline__ const kv_t *row(int key, int page) const {
    return base + page * page_stride + (long long)(key & ((1 << shift) - 1)) * stride;
  }
{% end %}
{% if BMASK then %}
  BlockList list;     // the row tile's key tiles (a block mask)
{% end %}
};
{% if paged and (not fp8 or S == 1) then %}

// Paged key rows: row j is key first + j, token (first + j) % 2^shift of
// page pages[(first + j) >> shift]; rows at or past `rows` become zeros.
// Each thread's page numbers are read first, all at once, so that their
// latencies overlap instead of each holding up its row's copy.
{%   if THREADS % CHUNKS == 0 then %}
template <int ROWS>
__device__ __forceinline__ void load_tile_paged(elem_t *dst, const KvSrc &s, int row0, int rows) {
  constexpr int N = (ROWS + {{ PER - 1 }}) / {{ PER }};
  const int r = threadIdx.x / {{ CHUNKS }}, c = threadIdx.x % {{ CHUNKS }};
  int page[N];
#pragma unroll
  for (int n = 0; n < N; ++n) {
    const int j = row0 + r + n * {{ PER }};
    const bool in = (ROWS % {{ PER }} == 0 || r + n * {{ PER }} < ROWS) && j < rows;
    page[n] = in ? s.page_of(s.first + j) : -1;
  }
#pragma unroll
  for (int n = 0; n < N; ++n) {
    if (ROWS % {{ PER }} != 0 && r + n * {{ PER }} >= ROWS) break;
    const int key = s.first + row0 + r + n * {{ PER }};
    copy16(dst + tile_off(r + n * {{ PER }}, c * 8), s.row(key, page[n]) + c * 8, s.base, page[n] >= 0);
  }
}
{%   elseif CHUNKS > 32 and tile_n // (THREADS // 32) <= 32 then %}
// Rows wider than a warp's chunks (head dims above 256): warp w copies
// rows {{ tile_n // (THREADS // 32) }} w .. {{ tile_n // (THREADS // 32) }} w + {{ tile_n // (THREADS // 32) - 1 }}, its lanes a row's chunks; lane l looks up
// the page of the warp's row l once, and each row takes it from there.
template <int ROWS>
__device__ __forceinline__ void load_tile_paged(elem_t *dst, const KvSrc &s, int row0, int rows) {
  constexpr int RPW = (ROWS + {{ THREADS // 32 - 1 }}) / {{ THREADS // 32 }};
  const int lane = threadIdx.x % 32, r0 = threadIdx.x / 32 * RPW;
  const int j = row0 + r0 + lane;
  const int page = lane < RPW && r0 + lane < ROWS && j < rows ? s.page_of(s.first + j) : -1;
#pragma unroll 1
  for (int r = 0; r < RPW; ++r) {
    const int pg = __shfl_sync(0xffffffffu, page, r);
    if (r0 + r >= ROWS) break;
    const kv_t *g = s.row(s.first + row0 + r0 + r, max(pg, 0));
#pragma unroll
    for (int c = lane; c < {{ CHUNKS }}; c += 32) copy16(dst + tile_off(r0 + r, c * 8), g + c * 8, s.base, pg >= 0);
  }
}
{%   else %}
template <int ROWS>
__device__ __forceinline__ void load_tile_paged(elem_t *dst, const KvSrc &s, int row0, int rows) {
  for (int i = threadIdx.x; i < ROWS * {{ CHUNKS }}; i += {{ THREADS }}) {
    const int r = i / {{ CHUNKS }}, c = i % {{ CHUNKS }}, j = row0 + r;
    const bool in = j < rows;
    const int key = s.first + j, page = in ? s.page_of(key) : 0;
    copy16(dst + tile_off(r, c * 8), s.row(key, page) + c * 8, s.base, in);
  }
}
{%   end %}
{% end %}

{% if PF and PF_WIDE then %}
{%   local RPW = tile_n // (THREADS // 32) %}

// The plain ring's paged loads for rows wider than a warp's chunks (head
// dims above 256, PF_WIDE): K and V of a key tile share its page numbers,
// read a tile before its copies are issued.  Warp w copies rows {{ RPW }} w ..
// {{ RPW }} w + {{ RPW - 1 }} of a tile, its lanes a row's chunks; lane l holds the
// page of the warp's row l, -1 past `rows`.
__device__ __forceinline__ int tile_pages(const KvSrc &s, int t, int rows) {
  const int lane = threadIdx.x % 32;
  const int j = t * {{ tile_n }} + (threadIdx.x / 32) * {{ RPW }} + lane;
  return lane < {{ RPW }} && j < rows ? s.page_of(s.first + j) : -1;
}

// Tile t of one head's paged K or V into its ring slot, each row's page
// taken from the lane that holds it (tile_pages).
__device__ __forceinline__ void copy_tile_paged(elem_t *ring, const KvSrc &s, int t, int pages) {
  const int lane = threadIdx.x % 32, r0 = (threadIdx.x / 32) * {{ RPW }};
  elem_t *dst = ring + (t % {{ S }}) * {{ tile_n * LD }};
#pragma unroll 1
  for (int r = 0; r < {{ RPW }}; ++r) {
    const int page = __shfl_sync(0xffffffffu, pages, r);
    const kv_t *src = s.row(s.first + t * {{ tile_n }} + r0 + r, max(page, 0));
#pragma unroll
    for (int c = lane; c < {{ CHUNKS }}; c += 32)
      copy16(dst + tile_off(r0 + r, c * 8), src + c * 8, s.base, page >= 0);
  }
}
{% elseif PF then %}
{%   local TPR = PF_TPR %}
{%   local G, P4, RPW = CHUNKS // TPR, THREADS // TPR, 32 // TPR %}
{%   local N = tile_n // P4 %}

// The plain ring's paged loads: K and V of a key tile share its page
// numbers, and those are read a tile before its copies are issued, so no
// copy waits on the block table.  {{ TPR }} threads copy a row, {{ G }} chunks
// each (chunk q + {{ TPR }} g for thread q of the row), so that a row's
// address is computed once for {{ G }} copies.  Lane l of warp w holds the
// page of row {{ RPW }} w + l % {{ RPW }} + {{ P4 }} (l / {{ RPW }}) of its tile
// (the rows warp w's threads copy), -1 past `rows`.
__device__ __forceinline__ int tile_pages(const KvSrc &s, int t, int rows) {
  const int lane = threadIdx.x % 32, n = lane / {{ RPW }};
  const int j = t * {{ tile_n }} + (threadIdx.x / 32) * {{ RPW }} + lane % {{ RPW }} + n * {{ P4 }};
  return n < {{ N }} && j < rows ? s.page_of(s.first + j) : -1;
}

// Tile t of one head's paged K or V into its ring slot, each row's page
// taken from the lane that holds it (tile_pages).
__device__ __forceinline__ void copy_tile_paged(elem_t *ring, const KvSrc &s, int t, int pages) {
  const int r = threadIdx.x / {{ TPR }}, q = threadIdx.x % {{ TPR }}, sub = (threadIdx.x % 32) / {{ TPR }};
  elem_t *dst = ring + (t % {{ S }}) * {{ tile_n * LD }};
#pragma unroll
  for (int n = 0; n < {{ N }}; ++n) {
    const int page = __shfl_sync(0xffffffffu, pages, n * {{ RPW }} + sub);
    const kv_t *src = s.row(s.first + t * {{ tile_n }} + r + n * {{ P4 }}, page);
#pragma unroll
    for (int g = 0; g < {{ G }}; ++g) {
      const int c = q + g * {{ TPR }};
      copy16(dst + tile_off(r + n * {{ P4 }}, c * 8), src + c * 8, s.base, page >= 0);
    }
  }
}
{% end %}
{% if not fp8 or S == 1 then %}
// Key tile t of one head's K or V into its slot of a ring.
__device__ __forceinline__ void ring_load(elem_t *ring, const KvSrc &src, int t, int rows) {
{% if paged then %}
  load_tile_paged<{{ tile_n }}>(ring + (t % {{ S }}) * {{ tile_n * LD }}, src, t * {{ tile_n }}, rows);
{% else %}
  {{ fp8 and "load_tile_fp8" or "load_tile" }}<{{ tile_n }}>(ring + (t % {{ S }}) * {{ tile_n * LD }}, src.base, src.stride, {{ BMASK and "list_n0(src.list, t)" or ("t * " .. tile_n) }}, rows);
{% end %}
}

// After Q's copies have been issued: tiles 0 .. {{ S - 2 }} of K and V in
// flight, one cp.async group each (empty groups keep the count uniform),
// and Q landed.
__device__ __forceinline__ void kv_start(elem_t *s_k, elem_t *s_v, const KvSrc &k, const KvSrc &v,
                                         int rows, int ntiles{{ PF and ", int &pages" or "" }}) {
{% if S > 1 then %}
  cp_async_commit();  // Q's group
#pragma unroll
  for (int t = 0; t < {{ S - 1 }}; ++t) {
    if (t < ntiles) {
{%   if PF then %}
      const int pg = tile_pages(k, t, rows);
      copy_tile_paged(s_k, k, t, pg);
{%     if not VK then %}
      copy_tile_paged(s_v, v, t, pg);
{%     end %}
{%   else %}
      ring_load(s_k, k, t, rows);
{%     if not VK then %}
      ring_load(s_v, v, t, rows);
{%     end %}
{%   end %}
    }
    cp_async_commit();
  }
{%   if PF then %}
  pages = tile_pages(k, {{ S - 1 }}, rows);  // for kv_ready's first copies
{%   end %}
  cp_async_wait<{{ S - 1 }}>();
{% end %}
}

// Key tile t's K and V resident and visible to the whole block.  One stage
// copies them once the previous tile is no longer read; more stages start
// tile t + {{ S - 1 }} and wait for tile t.  Before a slot is refilled the
// caller synchronises (at the end of each iteration).
__device__ __forceinline__ void kv_ready(elem_t *s_k, elem_t *s_v, const KvSrc &k, const KvSrc &v,
                                         int rows, int t, int ntiles{{ PF and ", int &pages" or "" }}) {
{% if S == 1 then %}
  if (t > 0) __syncthreads();
  ring_load(s_k, k, t, rows);
{%   if not VK then %}
  ring_load(s_v, v, t, rows);
{%   end %}
{% else %}
  const int nt = t + {{ S - 1 }};
  if (nt < ntiles) {
{%   if PF then %}
    copy_tile_paged(s_k, k, nt, pages);
{%     if not VK then %}
    copy_tile_paged(s_v, v, nt, pages);
{%     end %}
{%   else %}
    ring_load(s_k, k, nt, rows);
{%     if not VK then %}
    ring_load(s_v, v, nt, rows);
{%     end %}
{%   end %}
  }
  cp_async_commit();
{%   if PF then %}
  pages = tile_pages(k, nt + 1, rows);  // the next call's, in flight meanwhile
{%   end %}
  cp_async_wait<{{ S - 1 }}>();
{% end %}
  __syncthreads();
}
{% end %}

}  // namespace fj
