"""Live mode's budgets in headless Chromium (Debian's package), with the network cut off.

Usage: ``python benchmarks/live_mode.py [--site DIR ...] [--panels] [--actions 6] [--repeat 3] [--pause MS]``

Builds what it measures into a temporary folder (live mode on; ``PAGED_KV_PURE_WHEEL`` may name
the pure wheel) unless ``--site`` names a built site that has it: chapter 3 alone
(``jupyter-book build book/03_kv_memory.md``, ``03_kv_memory.html``, e.g. ``_build/html``), or with
``--panels`` a page of one cell per registry panel (``live_all.html``, as ``tests/live`` builds
it: about 20 s each, instead of the whole book).  It serves the site on 127.0.0.1 and, in a fresh
browser (no cache) per run, measures:

* the page's weight before any click (bytes served, and which of them are live mode's);
* cold start: the "Run live" click to the first live figure drawn, and its phases in the worker
  (load: Pyodide started and the wheels fetched; unpack; import: ``paged_kv.panels.worker`` with
  plotly; first figure: the panel's ``create``);
* each action from the change (or click) to the redrawn figure, and its time in Python: chapter
  3's calculator gets ``--actions`` other models, GPUs, TPs, ...; with ``--panels`` each panel gets
  every control once (a select set to another option, each button but the auto one clicked), the
  first ``--pause`` ms after the panel is ready (0: at once, as a script does; a reader reads first);
* the bytes live mode fetched, per file.

Each measurement runs ``--repeat`` times and the medians are printed (the machine's load moves a
cold start by seconds).  With several ``--site`` the runs alternate between them (A, B, A, B, ...),
so an A/B comparison sees the same conditions.

Budgets (issue 24): cold start <= 8 s, each action <= 300 ms, live mode's bytes <= 25 MB.  This is
a benchmark, not a test: it prints and never fails on a budget.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]
BUDGET_COLD_S, BUDGET_ACTION_MS, BUDGET_BYTES = 8.0, 300.0, 25e6
CALCULATOR_CHOICES = [("model", "Llama-3-70B"), ("tp", "4"), ("kv_dtype", "fp8"), ("gpu", "H200"),
                      ("pp", "2"), ("block_size", "128"), ("model", "Qwen3-4B"), ("tp", "1")]
ALL_PANELS_HEAD = """---
jupytext:
  text_representation: {extension: .md, format_name: myst}
kernelspec: {display_name: Python 3, language: python, name: python3}
---
# Every live panel

