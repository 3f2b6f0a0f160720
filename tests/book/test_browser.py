"""Open the built book in headless Chromium (Debian's package) and check the figures render.

Every request to a host other than 127.0.0.1 is blocked and recorded, so the pages must work
offline. Screenshots go to tests/_artifacts/ for a person to look at.
"""

from pathlib import Path
from urllib.parse import urlparse

import pytest

from browser_support import CHROMIUM, launch_browser, serve
from conftest import ROOT, toc_files

pytestmark = pytest.mark.browser

ARTIFACTS = ROOT / "tests" / "_artifacts"

if CHROMIUM is None:
    pytest.skip("browser test skipped: Debian's Chromium is not installed (apt-get install "
                "chromium; .ci/run installs it)", allow_module_level=True)
playwright = pytest.importorskip("playwright.sync_api", reason="browser test skipped: playwright is not installed")


@pytest.fixture(scope="module")
def server(built_book):
    httpd, url = serve(built_book)
    yield url
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    yield from launch_browser(playwright)


def open_page(browser, url, width=1280):
    """A page that blocks other hosts and records JavaScript errors, console errors and blocked
    requests."""
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.errors, page.blocked, page.console_errors = [], [], []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.on("console", lambda m: page.console_errors.append(m.text) if m.type == "error" else None)

    def route(r):
        host = urlparse(r.request.url).hostname
        if host in ("127.0.0.1", None):
            return r.continue_()
        page.blocked.append(r.request.url)
        return r.abort()

    page.route("**/*", route)
    page.goto(url, wait_until="load")
    return page


@pytest.mark.parametrize("src", toc_files()[1:])
def test_chapter_figures_render_offline(server, browser, src):
    page = open_page(browser, f"{server}/{src}.html")
    page.wait_for_selector(".plotly-graph-div .main-svg", timeout=30_000)
    n = page.evaluate("document.querySelectorAll('.plotly-graph-div').length")
    drawn = page.evaluate("Array.from(document.querySelectorAll('.plotly-graph-div')).filter(d => d._fullLayout).length")
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator(".plotly-graph-div").first.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / f"{Path(src).name}.png"))
    assert page.errors == [], f"JavaScript errors on {src}: {page.errors}"
    # e.g. pydata-sphinx-theme's "Got invalid theme mode" (see html_context in _config.yml)
    assert page.console_errors == [], f"console errors on {src}: {page.console_errors}"
    assert n >= 1 and drawn == n, f"{src}: {drawn} of {n} figures drawn"
    page.close()


def test_sliders_change_the_figure(server, browser):
    """Every figure with a slider (recorded-history replays) must redraw when it moves."""
    checked = 0
    for src in toc_files()[1:]:
        page = open_page(browser, f"{server}/{src}.html")
        page.wait_for_selector(".plotly-graph-div .main-svg", timeout=30_000)
        ids = page.evaluate("Array.from(document.querySelectorAll('.plotly-graph-div'))"
                            ".filter(d => d.layout && d.layout.sliders && d.layout.sliders.length).map(d => d.id)")
        for fid in ids:
            before = page.evaluate(f"JSON.stringify(document.getElementById('{fid}').data)")
            steps = page.evaluate(f"document.getElementById('{fid}').layout.sliders[0].steps.length")
            active = page.evaluate(f"document.getElementById('{fid}').layout.sliders[0].active || 0")
            # Move the slider the way a reader does: click the rail's far end from where it is.
            rail = page.locator(f'[id="{fid}"] .slider-rail-rect').first
            rail.scroll_into_view_if_needed()
            box = rail.bounding_box()
            x = box["x"] + 2 if active == steps - 1 else box["x"] + box["width"] - 2
            page.mouse.click(x, box["y"] + box["height"] / 2)
            page.wait_for_timeout(800)
            after = page.evaluate(f"JSON.stringify(document.getElementById('{fid}').data)")
            assert steps > 1 and after != before, f"{src}: slider of {fid} did not change the figure"
            checked += 1
        assert page.errors == [], f"JavaScript errors on {src}: {page.errors}"
        page.close()
    assert checked >= 1, "no figure with a slider was found"


