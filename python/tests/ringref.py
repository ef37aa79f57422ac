"""A float64 attention in PyTorch with flashjit's mask rules, for the ring
tests without a GPU: the (fwd, bwd) pair ring_attention's _attention
hook takes, and the full sequence's reference.  Needs torch."""
import math

import torch


def _mask(sq, sk, causal, window, device):
    """flashjit's mask (include/flashjit.h, fj_causal and fj_mods.window):
    the diagonal at offset sk - sq (bottom-right), 0 for top-left."""
    off = 0 if causal == "top_left" else sk - sq
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    keep = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if causal:
        keep &= j <= i + off
    if window:
        left, right = window
        if left >= 0:
            keep &= j >= i + off - left
        if right >= 0:
            keep &= j <= i + off + right
    return keep


def _bhsd(t, layout):
    return t if layout == "bhsd" else t.transpose(1, 2)


def _scores(q, k, causal, window, softcap, scale, layout):
    """(s, keep, qh, kh): the modified scores (float64, bhsd, KV heads
    repeated over their group), the mask, and Q, K as used."""
    qh = _bhsd(q, layout).double()
    kh = _bhsd(k, layout).double()
    group = qh.shape[1] // kh.shape[1]
    kh = kh.repeat_interleave(group, dim=1)
    sc = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    x = sc * qh @ kh.transpose(-1, -2)
    s = softcap * torch.tanh(x / softcap) if softcap else x
    keep = _mask(qh.shape[2], kh.shape[2], causal, window, q.device)
    return s, keep, qh, kh, sc, group


def fwd(q, k, v, *, causal=None, window=None, softcap=None, scale=None, layout="bhsd",
        sinks=None):
    """(out in q's dtype and layout, lse float32 (b, h, sq)); a row that
    sees no key gets 0 and -inf (the sink's logit with sinks: (h,) logits
    in each row's denominator).  Differentiable (torch operations)."""
    s, keep, _, _, _, group = _scores(q, k, causal, window, softcap, scale, layout)
    vh = _bhsd(v, layout).double().repeat_interleave(group, dim=1)
    s = s.masked_fill(~keep, -math.inf)
    if sinks is not None:
        col = sinks.double().view(1, -1, 1, 1).expand(*s.shape[:3], 1)
        lse = torch.logsumexp(torch.cat([s, col], dim=-1), dim=-1)
    else:
        lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    out = p @ vh
    return _bhsd(out, layout).to(q.dtype).contiguous(), lse.float()


def bwd(dout, q, k, v, out, lse, *, causal=None, window=None, softcap=None, scale=None,
        layout="bhsd", dlse=None):
    """The gradients of one part of the keys given the merged out and lse
    (what fj_attention_bwd computes when handed them): P = exp(S - lse),
    Delta = rowsum(dout * out), less dlse (the loss's gradient at lse)
    where given.  (dq, dk, dv) in the inputs' dtypes and
    layout; dk and dv summed over each GQA group."""
    s, keep, qh, kh, sc, group = _scores(q, k, causal, window, softcap, scale, layout)
    vh = _bhsd(v, layout).double().repeat_interleave(group, dim=1)
    do = _bhsd(dout, layout).double()
    o = _bhsd(out, layout).double()
    l = lse.double()[..., None]
    p = torch.where(keep & torch.isfinite(l), torch.exp(s - l), torch.zeros_like(s))
    dv = p.transpose(-1, -2) @ do
    dp = do @ vh.transpose(-1, -2)
    delta = (do * o).sum(-1, keepdim=True)
    if dlse is not None:
        delta = delta - dlse.double()[..., None]
    ds = p * (dp - delta)
    if softcap:
        ds = ds * (1 - (s / softcap) ** 2)
    ds = ds * sc
    dq = ds @ kh
    dk = ds.transpose(-1, -2) @ qh
    b, hq, skv, d = dk.shape
    dk = dk.view(b, hq // group, group, skv, d).sum(2)
    dv = dv.view(b, hq // group, group, skv, d).sum(2)
    return tuple(_bhsd(g, layout).to(t.dtype).contiguous() for g, t in ((dq, q), (dk, k), (dv, v)))


HOOK = (fwd, bwd)


def full_grads(q, k, v, dout, dlse=None, **mask):
    """The full sequence's out, lse and (dq, dk, dv) by the reference."""
    out, lse = fwd(q, k, v, **mask)
    return out, lse, bwd(dout, q, k, v, out, lse, dlse=dlse, **mask)
