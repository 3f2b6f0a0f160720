# Grading helpers (a locked cell, the same in every assignment; `make assignments` copies it in
# from assignments/helpers.py). The test cells below call them; they only compare, print, and
# check that a graded answer is your own code.
#
# * Task(name, answer, forbid=[...]): the checks of one graded task. While your code runs, the
#   package's own implementations of what the task asks for (`forbid`) must not run: importing
#   or calling them instead of writing your own fails the task.
# * task.expect(what, call, expected), expect_close(...), expect_raises(...): one visible check;
#   prints what it expected and what it got, or a line when it passes.
# * task.hidden(cases): the hidden checks, run when the notebook is graded; a failure names the
#   failing cases, never their expected answers, and shows no test code.
# * Your code runs on a thread of its own (its stack holds none of the test's frames); when the
#   notebook is graded, these helpers are loaded again before each test cell, from the grader.
import numbers as _numbers
import sys as _sys
import threading as _threading


class NotYourOwnCode(AssertionError):
    """The package's own implementation ran where the task asks for yours."""


class NotWrittenYet(AssertionError):
    """The answer cell still raises ``NotImplementedError``."""


def _code_objects(objects):
    """``{code object: "module.name"}`` of functions, and of every method and property of classes,
    in ``objects``."""
    codes = {}
    for obj in objects:
        for member in (vars(obj).values() if isinstance(obj, type) else [obj]):
            for f in (member, getattr(member, "__func__", None), getattr(member, "fget", None)):
                if getattr(f, "__code__", None) is not None:
                    codes[f.__code__] = f"{f.__module__}.{f.__qualname__}"
    return codes


def _fingerprint(code):
    """What a copy of a function keeps: its name, bytecode, names and constants (a docstring and
    messages included), not where it was compiled.  Source copied from the package (pasted, or
    ``exec`` of ``inspect.getsource``) compiles to the same fingerprint."""
    consts = tuple(_fingerprint(c) if hasattr(c, "co_code") else (type(c).__name__, repr(c)) for c in code.co_consts)
    return (code.co_name, code.co_code, code.co_names, code.co_varnames, consts)


def _watch(codes, seen, kernels=()):
    """Record into ``seen`` the names of ``codes``, or of copies of them, that start running, and
    each launch of one of ``kernels`` (Triton kernels) as ``("launch", kernel)``, until the
    returned function is called (a trace function on this thread: it sees each Python call, and
    traces no lines)."""
    prints = {_fingerprint(c): name for c, name in codes.items() if len(c.co_code) >= 32}
    known = dict(codes)          # code object -> name, or None: not the package's
    launchers = {}
    for k in kernels:
        fn = getattr(k, "fn", None)
        if getattr(fn, "__code__", None) is not None:    # the interpreter runs the kernel as Python
            launchers[fn.__code__] = k
        run = getattr(getattr(type(k), "run", None), "__code__", None)
        if run is not None:                              # compiled: JITFunction.run launches it
            launchers[run] = k

    def trace(frame, event, arg):
        code = frame.f_code
        if code in launchers and (code is not getattr(getattr(type(launchers[code]), "run", None), "__code__", None)
                                  or frame.f_locals.get("self") is launchers[code]):
            seen.append(("launch", launchers[code]))
        name = known.get(code, False)
        if name is False:
            name = known[code] = prints.get(_fingerprint(code))
        if name:
            seen.append(name)

    old = _sys.gettrace()
    _sys.settrace(trace)
    return lambda: _sys.settrace(old)


def _on_own_thread(call):
    """``call()`` on a new thread, whose stack holds none of the caller's frames (so the code under
    test cannot read the expected answers from them); its value, or its exception, re-raised here.
    PyTorch's grad mode (per thread) is carried over; an interrupt (Jupyter's stop button, the
    grader's timeout) is passed on to the thread."""
    torch = _sys.modules.get("torch")
    grad = torch.is_grad_enabled() if torch is not None else None
    box = {}

    def target():
        try:
            if torch is not None:
                torch.set_grad_enabled(grad)
            box["value"] = call()
        except BaseException as e:  # noqa: BLE001 (re-raised on the caller's thread)
            box["error"] = e

    thread = _threading.Thread(target=target, name="your code", daemon=True)
    thread.start()
    try:
        thread.join()
    except KeyboardInterrupt:
        import ctypes
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(KeyboardInterrupt))
        thread.join(5)
        raise
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _short(value, limit=300):
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + " ..."


def _is_tensor(x):
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _same(got, expected):
    """Exact equality; an expected int must come back as an int, a bool as a bool."""
    if _is_tensor(expected):
        return _is_tensor(got) and tuple(got.shape) == tuple(expected.shape) and bool((got == expected).all())
    if isinstance(expected, bool):
        return isinstance(got, bool) and got == expected
    if isinstance(expected, _numbers.Integral):
        return isinstance(got, _numbers.Integral) and not isinstance(got, bool) and got == expected
    return got == expected


def _close(got, expected, atol, rtol):
    """``None`` if the tensors agree within ``atol + rtol * |expected|``, else what differs."""
    if not _is_tensor(got):
        return f"expected a tensor of shape {tuple(expected.shape)}, got {_short(got)}"
    if tuple(got.shape) != tuple(expected.shape):
        return f"expected shape {tuple(expected.shape)}, got {tuple(got.shape)}"
    got, expected = got.detach().cpu().float(), expected.detach().cpu().float()
    diff = (got - expected).abs().nan_to_num(float("inf"))
    bad = diff > atol + rtol * expected.abs()
    if not bool(bad.any()):
        return None
    worst = int(diff.flatten().argmax())
    return (f"{int(bad.sum())} of {got.numel()} values differ; the largest difference is at flat index "
            f"{worst}: expected {float(expected.flatten()[worst]):.5f}, got {float(got.flatten()[worst]):.5f}")


