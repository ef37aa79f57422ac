"""Context parallelism (flashjit.distributed, flashjit.merge).

Without torch: ring attention's schedule (flashjit._ring) against a
brute-force mask -- every visible (query, key) pair met exactly once, at
the step whose shard holds the key, each call's mask exactly the global
mask on its rectangle -- and tests/data/ring_schedule.txt (which
tests/test_ring.c runs with the float64 reference) against the code.

With torch on the CPU: flashjit.merge through the library's float64
merge; the ring simulated in one process (the per-rank code of
ring_attention, shards passed by hand) with a float64 attention of
flashjit's mask rules in place of the kernels (ringref.py); the real
communication schedule over Gloo in 2-4 processes, forward and backward.

With a CUDA GPU: the simulated ring (world sizes 1-4) with flashjit's
kernels against flashjit.attention over the whole sequence, forward and
backward, for every case below; flashjit.merge on the GPU; ring_attention
itself in a process group of one.

    python3 python/tests/test_ring.py --write-golden   # after changing _ring.py
"""
import os
import random
import sys
import tempfile
import unittest

import fjtest
from flashjit import _ring as R
from fjtest import torch

GOLDEN = os.path.join(fjtest.REPO, "tests", "data", "ring_schedule.txt")

# (name, order, world, lengths (contiguous) or seq (zigzag), causal, window left, right,
#  batch, heads_q, heads_kv, head_dim, softcap): the schedule's cases, for the golden file
# (tests/test_ring.c) and the simulated rings.
CASES = [
    ("full_w1", "contiguous", 1, [13], False, -1, -1, 1, 2, 2, 8, 0),
    ("full_w3_uneven_gqa", "contiguous", 3, [5, 11, 7], False, -1, -1, 2, 4, 2, 8, 0),
    ("causal_w2", "contiguous", 2, [8, 8], True, -1, -1, 2, 2, 2, 8, 0),
    ("causal_w4_uneven_empty", "contiguous", 4, [6, 0, 9, 3], True, -1, -1, 1, 4, 1, 8, 5),
    ("causal_w4_first_empty", "contiguous", 4, [0, 7, 7, 2], True, -1, -1, 1, 2, 1, 16, 0),
    ("zigzag_causal_w2", "zigzag", 2, 16, True, -1, -1, 2, 2, 2, 8, 0),
    ("zigzag_causal_w3_uneven", "zigzag", 3, 23, True, -1, -1, 1, 4, 2, 8, 3),
    ("zigzag_causal_w4", "zigzag", 4, 32, True, -1, -1, 1, 2, 1, 8, 0),
    ("zigzag_full_w3", "zigzag", 3, 20, False, -1, -1, 1, 2, 2, 8, 0),
    ("window_w3", "contiguous", 3, [7, 9, 6], False, 3, 2, 1, 2, 2, 8, 0),
    ("window_causal_w4", "contiguous", 4, [5, 5, 5, 5], True, 3, -1, 1, 2, 1, 8, 4),
    ("zigzag_window_causal_w3", "zigzag", 3, 25, True, 4, 0, 1, 2, 2, 8, 0),
    ("window_self_w4", "contiguous", 4, [4, 6, 0, 5], False, 0, 0, 1, 4, 2, 8, 0),
    ("window_ahead_w3", "contiguous", 3, [6, 6, 6], False, -1, 2, 1, 2, 2, 8, 0),
    ("zigzag_window_w4", "zigzag", 4, 27, False, 5, 1, 1, 2, 1, 8, 2),
]


def case_layout(case):
    _, order, world, sizes = case[:4]
    return R.contiguous_layout(sizes) if order == "contiguous" else R.zigzag_layout(sizes, world)


def case_mask(case):
    return R.mask_of(case[4], case[5], case[6])


def golden_text():
    lines = ["# ring_schedule.txt -- ring attention's schedule (python/flashjit/_ring.py) for",
             "# python/tests/test_ring.py's CASES, run by tests/test_ring.c with the float64",
             "# reference.  Made by: python3 python/tests/test_ring.py --write-golden"]
    for case in CASES:
        name, b, hq, hk, d, cap = case[0], *case[7:]
        lines += R.golden_lines(name, case_layout(case), case_mask(case),
                                f"batch {b} heads {hq} {hk} dim {d} softcap {cap}")
    return "\n".join(lines) + "\n"


def brute_force(layout, mask):
    """Checks plan(layout, mask) pair by pair; returns the number of calls."""
    world = len(layout)
    plan = R.plan(layout, mask)
    pos = [R.positions(s) for s in layout]
    seq = sum(len(p) for p in pos)
    calls = 0
    for r in range(world):
        met = set()
        for s in range(world):
            src = R.ring_source(r, s, world)
            for c in plan[r][s]:
                calls += 1
                assert 0 <= c.q_lo < c.q_hi <= len(pos[r]), (r, s, c)
                assert 0 <= c.k_lo < c.k_hi <= len(pos[src]), (r, s, c)
                for i in range(c.q_lo, c.q_hi):
                    for j in range(c.k_lo, c.k_hi):
                        seen = c.visible(i - c.q_lo, j - c.k_lo)
                        gi, gj = pos[r][i], pos[src][j]
                        assert seen == mask.visible(gi, gj), (layout, mask, r, s, c, i, j)
                        if seen:
                            assert (gi, gj) not in met, ("met twice", r, s, c, gi, gj)
                            met.add((gi, gj))
        want = {(i, j) for i in pos[r] for j in range(seq) if mask.visible(i, j)}
        assert met == want, ("missed", layout, mask, r, sorted(want - met)[:5])
    return calls


