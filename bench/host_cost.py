"""Where a flashjit call's host time goes, and issue 37's bars beside SDPA.

    python3 bench/host_cost.py [--iters 1000] [--rounds 5] [--out DIR] [--no-model]

From the repository root on a GPU machine, with the package importable
(PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so, or installed).

1. The bars: host time per call -- the median of --iters calls, each
   timed alone with time.perf_counter_ns, no synchronisation between
   calls, the best of --rounds interleaved rounds -- of flashjit.attention
   against F.scaled_dot_product_attention on (1, 8, 128, 64) bf16, eager
   and inside a torch.compile'd function (one attention call: the compiled
   graph's own cost of the op), and of the serving calls
   (attention_with_kvcache, paged decode; attention_varlen), whose bar is
   1.2x attention's.
2. The phases of one eager flashjit.attention call on that shape, each
   timed alone the same way: the lookup of the call (attention() with its
   launch stubbed), the output's allocation, the pointers and the stream,
   the ctypes call of the library with its launch, ctypes alone (the same
   call refused at once: no context); the op through PyTorch's
   dispatcher and without it (what a compiled graph pays); and what a
   first call of a signature pays once: the checks, the problem, the plan,
   the whole entry.
3. The model of examples/gpt_flashjit.py (4 layers, dim 512, heads 8/2,
   seq 512, batch 2, bf16), forward under torch.no_grad(): eager,
   torch.compile and torch.compile(mode="reduce-overhead"), flashjit's
   attention against SDPA's: ms per forward (wall time of 50 forwards
   back to back, median of --rounds), and the largest difference of the
   logits from SDPA's eager ones.

Prints the tables and writes host_cost.json to --out (default: .).
"""
import argparse
import ctypes as C
import json
import os
import statistics
import sys
import time
import types
from unittest import mock

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
import flashjit  # noqa: E402
from flashjit import _args as ar  # noqa: E402
from flashjit import _calls as calls  # noqa: E402
from flashjit import _torch as fjt  # noqa: E402

ns = time.perf_counter_ns


def per_call(fn, iters):
    """The median host time of one call of fn, in microseconds."""
    ts = [0] * iters
    for i in range(iters):
        t0 = ns()
        fn()
        ts[i] = ns() - t0
    return statistics.median(ts) / 1e3


def rounds(cases, iters, n):
    """{name: best median over n interleaved rounds} of (name, fn) cases,
    each warmed first; the GPU drains between rounds."""
    for _, fn in cases:
        for _ in range(20):
            fn()
    torch.cuda.synchronize()
    best = {}
    for _ in range(n):
        for name, fn in cases:
            us = per_call(fn, iters)
            best[name] = min(best.get(name, us), us)
            torch.cuda.synchronize()
    return best


def table(title, rows, unit="us"):
    print(f"\n{title}")
    width = max(len(r[0]) for r in rows)
    for name, value, *note in rows:
        text = f"{value:9.2f} {unit}" if isinstance(value, float) else f"{value:>12}"
        print(f"  {name:{width}s} {text}  {note[0] if note else ''}")


