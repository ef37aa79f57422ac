"""The cached calls (_calls.py) without a GPU: what a repeated call reuses
and what makes a new entry, the pointers each call writes, threads,
CUDA-graph capture's workspace, the backward's table, the options text of
the ops, their fake implementations, and torch.compile's trace of
attention(), attention_varlen() and attention_with_kvcache().

The GPU is stubbed: the tensors are CPU tensors (the device check let
through), the context a compile-only one (sm_90a: plans need no GPU),
and the launching calls a recorder.  Needs PyTorch (any build); skipped,
saying so, without it."""
import ctypes as C
import threading
import unittest
from unittest import mock

import fjtest
import flashjit
from fjtest import torch

if fjtest.HAS_TORCH:
    import torch.nn.functional as F
    from flashjit import _args as ar
    from flashjit import _blockmask as bmk, _calls as calls
    from flashjit import _capi as capi
    from flashjit import _core as core
    from flashjit import _train as tr

BF16 = torch.bfloat16 if fjtest.HAS_TORCH else None
# The library's prefetch, which Stubbed replaces.
REAL_PREFETCH = calls.prefetch_bwd if fjtest.HAS_TORCH else None


class Recorder:
    """Stands for the launching calls: keeps each call's name, arguments
    and a copy of the problem as the library would read it."""

    def __init__(self):
        self.calls = []
        self.dlse = []  # each call's fj_problem.dlse as it read: a copy, or None

    def _keep(self, name, args):
        raw = (C.c_char * C.sizeof(capi.Problem)).from_address(args[1])
        p = capi.Problem.from_buffer_copy(raw)
        self.calls.append((name, args, p))
        n = p.batch * p.heads_q * p.seq_q
        self.dlse.append(torch.tensor(list((C.c_float * n).from_address(p.dlse)))
                         .view(p.batch, p.heads_q, p.seq_q) if p.dlse else None)
        return 0

    def fwd(self, *args):
        return self._keep("fwd", args)

    def fwd_plan(self, *args):
        return self._keep("fwd_plan", args)

    def bwd(self, *args):
        return self._keep("bwd", args)

    def bwd_run(self, *args):
        return self._keep("bwd_run", args)


class Stubbed(unittest.TestCase):
    """CPU tensors through the cached calls, the GPU stubbed (the module's
    docstring); fresh tables and counts for each test."""

    def setUp(self):
        self.rec = Recorder()
        self.capturing = False
        ctx = core.arch_context("sm_90a")
        for obj, name, value in (
                (calls, "_fns", self.rec), (calls, "context", lambda index: ctx),
                (calls, "stream", lambda index: 77),
                (calls, "capturing", lambda: self.capturing),
                (calls, "ones_of", lambda dev, b, h: torch.ones(b, h)),
                (calls, "tables", calls._Tables()),
                (calls, "counts", {"plans": 0, "bwd_plans": 0}),
                # A training call's backward compiles ahead: not here (its
                # own test calls the library's).
                (calls, "prefetch_bwd", lambda e: 0),
                (ar, "_device_error", lambda *args: None)):
            patcher = mock.patch.object(obj, name, value)
            patcher.start()
            self.addCleanup(patcher.stop)

    def plans(self):
        return calls.counts["plans"]

    def launches(self):
        return len(self.rec.calls)


def qkv(b=1, hq=8, hk=8, s=128, d=64, dtype=None):
    dtype = dtype or BF16
    return (torch.randn(b, hq, s, d, dtype=dtype), torch.randn(b, hk, s, d, dtype=dtype),
            torch.randn(b, hk, s, d, dtype=dtype))


