"""Token text in figures: whitespace is drawn visibly (␣, ⏎), by one function every figure uses."""

import re
import unicodedata
from pathlib import Path

import pytest

import paged_kv.viz as viz_pkg
from paged_kv.blocks import BlockHistory, BlockSpaceManager
from paged_kv.errors import ConfigError
from paged_kv.viz.blocks import blocks_figure
from paged_kv.viz.labels import NEWLINE, SPACE, TAB, visible_token
from paged_kv.viz.logical_view import logical_view_figure
from paged_kv.viz.prefix_cache import radix_vs_blocks_figure
from paged_kv.viz.sharing import sharing_figure


def _invisible(ch: str) -> bool:
    """A character that draws as nothing, or as a blank: whitespace, controls, format chars."""
    return ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf", "Zs", "Zl", "Zp")


def test_every_blank_character_gets_a_sign_and_every_other_is_kept():
    """Brute force over the first 0x3100 code points (ASCII, Latin, the spaces of U+2000-U+200A,
    the line and paragraph separators, the ideographic space U+3000)."""
    changed = 0
    for code in range(0x3100):
        ch = chr(code)
        out = visible_token(ch)
        assert len(out) == 1, (hex(code), out)
        if ch.isspace() or unicodedata.category(ch) == "Cc":
            assert not _invisible(out), f"U+{code:04X} is drawn as {out!r}, still blank"
            changed += 1
        else:
            assert out == ch, f"U+{code:04X} {ch!r} was changed to {out!r}"
    assert changed > 40                          # the C0 controls, DEL, C1 controls, the spaces


def test_the_signs_readers_expect():
    assert visible_token(" ") == SPACE == "␣"
    assert visible_token("\n") == NEWLINE == "⏎"
    assert visible_token("\t") == TAB
    assert visible_token("\r") == "␍"              # its Unicode control picture
    assert visible_token("\u2028") == NEWLINE and visible_token("\u00a0") == SPACE
    assert visible_token("a b\nc") == "a␣b⏎c"   # inside a word too, character by character
    assert visible_token("") == ""               # a slot whose token has no label stays empty
    assert visible_token("fathers") == "fathers"


@pytest.mark.parametrize("bad", [None, 3, b" ", [" "]])
def test_a_label_that_is_not_text_is_refused_by_name(bad):
    with pytest.raises(ConfigError, match=type(bad).__name__):
        visible_token(bad)


def _history():
    h = BlockHistory(BlockSpaceManager(num_blocks=6, block_size=4))
    h.allocate("a", list("to be\nor"))
    h.fork("a", "b")
    h.append("a", " ")
    h.append("b", "\n")
    return h


def _pool_texts(fig) -> list[str]:
    pool = next(t for t in fig.data if t.name == "pool")
    return [x for row in pool.text for x in row]


@pytest.mark.parametrize("make", [blocks_figure, sharing_figure])
def test_pool_figures_show_spaces_and_newlines(make):
    h = _history()
    fig = make(h.snapshots)
    texts = _pool_texts(fig)
    # the prompt's space and newline, a's appended space, b's appended newline
    assert texts.count(SPACE) == 2 and texts.count(NEWLINE) == 2, texts
    assert not any(t and all(_invisible(c) for c in t) for t in texts)
    for frame in fig.frames:                     # every replayed step, not just the one shown
        pool = next(d for d in frame.data if d.name == "pool")
        assert not any(t and all(_invisible(c) for c in t) for row in pool.text for t in row)


def test_a_filled_slot_never_has_a_blank_label():
    """Every slot that stores a labelled token shows a visible label (the review saw blank,
    full-colour slots in the three-sample figure)."""
    h = _history()
    snap = h.snapshots[-1]
    fig = blocks_figure(h.snapshots)
    pool = next(t for t in fig.data if t.name == "pool")
    full = [(z, t) for zr, tr in zip(pool.z, pool.text) for z, t in zip(zr, tr)
            if z is not None and z > 0 and z % 2 == 1]          # odd z: a stored token (see _colorscale)
    assert len(full) == sum(b.filled for b in snap.blocks if b.ref_count)
    assert all(t.strip() and t == visible_token(t) for _, t in full), full


