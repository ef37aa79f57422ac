"""flashjit.attention for PyTorch tensors, and its torch.library op.

Imported by the package only where torch imports.  The op
torch.ops.flashjit.attention carries a fake (meta) implementation, so that
torch.compile traces through attention(); eager calls skip the dispatcher
and launch straight from Python (less host time a call).
"""
import ctypes as C
import typing

import torch

from . import _blockmask as bmask
from . import _capi as capi
from . import _core as core
from . import _problem as pr
from ._blockmask import BlockMask

# FP8 (torch.float8_e4m3fn, where this PyTorch has it): q, k and v all, O
# in bfloat16 (fj_problem's dtype FJ_E4M3).
_FP8 = getattr(torch, "float8_e4m3fn", None)
_DTYPES = {torch.float16: capi.F16, torch.bfloat16: capi.BF16}
if _FP8 is not None:
    _DTYPES[_FP8] = capi.E4M3
_TAKES = "torch.float16 or torch.bfloat16" + (
    ", or torch.float8_e4m3fn (FP8 attention)" if _FP8 is not None else "")
_LAYOUT_DIMS = {capi.BHSD: "(batch, heads, seq, head_dim)",
                capi.BSHD: "(batch, seq, heads, head_dim)"}
_WHO = "flashjit.attention"


def _sizes(t, layout):
    """(batch, heads, seq, head_dim) of a 4-d tensor in the layout."""
    b, x, y, d = t.shape
    return (b, x, y, d) if layout == capi.BHSD else (b, y, x, d)


def _strides(t, layout):
    """The element strides of batch, head and position."""
    s = t.stride()
    return (s[0], s[1], s[2]) if layout == capi.BHSD else (s[0], s[2], s[1])


def _check_tensor(name, t, layout, who=_WHO):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{who}: {name} is a {type(t).__name__}, not a torch.Tensor")
    if t.dtype not in _DTYPES:
        raise TypeError(f"{who}: {name} has dtype {t.dtype}; flashjit takes {_TAKES}")
    shape = t.shape
    if len(shape) != 4:
        raise ValueError(f"{who}: {name} has {len(shape)} dimensions {tuple(shape)}; layout "
                         f"'{pr.NAMES_LAYOUT[layout]}' takes 4: {_LAYOUT_DIMS[layout]}")
    if shape[3] > 1 and t.stride(3) != 1:
        raise ValueError(f"{who}: {name}'s head dimension is not contiguous (stride "
                         f"{t.stride(3)}, strides {tuple(t.stride())}); it must be 1")
    return shape if layout == capi.BHSD else (shape[0], shape[2], shape[1], shape[3])


def check_inputs(q, k, v, layout):
    """Refuses, with one line naming the value and the rule, what the
    tensors' types, shapes and devices cannot give.  Returns
    (batch, heads_q, heads_kv, seq_q, seq_kv, head_dim)."""
    b, hq, sq, d = _check_tensor("q", q, layout)
    bk, hk, sk, dk = _check_tensor("k", k, layout)
    bv, hv, sv, dv = _check_tensor("v", v, layout)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        if _FP8 in (q.dtype, k.dtype, v.dtype):
            raise core.Unsupported(capi.ERR_UNSUPPORTED, (
                f"{_WHO}: q, k and v are {q.dtype}, {k.dtype}, {v.dtype}; FP8 attention "
                "takes all three in torch.float8_e4m3fn (16-bit q over FP8 k and v is not "
                "implemented yet)"))
        raise TypeError(f"{_WHO}: q, k and v must share a dtype; got {q.dtype}, {k.dtype}, "
                        f"{v.dtype}")
    if not b == bk == bv:
        raise ValueError(f"{_WHO}: batch sizes differ: q {b}, k {bk}, v {bv}")
    if not d == dk == dv:
        raise ValueError(f"{_WHO}: head dims differ: q {d}, k {dk}, v {dv}; flashjit "
                         "needs one head dim")
    if hk != hv or sk != sv:
        raise ValueError(f"{_WHO}: k {tuple(k.shape)} and v {tuple(v.shape)} must have the "
                         "same heads and sequence length")
    if hk == 0 or hq % hk:
        raise ValueError(f"{_WHO}: q has {hq} heads and k, v {hk}: the query heads must be "
                         "a multiple of the KV heads (GQA)")
    dev = q.device
    if dev.type != "cuda" or k.device != dev or v.device != dev:
        _device_error(q, k, v)
    return b, hq, hk, sq, sk, d


