"""The package's forward on issue 33's document case ((4, 16, 4096, 128)
bf16, causal, 8 sorted documents, the library's 128 x 128 block mask):
GPU time per call (CUDA events over 50 calls) and host time per call
(wall time of 50 calls issued with no wait, the GPU's queue kept short by
a sync every 50), eager with no grad, with the graph built (q, k, v
requiring grad), and the plain causal call beside it."""
import sys
import time
import torch
import flashjit

S, B, H, D = 4096, 4, 16, 128
torch.manual_seed(0)
dev = "cuda"
q, k, v = (torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
doc = torch.sort(torch.randint(0, 8, (S,), device=dev)).values.int().contiguous()
bm = flashjit.block_mask(q, k, mask_mod="doc(q) == doc(kv)", params={"doc": doc}, causal=True)
calls = {
    "causal": lambda a, b, c: flashjit.attention(a, b, c, causal=True),
    "docbm": lambda a, b, c: flashjit.attention(a, b, c, causal=True, mask_mod="doc(q) == doc(kv)",
                                              params={"doc": doc}, block_mask=bm),
    "docnobm": lambda a, b, c: flashjit.attention(a, b, c, causal=True, mask_mod="doc(q) == doc(kv)",
                                                params={"doc": doc}),
}


def gpu_us(f, n=50):
    for _ in range(3):
        f()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    e0.record()
    for _ in range(n):
        f()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) * 1000 / n


def host_us(f, n=50):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        f()
    t = time.perf_counter() - t
    torch.cuda.synchronize()
    return t * 1e6 / n


for name, f in calls.items():
    for grad in (False, True):
        a, b, c = (x.detach().requires_grad_(grad) for x in (q, k, v))
        g = lambda: f(a, b, c)  # noqa: E731
        ctx = torch.enable_grad() if grad else torch.no_grad()
        with ctx:
            print(f"fwd_host {name} grad={int(grad)} gpu_us={gpu_us(g):.1f} host_us={host_us(g):.1f}")
