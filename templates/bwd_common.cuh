{#
  bwd_common.cuh: the backward's own parameter block, beside the forward's
  fj::Params (common.cuh), which the backward's kernels take too (the
  problem's sizes, strides, mask and modifications).  It must match
  fj_bwd_kparams in src/kparams.h byte for byte; bwd_params_bytes is its
  size as the host sees it.

  With a block mask (the kernel's block_q, block_kv > 0; BMASK = { q, kv }
  and BM, the query tile's rows, may be given, else the kernel's own), the
  walk of a key tile's query tiles by the mask's transposed lists, which
  the host puts in p.bm_* (src/backward.c's fill_bwd_blocks):
    QList q_list(p, b, h, n0)   key block n0 / kv's lists for batch b, query
                                head h: np partial entries, n in all,
                                counts clamped to 0..q_blocks
    qlist_m0(l, t)              the first row of query tile t of the list
                                (q / BM tiles a query block, partial blocks
                                first); an index outside 0..q_blocks - 1
                                gives the tile past the last block, which
                                the walk skips: a bad list reads no rows
    qlist_partial(l, t)         whether tile t is of a partial block (the
                                mask expression applies there)
    QWalk, qwalk_next(p, b, hk, n0, m_lo, m_hi, w)
                                the next (query head of hk's group, listed
                                tile) pair, heads in order, whose tile lies
                                in [m_lo, m_hi) -- the mask rule's query
                                range of the key tile, so the built-in
                                rules still skip tiles; false at the end.
                                Lists are read per head: a mask of
                                heads_q heads lists each head's own.
  No shared memory, no barriers; a QWalk is a few registers.
#}
{%
  local BMASK = BMASK or ((block_kv or 0) > 0 and { q = block_q, kv = block_kv } or nil)
  local BM = BM or tile_m
%}
namespace fj {

struct BwdParams {
  const void *dout;        // dO, laid out as p.o_stride says (do_stride)
  void *dq, *dk, *dv;      // the gradients, in the inputs' dtype
  const float *lse;        // the forward's natural-log sum-exp [batch][heads_q][seq_q]
  const float *dlse;       // the loss's gradient at lse, same layout, or NULL
  // Rows of the workspace are padded to seq_pad (seq_q rounded up to 64) a
  // (batch, head): whole tiles with no tail; padding rows hold delta 0 and
  // LSE2 +inf, so their P is 0.
  float *delta;            // rowsum(dO o O), float32 [batch][heads_q][seq_pad]
  float *lse2;             // LSE * log2(e) (+inf where LSE is -inf), same rows
  float *dq_acc;           // dQ / scale, float32 [batch][heads_q][seq_pad][head_dim]
  float *dsinks;           // [heads_q] gradients of the sinks, or NULL
  // The deterministic mode's turns: per dQ tile (dq_tile_base / 4096),
  // how many key tiles have added into it (the preprocess clears them).
  int *dq_turns;
  // The parameters' gradients in the deterministic mode (fj_mods.param_grads;
  // pg_words NULL elsewhere): two int64 words of fixed point an element,
  // for the elements of the parameters with a gradient one after another
  // (pg_end[i]: those of parameters 0..i), which the main kernel adds into
  // (mods.cuh's pgrad_add), the preprocess clears and the postprocess adds
  // to pg_out[i] (pgrad_words).
  long long *pg_words;
  float *pg_out[8];
  long long pg_end[8];
  long long do_stride[3], dq_stride[3], dk_stride[3], dv_stride[3];  // b, h, s
  float scale;             // the softmax scale (dQ and dK carry it)
  int seq_pad;
  int deterministic;       // dQ's additions in key-tile order (dq_turns); 2: rotated (ROT); 3: the descending walk (DESC)
  int section;             // (batch, KV head)s a section of the launch order (kv_tile)
  int pad_;
};
// dQ's accumulator in tiles (the wgmma backward's layout, where
// BwdParams' dq is "tiled"): per (batch, head), per 64 padded rows, per 64
// columns, a tile of 64 x 64 floats, its 16-byte chunks XOR-swizzled by
// the row (chunk k of row r at k ^ 2 (r % 8)), so that a warp's stores of
// eight rows fall on different banks.  One bulk reduce-add moves a tile.
__device__ __forceinline__ int dq_tile_off(int r, int c) {
  return (r & 63) * 64 + ((((c >> 2) ^ ((r & 7) << 1)) << 2) | (c & 3));
}
// The wide wgmma backward's tiles (the postprocess's `tiled` 2): within
// each 16 columns, column k at 4 ((k % 8) / 2) + 2 (k / 8) + k % 2, so that
// the four values a thread's accumulator holds of one row (columns c, c+1,
// c+8, c+9 for even c < 8) are one 16-byte chunk: one red.global.add.v4.
__device__ __forceinline__ int dq_tile_off4(int r, int c) {
  return dq_tile_off(r, (c & ~15) | (((c & 7) >> 1) << 2) | ((c & 8) >> 2) | (c & 1));
}
// The parameters' gradients in the deterministic mode: a value v adds
// trunc(v 2^24) to word 0 and the rest, times 2^32 and rounded, to word 1,
// as 64-bit integers, whose sums do not depend on the order of the
// additions; the element's gradient is word 0 2^-24 + word 1 2^-56
// (pgrad_value).  Exact but for what lies below 2^-56 of each value, for
// |v| < 2^38 and sums below 2^38 in magnitude (a sum past 2^39 wraps word
// 0: a wrong value, the same every run); a value beyond 2^38, or not
// finite, is added to the gradient itself in float32 (an infinity or a
// NaN gives the same result in any order; a finite value that large does
// not).
__device__ __forceinline__ void pgrad_words_add(long long *w, float v) {
  const float x = v * 16777216.f;  // 2^24: exact
  const float hi = truncf(x);
  const long long h = (long long)hi, l = __float2ll_rn((x - hi) * 4294967296.f);
  if (h) atomicAdd(reinterpret_cast<unsigned long long *>(w), (unsigned long long)h);
  if (l) atomicAdd(reinterpret_cast<unsigned long long *>(w + 1), (unsigned long long)l);
}
__device__ __forceinline__ bool pgrad_fixed(float v) {
  return fabsf(v) < 274877906944.f;  // 2^38 (false for NaN)
}
__device__ __forceinline__ double pgrad_value(const long long *w) {
  return (double)w[0] * 0x1p-24 + (double)w[1] * 0x1p-56;
}
// The first float of the tile holding padded row m (a multiple of 64) and
// column c0 (a multiple of 64) of (batch, head) bh.
__device__ __forceinline__ long long dq_tile_base(long long bh, int m, int c0, int seq_pad, int d) {
  return ((bh * (seq_pad >> 6) + (m >> 6)) * ((d + 63) >> 6) + (c0 >> 6)) * 4096;
}

// The key tile a block of the main kernels keeps, from its place in the
// launch order: sections of `section` (batch, KV head)s one after
// another, and in a section key tile n of each before key tile n + 1 of
// any (or n + 1 before n: last_first).  Under a causal mask the first key tiles walk the most query
// tiles, so the longest blocks of a section start first and its short
// ones fill its last wave (the host makes a section hold a few waves);
// a section of one is the plain order, every key tile of a head before
// the next head's, whose blocks share their Q and dO in L2.  Either way a
// key tile of a head starts after the tiles before it of the same head,
// so the deterministic mode's turns only wait on blocks launched earlier;
// `last_first` reverses the key tiles (the deterministic mode's order
// under a mask with a right side: scheduler.cuh's kv_rank).  `width`
// blocks of consecutive x (a cluster: the wide wgmma kernel's pairs) take
// consecutive key tiles of one head, the cluster's place in the order
// being a block's in the plain one.
struct KvTile { int n, hk, b; };
__device__ __forceinline__ KvTile kv_tile(int section, bool last_first, int width = 1) {
  const int tiles = gridDim.x / width, heads = gridDim.y * gridDim.z;
  const int lin = blockIdx.x / width + tiles * (blockIdx.y + gridDim.y * blockIdx.z);
  const int s0 = lin / (section * tiles) * section;   // the section's first head
  const int in = min(section, heads - s0);            // its heads
  const int i = lin - s0 * tiles;
  const int head = s0 + i % in;
  KvTile t;
  t.n = (last_first ? tiles - 1 - i / in : i / in) * width + blockIdx.x % width;
  t.hk = head % gridDim.y;
  t.b = head / gridDim.y;
  return t;
}

// The deterministic mode's turns: a key tile adds a dQ tile once `rank`
// key tiles have (acquire), then counts itself (release).
__device__ __forceinline__ void dq_turn_wait(const int *turn, int rank) {
  int seen;
  do {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(turn) : "memory");
  } while (seen < rank);
}
__device__ __forceinline__ void dq_turn_done(int *turn) {
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" :: "l"(turn) : "memory");
}
// The wide kernel's consumers, which add dQ themselves: the turn read
// ahead (relaxed: peek before the dQ products, so that its latency runs
// beside them), then waited for from what was seen (dq_turn_wait_from: an
// acquire only where it must spin; a turn seen early takes no fence -- the
// additions that follow are atomic reductions performed at L2 after the
// turn was seen there, issued only once it was (lane 0's branch, then
// __syncwarp), and the key tile before completed its own before it passed
// the turn on, so their order at each address is the turns' order: an
// order the hardware keeps, where the PTX model would ask for an acquire,
// whose L1 invalidation would serve no load here), and each thread's
// additions ordered before its warp's turn passes
// on (fence_gpu, then one lane's dq_turn_pass; the wide kernel's
// pass_turns says when).
__device__ __forceinline__ int dq_turn_peek(const int *turn) {
  int seen;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(turn) : "memory");
  return seen;
}
__device__ __forceinline__ void fence_gpu() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }
// The turn passed on after the warp's fence_gpu and __syncwarp (those
// make it a release: the fence-then-relaxed pattern, no second fence).
__device__ __forceinline__ void dq_turn_pass(int *turn) {
  asm volatile("red.relaxed.gpu.global.add.s32 [%0], 1;\n" :: "l"(turn) : "memory");
}
__device__ __forceinline__ void dq_turn_wait_from(const int *turn, int need, int seen) {
  if (seen < need) dq_turn_wait(turn, need);
}

