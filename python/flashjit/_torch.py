"""flashjit.attention and flashjit.block_mask for PyTorch tensors, and
the forward's torch.library ops.

Imported by the package only where torch imports.  Eager calls skip the
dispatcher: attention() looks its call up in this thread's table of
cached calls (_calls.py) by its own arguments -- one dict lookup -- and
launches; a call not seen before is checked (_args.py), planned and
remembered.  torch.compile traces attention() into the op
torch.ops.flashjit.attention (or attention_lse, which also returns the
log-sum-exp): the tensors, the extra tensors (sinks, the expressions'
tensors, a block mask's lists, descales; varlen and paged arrays for the
serving calls) in one list, and every other option in one string
(_calls.encode), since each argument of an op costs dispatcher time on
every call.  The ops are defined with torch.library directly, with a
fake (meta) implementation each, and take no gradient: attention()
sends a call whose inputs require grad to the training calls (_train.py:
flashjit::attention_train with the built-in masks, attention_train_mods
with score_mod, mask_mod, params or a block mask), or runs it forward
with a backward that raises (checked mode: NoBackward).
"""
import ctypes as C
import functools
import operator

import torch

from . import _args as ar
from . import _blockmask as bmask
from . import _calls as calls
from . import _capi as capi
from . import _core as core
from . import _problem as pr
from . import _train as tr
from ._blockmask import BlockMask


# ---- the dense call -------------------------------------------------------------------


