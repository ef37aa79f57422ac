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


# --long: one sequence of 32k and 64k keys, more split counts, and the
# copy's rate (a device-to-device copy of K's and V's bytes, graph-replayed).
LONG = [
    (1, 32, 8, 1, 32768, 128, "bf16", (0, 16, 29, 33, 48, 66, 99, 132)),
    (1, 32, 8, 1, 65536, 128, "bf16", (0, 33, 66, 132)),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--long", action="store_true", help="the long single decodes only, with the copy's rate")
    ap.add_argument("--splits", default="",
                    help="comma-separated split counts to try in every case (0: the rule's) instead of each case's own")
    ap.add_argument("--no-tiles", action="store_true", help="--long: skip the key tiles and stages varied")
    a = ap.parse_args()
    cases = LONG if a.long else CASES
    if a.splits:
        cases = [c[:7] + (tuple(int(x) for x in a.splits.split(",")),) for c in cases]
    torch.manual_seed(0)
    fj = fjc.Flashjit(fjc.load(), 0)
    for B, H, Hkv, Sq, Skv, D, dt, tries in cases:
        tdt = torch.float16 if dt == "f16" else torch.bfloat16
        q = torch.randn(B, H, Sq, D, device="cuda", dtype=tdt)
        k = torch.randn(B, Hkv, Skv, D, device="cuda", dtype=tdt)
        v = torch.randn(B, Hkv, Skv, D, device="cuda", dtype=tdt)
        o = torch.empty_like(q)
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
        shape = f"({B},{H}/{Hkv},{Sq}/{Skv},{D}) {dt}"
        copy_us = None
        if a.long:
            src = torch.empty(2 * k.numel(), device="cuda", dtype=tdt)
            dst = torch.empty_like(src)
            copy_us = graph_time(lambda: dst.copy_(src), a.iters) * 1e3
            print(f"decode {shape} copy of K and V's {2 * k.numel() * k.element_size() / 1e6:.0f} MB: "
                  f"graph {copy_us:.1f} us", flush=True)
            del src, dst
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
            g = graph_time(run, a.iters) * 1e3
            rate = f", {copy_us / g:.2f} of the copy's rate" if copy_us else ""
            print(f"decode {shape} splits={s} (plan {plan.splits}): "
                  f"{bench(run, a.iters, warm=10) * 1e3:.1f} us, graph "
                  f"{g:.1f} us{rate}, err {err:.1e} {name}", flush=True)
        if a.long and not a.no_tiles:
            # The pick's key tiles and stages varied, at two split counts.
            for s in (16, 29):
                for tn, st in ((64, 2), (64, 3), (128, 2), (128, 3)):
                    p = fj.problem(B, H, Hkv, Sq, Skv, D, fjc.F16 if dt == "f16" else fjc.BF16)
                    p.splits = s
                    v0, name, _ = fj.variant(p)
                    v0.tile_n, v0.stages = tn, st
                    def run_v():
                        fj.fwd_variant(p, v0, q, k, v, o, stream=torch.cuda.current_stream().cuda_stream)
                    try:
                        run_v()
                    except Exception as ex:  # noqa: BLE001 -- a refused variant, printed
                        print(f"decode {shape} splits={s} tile_n={tn} stages={st}: {str(ex)[:120]}", flush=True)
                        continue
                    torch.cuda.synchronize()
                    err = float((o.float() - ref).norm() / ref.norm())
                    g = graph_time(run_v, a.iters) * 1e3
                    print(f"decode {shape} splits={s} tile_n={tn} stages={st}: graph {g:.1f} us, "
                          f"{copy_us / g:.2f} of the copy's rate, err {err:.1e}", flush=True)
        del q, k, v, o
    fj.close()


if __name__ == "__main__":
    main()
