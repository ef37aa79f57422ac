"""train_host_cpu.py -- the Python package's host time per training call,
without a GPU: flashjit.attention's forward with grad, and forward +
torch.autograd.grad, on CPU tensors with the library's launching calls
stubbed (as python/tests/test_calls.py does) and the training ops given
CPU kernels, so that only the package's and PyTorch's host work is
timed.  Beside them the same call without grad (the cached call).  Best
of 20 rounds of 300 calls, microseconds a call (a process of a busy
machine may run all of them slow: compare the best of a few processes).

    FLASHJIT_LIB=build/libflashjit.so python3 bench/train_host_cpu.py [--native]

--native: the training calls' repeats through the C++ training call
(libflashjit_torch.so, _native.py), and the compiled graph's through its
C++ ops (csrc/compiled.cpp), their launching calls no-op C callbacks
(each one a ctypes callback's cost, which the library's own functions do
not have).  The last case, "compiled: forward + autograd.grad", is the
call in a torch.compile'd function (aot_eager: the graph as AOTAutograd
makes it, no code generated), the package's Python ops without --native.

Needs PyTorch (any build).  The figures are this machine's host time,
not a GPU's: on a GPU machine the launches add their own.
"""
import os
import sys
import time
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import torch  # noqa: E402

import flashjit  # noqa: E402
from flashjit import _args as ar, _calls as calls, _core as core, _train as tr  # noqa: E402
from flashjit import _native as native  # noqa: E402


class _Null:
    """Every launching call: returns 0 (FJ_OK) and does nothing."""

    def __getattr__(self, name):
        return lambda *args: 0


def main():
    ctx = core.arch_context("sm_90a")
    for obj, name, value in (
            (calls, "_fns", _Null()), (calls, "context", lambda index: ctx),
            (calls, "stream", lambda index: 77), (calls, "capturing", lambda: False),
            (calls, "ones_of", lambda dev, b, h: torch.ones(b, h)),
            (calls, "prefetch_bwd", lambda e: 0), (ar, "_device_error", lambda *a: None)):
        mock.patch.object(obj, name, value).start()
    if "--native" in sys.argv:
        if not native.available():
            sys.exit(f"train_host_cpu: no C++ training call: {native.why}")
        import ctypes as C
        V = C.c_void_p
        cbs = [C.CFUNCTYPE(C.c_int, *[V] * n)(lambda *a: 0) for n in (8, 11, 13, 16)]
        cbs.append(C.CFUNCTYPE(C.c_int, V, C.POINTER(C.c_int))(lambda s, st: 0))
        fns = dict(zip(("fj_attention_fwd", "fj_attention_fwd_plan", "fj_attention_bwd",
                        "fj_attention_bwd_run", "capturing"), (C.cast(f, V).value for f in cbs)))
        fns["fj_errmsg"] = native._FNS["fj_errmsg"]
        mock.patch.object(native, "launchers", lambda: fns).start()
        mock.patch.object(native, "CPU_OPS", True).start()
    # The ops' CPU kernels: where torch.compile or a caller reaches them.
    tr.attention_train_op.register_kernel("cpu")(tr._attention_train)
    tr.attention_bwd_op.register_kernel("cpu")(tr._attention_bwd)
    tr.attention_train_mods_op.register_kernel("cpu")(tr._attention_train_mods)
    tr.attention_bwd_mods_op.register_kernel("cpu")(tr._attention_bwd_mods)
    bf = torch.bfloat16
    # One layer of examples/gpt_train.py: batch 2, 8/2 heads, 512, head dim 64.
    q = torch.randn(2, 8, 512, 64, dtype=bf, requires_grad=True)
    k = torch.randn(2, 2, 512, 64, dtype=bf, requires_grad=True)
    v = torch.randn(2, 2, 512, 64, dtype=bf, requires_grad=True)
    g = torch.ones(2, 8, 512, 64, dtype=bf)

    def no_grad():
        with torch.no_grad():
            flashjit.attention(q, k, v, causal="top_left")

    def fwd():
        flashjit.attention(q, k, v, causal="top_left")

    def fwd_bwd():
        out = flashjit.attention(q, k, v, causal="top_left")
        torch.autograd.grad(out, (q, k, v), g)

    compiled_attn = torch.compile(lambda a, b, c: flashjit.attention(a, b, c, causal="top_left"),
                                  backend="aot_eager", fullgraph=True)

    def compiled():
        torch.autograd.grad(compiled_attn(q, k, v), (q, k, v), g)

    # Issue 33's document case in small: a mask expression over a tensor
    # parameter and a block mask with its transposed lists.
    doc = torch.zeros(512, dtype=torch.int32)
    z = [torch.zeros(sh, dtype=torch.int32) for sh in ((1, 1, 4), (1, 1, 4, 4))]
    bm = flashjit.BlockMask(z[0], z[1], z[0].clone(), z[1].clone(), q_num=z[0].clone(),
                            q_indices=z[1].clone(), full_q_num=z[0].clone(),
                            full_q_indices=z[1].clone())
    doc_kw = dict(causal="top_left", mask_mod="doc(q) == doc(kv)", params={"doc": doc},
                  block_mask=bm)

    def doc_no_grad():
        with torch.no_grad():
            flashjit.attention(q, k, v, **doc_kw)

    def doc_fwd():
        flashjit.attention(q, k, v, **doc_kw)

    def doc_fwd_bwd():
        out = flashjit.attention(q, k, v, **doc_kw)
        torch.autograd.grad(out, (q, k, v), g)

    for name, f in (("forward, no grad", no_grad), ("forward with grad", fwd),
                    ("forward + autograd.grad", fwd_bwd),
                    ("documents: forward, no grad", doc_no_grad),
                    ("documents: forward with grad", doc_fwd),
                    ("documents: forward + autograd.grad", doc_fwd_bwd),
                    ("compiled: forward + autograd.grad", compiled)):
        for _ in range(5):
            f()
        best = float("inf")
        for _ in range(20):
            t = time.perf_counter()
            for _ in range(300):
                f()
            best = min(best, (time.perf_counter() - t) / 300 * 1e6)
        print(f"{name}: {best:.1f} us")


if __name__ == "__main__":
    main()
