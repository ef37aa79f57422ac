"""Where a training call's time goes: issue 33's cases (bench/mods_cases.py,
(4, 16, 4096, 128) bf16) forward + torch.autograd.grad under
torch.profiler, flashjit beside SDPA's cuDNN (plain cases) and
torch.compile(flex_attention) (the others): per call the CUDA-event time
(as bench/train_mods_compare.py takes it), the kernels' summed device
time, and each kernel's mean time and count, so that the host's share
(event time less kernel time, where the GPU waits for the host) shows.

    PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so \\
        python3 bench/probes/train_prof.py [causal,full,window,document] [iters]

PROF_FJ_ONLY=1: flashjit's side alone (an A/B of two builds).
PROF_NO_FLEX=1: flashjit and cuDNN, no FlexAttention (no compile).
PROF_CPU=1: the host side's ops too, by self time (where the gap between
the event time and the kernels' goes).
"""
import os
import sys
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.profiler import ProfilerActivity, profile

import flashjit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from mods_cases import attention_kwargs, bench, make_cases, pick  # noqa: E402

B, H, S, D = 4, 16, 4096, 128


def step(attn, q, k, v, do):
    return torch.autograd.grad(attn(q, k, v), (q, k, v), do)


def report(label, fn, iters):
    us = bench(fn, iters)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    per = defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per[ev.name][0] += 1
            per[ev.name][1] += ev.device_time
    total = sum(t for _, t in per.values()) / iters
    print(f"prof {label}: event {us:.1f} us, kernels {total:.1f} us a call, "
          f"gap {us - total:.1f}")
    for name, (n, t) in sorted(per.items(), key=lambda x: -x[1][1]):
        print(f"    {t / n:9.1f} us x{n / iters:4.1f}  {name[:110]}")
    if os.environ.get("PROF_CPU"):
        # Where the host's time goes: the CPU side's ops by self time.
        cpu = defaultdict(lambda: [0, 0.0])
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CPU:
                cpu[ev.name][0] += 1
                cpu[ev.name][1] += ev.self_cpu_time_total
        print(f"  host, self time a call, top 12 of {len(cpu)} ops:")
        for name, (n, t) in sorted(cpu.items(), key=lambda x: -x[1][1])[:12]:
            print(f"    {t / iters:9.1f} us x{n / iters:4.1f}  {name[:110]}")


def main():
    wanted = sys.argv[1] if len(sys.argv) > 1 else "causal,full,window,document"
    iters = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    torch.manual_seed(0)
    cases = pick(make_cases(B, H, S, "cuda"), wanted)
    q, k, v, do = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
                   for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    flex = torch.compile(flex_attention, dynamic=False)
    for c in cases:
        kw = attention_kwargs(c)
        if c.block_mask:
            kw["block_mask"] = flashjit.block_mask(q, k, mask_mod=c.mask_mod, params=c.params,
                                                   causal=kw["causal"])
        report(f"{c.key} flashjit", lambda: step(
            lambda a, b, d: flashjit.attention(a, b, d, **kw), q, k, v, do), iters)
        if os.environ.get("PROF_FJ_ONLY"):
            continue
        if c.key in ("full", "causal"):
            def sdpa(a, b, d, causal=c.causal):
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(a, b, d, is_causal=causal)
            report(f"{c.key} cudnn", lambda: step(sdpa, q, k, v, do), iters)
        if os.environ.get("PROF_NO_FLEX"):
            continue
        bm = (create_block_mask(c.flex_mask, B, H, S, S, device="cuda")
              if c.flex_mask is not None else None)
        report(f"{c.key} flex", lambda: step(
            lambda a, b, d: flex(a, b, d, score_mod=c.flex_score, block_mask=bm),
            q, k, v, do), iters)


if __name__ == "__main__":
    main()
