"""FP8 attention (Q, K, V e4m3) beside cuDNN's FP8 SDPA, in one process.

The FlashAttention-3 paper's 16k-token sweep (B = 16384 // S, H = 2048 //
D, BHSD), e4m3 inputs torch.randn(...).to(float8_e4m3fn) with descales 1
(cuDNN: per tensor; flashjit: per (batch, KV head), all 1).  cuDNN runs
through cudnn-frontend's sdpa_fp8 graph as ../shared/anchors/fp8_anchor.py
builds it (bench/fp8_anchor.py is that script; O in e4m3, the only FP8
output cuDNN takes on Hopper); flashjit through fj_attention_fwd (O in
bf16, or with --o-dtype e4m3 in e4m3 as cuDNN's: its scale chosen as the
anchor's, a power of two from a first call's amax, fj_problem.o_amax).  Both are checked against a float32 reference of the dequantised
inputs on batch 0, head 0.  CUDA events, median of --iters after warm-up.
Also, with --long: flashjit's error against the reference as the keys
grow (one head, 64 query rows x 1k..128k keys, head dims --long-dims), per
flush setting.

Run on the GPU machine from the repository root, the cudnn-frontend wheel
installed to /tmp/site (../shared/anchors/README.md):
    PYTHONPATH=/tmp/site:python FLASHJIT_LIB=build/libflashjit.so \
        python3 bench/fp8_compare.py [--dims 128,256] [--seqs 2048,4096] [--long]
Writes fp8_compare.json to $OUT (or --out).
"""
import argparse
import ctypes as C
import json
import math
import os
import statistics
import sys
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flashjit_ctypes as fjc  # noqa: E402
import fp8_anchor as anchor  # noqa: E402


def flops(B, H, S, D, causal):
    return 4 * B * H * S * S * D / (2 if causal else 1)


class Fp8:
    """flashjit's FP8 forward on one problem: the scales (all 1), the output."""

    def __init__(self, fj, B, H, Hkv, Sq, Skv, D, causal, flush=0, fields=None, o8=False):
        self.fj, self.D = fj, D
        self.p = fj.problem(B, H, Hkv, Sq, Skv, D, dtype=fjc.E4M3,
                            causal=fjc.CAUSAL_TOP_LEFT if causal else fjc.CAUSAL_NONE)
        self.scales = torch.ones(3, B * Hkv, dtype=torch.float32, device="cuda")
        self.p.q_scale = self.scales[0].data_ptr()
        self.p.k_scale = self.scales[1].data_ptr()
        self.p.v_scale = self.scales[2].data_ptr()
        # O in e4m3 (o8): its scale (1 until calibrate()) and amax.
        self.o_scale = torch.ones(1, dtype=torch.float32, device="cuda")
        self.amax = torch.zeros(1, dtype=torch.float32, device="cuda")
        if o8:
            self.p.o_dtype = fjc.E4M3
            self.p.o_scale = self.o_scale.data_ptr()
            self.p.o_amax = self.amax.data_ptr()
        self.o = torch.empty(B, H, Sq, D, dtype=torch.float8_e4m3fn if o8 else torch.bfloat16,
                             device="cuda")
        self.variant, self.name, _ = fj.variant(self.p)
        fields = dict(fields or {})
        if flush:
            fields["fp8_flush"] = flush
        if fields:
            for name, value in fields.items():
                setattr(self.variant, name, value)
            buf = C.create_string_buffer(160)
            fj.lib.fj_variant_name(C.byref(self.variant), buf, 160)
            self.name = buf.value.decode()

    def __call__(self, q, k, v):
        self.fj.fwd_variant(self.p, self.variant, q, k, v, self.o,
                            stream=torch.cuda.current_stream().cuda_stream)
        return self.o

    def calibrate(self, q, k, v):
        """An e4m3 O's scale as the cuDNN anchor chooses it: the power of
        two that brings a first call's amax to at most 256."""
        self(q, k, v)
        a = self.amax.item()
        if a > 0 and math.isfinite(a):
            self.o_scale.fill_(2.0 ** math.floor(math.log2(256.0 / a)))

    def dequantised(self, o):
        """O as float32 (an e4m3 O divided by its scale)."""
        return o.float() / self.o_scale if o.dtype == torch.float8_e4m3fn else o


