"""The schedule of ring attention (flashjit.distributed): pure Python, no torch.

Self-attention over a sequence of `seq` positions (the same positions for
queries and keys) whose rows are spread over `world` ranks.  A *layout*
gives each rank its *segments*, (global start, length) pairs: the rank's
local sequence is their concatenation, in order.  Contiguous: one segment
a rank.  Zigzag (the balanced order for causal masks): the sequence cut
into 2 x world chunks, rank r holding chunks r and 2 x world - 1 - r, so
that every rank has as much work under a causal mask.

The ring: at step s (0 .. world - 1) rank r holds the K/V shard of rank
ring_source(r, s) = (r - s) mod world, attends its queries to it, and
passes it on to rank r + 1 (receiving the next one from rank r - 1).
What rank r computes at step s is a list of *calls*: attention of its
local query rows q_lo..q_hi - 1 over the source shard's local key rows
k_lo..k_hi - 1, with a mask flashjit.attention takes (causal
"bottom_right" or none, a window (left, right) or none).  Each call's mask
is exact: the pairs it lets through are exactly the pairs of the global
mask in its rectangle, so that the calls of all steps together visit
every visible (query, key) pair once.  Their results are merged per rank
in schedule order (step by step, calls in order): flashjit.merge.

The global mask: key j visible to query i when j <= i under a causal mask
(top-left and bottom-right agree: seq_q == seq_kv), and i - left <= j <=
i + right under a window (-1: that side unbounded; with a causal mask
right is -1 or 0) -- flashjit.attention's rules for the full sequence.

Everything here is a pure function of (layout, mask): python/tests checks
it against a brute-force mask, and tests/test_ring.c runs its output
(tests/data/ring_schedule.txt) with the float64 reference.
"""
import typing

_INF = 1 << 62  # an unbounded side of a band


class Mask(typing.NamedTuple):
    """The global mask: causal, and a window's sides (-1: unbounded)."""
    causal: bool
    left: int
    right: int

    def visible(self, i, j):
        """Whether query position i sees key position j (global)."""
        if self.causal and j > i:
            return False
        if self.left >= 0 and j < i - self.left:
            return False
        return not (self.right >= 0 and j > i + self.right)

    def band(self):
        """(lo, hi): j - i must lie in lo..hi (+-_INF: unbounded)."""
        lo = -self.left if self.left >= 0 else -_INF
        hi = 0 if self.causal else (self.right if self.right >= 0 else _INF)
        return lo, hi


def mask_of(causal, left=-1, right=-1):
    """A Mask, checked: left and right ints >= -1; with a causal mask,
    right -1 or 0 (flashjit's rule: a causal mask is the window (-1, 0))."""
    for name, x in (("window[0]", left), ("window[1]", right)):
        if isinstance(x, bool) or not isinstance(x, int) or x < -1:
            raise ValueError(f"flashjit.distributed: {name}={x!r} must be an int >= -1 "
                             "(-1: unbounded)")
    if causal and right not in (-1, 0):
        raise ValueError(f"flashjit.distributed: window[1]={right} with a causal mask: it "
                         "must be -1 or 0 (a causal mask is the window (-1, 0))")
    return Mask(bool(causal), left, right)


class Call(typing.NamedTuple):
    """One attention call of a ring step: local query rows q_lo..q_hi - 1
    of the rank, local key rows k_lo..k_hi - 1 of the source shard, and
    its mask as flashjit.attention takes it (causal: "bottom_right" or
    None; window: (left, right) or None)."""
    q_lo: int
    q_hi: int
    k_lo: int
    k_hi: int
    causal: typing.Optional[str]
    window: typing.Optional[typing.Tuple[int, int]]

    def visible(self, i, j):
        """flashjit.attention's mask on the call's rectangle: whether its
        row i sees its key j (0-based within the call), as the library
        aligns it (the diagonal bottom-right: offset keys - rows)."""
        off = (self.k_hi - self.k_lo) - (self.q_hi - self.q_lo)
        if self.causal and j > i + off:
            return False
        if self.window:
            left, right = self.window
            if left >= 0 and j < i + off - left:
                return False
            if right >= 0 and j > i + off + right:
                return False
        return True


