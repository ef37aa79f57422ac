"""Issue 35, part A, from Python: the documented limits at and past them
(a 2^30 sequence plans instead of looping), every int and float range-
checked before ctypes would cut it (the message names the value given),
NUL characters refused, and the expression and value refusals of the
library reaching Python as one line.  No GPU or PyTorch needed."""
import subprocess
import sys
import unittest

import fjtest  # noqa: F401  (puts flashjit on the path)
import flashjit

from test_errors import Case

BIG32 = 2 ** 32
TP = flashjit.TensorParam


def plan(**kw):
    args = dict(batch=1, heads_q=1, seq_q=64, head_dim=64)
    args.update(kw)
    return flashjit.plan(args.pop("batch"), args.pop("heads_q"), args.pop("seq_q"),
                         args.pop("head_dim"), **args)


class Limits(Case):
    """Each documented limit at the limit (planned) and one past (refused)."""

    def test_at_the_limits(self):
        cases = [dict(batch=65535), dict(heads_q=65535), dict(heads_q=65535, heads_kv=1),
                 dict(head_dim=256), dict(splits=256, seq_q=1, seq_kv=4096),
                 dict(window=(2 ** 30, 2 ** 30)), dict(window=(-1, 0)),
                 dict(sm_count=1024), dict(sm_count=1),
                 dict(softcap=1.1754943508222875e-38), dict(softcap=3.4e38),
                 dict(scale=1.1754943508222875e-38), dict(scale=2.3e38),
                 dict(score_mod="s + x", params={"x": 3.4028234663852886e38}),
                 dict(score_mod="s + (float)x", params={"x": 2 ** 31 - 1}),
                 dict(score_mod="s + (float)x", params={"x": -2 ** 31}),
                 dict(score_mod="s + t(0)", params={"t": TP("f32", (2 ** 31 - 1,))}),
                 dict(score_mod="s + t(0, 0)", params={"t": TP("f32", (2 ** 31 - 1, 2 ** 30))}),
                 dict(score_mod="s" + " " * 1023),
                 dict(score_mod="s + a7", params={f"a{i}": 1.0 for i in range(8)}),
                 dict(score_mod="s + " + "a" * 31, params={"a" * 31: 1.0})]
        for kw in cases:
            with self.subTest(**{k: repr(v)[:60] for k, v in kw.items()}):
                self.assertGreaterEqual(plan(**kw).splits, 1)

    def test_past_the_limits(self):
        cases = [
            (dict(batch=65536), r"batch 65536 is invalid: must be in 1\.\.65535"),
            (dict(heads_q=65536), r"heads_q 65536 is invalid: must be in 1\.\.65535"),
            (dict(heads_q=8, heads_kv=9), r"heads_kv 9 is invalid: must be in 1\.\.8"),
            (dict(seq_q=2 ** 30 + 1), r"seq_q 1073741825 is invalid: must be in 1\.\.1073741824"),
            (dict(seq_q=1, seq_kv=2 ** 30 + 1), r"seq_kv 1073741825 is invalid"),
            (dict(head_dim=257), r"head_dim 257 is invalid"),
            (dict(splits=257), r"splits 257 is invalid"),
            (dict(window=(2 ** 30 + 1, 0)), r"window_left 1073741825 is outside -1 \(unbounded\)\.\.1073741824"),
            (dict(window=(0, -2)), r"window_right -2 is outside"),
            (dict(sm_count=1025), r"sm_count 1025 is invalid"),
            (dict(score_mod="s" + " " * 1024), r"mods\.score is 1025 characters long; the limit is 1024"),
            (dict(score_mod="s", params={f"a{i}": 1.0 for i in range(9)}), r"num_params 9 is outside 0\.\.8"),
            (dict(score_mod="s", params={"a" * 32: 1.0}), r"at most 31 characters"),
            (dict(score_mod="s + t(0)", params={"t": TP("f32", (2 ** 31,))}),
             r"extents\[0\] = 2147483648 is outside 1\.\.2147483647"),
        ]
        for kw, pattern in cases:
            with self.subTest(**{k: repr(v)[:60] for k, v in kw.items()}):
                self.refuses(ValueError, pattern, plan, **kw)

    def test_2_to_the_30_plans(self):
        """seq_q or seq_kv 2^30 used to loop for ever in the planner: each
        in a child process with a time limit, so a hang fails one case."""
        cases = ["flashjit.plan(1, 1, 2 ** 30, 64)",
                 "flashjit.plan(1, 1, 1, 64, seq_kv=2 ** 30)",
                 "flashjit.plan(1, 32, 1, 128, heads_kv=8, seq_kv=2 ** 30)",
                 "flashjit.plan(1, 1, 2 ** 30, 64, seq_kv=2 ** 30, causal='bottom_right')",
                 "flashjit.plan(1, 1, 2 ** 30, 128, arch='sm_80')",
                 "flashjit.Kernel(64, params=None).name and flashjit.plan(2, 8, 2 ** 30, 64)"]
        for code in cases:
            with self.subTest(code=code):
                try:
                    out = subprocess.run([sys.executable, "-c",
                                          f"import flashjit; print({code})"],
                                         capture_output=True, text=True, timeout=120)
                except subprocess.TimeoutExpired:
                    self.fail(f"{code} did not finish in 120 s")
                self.assertEqual(out.returncode, 0, out.stderr)
                self.assertIn("Plan(", out.stdout)


