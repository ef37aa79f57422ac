"""Import and inspection with no GPU: Kernel, plan, layout, fragments."""
import ctypes as C
import io
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

import fjtest
import flashjit
from flashjit import _capi as capi
from flashjit import _core as core

PKG = os.path.dirname(os.path.abspath(flashjit.__file__))


class Import(unittest.TestCase):
    def test_version(self):
        self.assertEqual(flashjit.library_version(), flashjit.__version__)

    def test_builtin_mods(self):
        b = flashjit.builtin_mods()
        self.assertEqual(b["documents"]["mask_mod"], "doc(q) == doc(kv)")
        self.assertIn("slopes", b["alibi"]["params"])
        self.assertEqual(b["softcap"]["field"], "softcap")
        # Each expression compiles into a kernel for sm_80 (no GPU needed).
        k = flashjit.Kernel(head_dim=64, arch="sm_80", mma="mma",
                            mask_mod=b["prefix-lm"]["mask_mod"],
                            params={"prefix": flashjit.TensorParam("i32", (4,))})
        self.assertIn("kv < prefix(b) || kv <= q", k.source)
        # T5's buckets: a relative table (README), read in the expression's
        # place as the parameter after the user's.
        t5 = flashjit.Kernel(head_dim=64, arch="sm_80", mma="mma",
                             score_mod=b["t5"]["score_mod"],
                             params={"bias": flashjit.TensorParam("f32", (8, 32))})
        self.assertIn("ModTensor_fj_rt fj_rt;", t5.source)
        self.assertIn("(s + fj_dg)", t5.source)

    def test_library_path(self):
        self.assertTrue(os.path.isfile(flashjit.library_path()), flashjit.library_path())

    def test_import_needs_no_library(self):
        # A copy of the package without its library, with FLASHJIT_LIB unset:
        # importing works, the first call says where the library was looked
        # for and how to get one.
        with tempfile.TemporaryDirectory() as d:
            shutil.copytree(PKG, os.path.join(d, "flashjit"),
                            ignore=shutil.ignore_patterns("*.so*", "__pycache__"))
            env = {k: v for k, v in os.environ.items() if k != "FLASHJIT_LIB"}
            env["PYTHONPATH"] = d
            code = ("import flashjit\n"
                    "try:\n    flashjit.Kernel(64)\n"
                    "except flashjit.LibraryNotFound as e:\n    print(e)\n")
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                 text=True, check=True).stdout
        self.assertIn("libflashjit.so is not in the package", out)
        self.assertIn("FLASHJIT_LIB", out)
        self.assertIn("pip install ./python", out)

    def test_missing_env_library(self):
        env = dict(os.environ, FLASHJIT_LIB="/nonexistent/libflashjit.so",
                   PYTHONPATH=os.path.dirname(PKG))
        code = ("import flashjit\n"
                "try:\n    flashjit.plan(1, 8, 128, 64)\n"
                "except ImportError as e:\n    print(type(e).__name__, e)\n")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True).stdout
        self.assertEqual(out.strip(), "LibraryNotFound flashjit: "
                         "FLASHJIT_LIB=/nonexistent/libflashjit.so: no such file")

    def test_library_of_another_abi(self):
        # A library whose structs are laid out otherwise is refused, naming
        # both layouts, before any struct crosses over.
        env = dict(os.environ, PYTHONPATH=os.path.dirname(PKG))
        code = ("import flashjit\nfrom flashjit import _capi\n_capi.ABI_VERSION += 1\n"
                "try:\n    flashjit.plan(1, 8, 128, 64)\n"
                "except ImportError as e:\n    print(type(e).__name__, e)\n")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True).stdout
        self.assertIn("LibraryNotFound", out)
        abi = flashjit._capi.ABI_VERSION
        self.assertIn(f"does not match this binding: its structs are ABI {abi}; this "
                      f"binding mirrors ABI {abi + 1}", out)

    @unittest.skipIf(fjtest.HAS_TORCH, "PyTorch is installed")
    def test_attention_without_torch(self):
        with self.assertRaisesRegex(ImportError, "flashjit.attention needs PyTorch"):
            flashjit.attention(None, None, None)
        with self.assertRaisesRegex(ImportError, "flashjit.block_mask needs PyTorch"):
            flashjit.block_mask(batch=1, heads_q=1, seq_q=1, seq_kv=1)
        with self.assertRaisesRegex(ImportError, "flashjit.BlockMask needs PyTorch"):
            flashjit.BlockMask(None, None)


    def test_old_torch_is_taken_as_none(self):
        # A PyTorch without torch.library.custom_op (before 2.4), here a
        # stand-in module in a child process: the package imports, names the
        # version it needs and the one it found, and inspection still works.
        env = dict(os.environ, PYTHONPATH=os.path.dirname(PKG))
        code = ("import sys, types\n"
                "t = types.ModuleType('torch'); t.__version__ = '1.13.1'\n"
                "t.library = types.ModuleType('torch.library')\n"
                "sys.modules['torch'] = t; sys.modules['torch.library'] = t.library\n"
                "import flashjit\n"
                "for f in (lambda: flashjit.attention(None, None, None), lambda: flashjit.merge([], [])):\n"
                "    try:\n        f()\n    except ImportError as e:\n        print('ImportError', e)\n"
                "print(flashjit.native_training())\n"
                "print(flashjit.plan(1, 8, 128, 64, arch='sm_80').kernel)\n")
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("ImportError flashjit.attention needs PyTorch 2.4 or newer "
                      "(torch.library.custom_op); this is PyTorch 1.13.1; Kernel, plan "
                      "and layout work without it", r.stdout)
        self.assertIn("ImportError flashjit.merge needs PyTorch 2.4 or newer", r.stdout)
        self.assertIn("(False, 'flashjit needs PyTorch 2.4 or newer", r.stdout)
        self.assertIn("fj_attn_", r.stdout)


