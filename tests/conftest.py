"""Shared fixtures.  TRITON_INTERPRET is set here, before anything imports triton (no GPU here).

The suite checks kernels on CPU tensors under the Triton interpreter, also on a machine with a
GPU (set PAGED_KV_TEST_CUDA=1 to leave the interpreter off there, e.g. for the GPU-only tests).
"""

import os

if os.environ.get("PAGED_KV_TEST_CUDA", "0") in ("", "0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under `make test` (pytest-xdist, one worker per core) each worker and the notebook kernels it
# starts get their share of the cores, instead of every torch spinning a thread per core.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _share = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ.setdefault("OMP_NUM_THREADS", str(_share))

import pytest  # noqa: E402
import torch  # noqa: E402

from paged_kv.model import ModelConfig, TinyLlama  # noqa: E402


# Marks of the tests that take minutes: under `make test` their files start first, so that the
# two workers do not end with one of them alone on a long test (xdist's default order puts the
# files with the most tests first, and these have few).
SLOW_MARKS = ("book", "browser", "assignments", "slow")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """For ``--dist loadgroup``: a test file runs on one worker (its module fixtures are built once),
    every test that uses the built book shares one worker (the book is built once), and the groups
    with a slow test come first (``make test`` passes ``--no-loadscope-reorder`` to keep this order)."""
    groups = {}
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            group = "built_book" if "built_book" in item.fixturenames else item.nodeid.split("::")[0]
            item.add_marker(pytest.mark.xdist_group(group))
        name = item.get_closest_marker("xdist_group").args[0]
        slow = any(item.get_closest_marker(m) for m in SLOW_MARKS)
        groups[name] = groups.get(name, False) or slow
    order = {id(item): k for k, item in enumerate(items)}
    items.sort(key=lambda item: (not groups[item.get_closest_marker("xdist_group").args[0]], order[id(item)]))


@pytest.fixture(scope="session")
def small_cfg() -> ModelConfig:
    """A small random model config: GQA (4 query heads, 2 KV heads), head_dim 16."""
    return ModelConfig(vocab_size=256, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                       intermediate_size=128, max_seq_len=128)


@pytest.fixture(scope="session")
def small_model(small_cfg) -> TinyLlama:
    torch.manual_seed(0)
    return TinyLlama(small_cfg).eval()


# ---------------------------------------------------------------------------------------------
# The built book, shared by tests/book/test_book.py and tests/book/test_browser.py (built once per run).
# ---------------------------------------------------------------------------------------------
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import yaml  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def toc_files() -> list[str]:
    """Source paths (no suffix) of every page in _toc.yml, root first."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [toc["root"]] + [c["file"] for c in toc.get("chapters", [])]


@pytest.fixture(scope="session")
def built_book() -> Path:
    """Build the book strictly (warnings are errors, every notebook executed); return _build/html."""
    jb = Path(sys.executable).parent / "jupyter-book"
    env = {**os.environ, "PAGED_KV_BOOK": "1"}
    proc = subprocess.run([str(jb), "build", str(ROOT), "--all", "-W", "-n", "--keep-going"],
                          env=env, capture_output=True, text=True, timeout=1500)
    log = proc.stdout[-6000:] + proc.stderr[-6000:]
    assert proc.returncode == 0, f"jupyter-book build failed:\n{log}"
    return ROOT / "_build" / "html"
