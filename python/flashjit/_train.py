"""The backward and the training calls: attention() sends a call whose
inputs require grad to flashjit::attention_train (built-in masks; its
backward flashjit::attention_bwd) or to flashjit::attention_train_mods
(score_mod, mask_mod, params, block masks; its backward
flashjit::attention_bwd_mods), custom ops with a fake and an autograd
formula each, which torch.compile traces.  Eagerly the training calls
skip those ops' dispatch: autograd.Functions (_Train, _TrainCall for
attention()'s repeats, _TrainMods) run the same forwards and backwards.
attention_varlen() (_serving.py) does the same with the training ops'
varlen arguments: one autograd formula and one backward path
(_launch_bwd, calls.BWD_PROBLEMS) for both kinds.

Imported only where torch imports.
"""
import ctypes as C
import functools
import inspect
import typing

import torch

from . import _args as ar
from . import _calls as calls
from . import _capi as capi
from . import _core as core
from . import _native as native
from . import _problem as pr


# ---- the backward ----------------------------------------------------------------

def _dense(t):
    """Whether t's elements fill its span exactly once (any order of the
    dimensions): its gradient can take its strides (fj_attention_bwd lays
    dq, dk and dv out as q, k and v are)."""
    dims = sorted((s, n) for s, n in zip(t.stride(), t.shape) if n > 1)
    want = 1
    for s, n in dims:
        if s != want:
            return False
        want *= n
    return True


def _disjoint(t):
    """Whether no two of t's elements share an address: its dimensions,
    by stride, each step past all the smaller ones' span (a slice of a
    packed projection, as q, k and v of a fused QKV are).  Such a tensor's
    gradient can take its strides (gaps and all)."""
    return _nests(tuple(t.shape), t.stride())


def _nests(shape, stride):
    """_disjoint's test on a shape and its strides."""
    span = 1
    for s, n in sorted((s, n) for s, n in zip(stride, shape) if n > 1):
        if s < span:
            return False
        span += s * (n - 1)
    return True


@functools.lru_cache(maxsize=256)
def _apart(shape_a, stride_a, shape_b, stride_b, delta):
    """Whether two _disjoint views of one storage, b's first element delta
    elements after a's, have no element in common, in the fused
    projection's pattern: the same strides, the same sizes but along one
    dimension d, and b a's shift along d to a range apart from a's, so
    that both are parts of one view over the two ranges and what lies
    between -- checked to be _disjoint itself, which makes its parts so
    (q, k and v as slices of a QKV's heads, unbind's halves).  False for
    anything else (the same view twice, overlapping slices)."""
    if stride_a != stride_b or delta == 0:
        return False
    differ = [i for i, (x, y) in enumerate(zip(shape_a, shape_b)) if x != y]
    if len(differ) > 1:
        return False
    for d in differ or range(len(shape_a)):
        s = stride_a[d]
        if s <= 0 or delta % s:
            continue
        m = delta // s
        if m < shape_a[d] and m + shape_b[d] > 0:
            continue  # their ranges along d overlap
        union = list(shape_a)
        union[d] = max(shape_a[d], m + shape_b[d]) - min(0, m)
        if _nests(union, stride_a):
            return True
    return False


def _share_ok(ts):
    """Whether the _disjoint views ts of one storage are pairwise apart
    (_apart): then their gradients may be views of one buffer laid out as
    that storage is."""
    for i, a in enumerate(ts):
        for b in ts[i + 1:]:
            if not _apart(tuple(a.shape), a.stride(), tuple(b.shape), b.stride(),
                          b.storage_offset() - a.storage_offset()):
                return False
    return True


def _copies(q, k, v, views):
    """(which of q, k and v a backward copies dense, whether any is read in
    place though not dense): with views, _disjoint ones are read where
    they are; without, every one not dense is copied."""
    copy = tuple(not (_dense(t) or views and _disjoint(t)) for t in (q, k, v))
    return copy, any(not c and not _dense(t) for t, c in zip((q, k, v), copy))


def _grads_as_laid_out(q, k, v, zero):
    """dq, dk, dv in q's, k's and v's strides, for a backward that reads
    q, k and v where they are (dense or _disjoint): a dense one's as
    torch.empty_like makes it; the others' as views of one new buffer
    that mirrors the storage they share (the fused projection's: q, k and
    v of a QKV at their own offsets, the three gradients in the
    projection's size once) where they are apart (_share_ok), or of a
    buffer of each one's own span where they share none, overlap (the same
    view as q and k, say: two gradients must not share addresses) or share
    a storage more than twice their size."""
    alloc = torch.zeros if zero else torch.empty
    out, shared = [None] * 3, {}
    for i, t in enumerate((q, k, v)):
        if _dense(t):
            out[i] = torch.zeros_like(t) if zero else torch.empty_like(t)
        else:
            shared.setdefault(t.untyped_storage().data_ptr(), []).append(i)
    for idx in shared.values():
        ts = [(q, k, v)[i] for i in idx]
        size = ts[0].untyped_storage().nbytes() // ts[0].element_size()
        if size <= 2 * sum(t.numel() for t in ts) and _share_ok(ts):
            buf = alloc(size, dtype=ts[0].dtype, device=ts[0].device)
            for i, t in zip(idx, ts):
                out[i] = buf.as_strided(t.shape, t.stride(), t.storage_offset())
        else:
            for i, t in zip(idx, ts):
                span = 1 + sum(s * (n - 1) for s, n in zip(t.stride(), t.shape))
                out[i] = alloc(span, dtype=t.dtype, device=t.device).as_strided(t.shape,
                                                                                   t.stride())
    return tuple(out)


