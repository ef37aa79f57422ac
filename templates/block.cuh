{#
  block.cuh: the problem -> thread block mapping every attention family
  shares.  A grid is (row tiles, query heads, batch); block x takes the row
  tile counted from the end, so the heaviest causal tiles (the last rows,
  which see the most keys) start first.  A persistent grid (one block per
  multiprocessor) walks the same work tiles in one linear order instead:
  row tiles fastest, so the blocks working at one time share a head's K and
  V in L2, again the last rows first; then heads, then batches.  Under GQA
  query head h reads KV head h / group.  Parameters: BM, the query rows one
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

// The work tiles of a persistent grid, and tile i of its order.
__device__ __forceinline__ int tiles_total(const Params &p) {
  return (p.seq_q + {{ BM - 1 }}) / {{ BM }} * p.heads_q * p.batch;
}

__device__ __forceinline__ Block tile_of(const Params &p, int i) {
  const int nm = (p.seq_q + {{ BM - 1 }}) / {{ BM }}, hb = i / nm;
  Block blk;
  blk.m0 = (nm - 1 - (i - hb * nm)) * {{ BM }};
  blk.h = hb % p.heads_q;
  blk.b = hb / p.heads_q;
  blk.hk = blk.h / p.group;
  return blk;
}

// Row 0 of one head of a tensor with strides (batch, head, seq).
template <typename T>
__device__ __forceinline__ T *head_rows(const void *base, const long long *stride, int b, int h) {
  return static_cast<T *>(const_cast<void *>(base)) + b * stride[0] + h * stride[1];
}

}  // namespace fj
