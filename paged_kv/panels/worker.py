"""The Python side of the browser edition's Web Worker: two calls, JSON in and JSON out, and a warm-up.

The page's worker (``book/_ext/live/worker.mjs``) loads Pyodide, installs the pure wheel, and
calls :func:`create` when a reader clicks "Run live", then :func:`act` for every action.  Both
answer the JSON text of ``{"handle", "panel", "figure", "figure_sha256", "status", "note",
"controls", "values"}``: ``figure`` is the plotly figure as :func:`~paged_kv.panels.base.figure_json`
writes it, spliced into the reply as that text (the page parses the reply once and hands the
figure to ``Plotly.react``), ``figure_sha256`` the sha256 of that text (what the parity and browser tests
compare with CPython's), ``note`` a refusal's message (else ``""``), ``values`` the inputs the
panel's state holds (:meth:`~paged_kv.panels.base.PanelModel.input_values`: after a refusal the
page puts its inputs back to them).

After a panel's first figure the page's worker calls :func:`warm` while it is idle: one step at a
time, it replays the panel's ``demo_actions`` on a private chain of states that starts from the
panel's first state and whose figures and replies are thrown away.  A panel model is pure (its
``apply`` never changes the state it is given), so this changes nothing the reader sees; it runs
once the code every kind of action runs (plotly's validators for each figure's properties, the
engine's paths), so that the reader's first action does not pay for that.  A panel's warm-up
ends at its first action (:func:`act`): an action that arrives during a step waits for that step
only, and the reader's later actions never wait for one.

The panels live in this module's table of handles for as long as the page is open.  Importing
this module sets plotly's defaults as the book does (:func:`paged_kv.viz.setup_plotly`: the
``plotly_white`` template), so a live figure looks like the static one it replaces and its JSON
is the one CPython gives under the book's settings.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from typing import Any

from ..errors import ConfigError
from ..viz import setup_plotly
from .base import Step, figure_json, step
from .registry import create as create_panel

__all__ = ["act", "create", "forget", "reply", "warm"]

setup_plotly()
_panels: dict[int, list] = {}          # handle -> [model, state]
_warming: dict[int, list] = {}         # handle -> [state of the private chain, demo actions left]
_handles = itertools.count(1)


def reply(handle: int, model, result: Step) -> str:
    """The JSON text a worker call answers for ``result``, a :class:`~paged_kv.panels.base.Step`.

    The figure's text goes in as :func:`figure_json` wrote it: parsing it back only to serialize
    it again cost a figure's worth of JSON twice per action."""
    text = figure_json(result.figure)
    rest = json.dumps({"handle": handle, "panel": model.name,
                       "figure_sha256": hashlib.sha256(text.encode()).hexdigest(),
                       "status": result.status, "note": result.note, "controls": model.controls(),
                       "values": model.input_values(result.state)},
                      ensure_ascii=False)
    return f'{rest[:-1]},"figure":{text}}}'


def create(name: str, args_json: str = "{}") -> str:
    """Build panel ``name`` with the page's ``live_args`` (JSON text) and answer its first figure.

    Raises:
        ConfigError: unknown panel or bad arguments; ImportError: its module does not import.
    """
    model = create_panel(name, args_json)
    handle = next(_handles)
    result = step(model, model.initial(), None)
    _panels[handle] = [model, result.state]
    if model.demo_actions:
        _warming[handle] = [result.state, list(model.demo_actions)]
    return reply(handle, model, result)


def warm() -> bool:
    """One throwaway step of a panel's demo session (see the module's docstring), of the panel
    created first among those still warming: the next of its ``demo_actions`` applied to its
    private chain's state, the figure and reply built and dropped.  Returns whether any panel has
    steps left.  No panel's own state, and so nothing the reader sees, is touched."""
    for handle, chain in _warming.items():
        break
    else:
        return False
    model = _panels[handle][0]
    state, left = chain
    result = step(model, state, left.pop(0))
    reply(handle, model, result)
    chain[0] = result.state
    if not left:
        del _warming[handle]
    return bool(_warming)


def act(handle: int, action_json: str) -> str:
    """Apply one action (JSON text of ``{"op": ..., ...}``) to panel ``handle``; a refusal is the
    reply's ``note`` and leaves the panel as it was.

    Raises:
        ConfigError: unknown handle, or the action is not a JSON object with a string ``"op"``.
    """
    if handle not in _panels:
        raise ConfigError(f"no live panel with handle {handle!r}")
    try:
        action: Any = json.loads(action_json)
    except ValueError as e:
        raise ConfigError(f"an action must be JSON, got {action_json!r:.80} ({e})") from e
    model, state = _panels[handle]
    # from the reader's first action on, their actions run the code paths: a warm-up step would
    # only make the next one wait
    _warming.pop(handle, None)
    result = step(model, state, action)
    _panels[handle][1] = result.state
    return reply(handle, model, result)


def forget(handle: int) -> None:
    """Drop panel ``handle`` (a page that rebuilt its panel)."""
    _panels.pop(handle, None)
    _warming.pop(handle, None)
