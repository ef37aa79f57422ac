"""Score and mask modifications beside FlexAttention, on the GPU machine.

The cases of the issue (../shared/anchors/train_flex_anchors.py, forward
only; their table is bench/mods_cases.py, shared with
train_mods_compare.py, the forward and backward), shape (4, 16, 4096, 128)
bf16: flashjit with each modification, the same flashjit kernel without it
on the same mask (timed right after each case, and the case once more
after it), FlexAttention (torch.compile(flex_attention), its block mask)
and cuDNN where SDPA has the case.  Times: median of --iters CUDA-event
timed calls after warm-up.  Each flashjit output is compared with
FlexAttention's (max |diff|).  Compile cost: a fresh context with an empty
disk cache times its first call with each modification, then a second call
with other values (a changed scalar or window: no compile); then the same
with the tiered JIT (jit_tiers=1): the first call (the first kernel's
result), and how long until the chosen kernel answers (calls every 50 ms
until first_launches stops counting).

FLASHJIT_LIB=build/libflashjit.so python3 bench/mods_compare.py [--iters 20] [--out DIR]
"""
import argparse
import json
import os
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flashjit_ctypes as fjc  # noqa: E402
from mods_cases import bench, make_cases, modified  # noqa: E402


def fj_mods(c):
    """The fj_mods of case c (mods_cases.Case), None where it has no
    modification (the plain kernel)."""
    if not modified(c):
        return None
    params = [(name, fjc.MOD_F32 if t.dtype == torch.float32 else fjc.MOD_I32, t)
              for name, t in (c.params or {}).items()]
    return fjc.mods(score=c.score_mod, mask=c.mask_mod, params=params,
                    window=c.window or (-1, -1), softcap=c.softcap or 0.0)


def with_block_mask(fj, m, B, H, S, D, iters, dev):
    """m with the library's block mask of its mask (built on the GPU, its
    time the median of `iters` builds, printed)."""
    pb = fj.problem(B, H, H, S, S, D, fjc.BF16, fjc.CAUSAL_TOP_LEFT)
    pb.mods = fjc.C.cast(fjc.C.pointer(m), fjc.C.c_void_p)
    alloc = lambda n: torch.empty(n, dtype=torch.uint8, device=dev)  # noqa: E731
    bm = fj.block_mask(pb, 128, 128, alloc)
    build_us = bench(lambda: fj.block_mask(pb, 128, 128, alloc), iters)
    print(f"mods block_mask_build_us={build_us:.1f} batch={bm.batch} heads={bm.heads}", flush=True)
    m.block_mask = fjc.C.cast(fjc.C.pointer(bm), fjc.C.c_void_p)
    m._keep = (m._keep, bm)
    return m


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
    table = make_cases(B, H, S, dev)
    lib = fjc.load()
    fj = fjc.Flashjit(lib)
    # name, flex score_mod, flex mask_mod, flashjit causal, flashjit mods
    # (None: none); a block-mask case twice: its expression alone, then
    # with the library's block mask ("blocks").
    cases = []
    for c in table:
        causal = fjc.CAUSAL_TOP_LEFT if c.causal else fjc.CAUSAL_NONE
        cases.append((c.name, c.flex_score, c.flex_mask, causal, fj_mods(c)))
        if c.block_mask:
            m = with_block_mask(fj, fj_mods(c), B, H, S, D, a.iters, dev)
            cases.append((c.name + " blocks", c.flex_score, c.flex_mask, causal, m))
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
