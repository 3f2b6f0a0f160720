"""The browser edition's page without a browser: the controls the panel models describe (what
book/_ext/live/live.mjs draws), the refusals they answer, the placeholder's HTML and the book
extension's page context.  What only a browser can check is tests/live/test_live_browser.py's."""

import html
import importlib.util
import json
from pathlib import Path

import pytest

from paged_kv import memory
from paged_kv.errors import ConfigError
from paged_kv.memory import MODEL_PRESETS
from paged_kv.panels import page, registry, step, worker
from paged_kv.panels.base import EMPTY_OPTION, option_label, select_control
from paged_kv.panels.calculator import CalculatorPanel
from paged_kv.panels.continuations import OFFERED_PROMPTS
from paged_kv.panels.prefix_cache import SYSTEM_PROMPTS

ROOT = Path(__file__).resolve().parents[2]

#: the controls where a reader gives a request's text, by panel (the browser offers only the
#: prompts whose continuations were recorded)
PROMPT_CONTROLS = {"block_pool": "prompt", "fork": "prompt", "serving": "prompt"}


def control(model, name: str) -> dict:
    (c,) = [c for c in model.controls() if c.get("name") == name]
    return c


# --- 1. a prompt is picked from a dropdown of the offered prompts ---------------------------------
def test_option_labels_show_a_line_break_and_keep_spaces():
    assert option_label("ROMEO:\nBut soft, what light") == "ROMEO:\u23ceBut soft, what light"
    assert option_label("a\tb  c") == "a\u21e5b  c"
    assert option_label("") == EMPTY_OPTION != ""


@pytest.mark.parametrize("name", sorted(PROMPT_CONTROLS))
def test_a_prompt_is_a_dropdown_of_the_offered_prompts_labelled_with_a_return_sign(name):
    model = registry.create(name)
    c = control(model, PROMPT_CONTROLS[name])
    assert c["kind"] == "select" and c["value"] in c["options"]
    assert set(c["options"]) == set(OFFERED_PROMPTS) and len(c["options"]) == len(OFFERED_PROMPTS)
    assert len(c["labels"]) == len(c["options"])
    multiline = [o for o in c["options"] if "\n" in o]
    assert multiline                                          # the offered prompts have line breaks
    for option, label in zip(c["options"], c["labels"]):
        assert "\n" not in label and label.count("\u23ce") == option.count("\n")
        assert label.replace("\u23ce", "\n") == option        # the value stays the real text


@pytest.mark.parametrize("name", ["block_pool", "serving"])
def test_every_offered_prompt_runs_on_its_recorded_tokens(name):
    """What the dropdown offers is what the browser has recordings for: no option is a stand-in
    (as a typed prompt is)."""
    model = registry.create(name)
    op = "add" if name == "block_pool" else "submit"

    def status_after(prompt):
        s = step(model, model.initial(), {"op": op, "prompt": prompt})
        for _ in range(3):
            s = step(model, s.state, {"op": "step"})
        assert s.note == "", (prompt, s.note)
        return s.status

    assert "(stand-in" in status_after("typed, not offered")
    for option in control(model, "prompt")["options"]:
        assert "(stand-in" not in status_after(option), option


def test_the_prefix_cache_offers_own_texts_recorded_after_every_prefix():
    model = registry.create("prefix_cache")
    prefix, text = control(model, "prefix"), control(model, "text")
    assert prefix["kind"] == text["kind"] == "select"
    assert prefix["labels"][prefix["options"].index("")] == EMPTY_OPTION
    for p in prefix["options"]:
        for t in text["options"]:
            assert p + t in OFFERED_PROMPTS, (p, t)
    assert set(prefix["options"]) == {*SYSTEM_PROMPTS, ""}


def test_a_starting_text_that_is_not_offered_comes_first():
    c = select_control("prompt", "prompt", "typed", OFFERED_PROMPTS)
    assert c["options"] == ["typed", *OFFERED_PROMPTS] and c["labels"][0] == "typed"
    c = registry.create("block_pool", {"prompt": "To be, or not"})
    assert control(c, "prompt")["options"] == list(OFFERED_PROMPTS)


# --- 2. an empty number box is sent as null and refused by name ------------------------------------
def test_an_empty_number_is_refused_naming_its_field():
    """Every number box of every panel, sent empty (``None``) with each button: the panel refuses
    it, naming the box in the page's words and the action's key, and changes nothing."""
    for name in registry.available():
        model = registry.create(name)
        controls = model.controls()
        values = {c["name"]: c["value"] for c in controls if c["kind"] != "button"}
        buttons = [c["op"] for c in controls if c["kind"] == "button"]
        start = model.initial()
        first = step(model, start, None)
        for c in controls:
            if c["kind"] != "int" or c["name"] == "request":    # no request: "no request to ..."
                continue
            notes = set()
            for op in buttons:
                s = step(model, start, {**values, "op": op, c["name"]: None})
                if s.note:
                    assert s.state is start and s.status == first.status, (name, op)
                    notes.add(s.note)
            said = [n for n in notes if f"({c['name']}) is empty: type a number" in n]
            assert said, (name, c["name"], notes)
            words = c["label"].removeprefix("or ")
            assert all(words in n for n in said), (name, c["label"], said)


