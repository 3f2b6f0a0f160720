"""The calculator (paged_kv.viz.calculator and the live panel, paged_kv.widgets.memory): the
numbers it shows equal paged_kv.memory's, the static calculator's three controls stay consistent,
and it works in headless Chromium with no kernel."""

import json
import shutil
from pathlib import Path

import pytest

from paged_kv import memory
from paged_kv.defaults import BLOCK_SIZE, bundled_weights_dir
from paged_kv.units import GiB
from paged_kv.viz import calculator as vc

MODELS = ["Llama-3-8B", "Llama-2-70B", "DeepSeek-V3", "Mistral-7B"]
GPUS = ["T4", "A100-80GB", "H200"]
CONTEXTS = [2048, 8192, 32768]


@pytest.fixture(scope="module")
def calc_data():
    return vc.calculator_data(MODELS, GPUS, CONTEXTS, tps=(1, 8))


def _column(cells, header):
    return cells[vc.CALC_COLUMNS.index(header)]


MAX_CONTEXT = {"Llama-3-8B": 8192, "Llama-2-70B": 4096, "DeepSeek-V3": 163840, "Mistral-7B": 32768}


def test_static_calculator_every_choice_matches_the_package(calc_data):
    fig = vc.calculator_figure(calc_data, model="Llama-3-8B", gpu="A100-80GB", context_index=1)
    model_menu, gpu_menu = fig.layout.updatemenus
    assert [b.label for b in model_menu.buttons] == MODELS and [b.label for b in gpu_menu.buttons] == GPUS
    tables = [i for i, t in enumerate(fig.data) if t.type == "table"]
    assert len(tables) == len(GPUS)
    for mb in model_menu.buttons:
        cells = mb.args[0]["cells.values"]
        for gi, g in enumerate(GPUS):
            col = _column(cells[tables[gi]], "max batch")
            for ci, c in enumerate(CONTEXTS):
                plan = memory.plan_memory(mb.label, g, c, block_size=BLOCK_SIZE)
                if c > MAX_CONTEXT[mb.label]:  # beyond the model's maximum: no numbers
                    assert col[ci] == vc.DASH
                    assert vc.BEYOND_MARK in _column(cells[tables[gi]], "context (tokens)")[ci]
                    assert mb.args[0]["cells.font.color"][tables[gi]][0][ci] == vc.GREY
                else:
                    assert col[ci] == (f"{plan.max_batch_size:,}" if plan.weights_fit else vc.NO_ROOM)
            tp8 = _column(cells[tables[gi]], "max batch, TP=8")
            c = max(x for x in CONTEXTS if x <= MAX_CONTEXT[mb.label])
            plan = memory.plan_memory(mb.label, g, c, tp=8, block_size=BLOCK_SIZE)
            assert tp8[CONTEXTS.index(c)] == (f"{plan.max_batch_size:,}" if plan.weights_fit else vc.NO_ROOM)
        assert mb.label in mb.args[1]["annotations[0].text"]
        assert f"{memory.kv_bytes_per_token(mb.label):,} B" in mb.args[1]["annotations[0].text"]
    for gi, gb in enumerate(gpu_menu.buttons):
        visible = gb.args[0]["visible"]
        assert [visible[i] for i in tables] == [g == gb.label for g in GPUS]
    for ci, step in enumerate(fig.layout.sliders[0].steps):
        fills = step.args[0]["cells.fill.color"][0][0]
        assert [f == "#FFF3C4" for f in fills] == [i == ci for i in range(len(CONTEXTS))]
        assert step.args[1]["shapes[0].x0"] == ci and list(step.args[2]) == tables


def test_static_calculator_initial_state(calc_data):
    fig = vc.calculator_figure(calc_data, model="Llama-3-8B", gpu="H200", context_index=2)
    shown = [t for t in fig.data if t.type == "table" and t.visible]
    assert len(shown) == 1
    per_seq = _column(shown[0].cells.values, "KV / sequence")
    assert per_seq[1] == f"{2 * 32 * 8 * 128 * 2 * 8192 / 2**30:.0f} GiB" == "1 GiB"
    assert per_seq[0] == f"{2 * 32 * 8 * 128 * 2 * 2048 / 2**20:.0f} MiB" == "256 MiB"
    assert fig.layout.shapes[0].x0 == 2
    assert vc.calculator_figure(calc_data).layout.shapes[0].x0 == CONTEXTS.index(8192)  # the default


