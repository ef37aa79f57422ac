"""flashjit.attention for PyTorch tensors, and its torch.library ops.

Imported by the package only where torch imports.  Eager calls skip the
dispatcher: attention() looks its call up in this thread's table of
cached calls (_calls.py) by its own arguments -- one dict lookup -- and
launches; a call not seen before is checked, planned and remembered.
torch.compile traces attention() into the op torch.ops.flashjit.attention
(or attention_lse, which also returns the log-sum-exp): the tensors, the
extra tensors (sinks, the expressions' tensors, a block mask's lists,
descales; varlen and paged arrays for the serving calls) in one list, and
every other option in one string (_calls.encode), since each argument of
an op costs dispatcher time on every call.  The ops are defined with
torch.library directly, with a fake (meta) implementation each, and take
no gradient: attention() sends a call whose inputs require grad to
flashjit::attention_train (built-in masks; its backward
flashjit::attention_bwd), to flashjit::attention_train_mods (score_mod,
mask_mod, params, block masks; its backward flashjit::attention_bwd_mods),
or runs it forward with a backward that raises (checked mode).  Eagerly
the training calls skip those ops' dispatch: autograd.Functions (_Train,
_TrainCall for attention()'s repeats, _TrainMods) run the same forwards
and backwards.  attention_varlen()
(_serving.py) does the same with the training ops' varlen arguments: one
autograd formula and one backward path (_launch_bwd, calls.BWD_PROBLEMS)
for both kinds.
"""
import ctypes as C
import functools
import inspect
import operator
import typing

import torch

from . import _blockmask as bmask
from . import _calls as calls
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


# ---- the dense call -------------------------------------------------------------------


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


def _check_dense(o, q, k, v, x):
    """The tensors of a dense call (attention()'s checks, in its order).
    Returns (batch, heads_q, heads_kv, seq_q, seq_kv, head_dim)."""
    sizes = check_inputs(q, k, v, o.layout)
    b, hq, hk, sq, sk, _ = sizes
    _check_descales(q, k, b, hk, tuple(x.get(n) for n in _DESCALES))
    _check_sinks(x.get("sinks"), q, hq)
    if o.block_q:
        bmask._check_lists(*(x.get(n) for n in bmask._NAMES))
    return sizes


def _build_dense(o, lse, q, k, v, extras):
    """calls.BUILDERS["dense"]: the entry of an attention() call."""
    x = dict(zip(o.roles, extras))
    b, hq, hk, sq, sk, d = _check_dense(o, q, k, v, x)
    lse_shape_ = (b, hq, sq) if lse else None
    # No rows: nothing to launch.  A head dim of 0 with rows is the
    # library's to refuse (an idle call would return O and lse unwritten).
    if b * hq * sq == 0:
        e = calls.make_entry(None, q.device, _out_dtype(q.dtype, o), lse_shape_, idle=True)
        e.out_dv = v.shape[-1] if v.shape[-1] != d else 0
        return e
    p = _problem(q, k, v, o.causal, o.scale, o.layout)
    p.splits = o.num_splits
    slots, ones, keep = [], None, ()
    if q.dtype == _FP8:
        slots, ones = descale_slots(p, o, x, b, hk, (("q_descale", "q_scale"),
                                                      ("k_descale", "k_scale"),
                                                      ("v_descale", "v_scale")))
        p.scale_layout = scale_layout(tuple(x.get(n) for n in _DESCALES))
        # O's element, its scale (an e4m3 O's) and, per call, its amax.
        p.o_dtype = o.out_dtype
        if "o_scale" in x:
            p.o_scale = C.addressof(pr._PLACEHOLDER)
            slots.append((p, "o_scale", o.roles.index("o_scale")))
    elif kv_fp8(q, k, v):
        # An FP8 KV cache's k and v under a 16-bit q: O in q's dtype.
        p.kv_dtype = capi.E4M3
        slots, ones = descale_slots(p, o, x, b, hk, (("k_descale", "k_scale"),
                                                      ("v_descale", "v_scale")))
        p.scale_layout = scale_layout((None, x.get("k_descale"), x.get("v_descale")))
    mods, mod_slots = mods_of(o, x, q.device)
    p.mods = mods.ptr
    if mods.ptr is not None:
        keep = (mods,)
    return calls.make_entry(p, q.device, _out_dtype(q.dtype, o), lse_shape_,
                            slots + mod_slots, keep, ones)


