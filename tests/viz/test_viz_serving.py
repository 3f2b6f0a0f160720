"""Chapter 7's figures and live panel: queues and pools replayed step by step, driven by clicks."""

import html
import re

import plotly.graph_objects as go
import pytest

from paged_kv.engine import EngineConfig, LLMEngine
from paged_kv.model import ByteTokenizer, SamplingParams
from paged_kv.viz.serving import (CPU_PER_ROW, LANES, latency_figure, refresh_serving_figure, serving_figure,
                                  swap_figure)
from paged_kv.widgets.prefix_cache import prefix_cache_panel
from paged_kv.widgets.serving import serving_panel


@pytest.fixture(scope="module")
def run(small_model):
    e = LLMEngine(small_model, EngineConfig(block_size=4, num_gpu_blocks=8, num_cpu_blocks=8, watermark=0.0,
                                            max_num_batched_tokens=6, preemption_mode="swap"), record=True)
    e.add_request([5, 6, 7, 8, 9, 10, 11], SamplingParams(max_tokens=10), "A")
    e.add_request([1, 2, 3], SamplingParams(max_tokens=12, n=2, temperature=1.0, seed=0), "B")
    while e.has_unfinished_requests():
        e.step()
    return e


def test_records_follow_the_run(run):
    recs = run.records
    assert recs[0].step == 0 and recs[-1].step == run.stats.steps == len(recs) - 1
    swapped = [r for r in recs if r.swapped]
    assert swapped and all(any(c is not None for c in r.cpu) for r in swapped)
    assert any("B.1" in r.pool.tables for r in recs)                       # samples are named
    assert not recs[-1].running and recs[-1].pool.used_blocks == 0


def test_figure_replays_every_step_with_its_queues(run):
    fig = serving_figure(run.records, "t")
    assert len(fig.frames) == len(run.records)
    for frame, rec in zip(fig.frames, run.records):
        lanes = frame.data[0]
        assert sorted(lanes.y) == sorted(lane for lane, rows in zip(LANES, (rec.waiting, rec.running, rec.swapped))
                                         for _ in rows[:7])
        assert f"step {rec.step} " in frame.layout.title.text
    assert {t.name for t in fig.data} == {"queues", "pool", "block labels", "cpu pool"}


def test_refresh_redraws_in_place(run):
    fig = go.Figure(serving_figure(run.records[:2], replay=False))
    refresh_serving_figure(fig, run.records[:6])
    assert "step 5 " in fig.layout.title.text
    assert list(fig.data[0].y) == [lane for lane, rows in zip(LANES, (run.records[5].waiting, run.records[5].running,
                                                                      run.records[5].swapped)) for _ in rows]


def test_curve_figures():
    fig = latency_figure({"a": ([1, 2], [0.1, 0.2]), "b": ([1], [0.3])}, "t", threshold=0.1)
    assert [t.name for t in fig.data] == ["a", "b"]
    assert fig.layout.yaxis.title.text == "normalized latency (s/token)" and fig.layout.annotations[0].text == "0.1 s/token"
    fig = latency_figure({"a": ([1, 2], [1.0, 0.5])}, "t", threshold=0.9, yaxis="share", threshold_text="90% goal")
    assert fig.layout.yaxis.title.text == "share" and fig.layout.annotations[0].text == "90% goal"
    fig = swap_figure([1, 4, 16], {"swap": [3, 2, 1]}, "t", "ms")
    assert fig.layout.xaxis.type == "log" and list(fig.data[0].x) == [1, 4, 16]
    assert fig.layout.yaxis.type != "log" and swap_figure([1, 4], {"s": [850, 2]}, "t", "ms", log_y=True).layout.yaxis.type == "log"


def test_a_log_swap_axis_labels_every_tick_and_reaches_past_the_data():
    """Fig. 19a: plotly's own log ticks left bare digits (2, 3, ... 9) between 100 and 1,000."""
    fig = swap_figure([1, 4], {"s": [851.0, 33.9], "r": [86.0, 86.0]}, "t", "ms", log_y=True)
    ya = fig.layout.yaxis
    assert list(ya.tickvals) == [20, 50, 100, 200, 500, 1000] and list(ya.ticktext) == ["20", "50", "100", "200", "500", "1,000"]
    assert 10 ** ya.range[0] <= 33.9 and 10 ** ya.range[1] >= 851.0


