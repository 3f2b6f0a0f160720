"""The graded assignments through nbgrader, as a teacher runs them (``make assignments``, then
``nbgrader zip_collect``, ``course.py grade``, ``nbgrader export``, ``nbgrader generate_feedback``).

One course directory is built from the sources in a temporary folder; every scenario is one
student, and each assignment is graded once by ``course.grade`` (one nbgrader run per student).
The scenarios: each solved source (full marks), each stub release (zero), the typical mistakes
planted into a solved source (they lose exactly their task's points), a submission whose test
cells were deleted, one whose answer cell was duplicated, one whose metadata was stripped, and an
LMS export with Colab's "Copy of" names.  Then the released notebooks run top to bottom as on
Colab: no nbgrader, only the package.
"""

import copy
import os
import shutil
import subprocess
import sys
import time
import zipfile

import nbformat
import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "assignments"))
import course  # noqa: E402

pytestmark = pytest.mark.assignments
MARKER = "PKV-HIDDEN-TEST-7Q3X"
ARTIFACTS = ROOT / "tests" / "_artifacts"

# The typical mistakes, planted into a solved source: (name, what the solution says, the mistake,
# the test cells (grade ids) it must fail: all of one task's cells, and nothing else).
MISTAKES = {
    "a1_decoding": [
        ("decode metadata built before the new token is counted",
         "        lens = lens + 1                                       # the new token counts\n"
         "        logits = model(nxt[:, None], AttentionMetadata.for_decode(lens), cache)        # [B, 1, V]\n",
         "        logits = model(nxt[:, None], AttentionMetadata.for_decode(lens), cache)        # [B, 1, V]\n"
         "        lens = lens + 1\n",
         {"cached_loop_tests", "cached_loop_hidden"}),
    ],
    "a2_kv_ledger": [
        ("MLA counted twice, as if it cached K and V",
         "return spec.num_layers * (spec.kv_lora_rank + spec.qk_rope_head_dim) * size",
         "return 2 * spec.num_layers * (spec.kv_lora_rank + spec.qk_rope_head_dim) * size",
         {"mla_bytes_tests", "mla_bytes_hidden"}),
    ],
    "a3_blocks": [
        ("n // block_size + 1 blocks", "return -(-num_tokens // block_size)",
         "return num_tokens // block_size + 1", {"blocks_needed_tests", "blocks_needed_hidden"}),
        ("a block freed while still shared",
         "        if self.refs[block_id] == 0:\n            self.free_blocks.append(block_id)\n",
         "        self.free_blocks.append(block_id)\n", {"ref_count_tests", "ref_count_hidden"}),
        # The "three holders" case checked the tail of the free list, and the package's manager on
        # the student's allocator compared physical ids: this also lost the reference-count points.
        ("a LIFO free list (a freed block to the head)",
         "        if self.refs[block_id] == 0:\n            self.free_blocks.append(block_id)\n",
         "        if self.refs[block_id] == 0:\n            self.free_blocks.appendleft(block_id)\n",
         {"free_list_tests", "free_list_hidden"}),
    ],
    "a4_paged_kernel": [
        ("the logical block index instead of block_table[i]",
         "block = tl.load(BlockTables + b * stride_bt + i)", "block = i", {"block_table_tests", "block_table_hidden"}),
        ("KV head = q_head % num_kv_heads", "kv_head = h // (H // HKV)", "kv_head = h % HKV",
         {"gqa_tests", "gqa_hidden"}),
        # The block-table test had H = HKV = 2, where this mapping reads KV head 0 for both heads.
        ("KV head = q_head // num_kv_heads", "kv_head = h // (H // HKV)", "kv_head = h // HKV",
         {"gqa_tests", "gqa_hidden"}),
    ],
    "a5_copy_on_write": [
        ("a copy for every holder that appends",
         "return needed + sum(min(h, self.allocator.ref_count(b) - 1) for b, h in appenders.items())",
         "return needed + sum(appenders.values())", {"step_tests", "step_hidden"}),
        # The copy-on-write tests forked with the student's fork, and no fork test looked at the
        # child's table as an object of its own: this lost the copy-on-write points instead.
        ("a fork that aliases the parent's table", "self.tables[child_id] = parent.copy()",
         "self.tables[child_id] = parent", {"fork_tests", "fork_hidden"}),
    ],
    "a6_scheduling": [
        ("the partial last prompt block counted as shared",
         "shared = prompt_len // block_size ", "shared = -(-prompt_len // block_size) ",
         {"group_blocks_tests", "group_blocks_hidden"}),
        # The formula this assignment (and the package's admission) used until the max_tokens = 1 fix,
        # P // BS + n * (ceil(T / BS) - P // BS): every sample is assumed to write, so 3 samples of a
        # 10-token prompt with max_tokens = 1, blocks of 4, need 2 + 3 * (3 - 2) = 5 blocks, where
        # they never write and share all ceil(10 / 4) = 3.
        ("samples that never write (max_tokens = 1) counted as copying the partial block",
         "    if total_tokens == prompt_len:                    # max_tokens = 1: nobody writes, nothing is copied\n"
         "        return blocks_needed(prompt_len, block_size)  # the whole prompt, partial block too, held once\n",
         "", {"group_blocks_tests", "group_blocks_hidden"}),
        # The fix overdone: no copy as long as the samples stay inside the prompt's last block. A
        # write into the shared partial block copies it: 3 samples of 10 tokens, 11 stored, blocks of 4
        # need 2 + 3 * 1 = 5, not ceil(11 / 4) = 3.
        ("no copy while the samples' tokens stay in the prompt's last block",
         "if total_tokens == prompt_len:",
         "if blocks_needed(total_tokens, block_size) == blocks_needed(prompt_len, block_size):",
         {"group_blocks_tests", "group_blocks_hidden"}),
        ("a request behind a blocked head admitted (overtaking)",
         "            break                                       # head-of-line blocking: nobody overtakes\n",
         "            continue\n", {"admit_tests", "admit_hidden"}),
        ("the earliest arrival preempted", "latest = max(key(r) for r in running)",
         "latest = min(key(r) for r in running)", {"victim_tests", "victim_hidden"}),
    ],
    "a7_prefix_caching": [
        ("a block hashed by its own tokens alone",
         "        parent = block_hash(parent, token_ids[i * block_size:(i + 1) * block_size])\n",
         "        parent = block_hash(None, token_ids[i * block_size:(i + 1) * block_size])\n",
         {"chain_hashes_tests", "chain_hashes_hidden"}),
        ("a hash hit trusted without the token and parent check",
         "            if stored == tokens and stored_parent == parent:   # the hash found it; the check proves it\n",
         "            if True:\n", {"cached_prefix_tests", "cached_prefix_hidden"}),
        ("the tokens checked but not the parent (a flat hash fools it)",
         "            if stored == tokens and stored_parent == parent:   # the hash found it; the check proves it\n",
         "            if stored == tokens:\n", {"cached_prefix_tests", "cached_prefix_hidden"}),
        ("a whole cached prompt reused, last token included",
         "    for i in range((len(token_ids) - 1) // block_size):\n", "    for i in range(len(token_ids) // block_size):\n",
         {"cached_prefix_tests", "cached_prefix_hidden"}),
        ("every freed block to the tail (an empty block waits behind cached ones)",
         "            if block_id in self.cached:\n"
         "                self.queue.append(block_id)         # cached-free: evicted least recently freed first\n"
         "            else:\n"
         "                self.queue.insert(0, block_id)      # empty: handed out before any cached block\n",
         "            self.queue.append(block_id)\n", {"free_list_tests", "free_list_hidden"}),
        ("a partial last block hashed, so cached while its contents still change",
         "    for i in range(len(token_ids) // block_size):\n", "    for i in range(-(-len(token_ids) // block_size)):\n",
         {"chain_hashes_tests", "chain_hashes_hidden"}),
        ("a block just matched left on the free list (the next allocate() evicts it)",
         "        if self.refs[block_id] == 0:\n            self.queue.remove(block_id)\n", "",
         {"free_list_tests", "free_list_hidden"}),
    ],
    "a8_speculative_decoding": [
        ("the partly used last block freed (blocks kept: num_tokens // block_size)",
         "    keep = -(-num_tokens // table.block_size)        # the blocks that still hold a kept token\n",
         "    keep = num_tokens // table.block_size\n", {"truncate_tests", "truncate_hidden"}),
        ("a block a fork still holds freed (every holder let go)",
         "        if allocator.free(block_id) == 0:            # a block a fork still holds only loses this holder\n"
         "            freed.append(block_id)\n",
         "        while allocator.free(block_id) > 0:\n"
         "            pass\n"
         "        freed.append(block_id)\n", {"truncate_tests", "truncate_hidden"}),
        ("the first logical block let go first",
         "    for block_id in reversed(dropped):               # the last logical block first\n",
         "    for block_id in dropped:\n", {"truncate_tests", "truncate_hidden"}),
        ("a cut to 0 tokens accepted (it frees the whole table)",
         "    if not 1 <= num_tokens <= table.num_tokens:\n", "    if num_tokens > table.num_tokens:\n",
         {"truncate_tests", "truncate_hidden"}),
        ("the bonus token dropped (all k accepted gives k tokens)",
         "    kept.append(target_tokens[len(draft)])           # every draft accepted: the bonus token\n", "",
         {"accept_tests", "accept_hidden"}),
        ("drafts accepted past the first mismatch",
         "            return kept                              # the first disagreement ends the run\n",
         "            continue\n", {"accept_tests", "accept_hidden"}),
        ("the rejected draft kept instead of the target's token",
         "        kept.append(t)                               # the target's token: the draft's, where they agree\n",
         "        kept.append(d)\n", {"accept_tests", "accept_hidden"}),
        ("the target's own last token kept a slot (rolled back one too few)",
         "    freed = m.truncate(seq_id, len(tokens) + len(kept) - 1)   # the target's own last token has no K/V yet\n",
         "    freed = m.truncate(seq_id, len(tokens) + len(kept))\n",
         {"step_tests", "step_hidden"}),
        ("each position verified one draft token late",
         "    verified = [target(tokens + draft[:i]) for i in range(len(draft) + 1)]   # one pass: k + 1 positions\n",
         "    verified = [target(tokens + draft[:i + 1]) for i in range(len(draft) + 1)]\n",
         {"step_tests", "step_hidden"}),
        ("no rollback: the rejected drafts keep their slots",
         "    freed = m.truncate(seq_id, len(tokens) + len(kept) - 1)   # the target's own last token has no K/V yet\n",
         "    freed = []\n", {"step_tests", "step_hidden"}),
    ],
}
# Submissions delivered through an LMS export (Canvas names), collected by `nbgrader zip_collect`.
LMS_FILES = {   # file name: (student id, what it holds)
    "doejane_1001_5001_Copy of a3_blocks.ipynb": ("1001", "n // block_size + 1 blocks"),
    "roejohn_LATE_1002_5002_Copy_of_a3_blocks (1).ipynb": ("1002", "a block freed while still shared"),
    "poeanne_1003_5003_a3_blocks-1.ipynb": ("1003", "duplicated answer cell, deleted test cells"),
}