calls.BUILDERS["dense"] = _build_dense


# ---- the ops ----------------------------------------------------------------------------

_lib = torch.library.Library("flashjit", "FRAGMENT")  # kept: the ops live as long as it
_TAGS = (torch.Tag.pt2_compliant_tag,)
_lib.define("attention(Tensor q, Tensor k, Tensor v, Tensor[] extra, str opts) -> Tensor",
            tags=_TAGS)
_lib.define("attention_lse(Tensor q, Tensor k, Tensor v, Tensor[] extra, str opts) -> "
            "(Tensor, Tensor)", tags=_TAGS)
_lib.define("attention_amax(Tensor q, Tensor k, Tensor v, Tensor[] extra, str opts) -> "
            "(Tensor, Tensor, Tensor)", tags=_TAGS)


def _untraced(fn):
    """An op's kernel that torch.compile's Dynamo never traces, as
    custom_op's kernels are not: it runs where a compiled graph calls the
    op, and after a graph break Dynamo would otherwise try to compile its
    frames.  torch._dynamo is imported on the first call, not here."""
    disabled = None

    @functools.wraps(fn)
    def kernel(*args):
        nonlocal disabled
        if disabled is None:
            disabled = torch.compiler.disable(fn)
        return disabled(*args)
    return kernel


def _op(q, k, v, extra, opts):
    """flashjit::attention: the output of attention(), or of a serving
    call, whose options `opts` holds (_calls.encode) and whose extra
    tensors `extra` holds in the order of its roles."""
    o = calls.decode(opts)
    return calls.forward(calls.entry(o, False, q, k, v, extra), q, k, v, extra)[0]


def _op_lse(q, k, v, extra, opts):
    """flashjit::attention_lse: (out, lse) of the same call."""
    o = calls.decode(opts)
    return calls.forward(calls.entry(o, True, q, k, v, extra), q, k, v, extra)


def _op_amax(q, k, v, extra, opts):
    """flashjit::attention_amax: (out, lse, amax) of an FP8 attention call
    whose Opts.amax is set: amax float32 (), max |O| (fj_problem.o_amax)."""
    o = calls.decode(opts)
    amax = torch.empty((), dtype=torch.float32, device=q.device)
    out, lse = calls.forward(calls.entry(o, True, q, k, v, extra), q, k, v, extra, amax)
    return out, lse, amax


def _op_fake(q, k, v, extra, opts):
    o = calls.decode(opts)
    return q.new_empty(out_shape(q, v), dtype=_out_dtype(q.dtype, o))


def _op_lse_fake(q, k, v, extra, opts):
    o = calls.decode(opts)
    return (q.new_empty(out_shape(q, v), dtype=_out_dtype(q.dtype, o)),
            q.new_empty(lse_shape(o, q), dtype=torch.float32))


def _op_amax_fake(q, k, v, extra, opts):
    return _op_lse_fake(q, k, v, extra, opts) + (q.new_empty((), dtype=torch.float32),)


_lib.impl("attention", _untraced(_op), "CUDA")
_lib.impl("attention_lse", _untraced(_op_lse), "CUDA")
_lib.impl("attention_amax", _untraced(_op_amax), "CUDA")
torch.library.register_fake("flashjit::attention", _op_fake, lib=_lib)
torch.library.register_fake("flashjit::attention_lse", _op_lse_fake, lib=_lib)
torch.library.register_fake("flashjit::attention_amax", _op_amax_fake, lib=_lib)


def op_call(o, lse, q, k, v, extras):
    """The call as the op (what torch.compile traces): (out, lse) -- with
    Opts.amax, (out, lse, amax), lse always made."""
    text = calls.encode(o)
    if o.amax:
        return torch.ops.flashjit.attention_amax(q, k, v, list(extras), text)
    if lse:
        return torch.ops.flashjit.attention_lse(q, k, v, list(extras), text)
    return torch.ops.flashjit.attention(q, k, v, list(extras), text), None


