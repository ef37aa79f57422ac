"""Serving calls in FlashAttention's conventions: attention_varlen() on
packed sequences and attention_with_kvcache() over a contiguous or paged
KV cache.

Both are fj_attention_fwd problems (include/flashjit.h's fj_problem:
cu_seqlens_q / cu_seqlens_kv / seqused_kv for varlen, block_table /
page_size / num_pages for pages, splits), run through the cached calls
of _calls.py as attention() is: the sequence lengths, the page table and
the descales are device tensors whose addresses each call writes into
its entry's problem, read by the kernels on the device, so a captured
CUDA graph replays correctly after their contents change.  Under
torch.compile they are the ops flashjit::attention and
flashjit::attention_lse, their options' kind "varlen" or "kvcache".
A varlen call whose inputs require grad goes through attention()'s
training op (_train.py), flashjit::attention_train, with its varlen
arguments (its backward flashjit::attention_bwd: the same problem,
BWD_PROBLEMS); attention_with_kvcache() runs forward only.

Imported only where torch imports.
"""
import ctypes as C
import operator

import torch

from . import _args as ar
from . import _calls as calls
from . import _capi as capi
from . import _core as core
from . import _problem as pr
from . import _torch as fjt
from . import _train as tr

_VARLEN = "flashjit.attention_varlen"
_KVCACHE = "flashjit.attention_with_kvcache"
_16BIT = (torch.float16, torch.bfloat16)


# ---- checks ----------------------------------------------------------------------


def _latent(k, v):
    """Whether v is the first columns of k's rows (MLA's latent cache:
    k_cache[..., :head_dim_v], one tensor read once): the same first
    element, shape but the last, and strides, fewer columns, 16-bit."""
    return (isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor) and
            k.dtype in _16BIT and v.dtype == k.dtype and v.dim() == k.dim() and
            v.data_ptr() == k.data_ptr() and v.shape[:-1] == k.shape[:-1] and
            v.stride() == k.stride() and 0 < v.shape[-1] < k.shape[-1])


def _check_qkv(who, q, k, v, q_dims, kv_dims, latent=False):
    """q, k and v: tensors of len(q_dims) and len(kv_dims) dimensions
    (named for the messages), q 16-bit, k and v q's dtype or both FP8,
    one head dim (or, where latent, v a view of k's first columns:
    _latent), contiguous along it, on one CUDA device.  Returns whether
    k and v are FP8."""
    for name, t, dims in (("q", q, q_dims), ("k", k, kv_dims), ("v", v, kv_dims)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{who}: {name} is a {type(t).__name__}, not a torch.Tensor")
        if t.dim() != len(dims):
            raise ValueError(f"{who}: {name} has {t.dim()} dimensions {tuple(t.shape)}; it "
                             f"takes {len(dims)}: ({', '.join(dims)})")
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{who}: {name}'s head dimension is not contiguous (stride "
                             f"{t.stride(-1)}, strides {tuple(t.stride())}); it must be 1")
    if q.dtype not in _16BIT:
        raise TypeError(f"{who}: q has dtype {q.dtype}; it takes torch.float16 or "
                        "torch.bfloat16 queries (FP8 k and v with their descales)")
    fp8 = ar._FP8 is not None and k.dtype == ar._FP8
    if k.dtype != v.dtype or (k.dtype != q.dtype and not fp8):
        raise TypeError(f"{who}: k and v must both be q's dtype {q.dtype} or both "
                        f"torch.float8_e4m3fn; got {k.dtype}, {v.dtype}")
    if k.shape != v.shape and not (latent and _latent(k, v)):
        raise ValueError(f"{who}: k {tuple(k.shape)} and v {tuple(v.shape)} must have one "
                         "shape" + (" (or v be k's first columns, k[..., :head_dim_v]: "
                                    "MLA's latent cache)" if latent else ""))
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{who}: head dims differ: q {q.shape[-1]}, k and v "
                         f"{k.shape[-1]}; flashjit needs one head dim")
    hq, hk = q.shape[-2], k.shape[-2]
    if hk == 0 or hq % hk:
        raise ValueError(f"{who}: q has {hq} heads and k, v {hk}: the query heads must be "
                         "a multiple of the KV heads (GQA)")
    dev = q.device
    if dev.type != "cuda" or k.device != dev or v.device != dev:
        ar._device_error(q, k, v, who)
    return fp8


