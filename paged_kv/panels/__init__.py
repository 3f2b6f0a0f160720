"""The panel models: every decision of a live panel, as a pure function of (state, action).

One module per panel; the ipywidgets panels (:mod:`paged_kv.widgets`) and the browser edition's
page controls both drive these, so they cannot disagree.  :mod:`~paged_kv.panels.base` holds the
interface (:class:`PanelModel`, :func:`step`) and :func:`figure_json`, the bytes the parity test
compares.  The layer imports neither torch nor numpy (it runs in Pyodide).
"""

from .base import PanelModel, Step, figure_json, step

__all__ = ["PanelModel", "Step", "figure_json", "step"]
