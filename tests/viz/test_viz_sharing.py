"""Chapter 6's figures: shared blocks framed, copy-on-write arrows, the live panel's fork button."""

import pytest

from paged_kv.blocks import paper_beam_trace, paper_sampling_trace
from paged_kv.viz.blocks import block_cells
from paged_kv.viz.sharing import SYSTEM_COLORS, latency_figure, savings_figure, sharing_figure, sharing_overlay


def test_overlay_frames_shared_blocks_by_ref_count():
    h = paper_sampling_trace()
    shapes, notes = sharing_overlay(h.snapshots[2])                 # after the fork: 7 and 1 shared
    assert sorted(s["name"] for s in shapes) == ["shared 1", "shared 7"]
    assert all(s["line"]["width"] == 3 for s in shapes) and notes == []
    x0, x1, y = block_cells(7, 9, 4)
    frame = next(s for s in shapes if s["name"] == "shared 7")
    assert (frame["x0"], frame["x1"], frame["y0"] < y < frame["y1"]) == (x0 - 0.5, x1 + 0.5, True)


def test_the_copy_on_write_step_draws_an_arrow_from_source_to_copy():
    h = paper_sampling_trace()
    shapes, notes = sharing_overlay(h.snapshots[3])                 # A1 writes "fathers": 1 -> 3
    arrow = next(n for n in notes if n["name"] == "copy 1->3")
    sx0, sx1, sy = block_cells(1, 9, 4)
    dx0, dx1, dy = block_cells(3, 9, 4)
    assert (arrow["ax"], arrow["ay"], arrow["x"], arrow["y"]) == ((sx0 + sx1) / 2, sy, (dx0 + dx1) / 2, dy)
    assert [s["name"] for s in shapes] == ["shared 7"]             # block 1 is no longer shared


def test_sharing_figure_replays_every_snapshot_with_its_overlay():
    h = paper_beam_trace()
    fig = sharing_figure(h.snapshots)
    assert len(fig.frames) == len(h.snapshots)
    for frame, snap in zip(fig.frames, h.snapshots):
        shared = sum(1 for b in snap.blocks if b.ref_count >= 2)
        assert len(frame.layout.shapes) == shared
        titles = [a.text for a in frame.layout.annotations if not a.name]
        assert len(titles) == 2                                     # the two panel titles stay
    top = max(max(b.ref_count for b in s.blocks) for s in h.snapshots)
    assert top == 6 and any(sh.line.width == 7 for f in fig.frames for sh in f.layout.shapes)   # at the dotted line


def test_savings_and_latency_figures_draw_what_they_are_given():
    rows = [dict(trace="Alpaca-like", mode="parallel", width=2, ours=0.07, paper=0.061),
            dict(trace="Alpaca-like", mode="parallel", width=4, ours=0.1, paper=None)]
    fig = savings_figure(rows)
    assert list(fig.data[0].x) == pytest.approx([7.0, 10.0]) and fig.data[0].orientation == "h"
    assert list(fig.data[1].text) == ["6.1%", "no single value"] and fig.data[1].x[1] == 0   # no bar, said so
    assert list(fig.data[0].y) == ["n=2 parallel", "n=4 parallel"]
    lat = latency_figure({"n=2": {"paged": ([1, 2], [0.1, 0.2]), "Orca": ([1, 2], [0.1, 0.9])}}, cap=0.5)
    assert [t.name for t in lat.data] == ["paged", "Orca"] and lat.layout.yaxis.range == (0, 0.5)
    assert lat.layout.legend.y < 0                                  # below the plot, not over the title


def test_latency_figure_gives_a_system_one_colour_and_one_legend_entry_in_every_panel():
    curve = ([1, 2], [0.1, 0.2])
    curves = {"n = 2": {"paged (vLLM)": curve, "Orca (Oracle)": curve, "Orca (Pow2)": curve},
              "n = 4": {"Orca (Pow2)": curve, "paged (vLLM)": curve},          # another order, one missing
              "n = 6": {"Orca (Oracle)": curve, "new system": curve}}
    fig = latency_figure(curves, marks={"n = 4": {"paged (vLLM)": 1.5}}, cols=2)
    lines = [t for t in fig.data if t.x != (None,)]
    colour = {}
    for t in lines:
        assert colour.setdefault(t.name, t.line.color) == t.line.color, t.name
    assert colour["paged (vLLM)"] == SYSTEM_COLORS["paged (vLLM)"]
    assert colour["Orca (Oracle)"] == SYSTEM_COLORS["Orca (Oracle)"]
    assert len(set(colour.values())) == len(colour)                 # four systems, four colours
    shown = [t.name for t in fig.data if t.showlegend is not False]
    assert sorted(shown) == sorted([*colour, "rate it sustains (dotted)"])   # once each
    (mark,) = fig.layout.shapes                 # the dotted line in panel 2 (x2), in paged's colour
    assert (mark.x0, mark.line.color, mark.line.dash, mark.xref) == (1.5, SYSTEM_COLORS["paged (vLLM)"], "dot", "x2")


@pytest.mark.parametrize("use_figure_widget", [None, False])
def test_panel_forks_a_request_and_shows_the_copy(use_figure_widget):
    from paged_kv.widgets import block_panel
    panel = block_panel(load_model=False, num_blocks=8, block_size=4, sharing=True,
                        use_figure_widget=use_figure_widget)
    live = panel.live
    (prompt, add_text, length, add_len), (decode, which, fork, append, finish) = (panel.children[0].children,
                                                                                  panel.children[1].children)
    length.value = 6
    add_len.click()
    fork.click()                                                 # request 0 is selected by the panel
    assert live.running == [0, 1] and live.manager.allocator.ref_count(1) == 2
    assert "request 1 forked from request 0" in panel.children[2].value
    decode.click()                                               # both write: one copy, one in place
    last = live.history.snapshots[-2:]
    assert [len(s.event.copies) for s in last] == [1, 0]
    assert live.manager.block_table(0).block_ids != live.manager.block_table(1).block_ids
    fork.click()                                                 # request 2 shares 0's blocks
    assert append.description == "append to selected" and which.value == 0
    which.value = 2
    append.click()                                               # 2 alone writes: its own copy
    assert live.history.events[-1].copies and live.manager.num_tokens(2) == 8
    assert live.manager.num_tokens(0) == live.manager.num_tokens(1) == 7


def test_savings_bars_are_horizontal_in_stacked_panels_each_number_on_its_own_row():
    """Fig. 15: as vertical bars, neighbouring labels ("37.8%37.6%") ran into each other."""
    rows = [dict(trace=t, mode=m, width=w, ours=0.1 * w, paper=None if w == 4 else 0.09 * w)
            for t in ("Alpaca-like", "ShareGPT-like") for m in ("parallel", "beam") for w in (2, 4, 6)]
    fig = savings_figure(rows, title="Memory saved by sharing blocks (block size 16)")
    assert {t.orientation for t in fig.data} == {"h"} and len(fig.data) == 4
    assert fig.layout.xaxis.domain == (0, 1) and fig.layout.xaxis2.domain == (0, 1)   # one above the other
    assert fig.layout.yaxis.domain[0] > fig.layout.yaxis2.domain[1]
    ours = fig.data[0]
    assert len(set(ours.y)) == len(ours.y) == 6                   # one row per (mode, width)
    assert fig.layout.xaxis.range[1] > max(100 * r["ours"] for r in rows)   # room for the label
    assert [a.text for a in fig.layout.annotations] == ["Alpaca-like", "ShareGPT-like"]