class Schedule(unittest.TestCase):
    """The pure schedule, no torch."""

    def test_cases_brute_force(self):
        for case in CASES:
            with self.subTest(case=case[0]):
                brute_force(case_layout(case), case_mask(case))

    def test_random_brute_force(self):
        rng = random.Random(39)
        for _ in range(400):
            world = rng.randint(1, 5)
            if rng.random() < 0.5:
                layout = R.contiguous_layout([rng.choice([0, 1, 2, 5, 9]) for _ in range(world)])
            else:
                layout = R.zigzag_layout(rng.randint(0, 41), world)
            causal = rng.random() < 0.5
            left = rng.choice([-1, -1, 0, 1, 3, 8])
            right = rng.choice([-1, 0]) if causal else rng.choice([-1, -1, 0, 2, 5])
            brute_force(layout, R.mask_of(causal, left, right))

    def test_zigzag_causal_is_one_balanced_call_a_step(self):
        # FlashAttention's zigzag ring: the diagonal step causal, earlier
        # shards' first half of keys for all rows, later shards all keys
        # for the second half of rows -- as many pairs on every rank.
        for world in (2, 3, 4, 8):
            layout = R.zigzag_layout(16 * world, world)
            plan = R.plan(layout, R.mask_of(True))
            for r in range(world):
                self.assertEqual([len(c) for c in plan[r]], [1] * world)
                self.assertEqual(plan[r][0][0].causal, "bottom_right")
                for s in range(1, world):
                    c = plan[r][s][0]
                    self.assertIsNone(c.causal)
                    self.assertIsNone(c.window)
                    half = (0, 16, 0, 8) if R.ring_source(r, s, world) < r else (8, 16, 0, 16)
                    self.assertEqual((c.q_lo, c.q_hi, c.k_lo, c.k_hi), half)
            work = {sum((c.q_hi - c.q_lo) * (c.k_hi - c.k_lo) for st in plan[r] for c in st)
                    for r in range(world)}
            self.assertEqual(len(work), 1, f"world {world}: unbalanced {work}")

    def test_contiguous_causal(self):
        plan = R.plan(R.contiguous_layout([8] * 4), R.mask_of(True))
        for r in range(4):
            for s in range(4):
                calls = plan[r][s]
                if s == 0:
                    self.assertEqual(calls, (R.Call(0, 8, 0, 8, "bottom_right", None),))
                elif R.ring_source(r, s, 4) < r:
                    self.assertEqual(calls, (R.Call(0, 8, 0, 8, None, None),))
                else:
                    self.assertEqual(calls, ())  # a later shard: nothing to see

    def test_window_trims(self):
        # A causal sliding window of 3 over shards of 5: of the shard
        # before, rows 5-7 see keys 2-4, key j when j >= row - 3 -- in the
        # call's box, j >= i: the window (0, -1) without a causal mask.
        plan = R.plan(R.contiguous_layout([5, 5]), R.mask_of(True, 3, -1))
        self.assertEqual(plan[1][1], (R.Call(0, 3, 2, 5, None, (0, -1)),))
        c = plan[1][1][0]
        self.assertTrue(all(c.visible(i, j) == (j >= i) for i in range(3) for j in range(3)))

    def test_refusals(self):
        with self.assertRaisesRegex(ValueError, r"window\[1\]=2 with a causal mask"):
            R.mask_of(True, -1, 2)
        with self.assertRaisesRegex(ValueError, r"window\[0\]=-2 must be an int >= -1"):
            R.mask_of(False, -2, -1)
        with self.assertRaisesRegex(ValueError, "shard length -1"):
            R.contiguous_layout([3, -1])

    def test_golden_file_is_the_code(self):
        with open(GOLDEN) as f:
            self.assertEqual(f.read(), golden_text(),
                             "tests/data/ring_schedule.txt is not what _ring.py makes: "
                             "python3 python/tests/test_ring.py --write-golden")


def _rel(a, b):
    """||a - b|| / ||b||, the norm floored at 1e-6 an element's worth (a
    gradient that is 0 exactly: a window of one key)."""
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-6 * b.numel() ** 0.5)).item()