def sweep(fj, args, cudnn, handle, results):
    aargs = types.SimpleNamespace(layout="bhsd", stats=False, out="e4m3", no_amax_s=False,
                                  scale_s=256.0, scale_o="auto", warmup=3, iters=args.iters,
                                  verbose=False)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    for D in args.dims:
        for causal in args.causal:
            for S in args.seqs:
                B, H = 16384 // S, 2048 // D
                q, k, v = anchor.make_qkv(B, H, S, D, "bhsd", gen)
                f = flops(B, H, S, D, causal)
                ref = anchor.ref_attention_bh0(q, k, v, 1.0, 1.0, 1.0, 1.0 / math.sqrt(D), causal)
                row = dict(D=D, causal=causal, S=S, B=B, H=H)
                fp8 = Fp8(fj, B, H, H, S, S, D, causal, args.flush[0], o8=args.o_dtype == "e4m3")
                if args.o_dtype == "e4m3":
                    fp8.calibrate(q, k, v)
                o = fp8(q, k, v)
                torch.cuda.synchronize()
                row["flashjit_variant"] = fp8.name
                row["flashjit_err"] = anchor.err_stats(fp8.dequantised(o[0, 0]), ref)
                us, _ = anchor.time_us(lambda: fp8(q, k, v), 3, args.iters)
                row["flashjit_us"], row["flashjit_tflops"] = round(us, 2), round(f / us / 1e6, 1)
                res = {}
                try:
                    if cudnn is None:
                        raise RuntimeError("--no-cudnn")
                    o0 = anchor.run_fp8_case(cudnn, handle, B, H, S, D, causal, q, k, v, f, aargs, res)
                    row["cudnn_us"], row["cudnn_tflops"] = res["us"], res["tflops"]
                    row["cudnn_err"] = anchor.err_stats(o0, ref)
                    row["speedup"] = round(res["us"] / row["flashjit_us"], 3)
                except Exception as e:  # noqa: BLE001
                    row["cudnn_error"] = anchor.first_line(e)
                for fl in args.flush[1:] + args.alt:
                    try:
                        alt = Fp8(fj, B, H, H, S, S, D, causal, *((fl, None) if isinstance(fl, int) else (0, fl)))
                        ua, _ = anchor.time_us(lambda: alt(q, k, v), 3, args.iters)
                    except Exception as ex:  # noqa: BLE001 -- a variant this head dim refuses
                        row.setdefault("alt_tflops", []).append(None)
                        print(f"  {fl}: {anchor.first_line(ex)}", flush=True)
                        continue
                    row.setdefault("alt", {})[alt.name] = round(f / ua / 1e6, 1)
                    row.setdefault("alt_tflops", []).append(round(f / ua / 1e6, 1))
                    print(f"  {alt.name}: {f / ua / 1e6:.1f} TF", flush=True)
                print(f"D={D} causal={int(causal)} S={S}: flashjit {row['flashjit_tflops']} TF "
                      f"(rel {row['flashjit_err']['rel']:.4f}) cuDNN FP8 {row.get('cudnn_tflops')} TF "
                      f"(rel {row.get('cudnn_err', {}).get('rel', float('nan')):.4f}) "
                      f"x{row.get('speedup')} [{fp8.name}]", flush=True)
                results.append(row)
                del q, k, v, fp8
    for D in args.dims:
        for causal in args.causal:
            rs = [r for r in results if r["D"] == D and r["causal"] == causal and "speedup" in r]
            if rs:
                g = math.exp(statistics.mean(math.log(r["speedup"]) for r in rs))
                tf = math.exp(statistics.mean(math.log(r["flashjit_tflops"]) for r in rs))
                print(f"geomean D={D} causal={int(causal)}: flashjit/cuDNN FP8 x{g:.3f}, "
                      f"flashjit {tf:.0f} TF")
                # Each timed alternative (--flush's others, then --alt's) beside cuDNN.
                for i, name in enumerate([f"fp8_flush={fl}" for fl in args.flush[1:]] +
                                         ["+".join(f"{k}={v}" for k, v in a.items()) for a in args.alt]):
                    rsa = [r for r in rs if r["alt_tflops"][i]]
                    if rsa:
                        ga = math.exp(statistics.mean(math.log(r["alt_tflops"][i] / r["cudnn_tflops"])
                                                      for r in rsa))
                        print(f"geomean D={D} causal={int(causal)} {name}: flashjit/cuDNN FP8 x{ga:.3f}")


