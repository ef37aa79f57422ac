"""The library handle, errors and contexts.

The shared library is found on first use, not at import, so that
`import flashjit` works anywhere (for help(), or an install check).
Contexts are made on first use and kept for the life of the process: one
GPU context per device, and one compile-only context per (arch,
multiprocessor count) for inspection.  A lock guards both tables;
the contexts themselves are thread-safe (include/flashjit.h).
"""
import ctypes as C
import logging
import os
import threading

from . import _capi as capi

LIB_ENV = "FLASHJIT_LIB"
_LIB_NAME = "libflashjit.so"
_log = logging.getLogger("flashjit")


class LibraryNotFound(ImportError):
    """No libflashjit.so: neither $FLASHJIT_LIB nor one in the package."""


class Error(RuntimeError):
    """A flashjit call failed.  .status is the fj_status number, .status_name
    its text, and str(error) the library's detailed message."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.status_name = _status_text(status)


class InvalidArgument(Error, ValueError):
    """FJ_ERR_INVALID_ARG: a value out of range; the message names it."""


class Unsupported(Error, ValueError):
    """FJ_ERR_UNSUPPORTED: an axis value or problem not implemented."""


class ResourceLimit(Error, ValueError):
    """FJ_ERR_RESOURCES: the variant needs more than the target has."""


class NoDevice(Error):
    """FJ_ERR_NO_DEVICE / FJ_ERR_COMPILE_ONLY: this needs a CUDA GPU."""


class CompileError(Error):
    """FJ_ERR_COMPILE / FJ_ERR_TEMPLATE: the NVRTC log or Lua traceback."""


_ERRORS = {capi.ERR_INVALID_ARG: InvalidArgument, capi.ERR_UNSUPPORTED: Unsupported,
           capi.ERR_RESOURCES: ResourceLimit, capi.ERR_NO_DEVICE: NoDevice,
           capi.ERR_COMPILE_ONLY: NoDevice, capi.ERR_COMPILE: CompileError,
           capi.ERR_TEMPLATE: CompileError}

_lock = threading.Lock()       # the context tables
_load_lock = threading.Lock()  # loading the library (taken inside _lock too)
_lib = None
_gpu_ctxs = {}
_cpu_ctxs = {}


def _package_library():
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), _LIB_NAME)


def library_path():
    """The libflashjit.so this process uses (or would use): $FLASHJIT_LIB
    when set, else the one installed inside the package."""
    env = os.environ.get(LIB_ENV)
    return os.path.abspath(env) if env else _package_library()


def lib():
    """The loaded library, loading it on the first call."""
    global _lib
    if _lib is not None:
        return _lib
    with _load_lock:
        if _lib is None:
            _lib = _load()
    return _lib


def _load():
    path = library_path()
    if not os.path.isfile(path):
        if os.environ.get(LIB_ENV):
            raise LibraryNotFound(f"flashjit: {LIB_ENV}={os.environ[LIB_ENV]}: no such file")
        raise LibraryNotFound(
            f"flashjit: {_LIB_NAME} is not in the package ({os.path.dirname(path)}) and "
            f"{LIB_ENV} is not set: install with `pip install ./python`, or build with "
            f"`cmake -DFLASHJIT_SHARED=ON` and set {LIB_ENV}=build/{_LIB_NAME}")
    try:
        return capi.open_library(path)
    except OSError as e:
        raise LibraryNotFound(f"flashjit: cannot load {path}: {e}") from None
    except AttributeError as e:
        raise LibraryNotFound(f"flashjit: {path} does not match this binding: {e}") from None


def _status_text(status):
    try:
        return lib().fj_status_str(status).decode()
    except LibraryNotFound:
        return f"status {status}"


def error(status, ctx=None):
    """The exception for a failed call's status, with the calling thread's
    message from fj_errmsg(ctx) (read before anything else calls in)."""
    msg = lib().fj_errmsg(ctx).decode(errors="replace")
    return _ERRORS.get(status, Error)(status, msg or _status_text(status))


def check(status, ctx=None):
    if status != capi.OK:
        raise error(status, ctx)


def library_version():
    """The C library's version string, fj_version()."""
    return lib().fj_version().decode()


def builtin_mods():
    """The named built-in modifications (fj_mod_builtins): a dict by name of
    dicts with the score or mask expression to pass as score_mod / mask_mod,
    the parameters it reads, the field that sets it instead (softcap,
    window, causal, sinks: keyword arguments of attention), and a line."""
    n = C.c_int()
    table = lib().fj_mod_builtins(C.byref(n))
    out = {}
    for i in range(n.value):
        b = table[i]
        dec = (lambda x: x.decode() if x else None)
        out[dec(b.name)] = {"score_mod": dec(b.score), "mask_mod": dec(b.mask),
                            "params": dec(b.params), "field": dec(b.field),
                            "about": dec(b.about)}
    return out


# ---- contexts --------------------------------------------------------------------


def _log_sink(user, level, msg):
    _log.log({capi.LOG_DEBUG: logging.DEBUG, capi.LOG_INFO: logging.INFO}.get(
        level, logging.WARNING), "%s", msg.decode(errors="replace"))


