"""Live mode in headless Chromium (Debian's package) with the network cut off: chapter 3's
calculator runs in Pyodide after "Run live", an action redraws the page's figure in place with
what CPython draws for the same action, and a build without live mode says so; on one page with
every registry panel that imports, each panel starts and every one of its controls, used once,
gives CPython's figure (sha256 of the figure JSON).

Only what the test needs is built: chapter 3 alone (``jupyter-book build book/03_kv_memory.md``),
a page of one cell per panel, and for the no-live build a one-cell page, each into a temporary
folder.  Every request to a host
other than 127.0.0.1 is blocked and recorded.  Screenshots go to tests/_artifacts/.

The page's own behaviour (book/_ext/live/live.mjs: the controls it draws, what it sends, when it
marks a redraw done) is also checked without a build or Pyodide: on a page of placeholders
(:func:`paged_kv.widgets.panel.live_html`) with the real live.mjs and plotly.js, whose worker is
a stand-in that hands each message to ``paged_kv.panels.worker`` in this process over HTTP.
"""

import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from unittest import mock
from urllib.parse import urlparse

import pytest

from browser_support import CHROMIUM, launch_browser, serve
from live_helpers import ROOT, cpython_hashes, live_assets, pure_wheel  # noqa: F401 (fixtures)

from paged_kv.panels import registry, step

pytestmark = pytest.mark.browser

ARTIFACTS = ROOT / "tests" / "_artifacts"
JB = Path(sys.executable).parent / "jupyter-book"

if CHROMIUM is None:
    pytest.skip("browser test skipped: Debian's Chromium is not installed (apt-get install chromium; "
                ".ci/run installs it)", allow_module_level=True)
playwright = pytest.importorskip("playwright.sync_api", reason="browser test skipped: playwright is not installed")

LIVE_OFF_PAGE = """---
jupytext:
  text_representation: {extension: .md, format_name: myst}
kernelspec: {display_name: Python 3, language: python, name: python3}
---
# Live off

```{code-cell} ipython3
from paged_kv.viz import setup_plotly
from paged_kv.widgets import calculator_panel, show_live
setup_plotly()
_ = show_live(calculator_panel, "The calculator", live="calculator")
```
"""


