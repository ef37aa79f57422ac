"""Python values to the C structs: names of enumerations, problems, mods.

Spellings follow the CLI (fj_*_name): dtypes "f16" "bf16" "e4m3" (dtype
"e4m3": Q, K and V in FP8, O in bf16, the wgmma family), families
"wgmma" "mma" "wmma", swizzles "none" "pad" "xor", softmax "smem" "regs",
causal masks None, "top_left", "bottom_right" (dashes accepted too, and True
for PyTorch's is_causal, which is top-left).  Every refusal is one line that
names the argument, the value and what is allowed.
"""
import ctypes as C
from collections import namedtuple

from . import _capi as capi

DTYPES = {"f16": capi.F16, "float16": capi.F16, "fp16": capi.F16, "half": capi.F16,
          "bf16": capi.BF16, "bfloat16": capi.BF16, "e4m3": capi.E4M3,
          "fp8_e4m3": capi.E4M3, "float8_e4m3fn": capi.E4M3}
MMAS = {"wmma": capi.MMA_WMMA, "mma": capi.MMA_SYNC, "wgmma": capi.MMA_WGMMA}
SWIZZLES = {"none": capi.SWIZZLE_NONE, "pad": capi.SWIZZLE_PAD, "xor": capi.SWIZZLE_XOR}
SOFTMAXES = {"smem": capi.SOFTMAX_SMEM, "regs": capi.SOFTMAX_REGS}
CAUSALS = {"none": capi.CAUSAL_NONE, "top_left": capi.CAUSAL_TOP_LEFT,
           "bottom_right": capi.CAUSAL_BOTTOM_RIGHT}
LAYOUTS = {"bhsd": capi.BHSD, "bshd": capi.BSHD}
NAMES_LAYOUT = {v: k for k, v in LAYOUTS.items()}
NAMES = {"dtype": {capi.F16: "f16", capi.BF16: "bf16", capi.E4M3: "e4m3"},
         "mma": {v: k for k, v in MMAS.items()},
         "swizzle": {v: k for k, v in SWIZZLES.items()},
         "softmax": {v: k for k, v in SOFTMAXES.items()},
         "causal": {v: k for k, v in CAUSALS.items()}}
MOD_TYPES = {"f32": capi.MOD_F32, "float32": capi.MOD_F32, "i32": capi.MOD_I32,
             "int32": capi.MOD_I32, "f16": capi.MOD_F16, "float16": capi.MOD_F16,
             "bf16": capi.MOD_BF16, "bfloat16": capi.MOD_BF16}


_axes = None


def axes():
    """The variant's tunable axes as the library's table has them
    (FJ_VARIANT_AXES through fj_axis_get): a tuple of (name, kind, names),
    names mapping each value's name to its value (named axes; else {})."""
    global _axes
    if _axes is None:
        from . import _core as core
        lib, rows = core.lib(), []
        for i in range(lib.fj_axis_count()):
            a = capi.AxisInfo()
            lib.fj_axis_get(i, C.byref(a))
            names = a.values.decode().split("|") if a.nvalues else []
            rows.append((a.name.decode(), a.kind, {n: v + 1 for v, n in enumerate(names)}))
        _axes = tuple(rows)
    return _axes


def axis_values(axis):
    """A named axis's {value name: value}, from the library's table."""
    return next(names for name, _, names in axes() if name == axis)


def _allowed(table):
    return ", ".join(sorted(set(table)))


def choose(what, value, table):
    """table[value], or a ValueError naming what, the value and the choices."""
    if isinstance(value, str):
        key = value.lower().replace("-", "_")
        if key in table:
            return table[key]
    raise ValueError(f"flashjit: {what}={value!r} is not one of {_allowed(table)}")


def dtype_code(value, what="dtype", table=DTYPES):
    """A dtype from a name or a torch.dtype (str(torch.bfloat16) is
    'torch.bfloat16')."""
    if not isinstance(value, str) and type(value).__name__ == "dtype":
        value = str(value).replace("torch.", "")
    if isinstance(value, str) and value.lower().replace("torch.", "") in table:
        return table[value.lower().replace("torch.", "")]
    raise ValueError(f"flashjit: {what}={value!r} is not one of {_allowed(table)}")


def causal_code(value):
    if value is None or value is False:
        return capi.CAUSAL_NONE
    if value is True:
        return capi.CAUSAL_TOP_LEFT
    if isinstance(value, str):
        return choose("causal", value, CAUSALS)
    raise ValueError(f"flashjit: causal={value!r} is not one of None, 'top_left', "
                     "'bottom_right' (True means 'top_left', PyTorch's is_causal)")