# Kept for the life of the process: the library may call it at any time.
_LOG_CB = capi.LOG_FN(_log_sink)


def bundled_kernels():
    """The kernel package a wheel built with FLASHJIT_WHEEL_KERNELS=ON
    carries (python/CMakeLists.txt): its folder, or None."""
    d = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")
    return d if os.path.isfile(os.path.join(d, "flashjit-package.txt")) else None


def _create(device, arch, sm_count):
    L = lib()
    o = capi.CtxOpts()
    L.fj_ctx_opts_init(C.byref(o))
    from . import _problem as pr
    o.device = pr.int_arg("device", device)
    o.arch = pr.c_string("arch", arch) if arch else None
    o.sm_count = pr.int_arg("sm_count", sm_count)
    o.log = _LOG_CB
    # The tiered JIT (on in the C library's defaults) stays off here: a
    # PyTorch caller times, trains and compares bits from its first calls
    # on, and a first kernel answering until a compile ends would change
    # both speed and low bits with the clock.  FLASHJIT_JIT_TIERS=1 (read
    # by the library) turns it on.
    o.jit_tiers = 0
    # The wheel's own kernel package, consulted after the context's cache,
    # unless $FLASHJIT_PACKAGE_DIR names one (or, empty, none).  The
    # library checks it as any package (NVRTC version, format, arch).
    pkg = bundled_kernels() if "FLASHJIT_PACKAGE_DIR" not in os.environ else None
    o.package_dir = os.fsencode(pkg) if pkg else None
    ctx = C.c_void_p()
    check(L.fj_ctx_create(C.byref(ctx), C.byref(o)), None)
    return ctx


def gpu_context(device):
    """The context of CUDA device `device`, created on first use.  Raises
    NoDevice where there is no driver or no such device."""
    ctx = _gpu_ctxs.get(device)
    if ctx is not None:
        return ctx
    if not isinstance(device, int) or isinstance(device, bool) or device < 0:
        raise ValueError(f"flashjit: device {device!r} is not a CUDA device ordinal (0 or more)")
    with _lock:
        ctx = _gpu_ctxs.get(device)
        if ctx is None:
            ctx = _gpu_ctxs[device] = _create(device, None, 0)
    return ctx


def arch_context(arch, sm_count=0):
    """A compile-only context for `arch` ("sm_90a"): renders, compiles and
    plans with no GPU.  sm_count: the multiprocessors plans count on (0: the
    arch's largest part)."""
    if not isinstance(arch, str):
        raise TypeError(f"flashjit: arch must be a string such as 'sm_90a', not {arch!r}")
    if not isinstance(sm_count, int) or isinstance(sm_count, bool):
        raise TypeError(f"flashjit: sm_count must be an int, not {sm_count!r}")
    key = (arch, sm_count)
    ctx = _cpu_ctxs.get(key)
    if ctx is not None:
        return ctx
    with _lock:
        ctx = _cpu_ctxs.get(key)
        if ctx is None:
            ctx = _cpu_ctxs[key] = _create(-1, arch, sm_count)
    return ctx


def context(arch=None, device=None, sm_count=None):
    """A compile-only context for arch, or device's GPU context.  Neither
    given: the current torch device if torch has CUDA, else device 0."""
    if arch is not None and device is not None:
        raise ValueError("flashjit: give arch (compile-only, no GPU) or device, not both")
    if arch is not None:
        return arch_context(arch, sm_count or 0)
    if sm_count is not None:
        raise ValueError("flashjit: sm_count is for compile-only planning (with arch=); "
                         "a GPU context uses its device's count")
    return gpu_context(default_device() if device is None else _device_index(device))


def default_device():
    try:
        import torch
        if torch.cuda.is_available():
            return torch.cuda.current_device()
    except ImportError:
        pass
    return 0


def _device_index(device):
    """An int ordinal from an int, "cuda:1" or a torch.device."""
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    index = getattr(device, "index", None)
    if getattr(device, "type", None) == "cuda":
        return default_device() if index is None else index
    if isinstance(device, str) and device.startswith("cuda"):
        rest = device[4:]
        if rest == "":
            return default_device()
        if rest[:1] == ":" and rest[1:].isdigit():
            return int(rest[1:])
    raise ValueError(f"flashjit: device {device!r} is not a CUDA device "
                     "(an ordinal, 'cuda:N' or a torch.device)")


def device_info(device=None):
    """Facts about a GPU (fj_device_get) as a dict."""
    ctx = context(device=device)
    info = capi.DeviceInfo()
    check(lib().fj_device_get(ctx, C.byref(info)), ctx)
    return {"name": info.name.decode(errors="replace"), "ordinal": info.ordinal,
            "compute_capability": (info.cc_major, info.cc_minor), "sm_count": info.sm_count,
            "smem_optin_bytes": info.smem_optin_bytes, "driver_version": info.driver_version,
            "arch": lib().fj_ctx_arch(ctx).decode()}