class KernelInspection(unittest.TestCase):
    def check_kernel(self, k):
        self.assertIn('extern "C" __global__', k.source)
        self.assertIn(k.name, k.source)
        self.assertIn(f".entry {k.name}", k.ptx)
        self.assertGreater(len(k.cubin), 1000)
        r = k.resources
        self.assertGreater(r.registers, 0)
        self.assertLessEqual(r.registers, 255)
        self.assertEqual(r.spills, 0, f"{k.name} spills on {k.arch}: {r}")
        self.assertEqual(r.local_bytes, 0)
        self.assertGreater(r.shared_bytes, 0)
        self.assertIn(r.cache, ("miss", "memory", "disk"))

    def test_pick_sm90a(self):
        for d in (64, 128):
            k = flashjit.Kernel(head_dim=d, arch="sm_90a", dtype="bf16", causal="top_left")
            self.assertEqual(k.arch, "sm_90a")
            self.assertEqual(k.variant["mma"], "wgmma")
            self.assertEqual(k.variant["head_dim"], d)
            self.assertEqual(k.variant["causal"], "top_left")
            self.assertTrue(k.name.startswith(f"fj_attn_d{d}_"), k.name)
            self.check_kernel(k)

    def test_pick_sm80(self):
        # The mma family's pick.  (Its 128-row prefill tiles spill at head
        # dim 128 on sm_80, and without a mask at 64; reported, not hidden.)
        k = flashjit.Kernel(head_dim=64, arch="sm_80", dtype="f16", causal="bottom_right")
        self.assertEqual(k.variant["mma"], "mma")
        self.assertEqual(k.variant["causal"], "bottom_right")
        self.check_kernel(k)

    def test_explicit_axes(self):
        k = flashjit.Kernel(64, arch="sm_80", dtype="f16", mma="wmma", tile_m=64, tile_n=64,
                            warps=4, stages=1, swizzle="pad", softmax="smem")
        self.assertEqual(k.name, "fj_attn_d64_m64_n64_w4_s1_pad_smem_wmma_nc_f16")
        self.assertEqual(k.resources.spills, 0)

    def test_family_switch_takes_its_defaults(self):
        k = flashjit.Kernel(128, arch="sm_90a", dtype="bf16", mma="mma")
        self.assertEqual(k.variant["mma"], "mma")
        k = flashjit.Kernel(128, arch="sm_90a", dtype="bf16", mma="wgmma", tile_n=128)
        self.assertEqual((k.variant["tile_m"], k.variant["warps"], k.variant["swizzle"],
                          k.variant["tile_n"]), (128, 12, "xor", 128))

    def test_same_kernel_from_memory(self):
        a = flashjit.Kernel(64, arch="sm_90a", dtype="f16")
        b = flashjit.Kernel(64, arch="sm_90a", dtype="f16")
        self.assertEqual(a.name, b.name)
        self.assertEqual(b.resources.cache, "memory")

    def test_modifications(self):
        k = flashjit.Kernel(128, arch="sm_90a", dtype="bf16", causal="bottom_right",
                            window=(256, 0), softcap=30.0,
                            score_mod="s + slopes(h) * (float)(kv - q)",
                            params={"slopes": flashjit.TensorParam("f32", (16,))})
        self.assertRegex(k.name, r"_win_cap_x[0-9a-f]{8}$")
        self.assertIn('#line 1 "score"', k.source)
        self.assertIn("slopes(h)", k.source)
        self.assertEqual(k.resources.spills, 0)
        m = flashjit.Kernel(64, arch="sm_80", dtype="f16", mask_mod="kv % 2 == 0 || q < n",
                            params={"n": 3})
        self.assertIn('#line 1 "mask"', m.source)

    def test_fp8_kv(self):
        k = flashjit.Kernel(128, arch="sm_90a", dtype="bf16", kv_dtype="e4m3")
        self.assertEqual(k.variant["kv_dtype"], "e4m3")
        # FP8 K/V ride the mma family's cp.async ring (tile_fp8.cuh).
        self.assertEqual(k.variant["mma"], "mma")
        self.assertGreaterEqual(k.variant["stages"], 2)
        self.assertIn("ring8_load(", k.source)

    def test_log(self):
        k = flashjit.Kernel(64, arch="sm_80", dtype="f16")
        self.assertIsInstance(k.log, str)
        self.assertIn(k.name, repr(k))