INT32_MIN, INT32_MAX = -2 ** 31, 2 ** 31 - 1
INT64_MIN, INT64_MAX = -2 ** 63, 2 ** 63 - 1
FLT_MAX = 3.4028234663852886e38   # the largest finite float32
FLT_MIN = 1.1754943508222875e-38  # the smallest normal float32
FLT_TRUE_MIN = 1.401298464324817e-45  # the smallest denormal float32


def int_arg(what, value, lo=None, bits=32):
    """An int for a C int (bits=32) or int64_t (64): ctypes would keep
    only its low bits (2**32 + 128 becomes 128), so a value outside the C
    type is refused here, named as the caller gave it."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"flashjit: {what} must be an int, not {value!r}")
    if lo is not None and value < lo:
        raise ValueError(f"flashjit: {what}={value} is below {lo}")
    cmin, cmax = (INT32_MIN, INT32_MAX) if bits == 32 else (INT64_MIN, INT64_MAX)
    if not cmin <= value <= cmax:
        raise ValueError(f"flashjit: {what}={value} does not fit a C int{bits}_t "
                         f"({cmin}..{cmax})")
    return value


def float32_arg(what, value, zero_ok=True):
    """A number for a C float: finite, at most FLT_MAX in magnitude, and
    not so small that float32 turns it into 0 or a denormal (softcap=1e-50
    would become 0, no softcap) -- refused, named as the caller gave it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"flashjit: {what} must be a number, not {value!r}")
    try:
        f = float(value)
    except OverflowError:  # an int past float's range
        raise ValueError(f"flashjit: {what}={value!r} is not a finite float32 "
                         f"(|value| at most {FLT_MAX:g})") from None
    if f != f or f in (float("inf"), float("-inf")):
        return f  # the library refuses these itself, naming them
    if not abs(f) <= FLT_MAX:
        raise ValueError(f"flashjit: {what}={value!r} is not a finite float32 "
                         f"(|value| at most {FLT_MAX:g})")
    if f != 0 and abs(f) < FLT_MIN:
        raise ValueError(f"flashjit: {what}={value!r} is below float32's smallest normal "
                         f"number {FLT_MIN:g} (it would become 0 or a denormal)")
    if f == 0 and not zero_ok:
        raise ValueError(f"flashjit: {what}={value!r} must not be 0")
    return f


def c_string(what, text):
    """text as the bytes of a C string: a NUL inside would end it there,
    so it is refused."""
    if not isinstance(text, str):
        raise TypeError(f"flashjit: {what} must be a str, not {text!r}")
    if "\0" in text:
        raise ValueError(f"flashjit: {what}={text!r} holds a NUL character at index "
                         f"{text.index(chr(0))}; a C string would end there")
    return text.encode()


def scale_value(scale):
    if scale is None:
        return 0.0
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"flashjit: scale must be a float or None, not {scale!r}")
    if scale == 0:
        # The library reads 0 as "the default"; a caller who wrote 0 did not
        # mean 1/sqrt(head_dim).
        raise ValueError("flashjit: scale=0 would zero every score; None gives "
                         "1/sqrt(head_dim)")
    return float32_arg("scale", scale)


def scalar_param(name, value):
    """A scalar parameter's (type, value): an int is i32 (in its range), a
    float f32 (finite, in float32's range)."""
    if isinstance(value, int):
        if not INT32_MIN <= value <= INT32_MAX:
            raise ValueError(f"flashjit: params[{name!r}]={value} is not an i32 "
                             f"({INT32_MIN}..{INT32_MAX}); pass a float for f32")
        return capi.MOD_I32, float(value)
    f = float(value)
    if not abs(f) <= FLT_MAX:
        raise ValueError(f"flashjit: params[{name!r}]={value!r} is not a finite float32 "
                         f"(|value| at most {FLT_MAX:g})")
    # A denormal keeps its meaning in the kernel (src/mods.c); a value that
    # float32 rounds to 0 (at most half the smallest denormal) would not.
    if f != 0 and abs(f) <= FLT_TRUE_MIN / 2:
        raise ValueError(f"flashjit: params[{name!r}]={value!r} would be 0 as a float32 "
                         f"(|value| at least {FLT_TRUE_MIN:g}, float32's smallest "
                         f"denormal, or 0)")
    return capi.MOD_F32, f


def variant_dict(v):
    """An fj_variant as a dict of axis -> value, enumerations by name."""
    out = {}
    for axis in capi.VARIANT_AXES:
        value = getattr(v, axis)
        if axis == "kv_dtype":
            value = value or v.dtype
        table = NAMES.get("dtype" if axis == "kv_dtype" else axis)
        out[axis] = table.get(value, "?") if table else value
    return out


def variant_name(lib, v):
    n = lib.fj_variant_name(C.byref(v), None, 0)
    buf = C.create_string_buffer(n + 1)
    lib.fj_variant_name(C.byref(v), buf, n + 1)
    return buf.value.decode()


# ---- modifications ---------------------------------------------------------------

