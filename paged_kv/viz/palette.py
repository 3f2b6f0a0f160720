"""The book's colours, in one place: the sequence palette, the free-slot grey, tints and discrete
colour scales for heatmaps.  Every figure takes its colours from here, so a sequence or a
category has the same colour in every chapter.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["COLORS", "FREE_COLOR", "discrete_scale", "tint"]

# Sequence (request) i is drawn in COLORS[i % len(COLORS)] (Tableau 10, distinguishable and
# printable in grey).
COLORS = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6",
          "#9D755D", "#EECA3B", "#BAB0AC"]
FREE_COLOR = "#EEEEEE"


def tint(hex_color: str, amount: float) -> str:
    """``hex_color`` (``"#RRGGBB"``) mixed with white; ``amount`` is the share of white (0: the
    colour itself, 1: white).  A pale tint of a sequence's colour marks its reserved, empty slots."""
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return "#" + "".join(f"{round(c + (255 - c) * amount):02X}" for c in (r, g, b))


def discrete_scale(colors: Sequence[str]) -> list:
    """A plotly colorscale that maps the integers ``0 .. n-1`` to ``colors`` exactly (use it with
    ``zmin=-0.5, zmax=n-0.5``): each colour owns one equal band, with hard edges between bands."""
    n = len(colors)
    scale = []
    for i, c in enumerate(colors):
        scale += [[i / n, c], [(i + 1) / n, c]]
    return scale
