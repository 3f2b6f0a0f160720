"""Decode-cost figures (paged_kv.viz.cost): they draw the data they are given, no bars on log axes."""

import pytest

from paged_kv.errors import ConfigError
from paged_kv.viz import cost as vc


def test_flops_split_stacks_linear_and_attention():
    fig = vc.flops_split_figure([1, 2, 3], [10, 20, 30], [1, 4, 9], [11, 24, 39])
    assert fig.data[0].stackgroup == fig.data[1].stackgroup == "flops"
    assert list(fig.data[2].y) == [11, 24, 39]
    with pytest.raises(ConfigError, match="series"):
        vc.flops_split_figure([1, 2], [1], [1, 2])


def test_scaling_guides_have_slopes_two_and_three():
    fig = vc.scaling_figure([10, 100], {"a": [5.0, 500.0], "b": [1.0, 1000.0]}, {"crossover": 50},
                            guides={2: "a", 3: "b"})
    guides = {t.name: t.y for t in fig.data if t.name.startswith("slope")}
    (two,), (three,) = [v for k, v in guides.items() if "2" in k], [v for k, v in guides.items() if "3" in k]
    assert two[1] / two[0] == pytest.approx(100) and three[1] / three[0] == pytest.approx(1000)
    assert two[0] == 5.0 and three[0] == 1.0     # each guide through its series' first point
    assert fig.layout.annotations[0].x == pytest.approx(__import__("math").log10(50))  # log axis
    assert fig.layout.xaxis.type == fig.layout.yaxis.type == "log"
    assert all(t.type == "scatter" for t in fig.data)
    with pytest.raises(ConfigError, match="positive"):
        vc.scaling_figure([0, 1], {"a": [1, 2]})
    with pytest.raises(ConfigError, match="unknown series"):
        vc.scaling_figure([1, 2], {"a": [1, 2]}, guides={2: "z"})


def test_step_cost_has_a_linear_panel_for_the_last_series():
    fig = vc.step_cost_figure([8, 9, 10], {"recompute": [50, 60, 70], "cache": [50, 6.0, 6.1]}, "MFLOP", "t")
    assert fig.layout.yaxis.type == "log" and fig.layout.yaxis2.type != "log"
    lower = [t for t in fig.data if t.yaxis == "y2"]
    assert len(lower) == 1 and list(lower[0].y) == [6.0, 6.1]   # decode steps of the cache only
    assert any("prefill" in a.text for a in fig.layout.annotations)


def test_roofline_lines_per_batch():
    fig = vc.roofline_figure([256, 512], {"batch 1": [200.0, 199.0], "batch 8": [1600.0, 1500.0]}, "r")
    assert [t.name for t in fig.data] == ["batch 1", "batch 8"]
    assert list(fig.layout.xaxis.tickvals) == [256, 512]


def test_long_titles_are_broken_to_fit_a_phone():
    text = "Llama-3-8B on an H100: the roofline bound on decode throughput"
    fig = vc.roofline_figure([1, 2], {"batch 1": [3.0, 2.0]}, text)
    lines = fig.layout.title.text.split("<br>")
    assert len(lines) > 1 and all(len(line) <= 38 for line in lines)
    assert " ".join(lines) == text                     # nothing lost, broken at spaces only
    assert vc.roofline_figure([1, 2], {"b": [3.0, 2.0]}, "short").layout.title.text == "short"


def test_log_panel_keeps_tick_labels_when_it_spans_under_two_decades():
    """One tick per decade on an axis from 1.4 to 9 ms shows no label at all (review shot 03):
    the step-cost panel's log axis gets labelled ticks at 1-2-5 that bracket the data."""
    fig = vc.step_cost_figure([8, 9, 10], {"recompute": [2.0, 6.0, 9.0], "cache": [1.4, 1.5, 1.6]}, "ms", "t")
    assert list(fig.layout.yaxis.tickvals) == [1.0, 2.0, 5.0, 10.0]
    assert list(fig.layout.yaxis.ticktext) == ["1", "2", "5", "10"]
    fig = vc.step_cost_figure([8, 9, 10], {"recompute": [50, 600, 7000], "cache": [50, 6.0, 6.1]}, "MFLOP", "t")
    vals = list(fig.layout.yaxis.tickvals)
    assert vals[0] <= 6.0 and vals[-1] >= 7000 and len(fig.layout.yaxis.ticktext) == len(vals)


def test_attention_timing_guide_is_the_bytes_through_the_longest_point():
    fig = vc.attention_timing_figure([512, 1024, 4096], [1.0, 1.5, 6.0], [100, 200, 800], "t")
    guide, measured = fig.data
    assert list(measured.y) == [1.0, 1.5, 6.0]
    assert guide.y[-1] == pytest.approx(6.0)                           # through the longest point
    assert guide.y[1] / guide.y[0] == pytest.approx(2.0) and guide.y[2] / guide.y[0] == pytest.approx(8.0)
    assert fig.layout.xaxis.type == fig.layout.yaxis.type == "log"
    with pytest.raises(ConfigError, match="positive"):
        vc.attention_timing_figure([1, 2], [0.0, 1.0], [1, 2], "t")


def test_roofline_lines_end_where_the_batch_stops_fitting_and_the_wall_is_drawn():
    fig = vc.roofline_figure([256, 512, 1024], {"batch 1": [200.0, 199.0, 198.0], "batch 256": [9e3, 8e3, None]},
                             "r", wall=[(900, 2e4), (450, 1e4), (220, 5e3)], compute_roof=[6e4, 6e4, 5e4])
    names = [t.name for t in fig.data]
    assert list(fig.data[names.index("batch 256")].y)[-1] is None       # the line ends: no point drawn
    wall = fig.data[names.index("memory wall (largest batch that fits)")]
    assert list(wall.y) == [2e4, 1e4, 5e3] and list(wall.text) == ["B=900", "B=450", "B=220"]
    shade = fig.data[names.index("batch does not fit in memory")]
    assert shade.fill == "toself" and min(shade.y) == 5e3 and max(shade.y) > 6e4   # from the wall up
    assert 10 ** fig.layout.yaxis.range[1] >= max(shade.y)
    assert "KV capacity, not arithmetic, caps tokens/s" in fig.layout.title.text.replace("<br>", " ")
    assert 10 ** fig.layout.yaxis.range[1] > 2 * 2e4                  # room for the label over the top point
    # a context where nothing fits is left off the wall
    fig = vc.roofline_figure([1, 2], {"b": [3.0, None]}, "r", wall=[(4, 9.0), (0, 0.0)])
    names = [t.name for t in fig.data]
    assert list(fig.data[names.index("memory wall (largest batch that fits)")].x) == [1]
