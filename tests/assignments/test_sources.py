"""The graded assignments' sources, without running nbgrader: in sync, well formed, fair.

* the nbgrader source notebooks and the committed release agree with the MyST sources;
* every hidden-test region carries the marker, and the marker reaches no release, wheel or book;
* the tests are right: with the package's own implementations standing in for a student's
  answers (the package is the reference the tasks follow), every visible and hidden test passes;
* the kernel of the solved paged-decode assignment compiles for sm_75, sm_80 and sm_90.
"""

import json
import os
import re
import subprocess
import sys
import textwrap
import zipfile

import nbformat
import pytest
import yaml

from conftest import ROOT

sys.path.insert(0, str(ROOT / "assignments"))
import course  # noqa: E402

MARKER = "PKV-HIDDEN-TEST-7Q3X"
NAMES = course.assignment_names()
HELPERS = (ROOT / "assignments" / "helpers.py").read_text()


def built(name):
    return course.build_notebook(ROOT / "assignments" / "source" / name / f"{name}.md", HELPERS)


def nbgrader_cells(nb):
    return [c for c in nb.cells if "nbgrader" in c.metadata]


def test_there_are_eight_assignments_in_order():
    assert NAMES == ["a1_decoding", "a2_kv_ledger", "a3_blocks", "a4_paged_kernel", "a5_copy_on_write",
                     "a6_scheduling", "a7_prefix_caching", "a8_speculative_decoding"]


@pytest.mark.parametrize("name", NAMES)
def test_source_notebook_is_built_from_its_markdown(name):
    committed = nbformat.read(ROOT / "assignments" / "source" / name / f"{name}.ipynb", as_version=4)
    fresh = built(name)
    assert [(c.id, c.cell_type, c.source, c.metadata) for c in committed.cells] == \
        [(c.id, c.cell_type, c.source, c.metadata) for c in fresh.cells], \
        f"{name}.ipynb is out of date: run `make assignments`"
    assert all(not c.get("outputs") for c in committed.cells if c.cell_type == "code")


@pytest.mark.parametrize("name", NAMES)
def test_source_is_well_formed(name):
    nb = built(name)
    cells = nbgrader_cells(nb)
    ids = [c.metadata.nbgrader["grade_id"] for c in cells]
    assert ids[:2] == ["setup", "helpers"], "the locked set-up and helpers cells come first"
    graded = [c for c in cells if c.metadata.nbgrader["grade"]]
    assert graded and all(c.metadata.nbgrader["locked"] and c.metadata.nbgrader["points"] > 0 for c in graded)
    for i, c in enumerate(cells):   # nbgrader re-inserts a deleted test cell after its nbgrader predecessor,
        if c.metadata.nbgrader["grade"]:   # which must itself be a test or an answer cell
            prev = cells[i - 1].metadata.nbgrader
            assert prev["grade"] or prev["solution"], f"{ids[i]} follows the locked cell {ids[i - 1]}"
    hidden = [c for c in graded if "### BEGIN HIDDEN TESTS" in c.source]
    assert hidden and all(c.source.count(MARKER) == 1 for c in hidden), "each hidden region carries the marker"
    assert sum(c.source.count(MARKER) for c in nb.cells) == len(hidden)
    # visible and hidden test cells alternate: every task has both, and points on each
    assert len(hidden) * 2 == len(graded)
    setup = cells[0].source
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
    assert re.findall(r'^REPO = "([^"]+)"', setup, re.M) == [url]      # the URL scripts/setup_cell.py writes
    assert '"paged-kv @ git+" + os.environ.get("PAGED_KV_REPO", REPO)' in setup
    assert not re.search(r"^\s*(import|from)\s+nbgrader", "\n".join(c.source for c in nb.cells), re.M), \
        "the notebooks must run without nbgrader (as on Colab)"


@pytest.mark.parametrize("name", NAMES)
def test_goals_and_time_are_what_students_read(name):
    nb = built(name)
    info = nb.metadata["assignment"]
    intro = nb.cells[0].source
    assert f"About {info['minutes']} minutes" in intro
    for goal in info["goals"]:
        assert f"- {goal}" in intro, goal


