"""The backward beside PyTorch SDPA's (cuDNN, flash) on one GPU, in one process.

Each case makes q, k, v and dO once (normal, never zeros), runs each
implementation's forward once (its O and log-sum-exp), then times only the
backward: flashjit's op torch.ops.flashjit.attention_bwd (fj_attention_bwd:
preprocess, main kernel, postprocess), and torch.autograd.grad through
scaled_dot_product_attention under each backend with the forward's graph
kept (retain_graph), so only the backward kernels run.  CUDA events after
warm-up, median of --iters; FLOPs 2.5 x the forward's 4*B*H*S^2*D (half
for causal).  flashjit's deterministic mode is timed too (det_us,
det_over_default).  flashjit's dQ, dK, dV are compared with the float32 autograd
reference of the first two heads.  Prints one line a case and a geomean
per (head dim, mask); writes bwd_compare.json to $OUT (or --out).

Run on the GPU machine from the repository root with the package importable
(PYTHONPATH=python and FLASHJIT_LIB=build/libflashjit.so, or the wheel):
    python3 bench/bwd_compare.py [--quick] [--dims 64,128] [--dtypes bf16,f16]
        [--gqa B,H,HKV,S,D[,causal];...] [--iters 20]

--gqa replaces the one GQA case of the full sweep ((1, 32/8, 8192, 128)
causal) with its list (with --quick too).
"""
import argparse
import json
import math
import os
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashjit
from flashjit import _train as tr

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def bench(fn, iters, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts)


def rel(got, want):
    return ((got.float() - want).norm() / want.norm()).item()


def case(B, H, S, D, causal, dtype, iters, Hkv=None):
    Hkv = Hkv or H
    dev = torch.device("cuda")
    q = torch.randn(B, H, S, D, device=dev, dtype=dtype)
    k = torch.randn(B, Hkv, S, D, device=dev, dtype=dtype)
    v = torch.randn_like(k)
    do = torch.randn_like(q)
    c = 1 if causal else 0
    fl = 2.5 * 4 * B * H * S * S * D / (2 if causal else 1)
    row = dict(B=B, H=H, Hkv=Hkv, S=S, D=D, causal=causal, dtype=str(dtype).split(".")[-1])
    out, lse = flashjit.attention(q, k, v, causal="top_left" if causal else None,
                                  return_lse=True)
    scale = 1 / math.sqrt(D)

    def fj_bwd(deterministic=False):
        return tr.attention_bwd_op(do, q, k, v, out, lse, c, 0.0, 0, -1, -1, 0.0, None,
                                   deterministic)

    grads = fj_bwd()
    torch.cuda.synchronize()
    ms = bench(fj_bwd, iters)
    row["flashjit_us"], row["flashjit_tflops"] = round(ms * 1e3, 1), round(fl / ms / 1e9, 1)
    # The deterministic mode (fj_problem.deterministic), and its cost.
    det = bench(lambda: fj_bwd(True), iters)
    row["det_us"], row["det_over_default"] = round(det * 1e3, 1), round(det / ms, 3)
    # The float32 reference of heads 0-1 (their KV heads under GQA).
    g = H // Hkv
    kv = slice(0, max(1, 2 // g))
    ql, kl, vl = (t.detach().float().requires_grad_() for t in (q[:, :2], k[:, kv], v[:, kv]))
    ref = F.scaled_dot_product_attention(ql, kl, vl, is_causal=causal, scale=scale,
                                         enable_gqa=g > 1)
    ref.backward(do[:, :2].float())
    row["rel_dq"] = round(rel(grads[0][:, :2], ql.grad), 5)
    row["rel_dk"] = round(rel(grads[1][:, kv], kl.grad), 5) if g == 1 else None
    row["rel_dv"] = round(rel(grads[2][:, kv], vl.grad), 5) if g == 1 else None
    for name, be in BACKENDS.items():
        try:
            ql, kl, vl = (t.detach().requires_grad_() for t in (q, k, v))
            with sdpa_kernel([be]):
                o = F.scaled_dot_product_attention(ql, kl, vl, is_causal=causal,
                                                   enable_gqa=Hkv != H)

            def sdpa_bwd():
                return torch.autograd.grad(o, (ql, kl, vl), do, retain_graph=True)

            sdpa_bwd()
            torch.cuda.synchronize()
            t = bench(sdpa_bwd, iters)
            row[f"{name}_us"], row[f"{name}_tflops"] = round(t * 1e3, 1), round(fl / t / 1e9, 1)
            row[f"{name}_over_fj"] = round(t / ms, 3)
        except RuntimeError as e:
            row[f"{name}_error"] = str(e).splitlines()[0][:120]
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--dtypes", default="bf16", help="bf16, f16 or both (comma-separated)")
    ap.add_argument("--gqa", default=None, help="B,H,HKV,S,D[,causal];... GQA cases")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    rows = []
    seqs = (2048, 8192) if a.quick else (2048, 4096, 8192, 16384)
    dtypes = [DTYPES[x] for x in a.dtypes.split(",") if x]
    dims = [int(x) for x in a.dims.split(",") if x]
    for dtype in dtypes:
        for D in dims:
            H = 2048 // D
            for causal in (False, True):
                for S in seqs:
                    r = case(16384 // S, H, S, D, causal, dtype, a.iters)
                    rows.append(r)
                    print("bwd", " ".join(f"{k}={v}" for k, v in r.items()), flush=True)
    gqa = ([[int(x) for x in c.split(",")] for c in a.gqa.split(";") if c] if a.gqa is not None
           else [] if a.quick else [[1, 32, 8, 8192, 128, 1]])
    for dtype in dtypes:
        for c in gqa:
            B, H, Hkv, S, D = c[:5]
            r = case(B, H, S, D, bool(c[5]) if len(c) > 5 else True, dtype, a.iters, Hkv=Hkv)
            rows.append(r)
            print("bwd gqa", " ".join(f"{k}={v}" for k, v in r.items()), flush=True)
    for dt in sorted({r["dtype"] for r in rows}):
        for D in sorted({r["D"] for r in rows}):
            for causal in (False, True):
                sel = [r for r in rows if r["D"] == D and r["causal"] == causal and r["Hkv"] == r["H"]
                       and r["dtype"] == dt and "cudnn_over_fj" in r]
                if sel:
                    gm = math.exp(sum(math.log(r["cudnn_over_fj"]) for r in sel) / len(sel))
                    dm = math.exp(sum(math.log(r["det_over_default"]) for r in sel) / len(sel))
                    print(f"geomean {dt} D={D} causal={causal}: cuDNN time / flashjit time {gm:.3f} "
                          f"over S={[r['S'] for r in sel]}; deterministic / default time {dm:.3f}",
                          flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "bwd_compare.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
