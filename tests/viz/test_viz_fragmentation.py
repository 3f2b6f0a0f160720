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
    # from 0, as the bars are: an axis from the smallest batch drew a 23% drop as a collapse
    assert list(right.tickvals) == [0.0, 10.0, 20.0, 30.0]
    assert list(right.ticktext) == ["0", "10", "20", "30"] and tuple(right.range) == (0.0, 30.0)
    assert fig.layout.yaxis.range is None or fig.layout.yaxis.range[0] == 0  # the bars' axis: plotly's, from 0


def test_strip_rows_leave_the_legend_room_on_a_phone():
    """At 400 px one-line row labels ("Oracle, first-fit · category") left the plot, and so the
    legend, ~150 px: one entry a row, over the title. Labels on two lines, and a legend on the
    plot's edge (one on the figure's edge pushes the margin by its own width)."""
    from paged_kv.viz.fragmentation import strip_figure
    tr = trace_from_rows([(0, 2, 6), (1, 1, 2)])
    fig = strip_figure({"Oracle, first-fit": simulate(tr, OrcaOracle(8, 8), layout_times=range(3)).layouts})
    assert list(fig.layout.yaxis.ticktext) == ["Oracle, first-fit ·<br>request", "Oracle, first-fit ·<br>category"]
    assert fig.layout.legend.xref in (None, "paper") and fig.layout.legend.x == 0
    assert fig.data[0].customdata[1][0] == "Oracle, first-fit · category"   # hover text on one line


def test_length_histogram_bins_by_octave_and_keeps_every_request():
    from paged_kv.sim import synthetic_trace
    from paged_kv.viz.fragmentation import length_histogram
    trs = {"long": synthetic_trace(300, 2.0, "sharegpt", seed=0), "short": synthetic_trace(300, 2.0, "alpaca", seed=0)}
    fig = length_histogram(trs, bins_per_octave=2)  # the default
    assert fig.layout.xaxis.type == "log" and fig.layout.xaxis2.type == "log"
    prompts = [t for t in fig.data if t.xaxis == "x"]
    assert [t.name.split(" (")[0] for t in prompts] == ["long", "short"]
    for t, tr in zip(prompts, trs.values()):
        edges, share = np.asarray(t.x), np.asarray(t.y)[:-1]
        assert np.allclose(np.diff(np.log2(edges[edges >= 4])), 0.5, atol=0.1)  # two bins per doubling
        assert share.sum() == pytest.approx(100, abs=0.01)  # every request in one bin
        # brute force: the share of requests in each bin, counted one request at a time
        k = np.searchsorted(edges, 5.5, side="right") - 1
        inside = sum(1 for n in tr.prompt_len if edges[k] <= n < edges[k + 1])
        assert share[k] == pytest.approx(100 * inside / len(tr.prompt_len), abs=1e-3)
    # the short trace's tallest bin no longer dwarfs the long one's (it was 88% against 19%)
    assert max(prompts[1].y) < 3 * max(prompts[0].y)


def test_step_rows_add_up_to_the_pool():
    from paged_kv.viz.fragmentation import step_rows
    res = simulate(trace_from_rows([(0, 2, 6), (1, 1, 2)]), OrcaOracle(10, 8), check=True)
    header, rows = step_rows(res)
    assert header[:3] == ["step", "running", "waiting"] and len(header) == 8
    assert [r[0] for r in rows] == list(range(res.num_steps))
    assert all(sum(r[3:]) == 10 for r in rows)  # the five categories cover the pool, every step
    assert rows[1][1:3] == [1, 1]  # step 1: request 0 runs, request 1 waits


# --- strips you can count: colours, gaps, borders; Fig. 2 paired bars --------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-1, 40), max_size=80))
def test_neighbouring_regions_never_share_a_colour(owners):
    from paged_kv.viz.fragmentation import region_colors
    owners = np.array(owners, np.int64)
    col = region_colors(owners)
    assert len(col) == len(owners) and ((0 <= col) & (col < 10)).all()
    for i in range(1, len(owners)):
        if owners[i] >= 0 and owners[i - 1] >= 0:
            same = owners[i] == owners[i - 1]
            assert (col[i] == col[i - 1]) == same, (i, owners[i - 1:i + 1], col[i - 1:i + 1])


def test_equal_ids_mod_10_get_different_colours():
    """Requests 3 and 13 side by side had one colour (rid mod 10): no more."""
    from paged_kv.viz.fragmentation import region_colors
    col = region_colors(np.array([3, 3, 13, 13, 23]))
    assert col[1] != col[2] and col[3] != col[4] and col[0] == 3  # the first keeps its usual colour


def test_small_strips_show_slot_gaps_and_borders():
    from paged_kv.viz.fragmentation import BORDER_TRACE, GAP_POOL, STRIP_TRACE, strip_figure
    from paged_kv.viz.controls import trace_indices
    tr = trace_from_rows([(0, 2, 1), (0, 1, 2)])  # regions of 3 and 3 slots: blocks of 4 and 4
    res = simulate(tr, OrcaOracle(16, 16), layout_times=[0])
    lay = res.layouts[0]
    assert lay.borders.tolist() == [0, 3, 4, 7, 8]  # region 0, its tail, region 1, its tail, the free 8
    fig = strip_figure({"buddy": res.layouts, "again": res.layouts})
    heat = fig.data[trace_indices(fig, [STRIP_TRACE])[0]]
    assert heat.xgap == 1 and 16 <= GAP_POOL and BORDER_TRACE in [t.name for t in fig.data]
    lines = [(s.x0, s.y0, s.y1) for s in fig.layout.shapes if s.visible]
    # one line per border after slot 0, across its own pair of rows (run 0: rows 0-1, run 1: rows 2-3)
    assert lines == [(b - 0.5, 2 * j - 0.5, 2 * j + 1.5) for j in (0, 1) for b in (3, 4, 7, 8)]
    paged = simulate(tr, make_policy("paged", 16, 16, block_size=4, watermark=0.0), layout_times=[0])
    assert paged.layouts[0].borders.tolist() == [0, 4, 8, 12]
    big = simulate(tr, OrcaOracle(4096, 64), layout_times=[0])
    fig = strip_figure({"big": big.layouts})
    assert fig.data[0].xgap == 0 and not fig.layout.shapes  # binned columns: no borders


def test_fig2_paired_bars():
    from paged_kv.sim import PAPER_RESULTS
    from paged_kv.viz.fragmentation import category_bars
    ours = {"Orca (Max)": dict(token_states=0.2, reserved=0.1, internal=0.6, external=0.1),
            "paged": dict(token_states=0.97, reserved=0.02, internal=0.01, external=0.0)}
    fig = category_bars(ours, paper={"Orca (Max)": PAPER_RESULTS["fig2"]["max"], "paged": PAPER_RESULTS["fig2"]["paged"]})
    assert list(fig.layout.yaxis.ticktext) == ["Orca (Max) · ours", "Orca (Max) · paper", "paged · ours", "paged · paper"]
    by_name = {t.name: list(t.x) for t in fig.data}
    assert by_name["internal fragmentation"][:2] == [60.0, 57.3]  # ours | paper, bar for bar
    assert by_name["not broken down (paper)"] == [0.0, 0.0, 0.0, pytest.approx(3.7)]
    for i in range(4):  # every bar is whole
        assert sum(v[i] for v in by_name.values()) == pytest.approx(100, abs=0.15)
