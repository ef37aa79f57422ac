"""Cached calls: what a flashjit call of one signature needs, made once
and kept, so that a repeated call does one dict lookup and one launch.

A call's signature is everything about it but its tensors' contents and
addresses: the shapes, strides, dtypes and devices of every tensor it
takes, and its options (Opts).  An Entry keeps for one signature the GPU
context, the fj_problem with its fj_mods, the plan, the outputs' shapes
and dtypes, and the slots: the fields of those structs that take the
call's own device pointers (descales, sequence lengths, the page table,
sinks, the expressions' tensors, a block mask's lists).  A call with an
entry writes its pointers into the slots, allocates its outputs from
PyTorch's caching allocator, and launches with one ctypes call of plain
integers.  Every entry point goes through here: attention() (eager and as
the ops torch.compile calls), its backward, attention_varlen() and
attention_with_kvcache().  Each kind of call registers the function that
builds its entries (BUILDERS), which checks the tensors: a call whose
signature has an entry was checked when the entry was made.

The problem is planned with placeholder pointers where the call's come
later: what the library plans depends on which pointers are there, never
on where they point.  The library remembers its own recent plans
(fj_attention_fwd compares a problem's bytes with them), so the entry's
plan serves what Python must know ahead of a launch: the workspace.  A
launch that needs one runs, while its stream is being captured into a
CUDA graph, on a workspace from PyTorch's allocator (the graph's pool)
through fj_attention_fwd_plan, since the context's own workspace cannot
grow then; at other times on the context's (fj_attention_fwd).  Nothing
here waits for the GPU.

Entries are kept per thread, because a call writes its pointers into its
entry's structs before the launch reads them: at most MAX a table, each
cleared when full (a miss plans again; the library's caches keep the
compiled kernels).  counts says how many plans were made, for the tests.
"""
import ast
import ctypes as C
import math
import threading
from collections import namedtuple

import torch

from . import _capi as capi
from . import _core as core

MAX = 1024

# Opts: a call's options, normalised (the op's `opts` string is its text).
#   kind           "dense" (attention), "varlen", "kvcache"
#   causal         fj_causal
#   scale          float, 0.0 for 1/sqrt(head_dim)
#   layout         fj_order of q, k and v (dense; THD / BSHD otherwise)
#   window_left, window_right   -1 unbounded
#   softcap        float, 0.0 off
#   score_mod, mask_mod         C expressions, "" none
#   params         ((name, kind, value), ...): kind "t" (a tensor, in the
#                  extras as "param:name"; value None), "i" or "f"
#   roles          what each of the call's extra tensors is, in order:
#                  "sinks", "param:NAME", "kv_num", "kv_indices", "full_num",
#                  "full_indices", "q_num", "q_indices", "full_q_num",
#                  "full_q_indices", "q_descale", "k_descale", "v_descale",
#                  "cu_seqlens_q", "cu_seqlens_k", "seqused_k",
#                  "cache_seqlens", "block_table"
#   block_q, block_kv           a block mask's block sizes (0: none)
#   checked        checked mode (fj_mods.checked)
#   num_splits     fj_problem.splits (0: the library's choice)
#   max_seqlen_q, max_seqlen_k  varlen upper bounds (0 otherwise)
#   seqlen_k       kvcache: an int cache_seqlens (-1: a tensor, or none)
#   out_dtype      fj_problem.o_dtype (0: the default; FP8 attention's f16 or
#                  e4m3 O), its scale the extra "o_scale" where given
#   amax           FP8 attention: the call returns max |O| (fj_problem.o_amax)
Opts = namedtuple("Opts", "kind causal scale layout window_left window_right softcap "
                          "score_mod mask_mod params roles block_q block_kv checked "
                          "num_splits max_seqlen_q max_seqlen_k seqlen_k out_dtype amax")
OPTS_DEFAULTS = dict(causal=capi.CAUSAL_NONE, scale=0.0, layout=capi.BHSD, window_left=-1,
                     window_right=-1, softcap=0.0, score_mod="", mask_mod="", params=(),
                     roles=(), block_q=0, block_kv=0, checked=False, num_splits=0,
                     max_seqlen_q=0, max_seqlen_k=0, seqlen_k=-1, out_dtype=0, amax=False)


def opts(kind, **given):
    """An Opts of `kind`, the fields not given at their defaults."""
    return Opts(kind=kind, **{**OPTS_DEFAULTS, **given})


