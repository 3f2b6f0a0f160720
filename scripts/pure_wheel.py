"""Build the pure wheel: the layers of paged-kv that need neither torch nor numpy, for the browser.

``paged_kv_pure-<version>-py3-none-any.whl`` in ``dist/`` holds the leaves (``errors``,
``validate``, ``units``, ``defaults``, ``sampling_params``), ``paged_kv/__init__.py``, the pure
layers ``blocks``, ``scheduling`` and ``memory``, and the bundled model's ``config.json`` (read by
``memory.tiny_spec``), but no weights (the full wheel's 5.9 MB of ``.safetensors``) and no other
layer: ``sim`` needs numpy, ``model`` and up need torch.  Its one dependency is ``lazy_loader``
(pure Python), which ``import paged_kv`` uses; the lazy names of the layers it leaves out raise
``ModuleNotFoundError`` on first use.

The sources are copied as they are into a staging folder with a small ``pyproject.toml``, and
setuptools' own backend builds it there (no download, no build isolation: a second or two).
``tests/test_architecture.py`` builds it, checks its size and contents, and imports every module
from it with torch and numpy blocked.

Usage: ``python scripts/pure_wheel.py [OUT_DIR]`` (default ``dist/``; ``make pure-wheel``); prints
the wheel's path.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAME = "paged_kv_pure"
LEAVES = ("__init__", "errors", "validate", "units", "defaults", "sampling_params")
LAYERS = ("blocks", "scheduling", "memory")          # pure Python, no numpy (sim needs numpy)
DATA = ("model/weights/config.json",)                 # read by memory.presets.tiny_spec


def version(root: Path = ROOT) -> str:
    """``paged_kv.__version__``, read from the source (importing the package is not needed)."""
    m = re.search(r'^__version__ = "([^"]+)"', (root / "paged_kv" / "__init__.py").read_text(), re.M)
    if m is None:
        raise SystemExit("paged_kv/__init__.py has no __version__ line")
    return m.group(1)


def _pyproject(ver: str) -> str:
    packages = ", ".join(f'"{p}"' for p in ("paged_kv", *(f"paged_kv.{layer}" for layer in LAYERS)))
    data = ", ".join(f'"{d}"' for d in DATA)
    return f"""[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "{NAME}"
version = "{ver}"
description = "paged-kv's pure-Python layers (blocks, scheduling, memory): no torch, no numpy, no weights"
requires-python = ">=3.10"
license = "MIT"
dependencies = ["lazy_loader>=0.4"]

[tool.setuptools]
packages = [{packages}]
include-package-data = false

[tool.setuptools.package-data]
"paged_kv" = [{data}]
"""


def build(out_dir: Path) -> Path:
    """Build the wheel into ``out_dir`` (created if missing) and return its path.

    Raises:
        SystemExit: setuptools failed (its output is shown).
    """
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    ver = version()
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp)
        pkg = stage / "paged_kv"
        pkg.mkdir()
        for leaf in LEAVES:
            shutil.copy2(ROOT / "paged_kv" / f"{leaf}.py", pkg)
        for layer in LAYERS:
            shutil.copytree(ROOT / "paged_kv" / layer, pkg / layer,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for d in DATA:
            (pkg / d).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / "paged_kv" / d, pkg / d)
        (stage / "pyproject.toml").write_text(_pyproject(ver))
        code = ("import sys, setuptools.build_meta as b; "
                "print(b.build_wheel(sys.argv[1]))")
        proc = subprocess.run([sys.executable, "-c", code, str(stage / "out")], cwd=stage,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"building the pure wheel failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        name = proc.stdout.strip().splitlines()[-1]
        target = out_dir / name
        shutil.copy2(stage / "out" / name, target)
    return target


if __name__ == "__main__":
    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "dist"))
