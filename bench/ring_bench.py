"""Ring attention over two GPUs beside the single-GPU call (issue 39).

Every rank makes the same full q, k, v and dO (one seed), cuts its shard
(flashjit.distributed.shard: --order zigzag by default, the balanced order
for a causal mask) and times flashjit.distributed.ring_attention forward,
and forward + backward, with CUDA events after warm-up (median of --iters;
a barrier before each run, the slowest rank's time counted).  Then rank 0
alone times flashjit.attention on the whole sequence (forward, forward +
backward) on its GPU, and compares the ring's output and gradients,
gathered from the ranks, with it.  FLOPs 4*B*H*S^2*D for the forward (half
for causal), 2.5 x that for the backward.  Prints one line a measurement
and the speedups; writes ring_bench.json to --out.

Default shape: (1, 32/8, 131072, 128) causal bf16 (GQA 32 query heads on
8 KV heads).  Run on a machine with two GPUs from the repository root, the
package importable (PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so,
or the wheel):
    torchrun --standalone --nproc-per-node 2 bench/ring_bench.py [--seq 131072]
        [--heads 32 --heads-kv 8 --dim 128] [--order zigzag|contiguous]
        [--no-causal] [--dtype bf16|f16] [--iters 10] [--no-backward] [--out DIR]
(python3 -m torch.distributed.run is torchrun where the script is not on PATH.)
"""
import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist

import flashjit
import flashjit.distributed as fjd


def timed(fn, iters, warm, world):
    """Median over iters of the slowest rank's time of fn (ms)."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        if world > 1:
            dist.barrier()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        t = torch.tensor([s.elapsed_time(e)], device="cuda")
        if world > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        ts.append(t.item())
    return statistics.median(ts)


def gather(t, lens, order):
    """The full tensor from every rank's shard (dim 2), on every rank:
    shards padded to the longest for all_gather, then cut and unsharded."""
    n = max(lens)
    pad = torch.zeros(t.shape[:2] + (n,) + t.shape[3:], dtype=t.dtype, device=t.device)
    pad[:, :, :t.shape[2]] = t
    got = [torch.empty_like(pad) for _ in lens]
    dist.all_gather(got, pad)
    return fjd.unshard([g[:, :, :m] for g, m in zip(got, lens)], order=order)


def rel(got, want):
    got, want = got.float(), want.float()
    return ((got - want).norm() / want.norm()).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--heads-kv", type=int, default=8)
    ap.add_argument("--seq", type=int, default=131072)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--dtype", choices=("bf16", "f16"), default="bf16")
    ap.add_argument("--order", choices=fjd.ORDERS, default="zigzag")
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--no-backward", action="store_true")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()

    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device())
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    causal = None if a.no_causal else "top_left"
    B, H, Hkv, S, D = a.batch, a.heads, a.heads_kv, a.seq, a.dim
    g = torch.Generator(device=dev).manual_seed(39)
    q, dout = (torch.randn(B, H, S, D, generator=g, device=dev, dtype=dtype) for _ in range(2))
    k, v = (torch.randn(B, Hkv, S, D, generator=g, device=dev, dtype=dtype) for _ in range(2))
    lens = (fjd.zigzag_lengths(S, world) if a.order == "zigzag"
            else fjd.contiguous_lengths(S, world))
    ql, kl, vl, dl = (fjd.shard(t, world, rank, order=a.order).requires_grad_(t is not dout)
                      for t in (q, k, v, dout))
    flops = 4 * B * H * S * S * D / (2 if causal else 1)
    row = dict(shape=[B, H, Hkv, S, D], dtype=a.dtype, causal=bool(causal), order=a.order,
               world=world, device=torch.cuda.get_device_name(dev), iters=a.iters)

    def ring_fwd():
        with torch.no_grad():
            return fjd.ring_attention(ql, kl, vl, causal=causal, order=a.order, shard_lens=lens)

    def ring_train():
        out = fjd.ring_attention(ql, kl, vl, causal=causal, order=a.order, shard_lens=lens)
        out.backward(dl)
        return out

    row["ring_fwd_ms"] = timed(ring_fwd, a.iters, a.warmup, world)
    if not a.no_backward:
        row["ring_fwd_bwd_ms"] = timed(ring_train, a.iters, a.warmup, world)
    # The ring's results, gathered for rank 0's comparison.
    for t in (ql, kl, vl):
        t.grad = None
    out = ring_train() if not a.no_backward else ring_fwd()
    pieces = {}
    for name, t in (("out", out), ("dq", ql.grad), ("dk", kl.grad), ("dv", vl.grad)):
        if t is not None:
            pieces[name] = gather(t.detach(), lens, a.order)
    dist.barrier()

    if rank == 0:
        qf, kf, vf = (t.detach().clone().requires_grad_() for t in (q, k, v))

        def one_fwd():
            with torch.no_grad():
                return flashjit.attention(qf, kf, vf, causal=causal)

        def one_train():
            o = flashjit.attention(qf, kf, vf, causal=causal)
            o.backward(dout)
            return o

        row["single_fwd_ms"] = timed(one_fwd, a.iters, a.warmup, 1)
        if not a.no_backward:
            row["single_fwd_bwd_ms"] = timed(one_train, a.iters, a.warmup, 1)
        for t in (qf, kf, vf):
            t.grad = None
        ref = one_train() if not a.no_backward else one_fwd()
        row["rel_err_out"] = rel(pieces["out"], ref)
        if not a.no_backward:
            for name, t in (("dq", qf), ("dk", kf), ("dv", vf)):
                row[f"rel_err_{name}"] = rel(pieces[name], t.grad)
        row["ring_fwd_tflops"] = flops / row["ring_fwd_ms"] / 1e9
        row["single_fwd_tflops"] = flops / row["single_fwd_ms"] / 1e9
        row["speedup_fwd"] = row["single_fwd_ms"] / row["ring_fwd_ms"]
        print(f"ring   fwd {row['ring_fwd_ms']:9.2f} ms {row['ring_fwd_tflops']:7.1f} TFLOP/s "
              f"(all {world} GPUs)")
        print(f"single fwd {row['single_fwd_ms']:9.2f} ms {row['single_fwd_tflops']:7.1f} TFLOP/s")
        if not a.no_backward:
            total = 3.5 * flops
            row["speedup_fwd_bwd"] = row["single_fwd_bwd_ms"] / row["ring_fwd_bwd_ms"]
            print(f"ring   fwd+bwd {row['ring_fwd_bwd_ms']:9.2f} ms "
                  f"{total / row['ring_fwd_bwd_ms'] / 1e9:7.1f} TFLOP/s")
            print(f"single fwd+bwd {row['single_fwd_bwd_ms']:9.2f} ms "
                  f"{total / row['single_fwd_bwd_ms'] / 1e9:7.1f} TFLOP/s")
        print(f"speedup over one GPU: fwd {row['speedup_fwd']:.2f}x"
              + (f", fwd+bwd {row['speedup_fwd_bwd']:.2f}x" if not a.no_backward else "")
              + f" (ideal {world}x)")
        print("rel_err vs one GPU: " + ", ".join(f"{k[8:]} {v:.1e}" for k, v in row.items()
                                                 if k.startswith("rel_err_")))
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "ring_bench.json"), "w") as f:
            json.dump(row, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
