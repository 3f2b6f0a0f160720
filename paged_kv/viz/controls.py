"""Controls of the static figures (dropdowns, sliders, play buttons), and how they find what they
change: by name, never by position.

A plotly control changes a figure through property paths such as ``"annotations[1].text"`` or a
list of trace indices.  Positions break silently when someone adds an annotation or a trace in
front; so every annotation, shape and trace a control touches gets a ``name`` when it is made,
and the control's paths are computed from those names here (:func:`layout_path`,
:func:`trace_indices`).  ``tests/viz/test_controls.py`` checks that every step of every control
changes the object it is meant to change.
"""

from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go

from ..errors import ConfigError

__all__ = ["add_replay_controls", "frame_steps", "layout_path", "trace_indices"]


def layout_path(fig: go.Figure, kind: str, name: str, prop: str) -> str:
    """The relayout path of property ``prop`` of the ``kind`` (``"annotations"`` or ``"shapes"``)
    named ``name``, e.g. ``"annotations[1].text"``.

    Raises:
        ConfigError: no such item, or more than one with that name.
    """
    items = list(fig.layout[kind] or [])
    hits = [i for i, item in enumerate(items) if item.name == name]
    if len(hits) != 1:
        raise ConfigError(f"expected one of layout.{kind} named {name!r}, found {len(hits)} "
                          f"(names: {[item.name for item in items]})")
    return f"{kind}[{hits[0]}].{prop}"


def trace_indices(fig: go.Figure, names: Sequence[str]) -> list[int]:
    """Indices in ``fig.data`` of the traces named ``names`` (in that order).

    Raises:
        ConfigError: a name missing or held by more than one trace.
    """
    out = []
    for name in names:
        hits = [i for i, t in enumerate(fig.data) if t.name == name]
        if len(hits) != 1:
            raise ConfigError(f"expected one trace named {name!r}, found {len(hits)}")
        out.append(hits[0])
    return out


def frame_steps(frames: Sequence[str], labels: Sequence[str] | None = None) -> list[dict]:
    """Slider steps that jump (no transition) to each named frame; ``labels`` default to the names."""
    labels = frames if labels is None else labels
    return [dict(method="animate", label=str(label),
                 args=[[name], dict(mode="immediate", frame=dict(duration=0, redraw=True), transition=dict(duration=0))])
            for name, label in zip(frames, labels)]


def add_replay_controls(fig: go.Figure, steps: list, active: int, currentvalue: dict,
                        frame_ms: int, slider: dict | None = None, pad_top: int = 30) -> go.Figure:
    """Give a figure with frames the book's replay controls: a slider over ``steps`` (plotly
    slider steps) starting at ``active``, and a play button. Works in a static page (no kernel).

    ``currentvalue``: the slider's label settings; ``slider``: extra slider layout (x, len, pad).
    """
    fig.update_layout(
        sliders=[dict(active=active, steps=steps, y=0, yanchor="top", currentvalue=currentvalue,
                      **{"x": 0, "len": 1, "pad": dict(t=pad_top), **(slider or {})})],
        updatemenus=[dict(type="buttons", showactive=False, x=0, y=0, xanchor="left", yanchor="top",
                          pad=dict(t=pad_top), buttons=[dict(
                              label="▶", method="animate",
                              args=[None, dict(frame=dict(duration=frame_ms, redraw=True),
                                               fromcurrent=True, mode="immediate")])])])
    return fig
