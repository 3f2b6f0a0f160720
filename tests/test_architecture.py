"""The package's layers, as rules a test can break (README, "Architecture").

* every module imports on its own, in a fresh interpreter;
* imports point one way: the leaves (errors, argument checks, units, defaults, sampling parameters)
  import nothing of ours but the exceptions they raise and the argument checks; each layer imports only the layers below it (``ALLOWED``); ``kernels/`` imports only the
  leaves; nothing below ``viz/`` and ``widgets/`` imports them;
* the pure-Python layers never import torch (read from their source, and checked at run time);
* no function-local import of our own modules (none is needed to dodge a cycle), and no import of
  a name or module that starts with an underscore from another module;
* ``import paged_kv`` is cheap and exposes every exception; the README's table matches the tree.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

LEAVES = {"errors", "validate", "units", "defaults", "sampling_params"}
PURE = {"memory", "blocks", "scheduling", "sim", "spec_decode"}             # pure Python: no torch, ever
# layer -> the layers of paged_kv it may import (besides itself); "kernels" is the top-level package.
ALLOWED = {
    "memory": LEAVES,
    "blocks": LEAVES,
    "spec_decode": LEAVES | {"blocks"},                  # replay.py drives the block manager
    "scheduling": LEAVES | {"blocks", "spec_decode"},
    "sim": LEAVES | {"memory", "blocks", "scheduling"},
    "model": LEAVES | {"kernels", "memory", "spec_decode"},
    "storage": LEAVES | {"kernels", "model", "blocks", "memory"},
    "decoding": LEAVES | {"model", "storage", "blocks", "spec_decode"},
    "engine": LEAVES | {"memory", "model", "storage", "blocks", "scheduling", "sim", "decoding", "spec_decode"},
    "viz": LEAVES | {"memory", "blocks", "sim", "spec_decode"},     # spec_decode.py draws replayed SpecSteps
    # the panel models run in Pyodide too: what they import must load without torch and numpy
    # (checked at run time by the pure-layers test below, not by this table)
    "panels": LEAVES | {"memory", "blocks", "scheduling", "model", "engine", "viz", "spec_decode"},
    "widgets": LEAVES | {"memory", "blocks", "spec_decode", "sim", "model", "storage", "decoding", "engine", "viz", "panels"},
}
OURS = ("paged_kv", "kernels")


def _modules(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py"))


def _dotted(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path):
    """``(node, absolute module names, imported names, inside a function)`` for every import, a
    ``lazy_loader.load("paged_kv...")`` (an import deferred to first use) counted as one."""
    tree = ast.parse(path.read_text())
    pkg = _dotted(path) if path.name == "__init__.py" else _dotted(path).rpartition(".")[0]
    out = []

    def visit(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.append((child, [a.name for a in child.names], [], in_function))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = pkg.split(".")
                    base = base[:len(base) - (child.level - 1)]
                    module = ".".join(base + ([child.module] if child.module else []))
                else:
                    module = child.module
                names = [a.name for a in child.names]
                targets = [module] if child.module else [f"{module}.{n}" for n in names]
                out.append((child, targets, names, in_function))
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr == "load" \
                    and isinstance(child.func.value, ast.Name) and child.func.value.id in ("lazy", "_lazy", "lazy_loader") \
                    and child.args and isinstance(child.args[0], ast.Constant) and isinstance(child.args[0].value, str):
                out.append((child, [child.args[0].value], [], in_function))   # lazy_loader.load: an import, deferred
            visit(child, inner)

    visit(tree, False)
    return out


def _layer(module: str) -> str | None:
    """``"kernels"``, a paged_kv layer (``"blocks"``, ``"errors"``...), ``"paged_kv"`` (the root),
    or None for a module not ours."""
    parts = module.split(".")
    if parts[0] == "kernels":
        return "kernels"
    if parts[0] != "paged_kv":
        return None
    return parts[1] if len(parts) > 1 else "paged_kv"


PACKAGE_FILES = _modules("paged_kv") + _modules("kernels")


# --- every module imports on its own ---------------------------------------------------------------
# One interpreter loads the third-party libraries once (torch, triton, plotly, ...), then forks a
# child per module of ours: each child starts with none of our modules loaded, so an import cycle
# or a missing import shows, and the test costs seconds instead of a torch import per module.
_FORK_EACH = """
import importlib, json, os, sys
for lib in ("numpy", "torch", "triton", "triton.language", "safetensors.torch", "plotly.graph_objects",
            "plotly.subplots", "ipywidgets", "IPython.display", "lazy_loader", "yaml"):
    try:
        importlib.import_module(lib)
    except ImportError:
        pass
