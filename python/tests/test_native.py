"""The training call in C++ (libflashjit_torch.so, _native.py) without a
GPU: after a training call's first forward and backward on the package's
path, its repeats run through the C++ op and node, which must make the
library calls the package makes -- the same problems, tensors and
gradients' layout -- and fall back to the package's path where the record
does not hold.

As test_calls.py's Stubbed: CPU tensors, a compile-only context, the
launching calls a recorder (here C callbacks, since the C++ side calls
addresses).  Skipped, saying so, without PyTorch or where the C++ library
was not built (CMake builds it where its Python imports a PyTorch with
CUDA: python/flashjit/csrc/CMakeLists.txt)."""
import contextlib
import ctypes as C
import threading
import unittest
from unittest import mock

import fjtest
import flashjit
from fjtest import torch

if fjtest.HAS_TORCH:
    from flashjit import _calls as calls
    from flashjit import _capi as capi
    from flashjit import _native as native
    from flashjit import _train as tr
from test_calls import BF16, Stubbed, qkv  # noqa: E402 (PyTorch or not)

HAVE = fjtest.HAS_TORCH and native.available()
WHY = fjtest.NO_TORCH if not fjtest.HAS_TORCH else f"no C++ training call ({native.why})"

@contextlib.contextmanager
def deterministic(on=True):
    """torch.use_deterministic_algorithms(on) for a block."""
    torch.use_deterministic_algorithms(on)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


def fused(seed, batch):
    """(x, q, k, v, dO): q, k, v the bshd views of a fused QKV projection x
    (batch, 256, 8 + 2 + 2 heads, 64) on the GPU."""
    torch.manual_seed(seed)
    x = torch.randn(batch, 256, 12, 64, device="cuda", dtype=BF16, requires_grad=True)
    q, k, v = x.split([8, 2, 2], dim=2)
    return x, q, k, v, torch.randn(q.shape, device="cuda", dtype=BF16)


V = C.c_void_p
FWD = C.CFUNCTYPE(C.c_int, *[V] * 8)
FWD_PLAN = C.CFUNCTYPE(C.c_int, *[V] * 9, C.c_size_t, V)
BWD = C.CFUNCTYPE(C.c_int, *[V] * 13)
BWD_RUN = C.CFUNCTYPE(C.c_int, *[V] * 14, C.c_size_t, V)
CAPTURING = C.CFUNCTYPE(C.c_int, V, C.POINTER(C.c_int))


