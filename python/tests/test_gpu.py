"""attention() on the GPU against torch.nn.functional.scaled_dot_product_attention
and a float32 reference: masks, GQA, layouts, strides, modifications, the
log-sum-exp, CUDA-graph capture, torch.compile, FP8 (sm_90a), threads, tuning.

Skipped (visibly) without PyTorch and a CUDA GPU."""
import math
import threading
import unittest

import fjtest
import flashjit
from fjtest import torch

if fjtest.HAS_TORCH:
    import torch.nn.functional as F


def reference(q, k, v, causal=None, scale=None, window=None, softcap=None, score=None,
              mask=None, sinks=None):
    """float32 attention in BHSD with GQA, flashjit's semantics (README:
    "Your own attention"): score(s, b, h, hkv, q, kv) and mask(...) are
    Python callables on broadcast index tensors; sinks (heads_q,) logits
    join each row's denominator.  Returns (out, lse); a row that sees no key
    gets 0 and -inf (the sink with sinks)."""
    b, hq, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    g = hq // hk
    kf = k.float().repeat_interleave(g, dim=1)
    vf = v.float().repeat_interleave(g, dim=1)
    s = (q.float() @ kf.transpose(-1, -2)) * (scale if scale else 1 / math.sqrt(d))
    dev = q.device
    bi = torch.arange(b, device=dev).view(b, 1, 1, 1)
    hi = torch.arange(hq, device=dev).view(1, hq, 1, 1)
    qi = torch.arange(sq, device=dev).view(1, 1, sq, 1)
    ki = torch.arange(sk, device=dev).view(1, 1, 1, sk)
    if score is not None:
        s = score(s, bi, hi, hi // g, qi, ki)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    keep = torch.ones_like(s, dtype=torch.bool)
    off = 0 if causal == "top_left" else sk - sq
    if causal:
        keep &= ki <= qi + off
    if window is not None:
        left, right = window
        if left >= 0:
            keep &= ki >= qi + off - left
        if right >= 0:
            keep &= ki <= qi + off + right
    if mask is not None:
        keep &= mask(bi, hi, hi // g, qi, ki)
    s = s.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        # The sink as one more column with no value row: in the sum, not in P V.
        col = sinks.float().view(1, hq, 1, 1).expand(b, hq, sq, 1)
        lse = torch.logsumexp(torch.cat([s, col], dim=-1), dim=-1)
        return torch.exp(s - lse.unsqueeze(-1)) @ vf, lse
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1).clamp(min=-1e30))
    p = torch.nan_to_num(p, nan=0.0)
    return p @ vf, lse


def sdpa(q, k, v, causal=None, scale=None):
    """PyTorch's SDPA in q's dtype, BHSD, GQA by enable_gqa."""
    mask, is_causal = None, False
    if causal == "top_left":
        is_causal = True
    elif causal == "bottom_right":
        sq, sk = q.shape[2], k.shape[2]
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                          scale=scale, enable_gqa=q.shape[1] != k.shape[1])


def op_args(q, k, v, extra, **opts):
    """The arguments of torch.ops.flashjit.attention(_lse) for a dense
    call of these options (flashjit._calls.Opts fields)."""
    from flashjit import _calls
    return (q, k, v, extra, _calls.encode(_calls.opts("dense", **opts)))


def randn(*shape, dtype=None, device="cuda"):
    return torch.randn(shape, dtype=dtype or torch.bfloat16, device=device)


@unittest.skipUnless(fjtest.HAS_CUDA, fjtest.NO_CUDA)
class GpuCase(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)

    def close(self, got, want, tol, what=""):
        err = (got.float() - want.float()).abs().max().item()
        self.assertLess(err, tol, f"{what}: max abs error {err:.3g} (limit {tol})")
        return err

    def against_sdpa(self, q, k, v, causal=None, scale=None, layout="bhsd", tol=None):
        out = flashjit.attention(q, k, v, causal=causal, scale=scale, layout=layout)
        if layout == "bshd":
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            out = out.transpose(1, 2)
        self.assertEqual(out.shape, q.shape)
        self.assertEqual(out.dtype, q.dtype)
        want, _ = reference(q, k, v, causal=causal, scale=scale)
        base = sdpa(q, k, v, causal=causal, scale=scale)
        tol = tol or (2e-2 if q.dtype == torch.bfloat16 else 4e-3)
        what = f"{tuple(q.shape)}/{tuple(k.shape)} {q.dtype} causal={causal}"
        self.close(out, want, tol, what + " vs float32")
        self.close(out, base, 2 * tol, what + " vs SDPA")
        err_fj = (out.float() - want).abs().mean().item()
        err_sdpa = (base.float() - want).abs().mean().item()
        self.assertLess(err_fj, 2 * err_sdpa + 1e-4, f"{what}: mean error {err_fj:.3g} "
                        f"against SDPA's {err_sdpa:.3g}")
        return out


class Masks(GpuCase):
    def test_none_top_left_bottom_right(self):
        for dtype in (torch.float16, torch.bfloat16):
            for d in (64, 128):
                for sq, sk in ((256, 256), (200, 333), (1, 300)):
                    for causal in (None, "top_left", "bottom_right"):
                        with self.subTest(dtype=dtype, d=d, sq=sq, sk=sk, causal=causal):
                            q = randn(2, 4, sq, d, dtype=dtype)
                            k, v = randn(2, 4, sk, d, dtype=dtype), randn(2, 4, sk, d,
                                                                          dtype=dtype)
                            self.against_sdpa(q, k, v, causal=causal)

    def test_causal_true_is_top_left(self):
        q, k, v = (randn(1, 2, 128, 64) for _ in range(3))
        a = flashjit.attention(q, k, v, causal=True)
        b = flashjit.attention(q, k, v, causal="top_left")
        self.assertTrue(torch.equal(a, b))

    def test_scale(self):
        q, k, v = (randn(1, 4, 256, 64, dtype=torch.float16) for _ in range(3))
        self.against_sdpa(q, k, v, scale=0.05)

    def test_long_prefill(self):
        q, k, v = (randn(1, 8, 2048, 128) for _ in range(3))
        self.against_sdpa(q, k, v, causal="top_left")

    def test_head_dims(self):
        for d in (32, 96, 160, 192, 256):
            with self.subTest(d=d):
                q, k, v = (randn(1, 2, 200, d) for _ in range(3))
                self.against_sdpa(q, k, v, causal="bottom_right")