def test_static_calculator_says_when_the_weights_do_not_fit(calc_data):
    fig = vc.calculator_figure(calc_data, model="DeepSeek-V3", gpu="T4")
    table = [t for t in fig.data if t.type == "table" and t.visible][0]
    assert set(_column(table.cells.values, "max batch")) == {vc.NO_ROOM}
    note = [t for t in fig.data if t.meta and t.meta.get("kind") == "note" and t.visible][0]
    assert list(note.y) == [1] and "nothing fits" in note.text[0]      # said, not an empty chart
    # switching the model restyles the note with the lines
    llama = [b for b in fig.layout.updatemenus[0].buttons if b.label == "Llama-3-8B"][0]
    notes = [i for i, t in enumerate(fig.data) if t.meta and t.meta.get("kind") == "note"]
    fits_somewhere = {g: any(r["batch_tp"][tp] and r["batch_tp"][tp] > 0 and not r["beyond"]
                             for r in calc_data["models"]["Llama-3-8B"]["cases"][g] for tp in calc_data["tps"])
                      for g in GPUS}
    for i, g in zip(notes, GPUS):
        assert list(llama.args[0]["y"][i]) == ([None] if fits_somewhere[g] else [1])


def test_static_calculator_highlight_and_marker_differ_from_every_series(calc_data):
    fig = vc.calculator_figure(calc_data, model="Llama-3-8B", gpu="H200")
    series = {t.line.color for t in fig.data if t.type == "scatter" and t.mode != "text"}
    assert vc.MARKER_COLOR not in series and vc.HIGHLIGHT not in series
    assert fig.layout.shapes[0].line.color == vc.MARKER_COLOR
    assert vc.calculator_data(["Llama-3-8B"], ["H100-80GB"], [8192])["tps"][-1] == 16   # TP=16 offered


