"""Every argument error: its exception type and its one-line message (the
library's own where the library refuses)."""
import unittest

import fjtest
import flashjit
from fjtest import torch


def one_line(test, e):
    msg = str(e)
    test.assertTrue(msg, "an empty message")
    test.assertNotIn("\n", msg)
    return msg


class Case(unittest.TestCase):
    def refuses(self, exc, pattern, fn, *args, **kwargs):
        with self.assertRaises(exc) as cm:
            fn(*args, **kwargs)
        self.assertRegex(one_line(self, cm.exception), pattern)
        return cm.exception


class KernelErrors(Case):
    def test_head_dim(self):
        e = self.refuses(ValueError, r"head_dim 100 is invalid: one of 32, 64, .*256",
                         flashjit.Kernel, 100)
        self.assertIsInstance(e, flashjit.InvalidArgument)
        self.assertEqual(e.status_name, "invalid argument")
        self.refuses(TypeError, r"head_dim must be an int, not '128'", flashjit.Kernel, "128")

    def test_arch(self):
        self.refuses(flashjit.InvalidArgument, r"invalid arch 'sm_xx'", flashjit.Kernel, 64,
                     arch="sm_xx")
        self.refuses(flashjit.InvalidArgument, r"arch 'sm_70' is out of range", flashjit.Kernel,
                     64, arch="sm_70")
        self.refuses(TypeError, r"arch must be a string", flashjit.Kernel, 64, arch=90)

    def test_names(self):
        for kw, pattern in ((dict(dtype="f32"), r"dtype='f32' is not one of bf16, .*f16"),
                            (dict(causal="diag"), r"causal='diag' is not one of bottom_right"),
                            (dict(causal=3), r"causal=3 is not one of None"),
                            (dict(mma="tensor"), r"mma='tensor' is not one of mma, wgmma, wmma"),
                            (dict(swizzle="zig"), r"swizzle='zig' is not one of none, pad, xor"),
                            (dict(softmax="x"), r"softmax='x' is not one of regs, smem"),
                            (dict(kv_dtype="e5m2"), r"kv_dtype='e5m2' is not one of .*e4m3")):
            with self.subTest(**kw):
                self.refuses(ValueError, pattern, flashjit.Kernel, 64, **kw)

    def test_axis_types(self):
        self.refuses(TypeError, r"tile_m must be an int, not '64'", flashjit.Kernel, 64,
                     tile_m="64")
        self.refuses(TypeError, r"pack_gqa must be True or False, not 2", flashjit.Kernel, 64,
                     pack_gqa=2)
        self.refuses(TypeError, r"sm_count must be an int", flashjit.Kernel, 64, sm_count="x")

    def test_rules(self):
        self.refuses(flashjit.Unsupported, r"mma wgmma .* needs sm_90a; the target is sm_80",
                     flashjit.Kernel, 128, arch="sm_80", mma="wgmma")
        self.refuses(flashjit.Unsupported, r"tile_m 48 with warps \d+: each of the",
                     flashjit.Kernel, 64, mma="wgmma", tile_m=48)
        self.refuses(flashjit.InvalidArgument, r"stages 9 is invalid", flashjit.Kernel, 64,
                     stages=9)
        self.refuses(ValueError, r"head_dim 256 and tile_n 256 need about \d+ registers",
                     flashjit.Kernel, 256, mma="wgmma", tile_n=256, stages=4)
        self.refuses(flashjit.Unsupported, r"dtype bf16 needs sm_80 or newer; the target is "
                     r"sm_75", flashjit.Kernel, 64, arch="sm_75", dtype="bf16")

    def test_expressions(self):
        self.refuses(flashjit.InvalidArgument, r"mods.score: ';' at column 2: an expression, "
                     r"not a statement", flashjit.Kernel, 64, score_mod="s;")
        self.refuses(flashjit.InvalidArgument, r"mods.score: 'foo' at column 5 is not a name",
                     flashjit.Kernel, 64, score_mod="s + foo")
        self.refuses(flashjit.InvalidArgument, r"mods.mask: ", flashjit.Kernel, 64,
                     mask_mod="kv = 1")
        self.refuses(TypeError, r"score_mod must be a C expression in a str, not 5",
                     flashjit.Kernel, 64, score_mod=5)

    def test_params(self):
        self.refuses(TypeError, r"params\['x'\]='a': an int \(i32\), a float \(f32\), a tensor",
                     flashjit.Kernel, 64, params={"x": "a"})
        self.refuses(TypeError, r"params\['x'\]=True: a bool is not a parameter",
                     flashjit.Kernel, 64, params={"x": True})
        self.refuses(TypeError, r"params must be a dict of name -> value, not list",
                     flashjit.Kernel, 64, params=[1])
        self.refuses(TypeError, r"params: name 1 is not a str", flashjit.Kernel, 64,
                     params={1: 2.0})
        self.refuses(ValueError, r"params\['t'\] has 5 dimensions; a tensor parameter has 1 "
                     r"to 4", flashjit.Kernel, 64, params={"t": ("f32", (1, 2, 3, 4, 5))})
        self.refuses(ValueError, r"params\['t'\] dtype='f64' is not one of", flashjit.Kernel,
                     64, params={"t": ("f64", (4,))})
        self.refuses(flashjit.InvalidArgument, r'mods.params\[0\].name "q" is reserved',
                     flashjit.Kernel, 64, score_mod="s", params={"q": 1.0})

    def test_window_and_softcap(self):
        self.refuses(ValueError, r"window=\(1,\) must be a pair \(left, right\)",
                     flashjit.Kernel, 64, window=(1,))
        self.refuses(TypeError, r"window\[0\] must be an int, not 1.5", flashjit.Kernel, 64,
                     window=(1.5, 0))
        self.refuses(flashjit.InvalidArgument, r"mods.window_left -5 is outside -1",
                     flashjit.Kernel, 64, window=(-5, 0))
        self.refuses(TypeError, r"softcap must be a number or None, not 'x'", flashjit.Kernel,
                     64, softcap="x")
        self.refuses(flashjit.InvalidArgument, r"mods.softcap -1 is invalid", flashjit.Kernel,
                     64, softcap=-1.0)

    def test_device(self):
        self.refuses(ValueError, r"device 'cpu' is not a CUDA device", flashjit.Kernel, 64,
                     device="cpu")
        self.refuses(ValueError, r"device -1 is not a CUDA device ordinal", flashjit.Kernel,
                     64, device=-1)


