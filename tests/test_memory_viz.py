"""Chapter 3's figures and calculators: the numbers they carry equal paged_kv.memory's, the static
calculator's three controls stay consistent, and it works in headless Chromium with no kernel."""

import shutil
from pathlib import Path

import pytest

from paged_kv import memory
from paged_kv.viz import memory as vm

MODELS = ["Llama-3-8B", "Llama-2-70B", "DeepSeek-V3", "Mistral-7B"]
GPUS = ["T4", "A100-80GB", "H200"]
CONTEXTS = [2048, 8192, 32768]


@pytest.fixture(scope="module")
def calc_data():
    return vm.calculator_data(MODELS, GPUS, CONTEXTS, tps=(1, 8))


def test_kv_vs_weights_carries_the_ledger():
    data = vm.kv_vs_weights_data(["Llama-3-8B", "Mistral-7B"], [1024, 65536], batch_sizes=(1, 4))
    fig = vm.kv_vs_weights_figure(data)
    assert len(fig.data) == 2 and len(fig.layout.updatemenus[0].buttons) == 2
    w = memory.weights_bytes("Mistral-7B")
    batch4 = fig.layout.updatemenus[0].buttons[1].args[0]["y"][1]
    assert list(batch4) == [4 * memory.kv_cache_bytes("Mistral-7B", c, 1) / w for c in (1024, 65536)]
    assert list(fig.data[0].y) == [memory.kv_cache_bytes("Llama-3-8B", c, 1) / memory.weights_bytes("Llama-3-8B")
                                   for c in (1024, 65536)]


def test_gpu_fit_slider_steps_are_max_batch_sizes():
    data = vm.gpu_fit_data(["Llama-3-8B", "Qwen3-4B"], ["T4", "H200"], contexts=[1024, 4096])
    fig = vm.gpu_fit_figure(data)
    steps = fig.layout.sliders[0].steps
    assert [s.label for s in steps] == ["1K", "4K"]
    h200_at_4k = steps[1].args[0]["y"][1]
    assert list(h200_at_4k) == [memory.max_batch_size(m, "H200", 4096) for m in ("Llama-3-8B", "Qwen3-4B")]
    assert list(fig.data[0].y) == [0, memory.max_batch_size("Qwen3-4B", "T4", 1024)]  # Llama-3-8B: no room on a T4


def test_attention_variants_figure():
    data = vm.attention_variants_data("Llama-2-70B", tp=8)
    per_token = {r["kind"]: (r["whole"], r["per_gpu"]) for r in data["rows"]}
    assert per_token["MHA"] == (2 * 80 * 64 * 128 * 2, 2 * 80 * 8 * 128 * 2)
    assert per_token["MQA"][0] == per_token["MQA"][1]  # one KV head, replicated on all 8 GPUs
    assert per_token["MLA"] == (80 * 576 * 2,) * 2
    fig = vm.attention_variants_figure(data)
    assert [round(v * 1024) for v in fig.data[0].y] == [r["whole"] for r in data["rows"]]


def _column(cells, header):
    return cells[vm.CALC_COLUMNS.index(header)]


def test_static_calculator_every_choice_matches_the_package(calc_data):
    fig = vm.calculator_figure(calc_data, model="Llama-3-8B", gpu="A100-80GB", context_index=1)
    model_menu, gpu_menu = fig.layout.updatemenus
    assert [b.label for b in model_menu.buttons] == MODELS and [b.label for b in gpu_menu.buttons] == GPUS
    tables = [i for i, t in enumerate(fig.data) if t.type == "table"]
    assert len(tables) == len(GPUS)
    for mb in model_menu.buttons:
        cells = mb.args[0]["cells.values"]
        for gi, g in enumerate(GPUS):
            col = _column(cells[tables[gi]], "max batch")
            for ci, c in enumerate(CONTEXTS):
                plan = memory.plan_memory(mb.label, g, c)
                assert col[ci] == (f"{plan.max_batch_size:,}" if plan.weights_fit else vm.NO_ROOM)
            tp8 = _column(cells[tables[gi]], "max batch, TP=8")
            plan = memory.plan_memory(mb.label, g, CONTEXTS[-1], tp=8)
            assert tp8[-1] == (f"{plan.max_batch_size:,}" if plan.weights_fit else vm.NO_ROOM)
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
    fig = vm.calculator_figure(calc_data, model="Llama-2-70B", gpu="H200", context_index=2)
    shown = [t for t in fig.data if t.type == "table" and t.visible]
    assert len(shown) == 1
    per_seq = _column(shown[0].cells.values, "KV / sequence")[2]
    assert per_seq == f"{memory.kv_cache_bytes('Llama-2-70B', 32768, 1) / memory.GiB:,.3f} GiB"
    assert fig.layout.shapes[0].x0 == 2


