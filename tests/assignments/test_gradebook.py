"""The teacher's loop around grading, without running a notebook: the class list into the
gradebook, the export with per-task scores, late marks and "not graded", the LMS import file and
the feedback archive; and every command the teacher guide gives, checked against what
``make install`` provides (``assignments/gradebook.py``, ``course.py``'s command line).

A fake class of three (Canvas's file names and gradebook export): Jane Doe, full marks; John Roe,
late, the visible tests' points only; Anne Poe, one task not graded (its cells have no score, as a
timeout or a dead kernel leaves them).  Their scores are written into the gradebook directly, and
the expected values are worked out here from the assignment's MyST source, by a regex over its
cell headers, not by the code under test.
"""

import csv
import re
import shlex
import shutil
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

sys.path.insert(0, str(ROOT / "assignments"))
import course  # noqa: E402
import gradebook  # noqa: E402

A = "a7_prefix_caching"
ROSTER = """Student,ID,SIS User ID,SIS Login ID,Section,Assignment 7 (777)
    Points Possible,,,,,11
"Doe, Jane",1001,S1001,jdoe,Sec A,
"Roe, John",1002,S1002,jroe,Sec A,
"Poe, Anne",1003,S1003,apoe,Sec B,
"""
LMS_FILES = {"1001": "doejane_1001_5001_Copy of a7_prefix_caching.ipynb",
             "1002": "roejohn_LATE_1002_5002_a7_prefix_caching (1).ipynb",
             "1003": "poeanne_1003_5003_a7_prefix_caching.ipynb"}
NOT_GRADED_TASK = "CachedFreeList"


def source_cells():
    """``[(task, grade id, points, hidden)]`` of the graded cells, read from the MyST text alone."""
    text = (ROOT / "assignments" / "source" / A / f"{A}.md").read_text()
    out = []
    for header, body in re.findall(r"```\{code-cell\} ipython3\n---\n(nbgrader: \{[^}]*\})\n---\n(.*?)```", text, re.S):
        m = re.search(r"grade_id: (\w+), grade: true, locked: true, points: (\d+)", header)
        if m:
            out.append((re.search(r'Task\("([^"]+)"', body).group(1), m[1], int(m[2]), "BEGIN HIDDEN TESTS" in body))
    return out


def score_of(student, task, points, hidden):
    """The fake class's scores, per cell: None where not graded."""
    if student == "1003" and task == NOT_GRADED_TASK:
        return None
    return 0 if student == "1002" and hidden else points


@pytest.fixture(scope="module")
def course_dir(tmp_path_factory):
    import nbgrader.api
    from nbgrader.api import Gradebook

    root = tmp_path_factory.mktemp("gradebook_course")
    shutil.copy(ROOT / "assignments" / "nbgrader_config.py", root)
    (root / "source" / A).mkdir(parents=True)
    shutil.copy(ROOT / "assignments" / "source" / A / f"{A}.md", root / "source" / A)
    (root / "canvas_export.csv").write_text(ROSTER)
    with pytest.MonkeyPatch.context() as mp:
        # A new gradebook records its schema version, which nbgrader asks a subprocess for
        # (`alembic heads`: about 5 s of CPU); nothing here migrates the schema, and
        # test_grading.py creates its gradebook the real way.
        mp.setattr(nbgrader.api, "get_alembic_version", lambda: "not-migrated")
        students = gradebook.add_roster(root / "canvas_export.csv", root)
    # The gradebook as nbgrader leaves it after autograding: the assignment's graded cells, one
    # submission per student, a score per cell (or none).
    cells = source_cells()
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        gb.add_assignment(A)
        gb.add_notebook(A, A)
        for _, grade_id, points, _ in cells:
            gb.add_grade_cell(grade_id, A, A, max_score=points, cell_type="code")
        for s in ("1001", "1002", "1003"):
            gb.add_submission(A, s)
            for task, grade_id, points, hidden in cells:
                grade = gb.find_grade(grade_id, A, A, s)
                grade.auto_score = score_of(s, task, points, hidden)
        gb.db.commit()
    for s, name in LMS_FILES.items():   # what `nbgrader zip_collect` leaves of the LMS's archive
        for folder in ("downloaded/" + A + "/extracted", f"submitted/{s}/{A}"):
            (root / folder).mkdir(parents=True, exist_ok=True)
        (root / "downloaded" / A / "extracted" / name).write_text("{}")
        (root / "submitted" / s / A / f"{A}.ipynb").write_text("{}")
        (root / "feedback" / s / A).mkdir(parents=True)
        (root / "feedback" / s / A / f"{A}.html").write_text(f"<p>feedback of {s}</p>")
    (root / "submitted" / "9999" / A).mkdir(parents=True)   # handed in, never graded, not on the class list
    (root / "submitted" / "9999" / A / f"{A}.ipynb").write_text("{}")
    paths = gradebook.export(A, root, column="Assignment 7 (777)")
    return {"root": root, "students": students, "paths": paths, "cells": cells}


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_roster_puts_names_into_the_gradebook(course_dir):
    from nbgrader.api import Gradebook

    assert [(s.id, s.first_name, s.last_name) for s in course_dir["students"]] == \
        [("1001", "Jane", "Doe"), ("1002", "John", "Roe"), ("1003", "Anne", "Poe")]
    with Gradebook(f"sqlite:///{course_dir['root'] / 'gradebook.db'}") as gb:
        assert {(s.id, s.first_name, s.last_name) for s in gb.students} == \
            {("1001", "Jane", "Doe"), ("1002", "John", "Roe"), ("1003", "Anne", "Poe")}
    assert (course_dir["root"] / "roster.csv").read_text() == ROSTER


