"""A forward pass's rows, read from a block manager: which tokens run, from where, into which slots.

:class:`BatchRow` is one sequence's part of a pass; :func:`read_rows` reads the rows of a pass from
a :class:`~paged_kv.blocks.BlockSpaceManager` whose slots are already given.  Pure bookkeeping:
``paged_kv.storage.batch`` turns rows into tensors (and re-exports both names), and the live block
panel without a model runs the same checks through it.
"""

from __future__ import annotations

from typing import Hashable, NamedTuple, Sequence

from ..errors import PromptError
from .manager import BlockSpaceManager

__all__ = ["BatchRow", "read_rows"]


class BatchRow(NamedTuple):
    """One sequence's part of a forward pass (a :class:`~paged_kv.scheduling.Chunk` has the same
    four fields and serves as a row too).

    Attributes:
        token_ids: the tokens run now.
        start: the position of the first; the ``start`` tokens before it are cached (the context).
        slot_mapping: the slot each token's K/V goes to.
        block_table: the sequence's physical blocks in logical order.
    """

    token_ids: Sequence[int]
    start: int
    slot_mapping: Sequence[int]
    block_table: Sequence[int]


def read_rows(manager: BlockSpaceManager, seq_ids: Sequence[Hashable], new_tokens: Sequence[Sequence[int]],
              starts: Sequence[int] | None = None) -> list[BatchRow]:
    """The rows of a pass, read from a block manager whose slots are already given: row ``b`` runs
    ``new_tokens[b]`` of sequence ``seq_ids[b]`` from position ``starts[b]`` (default: they are its
    last tokens, ``num_tokens - len``).

    Raises:
        PromptError: no sequences, lists of different lengths, or a row that is empty or runs
            past what its sequence holds.
        BlockError: (from the manager) an unknown sequence id.
    """
    seq_ids = list(seq_ids)
    if not seq_ids or len(seq_ids) != len(new_tokens):
        raise PromptError(f"need one token list per sequence: {len(seq_ids)} sequences, "
                          f"{len(new_tokens)} token lists")
    if starts is not None and len(starts) != len(seq_ids):
        raise PromptError(f"need one start per sequence: {len(seq_ids)} sequences, {len(starts)} starts")
    rows = []
    for b, (s, toks) in enumerate(zip(seq_ids, new_tokens)):
        n, k = manager.num_tokens(s), len(toks)
        x = n - k if starts is None else int(starts[b])
        if k < 1 or x < 0 or x + k > n:
            raise PromptError(f"sequence {s!r} holds {n} tokens; cannot run {k} new ones from position {x}")
        rows.append(BatchRow(list(toks), x, manager.slot_mapping(s, x, x + k), manager.block_ids(s)))
    return rows
