"""Chapter 8's panel model (paged_kv.panels.prefix_cache): pure steps, prefix hits counted, cached-free
blocks evicted least recently used first, refusals as notes, the browser configuration."""

import pytest

from paged_kv.engine import EngineConfig
from paged_kv.errors import ConfigError
from paged_kv.model import ByteTokenizer
from paged_kv.panels import figure_json, step
from paged_kv.panels.continuations import OFFERED_PROMPTS, load_recordings
from paged_kv.panels.prefix_cache import DEFAULT_TEXT, SYSTEM_PROMPTS, PrefixCachePanel, hits_in_words
from paged_kv.viz.prefix_cache import pool_states
from paged_kv.widgets import prefix_cache as widget_mod


def run(model, actions, state=None):
    s = step(model, model.initial() if state is None else state, None)
    for a in actions:
        s = step(model, s.state, a)
        assert s.note == "", (a, s.note)
    return s


def snapshot(model, state):
    e = state.engine
    return (figure_json(model.figure(state)), model.status(state), e.stats.steps, e.stats.prefix_hits,
            [list(o.cached_tokens) for o in e.outputs()], sorted(e.scheduler.manager.allocator.cached_free()),
            len(e.records))


@pytest.fixture(scope="module")
def panel():
    return PrefixCachePanel()


def submit(prefix, text, max_tokens=8):
    return {"op": "submit", "prefix": prefix, "text": text, "max_tokens": max_tokens}


def test_apply_never_changes_the_state_it_was_given(panel):
    state = panel.initial()
    for action in PrefixCachePanel.demo_actions:
        before = snapshot(panel, state)
        new = panel.apply(state, action)
        assert snapshot(panel, state) == before, action
        state = new


def test_the_demo_runs_without_a_note_hits_and_evicts(panel):
    assert 4 <= len(PrefixCachePanel.demo_actions) <= 8
    assert {a["op"] for a in PrefixCachePanel.demo_actions} == set(PrefixCachePanel.OPS)
    s = run(panel, PrefixCachePanel.demo_actions)
    e = s.state.engine
    assert e.stats.prefix_hits > 0 and any(r.evicted for r in e.records)
    for a in PrefixCachePanel.demo_actions:                 # every prompt the demo sends is recorded
        if a["op"] == "submit":
            assert a["prefix"] + a["text"] in OFFERED_PROMPTS


def test_a_shared_prefix_hits_its_full_blocks_and_the_hit_rate_counts_them(panel):
    p0, p1 = SYSTEM_PROMPTS[0] + "what news?", SYSTEM_PROMPTS[0] + "how now?"
    s = run(panel, [submit(SYSTEM_PROMPTS[0], "what news?"), {"op": "run"}, submit(SYSTEM_PROMPTS[0], "how now?"),
                    {"op": "run"}])
    e = s.state.engine
    bs = panel.config.block_size
    common = next(i for i, (a, b) in enumerate(zip(p0.encode(), p1.encode())) if a != b)
    assert [o.cached_tokens for o in e.outputs()] == [[0], [common // bs * bs]]
    assert e.stats.prefix_hits == common // bs * bs
    assert e.stats.prefix_queries == len(p0.encode()) + len(p1.encode())
    assert f"hit rate {common // bs * bs}/{len(p0.encode()) + len(p1.encode())} prompt tokens" in s.status
    assert f"R1 (hit {common // bs * bs} tokens)" in s.status and hits_in_words([]) == "waiting"


def test_evictions_take_the_least_recently_used_cached_free_blocks_first():
    """A pool of 16 blocks: R0 and R1 (one prefix) finish and leave cached-free blocks; R2 (the other
    prefix, long) needs room.  Every block evicted was, when evicted, the cached-free block last used
    longest ago (the step it was last held, read from the records), ties aside."""
    panel = PrefixCachePanel(num_gpu_blocks=16)
    s = run(panel, [submit(SYSTEM_PROMPTS[0], "what news?"), {"op": "run"}, submit(SYSTEM_PROMPTS[0], "how now?"),
                    {"op": "run"}, submit(SYSTEM_PROMPTS[1], "what news?"), {"op": "run"}])
    recs = s.state.engine.records
    last_used = {}
    evicted = []
    for prev, rec in zip(recs, recs[1:]):
        free_before = [b for b, st in enumerate(pool_states(prev)) if st[0] == "cached-free"]
        for b in rec.evicted:
            assert b in free_before
            still = [c for c in free_before if c not in evicted and c != b]
            assert all(last_used.get(b, -1) <= last_used.get(c, -1) for c in still), (rec.step, b)
            evicted.append(b)
        for b, st in enumerate(pool_states(rec)):
            if st[0] == "used":
                last_used[b] = rec.step
    assert evicted and evicted == s.state.engine.scheduler.manager.cache.evictions


@pytest.mark.parametrize("action, says", [
    (submit("", "x" * 120, 8), "never run"),
    (submit("", "", 8), "empty prompt"),
    (submit(SYSTEM_PROMPTS[0], "hi", 65), "new tokens (max_tokens) must be at most 64"),
    ({"op": "submit", "prefix": 3, "text": "hi"}, "'prefix' must be text"),
    ({"op": "preempt", "request": "R0"}, "unknown op 'preempt'"),
])
def test_a_refusal_is_the_steps_note_and_changes_nothing(panel, action, says):
    s = run(panel, [submit(SYSTEM_PROMPTS[0], DEFAULT_TEXT)])
    before = snapshot(panel, s.state)
    got = step(panel, s.state, action)
    assert says in got.note and got.state is s.state and snapshot(panel, s.state) == before


def test_the_browser_configuration_replays_the_recorded_tokens(panel):
    prompt = SYSTEM_PROMPTS[1] + "how now?"
    s = run(panel, [submit(SYSTEM_PROMPTS[1], "how now?", 10), {"op": "run"}])
    o = s.state.engine.output("R0")
    assert bytes(o.token_ids[0]) == load_recordings()[prompt].encode()[:10]
    assert "timing model" in s.status and "Llama-2-13B" in s.status and s.state.engine.clock > 0
    s = run(panel, [submit("", "typed by a reader", 3), {"op": "run"}], s.state)
    assert "R1 (hit 0 tokens) (stand-in tokens" in s.status


def test_a_config_must_cache_prefixes_and_the_widget_reexports_the_prompts():
    with pytest.raises(ConfigError, match="enable_prefix_caching"):
        PrefixCachePanel(config=EngineConfig(num_gpu_blocks=8))
    with pytest.raises(ConfigError, match="not both"):
        PrefixCachePanel(num_gpu_blocks=8, config=EngineConfig(num_gpu_blocks=8, enable_prefix_caching=True))
    assert widget_mod.SYSTEM_PROMPTS is SYSTEM_PROMPTS
    c = PrefixCachePanel(block_size=8, num_gpu_blocks=12).initial().engine.scheduler.config
    assert (c.block_size, c.num_gpu_blocks, c.enable_prefix_caching) == (8, 12, True)


def test_the_tiny_model_side(small_model):
    panel = PrefixCachePanel(model=small_model, tokenizer=ByteTokenizer())
    s = run(panel, [submit("", "\x05\x06\x07\x08\x09", 3), {"op": "run"}])
    before = snapshot(panel, s.state)
    s2 = run(panel, [submit("", "\x05\x06\x07\x08\x09", 3), {"op": "run"}], s.state)
    assert snapshot(panel, s.state) == before
    assert [o.cached_tokens for o in s2.state.engine.outputs()] == [[0], [4]]
    assert "tiny model" in s2.status and "stand-in" not in s2.status