# Submissions that fail in ways a test helper does not see, and cheats (issue 25).  Each is built
# from the solved source (or the stub release) with answer cells replaced: {grade id: source}.
FRAME_READER = """def blocks_needed(num_tokens, block_size):
    import sys
    frame = sys._getframe(1)
    while frame is not None:                     # the tests' frames: take their expected answer
        if "expected" in frame.f_locals:
            return frame.f_locals["expected"]
        frame = frame.f_back
    return -1"""
PACKAGE_SOURCE = """import inspect, sys
namespace = dict(vars(sys.modules[package_blocks.BlockAllocator.__module__]))
exec(inspect.getsource(package_blocks.BlockAllocator), namespace)   # the package's class, copied
BlockAllocator = namespace["BlockAllocator"]"""
FAKE_TASK = """

class Task:                                      # a do-nothing harness: every check passes
    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        return lambda *args, **kwargs: None"""
TORCH_LAUNCHER = """

def paged_decode(q, k_cache, v_cache, block_tables, seq_lens):   # the launcher, without the kernel
    B, H, D = q.shape
    NB, BS, HKV, _ = k_cache.shape
    out = torch.empty_like(q)
    for b in range(B):
        L = int(seq_lens[b])
        ids = block_tables[b, :-(-L // BS)].long()
        k = k_cache[ids].reshape(-1, HKV, D)[:L].repeat_interleave(H // HKV, dim=1)
        v = v_cache[ids].reshape(-1, HKV, D)[:L].repeat_interleave(H // HKV, dim=1)
        p = (torch.einsum("hd,thd->ht", q[b], k) / math.sqrt(D)).softmax(-1)
        out[b] = torch.einsum("ht,thd->hd", p, v)
    return out"""