# Why a call's backward raises, by the kind of call.
_NO_BACKWARD = {
    "dense": f"{_WHO}: the backward does not take checked=True yet"}


class NoBackward(torch.autograd.Function):
    """A call whose inputs require grad but whose backward is not
    implemented (checked mode): the forward through the op,
    and a backward of flashjit::no_backward, which raises when it runs --
    at loss.backward(), eagerly or compiled -- and traces like any op, so
    that torch.compile needs no graph break for it."""

    @staticmethod
    def forward(ctx, o, lse, q, k, v, *extras):
        out, l = op_call(o, lse, q, k, v, extras)
        if l is not None:
            ctx.mark_non_differentiable(l)
        ctx.save_for_backward(q, k, v)
        ctx.extras = len(extras)
        ctx.why = _NO_BACKWARD[o.kind]
        return out, l

    @staticmethod
    def backward(ctx, dout, dlse):
        grads = tuple(torch.ops.flashjit.no_backward(dout, t, ctx.why)
                      for t in ctx.saved_tensors)
        return (None, None) + grads + (None,) * ctx.extras


_lib.define("no_backward(Tensor grad, Tensor like, str why) -> Tensor", tags=_TAGS)


def _no_backward(grad, like, why):
    """flashjit::no_backward: the gradient of an input whose backward is
    not implemented: raises NotImplementedError(why)."""
    raise NotImplementedError(why)


_lib.impl("no_backward", _untraced(_no_backward), "CompositeExplicitAutograd")
torch.library.register_fake("flashjit::no_backward",
                            lambda grad, like, why: torch.empty_like(like), lib=_lib)


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
    return q.shape[1] if layout == capi.THD else _sizes(q, layout)[1]


def _bwd_problem(q, k, v, causal, scale, layout, deterministic):
    """The fj_problem of the backward: the forward's with the deterministic
    switch.  Reads only the tensors' shapes, strides and dtype."""
    p = _problem(q, k, v, causal, scale, layout)
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
    mods, mod_slots = mods_of(o, x, q.device)
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
    own entries by mode (its signature fixes every tensor's metadata but
    dO's, which is read as O's), or None.  views: q, k and v that are
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
    hit = None if mine is None else mine.get(mode)
    if hit is None:
        hit = _bwd_entry(dout, q, k, v, out, lse, o, extras, deterministic, views)
        if mine is not None:
            mine[mode] = hit
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
    b, hq, sq, d = _sizes(q, layout)
    return q.new_empty(_out_shape(b, hq, sq, d, layout)), q.new_empty((b, hq, sq),
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
    mine): a repeat builds no options and looks up no entry."""

    __slots__ = ("args", "o", "entry", "bwd")

    def __init__(self, args, sinks):
        self.args = args
        self.o = _train_opts(sinks, *args)[0]
        self.entry = None
        self.bwd = {}


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
        return (None,) * 5 if grads is None else grads + (None,)


def train_call(q, k, v, sinks, call):
    """attention()'s training call with the built-in masks (call: a
    TrainCall): (out, lse).  Through the op under torch.compile, eagerly
    through _TrainCall."""
    if torch.compiler.is_compiling():
        return attention_train_op(q, k, v, sinks, *call.args)
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
    mods, slots = mods_of(o, x, q.device)
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
    ModsCall's own entries by mode and gradients (its signature fixes
    every tensor's metadata but dO's, read contiguous), or None.  Eagerly
    (mine), q, k and v that are strided views without overlaps are read
    where they are and their gradients laid out as they are, as
    _launch_bwd's views; the op keeps its fake's dense gradients."""
    o = calls.decode(opts)
    mode = (bool(deterministic), int(pgrads))
    hit = None if mine is None else mine.get(mode)
    # Which of q, k and v become dense copies, and whether any is read in
    # place though not dense: a ModsCall's (mine) once.
    copy, kept = _copies(q, k, v, mine is not None) if hit is None else hit[1:]
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
        hit = (e, copy, kept)
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
    return (q.new_empty(out_shape(q, v), dtype=_out_dtype(q.dtype)),
            q.new_empty(_raw_lse_shape(o, q, extra), dtype=torch.float32))


