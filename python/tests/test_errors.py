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
        e = self.refuses(ValueError, r"head_dim 100 is invalid: a multiple of 8 from 8 to 576",
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

    def test_switches(self):
        self.refuses(TypeError, r"sinks must be True or False, not 'yes'", flashjit.Kernel, 64,
                     sinks="yes")
        self.refuses(TypeError, r"checked must be True or False, not 2", flashjit.plan, 1, 8,
                     128, 64, checked=2)
        self.refuses(ValueError, r"block_mask\[0\]=100 is not a block size: 64, 128 or 256",
                     flashjit.Kernel, 64, block_mask=(100, 128))
        self.refuses(ValueError, r"block_mask\[1\]=32 is not a block size", flashjit.plan, 1,
                     8, 128, 64, block_mask=(64, 32))
        self.refuses(TypeError, r"block_mask\[0\] must be an int, not '64'", flashjit.Kernel,
                     64, block_mask=("64", 64))
        self.refuses(ValueError, r"block_mask=128 must be a pair \(block_q, block_kv\) of 64, "
                     r"128 or 256, or a flashjit.BlockMask", flashjit.Kernel, 64,
                     block_mask=128)
        # The library's own refusals.
        self.refuses(flashjit.Unsupported, r"tile_m 128 and tile_n \d+ must divide the block "
                     r"mask's blocks \(64 query rows, 128 keys\)", flashjit.Kernel, 128,
                     tile_m=128, block_mask=(64, 128))
        self.refuses(flashjit.Unsupported, r"mods.sinks \(attention sinks\) are implemented "
                     r"for mma mma and mma wgmma; this variant is mma wmma", flashjit.Kernel,
                     64, arch="sm_80", mma="wmma", sinks=True)
        self.refuses(flashjit.Unsupported, r"splits 4 with mods.block_mask is not "
                     r"implemented: 0 or 1", flashjit.plan, 1, 8, 1000, 64, splits=4,
                     block_mask=(128, 128))

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
        self.refuses(ValueError, r"frag='nope' is not one of wmma_acc_f32, .*wgmma_a, wgmma_acc_e4m3, wgmma_a8$",
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
        q, k, v = self.qkv(dtype=torch.float8_e5m2)
        self.refuses(TypeError, r"q has dtype torch.float8_e5m2; flashjit takes "
                     r"torch.float16 or torch.bfloat16, or torch.float8_e4m3fn \(FP8 "
                     r"attention\)$", flashjit.attention, q, k, v)

    def test_fp8_mixed(self):
        # 16-bit queries over FP8 keys and values pass the dtypes (the
        # device check, CPU tensors, stops them next); other mixes do not.
        q, k, v = self.qkv(dtype=torch.float8_e4m3fn)
        self.refuses(ValueError, r"^flashjit.attention: q is on cpu; flashjit runs on CUDA "
                     r"tensors$", flashjit.attention, q.bfloat16(), k, v)
        self.refuses(ValueError, r"^flashjit.attention: q is on cpu", flashjit.attention,
                     q.half(), k, v)
        for qq, kk, vv, names in (
                (q, k.half(), v, "torch.float8_e4m3fn, torch.float16, torch.float8_e4m3fn"),
                (q.half(), k, v.half(), "torch.float16, torch.float8_e4m3fn, torch.float16"),
                (q.float(), k, v, "torch.float32, torch.float8_e4m3fn, torch.float8_e4m3fn")):
            with self.subTest(names=names):
                pattern = (r"^flashjit.attention: q, k and v are " + names + r"; FP8 "
                           r"attention takes all three in torch.float8_e4m3fn, an FP8 KV "
                           r"cache's k and v both under a float16 or bfloat16 q$")
                if qq.dtype == torch.float32:
                    pattern = r"^flashjit.attention: q has dtype torch.float32"
                self.refuses(TypeError, pattern, flashjit.attention, qq, kk, vv)

    def test_fp8_descales(self):
        # attention() checks them after the device (CPU tensors stop there),
        # so its check is called directly.
        from flashjit._args import _check_descales
        q = torch.zeros((2, 8, 16, 64), dtype=torch.float8_e4m3fn)
        ok = torch.ones((2, 4))
        self.assertTrue(_check_descales(q, q, 2, 4, (ok, None, ok)))
        self.assertFalse(_check_descales(q.half(), q.half(), 2, 4, (None, None, None)))
        # FP8 k and v under a 16-bit q: their descales, not q's.
        self.assertFalse(_check_descales(q.half(), q, 2, 4, (None, ok, ok)))
        self.refuses(ValueError, r"^flashjit.attention: q_descale is for an FP8 q; q is "
                     r"torch.bfloat16 \(k_descale and v_descale scale the FP8 k and v\)$",
                     _check_descales, q.bfloat16(), q, 2, 4, (ok, None, None))
        self.refuses(TypeError, r"^flashjit.attention: v_descale has dtype torch.float64",
                     _check_descales, q.half(), q, 2, 4, (None, None, ok.double()))
        for descales, exc, pattern in (
                ((None, ok.double(), None), TypeError,
                 r"^flashjit.attention: k_descale has dtype torch.float64; it must be "
                 r"torch.float32$"),
                ((None, None, ok[:1]), ValueError,
                 r"^flashjit.attention: v_descale has shape \(1, 4\); it must be \(batch, "
                 r"heads_kv\) = \(2, 4\), or \(\) or \(1,\) for one descale in all$"),
                ((torch.ones(8), None, None), ValueError, r"q_descale has shape \(8,\)"),
                ((ok.t().contiguous().t(), None, None), ValueError,
                 r"^flashjit.attention: q_descale is not contiguous \(strides \(1, 2\)\); "
                 r"call .contiguous\(\)$"),
                ((1.0, None, None), TypeError,
                 r"^flashjit.attention: q_descale is a float, not a torch.Tensor"),
                ((ok.to("meta"), None, None), ValueError,
                 r"^flashjit.attention: q_descale is on meta; the attention inputs are on "
                 r"cpu$")):
            with self.subTest(pattern=pattern):
                self.refuses(exc, pattern, _check_descales, q, q, 2, 4, descales)
        self.refuses(ValueError, r"^flashjit.attention: k_descale is for FP8 inputs "
                     r"\(torch.float8_e4m3fn\); q, k and v are torch.float16$",
                     _check_descales, q.half(), q.half(), 2, 4, (None, ok, None))

    def test_fp8_out(self):
        # out_dtype, o_scale and return_amax: FP8 attention's, checked
        # after the device (called directly: CPU tensors stop there).
        from flashjit import _capi as capi
        from flashjit._args import _check_out
        f8 = torch.float8_e4m3fn
        q = torch.zeros((2, 8, 16, 64), dtype=f8)
        one = torch.ones(1)
        for args, want in (((None, None, False), 0), ((torch.bfloat16, None, True), 0),
                           ((torch.float16, None, False), capi.F16),
                           ((f8, one, True), capi.E4M3), ((f8, None, False), capi.E4M3)):
            with self.subTest(args=args):
                self.assertEqual(_check_out(q, *args, True), want)
        self.assertEqual(_check_out(q.half(), torch.float16, None, False, False), 0)
        who = r"^flashjit.attention: "
        for qq, args, fp8, exc, pattern in (
                (q.half(), (f8, None, False), False, ValueError,
                 who + r"out_dtype=torch.float8_e4m3fn is for FP8 attention \(q, k and v "
                 r"torch.float8_e4m3fn\); a torch.float16 q's call writes O in torch.float16$"),
                (q, (torch.float32, None, False), True, ValueError,
                 who + r"out_dtype=torch.float32 is not torch.bfloat16, torch.float16 or "
                 r"torch.float8_e4m3fn$"),
                (q, (None, one, False), True, ValueError,
                 who + r"o_scale is an e4m3 O's scale: pass out_dtype=torch.float8_e4m3fn with "
                 r"it$"),
                (q, (f8, 2.0, False), True, TypeError, who + r"o_scale is a float, not a "),
                (q, (f8, torch.ones(2), False), True, ValueError,
                 who + r"o_scale has dtype torch.float32 and shape \(2,\); it must be float32 "
                 r"with one element$"),
                (q, (f8, one.to("meta"), False), True, ValueError,
                 who + r"o_scale is on meta; the attention inputs are on cpu$"),
                (q, (None, None, 1), True, TypeError,
                 who + r"return_amax must be True or False, not 1$"),
                (q.half(), (None, None, True), False, ValueError,
                 who + r"return_amax is FP8 attention's \(q, k and v torch.float8_e4m3fn\); "
                 r"q is torch.float16$")):
            with self.subTest(pattern=pattern):
                self.refuses(exc, pattern, _check_out, qq, *args, fp8)

    def test_fp8_descale_layouts(self):
        # One descale a tensor: shape () or (1,), or (batch, heads_kv)
        # expanded from one (vLLM's k_scale.expand(...)); the given ones
        # alike, else refused by name.
        from flashjit import _capi as capi
        from flashjit._args import _check_descales, scale_layout
        q = torch.zeros((2, 8, 16, 64), dtype=torch.float8_e4m3fn)
        head, one = torch.ones((2, 4)), torch.ones(())
        for descales, want in (((head, None, head), capi.SCALE_PER_HEAD),
                               ((None, None, None), capi.SCALE_PER_HEAD),
                               ((one, torch.ones(1), None), capi.SCALE_PER_TENSOR),
                               ((None, torch.ones(1).expand(2, 4), one), capi.SCALE_PER_TENSOR)):
            with self.subTest(descales=[None if t is None else tuple(t.stride())
                                        for t in descales]):
                self.assertTrue(_check_descales(q, q, 2, 4, descales))
                self.assertEqual(scale_layout(descales), want)
        # A (1, 1) problem's one descale is both; a strided one is not one.
        self.assertEqual(scale_layout((torch.ones(1, 1), None, None)), capi.SCALE_PER_TENSOR)
        self.refuses(ValueError, r"^flashjit.attention: q_descale holds one descale for the "
                     r"tensor and v_descale one per \(batch, KV head\): give them alike "
                     r"\(expand the single one to \(batch, heads_kv\) and call "
                     r"\.contiguous\(\)\)$", _check_descales, q, q, 2, 4, (one, None, head))
        self.refuses(ValueError, r"k_descale is not contiguous \(strides \(0, 1\)\)",
                     _check_descales, q, q, 2, 4, (None, torch.ones(4).expand(2, 4), None))

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
        self.refuses(ValueError, r"head dims differ: q 64, k 128; q and k share one",
                     flashjit.attention, q, z((1, 2, 16, 128), dtype=h), v)
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
        self.refuses(TypeError, r"checked must be True or False, not 1", flashjit.attention,
                     q, k, v, checked=1)

    def test_params_options(self):
        from flashjit import _args
        self.assertEqual(_args.params_opts({"a": 1, "b": 2.5}),
                         ((("a", "i", 1), ("b", "f", 2.5)), (), ()))
        t = torch.zeros(4)
        spec, roles, tensors = _args.params_opts({"t": t, "n": 3})
        self.assertEqual((spec, roles), ((("t", "t", None), ("n", "i", 3)), ("param:t",)))
        self.assertIs(tensors[0], t)
        self.refuses(ValueError, r"params: 'a b' is not a C identifier",
                     _args.params_opts, {"a b": 1})
        self.refuses(TypeError, r"tensor", _args.params_opts, {"x": True})


@unittest.skipUnless(fjtest.HAS_TORCH, fjtest.NO_TORCH)
class BlockMaskErrors(Case):
    """flashjit.BlockMask from the caller's lists: what it refuses, and
    what attention() refuses of one that does not fit (on CPU tensors:
    attention() itself refuses those first, so its check is called
    directly)."""

    def lists(self, b=1, h=2, qb=4, kb=5, full=True, dtype=None, device="cpu"):
        dtype = dtype or torch.int32
        z = [torch.zeros((b, h, qb), dtype=dtype, device=device),
             torch.zeros((b, h, qb, kb), dtype=dtype, device=device)]
        return z + ([t.clone() for t in z] if full else [None, None])

    def test_accepts(self):
        bm = flashjit.BlockMask(*self.lists(b=2, h=3, qb=4, kb=5), block_q=64, block_kv=256)
        self.assertEqual(bm.shape, (2, 3, 4, 5))
        self.assertEqual((bm.block_q, bm.block_kv), (64, 256))
        self.assertEqual(bm.device, torch.device("cpu"))
        self.assertIsNone(bm.seq_q)
        self.assertIn("2x3x4x5 of blocks 64x256 with full blocks on cpu", repr(bm))
        partial = flashjit.BlockMask(*self.lists(full=False)[:2])
        self.assertIsNone(partial.full_num)
        self.assertEqual((partial.block_q, partial.block_kv), (128, 128))
        self.assertIs(partial.to("cpu"), partial)
        moved = bm.to("meta")
        self.assertEqual((moved.device.type, moved.shape), ("meta", bm.shape))
        self.assertEqual(moved.full_indices.device.type, "meta")

    def test_types(self):
        n, i, fn, fi = self.lists()
        self.refuses(TypeError, r"flashjit.BlockMask: kv_num has dtype torch.int64; it must "
                     r"be torch.int32", flashjit.BlockMask, n.long(), i)
        self.refuses(TypeError, r"full_indices has dtype torch.int16; it must be torch.int32",
                     flashjit.BlockMask, n, i, fn, fi.short())
        self.refuses(TypeError, r"kv_indices is a list, not a torch.Tensor",
                     flashjit.BlockMask, n, [[0]])
        self.refuses(TypeError, r"kv_num is None; the partial blocks' counts and indices are "
                     r"required", flashjit.BlockMask, None, i)
        self.refuses(TypeError, r"block_q must be an int, not 128.0", flashjit.BlockMask, n,
                     i, block_q=128.0)
        self.refuses(ValueError, r"flashjit.BlockMask: block_kv=32 is not a block size: 64, "
                     r"128 or 256", flashjit.BlockMask, n, i, block_kv=32)

    def test_pairs_and_layout(self):
        n, i, fn, fi = self.lists()
        self.refuses(ValueError, r"full_num is given but full_indices is not: give both",
                     flashjit.BlockMask, n, i, fn)
        self.refuses(ValueError, r"full_indices is given but full_num is not",
                     flashjit.BlockMask, n, i, None, fi)
        self.refuses(ValueError, r"kv_indices is on meta and kv_num on cpu; the lists must be "
                     r"on one device", flashjit.BlockMask, n, i.to("meta"))
        self.refuses(ValueError, r"kv_indices is not contiguous \(strides \(40, 5, 10, 1\)\); "
                     r"call .contiguous\(\)", flashjit.BlockMask, n,
                     torch.zeros((1, 4, 2, 5), dtype=torch.int32).transpose(1, 2))

    def test_transposed_lists(self):
        # The backward's lists (per key block, its query blocks): in pairs,
        # full ones exactly where the rows' lists have full ones, shapes
        # (batch, heads, kv_blocks[, q_blocks]).
        n, i, fn, fi = self.lists(b=1, h=2, qb=4, kb=5)
        qn, qi, fqn, fqi = self.lists(b=1, h=2, qb=5, kb=4)
        bm = flashjit.BlockMask(n, i, fn, fi, q_num=qn, q_indices=qi, full_q_num=fqn,
                                full_q_indices=fqi)
        self.assertTrue(bm.has_backward)
        self.assertIs(bm._tensors()[7], fqi)
        self.assertIn("with full blocks, transposed", repr(bm))
        self.assertEqual(bm.to("meta").q_indices.device.type, "meta")
        self.assertFalse(flashjit.BlockMask(n, i, fn, fi).has_backward)
        self.refuses(ValueError, r"q_num is given but q_indices is not: give both \(the "
                     r"transposed lists\) or neither", flashjit.BlockMask, n, i, q_num=qn)
        self.refuses(ValueError, r"full_num is given but full_q_num is not: full blocks need "
                     r"their lists in both directions", flashjit.BlockMask, n, i, fn, fi,
                     q_num=qn, q_indices=qi)
        self.refuses(ValueError, r"full_q_num is given but full_num is not",
                     flashjit.BlockMask, n, i, q_num=qn, q_indices=qi, full_q_num=fqn,
                     full_q_indices=fqi)
        self.refuses(ValueError, r"full_q_num is given but q_num is not", flashjit.BlockMask,
                     n, i, fn, fi, full_q_num=fqn, full_q_indices=fqi)
        self.refuses(ValueError, r"q_indices has shape \(1, 2, 5, 5\); it must be \(1, 2, 5, "
                     r"4\), \(batch, heads, kv_blocks, q_blocks\)", flashjit.BlockMask, n, i,
                     q_num=qn, q_indices=torch.zeros((1, 2, 5, 5), dtype=torch.int32))
        self.refuses(TypeError, r"q_num has dtype torch.int64", flashjit.BlockMask, n, i,
                     q_num=qn.long(), q_indices=qi)

    def test_shapes(self):
        n, i, fn, fi = self.lists(b=1, h=2, qb=4, kb=5)
        self.refuses(ValueError, r"kv_num has 2 dimensions \(2, 4\); it takes 3: \(batch, "
                     r"heads, q_blocks\)", flashjit.BlockMask, n[0], i)
        self.refuses(ValueError, r"kv_indices has shape \(1, 2, 3, 5\); with kv_num \(1, 2, "
                     r"4\) it must be \(1, 2, 4, kv_blocks\)", flashjit.BlockMask, n,
                     i[:, :, :3].contiguous())
        self.refuses(ValueError, r"kv_indices has shape \(2, 4, 5\)", flashjit.BlockMask, n,
                     i[0])
        self.refuses(ValueError, r"full_indices has shape \(1, 2, 4, 6\); it must be "
                     r"\(1, 2, 4, 5\), kv_indices's", flashjit.BlockMask, n, i, fn,
                     torch.zeros((1, 2, 4, 6), dtype=torch.int32))
        self.refuses(ValueError, r"full_num has shape \(1, 1, 4\); it must be \(1, 2, 4\), "
                     r"kv_num's", flashjit.BlockMask, n, i, fn[:, :1].contiguous(), fi)
        e = self.lists(qb=0)
        self.refuses(ValueError, r"q_blocks 0 is below 1", flashjit.BlockMask, *e)

    def test_fits_the_problem(self):
        from flashjit import _torch
        bm = flashjit.BlockMask(*self.lists(b=1, h=2, qb=4, kb=5), block_q=64, block_kv=128)
        q = torch.zeros((1, 2, 256, 64), dtype=torch.float16)
        args = _torch._block_mask_args(bm, q, 3, 2, 256, 600)  # fits: batch 1 for any
        self.assertEqual(args[:2], (64, 128))
        self.assertIs(args[2], bm.kv_num)
        self.assertIs(args[5], bm.full_indices)
        self.assertEqual(_torch._block_mask_args(None, q, 1, 2, 256, 600),
                         (0, 0) + (None,) * 8)
        self.refuses(ValueError, r"flashjit.attention: block_mask has heads 2; it must be 1 "
                     r"\(one list for every head\) or the problem's heads_q 4",
                     _torch._block_mask_args, bm, q, 1, 4, 256, 600)
        self.refuses(ValueError, r"block_mask is 4 x 5 blocks of 64 x 128; seq_q 256 and "
                     r"seq_kv 700 need 4 x 6", _torch._block_mask_args, bm, q, 1, 2, 256, 700)
        self.refuses(ValueError, r"block_mask is 4 x 5 blocks of 64 x 128; seq_q 257 and "
                     r"seq_kv 600 need 5 x 5", _torch._block_mask_args, bm, q, 1, 2, 257, 600)
        self.refuses(ValueError, r"block_mask is on cpu; the attention inputs are on meta",
                     _torch._block_mask_args, bm, q.to("meta"), 1, 2, 256, 600)
        b2 = flashjit.BlockMask(*self.lists(b=2, h=1, qb=4, kb=5), block_q=64, block_kv=128)
        self.refuses(ValueError, r"block_mask has batch 2; it must be 1 \(one list for every "
                     r"batch index\) or the problem's 3", _torch._block_mask_args, b2, q, 3, 2,
                     256, 600)
        self.refuses(TypeError, r"block_mask is a tuple, not a flashjit.BlockMask",
                     _torch._block_mask_args, (64, 128), q, 1, 2, 256, 600)

    def test_attention_checks_it(self):
        # attention() takes block_mask= and refuses a wrong type after the
        # inputs' own checks (here: the device, which these CPU tensors fail).
        q = torch.zeros((1, 2, 16, 64), dtype=torch.float16)
        self.refuses(ValueError, r"q is on cpu", flashjit.attention, q, q, q,
                     block_mask=flashjit.BlockMask(*self.lists(qb=1, kb=1)))

    def test_from_flex(self):
        class Flex:  # FlexAttention's BlockMask attributes
            pass
        f = Flex()
        f.kv_num_blocks, f.kv_indices, f.full_kv_num_blocks, f.full_kv_indices = self.lists()
        f.kv_indices = f.kv_indices.transpose(2, 3).contiguous().transpose(2, 3)
        f.BLOCK_SIZE = (128, 64)
        bm = flashjit.BlockMask.from_flex(f)
        self.assertEqual((bm.block_q, bm.block_kv, bm.shape), (128, 64, (1, 2, 4, 5)))
        self.assertTrue(bm.kv_indices.is_contiguous())
        self.assertIs(bm.full_num, f.full_kv_num_blocks)
        self.assertFalse(bm.has_backward)  # this one has no transposed lists
        f.q_num_blocks, f.q_indices, f.full_q_num_blocks, f.full_q_indices = self.lists(qb=5,
                                                                                        kb=4)
        bm = flashjit.BlockMask.from_flex(f)
        self.assertTrue(bm.has_backward)
        self.assertIs(bm.full_q_indices, f.full_q_indices)
        f.full_kv_num_blocks = f.full_kv_indices = None
        f.full_q_num_blocks = f.full_q_indices = None
        self.assertIsNone(flashjit.BlockMask.from_flex(f).full_num)
        self.refuses(TypeError, r"from_flex: a tuple is not a FlexAttention BlockMask \(it has "
                     r"no kv_num_blocks, kv_indices, BLOCK_SIZE\)", flashjit.BlockMask.from_flex,
                     (1, 2))

    def test_from_flex_create_block_mask(self):
        # The real thing where this PyTorch has it and builds on the CPU.
        try:
            from torch.nn.attention.flex_attention import create_block_mask
            fm = create_block_mask(lambda b, h, q, kv: kv <= q, None, None, 384, 384,
                                   device="cpu", BLOCK_SIZE=128)
        except Exception as e:  # noqa: BLE001 -- any failure: not available here
            self.skipTest(f"FlexAttention's create_block_mask on the CPU: {e}")
        bm = flashjit.BlockMask.from_flex(fm)
        self.assertEqual(bm.shape, (1, 1, 3, 3))
        self.assertEqual((bm.block_q, bm.block_kv), (128, 128))
        # Causal: each query block keeps its diagonal block in part and the
        # ones before it whole.
        self.assertEqual(bm.kv_num.flatten().tolist(), [1, 1, 1])
        self.assertEqual(bm.full_num.flatten().tolist(), [0, 1, 2])
        self.assertEqual([bm.kv_indices[0, 0, r, 0].item() for r in range(3)], [0, 1, 2])
        # The transposed lists: each key block kept in part by its diagonal
        # query block, whole by the later ones.
        self.assertTrue(bm.has_backward)
        self.assertEqual(bm.q_num.flatten().tolist(), [1, 1, 1])
        self.assertEqual(bm.full_q_num.flatten().tolist(), [2, 1, 0])
        self.assertEqual(bm.full_q_indices[0, 0, 0, :2].tolist(), [1, 2])


@unittest.skipUnless(fjtest.HAS_TORCH, fjtest.NO_TORCH)
class BlockMaskBuilder(Case):
    """flashjit.block_mask(): its refusals before any GPU work, and the
    buffer it fills, laid out as the library's fj_block_mask_size counts
    it (through a compile-only context: no GPU)."""

    SIZES = dict(batch=2, heads_q=8, seq_q=1000, seq_kv=3000)

    def build(self, **kw):
        return flashjit.block_mask(**dict(self.SIZES, **kw))

    def test_arguments(self):
        self.refuses(TypeError, r"flashjit.block_mask: give q and k, or batch, heads_q, seq_q "
                     r"and seq_kv \(heads_q, seq_kv missing\)", flashjit.block_mask, batch=1,
                     seq_q=5)
        self.refuses(TypeError, r"flashjit: batch must be an int, not 1.5", self.build,
                     batch=1.5)
        self.refuses(ValueError, r"flashjit: seq_q=2147483648 does not fit a C int|"
                     r"seq_q=2147483648 does not fit a C int", self.build, seq_q=2 ** 31)
        self.refuses(ValueError, r"flashjit: block_q=100 is not a block size: 64, 128 or 256",
                     self.build, block_q=100)
        self.refuses(TypeError, r"block_kv must be an int, not None", self.build,
                     block_kv=None)
        self.refuses(ValueError, r"causal='up' is not one of", self.build, causal="up")
        self.refuses(ValueError, r"window=5 must be a pair", self.build, window=5)
        self.refuses(TypeError, r"flashjit.block_mask: mask_mod must be a C expression in a "
                     r"str, not 3", self.build, mask_mod=3)
        self.refuses(ValueError, r"flashjit.block_mask: device cpu is not a CUDA device; the "
                     r"lists are built on the GPU", self.build, device="cpu")
        self.refuses(ValueError, r"flashjit.block_mask: params\['doc'\] is on cpu; the lists "
                     r"are built on a CUDA device", self.build, mask_mod="doc(q) == doc(kv)",
                     params={"doc": torch.zeros(3000, dtype=torch.int32)})
        self.refuses(TypeError, r"params\['doc'\] describes a tensor \('i32', \(3000,\)\); "
                     r"attention\(\) and block_mask\(\) need the tensor itself", self.build,
                     mask_mod="doc(q) == doc(kv)", params={"doc": ("i32", (3000,))})

    def test_library_refusals_without_gpu(self):
        # The problem and its mask are checked before any GPU is looked for.
        self.refuses(flashjit.InvalidArgument, r"mods.mask: 'doc' at column 1 is not a name",
                     self.build, mask_mod="doc(q) == doc(kv)")
        self.refuses(flashjit.InvalidArgument, r"mods.window_right 3 with causal top-left",
                     self.build, causal=True, window=(5, 3))
        self.refuses(flashjit.InvalidArgument, r"heads_kv 3 does not divide heads_q 8",
                     self.build, heads_kv=3)
        self.refuses(flashjit.InvalidArgument, r"seq_kv 0 is invalid", self.build, seq_kv=0)

    def test_tensors_instead_of_sizes(self):
        q = torch.zeros((1, 2, 16, 64), dtype=torch.float16)
        self.refuses(TypeError, r"flashjit.block_mask: k is missing: give q and k",
                     flashjit.block_mask, q)
        self.refuses(ValueError, r"give q and k or the sizes, not both \(batch, device given "
                     r"with q and k\)", flashjit.block_mask, q, q, batch=1, device="cuda")
        self.refuses(ValueError, r"flashjit.block_mask: q is on cpu; flashjit runs on CUDA "
                     r"tensors", flashjit.block_mask, q, q)
        self.refuses(TypeError, r"flashjit.block_mask: k has dtype torch.float32",
                     flashjit.block_mask, q, q.float())
        self.refuses(ValueError, r"flashjit.block_mask: batch sizes differ: q 1, k 2",
                     flashjit.block_mask, q, torch.zeros((2, 2, 16, 64), dtype=torch.float16))
        self.refuses(ValueError, r"layout 'bshd' takes 4", flashjit.block_mask, q[0], q[0],
                     layout="bshd")

    def test_needs_gpu(self):
        if fjtest.library_has_gpu():
            self.skipTest("a GPU is present")
        e = self.refuses(flashjit.NoDevice, r"^flashjit.block_mask builds the lists on a GPU: ",
                         self.build, causal="top_left", block_q=64)
        self.assertEqual(e.status_name, "no CUDA device or driver")

    def test_size_agrees_with_the_library(self):
        # The mask's batch is 1 unless its expression reads b, its heads 1
        # unless it reads h or hkv (include/flashjit.h); the buffer holds
        # the four count arrays (rows' and columns'), then, 16-byte aligned,
        # the four index arrays.
        from flashjit import _blockmask, _core, _torch
        ctx = _core.arch_context("sm_90a")
        qb, kb = 8, 47  # 1000 / 128 and 3000 / 64, rounded up
        for mask, batch, heads in (("kv % n == 0", 1, 1), (None, 1, 1),
                                   ("h == n || kv <= q", 1, 8), ("hkv == n", 1, 8),
                                   ("b == n || kv <= q", 2, 1), ("b + h == n", 2, 8)):
            with self.subTest(mask=mask):
                p, mods, dev = _torch._block_mask_problem(
                    None, None, mask, {"n": 1} if mask else None, "bottom_right", (256, 0),
                    "bhsd", 2, 8, 2, 1000, 3000, "cuda:1")
                self.assertEqual(dev, torch.device("cuda", 1))
                got = _torch._block_mask_size(ctx, p, 128, 64)
                self.assertEqual(got, _blockmask.buffer_bytes(batch, heads, qb, kb))
        p, _, _ = _torch._block_mask_problem(None, None, None, None, None, None, "bhsd", 1, 1,
                                             None, 100, 100, None)
        self.assertEqual(_torch._block_mask_size(ctx, p, 256, 256), 16 + 16)  # 1 x 1 blocks
        self.refuses(flashjit.InvalidArgument, r"fj_block_mask_size: block_q 100 is not a "
                     r"block size: 64, 128 or 256", _torch._block_mask_size, ctx, p, 100, 64)

    def test_views_of_the_buffer(self):
        # What block_mask() makes of fj_block_mask_build's answer: the eight
        # lists as int32 views of its one buffer, at the offsets the
        # library's pointers say (simulated here on a CPU buffer): counts
        # num, q_num, full_num, full_q_num, then the index lists.
        from flashjit import _blockmask, _capi
        b, h, qb, kb = 2, 3, 4, 5
        n = _blockmask.buffer_bytes(b, h, qb, kb)
        buf = torch.zeros(n, dtype=torch.uint8)
        rows, cols = b * h * qb, b * h * kb
        idx = (2 * (rows + cols) * 4 + 15) // 16 * 16
        lst = rows * kb * 4
        offs = (0, idx, (rows + cols) * 4, idx + lst,
                rows * 4, idx + 2 * lst, (2 * rows + cols) * 4, idx + 3 * lst)
        counts = (rows, rows * kb, rows, rows * kb, cols, rows * kb, cols, rows * kb)
        words = buf.view(torch.int32)
        for k, (off, count) in enumerate(zip(offs, counts)):
            words[off // 4:off // 4 + count] = torch.arange(count, dtype=torch.int32) + 1000 * k
        base = buf.data_ptr()
        raw = _capi.BlockMask(64, 128, b, h, qb, kb, *(base + o for o in offs))
        bm = flashjit.BlockMask._of_buffer(buf, raw, 250, 600)
        self.assertEqual((bm.shape, bm.block_q, bm.block_kv), ((b, h, qb, kb), 64, 128))
        self.assertEqual((bm.seq_q, bm.seq_kv), (250, 600))
        self.assertEqual(tuple(bm.kv_num.shape), (b, h, qb))
        self.assertEqual(tuple(bm.full_indices.shape), (b, h, qb, kb))
        self.assertEqual(bm.kv_num[1, 2, 3].item(), rows - 1)
        self.assertEqual(bm.kv_indices[0, 0, 1, 2].item(), 1000 + kb + 2)
        self.assertEqual(bm.full_num[0, 1, 0].item(), 2000 + qb)
        self.assertEqual(bm.full_indices[1, 2, 3, 4].item(), 3000 + rows * kb - 1)
        self.assertEqual(bm.kv_num.data_ptr(), base)
        self.assertEqual(tuple(bm.q_num.shape), (b, h, kb))
        self.assertEqual(tuple(bm.full_q_indices.shape), (b, h, kb, qb))
        self.assertEqual(bm.q_num[1, 2, 4].item(), 4000 + cols - 1)
        self.assertEqual(bm.q_indices[0, 0, 1, 2].item(), 5000 + qb + 2)
        self.assertEqual(bm.full_q_num[0, 1, 0].item(), 6000 + kb)
        self.assertTrue(bm.has_backward)
        self.assertIn("for seq_q 250, seq_kv 600", repr(bm))
        raw.full_indices = base + n - 4  # runs past the buffer
        self.refuses(RuntimeError, r"the library's full_indices .* is not within the "
                     rf"{n}-byte buffer", flashjit.BlockMask._of_buffer, buf, raw, 250, 600)


if __name__ == "__main__":
    unittest.main()
