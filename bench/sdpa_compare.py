"""flashjit beside PyTorch SDPA (flash, cuDNN, efficient) on one GPU, in one process.

Every case runs each implementation on the same random inputs (normal, never
zeros), timed with CUDA events after warm-up, median of --iters runs; FLOPs
are 4*B*H*Sq*Skv*D, half for causal.  flashjit's output is compared with
PyTorch's math backend in float32 on the same inputs (the first two heads).  Also measured: the
small shape per call under CUDA-graph replay and from the host, and the cost
of being a JIT (cold compile, disk hit to launch, memory-hit dispatch, a full
tune).  Writes sdpa_compare.json and sdpa_compare.png to $OUT (or --out).

Run on the GPU machine from the repository root, with build/ configured with
-DFLASHJIT_SHARED=ON:  python3 bench/sdpa_compare.py [--quick] [--tune]
"""
import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flashjit_ctypes as fjc  # noqa: E402

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def bench(fn, iters, warm=5):
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


def flops(B, H, S, Skv, D, causal):
    return 4 * B * H * S * Skv * D / (2 if causal else 1)


def case(fj, B, H, S, D, causal, dtype, iters, Hkv=None, Dv=None):
    """One shape, every implementation on the same inputs.  Hkv < H is GQA
    (SDPA with enable_gqa=True, flashjit's heads_kv); Dv != D: V's and
    O's own head dim (flashjit's head_dim_v; FLOPs 2 (D + Dv) a pair)."""
    Hkv = Hkv or H
    Dv = Dv or D
    tdt = torch.float16 if dtype == fjc.F16 else torch.bfloat16
    dev = torch.device("cuda")
    q = torch.randn(B, H, S, D, device=dev, dtype=tdt)
    k = torch.randn(B, Hkv, S, D, device=dev, dtype=tdt)
    v = torch.randn(B, Hkv, S, Dv, device=dev, dtype=tdt)
    o = torch.full((B, H, S, Dv), float("nan"), device=dev, dtype=tdt)
    gqa = dict(enable_gqa=True) if Hkv != H else {}
    p = fj.problem(B, H, Hkv, S, S, D, dtype, fjc.CAUSAL_TOP_LEFT if causal else fjc.CAUSAL_NONE)
    if Dv != D:  # V and O contiguous with their own head dim
        p.head_dim_v = Dv
        p.v_stride[:] = [Hkv * S * Dv, S * Dv, Dv]
        p.o_stride[:] = [H * S * Dv, S * Dv, Dv]
    _, name, origin = fj.variant(p)
    stream = torch.cuda.current_stream().cuda_stream
    row = dict(B=B, H=H, Hkv=Hkv, S=S, D=D, Dv=Dv, causal=causal, dtype=str(tdt).split(".")[-1],
               variant=name, choice=origin)
    fl = flops(B, H, S, S, (D + Dv) / 2, causal)
    fj.fwd(p, q, k, v, o, stream=stream)  # compile or fetch, outside the timing
    torch.cuda.synchronize()
    ms = bench(lambda: fj.fwd(p, q, k, v, o, stream=stream), iters)
    row["flashjit_us"], row["flashjit_tflops"] = round(ms * 1e3, 1), round(fl / ms / 1e9, 1)
    # The float32 reference on the first two heads (the math backend holds
    # B*H*S*S floats, 34 GB at 16k tokens over all heads).
    with sdpa_kernel([SDPBackend.MATH]):
        g = H // Hkv  # query heads 0-1 read KV head 0 (or 0-1 without GQA)
        kv = slice(0, 1) if g > 1 else slice(0, 2)
        ref = F.scaled_dot_product_attention(q[:, :2].float(), k[:, kv].float(),
                                             v[:, kv].float(), is_causal=causal,
                                             **(dict(enable_gqa=True) if g > 1 else {}))
    row["flashjit_rel_err"] = float((o[:, :2].float() - ref).norm() / ref.norm())
    row["flashjit_nan"] = int(torch.isnan(o).sum())
    del ref
    for bname, be in BACKENDS.items():
        try:
            with sdpa_kernel([be]):
                f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa)  # noqa: E731
                ms = bench(f, iters)
            row[bname + "_us"], row[bname + "_tflops"] = round(ms * 1e3, 1), round(fl / ms / 1e9, 1)
        except RuntimeError as ex:
            row[bname + "_us"] = row[bname + "_tflops"] = None
            row[bname + "_err"] = str(ex).splitlines()[0][:80]
    torch_best = min(row[b + "_us"] for b in BACKENDS if row.get(b + "_us"))
    row["ratio_vs_best"] = round(torch_best / row["flashjit_us"], 3)
    row["ratio_vs_flash"] = round(row["flash_us"] / row["flashjit_us"], 3) if row.get("flash_us") else None
    row["ratio_vs_cudnn"] = round(row["cudnn_us"] / row["flashjit_us"], 3) if row.get("cudnn_us") else None
    del q, k, v, o
    return row