def test_the_worker_refuses_null_as_a_note():
    r = json.loads(worker.create("calculator"))
    after = json.loads(worker.act(r["handle"], '{"op": "set", "seq_len": null}'))
    assert after["note"] == "the calculator's context (seq_len) is empty: type a number"
    assert after["figure_sha256"] == r["figure_sha256"] and after["status"] == r["status"]
    worker.forget(r["handle"])


# --- 4. the calculator sends the input that changed; a refusal puts the inputs back ----------------
def test_the_calculator_resets_every_input_it_draws_to_the_state_after_a_refusal():
    model = registry.create("calculator")
    inputs = {c["name"]: c["value"] for c in model.controls() if c["kind"] != "button"}
    assert model.input_values(model.initial()) == inputs       # every input the page draws
    auto = [c for c in model.controls() if c.get("auto")]
    assert len(auto) == 1 and auto[0]["op"] == "set"           # a change sends "set" with that input

    r = json.loads(worker.create("calculator"))
    for key, value in (("batch_size", 48), ("model", "Llama-3-70B")):
        r = json.loads(worker.act(r["handle"], json.dumps({"op": "set", key: value})))
        assert r["note"] == "" and r["values"][key] == value
    accepted = r["values"]
    for bad in ({"seq_len": 0}, {"tp": 3}, {"batch_size": None}):
        refused = json.loads(worker.act(r["handle"], json.dumps({"op": "set", **bad})))
        assert refused["note"] and refused["values"] == accepted, bad
    assert accepted == {**inputs, "batch_size": 48, "model": "Llama-3-70B"}
    worker.forget(r["handle"])


def test_panels_whose_inputs_are_not_state_reset_nothing():
    for name in ("block_pool", "fork", "serving", "prefix_cache"):
        model = registry.create(name)
        assert model.input_values(model.initial()) == {}


# --- 5. a context beyond the model's maximum is refused, naming both -------------------------------
def test_a_context_beyond_the_models_maximum_is_refused_naming_both():
    panel = CalculatorPanel(batch_size=1)
    for name in MODEL_PRESETS:
        top = memory.model_preset(name).max_position
        if top is None:
            continue
        at = step(panel, panel.initial(), {"op": "set", "model": name, "seq_len": top, "tp": 1})
        assert "maximum context" not in at.note, (name, at.note)
        past = step(panel, panel.initial(), {"op": "set", "model": name, "seq_len": top + 1, "tp": 1})
        assert past.state is panel.initial(), name
        assert f"{top + 1:,} tokens is beyond {name}'s maximum context of {top:,} tokens" in past.note
    long = panel.apply(panel.initial(), {"op": "set", "model": "Llama-3.1-8B", "seq_len": 131072})
    shorter = step(panel, long, {"op": "set", "model": "Llama-3-8B"})          # the model changes under it
    assert shorter.state is long and "131,072 tokens is beyond Llama-3-8B's maximum context of 8,192" in shorter.note
    with pytest.raises(ConfigError, match="beyond Llama-2-7B's maximum context of 4,096"):
        CalculatorPanel(model="Llama-2-7B", seq_len=4097)


def test_a_custom_models_maximum_context_is_its_typed_one():
    panel = CalculatorPanel()
    custom = panel.apply(panel.initial(), {"op": "set", "model": "custom"})
    assert custom.fields["max_position"] == 8192
    wider = panel.apply(custom, {"op": "set", "max_position": 65536, "seq_len": 65536})
    assert wider.seq_len == 65536
    refused = step(panel, wider, {"op": "set", "max_position": 16384})
    assert refused.state is wider and "65,536 tokens is beyond custom's maximum context of 16,384" in refused.note


# --- 7. a badge says whether the figure is the build's replay or the live panel -------------------
def test_the_placeholder_carries_a_static_badge_that_the_page_swaps_for_the_live_one():
    assert "static" in page.STATIC_BADGE and "book" in page.STATIC_BADGE
    assert "live" in page.LIVE_BADGE and "browser" in page.LIVE_BADGE
    on = page.placeholder("calculator", enabled=True)
    off = page.placeholder("calculator", enabled=False)
    for html_ in (on, off):
        shown = html_.split('class="paged-kv-live-badge"')[1].split("</span>")[0]
        assert shown.endswith(">" + html.escape(page.STATIC_BADGE)), shown
    assert f'data-live-badge="{html.escape(page.LIVE_BADGE)}"' in on
    assert "data-live-badge" not in off                       # nothing will run: it stays a replay
    assert on.index("paged-kv-live-badge") < on.index("paged-kv-live-run")


# --- 8. no page asks for /favicon.ico ------------------------------------------------------------
def test_every_page_gets_an_empty_icon_unless_the_book_has_one():
    spec = importlib.util.spec_from_file_location("live_mode", ROOT / "book" / "_ext" / "live_mode.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.NO_FAVICON == '<link rel="icon" href="data:,">'

    class App:
        paged_kv_live = False

    for live in (False, True):
        App.paged_kv_live = live
        for body in ("<p>no panel</p>", '<div class="paged-kv-live" data-panel="calculator">'):
            context = {"body": body, "metatags": '<meta name="x" content="y">', "script_files": []}
            mod._page_context(App(), "p", "t", context, None)
            assert context["metatags"] == '<meta name="x" content="y">' + mod.NO_FAVICON
    own = {"body": "", "metatags": "", "favicon_url": "_static/icon.png", "script_files": []}
    mod._page_context(App(), "p", "t", own, None)
    assert own["metatags"] == ""                                # the book's own icon, alone