ENDLESS = "def blocks_needed(num_tokens, block_size):\n    while True:\n        pass"
CRASH = ("def blocks_needed(num_tokens, block_size):\n    import os, signal\n"
         "    os.kill(os.getpid(), signal.SIGKILL)           # as a segfault in the Triton interpreter")
# (student, assignment, built from "solved" or "stub", {grade id: new source or "+" appended text},
#  the cells it must lose: None where they are checked by their own test)
FAULTS = [
    ("broken", "a3_blocks", "solved", {   # NameError, the package's own class, a syntax error
        "blocks_needed": "def blocks_needed_(num_tokens, block_size):\n    return -(-num_tokens // block_size)",
        "allocator": "from paged_kv.blocks import BlockAllocator",
        "append_slot": "def append_slot(table, allocator)\n    return 0"}, "all"),
    ("crash-and-loop", "a3_blocks", "solved", {"blocks_needed": CRASH, "append_slot":
        "def append_slot(table, allocator):\n    while True:\n        pass"},
     {"blocks_needed_tests", "blocks_needed_hidden", "append_slot_tests", "append_slot_hidden"}),
    ("fake-task", "a3_blocks", "stub", {"blocks_needed": "+" + FAKE_TASK}, "all"),
    ("frames-and-source", "a3_blocks", "solved", {"blocks_needed": FRAME_READER, "allocator": PACKAGE_SOURCE},
     {"blocks_needed_tests", "blocks_needed_hidden", "free_list_tests", "free_list_hidden", "ref_count_tests",
      "ref_count_hidden"}),
    ("torch-launcher", "a4_paged_kernel", "stub", {"kernel": "+" + TORCH_LAUNCHER}, "all"),
]
CAP = ("endless", "a3_blocks", "solved", {"blocks_needed": ENDLESS}, None)   # graded with a small cap
FAULT_CELL_TIMEOUT, CAP_SECONDS = 5, 20


