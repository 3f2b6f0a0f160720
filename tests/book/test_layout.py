"""The book's own layout rules (_assets/paged_kv.css) are configured and say what they must; read
from the sources, no build needed.  The built pages are measured in Chromium by
tests/book/test_browser.py (code that scrolls sideways, tables wider than the column)."""

import re
from pathlib import Path

import yaml

from conftest import ROOT

CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())["sphinx"]["config"]


def _rules(css: str) -> dict[str, dict[str, str]]:
    """``{selector: {property: value}}`` of a stylesheet (comments dropped; a rule with several
    selectors is listed under each; rules inside ``@media`` or ``@supports`` are keyed
    ``"@media …|selector"``)."""
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    out: dict[str, dict[str, str]] = {}

    def parse(block: str, prefix: str = "") -> None:
        i = 0
        while True:
            m = re.compile(r"([^{}]+)\{").search(block, i)
            if not m:
                return
            head, depth, j = m.group(1).strip(), 1, m.end()
            while depth:                           # the matching brace
                depth += {"{": 1, "}": -1}.get(block[j], 0)
                j += 1
            body = block[m.end():j - 1]
            if head.startswith("@"):               # @media, @supports: the rules inside
                parse(body, head + "|")
            else:
                props = dict((k.strip(), v.strip()) for k, v in
                             (d.split(":", 1) for d in body.split(";") if ":" in d))
                for sel in head.split(","):
                    out.setdefault(prefix + " ".join(sel.split()), {}).update(props)
            i = j

    parse(css)
    return out


def _css() -> dict[str, dict[str, str]]:
    files = CONFIG["html_css_files"]
    assert files == ["paged_kv.css"], files
    (static,) = CONFIG["html_static_path"]
    path = ROOT / static / files[0]
    assert path.is_file(), f"{path} is listed in html_css_files but missing"
    return _rules(path.read_text())


def test_code_wraps_instead_of_scrolling_sideways():
    rule = _css()[".bd-article pre"]
    assert rule["white-space"] == "pre-wrap"       # wraps, and keeps every space and line break
    assert rule["overflow-wrap"] == "anywhere"     # a run without spaces breaks too


def _phone(rules):
    return {k.split("|", 1)[1]: v for k, v in rules.items() if k.startswith("@media") and "max-width: 576px" in k}


def test_inline_code_in_tables_may_wrap():
    """Sphinx wraps inline code in <span class="pre">, which its basic.css sets to nowrap: the rule
    must reach that span, or a long flag still fixes the width of its column.  On a phone an
    identifier may break anywhere (break-word does not lower a column's minimum width; anywhere
    does)."""
    rules, phone = _css(), _phone(_css())
    for sel in (".bd-article table code", ".bd-article table code span.pre"):
        assert rules[sel]["white-space"] == "normal", sel
        assert rules[sel]["overflow-wrap"] == "break-word", sel
        assert phone[sel]["overflow-wrap"] == "anywhere", sel


def test_tables_are_denser_than_the_text_and_more_so_on_a_phone():
    rules = _css()
    size = float(rules[".bd-article table"]["font-size"].removesuffix("em"))
    on_phone = float(_phone(rules)[".bd-article table"]["font-size"].removesuffix("em"))
    assert on_phone < size < 1


def test_a_table_that_scrolls_shows_its_scroll_bar():
    rules = _css()
    box = ".bd-article .pst-scrollable-table-container"
    assert rules[box + "::-webkit-scrollbar"]["height"].endswith("px")
    assert "background" in rules[box + "::-webkit-scrollbar-thumb"]


def test_theme_mode_has_a_default():
    """pydata-sphinx-theme's head script falls back to html_context's default_mode; empty, the page
    logged "Got invalid theme mode" as a console error on every first visit."""
    assert CONFIG["html_context"]["default_mode"] in ("auto", "light", "dark")


