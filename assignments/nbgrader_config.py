"""nbgrader configuration of the paged-kv course.  Run nbgrader (and ``course.py``) from this folder.

Everything here is explained in the book's teacher guide (``book/teacher_guide.md``).
"""

import os
import shutil

from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
from nbgrader.preprocessors import ClearHiddenTests, GetGrades

c = get_config()  # noqa: F821 (provided by nbgrader when it reads this file)

c.CourseDirectory.course_id = "paged-kv"
# source/<assignment>/ holds each notebook's MyST source (.md) beside it: never release those.
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", "*.md"]

# The grader's kernels run the Triton kernels in the Triton interpreter when this machine has no
# NVIDIA GPU, exactly as the notebook's locked first cell does for a student on a CPU: the grade
# is the same on a teacher's laptop and on a GPU server.  The kernels inherit this environment.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Seconds per cell.  nbgrader's default (30 s) leaves too little room: on a busy 2-core machine
# the slowest cells took about 10 s (importing torch and triton) and 4 s (a kernel test cell in
# the Triton interpreter), and a slower laptop or a loaded server can take several times that.
c.Execute.timeout = 300

# A submission whose test cells were deleted gets them back (from the gradebook) before grading.
c.OverwriteCells.add_missing_cells = True

# Feedback goes to students: strip the hidden tests' code from it (their messages name the
# failing cases, never the expected answers).
c.GenerateFeedback.preprocessors = [GetGrades, ClearHiddenTests, CSSHTMLHeaderPreprocessor]

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