class Shapes(GpuCase):
    def test_gqa_and_mqa(self):
        for hq, hk in ((8, 2), (32, 8), (8, 1)):
            with self.subTest(hq=hq, hk=hk):
                q = randn(2, hq, 300, 128)
                k, v = randn(2, hk, 500, 128), randn(2, hk, 500, 128)
                self.against_sdpa(q, k, v, causal="bottom_right")

    def test_head_dims_not_multiples_of_8(self):
        # attention() pads them with zero columns at the unpadded scale.
        for d, causal in ((100, "top_left"), (36, None), (250, "bottom_right")):
            with self.subTest(d=d, causal=causal):
                q, k, v = randn(2, 8, 300, d), randn(2, 2, 400, d), randn(2, 2, 400, d)
                out = self.against_sdpa(q, k, v, causal=causal)
                self.assertEqual(tuple(out.shape), (2, 8, 300, d))
        q, k, v = randn(1, 4, 200, 100), randn(1, 4, 200, 100), randn(1, 4, 200, 60)
        out, lse = flashjit.attention(q, k, v, causal=True, return_lse=True)
        want, want_lse = reference(q, k, v, causal="top_left")
        self.assertEqual(tuple(out.shape), (1, 4, 200, 60))
        self.close(out, want, 2e-2, "q/k 100, v 60")
        self.close(lse, want_lse, 1e-3, "q/k 100, v 60: lse")
        # attention_varlen pads alike: two packed sequences against the
        # float32 reference of each.
        q, k, v = randn(500, 4, 100), randn(700, 2, 100), randn(700, 2, 100)
        cq = torch.tensor([0, 200, 500], dtype=torch.int32, device="cuda")
        ck = torch.tensor([0, 300, 700], dtype=torch.int32, device="cuda")
        out = flashjit.attention_varlen(q, k, v, cq, ck, 300, 400, causal=True)
        self.assertEqual(tuple(out.shape), (500, 4, 100))
        for a, b, c, e in ((0, 200, 0, 300), (200, 500, 300, 700)):
            want, _ = reference(q[a:b].transpose(0, 1)[None], k[c:e].transpose(0, 1)[None],
                                v[c:e].transpose(0, 1)[None], causal="bottom_right")
            self.close(out[a:b].transpose(0, 1)[None], want, 2e-2, f"varlen rows {a}-{b}")

    def test_decode_split_kv(self):
        q = randn(4, 32, 1, 128)
        k, v = randn(4, 8, 4096, 128), randn(4, 8, 4096, 128)
        self.assertGreater(flashjit.plan(4, 32, 1, 128, heads_kv=8, seq_kv=4096,
                                         device=0).splits, 1)
        self.against_sdpa(q, k, v)

    def test_bshd(self):
        q = randn(2, 300, 8, 64)
        k, v = randn(2, 400, 2, 64), randn(2, 400, 2, 64)
        out = self.against_sdpa(q, k, v, causal="bottom_right", layout="bshd")
        self.assertEqual(tuple(out.shape), (2, 8, 300, 64))  # transposed back above

    def test_bshd_output_layout(self):
        q, k, v = (randn(1, 100, 4, 64) for _ in range(3))
        out = flashjit.attention(q, k, v, layout="bshd")
        self.assertEqual(tuple(out.shape), (1, 100, 4, 64))
        self.assertTrue(out.is_contiguous())

    def test_packed_qkv_strides(self):
        # One (batch, seq, 3, heads, dim) tensor: q, k and v are strided views.
        qkv = randn(2, 256, 3, 8, 64)
        q, k, v = qkv.unbind(2)
        self.assertFalse(q.is_contiguous())
        self.against_sdpa(q, k, v, causal="top_left", layout="bshd")

    def test_transposed_views(self):
        q, k, v = (randn(2, 256, 4, 64).transpose(1, 2) for _ in range(3))
        self.against_sdpa(q, k, v)

    def test_expanded_kv(self):
        k1, v1 = randn(1, 1, 256, 64), randn(1, 1, 256, 64)
        q = randn(3, 4, 128, 64)
        k, v = k1.expand(3, 4, 256, 64), v1.expand(3, 4, 256, 64)
        self.assertEqual(k.stride(0), 0)
        self.against_sdpa(q, k, v)

    @unittest.skipUnless(fjtest.HAS_CUDA and torch.cuda.get_device_capability() == (9, 0),
                         "split head dims run on the wgmma family (sm_90a)")
    def test_split_head_dims(self):
        # V and the output with a head dim of their own (MLA's 192/128).
        for d, dv, layout, causal in ((192, 128, "bhsd", "top_left"), (128, 64, "bshd", None),
                                      (64, 128, "bhsd", "bottom_right")):
            with self.subTest(d=d, dv=dv, layout=layout, causal=causal):
                q, k, v = randn(2, 8, 300, d), randn(2, 2, 333, d), randn(2, 2, 333, dv)
                want, want_lse = reference(q, k, v, causal=causal)
                if layout == "bshd":
                    q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
                with torch.no_grad():
                    out, lse = flashjit.attention(q, k, v, causal=causal, layout=layout,
                                                  return_lse=True)
                    again = flashjit.attention(q, k, v, causal=causal, layout=layout)
                self.assertEqual(tuple(out.shape), (*q.shape[:-1], dv))
                self.assertTrue(out.is_contiguous())
                self.assertTrue(torch.equal(out, again))  # the cached call
                if layout == "bshd":
                    out = out.transpose(1, 2)
                self.close(out, want, 2e-2, "out")
                self.close(lse, want_lse, 2e-3, "lse")
        q, k, v = (randn(1, 2, 64, n).requires_grad_() for n in (128, 128, 64))
        with self.assertRaisesRegex(flashjit.Unsupported, r"head_dim_v 64 with head_dim 128 "
                                    r"has no backward yet"):
            flashjit.attention(q, k, v)

    def test_empty(self):
        q = randn(0, 4, 16, 64)
        out, lse = flashjit.attention(q, q, q, return_lse=True)
        self.assertEqual(tuple(out.shape), (0, 4, 16, 64))
        self.assertEqual(tuple(lse.shape), (0, 4, 16))

    def test_device_of_output(self):
        q, k, v = (randn(1, 2, 64, 64) for _ in range(3))
        out = flashjit.attention(q, k, v)
        self.assertEqual(out.device, q.device)


class Lse(GpuCase):
    def test_lse(self):
        for causal in (None, "top_left", "bottom_right"):
            with self.subTest(causal=causal):
                q = randn(2, 8, 300, 128)
                k, v = randn(2, 4, 400, 128), randn(2, 4, 400, 128)
                out, lse = flashjit.attention(q, k, v, causal=causal, return_lse=True)
                want, want_lse = reference(q, k, v, causal=causal)
                self.assertEqual(tuple(lse.shape), (2, 8, 300))
                self.assertEqual(lse.dtype, torch.float32)
                self.close(out, want, 2e-2, "out")
                self.close(lse, want_lse, 2e-3, "lse")

    def test_row_without_keys(self):
        # bottom-right with more queries than keys: the first rows see nothing.
        q = randn(1, 2, 64, 64)
        k, v = randn(1, 2, 16, 64), randn(1, 2, 16, 64)
        out, lse = flashjit.attention(q, k, v, causal="bottom_right", return_lse=True)
        self.assertEqual(out[:, :, :48].abs().max().item(), 0.0)
        self.assertTrue(torch.isneginf(lse[:, :, :48]).all())
        want, _ = reference(q, k, v, causal="bottom_right")
        self.close(out, want, 2e-2, "rows with keys")


