"""The interface of the simulator's KV memory policies, and the bookkeeping they share.

:class:`MemoryPolicy` is what :func:`paged_kv.sim.simulate` drives; the four policies of
the vLLM paper's §6.1 subclass it: the Orca baselines in :mod:`paged_kv.sim.contiguous`, paging
(vLLM §4.2) in :mod:`paged_kv.sim.paged`.  A *slot* holds one token's keys and values for every
layer.

Memory is classified as in the paper's Fig. 2.  For a running request with ``L`` tokens so far,
final length ``F`` = prompt + output and ``A`` slots allocated:
``token_states = L``, ``reserved = min(A, F) - L`` (slots future tokens will fill) and
``internal = A - min(A, F)`` (slots no token will ever fill).  ``external`` counts free slots no
request can use: for contiguous policies, holes smaller than the reservation of the request at
the head of the waiting queue; for paging, the slots past the last whole block.  The rest is
``free``.  The five always sum to ``pool_slots`` (checked by :meth:`MemoryPolicy.check`).

Token timing: a request admitted at step ``s0`` holds ``prompt + 1`` tokens after that step (its
prefill writes the prompt, and the first generated token gets its slot), and one more after each
later step, until it holds ``F`` and is freed.  Legend: BS block size, NB number of blocks.
"""

from __future__ import annotations

import numpy as np

from ..defaults import MAX_SEQ_LEN
from ..errors import BlockError
from ..validate import count

__all__ = ["CATEGORIES", "MemoryPolicy"]

CATEGORIES = ("token_states", "reserved", "internal", "external", "free")
TOKEN, RESERVED, INTERNAL, EXTERNAL, FREE = range(5)


