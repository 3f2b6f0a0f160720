"""The paged-kv course: build the nbgrader sources, release them, and grade one student at a time.

Run from anywhere (the course directory is this file's folder); ``make assignments`` runs
``release``.  Commands:

* ``python assignments/course.py build``: each ``source/<a>/<a>.md`` (MyST, the reviewable text)
  becomes ``source/<a>/<a>.ipynb``, the nbgrader source notebook, with the shared grading helpers
  (``helpers.py``) copied into its locked ``helpers`` cell;
* ``python assignments/course.py release``: ``build``, then ``nbgrader generate_assignment`` for
  every assignment: ``release/<a>/<a>.ipynb`` (solutions replaced by stubs, hidden tests removed),
  the notebooks students open on Colab;
* ``python assignments/course.py roster <file.csv>``: the class list (the LMS's gradebook export,
  or any CSV with an id column and names) into the gradebook, kept as ``roster.csv``;
* ``python assignments/course.py grade <a> [--student ID ...] [--cell-timeout S] [--submission-timeout S]``:
  for every submission in ``submitted/<student>/<a>/``, one at a time: check it (:func:`precheck`,
  which also flags code that tampers with the tests), autograde it in its own nbgrader run (a
  broken notebook fails alone; a cell that crashes the kernel or runs too long costs only its own
  points, see ``grader.py``), print one line per student with the seconds it took, and write
  ``logs/<a>/results.json`` (per cell: the score, ``null`` where it was not graded).  Exits 1
  when a submission could not be graded, after grading all the others;
* ``python assignments/course.py export <a> [--column NAME]``: ``export/<a>/scores.csv`` (each
  task's points, "not graded" where a task could not be graded, the LMS's late mark),
  ``lms_grades.csv`` (the roster's id and name columns and the total, for the LMS's gradebook
  import) and ``feedback.zip`` (one feedback file per student, named as their LMS submission).

The nbgrader settings (interpreter switch, timeouts, zip_collect's file-name pattern, feedback
without hidden tests) live in ``nbgrader_config.py``; the book's teacher guide explains them.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import jupytext
import nbformat

COURSE = Path(__file__).resolve().parent
HELPERS_ID = "helpers"
# Defaults of the nbgrader cell metadata the MyST sources leave out (schema version 3).
NBGRADER_DEFAULTS = {"grade": False, "locked": False, "schema_version": 3, "solution": False, "task": False}


def assignment_names(root: Path = COURSE) -> list[str]:
    """The assignments, in order: the folders of ``source/`` that hold ``<name>/<name>.md``."""
    return sorted(p.parent.name for p in (root / "source").glob("*/*.md") if p.stem == p.parent.name)


# --------------------------------------------------------------------------------------------------
# Building the nbgrader sources from the MyST text
# --------------------------------------------------------------------------------------------------
def build_notebook(md_path: Path, helpers: str) -> nbformat.NotebookNode:
    """The nbgrader source notebook of one MyST source: nbgrader metadata completed with its
    defaults, the ``helpers`` cell filled with ``helpers``, stable cell ids, no jupytext metadata."""
    nb = jupytext.read(md_path)
    nb.metadata.pop("jupytext", None)
    ids = Counter()
    for index, cell in enumerate(nb.cells):
        meta = cell.metadata.get("nbgrader")
        cell.id = meta["grade_id"] if meta else f"cell-{index}"   # stable ids: rebuilding changes nothing
        if meta is None:
            continue
        cell.metadata["nbgrader"] = {**NBGRADER_DEFAULTS, **meta}
        ids[meta["grade_id"]] += 1
        if meta.get("grade") and "points" not in meta:
            raise ValueError(f"{md_path.name}: graded cell {meta['grade_id']!r} has no points")
        if meta["grade_id"] == HELPERS_ID:
            cell.source = helpers.rstrip("\n")
    twice = [i for i, n in ids.items() if n > 1]
    if twice or ids[HELPERS_ID] != 1:
        raise ValueError(f"{md_path.name}: grade ids used twice {twice}, or no single {HELPERS_ID!r} cell")
    return nb


def build(root: Path = COURSE) -> list[Path]:
    """Write ``source/<a>/<a>.ipynb`` for every assignment; returns their paths."""
    helpers = (COURSE / "helpers.py").read_text()
    written = []
    for name in assignment_names(root):
        nb = build_notebook(root / "source" / name / f"{name}.md", helpers)
        path = root / "source" / name / f"{name}.ipynb"
        nbformat.write(nb, path)
        written.append(path)
    return written


@dataclass
class TaskInfo:
    """One graded task: its name (as its tests print it) and the points of its test cells."""

    name: str
    visible: float = 0.0
    hidden: float = 0.0


@dataclass
class AssignmentInfo:
    """What the teacher guide shows of one assignment (from its source's metadata and cells)."""

    name: str
    title: str
    chapters: str
    minutes: int
    goals: list
    tasks: list

    @property
    def points(self) -> float:
        return sum(t.visible + t.hidden for t in self.tasks)


def graded_cells(nb) -> list[tuple[str, str, float, bool]]:
    """``(task name, grade id, points, hidden)`` of every graded test cell of a source notebook, in
    order; a cell's task is the ``Task("...")`` name it checks."""
    out = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        found = re.search(r'Task\("([^"]+)"', cell.source)
        if meta.get("grade") and found:
            out.append((found.group(1), meta["grade_id"], float(meta["points"]), "BEGIN HIDDEN TESTS" in cell.source))
    return out


def summary(root: Path = COURSE) -> list[AssignmentInfo]:
    """Every assignment's title, chapters, expected minutes, learning goals and tasks with their
    points, read from the sources (a task is the test cells that check the same ``Task`` name)."""
    helpers = (COURSE / "helpers.py").read_text()
    out = []
    for name in assignment_names(root):
        nb = build_notebook(root / "source" / name / f"{name}.md", helpers)
        info, tasks = nb.metadata["assignment"], {}
        for task_name, _, points, hidden in graded_cells(nb):
            task = tasks.setdefault(task_name, TaskInfo(task_name))
            if hidden:
                task.hidden += points
            else:
                task.visible += points
        out.append(AssignmentInfo(name, info["title"], str(info["chapters"]), int(info["minutes"]),
                                  list(info["goals"]), list(tasks.values())))
    return out


# --------------------------------------------------------------------------------------------------
# nbgrader
# --------------------------------------------------------------------------------------------------
def load_config(root: Path = COURSE):
    """The course's nbgrader configuration (``root/nbgrader_config.py``), as nbgrader reads it."""
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
    config.CourseDirectory.root = str(root)
    return config


def nbgrader_api(root: Path = COURSE):
    """nbgrader's Python API on the course in ``root``, configured by ``root/nbgrader_config.py``."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    # nbgrader creates a gradebook by running the `alembic` script that sits beside this Python,
    # which is not on PATH when the venv's python is called directly (as make does).
    scripts = str(Path(sys.executable).parent)
    if scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")
    config = load_config(root)
    return NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)


def release(root: Path = COURSE) -> list[Path]:
    """``build``, then ``nbgrader generate_assignment`` for each assignment; the release notebooks."""
    build(root)
    api = nbgrader_api(root)
    out = []
    for name in assignment_names(root):
        result = api.generate_assignment(name, force=True, create=True)
        if not result["success"]:
            raise RuntimeError(f"nbgrader generate_assignment {name} failed:\n{result.get('error', '')}"
                               f"\n{result.get('log', '')}")
        out.append(root / "release" / name / f"{name}.ipynb")
    return out


# --------------------------------------------------------------------------------------------------
# Checking and grading submissions
# --------------------------------------------------------------------------------------------------
@dataclass
class Problem:
    """Something about a submission a teacher should know.  ``blocking``: it is not autograded."""

    kind: str
    message: str
    blocking: bool = False


def _nbgrader_cells(nb) -> list:
    return [c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id")]


def _without_hidden_tests(source: str) -> str:
    """A test cell's source as released: the ``### BEGIN/END HIDDEN TESTS`` region taken out."""
    return re.sub(r"[ \t]*### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS[ \t]*\n?", "", source, flags=re.S).rstrip()


def precheck(nb, released) -> tuple[list[Problem], bool]:
    """What nbgrader would do silently or fail on, for one submitted notebook ``nb`` (a notebook
    node, repaired in place where it can be); ``released`` is the released notebook.  Returns the
    problems and whether ``nb`` was changed.

    * answer cells without their nbgrader metadata (a tool stripped it, or the cells were deleted):
      nbgrader scores such a notebook 0 without a word (with ``add_missing_cells`` it aborts), so
      it is blocking and reported;
    * a cell id present twice (a copied cell): nbgrader 0.9 means to keep the last copy, but
      aborts the notebook instead (its ``DeduplicateIds`` leaves an empty ``nbgrader`` entry that
      ``add_missing_cells`` cannot read), so the earlier copies are made ordinary cells here;
    * test cells deleted: nbgrader adds them back (``add_missing_cells``); reported;
    * a locked cell edited: nbgrader restores it before running; reported.
    """
    from nbgrader.utils import is_grade, is_locked, is_solution

    reference = {c.metadata.nbgrader["grade_id"]: c for c in _nbgrader_cells(released)}
    cells = _nbgrader_cells(nb)
    seen = Counter(c.metadata.nbgrader["grade_id"] for c in cells)
    problems, changed = [], False
    answers = [i for i, c in reference.items() if is_solution(c)]
    lost = [i for i in answers if i not in seen]
    if lost:
        problems.append(Problem(
            "metadata stripped", f"{len(lost)} of {len(answers)} answer cells have no nbgrader metadata "
            f"({', '.join(lost)}); {len(cells)} of {len(reference)} nbgrader cells are left. nbgrader would "
            "score this notebook 0 without a word, so it was not autograded: restore the metadata (e.g. paste "
            "the answers into a fresh copy of the release) and grade again", True))
    for grade_id, n in sorted(seen.items()):
        if n > 1:
            copies = [c for c in cells if c.metadata.nbgrader["grade_id"] == grade_id]
            for c in copies[:-1]:
                del c.metadata["nbgrader"]
            changed = True
            problems.append(Problem("duplicate cell", f"cell {grade_id!r} appears {n} times (a copied cell): the "
                                    "last copy is graded, the earlier ones were made ordinary cells (nbgrader "
                                    "would have aborted this notebook)"))
    deleted = [i for i, c in reference.items() if is_grade(c) and not is_solution(c) and i not in seen]
    if deleted and not lost:
        problems.append(Problem("tests deleted", f"test cells deleted: {', '.join(deleted)}; nbgrader adds them back"))
    for c in _nbgrader_cells(nb):
        ref = reference.get(c.metadata.nbgrader["grade_id"])
        if ref is not None and is_locked(ref) and _without_hidden_tests(c.source) != ref.source.rstrip():
            problems.append(Problem("locked cell edited", f"locked cell {ref.metadata.nbgrader['grade_id']!r} "
                                    "was edited; nbgrader restores it before grading"))
    if not lost:   # a stripped notebook is not graded anyway: its locked cells look like the student's
        problems += suspicious_code(nb, released)
    return problems, changed


# What a student's cell has no business doing: each pattern, and what it is for a teacher.
SUSPICIOUS = [
    (r"\b_getframe\b|\b_current_frames\b|\bcurrentframe\b|\binspect\.(stack|trace|getouterframes|getinnerframes)\b"
     r"|\b(f_back|f_locals|f_globals|tb_frame|gi_frame|cr_frame)\b|\b(extract|walk)_stack\b",
     "inspects the call stack (the tests' frames hold the expected answers)"),
    (r"\bgc\.get_(referrers|referents|objects)\b", "searches the interpreter's objects (gc)"),
    (r"\bgetsource(lines)?\b|\bgetsourcefile\b", "reads source code (inspect.getsource)"),
    (r"(?<![\w.])(exec|eval|compile)\s*\(|\b__import__\b|\bimportlib\b", "runs code built at run time (exec/eval/compile)"),
    (r"\b(settrace|setprofile|gettrace)\b", "changes the tracing the tests use to spot the package's code"),
    (r"\b__builtins__\b|\bimport\s+builtins\b|\bbuiltins\.|\bsys\.modules\b|\b__globals__\b|\b__code__\b"
     r"|\b__closure__\b|\bglobals\(\)|\bctypes\b|\bget_ipython\b|\bPyThreadState",
     "reaches into the interpreter (builtins, sys.modules, globals(), code objects, ctypes, IPython)"),
]


def _bound_names(tree) -> dict:
    """``{name: what}`` of the names a cell's top level binds (``what``: ``import x.y`` for imports)."""
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = "def"
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                source = f"{getattr(node, 'module', '') or ''}.{a.name}"
                out[a.asname or a.name.split(".")[0]] = f"import {source}"
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                for n in ast.walk(target):
                    if isinstance(n, ast.Name):
                        out[n.id] = "assign"
    return out


def _rebinding(tree, protected: dict):
    """``(line, name)`` where ``tree`` binds a name of ``protected`` (anywhere: a ``global``
    statement in a function counts, an import of the very same object does not)."""
    declared_global = {n for node in ast.walk(tree) if isinstance(node, ast.Global) for n in node.names}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node in tree.body:
            names = [node.name]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.asname or a.name.split(".")[0] for a in node.names
                     if protected.get(a.asname or a.name.split(".")[0]) !=
                     f"import {getattr(node, 'module', '') or ''}.{a.name}"]
            if node not in tree.body:
                names = [n for n in names if n in declared_global]
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            top = any(node in ast.walk(stmt) for stmt in tree.body
                      if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))
            names = [node.id] if top or node.id in declared_global else []
        else:
            continue
        for name in names:
            if name in protected:
                yield node.lineno, name


