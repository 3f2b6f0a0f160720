"""Chapter 7's panel model (paged_kv.panels.serving): pure steps over a copied engine, each action's
effect on the queues and pools, refusals as notes, and the browser configuration (no model: the
timing model's times and the recorded tokens)."""

import hashlib
import json
import math
import subprocess
import sys
import time

import pytest
from conftest import ROOT

from paged_kv import memory
from paged_kv.engine import EngineConfig, LLMEngine, SwapTime
from paged_kv.errors import ConfigError
from paged_kv.model import ByteTokenizer
from paged_kv.panels import figure_json, step
from paged_kv.panels.continuations import OFFERED_PROMPTS, load_recordings
from paged_kv.panels.engine_panel import EngineState, RooflineTiming
from paged_kv.panels.prefix_cache import PrefixCachePanel
from paged_kv.panels.serving import DEFAULT_PROMPT, ServingPanel
from paged_kv.sampling_params import SamplingParams
from paged_kv.sim import ServingSetup


def run(model, actions, state=None):
    """Every step of ``actions`` from ``state`` (default: the initial one); the last Step."""
    state = model.initial() if state is None else state
    s = step(model, state, None)
    for a in actions:
        s = step(model, s.state, a)
    return s


def snapshot(model, state):
    e = state.engine
    return (figure_json(model.figure(state)), model.status(state), e.stats.steps, e.clock,
            [(o.request_id, [list(t) for t in o.token_ids], o.finish_reason) for o in e.outputs()],
            e.scheduler.manager.num_free_blocks, len(e.records))


@pytest.fixture(scope="module")
def panel():
    return ServingPanel()


def test_apply_never_changes_the_state_it_was_given(panel):
    """Every demo action, from the state the demo reached before it: that state's figure, status,
    clock, outputs and pool are the same after the action as before."""
    state = panel.initial()
    for action in ServingPanel.demo_actions:
        before = snapshot(panel, state)
        new = panel.apply(state, action)
        assert snapshot(panel, state) == before, action
        assert new is not state and new.engine is not state.engine
        state = new


def test_the_demo_runs_without_a_note_and_exercises_every_op(panel):
    s = panel.initial()
    for action in ServingPanel.demo_actions:
        got = step(panel, s, action)
        assert got.note == "", (action, got.note)
        s = got.state
    assert {a["op"] for a in ServingPanel.demo_actions} == set(ServingPanel.OPS)
    assert 4 <= len(ServingPanel.demo_actions) <= 8
    e = s.engine
    assert not e.has_unfinished_requests()
    assert [o.finish_reason for o in e.outputs()] == [["length"], ["abort", "abort"]]


def test_submit_queues_a_request_and_chunked_prefill_follows_the_token_budget(panel):
    s = run(panel, [{"op": "submit", "prompt": DEFAULT_PROMPT, "max_tokens": 5, "n": 1}])
    sch = s.state.engine.scheduler
    assert [r.request_id for r in sch.waiting] == ["A"] and s.state.message == "request A is waiting"
    assert s.status.startswith("request A is waiting\n")
    prompt_len = len(DEFAULT_PROMPT.encode())
    computed = []
    state = s.state
    while state.engine.scheduler.running or state.engine.scheduler.waiting:
        state = panel.apply(state, {"op": "step"})
        rec = state.engine.records[-1]
        if rec.running:
            computed.append(rec.running[0][3])         # computed prompt tokens after the step
        if len(computed) > 3:
            break
    budget = panel.config.max_num_batched_tokens
    assert computed[:3] == [min(budget * k, prompt_len) for k in (1, 2, 3)]


@pytest.mark.parametrize("mode, queue", [("swap", "swapped"), ("recompute", "waiting")])
def test_preempt_moves_the_request_by_the_mode_asked(panel, mode, queue):
    s = run(panel, [{"op": "submit", "prompt": "abc", "max_tokens": 6}, {"op": "step"}, {"op": "step"},
                    {"op": "preempt", "request": "A", "mode": mode}])
    assert s.note == "" and s.state.message == f"request A preempted by {mode}"
    sch = s.state.engine.scheduler
    assert [r.request_id for r in getattr(sch, queue)] == ["A"] and not sch.running
    s = run(panel, [{"op": "run"}], s.state)
    o = s.state.engine.output("A")
    assert o.finish_reason == ["length"] and len(o.token_ids[0]) == 6 and o.preemptions == 1