def rewrite(nb, sources):
    nb = copy.deepcopy(nb)
    for c in nb.cells:
        new = sources.get(c.metadata.get("nbgrader", {}).get("grade_id"))
        if new is not None:
            c.source = c.source + new[1:] if new.startswith("+") else new
    return nb


def hidden_lines(root, assignment):
    """Every line (12 characters or more) of the assignment's hidden tests that its release does not show."""
    import re
    source = nbformat.read(root / "source" / assignment / f"{assignment}.ipynb", as_version=4)
    release = (root / "release" / assignment / f"{assignment}.ipynb").read_text()
    lines = {line.strip() for c in source.cells
             for region in re.findall(r"### BEGIN HIDDEN TESTS(.*?)### END HIDDEN TESTS", c.source, re.S)
             for line in region.splitlines()}
    return sorted(line for line in lines if len(line) >= 12 and json_escaped(line) not in release)


def json_escaped(text):
    import json
    return json.dumps(text)[1:-1]


def feedback_text(root, assignment, student):
    """The feedback page of one student as text (tags stripped, entities decoded)."""
    import html
    import re
    page = (root / "feedback" / student / assignment / f"{assignment}.html").read_text()
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def cells_by_id(nb):
    return {c.metadata.nbgrader["grade_id"]: c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id")}


def plant(nb, old, new):
    nb = copy.deepcopy(nb)
    hits = [c for c in nb.cells if old in c.source]
    assert len(hits) == 1, f"the solution line {old!r} is not in exactly one cell"
    hits[0].source = hits[0].source.replace(old, new)
    return nb


def duplicated_answer_deleted_tests(nb):
    """A student copied the blocks_needed cell and left a wrong attempt in the first copy, and
    deleted three test cells."""
    nb = copy.deepcopy(nb)
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") not in
                ("blocks_needed_tests", "blocks_needed_hidden", "ref_count_tests")]
    i = next(k for k, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "blocks_needed")
    first = copy.deepcopy(nb.cells[i])
    first.id, first.source = "a-copy", "def blocks_needed(num_tokens, block_size):\n    return num_tokens // block_size"
    nb.cells.insert(i, first)
    return nb


