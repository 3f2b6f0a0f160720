"""The block-layout figure (frames + slider built from snapshots) and the live panel, which drives
the real manager and the tiny model through the paged cache: its tokens must equal generate()'s."""

import pytest

from paged_kv.blocks import BlockHistory, BlockSpaceManager, paper_trace
from paged_kv.viz.blocks import block_cells, block_size_figure, block_traces, blocks_figure, refresh_blocks_figure, seq_order
from paged_kv.widgets.blocks import block_panel


def cell(trace, block, offset, bs=4, nb=9):
    """The pool heatmap cell of (block, offset) of the paper trace's pool."""
    x0, _, y = block_cells(block, nb, bs)
    return trace.z[y][x0 + offset], trace.customdata[y][x0 + offset], trace.text[y][x0 + offset]


def test_figure_replays_every_snapshot_with_a_slider():
    h = paper_trace()
    fig = blocks_figure(h.snapshots, title="Figures 6-7")
    assert len(fig.frames) == len(h.snapshots) == 5
    steps = fig.layout.sliders[0].steps
    assert [s.args[0][0] for s in steps] == [f.name for f in fig.frames]
    assert all(s.args[1]["frame"]["redraw"] for s in steps)
    assert fig.frames[0].data[0].z != fig.frames[-1].data[0].z          # moving the slider changes the pool
    assert "request B:<br><sup>prompt of 6 tokens" in fig.frames[-1].layout.title.text


def test_pool_cells_show_owner_fill_and_hover():
    h = paper_trace()
    pool, labels, tables = block_traces(h.snapshots[-1], seq_order(h.snapshots))
    # A is sequence 0 (z 1 = stored token, 2 = reserved empty), B is sequence 1 (z 3, 4), free = 0
    assert [cell(pool, 3, o)[0] for o in range(4)] == [1, 2, 2, 2]      # "brought" + 3 empty slots
    assert [cell(pool, 2, o)[0] for o in range(4)] == [3, 3, 4, 4]      # "of times" + 2 empty
    assert [cell(pool, 0, o)[0] for o in range(4)] == [0, 0, 0, 0]
    z, hover, text = cell(pool, 3, 0)
    assert text == "brought" and "block 3, slot 12" in hover and "A (logical 2)" in hover and "tokens 8 of A" in hover
    assert "free" in cell(pool, 4, 0)[1]
    assert labels.text[7] == "<b>7</b> ×1" and labels.text[0] == "0"
    assert tables.y == ("A", "B") and list(tables.text[0][:3]) == ["7", "1", "3"] and list(tables.text[1][:2]) == ["5", "2"]


def test_refresh_updates_a_figure_in_place():
    h = paper_trace()
    fig = blocks_figure(h.snapshots[:2], replay=False)
    assert not fig.frames and not fig.layout.sliders
    refresh_blocks_figure(fig, h.snapshots)
    assert list(fig.data[2].text[1])[0] == "5" and "step 4" in fig.layout.title.text


def test_panel_falls_back_to_an_output_and_drives_the_manager():
    import ipywidgets as w

    panel = block_panel(load_model=False, num_blocks=6, block_size=4, use_figure_widget=False)
    live = panel.live
    out = panel.children[-1]
    assert isinstance(out, w.Output)          # (display() only captures into it under a kernel)
    add_text, add_len = panel.children[0].children[1], panel.children[0].children[3]
    decode, which, finish = panel.children[1].children
    add_text.click()                          # "To be, or not to be": 19 tokens -> 5 blocks
    assert live.manager.block_table(0).block_ids == [0, 1, 2, 3, 4]
    add_len.click()                           # 12 tokens do not fit the 1 free block: error shown
    assert "out of KV blocks" in panel.children[2].value and live.running == [0]
    decode.click()
    assert live.manager.num_tokens(0) == 20
    finish.click()                            # no value set by hand: the panel selected request 0
    assert live.running == [] and live.manager.num_free_blocks == 6
    assert [e.kind for e in live.history.events] == ["start", "allocate", "append", "free"]