def suspicious_code(nb, released) -> list[Problem]:
    """The lines of a submission's own cells (answer cells and cells the student added) that
    redefine a name of the locked cells (the grading helpers ``Task`` & co., the set-up's imports,
    a given launcher or class), inspect the tests' frames, search the interpreter's objects, read
    or run code at run time (``inspect.getsource``, ``exec``) or reach into the interpreter.  Not
    blocking: the grader reloads the helpers and the locked cells before each test cell, so most of
    it cannot change a score; a teacher should still read these lines."""
    from nbgrader.utils import is_locked

    protected, given = {}, {c.source.strip() for c in released.cells if c.cell_type == "code"}
    for c in released.cells:
        if c.cell_type == "code" and c.get("metadata", {}).get("nbgrader") and is_locked(c):
            try:
                protected.update(_bound_names(ast.parse(c.source)))
            except SyntaxError:
                pass
    protected = {n: w for n, w in protected.items() if not n.startswith("__")}
    problems = []
    for index, c in enumerate(nb.cells):
        meta = c.get("metadata", {}).get("nbgrader") or {}
        if c.cell_type != "code" or (meta.get("grade_id") and is_locked(c)) or c.source.strip() in given:
            continue
        where = f"cell {meta.get('grade_id') or c.get('id') or index}"
        lines = c.source.splitlines()
        found = []
        try:
            tree = ast.parse(c.source)
        except SyntaxError:
            tree = None
        if tree is not None:
            found += [(line, f"redefines {name!r}, a name of the locked cells (the tests use the original)")
                      for line, name in sorted(set(_rebinding(tree, protected)))]
        for k, line in enumerate(lines, 1):
            code = line.split("#")[0]
            found += [(k, why) for pattern, why in SUSPICIOUS if re.search(pattern, code)]
        by_reason = {}
        for k, why in sorted(set(found)):
            by_reason.setdefault(why, []).append(k)
        for why, at in by_reason.items():
            problems.append(Problem("suspicious code", f"{where}, line{'s' if len(at) > 1 else ''} "
                                    f"{', '.join(map(str, at))}: `{lines[at[0] - 1].strip()[:100]}`: {why}"))
    return problems


