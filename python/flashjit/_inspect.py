"""Inspection and tuning: Kernel, plan, layout, tune.

Kernel, plan and layout work with no GPU through a compile-only context for
an arch; given device= instead they ask that GPU's context.  tune needs a
GPU.
"""
import ctypes as C
import sys
import time
from dataclasses import dataclass, field

from . import _capi as capi
from . import _core as core
from . import _problem as pr

# The problem a Kernel without explicit axes is the library's pick for: a
# long prefill (enough 128-row blocks for every multiprocessor, so that
# sm_90a's wgmma family applies).
_PICK_SHAPE = dict(batch=1, heads_q=16, heads_kv=16, seq_q=4096, seq_kv=4096)


@dataclass(frozen=True)
class Resources:
    """What ptxas reports for a kernel (fj_resources)."""
    registers: int
    shared_static: int
    shared_dynamic: int
    spill_store_bytes: int
    spill_load_bytes: int
    local_bytes: int
    threads: int
    barriers: int
    cubin_bytes: int
    ptx_bytes: int
    compile_ms: float
    cache: str  # "miss" (compiled now), "memory" or "disk"

    @property
    def shared_bytes(self):
        return self.shared_static + self.shared_dynamic

    @property
    def spills(self):
        """Bytes spilled: stores plus loads."""
        return self.spill_store_bytes + self.spill_load_bytes


class Kernel:
    """One compiled attention kernel, for reading: .name, .source, .ptx,
    .cubin, .log, .resources, .variant.

    With no variant axis given it is the library's own pick (what
    attention() would run) for a long prefill of this head dim, dtype, mask
    and modifications on `arch`.  dtype: "f16", "bf16" or "e4m3" (Q, K and
    V in FP8, O in bf16 or o_dtype's -- "f16", or "e4m3" with a scale and
    amax: the wgmma family, sm_90a); kv_dtype "e4m3": FP8 K and V under
    16-bit Q (the mma and wmma families).  The modifications are attention()'s
    (window, softcap, score_mod, mask_mod, params: tensors described by
    TensorParam), and the switches that compile another kernel:
    sinks=True (attention sinks, "_sink"), block_mask=(block_q, block_kv)
    or a flashjit.BlockMask (a block mask of those block sizes, 64, 128 or
    256 each, "_bm128x128"; the pick's tiles divide them) and checked=True
    (checked mode, "_chk": only where params has a tensor, as it has
    nothing to check otherwise).  Axes given (mma, tile_m, tile_n, warps,
    stages, swizzle, softmax, pack_gqa, split_kv) replace the pick's; a
    family other than the pick's starts from that family's defaults, as
    `flashjit emit --mma` does.  Compiles on construction (or takes the
    cached cubin); refusals raise ValueError subclasses with the library's
    message (the axis, the value and the limit).  No GPU is needed unless
    device= is given instead of arch.
    """

    def __init__(self, head_dim=128, *, arch="sm_90a", dtype="bf16", causal=None,
                 kv_dtype=None, mma=None, tile_m=None, tile_n=None, warps=None, stages=None,
                 swizzle=None, softmax=None, pack_gqa=None, split_kv=None, window=None,
                 softcap=None, score_mod=None, mask_mod=None, params=None, sinks=False,
                 block_mask=None, checked=False, device=None, sm_count=None, o_dtype=None):
        if device is not None:
            arch = None
        self._ctx = core.context(arch=arch, device=device, sm_count=sm_count)
        lib = core.lib()
        mods = pr.ModsArg(window, softcap, score_mod, mask_mod, params,
                          sinks=_flag("sinks", sinks),
                          block_mask=_inspect_block_mask(block_mask, _PICK_SHAPE["seq_q"],
                                                         _PICK_SHAPE["seq_kv"], True),
                          checked=_flag("checked", checked))
        given = dict(mma=mma, tile_m=tile_m, tile_n=tile_n, warps=warps, stages=stages,
                     swizzle=swizzle, softmax=softmax, pack_gqa=pack_gqa, split_kv=split_kv)
        p = pr.shape_problem(lib, head_dim=head_dim, dtype=dtype, kv_dtype=kv_dtype,
                             causal=causal, layout="bhsd", scale=None, splits=0,
                             o_dtype=o_dtype, **_PICK_SHAPE)
        p.mods = mods.ptr
        v = capi.Variant()
        core.check(lib.fj_attention_variant(self._ctx, C.byref(p), C.byref(v), None), self._ctx)
        _apply_axes(lib, v, given, mods.ptr)
        self._init(v, mods)

    @classmethod
    def _of_variant(cls, ctx, v, mods):
        self = cls.__new__(cls)
        self._ctx = ctx
        self._init(v, mods)
        return self

    def _init(self, v, mods):
        lib = core.lib()
        self._variant = v
        self._mods = mods
        k = C.c_void_p()
        core.check(lib.fj_kernel_get(self._ctx, C.byref(v), C.byref(k)), self._ctx)
        self._k = k
        self.arch = lib.fj_ctx_arch(self._ctx).decode()
        self.name = lib.fj_kernel_name(k).decode()
        self.variant = pr.variant_dict(v)

    def _text(self, fn):
        n = C.c_size_t()
        ptr = fn(self._k, C.byref(n))
        return C.string_at(ptr, n.value) if ptr else b""

    @property
    def source(self):
        """The rendered CUDA source (str)."""
        return self._text(core.lib().fj_kernel_source).decode()

    @property
    def ptx(self):
        """The PTX NVRTC produced (str)."""
        return self._text(core.lib().fj_kernel_ptx).decode()

    @property
    def cubin(self):
        """The cubin for the arch (bytes)."""
        return self._text(core.lib().fj_kernel_cubin)

    @property
    def log(self):
        """NVRTC's log, with ptxas's resource lines."""
        return core.lib().fj_kernel_log(self._k).decode(errors="replace")

    @property
    def resources(self):
        r = capi.Resources()
        core.lib().fj_kernel_resources(self._k, C.byref(r))
        cache = {capi.CACHE_MISS: "miss", capi.CACHE_MEMORY: "memory",
                 capi.CACHE_DISK: "disk"}.get(r.cache, "?")
        return Resources(*(getattr(r, f) for f, _ in capi.Resources._fields_[:-1]), cache)

    def __repr__(self):
        return f"<flashjit.Kernel {self.name} for {self.arch}>"