```{code-cell} ipython3
from paged_kv.viz import setup_plotly
from paged_kv.widgets import show_live
setup_plotly()
```
"""


def build_page(source: Path, out: Path) -> Path:
    """``source`` built alone with the book's configuration, live mode on; the folder of its HTML."""
    env = {**os.environ, "PAGED_KV_BOOK": "1", "PAGED_KV_LIVE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    jb = Path(sys.executable).parent / "jupyter-book"
    proc = subprocess.run([str(jb), "build", str(source), "--config", str(ROOT / "_config.yml"),
                           "--path-output", str(out), "-n", "--keep-going"],
                          env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
    html = out / "_build" / "_page" / source.stem / "html"
    if proc.returncode != 0 or not (html / f"{source.stem}.html").is_file():
        raise SystemExit(f"building {source.name} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    if not (html / "_static" / "live" / "manifest.json").is_file():
        raise SystemExit(f"{source.name} was built without live mode (make assets fetches its runtime)")
    return html


def build_all_panels(out: Path) -> Path:
    """A page with one "Run live" placeholder per registry panel, built into ``out``."""
    from paged_kv.panels import registry

    cells = "".join(f'\n```{{code-cell}} ipython3\n_ = show_live(lambda: None, "Panel {n}", live="{n}")\n```\n'
                    for n in registry.available())
    src = out / "src" / "live_all.md"
    src.parent.mkdir(parents=True)
    src.write_text(ALL_PANELS_HEAD + cells)
    return build_page(src, out / "out")


def panel_events(controls: list[dict]) -> list[tuple[str, tuple]]:
    """Every control of a panel once, as a reader uses it: ``(label, event)``, an event
    ``("select", name, index)`` (another option, where an auto button sends on change) or
    ``("button", k)`` (the k-th button, never the auto one)."""
    auto = any(c["kind"] == "button" and c.get("auto") for c in controls)
    events, buttons = [], 0
    for c in controls:
        if c["kind"] == "select" and auto and len(c["options"]) > 1:
            k = 1 if c["options"][0] == c.get("value") else 0
            events.append((f"{c['name']}={c['options'][k]}", ("select", c["name"], k)))
        elif c["kind"] == "button":
            if not c.get("auto"):
                events.append((c["op"], ("button", buttons)))
            buttons += 1
    return events


def serve(folder: Path, served: list):
    """A local server that records ``(path, bytes)`` of every file it sends."""
    class Counting(http.server.SimpleHTTPRequestHandler):
        extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                          ".mjs": "text/javascript", ".wasm": "application/wasm"}

        def log_message(self, *args):
            pass

        def do_GET(self):
            path = Path(self.translate_path(self.path))
            if path.is_file():
                served.append((urlparse(self.path).path, path.stat().st_size))
            super().do_GET()

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Counting, directory=str(folder)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


def measure(site: Path, page_name: str, panel: str, events: list, pause_ms: float = 0) -> dict:
    """One cold start of ``panel`` on ``page_name`` in a fresh browser, then ``events``
    (``(label, ("select", name, option label or index) | ("button", k))``)."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("Debian's Chromium is not installed (apt-get install chromium)")
    served: list = []
    httpd, url = serve(site, served)
    blocked = []
    state = f"document.querySelector('.paged-kv-live[data-panel={panel}]').dataset"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True, args=[
                "--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking"])
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            context.route("**/*", lambda r: r.continue_() if urlparse(r.request.url).hostname == "127.0.0.1"
                          else (blocked.append(r.request.url), r.abort()))
            page = context.new_page()
            page.goto(f"{url}/{page_name}", wait_until="load")
            page.wait_for_timeout(500)
            before = list(served)
            served.clear()
            box = page.locator(f".paged-kv-live[data-panel={panel}]")
            t0 = time.perf_counter()
            box.locator("button.paged-kv-live-run").click()
            page.wait_for_function(f"{state}.liveState === 'ready'", timeout=120_000, polling=20)
            cold = time.perf_counter() - t0
            boot = json.loads(box.get_attribute("data-live-boot"))
            boot["first figure"] = float(box.get_attribute("data-live-create-ms"))
            if pause_ms:
                page.wait_for_timeout(pause_ms)
            actions = []
            for k, (label, event) in enumerate(events, start=1):
                t = time.perf_counter()
                if event[0] == "select" and isinstance(event[2], str):
                    box.locator(f"select[name={event[1]}]").select_option(label=event[2])
                elif event[0] == "select":
                    box.locator(f"select[name={event[1]}]").select_option(index=event[2])
                else:
                    box.locator(".paged-kv-live-controls button").nth(event[1]).click()
                page.wait_for_function(f"{state}.liveSteps === '{k}'", timeout=30_000, polling=5)
                actions.append((label, (time.perf_counter() - t) * 1000, float(box.get_attribute("data-live-ms"))))
            browser.close()
    finally:
        httpd.shutdown()
    return {"before": before, "live": list(served), "cold_s": cold, "boot": boot, "actions": actions,
            "blocked": blocked}


def median(xs) -> float:
    return statistics.median(xs) if xs else float("nan")


def summary(runs: list[dict]) -> dict:
    """The medians over ``runs`` of one measurement: cold start, its phases, the first action and
    the later ones (each run's median of them), wall and in Python."""
    later = [r["actions"][1:] for r in runs]
    return {"cold_s": median([r["cold_s"] for r in runs]),
            "colds": [r["cold_s"] for r in runs],
            "boot": {k: median([r["boot"][k] for r in runs]) for k in runs[0]["boot"]},
            "first_ms": median([r["actions"][0][1] for r in runs if r["actions"]]),
            "first_py_ms": median([r["actions"][0][2] for r in runs if r["actions"]]),
            "later_ms": median([median([a[1] for a in x]) for x in later if x]),
            "later_py_ms": median([median([a[2] for a in x]) for x in later if x]),
            "live_bytes": median([sum(n for _, n in r["live"]) for r in runs])}


def report_calculator(site: Path, runs: list[dict]) -> None:
    s = summary(runs)
    r = runs[0]
    ok = lambda good: "ok" if good else "OVER BUDGET"
    print(f"site {site}: {len(runs)} fresh browsers (cold starts: {', '.join(f'{c:.1f}' for c in s['colds'])} s)")
    page_bytes = sum(n for _, n in r["before"])
    live_before = [(p, n) for p, n in r["before"] if "/_static/live/" in p]
    print(f"page before the click: {page_bytes:,} bytes in {len(r['before'])} files; live mode's part: "
          f"{sum(n for _, n in live_before):,} bytes ({', '.join(p.rsplit('/', 1)[-1] for p, _ in live_before)})")
    print(f"cold start, click to first live figure (median): {s['cold_s']:.2f} s  budget {BUDGET_COLD_S:.0f} s: "
          f"{ok(s['cold_s'] <= BUDGET_COLD_S)}")
    print("  of which (s, medians): " + ", ".join(f"{k} {v / 1000:.2f}" for k, v in s["boot"].items())
          + "  (load: Pyodide started and the wheels fetched; import: paged_kv.panels.worker with plotly)")
    for k, (name, _, _) in enumerate(r["actions"]):
        wall = median([run["actions"][k][1] for run in runs])
        py = median([run["actions"][k][2] for run in runs])
        print(f"action {name:<18} {wall:7.1f} ms change to redrawn figure ({py:5.1f} ms in Python)  "
              f"budget {BUDGET_ACTION_MS:.0f} ms: {ok(wall <= BUDGET_ACTION_MS)}")
    live = sorted(r["live"], key=lambda x: -x[1])
    total = sum(n for _, n in live)
    print("bytes fetched by live mode, per file:")
    for p, n in live:
        print(f"  {n:>12,}  {p}")
    print(f"  {total:>12,}  total ({total / 1e6:.1f} MB)  budget {BUDGET_BYTES / 1e6:.0f} MB: {ok(total <= BUDGET_BYTES)}")
    if any(run["blocked"] for run in runs):
        print(f"requests to other hosts (blocked): {[run['blocked'] for run in runs]}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--site", type=Path, action="append",
                    help="a built site (repeat it to compare sites, runs alternated; default: build what is measured)")
    ap.add_argument("--panels", action="store_true",
                    help="every registry panel on one page (live_all.html), every control once, instead of "
                         "chapter 3's calculator")
    ap.add_argument("--actions", type=int, default=6, help="chapter 3's actions (without --panels)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pause", type=float, default=0, help="ms from ready to the first action (default 0)")
    args = ap.parse_args(argv)
    from paged_kv.panels import registry

    with tempfile.TemporaryDirectory() as tmp:
        if args.site:
            sites = args.site
        elif args.panels:
            sites = [build_all_panels(Path(tmp))]
        else:
            sites = [build_page(ROOT / "book" / "03_kv_memory.md", Path(tmp))]
        if args.panels:
            plan = [("live_all.html", n, panel_events(registry.create(n).controls())) for n in registry.available()]
        else:
            plan = [("03_kv_memory.html", "calculator", [(f"{name}={label}", ("select", name, label))
                                                         for name, label in CALCULATOR_CHOICES[:args.actions]])]
        runs = {(str(site), panel): [] for site in sites for _, panel, _ in plan}
        for _ in range(max(1, args.repeat)):
            for page_name, panel, events in plan:
                for site in sites:                      # alternated: A, B, A, B, ...
                    runs[(str(site), panel)].append(measure(site, page_name, panel, events, args.pause))
    print(f"live_mode: headless Chromium, python {platform.python_version()}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f} at the end, {time.strftime('%Y-%m-%d')}; medians of "
          f"{args.repeat} fresh browsers per site, runs alternated between the sites; pause before the first "
          f"action {args.pause:.0f} ms")
    if not args.panels:
        for site in sites:
            report_calculator(site, runs[(str(site), "calculator")])
        return
    ok = lambda good: "ok" if good else "OVER"
    print(f"{'site':<8}{'panel':<14}{'cold s':>8}{'load':>7}{'unpack':>7}{'import':>7}{'create':>7}"
          f"{'first ms':>10}{'(py)':>6}{'later ms':>10}{'(py)':>6}{'MB':>6}")
    for i, site in enumerate(sites):
        for _, panel, _ in plan:
            s = summary(runs[(str(site), panel)])
            b = s["boot"]
            print(f"{chr(65 + i):<8}{panel:<14}{s['cold_s']:>8.2f}{b['load'] / 1e3:>7.2f}{b['unpack'] / 1e3:>7.2f}"
                  f"{b['import'] / 1e3:>7.2f}{b['first figure'] / 1e3:>7.2f}{s['first_ms']:>10.0f}"
                  f"{s['first_py_ms']:>6.0f}{s['later_ms']:>10.0f}{s['later_py_ms']:>6.0f}"
                  f"{s['live_bytes'] / 1e6:>6.1f}  {ok(s['cold_s'] <= BUDGET_COLD_S)}/"
                  f"{ok(s['first_ms'] <= BUDGET_ACTION_MS)}")
    for i, site in enumerate(sites):
        print(f"{chr(65 + i)}: {site}")


if __name__ == "__main__":
    main()
