"""A thin ctypes binding over include/flashjit.h, for the benchmarks.

The structs, constants and function signatures are the package's
(python/flashjit/_capi.py, the one mirror of the header, checked against
it by python/tests/test_capi.py); this file keeps the calls the benchmarks
make.  It loads libflashjit.so (cmake -DFLASHJIT_SHARED=ON).  Device
pointers are integers (tensor.data_ptr()), and the context works in the
device's primary context, which is also PyTorch's, so tensors pass straight
through.
"""
import ctypes as C
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from flashjit._capi import *  # noqa: E402,F401,F403 (structs and constants)
from flashjit._capi import open_library  # noqa: E402


def mods(score=None, mask=None, params=(), window=(-1, -1), softcap=0.0):
    """An fj_mods; params: (name, type, value) for scalars or (name, type, tensor) for
    device tensors.  The returned object keeps what its pointers point to alive."""
    m = Mods()
    m.score = score.encode() if score else None
    m.mask = mask.encode() if mask else None
    arr = (ModParam * max(1, len(params)))()
    for i, (name, ty, val) in enumerate(params):
        arr[i].name = name.encode()
        arr[i].type = ty
        if hasattr(val, "data_ptr"):
            arr[i].rank = val.dim()
            for d in range(val.dim()):
                arr[i].extents[d] = val.shape[d]
            arr[i].data = val.data_ptr()
        else:
            arr[i].value = float(val)
    m.params = arr
    m.num_params = len(params)
    m.window_left, m.window_right = window
    m.softcap = softcap
    m._keep = (arr, params)
    return m


def load(path=None):
    path = path or os.environ.get("FLASHJIT_LIB", "build/libflashjit.so")
    return open_library(os.path.abspath(path))


class Flashjit:
    """A context on a device, and the calls the benchmarks make."""

    def __init__(self, lib, device=0, cache_dir=None, jit_tiers=0):
        self.lib = lib
        o = CtxOpts()
        lib.fj_ctx_opts_init(C.byref(o))
        o.device = device
        o.jit_tiers = jit_tiers
        if cache_dir:
            o.cache_dir = cache_dir.encode()
        self.ctx = C.c_void_p()
        self.check(lib.fj_ctx_create(C.byref(self.ctx), C.byref(o)), None)

    def check(self, status, ctx="self"):
        if status != 0:
            msg = self.lib.fj_errmsg(self.ctx if ctx == "self" else None)
            raise RuntimeError(f"flashjit status {status}: {msg.decode(errors='replace')}")

    def stats(self):
        s = CacheStats()
        self.lib.fj_cache_stats_get(self.ctx, C.byref(s))
        return s

    def close(self):
        self.lib.fj_ctx_destroy(self.ctx)

    def problem(self, B, H, Hkv, Sq, Skv, D, dtype=F16, causal=CAUSAL_NONE, order=BHSD):
        p = Problem()
        self.lib.fj_problem_init(C.byref(p), B, H, Hkv, Sq, Skv, D, dtype, order)
        p.causal = causal
        return p

    def variant(self, p):
        v, frm = Variant(), C.c_int()
        self.check(self.lib.fj_attention_variant(self.ctx, C.byref(p), C.byref(v), C.byref(frm)))
        buf = C.create_string_buffer(160)
        self.lib.fj_variant_name(C.byref(v), buf, 160)
        return v, buf.value.decode(), ("tuned" if frm.value == 1 else "heuristic")

    def plan(self, p):
        pl = Plan()
        self.check(self.lib.fj_attention_plan(self.ctx, C.byref(p), C.byref(pl)))
        buf = C.create_string_buffer(160)
        self.lib.fj_variant_name(C.byref(pl.variant), buf, 160)
        return pl, buf.value.decode()

    def fwd_variant(self, p, variant, q, k, v, o, lse=None, stream=0):
        self.check(self.lib.fj_attention_fwd_variant(
            self.ctx, C.byref(p), C.byref(variant), q.data_ptr(), k.data_ptr(), v.data_ptr(),
            o.data_ptr(), lse.data_ptr() if lse is not None else None, stream or None))

    def fwd(self, p, q, k, v, o, lse=None, stream=0):
        self.check(self.lib.fj_attention_fwd(self.ctx, C.byref(p), q.data_ptr(), k.data_ptr(),
                                             v.data_ptr(), o.data_ptr(),
                                             lse.data_ptr() if lse is not None else None,
                                             stream or None))

    def block_mask(self, p, block_q, block_kv, alloc, stream=0):
        """fj_block_mask_build for p's mask: alloc(bytes) gives a device tensor for the
        lists; returns the BlockMask (which keeps that tensor alive)."""
        n = C.c_size_t()
        self.check(self.lib.fj_block_mask_size(self.ctx, C.byref(p), block_q, block_kv,
                                               C.byref(n)))
        buf = alloc(n.value)
        bm = BlockMask()
        self.check(self.lib.fj_block_mask_build(self.ctx, C.byref(p), block_q, block_kv,
                                                buf.data_ptr(), n.value, C.byref(bm),
                                                stream or None))
        bm._keep = buf
        return bm

    def resources(self, variant):
        k = C.c_void_p()
        self.check(self.lib.fj_kernel_get(self.ctx, C.byref(variant), C.byref(k)))
        r = Resources()
        self.lib.fj_kernel_resources(k, C.byref(r))
        return r

    def tune(self, p, iters=10):
        o = TuneOpts()
        self.lib.fj_tune_opts_init(C.byref(o))
        o.iters = iters
        best, rep = Variant(), TuneReport()
        self.check(self.lib.fj_tune(self.ctx, C.byref(p), C.byref(o), C.byref(best),
                                    C.byref(rep)))
        buf = C.create_string_buffer(160)
        self.lib.fj_variant_name(C.byref(best), buf, 160)
        return buf.value.decode(), rep