def test_static_calculator_small_sizes_in_mib_and_beyond_max_rows():
    spec = memory.model_preset("tiny")
    ctx = spec.max_position                     # the bundled model's context (its config.json)
    assert ctx == json.loads((bundled_weights_dir() / "config.json").read_text())["max_seq_len"]
    data = vc.calculator_data(["tiny"], ["T4"], contexts=[ctx // 2, ctx, 4 * ctx], tps=(1, 2, 4))
    assert spec.num_params < 2**30 // 2  # weights well under 1 GiB
    assert vc.CALC_CONTEXTS[0] == ctx   # the static calculator's first row: the tiny model's whole context
    fig = vc.calculator_figure(data, context_index=0)
    note = fig.layout.annotations[0].text
    mib, mb = spec.num_params * 2 / 2**20, spec.num_params * 2 / 10**6  # fp16 weights
    assert f"{mib:,.2f} MiB ({mb:,.2f} MB)" in note and "0.0 GiB" not in note
    table = [t for t in fig.data if t.type == "table" and t.visible][0]
    per_seq = _column(table.cells.values, "KV / sequence")
    kv = ctx * memory.kv_bytes_per_token(spec)   # under 1 MiB in KiB, else MiB (256 tokens: 512 KiB)
    assert per_seq[1] == (f"{kv / 2**10:.3g} KiB" if kv < 2**20 else f"{kv / 2**20:.3g} MiB")
    assert per_seq[2] == vc.DASH and vc.BEYOND_MARK in _column(table.cells.values, "context (tokens)")[2]
    lines = [t for t in fig.data if t.type == "scatter" and t.visible and t.meta["kind"] == "line"]
    assert all(t.y[2] is None for t in lines)  # no point beyond the model's maximum
    # lines that may coincide stay distinguishable: each TP has its own dash and marker
    assert len({t.line.dash for t in lines}) == len({t.marker.symbol for t in lines}) == len(lines) == 3


# --- the live calculator ---------------------------------------------------------------------------
def test_live_calculator_follows_its_widgets():
    pytest.importorskip("ipywidgets")
    from paged_kv.widgets.memory import MemoryCalculator

    calc = MemoryCalculator(use_figure_widget=False)
    assert calc.plan == memory.plan_memory("Llama-3-8B", "H100-80GB", 8192, 16, block_size=BLOCK_SIZE)
    assert "131,072 B" in calc.text.value
    calc.model.value, calc.gpu.value, calc.tp.value = "Qwen2.5-72B", "H200", 4    # 131,072 tokens of context
    calc.kv_dtype.value, calc.seq_len.value = "fp8", 131072
    assert calc.plan == memory.plan_memory("Qwen2.5-72B", "H200", 131072, 16, "fp8", tp=4, block_size=BLOCK_SIZE)
    assert f"{calc.plan.max_batch_size:,} sequences" in calc.text.value
    calc.model.value = "custom"
    calc.custom["num_kv_heads"].value = 7  # 64 heads are not divisible by 7
    assert calc.plan is None and "not divisible" in calc.error and "impossible" in calc.text.value
    calc.custom["num_kv_heads"].value = 8
    assert calc.plan is not None and calc.plan.kv_bytes_per_token == 2 * 80 * 8 * 128 * 1 // 4  # fp8, tp=4


def test_live_calculator_refuses_contexts_beyond_the_model_and_shows_small_sizes():
    pytest.importorskip("ipywidgets")
    from paged_kv.widgets.memory import MemoryCalculator

    calc = MemoryCalculator(model="Llama-2-7B", gpu="A100-80GB", seq_len=4096, batch_size=1,
                            use_figure_widget=False)
    assert "beyond" not in calc.text.value and "4,096 tokens" in calc.text.value
    calc.seq_len.value = 8192  # meta-llama/Llama-2-7b-hf declares 4,096
    assert calc.plan is None and "impossible" in calc.text.value
    assert "8,192 tokens is beyond Llama-2-7B's maximum context of 4,096 tokens" in calc.text.value
    ctx = memory.model_preset("tiny").max_position
    calc.seq_len.value = ctx
    calc.model.value = "tiny"
    assert calc.plan is not None and calc.plan.seq_len == ctx
    per_seq = ctx * memory.kv_bytes_per_token("tiny")          # under 1 MiB: in KiB (KB), not "0.00 GiB"
    assert per_seq < 2**20 and f"{per_seq / 2**10:,.2f} KiB ({per_seq / 10**3:,.2f} KB)" in calc.text.value


def test_live_calculator_figure_widget_updates_in_place():
    pytest.importorskip("anywidget")
    from paged_kv.widgets.memory import MemoryCalculator

    calc = MemoryCalculator(use_figure_widget=None)
    assert calc.figure is not None
    calc.batch_size.value = 32
    kv = [t for t in calc.figure.data if t.name.startswith("KV cache")][0]
    assert kv.x[0] == pytest.approx(32 * memory.kv_cache_bytes("Llama-3-8B", 8192, 1) / GiB)


# --- the static calculator in a browser ------------------------------------------------------------
@pytest.mark.browser
def test_static_calculator_in_headless_chromium(tmp_path, calc_data):
    sync_api = pytest.importorskip("playwright.sync_api")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium")
    import plotly
    import plotly.io as pio

    plotly_js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    page_file = tmp_path / "calc.html"
    fig = vc.calculator_figure(calc_data, model="Llama-3-8B", gpu="A100-80GB", context_index=0)
    page_file.write_text(pio.to_html(fig, include_plotlyjs=False, full_html=True).replace(
        "<head>", f"<head><script>{plotly_js.read_text()}</script>", 1))
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1000, "height": 1100})
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(page_file.as_uri())
        page.wait_for_selector(".js-plotly-plot .table")

        def pick(menu: int, label: str) -> None:
            page.query_selector_all(".updatemenu-header-group")[menu].click()
            page.locator(".updatemenu-item-text", has_text=label).first.click()
            page.wait_for_timeout(200)

        def visible_column(header: str) -> list:
            return page.evaluate("""h => { const gd = document.querySelector('.js-plotly-plot');
                const t = gd._fullData.filter(t => t.type === 'table' && t.visible === true);
                return t.length === 1 ? t[0].cells.values[%d] : null; }""" % vc.CALC_COLUMNS.index(header), header)

        pick(1, "H200")
        pick(0, "Llama-2-70B")  # serves 4,096 tokens: the 8K and 32K rows are dashes
        assert visible_column("max batch, TP=8") == [
            f"{memory.max_batch_size('Llama-2-70B', 'H200', c, tp=8):,}" if c <= 4096 else vc.DASH
            for c in CONTEXTS]
        rendered = page.evaluate("() => Array.from(document.querySelectorAll('.cell-text')).map(e => e.textContent)")
        assert f"{memory.max_batch_size('Llama-2-70B', 'H200', 2048, tp=8):,}" in rendered
        pick(1, "T4")
        assert visible_column("max batch") == [vc.NO_ROOM, vc.DASH, vc.DASH]
        pick(0, "Llama-3-8B")  # a new model restyles the greyed rows too
        colors = page.evaluate("""() => { const gd = document.querySelector('.js-plotly-plot');
            return gd._fullData.filter(t => t.type === 'table' && t.visible === true)[0].cells.font.color[0]; }""")
        assert visible_column("max batch") == [vc.NO_ROOM, vc.NO_ROOM, vc.DASH]
        assert colors[2] == vc.GREY and colors[0] != vc.GREY
        box = page.locator(".slider-label", has_text="32K").first.bounding_box()
        page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)  # the rail takes it
        page.wait_for_timeout(300)
        state = page.evaluate("""() => { const gd = document.querySelector('.js-plotly-plot');
            const t = gd._fullData.filter(t => t.type === 'table' && t.visible === true)[0];
            return [gd.layout.shapes[0].x0, t.cells.fill.color[0]]; }""")
        assert state[0] == 2 and state[1][2] == "#FFF3C4" and state[1][0] != "#FFF3C4"
        assert errors == []
        browser.close()


