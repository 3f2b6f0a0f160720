"""Build the pure wheel: the modules of paged-kv that need neither torch nor numpy, for the browser.

``paged_kv_pure-<version>-py3-none-any.whl`` in ``dist/`` holds the leaves (``errors``,
``validate``, ``units``, ``defaults``, ``sampling_params``), ``paged_kv/__init__.py``, the pure
layers ``blocks``, ``scheduling``, ``memory`` and ``spec_decode`` whole, the torch-free modules of ``model``
(config, tokenizer, reduction order), ``engine`` (the engine loop, its timing runner, the live
block panel's loop, outputs, metrics, token sources) and ``viz`` (every figure module but
``fragmentation``, which needs numpy, and ``text``, which needs IPython), the ``panels`` package
whole with its JSON data (the recorded continuations), and the bundled model's ``config.json``
(read by ``memory.tiny_spec``), but no weights (the full wheel's 5.9 MB of ``.safetensors``) and
no other module: ``sim`` needs numpy, the rest of ``model`` and up need torch.  Its dependencies
are pure Python: ``lazy_loader`` (the lazy ``__init__`` files) and ``plotly`` (the figures).  A
lazy name whose module is left out raises ``ModuleNotFoundError`` on first use.

The sources are copied as they are into a staging folder with a small ``pyproject.toml``, and
setuptools' own backend builds it there (no download, no build isolation: a second or two).
``tests/test_architecture.py`` builds it, checks its size and contents, and imports every module
from it in a fresh interpreter with torch and numpy blocked.

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
LAYERS = ("blocks", "scheduling", "memory", "spec_decode")          # pure Python, no numpy (sim needs numpy), whole
# Of these layers only the modules named (their __init__ files are lazy: they import nothing heavy).
PARTS = {
    "model": ("__init__", "config", "tokenizer", "reduction_order"),
    "engine": ("__init__", "config", "live", "llm_engine", "metrics", "outputs", "runner_output", "step_record",
               "timing_runner", "token_source"),
    "viz": ("__init__", "attention", "blocks", "calculator", "controls", "cost", "gpu_results", "kernel_walk",
            "labels", "logical_view", "memory", "palette", "prefix_cache", "serving", "sharing", "spec_decode"),
}
PACKAGES = ("panels",)                               # whole, with their JSON data (*.json)
DATA = ("model/weights/config.json",)                 # read by memory.presets.tiny_spec
DEPENDENCIES = ("lazy_loader>=0.4", "plotly>=6.0")


def modules(root: Path = ROOT) -> list[str]:
    """The dotted names of every module the wheel holds, sorted (packages by their own name)."""
    names = ["paged_kv" if leaf == "__init__" else f"paged_kv.{leaf}" for leaf in LEAVES]
    for layer in (*LAYERS, *PACKAGES):
        for path in sorted((root / "paged_kv" / layer).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    for layer, files in PARTS.items():
        names += [f"paged_kv.{layer}" if f == "__init__" else f"paged_kv.{layer}.{f}" for f in files]
    return sorted(names)


def data_files(root: Path = ROOT) -> list[str]:
    """The wheel's files that are not Python, as paths inside it (``paged_kv/...``), sorted."""
    found = [f"paged_kv/{d}" for d in DATA]
    for package in PACKAGES:
        found += [p.relative_to(root).as_posix() for p in (root / "paged_kv" / package).rglob("*.json")]
    return sorted(found)


def version(root: Path = ROOT) -> str:
    """``paged_kv.__version__``, read from the source (importing the package is not needed)."""
    m = re.search(r'^__version__ = "([^"]+)"', (root / "paged_kv" / "__init__.py").read_text(), re.M)
    if m is None:
        raise SystemExit("paged_kv/__init__.py has no __version__ line")
    return m.group(1)


def _pyproject(ver: str, packages: list[str]) -> str:
    listed = ", ".join(f'"{p}"' for p in packages)
    data = ", ".join(f'"{d}"' for d in DATA)
    deps = ", ".join(f'"{d}"' for d in DEPENDENCIES)
    package_data = "".join(f'"paged_kv.{p}" = ["*.json"]\n' for p in PACKAGES)
    return f"""[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "{NAME}"
version = "{ver}"
description = "paged-kv's pure-Python modules (blocks, scheduling, memory, the engine loop, figures, panels): no torch, no numpy, no weights"
requires-python = ">=3.10"
license = "MIT"
dependencies = [{deps}]

[tool.setuptools]
packages = [{listed}]
include-package-data = false

[tool.setuptools.package-data]
"paged_kv" = [{data}]
{package_data}"""


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
        for layer in (*LAYERS, *PACKAGES):
            shutil.copytree(ROOT / "paged_kv" / layer, pkg / layer,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for layer, files in PARTS.items():
            (pkg / layer).mkdir()
            for f in files:
                shutil.copy2(ROOT / "paged_kv" / layer / f"{f}.py", pkg / layer)
        for d in DATA:
            (pkg / d).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / "paged_kv" / d, pkg / d)
        packages = sorted({str(p.parent.relative_to(stage)).replace("/", ".") for p in pkg.rglob("__init__.py")})
        (stage / "pyproject.toml").write_text(_pyproject(ver, packages))
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