def bars(a):
    dev = torch.device("cuda")
    q, k, v = (torch.randn(1, 8, 128, 64, dtype=torch.bfloat16, device=dev) for _ in range(3))

    def compiled(fn):
        f = torch.compile(fn, fullgraph=True)
        f(q, k, v)
        return lambda: f(q, k, v)

    # Serving: a paged decode (8 sequences, 16-token pages) and a varlen
    # prefill of four short sequences, small enough that the GPU keeps up.
    qd = torch.randn(8, 1, 8, 64, dtype=torch.bfloat16, device=dev)
    pages = torch.randn(64, 16, 2, 64, dtype=torch.bfloat16, device=dev)
    table_ = torch.randperm(64, device=dev, dtype=torch.int32).view(8, 8)
    lens = torch.randint(1, 129, (8,), device=dev, dtype=torch.int32)
    lengths = [32, 64, 16, 16]
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32,
                      device=dev)
    qv, kv = (torch.randn(128, 8, 64, dtype=torch.bfloat16, device=dev) for _ in range(2))
    cases = [
        ("flashjit.attention", lambda: flashjit.attention(q, k, v)),
        ("F.scaled_dot_product_attention", lambda: F.scaled_dot_product_attention(q, k, v)),
        ("flashjit.attention causal", lambda: flashjit.attention(q, k, v, causal=True)),
        ("SDPA is_causal", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
        ("torch.compile: flashjit.attention",
         compiled(lambda q, k, v: flashjit.attention(q, k, v))),
        ("torch.compile: SDPA", compiled(lambda q, k, v: F.scaled_dot_product_attention(q, k,
                                                                                        v))),
        ("attention_with_kvcache (paged decode)",
         lambda: flashjit.attention_with_kvcache(qd, pages, pages, cache_seqlens=lens,
                                                 block_table=table_, causal=True)),
        ("attention_varlen", lambda: flashjit.attention_varlen(qv, kv, kv, cu, cu, 64, 64,
                                                               causal=True)),
    ]
    got = rounds(cases, a.iters, a.rounds)
    att = got["flashjit.attention"]
    rows = []
    for i in (0, 2, 4):
        (fj, _), (sdpa, _) = cases[i], cases[i + 1]
        rows += [(fj, got[fj]), (sdpa, got[sdpa], f"flashjit / SDPA = {got[fj] / got[sdpa]:.2f}")]
    for name, _ in cases[6:]:
        rows.append((name, got[name], f"/ flashjit.attention = {got[name] / att:.2f} (bar 1.2)"))
    table(f"Host time per call (median of {a.iters}, best of {a.rounds} rounds), "
          "(1, 8, 128, 64) bf16", rows)
    return got


def phases(a):
    dev = torch.device("cuda")
    q, k, v = (torch.randn(1, 8, 128, 64, dtype=torch.bfloat16, device=dev) for _ in range(3))
    calls.tables.plain.clear()
    flashjit.attention(q, k, v)
    e = next(iter(calls.tables.plain.values()))
    o = calls.opts("dense")
    text = calls.encode(o)
    out = torch.empty_like(q)
    ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr())
    stream = calls.stream(0)
    fns = calls.fns()
    lib = flashjit._core.lib()
    plan = flashjit._capi.Plan()
    ctx = flashjit._core.gpu_context(0)
    p = ar._problem(q, k, v, 0, 0.0, 0)

    def lookup():  # attention() with its launch stubbed
        with mock.patch.object(calls, "forward", lambda *args: (None, None)):
            return per_call(lambda: flashjit.attention(q, k, v), a.iters)

    cases = [
        ("whole eager call: flashjit.attention(q, k, v)", lambda: flashjit.attention(q, k, v)),
        ("  the cached call: calls.forward(entry, ...)",
         lambda: calls.forward(e, q, k, v, ())),
        ("  output allocated (empty_like, contiguous)",
         lambda: torch.empty_like(q, memory_format=torch.contiguous_format)),
        ("  pointers (4 data_ptr) and the stream",
         lambda: (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), calls.stream(0))),
        ("  library call + launch (ctypes included)",
         lambda: fns.fwd(e.ctx, e.p_addr, *ptrs, None, stream)),
        ("  ctypes alone (the same call refused: no context)",
         lambda: fns.fwd(None, e.p_addr, *ptrs, None, stream)),
        ("op through the dispatcher: torch.ops.flashjit.attention",
         lambda: torch.ops.flashjit.attention.default(q, k, v, [], text)),
        ("  the op's kernel alone (_torch._op)", lambda: fjt._op(q, k, v, [], text)),
        ("  options text decoded (remembered)", lambda: calls.decode(text)),
        ("  the call's entry found by its signature",
         lambda: calls.entry(o, False, q, k, v, ())),
        ("first call of a signature: the checks", lambda: ar.check_inputs(q, k, v, 0)),
        ("  the problem (fj_problem_init, strides)", lambda: ar._problem(q, k, v, 0, 0.0, 0)),
        ("  the plan (fj_attention_plan)",
         lambda: lib.fj_attention_plan(ctx, C.byref(p), C.byref(plan))),
        ("  the whole entry (checks, problem, plan)",
         lambda: fjt._build_dense(o, False, q, k, v, ())),
    ]
    got = rounds(cases, a.iters, a.rounds)
    got["  the call's lookup (attention() with forward stubbed)"] = lookup()
    order = [c[0] for c in cases[:1]] + ["  the call's lookup (attention() with forward "
                                         "stubbed)"] + [c[0] for c in cases[1:]]
    table("Phases of one call (each timed alone)", [(n, got[n]) for n in order])
    return got


