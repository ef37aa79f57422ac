"""flashjit.merge: partial attention results merged into one.

Imported by the package only where torch imports.  CUDA tensors go to
fj_attention_merge (split-KV's combine kernel, on the current stream), CPU
tensors to fj_reference_merge (float64 on the host): the same formulas,
the parts summed in their order.
"""
import ctypes as C

import torch

from . import _capi as capi
from . import _core as core
from . import _problem as pr

_WHO = "flashjit.merge"
_DTYPES = {torch.float16: capi.F16, torch.bfloat16: capi.BF16}
_LAYOUT_DIMS = {capi.BHSD: "(batch, heads, seq, head_dim)",
                capi.BSHD: "(batch, seq, heads, head_dim)"}


def _dims(t, layout):
    """(batch, heads, seq, head_dim) of a 4-d tensor in the layout."""
    b, x, y, d = t.shape
    return (b, x, y, d) if layout == capi.BHSD else (b, y, x, d)


def _as_list(what, xs):
    if isinstance(xs, torch.Tensor):
        return list(xs.unbind(0)) if xs.dim() >= 1 else [xs]
    if isinstance(xs, (list, tuple)):
        return list(xs)
    raise TypeError(f"{_WHO}: {what} must be a list of tensors or one stacked tensor, not "
                    f"{type(xs).__name__}")


def _check(outs, lses, layout):
    """The parts checked: (batch, heads, seq, head_dim), one device."""
    if not outs:
        raise ValueError(f"{_WHO}: no parts to merge")
    if len(outs) != len(lses):
        raise ValueError(f"{_WHO}: {len(outs)} outputs but {len(lses)} log-sum-exps")
    if len(outs) > capi.SPLITS_MAX:
        raise ValueError(f"{_WHO}: {len(outs)} parts: at most {capi.SPLITS_MAX} "
                         "(FJ_SPLITS_MAX) merge at once")
    o0 = outs[0]
    for i, (o, lse) in enumerate(zip(outs, lses)):
        for name, t in (("outs", o), ("lses", lse)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{_WHO}: {name}[{i}] is a {type(t).__name__}, not a "
                                "torch.Tensor")
        if o.dim() != 4:
            raise ValueError(f"{_WHO}: outs[{i}] has {o.dim()} dimensions {tuple(o.shape)}; "
                             f"a part takes 4: {_LAYOUT_DIMS[layout]}")
        if o.shape != o0.shape:
            raise ValueError(f"{_WHO}: outs[{i}] has shape {tuple(o.shape)}; every part "
                             f"must have outs[0]'s 4-d shape {tuple(o0.shape)}")
        if not o.is_floating_point() or o.dtype == getattr(torch, "float8_e4m3fn", None):
            raise TypeError(f"{_WHO}: outs[{i}] has dtype {o.dtype}: a floating type "
                            "(float16, bfloat16, float32)")
        if lse.dtype != torch.float32:
            raise TypeError(f"{_WHO}: lses[{i}] has dtype {lse.dtype}; log-sum-exps are "
                            "torch.float32 (flashjit.attention's return_lse)")
        b, h, s, _ = _dims(o, layout)
        if tuple(lse.shape) != (b, h, s):
            raise ValueError(f"{_WHO}: lses[{i}] has shape {tuple(lse.shape)}; it must be "
                             f"(batch, heads, seq) = ({b}, {h}, {s})")
        if o.device != o0.device or lse.device != o0.device:
            raise ValueError(f"{_WHO}: the parts must be on one device; outs[0] is on "
                             f"{o0.device}, part {i} on {o.device} and {lse.device}")
    return _dims(o0, layout)


