"""The live KV-cache calculator (chapter 3): ipywidgets over :mod:`paged_kv.memory`.

Pick a model preset (or "custom" and type its sizes), a context length, a batch size, the KV
dtype, the GPU and the tensor-parallel degree; the panel prints bytes per token, the KV cache of
the batch, its share of the GPU, and the largest batch that fits, and draws the GPU's memory
(:func:`paged_kv.viz.memory.gpu_memory_figure`) in a ``go.FigureWidget`` updated in place, or
redrawn into an ``ipywidgets.Output`` where FigureWidget is unavailable (it needs ``anywidget``).
The static book shows :func:`paged_kv.viz.memory.calculator_figure` instead.
"""

from __future__ import annotations

import ipywidgets as w
import plotly.graph_objects as go
from IPython.display import display

from .. import memory
from ..errors import PagedKVError
from ..memory import GPU_PRESETS, KV_DTYPES, MODEL_PRESETS, ModelSpec
from ..units import format_bytes
from ..viz.memory import gpu_memory_figure, gpu_memory_parts

CUSTOM = "custom"


class MemoryCalculator:
    """The calculator's widgets and its latest :class:`~paged_kv.memory.MemoryPlan` (``.plan``).

    ``.panel`` is the ``ipywidgets.VBox`` to display; ``.plan`` is ``None`` and ``.error`` holds
    the message when the inputs are impossible (shown in the panel, never raised).
    """

    def __init__(self, model: str = "Llama-3-8B", gpu: str = "H100-80GB", seq_len: int = 8192,
                 batch_size: int = 16, kv_dtype: str = "fp16", tp: int = 1,
                 use_figure_widget: bool | None = None) -> None:
        self._draw, self._parts = gpu_memory_figure, gpu_memory_parts
        narrow = w.Layout(width="230px")
        self.model = w.Dropdown(options=list(MODEL_PRESETS) + [CUSTOM], value=memory.model_preset(model).name,
                                description="model")
        base = memory.model_preset(model)
        self.custom = {
            "num_layers": w.BoundedIntText(base.num_layers, min=1, max=1000, description="layers", layout=narrow),
            "num_heads": w.BoundedIntText(base.num_heads, min=1, max=4096, description="heads", layout=narrow),
            "num_kv_heads": w.BoundedIntText(base.num_kv_heads, min=1, max=4096, description="KV heads", layout=narrow),
            "head_dim": w.BoundedIntText(base.head_dim, min=1, max=4096, description="head_dim", layout=narrow),
            "params_b": w.BoundedFloatText(round(base.num_params / 1e9, 3), min=0.001, max=1e5,
                                           description="params (B)", layout=narrow),
        }
        self.seq_len = w.BoundedIntText(seq_len, min=1, max=2**24, description="context", layout=narrow)
        self.batch_size = w.BoundedIntText(batch_size, min=0, max=10**6, description="batch", layout=narrow)
        self.kv_dtype = w.Dropdown(options=list(KV_DTYPES), value=kv_dtype, description="KV dtype", layout=narrow)
        self.gpu = w.Dropdown(options=list(GPU_PRESETS), value=memory.gpu_preset(gpu).name, description="GPU",
                              layout=narrow)
        self.tp = w.Dropdown(options=[1, 2, 4, 8, 16, 32], value=tp, description="TP", layout=narrow)
        self.text = w.HTML()
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
        custom_box = w.HBox(list(self.custom.values()))
        self._custom_box = custom_box
        controls = [self.model, self.seq_len, self.batch_size, self.kv_dtype, self.gpu, self.tp,
                    *self.custom.values()]
        self._quiet = False
        self.model.observe(self._prefill_custom, names="value")
        for c in controls:
            c.observe(lambda _change: None if self._quiet else self.update(), names="value")
        self.panel = w.VBox([w.HBox([self.model, self.gpu, self.tp]),
                             w.HBox([self.seq_len, self.batch_size, self.kv_dtype]), custom_box,
                             self.text, self.figure if self.figure is not None else self.out])
        self.update()

    def _prefill_custom(self, change) -> None:
        """Switching to "custom" starts from the preset shown just before."""
        if change["new"] != CUSTOM or change["old"] == CUSTOM:
            return
        base = memory.model_preset(change["old"])
        self._quiet = True  # one update for all the fields, run by the model's own observer
        try:
            for key in ("num_layers", "num_heads", "num_kv_heads", "head_dim"):
                self.custom[key].value = getattr(base, key)
            self.custom["params_b"].value = round(base.num_params / 1e9, 3)
        finally:
            self._quiet = False

    def spec(self) -> ModelSpec:
        """The chosen preset, or a spec built from the custom fields."""
        if self.model.value != CUSTOM:
            return memory.model_preset(self.model.value)
        c = {k: v.value for k, v in self.custom.items()}
        return ModelSpec(CUSTOM, num_layers=c["num_layers"], hidden_size=c["num_heads"] * c["head_dim"],
                         num_heads=c["num_heads"], num_kv_heads=c["num_kv_heads"], head_dim=c["head_dim"],
                         num_params=max(1, round(c["params_b"] * 1e9)), weights_dtype="bf16",
                         source="typed in")

    def update(self) -> None:
        """Recompute the plan from the widgets and refresh the text and the figure."""
        self._custom_box.layout.display = "" if self.model.value == CUSTOM else "none"
        try:
            self.plan = memory.plan_memory(self.spec(), self.gpu.value, self.seq_len.value,
                                           self.batch_size.value, self.kv_dtype.value, tp=self.tp.value)
            self.error = ""
        except PagedKVError as e:
            self.plan, self.error = None, str(e)
            self.text.value = f"<span style='color:#B00'><b>impossible:</b> {e}</span>"
            return
        self.text.value = self.report_html(self.plan)
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
    def report_html(p) -> str:
        """The plan's numbers as a small HTML table (binary and decimal units side by side, per
        GPU; MiB and MB for small sizes)."""
        both = lambda n: format_bytes(n, "auto")  # MiB (MB) for small sizes
        verdict = ("fits" if p.fits else ("the weights do not fit" if not p.weights_fit
                                          else f"does not fit: at most {p.max_batch_size:,} sequences"))
        if not p.within_max_context:
            verdict += (f" (but {p.seq_len:,} tokens is beyond the model's maximum context of "
                        f"{p.max_position:,})")
        top = "not declared" if p.max_position is None else f"{p.max_position:,} tokens"
        rows = [("KV bytes per token", f"{p.kv_bytes_per_token:,} B"),
                ("KV per sequence", both(p.kv_bytes_per_sequence)),
                (f"KV for {p.batch_size:,} x {p.seq_len:,} tokens", both(p.kv_bytes)),
                ("share of the GPU", f"{p.kv_fraction:.1%}"),
                ("weights", both(p.weights_bytes)),
                (f"KV budget (after weights and {p.reserve_bytes / p.gpu_bytes:.0%} reserve)", both(p.kv_budget_bytes)),
                ("max batch at this context", f"{p.max_batch_size:,} sequences ({p.max_tokens:,} tokens)"),
                ("model's maximum context", top),
                ("verdict", verdict)]
        body = "".join(f"<tr><td style='padding-right:1em'>{k}</td><td><b>{v}</b></td></tr>" for k, v in rows)
        return f"<table>{body}</table><small>all figures per GPU of the TP={p.tp} group</small>"


def calculator_panel(**kwargs):
    """A fresh :class:`MemoryCalculator`'s panel (``.calculator`` is attached to it)."""
    calc = MemoryCalculator(**kwargs)
    calc.panel.calculator = calc
    return calc.panel