def _apply_axes(lib, v, given, mods_ptr):
    """The axes given replace the pick's; another family starts from its
    defaults as the CLI's do."""
    mma = None if given["mma"] is None else pr.choose("mma", given["mma"], pr.axis_values("mma"))
    if mma is not None and mma != v.mma:
        head_dim, dtype, causal, kv, o = v.head_dim, v.dtype, v.causal, v.kv_dtype, v.o_dtype
        lib.fj_variant_default(C.byref(v), head_dim, dtype, causal)
        v.kv_dtype, v.mma, v.mods, v.o_dtype = kv, mma, mods_ptr, o
        if kv == capi.E4M3:
            v.stages = 1
        if mma == capi.MMA_WGMMA:
            v.swizzle = capi.SWIZZLE_XOR
            if given["tile_m"] is None and given["warps"] is None:
                v.tile_m, v.warps = 128, 12
    for axis in ("tile_m", "tile_n", "warps", "stages"):
        if given[axis] is not None:
            setattr(v, axis, pr.int_arg(axis, given[axis]))
    if given["swizzle"] is not None:
        v.swizzle = pr.choose("swizzle", given["swizzle"], pr.axis_values("swizzle"))
    if given["softmax"] is not None:
        v.softmax = pr.choose("softmax", given["softmax"], pr.axis_values("softmax"))
    for axis in ("pack_gqa", "split_kv"):
        if given[axis] is not None:
            setattr(v, axis, 1 if _flag(axis, given[axis]) else 0)