def test_the_cpu_pool_wraps_into_rows_and_every_block_keeps_its_cell(run):
    rec = next(r for r in run.records if any(c is not None for c in r.cpu))
    trace = next(t for t in serving_figure(run.records, replay=False, active=run.records.index(rec)).data
                 if t.name == "cpu pool")
    n = len(rec.cpu)
    assert len(trace.z) == -(-n // CPU_PER_ROW) and all(len(row) == CPU_PER_ROW for row in trace.z)
    for b in range(n):                                   # block b at row b // 5, column b % 5, labelled with its id
        x, y = b % CPU_PER_ROW, b // CPU_PER_ROW
        assert re.match(rf"(<b>)?{b}\b", trace.text[y][x]), (b, trace.text[y][x])
    cells = [c for row in trace.z for c in row]
    assert cells.count(None) == len(cells) - n          # only the cells past the last block are empty
    assert trace.textfont.size >= 10                     # readable (plotly's own fit gave about 6 px)


def test_titles_are_broken_to_fit_a_phone():
    long = "Preemption cost of 512 tokens, OPT-13B on an A100 (timing model)"
    for fig in (swap_figure([1, 4], {"s": [3, 2]}, long, "ms"), latency_figure({"a": ([1], [0.1])}, long)):
        assert fig.layout.title.text.replace("<br>", " ") == long and "<br>" in fig.layout.title.text
        assert fig.layout.margin.t >= 70 + 18                              # room for the second line


def test_panel_submit_step_preempt_and_refuse(small_model):
    panel = serving_panel(small_model, None, EngineConfig(block_size=4, num_gpu_blocks=6, num_cpu_blocks=6,
                                                          watermark=0.0), use_figure_widget=False)
    engine = panel.engine
    (prompt, max_tokens, n, submit), (step, run_all, which, preempt, abort), mode, status, _ = (
        list(panel.children[0].children), list(panel.children[1].children), *panel.children[2:])
    engine.tokenizer = None
    prompt.value = "\x05\x06\x07"                       # bytes 5, 6, 7: the small model's vocabulary
    engine.tokenizer = ByteTokenizer()                 # 256 byte tokens, as the small model
    max_tokens.value = 5
    submit.click()
    assert "waiting" in status.value and len(engine.scheduler.waiting) == 1
    step.click()
    assert which.options == ("A",)
    mode.value = "recompute"
    preempt.click()
    assert "preempted by recompute" in status.value and engine.scheduler.waiting[0].request_id == "A"
    prompt.value = "\x01" * 30                          # 30 + 5 - 1 tokens: 9 blocks of 4 > 6
    submit.click()
    assert "never run" in status.value and len(engine.scheduler.waiting) == 1
    run_all.click()
    assert not engine.has_unfinished_requests() and len(engine.output("A").token_ids[0]) == 5
    assert engine.records[-1].pool.used_blocks == 0


def test_panel_aborts_the_selected_request_in_any_state(small_model):
    """The abort button ends the chosen request, waiting or running, frees its blocks at once (the
    figure's last record shows them free) and leaves the others running."""
    panel = serving_panel(small_model, ByteTokenizer(), EngineConfig(block_size=4, num_gpu_blocks=16,
                                                                      watermark=0.0), use_figure_widget=False)
    engine = panel.engine
    (prompt, max_tokens, n, submit), (step, run_all, which, preempt, abort), mode, status, _ = (
        list(panel.children[0].children), list(panel.children[1].children), *panel.children[2:])
    prompt.value, max_tokens.value = "\x05\x06\x07\x08\x09", 20
    submit.click()
    submit.click()
    assert which.options == ("A", "B")                 # waiting requests can be chosen too
    which.value = "B"
    abort.click()
    assert "B aborted" in status.value and engine.output("B").finish_reason == ["abort"]
    step.click()
    step.click()
    which.value = "A"
    abort.click()
    assert engine.output("A").finish_reason == ["abort"] and not engine.has_unfinished_requests()
    assert engine.records[-1].pool.used_blocks == 0 and engine.scheduler.manager.num_free_blocks == 16
    abort.click()
    assert "no request to abort" in status.value


def test_panel_streams_text_without_a_broken_last_character(small_model):
    """The status line printed a running sample's text with U+FFFD where a step had stopped in the
    middle of a multi-byte character.  Two samples drawn with temperature from the random model's
    256 byte tokens, stepped by clicks: after every step each running sample shows the incremental
    decode (the cut character held back), and the sweep does cut one."""
    tok = ByteTokenizer()
    panel = serving_panel(small_model, tok, use_figure_widget=False)
    (prompt, max_tokens, n, submit), (step, *_), status = (
        list(panel.children[0].children), list(panel.children[1].children), panel.children[3])
    max_tokens.value, n.value = 16, 2
    submit.click()
    held_back = 0
    while panel.engine.has_unfinished_requests():
        step.click()
        for o in panel.engine.outputs():
            for ids in o.token_ids:
                want = tok.decode(ids, final=o.finished)
                assert f": {html.escape(repr(want), quote=False)}" in status.value
                held_back += want != tok.decode(ids)
    assert held_back > 0


class _Markup:
    """A tokenizer whose every token decodes to markup, as sampled bytes may spell '<b>'."""

    def encode(self, text):
        return list(text.encode())

    def decode(self, ids, final=True):
        return "<i>x</i>" * len(ids)


def test_panels_show_generated_text_escaped(small_model):
    serving = serving_panel(small_model, _Markup(), use_figure_widget=False)
    prefix = prefix_cache_panel(small_model, _Markup(), use_figure_widget=False)
    for submit, run_all, status in ((serving.children[0].children[3], serving.children[1].children[1],
                                     serving.children[3]),
                                    (prefix.children[1].children[1], prefix.children[1].children[3],
                                     prefix.children[2])):
        submit.click()
        run_all.click()
        assert "&lt;i&gt;x&lt;/i&gt;" in status.value and "<i>" not in status.value


def test_show_live_in_the_static_book_names_where_the_replay_is(monkeypatch):
    """The static book never builds the panel; its note says where the recorded run is shown."""
    from unittest import mock

    from paged_kv.viz import BOOK_ENV
    from paged_kv.widgets import panel as panel_mod

    monkeypatch.setenv(BOOK_ENV, "1")
    built = []
    with mock.patch.object(panel_mod, "display") as shown:
        assert panel_mod.show_live(lambda: built.append(1), "The engine panel",
                                   replay="the figure at the top replays it") is False
    assert built == []
    note = shown.call_args.args[0].data
    assert note.startswith("*The engine panel is live") and "the figure at the top replays it." in note
    monkeypatch.setenv(BOOK_ENV, "0")
    with mock.patch.object(panel_mod, "display") as shown:
        assert panel_mod.show_live(lambda: "widget", "The engine panel") is True
    assert shown.call_args.args[0] == "widget"


def test_cpu_pool_shows_every_holder_and_the_ref_count(small_model):
    """A group's shared prompt blocks are swapped once and held by every sample: each record's CPU
    holders agree with the CPU allocator's ref counts at that step, and the figure labels a shared
    block with its ref count and both samples (it named only the last sample before)."""
    e = LLMEngine(small_model, EngineConfig(block_size=4, num_gpu_blocks=10, num_cpu_blocks=10, watermark=0.0,
                                            max_num_batched_tokens=8, preemption_mode="swap"), record=True)
    e.add_request(list(range(5, 18)), SamplingParams(max_tokens=12), "A")
    e.add_request(list(range(20, 28)), SamplingParams(max_tokens=14, n=2, temperature=0.8, seed=1), "B")
    e.step()
    e.step()
    e.add_request([3, 4], SamplingParams(max_tokens=3), "C")
    shared_seen = False
    while e.has_unfinished_requests():
        e.step()
        rec, cpu = e.records[-1], e.scheduler.manager.cpu_allocator
        assert [len(h) for h in rec.cpu_holders] == [cpu.ref_count(b) for b in range(cpu.num_blocks)]
        assert all(name == (h[0][0] if h else None) for name, h in zip(rec.cpu, rec.cpu_holders))
        if any(len(h) == 2 for h in rec.cpu_holders):
            shared_seen = True
            trace = next(t for t in serving_figure(e.records, replay=False).data if t.name == "cpu pool")
            b = next(i for i, h in enumerate(rec.cpu_holders) if len(h) == 2)
            x, y = b % CPU_PER_ROW, b // CPU_PER_ROW
            assert trace.text[y][x] == f"<b>{b}</b> ×2<br>B, B.1"
            assert "ref count 2" in trace.customdata[y][x] and "B (logical" in trace.customdata[y][x] \
                and "B.1 (logical" in trace.customdata[y][x]
    assert shared_seen