class Switches(unittest.TestCase):
    """The switches that compile another kernel: sinks ("_sink"), a block
    mask's block sizes ("_bm<q>x<kv>") and checked mode ("_chk"), each
    against the same kernel without it, so that every marker is one the
    switch puts there."""

    DOC = dict(mask_mod="doc(q) == doc(kv)",
               params={"doc": flashjit.TensorParam("i32", (4096,))})

    def pair(self, switch, head_dim=128, **kw):
        """(the kernel without the switch, the kernel with it)."""
        return (flashjit.Kernel(head_dim, **kw),
                flashjit.Kernel(head_dim, **dict(kw, **switch)))

    def test_sinks(self):
        for arch, d in (("sm_90a", 128), ("sm_80", 64)):
            with self.subTest(arch=arch):
                off, on = self.pair(dict(sinks=True), d, arch=arch, causal="top_left")
                self.assertEqual(on.name, off.name + "_sink")
                # The epilogue reads each row's head's sink.
                self.assertIn("p.sinks[", on.source)
                self.assertNotIn("p.sinks[", off.source)
                self.assertIn(f".entry {on.name}", on.ptx)
        self.assertEqual(on.variant, off.variant)  # a modification, not an axis

    def test_block_mask(self):
        for arch, d, blocks in (("sm_90a", 128, (128, 128)), ("sm_90a", 128, (256, 128)),
                                ("sm_80", 64, (64, 64))):
            with self.subTest(arch=arch, blocks=blocks):
                off, on = self.pair(dict(block_mask=blocks), d, arch=arch, causal="top_left",
                                    **self.DOC)
                self.assertRegex(on.name, rf"_bm{blocks[0]}x{blocks[1]}_x[0-9a-f]{{8}}$")
                self.assertNotIn("_bm", off.name)
                # The key tiles come from the lists, not from the tile counter.
                self.assertIn("fj::list_n0(", on.source)
                self.assertNotIn("fj::list_n0(", off.source)
                self.assertEqual(blocks[0] % on.variant["tile_m"], 0, on.name)
                self.assertEqual(blocks[1] % on.variant["tile_n"], 0, on.name)
                self.assertEqual(on.resources.spills, 0, f"{on.name}: {on.resources}")

    def test_block_mask_alone(self):
        # No expression: the lists alone decide which key blocks run.
        k = flashjit.Kernel(128, arch="sm_90a", block_mask=(128, 128))
        self.assertTrue(k.name.endswith("_bm128x128"), k.name)
        self.assertIn("fj::list_n0(", k.source)

    def test_checked(self):
        off, on = self.pair(dict(checked=True), arch="sm_90a", **self.DOC)
        # The same axes; the modifications' hash ("_x...") covers checked mode.
        self.assertRegex(off.name, r"_x[0-9a-f]{8}$")
        self.assertRegex(on.name, r"_x[0-9a-f]{8}_chk$")
        self.assertEqual(on.name[:-len("_x12345678_chk")], off.name[:-len("_x12345678")])
        # Each tensor read that is out of range records itself.
        self.assertIn("fj::oob_record(", on.source)
        self.assertNotIn("oob_record", off.source)
        # A problem without a tensor parameter has nothing to check: the
        # same kernel, as in C.
        plain = flashjit.Kernel(128, arch="sm_90a", checked=True)
        self.assertEqual(plain.name, flashjit.Kernel(128, arch="sm_90a").name)
        self.assertNotIn("oob_record", plain.source)

    def test_all_three(self):
        k = flashjit.Kernel(128, arch="sm_90a", causal="top_left", block_mask=(128, 128),
                            sinks=True, checked=True, **self.DOC)
        self.assertRegex(k.name, r"_tl_bf16_bm128x128_x[0-9a-f]{8}_sink_chk$")
        for marker in ("fj::list_n0(", "p.sinks[", "fj::oob_record("):
            self.assertIn(marker, k.source)
        self.assertEqual(k.resources.spills, 0, k.resources)

    def test_family_switch_keeps_them(self):
        k = flashjit.Kernel(128, arch="sm_90a", mma="mma", block_mask=(64, 128), sinks=True)
        self.assertEqual(k.variant["mma"], "mma")
        self.assertTrue(k.name.endswith("_bm64x128_sink"), k.name)
        self.assertIn("fj::list_n0(", k.source)

    def test_plan(self):
        p = flashjit.plan(2, 16, 4096, 128, causal="top_left", block_mask=(128, 128),
                          arch="sm_90a", **self.DOC)
        self.assertRegex(p.name, r"_bm128x128_x[0-9a-f]{8}$")
        self.assertEqual(p.splits, 1)  # block masks take no split-KV
        self.assertEqual(p.kernel().name, p.name)
        self.assertIn("fj::list_n0(", p.kernel().source)
        # A decode step: the unmasked plan splits the keys, the masked one
        # does not.
        self.assertGreater(flashjit.plan(1, 32, 1, 128, heads_kv=8, seq_kv=4096,
                                         arch="sm_90a").splits, 1)
        d = flashjit.plan(1, 32, 1, 128, heads_kv=8, seq_kv=4096, block_mask=(64, 128),
                          arch="sm_90a")
        self.assertEqual(d.splits, 1)
        self.assertTrue(d.name.endswith("_bm64x128"), d.name)
        s = flashjit.plan(1, 32, 1, 128, heads_kv=8, seq_kv=4096, sinks=True, arch="sm_90a")
        self.assertTrue(s.name.endswith("_split_sink"), s.name)
        c = flashjit.plan(1, 16, 1024, 64, checked=True, arch="sm_80", **self.DOC)
        self.assertTrue(c.name.endswith("_chk"), c.name)

    @unittest.skipUnless(fjtest.HAS_TORCH, fjtest.NO_TORCH)
    def test_block_mask_object(self):
        # A BlockMask gives a Kernel its block sizes, and a plan its shape,
        # which the library checks against the problem.
        from fjtest import torch
        i32 = torch.int32
        bm = flashjit.BlockMask(torch.zeros(1, 4, 8, dtype=i32),
                                torch.zeros(1, 4, 8, 16, dtype=i32), block_q=128, block_kv=64)
        k = flashjit.Kernel(128, arch="sm_90a", block_mask=bm)
        self.assertTrue(k.name.endswith("_bm128x64"), k.name)
        p = flashjit.plan(2, 4, 1000, 128, seq_kv=1000, block_mask=bm, arch="sm_90a")
        self.assertTrue(p.name.endswith("_bm128x64"), p.name)
        with self.assertRaisesRegex(flashjit.InvalidArgument, r"mods.block_mask is 8 x 16 "
                                    r"blocks of 128 x 64; seq_q 1000 and seq_kv 2000 need "
                                    r"8 x 32"):
            flashjit.plan(2, 4, 1000, 128, seq_kv=2000, block_mask=bm, arch="sm_90a")
        with self.assertRaisesRegex(flashjit.InvalidArgument, r"mods.block_mask->heads 4: 1 "
                                    r"\(one mask for every head\) or the problem's heads_q 8"):
            flashjit.plan(2, 8, 1000, 128, block_mask=bm, arch="sm_90a")