def _raw_lse_shape(o, q, extra):
    """The log-sum-exp the training ops return: the library's, which their
    backward reads -- (batch, heads_q, max_seqlen_q) for varlen."""
    if o.kind == "varlen":
        batch = extra[o.roles.index("cu_seqlens_q")].shape[0] - 1
        return (batch, q.shape[1], o.max_seqlen_q)
    return lse_shape(o, q)


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

    __slots__ = ("opts", "entry", "bwd", "floats")

    def __init__(self, opts):
        self.opts, self.entry, self.bwd, self.floats = opts, None, {}, None


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

        grads = _mods_grads(ctx.saved_tensors, ctx.opts, ctx.pgrads, dout, dlse,
                            _attention_bwd_mods if torch.compiler.is_compiling() else bwd)
        at = ctx.call.floats
        if grads is None:
            return (None,) * (5 + len(at))
        return grads[:3] + (None, None) + tuple(grads[3][i] for i in at)


def train_mods(q, k, v, extras, call):
    """A training call with expressions (attention_train_mods_op's
    arguments; call a ModsCall, or its options' text): (out, lse).
    Through the op under torch.compile, eagerly through _TrainMods."""
    if isinstance(call, str):
        call = ModsCall(call)
    if torch.compiler.is_compiling():
        return attention_train_mods_op(q, k, v, list(extras), call.opts)
    extras = tuple(extras)
    if call.floats is None:  # the call table's key fixes the extras' dtypes
        call.floats = tuple(i for i, t in enumerate(extras) if t.is_floating_point())
    return _TrainMods.apply(q, k, v, call, extras, *(extras[i] for i in call.floats))


def _given_extras(sinks, params, block_mask, descales):
    """The extra tensors of an attention() call as given, in its roles'
    order (_dense_opts': the sinks, the tensor parameters, the block mask's
    lists, the descales), and what else of them the cached call's key
    holds: which are given, the parameters' names and scalar values (their
    types and reprs: 1, 1.0, True, 0.0 and -0.0 stay apart), the block
    mask's sizes.  Raises TypeError where the checks would refuse the
    arguments' kinds: the call goes the checked way then."""
    extras = [] if sinks is None else [sinks]
    more = [sinks is None]
    if params is not None:
        if type(params) is not dict:
            raise TypeError("params")
        for name, value in params.items():
            if isinstance(value, torch.Tensor):
                extras.append(value)
                more.append(name)
            else:
                more.append((name, type(value), repr(value)))
    more.append(len(extras))
    if block_mask is not None:
        if type(block_mask) is not BlockMask:
            raise TypeError("block_mask")
        lists = block_mask._tensors()
        extras += [t for t in lists if t is not None]
        more.append((block_mask.block_q, block_mask.block_kv) +
                    tuple(t is None for t in lists))
    extras += [t for t in descales if t is not None]
    more.append(tuple(t is None for t in descales))
    return tuple(extras), tuple(more)


# ---- attention() ----------------------------------------------------------------------


