"""Live ipywidgets panels over the real objects (one submodule per chapter topic).

A live panel needs a running kernel.  In the static HTML book (``make book``) there is none, so
:func:`show_live` prints a one-line note instead and the chapter shows a static plotly figure
(frames and sliders) built from recorded history.  Colab needs its custom widget manager, which
each chapter's hidden first cell enables.  Nothing in the package imports this layer.

* :mod:`~paged_kv.widgets.panel`: :func:`show_live`, :func:`figure_widget_or_output`, and the
  handlers that show any error in the panel's status line instead of raising it;
* :mod:`~paged_kv.widgets.memory`: the KV calculator (chapter 3);
* :mod:`~paged_kv.widgets.fragmentation`: the memory strip (chapter 4);
* :mod:`~paged_kv.widgets.blocks`: the block pool (chapter 5);
* :mod:`~paged_kv.widgets.serving`: the serving engine (chapter 7);
* :mod:`~paged_kv.widgets.prefix_cache`: the prefix cache (chapter 8).
"""

from .blocks import block_panel
from .fragmentation import strip_panel
from .memory import MemoryCalculator, calculator_panel
from .panel import figure_widget_or_output, show_live

__all__ = ["MemoryCalculator", "block_panel", "calculator_panel", "figure_widget_or_output", "show_live",
           "strip_panel"]