class Plans(unittest.TestCase):
    def test_decode_gqa_split(self):
        p = flashjit.plan(1, 32, 1, 128, heads_kv=8, seq_kv=4096, arch="sm_90a")
        self.assertEqual(p.arch, "sm_90a")
        self.assertEqual(p.sm_count, 132)
        self.assertEqual(p.variant["mma"], "mma")
        self.assertEqual(p.variant["pack_gqa"], 1)
        self.assertGreater(p.splits, 1)
        self.assertEqual(p.variant["split_kv"], 1)
        self.assertGreater(p.workspace_bytes, 0)
        self.assertEqual(p.choice, "heuristic")
        self.assertEqual(len(p.grid), 3)
        self.assertTrue(p.name.endswith("_gqa_split"), p.name)
        k = p.kernel()
        self.assertEqual(k.name, p.name)

    def test_prefill(self):
        p = flashjit.plan(4, 16, 4096, 128, causal="top_left", arch="sm_90a")
        self.assertEqual(p.variant["mma"], "wgmma")
        self.assertEqual(p.splits, 1)
        self.assertEqual(p.workspace_bytes, 0)
        self.assertEqual(p.variant["causal"], "top_left")

    def test_sm_count(self):
        p = flashjit.plan(1, 8, 1, 64, seq_kv=8192, arch="sm_80", sm_count=16)
        self.assertEqual(p.sm_count, 16)
        self.assertEqual(flashjit.plan(1, 8, 1, 64, arch="sm_80").sm_count, 108)

    def test_layout_bshd_and_mods(self):
        p = flashjit.plan(2, 8, 512, 64, layout="bshd", window=(128, 0),
                          causal="bottom_right", arch="sm_80")
        self.assertTrue(p.name.endswith("_win"), p.name)

    def test_splits_asked(self):
        p = flashjit.plan(1, 8, 1, 128, seq_kv=4096, splits=4, arch="sm_90a")
        self.assertEqual(p.splits, 4)