def test_roster_formats_and_errors(tmp_path):
    plain = tmp_path / "plain.csv"
    plain.write_text("id,first_name,last_name,email\nab12,Ada,Byron,ada@example.org\ncd34,Alan,Turing,\n")
    columns, students = gradebook.read_roster(plain)
    assert columns == ["id", "first_name", "last_name", "email"]
    assert [(s.id, s.first_name, s.last_name, s.email) for s in students] == \
        [("ab12", "Ada", "Byron", "ada@example.org"), ("cd34", "Alan", "Turing", "")]
    spaced = tmp_path / "spaced.csv"
    spaced.write_text("Name,Username\nGrace Brewster Hopper,gh\n")
    assert [(s.first_name, s.last_name) for s in gradebook.read_roster(spaced)[1]] == [("Grace Brewster", "Hopper")]
    (tmp_path / "noid.csv").write_text("Student,Section\n\"Doe, Jane\",A\n")
    with pytest.raises(ValueError, match="no id column"):
        gradebook.read_roster(tmp_path / "noid.csv")
    (tmp_path / "twice.csv").write_text("id,name\n7,A\n7,B\n")
    with pytest.raises(ValueError, match="listed twice"):
        gradebook.read_roster(tmp_path / "twice.csv")


def test_scores_per_task_late_and_not_graded(course_dir):
    cells = course_dir["cells"]
    tasks = list(dict.fromkeys(t for t, *_ in cells))
    maximum = sum(p for _, _, p, _ in cells)
    rows = read_csv(course_dir["paths"]["scores"])
    header = rows[0]
    assert header[:6] == ["student_id", "last_name", "first_name", "email", "late", "status"]
    assert header[6:-2] == [f"{t} ({sum(p for u, _, p, _ in cells if u == t)})" for t in tasks]
    assert header[-2:] == ["total", "max_score"]
    by_id = {r[0]: dict(zip(header, r)) for r in rows[1:]}
    assert list(by_id) == ["1001", "1002", "1003", "9999"]
    stranger = by_id.pop("9999")
    assert stranger["status"] == "not graded" and stranger["total"] == "" and stranger["last_name"] == ""
    for s, row in by_id.items():
        for t in tasks:
            scores = [score_of(s, t, p, h) for u, _, p, h in cells if u == t]
            want = "not graded" if None in scores else f"{sum(scores)}"
            assert row[next(h for h in header if h.startswith(t + " ("))] == want, (s, t)
        assert row["max_score"] == str(maximum)
    assert by_id["1001"]["total"] == str(maximum) and by_id["1001"]["status"] == "graded"
    assert by_id["1002"]["total"] == str(sum(p for _, _, p, h in cells if not h)) and by_id["1002"]["late"] == "late"
    assert by_id["1003"]["total"] == "not graded" and by_id["1003"]["status"] == "partly graded"
    assert [r["late"] for r in by_id.values()] == ["", "late", ""]
    assert by_id["1003"]["last_name"] == "Poe" and by_id["1003"]["first_name"] == "Anne"
    assert "0" not in {by_id["1003"][h] for h in header if h.startswith(NOT_GRADED_TASK)}