TensorParam = namedtuple("TensorParam", "dtype shape")
TensorParam.__doc__ = """A tensor parameter described by its dtype ("f32", "f16",
"bf16", "i32") and shape, for inspection without a tensor: Kernel(...,
params={"slopes": TensorParam("f32", (16,))}).  attention() takes tensors."""

# What a described tensor points at: inspection compiles and plans with
# it, never reads it.
_PLACEHOLDER = (C.c_int64 * 2)()


class ModsArg:
    """The fj_mods of the keyword arguments, with everything its pointers
    point at kept alive as long as this object.  .ptr is its address, or
    None where no modification is on (the problem's mods stay NULL)."""

    def __init__(self, window=None, softcap=None, score_mod=None, mask_mod=None,
                 params=None, device=None, sinks=None, block_mask=None, checked=False):
        self.keep = []
        self.mods = capi.Mods(None, None, None, 0, -1, -1, 0.0)
        on = self._window(window) | self._softcap(softcap) | self._sinks(sinks)
        on |= self._expr("score", "score_mod", score_mod)
        on |= self._expr("mask", "mask_mod", mask_mod)
        on |= self._params(params, device)
        on |= self._block_mask(block_mask) | self._checked(checked)
        self.ptr = C.addressof(self.mods) if on else None

    def _window(self, window):
        if window is None:
            return False
        if not isinstance(window, (tuple, list)) or len(window) != 2:
            raise ValueError(f"flashjit: window={window!r} must be a pair (left, right); "
                             "-1 leaves a side unbounded")
        left = int_arg("window[0]", window[0])
        right = int_arg("window[1]", window[1])
        self.mods.window_left, self.mods.window_right = left, right
        return (left, right) != (-1, -1)

    def _softcap(self, softcap):
        if softcap is None:
            return False
        if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
            raise TypeError(f"flashjit: softcap must be a number or None, not {softcap!r}")
        self.mods.softcap = float32_arg("softcap", softcap)
        return softcap != 0

    def _sinks(self, sinks):
        """sinks: a checked float32 tensor of heads_q logits (attention()
        checks it), kept alive with the struct; True for inspection (on,
        with a placeholder the kernels are compiled for, never read)."""
        if sinks is None or sinks is False:
            return False
        if sinks is True:
            self.mods.sinks = C.addressof(_PLACEHOLDER)
            return True
        self.keep.append(sinks)
        self.mods.sinks = sinks.data_ptr()
        return True

    def _block_mask(self, bm):
        """bm: a filled capi.BlockMask (its arrays kept alive by the
        caller), kept alive with the struct."""
        if bm is None:
            return False
        self.keep.append(bm)
        self.mods.block_mask = C.addressof(bm)
        return True

    def _checked(self, checked):
        if checked is None or checked is False:
            return False
        if checked is not True:
            raise TypeError(f"flashjit: checked must be True or False, not {checked!r}")
        self.mods.checked = 1
        return True

    def _expr(self, field, what, text):
        if text is None or text == "":
            return False
        if not isinstance(text, str):
            raise TypeError(f"flashjit: {what} must be a C expression in a str, not {text!r}")
        raw = c_string(what, text)
        self.keep.append(raw)
        setattr(self.mods, field, raw)
        return True

    def _params(self, params, device):
        if not params:
            return False
        if not isinstance(params, dict):
            raise TypeError(f"flashjit: params must be a dict of name -> value, not "
                            f"{type(params).__name__}")
        arr = (capi.ModParam * len(params))()
        for i, (name, value) in enumerate(params.items()):
            if not isinstance(name, str):
                raise TypeError(f"flashjit: params: name {name!r} is not a str")
            raw = c_string("params name", name)
            self.keep.append(raw)
            arr[i].name = raw
            _fill_param(arr[i], name, value, device)
        self.keep.append(arr)
        self.mods.params = arr
        self.mods.num_params = len(params)
        return True


def _fill_param(p, name, value, device):
    if isinstance(value, bool):
        raise TypeError(f"flashjit: params[{name!r}]={value!r}: a bool is not a parameter "
                        "(an int is i32, a float f32)")
    if isinstance(value, (int, float)):
        p.type, p.value = scalar_param(name, value)
    elif hasattr(value, "data_ptr"):
        _fill_tensor(p, name, value, device)
    elif isinstance(value, tuple) and len(value) == 2:
        if device is not None:
            raise TypeError(f"flashjit: params[{name!r}] describes a tensor "
                            f"{value!r}; attention() and block_mask() need the tensor "
                            "itself")
        spec = TensorParam(*value)
        p.type = dtype_code(spec.dtype, f"params[{name!r}] dtype", MOD_TYPES)
        shape = tuple(spec.shape) if isinstance(spec.shape, (tuple, list)) else (spec.shape,)
        _fill_extents(p, name, shape)
        p.data = C.addressof(_PLACEHOLDER)
    else:
        raise TypeError(f"flashjit: params[{name!r}]={value!r}: an int (i32), a float (f32), "
                        "a tensor, or for inspection TensorParam(dtype, shape)")


