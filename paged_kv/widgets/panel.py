"""What every live panel shares: where to draw (a ``FigureWidget`` or an ``Output``), whether to
show the panel at all (not in the static book, which has no kernel), and how a control's handler
reports an error: in the panel's status line, never by raising.

Why never raise: ipywidgets catches an exception escaping a callback and sends its traceback to the
kernel's log, not to the page, so to the reader the click seems to do nothing.  Every handler of
every panel therefore catches any ``Exception`` (:func:`button_action` for buttons,
:func:`guarded` for other controls) and shows it through :func:`error_note`: a refusal of ours (a
:class:`~paged_kv.errors.PagedKVError`: no free block, a request that can never run, a bad prompt)
as its message, anything else as ``"internal error: TypeError: ..."``, a bug to report rather
than something the reader did wrong, with its traceback logged (logger ``paged_kv.widgets``).
``KeyboardInterrupt`` is not caught: interrupting the kernel still stops a long "run until idle".
"""

from __future__ import annotations

import html
import itertools
import logging
from typing import Any, Mapping

import ipywidgets as w
import plotly.graph_objects as go
import plotly.io as pio
from IPython.display import HTML, Markdown, display

from ..engine.step_record import sample_name
from ..errors import PagedKVError
from ..panels import registry, step
from ..panels.page import live_enabled, placeholder
from ..viz import is_static_build

__all__ = ["button_action", "error_note", "figure_widget_or_output", "guarded", "live_html",
           "show_live", "status_html", "update_figure"]

_log = logging.getLogger("paged_kv.widgets")
_live_ids = itertools.count(1)


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


#: what the static book's note says of the figure under a panel without ``live``: a recorded run
REPLAY_NOTE = "the figure below is its static replay"
#: ... and with ``live``: the figure under "Run live" is the panel model's first state, no replay
START_NOTE = "until you click, the figure below is the panel's starting state, drawn when the book was built"


def show_live(panel, what: str = "This panel", replay: str | None = None, live: str | None = None,
              live_args: Mapping[str, Any] | None = None) -> bool:
    """Display a live ipywidgets panel when a reader's kernel runs; returns whether it did.

    ``panel`` is the widget, or better a zero-argument function that builds it: in the static
    book the function is never called, so no widget (and no copy of plotly.js that a
    ``FigureWidget`` would store in the notebook) ends up in the page.  There a short note says
    where the live version runs instead, and ``replay`` where the page shows a recorded run
    (default: :data:`REPLAY_NOTE`, the figure below; with ``live``, :data:`START_NOTE`, since the
    figure below is then the panel's starting state, not a replay).
    With ``live`` (a :mod:`paged_kv.panels.registry` name) the static page also gets the browser
    edition's "Run live" placeholder and the panel model's first figure, which the page redraws
    in place once the reader clicks (:func:`live_html`); ``live_args`` are the panel model's
    JSON-able constructor arguments.
    Assign the result (``_ = show_live(...)``) so a notebook does not echo it.

    Raises:
        ConfigError: ``live`` is not a registry name, or ``live_args`` is not JSON-able.
    """
    if replay is None:
        replay = START_NOTE if live is not None else REPLAY_NOTE
    if is_static_build():
        here = " or right here (\"Run live\" below)" if live is not None and live_enabled() else ""
        display(Markdown(f"*{what} is live when you run this chapter in Jupyter or Colab "
                         f"(launch button at the top of the page){here}; {replay}.*"))
        if live is not None:
            display(HTML(live_html(live, live_args, what)))
        return False
    display(panel() if callable(panel) else panel)
    return True


def live_html(live: str, live_args: Mapping[str, Any] | None = None, what: str = "This panel") -> str:
    """The static page's part of a live panel: the "Run live" placeholder
    (:func:`paged_kv.panels.page.placeholder`) above the panel model's first figure (its div,
    without plotly.js, which the page loads once), which the browser edition redraws in place.

    Raises:
        ConfigError: ``live`` is not a registry name, or ``live_args`` is not JSON-able.
    """
    model = registry.create(live, dict(live_args or {}))
    first = step(model, model.initial(), None)
    div_id = f"paged-kv-live-{live}-{next(_live_ids)}"
    fig_html = pio.to_html(first.figure, include_plotlyjs=False, full_html=False, div_id=div_id,
                           config={"displaylogo": False, "responsive": True})
    return placeholder(live, live_args, figure_id=div_id, what=what) + fig_html


def error_note(e: Exception) -> str:
    """How a panel's status line shows ``e``: a :class:`~paged_kv.errors.PagedKVError` (our
    refusal, which names the bad value and changed nothing) as its message; any other exception as
    ``"internal error: <type>: <message>"``, so it does not read as a refusal, and its traceback
    goes to the log."""
    if isinstance(e, PagedKVError):
        return str(e)
    _log.error("a live panel's control failed", exc_info=e)
    return f"internal error: {type(e).__name__}: {e}"


def guarded(fn, show):
    """A control's handler (an ``observe`` callback) that never raises: ``fn(*args)``, and on any
    ``Exception`` ``show(error_note(e))`` instead (see the module docstring for why).  The control
    stays usable: the next change calls ``fn`` again as usual."""
    def handler(*args):
        try:
            fn(*args)
        except Exception as e:
            show(error_note(e))
    return handler


def button_action(fn, redraw, status):
    """A button's ``on_click`` handler that never raises: run ``fn()`` and ``redraw`` the panel
    with the note it returns.  If ``fn`` raises, the error (:func:`error_note`) is the note
    instead: a refusal of ours changed nothing; after an internal error the panel shows whatever
    state it left.  If ``redraw`` itself raises, the ``status`` widget (an ``ipywidgets.HTML``)
    shows both notes directly.  The next click runs as usual either way."""
    def handler(_=None):
        try:
            note = fn() or ""
        except Exception as e:
            note = error_note(e)
        try:
            redraw(note)
        except Exception as e:
            failed = f"redrawing the panel failed: {error_note(e)}"
            status.value = status_html(f"{note}; {failed}" if note else failed, "")
    return handler


def status_html(note: str, texts: str) -> str:
    """A panel's status line: the note in red (if any; plain text, escaped here, since an error's
    message may hold "<") above the requests' texts (HTML, escaped by the caller)."""
    return (f"<span style='color:#c00'>{html.escape(note, quote=False)}</span><br>" if note else "") + texts


def outputs_html(outputs, label=None) -> str:
    """The requests' streamed texts for a status line, one line per sample: its name (the request id,
    ``B.1`` for sample 1 of ``B``: :func:`~paged_kv.engine.step_record.sample_name`; with
    ``label(output)`` after it, if given), the text so far, and once the sample has ended its
    finish reason; a request that ended with ``"error"`` shows the error's text in red, since a
    failed step is otherwise silent in a panel.  Everything is escaped here."""
    lines = []
    for o in outputs:
        tail = "" if label is None else f" ({html.escape(label(o), quote=False)})"
        head = f"<b>{html.escape(str(o.request_id), quote=False)}</b>{tail}"
        for i, (t, reason) in enumerate(zip(o.text or [], o.finish_reason)):
            end = "" if reason is None else f" <span style='color:#666'>[{html.escape(reason)}]</span>"
            name = f"<b>{html.escape(sample_name(o.request_id, i), quote=False)}</b>{tail}"
            lines.append(f"{name}: {html.escape(repr(t), quote=False)}{end}")
        if o.error:
            lines.append(f"<span style='color:#c00'>{head}: {html.escape(o.error, quote=False)}</span>")
    return "<br>".join(lines)