@pytest.fixture(scope="module")
def course_dir(tmp_path_factory):
    """A course built from the sources, every scenario submitted, every assignment graded."""
    root = tmp_path_factory.mktemp("course")
    ROOT_OF[0] = root
    for name in ("nbgrader_config.py", "grader.py", "helpers.py"):
        shutil.copy(ROOT / "assignments" / name, root)
    shutil.copytree(ROOT / "assignments" / "source", root / "source", ignore=shutil.ignore_patterns("*.ipynb"))
    timings = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")   # one notebook at a time: no thread oversubscription on 2 cores
        start = time.perf_counter()
        course.release(root)
        timings["release"] = time.perf_counter() - start
        names = course.assignment_names(root)
        solved = {a: nbformat.read(root / "source" / a / f"{a}.ipynb", as_version=4) for a in names}
        expected = {}

        def submit(a, student, nb, failing):
            (root / "submitted" / student / a).mkdir(parents=True)
            nbformat.write(nb, root / "submitted" / student / a / f"{a}.ipynb")
            expected[a, student] = failing

        for a in names:
            graded = {i for i, c in cells_by_id(solved[a]).items() if c.metadata.nbgrader["grade"]}
            submit(a, "solved", solved[a], set())
            submit(a, "stub", nbformat.read(root / "release" / a / f"{a}.ipynb", as_version=4), graded)
            lms = {what for _, what in LMS_FILES.values()}
            for k, (name, old, new, failing) in enumerate(MISTAKES[a]):
                if name not in lms:    # a3's first two come through the LMS export below
                    submit(a, f"mistake-{k + 1}", plant(solved[a], old, new), failing)
        release = {a: nbformat.read(root / "release" / a / f"{a}.ipynb", as_version=4) for a in names}
        for student, a, base, sources, failing in FAULTS + [CAP]:
            nb = rewrite(solved[a] if base == "solved" else release[a], sources)
            graded = {i for i, c in cells_by_id(solved[a]).items() if c.metadata.nbgrader["grade"]}
            submit(a, student, nb, None)
            expected.setdefault("faults", {})[student] = graded if failing == "all" else failing
        a3 = solved["a3_blocks"]
        stripped = copy.deepcopy(a3)
        for c in stripped.cells:
            c.metadata = {}
        submit("a3_blocks", "stripped", stripped, None)

        # An LMS export: Colab's "Copy of" names, a late one, a resubmission, a file that is no notebook.
        archive = root / "downloaded" / "a3_blocks" / "archive"
        archive.mkdir(parents=True)
        mistakes = {name: (old, new, failing) for name, old, new, failing in MISTAKES["a3_blocks"]}
        with zipfile.ZipFile(archive / "submissions.zip", "w") as z:
            for filename, (student, what) in LMS_FILES.items():
                planted = what in mistakes
                nb = plant(a3, *mistakes[what][:2]) if planted else duplicated_answer_deleted_tests(a3)
                z.writestr(filename, nbformat.writes(nb))
                expected["a3_blocks", student] = mistakes[what][2] if planted else set()
            z.writestr("poeanne_1003_5003_notes.txt", "not a notebook")
        start = time.perf_counter()
        collect = subprocess.run([os.path.join(os.path.dirname(sys.executable), "nbgrader"), "zip_collect",
                                  "a3_blocks"], cwd=root, capture_output=True, text=True, timeout=600)
        timings["zip_collect"] = time.perf_counter() - start
        assert collect.returncode == 0, collect.stderr[-3000:]

        faults = expected.pop("faults")
        results = {}
        for a in names:
            start = time.perf_counter()
            students = [s for (b, s) in expected if b == a and s not in faults]
            results[a] = {r.student: r for r in course.grade(a, root, students=students)}
            timings[f"grade {a}"] = time.perf_counter() - start
        start = time.perf_counter()
        for a in sorted({f[1] for f in FAULTS}):
            students = [f[0] for f in FAULTS if f[1] == a]
            results[a].update({r.student: r for r in course.grade(a, root, students=students,
                                                                   cell_timeout=FAULT_CELL_TIMEOUT)})
        timings["grade the faults and cheats"] = time.perf_counter() - start
        start = time.perf_counter()
        results[CAP[1]].update({r.student: r for r in course.grade(CAP[1], root, students=[CAP[0]],
                                                                    submission_timeout=CAP_SECONDS)})
        timings[f"grade an endless loop, {CAP_SECONDS} s cap"] = time.perf_counter() - start
        api = course.nbgrader_api(root)
        start = time.perf_counter()
        for student in ("broken", "crash-and-loop", "endless"):
            out = api.generate_feedback("a3_blocks", student)
            assert out["success"], out.get("error")
        timings["feedback of 3 failing submissions"] = time.perf_counter() - start
    yield {"root": root, "names": names, "results": results, "expected": expected, "timings": timings,
           "collect_log": collect.stdout + collect.stderr, "faults": faults}
    write_score_table(names, results, timings)


def task_scores(root, a, r):
    """``task: "score/points"`` of one result (a task: the cells checking one ``Task`` name)."""
    info = next(x for x in course.summary(root) if x.name == a)
    nb = nbformat.read(root / "source" / a / f"{a}.ipynb", as_version=4)
    cells = {}
    for c in nb.cells:
        import re
        found = re.search(r'Task\("([^"]+)"', c.source)
        if c.metadata.get("nbgrader", {}).get("grade") and found:
            cells.setdefault(found.group(1), []).append(c.metadata.nbgrader["grade_id"])
    out = []
    for t in info.tasks:
        got = [r.scores.get(i, (None, 0))[0] for i in cells[t.name]]
        score = "not graded" if all(g is None for g in got) else f"{sum(g or 0 for g in got):g}"
        out.append(f"{t.name}: {score}/{t.visible + t.hidden:g}")
    return out