def test_abort_frees_the_blocks_at_once_in_any_state(panel):
    s = run(panel, [{"op": "submit", "prompt": DEFAULT_PROMPT, "max_tokens": 20},
                    {"op": "submit", "prompt": DEFAULT_PROMPT, "max_tokens": 20}, {"op": "step"}, {"op": "step"}])
    m = s.state.engine.scheduler.manager
    assert m.num_free_blocks < panel.config.num_gpu_blocks            # A holds blocks
    s = run(panel, [{"op": "abort", "request": "B"}, {"op": "abort", "request": "A"}], s.state)
    e = s.state.engine
    assert s.state.message == "request A aborted: its blocks are free"
    assert [o.finish_reason for o in e.outputs()] == [["abort"], ["abort"]] and not e.has_unfinished_requests()
    assert e.scheduler.manager.num_free_blocks == panel.config.num_gpu_blocks
    assert e.records[-1].pool.used_blocks == 0


@pytest.mark.parametrize("action, says", [
    ({"op": "submit", "prompt": "\x01" * 60, "max_tokens": 40}, "never run"),    # 99 tokens > 16 blocks of 4
    ({"op": "submit", "prompt": "", "max_tokens": 4}, "empty prompt"),
    ({"op": "submit", "prompt": "ab", "max_tokens": 4, "n": 9}, "samples (n) must be at most 4"),
    ({"op": "submit", "prompt": "ab", "max_tokens": 2.5}, "max_tokens"),
    ({"op": "preempt", "request": "A"}, "not running"),                  # A is waiting
    ({"op": "preempt", "request": None}, "no running request to preempt"),
    ({"op": "preempt", "request": "A", "mode": "drop"}, "mode must be one of"),
    ({"op": "abort", "request": "Z"}, "no request 'Z'"),
    ({"op": "abort"}, "no request to abort"),
    ({"op": "fly"}, "unknown op 'fly'"),
])
def test_a_refusal_is_the_steps_note_and_changes_nothing(panel, action, says):
    s = run(panel, [{"op": "submit", "prompt": "abc", "max_tokens": 3}])
    before = snapshot(panel, s.state)
    got = step(panel, s.state, action)
    assert says in got.note and got.state is s.state and snapshot(panel, s.state) == before


def test_the_browser_configuration_replays_the_recorded_tokens(panel):
    """No model: the engine's runner is the timing model; the offered prompt's tokens are the
    recorded continuation's bytes (read from the JSON here, not from the token source)."""
    assert panel.timed and panel.model is None and DEFAULT_PROMPT in OFFERED_PROMPTS
    s = run(panel, [{"op": "submit", "prompt": DEFAULT_PROMPT, "max_tokens": 12}, {"op": "run"}])
    o = s.state.engine.output("A")
    want = load_recordings()[DEFAULT_PROMPT].encode()[:12]
    assert bytes(o.token_ids[0]) == want and o.text == [want.decode()]
    assert "timing model" in s.status and "recorded" in s.status and "stand-in" not in s.status
    s = run(panel, [{"op": "submit", "prompt": "my own words", "max_tokens": 4}, {"op": "run"}], s.state)
    assert "B (stand-in tokens: no recorded continuation)" in s.status
    long = ServingPanel(num_gpu_blocks=64)                  # past the recording's end: labelled too
    recorded = load_recordings()[DEFAULT_PROMPT].encode()
    s = run(long, [{"op": "submit", "prompt": DEFAULT_PROMPT, "max_tokens": len(recorded) + 4}, {"op": "run"}])
    assert bytes(s.state.engine.output("A").token_ids[0][:len(recorded)]) == recorded
    assert "A (stand-in tokens: no recorded continuation)" in s.status


def test_the_browser_configurations_times_are_the_timing_models():
    """The same actions on the timing-model engine the chapter's own runs use (sim's roofline
    IterationTime and engine.serving's SwapTime, built independently of the panel): the same
    clock after every step, swaps included."""
    panel = ServingPanel(num_cpu_blocks=16)
    setup = ServingSetup()                              # OPT-13B on an A100-40GB at 50% of peak
    opt = memory.model_preset("OPT-13B")
    ref = LLMEngine(None, panel.config, tokenizer=ByteTokenizer(), iteration_time=setup.iteration_time(),
                    swap_time=SwapTime(memory.kv_bytes_per_token(opt, "fp16"), opt.num_layers))
    state = panel.initial()
    actions = [{"op": "submit", "prompt": DEFAULT_PROMPT, "max_tokens": 6}, {"op": "step"}, {"op": "step"},
               {"op": "step"}, {"op": "preempt", "request": "A", "mode": "swap"}, {"op": "step"}, {"op": "step"}]
    for a in actions:
        state = panel.apply(state, a)
        if a["op"] == "submit":
            ref.add_request(a["prompt"], SamplingParams(max_tokens=a["max_tokens"]), request_id="A")
        elif a["op"] == "preempt":
            ref.scheduler.preempt("A", "swap")
        else:
            ref.step()
        assert math.isclose(state.engine.clock, ref.clock, rel_tol=1e-12), a
    assert state.engine.stats.swaps == 1 and state.engine.stats.swapped_blocks > 0
    assert state.engine.clock > 0