def _device_error(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.device.type != "cuda":
            raise ValueError(f"{_WHO}: {name} is on {t.device}; flashjit runs on CUDA "
                             "tensors")
    raise ValueError(f"{_WHO}: q, k and v must be on one device; got {q.device}, "
                     f"{k.device}, {v.device}")


def _out_shape(b, h, s, d, layout):
    return (b, h, s, d) if layout == capi.BHSD else (b, s, h, d)


def _out_dtype(dtype):
    """O's dtype: q's, or bfloat16 for FP8 inputs."""
    return torch.bfloat16 if dtype == _FP8 else dtype


_DESCALES = ("q_descale", "k_descale", "v_descale")


def _check_descales(q, batch, heads_kv, descales):
    """descales (q_descale, k_descale, v_descale): each None or a float32
    (batch, heads_kv) tensor on q's device, contiguous; FP8 inputs only.
    Returns whether q is FP8."""
    fp8 = q.dtype == _FP8
    for name, t in zip(_DESCALES, descales):
        if t is None:
            continue
        if not fp8:
            raise ValueError(f"{_WHO}: {name} is for FP8 inputs (torch.float8_e4m3fn); q, "
                             f"k and v are {q.dtype}")
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{_WHO}: {name} is a {type(t).__name__}, not a torch.Tensor "
                            "(float32, one descale per (batch, KV head))")
        if t.dtype != torch.float32:
            raise TypeError(f"{_WHO}: {name} has dtype {t.dtype}; it must be torch.float32")
        if tuple(t.shape) != (batch, heads_kv):
            raise ValueError(f"{_WHO}: {name} has shape {tuple(t.shape)}; it must be "
                             f"(batch, heads_kv) = ({batch}, {heads_kv})")
        if t.device != q.device:
            raise ValueError(f"{_WHO}: {name} is on {t.device}; the attention inputs are on "
                             f"{q.device}")
        if not t.is_contiguous():
            raise ValueError(f"{_WHO}: {name} is not contiguous (strides "
                             f"{tuple(t.stride())}); call .contiguous()")
    return fp8


# All-ones descales by (device, batch, heads_kv), for the descales not
# given.  Bounded: cleared when full.
_ones = {}


def _ones_of(dev, batch, heads_kv):
    """A float32 (batch, heads_kv) tensor of ones on dev.  Before one is
    kept for later calls its stream finishes filling it, so that a call
    on another stream may read it; under CUDA-graph capture it is the
    graph's own (filled at each replay) and not kept."""
    key = (dev, batch, heads_kv)
    t = _ones.get(key)
    if t is None:
        t = torch.ones((batch, heads_kv), dtype=torch.float32, device=dev)
        if torch.cuda.is_current_stream_capturing():
            return t
        torch.cuda.current_stream(dev).synchronize()
        if len(_ones) >= _PROBLEMS_MAX:
            _ones.clear()
        _ones[key] = t
    return t


def _fp8_scales(p, q, descales):
    """Points the FP8 problem p (a copy) at the descales, ones where None;
    returns the tensors, which must live until the launch returns."""
    ts = [t if t is not None else _ones_of(q.device, p.batch, p.heads_kv) for t in descales]
    p.q_scale, p.k_scale, p.v_scale = (t.data_ptr() for t in ts)
    return ts


def encode_params(params):
    """A params dict as the op's arguments: "name=t,name=f,..." (t a tensor,
    f a float, i an int), the tensors and the scalars, in order."""
    if params is None:
        return "", [], []
    if not isinstance(params, dict):
        raise TypeError(f"{_WHO}: params must be a dict of name -> value, not "
                        f"{type(params).__name__}")
    kinds, tensors, scalars = [], [], []
    for name, value in params.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"{_WHO}: params: {name!r} is not a C identifier")
        if isinstance(value, torch.Tensor):
            kinds.append(f"{name}=t")
            tensors.append(value)
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{_WHO}: params[{name!r}]={value!r}: an int (i32), a float "
                            "(f32) or a tensor")
        else:
            kinds.append(f"{name}={'i' if isinstance(value, int) else 'f'}")
            scalars.append(pr.scalar_param(name, value)[1])
    return ",".join(kinds), tensors, scalars


def _decode_params(names, tensors, scalars):
    if not names:
        return None
    out, ti, si = {}, iter(tensors), iter(scalars)
    for item in names.split(","):
        name, kind = item.split("=")
        out[name] = next(ti) if kind == "t" else (
            int(next(si)) if kind == "i" else float(next(si)))
    return out


# Problems by everything they are made of (no mods): a hit skips building
# the struct.  Bounded: cleared when full.
_problems = {}
_PROBLEMS_MAX = 1024


def _problem(q, k, v, causal, scale, layout):
    key = (q.shape, k.shape, q.stride(), k.stride(), v.stride(), q.dtype, causal, scale,
           layout)
    p = _problems.get(key)
    if p is None:
        b, hq, sq, d = _sizes(q, layout)
        _, hk, sk, _ = _sizes(k, layout)
        p = capi.Problem()
        core.lib().fj_problem_init(C.byref(p), b, hq, hk, sq, sk, d, _DTYPES[q.dtype], layout)
        p.causal, p.scale = causal, scale
        # O is new and contiguous: fj_problem_init's strides.  Q, K, V as given.
        p.q_stride[:], p.k_stride[:] = _strides(q, layout), _strides(k, layout)
        p.v_stride[:] = _strides(v, layout)
        if len(_problems) >= _PROBLEMS_MAX:
            _problems.clear()
        _problems[key] = p
    return p


