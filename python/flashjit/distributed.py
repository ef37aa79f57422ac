"""flashjit.distributed: attention over a sequence sharded across ranks.

Context parallelism by ring attention over torch.distributed (NCCL on
GPUs; any backend with point-to-point operations):

    import torch.distributed as dist, flashjit.distributed as fjd
    dist.init_process_group("nccl")            # torchrun --nproc-per-node 2 ...
    q, k, v = (fjd.shard(t, world, rank, order="zigzag") for t in (q_full, k_full, v_full))
    out = fjd.ring_attention(q, k, v, causal=True, order="zigzag")   # this rank's rows
    out.sum().backward()                       # dK/dV travel back around the ring

Each rank holds its queries and its K/V shard of the same positions.  At
step s of the ring a rank attends its queries to the K/V shard of rank
(rank - s) mod world with flashjit.attention(..., return_lse=True), while
the next shard travels one rank on (torch.distributed.batch_isend_irecv:
the process group's stream carries it while the current stream computes);
the partial (O, LSE) of all steps are merged in schedule order with
flashjit.merge, so the result does not depend on timing.  Which rows
meet which keys at each step, and with what mask, is the pure schedule of
flashjit._ring (checked against a brute-force mask without torch, and
against the float64 reference by tests/test_ring.c).  The backward runs
the ring again: dQ accumulates on its rank, dK and dV (float32) travel
with their shard and come home after the last step.
"""
import functools
import math
import typing

try:
    import torch
    import torch.distributed as dist
except ImportError as e:  # the schedule alone (flashjit._ring) needs no torch
    raise ImportError("flashjit.distributed needs PyTorch with torch.distributed "
                      f"({e})") from None
if not hasattr(torch.library, "custom_op"):
    raise ImportError("flashjit.distributed needs PyTorch 2.4 or newer "
                      f"(torch.library.custom_op); this is PyTorch {torch.__version__}")

from . import _capi as capi
from . import _merge
from . import _problem as pr
from . import _ring

_WHO = "flashjit.distributed.ring_attention"
ORDERS = ("contiguous", "zigzag")


# ---- layouts -------------------------------------------------------------------------

def contiguous_lengths(seq, world):
    """seq positions over world ranks as evenly as they go: seq // world
    each, the first seq % world one more."""
    n, extra = divmod(seq, world)
    return tuple(n + (1 if r < extra else 0) for r in range(world))


def zigzag_lengths(seq, world):
    """Each rank's length under the zigzag order (chunks r and
    2 world - 1 - r of 2 world chunks as even as they go)."""
    return _ring.zigzag_lengths(seq, world)


def _layout(order, lens):
    """The ranks' segments for the order and the ranks' lengths."""
    if order == "contiguous":
        return _ring.contiguous_layout(lens)
    seq, world = sum(lens), len(lens)
    want = _ring.zigzag_lengths(seq, world)
    if tuple(lens) != want:
        raise ValueError(f"{_WHO}: order 'zigzag' over {world} ranks cuts {seq} positions "
                         f"into ranks of {list(want)} positions (flashjit.distributed.shard); "
                         f"the ranks hold {list(lens)}")
    return _ring.zigzag_layout(seq, world)


def _order(order):
    if order not in ORDERS:
        raise ValueError(f"{_WHO}: order={order!r} is not one of {', '.join(ORDERS)}")
    return order


def shard(x, world, rank, *, order="contiguous", dim=2, shard_lens=None):
    """Rank `rank`'s piece of a full tensor along dim (2: the sequence of
    "bhsd"; 1 for "bshd"): for order "contiguous" the rank's run of
    shard_lens (default contiguous_lengths), for "zigzag" its two chunks,
    concatenated.  A new contiguous tensor."""
    seq = x.shape[dim]
    if _order(order) == "contiguous":
        lens = tuple(shard_lens) if shard_lens is not None else contiguous_lengths(seq, world)
        if len(lens) != world or sum(lens) != seq:
            raise ValueError(f"flashjit.distributed.shard: shard_lens {list(lens)} do not cut "
                             f"{seq} positions into {world} pieces")
        segs = _ring.contiguous_layout(lens)[rank]
    else:
        segs = _ring.zigzag_layout(seq, world)[rank]
    return torch.cat([x.narrow(dim, g, n) for g, n in segs], dim).contiguous()