def merge(outs, lses, *, layout="bhsd", sinks=None, dtype=None):
    """Merges partial attention results over disjoint keys into the
    attention over all of them: returns (out, lse).

    outs: the parts' outputs, a list of tensors (batch, heads, seq,
    head_dim) for layout "bhsd" or (batch, seq, heads, head_dim) for
    "bshd", or one tensor stacked along a first dimension; each normalised
    over its own keys, as flashjit.attention returns it.  lses: their
    natural-log sum-exps, float32 (batch, heads, seq) each (or stacked),
    as flashjit.attention(..., return_lse=True) returns them, -inf for a
    row that saw no key of its part (that part adds nothing).  Per row:
        lse = log(sum_s exp(lse_s)),   out = sum_s exp(lse_s - lse) out_s,
    summed over the parts in the order given (the same order every run:
    the result does not depend on timing); a row no part saw gets 0 and
    -inf.  sinks: float32 (heads,) logits that join each row's sum once
    (the parts must leave them out), on the parts' device.  dtype: the
    output's (default outs[0]'s; float16 or bfloat16 on the GPU).

    CUDA tensors: fj_attention_merge (the split-KV combine kernel, in
    float32) on the current stream.  CPU tensors: fj_reference_merge (in
    float64).  At most 256 parts at once (FJ_SPLITS_MAX).

    Differentiable in outs, lses and sinks (out and lse alike), so that
    parts of flashjit.attention(..., return_lse=True) merged here train:
    with w_s = exp(lse_s - lse), d out_s = w_s dout and d lse_s = w_s
    ((out_s - out) . dout + dlse), a sink's as a part whose out is 0; in
    float32 (float64 on the CPU) with out recomputed from the parts.
    """
    lay = pr.choose("layout", layout, pr.LAYOUTS)
    outs, lses = _as_list("outs", outs), _as_list("lses", lses)
    _check(outs, lses, lay)
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                       for t in outs + lses + [sinks]):
        return _Merge.apply(lay, sinks, dtype, len(outs), *outs, *lses)
    return _merge(outs, lses, lay, sinks, dtype)


def _merge(outs, lses, lay, sinks, dtype):
    """merge() of checked parts, without autograd."""
    b, h, s, d = _dims(outs[0], lay)
    dev = outs[0].device
    if dtype is not None and (not isinstance(dtype, torch.dtype) or
                              not dtype.is_floating_point or dtype.itemsize == 1):
        raise TypeError(f"{_WHO}: dtype={dtype!r} is not a floating torch.dtype "
                        "(torch.float16, torch.bfloat16, torch.float32)")
    dtype = outs[0].dtype if dtype is None else dtype
    out = torch.empty(outs[0].shape, dtype=dtype, device=dev)
    lse = torch.empty((b, h, s), dtype=torch.float32, device=dev)
    if out.numel() == 0:
        return out, lse
    work = torch.float32 if dev.type == "cuda" else torch.float64
    parts = torch.stack([o if lay == capi.BHSD else o.transpose(1, 2) for o in outs])
    merge_into(parts.to(work).contiguous(), torch.stack(lses).to(work).contiguous(), out, lse,
               lay, sinks)
    return out, lse


class _Merge(torch.autograd.Function):
    """merge() with its gradients (the docstring's formulas)."""

    @staticmethod
    def forward(ctx, lay, sinks, dtype, n, *parts):
        outs, lses = list(parts[:n]), list(parts[n:])
        out, lse = _merge(outs, lses, lay, sinks, dtype)
        ctx.save_for_backward(lse, *parts, *(() if sinks is None else (sinks,)))
        ctx.lay, ctx.n, ctx.sinks = lay, n, sinks is not None
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        lse, *saved = ctx.saved_tensors
        n, lay = ctx.n, ctx.lay
        outs, lses = saved[:n], saved[n:2 * n]
        sinks = saved[2 * n] if ctx.sinks else None
        work = torch.float32 if lse.device.type == "cuda" else torch.float64
        bhsd = (lambda t: t) if lay == capi.BHSD else (lambda t: t.transpose(1, 2))
        o = torch.stack([bhsd(t).to(work) for t in outs])            # (n, b, h, s, d)
        w = torch.exp(torch.stack(lses).to(work) - lse.to(work)).nan_to_num_(0.0)  # (n, b, h, s)
        merged = (w[..., None] * o).sum(0)
        g = torch.zeros_like(merged) if dout is None else bhsd(dout).to(work)
        gl = torch.zeros_like(w[0]) if dlse is None else dlse.to(work)
        # d lse_s = w_s ((out_s - out) . dout + dlse); rows that no part saw have w 0.
        dl = w * (((o - merged) * g).sum(-1) + gl)
        grads = [bhsd(w[i][..., None] * g).to(t.dtype) for i, t in enumerate(outs)]
        grads += [dl[i].to(torch.float32) for i in range(n)]
        dsinks = None
        if sinks is not None and ctx.needs_input_grad[1]:
            dsinks = sink_grad(merged, g, lse, gl, sinks).to(sinks.dtype)
        return (None, dsinks, None, None) + tuple(grads)


