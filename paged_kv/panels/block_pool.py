"""The panel models of chapters 5 and 6: requests over one pool of KV blocks, and forks that share it.

:class:`BlockPoolPanel` (chapter 5): add a request (typed text, or just a length: a prompt of that
many spaces), run a decode step for every running request, finish one, preempt one by recompute;
the figure is the pool and the block tables (:func:`paged_kv.viz.blocks.blocks_figure`) or the
paper's logical view (:func:`paged_kv.viz.logical_view.logical_view_figure`, §4.3 Figures 6-7).
:class:`ForkPanel` (chapter 6): the same pool with forks: a request forks into ``n`` samples that
share all its blocks (ref counts go up, no block is taken), the first write into a shared last
block copies it (copy-on-write, vLLM paper §4.4: a decode step writes for every sample, "append"
for one), and finishing a sample returns only the blocks
no other sample holds; the figure frames shared blocks and draws each copy
(:func:`paged_kv.viz.sharing.sharing_figure`).

The state wraps a :class:`~paged_kv.engine.LiveRequests`, the real loop over the real
:class:`~paged_kv.blocks.BlockSpaceManager`, so a panel shows what the manager does, not a drawing
of it.  Where its tokens come from depends on where the panel runs:

* in Jupyter or Colab (``model=`` given, or a ``live_requests_factory``): the tiny model decodes
  them through the paged cache, as before;
* in the browser (the default: no model, JSON-able arguments only): there is no torch, so each
  request replays the tiny model's greedy continuation recorded at build time for the prompts the
  panels offer (:func:`paged_kv.panels.continuations.load_recordings`, through
  :class:`~paged_kv.engine.token_source.RecordedTokens`); any other prompt gets a stand-in, its own
  bytes repeated, and the status text says which is which.

Pure: :meth:`BlockPoolPanel.apply` works on a deep copy of the state (the KV cache and the token
source included; the model, the tokenizer and the sampling parameters are shared, not copied:
they never change, and the recorded snapshots are frozen), so a refused action leaves the
front's state as it was, and one state can be continued two ways.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

from ..engine.live import LiveRequests
from ..engine.token_source import RecordedTokens
from ..errors import BlockError, ConfigError, PromptError
from ..model.tokenizer import ByteTokenizer
from ..validate import count
from ..viz.blocks import blocks_figure, refresh_blocks_figure
from ..viz.logical_view import logical_view_figure
from ..viz.sharing import refresh_sharing_figure, sharing_figure
from .base import PanelModel, filled, select_control
from .continuations import OFFERED_PROMPTS, load_recordings

__all__ = ["BlockPoolPanel", "ForkPanel", "PoolState", "VIEWS"]

VIEWS = ("pool", "logical")   # the pool slot by slot with the block tables; the paper's logical view
MAX_FORKS = 8                 # samples one "fork" may add: a pool of the book's size holds no more to see

RECORDED_NOTE = ("tokens: the tiny model's greedy continuations, recorded when the book was built, of the "
                 "prompts this panel offers (no model runs in the browser); any other prompt gets a "
                 "stand-in: its own bytes, repeated")
#: said once, the first time a request's tokens are a stand-in
STAND_IN_NOTE = ("a stand-in: no model runs in the browser, and this prompt's continuation was not recorded "
                 "when the book was built, so its new tokens are its own bytes repeated; the blocks behave "
                 "as they would with the model's tokens")


@dataclass
class PoolState:
    """A block panel's state: the serving loop, the figure's ``view`` (one of :data:`VIEWS`), what
    the last action said (``message``, e.g. who a decode step preempted) and, in the browser, the
    token source ``live`` draws from (``source``, a :class:`RecordedTokens`: part of the state and
    copied with it, so that one that kept state could never leak it from one state to another)."""

    live: LiveRequests
    view: str = "pool"
    message: str = ""
    source: RecordedTokens | None = None
    #: the once-only notes an earlier status already said (:meth:`BlockPoolPanel.notes`)
    said: frozenset = frozenset()


class BlockPoolPanel(PanelModel):
    """Chapter 5's block pool: requests come and go over ``num_blocks`` blocks of ``block_size`` slots.

    Actions (JSON): ``{"op": "add", "prompt": text}``, ``{"op": "add_length", "length": n}`` (a
    prompt of ``n`` spaces), ``{"op": "step"}`` (one decode step for every running request; a full
    pool preempts the latest arrival, §4.5), ``{"op": "finish", "request": id}``,
    ``{"op": "preempt", "request": id}`` (by recompute: its blocks are freed at once, and it is
    prefilled again once it fits), ``{"op": "view", "view": "pool" | "logical"}``.  Any action may
    carry ``"view"`` (the page sends every input with every button).

    Args:
        num_blocks, block_size: the pool (JSON-able, as every argument before ``model``).
        sharing: also ``{"op": "fork"}``, ``{"op": "append"}`` and the sharing overlays (what
            :class:`ForkPanel` is).
        view: the view shown first.
        prompt, length: the controls' first values.
        model, tokenizer: (Python only) a :class:`~paged_kv.model.TinyLlama` and its tokenizer: the
            tokens are the model's (Jupyter, Colab).
        sampling: (Python only, with ``model``) how each sequence picks its tokens (default greedy).
        live_requests_factory: (Python only) ``factory(num_blocks=..., block_size=...)`` returning
            the :class:`~paged_kv.engine.LiveRequests` to drive, instead of either of the above.
        recordings: (Python only, without a model) ``{prompt: continuation}`` to replay instead of
            :func:`~paged_kv.panels.continuations.load_recordings`.
        start: actions applied to make the initial state (JSON-able), so a page's first figure
            could show requests in the pool rather than an empty one.  The chapters pass none: the
            figure under "Run live" is the state the Jupyter panel (:func:`~paged_kv.widgets.block_panel`,
            which takes no ``start``) opens with, an empty pool of the same size.

    Raises:
        ConfigError: a bad pool size, ``length`` or ``prompt``, ``sharing`` not a bool, an unknown
            ``view``, ``sampling`` without a model, ``start`` not a list of actions.
        PagedKVError: a ``start`` action is refused (as :meth:`apply`).
    """

    name = "block_pool"
    sharing_default = False
    #: a session of chapter 5: two requests, a decode step, a length too large (refused), one that
    #: fits, a preemption seen in the logical view, a finish, and the recompute it lets in
    demo_actions = [
        {"op": "add", "prompt": "To be, or not to be"},
        {"op": "add", "prompt": "JULIET:\nO Romeo, Romeo!"},
        {"op": "step"},
        {"op": "add_length", "length": 150},
        {"op": "add_length", "length": 100},
        {"op": "preempt", "request": 1, "view": "logical"},
        {"op": "finish", "request": 0, "view": "pool"},
        {"op": "step"},
    ]

    def __init__(self, num_blocks: int = 24, block_size: int = 8, sharing: bool | None = None,
                 view: str = "pool", prompt: str = "To be, or not to be", length: int = 12, *,
                 model=None, tokenizer=None, sampling=None,
                 live_requests_factory: Callable[..., LiveRequests] | None = None,
                 recordings: Mapping[str, str] | None = None, start: Sequence[Mapping[str, Any]] = ()) -> None:
        self.num_blocks = count("num_blocks", num_blocks, minimum=1)
        self.block_size = count("block_size", block_size, minimum=1)
        if sharing is not None and not isinstance(sharing, bool):
            raise ConfigError(f"sharing must be true or false, got {sharing!r:.40}")
        self.sharing = self.sharing_default if sharing is None else sharing
        self.view = _view(view)
        if not isinstance(prompt, str):
            raise ConfigError(f"prompt must be text, got {prompt!r:.60}")
        self.prompt, self.length = prompt, count("length", length, minimum=1)
        if sampling is not None and model is None:
            raise ConfigError("sampling needs a model: without one the tokens are recorded greedy ones")
        self.model, self.tokenizer, self.sampling = model, tokenizer, sampling
        self.factory = live_requests_factory
        self.recordings = None
        if model is None and live_requests_factory is None:     # the browser: recorded tokens
            self.tokenizer = tokenizer or ByteTokenizer()
            self.recordings = dict(load_recordings() if recordings is None else recordings)
        self.title = f"{self.num_blocks} blocks × {self.block_size} slots"
        if not isinstance(start, (list, tuple)) or not all(isinstance(a, Mapping) for a in start):
            raise ConfigError(f"start must be a list of actions, got {start!r:.80}")
        self.start = [dict(a) for a in start]
        if start:
            self.initial()                                      # a start action that is refused fails here

    # --- the state -------------------------------------------------------------------------------
    def initial(self) -> PoolState:
        """A fresh serving loop over an empty pool, as configured (see the class docstring), after
        the constructor's ``start`` actions (the first figure a page shows)."""
        if self.factory is not None:
            state = PoolState(self.factory(num_blocks=self.num_blocks, block_size=self.block_size), self.view)
        elif self.model is not None:
            state = PoolState(LiveRequests(self.model, self.tokenizer, self.num_blocks, self.block_size,
                                           sampling=self.sampling), self.view)
        else:
            source = RecordedTokens(self.recordings, self.tokenizer)
            state = PoolState(LiveRequests(None, self.tokenizer, self.num_blocks, self.block_size,
                                           next_token=source), self.view, source=source)
        for action in self.start:
            state = self.apply(state, action)
        return replace(state, said=frozenset())               # the first status says every note

    def _copy(self, state: PoolState) -> PoolState:
        """A deep copy of ``state`` sharing what never changes: the model, tokenizer and sampling
        parameters, and the recorded (frozen) snapshots and events."""
        live = state.live
        memo: dict[int, Any] = {}
        for shared in (live.model, live.tokenizer, live.sampling, *live.history.snapshots):
            if shared is not None:
                memo[id(shared)] = shared
        return copy.deepcopy(state, memo)

    # --- actions ---------------------------------------------------------------------------------
    def ops(self) -> tuple[str, ...]:
        """The ``"op"`` values :meth:`apply` takes."""
        return ("add", "add_length", "step", "finish", "preempt", "view") + (("fork", "append") if self.sharing else ())

    def apply(self, state: PoolState, action: Mapping[str, Any]) -> PoolState:
        """The state after ``action`` (see the class docstring); ``state`` is left as it was.

        Raises:
            ConfigError: an unknown ``"op"`` or ``"view"``, a bad ``"n"``, an empty (``None``)
                ``"length"`` or ``"n"``: the page's empty box.
            PromptError: an empty prompt, a bad length, a prompt too long for the model.
            OutOfBlocksError: the prompt does not fit the free blocks.
            BlockError: an unknown request, no request given, an ``add`` while preempted requests
                wait, a fork, append or preemption of a request that is not running.
        """
        op = action.get("op")
        if op not in self.ops():
            raise ConfigError(f"unknown action {op!r} for the {self.name} panel; one of {list(self.ops())}")
        new = self._copy(state)
        new.said = state.said | {key for key, _ in self.notes(state)}
        before = len(new.live.history.snapshots)
        if "view" in action:
            new.view = _view(action["view"])
        live = new.live
        if op == "add":
            prompt = action.get("prompt")
            if not isinstance(prompt, str):
                raise PromptError(f"a prompt must be text, got {prompt!r:.60}")
            live.add(prompt)
            new.message = ""
        elif op == "add_length":
            length = filled("the prompt length (length)", action.get("length"))
            live.add(count("a prompt length (tokens)", length, minimum=1, error=PromptError))
            new.message = ""
        elif op == "step":
            if not live.running and not live.waiting:
                new.message = "nothing is running: add a request first, then a decode step gives it a token"
            else:
                new.message = "; ".join(live.step())
        elif op == "finish":
            live.finish(_request(action, "finish"))
            new.message = ""
        elif op == "preempt":
            seq = _request(action, "preempt")
            live.preempt(seq, "by the reader")
            new.message = f"request {seq} preempted: its blocks are free, and it is recomputed when its tokens fit"
        elif op == "append":
            new.message = "; ".join(live.step(only=_request(action, "append to")))
        elif op == "fork":
            new.message = self._fork(live, _request(action, "fork"), action.get("n", 1))
        else:                                                   # "view"
            new.message = ""
        copies = [(snap.event.seq_id, src, dst) for snap in live.history.snapshots[before:]
                  for src, dst in snap.event.copies]
        if copies:
            said = "; ".join(f"request {seq} wrote into shared block {src}: copied to block {dst}"
                             for seq, src, dst in copies)
            new.message = "; ".join(x for x in (new.message, f"copy-on-write: {said}") if x)
        return new

    @staticmethod
    def _fork(live: LiveRequests, seq, n) -> str:
        """Fork ``n`` samples off running request ``seq`` (each shares all its blocks)."""
        n = count("samples (n)", filled("samples (n)", n), minimum=1)
        if n > MAX_FORKS:
            raise ConfigError(f"fork at most {MAX_FORKS} samples (n) at once, got {n}")
        if seq in live.waiting:
            raise BlockError(f"request {seq} is waiting to be recomputed; fork a running request")
        kids = [live.fork(seq) for _ in range(n)]
        if n == 1:
            return f"request {kids[0]} forked from request {seq}: it shares all its blocks"
        return f"requests {', '.join(map(str, kids))} forked from request {seq}: they share all its blocks"

    # --- what the fronts draw ----------------------------------------------------------------------
    def figure(self, state: PoolState):
        """The pool and block tables (with the sharing overlays when ``sharing``), or the logical
        view, of the state's last snapshot; colours follow the whole history."""
        snaps = state.live.history.snapshots
        if state.view == "logical":
            return logical_view_figure(snaps, title=self.title, replay=False)
        draw = sharing_figure if self.sharing else blocks_figure
        return draw(snaps, title=self.title, replay=False)

    def refresh_figure(self, fig, state: PoolState) -> None:
        """Redraw ``fig`` (a ``go.FigureWidget`` from :meth:`figure` in the pool view) in place."""
        refresh = refresh_sharing_figure if self.sharing else refresh_blocks_figure
        refresh(fig, state.live.history.snapshots, self.title)

    def request_lines(self, state: PoolState) -> list[tuple[int, str, str]]:
        """Per request not finished, oldest first: ``(id, text so far, where its tokens come from)``,
        the last ``"preempted, waiting"`` for a waiting request, else ``"recorded"`` or
        ``"stand-in"`` in the browser, else ``""``.  Empty without a tokenizer (no text to show)."""
        live = state.live
        if live.tokenizer is None:
            return []
        lines = []
        for s in live.requests:
            if s in live.waiting:
                source = "preempted, waiting"
            elif state.source is not None:
                source = "recorded" if state.source.is_recorded(tuple(live.tokens[s])) else "stand-in"
            else:
                source = ""
            lines.append((s, live.text(s), source))
        return lines

    def status(self, state: PoolState) -> str:
        """Plain text: what the last action said, then one line per request (its text, and in the
        browser whether its tokens are the model's recorded ones or a stand-in)."""
        live = state.live
        lines = [state.message] if state.message else []
        lines.append(f"{live.manager.num_free_blocks} of {self.num_blocks} blocks free; running {live.running}, "
                     f"waiting {list(live.waiting)}")
        lines += [f"request {s}" + (f" ({source})" if source else "") + ": " + _shown(text)
                  for s, text, source in self.request_lines(state)]
        lines += [text for _, text in self.notes(state)]
        return "\n".join(lines)

    def notes(self, state: PoolState) -> list[tuple[str, str]]:
        """The once-only notes ``state``'s status says, as ``(key, text)``: in the browser, where its
        tokens come from (the first status), and what a stand-in is (the first status with one);
        each is said once, not again after the next action (:attr:`PoolState.said`)."""
        if state.source is None:
            return []
        out = [("recorded", RECORDED_NOTE)]
        if any(source == "stand-in" for _, _, source in self.request_lines(state)):
            out.append(("stand-in", STAND_IN_NOTE))
        return [(k, text) for k, text in out if k not in state.said]

    def controls(self) -> list[dict]:
        pool = self.num_blocks * self.block_size
        out = [select_control("prompt", "prompt", self.prompt, OFFERED_PROMPTS),
               {"kind": "button", "label": "add prompt", "op": "add"},
               {"kind": "int", "name": "length", "label": "or length", "value": min(self.length, pool),
                "min": 1, "max": pool},
               {"kind": "button", "label": "add length", "op": "add_length"},
               {"kind": "button", "label": "decode step", "op": "step"},
               {"kind": "int", "name": "request", "label": "request", "value": 0, "min": 0}]
        if self.sharing:
            out += [{"kind": "int", "name": "n", "label": "samples", "value": 1, "min": 1, "max": MAX_FORKS},
                    {"kind": "button", "label": "fork", "op": "fork"},
                    {"kind": "button", "label": "append to selected", "op": "append"},
                    {"kind": "button", "label": "finish / prune", "op": "finish"}]
        else:
            out += [{"kind": "button", "label": "finish", "op": "finish"},
                    {"kind": "button", "label": "preempt", "op": "preempt"}]
        out += [{"kind": "select", "name": "view", "label": "view", "value": self.view, "options": list(VIEWS)},
                {"kind": "button", "label": "show view", "op": "view"}]
        return out


