"""Bad inputs the entry points once took without a clear refusal: a head
dim of 0 with rows (O and the log-sum-exp returned unwritten), inputs
that require grad where no gradient can reach them (dropped silently, or
a bare StopIteration), truthy non-bools, and merge()'s dtype and ranks
(with grad too).

CPU tensors through the cached calls with the GPU stubbed (test_calls's
Stubbed: the checks up to the launch run).  Needs PyTorch (any build)."""
import unittest
from unittest import mock

import fjtest
import flashjit
from fjtest import torch
from test_calls import Stubbed
from test_errors import one_line

if fjtest.HAS_TORCH:
    from flashjit import _train as tr

    F8 = torch.float8_e4m3fn
    I32 = torch.int32


@unittest.skipUnless(fjtest.HAS_TORCH, fjtest.NO_TORCH)
class BadInputs(Stubbed):
    def refuses(self, exc, pattern, fn, *args, **kwargs):
        with self.assertRaises(exc) as cm:
            fn(*args, **kwargs)
        self.assertRegex(one_line(self, cm.exception), pattern)
        self.assertEqual(self.launches(), 0, "a refused call launched")

    def varlen(self, d=64, dtype=torch.float16 if fjtest.HAS_TORCH else None):
        return (torch.zeros(32, 4, d, dtype=torch.float16), torch.zeros(48, 2, d, dtype=dtype),
                torch.zeros(48, 2, d, dtype=dtype), torch.tensor([0, 10, 32], dtype=I32),
                torch.tensor([0, 20, 48], dtype=I32), 22, 28)

    def test_head_dim_0_with_rows(self):
        # Rows but no head dim: an idle call would return O and lse as
        # torch.empty left them; the library refuses head_dim 0.
        z = torch.zeros
        h = torch.float16
        self.refuses(flashjit.InvalidArgument, r"^head_dim 0 is invalid",
                     flashjit.attention, z(1, 2, 16, 0, dtype=h), z(1, 2, 16, 0, dtype=h),
                     z(1, 2, 16, 0, dtype=h), return_lse=True)
        self.refuses(flashjit.InvalidArgument, r"^head_dim 0 is invalid",
                     flashjit.attention, z(1, 2, 16, 0, dtype=h), z(1, 2, 16, 0, dtype=h),
                     z(1, 2, 16, 64, dtype=h))
        self.refuses(ValueError, r"^flashjit.attention: v \(1, 2, 16, 0\) has head dim 0; it "
                     r"must be q's 64 or a head_dim_v", flashjit.attention,
                     z(1, 2, 16, 64, dtype=h), z(1, 2, 16, 64, dtype=h), z(1, 2, 16, 0, dtype=h))
        self.refuses(flashjit.InvalidArgument, r"^head_dim 0 is invalid",
                     flashjit.attention_varlen, *self.varlen(d=0), return_lse=True)
        self.refuses(flashjit.InvalidArgument, r"^head_dim 0 is invalid",
                     flashjit.attention_with_kvcache, z(2, 1, 4, 0, dtype=h),
                     z(2, 128, 2, 0, dtype=h), z(2, 128, 2, 0, dtype=h), return_lse=True)
        # No rows: still nothing to launch, and nothing to refuse.
        out, lse = flashjit.attention(z(1, 2, 0, 0, dtype=h), z(1, 2, 16, 0, dtype=h),
                                      z(1, 2, 16, 0, dtype=h), return_lse=True)
        self.assertEqual((out.shape, lse.shape), ((1, 2, 0, 0), (1, 2, 0)))
        out = flashjit.attention_with_kvcache(z(0, 1, 4, 64, dtype=h), z(2, 128, 2, 64, dtype=h),
                                              z(2, 128, 2, 64, dtype=h))
        self.assertEqual(out.shape, (0, 1, 4, 64))
        self.assertEqual(self.launches(), 0)

    def test_fp8_param_that_requires_grad(self):
        q, k, v = (torch.zeros(1, 2, 16, 64, dtype=F8) for _ in range(3))
        self.refuses(flashjit.Unsupported, r"^flashjit.attention: FP8 attention runs forward "
                     r"only: params\['x'\] requires grad", flashjit.attention, q, k, v,
                     score_mod="s + x(h)", params={"x": torch.zeros(2, requires_grad=True)})

    def test_cached_fp8_call_with_a_descale_that_requires_grad(self):
        # The first call of the signature refuses it; so must a repeat.
        q, k, v = (torch.zeros(1, 2, 16, 64, dtype=F8) for _ in range(3))
        flashjit.attention(q, k, v, k_descale=torch.ones(1, 2))
        n = self.launches()
        with self.assertRaisesRegex(flashjit.Unsupported, r"k_descale requires grad"):
            flashjit.attention(q, k, v, k_descale=torch.ones(1, 2, requires_grad=True))
        self.assertEqual(self.launches(), n)

    def test_serving_inputs_that_require_grad(self):
        z = torch.zeros
        h = torch.float16
        q, kc, vc = z(2, 1, 4, 64, dtype=h), z(2, 128, 2, 64, dtype=h), z(2, 128, 2, 64, dtype=h)
        self.refuses(flashjit.Unsupported, r"^flashjit.attention_with_kvcache runs forward "
                     r"only: params\['x'\] requires grad", flashjit.attention_with_kvcache,
                     q, kc, vc, score_mod="s + x(h)", params={"x": z(4, requires_grad=True)})
        self.refuses(flashjit.Unsupported, r"^flashjit.attention_with_kvcache runs forward "
                     r"only: v_descale requires grad", flashjit.attention_with_kvcache,
                     q, kc.to(F8), vc.to(F8), v_descale=torch.ones(2, 2, requires_grad=True))
        self.refuses(flashjit.Unsupported, r"^flashjit.attention_varlen: FP8 k and v run "
                     r"forward only: k_descale requires grad", flashjit.attention_varlen,
                     *self.varlen(dtype=F8), k_descale=torch.ones(2, 2, requires_grad=True))
        # A repeat of a cached signature, too.
        args = self.varlen(dtype=F8)
        flashjit.attention_varlen(*args, k_descale=torch.ones(2, 2))
        n = self.launches()
        with self.assertRaisesRegex(flashjit.Unsupported, r"k_descale requires grad"):
            flashjit.attention_varlen(*args, k_descale=torch.ones(2, 2, requires_grad=True))
        self.assertEqual(self.launches(), n)
        # varlen with a param that requires grad: the expressions' training
        # call (eagerly _TrainMods; test_train_varlen checks its backward).
        with mock.patch.object(tr, "train_mods", return_value=(None, None)) as op:
            flashjit.attention_varlen(*self.varlen(), score_mod="s + x(h)",
                                      params={"x": z(4, requires_grad=True)})
        self.assertEqual(op.call_count, 1)

    def test_return_lse_is_a_bool(self):
        z = torch.zeros
        h = torch.float16
        q = z(1, 2, 16, 64, dtype=h)
        self.refuses(TypeError, r"^flashjit.attention: return_lse must be True or False, not "
                     r"'no'$", flashjit.attention, q, q, q, return_lse="no")
        self.refuses(TypeError, r"^flashjit.attention_varlen: return_lse must be True or "
                     r"False, not 1$", flashjit.attention_varlen, *self.varlen(), return_lse=1)
        self.refuses(TypeError, r"^flashjit.attention_with_kvcache: return_lse must be True "
                     r"or False, not None$", flashjit.attention_with_kvcache,
                     z(2, 1, 4, 64, dtype=h), z(2, 128, 2, 64, dtype=h),
                     z(2, 128, 2, 64, dtype=h), return_lse=None)

    def test_merge(self):
        o = [torch.zeros(1, 2, 4, 8) for _ in range(2)]
        lse = [torch.zeros(1, 2, 4) for _ in range(2)]
        for dtype in (torch.int32, torch.bool, F8, "bf16"):
            with self.subTest(dtype=dtype):
                self.refuses(TypeError, r"^flashjit.merge: dtype=.* is not a floating "
                             r"torch.dtype", flashjit.merge, o, lse, dtype=dtype)
        self.assertEqual(flashjit.merge(o, lse, dtype=torch.bfloat16)[0].dtype, torch.bfloat16)
        self.refuses(ValueError, r"^flashjit.merge: outs\[0\] has 3 dimensions \(2, 4, 8\); a "
                     r"part takes 4: \(batch, heads, seq, head_dim\)$", flashjit.merge,
                     [t[0] for t in o], [t[0] for t in lse])
        # A part that requires grad gets its gradient (test_ring.MergeCPU
        # checks the values); dtype is checked on that path too.
        part = o[1].clone().requires_grad_()
        self.refuses(TypeError, r"^flashjit.merge: dtype=.* is not a floating torch.dtype",
                     flashjit.merge, [o[0], part], lse, dtype=torch.int32)
        flashjit.merge([o[0], part], lse)[0].sum().backward()
        self.assertEqual(part.grad.shape, part.shape)
        with torch.no_grad():
            flashjit.merge(o, lse)

    def test_inspection_switches(self):
        for value in (torch.ones(2), 1.0, "yes"):
            with self.subTest(sinks=value):
                self.refuses(TypeError, r"^flashjit: sinks must be True or False, not ",
                             flashjit.plan, 1, 2, 128, 64, sinks=value)
        self.assertEqual(flashjit.plan(1, 2, 128, 64, sinks=1).name,
                         flashjit.plan(1, 2, 128, 64, sinks=True).name)


if __name__ == "__main__":
    unittest.main()