def print_row(r):
    def f(x):
        return "    -  " if x is None else f"{x:7.1f}"
    dims = f"{r['D']}" + (f"/{r['Dv']}" if r.get("Dv", r["D"]) != r["D"] else "")
    print(f"{r['B']:3d} {r['H']:3d}/{r['Hkv']:<3d} {r['S']:6d} {dims:>4s} {'C' if r['causal'] else 'N'} "
          f"{r['dtype']:8s} fj {f(r['flashjit_us'])}us {f(r['flashjit_tflops'])}TF | "
          + " | ".join(f"{b} {f(r.get(b + '_us'))}us {f(r.get(b + '_tflops'))}TF" for b in BACKENDS)
          + f" | fj/best {r['ratio_vs_best']:.2f} fj/flash {r['ratio_vs_flash'] or 0:.2f}"
          f" fj/cudnn {r['ratio_vs_cudnn'] or 0:.2f}"
          f" | err {r['flashjit_rel_err']:.1e} | {r['variant']} ({r['choice']})", flush=True)


def small_shape_latency(fj, iters):
    """(1,8,512,64) f16: per call under CUDA-graph replay, and from the host."""
    dev = torch.device("cuda")
    q = torch.randn(1, 8, 512, 64, device=dev, dtype=torch.float16)
    k, v, o = torch.randn_like(q), torch.randn_like(q), torch.empty_like(q)
    p = fj.problem(1, 8, 8, 512, 512, 64)
    out = {}
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3):
            fj.fwd(p, q, k, v, o, stream=s.cuda_stream)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(100):
            fj.fwd(p, q, k, v, o, stream=s.cuda_stream)
    out["flashjit_graph_us"] = bench(g.replay, 20) / 100 * 1e3
    for name, be in BACKENDS.items():
        with sdpa_kernel([be]):
            with torch.cuda.stream(s):
                for _ in range(3):
                    F.scaled_dot_product_attention(q, k, v)
            torch.cuda.synchronize()
            g2 = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g2, stream=s):
                for _ in range(100):
                    F.scaled_dot_product_attention(q, k, v)
            out[name + "_graph_us"] = bench(g2.replay, 20) / 100 * 1e3
            out[name + "_eager_us"] = bench(lambda: F.scaled_dot_product_attention(q, k, v), iters) * 1e3
    out["flashjit_eager_us"] = bench(lambda: fj.fwd(p, q, k, v, o), iters) * 1e3
    # Host cost of a memory-hit call through ctypes: 128 calls queued (fewer
    # than the launch queue holds, so the host never waits), best of five.
    best = float("inf")
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(128):
            fj.fwd(p, q, k, v, o)
        best = min(best, (time.perf_counter() - t0) / 128 * 1e6)
    torch.cuda.synchronize()
    out["flashjit_host_us_per_call_ctypes"] = best
    return out


