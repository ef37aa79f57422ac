"""Score and mask modifications beside FlexAttention, on the GPU machine.

The cases of the issue (../shared/anchors/train_flex_anchors.py, forward
only), shape (4, 16, 4096, 128) bf16: flashjit with each modification, the
same flashjit kernel without it on the same mask (timed right after each
case, and the case once more after it), FlexAttention
(torch.compile(flex_attention), its block mask) and cuDNN where SDPA has the
case.  Times: median of --iters CUDA-event timed calls after warm-up.  Each
flashjit output is compared with FlexAttention's (max |diff|).  Compile cost:
a fresh context with an empty disk cache times its first call with each
modification, then a second call with other values (a changed scalar or
window: no compile); then the same with the tiered JIT (jit_tiers=1): the
first call (the first kernel's result), and how long until the chosen
kernel answers (calls every 50 ms until first_launches stops counting).

FLASHJIT_LIB=build/libflashjit.so python3 bench/mods_compare.py [--iters 20] [--out DIR]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flashjit_ctypes as fjc  # noqa: E402


def bench(fn, iters, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    a = ap.parse_args()
    dev = torch.device("cuda")
    B, H, S, D = 4, 16, 4096, 128
    dt = torch.bfloat16
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D, device=dev, dtype=dt) for _ in range(3))
    o = torch.empty_like(q)
    slopes = torch.exp2(-8.0 * torch.arange(1, H + 1, device=dev) / H).float()
    bias = (torch.randn(H, 2 * S, device=dev, dtype=torch.float32) * 0.1).contiguous()
    doc = torch.sort(torch.randint(0, 8, (S,), device=dev)).values.int().contiguous()
    docl = doc.long()

    def causal_m(b, h, qi, ki): return qi >= ki
    def window_m(b, h, qi, ki): return (qi >= ki) & (qi - ki <= 1024)
    def doc_m(b, h, qi, ki): return (docl[qi] == docl[ki]) & (qi >= ki)
    def noop(s, b, h, qi, ki): return s
    def softcap(s, b, h, qi, ki): return 30.0 * torch.tanh(s / 30.0)
    def alibi(s, b, h, qi, ki): return s + slopes[h] * (ki - qi)
    def relbias(s, b, h, qi, ki): return s + bias[h, qi - ki + S]

    lib = fjc.load()
    fj = fjc.Flashjit(lib)
    # The document mask's block mask, built by the library on the GPU (its
    # time: the median of a.iters builds).
    mdoc = fjc.mods(mask="doc(q) == doc(kv)", params=[("doc", fjc.MOD_I32, doc)])
    pb = fj.problem(B, H, H, S, S, D, fjc.BF16, fjc.CAUSAL_TOP_LEFT)
    pb.mods = fjc.C.cast(fjc.C.pointer(mdoc), fjc.C.c_void_p)
    alloc = lambda n: torch.empty(n, dtype=torch.uint8, device=dev)  # noqa: E731
    bm = fj.block_mask(pb, 128, 128, alloc)
    build_us = bench(lambda: fj.block_mask(pb, 128, 128, alloc), a.iters)
    print(f"mods block_mask_build_us={build_us:.1f} batch={bm.batch} heads={bm.heads}", flush=True)
    mdoc.block_mask = fjc.C.cast(fjc.C.pointer(bm), fjc.C.c_void_p)
    mdoc._keep = (mdoc._keep, bm)
    # name, flex score_mod, flex mask_mod, flashjit causal, flashjit mods (None: none)
    cases = [
        ("full/noop", noop, None, fjc.CAUSAL_NONE, None),
        ("causal", noop, causal_m, fjc.CAUSAL_TOP_LEFT, None),
        ("softcap30+causal", softcap, causal_m, fjc.CAUSAL_TOP_LEFT, fjc.mods(softcap=30.0)),
        ("alibi+causal", alibi, causal_m, fjc.CAUSAL_TOP_LEFT,
         fjc.mods(score="s + slopes(h) * (float)(kv - q)", params=[("slopes", fjc.MOD_F32, slopes)])),
        ("relbias+causal", relbias, causal_m, fjc.CAUSAL_TOP_LEFT,
         fjc.mods(score="s + bias(h, q - kv + 4096)", params=[("bias", fjc.MOD_F32, bias)])),
        ("window1024+causal", noop, window_m, fjc.CAUSAL_TOP_LEFT, fjc.mods(window=(1024, 0))),
        ("document8+causal", noop, doc_m, fjc.CAUSAL_TOP_LEFT,
         fjc.mods(mask="doc(q) == doc(kv)", params=[("doc", fjc.MOD_I32, doc)])),
        ("document8+causal blocks", noop, doc_m, fjc.CAUSAL_TOP_LEFT, mdoc),
    ]
    flex = torch.compile(flex_attention, dynamic=False)
    rows = []
    plain = {}
    for name, sm, mm, causal, m in cases:
        row = {"case": name, "shape": f"{B},{H},{S},{D} bf16"}
        p = fj.problem(B, H, H, S, S, D, fjc.BF16, causal)
        if m is not None:
            p.mods = fjc.C.cast(fjc.C.pointer(m), fjc.C.c_void_p)
        pl, vname = fj.plan(p)
        row["variant"] = vname
        run = lambda: fj.fwd(p, q, k, v, o)  # noqa: E731
        row["flashjit_us"] = round(bench(run, a.iters), 1)
        out_fj = o.clone()
        # The same kernel without the modification, on the same causal mask,
        # timed again right after this case (the GPU's clocks drift over
        # the run's minutes of Flex and cuDNN), then the case once more:
        # the cost is the mean of the case's two timings over this one.
        pp = fj.problem(B, H, H, S, S, D, fjc.BF16, causal)
        near = round(bench(lambda: fj.fwd(pp, q, k, v, o), a.iters), 1)
        again = round(bench(run, a.iters), 1)
        if causal not in plain:
            plain[causal] = near
        row["flashjit_again_us"] = again
        row["flashjit_plain_us"] = near
        row["mod_cost"] = round((row["flashjit_us"] + again) / 2 / near, 3)
        row["over_unmasked"] = round(row["flashjit_us"] / plain[fjc.CAUSAL_NONE], 3) \
            if fjc.CAUSAL_NONE in plain else None
        try:
            bm = create_block_mask(mm, B=None, H=None, Q_LEN=S, KV_LEN=S, device="cuda") if mm else None
            out_flex = flex(q, k, v, score_mod=sm, block_mask=bm)
            row["flex_us"] = round(bench(lambda: flex(q, k, v, score_mod=sm, block_mask=bm), a.iters), 1)
            row["flex_over_fj"] = round(row["flex_us"] / row["flashjit_us"], 3)
            row["max_diff_vs_flex"] = float((out_fj.float() - out_flex.float()).abs().max())
        except Exception as ex:  # report, go on
            row["flex_err"] = str(ex).splitlines()[0][:200]
        if m is None:
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                row["cudnn_us"] = round(bench(lambda: F.scaled_dot_product_attention(
                    q, k, v, is_causal=causal != fjc.CAUSAL_NONE), a.iters), 1)
        rows.append(row)
        print("mods " + " ".join(f"{k_}={v_}" for k_, v_ in row.items()), flush=True)

    # Compile cost of a new modification: a fresh context, an empty disk cache.
    cold = fjc.Flashjit(lib, cache_dir=tempfile.mkdtemp(prefix="fjmods"))
    for name, _, _, causal, m in cases[2:]:
        p = cold.problem(B, H, H, S, S, D, fjc.BF16, causal)
        p.mods = fjc.C.cast(fjc.C.pointer(m), fjc.C.c_void_p)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        cold.fwd(p, q, k, v, o)
        torch.cuda.synchronize()
        first = (time.perf_counter() - t0) * 1e3
        # Other values of the same form: no compile.
        m.softcap = 50.0 if m.softcap > 0 else 0.0
        if m.window_left > 0:
            m.window_left = 512
        t0 = time.perf_counter()
        cold.fwd(p, q, k, v, o)
        torch.cuda.synchronize()
        second = (time.perf_counter() - t0) * 1e3
        row = {"case": name, "first_call_ms": round(first, 1), "changed_values_call_ms": round(second, 2)}
        rows.append(row)
        print("mods compile " + " ".join(f"{k_}={v_}" for k_, v_ in row.items()), flush=True)
    # The same with the tiered JIT: the first result, then the chosen kernel.
    # The context has run a plain call before (its layout tables probed:
    # once per device and cache directory), so each first call is a new
    # modification's alone.
    tiered = fjc.Flashjit(lib, cache_dir=tempfile.mkdtemp(prefix="fjtiers"), jit_tiers=1)

    def settle(p):
        firsts = -1
        while tiered.stats().first_launches != firsts:
            firsts = tiered.stats().first_launches
            time.sleep(0.05)
            tiered.fwd(p, q, k, v, o)
            torch.cuda.synchronize()

    settle(tiered.problem(B, H, H, S, S, D, fjc.BF16, fjc.CAUSAL_TOP_LEFT))
    for name, _, _, causal, m in cases[2:]:
        p = tiered.problem(B, H, H, S, S, D, fjc.BF16, causal)
        p.mods = fjc.C.cast(fjc.C.pointer(m), fjc.C.c_void_p)
        torch.cuda.synchronize()
        before = tiered.stats().first_launches
        t0 = time.perf_counter()
        tiered.fwd(p, q, k, v, o)
        torch.cuda.synchronize()
        first = (time.perf_counter() - t0) * 1e3
        by_first = tiered.stats().first_launches - before
        out_first = o.clone()
        # A second call at once: still the first kernel (the chosen one takes
        # a second or more), so its wall time is the first kernel's.
        t1 = time.perf_counter()
        tiered.fwd(p, q, k, v, o)
        torch.cuda.synchronize()
        second = (time.perf_counter() - t1) * 1e3
        second_by_first = tiered.stats().first_launches - before - by_first
        settle(p)
        chosen = (time.perf_counter() - t0) * 1e3
        row = {"case": name, "first_kernel_answered": by_first,
               "tiered_first_call_ms": round(first, 1),
               "second_call_ms": round(second, 2), "second_by_first_kernel": second_by_first,
               "tiered_chosen_after_ms": round(chosen, 1),
               "first_vs_chosen_max_diff": float((out_first.float() - o.float()).abs().max())}
        t1 = time.perf_counter()
        for _ in range(3):
            tiered.fwd(p, q, k, v, o)
        torch.cuda.synchronize()
        row["chosen_call_us"] = round((time.perf_counter() - t1) / 3 * 1e6, 1)
        rows.append(row)
        print("mods tiered " + " ".join(f"{k_}={v_}" for k_, v_ in row.items()), flush=True)
    with open(os.path.join(a.out, "mods_compare.json"), "w") as fh:
        json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