class Task:
    """The checks of one graded task (see the top of this cell).  ``kernel``: a Triton kernel that
    every checked call must launch (a launcher rewritten in plain PyTorch fails the task)."""

    def __init__(self, name, answer=None, forbid=(), kernel=None):
        self.name, self.forbid, self.kernel = name, list(forbid), kernel
        self._codes = _code_objects(self.forbid)
        for own in self.forbid:
            if answer is own or (isinstance(answer, type) and isinstance(own, type) and issubclass(answer, own)):
                _one_line_traceback()
                raise NotYourOwnCode(f"{name}: your answer is (or extends) the package's own "
                                     f"{own.__module__}.{own.__qualname__}; this task asks you to write it")
        if kernel is not None and not type(kernel).__module__.startswith("triton."):
            _one_line_traceback()
            raise NotYourOwnCode(f"{name}: {getattr(kernel, '__name__', kernel)!r} is not a Triton kernel "
                                 "(@triton.jit); this task asks for one")

    def run(self, call):
        """``call()`` on a thread of its own, watching for the package's own implementations of this
        task (and checking that it launched ``kernel``)."""
        seen = []

        def watched():
            stop = _watch(self._codes, seen, [self.kernel] if self.kernel is not None else [])
            try:
                return call()
            finally:
                stop()

        try:
            value = _on_own_thread(watched)
        except Exception as e:
            # A stub's NotImplementedError, also as Triton reports it from inside a kernel.
            if isinstance(e, NotImplementedError) or "NotImplementedError" in str(e):
                _one_line_traceback()
                raise NotWrittenYet(f"{self.name} is not written yet: replace `raise NotImplementedError()` "
                                    f"in its cell with your code, run that cell, then this one") from None
            self._check(seen)
            raise
        self._check(seen)
        if self.kernel is not None and ("launch", self.kernel) not in seen:
            _one_line_traceback()
            raise NotYourOwnCode(f"{self.name}: your kernel {self.kernel.__name__} never ran; the launcher must "
                                 "launch it (a launcher that computes the result another way scores zero)")
        return value

    def _check(self, seen):
        names = [s for s in seen if isinstance(s, str)]
        if names:
            _one_line_traceback()
            raise NotYourOwnCode(f"{self.name}: your code ran the package's own {names[0]}; this task "
                                 f"asks you to write it yourself")

    def _outcome(self, call):
        """``(value, None)``, or ``(None, exception)`` when the student's code raised."""
        try:
            return self.run(call), None
        except (NotYourOwnCode, NotWrittenYet):
            raise
        except Exception as e:
            return None, e

    # --- visible checks --------------------------------------------------------------------------
    def expect(self, what, call, expected):
        got, error = self._outcome(call)
        if error is not None:
            raise AssertionError(f"{what}: expected {_short(expected)}, but your code raised "
                                 f"{type(error).__name__}: {error}") from error
        if not _same(got, expected):
            raise AssertionError(f"{what}:\n  expected {_short(expected)}\n  got      {_short(got)}")
        print(f"  ok  {what}: {_short(got, 100)}")

    def expect_close(self, what, call, expected, atol=1e-4, rtol=1e-4):
        got, error = self._outcome(call)
        if error is not None:
            raise AssertionError(f"{what}: your code raised {type(error).__name__}: {error}") from error
        problem = _close(got, expected, atol, rtol)
        if problem:
            raise AssertionError(f"{what}: {problem}")
        print(f"  ok  {what}: all {got.numel()} values match the reference")

    def expect_raises(self, what, call, error):
        got, raised = self._outcome(call)
        if raised is None:
            raise AssertionError(f"{what}: expected {error.__name__} to be raised, got {_short(got)}")
        if not isinstance(raised, error):
            raise AssertionError(f"{what}: expected {error.__name__}, but your code raised "
                                 f"{type(raised).__name__}: {raised}") from raised
        print(f"  ok  {what}: raised {error.__name__}: {raised}")

    def passed(self):
        print(f"All visible tests of {self.name} passed. More tests run when your notebook is graded.")

    # --- hidden checks ---------------------------------------------------------------------------
    def hidden(self, cases):
        """``cases``: ``(description, call, expected)``; ``expected`` may be an exception class
        (the call must raise it) or a tensor (compared with a tolerance).  Every case runs; a
        failure lists the failing cases by description only."""
        failed = []
        for what, call, expected in cases:
            try:
                got, raised = self._outcome(call)
            except (NotYourOwnCode, NotWrittenYet) as e:
                _one_line_traceback()
                raise AssertionError(str(e)) from None
            if isinstance(expected, type) and issubclass(expected, BaseException):
                ok = isinstance(raised, expected)
            elif raised is not None:
                ok = False
            elif _is_tensor(expected):
                ok = _close(got, expected, 1e-4, 1e-4) is None
            else:
                ok = _same(got, expected)
            if not ok:
                failed.append(what if raised is None else f"{what} (raised {type(raised).__name__})")
        if failed:
            _one_line_traceback()
            raise AssertionError(f"{self.name}: {len(failed)} of {len(cases)} hidden cases failed: "
                                 + "; ".join(failed))
        print(f"All {len(cases)} hidden cases of {self.name} passed.")


def _one_line_traceback():
    """Show the next error as its message alone (no code lines, so no hidden test leaks)."""
    ipython = _sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or shell.InteractiveTB.mode == "Minimal":
        return
    mode = shell.InteractiveTB.mode
    shell.InteractiveTB.set_mode("Minimal")

    def restore(*args):
        shell.InteractiveTB.set_mode(mode)
        shell.events.unregister("post_run_cell", restore)

    shell.events.register("post_run_cell", restore)
