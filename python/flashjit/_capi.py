"""The ctypes mirror of include/flashjit.h: constants, structs, signatures.

This is the one binding of the C API in Python; the package's modules and
bench/flashjit_ctypes.py build on it.  Every struct mirrors its C
declaration field for field, in order (python/tests/test_capi.py compiles a
C file that prints sizeof and offsetof for each and compares them, so a
header change that this file missed fails a test instead of corrupting
memory).  Enumerations are C ints.  Device pointers are plain integers
(tensor.data_ptr()).

Nothing here loads the library: open_library(path) does, and declares
every function's argument and result types on the handle it returns.
"""
import ctypes as C

# ---- status codes (FJ_STATUS_MAP) ------------------------------------------
OK = 0
ERR_INVALID_ARG = 1
ERR_UNSUPPORTED = 2
ERR_RESOURCES = 3
ERR_NO_DEVICE = 4
ERR_COMPILE_ONLY = 5
ERR_CUDA = 6
ERR_COMPILE = 7
ERR_TEMPLATE = 8
ERR_LAYOUT = 9
ERR_IO = 10
ERR_NOMEM = 11
ERR_NOT_FOUND = 12
ERR_TUNE = 13

# ---- enumerations ----------------------------------------------------------
LOG_DEBUG, LOG_INFO, LOG_WARN = 0, 1, 2
F16, BF16, E4M3, F32 = 1, 2, 3, 4
MMA_WMMA, MMA_SYNC, MMA_WGMMA = 1, 2, 3
SOFTMAX_SMEM, SOFTMAX_REGS = 1, 2
SWIZZLE_NONE, SWIZZLE_PAD, SWIZZLE_XOR = 1, 2, 3
CAUSAL_NONE, CAUSAL_TOP_LEFT, CAUSAL_BOTTOM_RIGHT = 0, 1, 2
CACHE_MISS, CACHE_MEMORY, CACHE_DISK = 0, 1, 2
BHSD, BSHD, THD = 0, 1, 2
SCALE_PER_HEAD, SCALE_PER_TENSOR = 0, 1
CHOICE_HEURISTIC, CHOICE_TUNED = 0, 1
MOD_F32, MOD_I32, MOD_F16, MOD_BF16 = 1, 2, 3, 4
LUT_PROBED, LUT_CACHED, LUT_REFERENCE = 1, 2, 3

PAGE_SIZE_MAX = 4096
MOD_PARAMS_MAX = 8
MOD_EXPR_MAX = 1024
MOD_NAME_MAX = 31
WINDOW_MAX = 1 << 30
SPLITS_MAX = 256
HEAD_DIM_MAX = 576
HEAD_DIM_V_MAX = 512
FRAG_COUNT = 17
LUT_MAX_SLOTS = 16

# ---- callbacks ---------------------------------------------------------------
LOG_FN = C.CFUNCTYPE(None, C.c_void_p, C.c_int, C.c_char_p)
PROGRESS_FN = C.CFUNCTYPE(None, C.c_void_p, C.c_size_t, C.c_size_t)


# ---- structs -------------------------------------------------------------------
class CtxOpts(C.Structure):
    _fields_ = [("device", C.c_int), ("arch", C.c_char_p), ("cache_dir", C.c_char_p),
                ("disk_cache", C.c_int), ("isolate_compile", C.c_int),
                ("log", LOG_FN), ("log_user", C.c_void_p), ("sm_count", C.c_int),
                ("jit_tiers", C.c_int), ("package_dir", C.c_char_p)]


class DeviceInfo(C.Structure):
    _fields_ = [("name", C.c_char * 96), ("ordinal", C.c_int), ("cc_major", C.c_int),
                ("cc_minor", C.c_int), ("sm_count", C.c_int),
                ("smem_optin_bytes", C.c_int), ("driver_version", C.c_int)]


VARIANT_AXES = ("head_dim", "tile_m", "tile_n", "warps", "stages", "swizzle", "softmax",
                "mma", "causal", "dtype", "kv_dtype", "pack_gqa", "split_kv", "varlen",
                "paged")