def test_logical_view_and_radix_figure_show_spaces():
    h = _history()
    words = logical_view_figure(h.snapshots).data[0].text
    assert SPACE in words and NEWLINE in words
    fig = radix_vs_blocks_figure(["SYS: be brief. Q: hi", "SYS: be kind. Q: hi"], 4)
    notes = [a.text for a in fig.layout.annotations if a.font.family == "monospace"]   # the token runs
    assert len(notes) > 6 and any(SPACE in n for n in notes), notes
    assert not any(" " in n or "·" in n for n in notes), notes


def test_visible_token_is_the_one_home():
    """No figure module makes whitespace visible its own way (``.replace(" ", ...)`` or its own sign)."""
    figures = 0
    for path in Path(viz_pkg.__file__).parent.glob("*.py"):
        src = path.read_text()
        if path.name == "labels.py" or "import plotly" not in src:   # figure modules only
            continue
        figures += 1
        assert not re.search(r"""\.replace\(\s*["'](?: |\\n)["']""", src), f"{path.name} replaces whitespace itself"
        for sign in (SPACE, NEWLINE, TAB, "·"):       # a sign as a string of its own (docs may name it)
            assert f'"{sign}"' not in src and f"'{sign}'" not in src, f"{path.name} writes {sign} itself"
    assert figures >= 10


# --- titles and log ticks (viz.labels.wrap_title, log_ticks) --------------------------------------
from paged_kv.viz.labels import TITLE_CHARS, log_ticks, wrap_title  # noqa: E402


@pytest.mark.parametrize("text", [
    "Preemption cost of 512 tokens, OPT-13B on an A100 (timing model)",
    "short", "",
    "Share of requests within the SLO<br>(TTFT ≤ 0.25 s and TPOT ≤ 0.1 s) measured on a long line of words",
    "averyveryveryveryveryveryveryveryveryveryverylongword and more words after it"])
def test_a_title_is_broken_at_spaces_into_lines_that_fit_a_phone(text):
    out = wrap_title(text)
    lines = out.split("<br>")
    # nothing lost: the same words, broken only at spaces or at the breaks already there
    assert [w for part in text.split("<br>") for w in part.split(" ")] == [w for ln in lines for w in ln.split(" ")]
    for line in lines:
        assert len(line) <= TITLE_CHARS or " " not in line      # a word too long for a line keeps one alone
    # greedy, within each line the caller gave: no line could have taken the next line's first word
    for part in text.split("<br>"):
        own = wrap_title(part).split("<br>")
        assert "<br>".join(own) in out
        for a, b in zip(own, own[1:]):
            assert len(a) + 1 + len(b.split(" ")[0]) > TITLE_CHARS


def _brute_log_ticks(lo, hi, mantissas):
    """Every m·10^e in a wide window, then the run from the last one <= lo to the first one >= hi."""
    grid = sorted(m * 10.0 ** e for e in range(-12, 13) for m in mantissas)
    start = max(i for i, t in enumerate(grid) if t <= lo * (1 + 1e-9))
    end = min(i for i, t in enumerate(grid) if t >= hi * (1 - 1e-9))
    return grid[start:end + 1]


@pytest.mark.parametrize("values", [[33.9, 851.0], [1, 2], [100], [0.004, 3e5], [0.3, 0.31], [7, 7000, 20],
                                    [9.99, 10.01], [1e-6, 1e6]])
def test_log_ticks_are_1_2_5_per_decade_and_every_one_is_labelled(values):
    vals, texts = log_ticks(values)
    lo, hi = min(values), max(values)
    expected = _brute_log_ticks(lo, hi, (1, 2, 5))
    if len(expected) > 12:
        expected = _brute_log_ticks(lo, hi, (1,))
    assert vals == pytest.approx(expected, rel=1e-12)
    assert vals[0] <= lo * (1 + 1e-9) and vals[-1] >= hi * (1 - 1e-9)     # both ends carry a number
    assert len(texts) == len(vals) and all(texts)
    assert [float(t.replace(",", "")) for t in texts] == pytest.approx(vals, rel=1e-12)   # each says its value


@pytest.mark.parametrize("bad", [[], [0, -1], [float("nan")]])
def test_log_ticks_refuse_data_with_nothing_to_show(bad):
    with pytest.raises(ConfigError, match="value > 0"):
        log_ticks(bad)
