"""The chapters' live-panel sections against the panels they describe: each live chapter says in
one line what differs in the browser (and what it says matches the panel model), chapter 4 says
plainly that its panel has no live mode, and the figure under "Run live" is the first state of
the Jupyter panel built with the same knobs."""

import ast
import re

import pytest
from conftest import ROOT

from paged_kv.panels import figure_json, registry, step
from paged_kv.panels.prefix_cache import PrefixCachePanel
from paged_kv.panels.serving import ServingPanel

BOOK = ROOT / "book"
DIFFERS = "**What differs in the browser:**"


def prose(text: str) -> str:
    """The chapter without its code cells, line breaks as spaces."""
    return " ".join(re.sub(r"```\{code-cell\}.*?```", " ", text, flags=re.S).split())


def live_chapters() -> dict[str, str]:
    """{chapter stem: the registry name its show_live(..., live=...) call runs}."""
    out = {}
    for p in sorted(BOOK.glob("*.md")):
        m = re.search(r"^[^#\n]*show_live\((?:.|\n)*?live=\"(\w+)\"", p.read_text(), re.M)
        if m:
            out[p.stem] = m.group(1)
    return out


def differs_line(stem: str) -> str:
    """The chapter's "what differs in the browser" sentence(s), from the marker to the next code cell
    (in prose, or in the ``say`` of a remove-input cell)."""
    text = (BOOK / f"{stem}.md").read_text()
    assert text.count("What differs in the browser:") == 1, stem
    start = text.index("What differs in the browser:")
    return " ".join(text[start:text.index("```", start)].split())


def test_every_live_chapter_says_once_what_differs_in_the_browser():
    chapters = live_chapters()
    assert set(chapters.values()) >= {"calculator", "block_pool", "fork", "serving", "prefix_cache"}
    for stem, panel in chapters.items():
        line = differs_line(stem)
        if panel == "calculator":
            continue                                   # computed in the chapter from the panel's controls
        assert "no model runs there (no torch)" in line, stem
        assert "greedy continuations recorded when the book was built" in line, stem
        assert "offer" in line, stem                  # ... for the prompts the dropdown offers


@pytest.mark.parametrize("panel_cls", [ServingPanel, PrefixCachePanel])
def test_the_engine_chapters_name_the_timing_model_their_panel_runs(panel_cls):
    stem = next(s for s, p in live_chapters().items() if p == panel_cls.name)
    line = differs_line(stem)
    timing = panel_cls().timing
    assert "timing model" in line and timing.model in line and timing.gpu.split("-")[0] in line, (stem, line)


def test_chapter_4_says_plainly_its_panel_does_not_run_in_the_browser():
    text = prose((BOOK / "04_fragmentation.md").read_text())
    assert "In the HTML book this panel does not run:" in text
    assert 'no "Run live" button' in text and "numpy" in text and "online or offline" in text
    assert "strip_panel" not in registry.PANELS and "fragmentation" not in registry.PANELS


def knobs_of(stem: str) -> dict:
    """The ``live_knobs = dict(...)`` the chapter's show_live call gives both fronts."""
    text = (BOOK / f"{stem}.md").read_text()
    call = re.search(r"^live_knobs = (dict\(.*?\))", text, re.M)
    assert call, stem
    node = ast.parse(call.group(1), mode="eval").body
    return {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}


@pytest.mark.parametrize("stem, sharing", [("05_paged_attention", False), ("06_copy_on_write", True)])
def test_the_figure_under_run_live_is_the_jupyter_panels_first_state(stem, sharing, monkeypatch):
    """Chapters 5 and 6 give one dict of knobs to the Jupyter panel and to the page's panel model:
    the static figure under "Run live" (the panel model's first state) is the Jupyter panel's."""
    pytest.importorskip("ipywidgets")
    from paged_kv.widgets import blocks as wblocks
    from paged_kv.widgets import panel as wpanel

    text = (BOOK / f"{stem}.md").read_text()
    assert re.search(r"block_panel\([^)]*\*\*live_knobs", text) and "live_args=live_knobs" in text, stem
    knobs = knobs_of(stem)
    monkeypatch.setattr(wpanel, "display", lambda *a, **k: None)
    monkeypatch.setattr(wblocks, "display", lambda *a, **k: None, raising=False)
    jupyter = wblocks.block_panel(load_model=False, use_figure_widget=False, sharing=sharing, **knobs).panel_model
    page = registry.create(live_chapters()[stem], knobs)
    first = [figure_json(step(m, m.initial(), None).figure) for m in (jupyter, page)]
    assert first[0] == first[1]
    assert (jupyter.num_blocks, jupyter.block_size) == (page.num_blocks, page.block_size) == \
        (knobs["num_blocks"], knobs["block_size"])