@pytest.mark.parametrize("name", NAMES)
def test_predictions_are_written_before_the_tests_that_answer_them(name):
    """A "predict" question is followed at once by a cell where the student writes the prediction
    (not graded); the visible test that checks the predicted case comes after it and prints it."""
    cells = built(name).cells
    for i, cell in enumerate(cells):
        if cell.cell_type != "markdown" or "predict" not in cell.source.lower():
            continue
        nxt = next(c for c in cells[i + 1:] if c.cell_type == "code")
        found = re.search(r"^(predicted_\w+) = ", nxt.source, re.M)
        assert "nbgrader" not in nxt.metadata and found, f"{name}: no prediction cell right after {cell.source[:80]!r}"
        printed = [k for k, c in enumerate(cells) if f'globals().get("{found.group(1)}")' in c.source]
        assert printed and all(cells[k].metadata.get("nbgrader", {}).get("grade") for k in printed), found.group(1)
        assert min(printed) > cells.index(nxt)


@pytest.mark.parametrize("name", NAMES)
def test_hidden_tests_weigh_more_than_visible_ones(name):
    """An answer that hard-codes the visible tests' values keeps less than half of a task's points."""
    points = {}
    for task, _, p, hidden in course.graded_cells(built(name)):
        points.setdefault(task, [0.0, 0.0])[hidden] += p
    assert points and all(hidden > visible for visible, hidden in points.values()), points


@pytest.mark.parametrize("name", NAMES)
def test_committed_release_has_no_solutions_and_no_hidden_tests(name):
    text = (ROOT / "assignments" / "release" / name / f"{name}.ipynb").read_text()
    assert MARKER not in text and "BEGIN HIDDEN TESTS" not in text and "BEGIN SOLUTION" not in text
    assert "raise NotImplementedError()" in text


def test_marker_is_not_in_the_wheel(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True, timeout=300)
    wheel = zipfile.ZipFile(next(tmp_path.glob("paged_kv-*.whl")))
    assert not [n for n in wheel.namelist() if n.startswith("assignments/")]
    assert not [n for n in wheel.namelist() if MARKER.encode() in wheel.read(n)]


@pytest.mark.book
def test_marker_is_not_in_the_built_book(built_book):
    leaks = [p for p in built_book.rglob("*") if p.is_file() and MARKER.encode() in p.read_bytes()]
    assert not leaks, leaks


# ---------------------------------------------------------------------------------------------------
# The package's own implementations pass every test (visible and hidden) of the tasks they match.
# ---------------------------------------------------------------------------------------------------
def run_with(name, answers, after=None):
    """Execute the solved notebook's cells in this process, with the answer cells in ``answers``
    replaced by the given objects (and ``after[grade_id]`` put in after that cell ran), and the
    "your own code" check switched off."""
    ns = {"__name__": "__main__"}
    ran = []
    for cell in built(name).cells:
        if cell.cell_type != "code":
            continue
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            ns.update(answers[grade_id])
            continue
        exec(compile(cell.source, f"<{name}:{grade_id}>", "exec"), ns)
        if grade_id == "helpers":
            base = ns["Task"]
            ns["Task"] = type("Task", (base,), {"__init__": lambda self, n, a=None, forbid=(), kernel=None:
                                                base.__init__(self, n, a, kernel=kernel)})
        ns.update((after or {}).get(grade_id, {}))
        ran.append(grade_id)
    return ran


def test_the_package_passes_the_ledger_tests(capsys):
    from paged_kv import memory
    ran = run_with("a2_kv_ledger", {"bytes_per_token": {"kv_bytes_per_token": memory.kv_bytes_per_token},
                                    "cache_bytes": {"kv_cache_bytes": memory.kv_cache_bytes}})
    assert "window_hidden" in ran
    assert capsys.readouterr().out.count("hidden cases of") == 3


def test_the_package_passes_the_block_tests(capsys):
    from paged_kv import blocks
    ran = run_with("a3_blocks", {"blocks_needed": {"blocks_needed": blocks.blocks_needed},
                                 "allocator": {"BlockAllocator": blocks.BlockAllocator}})
    assert "ref_count_hidden" in ran
    assert capsys.readouterr().out.count("hidden cases of") == 4


def test_the_package_passes_the_copy_on_write_tests(capsys):
    from paged_kv import blocks
    ran = run_with("a5_copy_on_write", {"cow_manager": {"CowManager": blocks.BlockSpaceManager}},
                   after={"manager": {"fork_for_tests": lambda m, parent, child: m.fork(parent, child)}})
    assert "step_hidden" in ran
    assert capsys.readouterr().out.count("hidden cases of") == 3