def unshard(pieces, *, order="contiguous", dim=2):
    """The full tensor from every rank's piece (in rank order): shard's
    inverse."""
    lens = [p.shape[dim] for p in pieces]
    layout = _layout(_order(order), lens)
    seq = sum(lens)
    shape = list(pieces[0].shape)
    shape[dim] = seq
    out = pieces[0].new_empty(shape)
    for segs, p in zip(layout, pieces):
        at = 0
        for g, n in segs:
            out.narrow(dim, g, n).copy_(p.narrow(dim, at, n))
            at += n
    return out


@functools.lru_cache(maxsize=64)
def _plan(layout, mask):
    return _ring.plan(layout, mask)


# ---- one rank's work -------------------------------------------------------------------

class _Spec(typing.NamedTuple):
    """What every call of one ring shares."""
    mask: _ring.Mask
    softcap: typing.Optional[float]
    scale: typing.Optional[float]
    layout: str           # "bhsd" or "bshd"
    fwd: typing.Callable  # (q, k, v, **call) -> (o, lse)
    bwd: typing.Callable  # (dout, q, k, v, o, lse, **call) -> (dq, dk, dv)

    @property
    def seq_dim(self):
        return 2 if self.layout == "bhsd" else 1

    def rows(self, t, lo, hi):
        return t.narrow(self.seq_dim, lo, hi - lo)

    def call_args(self, c):
        return dict(causal=c.causal, window=c.window, softcap=self.softcap, scale=self.scale,
                    layout=self.layout)


def _fj_fwd(q, k, v, **call):
    """A step's attention: flashjit.attention with its log-sum-exp."""
    from . import attention
    return attention(q, k, v, return_lse=True, **call)


def _fj_bwd(dout, q, k, v, out, lse, *, causal, window, softcap, scale, layout, dlse=None):
    """A step's gradients given the merged O and LSE (fj_attention_bwd
    through torch.ops.flashjit.attention_bwd): P = exp(S - LSE) of the
    whole row, so each step adds its part of the gradients.  dlse: the
    loss's gradient at the merged LSE (the step's rows), or None."""
    wl, wr = window if window else (-1, -1)
    dq, dk, dv, _ = torch.ops.flashjit.attention_bwd(
        dout, q, k, v, out, lse.contiguous(), pr.causal_code(causal), pr.scale_value(scale),
        pr.LAYOUTS[layout], wl, wr, softcap or 0.0, None,
        torch.are_deterministic_algorithms_enabled(),
        dlse=None if dlse is None else dlse.contiguous())
    return dq, dk, dv


def _dims(t, layout):
    b, x, y, d = t.shape
    return (b, x, y, d) if layout == "bhsd" else (b, y, x, d)


class _RankFwd:
    """One rank's forward: each call's (O, LSE) into its own part (rows it
    does not cover: 0 and -inf), merged in schedule order at the end."""

    def __init__(self, q, steps, spec):
        self.q, self.steps, self.spec = q, steps, spec
        nparts = sum(len(c) for c in steps)  # at most SPLITS_MAX: _schedule checks it
        b, h, s, d = _dims(q, spec.layout)
        work = torch.float32 if q.is_cuda else torch.float64
        self.o_parts = torch.zeros((nparts, b, h, s, d), dtype=work, device=q.device)
        self.lse_parts = torch.full((nparts, b, h, s), -math.inf, dtype=work, device=q.device)
        self.part = 0

    def step(self, s, k, v):
        sp = self.spec
        for c in self.steps[s]:
            o, lse = sp.fwd(sp.rows(self.q, c.q_lo, c.q_hi), sp.rows(k, c.k_lo, c.k_hi),
                            sp.rows(v, c.k_lo, c.k_hi), **sp.call_args(c))
            if sp.layout == "bshd":
                o = o.transpose(1, 2)
            self.o_parts[self.part, :, :, c.q_lo:c.q_hi].copy_(o)
            self.lse_parts[self.part, :, :, c.q_lo:c.q_hi].copy_(lse)
            self.part += 1

    def finish(self, sinks=None):
        """The merged (O, LSE); sinks (float32 (heads_q,), or None) join
        each row's sum here, once: the steps' calls leave them out."""
        q, lay = self.q, self.spec.layout
        b, h, s, _ = _dims(q, lay)
        out = torch.zeros_like(q, memory_format=torch.contiguous_format)
        lse = torch.full((b, h, s), -math.inf, dtype=torch.float32, device=q.device)
        if sinks is not None:
            lse.copy_(sinks.float().view(1, h, 1).expand(b, h, s))  # a row no part saw
        if self.part:
            _merge.merge_into(self.o_parts, self.lse_parts, out, lse, pr.LAYOUTS[lay], sinks)
        return out, lse


