{#
  scheduler.cuh: the scheduler piece -- which work tiles a block of a
  persistent grid takes, and what each tile covers, from one mask rule
  (mask.lua) and block.cuh's grid mapping.

  Contract.  Every role of a block (the producer, each consumer warpgroup)
  walks the same tiles in the same order, so they agree without talking;
  a dynamic walk (varlen, block masks: sequences or lists of unequal
  lengths make a static walk uneven) has the producer claim each item from
  the counter p.work (block.cuh's claim) and hand it over through a record
  in the workspace (p.work + 4 + 4 blockIdx.x, 16 bytes) and an "item"
  mbarrier (one arrival: the record is written; waited with parity
  (kq & 1)).  It takes no shared memory of its own besides that barrier
  and no registers beyond the tile's head.

  part = "device"   namespace-level device functions (the item record)
  part = "walk"     the declarations a walk needs before the role branch
  part = "producer_walk"  opens the producer's walk over its work tiles
                    (static, or claiming items and handing them over after
                    `free`, the C statement that waits until the last
                    tile's Q is consumed) and emits the tile's head
  part = "consumer_walk"  opens a consumer's walk (a dynamic one takes the
                    first item's record) and emits the tile's head
  part = "consumer_next"  a dynamic walk's next record, read before the
                    last tile's epilogue so its latency hides there
  part = "head"     the head of a query tile (the forward): blk, m0, kq
                    (work tiles started before it), and its key range --
                    t_first and ntiles key tiles from n_end, or a block
                    mask's list bl -- and for varlen the sequence's
                    lengths; item: the claimed item's name (a dynamic
                    walk), counts: the list counts the producer read
  part = "kv_head"  the head of a key tile (the backward): blk.n0 the first
                    key, and its query range: m_first and nq query tiles of
                    BM rows (the mask rule's rows_begin / rows_end); of the
                    BN keys from N0 (a C expression, "n0" unless given: a
                    pair's tile where a cluster of two blocks splits it)
  part = "kv_rank"  (the backward's deterministic dQ) sets the caller's
                    int rank: how many key tiles add the dQ of query tile
                    m0 (step i of nq a head) before key tile nt (BN keys
                    each): those after it under a mask with a right side
                    (causal, a window; kv_tile launches them first), else
                    those before it.  The tiles that walk a query tile are
                    consecutive (both ends of a key tile's query range grow
                    with it); the caller's int edge carries their far end
                    from step to step.  rot (a template flag): under
                    g.deterministic 2 every key tile t walks every query
                    tile from t nq / T on, and the rank follows that
                    rotation.  desc (a template flag, under a mask with a
                    right side): where the caller's bool desc holds (the
                    descending walk: query tiles last to first, the
                    group's heads inner; kv_tile launches first key tiles
                    first), earlier key tiles first, edge carried from
                    the walk's first step.  FIRST (a C expression; "i %
                    nq == 0" unless given): whether step i is the first of
                    its head's under a mask with a right side, the plain
                    walk.  NT and TILES (C expressions; "nt" and
                    the grid's width unless given): this key tile's index
                    and how many a head has (a pair's: nt / 2, half the
                    grid's width).  Under a block mask (BMASK) the walks
                    are the lists': each lane of the calling warp counts
                    the visits of query tile m0 of head h by the key
                    tiles lane, lane + 32, ... launched before this one,
                    replaying each one's walk (bwd_common.cuh's
                    qlist_visits, in that tile's query range as kv_head
                    gives it), and rank is their sum over the warp
  Parameters: mrule, BM, BN, N0, NT, TILES, BMASK, VL, DYNAMIC, PERSISTENT, rot, desc, FIRST, and sched
  (the same fields as a table, for the parts that include others).
#}
{%
  local function head(item, counts)
    local PC = import("pieces.lua")
    return PC.piece(include("scheduler.cuh", PC.with(sched, { part = "head", item = item, counts = counts, sched = sched })))
  end
%}
{% if part == "device" then %}
{%   if DYNAMIC then %}

// The work item the producer hands the consumers: the block's record
// after the counter in the workspace (16 bytes at p.work + 4 + 4 block):
// the item, then with a block mask its list's counts (partial, all).
// Stored before the item barrier is arrived on (a release) and read after
// it is waited for (an acquire).  Global rather than shared memory:
// compute-sanitizer's racecheck does not see an mbarrier order
// shared-memory stores.
struct Item { int w, np, n, pad; };
__device__ __forceinline__ void put_item(const Params &p, int w, int np, int n) {
  asm volatile("st.volatile.global.v4.b32 [%0], { %1, %2, %3, %4 };\n"
               :: "l"(p.work + 4 + 4 * blockIdx.x), "r"(w), "r"(np), "r"(n), "r"(0) : "memory");
}
__device__ __forceinline__ Item get_item(const Params &p) {
  Item it;
  asm volatile("ld.volatile.global.v4.b32 { %0, %1, %2, %3 }, [%4];\n"
               : "=r"(it.w), "=r"(it.np), "=r"(it.n), "=r"(it.pad) : "l"(p.work + 4 + 4 * blockIdx.x) : "memory");
  return it;
}
{%   end %}
{% elseif part == "walk" then %}
{%   if DYNAMIC then %}
  // A dynamic walk: the producer claims each work item (block.cuh's claim)
  // and hands it to the consumers through the item barrier (fj::put_item);
  // -1 ends the walk.
{%   elseif PERSISTENT then %}
  // A persistent grid (block.cuh's tile order): every warpgroup walks the
  // same tiles, so producer and consumers agree without talking.
{#  FJ_TILES walks the pairs; each walk writes its loop over a pair's two
    halves after it, under `#pragma unroll 1`: unrolled, the producer's
    K/V loop had two copies.  Not in the macro: a pragma there is _Pragma,
    which the cache's source check refuses on load (entry.c). #}
  const int total = fj::pairs_total(p);
  int k = 0;  // work tiles this block has started
#define FJ_TILES for (int pair = blockIdx.x; pair < total; pair += gridDim.x)
#define FJ_BLOCK(blk) if (!fj::tile_of(p, pair, half, blk)) continue
{%   else %}
  int k = 0;
#define FJ_TILES for (int once = 0; once < 1; ++once)
#define FJ_BLOCK(blk) blk = fj::block_of(p)
{%   end %}
{% elseif part == "producer_walk" then %}
{%   if DYNAMIC then %}
      for (unsigned kq = 0;; ++kq) {
        const int w = fj::claim(p);
{%     if BMASK then %}
        // The item's list counts are read while the consumers finish the
        // last item; the end (-1) reads item 0's, unused.  Only the counts
        // wait (with its first key tile too ptxas spilled 8 bytes at 40
        // registers).
        int np, n;
        {
          fj::Block b0;
          fj::item_of(p, w < 0 ? 0 : w, b0);
          const fj::BlockList l0 = fj::block_list(p, b0);
          np = l0.np;
          n = l0.n;
        }
{%     end %}
        // Q's buffer and the item record are free once every consumer warp
        // has finished its last S of the previous work tile.
        {{ free }}
        fj::put_item(p, w, {{ BMASK and "np, n" or "0, 0" }});
        fj::mbar_arrive(bar_item);
        if (w < 0) break;
{{ head("w", BMASK and "np, n" or nil) }}
{%   elseif PERSISTENT then %}
      FJ_TILES
#pragma unroll 1
      for (int half = 0; half < 2; ++half) {
{{ head() }}
{%   else %}
      FJ_TILES {
{{ head() }}
{%   end %}
{% elseif part == "consumer_walk" then %}
{%   if DYNAMIC then %}
  fj::mbar_wait(bar_item, 0u);
  fj::Item item = fj::get_item(p);
  for (unsigned kq = 0;; ++kq) {
  const int w = item.w;
  if (w < 0) break;
{{ head("w", BMASK and "item.np, item.n" or nil) }}
{%   elseif PERSISTENT then %}
  FJ_TILES
#pragma unroll 1
  for (int half = 0; half < 2; ++half) {
{{ head() }}
{%   else %}
  FJ_TILES {
{{ head() }}
{%   end %}
{% elseif part == "consumer_next" then %}
{%   if DYNAMIC then %}
  // The next item, read now so that the read's latency hides under this
  // tile's epilogue: its record is written once every consumer warp has
  // released Q (this tile's last S), and the item barrier says so.
  fj::mbar_wait(bar_item, (kq + 1u) & 1u);
  item = fj::get_item(p);
{%   end %}
{% elseif part == "head" then %}
        fj::Block blk;
{%   if item then %}
        fj::item_of(p, {{ item }}, blk);
{%   else %}
        FJ_BLOCK(blk);
{%   end %}
{%   if VL then %}
        // This tile's sequence{{ item and "" or "; tiles past its end have nothing to do" }}.
        const fj::Seq seq = fj::seq_of(p, blk.b);
        const int len_q = seq.len_q, len_kv = seq.len_kv;
        const int causal_off = {{ mrule.bottom_right and "len_kv - len_q" or "0" }};
        (void)causal_off;
{%     if not item then %}
        if (blk.m0 >= len_q) continue;
{%     end %}
{%   end %}
{%   if not item then %}
        const unsigned kq = (unsigned)k++;
{%   end %}
        const int m0 = blk.m0;
{%   if BMASK then %}
        // The key tiles the caller's block mask lists: partial blocks, then full ones.
        const fj::BlockList bl = fj::block_list(p, blk{{ counts and ", " .. counts or "" }});
        const int ntiles = bl.n * {{ BMASK.kv // BN }};
{%   else %}
        // Keys this block can see: all of them, or up to its last row's diagonal{{ mrule.window and " or window, from the window's left side of its first row" or "" }}.
        const int n_end = {{ mrule.keys_end("m0 + " .. BM) }};
        const int t_first = {{ mrule.keys_begin("m0") }} / {{ BN }};
        const int ntiles = n_end > t_first * {{ BN }} ? (n_end - t_first * {{ BN }} + {{ BN - 1 }}) / {{ BN }} : 0;
{%   end %}
{% elseif part == "kv_head" then %}
{%   local n0 = N0 or "n0" %}
  // Query rows this key tile is seen by: from the first row whose keys
  // reach it to the last its window's left side lets see it.
  const int m_first = {{ mrule.rows_begin(n0) }} / {{ BM }} * {{ BM }};
  const int m_end = {{ mrule.rows_end(n0 .. " + " .. BN) }};
  const int nq = m_end > m_first && {{ n0 }} < {{ mrule.kv }} ? (m_end - m_first + {{ BM - 1 }}) / {{ BM }} : 0;
{% elseif part == "kv_rank" and BMASK then %}
        for (int t = lane; t < (int)gridDim.x; t += 32) {
          if ({{ mrule.bounded and "t <= nt" or "t >= nt" }}) continue;
          const int t0 = t * {{ BN }};
          const int tf = {{ mrule.rows_begin("t0") }} / {{ BM }} * {{ BM }};
          const int te = {{ mrule.rows_end("t0 + " .. BN) }};
          const int tq = te > tf && t0 < {{ mrule.kv }} ? (te - tf + {{ BM - 1 }}) / {{ BM }} : 0;
          rank += fj::qlist_visits(p, b, h, t0, tf, tf + tq * {{ BM }}, m0);
        }
        rank = __reduce_add_sync(0xffffffffu, rank);
{% elseif part == "kv_rank" then %}
{%   local NT, TILES = NT or "nt", TILES or "(int)gridDim.x" %}
        // The key tiles whose walks hold m0 are consecutive: edge, kept
        // over this head's steps (reset at its first), is the far end of
        // those before (after) this one, found with the walk's own test.
        auto walks = [&](int t) {
          const int t0 = t * {{ BN }};
          return t0 < {{ mrule.kv }} && {{ mrule.rows_begin("t0") }} / {{ BM }} * {{ BM }} <= m0 && m0 < {{ mrule.rows_end("t0 + " .. BN) }};
        };
{%   if mrule.bounded then %}
{%     if desc then %}
        if (desc) {
          // The descending walk (the caller's desc): earlier key tiles
          // first -- each reaches m0 at the same step as this one (or
          // sooner, a window's left side ending its walk earlier), and
          // was launched before it.  m0 only falls over the walk (the
          // heads are inner), and so does the near end of the key tiles
          // that walk it: edge, carried from the walk's first step.
          if (i == 0) edge = {{ NT }};
          while (edge > 0 && walks(edge - 1)) --edge;
          rank = {{ NT }} - edge;
        } else {
{%     end %}
        // Later key tiles first: each starts its walk at a later query tile,
        // so it reaches m0 sooner.
        if ({{ FIRST or "i % nq == 0" }}) edge = {{ NT }};
        while (edge + 1 < {{ TILES }} && walks(edge + 1)) ++edge;
        rank = edge - {{ NT }};
{%     if desc then %}
        }
{%     end %}
{%   else %}
{%     if rot then %}
        if (g.deterministic == 2) {
          // The rotation (the caller's rot): every key tile walks every
          // query tile, key tile t from r(t) = t nq / T on, so query tile
          // qi sees those with r(t) <= qi first, the last of them first
          // (it reached qi soonest), then the others, the last first.  A:
          // how many have r(t) <= qi, the smallest t with t nq >= (qi + 1) T
          // (32-bit: the host sets 2 only where T nq < 2^31).
          const int T = {{ TILES }}, qi = (m0 - m_first) / {{ BM }};
          const int A = min(T, (int)(((unsigned)((qi + 1) * T) + nq - 1) / (unsigned)nq));
          rank = {{ NT }} < A ? A - 1 - {{ NT }} : A + T - 1 - {{ NT }};
        } else {
{%     end %}
        // Earlier key tiles first (every walk starts at the same query tile).
        if (i % nq == 0) edge = 0;
        while (edge < {{ NT }} && !walks(edge)) ++edge;
        rank = {{ NT }} - edge;
{%     if rot then %}
        }
{%     end %}
{%   end %}
{% end %}
