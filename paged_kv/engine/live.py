"""The live block panel's serving loop (chapters 5 and 6): requests come and go over one pool.

:class:`LiveRequests` serves requests with the tiny model through the real machinery, so the panel
shows what the engine does, not a drawing of it: a :class:`~paged_kv.blocks.BlockSpaceManager`
(driven through a :class:`~paged_kv.blocks.BlockHistory`, which records every event) decides the
slots, a :class:`~paged_kv.storage.PagedKVCache` holds the K/V, and
:func:`~paged_kv.storage.run_from_manager` runs the model through the block tables.  A fork shares
every block of its parent and copies the shared last block on its first write (copy-on-write,
vLLM paper §4.4).  When the pool is full the latest arrival is preempted by recompute (§4.5), by
:func:`paged_kv.scheduling.rules.preemption_victim`, the rule the simulator and the serving engine
call too.

Slots are labelled per byte (:meth:`~paged_kv.model.ByteTokenizer.token_labels`, a multi-byte
character on its first byte) and text is decoded incrementally, so an incomplete character never
shows as "\ufffd".  The panel around it is :func:`paged_kv.widgets.blocks.block_panel`.

Without a model the bookkeeping runs alone, the same calls in the same order, and each new token
comes from a token source (:mod:`paged_kv.engine.token_source`) or is 0.  The model's side (the
paged cache, the forward pass, sampling: torch) is loaded on first use, when a model is given
(``lazy_loader``, as ``paged_kv`` itself does), so this module imports where torch is absent.
"""

from __future__ import annotations

from collections import deque

import lazy_loader as lazy

from ..blocks import BlockHistory, BlockSpaceManager
from ..blocks.rows import read_rows
from ..errors import BlockError, ConfigError, PromptError
from ..sampling_params import SamplingParams
from ..scheduling.rules import preemption_victim, requeue_preempted
from ..validate import count

__all__ = ["LiveRequests"]

# Loaded on first use, with a model (tests/test_architecture.py reads these as imports).
storage = lazy.load("paged_kv.storage", suppress_warning=True)
sampling = lazy.load("paged_kv.model.sampling", suppress_warning=True)