assert not [m for m in sys.modules if m.split(".")[0] in ("paged_kv", "kernels")]
failed = {}
for name in json.loads(sys.argv[1]):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            importlib.import_module(name)
            msg = ""
        except BaseException as e:
            msg = f"{type(e).__name__}: {e}"
        os.write(w, msg.encode()[:2000])
        os._exit(0)
    os.close(w)
    msg = os.read(r, 4096).decode()
    os.close(r)
    os.waitpid(pid, 0)
    if msg:
        failed[name] = msg
print(json.dumps(failed))
"""


@pytest.mark.skipif(sys.platform == "win32", reason="os.fork: the suite runs on Linux (CI) and macOS")
def test_every_module_imports_alone_in_a_fresh_interpreter():
    names = [_dotted(p) for p in PACKAGE_FILES]
    proc = subprocess.run([sys.executable, "-c", _FORK_EACH, json.dumps(names)], capture_output=True, text=True,
                          cwd=ROOT, env={"TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    failed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(names) > 50 and not failed, f"modules that do not import on their own: {failed}"


# --- imports point one way ------------------------------------------------------------------------
@pytest.mark.parametrize("path", PACKAGE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down_the_layers(path):
    me = _layer(_dotted(path))
    for node, targets, _, _ in _imports(path):
        for target in targets:
            layer = _layer(target)
            if layer is None or layer == me:
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno} imports {target}"
            assert layer != "paged_kv", f"{where}: import the layer, not the package root"
            if me == "kernels":
                assert layer in LEAVES, f"{where}: kernels may import only the leaves {sorted(LEAVES)}"
            elif me in LEAVES:   # a leaf imports nothing of ours but the exceptions and the argument checks
                allowed = {"errors"} if me == "validate" else {"errors", "validate"}
                assert me != "errors" and layer in allowed, f"{where}: a leaf imports only {sorted(allowed)}"
            elif me == "paged_kv":
                continue   # the root's lazy table names the layers; it imports none of them
            else:
                assert layer in ALLOWED[me], f"{where}: {me} may import only {sorted(ALLOWED[me])}"


def test_every_layer_has_a_rule():
    layers = {p.name for p in (ROOT / "paged_kv").iterdir() if (p / "__init__.py").is_file()}
    leaves = {p.stem for p in (ROOT / "paged_kv").glob("*.py") if p.stem != "__init__"}
    assert layers == set(ALLOWED), "a new subpackage needs its row in ALLOWED (and the README)"
    assert leaves == LEAVES, f"top-level modules must be leaves: {sorted(leaves - LEAVES)}"


def test_viz_and_widgets_are_imported_by_nothing_below_them():
    for path in PACKAGE_FILES:
        me = _layer(_dotted(path))
        for node, targets, _, _ in _imports(path):
            for target in targets:
                layer = _layer(target)
                if layer == "widgets":
                    assert me == "widgets", f"{path.relative_to(ROOT)}:{node.lineno} imports widgets"
                if layer == "panels":
                    assert me in ("panels", "widgets"), f"{path.relative_to(ROOT)}:{node.lineno} imports panels"
                if layer == "viz":
                    assert me in ("viz", "panels", "widgets"), f"{path.relative_to(ROOT)}:{node.lineno} imports viz"


@pytest.mark.parametrize("path", [p for p in PACKAGE_FILES
                                  if _layer(_dotted(p)) in PURE | LEAVES],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_layers_never_import_torch(path):
    for node, targets, _, _ in _imports(path):
        for target in targets:
            top = target.split(".")[0]
            assert top not in ("torch", "triton", "safetensors", "kernels"), \
                f"{path.relative_to(ROOT)}:{node.lineno} imports {target} (this layer is pure Python)"


def _fresh(code: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={"TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_pure_layers_run_without_loading_torch():
    seen = _fresh(
        "import json, sys\n"
        "from paged_kv.sim import PAPER_SETUP, simulate, trace_from_rows, OrcaOracle\n"
        "from paged_kv.blocks import paper_trace\n"
        "from paged_kv.memory import plan_memory\n"
        "from paged_kv.scheduling import may_admit\n"
        "simulate(trace_from_rows([(0, 3, 2), (1, 2, 2)]), OrcaOracle(16, 8))\n"
        "paper_trace(); plan_memory('Llama-3-8B', 'H100', 8192)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', 'kernels'))))")
    assert seen == [], f"the pure layers loaded {seen[:5]}"


# --- the pure wheel's modules: neither torch nor numpy ----------------------------------------------
# What the browser build runs (issue 24), as scripts/pure_wheel.py lists it: the leaves, blocks,
# scheduling and memory (sim needs numpy), the torch-free modules of model, engine and viz, panels.
def _load_pure_wheel():
    spec = importlib.util.spec_from_file_location("pure_wheel", ROOT / "scripts" / "pure_wheel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pure_wheel = _load_pure_wheel()
NO_NUMPY_MODULES = pure_wheel.modules()
NO_NUMPY_FILES = [p for p in PACKAGE_FILES if _dotted(p) in set(NO_NUMPY_MODULES)]


def test_the_pure_modules_are_what_the_rules_say():
    """Whole layers for the pure ones and the panels; in model, engine and viz only named modules,
    each of which exists (a module moved or renamed must be renamed in the wheel's list too)."""
    names = set(NO_NUMPY_MODULES)
    assert {"paged_kv.validate", "paged_kv.blocks.manager", "paged_kv.scheduling.scheduler", "paged_kv.memory.plan",
            "paged_kv.engine.llm_engine", "paged_kv.engine.live", "paged_kv.engine.timing_runner",
            "paged_kv.engine.token_source", "paged_kv.model.tokenizer", "paged_kv.viz.blocks",
            "paged_kv.panels.base"} <= names
    tree = {_dotted(p) for p in PACKAGE_FILES}
    assert names <= tree, f"listed for the wheel but not in the tree: {sorted(names - tree)}"
    for layer in {*PURE, *LEAVES, "panels"} - {"sim"}:
        mine = {n for n in tree if _layer(n) == layer}
        assert mine <= names, f"{layer} goes whole into the pure wheel: missing {sorted(mine - names)}"
    assert not [n for n in names if _layer(n) in ("sim", "storage", "decoding", "widgets", "kernels")]


@pytest.mark.parametrize("path", NO_NUMPY_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_modules_import_neither_torch_nor_numpy_at_the_top(path):
    """Read from the source: no module-level import of torch, numpy or our torch modules (a
    function may import numpy for a numpy argument, as ``validate.numeric_array`` does)."""
    names = set(NO_NUMPY_MODULES)
    typing_only = {n.lineno for block in ast.walk(ast.parse(path.read_text())) if isinstance(block, ast.If)
                   and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
                   for inner in block.body for n in ast.walk(inner) if hasattr(n, "lineno")}
    for node, targets, _, in_function in _imports(path):
        for target in targets:
            top = target.split(".")[0]
            where = f"{path.relative_to(ROOT)}:{node.lineno} imports {target}"
            if in_function or node.lineno in typing_only:      # run only when called, or never
                continue
            assert top not in ("torch", "triton", "safetensors", "kernels", "numpy", "IPython", "ipywidgets"), where
            lazy = isinstance(node, ast.Call)
            if top == "paged_kv" and not lazy:
                assert target in names or _layer(target) is not None and any(n.startswith(target + ".") for n in names), \
                    f"{where}, which is not in the pure wheel (load it lazily, on first use, or add it)"


# A finder first on sys.meta_path: importing any of these raises ImportError, as where they are absent.
_BLOCKED = ("torch", "numpy", "triton", "safetensors", "kernels", "IPython", "ipywidgets")
_BLOCK = f"""
import importlib, json, sys
class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {_BLOCKED!r}:
            raise ImportError(f"{{name}} is blocked (the pure layers must not need it)")
sys.meta_path.insert(0, _Blocked())
"""
# A little of each layer, as plain data; run with the libraries blocked and in this process (numpy
# loaded): the two must agree.
_EXERCISE = """
def exercise():
    from paged_kv.blocks import BlockAllocator, BlockSpaceManager
    from paged_kv.errors import ConfigError, OutOfBlocksError
    from paged_kv.memory import plan_memory, tiny_spec
    from paged_kv.scheduling import Scheduler, SchedulerConfig
    from paged_kv.validate import count
    r = {}
    a = BlockAllocator(4)
    ids = [a.allocate() for _ in range(4)]
    try:
        a.allocate()
        r["fifth"] = "allocated"
    except OutOfBlocksError:
        r["fifth"] = "OutOfBlocksError"
    for i in ids:
        a.free(i)
    r["allocated"], r["free_after"] = sorted(ids), a.num_free_blocks
    m = BlockSpaceManager(8, 4)
    m.allocate(0, 6)
    m.fork(0, 1)
    m.append_slot(1)                               # the shared last block is copied on write
    r["manager_free"], r["tables"] = m.num_free_blocks, [list(m.block_table(s).block_ids) for s in (0, 1)]
    m.check()
    sch = Scheduler(SchedulerConfig(num_gpu_blocks=8, block_size=4, watermark=0.0))
    sch.add("a", [1, 2, 3, 4, 5], max_tokens=2)
    steps = []
    while sch.has_unfinished:
        out = sch.schedule()
        steps.append([(c.seq_id, list(c.token_ids), list(c.slot_mapping)) for c in out.chunks])
        sch.update(out, {c.seq_id: [9] * c.num_samples for c in out.chunks if c.sample})
    r["steps"], r["sched_free"] = steps, sch.manager.num_free_blocks
    plan = plan_memory("Llama-3-8B", "H100", 8192)
    r["plan"] = [plan.kv_bytes_per_token, plan.kv_budget_bytes, plan.max_batch_size]
    r["tiny_layers"] = tiny_spec().num_layers      # read from the bundled config.json
    try:
        count("n", True)
        r["bool"] = "accepted"
    except ConfigError:
        r["bool"] = "ConfigError"
    r["count"] = count("n", 3)
    # the engine loop on a timing model, its tokens from recorded continuations (the browser's ch7)
    from paged_kv.engine import EngineConfig, LLMEngine, LiveRequests, RecordedTokens, SwapTime, TimingRunner
    from paged_kv.engine.metrics import percentile, summarize
    from paged_kv.memory import IterationTime
    from paged_kv.model import ByteTokenizer
    from paged_kv.sampling_params import SamplingParams
    tok = ByteTokenizer()
    source = RecordedTokens({"The cat": " sat on the mat."}, tok)
    runner = TimingRunner(IterationTime(0.01, 0.001, 0.0005), SwapTime(1024, 2), block_size=4, next_token=source)
    e = LLMEngine(None, EngineConfig(num_gpu_blocks=8, block_size=4, watermark=0.0), tok, runner=runner)
    for prompt, n in (("The cat", 16), ("hello", 7)):
        e.add_request(prompt, SamplingParams(max_tokens=n))
    while e.has_unfinished_requests():
        e.step()
    outs = e.outputs()
    r["texts"] = [o.text[0] for o in outs]
    r["ttft"] = [o.ttft for o in outs]
    r["clock"], r["preemptions"] = e.clock, e.stats.preemptions
    r["p90"], r["summary"] = percentile(r["ttft"] + [0.5, 0.25], 90), summarize([0.3, 0.1, 0.2, 0.7])
    # the live block panel's loop without a model (the browser's ch5 and ch6)
    live = LiveRequests(None, tok, num_blocks=6, block_size=4, next_token=source)
    s = live.add("The cat")
    live.step()
    child = live.fork(s)
    live.step()
    live.step()
    r["live"] = [live.text(s), live.text(child), live.manager.num_free_blocks, source.is_recorded(tok.encode("xy"))]
    import hashlib
    import plotly.io as pio
    from paged_kv.viz import TEMPLATE, line_figure
    pio.templates.default = TEMPLATE          # as the worker and the book set it, whoever ran first
    fig = line_figure(range(3), {"used": [1, 2, 3]}, "blocks", "step", "blocks")
    r["figure_sha"] = hashlib.sha256(pio.to_json(fig).encode()).hexdigest()
    # chapter 9: speculation replayed through the block manager, and its figures
    from paged_kv.spec_decode import NgramProposer, replay_speculation
    from paged_kv.viz.spec_decode import acceptance_rows, rollback_figure, speedup_figure
    spec = replay_speculation([1, 2, 3, 1, 2], [3, 4, 1, 2, 3, 1], NgramProposer(3, 2), block_size=2, num_blocks=6)
    fig = rollback_figure(spec)
    r["spec"] = [acceptance_rows({3: spec}, "ngram"), hashlib.sha256(pio.to_json(fig).encode()).hexdigest(),
                 list(speedup_figure("Llama-3-8B", "H100", ks=[2], alpha=0.5, batches=[1, 512]).data[1].y)]
    return r
"""
_RUN = """
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
result = exercise()
import paged_kv
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {_BLOCKED!r})
# a module lazy_loader.load left for later (torch's side) is looked at without loading it
ours = [(n, m) for n, m in list(sys.modules.items()) if n.split(".")[0] == "paged_kv"]
deferred = sorted(n for n, m in ours if type(m).__name__ == "_LazyModule")
files = sorted({{getattr(m, "__file__", None) or "" for n, m in ours if n not in deferred}})
print(json.dumps({{"result": result, "loaded": loaded, "files": files, "deferred": deferred}}))
""".format(_BLOCKED=_BLOCKED)


def _expected() -> dict:
    """The exercise run here, numpy loaded; and a few facts it must show whatever the code does."""
    ns: dict = {}
    exec(_EXERCISE, ns)
    r = json.loads(json.dumps(ns["exercise"]()))   # tuples as lists, as they come back from JSON
    assert r["free_after"] == 4 and r["allocated"] == [0, 1, 2, 3] and r["fifth"] == "OutOfBlocksError"
    assert r["manager_free"] == 8 - 3                # 2 blocks for 6 tokens, 1 copied on write
    assert [tok for _, tok, _ in r["steps"][0]] == [[1, 2, 3, 4, 5]] and len(r["steps"]) == 2
    assert r["sched_free"] == 8 and r["bool"] == "ConfigError" and r["count"] == 3
    from paged_kv.memory import model_preset
    spec = model_preset("Llama-3-8B")
    assert r["plan"][0] == 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 2   # K and V, fp16
    assert r["texts"] == [" sat on the mat.", "hellohe"]    # recorded; the stand-in repeats the prompt
    assert r["live"][:2] == ["The cat sat", "The cat sat"] and r["live"][3] is False
    assert r["spec"][0][0]["k"] == 3 and r["spec"][0][0]["drafted"] > r["spec"][0][0]["accepted"] > 0
    assert r["spec"][0][0]["blocks_freed"] > 0                  # the figure draws a freed block
    import numpy as np
    assert r["p90"] == float(np.percentile(r["ttft"] + [0.5, 0.25], 90))
    assert r["summary"]["mean"] == float(np.mean([0.3, 0.1, 0.2, 0.7]))
    return r


def _run_blocked(argv: list[str], cwd: Path, prefix: str = "") -> dict:
    code = prefix + _BLOCK + _EXERCISE + _RUN
    proc = subprocess.run([*argv, "-c", code, json.dumps(NO_NUMPY_MODULES)], capture_output=True, text=True,
                          cwd=cwd, env={"PATH": "/usr/bin:/bin"}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_pure_layers_import_and_run_with_torch_and_numpy_blocked():
    seen = _run_blocked([sys.executable], ROOT)
    assert seen["loaded"] == [], f"loaded despite the block: {seen['loaded']}"
    # the torch side of the engine and the live loop: named, never loaded
    assert {"paged_kv.storage", "paged_kv.engine.runner", "paged_kv.model.sampling"} <= set(seen["deferred"])
    assert seen["result"] == _expected()


def test_pure_wheel_holds_the_pure_modules_and_runs_from_its_contents(tmp_path):
    import importlib.metadata
    import zipfile
    wheel = pure_wheel.build(tmp_path / "dist")
    full = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert wheel.name == f"paged_kv_pure-{full}-py3-none-any.whl", "the pure wheel has the full wheel's version"
    size = wheel.stat().st_size
    assert size < 400_000, f"the pure wheel is {size} bytes"         # 0.21 MB when written (2026-12)
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        z.extractall(tmp_path / "site")
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    modules = sorted(n[:-3].replace("/", ".").removesuffix(".__init__") for n in names if n.endswith(".py"))
    assert modules == NO_NUMPY_MODULES, "the wheel holds the pure modules, nothing else"
    data = sorted(n for n in names if not n.endswith(".py") and ".dist-info/" not in n)
    assert data == pure_wheel.data_files() and "paged_kv/model/weights/config.json" in data, data
    assert not [n for n in names if n.endswith((".safetensors", ".bin", ".pt", ".pth", ".npz"))]
    requires = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    assert [r.split(">")[0].split("=")[0].strip() for r in requires] == ["lazy_loader", "plotly"], requires
    # No site-packages (-S), no environment or working folder on sys.path (-I): only the wheel's
    # contents and copies of its dependencies, metadata included (plotly reads its version; its own
    # dependencies: narwhals, packaging).
    deps = tmp_path / "deps"
    for dist in ("lazy_loader", "plotly", "narwhals", "packaging"):
        for f in importlib.metadata.distribution(dist).files:
            if ".." in f.parts or "__pycache__" in f.parts:           # scripts outside site-packages
                continue
            (deps / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f.locate(), deps / f)
    prefix = f"import sys\nsys.path[:0] = [{str(tmp_path / 'site')!r}, {str(deps)!r}]\n"
    seen = _run_blocked([sys.executable, "-I", "-S"], tmp_path, prefix)
    assert seen["loaded"] == []
    assert seen["files"] and all(f.startswith(str(tmp_path / "site")) for f in seen["files"]), seen["files"][:3]
    assert seen["result"] == _expected()


LAZY_TARGETS = sorted({t for p in PACKAGE_FILES for node, targets, _, _ in _imports(p) if isinstance(node, ast.Call)
                       for t in targets})


def test_a_module_named_for_later_is_still_found_through_its_package():
    """``lazy_loader.load`` leaves a module in ``sys.modules`` that its package does not bind, so
    ``import paged_kv.storage; paged_kv.storage.X`` fails unless the package's lazy ``__init__``
    lists it among its submodules: checked for every such module, after its users are imported."""
    assert {"paged_kv.storage", "paged_kv.engine.runner", "paged_kv.model.sampling"} <= set(LAZY_TARGETS)
    users = sorted({_dotted(p) for p in PACKAGE_FILES for node, _, _, _ in _imports(p) if isinstance(node, ast.Call)})
    seen = _fresh("import importlib, json, sys\n"
                  f"for name in {users!r}:\n    importlib.import_module(name)\n"
                  "bad = []\n"
                  f"for name in {LAZY_TARGETS!r}:\n"
                  "    parent, _, child = name.rpartition('.')\n"
                  "    importlib.import_module(name)\n"
                  "    try:\n        getattr(sys.modules[parent], child).__name__\n"
                  "    except AttributeError as e:\n        bad.append(f'{name}: {e}')\n"
                  "print(json.dumps(bad))")
    assert seen == [], seen


def test_kernels_load_only_the_leaves_of_paged_kv():
    seen = _fresh("import json, sys\nimport kernels, kernels.bench\n"
                  "print(json.dumps(sorted(m for m in sys.modules if m.startswith('paged_kv'))))")
    assert set(seen) <= {"paged_kv"} | {f"paged_kv.{leaf}" for leaf in LEAVES}, seen


def test_import_paged_kv_is_cheap_and_exposes_every_exception():
    seen = _fresh("import json, sys\nimport paged_kv\n"
                  "print(json.dumps([sorted(paged_kv.__all__), 'torch' in sys.modules]))")
    names, torch_loaded = seen
    assert not torch_loaded, "import paged_kv loaded torch"
    from paged_kv import errors
    exceptions = {n for n, obj in vars(errors).items() if inspect.isclass(obj) and issubclass(obj, Exception)
                  and obj.__module__ == errors.__name__}
    assert exceptions <= set(names), f"not exposed by paged_kv: {sorted(exceptions - set(names))}"
    assert 25 <= len(names) - len(exceptions) <= 40, "import paged_kv exposes the names chapters share"
    import paged_kv
    for name in names:   # every lazy name resolves
        assert getattr(paged_kv, name) is not None


# --- no hidden cycles, no private names across modules ------------------------------------------------
def test_no_function_local_import_of_our_own_modules():
    for path in PACKAGE_FILES:
        for node, targets, _, in_function in _imports(path):
            ours = [t for t in targets if t.split(".")[0] in OURS]
            assert not (in_function and ours), \
                f"{path.relative_to(ROOT)}:{node.lineno}: function-local import of {ours} (move it to the top)"


SOURCES = PACKAGE_FILES + sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "scripts").glob("*.py")) \
    + sorted((ROOT / "benchmarks").glob("*.py"))


def test_no_import_of_an_underscore_name_from_another_module():
    bad = []
    for path in SOURCES:
        for node, targets, names, _ in _imports(path):
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            private += [t for t in targets if t.split(".")[0] in OURS
                        and any(part.startswith("_") and not part.startswith("__") for part in t.split("."))]
            if private:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} {private}")
    # the chapters' code cells too
    pattern = re.compile(r"^\s*(from\s+(paged_kv|kernels)[\w.]*\s+import\s+.*\b_[a-z]\w*|"
                         r"(from|import)\s+(paged_kv|kernels)(\.\w+)*\._[a-z]\w*)", re.M)
    for md in sorted((ROOT / "book").glob("*.md")):
        bad += [f"{md.name}: {m.group(0).strip()}" for m in pattern.finditer(md.read_text())]
    assert not bad, f"imports of private names: {bad}"


# --- the README's map ------------------------------------------------------------------------------
def _readme_rows() -> dict[str, set[str]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Architecture", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\|\s*`([\w/.]+)`\s*\|(.*)\|\s*$", line)
        if m:
            rows[m.group(1)] = set(re.findall(r"`(\w+\.py)`", m.group(2)))
    return rows


def test_readme_architecture_table_matches_the_tree():
    rows = _readme_rows()
    folders = {"paged_kv/": ROOT / "paged_kv", "kernels/": ROOT / "kernels"}
    folders |= {f"paged_kv/{p.name}/": p for p in (ROOT / "paged_kv").iterdir() if (p / "__init__.py").is_file()}
    assert set(rows) == set(folders), f"README rows {sorted(rows)} vs folders {sorted(folders)}"
    for key, folder in folders.items():
        files = {p.name for p in folder.glob("*.py") if p.name != "__init__.py"}
        assert rows[key] == files, f"README row {key}: lists {sorted(rows[key])}, the folder has {sorted(files)}"
