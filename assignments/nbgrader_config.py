"""nbgrader configuration of the paged-kv course.  Run nbgrader (and ``course.py``) from this folder.

Everything here is explained in the book's teacher guide (``book/teacher_guide.md``).
"""

import os
import shutil
import sys

from nbconvert.preprocessors import ClearMetadataPreprocessor, CSSHTMLHeaderPreprocessor
from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata, ClearHiddenTests, GetGrades,
                                    IgnorePattern, LimitOutput)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # grader.py, beside this file
from grader import GuardedExecute, SaveAutoGradesMarked, ScrubHiddenOutputs  # noqa: E402

c = get_config()  # noqa: F821 (provided by nbgrader when it reads this file)

c.CourseDirectory.course_id = "paged-kv"
# source/<assignment>/ holds each notebook's MyST source (.md) beside it: never release those.
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", "*.md"]

# The grader's kernels run the Triton kernels in the Triton interpreter when this machine has no
# NVIDIA GPU, exactly as the notebook's locked first cell does for a student on a CPU: the grade
# is the same on a teacher's laptop and on a GPU server.  The kernels inherit this environment.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Time limits (grader.GuardedExecute).  On a busy 2-core machine the slowest cells took about 10 s
# (the locked set-up cell: importing torch and triton) and 4 s (a kernel test cell in the Triton
# interpreter); a slower laptop or a loaded server can take several times that.  The locked cells
# (set-up, helpers) get `Execute.timeout`; an answer or test cell `cell_timeout` (a cell past it
# scores 0, and grading goes on with the next cell); a whole submission `submission_timeout`
# (then the test cells left are "not graded"): an endless loop costs one student at most that.
c.Execute.timeout = 300
c.GuardedExecute.timeout = 300
c.GuardedExecute.cell_timeout = 60
c.GuardedExecute.submission_timeout = 300
c.GuardedExecute.max_restarts = 3   # kernel restarts (after a crash or a timeout) per submission

# Autograding: nbgrader's own steps, with its Execute and SaveAutoGrades replaced by the course's
# (grader.py: the helpers reloaded before each test cell, timeouts and crashes cost only their
# cells, "not graded" stored as no score).
c.Autograde.autograde_preprocessors = [GuardedExecute, IgnorePattern, ClearMetadataPreprocessor, LimitOutput,
                                       SaveAutoGradesMarked, AssignLatePenalties, CheckCellMetadata]

# A submission whose test cells were deleted gets them back (from the gradebook) before grading.
c.OverwriteCells.add_missing_cells = True

# Feedback goes to students: strip the hidden tests' code from it, and reduce their cells' outputs
# to messages (no traceback: it would show the failing line), withheld when they quote the hidden
# tests (the helpers' messages name the failing cases, never the expected answers).
c.GenerateFeedback.preprocessors = [GetGrades, ScrubHiddenOutputs, ClearHiddenTests, CSSHTMLHeaderPreprocessor]

# `nbgrader zip_collect <assignment>`: files exported from an LMS (Canvas style:
# "<name>_<user id>_<submission id>_<file>", "LATE_" after the name for late ones) into
# downloaded/<assignment>/archive/.  The file name may carry Colab's "Copy of " prefix and an
# LMS's " (1)" or "-1" suffix for a resubmission; the collected notebook keeps its released name.
# nbgrader matches this against the file's full path, hence the leading ".*/".
c.ZipCollectApp.collector_plugin = "nbgrader.plugins.zipcollect.FileNameCollectorPlugin"
c.ZipCollectApp.strict = True   # skip (and count) notebooks whose name matches no released one
c.FileNameCollectorPlugin.named_regexp = (
    r".*/[^/_]+_(?:LATE_)?(?P<student_id>\d+)_\d+_"
    r"(?:Copy[ _]of[ _])?(?P<file_id>[A-Za-z0-9_]+?)(?:[ _]?\(\d+\)|-\d+)?\.ipynb$"
)
