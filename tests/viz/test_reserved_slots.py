"""Chapters 7 and 8's pools tell a slot holding K/V from one only reserved for a token the engine
has not run yet (a prompt's later chunks under chunked prefill): the record carries each
sequence's computed count, the figures draw the reserved slots (blocks) in a mid tint and count them."""

from paged_kv.panels import step
from paged_kv.panels.prefix_cache import SYSTEM_PROMPTS, PrefixCachePanel
from paged_kv.panels.serving import DEFAULT_PROMPT, ServingPanel
from paged_kv.viz.blocks import RESERVED_TINT, block_cells
from paged_kv.viz.palette import seq_color, tint
from paged_kv.viz.prefix_cache import PER_ROW
from paged_kv.viz.serving import reserved_slots


def color_at(trace, z):
    """The colour a discrete-scale heatmap draws the value ``z`` in."""
    return trace.colorscale[2 * round(z - trace.zmin - 0.5)][1]


def after(panel, actions):
    s = panel.initial()
    for a in actions:
        got = step(panel, s, a)
        assert got.note == "", (a, got.note)
        s = got.state
    return s


def test_the_record_carries_each_sequences_computed_tokens_as_the_scheduler_counts_them():
    panel = ServingPanel()                                  # budget 8 tokens per step
    s = after(panel, [{"op": "submit", "prompt": DEFAULT_PROMPT, "max_tokens": 4, "n": 1}, {"op": "step"}])
    sch = s.engine.scheduler
    (seq,) = sch.requests["A"].seqs
    rec = s.engine.records[-1]
    assert rec.computed_tokens() == {"A": seq.num_computed} == {"A": panel.config.max_num_batched_tokens}
    assert sch.manager.num_tokens(seq.seq_id) == len(DEFAULT_PROMPT.encode())     # the whole prompt is held


def test_the_serving_pool_draws_the_prompts_later_chunks_reserved():
    panel = ServingPanel()
    bs, budget, prompt = panel.config.block_size, panel.config.max_num_batched_tokens, len(DEFAULT_PROMPT.encode())
    s = after(panel, [{"op": "submit", "prompt": DEFAULT_PROMPT, "max_tokens": 4, "n": 1}, {"op": "step"}])
    rec = s.engine.records[-1]
    assert reserved_slots(rec) == prompt - budget
    fig = panel.figure(s)
    pool = next(t for t in fig.data if t.name == "pool")
    table = dict((lg, b) for lg, b, _ in rec.pool.tables["A"])
    full, reserved = seq_color(0), tint(seq_color(0), RESERVED_TINT)
    for pos in range(prompt):
        x0, _, row = block_cells(table[pos // bs], rec.pool.num_blocks, bs)
        cell = color_at(pool, pool.z[row][int(x0) + pos % bs])
        assert cell == (full if pos < budget else reserved), pos
        hover = pool.customdata[row][int(x0) + pos % bs]
        assert ("reserved" in hover) == (pos >= budget)
    assert f"{prompt - budget} slots reserved" in fig.layout.title.text and "mid: reserved" in fig.layout.title.text
    done = after(panel, [{"op": "submit", "prompt": DEFAULT_PROMPT, "max_tokens": 4, "n": 1}] + [{"op": "step"}] * 3)
    assert reserved_slots(done.engine.records[-1]) == 0 and "0 slots reserved" in panel.figure(done).layout.title.text


def test_the_prefix_cache_pool_draws_a_block_with_tokens_not_run_yet_reserved():
    panel = PrefixCachePanel()                              # budget 32 tokens, blocks of 4
    bs, budget = panel.config.block_size, panel.config.max_num_batched_tokens
    text = "what news?"
    prompt = len((SYSTEM_PROMPTS[0] + text).encode())
    assert prompt > budget
    s = after(panel, [{"op": "submit", "prefix": SYSTEM_PROMPTS[0], "text": text, "max_tokens": 4}, {"op": "step"}])
    rec = s.engine.records[-1]
    fig = panel.figure(s)
    pool = next(t for t in fig.data if t.name == "pool")
    want = {b: lg * bs + bs > budget for lg, b, _ in rec.pool.tables["R0"]}     # a block past the budget's end
    assert sum(want.values()) == -(-prompt // bs) - budget // bs
    for b, reserved in want.items():
        cell = color_at(pool, pool.z[b // PER_ROW][b % PER_ROW])
        assert cell == (tint(seq_color(0), RESERVED_TINT) if reserved else seq_color(0)), b
    assert f"({sum(want.values())} reserved" in fig.layout.title.text
