"""The training call in C++ (libflashjit_torch.so, built where CMake finds
PyTorch with CUDA), in two parts.

Eager (csrc/native.cpp): a TrainCall's or ModsCall's forward as a C++ op
and a C++ autograd node for its backward, which PyTorch's device thread
runs without the GIL.  A call takes it once the package's own path has run
its forward and backward (offer(), from the Functions' backward): the
package has then made every decision the node repeats -- the forward's
entry, the backward's for both deterministic modes, where the gradients go
-- and records them in a Call for the node to read.  Calls the record
cannot express stay on the package's path: parameters' gradients, varlen,
split head dims, inputs copied dense for the backward, gradients that are
not dense or views of one storage.

Compiled (csrc/compiled.cpp): the ops flashjit_native::attention_train and
::attention_bwd, which a torch.compile'd graph calls for the dense
training call with the built-in masks (_train.train_call) instead of the
package's Python ops, with their autograd in C++ too: a new signature asks
prepare_fwd / prepare_bwd below once for its entry's record (an Entry),
made as the package's op makes it; expressions and varlen keep the Python
ops.

FLASHJIT_NATIVE=0 turns both off; FLASHJIT_NATIVE_LIB names the library
(default: libflashjit_torch.so beside the library the package loaded)."""
import ctypes as C
import os

import torch

from . import _calls as calls, _capi as capi, _core as core

# Records made (with what they point at), kept for the process: an autograd
# graph's node reads its record at backward, whenever that comes.  At most
# MAX_RECORDS; later calls stay on the package's path.
MAX_RECORDS = 4096
_records = []
_op = None
_state = None  # None: not tried; False: unavailable; True: loaded
why = ""       # why the library is unavailable, for inspection


SLOTS = 24


class Slots(C.Structure):
    """csrc/native.h's fjn_slots: pointer field at[i] takes extras[of[i]]."""
    _fields_ = [("n", C.c_int64), ("at", C.c_void_p * SLOTS), ("of", C.c_int64 * SLOTS)]


class Entry(C.Structure):
    """csrc/native.h's fjn_entry: one library entry, a forward's or a
    backward's, as a record holds it (_entry fills it)."""
    _fields_ = [("fn", C.c_void_p), ("fn_plan", C.c_void_p), ("capturing", C.c_void_p),
                ("message", C.c_void_p), ("ctx", C.c_void_p), ("p", C.c_void_p),
                ("plan", C.c_void_p), ("ws", C.c_int64), ("lse_shape", C.c_int64 * 3),
                ("heads_q", C.c_int64), ("copy", C.c_int64 * 3), ("zero", C.c_int64),
                ("slots", Slots)]


class Call(C.Structure):
    """csrc/native.cpp's fjn_call, field for field: the eager call's record."""
    _fields_ = [("extras", C.c_int64), ("sinks_at", C.c_int64), ("fwd", Entry),
                ("bwd", Entry * 2), ("dense", C.c_int64 * 3), ("shared_elems", C.c_int64),
                ("shared_offset", C.c_int64 * 3), ("strides", (C.c_int64 * 4) * 3)]


# The compiled graphs' C++ ops (csrc/compiled.cpp) take CUDA tensors only;
# the tests set this to trace CPU tensors into them too.
CPU_OPS = False
compiled = False  # whether they are registered (available() registers them)

_FNS = {}


def _path():
    given = os.environ.get("FLASHJIT_NATIVE_LIB")
    if given:
        return given
    return os.path.join(os.path.dirname(os.path.abspath(core.lib()._name)),
                        "libflashjit_torch.so")


def available():
    """Whether the C++ training call is loaded (loading it on first ask)."""
    global _state, _op, why
    if _state is not None:
        return _state
    _state = False
    if os.environ.get("FLASHJIT_NATIVE", "1") == "0":
        why = "FLASHJIT_NATIVE=0"
        return False
    path = _path()
    if not os.path.exists(path):
        why = f"no {path}"
        return False
    try:
        torch.ops.load_library(path)
        ops = torch.ops.flashjit_native
        built, have = ops.torch_version(), _torch_version()
        if built != have:
            why = (f"{path}: built for PyTorch {built // 100}.{built % 100}, this is "
                   f"{torch.__version__} (rebuild it: cmake --build)")
            return False
        if ops.record_bytes() != C.sizeof(Call):
            why = (f"{path}: its record is {ops.record_bytes()} bytes, the package's "
                   f"{C.sizeof(Call)} (a build of another version)")
            return False
        if ops.dlse_offset() != capi.Problem.dlse.offset:
            why = f"{path}: built against another flashjit.h (fj_problem.dlse)"
            return False
        if ops.entry_bytes() != C.sizeof(Entry):
            why = f"{path}: its entry is {ops.entry_bytes()} bytes, the package's {C.sizeof(Entry)}"
            return False
        _op = ops.train.default
    except (OSError, RuntimeError, AttributeError) as ex:
        why = f"{path}: {ex}"
        return False
    lib = core.lib()
    for name in ("fj_attention_fwd", "fj_attention_fwd_plan", "fj_attention_bwd",
                 "fj_attention_bwd_run", "fj_errmsg"):
        _FNS[name] = C.cast(lib[name], C.c_void_p).value
    try:
        _FNS["capturing"] = C.cast(C.CDLL("libcuda.so.1").cuStreamIsCapturing,
                                   C.c_void_p).value
    except (OSError, AttributeError):
        _FNS["capturing"] = None  # no driver: nothing runs anyway
    try:
        _register_compiled()
    except (RuntimeError, AttributeError, TypeError) as ex:
        # The eager call stands without the compiled graphs' ops.
        why = f"{path}: the compiled graphs' ops not registered: {ex}"
    _state = True
    return True


