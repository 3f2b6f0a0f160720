"""Chapter 9's figures: the rollback figure's slots against the step's numbers counted by hand,
the freed block marked, acceptance rows against a recount from the steps, the speed-up lines
against speedup() point by point, and every refusal."""

import functools
import random
from collections import Counter

import pytest

from paged_kv.errors import ConfigError, UnknownPresetError
from paged_kv.memory import max_batch_size
from paged_kv.memory.speculation import crossover_batch, speedup
from paged_kv.spec_decode import PHASES, NgramProposer
from paged_kv.spec_decode import replay_speculation as replay_default

# These cases draft at the first pass too (the no-cache loop's way), so that one pass shows every
# phase from an empty table; the default (no drafts with the prefill) is checked on its own.
replay_speculation = functools.partial(replay_default, draft_at_prefill=True)
from paged_kv.viz.spec_decode import (FREED_DASH, STATE_COLORS, acceptance_figure, acceptance_rows,
                                      rollback_figure, speedup_figure)

BLUE, YELLOW, GREEN, RED, GREY = (STATE_COLORS[s] for s in ("verified", "draft", "accepted", "rejected", "free"))


class Fixed:
    """Proposes the given drafts in turn (cut to the limit)."""

    def __init__(self, *drafts):
        self.drafts = list(drafts)

    def propose(self, tokens, limit):
        return list(self.drafts.pop(0))[:limit] if self.drafts else []


def golden():
    # tests/spec_decode/test_replay.py's golden trace: block size 4, a 6-token prompt, free queue
    # 3 1 0 2; step 0 drafts 20 99 98 across a block boundary, keeps 20, frees block 0 (to the tail);
    # step 1 drafts 22 23, both kept
    return replay_speculation([10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24], Fixed([20, 99, 98], [22, 23]),
                              block_size=4, num_blocks=4, free_order=[3, 1, 0, 2])


def panel(fig, phase):
    return next(t for t in fig.data if t.name == f"{phase} slots")


def colours(fig, phase):
    """The slot colours of a phase's panel, row by row, read through the trace's own colorscale
    (``None``: no cell)."""
    t = panel(fig, phase)
    scale = [c for _, c in t.colorscale]
    return [[None if z is None else scale[2 * z] for z in row] for row in t.z]


def yticks(fig, phase):
    axis = fig.layout["yaxis" if phase == PHASES[0] else f"yaxis{PHASES.index(phase) + 1}"]
    return list(axis.ticktext)


def test_the_golden_step_by_hand():
    fig = rollback_figure(golden())                        # default: step 0, whose rollback frees block 0
    assert "target pass 1:" in fig.layout.title.text
    assert colours(fig, "propose") == [[None] * 4] and yticks(fig, "propose") == []    # no blocks before step 0
    assert colours(fig, "verify") == [[BLUE] * 4, [BLUE, BLUE, YELLOW, YELLOW], [YELLOW, GREY, GREY, GREY]]
    assert colours(fig, "accept") == [[BLUE] * 4, [BLUE, BLUE, GREEN, RED], [RED, GREY, GREY, GREY]]
    assert colours(fig, "rollback") == [[BLUE] * 4, [BLUE, BLUE, GREEN, GREY], [GREY] * 4]
    assert yticks(fig, "verify") == ["block 3 new", "block 1 new", "block 0 new"]
    assert yticks(fig, "rollback") == ["block 3", "block 1", "block 0 freed"]
    (frame,) = [s for s in fig.layout.shapes if s.name and s.name.startswith("freed")]
    assert frame.name == "freed 0" and frame.line.dash == FREED_DASH and frame.yref == "y4"
    assert frame.y0 < 2 < frame.y1 and frame.y1 - frame.y0 < 1           # row 2 of the rollback panel only
    (note,) = [a for a in fig.layout.annotations if a.name == "freed label 0"]
    assert "freed → free queue tail" in note.text and (note.yref, note.y) == ("y4", 2)   # queue 2, 0
    assert "2, 0 (tail)" in fig.layout.title.text
    # the key names every colour once, and the dashed frame
    entries = [t for t in fig.data if t.type == "scatter" and t.x == (None,)]
    key = {t.marker.color: t.name for t in entries if t.mode == "markers"}
    assert set(key) == {BLUE, YELLOW, GREEN, RED, GREY} and len(set(key.values())) == 5
    assert [t.line.dash for t in entries if t.mode == "lines"] == [FREED_DASH]


