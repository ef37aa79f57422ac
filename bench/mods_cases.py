"""The score and mask modifications that bench/mods_compare.py (forward) and
bench/train_mods_compare.py (forward and backward) run beside
FlexAttention: the cases of ../shared/anchors/train_flex_anchors.py, each
written once for both, and the CUDA-event timer both use.

make_cases(B, H, S, device) gives the table: for each case FlexAttention's
score_mod and mask_mod (Python functions over its tensors), and the same
case for flashjit in the Python package's terms (attention()'s keyword
arguments: causal, softcap, window, score_mod, mask_mod, params), plus
whether the case is timed with a block mask (the library builds it:
flashjit.block_mask(); FlexAttention's create_block_mask for Flex).
mods_compare.py turns the same fields into the C API's fj_mods.  Needs
PyTorch, and a GPU only where device is one: make_cases(..., "cpu")
builds the table anywhere.
"""
import statistics
from collections import namedtuple

import torch

# key: a short name for --cases; name: the anchor's.  flex_score,
# flex_mask: FlexAttention's score_mod and mask_mod (None: no mask).
# causal: top-left causal.  softcap, window (left, right), score_mod,
# mask_mod: flashjit's built-ins and expressions (None: not set); params:
# the expressions' tensors by name (float32 or int32, contiguous).
# block_mask: flashjit runs the case with the library's block mask of
# mask_mod (and the causal mask), as FlexAttention runs it with its own.
# score_cost: the case is a score modification on its mask, whose cost
# is measured against the same mask without it.
Case = namedtuple("Case", "key name flex_score flex_mask causal softcap window score_mod "
                          "mask_mod params block_mask score_cost")


def make_cases(B, H, S, device):
    """The seven cases for shape (B, H, S, head dim) on `device`, their
    tensors drawn from torch's generator (seed it first for repeatable
    values): ALiBi's slopes, a relative-position bias table (H, 2S) and 8
    sorted document ids."""
    slopes = torch.exp2(-8.0 * torch.arange(1, H + 1, device=device) / H).float().contiguous()
    bias = (torch.randn(H, 2 * S, device=device, dtype=torch.float32) * 0.1).contiguous()
    doc = torch.sort(torch.randint(0, 8, (S,), device=device)).values
    doc_i32 = doc.int().contiguous()

    def noop(s, b, h, qi, ki): return s
    def softcap(s, b, h, qi, ki): return 30.0 * torch.tanh(s / 30.0)
    def alibi(s, b, h, qi, ki): return s + slopes[h] * (ki - qi)
    def relbias(s, b, h, qi, ki): return s + bias[h, qi - ki + S]
    def causal_m(b, h, qi, ki): return qi >= ki
    def window_m(b, h, qi, ki): return (qi >= ki) & (qi - ki <= 1024)
    def doc_m(b, h, qi, ki): return (doc[qi] == doc[ki]) & (qi >= ki)

    def case(key, name, fs, fm, causal=True, softcap=None, window=None, score_mod=None,
             mask_mod=None, params=None, block_mask=False, score_cost=False):
        return Case(key, name, fs, fm, causal, softcap, window, score_mod, mask_mod, params,
                    block_mask, score_cost)

    return [
        case("full", "full/noop", noop, None, causal=False),
        case("causal", "causal", noop, causal_m),
        case("softcap", "softcap30+causal", softcap, causal_m, softcap=30.0, score_cost=True),
        case("alibi", "alibi+causal", alibi, causal_m,
             score_mod="s + slopes(h) * (float)(kv - q)", params={"slopes": slopes},
             score_cost=True),
        case("relbias", "relbias+causal", relbias, causal_m,
             score_mod=f"s + bias(h, q - kv + {S})", params={"bias": bias}, score_cost=True),
        case("window", "window1024+causal", noop, window_m, window=(1024, 0)),
        case("document", "document8+causal", noop, doc_m, mask_mod="doc(q) == doc(kv)",
             params={"doc": doc_i32}, block_mask=True),
    ]


def modified(c):
    """Whether case c has a modification beyond the causal mask (else it
    is a plain kernel's: no mask, or causal)."""
    return (c.softcap, c.window, c.score_mod, c.mask_mod) != (None,) * 4


def attention_kwargs(c):
    """flashjit.attention()'s keyword arguments for case c, without its
    block mask (the caller builds and adds it)."""
    kw = {"causal": "top_left" if c.causal else None}
    for name in ("softcap", "window", "score_mod", "mask_mod", "params"):
        if getattr(c, name) is not None:
            kw[name] = getattr(c, name)
    return kw


def pick(cases, wanted):
    """The cases that `wanted` names (a comma-separated list of keys or
    names; None or "" for all), in the table's order.  Raises ValueError
    naming what matches none."""
    if not wanted:
        return list(cases)
    names = [w.strip() for w in wanted.split(",") if w.strip()]
    unknown = [w for w in names if not any(w in (c.key, c.name) for c in cases)]
    if unknown:
        raise ValueError(f"unknown case(s) {', '.join(unknown)}; the cases: "
                         f"{', '.join(c.key for c in cases)}")
    return [c for c in cases if c.key in names or c.name in names]


def bench(fn, iters, warm=3):
    """The median of `iters` calls of fn in µs, each timed by CUDA events
    after `warm` untimed calls."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts) * 1e3
