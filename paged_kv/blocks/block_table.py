"""Block tables: a sequence's logical blocks and the physical blocks that hold them.

Bookkeeping only (pure Python, no tensors), following the vLLM paper §4.2-4.3: a sequence's
KV cache is a list of *logical* blocks of ``block_size`` token slots, filled left to right; a
*block table* maps each logical block to a *physical* block of the pool.  Token ``p`` lives in
slot ``block_ids[p // BS] * BS + p % BS`` (vLLM's ``slot_mapping``).

Legend: BS block size (tokens per block).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Hashable

from ..errors import BlockError
from ..validate import count

__all__ = ["BlockTable", "blocks_needed", "check_seq_id", "group_blocks_held", "group_blocks_needed", "stored_tokens"]


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks that hold ``num_tokens`` tokens: ``ceil(num_tokens / block_size)`` (0 for 0 tokens).

    Raises:
        BlockError: ``num_tokens`` is not an int ``>= 0`` (e.g. ``-5`` or ``10.5``).
        ConfigError: ``block_size`` is not an int ``>= 1``.
    """
    n = count("num_tokens", num_tokens, minimum=0, error=BlockError)
    bs = count("block_size", block_size, minimum=1)
    return -(-n // bs)


def stored_tokens(prompt_len: int, max_tokens: int) -> int:
    """Tokens whose K/V a sequence holds when it has generated ``max_tokens``:
    ``prompt_len + max_tokens - 1``.  The last sampled token is returned to the caller and never
    fed back, so no step writes its K/V.

    Raises:
        ConfigError: a count that is not an int >= 1.
    """
    return count("prompt_len", prompt_len, 1) + count("max_tokens", max_tokens, 1) - 1


def group_blocks_held(shared_len, length, width, block_size):
    """Blocks a group of ``width`` sequences holds when each has ``length`` tokens and all of them
    share their first ``shared_len`` tokens (``length >= shared_len``).

    The shared tokens' *full* blocks are held once.  Until a sequence writes past them
    (``length == shared_len``) even the partly filled last block is shared, so the group holds
    ``ceil(length / BS)`` blocks.  Once they write, every sequence owns the rest: the partial
    block is copied on each write but the last holder's (copy-on-write, vLLM paper §4.4) and the
    blocks after it are new: ``shared_len // BS + width * (ceil(length / BS) - shared_len // BS)``.

    Unchecked arithmetic (``//``, ``*``, ``-``, ``>``), so ints and numpy arrays that broadcast work
    alike (the simulator sums it over whole traces); :func:`group_blocks_needed` is the checked
    form for one request.
    """
    shared = shared_len // block_size
    own = -(-length // block_size) - shared
    return shared + own * (1 + (width - 1) * (length > shared_len))


def group_blocks_needed(prompt_len: int, total_tokens: int, n: int, block_size: int) -> int:
    """Most blocks ``n`` samples of one prompt hold at once, each storing ``total_tokens`` at its
    end (prompt + max_tokens - 1, :func:`stored_tokens`) and sharing the prompt
    (:func:`group_blocks_held`; the count only grows, so the peak is at the end).  With
    ``max_tokens = 1`` (``total_tokens == prompt_len``) nobody writes and the prompt's blocks are
    all the group ever holds.  Tested against the peak of the real block manager over a grid.

    Raises:
        ConfigError: a count that is not an int, ``n`` or ``block_size`` below 1, or
            ``total_tokens`` below ``prompt_len`` (>= 1).
    """
    prompt_len = count("prompt_len", prompt_len, 1)
    total_tokens = count(f"total_tokens (>= prompt_len {prompt_len})", total_tokens, prompt_len)
    n, block_size = count("n (samples)", n, 1), count("block_size", block_size, 1)
    return group_blocks_held(prompt_len, total_tokens, n, block_size)


def check_seq_id(seq_id) -> Hashable:
    """A sequence id is a ``str`` or an int (numpy ints become ``int``; bools are refused, since
    ``True == 1`` would name sequence 1).  Raises ``BlockError`` naming anything else."""
    if type(seq_id) is int or isinstance(seq_id, str):
        return seq_id
    if not isinstance(seq_id, bool):
        try:
            return operator.index(seq_id)
        except TypeError:
            pass
    raise BlockError(f"a sequence id must be a str or an int, got {seq_id!r} ({type(seq_id).__name__})")


@dataclass
class BlockTable:
    """One sequence's block table: logical block ``i`` lives in physical block ``block_ids[i]``.

    Attributes:
        block_size: token slots per block (BS).
        block_ids: physical block id of each logical block, in logical order.
        num_tokens: tokens the sequence holds; they fill logical blocks left to right, so
            logical block ``i`` holds :meth:`filled` ``(i)`` tokens (the paper's "# filled").

    Raises:
        ConfigError: ``block_size`` not an int ``>= 1``.
        BlockError: a block id that is not an int ``>= 0``; ``num_tokens`` not an int ``>= 0``
            or more than ``len(block_ids) * block_size`` (the blocks cannot hold them).
    """

    block_size: int
    block_ids: list[int] = field(default_factory=list)
    num_tokens: int = 0

    def __post_init__(self) -> None:
        self.block_size = count("block_size", self.block_size, minimum=1)
        if isinstance(self.block_ids, (str, bytes)):
            raise BlockError(f"block_ids must be a list of ints, got {self.block_ids!r}")
        self.block_ids = [count("a block id", b, minimum=0, error=BlockError) for b in self.block_ids]
        self.num_tokens = count("num_tokens", self.num_tokens, minimum=0, error=BlockError)
        capacity = len(self.block_ids) * self.block_size
        if self.num_tokens > capacity:
            raise BlockError(f"num_tokens={self.num_tokens} does not fit in {len(self.block_ids)} "
                             f"blocks x {self.block_size} slots = {capacity}")

    def __len__(self) -> int:
        return len(self.block_ids)

    def __getitem__(self, logical: int) -> int:
        return self.block_ids[logical]

    def __iter__(self):
        return iter(self.block_ids)

    def filled(self, logical: int) -> int:
        """Tokens held by logical block ``logical`` (``block_size`` for all but the last; 0 for a
        block reserved past the last token, which only a hand-built table can have)."""
        if not 0 <= logical < len(self.block_ids):
            raise BlockError(f"logical block {logical} outside 0..{len(self.block_ids) - 1}")
        return max(0, min(self.block_size, self.num_tokens - logical * self.block_size))

    def locate(self, position: int) -> tuple[int, int]:
        """``(logical block, offset)`` of token ``position`` (0-based) in the sequence."""
        if not 0 <= position < len(self.block_ids) * self.block_size:
            raise BlockError(f"position {position} is outside the table's "
                             f"{len(self.block_ids)} blocks x {self.block_size} slots")
        return divmod(position, self.block_size)

    def slot(self, position: int) -> int:
        """Physical slot of token ``position``:
        ``block_ids[logical] * block_size + offset``."""
        logical, offset = self.locate(position)
        return self.block_ids[logical] * self.block_size + offset

    def entries(self) -> list[tuple[int, int, int]]:
        """``(logical, physical, filled)`` per block: the table as the paper's Figure 6 draws it."""
        return [(i, b, self.filled(i)) for i, b in enumerate(self.block_ids)]

    def copy(self) -> "BlockTable":
        return BlockTable(self.block_size, list(self.block_ids), self.num_tokens)