def jit_costs(lib, quick):
    """Cold compiles into an empty cache, then a disk hit to a launchable kernel."""
    out = {}
    with tempfile.TemporaryDirectory() as d:
        fj = fjc.Flashjit(lib, cache_dir=d)
        shapes = [(64, fjc.F16, 0), (128, fjc.F16, 0), (128, fjc.BF16, 1), (256, fjc.F16, 0),
                  (32, fjc.F16, 1), (96, fjc.BF16, 0), (160, fjc.F16, 1), (192, fjc.F16, 0)]
        compile_ms = []
        for D, dt, c in shapes[:3] if quick else shapes:
            p = fj.problem(1, 2, 2, 128, 128, D, dt, c)
            var, _, _ = fj.variant(p)
            compile_ms.append(fj.resources(var).compile_ms)
        out["cold_compile_ms"] = compile_ms
        out["cold_compile_ms_median"] = statistics.median(compile_ms)
        fj.close()
        # A new context on the warm cache.  Its first launch creates the Lua
        # state and reads the layout tables; a later first launch of another
        # variant renders it, reads the entry, loads the module and launches.
        fj = fjc.Flashjit(lib, cache_dir=d)

        def first_call(D, dt, c):
            tdt = torch.float16 if dt == fjc.F16 else torch.bfloat16
            q = torch.randn(1, 2, 128, D, device="cuda", dtype=tdt)
            k, v, o = torch.randn_like(q), torch.randn_like(q), torch.empty_like(q)
            p = fj.problem(1, 2, 2, 128, 128, D, dt, c)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fj.fwd(p, q, k, v, o)
            torch.cuda.synchronize()
            return (time.perf_counter() - t0) * 1e3

        out["disk_hit_first_launch_of_context_ms"] = first_call(64, fjc.F16, 0)
        out["disk_hit_first_launch_of_variant_ms"] = first_call(128, fjc.BF16, 1)
        fj.close()
    return out


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    sweep = [r for r in rows if r.get("sweep")]
    dims = sorted({r["D"] for r in sweep})
    fig, axes = plt.subplots(1, len(dims), figsize=(5 * len(dims), 4), squeeze=False)
    for ax, D in zip(axes[0], dims):
        for causal, style in ((False, "-"), (True, "--")):
            rs = sorted((r for r in sweep if r["D"] == D and r["causal"] == causal), key=lambda r: r["S"])
            for key, color in (("flashjit", "C3"), ("flash", "C0"), ("cudnn", "C2"), ("efficient", "C7")):
                ax.plot([r["S"] for r in rs], [r.get(key + "_tflops") or 0 for r in rs], style,
                        color=color, marker="o", label=f"{key}{' causal' if causal else ''}")
        ax.set_xscale("log", base=2)
        ax.set_title(f"H200, fp16, head dim {D}, 16k tokens")
        ax.set_xlabel("sequence length")
        ax.set_ylabel("TFLOP/s")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="the seeds' shapes only")
    ap.add_argument("--tune", action="store_true",
                    help="tune (4,16,4096,128) first and time the full tune")
    ap.add_argument("--sweep-only", action="store_true",
                    help="only the sweep's rows at S >= 2048 (no small shape, no JIT costs)")
    ap.add_argument("--jit-only", action="store_true",
                    help="only the cost of being a JIT (cold compiles, disk hits)")
    ap.add_argument("--dims", default="64,128,256",
                    help="the sweep's head dims (comma-separated; default 64,128,256)")
    ap.add_argument("--seqs", default=None,
                    help="the sweep's lengths, B = 16384 / S (default 512 to 16384; "
                         "with --sweep-only 2048 to 16384)")
    ap.add_argument("--dtype", choices=("f16", "bf16"), default="f16", help="the sweep's dtype")
    ap.add_argument("--dv", type=int, default=None,
                    help="the sweep's V and O head dim (default: the head dim; e.g. --dims 192 "
                         "--dv 128, MLA's prefill)")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    print("device", props.name, "torch", torch.__version__, "cudnn", torch.backends.cudnn.version())
    lib = fjc.load()
    torch.zeros(1, device="cuda")  # PyTorch makes the primary context current
    fj = fjc.Flashjit(lib)
    result = {"device": props.name, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
              "commit": os.environ.get("COMMIT", "?")}
    if a.tune:
        p = fj.problem(4, 16, 16, 4096, 4096, 128)
        t0 = time.perf_counter()
        best, rep = fj.tune(p)
        result["tune_4_16_4096_128"] = dict(best=best, wall_s=time.perf_counter() - t0,
                                            candidates=rep.candidates, refused=rep.refused,
                                            failed=rep.failed, wrong=rep.wrong, timed=rep.timed,
                                            best_ms=rep.best_ms, default_ms=rep.default_ms,
                                            compile_s=rep.compile_s)
        print("tune (4,16,4096,128):", result["tune_4_16_4096_128"], flush=True)
    cases = [(1, 8, 512, 64, False, fjc.F16), (1, 8, 512, 64, True, fjc.F16),
             (2, 8, 2048, 64, False, fjc.F16), (2, 8, 2048, 64, True, fjc.F16),
             (2, 8, 2048, 128, False, fjc.F16)]
    if a.sweep_only or a.jit_only:
        cases = []
    sweep = []
    dims = [int(x) for x in a.dims.split(",")]
    seqs = [int(x) for x in (a.seqs or ("2048,4096,8192,16384" if a.sweep_only
                                        else "512,1024,2048,4096,8192,16384")).split(",")]
    sdt = fjc.F16 if a.dtype == "f16" else fjc.BF16
    if not a.quick and not a.jit_only:
        for D in dims:
            for causal in (False, True):
                for S in seqs:
                    # 2048 / D query heads (16 at 128), at least one
                    sweep.append((16384 // S, max(1, 2048 // D), S, D, causal, sdt, None, a.dv))
        if not a.sweep_only:
            cases += [(4, 16, 4096, 128, False, fjc.BF16), (4, 16, 4096, 128, True, fjc.BF16)]
    gqa_cases = [] if a.jit_only else [(1, 32, 8192, 128, True, fjc.BF16, 8)]
    rows = []
    print("B   H/Hkv   S      D    c dtype    times per implementation, ratios, error, variant")
    for c in cases + sweep + gqa_cases:
        r = case(fj, *c[:6], iters=a.iters, Hkv=c[6] if len(c) > 6 else None,
                 Dv=c[7] if len(c) > 7 else None)
        r["sweep"] = c in sweep
        rows.append(r)
        print_row(r)
    result["cases"] = rows
    if not a.sweep_only and not a.jit_only:
        result["small_shape"] = small_shape_latency(fj, a.iters)
        print("small shape (1,8,512,64):", {k: round(v, 2) for k, v in result["small_shape"].items()})
    fj.close()
    if not a.sweep_only:
        result["jit"] = jit_costs(lib, a.quick)
        print("jit:", result["jit"])
    for D in dims:
        for causal in (False, True):
            for short in (True, False):
                rs = [r for r in rows if r["sweep"] and r["D"] == D and r["causal"] == causal
                      and (r["S"] < 2048) == short]
                if rs:
                    fl = [r["ratio_vs_flash"] for r in rs if r["ratio_vs_flash"]]
                    g = math.exp(sum(math.log(x) for x in fl) / len(fl)) if fl else float("nan")
                    gc = math.exp(sum(math.log(r["ratio_vs_cudnn"]) for r in rs) / len(rs))
                    tf = [r["flashjit_tflops"] for r in rs]
                    print(f"geomean D={D} {'causal' if causal else 'non-causal'}, "
                          f"{'S<2048' if short else 'S>=2048'}: "
                          f"flashjit/flash {g:.3f}, cudnn-time/flashjit-time {gc:.3f}; "
                          f"flashjit {min(tf):.0f}-{max(tf):.0f} TF ({min(tf) / 786:.2f}-{max(tf) / 786:.2f} of a bf16 GEMM's 786)")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "sdpa_compare.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    if rows:
        plot(rows, os.path.join(a.out, "sdpa_compare.png"))


if __name__ == "__main__":
    main()