def encode(o):
    """The text of o, which the ops take as their `opts` argument: a Python
    literal (decode() reads it back), readable in a traced graph.  Written
    with f-strings over int(), float() and str() of each field, which
    torch.compile's tracer evaluates (a symbolic number becomes a
    constant, guarded); floats as strings, so that inf and nan survive."""
    params = ""
    for name, kind, value in o.params:
        params += f"({str(name)!r}, {str(kind)!r}, {'' if value is None else repr(value)!r}), "
    roles = ""
    for role in o.roles:
        roles += f"{str(role)!r}, "
    return (f"{{'kind': {str(o.kind)!r}, 'causal': {int(o.causal)}, "
            f"'scale': {repr(float(o.scale))!r}, 'layout': {int(o.layout)}, "
            f"'window': ({int(o.window_left)}, {int(o.window_right)}), "
            f"'softcap': {repr(float(o.softcap))!r}, 'score_mod': {str(o.score_mod)!r}, "
            f"'mask_mod': {str(o.mask_mod)!r}, 'params': ({params}), 'roles': ({roles}), "
            f"'block': ({int(o.block_q)}, {int(o.block_kv)}), 'checked': {bool(o.checked)}, "
            f"'num_splits': {int(o.num_splits)}, "
            f"'max_seqlen': ({int(o.max_seqlen_q)}, {int(o.max_seqlen_k)}), "
            f"'seqlen_k': {int(o.seqlen_k)}, 'out_dtype': {int(o.out_dtype)}, "
            f"'amax': {bool(o.amax)}}}")


_decoded = {}


def decode(text):
    """The Opts of an op's `opts` text (encode's), remembered by text."""
    o = _decoded.get(text)
    if o is None:
        try:
            d = ast.literal_eval(text)
            params = tuple((n, k, None if k == "t" else int(v) if k == "i" else float(v))
                           for n, k, v in d["params"])
            o = Opts(d["kind"], d["causal"], float(d["scale"]), d["layout"], *d["window"],
                     float(d["softcap"]), d["score_mod"], d["mask_mod"], params,
                     tuple(d["roles"]), *d["block"], d["checked"], d["num_splits"],
                     *d["max_seqlen"], d["seqlen_k"], d["out_dtype"], d["amax"])
        except (ValueError, SyntaxError, KeyError, TypeError) as e:
            raise ValueError(f"flashjit: opts {text!r} is not flashjit's options text "
                             f"({type(e).__name__}: {e}); call flashjit.attention(), which "
                             "writes it") from None
        if len(_decoded) >= MAX:
            _decoded.clear()
        _decoded[text] = o
    return o


# ---- the tables ------------------------------------------------------------------


class _Tables(threading.local):
    """This thread's entries: `plain` by the entry points' own arguments
    as given (with the metadata of the extra tensors and the scalar
    parameters' types and reprs: the cheapest lookup), `train` the
    training call's checked arguments by the same key (calls with an input
    that requires grad; a ModsCall where they have expressions), `calls`
    by signature (Opts and the tensors' metadata), `bwd` the backward's by
    signature."""

    def __init__(self):
        self.plain = {}
        self.train = {}
        self.calls = {}
        self.bwd = {}


tables = _Tables()
counts = {"plans": 0, "bwd_plans": 0}


def remember(table, key, entry):
    if len(table) >= MAX:
        table.clear()
    table[key] = entry


def meta(t):
    """What of a tensor the signature holds."""
    return t.shape, t.stride(), t.dtype, t.device


# ---- what the hot path calls (replaced by the tests) -----------------------------

def context(index):
    """The GPU context of device `index`."""
    return core.gpu_context(index)


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream(index):
    """The current CUDA stream's handle on device `index`: PyTorch's raw
    getter where it has one (a tenth of current_stream()'s cost)."""
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


def capturing():
    return torch.cuda.is_current_stream_capturing()


class Fns:
    """The launching calls with every argument an address or a size, so
    that ctypes converts plain integers (no byref objects, no struct
    checks): separate function objects, the binding's own declarations
    (_capi.SIGNATURES) untouched."""

    def __init__(self, lib):
        def fn(name, nargs, sized=None):
            f = lib[name]
            f.restype = C.c_int
            f.argtypes = [C.c_size_t if i == sized else C.c_void_p for i in range(nargs)]
            return f
        self.fwd = fn("fj_attention_fwd", 8)
        self.fwd_plan = fn("fj_attention_fwd_plan", 11, sized=9)
        self.bwd = fn("fj_attention_bwd", 13)
        self.bwd_run = fn("fj_attention_bwd_run", 16, sized=14)


_fns = None


def fns():
    global _fns
    if _fns is None:
        _fns = Fns(core.lib())
    return _fns


# ---- entries ---------------------------------------------------------------------