# The current stream's handle: PyTorch's raw getter where it has one (a
# tenth of current_stream()'s cost).
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(dev):
    if _raw_stream is not None:
        return _raw_stream(dev.index)
    return torch.cuda.current_stream(dev).cuda_stream


def _launch(q, k, v, causal, scale, return_lse, layout, window_left, window_right, softcap,
            score_mod, mask_mod, params, sinks=None, block_q=0, block_kv=0, kv_num=None,
            kv_indices=None, full_num=None, full_indices=None, checked=False,
            descales=(None, None, None)):
    """Runs attention; returns (out, lse), lse None unless return_lse.  A
    block mask comes as its block sizes and checked lists (kv_num None:
    none).  checked: checked mode (the call waits for its kernels).
    descales: FP8 inputs' (q_descale, k_descale, v_descale), checked,
    None for ones."""
    b, hq, sq, d = _sizes(q, layout)
    dev = q.device
    out = torch.empty(_out_shape(b, hq, sq, d, layout), dtype=_out_dtype(q.dtype),
                      device=dev)
    lse = torch.empty((b, hq, sq), dtype=torch.float32, device=dev) if return_lse else None
    if out.numel() == 0:
        return out, lse
    ctx = core.gpu_context(dev.index)
    lib = core.lib()
    p = _problem(q, k, v, causal, scale, layout)
    mods = scales = None
    if (window_left != -1 or window_right != -1 or softcap or score_mod or mask_mod or params
            or sinks is not None or kv_num is not None or checked):
        bm = None if kv_num is None else bmask.struct_of(block_q, block_kv, kv_num, kv_indices,
                                                         full_num, full_indices)
        mods = pr.ModsArg((window_left, window_right), softcap, score_mod, mask_mod, params,
                          device=dev, sinks=sinks, block_mask=bm, checked=checked)
        p = capi.Problem.from_buffer_copy(p)
        p.mods = mods.ptr
    if p.dtype == capi.E4M3:
        if mods is None:
            p = capi.Problem.from_buffer_copy(p)  # the cached one keeps no pointers
        scales = _fp8_scales(p, q, descales)
    lse_ptr = lse.data_ptr() if return_lse else None
    stream = _stream(dev)
    if torch.cuda.is_current_stream_capturing():
        st = _launch_captured(lib, ctx, p, q, k, v, out, lse_ptr, stream)
    else:
        st = lib.fj_attention_fwd(ctx, C.byref(p), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                  out.data_ptr(), lse_ptr, stream)
    if st != capi.OK:
        raise core.error(st, ctx)
    del mods, scales  # held until here: the call reads them (the lists are the caller's)
    return out, lse


def _launch_captured(lib, ctx, p, q, k, v, out, lse_ptr, stream):
    """Under CUDA-graph capture the context's workspace cannot grow: plan,
    and take the split-KV workspace from PyTorch's allocator (the graph's
    pool)."""
    plan = capi.Plan()
    st = lib.fj_attention_plan(ctx, C.byref(p), C.byref(plan))
    if st != capi.OK:
        return st
    ws, ws_ptr = None, None
    if plan.workspace_bytes:
        ws = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device=q.device)
        ws_ptr = ws.data_ptr()
    st = lib.fj_attention_fwd_plan(ctx, C.byref(p), C.byref(plan), q.data_ptr(), k.data_ptr(),
                                   v.data_ptr(), out.data_ptr(), lse_ptr, ws_ptr,
                                   plan.workspace_bytes, stream)
    del ws  # freed in stream order: later work in the capture may reuse it
    return st


# ---- the op ------------------------------------------------------------------------

_Tensors = typing.List[torch.Tensor]
_Floats = typing.List[float]