class LiveRequests:
    """Requests served by the tiny model over one shared pool of KV blocks.

    Args:
        model: a :class:`~paged_kv.model.TinyLlama`, or ``None`` to run the bookkeeping alone (every
            generated token is then ``next_token``'s, or 0; without a tokenizer shown as ``"·"``).
        tokenizer: turns token ids into the labels drawn in the slots (needed with a model).
        num_blocks, block_size: the pool (NB blocks of BS token slots).
        backend: ``"torch"`` or ``"triton"`` attention.
        sampling: how every sequence picks its tokens (default greedy); sequence ``s`` draws from
            ``sample_generator(seed, s)``, so a fork continues differently from its parent.
        next_token: without a model, where each new token comes from: a token source
            (:data:`~paged_kv.engine.token_source.TokenSource`), called as
            ``next_token(seq, tuple(tokens))`` with the request's prompt and generated ids so far.

    Raises:
        OutOfBlocksError: (:meth:`add`, from the manager) the prompt does not fit the free blocks;
            nothing changes.
        PromptError: a bad prompt (empty, a bad length, or too long for the model).
        ConfigError: both a model and ``next_token`` (one source of tokens), or a ``next_token``
            that is not callable.
        BlockError: an unknown request (a :meth:`fork`, :meth:`preempt` or ``step(only=)`` of one
            that is not running), or an :meth:`add` while preempted requests wait to be recomputed
            (they are served first).
    """

    def __init__(self, model=None, tokenizer=None, num_blocks: int = 24, block_size: int = 8,
                 backend: str = "torch", sampling: SamplingParams | None = None, next_token=None) -> None:
        if next_token is not None and (model is not None or not callable(next_token)):
            raise ConfigError("next_token must be callable, and is for running without a model: got "
                              f"{next_token!r:.60} with {'a model' if model is not None else 'no model'}")
        self.model, self.tokenizer, self.backend = model, tokenizer, backend
        self.next_token = next_token
        self.sampling = sampling or SamplingParams()
        self.logits: dict[int, object] = {}   # per running request: the logits of its pending token
        self._gens: dict[int, object] = {}
        self.history = BlockHistory(BlockSpaceManager(num_blocks, block_size))
        self.cache = None
        if model is not None:
            self.cache = storage.PagedKVCache(model.cfg, num_blocks=num_blocks, block_size=block_size,
                                              dtype=model.dtype, device=model.device)
        self.pending: dict[int, int] = {}     # per running request: sampled, not yet cached token
        self.tokens: dict[int, list[int]] = {}
        self.waiting: deque[int] = deque()    # preempted requests, oldest first, to be recomputed
        self._next_id = 0

    @property
    def manager(self) -> BlockSpaceManager:
        return self.history.manager

    @property
    def running(self) -> list[int]:
        return self.manager.seq_ids

    def _labels(self, ids: list[int]) -> list[str]:
        """One slot label per token (see :meth:`~paged_kv.model.ByteTokenizer.token_labels`)."""
        return self.tokenizer.token_labels(ids) if self.tokenizer is not None else ["·"] * len(ids)

    def add(self, prompt: str | int) -> int:
        """Admit a request (prompt text, or a number of tokens) and prefill it; returns its id."""
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt) if self.tokenizer is not None else [0] * len(prompt)
            labels = list(prompt) if self.tokenizer is None else self._labels(ids)
            if not ids:
                raise PromptError(f"the prompt {prompt!r} has no tokens; a request needs >= 1")
        else:
            n = count("a prompt length (tokens)", prompt, minimum=1, error=PromptError)
            ids, labels = [ord(" ")] * n, [""] * n
        if self.model is not None and len(ids) >= self.model.cfg.max_seq_len:
            raise PromptError(f"a prompt of {len(ids)} tokens leaves no room below the model's "
                              f"max_seq_len {self.model.cfg.max_seq_len}")
        seq = self._next_id
        if self.waiting:
            raise BlockError(f"requests {list(self.waiting)} are waiting to be recomputed; they are "
                             f"served first (first come, first served): decode or finish one")
        self.history.allocate(seq, labels)           # raises OutOfBlocksError before any change
        self._next_id += 1
        self.tokens[seq] = list(ids)
        self._forward([seq], [ids], "prefill")
        return seq

    def fork(self, seq: int) -> int:
        """A new request that continues ``seq``: it shares all of ``seq``'s blocks (ref counts + 1,
        no block taken, vLLM paper §4.4) and draws its own pending token from ``seq``'s last logits.
        Returns the child's id.

        Raises:
            BlockError: ``seq`` is not running.
        """
        seq = self._running(seq)
        child = self._next_id
        self.history.fork(seq, child)
        self._next_id += 1
        self.tokens[child] = list(self.tokens[seq])
        self.logits[child] = self.logits[seq]
        self.pending[child] = self._pick(child, self.logits[child])
        return child

    def step(self, only: int | None = None) -> list[str]:
        """One decode step, of every running request or of ``only``; returns notes on what did not
        simply run.

        A full step (``only=None``) first readmits the oldest preempted request if all its tokens fit
        the free blocks (it is prefilled again: recompute).  Then every running request (or just
        ``only``: "append to one", one token for one sequence, as chapter 6's panel offers) gets a
        slot for its pending token.  When one needs a block and none is free, the latest arrival is
        preempted (:func:`~paged_kv.scheduling.rules.preemption_victim`, :meth:`preempt`) until the
        block is there, as vLLM does (§4.5); with ``only`` that may be another request, or ``only``
        itself when it is the latest.  A request alone in a pool too small for its next block waits.
        A write into a block other sequences share copies it first (copy-on-write, §4.4): the copy
        is this sequence's only, and the shared block loses one holder.  Appending to one request
        readmits nobody: only a full step is a scheduler iteration.

        Raises:
            BlockError: ``only`` is not a running request (unknown, finished, or waiting to be
                recomputed).
        """
        if only is None:
            notes, seqs = self._readmit(), sorted(self.running)   # oldest first: victims come from behind
        else:
            if not isinstance(only, bool) and isinstance(only, int) and only in self.waiting:
                raise BlockError(f"request {only} is waiting to be recomputed; a full decode step "
                                 f"readmits it once its tokens fit")
            notes, seqs = [], [self._running(only)]
        ran = []
        for seq in seqs:
            if seq not in self.running:                 # preempted earlier in this step
                continue
            if self.model is not None and self.manager.num_tokens(seq) >= self.model.cfg.max_seq_len:
                notes.append(f"request {seq} is at the model's max_seq_len; finish it")
                continue
            while not self.manager.can_append(seq):
                victim = preemption_victim([r for r in self.running if r not in ran])
                if victim == seq and len(self.running) == 1:
                    notes.append(f"request {seq} waits: needs {self.manager.blocks_to_append(seq)} "
                                 f"block, {self.manager.num_free_blocks} free, and nobody to preempt")
                    break
                self.preempt(victim, "the pool is full; the latest arrival goes first")
                notes.append(f"request {seq} needs a block, none free: request {victim} preempted "
                             f"(latest arrival), to be recomputed")
                if victim == seq:
                    break
            if seq not in self.running or not self.manager.can_append(seq):
                continue
            token = self.pending[seq]
            labels = self._labels(self.tokens[seq] + [token])
            n = len(self.tokens[seq])
            kept = self.history.labels.setdefault(seq, [""] * n)
            kept[max(0, n - 3):n] = labels[max(0, n - 3):n]  # a character completed now: label its lead byte
            self.history.append(seq, labels[-1])             # a slot (copy-on-write stays queued)
            self.tokens[seq].append(token)
            ran.append(seq)
        if ran:
            self._forward(ran, [[self.tokens[s][-1]] for s in ran], "decode")
        return notes

    def preempt(self, seq: int, reason: str = "") -> None:
        """Preempt running request ``seq`` by recompute (vLLM paper §4.5): its blocks go back to the
        free list now (a block it shares only loses one holder), it waits at the front of the queue
        (:func:`~paged_kv.scheduling.rules.requeue_preempted`), its pending token and logits are
        dropped, and a full :meth:`step` prefills all its tokens again once they fit.  ``reason``
        goes into the history's caption of the preemption (who or what preempted it).

        A full pool calls this from :meth:`step`; a panel calls it for the reader's "preempt".

        Raises:
            BlockError: ``seq`` is already waiting to be recomputed, or is not a running request.
        """
        if not isinstance(seq, bool) and isinstance(seq, int) and seq in self.waiting:
            raise BlockError(f"request {seq} is already preempted, waiting to be recomputed")
        seq = self._running(seq)
        self.history.preempt(seq, reason)
        requeue_preempted(self.waiting, seq)
        for state in (self.pending, self.logits):
            state.pop(seq, None)

    def _readmit(self) -> list[str]:
        """Readmit the oldest waiting request if its tokens fit now (FCFS: only the head)."""
        if not self.waiting:
            return []
        seq = self.waiting[0]
        ids = self.tokens[seq]
        if not self.manager.can_allocate(len(ids)):
            return [f"request {seq} waits to be recomputed: needs "
                    f"{-(-len(ids) // self.manager.block_size)} blocks, {self.manager.num_free_blocks} free"]
        self.waiting.popleft()
        self.history.allocate(seq, self._labels(ids))
        self._forward([seq], [ids], "prefill")
        return [f"request {seq} readmitted: its {len(ids)} tokens prefilled again (recompute)"]

    @property
    def requests(self) -> list[int]:
        """Every request not finished: the running ones, then the waiting (preempted) ones."""
        return self.running + list(self.waiting)

    def finish(self, seq: int) -> None:
        """The request is done: its blocks go back to the free list (a waiting request just leaves
        the queue)."""
        self._known(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
        else:
            self.history.free(seq)
        for state in (self.pending, self.tokens, self.logits, self._gens):
            state.pop(seq, None)

    def text(self, seq: int) -> str:
        """Prompt and generated text of request ``seq`` (its pending token included), decoded
        incrementally: a character whose bytes have not all been generated is left out."""
        seq = self._known(seq)
        toks = self.tokens[seq] + ([self.pending[seq]] if seq in self.pending else [])
        return self.tokenizer.decode(toks, final=False) if self.tokenizer is not None else ""

    def _known(self, seq) -> int:
        try:
            known = not isinstance(seq, bool) and seq in self.tokens
        except TypeError:           # unhashable, e.g. a list
            known = False
        if not known:
            raise BlockError(f"request {seq!r} is not running or waiting (running: {self.running}, "
                             f"waiting: {list(self.waiting)})")
        return seq

    def _running(self, seq) -> int:
        try:
            running = not isinstance(seq, bool) and seq in self.tokens and seq not in self.waiting
        except TypeError:           # unhashable, e.g. a list
            running = False
        if not running:
            raise BlockError(f"request {seq!r} is not running (running: {self.running})")
        return seq

    def _pick(self, seq: int, logits) -> int:
        """Sequence ``seq``'s next token from ``logits [V]``; without a model ``next_token``'s (0 without one)."""
        if logits is None:
            if self.next_token is None:
                return 0
            return count(f"next_token's token for request {seq}", self.next_token(seq, tuple(self.tokens[seq])), 0)
        if self.sampling.greedy:
            return int(logits.argmax())
        gen = self._gens.setdefault(seq, sampling.sample_generator(self.sampling.seed, seq))
        return int(sampling.sample(logits[None], self.sampling, [gen])[0])

    def _forward(self, seqs: list[int], ids: list[list[int]], phase: str) -> None:
        """Run the model on the new tokens of ``seqs`` (all already have their slots), then pick each
        one's pending token.  Without a model, the queued copy-on-write copies are dropped (nothing
        to copy)."""
        rows = [None] * len(seqs)
        if self.model is None:
            self.manager.take_copies()
            read_rows(self.manager, seqs, ids)       # the same checks as with a model
        else:
            logits = storage.run_from_manager(self.model, self.cache, self.manager, seqs, ids, phase, self.backend)
            rows = list(logits.float().cpu())
        for s, row in zip(seqs, rows):
            self.logits[s] = row
            self.pending[s] = self._pick(s, row)
