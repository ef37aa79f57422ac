"""FP8 KV caches under 16-bit queries (issue 32's item 4): flashjit's decode
over e4m3 K and V beside its own 16-bit decode of the same shape, cuDNN's
16-bit decode through SDPA, and a device-to-device copy, in one process on
one GPU.

For each case: the plan of each (variant, splits), the median time of
--iters calls (CUDA events) eagerly and per call of 20 replayed from one
CUDA graph, the K/V bytes each actually reads (one byte an element for FP8,
two for 16-bit) over its graph time, and that rate against a copy's (bytes
read and written over the copy's time, measured in the same run, as
bench/serving_compare.py counts it).  Paged rows: the same keys in pages of
--page tokens, NHD, in a shuffled order.  The FP8 output is checked against
float32 attention of the dequantised K and V (descales per (batch, KV
head)), the first KV head's query heads.

Run on the GPU machine from the repository root, with build/ configured with
-DFLASHJIT_SHARED=ON:  python3 bench/fp8_kv_compare.py [--iters N] [--out DIR]
"""
import argparse
import ctypes as C
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flashjit_ctypes as fjc  # noqa: E402
from sdpa_compare import bench  # noqa: E402  (median of CUDA-event timings)
from serving_compare import graph_time  # noqa: E402

# (batch, heads_q, heads_kv, seq_q, seq_kv, head_dim): the issue's two bars
# first, then a long, a speculative, an MHA and decodes at d64, d96 and
# d80 (padded to 96 columns in the 16-bit tiles; the FP8 ring's products
# at every width since 966bfc6).
CASES = [
    (64, 32, 8, 1, 4096, 128),
    (1, 32, 8, 1, 32768, 128),
    (16, 32, 8, 1, 8192, 128),
    (8, 32, 8, 4, 4096, 128),
    (32, 32, 32, 1, 2048, 128),
    (64, 32, 8, 1, 4096, 64),
    (64, 32, 8, 1, 4096, 96),
    (64, 32, 8, 1, 4096, 80),
]
E4M3 = 3


def paged(k, v, page):
    """The same keys in shuffled pages (NHD): the caches, block table, strides."""
    B, Hkv, S, D = k.shape
    per = (S + page - 1) // page
    n = B * per
    perm = torch.randperm(n, device=k.device)
    kc = torch.zeros(n, page, Hkv, D, device=k.device, dtype=k.dtype)
    vc = torch.zeros_like(kc)
    pad = per * page - S
    kp = F.pad(k.view(torch.uint8), (0, 0, 0, pad)).view(k.dtype) if pad else k
    vp = F.pad(v.view(torch.uint8), (0, 0, 0, pad)).view(v.dtype) if pad else v
    kc.view(torch.uint8)[perm] = kp.permute(0, 2, 1, 3).reshape(n, page, Hkv, D).view(torch.uint8)
    vc.view(torch.uint8)[perm] = vp.permute(0, 2, 1, 3).reshape(n, page, Hkv, D).view(torch.uint8)
    table = perm.view(B, per).to(torch.int32)
    return kc, vc, table, [page * Hkv * D, D, Hkv * D], per, n


def run_one(fj, p, q, k, v, o, iters):
    plan, name = fj.plan(p)

    def run():
        fj.fwd(p, q, k, v, o, stream=torch.cuda.current_stream().cuda_stream)
    run()
    torch.cuda.synchronize()
    return dict(variant=name, splits=plan.splits, us=round(bench(run, iters, warm=10) * 1e3, 1),
                graph_us=round(graph_time(run, iters) * 1e3, 2))