class Modifications(GpuCase):
    def test_window(self):
        for causal in (None, "top_left", "bottom_right"):
            with self.subTest(causal=causal):
                q = randn(1, 4, 512, 128)
                k, v = randn(1, 4, 700, 128), randn(1, 4, 700, 128)
                window = (64, 0) if causal else (64, 32)
                out = flashjit.attention(q, k, v, causal=causal, window=window)
                want, _ = reference(q, k, v, causal=causal, window=window)
                self.close(out, want, 2e-2, f"window {window}")

    def test_sinks(self):
        # Prefill (GQA 4:1) and decode (packed, split), a row that sees no
        # key (O 0, LSE the sink), and the checks of the tensor.
        sinks = torch.linspace(-3, 4, 8, device="cuda")
        for sq, causal in ((300, None), (300, "bottom_right"), (1, None), (600, "bottom_right")):
            with self.subTest(sq=sq, causal=causal):
                q = randn(2, 8, sq, 128)
                k, v = randn(2, 2, 4096 if sq == 1 else 500, 128), None
                v = randn(*k.shape)
                out, lse = flashjit.attention(q, k, v, causal=causal, sinks=sinks,
                                              return_lse=True)
                want, want_lse = reference(q, k, v, causal=causal, sinks=sinks)
                self.close(out, want, 2e-2, "out")
                self.close(lse, want_lse, 2e-3, "lse")
                if sq == 600:  # the first 100 rows see no key
                    self.assertEqual(out[:, :, :100].abs().max().item(), 0.0)
                    self.close(lse[:, :, :100], sinks.view(1, 8, 1).expand(2, 8, 100), 1e-5,
                               "lse of rows without keys")
        q, k, v = randn(1, 8, 16, 64), randn(1, 2, 16, 64), randn(1, 2, 16, 64)
        with self.assertRaisesRegex(TypeError, r"sinks has dtype torch.float16; it must be "
                                    r"torch.float32"):
            flashjit.attention(q, k, v, sinks=sinks.half())
        with self.assertRaisesRegex(ValueError, r"sinks has shape \(4,\); it must be \(8,\)"):
            flashjit.attention(q, k, v, sinks=sinks[:4])
        with self.assertRaisesRegex(ValueError, r"sinks is on cpu; the attention inputs are "
                                    r"on cuda"):
            flashjit.attention(q, k, v, sinks=sinks.cpu())
        with self.assertRaisesRegex(ValueError, r"sinks is not contiguous \(stride 2\)"):
            flashjit.attention(q, k, v, sinks=torch.zeros(16, device="cuda")[::2])
        with self.assertRaisesRegex(TypeError, r"sinks is a list, not a torch.Tensor"):
            flashjit.attention(q, k, v, sinks=[0.0] * 8)

    def test_softcap(self):
        # Scores large enough for the cap to bite; V scaled by 4 as well, so
        # the output's bf16 rounding is 4 times that of the other cases.
        q, k, v = (randn(2, 4, 300, 64) * 4 for _ in range(3))
        out = flashjit.attention(q, k, v, softcap=5.0, causal="top_left")
        want, _ = reference(q, k, v, softcap=5.0, causal="top_left")
        self.close(out, want, 8e-2, "softcap")

    def test_alibi_score_mod(self):
        q, k, v = (randn(1, 8, 256, 128) for _ in range(3))
        slopes = torch.tensor([2.0 ** -(i + 1) for i in range(8)], device="cuda")
        out = flashjit.attention(q, k, v, causal="top_left",
                                 score_mod="s + slopes(h) * (float)(kv - q)",
                                 params={"slopes": slopes})
        want, _ = reference(q, k, v, causal="top_left",
                            score=lambda s, b, h, hk, qi, ki: s + slopes.view(1, 8, 1, 1) *
                            (ki - qi).float())
        self.close(out, want, 2e-2, "alibi")

    def test_mask_mod_and_scalar_params(self):
        q, k, v = (randn(2, 4, 256, 64) for _ in range(3))
        out = flashjit.attention(q, k, v, mask_mod="(kv / block) <= (q / block) || kv < n",
                                 params={"block": 32, "n": 5})
        want, _ = reference(q, k, v, mask=lambda b, h, hk, qi, ki: ((ki // 32) <= (qi // 32))
                            | (ki < 5))
        self.close(out, want, 2e-2, "mask_mod")

    def test_bias_table(self):
        q, k, v = (randn(1, 4, 128, 64) for _ in range(3))
        bias = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
        out = flashjit.attention(q, k, v, score_mod="s + bias(h, q - kv + 128)",
                                 params={"bias": bias})
        want, _ = reference(q, k, v, score=lambda s, b, h, hk, qi, ki:
                            s + bias.float()[h, (qi - ki + 128).clamp(0, 255)])
        self.close(out, want, 2e-2, "bias table")

    def test_checked(self):
        # A table too short for q - kv + 128 (keys past 64 from the query
        # read below 0): checked mode names the tensor and the read; in
        # range, checked mode gives the unchecked result.
        q, k, v = (randn(1, 4, 128, 64) for _ in range(3))
        short = torch.randn(4, 100, device="cuda", dtype=torch.float32)
        with self.assertRaisesRegex(flashjit.InvalidArgument,
                                    r"checked mode: mods.params\[0\] \(bias\): read at "
                                    r"\(\d+, -?\d+\), outside its extents \(4, 100\)"):
            flashjit.attention(q, k, v, score_mod="s + bias(h, q - kv + 64)",
                               params={"bias": short}, checked=True)
        bias = torch.randn(4, 256, device="cuda", dtype=torch.float32)
        out = flashjit.attention(q, k, v, score_mod="s + bias(h, q - kv + 128)",
                                 params={"bias": bias}, checked=True)
        want, _ = reference(q, k, v, score=lambda s, b, h, hk, qi, ki:
                            s + bias[h, qi - ki + 128])
        self.close(out, want, 2e-2, "checked bias table")

    def test_param_errors(self):
        q, k, v = (randn(1, 4, 64, 64) for _ in range(3))
        with self.assertRaisesRegex(ValueError, r"params\['t'\] is not contiguous"):
            flashjit.attention(q, k, v, score_mod="s + t(h)",
                               params={"t": torch.zeros(4, 2, device="cuda")[:, 0]})
        with self.assertRaisesRegex(ValueError, r"params\['t'\] is on cpu"):
            flashjit.attention(q, k, v, score_mod="s + t(h)", params={"t": torch.zeros(4)})
        with self.assertRaisesRegex(TypeError, r"params\['t'\] has dtype torch.float64"):
            flashjit.attention(q, k, v, score_mod="s + t(h)",
                               params={"t": torch.zeros(4, dtype=torch.float64, device="cuda")})
        with self.assertRaisesRegex(TypeError, r"describes a tensor"):
            flashjit.attention(q, k, v, score_mod="s + t(h)", params={"t": ("f32", (4,))})
        with self.assertRaisesRegex(flashjit.InvalidArgument, r"mods.score: ';' at column"):
            flashjit.attention(q, k, v, score_mod="s;")



class Exact(GpuCase):
    """Issue 35, class 5: a row whose visible keys all have the same score
    (one key, two equal keys, every key equal) returns that V row exactly,
    in bf16 (torch.equal), with a softcap of 15 or 50 -- where the kernels
    take their exponentials against a fixed shift and round P to bf16, so
    the row sum must be of the rounded P (on 439ccd4 about 10% of the
    elements were a bf16 step off).  The library's choice of family for
    each: prefill (mma, or wgmma on sm_90a), the expression kernels
    (mask_mod), decode with GQA packing and split-KV."""

    CAPS = (15.0, 50.0)

    def inputs(self, b, hq, hk, sq, sk, d, pairs=False, equal=False):
        """q, k, v in bf16 with scores of a few units (P far below 1 under
        the fixed shift); pairs: keys 2i and 2i + 1 equal (K and V);
        equal: every key of a (batch, KV head) equal."""
        q = randn(b, hq, sq, d) * 2
        n = 1 if equal else sk // 2 if pairs else sk
        k, v = randn(b, hk, n, d) * 2, randn(b, hk, n, d) * 4
        if equal:
            k, v = k.expand(b, hk, sk, d).contiguous(), v.expand(b, hk, sk, d).contiguous()
        elif pairs:
            k, v = k.repeat_interleave(2, dim=2), v.repeat_interleave(2, dim=2)
        return q, k, v

    def exact(self, out, want, what):
        self.assertEqual(out.shape, want.shape, what)
        differ = (out != want).sum().item()
        self.assertTrue(torch.equal(out, want),
                        f"{what}: {differ} of {out.numel()} elements differ from V")

    def test_one_key(self):
        # A window (0, 0) on the diagonal (bottom-right without causal;
        # sq == sk puts it at q), the same with causal top_left, and
        # mask_mod "kv == q": row q sees key q alone.
        q, k, v = self.inputs(2, 4, 2, 256, 256, 128)
        want = v.repeat_interleave(2, dim=1)
        for cap in self.CAPS:
            for what, kw in (("window (0, 0)", dict(window=(0, 0))),
                             ("causal top_left, window (0, 0)",
                              dict(causal="top_left", window=(0, 0))),
                             ("mask_mod kv == q", dict(mask_mod="kv == q"))):
                with self.subTest(what=what, softcap=cap):
                    out = flashjit.attention(q, k, v, softcap=cap, **kw)
                    self.exact(out, want, f"one key ({what}), softcap {cap}")

    def test_one_key_decode(self):
        # One query a row over 4096 keys with a window (0, 0): the last key
        # alone (bottom-right), through the split-KV kernels and their
        # combine; and a single key in all.
        for sk in (4096, 1):
            q, k, v = self.inputs(2, 8, 2, 1, sk, 128)
            want = v[:, :, -1:].repeat_interleave(4, dim=1)
            for cap in self.CAPS:
                with self.subTest(seq_kv=sk, softcap=cap):
                    out = flashjit.attention(q, k, v, softcap=cap, window=(0, 0))
                    self.exact(out, want, f"decode, seq_kv {sk}, softcap {cap}")

    def test_two_equal_keys(self):
        # Keys equal in pairs and mask_mod "kv / 2 == q / 2": row q sees
        # its pair; every key equal and a window (1, 0): two keys a row
        # (row 0 one).
        q, k, v = self.inputs(2, 4, 2, 256, 256, 128, pairs=True)
        want = v.repeat_interleave(2, dim=1)
        for cap in self.CAPS:
            with self.subTest(softcap=cap, mask_mod="kv / 2 == q / 2"):
                out = flashjit.attention(q, k, v, softcap=cap, mask_mod="kv / 2 == q / 2")
                self.exact(out, want, f"two equal keys (mask_mod), softcap {cap}")
        q, k, v = self.inputs(2, 4, 2, 256, 256, 64, equal=True)
        want = v.repeat_interleave(2, dim=1)
        for cap in self.CAPS:
            with self.subTest(softcap=cap, window=(1, 0)):
                out = flashjit.attention(q, k, v, softcap=cap, window=(1, 0))
                self.exact(out, want, f"two equal keys (window (1, 0)), softcap {cap}")

    def test_all_keys_equal(self):
        # Every key equal: the mean of equal V rows is the row, whatever
        # the number of keys -- all of 512, 1 .. 256 (causal), and a
        # decode over 4096 (split-KV, GQA packed).
        for sq, sk, causal in ((256, 512, None), (256, 256, "top_left"), (1, 4096, None)):
            q, k, v = self.inputs(2, 8, 2, sq, sk, 128, equal=True)
            want = v[:, :, :sq].repeat_interleave(4, dim=1)
            for cap in self.CAPS:
                with self.subTest(seq_q=sq, seq_kv=sk, causal=causal, softcap=cap):
                    out = flashjit.attention(q, k, v, softcap=cap, causal=causal)
                    self.exact(out, want, f"all {sk} keys equal, seq_q {sq}, causal {causal}, "
                               f"softcap {cap}")

class LibraryErrors(GpuCase):
    def test_head_dim(self):
        q = randn(1, 2, 64, 584)
        with self.assertRaisesRegex(ValueError, r"head_dim 584 is invalid") as cm:
            flashjit.attention(q, q, q)
        self.assertIsInstance(cm.exception, flashjit.InvalidArgument)

    def test_misaligned(self):
        base = randn(1, 2, 64, 72)
        q = base[..., 1:65]  # 2-byte offset, rows of 72 elements
        with self.assertRaisesRegex(ValueError, r"align"):
            flashjit.attention(q, q, q)

    def test_zero_keys(self):
        q, k = randn(1, 2, 16, 64), randn(1, 2, 0, 64)
        with self.assertRaisesRegex(ValueError, r"seq_kv 0 is invalid"):
            flashjit.attention(q, k, k)

    @unittest.skipUnless(fjtest.HAS_CUDA and torch.cuda.device_count() > 1, "needs 2 GPUs")
    def test_two_devices(self):
        q = randn(1, 2, 16, 64)
        k = randn(1, 2, 16, 64, device="cuda:1")
        with self.assertRaisesRegex(ValueError, r"must be on one device"):
            flashjit.attention(q, k, k)


def doc_ids(lengths, device="cuda"):
    """int32 document ids per position: lengths[i] positions of document i."""
    ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    return ids.to(dtype=torch.int32, device=device)


def dense_lists(bm, keep):
    """keep (batch or 1, heads or 1, seq_q, seq_kv) bool, as bm's lists
    say: a partial block keeps what keep keeps, a full block all of it."""
    b, h, qb, kb = bm.shape
    sq, sk = keep.shape[-2:]
    out = torch.zeros((b, h, sq, sk), dtype=torch.bool, device=keep.device)
    lists = [t.cpu() for t in (bm.kv_num, bm.kv_indices)]
    full = [t.cpu() for t in (bm.full_num, bm.full_indices)] if bm.full_num is not None \
        else None
    for bi in range(b):
        for hi in range(h):
            src = keep[min(bi, keep.shape[0] - 1), min(hi, keep.shape[1] - 1)]
            for i in range(qb):
                rows = slice(i * bm.block_q, (i + 1) * bm.block_q)
                for (num, idx), whole in ((lists, False), (full, True)):
                    if num is None:
                        continue
                    for j in idx[bi, hi, i, :num[bi, hi, i]].tolist():
                        cols = slice(j * bm.block_kv, (j + 1) * bm.block_kv)
                        out[bi, hi, rows, cols] = True if whole else src[rows, cols]
    return out


class BlockMasks(GpuCase):
    """attention(..., block_mask=): built by flashjit.block_mask() from the
    mask, or the caller's own lists, against the same call without one, a
    float32 reference and SDPA with the dense boolean mask."""

    DOC = "doc(q) == doc(kv)"

    def check_lists(self, bm, builtin, user):
        """bm's lists against the dense masks (batch or 1, heads or 1,
        seq_q, seq_kv): the built-in rules' and the expression's.  Listed
        (in either list, once) exactly the blocks with a pair both keep;
        full only blocks where the expression keeps every pair the
        built-in rules keep."""
        keep, hidden = builtin & user, builtin & ~user
        b, h, qb, kb = bm.shape
        num, idx = bm.kv_num.cpu(), bm.kv_indices.cpu()
        fnum, fidx = bm.full_num.cpu(), bm.full_indices.cpu()
        for bi in range(b):
            for hi in range(h):
                k = keep[min(bi, keep.shape[0] - 1), min(hi, keep.shape[1] - 1)]
                x = hidden[min(bi, hidden.shape[0] - 1), min(hi, hidden.shape[1] - 1)]
                for i in range(qb):
                    rows = slice(i * bm.block_q, (i + 1) * bm.block_q)
                    part = idx[bi, hi, i, :num[bi, hi, i]].tolist()
                    full = fidx[bi, hi, i, :fnum[bi, hi, i]].tolist()
                    where = f"batch {bi} head {hi} query block {i}"
                    self.assertEqual(len(set(part + full)), len(part) + len(full),
                                     f"{where}: a block listed twice: {part} {full}")
                    want = {j for j in range(kb)
                            if k[rows, j * bm.block_kv:(j + 1) * bm.block_kv].any()}
                    self.assertEqual(set(part) | set(full), want, where)
                    for j in full:
                        self.assertFalse(x[rows, j * bm.block_kv:(j + 1) * bm.block_kv].any(),
                                         f"{where}: key block {j} is full but the "
                                         "expression hides a pair in it")

    def test_documents_causal(self):
        # Documents with causal: the block mask the library builds, against
        # the same call without one, float32 and SDPA's dense mask.
        for sq, lengths, blocks in ((1000, [300, 50, 400, 250], (128, 128)),
                                    (2048, [1000, 24, 1024], (128, 128)),
                                    (700, [64, 636], (64, 256))):
            with self.subTest(sq=sq, blocks=blocks):
                q, k, v = (randn(2, 8, sq, 128) for _ in range(3))
                doc = doc_ids(lengths)
                mods = dict(causal="top_left", mask_mod=self.DOC, params={"doc": doc})
                bm = flashjit.block_mask(q, k, block_q=blocks[0], block_kv=blocks[1], **mods)
                qb, kb = -(-sq // blocks[0]), -(-sq // blocks[1])
                self.assertEqual(bm.shape, (1, 1, qb, kb))  # reads neither b nor h
                self.assertEqual((bm.seq_q, bm.seq_kv, bm.device), (sq, sq, q.device))
                self.assertEqual((bm.block_q, bm.block_kv), blocks)
                causal = torch.ones(sq, sq, dtype=torch.bool, device="cuda").tril()
                same = doc[:, None] == doc[None, :]
                self.check_lists(bm, causal[None, None], same[None, None])
                out = flashjit.attention(q, k, v, block_mask=bm, **mods)
                plain = flashjit.attention(q, k, v, **mods)
                self.close(out, plain, 2e-2, "with and without the block mask")
                want, _ = reference(q, k, v, causal="top_left",
                                    mask=lambda b, h, hk, qi, ki: doc[qi] == doc[ki])
                self.close(out, want, 2e-2, "against float32")
                base = F.scaled_dot_product_attention(q, k, v, attn_mask=causal & same)
                self.close(out, base, 4e-2, "against SDPA with the dense mask")

    def test_batch_and_heads(self):
        # A mask that reads b and hkv gets a list per batch index and query
        # head; GQA 4:1, keys longer than queries.
        lim = torch.tensor([[100, 700], [0, 1500]], dtype=torch.int32, device="cuda")
        q = randn(2, 8, 300, 128)
        k, v = randn(2, 2, 1600, 128), randn(2, 2, 1600, 128)
        mods = dict(mask_mod="kv <= lim(b, hkv)", params={"lim": lim})
        bm = flashjit.block_mask(q, k, **mods)
        self.assertEqual(bm.shape, (2, 8, 3, 13))
        ki = torch.arange(1600, device="cuda").view(1, 1, 1, 1600)
        user = (ki <= lim.repeat_interleave(4, dim=1).view(2, 8, 1, 1)).expand(2, 8, 300, 1600)
        self.check_lists(bm, torch.ones_like(user), user)
        out, lse = flashjit.attention(q, k, v, block_mask=bm, return_lse=True, **mods)
        want, want_lse = reference(q, k, v, mask=lambda b, h, hk, qi, ki: ki <= lim[b, hk])
        self.close(out, want, 2e-2, "out")
        self.close(lse, want_lse, 2e-3, "lse")

    def test_window_decode(self):
        # A decode step (mma family, no split with a block mask): the
        # window's blocks only, all of them full.
        q = randn(4, 32, 1, 128)
        k, v = randn(4, 8, 4096, 128), randn(4, 8, 4096, 128)
        mods = dict(causal="bottom_right", window=(1023, 0))
        bm = flashjit.block_mask(q, k, **mods)
        self.assertEqual(bm.shape, (1, 1, 1, 32))
        self.assertEqual(bm.kv_num.flatten().tolist(), [0])
        self.assertEqual(bm.full_num.flatten().tolist(), [8])
        self.assertEqual(sorted(bm.full_indices[0, 0, 0, :8].tolist()), list(range(24, 32)))
        out = flashjit.attention(q, k, v, block_mask=bm, **mods)
        want, _ = reference(q, k, v, **mods)
        self.close(out, want, 2e-2, "window decode")

    def test_caller_lists(self):
        # The caller's own lists: each query block sees the key blocks
        # chosen at random per batch index and head, the diagonal always,
        # some partial (the expression applies), some full (it does not).
        b, h, sq, bq = 2, 4, 1000, 128
        nb = -(-sq // bq)
        g = torch.Generator().manual_seed(1)
        num, idx = torch.zeros(b, h, nb, dtype=torch.int32), torch.zeros(b, h, nb, nb,
                                                                         dtype=torch.int32)
        fnum, fidx = num.clone(), idx.clone()
        for bi in range(b):
            for hi in range(h):
                for i in range(nb):
                    pick = (torch.rand(nb, generator=g) < 0.4).tolist()
                    pick[i] = True
                    kind = (torch.rand(nb, generator=g) < 0.5).tolist()
                    part = [j for j in range(nb) if pick[j] and kind[j]]
                    full = [j for j in range(nb) if pick[j] and not kind[j]]
                    num[bi, hi, i], fnum[bi, hi, i] = len(part), len(full)
                    idx[bi, hi, i, :len(part)] = torch.tensor(part, dtype=torch.int32)
                    fidx[bi, hi, i, :len(full)] = torch.tensor(full, dtype=torch.int32)
        bm = flashjit.BlockMask(num.cuda(), idx.cuda(), fnum.cuda(), fidx.cuda())
        self.assertEqual((bm.shape, bm.seq_q), ((b, h, nb, nb), None))
        expr = "(q + 2 * kv) % 3 != 0 || q == kv"
        qi = torch.arange(sq, device="cuda").view(sq, 1)
        ki = torch.arange(sq, device="cuda").view(1, sq)
        user = ((qi + 2 * ki) % 3 != 0) | (qi == ki)
        keep = dense_lists(bm, user.expand(1, 1, sq, sq))
        self.assertTrue(keep.any(-1).all())  # every row sees its own key
        q, k, v = (randn(b, h, sq, 64, dtype=torch.float16) for _ in range(3))
        out = flashjit.attention(q, k, v, mask_mod=expr, block_mask=bm)
        want, _ = reference(q, k, v, mask=lambda *_: keep)
        self.close(out, want, 4e-3, "against float32")
        base = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        self.close(out, base, 8e-3, "against SDPA with the dense mask")
        # Lists with no expression: the listed blocks whole (the sequence
        # end still applies), here each query block and the one before it.
        fnum = torch.full((1, 1, nb), 2, dtype=torch.int32)
        fnum[0, 0, 0] = 1
        fidx = torch.zeros(1, 1, nb, nb, dtype=torch.int32)
        for i in range(nb):
            fidx[0, 0, i, :fnum[0, 0, i]] = torch.tensor([i, i - 1] if i else [0])
        local = flashjit.BlockMask(torch.zeros(1, 1, nb, dtype=torch.int32), fidx.clone(),
                                   fnum, fidx).to("cuda")
        blk = torch.arange(sq, device="cuda") // bq
        step = blk.view(sq, 1) - blk.view(1, sq)  # query block - key block
        near = (step == 0) | (step == 1)
        out = flashjit.attention(q, k, v, block_mask=local)
        base = F.scaled_dot_product_attention(q, k, v, attn_mask=near)
        self.close(out, base, 8e-3, "block-local lists against SDPA")
        self.assertTrue(torch.equal(dense_lists(local, torch.ones(1, 1, sq, sq, dtype=torch.bool,
                                                                   device="cuda"))[0, 0], near))

    def test_from_flex(self):
        try:
            from torch.nn.attention.flex_attention import create_block_mask
        except ImportError:
            self.skipTest("no FlexAttention in this PyTorch")
        doc = doc_ids([500, 200, 324])

        def mask(b, h, qi, ki):
            return (doc[qi] == doc[ki]) & (ki <= qi)

        fm = create_block_mask(mask, None, None, 1024, 1024, device="cuda")
        bm = flashjit.BlockMask.from_flex(fm)
        q, k, v = (randn(1, 4, 1024, 128) for _ in range(3))
        mods = dict(causal="top_left", mask_mod=self.DOC, params={"doc": doc})
        out = flashjit.attention(q, k, v, block_mask=bm, **mods)
        self.close(out, flashjit.attention(q, k, v, **mods), 2e-2, "FlexAttention's lists")

    def test_graph_and_compile(self):
        q, k, v = (randn(1, 8, 1000, 128) for _ in range(3))
        doc = doc_ids([600, 400])
        mods = dict(causal="top_left", mask_mod=self.DOC, params={"doc": doc})
        bm = flashjit.block_mask(q, k, **mods)

        def f(a, b, c):
            return flashjit.attention(a, b, c, block_mask=bm, **mods)

        want = f(q, k, v)
        got = torch.compile(f, fullgraph=True)(q, k, v)
        self.close(got, want, 1e-3, "torch.compile")
        g, out = Graphs.capture(self, f, (q, k, v))
        q.copy_(randn(1, 8, 1000, 128))
        g.replay()
        torch.cuda.synchronize()
        self.close(out, f(q, k, v), 1e-3, "graph replay")
        lists = [t for t in bm._tensors() if t is not None]
        args = op_args(q, k, v, [doc] + lists, causal=1, mask_mod=self.DOC,
                       params=(("doc", "t", None),), block_q=bm.block_q, block_kv=bm.block_kv,
                       roles=("param:doc", "kv_num", "kv_indices", "full_num",
                              "full_indices")[:1 + len(lists)])
        torch.library.opcheck(torch.ops.flashjit.attention.default, args,
                              test_utils=("test_schema", "test_faketensor"))

    def test_errors(self):
        q, k, v = (randn(1, 2, 300, 64) for _ in range(3))
        bm = flashjit.block_mask(q, k, causal="top_left")
        self.assertEqual(bm.shape, (1, 1, 3, 3))
        with self.assertRaisesRegex(ValueError, r"block_mask is 3 x 3 blocks of 128 x 128; "
                                    r"seq_q 300 and seq_kv 400 need 3 x 4"):
            flashjit.attention(q, randn(1, 2, 400, 64), randn(1, 2, 400, 64), block_mask=bm)
        with self.assertRaisesRegex(ValueError, r"block_mask is on cpu; the attention inputs "
                                    r"are on cuda:0"):
            flashjit.attention(q, k, v, block_mask=bm.to("cpu"))
        with self.assertRaisesRegex(TypeError, r"block_mask is a tuple"):
            flashjit.attention(q, k, v, block_mask=(128, 128))
        with self.assertRaisesRegex(flashjit.InvalidArgument, r"mods.mask: 'doc' at column 1"):
            flashjit.block_mask(q, k, mask_mod=self.DOC)


class Graphs(GpuCase):
    def capture(self, fn, inputs):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                fn(*inputs)  # compile, probe layouts, grow nothing during capture
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = fn(*inputs)
        return g, out

    def test_replay(self):
        for shape_q, shape_kv, causal in (((2, 8, 256, 128), (2, 2, 256, 128), "top_left"),
                                          ((8, 32, 1, 128), (8, 8, 2048, 128), None)):
            with self.subTest(q=shape_q, kv=shape_kv):
                q, k, v = randn(*shape_q), randn(*shape_kv), randn(*shape_kv)
                g, out = self.capture(lambda a, b, c: flashjit.attention(
                    a, b, c, causal=causal, return_lse=True), (q, k, v))
                for _ in range(2):
                    q.copy_(randn(*shape_q))
                    k.copy_(randn(*shape_kv))
                    v.copy_(randn(*shape_kv))
                    g.replay()
                    torch.cuda.synchronize()
                    want, want_lse = reference(q, k, v, causal=causal)
                    self.close(out[0], want, 2e-2, "graph replay")
                    self.close(out[1], want_lse, 2e-3, "graph replay lse")


class Compile(GpuCase):
    def test_torch_compile(self):
        def block(q, k, v):
            o = flashjit.attention(q, k, v, causal="top_left")
            return o * 2 + 1

        compiled = torch.compile(block, fullgraph=True)
        q = randn(2, 8, 256, 64)
        k, v = randn(2, 4, 256, 64), randn(2, 4, 256, 64)
        got = compiled(q, k, v)
        want, _ = reference(q, k, v, causal="top_left")
        self.close(got, want * 2 + 1, 5e-2, "torch.compile")

    def test_compile_with_mods_and_lse(self):
        slopes = torch.rand(8, device="cuda")

        def f(q, k, v):
            return flashjit.attention(q, k, v, causal="bottom_right", return_lse=True,
                                      window=(64, 0), score_mod="s + slopes(h)",
                                      params={"slopes": slopes, "n": 3})

        q, k, v = (randn(1, 8, 200, 128) for _ in range(3))
        out, lse = torch.compile(f, fullgraph=True)(q, k, v)
        want, want_lse = reference(q, k, v, causal="bottom_right", window=(64, 0),
                                   score=lambda s, b, h, hk, qi, ki:
                                   s + slopes.view(1, 8, 1, 1))
        self.close(out, want, 2e-2, "compiled mods")
        self.close(lse, want_lse, 2e-3, "compiled lse")

    def test_opcheck(self):
        q = randn(1, 4, 128, 64)
        args = op_args(q, q.clone(), q.clone(), [], causal=1)
        torch.library.opcheck(torch.ops.flashjit.attention_lse.default, args,
                              test_utils=("test_schema", "test_faketensor"))
        torch.library.opcheck(torch.ops.flashjit.attention.default, args,
                              test_utils=("test_schema", "test_faketensor"))


class CachedCalls(GpuCase):
    """The cached call (flashjit/_calls.py, issue 37): a call that finds its
    entry, the op a compiled graph calls, and torch.compile's graphs --
    CUDA graphs included -- give the bits of a first call, which checks and
    plans."""

    def cases(self):
        q, k, v = randn(2, 8, 256, 64), randn(2, 2, 256, 64), randn(2, 2, 256, 64)
        qs, ks, vs = randn(2, 300, 12, 128).split([8, 2, 2], dim=2)
        sinks = torch.randn(8, device="cuda")
        decode = (randn(4, 32, 1, 128), randn(4, 8, 4096, 128), randn(4, 8, 4096, 128))
        return [("plain", (q, k, v), {}),
                ("causal, lse", (q, k, v), dict(causal="top_left", return_lse=True)),
                ("bshd views of one tensor", (qs, ks, vs), dict(layout="bshd", causal=True)),
                ("window, softcap, sinks", (q, k, v), dict(window=(64, 0), causal=True,
                                                           softcap=30.0, sinks=sinks)),
                ("expression with a tensor", (q, k, v), dict(score_mod="s + t(h)",
                                                             params={"t": sinks})),
                ("split decode (workspace)", decode, {})]

    def fresh(self):
        from flashjit import _calls
        _calls.tables.plain.clear()
        _calls.tables.calls.clear()

    def same(self, got, want, what):
        for g, w in zip(got if isinstance(got, tuple) else (got,),
                        want if isinstance(want, tuple) else (want,)):
            self.assertTrue(torch.equal(g, w), what)

    def test_repeat_op_and_compile_are_bitwise(self):
        for name, t, kw in self.cases():
            with self.subTest(name):
                self.fresh()
                first = flashjit.attention(*t, **kw)
                self.same(flashjit.attention(*t, **kw), first, "the call again")
                torch._dynamo.reset()
                compiled = torch.compile(lambda *a: flashjit.attention(*a, **kw),
                                         fullgraph=True)
                self.same(compiled(*t), first, "torch.compile")
                # Other tensors of the same signature: the entry, their own pointers.
                t2 = tuple(x * 0.5 for x in t)
                hit = flashjit.attention(*t2, **kw)
                self.fresh()
                self.same(hit, flashjit.attention(*t2, **kw), "other tensors")

    def test_reduce_overhead(self):
        for name, t, kw in self.cases():
            if kw.get("return_lse") or "params" in kw:
                continue
            with self.subTest(name):
                torch._dynamo.reset()
                ins = tuple(x.contiguous() if x.dim() else x for x in t)

                def f(q, k, v):
                    return flashjit.attention(q, k, v, **kw) * 2

                g = torch.compile(f, mode="reduce-overhead", fullgraph=True)
                for i in range(4):  # warm-up, recording, then replays
                    for x in ins:
                        x.copy_(torch.randn_like(x))
                    got = g(*ins).clone()
                    self.same(got, f(*ins), f"call {i}")

    def test_backward_again(self):
        q, k, v = (randn(1, 4, 256, 64).requires_grad_() for _ in range(3))
        dout = randn(1, 4, 256, 64)
        grads = []
        for _ in range(2):
            out = flashjit.attention(q, k, v, causal="top_left")
            grads.append(torch.autograd.grad(out, (q, k, v), dout))
        self.close(grads[1][0], grads[0][0], 1e-3, "dq")
        self.same(grads[1][1:], grads[0][1:], "dk, dv")


class Backward(GpuCase):
    """loss.backward() through flashjit.attention against autograd through
    the float32 reference on the same inputs."""

    def grads(self, q, k, v, sinks=None, lse_weight=0.0, ref_kw=None, **kw):
        """lse_weight: the loss adds sum(w * lse) with w random times it
        (the gradient through the returned lse; rows must see a key)."""
        dout = torch.randn_like(q)
        w = torch.randn(q.shape[:3], device=q.device) * lse_weight
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        s_leaf = sinks.detach().clone().requires_grad_() if sinks is not None else None
        out, lse = flashjit.attention(*leaves, sinks=s_leaf, return_lse=True, **kw)
        loss = (out.float() * dout.float()).sum()
        (loss + (lse * w).sum() if lse_weight else loss).backward()
        got = [t.grad for t in leaves] + ([s_leaf.grad] if sinks is not None else [])
        ref_leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
        rs = sinks.detach().float().requires_grad_() if sinks is not None else None
        want_out, want_lse = reference(*ref_leaves, sinks=rs, **(ref_kw or kw))
        loss = (want_out * dout.float()).sum()
        (loss + (want_lse * w).sum() if lse_weight else loss).backward()
        want = [t.grad for t in ref_leaves] + ([rs.grad] if sinks is not None else [])
        return got, want

    def rel(self, got, want, what, tol):
        err = ((got.float() - want).norm() / want.norm().clamp(min=1e-30)).item()
        self.assertLess(err, tol, f"{what}: relative error {err:.3g} (limit {tol})")
        return err

    def check(self, q, k, v, tol=3e-2, **kw):
        got, want = self.grads(q, k, v, **kw)
        for name, g, w in zip(("dq", "dk", "dv", "dsinks"), got, want):
            self.assertEqual(g.shape, w.shape, name)
            self.rel(g, w, f"{name} {tuple(q.shape)}/{tuple(k.shape)} {kw}", tol)

    def test_masks_and_dims(self):
        for d in (64, 128):
            for causal in (None, "top_left"):
                self.check(randn(2, 4, 200, d), randn(2, 4, 200, d), randn(2, 4, 200, d),
                           causal=causal)
        q = randn(1, 4, 100, 64, dtype=torch.float16)
        k, v = randn(1, 4, 257, 64, dtype=torch.float16), randn(1, 4, 257, 64, dtype=torch.float16)
        self.check(q, k, v, causal="bottom_right", tol=1e-2)

    def test_head_dim_not_multiple_of_8(self):
        # The pad's gradient: autograd slices it off.
        self.check(randn(2, 4, 200, 100), randn(2, 2, 200, 100), randn(2, 2, 200, 100),
                   causal="top_left")

    def test_gqa_window_softcap_sinks(self):
        q, k, v = randn(1, 8, 300, 64), randn(1, 2, 300, 64), randn(1, 2, 300, 64)
        self.check(q, k, v, causal="top_left", window=(64, 0))
        self.check(q, k, v, softcap=20.0)
        self.check(q, k, v, causal="top_left", sinks=torch.randn(8, device="cuda"))

    def test_lse_in_the_loss(self):
        """A loss of O and the returned lse (fj_problem.dlse), on both
        wgmma kernels, with GQA, sinks, a softcap and an expression."""
        for d, causal in ((64, None), (128, "top_left"), (256, "top_left")):
            self.check(randn(2, 4, 200, d), randn(2, 2, 200, d), randn(2, 2, 200, d),
                       causal=causal, lse_weight=3.0)
        q, k, v = randn(1, 8, 300, 64), randn(1, 2, 300, 64), randn(1, 2, 300, 64)
        self.check(q, k, v, causal="top_left", sinks=torch.randn(8, device="cuda"),
                   lse_weight=3.0)
        self.check(q, k, v, softcap=20.0, lse_weight=3.0)
        self.check(q, k, v, score_mod="s * 0.5f", lse_weight=3.0,
                   ref_kw=dict(score=lambda s, b, h, hk, qi, ki: s * 0.5))

    def test_parts_merged(self):
        """Two calls over parts of the keys, merged by flashjit.merge, train
        as one call over all of them: the gradients go through each part's
        out and lse (fj_problem.dlse) and the merge's backward."""
        q, k, v = randn(1, 4, 256, 64), randn(1, 4, 512, 64), randn(1, 4, 512, 64)
        dout = torch.randn_like(q)

        def grads(split):
            leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
            if split:
                parts = [flashjit.attention(leaves[0], leaves[1][:, :, r], leaves[2][:, :, r],
                                            return_lse=True)
                         for r in (slice(0, 200), slice(200, 512))]
                out, _ = flashjit.merge([p[0] for p in parts], [p[1] for p in parts])
            else:
                out = flashjit.attention(*leaves)
            (out.float() * dout.float()).sum().backward()
            return [t.grad for t in leaves]

        for name, x, y in zip(("dq", "dk", "dv"), grads(True), grads(False)):
            self.rel(x, y.float(), name, 2e-2)

    def test_bshd_and_views(self):
        x = randn(2, 128, 3, 4, 64)  # packed qkv: (batch, seq, 3, heads, d)
        q, k, v = x.unbind(2)
        got, want = self.grads(*(t.transpose(1, 2) for t in (q, k, v)), causal="top_left")
        for name, g, w in zip(("dq", "dk", "dv"), got, want):
            self.rel(g, w, name, 3e-2)

    def test_compile_no_graph_break(self):
        q, k, v = (randn(1, 4, 128, 64).requires_grad_() for _ in range(3))

        def step(q, k, v):
            return flashjit.attention(q, k, v, causal="top_left").float().square().sum()

        loss = torch.compile(step, fullgraph=True)(q, k, v)
        loss.backward()
        want = [t.grad.clone() for t in (q, k, v)]
        for t in (q, k, v):
            t.grad = None
        step(q, k, v).backward()
        for g, w in zip((q.grad, k.grad, v.grad), want):
            self.rel(w, g.float(), "compiled backward", 1e-2)

    def test_expressions(self):
        # score_mod and mask_mod: the gradients of q, k, v and of the float
        # params that require grad against autograd through the float32
        # reference of the same expressions.  A backward of this kind (as
        # FlashAttention's, cuDNN's and FlexAttention's) takes each row's
        # Delta = rowsum(dO o O) from the forward's 16-bit O, and a sum over
        # positions such as ALiBi's slope gradient cancels to a small value
        # next to that rounding (about 12% in bf16 at 256 keys); so the
        # reference's loss adds sum((Delta - Delta16) * LSE), whose
        # gradient is exactly that difference (dLSE/ds = P), and the test
        # measures the kernels' own error.
        q, k, v = randn(1, 4, 200, 64), randn(1, 2, 260, 64), randn(1, 2, 260, 64)
        dout = torch.randn_like(q)
        base = {"slopes": torch.rand(4, device="cuda") * 0.3,
                "table": torch.randn(4, 512, device="cuda") * 0.5}
        doc = (torch.arange(260, device="cuda") // 37).int()
        cases = [
            ("s + slopes(h) * (float)(kv - q)", None, ("slopes",),
             lambda s, P, h, qi, ki: s + P["slopes"][h] * (ki - qi)),
            ("20.0f * tanhf(s / 20.0f)", None, (),
             lambda s, P, h, qi, ki: 20 * torch.tanh(s / 20)),
            ("s * (1.0f + slopes(h)) + table(h, q - kv + 256)", "doc(q) == doc(kv)",
             ("slopes", "table"),
             lambda s, P, h, qi, ki: s * (1 + P["slopes"][h]) + P["table"][h, qi - ki + 256]),
        ]
        for score, mask, used, fn in cases:
            leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
            params = {n: t.clone().requires_grad_() for n, t in base.items()}
            out = flashjit.attention(*leaves, score_mod=score, mask_mod=mask,
                                     params={**params, "doc": doc})
            (out.float() * dout.float()).sum().backward()
            ref = [t.detach().float().requires_grad_() for t in (q, k, v)]
            rp = {n: t.clone().requires_grad_() for n, t in base.items()}
            want_out, want_lse = reference(
                *ref, score=lambda s, b, h, hk, qi, ki: fn(s, rp, h, qi, ki),
                mask=(lambda b, h, hk, qi, ki: doc[qi] == doc[ki]) if mask else None)
            delta = (want_out.detach() * dout.float()).sum(-1)
            delta16 = (out.detach().float() * dout.float()).sum(-1)
            shift = ((delta - delta16) * torch.where(torch.isfinite(want_lse), want_lse,
                                                     torch.zeros_like(want_lse))).sum()
            ((want_out * dout.float()).sum() + shift).backward()
            for name, g, w in zip(("dq", "dk", "dv"), leaves, ref):
                self.rel(g.grad, w.grad, f"{name} {score}", 3e-2)
            for n in used:
                self.rel(params[n].grad, rp[n].grad, f"d{n} {score}", 3e-2)


def is_sm90():
    return fjtest.HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)


def fp8_inputs(b, hq, hk, sq, sk, d, layout="bhsd"):
    """(q, k, v) in e4m3 spread over its range, and their descales
    (batch, heads_kv), none all 1: the dequantised values are about
    N(0, 1)."""
    def one(h, s):
        shape = (b, h, s, d) if layout == "bhsd" else (b, s, h, d)
        x = randn(*shape, dtype=torch.float32) * 32
        return x.clamp(-448, 448).to(torch.float8_e4m3fn)
    descales = [(torch.rand(b, hk, device="cuda") + 0.5) / 32 for _ in range(3)]
    return (one(hq, sq), one(hk, sk), one(hk, sk)), descales


def dequantised(t, descale, layout="bhsd"):
    """t (in layout) times its (batch, KV head) descale, as float32 BHSD."""
    t = t.float() if layout == "bhsd" else t.float().transpose(1, 2)
    b, h = t.shape[:2]
    g = h // descale.shape[1]
    return t * descale.repeat_interleave(g, dim=1).view(b, h, 1, 1)


@unittest.skipUnless(is_sm90(), "checked on sm_90a (H100/H200)")
class Fp8KV(GpuCase):
    """An FP8 KV cache's k and v (torch.float8_e4m3fn, descales per (batch,
    KV head) or one in all) under a bfloat16 or float16 q, through
    attention(): O in q's dtype, against a float32 reference of the
    dequantised k and v."""

    def test_against_float32(self):
        for dtype, d, causal, layout in ((torch.bfloat16, 128, "top_left", "bhsd"),
                                         (torch.float16, 64, None, "bshd"),
                                         (torch.bfloat16, 256, "bottom_right", "bhsd")):
            with self.subTest(dtype=dtype, d=d, causal=causal, layout=layout):
                (_, k, v), ds = fp8_inputs(2, 8, 2, 300, 700, d, layout)
                shape = (2, 8, 300, d) if layout == "bhsd" else (2, 300, 8, d)
                q = randn(*shape, dtype=dtype)
                out = flashjit.attention(q, k, v, causal=causal, layout=layout,
                                         k_descale=ds[1], v_descale=ds[2])
                self.assertEqual((out.dtype, out.shape), (dtype, q.shape))
                qf = q.float() if layout == "bhsd" else q.float().transpose(1, 2)
                want, _ = reference(qf, dequantised(k, ds[1], layout),
                                    dequantised(v, ds[2], layout), causal=causal)
                got = out.float() if layout == "bhsd" else out.float().transpose(1, 2)
                err = ((got - want).norm() / want.norm()).item()
                self.assertLess(err, 2e-2, f"relative error {err:.3g}")
        # One descale for each tensor: the same as that value everywhere.
        (_, k, v), _ = fp8_inputs(1, 4, 4, 128, 128, 128)
        q = randn(1, 4, 128, 128, dtype=torch.bfloat16)
        one = torch.full((), 0.03, device="cuda")
        a = flashjit.attention(q, k, v, k_descale=one, v_descale=one)
        b = flashjit.attention(q, k, v, k_descale=one.expand(1, 4).contiguous(),
                               v_descale=one.expand(1, 4).contiguous())
        self.assertTrue(torch.equal(a, b))


@unittest.skipUnless(is_sm90(), "FP8 attention runs on sm_90a (H100/H200)")
class Fp8(GpuCase):
    """FP8 attention (q, k, v torch.float8_e4m3fn, descales per (batch, KV
    head), O bfloat16) against a float32 reference of the dequantised
    inputs."""

    def rel(self, got, want, what, tol=5e-2):
        err = ((got.float() - want).norm() / want.norm()).item()
        self.assertLess(err, tol, f"{what}: relative error {err:.3g} (limit {tol})")
        return err

    def check(self, b, hq, hk, sq, sk, d, layout="bhsd", lse=False, ref_mask=None, **kw):
        """kw: attention()'s; causal, scale, window and sinks go to the
        reference too, ref_mask is the reference's form of a mask_mod."""
        (q, k, v), ds = fp8_inputs(b, hq, hk, sq, sk, d, layout)
        got = flashjit.attention(q, k, v, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2],
                                 layout=layout, return_lse=lse, **kw)
        out = got[0] if lse else got
        self.assertEqual(out.dtype, torch.bfloat16)
        self.assertEqual(out.shape, q.shape)
        if layout == "bshd":
            out = out.transpose(1, 2)
        ref_kw = {n: kw[n] for n in ("causal", "scale", "window", "sinks") if n in kw}
        want, want_lse = reference(dequantised(q, ds[0], layout), dequantised(k, ds[1], layout),
                                   dequantised(v, ds[2], layout), mask=ref_mask, **ref_kw)
        what = f"FP8 {(b, hq, hk, sq, sk, d)} {layout} {sorted(kw)}"
        self.rel(out, want, what)
        if lse:
            self.close(got[1], want_lse, 2e-2, what + " lse")

    def test_against_float32(self):
        for d in (64, 128, 192, 256):  # FP8's head dims (96 is refused: test_refusals)
            for causal in (None, "top_left", "bottom_right"):
                with self.subTest(d=d, causal=causal):
                    self.check(2, 8, 2, 300, 700, d, causal=causal)  # GQA, tails

    def test_layouts_lse_scale(self):
        self.check(2, 8, 8, 256, 256, 128, layout="bshd", causal="top_left", lse=True)
        self.check(1, 16, 4, 512, 512, 128, lse=True, scale=0.05)

    def test_window_sinks_mask(self):
        self.check(1, 8, 2, 400, 400, 128, causal="top_left", window=(128, 0))
        self.check(1, 8, 2, 400, 400, 128, sinks=torch.randn(8, device="cuda"))
        self.check(1, 8, 2, 400, 400, 128, mask_mod="kv % 3 != 1",
                   ref_mask=lambda b, h, hk, qi, ki: ki % 3 != 1)

    def test_ones_by_default(self):
        (q, k, v), _ = fp8_inputs(2, 4, 4, 128, 128, 128)
        ones = torch.ones(2, 4, device="cuda")
        a = flashjit.attention(q, k, v, causal="top_left")
        b = flashjit.attention(q, k, v, causal="top_left", q_descale=ones, k_descale=ones,
                               v_descale=ones)
        self.assertTrue(torch.equal(a, b))

    def test_out_dtypes_and_amax(self):
        # FP8 attention's O in f16 and e4m3 (times o_scale) and its amax,
        # against the same kernel's bf16 O: the values before rounding are
        # the same, so the amax is within half a bf16 step of the bf16 O's
        # largest and the same bits whatever O's element, the f16 O within
        # a bf16 step, the e4m3 O e4m3(O_bf16 x 8) or a neighbour.
        (q, k, v), ds = fp8_inputs(2, 8, 2, 300, 700, 128)
        kw = dict(causal="bottom_right", q_descale=ds[0], k_descale=ds[1], v_descale=ds[2])
        ref, amax = flashjit.attention(q, k, v, return_amax=True, **kw)
        self.assertEqual((ref.dtype, amax.shape, amax.dtype), (torch.bfloat16, (), torch.float32))
        big = ref.float().abs().max().item()
        self.assertLessEqual(abs(amax.item() - big), big / 256)
        f16 = flashjit.attention(q, k, v, out_dtype=torch.float16, **kw)
        self.assertEqual(f16.dtype, torch.float16)
        torch.testing.assert_close(f16.float(), ref.float(), rtol=1 / 128, atol=1e-6)
        scale = torch.tensor([8.0], device="cuda")
        o8, lse, amax8 = flashjit.attention(q, k, v, out_dtype=torch.float8_e4m3fn, o_scale=scale,
                                            return_lse=True, return_amax=True, **kw)
        self.assertEqual(o8.dtype, torch.float8_e4m3fn)
        self.assertTrue(torch.equal(amax8, amax))
        # e4m3(bf16 O x 8), but for the other neighbour where the bf16
        # rounding put the value on an e4m3 midpoint (ties to even there;
        # the kernel rounds once).
        x = ref.float() * 8
        want = x.to(torch.float8_e4m3fn)
        gb, wb = o8.view(torch.uint8).int(), want.view(torch.uint8).int()
        tie = ((gb - wb).abs() == 1) & ((o8.float() - x).abs() == (want.float() - x).abs())
        self.assertFalse(torch.any((gb != wb) & ~tie).item())
        # Under torch.compile: the amax op, the same bytes.
        f = torch.compile(lambda a, b, c: flashjit.attention(
            a, b, c, out_dtype=torch.float8_e4m3fn, o_scale=scale, return_amax=True, **kw),
            fullgraph=True)
        c8, camax = f(q, k, v)
        self.assertTrue(torch.equal(c8.view(torch.uint8), o8.view(torch.uint8)))
        self.assertTrue(torch.equal(camax, amax))

    def test_tune(self):
        # FP8 attention tuned from Python: fj_tune's own inputs and
        # descales; every candidate that ran agreed with the default.
        r = flashjit.tune(1, 8, 2048, 128, dtype="e4m3", causal="top_left", iters=3,
                          warmup=1, save=False, progress=False)
        self.assertGreater(r.timed, 0)
        self.assertEqual((r.wrong, r.failed), (0, 0))
        self.assertIn("_e4m3", r.name)

    def test_per_tensor_descales(self):
        # One descale a tensor (scale_layout FJ_SCALE_PER_TENSOR), as a
        # 0-dim tensor and as vLLM's expand(): the same bits as the same
        # values per (batch, KV head), and the reference's result.
        (q, k, v), _ = fp8_inputs(2, 8, 2, 300, 700, 128)
        one = [torch.tensor(s, device="cuda") for s in (0.03125, 0.0234375, 0.046875)]
        heads = [t.expand(2, 2).contiguous() for t in one]
        expanded = [t.reshape(1).expand(2, 2) for t in one]
        want = flashjit.attention(q, k, v, causal="bottom_right", q_descale=heads[0],
                                  k_descale=heads[1], v_descale=heads[2])
        for ds in (one, expanded):
            got = flashjit.attention(q, k, v, causal="bottom_right", q_descale=ds[0],
                                     k_descale=ds[1], v_descale=ds[2])
            self.assertTrue(torch.equal(got, want), f"strides {ds[0].stride()}")
        ref, _ = reference(dequantised(q, heads[0]), dequantised(k, heads[1]),
                           dequantised(v, heads[2]), causal="bottom_right")
        self.rel(want, ref, "FP8 per-tensor descales")

    def test_compile(self):
        (q, k, v), ds = fp8_inputs(2, 8, 2, 256, 256, 128)

        def f(q, k, v, a, b, c):
            return flashjit.attention(q, k, v, causal="top_left", q_descale=a, k_descale=b,
                                      v_descale=c) * 2

        got = torch.compile(f, fullgraph=True)(q, k, v, *ds)
        self.assertEqual(got.dtype, torch.bfloat16)
        self.assertTrue(torch.equal(got, f(q, k, v, *ds)))
        q1 = q[:1, :2, :128].contiguous()
        args = op_args(q1, q1.clone(), q1.clone(), [ds[0][:1].contiguous()], causal=1,
                       roles=("q_descale",))
        # test_schema multiplies the inputs, which PyTorch does not do in
        # float8_e4m3fn ("mul_cuda" not implemented): the fake tensor check only.
        torch.library.opcheck(torch.ops.flashjit.attention.default, args,
                              test_utils=("test_faketensor",))

    def test_refusals(self):
        (q, k, v), ds = fp8_inputs(1, 4, 4, 128, 128, 128)
        # A 16-bit q over FP8 k and v is the KV cache's call (Fp8KV), forward
        # only as FP8 attention is.
        with self.assertRaisesRegex(flashjit.Unsupported, r"^flashjit.attention: torch.bfloat16 "
                                    r"q over FP8 k and v runs forward only: q requires grad"):
            flashjit.attention(q.to(torch.bfloat16).requires_grad_(), k, v,
                               k_descale=ds[1], v_descale=ds[2])
        with self.assertRaisesRegex(flashjit.Unsupported, r"^flashjit.attention: FP8 "
                                    r"attention runs forward only: k_descale requires grad"):
            flashjit.attention(q, k, v, k_descale=ds[1].requires_grad_())
        with torch.no_grad():  # no grad, no refusal
            flashjit.attention(q, k, v, k_descale=ds[1])
        # The library's own refusals come through as they are.
        (q96, k96, v96), _ = fp8_inputs(1, 4, 4, 128, 128, 96)
        with self.assertRaisesRegex(flashjit.Unsupported, r"head_dim 96 with dtype e4m3 is not "
                                    r"implemented: 64, 128, 192 or 256"):
            flashjit.attention(q96, k96, v96)
        (q256, k256, v256), _ = fp8_inputs(1, 4, 4, 128, 128, 256)
        for kw in (dict(softcap=30.0), dict(score_mod="s * 0.5f")):
            with self.subTest(**kw), self.assertRaisesRegex(
                    flashjit.Unsupported, r"^dtype e4m3 with a score expression or softcap "
                    r"at head_dim 256 is not implemented: up to 128"):
                flashjit.attention(q256, k256, v256, **kw)

    def test_requires_grad_q(self):
        (q, k, v), _ = fp8_inputs(1, 4, 4, 128, 128, 128)
        try:
            q.requires_grad_()
        except RuntimeError as e:  # this PyTorch keeps FP8 tensors out of autograd
            self.skipTest(str(e))
        with self.assertRaisesRegex(flashjit.Unsupported, r"^flashjit.attention: FP8 "
                                    r"attention runs forward only: q requires grad"):
            flashjit.attention(q, k, v)


@unittest.skipUnless(fjtest.HAS_CUDA and not is_sm90(), "needs a GPU other than sm_90")
class Fp8Elsewhere(GpuCase):
    def test_refused(self):
        q = torch.zeros(1, 2, 64, 128, device="cuda").to(torch.float8_e4m3fn)
        with self.assertRaisesRegex(flashjit.Unsupported, r"mma wgmma .* needs sm_90a"):
            flashjit.attention(q, q, q)


class Threads(GpuCase):
    def test_concurrent_calls(self):
        q, k, v = (randn(2, 8, 256, 64) for _ in range(3))
        want = flashjit.attention(q, k, v, causal="top_left")
        torch.cuda.synchronize()
        errors, results = [], []

        def work():
            try:
                s = torch.cuda.Stream()
                with torch.cuda.stream(s):
                    for _ in range(20):
                        out = flashjit.attention(q, k, v, causal="top_left")
                    s.synchronize()
                results.append(out)
            except Exception as e:  # reported below, in the test's thread
                errors.append(e)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        for out in results:
            self.assertTrue(torch.equal(out, want))


class Inspection(GpuCase):
    def test_device_info_and_layout(self):
        info = flashjit.device_info()
        self.assertGreater(info["sm_count"], 0)
        lut = flashjit.layout("mma_acc_f16")
        self.assertIn(lut.origin, ("probed", "cached"))
        self.assertEqual(lut.map, flashjit.layout("mma_acc_f16", arch=info["arch"]).map)

    def test_plan_on_device(self):
        p = flashjit.plan(1, 32, 1, 128, heads_kv=8, seq_kv=4096, device=0)
        self.assertEqual(p.sm_count, torch.cuda.get_device_properties(0).multi_processor_count)

    def test_kernel_on_device(self):
        k = flashjit.Kernel(64, device=0, dtype="f16")
        self.assertEqual(k.arch, flashjit.device_info(0)["arch"])

    def test_tune(self):
        seen = []
        r = flashjit.tune(1, 8, 512, 64, dtype="f16", iters=2, warmup=1, save=False,
                          progress=lambda done, total: seen.append((done, total)))
        self.assertGreater(r.candidates, 0)
        self.assertGreater(r.timed, 0)
        self.assertGreater(r.best_ms, 0)
        self.assertTrue(r.name.startswith("fj_attn_d64_"), r.name)
        self.assertTrue(seen and seen[-1][0] == seen[-1][1], seen[-3:])

    def test_tune_split_head_dims(self):
        """MLA's prefill head dims (192 / 128) tune as a class of their
        own: the winner's name carries _v128."""
        if flashjit.device_info(0)["arch"] != "sm_90a":
            self.skipTest("split head dims tune on sm_90a's wgmma family")
        r = flashjit.tune(1, 4, 512, 192, head_dim_v=128, dtype="bf16", causal="top_left",
                          iters=2, warmup=1, save=False, progress=False)
        self.assertGreater(r.timed, 0)
        self.assertIn("_v128", r.name)


if __name__ == "__main__":
    unittest.main()
