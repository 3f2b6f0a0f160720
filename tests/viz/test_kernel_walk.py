"""The kernel walk-through (chapter 5): the slots tile_walk and its figure say each tile loads are
the slots the real Triton kernel loads (TRITON_INTERPRET=1 on a CPU), read back from a cache whose
values encode their own slot numbers; bad input is refused by value."""

import pytest
import torch

from kernels import runtime as rt
from paged_kv.errors import ConfigError
from paged_kv.viz.kernel_walk import CURRENT, EARLIER, MASKED, kernel_walk_figure, tile_walk

BS, NB, L, BLOCK_N = 4, 8, 20, 16
TABLE = [5, 2, 7, 0, 3, 6]            # 5 blocks used by 20 tokens, then a padding entry (never read)


def slots_the_kernel_loads():
    """Run the real kernel once per prefix length 1..L of one sequence and return, per prefix,
    the set of slots it loaded.

    Slot s holds K = e_s (a one-hot key, D = NB * BS) and V = (s, s^2, 0, ...); query head h is
    60 * e_h with scale 1, so head h's output is (h, h^2) exactly when slot h was loaded (its
    score e^60 dominates), and otherwise the mean over the loaded slots (which equals (h, h^2)
    only if h alone was loaded).  Every slot not in the sequence holds NaN: loading one shows."""
    from kernels.paged_attention import paged_decode_attention
    S = NB * BS
    k_cache = torch.full((NB, BS, 1, S), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    used = {b * BS + o for b in TABLE[:L // BS] for o in range(BS)}
    for s in used:
        k_cache[s // BS, s % BS, 0] = torch.nn.functional.one_hot(torch.tensor(s), S).float()
        v_cache[s // BS, s % BS, 0] = 0.0
        v_cache[s // BS, s % BS, 0, 0], v_cache[s // BS, s % BS, 0, 1] = float(s), float(s * s)
    q = (60.0 * torch.eye(S))[None].repeat(L, 1, 1)                            # (B=L, H=S, D=S)
    tables = torch.tensor([TABLE] * L, dtype=torch.int32)
    seq_lens = torch.arange(1, L + 1, dtype=torch.int32)
    out = paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, scale=1.0, num_splits=1, block_n=BLOCK_N)
    assert not torch.isnan(out).any()
    h = torch.arange(S).float()
    hit = ((out[:, :, 0] - h).abs() < 1e-3) & ((out[:, :, 1] - h * h).abs() < 1e-2)   # (L, S)
    return [set(torch.nonzero(row).flatten().tolist()) for row in hit]


@pytest.mark.skipif(not rt.triton_available(), reason="needs Triton (interpreter on CPU)")
def test_figure_slots_are_the_slots_the_real_kernel_loads():
    loaded = slots_the_kernel_loads()
    kernel_slot = {p: (loaded[p] - (loaded[p - 1] if p else set())) for p in range(L)}
    assert all(len(v) == 1 for v in kernel_slot.values())                  # one new slot per position
    kernel_slot = {p: v.pop() for p, v in kernel_slot.items()}
    tiles = tile_walk(TABLE, L, BS, BLOCK_N)
    walk_slot = {p: s for t in tiles for p, s in zip(t.positions, t.slots) if s is not None}
    assert walk_slot == kernel_slot
    assert len(tiles) == 2 and tiles[1].valid.count(True) == L - BLOCK_N       # 12 masked positions
    # tile k loads exactly what the kernel adds between the prefixes k*BLOCK_N and (k+1)*BLOCK_N
    for t in tiles:
        before = loaded[t.positions[0] - 1] if t.positions[0] else set()
        assert set(t.loaded_slots) == loaded[min(L, t.positions[-1] + 1) - 1] - before
    # and the figure draws them: in tile k's frame the pool cells marked "current" are its slots
    fig = kernel_walk_figure(tiles, TABLE, NB, BS)
    for t in tiles:
        pool = fig.frames[t.index + 1].data[1]
        current = {b * BS + o for b in range(NB) for o in range(BS) if pool.z[b][o] == CURRENT}
        assert current == set(t.loaded_slots)
        for s in t.loaded_slots:
            assert pool.text[s // BS][s % BS] == str(next(p for p, x in zip(t.positions, t.slots) if x == s))


def test_tiles_span_blocks_and_mask_past_the_sequence():
    tiles = tile_walk([9, 4, 1], 10, block_size=4, block_n=16)
    (t,) = tiles
    assert t.blocks_touched == (9, 4, 1)                     # one tile, three scattered blocks
    assert t.slots[:5] == (36, 37, 38, 39, 16) and t.slots[10:] == (None,) * 6
    assert t.block_ids[10:] == (0,) * 6                      # the masked gather's other=0
    fig = kernel_walk_figure(tiles, [9, 4, 1], 12, 4)
    assert list(fig.frames[1].data[0].z[0]).count(MASKED) == 6
    assert list(fig.frames[0].data[1].z[9]) == [1, 1, 1, 1]  # before the loop: waiting
    assert len(fig.layout.sliders[0].steps) == 2


def test_a_later_tile_marks_earlier_ones():
    tiles = tile_walk(list(range(8)), 32, block_size=4, block_n=16)
    fig = kernel_walk_figure(tiles, list(range(8)), 8, 4)
    assert set(fig.frames[2].data[0].z[0]) == {EARLIER} and set(fig.frames[2].data[0].z[1]) == {CURRENT}


@pytest.mark.parametrize("kw,match", [(dict(block_n=8), "got 8"), (dict(block_n=24), "power of two"),
                                      (dict(seq_len=13), "covers 12 tokens"), (dict(block_size=0), "got 0")])
def test_bad_walks_are_refused_by_value(kw, match):
    args = dict(block_table=[1, 2, 3], seq_len=12, block_size=4, block_n=16) | kw
    with pytest.raises(ConfigError, match=match):
        tile_walk(**args)


def test_tile_rows_number_only_block_starts():
    """A tile row labels a position only where a logical block starts (or the tile starts), so a
    phone-wide figure is not a run of digits; every valid position keeps its hover text."""
    tiles = tile_walk([9, 4, 1], 10, block_size=4, block_n=16)
    fig = kernel_walk_figure(tiles, [9, 4, 1], 12, 4)
    row = list(fig.frames[1].data[0].text[0])
    assert [i for i, s in enumerate(row) if s] == [0, 4, 8] and row[4] == "4"
    assert all("position" in h for h in fig.frames[1].data[0].customdata[0])


def test_row_labels_stand_off_a_first_number_wider_than_its_cell():
    """At 400 px a tile's first position ("32", 10 px) is wider than its ~9-px cell and ran into the
    row label ("tile 132", review shot 14): the labels stand off by more than that overflow."""
    table = [9, 1, 6, 2, 10, 0, 4, 7, 11]                             # 9 blocks of 8 hold 70 positions
    tiles = tile_walk(table, 70, block_size=8, block_n=32)
    fig = kernel_walk_figure(tiles, table, 12, 8)
    text = fig.data[0].text
    first = max(len(row[0]) for row in text)
    label_px = 10 * 0.65 * len("tile 2") + 4                        # the widest row label, automargin
    cell_w = (368 - fig.layout.margin.l - fig.layout.margin.r - label_px) / len(text[0])
    overflow = (first * 10 * 0.65 - (cell_w - fig.data[0].xgap)) / 2
    assert overflow > 0                                              # the case of the shot
    for axis in (fig.layout.yaxis, fig.layout.yaxis2):
        assert axis.ticklabelstandoff >= overflow + 3