def _register_compiled():
    """The compiled graphs' ops' Python parts: their fakes (the package's
    own ops' shapes and strides) and the preparation of a new signature's
    entry (prepare_fwd, prepare_bwd: the record's address, or 0)."""
    global compiled
    from . import _train as tr

    @torch.library.register_fake("flashjit_native::attention_train")
    def _fwd_fake(q, k, v, sinks, causal, scale, layout, window_left, window_right, softcap):
        return tr._attention_train_fake(q, k, v, sinks, causal, scale, layout, window_left,
                                        window_right, softcap)

    @torch.library.register_fake("flashjit_native::attention_bwd")
    def _bwd_fake(dout, q, k, v, out, lse, sinks, causal, scale, layout, window_left,
                  window_right, softcap, deterministic, dlse):
        return tr._attention_bwd_fake(dout, q, k, v, out, lse, causal, scale, layout,
                                      window_left, window_right, softcap, sinks)

    torch.library.impl("flashjit_native::prepare_fwd", ("cpu", "cuda"), _prepare_fwd)
    torch.library.impl("flashjit_native::prepare_bwd", ("cpu", "cuda"), _prepare_bwd)
    compiled = True


def _entry(into, e, fns, copy=None):
    """Fills into (an Entry) for library entry e: a forward's where copy is
    None, else a backward's (copy: which of q, k, v it reads as dense
    copies).  False where e has more slots than a record holds."""
    bwd = copy is not None
    into.fn = fns["fj_attention_bwd" if bwd else "fj_attention_fwd"]
    into.fn_plan = fns["fj_attention_bwd_run" if bwd else "fj_attention_fwd_plan"]
    into.capturing, into.message = fns["capturing"], fns["fj_errmsg"]
    into.ctx, into.p, into.plan, into.ws = e.ctx, e.p_addr, e.plan_addr, e.ws
    if bwd:
        into.heads_q, into.zero = e.p.heads_q, int(e.zero)
        into.copy[:] = [int(c) for c in copy]
    else:
        into.lse_shape[:] = list(e.lse_shape)
    return _slots(e.slots, into.slots)


def _fwd_recordable(e, q):
    """Whether forward entry e of a training call on q is one a record
    expresses: it launches, returns the library's log-sum-exp and O in q's
    dtype and shape."""
    return (e is not None and not e.idle and e.post is None and not e.out_dv and
            e.ones is None and e.lse_shape is not None and len(e.lse_shape) == 3 and
            e.out_dtype == q.dtype)


def _prepare_fwd(q, k, v, sinks, causal, scale, layout, window_left, window_right, softcap):
    """flashjit_native::prepare_fwd: the forward entry's record of a compiled
    graph's training call (flashjit::attention_train's, made as that op
    makes it), or 0 where a record does not express it."""
    from . import _train as tr
    fns = launchers()
    if fns is None or len(_records) >= MAX_RECORDS:
        return 0
    o, extras = tr._train_opts(sinks, causal, scale, layout, window_left, window_right, softcap)
    det = torch.are_deterministic_algorithms_enabled()
    e = calls.entry(o, calls.RAW_LSE, q, k, v, extras,
                    ahead=lambda: calls.prefetch_bwd(tr._build_bwd(o, q, k, v, extras, det)))
    r = Entry()
    if not _fwd_recordable(e, q) or not _entry(r, e, fns):
        return 0
    _records.append((r, e))
    return C.addressof(r)