# ---- layouts -------------------------------------------------------------------------

def _check_lengths(lengths):
    lengths = tuple(lengths)
    for n in lengths:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"flashjit.distributed: shard length {n!r} must be an int >= 0")
    if not lengths:
        raise ValueError("flashjit.distributed: no ranks")
    return lengths


def contiguous_layout(lengths):
    """Rank r holds positions sum(lengths[:r]) .. + lengths[r] - 1: one
    segment each (a length may be 0)."""
    lengths = _check_lengths(lengths)
    out, start = [], 0
    for n in lengths:
        out.append(((start, n),))
        start += n
    return tuple(out)


def zigzag_chunks(seq, world):
    """The 2 x world chunk lengths of the zigzag order: seq // (2 world)
    each, the first seq % (2 world) one longer."""
    if world < 1 or seq < 0:
        raise ValueError(f"flashjit.distributed: zigzag of {seq} positions over {world} ranks")
    n, extra = divmod(seq, 2 * world)
    return tuple(n + (1 if c < extra else 0) for c in range(2 * world))


def zigzag_layout(seq, world):
    """Rank r holds chunk r and chunk 2 world - 1 - r of zigzag_chunks,
    in that order."""
    chunks = zigzag_chunks(seq, world)
    starts = [sum(chunks[:c]) for c in range(2 * world)]
    return tuple(((starts[r], chunks[r]), (starts[2 * world - 1 - r], chunks[2 * world - 1 - r]))
                 for r in range(world))


def zigzag_lengths(seq, world):
    """Each rank's local length under the zigzag order."""
    c = zigzag_chunks(seq, world)
    return tuple(c[r] + c[2 * world - 1 - r] for r in range(world))


def shard_length(segments):
    return sum(n for _, n in segments)


def positions(segments):
    """The global positions of a rank's local rows, in order."""
    return [g + i for g, n in segments for i in range(n)]


def ring_source(rank, step, world):
    """The rank whose K/V shard rank `rank` holds at step `step`."""
    return (rank - step) % world


# ---- calls ---------------------------------------------------------------------------

def _pieces(q_segs, k_segs, band):
    """Per pair of a query segment and a key segment: its rectangle
    (r0, r1, c0, c1) in the local rows and keys (half-open) and its band
    (lo, hi) of d = local key - local row."""
    out, lq = [], 0
    for gq, nq in q_segs:
        lk = 0
        for gk, nk in k_segs:
            if nq and nk:
                delta = (gk - lk) - (gq - lq)
                out.append(((lq, lq + nq, lk, lk + nk), (band[0] - delta, band[1] - delta)))
            lk += nk
        lq += nq
    return out


def _d_range(rect, lo, hi):
    """The d the band lets through on the rectangle: (a, b), empty when a > b."""
    r0, r1, c0, c1 = rect
    return max(lo, c0 - (r1 - 1)), min(hi, (c1 - 1) - r0)


def _trim(rect, lo, hi):
    """The bounding box of the visible pairs of a band on a rectangle, or
    None when it lets none through."""
    a, b = _d_range(rect, lo, hi)
    if a > b:
        return None
    r0, r1, c0, c1 = rect
    rows = (max(r0, c0 - hi), min(r1 - 1, c1 - 1 - lo))
    cols = (max(c0, r0 + lo), min(c1 - 1, r1 - 1 + hi))
    return rows[0], rows[1] + 1, cols[0], cols[1] + 1


def _same(rect, band_a, band_b):
    """Whether two bands let the same pairs through on a rectangle."""
    a = _d_range(rect, *band_a)
    b = _d_range(rect, *band_b)
    return a == b or (a[0] > a[1] and b[0] > b[1])


def _intersect(r, s):
    out = (max(r[0], s[0]), min(r[1], s[1]), max(r[2], s[2]), min(r[3], s[3]))
    return out if out[0] < out[1] and out[2] < out[3] else None