def attention(q, k, v, *, causal=None, scale=None, return_lse=False, layout="bhsd",
              window=None, softcap=None, score_mod=None, mask_mod=None, params=None,
              sinks=None, block_mask=None, checked=False, q_descale=None, k_descale=None,
              v_descale=None, out_dtype=None, o_scale=None, return_amax=False):
    """softmax(scale * q k^T [masked]) v on the GPU, as a new tensor.

    q: (batch, heads_q, seq_q, head_dim) for layout "bhsd", or (batch,
    seq_q, heads_q, head_dim) for "bshd"; k and v likewise with heads_kv
    and seq_kv.  float16 or bfloat16 (or FP8, below), CUDA, any strides
    with a contiguous head dim; heads_q a multiple of heads_kv (GQA, MQA)
    -- K and V are not copied, except where a head dim (q's and k's, or
    v's) is not a multiple of 8: then q, k and v are copied with zero
    columns to the next multiple of 8 (the scale stays 1/sqrt of q's own)
    and O's columns sliced back, as FlashAttention's wrapper does.  The output has q's layout and shape (and
    dtype, FP8 aside), contiguous, on q's device; the work goes on the
    current CUDA stream.

    causal: None, "top_left" (True; PyTorch's is_causal) or "bottom_right"
    (FlashAttention's alignment when seq_q != seq_kv).  scale: None for
    1/sqrt(head_dim).  return_lse: also return the natural-log sum-exp of
    each row, float32 (batch, heads_q, seq_q), differentiable like out
    (the backward takes both gradients).  window=(left, right): a
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
    heads_kv)], k and v by theirs; or one descale a tensor (shape () or
    (1,), or (batch, heads_kv) expanded from one: strides 0), the given
    ones alike.  The output is bfloat16 (not q's
    dtype), or out_dtype's: torch.float16, or torch.float8_e4m3fn --
    e4m3(O * o_scale), o_scale a float32 one-element tensor (None: 1),
    rounded to nearest even and saturated to 448.  return_amax=True also
    returns max |O| before o_scale, a float32 () tensor, last: (out,
    amax), or (out, lse, amax) with return_lse (cuDNN's amax_o, for a
    recipe's next o_scale = 448 / amax).  The log-sum-exp float32 as
    above.  causal, scale, window,
    mask_mod and params, sinks, return_lse, both layouts and GQA apply,
    and score_mod and softcap at head dims up to 128; what the FP8 kernel
    does not take (block_mask, score_mod or softcap above head dim 128;
    another GPU) the library refuses with its message.  An FP8 KV
    cache's k and v: both torch.float8_e4m3fn under a float16 or bfloat16
    q, with k_descale= and v_descale= as above (no q_descale), dequantised
    as they load (the mma family; the output in q's dtype; out_dtype,
    o_scale and return_amax are FP8 attention's).  No backward: a call
    with FP8 inputs whose inputs require grad raises flashjit.Unsupported.

    Differentiable in q, k, v and sinks (loss.backward() runs
    fj_attention_bwd: O and the log-sum-exp are saved, not P) with causal,
    window, softcap, sinks, GQA, score_mod, mask_mod and params (the
    backward multiplies by the score expression's derivative, which the
    library generates from it), and in the float tensor params that require
    grad (fj_mods.param_grads: float32 atomics; under
    torch.use_deterministic_algorithms, fixed point added in any order, so
    bit-identical run to run; an int tensor has no gradient), and
    with block_mask where it has the transposed lists (flashjit.block_mask()
    builds them; a BlockMask without them is refused when an input requires
    grad; under torch.use_deterministic_algorithms on the library's mma
    family).  A call with checked=True runs forward, and its
    backward raises.  Under
    torch.use_deterministic_algorithms(True) (warn_only or not) the
    backward runs the library's deterministic mode (fj_problem's
    deterministic: q.grad, k.grad, v.grad, sinks.grad and the params'
    gradients bit-identical run to run); otherwise dq's float32 additions
    run in any order.  Eagerly the backward reads q, k and v where they
    are, strided views of a fused QKV projection included (no dense
    copies first), and lays their gradients out in their strides -- one
    buffer the projection's size where q, k and v are its slices; inputs
    whose elements overlap (a broadcast) are copied dense first, and
    under torch.compile the gradients are dense.  The flag
    is read when the backward runs, or under torch.compile when it is
    traced (a change recompiles).  Under CUDA-graph capture, run the call
    once before capturing (compile, layout probe).  torch.compile traces it
    as torch.ops.flashjit.attention (attention_lse with return_lse).
    Raises TypeError / ValueError with a one-line message for bad inputs
    (the library's own where it refuses).

    A call repeats its thread's first call of the same signature -- the
    tensors' shapes, strides, dtypes and devices, and the options as given
    -- without its checks or planning: one lookup, the output's allocation
    and one launch.
    """
    if _needs_pad(q, k, v):
        # A head dim that is not a multiple of 8: zero columns to the next
        # one, at the unpadded dim's scale, then O's columns sliced back
        # (contiguous, as the unpadded call's).  The checks that name the
        # dims run on the caller's tensors first.  The dims are static
        # under torch.compile (the scale is a constant of the call).
        d, dv = operator.index(q.shape[-1]), operator.index(v.shape[-1])
        check_inputs(q, k, v, pr.choose("layout", layout, pr.LAYOUTS))
        if dv != d and torch.is_grad_enabled() and any(
                isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v, sinks)):
            _split_grad_error(q, v)
        got = attention(_pad8(q), _pad8(k), _pad8(v), causal=causal,
                        scale=d ** -0.5 if scale is None else scale, return_lse=return_lse,
                        layout=layout, window=window, softcap=softcap, score_mod=score_mod,
                        mask_mod=mask_mod, params=params, sinks=sinks, block_mask=block_mask,
                        checked=checked, q_descale=q_descale, k_descale=k_descale,
                        v_descale=v_descale, out_dtype=out_dtype, o_scale=o_scale,
                        return_amax=return_amax)
        return _unpad(got, dv)
    key = None
    if (out_dtype is None and o_scale is None and return_amax is False and
            not torch.compiler.is_compiling()):
        # The cached call (_calls.py): one lookup by the arguments as given
        # (their reprs, so that True and 1 stay apart), and the launch.
        try:
            key = (f"{causal!r},{scale!r},{return_lse!r},{layout!r},{window!r},{softcap!r},"
                   f"{score_mod!r},{mask_mod!r},{checked!r}", q.shape, q.stride(), q.dtype,
                   q.device, k.shape, k.stride(), k.dtype, k.device, v.shape, v.stride(),
                   v.dtype, v.device)
            if (sinks is None and q_descale is None and k_descale is None and
                    v_descale is None and params is None and block_mask is None):
                extras = ()
            else:
                # The extras in the roles' order (_dense_opts'), and what of
                # the parameters and the block mask the checks read.
                extras, more = _given_extras(sinks, params, block_mask,
                                             (q_descale, k_descale, v_descale))
                key += more + tuple(calls.meta(t) for t in extras)
            # Any tensor that requires grad: a descale's makes an FP8 call
            # refused (_attention), as its first call was.
            grad = torch.is_grad_enabled() and (
                q.requires_grad or k.requires_grad or v.requires_grad or
                any(t.requires_grad for t in extras))
            # With grad, the training call as the checks left it (a
            # TrainCall, or a ModsCall where the call has expressions).
            e = (calls.tables.train if grad else calls.tables.plain).get(key)
        except (AttributeError, TypeError):  # not tensors: the checks below say so
            key = e = None
        if e is not None:
            if not grad:
                out, lse = calls.forward(e, q, k, v, extras)
            elif isinstance(e, ModsCall):
                out, lse = train_mods(q, k, v, extras, e)
            else:
                out, lse = train_call(q, k, v, sinks, e)
            return (out, lse) if return_lse else out
    return _attention(q, k, v, causal, scale, return_lse, layout, window, softcap, score_mod,
                      mask_mod, params, sinks, block_mask, checked,
                      (q_descale, k_descale, v_descale), key, (out_dtype, o_scale, return_amax))