class PlanErrors(Case):
    def test_sizes(self):
        self.refuses(flashjit.InvalidArgument, r"heads_kv 5 does not divide heads_q 32",
                     flashjit.plan, 1, 32, 128, 64, heads_kv=5)
        self.refuses(flashjit.InvalidArgument, r"batch 0 is invalid: must be in 1\.\.65535",
                     flashjit.plan, 0, 32, 128, 64)
        self.refuses(flashjit.InvalidArgument, r"batch 70000 is invalid", flashjit.plan,
                     70000, 32, 128, 64)
        self.refuses(flashjit.InvalidArgument, r"seq_q -1 is invalid: must be in "
                     r"1\.\.1073741824", flashjit.plan, 1, 32, -1, 64)
        self.refuses(flashjit.InvalidArgument, r"seq_q 1073741825 is invalid", flashjit.plan,
                     1, 32, 2 ** 30 + 1, 64)
        self.refuses(ValueError, r"seq_q=2147483648 does not fit a C int", flashjit.plan, 1,
                     32, 2 ** 31, 64)
        self.refuses(TypeError, r"batch must be an int, not 1.5", flashjit.plan, 1.5, 32, 128,
                     64)

    def test_values(self):
        self.refuses(ValueError, r"layout='sbhd' is not one of bhsd, bshd", flashjit.plan, 1,
                     32, 128, 64, layout="sbhd")
        self.refuses(flashjit.InvalidArgument, r"splits 300 is invalid", flashjit.plan, 1, 32,
                     128, 64, splits=300)
        self.refuses(ValueError, r"scale=0 would zero every score; None gives",
                     flashjit.plan, 1, 32, 128, 64, scale=0)
        self.refuses(TypeError, r"scale must be a float or None, not 'a'", flashjit.plan, 1,
                     32, 128, 64, scale="a")
        self.refuses(flashjit.InvalidArgument, r"scale inf is not finite", flashjit.plan, 1,
                     32, 128, 64, scale=float("inf"))
        self.refuses(flashjit.InvalidArgument, r"sm_count 5000 is invalid", flashjit.plan, 1,
                     32, 128, 64, sm_count=5000)

    def test_device_and_sm_count(self):
        self.refuses(ValueError, r"sm_count is for compile-only planning", flashjit.plan, 1,
                     8, 128, 64, arch=None, sm_count=8)


class LayoutErrors(Case):
    def test_names(self):
        self.refuses(ValueError, r"frag='nope' is not one of wmma_acc_f32, .*wgmma_a$",
                     flashjit.layout, "nope", arch="sm_90a")

    def test_arch(self):
        self.refuses(flashjit.Unsupported, r"fragment kind wgmma_acc_f16 needs",
                     flashjit.layout, "wgmma_acc_f16", arch="sm_80")


