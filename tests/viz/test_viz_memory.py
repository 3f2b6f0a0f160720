"""Chapter 3's figures (paged_kv.viz.memory): the numbers they carry equal paged_kv.memory's, and
contexts beyond a model's maximum are never drawn as servable."""

import math

from paged_kv import memory
from paged_kv.viz import memory as vm


def test_kv_vs_weights_carries_the_ledger():
    data = vm.kv_vs_weights_data(["Llama-3-8B", "Mistral-7B"], [1024, 4096, 65536], batch_sizes=(1, 4))
    fig = vm.kv_vs_weights_figure(data)
    assert len(fig.data) == 2 and len(fig.layout.updatemenus[0].buttons) == 2
    # config.json max_position_embeddings: Meta-Llama-3-8B 8,192, Mistral-7B-v0.1 32,768; each
    # line stops at that maximum (an extra point) and never reaches 65,536
    llama_x, mistral_x = [1024, 4096, 8192], [1024, 4096, 32768]
    assert list(fig.data[0].x) == llama_x and list(fig.data[1].x) == mistral_x
    w = memory.weights_bytes("Mistral-7B")
    batch4 = fig.layout.updatemenus[0].buttons[1].args[0]["y"][1]
    assert list(batch4) == [4 * memory.kv_cache_bytes("Mistral-7B", c, 1) / w for c in mistral_x]
    assert list(fig.data[0].y) == [memory.kv_cache_bytes("Llama-3-8B", c, 1) / memory.weights_bytes("Llama-3-8B")
                                   for c in llama_x]
    assert list(fig.data[0].marker.symbol) == ["circle", "circle", "diamond"]  # the maximum, marked
    assert "maximum context" in fig.layout.title.text


def test_kv_vs_weights_keeps_a_grid_point_at_the_maximum_once():
    data = vm.kv_vs_weights_data(["Llama-2-7B", "DeepSeek-V3"], [1024, 4096, 131072])
    assert data["models"]["Llama-2-7B"]["contexts"] == [1024, 4096]  # meta-llama/Llama-2-7b-hf: 4,096
    assert data["models"]["DeepSeek-V3"]["contexts"] == [1024, 4096, 131072]  # 163,840: past the chart


def test_gpu_fit_slider_steps_are_max_batch_sizes():
    data = vm.gpu_fit_data(["Llama-3-8B", "Qwen3-4B"], ["T4", "H200"], contexts=[1024, 4096])
    fig = vm.gpu_fit_figure(data)
    steps = fig.layout.sliders[0].steps
    assert [s.label for s in steps] == ["1K", "4K"]
    h200_at_4k = steps[1].args[0]["x"][1]
    assert list(h200_at_4k) == [memory.max_batch_size(m, "H200", 4096) for m in ("Llama-3-8B", "Qwen3-4B")]
    # Llama-3-8B: its weights leave no room on a T4, so no dot and no label; models are the rows
    assert list(fig.data[0].y) == ["Llama-3-8B", "Qwen3-4B"]
    assert list(fig.data[0].x) == [None, memory.max_batch_size("Qwen3-4B", "T4", 1024)]
    assert list(fig.data[0].text) == ["", f"{memory.max_batch_size('Qwen3-4B', 'T4', 1024):,}"]


def test_gpu_fit_marks_contexts_beyond_a_models_maximum():
    # OPT-13B serves 2,048 tokens, Llama-2-7B 4,096 (their config.json); Qwen3-4B 40,960
    models = ["OPT-13B", "Llama-2-7B", "Qwen3-4B"]
    data = vm.gpu_fit_data(models, ["H200"], contexts=[2048, 4096, 32768])
    fig = vm.gpu_fit_figure(data)
    steps = fig.layout.sliders[0].steps
    at = {s.label: s.args for s in steps}
    assert list(at["2K"][0]["x"][0]) == [memory.max_batch_size(m, "H200", 2048) for m in models]
    assert list(at["4K"][0]["x"][0])[0] is None and at["4K"][0]["x"][0][1] > 0
    assert list(at["32K"][0]["x"][0])[:2] == [None, None]
    assert at["32K"][0]["x"][0][2] == memory.max_batch_size("Qwen3-4B", "H200", 32768)
    marks = lambda step: sorted(a["y"] for a in at[step][1]["annotations"])
    assert marks("2K") == [] and marks("4K") == ["OPT-13B"] and marks("32K") == ["Llama-2-7B", "OPT-13B"]
    assert all(vm.BEYOND in a["text"] for a in at["32K"][1]["annotations"])
    assert "max 2K" in fig.layout.yaxis.ticktext[0]


def test_gpu_fit_draws_dots_on_its_log_axis_inside_a_fixed_range():
    # a bar's length on a log axis means nothing: dots, labelled, at powers of ten only; one row per
    # model, each GPU's dot on its own line within the row, its label to its right (review c4)
    data = vm.gpu_fit_data(["Qwen3-4B", "Llama-2-7B"], list(memory.GPU_PRESETS), contexts=[1024, 4096])
    fig = vm.gpu_fit_figure(data)
    assert all(t.type == "scatter" and t.mode == "markers+text" and t.orientation == "h"
               and t.textposition == "middle right" for t in fig.data)
    assert fig.layout.scattermode == "group"
    assert fig.layout.xaxis.type == "log" and fig.layout.xaxis.dtick == 1
    largest = max(v for c in data["batch"] for g in data["batch"][c] for v in data["batch"][c][g])
    low, high = fig.layout.xaxis.range
    assert low < 0 and high >= math.log10(largest) + 0.5  # room above the tallest bar for its label


def test_attention_variants_figure():
    data = vm.attention_variants_data("Llama-2-70B", tp=8)
    per_token = {r["kind"]: (r["whole"], r["per_gpu"]) for r in data["rows"]}
    assert per_token["MHA"] == (2 * 80 * 64 * 128 * 2, 2 * 80 * 8 * 128 * 2)
    assert per_token["MQA"][0] == per_token["MQA"][1]  # one KV head, replicated on all 8 GPUs
    assert per_token["MLA"] == (80 * 576 * 2,) * 2
    fig = vm.attention_variants_figure(data)
    assert [round(v * 1024) for v in fig.data[0].x] == [r["whole"] for r in data["rows"]]
    assert fig.layout.xaxis.type != "log"   # bars: lengths proportional to the bytes
    # horizontal bars, labels at their ends: short bars' labels cannot run into each other (review c5)
    assert all(t.orientation == "h" and t.textposition == "outside" for t in fig.data)
    assert fig.layout.xaxis.range[1] > max(r["whole"] for r in data["rows"]) / 1024  # room for the label