def _check_index(who, name, t, shape, q):
    """An int32 index tensor of `shape` on q's device, contiguous."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{who}: {name} is a {type(t).__name__}, not a torch.Tensor (int32)")
    if t.dtype != torch.int32:
        raise TypeError(f"{who}: {name} has dtype {t.dtype}; it must be torch.int32")
    if tuple(t.shape) != shape:
        raise ValueError(f"{who}: {name} has shape {tuple(t.shape)}; it must be {shape}")
    if t.device != q.device:
        raise ValueError(f"{who}: {name} is on {t.device}; the attention inputs are on "
                         f"{q.device}")
    if not t.is_contiguous():
        raise ValueError(f"{who}: {name} is not contiguous (strides {tuple(t.stride())}); "
                         "call .contiguous()")


def _check_rank(who, name, t, dims, shape):
    """t a tensor of `dims` dimensions (`shape` names them)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{who}: {name} is a {type(t).__name__}, not a torch.Tensor (int32)")
    if t.dim() != dims:
        raise ValueError(f"{who}: {name} has shape {tuple(t.shape)}; it must be {shape}")


def _check_common(who, q, batch, heads_q, heads_kv, fp8, x):
    """What both calls take alike: sinks and the K/V descales."""
    ar._check_sinks(x.get("sinks"), q, heads_q, who)
    ar.check_descales(q, batch, heads_kv, (None, x.get("k_descale"), x.get("v_descale")),
                      fp8, who)


def _splits(num_splits, who):
    n = pr.int_arg("num_splits", num_splits)
    if not 0 <= n <= capi.SPLITS_MAX:
        raise ValueError(f"{who}: num_splits={n} is not 0 (the library's choice), 1 (no "
                         f"split) or up to {capi.SPLITS_MAX}")
    return n


def _options(who, kind, causal, scale, window, softcap, score_mod, mask_mod, params, sinks,
             descales, num_splits, roles, tensors, **fields):
    """The Opts of a serving call and its extras: roles and tensors given
    (the call's own arrays) first, then sinks, the tensor parameters and
    the descales given."""
    c = ar.causal_code(causal, capi.CAUSAL_BOTTOM_RIGHT)
    sc = pr.scale_value(scale)
    wl, wr = ar.window_arg(window, who)
    cap = ar.softcap_arg(softcap, who)
    ar.check_exprs(score_mod, mask_mod, who)
    splits = _splits(num_splits, who)
    spec, param_roles, param_tensors = ar.params_opts(params, who)
    roles, extras = list(roles), list(tensors)
    if sinks is not None:
        roles.append("sinks")
        extras.append(sinks)
    roles += param_roles
    extras += param_tensors
    for name, t in zip(("k_descale", "v_descale"), descales):
        if t is not None:
            roles.append(name)
            extras.append(t)
    o = calls.opts(kind, causal=c, scale=sc, window_left=wl, window_right=wr, softcap=cap,
                   score_mod=score_mod or "", mask_mod=mask_mod or "", params=spec,
                   roles=tuple(roles), num_splits=splits, **fields)
    return o, tuple(extras)


def _run(who, o, lse, q, k, v, extras, key):
    """The forward-only route of a checked serving call: the op under
    torch.compile, else the cached call (its entry remembered under the
    arguments' key, where the call had one)."""
    if torch.compiler.is_compiling():
        return fjt.op_call(o, lse, q, k, v, extras)
    e = calls.entry(o, lse, q, k, v, extras)
    if key is not None:
        calls.remember(calls.tables.plain, key, e)
    return calls.forward(e, q, k, v, extras)