def test_lms_import_file_has_the_roster_columns_and_no_zero_for_not_graded(course_dir):
    cells = course_dir["cells"]
    rows = read_csv(course_dir["paths"]["lms"])
    assert rows == [
        ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Assignment 7 (777)"],
        ["Doe, Jane", "1001", "S1001", "jdoe", "Sec A", str(sum(p for _, _, p, _ in cells))],
        ["Roe, John", "1002", "S1002", "jroe", "Sec A", str(sum(p for _, _, p, h in cells if not h))],
        ["Poe, Anne", "1003", "S1003", "apoe", "Sec B", ""],
    ]


def test_feedback_archive_one_file_per_student_named_as_the_submission(course_dir):
    with zipfile.ZipFile(course_dir["paths"]["feedback"]) as z:
        names = sorted(z.namelist())
        assert names == [f"doejane_1001_5001_{A}_feedback.html", f"poeanne_1003_5003_{A}_feedback.html",
                         f"roejohn_LATE_1002_5002_{A}_feedback.html"]
        assert z.read(names[1]).decode() == "<p>feedback of 1003</p>"


def test_export_report_names_who_needs_a_look(course_dir):
    text = gradebook.export_report(A, course_dir["root"])
    assert f"not graded: {NOT_GRADED_TASK}" in text
    lines = {line.split()[0]: line for line in text.splitlines()[1:] if line.startswith("  ")}
    assert set(lines) == {"1002", "1003", "9999"} and "late" in lines["1002"] and "Anne Poe" in lines["1003"]
    assert "not graded" in lines["9999"] and "not on the roster" in lines["9999"]


# ---------------------------------------------------------------------------------------------------
# Every command of the teacher guide works after `make install` (checked, not run).
# ---------------------------------------------------------------------------------------------------
def guide_commands():
    text = (ROOT / "book" / "teacher_guide.md").read_text()
    for block in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M):
        for line in block.splitlines():
            command = []
            for word in shlex.split(line, comments=True) + ["&&"]:
                if word != "&&":
                    command.append(word)
                elif command:
                    yield command
                    command = []


def test_every_command_in_the_guide_works_after_make_install():
    from nbgrader.apps import NbGraderApp

    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):", makefile, re.M))
    venv = re.search(r"^VENV\s*:=\s*(\S+)", makefile, re.M).group(1)
    scripts = Path(sys.executable).parent       # the venv that runs the tests: what `make install` made
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
    names = course.assignment_names()
    cwd, clone, activated, seen = None, None, False, []
    for args in guide_commands():
        seen.append(args[0])
        if args[:2] == ["git", "clone"]:
            assert args[2] == url, args
            clone, cwd = args[3], Path("/")
        elif args[0] == "cd":
            cwd = ROOT if cwd == Path("/") and args[1] == clone else cwd / args[1]
            assert cwd.is_dir(), args
        elif args[0] == "make":
            assert cwd == ROOT and args[1] in targets, args
        elif args[0] in ("source", "."):
            assert (cwd / args[1]).resolve() == (ROOT / venv / "bin" / "activate").resolve(), args
            assert (scripts / "activate").is_file() and "install" in targets
            activated = True
        elif args[0] == "python":
            assert activated, f"{args}: run before the environment is activated (No module named ...)"
            assert (cwd / args[1]).resolve() == (ROOT / "assignments" / "course.py").resolve(), args
            course.make_parser().parse_args(args[2:])             # exits (fails the test) if it would
        elif args[0] == "nbgrader":
            assert activated and (scripts / "nbgrader").is_file(), args
            assert args[1] in NbGraderApp.subcommands, args
            assert all(a in names for a in args[2:] if not a.startswith("-")), args
            assert cwd == ROOT / "assignments", f"{args}: nbgrader runs from the course folder"
        else:
            raise AssertionError(f"the guide's command {args} is not checked here: add a rule")
    assert {"make", "source", "python", "nbgrader", "cd"} <= set(seen)
    for sub in ("roster", "grade", "export"):
        assert any(a[:3] == ["python", "course.py", sub] for a in guide_commands()), sub