@torch.library.custom_op("flashjit::attention", mutates_args=(), device_types="cuda")
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: int,
                 scale: float, return_lse: bool, layout: int, window_left: int,
                 window_right: int, softcap: float, score_mod: str, mask_mod: str,
                 param_names: str, param_tensors: _Tensors, param_scalars: _Floats,
                 sinks: typing.Optional[torch.Tensor] = None, block_q: int = 0,
                 block_kv: int = 0, kv_num: typing.Optional[torch.Tensor] = None,
                 kv_indices: typing.Optional[torch.Tensor] = None,
                 full_num: typing.Optional[torch.Tensor] = None,
                 full_indices: typing.Optional[torch.Tensor] = None,
                 q_descale: typing.Optional[torch.Tensor] = None,
                 k_descale: typing.Optional[torch.Tensor] = None,
                 v_descale: typing.Optional[torch.Tensor] = None
                 ) -> typing.Tuple[torch.Tensor, torch.Tensor]:
    """flashjit attention as a PyTorch op: (out, lse); lse is empty unless
    return_lse.  A block mask comes as its block sizes and its int32 lists
    (kv_num None: none).  FP8 inputs take float32 (batch, heads_kv)
    descales (None: ones) and give a bfloat16 out.  Use
    flashjit.attention(), which builds and checks these arguments."""
    out, lse = _launch(q, k, v, causal, scale, return_lse, layout, window_left, window_right,
                       softcap, score_mod, mask_mod,
                       _decode_params(param_names, param_tensors, param_scalars), sinks,
                       block_q, block_kv, kv_num, kv_indices, full_num, full_indices,
                       descales=(q_descale, k_descale, v_descale))
    return out, lse if lse is not None else q.new_empty((0,), dtype=torch.float32)


@attention_op.register_fake
def _attention_fake(q, k, v, causal, scale, return_lse, layout, window_left, window_right,
                    softcap, score_mod, mask_mod, param_names, param_tensors, param_scalars,
                    sinks=None, block_q=0, block_kv=0, kv_num=None, kv_indices=None,
                    full_num=None, full_indices=None, q_descale=None, k_descale=None,
                    v_descale=None):
    b, hq, sq, d = _sizes(q, layout)
    out = q.new_empty(_out_shape(b, hq, sq, d, layout), dtype=_out_dtype(q.dtype))
    lse = q.new_empty((b, hq, sq) if return_lse else (0,), dtype=torch.float32)
    return out, lse


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


def _bwd_problem(q, k, v, causal, scale, layout, deterministic):
    """The fj_problem of the backward: the forward's (a copy -- the cached
    one stays as the forward built it) with the deterministic switch.
    Reads only the tensors' shapes, strides and dtype."""
    p = capi.Problem.from_buffer_copy(_problem(q, k, v, causal, scale, layout))
    p.deterministic = 1 if deterministic else 0
    return p


def _launch_bwd(dout, q, k, v, out, lse, causal, scale, layout, window_left, window_right,
                softcap, sinks, deterministic=False):
    """fj_attention_bwd: (dq, dk, dv, dsinks), the gradients in q's, k's and
    v's strides (dense copies of inputs that are not: broadcasts), dsinks
    float32 (heads_q,) or empty.  deterministic: fj_problem.deterministic
    (bit-identical gradients run to run)."""
    q, k, v = (t if _dense(t) else t.contiguous() for t in (q, k, v))
    # O and dO are read with one set of strides: O's, which the forward made contiguous.
    out, dout = out.contiguous(), dout.contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    b, hq, sq, d = _sizes(q, layout)
    dsinks = torch.empty((hq,) if sinks is not None else (0,), dtype=torch.float32,
                         device=q.device)
    if dq.numel() == 0:
        return dq, dk.zero_(), dv.zero_(), dsinks.zero_()
    dev = q.device
    ctx = core.gpu_context(dev.index)
    lib = core.lib()
    p = _bwd_problem(q, k, v, causal, scale, layout, deterministic)
    mods = None
    if window_left != -1 or window_right != -1 or softcap or sinks is not None:
        mods = pr.ModsArg((window_left, window_right), softcap, device=dev, sinks=sinks)
        p.mods = mods.ptr
    args = [q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), dout.data_ptr(),
            lse.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
            dsinks.data_ptr() if sinks is not None else None]
    stream = _stream(dev)
    if torch.cuda.is_current_stream_capturing():
        # The context's workspace cannot grow under capture: PyTorch's (the graph's pool).
        plan = capi.BwdPlan()
        st = lib.fj_attention_bwd_plan(ctx, C.byref(p), C.byref(plan))
        if st == capi.OK:
            ws = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device=dev)
            st = lib.fj_attention_bwd_run(ctx, C.byref(p), C.byref(plan), *args,
                                          ws.data_ptr(), plan.workspace_bytes, stream)
            del ws
    else:
        st = lib.fj_attention_bwd(ctx, C.byref(p), *args, stream)
    if st != capi.OK:
        raise core.error(st, ctx)
    del mods
    return dq, dk, dv, dsinks