def _prepare_bwd(dout, q, k, v, out, lse, sinks, causal, scale, layout, window_left,
                 window_right, softcap, deterministic):
    """flashjit_native::prepare_bwd: the backward entry's record
    (flashjit::attention_bwd's: q, k and v that are not dense read as
    dense copies, the gradients dense), or 0."""
    from . import _train as tr
    fns = launchers()
    if fns is None or len(_records) >= MAX_RECORDS or q.numel() == 0 or k.numel() == 0:
        return 0
    o, extras = tr._train_opts(sinks, causal, scale, layout, window_left, window_right, softcap)
    e, copy, kept = tr._bwd_entry(dout, q, k, v, out, lse, o, extras, deterministic)
    r = Entry()
    if kept or not _entry(r, e, fns, copy):
        return 0
    _records.append((r, e))
    return C.addressof(r)


def status():
    """flashjit.native_training(): (True, the library's path) where the C++
    training call is loaded, else (False, why not)."""
    return (True, _path()) if available() else (False, why)


def _torch_version():
    """This PyTorch's major * 100 + minor."""
    major, minor = torch.__version__.split(".")[:2]
    return int(major) * 100 + int("".join(c for c in minor if c.isdigit()) or 0)


def launchers():
    """The addresses a record calls (fj_attention_fwd, _fwd_plan, _bwd,
    _bwd_run, fj_errmsg, cuStreamIsCapturing by those names), or None where
    the package's launching calls are replaced (calls._fns: the tests'
    recorder), which a record would bypass."""
    if calls._fns is not None and not isinstance(calls._fns, calls.Fns):
        return None
    return _FNS


def train(q, k, v, addr, extras=()):
    """(out, lse) through the C++ op for record addr, or None where the
    record does not hold (q, k and v not sharing storage as the record's
    first call's did, an extra tensor requiring grad)."""
    got = _op(q, k, v, extras, addr)
    return (got[0], got[1]) if got else None


def _slots(slots, into):
    """An entry's slots ((struct, field, index) triples) as into's (a Slots)
    addresses; False where there are too many."""
    if len(slots) > SLOTS:
        return False
    into.n = len(slots)
    for i, (obj, field, of) in enumerate(slots):
        into.at[i] = C.addressof(obj) + getattr(type(obj), field).offset
        into.of[i] = of
    return True


def worth_offering(call, hit, q, k, v):
    """Whether call could take a record, by what is known before the other
    deterministic mode's entry is made for it (offer() checks the rest):
    the library loaded, its calls not replaced, the forward's entry one a
    record expresses, four-dimensional q, k and v (not varlen's packed
    ones) that the backward reads where they are (hit: the current
    mode's (entry, copies, kept, strides))."""
    return bool(available() and launchers() is not None and len(_records) < MAX_RECORDS and
                _fwd_recordable(call.entry, q) and q.dim() == 4 and k.dim() == 4 and
                v.dim() == 4 and q.numel() and k.numel() and not any(hit[1]))


def offer(call, hit, other, q, k, v, extras=(), roles=()):
    """Records call (a TrainCall or a ModsCall) for the C++ path, or marks it
    as staying on the package's (call.native = 0).  hit, other: the
    backward's (entry, copies, kept, strides) for the current deterministic
    mode and the other one, no parameter's gradient; q, k, v, extras: the
    tensors of the backward that made them, roles: the extras' (the
    call's options'; the sinks' gradient is the node's to return)."""
    from . import _train as tr
    call.native = 0
    if not worth_offering(call, hit, q, k, v):
        return
    fns = launchers()
    modes = (other, hit) if torch.are_deterministic_algorithms_enabled() else (hit, other)
    r = Call()
    r.extras = len(extras)
    r.sinks_at = list(roles).index("sinks") if "sinks" in roles else -1
    if any((r.sinks_at >= 0) != bool(h[0].sinks) for h in modes):
        return
    if not _entry(r.fwd, call.entry, fns):
        return
    for into, h in zip(r.bwd, modes):
        if not _entry(into, h[0], fns, h[1]):
            return
    ts = (q, k, v)
    dense = [tr._dense(t) for t in ts]
    rest = [t for t, d in zip(ts, dense) if not d]
    if rest:
        # The gradients as _grads_as_laid_out makes them: one buffer
        # mirroring the storage the strided ones share, or no record.
        if not hit[2] or len({t.untyped_storage().data_ptr() for t in rest}) != 1:
            return
        size = rest[0].untyped_storage().nbytes() // rest[0].element_size()
        if size > 2 * sum(t.numel() for t in rest) or not tr._share_ok(rest):
            return
        r.shared_elems = size
    r.dense[:] = [int(d) for d in dense]
    for i, t in enumerate(ts):
        r.strides[i][:] = list(t.stride())
    r.shared_offset[:] = [0 if d else t.storage_offset() for t, d in zip(ts, dense)]
    _records.append((r, call.entry, modes))
    call.native = C.addressof(r)

