"""Where a block-masked call's time goes (issue 14's documents case).

The documents case of bench/mods_compare.py (4 x 16 x 4096, d128, bf16,
causal, 8 sorted documents) through the library-built block mask; the same
lists without the mask expression (what the expression costs); then
synthetic lists of n full key blocks per query block (n = 1, 2, 4, 8, 16,
no causal mask, no expression): the time against n gives a row tile's
fixed cost (its start, its last product, its epilogue) and the cost of one
key block, the two numbers a block-sparse call's time is made of.

Run on the GPU machine from the repository root, with build/ configured
with -DFLASHJIT_SHARED=ON:  python3 bench/docs_probe.py [--iters N]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flashjit_ctypes as fjc  # noqa: E402
from mods_compare import bench  # noqa: E402


def synthetic(nq, nkv, n, dev):
    """A block mask of one list for all batch rows and heads: query block i
    keeps key blocks i, i - 1, ..., i - n + 1 (wrapping past 0) whole."""
    full_num = torch.full((nq,), min(n, nkv), dtype=torch.int32, device=dev)
    idx = torch.zeros(nq, nkv, dtype=torch.int32, device=dev)
    for i in range(nq):
        for j in range(min(n, nkv)):
            idx[i, j] = (i - j) % nkv
    zero = torch.zeros(nq, dtype=torch.int32, device=dev)
    bm = fjc.BlockMask()
    bm.block_q, bm.block_kv, bm.batch, bm.heads = 128, 128, 1, 1
    bm.q_blocks, bm.kv_blocks = nq, nkv
    bm.kv_num, bm.kv_indices = zero.data_ptr(), idx.data_ptr()
    bm.full_num, bm.full_indices = full_num.data_ptr(), idx.data_ptr()
    bm._keep = (full_num, idx, zero)
    return bm


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=30)
    a = ap.parse_args()
    dev = torch.device("cuda")
    B, H, S, D = 4, 16, 4096, 128
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    doc = torch.sort(torch.randint(0, 8, (S,), device=dev)).values.int().contiguous()
    fj = fjc.Flashjit(fjc.load())
    alloc = lambda n: torch.empty(n, dtype=torch.uint8, device=dev)  # noqa: E731
    tiles = B * H * (S // 128)
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def timed(label, m, causal):
        p = fj.problem(B, H, H, S, S, D, fjc.BF16, causal)
        if m is not None:
            p.mods = fjc.C.cast(fjc.C.pointer(m), fjc.C.c_void_p)
        _, name = fj.plan(p)
        us = bench(lambda: fj.fwd(p, q, k, v, o), a.iters)
        print(f"docs {label}: {us:.1f} us, {us * sms / tiles:.2f} us per row tile per SM ({name})",
              flush=True)
        return us

    timed("unmasked", None, fjc.CAUSAL_NONE)
    timed("causal", None, fjc.CAUSAL_TOP_LEFT)
    mdoc = fjc.mods(mask="doc(q) == doc(kv)", params=[("doc", fjc.MOD_I32, doc)])
    pb = fj.problem(B, H, H, S, S, D, fjc.BF16, fjc.CAUSAL_TOP_LEFT)
    pb.mods = fjc.C.cast(fjc.C.pointer(mdoc), fjc.C.c_void_p)
    bm = fj.block_mask(pb, 128, 128, alloc)
    mdoc.block_mask = fjc.C.cast(fjc.C.pointer(bm), fjc.C.c_void_p)
    mdoc._keep = (mdoc._keep, bm)
    timed("documents, lists and expression", mdoc, fjc.CAUSAL_TOP_LEFT)
    bare = fjc.mods()
    bare.block_mask = fjc.C.cast(fjc.C.pointer(bm), fjc.C.c_void_p)
    bare._keep = (bare._keep, bm)
    timed("documents' lists, no expression", bare, fjc.CAUSAL_TOP_LEFT)
    pts = []
    for n in (1, 2, 4, 8, 16):
        m = fjc.mods()
        sbm = synthetic(S // 128, S // 128, n, dev)
        m.block_mask = fjc.C.cast(fjc.C.pointer(sbm), fjc.C.c_void_p)
        m._keep = (m._keep, sbm)
        pts.append((n, timed(f"{n} full blocks a row", m, fjc.CAUSAL_NONE)))
    # Least squares: per row tile per SM = fixed + n x per block.
    xs = [n for n, _ in pts]
    ys = [us * sms / tiles for _, us in pts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    print(f"docs fit: a row tile costs {my - slope * mx:.2f} us fixed + {slope:.2f} us a key block "
          f"(per SM; {tiles} row tiles on {sms} SMs)", flush=True)


if __name__ == "__main__":
    main()
