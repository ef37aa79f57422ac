"""The backward through autograd against the backward op alone (issue 33:
R9's harness read 480 us more a call than bench/bwd_compare.py at (4, 16,
4096, 128) bf16, cuDNN's 190): both timed in one process the same way
(each call alone between CUDA events, synchronised), then the autograd
call under torch.profiler -- its kernels (device time) and its host ops
(CPU self time), per call.

    PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so python3 bench/probes/bwd_gap.py [iters]
"""
import math
import os
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import flashjit
from flashjit import _train as tr

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from mods_cases import bench  # noqa: E402

B, H, S, D = 4, 16, 4096, 128


def profile_call(label, fn, iters):
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    dev, host = defaultdict(float), defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            dev[ev.name] += ev.device_time / iters
        else:
            host[ev.name] += ev.self_cpu_time_total / iters
    print(f"  {label}: kernels {sum(dev.values()):.1f} us a call")
    for n, t in sorted(dev.items(), key=lambda x: -x[1])[:6]:
        print(f"      {t:9.1f} us  {n[:100]}")
    print(f"  {label}: host self time {sum(host.values()):.1f} us a call; the largest:")
    for n, t in sorted(host.items(), key=lambda x: -x[1])[:8]:
        print(f"      {t:9.1f} us  {n[:100]}")


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    for causal in (False, True):
        c = "top_left" if causal else None
        for t in (q, k, v):
            t.requires_grad_(True)
        o = flashjit.attention(q, k, v, causal=c)
        auto = bench(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True), iters)
        qd, kd, vd = (t.detach() for t in (q, k, v))
        out, lse = flashjit.attention(qd, kd, vd, causal=c, return_lse=True)
        op = bench(lambda: tr.attention_bwd_op(do, qd, kd, vd, out, lse, int(causal), 0.0, 0,
                                               -1, -1, 0.0, None, False), iters)
        print(f"bwd_gap causal={causal}: autograd.grad {auto:.1f} us, the op alone {op:.1f} us, "
              f"gap {auto - op:.1f}")
        profile_call("autograd.grad", lambda: torch.autograd.grad(o, (q, k, v), do,
                                                                  retain_graph=True), 5)
        profile_call("the op", lambda: tr.attention_bwd_op(do, qd, kd, vd, out, lse, int(causal),
                                                           0.0, 0, -1, -1, 0.0, None, False), 5)


if __name__ == "__main__":
    main()