AXIS_INT, AXIS_NAMED, AXIS_SWITCH = 1, 2, 3


class AxisInfo(C.Structure):
    _fields_ = [("name", C.c_char_p), ("flag", C.c_char_p), ("kind", C.c_int),
                ("values", C.c_char_p), ("nvalues", C.c_int), ("offset", C.c_size_t),
                ("doc", C.c_char_p)]


class Variant(C.Structure):
    _fields_ = [(n, C.c_int) for n in VARIANT_AXES] + [("mods", C.c_void_p),
                                                        ("fp8_flush", C.c_int),
                                                        ("head_dim_v", C.c_int),
                                                        ("o_dtype", C.c_int),
                                                        ("table_inside", C.c_int)]


class Resources(C.Structure):
    _fields_ = [("registers", C.c_int), ("shared_static", C.c_int),
                ("shared_dynamic", C.c_int), ("spill_store_bytes", C.c_int),
                ("spill_load_bytes", C.c_int), ("local_bytes", C.c_int),
                ("threads", C.c_int), ("barriers", C.c_int), ("cubin_bytes", C.c_size_t),
                ("ptx_bytes", C.c_size_t), ("compile_ms", C.c_double), ("cache", C.c_int)]


class PrepareOpts(C.Structure):
    _fields_ = [("workers", C.c_int), ("progress", PROGRESS_FN), ("user", C.c_void_p)]


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
                ("mods", C.c_void_p), ("total_q", C.c_int), ("total_kv", C.c_int),
                ("deterministic", C.c_int), ("q_scale", C.c_void_p),
                ("head_dim_v", C.c_int), ("scale_layout", C.c_int),
                ("o_dtype", C.c_int), ("o_scale", C.c_void_p), ("o_amax", C.c_void_p),
                ("dlse", C.c_void_p)]


class ModParam(C.Structure):
    _fields_ = [("name", C.c_char_p), ("type", C.c_int), ("rank", C.c_int),
                ("extents", C.c_int64 * 4), ("data", C.c_void_p), ("value", C.c_double)]


class Mods(C.Structure):
    _fields_ = [("score", C.c_char_p), ("mask", C.c_char_p), ("params", C.POINTER(ModParam)),
                ("num_params", C.c_int), ("window_left", C.c_int), ("window_right", C.c_int),
                ("softcap", C.c_float), ("sinks", C.c_void_p),
                ("block_mask", C.c_void_p), ("checked", C.c_int),
                ("param_grads", C.c_void_p)]


class ModBuiltin(C.Structure):
    _fields_ = [("name", C.c_char_p), ("score", C.c_char_p), ("mask", C.c_char_p),
                ("params", C.c_char_p), ("field", C.c_char_p), ("about", C.c_char_p)]


class BlockMask(C.Structure):
    _fields_ = [("block_q", C.c_int), ("block_kv", C.c_int), ("batch", C.c_int),
                ("heads", C.c_int), ("q_blocks", C.c_int), ("kv_blocks", C.c_int),
                ("kv_num", C.c_void_p), ("kv_indices", C.c_void_p),
                ("full_num", C.c_void_p), ("full_indices", C.c_void_p),
                ("q_num", C.c_void_p), ("q_indices", C.c_void_p),
                ("full_q_num", C.c_void_p), ("full_q_indices", C.c_void_p)]


class Plan(C.Structure):
    # `from` in C; a Python keyword, so `choice` here.
    _fields_ = [("variant", Variant), ("choice", C.c_int), ("splits", C.c_int),
                ("rows", C.c_int), ("grid", C.c_uint * 3), ("threads", C.c_uint),
                ("smem_bytes", C.c_uint), ("blocks_per_sm", C.c_int), ("sm_count", C.c_int),
                ("combine_grid", C.c_uint * 3), ("combine_threads", C.c_uint),
                ("combine_cols", C.c_int), ("workspace_bytes", C.c_size_t)]


