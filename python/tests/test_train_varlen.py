"""Training through flashjit.attention_varlen: packed sequences'
gradients.

On the CPU (PyTorch, any build; the GPU stubbed as in test_calls.py, the
training ops given CPU kernels that run their own Python bodies): the
problems the forward and the backward hand the library (lengths, totals,
masks, sinks, the deterministic switch), the gradients' shapes and their
zeroed rows, the op's fake implementations, AOTAutograd's backward graph
and torch.compile(fullgraph=True) with .backward(), the refusals (FP8,
expressions; the KV cache's is in test_calls), the gradient through the
log-sum-exp in the library's layout.

On the GPU: q.grad, k.grad, v.grad (and sinks.grad) of packed sequences
of uneven lengths (1, 17, 0 among them) against each sequence's float32
autograd reference: causal top-left and bottom-right with Sq != Skv,
GQA 4:1, a window, a softcap, sinks, seqused_k, bf16 and f16; the
deterministic mode's bits over runs; torch.compile(fullgraph=True); a
CUDA graph of forward and backward replayed after new lengths.

Each skips, saying why, where PyTorch or a GPU is missing."""
import inspect
import unittest
from unittest import mock

import fjtest
import flashjit
from fjtest import torch
from test_calls import Stubbed
from test_gpu import GpuCase, reference
from test_train import DeterministicState, bwd_argument

if fjtest.HAS_TORCH:
    from flashjit import _calls as calls
    from flashjit import _capi as capi
    from flashjit import _serving as sv
    from flashjit import _torch as fjt
    from flashjit import _train as tr

BF16 = torch.bfloat16 if fjtest.HAS_TORCH else None
BR = "bottom_right"


def starts(lengths):
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def cpu_kernels(test):
    """CPU kernels for the training ops and the forward op: their own
    Python bodies, which reach the stubbed launches (Stubbed)."""
    lib = torch.library.Library("flashjit", "IMPL")
    test.addCleanup(lib._destroy)
    lib.impl("attention_train", tr._attention_train, "CPU")
    lib.impl("attention_bwd", tr._attention_bwd, "CPU")
    lib.impl("attention_train_mods", tr._attention_train_mods, "CPU")
    lib.impl("attention_bwd_mods", tr._attention_bwd_mods, "CPU")
    lib.impl("attention", fjt._op, "CPU")
    lib.impl("attention_lse", fjt._op_lse, "CPU")


