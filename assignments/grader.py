"""The paged-kv course's own nbgrader preprocessors (``nbgrader_config.py`` installs them).

* :class:`GuardedExecute` runs a submission as nbgrader's ``Execute`` does, and in addition:
  before each graded test cell it loads the grading helpers (``helpers.py``) again, into a module
  of their own, and re-runs the locked cells above it (the launcher, the given classes), so an
  answer cell that redefines ``Task``, a helper or the launcher changes nothing the tests use; a
  cell that runs past ``cell_timeout`` seconds, or kills the kernel (a crash in a Triton
  interpreter run), scores 0 and the kernel is restarted: the cells before it are run again
  (without the test cells) and grading goes on with the next cell; once the submission has used
  ``submission_timeout`` seconds, or the kernel was restarted ``max_restarts`` times, the test
  cells left are marked *not graded*.
* :class:`SaveAutoGradesMarked` stores a not-graded cell's score as ``None`` (nbgrader's
  "needs manual grade"), never 0.
* :class:`ScrubHiddenOutputs` (feedback) reduces a hidden test cell's outputs to the messages
  alone, and withholds a message that quotes a line of the hidden tests (a traceback of a
  ``NameError`` or an interrupt shows the failing line).

What happened to one submission (seconds used, timeouts, crashes, cells not graded) goes to the
JSON file named by the environment variable ``PAGED_KV_GRADING_REPORT`` (``course.py grade`` sets
it: ``logs/<assignment>/<student>.grading.json``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from queue import Empty
from time import monotonic

from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbclient.util import ensure_async, run_sync
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import Execute, NbGraderPreprocessor, SaveAutoGrades
from traitlets import Bool, Integer

HELPERS = Path(__file__).resolve().with_name("helpers.py")
HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS(.*?)### END HIDDEN TESTS", re.S)
WITHHELD = "(this message quoted the hidden tests, so it is not shown; your teacher can see it)"


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def is_test_cell(cell) -> bool:
    meta = _meta(cell)
    return cell.cell_type == "code" and bool(meta.get("grade")) and not meta.get("solution")


def harness_code(helpers: str) -> str:
    """Kernel code that runs ``helpers`` (the grading helpers' source) in a new module, kept out of
    ``sys.modules``, and binds its ``Task``, ``NotYourOwnCode`` and ``NotWrittenYet`` in the
    notebook: the helpers' own globals are then out of the notebook's reach."""
    return ("def _pkv_load_harness(source=" + repr(helpers) + "):\n"
            "    import types\n"
            "    module = types.ModuleType('paged_kv_grading_helpers')\n"
            "    exec(compile(source, '<grading helpers>', 'exec'), module.__dict__)\n"
            "    return module.Task, module.NotYourOwnCode, module.NotWrittenYet\n"
            "Task, NotYourOwnCode, NotWrittenYet = _pkv_load_harness()\n"
            "del _pkv_load_harness\n")


def _error(ename: str, evalue: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


class GuardedExecute(Execute):
    """nbgrader's ``Execute`` with the harness reloaded before each test cell, per-cell and
    per-submission time limits, and recovery from a dead kernel (see the module docstring).
    ``timeout`` (nbgrader's) still bounds the locked set-up cells (imports)."""

    cell_timeout = Integer(60, help="Seconds an answer or test cell may run").tag(config=True)
    submission_timeout = Integer(300, help="Seconds one submission may take in all").tag(config=True)
    max_restarts = Integer(3, help="Kernel restarts (after a crash or a timeout) per submission").tag(config=True)
    raise_on_iopub_timeout = Bool(False).tag(config=True)

    def preprocess(self, nb, resources=None, km=None):
        NotebookClient.__init__(self, nb, km)
        self.reset_execution_trackers()
        self._check_assign_resources(resources)
        self.timeout_func = self._limit
        self._start = monotonic()
        self._record = {"seconds": 0.0, "cell_timeout": self.cell_timeout,
                        "submission_timeout": self.submission_timeout, "timed_out": [], "died": [],
                        "restarts": 0, "not_graded": {}}
        try:
            run_sync(self._execute_all)()
        finally:
            self._record["seconds"] = round(monotonic() - self._start, 2)
            if isinstance(self.resources, dict):
                self.resources["paged_kv"] = self._record
            path = os.environ.get("PAGED_KV_GRADING_REPORT")
            if path:
                Path(path).write_text(json.dumps(self._record, indent=1) + "\n")
        return self.nb, self.resources

    # --- limits ----------------------------------------------------------------------------------
    def _left(self) -> float:
        return self.submission_timeout - (monotonic() - self._start)

    def _limit(self, cell) -> int:
        meta = _meta(cell)
        own = self.timeout if meta.get("locked") and not meta.get("grade") else self.cell_timeout
        return max(1, int(min(own or self.cell_timeout, self._left()) + 0.999))

    async def _async_handle_timeout(self, timeout, cell=None):
        self._timed_out = True
        return await super()._async_handle_timeout(timeout, cell)

    # --- the kernel --------------------------------------------------------------------------------
    async def _silent(self, code: str, timeout: float) -> str:
        """Run ``code`` in the kernel without recording anything: ``ok``, ``error``, ``timeout`` or
        ``dead``."""
        msg_id = await ensure_async(self.kc.execute(code, silent=True, store_history=False, allow_stdin=False))
        deadline = monotonic() + timeout
        while True:
            try:
                msg = await ensure_async(self.kc.shell_channel.get_msg(timeout=self.shell_timeout_interval))
            except Empty:
                if not await ensure_async(self.kc.is_alive()):
                    return "dead"
                if monotonic() > deadline:
                    return "timeout"
                continue
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg["content"].get("status", "error")

    async def _restart(self, upto: int, skip: set) -> bool:
        """A fresh kernel with the code cells before ``upto`` run again (test cells and ``skip``
        left out); ``False`` when no more restarts are allowed or the replay did not finish."""
        if self._record["restarts"] >= self.max_restarts or self._left() <= 0:
            return False
        self._record["restarts"] += 1
        self.log.warning("Restarting the kernel (restart %d)", self._record["restarts"])
        try:
            await ensure_async(self.kc.stop_channels())
        except Exception:  # noqa: BLE001 (the old channels may be gone with the kernel)
            pass
        await ensure_async(self.km.restart_kernel(now=True))
        await self.async_start_new_kernel_client()
        for i, cell in enumerate(self.nb.cells[:upto]):
            if cell.cell_type != "code" or not cell.source.strip() or is_test_cell(cell) or i in skip:
                continue
            status = await self._silent(cell.source, self._limit(cell))
            if status in ("dead", "timeout"):
                skip.add(i)
                if status == "dead" or self._left() <= 0:
                    return await self._restart(upto, skip) if self._left() > 0 else False
        return True

    async def _execute_all(self):
        skip, broken = set(), None      # cells left out of replays; why grading stopped
        async with self.async_setup_kernel():
            info = await self.async_wait_for_reply(await ensure_async(self.kc.kernel_info()))
            if info is not None:
                self.nb.metadata["language_info"] = info["content"]["language_info"]
            helpers = harness_code(HELPERS.read_text())
            for index, cell in enumerate(self.nb.cells):
                if cell.cell_type != "code" or not cell.source.strip():
                    continue
                grade_id = _meta(cell).get("grade_id", f"cell {index}")
                if broken is None and self._left() <= 0:
                    broken = f"the submission used up its {self.submission_timeout} s"
                if broken is not None:
                    if is_test_cell(cell):
                        cell.outputs = [NotebookNode(output_type="stream", name="stdout",
                                                     text=f"Not graded: {broken}.\n")]
                        self._record["not_graded"][grade_id] = broken
                    continue
                if is_test_cell(cell):
                    locked = [c.source for c in self.nb.cells[:index] if c.cell_type == "code" and
                              _meta(c).get("locked") and not _meta(c).get("grade") and
                              _meta(c).get("grade_id") not in ("setup", "helpers")]
                    await self._silent(helpers + "\n".join(locked), self._limit(cell))
                self._timed_out, died = False, False
                try:
                    await self.async_execute_cell(cell, index, execution_count=self.code_cells_executed + 1)
                except DeadKernelError:
                    died = True
                except CellTimeoutError:
                    self._timed_out = True
                if died:
                    self._record["died"].append(grade_id)
                    cell.outputs = [_error("DeadKernelError", "the kernel died while this cell ran (a crash, "
                                           "e.g. a Triton kernel reading outside its tensors): this cell scores 0; "
                                           "the kernel was restarted and grading went on")]
                elif self._timed_out:
                    self._record["timed_out"].append(grade_id)
                    cell.outputs = [_error("CellTimeoutError", f"this cell did not finish in time ({self.cell_timeout} s "
                                           f"a cell, {self.submission_timeout} s a submission): it scores 0; grading "
                                           "went on with the next cell")]
                if died or self._timed_out:
                    if not is_test_cell(cell):
                        skip.add(index)
                    alive = not died and await self._silent("pass", 10) == "ok"
                    if not alive and not await self._restart(index + 1, skip):
                        broken = ("the kernel could not be restarted" if self._left() > 0
                                  else f"the submission used up its {self.submission_timeout} s")
            self.set_widgets_metadata()


class SaveAutoGradesMarked(SaveAutoGrades):
    """nbgrader's ``SaveAutoGrades``; a test cell :class:`GuardedExecute` could not grade gets the
    score ``None`` and "needs manual grade" (the gradebook's "not graded"), not 0."""

    def preprocess(self, nb, resources):
        self._not_graded = (resources or {}).get("paged_kv", {}).get("not_graded", {})
        return super().preprocess(nb, resources)

    def _add_score(self, cell, resources):
        super()._add_score(cell, resources)
        grade_id = cell.metadata["nbgrader"]["grade_id"]
        if grade_id in self._not_graded:
            grade = self.gradebook.find_grade(grade_id, self.notebook_id, self.assignment_id, self.student_id)
            grade.auto_score = None
            grade.needs_manual_grade = True
            self.gradebook.db.commit()


def hidden_lines(source: str) -> list[str]:
    """The lines of a cell's hidden-test regions worth withholding (stripped, 6 characters or more)."""
    return [line.strip() for region in HIDDEN.findall(source) for line in region.splitlines()
            if len(line.strip()) >= 6]


def scrub(text: str, lines: list[str]) -> str:
    """``text``, or :data:`WITHHELD` when it quotes one of ``lines``."""
    flat = re.sub(r"\x1b\[[0-9;]*m", "", text)
    return WITHHELD if any(line in flat for line in lines) else text


class ScrubHiddenOutputs(NbGraderPreprocessor):
    """Feedback: the outputs of a cell with hidden tests reduced to messages (an error's type and
    message, no traceback; printed text; a result's plain text), each withheld when it quotes the
    hidden tests.  Runs before nbgrader's ``ClearHiddenTests`` (which clears the source)."""

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code" or not HIDDEN.search(cell.source):
            return cell, resources
        lines, outputs = hidden_lines(cell.source), []
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                outputs.append(_error(out.ename, scrub(str(out.evalue), lines)))
            elif out.output_type == "stream":
                outputs.append(NotebookNode(output_type="stream", name=out.name, text=scrub(out.text, lines)))
            elif "text/plain" in out.get("data", {}):
                data = {"text/plain": scrub(str(out.data["text/plain"]), lines)}
                outputs.append(NotebookNode(output_type=out.output_type, data=data, metadata={},
                                            **({"execution_count": out.get("execution_count")}
                                               if out.output_type == "execute_result" else {})))
        cell.outputs = outputs
        return cell, resources