@dataclass
class Result:
    """One student's grading: ``status`` is ``graded``, ``not graded`` (a blocking problem) or
    ``failed`` (nbgrader raised); ``scores`` maps each graded cell to ``(score, max_score)``, the
    score ``None`` where the cell could not be graded (the submission ran out of time, or the
    kernel could not be restarted); ``seconds``: wall time of its nbgrader run; ``timed_out`` and
    ``died``: the cells that ran too long or crashed the kernel (they score 0)."""

    student: str
    status: str
    score: float = 0.0
    max_score: float = 0.0
    scores: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0
    timed_out: list = field(default_factory=list)
    died: list = field(default_factory=list)

    @property
    def not_graded(self) -> list:
        return [i for i, (score, _) in self.scores.items() if score is None]


def cell_score(grade) -> float | None:
    """One cell's points in the gradebook, or ``None`` when it has neither an autograded nor a
    manual score (a cell that could not be graded).  nbgrader's own ``Grade.score`` reads such a
    cell as 0, which is why neither the report nor the export uses it."""
    base = grade.manual_score if grade.manual_score is not None else grade.auto_score
    return None if base is None else float(base) + float(grade.extra_credit or 0)


def cell_scores(root: Path, assignment: str, student: str) -> dict:
    """``{grade_id: (score, max_score)}`` of one autograded submission, from the gradebook; the
    score is ``None`` for a cell that was not graded (:func:`cell_score`)."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        submission = gb.find_submission(assignment, student)
        return {g.name: (cell_score(g), float(g.max_score)) for nb in submission.notebooks for g in nb.grades}


def grade(assignment: str, root: Path = COURSE, students: list[str] | None = None,
          cell_timeout: int | None = None, submission_timeout: int | None = None) -> list[Result]:
    """Check and autograde every submission of ``assignment`` (or only ``students``), one at a time;
    logs go to ``logs/<assignment>/<student>.log``, the results to ``logs/<assignment>/results.json``
    (see :func:`write_results`).  ``cell_timeout``, ``submission_timeout``: seconds, in place of
    ``nbgrader_config.py``'s ``GuardedExecute`` settings."""
    api = nbgrader_api(root)
    if cell_timeout is not None:
        api.config.GuardedExecute.cell_timeout = cell_timeout
    if submission_timeout is not None:
        api.config.GuardedExecute.submission_timeout = submission_timeout
    reference = nbformat.read(root / "release" / assignment / f"{assignment}.ipynb", as_version=4)
    submitted = sorted(p.parent.parent.name for p in (root / "submitted").glob(f"*/{assignment}/{assignment}.ipynb"))
    logs = root / "logs" / assignment
    logs.mkdir(parents=True, exist_ok=True)
    results = []
    for student in students or submitted:
        if student not in submitted:
            results.append(Result(student, "not graded", problems=[Problem(
                "missing", f"no submitted/{student}/{assignment}/{assignment}.ipynb", True)]))
            continue
        path = root / "submitted" / student / assignment / f"{assignment}.ipynb"
        try:
            nb = nbformat.read(path, as_version=4)
        except Exception as e:  # not JSON, or not a notebook
            results.append(Result(student, "not graded", problems=[Problem(
                "unreadable", f"{path.name} is not a readable notebook ({type(e).__name__}: {e})", True)]))
            continue
        problems, changed = precheck(nb, reference)
        if changed:   # keep what the student handed in; grade the repaired copy
            (logs / f"{student}.submitted.ipynb").write_bytes(path.read_bytes())
            nbformat.write(nb, path)
        if any(p.blocking for p in problems):
            results.append(Result(student, "not graded", problems=problems))
            continue
        record_path = logs / f"{student}.grading.json"
        record_path.unlink(missing_ok=True)
        os.environ["PAGED_KV_GRADING_REPORT"] = str(record_path)
        start = time.perf_counter()
        try:
            out = api.autograde(assignment, student, force=True, create=True)
        finally:
            os.environ.pop("PAGED_KV_GRADING_REPORT", None)
        seconds = time.perf_counter() - start
        record = json.loads(record_path.read_text()) if record_path.is_file() else {}
        (logs / f"{student}.log").write_text(out.get("log", "") + out.get("error", ""))
        if not out["success"]:
            last = [line for line in out.get("error", "").strip().splitlines() if line.strip()][-1:]
            results.append(Result(student, "failed", problems=problems, error=last[0] if last else "error",
                                  seconds=seconds))
            continue
        scores = cell_scores(root, assignment, student)
        results.append(Result(student, "graded", sum(s for s, _ in scores.values() if s is not None),
                              sum(m for _, m in scores.values()), scores, problems, seconds=seconds,
                              timed_out=record.get("timed_out", []), died=record.get("died", [])))
    write_results(assignment, results, root)
    return results