def grad_like(t):
    """An empty gradient of q, k or v as the backward lays it out: in t's
    strides where t is dense, else contiguous (the backward runs on a
    contiguous copy of a broadcast or a strided view).  The backward ops'
    fakes use it too: Inductor lays out what follows an op by its fake's
    strides, and a fused QKV projection viewed as BHSD is no dense tensor,
    whose torch.empty_like keeps its BSHD order."""
    return torch.empty_like(t) if _dense(t) else t.new_empty(t.shape)


def _heads_q(q, layout):
    """q's heads: packed (total_q, heads_q, head_dim) for FJ_THD."""
    return q.shape[1] if layout == capi.THD else ar._sizes(q, layout)[1]


def _bwd_problem(q, k, v, causal, scale, layout, deterministic):
    """The fj_problem of the backward: the forward's with the deterministic
    switch.  Reads only the tensors' shapes, strides and dtype."""
    p = ar._problem(q, k, v, causal, scale, layout)
    p.deterministic = 1 if deterministic else 0
    return p


def _dense_bwd_problem(o, q, k, v, x, deterministic):
    """calls.BWD_PROBLEMS["dense"]: no arrays to point at."""
    return _bwd_problem(q, k, v, o.causal, o.scale, o.layout, deterministic), ()


calls.BWD_PROBLEMS["dense"] = _dense_bwd_problem


def _build_bwd(o, q, k, v, extras, deterministic):
    """The backward's entry of a training call (options o, extras in its
    roles' order): its kind's problem, the mods (window, softcap, sinks --
    a placeholder until a call writes its own sinks), planned.  A varlen
    call's gradients start as zeros (calls.make_bwd_entry)."""
    x = dict(zip(o.roles, extras))
    p, slots = calls.BWD_PROBLEMS[o.kind](o, q, k, v, x, deterministic)
    mods, mod_slots = ar.mods_of(o, x, q.device)
    p.mods = mods.ptr
    return calls.make_bwd_entry(p, q.device, "sinks" in x, tuple(slots) + tuple(mod_slots),
                                (mods,), zero=o.kind != "dense")


def _launch_bwd(dout, q, k, v, out, lse, o, extras, deterministic=False, dlse=None,
                mine=None, views=False):
    """fj_attention_bwd of a training call (_train_opts's o and extras):
    (dq, dk, dv, dsinks), the gradients in q's, k's and v's strides (dense
    copies of inputs that are not: broadcasts), dsinks float32 (heads_q,)
    or empty.  lse: the library's (calls.RAW_LSE).  deterministic:
    fj_problem.deterministic (bit-identical gradients run to run).  dlse:
    the loss's gradient at lse (lse's shape), or None.  mine: a TrainCall's
    own entries by mode, (entry, copies, kept, q's, k's and v's strides):
    its signature fixes the forward's tensors' metadata but dO's (read as
    O's); an entry whose strides are not the saved tensors' (a
    saved-tensor hook's copies) is looked up again.  Or None.  views: q, k and v that are
    strided views without overlaps (_disjoint: a fused QKV projection's)
    are read where they are, their gradients laid out as they are
    (_grads_as_laid_out: views of one buffer) -- eagerly; the op keeps
    its fake's layout (grad_like: dense copies)."""
    if q.numel() == 0 or k.numel() == 0:
        # No rows, or no keys: the output depends on no input.
        hq = _heads_q(q, o.layout)
        return (grad_like(q).zero_(), grad_like(k).zero_(), grad_like(v).zero_(),
                torch.zeros((hq,) if "sinks" in o.roles else (0,), dtype=torch.float32,
                            device=q.device))
    mode = (bool(deterministic), bool(views))
    strides = (q.stride(), k.stride(), v.stride())
    hit = None if mine is None else mine.get(mode)
    if hit is not None and hit[3] != strides:
        # Not the strides the entry was made for (a saved-tensor hook
        # gave the backward other tensors than the forward's): the table's.
        hit = None
    if hit is None:
        hit = _bwd_entry(dout, q, k, v, out, lse, o, extras, deterministic, views)
        if mine is not None:
            mine[mode] = hit = hit + (strides,)
    if hit[1][0] or hit[1][1] or hit[1][2]:
        q, k, v = (t.contiguous() if c else t for t, c in zip((q, k, v), hit[1]))
    grads = _grads_as_laid_out(q, k, v, hit[0].zero) if hit[2] else None
    # O and dO are read with one set of strides: O's, which the forward made contiguous.
    return calls.backward(hit[0], dout.contiguous(), q, k, v, out.contiguous(), lse, extras,
                          _dlse_arg(dlse), grads)


