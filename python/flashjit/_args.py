"""The argument checks and options of the PyTorch calls, which the
forward (_torch.py, _serving.py) and the training calls (_train.py)
share: the tensors, descales and sinks refused with one line naming the
value and the rule; the options as fj_problem and fj_mods take them
(causal_code, window_arg, params_opts, mods_of, descale_slots); the
shapes a call returns (lse_shape, out_shape); and the dense fj_problem
of q, k and v (_problem), the forward's and the backward's.

Imported only where torch imports.
"""
import ctypes as C

import torch

from . import _blockmask as bmask
from . import _capi as capi
from . import _core as core
from . import _problem as pr


# FP8 (torch.float8_e4m3fn, where this PyTorch has it): q, k and v all, O
# in bfloat16 (fj_problem's dtype FJ_E4M3).
_FP8 = getattr(torch, "float8_e4m3fn", None)
_DTYPES = {torch.float16: capi.F16, torch.bfloat16: capi.BF16}
if _FP8 is not None:
    _DTYPES[_FP8] = capi.E4M3
_TORCH_OF = {code: t for t, code in _DTYPES.items()}
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
    if (k.dtype != q.dtype or v.dtype != q.dtype) and not kv_fp8(q, k, v):
        if _FP8 in (q.dtype, k.dtype, v.dtype):
            raise TypeError(
                f"{_WHO}: q, k and v are {q.dtype}, {k.dtype}, {v.dtype}; FP8 attention "
                "takes all three in torch.float8_e4m3fn, an FP8 KV cache's k and v both "
                "under a float16 or bfloat16 q")
        raise TypeError(f"{_WHO}: q, k and v must share a dtype; got {q.dtype}, {k.dtype}, "
                        f"{v.dtype}")
    if not b == bk == bv:
        raise ValueError(f"{_WHO}: batch sizes differ: q {b}, k {bk}, v {bv}")
    if d != dk:
        raise ValueError(f"{_WHO}: head dims differ: q {d}, k {dk}; q and k share one "
                         "(v and the output may have another: head_dim_v)")
    if hk != hv or sk != sv:
        raise ValueError(f"{_WHO}: k {tuple(k.shape)} and v {tuple(v.shape)} must have the "
                         "same heads and sequence length")
    if hk == 0 or hq % hk:
        raise ValueError(f"{_WHO}: q has {hq} heads and k, v {hk}: the query heads must be "
                         "a multiple of the KV heads (GQA)")
    if dv == 0 and d and b * hq * sq:
        # O would have no columns, but its rows' log-sum-exps would still be owed.
        raise ValueError(f"{_WHO}: v {tuple(v.shape)} has head dim 0; it must be q's "
                         f"{d} or a head_dim_v, a multiple of 8 from 8")
    dev = q.device
    if dev.type != "cuda" or k.device != dev or v.device != dev:
        _device_error(q, k, v)
    return b, hq, hk, sq, sk, d


def kv_fp8(q, k, v):
    """Whether k and v are FP8 under a 16-bit q (an FP8 KV cache's:
    fj_problem.kv_dtype; the library dequantises them on load)."""
    return (_FP8 is not None and k.dtype == _FP8 and v.dtype == _FP8 and
            q.dtype in (torch.float16, torch.bfloat16))


def _device_error(q, k, v, who=_WHO):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.device.type != "cuda":
            raise ValueError(f"{who}: {name} is on {t.device}; flashjit runs on CUDA "
                             "tensors")
    raise ValueError(f"{who}: q, k and v must be on one device; got {q.device}, "
                     f"{k.device}, {v.device}")


def _out_shape(b, h, s, d, layout):
    return (b, h, s, d) if layout == capi.BHSD else (b, s, h, d)


def _out_dtype(dtype, o=None):
    """O's dtype: q's, or bfloat16 for FP8 inputs -- or the call's
    out_dtype (Opts o's, a capi code) where it chose one."""
    if o is not None and o.out_dtype:
        return _TORCH_OF[o.out_dtype]
    return torch.bfloat16 if dtype == _FP8 else dtype


