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


def inputs(B, H, Hkv, Sq, Skv, D, dt):
    """A case's dtype, random Q, K, V, O's buffer, the float32 reference
    and the shape's label."""
    tdt = torch.float16 if dt == "f16" else torch.bfloat16
    q = torch.randn(B, H, Sq, D, device="cuda", dtype=tdt)
    k = torch.randn(B, Hkv, Skv, D, device="cuda", dtype=tdt)
    v = torch.randn(B, Hkv, Skv, D, device="cuda", dtype=tdt)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
    return tdt, q, k, v, torch.empty_like(q), ref, f"({B},{H}/{Hkv},{Sq}/{Skv},{D}) {dt}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--long", action="store_true", help="the long single decodes only, with the copy's rate")
    ap.add_argument("--fused-ab", action="store_true",
                    help="the long decodes' own picks (and 16 and 29 splits) with the combine kernel "
                         "and fused (FLASHJIT_FUSED_COMBINE=0 / 1) alternately, three rounds")
    a = ap.parse_args()
    if a.fused_ab:
        return fused_ab(a.iters)
    cases = LONG if a.long else CASES
    torch.manual_seed(0)
    fj = fjc.Flashjit(fjc.load(), 0)
    for B, H, Hkv, Sq, Skv, D, dt, tries in cases:
        tdt, q, k, v, o, ref, shape = inputs(B, H, Hkv, Sq, Skv, D, dt)
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
        if a.long:
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


def fused_ab(iters):
    """Graph times of the split decode with the combine kernel and with the
    split kernel's own combine, alternately in one process (two contexts:
    a context reads FLASHJIT_FUSED_COMBINE when it is made), against the
    copy's rate."""
    torch.manual_seed(0)
    lib = fjc.load()
    ctxs = {}
    for mode in ("0", "1"):
        os.environ["FLASHJIT_FUSED_COMBINE"] = mode
        ctxs[mode] = fjc.Flashjit(lib, 0)
    os.environ.pop("FLASHJIT_FUSED_COMBINE", None)
    for B, H, Hkv, Sq, Skv, D, dt, _ in LONG:
        tdt, q, k, v, o, ref, shape = inputs(B, H, Hkv, Sq, Skv, D, dt)
        src = torch.empty(2 * k.numel(), device="cuda", dtype=tdt)
        dst = torch.empty_like(src)
        copy_us = graph_time(lambda: dst.copy_(src), iters) * 1e3
        del src, dst
        for s in (0, 16, 29):
            times = {"0": [], "1": []}
            for rnd in range(3):
                for mode in ("0", "1"):
                    fj = ctxs[mode]
                    p = fj.problem(B, H, Hkv, Sq, Skv, D, fjc.F16 if dt == "f16" else fjc.BF16)
                    p.splits = s
                    plan, name = fj.plan(p)

                    def run():
                        fj.fwd(p, q, k, v, o, stream=torch.cuda.current_stream().cuda_stream)
                    o.fill_(float("nan"))
                    run()
                    torch.cuda.synchronize()
                    err = float((o.float() - ref).norm() / ref.norm())
                    g = graph_time(run, iters) * 1e3
                    times[mode].append(g)
                    print(f"fusedab {shape} splits={s} (plan {plan.splits}, combine threads "
                          f"{plan.combine_threads}) fused={mode} round {rnd}: graph {g:.2f} us, "
                          f"{copy_us / g:.3f} of the copy's rate, err {err:.1e}", flush=True)
            m0, m1 = sorted(times["0"])[1], sorted(times["1"])[1]
            print(f"fusedab {shape} splits={s}: median graph {m0:.2f} -> {m1:.2f} us "
                  f"({m1 / m0:.3f}); copy's rate {copy_us / m0:.3f} -> {copy_us / m1:.3f}", flush=True)
        del q, k, v, o
    for fj in ctxs.values():
        fj.close()


if __name__ == "__main__":
    main()