def _bwd_entry(dout, q, k, v, out, lse, o, extras, deterministic, views=False):
    """_launch_bwd's (entry, which of q, k and v become dense copies,
    whether the gradients are laid out as strided inputs are), by the
    tensors as given: their metadata decide it."""
    meta = calls.meta
    key = (o, bool(deterministic), bool(views), meta(q), meta(k), meta(v), meta(out),
           meta(dout), meta(lse)) + tuple(map(meta, extras))
    hit = calls.tables.bwd.get(key)
    if hit is None:
        copy, kept = _copies(q, k, v, views)
        q, k, v = (t.contiguous() if c else t for t, c in zip((q, k, v), copy))
        hit = (_build_bwd(o, q, k, v, extras, deterministic), copy, kept)
        calls.remember(calls.tables.bwd, key, hit)
    return hit


def _dlse_arg(dlse):
    """The loss's gradient at the log-sum-exp as fj_problem.dlse reads it
    (float32, contiguous in lse's layout: a sum's gradient comes expanded,
    strides 0), or None."""
    return None if dlse is None else dlse.to(torch.float32).contiguous()


def _train_opts(sinks, causal, scale, layout, window_left, window_right, softcap,
                cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None, max_seqlen_q=0,
                max_seqlen_k=0, num_splits=0):
    """The Opts and extras of a training op's call: dense, or varlen
    (packed FJ_THD, as attention_varlen() takes it) where cu_seqlens_q
    and cu_seqlens_k are given; the extras in the serving call's roles'
    order, the sinks last."""
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise ValueError("flashjit.attention_varlen: cu_seqlens_q and cu_seqlens_k go "
                         "together (both given: varlen; neither: dense)")
    roles, extras = [], []
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k),
                    ("seqused_k", seqused_k), ("sinks", sinks)):
        if t is not None:
            roles.append(name)
            extras.append(t)
    o = calls.opts("dense" if cu_seqlens_q is None else "varlen", causal=causal, scale=scale,
                   layout=layout, window_left=window_left, window_right=window_right,
                   softcap=softcap, roles=tuple(roles), num_splits=num_splits,
                   max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    return o, tuple(extras)


def _attention_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   out: torch.Tensor, lse: torch.Tensor, causal: int, scale: float,
                   layout: int, window_left: int, window_right: int, softcap: float,
                   sinks: typing.Optional[torch.Tensor] = None, deterministic: bool = False,
                   cu_seqlens_q: typing.Optional[torch.Tensor] = None,
                   cu_seqlens_k: typing.Optional[torch.Tensor] = None,
                   seqused_k: typing.Optional[torch.Tensor] = None, max_seqlen_q: int = 0,
                   max_seqlen_k: int = 0, dlse: typing.Optional[torch.Tensor] = None
                   ) -> typing.Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of flashjit::attention_train: (dq, dk, dv, dsinks).
    deterministic: bit-identical gradients run to run (fj_problem's
    switch); an argument, never read from PyTorch's global state here, so
    that a traced or captured backward shows the mode it runs in.  The
    varlen arguments as attention_train's; lse the library's; dlse the
    loss's gradient at lse, or None."""
    o, extras = _train_opts(sinks, causal, scale, layout, window_left, window_right, softcap,
                            cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k)
    return _launch_bwd(dout, q, k, v, out, lse, o, extras, deterministic, dlse)


attention_bwd_op = torch.library.custom_op("flashjit::attention_bwd", _attention_bwd,
                                           mutates_args=(), device_types="cuda")


@attention_bwd_op.register_fake
def _attention_bwd_fake(dout, q, k, v, out, lse, causal, scale, layout, window_left,
                        window_right, softcap, sinks=None, deterministic=False,
                        cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None, max_seqlen_q=0,
                        max_seqlen_k=0, dlse=None):
    hq = _heads_q(q, layout)
    return (grad_like(q), grad_like(k), grad_like(v),
            q.new_empty((hq,) if sinks is not None else (0,), dtype=torch.float32))


def _attention_train(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     sinks: typing.Optional[torch.Tensor], causal: int, scale: float,
                     layout: int, window_left: int, window_right: int, softcap: float,
                     cu_seqlens_q: typing.Optional[torch.Tensor] = None,
                     cu_seqlens_k: typing.Optional[torch.Tensor] = None,
                     seqused_k: typing.Optional[torch.Tensor] = None, max_seqlen_q: int = 0,
                     max_seqlen_k: int = 0, num_splits: int = 0
                     ) -> typing.Tuple[torch.Tensor, torch.Tensor]:
    """flashjit attention with its gradients: (out, lse), the built-in
    masks and modifications only (what fj_attention_bwd takes).  Dense
    (layout BHSD or BSHD), or varlen: layout FJ_THD with cu_seqlens_q,
    cu_seqlens_k (seqused_k) and max_seqlen_q, max_seqlen_k as
    attention_varlen() takes them.  lse is the library's, which the
    backward reads: (batch, heads_q, seq_q), varlen's (batch, heads_q,
    max_seqlen_q).  Use flashjit.attention() or attention_varlen(), which
    call it when an input requires grad."""
    o, extras = _train_opts(sinks, causal, scale, layout, window_left, window_right, softcap,
                            cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                            num_splits)
    return _train_forward(o, extras, q, k, v)


