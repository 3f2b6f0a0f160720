"""Shared fixtures.  TRITON_INTERPRET is set here, before anything imports triton (no GPU here).

The suite checks kernels on CPU tensors under the Triton interpreter, also on a machine with a
GPU (set PAGED_KV_TEST_CUDA=1 to leave the interpreter off there, e.g. for the GPU-only tests).
"""

import functools
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

from paged_kv.blocks import BlockSpaceManager  # noqa: E402
from paged_kv.model import ModelConfig, TinyLlama  # noqa: E402


def serve_arrivals(engine, arrivals, max_steps: int = 5000) -> list:
    """Run ``arrivals`` = [(step, prompt, params)] through ``engine`` (an ``LLMEngine``), each added at
    its step, checking the scheduler after every step; returns [(request id, prompt, params)]."""
    pending, ids, step = sorted(arrivals, key=lambda a: a[0]), [], 0
    while pending or engine.has_unfinished_requests():
        assert step < max_steps, "the engine stopped making progress"
        while pending and pending[0][0] <= step:
            _, prompt, params = pending.pop(0)
            ids.append((engine.add_request(prompt, params), prompt, params))
        engine.step()
        engine.scheduler.check()
        step += 1
    return ids


def peak_blocks(prompt_len: int, n: int, max_tokens: int, block_size: int) -> int:
    """Brute force: the most blocks in use while ``n`` samples of a prompt each generate
    ``max_tokens``, measured by running the real block manager as a step does (allocate the prompt,
    fork the samples at its end, one token per sample per step; the last token is never fed back).
    Tests size pools with it instead of the formula they test."""
    big = 10_000
    m = BlockSpaceManager(big, block_size)
    m.allocate(0, prompt_len)
    peak = big - m.num_free_blocks
    for i in range(1, n):
        m.fork(0, i)
    for _ in range(max_tokens - 1):
        for i in range(n):
            m.append_slot(i)
        peak = max(peak, big - m.num_free_blocks)
    m.check()
    return peak


# ---------------------------------------------------------------------------------------------
# `make test` runs pytest-xdist, one worker per core, with `--dist loadscope` and the scopes below:
# a test file runs on one worker (its module fixtures are built once), and every file that uses the
# built book shares one worker (the book is built once).  (xdist's own `loadgroup` marks do not
# reach the scheduler under pytest 9: tried, each test went its own way.)  The files with a test
# that takes minutes come first (`--no-loadscope-reorder` keeps this order; xdist's default puts
# the files with the most tests first, and these have few), so that the two workers do not end
# with one of them alone on a long test.
# ---------------------------------------------------------------------------------------------
SLOW_MARKS = ("book", "browser", "assignments", "slow")


@functools.cache
def _uses_built_book(path: str) -> bool:
    file = ROOT / path
    return file.name.startswith("test_") and "built_book" in file.read_text()


def worker_scope(nodeid: str) -> str:
    """The worker scope of a test: ``"built_book"`` for the files that use the built book, else its file."""
    path = nodeid.split("::")[0]
    return "built_book" if _uses_built_book(path) else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under ``--dist loadscope``, schedule by :func:`worker_scope` (any other mode: xdist's own)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ScopeScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_scope(nodeid)

    return ScopeScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """The scopes that hold a slow test first (the built book, the longest, before them), each
    test's order otherwise kept."""
    slow = {}
    for item in items:
        scope = worker_scope(item.nodeid)
        slow[scope] = slow.get(scope, False) or any(item.get_closest_marker(m) for m in SLOW_MARKS)
    order = {id(item): k for k, item in enumerate(items)}
    items.sort(key=lambda item: (not slow[worker_scope(item.nodeid)], worker_scope(item.nodeid) != "built_book",
                                 order[id(item)]))


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