def _flag(what, value):
    # An int 0 or 1 only: `value in (0, 1)` would take 1.0, and raise
    # PyTorch's ambiguity error for a tensor (sinks=the sinks themselves).
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    raise TypeError(f"flashjit: {what} must be True or False, not {value!r}")


def _inspect_block_mask(value, seq_q, seq_kv, sizes_only):
    """block_mask= of Kernel and plan as an fj_block_mask with placeholder
    arrays (nothing is launched).  A Kernel takes only the block sizes
    (sizes_only); a plan takes a BlockMask's own batch, heads and blocks,
    for the library to check against the problem."""
    if value is not None and sizes_only:
        value = pr.block_sizes_of(value)
    return pr.placeholder_block_mask(value, seq_q, seq_kv)


# ---- plan ------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What attention() would launch for a problem (fj_attention_plan)."""
    name: str               # the attention kernel's variant (its symbol)
    variant: dict           # its axes
    choice: str             # "heuristic" or "tuned"
    arch: str
    sm_count: int           # the multiprocessors planned for
    splits: int             # key ranges a row tile is split into (1: none)
    rows: int
    grid: tuple
    threads: int
    smem_bytes: int
    blocks_per_sm: int
    combine_grid: tuple     # splits > 1: the combine kernel's grid
    combine_threads: int
    combine_cols: int       # splits > 1: O's columns a combine block takes
    workspace_bytes: int    # splits > 1: the scratch the launch needs
    _ctx: object = field(repr=False, compare=False)
    _raw: object = field(repr=False, compare=False)
    _mods: object = field(repr=False, compare=False)

    def kernel(self):
        """The planned attention kernel as a Kernel (compiled now)."""
        return Kernel._of_variant(self._ctx, self._raw, self._mods)


def plan(batch, heads_q, seq_q, head_dim, *, heads_kv=None, seq_kv=None, dtype="bf16",
         kv_dtype=None, causal=None, layout="bhsd", scale=None, splits=0, window=None,
         softcap=None, score_mod=None, mask_mod=None, params=None, sinks=False,
         block_mask=None, checked=False, arch="sm_90a", sm_count=None, device=None,
         o_dtype=None):
    """What the library would launch for attention of this shape: the
    variant, grid, split-KV splits and workspace, as `flashjit plan`
    prints.  With no GPU it plans for `arch` and that arch's largest part
    (sm_count= says otherwise); device= plans for that GPU instead.
    heads_kv and seq_kv default to heads_q and seq_q; dtype, kv_dtype and
    o_dtype are Kernel's (dtype "e4m3": FP8 attention).  The modifications
    and switches are Kernel's; block_mask= is a pair (block_q, block_kv)
    (one list for every batch index and head) or a flashjit.BlockMask,
    whose batch, heads and blocks the library checks against this
    problem.  Refusals raise ValueError subclasses with the library's
    message."""
    if device is not None:
        arch = None
    ctx = core.context(arch=arch, device=device, sm_count=sm_count)
    lib = core.lib()
    p = pr.shape_problem(lib, batch, heads_q, heads_q if heads_kv is None else heads_kv,
                         seq_q, seq_q if seq_kv is None else seq_kv, head_dim, dtype,
                         kv_dtype, causal, layout, scale, splits, o_dtype)
    mods = pr.ModsArg(window, softcap, score_mod, mask_mod, params,
                      sinks=_flag("sinks", sinks),
                      block_mask=_inspect_block_mask(block_mask, p.seq_q, p.seq_kv, False),
                      checked=_flag("checked", checked))
    p.mods = mods.ptr
    raw = capi.Plan()
    core.check(lib.fj_attention_plan(ctx, C.byref(p), C.byref(raw)), ctx)
    v = capi.Variant.from_buffer_copy(raw.variant)
    return Plan(pr.variant_name(lib, v), pr.variant_dict(v),
                "tuned" if raw.choice == capi.CHOICE_TUNED else "heuristic",
                lib.fj_ctx_arch(ctx).decode(), raw.sm_count, raw.splits, raw.rows,
                tuple(raw.grid), raw.threads, raw.smem_bytes, raw.blocks_per_sm,
                tuple(raw.combine_grid), raw.combine_threads, raw.combine_cols,
                raw.workspace_bytes,
                ctx, v, mods)