def case(fj, B, H, Hkv, Sq, Skv, D, page, iters):
    dev = torch.device("cuda")
    bf = torch.bfloat16
    q = torch.randn(B, H, Sq, D, device=dev, dtype=bf)
    k16 = torch.randn(B, Hkv, Skv, D, device=dev, dtype=bf)
    v16 = torch.randn(B, Hkv, Skv, D, device=dev, dtype=bf)
    # FP8 caches: values spread over e4m3's range, descales that bring
    # them back (per (batch, KV head), as the library takes them).
    ks = (torch.rand(B, Hkv, device=dev) * 0.01 + 0.02).float()
    vs = (torch.rand(B, Hkv, device=dev) * 0.01 + 0.02).float()
    k8 = (k16.float() / ks[:, :, None, None]).to(torch.float8_e4m3fn)
    v8 = (v16.float() / vs[:, :, None, None]).to(torch.float8_e4m3fn)
    o = torch.full_like(q, float("nan"))
    row = dict(B=B, H=H, Hkv=Hkv, Sq=Sq, Skv=Skv, D=D)
    b16, b8 = 2 * k16.numel() * 2, 2 * k8.numel()
    row["kv_mb_16"], row["kv_mb_8"] = round(b16 / 1e6, 1), round(b8 / 1e6, 1)

    p16 = fj.problem(B, H, Hkv, Sq, Skv, D, fjc.BF16)
    r16 = run_one(fj, p16, q, k16, v16, o, iters)
    p8 = fj.problem(B, H, Hkv, Sq, Skv, D, fjc.BF16)
    p8.kv_dtype = E4M3
    p8.k_scale, p8.v_scale = ks.data_ptr(), vs.data_ptr()
    o.fill_(float("nan"))
    r8 = run_one(fj, p8, q, k8, v8, o, iters)
    g = H // Hkv
    kd = k8[:, :1].float() * ks[:, :1, None, None]
    vd = v8[:, :1].float() * vs[:, :1, None, None]
    with sdpa_kernel([SDPBackend.MATH]):
        ref = F.scaled_dot_product_attention(q[:, :g].float(), kd, vd, enable_gqa=g > 1)
    row["fp8_rel_err"] = float((o[:, :g].float() - ref).norm() / ref.norm())
    row["fp8_nan"] = int(torch.isnan(o).sum())
    o8 = o.clone()
    # Paged FP8: the same keys in shuffled pages; the output must equal the
    # contiguous call's.
    kc, vc, table, strides, per, n = paged(k8, v8, page)
    lens = torch.full((B,), Skv, device=dev, dtype=torch.int32)
    pp = fj.problem(B, H, Hkv, Sq, Skv, D, fjc.BF16)
    pp.kv_dtype = E4M3
    pp.k_scale, pp.v_scale = ks.data_ptr(), vs.data_ptr()
    pp.page_size, pp.max_pages, pp.num_pages = page, per, n
    pp.block_table, pp.seqused_kv = table.data_ptr(), lens.data_ptr()
    for i in range(3):
        pp.k_stride[i] = pp.v_stride[i] = strides[i]
    o.fill_(float("nan"))
    rp = run_one(fj, pp, q, kc, vc, o, iters)
    row["paged_max_diff"] = float((o.float() - o8.float()).abs().max())
    # cuDNN's 16-bit decode, for scale.
    try:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            f = lambda: F.scaled_dot_product_attention(q, k16, v16, enable_gqa=g > 1)  # noqa: E731
            row["cudnn_us"] = round(bench(f, iters) * 1e3, 1)
            row["cudnn_graph_us"] = round(graph_time(f, iters) * 1e3, 2)
    except RuntimeError as ex:
        row["cudnn_err"] = str(ex).splitlines()[0][:80]
    # A copy of the FP8 bytes: its rate counts the bytes read and written.
    src = torch.empty(b8 // 2, device=dev, dtype=torch.float16)
    dst = torch.empty_like(src)
    cms = bench(lambda: dst.copy_(src), iters)
    copy_gbs = 2 * b8 / cms / 1e6
    row["copy_us"], row["copy_gbs"] = round(cms * 1e3, 1), round(copy_gbs, 1)
    for tag, r, nb in (("bf16", r16, b16), ("fp8", r8, b8), ("fp8_paged", rp, b8)):
        for key, val in r.items():
            row[f"{tag}_{key}"] = val
        row[f"{tag}_of_copy"] = round(nb / r["graph_us"] / 1e3 / copy_gbs, 3)
    row["fp8_over_bf16"] = round(r16["graph_us"] / r8["graph_us"], 3)
    del q, k16, v16, k8, v8, kc, vc, o, src, dst
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    torch.manual_seed(0)
    lib = fjc.load()
    fj = fjc.Flashjit(lib, 0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"cudnn {torch.backends.cudnn.version()}", flush=True)
    rows = []
    for c in CASES:
        r = case(fj, *c, a.page, a.iters)
        rows.append(r)
        print(f"fp8kv ({r['B']},{r['H']}/{r['Hkv']},{r['Sq']}/{r['Skv']},{r['D']}): "
              f"fp8 {r['fp8_us']}us graph {r['fp8_graph_us']} = {r['fp8_of_copy']:.2f} of copy | "
              f"paged {r['fp8_paged_graph_us']} = {r['fp8_paged_of_copy']:.2f} | "
              f"bf16 {r['bf16_us']}us graph {r['bf16_graph_us']} = {r['bf16_of_copy']:.2f} | "
              f"fp8 over bf16 {r['fp8_over_bf16']} | cudnn {r.get('cudnn_us')} graph "
              f"{r.get('cudnn_graph_us')} | copy {r['copy_gbs']}GB/s | err {r['fp8_rel_err']:.1e} "
              f"nan {r['fp8_nan']} paged diff {r['paged_max_diff']} | {r['fp8_variant']} "
              f"splits={r['fp8_splits']} | {r['bf16_variant']} splits={r['bf16_splits']}", flush=True)
    with open(os.path.join(a.out, "fp8_kv_compare.json"), "w") as f:
        json.dump(rows, f, indent=1)
    fj.close()


if __name__ == "__main__":
    main()