@unittest.skipUnless(fjtest.HAS_TORCH, fjtest.NO_TORCH)
class MergeCPU(unittest.TestCase):
    """flashjit.merge on CPU tensors: fj_reference_merge."""

    def test_against_torch(self):
        import flashjit
        g = torch.Generator().manual_seed(1)
        for layout in ("bhsd", "bshd"):
            shape = (2, 3, 7, 16) if layout == "bhsd" else (2, 7, 3, 16)
            outs = [torch.randn(shape, generator=g) for _ in range(3)]
            lses = [torch.randn(2, 3, 7, generator=g) * 3 for _ in range(3)]
            lses[1][0, 0, 2] = float("-inf")
            outs[1][(0, 0, 2) if layout == "bhsd" else (0, 2, 0)] = 0
            for t in lses:
                t[1, 2, 4] = float("-inf")  # a row no part saw
            out, lse = flashjit.merge(outs, lses, layout=layout)
            want_lse = torch.logsumexp(torch.stack(lses), 0)
            w = torch.exp(torch.stack(lses) - want_lse).nan_to_num(0.0)
            if layout == "bshd":
                w = w.transpose(2, 3)
            want = (w[..., None] * torch.stack(outs)).sum(0)
            self.assertLess(_rel(out, want), 1e-6)
            self.assertEqual(lse[1, 2, 4].item(), float("-inf"))
            self.assertTrue(torch.allclose(lse, want_lse, atol=1e-6))
            row = out[1, 2, 4] if layout == "bhsd" else out[1, 4, 2]
            self.assertEqual(row.abs().max().item(), 0.0)
        sinks = torch.tensor([0.5, -1.0, 2.0])
        out, lse = flashjit.merge(outs, lses, layout=layout, sinks=sinks)
        self.assertAlmostEqual(lse[1, 2, 4].item(), 2.0, places=6)  # no part: the sink
        full = torch.logsumexp(torch.stack(lses + [sinks[None, :, None].expand(2, 3, 7)]), 0)
        self.assertTrue(torch.allclose(lse, full, atol=1e-6))

    def test_gradients_against_torch(self):
        """merge()'s backward against autograd through the formulas in
        torch (float64): outs, lses and sinks, a loss of out and lse, rows
        a part did not see and one no part saw."""
        import flashjit
        g = torch.Generator().manual_seed(4)
        for layout, sinks in (("bhsd", False), ("bshd", True)):
            with self.subTest(layout=layout, sinks=sinks):
                shape = (2, 3, 5, 8) if layout == "bhsd" else (2, 5, 3, 8)
                outs = [torch.randn(shape, generator=g) for _ in range(3)]
                lses = [torch.randn(2, 3, 5, generator=g) * 2 for _ in range(3)]
                lses[0][0, 1, 2] = float("-inf")
                for t in lses:
                    t[1, 0, 3] = float("-inf")
                sk = torch.tensor([0.3, -0.7, 1.1]) if sinks else None
                dout = torch.randn(shape, generator=g)
                dlse = torch.randn(2, 3, 5, generator=g)
                leaves = [t.clone().requires_grad_() for t in outs + lses]
                sl = sk.clone().requires_grad_() if sinks else None
                out, lse = flashjit.merge(leaves[:3], leaves[3:], layout=layout, sinks=sl)
                ((out * dout).sum() + (lse * dlse).where(lse.isfinite(), 0).sum()).backward()
                got = [t.grad for t in leaves] + ([sl.grad] if sinks else [])
                ref = [t.double().clone().requires_grad_() for t in outs + lses]
                rs = sk.double().clone().requires_grad_() if sinks else None
                ls = torch.stack(ref[3:])
                if sinks:
                    ls = torch.cat([ls, rs[None, None, :, None].expand(1, 2, 3, 5)])
                rl = torch.logsumexp(ls, 0)
                w = torch.exp(torch.stack(ref[3:]) - rl).nan_to_num(0.0)
                os = torch.stack(ref[:3])
                if layout == "bshd":
                    w = w.transpose(2, 3)
                ro = (w[..., None] * os).sum(0)
                ((ro * dout).sum() + (rl * dlse).where(rl.isfinite(), 0).sum()).backward()
                want = [t.grad.nan_to_num(0.0) for t in ref] + ([rs.grad] if sinks else [])
                self.assertLess(_rel(out, ro), 1e-6)
                for i, (x, y) in enumerate(zip(got, want)):
                    self.assertTrue(torch.isfinite(x).all(), i)
                    self.assertLess(_rel(x, y), 1e-6, i)

    def test_refusals(self):
        import flashjit
        o, l = torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 3)
        with self.assertRaisesRegex(ValueError, "no parts"):
            flashjit.merge([], [])
        with self.assertRaisesRegex(ValueError, "2 outputs but 1 log-sum-exps"):
            flashjit.merge([o, o], [l])
        with self.assertRaisesRegex(TypeError, r"lses\[0\] has dtype torch.float64"):
            flashjit.merge([o], [l.double()])
        with self.assertRaisesRegex(ValueError, r"lses\[0\] has shape \(1, 3, 2\)"):
            flashjit.merge([o], [torch.zeros(1, 3, 2)])
        with self.assertRaisesRegex(ValueError, "257 parts: at most 256"):
            flashjit.merge([o] * 257, [l] * 257)


