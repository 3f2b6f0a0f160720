"""Live mode's budgets in headless Chromium (Debian's package), with the network cut off.

Usage: ``python benchmarks/live_mode.py [--site DIR] [--actions 6] [--repeat 3]``

Builds chapter 3 alone into a temporary folder (``jupyter-book build book/03_kv_memory.md``, live
mode on; ``PAGED_KV_PURE_WHEEL`` may name the pure wheel) unless ``--site`` names a built site
holding ``03_kv_memory.html`` (e.g. ``_build/html``), serves it on 127.0.0.1, and prints:

* the page's weight before any click (bytes served, and which of them are live mode's);
* cold start: the "Run live" click to the first live figure drawn, in a fresh browser (no cache),
  ``--repeat`` times (each run's, and the best: on a shared machine the others' load dominates);
* each action (picking another model, GPU, TP, ...) from the change to the redrawn figure;
* the bytes live mode fetched, per file.

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
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]
BUDGET_COLD_S, BUDGET_ACTION_MS, BUDGET_BYTES = 8.0, 300.0, 25e6
STATE = "document.querySelector('.paged-kv-live').dataset"


def build_ch3(out: Path) -> Path:
    env = {**os.environ, "PAGED_KV_BOOK": "1", "PAGED_KV_LIVE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    jb = Path(sys.executable).parent / "jupyter-book"
    proc = subprocess.run([str(jb), "build", str(ROOT / "book" / "03_kv_memory.md"), "--config",
                           str(ROOT / "_config.yml"), "--path-output", str(out), "-n", "--keep-going"],
                          env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
    html = out / "_build" / "_page" / "03_kv_memory" / "html"
    if proc.returncode != 0 or not (html / "03_kv_memory.html").is_file():
        raise SystemExit(f"building chapter 3 failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return html


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


def measure(site: Path, n_actions: int) -> dict:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("Debian's Chromium is not installed (apt-get install chromium)")
    served: list = []
    httpd, url = serve(site, served)
    blocked = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True, args=[
                "--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking"])
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            context.route("**/*", lambda r: r.continue_() if urlparse(r.request.url).hostname == "127.0.0.1"
                          else (blocked.append(r.request.url), r.abort()))
            page = context.new_page()
            page.goto(f"{url}/03_kv_memory.html", wait_until="load")
            page.wait_for_timeout(500)
            before = list(served)
            served.clear()
            box = page.locator(".paged-kv-live[data-panel=calculator]")
            t0 = time.perf_counter()
            box.locator("button.paged-kv-live-run").click()
            page.wait_for_function(f"{STATE}.liveState === 'ready'", timeout=120_000, polling=20)
            cold = time.perf_counter() - t0
            boot_ms = float(box.get_attribute("data-live-boot-ms"))
            boot = json.loads(box.get_attribute("data-live-boot"))
            boot["first figure"] = float(box.get_attribute("data-live-create-ms"))
            choices = [("model", "Llama-3-70B"), ("tp", "4"), ("kv_dtype", "fp8"), ("gpu", "H200"),
                       ("pp", "2"), ("block_size", "128"), ("model", "Qwen3-4B"), ("tp", "1")][:n_actions]
            actions = []
            for k, (name, label) in enumerate(choices, start=1):
                t = time.perf_counter()
                box.locator(f"select[name={name}]").select_option(label=label)
                page.wait_for_function(f"{STATE}.liveSteps === '{k}'", timeout=30_000, polling=5)
                actions.append((f"{name}={label}", (time.perf_counter() - t) * 1000,
                                float(box.get_attribute("data-live-ms"))))
            browser.close()
    finally:
        httpd.shutdown()
    return {"before": before, "live": list(served), "cold_s": cold, "boot_ms": boot_ms, "boot": boot, "actions": actions,
            "blocked": blocked}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--site", type=Path, help="a built site with 03_kv_memory.html (default: build chapter 3)")
    ap.add_argument("--actions", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        site = args.site or build_ch3(Path(tmp))
        runs = [measure(site, args.actions) for _ in range(max(1, args.repeat))]
    r = min(runs, key=lambda run: run["cold_s"])
    colds = ", ".join(f"{run['cold_s']:.1f}" for run in runs)
    print(f"live_mode: chapter 3's calculator, headless Chromium, python {platform.python_version()}, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d')}; "
          f"the best of {len(runs)} fresh browsers (cold starts: {colds} s)")
    page_bytes = sum(n for _, n in r["before"])
    live_before = [(p, n) for p, n in r["before"] if "/_static/live/" in p]
    print(f"page before the click: {page_bytes:,} bytes in {len(r['before'])} files; live mode's part: "
          f"{sum(n for _, n in live_before):,} bytes ({', '.join(p.rsplit('/', 1)[-1] for p, _ in live_before)})")
    ok = lambda good: "ok" if good else "OVER BUDGET"
    print(f"cold start, click to first live figure: {r['cold_s']:.2f} s (Pyodide and wheels ready in the worker "
          f"after {r['boot_ms'] / 1000:.2f} s)  budget {BUDGET_COLD_S:.0f} s: {ok(r['cold_s'] <= BUDGET_COLD_S)}")
    print("  of which (s): " + ", ".join(f"{k} {v / 1000:.2f}" for k, v in r["boot"].items())
          + "  (load: Pyodide started and the wheels fetched; import: paged_kv.panels.worker with plotly)")
    for name, wall, worker in r["actions"]:
        print(f"action {name:<18} {wall:7.1f} ms change to redrawn figure ({worker:5.1f} ms in Python)  "
              f"budget {BUDGET_ACTION_MS:.0f} ms: {ok(wall <= BUDGET_ACTION_MS)}")
    live = sorted(r["live"], key=lambda x: -x[1])
    total = sum(n for _, n in live)
    print("bytes fetched by live mode, per file:")
    for p, n in live:
        print(f"  {n:>12,}  {p}")
    print(f"  {total:>12,}  total ({total / 1e6:.1f} MB)  budget {BUDGET_BYTES / 1e6:.0f} MB: {ok(total <= BUDGET_BYTES)}")
    if r["blocked"]:
        print(f"requests to other hosts (blocked): {r['blocked']}")


if __name__ == "__main__":
    main()