def _split_grad_error(q, v):
    raise core.Unsupported(capi.ERR_UNSUPPORTED, (
        f"{_WHO}: head_dim_v {v.shape[-1]} with head_dim {q.shape[-1]} has no backward "
        "yet (the forward runs: call it under torch.no_grad())"))


def _needs_pad(q, k, v, ndim=4):
    """Whether attention() (ndim 4) or attention_varlen() (3) pads the head
    dims: 16-bit q, k and v of ndim dimensions whose q/k head dim (the
    same) or v's is not a multiple of 8, none above the library's largest
    (FJ_HEAD_DIM_MAX, FJ_HEAD_DIM_V_MAX: the library's own message
    there)."""
    try:
        d, dv = q.shape[-1], v.shape[-1]
        return ((d % 8 or dv % 8) and 0 < d <= capi.HEAD_DIM_MAX and
                0 < dv <= capi.HEAD_DIM_V_MAX and k.shape[-1] == d and
                all(t.dim() == ndim and t.dtype in (torch.float16, torch.bfloat16)
                    for t in (q, k, v)))
    except AttributeError:  # not tensors: the checks say so
        return False


def _unpad(got, dv):
    """A padded call's result (O, or a tuple O first) with O's first dv
    columns, contiguous as an unpadded call's O."""
    if isinstance(got, tuple):
        return (got[0][..., :dv].contiguous(),) + got[1:]
    return got[..., :dv].contiguous()