def _sink_grad(out, dout, lse, dlse, sinks, layout):
    """This rank's rows' part of the sinks' gradient, float32 (heads_q,)
    (_merge.sink_grad of out and dout in the layout)."""
    o, do = (t.float() if layout == "bhsd" else t.float().transpose(1, 2) for t in (out, dout))
    return _merge.sink_grad(o, do, lse, dlse, sinks)


class _RankBwd:
    """One rank's backward: each call's gradients from the merged O and
    LSE (and the loss's gradient at that LSE, dlse, where it has one); dQ
    summed here (float32), dK and dV handed back per call for the shard's
    travelling sums."""

    def __init__(self, q, out, lse, dout, steps, spec, dlse=None):
        self.q, self.out, self.lse, self.dout = q, out, lse, dout
        self.steps, self.spec, self.dlse = steps, spec, dlse
        self.dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)

    def step(self, s, k, v):
        sp, got = self.spec, []
        for c in self.steps[s]:
            r = functools.partial(sp.rows, lo=c.q_lo, hi=c.q_hi)
            more = {} if self.dlse is None else {"dlse": self.dlse[:, :, c.q_lo:c.q_hi]}
            dq, dk, dv = sp.bwd(r(self.dout), r(self.q), sp.rows(k, c.k_lo, c.k_hi),
                                sp.rows(v, c.k_lo, c.k_hi), r(self.out),
                                self.lse[:, :, c.q_lo:c.q_hi], **sp.call_args(c), **more)
            r(self.dq).add_(dq)
            got.append((c.k_lo, c.k_hi, dk, dv))
        return got

    def finish(self):
        return self.dq.to(self.q.dtype)


def _add(spec, acc, got):
    """A step's dK and dV parts into the shard's float32 sums, in call order."""
    for lo, hi, dk, dv in got:
        spec.rows(acc[0], lo, hi).add_(dk)
        spec.rows(acc[1], lo, hi).add_(dv)


def _zeros(t, spec, n, dtype=None, empty=False):
    """A tensor like t with n positions (float32 sums: dtype), of zeros
    or (empty: a receive buffer) unset."""
    shape = list(t.shape)
    shape[spec.seq_dim] = n
    make = t.new_empty if empty else t.new_zeros
    return make(shape, dtype=dtype or t.dtype)


# ---- the ring over torch.distributed -------------------------------------------------------

class _Comm:
    """Point-to-point with the ring's neighbours: send to rank + 1, receive
    from rank - 1, as one batch (NCCL: one group, on the process group's
    own stream; the current stream waits for it at wait())."""

    def __init__(self, group, rank, world):
        g = group if group is not None else dist.group.WORLD
        self.group = group
        self.next = dist.get_global_rank(g, (rank + 1) % world)
        self.prev = dist.get_global_rank(g, (rank - 1) % world)

    def exchange(self, send, recv):
        # An empty shard travels as one element, so that every rank takes
        # part in every batch (NCCL's first batch must involve them all).
        def some(t):
            return t if t.numel() else t.new_zeros(1)
        ops = [dist.P2POp(dist.isend, some(t), self.next, self.group) for t in send]
        ops += [dist.P2POp(dist.irecv, some(t), self.prev, self.group) for t in recv]
        return dist.batch_isend_irecv(ops)

    @staticmethod
    def wait(works):
        for w in works:
            w.wait()


