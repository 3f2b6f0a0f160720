"""The book's colours, in one place: the sequence palette, the free-slot grey, tints and discrete
colour scales for heatmaps.  Every figure takes its colours from here, so a sequence or a
category has the same colour in every chapter.
"""

from __future__ import annotations

from functools import lru_cache
from math import dist
from typing import Sequence

from ..validate import count

__all__ = ["COLORS", "DISTINCT_COLORS", "FREE_COLOR", "discrete_scale", "seq_color", "tint"]

# The first ten sequences are drawn in COLORS (Tableau 10, distinguishable and printable in grey);
# sequence k in seq_color(k), which goes on past ten with colours of its own.
COLORS = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6",
          "#9D755D", "#EECA3B", "#BAB0AC"]
FREE_COLOR = "#EEEEEE"

#: how many sequences get a colour no other one has (:func:`seq_color`); the 41st takes the
#: first's again.  A live panel's pool of 24 blocks holds up to 24 one-block requests at once, and
#: a session that submits more keeps each name's colour as requests come and go.
DISTINCT_COLORS = 40

# The candidates for the colours past COLORS: a grid of RGB levels, kept where neither too dark for
# a slot's black text nor too pale (a pale tint marks an empty slot), and not grey (free).
_LEVELS = range(0x33, 0xDE, 0x22)
_MIN_LUMA, _MAX_LUMA, _MIN_CHROMA = 0.30, 0.72, 0x44


def _rgb(hex_color: str) -> tuple[int, int, int]:
    return int(hex_color[1:3], 16), int(hex_color[3:5], 16), int(hex_color[5:7], 16)


@lru_cache(maxsize=1)
def _palette() -> tuple[str, ...]:
    """COLORS, then colours picked one at a time, each the candidate farthest (in RGB) from every
    colour already picked and from the free grey: so each new one is as unlike all the others as
    the grid allows, rather than COLORS repeated (``COLORS[k % 10]`` drew request 10 as request 0).
    Why not darker copies of COLORS: a darkened orange is a brown, a darkened pink a red, so two
    cycles met within a few RGB steps (tests/viz check the smallest distance)."""
    cands = [(r, g, b) for r in _LEVELS for g in _LEVELS for b in _LEVELS
             if _MIN_LUMA <= (0.299 * r + 0.587 * g + 0.114 * b) / 255 <= _MAX_LUMA
             and max(r, g, b) - min(r, g, b) >= _MIN_CHROMA]
    picked = [_rgb(c) for c in COLORS]
    near = {c: min(dist(c, p) for p in [*picked, _rgb(FREE_COLOR)]) for c in cands}
    out = list(COLORS)
    while len(out) < DISTINCT_COLORS:
        best = max(cands, key=lambda c: (near[c], c))
        cands.remove(best)
        out.append("#%02X%02X%02X" % best)
        for c in cands:
            near[c] = min(near[c], dist(c, best))
    return tuple(out)


def seq_color(k: int) -> str:
    """The colour of sequence (request) ``k``, counted from 0: ``COLORS[k]`` for the first ten,
    then colours of their own (see :func:`_palette`), distinct for ``k < DISTINCT_COLORS``, after
    which they cycle.

    Raises:
        ConfigError: ``k`` not an int >= 0.
    """
    palette = _palette()
    return palette[count("k (a sequence's index)", k, minimum=0) % len(palette)]


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