def package_admit(waiting, free_blocks, block_size, watermark_blocks, preempted_this_step=False):
    """Task 2 of a6_scheduling answered by the package's own ``Scheduler``: a pool with
    ``free_blocks`` free (64 more held by another sequence, so no prompt is refused as "never"),
    the watermark fraction that rounds to ``watermark_blocks``, a token budget that fits every
    prompt; the requests it admits in one step."""
    from paged_kv.errors import PagedKVError
    from paged_kv.scheduling import Scheduler, SchedulerConfig, Verdict

    held = 64
    pool = free_blocks + held
    s = Scheduler(SchedulerConfig(num_gpu_blocks=pool, block_size=block_size, watermark=(watermark_blocks + 0.5) / pool,
                                  max_num_batched_tokens=sum(waiting) + 1))
    assert s.config.watermark_blocks == watermark_blocks
    s.manager.allocate(10**9, held * block_size)
    for i, p in enumerate(waiting):
        s.add(i, list(range(p)), max_tokens=1)
    if not waiting or (preempted_this_step and s.admission(s.waiting[0], preempted_this_step=True).verdict is not Verdict.NOW):
        return 0
    try:
        return len(s.schedule().admitted)
    except PagedKVError as e:   # the head waits and nothing runs (the held blocks belong to no request)
        assert "nothing can run" in str(e)
        return 0


def test_the_package_passes_the_scheduling_tests(capsys):
    from paged_kv import blocks, scheduling
    ran = run_with("a6_scheduling", {"group_blocks": {"group_blocks_needed": blocks.group_blocks_needed},
                                     "admit": {"admit": package_admit},
                                     "victim": {"preemption_victim": scheduling.preemption_victim}})
    assert "victim_hidden" in ran
    assert capsys.readouterr().out.count("hidden cases of") == 3


