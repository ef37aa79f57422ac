"""Training through flashjit.attention: the deterministic mode's plumbing
(on the CPU: the flag in the fj_problem the backward builds, and in the
backward graph AOTAutograd traces), and on the GPU examples/gpt_train.py
beside SDPA, a training step captured in a CUDA graph, torch.compile with
fullgraph=True and .backward(), bit-identical gradients under
torch.use_deterministic_algorithms(True), and block masks' gradients
against their mask expression's.

The CPU tests need PyTorch (any build); the GPU tests PyTorch with a CUDA
GPU.  Each skips, saying why, where that is missing."""
import copy
import inspect
import io
import os
import re
import subprocess
import sys
import types
import unittest
from unittest import mock

import fjtest
import flashjit
from fjtest import torch

if fjtest.HAS_TORCH:
    import torch.nn as nn
    from flashjit import _args as ar
    from flashjit import _capi as capi
    from flashjit import _train as tr

EXAMPLE = os.path.join(fjtest.REPO, "examples", "gpt_train.py")


def example_env():
    """The environment for the example: this checkout's package first."""
    env = dict(os.environ)
    python = os.path.join(fjtest.REPO, "python")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (python, env.get("PYTHONPATH")) if p)
    return env


class DeterministicState:
    """Restores torch.use_deterministic_algorithms after a test."""

    def keep_deterministic_state(self):
        state = (torch.are_deterministic_algorithms_enabled(),
                 torch.is_deterministic_algorithms_warn_only_enabled())
        self.addCleanup(lambda: torch.use_deterministic_algorithms(state[0],
                                                                   warn_only=state[1]))


def bwd_argument(node, name):
    """An argument of a flashjit::attention_bwd call in an FX graph, by name
    (arguments left at their defaults do not appear in the node)."""
    schema = node.target._schema
    values = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
    values.update(zip((a.name for a in schema.arguments), node.args))
    values.update(node.kwargs)
    return values[name]


@unittest.skipUnless(fjtest.HAS_TORCH, fjtest.NO_TORCH)
class DeterministicPlumbing(unittest.TestCase, DeterministicState):
    """Without a GPU: the flag from torch.use_deterministic_algorithms to
    the fj_problem of the backward."""

    def test_problem_carries_the_flag(self):
        q = torch.empty(2, 8, 1024, 128, dtype=torch.bfloat16)
        k = v = torch.empty(2, 2, 1024, 128, dtype=torch.bfloat16)
        args = (q, k, v, capi.CAUSAL_NONE, 0.0, capi.BHSD)
        for flag in (True, False, True):
            p = tr._bwd_problem(*args, flag)
            self.assertEqual(p.deterministic, int(flag))
            self.assertEqual((p.batch, p.heads_q, p.heads_kv, p.seq_q, p.head_dim),
                             (2, 8, 2, 1024, 128))
        # The forward's cached problem is copied, never switched.
        self.assertEqual(ar._problem(*args).deterministic, 0)

    def test_backward_formula_passes_the_flag(self):
        self.keep_deterministic_state()
        q = torch.empty(1, 4, 64, 64, dtype=torch.bfloat16)
        lse = torch.empty(1, 4, 64)
        ctx = types.SimpleNamespace(saved_tensors=(q, q, q, q, lse) + (None,) * 4,
                                    args=(capi.CAUSAL_TOP_LEFT, 0.0, capi.BHSD, -1, -1, 0.0),
                                    max_seqlens=(0, 0))
        inputs = len(torch.ops.flashjit.attention_train.default._schema.arguments)
        seen = []

        def bwd_op(*args, dlse=None):
            seen.append(args[-1])
            return q, q, q, lse.new_empty(0)

        with mock.patch.object(tr, "attention_bwd_op", bwd_op):
            for det, warn_only in ((False, False), (True, False), (True, True)):
                torch.use_deterministic_algorithms(det, warn_only=warn_only)
                grads = tr._train_backward(ctx, q, None)  # no alert raises
                self.assertEqual(len(grads), inputs)
                self.assertIs(seen[-1], det, f"deterministic={det} warn_only={warn_only}")

    def test_op_takes_the_flag_as_an_argument(self):
        schema = torch.ops.flashjit.attention_bwd.default._schema
        arg = next(a for a in schema.arguments if a.name == "deterministic")
        self.assertEqual(str(arg.type), "bool")
        self.assertIs(arg.default_value, False)

    def test_traced_backward_shows_the_mode(self):
        """What torch.compile does with the backward (AOTAutograd's trace),
        on meta tensors: the mode is a constant of the attention_bwd node."""
        try:
            from functorch.compile import aot_function, make_boxed_func
        except ImportError:
            self.skipTest("no functorch.compile.aot_function in this PyTorch")
        self.keep_deterministic_state()
        graphs = []

        def keep(gm, example_inputs):
            graphs.append(gm)
            return make_boxed_func(gm.forward)

        def f(q, k, v):
            out, _ = tr.attention_train_op(q, k, v, None, capi.CAUSAL_TOP_LEFT, 0.0,
                                           capi.BHSD, -1, -1, 0.0)
            return out

        for det in (False, True):
            torch.use_deterministic_algorithms(det)
            q = torch.empty(1, 8, 64, 64, dtype=torch.bfloat16, device="meta",
                            requires_grad=True)
            k, v = (torch.empty(1, 2, 64, 64, dtype=torch.bfloat16, device="meta",
                                requires_grad=True) for _ in range(2))
            graphs.clear()
            aot_function(f, fw_compiler=lambda gm, _: make_boxed_func(gm.forward),
                         bw_compiler=keep)(q, k, v).sum().backward()
            self.assertEqual([t.grad.shape for t in (q, k, v)], [q.shape, k.shape, v.shape])
            nodes = [n for n in graphs[-1].graph.nodes
                     if n.target is torch.ops.flashjit.attention_bwd.default]
            self.assertEqual(len(nodes), 1, graphs[-1].code)
            self.assertIs(bwd_argument(nodes[0], "deterministic"), det, graphs[-1].code)


