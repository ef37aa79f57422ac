"""MLA decode (issue 34, item 3): many query heads over one latent KV head of
576 columns, whose first 512 are V (DeepSeek's multi-head latent attention),
on flashjit's mma family, in one process on one GPU, beside a copy.

The latent cache is one tensor: the call passes v = k (head_dim 576,
head_dim_v 512), so the kernel reads each latent row once.  For each case:
the plan (variant, splits), the median time of --iters calls (CUDA events)
eagerly and per call of 20 replayed from one CUDA graph, and the rate of
the cache's bytes (batch x keys x 576 x 2) over the graph time against a
device-to-device copy's (bytes read and written over its time, measured in
the same run, as bench/serving_compare.py counts it).  Paged rows: the same
latent rows in shuffled pages of --page tokens.  The output is checked
against float32 attention of the same latent rows, first batch item.
With --tile-m 32, the 32-row variant (two row slices a warp) is timed too.

Run on the GPU machine from the repository root, with build/ configured with
-DFLASHJIT_SHARED=ON:  python3 bench/mla_compare.py [--iters N] [--cases 0,1]
[--out DIR]
"""
import argparse
import ctypes as C
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flashjit_ctypes as fjc  # noqa: E402
from sdpa_compare import bench  # noqa: E402  (median of CUDA-event timings)
from serving_compare import graph_time  # noqa: E402

D, DV = 576, 512
# (batch, query heads, query rows, keys): one long sequence, batches of
# 4k, the 128 heads of an unsplit model, two speculative rows.
CASES = [
    (1, 16, 1, 32768),
    (1, 16, 1, 65536),
    (64, 16, 1, 4096),
    (128, 16, 1, 2048),
    (64, 128, 1, 4096),
    (32, 16, 2, 4096),
]


def problem(fj, B, H, Sq, Skv, paged=None):
    p = fj.problem(B, H, 1, Sq, Skv, D, fjc.BF16, order=fjc.BSHD)
    p.head_dim_v = DV
    p.causal = fjc.CAUSAL_BOTTOM_RIGHT if Sq > 1 else fjc.CAUSAL_NONE
    # O has DV columns; K and V are the same latent rows (v = k).
    p.o_stride[0], p.o_stride[1], p.o_stride[2] = Sq * H * DV, DV, H * DV
    if paged:
        table, lens, page, per, n = paged
        p.page_size, p.max_pages, p.num_pages = page, per, n
        p.block_table, p.seqused_kv = table.data_ptr(), lens.data_ptr()
        strides = [page * D, D, D]
    else:
        strides = [Skv * D, D, D]
    for i in range(3):
        p.k_stride[i] = p.v_stride[i] = strides[i]
    return p


def timed(fj, p, q, kv, o, iters, variant=None):
    if variant is None:
        plan, name = fj.plan(p)
        splits = plan.splits
        run = lambda: fj.fwd(p, q, kv, kv, o, stream=torch.cuda.current_stream().cuda_stream)  # noqa: E731
    else:
        buf = C.create_string_buffer(160)
        fj.lib.fj_variant_name(C.byref(variant), buf, 160)
        name, splits = buf.value.decode(), p.splits
        run = lambda: fj.fwd_variant(p, variant, q, kv, kv, o,  # noqa: E731
                                     stream=torch.cuda.current_stream().cuda_stream)
    run()
    torch.cuda.synchronize()
    return dict(variant=name, splits=splits, us=round(bench(run, iters, warm=10) * 1e3, 1),
                graph_us=round(graph_time(run, iters) * 1e3, 2))


