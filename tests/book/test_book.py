"""The book builds strictly and its pages carry what a reader needs."""

import re

import pytest
import yaml

from conftest import ROOT, toc_files

pytestmark = pytest.mark.book


def _page(built_book, src):
    return (built_book / f"{src}.html").read_text()


def test_every_toc_page_is_built(built_book):
    for src in toc_files():
        assert (built_book / f"{src}.html").is_file(), src


def test_pages_have_executed_outputs_and_no_errors(built_book):
    for src in toc_files():
        html = _page(built_book, src)
        assert "cell_output" in html, f"{src}: no cell outputs (not executed?)"
        for bad in ("Traceback (most recent call last)", 'class="output traceback"', 'class="output stderr"'):
            assert bad not in html, f"{src}: {bad!r} in the page"


def test_chapters_have_plotly_figures_served_locally(built_book):
    assert (built_book / "_static" / "plotly.min.js").is_file()
    for src in toc_files()[1:]:
        html = _page(built_book, src)
        assert "plotly-graph-div" in html, f"{src}: no plotly figure"
        assert '_static/plotly.min.js' in html
        # plotly.js is loaded once from _static, never embedded into the page or taken from a CDN
        assert html.count("Plotly.newPlot") >= 1
        assert len(html) < 8_000_000, f"{src}: page is {len(html):,} bytes"
        assert "cdn.plot.ly" not in html


def test_every_page_has_the_book_css_and_a_theme_mode(built_book):
    """_assets/paged_kv.css (code wraps, tables fit: see tests/book/test_layout.py) reaches every
    page, and the theme's mode script has a default (empty, it logged a console error)."""
    assert (built_book / "_static" / "paged_kv.css").is_file()
    for src in toc_files():
        html = _page(built_book, src)
        assert re.search(r'<link[^>]+href="[^"]*_static/paged_kv\.css', html), f"{src}: no paged_kv.css"
        assert 'localStorage.getItem("mode") || ""' not in html, f"{src}: theme mode without a default"


def test_no_script_comes_from_another_host(built_book):
    for src in toc_files():
        srcs = re.findall(r'<script[^>]+src="([^"]+)"', _page(built_book, src))
        remote = [s for s in srcs if s.startswith(("http:", "https:", "//"))]
        assert not remote, f"{src}: scripts from other hosts {remote}"


def test_colab_links_point_at_notebooks_that_exist(built_book):
    cfg = yaml.safe_load((ROOT / "_config.yml").read_text())
    repo = cfg["repository"]["url"].removeprefix("https://github.com/")
    for src in toc_files()[1:]:
        # links only (href): a page may also show the URL pattern inside highlighted code
        links = set(re.findall(r'href="(https://colab\.research\.google\.com/github/[^"]+)"', _page(built_book, src)))
        assert links, f"{src}: no Colab launch button"
        for link in links:
            prefix = f"https://colab.research.google.com/github/{repo}/blob/{cfg['repository']['branch']}/"
            assert link.startswith(prefix), link
            path = link.removeprefix(prefix)
            assert path.endswith(".ipynb") and (ROOT / path).is_file(), f"{link} -> missing {path}"
