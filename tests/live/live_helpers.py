"""What the live-mode tests share (imported by them; not a conftest, whose name tests/conftest.py holds):
the fetched runtime, the pure wheel, CPython's figure hashes."""

import hashlib
import importlib.util
import os
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def script(name: str):
    """``scripts/<name>.py`` as a module."""
    spec = importlib.util.spec_from_file_location(f"live_test_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def live_assets() -> Path:
    """``.live_assets/`` with the pinned runtime (skips when ``make assets`` could not fetch it)."""
    assets = script("live_assets")
    left = assets.missing(check_hashes=True)
    if left:
        pytest.skip(f"live mode's runtime is not fetched ({len(left)} files missing; `make assets`, needs npm)")
    return assets.DEST


@pytest.fixture(scope="session")
def pure_wheel(tmp_path_factory) -> Path:
    """The pure wheel the book ships (``PAGED_KV_PURE_WHEEL`` if set, else built by
    scripts/pure_wheel.py); skips when it does not yet carry the panels."""
    given = os.environ.get("PAGED_KV_PURE_WHEEL")
    wheel = Path(given) if given else script("pure_wheel").build(tmp_path_factory.mktemp("pure"))
    names = zipfile.ZipFile(wheel).namelist()
    if "paged_kv/panels/worker.py" not in names or "paged_kv/viz/calculator.py" not in names:
        pytest.skip("the pure wheel does not carry paged_kv.panels and paged_kv.viz yet (scripts/pure_wheel.py)")
    return wheel


def cpython_hashes(name: str, actions=None, args=None) -> list[str]:
    """sha256 of the figure JSON of panel ``name``'s first figure and after each action
    (default: its ``demo_actions``), computed here in CPython under the worker's plotly settings."""
    from paged_kv.panels import figure_json, registry, step
    from paged_kv.panels import worker  # noqa: F401  (the book's plotly settings, as in the browser)

    model = registry.create(name, args or {})
    result = step(model, model.initial(), None)
    out = [hashlib.sha256(figure_json(result.figure).encode()).hexdigest()]
    for a in model.demo_actions if actions is None else actions:
        result = step(model, result.state, a)
        out.append(hashlib.sha256(figure_json(result.figure).encode()).hexdigest())
    return out
