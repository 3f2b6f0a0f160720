"""Chapter 3's calculator panel model: its state is the inputs, its figure and numbers are the
package's plan of them, and the ipywidgets calculator shows what it decides."""

import json

import pytest

from paged_kv import memory
from paged_kv.errors import ConfigError, UnknownPresetError
from paged_kv.panels import figure_json, step
from paged_kv.panels.calculator import CUSTOM_FIELDS, CalculatorPanel
from paged_kv.units import GiB


def _run(model, actions):
    state, steps = model.initial(), []
    for a in actions:
        s = step(model, state, a)
        steps.append(s)
        state = s.state
    return steps


def test_the_figure_draws_the_plan_of_the_inputs():
    panel = CalculatorPanel()
    s = step(panel, panel.initial(), {"op": "set", "model": "Qwen2.5-72B", "tp": 4, "kv_dtype": "fp8",
                                      "seq_len": 32768, "batch_size": 8})
    assert s.note == ""
    plan = memory.plan_memory("Qwen2.5-72B", "H100-80GB", 32768, 8, "fp8", tp=4, block_size=16)
    bars = {t.name: t.x[0] for t in s.figure.data}
    assert bars["KV cache (fp8)"] == pytest.approx(plan.kv_bytes / GiB)
    assert bars["weights"] == pytest.approx(plan.weights_bytes / GiB)
    assert "8 x 32,768 tokens" in s.figure.layout.title.text and "4 x H100-80GB" in s.figure.layout.title.text
    assert f"max batch at this context: {plan.max_batch_size:,} sequences" in s.status
    assert "TP=4 x PP=1" in s.status


def test_apply_never_changes_the_given_state_and_refusals_keep_it():
    panel = CalculatorPanel()
    start = panel.initial()
    new = panel.apply(start, {"op": "set", "batch_size": 64})
    assert start.batch_size == 16 and new.batch_size == 64
    for bad, words in [({"op": "set", "tp": 3}, "offers tp"),
                       ({"op": "set", "seq_len": 0}, "seq_len"),
                       ({"op": "set", "batch_size": "8"}, "must be an integer"),
                       ({"op": "set", "batch_size": True}, "must be an integer"),
                       ({"op": "set", "colour": 1}, "no input 'colour'"),
                       ({"op": "grow"}, "only action is 'set'"),
                       ({"op": "set", "model": "Gemma-2-9B", "tp": 32}, "16 query heads")]:
        s = step(panel, new, bad)
        assert s.state is new and words in s.note, (bad, s.note)
    with pytest.raises(UnknownPresetError):
        panel.apply(new, {"op": "set", "gpu": "Z80"})


def test_custom_starts_from_the_preset_shown_and_takes_typed_fields():
    panel = CalculatorPanel(model="Gemma-2-9B", gpu="H200", seq_len=8192, batch_size=2)   # its maximum
    before = panel.plan(panel.initial())
    custom = panel.apply(panel.initial(), {"op": "set", "model": "custom"})
    assert panel.plan(custom) == before.__class__(**{**before.__dict__, "model": "custom"})
    spec = memory.model_preset("Gemma-2-9B")
    assert custom.fields["sliding_window"] == spec.sliding_window and custom.base == "Gemma-2-9B"
    no_window = panel.apply(custom, {"op": "set", "sliding_window": 0})
    assert panel.plan(no_window).kv_bytes_per_sequence > before.kv_bytes_per_sequence
    with pytest.raises(ConfigError, match="not divisible"):
        panel.apply(custom, {"op": "set", "num_kv_heads": 7})


def test_demo_actions_are_json_and_exercise_every_input():
    acts = CalculatorPanel.demo_actions
    assert 4 <= len(acts) <= 8 and json.loads(json.dumps(acts)) == acts
    steps = _run(CalculatorPanel(), acts)
    assert sum(bool(s.note) for s in steps) == 1                   # the one refusal it shows
    shas = [figure_json(s.figure) for s in steps]
    assert len(set(shas)) == len(shas) - 1                         # the refusal redraws the same figure
    set_keys = {k for a in acts for k in a} - {"op"}
    assert {"batch_size", "model", "tp", "kv_dtype", "seq_len", "gpu", "pp", "block_size"} <= set_keys


def test_controls_name_inputs_the_model_takes():
    panel = CalculatorPanel()
    controls = panel.controls()
    json.dumps(controls)
    inputs = [c for c in controls if c["kind"] != "button"]
    action = {"op": "set", **{c["name"]: c["value"] for c in inputs}}
    assert panel.apply(panel.initial(), action) == panel.initial()
    for c in inputs:
        for option in c.get("options", []):
            step_ = step(panel, panel.initial(), {"op": "set", c["name"]: option})
            assert "offers" not in step_.note, (c["name"], option, step_.note)


def test_the_widget_shows_what_the_panel_model_decides():
    pytest.importorskip("ipywidgets")
    from paged_kv.widgets.memory import MemoryCalculator

    calc = MemoryCalculator(use_figure_widget=False)
    panel = CalculatorPanel()
    state = panel.initial()
    calc.model.value, calc.tp.value, calc.block_size.value = "Llama-3-70B", 8, 128
    state = panel.apply(state, {"op": "set", "model": "Llama-3-70B", "tp": 8, "block_size": 128})
    assert calc.plan == panel.plan(state) and calc.state == state
    calc.model.value = "custom"
    state = panel.apply(state, {"op": "set", "model": "custom"})
    assert {k: calc.custom[k].value for k in CUSTOM_FIELDS} == state.fields
    assert calc.plan == panel.plan(state)