@unittest.skipUnless(HAVE, WHY)
class NativeCalls(Stubbed):
    """Stubbed, with the records' launching calls the same recorder."""

    def setUp(self):
        super().setUp()
        rec = self.rec

        def capturing(stream, status):
            status[0] = int(self.capturing)
            return 0
        # Kept alive for the test: the records hold their addresses.
        self.cbs = (FWD(lambda *a: rec.fwd(*a)), FWD_PLAN(lambda *a: rec.fwd_plan(*a)),
                    BWD(lambda *a: rec.bwd(*a)), BWD_RUN(lambda *a: rec.bwd_run(*a)),
                    CAPTURING(capturing))
        fns = dict(zip(("fj_attention_fwd", "fj_attention_fwd_plan", "fj_attention_bwd",
                        "fj_attention_bwd_run", "capturing"),
                       (C.cast(f, V).value for f in self.cbs)))
        fns["fj_errmsg"] = native._FNS["fj_errmsg"]
        p = mock.patch.object(native, "launchers", lambda: fns)
        p.start()
        self.addCleanup(p.stop)
        self.python = mock.patch.object(tr._TrainCall, "apply", wraps=tr._TrainCall.apply)
        self.apply = self.python.start()
        self.addCleanup(self.python.stop)
        # The compiled ops' table of this thread: records that call this
        # test's stubs only.
        torch.ops.flashjit_native.forget()
        self.addCleanup(torch.ops.flashjit_native.forget)

    def step(self, q, k, v, g, **kw):
        out = flashjit.attention(q, k, v, causal="top_left", **kw)
        return out, torch.autograd.grad(out, (q, k, v), g)

    def test_repeats_take_the_cpp_path(self):
        q, k, v = (t.requires_grad_() for t in qkv(hk=2))
        g = torch.randn_like(q)
        out0, grads0 = self.step(q, k, v, g)
        first = list(self.rec.calls)
        self.assertEqual([n for n, _, _ in first], ["fwd", "bwd"])
        call, = calls.tables.train.values()
        self.assertTrue(call.native)
        self.assertEqual(self.apply.call_count, 1)
        out, (dq, dk, dv) = self.step(q, k, v, g)
        self.assertEqual(self.apply.call_count, 1)  # not the package's Function
        (nf, af, pf), (nb, ab, pb) = self.rec.calls[2:]
        self.assertEqual((nf, nb), ("fwd", "bwd"))
        # The same problems, the same arguments but for the outputs.
        self.assertEqual((af[1], ab[1]), (first[0][1][1], first[1][1][1]))
        self.assertEqual(af[2:5], (q.data_ptr(), k.data_ptr(), v.data_ptr()))
        self.assertEqual(af[5], out.data_ptr())
        self.assertEqual((out.shape, out.stride(), out.dtype),
                         (out0.shape, out0.stride(), out0.dtype))
        self.assertEqual(ab[2:5], (q.data_ptr(), k.data_ptr(), v.data_ptr()))
        self.assertEqual(ab[5], out.data_ptr())
        self.assertEqual(ab[6], g.data_ptr())
        self.assertEqual(ab[7], af[6])  # the forward's lse
        self.assertEqual(ab[8:11], (dq.data_ptr(), dk.data_ptr(), dv.data_ptr()))
        self.assertIsNone(ab[11])       # no sinks
        for a, b in zip((dq, dk, dv), grads0):
            self.assertEqual((a.shape, a.stride(), a.dtype), (b.shape, b.stride(), b.dtype))
        self.assertEqual((pb.deterministic, pb.dlse), (0, None))
        self.assertEqual(bytes(pb), bytes(first[1][2]))

    def test_deterministic_mode(self):
        q, k, v = (t.requires_grad_() for t in qkv())
        g = torch.randn_like(q)
        self.step(q, k, v, g)
        with deterministic():
            self.step(q, k, v, g)
        self.assertEqual(self.apply.call_count, 1)
        (_, a0, p0), (_, a1, p1) = [c for c in self.rec.calls if c[0] == "bwd"]
        self.assertEqual((p0.deterministic, p1.deterministic), (0, 1))
        self.assertNotEqual(a0[1], a1[1])
        # The deterministic entry is the package's own: its path takes it too.
        call, = calls.tables.train.values()
        self.assertEqual(call.bwd[(True, True)][0].p_addr, a1[1])

    def test_fused_qkv_gradients_are_views_of_one_buffer(self):
        x = torch.randn(2, 64, 12, 64, dtype=BF16, requires_grad=True)
        q, k, v = (t.transpose(1, 2) for t in x.split([8, 2, 2], dim=2))
        g = torch.randn(q.shape, dtype=BF16)
        self.step(q, k, v, g)
        out, (dq, dk, dv) = self.step(q, k, v, g)
        self.assertEqual(self.apply.call_count, 1)
        for a, t in zip((dq, dk, dv), (q, k, v)):
            self.assertEqual((a.shape, a.stride(), a.storage_offset()),
                             (t.shape, t.stride(), t.storage_offset()))
        self.assertEqual({t.untyped_storage().data_ptr() for t in (dq, dk, dv)},
                         {dq.untyped_storage().data_ptr()})
        self.assertEqual(dq.untyped_storage().nbytes(), x.untyped_storage().nbytes())
        # Through the projection, as a model's step takes it.
        (gx,) = torch.autograd.grad(flashjit.attention(q, k, v, causal="top_left"), (x,), g)
        self.assertEqual(gx.shape, x.shape)
        # Views of the same strides in other storages: the package's path.
        y = torch.randn(2, 64, 12, 64, dtype=BF16, requires_grad=True)
        q2 = y.split([8, 2, 2], dim=2)[0].transpose(1, 2)
        self.step(q2, k, v, g)
        self.assertEqual(self.apply.call_count, 2)

    def test_saved_tensors_hooks_that_change_the_layout(self):
        """A saved-tensor hook's copies in other strides reach the node:
        it copies them into the layout its entries were made for."""
        x = torch.randn(2, 64, 12, 64, dtype=BF16, requires_grad=True)
        q, k, v = (t.transpose(1, 2) for t in x.split([8, 2, 2], dim=2))
        g = torch.randn(q.shape, dtype=BF16)
        self.step(q, k, v, g)

        def pack(t):
            return t.contiguous().clone() if t.dim() == 4 else t
        # What the library would read at the call's addresses with its
        # problem's strides (the rows, as the call sees them).
        seen, bwd = [], self.rec.bwd

        def reading(*a):
            for t, addr in zip((q, k, v), a[2:5]):
                for idx in ((0, 0, 0), (1, 1, 63), (1, t.shape[1] - 1, 17)):
                    at = addr + 2 * sum(i * s for i, s in zip(idx, t.stride()))
                    seen.append((t[idx].detach(), torch.frombuffer(
                        bytearray((C.c_char * 128).from_address(at)), dtype=BF16)))
            return bwd(*a)
        self.rec.bwd = reading
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out, (dq, dk, dv) = self.step(q, k, v, g)
        self.assertEqual(self.apply.call_count, 1)
        _, a, p = self.rec.calls[-1]
        self.assertEqual([list(p.q_stride), list(p.k_stride)],
                         [list(q.stride()[:3]), list(k.stride()[:3])])
        self.assertEqual(len(seen), 9)
        for want, got in seen:
            self.assertTrue(torch.equal(want, got))
        self.assertEqual(a[3] - a[2], 2 * (k.storage_offset() - q.storage_offset()))
        for a_, t in zip((dq, dk, dv), (q, k, v)):
            self.assertEqual(a_.stride(), t.stride())

    def test_gradient_at_the_log_sum_exp(self):
        q, k, v = (t.requires_grad_() for t in qkv())
        for i in range(2):
            out, lse = flashjit.attention(q, k, v, causal="top_left", return_lse=True)
            w = torch.randn(lse.shape)
            (out.float().sum() + (lse * w).sum()).backward()
            self.assertTrue(torch.equal(self.rec.dlse[-1], w))
        out, lse = flashjit.attention(q, k, v, causal="top_left", return_lse=True)
        lse.sum().backward()  # O unused: dO zeros
        self.assertTrue(torch.equal(self.rec.dlse[-1], torch.ones(lse.shape)))
        self.assertEqual(self.apply.call_count, 1)
        # The problem's dlse is cleared where a later loss has none.
        flashjit.attention(q, k, v, causal="top_left").float().sum().backward()
        self.assertIsNone(self.rec.dlse[-1])

    def test_capture_takes_the_graphs_workspace(self):
        q, k, v = (t.requires_grad_() for t in qkv())
        g = torch.randn_like(q)
        self.step(q, k, v, g)
        call, = calls.tables.train.values()
        # A forward with a workspace (the persistent scheduler's counter on
        # a GPU; none on the compile-only context): 256 bytes.
        native.Call.from_address(call.native).fwd.ws = 256
        self.capturing = True
        self.step(q, k, v, g)
        self.assertEqual([n for n, _, _ in self.rec.calls[2:]], ["fwd_plan", "bwd_run"])
        (_, af, _), (_, ab, _) = self.rec.calls[2:]
        self.assertEqual((af[2], af[9]), (call.entry.plan_addr, 256))
        self.assertIsNotNone(af[8])
        self.assertEqual(ab[2], call.bwd[(False, True)][0].plan_addr)
        self.assertEqual(ab[14], call.bwd[(False, True)][0].ws)
        self.capturing = False
        self.step(q, k, v, g)
        self.assertEqual([n for n, _, _ in self.rec.calls[4:]], ["fwd", "bwd"])

    def test_sinks(self):
        q, k, v = (t.requires_grad_() for t in qkv(hk=2))
        sinks = torch.randn(q.shape[1], dtype=torch.float32, requires_grad=True)
        g = torch.randn_like(q)
        seen, bwd = [], self.rec.bwd

        def reading(*a):  # the backward's sinks pointer as the library reads it
            (obj, field, _), = call.bwd[(False, True)][0].slots
            seen.append(getattr(obj, field))
            return bwd(*a)
        self.rec.bwd = reading
        for i in range(2):
            sinks = sinks.detach().clone().requires_grad_()  # new tensors, one signature
            out = flashjit.attention(q, k, v, causal="top_left", sinks=sinks)
            call, = calls.tables.train.values()
            (obj, field, _), = call.entry.slots
            self.assertEqual(getattr(obj, field), sinks.data_ptr())
            grads = torch.autograd.grad(out, (q, k, v, sinks), g)
            self.assertEqual(seen[-1], sinks.data_ptr())
        self.assertEqual(self.apply.call_count, 1)
        (_, af, _), (_, ab, _) = self.rec.calls[2:]
        self.assertEqual(ab[11], grads[3].data_ptr())
        self.assertEqual((grads[3].shape, grads[3].dtype), (sinks.shape, torch.float32))
        # Sinks that do not require grad: no dsinks asked of the node's caller.
        sinks.requires_grad_(False)
        out = flashjit.attention(q, k, v, causal="top_left", sinks=sinks)
        self.assertEqual(len(torch.autograd.grad(out, (q, k, v), g)), 3)
        self.assertEqual(self.apply.call_count, 1)

    def test_sinks_with_an_expression(self):
        q, k, v = (t.requires_grad_() for t in qkv())
        sinks = torch.randn(q.shape[1], dtype=torch.float32, requires_grad=True)
        g = torch.randn_like(q)
        mods = mock.patch.object(tr._TrainMods, "apply", wraps=tr._TrainMods.apply)
        apply = mods.start()
        self.addCleanup(mods.stop)
        for _ in range(2):
            out = flashjit.attention(q, k, v, causal="top_left", sinks=sinks,
                                     score_mod="s * 0.5f")
            grads = torch.autograd.grad(out, (q, k, v, sinks), g)
        self.assertEqual(apply.call_count, 1)
        _, ab, pb = self.rec.calls[-1]
        self.assertEqual(ab[11], grads[3].data_ptr())
        self.assertEqual(grads[3].shape, sinks.shape)

    def test_other_mode_where_no_record_is_made(self):
        """A call the record cannot express (k broadcast: copied dense) stays
        on the package's path, whose deterministic backward then makes its
        own entry."""
        q, v = (t.requires_grad_() for t in qkv(b=2)[::2])
        k = torch.randn(1, 8, 128, 64, dtype=BF16).expand(2, 8, 128, 64).requires_grad_()
        g = torch.randn_like(q)
        for _ in range(2):
            self.step(q, k, v, g)
        call, = calls.tables.train.values()
        self.assertEqual(call.native, 0)
        with deterministic():
            self.step(q, k, v, g)
        self.assertEqual(self.apply.call_count, 3)
        self.assertEqual(self.rec.calls[-1][2].deterministic, 1)

    def test_expressions_other_mode_where_no_record_is_made(self):
        """test_other_mode_where_no_record_is_made with an expression: the
        deterministic backward reads the dense copy of k with its own
        strides."""
        q, v = (t.requires_grad_() for t in qkv(b=2)[::2])
        k = torch.randn(1, 8, 128, 64, dtype=BF16).expand(2, 8, 128, 64).requires_grad_()
        g = torch.randn_like(q)
        for det in (False, False, True):
            with deterministic(det):
                self.step(q, k, v, g, score_mod="s * 0.5f")
            _, _, p = self.rec.calls[-1]
            self.assertEqual((p.deterministic, list(p.k_stride)),
                             (det, [8 * 128 * 64, 128 * 64, 64]))
        call, = calls.tables.train.values()
        self.assertEqual(call.native, 0)

    def test_checkpoint_without_reentry(self):
        """torch.utils.checkpoint(use_reentrant=False) unpacks each saved
        tensor once: the backward must too, on both paths."""
        from torch.utils.checkpoint import checkpoint
        q, k, v = (t.requires_grad_() for t in qkv())
        for kw in ({}, {"score_mod": "s * 0.5f"}):
            for reentrant in (False, False, False, True, True):
                out = checkpoint(lambda a, b, c: flashjit.attention(a, b, c, causal="top_left",
                                                                     **kw),
                                 q, k, v, use_reentrant=reentrant)
                out.float().sum().backward()
        self.assertTrue(all(c.native for c in calls.tables.train.values()))
        self.assertEqual(sum(n == "bwd" for n, _, _ in self.rec.calls), 10)

    def test_varlen_with_expressions_plans_once(self):
        """attention_varlen's training call with an expression makes a new
        call object each time: no record, and no backward plan for the
        other mode each step."""
        q, k, v = (torch.randn(140, 4, 64, dtype=BF16, requires_grad=True) for _ in range(3))
        cu = torch.tensor([0, 70, 140], dtype=torch.int32)
        plans = []
        for _ in range(4):
            flashjit.attention_varlen(q, k, v, cu, cu, 70, 70, causal=True,
                                      score_mod="s * 0.5f").float().sum().backward()
            plans.append(calls.counts["bwd_plans"])
        self.assertEqual(plans[1:], plans[:1] * 3)

    def test_compiled_graph_calls_the_cpp_ops(self):
        """Under torch.compile the training call traces into the C++ ops
        (flashjit_native::attention_train and its backward op), which make
        the package's entries once and launch them."""
        p = mock.patch.object(native, "CPU_OPS", True)
        p.start()
        self.addCleanup(p.stop)
        torch._dynamo.reset()
        self.addCleanup(torch._dynamo.reset)
        q, k, v = (t.requires_grad_() for t in qkv(hk=2))
        g = torch.randn_like(q)
        graphs = []

        def backend(gm, inputs):
            graphs.append(gm)
            return torch._dynamo.backends.debugging.aot_eager(gm, inputs)
        f = torch.compile(lambda a, b, c: flashjit.attention(a, b, c, causal="top_left"),
                          backend=backend, fullgraph=True)
        before = torch.ops.flashjit_native.signatures()
        for _ in range(3):
            out = f(q, k, v)
            grads = torch.autograd.grad(out, (q, k, v), g)
        self.assertIn("flashjit_native.attention_train", graphs[0].code)
        self.assertEqual(torch.ops.flashjit_native.signatures() - before, 2)
        self.assertEqual([n for n, _, _ in self.rec.calls], ["fwd", "bwd"] * 3)
        self.assertEqual(len({a[1] for n, a, _ in self.rec.calls if n == "fwd"}), 1)
        self.assertEqual(len({a[1] for n, a, _ in self.rec.calls if n == "bwd"}), 1)
        _, a, pb = self.rec.calls[-1]
        self.assertEqual(a[2:5], (q.data_ptr(), k.data_ptr(), v.data_ptr()))
        self.assertEqual(a[8:11], tuple(t.data_ptr() for t in grads))
        self.assertEqual((out.shape, grads[1].shape), (q.shape, k.shape))
        # The deterministic mode, read when the backward is traced: a new graph.
        with deterministic():
            torch.autograd.grad(f(q, k, v), (q, k, v), g)
        self.assertEqual(self.rec.calls[-1][2].deterministic, 1)

    def compiled_setup(self):
        p = mock.patch.object(native, "CPU_OPS", True)
        p.start()
        self.addCleanup(p.stop)
        torch._dynamo.reset()
        self.addCleanup(torch._dynamo.reset)

    def test_compiled_lse_gradient(self):
        """The compiled backward takes the log-sum-exp's gradient (dlse), with
        O's or without it (dO zeros)."""
        self.compiled_setup()
        q, k, v = (t.requires_grad_() for t in qkv(s=64))
        f = torch.compile(lambda a, b, c: flashjit.attention(a, b, c, causal="top_left",
                                                             return_lse=True),
                          backend="aot_eager", fullgraph=True)
        for both in (True, False):
            out, lse = f(q, k, v)
            w = torch.randn(lse.shape)
            loss = (lse * w).sum() + (out.float().sum() if both else 0)
            loss.backward()
            self.assertTrue(torch.equal(self.rec.dlse[-1], w))
        self.assertEqual([n for n, _, _ in self.rec.calls], ["fwd", "bwd"] * 2)

    def test_compiled_capture(self):
        """Under CUDA-graph capture the compiled ops take the graph's
        workspace (fj_attention_fwd_plan, fj_attention_bwd_run)."""
        self.compiled_setup()
        q, k, v = (t.requires_grad_() for t in qkv(s=192))
        g = torch.randn_like(q)
        f = torch.compile(lambda a, b, c: flashjit.attention(a, b, c, causal="top_left"),
                          backend="aot_eager", fullgraph=True)
        torch.autograd.grad(f(q, k, v), (q, k, v), g)
        fwd, = [r for r, _ in native._records[-2:] if r.lse_shape[0]]
        fwd.ws = 256  # a forward with a workspace (a GPU's persistent scheduler)
        self.capturing = True
        torch.autograd.grad(f(q, k, v), (q, k, v), g)
        self.assertEqual([n for n, _, _ in self.rec.calls[2:]], ["fwd_plan", "bwd_run"])
        (_, af, _), (_, ab, _) = self.rec.calls[2:]
        self.assertEqual((af[2], af[9]), (fwd.plan, 256))
        self.assertIsNotNone(af[8])

    def test_compiled_empty_call_runs_the_packages_op(self):
        """A signature no record expresses (no query rows: nothing to
        launch) runs the package's own op, through the dispatcher."""
        p = mock.patch.object(native, "CPU_OPS", True)
        p.start()
        self.addCleanup(p.stop)
        torch._dynamo.reset()
        self.addCleanup(torch._dynamo.reset)
        lib = torch.library.Library("flashjit", "IMPL")  # the ops' CPU kernels, for this test
        self.addCleanup(lib._destroy)
        ran = []

        def fwd(*args):
            ran.append("fwd")
            return tr._attention_train(*args)

        def bwd(*args, **kw):
            ran.append("bwd")
            return tr._attention_bwd(*args, **kw)
        lib.impl("attention_train", fwd, "CPU")
        lib.impl("attention_bwd", bwd, "CPU")
        q = torch.randn(1, 8, 0, 64, dtype=BF16, requires_grad=True)
        k, v = (torch.randn(1, 8, 128, 64, dtype=BF16, requires_grad=True) for _ in range(2))
        f = torch.compile(lambda a, b, c: flashjit.attention(a, b, c, causal="top_left"),
                          backend="aot_eager", fullgraph=True)
        for _ in range(2):
            out = f(q, k, v)
            dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
        self.assertEqual(ran, ["fwd", "bwd"] * 2)
        self.assertEqual((out.shape, dq.shape, dk.shape), (q.shape, q.shape, k.shape))
        self.assertFalse(dk.any())
        self.assertEqual(self.rec.calls, [])

    def test_compiled_ops_by_thread(self):
        """Another thread's compiled calls of the same signature take entries
        of their own (the package's tables are by thread: a call writes its
        pointers into its entry's problem)."""
        p = mock.patch.object(native, "CPU_OPS", True)
        p.start()
        self.addCleanup(p.stop)
        torch._dynamo.reset()
        self.addCleanup(torch._dynamo.reset)
        q, k, v = (t.requires_grad_() for t in qkv())
        g = torch.randn_like(q)
        f = torch.compile(lambda a, b, c: flashjit.attention(a, b, c, causal="top_left"),
                          backend="aot_eager", fullgraph=True)

        def run():
            torch.autograd.grad(f(q, k, v), (q, k, v), g)
        before = torch.ops.flashjit_native.signatures()
        run()
        t = threading.Thread(target=run)
        t.start()
        t.join()
        self.assertEqual(torch.ops.flashjit_native.signatures() - before, 4)
        fwd = [a[1] for n, a, _ in self.rec.calls if n == "fwd"]
        self.assertEqual(len(fwd), 2)
        self.assertNotEqual(fwd[0], fwd[1])

    def test_compiled_strided_inputs_and_sinks(self):
        """The compiled backward reads q, k and v that are not dense as dense
        copies and returns dense gradients (the op's fake), and the sinks'
        gradient."""
        p = mock.patch.object(native, "CPU_OPS", True)
        p.start()
        self.addCleanup(p.stop)
        torch._dynamo.reset()
        self.addCleanup(torch._dynamo.reset)
        x = torch.randn(2, 64, 12, 64, dtype=BF16, requires_grad=True)
        sinks = torch.randn(8, dtype=torch.float32, requires_grad=True)

        def step(x, sinks):
            q, k, v = x.split([8, 2, 2], dim=2)
            return flashjit.attention(q, k, v, causal="top_left", layout="bshd", sinks=sinks)
        f = torch.compile(step, backend="aot_eager", fullgraph=True)
        seen, bwd = [], self.rec.bwd

        def reading(*a):  # the q the library is given, q[1, 1, 0]: dense, x's values
            at = a[2] + 2 * (64 * 8 * 64 + 8 * 64)
            seen.append(torch.frombuffer(bytearray((C.c_char * 128).from_address(at)),
                                         dtype=BF16))
            return bwd(*a)
        self.rec.bwd = reading
        g = torch.randn(2, 64, 8, 64, dtype=BF16)
        for _ in range(2):
            gx, gs = torch.autograd.grad(f(x, sinks), (x, sinks), g)
        _, a, pb = self.rec.calls[-1]
        # Dense bshd: (batch, head, row) strides, a copy of x's q.
        self.assertEqual(list(pb.q_stride), [64 * 8 * 64, 64, 8 * 64])
        self.assertNotEqual(a[2], x.data_ptr())
        self.assertTrue(torch.equal(seen[-1], x[1, 1, 0].detach()))
        self.assertEqual(a[11], gs.data_ptr())
        self.assertEqual((gx.shape, gs.shape), (x.shape, sinks.shape))

    def test_status(self):
        ok, where = flashjit.native_training()
        self.assertEqual((ok, where), (True, native._path()))
        self.assertTrue(where.endswith("libflashjit_torch.so"))
        with mock.patch.object(native, "_state", None), \
                mock.patch.dict("os.environ", {"FLASHJIT_NATIVE": "0"}):
            self.assertEqual(flashjit.native_training(), (False, "FLASHJIT_NATIVE=0"))
            q, k, v = (t.requires_grad_() for t in qkv())
            for _ in range(2):
                flashjit.attention(q, k, v).float().sum().backward()
            self.assertEqual(self.apply.call_count, 2)
        with mock.patch.object(native, "_state", None), \
                mock.patch.dict("os.environ", {"FLASHJIT_NATIVE_LIB": "/nonexistent/lib.so"}):
            self.assertEqual(flashjit.native_training(), (False, "no /nonexistent/lib.so"))
        # A library built for another PyTorch is refused, saying so.
        with mock.patch.object(native, "_state", None), \
                mock.patch.object(native, "_torch_version", lambda: 199):
            ok, why = flashjit.native_training()
            self.assertFalse(ok)
            self.assertIn("built for PyTorch 2.", why)
            self.assertIn(torch.__version__, why)

    def test_no_record_for_stubbed_calls(self):
        q, k, v = (t.requires_grad_() for t in qkv())
        with mock.patch.object(native, "launchers", lambda: None):
            for _ in range(2):
                flashjit.attention(q, k, v).float().sum().backward()
        self.assertEqual([c.native for c in calls.tables.train.values()], [0])
        self.assertEqual(self.apply.call_count, 2)

    def mods_slots(self, e, extras):
        """What entry e's slots hold now, and what they would hold for extras."""
        return ([getattr(obj, field) for obj, field, _ in e.slots],
                [extras[i].data_ptr() for _, _, i in e.slots])

    def test_expressions_and_a_block_mask(self):
        q, k, v = (t.requires_grad_() for t in qkv(s=512))
        g = torch.randn_like(q)

        def kw():
            doc = torch.zeros(512, dtype=torch.int32)
            z = [torch.zeros(sh, dtype=torch.int32) for sh in ((1, 1, 4), (1, 1, 4, 4))]
            bm = flashjit.BlockMask(z[0], z[1], z[0].clone(), z[1].clone(), q_num=z[0].clone(),
                                    q_indices=z[1].clone(), full_q_num=z[0].clone(),
                                    full_q_indices=z[1].clone())
            return dict(mask_mod="doc(q) == doc(kv)", params={"doc": doc}, block_mask=bm)
        mods = mock.patch.object(tr._TrainMods, "apply", wraps=tr._TrainMods.apply)
        apply = mods.start()
        self.addCleanup(mods.stop)
        self.step(q, k, v, g, **kw())
        call, = calls.tables.train.values()
        self.assertIsInstance(call, tr.ModsCall)
        self.assertTrue(call.native)
        first = list(self.rec.calls)
        # Other tensors of the same signature: the C++ path writes their
        # addresses where the entries' slots are.
        again = kw()
        out, grads = self.step(q, k, v, g, **again)
        self.assertEqual(apply.call_count, 1)
        self.assertEqual([n for n, _, _ in self.rec.calls[2:]], ["fwd", "bwd"])
        self.assertEqual(self.rec.calls[2][1][1], first[0][1][1])
        self.assertEqual(self.rec.calls[3][1][1], first[1][1][1])
        from flashjit import _torch as ft
        extras, _ = ft._given_extras(None, again["params"], again["block_mask"], (None,) * 3)
        have, want = self.mods_slots(call.entry, extras)
        self.assertEqual(have, want)
        have, want = self.mods_slots(call.bwd[(False, 0)][0], extras)
        self.assertEqual(have, want)
        self.assertGreater(len(have), 4)

    def test_parameter_gradients_stay_on_the_packages_path(self):
        q, k, v = (t.requires_grad_() for t in qkv())
        g = torch.randn_like(q)
        t = torch.zeros(q.shape[1], dtype=torch.float32)
        mods = mock.patch.object(tr._TrainMods, "apply", wraps=tr._TrainMods.apply)
        apply = mods.start()
        self.addCleanup(mods.stop)
        for _ in range(2):
            self.step(q, k, v, g, score_mod="s + t(h)", params={"t": t})
        self.assertEqual(apply.call_count, 1)  # the repeat: C++
        t.requires_grad_()
        out = flashjit.attention(q, k, v, causal="top_left", score_mod="s + t(h)",
                                 params={"t": t})
        self.assertEqual(apply.call_count, 2)
        out.float().sum().backward()
        self.assertEqual(t.grad.shape, t.shape)



