"""Every control of every live panel shows any error in the panel's status line and stays usable.

ipywidgets catches an exception escaping a callback and sends it to the kernel's log, so a click
that failed seemed to do nothing.  Each test makes one thing a control calls raise (an error of no
type of ours, with "<" in its message, which must show escaped), checks the status line names its
type and message, then undoes the fault and checks the same control works on the next use.
"""

import logging

import ipywidgets as w
import pytest

from paged_kv.errors import OutOfBlocksError
from paged_kv.model import ByteTokenizer
from paged_kv.widgets import block_panel, calculator_panel, strip_panel
from paged_kv.widgets import fragmentation as fragmentation_mod
from paged_kv.widgets import serving as serving_mod
from paged_kv.widgets.panel import error_note
from paged_kv.widgets.prefix_cache import prefix_cache_panel
from paged_kv.widgets.serving import serving_panel

SHOWN = "internal error: RuntimeError: boom &lt;here&gt;"     # how the status line (HTML) shows it


def _boom(*args, **kwargs):
    raise RuntimeError("boom <here>")


def _widgets(panel, kind):
    """Every widget of ``kind`` in ``panel``, depth first, in the order they are shown."""
    found = [panel] if isinstance(panel, kind) else []
    for child in getattr(panel, "children", ()):
        found += _widgets(child, kind)
    return found


def _button(panel, description):
    (button,) = [b for b in _widgets(panel, w.Button) if b.description == description]
    return button


def _status(panel):
    return _widgets(panel, w.HTML)[0].value


def test_error_note_keeps_our_refusals_and_marks_the_rest_as_internal(caplog):
    with caplog.at_level(logging.ERROR, logger="paged_kv.widgets"):
        assert error_note(OutOfBlocksError(3, 1)) == "out of KV blocks: needed 3, free 1"
        assert not caplog.records                                  # a refusal is not a bug: not logged
        assert error_note(TypeError("bad")) == "internal error: TypeError: bad"
    (record,) = caplog.records
    assert record.exc_info[0] is TypeError                         # the traceback is kept, in the log


BLOCK_CONTROLS = [   # (button, method of LiveRequests it calls, what the next click does when it works)
    ("add prompt", "add", lambda live: len(live.requests) == 2),
    ("add length", "add", lambda live: len(live.requests) == 2),
    ("decode step", "step", lambda live: live.manager.num_tokens(0) == 20),
    ("finish / prune", "finish", lambda live: live.requests == []),
    ("fork", "fork", lambda live: live.requests == [0, 1]),
    ("append to selected", "step", lambda live: live.manager.num_tokens(0) == 20),
]


@pytest.mark.parametrize("description, method, worked", BLOCK_CONTROLS, ids=[c[0] for c in BLOCK_CONTROLS])
def test_block_panel_shows_any_error_and_the_next_click_works(monkeypatch, description, method, worked):
    panel = block_panel(load_model=False, num_blocks=24, block_size=4, use_figure_widget=False, sharing=True)
    live = panel.live
    _button(panel, "add prompt").click()                           # request 0: 19 tokens
    with monkeypatch.context() as m:
        m.setattr(live, method, _boom)
        _button(panel, description).click()
    assert SHOWN in _status(panel) and live.requests == [0]
    _button(panel, description).click()
    assert worked(live) and "internal error" not in _status(panel)


SERVING_CONTROLS = [   # (button, what it calls on the engine, what the next click does)
    ("submit", "add_request", lambda e: len(e.outputs()) == 2),
    ("step", "step", lambda e: e.stats.steps == 2),
    ("run until idle", "step", lambda e: not e.has_unfinished_requests()),
    ("preempt", "scheduler.preempt", lambda e: e.scheduler.requests["A"].preemptions == 1),
]


@pytest.mark.parametrize("description, method, worked", SERVING_CONTROLS, ids=[c[0] for c in SERVING_CONTROLS])
def test_serving_panel_shows_any_error_and_the_next_click_works(monkeypatch, small_model, description, method,
                                                                 worked):
    panel = serving_panel(small_model, ByteTokenizer(), use_figure_widget=False)
    engine = panel.engine
    _button(panel, "submit").click()
    _button(panel, "step").click()                                 # A runs: something to preempt
    owner, name = (engine.scheduler, "preempt") if method == "scheduler.preempt" else (engine, method)
    with monkeypatch.context() as m:
        m.setattr(owner, name, _boom)
        _button(panel, description).click()
    assert SHOWN in _status(panel) and len(engine.outputs()) == 1 and engine.stats.steps == 1
    _button(panel, description).click()
    assert worked(engine) and "internal error" not in _status(panel)


