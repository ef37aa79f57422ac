"""varlen_py.py -- issue 34's varlen bar through the Python package:
flashjit.attention_varlen on packed sequences against flashjit.attention
on the equal-FLOP dense batch, in one process (bench/varlen_compare.py
measures the same through the C API).

  16 sequences of bench/varlen_compare.py's LENGTHS (256-3072, 16384
  tokens), 16 heads, head dim 128, bf16, bottom-right causal; the dense
  batch: 16 sequences of sqrt(mean L^2) tokens rounded to 64 (the same
  causal FLOPs up to the rounding, whose ratio is printed and divided out).

Prints the median of --iters CUDA-event timings of each call (after
warm-up), the FLOP ratio, varlen time / dense time per FLOP (the bar:
<= 1.05), and the varlen output's largest relative error against a dense
flashjit.attention call per sequence (first head).

    PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so python3 bench/varlen_py.py [--iters N]
"""
import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import flashjit  # noqa: E402
from sdpa_compare import bench  # noqa: E402
from varlen_compare import LENGTHS  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("varlen_py: needs a CUDA GPU")
    dev, dt, H, D = torch.device("cuda"), torch.bfloat16, 16, 128
    n, total, mx = len(LENGTHS), sum(LENGTHS), max(LENGTHS)
    cu = torch.tensor([0] + torch.tensor(LENGTHS).cumsum(0).tolist(), device=dev,
                      dtype=torch.int32)
    q, k, v = (torch.randn(total, H, D, device=dev, dtype=dt) for _ in range(3))

    def varlen():
        return flashjit.attention_varlen(q, k, v, cu, cu, mx, mx, causal="bottom_right")

    leq = int(round(math.sqrt(sum(L * L for L in LENGTHS) / n) / 64)) * 64
    qd, kd, vd = (torch.randn(n, leq, H, D, device=dev, dtype=dt) for _ in range(3))

    def dense():
        return flashjit.attention(qd, kd, vd, causal="bottom_right", layout="bshd")

    o = varlen()
    err, c0 = 0.0, 0
    for L in LENGTHS:
        one = [t[c0:c0 + L, :1].unsqueeze(0) for t in (q, k, v)]
        ref = flashjit.attention(*one, causal="bottom_right", layout="bshd")[0].float()
        got = o[c0:c0 + L, :1].float()
        err = max(err, float((got - ref).norm() / ref.norm()))
        c0 += L
    # Causal FLOPs of a sequence of L: proportional to L (L + 1) / 2.
    fl_varlen = sum(L * (L + 1) / 2 for L in LENGTHS)
    fl_dense = n * leq * (leq + 1) / 2
    us_v = bench(varlen, args.iters, warm=10) * 1e3
    us_d = bench(dense, args.iters, warm=10) * 1e3
    ratio = (us_v / fl_varlen) / (us_d / fl_dense)
    print(f"varlen_py: {torch.cuda.get_device_name()}: varlen {us_v:.1f} us "
          f"(16 sequences, {total} tokens) | dense 16x{leq} {us_d:.1f} us | FLOPs varlen / "
          f"dense {fl_varlen / fl_dense:.3f} | varlen / dense per FLOP {ratio:.3f} "
          f"(bar <= 1.05) | rel err vs per-sequence calls {err:.1e}")


if __name__ == "__main__":
    main()