@unittest.skipUnless(fjtest.HAS_TORCH, fjtest.NO_TORCH)
class SimulatedCPU(unittest.TestCase):
    """The ring simulated in one process, float64 attention in place of
    the kernels: ring_attention's per-rank code and the library's merge
    against the whole sequence, forward and backward, every case."""

    def test_cases(self):
        import flashjit.distributed as fjd
        import ringref
        g = torch.Generator().manual_seed(2)
        for case in CASES:
            name, order, world, sizes, causal, left, right, b, hq, hk, d, cap = case
            seq = sum(sizes) if order == "contiguous" else sizes
            lens = sizes if order == "contiguous" else None
            for layout in ("bhsd", "bshd"):
                with self.subTest(case=name, layout=layout):
                    def shape(h):
                        return (b, h, seq, d) if layout == "bhsd" else (b, seq, h, d)
                    q, dout = (torch.randn(shape(hq), generator=g, dtype=torch.float64)
                               for _ in range(2))
                    k, v = (torch.randn(shape(hk), generator=g, dtype=torch.float64)
                            for _ in range(2))
                    window = None if (left, right) == (-1, -1) else (left, right)
                    mask = dict(causal="top_left" if causal else None, window=window,
                                softcap=cap or None, layout=layout)
                    out, lse, grads = fjd._simulate(q, k, v, world, order=order, shard_lens=lens,
                                                    dout=dout, _attention=ringref.HOOK, **mask)
                    fo, fl, fg = ringref.full_grads(q, k, v, dout, **mask)
                    self.assertLess(_rel(out, fo), 1e-6)
                    self.assertTrue(torch.allclose(lse, fl, atol=1e-5))
                    for what, x, y in zip(("dq", "dk", "dv"), grads, fg):
                        self.assertLess(_rel(x, y), 1e-6, what)
                    # A loss that uses the merged lse too: each step's
                    # backward takes its rows of dlse.
                    dlse = torch.randn(fl.shape, generator=g, dtype=torch.float64)
                    _, _, grads = fjd._simulate(q, k, v, world, order=order, shard_lens=lens,
                                                dout=dout, dlse=dlse, _attention=ringref.HOOK,
                                                **mask)
                    _, _, fg2 = ringref.full_grads(q, k, v, dout, dlse=dlse, **mask)
                    for what, x, y, y0 in zip(("dq", "dk", "dv"), grads, fg2, fg):
                        self.assertLess(_rel(x, y), 1e-6, what + " with dlse")
                    self.assertGreater(_rel(fg2[0], fg[0]), 1e-3)  # dlse mattered

    def test_sinks(self):
        """Sinks join each row's denominator once, in the merge; their
        gradient is the ranks' parts summed: against autograd through the
        whole sequence's reference, with a loss of out and lse."""
        import flashjit.distributed as fjd
        import ringref
        g = torch.Generator().manual_seed(5)
        for case in CASES[1:5] + CASES[6:7]:
            name, order, world, sizes, causal, left, right, b, hq, hk, d, cap = case
            seq = sum(sizes) if order == "contiguous" else sizes
            lens = sizes if order == "contiguous" else None
            with self.subTest(case=name):
                q, dout = (torch.randn(b, hq, seq, d, generator=g, dtype=torch.float64)
                           for _ in range(2))
                k, v = (torch.randn(b, hk, seq, d, generator=g, dtype=torch.float64)
                        for _ in range(2))
                dlse = torch.randn(b, hq, seq, generator=g, dtype=torch.float64)
                sinks = torch.randn(hq, generator=g)
                mask = dict(causal="top_left" if causal else None,
                            window=None if (left, right) == (-1, -1) else (left, right),
                            softcap=cap or None)
                out, lse, grads = fjd._simulate(q, k, v, world, order=order, shard_lens=lens,
                                                dout=dout, dlse=dlse, sinks=sinks,
                                                _attention=ringref.HOOK, **mask)
                leaves = [t.clone().requires_grad_() for t in (q, k, v)]
                sl = sinks.double().requires_grad_()
                fo, fl = ringref.fwd(*leaves, sinks=sl, **mask)
                ((fo * dout).sum() + (fl.double() * dlse).sum()).backward()
                self.assertLess(_rel(out, fo.detach()), 1e-6)
                self.assertTrue(torch.allclose(lse, fl.detach(), atol=1e-5))
                for what, x, t in zip(("dq", "dk", "dv", "dsinks"), grads, leaves + [sl]):
                    self.assertLess(_rel(x, t.grad), 1e-5, what)
        q = torch.zeros(1, 4, 8, 8, dtype=torch.float64)
        for bad in (torch.zeros(3), torch.zeros(4, dtype=torch.float64), 0.5):
            with self.assertRaisesRegex(ValueError, r"sinks must be a float32 tensor \(4,\)"):
                fjd._simulate(q, q, q, 2, sinks=bad, _attention=ringref.HOOK)
        # A head dim that is not a multiple of 8: refused up front (the
        # ring's backward runs on the shards as they are).
        q5 = torch.zeros(1, 4, 8, 12, dtype=torch.float64)
        with self.assertRaisesRegex(ValueError, r"head dim 12 is not a multiple of 8: pad q, "
                                    r"k and v with zero columns to 16 and pass scale=12\*\*-0.5"):
            fjd._simulate(q5, q5, q5, 2, _attention=ringref.HOOK)

    def test_cross_attention(self):
        """Keys of other positions than the queries (no mask), each rank
        its shard of both, uneven and empty ones: the ring against the
        whole reference, forward and backward with a loss of out and
        lse."""
        import flashjit.distributed as fjd
        import ringref
        g = torch.Generator().manual_seed(6)
        for world, q_lens, kv_lens, hq, hk, cap, layout, order, sinks in (
                (1, [9], [20], 2, 2, None, "bhsd", "contiguous", False),
                (2, [7, 5], [30, 11], 4, 2, 2.5, "bshd", "contiguous", False),
                (3, [6, 0, 9], [0, 17, 4], 4, 1, None, "bhsd", "contiguous", True),
                (4, [3, 8, 0, 5], [10, 10, 10, 2], 2, 2, None, "bshd", "contiguous", False),
                (2, 13, 20, 4, 2, None, "bhsd", "zigzag", True),
                # no keys anywhere: every row is the sink's alone
                (2, [5, 4], [0, 0], 2, 2, None, "bhsd", "contiguous", True)):
            with self.subTest(world=world, q_lens=q_lens, kv_lens=kv_lens, order=order):
                sq = sum(q_lens) if order == "contiguous" else q_lens
                sk = sum(kv_lens) if order == "contiguous" else kv_lens
                if order == "zigzag":
                    q_lens = kv_lens = None

                def shape(h, s):
                    return (2, h, s, 8) if layout == "bhsd" else (2, s, h, 8)
                q, dout = (torch.randn(shape(hq, sq), generator=g, dtype=torch.float64)
                           for _ in range(2))
                k, v = (torch.randn(shape(hk, sk), generator=g, dtype=torch.float64)
                        for _ in range(2))
                dlse = torch.randn(2, hq, sq, generator=g, dtype=torch.float64)
                sk_ = torch.randn(hq, generator=g) if sinks else None
                mask = dict(softcap=cap, layout=layout)
                out, lse, grads = fjd._simulate(q, k, v, world, order=order, shard_lens=q_lens,
                                                kv_shard_lens=kv_lens, dout=dout, dlse=dlse,
                                                sinks=sk_, _attention=ringref.HOOK, **mask)
                leaves = [t.clone().requires_grad_() for t in (q, k, v)]
                sl = sk_.double().requires_grad_() if sinks else None
                fo, fl = ringref.fwd(*leaves, sinks=sl, **mask)
                ((fo * dout).sum() + (fl.double() * dlse).where(fl.isfinite(), 0).sum()).backward()
                self.assertLess(_rel(out, fo.detach()), 1e-6)
                self.assertTrue(torch.allclose(lse, fl.detach(), atol=1e-5))
                for what, x, t in zip(("dq", "dk", "dv", "dsinks"), grads,
                                      leaves + ([sl] if sinks else [])):
                    self.assertEqual(x.shape, t.grad.shape, what)
                    if x.numel():  # no keys: empty dk, dv
                        self.assertLess(_rel(x, t.grad.nan_to_num(0.0)), 1e-6, what)
        q, k = torch.zeros(1, 2, 8, 8), torch.zeros(1, 2, 12, 8)
        with self.assertRaisesRegex(ValueError, r"ranks hold \[4, 4\] query positions and "
                                                r"\[6, 6\] key/value positions: a causal mask"):
            fjd._simulate(q, k, k, 2, causal=True, _attention=ringref.HOOK)
        with self.assertRaisesRegex(ValueError, r"ranks hold \[4, 4\] query positions and "
                                                r"\[6, 2\] key/value positions: a causal mask"):
            fjd._simulate(q, q, q, 2, shard_lens=[4, 4], kv_shard_lens=[6, 2],
                          window=(2, 2), _attention=ringref.HOOK)

    def test_reference_dlse_against_autograd(self):
        """ringref.bwd's dlse term: the gradient of sum(dout * out) +
        sum(dlse * lse) by torch's autograd through ringref.fwd."""
        import ringref
        g = torch.Generator().manual_seed(3)
        for causal, window, cap in ((None, None, None), ("top_left", None, 2.5),
                                    ("bottom_right", (4, -1), None)):
            with self.subTest(causal=causal, window=window, softcap=cap):
                q = torch.randn(2, 4, 9, 8, generator=g, dtype=torch.float64)
                k, v = (torch.randn(2, 2, 11, 8, generator=g, dtype=torch.float64)
                        for _ in range(2))
                dout = torch.randn(q.shape, generator=g, dtype=torch.float64)
                dlse = torch.randn(2, 4, 9, generator=g, dtype=torch.float64)
                mask = dict(causal=causal, window=window, softcap=cap)
                for t in (q, k, v):
                    t.requires_grad_()
                out, lse = ringref.fwd(q, k, v, **mask)
                ((out * dout).sum() + (lse.double() * dlse).sum()).backward()
                got = ringref.bwd(dout, q.detach(), k.detach(), v.detach(), out.detach(),
                                  lse.detach(), dlse=dlse, **mask)
                for what, x, t in zip(("dq", "dk", "dv"), got, (q, k, v)):
                    self.assertLess(_rel(x, t.grad), 1e-5, what)