@pytest.mark.parametrize("use_figure_widget", [None, False])
def test_panel_finish_works_by_clicks_alone(use_figure_widget):
    """ipywidgets 8 leaves a Dropdown's value None when its options change from empty, so "finish"
    said "no request to finish" while two requests ran, and again after the last one finished.
    Driven only by clicks, as a user would; the table loses a finished request's row."""
    panel = block_panel(load_model=False, num_blocks=12, block_size=4, use_figure_widget=use_figure_widget)
    live = panel.live
    (prompt, add_text, length, add_len), (decode, which, finish) = panel.children[0].children, panel.children[1].children
    add_len.click()
    add_len.click()
    assert live.running == [0, 1] and which.value == 0
    finish.click()
    assert live.running == [1] and "no request" not in panel.children[2].value
    finish.click()
    assert live.running == [] and which.value is None
    add_text.click()                          # after the last one finished: the new one is selected
    assert which.value == 2
    decode.click()
    finish.click()
    assert live.running == [] and "no request" not in panel.children[2].value
    finish.click()
    assert "no request to finish" in panel.children[2].value


def test_finished_request_leaves_no_table_row_and_rows_keep_their_place():
    from paged_kv.blocks import BlockHistory, BlockSpaceManager
    h = BlockHistory(BlockSpaceManager(8, 4))
    h.allocate(0, 5)
    h.allocate(1, 3)
    h.free(0)
    h.allocate(2, 2)
    order = seq_order(h.snapshots)
    assert block_traces(h.snapshots[2], order)[2].y == ("0", "1")
    assert block_traces(h.snapshots[3], order)[2].y == ("1",)          # 0 finished: its row is gone
    _, _, tables = block_traces(h.snapshots[4], order)
    assert tables.y == ("1", "2") and tables.z[1][0] == 2 + 2 * 2       # 2 keeps its own colour (k = 2), pale: 2 of 4 filled
    fig = blocks_figure(h.snapshots)
    assert tuple(fig.layout.yaxis2.range) == (1.5, -0.5)               # at most 2 rows at once: fixed range


def test_status_box_has_a_fixed_height():
    """The status lines above the figure grew a line per request and pushed the figure down."""
    panel = block_panel(load_model=False, num_blocks=12, block_size=4, use_figure_widget=False)
    status = panel.children[2]
    assert status.layout.height and status.layout.overflow == "auto"


def test_panel_updates_a_figure_widget_in_place():
    pytest.importorskip("anywidget")
    import plotly.graph_objects as go

    panel = block_panel(load_model=False, num_blocks=6, block_size=4, use_figure_widget=True)
    fig = panel.children[-1]
    assert isinstance(fig, go.FigureWidget)
    panel.children[0].children[3].click()     # a 12-token prompt -> 3 blocks
    assert "3/6 blocks used" in fig.layout.title.text










def test_panel_titles_sit_over_their_own_panels():
    """At narrow widths centred titles of the 0.66/0.34 columns ran into each other: each title is
    now left-aligned at the start of its own panel, in short lines."""
    import re

    fig = blocks_figure(paper_trace().snapshots)
    left, right = fig.layout.annotations[:2]
    assert (left.xanchor, right.xanchor) == ("left", "left")
    assert left.x == fig.layout.xaxis.domain[0] and right.x == fig.layout.xaxis2.domain[0]
    for note in (left, right):
        assert max(len(re.sub("<[^>]+>", "", line)) for line in note.text.split("<br>")) <= 20


def test_block_size_figure_has_one_labelled_axis_per_quantity():
    sizes, share, entries = [1, 2, 4, 16], [0.0, 0.1, 0.3, 1.5], [487.0, 244.0, 122.0, 31.0]
    fig = block_size_figure(sizes, share, entries)
    waste, table = fig.data
    assert list(waste.y) == share and list(table.y) == entries
    assert waste.yaxis == "y" and table.yaxis == "y2"                 # two axes, not one "value"
    assert fig.layout.yaxis.type in (None, "linear") and fig.layout.yaxis.rangemode == "tozero"   # 0 shows
    assert fig.layout.yaxis2.type == "log"
    assert "%" in fig.layout.yaxis.title.text and "entries" in fig.layout.yaxis2.title.text
    assert fig.layout.xaxis.type == "log" and list(fig.layout.xaxis2.tickvals) == sizes