@unittest.skipUnless(fjtest.HAS_TORCH, fjtest.NO_TORCH)
class CachedCalls(Stubbed):
    def test_a_hit_does_not_plan_again(self):
        q, k, v = qkv()
        for i in range(3):
            out = flashjit.attention(q, k, v, causal="top_left")
        self.assertEqual((self.plans(), self.launches()), (1, 3))
        self.assertEqual((out.shape, out.dtype), (q.shape, q.dtype))
        self.assertTrue(out.is_contiguous())
        # One problem, launched three times with these tensors, on the stream.
        addrs = {args[1] for _, args, _ in self.rec.calls}
        self.assertEqual(len(addrs), 1)
        _, args, p = self.rec.calls[-1]
        self.assertEqual(args[2:5], (q.data_ptr(), k.data_ptr(), v.data_ptr()))
        self.assertEqual(args[5], out.data_ptr())
        self.assertEqual((args[6], args[7]), (None, 77))
        self.assertEqual((p.batch, p.heads_q, p.seq_q, p.head_dim, p.causal),
                         (1, 8, 128, 64, capi.CAUSAL_TOP_LEFT))
        # Other tensors of the same signature: the same entry.
        q2, k2, v2 = qkv()
        flashjit.attention(q2, k2, v2, causal="top_left")
        self.assertEqual((self.plans(), self.launches()), (1, 4))
        self.assertEqual(self.rec.calls[-1][1][2], q2.data_ptr())

    def test_what_makes_a_new_entry(self):
        q, k, v = qkv()
        base = dict(causal="top_left")
        calls_ = [
            ("base", (q, k, v), base),
            ("shape", qkv(s=256), base),
            ("gqa", qkv(hk=2), base),
            ("dtype", qkv(dtype=torch.float16), base),
            ("strides", (q.transpose(1, 2).contiguous().transpose(1, 2), k, v), base),
            ("causal", (q, k, v), dict(causal="bottom_right")),
            ("no causal", (q, k, v), {}),
            ("scale", (q, k, v), dict(base, scale=0.5)),
            ("window", (q, k, v), dict(base, window=(32, 0))),
            ("softcap", (q, k, v), dict(base, softcap=30.0)),
            ("lse", (q, k, v), dict(base, return_lse=True)),
            ("layout", (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)),
             dict(base, layout="bshd")),
            ("expression", (q, k, v), dict(base, score_mod="s * 0.5f")),
            ("sinks", (q, k, v), dict(base, sinks=torch.zeros(8))),
        ]
        for n, (what, tensors, kw) in enumerate(calls_, 1):
            with self.subTest(what):
                flashjit.attention(*tensors, **kw)
                self.assertEqual(self.plans(), n, f"{what}: a new signature plans")
                flashjit.attention(*tensors, **kw)
                self.assertEqual(self.plans(), n, f"{what}: its repeat does not")
        self.assertEqual(self.launches(), 2 * len(calls_))

    def test_the_problem_follows_the_signature(self):
        q, k, v = qkv(b=2, hq=8, hk=2, s=64, d=128)
        out, lse = flashjit.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                      layout="bshd", causal=True, window=(16, 0),
                                      softcap=20.0, scale=0.25, return_lse=True)
        self.assertEqual((out.shape, lse.shape), ((2, 64, 8, 128), (2, 8, 64)))
        p = self.rec.calls[-1][2]
        self.assertEqual((p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_kv, p.head_dim),
                         (2, 8, 2, 64, 64, 128))
        self.assertEqual(list(p.q_stride), [8 * 64 * 128, 64 * 128, 128])
        self.assertEqual(list(p.o_stride), [64 * 8 * 128, 128, 8 * 128])
        self.assertEqual((p.causal, p.scale), (capi.CAUSAL_TOP_LEFT, 0.25))
        m = capi.Mods.from_address(p.mods)
        self.assertEqual((m.window_left, m.window_right, m.softcap), (16, 0, 20.0))
        self.assertEqual(self.rec.calls[-1][1][6], lse.data_ptr())

    def test_split_head_dims(self):
        # v's head dim is V's and O's (fj_problem.head_dim_v), O contiguous
        # in q's layout with it.
        q, k, _ = qkv(b=2, hq=8, hk=2, s=64, d=192)
        v = torch.randn(2, 2, 64, 128, dtype=BF16)
        out = flashjit.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                 layout="bshd")
        self.assertEqual(tuple(out.shape), (2, 64, 8, 128))
        self.assertTrue(out.is_contiguous())
        p = self.rec.calls[-1][2]
        self.assertEqual((p.head_dim, p.head_dim_v), (192, 128))
        self.assertEqual(list(p.o_stride), [64 * 8 * 128, 128, 8 * 128])
        self.assertEqual(list(p.v_stride), [64 * 2 * 128, 64 * 128, 128])  # v's view
        again = flashjit.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                   layout="bshd")
        self.assertEqual((tuple(again.shape), self.plans()), ((2, 64, 8, 128), 1))
        p = self.rec.calls[-1][2]
        self.assertEqual((p.head_dim, p.head_dim_v), (192, 128))
        # One head dim: head_dim_v stays 0, O q's shape.
        q, k, v = qkv(d=64)
        flashjit.attention(q, k, v)
        self.assertEqual(self.rec.calls[-1][2].head_dim_v, 0)

    def test_arguments_keep_their_types(self):
        # The table is keyed by the arguments' reprs: a value the checks
        # refuse is refused after an equal one was accepted.
        q, k, v = qkv()
        flashjit.attention(q, k, v, causal=True, scale=1, softcap=2)
        for kw, exc in ((dict(causal=1, scale=1, softcap=2), ValueError),
                        (dict(causal=True, scale=True, softcap=2), TypeError),
                        (dict(causal=True, scale=1, softcap=True), TypeError)):
            with self.subTest(**kw):
                self.assertRaises(exc, flashjit.attention, q, k, v, **kw)
        # A list and a tuple: two keys of one signature, planned once.
        flashjit.attention(q, k, v, causal=True, window=[4, 0])
        flashjit.attention(q, k, v, causal=True, window=(4, 0))
        self.assertRaises(TypeError, flashjit.attention, q, k, v, causal=True,
                          window=(True, 0))
        self.assertEqual((self.plans(), len(calls.tables.plain)), (2, 3))

    def test_pointers_each_call(self):
        # The sinks, the tensor parameters and the descales: each call's own,
        # written into the one problem before its launch.
        q, k, v = qkv()
        for _ in range(2):
            sinks, t = torch.zeros(8), torch.zeros(8)
            flashjit.attention(q, k, v, sinks=sinks, score_mod="s + t(h)", params={"t": t})
            m = capi.Mods.from_address(self.rec.calls[-1][2].mods)
            self.assertEqual((m.sinks, m.params[0].data), (sinks.data_ptr(), t.data_ptr()))
        self.assertEqual(self.plans(), 1)
        f8 = torch.float8_e4m3fn
        q8, k8, v8 = (t.to(f8) for t in qkv(b=2, hq=8, hk=4, d=128))
        kd = torch.ones(2, 4)
        flashjit.attention(q8, k8, v8, k_descale=kd)
        p = self.rec.calls[-1][2]
        self.assertEqual(p.k_scale, kd.data_ptr())
        self.assertNotIn(p.q_scale, (None, 0, kd.data_ptr()))  # the ones, not given

    def test_fp8_kv_under_16_bit_q(self):
        # An FP8 KV cache's k and v under a bf16 q: the problem's kv_dtype
        # e4m3, k's and v's descales (per head, or one in all), O in q's
        # dtype; another entry than the 16-bit k and v's, and the descales
        # each call's own.
        f8 = torch.float8_e4m3fn
        q, k, v = qkv(b=2, hq=8, hk=4, d=128)
        flashjit.attention(q, k, v, causal=True)
        p = self.rec.calls[-1][2]
        self.assertEqual((p.dtype, p.kv_dtype), (capi.BF16, 0))
        for i in range(2):
            kd, vd = torch.full((2, 4), 0.5), torch.full((2, 4), 2.0)
            out = flashjit.attention(q, k.to(f8), v.to(f8), causal=True, k_descale=kd,
                                     v_descale=vd)
            p = self.rec.calls[-1][2]
            self.assertEqual((out.dtype, out.shape), (BF16, q.shape))
            self.assertEqual((p.dtype, p.kv_dtype, p.k_scale, p.v_scale, p.q_scale,
                              p.scale_layout),
                             (capi.BF16, capi.E4M3, kd.data_ptr(), vd.data_ptr(), None,
                              capi.SCALE_PER_HEAD))
            self.assertEqual(self.plans(), 2, f"call {i}")
        one = torch.ones(())
        flashjit.attention(q.half(), k.to(f8), v.to(f8), k_descale=one)
        p = self.rec.calls[-1][2]
        self.assertEqual((p.dtype, p.kv_dtype, p.scale_layout, p.k_scale),
                         (capi.F16, capi.E4M3, capi.SCALE_PER_TENSOR, one.data_ptr()))
        self.assertNotIn(p.v_scale, (None, 0))  # the ones, not given
        # No backward, and no q_descale (q is not FP8).
        self.assertRaisesRegex(flashjit.Unsupported, r"torch.bfloat16 q over FP8 k and v runs "
                               r"forward only: q requires grad", flashjit.attention,
                               q.clone().requires_grad_(), k.to(f8), v.to(f8))
        self.assertRaisesRegex(ValueError, r"q_descale is for an FP8 q; q is torch.bfloat16",
                               flashjit.attention, q, k.to(f8), v.to(f8), q_descale=one)
        self.assertRaisesRegex(ValueError, r"out_dtype=torch.float16 is for FP8 attention",
                               flashjit.attention, q, k.to(f8), v.to(f8),
                               out_dtype=torch.float16)

    def test_head_dims_padded_to_8(self):
        # A head dim that is not a multiple of 8: the problem's the next
        # one up, at the unpadded dim's scale (or the caller's), O sliced
        # back to v's; the same for q/k and v apart (head_dim_v).
        q, k, v = qkv(hq=8, hk=2, d=100)
        out = flashjit.attention(q, k, v, causal=True)
        p = self.rec.calls[-1][2]
        self.assertEqual((p.head_dim, p.head_dim_v, out.shape), (104, 0, q.shape))
        self.assertTrue(out.is_contiguous())
        self.assertAlmostEqual(p.scale, 0.1, places=6)
        flashjit.attention(q, k, v, scale=0.5)
        self.assertEqual(self.rec.calls[-1][2].scale, 0.5)
        out, lse = flashjit.attention(q, k, v[..., :60], return_lse=True, layout="bhsd")
        p = self.rec.calls[-1][2]
        self.assertEqual((p.head_dim, p.head_dim_v, out.shape, lse.shape),
                         (104, 64, (1, 8, 128, 60), (1, 8, 128)))
        self.assertTrue(out.is_contiguous())
        qs, ks, vs = (t.transpose(1, 2) for t in qkv(hq=4, hk=4, d=36))
        out = flashjit.attention(qs, ks, vs, layout="bshd")
        self.assertEqual((self.rec.calls[-1][2].head_dim, out.shape), (40, qs.shape))
        self.assertTrue(out.is_contiguous())
        # A tensor whose head dim is a multiple of 8 is not copied.
        with mock.patch.object(torch.nn.functional, "pad", wraps=torch.nn.functional.pad) as pad:
            flashjit.attention(q[..., :64], k[..., :64], v[..., :60])
            self.assertEqual(pad.call_count, 1)
        # The checks name the caller's dims, before any copy: split head
        # dims with grad, a v above FJ_HEAD_DIM_V_MAX.
        self.assertRaisesRegex(flashjit.Unsupported, r"head_dim_v 60 with head_dim 100 has no "
                               r"backward", flashjit.attention, q.clone().requires_grad_(), k,
                               v[..., :60])
        wide = torch.zeros(1, 2, 128, 515, dtype=BF16)
        self.assertRaisesRegex(ValueError, r"head_dim_v 515 is invalid", flashjit.attention,
                               q, k, wide)
        # With grad: the pad is part of the graph.
        out = flashjit.attention(q.clone().requires_grad_(), k, v, causal=True)
        self.assertTrue(out.requires_grad)
        # Above the library's largest, no pad: its message names the dim.
        big = torch.zeros(1, 1, 8, 580, dtype=BF16)
        self.assertRaisesRegex(ValueError, r"head_dim 580 is invalid", flashjit.attention,
                               big, big, big)

    def test_parameters_and_block_masks_are_cached(self):
        # Calls with tensor parameters and a block mask come from the table
        # too, checked once, each writing its own pointers; scalar
        # parameters are part of the key by type and repr.
        q, k, v = qkv(s=64)

        def mask():
            z = [torch.zeros(sh, dtype=torch.int32) for sh in ((1, 1, 1), (1, 1, 1, 1))]
            return flashjit.BlockMask(z[0], z[1], block_q=64, block_kv=64,
                                      q_num=z[0].clone(), q_indices=z[1].clone())

        with mock.patch.object(ar, "check_inputs", wraps=ar.check_inputs) as checks:
            first = None
            for _ in range(3):
                t, bm = torch.zeros(8), mask()
                flashjit.attention(q, k, v, score_mod="s + t(h) * z", mask_mod="kv <= q",
                                   params={"t": t, "z": 0.5}, block_mask=bm)
                m = capi.Mods.from_address(self.rec.calls[-1][2].mods)
                raw = capi.BlockMask.from_address(m.block_mask)
                self.assertEqual((m.params[0].data, raw.kv_num, raw.q_indices),
                                 (t.data_ptr(), bm.kv_num.data_ptr(), bm.q_indices.data_ptr()))
                first = first or checks.call_count  # the call's, and its entry's build
            self.assertEqual((checks.call_count, self.plans(), self.launches()), (first, 1, 3))
            # Another scalar value, type or sign: another entry; a bool is
            # refused however often an int was accepted.
            for z, plans in ((0.25, 2), (1, 3), (1.0, 4), (0.0, 5), (-0.0, 6), (1, 6)):
                flashjit.attention(q, k, v, score_mod="s * z", params={"z": z})
                self.assertEqual(self.plans(), plans, f"z={z!r}")
            for _ in range(2):
                self.assertRaises(TypeError, flashjit.attention, q, k, v, score_mod="s * z",
                                  params={"z": True})
            # The block mask's lists given are part of the key: without its
            # transposed pair, another entry.
            z = [torch.zeros(sh, dtype=torch.int32) for sh in ((1, 1, 1), (1, 1, 1, 1))]
            flashjit.attention(q, k, v, block_mask=flashjit.BlockMask(z[0], z[1], block_q=64,
                                                                      block_kv=64))
            self.assertEqual(self.plans(), 7)
            # With grad: the training table, checked once, eagerly through
            # _TrainMods with the call's own pointers.
            q.requires_grad_()
            checks.reset_mock()
            for _ in range(3):
                t, bm = torch.zeros(8), mask()
                out = flashjit.attention(q, k, v, score_mod="s + t(h) * z", mask_mod="kv <= q",
                                         params={"t": t, "z": 0.5}, block_mask=bm)
                self.assertEqual(type(out.grad_fn).__name__, "_TrainModsBackward")
                m = capi.Mods.from_address(self.rec.calls[-1][2].mods)
                self.assertEqual(m.params[0].data, t.data_ptr())
            self.assertEqual(checks.call_count, 2)  # the first call's, and its entry's build
            self.assertEqual([type(e) for e in calls.tables.train.values()], [tr.ModsCall])
            # The forward's entry is the call's own after its first call.
            self.assertIs(next(iter(calls.tables.train.values())).entry,
                          list(calls.tables.calls.values())[-1])

    def test_block_mask_key_follows_its_lists(self):
        # A mask's part of a call's key (BlockMask._key) is found once and
        # kept while its lists stay as they are: masks alike share it, a
        # change of values keeps it, and a list replaced, resized or
        # transposed in place makes the call go the checked way again.
        q, k, v = qkv(s=128)

        def mask():
            z = [torch.zeros(sh, dtype=torch.int32) for sh in ((1, 1, 2), (1, 1, 2, 2))]
            return flashjit.BlockMask(z[0], z[1], block_q=64, block_kv=64)

        def call(bm):
            flashjit.attention(q, k, v, mask_mod="kv <= q", block_mask=bm)

        bm = mask()
        self.assertEqual(bm._key()[0], mask()._key()[0])
        self.assertEqual(bm._key()[1], (bm.kv_num, bm.kv_indices))
        with mock.patch.object(ar, "check_inputs", wraps=ar.check_inputs) as checks:
            call(bm)
            first = checks.call_count
            call(bm)
            call(mask())
            bm.kv_indices.fill_(1)  # values: the same key
            call(bm)
            self.assertEqual(checks.call_count, first)
            steps = (("replaced", lambda m: setattr(m, "kv_indices", m.kv_indices.clone().transpose(2, 3))),
                     ("resized", lambda m: m.kv_num.resize_(1, 1, 1)),
                     ("transposed", lambda m: m.kv_indices.transpose_(2, 3)),
                     ("swapped", lambda m: torch.utils.swap_tensors(
                         m.kv_num, torch.zeros(1, 1, 1, dtype=torch.int32))),
                     ("written past setattr",
                      lambda m: vars(m).__setitem__("kv_num", m.kv_num[:, :, :1].clone())))
            for what, change in steps:
                bm = mask()
                call(bm)
                seen = checks.call_count
                before = bm._key()[0]
                change(bm)
                self.assertNotEqual(bm._key()[0], before, what)
                try:
                    call(bm)
                except (ValueError, RuntimeError):
                    pass  # refused: what matters is that the checks ran
                self.assertGreater(checks.call_count, seen, what)
        # A token is the process's own: a pickled or copied mask finds its
        # key again.
        import copy
        import pickle
        bm = mask()
        bm._key()
        for other in (pickle.loads(pickle.dumps(bm)), copy.deepcopy(bm), copy.copy(bm)):
            self.assertIsNone(other._sig)
            self.assertEqual(other._key()[0], bm._key()[0])
        # Inference-mode lists have no version counter: the token found
        # each call (their in-place changes seen), without reading one
        # after the first call (the refusal is slow).
        with torch.inference_mode():
            inf = mask()
        self.assertEqual(inf._key()[0], mask()._key()[0])
        self.assertIsNone(inf._sig[1])
        with mock.patch.object(bmk, "_versions", wraps=bmk._versions) as versions:
            inf._key()
            self.assertEqual(versions.call_count, 0)
        with torch.inference_mode():
            inf.kv_indices.transpose_(2, 3)
        self.assertNotEqual(inf._key()[0], mask()._key()[0])

    def test_fp8_scales_and_output(self):
        # One descale a tensor (a 0-dim tensor, vLLM's expand()) sets
        # scale_layout; out_dtype, o_scale and return_amax set o_dtype,
        # o_scale and, per call, o_amax to the amax returned.
        f8 = torch.float8_e4m3fn
        q8, k8, v8 = (t.to(f8) for t in qkv(b=2, hq=8, hk=4, d=128))
        one = torch.ones(())
        flashjit.attention(q8, k8, v8, q_descale=one, k_descale=one.reshape(1).expand(2, 4))
        p = self.rec.calls[-1][2]
        self.assertEqual((p.scale_layout, p.q_scale, p.k_scale),
                         (capi.SCALE_PER_TENSOR, one.data_ptr(), one.data_ptr()))
        flashjit.attention(q8, k8, v8, k_descale=torch.ones(2, 4))
        self.assertEqual(self.rec.calls[-1][2].scale_layout, capi.SCALE_PER_HEAD)
        out = flashjit.attention(q8, k8, v8, out_dtype=torch.float16)
        self.assertEqual((out.dtype, self.rec.calls[-1][2].o_dtype), (torch.float16, capi.F16))
        scale = torch.full((1,), 8.0)
        for _ in range(2):
            out, amax = flashjit.attention(q8, k8, v8, out_dtype=f8, o_scale=scale,
                                           return_amax=True)
            p = self.rec.calls[-1][2]
            self.assertEqual((out.dtype, amax.shape, amax.dtype), (f8, (), torch.float32))
            self.assertEqual((p.o_dtype, p.o_scale, p.o_amax),
                             (capi.E4M3, scale.data_ptr(), amax.data_ptr()))
        out, lse, amax = flashjit.attention(q8, k8, v8, return_lse=True, return_amax=True)
        self.assertEqual((out.dtype, lse.shape, self.rec.calls[-1][2].o_amax),
                         (BF16, (2, 8, q8.shape[2]), amax.data_ptr()))

    def test_threads_have_their_own(self):
        q, k, v = qkv()
        flashjit.attention(q, k, v)
        seen = []

        def run():
            flashjit.attention(q, k, v)
            seen.append(self.rec.calls[-1][1][1])

        t = threading.Thread(target=run)
        t.start()
        t.join()
        self.assertEqual(self.plans(), 2)
        self.assertNotEqual(seen[0], self.rec.calls[0][1][1])

    def test_threads_launch_their_own_pointers(self):
        # Two threads, one signature (this thread's entry made first), their
        # own sinks: each writes its pointer, then both wait inside the
        # launch until the other has written its own; each launch still
        # reads its own thread's.
        q, k, v = qkv()
        sinks = [torch.zeros(8), torch.ones(8)]
        flashjit.attention(q, k, v, sinks=sinks[0])
        met = threading.Barrier(2, timeout=10)
        seen = {}

        def launch(*args):
            met.wait()
            read = capi.Mods.from_address(capi.Problem.from_address(args[1]).mods).sinks
            seen[threading.current_thread().name] = read
            return 0

        self.rec.fwd = launch
        threads = [threading.Thread(target=flashjit.attention, args=(q, k, v),
                                    kwargs={"sinks": s}, name=str(i))
                   for i, s in enumerate(sinks)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(seen, {"0": sinks[0].data_ptr(), "1": sinks[1].data_ptr()})

    def test_capture_takes_a_pytorch_workspace(self):
        # A split decode needs a workspace: eagerly the context's (NULL), under
        # capture one from PyTorch's allocator, through the planned launch.
        q = torch.randn(1, 32, 1, 128, dtype=BF16)
        k = v = torch.randn(1, 8, 8192, 128, dtype=BF16)
        flashjit.attention(q, k, v)
        e = next(iter(calls.tables.calls.values()))
        self.assertGreater(e.ws, 0)
        self.assertEqual(self.rec.calls[-1][0], "fwd")
        self.capturing = True
        flashjit.attention(q, k, v)
        name, args, _ = self.rec.calls[-1]
        self.assertEqual((name, args[2], args[9]), ("fwd_plan", e.plan_addr, e.ws))
        self.assertNotIn(args[8], (None, 0))
        self.assertEqual(self.plans(), 1)

    def test_no_workspace_no_question(self):
        q, k, v = qkv(s=4096)
        flashjit.attention(q, k, v)
        self.capturing = True
        flashjit.attention(q, k, v)
        self.assertEqual([c[0] for c in self.rec.calls], ["fwd", "fwd"])

    def test_the_table_is_bounded(self):
        with mock.patch.object(calls, "MAX", 2):
            for s in (64, 128, 192):
                flashjit.attention(*qkv(s=s))
            self.assertLessEqual(len(calls.tables.plain), 2)
            self.assertLessEqual(len(calls.tables.calls), 2)

    def test_grad_has_its_own_table(self):
        q, k, v = qkv()
        flashjit.attention(q, k, v)
        q.requires_grad_()
        with mock.patch.object(tr, "train_call", return_value=(q, q)) as op, \
                mock.patch.object(ar, "check_inputs", wraps=ar.check_inputs) as checks:
            # The first call with grad is checked, the next ones come from the
            # training table with the call the checks made.
            for _ in range(3):
                flashjit.attention(q, k, v, causal="top_left")
            self.assertEqual((op.call_count, checks.call_count), (3, 1))
            self.assertEqual(len(calls.tables.train), 1)
            self.assertIsNone(op.call_args[0][3])
            call = op.call_args[0][4]
            self.assertIsInstance(call, tr.TrainCall)
            self.assertEqual(call.args, (capi.CAUSAL_TOP_LEFT, 0.0, capi.BHSD, -1, -1, 0.0))
            self.assertIs(op.call_args_list[0][0][4], call)  # one call object throughout
            # Without grad, the plain table, never the training call.
            with torch.no_grad():
                flashjit.attention(q, k, v, causal="top_left")
            self.assertEqual(op.call_count, 3)
            # Another option is another entry, checked once.
            checks.reset_mock()
            for _ in range(2):
                flashjit.attention(q, k, v, causal="top_left", softcap=30.0)
            self.assertEqual((op.call_count, checks.call_count, len(calls.tables.train)),
                             (5, 1, 2))

    def test_checkpoint_without_reentry(self):
        """torch.utils.checkpoint: use_reentrant=False unpacks each saved
        tensor once (the training calls' backwards unpack once too); the
        reentrant form recomputes the forward inside the backward."""
        from torch.utils.checkpoint import checkpoint
        q, k, v = (t.requires_grad_() for t in qkv())
        for reentrant in (False, True):
            for kw in ({}, {"score_mod": "s * 0.5f"}, {"mask_mod": "kv <= q + 3"}):
                for _ in range(2):
                    out = checkpoint(lambda a, b, c: flashjit.attention(a, b, c, **kw), q, k, v,
                                     use_reentrant=reentrant)
                    out.float().sum().backward()
        self.assertEqual(sum(n == "bwd" for n, _, _ in self.rec.calls), 12)

    def test_training_call_keeps_its_entries(self):
        """A repeated training call (a TrainCall) takes its forward's and
        its backward's entries as it kept them: options, entry keys and
        the backward's plan are made once, the deterministic mode's apart."""
        q, k, v = (t.requires_grad_() for t in qkv(hk=2))
        with mock.patch.object(tr, "_train_opts", wraps=tr._train_opts) as opts, \
                mock.patch.object(tr, "_bwd_entry", wraps=tr._bwd_entry) as entry:
            for _ in range(3):
                flashjit.attention(q, k, v, causal="top_left").float().sum().backward()
            self.assertEqual((opts.call_count, entry.call_count), (1, 1))
            torch.use_deterministic_algorithms(True)
            try:
                for _ in range(2):
                    flashjit.attention(q, k, v, causal="top_left").float().sum().backward()
            finally:
                torch.use_deterministic_algorithms(False)
            self.assertEqual(entry.call_count, 2)
        self.assertEqual([c[2].deterministic for c in self.rec.calls if c[0] == "bwd"],
                         [0, 0, 0, 1, 1])

    def test_eager_training_skips_the_custom_op(self):
        """Eagerly, autograd runs through _TrainCall (an autograd.Function
        over the same forward and backward), not the custom ops, whose
        dispatch fills their defaults from the schema at every call."""
        q, k, v = (t.requires_grad_() for t in qkv(hk=2))
        with mock.patch.object(tr, "attention_train_op") as op, \
                mock.patch.object(tr, "attention_bwd_op") as bwd_op:
            out = flashjit.attention(q, k, v, causal="top_left")
            self.assertEqual(type(out.grad_fn).__name__, "_TrainCallBackward")
            out.backward(torch.ones_like(out))
            self.assertEqual((op.call_count, bwd_op.call_count), (0, 0))
        self.assertEqual([c[0] for c in self.rec.calls], ["fwd", "bwd"])
        self.assertEqual((q.grad.shape, k.grad.shape, v.grad.shape), (q.shape, k.shape, v.shape))
        # The backward's problem is the forward's.
        p = self.rec.calls[-1][2]
        self.assertEqual((p.heads_q, p.heads_kv, p.causal, p.deterministic),
                         (8, 2, capi.CAUSAL_TOP_LEFT, 0))
        self.assertIsNone(self.rec.dlse[-1])  # the loss did not use the lse
        # The gradient through the returned lse: fj_problem.dlse, float32 in
        # lse's layout, with or without O's.
        out, lse = flashjit.attention(q, k, v, return_lse=True)
        w = torch.randn(lse.shape)
        (out.float().sum() + (lse * w).sum()).backward()
        self.assertEqual(self.rec.calls[-1][0], "bwd")
        self.assertTrue(torch.equal(self.rec.dlse[-1], w))
        # A sum's gradient comes expanded (strides 0): a dense copy; no
        # gradient at O: dO zeros.
        out, lse = flashjit.attention(q, k, v, return_lse=True)
        lse.sum().backward()
        self.assertTrue(torch.equal(self.rec.dlse[-1], torch.ones(lse.shape)))
        self.assertEqual([c[0] for c in self.rec.calls], ["fwd", "bwd"] * 3)

    def test_varlen_training_goes_the_same_way(self):
        q = torch.randn(256, 8, 64, dtype=BF16, requires_grad=True)
        k, v = (torch.randn(256, 2, 64, dtype=BF16, requires_grad=True) for _ in range(2))
        cu = torch.tensor([0, 100, 256], dtype=torch.int32)
        with mock.patch.object(tr, "attention_train_op") as op:
            for _ in range(2):
                out = flashjit.attention_varlen(q, k, v, cu, cu, 156, 156, causal=True)
                out.backward(torch.ones_like(out))
            self.assertEqual(op.call_count, 0)
        self.assertEqual(type(out.grad_fn).__name__, "_TrainBackward")
        self.assertEqual([c[0] for c in self.rec.calls], ["fwd", "bwd"] * 2)
        self.assertEqual((q.grad.shape, k.grad.shape), (q.shape, k.shape))
        p = self.rec.calls[-1][2]
        self.assertEqual((p.batch, p.heads_kv, p.seq_q, p.causal),
                         (2, 2, 156, capi.CAUSAL_BOTTOM_RIGHT))

    def test_training_forward_prefetches_its_backward(self):
        q, k, v = qkv()
        args = (None, capi.CAUSAL_TOP_LEFT, 0.0, capi.BHSD, -1, -1, 0.0)
        with mock.patch.object(calls, "prefetch_bwd") as pf:
            for _ in range(2):
                tr._attention_train(q, k, v, *args)
        # Once, for the new call, with the backward's problem of it.
        self.assertEqual(pf.call_count, 1)
        e = pf.call_args[0][0]
        self.assertEqual((e.p.seq_q, e.p.head_dim, e.p.causal, e.p.deterministic),
                         (128, 64, capi.CAUSAL_TOP_LEFT, 0))
        # The call itself reaches the library, which starts the compiles.
        self.assertEqual(REAL_PREFETCH(e), 0)

    def test_expression_backward_repeats(self):
        """A call with an expression, twice, on packed (not dense) q, k, v:
        the second backward reads them in place as the first did (the
        call's own entry keeps which), and a call without parameters'
        gradients shares one empty dparams."""
        x = torch.randn(2, 64, 3, 4, 64, dtype=BF16, requires_grad=True)
        q, k, v = (t.transpose(1, 2) for t in x.unbind(2))
        grads, made = [], []
        real = tr._dparams_views

        def spy(*args, **kw):
            made.append((kw.get("shared"), real(*args, **kw)[0]))
            return made[-1][1], ()

        with mock.patch.object(tr, "_dparams_views", spy):
            for _ in range(2):
                out = flashjit.attention(q, k, v, score_mod="s * 0.5f")
                grads.append(torch.autograd.grad(out.sum(), x)[0])
        bwd = [(a, p) for n, a, p in self.rec.calls if n == "bwd"]
        self.assertEqual(len(bwd), 2)
        for a, p in bwd:
            # The packed views read in place (qkvviews), both times, and
            # their gradients views of one buffer laid out as x.
            self.assertEqual(list(p.q_stride), list(q.stride()[:3]))
            self.assertEqual(a[2:5], (q.data_ptr(), k.data_ptr(), v.data_ptr()))
            self.assertEqual((a[9] - a[8], a[10] - a[8]), (k.data_ptr() - q.data_ptr(),
                                                           v.data_ptr() - q.data_ptr()))
        self.assertEqual(grads[0].shape, x.shape)
        # One empty dparams for both calls (no parameters' gradients).
        self.assertEqual([m[0] for m in made], [True, True])
        self.assertIs(made[0][1], made[1][1])
        self.assertEqual(made[0][1].numel(), 0)

    def test_autograd_and_op_send_one_call(self):
        """The backward through autograd (the training forward's saved
        tensors) and the op's function called on the inference forward's O
        and lse (as bench/bwd_compare.py times it) send the library the same problem (every field) and arguments:
        a difference in their times is no difference of call."""
        for causal in (None, "top_left"):
            q, k, v = qkv(b=2, hq=4, hk=2, s=256, d=128)
            dout = torch.randn_like(q)
            for t in (q, k, v):
                t.requires_grad_(True)
            o = flashjit.attention(q, k, v, causal=causal)
            torch.autograd.grad(o, (q, k, v), dout)
            auto = [c for c in self.rec.calls if c[0] == "bwd"][-1]
            qd, kd, vd = (t.detach() for t in (q, k, v))
            out, lse = flashjit.attention(qd, kd, vd, causal=causal, return_lse=True)
            # The op's function (its CUDA kernel; the op has none on the CPU).
            tr._attention_bwd(dout, qd, kd, vd, out, lse, int(causal is not None), 0.0, 0,
                              -1, -1, 0.0, None, False)
            op = [c for c in self.rec.calls if c[0] == "bwd"][-1]
            self.assertIsNot(auto, op)

            def fields(p):
                return [(f, getattr(p, f) if not hasattr(getattr(p, f), "__len__")
                         else list(getattr(p, f))) for f, _ in capi.Problem._fields_]
            self.assertEqual(fields(auto[2]), fields(op[2]))
            self.assertEqual([x is None for x in auto[1]], [x is None for x in op[1]])

    def test_backward_table(self):
        q, k, v = qkv()
        out, lse = torch.empty_like(q), torch.empty(1, 8, 128)
        args = (capi.CAUSAL_TOP_LEFT, 0.0, capi.BHSD, -1, -1, 0.0)
        for det in (False, False, True, True):
            dq, dk, dv, ds = tr._launch_bwd(torch.randn_like(q), q, k, v, out, lse,
                                            *tr._train_opts(None, *args), deterministic=det)
        self.assertEqual(calls.counts["bwd_plans"], 2)
        self.assertEqual((dq.shape, dk.shape, ds.shape), (q.shape, k.shape, (0,)))
        name, a, p = self.rec.calls[-1]
        self.assertEqual((name, p.deterministic), ("bwd", 1))
        self.assertEqual(a[2:10], (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                                   a[6], lse.data_ptr(), dq.data_ptr(), dk.data_ptr()))
        self.capturing = True
        sinks = torch.zeros(8)
        tr._launch_bwd(torch.randn_like(q), q, k, v, out, lse, *tr._train_opts(sinks, *args))
        name, a, p = self.rec.calls[-1]
        self.assertEqual(name, "bwd_run")
        self.assertEqual(capi.Mods.from_address(p.mods).sinks, sinks.data_ptr())


@unittest.skipUnless(fjtest.HAS_TORCH, fjtest.NO_TORCH)
class FusedQKVBackward(Stubbed):
    """An eager backward reads q, k and v of a fused QKV projection where
    they are (no dense copies) and lays their gradients out as they are:
    views of one buffer the projection's size, at q's, k's and v's
    offsets.  Inputs whose elements overlap (a broadcast) are still
    copied; the op (torch.compile's) keeps its fake's dense gradients."""

    def launched(self):
        return [(a, p) for n, a, p in self.rec.calls if n == "bwd"]

    def test_packed_bshd_views(self):
        # GQA: (batch, seq, 8 + 2 + 2 heads, d), viewed as BHSD.
        x = torch.randn(2, 64, 12, 64, dtype=BF16, requires_grad=True)
        q, k, v = (t.transpose(1, 2) for t in x.split([8, 2, 2], dim=2))
        flashjit.attention(q, k, v, causal="top_left").sum().backward()
        (a, p), = self.launched()
        self.assertEqual([list(p.q_stride), list(p.k_stride)],
                         [list(q.stride()[:3]), list(k.stride()[:3])])
        self.assertEqual(a[2:5], (q.data_ptr(), k.data_ptr(), v.data_ptr()))
        dq, dk, dv = a[8:11]
        self.assertEqual((dk - dq, dv - dq), (k.data_ptr() - q.data_ptr(),
                                              v.data_ptr() - q.data_ptr()))
        self.assertEqual((x.grad.shape, x.grad.dtype), (x.shape, BF16))
        # Again: the same entry, no new plan.
        plans = calls.counts["bwd_plans"]
        flashjit.attention(q, k, v, causal="top_left").sum().backward()
        self.assertEqual(calls.counts["bwd_plans"], plans)

    def test_saved_tensors_hooks_that_change_the_layout(self):
        """A saved-tensor hook (activation offloading, say) may give the
        backward q, k and v in other strides than the first backward's:
        the backward then plans for the strides it is given."""
        x = torch.randn(2, 64, 12, 64, dtype=BF16, requires_grad=True)
        q, k, v = (t.transpose(1, 2) for t in x.split([8, 2, 2], dim=2))
        flashjit.attention(q, k, v, causal="top_left").sum().backward()

        def pack(t):
            return t.contiguous().clone() if t.dim() == 4 else t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            flashjit.attention(q, k, v, causal="top_left").sum().backward()
        (a, p) = self.launched()[-1]
        self.assertEqual([list(p.q_stride), list(p.k_stride)],
                         [[8 * 64 * 64, 64 * 64, 64], [2 * 64 * 64, 64 * 64, 64]])
        self.assertEqual((x.grad.shape, x.grad.dtype), (x.shape, BF16))

    def test_grads_as_laid_out(self):
        x = torch.randn(2, 64, 3, 4, 64, dtype=BF16)
        q, k, v = (t.transpose(1, 2) for t in x.unbind(2))
        dq, dk, dv = tr._grads_as_laid_out(q, k, v, zero=True)
        for g, t in zip((dq, dk, dv), (q, k, v)):
            self.assertEqual((g.shape, g.stride(), g.dtype), (t.shape, t.stride(), t.dtype))
            self.assertFalse(g.any().item())
        self.assertEqual(dq.untyped_storage().data_ptr(), dv.untyped_storage().data_ptr())
        self.assertEqual(dq.untyped_storage().nbytes(), x.untyped_storage().nbytes())
        # A view of a storage far larger than itself: a buffer of its own span.
        big = torch.randn(64, 3, 4, 64, dtype=BF16)
        q1 = big[:2, 0].transpose(1, 2)
        g, _, _ = tr._grads_as_laid_out(q1, *qkv()[1:], zero=False)
        self.assertEqual(g.stride(), q1.stride())
        self.assertLess(g.untyped_storage().nbytes(), big.untyped_storage().nbytes() // 4)

    def test_shared_views_get_their_own_gradients(self):
        """q and k the same strided view (shared-QK attention), or k and v
        (one tensor passed for both): read in place, but no two gradients
        at one address -- each a buffer of its own; q, k and v apart (a
        QKV's slices, unbind's parts, a gap between them) share one."""
        x = torch.randn(2, 64, 2, 4, 64, dtype=BF16, requires_grad=True)
        qk, v = (t.transpose(1, 2) for t in x.unbind(2))
        flashjit.attention(qk, qk, v, causal="top_left").sum().backward()
        y = torch.randn(2, 64, 12, 64, dtype=BF16, requires_grad=True)
        q, kv = (t.transpose(1, 2) for t in y.split([8, 4], dim=2))
        flashjit.attention(q, kv, kv).sum().backward()
        for (a, p), name in zip(self.launched(), ("q is k", "k is v")):
            with self.subTest(name):
                self.assertEqual(len(set(a[8:11])), 3, a[8:11])
        self.assertEqual((x.grad.shape, y.grad.shape), (x.shape, y.shape))
        ts = [t.transpose(1, 2) for t in y.split([4, 4, 4], dim=2)]
        self.assertTrue(tr._share_ok(ts))
        self.assertTrue(tr._share_ok([ts[0], ts[2]]))  # a gap between
        self.assertFalse(tr._share_ok([ts[0], ts[0]]))
        self.assertFalse(tr._share_ok([y[:, :, :6].transpose(1, 2), ts[1]]))  # overlap
        # Apart along one dimension, but its union wraps into the next
        # batch's rows (a batch stride just past the last row): not shared.
        base = torch.zeros(4096, dtype=BF16)
        a = base.as_strided((2, 5, 8, 4), (4 * 48 + 32, 48, 4, 1), 0)
        b = base.as_strided((2, 5, 2, 4), (4 * 48 + 32, 48, 4, 1), 32)
        self.assertFalse(tr._share_ok([a, b]))

    def test_overlaps_copied(self):
        self.assertTrue(tr._disjoint(torch.randn(2, 64, 3, 4, 64)[:, :, 0].transpose(1, 2)))
        self.assertFalse(tr._disjoint(torch.randn(2, 1, 64, 64).expand(2, 4, 64, 64)))
        self.assertFalse(tr._disjoint(torch.randn(200).as_strided((4, 64), (16, 1))))
        q = torch.randn(1, 4, 64, 64, dtype=BF16, requires_grad=True)
        k = torch.randn(1, 1, 64, 64, dtype=BF16, requires_grad=True)
        flashjit.attention(q, k.expand(1, 4, 64, 64), k.expand(1, 4, 64, 64)).sum().backward()
        (a, p), = self.launched()
        self.assertEqual(list(p.k_stride), [4 * 64 * 64, 64 * 64, 64])  # a dense copy
        self.assertEqual(k.grad.shape, k.shape)


@unittest.skipUnless(fjtest.HAS_TORCH, fjtest.NO_TORCH)
class FakeStridesMatch(Stubbed):
    """The backward ops' fakes give the gradients the strides the calls
    return: Inductor lays out what follows a custom op by its fake, so a
    gradient whose strides differ reads wrong elements (or fails its
    size_asserts)."""

    def inputs(self):
        # A fused QKV projection viewed as BHSD (q not dense: its copy is
        # contiguous), a GQA broadcast k (strides 0) and a dense v.
        qkv = torch.randn(2, 64, 3, 4, 64, dtype=BF16)
        q = qkv[:, :, 0].transpose(1, 2)
        k = torch.randn(2, 1, 64, 64, dtype=BF16).expand(2, 4, 64, 64)
        v = torch.randn(2, 64, 4, 64, dtype=BF16).transpose(1, 2)
        out = torch.empty(2, 4, 64, 64, dtype=BF16)
        return torch.randn_like(out), q, k, v, out, torch.empty(2, 4, 64)

    def same(self, real, fake):
        self.assertEqual([(t.shape, t.stride(), t.dtype) for t in real],
                         [(t.shape, t.stride(), t.dtype) for t in fake])

    def test_attention_bwd(self):
        args = self.inputs() + (capi.CAUSAL_TOP_LEFT, 0.0, capi.BHSD, -1, -1, 0.0)
        self.same(tr._attention_bwd(*args), tr._attention_bwd_fake(*args))
        self.assertEqual(self.launches(), 1)

    def test_attention_bwd_mods(self):
        args = self.inputs() + ([], calls.encode(calls.opts("dense", score_mod="s * 0.5f")))
        self.same(tr._attention_bwd_mods(*args), tr._attention_bwd_mods_fake(*args))
        self.assertEqual(self.launches(), 1)

    def test_no_rows(self):
        # No launch: the gradients as the fake lays them out all the same.
        dout, q, k, v, out, lse = self.inputs()
        args = (dout[:, :, :0], q[:, :, :0], k, v, out[:, :, :0], lse[:, :, :0])
        dense = args + (capi.CAUSAL_NONE, 0.0, capi.BHSD, -1, -1, 0.0)
        self.same(tr._attention_bwd(*dense), tr._attention_bwd_fake(*dense))
        mods = args + ([], calls.encode(calls.opts("dense", score_mod="s * 0.5f")))
        self.same(tr._attention_bwd_mods(*mods), tr._attention_bwd_mods_fake(*mods))
        self.assertEqual(self.launches(), 0)


@unittest.skipUnless(fjtest.HAS_TORCH, fjtest.NO_TORCH)
class ServingCalls(Stubbed):
    def varlen(self, lengths=(0, 30, 70, 0), hq=8, hk=2, d=128):
        total = sum(lengths)
        cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
        q = torch.randn(total, hq, d, dtype=BF16)
        k, v = torch.randn(total, hk, d, dtype=BF16), torch.randn(total, hk, d, dtype=BF16)
        return q, k, v, cu

    def test_varlen(self):
        q, k, v, cu = self.varlen()
        for _ in range(2):
            cu2 = cu.clone()
            out, lse = flashjit.attention_varlen(q, k, v, cu2, cu2, 70, 70, causal=True,
                                                 return_lse=True)
            p = self.rec.calls[-1][2]
            self.assertEqual((p.cu_seqlens_q, p.cu_seqlens_kv), (cu2.data_ptr(),) * 2)
        self.assertEqual(self.plans(), 1)
        self.assertEqual((out.shape, lse.shape), (q.shape, (8, 100)))
        self.assertEqual((p.batch, p.seq_q, p.seq_kv, p.total_q, p.total_kv, p.causal),
                         (4, 70, 70, 100, 100, capi.CAUSAL_BOTTOM_RIGHT))
        self.assertEqual((list(p.q_stride), list(p.k_stride)), ([0, 128, 1024], [0, 128, 256]))
        self.assertEqual(p.seqused_kv, None)
        used = torch.tensor([0, 3, 5, 0], dtype=torch.int32)
        flashjit.attention_varlen(q, k, v, cu, cu, 70, 70, seqused_k=used)
        self.assertEqual(self.rec.calls[-1][2].seqused_kv, used.data_ptr())
        flashjit.attention_varlen(q, k, v, cu, cu, 64, 70)  # another bound: another plan
        self.assertEqual(self.plans(), 3)

    def test_varlen_head_dim_padded_to_8(self):
        # attention_varlen pads a head dim that is not a multiple of 8 as
        # attention() does: the problem's 104 at 100's scale, O sliced back,
        # contiguous; the log-sum-exp as FlashAttention returns it.
        q, k, v, cu = self.varlen(d=100)
        out, lse = flashjit.attention_varlen(q, k, v, cu, cu, 70, 70, causal=True,
                                             return_lse=True)
        p = self.rec.calls[-1][2]
        self.assertEqual((p.head_dim, out.shape, lse.shape), (104, q.shape, (8, 100)))
        self.assertAlmostEqual(p.scale, 0.1, places=6)
        self.assertTrue(out.is_contiguous())
        out = flashjit.attention_varlen(q, k, v, cu, cu, 70, 70, scale=0.25)
        self.assertEqual((self.rec.calls[-1][2].scale, out.shape), (0.25, q.shape))

    def test_varlen_lse_is_flashattentions(self):
        # The library's (batch, heads, max_seqlen_q) rows, gathered per token.
        q, k, v, cu = self.varlen(lengths=(0, 3, 2, 0), hq=2, hk=2, d=64)
        flashjit.attention_varlen(q, k, v, cu, cu, 3, 3, return_lse=True)
        e = next(iter(calls.tables.calls.values()))
        self.assertEqual(e.lse_shape, (4, 2, 3))
        lib_lse = torch.arange(4 * 2 * 3, dtype=torch.float32).view(4, 2, 3)
        got = e.post(lib_lse, (cu, cu))
        want = torch.tensor([[6., 7, 8, 12, 13], [9, 10, 11, 15, 16]])
        self.assertTrue(torch.equal(got, want), got)

    def test_kvcache(self):
        q = torch.randn(4, 1, 32, 128, dtype=BF16)
        pages = torch.randn(64, 16, 8, 128, dtype=BF16)
        table = torch.randint(0, 64, (4, 8), dtype=torch.int32)
        lens = torch.tensor([0, 1, 100, 128], dtype=torch.int32)
        for _ in range(2):
            out = flashjit.attention_with_kvcache(q, pages, pages, cache_seqlens=lens,
                                                  block_table=table, causal=True)
        self.assertEqual((self.plans(), out.shape), (1, q.shape))
        p = self.rec.calls[-1][2]
        self.assertEqual((p.seq_q, p.seq_kv, p.page_size, p.max_pages, p.num_pages),
                         (1, 128, 16, 8, 64))
        self.assertEqual((p.block_table, p.seqused_kv), (table.data_ptr(), lens.data_ptr()))
        self.assertEqual(list(p.k_stride), [16 * 8 * 128, 128, 8 * 128])
        cache = torch.randn(4, 512, 8, 128, dtype=BF16)
        out, lse = flashjit.attention_with_kvcache(q, cache, cache, cache_seqlens=300,
                                                   return_lse=True, num_splits=3)
        p = self.rec.calls[-1][2]
        self.assertEqual((p.seq_kv, p.seqused_kv, p.block_table, p.splits), (300, None, None, 3))
        self.assertEqual(lse.shape, (4, 32, 1))
        flashjit.attention_with_kvcache(q, cache, cache)  # the whole cache
        self.assertEqual(self.rec.calls[-1][2].seq_kv, 512)

    def test_kvcache_latent(self):
        # MLA's latent cache: one tensor of 576 columns whose first 512 are
        # V, passed as k_cache and k_cache[..., :512] (read once: v = k).
        q = torch.randn(2, 1, 16, 576, dtype=BF16)
        cache = torch.randn(2, 256, 1, 576, dtype=BF16)
        out = flashjit.attention_with_kvcache(q, cache, cache[..., :512], cache_seqlens=200)
        name, args, p = self.rec.calls[-1]
        self.assertEqual(out.shape, (2, 1, 16, 512))
        self.assertEqual((p.head_dim, p.head_dim_v, p.seq_kv), (576, 512, 200))
        self.assertEqual(list(p.v_stride), list(p.k_stride))
        self.assertEqual(list(p.o_stride), [16 * 512, 512, 16 * 512])
        self.assertEqual((args[3], args[4]), (cache.data_ptr(),) * 2)  # k, v
        # Paged: pages of the latent rows.
        pages = torch.randn(64, 16, 1, 576, dtype=BF16)
        table = torch.randint(0, 64, (2, 8), dtype=torch.int32)
        out = flashjit.attention_with_kvcache(q, pages, pages[..., :512], block_table=table,
                                              cache_seqlens=100)
        p = self.rec.calls[-1][2]
        self.assertEqual((out.shape[-1], p.head_dim_v, p.page_size), (512, 512, 16))
        # A V of its own with fewer columns is no latent cache.
        with self.assertRaisesRegex(ValueError, r"must have one shape \(or v be k's first "
                                                r"columns"):
            flashjit.attention_with_kvcache(q, cache, cache[..., :512].clone())

    def test_fp8_cache(self):
        q = torch.randn(2, 1, 16, 128, dtype=BF16)
        cache = torch.randn(2, 256, 4, 128).to(torch.float8_e4m3fn)
        vd = torch.ones(2, 4)
        out = flashjit.attention_with_kvcache(q, cache, cache, v_descale=vd)
        p = self.rec.calls[-1][2]
        self.assertEqual((out.dtype, p.kv_dtype, p.v_scale), (BF16, capi.E4M3, vd.data_ptr()))
        self.assertNotIn(p.k_scale, (None, 0))

    def test_fast_path_costs_the_same_entry(self):
        q = torch.randn(4, 1, 32, 128, dtype=BF16)
        cache = torch.randn(4, 512, 8, 128, dtype=BF16)
        lens = torch.full((4,), 200, dtype=torch.int32)
        flashjit.attention_with_kvcache(q, cache, cache, cache_seqlens=lens)
        self.assertEqual(len(calls.tables.plain), 1)
        flashjit.attention_with_kvcache(q, cache, cache, cache_seqlens=lens, sinks=torch.zeros(32))
        self.assertEqual((len(calls.tables.plain), self.plans()), (2, 2))

    def test_errors(self):
        q, k, v, cu = self.varlen()
        who = r"^flashjit.attention_varlen: "
        for args, kw, exc, pattern in (
                ((q[None], k, v, cu, cu, 8, 8), {}, ValueError,
                 who + r"q has 4 dimensions .*; it takes 3: \(total_q, heads_q, head_dim\)"),
                ((q.float(), k, v, cu, cu, 8, 8), {}, TypeError, who + r"q has dtype "
                 r"torch.float32; it takes torch.float16 or torch.bfloat16"),
                ((q, k.half(), v, cu, cu, 8, 8), {}, TypeError, who + r"k and v must both"),
                ((q, k, v, cu.long(), cu, 8, 8), {}, TypeError,
                 who + r"cu_seqlens_q has dtype torch.int64; it must be torch.int32$"),
                ((q, k, v, cu, cu[:3], 8, 8), {}, ValueError,
                 who + r"cu_seqlens_k has shape \(3,\); it must be \(5,\)$"),
                ((q, k, v, cu, cu, 0, 8), {}, ValueError, r"max_seqlen_q=0 is below 1"),
                ((q, k, v, cu, cu, 8, 8), dict(seqused_k=cu), ValueError,
                 who + r"seqused_k has shape \(5,\); it must be \(4,\)$"),
                ((q, k, v, cu, cu, 8, 8), dict(num_splits=300), ValueError,
                 who + r"num_splits=300 is not 0"),
                ((q, k, v, cu, cu, 8, 8), dict(k_descale=torch.ones(4, 2)), ValueError,
                 who + r"k_descale is for FP8 inputs")):
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(exc, pattern):
                    flashjit.attention_varlen(*args, **kw)
        who = r"^flashjit.attention_with_kvcache: "
        q = torch.randn(4, 1, 32, 128, dtype=BF16)
        pages = torch.randn(64, 16, 8, 128, dtype=BF16)
        table = torch.zeros(4, 8, dtype=torch.int32)
        for kw, exc, pattern in (
                (dict(block_table=table[:2]), ValueError,
                 who + r"block_table has shape \(2, 8\); it must be \(batch, max_pages\), "
                 r"batch 4$"),
                (dict(block_table=table[:, :4].t().contiguous().t()), ValueError,
                 who + r"block_table is not contiguous \(strides \(1, 4\)\)"),
                (dict(block_table=table, cache_seqlens=200), ValueError,
                 who + r"cache_seqlens=200 is more than the cache holds \(128 keys"),
                (dict(cache_seqlens=0), ValueError, who + r"cache_seqlens=0: an int"),
                (dict(cache_seqlens=torch.zeros(4)), TypeError,
                 who + r"cache_seqlens has dtype torch.float32"),
                (dict(causal="diag"), ValueError, r"causal='diag' is not one of")):
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(exc, pattern):
                    flashjit.attention_with_kvcache(q, pages, pages, **kw)
        with self.assertRaisesRegex(ValueError, who + r"k_cache has batch 2; q's batch 4"):
            flashjit.attention_with_kvcache(q, pages[:2], pages[:2])
        # FP8 pages reach the library, which plans them (its FP8 ring) and
        # launches with the table and the FP8 dtype.
        f8 = pages.to(torch.float8_e4m3fn)
        flashjit.attention_with_kvcache(q, f8, f8, block_table=table)
        p = self.rec.calls[-1][2]
        self.assertEqual((p.kv_dtype, p.block_table, p.page_size),
                         (capi.E4M3, table.data_ptr(), 16))

    def test_grad_refused(self):
        # attention_varlen's backward: test_train_varlen.py.
        q = torch.randn(4, 1, 32, 128, dtype=BF16)
        cache = torch.randn(4, 512, 8, 128, dtype=BF16)
        with self.assertRaisesRegex(flashjit.Unsupported, r"^flashjit.attention_with_kvcache "
                                    r"runs forward only: v_cache requires grad \(detach"):
            flashjit.attention_with_kvcache(q, cache, cache.clone().requires_grad_())
        q, k, v, cu = self.varlen()
        f8 = k.to(torch.float8_e4m3fn)
        with self.assertRaisesRegex(flashjit.Unsupported, r"^flashjit.attention_varlen: FP8 k "
                                    r"and v run forward only: q requires grad \(detach"):
            flashjit.attention_varlen(q.requires_grad_(), f8, f8, cu, cu, 70, 70)


@unittest.skipUnless(fjtest.HAS_TORCH, fjtest.NO_TORCH)
class OptsText(unittest.TestCase):
    def test_idle_amax(self):
        # A call with an empty output launches nothing: its amax (FP8
        # attention's return_amax) is 0, not what the tensor held.
        e = calls.make_entry(None, torch.device("cpu"), torch.float8_e4m3fn, None, idle=True)
        q = torch.zeros(0, 4, 8, 64, dtype=torch.float8_e4m3fn)
        amax = torch.full((), 5.0)
        out, lse = calls.forward(e, q, q, q, (), amax)
        self.assertEqual((amax.item(), out.shape, out.dtype, lse), (0.0, q.shape, q.dtype, None))

    def test_round_trip(self):
        o = calls.opts("dense", causal=2, scale=0.125, layout=capi.BSHD, window_left=5,
                       window_right=0, softcap=float("inf"),
                       score_mod="s + (q == kv ? 1.0f : 0.0f) ; '\"", mask_mod="kv <= q",
                       params=(("t", "t", None), ("n", "i", -3), ("x", "f", 1e-30)),
                       roles=("sinks", "param:t"), block_q=64, block_kv=128, checked=True,
                       num_splits=4, max_seqlen_q=7, max_seqlen_k=9, seqlen_k=11,
                       out_dtype=capi.E4M3, amax=True)
        text = calls.encode(o)
        self.assertNotIn("\n", text)
        self.assertEqual(calls.decode(text), o)
        o2 = o._replace(softcap=float("nan"))
        self.assertTrue(calls.decode(calls.encode(o2)).softcap != o2.softcap)  # nan stays nan

    def test_bad_text(self):
        with self.assertRaisesRegex(ValueError, r"is not flashjit's options text"):
            calls.decode("{'kind': 'dense'}")


@unittest.skipUnless(fjtest.HAS_TORCH, fjtest.NO_TORCH)
class FakeImplementations(unittest.TestCase):
    """The ops' fake (meta) implementations, which torch.compile traces."""

    def op(self, lse, q, k, v, extra, **fields):
        text = calls.encode(calls.opts(**fields))
        if lse:
            return torch.ops.flashjit.attention_lse(q, k, v, extra, text)
        return torch.ops.flashjit.attention(q, k, v, extra, text)

    def test_schemas(self):
        self.assertEqual(str(torch.ops.flashjit.attention.default._schema),
                         "flashjit::attention(Tensor q, Tensor k, Tensor v, Tensor[] extra, "
                         "str opts) -> Tensor")
        self.assertEqual(str(torch.ops.flashjit.attention_lse.default._schema),
                         "flashjit::attention_lse(Tensor q, Tensor k, Tensor v, Tensor[] "
                         "extra, str opts) -> (Tensor, Tensor)")
        self.assertEqual(str(torch.ops.flashjit.attention_amax.default._schema),
                         "flashjit::attention_amax(Tensor q, Tensor k, Tensor v, Tensor[] "
                         "extra, str opts) -> (Tensor, Tensor, Tensor)")

    def test_shapes(self):
        m = dict(device="meta")
        q = torch.empty(2, 8, 100, 64, dtype=BF16, **m)
        k = torch.empty(2, 2, 300, 64, dtype=BF16, **m)
        out, lse = self.op(True, q, k, k, [], kind="dense")
        self.assertEqual((out.shape, out.dtype, lse.shape, lse.dtype),
                         (q.shape, BF16, (2, 8, 100), torch.float32))
        qs = q.transpose(1, 2)
        out, lse = self.op(True, qs, k.transpose(1, 2), k.transpose(1, 2), [], kind="dense",
                           layout=capi.BSHD)
        self.assertEqual((out.shape, lse.shape), (qs.shape, (2, 8, 100)))
        self.assertTrue(out.is_contiguous())
        vs = torch.empty(2, 2, 300, 32, dtype=BF16, **m)
        out, lse = self.op(True, q, k, vs, [], kind="dense")
        self.assertEqual((out.shape, lse.shape), ((2, 8, 100, 32), (2, 8, 100)))
        f8 = torch.float8_e4m3fn
        out = self.op(False, q.to(f8), k.to(f8), k.to(f8), [], kind="dense")
        self.assertEqual(out.dtype, BF16)
        # An FP8 KV cache's k and v under a 16-bit q: O in q's dtype.
        out = self.op(False, q.half(), k.to(f8), k.to(f8), [], kind="dense")
        self.assertEqual(out.dtype, torch.float16)
        # FP8 attention's own O (out_dtype) and its amax (the third op).
        out = self.op(False, q.to(f8), k.to(f8), k.to(f8), [], kind="dense",
                      out_dtype=capi.E4M3)
        self.assertEqual(out.dtype, f8)
        out, lse, amax = torch.ops.flashjit.attention_amax(
            q.to(f8), k.to(f8), k.to(f8), [],
            calls.encode(calls.opts("dense", out_dtype=capi.F16, amax=True)))
        self.assertEqual((out.dtype, lse.shape, amax.shape, amax.dtype),
                         (torch.float16, (2, 8, 100), (), torch.float32))
        qv = torch.empty(1000, 8, 128, dtype=BF16, **m)
        kv = torch.empty(3000, 2, 128, dtype=BF16, **m)
        cu = torch.empty(5, dtype=torch.int32, **m)
        out, lse = self.op(True, qv, kv, kv, [cu, cu], kind="varlen",
                           roles=("cu_seqlens_q", "cu_seqlens_k"), max_seqlen_q=9,
                           max_seqlen_k=9)
        self.assertEqual((out.shape, lse.shape), (qv.shape, (8, 1000)))
        qc = torch.empty(4, 3, 32, 128, dtype=BF16, **m)
        cache = torch.empty(4, 512, 8, 128, dtype=f8, **m)
        out, lse = self.op(True, qc, cache, cache, [], kind="kvcache", layout=capi.BSHD)
        self.assertEqual((out.shape, out.dtype, lse.shape), (qc.shape, BF16, (4, 32, 3)))


def reference_kernels(test):
    """CPU kernels for the ops, for the tests that trace and then run on
    the CPU: the dense call through SDPA, the others zeros; the options
    each call received in test.seen."""
    lib = torch.library.Library("flashjit", "IMPL")
    test.addCleanup(lib._destroy)
    test.seen = []

    def out_of(q, k, v, extra, opts):
        o = calls.decode(opts)
        test.seen.append(o)
        if o.kind != "dense":
            return torch.zeros_like(q)
        t = (lambda x: x.transpose(1, 2)) if o.layout == capi.BSHD else (lambda x: x)
        out = F.scaled_dot_product_attention(t(q), t(k), t(v), is_causal=o.causal != 0,
                                             enable_gqa=True)
        return t(out).contiguous()

    def with_lse(q, k, v, extra, opts):
        return out_of(q, k, v, extra, opts), torch.zeros(ar.lse_shape(calls.decode(opts), q))

    lib.impl("attention", out_of, "CPU")
    lib.impl("attention_lse", with_lse, "CPU")


def mods_kernels(test):
    """CPU kernels for the training ops with expressions (and the
    functions they wrap, which the eager path calls): the forward
    through SDPA (the expressions ignored), the backward constant
    gradients (dq 2, dk 3, dv 4, dsinks 5, the parameters' 6, 7, ... in
    turn), the options and the parameters' bits each backward received in
    test.bwd_seen -- the autograd plumbing without a GPU."""
    lib = torch.library.Library("flashjit", "IMPL")
    test.addCleanup(lib._destroy)
    test.bwd_seen = []
    test.bwd_dlse = []

    def train(q, k, v, extra, opts):
        o = calls.decode(opts)
        out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return out.contiguous(), torch.zeros(ar.lse_shape(o, q))

    def bwd(dout, q, k, v, out, lse, extra, opts, deterministic=False, pgrads=0, dlse=None):
        o = calls.decode(opts)
        test.bwd_seen.append((o, pgrads))
        test.bwd_dlse.append(dlse)
        hq = q.shape[1]
        parts = [torch.full((extra[r].numel(),), 6.0 + j)
                 for j, (_, r) in enumerate(tr._pgrad_params(o, pgrads))]
        return (torch.full_like(q, 2.0), torch.full_like(k, 3.0), torch.full_like(v, 4.0),
                torch.full((hq,) if "sinks" in o.roles else (0,), 5.0),
                torch.cat(parts) if parts else torch.zeros(0))

    lib.impl("attention_train_mods", train, "CPU")
    lib.impl("attention_bwd_mods", bwd, "CPU")
    # Eagerly, _TrainMods calls the forward the op wraps, and the launch
    # the backward op's function makes (with the call's own entries).
    def launch(*args, mine=None):
        return bwd(*args)

    for name, f in (("_attention_train_mods", train), ("_launch_bwd_mods", launch)):
        p = mock.patch.object(tr, name, f)
        p.start()
        test.addCleanup(p.stop)


@unittest.skipUnless(fjtest.HAS_TORCH, fjtest.NO_TORCH)
class ExpressionBackward(unittest.TestCase):
    """attention() with score_mod, mask_mod and params is differentiable:
    the training op with expressions, its backward op, the gradients back
    to q, k, v and sinks (CPU kernels standing in for the GPU's)."""

    def setUp(self):
        mods_kernels(self)
        p = mock.patch.object(ar, "_device_error", lambda *args: None)
        p.start()
        self.addCleanup(p.stop)

    def inputs(self):
        q = torch.randn(1, 4, 32, 64, dtype=BF16, requires_grad=True)
        k = torch.randn(1, 2, 48, 64, dtype=BF16, requires_grad=True)
        v = torch.randn(1, 2, 48, 64, dtype=BF16, requires_grad=True)
        return q, k, v

    def test_gradients_reach_the_inputs(self):
        q, k, v = self.inputs()
        sinks = torch.zeros(4, requires_grad=True)
        table = torch.randn(4)
        out = flashjit.attention(q, k, v, score_mod="s + t(h) * z", mask_mod="kv <= q + 16",
                                 params={"t": table, "z": 0.5}, sinks=sinks, causal=True)
        out.float().sum().backward()
        o, pgrads = self.bwd_seen[-1]
        self.assertEqual((o.score_mod, o.mask_mod, o.roles, o.causal, pgrads),
                         ("s + t(h) * z", "kv <= q + 16", ("sinks", "param:t"),
                          capi.CAUSAL_TOP_LEFT, 0))
        for t, want in ((q, 2.0), (k, 3.0), (v, 4.0), (sinks, 5.0)):
            self.assertTrue(torch.equal(t.grad, torch.full_like(t, want)))

    def test_eager_training_skips_the_custom_ops(self):
        """Eagerly, autograd runs through _TrainMods, not the custom ops
        (as _Train for the built-in masks)."""
        q, k, v = self.inputs()
        with mock.patch.object(tr, "attention_train_mods_op") as op, \
                mock.patch.object(tr, "attention_bwd_mods_op") as bwd_op:
            out = flashjit.attention(q, k, v, score_mod="s * 0.5f")
            self.assertEqual(type(out.grad_fn).__name__, "_TrainModsBackward")
            out.float().sum().backward()
            self.assertEqual((op.call_count, bwd_op.call_count), (0, 0))
        self.assertEqual(self.bwd_seen[-1][0].score_mod, "s * 0.5f")
        self.assertTrue(torch.equal(q.grad, torch.full_like(q, 2.0)))

    def test_params_get_their_gradients(self):
        # Only the tensors that require grad: the bits name them in the
        # params' order (z is a scalar, doc requires none), and each gets
        # its part of dparams in its own shape and dtype.
        q, k, v = self.inputs()
        slopes = torch.randn(4, requires_grad=True)
        table = torch.randn(4, 96, dtype=BF16, requires_grad=True)
        doc = torch.zeros(48, dtype=torch.int32)
        out = flashjit.attention(q.detach(), k.detach(), v.detach(),
                                 score_mod="s * z + slopes(h) + table(h, q - kv + 48)",
                                 mask_mod="doc(q) == doc(kv)",
                                 params={"slopes": slopes, "z": 0.5, "doc": doc,
                                         "table": table})
        out.float().sum().backward()
        o, pgrads = self.bwd_seen[-1]
        self.assertEqual(pgrads, 0b1001)
        self.assertTrue(torch.equal(slopes.grad, torch.full((4,), 6.0)))
        self.assertEqual((table.grad.shape, table.grad.dtype), ((4, 96), BF16))
        self.assertTrue(torch.equal(table.grad, torch.full((4, 96), 7.0, dtype=BF16)))

    def test_block_mask_backward(self):
        # A block mask with its transposed lists: differentiable, its eight
        # lists among the extras of both ops; one without them is refused
        # at the call, naming what the backward walks.
        q, k, v = self.inputs()
        qb, kb = 1, 1  # 32 rows, 48 keys: one block of 64 each way
        z = [torch.zeros(s, dtype=torch.int32) for s in ((1, 1, qb), (1, 1, qb, kb),
                                                          (1, 1, kb), (1, 1, kb, qb))]
        bm = flashjit.BlockMask(z[0], z[1], z[0].clone(), z[1].clone(), block_q=64,
                                block_kv=64, q_num=z[2], q_indices=z[3],
                                full_q_num=z[2].clone(), full_q_indices=z[3].clone())
        out = flashjit.attention(q, k, v, mask_mod="kv <= q", block_mask=bm)
        out.float().sum().backward()
        o, _ = self.bwd_seen[-1]
        self.assertEqual((o.block_q, o.block_kv, o.roles),
                         (64, 64, ("kv_num", "kv_indices", "full_num", "full_indices",
                                   "q_num", "q_indices", "full_q_num", "full_q_indices")))
        for t, want in ((q, 2.0), (k, 3.0), (v, 4.0)):
            self.assertTrue(torch.equal(t.grad, torch.full_like(t, want)))
        # Autograd's inputs are q, k, v and the floating-point extras only
        # (here the sinks): the eight integer lists ride in the extras'
        # tuple (apply's cost grows with its inputs).
        sinks = torch.zeros(4, requires_grad=True)
        out = flashjit.attention(q, k, v, mask_mod="kv <= q", block_mask=bm, sinks=sinks)
        self.assertEqual(len(out.grad_fn.next_functions), 4)
        out.float().sum().backward()
        self.assertTrue(torch.equal(sinks.grad, torch.full_like(sinks, 5.0)))
        forward_only = flashjit.BlockMask(z[0], z[1], block_q=64, block_kv=64)
        with self.assertRaisesRegex(ValueError, r"flashjit.attention: block_mask has no "
                                    r"transposed lists \(q_num, q_indices\), which the "
                                    r"backward walks: flashjit.block_mask\(\) builds them"):
            flashjit.attention(q, k, v, block_mask=forward_only)

    def test_lse_gradient_reaches_the_backward(self):
        q, k, v = self.inputs()
        out, lse = flashjit.attention(q, k, v, mask_mod="kv <= q", return_lse=True)
        out.float().sum().backward()
        self.assertIsNone(self.bwd_dlse[-1])
        out, lse = flashjit.attention(q, k, v, mask_mod="kv <= q", return_lse=True)
        w = torch.randn(lse.shape)
        (lse * w).sum().backward()  # the lse alone: dO zeros
        self.assertTrue(torch.equal(self.bwd_dlse[-1], w))
        self.assertTrue(torch.equal(q.grad, torch.full_like(q, 4.0)))  # two backwards


@unittest.skipUnless(fjtest.HAS_TORCH, fjtest.NO_TORCH)
class Traced(unittest.TestCase):
    """torch.compile(fullgraph=True) traces each call into the ops (no
    graph break), on CPU tensors with reference kernels (aot_eager: no
    code generation)."""

    def setUp(self):
        reference_kernels(self)
        p = mock.patch.object(ar, "_device_error", lambda *args: None)
        p.start()
        self.addCleanup(p.stop)
        torch._dynamo.reset()
        self.addCleanup(torch._dynamo.reset)

    def compiled(self, f, *args):
        with torch.no_grad():
            return torch.compile(f, backend="aot_eager", fullgraph=True)(*args)

    def test_attention(self):
        x = torch.randn(2, 64, 12, 64, dtype=BF16)
        sinks = torch.randn(8)

        def f(x, sinks):
            q, k, v = x.split([8, 2, 2], dim=2)
            a = flashjit.attention(q, k, v, causal="top_left", layout="bshd")
            b, lse = flashjit.attention(q, k, v, layout="bshd", causal=True, window=(32, 0),
                                        softcap=30.0, sinks=sinks, return_lse=True,
                                        score_mod="s + t(h) * z", params={"t": sinks,
                                                                         "z": 0.5})
            return a + b, lse

        out, lse = self.compiled(f, x, sinks)
        self.assertEqual((out.shape, lse.shape), ((2, 64, 8, 64), (2, 8, 64)))
        plain, mods = self.seen[0], self.seen[1]
        if plain.roles:
            plain, mods = mods, plain
        self.assertEqual(plain, calls.opts("dense", causal=capi.CAUSAL_TOP_LEFT,
                                           layout=capi.BSHD))
        self.assertEqual((mods.window_left, mods.softcap, mods.roles, mods.params),
                         (32, 30.0, ("sinks", "param:t"), (("t", "t", None),
                                                           ("z", "f", 0.5))))
        q, k, v = x.split([8, 2, 2], dim=2)
        want = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)),
                                              is_causal=True, enable_gqa=True)
        self.assertLess((out - want.transpose(1, 2) * 2).abs().max().item(), 0.05)

    def test_backward_with_expressions_traces(self):
        # Inputs that require grad with an expression: traced whole into
        # the training op, and its backward op runs at loss.backward().
        mods_kernels(self)
        q = torch.randn(1, 2, 64, 64, dtype=BF16, requires_grad=True)
        f = torch.compile(lambda q: flashjit.attention(q, q, q, score_mod="s * 0.5f"),
                          backend="aot_eager", fullgraph=True)
        out = f(q)
        out.sum().backward()
        self.assertEqual(self.bwd_seen[-1][0].score_mod, "s * 0.5f")
        self.assertTrue(torch.equal(q.grad, torch.full_like(q, 2.0 + 3.0 + 4.0)))

    def test_backward_with_block_mask_traces(self):
        # A block mask's eight lists are graph inputs of the training op,
        # traced whole, and its backward op runs at loss.backward().
        mods_kernels(self)
        z = [torch.zeros(s, dtype=torch.int32) for s in ((1, 1, 1), (1, 1, 1, 1))]
        bm = flashjit.BlockMask(z[0], z[1], block_q=64, block_kv=64, q_num=z[0].clone(),
                                q_indices=z[1].clone())
        q = torch.randn(1, 2, 64, 64, dtype=BF16, requires_grad=True)
        f = torch.compile(lambda q: flashjit.attention(q, q, q, mask_mod="kv <= q",
                                                       block_mask=bm),
                          backend="aot_eager", fullgraph=True)
        f(q).sum().backward()
        o = self.bwd_seen[-1][0]
        self.assertEqual((o.mask_mod, o.roles), ("kv <= q", ("kv_num", "kv_indices", "q_num",
                                                             "q_indices")))
        self.assertTrue(torch.equal(q.grad, torch.full_like(q, 2.0 + 3.0 + 4.0)))

    def test_serving(self):
        q, k = torch.randn(40, 8, 64, dtype=BF16), torch.randn(40, 2, 64, dtype=BF16)
        cu = torch.tensor([0, 0, 10, 40, 40], dtype=torch.int32)

        def varlen(q, k, cu):
            return flashjit.attention_varlen(q, k, k, cu, cu, 32, 32, causal=True,
                                             return_lse=True)

        out, lse = self.compiled(varlen, q, k, cu)
        self.assertEqual((out.shape, lse.shape), (q.shape, (8, 40)))
        self.assertEqual((self.seen[-1].kind, self.seen[-1].roles, self.seen[-1].causal),
                         ("varlen", ("cu_seqlens_q", "cu_seqlens_k"),
                          capi.CAUSAL_BOTTOM_RIGHT))
        qd = torch.randn(2, 1, 8, 64, dtype=BF16)
        pages = torch.randn(16, 16, 2, 64, dtype=BF16)
        lens = torch.tensor([5, 30], dtype=torch.int32)
        table = torch.zeros(2, 4, dtype=torch.int32)

        def decode(q, pages, lens, table):
            return flashjit.attention_with_kvcache(q, pages, pages, cache_seqlens=lens,
                                                   block_table=table, num_splits=2)

        self.assertEqual(self.compiled(decode, qd, pages, lens, table).shape, qd.shape)
        self.assertEqual((self.seen[-1].kind, self.seen[-1].roles, self.seen[-1].num_splits),
                         ("kvcache", ("cache_seqlens", "block_table"), 2))


if __name__ == "__main__":
    unittest.main()