def _fill_extents(p, name, shape):
    if not 1 <= len(shape) <= 4:
        raise ValueError(f"flashjit: params[{name!r}] has {len(shape)} dimensions; "
                         "a tensor parameter has 1 to 4")
    p.rank = len(shape)
    for d, n in enumerate(shape):
        p.extents[d] = int_arg(f"params[{name!r}] extent {d}", n, bits=64)


def _fill_tensor(p, name, t, device):
    kind = str(t.dtype).replace("torch.", "")
    if kind not in ("float32", "float16", "bfloat16", "int32"):
        raise TypeError(f"flashjit: params[{name!r}] has dtype {t.dtype}; a tensor "
                        "parameter is float32, float16, bfloat16 or int32")
    p.type = MOD_TYPES[kind]
    if device is not None and t.device != device:
        raise ValueError(f"flashjit: params[{name!r}] is on {t.device}; the attention "
                         f"inputs are on {device}")
    if not t.is_contiguous():
        raise ValueError(f"flashjit: params[{name!r}] is not contiguous (strides "
                         f"{tuple(t.stride())}); call .contiguous()")
    _fill_extents(p, name, tuple(t.shape))
    p.data = t.data_ptr()


# ---- block masks ------------------------------------------------------------------

BLOCK_SIZES = (64, 128, 256)


def block_size(what, value):
    """A block mask's block size: 64, 128 or 256 (fj_block_mask)."""
    int_arg(what, value)
    if value not in BLOCK_SIZES:
        raise ValueError(f"flashjit: {what}={value} is not a block size: 64, 128 or 256")
    return value


def blocks(seq, block):
    """The blocks of `block` that cover seq positions."""
    return (seq + block - 1) // block


def block_sizes_of(value):
    """(block_q, block_kv) of an inspection's block_mask=: a pair, or an
    object with .block_q and .block_kv (flashjit.BlockMask)."""
    if hasattr(value, "block_q") and hasattr(value, "block_kv"):
        return value.block_q, value.block_kv
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"flashjit: block_mask={value!r} must be a pair (block_q, block_kv) "
                         "of 64, 128 or 256, or a flashjit.BlockMask")
    return block_size("block_mask[0]", value[0]), block_size("block_mask[1]", value[1])


def placeholder_block_mask(value, seq_q, seq_kv):
    """An fj_block_mask for inspection (compile and plan, never launch)
    with placeholder arrays, or None for None.  A pair (block_q, block_kv):
    one list for every batch index and head, the blocks seq_q x seq_kv
    need.  A flashjit.BlockMask: its own sizes (which the library checks
    against the problem), its arrays never read."""
    if value is None:
        return None
    bq, bkv = block_sizes_of(value)
    ph = C.addressof(_PLACEHOLDER)
    if hasattr(value, "q_blocks"):
        full = ph if value.full_num is not None else None
        return capi.BlockMask(bq, bkv, value.batch, value.heads, value.q_blocks,
                              value.kv_blocks, ph, ph, full, full)
    return capi.BlockMask(bq, bkv, 1, 1, blocks(seq_q, bq), blocks(seq_kv, bkv), ph, ph,
                          None, None)


# ---- problems --------------------------------------------------------------------


def shape_problem(lib, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, dtype,
                  kv_dtype, causal, layout, scale, splits, o_dtype=None):
    """An fj_problem of contiguous tensors from sizes (plan, Kernel).  An
    FP8 problem's descales point at a placeholder: planning and compiling
    check only that they are there, and nothing launches it."""
    p = capi.Problem()
    sizes = [int_arg(n, v) for n, v in (("batch", batch), ("heads_q", heads_q),
                                        ("heads_kv", heads_kv), ("seq_q", seq_q),
                                        ("seq_kv", seq_kv), ("head_dim", head_dim))]
    lib.fj_problem_init(C.byref(p), *sizes, dtype_code(dtype),
                        choose("layout", layout, LAYOUTS))
    if kv_dtype is not None:
        p.kv_dtype = dtype_code(kv_dtype, "kv_dtype")
    if o_dtype is not None:
        p.o_dtype = dtype_code(o_dtype, "o_dtype")
    if capi.E4M3 in (p.dtype, p.kv_dtype):
        p.k_scale = p.v_scale = C.addressof(_PLACEHOLDER)
    if p.dtype == capi.E4M3:
        p.q_scale = C.addressof(_PLACEHOLDER)
    p.causal = causal_code(causal)
    p.scale = scale_value(scale)
    p.splits = int_arg("splits", splits)
    return p