class BwdPlan(C.Structure):
    _fields_ = [("variant", Variant), ("grid", C.c_uint * 3), ("threads", C.c_uint),
                ("smem_bytes", C.c_uint), ("rows_grid", C.c_uint),
                ("workspace_bytes", C.c_size_t)]


class TuneOpts(C.Structure):
    _fields_ = [("iters", C.c_int), ("warmup", C.c_int), ("workers", C.c_int),
                ("save", C.c_int), ("progress", PROGRESS_FN), ("user", C.c_void_p)]


class TuneReport(C.Structure):
    _fields_ = [("candidates", C.c_int), ("refused", C.c_int), ("failed", C.c_int),
                ("wrong", C.c_int), ("timed", C.c_int), ("best_ms", C.c_double),
                ("default_ms", C.c_double), ("compile_s", C.c_double),
                ("total_s", C.c_double)]


class TuneEntry(C.Structure):
    _fields_ = [("key", C.c_char_p), ("variant", Variant), ("ms", C.c_double),
                ("default_ms", C.c_double), ("shape", C.c_char_p), ("date", C.c_char_p)]


class Lut(C.Structure):
    _fields_ = [("frag", C.c_int), ("rows", C.c_int), ("cols", C.c_int), ("lanes", C.c_int),
                ("slots", C.c_int), ("map", (C.c_uint16 * LUT_MAX_SLOTS) * 32),
                ("origin", C.c_int), ("device", C.c_char * 96)]


class CacheStats(C.Structure):
    _fields_ = [("memory_hits", C.c_uint64), ("disk_hits", C.c_uint64),
                ("misses", C.c_uint64), ("disk_writes", C.c_uint64),
                ("disk_rejects", C.c_uint64), ("disk_errors", C.c_uint64),
                ("disk_enabled", C.c_int), ("first_launches", C.c_uint64),
                ("background_compiles", C.c_uint64), ("package_hits", C.c_uint64)]


class CacheEntry(C.Structure):
    _fields_ = [("file", C.c_char_p), ("kind", C.c_char_p), ("label", C.c_char_p),
                ("bytes", C.c_uint64), ("mtime", C.c_int64), ("valid", C.c_int)]


class PrewarmReport(C.Structure):
    _fields_ = [(n, C.c_int) for n in ("variants", "kernels", "compiled", "cached", "failed")]


class PackageReport(C.Structure):
    _fields_ = [("entries", C.c_int), ("bytes", C.c_uint64), ("probe", C.c_int)]


class CachePackReport(C.Structure):
    _fields_ = [(n, C.c_int) for n in ("entries", "skipped", "installed", "present", "kept")]


TUNE_VISIT_FN = C.CFUNCTYPE(C.c_int, C.c_void_p, C.POINTER(TuneEntry))
CACHE_VISIT_FN = C.CFUNCTYPE(C.c_int, C.c_void_p, C.POINTER(CacheEntry))

# The C name of each struct above, for the layout test.
C_NAMES = {AxisInfo: "fj_axis_info", CtxOpts: "fj_ctx_opts", DeviceInfo: "fj_device_info", Variant: "fj_variant",
           Resources: "fj_resources", PrepareOpts: "fj_prepare_opts", Problem: "fj_problem",
           ModParam: "fj_mod_param", Mods: "fj_mods", ModBuiltin: "fj_mod_builtin",
           BlockMask: "fj_block_mask", Plan: "fj_plan", BwdPlan: "fj_bwd_plan",
           TuneOpts: "fj_tune_opts", TuneReport: "fj_tune_report", TuneEntry: "fj_tune_entry",
           Lut: "fj_lut", CacheStats: "fj_cache_stats", CacheEntry: "fj_cache_entry",
           PrewarmReport: "fj_prewarm_report", CachePackReport: "fj_cache_pack_report",
           PackageReport: "fj_package_report"}
# Fields renamed here (the C name is a Python keyword).
C_FIELD_NAMES = {(Plan, "choice"): "from"}