@pytest.mark.parametrize("preset", ["Mistral-7B", "Gemma-2-9B", "DeepSeek-V3", "Llama-3-8B", "OPT-13B"])
def test_live_calculator_custom_starts_from_the_whole_preset(preset):
    """Switching to custom changes nothing: the window (Mistral, Gemma-2), the MLA latent and fp8
    weights (DeepSeek-V3) are copied and shown, and the plan is the preset's."""
    pytest.importorskip("ipywidgets")
    from paged_kv.widgets.memory import MemoryCalculator

    seq_len = min(32768, memory.model_preset(preset).max_position)     # the calculator refuses more
    calc = MemoryCalculator(model=preset, gpu="H200", seq_len=seq_len, batch_size=2, tp=8,
                            use_figure_widget=False)
    before = calc.plan
    calc.model.value = "custom"
    after = calc.plan
    assert after is not None
    fields = ("kv_bytes_per_token", "kv_bytes_per_sequence", "weights_bytes", "max_batch_size",
              "weights_dtype", "max_position")
    assert {f: getattr(after, f) for f in fields} == {f: getattr(before, f) for f in fields}
    spec = memory.model_preset(preset)
    assert calc.custom["sliding_window"].value == (spec.sliding_window or 0)
    assert calc.custom["kv_lora_rank"].value == spec.kv_lora_rank
    assert calc.custom["weights_dtype"].value == spec.weights_dtype
    if preset == "Mistral-7B":   # clearing the window is visible and changes the cache
        calc.custom["sliding_window"].value = 0     # 32,768 tokens = 2,048 blocks of 16 per layer
        window_blocks = memory.window_max_blocks(4096, BLOCK_SIZE)  # not 4,096 / 16 = 256
        assert calc.plan.kv_bytes_per_sequence * window_blocks == 2048 * before.kv_bytes_per_sequence
        no_window = calc.plan.kv_bytes_per_sequence
        calc.custom["sliding_window"].value = 4096  # and clearing the layers instead does the same
        calc.custom["sliding_layers"].value = 0
        assert calc.error == "" and calc.plan.kv_bytes_per_sequence == no_window


def test_live_calculator_hides_the_figure_when_impossible():
    pytest.importorskip("ipywidgets")
    from paged_kv.widgets.memory import MemoryCalculator

    calc = MemoryCalculator(use_figure_widget=False)
    assert calc._figure_box.layout.display == ""
    calc.tp.value = 16          # Llama-3-8B: 8 KV heads replicated twice is fine
    assert calc.plan is not None and calc.plan.kv_bytes_per_token == 32 * 2 * 1 * 128 * 2
    calc.model.value = "Qwen3-4B"
    calc.tp.value = 32          # 32 query heads over 32 GPUs, 8 KV heads: fine; now make it impossible
    calc.model.value = "Gemma-2-9B"   # 16 query heads cannot split over 32
    assert calc.plan is None and "16 query heads" in calc.error
    assert calc._figure_box.layout.display == "none"
    calc.tp.value, calc.pp.value = 8, 2
    assert calc.plan is not None and calc._figure_box.layout.display == ""
    assert "TP=8 x PP=2" in calc.text.value


