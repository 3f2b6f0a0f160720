"""The live KV-cache calculator (chapter 3): ipywidgets over :mod:`paged_kv.memory`.

Pick a model preset (or "custom" and type its sizes), a context length, a batch size, the KV
dtype, the block size (vLLM's 16 by default; 1 counts per token), the GPU, the tensor-parallel
degree (up to 16 GPUs of a node pair) and the pipeline-parallel degree; the panel prints bytes
per token, the KV cache of the batch in whole blocks (a sliding-window layer's at its peak,
:mod:`paged_kv.memory.window`), its share of the GPU, and the largest batch that fits, and draws the GPU's memory
(:func:`paged_kv.viz.calculator.gpu_memory_figure`) in a ``go.FigureWidget`` updated in place, or
redrawn into an ``ipywidgets.Output`` where FigureWidget is unavailable (it needs ``anywidget``).
The static book shows :func:`paged_kv.viz.calculator.calculator_figure` instead.

The widgets only forward their values: every decision (what "custom" starts from, the plan, the
numbers printed, the choices offered) is :class:`paged_kv.panels.calculator.CalculatorPanel`'s,
the panel model the browser edition's page drives too.
"""

from __future__ import annotations

import html

import ipywidgets as w
import plotly.graph_objects as go
from IPython.display import display

from .. import memory
from ..defaults import BLOCK_SIZE
from ..errors import PagedKVError
from ..memory import GPU_PRESETS, KV_DTYPES, MODEL_PRESETS, WEIGHT_DTYPE_BITS, ModelSpec
from ..panels.calculator import (CUSTOM, NO_MAX_POSITION, PP_DEGREES, TP_DEGREES, CalculatorPanel, block_sizes,
                                 custom_fields, custom_spec, report_rows)
from ..viz.calculator import gpu_memory_figure, gpu_memory_parts
from .panel import error_note, guarded


