"""The live block-layout panel (chapter 5): requests come and go, and the pool fills and empties.

:class:`LiveRequests` serves requests with the tiny model through the real machinery: a
:class:`~paged_kv.blocks.BlockSpaceManager` (driven through a :class:`~paged_kv.history.BlockHistory`,
which records every event) decides the slots, a :class:`~paged_kv.paged_cache.PagedKVCache`
holds the K/V, and the model's forward pass reads them through the block tables (vLLM's
metadata, built by :func:`paged_kv.formats.vllm_layout`).  Each request is prefilled when it
arrives; each "decode step" feeds every running request its pending token (greedy).

:func:`block_panel` puts buttons around it: add a request (prompt text, or just a length: a
prompt of that many spaces), decode a step, finish a request; the figure
(:mod:`paged_kv.viz.blocks`) updates in place in a ``go.FigureWidget``, or is redrawn into an
``ipywidgets.Output`` where FigureWidget is unavailable (it needs ``anywidget``).
"""

from __future__ import annotations

import torch

from ..attention import AttentionMetadata
from ..block_allocator import as_count
from ..blocks import BlockSpaceManager
from ..errors import BlockError, PagedKVError, PromptError
from ..formats import vllm_layout
from ..history import BlockHistory


class LiveRequests:
    """Requests served by the tiny model over one shared pool of KV blocks.

    Args:
        model: a :class:`~paged_kv.model.TinyLlama`, or ``None`` to run the bookkeeping alone (every
            generated token is then shown as ``"·"``).
        tokenizer: turns token ids into the labels drawn in the slots (needed with a model).
        num_blocks, block_size: the pool (NB blocks of BS token slots).
        backend: ``"torch"`` or ``"triton"`` attention.

    Raises:
        OutOfBlocksError: (from the manager) a prompt does not fit the free blocks; nothing changes.
        PromptError: an empty prompt, a length that is not an int ``>= 1``, or a prompt longer
            than the model's ``max_seq_len``.
        BlockError: :meth:`text` or :meth:`finish` of a request that is not running.
    """

    def __init__(self, model=None, tokenizer=None, num_blocks: int = 24, block_size: int = 8,
                 backend: str = "torch") -> None:
        self.model, self.tokenizer, self.backend = model, tokenizer, backend
        self.history = BlockHistory(BlockSpaceManager(num_blocks, block_size))
        self.cache = None
        if model is not None:
            from ..paged_cache import PagedKVCache  # storage: the paged cache of chapter 5

            self.cache = PagedKVCache(model.cfg, num_blocks=num_blocks, block_size=block_size,
                                      dtype=model.dtype, device=model.device)
        self.pending: dict[int, int] = {}     # per running request: sampled, not yet cached token
        self.tokens: dict[int, list[int]] = {}
        self._next_id = 0

    @property
    def manager(self) -> BlockSpaceManager:
        return self.history.manager

    @property
    def running(self) -> list[int]:
        return self.manager.seq_ids

    def _label(self, token: int) -> str:
        return self.tokenizer.decode([token]) if self.tokenizer is not None else "·"

    def add(self, prompt: str | int) -> int:
        """Admit a request (prompt text, or a number of tokens) and prefill it; returns its id."""
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt) if self.tokenizer is not None else [0] * len(prompt)
            labels = list(prompt) if self.tokenizer is None else [self._label(t) for t in ids]
            if not ids:
                raise PromptError(f"the prompt {prompt!r} has no tokens; a request needs >= 1")
        else:
            n = as_count("a prompt length (tokens)", prompt, minimum=1, error=PromptError)
            ids, labels = [ord(" ")] * n, [""] * n
        if self.model is not None and len(ids) >= self.model.cfg.max_seq_len:
            raise PromptError(f"a prompt of {len(ids)} tokens leaves no room below the model's "
                              f"max_seq_len {self.model.cfg.max_seq_len}")
        seq = self._next_id
        self.history.allocate(seq, labels)           # raises OutOfBlocksError before any change
        self._next_id += 1
        self.tokens[seq] = list(ids)
        self.pending[seq] = self._forward([seq], [ids], "prefill")[0]
        return seq

    def step(self) -> list[str]:
        """One decode step for every running request that can get a slot; returns notes on those
        that could not (out of blocks: they wait, as a scheduler without preemption would)."""
        ran, notes = [], []
        for seq in self.running:
            if self.model is not None and self.manager.num_tokens(seq) >= self.model.cfg.max_seq_len:
                notes.append(f"request {seq} is at the model's max_seq_len; finish it")
                continue
            if not self.manager.can_append(seq):
                notes.append(f"request {seq} waits: needs {self.manager.blocks_to_append(seq)} "
                             f"block, {self.manager.num_free_blocks} free")
                continue
            token = self.pending[seq]
            event = self.history.append(seq, self._label(token)).event
            if self.cache is not None:
                self.cache.copy_blocks(list(event.copies))   # copy-on-write (only after a fork)
            self.tokens[seq].append(token)
            ran.append(seq)
        if ran:
            nxt = self._forward(ran, [[self.tokens[s][-1]] for s in ran], "decode")
            self.pending.update(zip(ran, nxt))
        return notes

    def finish(self, seq: int) -> None:
        """The request is done: its blocks go back to the free list."""
        self._running(seq)
        self.history.free(seq)
        self.pending.pop(seq, None)
        self.tokens.pop(seq, None)

    def text(self, seq: int) -> str:
        """Prompt and generated text of running request ``seq`` (its pending token included)."""
        seq = self._running(seq)
        toks = self.tokens[seq] + [self.pending[seq]]
        return self.tokenizer.decode(toks) if self.tokenizer is not None else ""

    def _running(self, seq) -> int:
        try:
            running = not isinstance(seq, bool) and seq in self.tokens
        except TypeError:           # unhashable, e.g. a list
            running = False
        if not running:
            raise BlockError(f"request {seq!r} is not running (running: {self.running})")
        return seq

    @torch.no_grad()
    def _forward(self, seqs: list[int], ids: list[list[int]], phase: str) -> list[int]:
        """Run the model on the new tokens of ``seqs`` (all already have their slots); greedy next tokens."""
        if self.model is None:
            return [0] * len(seqs)
        dev = self.model.device
        lay = vllm_layout(self.manager, seqs, new_tokens=[len(x) for x in ids], pad=0)
        T = max(len(x) for x in ids)
        x = torch.zeros(len(seqs), T, dtype=torch.long)
        slots = torch.full((len(seqs), T), -1, dtype=torch.int64)      # (B, T), -1 = padding
        start = 0
        for b, row in enumerate(ids):
            x[b, :len(row)] = torch.tensor(row)
            slots[b, :len(row)] = lay.slot_mapping[start:start + len(row)]
            start += len(row)
        paged = dict(slot_mapping=slots.to(dev), block_tables=lay.block_tables.to(dev))
        if phase == "prefill":
            lens = torch.tensor([len(r) for r in ids], dtype=torch.int32, device=dev)
            meta = AttentionMetadata.for_prefill(lens, T, **paged)
            logits = self.model(x.to(dev), meta, self.cache, self.backend)
            logits = logits[torch.arange(len(seqs)), lens.long() - 1]
        else:
            meta = AttentionMetadata.for_decode(lay.seq_lens.to(dev), **paged)
            logits = self.model(x.to(dev), meta, self.cache, self.backend)[:, 0]
        return logits.argmax(-1).tolist()


