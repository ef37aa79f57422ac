"""A thin ctypes binding over include/flashjit.h, for the benchmarks.

It loads libflashjit.so (cmake -DFLASHJIT_SHARED=ON) and mirrors the public
structs field for field.  Device pointers are integers (tensor.data_ptr()),
and the context works in the device's primary context, which is also
PyTorch's, so tensors pass straight through.
"""
import ctypes as C
import os

F16, BF16, E4M3, F32 = 1, 2, 3, 4
CAUSAL_NONE, CAUSAL_TOP_LEFT, CAUSAL_BOTTOM_RIGHT = 0, 1, 2
BHSD, BSHD, THD = 0, 1, 2

LOG_FN = C.CFUNCTYPE(None, C.c_void_p, C.c_int, C.c_char_p)
PROGRESS_FN = C.CFUNCTYPE(None, C.c_void_p, C.c_size_t, C.c_size_t)


class CtxOpts(C.Structure):
    _fields_ = [("device", C.c_int), ("arch", C.c_char_p), ("cache_dir", C.c_char_p),
                ("disk_cache", C.c_int), ("isolate_compile", C.c_int),
                ("log", LOG_FN), ("log_user", C.c_void_p), ("sm_count", C.c_int)]


class Variant(C.Structure):
    _fields_ = [(n, C.c_int) for n in ("head_dim", "tile_m", "tile_n", "warps", "stages",
                                       "swizzle", "softmax", "mma", "causal", "dtype",
                                       "kv_dtype", "pack_gqa", "split_kv", "varlen",
                                       "paged")] + [("mods", C.c_void_p)]


class Problem(C.Structure):
    _fields_ = [("batch", C.c_int), ("heads_q", C.c_int), ("heads_kv", C.c_int),
                ("seq_q", C.c_int), ("seq_kv", C.c_int), ("head_dim", C.c_int),
                ("dtype", C.c_int), ("kv_dtype", C.c_int), ("causal", C.c_int),
                ("scale", C.c_float), ("q_stride", C.c_int64 * 3),
                ("k_stride", C.c_int64 * 3), ("v_stride", C.c_int64 * 3),
                ("o_stride", C.c_int64 * 3), ("k_scale", C.c_void_p),
                ("v_scale", C.c_void_p), ("splits", C.c_int),
                ("cu_seqlens_q", C.c_void_p), ("cu_seqlens_kv", C.c_void_p),
                ("seqused_kv", C.c_void_p), ("block_table", C.c_void_p),
                ("max_pages", C.c_int), ("page_size", C.c_int), ("num_pages", C.c_int),
                ("mods", C.c_void_p), ("total_q", C.c_int), ("total_kv", C.c_int)]


MOD_F32, MOD_I32, MOD_F16, MOD_BF16 = 1, 2, 3, 4


class ModParam(C.Structure):
    _fields_ = [("name", C.c_char_p), ("type", C.c_int), ("rank", C.c_int),
                ("extents", C.c_int64 * 4), ("data", C.c_void_p), ("value", C.c_double)]


class Mods(C.Structure):
    _fields_ = [("score", C.c_char_p), ("mask", C.c_char_p), ("params", C.POINTER(ModParam)),
                ("num_params", C.c_int), ("window_left", C.c_int), ("window_right", C.c_int),
                ("softcap", C.c_float)]


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


class Plan(C.Structure):
    _fields_ = [("variant", Variant), ("choice", C.c_int), ("splits", C.c_int),
                ("rows", C.c_int), ("grid", C.c_uint * 3), ("threads", C.c_uint),
                ("smem_bytes", C.c_uint), ("blocks_per_sm", C.c_int), ("sm_count", C.c_int),
                ("combine_grid", C.c_uint * 3), ("combine_threads", C.c_uint),
                ("workspace_bytes", C.c_size_t)]


class Resources(C.Structure):
    _fields_ = [("registers", C.c_int), ("shared_static", C.c_int),
                ("shared_dynamic", C.c_int), ("spill_store_bytes", C.c_int),
                ("spill_load_bytes", C.c_int), ("local_bytes", C.c_int),
                ("threads", C.c_int), ("barriers", C.c_int), ("cubin_bytes", C.c_size_t),
                ("ptx_bytes", C.c_size_t), ("compile_ms", C.c_double), ("cache", C.c_int)]


class TuneOpts(C.Structure):
    _fields_ = [("iters", C.c_int), ("warmup", C.c_int), ("workers", C.c_int),
                ("save", C.c_int), ("progress", PROGRESS_FN), ("user", C.c_void_p)]


class TuneReport(C.Structure):
    _fields_ = [("candidates", C.c_int), ("refused", C.c_int), ("failed", C.c_int),
                ("wrong", C.c_int), ("timed", C.c_int), ("best_ms", C.c_double),
                ("default_ms", C.c_double), ("compile_s", C.c_double),
                ("total_s", C.c_double)]


def load(path=None):
    path = path or os.environ.get("FLASHJIT_LIB", "build/libflashjit.so")
    lib = C.CDLL(os.path.abspath(path))
    P, VP = C.POINTER, C.c_void_p
    sig = {
        "fj_ctx_opts_init": (None, [P(CtxOpts)]),
        "fj_ctx_create": (C.c_int, [P(VP), P(CtxOpts)]),
        "fj_ctx_destroy": (None, [VP]),
        "fj_errmsg": (C.c_char_p, [VP]),
        "fj_problem_init": (None, [P(Problem)] + [C.c_int] * 8),
        "fj_attention_fwd": (C.c_int, [VP, P(Problem), VP, VP, VP, VP, VP, VP]),
        "fj_attention_fwd_variant": (C.c_int, [VP, P(Problem), P(Variant), VP, VP, VP,
                                               VP, VP, VP]),
        "fj_attention_variant": (C.c_int, [VP, P(Problem), P(Variant), P(C.c_int)]),
        "fj_attention_plan": (C.c_int, [VP, P(Problem), P(Plan)]),
        "fj_variant_name": (C.c_int, [P(Variant), C.c_char_p, C.c_size_t]),
        "fj_kernel_get": (C.c_int, [VP, P(Variant), P(VP)]),
        "fj_kernel_resources": (None, [VP, P(Resources)]),
        "fj_tune_opts_init": (None, [P(TuneOpts)]),
        "fj_tune": (C.c_int, [VP, P(Problem), P(TuneOpts), P(Variant), P(TuneReport)]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


class Flashjit:
    """A context on a device, and the calls the benchmarks make."""

    def __init__(self, lib, device=0, cache_dir=None):
        self.lib = lib
        o = CtxOpts()
        lib.fj_ctx_opts_init(C.byref(o))
        o.device = device
        if cache_dir:
            o.cache_dir = cache_dir.encode()
        self.ctx = C.c_void_p()
        self.check(lib.fj_ctx_create(C.byref(self.ctx), C.byref(o)), None)

    def check(self, status, ctx="self"):
        if status != 0:
            msg = self.lib.fj_errmsg(self.ctx if ctx == "self" else None)
            raise RuntimeError(f"flashjit status {status}: {msg.decode(errors='replace')}")

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
