"""The second half of ``make colab-check`` (see scripts/colab_check.py), run inside the Colab-like
environment: execute every chapter's notebook live and click every live panel.

Usage (colab_check.py calls it): ``python scripts/colab_drive.py <clone> [--only NAME ...]``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import nbformat
import yaml
from nbclient import NotebookClient

TOKEN = "colab-check"
# How long a panel may take to show a click's effect: clicks took 0.4-3 s, but two first runs under a
# busy machine (ch3 model, ch7 step) saw no change in 20 s and passed when rerun.
CLICK_WAIT_S = 45
# What a reader does with each chapter's live panel: (action, control label, value, what must change).
# "fig": the panel's figure; "any": its figure or its text. Labels are the widgets' descriptions.
PANELS = {
    "03_kv_memory": [("select", "model", None, "fig"), ("type", "context", "32768", "fig"),
                     ("select", "GPU", None, "fig"), ("select", "KV dtype", None, "fig"), ("select", "TP", None, "fig")],
    # placement before policy: under the default Orca (Oracle) buddy and first-fit strips differ;
    # under Orca (Max) every reservation is the (power-of-two) maximum and the strip is the same.
    "04_fragmentation": [("select", "placement", "first-fit", "fig"), ("select", "policy", None, "fig"),
                         ("key", "frame", "ArrowLeft", "fig"), ("key", "req/s", "ArrowRight", "fig")],
    "05_paged_attention": [("click", "add prompt", None, "fig"), ("type", "or length", "20", "none"),
                           ("click", "add length", None, "fig"), ("click", "decode step", None, "fig"),
                           ("select", "request", None, "none"), ("click", "finish", None, "fig"),
                           ("click", "finish", None, "fig"), ("click", "add prompt", None, "fig")],
    "06_copy_on_write": [("click", "add prompt", None, "fig"), ("click", "fork", None, "fig"),
                         ("click", "decode step", None, "fig"), ("click", "finish / prune", None, "fig")],
    "07_serving": [("click", "submit", None, "any"), ("click", "step", None, "fig"), ("click", "submit", None, "any"),
                   ("click", "step", None, "fig"), ("click", "recompute", None, "none"),
                   ("click", "preempt", None, "any"), ("click", "run until idle", None, "fig")],
    "08_prefix_caching": [("click", "submit", None, "any"), ("click", "step", None, "fig"),
                          ("click", "submit", None, "any"), ("select", "prefix", None, "none"),
                          ("type", "own text", "to be or not", "none"), ("click", "submit", None, "any"),
                          ("click", "run until idle", None, "fig")],
    "09_speculative_decoding": [("click", "pass ▶", None, "fig"), ("click", "next freed block", None, "fig"),
                                ("type", "drafts", "6", "none"), ("click", "replay", None, "fig"),
                                ("click", "◀ pass", None, "any")],
}


# The teacher guide reads the clone's assignments/ folder and says so when run alone (it is for a
# clone, built by `make book`; its Colab links go to the released assignments instead).
NOT_FOR_COLAB = {"teacher_guide"}


def chapters(root: Path) -> list[str]:
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    names = [Path(toc["root"]).name] + [Path(c["file"]).name for c in toc["chapters"]]
    return [n for n in names if n not in NOT_FOR_COLAB]


def problems_in(nb) -> list[str]:
    """Errors and stderr (warnings) in an executed notebook's outputs."""
    out = []
    for i, c in enumerate(nb.cells):
        for o in c.get("outputs", []):
            if o.output_type == "error":
                out.append(f"cell {i}: {o.ename}: {o.evalue}")
            elif o.output_type == "stream" and o.name == "stderr":
                out.append(f"cell {i}: stderr: {o.text.strip()[:500]}")
    return out


def cell_seconds(c) -> float:
    t = c.metadata.get("execution", {})
    try:
        from datetime import datetime
        a = datetime.fromisoformat(t["iopub.execute_input"].replace("Z", "+00:00"))
        b = datetime.fromisoformat(t["shell.execute_reply"].replace("Z", "+00:00"))
        return (b - a).total_seconds()
    except (KeyError, ValueError):
        return 0.0