def test_one_page_builds_find_the_static_folder():
    """A page built alone has book/ as its source folder: the extension points html_static_path
    at the repository's _assets/ (else the page has no CSS and -W fails on a warning)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("offline_assets", ROOT / "book" / "_ext" / "offline_assets.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    class Cfg:
        html_static_path = ["_assets"]
        mathjax_path = None

    class App:
        confdir = srcdir = str(ROOT / "book")

    cfg = Cfg()
    mod._config_inited(App(), cfg)
    assert cfg.html_static_path == [str(ROOT / "_assets")]
    App.confdir = App.srcdir = str(ROOT)         # the whole book: left as it is
    cfg = Cfg()
    mod._config_inited(App(), cfg)
    assert cfg.html_static_path == ["_assets"]


def _code_lines():
    import importlib.util

    spec = importlib.util.spec_from_file_location("code_lines", ROOT / "book" / "_ext" / "code_lines.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


SOURCE = '''def f(x):
    """a docstring
       over two lines"""

    if x < 1:  # a comment with  two spaces
        return {"a": [1, 2],
                "b": '<&>'}
\treturn x
'''


def test_every_code_line_is_a_box_that_knows_its_indentation():
    """book/_ext/code_lines.py: each non-blank line in <span class="line" style="--indent:N">,
    N its leading spaces counted from the source (a multi-line string's lines too), the text
    unchanged, blank lines bare newlines."""
    import html as html_lib

    from pygments import highlight
    from pygments.lexers import PythonLexer

    mod = _code_lines()
    out = highlight(SOURCE, PythonLexer(), mod.LineFormatter())
    body = re.search(r"<pre><span></span>(.*)</pre>", out, re.S).group(1)
    assert html_lib.unescape(re.sub(r"<[^>]*>", "", body)) == SOURCE        # the same characters, in order
    got = body.split("\n")[:-1]
    for src, line in zip(SOURCE.split("\n"), got):
        if src.strip():
            m = re.fullmatch(r'<span class="line" style="--indent:(\d+)">(.*)</span>', line)
            assert m, line
            assert int(m.group(1)) == len(src) - len(src.lstrip(" ")), (src, line)
        else:
            assert line == "", line                                         # a blank line stays bare
    assert len(got) == SOURCE.count("\n")


def test_the_book_highlights_with_the_line_formatter():
    assert CONFIG and "code_lines" in yaml.safe_load((ROOT / "_config.yml").read_text())["sphinx"]["local_extensions"]
    mod = _code_lines()

    class Bridge:
        dest, formatter = "html", None

    class Builder:
        format, highlighter = "html", Bridge()

    class App:
        builder = Builder()

    mod._builder_inited(App())
    assert App.builder.highlighter.formatter is mod.LineFormatter


def test_a_wrapped_code_line_hangs_under_its_own_indentation():
    rules, phone = _css(), _phone(_css())
    line = rules[".bd-article pre span.line"]
    assert line["display"] == "inline-block"           # not block: innerText (the copy button) adds no breaks
    assert line["width"] == "100%" and line["box-sizing"] == "border-box"
    assert "var(--indent" in line["--hang"] and "var(--hang-max)" in line["--hang"]
    assert line["padding-left"] == "var(--hang)" and line["text-indent"] == "calc(-1 * var(--hang))"
    desk = float(rules[".bd-article pre"]["--hang-max"].removesuffix("ch"))
    assert float(phone[".bd-article pre"]["--hang-max"].removesuffix("ch")) < desk


def test_the_mode_bar_has_a_strip_of_its_own_above_each_figure():
    rules = _css()
    gap = rules[".bd-article .js-plotly-plot"]["margin-top"]
    assert rules[".bd-article .js-plotly-plot .modebar-container"]["top"] == f"-{gap} !important"


def test_display_math_scrolls_in_its_own_box():
    rule = _css()['.bd-article mjx-container[display="true"]']
    assert rule["overflow-x"] == "auto" and rule["max-width"] == "100%"
