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
* ``python assignments/course.py grade <a> [--student ID ...]``: for every submission in
  ``submitted/<student>/<a>/``, one at a time: check it (:func:`precheck`), autograde it in its own
  nbgrader run (a broken notebook fails alone), and print one line per student.  Exits 1 when a
  submission could not be graded, after grading all the others;
* ``python assignments/course.py export <a> [--column NAME]``: ``export/<a>/scores.csv`` (each
  task's points, "not graded" where a task could not be graded, the LMS's late mark),
  ``lms_grades.csv`` (the roster's id and name columns and the total, for the LMS's gradebook
  import) and ``feedback.zip`` (one feedback file per student, named as their LMS submission).

The nbgrader settings (interpreter switch, timeouts, zip_collect's file-name pattern, feedback
without hidden tests) live in ``nbgrader_config.py``; the book's teacher guide explains them.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
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
    return problems, changed


@dataclass
class Result:
    """One student's grading: ``status`` is ``graded``, ``not graded`` (a blocking problem) or
    ``failed`` (nbgrader raised); ``scores`` maps each graded cell to ``(score, max_score)``."""

    student: str
    status: str
    score: float = 0.0
    max_score: float = 0.0
    scores: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)
    error: str = ""


def cell_scores(root: Path, assignment: str, student: str) -> dict:
    """``{grade_id: (score, max_score)}`` of one autograded submission, from the gradebook."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        submission = gb.find_submission(assignment, student)
        return {g.name: (float(g.score), float(g.max_score)) for nb in submission.notebooks for g in nb.grades}


def grade(assignment: str, root: Path = COURSE, students: list[str] | None = None) -> list[Result]:
    """Check and autograde every submission of ``assignment`` (or only ``students``), one at a time;
    logs go to ``logs/<assignment>/<student>.log``."""
    api = nbgrader_api(root)
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
        out = api.autograde(assignment, student, force=True, create=True)
        (logs / f"{student}.log").write_text(out.get("log", "") + out.get("error", ""))
        if not out["success"]:
            last = [line for line in out.get("error", "").strip().splitlines() if line.strip()][-1:]
            results.append(Result(student, "failed", problems=problems, error=last[0] if last else "error"))
            continue
        scores = cell_scores(root, assignment, student)
        results.append(Result(student, "graded", sum(s for s, _ in scores.values()),
                              sum(m for _, m in scores.values()), scores, problems))
    return results


def report(assignment: str, results: list[Result]) -> str:
    """One line per student, then what to look at."""
    lines = [f"{assignment}: {len(results)} submissions"]
    for r in results:
        score = f"{r.score:g} / {r.max_score:g}" if r.status == "graded" else r.status.upper()
        lines.append(f"  {r.student:<24} {score}")
        lines += [f"      {p.kind}: {p.message}" for p in r.problems]
        if r.error:
            lines.append(f"      nbgrader failed: {r.error} (see logs/{assignment}/{r.student}.log)")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# The class list, and the grades and feedback back to the LMS
# --------------------------------------------------------------------------------------------------
NOT_GRADED = "not graded"
# A roster's columns, by what they hold (header names compared case-insensitively).  Canvas's
# gradebook export: "Student" ("Last, First"), "ID" (the user id in its submission file names),
# "SIS User ID", "SIS Login ID", "Section"; Moodle's: "First name", "Last name", "ID number",
# "Email address"; or plain "id", "first_name", "last_name", "email" (nbgrader's own import).
ID_COLUMNS = ("id", "student_id", "student id", "id number", "username")
FIRST_COLUMNS = ("first_name", "first name", "firstname")
LAST_COLUMNS = ("last_name", "last name", "lastname", "surname")
NAME_COLUMNS = ("student", "name", "student name", "full name")
EMAIL_COLUMNS = ("email", "email address", "e-mail")
LMS_COLUMNS = ("sis user id", "sis login id", "section", "integration id")   # carried back as they came


@dataclass
class Student:
    """One row of the class list: ``id`` is the id the LMS writes into its submission file names
    (nbgrader's student id); ``columns`` are the row's identifying columns as the roster had them,
    written back unchanged into the LMS import file."""

    id: str
    first_name: str = ""
    last_name: str = ""
    email: str = ""
    columns: dict = field(default_factory=dict)


def _gradebook(root: Path):
    """The course's gradebook (``root/gradebook.db``, created if missing: nbgrader then runs the
    ``alembic`` script beside this Python, put on PATH as in :func:`nbgrader_api`)."""
    from nbgrader.api import Gradebook

    scripts = str(Path(sys.executable).parent)
    if scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")
    return Gradebook(f"sqlite:///{root / 'gradebook.db'}")


def _column(header: list[str], names: tuple) -> str | None:
    return next((h for h in header if h.strip().lower() in names), None)


def read_roster(path: Path) -> tuple[list[str], list[Student]]:
    """The class list in the CSV file ``path``: its identifying columns (in the file's order) and
    its students.  The file needs a header row with an id column (``ID``, ``id``, ``ID number``, ...)
    and names, as first and last name columns or as one ``Student`` column (``Last, First`` as Canvas
    writes it, or ``First Last``); an email column is optional.  Rows without an id (Canvas's
    "Points Possible" row) are skipped.  Raises ``ValueError`` for a file without an id column or
    with an id twice."""
    import csv

    with open(path, newline="", encoding="utf-8-sig") as f:
        rows = list(csv.DictReader(f))
        header = list(rows[0].keys()) if rows else []
    id_col = _column(header, ID_COLUMNS)
    if id_col is None:
        raise ValueError(f"{path}: no id column (one of {', '.join(ID_COLUMNS)}) in its header {header}")
    first, last, name, email = (_column(header, c) for c in (FIRST_COLUMNS, LAST_COLUMNS, NAME_COLUMNS, EMAIL_COLUMNS))
    keep = [h for h in header if h in (id_col, first, last, name, email) or h.strip().lower() in LMS_COLUMNS]
    students, seen = [], set()
    for row in rows:
        sid = (row.get(id_col) or "").strip()
        if not sid or (name and "points possible" in (row.get(name) or "").lower()):
            continue
        if sid in seen:
            raise ValueError(f"{path}: student id {sid!r} is listed twice")
        seen.add(sid)
        given = (row.get(first) or "").strip() if first else ""
        family = (row.get(last) or "").strip() if last else ""
        if name and not (given or family):
            full = (row.get(name) or "").strip()
            family, _, given = full.partition(",") if "," in full else tuple(reversed(full.rpartition(" ")))
            given, family = given.strip(), family.strip()
        students.append(Student(sid, given, family, (row.get(email) or "").strip() if email else "",
                                {h: row.get(h) or "" for h in keep}))
    return keep, students


def add_roster(path: Path, root: Path = COURSE) -> list[Student]:
    """Add (or update) every student of the class list ``path`` in the course's gradebook (names
    and email: nbgrader's feedback, the formgrader and the exports show them), and keep a copy of
    the file as ``root/roster.csv`` for :func:`export`."""
    import shutil

    _, students = read_roster(Path(path))
    with _gradebook(root) as gb:
        for s in students:
            gb.update_or_create_student(s.id, first_name=s.first_name or None, last_name=s.last_name or None,
                                        email=s.email or None, lms_user_id=s.id)
    if Path(path).resolve() != (root / "roster.csv").resolve():
        shutil.copyfile(path, root / "roster.csv")
    return students


def lms_files(assignment: str, root: Path = COURSE) -> dict[str, tuple[str, bool]]:
    """``{student id: (file name, late)}`` of the files ``nbgrader zip_collect`` took from the LMS
    export (``downloaded/<assignment>/extracted/``), matched with ``nbgrader_config.py``'s file-name
    pattern.  ``late``: the LMS marked the file late (Canvas writes ``LATE_`` after the student's
    name); nbgrader reads the name and drops the mark.  A student's last file in name order wins
    (a resubmission's ``(1)`` or ``-1`` sorts after the first)."""
    pattern = load_config(root).FileNameCollectorPlugin.named_regexp
    found = {}
    for path in sorted((root / "downloaded" / assignment / "extracted").rglob("*")):
        read = lms_name(str(path), pattern) if path.is_file() else None
        if read:
            found[read[0]] = (path.name, read[1])
    return found


def lms_name(path: str, pattern: str) -> tuple[str, bool] | None:
    """``(student id, late)`` read from the path of a file in an LMS export with zip_collect's
    ``pattern`` (``None`` if it does not match): late when a ``LATE`` part stands before the id
    in the file's name, as Canvas writes it (``roejohn_LATE_1002_...``)."""
    m = re.match(pattern, path)
    if not m:
        return None
    name_start = len(path) - len(Path(path).name)
    before = path[name_start:m.start("student_id")] if m.start("student_id") >= name_start else ""
    return m["student_id"], "LATE" in before.upper().split("_")


def _feedback_name(assignment: str, student: str, lms_file: str | None) -> str:
    """The file name of a student's feedback in the archive for the LMS: the LMS's own prefix of
    their submission (Canvas: ``name_userid_submissionid_``), by which its bulk upload matches a
    file to a student, then ``<assignment>_feedback.html``; ``<student>_...`` without one."""
    prefix = f"{student}_"
    if lms_file:
        at = lms_file.find(f"_{student}_")
        if at >= 0:
            rest = lms_file[at + len(student) + 2:]
            sub = re.match(r"\d+_", rest)
            prefix = lms_file[:at + len(student) + 2] + (sub.group(0) if sub else "")
    return f"{prefix}{assignment}_feedback.html"


@dataclass
class GradeRow:
    """One student's grade of one assignment, as :func:`export` writes it.  ``tasks`` maps each
    task to its points, or ``None`` where it was not graded (a timeout, a dead kernel); ``status``:
    ``graded`` (every task), ``partly graded`` (some task not graded), ``not graded`` (handed in,
    never autograded: ``course.py grade`` refused it or nbgrader failed), ``no submission``."""

    student: Student
    status: str
    late: bool = False
    tasks: dict = field(default_factory=dict)
    lms_file: str | None = None

    @property
    def score(self) -> float | None:
        """The total, or ``None`` unless every task was graded (a total of what ran would read as a grade)."""
        if self.status != "graded":
            return None
        return sum(self.tasks.values())


def grade_rows(assignment: str, root: Path = COURSE) -> tuple[list[tuple[str, float]], list[GradeRow]]:
    """The tasks of ``assignment`` with their points, and one :class:`GradeRow` per student of
    the roster (``roster.csv``, in its order), then per student graded or handed in who is not on
    it.  Per-task points are summed from the gradebook's cell scores (a cell whose score is
    ``None`` was not graded; its task is then not graded); late marks come from :func:`lms_files`."""
    from nbgrader.api import MissingEntry

    nb = build_notebook(root / "source" / assignment / f"{assignment}.md", (COURSE / "helpers.py").read_text())
    cells = graded_cells(nb)
    tasks = {}
    for task, _, points, _ in cells:
        tasks[task] = tasks.get(task, 0.0) + points
    roster = read_roster(root / "roster.csv")[1] if (root / "roster.csv").is_file() else []
    files = lms_files(assignment, root)
    handed_in = {p.parent.parent.name for p in (root / "submitted").glob(f"*/{assignment}/{assignment}.ipynb")}
    rows = []
    with _gradebook(root) as gb:
        known = {s.id: s for s in gb.students}
        try:
            graded = {s.student.id for s in gb.find_assignment(assignment).submissions}
        except MissingEntry:
            graded = set()
        listed = {s.id for s in roster}
        extra = sorted((graded | handed_in | set(files)) - listed)
        for s in roster + [Student(i, known[i].first_name or "", known[i].last_name or "", known[i].email or "")
                           if i in known else Student(i) for i in extra]:
            name, late = files.get(s.id, (None, False))
            if s.id in graded:
                scores = {g.name: _cell_score(g) for n in gb.find_submission(assignment, s.id).notebooks for g in n.grades}
                per_task = {}
                for task, grade_id, _, _ in cells:
                    score = scores.get(grade_id)
                    per_task[task] = None if score is None or per_task.get(task, 0.0) is None \
                        else per_task.get(task, 0.0) + float(score)
                done = [v is not None for v in per_task.values()]
                status = "graded" if all(done) else "partly graded" if any(done) else NOT_GRADED
                rows.append(GradeRow(s, status, late, per_task, name))
            else:
                rows.append(GradeRow(s, NOT_GRADED if s.id in handed_in or name else "no submission", late, {}, name))
    return list(tasks.items()), rows


def _cell_score(grade) -> float | None:
    """One cell's points in the gradebook, or ``None`` when it has neither an autograded nor a
    manual score (a cell that could not be graded).  nbgrader's own ``Grade.score`` reads such a
    cell as 0, which is why the export does not use it."""
    base = grade.manual_score if grade.manual_score is not None else grade.auto_score
    return None if base is None else float(base) + float(grade.extra_credit or 0)


def _points(value) -> str:
    return NOT_GRADED if value is None else f"{value:g}"


def export(assignment: str, root: Path = COURSE, column: str | None = None) -> dict[str, Path]:
    """Write ``export/<assignment>/``: ``scores.csv`` for the teacher (one row per student: names,
    late, status, each task's points or "not graded", the total and the maximum), ``lms_grades.csv``
    for the LMS's gradebook import (the roster's own identifying columns as it had them, and one
    column ``column`` (default: the assignment's name) with the total; empty where there is no total,
    so that an import leaves that student's grade alone, never 0), and ``feedback.zip``, each
    student's ``feedback/<student>/<assignment>/<assignment>.html`` under the name of their LMS
    submission (see :func:`_feedback_name`).  Returns the three paths."""
    import csv
    import zipfile

    tasks, rows = grade_rows(assignment, root)
    out = root / "export" / assignment
    out.mkdir(parents=True, exist_ok=True)
    maximum = sum(p for _, p in tasks)
    paths = {"scores": out / "scores.csv", "lms": out / "lms_grades.csv", "feedback": out / "feedback.zip"}
    with open(paths["scores"], "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student_id", "last_name", "first_name", "email", "late", "status"]
                   + [f"{t} ({p:g})" for t, p in tasks] + ["total", "max_score"])
        for r in rows:
            s = r.student
            w.writerow([s.id, s.last_name, s.first_name, s.email, "late" if r.late else "", r.status]
                       + [_points(r.tasks[t]) if t in r.tasks else "" for t, _ in tasks]
                       + [_points(r.score) if r.status in ("graded", "partly graded") else "", f"{maximum:g}"])
    columns = read_roster(root / "roster.csv")[0] if (root / "roster.csv").is_file() else ["ID"]
    id_col = _column(columns, ID_COLUMNS) or columns[0]
    with open(paths["lms"], "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns + [column or assignment])
        for r in rows:
            values = r.student.columns or {id_col: r.student.id}
            w.writerow([values.get(c, "") for c in columns] + ["" if r.score is None else f"{r.score:g}"])
    with zipfile.ZipFile(paths["feedback"], "w", zipfile.ZIP_DEFLATED) as z:
        for r in rows:
            html = root / "feedback" / r.student.id / assignment / f"{assignment}.html"
            if html.is_file():
                z.write(html, _feedback_name(assignment, r.student.id, r.lms_file))
    return paths


def export_report(assignment: str, root: Path = COURSE) -> str:
    """What :func:`export` wrote, and whom to look at: not graded, partly graded, late, no feedback, not on the roster."""
    tasks, rows = grade_rows(assignment, root)
    roster = {s.id for s in read_roster(root / "roster.csv")[1]} if (root / "roster.csv").is_file() else set()
    counts = Counter(r.status for r in rows)
    lines = [f"{assignment}: {len(rows)} students: " + ", ".join(f"{n} {k}" for k, n in counts.items())]
    for r in rows:
        notes = []
        if r.status == "partly graded":
            notes.append(NOT_GRADED + ": " + ", ".join(t for t, v in r.tasks.items() if v is None))
        elif r.status in (NOT_GRADED, "no submission"):
            notes.append(r.status)
        if r.late:
            notes.append("late")
        if r.status != "no submission" and not (root / "feedback" / r.student.id / assignment / f"{assignment}.html").is_file():
            notes.append("no feedback file")
        if roster and r.student.id not in roster:
            notes.append("not on the roster (python course.py roster FILE)")
        if notes:
            lines.append(f"  {r.student.id:<12} {(r.student.first_name + ' ' + r.student.last_name).strip():<24} {'; '.join(notes)}")
    out = root / "export" / assignment
    lines.append(f"Wrote {out / 'scores.csv'} (per task), {out / 'lms_grades.csv'} (LMS import), "
                 f"{out / 'feedback.zip'} (feedback upload)")
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
    e = sub.add_parser("export", help="per-task scores, the LMS's grade import file and the feedback archive")
    e.add_argument("assignment", choices=assignment_names())
    e.add_argument("--column", help="the grade column's name in the LMS import file, as the LMS's own export "
                   "names the assignment (Canvas: 'Assignment 3 (12345)'); default: the assignment's name")
    return parser


def main(argv=None) -> int:
    args = make_parser().parse_args(argv)
    if args.command == "roster":
        try:
            students = add_roster(Path(args.file))
        except (OSError, ValueError) as e:
            print(f"roster: {e}", file=sys.stderr)
            return 2
        print(f"{len(students)} students in gradebook.db, roster kept as roster.csv")
        return 0
    if args.command == "export":
        export(args.assignment, column=args.column)
        print(export_report(args.assignment))
        return 0
    if args.command == "build":
        for path in build():
            print(f"wrote {path.relative_to(COURSE.parent)}")
    elif args.command == "release":
        for path in release():
            print(f"released {path.relative_to(COURSE.parent)}")
    else:
        results = grade(args.assignment, students=args.student)
        print(report(args.assignment, results))
        print(f"Next: nbgrader generate_feedback {args.assignment} (feedback/<student>/{args.assignment}/), "
              f"then python course.py export {args.assignment} (export/{args.assignment}/)")
        return 0 if all(r.status == "graded" for r in results) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
