"""Device and dtype policy for the kernels, and the Triton-interpreter switch.

Imported first by ``kernels/__init__.py``.  Decides, in one place:

* **Where kernels run.**  With a CUDA GPU, Triton compiles them.  Without one, the Triton
  interpreter runs them on the CPU (``TRITON_INTERPRET=1``), which must be set before the
  kernels are defined: Triton reads it when its ``jit`` decorator wraps a kernel (older
  releases: when ``triton`` is imported).  We set it here, before any kernel module is
  imported, and warn if Triton did not pick it up.
* **Which dtype the book computes in.**  fp32 on the CPU; on CUDA, bf16 only on compute
  capability >= 8.0 (Ampere and newer), fp16 otherwise.  A T4 (sm_75) answers
  ``torch.cuda.is_bf16_supported()`` with ``True`` because PyTorch emulates bf16 there, but
  Triton cannot compile bf16 ``tl.dot`` for sm_75, so we look at the capability instead.
* **What happens without Triton** (macOS, Windows): the package still imports; the
  ``@triton.jit`` kernels become stubs that raise :class:`KernelUnavailableError` when launched,
  and the model falls back to the PyTorch references.
"""

import os
import sys
import warnings

import torch

from paged_kv.errors import DTypeNotSupportedError, KernelUnavailableError

import kernels as _package  # noqa: E402  (being imported: its __init__ set the flag before importing us)

if not getattr(_package, "_PAGED_KV", False):
    raise ImportError(
        f"'kernels' was imported from {getattr(_package, '__file__', '?')}, which is not paged-kv's "
        "kernels/__init__.py: the PyPI distribution 'kernels' shares the import name and its "
        "__init__.py replaced ours. Use a separate environment for one of them, or run `pip uninstall "
        "-y kernels paged-kv` and reinstall paged-kv.", name="kernels")

_CUDA = torch.cuda.is_available()

_PRE_IMPORTED = "triton" in sys.modules
if not _CUDA and os.environ.get("TRITON_INTERPRET") is None:
    os.environ["TRITON_INTERPRET"] = "1"

try:
    import triton  # noqa: E402
    import triton.language as tl  # noqa: E402

    HAS_TRITON = True
    TRITON_UNAVAILABLE_REASON = ""
    # Recent Triton reads TRITON_INTERPRET when @triton.jit wraps a kernel (which happens after
    # this module runs), older releases when triton is imported. Warn only if it was too late.
    _knobs = getattr(triton, "knobs", None)
    if _PRE_IMPORTED and not _CUDA and _knobs is not None and not _knobs.runtime.interpret:
        warnings.warn(
            "triton was imported before kernels.runtime on a machine without CUDA and did not "
            "pick up TRITON_INTERPRET=1; set it before starting Python.", RuntimeWarning, stacklevel=2)
except ImportError as exc:  # macOS / Windows: no Triton wheels
    HAS_TRITON = False
    TRITON_UNAVAILABLE_REASON = (
        f"Triton is not installed ({exc}); Triton publishes wheels for Linux only, so on macOS "
        "and Windows the PyTorch reference path runs instead")

    class _Stub:
        """Stands in for a ``@triton.jit`` kernel; launching it raises."""

        def __init__(self, fn):
            self.fn = fn

        def __getitem__(self, grid):
            raise KernelUnavailableError(
                f"cannot launch Triton kernel {self.fn.__name__}: {TRITON_UNAVAILABLE_REASON}")

    class _TritonStub:
        @staticmethod
        def jit(fn=None, **kwargs):
            return _Stub(fn) if fn is not None else _Stub

        @staticmethod
        def cdiv(a, b):
            return -(-a // b)

        @staticmethod
        def next_power_of_2(n):
            return 1 << max(0, int(n) - 1).bit_length()

    class _TlStub:
        constexpr = object

    triton = _TritonStub()  # type: ignore[assignment]
    tl = _TlStub()  # type: ignore[assignment]


# tl.dot on NVIDIA GPUs needs every dimension >= 16 (fp16/bf16; fp32 needs 8). The CPU
# interpreter does not enforce it: head_dim 8 ran there and failed to compile for sm_75/80/90
# (tests/kernels/gpu_compile.py found it). Columns past D are masked on load and store.
DOT_MIN = 16


def head_tile(head_dim: int) -> int:
    """``BLOCK_D`` for a kernel that feeds head_dim columns to ``tl.dot``: the next power of two
    >= ``head_dim``, and at least :data:`DOT_MIN` (16). Padded columns are masked (read as 0)."""
    return max(DOT_MIN, triton.next_power_of_2(int(head_dim)))


def interpreter_active() -> bool:
    """True when Triton kernels run in the CPU interpreter rather than compiled on a GPU."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_available() -> bool:
    """True when Triton kernels can be launched here (compiled on CUDA or interpreted on CPU)."""
    return HAS_TRITON and (_CUDA or interpreter_active())


def triton_status() -> str:
    """One line for the book: where Triton kernels run on this machine, or why they cannot."""
    if not HAS_TRITON:
        return TRITON_UNAVAILABLE_REASON
    if interpreter_active():
        return (f"Triton {triton.__version__} kernels run in the Triton interpreter on the CPU "
                "(correct but slow: timings here say nothing about GPU speed)")
    if _CUDA:
        cap = torch.cuda.get_device_capability()
        return (f"Triton {triton.__version__} kernels are compiled for "
                f"{torch.cuda.get_device_name()} (sm_{cap[0]}{cap[1]})")
    return "Triton is installed but neither a CUDA GPU nor the interpreter is active"


def require_triton() -> None:
    """Raise :class:`KernelUnavailableError` (with the reason) unless kernels can run here."""
    if not triton_available():
        raise KernelUnavailableError(triton_status())


def default_device() -> torch.device:
    """``cuda`` when a GPU is present, else ``cpu``."""
    return torch.device("cuda" if _CUDA else "cpu")


def default_dtype(device: torch.device | str | None = None, capability=None) -> torch.dtype:
    """The dtype the book computes in on ``device``.

    CPU: float32.  CUDA: bfloat16 on compute capability >= (8, 0), float16 below (T4 = (7, 5)).
    ``capability`` overrides the queried one (used by the tests to pretend to be a T4).
    """
    device = torch.device(device) if device is not None else default_device()
    if device.type != "cuda":
        return torch.float32
    if capability is None:
        capability = torch.cuda.get_device_capability(device)
    return torch.bfloat16 if tuple(capability) >= (8, 0) else torch.float16


def check_kernel_dtype(dtype: torch.dtype, device: torch.device, capability=None) -> None:
    """Raise :class:`DTypeNotSupportedError` if a Triton kernel cannot compute in ``dtype`` here.

    Supported: fp32 and fp16 everywhere; bf16 only compiled on compute capability >= 8.0.  Under
    the interpreter bf16 is refused: NumPy has no bfloat16, and computing on its raw bits would
    give silently wrong numbers.
    """
    if dtype in (torch.float32, torch.float16):
        return
    if dtype == torch.bfloat16:
        if device.type != "cuda":
            raise DTypeNotSupportedError(
                "bfloat16 is not supported by the Triton interpreter on the CPU (NumPy has no "
                "bfloat16); cast to float32 or float16 first")
        cap = tuple(capability or torch.cuda.get_device_capability(device))
        if cap < (8, 0):
            raise DTypeNotSupportedError(
                f"bfloat16 needs compute capability >= 8.0, this GPU is sm_{cap[0]}{cap[1]}; "
                "use float16")
        return
    raise DTypeNotSupportedError(f"kernels compute in float32/float16/bfloat16, got {dtype}")