class Truncation(Case):
    """What ctypes would have cut to its low bits, or float32 to 0, is
    refused in Python with the value as given."""

    def test_ints(self):
        cases = [
            (flashjit.Kernel, (64,), dict(tile_m=BIG32 + 128), r"tile_m=4294967424 does not fit a C int32_t"),
            (flashjit.Kernel, (64,), dict(tile_n=-BIG32), r"tile_n=-4294967296 does not fit a C int32_t"),
            (flashjit.Kernel, (64,), dict(warps=BIG32 + 4), r"warps=4294967300 does not fit"),
            (flashjit.Kernel, (64,), dict(stages=2 ** 63), r"stages=9223372036854775808 does not fit"),
            (flashjit.Kernel, (BIG32 + 64,), {}, r"head_dim=4294967360 does not fit a C int32_t"),
            (flashjit.Kernel, (64,), dict(window=(BIG32 - 1, 0)), r"window\[0\]=4294967295 does not fit"),
            (flashjit.Kernel, (64,), dict(window=(0, BIG32)), r"window\[1\]=4294967296 does not fit"),
            (flashjit.Kernel, (64,), dict(sm_count=BIG32 + 1), r"sm_count=4294967297 does not fit"),
            (flashjit.plan, (1, 1, 64, 64), dict(splits=BIG32 + 2), r"splits=4294967298 does not fit a C int32_t"),
            (flashjit.plan, (BIG32 + 1, 1, 64, 64), {}, r"batch=4294967297 does not fit"),
            (flashjit.plan, (1, BIG32 + 8, 64, 64), {}, r"heads_q=4294967304 does not fit"),
            (flashjit.plan, (1, 8, 64, 64), dict(heads_kv=BIG32 + 8), r"heads_kv=4294967304 does not fit"),
            (flashjit.plan, (1, 1, BIG32 + 64, 64), {}, r"seq_q=4294967360 does not fit"),
            (flashjit.plan, (1, 1, 64, 64), dict(seq_kv=BIG32 + 64), r"seq_kv=4294967360 does not fit"),
            (flashjit.plan, (1, 1, 64, 64), dict(sm_count=-BIG32), r"sm_count=-4294967296 does not fit"),
            (flashjit.plan, (1, 1, 64, 64), dict(score_mod="s + t(0)", params={"t": TP("f32", (2 ** 64 + 8,))}),
             r"params\['t'\] extent 0=18446744073709551624 does not fit a C int64_t"),
            (flashjit.plan, (1, 1, 64, 64), dict(score_mod="s + t(0, 0)", params={"t": TP("f32", (8, -2 ** 64))}),
             r"extent 1=-18446744073709551616 does not fit"),
            (flashjit.plan, (1, 1, 64, 64), dict(score_mod="s + (float)x", params={"x": 2 ** 40}),
             r"params\['x'\]=1099511627776 is not an i32 \(-2147483648\.\.2147483647\)"),
            (flashjit.plan, (1, 1, 64, 64), dict(score_mod="s + (float)x", params={"x": 2 ** 31}),
             r"params\['x'\]=2147483648 is not an i32"),
            (flashjit.plan, (1, 1, 64, 64), dict(score_mod="s + (float)x", params={"x": -2 ** 31 - 1}),
             r"params\['x'\]=-2147483649 is not an i32"),
            (flashjit.plan, (1, 1, 64, 64), dict(score_mod="s + (float)x", params={"x": 2 ** 2000}),
             r"is not an i32"),
            (flashjit.layout, ("mma_acc_f16",), dict(arch="sm_90a\x00"), r"arch='sm_90a\\x00' holds a NUL"),
        ]
        for fn, args, kw, pattern in cases:
            with self.subTest(fn=fn.__name__, args=repr(args)[:40], kw=repr(kw)[:60]):
                self.refuses(ValueError, pattern, fn, *args, **kw)

    def test_floats(self):
        cases = [
            (dict(softcap=1e-50), r"softcap=1e-50 is below float32's smallest normal number 1\.17549e-38"),
            (dict(softcap=1e-40), r"softcap=1e-40 is below float32's smallest normal number"),
            (dict(softcap=5e-324), r"softcap=5e-324 is below"),
            (dict(softcap=1e39), r"softcap=1e\+39 is not a finite float32"),
            (dict(softcap=10 ** 400), r"is not a finite float32"),
            (dict(scale=1e-40), r"scale=1e-40 is below float32's smallest normal number"),
            (dict(scale=1e39), r"scale=1e\+39 is not a finite float32"),
            (dict(scale=-1e39), r"scale=-1e\+39 is not a finite float32"),
            (dict(scale=10 ** 400), r"is not a finite float32"),
            (dict(score_mod="s + x", params={"x": 1e39}), r"params\['x'\]=1e\+39 is not a finite float32"),
            (dict(score_mod="s + x", params={"x": float("inf")}), r"params\['x'\]=inf is not a finite float32"),
            (dict(score_mod="s + x", params={"x": float("nan")}), r"params\['x'\]=nan is not a finite float32"),
            (dict(score_mod="s + x", params={"x": -1e300}), r"is not a finite float32"),
            (dict(score_mod="s + x", params={"x": 1e-50}),
             r"params\['x'\]=1e-50 would be 0 as a float32 \(\|value\| at least 1\.4013e-45"),
            (dict(score_mod="s + x", params={"x": -7e-46}), r"params\['x'\]=-7e-46 would be 0"),
        ]
        for kw, pattern in cases:
            with self.subTest(kw=repr(kw)[:60]):
                self.refuses(ValueError, pattern, plan, **kw)

    def test_nul(self):
        cases = [
            (dict(score_mod="s\x00 + 1.f"), r"score_mod='s\\x00 \+ 1\.f' holds a NUL character at index 1"),
            (dict(mask_mod="q >= kv\x00 && 0"), r"mask_mod=.* holds a NUL character at index 7"),
            (dict(mask_mod="\x00"), r"holds a NUL character at index 0"),
            (dict(score_mod="s + x", params={"x\x00y": 1.0}), r"params name='x\\x00y' holds a NUL"),
            (dict(arch="sm_80\x00garbage"), r"arch='sm_80\\x00garbage' holds a NUL character at index 5"),
        ]
        for kw, pattern in cases:
            with self.subTest(kw=repr(kw)[:60]):
                self.refuses(ValueError, pattern, plan, **kw)
        self.refuses(ValueError, r"holds a NUL", flashjit.Kernel, 64, score_mod="s\x00")
        self.refuses(ValueError, r"holds a NUL", flashjit.Kernel, 64, arch="\x00")