def model(a):
    import gpt_flashjit as gpt
    c = gpt.Config(types.SimpleNamespace(vocab=4096, dim=512, layers=4, heads=8, kv_heads=2,
                                         seq=512))
    torch.manual_seed(0)
    base = gpt.GPT(c).cuda()
    for p in base.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.02)
    tokens = torch.randint(0, c.vocab, (2, c.seq), device="cuda")
    rows, got, want = [], {}, None
    with torch.no_grad():
        for mode in ("eager", "default", "reduce-overhead"):
            for name, cls in (("sdpa", gpt.CausalSelfAttention),
                              ("flashjit", gpt.FlashjitAttention)):
                m = gpt.copy_as(base, cls, torch.bfloat16, c)
                if mode != "eager":
                    torch._dynamo.reset()
                    m = torch.compile(m, mode=None if mode == "default" else mode)
                for _ in range(5):
                    logits = m(tokens)
                torch.cuda.synchronize()
                if want is None:
                    want = logits.float().clone()
                diff = (logits.float() - want).abs().max().item()
                ms = []
                for _ in range(a.rounds):
                    t0 = ns()
                    for _ in range(50):
                        m(tokens)
                    torch.cuda.synchronize()
                    ms.append((ns() - t0) / 50 / 1e6)
                got[f"{mode} {name}"] = statistics.median(ms)
                if a.trace and mode == "default":
                    trace(a, m, tokens, name)
                rows.append((f"{mode:15s} {name}", statistics.median(ms),
                             f"max |logits - SDPA eager's| {diff:.3g}"))
    for mode in ("eager", "default", "reduce-overhead"):
        rows.append((f"{mode:15s} flashjit / sdpa",
                     got[f"{mode} flashjit"] / got[f"{mode} sdpa"], ""))
    table("examples/gpt_flashjit.py's model, forward (ms per forward, median of rounds)",
          [(n, float(v), *x) for n, v, *x in rows], unit="ms")
    return got


def trace(a, m, tokens, name):
    """A profiler trace of 10 compiled forwards (CPU and CUDA): the Chrome
    trace to $OUT/trace_<name>.json and the host's busiest operators."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            m(tokens)
        torch.cuda.synchronize()
    prof.export_chrome_trace(os.path.join(a.out, f"trace_{name}.json"))
    print(f"torch.compile'd forward, {name}: the 8 operators with the most host time "
          "(10 forwards)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8,
                                    max_name_column_width=48))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=".")
    ap.add_argument("--no-model", action="store_true", help="skip the GPT model's timings")
    ap.add_argument("--trace", action="store_true",
                    help="profile the compiled model's forwards (Chrome traces to --out)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("host_cost.py needs a CUDA GPU", file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; flashjit "
          f"{flashjit.library_version()} ({flashjit.library_path()})")
    result = {"bars": bars(a), "phases": phases(a)}
    if not a.no_model:
        result["model"] = model(a)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "host_cost.json"), "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