def _train_forward(o, extras, q, k, v):
    """_attention_train of its options and extras (_train_opts's)."""
    # A new call's backward starts compiling before its forward does.
    det = torch.are_deterministic_algorithms_enabled()
    e = calls.entry(o, calls.RAW_LSE, q, k, v, extras,
                    ahead=lambda: calls.prefetch_bwd(_build_bwd(o, q, k, v, extras, det)))
    return calls.forward(e, q, k, v, extras)


attention_train_op = torch.library.custom_op("flashjit::attention_train", _attention_train,
                                             mutates_args=(), device_types="cuda")


@attention_train_op.register_fake
def _attention_train_fake(q, k, v, sinks, causal, scale, layout, window_left, window_right,
                          softcap, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None,
                          max_seqlen_q=0, max_seqlen_k=0, num_splits=0):
    if cu_seqlens_q is not None:
        return q.new_empty(q.shape), q.new_empty((cu_seqlens_q.shape[0] - 1, q.shape[1],
                                                  max_seqlen_q), dtype=torch.float32)
    b, hq, sq, d = ar._sizes(q, layout)
    return q.new_empty(ar._out_shape(b, hq, sq, d, layout)), q.new_empty((b, hq, sq),
                                                                         dtype=torch.float32)


# attention_train's arguments: its backward returns a gradient (or None) for each.
_TRAIN_ARGS = len(inspect.signature(_attention_train).parameters)


def _train_setup(ctx, inputs, output):
    q, k, v, sinks = inputs[:4]
    cu_q, cu_k, used, max_q, max_k = inputs[10:15]  # the defaults filled in where not given
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, sinks, cu_q, cu_k, used)
    ctx.args = tuple(inputs[4:10])  # causal, scale, layout, window_left, window_right, softcap
    ctx.max_seqlens = (max_q, max_k)
    ctx.set_materialize_grads(False)


def _train_grads(saved, args, max_seqlens, dout, dlse, bwd, opts=None):
    """The backward of a training call, the op's (_train_backward) and
    _Train's alike: (dq, dk, dv, dsinks or None), or None where no
    gradient reaches the output.  saved: _train_setup's tensors; bwd:
    attention_bwd_op, or eagerly the function it wraps -- or, given opts
    (the forward's Opts and extras, and a TrainCall's own backward entries
    or None; eagerly), _launch_bwd on them."""
    q, k, v, out, lse, sinks, cu_q, cu_k, used = saved
    if dout is None and dlse is None:
        return None
    if dout is None:  # a loss of the log-sum-exp alone
        dout = torch.zeros_like(out)
    # The mode is read here, in the backward formula, and given to the op as
    # an argument.  Eagerly this runs at loss.backward(), when PyTorch's own
    # backward kernels read the flag too.  Under torch.compile AOTAutograd
    # runs it while tracing the joint graph, so the flag becomes a constant
    # of the flashjit::attention_bwd node that the compiled backward shows,
    # and Dynamo's guard on the global deterministic flag recompiles when
    # torch.use_deterministic_algorithms changes.  Were the op to read the
    # flag itself, a compiled or captured backward would depend on state its
    # graph does not show.  warn_only changes nothing: the mode exists.
    deterministic = torch.are_deterministic_algorithms_enabled()
    if opts is not None:
        o, extras, mine = opts
        dq, dk, dv, dsinks = _launch_bwd(dout, q, k, v, out, lse, o, extras, deterministic, dlse,
                                         mine, views=True)
        return dq, dk, dv, dsinks if sinks is not None else None
    varlen = () if cu_q is None else (cu_q, cu_k, used) + tuple(max_seqlens)
    dq, dk, dv, dsinks = bwd(dout, q, k, v, out, lse, *args, sinks, deterministic, *varlen,
                             dlse=dlse)
    return dq, dk, dv, dsinks if sinks is not None else None


def _train_backward(ctx, dout, dlse):
    grads = _train_grads(ctx.saved_tensors, ctx.args, ctx.max_seqlens, dout, dlse,
                         attention_bwd_op)
    if grads is None:
        return (None,) * _TRAIN_ARGS
    return grads + (None,) * (_TRAIN_ARGS - len(grads))


attention_train_op.register_autograd(_train_backward, setup_context=_train_setup)


# attention_train's arguments after sinks, with their defaults (the
# varlen ones: cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
# max_seqlen_k, num_splits).
_TRAIN_DEFAULTS = (None, None, None, 0, 0, 0)