def _check_out(q, out_dtype, o_scale, return_amax, fp8):
    """out_dtype, o_scale and return_amax (FP8 attention's output): the
    capi code of out_dtype (0: the default)."""
    code = 0
    # A 16-bit q's call (FP8 k and v among them: an FP8 KV cache's) writes O
    # in q's dtype.
    writes = f"a {q.dtype} q's call writes O in {q.dtype}"
    if out_dtype is not None and out_dtype is not _out_dtype(q.dtype):
        if not fp8:
            raise ValueError(f"{_WHO}: out_dtype={out_dtype} is for FP8 attention "
                             f"(q, k and v torch.float8_e4m3fn); {writes}")
        if out_dtype not in (torch.float16, _FP8):
            raise ValueError(f"{_WHO}: out_dtype={out_dtype!r} is not torch.bfloat16, "
                             "torch.float16 or torch.float8_e4m3fn")
        code = _DTYPES[out_dtype]
    if o_scale is not None:
        if code != capi.E4M3:
            raise ValueError(f"{_WHO}: o_scale is an e4m3 O's scale: pass "
                             "out_dtype=torch.float8_e4m3fn with it")
        if not isinstance(o_scale, torch.Tensor):
            raise TypeError(f"{_WHO}: o_scale is a {type(o_scale).__name__}, not a "
                            "torch.Tensor (float32, one element)")
        if o_scale.dtype != torch.float32 or o_scale.numel() != 1:
            raise ValueError(f"{_WHO}: o_scale has dtype {o_scale.dtype} and shape "
                             f"{tuple(o_scale.shape)}; it must be float32 with one element")
        if o_scale.device != q.device:
            raise ValueError(f"{_WHO}: o_scale is on {o_scale.device}; the attention inputs "
                             f"are on {q.device}")
    if return_amax is not False and return_amax is not True:
        raise TypeError(f"{_WHO}: return_amax must be True or False, not {return_amax!r}")
    if return_amax and not fp8:
        raise ValueError(f"{_WHO}: return_amax is FP8 attention's (q, k and v "
                         f"torch.float8_e4m3fn); q is {q.dtype}")
    return code


_DESCALES = ("q_descale", "k_descale", "v_descale")


def _per_tensor(t):
    """Whether descale t holds one value for every (batch, KV head): one
    element, or (batch, heads_kv) expanded from one (strides 0, as vLLM's
    k_scale.expand(...) makes)."""
    return t.numel() == 1 or all(s == 0 for s in t.stride())


def check_descales(q, batch, heads_kv, descales, fp8, who=_WHO):
    """descales (q_descale, k_descale, v_descale): each None or a float32
    tensor on q's device, only where fp8 (the inputs it names are FP8):
    (batch, heads_kv) contiguous, one per (batch, KV head); or one for the
    tensor -- shape () or (1,), or (batch, heads_kv) with strides 0.
    Those given are all one kind or all the other (scale_layout)."""
    for name, t in zip(_DESCALES, descales):
        if t is None:
            continue
        if not fp8:
            raise ValueError(f"{who}: {name} is for FP8 inputs (torch.float8_e4m3fn); q, "
                             f"k and v are {q.dtype}")
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{who}: {name} is a {type(t).__name__}, not a torch.Tensor "
                            "(float32, one descale per (batch, KV head) or one in all)")
        if t.dtype != torch.float32:
            raise TypeError(f"{who}: {name} has dtype {t.dtype}; it must be torch.float32")
        if tuple(t.shape) not in ((batch, heads_kv), (), (1,)):
            raise ValueError(f"{who}: {name} has shape {tuple(t.shape)}; it must be "
                             f"(batch, heads_kv) = ({batch}, {heads_kv}), or () or (1,) "
                             "for one descale in all")
        if t.device != q.device:
            raise ValueError(f"{who}: {name} is on {t.device}; the attention inputs are on "
                             f"{q.device}")
        if not t.is_contiguous() and not _per_tensor(t):
            raise ValueError(f"{who}: {name} is not contiguous (strides "
                             f"{tuple(t.stride())}); call .contiguous()")
    scale_layout(descales, who)


