"""Chapter 9's panel model: speculative decoding's KV side, one target pass at a time.

The reader picks a prompt, ``k`` and the n-gram length, and walks the passes: each draws the
sequence's block table through propose -> verify -> accept -> rollback
(:func:`paged_kv.viz.spec_decode.rollback_figure`): the lookahead slots the drafts take, the
blocks they cross into, the rejected slots taken back and the blocks freed.  The steps come from
:func:`paged_kv.spec_decode.replay_speculation` (a real block manager, no model): greedy
speculation's output is the target's greedy continuation, so given that continuation every step
follows from the proposer and the block manager alone.  The continuation is the tiny model's greedy
one, recorded at build time for the offered prompts (:mod:`paged_kv.panels.continuations`; a test
recomputes every recording from the model), so Jupyter and the browser draw the same figures.

Actions (JSON): ``{"op": "run", "prompt": text, "k": 1..8, "ngram": 1..4, "max_tokens": 1..120}``
(a new replay, shown at its first pass whose rollback frees a block), ``{"op": "prev"}``,
``{"op": "next"}`` (the pass before or after) and ``{"op": "rollback"}`` (the next pass whose
rollback frees a block, round to the first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import ConfigError
from ..model.tokenizer import ByteTokenizer
from ..spec_decode import NgramProposer, SpeculationTrace, replay_speculation
from ..validate import count
from ..viz.spec_decode import rollback_figure
from .base import PanelModel, select_control
from .continuations import OFFERED_PROMPTS, load_recordings
from .engine_panel import int_field, text_field

__all__ = ["MAX_K", "MAX_NGRAM", "MAX_TOKENS", "SpecDecodePanel", "SpecState", "pass_in_words"]

MAX_K = 8            # drafts per pass the panel offers
MAX_NGRAM = 4        # longest n-gram it offers
MAX_TOKENS = 120     # recorded continuations hold 128 bytes
# the default replay: the offered prompt whose first 48 recorded tokens draft the most (40 drafts, 9
# blocks freed at k = 4 with 2-grams; "To be, or not to be" drafts 14)
DEFAULT = {"prompt": "ROMEO:\nBut soft, what light", "k": 4, "ngram": 2, "max_tokens": 48}


@dataclass(frozen=True)
class SpecState:
    """A replay and the pass shown: ``prompt``, ``k``, ``ngram``, ``max_tokens`` (the settings),
    ``trace`` (the :class:`~paged_kv.spec_decode.SpeculationTrace`) and ``step`` (an index into
    its steps)."""

    prompt: str
    k: int
    ngram: int
    max_tokens: int
    trace: SpeculationTrace
    step: int


def _label(token_id: int) -> str:
    """A byte's text for a slot (a byte of a longer character shows as ``·``)."""
    return chr(token_id) if token_id < 128 else "·"


def pass_in_words(state: SpecState) -> str:
    """The pass shown, in words: drafts, accepted, slots rolled back, blocks freed."""
    s = state.trace.steps[state.step]
    k, a = len(s.drafted), s.accepted
    text = "".join(_label(t) for t in s.drafted).replace("\n", "⏎")
    if not k:
        return f"pass {s.index + 1}: no draft (no earlier {state.ngram}-gram matched); the pass emits 1 token"
    freed = (f"; block{'s' * (len(s.freed_blocks) > 1)} {', '.join(map(str, s.freed_blocks))} freed"
             if s.freed_blocks else "")
    return (f"pass {s.index + 1}: {k} draft{'s' * (k > 1)} \"{text}\", {a} accepted, {k - a} slot"
            f"{'s' * (k - a != 1)} rolled back{freed}; the pass emits {a + 1} token{'s' * (a > 0)}")