def _gloo_rank(rank, world, path, configs):
    """One Gloo process: ring_attention (torch's float64 attention in place
    of the kernels) over each config, forward and backward; the results
    saved for the parent."""
    import torch.distributed as dist
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import flashjit.distributed as fjd
    import ringref
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank,
                            world_size=world)
    results = []
    for cfg in configs:
        order, lens, tensors, kw = cfg["order"], cfg["lens"], cfg["tensors"], cfg["kw"]
        dim = 2 if kw.get("layout", "bhsd") == "bhsd" else 1
        kv_lens = cfg.get("kv_lens", lens)
        q, dout = (fjd.shard(t, world, rank, order=order, dim=dim, shard_lens=lens)
                   for t in (tensors[0], tensors[3]))
        k, v = (fjd.shard(t, world, rank, order=order, dim=dim, shard_lens=kv_lens)
                for t in tensors[1:3])
        dlse = fjd.shard(tensors[4], world, rank, order=order, dim=2, shard_lens=lens)
        sinks = cfg.get("sinks")
        sinks = None if sinks is None else sinks.clone().requires_grad_()
        for t in (q, k, v):
            t.requires_grad_()
        out, lse = fjd.ring_attention(q, k, v, order=order, return_lse=True,
                                      shard_lens=cfg.get("shard_lens"), _attention=ringref.HOOK,
                                      sinks=sinks, **kw)
        ((out * dout).sum() + (lse.double() * dlse).sum()).backward()
        results.append([out.detach(), lse, q.grad, k.grad, v.grad,
                        None if sinks is None else sinks.grad])
    torch.save(results, f"{path}.{rank}")
    dist.barrier()
    dist.destroy_process_group()


