"""The paper's logical view of Figures 6-7: words in logical blocks, the block table with
"# filled", an arrow from every logical block to its physical block, rows only while a request exists."""

import pytest

from paged_kv.blocks import BlockHistory, BlockSpaceManager, paper_trace
from paged_kv.errors import ConfigError
from paged_kv.viz.blocks import seq_order
from paged_kv.viz.logical_view import logical_view_figure, logical_view_parts


def test_figure_7_state_has_the_papers_tables_and_arrows():
    h = paper_trace()
    parts = logical_view_parts(h.snapshots[-1], seq_order(h.snapshots))
    # arrows end at the physical blocks of A (7, 1, 3) and B (5, 2), in table order
    assert [a[3] for a in parts["arrows"]] == [7.0, 1.0, 3.0, 5.0, 2.0]
    table = [c[3] for c in parts["cells"] if c[2] == "white"]          # (physical, # filled) pairs
    assert table == ["7", "4", "1", "4", "3", "1", "5", "4", "2", "2"]
    words = [c[3] for c in parts["cells"] if c[3] and c[2] != "white"]
    assert words[:9] == "Four score and seven years ago our fathers brought".split()


def test_a_finished_request_has_no_rows():
    h = BlockHistory(BlockSpaceManager(4, 2))
    h.allocate("A", ["a", "b", "c"])
    h.allocate("B", ["d"])
    h.free("A")
    parts = logical_view_parts(h.snapshots[-1], seq_order(h.snapshots))
    assert len(parts["arrows"]) == 1 and not any("request A" in lab[2] for lab in parts["labels"])
    fig = logical_view_figure(h.snapshots)
    assert len(fig.frames) == 4 and len(fig.frames[2].layout.annotations) == 3   # A: 2 arrows, B: 1
    assert len(fig.frames[3].layout.annotations) == 1


def test_no_snapshots_is_refused():
    with pytest.raises(ConfigError, match="no snapshots"):
        logical_view_figure([])


def test_labels_stay_off_the_cells_and_words_are_readable():
    """The pool's "block N" labels start right of the last slot (not centred on it), row numbers end
    left of the first, and words on a full colour are white (dark on the pale and free cells)."""
    h = paper_trace()
    fig = logical_view_figure(h.snapshots)
    words, labels = fig.data
    bs = h.snapshots[-1].block_size
    last_slot = max(x for x, t in zip(labels.x, labels.text) if t == "block 0") + 0.45 - 1
    for x, text, pos in zip(labels.x, labels.text, labels.textposition):
        if text.startswith("block ") and text[6:].isdigit():
            assert pos == "middle right" and x > last_slot + 0.4
        if text.isdigit():
            assert pos == "middle left" and x <= -0.5
    parts = logical_view_parts(h.snapshots[-1], seq_order(h.snapshots))
    centres = [b + w / 2 for b, w in zip(words.base, words.x)]          # a word's bar spans its cell
    ink = dict(zip(zip(centres, words.y), words.textfont.color))

    def luminance(hex_colour):                       # relative luminance, 0 (black) .. 1 (white)
        r, g, b = (int(hex_colour.lstrip("#")[i:i + 2], 16) / 255 for i in (0, 2, 4))
        return 0.2126 * r + 0.7152 * g + 0.0722 * b

    checked = 0
    for x, y, fill, text in parts["cells"]:
        if text and fill != "white":
            assert ink[(x, y)] == ("white" if luminance(fill) < 0.6 else "#222"), (text, fill)
            checked += 1
    assert checked == 2 * 15 and bs == 4             # A's 9 and B's 6 words, in logical and pool


def test_each_word_is_fitted_into_its_own_cell():
    """At 400 px a fixed 10-px word overran its 20-px slot (review shot 15): each word is now the
    inside text of a bar exactly over its cell (plotly shrinks such text to fit the bar), long
    words on two lines, and every word is drawn once, unchanged but for the line break."""
    from paged_kv.viz.logical_view import CELL_H, CELL_W, LINE_CHARS, slot_word

    h = paper_trace()
    fig = logical_view_figure(h.snapshots)
    words = fig.data[0]
    assert words.type == "bar" and words.orientation == "h" and words.textposition == "inside"
    assert words.width == CELL_H and set(words.x) == {CELL_W}
    parts = logical_view_parts(h.snapshots[-1], seq_order(h.snapshots))
    cells = [(x, y, t) for x, y, _, t in parts["cells"] if t]
    assert [(b + CELL_W / 2, y) for b, y in zip(words.base, words.y)] == [(x, y) for x, y, _ in cells]
    for (_, _, t), drawn in zip(cells, words.text):
        assert drawn.replace("<br>", "") == t
        assert all(len(line) <= max(LINE_CHARS, -(-len(t) // 2)) for line in drawn.split("<br>"))
    assert slot_word("brought") == "brou<br>ght" and slot_word("Four") == "Four"
    for frame in fig.frames:                               # every step draws its words the same way
        assert frame.data[0].type == "bar"


def test_a_forked_sequences_shared_blocks_show_their_tokens():
    """A fork shares its parent's blocks: the child's logical blocks show the same words in the
    same slots as the parent's, the shared tail included; after the child's copy-on-write write,
    its copy shows the parent's words and its own new one."""
    h = BlockHistory(BlockSpaceManager(6, 4))
    h.allocate("A", list("To be, "))                    # 7 tokens: one full block and 3 of 4
    h.fork("A", "A.1")
    parts = logical_view_parts(h.snapshots[-1], seq_order(h.snapshots))

    def rows(parts, seq):
        """The words of ``seq``'s logical slots, row by row (the logical column is x 0 .. BS-1)."""
        heads = sorted((lab[1], lab[2]) for lab in parts["labels"] if "logical blocks" in lab[2])
        y0 = next(y for y, text in heads if f"request {seq}</b>" in text)
        y1 = next((y for y, _ in heads if y > y0), float("inf"))
        got = {}
        for x, y, _, text in parts["cells"]:
            if y0 < y < y1 and 0 <= x < 4:
                got.setdefault(y, [""] * 4)[int(x)] = text
        return [got[y] for y in sorted(got)]

    want = [["T", "o", "␣", "b"], ["e", ",", "␣", ""]]
    assert rows(parts, "A") == want
    assert rows(parts, "A.1") == want
    h.append("A.1", "x")                                # copy-on-write of the shared tail
    parts = logical_view_parts(h.snapshots[-1], seq_order(h.snapshots))
    assert rows(parts, "A.1") == [["T", "o", "␣", "b"], ["e", ",", "␣", "x"]]
    assert rows(parts, "A") == want
