"""One program of the paged decode kernel walking its sequence, tile by tile (chapter 5).

:func:`tile_walk` computes, in plain Python, what one program of
``kernels.paged_attention._paged_decode_split_kernel`` loads in each step of its inner loop, with
the kernel's own arithmetic, line for line::

    cols = start_n + arange(BLOCK_N)                 # token positions of the tile
    valid = cols < end                               # past the sequence: masked, never loaded
    block_ids = load(table + cols // BS, mask=valid, other=0)
    rows = block_ids * stride_block + (cols % BS) * stride_slot     # cache_offset, int64

so a tile covers ``BLOCK_N`` consecutive positions whatever the block size, and may span several
physical blocks anywhere in the pool.  The slot of a valid position is ``block_id * BS + cols % BS``
(the ``rows`` above divided by the slot stride).  ``tests/viz/test_kernel_walk.py`` runs the real
kernel on a cache whose values encode their own slot numbers and checks these slots.

:func:`kernel_walk_figure` draws the walk with one plotly frame per tile (a slider; works in the
static book): on top the sequence cut into tiles (a row per tile, a cell per position, block
borders drawn), below it the pool (a row per physical block) with the slots the tile loads.

Source followed: the vLLM paper (Kwon et al., SOSP 2023), §4.1, Eq. 4 and Fig. 5 (attention
computed block by block over scattered KV blocks); our kernel's tiles span blocks instead (see
:mod:`kernels.paged_attention`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..errors import ConfigError
from ..validate import count
from .controls import add_replay_controls, frame_steps, trace_indices
from .palette import COLORS, FREE_COLOR, discrete_scale, tint

__all__ = ["Tile", "kernel_walk_figure", "tile_walk"]

TRACE_NAMES = ("tiles", "pool")
LABEL_STANDOFF = 8   # px between a row label and its row's first cell

# colour categories of a cell (z), in both panels
MASKED, WAITING, EARLIER, CURRENT = 0, 1, 2, 3
_SCALE = discrete_scale([FREE_COLOR, tint(COLORS[0], 0.8), tint(COLORS[0], 0.45), COLORS[1]])


@dataclass(frozen=True)
class Tile:
    """One inner-loop step of one program.

    Attributes:
        index: the step (0, 1, ...).
        positions: the ``BLOCK_N`` token positions ``start_n + arange(BLOCK_N)`` (``cols``).
        valid: per position, ``cols < end`` (masked positions load nothing).
        block_ids: per position, the gathered physical block (``other=0`` where masked).
        slots: per position, ``block_id * BS + cols % BS``, or ``None`` where masked.
    """

    index: int
    positions: tuple[int, ...]
    valid: tuple[bool, ...]
    block_ids: tuple[int, ...]
    slots: tuple[int | None, ...]

    @property
    def loaded_slots(self) -> tuple[int, ...]:
        """The slots whose K and V this step loads, in position order."""
        return tuple(s for s in self.slots if s is not None)

    @property
    def blocks_touched(self) -> tuple[int, ...]:
        """Physical blocks this step reads from, in position order, each once."""
        return tuple(dict.fromkeys(b for b, ok in zip(self.block_ids, self.valid) if ok))


def tile_walk(block_table: Sequence[int], seq_len: int, block_size: int, block_n: int = 32,
              start: int = 0, end: int | None = None) -> list[Tile]:
    """The tiles one program of the paged decode kernel loads, in loop order.

    Args:
        block_table: the sequence's physical block ids (its row of ``block_tables``).
        seq_len: tokens in the sequence (the new one included).
        block_size: BS, tokens per block.
        block_n: ``BLOCK_N``, positions per inner step (the kernel needs >= 16, a power of two).
        start, end: the program's split, ``range(start, end)`` of positions (default: all).

    Raises:
        ConfigError: a size that is not an int >= 1, ``block_n`` not a power of two >= 16, or a
            block table too short for ``seq_len`` (the wrapper's ``TensorError`` case).
    """
    seq_len = count("seq_len", seq_len, minimum=1, error=ConfigError)
    bs = count("block_size", block_size, minimum=1, error=ConfigError)
    bn = count("block_n", block_n, minimum=16, error=ConfigError)
    if bn & (bn - 1):
        raise ConfigError(f"block_n must be a power of two >= 16 (tl.dot), got {bn}")
    table = [int(b) for b in block_table]
    if len(table) * bs < seq_len:
        raise ConfigError(f"a block table of {len(table)} blocks x {bs} slots covers "
                          f"{len(table) * bs} tokens, fewer than seq_len {seq_len}")
    end = seq_len if end is None else min(int(end), seq_len)
    tiles = []
    for i, start_n in enumerate(range(int(start), end, bn)):
        cols = [start_n + j for j in range(bn)]
        valid = [c < end for c in cols]
        block_ids = [table[c // bs] if ok else 0 for c, ok in zip(cols, valid)]    # other=0
        slots = [b * bs + c % bs if ok else None for b, c, ok in zip(block_ids, cols, valid)]
        tiles.append(Tile(i, tuple(cols), tuple(valid), tuple(block_ids), tuple(slots)))
    return tiles


def _traces(tiles: list[Tile], shown: int, block_table: Sequence[int], num_blocks: int,
            block_size: int) -> list:
    """The two heatmaps with tile ``shown`` current (``-1``: before the loop)."""
    bn = len(tiles[0].positions)
    tz, ttext, thover = [], [], []
    for t in tiles:
        state = CURRENT if t.index == shown else EARLIER if t.index < shown else WAITING
        tz.append([state if ok else MASKED for ok in t.valid])
        # numbered where a logical block starts (and at the tile's start): 32 numbers a row would
        # run together on a phone-wide page; hover names every position
        ttext.append([str(p) if ok and (p % block_size == 0 or j == 0) else ""
                      for j, (p, ok) in enumerate(zip(t.positions, t.valid))])
        thover.append([(f"tile {t.index}, position {p}: logical block {p // block_size}, offset "
                        f"{p % block_size}<br>→ physical block {b}, slot {s}") if ok else
                       f"tile {t.index}, position {p}: past the sequence, masked (never loaded)"
                       for p, ok, b, s in zip(t.positions, t.valid, t.block_ids, t.slots)])
    pz = [[MASKED] * block_size for _ in range(num_blocks)]
    ptext = [[""] * block_size for _ in range(num_blocks)]
    phover = [[f"block {b}, slot {b * block_size + o}: not this sequence's" for o in range(block_size)]
              for b in range(num_blocks)]
    for t in tiles:
        state = CURRENT if t.index == shown else EARLIER if t.index < shown else WAITING
        for p, ok, b, s in zip(t.positions, t.valid, t.block_ids, t.slots):
            if ok:
                pz[b][p % block_size] = state
                ptext[b][p % block_size] = str(p)
                phover[b][p % block_size] = f"block {b}, slot {s}: position {p}, loaded by tile {t.index}"
    common = dict(colorscale=_SCALE, zmin=-0.5, zmax=3.5, showscale=False, xgap=2, ygap=3,
                  texttemplate="%{text}", textfont=dict(size=10), hovertemplate="%{customdata}<extra></extra>")
    tiles_trace = go.Heatmap(z=tz, text=ttext, customdata=thover, name="tiles", x=list(range(bn)),
                             y=[f"tile {t.index}" for t in tiles], **common)
    pool = go.Heatmap(z=pz, text=ptext, customdata=phover, name="pool", x=list(range(block_size)),
                      y=[f"block {b}" for b in range(num_blocks)], **common)
    return [tiles_trace, pool]


def _caption(tiles: list[Tile], shown: int, block_size: int) -> str:
    if shown < 0:
        return "before the loop: the program holds its query heads; nothing loaded yet"
    t = tiles[shown]
    pos = [p for p, ok in zip(t.positions, t.valid) if ok]
    masked = len(t.positions) - len(pos)
    return (f"tile {t.index}: positions {pos[0]}–{pos[-1]}"
            + (f" (+{masked} masked)" if masked else "")
            + f" → blocks {list(t.blocks_touched)}<br><sup>one gather of {len(t.positions)} table "
            f"entries; K, V rows at block × {block_size} + offset</sup>")


def kernel_walk_figure(tiles: list[Tile], block_table: Sequence[int], num_blocks: int, block_size: int,
                       title: str = "", height: int | None = None) -> go.Figure:
    """The walk of :func:`tile_walk`'s ``tiles`` with a slider, one frame per tile (plus "before").

    Top: a row per tile, a cell per position (text: the position where a logical block starts;
    masked positions grey), thick lines at block borders.  Bottom: the pool, a row per physical block, a cell per slot (text: the
    position it holds).  Orange: loaded by the current tile; mid blue: by earlier tiles; pale: not
    yet.  ``num_blocks``: the pool's size (every block is drawn).

    Raises:
        ConfigError: no tiles.
    """
    if not tiles:
        raise ConfigError("no tiles to draw (tile_walk of an empty range)")
    bn = len(tiles[0].positions)
    rows_t = len(tiles)
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.1,
                        row_heights=[rows_t / (rows_t + num_blocks), num_blocks / (rows_t + num_blocks)],
                        subplot_titles=(f"<b>the sequence in tiles of BLOCK_N = {bn} positions</b>",
                                        f"<b>the pool</b>: {num_blocks} physical blocks × {block_size} slots"))
    for note in fig.layout.annotations:
        note.update(x=0, xanchor="left", align="left", font=dict(size=12))
    last = len(tiles) - 1
    for i, trace in enumerate(_traces(tiles, last, block_table, num_blocks, block_size)):
        fig.add_trace(trace, row=i + 1, col=1)
    head = f"{title}<br>" if title else ""
    fig.update_layout(title=dict(text=head + _caption(tiles, last, block_size), x=0.01, font=dict(size=14)),
                      height=height or max(420, 24 * (rows_t + num_blocks) + 260),
                      margin=dict(l=10, r=10, t=110, b=70), plot_bgcolor="white", showlegend=False)
    fig.update_xaxes(row=1, col=1, showticklabels=False, range=[-0.5, bn - 0.5], showgrid=False, zeroline=False)
    fig.update_xaxes(row=2, col=1, title_text="slot offset in the block", dtick=1, showgrid=False, zeroline=False)
    # the row labels stand off the cells: a tile's first position ("32") is wider than its cell on a
    # phone and ran into the label ("tile 132")
    fig.update_yaxes(autorange="reversed", showgrid=False, automargin=True, tickfont=dict(size=10),
                     ticklabelstandoff=LABEL_STANDOFF)
    for t in tiles:                          # block borders: before every position p with p % BS == 0
        for col, p in enumerate(t.positions):
            if col and p % block_size == 0:
                fig.add_shape(type="line", x0=col - 0.5, x1=col - 0.5, y0=t.index - 0.5, y1=t.index + 0.5,
                              xref="x", yref="y", line=dict(color="#333", width=2.5))
    frames = list(range(-1, len(tiles)))
    traces = trace_indices(fig, TRACE_NAMES)
    fig.frames = [go.Frame(name=str(k), data=_traces(tiles, k, block_table, num_blocks, block_size), traces=traces,
                           layout=go.Layout(title_text=head + _caption(tiles, k, block_size))) for k in frames]
    steps = frame_steps([str(k) for k in frames], ["before"] + [f"tile {k}" for k in frames[1:]])
    add_replay_controls(fig, steps, len(frames) - 1, currentvalue=dict(prefix="", xanchor="right"),
                        frame_ms=1200, slider=dict(x=0.1, len=0.9))
    return fig