@unittest.skipUnless(fjtest.HAS_TORCH, fjtest.NO_TORCH)
class Gloo(unittest.TestCase):
    """The real communication schedule: 2 and 4 CPU processes over Gloo
    (torch.multiprocessing), K/V and dK/dV around the ring, torch's
    float64 attention in place of the kernels."""

    def run_world(self, world, configs):
        import torch.distributed as dist
        import torch.multiprocessing as mp
        if not dist.is_available() or not dist.is_gloo_available():
            self.skipTest("this PyTorch has no Gloo backend")
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "rendezvous")
            mp.spawn(_gloo_rank, args=(world, path, configs), nprocs=world)
            return [torch.load(f"{path}.{r}") for r in range(world)]

    def configs(self, world, g):
        out = []
        for order, lens, causal, window, layout, cap in (
                ("zigzag", None, True, None, "bhsd", None),
                ("contiguous", [5, 0, 9, 4][:world] if world == 4 else [9, 4], True, None,
                 "bshd", 3.0),
                ("contiguous", None, False, (3, 2), "bhsd", None),
                ("zigzag", None, True, (6, -1), "bshd", None)):
            seq = sum(lens) if lens else 19
            shape = (lambda h: (1, h, seq, 8)) if layout == "bhsd" else (lambda h: (1, seq, h, 8))
            tensors = [torch.randn(shape(h), generator=g, dtype=torch.float64)
                       for h in (4, 2, 2, 4)]
            # The loss's weights of the lse (1, heads_q, seq): it uses both outputs.
            tensors.append(torch.randn((1, 4, seq), generator=g, dtype=torch.float64))
            kw = dict(causal=causal, window=window, softcap=cap, layout=layout)
            out.append(dict(order=order, lens=lens, tensors=tensors, kw=kw,
                            shard_lens=lens if lens and world == 4 else None))
        # Sinks (their gradient summed over the ranks by all_reduce), on the
        # second config's shapes.
        out.append(dict(out[1], sinks=torch.randn(4, generator=g)))
        # Cross-attention: K/V of other positions, their lengths gathered
        # with the queries' (one all_gather of both).
        q_lens, kv_lens = ([5, 0, 9, 4], [3, 3, 0, 11]) if world == 4 else ([5, 9], [13, 4])
        sq, sk = sum(q_lens), sum(kv_lens)
        tensors = [torch.randn(1, h, s, 8, generator=g, dtype=torch.float64)
                   for h, s in ((4, sq), (2, sk), (2, sk), (4, sq))]
        tensors.append(torch.randn((1, 4, sq), generator=g, dtype=torch.float64))
        out.append(dict(order="contiguous", lens=q_lens, kv_lens=kv_lens, tensors=tensors,
                        kw=dict(causal=False, window=None, softcap=None, layout="bhsd"),
                        shard_lens=None))
        return out

    def check(self, world):
        import flashjit.distributed as fjd
        import ringref
        configs = self.configs(world, torch.Generator().manual_seed(world))
        ranks = self.run_world(world, configs)
        for i, cfg in enumerate(configs):
            kw = dict(cfg["kw"])
            kw["causal"] = "top_left" if kw["causal"] else None
            dim = 2 if kw["layout"] == "bhsd" else 1
            q, k, v, dout, dlse = cfg["tensors"]
            sinks = cfg.get("sinks")
            if sinks is None:
                fo, fl, fg = ringref.full_grads(q, k, v, dout, dlse=dlse, **kw)
            else:  # autograd through the reference, the sinks' gradient too
                leaves = [t.clone().requires_grad_() for t in (q, k, v)]
                sl = sinks.double().requires_grad_()
                fo, fl = ringref.fwd(*leaves, sinks=sl, **kw)
                ((fo * dout).sum() + (fl.double() * dlse).sum()).backward()
                fo, fl, fg = fo.detach(), fl.detach(), [t.grad for t in leaves]
                # Each rank holds its rows' part; the parts sum to the whole.
                self.assertLess(_rel(sum(r[i][5] for r in ranks), sl.grad), 1e-5, "dsinks")
                self.assertGreater(_rel(ranks[0][i][5], sl.grad), 1e-3)
            got = [fjd.unshard([r[i][j] for r in ranks], order=cfg["order"],
                               dim=2 if j == 1 else dim) for j in range(5)]
            with self.subTest(config=i, order=cfg["order"], layout=kw["layout"]):
                self.assertLess(_rel(got[0], fo), 1e-6)
                self.assertTrue(torch.allclose(got[1], fl, atol=1e-5))
                for what, x, y in zip(("dq", "dk", "dv"), got[2:], fg):
                    self.assertLess(_rel(x, y), 1e-6, what)

    def test_two_processes(self):
        self.check(2)

    def test_four_processes(self):
        self.check(4)


