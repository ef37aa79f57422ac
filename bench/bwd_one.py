"""One backward call of flashjit's op, for a profiler (ncu, nsys):
    python3 bench/bwd_one.py B H S D [causal] [reps] [deterministic]
q, k, v, dO normal bf16; the forward once, then `reps` backward calls
(fj_problem.deterministic where the seventh argument is 1)."""
import sys

import torch

import flashjit
from flashjit import _train as tr

B, H, S, D = (int(x) for x in sys.argv[1:5])
causal = len(sys.argv) > 5 and sys.argv[5] == "1"
reps = int(sys.argv[6]) if len(sys.argv) > 6 else 1
det = int(sys.argv[7]) if len(sys.argv) > 7 else 0
q, k, v, do = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
out, lse = flashjit.attention(q, k, v, causal="top_left" if causal else None, return_lse=True)
for _ in range(reps):
    tr.attention_bwd_op(do, q, k, v, out, lse, 1 if causal else 0, 0.0, 0, -1, -1, 0.0, None, det)
torch.cuda.synchronize()