def long_context(fj, args, results):
    """The error against the float32 reference as the keys grow: one head,
    64 query rows, keys 1k..128k, at each of --long-dims, for the library's
    default and 128-key tiles flushed every tile and never, then each --alt
    variant (one the head dim refuses is reported and skipped)."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    for D, skv in [(D, skv) for D in args.long_dims for skv in (1024, 4096, 16384, 65536, 131072)]:
        q = torch.randn(1, 1, 64, D, device="cuda", generator=gen).to(torch.float8_e4m3fn)
        k = torch.randn(1, 1, skv, D, device="cuda", generator=gen).to(torch.float8_e4m3fn)
        v = torch.randn(1, 1, skv, D, device="cuda", generator=gen).to(torch.float8_e4m3fn)
        s = (q[0, 0].float() @ k[0, 0].float().t()) / math.sqrt(D)
        ref = torch.softmax(s, -1) @ v[0, 0].float()
        for fields in ([None, {"tile_n": 128, "fp8_flush": 1}, {"tile_n": 128, "fp8_flush": -1}] +
                       args.alt):
            try:
                fp8 = Fp8(fj, 1, 1, 1, 64, skv, D, False, 0, fields)
                o = fp8(q, k, v)
                torch.cuda.synchronize()
            except Exception as ex:  # noqa: BLE001
                print(f"D={D} keys {skv}: {fields}: {anchor.first_line(ex)}", flush=True)
                continue
            e = anchor.err_stats(o[0, 0], ref)
            results.append(dict(long=True, D=D, skv=skv, fields=fields or {}, variant=fp8.name, err=e))
            print(f"D={D} keys {skv}: {fp8.name} rel {e['rel']:.5f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="128,256")
    ap.add_argument("--seqs", default="2048,4096,8192,16384")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--long", action="store_true")
    ap.add_argument("--long-dims", default="128", help="head dims of --long's curves")
    ap.add_argument("--alt", default="", help="variants timed beside the library's choice: "
                    "field=value[+field=value] of fj_variant, comma-separated (stages=3+fp8_flush=8)")
    ap.add_argument("--flush", default="0",
                    help="fp8_flush values (0: the library's default; -1 never); the first is "
                         "compared with cuDNN, the others timed beside it")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--no-cudnn", action="store_true", help="flashjit alone (A/B of templates)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--o-dtype", default="bf16", choices=("bf16", "e4m3"),
                    help="flashjit's O: bf16, or e4m3 as cuDNN's (scaled as the anchor does)")
    args = ap.parse_args()
    args.dims = [int(x) for x in args.dims.split(",")]
    args.seqs = [int(x) for x in args.seqs.split(",")]
    args.long_dims = [int(x) for x in args.long_dims.split(",")]
    args.causal = [bool(int(x)) for x in args.causal.split(",")]
    args.flush = [int(x) for x in args.flush.split(",")]
    args.alt = [dict((kv.split("=")[0], int(kv.split("=")[1])) for kv in a.split("+"))
                for a in args.alt.split(",")] if args.alt else []
    fj = fjc.Flashjit(fjc.load())
    results = []
    if not args.no_sweep:
        cudnn = handle = None
        if not args.no_cudnn:
            import cudnn  # the cudnn-frontend wheel
            handle = cudnn.create_handle()
        sweep(fj, args, cudnn, handle, results)
    if args.long:
        long_context(fj, args, results)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "fp8_compare.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), results=results), f, indent=1)


if __name__ == "__main__":
    main()