@unittest.skipUnless(fjtest.HAS_TORCH, fjtest.NO_TORCH)
class VarlenGradPlumbing(Stubbed, DeterministicState):
    """CPU tensors through attention_varlen with grad, the launches
    recorded (test_calls.Stubbed)."""

    def setUp(self):
        super().setUp()
        cpu_kernels(self)

    def inputs(self, lengths=(0, 30, 70, 1, 0), hq=8, hk=2, d=64, lengths_k=None):
        lengths_k = lengths_k or lengths
        cu_q = torch.tensor(starts(lengths), dtype=torch.int32)
        cu_k = torch.tensor(starts(lengths_k), dtype=torch.int32)
        q = torch.randn(sum(lengths), hq, d, dtype=BF16, requires_grad=True)
        k, v = (torch.randn(sum(lengths_k), hk, d, dtype=BF16, requires_grad=True)
                for _ in range(2))
        return q, k, v, cu_q, cu_k

    def launched(self, name):
        return [(a, p) for n, a, p in self.rec.calls if n == name]

    def test_forward_and_backward_problems(self):
        q, k, v, cu_q, cu_k = self.inputs(lengths_k=(5, 40, 90, 17, 3))
        sinks = torch.randn(8, requires_grad=True)
        used = torch.tensor([5, 20, 90, 0, 3], dtype=torch.int32)
        out, lse = flashjit.attention_varlen(q, k, v, cu_q, cu_k, 70, 90, seqused_k=used,
                                             causal="top_left", window=(32, 0), softcap=30.0,
                                             sinks=sinks, scale=0.25, return_lse=True)
        self.assertEqual((out.shape, lse.shape), (q.shape, (8, 101)))
        self.assertTrue(out.requires_grad)
        (args, fwd), = self.launched("fwd")
        self.assertEqual((fwd.batch, fwd.seq_q, fwd.seq_kv, fwd.total_q, fwd.total_kv),
                         (5, 70, 90, 101, 155))
        self.assertEqual((fwd.cu_seqlens_q, fwd.cu_seqlens_kv, fwd.seqused_kv),
                         (cu_q.data_ptr(), cu_k.data_ptr(), used.data_ptr()))
        lse_ptr = args[6]  # the library's log-sum-exp, kept for the backward
        self.assertNotEqual(lse_ptr, None)
        (out.float().sum() * 2).backward()
        (args, bwd), = self.launched("bwd")
        self.assertEqual(args[7], lse_ptr)
        # The backward's problem is the forward's, and reads what it saved.
        for field in ("batch", "heads_q", "heads_kv", "seq_q", "seq_kv", "head_dim", "dtype",
                      "causal", "scale", "total_q", "total_kv", "cu_seqlens_q",
                      "cu_seqlens_kv", "seqused_kv"):
            self.assertEqual(getattr(bwd, field), getattr(fwd, field), field)
        self.assertEqual((bwd.causal, bwd.scale, bwd.deterministic),
                         (capi.CAUSAL_TOP_LEFT, 0.25, 0))
        self.assertEqual((list(bwd.q_stride), list(bwd.o_stride)), ([0, 64, 512], [0, 64, 512]))
        mods = capi.Mods.from_address(bwd.mods)
        self.assertEqual((mods.window_left, mods.window_right, mods.softcap, mods.sinks),
                         (32, 0, 30.0, sinks.data_ptr()))
        self.assertEqual(args[2:5], (q.data_ptr(), k.data_ptr(), v.data_ptr()))
        for t in (q, k, v):
            self.assertEqual((t.grad.shape, t.grad.dtype), (t.shape, t.dtype))
            # Nothing ran: the gradients are the zeros they start as (rows
            # the kernels do not write stay 0).
            self.assertFalse(t.grad.any().item())
        self.assertNotIn(args[11], (None, 0))  # dsinks
        self.assertEqual((sinks.grad.shape, sinks.grad.dtype), ((8,), torch.float32))

    def test_deterministic_switch(self):
        self.keep_deterministic_state()
        q, k, v, cu_q, cu_k = self.inputs()
        for det in (False, True, True, False):
            torch.use_deterministic_algorithms(det)
            flashjit.attention_varlen(q, k, v, cu_q, cu_k, 70, 70).sum().backward()
            self.assertEqual(self.launched("bwd")[-1][1].deterministic, int(det))
        # One backward entry a mode, and the first forward's plan of its
        # backward (the one it compiles ahead).
        self.assertEqual(calls.counts["bwd_plans"], 3)

    def test_causal_default_and_gqa(self):
        q, k, v, cu_q, cu_k = self.inputs(hq=8, hk=2)
        flashjit.attention_varlen(q, k, v, cu_q, cu_k, 70, 70, causal=True).sum().backward()
        p = self.launched("bwd")[-1][1]
        self.assertEqual((p.causal, p.heads_q, p.heads_kv, p.mods),
                         (capi.CAUSAL_BOTTOM_RIGHT, 8, 2, None))
        self.assertEqual((k.grad.shape, v.grad.shape), (k.shape, v.shape))

    def test_only_some_inputs_require_grad(self):
        q, k, v, cu_q, cu_k = self.inputs()
        k, v = k.detach(), v.detach()
        flashjit.attention_varlen(q, k, v, cu_q, cu_k, 70, 70).sum().backward()
        self.assertEqual((q.grad.shape, k.grad, v.grad), (q.shape, None, None))

    def test_views_read_in_place(self):
        # Packed qkv (total, 3, heads, d): views whose rows are not dense,
        # read where they are; their gradients views of one zeroed buffer
        # laid out as x (the gaps of each are the others' rows).
        x = torch.randn(101, 3, 4, 64, dtype=BF16, requires_grad=True)
        cu = torch.tensor(starts((0, 30, 70, 1, 0)), dtype=torch.int32)
        q, k, v = x.unbind(1)
        flashjit.attention_varlen(q, k, v, cu, cu, 70, 70).sum().backward()
        args, p = self.launched("bwd")[-1]
        self.assertEqual(list(p.q_stride), [0, 64, 768])
        self.assertEqual(args[2:5], (q.data_ptr(), k.data_ptr(), v.data_ptr()))
        dq, dk, dv = args[8:11]
        self.assertEqual((dk - dq, dv - dq), (k.data_ptr() - q.data_ptr(),
                                              v.data_ptr() - q.data_ptr()))
        self.assertEqual(x.grad.shape, x.shape)

    def test_empty_batch(self):
        # No query rows: nothing runs, the gradients are zeros.
        q, k, v, cu_q, cu_k = self.inputs(lengths=(0, 0), lengths_k=(3, 4))
        out = flashjit.attention_varlen(q, k, v, cu_q, cu_k, 4, 4)
        out.sum().backward()
        self.assertEqual(self.launches(), 0)
        self.assertEqual((q.grad.shape, k.grad.shape), ((0, 8, 64), (7, 2, 64)))
        self.assertFalse(k.grad.any().item())

    def test_lse_gradient(self):
        """The packed lse's gradient reaches the backward in the library's
        layout (batch, heads_q, max_seqlen_q): token t of sequence b at
        t - cu_seqlens_q[b], 0 past each sequence's end."""
        q, k, v, cu_q, cu_k = self.inputs()  # lengths 0, 30, 70, 1, 0
        _, lse = flashjit.attention_varlen(q, k, v, cu_q, cu_k, 70, 70, return_lse=True)
        self.assertEqual(lse.shape, (8, 101))
        w = torch.randn(lse.shape)
        (lse * w).sum().backward()
        want = torch.zeros(5, 8, 70)
        want[1, :, :30] = w[:, :30]
        want[2, :, :70] = w[:, 30:100]
        want[3, :, 0] = w[:, 100]
        self.assertTrue(torch.equal(self.rec.dlse[-1], want))
        self.assertEqual(q.grad.shape, q.shape)

    def test_lse_of_tokens_no_sequence_holds(self):
        """Packed rows past cu_seqlens_q[-1] and past max_seqlen_q: lse
        -inf, and their gradient reaches no row."""
        q, k, v, cu_q, cu_k = self.inputs(lengths=(30, 50))  # 80 rows
        cu_q = torch.tensor([0, 30, 75], dtype=torch.int32)  # sequence 1: 45 rows, 5 past
        _, lse = flashjit.attention_varlen(q, k, v, cu_q, cu_k, 40, 50, return_lse=True)
        self.assertEqual(lse.shape, (8, 80))
        self.assertTrue(bool((lse[:, 70:] == float("-inf")).all()))  # past 40 of 1, past 75
        lse.sum().backward()
        want = torch.zeros(2, 8, 40)
        want[0, :, :30] = 1
        want[1, :, :40] = 1
        self.assertTrue(torch.equal(self.rec.dlse[-1], want))

    def test_expressions(self):
        """score_mod, mask_mod and params through the expressions' training
        ops: the backward's problem is the packed one (lengths, totals,
        the library's lse, zeroed gradients) with the forward's mods, and a
        tensor param that requires grad gets its gradient."""
        q, k, v, cu_q, cu_k = self.inputs(hq=8, hk=2)
        table = torch.randn(8, requires_grad=True)
        out, lse = flashjit.attention_varlen(q, k, v, cu_q, cu_k, 70, 70, causal=True,
                                             score_mod="s + t(h) * 0.5f", mask_mod="kv >= q - 9",
                                             params={"t": table}, return_lse=True)
        self.assertEqual((out.shape, lse.shape), (q.shape, (8, 101)))
        w = torch.randn(lse.shape)
        (out.float().sum() + (lse * w).sum()).backward()
        (fa, pf), (ba, pb) = self.launched("fwd")[-1], self.launched("bwd")[-1]
        for p in (pf, pb):
            self.assertEqual((p.batch, p.seq_q, p.total_q, p.total_kv, p.causal),
                             (5, 70, 101, 101, capi.CAUSAL_BOTTOM_RIGHT))
            self.assertEqual((p.cu_seqlens_q, p.cu_seqlens_kv), (cu_q.data_ptr(), cu_k.data_ptr()))
            m = capi.Mods.from_address(p.mods)
            self.assertEqual((m.score, m.mask), (b"s + t(h) * 0.5f", b"kv >= q - 9"))
        self.assertEqual(ba[7], fa[6])  # the forward's lse (the library's) is the backward's
        self.assertIsNotNone(capi.Mods.from_address(pb.mods).param_grads)
        want = torch.zeros(5, 8, 70)
        want[1, :, :30], want[2, :, :70], want[3, :, 0] = w[:, :30], w[:, 30:100], w[:, 100]
        self.assertTrue(torch.equal(self.rec.dlse[-1], want))
        self.assertEqual((q.grad.shape, k.grad.shape, table.grad.shape),
                         (q.shape, k.shape, table.shape))

    def test_refusals(self):
        q, k, v, cu_q, cu_k = self.inputs()
        f8 = k.detach().to(torch.float8_e4m3fn)
        with self.assertRaisesRegex(flashjit.Unsupported, r"^flashjit.attention_varlen: FP8 k "
                                    r"and v run forward only: q requires grad"):
            flashjit.attention_varlen(q, f8, f8, cu_q, cu_k, 70, 70)
        with torch.no_grad():  # forward only: the cached call
            flashjit.attention_varlen(q, k, v, cu_q, cu_k, 70, 70)
        self.assertEqual(len(self.launched("bwd")), 0)

    def test_compiled_backward(self):
        """torch.compile(fullgraph=True) of attention_varlen and a loss,
        then .backward(): one graph, the training op forward and the
        backward op with the mode (aot_eager: no code generation)."""
        self.keep_deterministic_state()
        torch._dynamo.reset()
        self.addCleanup(torch._dynamo.reset)
        q, k, v, cu_q, cu_k = self.inputs()
        sinks = torch.randn(8, requires_grad=True)

        def step(q, k, v, cu_q, cu_k, sinks):
            out, lse = flashjit.attention_varlen(q, k, v, cu_q, cu_k, 70, 70, causal=True,
                                                 sinks=sinks, return_lse=True)
            return out.float().square().sum() + lse.detach().sum()

        compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
        for det in (False, True):
            torch.use_deterministic_algorithms(det)
            compiled(q, k, v, cu_q, cu_k, sinks).backward()
            p = self.launched("bwd")[-1][1]
            self.assertEqual((p.deterministic, p.total_q, p.causal),
                             (int(det), 101, capi.CAUSAL_BOTTOM_RIGHT))
            self.assertEqual(sinks.grad.shape, (8,))


    def test_compiled_backward_expressions(self):
        """As test_compiled_backward, with a score expression and a loss of
        the lse: the expressions' ops traced (their fake implementations
        on packed q) and the backward run."""
        torch._dynamo.reset()
        self.addCleanup(torch._dynamo.reset)
        q, k, v, cu_q, cu_k = self.inputs()

        def step(q, k, v, cu_q, cu_k):
            out, lse = flashjit.attention_varlen(q, k, v, cu_q, cu_k, 70, 70, causal=True,
                                                 score_mod="s * 0.5f", return_lse=True)
            return out.float().square().sum() + lse.sum()

        torch.compile(step, backend="aot_eager", fullgraph=True)(q, k, v, cu_q, cu_k).backward()
        p = self.launched("bwd")[-1][1]
        self.assertEqual((p.total_q, capi.Mods.from_address(p.mods).score),
                         (101, b"s * 0.5f"))
        self.assertEqual(q.grad.shape, q.shape)

