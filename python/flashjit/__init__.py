"""flashjit: fused attention kernels generated and compiled at run time.

    import flashjit
    out = flashjit.attention(q, k, v, causal="top_left")        # PyTorch, on the GPU
    out = flashjit.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)
    out = flashjit.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens,
                                          block_table=table, causal=True)  # serving
    bm = flashjit.block_mask(q, k, mask_mod="doc(q) == doc(kv)", params={"doc": ids},
                             causal="top_left")                 # key blocks to skip
    out = flashjit.attention(q, k, v, causal="top_left", mask_mod="doc(q) == doc(kv)",
                             params={"doc": ids}, block_mask=bm)
    k = flashjit.Kernel(head_dim=128, arch="sm_90a", dtype="bf16")  # no GPU needed
    print(k.name, k.resources.registers, k.ptx[:200])
    print(flashjit.plan(1, 32, 1, 128, heads_kv=8, seq_kv=4096))   # what would launch
    out, lse = flashjit.merge([o1, o2], [lse1, lse2])    # partial results over disjoint keys
    import flashjit.distributed   # ring_attention: a sequence over torch.distributed ranks

The C library (libflashjit.so) is the one installed in this package, or
$FLASHJIT_LIB; it is loaded on first use, so importing needs neither it
nor PyTorch.  attention(), attention_varlen(), attention_with_kvcache()
and block_mask() need PyTorch and a GPU (BlockMask, PyTorch only);
merge() PyTorch (a GPU for CUDA tensors; CPU tensors merge on the host,
in float64); Kernel, plan and layout need neither (NVRTC compiles for
the arch given); tune needs a GPU.
Contexts (one per GPU, one per inspected arch) are made on first use and
kept for the process; every entry is thread-safe.
"""
from ._core import (CompileError, Error, InvalidArgument, LibraryNotFound, NoDevice,
                    ResourceLimit, Unsupported, builtin_mods, device_info, library_path,
                    library_version)
from ._inspect import (Kernel, Layout, Plan, Resources, TuneResult, cache_dir, fragments,
                       layout, plan, tune)
from ._problem import TensorParam

__version__ = "0.1.0"

try:
    import torch as _torch  # noqa: F401
    _NO_TORCH = None
except ImportError:
    _torch = None
    _NO_TORCH = "needs PyTorch, which is not installed"
# The PyTorch calls are custom operators (torch.library.custom_op, PyTorch
# 2.4): an older PyTorch is treated as none, by name and version, so that
# the package still imports and Kernel, plan and layout still work.
if _torch is not None and not hasattr(getattr(_torch, "library", None), "custom_op"):
    _NO_TORCH = (f"needs PyTorch 2.4 or newer (torch.library.custom_op); this is "
                 f"PyTorch {getattr(_torch, '__version__', '(unknown version)')}")
    _torch = None

if _torch is not None:
    from ._blockmask import BlockMask
    from ._torch import attention, block_mask  # first: it replaces the name _torch above
    from ._serving import attention_varlen, attention_with_kvcache
    from ._merge import merge
    from ._native import status as native_training
else:
    def _needs_torch(what):
        def fn(*args, **kwargs):
            raise ImportError(f"flashjit.{what} {_NO_TORCH}; "
                              "Kernel, plan and layout work without it")
        fn.__name__ = fn.__qualname__ = what
        fn.__doc__ = f"flashjit.{what} needs PyTorch 2.4 or newer (pip install torch)."
        return fn

    attention = _needs_torch("attention")
    attention_varlen = _needs_torch("attention_varlen")
    attention_with_kvcache = _needs_torch("attention_with_kvcache")
    block_mask = _needs_torch("block_mask")
    BlockMask = _needs_torch("BlockMask")
    merge = _needs_torch("merge")

    def native_training():
        """(False, why): the C++ training call is PyTorch's."""
        return (False, "flashjit " + _NO_TORCH)

__all__ = ["attention", "attention_varlen", "attention_with_kvcache", "block_mask",
           "BlockMask", "merge", "Kernel", "plan", "layout", "fragments", "tune", "Plan",
           "Layout", "Resources", "TuneResult", "TensorParam", "Error", "InvalidArgument",
           "Unsupported", "ResourceLimit", "NoDevice", "CompileError", "LibraryNotFound",
           "device_info", "library_path", "library_version", "cache_dir", "builtin_mods",
           "native_training"]
