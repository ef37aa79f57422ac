"""flashjit beside PyTorch SDPA (flash, cuDNN) on serving shapes: decode and
speculative decode with GQA, in one process on one GPU.

For each case: flashjit's plan (variant, splits, GQA packing), its time
(median of --iters, CUDA events, eager and under CUDA-graph replay), PyTorch
SDPA's flash and cuDNN backends (enable_gqa) on the same inputs, the K/V
bytes read per call divided by the time, and beside it the rate of a
device-to-device copy of as many bytes (read and written: 2 x bytes / time),
measured in the same run.  flashjit's output is
checked against SDPA's math backend in float32 (first KV head's query heads).

Run on the GPU machine from the repository root, with build/ configured with
-DFLASHJIT_SHARED=ON:  python3 bench/serving_compare.py [--iters N] [--out DIR]
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flashjit_ctypes as fjc  # noqa: E402
from sdpa_compare import bench  # noqa: E402  (median of CUDA-event timings)

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}

# (batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, dtype)
CASES = [
    (1, 32, 8, 1, 4096, 128, "f16"),
    (64, 32, 8, 1, 4096, 128, "bf16"),
    (1, 32, 8, 1, 32768, 128, "bf16"),
    (16, 32, 8, 1, 8192, 128, "bf16"),
    (8, 32, 8, 4, 4096, 128, "bf16"),
    (32, 32, 32, 1, 2048, 128, "bf16"),
    (64, 32, 8, 1, 4096, 64, "bf16"),
]


def graph_time(fn, iters, reps=20):
    """Per-call time of `reps` calls captured in one CUDA graph, replayed."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()  # warm: compile, and grow the context's workspace outside capture
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    # Captured on the stream that ran the warm-up: the context's workspace
    # is per stream, and cannot be allocated while capturing.
    with torch.cuda.graph(g, stream=s):
        for _ in range(reps):
            fn()
    return bench(g.replay, iters) / reps


def case(fj, B, H, Hkv, Sq, Skv, D, dt, iters):
    tdt = torch.float16 if dt == "f16" else torch.bfloat16
    dev = torch.device("cuda")
    q = torch.randn(B, H, Sq, D, device=dev, dtype=tdt)
    k = torch.randn(B, Hkv, Skv, D, device=dev, dtype=tdt)
    v = torch.randn(B, Hkv, Skv, D, device=dev, dtype=tdt)
    o = torch.full_like(q, float("nan"))
    p = fj.problem(B, H, Hkv, Sq, Skv, D, fjc.F16 if dt == "f16" else fjc.BF16)
    plan, name = fj.plan(p)
    row = dict(B=B, H=H, Hkv=Hkv, Sq=Sq, Skv=Skv, D=D, dtype=dt, variant=name,
               splits=plan.splits, pack_gqa=plan.variant.pack_gqa,
               grid=list(plan.grid), workspace_bytes=plan.workspace_bytes)
    kv_bytes = 2 * k.numel() * k.element_size()
    row["kv_mb"] = round(kv_bytes / 1e6, 1)

    def run():
        fj.fwd(p, q, k, v, o, stream=torch.cuda.current_stream().cuda_stream)
    run()
    torch.cuda.synchronize()
    ms = bench(run, iters, warm=10)
    row["flashjit_us"] = round(ms * 1e3, 1)
    row["flashjit_gbs"] = round(kv_bytes / ms / 1e6, 1)
    row["flashjit_graph_us"] = round(graph_time(run, iters) * 1e3, 1)
    g = H // Hkv
    with sdpa_kernel([SDPBackend.MATH]):
        ref = F.scaled_dot_product_attention(q[:, :g].float(), k[:, :1].float(),
                                             v[:, :1].float(), enable_gqa=g > 1)
    row["rel_err"] = float((o[:, :g].float() - ref).norm() / ref.norm())
    row["nan"] = int(torch.isnan(o).sum())
    for bname, be in BACKENDS.items():
        try:
            with sdpa_kernel([be]):
                f = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=g > 1)  # noqa: E731
                ms_b = bench(f, iters)
                row[bname + "_graph_us"] = round(graph_time(f, iters) * 1e3, 1)
            row[bname + "_us"] = round(ms_b * 1e3, 1)
        except RuntimeError as ex:
            row[bname + "_us"] = row[bname + "_graph_us"] = None
            row[bname + "_err"] = str(ex).splitlines()[0][:80]
    # A device-to-device copy of the K/V bytes, in this run.
    src = torch.empty(kv_bytes // 2, device=dev, dtype=torch.float16)
    dst = torch.empty_like(src)
    cms = bench(lambda: dst.copy_(src), iters)
    row["copy_us"] = round(cms * 1e3, 1)
    # A copy reads and writes each byte: its rate counts both.
    row["copy_gbs"] = round(2 * kv_bytes / cms / 1e6, 1)
    row["fj_of_copy"] = round(row["flashjit_gbs"] / row["copy_gbs"], 3)
    if row.get("cudnn_us"):
        row["cudnn_over_fj"] = round(row["cudnn_us"] / row["flashjit_us"], 3)
    del q, k, v, o, src, dst
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    torch.manual_seed(0)
    lib = fjc.load()
    fj = fjc.Flashjit(lib, 0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"cudnn {torch.backends.cudnn.version()}", flush=True)
    rows = []
    for c in CASES:
        r = case(fj, *c, a.iters)
        rows.append(r)
        print(f"serving ({r['B']},{r['H']}/{r['Hkv']},{r['Sq']}/{r['Skv']},{r['D']}) {r['dtype']}: "
              f"fj {r['flashjit_us']}us (graph {r['flashjit_graph_us']}) {r['flashjit_gbs']}GB/s "
              f"= {r['fj_of_copy']:.2f} of copy ({r['copy_gbs']}GB/s) | flash {r.get('flash_us')}us "
              f"(graph {r.get('flash_graph_us')}) | cudnn {r.get('cudnn_us')}us "
              f"(graph {r.get('cudnn_graph_us')}) | cudnn/fj {r.get('cudnn_over_fj')} | "
              f"err {r['rel_err']:.1e} nan {r['nan']} | {r['variant']} splits={r['splits']}",
              flush=True)
    with open(os.path.join(a.out, "serving_compare.json"), "w") as f:
        json.dump(rows, f, indent=1)
    fj.close()


if __name__ == "__main__":
    main()
