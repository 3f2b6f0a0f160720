"""What the engine's two panel models share (chapter 7's serving panel, chapter 8's prefix cache):
an :class:`~paged_kv.engine.LLMEngine` as the state, copied per action, and where its time and
tokens come from.

Two configurations run the same engine, scheduler and block manager:

* in a Jupyter or Colab kernel, the tiny model (:class:`~paged_kv.engine.runner.ModelRunner`):
  real K/V, sampled tokens, the wall clock;
* in the browser (no torch), a :class:`~paged_kv.engine.timing_runner.TimingRunner`: each step
  costs what :class:`RooflineTiming` charges a large model on a datacenter GPU for the tokens it
  reads and prefills (the roofline of :meth:`paged_kv.sim.ServingSetup.iteration_time`, the vLLM
  paper's set-up: OPT-13B on an A100-40GB), and each new token is the tiny model's greedy
  continuation recorded at build time (:class:`~paged_kv.engine.token_source.RecordedTokens`,
  ``paged_kv/panels/continuations.json``), or, for a prompt that was not recorded, a stand-in that
  the status line labels as such.

Why copy the engine: a panel model is pure (:mod:`paged_kv.panels.base`), and an engine is the
package's own mutable object.  :meth:`EnginePanel.apply` deep-copies it and acts on the copy; the
step records (frozen :class:`~paged_kv.engine.StepRecord`), the model's weights, the tokenizer and
the token source are shared, not copied, so the copy costs the scheduler's and pools' bookkeeping
only (``tests/panels/test_serving_panel.py`` measures it).  The ipywidgets panel keeps one engine for the
reader to inspect (``panel.engine``) and calls :meth:`EnginePanel.act` on it, the same decisions in
place.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Mapping

from .. import memory
from ..memory.decode_cost import IterationTime
from ..errors import ConfigError, PagedKVError
from ..validate import count, real
from ..engine.config import EngineConfig
from ..engine.llm_engine import LLMEngine
from ..engine.step_record import sample_name
from ..engine.timing_runner import SwapTime, TimingRunner
from ..engine.token_source import RecordedTokens
from ..model.tokenizer import ByteTokenizer
from .base import PanelModel, filled
from .continuations import load_recordings

__all__ = ["MAX_RUN_STEPS", "EnginePanel", "EngineState", "RooflineTiming",
           "engine_config", "field_name", "int_field", "text_field"]

#: "run until idle" stops after this many steps, so a click always returns
MAX_RUN_STEPS = 500


@dataclass(frozen=True)
class RooflineTiming:
    """Seconds per engine step and per swap for a large model on one GPU: the timing model the
    browser panels run instead of the tiny model.

    :meth:`iteration_time` is :meth:`paged_kv.memory.decode_cost.IterationTime.roofline` (the
    simulator's clock too): a step reads every weight once and every cached K/V byte once at the
    GPU's bandwidth, and prefill computes 2 FLOPs per parameter per token at its fp16 peak, both
    scaled by ``efficiency`` (0.5, as :class:`paged_kv.sim.ServingSetup`: the paper's regime).
    :meth:`swap_time` is :class:`paged_kv.engine.timing_runner.SwapTime` with one copy per block,
    layer, K and V (vLLM v0's ``swap_blocks``) over a PCIe 4.0 x16 link
    (:data:`~paged_kv.engine.timing_runner.PCIE4_X16_BYTES_PER_S`,
    :data:`~paged_kv.engine.timing_runner.COPY_CALL_S`).  Both are assumptions of a model, not
    measurements; this class only picks the model's and GPU's numbers from the presets of
    :mod:`paged_kv.memory` and holds no formula of its own.

    Args:
        model: a preset of :mod:`paged_kv.memory` (``"OPT-13B"``, ``"Llama-2-13B"``, ...), fp16.
        gpu: a GPU preset with bandwidth and peak (``"A100-40GB"``).
        efficiency: the share of both peaks reached, in (0, 1].

    Raises:
        ConfigError: an unknown preset (``UnknownPresetError``), an efficiency outside (0, 1].
    """

    model: str = "OPT-13B"
    gpu: str = "A100-40GB"
    efficiency: float = 0.5

    def __post_init__(self) -> None:
        eff = real("efficiency", self.efficiency, 0.0, 1.0, low_open=True)
        spec, g = memory.model_preset(self.model), memory.gpu_preset(self.gpu)
        if not (g.bandwidth > 0 and g.peak_flops > 0):
            raise ConfigError(f"GPU {self.gpu!r} has no bandwidth or peak FLOP/s to time a step by")
        kv = memory.kv_bytes_per_token(spec, "fp16")
        object.__setattr__(self, "efficiency", eff)
        object.__setattr__(self, "_step", IterationTime.roofline(memory.weights_bytes(spec, "fp16"), kv,
                                                                 g.bandwidth, g.peak_flops, eff))
        object.__setattr__(self, "_swap", SwapTime(kv, spec.num_layers))

    @property
    def coefficients(self) -> tuple[float, float, float]:
        """``(base_s, per_kv_token_s, per_prefill_token_s)``: the step time is
        ``base_s + per_kv_token_s * kv_tokens + per_prefill_token_s * prefill_tokens``."""
        step = self._step
        return step.base_s, step.per_kv_token_s, step.per_prefill_token_s

    def iteration_time(self, kv_tokens: int, prefill_tokens: int) -> float:
        """Seconds of a step that holds ``kv_tokens`` tokens in the KV cache and prefills
        ``prefill_tokens`` (:class:`TimingRunner`'s ``iteration_time``)."""
        return self._step(kv_tokens, prefill_tokens)

    def swap_time(self, num_blocks: int, block_size: int) -> float:
        """Seconds to move ``num_blocks`` blocks of ``block_size`` tokens one way between GPU and
        CPU memory (:class:`TimingRunner`'s ``swap_time``)."""
        return self._swap(num_blocks, block_size)

    def describe(self) -> str:
        """The timing model in words, for a panel's status line."""
        return f"{self.model} on an {self.gpu} (roofline at {self.efficiency:.0%} of peak)"


@dataclass(frozen=True)
class EngineState:
    """A panel's state: the ``engine`` (only the panel model changes it, on its own copy) and
    ``message``, what the last action did in words (``""``: nothing to say)."""

    engine: LLMEngine
    message: str = ""


class EnginePanel(PanelModel):
    """The part of :class:`~paged_kv.panels.serving.ServingPanel` and
    :class:`~paged_kv.panels.prefix_cache.PrefixCachePanel` that does not depend on the panel.

    A subclass sets ``name``, ``title``, ``demo_actions`` and :attr:`OPS` (op -> method name), and
    implements those methods as ``method(engine, action) -> message``, changing ``engine`` in place.

    Args:
        config: the engine's :class:`~paged_kv.engine.EngineConfig`.
        model: the tiny model (Jupyter side; Python only) or ``None``: the browser configuration,
            a :class:`TimingRunner` over ``timing`` with recorded tokens.
        tokenizer: with a model, its tokenizer (may be ``None``: token-id prompts only); without
            one, ``None`` means the tiny model's :class:`~paged_kv.model.tokenizer.ByteTokenizer`.
        timing: the browser configuration's :class:`RooflineTiming`.
        recordings: ``{prompt: continuation}`` for :class:`RecordedTokens` (default:
            :func:`~paged_kv.panels.continuations.load_recordings`).
    """

    title = ""
    OPS: dict[str, str] = {}

    #: the most steps one "run until idle" runs (:data:`MAX_RUN_STEPS`; a test lowers it)
    max_run_steps: int = MAX_RUN_STEPS

    def __init__(self, config: EngineConfig, model=None, tokenizer=None, timing: RooflineTiming | None = None,
                 recordings: Mapping[str, str] | None = None) -> None:
        if not isinstance(config, EngineConfig):
            raise ConfigError(f"config must be an EngineConfig, got {config!r:.80}")
        if timing is not None and not isinstance(timing, RooflineTiming):
            raise ConfigError(f"timing must be a RooflineTiming, got {timing!r:.80}")
        if config.gpu_memory_bytes is None and config.swap_space_bytes is None:
            config.scheduler_config()                 # a bad knob is refused now, not at the first action
        self.config, self.model = config, model
        self.timing = timing or RooflineTiming()
        if model is None:
            self.tokenizer = ByteTokenizer() if tokenizer is None else tokenizer
            self.token_source = RecordedTokens(load_recordings() if recordings is None else dict(recordings),
                                               self.tokenizer)
        else:
            self.tokenizer, self.token_source = tokenizer, None

    # --- the engine -----------------------------------------------------------------------------
    @property
    def timed(self) -> bool:
        """Whether the engine runs the timing model (the browser configuration) rather than a model."""
        return self.model is None

    def new_engine(self) -> LLMEngine:
        """A fresh recording engine in this panel's configuration.

        Raises:
            ConfigError: a bad config (as :class:`LLMEngine`)."""
        if self.model is not None:
            return LLMEngine(self.model, self.config, tokenizer=self.tokenizer, record=True)
        sc = self.config.scheduler_config()
        runner = TimingRunner(self.timing.iteration_time, self.timing.swap_time, sc.block_size,
                              next_token=self.token_source)
        return LLMEngine(None, self.config, tokenizer=self.tokenizer, runner=runner, record=True)

    def copy_engine(self, engine: LLMEngine) -> LLMEngine:
        """A deep copy of ``engine`` that shares what no action changes: the model's weights, the
        tokenizer, the token source, the timing model and the (frozen) step records."""
        keep = [self.model, self.tokenizer, self.token_source, self.timing, *engine.records]
        return copy.deepcopy(engine, {id(x): x for x in keep if x is not None})

    # --- the PanelModel interface ---------------------------------------------------------------
    def initial(self) -> EngineState:
        return EngineState(self.new_engine())

    def apply(self, state: EngineState, action: Mapping[str, Any]) -> EngineState:
        """The state after ``action`` (see the subclass's ``controls``), on a copy of the engine.

        Raises:
            ConfigError: not an :class:`EngineState`, an unknown ``"op"``, a bad field.
            PagedKVError: the engine refused the action (the message says why).
        """
        if not isinstance(state, EngineState):
            raise ConfigError(f"state must be an EngineState (from initial()), got {type(state).__name__}")
        engine = self.copy_engine(state.engine)
        return EngineState(engine, self.act(engine, action))

    def act(self, engine: LLMEngine, action: Mapping[str, Any]) -> str:
        """Do ``action`` to ``engine`` **in place** (the ipywidgets front's live engine; the pure
        :meth:`apply` calls it on a copy); returns what it did in words.

        Raises:
            ConfigError: an unknown ``"op"`` or a bad field (named).
            PagedKVError: refused by the engine; the engine is left as it was.
        """
        op = action.get("op") if isinstance(action, Mapping) else None
        if op not in self.OPS:
            raise ConfigError(f"unknown op {op!r} for the {self.name} panel; known: {sorted(self.OPS)}")
        return getattr(self, self.OPS[op])(engine, action) or ""

    # --- what the ops share ---------------------------------------------------------------------
    @staticmethod
    def step_once(engine: LLMEngine, action=None) -> str:
        """One engine step.

        Raises:
            PagedKVError: no request is unfinished (an idle engine would do nothing, and a silent
                click reads as a broken button)."""
        if not engine.has_unfinished_requests():
            raise PagedKVError("nothing to step: submit a request")
        engine.step()
        return ""

    def run_until_idle(self, engine: LLMEngine, action=None) -> str:
        """Step until no request is unfinished, at most :attr:`max_run_steps` steps (so a click
        always returns), checking the scheduler's invariants after every step; returns how many
        steps ran and, when it stopped at the limit, that it did and how many requests are left.

        Raises:
            PagedKVError: no request is unfinished (nothing to run)."""
        if not engine.has_unfinished_requests():
            raise PagedKVError("nothing to run: submit a request")
        limit = self.max_run_steps
        for k in range(limit):
            if not engine.has_unfinished_requests():
                return f"ran {k} step{'s' * (k != 1)}: every request has finished"
            engine.step()
            engine.scheduler.check()
        sch = engine.scheduler
        left = len(sch.waiting) + len(sch.running) + len(sch.swapped)
        if not left:
            return f"ran {limit} step{'s' * (limit != 1)}: every request has finished"
        return (f"stopped after {limit} steps, the most one click runs: {left} request{'s' * (left != 1)} "
                f"unfinished; run until idle again to go on")

    def texts(self, output) -> list[str]:
        """Per sample of ``output`` (a :class:`~paged_kv.engine.RequestOutput`), its text so far;
        decoded here when the engine gave the output no tokenizer."""
        if output.text is not None:
            return list(output.text)
        if self.tokenizer is None:
            return [repr(ids) for ids in output.token_ids]
        return [self.tokenizer.decode(ids, final=output.finished) for ids in output.token_ids]

    def source_note(self, output) -> str:
        """``""``, or a label when some of the browser configuration's tokens for this request are
        a stand-in, not the recorded continuation (a prompt not recorded, or past the recording's
        end): each sample's last token was recorded iff all of them were."""
        if self.token_source is None:
            return ""
        prompt = tuple(output.request.prompt)
        recorded = all(self.token_source.is_recorded(prompt + tuple(ids[:-1])) for ids in output.token_ids or [[]])
        return "" if recorded else " (stand-in tokens: no recorded continuation)"

    def timing_line(self, engine: LLMEngine) -> str:
        """Where the panel's time and tokens come from, and the clock, in words."""
        steps, clock = engine.stats.steps, engine.clock
        if self.model is not None:
            return f"tiny model: step {steps}, wall clock {clock * 1e3:.1f} ms"
        return (f"timing model, no model runs: {self.timing.describe()}, step {steps}, clock {clock * 1e3:.1f} ms; "
                f"tokens: the tiny model's greedy continuations recorded at build time")

    def output_lines(self, engine: LLMEngine, label=None) -> list[str]:
        """One plain-text line per sample: the sample's name (the request id, ``"B.1"`` for sample 1
        of ``B``, :func:`~paged_kv.engine.step_record.sample_name`, as the pool names it), and
        ``label(output)``, text, finish reason."""
        lines = []
        for o in engine.outputs():
            tail = ("" if label is None else f" ({label(o)})") + self.source_note(o)
            for i, (t, reason) in enumerate(zip(self.texts(o), o.finish_reason)):
                end = "" if reason is None else f" [{reason}]"
                lines.append(f"{sample_name(o.request_id, i)}{tail}: {t!r}{end}")
            if o.error:
                lines.append(f"{o.request_id}{tail}: {o.error}")
        return lines


def engine_config(config: EngineConfig | None, knobs: Mapping[str, Any], defaults: Mapping[str, Any],
                  **fixed) -> EngineConfig:
    """``config`` as is, or an :class:`EngineConfig` of ``knobs`` (``None``: the panel's default
    from ``defaults``) and ``fixed``.

    Raises:
        ConfigError: knobs given together with ``config``; a bad knob (as EngineConfig)."""
    given = sorted(k for k, v in knobs.items() if v is not None)
    if config is not None:
        if given:
            raise ConfigError(f"give a config or the knobs {given}, not both")
        return config
    return EngineConfig(**{k: defaults[k] if v is None else v for k, v in knobs.items()}, **fixed)


def text_field(action: Mapping[str, Any], key: str, default: str = "") -> str:
    """``action[key]`` as text (``default`` when absent).

    Raises:
        ConfigError: not a str."""
    value = action.get(key, default)
    if not isinstance(value, str):
        raise ConfigError(f"{key!r} must be text, got {value!r:.60}")
    return value


#: the words the page's controls use for an action's fields, with vLLM's name after them in errors
FIELD_WORDS = {"max_tokens": "new tokens", "n": "samples", "k": "drafts", "ngram": "n-gram length"}


def field_name(key: str) -> str:
    """An action field as the page names it, vLLM's name in parentheses: ``"new tokens (max_tokens)"``."""
    return f"{FIELD_WORDS[key]} ({key})" if key in FIELD_WORDS else key


def int_field(action: Mapping[str, Any], key: str, default: int, low: int, high: int) -> int:
    """``action[key]`` as an int in ``[low, high]`` (``default`` when absent).

    Raises:
        ConfigError: ``None`` (an empty box, :func:`~paged_kv.panels.base.filled`), not an int,
            or outside the range (named in the page's words, :func:`field_name`)."""
    name = field_name(key)
    value = count(name, filled(name, action.get(key, default)), low)
    if value > high:
        raise ConfigError(f"{name} must be at most {high}, got {value}")
    return value

