"""Where a split decode's time goes: flashjit's pick on decode shapes with the
number of splits forced (problem.splits), eager and under CUDA-graph replay,
beside cuDNN through PyTorch SDPA in the same run.

Run on the GPU machine from the repository root, with build/ configured with
-DFLASHJIT_SHARED=ON:  python3 bench/decode_probe.py [--iters N]
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flashjit_ctypes as fjc  # noqa: E402
from sdpa_compare import bench  # noqa: E402
from serving_compare import graph_time  # noqa: E402

# (batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, dtype, splits tried)
CASES = [
    (1, 32, 8, 1, 4096, 128, "f16", (0, 1, 4, 8, 16, 32, 64)),
    (1, 32, 8, 1, 32768, 128, "bf16", (0, 8, 16, 32, 64, 128)),
    (16, 32, 8, 1, 8192, 128, "bf16", (0, 1, 2, 4)),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=50)
    a = ap.parse_args()
    torch.manual_seed(0)
    fj = fjc.Flashjit(fjc.load(), 0)
    for B, H, Hkv, Sq, Skv, D, dt, tries in CASES:
        tdt = torch.float16 if dt == "f16" else torch.bfloat16
        q = torch.randn(B, H, Sq, D, device="cuda", dtype=tdt)
        k = torch.randn(B, Hkv, Skv, D, device="cuda", dtype=tdt)
        v = torch.randn(B, Hkv, Skv, D, device="cuda", dtype=tdt)
        o = torch.empty_like(q)
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
        shape = f"({B},{H}/{Hkv},{Sq}/{Skv},{D}) {dt}"
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            f = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
            print(f"decode {shape} cudnn: {bench(f, a.iters) * 1e3:.1f} us, "
                  f"graph {graph_time(f, a.iters) * 1e3:.1f} us", flush=True)
        for s in tries:
            p = fj.problem(B, H, Hkv, Sq, Skv, D, fjc.F16 if dt == "f16" else fjc.BF16)
            p.splits = s
            plan, name = fj.plan(p)

            def run():
                fj.fwd(p, q, k, v, o, stream=torch.cuda.current_stream().cuda_stream)
            run()
            torch.cuda.synchronize()
            err = float((o.float() - ref).norm() / ref.norm())
            print(f"decode {shape} splits={s} (plan {plan.splits}): "
                  f"{bench(run, a.iters, warm=10) * 1e3:.1f} us, graph "
                  f"{graph_time(run, a.iters) * 1e3:.1f} us, err {err:.1e} {name}", flush=True)
        del q, k, v, o
    fj.close()


if __name__ == "__main__":
    main()