def _fast(text, q, k, v, optional):
    """The cached call of a serving call's arguments: (key, entry,
    extras), entry None on a miss, key None where the arguments make none
    (not tensors).  text: the options as given; optional: the call's
    other tensors, None where not given, in their roles' order."""
    try:
        key = (text, q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype,
               k.device, v.shape, v.stride(), v.dtype, v.device)
        given = []
        for t in optional:
            if t is None:
                key += (None,)
            else:
                given.append(t)
                key += (t.shape, t.stride(), t.dtype, t.device)
        return key, calls.tables.plain.get(key), given
    except (AttributeError, TypeError):
        return None, None, None


def _needs_grad(names, tensors, params=None):
    """The name of the first tensor that requires grad, among tensors and
    the tensor parameters (None: none, or grad mode is off)."""
    return fjt.grad_name(names, tensors, params) if torch.is_grad_enabled() else None


# ---- attention_varlen -------------------------------------------------------------


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                     seqused_k=None, causal=None, scale=None, return_lse=False, window=None,
                     softcap=None, score_mod=None, mask_mod=None, params=None, sinks=None,
                     k_descale=None, v_descale=None, num_splits=0):
    """Attention over packed sequences of different lengths, as
    FlashAttention's flash_attn_varlen_func takes them.

    q: (total_q, heads_q, head_dim), the queries of every sequence one
    after another; k and v: (total_k, heads_kv, head_dim) likewise.
    cu_seqlens_q, cu_seqlens_k: int32 (batch + 1,) prefix sums on the
    device: sequence b's queries are rows cu_seqlens_q[b] ..
    cu_seqlens_q[b + 1] - 1 of q (a length may be 0).  max_seqlen_q,
    max_seqlen_k: ints at least the longest sequence (they size the grid;
    a longer sequence is cut there).  seqused_k: int32 (batch,): sequence
    b sees only its first seqused_k[b] keys (FlashAttention 3's).  The
    lengths are read by the kernels on the device: a call captured in a
    CUDA graph replays with the lengths the arrays hold then, within
    max_seqlen_q and max_seqlen_k.

    Returns out (total_q, heads_q, head_dim) in q's dtype (rows past
    cu_seqlens_q[-1] are not written), and with return_lse=True also the
    log-sum-exp, float32 (heads_q, total_q) as FlashAttention returns it
    (with grad: differentiable like out).

    causal: None, True or "bottom_right" (FlashAttention's alignment: each
    sequence's last query sees its last key), or "top_left" (PyTorch's).
    True here is FlashAttention's bottom-right, where attention()'s is
    PyTorch's top-left: a sequence whose queries and keys have one length
    sees the same mask either way.  scale, window, softcap, score_mod,
    mask_mod, params (q and kv in the expressions count from each
    sequence's start) and sinks as attention() takes them; num_splits as
    fj_problem.splits (0: the library's choice, 1: none, 2..256).  FP8 k
    and v (torch.float8_e4m3fn) with 16-bit q: k_descale, v_descale
    float32 (batch, heads_kv) tensors, or one each (attention()'s rule),
    None for ones (the mma family, sm_80 and newer).

    Differentiable in q, k, v and sinks as attention() is (loss.backward()
    runs fj_attention_bwd on the packed sequences; O and the library's
    log-sum-exp saved, not P; torch.use_deterministic_algorithms(True)
    selects the deterministic mode): with causal (both alignments),
    window, softcap, sinks, scale, GQA, seqused_k, and score_mod, mask_mod
    and params (a float tensor param that requires grad gets its
    gradient, as attention()'s); the returned lse too.  FP8 k and v run
    forward only (inputs that require grad are refused).  Gradients of rows no sequence reads
    (past cu_seqlens[-1], or past max_seqlen) are 0.

    A call repeats without its checks or planning when its signature
    does: the tensors' shapes, strides, dtypes and devices and the
    options (max_seqlen_q and max_seqlen_k among them: each pair of
    values is planned once).  torch.compile traces it as
    torch.ops.flashjit.attention (kind "varlen"), or with grad as
    torch.ops.flashjit.attention_train (its backward attention_bwd).

    A head dim that is not a multiple of 8 (up to 576; q and k's, and v's
    the same) is padded as attention() pads it: q, k and v copied with
    zero columns to the next multiple of 8, the scale 1/sqrt of q's own,
    O's columns sliced back.
    """
    if fjt._needs_pad(q, k, v, 3) and q.shape[-1] == v.shape[-1]:
        d = operator.index(q.shape[-1])
        got = attention_varlen(fjt._pad8(q), fjt._pad8(k), fjt._pad8(v), cu_seqlens_q,
                               cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k=seqused_k,
                               causal=causal, scale=d ** -0.5 if scale is None else scale,
                               return_lse=return_lse, window=window, softcap=softcap,
                               score_mod=score_mod, mask_mod=mask_mod, params=params,
                               sinks=sinks, k_descale=k_descale, v_descale=v_descale,
                               num_splits=num_splits)
        return fjt._unpad(got, d)
    if params is None and not torch.compiler.is_compiling():
        key, e, extras = _fast(
            f"varlen,{causal!r},{scale!r},{return_lse!r},{window!r},{softcap!r},"
            f"{score_mod!r},{mask_mod!r},{max_seqlen_q!r},{max_seqlen_k!r},{num_splits!r}",
            q, k, v, (cu_seqlens_q, cu_seqlens_k, seqused_k, sinks, k_descale, v_descale))
        if e is not None and not (torch.is_grad_enabled() and (
                q.requires_grad or k.requires_grad or v.requires_grad or
                any(t.requires_grad for t in extras))):
            out, lse = calls.forward(e, q, k, v, extras)
            return (out, lse) if return_lse else out
    else:
        key = None
    ar.bool_arg("return_lse", return_lse, _VARLEN)
    o, extras = _options(_VARLEN, "varlen", causal, scale, window, softcap, score_mod,
                         mask_mod, params, sinks, (k_descale, v_descale), num_splits,
                         ("cu_seqlens_q", "cu_seqlens_k") + (
                             () if seqused_k is None else ("seqused_k",)),
                         (cu_seqlens_q, cu_seqlens_k) + (
                             () if seqused_k is None else (seqused_k,)),
                         layout=capi.THD,
                         max_seqlen_q=pr.int_arg("max_seqlen_q", max_seqlen_q, lo=1),
                         max_seqlen_k=pr.int_arg("max_seqlen_k", max_seqlen_k, lo=1))
    x = dict(zip(o.roles, extras))
    _, fp8 = _check_varlen(o, q, k, v, x)
    grad = _needs_grad(("q", "k", "v", "sinks", "k_descale", "v_descale"),
                       (q, k, v, sinks, k_descale, v_descale), params)
    if grad is not None:
        out, lse = _varlen_grad(o, x, grad, fp8, bool(return_lse), q, k, v, extras)
    else:
        out, lse = _run(_VARLEN, o, bool(return_lse), q, k, v, extras, key)
    return (out, lse) if return_lse else out