def test_the_roofline_is_the_sims_and_the_swap_time_the_engines():
    it = ServingSetup().iteration_time()
    assert RooflineTiming().coefficients == (it.base_s, it.per_kv_token_s, it.per_prefill_token_s)  # one formula
    assert RooflineTiming().iteration_time(1000, 37) == it(1000, 37)
    assert RooflineTiming().coefficients == pytest.approx((25.7e9 / 777.5e9, 819200 / 777.5e9, 25.7e9 / 156e12),
                                                          rel=0.01)    # OPT-13B: 25.7 GB of fp16 weights, half of each peak
    opt = memory.model_preset("OPT-13B")
    swap = SwapTime(memory.kv_bytes_per_token(opt, "fp16"), opt.num_layers)
    for blocks, size in ((1, 4), (3, 16)):
        assert RooflineTiming().swap_time(blocks, size) == pytest.approx(swap(blocks, size), rel=1e-12)
    with pytest.raises(ConfigError, match="efficiency"):
        RooflineTiming(efficiency=1.5)


def test_json_args_build_the_engine_and_a_config_excludes_them():
    p = ServingPanel(block_size=8, num_gpu_blocks=10, num_cpu_blocks=0, max_num_batched_tokens=16,
                     preemption_mode="recompute")
    c = p.initial().engine.scheduler.config
    assert (c.block_size, c.num_gpu_blocks, c.num_cpu_blocks, c.max_num_batched_tokens, c.preemption_mode) == (
        8, 10, 0, 16, "recompute")
    with pytest.raises(ConfigError, match="not both"):
        ServingPanel(block_size=8, config=EngineConfig(num_gpu_blocks=4))
    with pytest.raises(ConfigError, match="block_size"):
        ServingPanel(block_size=0)
    assert [c["op"] for c in p.controls() if c["kind"] == "button"] == ["submit", "step", "run", "preempt", "abort"]


def test_the_state_is_an_engine_state():
    with pytest.raises(ConfigError, match="EngineState"):
        ServingPanel().apply({"engine": None}, {"op": "step"})
    assert isinstance(ServingPanel().initial(), EngineState)


def test_the_tiny_model_side_is_pure_too_and_a_copy_is_cheap(small_model):
    """With a model (the Jupyter side) the same actions, the copy sharing the weights: the state
    given is unchanged, the copy's tokens are the model's.  Prints the copy's cost."""
    panel = ServingPanel(model=small_model, tokenizer=ByteTokenizer())
    s = run(panel, [{"op": "submit", "prompt": "\x05\x06\x07", "max_tokens": 8, "n": 2}, {"op": "step"},
                    {"op": "step"}])
    before = snapshot(panel, s.state)
    after = run(panel, [{"op": "run"}], s.state)
    assert snapshot(panel, s.state) == before
    assert after.state.engine.runner.model is small_model            # the weights are shared
    assert after.state.engine.output("A").finish_reason == ["length", "length"]
    for label, p, state in (("tiny model", panel, s.state), ("timing model", ServingPanel(),
                                                             run(ServingPanel(), ServingPanel.demo_actions).state)):
        t0 = time.perf_counter()
        for _ in range(10):
            p.copy_engine(state.engine)
        print(f"copy of the engine ({label}, {len(state.engine.records)} records): "
              f"{(time.perf_counter() - t0) / 10 * 1e3:.2f} ms")


BLOCKED_RUN = """
import hashlib, json, sys
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "numpy", "triton", "safetensors", "kernels"):
            raise ImportError(f"{name} is blocked (the browser has none)")
sys.meta_path.insert(0, Blocked())
from paged_kv.panels import figure_json, step
from paged_kv.panels.prefix_cache import PrefixCachePanel
from paged_kv.panels.serving import ServingPanel
out = {}
for cls in (ServingPanel, PrefixCachePanel):
    model = cls()
    s = step(model, model.initial(), None)
    for a in cls.demo_actions:
        s = step(model, s.state, a)
    out[cls.name] = [hashlib.sha256(figure_json(s.figure).encode()).hexdigest(), s.status]
print(json.dumps(out))
"""


def demo_digest(cls):
    model = cls()
    s = run(model, cls.demo_actions)
    return [hashlib.sha256(figure_json(s.figure).encode()).hexdigest(), s.status]


