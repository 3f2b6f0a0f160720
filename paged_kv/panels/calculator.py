"""Chapter 3's KV-cache calculator as a panel model: the calculator's inputs in, one GPU's memory out.

The state is the calculator's inputs (a model preset or ``"custom"`` with its typed sizes, the GPU,
the context, the batch, the KV dtype, TP, PP, the block size); an action sets any of them; the
figure is :func:`paged_kv.viz.calculator.gpu_memory_figure` of the
:func:`paged_kv.memory.plan_memory` plan; the status is the numbers the panel prints
(:func:`report_rows`, the same rows the ipywidgets calculator shows as a table).  Every decision of
the calculator lives here: which choices each input offers, what "custom" starts from
(:func:`custom_fields`), how the typed sizes become a :class:`~paged_kv.memory.ModelSpec`
(:func:`custom_spec`), what the numbers say.  :class:`paged_kv.widgets.memory.MemoryCalculator`
(Jupyter, Colab) and the browser page both drive :class:`CalculatorPanel`.

Impossible inputs (a tensor-parallel degree that does not split the heads, a context of 0, or one
beyond the model's maximum context, :func:`check_context`) are refused by
:meth:`CalculatorPanel.apply` with the package's own error, so the state a front keeps is always
one that plans, for a context the model can hold.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from .. import memory
from ..defaults import BLOCK_SIZE
from ..errors import ConfigError
from ..memory import GPU_PRESETS, KV_DTYPES, MODEL_PRESETS, ModelSpec
from ..units import format_bytes
from ..viz.calculator import gpu_memory_figure, gpu_memory_parts
from .base import PanelModel, filled

__all__ = ["BLOCK_SIZES", "CUSTOM", "CUSTOM_FIELDS", "CalculatorPanel", "CalculatorState", "INPUTS", "LABELS",
           "PP_DEGREES", "TP_DEGREES", "block_sizes", "check_context", "custom_fields", "custom_spec", "report_rows"]

CUSTOM = "custom"
#: the choices the block-size, TP and PP inputs offer (TP up to two 8-GPU nodes and one beyond)
BLOCK_SIZES = (1, 8, 16, 32, 64, 128)
TP_DEGREES = (1, 2, 4, 8, 16, 32)
PP_DEGREES = (1, 2, 4, 8)
#: the typed sizes of a "custom" model, in the order the panels show them
CUSTOM_FIELDS = ("num_layers", "num_heads", "num_kv_heads", "head_dim", "params_b", "weights_dtype",
                 "sliding_window", "sliding_layers", "kv_lora_rank", "qk_rope_head_dim", "max_position")
#: the inputs an action may set (besides the custom fields) and the type each takes
INPUTS = {"model": str, "gpu": str, "seq_len": int, "batch_size": int, "kv_dtype": str, "tp": int, "pp": int,
          "block_size": int, "base": str}
_FIELD_TYPES = {k: (str if k == "weights_dtype" else float if k == "params_b" else int) for k in CUSTOM_FIELDS}
#: the page's words for the inputs (its controls' labels; errors name an input by them and its key)
LABELS = {"model": "model", "gpu": "GPU", "tp": "TP", "pp": "PP", "seq_len": "context", "batch_size": "batch",
          "kv_dtype": "KV dtype", "block_size": "block"}
#: what the "max context" field shows for a model that declares none (the widget's largest value)
NO_MAX_POSITION = 2**24


def block_sizes(block_size: int = BLOCK_SIZE) -> list[int]:
    """The block sizes offered: :data:`BLOCK_SIZES` and ``block_size`` (a starting value not among them)."""
    return sorted({*BLOCK_SIZES, block_size})


def check_context(spec: ModelSpec, seq_len: int) -> None:
    """Refuse a context beyond the model's declared maximum (``spec.max_position``; none
    declared: any).  :func:`~paged_kv.memory.plan_memory` sizes such a context all the same and
    only flags it (the book's tables grey those rows out); the calculator refuses it, since a
    server would not start with it (vLLM refuses a ``max_model_len`` above the model's
    ``max_position_embeddings`` unless ``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` is set), and its numbers
    would read as ones the model can serve.

    Raises:
        ConfigError: ``seq_len`` above ``spec.max_position``; the message names both.
    """
    if not spec.within_max_context(seq_len):
        raise ConfigError(f"the calculator's {LABELS['seq_len']} (seq_len) of {seq_len:,} tokens is beyond "
                          f"{spec.name}'s maximum context of {spec.max_position:,} tokens")


def custom_fields(base: str | ModelSpec) -> dict[str, Any]:
    """The custom fields that "custom" starts from: the *whole* preset ``base`` (its sliding
    window, MLA latent, weights dtype and maximum context too), so switching to "custom" does not
    move the result.  ``params_b`` is the parameter count in billions, rounded to 3 decimals
    (:func:`custom_spec` keeps the exact count while the field is unchanged); a window, a latent
    or a maximum context the model lacks shows as 0 (``max_position``: :data:`NO_MAX_POSITION`).

    Raises:
        UnknownPresetError: ``base`` is not a preset name.
    """
    spec = base if isinstance(base, ModelSpec) else memory.model_preset(base)
    out = {k: getattr(spec, k) for k in ("num_layers", "num_heads", "num_kv_heads", "head_dim", "weights_dtype",
                                          "sliding_layers", "kv_lora_rank", "qk_rope_head_dim")}
    out["params_b"] = round(spec.num_params / 1e9, 3)
    out["sliding_window"] = spec.sliding_window or 0
    out["max_position"] = spec.max_position or NO_MAX_POSITION
    return {k: out[k] for k in CUSTOM_FIELDS}


def custom_spec(base: ModelSpec, fields: Mapping[str, Any]) -> ModelSpec:
    """The model ``fields`` (the custom fields, as :func:`custom_fields` gives them) describe,
    starting from the preset ``base``: its name becomes ``"custom"``, the exact parameter count is
    kept while the rounded ``params_b`` is unchanged, and either window field at 0 means no
    sliding window.

    Raises:
        ConfigError: impossible sizes (from :class:`~paged_kv.memory.ModelSpec`'s own checks).
    """
    c = fields
    params = (base.num_params if c["params_b"] == round(base.num_params / 1e9, 3)
              else max(1, round(c["params_b"] * 1e9)))
    window, layers = c["sliding_window"], c["sliding_layers"]
    if not (window and layers):           # either field at 0 means no sliding window (both say so)
        window, layers = None, 0
    changes = dict(num_layers=c["num_layers"], num_heads=c["num_heads"], num_kv_heads=c["num_kv_heads"],
                   head_dim=c["head_dim"], num_params=params, weights_dtype=c["weights_dtype"],
                   sliding_window=window, sliding_layers=layers,
                   kv_lora_rank=c["kv_lora_rank"], qk_rope_head_dim=c["qk_rope_head_dim"],
                   max_position=c["max_position"], name=CUSTOM, source=f"typed in, from {base.name}",
                   gathered_params=min(base.gathered_params, params - 1))
    if (c["num_heads"], c["head_dim"]) != (base.num_heads, base.head_dim):
        changes["hidden_size"] = c["num_heads"] * c["head_dim"]
    return base.replace(**changes)


def report_rows(p, spec: ModelSpec | None = None) -> tuple[list[tuple[str, str]], str]:
    """The numbers the calculator prints for the plan ``p`` (a :class:`~paged_kv.memory.MemoryPlan`):
    ``(rows, footer)``, each row a ``(label, value)`` pair (bytes in binary and decimal units side
    by side, per GPU; MiB and MB for small sizes); with ``spec`` and a sliding window, the most
    blocks one of its sliding layers holds."""
    both = lambda n: format_bytes(n, "auto")  # MiB (MB) for small sizes
    verdict = ("fits" if p.fits else ("the weights do not fit" if not p.weights_fit
                                      else f"does not fit: at most {p.max_batch_size:,} sequences"))
    if not p.within_max_context:
        verdict += (f" (but {p.seq_len:,} tokens is beyond the model's maximum context of "
                    f"{p.max_position:,})")
    top = "not declared" if p.max_position is None else f"{p.max_position:,} tokens"
    blocks = ("" if not p.block_size else " (per token)" if p.block_size == 1
              else f" (whole blocks of {p.block_size} tokens)")
    rows = [("KV bytes per token", f"{p.kv_bytes_per_token:,} B"),
            (f"KV per sequence{blocks}", both(p.kv_bytes_per_sequence))]
    if spec is not None and spec.sliding_window and p.block_size:
        rows.append((f"a sliding layer ({spec.sliding_window:,}-token window) holds at most",
                     f"{memory.window_max_blocks(spec.sliding_window, p.block_size):,} blocks"))
    rows += [(f"KV for {p.batch_size:,} x {p.seq_len:,} tokens", both(p.kv_bytes)),
             ("share of the GPU", f"{p.kv_fraction:.1%}"),
             ("weights", both(p.weights_bytes)),
             (f"KV budget (after weights and {p.reserve_bytes / p.gpu_bytes:.0%} reserve)", both(p.kv_budget_bytes)),
             ("max batch at this context", f"{p.max_batch_size:,} sequences ({p.max_tokens:,} tokens)"),
             ("model's maximum context", top),
             ("verdict", verdict)]
    return rows, f"all figures per GPU of the TP={p.tp} x PP={p.pp} group ({p.tp * p.pp} GPUs)"


@dataclass(frozen=True)
class CalculatorState:
    """The calculator's inputs.  ``model`` is a preset's name or ``"custom"``; ``base`` the
    preset the custom fields started from; ``custom`` the custom fields as ``(name, value)``
    pairs in :data:`CUSTOM_FIELDS` order (read only while ``model`` is ``"custom"``)."""

    model: str
    gpu: str
    seq_len: int
    batch_size: int
    kv_dtype: str
    tp: int
    pp: int
    block_size: int
    base: str
    custom: tuple[tuple[str, Any], ...]

    @property
    def fields(self) -> dict[str, Any]:
        """The custom fields as a dict."""
        return dict(self.custom)


class CalculatorPanel(PanelModel):
    """Chapter 3's calculator: ``{"op": "set", <input>: value, ...}`` sets any of :data:`INPUTS`
    and (with ``model`` ``"custom"``) of :data:`CUSTOM_FIELDS`.

    Switching ``model`` to ``"custom"`` from a preset starts the custom fields from that preset
    (or from the preset ``base`` names), unless the action gives them.  The constructor's
    arguments are the starting inputs (JSON-able, what a page passes as ``live_args``).

    Raises (constructor):
        UnknownPresetError: an unknown model or GPU name.
        ConfigError: a ``seq_len`` beyond the model's maximum context (:func:`check_context`).
    """

    name = "calculator"
    demo_actions = [{"op": "set", "batch_size": 32},
                    {"op": "set", "model": "Qwen2.5-72B", "tp": 4},   # 131,072 tokens of context
                    {"op": "set", "kv_dtype": "fp8", "seq_len": 131072},
                    {"op": "set", "tp": 3},                     # refused: tp is offered as 1, 2, 4, ... only
                    {"op": "set", "gpu": "H200", "pp": 2},
                    {"op": "set", "block_size": 128, "batch_size": 8}]

    def __init__(self, model: str = "Llama-3-8B", gpu: str = "H100-80GB", seq_len: int = 8192,
                 batch_size: int = 16, kv_dtype: str = "fp16", tp: int = 1, pp: int = 1,
                 block_size: int = BLOCK_SIZE) -> None:
        base = memory.model_preset(model).name
        check_context(memory.model_preset(base), seq_len)
        self._block_sizes = block_sizes(block_size)
        self._initial = CalculatorState(model=base, gpu=memory.gpu_preset(gpu).name, seq_len=seq_len,
                                        batch_size=batch_size, kv_dtype=kv_dtype, tp=tp, pp=pp,
                                        block_size=block_size, base=base,
                                        custom=tuple(custom_fields(base).items()))

    def initial(self) -> CalculatorState:
        return self._initial

    def apply(self, state: CalculatorState, action: Mapping[str, Any]) -> CalculatorState:
        """The inputs after ``action``, checked by planning them.

        Raises:
            ConfigError: an unknown ``"op"`` or input name, an empty value (``None``: the page's
                empty box, named in its words, :data:`LABELS`), a value of the wrong type, a choice
                not offered (a TP, PP or block size outside the panel's lists, a KV dtype), or
                inputs that cannot be planned (the message of :func:`~paged_kv.memory.plan_memory`),
                a context beyond the model's maximum (:func:`check_context`).
            UnknownPresetError: an unknown model or GPU name.
        """
        if action.get("op") != "set":
            raise ConfigError(f"the calculator's only action is 'set', got op {action.get('op')!r}")
        changes, fields = {}, {}
        for key, value in action.items():
            if key == "op":
                continue
            kind = INPUTS.get(key) or _FIELD_TYPES.get(key)
            if kind is None:
                raise ConfigError(f"the calculator has no input {key!r} (inputs: {sorted(INPUTS)} "
                                  f"and the custom fields {list(CUSTOM_FIELDS)})")
            filled(f"the calculator's {LABELS[key]} ({key})" if key in LABELS else f"the calculator's {key}", value)
            ok = (isinstance(value, str) if kind is str else
                  isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float else
                  isinstance(value, int) and not isinstance(value, bool))
            if not ok:
                what = {str: "a string", float: "a number", int: "an integer"}[kind]
                raise ConfigError(f"the calculator's {key} must be {what}, got {value!r}")
            (fields if key in _FIELD_TYPES else changes)[key] = value
        for key, options in (("tp", TP_DEGREES), ("pp", PP_DEGREES), ("block_size", self._block_sizes),
                             ("kv_dtype", tuple(KV_DTYPES))):
            if key in changes and changes[key] not in options:
                raise ConfigError(f"the calculator offers {key} in {list(options)}, got {changes[key]!r}")
        if "model" in changes and changes["model"] != CUSTOM:
            changes["model"] = memory.model_preset(changes["model"]).name
        if "gpu" in changes:
            changes["gpu"] = memory.gpu_preset(changes["gpu"]).name
        new = replace(state, **changes)
        if "base" in changes:
            new = replace(new, base=memory.model_preset(changes["base"]).name)
        if new.model == CUSTOM and state.model != CUSTOM:      # custom starts from the preset shown
            start = changes.get("base", state.model)
            new = replace(new, base=memory.model_preset(start).name, custom=tuple(custom_fields(start).items()))
        if fields:
            merged = {**new.fields, **fields}
            new = replace(new, custom=tuple((k, merged[k]) for k in CUSTOM_FIELDS))
        check_context(self.spec(new), new.seq_len)
        self.plan(new)                                          # refuse inputs that cannot be planned
        return new

    def spec(self, state: CalculatorState) -> ModelSpec:
        """The chosen preset, or the custom model of ``state`` (:func:`custom_spec`)."""
        if state.model != CUSTOM:
            return memory.model_preset(state.model)
        return custom_spec(memory.model_preset(state.base), state.fields)

    def plan(self, state: CalculatorState):
        """The :class:`~paged_kv.memory.MemoryPlan` of ``state``'s inputs.

        Raises:
            ConfigError: inputs that cannot be planned.
        """
        return memory.plan_memory(self.spec(state), state.gpu, state.seq_len, state.batch_size, state.kv_dtype,
                                  tp=state.tp, pp=state.pp, block_size=state.block_size)

    def figure(self, state: CalculatorState):
        return gpu_memory_figure(gpu_memory_parts(self.plan(state)))

    def status(self, state: CalculatorState) -> str:
        rows, footer = report_rows(self.plan(state), self.spec(state))
        return "\n".join(f"{k}: {v}" for k, v in rows) + f"\n{footer}"

    def input_values(self, state: CalculatorState) -> dict[str, Any]:
        """The inputs the page shows (:data:`LABELS`' keys) as ``state`` holds them."""
        return {key: getattr(state, key) for key in LABELS}

    def controls(self) -> list[dict]:
        s = self._initial

        def select(key, options):
            return {"kind": "select", "name": key, "label": LABELS[key], "value": getattr(s, key),
                    "options": list(options)}

        def number(key, low, high):
            return {"kind": "int", "name": key, "label": LABELS[key], "value": getattr(s, key), "min": low, "max": high}

        return [select("model", MODEL_PRESETS), select("gpu", GPU_PRESETS), select("tp", TP_DEGREES),
                select("pp", PP_DEGREES), number("seq_len", 1, 2**24), number("batch_size", 0, 10**6),
                select("kv_dtype", KV_DTYPES), select("block_size", self._block_sizes),
                # "auto": the page sends this button's action, with that input alone, whenever an input
                # changes (another input's refused value is not sent again with every change)
                {"kind": "button", "label": "recompute", "op": "set", "auto": True}]
