"""The order of a forward pass's sums, as plain data: :class:`ReductionOrder` and its key tiles.

The reasons and the PyTorch path that follows the order are in :mod:`paged_kv.model.reduction`;
this part needs no torch, so the engine's config (:class:`~paged_kv.engine.EngineConfig`) and the
browser build import it alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..validate import count

__all__ = ["ReductionOrder", "check_reduction", "split_bounds"]


@dataclass(frozen=True)
class ReductionOrder:
    """How a forward pass orders its sums (the engine's ``reduction``; ``None`` there means the
    PyTorch references of ``kernels/``, one softmax over all keys).

    Attributes:
        split_size: keys per attention tile (an int >= 1): the split of split-KV attention.
        batch_invariant: ``False``, the natural order: a pass's tiles restart at its first new
            token (the cached context ``[0, c)`` in tiles from 0, then the new tokens in tiles from
            ``c``), and each matmul runs over the pass's rows at once.  ``True``: tiles at
            ``0, s, 2s, ...`` of the sequence in every pass, and each row's matmul alone
            (batch-invariant: Thinking Machines 2025, vLLM ``VLLM_BATCH_INVARIANT``).

    Raises:
        ConfigError: ``split_size`` not an int >= 1, or ``batch_invariant`` not a bool.
    """

    split_size: int = 16
    batch_invariant: bool = False

    def __post_init__(self) -> None:
        count("split_size (keys per tile)", self.split_size, 1)
        if not isinstance(self.batch_invariant, bool):
            raise ConfigError(f"batch_invariant must be a bool, got {self.batch_invariant!r}")

    def __str__(self) -> str:
        kind = "fixed" if self.batch_invariant else "natural"
        return f"{kind} split of {self.split_size} keys"


def check_reduction(reduction) -> ReductionOrder | None:
    """``reduction`` if it is ``None`` or a :class:`ReductionOrder`, else ``ConfigError`` naming it."""
    if reduction is not None and not isinstance(reduction, ReductionOrder):
        raise ConfigError(f"reduction must be a ReductionOrder or None, got {reduction!r:.60}")
    return reduction


def split_bounds(context_len: int, seq_len: int, order: ReductionOrder) -> list[tuple[int, int]]:
    """The key tiles ``[(start, stop), ...]`` a pass reduces in order, for a row whose ``seq_len``
    keys are ``context_len`` cached ones then the pass's new tokens.

    Natural order: ``[0, s), [s, 2s), ...`` up to ``context_len``, then ``[c, c + s), ...`` up to
    ``seq_len`` (a tile never straddles ``c``).  Batch-invariant: ``[0, s), [s, 2s), ...`` up to
    ``seq_len``, whatever ``context_len`` is.  The tiles cover ``0 .. seq_len - 1`` once, in order,
    each at most ``s = order.split_size`` keys.  A query at position ``p`` reads the tiles that
    start at or before ``p``, its own cut at ``p + 1`` by the causal mask.

    Raises:
        ConfigError: ``0 <= context_len < seq_len`` does not hold, or ``order`` is not a
            :class:`ReductionOrder`.
    """
    if not isinstance(order, ReductionOrder):
        raise ConfigError(f"order must be a ReductionOrder, got {order!r:.60}")
    seq_len = count("seq_len", seq_len, 1)
    context_len = count("context_len", context_len, 0)
    if context_len >= seq_len:
        raise ConfigError(f"a pass has at least one new token: context_len {context_len} >= seq_len {seq_len}")
    s = order.split_size
    starts = range(0, seq_len, s) if order.batch_invariant else \
        [*range(0, context_len, s), *range(context_len, seq_len, s)]
    stops = [*starts[1:], seq_len]
    return list(zip(starts, stops))