class Fp8(unittest.TestCase):
    """dtype "e4m3" (Q, K and V in FP8, O in bf16) planned and compiled
    with no GPU: the wgmma family on sm_90a, refused elsewhere with the
    library's message."""

    def test_plan(self):
        p = flashjit.plan(2, 8, 1024, 128, heads_kv=2, dtype="e4m3", causal="top_left",
                          arch="sm_90a")
        self.assertIn("e4m3", p.name)
        self.assertEqual((p.variant["mma"], p.variant["dtype"], p.variant["kv_dtype"]),
                         ("wgmma", "e4m3", "e4m3"))
        # V^T is written into the workspace before the attention kernel runs.
        self.assertGreater(p.workspace_bytes, 0)
        self.assertEqual(p.kernel().name, p.name)
        # torch's name for it, and kv_dtype e4m3 beside it.
        self.assertEqual(flashjit.plan(2, 8, 1024, 128, dtype="float8_e4m3fn",
                                       kv_dtype="e4m3", arch="sm_90a").variant["dtype"],
                         "e4m3")

    def test_kernel(self):
        k = flashjit.Kernel(128, arch="sm_90a", dtype="e4m3", causal="top_left",
                            window=(256, 0), sinks=True)
        self.assertIn("_e4m3", k.name)
        self.assertEqual(k.variant["dtype"], "e4m3")
        self.assertIn(f".entry {k.name}", k.ptx)
        self.assertEqual(k.resources.spills, 0, k.resources)

    def test_o_dtype(self):
        # FP8 attention's own O: named "_oe4m3" (a kernel of its own), its
        # amax raised by an atomic max; refused for a 16-bit problem.
        p = flashjit.plan(2, 8, 1024, 64, dtype="e4m3", o_dtype="e4m3", arch="sm_90a")
        self.assertTrue(p.name.endswith("_oe4m3"), p.name)
        k = flashjit.Kernel(64, arch="sm_90a", dtype="e4m3", o_dtype="float8_e4m3fn")
        self.assertEqual(k.name, p.name)  # FP8's one tile shape
        self.assertIn("atom.global.max.u32", k.ptx)
        self.assertEqual(k.resources.spills, 0, k.resources)
        with self.assertRaisesRegex(flashjit.Unsupported, r"^o_dtype e4m3 with dtype bf16 is "
                                    r"not implemented"):
            flashjit.plan(2, 8, 1024, 64, o_dtype="e4m3", arch="sm_90a")

    def test_refused_with_the_library_message(self):
        with self.assertRaisesRegex(flashjit.Unsupported, r"^mma wgmma \(wgmma.mma_async, "
                                    r"TMA\) needs sm_90a; the target is sm_80$"):
            flashjit.plan(2, 8, 1024, 128, dtype="e4m3", arch="sm_80")
        with self.assertRaisesRegex(flashjit.Unsupported, r"^dtype e4m3 with a score "
                                    r"expression or softcap at head_dim 256 is not implemented"):
            flashjit.plan(2, 8, 1024, 256, dtype="e4m3", softcap=30.0, arch="sm_90a")
        # At 128 and below they plan (the descales join the score's scale).
        self.assertEqual(flashjit.plan(2, 8, 1024, 128, dtype="e4m3", softcap=30.0,
                                       arch="sm_90a").variant["mma"], "wgmma")
        with self.assertRaisesRegex(flashjit.InvalidArgument, r"^kv_dtype bf16 is invalid "
                                    r"with dtype e4m3"):
            flashjit.Kernel(128, arch="sm_90a", dtype="e4m3", kv_dtype="bf16")
        with self.assertRaisesRegex(flashjit.Unsupported, r"^dtype e4m3 \(Q, K and V in "
                                    r"FP8\) is implemented for mma wgmma only"):
            flashjit.Kernel(128, arch="sm_90a", dtype="e4m3", mma="mma")

    @unittest.skipIf(fjtest.library_has_gpu(), "a GPU: test_gpu.Fp8.test_tune tunes it")
    def test_tune_looks_for_a_gpu(self):
        # fj_tune makes FP8 attention's descales itself: tune() passes
        # none, and without a GPU the call gets as far as looking for one.
        with self.assertRaisesRegex(flashjit.NoDevice, r"^flashjit.tune runs on a GPU"):
            flashjit.tune(1, 8, 512, 128, dtype="e4m3", progress=False)


