"""Variable-length batches and the paged KV cache, each beside the dense
problem it should cost the same as, in one process on one GPU.

  paged decode   (64, 32/8, 1, 4096, d128, bf16): K/V in pages of --page
                 tokens in a shuffled order, against the same problem with
                 contiguous K/V (flashjit's own, and SDPA's cuDNN backend
                 for scale); the bar is paged within 10% of contiguous.
  varlen prefill 16 sequences of mixed lengths, 16384 tokens in all, d128,
                 causal, packed tokens: against the equal-length batch of
                 the same FLOPs (16 sequences of sqrt(mean L^2) tokens),
                 both as the library chooses and with the varlen kernel's
                 own variant (the dense problem on the mma family), since
                 the dense batch alone may take the wgmma family.

Outputs are checked: paged against contiguous (the same keys gathered), and
varlen sequence by sequence against SDPA's math backend (float32, first
head). Times are medians of --iters CUDA-event timings (sdpa_compare.bench).

Run on the GPU machine from the repository root, with build/ configured
with -DFLASHJIT_SHARED=ON:  python3 bench/varlen_compare.py [--iters N] [--out DIR]
"""
import argparse
import ctypes as C
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flashjit_ctypes as fjc  # noqa: E402
from sdpa_compare import bench  # noqa: E402

LENGTHS = [3072, 2048, 1536, 1536, 1024, 1024, 1024, 768,
           768, 768, 640, 512, 512, 512, 384, 256]
assert sum(LENGTHS) == 16384


def paged_decode(fj, B, H, Hkv, Skv, D, page, iters, layout="nhd"):
    dev, dt = torch.device("cuda"), torch.bfloat16
    q = torch.randn(B, H, 1, D, device=dev, dtype=dt)
    k = torch.randn(B, Hkv, Skv, D, device=dev, dtype=dt)
    v = torch.randn(B, Hkv, Skv, D, device=dev, dtype=dt)
    o = torch.full_like(q, float("nan"))
    dense = fj.problem(B, H, Hkv, 1, Skv, D, fjc.BF16)
    run_dense = lambda: fj.fwd(dense, q, k, v, o)  # noqa: E731
    run_dense()
    want = o.clone()
    # The same keys in pages: sequence b's page i is perm[b * per + i].
    per = (Skv + page - 1) // page
    n_pages = B * per
    perm = torch.randperm(n_pages, device=dev, dtype=torch.int64)
    table = perm.view(B, per).to(torch.int32).contiguous()
    # NHD pages [n_pages][page][Hkv][D] (vLLM, FlashInfer's default), or
    # HND [n_pages][Hkv][page][D] (a head's tokens of a page contiguous).
    if layout == "nhd":
        kc = torch.zeros(n_pages, page, Hkv, D, device=dev, dtype=dt)
        kt = k.permute(0, 2, 1, 3).reshape(B, per, page, Hkv, D)
        vt = v.permute(0, 2, 1, 3).reshape(B, per, page, Hkv, D)
        strides = [page * Hkv * D, D, Hkv * D]
    else:
        kc = torch.zeros(n_pages, Hkv, page, D, device=dev, dtype=dt)
        kt = k.reshape(B, Hkv, per, page, D).permute(0, 2, 1, 3, 4)
        vt = v.reshape(B, Hkv, per, page, D).permute(0, 2, 1, 3, 4)
        strides = [Hkv * page * D, page * D, D]
    vc = torch.zeros_like(kc)
    kc[perm.view(B, per)] = kt
    vc[perm.view(B, per)] = vt
    used = torch.full((B,), Skv, device=dev, dtype=torch.int32)
    p = fj.problem(B, H, Hkv, 1, Skv, D, fjc.BF16)
    p.block_table, p.seqused_kv = table.data_ptr(), used.data_ptr()
    p.page_size, p.max_pages, p.num_pages = page, per, n_pages
    p.k_stride[:] = p.v_stride[:] = strides
    plan, name = fj.plan(p)
    o.fill_(float("nan"))
    run_paged = lambda: fj.fwd(p, q, kc, vc, o)  # noqa: E731
    run_paged()
    torch.cuda.synchronize()
    diff = float((o.float() - want.float()).abs().max())
    row = dict(case="paged decode", B=B, H=H, Hkv=Hkv, Skv=Skv, D=D, page=page, layout=layout,
               variant=name, splits=plan.splits, max_abs_diff_vs_contiguous=diff,
               nan=int(torch.isnan(o).sum()))
    row["paged_us"] = round(bench(run_paged, iters, warm=10) * 1e3, 1)
    row["contiguous_us"] = round(bench(run_dense, iters, warm=10) * 1e3, 1)
    # The same keys contiguous in the token-major order (BSHD), whose rows
    # of one head are as far apart as NHD pages'.
    kb, vb = (t.permute(0, 2, 1, 3).contiguous() for t in (k, v))
    qb = q.permute(0, 2, 1, 3).contiguous()
    ob = torch.empty_like(qb)
    bshd = fj.problem(B, H, Hkv, 1, Skv, D, fjc.BF16, fjc.CAUSAL_NONE, fjc.BSHD)
    row["contiguous_bshd_us"] = round(bench(lambda: fj.fwd(bshd, qb, kb, vb, ob), iters,
                                            warm=10) * 1e3, 1)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        row["cudnn_us"] = round(bench(lambda: F.scaled_dot_product_attention(
            q, k, v, enable_gqa=True), iters) * 1e3, 1)
    row["paged_over_contiguous"] = round(row["paged_us"] / row["contiguous_us"], 3)
    kv_bytes = 2 * k.numel() * k.element_size()
    row["paged_gbs"] = round(kv_bytes / row["paged_us"] / 1e3, 1)
    return row