def run_nbclient(path: Path, work: Path) -> tuple[float, list[str]]:
    nb = nbformat.read(path, as_version=4)
    t = time.time()
    NotebookClient(nb, timeout=1200, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(work)}}).execute()
    total = time.time() - t
    for i, c in enumerate(nb.cells):
        if c.cell_type == "code" and cell_seconds(c) > 5:
            print(f"    cell {i}: {cell_seconds(c):.1f} s", flush=True)
    first = next(c for c in nb.cells if c.cell_type == "code")
    shown = "".join(o.get("text", "") + json.dumps(o.get("data", {})) for o in first.outputs)
    print(f"    set-up cell showed: {shown.strip()[:300]!r}", flush=True)
    bad = problems_in(nb)
    if "colab" in [o.get("data", {}).get("text/plain", "").strip("'") for o in first.outputs]:
        bad.append("the set-up cell displays 'colab'")
    nbformat.write(nb, work / f"{path.stem}.executed.ipynb")
    return total, bad


# --- JupyterLab in headless Chromium --------------------------------------------------------------

JS_PROMPTS = "Array.from(window.jupyterapp.shell.currentWidget.node.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')).map(e => e.textContent.replace(/\\s/g, ''))"
JS_PROBLEMS = """Array.from(window.jupyterapp.shell.currentWidget.node.querySelectorAll('.jp-OutputArea-output')).filter(e =>
    e.getAttribute('data-mime-type') === 'application/vnd.jupyter.stderr' ||
    /Error displaying widget|Failed to display Jupyter Widget|Error creating (view|widget)|model not found/.test(e.textContent))
    .map(e => e.textContent.trim().slice(0, 600))"""


def start_lab(work: Path, env: dict) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(work / "jupyterlab.log", "w")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "jupyter-lab"), "--no-browser", f"--port={port}",
                             "--ip=127.0.0.1", f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={work}",
                             "--allow-root", "--LabApp.expose_app_in_browser=True"],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work)
    base = f"http://127.0.0.1:{port}"
    for _ in range(240):
        try:
            urllib.request.urlopen(f"{base}/api/status?token={TOKEN}", timeout=2)
            return proc, base
        except (OSError, http.client.HTTPException):   # not up yet, or another process answered first
            time.sleep(0.5)
    proc.terminate()
    raise RuntimeError(f"JupyterLab did not start; see {work / 'jupyterlab.log'}")


def route_offline(route):
    url = route.request.url
    if url.startswith("https://cdn.plot.ly/plotly-") and url.endswith(".min.js"):
        import plotly
        js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
        return route.fulfill(path=str(js), content_type="application/javascript",
                             headers={"Access-Control-Allow-Origin": "*"})
    if url.startswith(("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:")):
        return route.continue_()
    print(f"   (refused {url[:120]})", flush=True)
    return route.abort()


class Panel:
    """One live panel in the page: the output area that holds its controls and its figure."""

    def __init__(self, page, label: str):
        self.page = page
        ctrl = page.locator(f"button.jupyter-button:text-is('{label}')").or_(
            page.locator(f".widget-inline-hbox:has(> label:text-is('{label}'))")).first
        ctrl.wait_for(timeout=60_000)
        self.root = ctrl.locator("xpath=ancestor::div[contains(@class, 'jp-OutputArea-output')][1]")

    def control(self, label: str):
        r = self.root
        for loc in (r.locator(f"button:text-is('{label}')"),
                    r.locator(f".widget-inline-hbox:has(> label:text-is('{label}'))").locator("select, input, .ui-slider-handle, .noUi-handle")):
            if loc.count():
                return loc.first
        raise AssertionError(f"no control {label!r} in the panel")

    def figure(self) -> str:
        return self.root.evaluate("""r => { const g = r.querySelector('.js-plotly-plot');
            return g && g.data ? JSON.stringify([g.data, (g.layout || {}).title, (g.layout || {}).annotations, (g.layout || {}).shapes]) : ''; }""")

    def text(self) -> str:
        return self.root.evaluate("r => Array.from(r.querySelectorAll('.widget-html, .widget-html-content, .jp-RenderedText')).map(e => e.textContent).join('|')")

    def blanks(self) -> list[str]:
        """Widgets that show nothing: a panel without a drawn figure, a list with options but no choice."""
        out = self.root.evaluate("""r => {
            const bad = [];
            const g = r.querySelector('.js-plotly-plot .main-svg');
            if (!g || g.getBoundingClientRect().height < 50) bad.push('figure not drawn');
            for (const s of r.querySelectorAll('select'))
                if (s.options.length && (s.selectedIndex < 0 || !s.value))
                    bad.push('list ' + (s.parentElement.querySelector('label') || {}).textContent + ' blank with ' + s.options.length + ' options');
            if (r.getBoundingClientRect().height < 100) bad.push('panel is ' + r.getBoundingClientRect().height + ' px high');
            return bad; }""")
        return out

    def act(self, kind: str, label: str, value) -> None:
        c = self.control(label)
        c.scroll_into_view_if_needed()
        if kind == "click":
            c.click()
        elif kind == "select":
            options = c.evaluate("s => Array.from(s.options).map(o => o.value)")
            current = c.evaluate("s => s.value")
            # a named choice where only some choices change the figure (ch4: under Orca (Oracle)
            # first-fit and best-fit agree for the first frames; the default buddy differs from both)
            choice = value if value is not None and value != current else next((o for o in options if o != current), None)
            if choice is None:
                raise AssertionError(f"list {label!r} offers no other choice than {current!r} (options {options})")
            c.select_option(choice)
        elif kind == "type":
            c.click()
            c.fill(str(value))
            c.press("Enter")
        elif kind == "key":
            c.focus()
            c.press(value)
        else:
            raise ValueError(kind)