class Layouts(unittest.TestCase):
    def test_fragments(self):
        names = flashjit.fragments()
        self.assertEqual(len(names), 17)
        self.assertIn("mma_acc_f16", names)
        self.assertIn("wgmma_acc_bf16", names)
        self.assertEqual(names[-2:], ("wgmma_acc_e4m3", "wgmma_a8"))

    def test_reference_a8(self):
        lut = flashjit.layout("wgmma_a8", arch="sm_90a")
        self.assertEqual((lut.rows, lut.cols, lut.lanes, lut.slots), (16, 32, 32, 16))
        self.assertEqual(lut.map[6][13], (9, 25))
        self.assertEqual(len({rc for lane in lut.map for rc in lane}), 512)

    def test_reference_table(self):
        lut = flashjit.layout("mma_acc_f16", arch="sm_90a")
        self.assertEqual((lut.rows, lut.cols, lut.lanes, lut.slots), (16, 16, 32, 8))
        self.assertEqual(lut.origin, "reference")
        self.assertEqual(lut.map[0][0], (0, 0))
        cells = {rc for lane in lut.map for rc in lane}
        self.assertEqual(len(cells), 256)  # an accumulator holds each element once
        self.assertIn("lane: (row,col)", str(lut))
        # A reference table names no device as seen here (issue 35, class 8).
        self.assertEqual(lut.device, "none (a reference table: what an NVIDIA H200 showed)")
        self.assertNotIn("device NVIDIA", str(lut))

    def test_every_reference_on_sm90a(self):
        for f in flashjit.fragments():
            with self.subTest(frag=f):
                lut = flashjit.layout(f, arch="sm_90a")
                self.assertEqual(lut.frag, f)
                self.assertEqual(len(lut.map), 32)


