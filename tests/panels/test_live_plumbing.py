"""The browser edition's Python side: the registry of panels, the worker's JSON calls, and the
placeholder a static page carries."""

import hashlib
import json

import pytest

from paged_kv.errors import ConfigError
from paged_kv.panels import figure_json, page, registry, step, worker
from paged_kv.panels.base import PanelModel
from paged_kv.panels.calculator import CalculatorPanel

CONTRACT = {"calculator", "block_pool", "fork", "serving", "prefix_cache", "spec_decode"}


def test_the_registry_names_the_five_panels_and_builds_those_that_import():
    assert set(registry.PANELS) == CONTRACT
    here = registry.available()
    assert here["calculator"] is CalculatorPanel
    for name, cls in here.items():
        assert issubclass(cls, PanelModel) and cls.name == name, name
        assert 4 <= len(cls.demo_actions) <= 8 and json.loads(json.dumps(cls.demo_actions)) == cls.demo_actions
    with pytest.raises(ConfigError, match="no panel named 'abacus'"):
        registry.panel_class("abacus")
    with pytest.raises(ConfigError, match="not JSON"):
        registry.create("calculator", "{batch: 4}")
    with pytest.raises(ConfigError, match="JSON object"):
        registry.create("calculator", "[4]")
    assert registry.create("calculator", '{"batch_size": 4}').initial().batch_size == 4


def test_a_panel_that_does_not_import_fails_alone_with_its_name(monkeypatch):
    monkeypatch.setitem(registry.PANELS, "ghost", "paged_kv.panels.no_such_module:Ghost")
    with pytest.raises(ImportError, match="panel 'ghost'"):
        registry.panel_class("ghost")
    assert "ghost" not in registry.available() and "calculator" in registry.available()


def test_the_worker_answers_json_the_parity_hash_is_of_figure_json():
    r = json.loads(worker.create("calculator", '{"model": "Llama-3-70B", "tp": 4}'))
    assert set(r) == {"handle", "panel", "figure", "figure_sha256", "status", "note", "controls", "values"}
    model = CalculatorPanel(model="Llama-3-70B", tp=4)
    first = step(model, model.initial(), None)
    assert r["figure_sha256"] == hashlib.sha256(figure_json(first.figure).encode()).hexdigest()
    assert json.dumps(r["figure"], sort_keys=True, separators=(",", ":"), ensure_ascii=False) == figure_json(first.figure)
    assert r["status"] == first.status and r["note"] == "" and r["controls"] == model.controls()

    r2 = json.loads(worker.act(r["handle"], '{"op": "set", "batch_size": 64}'))
    assert r2["note"] == "" and r2["figure_sha256"] != r["figure_sha256"] and "64 x 8,192" in r2["status"]
    r3 = json.loads(worker.act(r["handle"], '{"op": "set", "seq_len": 0}'))       # refused: state kept
    assert "seq_len" in r3["note"] and r3["figure_sha256"] == r2["figure_sha256"]
    assert r3["values"] == r2["values"] == {"model": "Llama-3-70B", "gpu": "H100-80GB", "tp": 4, "pp": 1,
                                            "seq_len": 8192, "batch_size": 64, "kv_dtype": "fp16", "block_size": 16}
    with pytest.raises(ConfigError, match="handle"):
        worker.act(10**6, '{"op": "set"}')
    with pytest.raises(ConfigError, match="must be JSON"):
        worker.act(r["handle"], "set batch 4")
    with pytest.raises(ConfigError, match="string 'op'"):
        worker.act(r["handle"], '{"batch_size": 4}')
    worker.forget(r["handle"])
    with pytest.raises(ConfigError, match="handle"):
        worker.act(r["handle"], '{"op": "set"}')