@torch.library.custom_op("flashjit::attention_bwd", mutates_args=(), device_types="cuda")
def attention_bwd_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     out: torch.Tensor, lse: torch.Tensor, causal: int, scale: float,
                     layout: int, window_left: int, window_right: int, softcap: float,
                     sinks: typing.Optional[torch.Tensor] = None, deterministic: bool = False
                     ) -> typing.Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of flashjit::attention: (dq, dk, dv, dsinks).
    deterministic: bit-identical gradients run to run (fj_problem's
    switch); an argument, never read from PyTorch's global state here, so
    that a traced or captured backward shows the mode it runs in."""
    return _launch_bwd(dout, q, k, v, out, lse, causal, scale, layout, window_left,
                       window_right, softcap, sinks, deterministic)


@attention_bwd_op.register_fake
def _attention_bwd_fake(dout, q, k, v, out, lse, causal, scale, layout, window_left,
                        window_right, softcap, sinks=None, deterministic=False):
    hq = _sizes(q, layout)[1]
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            q.new_empty((hq,) if sinks is not None else (0,), dtype=torch.float32))


@torch.library.custom_op("flashjit::attention_train", mutates_args=(), device_types="cuda")
def attention_train_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       sinks: typing.Optional[torch.Tensor], causal: int, scale: float,
                       layout: int, window_left: int, window_right: int, softcap: float
                       ) -> typing.Tuple[torch.Tensor, torch.Tensor]:
    """flashjit attention with its gradients: (out, lse), the built-in
    masks and modifications only (what fj_attention_bwd takes).  Use
    flashjit.attention(), which calls it when an input requires grad."""
    return _launch(q, k, v, causal, scale, True, layout, window_left, window_right, softcap,
                   "", "", None, sinks)


@attention_train_op.register_fake
def _attention_train_fake(q, k, v, sinks, causal, scale, layout, window_left, window_right,
                          softcap):
    b, hq, sq, d = _sizes(q, layout)
    return q.new_empty(_out_shape(b, hq, sq, d, layout)), q.new_empty((b, hq, sq),
                                                                      dtype=torch.float32)


def _train_setup(ctx, inputs, output):
    q, k, v, sinks, causal, scale, layout, wl, wr, softcap = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, sinks)
    ctx.args = (causal, scale, layout, wl, wr, softcap)
    ctx.set_materialize_grads(False)


def _train_backward(ctx, dout, dlse):
    if dlse is not None:
        raise NotImplementedError(f"{_WHO}: the gradient through the returned lse is not "
                                  "implemented yet: use the output only")
    q, k, v, out, lse, sinks = ctx.saved_tensors
    if dout is None:
        return (None,) * 10
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
    dq, dk, dv, dsinks = attention_bwd_op(dout, q, k, v, out, lse, *ctx.args, sinks,
                                          deterministic)
    return (dq, dk, dv, dsinks if sinks is not None else None) + (None,) * 6


attention_train_op.register_autograd(_train_backward, setup_context=_train_setup)


def _no_grad_setup(ctx, inputs, output):
    pass


def _no_grad_backward(ctx, *grads):
    raise NotImplementedError(f"{_WHO}: the backward does not take score_mod, mask_mod, "
                              "params or block_mask yet")


attention_op.register_autograd(_no_grad_backward, setup_context=_no_grad_setup)


def attention(q, k, v, *, causal=None, scale=None, return_lse=False, layout="bhsd",
              window=None, softcap=None, score_mod=None, mask_mod=None, params=None,
              sinks=None, block_mask=None, checked=False, q_descale=None, k_descale=None,
              v_descale=None):
    """softmax(scale * q k^T [masked]) v on the GPU, as a new tensor.

    q: (batch, heads_q, seq_q, head_dim) for layout "bhsd", or (batch,
    seq_q, heads_q, head_dim) for "bshd"; k and v likewise with heads_kv
    and seq_kv.  float16 or bfloat16 (or FP8, below), CUDA, any strides
    with a contiguous head dim; heads_q a multiple of heads_kv (GQA, MQA)
    -- K and V are not copied.  The output has q's layout and shape (and
    dtype, FP8 aside), contiguous, on q's device; the work goes on the
    current CUDA stream.

    causal: None, "top_left" (True; PyTorch's is_causal) or "bottom_right"
    (FlashAttention's alignment when seq_q != seq_kv).  scale: None for
    1/sqrt(head_dim).  return_lse: also return the natural-log sum-exp of
    each row, float32 (batch, heads_q, seq_q).  window=(left, right): a
    sliding window around the causal diagonal (-1 unbounded).  softcap:
    softcap * tanh(s / softcap).  score_mod / mask_mod: C expressions over
    s, b, h, hkv, q, kv and params (README: "Your own attention"); params:
    name -> int (i32), float (f32) or a contiguous tensor on q's device.
    sinks: attention sinks, a float32 tensor (heads_q,) on q's device: a
    logit per query head (natural units, after the scale) that joins each
    row's softmax denominator with no value row; the log-sum-exp includes
    it, and a row that sees no key gets 0 and the sink.  block_mask: a
    flashjit.BlockMask on q's device (flashjit.block_mask() builds one from
    the same mask arguments; BlockMask(...) wraps FlexAttention-layout
    lists): key blocks outside its lists are never loaded, and its full
    blocks skip mask_mod (the causal mask, the window and the sequence
    ends still apply), so it must agree with mask_mod for the result to be
    the mask's.  Its batch and heads are 1 or the problem's, its blocks
    ceil(seq_q / block_q) x ceil(seq_kv / block_kv).  checked=True:
    checked mode for the expressions' tensor params: a read outside a
    tensor's extents raises ValueError naming the tensor, the indices and
    the extents, instead of reading there; the call waits for its kernels,
    so it is refused under CUDA-graph capture and under torch.compile.

    FP8 (FlashAttention-3's form; the wgmma family: sm_90a, H100/H200):
    q, k and v all torch.float8_e4m3fn, and q_descale=, k_descale=,
    v_descale= float32 tensors (batch, heads_kv) on q's device,
    contiguous, None for ones: q = q_fp8 * q_descale[b, h // (heads_q //
    heads_kv)], k and v by theirs.  The output is bfloat16 (not q's
    dtype); the log-sum-exp float32 as above.  causal, scale, window,
    mask_mod and params, sinks, return_lse, both layouts and GQA apply;
    what the FP8 kernel does not take (score_mod, softcap, block_mask;
    another GPU) the library refuses with its message.  16-bit q over
    FP8 k and v is not implemented (refused), nor a backward: an FP8
    call whose inputs require grad raises flashjit.Unsupported.

    Differentiable in q, k, v and sinks (loss.backward() runs
    fj_attention_bwd: O and the log-sum-exp are saved, not P) with causal,
    window, softcap, sinks and GQA; a call with score_mod, mask_mod,
    params or block_mask runs forward, and its backward raises.  Under
    torch.use_deterministic_algorithms(True) (warn_only or not) the
    backward runs the library's deterministic mode (fj_problem's
    deterministic: q.grad, k.grad, v.grad and sinks.grad bit-identical run
    to run); otherwise dq's float32 additions run in any order.  The flag
    is read when the backward runs, or under torch.compile when it is
    traced (a change recompiles).  Under CUDA-graph capture, run the call
    once before capturing (compile, layout probe).  torch.compile traces it
    as torch.ops.flashjit.attention.  Raises TypeError / ValueError with a
    one-line message for bad inputs (the library's own where it refuses).
    """
    c = pr.causal_code(causal)
    lay = pr.choose("layout", layout, pr.LAYOUTS)
    sc = pr.scale_value(scale)
    wl, wr = _window(window)
    cap = _softcap(softcap)
    for what, text in (("score_mod", score_mod), ("mask_mod", mask_mod)):
        if text is not None and not isinstance(text, str):
            raise TypeError(f"{_WHO}: {what} must be a C expression in a str, not {text!r}")
    if checked is not False and checked is not True:
        raise TypeError(f"{_WHO}: checked must be True or False, not {checked!r}")
    b, hq, hk, sq, sk, _ = check_inputs(q, k, v, lay)
    descales = (q_descale, k_descale, v_descale)
    fp8 = _check_descales(q, b, hk, descales)
    _check_sinks(sinks, q, hq)
    bm = _block_mask_args(block_mask, q, b, hq, sq, sk)
    if checked and torch.compiler.is_compiling():
        raise ValueError(f"{_WHO}: checked=True waits for its kernels and reports on the host: "
                         "call it outside torch.compile")
    # Autograd goes through the op (its backward: register_autograd), which
    # keeps the log-sum-exp for it.
    grad = torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v, sinks) + descales)
    if grad and fp8:
        _fp8_grad_error(q, k, v, sinks, descales)
    builtin = not (score_mod or mask_mod or params or block_mask is not None or checked)
    if grad and builtin:
        out, lse = attention_train_op(q, k, v, sinks, c, sc, lay, wl, wr, cap)
    elif torch.compiler.is_compiling() or (grad and not checked):
        names, tensors, scalars = encode_params(params)
        out, lse = attention_op(q, k, v, c, sc, bool(return_lse), lay, wl, wr, cap,
                                score_mod or "", mask_mod or "", names, tensors, scalars,
                                sinks, *bm, *descales)
    else:
        out, lse = _launch(q, k, v, c, sc, bool(return_lse), lay, wl, wr, cap,
                           score_mod or "", mask_mod or "", params, sinks, *bm,
                           checked=checked, descales=descales)
    return (out, lse) if return_lse else out


_NO_BLOCK_MASK = (0, 0, None, None, None, None)


def _fp8_grad_error(q, k, v, sinks, descales):
    """Raises Unsupported naming the first FP8 input that requires grad."""
    names = ("q", "k", "v", "sinks") + _DESCALES
    name = next(n for n, t in zip(names, (q, k, v, sinks) + descales)
                if isinstance(t, torch.Tensor) and t.requires_grad)
    raise core.Unsupported(capi.ERR_UNSUPPORTED, (
        f"{_WHO}: FP8 attention runs forward only: {name} requires grad (detach the inputs "
        "or call it under torch.no_grad())"))


def _block_mask_args(block_mask, q, batch, heads_q, seq_q, seq_kv):
    """block_mask as the op's arguments (block_q, block_kv and the four
    lists), after checking that it fits the problem."""
    if block_mask is None:
        return _NO_BLOCK_MASK
    if not isinstance(block_mask, BlockMask):
        raise TypeError(f"{_WHO}: block_mask is a {type(block_mask).__name__}, not a "
                        "flashjit.BlockMask (flashjit.block_mask() builds one; "
                        "flashjit.BlockMask.from_flex takes FlexAttention's)")
    block_mask._check_problem(batch, heads_q, seq_q, seq_kv, q.device, _WHO)
    return (block_mask.block_q, block_mask.block_kv) + block_mask._tensors()


def _check_sinks(sinks, q, heads_q):
    """sinks: None, or float32 (heads_q,) on q's device, contiguous."""
    if sinks is None:
        return
    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"{_WHO}: sinks is a {type(sinks).__name__}, not a torch.Tensor "
                        "(float32, one logit per query head)")
    if sinks.dtype != torch.float32:
        raise TypeError(f"{_WHO}: sinks has dtype {sinks.dtype}; it must be torch.float32")
    if tuple(sinks.shape) != (heads_q,):
        raise ValueError(f"{_WHO}: sinks has shape {tuple(sinks.shape)}; it must be "
                         f"({heads_q},), one logit per query head")
    if sinks.device != q.device:
        raise ValueError(f"{_WHO}: sinks is on {sinks.device}; the attention inputs are on "
                         f"{q.device}")
    if heads_q > 1 and sinks.stride(0) != 1:
        raise ValueError(f"{_WHO}: sinks is not contiguous (stride {sinks.stride(0)}); call "
                         ".contiguous()")