def test_a_long_table_wraps_into_rows_that_say_where_they_start():
    """18 entries in one row ran together ("2221201918…", review shot 13): a table wraps at
    TABLE_COLS entries, its rows labelled with the logical index they start at, every entry kept
    once, in its place, with its hover; a tick per column, an offset ("+3") once the table wraps."""
    from paged_kv.viz.blocks import TABLE_COLS, table_rows

    for n_blocks in (TABLE_COLS, TABLE_COLS + 1, 18):
        h = BlockHistory(BlockSpaceManager(40, 2))
        h.allocate("s", ["x"] * (2 * n_blocks))
        h.allocate("t", ["y"] * 3)
        fig = blocks_figure(h.snapshots, replay=False)                 # the frames are block_traces too
        tables = next(t for t in fig.data if t.name == "block tables")
        lines = -(-n_blocks // TABLE_COLS)
        assert list(tables.y) == ["s"] + [f"s +{TABLE_COLS * i}" for i in range(1, lines)] + ["t"]
        assert table_rows(h.snapshots[-1]) == lines + 1 == len(tables.z)
        ids = h.snapshots[-1].tables["s"]
        for logical, physical, _ in ids:                      # each entry in row logical // C, column logical % C
            r, c = divmod(logical, TABLE_COLS)
            assert tables.text[r][c] == str(physical) and f"logical {logical} → physical {physical}" in tables.customdata[r][c]
        assert sum(1 for row in tables.text[:lines] for x in row if x) == n_blocks
        cols = min(n_blocks, TABLE_COLS)
        assert list(fig.layout.xaxis2.tickvals) == list(range(cols)) and fig.layout.xaxis2.range[1] == cols - 0.5
        # columns of a wrapped table are offsets from the row's start: row "s +5", column "+3" = logical 8
        assert list(fig.layout.xaxis2.ticktext) == [("+" if n_blocks > TABLE_COLS else "") + str(c) for c in range(cols)]


def test_block_table_ids_fit_their_cells_on_a_phone():
    """The session figure of chapter 5 (24 blocks of 8, two-digit ids, an 18-entry table): at 400 px
    each id at the table's font must fit its cell's width, and a row must be as tall as a pool row."""
    from paged_kv.viz.blocks import TEXT_SIZE

    h = BlockHistory(BlockSpaceManager(24, 8))
    h.allocate("1", 30)
    h.allocate("2", 8 * 18 - 3)
    fig = blocks_figure(h.snapshots, title="A recorded session: 24 blocks of 8 slots")
    tables = next(t for t in fig.data if t.name == "block tables")
    m, xa = fig.layout.margin, fig.layout.xaxis2
    for width in (PHONE_PX, 688):
        cell_w = (width - m.l - m.r) * (xa.domain[1] - xa.domain[0]) / (xa.range[1] - xa.range[0])
        longest = max(len(x) for row in tables.text for x in row)
        assert longest == 2
        assert longest * TEXT_SIZE * EM_PER_CHAR <= cell_w - tables.xgap, (width, cell_w)


# ---- fitting a phone-wide page: the 400-px page's column holds a 368-px figure ---------------
PHONE_PX = 368
EM_PER_CHAR = 0.65        # plotly's own estimate of a character's width when it fits heatmap text
LINE = 1.3                # and of a line's height (plotly's LINE_SPACING)


def _pool_px(fig, width: int) -> tuple[float, float]:
    """(width, height) in px of one cell of the pool heatmap when the figure is ``width`` px wide,
    from the layout alone (margins, the pool axis' domain and range), as plotly places them."""
    m, xa, ya = fig.layout.margin, fig.layout.xaxis, fig.layout.yaxis
    plot_w, plot_h = width - m.l - m.r, fig.layout.height - m.t - m.b
    pool = next(t for t in fig.data if t.name == "pool")
    cell_w = plot_w * (xa.domain[1] - xa.domain[0]) / (xa.range[1] - xa.range[0])
    return cell_w, plot_h * (ya.domain[1] - ya.domain[0]) / len(pool.z)


def _slot_font(fig, width: int) -> float:
    """The px of the slots' text at ``width``: the fixed size, or the size plotly picks when none is
    set (the longest label fitted into one cell, at most 12 px), computed as plotly does."""
    pool = next(t for t in fig.data if t.name == "pool")
    longest = max(len(t) for row in pool.text for t in row)
    cell_w, cell_h = _pool_px(fig, width)
    if pool.textfont.size is not None:
        return pool.textfont.size
    return min((cell_w - pool.xgap) / longest / (EM_PER_CHAR), (cell_h - pool.ygap) / LINE, 12)


def _sampling_figures():
    from paged_kv.blocks import paper_beam_trace, paper_sampling_trace

    chars = BlockHistory(BlockSpaceManager(num_blocks=12, block_size=4))
    chars.allocate(0, list("ROMEO:\nShall I"))
    return {"Figure 8 (words)": (paper_sampling_trace(), 430), "Figure 9 (numbers)": (paper_beam_trace(), 560),
            "characters": (chars, 480), "Figures 6-7": (paper_trace(), 470)}


@pytest.mark.parametrize("name", list(_sampling_figures()))
def test_every_slot_label_fits_its_slot_on_a_phone(name):
    """At 400 px the words of Fig. 8 were wider than their slots and lost their ends ("mother",
    "ather", "sever"): the longest label must fit one slot at a size still readable (>= 8 px), and
    at 1280 px (a 688-px figure) stay as large as before (>= 10 px)."""
    history, height = _sampling_figures()[name]
    fig = blocks_figure(history.snapshots, title="a title", height=height)
    pool = next(t for t in fig.data if t.name == "pool")
    longest = max(len(t) for row in pool.text for t in row)
    for width, smallest in ((PHONE_PX, 8), (688, 10)):
        size = _slot_font(fig, width)
        cell_w = _pool_px(fig, width)[0]
        assert size >= smallest, f"{name} at {width} px: slot text {size:.1f} px"
        assert longest * size * EM_PER_CHAR <= cell_w - pool.xgap + 0.5, \
            f"{name} at {width} px: a {longest}-character label of {size} px is wider than its {cell_w:.0f}-px slot"


def test_block_labels_sit_in_the_margin_inside_the_range():
    """The first column's "id ×ref count" labels are drawn in the left margin (fixed px, so the slots
    get the panel's width); their anchors must stay inside the axis range, or plotly hides them."""
    from paged_kv.viz.blocks import label_margin

    for nb in (9, 24, 60):
        h = BlockHistory(BlockSpaceManager(num_blocks=nb, block_size=4))
        h.allocate("s", 5)
        fig = blocks_figure(h.snapshots)
        labels = next(t for t in fig.data if t.name == "block labels")
        lo, hi = fig.layout.xaxis.range
        assert all(lo < x < hi for x in labels.x), (nb, lo, min(labels.x))
        first_slot = min(block_cells(b, nb, 4)[0] for b in range(nb))
        assert first_slot - lo < 0.6                      # no empty label cells left of the first slot
        assert fig.layout.margin.l == label_margin(nb) >= 10 + 7 * (len(str(nb - 1)) + 3)


def test_a_long_title_wraps_and_the_top_margin_grows_with_it():
    from paged_kv.viz.blocks import TITLE_CHARS

    snaps = paper_trace().snapshots
    long = "The vLLM paper's Figure 8, replayed by our block manager"
    short, wrapped = blocks_figure(snaps, title="Figures 6-7"), blocks_figure(snaps, title=long)
    lines = wrapped.layout.title.text.split("<br>")
    assert lines[0] + " " + lines[1] == long and all(len(x) <= TITLE_CHARS for x in lines[:2])
    assert wrapped.layout.margin.t > short.layout.margin.t
    for frame in wrapped.frames:                         # the replayed steps keep the wrapped heading
        assert frame.layout.title.text.startswith("<br>".join(lines[:2]) + "<br>")


def test_the_top_margin_holds_the_tallest_caption():
    """Chapter 6's key has three lines more than the default: the title's margin grows with the
    caption's lines, so the last line never runs into the panels' titles (at a fixed 140 px a
    six-line caption did)."""
    from paged_kv.blocks import BlockHistory, BlockSpaceManager
    from paged_kv.viz.blocks import CAPTION_LINE_PX
    from paged_kv.viz.sharing import SHARING_KEY, sharing_figure

    h = BlockHistory(BlockSpaceManager(16, 4))
    h.allocate(0, 6)
    h.fork(0, 1)
    fig = sharing_figure(h.snapshots, replay=False)
    lines = fig.layout.title.text.count("<br>") + 1
    assert SHARING_KEY.count("<br>") == 2 and lines >= 6
    assert fig.layout.margin.t >= 20 + CAPTION_LINE_PX * lines + 20      # the title line, the captions, a gap