def test_warming_up_changes_nothing_the_reader_sees():
    """worker.warm replays each panel's demo session on a private chain of states: the panel's own
    figures, after it and with it run in between, are those of a panel that never warmed."""
    def session(name, warm_between):
        r = json.loads(worker.create(name))
        shas = [r["figure_sha256"]]
        if warm_between:
            assert worker.warm() is True                   # one step, and steps left
        for a in registry.panel_class(name).demo_actions:
            shas.append(json.loads(worker.act(r["handle"], json.dumps(a)))["figure_sha256"])
            if warm_between:
                worker.warm()
        worker.forget(r["handle"])
        return shas

    for name in registry.available():
        cold = session(name, False)
        r = json.loads(worker.create(name))
        while worker.warm():                               # the whole demo session, thrown away
            pass
        assert worker.warm() is False
        again = json.loads(worker.act(r["handle"], json.dumps(registry.panel_class(name).demo_actions[0])))
        assert again["figure_sha256"] == cold[1], name
        worker.forget(r["handle"])
        assert session(name, True) == cold, name
        r = json.loads(worker.create(name))                # the first action ends the panel's warm-up
        worker.act(r["handle"], json.dumps(registry.panel_class(name).demo_actions[0]))
        assert worker.warm() is False
        worker.forget(r["handle"])


def test_a_step_draws_with_the_books_template_whatever_plotlys_default_is():
    import plotly.io as pio

    from paged_kv.viz import TEMPLATE

    model = CalculatorPanel()
    before = pio.templates.default
    try:
        pio.templates.default = TEMPLATE
        book = figure_json(step(model, model.initial(), None).figure)
        pio.templates.default = "plotly_dark"
        assert figure_json(step(model, model.initial(), None).figure) == book
        assert pio.templates.default == "plotly_dark"                # put back as it was
    finally:
        pio.templates.default = before


def test_the_placeholder_offers_run_live_or_says_the_build_has_none(monkeypatch):
    monkeypatch.delenv(page.LIVE_ENV, raising=False)
    on = page.placeholder("calculator", {"batch_size": 4, "model": "Llama-3-8B"}, figure_id="fig-1")
    assert 'data-panel="calculator"' in on and 'data-figure="fig-1"' in on and "Run live" in on
    args = on.split('data-args="')[1].split('"')[0].replace("&quot;", '"')
    assert json.loads(args) == {"batch_size": 4, "model": "Llama-3-8B"}
    assert "<script" not in on                       # nothing runs on page load from the placeholder
    monkeypatch.setenv(page.LIVE_ENV, "0")
    off = page.placeholder("calculator")
    assert page.OFF_MESSAGE in off and "Run live" not in off and "<button" not in off
    with pytest.raises(ConfigError, match="no panel named"):
        page.placeholder("abacus")
    with pytest.raises(ConfigError, match="JSON-able"):
        page.placeholder("calculator", {"model": object()})


def test_show_live_in_the_static_build_emits_the_placeholder_and_the_first_figure(monkeypatch):
    pytest.importorskip("ipywidgets")
    from paged_kv.widgets import panel as wpanel

    shown = []
    monkeypatch.setattr(wpanel, "display", lambda obj: shown.append(obj))
    monkeypatch.setenv("PAGED_KV_BOOK", "1")
    monkeypatch.setenv(page.LIVE_ENV, "1")
    built = []
    assert wpanel.show_live(lambda: built.append(1), "The calculator", live="calculator",
                            live_args={"batch_size": 2}) is False
    assert built == []                               # the ipywidgets panel is never built there
    note, live = shown[0].data, shown[1].data
    assert "Run live" in note and 'data-panel="calculator"' in live
    # the figure under the placeholder is the panel's starting state, never called a replay
    assert wpanel.START_NOTE in note and "replay" not in note and "replay" not in page.STATIC_BADGE
    fig_id = live.split('data-figure="')[1].split('"')[0]
    assert f'id="{fig_id}"' in live and "plotly.js" not in live.lower().split("<script")[0]
    shown.clear()
    wpanel.show_live(lambda: None, "The calculator")
    assert len(shown) == 1 and "Run live" not in shown[0].data   # without live=: as before
    assert wpanel.REPLAY_NOTE in shown[0].data