def _window(window):
    if window is None:
        return -1, -1
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise ValueError(f"{_WHO}: window={window!r} must be a pair (left, right); -1 leaves "
                         "a side unbounded")
    return pr.int_arg("window[0]", window[0]), pr.int_arg("window[1]", window[1])


def _softcap(softcap):
    if softcap is None:
        return 0.0
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"{_WHO}: softcap must be a number or None, not {softcap!r}")
    return pr.float32_arg("softcap", softcap)


# ---- block masks ---------------------------------------------------------------------

_WHO_BM = "flashjit.block_mask"


def block_mask(q=None, k=None, *, mask_mod=None, params=None, causal=None, window=None,
               layout="bhsd", batch=None, heads_q=None, heads_kv=None, seq_q=None,
               seq_kv=None, device=None, block_q=128, block_kv=128):
    """A flashjit.BlockMask built on the GPU from a mask, for
    attention(..., block_mask=) with the same mask arguments.

    The mask is attention()'s: mask_mod (a C expression of b, h, hkv, q,
    kv and params), params (ints, floats, tensors on the device), causal
    and window, with the sequence ends.  The library evaluates it at every
    (query, key) pair on the GPU (fj_block_mask_build) and keeps per block
    of block_q x block_kv (64, 128 or 256 each; FlexAttention's default
    128, 128) only whether the mask hides it, keeps it in part or keeps it
    whole: the dense mask never exists.  The sizes come from q and k, as
    attention() takes them in `layout`, or from batch, heads_q, seq_q and
    seq_kv (heads_kv: heads_q) on `device` (default: a tensor parameter's,
    else the current CUDA device).  The mask's batch is 1 unless mask_mod
    reads b, and its heads 1 unless it reads h or hkv.

    The work goes on the current CUDA stream (as a kernel launch, so it
    can be captured in a CUDA graph once it has compiled).  The result
    serves every later call of that shape, mask and parameter values --
    every layer, every step; it holds one buffer, which its four tensors
    view.  Raises TypeError / ValueError naming the bad value, the
    library's errors (InvalidArgument for the mask expression), and
    NoDevice without a GPU.
    """
    p, mods, dev = _block_mask_problem(q, k, mask_mod, params, causal, window, layout, batch,
                                       heads_q, heads_kv, seq_q, seq_kv, device)
    bq = pr.block_size("block_q", block_q)
    bkv = pr.block_size("block_kv", block_kv)
    try:
        ctx = core.gpu_context(dev.index)
    except core.NoDevice as e:
        raise core.NoDevice(e.status, f"{_WHO_BM} builds the lists on a GPU: {e}") from None
    lib = core.lib()
    n = _block_mask_size(ctx, p, bq, bkv)
    buf = torch.empty(n, dtype=torch.uint8, device=dev)
    raw = capi.BlockMask()
    st = lib.fj_block_mask_build(ctx, C.byref(p), bq, bkv, buf.data_ptr(), n, C.byref(raw),
                                 _stream(dev))
    if st != capi.OK:
        raise core.error(st, ctx)
    del mods  # held until here: the build read it (the parameters are the caller's)
    return BlockMask._of_buffer(buf, raw, p.seq_q, p.seq_kv)


