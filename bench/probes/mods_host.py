"""Where the documents call's host time goes (issue 33: R10's 328 us gap
between the event time and the kernels of a forward + backward, H100):
issue 33's document case and the plain causal call at (4, 16, 4096, 128)
bf16, each step `torch.autograd.grad(attention(q, k, v), (q, k, v), dO)`.

Per case, medians over 30 steps, microseconds:
  fwd      the forward's host time (the GPU idle before it),
  bwd      autograd.grad's host time after a synchronisation (the GPU idle),
  bwd_ov   autograd.grad's host time right after the forward returned
           (its kernels running): bwd_ov - bwd is how long the backward's
           host side waited for the GPU,
  step     the CUDA-event time of a whole step;
the backward's host time split where the autograd Function's backward
starts and returns (pre: autograd.grad's call to the backward's entry;
py: the backward itself; post: its return to autograd.grad's), with the
thread it ran on; cuDNN's SDPA beside the causal case (bwd, bwd_ov);
then cProfile's top functions by own time over 30 steps (synchronised
after each phase, so that a wait for the GPU shows where it is).

    PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so \\
        python3 bench/probes/mods_host.py [causal,document] [steps]
"""
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

import threading

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashjit
from flashjit import _calls, _train as tr

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from mods_cases import attention_kwargs, make_cases, pick  # noqa: E402

B, H, S, D = 4, 16, 4096, 128


MARKS = []


def wrap_backward(cls):
    """cls.backward recording (start, end, thread) in MARKS."""
    inner = cls.backward

    def backward(ctx, *grads):
        t = time.perf_counter()
        got = inner(ctx, *grads)
        MARKS.append((t, time.perf_counter(), threading.get_ident()))
        return got
    cls.backward = staticmethod(backward)


def host_times(fwd, bwd, steps, event=True):
    """Medians over steps of the host times (us): the forward (the GPU idle
    before it), the backward after a synchronisation, the backward right
    after the forward returned; the CUDA-event time of a step where event;
    and where an autograd Function's backward ran (MARKS), its split:
    (pre, py, post, on the calling thread or not) per step."""
    sync = torch.cuda.synchronize
    for _ in range(5):
        bwd(fwd())
    sync()
    f_us, b_us, bo_us, st_us, split = [], [], [], [], []
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        out = fwd()
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        MARKS.clear()
        bwd(out)
        t3 = time.perf_counter()
        if MARKS:
            a, b, th = MARKS[0]
            split.append(((a - t2) * 1e6, (b - a) * 1e6, (t3 - b) * 1e6,
                          th == threading.get_ident()))
        sync()
        out = fwd()
        t4 = time.perf_counter()
        bwd(out)
        t5 = time.perf_counter()
        sync()
        if event:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            bwd(fwd())
            e.record()
            sync()
            st_us.append(s.elapsed_time(e) * 1e3)
        f_us.append((t1 - t0) * 1e6)
        b_us.append((t3 - t2) * 1e6)
        bo_us.append((t5 - t4) * 1e6)
    med = statistics.median
    return (med(f_us), med(b_us), med(bo_us), med(st_us) if st_us else None, split)


def main():
    for cls in (tr._TrainCall, tr._TrainMods):
        wrap_backward(cls)
    wanted = sys.argv[1] if len(sys.argv) > 1 else "causal,document"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
                   for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    sync = torch.cuda.synchronize
    med = statistics.median

    def bwd(out):
        return torch.autograd.grad(out, (q, k, v), do)

    for c in pick(make_cases(B, H, S, "cuda"), wanted):
        kw = attention_kwargs(c)
        if c.block_mask:
            kw["block_mask"] = flashjit.block_mask(q, k, mask_mod=c.mask_mod, params=c.params,
                                                   causal=kw["causal"])

        def fwd():
            return flashjit.attention(q, k, v, **kw)

        f, b, bo, st, split = host_times(fwd, bwd, steps)
        call = next(iter(_calls.tables.train.values()), None)
        print(f"mods_host {c.key}: native record {bool(getattr(call, 'native', 0))}")
        print(f"mods_host {c.key}: fwd {f:.1f} bwd {b:.1f} bwd_ov {bo:.1f} step {st:.1f} us")
        if split:
            print(f"mods_host {c.key} bwd split: pre {med(x[0] for x in split):.1f} "
                  f"py {med(x[1] for x in split):.1f} post {med(x[2] for x in split):.1f} us, "
                  f"on the calling thread {sum(x[3] for x in split)}/{len(split)}")
        if c.key == "causal":
            def sdpa():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            f, b, bo, _, _ = host_times(sdpa, bwd, steps, event=False)
            print(f"mods_host cudnn causal: fwd {f:.1f} bwd {b:.1f} bwd_ov {bo:.1f} us")
        prof = cProfile.Profile()
        for _ in range(steps):
            prof.enable()
            out = fwd()
            prof.disable()
            sync()
            prof.enable()
            bwd(out)
            prof.disable()
            sync()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(22)
        print(f"mods_host {c.key} cProfile over {steps} steps (own time):")
        for line in text.getvalue().splitlines():
            if line.strip() and not line.startswith(("   Ordered", "   List")):
                print("   ", line[:150])


if __name__ == "__main__":
    main()