class ExampleRefuses(unittest.TestCase):
    def test_no_cuda_device(self):
        """--device cpu: a clear message and exit status 2, with or without
        PyTorch and a GPU."""
        out = subprocess.run([sys.executable, EXAMPLE, "--steps", "1", "--device", "cpu"],
                             env=example_env(), capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 2, out.stdout + out.stderr)
        self.assertRegex(out.stderr, r"^gpt_train\.py: (needs PyTorch|--device cpu: flashjit "
                                     r"trains on a CUDA device)")


def load_example():
    """examples/gpt_train.py as a module (it imports without PyTorch)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("gpt_train", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class ExampleChecks(unittest.TestCase):
    """gpt_train.py's checks on made-up loss curves and gradients'
    differences (no PyTorch)."""

    NEAR = {"sdpa": {"qkv": 0.010, "head": 0.004}, "flashjit": {"qkv": 0.012, "head": 0.005}}

    def run_checks(self, fj, sdpa, f32, first=None, last=None):
        ex = load_example()
        a = ex.parse(["--steps", str(len(sdpa))])
        curves = {"sdpa": sdpa, "flashjit": fj, "float32": f32}
        return [ok for ok, _ in ex.checks(a, curves, first or self.NEAR, last or self.NEAR)]

    @staticmethod
    def fall(at, n=300, top=4.7, bottom=1.45):
        """A plateau at top, then a fall to bottom over 40 steps from step at."""
        return [top if s < at else max(bottom, top - (top - bottom) * (s - at) / 40)
                for s in range(n)]

    def test_chaotic_falls_pass(self):
        """flashjit falls 60 steps before SDPA, or 150 after (on the
        plateau at the end): the curves part by 3 nats, and every check
        passes."""
        for fj in (self.fall(150), self.fall(360)):
            self.assertEqual(self.run_checks(fj, self.fall(210), self.fall(230)),
                             [True, True, True])

    def test_wrong_gradient_fails(self):
        """One parameter's gradient 3x SDPA's difference from float32's, at
        the first step or at the trained weights, or NaN there (weights gone
        NaN after the last loss): that check fails."""
        bad = {"sdpa": {"qkv": 0.010, "head": 0.004}, "flashjit": {"qkv": 0.031, "head": 0.004}}
        c = self.fall(150)
        self.assertEqual(self.run_checks(c, c, c, first=bad), [False, True, True])
        self.assertEqual(self.run_checks(c, c, c, last=bad), [True, False, True])
        nan = {"sdpa": {"qkv": 0.010, "head": 0.004},
               "flashjit": {"qkv": float("nan"), "head": 0.004}}
        self.assertEqual(self.run_checks(c, c, c, last=nan), [True, False, True])

    def test_below_the_entropy_fails(self):
        """Below ln(branch) at the end (a mask that leaks later tokens)."""
        self.assertEqual(self.run_checks(self.fall(150, bottom=0.5), self.fall(150),
                                         self.fall(150)), [True, True, False])

    def test_interleaved_report(self):
        """The interleaved rounds' line: each run's median over the rounds
        and the median of the per-round ratios (flashjit / SDPA), which
        a drift common to both leaves alone; nothing without rounds."""
        ex = load_example()
        # The median of the ratios (1.10) is not the ratio of the medians
        # (18 / 20 = 0.90).
        line, = ex.interleaved_report([(10.0, 12.0), (20.0, 18.0), (30.0, 33.0)])
        self.assertIn("median step sdpa 20.00 ms, flashjit 18.00 ms", line)
        self.assertIn("per round 1.20 0.90 1.10, median 1.10x", line)
        self.assertEqual(ex.interleaved_report([]), [])

    @unittest.skipUnless(fjtest.HAS_TORCH and tuple(map(int, re.findall(
        r"\d+", torch.__version__)[:2])) >= (2, 4), "needs PyTorch 2.4 or later (a fused "
        "AdamW on the CPU)" if fjtest.HAS_TORCH else fjtest.NO_TORCH)
    def test_interleaved_times_on_the_cpu(self):
        """interleaved_times with two tiny copies of the SDPA model on the
        CPU (synchronisation stubbed): a (sdpa, flashjit) pair of positive
        milliseconds a round, and both models trained by its steps (their
        weights moved, alike: the same batches from the same weights)."""
        ex = load_example()
        here = os.path.dirname(EXAMPLE)
        sys.path.insert(0, here)
        self.addCleanup(sys.path.remove, here)
        # The model's module refuses to import without a GPU: its classes
        # run on the CPU all the same (the attention through SDPA).  Not
        # left in sys.modules, nor the random state changed.
        with mock.patch.object(torch.cuda, "is_available", lambda: True), \
                mock.patch.dict(sys.modules):
            import gpt_flashjit as gf
        rng = torch.random.fork_rng(devices=[])
        rng.__enter__()
        self.addCleanup(rng.__exit__, None, None, None)
        a = ex.parse(["--steps", "4", "--dim", "32", "--heads", "4", "--kv-heads", "2",
                      "--layers", "1", "--seq", "16", "--vocab", "16", "--batch", "2",
                      "--time-rounds", "3", "--time-steps", "2"])
        dev = torch.device("cpu")
        inputs, targets = ex.dataset(a, dev)
        torch.manual_seed(0)
        base = gf.GPT(gf.Config(a))
        runs = {"sdpa": base.train(), "flashjit": copy.deepcopy(base).train()}
        before = [p.detach().clone() for p in base.parameters()]
        with mock.patch.object(torch.cuda, "synchronize", lambda device=None: None):
            rounds = ex.interleaved_times(runs, inputs, targets, a, dev)
        self.assertEqual(len(rounds), 3)
        self.assertTrue(all(x > 0 for r in rounds for x in r), rounds)
        moved = [p.detach() for p in runs["sdpa"].parameters()]
        self.assertTrue(any(not torch.equal(x, y) for x, y in zip(before, moved)))
        for x, y in zip(runs["sdpa"].parameters(), runs["flashjit"].parameters()):
            self.assertTrue(torch.equal(x, y))

    def test_bad_timing_options_refused(self):
        """--time-steps below 1 or --time-rounds below 0: argparse's error
        naming them (exit 2)."""
        ex = load_example()
        for args in (["--time-steps", "0"], ["--time-rounds", "-1"]):
            with self.assertRaises(SystemExit) as cm, \
                    mock.patch("sys.stderr", new=io.StringIO()) as err:
                ex.parse(args)
            self.assertEqual(cm.exception.code, 2)
            self.assertIn("--time-rounds at least 0", err.getvalue())

    def test_not_finite_fails(self):
        """A NaN loss anywhere fails the last check."""
        c = self.fall(150)
        self.assertEqual(self.run_checks(c[:100] + [float("nan")] + c[101:], c, c),
                         [True, True, False])


def randn(*shape, dtype=None):
    return torch.randn(shape, dtype=dtype or torch.bfloat16, device="cuda")


def rel(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm().clamp(min=1e-30)).item()


@unittest.skipUnless(fjtest.HAS_CUDA, fjtest.NO_CUDA)
class Training(unittest.TestCase, DeterministicState):
    def setUp(self):
        torch.manual_seed(0)

    def test_example_against_sdpa(self):
        """examples/gpt_train.py, 20 steps: its checks pass (the
        gradients at the first step and at the trained weights beside
        SDPA's and float32's)."""
        out = subprocess.run([sys.executable, EXAMPLE, "--steps", "20", "--time-rounds", "2",
                              "--time-steps", "3"], env=example_env(),
                             capture_output=True, text=True, timeout=600)
        log = out.stdout + out.stderr
        self.assertEqual(out.returncode, 0, log)
        self.assertRegex(log, r"ok +the first step: gradients against float32's", log)
        self.assertRegex(log, r"ok +flashjit's trained weights, the last batch: gradients", log)
        self.assertIn("PASS: flashjit's gradients are as near float32's as SDPA's", log)
        self.assertRegex(log, r"interleaved \(2 rounds, steps alternating\): median step sdpa [0-9.]+ ms, "
                         r"flashjit [0-9.]+ ms; flashjit / sdpa per round [0-9.]+ [0-9.]+, median", log)

    def test_cuda_graph_training_step(self):
        """Forward, backward and SGD captured in one CUDA graph: each replay
        gives the gradients, loss and update of the same step run eagerly
        from the same weights on the same batch."""
        model = TinyAttention().cuda().to(torch.bfloat16)
        eager = copy.deepcopy(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = randn(2, 256, 256), randn(2, 256, 256)

        def step():
            loss = (model(x).float() - y.float()).square().mean()
            loss.backward()
            opt.step()
            return loss

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # compile the kernels, probe layouts, make the grads
                opt.zero_grad(set_to_none=True)
                step()
        torch.cuda.current_stream().wait_stream(side)
        opt.zero_grad(set_to_none=True)  # the graph's pool makes the grads
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_loss = step()
        for i in range(3):
            x.copy_(randn(2, 256, 256))
            y.copy_(randn(2, 256, 256))
            eager.load_state_dict(model.state_dict())
            before = {n: p.detach().clone() for n, p in eager.named_parameters()}
            graph.replay()
            eager.zero_grad(set_to_none=True)
            loss = (eager(x).float() - y.float()).square().mean()
            loss.backward()
            torch.cuda.synchronize()
            self.assertLess(abs(static_loss.item() - loss.item()), 1e-3 * loss.item(), i)
            for (name, p), e in zip(model.named_parameters(), eager.parameters()):
                self.assertLess(rel(p.grad, e.grad), 1e-2, f"replay {i}: {name}.grad")
                want = before[name].float() - 0.1 * e.grad.float()
                self.assertLess(rel(p.detach(), want), 1e-2, f"replay {i}: {name} after SGD")

    def test_compile_fullgraph_backward(self):
        """torch.compile(fullgraph=True) of attention and a loss, then
        .backward(): no graph break, eager's gradients, and the mode of
        torch.use_deterministic_algorithms reaching the backward's entry (a
        change recompiles: Dynamo guards the flag) -- through the package's
        Python ops, and through the compiled graphs' C++ ops where they are
        built (their backward asks for an entry once per mode: the C++
        table is emptied first so that it asks here)."""
        self.keep_deterministic_state()
        paths = [False] + ([True] if tr._compiled_ops() else [])
        for cpp in paths:
            with self.subTest(cpp_ops=cpp):
                if cpp:
                    torch.ops.flashjit_native.forget()
                    self.addCleanup(torch.ops.flashjit_native.forget)
                self.compiled_modes(cpp)

    def compiled_modes(self, cpp):
        modes, entry = [], tr._bwd_entry

        def spy(*args, **kwargs):
            bound = inspect.signature(entry).bind(*args, **kwargs)
            modes.append(bool(bound.arguments["deterministic"]))
            return entry(*args, **kwargs)

        def step(q, k, v):
            o = flashjit.attention(q, k, v, causal="top_left", layout="bshd")
            return o.float().square().sum()

        torch._dynamo.reset()
        compiled = torch.compile(step, fullgraph=True)
        # A shape of this test's own, so that no other test made its entries.
        q, k, v = randn(2, 192, 8, 64), randn(2, 192, 2, 64), randn(2, 192, 2, 64)
        with mock.patch.object(tr, "_bwd_entry", spy), \
                mock.patch.object(tr, "_compiled_ops", lambda: cpp):
            for det in (False, True):
                torch.use_deterministic_algorithms(det)
                del modes[:]
                got = [t.clone().requires_grad_() for t in (q, k, v)]
                compiled(*got).backward()
                self.assertIn(det, modes, f"cpp={cpp}: the backward's entries' modes {modes}")
                self.assertNotIn(not det, modes, f"cpp={cpp}")
                want = [t.clone().requires_grad_() for t in (q, k, v)]
                step(*want).backward()
                for name, g, w in zip("qkv", got, want):
                    self.assertLess(rel(g.grad, w.grad), 1e-2,
                                    f"d{name} deterministic={det} cpp={cpp}")

    def test_deterministic_bits(self):
        """Under torch.use_deterministic_algorithms(True) ten backward runs
        give the same bits, on shapes with many key tiles a query tile's dq
        sums over (where the default mode's atomics may not), and agree with
        the default mode's gradients."""
        self.keep_deterministic_state()
        cases = (((2, 8, 1024, 128), (2, 8, 1024, 128), {}),
                 ((1, 8, 2048, 64), (1, 2, 2048, 64),
                  {"sinks": torch.randn(8, device="cuda")}))
        for shape_q, shape_kv, kw in cases:
            with self.subTest(q=shape_q, kv=shape_kv, sinks="sinks" in kw):
                q, k, v = randn(*shape_q), randn(*shape_kv), randn(*shape_kv)
                dout = randn(*shape_q)
                torch.use_deterministic_algorithms(False)
                loose = self.grads(q, k, v, dout, kw)
                torch.use_deterministic_algorithms(True)
                first = self.grads(q, k, v, dout, kw)
                for run in range(9):
                    again = self.grads(q, k, v, dout, kw)
                    for name, a, b in zip(("dq", "dk", "dv", "dsinks"), first, again):
                        self.assertTrue(torch.equal(a, b), f"{name} differs in run {run + 2}")
                for name, a, b in zip(("dq", "dk", "dv", "dsinks"), first, loose):
                    self.assertLess(rel(a, b), 1e-2, f"{name}: deterministic against default")

    def test_deterministic_param_grads(self):
        """Under torch.use_deterministic_algorithms(True) the gradients of
        float params that require grad (a relative bias table read per
        element, ALiBi slopes summed per head) are bit-identical over five
        runs, as q's, k's and v's are, and agree with the default mode's
        (float32 atomics)."""
        self.keep_deterministic_state()
        q, k, v = randn(2, 8, 1024, 64), randn(2, 2, 1024, 64), randn(2, 2, 1024, 64)
        dout = randn(2, 8, 1024, 64)
        params = {"rel": 0.5 * torch.randn(8, 2047, device="cuda"),
                  "slope": torch.rand(8, device="cuda")}
        score = "s + rel(h, q - kv + 1023) + slope(h) * (float)(kv - q) * 0.01f"

        def grads():
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            ps = {n: t.clone().requires_grad_() for n, t in params.items()}
            out = flashjit.attention(*leaves, causal=True, score_mod=score, params=ps)
            return torch.autograd.grad(out, leaves + list(ps.values()), dout)

        names = ("dq", "dk", "dv", "drel", "dslope")
        torch.use_deterministic_algorithms(False)
        loose = grads()
        torch.use_deterministic_algorithms(True)
        first = grads()
        for run in range(4):
            for name, a, b in zip(names, first, grads()):
                self.assertTrue(torch.equal(a, b), f"{name} differs in run {run + 2}")
        for name, a, b in zip(names, first, loose):
            self.assertLess(rel(a, b), 1e-3 if name[1:] in params else 1e-2,
                            f"{name}: deterministic against default")

    def test_block_mask_backward(self):
        """block_mask= is differentiable: with a mask the library built from
        mask_mod, the gradients equal those of mask_mod alone (the same
        mask, every pair decided per element), eagerly and under
        torch.compile(fullgraph=True); documents under a causal mask and a
        mask of one list per query head, GQA 4:1, lengths not multiples of
        the blocks.  Under torch.use_deterministic_algorithms(True) the
        same gradients (the mma family's turns), bit-identical over three
        runs."""
        self.keep_deterministic_state()
        doc = (torch.arange(700, device="cuda") // 150).int()
        cases = (("doc(q) == doc(kv)", {"doc": doc}, "top_left", 128, 128),
                 ("(kv + h * 37) % 5 != 0 || q == kv", None, None, 64, 128))
        for mask, params, causal, bq, bkv in cases:
            with self.subTest(mask=mask):
                q, k, v = randn(1, 700, 8, 64), randn(1, 650, 2, 64), randn(1, 650, 2, 64)
                dout = randn(1, 700, 8, 64)
                kw = dict(mask_mod=mask, params=params, causal=causal, layout="bshd")
                bm = flashjit.block_mask(q, k, block_q=bq, block_kv=bkv, **kw)
                self.assertTrue(bm.has_backward)
                self.assertEqual(bm.heads, 1 if params else 8)
                want = self.masked_grads(flashjit.attention, (q, k, v), dout, kw)
                got = self.masked_grads(flashjit.attention, (q, k, v), dout,
                                        dict(kw, block_mask=bm))
                compiled = torch.compile(
                    lambda q, k, v: flashjit.attention(q, k, v, block_mask=bm, **kw),
                    fullgraph=True)
                traced = self.masked_grads(lambda *t, **_: compiled(*t), (q, k, v), dout, {})
                for name, w, g, c in zip(("dq", "dk", "dv"), want, got, traced):
                    self.assertLess(rel(g, w), 1e-2, f"{name} with the block mask")
                    self.assertLess(rel(c, w), 1e-2, f"{name} with the block mask, compiled")
                torch.use_deterministic_algorithms(True)
                det = [self.masked_grads(flashjit.attention, (q, k, v), dout,
                                         dict(kw, block_mask=bm)) for _ in range(3)]
                torch.use_deterministic_algorithms(False)
                for name, w, *runs in zip(("dq", "dk", "dv"), want, *det):
                    self.assertLess(rel(runs[0], w), 1e-2, f"{name} deterministic")
                    for r in runs[1:]:
                        self.assertTrue(torch.equal(r, runs[0]), f"{name}: deterministic runs differ")

    @staticmethod
    def masked_grads(fn, inputs, dout, kw):
        leaves = [t.clone().requires_grad_() for t in inputs]
        return torch.autograd.grad(fn(*leaves, **kw), leaves, dout)

    def grads(self, q, k, v, dout, kw):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        extra = {n: t.clone().requires_grad_() for n, t in kw.items()}
        out = flashjit.attention(*leaves, **extra)
        return torch.autograd.grad(out, leaves + list(extra.values()), dout)


if fjtest.HAS_TORCH:
    class TinyAttention(nn.Module):
        """A projection to grouped-query q, k, v (views, layout bshd),
        causal flashjit attention, a projection back."""

        def __init__(self, dim=256, heads=4, kv_heads=2, head_dim=64):
            super().__init__()
            self.h, self.hkv, self.d = heads, kv_heads, head_dim
            self.qkv = nn.Linear(dim, (heads + 2 * kv_heads) * head_dim)
            self.proj = nn.Linear(heads * head_dim, dim)

        def forward(self, x):
            b, s, _ = x.shape
            qkv = self.qkv(x).view(b, s, self.h + 2 * self.hkv, self.d)
            q, k, v = qkv.split([self.h, self.hkv, self.hkv], dim=2)
            o = flashjit.attention(q, k, v, causal="top_left", layout="bshd")
            return self.proj(o.reshape(b, s, self.h * self.d))


if __name__ == "__main__":
    unittest.main()