def varlen_prefill(fj, H, D, iters):
    dev, dt = torch.device("cuda"), torch.bfloat16
    n, total, mx = len(LENGTHS), sum(LENGTHS), max(LENGTHS)
    cu = torch.tensor([0] + list(torch.tensor(LENGTHS).cumsum(0)), device=dev,
                      dtype=torch.int32)
    q = torch.randn(total, H, D, device=dev, dtype=dt)
    k = torch.randn(total, H, D, device=dev, dtype=dt)
    v = torch.randn(total, H, D, device=dev, dtype=dt)
    o = torch.full_like(q, float("nan"))
    p = fj.problem(n, H, H, mx, mx, D, fjc.BF16, fjc.CAUSAL_BOTTOM_RIGHT, fjc.THD)
    p.cu_seqlens_q = p.cu_seqlens_kv = cu.data_ptr()
    # Without the packed tensors' totals the mma family takes it; with them
    # (TMA must know where a tensor ends) the wgmma family can.
    _, mma_name = fj.plan(p)
    run_mma = lambda: fj.fwd(p, q, k, v, o)  # noqa: E731
    mma_us = round(bench(run_mma, iters, warm=5) * 1e3, 1)
    p.total_q = p.total_kv = total
    plan, name = fj.plan(p)
    run_vl = lambda: fj.fwd(p, q, k, v, o)  # noqa: E731
    o.fill_(float("nan"))
    run_vl()
    torch.cuda.synchronize()
    # Each sequence against SDPA's math backend, first head, float32.
    err, c0 = 0.0, 0
    for L in LENGTHS:
        qs, ks, vs = (t[c0:c0 + L, :1].permute(1, 0, 2).float() for t in (q, k, v))
        with sdpa_kernel([SDPBackend.MATH]):
            ref = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
        got = o[c0:c0 + L, :1].permute(1, 0, 2).float()
        err = max(err, float((got - ref).norm() / ref.norm()))
        c0 += L
    # The equal-length batch of the same causal FLOPs.
    leq = int(round(math.sqrt(sum(L * L for L in LENGTHS) / n) / 64)) * 64
    qd = torch.randn(n, H, leq, D, device=dev, dtype=dt)
    kd, vd = torch.randn_like(qd), torch.randn_like(qd)
    od = torch.empty_like(qd)
    dense = fj.problem(n, H, H, leq, leq, D, fjc.BF16, fjc.CAUSAL_BOTTOM_RIGHT)
    _, dense_name = fj.plan(dense)
    same = fjc.Variant.from_buffer_copy(plan.variant)
    same.varlen = 0
    row = dict(case="varlen prefill", n=n, total=total, H=H, D=D, lengths=LENGTHS,
               variant=name, dense_len=leq, dense_variant=dense_name,
               mma_variant=mma_name, varlen_mma_us=mma_us,
               rel_err=err, nan=int(torch.isnan(o).sum()),
               flops_ratio=round(sum(L * L for L in LENGTHS) / (n * leq * leq), 3))
    row["varlen_us"] = round(bench(run_vl, iters, warm=5) * 1e3, 1)
    row["dense_us"] = round(bench(lambda: fj.fwd(dense, qd, kd, vd, od), iters, warm=5) * 1e3, 1)
    row["dense_same_variant_us"] = round(bench(
        lambda: fj.fwd_variant(dense, same, qd, kd, vd, od), iters, warm=5) * 1e3, 1)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        row["cudnn_dense_us"] = round(bench(lambda: F.scaled_dot_product_attention(
            qd, kd, vd, is_causal=True), iters) * 1e3, 1)
    row["varlen_over_dense"] = round(row["varlen_us"] / row["dense_us"], 3)
    row["varlen_over_dense_same_variant"] = round(
        row["varlen_us"] / row["dense_same_variant_us"], 3)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    torch.manual_seed(0)
    lib = fjc.load()
    fj = fjc.Flashjit(lib, 0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"cudnn {torch.backends.cudnn.version()}", flush=True)
    rows = []
    for page, layout in ((16, "nhd"), (16, "hnd"), (1, "nhd"), (64, "nhd"), (64, "hnd"),
                         (256, "nhd")):
        r = paged_decode(fj, 64, 32, 8, 4096, 128, page, a.iters, layout)
        rows.append(r)
        print(f"varlen paged decode (64,32/8,1/4096,128) page {page} {layout}: paged "
              f"{r['paged_us']}us ({r['paged_gbs']}GB/s) contiguous {r['contiguous_us']}us "
              f"(bshd {r['contiguous_bshd_us']}us) cudnn {r['cudnn_us']}us "
              f"| paged/contiguous {r['paged_over_contiguous']} | max diff "
              f"{r['max_abs_diff_vs_contiguous']:.1e} nan {r['nan']} | {r['variant']} "
              f"splits={r['splits']}", flush=True)
    r = varlen_prefill(fj, 16, 128, a.iters)
    rows.append(r)
    print(f"varlen prefill 16 seqs / {r['total']} tokens (16 heads, d128, causal): varlen "
          f"{r['varlen_us']}us | dense 16x{r['dense_len']} (flops x{r['flops_ratio']}) "
          f"{r['dense_us']}us [{r['dense_variant']}], same variant {r['dense_same_variant_us']}us,"
          f" cudnn {r['cudnn_dense_us']}us | varlen/dense {r['varlen_over_dense']}, "
          f"/same {r['varlen_over_dense_same_variant']} | err {r['rel_err']:.1e} nan {r['nan']}"
          f" | {r['variant']} | without totals {r['varlen_mma_us']}us [{r['mma_variant']}]",
          flush=True)
    with open(os.path.join(a.out, "varlen_compare.json"), "w") as f:
        json.dump(rows, f, indent=1)
    fj.close()


if __name__ == "__main__":
    main()