class _Run:
    """One ring_attention call's fixed facts: this rank, the ranks'
    lengths, the schedule, the calls' spec, the transport."""

    def __init__(self, comm, rank, lens, steps, spec):
        """lens: every rank's K/V length (the shards that travel)."""
        self.comm, self.rank, self.lens, self.steps, self.spec = comm, rank, lens, steps, spec

    @property
    def world(self):
        return len(self.lens)

    def _next_kv(self, k, v, s):
        """Receive buffers for the shard of step s + 1."""
        n = self.lens[(self.rank - s - 1) % self.world]
        return (_zeros(k, self.spec, n, empty=True), _zeros(v, self.spec, n, empty=True))

    def forward(self, q, k, v, sinks=None):
        fwd = _RankFwd(q, self.steps, self.spec)
        for s in range(self.world):
            works = []
            if s + 1 < self.world:
                nk, nv = self._next_kv(k, v, s)
                works = self.comm.exchange([k, v], [nk, nv])
            fwd.step(s, k, v)
            if s + 1 < self.world:
                self.comm.wait(works)
                k, v = nk, nv
        return fwd.finish(sinks)

    def backward(self, q, k, v, out, lse, dout, dlse=None):
        bwd, sp, world = (_RankBwd(q, out, lse, dout, self.steps, self.spec, dlse), self.spec,
                          self.world)
        acc = dkv = None
        for s in range(world):
            works = []
            if s + 1 < world:
                nk, nv = self._next_kv(k, v, s)
                works = self.comm.exchange([k, v], [nk, nv])
            got = bwd.step(s, k, v)
            if s == 0:
                acc = (_zeros(k, sp, k.shape[sp.seq_dim], torch.float32),
                       _zeros(v, sp, v.shape[sp.seq_dim], torch.float32))
            else:
                self.comm.wait(dkv[0])
                acc = dkv[1]
            _add(sp, acc, got)
            if world > 1:
                # The sums go one rank on with their shard; after the last
                # step that rank is the shard's own.
                n = self.lens[(self.rank - s - 1) % world]
                nacc = tuple(_zeros(t, sp, n, torch.float32, empty=True) for t in (k, v))
                dkv = (self.comm.exchange(list(acc), list(nacc)), nacc)
            if s + 1 < world:
                self.comm.wait(works)
                k, v = nk, nv
        if world > 1:
            self.comm.wait(dkv[0])
            acc = dkv[1]
        return bwd.finish(), acc[0].to(q.dtype), acc[1].to(q.dtype)


class _RingFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, run):
        out, lse = run.forward(q, k, v, None if sinks is None else sinks.detach().contiguous())
        ctx.save_for_backward(q, k, v, out, lse, sinks)
        ctx.run = run
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, sinks = ctx.saved_tensors
        if dout is None:  # every rank must still take its part in the ring
            dout = torch.zeros_like(out)
        dlse = None if dlse is None else dlse.contiguous()
        dq, dk, dv = ctx.run.backward(q, k, v, out, lse, dout.contiguous(), dlse)
        dsinks = None
        if sinks is not None and ctx.needs_input_grad[3]:
            # This rank's rows' part, as its dq, dk and dv carry its rows'
            # part into the weights: the trainer's reduction over the group
            # sums the ranks' parts (a sum here would be counted world times).
            dsinks = _sink_grad(out, dout, lse, dlse, sinks, ctx.run.spec.layout)
        return dq, dk, dv, dsinks, None


# ---- the entry ---------------------------------------------------------------------------