def package_cached_prefix(cache, token_ids, block_size, hash_fn=None):
    """Task 2 of a7_prefix_caching answered by the package's own ``PrefixCache``: the assignment's
    cache (hash -> [(block id, tokens, parent block id)]) registered into one, parents first, then
    its ``lookup`` (the token and parent check) capped before the last token."""
    from paged_kv.blocks import PrefixCache

    pc = PrefixCache(block_size, "sha256" if hash_fn is None else (lambda parent, tokens, key: hash_fn(parent, tokens)))
    entries = sorted((block_id, h, tokens, parent) for h, group in cache.items() for block_id, tokens, parent in group)
    for block_id, h, tokens, parent in entries:
        pc.register(block_id, h, tokens, None, None if parent is None else pc.entry(parent))
    return pc.lookup(token_ids, None, pc.hashes(token_ids), max_blocks=(len(token_ids) - 1) // block_size)


class PackageFreeList:
    """Task 3 of a7_prefix_caching answered by the package's own ``BlockAllocator``, with a set
    standing for the prefix cache (``evict`` records what ``allocate`` destroys)."""

    class Cache(set):
        def __init__(self):
            super().__init__()
            self.evicted = []

        def evict(self, block_id):
            if block_id in self:
                self.discard(block_id)
                self.evicted.append(block_id)

    def __init__(self, num_blocks):
        from paged_kv.blocks import BlockAllocator
        self.allocator = BlockAllocator(num_blocks)
        self.allocator.cache = self.cached = self.Cache()
        self.allocate, self.free, self.hit = self.allocator.allocate, self.allocator.free, self.allocator.touch
        self.free_list, self.cache = self.allocator.free_list, self.cached.add

    @property
    def evicted(self):
        return self.cached.evicted

    @property
    def refs(self):
        return [self.allocator.ref_count(b) for b in range(self.allocator.num_blocks)]


def test_the_package_passes_the_prefix_caching_tests(capsys):
    from paged_kv import blocks
    ran = run_with("a7_prefix_caching", {"chain_hashes": {"chain_hashes": blocks.block_hashes},
                                         "cached_prefix": {"cached_prefix": package_cached_prefix},
                                         "free_list": {"CachedFreeList": PackageFreeList}})
    assert "free_list_hidden" in ran
    assert capsys.readouterr().out.count("hidden cases of") == 3


def package_truncate(table, num_tokens, allocator):
    """Task 1 of a8_speculative_decoding answered by the package's own ``BlockSpaceManager.truncate``:
    the assignment's table and pool handed to a manager as its one sequence."""
    from paged_kv.blocks import BlockSpaceManager

    m = BlockSpaceManager(allocator.num_blocks, table.block_size)
    m.allocator = allocator
    m._tables[0] = table                  # truncate changes the table in place, as the task asks
    return m.truncate(0, num_tokens)


def test_the_package_passes_the_speculation_tests(capsys):
    """Tasks 1 and 2 answered by the package; Task 3's tests already run the solved step on the
    package's manager with its ``accept_greedy`` and compare it with ``replay_speculation``."""
    from paged_kv import spec_decode
    ran = run_with("a8_speculative_decoding", {"truncate": {"truncate": package_truncate},
                                               "accept": {"accept": spec_decode.accept_greedy}})
    assert "step_hidden" in ran
    out = capsys.readouterr().out
    assert out.count("hidden cases of") == 3
    assert "the same tokens as plain greedy: True" in out      # the last cell: the three pieces together


def test_importing_the_graded_function_fails_the_task():
    """What a student gets for `from paged_kv.blocks import blocks_needed` (or a wrapper of it)."""
    ns = {}
    exec(HELPERS, ns)
    from paged_kv import blocks

    with pytest.raises(AssertionError, match="package's own"):
        ns["Task"]("blocks_needed", blocks.blocks_needed, forbid=[blocks.blocks_needed])
    wrapper = lambda n, bs: blocks.blocks_needed(n, bs)  # noqa: E731
    task = ns["Task"]("blocks_needed", wrapper, forbid=[blocks.blocks_needed])
    with pytest.raises(AssertionError, match="ran the package's own paged_kv.blocks.block_table.blocks_needed"):
        task.expect("17 tokens", lambda: wrapper(17, 16), 2)
    with pytest.raises(AssertionError, match="extends"):
        ns["Task"]("BlockAllocator", type("Mine", (blocks.BlockAllocator,), {}), forbid=[blocks.BlockAllocator])


# ---------------------------------------------------------------------------------------------------
# The solved kernel compiles for a T4, an A100 and an H100 (no GPU needed).
# ---------------------------------------------------------------------------------------------------
def test_solved_kernel_compiles_for_sm75_sm80_sm90(tmp_path):
    kernel = next(c.source for c in built("a4_paged_kernel").cells
                  if c.metadata.get("nbgrader", {}).get("grade_id") == "kernel")
    (tmp_path / "student_kernel.py").write_text("import triton\nimport triton.language as tl\n\n" + kernel)
    script = textwrap.dedent("""
        import json, sys
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        sys.path.insert(0, sys.argv[1])
        from student_kernel import paged_decode_kernel as fn

        def sig(t):
            return {"Q": t, "KCache": t, "VCache": t, "BlockTables": "*i32", "SeqLens": "*i32", "Out": t,
                    **{s: "i32" for s in ("stride_qb", "stride_qh", "stride_bt", "stride_cb", "stride_cs",
                                          "stride_ch")},
                    "scale": "fp32", **{c: "constexpr" for c in ("H", "HKV", "D", "BLOCK_D", "BLOCK_SIZE")}}

        done = []
        for cap, t in ((75, "*fp16"), (80, "*bf16"), (90, "*bf16")):
            const = {"H": 8, "HKV": 2, "D": 80, "BLOCK_D": 128, "BLOCK_SIZE": 16}
            k = triton.compile(ASTSource(fn, sig(t), const), target=GPUTarget("cuda", cap, 32))
            done.append([cap, t, len(k.asm["cubin"])])
        print(json.dumps(done))
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    done = json.loads(out.stdout.strip().splitlines()[-1])
    assert [d[0] for d in done] == [75, 80, 90] and all(d[2] > 0 for d in done)


def test_the_tests_frames_are_out_of_reach_and_copies_of_the_package_are_spotted():
    """Issue 25: an answer that walks up the stack for the expected value finds none of the tests'
    frames (it runs on a thread of its own); the package's class exec'd from its source counts as
    the package's own code."""
    import inspect
    ns = {}
    exec(HELPERS, ns)
    from paged_kv import blocks

    def reader(num_tokens, block_size):
        frame = sys._getframe(1)
        while frame is not None:
            if "expected" in frame.f_locals:
                return frame.f_locals["expected"]
            frame = frame.f_back
        return -1

    task = ns["Task"]("blocks_needed", reader, forbid=[blocks.blocks_needed])
    with pytest.raises(AssertionError, match="expected 2"):
        task.expect("17 tokens", lambda: reader(17, 16), 2)
    with pytest.raises(AssertionError, match="1 of 1 hidden cases failed"):
        task.hidden([("17 tokens", lambda: reader(17, 16), 2)])

    namespace = dict(vars(sys.modules[blocks.BlockAllocator.__module__]))
    exec(inspect.getsource(blocks.BlockAllocator), namespace)
    copied = namespace["BlockAllocator"]
    assert copied is not blocks.BlockAllocator
    task = ns["Task"]("BlockAllocator", copied, forbid=[blocks.BlockAllocator])
    with pytest.raises(AssertionError, match="ran the package's own paged_kv.blocks"):
        task.expect("allocate", lambda: copied(4).allocate(), 0)
