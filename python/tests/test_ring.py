"""Context parallelism: ring attention's schedule.

Without torch: ring attention's schedule (flashjit._ring) against a
brute-force mask -- every visible (query, key) pair met exactly once, at
the step whose shard holds the key, each call's mask exactly the global
mask on its rectangle -- and tests/data/ring_schedule.txt (which
tests/test_ring.c runs with the float64 reference) against the code.

    python3 python/tests/test_ring.py --write-golden   # after changing _ring.py
"""
import os
import random
import sys
import unittest

import fjtest
from flashjit import _ring as R

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


def write_golden():
    with open(GOLDEN, "w") as f:
        f.write(golden_text())
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write-golden"]:
        write_golden()
    else:
        unittest.main()