ROOT_OF = [None]   # the course folder, for the tables


def write_score_table(names, results, timings):
    """The score tables of the closing note (tests/_artifacts/assignment_scores.md)."""
    lines = ["| assignment | solved | stub | planted mistake | score |", "|---|---|---|---|---|"]
    for a in names:
        r = results[a]
        total = lambda s: f"{r[s].score:g} / {r[s].max_score:g}" if r[s].status == "graded" else r[s].status  # noqa: E731
        planted = [(name, f"mistake-{k + 1}") for k, (name, *_) in enumerate(MISTAKES[a])]
        if a == "a3_blocks":   # delivered through the LMS export
            known = {m[0] for m in MISTAKES[a]}
            planted = [(what, student) for student, what in LMS_FILES.values() if what in known] + \
                [(name, student) for name, student in planted if student in r]
        for i, (name, student) in enumerate(planted):
            first = i == 0
            lines.append(f"| {a if first else ''} | {total('solved') if first else ''} | "
                         f"{total('stub') if first else ''} | {name} | {total(student)} |")
    lines.append("")
    lines += [f"- {k}: {v:.0f} s" for k, v in timings.items()]
    lines += ["", "| submission | assignment | score per task | total | seconds |", "|---|---|---|---|---|"]
    planted = [(f"mistake-{k + 1}", a, name) for a in names for k, (name, *_) in enumerate(MISTAKES[a])
               if f"mistake-{k + 1}" in results[a]]
    for student, a, what in planted + [(f[0], f[1], f[0]) for f in FAULTS + [CAP]]:
        r = results[a].get(student)
        if r is not None and r.status == "graded":
            lines.append(f"| {what} | {a} | {'; '.join(task_scores(ROOT_OF[0], a, r))} | "
                         f"{r.score:g} / {r.max_score:g} | {r.seconds:.0f} |")
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "assignment_scores.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def lost(result):
    """The graded cells that scored less than their points."""
    return {i for i, (score, points) in result.scores.items() if score < points}


def test_release_matches_the_committed_one(course_dir):
    for a in course_dir["names"]:
        fresh = (course_dir["root"] / "release" / a / f"{a}.ipynb").read_text()
        committed = (ROOT / "assignments" / "release" / a / f"{a}.ipynb").read_text()
        assert fresh == committed, f"assignments/release/{a} is out of date: run `make assignments`"


def test_every_scenario_scores_as_expected(course_dir):
    """Solved: full marks. Stub: zero on every test cell. A planted mistake: exactly its task's
    test cells lost, every other cell full marks.  Deleted tests restored; a duplicated cell graded."""
    for (a, student), failing in course_dir["expected"].items():
        r = course_dir["results"][a][student]
        if failing is None:
            continue
        assert r.status == "graded", (a, student, r.status, r.error, [p.message for p in r.problems])
        assert lost(r) == failing, (a, student, r.scores)
        assert all(score == 0 for i, (score, _) in r.scores.items() if i in failing), (a, student, r.scores)
        assert r.max_score == sum(points for _, points in r.scores.values()) > 0


def test_each_solved_source_scores_full_marks(course_dir):
    for a in course_dir["names"]:
        r = course_dir["results"][a]["solved"]
        assert r.status == "graded" and r.score == r.max_score > 0, (a, r)


def test_each_stub_release_scores_zero(course_dir):
    for a in course_dir["names"]:
        r = course_dir["results"][a]["stub"]
        assert r.status == "graded" and r.score == 0 and r.max_score > 0, (a, r)


def test_each_planted_mistake_is_graded(course_dir):
    planted = {(a, s) for (a, s), failing in course_dir["expected"].items() if failing}
    assert len(planted) >= sum(len(m) for m in MISTAKES.values()) + len(course_dir["names"])  # + the stubs


def test_deleted_test_cells_come_back(course_dir):
    r = course_dir["results"]["a3_blocks"]["1003"]
    assert r.status == "graded" and r.score == r.max_score
    assert {"blocks_needed_tests", "blocks_needed_hidden", "ref_count_tests"} <= set(r.scores)
    assert "tests deleted" in [p.kind for p in r.problems]