def _coalesced(pieces, box):
    """A band that agrees with every piece on the box, or None."""
    for cand in [b for _, b in pieces] + [(-_INF, _INF)]:
        if all(sub is None or _same(sub, band, cand)
               for sub, band in ((_intersect(rect, box), band) for rect, band in pieces)):
            return cand
    return None


def _call(box, band):
    """A Call for the box, with the band (local d) as flashjit's mask."""
    r0, r1, c0, c1 = box
    lq, lk = r1 - r0, c1 - c0
    shift = c0 - r0
    lo, hi = band[0] - shift, band[1] - shift
    off = lk - lq
    right = -1 if hi >= lk - 1 else hi - off
    left = -1 if lo <= -(lq - 1) else off - lo
    if right < -1 or left < -1:  # a trimmed box always has them: see the module
        raise AssertionError(f"flashjit.distributed: band {band} on {box} is no mask of "
                             "flashjit's")
    if right == 0:
        return Call(r0, r1, c0, c1, "bottom_right", None if left == -1 else (left, -1))
    if right == -1 and left == -1:
        return Call(r0, r1, c0, c1, None, None)
    return Call(r0, r1, c0, c1, None, (left, right))


def step_calls(q_segs, k_segs, mask):
    """The calls of one ring step: rank's queries (q_segs) over one K/V
    shard (k_segs).  One call over the bounding box of the visible pairs
    where one mask of flashjit's covers them all (a contiguous shard's
    steps; the zigzag order's, whose segments keep the global order),
    else one call per (query segment, key segment) that sees anything,
    in segment order.  Empty where nothing is visible."""
    pieces = [(rect, band) for rect, band in _pieces(q_segs, k_segs, mask.band())]
    boxes = [(_trim(rect, *band), band) for rect, band in pieces]
    boxes = [(b, band) for b, band in boxes if b is not None]
    if not boxes:
        return ()
    box = (min(b[0] for b, _ in boxes), max(b[1] for b, _ in boxes),
           min(b[2] for b, _ in boxes), max(b[3] for b, _ in boxes))
    band = _coalesced(pieces, box)
    if band is not None:
        return (_call(box, band),)
    return tuple(_call(b, band) for b, band in boxes)


def cross_plan(q_lens, kv_lens):
    """plan() without a mask where the queries and the keys are other
    positions (cross-attention: rank r holds q_lens[r] queries and
    kv_lens[r] keys): at each step one call of all the rank's rows over
    the whole shard it holds, none where either is empty."""
    world = len(q_lens)
    return tuple(tuple(((Call(0, q_lens[r], 0, kv_lens[ring_source(r, s, world)], None, None),)
                        if q_lens[r] and kv_lens[ring_source(r, s, world)] else ())
                       for s in range(world))
                 for r in range(world))


def plan(layout, mask):
    """plan[r][s]: the calls of rank r at step s (a tuple, maybe empty),
    for every rank and every step of the ring."""
    world = len(layout)
    return tuple(tuple(step_calls(layout[r], layout[ring_source(r, s, world)], mask)
                       for s in range(world))
                 for r in range(world))


# ---- the golden file of tests/test_ring.c ----------------------------------------------

def golden_lines(name, layout, mask, extra=""):
    """One case of tests/data/ring_schedule.txt: the case line (name,
    world, seq, mask; `extra`: the test's own sizes), each rank's
    segments, each call (rank, step, source, rectangle, causal 0/2,
    window), then `end`."""
    world = len(layout)
    seq = sum(shard_length(s) for s in layout)
    out = [f"case {name} world {world} seq {seq} causal {int(mask.causal)} left {mask.left} "
           f"right {mask.right}{' ' + extra if extra else ''}"]
    for r, segs in enumerate(layout):
        out.append(f"shard {r} {len(segs)} " + " ".join(f"{g} {n}" for g, n in segs))
    for r, steps in enumerate(plan(layout, mask)):
        for s, calls in enumerate(steps):
            for c in calls:
                wl, wr = c.window if c.window else (-1, -1)
                out.append(f"call {r} {s} {ring_source(r, s, world)} {c.q_lo} {c.q_hi} "
                           f"{c.k_lo} {c.k_hi} {2 if c.causal else 0} {wl} {wr}")
    out.append("end")
    return out