def scale_layout(descales, who=_WHO):
    """fj_problem.scale_layout for the descales given: SCALE_PER_TENSOR
    where each holds one value, SCALE_PER_HEAD where each holds one per
    (batch, KV head) (those not given read all-ones (batch, heads_kv),
    right for both).  A mix is refused: the kernels read the three
    alike."""
    given = [(n, _per_tensor(t)) for n, t in zip(_DESCALES, descales) if t is not None]
    one = [n for n, per in given if per]
    if one and len(one) < len(given):
        other = next(n for n, per in given if not per)
        raise ValueError(f"{who}: {one[0]} holds one descale for the tensor and {other} one "
                         "per (batch, KV head): give them alike (expand the single one to "
                         "(batch, heads_kv) and call .contiguous())")
    return capi.SCALE_PER_TENSOR if one else capi.SCALE_PER_HEAD


def _check_descales(q, k, batch, heads_kv, descales):
    """attention()'s descales (check_descales): all three where q is FP8,
    k's and v's where only they are (kv_fp8).  Returns whether q is FP8."""
    fp8 = q.dtype == _FP8
    if not fp8 and k.dtype == _FP8 and descales[0] is not None:
        raise ValueError(f"{_WHO}: q_descale is for an FP8 q; q is {q.dtype} (k_descale and "
                         "v_descale scale the FP8 k and v)")
    if fp8 or k.dtype != _FP8:
        check_descales(q, batch, heads_kv, descales, fp8)
    else:
        check_descales(q, batch, heads_kv, (None,) + tuple(descales[1:]), True)
    return fp8


def _check_sinks(sinks, q, heads_q, who=_WHO):
    """sinks: None, or float32 (heads_q,) on q's device, contiguous."""
    if sinks is None:
        return
    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"{who}: sinks is a {type(sinks).__name__}, not a torch.Tensor "
                        "(float32, one logit per query head)")
    if sinks.dtype != torch.float32:
        raise TypeError(f"{who}: sinks has dtype {sinks.dtype}; it must be torch.float32")
    if tuple(sinks.shape) != (heads_q,):
        raise ValueError(f"{who}: sinks has shape {tuple(sinks.shape)}; it must be "
                         f"({heads_q},), one logit per query head")
    if sinks.device != q.device:
        raise ValueError(f"{who}: sinks is on {sinks.device}; the attention inputs are on "
                         f"{q.device}")
    if heads_q > 1 and sinks.stride(0) != 1:
        raise ValueError(f"{who}: sinks is not contiguous (stride {sinks.stride(0)}); call "
                         ".contiguous()")


# ---- options ------------------------------------------------------------------------


def causal_code(causal, true=capi.CAUSAL_TOP_LEFT):
    """causal as fj_causal: attention()'s True is PyTorch's is_causal
    (top-left); the serving calls' True is FlashAttention's (bottom-right)."""
    return true if causal is True else pr.causal_code(causal)


def window_arg(window, who=_WHO):
    if window is None:
        return -1, -1
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise ValueError(f"{who}: window={window!r} must be a pair (left, right); -1 leaves "
                         "a side unbounded")
    return pr.int_arg("window[0]", window[0]), pr.int_arg("window[1]", window[1])


def bool_arg(what, value, who=_WHO):
    """A switch: True or False (a truthy string such as "no" would turn it on)."""
    if value is not False and value is not True:
        raise TypeError(f"{who}: {what} must be True or False, not {value!r}")
    return value


def softcap_arg(softcap, who=_WHO):
    if softcap is None:
        return 0.0
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"{who}: softcap must be a number or None, not {softcap!r}")
    return pr.float32_arg("softcap", softcap)


def check_exprs(score_mod, mask_mod, who=_WHO):
    for what, text in (("score_mod", score_mod), ("mask_mod", mask_mod)):
        if text is not None and not isinstance(text, str):
            raise TypeError(f"{who}: {what} must be a C expression in a str, not {text!r}")


def params_opts(params, who=_WHO):
    """params as Opts.params, with the roles and the tensors among them
    (the call's extras "param:NAME")."""
    if params is None:
        return (), (), ()
    if not isinstance(params, dict):
        raise TypeError(f"{who}: params must be a dict of name -> value, not "
                        f"{type(params).__name__}")
    spec, roles, tensors = [], [], []
    for name, value in params.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"{who}: params: {name!r} is not a C identifier")
        if isinstance(value, torch.Tensor):
            spec.append((name, "t", None))
            roles.append("param:" + name)
            tensors.append(value)
        elif isinstance(value, tuple) and len(value) == 2:
            raise TypeError(f"{who}: params[{name!r}] describes a tensor {value!r}; "
                            "attention() and block_mask() need the tensor itself")
        elif isinstance(value, bool):
            raise TypeError(f"{who}: params[{name!r}]={value!r}: a bool is not a parameter "
                            "(an int is i32, a float f32, or a tensor)")
        elif not isinstance(value, (int, float)):
            raise TypeError(f"{who}: params[{name!r}]={value!r}: an int (i32), a float "
                            "(f32) or a tensor")
        elif isinstance(value, int):
            pr.scalar_param(name, value)
            spec.append((name, "i", int(value)))
        else:
            spec.append((name, "f", pr.scalar_param(name, value)[1]))
    return tuple(spec), tuple(roles), tuple(tensors)