class SpecDecodePanel(PanelModel):
    """The speculative-decoding panel model (state: :class:`SpecState`).

    JSON-able arguments: ``block_size`` (tokens per block, default 4) and ``num_blocks`` (the pool,
    default 48, enough for the longest replay).  Python only: ``recordings`` (prompt ->
    continuation text; default the bundled ones).

    Raises:
        ConfigError: a bad size, or a pool too small for the longest replay the panel offers.
    """

    name = "spec_decode"
    title = "live speculative decoding"
    demo_actions = [
        {"op": "run", "prompt": OFFERED_PROMPTS[0], "k": 4, "ngram": 2, "max_tokens": 48},
        {"op": "next"},
        {"op": "rollback"},
        {"op": "prev"},
        {"op": "run", "prompt": OFFERED_PROMPTS[2], "k": 6, "ngram": 1, "max_tokens": 64},
    ]

    def __init__(self, block_size: int = 4, num_blocks: int = 48, *,
                 recordings: Mapping[str, str] | None = None) -> None:
        self.block_size = count("block_size (tokens per block)", block_size)
        self.num_blocks = count("num_blocks", num_blocks)
        longest = max(len(p.encode()) for p in OFFERED_PROMPTS) + MAX_TOKENS
        if self.num_blocks * self.block_size < longest:
            raise ConfigError(f"the panel's pool ({self.num_blocks} blocks of {self.block_size} tokens) must hold "
                              f"{longest} tokens, its longest replay")
        self.recordings = dict(load_recordings() if recordings is None else recordings)
        self.tokenizer = ByteTokenizer()

    # --- state ----------------------------------------------------------------------------------
    def initial(self) -> SpecState:
        return self._replay(**DEFAULT)

    def apply(self, state: SpecState, action: Mapping[str, Any]) -> SpecState:
        op = action["op"]
        steps = len(state.trace.steps)
        if op == "run":
            prompt = text_field(action, "prompt", DEFAULT["prompt"])
            if prompt not in self.recordings:
                raise ConfigError(f"prompt {prompt!r:.40} has no recorded continuation; pick one of the "
                                  f"offered prompts")
            return self._replay(prompt, int_field(action, "k", DEFAULT["k"], 1, MAX_K),
                                int_field(action, "ngram", DEFAULT["ngram"], 1, MAX_NGRAM),
                                int_field(action, "max_tokens", DEFAULT["max_tokens"], 1, MAX_TOKENS))
        if op in ("prev", "next"):
            to = state.step + (1 if op == "next" else -1)
            if not 0 <= to < steps:
                raise ConfigError(f"there is no pass {to + 1}: the replay has passes 1 to {steps}")
            return _at(state, to)
        if op == "rollback":
            freeing = [s.index for s in state.trace.steps if s.freed_blocks]
            if not freeing:
                raise ConfigError("no pass of this replay frees a block (every rollback stayed inside a block)")
            return _at(state, next((i for i in freeing if i > state.step), freeing[0]))
        raise ConfigError(f"unknown op {op!r}; the panel knows run, prev, next, rollback")

    def _replay(self, prompt: str, k: int, ngram: int, max_tokens: int) -> SpecState:
        target = self.tokenizer.encode(self.recordings[prompt])[:max_tokens]
        if not target:
            raise ConfigError(f"prompt {prompt!r:.40} has an empty recorded continuation")
        trace = replay_speculation(self.tokenizer.encode(prompt), target, NgramProposer(k, ngram, ngram),
                                   block_size=self.block_size, num_blocks=self.num_blocks)
        start = next((s.index for s in trace.steps if s.freed_blocks), 0)
        return SpecState(prompt, k, ngram, max_tokens, trace, start)

    # --- drawing --------------------------------------------------------------------------------
    def figure(self, state: SpecState):
        """The pass shown, phase by phase (:func:`paged_kv.viz.spec_decode.rollback_figure`)."""
        return rollback_figure(state.trace, state.step, _label, self.title)

    def status(self, state: SpecState) -> str:
        """The pass in words, the replay's totals against plain decoding, and where the tokens come from."""
        t = state.trace
        rate = "no drafts" if t.acceptance_rate is None else f"acceptance rate {t.acceptance_rate:.0%}"
        return "\n".join([
            pass_in_words(state),
            f"replay: {len(t.output_ids)} tokens in {t.passes} target passes (plain decoding: {len(t.output_ids)}); "
            f"{t.drafted} drafted, {t.accepted} accepted ({rate}), {t.rolled_back} slots rolled back, "
            f"{t.blocks_freed} blocks freed",
            "tokens: the tiny model's greedy continuation, recorded at build time (greedy speculation's "
            "output is exactly it)",
        ])

    def input_values(self, state: SpecState) -> dict[str, Any]:
        """The settings ``state`` was replayed with (the page puts its boxes back to them after a refusal)."""
        return {"prompt": state.prompt, "k": state.k, "ngram": state.ngram, "max_tokens": state.max_tokens}

    def controls(self) -> list[dict]:
        return [
            select_control("prompt", "prompt", DEFAULT["prompt"], [p for p in OFFERED_PROMPTS if p in self.recordings]),
            {"kind": "int", "name": "k", "label": "drafts", "value": DEFAULT["k"], "min": 1, "max": MAX_K},
            {"kind": "int", "name": "ngram", "label": "n-gram length", "value": DEFAULT["ngram"], "min": 1,
             "max": MAX_NGRAM},
            {"kind": "int", "name": "max_tokens", "label": "new tokens", "value": DEFAULT["max_tokens"], "min": 1,
             "max": MAX_TOKENS},
            {"kind": "button", "label": "replay", "op": "run"},
            {"kind": "button", "label": "◀ pass", "op": "prev"},
            {"kind": "button", "label": "pass ▶", "op": "next"},
            {"kind": "button", "label": "next freed block", "op": "rollback"},
        ]


def _at(state: SpecState, step: int) -> SpecState:
    return SpecState(state.prompt, state.k, state.ngram, state.max_tokens, state.trace, step)