def _gpu_ok():
    return fjtest.HAS_CUDA and fjtest.library_has_gpu()


@unittest.skipUnless(fjtest.HAS_TORCH, fjtest.NO_TORCH)
@unittest.skipUnless(fjtest.HAS_CUDA, fjtest.NO_CUDA)
class SimulatedGPU(unittest.TestCase):
    """The ring simulated in one process with flashjit's kernels (world
    sizes 1-4) against flashjit.attention over the whole sequence, forward
    and backward, within their tolerances."""

    def setUp(self):
        if not _gpu_ok():
            self.skipTest("the library opens no GPU context here")

    def run_case(self, world, order, lens, seq, causal, window, softcap, layout, dtype, hq, hk,
                 d=128, b=2):
        import flashjit
        import flashjit.distributed as fjd
        g = torch.Generator(device="cuda").manual_seed(world * 1000 + seq)

        def shape(h):
            return (b, h, seq, d) if layout == "bhsd" else (b, seq, h, d)

        def rand(h):
            return torch.randn(shape(h), generator=g, device="cuda", dtype=dtype)
        q, k, v, dout = rand(hq), rand(hk), rand(hk), rand(hq)
        mask = dict(causal=causal, window=window, softcap=softcap, layout=layout)
        out, lse, grads = fjd._simulate(q, k, v, world, order=order, shard_lens=lens, dout=dout,
                                        **mask)
        qf, kf, vf = (t.detach().clone().requires_grad_() for t in (q, k, v))
        fo, fl = flashjit.attention(qf, kf, vf, return_lse=True, **mask)
        fo.backward(dout)
        err = [_rel(out, fo), (lse - fl).abs().max().item()]
        err += [_rel(x, y.grad) for x, y in zip(grads, (qf, kf, vf))]
        return err

    def test_cases(self):
        for world in (1, 2, 3, 4):
            for order, lens, seq, causal, window, cap, layout, hq, hk in (
                    ("contiguous", None, 512, "top_left", None, None, "bhsd", 4, 4),
                    ("zigzag", None, 520, "top_left", None, None, "bshd", 8, 2),
                    ("contiguous", "uneven", 333, "top_left", None, 30.0, "bhsd", 4, 1),
                    ("contiguous", None, 300, None, None, None, "bshd", 4, 2),
                    ("zigzag", None, 300, None, (64, 32), None, "bhsd", 4, 4),
                    ("zigzag", None, 410, "top_left", (100, -1), None, "bhsd", 4, 2)):
                if lens == "uneven":  # one rank without rows where world > 2
                    lens = [seq - 100 * (world - 1)] + [100] * (world - 1)
                    if world > 2:
                        lens[1], lens[-1] = 0, 100 + lens[1]
                # float16 at one world size: the dtype changes kernels, not the ring.
                for dtype in (torch.bfloat16,) + ((torch.float16,) if world == 2 else ()):
                    name = (f"world {world} {order} seq {seq} causal {causal} window {window} "
                            f"softcap {cap} {layout} {hq}/{hk} {str(dtype)[6:]}")
                    with self.subTest(name):
                        e = self.run_case(world, order, lens, seq, causal, window, cap, layout,
                                          dtype, hq, hk)
                        line = (f"{name}: out {e[0]:.1e} |lse| {e[1]:.1e} dq {e[2]:.1e} "
                                f"dk {e[3]:.1e} dv {e[4]:.1e}")
                        # A line of its own beside unittest's (bench/device_check.sh greps it).
                        print("\n" + line, file=sys.stderr, flush=True)
                        self.assertLess(e[0], 1e-2)
                        self.assertLess(e[1], 1e-3)
                        bound = 3e-2 if dtype == torch.bfloat16 else 1e-2
                        self.assertLess(max(e[2:]), bound)

    def test_cross_attention(self):
        """Keys of other positions (no mask), each rank its shard of both,
        against flashjit.attention over the whole of them."""
        import flashjit
        import flashjit.distributed as fjd
        g = torch.Generator(device="cuda").manual_seed(8)
        for world, q_lens, kv_lens in ((2, [300, 212], [1000, 24]), (3, [0, 256, 100],
                                                                      [333, 0, 600])):
            with self.subTest(world=world):
                def rand(h, s):
                    return torch.randn(1, h, s, 128, generator=g, device="cuda",
                                       dtype=torch.bfloat16)
                q, dout = rand(8, sum(q_lens)), rand(8, sum(q_lens))
                k, v = rand(2, sum(kv_lens)), rand(2, sum(kv_lens))
                out, lse, grads = fjd._simulate(q, k, v, world, shard_lens=q_lens,
                                                kv_shard_lens=kv_lens, dout=dout)
                leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
                fo, fl = flashjit.attention(*leaves, return_lse=True)
                fo.backward(dout)
                self.assertLess(_rel(out, fo), 1e-2)
                self.assertLess((lse - fl).abs().max().item(), 1e-3)
                for what, x, t in zip(("dq", "dk", "dv"), grads, leaves):
                    self.assertLess(_rel(x, t.grad), 3e-2, what)

    def test_sinks_and_lse(self):
        """Sinks (in the merge; their gradient the ranks' parts) and a loss
        of out and lse (each step's backward takes its rows of dlse),
        against flashjit.attention with the sinks over the whole
        sequence."""
        import flashjit
        import flashjit.distributed as fjd
        g = torch.Generator(device="cuda").manual_seed(7)
        for world, order, causal in ((2, "zigzag", "top_left"), (3, "contiguous", None)):
            with self.subTest(world=world, order=order, causal=causal):
                q, dout = (torch.randn(2, 8, 600, 128, generator=g, device="cuda",
                                       dtype=torch.bfloat16) for _ in range(2))
                k, v = (torch.randn(2, 2, 600, 128, generator=g, device="cuda",
                                    dtype=torch.bfloat16) for _ in range(2))
                dlse = torch.randn(2, 8, 600, generator=g, device="cuda")
                # Large enough to move the output well past its tolerance.
                sinks = torch.randn(8, generator=g, device="cuda") + 6.0
                out, lse, grads = fjd._simulate(q, k, v, world, order=order, causal=causal,
                                                dout=dout, dlse=dlse, sinks=sinks)
                leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, sinks)]
                fo, fl = flashjit.attention(*leaves[:3], sinks=leaves[3], causal=causal,
                                            return_lse=True)
                ((fo.float() * dout.float()).sum() + (fl * dlse).sum()).backward()
                self.assertLess(_rel(out, fo), 1e-2)
                self.assertLess((lse - fl).abs().max().item(), 1e-3)
                for what, x, t in zip(("dq", "dk", "dv", "dsinks"), grads, leaves):
                    self.assertLess(_rel(x, t.grad), 3e-2, what)