def block_panel(model=None, tokenizer=None, num_blocks: int = 24, block_size: int = 8,
                use_figure_widget: bool | None = None, load_model: bool = True):
    """The live panel over a fresh :class:`LiveRequests`; returns an ``ipywidgets.VBox``.

    With ``model=None`` and ``load_model`` the bundled tiny model is loaded.  ``use_figure_widget``:
    ``None`` tries ``go.FigureWidget`` and falls back to redrawing into an ``Output``.
    The panel's ``.live`` attribute is the :class:`LiveRequests` it drives.
    """
    import ipywidgets as w

    from . import figure_widget_or_output
    from IPython.display import display

    from ..viz.blocks import blocks_figure, refresh_blocks_figure

    if model is None and load_model:
        from ..checkpoint import load_tiny_model

        model, tokenizer = load_tiny_model()
    live = LiveRequests(model, tokenizer, num_blocks, block_size)
    title = f"{num_blocks} blocks × {block_size} slots"
    fig = blocks_figure(live.history.snapshots, title=title, replay=False)
    fig, out = figure_widget_or_output(fig, use_figure_widget)

    prompt = w.Text(value="To be, or not to be", description="prompt", layout=w.Layout(width="320px"))
    length = w.BoundedIntText(value=12, min=1, max=num_blocks * block_size, description="or length",
                              layout=w.Layout(width="170px"))
    add_text, add_len = w.Button(description="add prompt"), w.Button(description="add length")
    decode = w.Button(description="decode step", button_style="primary")
    which = w.Dropdown(options=[], description="request", layout=w.Layout(width="160px"))
    finish = w.Button(description="finish", button_style="warning")
    status = w.HTML()

    def redraw(note: str = "") -> None:
        if out is None:
            refresh_blocks_figure(fig, live.history.snapshots, title)
        else:
            out.clear_output(wait=True)
            with out:
                display(blocks_figure(live.history.snapshots, title=title, replay=False))
        which.options = live.running
        texts = "<br>".join(f"<b>{s}</b>: {live.text(s)!r}" for s in live.running) if model is not None else ""
        status.value = (f"<span style='color:#c00'>{note}</span><br>" if note else "") + texts

    def act(fn):
        def handler(_):
            try:
                redraw(fn() or "")
            except PagedKVError as e:          # e.g. OutOfBlocksError: show it, change nothing
                redraw(str(e))
        return handler

    def finish_selected():
        if which.value is None:
            return "no request to finish"
        live.finish(which.value)

    add_text.on_click(act(lambda: live.add(prompt.value) and ""))
    add_len.on_click(act(lambda: live.add(int(length.value)) and ""))
    decode.on_click(act(lambda: "; ".join(live.step())))
    finish.on_click(act(finish_selected))
    redraw()
    panel = w.VBox([w.HBox([prompt, add_text, length, add_len]), w.HBox([decode, which, finish]),
                    status, fig if out is None else out])
    panel.live = live
    return panel
