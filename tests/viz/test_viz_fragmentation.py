"""Chapter 4's figures and live strip panel: strips, frames, legend, axes."""

import numpy as np
import pytest
import paged_kv  # noqa: F401
from paged_kv.errors import ConfigError
from paged_kv.sim import OrcaOracle, make_policy
from paged_kv.sim import simulate
from paged_kv.sim import trace_from_rows


def test_strip_rows_bins_by_majority_category():
    from paged_kv.viz.fragmentation import strip_rows
    owner = np.array([-1, 3, 3, 3, 12, 12, -1], np.int32)
    cat = np.array([4, 0, 0, 2, 0, 1, 3], np.int8)
    rows = strip_rows(owner, cat, bin_slots=3)  # bins [-1,3,3] [3,12,12] [-1 + 2 pad]
    assert rows[0].tolist() == [1 + 3, 1 + 3, 0]          # first owned slot's request colour
    assert rows[1].tolist() == [11 + 0, 11 + 0, 11 + 4]  # token, token, free (pad counts as free)
    assert strip_rows(owner, cat)[1].tolist() == (11 + cat).tolist()


def test_strip_figure_has_one_frame_per_layout():
    from paged_kv.viz.fragmentation import strip_figure
    tr = trace_from_rows([(0, 2, 1), (0, 1, 2), (0, 1, 1), (1, 3, 2)])
    runs = {name: simulate(tr, make_policy(name, 10, 10, **kw), layout_times=[0, 1, 2]).layouts
            for name, kw in (("oracle", {}), ("paged", {"block_size": 2}))}
    assert [len(v) for v in runs.values()] == [3, 3]
    fig = strip_figure(runs, title="tiny")
    assert len(fig.frames) == 3 and len(fig.layout.sliders[0].steps) == 3
    assert np.asarray(fig.frames[1].data[0].z).shape == (4, 10)  # 2 rows per run, one column per slot
    static = strip_figure(runs, replay=False)
    assert not static.frames and not static.layout.sliders
    padded = strip_figure({"a": runs["oracle"], "b": runs["paged"][:2]})  # b ended sooner: empty pool
    assert np.asarray(padded.frames[2].data[0].z)[2:].tolist() == [[0] * 10, [15] * 10]
    with pytest.raises(ConfigError, match="one pool size"):
        strip_figure({"a": runs["oracle"], "b": simulate(tr, OrcaOracle(12, 10), layouts=1).layouts})


@pytest.mark.parametrize("use_figure_widget", [None, False])
def test_strip_panel_resimulates_on_change(use_figure_widget):
    from paged_kv.widgets.fragmentation import strip_panel
    panel = strip_panel(num_requests=60, frames=8, horizon_s=20.0, use_figure_widget=use_figure_widget)
    (policy, placement, block), (rate, when) = panel.children[0].children, panel.children[1].children
    assert panel.state["res"].policy == "Orca (Oracle)" and block.disabled
    policy.value = "paged"
    assert panel.state["res"].policy == "paged" and not block.disabled and placement.disabled
    block.value = 64
    assert panel.state["res"].block_size == 64
    when.value = 3
    assert "mean batch" in panel.children[2].value


def test_strip_legend_sits_between_title_and_plot():
    from paged_kv.viz.fragmentation import strip_figure
    tr = trace_from_rows([(0, 2, 6), (1, 1, 2)])
    fig = strip_figure({"a": simulate(tr, OrcaOracle(8, 8), layout_times=range(3)).layouts}, title="t")
    lay = fig.layout
    assert lay.legend.yanchor == "bottom" and lay.legend.y >= 1  # on the plot's top edge, growing up
    assert lay.title.yref == "container" and lay.title.yanchor == "top"  # pinned to the figure's top
    anchor_px = (1 - lay.title.y) * lay.height  # plotly anchors a two-line title at its first line
    assert anchor_px <= 30 and anchor_px + 18 + 3 * 19 <= lay.margin.t  # subtitle, then 3 legend rows


def test_nice_ticks_and_block_size_axis():
    from paged_kv.viz.fragmentation import block_size_figure, nice_ticks
    ticks, fmt = nice_ticks(20.84, 27.12)
    assert ticks == [20.0, 22.0, 24.0, 26.0, 28.0] and fmt == ".0f"
    assert nice_ticks(0.3, 0.9) == ([0.2, 0.4, 0.6, 0.8, 1.0], ".1f")
    assert nice_ticks(24.3, 24.9)[0] == [24.2, 24.4, 24.6, 24.8, 25.0]
    fig = block_size_figure([1, 16, 256], [0.001, 0.02, 0.2], [27.12, 26.5, 20.84])
    right = fig.layout.yaxis2
    assert list(right.tickvals) == [20.0, 22.0, 24.0, 26.0, 28.0] and list(right.ticktext) == ["20", "22", "24", "26", "28"]
    assert tuple(right.range) == (20.0, 28.0)