def write_results(assignment: str, results: list[Result], root: Path = COURSE) -> Path:
    """``logs/<assignment>/results.json``: per student its status, score (of the graded cells),
    maximum, seconds, problems, and per graded cell ``[score, max_score]`` with ``null`` for a
    cell that was not graded (the gradebook holds no score for it: nbgrader's "needs manual
    grade"), and the cells that timed out or crashed the kernel (scored 0).  Students graded in
    an earlier run and not in this one keep their entries."""
    path = root / "logs" / assignment / "results.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    for r in results:
        old[r.student] = {"status": r.status, "score": r.score, "max_score": r.max_score,
                          "seconds": round(r.seconds, 1), "scores": r.scores, "not_graded": r.not_graded,
                          "timed_out": r.timed_out, "died": r.died, "error": r.error,
                          "problems": [{"kind": p.kind, "message": p.message, "blocking": p.blocking}
                                       for p in r.problems]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(old, indent=1, sort_keys=True) + "\n")
    return path


def report(assignment: str, results: list[Result]) -> str:
    """One line per student (score, seconds), then what to look at."""
    lines = [f"{assignment}: {len(results)} submissions"]
    for r in results:
        score = f"{r.score:g} / {r.max_score:g}" if r.status == "graded" else r.status.upper()
        lines.append(f"  {r.student:<24} {score:<12} {r.seconds:6.1f} s" if r.seconds else f"  {r.student:<24} {score}")
        lines += [f"      {p.kind}: {p.message}" for p in r.problems]
        if r.timed_out:
            lines.append(f"      timed out (scored 0): {', '.join(r.timed_out)}")
        if r.died:
            lines.append(f"      crashed the kernel (scored 0): {', '.join(r.died)}")
        if r.not_graded:
            lines.append(f"      NOT GRADED (no score, grade by hand or regrade): {', '.join(r.not_graded)}")
        if r.error:
            lines.append(f"      nbgrader failed: {r.error} (see logs/{assignment}/{r.student}.log)")
    return "\n".join(lines)


