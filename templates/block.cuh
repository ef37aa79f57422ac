{#
  block.cuh: the problem -> thread block mapping every attention family
  shares.  A grid is (row tiles, query heads, batch); block x takes the row
  tile counted from the end, so the heaviest causal tiles (the last rows,
  which see the most keys) start first.  A persistent grid (one block per
  multiprocessor) walks the same work tiles in pairs of equal causal work
  (tile_of).  Under GQA query head h reads KV head h / group.  Parameters:
  BM, the query rows one block covers (BN, the keys of a key tile); PACK (GQA packing: grid y counts KV
  heads, and blk.h is the first of the KV head's query heads); SPLIT
  (split-KV: p.splits consecutive blocks share a row tile, blk.split
  telling which key range is theirs); DYNAMIC (a persistent grid whose
  blocks claim work tiles from a counter: varlen and block masks, where
  sequences or lists of unequal lengths make a static walk uneven); VL
  (varlen: a sequence's own lengths bound its tiles); BMASK ({ q =
  block_q, kv = block_kv }: a caller's block mask gives each row tile its
  key tiles).
#}
namespace fj {

struct Block {
  int m0;  // first query row
  int h;   // query head
  int hk;  // its KV head
  int b;   // batch index
{% if SPLIT then %}
  int split;  // which of p.splits key ranges
{% end %}
};

__device__ __forceinline__ Block block_of(const Params &p) {
  Block blk;
{% if SPLIT then %}
  blk.split = blockIdx.x % p.splits;
  blk.m0 = (gridDim.x / p.splits - 1 - blockIdx.x / p.splits) * {{ BM }};
{% else %}
  blk.m0 = (gridDim.x - 1 - blockIdx.x) * {{ BM }};
{% end %}
{% if PACK then %}
  blk.hk = blockIdx.y;
  blk.h = blk.hk * p.group;
  blk.b = blockIdx.z;
{% else %}
  blk.h = blockIdx.y;
  blk.b = blockIdx.z;
  blk.hk = blk.h / p.group;
{% end %}
  return blk;
}

// A persistent grid walks units of work: first the pairs of row tiles of
// each (batch, head) -- the last with the first, the second last with the
// second, ... -- which under a causal mask all hold the same work, then,
// when the row tiles are odd in number, each head's middle tile alone.  A
// static walk (block k takes units k, k + gridDim.x, ...) then balances the
// multiprocessors, and the pairs of one head are consecutive, so the blocks
// working at one time share its K and V in L2.
__device__ __forceinline__ int pairs_total(const Params &p) {
  return ((p.seq_q + {{ BM - 1 }}) / {{ BM }} + 1) / 2 * p.heads_q * p.batch;
}

// Half h of unit u (the heavier tile first); false where a unit has no
// second half.  One division: units below `paired` are pairs, the rest
// each head's middle tile (full == the pairs a head has).
__device__ __forceinline__ bool tile_of(const Params &p, int u, int h, Block &blk) {
  const int nm = (p.seq_q + {{ BM - 1 }}) / {{ BM }}, full = nm / 2;
  const int paired = full * p.heads_q * p.batch;
  const bool single = u >= paired;
  if (single && h) return false;
  const int per = single ? 1 : full, base = single ? paired : 0;
  const int hb = (u - base) / per, j = u - base - hb * per;
  blk.m0 = (single ? full : h ? j : nm - 1 - j) * {{ BM }};
  blk.h = hb % p.heads_q;
  blk.b = hb / p.heads_q;
  blk.hk = blk.h / p.group;
  return true;
}

{% if DYNAMIC then %}
// A dynamic walk: the work items are the row tiles of each (batch, head),
// heaviest first (under a causal mask the last rows see the most keys),
// claimed one at a time from the counter p.work, which the host zeroes
// before the launch.  Blocks that finish early claim more, so sequences
// of unequal lengths even out.  Item w is row tile nm - 1 - w % nm of
// head w / nm % heads_q of batch w / nm / heads_q.
__device__ __forceinline__ void item_of(const Params &p, int w, Block &blk) {
  const int nm = (p.seq_q + {{ BM - 1 }}) / {{ BM }}, g = w / nm;
  blk.m0 = (nm - 1 - (w - g * nm)) * {{ BM }};
  blk.h = g % p.heads_q;
  blk.b = g / p.heads_q;
  blk.hk = blk.h / p.group;
}

// The next item with rows in its sequence, or -1 when none is left.  The
// tiles past a sequence's end come first in its head's items: a claim
// that lands on one moves the counter past all of them at once
// (atomicMax), so the empty items cost two atomics a head, not one each.
__device__ __forceinline__ int claim(const Params &p) {
  const int nm = (p.seq_q + {{ BM - 1 }}) / {{ BM }}, total = nm * p.heads_q * p.batch;
  int w = (int)atomicAdd(p.work, 1u);
  while (w < total) {
    Block blk;
    item_of(p, w, blk);
    const int len_q = {{ VL and "seq_of(p, blk.b).len_q" or "p.seq_q" }};
    if (blk.m0 < len_q) return w;
    const int g = w / nm, tiles = (len_q + {{ BM - 1 }}) / {{ BM }};
    atomicMax(p.work, (unsigned)(g * nm + nm - tiles));
    w = (int)atomicAdd(p.work, 1u);
  }
  return -1;
}

{% end %}
{% if BMASK then %}
// A caller's block mask (fj_block_mask) for one row tile: the partial key
// blocks of its query block, then the full ones, each block of
// {{ BMASK.kv }} keys walked as {{ BMASK.kv // BN }} key tile(s) of {{ BN }}.  Counts are clamped
// to the key blocks, and an index outside them becomes the block just past
// the last (keys past the sequence: loaded as zeros and masked), so a bad
// array never moves a load outside the tensors.
struct BlockList {
  const int *part, *full;
  int np, n, kvb;  // partial entries, all entries, key blocks
};

// The lists of blk's row tile with counts given: np partial entries, n in
// all (as block_list below reads and clamps them).
__device__ __forceinline__ BlockList block_list(const Params &p, const Block &blk, int np, int n) {
  BlockList l;
  const long long row = (long long)blk.b * p.bm_stride_b + (long long)blk.h * p.bm_stride_h + blk.m0 / {{ BMASK.q }};
  l.kvb = p.bm_kv_blocks;
  l.np = np;
  l.n = n;
  l.part = p.bm_idx + row * l.kvb;
  l.full = p.bm_full_idx ? p.bm_full_idx + row * l.kvb : l.part;
  return l;
}

__device__ __forceinline__ BlockList block_list(const Params &p, const Block &blk) {
  const long long row = (long long)blk.b * p.bm_stride_b + (long long)blk.h * p.bm_stride_h + blk.m0 / {{ BMASK.q }};
  const int kvb = p.bm_kv_blocks;
  const int np = min(max(__ldg(p.bm_num + row), 0), kvb);
  return block_list(p, blk, np, np + (p.bm_full_num ? min(max(__ldg(p.bm_full_num + row), 0), kvb) : 0));
}

// The first key of key tile t of the list.
__device__ __forceinline__ int list_n0(const BlockList &l, int t) {
  const int e = t / {{ BMASK.kv // BN }};
  const unsigned i = (unsigned)(e < l.np ? __ldg(l.part + e) : __ldg(l.full + (e - l.np)));
  return (i < (unsigned)l.kvb ? (int)i : l.kvb) * {{ BMASK.kv }} + t % {{ BMASK.kv // BN }} * {{ BN }};
}

// Whether key tile t is of a partial block (the mask expression applies).
__device__ __forceinline__ bool list_partial(const BlockList &l, int t) {
  return t / {{ BMASK.kv // BN }} < l.np;
}

{% end %}
// Row 0 of one head of a tensor with strides (batch, head, seq).
template <typename T>
__device__ __forceinline__ T *head_rows(const void *base, const long long *stride, int b, int h) {
  return static_cast<T *>(const_cast<void *>(base)) + b * stride[0] + h * stride[1];
}

}  // namespace fj
