"""The prefix-cache figures and panel (chapter 8): states drawn as the manager holds them, hits and
LRU evictions where they happened, the radix tree spelling the prompts back, the live panel."""

import re

import plotly.graph_objects as go
import pytest

from paged_kv.errors import ConfigError

from paged_kv.engine import EngineConfig, LLMEngine
from paged_kv.model.sampling import SamplingParams
from paged_kv.viz.prefix_cache import (SHARED_EDGE_COLOR, TRACE_NAMES, hit_rate_figure, pool_states, prefix_pool_figure, radix_tree,
                                       radix_vs_blocks_figure, refresh_prefix_pool_figure)
from paged_kv.viz.palette import COLORS, tint
from paged_kv.widgets.prefix_cache import SYSTEM_PROMPTS, prefix_cache_panel


@pytest.fixture(scope="module")
def run(small_model):
    e = LLMEngine(small_model, EngineConfig(block_size=4, num_gpu_blocks=8, watermark=0.0,
                                            enable_prefix_caching=True), record=True)
    shared = [3, 1, 4, 1, 5, 9, 2, 6]
    for tail in ([7, 7], [8, 8], [50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66], [9, 9]):
        e.add_request(shared + tail, SamplingParams(max_tokens=3))
        while e.has_unfinished_requests():
            e.step()
    return e


def test_pool_states_match_the_manager_at_the_end(run):
    m = run.scheduler.manager
    states = pool_states(run.records[-1])
    assert [b for b, s in enumerate(states) if s[0] == "cached-free"] == sorted(m.allocator.cached_free())
    assert all(s[0] != "used" for s in states)               # everything finished


def test_hits_and_evictions_are_recorded_where_they_happened(run):
    hits = [r.hits for r in run.records if r.hits]
    assert len(hits) == 3 and all(len(h) == 2 for h in hits)        # three requests hit the 8-token prefix
    evicted = [b for r in run.records for b in r.evicted]
    assert evicted == run.scheduler.manager.cache.evictions and evicted   # the long request evicted some


def test_figure_replays_every_step_and_refreshes_in_place(run):
    fig = prefix_pool_figure(run.records, "t")
    assert len(fig.frames) == len(run.records)
    assert [t.name for t in fig.data] == list(TRACE_NAMES)
    live = prefix_pool_figure(run.records[:2], "t", replay=False)
    refresh_prefix_pool_figure(live, run.records, "t")
    assert live.data[0].z == fig.frames[-1].data[0].z


def test_radix_tree_spells_every_prompt():
    prompts = ["You are kind. Hi", "You are kind. Bye", "You are terse. Hi"]
    edges = radix_tree(prompts)
    spelled = []
    for e, (start, depth, label, parent) in enumerate(edges):
        if not any(x[3] == e for x in edges):                # a leaf: walk up to the root
            text, k = "", e
            while k >= 0:
                text, k = edges[k][2] + text, edges[k][3]
            spelled.append(text)
    assert sorted(spelled) == sorted(prompts)
    assert edges[0][2] == "You are "                        # the shared run is stored once
    assert isinstance(radix_vs_blocks_figure(prompts, 4), go.Figure)
    assert len(hit_rate_figure([10, 100], {"a": [0.1, 0.5]}, "t").data) == 1