def case(fj, B, H, Sq, Skv, page, iters, tile_m32, dump=None):
    dev = torch.device("cuda")
    bf = torch.bfloat16
    q = torch.randn(B, Sq, H, D, device=dev, dtype=bf)
    kv = torch.randn(B, Skv, D, device=dev, dtype=bf)
    o = torch.full((B, Sq, H, DV), float("nan"), device=dev, dtype=bf)
    nbytes = kv.numel() * 2
    row = dict(B=B, H=H, Sq=Sq, Skv=Skv, cache_mb=round(nbytes / 1e6, 1))
    r = timed(fj, problem(fj, B, H, Sq, Skv), q, kv, o, iters)
    # float32 attention of the first batch item's latent rows.
    qf, kf = q[0].float().transpose(0, 1), kv[0].float()
    s = qf @ kf.T / D ** 0.5
    if Sq > 1:
        i = torch.arange(Sq, device=dev)[:, None] + (Skv - Sq)
        s = s.masked_fill(torch.arange(Skv, device=dev)[None, :] > i, float("-inf"))
    ref = torch.softmax(s, -1) @ kf[:, :DV]
    got = o[0].float().transpose(0, 1)
    row["rel_err"] = float((got - ref).norm() / ref.norm())
    row["nan"] = int(torch.isnan(o).sum())
    o0 = o.clone()
    if dump:  # the contiguous call's output, for a bitwise comparison between builds
        torch.save(o0.cpu(), os.path.join(dump, f"mla_{B}_{H}_{Sq}_{Skv}.pt"))
    # Paged: the same rows in shuffled pages; the output must equal o0's.
    per = (Skv + page - 1) // page
    n = B * per
    perm = torch.randperm(n, device=dev)
    cache = torch.zeros(n, page, D, device=dev, dtype=bf)
    pad = per * page - Skv
    kvp = torch.nn.functional.pad(kv, (0, 0, 0, pad)) if pad else kv
    cache[perm] = kvp.reshape(n, page, D)
    table = perm.view(B, per).to(torch.int32)
    lens = torch.full((B,), Skv, device=dev, dtype=torch.int32)
    o.fill_(float("nan"))
    rp = timed(fj, problem(fj, B, H, Sq, Skv, (table, lens, page, per, n)), q, cache, o, iters)
    row["paged_max_diff"] = float((o.float() - o0.float()).abs().max())
    runs = [("mla", r), ("paged", rp)]
    if tile_m32 and Sq * H >= 32:
        v, _, _ = fj.variant(problem(fj, B, H, Sq, Skv))
        v.tile_m = 32
        p = problem(fj, B, H, Sq, Skv)
        p.splits = max(1, r["splits"])
        v.split_kv = int(p.splits > 1)
        o.fill_(float("nan"))
        runs.append(("m32", timed(fj, p, q, kv, o, iters, v)))
        row["m32_max_diff"] = float((o.float() - o0.float()).abs().max())
    src = torch.empty(nbytes // 2, device=dev, dtype=torch.float16)
    dst = torch.empty_like(src)
    cms = bench(lambda: dst.copy_(src), iters)
    copy_gbs = 2 * nbytes / cms / 1e6
    row["copy_us"], row["copy_gbs"] = round(cms * 1e3, 1), round(copy_gbs, 1)
    for tag, x in runs:
        for key, val in x.items():
            row[f"{tag}_{key}"] = val
        row[f"{tag}_of_copy"] = round(nbytes / x["graph_us"] / 1e3 / copy_gbs, 3)
        # 2 x (576 + 512) FLOPs a query row and key
        row[f"{tag}_tflops"] = round(2 * B * H * Sq * Skv * (D + DV) / x["graph_us"] / 1e6, 1)
    del q, kv, o, cache, src, dst
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--page", type=int, default=64)
    ap.add_argument("--tile-m", type=int, default=0)
    ap.add_argument("--cases", default="",
                    help="comma-separated indices into CASES (default: all)")
    ap.add_argument("--dump", default="",
                    help="a folder to save each case's contiguous output in (torch.save)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    torch.manual_seed(0)
    lib = fjc.load()
    fj = fjc.Flashjit(lib, 0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    rows = []
    picked = [CASES[int(i)] for i in a.cases.split(",")] if a.cases else CASES
    for c in picked:
        r = case(fj, *c, a.page, a.iters, a.tile_m == 32, a.dump or None)
        rows.append(r)
        extra = (f" | m32 {r['m32_graph_us']} = {r['m32_of_copy']:.2f} diff {r['m32_max_diff']}"
                 if "m32_graph_us" in r else "")
        print(f"mla ({r['B']},{r['H']}/1,{r['Sq']}/{r['Skv']},576/512): {r['mla_us']}us graph "
              f"{r['mla_graph_us']} = {r['mla_of_copy']:.2f} of copy, {r['mla_tflops']} TF | paged "
              f"{r['paged_graph_us']} = {r['paged_of_copy']:.2f} | copy {r['copy_gbs']}GB/s | err "
              f"{r['rel_err']:.1e} nan {r['nan']} paged diff {r['paged_max_diff']}{extra} | "
              f"{r['mla_variant']} splits={r['mla_splits']}", flush=True)
    with open(os.path.join(a.out, "mla_compare.json"), "w") as f:
        json.dump(rows, f, indent=1)
    fj.close()


if __name__ == "__main__":
    main()
