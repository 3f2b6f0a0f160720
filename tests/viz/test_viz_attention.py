"""The attention-triangle figure (paged_kv.viz.attention): the cells a step computes, counted by
hand, and a slider frame per step."""

import pytest

from paged_kv.errors import ConfigError
from paged_kv.viz import attention as va


def _count(cells, kind):
    return sum(row.count(kind) for row in cells)


@pytest.mark.parametrize("t", [1, 5, 9])
def test_recompute_scores_the_triangle_and_remakes_every_kv(t):
    cells = va.attention_step_cells(t, 9, "recompute")
    assert len(cells) == 10 and all(len(r) == 9 for r in cells)
    assert _count(cells[1:], 1) + _count(cells[1:], 2) == t * (t + 1) // 2   # the causal triangle
    assert cells[t] [:t] == [2] * t and _count(cells[1:], 2) == t            # the new query's row
    assert cells[0][:t] == [4] * (t - 1) + [6] and cells[0][t:] == [0] * (9 - t)


@pytest.mark.parametrize("t", [1, 4, 9])
def test_cached_scores_one_row_and_makes_one_kv(t):
    cells = va.attention_step_cells(t, 9, "cached")
    assert _count(cells[1:], 2) == t and _count(cells[1:], 1) == 0
    assert _count(cells[1:], 3) == t * (t - 1) // 2                          # old rows: not computed
    assert cells[0][:t] == [5] * (t - 1) + [6]


def test_figure_has_one_frame_per_step_and_rejects_bad_input():
    fig = va.attention_triangle_figure("cached", t_values=[2, 3, 4], active=1)
    assert [f.name for f in fig.frames] == ["t=2", "t=3", "t=4"]
    assert [s.label for s in fig.layout.sliders[0].steps] == ["2", "3", "4"]
    assert [list(r) for r in fig.frames[2].data[0].z] == va.attention_step_cells(4, 4, "cached")
    assert "3 scores and 1 K/V pair computed" in fig.layout.title.text
    with pytest.raises(ConfigError, match="mode"):
        va.attention_step_cells(2, 4, "paged")
    with pytest.raises(ConfigError, match="t must be"):
        va.attention_step_cells(5, 4, "cached")


@pytest.mark.parametrize("mode", ["recompute", "cached"])
def test_every_category_in_a_picture_has_its_own_colour(mode):
    fig = va.attention_triangle_figure(mode)
    legend = [tr.marker.color for tr in fig.data[1:]]
    assert len(legend) == len(set(legend)) == 4


@pytest.mark.parametrize("t", [2, 7, 12])
def test_recompute_title_names_the_triangle_and_the_full_matrix(t):
    """The title's counts are the figure's own cells: the triangle's scores (needed) and the
    t x t matrix the torch path computes before masking (chapter 1's 28 of 49 at t = 7)."""
    fig = va.attention_triangle_figure("recompute", t_values=[t], active=0)
    cells = va.attention_step_cells(t, t, "recompute")
    triangle = _count(cells[1:], 1) + _count(cells[1:], 2)
    matrix = sum(1 for row in cells[1:t + 1] for _ in row[:t])        # every query row x every key
    title = fig.layout.title.text
    assert f"{triangle} scores (the triangle)" in title
    assert f"computes all {matrix}, then masks {matrix - triangle}" in title
    assert f"{_count(cells[:1], 4) + _count(cells[:1], 6)} K/V pairs" in title