def _varlen_grad(o, x, grad, fp8, lse, q, k, v, extras):
    """A checked varlen call with an input (named grad) that requires
    grad: through the training op (with expressions, the expressions'
    one), whose log-sum-exp (the library's) the call returns packed.
    (out, lse or None)"""
    if fp8:
        raise core.Unsupported(capi.ERR_UNSUPPORTED, (
            f"{_VARLEN}: FP8 k and v run forward only: {grad} requires grad (detach the "
            "inputs or call it under torch.no_grad())"))
    cu_q = x["cu_seqlens_q"]
    if o.score_mod or o.mask_mod or o.params:
        out, lib_lse = tr.train_mods(q, k, v, extras, calls.encode(o))
        return out, packed_lse(lib_lse, cu_q, q.shape[0]) if lse else None
    out, lib_lse = tr.train(
        q, k, v, x.get("sinks"), o.causal, o.scale, capi.THD, o.window_left, o.window_right,
        o.softcap, cu_q, x["cu_seqlens_k"], x.get("seqused_k"), o.max_seqlen_q,
        o.max_seqlen_k, o.num_splits)
    return out, packed_lse(lib_lse, cu_q, q.shape[0]) if lse else None


def _check_varlen(o, q, k, v, x):
    """The tensors of a varlen call.  Returns (batch, fp8)."""
    fp8 = _check_qkv(_VARLEN, q, k, v, ("total_q", "heads_q", "head_dim"),
                     ("total_k", "heads_kv", "head_dim"))
    cu_q = x["cu_seqlens_q"]
    _check_rank(_VARLEN, "cu_seqlens_q", cu_q, 1, "(batch + 1,)")
    if cu_q.shape[0] < 2:
        raise ValueError(f"{_VARLEN}: cu_seqlens_q has shape {tuple(cu_q.shape)}; it must be "
                         "(batch + 1,), batch 1 or more")
    batch = cu_q.shape[0] - 1
    _check_index(_VARLEN, "cu_seqlens_q", cu_q, (batch + 1,), q)
    _check_index(_VARLEN, "cu_seqlens_k", x["cu_seqlens_k"], (batch + 1,), q)
    if "seqused_k" in x:
        _check_index(_VARLEN, "seqused_k", x["seqused_k"], (batch,), q)
    _check_common(_VARLEN, q, batch, q.shape[1], k.shape[1], fp8, x)
    return batch, fp8