def build_page(source: Path, out: Path, live: bool, wheel: Path | None = None) -> Path:
    """Build one page with the book's configuration (its extensions included) into ``out``;
    returns the folder of its HTML.  Not with -W: a page alone cannot resolve the book's other
    pages' cross-references."""
    env = {**os.environ, "PAGED_KV_BOOK": "1", "PAGED_KV_LIVE": "1" if live else "0",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    if wheel is not None:
        env["PAGED_KV_PURE_WHEEL"] = str(wheel)
    proc = subprocess.run([str(JB), "build", str(source), "--config", str(ROOT / "_config.yml"),
                           "--path-output", str(out), "-n", "--keep-going"],
                          env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
    html = out / "_build" / "_page" / source.stem / "html"
    assert proc.returncode == 0 and (html / f"{source.stem}.html").is_file(), \
        f"building {source.name} failed:\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}"
    return html


@pytest.fixture(scope="module")
def ch3_site(tmp_path_factory, live_assets, pure_wheel):
    html = build_page(ROOT / "book" / "03_kv_memory.md", tmp_path_factory.mktemp("ch3"), live=True, wheel=pure_wheel)
    httpd, url = serve(html)
    yield url
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    yield from launch_browser(playwright)


def open_page(browser, url, width=1280):
    """A page that blocks other hosts and records JavaScript errors, blocked requests, and every
    request to this site (``page.fetched``: paths)."""
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.errors, page.blocked, page.fetched = [], [], []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.on("request", lambda r: page.fetched.append(urlparse(r.url).path))

    def route(r):
        if urlparse(r.request.url).hostname in ("127.0.0.1", None):
            return r.continue_()
        page.blocked.append(r.request.url)
        return r.abort()

    page.context.route("**/*", route)   # the context's route also sees the Web Worker's requests
    page.goto(url, wait_until="load")
    return page


def figure_x(page, fig_id):
    return page.evaluate(f"document.getElementById('{fig_id}').data.map(t => [t.name, t.x])")


@pytest.mark.parametrize("width", [1280, 400])
def test_run_live_redraws_the_calculator_with_cpythons_figure(ch3_site, browser, width):
    page = open_page(browser, f"{ch3_site}/03_kv_memory.html", width)
    box = page.locator(".paged-kv-live[data-panel=calculator]")
    assert box.count() == 1
    fig_id = box.get_attribute("data-figure")
    page.wait_for_selector(f"#{fig_id} .main-svg", timeout=30_000)
    live_files = [p for p in page.fetched if "/_static/live/" in p]
    assert live_files == ["/_static/live/click.js"], f"fetched before the click: {live_files}"
    static_x = figure_x(page, fig_id)

    box.locator("button.paged-kv-live-run").click()
    page.wait_for_function("document.querySelector('.paged-kv-live').dataset.liveState === 'ready'"
                           " || !!document.querySelector('.paged-kv-live-status').textContent.match(/could not/)",
                           timeout=120_000)
    assert box.get_attribute("data-live-state") == "ready", box.locator(".paged-kv-live-status").inner_text()
    first = cpython_hashes("calculator", [])
    assert box.get_attribute("data-live-sha") == first[0]
    assert figure_x(page, fig_id) == static_x           # the live panel starts where the page did

    # an action, as a reader makes it: pick another model; the page sends the input that changed
    box.locator("select[name=model]").select_option(label="Llama-3-70B")
    page.wait_for_function("document.querySelector('.paged-kv-live').dataset.liveSteps === '1'", timeout=30_000)
    action = {"op": "set", "model": "Llama-3-70B"}
    expected = cpython_hashes("calculator", [action])
    assert box.get_attribute("data-live-sha") == expected[1] != expected[0]
    after = figure_x(page, fig_id)
    assert after != static_x
    model = registry.create("calculator")
    fig = step(model, model.initial(), action).figure
    assert after == [[t.name, list(t.x)] for t in fig.data]
    assert "max batch at this context" in box.locator(".paged-kv-live-status").inner_text()

    # a refused action (a context of 0 tokens): the model's message shows, the figure stays
    box.locator("input[name=seq_len]").fill("0")
    box.locator("input[name=seq_len]").dispatch_event("change")
    page.wait_for_function("document.querySelector('.paged-kv-live').dataset.liveSteps === '2'", timeout=30_000)
    assert "refused: seq_len" in box.locator(".paged-kv-live-refused").inner_text()
    assert "seq_len" in box.get_attribute("data-live-note")
    assert box.get_attribute("data-live-sha") == expected[1] and figure_x(page, fig_id) == after
    assert box.locator("input[name=seq_len]").input_value() == "8192"     # the accepted context, back

    ARTIFACTS.mkdir(exist_ok=True)
    page.locator(f"#{fig_id}").scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / f"live_calculator_{width}.png"))
    assert page.blocked == [], f"requests to other hosts: {page.blocked}"
    assert page.errors == [], f"JavaScript errors: {page.errors}"
    assert page.locator("head link[rel=icon]").get_attribute("href") == "data:,"   # no /favicon.ico
    assert "/favicon.ico" not in page.fetched
    page.close()


def test_a_build_without_live_mode_says_so(tmp_path, browser):
    src = tmp_path / "src" / "live_off.md"
    src.parent.mkdir()
    src.write_text(LIVE_OFF_PAGE)
    html = build_page(src, tmp_path / "out", live=False)
    assert not (html / "_static" / "live").exists()
    httpd, url = serve(html)
    try:
        page = open_page(browser, f"{url}/live_off.html")
        box = page.locator(".paged-kv-live[data-panel=calculator]")
        assert "Live mode is not in this build" in box.inner_text()
        assert page.locator("button.paged-kv-live-run").count() == 0
        assert not [p for p in page.fetched if "/_static/live/" in p]
        assert page.locator("head link[rel=icon]").get_attribute("href") == "data:,"
        assert page.errors == [] and page.blocked == []
        page.close()
    finally:
        httpd.shutdown()