def _spec(q, k, v, causal, window, softcap, scale, layout, attention):
    """The calls' spec, every argument checked (one line each)."""
    lay = pr.NAMES_LAYOUT[pr.choose("layout", layout, pr.LAYOUTS)]
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{_WHO}: {name} must be a 4-d torch.Tensor ({lay}), not "
                             f"{getattr(t, 'shape', type(t).__name__)}")
    bq, hq, sq, dq = _dims(q, lay)
    bk, hk, sk, dk = _dims(k, lay)
    if tuple(k.shape) != tuple(v.shape) or bq != bk or dq != dk:
        raise ValueError(f"{_WHO}: q {tuple(q.shape)}, k {tuple(k.shape)} and v "
                         f"{tuple(v.shape)} must be one rank's shards (layout '{lay}': equal "
                         "batch and head dim; k and v alike)")
    if hk == 0 or hq % hk:
        raise ValueError(f"{_WHO}: q has {hq} heads and k, v {hk}: the query heads must be a "
                         "multiple of the KV heads (GQA)")
    if dq % 8:
        # attention() would pad the forward's calls, but the ring's backward
        # calls the library's on the shards as they are.
        raise ValueError(f"{_WHO}: head dim {dq} is not a multiple of 8: pad q, k and v "
                         f"with zero columns to {dq + -dq % 8} and pass scale={dq}**-0.5")
    if not q.device == k.device == v.device:
        raise ValueError(f"{_WHO}: q, k and v must be on one device; got {q.device}, "
                         f"{k.device}, {v.device}")
    c = pr.causal_code(causal) != capi.CAUSAL_NONE
    if window is None:
        left, right = -1, -1
    elif isinstance(window, (tuple, list)) and len(window) == 2:
        left, right = window
    else:
        raise ValueError(f"{_WHO}: window={window!r} must be a pair (left, right); -1 leaves "
                         "a side unbounded")
    mask = _ring.mask_of(c, left, right)
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
            raise TypeError(f"{_WHO}: softcap must be a number or None, not {softcap!r}")
        softcap = pr.float32_arg("softcap", softcap)
    if scale is not None:
        pr.scale_value(scale)
    fwd, bwd = (_fj_fwd, _fj_bwd) if attention is None else attention
    return _Spec(mask, softcap or None, scale, lay, fwd, bwd)


def _check_sinks(sinks, q, spec):
    """sinks: None, or float32 (heads_q,) on q's kind of device (one line
    else); returned on q's device itself (differentiably).  What every
    rank checks alike: a sink on another GPU than the rank's is moved,
    not refused on some ranks only (the others would wait in the ring)."""
    if sinks is None:
        return None
    heads = _dims(q, spec.layout)[1]
    if (not isinstance(sinks, torch.Tensor) or sinks.dtype != torch.float32 or
            tuple(sinks.shape) != (heads,) or sinks.device.type != q.device.type):
        raise ValueError(f"{_WHO}: sinks must be a float32 tensor ({heads},) on a "
                         f"{q.device.type} device, not "
                         f"{getattr(sinks, 'dtype', type(sinks).__name__)} "
                         f"{tuple(getattr(sinks, 'shape', ()))}")
    return sinks.to(q.device)


def _given_lens(name, lens, world, rank, n, what):
    """A lengths argument, checked against this rank's n."""
    out = tuple(lens)
    if len(out) != world or any(isinstance(x, bool) or not isinstance(x, int) or x < 0
                                for x in out):
        raise ValueError(f"{_WHO}: {name}={lens!r} must be {world} ints >= 0, one a rank")
    if out[rank] != n:
        raise ValueError(f"{_WHO}: {name}[{rank}] = {out[rank]} but rank {rank} holds {n} "
                         f"{what}")
    return out


def _lengths(q, k, spec, group, world, rank, shard_lens, kv_shard_lens):
    """(every rank's query length, every rank's K/V length): the
    arguments, checked against this rank's, or gathered from the ranks
    (one all_gather of both).  Without kv_shard_lens the keys are the
    queries' positions where shard_lens is given."""
    nq, nk = q.shape[spec.seq_dim], k.shape[spec.seq_dim]
    gathered = None
    if shard_lens is None:
        mine = torch.tensor([nq, nk], dtype=torch.int64, device=q.device)
        every = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(every, mine, group=group)
        gathered = [tuple(int(x) for x in t.tolist()) for t in every]
        q_lens = tuple(g[0] for g in gathered)
    else:
        q_lens = _given_lens("shard_lens", shard_lens, world, rank, nq, "query positions")
    if gathered is not None:
        # The gathered lengths are every rank's: an argument that disagrees
        # is refused on every rank alike.
        kv_lens = tuple(g[1] for g in gathered)
        if kv_shard_lens is not None and tuple(kv_shard_lens) != kv_lens:
            raise ValueError(f"{_WHO}: kv_shard_lens={kv_shard_lens!r} but the ranks hold "
                             f"{list(kv_lens)} key/value positions")
    elif kv_shard_lens is not None:
        kv_lens = _given_lens("kv_shard_lens", kv_shard_lens, world, rank, nk,
                              "key/value positions")
    else:
        kv_lens = _given_lens("shard_lens", shard_lens, world, rank, nk,
                              "key/value positions (kv_shard_lens: other ones)")
    return q_lens, kv_lens