@unittest.skipUnless(fjtest.HAS_TORCH, fjtest.NO_TORCH)
class VarlenOps(unittest.TestCase, DeterministicState):
    """The training ops' varlen schema and fake implementations, and the
    backward graph AOTAutograd traces (meta tensors)."""

    def test_schemas(self):
        train = torch.ops.flashjit.attention_train.default._schema
        bwd = torch.ops.flashjit.attention_bwd.default._schema
        for schema in (train, bwd):
            self.assertIn("Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, Tensor? "
                          "seqused_k=None, SymInt max_seqlen_q=0, SymInt max_seqlen_k=0",
                          str(schema))
        # The dense call's arguments come first, as they were.
        self.assertEqual([a.name for a in bwd.arguments][12:14], ["sinks", "deterministic"])

    def test_fake_shapes(self):
        m = dict(device="meta")
        q = torch.empty(1000, 8, 128, dtype=BF16, **m)
        k = torch.empty(3000, 2, 128, dtype=BF16, **m)
        cu = torch.empty(5, dtype=torch.int32, **m)
        out, lse = tr.attention_train_op(q, k, k, None, capi.CAUSAL_BOTTOM_RIGHT, 0.0,
                                         capi.THD, -1, -1, 0.0, cu, cu, None, 300, 900)
        self.assertEqual((out.shape, out.dtype, lse.shape, lse.dtype),
                         (q.shape, BF16, (4, 8, 300), torch.float32))
        sinks = torch.empty(8, **m)
        grads = tr.attention_bwd_op(out, q, k, k, out, lse, capi.CAUSAL_BOTTOM_RIGHT, 0.0,
                                    capi.THD, -1, -1, 0.0, sinks, True, cu, cu, None, 300, 900)
        self.assertEqual([g.shape for g in grads], [q.shape, k.shape, k.shape, (8,)])

    def test_fake_shapes_expressions(self):
        """The expressions' ops on packed (3-d) q: the forward's lse the
        library's, the backward's gradients q's, k's, v's and the sinks'."""
        m = dict(device="meta")
        q = torch.empty(100, 8, 64, dtype=BF16, **m)
        k = torch.empty(120, 2, 64, dtype=BF16, **m)
        cu = torch.empty(4, dtype=torch.int32, **m)
        sinks = torch.empty(8, **m)
        o, extras = sv._options(sv._VARLEN, "varlen", None, None, None, None, "s * 0.5f", None,
                                None, sinks, (None, None), 0, ("cu_seqlens_q", "cu_seqlens_k"),
                                (cu, cu), layout=capi.THD, max_seqlen_q=64, max_seqlen_k=64)
        opts = calls.encode(o)
        out, lse = tr.attention_train_mods_op(q, k, k, list(extras), opts)
        self.assertEqual((out.shape, lse.shape), (q.shape, (3, 8, 64)))
        grads = tr.attention_bwd_mods_op(out, q, k, k, out, lse, list(extras), opts, False, 0,
                                         lse)
        self.assertEqual([g.shape for g in grads], [q.shape, k.shape, k.shape, (8,), (0,)])

    def test_mismatched_lengths_refused(self):
        q = torch.empty(10, 2, 64, dtype=BF16, device="meta")
        cu = torch.empty(3, dtype=torch.int32, device="meta")
        with self.assertRaisesRegex(ValueError, r"cu_seqlens_q and cu_seqlens_k go together"):
            tr._train_opts(None, 0, 0.0, capi.THD, -1, -1, 0.0, cu, None)
        tr._train_opts(None, 0, 0.0, capi.THD, -1, -1, 0.0, cu, cu)
        del q

    def test_traced_backward_shows_the_mode(self):
        try:
            from functorch.compile import aot_function, make_boxed_func
        except ImportError:
            self.skipTest("no functorch.compile.aot_function in this PyTorch")
        self.keep_deterministic_state()
        graphs = []

        def keep(gm, example_inputs):
            graphs.append(gm)
            return make_boxed_func(gm.forward)

        def f(q, k, v, cu):
            out, _ = tr.attention_train_op(q, k, v, None, capi.CAUSAL_BOTTOM_RIGHT, 0.0,
                                           capi.THD, -1, -1, 0.0, cu, cu, None, 64, 64)
            return out

        m = dict(dtype=BF16, device="meta", requires_grad=True)
        for det in (False, True):
            torch.use_deterministic_algorithms(det)
            q = torch.empty(100, 8, 64, **m)
            k, v = (torch.empty(100, 2, 64, **m) for _ in range(2))
            cu = torch.empty(4, dtype=torch.int32, device="meta")
            graphs.clear()
            aot_function(f, fw_compiler=lambda gm, _: make_boxed_func(gm.forward),
                         bw_compiler=keep)(q, k, v, cu).sum().backward()
            self.assertEqual([t.grad.shape for t in (q, k, v)], [q.shape, k.shape, v.shape])
            nodes = [n for n in graphs[-1].graph.nodes
                     if n.target is torch.ops.flashjit.attention_bwd.default]
            self.assertEqual(len(nodes), 1, graphs[-1].code)
            self.assertIs(bwd_argument(nodes[0], "deterministic"), det, graphs[-1].code)
            self.assertEqual((bwd_argument(nodes[0], "layout"),
                              bwd_argument(nodes[0], "max_seqlen_q")), (capi.THD, 64))