static_assert(sizeof(BwdParams) == {{ bwd_params_bytes }}, "host and device disagree on the backward's parameter block");
{% if BMASK then %}

// A key block's query blocks (the block mask's transposed lists): partial
// entries first, then full ones, each block of {{ BMASK.q }} rows walked as
// {{ BMASK.q // BM }} query tile(s) of {{ BM }}.
struct QList {
  const int *part, *full;
  int np, n, qb;  // partial entries, all entries, query blocks
};

__device__ __forceinline__ QList q_list(const Params &p, int b, int h, int n0) {
  const long long col = (long long)b * p.bm_stride_b + (long long)h * p.bm_stride_h + n0 / {{ BMASK.kv }};
  QList l;
  l.qb = p.bm_q_blocks;
  l.np = min(max(__ldg(p.bm_num + col), 0), l.qb);
  l.n = l.np + (p.bm_full_num ? min(max(__ldg(p.bm_full_num + col), 0), l.qb) : 0);
  l.part = p.bm_idx + col * l.qb;
  l.full = p.bm_full_idx ? p.bm_full_idx + col * l.qb : l.part;
  return l;
}

__device__ __forceinline__ int qlist_m0(const QList &l, int t) {
  const int e = t / {{ BMASK.q // BM }};
  const unsigned i = (unsigned)(e < l.np ? __ldg(l.part + e) : __ldg(l.full + (e - l.np)));
  return (i < (unsigned)l.qb ? (int)i : l.qb) * {{ BMASK.q }} + t % {{ BMASK.q // BM }} * {{ BM }};
}

__device__ __forceinline__ bool qlist_partial(const QList &l, int t) {
  return t / {{ BMASK.q // BM }} < l.np;
}

// A walk's place: query head g of the group, tile t of its list, and the
// tile's first row and kind.  Start from qwalk_start().  Only the place is
// kept: the list is read again at each step (its counts, then an index:
// loads that hit L1), so that a walk costs the consumers of the wgmma
// backward, which keep dK and dV in registers, four registers.
struct QWalk {
  int g, t, m0;
  bool part;
};

__device__ __forceinline__ QWalk qwalk_start() {
  QWalk w;
  w.g = 0;
  w.t = -1;
  w.m0 = 0;
  w.part = false;
  return w;
}

__device__ __forceinline__ bool qwalk_next(const Params &p, int b, int hk, int n0, int m_lo, int m_hi, QWalk &w) {
  if (w.g >= p.group) return false;
  QList l = q_list(p, b, hk * p.group + w.g, n0);
  for (;;) {
    ++w.t;
    while (w.t >= l.n * {{ BMASK.q // BM }}) {
      if (++w.g >= p.group) return false;
      l = q_list(p, b, hk * p.group + w.g, n0);
      w.t = 0;
    }
    w.m0 = qlist_m0(l, w.t);
    if (w.m0 >= m_lo && w.m0 < m_hi) {
      w.part = qlist_partial(l, w.t);
      return true;
    }
  }
}

// The deterministic mode's turns under a block mask: how many steps of the
// walk of the key tile at n0 (qwalk_next's, with its m_lo and m_hi) visit
// query tile m0 of query head h -- its lists read with the same clamps and
// the same tile arithmetic as the walk's, so that a turn counts exactly
// the additions that will come, whatever the lists hold (a block listed
// twice is walked twice).
__device__ __forceinline__ int qlist_visits(const Params &p, int b, int h, int n0, int m_lo, int m_hi, int m0) {
  if (m0 < m_lo || m0 >= m_hi) return 0;
  const QList l = q_list(p, b, h, n0);
  const int sub = (m0 % {{ BMASK.q }}) / {{ BM }};
  int n = 0;
  for (int e = 0; e < l.n; ++e) n += qlist_m0(l, e * {{ BMASK.q // BM }} + sub) == m0;
  return n;
}
{% end %}

// Asks for the 128-byte line holding p in L1 (and L2), and returns at once:
// a later load of it hits L1 (PTX prefetch.global.L1).  p must point into
// an allocation.
__device__ __forceinline__ void prefetch_l1(const void *p) {
  asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
}

}  // namespace fj
