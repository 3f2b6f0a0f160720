"""Chapter 7's panel model: the serving engine step by step (submit requests, step, run until
idle, preempt by recompute or swap, abort), its queues and its GPU and CPU pools.

Every decision of the live serving panel lives here; the ipywidgets panel
(:func:`paged_kv.widgets.serving.serving_panel`) and the browser edition's page controls both
forward the reader's actions to :class:`ServingPanel`.  Chunked prefill comes from the token
budget (``max_num_batched_tokens``, 8 by default: a 19-token prompt is prefilled over three steps).
In the browser there is no model: the engine's time is the timing model's and its tokens the
tiny model's recorded continuations (:mod:`paged_kv.panels.engine_panel`), and the status line
says so.

Actions (JSON): ``{"op": "submit", "prompt": text, "max_tokens": 1..200, "n": 1..4}`` (``n > 1``:
parallel samples at temperature 0.8, seed 0, sharing the prompt's blocks; the browser's recorded
tokens are greedy, so there its samples agree), ``{"op": "step"}``, ``{"op": "run"}`` (until idle),
``{"op": "preempt", "request": id, "mode": "swap" | "recompute"}`` (a swap without room in the CPU
pool falls back to recompute, :meth:`paged_kv.scheduling.Scheduler.preempt`) and ``{"op": "abort",
"request": id}`` (any state; its blocks are free at once, :meth:`LLMEngine.abort_request`).
Requests are named ``A``, ``B``, ... in submission order.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..engine.config import EngineConfig
from ..engine.llm_engine import LLMEngine
from ..errors import PagedKVError
from ..sampling_params import SamplingParams
from ..viz.serving import serving_figure
from .base import select_control
from .continuations import OFFERED_PROMPTS
from .engine_panel import EnginePanel, EngineState, RooflineTiming, engine_config, int_field, text_field

__all__ = ["DEFAULT_PROMPT", "MAX_SAMPLES", "MAX_TOKENS", "ServingPanel", "live_requests", "next_request_name", "request_id"]

#: the prompt the panel offers (its continuation is recorded for the browser)
DEFAULT_PROMPT = "To be, or not to be"
#: the most new tokens and samples a request may ask for
MAX_TOKENS, MAX_SAMPLES = 200, 4


class ServingPanel(EnginePanel):
    """The serving engine's panel model (state: :class:`~paged_kv.panels.engine_panel.EngineState`).

    JSON-able arguments (what the page passes as ``live_args``): ``block_size`` (tokens per block),
    ``num_gpu_blocks``, ``num_cpu_blocks`` (the swap space), ``max_num_batched_tokens`` (the
    step's token budget: chunked prefill), ``watermark``, ``preemption_mode`` (the mode of the
    scheduler's own preemptions and the default of the button), and the browser's timing model:
    ``timing_model`` (a :mod:`paged_kv.memory` preset), ``gpu``, ``efficiency``
    (:class:`~paged_kv.panels.engine_panel.RooflineTiming`).  Defaults: 16 GPU and 16 CPU blocks
    of 4 tokens, a budget of 8 tokens, no watermark, swap.

    Python only: ``model`` and ``tokenizer`` (the tiny model, Jupyter side; ``None``: the browser
    configuration), ``config`` (a ready :class:`EngineConfig`, instead of the knobs above: give one
    or the other), ``recordings`` (``{prompt: continuation}``, default the build's).

    Raises:
        ConfigError: a bad knob (as :class:`EngineConfig`), knobs given with ``config``.
    """

    name = "serving"
    OPS = {"submit": "submit", "step": "step_once", "run": "run_until_idle", "preempt": "preempt",
           "abort": "abort"}
    demo_actions = [
        {"op": "submit", "prompt": DEFAULT_PROMPT, "max_tokens": 12, "n": 1},
        {"op": "step"},
        {"op": "submit", "prompt": DEFAULT_PROMPT, "max_tokens": 8, "n": 2},
        {"op": "step"},
        {"op": "preempt", "request": "A", "mode": "swap"},
        {"op": "step"},
        {"op": "abort", "request": "B"},
        {"op": "run"},
    ]
    KNOBS = {"block_size": 4, "num_gpu_blocks": 16, "num_cpu_blocks": 16, "max_num_batched_tokens": 8,
             "watermark": 0.0, "preemption_mode": "swap"}

    def __init__(self, block_size: int | None = None, num_gpu_blocks: int | None = None,
                 num_cpu_blocks: int | None = None, max_num_batched_tokens: int | None = None,
                 watermark: float | None = None, preemption_mode: str | None = None,
                 timing_model: str = "OPT-13B", gpu: str = "A100-40GB", efficiency: float = 0.5, *,
                 model=None, tokenizer=None, config: EngineConfig | None = None,
                 recordings: Mapping[str, str] | None = None) -> None:
        knobs = dict(block_size=block_size, num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=num_cpu_blocks,
                     max_num_batched_tokens=max_num_batched_tokens, watermark=watermark,
                     preemption_mode=preemption_mode)
        super().__init__(engine_config(config, knobs, self.KNOBS), model, tokenizer,
                         RooflineTiming(timing_model, gpu, efficiency), recordings)

    @property
    def title(self) -> str:
        """The figure's title (the Jupyter panel's, ``"live engine"``, unchanged)."""
        return "live engine" if self.model is not None else "live engine (timing model, recorded tokens)"

    # --- ops: each changes the engine in place and returns what it did --------------------------
    def submit(self, engine: LLMEngine, action: Mapping[str, Any]) -> str:
        k = int_field(action, "n", 1, 1, MAX_SAMPLES)
        params = SamplingParams(max_tokens=int_field(action, "max_tokens", 12, 1, MAX_TOKENS), n=k,
                                temperature=0.8 if k > 1 else 0.0, seed=0 if k > 1 else None)
        rid = engine.add_request(text_field(action, "prompt", DEFAULT_PROMPT), params,
                                 request_id=next_request_name(engine))
        return f"request {rid} is waiting"

    def preempt(self, engine: LLMEngine, action: Mapping[str, Any]) -> str:
        name = action.get("request")
        if name is None or name == "":
            raise PagedKVError("no running request to preempt")
        mode = action.get("mode", self.config.preemption_mode)
        used = engine.scheduler.preempt(request_id(engine, name), mode)
        return f"request {name} preempted by {used}"

    def abort(self, engine: LLMEngine, action: Mapping[str, Any]) -> str:
        name = action.get("request")
        if name is None or name == "":
            raise PagedKVError("no request to abort")
        rid = request_id(engine, name)
        done = engine.output(rid)
        if done.finished:          # the engine changes nothing; say so rather than "aborted" again
            reasons = ", ".join(dict.fromkeys(r for r in done.finish_reason if r))
            raise PagedKVError(f"request {name} has already finished ({reasons}): nothing to abort")
        engine.abort_request(rid)
        return f"request {name} aborted: its blocks are free"

    # --- drawing --------------------------------------------------------------------------------
    def figure(self, state: EngineState):
        """Queues, GPU pool and CPU pool now (:func:`paged_kv.viz.serving.serving_figure`)."""
        return serving_figure(state.engine.records, self.title, replay=False)

    def status(self, state: EngineState) -> str:
        """What the last action did, where time and tokens come from, then each sample's text."""
        lines = [state.message] if state.message else []
        return "\n".join(lines + [self.timing_line(state.engine)] + self.output_lines(state.engine))

    def choices(self, state: EngineState) -> list[str]:
        """The requests a preempt or abort can name now (unfinished, in submission order)."""
        return live_requests(state.engine)

    def controls(self) -> list[dict]:
        return [
            select_control("prompt", "prompt", DEFAULT_PROMPT, OFFERED_PROMPTS),
            {"kind": "int", "name": "max_tokens", "label": "new tokens", "value": 12, "min": 1, "max": MAX_TOKENS},
            {"kind": "int", "name": "n", "label": "samples", "value": 1, "min": 1, "max": MAX_SAMPLES},
            {"kind": "button", "label": "submit", "op": "submit"},
            {"kind": "button", "label": "step", "op": "step"},
            {"kind": "button", "label": "run until idle", "op": "run"},
            {"kind": "text", "name": "request", "label": "request", "value": "A"},
            {"kind": "select", "name": "mode", "label": "mode", "value": self.config.preemption_mode,
             "options": ["swap", "recompute"]},
            {"kind": "button", "label": "preempt", "op": "preempt"},
            {"kind": "button", "label": "abort", "op": "abort"},
        ]


def live_requests(engine: LLMEngine) -> list[str]:
    """The unfinished requests' ids as text (waiting, running, swapped), in submission order."""
    sch = engine.scheduler
    return [str(r.request_id) for r in sorted([*sch.waiting, *sch.running, *sch.swapped], key=lambda r: r.order)]


def next_request_name(engine: LLMEngine) -> str:
    """The first free name of ``A`` .. ``Z``, ``A1`` .. ``Z1``, ...

    Raises:
        PagedKVError: every name is in use (676 requests)."""
    used = {str(r) for r in engine.scheduler.requests}
    for k in range(26 * 26):
        name = chr(65 + k % 26) + ("" if k < 26 else str(k // 26))
        if name not in used:
            return name
    raise PagedKVError("too many requests for one panel")


def request_id(engine: LLMEngine, name) -> Any:
    """The id of the request named ``name`` (its id as text).

    Raises:
        PagedKVError: no such request (named)."""
    for rid in engine.scheduler.requests:
        if str(rid) == str(name):
            return rid
    raise PagedKVError(f"no request {name!r}")
