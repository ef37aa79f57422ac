"""A fused QKV projection's attention, forward + backward through
autograd, under the package on PYTHONPATH: (batch, seq, heads + 2 kv
heads, d) split and viewed as BHSD, the gradient of the projection's
output.  With bench/probes/qkvviews.patch the backward reads q, k and v
where they are and lays dq, dk, dv out as views of one buffer; without
it, it copies q, k and v dense first (three copies of the projection's
size).  Prints the median of each shape (us, each call alone between
CUDA events) and the kernels of one call (torch.profiler).

    PYTHONPATH=<package> FLASHJIT_LIB=build/libflashjit.so python3 bench/probes/qkv_views.py
"""
import os
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import flashjit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from mods_cases import bench  # noqa: E402  (each call alone between CUDA events, us)


def main():
    torch.manual_seed(0)
    tag = os.environ.get("QV_TAG", "")
    for b, s, h, hk, d in ((8, 512, 8, 2, 64), (4, 4096, 16, 16, 128), (1, 8192, 32, 8, 128)):
        x = torch.randn(b, s, h + 2 * hk, d, device="cuda", dtype=torch.bfloat16,
                        requires_grad=True)
        dout = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)

        def step():
            q, k, v = (t.transpose(1, 2) for t in x.split([h, hk, hk], dim=2))
            o = flashjit.attention(q, k, v, causal="top_left")
            return torch.autograd.grad(o, x, dout)

        g = step()[0]
        us = bench(step, 20)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        per = defaultdict(float)
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                per[ev.name] += ev.device_time
        print(f"qkv_views{tag} ({b},{s},{h}/{hk},{d}) causal: fwd+bwd {us:.1f} us, kernels "
              f"{sum(per.values()):.1f} us, |grad| {g.float().norm().item():.4f}")
        for n, t in sorted(per.items(), key=lambda x: -x[1])[:6]:
            print(f"      {t:9.1f} us  {n[:90]}")


if __name__ == "__main__":
    sys.exit(main())