def _build_varlen(o, lse, q, k, v, extras):
    """calls.BUILDERS["varlen"]: the log-sum-exp FlashAttention's
    (heads_q, total_q) where lse is True, the library's for RAW_LSE."""
    x = dict(zip(o.roles, extras))
    batch, fp8 = _check_varlen(o, q, k, v, x)
    total_q, hq, d = q.shape
    lib_lse = (batch, hq, o.max_seqlen_q) if lse else None
    packed = lse is True
    # No rows: nothing to launch (a head dim of 0 with rows: the library refuses it).
    if total_q == 0 or hq == 0:
        return calls.make_entry(None, q.device, q.dtype, (hq, total_q) if packed else lib_lse,
                                idle=True)
    p, slots = _varlen_problem(o, q, k, v, batch, fp8)
    return _entry(p, o, x, q, batch, k.shape[1], fp8, lib_lse, slots,
                  _packed_lse(o.roles.index("cu_seqlens_q"), total_q) if packed else None)


def _varlen_problem(o, q, k, v, batch, fp8):
    """The fj_problem of a checked varlen call and the slots of its
    arrays (placeholders until a call writes its own)."""
    (total_q, hq, d), (total_k, hk, _) = q.shape, k.shape
    p = capi.Problem()
    core.lib().fj_problem_init(C.byref(p), batch, hq, hk, o.max_seqlen_q, o.max_seqlen_k, d,
                               ar._DTYPES[q.dtype], capi.THD)
    _fill_common(p, o, fp8)
    # Packed rows: batch strides 0, then the head's and the row's.
    p.q_stride[:] = (0, q.stride(1), q.stride(0))
    p.k_stride[:] = (0, k.stride(1), k.stride(0))
    p.v_stride[:] = (0, v.stride(1), v.stride(0))
    p.total_q, p.total_kv = total_q, total_k
    slots = _pointer_slots(p, o, (("cu_seqlens_q", "cu_seqlens_q"),
                                  ("cu_seqlens_k", "cu_seqlens_kv"),
                                  ("seqused_k", "seqused_kv")))
    return p, slots


def _varlen_bwd_problem(o, q, k, v, x, deterministic):
    """calls.BWD_PROBLEMS["varlen"]: the forward's problem with the
    deterministic switch (the library refuses FP8 with its message)."""
    batch, fp8 = _check_varlen(o, q, k, v, x)
    p, slots = _varlen_problem(o, q, k, v, batch, fp8)
    p.deterministic = 1 if deterministic else 0
    return p, slots


