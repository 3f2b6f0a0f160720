"""The "Run live" placeholder a static page carries next to a panel's figure.

:func:`placeholder` writes a ``<div class="paged-kv-live">`` naming the panel (``data-panel``, a
:mod:`~paged_kv.panels.registry` name), its ``live_args`` (``data-args``, JSON) and the figure it
redraws (``data-figure``, the id of a plotly div on the page), with a "Run live" button.  Nothing
runs when the page loads but a small click listener (``book/_ext/live/click.js``, added by the
book's ``live_mode`` extension); the first click imports the live module, which starts Pyodide in a
Web Worker and replaces the button with the panel's controls.

Where the build has no live mode (``PAGED_KV_LIVE=0``, set by ``make book LIVE=0`` or by the
extension when the Pyodide files were not fetched), the placeholder says so instead of offering a
button.

Either way the placeholder starts with a badge that says what the figure under it is:
:data:`STATIC_BADGE` until the panel runs, then (``live.mjs``, from the badge's
``data-live-badge``) :data:`LIVE_BADGE`, so a reader never takes the build's replay for the live
panel, or the other way round.
"""

from __future__ import annotations

import html
import json
import os
from typing import Any, Mapping

from ..errors import ConfigError
from .registry import PANELS

__all__ = ["LIVE_BADGE", "LIVE_ENV", "OFF_MESSAGE", "STATIC_BADGE", "badge", "live_enabled", "placeholder"]

LIVE_ENV = "PAGED_KV_LIVE"
OFF_MESSAGE = "Live mode is not in this build"
#: the badge over a panel's figure: the panel model's starting state as the build drew it (no
#: replay: a chapter's recorded runs are figures of their own), or the panel running in the browser
STATIC_BADGE = "static: the starting state, built with the book"
LIVE_BADGE = "live: running in your browser"


def live_enabled() -> bool:
    """Whether this build has live mode: ``PAGED_KV_LIVE`` is not ``"0"`` (the book's
    ``live_mode`` extension sets it to ``"0"`` when the Pyodide files are missing)."""
    return os.environ.get(LIVE_ENV, "1").strip() != "0"


def badge(live: bool) -> str:
    """The badge's HTML: :data:`STATIC_BADGE`, with :data:`LIVE_BADGE` in ``data-live-badge``
    for the page to show once the panel runs when ``live`` (the build has live mode)."""
    swap = f' data-live-badge="{html.escape(LIVE_BADGE)}"' if live else ""
    return f'<span class="paged-kv-live-badge"{swap}>{html.escape(STATIC_BADGE)}</span>'


def placeholder(panel: str, args: Mapping[str, Any] | None = None, figure_id: str = "",
                what: str = "This panel", enabled: bool | None = None) -> str:
    """The placeholder's HTML for registry panel ``panel`` built with ``args`` (JSON-able), which
    redraws the plotly div ``figure_id`` (empty: the next figure after the placeholder).
    ``enabled`` defaults to :func:`live_enabled`.

    Raises:
        ConfigError: ``panel`` is not a registry name, or ``args`` is not JSON-able.
    """
    if panel not in PANELS:
        raise ConfigError(f"no panel named {panel!r}; the panels are {sorted(PANELS)}")
    try:
        args_json = json.dumps(dict(args or {}), sort_keys=True)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"panel {panel!r}: live_args must be JSON-able, got {args!r:.80} ({e})") from e
    attrs = (f'data-panel="{html.escape(panel)}" data-args="{html.escape(args_json)}" '
             f'data-figure="{html.escape(figure_id)}"')
    if not (live_enabled() if enabled is None else enabled):
        return (f'<div class="paged-kv-live paged-kv-live-off" {attrs}><p>{badge(False)} <em>{OFF_MESSAGE}</em>: '
                f'{html.escape(what)} runs live in Jupyter or Colab.</p></div>')
    return (f'<div class="paged-kv-live" {attrs}>'
            f'<p>{badge(True)} <button type="button" class="paged-kv-live-run">Run live</button> '
            f'<small class="paged-kv-live-note">{html.escape(what)} runs in your browser: the package\'s own '
            f'Python code in Pyodide, fetched from this site on the first click (no server, no other '
            f'site).</small></p>'
            f'<div class="paged-kv-live-controls"></div>'
            f'<pre class="paged-kv-live-status" style="display:none"></pre></div>')