def test_stripped_metadata_is_reported_not_zeroed(course_dir):
    r = course_dir["results"]["a3_blocks"]["stripped"]
    assert r.status == "not graded" and [p.kind for p in r.problems] == ["metadata stripped"]
    assert "0 without a word" in r.problems[0].message
    assert "NOT GRADED" in course.report("a3_blocks", [r])


def test_duplicated_answer_cell_is_graded_and_reported(course_dir):
    r = course_dir["results"]["a3_blocks"]["1003"]
    assert r.status == "graded" and r.score == r.max_score
    assert [p.kind for p in r.problems] == ["duplicate cell", "tests deleted"]
    kept = course_dir["root"] / "logs" / "a3_blocks" / "1003.submitted.ipynb"
    assert kept.is_file(), "the notebook as handed in is kept"


def test_zip_collect_tolerates_copy_of_names(course_dir):
    root = course_dir["root"]
    for student in ("1001", "1002", "1003"):
        assert (root / "submitted" / student / "a3_blocks" / "a3_blocks.ipynb").is_file(), course_dir["collect_log"]
    assert not list((root / "submitted").glob("*/a3_blocks/Copy*"))
    assert "notes.txt" not in "".join(p.name for p in (root / "submitted").rglob("*"))


def test_grades_export_and_feedback_without_hidden_tests(course_dir):
    from nbgrader.api import Gradebook
    from nbgrader.plugins.export import CsvExportPlugin

    root = course_dir["root"]
    out = root / "grades.csv"
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        CsvExportPlugin(to=str(out)).export(gb)        # what `nbgrader export` runs
    rows = out.read_text().splitlines()
    assert rows[0].startswith("assignment,duedate,timestamp,student_id")
    assert any(r.startswith("a3_blocks,") and ",1001," in r for r in rows)

    api = course.nbgrader_api(root)
    result = api.generate_feedback("a3_blocks", "1001")
    assert result["success"], result.get("error")
    html = (root / "feedback" / "1001" / "a3_blocks" / "a3_blocks.html").read_text()
    assert MARKER not in html and "BEGIN HIDDEN TESTS" not in html, "hidden test code reached the feedback"
    assert "hidden cases failed" in html and "exactly one block" in html   # the failing cases, named
    assert "blocks_needed(16, 16)" not in html


def test_released_notebooks_run_as_on_colab(tmp_path):
    """Each released notebook, top to bottom, in a kernel where nbgrader cannot be imported:
    every cell but the visible tests runs; each visible test fails on the stubs with a message
    that says what to do."""
    from nbclient import NotebookClient

    shim = tmp_path / "no_nbgrader" / "nbgrader"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('nbgrader is not installed (as on Colab)')\n")
    env = {"PYTHONPATH": str(shim.parent), "OMP_NUM_THREADS": "1"}
    for a in course.assignment_names():
        nb = nbformat.read(ROOT / "assignments" / "release" / a / f"{a}.ipynb", as_version=4)
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            NotebookClient(nb, kernel_name="python3", timeout=300, allow_errors=True,
                           resources={"metadata": {"path": str(tmp_path)}}).execute()
        for c in nb.cells:
            if c.cell_type != "code":
                continue
            meta = c.metadata.get("nbgrader", {})
            errors = [o for o in c.outputs if o.output_type == "error"]
            visible = meta.get("grade") and "Hidden tests" not in c.source
            if visible:
                assert errors, f"{a}: {meta['grade_id']} passed on the stubs"
                assert "is not written yet: replace `raise NotImplementedError()`" in errors[0].evalue, \
                    f"{a}: {meta['grade_id']}: {errors[0].ename}: {errors[0].evalue}"
            elif not meta.get("solution"):
                assert not errors, f"{a}: cell {meta.get('grade_id', c.id)} failed: {errors[0].evalue if errors else ''}"


def test_export_after_grading_keeps_the_late_mark_and_the_totals(course_dir):
    """`course.py export` on the graded course: the LMS's late mark read back from what
    zip_collect unpacked, each graded total as course.grade found it, nothing for the notebook
    that was not graded (the gradebook-level cases are in test_gradebook.py)."""
    import csv

    import gradebook

    root, results = course_dir["root"], course_dir["results"]["a3_blocks"]
    paths = gradebook.export("a3_blocks", root)
    with open(paths["scores"], newline="") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    assert {s: r["late"] for s, r in rows.items() if s in ("1001", "1002", "1003")} == \
        {"1001": "", "1002": "late", "1003": ""}
    for student, r in results.items():
        if r.status == "graded" and not r.not_graded:
            assert float(rows[student]["total"]) == r.score and rows[student]["status"] == "graded", student
        elif r.status == "graded":        # some cells not graded (the cap): no total, never a partial one
            assert rows[student]["total"] == "", student
            assert rows[student]["status"] in ("partly graded", "not graded"), (student, rows[student]["status"])
    assert rows["stripped"]["status"] == "not graded" and rows["stripped"]["total"] == ""
    with open(paths["lms"], newline="") as f:
        lms = {r["ID"]: r["a3_blocks"] for r in csv.DictReader(f)}
    assert lms["stripped"] == "" and float(lms["1002"]) == results["1002"].score


