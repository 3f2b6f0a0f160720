"""The sequence palette (paged_kv.viz.palette.seq_color): past the ten Tableau colours every
sequence still gets a colour of its own, far from every other one and from the free grey, and
the pool figures of chapters 5, 7 and 8 draw a dozen requests in a dozen colours."""

import itertools
import math

import pytest

from paged_kv.errors import ConfigError
from paged_kv.panels import step
from paged_kv.panels.prefix_cache import PrefixCachePanel
from paged_kv.panels.serving import ServingPanel
from paged_kv.viz.palette import COLORS, DISTINCT_COLORS, FREE_COLOR, seq_color

#: the least RGB distance two sequences' colours keep (0..441): about two steps of a 0-255 channel
#: in each of three, far more than two shades of one colour a reader could confuse
MIN_DISTANCE = 40


def rgb(c):
    return tuple(int(c[i:i + 2], 16) for i in (1, 3, 5))


def test_the_first_ten_are_tableau_and_the_rest_keep_their_distance():
    colors = [seq_color(k) for k in range(DISTINCT_COLORS)]
    assert colors[:len(COLORS)] == COLORS
    assert DISTINCT_COLORS >= 30
    assert len(set(colors)) == DISTINCT_COLORS
    closest = min(math.dist(rgb(a), rgb(b)) for a, b in itertools.combinations(colors + [FREE_COLOR], 2))
    assert closest >= MIN_DISTANCE, closest
    for c in colors[len(COLORS):]:       # neither too dark for black text nor pale like an empty slot
        luma = sum(w * v for w, v in zip((0.299, 0.587, 0.114), rgb(c))) / 255
        assert 0.25 <= luma <= 0.75, (c, luma)


def test_past_the_distinct_ones_the_colours_cycle():
    assert [seq_color(DISTINCT_COLORS + k) for k in range(12)] == [seq_color(k) for k in range(12)]


@pytest.mark.parametrize("bad", [-1, 1.0, True, "3", None])
def test_a_sequence_index_is_an_int_from_zero(bad):
    with pytest.raises(ConfigError, match="sequence's index"):
        seq_color(bad)


def heatmap_color(trace, z):
    """The colour a discrete-scale heatmap draws value ``z`` in (paged_kv.viz.palette.discrete_scale)."""
    n = len(trace.colorscale) // 2
    band = round(z - trace.zmin - 0.5)
    assert 0 <= band < n
    return trace.colorscale[2 * band][1]


def twelve_requests(panel, **fields):
    """Twelve one-block requests, all admitted and prefilled: twelve owners in the pool."""
    s = panel.initial()
    for _ in range(12):
        s = step(panel, s, {"op": "submit", "max_tokens": 8, **fields}).state
    for _ in range(2):
        s = step(panel, s, {"op": "step"}).state
    return s


def test_a_dozen_requests_in_the_serving_pool_have_a_dozen_colours():
    panel = ServingPanel(num_gpu_blocks=24, max_num_batched_tokens=32)
    s = twelve_requests(panel, prompt="ab", n=1)
    rec = s.engine.records[-1]
    fig = panel.figure(s)
    pool = next(t for t in fig.data if t.name == "pool")
    owners = {}
    for blk in rec.pool.blocks:
        if blk.ref_count:
            r, x = _cell(pool, blk.block_id)
            owners[blk.owner] = heatmap_color(pool, pool.z[r][x])
    assert len(owners) == 12 and len(set(owners.values())) == 12, owners


def _cell(pool, block_id):
    """Row and first slot column of a block in the pool heatmap: the first non-empty cell of its row."""
    row = list(pool.z[block_id])
    return block_id, next(i for i, v in enumerate(row) if v is not None)


def test_a_dozen_requests_in_the_prefix_cache_pool_have_a_dozen_colours():
    panel = PrefixCachePanel()
    s = twelve_requests(panel, prefix="", text="ab")
    fig = panel.figure(s)
    pool = next(t for t in fig.data if t.name == "pool")
    colors = {}
    for row, zs in enumerate(pool.z):
        for col, z in enumerate(zs):
            text = pool.text[row][col]
            if z is not None and "<br>" in text:                   # a used block: "<b>id</b><br>owner"
                colors[text.split("<br>")[1].split(" ")[0]] = heatmap_color(pool, z)
    assert len(colors) == 12 and len(set(colors.values())) == 12, colors
