"""Chapter 9's panel model (paged_kv.panels.spec_decode): replays of the recorded continuations, the
passes walked, refusals that change nothing, and the ipywidgets front driving the same model."""

import re

import pytest

from paged_kv.errors import ConfigError
from paged_kv.panels import step
from paged_kv.panels.continuations import OFFERED_PROMPTS, load_recordings
from paged_kv.panels.spec_decode import MAX_K, SpecDecodePanel, pass_in_words


@pytest.fixture(scope="module")
def panel():
    return SpecDecodePanel()


def test_a_replay_is_lossless_and_its_totals_recount(panel):
    """Greedy speculation emits exactly the recorded continuation; the status's totals equal a
    recount from the passes."""
    recorded = load_recordings()
    for prompt in OFFERED_PROMPTS[:4]:
        s = panel.apply(panel.initial(), {"op": "run", "prompt": prompt, "k": 5, "ngram": 1, "max_tokens": 60})
        t = s.trace
        assert list(t.output_ids) == list(recorded[prompt].encode()[:60])
        drafted = sum(len(p.drafted) for p in t.steps)
        accepted = sum(p.accepted for p in t.steps)
        assert sum(p.accepted + 1 for p in t.steps) == 60 == len(t.steps) + accepted
        line = step(panel, s, None).status.splitlines()[1]
        assert f"60 tokens in {len(t.steps)} target passes" in line
        assert f"{drafted} drafted, {accepted} accepted" in line and f"{drafted - accepted} slots rolled back" in line
        assert s.trace.steps[s.step].freed_blocks or not any(p.freed_blocks for p in t.steps)


def test_walking_the_passes(panel):
    s = panel.initial()
    freeing = [p.index for p in s.trace.steps if p.freed_blocks]
    assert s.step == freeing[0] and len(freeing) >= 2
    seen = []
    for _ in freeing:
        s = panel.apply(s, {"op": "rollback"})
        seen.append(s.step)
    assert seen == freeing[1:] + freeing[:1]                # in order, then round to the first
    at = panel.apply(s, {"op": "next"})
    assert at.step == s.step + 1 and s.step == freeing[0]   # the state given is left as it was
    assert panel.apply(at, {"op": "prev"}).step == s.step


@pytest.mark.parametrize("action, match", [
    ({"op": "run", "prompt": "not offered"}, "no recorded continuation"),
    ({"op": "run", "k": 0}, r"drafts \(k\)"),
    ({"op": "run", "k": MAX_K + 1}, f"at most {MAX_K}"),
    ({"op": "run", "ngram": 5}, r"n-gram length \(ngram\) must be at most 4"),
    ({"op": "run", "max_tokens": 121}, r"new tokens \(max_tokens\) must be at most 120"),
    ({"op": "jump"}, "unknown op 'jump'"),
])
def test_refusals_name_the_value_and_change_nothing(panel, action, match):
    s = panel.initial()
    result = step(panel, s, action)
    assert result.state is s
    assert re.search(match, result.note), result.note


def test_the_ends_and_a_replay_that_frees_nothing(panel):
    s = panel.apply(panel.initial(), {"op": "run", "prompt": OFFERED_PROMPTS[0], "k": 1, "ngram": 4, "max_tokens": 3})
    first = panel.apply(s, {"op": "next"}) if s.step else s
    while first.step:
        first = panel.apply(first, {"op": "prev"})
    assert "there is no pass 0" in step(panel, first, {"op": "prev"}).note
    last = panel.apply(first, {"op": "run", "prompt": OFFERED_PROMPTS[0], "k": 1, "ngram": 4, "max_tokens": 1})
    assert len(last.trace.steps) == 1 and "there is no pass 2" in step(panel, last, {"op": "next"}).note
    assert "frees a block" in step(panel, last, {"op": "rollback"}).note
    with pytest.raises(ConfigError, match="must hold"):
        SpecDecodePanel(block_size=4, num_blocks=10)


def test_pass_in_words_reads_the_step(panel):
    s = panel.initial()
    p = s.trace.steps[s.step]
    words = pass_in_words(s)
    assert f"pass {p.index + 1}: {len(p.drafted)} drafts" in words and f"{p.accepted} accepted" in words
    assert ", ".join(map(str, p.freed_blocks)) + " freed" in words


def test_the_widget_drives_the_same_model():
    from paged_kv.widgets.spec_decode import spec_decode_panel

    w = spec_decode_panel(use_figure_widget=False)
    model, start = w.panel_model, w.current()
    buttons = {b.description: b for b in w.children[2].children}
    buttons["pass ▶"].click()
    assert w.current().step == start.step + 1
    for _ in range(start.step + 2):
        buttons["◀ pass"].click()
    assert w.current().step == 0 and "there is no pass 0" in w.children[3].value
    w.children[1].children[0].value = 6
    buttons["replay"].click()
    assert w.current().k == 6
    assert w.current().trace == model.apply(model.initial(), {"op": "run", "k": 6}).trace
