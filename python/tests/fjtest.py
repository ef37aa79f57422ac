"""What the tests share: flashjit imported (from PYTHONPATH, the installed
package, or this checkout's python/), torch if it imports, and whether a
GPU is there."""
import os
import sys

try:
    import flashjit  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import flashjit  # noqa: F401

try:
    import torch
except ImportError:
    torch = None

# The package takes a PyTorch older than 2.4 as none (flashjit/__init__.py).
NO_TORCH = ("PyTorch is not installed" if torch is None else
            f"PyTorch {torch.__version__} is older than the package's 2.4")
if torch is not None and not hasattr(torch.library, "custom_op"):
    torch = None
HAS_TORCH = torch is not None
HAS_CUDA = HAS_TORCH and torch.cuda.is_available()
NO_CUDA = "needs PyTorch with a CUDA GPU"

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEADER = os.path.join(REPO, "include", "flashjit.h")


def library_has_gpu():
    """Whether the library can open a GPU context here."""
    try:
        flashjit.device_info(0)
        return True
    except flashjit.NoDevice:
        return False