# ---- layout ----------------------------------------------------------------------


def fragments():
    """The fragment kinds a layout table exists for ("wmma_acc_f32", ...)."""
    lib = core.lib()
    return tuple(lib.fj_frag_name(f).decode() for f in range(1, capi.FRAG_COUNT + 1))


@dataclass(frozen=True)
class Layout:
    """A fragment's register layout (fj_lut): map[lane][slot] = (row, col)
    of the tile element that register slot of that lane holds."""
    frag: str
    rows: int
    cols: int
    lanes: int
    slots: int
    map: tuple
    origin: str   # "probed", "cached" or "reference" (compile-only: not observed)
    device: str

    def __str__(self):
        lines = [f"fragment {self.frag}: {self.rows}x{self.cols} tile, {self.slots} slots "
                 f"per lane; {self.origin}; device {self.device}",
                 f"lane: (row,col) of slot 0..{self.slots - 1}"]
        for lane, row in enumerate(self.map):
            lines.append(f"{lane:4d}:" + "".join(f" ({r:2d},{c:2d})" for r, c in row))
        return "\n".join(lines)


def layout(frag, *, arch=None, device=None):
    """The register layout of a fragment kind: probed on the GPU (device=,
    or the current one when arch is not given), or with arch= the reference
    table with no GPU.  frag: one of fragments()."""
    names = fragments()
    if frag not in names:
        raise ValueError(f"flashjit: frag={frag!r} is not one of {', '.join(names)}")
    ctx = core.context(arch=arch, device=device)
    lut = capi.Lut()
    core.check(core.lib().fj_layout_get(ctx, names.index(frag) + 1, C.byref(lut)), ctx)
    cols = lut.cols or 1
    table = tuple(tuple(divmod(lut.map[lane][s], cols) for s in range(lut.slots))
                  for lane in range(lut.lanes))
    origin = {capi.LUT_PROBED: "probed", capi.LUT_CACHED: "cached",
              capi.LUT_REFERENCE: "reference"}.get(lut.origin, "?")
    return Layout(frag, lut.rows, lut.cols, lut.lanes, lut.slots, table, origin,
                  lut.device.decode(errors="replace"))


# ---- tune ------------------------------------------------------------------------


class _Bar:
    """A tqdm-style progress line on a stream: label, percent, bar, counts,
    elapsed<remaining, rate."""

    def __init__(self, label, stream):
        self.label, self.stream, self.start = label, stream, time.monotonic()
        self.tty = getattr(stream, "isatty", lambda: False)()
        self.last = -1

    def __call__(self, _user, done, total):
        pct = int(100 * done / total) if total else 100
        if not self.tty and pct // 10 == self.last // 10 and done != total:
            return  # a log file gets a line per 10%
        self.last = pct
        elapsed = time.monotonic() - self.start
        rate = done / elapsed if elapsed > 0 else 0.0
        left = (total - done) / rate if rate > 0 else 0.0
        fill = 20 * done // total if total else 20
        bar = "\u2588" * fill + " " * (20 - fill)
        line = (f"{self.label}: {pct:3d}%|{bar}| {done}/{total} "
                f"[{_mmss(elapsed)}<{_mmss(left)}, {rate:.1f} it/s]")
        self.stream.write(("\r" + line) if self.tty else line + "\n")
        if self.tty and done == total:
            self.stream.write("\n")
        self.stream.flush()


def _mmss(s):
    return f"{int(s) // 60:02d}:{int(s) % 60:02d}"