def test_both_panels_run_their_demo_without_torch_or_numpy_and_agree_with_this_process():
    """What the browser runs: the two panel models with torch and numpy blocked give the figure
    bytes and status text this process gives (the CPython half of the parity test)."""
    got = subprocess.run([sys.executable, "-c", BLOCKED_RUN], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    seen = json.loads(got.stdout)
    assert seen == {"serving": demo_digest(ServingPanel), "prefix_cache": demo_digest(PrefixCachePanel)}


def test_the_ipywidgets_panels_without_a_model_run_the_browser_configuration():
    """The Jupyter panels forward to the same models: without a model they run the timing model,
    say so, and their engine's tokens are the recorded ones."""
    from paged_kv.widgets.prefix_cache import prefix_cache_panel
    from paged_kv.widgets.serving import serving_panel

    for build, submit_at, run_at, status_at, name in ((serving_panel, (0, 3), (1, 1), 3, "A"),
                                                      (prefix_cache_panel, (1, 1), (1, 3), 2, "R0")):
        panel = build(load_model=False, use_figure_widget=False)
        panel.children[submit_at[0]].children[submit_at[1]].click()
        panel.children[run_at[0]].children[run_at[1]].click()
        status = panel.children[status_at].value
        assert "timing model, no model runs" in status and panel.panel_model.timed
        o = panel.engine.output(name)
        assert bytes(o.token_ids[0]) == load_recordings()[o.prompt].encode()[:len(o.token_ids[0])] != b""


@pytest.mark.parametrize("cls", [ServingPanel, PrefixCachePanel])
@pytest.mark.parametrize("op, says", [("step", "nothing to step: submit a request"),
                                      ("run", "nothing to run: submit a request")])
def test_stepping_an_idle_engine_says_there_is_nothing_to_step(cls, op, says):
    """A click with no request unfinished (before any, or after all finished) is a note, not a
    silent no-op, and changes nothing."""
    model = cls()
    got = step(model, model.initial(), {"op": op})
    assert got.note == says and got.state.engine.stats.steps == 0
    submit = cls.demo_actions[0]
    done = run(model, [submit, {"op": "run"}])
    assert done.note == "" and done.state.message.endswith("every request has finished")
    again = step(model, done.state, {"op": op})
    assert again.note == says and again.state is done.state


def test_run_until_idle_says_when_it_stops_at_the_step_limit():
    """At the limit with requests left, the message says it stopped there, the steps it ran and how
    many requests are unfinished; the next click goes on; under the limit it says all finished."""
    from paged_kv.panels.engine_panel import MAX_RUN_STEPS
    assert ServingPanel.max_run_steps == MAX_RUN_STEPS == 500
    model = ServingPanel()
    model.max_run_steps = 3                                  # this instance only
    s = run(model, [{"op": "submit", "prompt": DEFAULT_PROMPT, "max_tokens": 4},
                    {"op": "submit", "prompt": "abc", "max_tokens": 4}, {"op": "run"}])
    assert s.note == "" and s.state.engine.stats.steps == 3
    assert s.state.message == ("stopped after 3 steps, the most one click runs: 2 requests unfinished; "
                               "run until idle again to go on")
    assert s.status.splitlines()[0] == s.state.message
    while s.state.engine.has_unfinished_requests():
        s = step(model, s.state, {"op": "run"})
        assert s.note == ""
    k = s.state.engine.stats.steps % 3 or 3
    assert s.state.message in (f"ran {k} step{'s' * (k != 1)}: every request has finished",
                               "ran 3 steps: every request has finished")


def test_an_abort_works_once():
    """Aborting a finished (or already aborted) request is refused by name, not said again."""
    model = ServingPanel()
    s = run(model, [{"op": "submit", "prompt": "abc", "max_tokens": 2}, {"op": "abort", "request": "A"}])
    assert s.note == "" and s.state.message == "request A aborted: its blocks are free"
    again = step(model, s.state, {"op": "abort", "request": "A"})
    assert again.note == "request A has already finished (abort): nothing to abort" and again.state is s.state
    s = run(model, [{"op": "submit", "prompt": "abc", "max_tokens": 2}, {"op": "run"},
                    {"op": "abort", "request": "A"}])
    assert s.note == "request A has already finished (length): nothing to abort"


def test_the_samples_of_a_request_are_named_as_the_pool_names_them(panel):
    """``n = 2``: the status lines name the samples ``B`` and ``B.1``, the names of the sequences in
    the pool's block tables, never ``B`` twice (ipywidgets' lines too)."""
    from paged_kv.widgets.panel import outputs_html

    s = run(panel, [{"op": "submit", "prompt": "abc", "max_tokens": 2},
                    {"op": "submit", "prompt": DEFAULT_PROMPT, "max_tokens": 3, "n": 2},
                    {"op": "step"}, {"op": "step"}, {"op": "step"}])
    e = s.state.engine
    tables = {name for r in e.records for name in r.pool.tables}
    assert tables == {"A", "B", "B.1"}
    heads = [line.split(":")[0].split(" ")[0] for line in s.status.splitlines() if line.startswith(("A", "B"))]
    assert heads == ["A", "B", "B.1"]
    html_heads = [line.split(":")[0] for line in outputs_html(e.outputs()).split("<br>")]
    assert html_heads == ["<b>A</b>", "<b>B</b>", "<b>B.1</b>"]
