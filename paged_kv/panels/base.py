"""What every panel model shares: one step of a live panel as a pure function, and the figure's JSON.

A live panel (chapter 3's calculator, chapter 5's block pool, ...) runs in two places: in a
Jupyter or Colab kernel, around ipywidgets, and in the HTML book itself, where the page's buttons
send the same actions to the package running in Pyodide.  So that the two can never disagree,
every decision a panel makes lives in one *panel model* (a :class:`PanelModel`), and both fronts
only forward the reader's actions to it and draw what it returns.

A panel model is pure: :meth:`PanelModel.apply` returns a new state and never changes the one it
was given, so a front can keep the old state when an action is refused, and the same sequence of
actions gives the same figures wherever it runs (the browser edition's parity test replays one in
CPython and in Pyodide and compares :func:`figure_json` byte for byte).

An *action* is a JSON-able ``dict`` with an ``"op"`` key (``{"op": "add", "prompt": "To be"}``);
:meth:`PanelModel.controls` describes, also as JSON, the buttons and inputs that produce them, so
the page draws its controls from the model instead of a second copy written in JavaScript.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

import plotly.io as pio

from ..errors import ConfigError, PagedKVError
from ..viz import TEMPLATE
from ..viz.labels import visible_token

__all__ = ["EMPTY_OPTION", "PanelModel", "Step", "figure_json", "filled", "option_label", "select_control", "step"]

#: how a dropdown shows the empty option (a prefix of none): an empty ``<option>`` reads as nothing
EMPTY_OPTION = "(none)"


class PanelModel:
    """The interface of a panel model (subclass it; the methods below raise ``NotImplementedError``).

    ``state`` is whatever the model keeps (a frozen dataclass, plain data or the package's own
    objects); only the model reads it.  Fronts call :func:`step`, not :meth:`apply` directly.
    """

    #: the panel's name in the page (``data-panel="..."``) and in the browser worker
    name: str = ""
    #: a short session of actions that uses every kind of action the panel has: the parity test
    #: replays it in Pyodide and CPython, and the browser's worker runs it, thrown away, to warm
    #: the panel's code paths before the reader's first action (:func:`paged_kv.panels.worker.warm`)
    demo_actions: list[dict] = []

    def initial(self) -> Any:
        """The state before the reader's first action."""
        raise NotImplementedError

    def apply(self, state: Any, action: Mapping[str, Any]) -> Any:
        """The state after ``action``; ``state`` itself is left as it was.

        Raises:
            PagedKVError: the action is refused (a prompt that does not fit, an unknown request,
                an unknown ``"op"``); the message names the bad value.
        """
        raise NotImplementedError

    def figure(self, state: Any):
        """The panel's plotly figure for ``state`` (a ``plotly.graph_objects.Figure``)."""
        raise NotImplementedError

    def status(self, state: Any) -> str:
        """The panel's status text for ``state`` (plain text; fronts escape it)."""
        return ""

    def input_values(self, state: Any) -> dict[str, Any]:
        """The values ``state`` holds for the panel's inputs, by input name (JSON-able): what a
        front resets its inputs to after a refusal, so that they show the inputs the figure was
        drawn from.  Default: none (a panel whose inputs are not its state, like a prompt to add)."""
        return {}

    def controls(self) -> list[dict]:
        """The panel's controls as JSON: a list of ``{"kind": "button", "label": ..., "op": ...}``
        and ``{"kind": "text" | "int" | "select", "name": ..., "label": ..., "value": ...,
        ("options": [...], "labels": [...], "min": ..., "max": ...)}`` (a select shows
        ``labels[i]`` for ``options[i]`` where it has labels, and sends the option itself); a
        button's action is ``{"op": op}`` plus the current value of every named input, and where
        a button is ``"auto": True`` a change of an input sends that button's op with that input
        alone."""
        return []