@dataclass(frozen=True)
class TuneResult:
    name: str          # the winner's variant
    variant: dict
    candidates: int
    refused: int
    failed: int
    wrong: int
    timed: int
    best_ms: float
    default_ms: float
    compile_s: float
    total_s: float


def tune_problem(lib, batch, heads_q, seq_q, head_dim, heads_kv=None, seq_kv=None,
                 dtype="bf16", causal=None, head_dim_v=None, latent=False):
    """tune()'s fj_problem: contiguous bhsd tensors; with head_dim_v, V and
    O of that head dim (latent: V as K's first head_dim_v columns, v_stride
    k_stride, as MLA's cache and the mma family have it)."""
    p = pr.shape_problem(lib, batch, heads_q, heads_q if heads_kv is None else heads_kv,
                         seq_q, seq_q if seq_kv is None else seq_kv, head_dim, dtype,
                         None, causal, "bhsd", None, 0)
    if head_dim_v is not None:
        dv = p.head_dim_v = pr.int_arg("head_dim_v", head_dim_v)
        if latent:
            p.v_stride[:] = list(p.k_stride)
        else:
            p.v_stride[:] = [p.heads_kv * p.seq_kv * dv, p.seq_kv * dv, dv]
        p.o_stride[:] = [p.heads_q * p.seq_q * dv, p.seq_q * dv, dv]
    elif latent:
        raise ValueError("flashjit.tune: latent=True reads V as K's first head_dim_v "
                         "columns: give head_dim_v")
    return p


def tune(batch, heads_q, seq_q, head_dim, *, heads_kv=None, seq_kv=None, dtype="bf16",
         causal=None, head_dim_v=None, latent=False, device=None, iters=10, warmup=2,
         workers=0, save=True, progress=True):
    """Autotunes a problem class on a GPU (fj_tune): compiles the candidate
    variants in parallel, times them, and records the winner, which
    attention() then uses for problems of that class.  progress: True
    draws a tqdm-style bar on stderr, False nothing, or a callable
    progress(done, total).  Raises flashjit.NoDevice without a GPU.
    dtype "e4m3" tunes FP8 attention (sm_90a) on the tuner's own inputs
    and descales.  head_dim_v: V's and O's head dim where it differs
    (MLA's prefill, 192 / 128: a class of its own); latent=True with it
    reads V as K's first head_dim_v columns (MLA's cache)."""
    lib = core.lib()
    p = tune_problem(lib, batch, heads_q, seq_q, head_dim, heads_kv, seq_kv, dtype, causal,
                     head_dim_v, latent)
    try:
        ctx = core.context(device=device)
    except core.NoDevice as e:
        raise core.NoDevice(e.status, f"flashjit.tune runs on a GPU: {e}") from None
    o = capi.TuneOpts()
    lib.fj_tune_opts_init(C.byref(o))
    o.iters = pr.int_arg("iters", iters)
    o.warmup = pr.int_arg("warmup", warmup)
    o.workers = pr.int_arg("workers", workers)
    o.save = 1 if save else 0
    if progress is True:
        cb = capi.PROGRESS_FN(_Bar("tune", sys.stderr))
    elif callable(progress):
        cb = capi.PROGRESS_FN(lambda _u, done, total: progress(done, total))
    else:
        cb = capi.PROGRESS_FN()
    o.progress = cb
    best, rep = capi.Variant(), capi.TuneReport()
    core.check(lib.fj_tune(ctx, C.byref(p), C.byref(o), C.byref(best), C.byref(rep)), ctx)
    return TuneResult(pr.variant_name(lib, best), pr.variant_dict(best),
                      *(getattr(rep, f) for f, _ in capi.TuneReport._fields_))


def cache_dir(arch="sm_90a"):
    """The disk cache directory the contexts use (None: memory only)."""
    d = core.lib().fj_cache_dir(core.arch_context(arch))
    return d.decode() if d else None