class Expressions(Case):
    """The library's class 3 refusals, through Python."""

    def test_refused(self):
        cases = [
            (dict(mask_mod="kv / 0 == 0"), r"'/' at column 4: an int divided by the constant 0"),
            (dict(mask_mod="kv % 0 == 0"), r"'%' at column 4: an int divided by the constant 0"),
            (dict(score_mod="s + (float)(q / (2 - 2))"), r"divided by the constant 0"),
            (dict(mask_mod="(kv << 32) == 0"), r"a shift by 32; an int32 shifts by 0\.\.31"),
            (dict(mask_mod="(kv >> -3) == 0"), r"a shift by -3"),
            (dict(mask_mod="2147483647 + 1 > q"), r"the constant result 2147483648 is outside int32's range"),
            (dict(mask_mod="65536 * 65536 > q"), r"the constant result 4294967296"),
            (dict(score_mod="s + NULL", params={"NULL": 1.0}), r"\"NULL\" is reserved: a macro of the C or CUDA headers"),
            (dict(score_mod="s + INFINITY", params={"INFINITY": 1.0}), r"is reserved: a macro"),
            (dict(score_mod="s + assert", params={"assert": 1.0}), r"is reserved: a macro"),
            (dict(score_mod="s + (float)INT_MAX", params={"INT_MAX": 1}), r"is reserved: a macro"),
            (dict(score_mod="s + t(0, 0, 0, 0)",
                  params={"t": TP("f32", (2 ** 31 - 1,) * 4)}),
             r"extents \[2147483647,2147483647,2147483647,2147483647\] take more than 9223372036854775807 bytes"),
            (dict(score_mod="s + t(0, 0, 0)",
                  params={"t": TP("bf16", (2 ** 31 - 1, 2 ** 31 - 1, 4))}), r"take more than"),
            (dict(scale=3e38), r"scale 3e\+38 is too large: scale x log2\(e\) must be a finite float32"),
        ]
        for kw, pattern in cases:
            with self.subTest(kw=repr(kw)[:60]):
                self.refuses(flashjit.InvalidArgument, pattern, plan, **kw)

    def test_accepted(self):
        for kw in [dict(mask_mod="kv / (q - q) == 0"), dict(mask_mod="(q << kv) != 0"),
                   dict(mask_mod="-2147483647 - 1 < q"), dict(score_mod="s / 0.f"),
                   dict(score_mod="s + null", params={"null": 1.0})]:
            with self.subTest(kw=repr(kw)):
                self.assertTrue(plan(**kw).name.startswith("fj_attn"))

    def test_kernel_form(self):
        """The int operations C leaves undefined print as the functions
        that define them, as the host evaluator computes them."""
        k = flashjit.Kernel(64, arch="sm_80", mask_mod="kv / (q + 1) >= (q << (kv & 3)) % (kv + 1)")
        for form in ("fj::idiv(kv, fj::iadd(q, 1))", "fj::imod(fj::ishl(q, (kv & 3)), fj::iadd(kv, 1))"):
            self.assertIn(form, k.source)


if __name__ == "__main__":
    unittest.main()