def page_events(controls: list[dict]) -> list[tuple[tuple, dict]]:
    """What a reader does to a panel's controls, one event per control, and the action the page
    sends for each (``live.mjs``: a button's op plus every input's current value, or the auto
    button's op with the changed input alone): a select set to another option, a (not auto)
    button clicked."""
    values = {c["name"]: c.get("value") for c in controls if c["kind"] != "button"}
    auto = next((c["op"] for c in controls if c["kind"] == "button" and c.get("auto")), None)
    events, buttons = [], 0
    for c in controls:
        if c["kind"] == "select" and auto is not None and len(c["options"]) > 1:
            k = 1 if c["options"][0] == values[c["name"]] else 0
            values[c["name"]] = c["options"][k]
            events.append((("select", c["name"], k), {"op": auto, c["name"]: values[c["name"]]}))
        elif c["kind"] == "button":
            if not c.get("auto"):
                events.append((("button", buttons), {"op": c["op"], **values}))
            buttons += 1
    return events


@pytest.fixture(scope="module")
def all_panels_site(tmp_path_factory, live_assets, pure_wheel):
    """One page with every registry panel that imports here (their constructors' defaults)."""
    names = list(registry.available())
    cells = "".join(f'\n```{{code-cell}} ipython3\n_ = show_live(lambda: None, "Panel {n}", live="{n}")\n```\n'
                    for n in names)
    src = tmp_path_factory.mktemp("src") / "live_all.md"
    src.write_text(LIVE_OFF_PAGE.split("```{code-cell}")[0].replace("# Live off", "# Every live panel")
                   + "```{code-cell} ipython3\nfrom paged_kv.viz import setup_plotly\n"
                     "from paged_kv.widgets import show_live\nsetup_plotly()\n```\n" + cells)
    html = build_page(src, tmp_path_factory.mktemp("all"), live=True, wheel=pure_wheel)
    httpd, url = serve(html)
    yield url, names
    httpd.shutdown()


def test_every_panel_runs_live_and_each_control_gives_cpythons_figure(all_panels_site, browser):
    """Each registry panel on one page: "Run live", then every control once as a reader uses it;
    after each, the figure on the page has CPython's sha256 for the same actions."""
    url, names = all_panels_site
    page = open_page(browser, f"{url}/live_all.html")
    changed = {}
    for name in names:
        box = page.locator(f".paged-kv-live[data-panel={name}]")
        box.locator("button.paged-kv-live-run").click()
        page.wait_for_function(f"(b => b.dataset.liveState === 'ready' || /could not/.test(b.textContent))"
                               f"(document.querySelector('.paged-kv-live[data-panel={name}]'))", timeout=120_000)
        assert box.get_attribute("data-live-state") == "ready", box.inner_text()
        events = page_events(registry.create(name).controls())
        expected = cpython_hashes(name, [action for _, action in events])
        assert box.get_attribute("data-live-sha") == expected[0], name
        for k, (event, _) in enumerate(events, start=1):
            if event[0] == "select":
                box.locator(f"select[name={event[1]}]").select_option(index=event[2])
            else:
                box.locator(".paged-kv-live-controls button").nth(event[1]).click()
            page.wait_for_function(f"document.querySelector('.paged-kv-live[data-panel={name}]')"
                                   f".dataset.liveSteps === '{k}'", timeout=30_000)
            assert box.get_attribute("data-live-sha") == expected[k], f"{name}: after {event}"
        changed[name] = len(set(expected)) > 1
    assert all(changed.values()), f"panels whose controls never changed the figure: {changed}"
    assert page.blocked == [] and page.errors == [], (page.blocked, page.errors)
    page.close()


