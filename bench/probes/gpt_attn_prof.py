"""The GPT example's attention call alone (examples/gpt_train.py's shape:
batch 8, sequence 512, 8/2 heads of 64, q, k and v strided bshd views of
one projection, bf16), forward + backward through autograd, flashjit
beside SDPA (its own backend choice, as the example calls it): per call
the CUDA-event time with a synchronisation after it, the host time of a
call back to back (no synchronisation: the launch queue's rate), and the
kernels' summed device time under torch.profiler, with each kernel.

    PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so \\
        python3 bench/probes/gpt_attn_prof.py [B,S,H,HKV,D] [iters]
"""
import sys
import time
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import flashjit


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          is_causal=True, enable_gqa=q.shape[2] != k.shape[2]
                                          ).transpose(1, 2)


def fj(q, k, v):
    return flashjit.attention(q, k, v, causal="top_left", layout="bshd")


def main():
    B, S, H, HKV, D = (int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "8,512,8,2,64").split(","))
    iters = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    torch.manual_seed(0)
    w = torch.randn(B, S, (H + 2 * HKV) * D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)

    def step(attn):
        qkv = w.view(B, S, H + 2 * HKV, D)
        q, k, v = qkv.split([H, HKV, HKV], dim=2)
        return torch.autograd.grad(attn(q, k, v), (w,), do)

    for name, attn in (("sdpa", sdpa), ("flashjit", fj), ("sdpa", sdpa), ("flashjit", fj)):
        for _ in range(10):
            step(attn)
        torch.cuda.synchronize()
        ev = []
        for _ in range(iters):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            step(attn)
            e.record()
            torch.cuda.synchronize()
            ev.append(s.elapsed_time(e) * 1e3)
        ev.sort()
        t0 = time.perf_counter()
        for _ in range(iters):
            step(attn)
        host = (time.perf_counter() - t0) / iters * 1e6
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                step(attn)
            torch.cuda.synchronize()
        per = defaultdict(lambda: [0, 0.0])
        for x in prof.events():
            if x.device_type == torch.autograd.DeviceType.CUDA:
                per[x.name][0] += 1
                per[x.name][1] += x.device_time
        kern = sum(t for _, t in per.values()) / 20
        print(f"gpt_attn {name} B={B} S={S} H={H}/{HKV} D={D}: event median {ev[len(ev) // 2]:.1f} us, "
              f"back to back {host:.1f} us a call, kernels {kern:.1f} us", flush=True)
        for kname, (n, t) in sorted(per.items(), key=lambda x: -x[1][1])[:8]:
            print(f"    {t / n:8.1f} us x{n / 20:4.1f}  {kname[:100]}")


if __name__ == "__main__":
    main()