@unittest.skipUnless(fjtest.HAS_TORCH, fjtest.NO_TORCH)
class AttentionErrors(Case):
    """What attention() refuses before any GPU work, on CPU tensors."""

    def qkv(self, shape=(1, 2, 16, 64), dtype=None, **kw):
        dtype = dtype or torch.float16
        return [torch.zeros(shape, dtype=dtype, **kw) for _ in range(3)]

    def test_not_tensors(self):
        q, k, v = self.qkv()
        self.refuses(TypeError, r"q is a list, not a torch.Tensor", flashjit.attention, [1],
                     k, v)

    def test_dtype(self):
        q, k, v = self.qkv(dtype=torch.float32)
        self.refuses(TypeError, r"q has dtype torch.float32; flashjit takes torch.float16 or "
                     r"torch.bfloat16", flashjit.attention, q, k, v)
        q, k, v = self.qkv()
        self.refuses(TypeError, r"q, k and v must share a dtype", flashjit.attention, q,
                     k.bfloat16(), v)

    def test_rank(self):
        q, k, v = self.qkv()
        self.refuses(ValueError, r"k has 3 dimensions \(2, 16, 64\); layout 'bhsd' takes 4: "
                     r"\(batch, heads, seq, head_dim\)", flashjit.attention, q, k[0], v)
        self.refuses(ValueError, r"layout 'bshd' takes 4: \(batch, seq, heads, head_dim\)",
                     flashjit.attention, q[0], k, v, layout="bshd")

    def test_shapes(self):
        q, k, v = self.qkv()
        z = torch.zeros
        h = torch.float16
        self.refuses(ValueError, r"batch sizes differ: q 1, k 2, v 1", flashjit.attention, q,
                     z((2, 2, 16, 64), dtype=h), v)
        self.refuses(ValueError, r"head dims differ: q 64, k 64, v 128", flashjit.attention,
                     q, k, z((1, 2, 16, 128), dtype=h))
        self.refuses(ValueError, r"must have the same heads and sequence length",
                     flashjit.attention, q, k, z((1, 2, 17, 64), dtype=h))
        self.refuses(ValueError, r"q has 3 heads and k, v 2: the query heads must be a "
                     r"multiple of the KV heads", flashjit.attention, z((1, 3, 16, 64),
                                                                        dtype=h), k, v)

    def test_strides(self):
        q, k, v = self.qkv(shape=(1, 2, 16, 128))
        self.refuses(ValueError, r"q's head dimension is not contiguous \(stride 2",
                     flashjit.attention, q[..., ::2], k[..., ::2], v[..., ::2])

    def test_device(self):
        q, k, v = self.qkv()
        self.refuses(ValueError, r"q is on cpu; flashjit runs on CUDA tensors",
                     flashjit.attention, q, k, v)

    def test_options(self):
        q, k, v = self.qkv()
        self.refuses(ValueError, r"causal='up' is not one of", flashjit.attention, q, k, v,
                     causal="up")
        self.refuses(ValueError, r"layout='sbhd' is not one of bhsd, bshd",
                     flashjit.attention, q, k, v, layout="sbhd")
        self.refuses(ValueError, r"scale=0 would zero every score", flashjit.attention, q, k,
                     v, scale=0.0)
        self.refuses(TypeError, r"scale must be a float or None", flashjit.attention, q, k, v,
                     scale="x")
        self.refuses(ValueError, r"window=3 must be a pair", flashjit.attention, q, k, v,
                     window=3)
        self.refuses(TypeError, r"softcap must be a number or None", flashjit.attention, q,
                     k, v, softcap="x")
        self.refuses(TypeError, r"score_mod must be a C expression in a str",
                     flashjit.attention, q, k, v, score_mod=1)

    def test_params_encoding(self):
        from flashjit import _torch
        self.assertEqual(_torch.encode_params({"a": 1, "b": 2.5}), ("a=i,b=f", [], [1.0, 2.5]))
        t = torch.zeros(4)
        names, tensors, scalars = _torch.encode_params({"t": t, "n": 3})
        self.assertEqual((names, scalars), ("t=t,n=i", [3.0]))
        self.assertIs(tensors[0], t)
        self.assertEqual(_torch._decode_params(names, tensors, scalars)["n"], 3)
        self.refuses(ValueError, r"params: 'a b' is not a C identifier",
                     _torch.encode_params, {"a b": 1})
        self.refuses(TypeError, r"params\['x'\]=True: an int \(i32\), a float \(f32\) or a "
                     r"tensor", _torch.encode_params, {"x": True})


@unittest.skipUnless(fjtest.HAS_TORCH, fjtest.NO_TORCH)
class FakeImplementation(unittest.TestCase):
    """The op's fake (meta) implementation, which torch.compile traces."""

    def test_registered(self):
        self.assertTrue(hasattr(torch.ops.flashjit, "attention"))

    def test_meta_shapes(self):
        q = torch.empty((2, 8, 100, 64), dtype=torch.bfloat16, device="meta")
        k = torch.empty((2, 2, 300, 64), dtype=torch.bfloat16, device="meta")
        out, lse = torch.ops.flashjit.attention(q, k, k, 1, 0.0, True, 0, -1, -1, 0.0, "", "",
                                                "", [], [])
        self.assertEqual(tuple(out.shape), (2, 8, 100, 64))
        self.assertEqual(out.dtype, torch.bfloat16)
        self.assertEqual(tuple(lse.shape), (2, 8, 100))
        self.assertEqual(lse.dtype, torch.float32)
        qs = torch.empty((2, 100, 8, 64), dtype=torch.float16, device="meta")
        ks = torch.empty((2, 300, 2, 64), dtype=torch.float16, device="meta")
        out, lse = torch.ops.flashjit.attention(qs, ks, ks, 0, 0.0, False, 1, -1, -1, 0.0, "",
                                                "", "", [], [])
        self.assertEqual(tuple(out.shape), (2, 100, 8, 64))
        self.assertEqual(tuple(lse.shape), (0,))


if __name__ == "__main__":
    unittest.main()