class _Train(torch.autograd.Function):
    """attention_train_op's autograd outside torch.compile: the same
    forward (_attention_train), saved tensors and backward (_train_grads,
    calling the function attention_bwd_op wraps), without the custom op's
    dispatch, whose host time a small model's training step pays per layer
    (PyTorch fills a custom op's defaults from its schema at every call:
    48 of a forward's 100 us on the build machine for attention_train's 16
    arguments; bench/train_host_cpu.py)."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, *args):
        o, extras = _train_opts(sinks, *args)
        out, lse = _train_forward(o, extras, q, k, v)
        # What the op's setup keeps, its inputs' defaults filled in as
        # PyTorch fills them for it; and the options, which the backward
        # takes as they are (the split count is the forward's alone).
        _train_setup(ctx, (q, k, v, sinks) + args + _TRAIN_DEFAULTS[len(args) - 6:], (out, lse))
        ctx.inputs = 4 + len(args)
        ctx.opts = (o._replace(num_splits=0) if o.num_splits else o, extras, None)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        compiling = torch.compiler.is_compiling()
        grads = _train_grads(ctx.saved_tensors, ctx.args, ctx.max_seqlens, dout, dlse,
                             attention_bwd_op, None if compiling else ctx.opts)
        # One for each of forward's inputs.
        return (None,) * ctx.inputs if grads is None else grads + (None,) * (ctx.inputs - 4)


class TrainCall:
    """A training call of attention() with the built-in masks as the call
    table keeps it: attention_train's arguments after sinks (args), its
    options (_train_opts' Opts: the roles depend only on whether sinks are
    given, which the table's key fixes), the forward's entry once the
    first call made it, and the backward's entries by mode (_launch_bwd's
    mine): a repeat builds no options and looks up no entry.  native: its
    record for the C++ training call (_native.py) once its first backward
    made one, 0 where it stays on the package's path, None before."""

    __slots__ = ("args", "o", "entry", "bwd", "native")

    def __init__(self, args, sinks):
        self.args = args
        self.o = _train_opts(sinks, *args)[0]
        self.entry = None
        self.bwd = {}
        self.native = None


