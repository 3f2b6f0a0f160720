"""What every live panel shares: where to draw (a ``FigureWidget`` or an ``Output``), and whether
to show the panel at all (not in the static book, which has no kernel).
"""

from __future__ import annotations

import ipywidgets as w
import plotly.graph_objects as go
from IPython.display import Markdown, display

from ..errors import PagedKVError
from ..viz import is_static_build

__all__ = ["button_action", "figure_widget_or_output", "run_until_idle", "show_live", "status_html", "update_figure"]


def figure_widget_or_output(fig, use_figure_widget: bool | None = None):
    """``(figure, output)`` for a live panel: a ``go.FigureWidget`` updated in place, or, where
    FigureWidget cannot run (plotly >= 6 needs anywidget), the plain figure and an
    ``ipywidgets.Output`` to redraw it into (``output`` is then not ``None``).

    ``use_figure_widget``: ``None`` tries and falls back, ``True`` requires it (re-raising its
    error), ``False`` always redraws into an Output.
    """
    if use_figure_widget is not False:
        try:
            return go.FigureWidget(fig), None
        except Exception:
            if use_figure_widget:
                raise
    return fig, w.Output()


def run_until_idle(engine, max_steps: int = 500) -> None:
    """A panel's "run until idle" button: step an ``LLMEngine`` until no request is unfinished
    (at most ``max_steps`` steps, so a click always returns), checking the scheduler's invariants
    after every step."""
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            break
        engine.step()
        engine.scheduler.check()


def update_figure(fig, out, refresh, build) -> None:
    """Redraw a panel's figure after a change: in place through ``refresh(fig)`` when ``out`` is
    ``None`` (a ``FigureWidget``, see :func:`figure_widget_or_output`), else by replacing the
    Output's contents with the figure ``build()`` returns."""
    if out is None:
        refresh(fig)
    else:
        out.clear_output(wait=True)
        with out:
            display(build())


def show_live(panel, what: str = "This panel",
              replay: str = "the figure below is its static replay") -> bool:
    """Display a live ipywidgets panel when a reader's kernel runs; returns whether it did.

    ``panel`` is the widget, or better a zero-argument function that builds it: in the static
    book the function is never called, so no widget (and no copy of plotly.js that a
    ``FigureWidget`` would store in the notebook) ends up in the page.  There a short note says
    where the live version runs instead, and ``replay`` where the page shows a recorded run.
    Assign the result (``_ = show_live(...)``) so a notebook does not echo it.
    """
    if is_static_build():
        display(Markdown(f"*{what} is live when you run this chapter in Jupyter or Colab "
                         f"(launch button at the top of the page); {replay}.*"))
        return False
    display(panel() if callable(panel) else panel)
    return True


def button_action(fn, redraw):
    """A button's ``on_click`` handler: run ``fn()`` and ``redraw`` the panel with the note it
    returns; a refusal of ours (a :class:`~paged_kv.errors.PagedKVError`, e.g. no free block or an
    inadmissible request) is shown as the note instead, and changes nothing."""
    def handler(_):
        try:
            redraw(fn() or "")
        except PagedKVError as e:
            redraw(str(e))
    return handler


def status_html(note: str, texts: str) -> str:
    """A panel's status line: the note in red (if any) above the requests' texts."""
    return (f"<span style='color:#c00'>{note}</span><br>" if note else "") + texts