def _schedule(order, q_lens, kv_lens, mask):
    """Every rank's steps: plan() over the order's layout where the keys
    are the queries' positions, cross_plan() where they are not (no mask:
    _spec refuses one there)."""
    _layout(_order(order), q_lens)
    if tuple(kv_lens) == tuple(q_lens):
        plan = _plan(_layout(order, q_lens), mask)
    elif mask != _ring.mask_of(False):
        raise ValueError(f"{_WHO}: the ranks hold {list(q_lens)} query positions and "
                         f"{list(kv_lens)} key/value positions: a causal mask or a window "
                         "needs the keys of the queries' positions")
    else:  # the keys' order does not matter without a mask
        plan = _ring.cross_plan(tuple(q_lens), tuple(kv_lens))
    # Every rank's count, so that every rank refuses alike.
    nparts = max(sum(len(c) for c in steps) for steps in plan)
    if nparts > capi.SPLITS_MAX:
        raise ValueError(f"{_WHO}: {nparts} attention calls on one rank: at most "
                         f"{capi.SPLITS_MAX} merge at once (fewer ranks, or contiguous shards)")
    return plan


def ring_attention(q, k, v, group=None, *, causal=None, window=None, softcap=None,
                   scale=None, layout="bhsd", order="contiguous", shard_lens=None,
                   kv_shard_lens=None, return_lse=False, sinks=None, _attention=None):
    """Attention over a sequence whose positions are spread over the ranks
    of `group` (torch.distributed; None: the default group): this rank's
    rows of softmax(scale * Q K^T [masked]) V over the whole sequence.

    q, k, v: this rank's shard -- its query rows and the K/V rows of the
    same positions -- as flashjit.attention takes them (layout "bhsd" or
    "bshd", float16/bfloat16 CUDA tensors, heads_q a multiple of heads_kv:
    GQA).  order "contiguous": rank r holds the r-th run of positions
    (lengths may differ, 0 included); "zigzag": the sequence cut into
    2 x world chunks and rank r holding chunks r and 2 world - 1 - r
    (flashjit.distributed.shard cuts a full tensor so), which balances a
    causal mask's work.  shard_lens: every rank's length, in rank order;
    None gathers them (one all_gather a call).  Given, they must be the
    same list on every rank: a rank whose own length disagrees refuses
    alone, and the others then wait in the ring.

    Cross-attention: without a causal mask or a window, k and v may hold
    other positions than q (an encoder's keys, say), each rank its shard
    of them (kv_shard_lens: every rank's K/V length where shard_lens is
    given; else gathered with the queries'): each step attends the rank's
    rows to the whole shard it holds.

    causal (None, True, "top_left", "bottom_right": one mask here, the
    sequence being both the queries and the keys), window=(left, right),
    softcap and scale as flashjit.attention takes them, for the whole
    sequence.  return_lse: also this rank's rows' natural-log sum-exp,
    float32 (batch, heads_q, rows).  sinks: float32 (heads_q,) logits on
    q's device, the same on every rank, that join each row's denominator
    once (flashjit.attention's): the merge adds them, and each rank's
    sinks.grad is its rows' part (as the weights' gradients through q, k
    and v are: the data- and context-parallel reduction of a trainer sums
    them over the ranks).

    K and V go around the ring (torch.distributed.batch_isend_irecv, on the
    process group's stream, while flashjit.attention computes the held
    shard on the current stream); each step's partial (O, LSE) is merged
    in the schedule's order by flashjit.merge (split-KV's combine kernel):
    the result does not depend on timing.  Differentiable in q, k and v:
    the backward runs the ring again, dK and dV (float32) travelling with
    their shard; every rank of the group must call it (and its backward)
    together.  Memory: the steps' partial outputs are kept in float32 until
    the merge -- world x (batch x heads_q x rows x head_dim x 4) bytes on
    each rank for a contiguous or zigzag order.

    _attention (testing): a pair (fwd, bwd) that replaces flashjit's
    kernels -- fwd(q, k, v, *, causal, window, softcap, scale, layout) ->
    (out, lse) and bwd(dout, q, k, v, out, lse, **the same) -> (dq, dk, dv)
    with the merged out and lse (and dlse=, the step's rows of the merged
    lse's gradient, where the loss uses the returned lse) -- so that the
    schedule and the transport run on CPU tensors (Gloo) without a GPU.
    """
    spec = _spec(q, k, v, causal, window, softcap, scale, layout, _attention)
    sinks = _check_sinks(sinks, q, spec)  # before any collective: every rank refuses alike
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{_WHO}: torch.distributed is not initialized "
                           "(dist.init_process_group, e.g. under torchrun)")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    q_lens, kv_lens = _lengths(q, k, spec, group, world, rank, shard_lens, kv_shard_lens)
    steps = _schedule(order, q_lens, kv_lens, spec.mask)[rank]
    run = _Run(_Comm(group, rank, world), rank, kv_lens, steps, spec)
    k, v = k.contiguous(), v.contiguous()  # they travel: point-to-point wants them dense
    out, lse = _RingFunction.apply(q, k, v, sinks, run)
    return (out, lse) if return_lse else out