# ---- functions -------------------------------------------------------------------
_P, _VP, _I, _S = C.POINTER, C.c_void_p, C.c_int, C.c_size_t
_STR = C.c_char_p
SIGNATURES = {
    "fj_status_str": (_STR, [_I]),
    "fj_version": (_STR, []),
    "fj_abi_version": (_I, []),
    "fj_ctx_opts_init": (None, [_P(CtxOpts)]),
    "fj_ctx_create": (_I, [_P(_VP), _P(CtxOpts)]),
    "fj_ctx_destroy": (None, [_VP]),
    "fj_ctx_tiers_wait": (_I, [_VP]),
    "fj_errmsg": (_STR, [_VP]),
    "fj_ctx_arch": (_STR, [_VP]),
    "fj_ctx_has_device": (_I, [_VP]),
    "fj_device_get": (_I, [_VP, _P(DeviceInfo)]),
    "fj_variant_default": (None, [_P(Variant), _I, _I, _I]),
    "fj_variant_check": (_I, [_VP, _P(Variant)]),
    "fj_variant_name": (_I, [_P(Variant), _STR, _S]),
    "fj_dtype_name": (_STR, [_I]),
    "fj_mma_name": (_STR, [_I]),
    "fj_softmax_name": (_STR, [_I]),
    "fj_swizzle_name": (_STR, [_I]),
    "fj_causal_name": (_STR, [_I]),
    "fj_axis_count": (_I, []),
    "fj_axis_get": (_I, [_I, _P(AxisInfo)]),
    "fj_axis_value_name": (_STR, [_I, _I]),
    "fj_axis_value": (_I, [_I, _STR]),
    "fj_kernel_get": (_I, [_VP, _P(Variant), _P(_VP)]),
    "fj_kernel_get_first": (_I, [_VP, _P(Variant), _P(_VP)]),
    "fj_kernel_source": (_VP, [_VP, _P(_S)]),
    "fj_kernel_ptx": (_VP, [_VP, _P(_S)]),
    "fj_kernel_cubin": (_VP, [_VP, _P(_S)]),
    "fj_kernel_log": (_STR, [_VP]),
    "fj_kernel_name": (_STR, [_VP]),
    "fj_kernel_resources": (None, [_VP, _P(Resources)]),
    "fj_kernel_prepare": (_I, [_VP, _P(Variant), _S, _P(PrepareOpts), _P(_I)]),
    "fj_mods_init": (None, [_P(Mods)]),
    "fj_mods_check": (_I, [_P(Mods)]),
    "fj_mod_builtins": (_P(ModBuiltin), [_P(_I)]),
    "fj_mod_builtin_find": (_P(ModBuiltin), [_STR]),
    "fj_block_mask_size": (_I, [_VP, _P(Problem), _I, _I, _P(_S)]),
    "fj_block_mask_build": (_I, [_VP, _P(Problem), _I, _I, _VP, _S, _P(BlockMask), _VP]),
    "fj_problem_init": (None, [_P(Problem)] + [_I] * 8),
    "fj_problem_check": (_I, [_VP, _P(Problem)]),
    "fj_problem_check_lengths": (_I, [_P(Problem)]),
    "fj_attention_variant": (_I, [_VP, _P(Problem), _P(Variant), _P(_I)]),
    "fj_attention_plan": (_I, [_VP, _P(Problem), _P(Plan)]),
    "fj_attention_workspace_size": (_I, [_VP, _P(Problem), _P(_S)]),
    "fj_attention_fwd": (_I, [_VP, _P(Problem), _VP, _VP, _VP, _VP, _VP, _VP]),
    "fj_attention_bwd_plan": (_I, [_VP, _P(Problem), _P(BwdPlan)]),
    "fj_attention_bwd_prefetch": (_I, [_VP, _P(Problem)]),
    "fj_attention_bwd_kernel": (_I, [_VP, _P(Problem), _P(BwdPlan), _I, _P(_VP)]),
    "fj_rel_table_kernel": (_I, [_VP, _P(Problem), _P(_VP)]),
    "fj_attention_bwd": (_I, [_VP, _P(Problem), _VP, _VP, _VP, _VP, _VP, _VP, _VP, _VP, _VP,
                              _VP, _VP]),
    "fj_attention_bwd_run": (_I, [_VP, _P(Problem), _P(BwdPlan), _VP, _VP, _VP, _VP, _VP,
                                  _VP, _VP, _VP, _VP, _VP, _VP, _S, _VP]),
    "fj_attention_fwd_plan": (_I, [_VP, _P(Problem), _P(Plan), _VP, _VP, _VP, _VP, _VP,
                                   _VP, _S, _VP]),
    "fj_attention_fwd_variant": (_I, [_VP, _P(Problem), _P(Variant), _VP, _VP, _VP, _VP,
                                      _VP, _VP]),
    "fj_attention_merge": (_I, [_VP, _P(Problem), _I, _VP, _VP, _VP, _VP, _VP]),
    "fj_launch_record": (None, [_VP]),
    "fj_reference_fwd": (_I, [_P(Problem), _VP, _VP, _VP, _VP, _VP, _I, _I, _VP, _VP]),
    "fj_reference_bwd": (_I, [_P(Problem), _VP, _VP, _VP, _VP, _VP, _VP, _VP, _VP]),
    "fj_reference_merge": (_I, [_P(Problem), _I, _VP, _VP, _VP, _VP]),
    "fj_convert": (_I, [_I, _VP, _I, _VP, _S]),
    "fj_tune_opts_init": (None, [_P(TuneOpts)]),
    "fj_tune": (_I, [_VP, _P(Problem), _P(TuneOpts), _P(Variant), _P(TuneReport)]),
    "fj_tune_bwd": (_I, [_VP, _P(Problem), _P(TuneOpts), _P(BwdPlan), _P(TuneReport)]),
    "fj_tune_list": (_I, [_VP, TUNE_VISIT_FN, _VP]),
    "fj_layout_get": (_I, [_VP, _I, _P(Lut)]),
    "fj_frag_name": (_STR, [_I]),
    "fj_cache_dir": (_STR, [_VP]),
    "fj_cache_stats_get": (None, [_VP, _P(CacheStats)]),
    "fj_cache_list": (_I, [_VP, CACHE_VISIT_FN, _VP]),
    "fj_cache_clear": (_I, [_VP, _P(_I)]),
    "fj_cache_prune": (_I, [_VP, _P(_I)]),
    "fj_cache_prewarm": (_I, [_VP, _P(Variant), _S, _P(PrepareOpts), _P(_I),
                              _P(PrewarmReport)]),
    "fj_cache_prewarm_bwd": (_I, [_VP, _P(Problem), _S, _P(PrepareOpts), _P(_I),
                                  _P(PrewarmReport)]),
    "fj_cache_export": (_I, [_VP, _STR, _P(CachePackReport)]),
    "fj_cache_import": (_I, [_VP, _STR, _P(CachePackReport)]),
    "fj_cache_import_ex": (_I, [_VP, _STR, C.c_uint, _P(CachePackReport)]),
    "fj_cache_package_dir": (_STR, [_VP]),
    "fj_cache_package_seal": (_I, [_VP, _P(PackageReport)]),
}


# FJ_ABI_VERSION of the header these structs mirror.
ABI_VERSION = 13


def open_library(path):
    """Loads libflashjit.so from path and declares every function's types.
    Raises OSError where the file cannot be loaded, and AttributeError naming
    a function the library lacks or a struct layout (ABI) other than this
    binding's."""
    lib = C.CDLL(path)
    for name, (res, args) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    abi = lib.fj_abi_version()
    if abi != ABI_VERSION:
        raise AttributeError(f"its structs are ABI {abi}; this binding mirrors ABI "
                             f"{ABI_VERSION}: rebuild the library and the package together")
    return lib