def packed_lse(lse, cu_seqlens_q, total_q):
    """The varlen log-sum-exp as FlashAttention returns it, (heads_q,
    total_q), from the library's (batch, heads_q, max_seqlen_q): token t
    of sequence b (cu_seqlens_q[b] <= t < cu_seqlens_q[b + 1]) is
    position t - cu_seqlens_q[b] of b; a token no sequence holds (past
    cu_seqlens_q[-1], or past max_seqlen_q) gets -inf, and no gradient.
    Found on the device (no wait for the lengths), so that a graph replays
    it; torch operations, so that autograd and torch.compile follow it."""
    t = torch.arange(total_q, dtype=torch.int32, device=lse.device)
    b = torch.searchsorted(cu_seqlens_q[1:], t, right=True).clamp_(max=lse.shape[0] - 1)
    pos = t - cu_seqlens_q[b]
    held = (pos < lse.shape[2]) & (t < cu_seqlens_q[-1])
    rows = lse[b, :, pos.clamp_(0, lse.shape[2] - 1)].t()
    return rows.masked_fill(~held, float("-inf")).contiguous()


def _packed_lse(cu_index, total_q):
    """packed_lse as an Entry's post (the call's cu_seqlens_q its extra
    cu_index)."""
    return lambda lse, extras: packed_lse(lse, extras[cu_index], total_q)


# ---- attention_with_kvcache ------------------------------------------------------