def test_slot_text_is_each_positions_token():
    labels = {10: "R", 11: " ", 12: "\n", 13: "a", 14: "b", 15: "c", 20: "x", 21: "y", 99: "?", 98: "!"}
    fig = rollback_figure(golden(), token_text=labels.__getitem__)
    # positions 0-5 the prompt, 6-8 the drafts 20 99 98 (block 3, block 1, block 0 in that order)
    assert list(map(list, panel(fig, "verify").text)) == [["R", "␣", "⏎", "a"], ["b", "c", "x", "?"], ["!", "", "", ""]]
    assert list(map(list, panel(fig, "rollback").text)) == [["R", "␣", "⏎", "a"], ["b", "c", "x", ""], [""] * 4]
    assert '"x?!"' in fig.layout.annotations[0].text                  # the propose panel names its drafts
    assert 'the target\'s "y"' in fig.layout.annotations[2].text           # the accept panel, the target's token
    plain = rollback_figure(golden(), step=1)                          # ids without token_text
    assert list(panel(plain, "verify").text[2]) == ["22", "23", "", ""]   # fed 21 at 7 (block 1), drafts at 8, 9


def expected_counts(s, phase):
    """What a phase's panel holds, from the step's plain numbers: verified tokens, then the drafts,
    the rest of the blocks drawn free."""
    k, a = len(s.drafted), s.accepted
    fed = 0 if phase == "propose" else s.num_fed
    blocks = len(s.table_before if phase == "propose" else s.table_verify)
    c = Counter({BLUE: s.num_computed + fed})
    if phase == "verify":
        c[YELLOW] = k
    elif phase == "accept":
        c[GREEN], c[RED] = a, k - a
    elif phase == "rollback":
        c[GREEN] = a
    c[GREY] = blocks * s.block_size - sum(c.values())
    return +c


def random_traces(n):
    rng = random.Random(9)
    for _ in range(n):
        prompt = [rng.randrange(3) for _ in range(rng.randint(1, 8))]
        target = [rng.randrange(3) for _ in range(rng.randint(2, 16))]
        bs = rng.randint(1, 4)
        need = -(-(len(prompt) + len(target) - 1) // bs)
        yield replay_speculation(prompt, target, NgramProposer(rng.randint(1, 5), rng.randint(1, 2)), block_size=bs,
                                 num_blocks=need + 2, free_order=rng.sample(range(need + 2), need + 2))


def test_every_panel_counts_the_steps_slots_and_frames_its_freed_blocks():
    freed_seen = 0
    for trace in random_traces(12):
        for s in trace.steps:
            fig = rollback_figure(trace, step=s.index)
            for phase in PHASES:
                got = Counter(c for row in colours(fig, phase) for c in row if c is not None)
                assert got == expected_counts(s, phase), (s, phase)
                table = s.table_before if phase == "propose" else s.table_verify
                assert [int(t.split()[1]) for t in yticks(fig, phase)] == list(table)
            frames = {sh.name for sh in fig.layout.shapes if sh.name and sh.name.startswith("freed")}
            assert frames == {f"freed {b}" for b in set(s.table_verify) - set(s.table_after)}
            freed_seen += len(frames)
            for i, b in enumerate(s.table_verify):                 # a freed row is all free, and says so
                if b not in s.table_after:
                    assert colours(fig, "rollback")[i] == [GREY] * s.block_size
                    assert yticks(fig, "rollback")[i] == f"block {b} freed"
    assert freed_seen > 5                                          # the cases do free blocks


def test_the_default_step_is_the_first_whose_rollback_frees_a_block():
    # step 0 rejects a draft inside its first block (nothing freed); step 1's rejected drafts fill a
    # third block, which its rollback frees
    trace = replay_speculation([1, 2, 3], [4, 5, 6, 7, 8, 9, 9], Fixed([9], [5, 0, 0, 0, 0]), block_size=4,
                               num_blocks=4)
    assert not trace.steps[0].freed_blocks and trace.steps[1].freed_blocks
    assert "target pass 2:" in rollback_figure(trace).layout.title.text
    none_freed = replay_speculation([1, 2, 3], [4, 5], Fixed([4]), block_size=4, num_blocks=2)
    assert not any(s.freed_blocks for s in none_freed.steps)
    assert "target pass 1:" in rollback_figure(none_freed).layout.title.text


@pytest.mark.parametrize("step", [-1, 2, 1.0, True, "0"])
def test_a_bad_step_is_refused_by_name(step):
    with pytest.raises(ConfigError, match=rf"step must be an int in 0\.\.1 .*got {step!r}"):
        rollback_figure(golden(), step=step)


def test_other_refusals_of_the_rollback_figure():
    with pytest.raises(ConfigError, match="SpeculationTrace"):
        rollback_figure(golden().steps)
    with pytest.raises(ConfigError, match="token_text must be a callable"):
        rollback_figure(golden(), token_text="abc")
    with pytest.raises(ConfigError, match="a token label must be a str, got int"):
        rollback_figure(golden(), token_text=lambda t: t)


# --- acceptance -----------------------------------------------------------------------------------
TEXT = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 4, 1, 2, 6, 1, 2, 3, 4, 1]


