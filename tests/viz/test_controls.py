"""Every control of the static figures changes the object it is meant to change.

Each dropdown button and slider step is *applied* to a copy of its figure, as plotly.js would in
the page (``plotly_update`` / frames), and the annotation, shape or trace it targets is then found
by its name and checked.  The controls compute their paths from those names when the figure is
built (``paged_kv.viz.controls``), so a figure that gains an annotation or a trace keeps working.
"""

import copy

import plotly.graph_objects as go
import pytest

from paged_kv import memory
from paged_kv.blocks import paper_trace
from paged_kv.errors import ConfigError
from paged_kv.sim import OrcaOracle, simulate, trace_from_rows
from paged_kv.viz import layout_path, trace_indices
from paged_kv.viz import calculator as vc
from paged_kv.viz import memory as vm
from paged_kv.viz.blocks import TRACE_NAMES, blocks_figure
from paged_kv.viz.fragmentation import STRIP_TRACE, strip_figure

MODELS, GPUS, CONTEXTS = ["Llama-3-8B", "Llama-2-70B"], ["A100-80GB", "H200"], [2048, 8192, 32768]


def _named(items, name):
    hits = [x for x in items if x.name == name]
    assert len(hits) == 1, f"expected one item named {name!r}"
    return hits[0]


def _restyle(fig: go.Figure, data: dict, indices) -> None:
    """plotly.js's restyle: value ``k`` of a list goes to the k-th target trace; ``None`` (JSON
    null) on an attribute the trace does not have changes nothing."""
    indices = range(len(fig.data)) if indices is None else indices
    for path, values in data.items():
        for k, i in enumerate(indices):
            value = values[k % len(values)] if isinstance(values, list) else values
            trace = fig.data[i]
            try:
                trace[path] = value
            except (ValueError, KeyError):
                assert value is None, f"{path} does not apply to trace {i} ({trace.type})"


def _apply(fig: go.Figure, control: dict) -> go.Figure:
    """A copy of ``fig`` after plotly.js would run ``control`` (an "update"/"restyle" button or a
    slider step)."""
    out = go.Figure(copy.deepcopy(fig.to_dict()))
    method, args = control["method"], list(control["args"])
    if method == "update":
        _restyle(out, args[0], list(args[2]) if len(args) > 2 else None)
        out.plotly_relayout(args[1] if len(args) > 1 else {})
    elif method == "restyle":
        _restyle(out, args[0], list(args[1]) if len(args) > 1 else None)
    else:
        raise AssertionError(f"unexpected method {method}")
    return out


@pytest.fixture(scope="module")
def calc():
    data = vc.calculator_data(MODELS, GPUS, CONTEXTS, tps=(1, 8))
    return data, vc.calculator_figure(data, model=MODELS[0], gpu=GPUS[0], context_index=0)


def test_calculator_model_menu_changes_the_model_note_and_the_tables(calc):
    data, fig = calc
    model_menu = fig.layout.updatemenus[0]
    for button in model_menu.buttons:
        after = _apply(fig, button.to_plotly_json())
        note = _named(after.layout.annotations, "model note").text
        assert note.startswith(f"<b>{button.label}</b>")
        assert f"{memory.kv_bytes_per_token(button.label):,} B" in note
        assert _named(after.layout.annotations, "GPU note").text == _named(fig.layout.annotations, "GPU note").text
        for g in GPUS:
            table = after.data[trace_indices(after, [f"table: {g}"])[0]]
            plan = memory.plan_memory(button.label, g, 2048, block_size=data["block_size"])
            expect = f"{plan.max_batch_size:,}" if plan.weights_fit else vc.NO_ROOM
            assert table.cells.values[vc.CALC_COLUMNS.index("max batch")][0] == expect


def test_calculator_gpu_menu_shows_that_gpus_traces_and_note(calc):
    _, fig = calc
    for button in fig.layout.updatemenus[1].buttons:
        after = _apply(fig, button.to_plotly_json())
        shown = {t.meta["gpu"] for t in after.data if t.visible}
        assert shown == {button.label}
        assert button.label in _named(after.layout.annotations, "GPU note").text


def test_calculator_slider_moves_the_marker_and_the_highlighted_row(calc):
    _, fig = calc
    for i, step in enumerate(fig.layout.sliders[0].steps):
        after = _apply(fig, step.to_plotly_json())
        marker = _named(after.layout.shapes, "context marker")
        assert marker.x0 == marker.x1 == i
        for g in GPUS:
            fills = after.data[trace_indices(after, [f"table: {g}"])[0]].cells.fill.color[0]
            assert [f == "#FFF3C4" for f in fills] == [k == i for k in range(len(CONTEXTS))]


def test_layout_path_and_trace_indices_find_by_name_or_refuse():
    crowded = go.Figure(layout=dict(
        annotations=[dict(text="in front", name="intruder"), dict(text="x", name="model note")],
        shapes=[dict(type="line", name="intruder"), dict(type="line", name="context marker")]))
    assert layout_path(crowded, "annotations", "model note", "text") == "annotations[1].text"
    assert layout_path(crowded, "shapes", "context marker", "x0") == "shapes[1].x0"
    with pytest.raises(ConfigError, match="named 'nope', found 0"):
        layout_path(crowded, "annotations", "nope", "text")
    two = go.Figure([go.Scatter(name="a"), go.Scatter(name="a")])
    with pytest.raises(ConfigError, match="one trace named 'a', found 2"):
        trace_indices(two, ["a"])


def test_kv_vs_weights_buttons_restyle_every_model_line():
    data = vm.kv_vs_weights_data(MODELS, contexts=[1024, 4096], batch_sizes=(1, 8))
    fig = vm.kv_vs_weights_figure(data)
    for button, batch in zip(fig.layout.updatemenus[0].buttons, (1, 8)):
        after = _apply(fig, button.to_plotly_json())
        for name in MODELS:
            line = after.data[trace_indices(after, [name])[0]]
            expect = [memory.kv_cache_bytes(name, c, batch) / memory.weights_bytes(name) for c in (1024, 4096)]
            assert list(line.y) == pytest.approx(expect)


def test_gpu_fit_slider_sets_each_gpus_bars():
    data = vm.gpu_fit_data(MODELS, GPUS, contexts=[2048, 8192])
    fig = vm.gpu_fit_figure(data)
    for step, c in zip(fig.layout.sliders[0].steps, (2048, 8192)):
        after = _apply(fig, step.to_plotly_json())
        for g in GPUS:
            dots = after.data[trace_indices(after, [g])[0]]   # one row per model, the count along x
            assert list(dots.x) == [memory.max_batch_size(m, g, c) or None for m in MODELS]


def test_block_frames_update_the_named_traces():
    snaps = paper_trace().snapshots
    fig = blocks_figure(snaps)
    targets = trace_indices(fig, TRACE_NAMES)
    for frame in fig.frames:
        assert list(frame.traces) == targets
        assert tuple(t.name for t in frame.data) == TRACE_NAMES


def test_strip_frames_update_the_strip():
    res = simulate(trace_from_rows([(0, 2, 6), (1, 1, 2)]), OrcaOracle(8, 8), layout_times=range(3))
    fig = strip_figure({"a": res.layouts})
    (strip,) = trace_indices(fig, [STRIP_TRACE])  # border lines are layout shapes, set per frame
    assert all(list(f.traces) == [strip] for f in fig.frames) and len(fig.frames) == 3