class ForkPanel(BlockPoolPanel):
    """Chapter 6's fork and copy-on-write: :class:`BlockPoolPanel` with ``sharing`` (16 blocks of 4
    slots by default).  ``{"op": "fork", "request": id, "n": n}`` forks ``n`` samples off a running
    request: they share all its blocks, whose ref counts go up by ``n``;
    ``{"op": "append", "request": id}`` decodes one token for that sample alone
    (:meth:`LiveRequests.step` with ``only``): its first write into the shared, partly filled last
    block copies that block for it only, and the block's ref count falls by one; a decode step does
    the same for every sample, copying for each but the last writer (copy-on-write); ``finish`` ends
    (prunes) one sample, returning only the blocks whose ref count falls to 0.

    In the browser every sample replays the same recorded greedy continuation, so the samples do
    not diverge (the Jupyter panel samples at temperature 0.8); the blocks behave the same.
    """

    name = "fork"
    sharing_default = True
    #: a prompt, three samples, one token appended to one of them (its copy of the shared last
    #: block), that sample pruned (its copy back), a decode step (one more copy), a fork of the
    #: finished sample (refused), the logical view
    demo_actions = [
        {"op": "add", "prompt": "To be, or not"},
        {"op": "fork", "request": 0, "n": 2},
        {"op": "append", "request": 1},
        {"op": "finish", "request": 1},
        {"op": "step"},
        {"op": "fork", "request": 1, "n": 1},
        {"op": "view", "view": "logical"},
    ]

    def __init__(self, num_blocks: int = 16, block_size: int = 4, sharing: bool | None = None,
                 view: str = "pool", prompt: str = "To be, or not", length: int = 6, **kwargs) -> None:
        super().__init__(num_blocks, block_size, sharing, view, prompt, length, **kwargs)


def _view(view) -> str:
    if view not in VIEWS:
        raise ConfigError(f"unknown view {view!r}; one of {list(VIEWS)}")
    return view


def _request(action: Mapping[str, Any], verb: str):
    """The action's ``"request"`` (``None`` or absent: refused, there is none to act on)."""
    seq = action.get("request")
    if seq is None:
        raise BlockError(f"no request to {verb}")
    return seq


def _shown(text: str) -> str:
    """A request's text for the status line: quoted, or, when it is only spaces (a prompt given by
    its length is that many spaces, and its stand-in repeats them), how many, since a quoted row
    of blanks reads as nothing at all."""
    if text and not text.strip(" "):
        return f"{len(text)} spaces (a prompt given by its length)"
    return repr(text)