# ---- the ring simulated in one process (tests) ---------------------------------------------

def _simulate(q, k, v, world, *, order="contiguous", shard_lens=None, kv_shard_lens=None,
              causal=None, window=None, softcap=None, scale=None, layout="bhsd", dout=None,
              dlse=None, sinks=None, _attention=None):
    """ring_attention over `world` simulated ranks in one process, on full
    tensors: each rank's shard cut by shard(), the same schedule, the same
    per-rank classes and merges, the shards and the dK/dV sums passed by
    hand in the ring's order.  Returns (out, lse) of the full sequence,
    and with dout (the full output's gradient; dlse, the full lse's, if
    any) also (dq, dk, dv), and with sinks dsinks after them (the ranks'
    parts summed in rank order)."""
    spec = _spec(q, k, v, causal, window, softcap, scale, layout, _attention)
    sinks = _check_sinks(sinks, q, spec)
    dim = spec.seq_dim
    cut = functools.partial(shard, world=world, order=order, dim=dim, shard_lens=shard_lens)
    cut_kv = functools.partial(shard, world=world, order=order, dim=dim,
                               shard_lens=kv_shard_lens if kv_shard_lens is not None else
                               shard_lens if k.shape[dim] == q.shape[dim] else None)
    qs = [cut(q, rank=r) for r in range(world)]
    ks, vs = ([cut_kv(t, rank=r) for r in range(world)] for t in (k, v))
    lens = tuple(t.shape[dim] for t in ks)
    plan = _schedule(order, tuple(t.shape[dim] for t in qs), lens, spec.mask)
    fwds = [_RankFwd(qs[r], plan[r], spec) for r in range(world)]
    for s in range(world):
        for r in range(world):
            src = _ring.ring_source(r, s, world)
            fwds[r].step(s, ks[src], vs[src])
    res = [f.finish(None if sinks is None else sinks.contiguous()) for f in fwds]
    join = functools.partial(unshard, order=order, dim=dim)
    out, lse = join([o for o, _ in res]), unshard([l for _, l in res], order=order, dim=2)
    if dout is None:
        return out, lse
    douts = [cut(dout, rank=r) for r in range(world)]
    dlses = [None if dlse is None else cut(dlse, rank=r, dim=2) for r in range(world)]
    bwds = [_RankBwd(qs[r], res[r][0], res[r][1], douts[r], plan[r], spec, dlses[r])
            for r in range(world)]
    acc = [None] * world
    for s in range(world):
        for r in range(world):
            src = _ring.ring_source(r, s, world)
            got = bwds[r].step(s, ks[src], vs[src])
            if s == 0:
                acc[src] = (_zeros(ks[src], spec, lens[src], torch.float32),
                            _zeros(vs[src], spec, lens[src], torch.float32))
            _add(spec, acc[src], got)
    dq = join([b.finish() for b in bwds])
    dk = join([a[0].to(k.dtype) for a in acc])
    dv = join([a[1].to(v.dtype) for a in acc])
    if sinks is None:
        return out, lse, (dq, dk, dv)
    dsinks = sum(_sink_grad(res[r][0], douts[r], res[r][1], dlses[r], sinks, spec.layout)
                 for r in range(world))
    return out, lse, (dq, dk, dv, dsinks)