def attention_with_kvcache(q, k_cache, v_cache, *, cache_seqlens=None, block_table=None,
                           causal=None, scale=None, return_lse=False, window=None,
                           softcap=None, score_mod=None, mask_mod=None, params=None,
                           sinks=None, k_descale=None, v_descale=None, num_splits=0):
    """Attention of new queries over a KV cache, contiguous or paged, as
    FlashAttention's flash_attn_with_kvcache takes them (the cache is
    read, never written: put the new keys and values into it first).

    q: (batch, seqlen_q, heads_q, head_dim).  A contiguous cache:
    k_cache, v_cache (batch_cache, seqlen_cache, heads_kv, head_dim),
    batch_cache >= batch (the first batch rows are read).  A paged cache
    (block_table given): k_cache, v_cache (num_pages, page_size, heads_kv,
    head_dim), any power-of-two page_size from 1 to 4096, and block_table
    int32 (batch, max_pages), contiguous: key j of sequence b is token
    j % page_size of page block_table[b, j // page_size] (pages may be
    shared between sequences).  cache_seqlens: int32 (batch,) on the
    device, the keys each sequence has (the new ones included); an int
    (every sequence that many: each value planned once); None, the whole
    cache (seqlen_cache, or max_pages x page_size).  The lengths and the
    table are read by the kernels on the device: a call captured in a CUDA
    graph replays with the lengths and pages they hold then.

    Returns out (batch, seqlen_q, heads_q, head_dim) in q's dtype, and
    with return_lse=True the log-sum-exp, float32 (batch, heads_q,
    seqlen_q).

    causal: None, True or "bottom_right" (FlashAttention's alignment: the
    last query sees the sequence's last key), or "top_left".  True here is
    FlashAttention's bottom-right, not attention()'s top-left.  scale,
    window, softcap, score_mod, mask_mod, params and sinks as attention()
    takes them; num_splits as fj_problem.splits (0: the library's choice,
    which splits long caches for decode; 1: none; 2..256).  FP8 caches
    (torch.float8_e4m3fn) with 16-bit q: k_descale, v_descale float32
    (batch, heads_kv) tensors, or one each (vLLM's per-tensor k_scale and
    v_scale; attention()'s rule), None for ones (the mma family, sm_80 and
    newer, contiguous and paged).  MLA's latent cache (DeepSeek's decode:
    head_dim 576 whose first 512 columns are V): pass v_cache as
    k_cache[..., :head_dim_v], a view of the same tensor (same first
    element and strides), and the cache is read once (the mma family;
    out has head_dim_v columns; 16-bit).  Forward only: inputs that
    require grad are refused.

    A call repeats without its checks or planning when its signature
    does (the tensors' shapes, strides, dtypes and devices, and the
    options).  torch.compile traces it as torch.ops.flashjit.attention
    (kind "kvcache").
    """
    seqlen_k = cache_seqlens if isinstance(cache_seqlens, int) else None
    lens = None if seqlen_k is not None else cache_seqlens
    if params is None and not torch.compiler.is_compiling():
        key, e, extras = _fast(
            f"kvcache,{seqlen_k!r},{causal!r},{scale!r},{return_lse!r},{window!r},"
            f"{softcap!r},{score_mod!r},{mask_mod!r},{num_splits!r}",
            q, k_cache, v_cache, (lens, block_table, sinks, k_descale, v_descale))
        if e is not None and not (torch.is_grad_enabled() and (
                q.requires_grad or k_cache.requires_grad or v_cache.requires_grad or
                any(t.requires_grad for t in extras))):
            out, lse = calls.forward(e, q, k_cache, v_cache, extras)
            return (out, lse) if return_lse else out
    else:
        key = None
    ar.bool_arg("return_lse", return_lse, _KVCACHE)
    if seqlen_k is not None and (isinstance(cache_seqlens, bool) or seqlen_k < 1):
        raise ValueError(f"{_KVCACHE}: cache_seqlens={cache_seqlens!r}: an int is the keys "
                         "of every sequence, 1 or more (a tensor's lengths may be 0)")
    roles, arrays = [], []
    for name, t in (("cache_seqlens", lens), ("block_table", block_table)):
        if t is not None:
            roles.append(name)
            arrays.append(t)
    o, extras = _options(_KVCACHE, "kvcache", causal, scale, window, softcap, score_mod,
                         mask_mod, params, sinks, (k_descale, v_descale), num_splits, roles,
                         arrays, layout=capi.BSHD,
                         seqlen_k=-1 if seqlen_k is None else pr.int_arg("cache_seqlens",
                                                                         seqlen_k))
    _check_kvcache(o, q, k_cache, v_cache, dict(zip(o.roles, extras)))
    grad = _needs_grad(("q", "k_cache", "v_cache", "sinks", "k_descale", "v_descale"),
                       (q, k_cache, v_cache, sinks, k_descale, v_descale), params)
    if grad is not None:
        raise core.Unsupported(capi.ERR_UNSUPPORTED, (
            f"{_KVCACHE} runs forward only: {grad} requires grad (detach the inputs or call "
            "it under torch.no_grad()); attention() and attention_varlen() have the "
            "backward"))
    out, lse = _run(_KVCACHE, o, bool(return_lse), q, k_cache, v_cache, extras, key)
    return (out, lse) if return_lse else out


def _check_kvcache(o, q, k, v, x):
    """The tensors of a kvcache call.  Returns (fp8, the keys a sequence
    may have: the cache's, or the int cache_seqlens)."""
    paged = "block_table" in x
    fp8 = _check_qkv(_KVCACHE, q, k, v, ("batch", "seqlen_q", "heads_q", "head_dim"),
                     ("num_pages", "page_size", "heads_kv", "head_dim") if paged else
                     ("batch_cache", "seqlen_cache", "heads_kv", "head_dim"), latent=True)
    batch = q.shape[0]
    if paged:
        table = x["block_table"]
        _check_rank(_KVCACHE, "block_table", table, 2, "(batch, max_pages)")
        if table.shape[0] != batch:
            raise ValueError(f"{_KVCACHE}: block_table has shape {tuple(table.shape)}; it "
                             f"must be (batch, max_pages), batch {batch}")
        _check_index(_KVCACHE, "block_table", table, (batch, table.shape[1]), q)
        capacity = table.shape[1] * k.shape[1]
    else:
        if k.shape[0] < batch:
            raise ValueError(f"{_KVCACHE}: k_cache has batch {k.shape[0]}; q's batch "
                             f"{batch} reads its first {batch} rows")
        capacity = k.shape[1]
    if "cache_seqlens" in x:
        _check_index(_KVCACHE, "cache_seqlens", x["cache_seqlens"], (batch,), q)
    keys = capacity if o.seqlen_k < 0 else o.seqlen_k
    if keys > capacity:
        raise ValueError(f"{_KVCACHE}: cache_seqlens={keys} is more than the cache holds "
                         f"({capacity} keys a sequence)")
    _check_common(_KVCACHE, q, batch, q.shape[2], k.shape[2], fp8, x)
    return fp8, keys