# ---------------------------------------------------------------------------------------------------
# Issue 25: failures outside the helpers, cheats, crashes and time.
# ---------------------------------------------------------------------------------------------------
def test_failures_and_cheats_lose_exactly_their_cells(course_dir):
    """A NameError, a syntax error, the package's own class, a crash, an endless loop, a stack-frame
    reader, the package's source exec'd, a do-nothing Task, a launcher without the kernel: each
    loses the cells it hit, every other cell keeps its points."""
    for student, a, *_ in FAULTS:
        r = course_dir["results"][a][student]
        assert r.status == "graded", (student, r.status, r.error)
        assert lost(r) == course_dir["faults"][student], (student, r.scores)
        assert not r.not_graded, (student, r.not_graded)


def test_a_crash_or_a_timeout_costs_only_its_cells(course_dir):
    r = course_dir["results"]["a3_blocks"]["crash-and-loop"]
    assert r.died == ["blocks_needed_tests", "blocks_needed_hidden"], r.died
    assert r.timed_out == ["append_slot_tests", "append_slot_hidden"], r.timed_out
    assert r.scores["free_list_hidden"] == r.scores["ref_count_hidden"] == (3.0, 3.0)   # graded after the crash
    text = course.report("a3_blocks", [r])
    assert "crashed the kernel (scored 0): blocks_needed_tests" in text and "timed out (scored 0)" in text


def test_an_endless_loop_stops_at_the_submission_cap_and_the_rest_is_not_graded(course_dir):
    r = course_dir["results"]["a3_blocks"]["endless"]
    assert r.status == "graded" and r.seconds < CAP_SECONDS + 30, (r.seconds, r.scores)
    assert r.scores.get("blocks_needed_tests", (None,))[0] in (0.0, None)
    later = [i for i in r.scores if not i.startswith("blocks_needed")]
    assert later and all(r.scores[i][0] is None for i in later), r.scores     # None, never 0
    assert set(r.not_graded) >= set(later)
    assert "NOT GRADED" in course.report("a3_blocks", [r])
    import json
    saved = json.loads((course_dir["root"] / "logs" / "a3_blocks" / "results.json").read_text())["endless"]
    assert saved["scores"]["append_slot_hidden"][0] is None and "append_slot_hidden" in saved["not_graded"]
    assert saved["seconds"] > 0


def test_feedback_never_shows_a_hidden_line(course_dir):
    """Feedback of submissions that fail outside the helpers (NameError, syntax error, the package's
    own class, a crash, timeouts, the cap): no line of the hidden tests, no expected value."""
    root = course_dir["root"]
    lines = hidden_lines(root, "a3_blocks")
    assert len(lines) > 30 and any("blocks_needed(4097, 16)" in line for line in lines)
    for student in ("broken", "crash-and-loop", "endless"):
        text = feedback_text(root, "a3_blocks", student)
        leaked = [line for line in lines if line in text]
        assert not leaked, (student, leaked[:3])
        assert MARKER not in text
    broken = feedback_text(root, "a3_blocks", "broken")
    assert "NameError" in broken and "package's own" in broken


def test_precheck_flags_tampering_with_the_line(course_dir):
    r = course_dir["results"]
    kinds = lambda res: [p.message for p in res.problems if p.kind == "suspicious code"]  # noqa: E731
    assert any("redefines 'Task'" in m and ", line " in m for m in kinds(r["a3_blocks"]["fake-task"]))
    frames = kinds(r["a3_blocks"]["frames-and-source"])
    assert any("sys._getframe(1)" in m and "call stack" in m for m in frames), frames
    assert any("getsource" in m for m in frames) and any("exec(" in m for m in frames), frames
    assert any("redefines 'paged_decode'" in m for m in kinds(r["a4_paged_kernel"]["torch-launcher"]))
    for a in course_dir["names"]:
        assert not kinds(r[a]["solved"]), (a, kinds(r[a]["solved"]))