class ProgressBar(unittest.TestCase):
    def test_bar_in_a_log(self):
        from flashjit._inspect import _Bar
        out = io.StringIO()
        bar = _Bar("tune", out)
        for done in range(0, 41):
            bar(None, done, 40)
        lines = out.getvalue().splitlines()
        self.assertEqual(len(lines), 11)  # a line per 10% where the stream is no terminal
        self.assertRegex(lines[-1], r"^tune: 100%\|█{20}\| 40/40 \[\d\d:\d\d<00:00, "
                         r"[\d.]+ it/s\]$")
        self.assertRegex(lines[5], r"^tune:  50%\|█{10} {10}\| 20/40 ")


class TuneProblem(unittest.TestCase):
    def test_split_head_dims(self):
        """tune(head_dim_v=): V and O of that head dim, contiguous; with
        latent=True V has K's strides (MLA's cache), and latent without a
        head_dim_v is refused."""
        from flashjit._inspect import tune_problem
        lib = flashjit._core.lib()
        p = tune_problem(lib, 2, 16, 1024, 192, heads_kv=4, head_dim_v=128)
        self.assertEqual((p.head_dim, p.head_dim_v), (192, 128))
        self.assertEqual(list(p.k_stride), [4 * 1024 * 192, 1024 * 192, 192])
        self.assertEqual(list(p.v_stride), [4 * 1024 * 128, 1024 * 128, 128])
        self.assertEqual(list(p.o_stride), [16 * 1024 * 128, 1024 * 128, 128])
        m = tune_problem(lib, 1, 16, 1, 576, heads_kv=1, seq_kv=4096, head_dim_v=512,
                         latent=True)
        self.assertEqual(list(m.v_stride), list(m.k_stride))
        self.assertEqual(list(m.o_stride), [16 * 512, 512, 512])
        plain = tune_problem(lib, 1, 8, 512, 64)
        self.assertEqual((plain.head_dim_v, list(plain.v_stride)), (0, list(plain.k_stride)))
        with self.assertRaisesRegex(ValueError, r"latent=True .* give head_dim_v"):
            tune_problem(lib, 1, 8, 512, 64, latent=True)