def mods_of(o, x, device):
    """The fj_mods of options o and the call's extras x (role -> tensor)
    as a ModsArg, and the slots that take the call's pointers: the sinks,
    the tensor parameters and a block mask's lists point at a placeholder
    until a call writes its own.  Checks the parameters' tensors."""
    params = {name: x["param:" + name] if kind == "t" else value
              for name, kind, value in o.params}
    bm = None
    if o.block_q:
        bm = bmask.struct_of(o.block_q, o.block_kv, *(x.get(n) for n in bmask._NAMES))
    mods = pr.ModsArg((o.window_left, o.window_right), o.softcap, o.score_mod or None,
                      o.mask_mod or None, params or None, device=device,
                      sinks=True if "sinks" in x else None, block_mask=bm, checked=o.checked)
    slots, ph = [], C.addressof(pr._PLACEHOLDER)
    role = {r: i for i, r in enumerate(o.roles)}
    if "sinks" in role:
        slots.append((mods.mods, "sinks", role["sinks"]))
    for i, (name, kind, _) in enumerate(o.params):
        if kind == "t":
            mods.mods.params[i].data = ph
            slots.append((mods.mods.params[i], "data", role["param:" + name]))
    if bm is not None:
        for field in bmask._NAMES:
            if field in role:
                setattr(bm, field, ph)
                slots.append((bm, field, role[field]))
    return mods, slots


def descale_slots(p, o, x, batch, heads_kv, fields):
    """Descale pointers of p (fields: (role, struct field) pairs) as slots:
    a placeholder until a call writes its own; the ones not given read a
    kept all-ones tensor (Entry.ones).  Returns (slots, ones)."""
    role = {r: i for i, r in enumerate(o.roles)}
    ph = C.addressof(pr._PLACEHOLDER)
    slots, missing = [], 0
    for name, field in fields:
        setattr(p, field, ph)
        if name in role:
            slots.append((p, field, role[name]))
        else:
            slots.append((p, field, len(o.roles) + missing))
            missing += 1
    return slots, (batch, heads_kv, missing) if missing else None


def lse_shape(o, q):
    """The log-sum-exp a call of options o returns for q: (batch,
    heads_q, seq_q) -- FlashAttention's (heads_q, total_q) for varlen."""
    if o.kind == "varlen":
        return (q.shape[1], q.shape[0])
    if o.kind == "kvcache":
        return (q.shape[0], q.shape[2], q.shape[1])
    b, h, s, _ = _sizes(q, o.layout)
    return (b, h, s)


# ---- the dense problem ---------------------------------------------------------------


def _problem(q, k, v, causal, scale, layout):
    """The fj_problem of dense q, k and v (O contiguous, as attention()
    allocates it: q's shape with v's head dim).  Reads only the tensors'
    shapes, strides and dtype."""
    b, hq, sq, d = _sizes(q, layout)
    _, hk, sk, dv = _sizes(v, layout)
    p = capi.Problem()
    core.lib().fj_problem_init(C.byref(p), b, hq, hk, sq, sk, d, _DTYPES[q.dtype], layout)
    p.causal, p.scale = causal, scale
    p.q_stride[:], p.k_stride[:] = _strides(q, layout), _strides(k, layout)
    p.v_stride[:] = _strides(v, layout)
    if dv != d:
        # Split head dims (MLA's 192/128): V and O have their own.
        p.head_dim_v = dv
        p.o_stride[:] = _strides(torch.empty(out_shape(q, v), device="meta"), layout)
    return p


def out_shape(q, v):
    """attention()'s output: q's shape with v's head dim (the last)."""
    return (*q.shape[:-1], v.shape[-1])