def _build_kvcache(o, lse, q, k, v, extras):
    """calls.BUILDERS["kvcache"]."""
    x = dict(zip(o.roles, extras))
    fp8, keys = _check_kvcache(o, q, k, v, x)
    b, sq, hq, d = q.shape
    hk = k.shape[2]
    lse_shape = (b, hq, sq) if lse else None
    if b * sq * hq == 0:  # no rows (a head dim of 0 with rows: the library refuses it)
        return calls.make_entry(None, q.device, q.dtype, lse_shape, idle=True)
    p = capi.Problem()
    core.lib().fj_problem_init(C.byref(p), b, hq, hk, sq, keys, d, ar._DTYPES[q.dtype],
                               capi.BSHD)
    _fill_common(p, o, fp8)
    p.q_stride[:] = (q.stride(0), q.stride(2), q.stride(1))
    # A page, a head, a token within the page -- or a sequence, a head, a key.
    p.k_stride[:] = (k.stride(0), k.stride(2), k.stride(1))
    p.v_stride[:] = (v.stride(0), v.stride(2), v.stride(1))
    if v.shape[-1] != d:
        # MLA's latent cache: V is k's first columns, O has as many.
        dv = v.shape[-1]
        p.head_dim_v = dv
        p.o_stride[:] = (sq * hq * dv, dv, hq * dv)
    if "block_table" in x:
        p.page_size, p.num_pages = k.shape[1], k.shape[0]
        p.max_pages = x["block_table"].shape[1]
    slots = _pointer_slots(p, o, (("cache_seqlens", "seqused_kv"),
                                  ("block_table", "block_table")))
    return _entry(p, o, x, q, b, hk, fp8, lse_shape, slots, None)


# ---- what both build alike ---------------------------------------------------------


def _fill_common(p, o, fp8):
    p.causal, p.scale, p.splits = o.causal, o.scale, o.num_splits
    if fp8:
        p.kv_dtype = capi.E4M3


def _pointer_slots(p, o, fields):
    """The problem's array pointers (fields: (role, struct field)) for
    the roles the call has: a placeholder for planning, then each call's."""
    ph = C.addressof(pr._PLACEHOLDER)
    slots = []
    for role, field in fields:
        if role in o.roles:
            setattr(p, field, ph)
            slots.append((p, field, o.roles.index(role)))
    return slots


def _entry(p, o, x, q, batch, heads_kv, fp8, lse_shape, slots, post):
    ones = None
    if fp8:
        more, ones = ar.descale_slots(p, o, x, batch, heads_kv, (("k_descale", "k_scale"),
                                                                 ("v_descale", "v_scale")))
        p.scale_layout = ar.scale_layout((None, x.get("k_descale"), x.get("v_descale")))
        slots = slots + more
    mods, mod_slots = ar.mods_of(o, x, q.device)
    p.mods = mods.ptr
    return calls.make_entry(p, q.device, q.dtype, lse_shape, slots + mod_slots, (mods,),
                            ones, post)


calls.BUILDERS["varlen"] = _build_varlen
calls.BUILDERS["kvcache"] = _build_kvcache
calls.BWD_PROBLEMS["varlen"] = _varlen_bwd_problem