def test_panel_submits_and_steps(small_model):
    class Tok:
        def encode(self, s):
            return [ord(c) % 200 + 1 for c in s]

        def decode(self, ids, final=True):
            return "".join(chr(i) for i in ids)
    p = prefix_cache_panel(small_model, Tok(), use_figure_widget=False)
    add, step = p.children[1].children[1], p.children[1].children[2]
    add.click(), step.click(), add.click()
    for _ in range(20):
        step.click()
    # the second, the same text, arrives after one step of 32 tokens (the budget), and is admitted in
    # the step that schedules the rest of the first's prompt: blocks are registered when scheduled, so
    # it hits every full block but the one holding its last token (the full-hit rule)
    P = len(Tok().encode(SYSTEM_PROMPTS[0] + "what news?"))
    assert P > 32 and [o.cached_tokens for o in p.engine.outputs()] == [[0], [(P - 1) // 4 * 4]]
    assert f"R1</b> (hit {(P - 1) // 4 * 4} tokens)" in p.children[2].value      # in words, not a list


def test_radix_edges_are_grey_when_shared_and_in_their_prompt_colour_otherwise():
    prompts = ["ab-x", "ab-y", "cd"]
    fig = radix_vs_blocks_figure(prompts, 2)
    bottom = [sh for sh in fig.layout.shapes if sh.type == "rect" and sh.yref != "y"]
    labels = [e[2] for e in radix_tree(prompts)]
    assert labels == ["ab-", "x", "y", "cd"]
    # "ab-" runs under prompts 0 and 1; "x" only under 0, "y" only under 1, "cd" only under 2
    want = [SHARED_EDGE_COLOR, tint(COLORS[0], 0.55), tint(COLORS[1], 0.55), tint(COLORS[2], 0.55)]
    assert [sh.fillcolor for sh in bottom] == want


def test_figures_refuse_bad_input_by_name(run):
    with pytest.raises(ConfigError, match="block_size.*0"):
        radix_vs_blocks_figure(["ab"], 0)
    with pytest.raises(ConfigError, match="non-empty str"):
        radix_vs_blocks_figure([], 4)
    with pytest.raises(ConfigError, match="'a' has 1 values for 2"):
        hit_rate_figure([1, 2], {"a": [0.1]}, "t")
    with pytest.raises(ConfigError, match="at least one"):
        prefix_pool_figure([], "t")
    with pytest.raises(ConfigError, match="active.*99"):
        prefix_pool_figure(run.records, "t", active=99)


def test_hit_rates_sit_at_evenly_spaced_pool_sizes_each_labelled():
    """Pools of 49, 81 and 983 blocks: on a linear (or log) axis the two small ones were squeezed."""
    fig = hit_rate_figure([49, 81, 983], {"a": [0.5, 0.7, 0.9], "b": [0.6, 0.7, 0.7]}, "t")
    assert all(list(t.x) == [0, 1, 2] for t in fig.data)
    assert list(fig.layout.xaxis.tickvals) == [0, 1, 2] and list(fig.layout.xaxis.ticktext) == ["49", "81", "983"]
    assert "not to scale" in fig.layout.xaxis.title.text
    assert [list(t.customdata) for t in fig.data] == [["49", "81", "983"]] * 2    # the hover names the size
    back = hit_rate_figure([983, 81, 49], {"a": [0.9, 0.7, 0.5]}, "t")              # given largest first
    assert list(back.layout.xaxis.ticktext) == ["49", "81", "983"] and list(back.data[0].y) == [0.5, 0.7, 0.9]


def test_a_used_block_writes_its_id_over_its_holder_and_the_slider_names_the_last_step(run):
    records = run.records
    busy = next(i for i, r in enumerate(records) if any(s[0] == "used" for s in pool_states(r)))
    fig = prefix_pool_figure(records, active=busy)
    pool = next(t for t in fig.data if t.name == "pool")
    used = [x for row in pool.text for x in row if x.startswith("<b>")]
    assert used and all(re.fullmatch(r"<b>\d+</b><br>\S+( ×\d+)?", x) for x in used)
    assert fig.layout.sliders[0].currentvalue.suffix == f" / {records[-1].step}"


def test_the_pool_figure_keys_its_markers_and_the_empty_prefix_reads_none():
    """Every mark the pool draws is named under the caption, in the mark's own colour (the live
    panel's text points at the key), and the Jupyter dropdown labels the empty prefix "(none)" as
    the page's does."""
    from paged_kv.panels.base import EMPTY_OPTION
    from paged_kv.panels.prefix_cache import PrefixCachePanel
    from paged_kv.viz.prefix_cache import EVICT_COLOR, HIT_COLOR, MARKER_KEY

    panel = PrefixCachePanel()
    fig = panel.figure(panel.initial())
    title = fig.layout.title.text
    assert MARKER_KEY in title
    marks = {t.name: t.marker for t in fig.data if t.name in ("cached", "hits", "evicted")}
    assert marks["hits"].symbol == "star" and f"color:{HIT_COLOR}'>★" in title
    assert marks["evicted"].symbol == "x" and f"color:{EVICT_COLOR}'>✕" in title
    assert marks["cached"].symbol == "circle" and "● caches a prefix" in title
    assert all(word in title for word in ("grey: free", "sand: cached-free", "mid tint: reserved"))
    widget = prefix_cache_panel(load_model=False, use_figure_widget=False)
    options = dict(widget.children[0].children[0].options)
    assert options[EMPTY_OPTION] == "" and set(options.values()) == {*SYSTEM_PROMPTS, ""}