def drive_chapter(page, base: str, name: str, timeout_s: float = 1200) -> tuple[float, list[str], list[str]]:
    """Run all cells in JupyterLab, then use the chapter's panel; returns (seconds, problems, click log)."""
    # ?reset: an empty workspace, so JupyterLab does not reopen the previous chapters' notebooks
    # (each with a kernel, and with cells that the prompt and control searches below would see).
    page.goto(f"{base}/lab/tree/{name}.ipynb?reset&token={TOKEN}", wait_until="domcontentloaded")
    page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=180_000)
    page.wait_for_function("window.jupyterapp && window.jupyterapp.shell.currentWidget && "
                           "window.jupyterapp.shell.currentWidget.sessionContext.session?.kernel?.status === 'idle'",
                           timeout=180_000)
    time.sleep(1)
    t = time.time()
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")   # Run > Run All Cells
    try:
        page.wait_for_function(f"{JS_PROMPTS}.some(p => p !== '[]:')", timeout=60_000)
    except Exception:
        page.screenshot(path=str(Path(os.environ["COLAB_CHECK_ARTIFACTS"]) / f"colab-check-{name}.png"))
        raise RuntimeError("Run All Cells started nothing in 60 s (see the screenshot)") from None
    while time.time() - t < timeout_s:
        time.sleep(2)
        prompts = page.evaluate(JS_PROMPTS)
        if not any("*" in p for p in prompts) and (all(p not in ("[]:", "") for p in prompts) or page.evaluate(JS_PROBLEMS)):
            break
    total = time.time() - t
    print(f"   ran all cells in {total:.1f} s", flush=True)
    problems = [f"output: {p}" for p in page.evaluate(JS_PROBLEMS)]
    if any("*" in p for p in page.evaluate(JS_PROMPTS)):
        problems.append(f"still running after {timeout_s:.0f} s")
    log = []
    if problems or name not in PANELS:
        return total, problems, log
    steps = PANELS[name]
    panel = Panel(page, steps[0][1])
    time.sleep(1)
    problems += [f"before any click: {b}" for b in panel.blanks()]
    for kind, label, value, expect in steps:
        fig, text = panel.figure(), panel.text()
        t0 = time.time()
        panel.act(kind, label, value)
        changed = None
        while time.time() - t0 < CLICK_WAIT_S:
            f2, t2 = panel.figure(), panel.text()
            changed = {"fig": f2 != fig, "any": f2 != fig or t2 != text, "none": True}[expect]
            if changed and (expect != "none" or time.time() - t0 > 1):
                break
            time.sleep(0.05)
        dt = time.time() - t0
        what = f"{kind} {label!r}" + (f" = {value}" if value is not None else "")
        log.append(f"{what}: {'changed' if changed else 'NO CHANGE'} after {dt:.2f} s")
        print("   " + log[-1], flush=True)
        if not changed:
            problems.append(f"{what}: the {'figure' if expect == 'fig' else 'panel'} did not change in {CLICK_WAIT_S} s")
        problems += [f"after {what}: {b}" for b in panel.blanks()]
        problems += [f"after {what}: output: {p}" for p in page.evaluate(JS_PROBLEMS)]
        if problems:
            break
    page.screenshot(path=str(Path(os.environ.get("COLAB_CHECK_ARTIFACTS", "/tmp")) / f"colab-check-{name}.png"), full_page=False)
    return total, problems, log


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("root", type=Path)
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    names = chapters(root)
    if args.only:
        import importlib.util
        installed = importlib.util.find_spec("paged_kv") is not None
        # intro first (its set-up cell installs the package) unless it is installed already
        names = [n for n in names if n in args.only or (n == "intro" and not installed)]
    work = Path(tempfile.mkdtemp(prefix="colab-check-"))
    for n in names:
        shutil.copy(root / "book" / f"{n}.ipynb", work / f"{n}.ipynb")
    # A user data dir whose python3 kernel is this environment's, and a startup file that imports
    # the stand-in google.colab as Colab's kernel does.
    data, ipython = work / ".jupyter-data", work / ".ipython"
    (data / "kernels" / "python3").mkdir(parents=True)
    (data / "kernels" / "python3" / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (ipykernel)", "language": "python"}))
    (ipython / "profile_default" / "startup").mkdir(parents=True)
    (ipython / "profile_default" / "startup" / "00-colab.py").write_text("import google.colab  # noqa\n")
    os.environ.update(JUPYTER_DATA_DIR=str(data), IPYTHONDIR=str(ipython), JUPYTER_CONFIG_DIR=str(work / ".jupyter-config"))
    os.environ.setdefault("COLAB_CHECK_ARTIFACTS", str(root / "tests" / "_artifacts"))
    Path(os.environ["COLAB_CHECK_ARTIFACTS"]).mkdir(parents=True, exist_ok=True)
    failures, timings, t_all = {}, {}, time.time()

    for n in [n for n in names if n not in PANELS]:
        print(f"== {n} (nbclient)", flush=True)
        timings[n], bad = run_nbclient(work / f"{n}.ipynb", work)
        print(f"   {timings[n]:.1f} s" + "".join(f"\n   PROBLEM {b}" for b in bad), flush=True)
        if bad:
            failures[n] = bad
    import importlib.metadata as md
    versions = {p: md.version(p) for p in ("paged-kv", "plotly", "ipywidgets", "anywidget", "numpy", "torch",
                                           "triton", "jupyterlab", "jupyterlab_widgets")}
    print("versions:", ", ".join(f"{k} {v}" for k, v in versions.items()), flush=True)

    panel_chapters = [n for n in names if n in PANELS]
    if panel_chapters:
        from playwright.sync_api import sync_playwright
        proc = None
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=os.environ.get("COLAB_CHECK_CHROMIUM") or None, headless=True,
                                            args=["--no-sandbox", "--disable-gpu", "--no-first-run",
                                                  "--disable-background-networking", "--disable-component-update"])
                for n in panel_chapters:
                    print(f"== {n} (JupyterLab in Chromium: Run All Cells, then the panel)", flush=True)
                    # A fresh JupyterLab per chapter: one chapter's kernel and page cannot hold up the next.
                    if proc is not None:
                        proc.terminate()
                        proc.wait(timeout=30)
                    shutil.rmtree(work / ".jupyter-config" / "lab" / "workspaces", ignore_errors=True)
                    proc, base = start_lab(work, dict(os.environ))
                    page = browser.new_page(viewport={"width": 1280, "height": 1000})
                    page.js_errors = []
                    # Colab's "colab" renderer loads plotly.js from its CDN; serve the installed copy
                    # (no network here). Every other outside request is refused.
                    page.route("**/*", route_offline)
                    page.on("pageerror", lambda e, pg=page: pg.js_errors.append(str(e)))
                    try:
                        timings[n], bad, log = drive_chapter(page, base, n)
                    except Exception as e:   # a control or the page did not behave: this chapter fails
                        timings[n], bad, log = 0.0, [f"{type(e).__name__}: {str(e)[:800]}"], []
                        page.screenshot(path=str(Path(os.environ["COLAB_CHECK_ARTIFACTS"]) / f"colab-check-{n}.png"))
                    # Colab draws each output in its own iframe, where the "colab" renderer's CDN
                    # <script> loads before the figure's code; JupyterLab inserts both at once, so
                    # static figures there fail with this one error, which says nothing about Colab.
                    bad += [f"JavaScript error: {e}" for e in page.js_errors if e != "Plotly is not defined"]
                    print(f"   {timings[n]:.1f} s"
                          + "".join(f"\n   PROBLEM {b}" for b in bad), flush=True)
                    if bad:
                        failures[n] = bad
                    # Shut the kernel down before the next chapter (2 cores).
                    page.close()
                    for k in json.load(urllib.request.urlopen(f"{base}/api/sessions?token={TOKEN}")):
                        req = urllib.request.Request(f"{base}/api/sessions/{k['id']}?token={TOKEN}", method="DELETE")
                        urllib.request.urlopen(req)
                browser.close()
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=30)
    print(f"\ncolab-check: {len(names)} notebooks in {time.time() - t_all:.0f} s; "
          + ", ".join(f"{n} {timings.get(n, 0):.0f} s" for n in names), flush=True)
    if failures:
        print("FAILED:", ", ".join(failures), flush=True)
        return 1
    shutil.rmtree(work, ignore_errors=True)
    print("colab-check passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
