"""The class list, and the grades and feedback back to the LMS: ``course.py roster`` and
``course.py export`` (see ``course.py``; the book's teacher guide shows the loop).

* :func:`add_roster`: the class list (the LMS's gradebook export, or any CSV with an id column and
  names) into nbgrader's gradebook, kept as ``roster.csv``;
* :func:`export`: per-task scores from the gradebook ("not graded" where a cell has no score,
  never 0), the LMS's late mark from the files ``nbgrader zip_collect`` unpacked, the LMS's grade
  import file and the feedback archive.
"""

from __future__ import annotations

import os
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from course import COURSE, build_notebook, cell_score, graded_cells, load_config

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
                scores = {g.name: cell_score(g) for n in gb.find_submission(assignment, s.id).notebooks for g in n.grades}
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


def _points(value) -> str:
    return NOT_GRADED if value is None else f"{value:g}"


def export(assignment: str, root: Path = COURSE, column: str | None = None) -> dict[str, Path]:
    """Write ``export/<assignment>/``: ``scores.csv`` for the teacher (one row per student: names,
    late, status, each task's points or "not graded", the total and the maximum), ``lms_grades.csv``
    for the LMS's gradebook import (the roster's own identifying columns as it had them, and one
    column ``column`` (default: the assignment's name) with the total; empty where there is no total,
    so that an import leaves that student's grade alone, never 0; with a roster, only its students),
    and ``feedback.zip``, each
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
    roster = (root / "roster.csv").is_file()
    columns = read_roster(root / "roster.csv")[0] if roster else ["ID"]
    id_col = _column(columns, ID_COLUMNS) or columns[0]
    with open(paths["lms"], "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns + [column or assignment])
        for r in rows:
            if roster and not r.student.columns:   # not on the class list: the LMS would not know the id
                continue
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
