"""The exceptions paged-kv raises: one hierarchy, so callers can catch ``PagedKVError``.

Every error names the bad value in its message.  Most also subclass the built-in exception a
Python user would expect (``ValueError``, ``TypeError``, ``KeyError``, ``MemoryError``), so
``except ValueError`` in a reader's own code keeps working.
"""

from __future__ import annotations


class PagedKVError(Exception):
    """Base class of every error raised on purpose by ``paged_kv`` and ``kernels``."""


class ConfigError(PagedKVError, ValueError):
    """A configuration value is impossible (e.g. ``num_heads`` not divisible by ``num_kv_heads``)."""


class UnknownPresetError(PagedKVError, KeyError):
    """A model or GPU preset name is not known; the message lists the known ones."""

    def __str__(self) -> str:  # KeyError would otherwise quote the whole message
        return str(self.args[0]) if self.args else ""


class PromptError(PagedKVError, ValueError):
    """A prompt cannot be decoded: empty, too long for the cache, or holding invalid token ids."""


class TensorError(PagedKVError, TypeError):
    """A tensor has the wrong shape, dtype or device for the call it was passed to."""


class CacheError(PagedKVError, ValueError):
    """A KV cache was used outside its bounds (a sequence longer than it holds, a bad slot)."""


class OutOfBlocksError(PagedKVError, MemoryError):
    """The block pool has too few free blocks; carries ``needed`` and ``free`` (in blocks).

    Raised before any state changes, so the caller can preempt or wait and retry.
    """

    def __init__(self, needed: int, free: int, what: str = "") -> None:
        self.needed = needed
        self.free = free
        detail = f" for {what}" if what else ""
        super().__init__(f"out of KV blocks{detail}: needed {needed}, free {free}")


class AdmissionError(PagedKVError, ValueError):
    """A request can never be served: even an empty pool could not hold it (or it is longer than
    the model's context).  Raised at submission, with the reason; nothing was queued."""


class BlockError(PagedKVError, ValueError):
    """Block bookkeeping was misused: freeing a free block, an unknown block id or sequence id."""


class KernelUnavailableError(PagedKVError, RuntimeError):
    """A Triton kernel was asked for where Triton cannot run (e.g. macOS/Windows without wheels)."""


class DTypeNotSupportedError(PagedKVError, TypeError):
    """A dtype the current device cannot compute in (e.g. bf16 on a T4, or under the interpreter)."""