# --- the page's JavaScript against CPython's worker (no build, no Pyodide) ---------------------------
#: the stand-in for worker.mjs: each message goes to paged_kv.panels.worker in the test's process
STUB_WORKER = """
self.onmessage = async (e) => {
  const r = await fetch("/py", { method: "POST", body: JSON.stringify(e.data) });
  self.postMessage({ id: e.data.id, ...(await r.json()) });
};
"""


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    """A page with every registry panel's placeholder and first figure, live.mjs and plotly.js as
    the book serves them, and a worker that answers with CPython's ``paged_kv.panels.worker``;
    yields ``(url, sent)``, ``sent`` every action the page sent, as parsed JSON, in order."""
    from plotly.offline import get_plotlyjs

    from paged_kv.panels import worker
    from paged_kv.widgets.panel import live_html

    folder = tmp_path_factory.mktemp("harness")
    live = folder / "_static" / "live"
    live.mkdir(parents=True)
    for name in ("click.js", "live.mjs"):
        shutil.copy2(ROOT / "book" / "_ext" / "live" / name, live / name)
    (live / "worker.mjs").write_text(STUB_WORKER)
    (folder / "plotly.min.js").write_text(get_plotlyjs())
    with mock.patch.dict(os.environ, {"PAGED_KV_LIVE": "1"}):
        body = "".join(live_html(name, what=f"Panel {name}") for name in registry.available())
    (folder / "index.html").write_text(
        '<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,">'
        '<script src="plotly.min.js"></script><script src="_static/live/click.js"></script>'
        f"</head><body>{body}</body></html>")
    sent = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".mjs": "text/javascript"}

        def log_message(self, *args):
            pass

        def do_POST(self):
            m = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            try:
                if m["cmd"] == "create":
                    result = worker.create(m["name"], m["args"])
                else:
                    sent.append(json.loads(m["action"]))
                    result = worker.act(m["handle"], m["action"])
                out = {"ok": True, "result": result, "ms": 1.0, "bootMs": 0.0, "boot": {}}
            except Exception as e:     # what worker.mjs posts for an error
                out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            data = json.dumps(out).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(folder)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/index.html", sent
    httpd.shutdown()


#: Plotly.react made slow, and a record, each time a panel's data-live-steps changes, of the step
#: and the height of the figure then drawn (its layout's and its svg's)
DELAYED_REACT = """name => {
  const react = window.Plotly.react;
  window.Plotly.react = (...args) => new Promise((done) => setTimeout(() => react(...args).then(done), 300));
  const box = document.querySelector(`.paged-kv-live[data-panel=${name}]`);
  window.seenAtSteps = [];
  new MutationObserver(() => {
    const gd = document.getElementById(box.dataset.figure);
    window.seenAtSteps.push([box.dataset.liveSteps, gd.layout.height,
                             Number(gd.querySelector(".main-svg").getAttribute("height"))]);
  }).observe(box, { attributes: true, attributeFilter: ["data-live-steps"] });
}"""


def start_live(page, name: str):
    """Click a panel's "Run live" and wait until it is ready; returns its box's locator."""
    box = page.locator(f".paged-kv-live[data-panel={name}]")
    box.locator("button.paged-kv-live-run").click()
    page.wait_for_function(f"(b => b.dataset.liveState === 'ready' || /could not/.test(b.textContent))"
                           f"(document.querySelector('.paged-kv-live[data-panel={name}]'))", timeout=30_000)
    assert box.get_attribute("data-live-state") == "ready", box.inner_text()
    return box


def wait_steps(page, name: str, k: int) -> None:
    page.wait_for_function(f"document.querySelector('.paged-kv-live[data-panel={name}]')"
                           f".dataset.liveSteps === '{k}'", timeout=30_000)


