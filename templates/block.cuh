{#
  block.cuh: the problem -> thread block mapping every attention family
  shares.  A grid is (row tiles, query heads, batch); block x takes the row
  tile counted from the end, so the heaviest causal tiles (the last rows,
  which see the most keys) start first.  A persistent grid (one block per
  multiprocessor) walks the same work tiles in pairs of equal causal work
  (tile_of).  Under GQA query head h reads KV head h / group.  Parameters: BM, the query rows one
  block covers.
#}
namespace fj {

struct Block {
  int m0;  // first query row
  int h;   // query head
  int hk;  // its KV head
  int b;   // batch index
};

__device__ __forceinline__ Block block_of(const Params &p) {
  Block blk;
  blk.m0 = (gridDim.x - 1 - blockIdx.x) * {{ BM }};
  blk.h = blockIdx.y;
  blk.b = blockIdx.z;
  blk.hk = blk.h / p.group;
  return blk;
}

// A persistent grid walks the row tiles of each (batch, head) in pairs: the
// last with the first, the second last with the second, ... so that under a
// causal mask every pair holds the same work, and a static walk (block k
// takes pairs k, k + gridDim.x, ...) balances the multiprocessors.  Pairs
// of one head are consecutive, so the blocks working at one time share its
// K and V in L2.
__device__ __forceinline__ int pairs_total(const Params &p) {
  return ((p.seq_q + {{ BM - 1 }}) / {{ BM }} + 1) / 2 * p.heads_q * p.batch;
}

// Half h of pair i (the heavier tile first); false for the missing partner
// of the middle tile when the row tiles are odd in number.
__device__ __forceinline__ bool tile_of(const Params &p, int i, int h, Block &blk) {
  const int nm = (p.seq_q + {{ BM - 1 }}) / {{ BM }}, np = (nm + 1) / 2;
  const int hb = i / np, j = i - hb * np;
  const int mb = h ? j : nm - 1 - j;
  if (h && mb == nm - 1 - j) return false;
  blk.m0 = mb * {{ BM }};
  blk.h = hb % p.heads_q;
  blk.b = hb / p.heads_q;
  blk.hk = blk.h / p.group;
  return true;
}

// Row 0 of one head of a tensor with strides (batch, head, seq).
template <typename T>
__device__ __forceinline__ T *head_rows(const void *base, const long long *stride, int b, int h) {
  return static_cast<T *>(const_cast<void *>(base)) + b * stride[0] + h * stride[1];
}

}  // namespace fj
