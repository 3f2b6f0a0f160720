"""Sphinx extension: the browser edition's live mode, served from the built site.

* At start (``config-inited``): live mode is on when ``PAGED_KV_LIVE`` is not ``"0"`` (``make book
  LIVE=0`` sets it) and ``scripts/live_assets.py`` has fetched the pinned runtime into
  ``.live_assets/`` (it needs npm).  The answer is put back into ``PAGED_KV_LIVE`` ("1" or "0")
  before any chapter runs, so the placeholders the chapters emit
  (:func:`paged_kv.panels.page.placeholder`) offer "Run live" or say "Live mode is not in this
  build" to match.  Without the runtime the build still succeeds, and says why live mode is off.
* On a page with a placeholder (``html-page-context``): one small script, ``_static/live/click.js``,
  a click listener; nothing else runs on page load.  On every page, unless the book has a favicon:
  :data:`NO_FAVICON`, an empty icon, so the browser never asks the site for ``/favicon.ico``
  (which it does not have: a 404 in the console of every page, and of every browser test).
* At the end (``build-finished``): ``_static/live/`` gets Pyodide's core files, the pinned wheels
  (less the paths a wheel's ``drop`` in the lock lists: plotly's JavaScript bundles for Jupyter and
  its sample data, which Python in the browser never reads, 20 MB unpacked),
  the pure wheel of the package (``scripts/pure_wheel.py``; or the wheel ``PAGED_KV_PURE_WHEEL``
  names), the precompiled bytecode of the modules a panel loads and of that pure wheel when node
  can make it (``bytecode.zip``: ``live_assets.bytecode``, made by ``scripts/live_bytecode.mjs``
  for this wheel's sources, once per change of them), ``manifest.json`` (what the worker installs)
  and the live module and its worker (``book/_ext/live/*.mjs``).  As MathJax in
  ``offline_assets``: nothing comes from a CDN, ever.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from sphinx.util import logging

LOG = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[2]           # the repository (this file: book/_ext/)
HERE = Path(__file__).resolve().parent / "live"       # click.js, live.mjs, worker.mjs, lock.json
LIVE_ENV = "PAGED_KV_LIVE"                            # paged_kv.panels.page.LIVE_ENV
WHEEL_ENV = "PAGED_KV_PURE_WHEEL"
MARK = 'class="paged-kv-live'                         # a placeholder in a page's body
NO_FAVICON = '<link rel="icon" href="data:,">'        # an empty icon: no request for /favicon.ico


def _script(name: str):
    """``scripts/<name>.py`` as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"paged_kv_scripts_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def live_status() -> tuple[bool, str]:
    """``(on, why)``: whether this build has live mode, and the reason when it has not."""
    if os.environ.get(LIVE_ENV, "1").strip() == "0":
        return False, f"{LIVE_ENV}=0"
    left = _script("live_assets").missing()
    if left:
        return False, f"the runtime is not fetched ({len(left)} files missing under .live_assets/; " \
                      f"make assets fetches it, with npm)"
    return True, ""


def _wheel_lacks_panels(wheel: Path) -> bool:
    """Whether the pure wheel cannot run a panel (no ``paged_kv/panels/worker.py`` in it)."""
    with zipfile.ZipFile(wheel) as z:
        return "paged_kv/panels/worker.py" not in z.namelist()


def _config_inited(app, config):
    on, why = live_status()
    app.paged_kv_live_wheel = None
    if on:          # the pure wheel now, so that a wheel without the panels turns live mode off here
        app.paged_kv_live_tmp = tempfile.TemporaryDirectory()
        wheel = _pure_wheel(Path(app.paged_kv_live_tmp.name))
        if _wheel_lacks_panels(wheel):
            on, why = False, f"the pure wheel {wheel.name} has no paged_kv/panels (scripts/pure_wheel.py)"
        else:
            app.paged_kv_live_wheel = wheel
    os.environ[LIVE_ENV] = "1" if on else "0"        # the chapters' kernels inherit it
    app.paged_kv_live = on
    if not on:
        LOG.info("live_mode: live mode is not in this build: %s", why)


def _page_context(app, pagename, templatename, context, doctree):
    if not context.get("favicon_url"):       # the theme's <head> writes metatags as they are
        context["metatags"] = (context.get("metatags") or "") + NO_FAVICON
    if getattr(app, "paged_kv_live", False) and MARK in (context.get("body") or ""):
        context["script_files"] = [*context.get("script_files", []), "_static/live/click.js"]


def _pure_wheel(out: Path) -> Path:
    given = os.environ.get(WHEEL_ENV, "")
    if given:
        target = out / Path(given).name
        shutil.copy2(given, target)
        return target
    return _script("pure_wheel").build(out)


def _copy_wheel(src: Path, dest: Path, drop: list[str]) -> None:
    """``src`` to ``dest``, leaving out the members whose path starts with one of ``drop``."""
    if not drop:
        shutil.copy2(src, dest)
        return
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            if not any(info.filename.startswith(d) for d in drop):
                zout.writestr(info, zin.read(info))


def _build_finished(app, exception):
    if exception is not None or app.builder.format != "html" or not getattr(app, "paged_kv_live", False):
        return
    assets = _script("live_assets")
    dest = Path(app.outdir) / "_static" / "live"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(assets.DEST / "pyodide", dest / "pyodide")
    (dest / "wheels").mkdir()
    pins = assets.lock()
    for w in pins["wheels"]:
        _copy_wheel(assets.DEST / "wheels" / w["file"], dest / "wheels" / w["file"], w.get("drop", []))
    wheel = app.paged_kv_live_wheel
    shutil.copy2(wheel, dest / "wheels" / wheel.name)
    for name in ("click.js", "live.mjs", "worker.mjs"):
        shutil.copy2(HERE / name, dest / name)
    files = [w["file"] for w in pins["wheels"]] + [wheel.name]
    manifest = {"pyodide": pins["pyodide"]["version"], "wheels": [
        {"file": f, "bytes": (dest / "wheels" / f).stat().st_size,
         "sha256": hashlib.sha256((dest / "wheels" / f).read_bytes()).hexdigest()} for f in files],
        "bytecode": None}
    made = assets.bytecode(wheel)               # for this very wheel (cached by its sources)
    if made is not None:
        shutil.copy2(made, dest / "bytecode.zip")
        manifest["bytecode"] = "bytecode.zip"
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1))


def setup(app):
    app.connect("config-inited", _config_inited)
    app.connect("html-page-context", _page_context)
    app.connect("build-finished", _build_finished)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