# What overflows the text column, measured in the page (see _assets/paged_kv.css): code blocks that
# scroll sideways, tables with inline code (of at most `maxCols` columns) wider than their box, and
# slot text of the block-pool figures wider than its slot.
LAYOUT = """(maxCols) => {
  const art = document.querySelector('article.bd-article');
  const pre = Array.from(art.querySelectorAll('pre')).filter(p => p.offsetParent !== null)
    .filter(p => p.scrollWidth > p.clientWidth + 1)
    .map(p => `${p.scrollWidth} > ${p.clientWidth} px: ${p.innerText.split('\\n')[0].slice(0, 60)}`);
  const tables = Array.from(art.querySelectorAll('table'))
    .filter(t => t.querySelector('td code') && t.rows[0].cells.length <= maxCols)
    .filter(t => t.parentElement.scrollWidth > t.parentElement.clientWidth + 1)
    .map(t => `${t.parentElement.scrollWidth} > ${t.parentElement.clientWidth} px: ${t.innerText.slice(0, 60)}`);
  const slots = [];
  for (const gd of art.querySelectorAll('.plotly-graph-div')) {
    // the figures of paged_kv.viz.blocks (and sharing, serving): a pool heatmap with block labels
    const i = (gd.data || []).findIndex(t => t.name === 'pool' && t.type === 'heatmap');
    if (i < 0 || !gd.data.some(t => t.name === 'block labels') || !gd._fullLayout) continue;
    const sub = gd.data[i].xaxis || 'x', xa = gd._fullLayout[sub === 'x' ? 'xaxis' : 'xaxis' + sub.slice(1)];
    const cell = Math.abs(xa.l2p(1) - xa.l2p(0)) - (gd.data[i].xgap || 0);
    const layer = gd.querySelector(`.subplot.${sub}${gd.data[i].yaxis || 'y'} .heatmaplayer .hm`);
    for (const t of layer ? layer.querySelectorAll('text') : []) {
      const w = t.getBBox().width;
      if (t.textContent && w > cell + 1) slots.push(`${t.textContent}: ${w.toFixed(0)} > ${cell.toFixed(0)} px`);
    }
  }
  // text inside a figure that its left or right edge cuts (a title wider than a phone), and a mode
  // bar drawn over the figure instead of in its strip above it (_assets/paged_kv.css, rule 6)
  const figtext = [], modebar = [];
  art.querySelectorAll('.plotly-graph-div').forEach((gd, k) => {
    if (!gd._fullLayout) return;
    const box = gd.getBoundingClientRect();
    const name = `figure ${k + 1} (${String((gd._fullLayout.title || {}).text || '').replace(/<[^>]+>/g, ' ').slice(0, 30)})`;
    for (const t of gd.querySelectorAll('svg text')) {
      const r = t.getBoundingClientRect();
      if (t.textContent.trim() && r.width > 0 && (r.left < box.left - 1 || r.right > box.right + 1))
        figtext.push(`${name}: "${t.textContent.slice(0, 30)}" spans ${Math.round(r.left - box.left)}..${Math.round(r.right - box.left)} of ${Math.round(box.width)} px`);
    }
    const mb = gd.querySelector('.modebar');
    if (mb && mb.getBoundingClientRect().bottom > box.top + 1) modebar.push(name);
  });
  // a wrapped code line whose continuation starts left of its hanging indent (rule 5)
  const hang = [];
  for (const s of art.querySelectorAll('pre span.line')) {
    const range = document.createRange();
    range.selectNodeContents(s);
    const rects = Array.from(range.getClientRects()).filter(r => r.width > 0);
    if (!rects.length) continue;
    const top = Math.min(...rects.map(r => r.top)), later = rects.filter(r => r.top > top + 2);
    const edge = s.getBoundingClientRect().left + parseFloat(getComputedStyle(s).paddingLeft);
    if (later.length && Math.min(...later.map(r => r.left)) < edge - 1)
      hang.push(s.textContent.slice(0, 60));
  }
  const page = document.documentElement.scrollWidth > window.innerWidth ?
    [`the page is ${document.documentElement.scrollWidth} px wide in a ${window.innerWidth}-px window`] : [];
  return {pre, tables, slots, figtext, modebar, hang, page};
}"""


@pytest.mark.parametrize("width", [1280, 400])
def test_nothing_overflows_the_text_column(server, browser, width):
    """At a laptop's and a phone's width: no code block scrolls sideways (the review counted 25-36
    per page at 1280 px), no table with inline code is wider than its box (chapter 7's settings
    table was cut at "; prefil"; on a phone, tables of up to 3 columns: a wider one may scroll in
    its box), every word in a block-pool slot fits the slot (Fig. 8 at 400 px showed "mother",
    "ather", "sever"), no text of a figure runs past its edges (titles were cut at 400 px), no
    mode bar lies over a figure (it sat on the titles), a wrapped code line continues under its
    indentation (continuations started at column 0), and the page itself never scrolls sideways
    (chapter 8's hash equation widened it at 400 px)."""
    bad = {}
    for src in toc_files():
        page = open_page(browser, f"{server}/{src}.html", width=width)
        page.wait_for_timeout(300)
        found = {k: v for k, v in page.evaluate(LAYOUT, 99 if width > 600 else 3).items() if v}
        if found:
            bad[src] = found
        page.close()
    assert bad == {}, f"at {width} px: {bad}"