def ngram_traces():
    return {k: replay_speculation(TEXT[:6], TEXT[6:], NgramProposer(k, 1, 3), block_size=4, num_blocks=8)
            for k in (4, 1, 2, 3)}


def test_acceptance_rows_equal_a_recount_from_the_steps():
    traces = ngram_traces()
    rows = acceptance_rows(traces, "ngram")
    assert [r["k"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        steps = traces[r["k"]].steps
        drafted = sum(len(s.drafted) for s in steps)
        accepted = sum(len(s.emitted) - 1 for s in steps)           # each pass adds its own token
        assert r["method"] == "ngram" and r["passes"] == len(steps)
        assert (r["drafted"], r["accepted"], r["rolled_back"]) == (drafted, accepted, drafted - accepted)
        assert r["acceptance_rate"] == pytest.approx(accepted / drafted)
        assert r["tokens_per_pass"] == pytest.approx(sum(len(s.emitted) for s in steps) / len(steps))
        assert r["blocks_freed"] == sum(len(s.table_verify) - len(s.table_after) for s in steps)
    assert rows[0]["passes"] > rows[-1]["passes"] and 0 < rows[-1]["acceptance_rate"] < 1    # not trivial


def test_acceptance_rows_refusals():
    trace = ngram_traces()[1]
    for bad, what in (({0: trace}, "k"), ({"2": trace}, "k"), ({2: trace.steps}, r"traces_by_k\[2\]")):
        with pytest.raises(ConfigError, match=what):
            acceptance_rows(bad, "ngram")
    with pytest.raises(ConfigError, match="method"):
        acceptance_rows({1: trace}, "")


def test_acceptance_figure_draws_the_rows():
    rows = acceptance_rows(ngram_traces(), "ngram")
    never = replay_speculation([1, 2], [3, 4], NgramProposer(2, 2), block_size=4, num_blocks=2)   # drafts nothing
    rows += acceptance_rows({2: never}, "none")
    fig = acceptance_figure(rows)
    rate = [t for t in fig.data if t.name == "ngram" and t.yaxis == "y"][0]
    per_pass = [t for t in fig.data if t.name == "ngram" and t.yaxis == "y2"][0]
    assert list(rate.x) == [1, 2, 3, 4] and list(rate.y) == [r["acceptance_rate"] for r in rows[:4]]
    assert list(per_pass.y) == [r["tokens_per_pass"] for r in rows[:4]]
    gap = [t for t in fig.data if t.name == "none" and t.yaxis == "y"][0]
    assert list(gap.y) == [None]                                    # nothing drafted: no rate, a gap
    ceiling = [t for t in fig.data if t.name.startswith("k + 1")][0]
    assert list(ceiling.y) == [2, 3, 4, 5] and ceiling.line.dash == "dot"
    assert rate.line.color != gap.line.color
    with pytest.raises(ConfigError, match="at least one row"):
        acceptance_figure([])
    with pytest.raises(ConfigError, match=r"rows\[1\] has no 'tokens_per_pass'"):
        acceptance_figure([rows[0], {"method": "x", "k": 1, "acceptance_rate": 0.5}])


# --- the speed-up ---------------------------------------------------------------------------------
def test_speedup_lines_are_speedup_at_each_point_and_mark_the_crossover():
    kw = dict(context_len=128)
    fig = speedup_figure("Llama-3-8B", "H100", ks=[2, 8], alpha=0.7, batches=[1, 4, 16, 64, 256, 300], **kw)
    for k in (2, 8):
        line = next(t for t in fig.data if t.name == f"k = {k}")
        assert list(line.x) == [1, 4, 16, 64, 256, 300]
        assert list(line.y) == [speedup(0.7, k, b, "Llama-3-8B", "H100", **kw) for b in line.x]
        (mark,) = [t for t in fig.data if t.name.startswith(f"k = {k}:")]
        b = mark.x[0]
        # the first batch up to the largest drawn where it stops paying, by brute force
        first = next(n for n in range(1, 301) if speedup(0.7, k, n, "Llama-3-8B", "H100", **kw) <= 1)
        assert b == first and mark.y[0] <= 1 and f"B = {first}" in mark.name and mark.marker.symbol == "x"
    even = next(t for t in fig.data if t.name == "1× (no gain)")
    assert list(even.y) == [1, 1] and list(even.x) == [1, 300] and even.line.dash == "dash"


def test_speedup_default_batches_and_no_crossover():
    fig = speedup_figure("Llama-3-8B", "H100", ks=[4], alpha=0.7)          # 1024-token contexts: pays at every B
    top = max_batch_size("Llama-3-8B", "H100", 1024 + 1 + 4)
    xs = list(next(t for t in fig.data if t.name == "k = 4").x)
    assert xs == sorted({2 ** e for e in range(20) if 2 ** e <= top} | {top}) and top > 64
    assert crossover_batch(0.7, 4, "Llama-3-8B", "H100", context_len=1024, max_batch=top) is None
    assert not [t for t in fig.data if t.name.startswith("k = 4:")]


@pytest.mark.parametrize("kw, what", [
    (dict(ks=[]), "at least one k"), (dict(ks=[0]), "k"), (dict(ks=[2.0]), "k"),
    (dict(ks=[2], batches=[]), "at least one batch"), (dict(ks=[2], batches=[0]), "batch size"),
    (dict(ks=[2], alpha=1.5), "alpha"), (dict(ks=[2], context_len=-1), "context_len")])
def test_speedup_figure_refusals(kw, what):
    args = dict(alpha=0.7) | kw
    with pytest.raises(ConfigError, match=what):
        speedup_figure("Llama-3-8B", "H100", **args)


def test_speedup_figure_unknown_preset():
    with pytest.raises(UnknownPresetError):
        speedup_figure("Llama-3-8B", "H9000", ks=[2], alpha=0.7, batches=[1])


def test_the_left_margin_fits_the_longest_block_label():
    """A two-digit freed block ("block 17 freed", 14 characters) must fit left of the slots: at
    least 6 px a character of plotly's 12 px tick font (a label of 14 was cut at a fixed 90 px)."""
    prompt, target = list(range(5)) * 8, list(range(5)) * 4 + [9, 9, 9, 9]
    trace = replay_speculation(prompt, target, NgramProposer(4, 2), block_size=2, num_blocks=40)
    s = next(s for s in trace.steps if s.freed_blocks and max(s.freed_blocks) >= 10)
    fig = rollback_figure(trace, step=s.index)
    longest = max(len(t) for phase in PHASES for t in yticks(fig, phase))
    assert longest >= len("block 10 freed") and fig.layout.margin.l >= 6 * longest + 10