def filled(name: str, value: Any) -> Any:
    """``value``, unless it is ``None``: the page sends an empty number box as JSON's ``null``, not
    as 0 (which a panel would take for a value) nor as ``""`` (refused as the wrong type, which
    reads as a bug of the page), so the reader is told what to do.

    Raises:
        ConfigError: ``value`` is ``None``; the message names the field (``name``, in the page's
            words with the action's key, e.g. ``"context (seq_len)"``).
    """
    if value is None:
        raise ConfigError(f"{name} is empty: type a number")
    return value


def option_label(text: str) -> str:
    """How a dropdown shows the option ``text``: a line break as ``⏎``, and any other whitespace
    but a plain space as :func:`~paged_kv.viz.labels.visible_token` writes it (an ``<option>``
    shows no line break: ``"ROMEO:\\nBut soft"`` would read ``"ROMEO: But soft"``, which is
    another prompt); ``""`` as :data:`EMPTY_OPTION`.  The option's value stays ``text``."""
    if not text:
        return EMPTY_OPTION
    return "".join(ch if ch == " " else visible_token(ch) for ch in text)


def select_control(name: str, label: str, value: Any, options) -> dict:
    """A ``"select"`` control (:meth:`PanelModel.controls`) offering ``options`` in order, with
    ``value`` first when it is not among them (a panel built with another starting text), each
    shown by :func:`option_label`.  A dropdown rather than a text box for a prompt: in the browser
    only the offered prompts have the tiny model's recorded tokens
    (:data:`~paged_kv.panels.continuations.OFFERED_PROMPTS`)."""
    offered = list(options)
    if value not in offered:
        offered.insert(0, value)
    return {"kind": "select", "name": name, "label": label, "value": value, "options": offered,
            "labels": [option_label(o) for o in offered]}


@dataclass(frozen=True)
class Step:
    """What a front draws after one action: the new ``state`` (the old one when refused), its
    ``figure``, the panel's ``status`` text and a ``note`` (the refusal's message, else ``""``)."""

    state: Any
    figure: Any
    status: str
    note: str


def step(model: PanelModel, state: Any, action: Mapping[str, Any] | None) -> Step:
    """Apply ``action`` (``None``: none, just draw ``state``) and return what the front shows.

    A refusal of ours (:class:`~paged_kv.errors.PagedKVError`) becomes the step's ``note`` and
    leaves the state as it was.  The figure gets the book's template
    (:data:`paged_kv.viz.TEMPLATE`) whatever plotly's default is in this process, so the same
    actions give the same bytes in a notebook, at build time and in the browser's worker; any other exception is a bug and propagates (the ipywidgets front
    shows it as an internal error, :func:`paged_kv.widgets.panel.error_note`).

    Raises:
        ConfigError: ``action`` is not a mapping with a string ``"op"``.
    """
    note = ""
    if action is not None:
        if not isinstance(action, Mapping) or not isinstance(action.get("op"), str):
            raise ConfigError(f"an action must be a dict with a string 'op', got {action!r:.80}")
        try:
            state = model.apply(state, action)
        except PagedKVError as e:
            note = str(e)
    # The template by plotly's default, not fig.update_layout (that costs ~0.2 s a figure); and
    # set only when it is another: setting it validates the whole template (~30 ms each way),
    # and the worker and the book already run under TEMPLATE.
    default = pio.templates.default
    if default == TEMPLATE:
        fig = model.figure(state)
    else:
        pio.templates.default = TEMPLATE
        try:
            fig = model.figure(state)
        finally:
            pio.templates.default = default
    return Step(state, fig, model.status(state), note)


def figure_json(fig) -> str:
    """``fig`` as compact JSON with sorted keys, by plotly's ``"json"`` engine (never orjson, which
    CPython may have and Pyodide does not): the bytes the browser edition's parity test compares."""
    return json.dumps(json.loads(pio.to_json(fig, engine="json", validate=False)), sort_keys=True,
                      separators=(",", ":"), ensure_ascii=False)