class MemoryCalculator:
    """The calculator's widgets and its latest :class:`~paged_kv.memory.MemoryPlan` (``.plan``).

    ``.panel`` is the ``ipywidgets.VBox`` to display; ``.plan`` is ``None`` and ``.error`` holds
    the message when the inputs are impossible, or when recomputing failed otherwise (an internal
    error; shown in the panel, never raised).
    """

    def __init__(self, model: str = "Llama-3-8B", gpu: str = "H100-80GB", seq_len: int = 8192,
                 batch_size: int = 16, kv_dtype: str = "fp16", tp: int = 1, pp: int = 1,
                 block_size: int = BLOCK_SIZE, use_figure_widget: bool | None = None) -> None:
        self._draw, self._parts = gpu_memory_figure, gpu_memory_parts
        narrow = w.Layout(width="230px")
        self.model = w.Dropdown(options=list(MODEL_PRESETS) + [CUSTOM], value=memory.model_preset(model).name,
                                description="model")
        base = memory.model_preset(model)
        self._base = base
        self.custom = {
            "num_layers": w.BoundedIntText(1, min=1, max=1000, description="layers", layout=narrow),
            "num_heads": w.BoundedIntText(1, min=1, max=4096, description="heads", layout=narrow),
            "num_kv_heads": w.BoundedIntText(1, min=1, max=4096, description="KV heads", layout=narrow),
            "head_dim": w.BoundedIntText(2, min=1, max=4096, description="head_dim", layout=narrow),
            "params_b": w.BoundedFloatText(1.0, min=0.001, max=1e5, description="params (B)", layout=narrow),
            "weights_dtype": w.Dropdown(options=list(WEIGHT_DTYPE_BITS), value="bf16", description="weights",
                                        layout=narrow),
            "sliding_window": w.BoundedIntText(0, min=0, max=2**24, description="window (0: none)",
                                               layout=narrow, style={"description_width": "initial"}),
            "sliding_layers": w.BoundedIntText(0, min=0, max=1000, description="window layers (0: none)",
                                               layout=narrow, style={"description_width": "initial"}),
            "kv_lora_rank": w.BoundedIntText(0, min=0, max=65536, description="MLA latent (0: none)",
                                             layout=narrow, style={"description_width": "initial"}),
            "qk_rope_head_dim": w.BoundedIntText(0, min=0, max=4096, description="MLA RoPE key",
                                                 layout=narrow, style={"description_width": "initial"}),
            "max_position": w.BoundedIntText(1, min=1, max=NO_MAX_POSITION, description="max context", layout=narrow),
        }
        self._fill_custom(base)
        self.seq_len = w.BoundedIntText(seq_len, min=1, max=2**24, description="context", layout=narrow)
        self.batch_size = w.BoundedIntText(batch_size, min=0, max=10**6, description="batch", layout=narrow)
        self.kv_dtype = w.Dropdown(options=list(KV_DTYPES), value=kv_dtype, description="KV dtype", layout=narrow)
        self.block_size = w.Dropdown(options=block_sizes(block_size), value=block_size,
                                     description="block", layout=narrow)
        self.gpu = w.Dropdown(options=list(GPU_PRESETS), value=memory.gpu_preset(gpu).name, description="GPU",
                              layout=narrow)
        self.tp = w.Dropdown(options=list(TP_DEGREES), value=tp, description="TP", layout=narrow)
        self.pp = w.Dropdown(options=list(PP_DEGREES), value=pp, description="PP", layout=narrow)
        self.text = w.HTML()
        # every decision (what custom starts from, the plan, the numbers) is the panel model's
        self.model_panel = CalculatorPanel(model, gpu, seq_len, batch_size, kv_dtype, tp, pp, block_size)
        self.state = self.model_panel.initial()
        self.plan, self.error = None, ""
        self.out = None
        self.figure = None
        if use_figure_widget is not False:
            try:
                self.figure = go.FigureWidget(self._draw(self._parts(memory.plan_memory(base, gpu, 1))))
            except Exception:  # plotly's FigureWidget needs anywidget: redraw into an Output instead
                if use_figure_widget:
                    raise
        if self.figure is None:
            self.out = w.Output()
        custom_box = w.HBox(list(self.custom.values()), layout=w.Layout(flex_flow="row wrap"))
        self._custom_box = custom_box
        controls = [self.seq_len, self.batch_size, self.kv_dtype, self.block_size, self.gpu, self.tp, self.pp,
                    *self.custom.values()]
        self._quiet = False
        self.model.observe(guarded(self._on_model, self._show_error), names="value")
        for c in controls:     # update() never raises: an error shows in the text, the figure hidden
            c.observe(lambda _change: None if self._quiet else self.update(), names="value")
        wrap = w.Layout(flex_flow="row wrap")
        self._figure_box = w.Box([self.figure if self.figure is not None else self.out])
        self.panel = w.VBox([w.HBox([self.model, self.gpu, self.tp, self.pp], layout=wrap),
                             w.HBox([self.seq_len, self.batch_size, self.kv_dtype, self.block_size], layout=wrap),
                             custom_box,
                             self.text, self._figure_box])
        self.update()

    def _fill_custom(self, base: ModelSpec) -> None:
        """Set every custom field from ``base`` (:func:`paged_kv.panels.calculator.custom_fields`;
        the fields are not observed while this runs)."""
        self._base = base
        quiet, self._quiet = self._quiet if hasattr(self, "_quiet") else False, True
        try:
            for key, value in custom_fields(base).items():
                self.custom[key].value = value
        finally:
            self._quiet = quiet

    def _on_model(self, change) -> None:
        """The model dropdown's one handler: fill the custom fields (if "custom" was picked), then
        recompute; a failure to fill shows instead of a plan from half-filled fields."""
        self._prefill_custom(change)
        if not self._quiet:
            self.update()

    def _prefill_custom(self, change) -> None:
        """Switching to "custom" starts from the *whole* preset shown just before: its sliding
        window, MLA latent, weights dtype and maximum context too, so the result does not move."""
        if change["new"] != CUSTOM or change["old"] == CUSTOM:
            return
        self._fill_custom(memory.model_preset(change["old"]))

    def action(self) -> dict:
        """The panel model's action for the widgets' current values (the custom fields, and the
        preset they started from, only while "custom" is picked)."""
        act = {"op": "set", "model": self.model.value, "gpu": self.gpu.value, "seq_len": self.seq_len.value,
               "batch_size": self.batch_size.value, "kv_dtype": self.kv_dtype.value, "tp": self.tp.value,
               "pp": self.pp.value, "block_size": self.block_size.value}
        if self.model.value == CUSTOM:
            act["base"] = self._base.name
            act.update({k: v.value for k, v in self.custom.items()})
        return act

    def spec(self) -> ModelSpec:
        """The chosen preset, or the preset custom started from with the typed fields replaced
        (the exact parameter count is kept while the rounded field shows it unchanged;
        :func:`paged_kv.panels.calculator.custom_spec`)."""
        if self.model.value != CUSTOM:
            return memory.model_preset(self.model.value)
        return custom_spec(self._base, {k: v.value for k, v in self.custom.items()})

    def _show_error(self, note: str, label: str = "failed") -> None:
        """Show ``note`` instead of the plan, and hide the figure: never the previous inputs'
        figure under an error."""
        self.plan, self.error = None, note
        self.text.value = f"<span style='color:#B00'><b>{label}:</b> {html.escape(note, quote=False)}</span>"
        self._figure_box.layout.display = "none"

    def update(self) -> None:
        """Recompute the plan from the widgets and refresh the text and the figure.  Never raises:
        impossible inputs (our :class:`~paged_kv.errors.PagedKVError`) show as "impossible: ...",
        any other error as "failed: internal error: ..." (:func:`~paged_kv.widgets.panel.error_note`),
        and the next change recomputes as usual."""
        try:
            self._update()
        except Exception as e:
            self._show_error(error_note(e))

    def _update(self) -> None:
        self._custom_box.layout.display = "" if self.model.value == CUSTOM else "none"
        # apply, not panels.step: the figure is redrawn in place below, so only the new state is needed
        try:
            self.state = self.model_panel.apply(self.state, self.action())
        except PagedKVError as e:
            self._show_error(str(e), "impossible")
            return
        self.error = ""
        self.plan = self.model_panel.plan(self.state)
        self._figure_box.layout.display = ""
        self.text.value = self.report_html(self.plan, self.model_panel.spec(self.state))
        fig = self._draw(self._parts(self.plan))
        if self.figure is not None:
            with self.figure.batch_update():
                for trace, new in zip(self.figure.data, fig.data):
                    trace.x, trace.name = new.x, new.name
                self.figure.layout.title.text = fig.layout.title.text
                self.figure.layout.shapes, self.figure.layout.annotations = fig.layout.shapes, fig.layout.annotations
        else:
            self.out.clear_output(wait=True)
            with self.out:
                display(fig)

    @staticmethod
    def report_html(p, spec: ModelSpec | None = None) -> str:
        """The plan's numbers (:func:`paged_kv.panels.calculator.report_rows`) as a small HTML table."""
        rows, footer = report_rows(p, spec)
        body = "".join(f"<tr><td style='padding-right:1em'>{k}</td><td><b>{v}</b></td></tr>" for k, v in rows)
        return f"<table>{body}</table><small>{footer}</small>"


def calculator_panel(**kwargs):
    """A fresh :class:`MemoryCalculator`'s panel (``.calculator`` is attached to it)."""
    calc = MemoryCalculator(**kwargs)
    calc.panel.calculator = calc
    return calc.panel