class Entry:
    """Everything a forward call of one signature needs (the module's
    docstring).  ctx: the context's address; p, plan: the structs (p_addr,
    plan_addr their addresses); ws: the workspace bytes the plan needs;
    slots: (struct, field, index into the call's extras) to write the
    call's pointers into; ones: (batch, heads_kv, n): the last n slots
    read all-ones descales, not given; out_dtype, lse_shape (None: no
    log-sum-exp), device, index; post: f(lse, extras) for the returned
    log-sum-exp, or None; idle: no launch (an empty output); keep: what
    the structs point at."""

    __slots__ = ("ctx", "p", "p_addr", "plan", "plan_addr", "ws", "slots", "ones",
                 "out_dtype", "lse_shape", "device", "index", "post", "idle", "keep", "out_dv")


def make_entry(p, device, out_dtype, lse_shape, slots=(), keep=(), ones=None, post=None,
               idle=False):
    """An Entry of problem p (its pointers placeholders where slots fill
    them), planned on device's context; idle (p None): a call with an
    empty output, which launches nothing."""
    e = Entry()
    e.p, e.p_addr = p, None if p is None else C.addressof(p)
    e.slots, e.keep, e.ones, e.post, e.idle = tuple(slots), keep, ones, post, idle
    # O's head dim where it is not q's (fj_problem.head_dim_v), else 0.
    e.out_dv = p.head_dim_v if p is not None and p.head_dim_v else 0
    e.out_dtype, e.lse_shape, e.device, e.index = out_dtype, lse_shape, device, device.index
    e.plan = capi.Plan()
    e.plan_addr, e.ws, e.ctx = C.addressof(e.plan), 0, None
    if not idle:
        ctx = context(device.index)
        core.check(core.lib().fj_attention_plan(ctx, C.byref(p), C.byref(e.plan)), ctx)
        counts["plans"] += 1
        e.ctx, e.ws = ctx.value, e.plan.workspace_bytes
    return e


# Builders by kind: f(o, lse, q, k, v, extras) -> Entry, checking the
# tensors (registered by the modules of the entry points).  lse: False (no
# log-sum-exp), True (as the call returns it), or RAW_LSE: the library's
# [batch][heads_q][seq_q] (max_seqlen_q for varlen), which the backward
# reads -- varlen returns FlashAttention's (heads_q, total_q) instead.
BUILDERS = {}
RAW_LSE = "raw"

# The backward's problems by kind: f(o, q, k, v, x, deterministic) ->
# (problem, slots), x the call's extras by role, checking the tensors; the
# slots take the call's array pointers (varlen's lengths), as an Entry's.
BWD_PROBLEMS = {}


def _entry_key(o, lse, q, k, v, extras):
    key = (o, lse, q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype,
           k.device, v.shape, v.stride(), v.dtype, v.device)
    if extras:
        key += tuple(map(meta, extras))
    if o.params:
        # A float parameter's sign too: -0.0 == 0.0, but s / z differs.
        key += tuple(math.copysign(1.0, value) for _, kind, value in o.params if kind == "f")
    return key


def known(o, lse, q, k, v, extras):
    """The entry of a call's signature where one was made, else None."""
    return tables.calls.get(_entry_key(o, lse, q, k, v, extras))


def entry(o, lse, q, k, v, extras, ahead=None):
    """The entry of a call's signature, made (checked, planned) on a miss.
    ahead: called first on a miss (a training call starts its backward's
    compile there: prefetch_bwd); a refusal it raises (the library's, or
    the package's ValueError or NotImplementedError) is dropped: the
    backward meets it again."""
    key = _entry_key(o, lse, q, k, v, extras)
    e = tables.calls.get(key)
    if e is None:
        if ahead is not None:
            try:
                ahead()
            except (core.Error, ValueError, NotImplementedError):
                pass
        e = BUILDERS[o.kind](o, lse, q, k, v, extras)
        remember(tables.calls, key, e)
    return e


def forward(e, q, k, v, extras, amax=None):
    """Runs entry e's call on these tensors: (out, lse), lse None unless
    the entry returns it.  out has q's shape, contiguous.  amax: FP8
    attention's float32 () tensor for max |O| (an Opts.amax entry's)."""
    if amax is not None:
        if e.idle:  # an empty output's largest |O|
            amax.zero_()
        else:
            e.p.o_amax = amax.data_ptr()
    if e.ones is not None:
        b, hk, n = e.ones
        extras = (*extras, *(ones_of(e.device, b, hk),) * n)
    for obj, field, i in e.slots:
        setattr(obj, field, extras[i].data_ptr())
    if e.out_dv:  # split head dims: q's shape with v's head dim
        out = torch.empty((*q.shape[:-1], e.out_dv), dtype=e.out_dtype, device=e.device)
    else:
        out = torch.empty_like(q, dtype=e.out_dtype, memory_format=torch.contiguous_format)
    lse = None
    if e.lse_shape is not None:
        lse = torch.empty(size=e.lse_shape, dtype=torch.float32, device=e.device)
    if e.idle:
        return out, lse
    f = _fns or fns()
    lse_ptr = None if lse is None else lse.data_ptr()
    if e.ws and capturing():
        # The graph's own workspace, from its pool, freed in stream order.
        ws = torch.empty(size=(e.ws,), dtype=torch.uint8, device=e.device)
        st = f.fwd_plan(e.ctx, e.p_addr, e.plan_addr, q.data_ptr(), k.data_ptr(),
                        v.data_ptr(), out.data_ptr(), lse_ptr, ws.data_ptr(), e.ws,
                        stream(e.index))
    else:
        st = f.fwd(e.ctx, e.p_addr, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                   lse_ptr, stream(e.index))
    if st:
        raise core.error(st, e.ctx)
    if e.post is not None:
        lse = e.post(lse, extras)
    return out, lse