@unittest.skipUnless(HAVE and fjtest.HAS_CUDA, WHY if not HAVE else fjtest.NO_CUDA)
class NativeGPU(unittest.TestCase):
    """On a GPU: a training call's repeats (the C++ path) give what its first
    call (the package's path) gave -- the output's bits, and in the
    deterministic mode the gradients' bits."""

    def setUp(self):
        calls.tables.train.clear()
        for cls in (tr._TrainCall, tr._TrainMods):
            p = mock.patch.object(cls, "apply", wraps=cls.apply)
            setattr(self, cls.__name__, p.start())
            self.addCleanup(p.stop)

    def python_calls(self):
        return self._TrainCall.call_count + self._TrainMods.call_count

    def run_twice(self, q, k, v, g, inputs, **kw):
        got = []
        for _ in range(2):
            out = flashjit.attention(q, k, v, causal="top_left", **kw)
            got.append((out,) + torch.autograd.grad(out, inputs, g))
        call, = calls.tables.train.values()
        self.assertTrue(call.native, native.why)
        self.assertEqual(self.python_calls(), 1)  # the repeat: the C++ op
        return got

    def test_repeat_matches_first_call(self):
        torch.manual_seed(0)
        q = torch.randn(2, 8, 384, 64, device="cuda", dtype=BF16, requires_grad=True)
        k, v = (torch.randn(2, 2, 384, 64, device="cuda", dtype=BF16, requires_grad=True)
                for _ in range(2))
        g = torch.randn_like(q)
        with deterministic():
            first, again = self.run_twice(q, k, v, g, (q, k, v))
        for a, b in zip(first, again):
            self.assertTrue(torch.equal(a, b))
            self.assertEqual(a.stride(), b.stride())
        # The default mode: the output's bits, gradients within bf16's rounding.
        calls.tables.train.clear()
        self._TrainCall.reset_mock()
        first, again = self.run_twice(q, k, v, g, (q, k, v))
        self.assertTrue(torch.equal(first[0], again[0]))
        for a, b in zip(first[1:], again[1:]):
            torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)

    def test_fused_qkv_projection(self):
        x, q, k, v, g = fused(1, 4)
        with deterministic():
            first, again = self.run_twice(q, k, v, g, (x,), layout="bshd")
        self.assertTrue(torch.equal(first[0], again[0]))
        self.assertTrue(torch.equal(first[1], again[1]))

    def test_compiled(self):
        """torch.compile's graph through the C++ ops (default backend:
        Inductor) gives the eager call's result."""
        x, q, k, v, g = fused(6, 2)

        def step(x):
            q, k, v = x.split([8, 2, 2], dim=2)
            return flashjit.attention(q, k, v, causal="top_left", layout="bshd")
        torch._dynamo.reset()
        self.addCleanup(torch._dynamo.reset)
        f = torch.compile(step, fullgraph=True)
        before = torch.ops.flashjit_native.signatures()
        with deterministic():
            out0 = step(x)
            (g0,) = torch.autograd.grad(out0, (x,), g)
            for _ in range(2):
                out = f(x)
                (gx,) = torch.autograd.grad(out, (x,), g)
        self.assertEqual(torch.ops.flashjit_native.signatures() - before, 2)
        torch.testing.assert_close(out, out0, atol=0, rtol=0)
        torch.testing.assert_close(gx, g0, atol=2e-2, rtol=2e-2)

    def test_offloaded_activations(self):
        """torch.autograd.graph.save_on_cpu: the backward's q, k and v come
        back as dense copies of the fused projection's views."""
        x, q, k, v, g = fused(4, 2)
        with deterministic():
            first, again = self.run_twice(q, k, v, g, (x,), layout="bshd")
            with torch.autograd.graph.save_on_cpu():
                out = flashjit.attention(q, k, v, causal="top_left", layout="bshd")
                (gx,) = torch.autograd.grad(out, (x,), g)
        self.assertTrue(torch.equal(out, first[0]))
        self.assertTrue(torch.equal(gx, first[1]))

    def test_document_mask(self):
        torch.manual_seed(3)
        q, k, v = (torch.randn(2, 4, 1024, 64, device="cuda", dtype=BF16, requires_grad=True)
                   for _ in range(3))
        doc = torch.sort(torch.randint(0, 5, (1024,), device="cuda")).values.int()
        kw = dict(mask_mod="doc(q) == doc(kv)", params={"doc": doc})
        kw["block_mask"] = flashjit.block_mask(q, k, causal=True, **kw)
        g = torch.randn_like(q)
        with deterministic():
            first, again = self.run_twice(q, k, v, g, (q, k, v), **kw)
        self.assertIsInstance(next(iter(calls.tables.train.values())), tr.ModsCall)
        for a, b in zip(first, again):
            self.assertTrue(torch.equal(a, b))

    def test_sinks(self):
        torch.manual_seed(5)
        q = torch.randn(2, 8, 384, 64, device="cuda", dtype=BF16, requires_grad=True)
        k, v = (torch.randn(2, 2, 384, 64, device="cuda", dtype=BF16, requires_grad=True)
                for _ in range(2))
        sinks = torch.randn(8, device="cuda", requires_grad=True)
        g = torch.randn_like(q)
        with deterministic():
            got = []
            for _ in range(2):
                out = flashjit.attention(q, k, v, causal="top_left", sinks=sinks)
                got.append((out,) + torch.autograd.grad(out, (q, k, v, sinks), g))
        call, = calls.tables.train.values()
        self.assertTrue(call.native)
        for a, b in zip(*got):
            self.assertTrue(torch.equal(a, b))

    def test_lse_gradient(self):
        torch.manual_seed(2)
        q, k, v = (torch.randn(1, 4, 256, 128, device="cuda", dtype=BF16, requires_grad=True)
                   for _ in range(3))
        w = torch.randn(1, 4, 256, device="cuda")
        with deterministic():
            got = []
            for _ in range(2):
                out, lse = flashjit.attention(q, k, v, causal="top_left", return_lse=True)
                got.append(torch.autograd.grad(out.float().sum() + (lse * w).sum(), (q, k, v)))
        call, = calls.tables.train.values()
        self.assertTrue(call.native)
        for a, b in zip(*got):
            self.assertTrue(torch.equal(a, b))


if __name__ == "__main__":
    unittest.main()
