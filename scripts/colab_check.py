"""``make colab-check``: the chapters as Colab runs them, with Colab's own package versions.

1. A Colab-like virtual environment (``--venv``, reused while this file and the pins are
   unchanged): Colab's plotly, ipywidgets and numpy (``COLAB_PINS``), a CPU torch (``--torch``,
   never a CUDA build), triton, and the tools that drive it (JupyterLab, nbclient, playwright).
   Not paged-kv: the first notebook's set-up cell installs it, with its own pip command, from
   this clone's committed ``HEAD`` (``PAGED_KV_REPO=file://<clone>@<commit>`` replaces the URL).
   A stand-in ``google.colab`` is imported at kernel start, as on Colab.
2. Every chapter's ``.ipynb`` (copied to a scratch folder, away from the clone) executed live,
   without ``PAGED_KV_BOOK``: chapters without a live panel by nbclient, the others by
   JupyterLab's *Run All Cells* in headless Chromium.  Any error or stderr output fails.
3. In the same JupyterLab page, every live panel's controls used as a reader uses them (clicks,
   typing, choosing from a list, arrow keys on a slider): after each action the panel's figure
   must change, and no widget may be blank.

Usage: ``python3 scripts/colab_check.py --venv .colab-venv --torch torch==2.13.0 --chromium
/usr/bin/chromium [--only 05_paged_attention]``.  Prints per-chapter and per-click timings.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Colab's versions (the runtime of late 2025: `pip list` in a fresh Colab session).
COLAB_PINS = ["plotly==5.24.1", "ipywidgets==7.7.1", "numpy==2.0.2"]
TOOLS = ["jupyterlab>=4.2", "nbclient>=0.10", "nbformat>=5.9", "ipykernel>=6", "playwright>=1.45", "pyyaml"]

COLAB_STANDIN = '''"""A stand-in for Colab's google.colab (make colab-check): what the set-up cell calls."""
import types
output = types.SimpleNamespace(enable_custom_widget_manager=lambda: None)
'''


def sh(cmd, **kw):
    print("+", " ".join(map(str, cmd)), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def build_venv(venv: Path, torch_spec: str) -> Path:
    """The Colab-like environment; rebuilt when the pins, the tools or the torch spec change."""
    py = venv / "bin" / "python"
    key = hashlib.sha256(repr((COLAB_PINS, TOOLS, COLAB_STANDIN, torch_spec)).encode()).hexdigest()[:16]
    stamp = venv / ".colab-check"
    if py.exists() and stamp.exists() and stamp.read_text() == key:
        return py
    t = time.time()
    sh([sys.executable, "-m", "venv", "--clear", str(venv)])
    pip = [str(py), "-m", "pip", "install", "-q"]
    sh(pip + ["--upgrade", "pip"])
    sh(pip + torch_spec.split())                 # first, so nothing below can pull a CUDA torch
    sh(pip + ["triton"] + COLAB_PINS + TOOLS)    # triton: Colab ships it with its torch
    site = Path(subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())
    (site / "google" / "colab").mkdir(parents=True, exist_ok=True)
    (site / "google" / "colab" / "__init__.py").write_text(COLAB_STANDIN)
    # JupyterLab: render every cell (no windowing), so widgets below the fold exist in the page.
    settings = venv / "share" / "jupyter" / "lab" / "settings"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "overrides.json").write_text('{"@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"},'
                                             ' "@jupyterlab/apputils-extension:notification": {"fetchNews": "false",'
                                             ' "checkForUpdates": false}}')
    stamp.write_text(key)
    print(f"venv built in {time.time() - t:.0f} s", flush=True)
    return py


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", default=".colab-venv")
    ap.add_argument("--torch", default="torch==2.13.0")
    ap.add_argument("--chromium", default="")
    ap.add_argument("--only", nargs="*", help="chapter names (e.g. 05_paged_attention); default: all")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--reuse-install", action="store_true",
                    help="keep a paged-kv installed by an earlier run (then --only skips the installing intro)")
    args = ap.parse_args(argv)
    venv = (ROOT / args.venv).resolve()
    py = build_venv(venv, args.torch)
    if args.build_only:
        return 0
    if subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", "HEAD", "--", "paged_kv", "kernels", "pyproject.toml"]).returncode:
        print("note: paged_kv/, kernels/ or pyproject.toml has uncommitted changes; the check installs HEAD", flush=True)
    if not args.reuse_install:   # the set-up cell installs it, as on a fresh Colab runtime
        sh([str(py), "-m", "pip", "uninstall", "-q", "-y", "paged-kv", "anywidget"])
        sh([str(py), "-m", "pip", "install", "-q"] + COLAB_PINS)   # what an earlier run upgraded
    commit = subprocess.check_output(["git", "-C", str(ROOT), "rev-parse", "HEAD"], text=True).strip()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PAGED_KV_BOOK", "VIRTUAL_ENV", "TRITON_INTERPRET")}
    env.update(PAGED_KV_REPO=f"file://{ROOT}@{commit}", PATH=f"{venv / 'bin'}:{env.get('PATH', '')}",
               COLAB_CHECK_CHROMIUM=args.chromium)
    driver = [str(py), str(ROOT / "scripts" / "colab_drive.py"), str(ROOT)] + (["--only", *args.only] if args.only else [])
    return subprocess.run(driver, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