# All-ones descales by (device, batch, heads_kv), for the descales not
# given: a few bytes each, never freed, since a captured graph may read
# them for good.
_ones = {}


def ones_of(dev, batch, heads_kv):
    """A float32 (batch, heads_kv) tensor of ones on dev.  Before one is
    kept for later calls its stream finishes filling it, so that a call
    on another stream may read it; under CUDA-graph capture it is the
    graph's own (filled at each replay) and not kept."""
    key = (dev, batch, heads_kv)
    t = _ones.get(key)
    if t is None:
        t = torch.ones((batch, heads_kv), dtype=torch.float32, device=dev)
        if capturing():
            return t
        torch.cuda.current_stream(dev).synchronize()
        _ones[key] = t
    return t


# ---- the backward ------------------------------------------------------------------


class BwdEntry:
    """Everything a backward call of one signature needs: as Entry, with
    the backward's plan (fj_bwd_plan) and whether it returns dsinks."""

    __slots__ = ("ctx", "p", "p_addr", "plan", "plan_addr", "ws", "slots", "device",
                 "index", "sinks", "keep", "zero")


def make_bwd_entry(p, device, sinks, slots=(), keep=(), zero=False):
    """zero: the gradients start as zeros, for rows the kernels do not
    write (varlen: rows past cu_seqlens[-1] or past max_seqlen, which no
    sequence reads, so their gradients are 0)."""
    e = BwdEntry()
    e.zero = zero
    ctx = context(device.index)
    e.plan = capi.BwdPlan()
    core.check(core.lib().fj_attention_bwd_plan(ctx, C.byref(p), C.byref(e.plan)), ctx)
    counts["bwd_plans"] += 1
    e.ctx, e.p, e.p_addr, e.plan_addr = ctx.value, p, C.addressof(p), C.addressof(e.plan)
    e.ws, e.slots, e.keep = e.plan.workspace_bytes, tuple(slots), keep
    e.device, e.index, e.sinks = device, device.index, sinks
    return e


def prefetch_bwd(e):
    """Starts backward entry e's kernels compiling in the background
    (fj_attention_bwd_prefetch), so that the backward's first call waits
    for less.  Returns the status, which callers may drop (the backward
    reports a failure)."""
    return core.lib().fj_attention_bwd_prefetch(e.ctx, C.byref(e.p))


def backward(e, dout, q, k, v, out, lse, extras, dlse=None, grads=None):
    """Runs backward entry e: (dq, dk, dv, dsinks), the gradients in q's,
    k's and v's strides, dsinks float32 (heads_q,) or empty.  dlse: the
    loss's gradient at lse, float32 contiguous in lse's layout
    (fj_problem.dlse), or None.  grads: (dq, dk, dv) made by the caller in
    those strides (zeroed where e.zero says), or None: made here, as q, k
    and v (which must then be dense)."""
    for obj, field, i in e.slots:
        setattr(obj, field, extras[i].data_ptr())
    e.p.dlse = None if dlse is None else dlse.data_ptr()
    if grads is None:
        alloc = torch.zeros_like if e.zero else torch.empty_like
        grads = alloc(q), alloc(k), alloc(v)
    dq, dk, dv = grads
    dsinks = torch.empty(size=(e.p.heads_q if e.sinks else 0,), dtype=torch.float32,
                         device=e.device)
    f = _fns or fns()
    args = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), dout.data_ptr(),
            lse.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
            dsinks.data_ptr() if e.sinks else None)
    if capturing():
        # The context's workspace cannot grow under capture: the graph's pool.
        ws = torch.empty(size=(e.ws,), dtype=torch.uint8, device=e.device)
        st = f.bwd_run(e.ctx, e.p_addr, e.plan_addr, *args, ws.data_ptr(), e.ws,
                       stream(e.index))
    else:
        st = f.bwd(e.ctx, e.p_addr, *args, stream(e.index))
    if st:
        raise core.error(st, e.ctx)
    return dq, dk, dv, dsinks