class NoGpu(unittest.TestCase):
    def test_tune_needs_gpu(self):
        if fjtest.library_has_gpu():
            self.skipTest("a GPU is present")
        with self.assertRaises(flashjit.NoDevice) as e:
            flashjit.tune(1, 8, 512, 64, progress=False)
        self.assertIsInstance(e.exception, RuntimeError)
        self.assertTrue(str(e.exception))
        self.assertEqual(e.exception.status_name, "no CUDA device or driver")

    def test_layout_probe_needs_gpu(self):
        if fjtest.library_has_gpu():
            self.skipTest("a GPU is present")
        with self.assertRaises(flashjit.NoDevice):
            flashjit.layout("mma_acc_f16")


class WheelKernels(unittest.TestCase):
    """A wheel built with FLASHJIT_WHEEL_KERNELS=ON carries a kernel package
    in flashjit/kernels (python/CMakeLists.txt); the package's contexts
    consult it unless $FLASHJIT_PACKAGE_DIR is set.  A small package made
    here stands for it."""

    @classmethod
    def setUpClass(cls):
        # Made by this process's library (its NVRTC: a package another
        # NVRTC made is refused, as it should be): one kernel and the
        # layout probe, sealed.
        cls.tmp = tempfile.mkdtemp(prefix="fj-wheel-kernels-")
        cls.pkg = os.path.join(cls.tmp, "kernels")
        L = core.lib()
        o = capi.CtxOpts()
        L.fj_ctx_opts_init(C.byref(o))
        o.device, o.arch, o.cache_dir = -1, b"sm_90a", os.fsencode(cls.pkg)
        o.package_dir = b""
        ctx = C.c_void_p()
        core.check(L.fj_ctx_create(C.byref(ctx), C.byref(o)), None)
        try:
            v = capi.Variant()
            L.fj_variant_default(C.byref(v), 64, capi.F16, capi.CAUSAL_NONE)
            core.check(L.fj_cache_prewarm(ctx, C.byref(v), 1, None, None, None), ctx)
            core.check(L.fj_cache_package_seal(ctx, C.byref(capi.PackageReport())), ctx)
        finally:
            L.fj_ctx_destroy(ctx)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def context(self, sm_count):
        # A fresh compile-only context (contexts are kept by arch and
        # sm_count), and the package it reads.
        ctx = core.arch_context("sm_90a", sm_count)
        d = core.lib().fj_cache_package_dir(ctx)
        return d.decode() if d else None

    def test_the_bundled_package_is_read(self):
        env = {k: v for k, v in os.environ.items() if k != "FLASHJIT_PACKAGE_DIR"}
        with mock.patch.dict(os.environ, env, clear=True), \
                mock.patch.object(core, "bundled_kernels", return_value=self.pkg):
            self.assertEqual(self.context(101), self.pkg)

    def test_the_environment_comes_first(self):
        with mock.patch.dict(os.environ, {"FLASHJIT_PACKAGE_DIR": ""}), \
                mock.patch.object(core, "bundled_kernels", return_value=self.pkg):
            self.assertIsNone(self.context(102))

    def test_no_package_in_a_plain_install(self):
        # This checkout's python/flashjit has no kernels folder.
        self.assertIsNone(core.bundled_kernels())
        # A module beside a sealed kernels folder finds it.
        with mock.patch.object(core, "__file__", os.path.join(self.tmp, "_core.py")):
            self.assertEqual(core.bundled_kernels(), self.pkg)


if __name__ == "__main__":
    unittest.main()