def _pad8(t):
    """t with zero columns to the next multiple of 8 of its last dim
    (autograd takes the gradient back through the pad); t itself where it
    has them."""
    n = -t.shape[-1] % 8
    return torch.nn.functional.pad(t, (0, n)) if n else t


def _attention(q, k, v, causal, scale, return_lse, layout, window, softcap, score_mod,
               mask_mod, params, sinks, block_mask, checked, descales, key,
               out=(None, None, False)):
    """attention() of a call not in the table: every check, then the
    route (the table's entry, the op under torch.compile, the training op
    when an input requires grad).  key: the table's key for the call, to
    remember its entry under (None: not a plain call)."""
    c = pr.causal_code(causal)
    lay = pr.choose("layout", layout, pr.LAYOUTS)
    sc = pr.scale_value(scale)
    wl, wr = window_arg(window)
    cap = softcap_arg(softcap)
    check_exprs(score_mod, mask_mod)
    bool_arg("checked", checked)
    bool_arg("return_lse", return_lse)
    b, hq, hk, sq, sk, _ = check_inputs(q, k, v, lay)
    fp8 = _check_descales(q, k, b, hk, descales)
    out_code = _check_out(q, *out, fp8)
    o_scale, amax = out[1], out[2]
    _check_sinks(sinks, q, hq)
    bm = _block_mask_args(block_mask, q, b, hq, sq, sk)
    if checked and torch.compiler.is_compiling():
        raise ValueError(f"{_WHO}: checked=True waits for its kernels and reports on the host: "
                         "call it outside torch.compile")
    # Autograd goes through the training op (its backward: register_autograd),
    # which keeps the log-sum-exp for it.
    grad = torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad
        for t in (q, k, v, sinks) + descales + _param_tensors(params))
    if grad and (fp8 or kv_fp8(q, k, v)):
        _fp8_grad_error(q, k, v, sinks, descales, params)
    if grad and v.shape[-1] != q.shape[-1]:
        _split_grad_error(q, v)
    builtin = not (score_mod or mask_mod or params or block_mask is not None or checked)
    if grad and builtin:
        call = TrainCall((c, sc, lay, wl, wr, cap), sinks)
        if key is not None:
            calls.remember(calls.tables.train, key, call)
        out, lse = train_call(q, k, v, sinks, call)
        return (out, lse) if return_lse else out
    o, extras = _dense_opts(c, sc, lay, wl, wr, cap, score_mod, mask_mod, params, sinks, bm,
                            checked, descales, out_code, o_scale, amax)
    # A repeat finds its entry by the extras as given (_given_extras): they
    # must be these, in this order, or the call is not remembered.
    if key is not None and tuple(map(id, extras)) != tuple(
            map(id, _given_extras(sinks, params, block_mask, descales)[0])):
        key = None
    lse = bool(return_lse)
    if amax:
        # FP8 attention's max |O| (its inputs never require grad: above).
        if torch.compiler.is_compiling():
            res, l, a = op_call(o, True, q, k, v, extras)
        else:
            a = torch.empty((), dtype=torch.float32, device=q.device)
            res, l = calls.forward(calls.entry(o, True, q, k, v, extras), q, k, v, extras, a)
        return (res, l, a) if return_lse else (res, a)
    if grad and block_mask is not None and not block_mask.has_backward:
        raise ValueError(f"{_WHO}: block_mask has no transposed lists (q_num, q_indices), "
                         "which the backward walks: flashjit.block_mask() builds them; "
                         "BlockMask(..., q_num=, q_indices=) and from_flex take them")
    if grad and not checked:
        call = ModsCall(calls.encode(o))
        if key is not None:
            calls.remember(calls.tables.train, key, call)
        out, l = train_mods(q, k, v, extras, call)
        return (out, l) if return_lse else out
    if grad:
        out, l = NoBackward.apply(o, lse, q, k, v, *extras)
    elif torch.compiler.is_compiling():
        out, l = op_call(o, lse, q, k, v, extras)
    else:
        e = calls.entry(o, lse, q, k, v, extras)
        if key is not None:
            calls.remember(calls.tables.plain, key, e)
        out, l = calls.forward(e, q, k, v, extras)
    return (out, l) if return_lse else out


