"""A small GPT-style model whose attention is swapped for flashjit's.

The model is written the usual way, with PyTorch's scaled_dot_product_attention
(causal, grouped-query heads).  swap_attention() replaces each block's
attention module by one that calls flashjit.attention on the same weights,
reading q, k and v as strided views of the fused qkv projection (layout
"bshd": no transposes, no copies).  The script runs both in bfloat16 on the
same random weights and tokens, and compares their logits with a float32
reference (the same model in float32, attention written out in matrix
products): flashjit's error should be no larger than SDPA's.

    python3 examples/gpt_flashjit.py [--layers 4] [--seq 512] [--compile]

Needs PyTorch and a CUDA GPU; the package (pip install ./python, or
PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so from a build with
-DFLASHJIT_SHARED=ON).  Exits 0 when flashjit's logits are as close to the
reference as SDPA's, 1 when not, 2 when it cannot run here.
"""
import argparse
import math
import os
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    print("gpt_flashjit.py needs PyTorch (pip install torch)", file=sys.stderr)
    sys.exit(2)
if not torch.cuda.is_available():
    print("gpt_flashjit.py needs a CUDA GPU: torch.cuda.is_available() is False",
          file=sys.stderr)
    sys.exit(2)
try:
    import flashjit
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                    "python"))
    import flashjit


class Config:
    def __init__(self, a):
        self.vocab, self.dim, self.layers = a.vocab, a.dim, a.layers
        self.heads, self.kv_heads, self.seq = a.heads, a.kv_heads, a.seq
        self.head_dim = a.dim // a.heads


class CausalSelfAttention(nn.Module):
    """Grouped-query causal attention through PyTorch's SDPA."""

    def __init__(self, c):
        super().__init__()
        self.h, self.hkv, self.d = c.heads, c.kv_heads, c.head_dim
        self.qkv = nn.Linear(c.dim, (c.heads + 2 * c.kv_heads) * c.head_dim, bias=False)
        self.proj = nn.Linear(c.heads * c.head_dim, c.dim, bias=False)

    def split(self, x):
        """q, k, v as (batch, seq, heads, head_dim) views of one projection."""
        b, s, _ = x.shape
        qkv = self.qkv(x).view(b, s, self.h + 2 * self.hkv, self.d)
        return qkv.split([self.h, self.hkv, self.hkv], dim=2)

    def attend(self, q, k, v):
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True,
                                           enable_gqa=self.h != self.hkv)
        return o.transpose(1, 2)

    def forward(self, x):
        b, s, _ = x.shape
        o = self.attend(*self.split(x))
        return self.proj(o.reshape(b, s, self.h * self.d))


class FlashjitAttention(CausalSelfAttention):
    """The same module, attention by flashjit on the strided views."""

    def attend(self, q, k, v):
        return flashjit.attention(q, k, v, causal="top_left", layout="bshd")


class ReferenceAttention(CausalSelfAttention):
    """The same module, attention written out in float32 (under autocast
    too: its matmuls would run in bfloat16 there)."""

    def attend(self, q, k, v):
        with torch.autocast(q.device.type, enabled=False):
            return self.attend_f32(q, k, v)

    def attend_f32(self, q, k, v):
        q, k, v = (t.float().transpose(1, 2) for t in (q, k, v))
        g = self.h // self.hkv
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        s = q @ k.transpose(-1, -2) / math.sqrt(self.d)
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1),
                          float("-inf"))
        return (s.softmax(-1) @ v).transpose(1, 2)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(c.dim), nn.LayerNorm(c.dim)
        self.attn = CausalSelfAttention(c)
        self.mlp = nn.Sequential(nn.Linear(c.dim, 4 * c.dim), nn.GELU(),
                                 nn.Linear(4 * c.dim, c.dim))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.tok = nn.Embedding(c.vocab, c.dim)
        self.pos = nn.Embedding(c.seq, c.dim)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.ln = nn.LayerNorm(c.dim)
        self.head = nn.Linear(c.dim, c.vocab, bias=False)

    def forward(self, tokens):
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def swap_attention(model, cls):
    """Replaces every block's attention module by a cls on the same weights."""
    for block in model.blocks:
        old = block.attn
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.h, new.hkv, new.d = old.h, old.hkv, old.d
        new.qkv, new.proj = old.qkv, old.proj
        block.attn = new
    return model


def copy_as(model, cls, dtype, c):
    m = GPT(c).to(device="cuda")
    m.load_state_dict(model.state_dict())
    return swap_attention(m, cls).to(dtype).eval()


def timed(fn, tokens, iters=10):
    fn(tokens)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        fn(tokens)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--compile", action="store_true", help="also torch.compile flashjit's")
    a = ap.parse_args()
    c = Config(a)
    torch.manual_seed(0)
    base = GPT(c).cuda()
    for p in base.parameters():
        if p.dim() > 1:
            nn.init.normal_(p, std=0.02)
    tokens = torch.randint(0, c.vocab, (a.batch, c.seq), device="cuda")

    runs = {"sdpa": copy_as(base, CausalSelfAttention, torch.bfloat16, c),
            "flashjit": copy_as(base, FlashjitAttention, torch.bfloat16, c)}
    if a.compile:
        runs["sdpa+compile"] = torch.compile(copy_as(base, CausalSelfAttention,
                                                     torch.bfloat16, c))
        runs["flashjit+compile"] = torch.compile(copy_as(base, FlashjitAttention,
                                                         torch.bfloat16, c))
    reference = copy_as(base, ReferenceAttention, torch.float32, c)
    with torch.no_grad():
        want = reference(tokens)
        scale = want.abs().max().item()
        print(f"model: {c.layers} layers, dim {c.dim}, heads {c.heads}/{c.kv_heads}, "
              f"seq {c.seq}, batch {a.batch}; bfloat16 against float32 "
              f"(logits up to {scale:.3g})")
        errors = {}
        for name, model in runs.items():
            got = model(tokens).float()
            err = (got - want).abs()
            top1 = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
            ms = timed(model, tokens)
            errors[name] = err.max().item()
            print(f"{name:18s} max |err| {err.max().item():.4g}  mean {err.mean().item():.4g}"
                  f"  top-1 agreement {top1:.4f}  {ms:.2f} ms/forward")
    ok = all(errors[n] <= 1.5 * errors["sdpa"] + 1e-3 for n in errors if "flashjit" in n)
    print("PASS: flashjit's logits are as close to float32 as SDPA's" if ok else
          "FAIL: flashjit's logits are further from float32 than SDPA's")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