def _check_dense(o, q, k, v, x):
    """The tensors of a dense call (attention()'s checks, in its order).
    Returns (batch, heads_q, heads_kv, seq_q, seq_kv, head_dim)."""
    sizes = ar.check_inputs(q, k, v, o.layout)
    b, hq, hk, sq, sk, _ = sizes
    ar._check_descales(q, k, b, hk, tuple(x.get(n) for n in ar._DESCALES))
    ar._check_sinks(x.get("sinks"), q, hq)
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
        e = calls.make_entry(None, q.device, ar._out_dtype(q.dtype, o), lse_shape_, idle=True)
        e.out_dv = v.shape[-1] if v.shape[-1] != d else 0
        return e
    p = ar._problem(q, k, v, o.causal, o.scale, o.layout)
    p.splits = o.num_splits
    slots, ones, keep = [], None, ()
    if q.dtype == ar._FP8:
        slots, ones = ar.descale_slots(p, o, x, b, hk, (("q_descale", "q_scale"),
                                                         ("k_descale", "k_scale"),
                                                         ("v_descale", "v_scale")))
        p.scale_layout = ar.scale_layout(tuple(x.get(n) for n in ar._DESCALES))
        # O's element, its scale (an e4m3 O's) and, per call, its amax.
        p.o_dtype = o.out_dtype
        if "o_scale" in x:
            p.o_scale = C.addressof(pr._PLACEHOLDER)
            slots.append((p, "o_scale", o.roles.index("o_scale")))
    elif ar.kv_fp8(q, k, v):
        # An FP8 KV cache's k and v under a 16-bit q: O in q's dtype.
        p.kv_dtype = capi.E4M3
        slots, ones = ar.descale_slots(p, o, x, b, hk, (("k_descale", "k_scale"),
                                                         ("v_descale", "v_scale")))
        p.scale_layout = ar.scale_layout((None, x.get("k_descale"), x.get("v_descale")))
    mods, mod_slots = ar.mods_of(o, x, q.device)
    p.mods = mods.ptr
    if mods.ptr is not None:
        keep = (mods,)
    return calls.make_entry(p, q.device, ar._out_dtype(q.dtype, o), lse_shape_,
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
    return q.new_empty(ar.out_shape(q, v), dtype=ar._out_dtype(q.dtype, o))


def _op_lse_fake(q, k, v, extra, opts):
    o = calls.decode(opts)
    return (q.new_empty(ar.out_shape(q, v), dtype=ar._out_dtype(q.dtype, o)),
            q.new_empty(ar.lse_shape(o, q), dtype=torch.float32))


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
    "dense": f"{ar._WHO}: the backward does not take checked=True yet"}


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
    and one launch.  A block mask's lists are looked at again only where
    one is another tensor or has changed in place (flashjit.BlockMask: a
    list's .data replaced is not seen).
    """
    if _needs_pad(q, k, v):
        # A head dim that is not a multiple of 8: zero columns to the next
        # one, at the unpadded dim's scale, then O's columns sliced back
        # (contiguous, as the unpadded call's).  The checks that name the
        # dims run on the caller's tensors first.  The dims are static
        # under torch.compile (the scale is a constant of the call).
        d, dv = operator.index(q.shape[-1]), operator.index(v.shape[-1])
        ar.check_inputs(q, k, v, pr.choose("layout", layout, pr.LAYOUTS))
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
                key += more
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
            elif isinstance(e, tr.ModsCall):
                out, lse = tr.train_mods(q, k, v, extras, e)
            else:
                out, lse = tr.train_call(q, k, v, sinks, e)
            return (out, lse) if return_lse else out
    return _attention(q, k, v, causal, scale, return_lse, layout, window, softcap, score_mod,
                      mask_mod, params, sinks, block_mask, checked,
                      (q_descale, k_descale, v_descale), key, (out_dtype, o_scale, return_amax))


def _given_extras(sinks, params, block_mask, descales):
    """The extra tensors of an attention() call as given, in its roles'
    order (_dense_opts': the sinks, the tensor parameters, the block mask's
    lists, the descales), and what the cached call's key holds of them:
    which are given, each tensor's metadata (calls.meta), the parameters'
    names and scalar values (their types and reprs: 1, 1.0, True, 0.0 and
    -0.0 stay apart), the block mask's token (BlockMask._key: its sizes
    and its lists' metadata, found once a mask).  Raises TypeError where
    the checks would refuse the arguments' kinds: the call goes the
    checked way then."""
    meta = calls.meta
    if sinks is None:
        extras, more = [], [None]
    else:
        extras, more = [sinks], [meta(sinks)]
    if params is not None:
        if type(params) is not dict:
            raise TypeError("params")
        for name, value in params.items():
            if isinstance(value, torch.Tensor):
                extras.append(value)
                more.append((name, meta(value)))
            else:
                more.append((name, type(value), repr(value)))
    more.append(len(extras))
    if block_mask is not None:
        if type(block_mask) is not BlockMask:
            raise TypeError("block_mask")
        token, lists = block_mask._key()
        extras += lists
        more.append(token)
    more.append(tuple(t is None for t in descales))
    for t in descales:
        if t is not None:
            extras.append(t)
            more.append(meta(t))
    return tuple(extras), tuple(more)


def _split_grad_error(q, v):
    raise core.Unsupported(capi.ERR_UNSUPPORTED, (
        f"{ar._WHO}: head_dim_v {v.shape[-1]} with head_dim {q.shape[-1]} has no backward "
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
    wl, wr = ar.window_arg(window)
    cap = ar.softcap_arg(softcap)
    ar.check_exprs(score_mod, mask_mod)
    ar.bool_arg("checked", checked)
    ar.bool_arg("return_lse", return_lse)
    b, hq, hk, sq, sk, _ = ar.check_inputs(q, k, v, lay)
    fp8 = ar._check_descales(q, k, b, hk, descales)
    out_code = ar._check_out(q, *out, fp8)
    o_scale, amax = out[1], out[2]
    ar._check_sinks(sinks, q, hq)
    bm = _block_mask_args(block_mask, q, b, hq, sq, sk)
    if checked and torch.compiler.is_compiling():
        raise ValueError(f"{ar._WHO}: checked=True waits for its kernels and reports on the "
                         "host: call it outside torch.compile")
    # Autograd goes through the training op (its backward: register_autograd),
    # which keeps the log-sum-exp for it.
    grad = torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad
        for t in (q, k, v, sinks) + descales + _param_tensors(params))
    if grad and (fp8 or ar.kv_fp8(q, k, v)):
        _fp8_grad_error(q, k, v, sinks, descales, params)
    if grad and v.shape[-1] != q.shape[-1]:
        _split_grad_error(q, v)
    builtin = not (score_mod or mask_mod or params or block_mask is not None or checked)
    if grad and builtin:
        call = tr.TrainCall((c, sc, lay, wl, wr, cap), sinks)
        if key is not None:
            calls.remember(calls.tables.train, key, call)
        out, lse = tr.train_call(q, k, v, sinks, call)
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
        raise ValueError(f"{ar._WHO}: block_mask has no transposed lists (q_num, q_indices), "
                         "which the backward walks: flashjit.block_mask() builds them; "
                         "BlockMask(..., q_num=, q_indices=) and from_flex take them")
    if grad and not checked:
        call = tr.ModsCall(calls.encode(o))
        if key is not None:
            calls.remember(calls.tables.train, key, call)
        out, l = tr.train_mods(q, k, v, extras, call)
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
    spec, param_roles, param_tensors = ar.params_opts(params)
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
    for name, t in zip(ar._DESCALES, descales):
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
    name = grad_name(("q", "k", "v", "sinks") + ar._DESCALES, (q, k, v, sinks) + descales,
                     params)
    what = "FP8 attention" if q.dtype == ar._FP8 else f"{q.dtype} q over FP8 k and v"
    raise core.Unsupported(capi.ERR_UNSUPPORTED, (
        f"{ar._WHO}: {what} runs forward only: {name} requires grad (detach the inputs "
        "or call it under torch.no_grad())"))


def _block_mask_args(block_mask, q, batch, heads_q, seq_q, seq_kv):
    """block_mask as (block_q, block_kv) and the eight lists, after checking
    that it fits the problem."""
    if block_mask is None:
        return _NO_BLOCK_MASK
    if not isinstance(block_mask, BlockMask):
        raise TypeError(f"{ar._WHO}: block_mask is a {type(block_mask).__name__}, not a "
                        "flashjit.BlockMask (flashjit.block_mask() builds one; "
                        "flashjit.BlockMask.from_flex takes FlexAttention's)")
    block_mask._check_problem(batch, heads_q, seq_q, seq_kv, q.device, ar._WHO)
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
        b, hq, sq, d = ar._check_tensor("q", q, lay, _WHO_BM)
        bk, hk, sk, _ = ar._check_tensor("k", k, lay, _WHO_BM)
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
        dev, dtype = q.device, ar._DTYPES[q.dtype] if q.dtype != ar._FP8 else capi.BF16
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
