"""detpg_time.py -- what the deterministic mode costs the parameters'
gradients: flashjit.attention's forward + torch.autograd.grad on
(4, 16, 4096, 128) bf16 causal, medians of 20 calls between CUDA events,
the default mode and torch.use_deterministic_algorithms(True) alternately
(two rounds), for the plain call and for a relative bias table
(rel [16, 8191] requiring grad) and ALiBi-like slopes (slope [16]).
Also checks that the deterministic gradients repeat bit for bit.
Usage: PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so python3 bench/probes/detpg_time.py"""
import statistics
import torch
import flashjit

B, H, S, D = 4, 16, 4096, 128
torch.manual_seed(0)
q, k, v, dout = (torch.randn(B, H, S, D, dtype=torch.bfloat16, device="cuda") for _ in range(4))
CASES = {
    "plain": (None, {}),
    "relbias": ("s + rel(h, q - kv + 4095)", {"rel": 0.1 * torch.randn(H, 2 * S - 1, device="cuda")}),
    "slope": ("s + slope(h) * (float)(kv - q)", {"slope": 0.01 * torch.rand(H, device="cuda")}),
}


def call(score, params):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ps = {n: t.clone().requires_grad_() for n, t in params.items()}
    kw = {"score_mod": score, "params": ps} if score else {}
    out = flashjit.attention(*leaves, causal=True, **kw)
    return torch.autograd.grad(out, leaves + list(ps.values()), dout)


def timed(score, params, n=20):
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        call(score, params)
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1000)
    return statistics.median(ts)


for name, (score, params) in CASES.items():
    torch.use_deterministic_algorithms(True)
    first = call(score, params)
    same = all(torch.equal(x, y) for x, y in zip(first, call(score, params)))
    torch.use_deterministic_algorithms(False)
    loose = call(score, params)
    err = max(((x.float() - y.float()).norm() / y.float().norm().clamp(min=1e-30)).item()
              for x, y in zip(first, loose))
    line = [f"{name}: deterministic bits repeat {same}, largest rel diff against default {err:.2e};"]
    for rnd in (1, 2):
        for det in (False, True):
            torch.use_deterministic_algorithms(det)
            timed(score, params, 3)
            line.append(f"r{rnd} {'det' if det else 'default'} {timed(score, params):.1f}")
    torch.use_deterministic_algorithms(False)
    print(" ".join(line), flush=True)