def make_parser() -> argparse.ArgumentParser:
    """The command line: ``build``, ``release``, ``roster``, ``grade``, ``export``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="MyST sources -> nbgrader source notebooks")
    sub.add_parser("release", help="build, then nbgrader generate_assignment for every assignment")
    r = sub.add_parser("roster", help="add the class list (a CSV, e.g. the LMS's gradebook export) to the gradebook")
    r.add_argument("file", help="CSV with a header: an id column (ID, id, ...) and names (Student, or first/last name)")
    g = sub.add_parser("grade", help="check and autograde every submission, one student at a time")
    g.add_argument("assignment", choices=assignment_names())
    g.add_argument("--student", action="append", help="only this student (repeatable)")
    g.add_argument("--cell-timeout", type=int, help="seconds an answer or test cell may run (config: 60)")
    g.add_argument("--submission-timeout", type=int, help="seconds one submission may take (config: 300)")
    e = sub.add_parser("export", help="per-task scores, the LMS's grade import file and the feedback archive")
    e.add_argument("assignment", choices=assignment_names())
    e.add_argument("--column", help="the grade column's name in the LMS import file, as the LMS's own export "
                   "names the assignment (Canvas: 'Assignment 3 (12345)'); default: the assignment's name")
    return parser


def main(argv=None) -> int:
    args = make_parser().parse_args(argv)
    if args.command in ("roster", "export"):
        import gradebook   # the class list and the export (assignments/gradebook.py); it imports this module
    if args.command == "roster":
        try:
            students = gradebook.add_roster(Path(args.file))
        except (OSError, ValueError) as e:
            print(f"roster: {e}", file=sys.stderr)
            return 2
        print(f"{len(students)} students in gradebook.db, roster kept as roster.csv")
        return 0
    if args.command == "export":
        gradebook.export(args.assignment, column=args.column)
        print(gradebook.export_report(args.assignment))
        return 0
    if args.command == "build":
        for path in build():
            print(f"wrote {path.relative_to(COURSE.parent)}")
    elif args.command == "release":
        for path in release():
            print(f"released {path.relative_to(COURSE.parent)}")
    else:
        results = grade(args.assignment, students=args.student, cell_timeout=args.cell_timeout,
                        submission_timeout=args.submission_timeout)
        print(report(args.assignment, results))
        print(f"Next: nbgrader generate_feedback {args.assignment} (feedback/<student>/{args.assignment}/), "
              f"then python course.py export {args.assignment} (export/{args.assignment}/)")
        return 0 if all(r.status == "graded" and not r.not_graded for r in results) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