# --- the live calculator ---------------------------------------------------------------------------
def test_live_calculator_follows_its_widgets():
    pytest.importorskip("ipywidgets")
    from paged_kv.widgets.memory import MemoryCalculator

    calc = MemoryCalculator(use_figure_widget=False)
    assert calc.plan == memory.plan_memory("Llama-3-8B", "H100-80GB", 8192, 16)
    assert "131,072 B" in calc.text.value
    calc.model.value, calc.gpu.value, calc.tp.value = "Llama-3-70B", "H200", 4
    calc.kv_dtype.value, calc.seq_len.value = "fp8", 131072
    assert calc.plan == memory.plan_memory("Llama-3-70B", "H200", 131072, 16, "fp8", tp=4)
    assert f"{calc.plan.max_batch_size:,} sequences" in calc.text.value
    calc.model.value = "custom"
    calc.custom["num_kv_heads"].value = 7  # 64 heads are not divisible by 7
    assert calc.plan is None and "not divisible" in calc.error and "impossible" in calc.text.value
    calc.custom["num_kv_heads"].value = 8
    assert calc.plan is not None and calc.plan.kv_bytes_per_token == 2 * 80 * 8 * 128 * 1 // 4  # fp8, tp=4


def test_live_calculator_figure_widget_updates_in_place():
    pytest.importorskip("anywidget")
    from paged_kv.widgets.memory import MemoryCalculator

    calc = MemoryCalculator(use_figure_widget=None)
    assert calc.figure is not None
    calc.batch_size.value = 32
    kv = [t for t in calc.figure.data if t.name.startswith("KV cache")][0]
    assert kv.x[0] == pytest.approx(32 * memory.kv_cache_bytes("Llama-3-8B", 8192, 1) / memory.GiB)


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
    fig = vm.calculator_figure(calc_data, model="Llama-3-8B", gpu="A100-80GB", context_index=0)
    page_file.write_text(pio.to_html(fig, include_plotlyjs=False, full_html=True).replace(
        "<head>", f"<head><script>{plotly_js.read_text()}</script>", 1))
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1000, "height": 900})
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
                return t.length === 1 ? t[0].cells.values[%d] : null; }""" % vm.CALC_COLUMNS.index(header), header)

        pick(1, "H200")
        pick(0, "Llama-2-70B")
        assert visible_column("max batch, TP=8") == [
            f"{memory.max_batch_size('Llama-2-70B', 'H200', c, tp=8):,}" for c in CONTEXTS]
        rendered = page.evaluate("() => Array.from(document.querySelectorAll('.cell-text')).map(e => e.textContent)")
        assert f"{memory.max_batch_size('Llama-2-70B', 'H200', 2048, tp=8):,}" in rendered
        pick(1, "T4")
        assert visible_column("max batch") == [vm.NO_ROOM] * len(CONTEXTS)
        box = page.locator(".slider-label", has_text="32K").first.bounding_box()
        page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)  # the rail takes it
        page.wait_for_timeout(300)
        state = page.evaluate("""() => { const gd = document.querySelector('.js-plotly-plot');
            const t = gd._fullData.filter(t => t.type === 'table' && t.visible === true)[0];
            return [gd.layout.shapes[0].x0, t.cells.fill.color[0]]; }""")
        assert state[0] == 2 and state[1][2] == "#FFF3C4" and state[1][0] != "#FFF3C4"
        assert errors == []
        browser.close()