@unittest.skipUnless(fjtest.HAS_TORCH, fjtest.NO_TORCH)
@unittest.skipUnless(fjtest.HAS_CUDA, fjtest.NO_CUDA)
class OnGPU(unittest.TestCase):
    """flashjit.merge on the GPU, and ring_attention itself in a process
    group of one (its autograd, its entry's checks)."""

    def setUp(self):
        if not _gpu_ok():
            self.skipTest("the library opens no GPU context here")

    def test_merge_cuda_vs_host(self):
        import flashjit
        g = torch.Generator(device="cuda").manual_seed(3)
        for dtype in (torch.float16, torch.bfloat16):
            outs = [torch.randn(2, 4, 100, 64, generator=g, device="cuda").to(dtype)
                    for _ in range(5)]
            lses = [torch.randn(2, 4, 100, generator=g, device="cuda") * 4 for _ in range(5)]
            lses[2][:, :, :50] = float("-inf")
            outs[2][:, :, :50] = 0
            out, lse = flashjit.merge(outs, lses)
            ho, hl = flashjit.merge([o.cpu().float() for o in outs], [l.cpu() for l in lses])
            self.assertEqual(out.dtype, dtype)
            self.assertLess(_rel(out.cpu(), ho), 8e-3 if dtype == torch.bfloat16 else 1e-3)
            self.assertTrue(torch.allclose(lse.cpu(), hl, atol=1e-5))

    def test_ring_attention_world_one(self):
        import torch.distributed as dist
        import flashjit
        import flashjit.distributed as fjd
        if dist.is_initialized():
            self.skipTest("a process group is already initialized")
        with tempfile.TemporaryDirectory() as tmp:
            dist.init_process_group("nccl" if dist.is_nccl_available() else "gloo",
                                    init_method=f"file://{tmp}/rdv", rank=0, world_size=1)
            try:
                q, k, v = (torch.randn(1, 4, 256, 64, device="cuda", dtype=torch.bfloat16,
                                       requires_grad=True) for _ in range(3))
                out = fjd.ring_attention(q, k, v, causal=True, shard_lens=[256])
                out.float().square().sum().backward()
                grads = [t.grad.clone() for t in (q, k, v)]
                for t in (q, k, v):
                    t.grad = None
                ref = flashjit.attention(q, k, v, causal=True)
                ref.float().square().sum().backward()
                self.assertLess(_rel(out, ref), 1e-2)
                for x, t in zip(grads, (q, k, v)):
                    self.assertLess(_rel(x, t.grad), 3e-2)
                with self.assertRaisesRegex(ValueError, r"shard_lens\[0\] = 100 but rank 0 "
                                                        "holds 256 query positions"):
                    fjd.ring_attention(q, k, v, shard_lens=[100])
                with self.assertRaisesRegex(ValueError, r"window\[1\]=4 with a causal mask"):
                    fjd.ring_attention(q, k, v, causal=True, window=(8, 4), shard_lens=[256])
            finally:
                dist.destroy_process_group()


def write_golden():
    with open(GOLDEN, "w") as f:
        f.write(golden_text())
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write-golden"]:
        write_golden()
    else:
        unittest.main()