def _block_mask_size(ctx, p, block_q, block_kv):
    """fj_block_mask_size: the bytes of the mask's buffer (any context,
    compile-only ones included)."""
    n = C.c_size_t()
    core.check(core.lib().fj_block_mask_size(ctx, C.byref(p), block_q, block_kv,
                                             C.byref(n)), ctx)
    return n.value


def _block_mask_problem(q, k, mask_mod, params, causal, window, layout, batch, heads_q,
                        heads_kv, seq_q, seq_kv, device):
    """The fj_problem block_mask() builds from (its mods kept alive by the
    ModsArg returned with it) and the CUDA device, all checked."""
    c = pr.causal_code(causal)
    lay = pr.choose("layout", layout, pr.LAYOUTS)
    sizes = dict(batch=batch, heads_q=heads_q, heads_kv=heads_kv, seq_q=seq_q, seq_kv=seq_kv)
    if q is not None or k is not None:
        given = [n for n, x in sizes.items() if x is not None]
        if q is None or k is None:
            raise TypeError(f"{_WHO_BM}: {'k' if q is not None else 'q'} is missing: give q "
                            "and k (the attention inputs) or the sizes")
        if given or device is not None:
            raise ValueError(f"{_WHO_BM}: give q and k or the sizes, not both "
                             f"({', '.join(given + (['device'] if device is not None else []))}"
                             " given with q and k)")
        b, hq, sq, d = _check_tensor("q", q, lay, _WHO_BM)
        bk, hk, sk, _ = _check_tensor("k", k, lay, _WHO_BM)
        if b != bk:
            raise ValueError(f"{_WHO_BM}: batch sizes differ: q {b}, k {bk}")
        for name, t in (("q", q), ("k", k)):
            if t.device.type != "cuda":
                raise ValueError(f"{_WHO_BM}: {name} is on {t.device}; flashjit runs on CUDA "
                                 "tensors")
        if k.device != q.device:
            raise ValueError(f"{_WHO_BM}: q and k must be on one device; got {q.device}, "
                             f"{k.device}")
        # The builder reads no element: FP8 inputs' mask is a 16-bit problem's.
        dev, dtype = q.device, _DTYPES[q.dtype] if q.dtype != _FP8 else capi.BF16
    else:
        missing = [n for n, x in sizes.items() if x is None and n != "heads_kv"]
        if missing:
            raise TypeError(f"{_WHO_BM}: give q and k, or batch, heads_q, seq_q and seq_kv "
                            f"({', '.join(missing)} missing)")
        b, hq, sq, sk = (pr.int_arg(n, sizes[n]) for n in ("batch", "heads_q", "seq_q",
                                                             "seq_kv"))
        hk = hq if heads_kv is None else pr.int_arg("heads_kv", heads_kv)
        d, dtype = 64, capi.F16  # the builder reads neither
        dev = _block_mask_device(device, params)
    if mask_mod is not None and not isinstance(mask_mod, str):
        raise TypeError(f"{_WHO_BM}: mask_mod must be a C expression in a str, not "
                        f"{mask_mod!r}")
    mods = pr.ModsArg(window, None, None, mask_mod, params, device=dev)
    lib = core.lib()
    p = capi.Problem()
    lib.fj_problem_init(C.byref(p), b, hq, hk, sq, sk, d, dtype, capi.BHSD)
    p.causal = c
    p.mods = mods.ptr
    # The sizes, the expression and the parameters, before any GPU is looked for.
    core.check(lib.fj_problem_check_lengths(C.byref(p)))
    return p, mods, dev


def _block_mask_device(device, params):
    """The CUDA device of block_mask() from sizes: device=, else a tensor
    parameter's, else the current one (with an index)."""
    if device is None and isinstance(params, dict):
        for name, t in params.items():
            if isinstance(t, torch.Tensor):
                if t.device.type != "cuda":
                    raise ValueError(f"{_WHO_BM}: params[{name!r}] is on {t.device}; the "
                                     "lists are built on a CUDA device, with the parameters "
                                     "there")
                device = t.device
                break
    if device is None:
        return torch.device("cuda", core.default_device())
    try:
        dev = torch.device(device)
    except (TypeError, RuntimeError) as e:
        raise ValueError(f"{_WHO_BM}: device {device!r} is not a device ({e})") from None
    if dev.type != "cuda":
        raise ValueError(f"{_WHO_BM}: device {dev} is not a CUDA device; the lists are built "
                         "on the GPU")
    return dev if dev.index is not None else torch.device("cuda", core.default_device())
