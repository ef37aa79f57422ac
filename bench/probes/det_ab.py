"""The backward's median time, default and deterministic, of one shape:
    python3 bench/probes/det_ab.py B H S D causal [iters]
(FLASHJIT_TEMPLATE_DIR picks the templates: an A/B runs it twice.)"""
import os
import sys

import torch

import flashjit
from flashjit import _train as tr

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from mods_cases import bench  # noqa: E402

B, H, S, D, causal = (int(x) for x in sys.argv[1:6])
iters = int(sys.argv[6]) if len(sys.argv) > 6 else 20
q, k, v, do = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
out, lse = flashjit.attention(q, k, v, causal="top_left" if causal else None, return_lse=True)
us = [bench(lambda: tr.attention_bwd_op(do, q, k, v, out, lse, causal, 0.0, 0, -1, -1, 0.0,
                                        None, det), iters) for det in (0, 1)]
print(f"det_ab {B},{H},{S},{D} causal={causal}: default {us[0]:.1f} us, deterministic "
      f"{us[1]:.1f} us, ratio {us[1] / us[0]:.3f}")