class _TrainCall(torch.autograd.Function):
    """_Train for a TrainCall: the same forward and backward, the call's
    options and entries taken as they are, and five inputs instead of ten
    (autograd's apply costs a few microseconds an input)."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, call):
        extras = () if sinks is None else (sinks,)
        if call.entry is not None:
            out, lse = calls.forward(call.entry, q, k, v, extras)
        else:
            out, lse = _train_forward(call.o, extras, q, k, v)
            call.entry = calls.known(call.o, calls.RAW_LSE, q, k, v, extras)
        ctx.save_for_backward(q, k, v, out, lse, sinks)
        ctx.call = call
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, sinks = ctx.saved_tensors
        call = ctx.call
        opts = None
        if not torch.compiler.is_compiling():
            opts = (call.o, () if sinks is None else (sinks,), call.bwd)
        grads = _train_grads((q, k, v, out, lse, sinks, None, None, None), call.args, (0, 0),
                             dout, dlse, attention_bwd_op, opts)
        if call.native is None and opts is not None and grads is not None:
            _offer_native(call, dout, q, k, v, out, lse, opts[1])
        return (None,) * 5 if grads is None else grads + (None,)


def _offer_native(call, dout, q, k, v, out, lse, extras):
    """After a TrainCall's first backward: _offer's, its entries by
    (deterministic, views=True)."""
    _offer(call, True, lambda det: _bwd_entry(dout if dout is not None else out, q, k, v, out,
                                              lse, call.o, extras, det, True)[0],
           q, k, v, extras, call.o.roles)


def _offer(call, second, build, q, k, v, extras, roles):
    """After a training call's first backward (call: a TrainCall or a
    ModsCall, whose backward entries go by (deterministic, second)): its
    record for the C++ training call (_native.offer), with the other
    deterministic mode's entry made now (build(deterministic): the entry,
    for the same tensors), so that the node has both."""
    det = torch.are_deterministic_algorithms_enabled()
    hit = call.bwd.get((det, second))
    other = call.bwd.get((not det, second))
    call.native = 0
    if hit is None or not native.worth_offering(call, hit, q, k, v):
        return
    if other is None:
        try:
            e = build(not det)
        except (core.Error, ValueError, NotImplementedError):
            return
        # The same tensors: the current mode's copies, layout and strides.
        other = call.bwd[(not det, second)] = (e,) + tuple(hit[1:])
    native.offer(call, hit, other, q, k, v, extras, roles)


@torch.compiler.assume_constant_result
def _compiled_ops():
    """Whether the compiled graphs' C++ training ops are loaded (loading
    them; a constant of the trace)."""
    return native.available() and native.compiled


def train_call(q, k, v, sinks, call):
    """attention()'s training call with the built-in masks (call: a
    TrainCall): (out, lse).  Through the op under torch.compile, eagerly
    through _TrainCall."""
    if torch.compiler.is_compiling():
        if (q.is_cuda or native.CPU_OPS) and _compiled_ops():
            # The C++ ops (csrc/compiled.cpp): no Python in the graph's call.
            return torch.ops.flashjit_native.attention_train(q, k, v, sinks, *call.args)
        return attention_train_op(q, k, v, sinks, *call.args)
    if call.native:
        got = native.train(q, k, v, call.native, () if sinks is None else (sinks,))
        if got is not None:
            return got
    return _TrainCall.apply(q, k, v, sinks, call)


def train(q, k, v, sinks, *args):
    """A training call with the built-in masks (attention_train_op's
    arguments): (out, lse).  Through the op under torch.compile (which
    traces it and its backward, attention_bwd), eagerly through _Train (a
    function of the old style: one with setup_context, which torch.func's
    transforms want -- the op's own autograd does not take them either --,
    costs 23 us more a call on the build machine)."""
    if torch.compiler.is_compiling():
        return attention_train_op(q, k, v, sinks, *args)
    return _Train.apply(q, k, v, sinks, *args)


# ---- the backward with expressions -----------------------------------------------------
# score_mod, mask_mod and params: the call's options in one text and its
# extra tensors in one list, as flashjit::attention takes them (sinks and
# the tensor parameters, in the roles' order).  fj_attention_bwd applies
# the score expression's derivative, and adds the gradients of the tensor
# parameters that require grad (pgrads: a bit per parameter, in the
# order of o.params) into one float32 tensor, dparams, theirs one after
# another.


class _GradPtrs(C.Structure):
    """fj_mods.param_grads' array: a pointer per parameter (slots a call
    writes)."""
    _fields_ = [(f"g{i}", C.c_void_p) for i in range(8)]


def _pgrad_params(o, pgrads):
    """The (parameter index, its role's index among the extras) of each
    parameter whose gradient pgrads asks for."""
    if not pgrads:
        return ()
    role = {r: i for i, r in enumerate(o.roles)}
    return tuple((i, role["param:" + name]) for i, (name, kind, _) in enumerate(o.params)
                 if pgrads >> i & 1 and kind == "t")


def _build_bwd_mods(o, q, k, v, extras, deterministic, pgrads):
    """The backward's entry of a call with expressions: its problem, with
    the forward's modifications (the sinks', the tensor parameters' and
    their gradients' pointers are slots a call writes: the gradients'
    after the extras), planned."""
    x = dict(zip(o.roles, extras))
    p, arrays = calls.BWD_PROBLEMS[o.kind](o, q, k, v, x, deterministic)
    mods, slots = ar.mods_of(o, x, q.device)
    slots = list(arrays) + slots
    keep = (mods,)
    if pgrads:
        ptrs = _GradPtrs()
        mods.mods.param_grads = C.addressof(ptrs)
        for j, (i, _) in enumerate(_pgrad_params(o, pgrads)):
            setattr(ptrs, f"g{i}", C.addressof(pr._PLACEHOLDER))
            slots.append((ptrs, f"g{i}", len(extras) + j))
        keep += (ptrs,)
    p.mods = mods.ptr
    return calls.make_bwd_entry(p, q.device, "sinks" in o.roles, slots, keep,
                                zero=o.kind != "dense")


_NO_DPARAMS = {}  # device: the empty dparams of eager calls without parameters' gradients


def _dparams_views(o, extras, pgrads, device, shared=False):
    """dparams, zeroed (the library adds), and its part for each
    parameter with a gradient, in _pgrad_params' order.  shared: where
    none has a gradient, one empty tensor a device for every call (an
    eager call's, which nothing writes; the op's outputs are its own)."""
    if shared and not pgrads:
        e = _NO_DPARAMS.get(device)
        if e is None:
            e = _NO_DPARAMS[device] = torch.zeros(0, dtype=torch.float32, device=device)
        return e, ()
    sizes = [extras[r].numel() for _, r in _pgrad_params(o, pgrads)]
    dparams = torch.zeros(sum(sizes), dtype=torch.float32, device=device)
    return dparams, tuple(dparams.split(sizes)) if sizes else ()


def _launch_bwd_mods(dout, q, k, v, out, lse, extras, opts, deterministic, pgrads, dlse=None,
                     mine=None):
    """_launch_bwd's counterpart for a call with expressions (opts: the
    forward's options text): (dq, dk, dv, dsinks, dparams).  mine: a
    ModsCall's own entries by mode and gradients, as _launch_bwd's, or
    None.  Eagerly
    (mine), q, k and v that are strided views without overlaps are read
    where they are and their gradients laid out as they are, as
    _launch_bwd's views; the op keeps its fake's dense gradients."""
    o = calls.decode(opts)
    mode = (bool(deterministic), int(pgrads))
    strides = (q.stride(), k.stride(), v.stride())
    hit = None if mine is None else mine.get(mode)
    if hit is not None and hit[3] != strides:  # as _launch_bwd's
        hit = None
    # Which of q, k and v become dense copies, and whether any is read in
    # place though not dense: a ModsCall's (mine) once.
    copy, kept = _copies(q, k, v, mine is not None) if hit is None else hit[1:3]
    if copy[0] or copy[1] or copy[2]:
        q, k, v = (t.contiguous() if c else t for t, c in zip((q, k, v), copy))
    out, dout = out.contiguous(), dout.contiguous()
    dparams, views = _dparams_views(o, extras, pgrads, q.device, shared=mine is not None)
    if q.numel() == 0:
        hq = _heads_q(q, o.layout)
        return (grad_like(q), grad_like(k).zero_(), grad_like(v).zero_(),
                torch.zeros((hq,) if "sinks" in o.roles else (0,), dtype=torch.float32,
                            device=q.device), dparams)
    if hit is None:
        meta = calls.meta
        key = ("mods", opts, bool(deterministic), int(pgrads), meta(q), meta(k), meta(v),
               meta(out), meta(dout), meta(lse)) + tuple(meta(t) for t in extras)
        e = calls.tables.bwd.get(key)
        if e is None:
            e = _build_bwd_mods(o, q, k, v, extras, deterministic, pgrads)
            calls.remember(calls.tables.bwd, key, e)
        hit = (e, copy, kept, strides)
        if mine is not None:
            mine[mode] = hit
    grads = _grads_as_laid_out(q, k, v, hit[0].zero) if kept else None
    return calls.backward(hit[0], dout, q, k, v, out, lse, tuple(extras) + views,
                          _dlse_arg(dlse), grads) + (dparams,)


def _attention_bwd_mods(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                          v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                          extra: typing.List[torch.Tensor], opts: str,
                          deterministic: bool = False, pgrads: int = 0,
                          dlse: typing.Optional[torch.Tensor] = None
                          ) -> typing.Tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                            torch.Tensor, torch.Tensor]:
    """The gradients of flashjit::attention_train_mods: (dq, dk, dv,
    dsinks, dparams), dsinks empty without sinks, dparams float32: the
    gradients of the tensor parameters pgrads names (a bit per parameter
    of the options' list), one after another, flat.  dlse: the loss's
    gradient at lse, or None."""
    return _launch_bwd_mods(dout, q, k, v, out, lse, extra, opts, deterministic, pgrads,
                            dlse)


attention_bwd_mods_op = torch.library.custom_op("flashjit::attention_bwd_mods",
                                                _attention_bwd_mods, mutates_args=(),
                                                device_types="cuda")


@attention_bwd_mods_op.register_fake
def _attention_bwd_mods_fake(dout, q, k, v, out, lse, extra, opts, deterministic=False,
                             pgrads=0, dlse=None):
    o = calls.decode(opts)
    hq = _heads_q(q, o.layout)  # packed q for varlen
    n = sum(extra[r].numel() for _, r in _pgrad_params(o, pgrads))
    return (grad_like(q), grad_like(k), grad_like(v),
            q.new_empty((hq,) if "sinks" in o.roles else (0,), dtype=torch.float32),
            q.new_empty((n,), dtype=torch.float32))


def _attention_train_mods(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            extra: typing.List[torch.Tensor], opts: str
                            ) -> typing.Tuple[torch.Tensor, torch.Tensor]:
    """flashjit attention with score_mod, mask_mod and params, with its
    gradients: (out, lse), lse the library's (varlen: (batch, heads_q,
    max_seqlen_q)).  Use flashjit.attention() or attention_varlen(),
    which call it when an input requires grad."""
    o = calls.decode(opts)

    def ahead():
        # A new call's backward starts compiling before its forward does,
        # with the gradients of the parameters that require grad (as
        # _train_mods_setup counts them).
        role = {r: i for i, r in enumerate(o.roles)}
        pgrads = sum(1 << i for i, (name, kind, _) in enumerate(o.params)
                     if kind == "t" and extra[role["param:" + name]].requires_grad)
        det = torch.are_deterministic_algorithms_enabled()
        calls.prefetch_bwd(_build_bwd_mods(o, q, k, v, extra, det, pgrads))

    return calls.forward(calls.entry(o, calls.RAW_LSE, q, k, v, extra, ahead=ahead), q, k, v,
                         extra)


attention_train_mods_op = torch.library.custom_op("flashjit::attention_train_mods",
                                                  _attention_train_mods, mutates_args=(),
                                                  device_types="cuda")


@attention_train_mods_op.register_fake
def _attention_train_mods_fake(q, k, v, extra, opts):
    o = calls.decode(opts)
    return (q.new_empty(ar.out_shape(q, v), dtype=ar._out_dtype(q.dtype)),
            q.new_empty(_raw_lse_shape(o, q, extra), dtype=torch.float32))


def _raw_lse_shape(o, q, extra):
    """The log-sum-exp the training ops return: the library's, which their
    backward reads -- (batch, heads_q, max_seqlen_q) for varlen."""
    if o.kind == "varlen":
        batch = extra[o.roles.index("cu_seqlens_q")].shape[0] - 1
        return (batch, q.shape[1], o.max_seqlen_q)
    return ar.lse_shape(o, q)


def _train_mods_setup(ctx, inputs, output):
    q, k, v, extra, opts = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, *extra)
    ctx.opts = opts
    # The tensor parameters that require grad, a bit each (o.params' order).
    o = calls.decode(opts)
    role = {r: i for i, r in enumerate(o.roles)}
    ctx.pgrads = sum(1 << i for i, (name, kind, _) in enumerate(o.params)
                     if kind == "t" and extra[role["param:" + name]].requires_grad)
    ctx.set_materialize_grads(False)


def _mods_grads(saved, opts, pgrads, dout, dlse, bwd):
    """The backward of a training call with expressions, the op's
    (_train_mods_backward) and _TrainMods's alike: (dq, dk, dv, the
    extras' gradients as a list), or None where no gradient reaches the
    output.  saved: _train_mods_setup's tensors; bwd: attention_bwd_mods_op,
    or eagerly the function it wraps."""
    q, k, v, out, lse, *extra = saved
    o = calls.decode(opts)
    if dout is None and dlse is None:
        return None
    if dout is None:  # a loss of the log-sum-exp alone
        dout = torch.zeros_like(out)
    # The deterministic flag as _train_backward reads it.
    deterministic = torch.are_deterministic_algorithms_enabled()
    dq, dk, dv, dsinks, dparams = bwd(dout, q, k, v, out, lse, list(extra), opts,
                                      deterministic, pgrads, dlse)
    # The sinks' gradient where they are among the extras, and each
    # parameter's that requires grad, in its shape and dtype.
    grads = [dsinks if role == "sinks" else None for role in o.roles]
    at = 0
    for _, r in _pgrad_params(o, pgrads):
        t = extra[r]
        grads[r] = dparams[at:at + t.numel()].view(t.shape).to(t.dtype)
        at += t.numel()
    return dq, dk, dv, grads


def _train_mods_backward(ctx, dout, dlse):
    grads = _mods_grads(ctx.saved_tensors, ctx.opts, ctx.pgrads, dout, dlse,
                        attention_bwd_mods_op)
    if grads is None:
        return None, None, None, [None] * (len(ctx.saved_tensors) - 5), None
    return grads + (None,)


attention_train_mods_op.register_autograd(_train_mods_backward,
                                          setup_context=_train_mods_setup)


class ModsCall:
    """A training call with expressions as the call table keeps it: its
    options' text, the forward's entry once the first call made it (None
    until then), which later calls launch without looking it up, the
    backward's entries (_launch_bwd_mods' mine), and which extras are
    floating-point (_TrainMods' inputs; None until the first call)."""

    __slots__ = ("opts", "entry", "bwd", "floats", "native")

    def __init__(self, opts):
        self.opts, self.entry, self.bwd, self.floats = opts, None, {}, None
        self.native = None  # as TrainCall's


class _TrainMods(torch.autograd.Function):
    """attention_train_mods_op's autograd outside torch.compile, as _Train
    is attention_train_op's: the same forward, saved tensors and backward
    without the custom ops' dispatch (a call with expressions and a block
    mask paid 250 us more host time a forward with grad than without, on
    an H100's host).  extra: the call's extras, a tuple that autograd does
    not look into; after it, as inputs, the floating-point ones (the
    sinks, the float tensor parameters: those that may take a gradient;
    autograd's apply costs a few microseconds an input, and a block mask
    brings eight integer lists)."""

    @staticmethod
    def forward(ctx, q, k, v, call, extra, *floats):
        if call.entry is not None:
            out, lse = calls.forward(call.entry, q, k, v, extra)
        else:
            out, lse = _attention_train_mods(q, k, v, list(extra), call.opts)
            call.entry = calls.known(calls.decode(call.opts), calls.RAW_LSE, q, k, v, extra)
        _train_mods_setup(ctx, (q, k, v, extra, call.opts), (out, lse))
        ctx.call = call
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        mine = ctx.call.bwd

        def bwd(*args):
            return _launch_bwd_mods(*args, mine=mine)

        compiling = torch.compiler.is_compiling()
        # Unpacked once: a non-reentrant checkpoint allows no second unpack.
        saved = ctx.saved_tensors
        grads = _mods_grads(saved, ctx.opts, ctx.pgrads, dout, dlse,
                            _attention_bwd_mods if compiling else bwd)
        if ctx.call.native is None and not compiling and not ctx.pgrads and grads is not None:
            _offer_native_mods(ctx.call, saved)
        at = ctx.call.floats
        if grads is None:
            return (None,) * (5 + len(at))
        return grads[:3] + (None, None) + tuple(grads[3][i] for i in at)


def _offer_native_mods(call, saved):
    """_offer's for a ModsCall after its first backward without parameters'
    gradients (entries by (deterministic, pgrads=0))."""
    q, k, v, out, lse, *extras = saved
    o = calls.decode(call.opts)
    _offer(call, 0, lambda det: _build_bwd_mods(o, q, k, v, extras, det, 0), q, k, v, extras,
           o.roles)


def train_mods(q, k, v, extras, call):
    """A training call with expressions (attention_train_mods_op's
    arguments; call a ModsCall, or its options' text): (out, lse).
    Through the op under torch.compile, eagerly through _TrainMods."""
    if isinstance(call, str):
        call = ModsCall(call)
    if torch.compiler.is_compiling():
        return attention_train_mods_op(q, k, v, list(extras), call.opts)
    extras = tuple(extras)
    if call.native:
        got = native.train(q, k, v, call.native, extras)
        if got is not None:
            return got
    if call.floats is None:  # the call table's key fixes the extras' dtypes
        call.floats = tuple(i for i, t in enumerate(extras) if t.is_floating_point())
    return _TrainMods.apply(q, k, v, call, extras, *(extras[i] for i in call.floats))
