"""Triton kernels for paged-kv, one kernel per file, each with a plain PyTorch reference.

Importing this package first imports :mod:`kernels.runtime`, which decides once where the
kernels run (compiled on CUDA, the Triton interpreter on CPU) before Triton itself is imported.
"""

from . import runtime  # noqa: F401  (must run before anything imports triton)