# ---- the GPU ------------------------------------------------------------------------


def randn(*shape, dtype=None):
    return torch.randn(shape, dtype=dtype or BF16, device="cuda")


def int32(values):
    return torch.tensor(values, dtype=torch.int32, device="cuda")


class VarlenBackward(GpuCase, DeterministicState):
    """loss.backward() through attention_varlen against autograd through
    each sequence's float32 reference (test_gpu.reference) on the same
    inputs."""

    def case(self, lens_q, lens_k, hq=4, hk=4, d=64, dtype=None, sinks=False, used=None,
             **kw):
        """Packed inputs of these lengths, and a dO: (q, k, v, sinks, dout,
        cu_q, cu_k, seqused_k)."""
        q = randn(sum(lens_q), hq, d, dtype=dtype)
        k, v = randn(sum(lens_k), hk, d, dtype=dtype), randn(sum(lens_k), hk, d, dtype=dtype)
        s = torch.randn(hq, device="cuda") if sinks else None
        return (q, k, v, s, torch.randn_like(q), int32(starts(lens_q)), int32(starts(lens_k)),
                None if used is None else int32(used))

    def grads(self, q, k, v, sinks, dout, cu_q, cu_k, used, max_q, max_k, **kw):
        """flashjit's (dq, dk, dv[, dsinks]) of sum(out * dout)."""
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        s = None if sinks is None else sinks.detach().clone().requires_grad_()
        out = flashjit.attention_varlen(*leaves, cu_q, cu_k, max_q, max_k, seqused_k=used,
                                        sinks=s, **kw)
        (out.float() * dout.float()).sum().backward()
        return [t.grad for t in leaves] + ([] if s is None else [s.grad])

    def want(self, q, k, v, sinks, dout, lens_q, lens_k, used, causal=None, **kw):
        """The reference's gradients, sequence by sequence (keys past
        seqused_k get none)."""
        causal = "bottom_right" if causal is True else causal
        leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
        s = None if sinks is None else sinks.detach().float().requires_grad_()
        loss = 0.0
        sq, sk = starts(lens_q), starts(lens_k)
        for b in range(len(lens_q)):
            n_k = lens_k[b] if used is None else used[b]
            if lens_q[b] == 0:
                continue
            part = [t[lo:lo + n].transpose(0, 1)[None] for t, lo, n in (
                (leaves[0], sq[b], lens_q[b]), (leaves[1], sk[b], n_k), (leaves[2], sk[b], n_k))]
            out, _ = reference(*part, causal=causal, sinks=s, **kw)
            loss = loss + (out[0].transpose(0, 1) * dout[sq[b]:sq[b + 1]].float()).sum()
        loss.backward()
        return [t.grad if t.grad is not None else torch.zeros_like(t)
                for t in leaves] + ([] if s is None else [s.grad])

    def rel(self, got, want, what, tol):
        err = ((got.float() - want).norm() / want.norm().clamp(min=1e-30)).item()
        self.assertFalse(got.isnan().any().item(), f"{what}: NaN")
        self.assertLess(err, tol, f"{what}: relative error {err:.3g} (limit {tol})")
        return err

    def check(self, lens_q, lens_k=None, max_q=None, max_k=None, tol=3e-2, hq=4, hk=4, d=64,
              dtype=None, sinks=False, used=None, ref=None, **kw):
        """ref: the reference's arguments in place of kw's score_mod and
        mask_mod (its Python callables)."""
        lens_k = lens_k or lens_q
        t = self.case(lens_q, lens_k, hq, hk, d, dtype, sinks, used)
        max_q, max_k = max_q or max(lens_q), max_k or max(lens_k)
        got = self.grads(*t, max_q, max_k, **kw)
        rkw = {n: x for n, x in kw.items() if n not in ("score_mod", "mask_mod")}
        want = self.want(*t[:5], lens_q, lens_k, used, **rkw, **(ref or {}))
        what = f"{lens_q}/{lens_k} h{hq}/{hk} d{d} {dtype or BF16} {kw}"
        for name, g, w in zip(("dq", "dk", "dv", "dsinks"), got, want):
            self.assertEqual(g.shape, w.shape, name)
            self.rel(g, w, f"{name} {what}", tol)

    def test_uneven_lengths(self):
        lens = [1, 17, 0, 200, 64, 129]
        for causal in (None, "top_left", True):
            with self.subTest(causal=causal):
                self.check(lens, causal=causal)

    def test_causal_alignments_sq_ne_skv(self):
        lens_q, lens_k = [1, 17, 100, 0, 50], [30, 17, 250, 7, 1]
        for dtype in (torch.bfloat16, torch.float16):
            for causal in ("top_left", "bottom_right"):
                with self.subTest(dtype=dtype, causal=causal):
                    self.check(lens_q, lens_k, dtype=dtype, causal=causal,
                               tol=3e-2 if dtype == torch.bfloat16 else 1e-2)
                    self.check(lens_k, lens_q, dtype=dtype, causal=causal,
                               tol=3e-2 if dtype == torch.bfloat16 else 1e-2)

    def test_gqa_window_softcap_sinks_scale(self):
        lens = [1, 17, 300, 0, 90]
        for d in (64, 128):
            with self.subTest(d=d):
                self.check(lens, hq=8, hk=2, d=d, causal=True)
                self.check(lens, hq=8, hk=2, d=d, causal="top_left", window=(32, 0))
                self.check(lens, hq=8, hk=2, d=d, window=(16, 16))
                self.check(lens, hq=8, hk=2, d=d, softcap=20.0)
                self.check(lens, hq=8, hk=2, d=d, causal=True, sinks=True)
                self.check(lens, hq=8, hk=2, d=d, scale=0.05, dtype=torch.float16, tol=1e-2)

    def test_expressions(self):
        """score_mod and mask_mod on packed sequences (q and kv count from
        each sequence's start), through the expressions' backward."""
        lens = [1, 17, 300, 0, 90]
        for d in (64, 128):
            with self.subTest(d=d):
                self.check(lens, hq=8, hk=2, d=d, causal=True,
                           score_mod="s + 0.05f * (float)(kv - q)", mask_mod="kv >= q - 40",
                           ref=dict(score=lambda s, b, h, hk, qi, ki: s + 0.05 * (ki - qi),
                                    mask=lambda b, h, hk, qi, ki: ki >= qi - 40))

    def test_seqused_and_larger_bounds(self):
        lens_q, lens_k = [5, 17, 60, 1], [40, 17, 100, 20]
        self.check(lens_q, lens_k, used=[40, 3, 0, 20], causal=True, hq=8, hk=2)
        self.check(lens_q, lens_k, max_q=128, max_k=300, causal="top_left")

    def test_padded_rows_have_zero_gradients(self):
        # Rows past cu_seqlens[-1] belong to no sequence: their gradients are 0.
        q, k, v, _, dout, _, _, _ = self.case([40, 60], [40, 60])
        cu = int32([0, 30, 80])
        got = self.grads(q, k, v, None, dout, cu, cu, None, 64, 64, causal=True)
        for name, g in zip(("dq", "dk", "dv"), got):
            self.assertFalse(g[80:].any().item(), f"{name}: rows past the last sequence")
            self.assertTrue(g[:80].any().item(), name)

    def test_deterministic_bits(self):
        self.keep_deterministic_state()
        lens = [1, 17, 1500, 0, 700, 2048]
        t = self.case(lens, lens, hq=8, hk=2, d=128, sinks=True)
        torch.use_deterministic_algorithms(False)
        loose = self.grads(*t, 2048, 2048, causal=True)
        torch.use_deterministic_algorithms(True)
        first = self.grads(*t, 2048, 2048, causal=True)
        for run in range(4):
            again = self.grads(*t, 2048, 2048, causal=True)
            for name, a, b in zip(("dq", "dk", "dv", "dsinks"), first, again):
                self.assertTrue(torch.equal(a, b), f"{name} differs in run {run + 2}")
        for name, a, b in zip(("dq", "dk", "dv", "dsinks"), first, loose):
            self.rel(a, b.float(), f"{name}: deterministic against default", 1e-2)

    def test_against_dense_attention(self):
        # Each sequence through attention() (BSHD, a batch of one), its
        # gradients in its rows, gives the packed call's gradients.  (Whole
        # tensors compared: a sequence of one query over one key has dq and
        # dk of rounding noise only.)
        lens = [17, 1, 130]
        q, k, v, _, dout, cu, _, _ = self.case(lens, lens, hq=8, hk=2)
        got = self.grads(q, k, v, None, dout, cu, cu, None, 130, 130, causal="top_left")
        want = [torch.zeros_like(t, dtype=torch.float32) for t in (q, k, v)]
        sq = starts(lens)
        for b, n in enumerate(lens):
            rows = slice(sq[b], sq[b] + n)
            leaves = [t[rows][None].detach().clone().requires_grad_() for t in (q, k, v)]
            out = flashjit.attention(*leaves, causal="top_left", layout="bshd")
            (out.float() * dout[rows][None].float()).sum().backward()
            for w, leaf in zip(want, leaves):
                w[rows] = leaf.grad[0].float()
        for name, g, w in zip(("dq", "dk", "dv"), got, want):
            self.rel(g, w, f"{name} against attention()", 1e-2)

    def test_cuda_graph_step(self):
        """Forward and backward captured in one CUDA graph: each replay,
        after new inputs and new lengths (the same total) were copied in,
        gives the gradients of the same call run eagerly."""
        lens = [1, 17, 200, 0, 90]
        q, k, v, sinks, dout, cu, _, _ = self.case(lens, lens, hq=8, hk=2, sinks=True)
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, sinks)]

        def step():
            out = flashjit.attention_varlen(*leaves[:3], cu, cu, 200, 200, causal=True,
                                            sinks=leaves[3])
            (out.float() * dout.float()).sum().backward()

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # compile the kernels, plan
                for t in leaves:
                    t.grad = None
                step()
        torch.cuda.current_stream().wait_stream(side)
        for t in leaves:
            t.grad = None  # the graph's pool makes the gradients
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        for i, new in enumerate(([1, 17, 200, 0, 90], [90, 0, 200, 17, 1])):
            with torch.no_grad():
                for t in leaves + [dout]:
                    t.copy_(torch.randn_like(t))
            cu.copy_(int32(starts(new)))
            graph.replay()
            want = self.grads(*(t.detach() for t in leaves[:3]), leaves[3].detach(), dout, cu,
                              cu, None, 200, 200, causal=True)
            for name, t, w in zip(("dq", "dk", "dv", "dsinks"), leaves, want):
                self.rel(t.grad, w.float(), f"replay {i} {new}: {name}", 1e-2)

    def test_compile_fullgraph(self):
        """torch.compile(fullgraph=True) of attention_varlen and a loss, then
        .backward(): eager's gradients, and the mode of
        torch.use_deterministic_algorithms reaching the launch (a change
        recompiles)."""
        self.keep_deterministic_state()
        torch._dynamo.reset()
        self.addCleanup(torch._dynamo.reset)
        modes, launch = [], tr._launch_bwd

        def spy(*args, **kwargs):
            # The mode by name: dlse follows it (the launch's last argument).
            bound = inspect.signature(launch).bind(*args, **kwargs)
            modes.append(bound.arguments.get("deterministic", False))
            return launch(*args, **kwargs)

        lens = [1, 17, 200, 0, 90]
        q, k, v, sinks, dout, cu, _, _ = self.case(lens, lens, hq=8, hk=2, sinks=True)

        def step(q, k, v, sinks):
            out = flashjit.attention_varlen(q, k, v, cu, cu, 200, 200, causal=True,
                                            window=(64, 0), sinks=sinks)
            return (out.float() * dout.float()).sum()

        compiled = torch.compile(step, fullgraph=True)
        with mock.patch.object(tr, "_launch_bwd", spy):
            for det in (False, True):
                torch.use_deterministic_algorithms(det)
                got = [t.detach().clone().requires_grad_() for t in (q, k, v, sinks)]
                compiled(*got).backward()
                self.assertIs(modes[-1], det)
                want = [t.detach().clone().requires_grad_() for t in (q, k, v, sinks)]
                step(*want).backward()
                for name, g, w in zip(("dq", "dk", "dv", "dsinks"), got, want):
                    self.rel(g.grad, w.grad.float(), f"{name} compiled, deterministic={det}",
                             1e-2)

if __name__ == "__main__":
    unittest.main()