def sink_grad(o, dout, lse, dlse, sinks):
    """The sinks' gradient over the rows given (o, dout: (batch, heads,
    rows, head_dim); lse, dlse: (batch, heads, rows), dlse None for 0), in
    o's dtype: a sink enters only its rows' denominators, so d sink[h] =
    -sum over rows of exp(sink[h] - lse) (rowsum(dO o O) - dlse); 0 for a
    row of lse -inf (a sink of -inf that saw nothing)."""
    delta = (o * dout).sum(-1)
    if dlse is not None:
        delta = delta - dlse.to(o.dtype)
    w = torch.exp(sinks.to(o.dtype).view(1, -1, 1) - lse.to(o.dtype)).nan_to_num_(0.0)
    return -(w * delta).sum((0, 2))


def _check_sinks(sinks, heads, dev):
    if sinks is None:
        return
    if not isinstance(sinks, torch.Tensor) or sinks.dtype != torch.float32:
        raise TypeError(f"{_WHO}: sinks must be a float32 tensor (heads,), not {sinks!r}")
    if tuple(sinks.shape) != (heads,) or sinks.device != dev or not sinks.is_contiguous():
        raise ValueError(f"{_WHO}: sinks has shape {tuple(sinks.shape)} on {sinks.device}; it "
                         f"must be ({heads},), contiguous, on {dev}")


def _problem(out, layout, dtype):
    """The fj_problem that describes O for the merge (K/V as Q: unused)."""
    b, h, s, d = _dims(out, layout)
    p = capi.Problem()
    core.lib().fj_problem_init(C.byref(p), b, h, h, s, s, d, dtype, layout)
    st = out.stride()
    p.o_stride[:] = (st[0], st[1], st[2]) if layout == capi.BHSD else (st[0], st[2], st[1])
    return p


def merge_into(o_parts, lse_parts, out, lse, layout, sinks=None):
    """The merge into given tensors.  o_parts: (parts, batch, heads, seq,
    head_dim) contiguous, float32 on CUDA (float64 on the CPU); lse_parts:
    (parts, batch, heads, seq) likewise; out in `layout` (a layout code)
    with a contiguous head dim; lse float32 (batch, heads, seq) contiguous,
    or None.  All on one device."""
    b, h, s, d = _dims(out, layout)
    dev = out.device
    _check_sinks(sinks, h, dev)
    if out.numel() == 0:  # no rows: nothing to write
        return
    if dev.type == "cuda":
        _merge_cuda(o_parts, lse_parts, out, lse, layout, sinks)
    else:
        _merge_host(o_parts, lse_parts, out, lse, layout, sinks)


def _merge_cuda(o_parts, lse_parts, out, lse, layout, sinks):
    if out.dtype not in _DTYPES:
        raise TypeError(f"{_WHO}: on the GPU the output is torch.float16 or torch.bfloat16, "
                        f"not {out.dtype}")
    if out.stride(3) != 1:
        raise ValueError(f"{_WHO}: the output's head dimension must be contiguous")
    dev = out.device
    ctx = core.gpu_context(dev.index)
    p = _problem(out, layout, _DTYPES[out.dtype])
    mods = None
    if sinks is not None:
        mods = pr.ModsArg(sinks=sinks, device=dev)
        p.mods = mods.ptr
    stream = torch.cuda.current_stream(dev).cuda_stream
    st = core.lib().fj_attention_merge(ctx, C.byref(p), o_parts.shape[0], o_parts.data_ptr(),
                                       lse_parts.data_ptr(), out.data_ptr(),
                                       lse.data_ptr() if lse is not None else None, stream)
    if st != capi.OK:
        raise core.error(st, ctx)
    del mods


def _merge_host(o_parts, lse_parts, out, lse, layout, sinks):
    b, h, s, d = _dims(out, layout)
    o64 = torch.empty((b, h, s, d), dtype=torch.float64)
    l64 = torch.empty((b, h, s), dtype=torch.float64)
    dtype = _DTYPES.get(out.dtype, capi.F16)  # the reference reads the sizes only
    p = _problem(out, layout, dtype)
    mods = None
    if sinks is not None:
        mods = pr.ModsArg(sinks=sinks, device=None)
        p.mods = mods.ptr
    lib = core.lib()
    st = lib.fj_reference_merge(C.byref(p), o_parts.shape[0], o_parts.data_ptr(),
                                lse_parts.data_ptr(), o64.data_ptr(), l64.data_ptr())
    if st != capi.OK:
        raise core.error(st, None)
    del mods
    out.copy_(o64 if layout == capi.BHSD else o64.transpose(1, 2))
    if lse is not None:
        lse.copy_(l64)