def test_the_block_pools_controls_in_the_page(harness, browser):
    """The block pool as the page draws it: the prompt is a dropdown of the offered prompts, a line
    break shown as a return sign and sent as itself; an empty number box is sent as null; the figure's
    div takes the height of the figure drawn in it; a step is marked done once plotly drew it."""
    url, sent = harness
    page = open_page(browser, url)
    box = start_live(page, "block_pool")
    mine = len(sent)
    # plotly drawing slowly (300 ms): what the figure shows each time data-live-steps changes
    page.evaluate(DELAYED_REACT, "block_pool")
    prompt = registry.create("block_pool").controls()[0]
    select = box.locator("select[name=prompt]")
    shown = select.evaluate("s => [...s.options].map(o => o.textContent)")
    assert shown == prompt["labels"] and any("\u23ce" in label for label in shown)
    romeo = next(i for i, o in enumerate(prompt["options"]) if "\n" in o)
    select.select_option(index=romeo)
    box.locator("button[data-op=add]").click()
    wait_steps(page, "block_pool", 1)
    assert sent[-1]["op"] == "add" and sent[-1]["prompt"] == prompt["options"][romeo]
    assert box.get_attribute("data-live-note") == ""

    box.locator("input[name=length]").fill("")                 # an empty number box: sent as null
    box.locator("button[data-op=add_length]").click()
    wait_steps(page, "block_pool", 2)
    assert sent[-1]["op"] == "add_length" and sent[-1]["length"] is None
    assert "(length) is empty" in box.locator(".paged-kv-live-refused").inner_text()

    box.locator("select[name=view]").select_option("logical")   # a taller figure: the div follows it
    box.locator("button[data-op=view]").click()
    wait_steps(page, "block_pool", 3)
    model = registry.create("block_pool")
    state = model.initial()
    for action in sent[mine:]:
        state = step(model, state, action).state
    height, before = model.figure(state).layout.height, model.figure(model.initial()).layout.height
    assert height != before
    fig_id = box.get_attribute("data-figure")
    shown = page.evaluate(f"[...['#{fig_id}', '#{fig_id} .main-svg']]"
                          ".map(q => document.querySelector(q).getBoundingClientRect().height)")
    assert shown == [height, height]
    # and the wrapper plotly's to_html puts around it (its style holds the first figure's height)
    wrapper = page.evaluate(f"document.querySelector('#{fig_id}').parentElement.getBoundingClientRect().height")
    assert wrapper == height
    # each step's marks were set once its figure was drawn, never over the figure before it
    assert page.evaluate("window.seenAtSteps") == [["1", before, before], ["2", before, before],
                                                   ["3", height, height]]
    assert page.errors == [] and page.blocked == [], (page.errors, page.blocked)
    page.close()


def test_the_calculators_controls_in_the_page(harness, browser):
    """Chapter 3's calculator as the page drives it: a change sends that input alone, and after a
    refusal (an empty box, a context beyond the model's) every input shows the accepted values
    again; its badge says "live" once it runs, the others' still "static"."""
    from paged_kv.panels.page import LIVE_BADGE, STATIC_BADGE

    url, sent = harness
    page = open_page(browser, url)
    badges = page.locator(".paged-kv-live-badge")
    assert badges.count() == len(registry.available()) and set(badges.all_inner_texts()) == {STATIC_BADGE}
    box = start_live(page, "calculator")
    assert box.locator(".paged-kv-live-badge").inner_text() == LIVE_BADGE
    assert page.locator(".paged-kv-live[data-panel=serving] .paged-kv-live-badge").inner_text() == STATIC_BADGE
    seq_len = box.locator("input[name=seq_len]")
    box.locator("select[name=model]").select_option(label="Llama-3-70B")
    wait_steps(page, "calculator", 1)
    assert sent[-1] == {"op": "set", "model": "Llama-3-70B"}
    seq_len.fill("")
    seq_len.dispatch_event("change")
    wait_steps(page, "calculator", 2)
    assert sent[-1] == {"op": "set", "seq_len": None}
    assert "context (seq_len) is empty" in box.locator(".paged-kv-live-refused").inner_text()
    assert seq_len.input_value() == "8192"                    # the last accepted value, back
    seq_len.fill("131072")                                     # beyond Llama-3-70B's 8,192 tokens
    seq_len.dispatch_event("change")
    wait_steps(page, "calculator", 3)
    assert sent[-1] == {"op": "set", "seq_len": 131072}
    assert "beyond Llama-3-70B's maximum context of 8,192" in box.locator(".paged-kv-live-refused").inner_text()
    assert seq_len.input_value() == "8192"
    box.locator("input[name=batch_size]").fill("64")
    box.locator("input[name=batch_size]").dispatch_event("change")
    wait_steps(page, "calculator", 4)
    assert sent[-1] == {"op": "set", "batch_size": 64} and box.get_attribute("data-live-note") == ""
    assert page.errors == [] and page.blocked == [], (page.errors, page.blocked)
    page.close()