class MemoryPolicy:
    """The interface every policy implements, and the bookkeeping they share.

    Aggregates are kept as plain ints updated on every event, so a simulator step costs O(1):
    ``num_seqs``; ``sum_len`` (token states); ``sum_cap`` (sum of ``min(A, F)``); ``sum_alloc``.
    """

    name = "policy"

    def __init__(self, pool_slots: int, max_seq_len: int = MAX_SEQ_LEN) -> None:
        self.pool_slots, self.max_seq_len = count("pool_slots", pool_slots), count("max_seq_len", max_seq_len)
        self.num_seqs = self.sum_len = self.sum_cap = self.sum_alloc = 0
        self._seqs: dict[int, list[int]] = {}  # rid -> [prompt_len, final_len, admit_step]
        self._now = -1

    # --- "can I?" ---------------------------------------------------------------------------
    def fits(self, prompt_len: int, output_len: int) -> bool:
        """Whether the request could ever run here, alone in an empty pool."""
        raise NotImplementedError

    def admission_need(self, prompt_len: int, output_len: int, rid: int | None = None) -> int:
        """Slots the request must find to be admitted (its reservation, or its prompt's blocks).

        ``rid`` names the request, for a policy that remembers a preempted one (sharing groups,
        :mod:`paged_kv.sim.sharing`); the others ignore it."""
        raise NotImplementedError

    def can_admit(self, prompt_len: int, output_len: int, rid: int | None = None) -> bool:
        raise NotImplementedError

    def shortfall(self, step: int) -> int:
        """How many blocks the running requests lack to grow by one token at ``step`` (0: none)."""
        return 0

    def prefill_tokens(self, prompt_len: int) -> int:
        """Prompt tokens the model computes to admit a request with ``prompt_len`` tokens (one
        sequence per request here; :mod:`paged_kv.sim.sharing` counts groups)."""
        return prompt_len

    def read_tokens(self) -> int:
        """Cached tokens a decode step's attention reads: every running sequence's whole context
        (the step time charges these; :mod:`paged_kv.sim.sharing` reads shared blocks once per
        sequence)."""
        return self.sum_len

    # --- "do it" ----------------------------------------------------------------------------
    def admit(self, rid: int, prompt_len: int, output_len: int, step: int) -> None:
        raise NotImplementedError

    def append(self, step: int) -> None:
        """Every running request gains one token at ``step``."""
        self._now = step
        self.sum_len += self.num_seqs

    def free(self, rid: int) -> None:
        raise NotImplementedError

    # --- reading ----------------------------------------------------------------------------
    def length(self, rid: int) -> int:
        """Tokens request ``rid`` holds now (prompt + generated)."""
        p, _, s0 = self._seqs[rid]
        return p + 1 + self._now - s0

    def running(self) -> list[int]:
        return list(self._seqs)

    def totals(self) -> tuple[int, int, int]:
        """``(token_states, reserved, internal)`` in slots, summed over running requests."""
        return self.sum_len, self.sum_cap - self.sum_len, self.sum_alloc - self.sum_cap

    def split_free(self, head_need: int | None) -> tuple[int, int]:
        """``(external, free)`` slots, given the admission need of the waiting queue's head."""
        raise NotImplementedError

    def owned_slots(self) -> dict[int, np.ndarray]:
        """rid -> its slot ids in logical (token) order; ``[A]`` int64 each."""
        raise NotImplementedError

    def free_runs(self, head_need: int | None) -> list[tuple[int, int, bool]]:
        """Unowned slots as ``(start, size, is_external)`` runs."""
        raise NotImplementedError

    def borders(self) -> np.ndarray:
        """Sorted slot ids (int64) where an allocation unit starts; 0 always.  The default marks
        every change of owner; the policies mark their blocks, regions and holes."""
        owner, _ = self.layout(None)
        return np.concatenate([[0], np.flatnonzero(owner[1:] != owner[:-1]) + 1]).astype(np.int64)

    def layout(self, head_need: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Slot-by-slot picture: ``owner [pool]`` int32 (rid, -1 unowned), ``category [pool]`` int8.

        Raises:
            BlockError: two requests own one slot, or a slot is both owned and free.
        """
        owner = np.full(self.pool_slots, -1, np.int32)
        cat = np.full(self.pool_slots, -1, np.int8)
        for rid, slots in self.owned_slots().items():
            if (owner[slots] != -1).any() or len(np.unique(slots)) != len(slots):
                raise BlockError(f"request {rid} owns a slot already owned: {slots[owner[slots] != -1][:5]}")
            owner[slots] = rid
            L, F = self.length(rid), self._seqs[rid][1]
            cap = min(len(slots), F)
            cat[slots[:L]], cat[slots[L:cap]], cat[slots[cap:]] = TOKEN, RESERVED, INTERNAL
        for start, size, ext in self.free_runs(head_need):
            if (cat[start:start + size] != -1).any():
                raise BlockError(f"free run [{start}, {start + size}) overlaps owned slots")
            cat[start:start + size] = EXTERNAL if ext else FREE
        return owner, cat

    def check(self, head_need: int | None = None) -> None:
        """Recount everything from the slot-by-slot layout and compare with the running sums.

        Raises:
            BlockError: a slot owned twice or not classified, or a running sum that drifted.
        """
        _, cat = self.layout(head_need)
        if (cat < 0).any():
            raise BlockError(f"{int((cat < 0).sum())} slots are neither owned nor free")
        counts = np.bincount(cat, minlength=5).tolist()
        expect = [*self.totals(), *self.split_free(head_need)]
        if counts != expect:
            raise BlockError(f"{self.name}: layout counts {dict(zip(CATEGORIES, counts))} != "
                             f"running sums {dict(zip(CATEGORIES, expect))}")

    def _add(self, rid: int, p: int, o: int, step: int, alloc: int) -> None:
        if rid in self._seqs:
            raise BlockError(f"request {rid} is already running")
        self._now = step
        self._seqs[rid] = [p, p + o, step]
        self.num_seqs += 1
        self.sum_len += p + 1
        self.sum_alloc += alloc
        self.sum_cap += min(alloc, p + o)

    def _remove(self, rid: int, alloc: int) -> None:
        if rid not in self._seqs:
            raise BlockError(f"request {rid} is not running")
        L, F = self.length(rid), self._seqs.pop(rid)[1]
        self.num_seqs -= 1
        self.sum_len -= L
        self.sum_alloc -= alloc
        self.sum_cap -= min(alloc, F)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(pool_slots={self.pool_slots}, running={self.num_seqs})"