@pytest.mark.browser
@pytest.mark.parametrize("width", [1280, 400])
def test_static_calculator_highlighted_row_is_visible(tmp_path, width):
    """The last row (131,072 tokens) highlighted: it lies inside the table's area, not clipped
    below it, in a 1280 px window and on a 400 px phone."""
    sync_api = pytest.importorskip("playwright.sync_api")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium")
    import plotly
    import plotly.io as pio

    data = vc.calculator_data(["Llama-3-8B", "DeepSeek-V3"], ["H100-80GB", "T4"])
    last = len(data["contexts"]) - 1
    fig = vc.calculator_figure(data, model="DeepSeek-V3", gpu="H100-80GB", context_index=last)
    plotly_js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    page_file = tmp_path / "calc.html"
    page_file.write_text(pio.to_html(fig, include_plotlyjs=False, full_html=True, config={"responsive": True})
                         .replace("<head>", f"<head><script>{plotly_js.read_text()}</script>", 1))
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": width, "height": 1000})
        page.goto(page_file.as_uri())
        page.wait_for_selector(".js-plotly-plot .table")
        page.wait_for_timeout(500)
        box = page.evaluate("""() => {
            const gd = document.querySelector('.js-plotly-plot'), s = gd._fullLayout._size;
            const t = gd._fullData.filter(t => t.type === 'table' && t.visible === true)[0];
            const top = gd.getBoundingClientRect().top + s.t + (1 - t.domain.y[1]) * s.h;
            const bottom = gd.getBoundingClientRect().top + s.t + (1 - t.domain.y[0]) * s.h;
            const cell = Array.from(document.querySelectorAll('.table .cell-text'))
                .filter(e => e.textContent.startsWith('131,072'))[0].getBoundingClientRect();
            const legend = document.querySelector('.legend').getBoundingClientRect();
            const slider = document.querySelector('.slider-container').getBoundingClientRect();
            return {top, bottom, cell_top: cell.top, cell_bottom: cell.bottom,
                    legend_top: legend.top, legend_bottom: legend.bottom, slider_top: slider.top,
                    page: document.documentElement.scrollWidth};
        }""")
        browser.close()
    assert box["top"] <= box["cell_top"] and box["cell_bottom"] <= box["bottom"], box
    assert box["page"] <= width   # nothing pushes the page wider than the window
    # the legend lies below every table row and above the slider (review D9: at 400 px the rows slid
    # under a legend placed between the table and the chart)
    assert box["cell_bottom"] <= box["legend_top"] and box["legend_bottom"] <= box["slider_top"] + 1, box


# --- sliding windows in whole blocks ----------------------------------------------------------------
def test_static_calculator_counts_sliding_layers_in_whole_blocks(calc_data):
    """Mistral-7B past its 4,096-token window: the table's sequence is paged (each of the 32 layers
    at its peak of 257 blocks of 16, not 256), and the model note says so."""
    assert calc_data["block_size"] == BLOCK_SIZE == 16
    m = calc_data["models"]["Mistral-7B"]
    rows = {r["context"]: r for r in m["cases"]["H200"]}
    paged = memory.kv_cache_bytes("Mistral-7B", 8192, 1, block_size=16)
    assert rows[8192]["per_seq"] == paged == 32 * memory.window_max_blocks(4096, 16) * 16 * 4096
    assert paged > memory.kv_cache_bytes("Mistral-7B", 8192, 1)      # the unpaged count is lower
    assert rows[8192]["batch"] == memory.plan_memory("Mistral-7B", "H200", 8192, block_size=16).max_batch_size
    fig = vc.calculator_figure(calc_data, model="Mistral-7B", gpu="H200")
    note = fig.layout.annotations[0].text
    assert "sliding window 4,096 on 32 layers, each ≤ 257 blocks of 16" in note
    llama = [b for b in fig.layout.updatemenus[0].buttons if b.label == "Llama-3-8B"][0]
    assert "sliding" not in llama.args[1]["annotations[0].text"]


def test_live_calculator_block_size_changes_the_plan():
    pytest.importorskip("ipywidgets")
    from paged_kv.widgets.memory import MemoryCalculator

    calc = MemoryCalculator(model="Gemma-2-9B", gpu="H200", seq_len=8192, batch_size=4, use_figure_widget=False)
    assert calc.block_size.value == BLOCK_SIZE and calc.plan.block_size == BLOCK_SIZE
    assert f"{memory.window_max_blocks(4096, BLOCK_SIZE):,} blocks" in calc.text.value
    calc.block_size.value = 1                     # per token: the unpaged ledger
    assert calc.plan.kv_bytes_per_sequence == memory.kv_cache_bytes("Gemma-2-9B", 8192, 1)
    assert "(per token)" in calc.text.value
    calc.block_size.value = 128
    assert calc.plan == memory.plan_memory("Gemma-2-9B", "H200", 8192, 4, block_size=128)
    assert "whole blocks of 128 tokens" in calc.text.value