def _dense_opts(causal, scale, layout, wl, wr, softcap, score_mod, mask_mod, params, sinks,
                bm, checked, descales, out_dtype=0, o_scale=None, amax=False):
    """The Opts of a checked attention() call and its extra tensors, in
    their roles' order: sinks, the tensor parameters, the block mask's
    lists (those given of the eight), the descales given, O's scale."""
    spec, param_roles, param_tensors = params_opts(params)
    roles, extras = [], []
    if sinks is not None:
        roles.append("sinks")
        extras.append(sinks)
    roles += param_roles
    extras += param_tensors
    block_q, block_kv = bm[0], bm[1]
    for name, t in zip(bmask._NAMES, bm[2:]):
        if t is not None:
            roles.append(name)
            extras.append(t)
    for name, t in zip(_DESCALES, descales):
        if t is not None:
            roles.append(name)
            extras.append(t)
    if o_scale is not None:
        roles.append("o_scale")
        extras.append(o_scale)
    o = calls.opts("dense", causal=causal, scale=scale, layout=layout, window_left=wl,
                   window_right=wr, softcap=softcap, score_mod=score_mod or "",
                   mask_mod=mask_mod or "", params=spec, roles=tuple(roles), block_q=block_q,
                   block_kv=block_kv, checked=bool(checked), out_dtype=out_dtype,
                   amax=bool(amax))
    return o, tuple(extras)


_NO_BLOCK_MASK = (0, 0) + (None,) * 8


def _param_tensors(params):
    """The tensors among params (a dict, or anything the checks refuse)."""
    if not isinstance(params, dict):
        return ()
    return tuple(t for t in params.values() if isinstance(t, torch.Tensor))


def grad_name(names, tensors, params=None):
    """The name of the first of tensors (then of the tensor parameters)
    that requires grad; None where none does."""
    named = list(zip(names, tensors))
    if isinstance(params, dict):
        named += [(f"params[{n!r}]", t) for n, t in params.items()]
    return next((n for n, t in named if isinstance(t, torch.Tensor) and t.requires_grad),
                None)


def _fp8_grad_error(q, k, v, sinks, descales, params=None):
    """Raises Unsupported naming the first FP8 input (a tensor parameter
    among them) that requires grad."""
    name = grad_name(("q", "k", "v", "sinks") + _DESCALES, (q, k, v, sinks) + descales, params)
    what = "FP8 attention" if q.dtype == _FP8 else f"{q.dtype} q over FP8 k and v"
    raise core.Unsupported(capi.ERR_UNSUPPORTED, (
        f"{_WHO}: {what} runs forward only: {name} requires grad (detach the inputs "
        "or call it under torch.no_grad())"))


def _block_mask_args(block_mask, q, batch, heads_q, seq_q, seq_kv):
    """block_mask as (block_q, block_kv) and the eight lists, after checking
    that it fits the problem."""
    if block_mask is None:
        return _NO_BLOCK_MASK
    if not isinstance(block_mask, BlockMask):
        raise TypeError(f"{_WHO}: block_mask is a {type(block_mask).__name__}, not a "
                        "flashjit.BlockMask (flashjit.block_mask() builds one; "
                        "flashjit.BlockMask.from_flex takes FlexAttention's)")
    block_mask._check_problem(batch, heads_q, seq_q, seq_kv, q.device, _WHO)
    return (block_mask.block_q, block_mask.block_kv) + block_mask._tensors()


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
    every layer, every step; it holds one buffer, which its eight tensors
    view (the lists per query block, and per key block the transposed ones
    the backward walks).  Raises TypeError / ValueError naming the bad value, the
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
                                 calls.stream(dev.index))
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