def test_serving_panel_shows_a_failed_redraw_and_recovers(monkeypatch, small_model):
    """The figure's redraw failing (here the figure builder the Output path calls) is shown too."""
    panel = serving_panel(small_model, ByteTokenizer(), use_figure_widget=False)
    with monkeypatch.context() as m:
        m.setattr(serving_mod, "serving_figure", _boom)
        _button(panel, "submit").click()
    assert f"request A is waiting; redrawing the panel failed: {SHOWN}" in _status(panel)
    _button(panel, "step").click()
    assert "redrawing" not in _status(panel) and panel.engine.stats.steps == 1


PREFIX_CONTROLS = [
    ("submit", "add_request", lambda e: len(e.outputs()) == 2),
    ("step", "step", lambda e: e.stats.steps == 2),
    ("run until idle", "step", lambda e: not e.has_unfinished_requests()),
]


@pytest.mark.parametrize("description, method, worked", PREFIX_CONTROLS, ids=[c[0] for c in PREFIX_CONTROLS])
def test_prefix_cache_panel_shows_any_error_and_the_next_click_works(monkeypatch, small_model, description,
                                                                      method, worked):
    panel = prefix_cache_panel(small_model, ByteTokenizer(), use_figure_widget=False)
    engine = panel.engine
    _button(panel, "submit").click()
    _button(panel, "step").click()
    with monkeypatch.context() as m:
        m.setattr(engine, method, _boom)
        _button(panel, description).click()
    assert SHOWN in _status(panel) and len(engine.outputs()) == 1 and engine.stats.steps == 1
    _button(panel, description).click()
    assert worked(engine) and "internal error" not in _status(panel)


@pytest.mark.parametrize("control", ["rate", "policy", "placement", "frame"])
def test_strip_panel_shows_any_error_and_the_next_change_works(monkeypatch, control):
    panel = strip_panel(num_requests=40, frames=6, horizon_s=10.0, use_figure_widget=False)
    (policy, placement, _), (rate, when) = panel.children[0].children, panel.children[1].children
    widget, values = {"rate": (rate, (rate.value + 0.5, rate.value + 1.0)), "policy": (policy, ("Orca (Max)", "paged")),
                      "placement": (placement, ("first-fit", "buddy")), "frame": (when, (2, 3))}[control]
    failing = "strip_figure" if control == "frame" else "run_strip"      # a frame only redraws
    with monkeypatch.context() as m:
        m.setattr(fragmentation_mod, failing, _boom)
        widget.value = values[0]
    stats = panel.children[2].value
    assert SHOWN in stats and "last run that worked" in stats
    widget.value = values[1]
    assert "mean batch" in panel.children[2].value and "internal error" not in panel.children[2].value


def test_calculator_shows_any_error_and_the_next_change_works(monkeypatch):
    panel = calculator_panel(use_figure_widget=False)
    calc = panel.calculator
    with monkeypatch.context() as m:
        m.setattr(calc, "_draw", _boom)                            # the figure of a good plan fails
        calc.batch_size.value = 8
    assert calc.plan is None and f"failed:</b> {SHOWN}" in calc.text.value
    assert calc._figure_box.layout.display == "none"               # not the previous inputs' figure
    with monkeypatch.context() as m:
        m.setattr(calc, "_prefill_custom", _boom)                  # the model menu's own handler
        calc.model.value = "custom"
    assert calc.plan is None and SHOWN in calc.text.value
    calc.batch_size.value = 4
    assert calc.plan is not None and calc.plan.batch_size == 4 and calc._figure_box.layout.display == ""


def test_the_issues_prompt_with_a_lone_surrogate_is_refused_by_name(small_model):
    """The new-user trial's prompt, typed into the serving panel: our PromptError, shown as is."""
    panel = serving_panel(small_model, ByteTokenizer(), use_figure_widget=False)
    _widgets(panel, w.Text)[0].value = "smile \ud83d"
    _button(panel, "submit").click()
    assert "character 6 is U+D83D" in _status(panel) and "internal error" not in _status(panel)
    assert panel.engine.outputs() == []


@pytest.mark.parametrize("make", ["serving", "prefix"])
def test_a_request_that_ends_with_an_error_shows_it_and_its_reason(monkeypatch, small_model, make):
    """The trial: after a step whose sampler raised for request A, the engine had A's 'error' and
    its text, while the serving panel's status line showed only "A: ''"."""
    from paged_kv.engine import runner as runner_mod
    build = serving_panel if make == "serving" else prefix_cache_panel
    panel = build(small_model, ByteTokenizer(), use_figure_widget=False)

    def exploding(self, logits, c):
        raise RuntimeError("sampler exploded")
    _button(panel, "submit").click()
    with monkeypatch.context() as m:
        m.setattr(runner_mod.ModelRunner, "_sample", exploding)
        _button(panel, "run until idle").click()
    status = _status(panel)
    assert "RuntimeError: sampler exploded" in status and "[error]" in status
    _button(panel, "submit").click()
    _button(panel, "run until idle").click()
    assert "[length]" in _status(panel)
