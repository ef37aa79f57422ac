"""det_repeat.py -- the deterministic backward's bits over repeated calls
(fj_problem.deterministic through the package's attention_bwd_op), and the
default mode's for contrast: shapes that take the d256 cluster pair (none,
causal top-left, GQA) and one 64-key-tile shape.  Prints, per shape, how
many of N calls differ bitwise from the first, and the first call's dQ
error against float32 autograd of heads 0-1.  From the repository root:
PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so python3 bench/probes/det_repeat.py [N]"""
import sys

import torch
import torch.nn.functional as F

import flashjit  # noqa: F401
from flashjit import _train as tr

N = int(sys.argv[1]) if len(sys.argv) > 1 else 6
SHAPES = [  # B, Hq, Hkv, S, D, causal
    (2, 8, 8, 2048, 256, False),
    (2, 8, 8, 2048, 256, True),
    (1, 8, 2, 3000, 256, True),
    (1, 4, 4, 1500, 224, False),
]
torch.manual_seed(0)
for B, H, Hkv, S, D, causal in SHAPES:
    q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16)
    do = torch.randn_like(q)
    out, lse = flashjit.attention(q, k, v, causal="top_left" if causal else None, return_lse=True)
    c = 1 if causal else 0
    line = f"det_repeat B={B} H={H}/{Hkv} S={S} D={D} causal={causal}:"
    for det in (True, False):
        runs = [tr.attention_bwd_op(do, q, k, v, out, lse, c, 0.0, 0, -1, -1, 0.0, None, det)
                for _ in range(N)]
        first = runs[0]
        if det:
            det_first = first
        differ = sum(any(not torch.equal(a, b) for a, b in zip(first, r)) for r in runs[1:])
        line += f" {'det' if det else 'default'} {differ} of {N - 1} differ;"
    g = H // Hkv
    ql, kl, vl = (t.detach().float().requires_grad_() for t in (q[:, :2], k[:, :max(1, 2 // g)], v[:, :max(1, 2 // g)]))
    ref = F.scaled_dot_product_attention(ql, kl, vl, is_causal=causal, enable_gqa=g > 1)
    ref.backward(do[:, :2].float())
    dq = det_first[0][:, :2].float()
    line += f" rel_dq {((dq - ql.grad).norm() / ql.grad.norm()).item():.2e}"
    print(line, flush=True)
