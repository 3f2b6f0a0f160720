"""Cache on against cache off, logits side by side (paged_kv/engine/exactness.py): the fixed split
gives the same bits on awkward prompts and block sizes, in fp32 and bf16; the comparison itself
against a brute force; the engine's knob refuses what it cannot run."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from paged_kv.engine import EngineConfig, LLMEngine
from paged_kv.engine.exactness import CacheComparison, compare_cache_on_off, load_flip_search
from paged_kv.errors import ConfigError
from paged_kv.model import SamplingParams, load_tiny_model
from paged_kv.model.reduction import ReductionOrder

FIXED, NATURAL = ReductionOrder(16, batch_invariant=True), ReductionOrder(16)


@pytest.fixture(scope="module")
def models():
    torch.set_num_threads(1)
    return {dt: load_tiny_model(dtype=dt) for dt in (torch.float32, torch.bfloat16)}


def encode(models, text):
    return models[torch.float32][1].encode(text)


# (warm, prompt, block_size): the hit ends inside a 16-key tile, on one, at a block of 1 or 3,
# and the full hit (the prompt is the warm request's: its last token alone, through the decode path)
AWKWARD = [
    ("ROMEO:\nBut soft, what light through yonder window breaks? And so", "ROMEO:\nBut soft, what light through yonder window breaks? It is", 4),
    ("HAMLET:\nTo be, or not to be, that is the q", "HAMLET:\nTo be, or not to be, thus", 3),
    ("0123456789abcdefghijklmnopqrstuvWXYZ", "0123456789abcdefghijklmnopqrstuv!", 16),
    ("JULIET:\nO Romeo, Romeo! wherefore", "JULIET:\nO Romeo, Romeo! wherefore", 4),
    ("PUCK:\nLord, what fools", "PUCK:\nLord, what fun", 1),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("warm, prompt, block_size", AWKWARD,
                         ids=["hit-mid-tile", "block-3", "block-16-on-the-grid", "full-hit", "block-1"])
def test_the_fixed_split_gives_the_same_bits_with_the_cache_on(models, dtype, warm, prompt, block_size):
    c = compare_cache_on_off(models[dtype][0], encode(models, warm), encode(models, prompt), FIXED,
                             max_tokens=4, block_size=block_size)
    assert c.cached_tokens > 0                                    # a real hit, not a vacuous pass
    assert c.bit_identical and c.max_abs_diff == 0.0 and c.tokens_on == c.tokens_off, c
    assert c.steps_compared == 4 and c.margin is None


def test_the_natural_split_is_allowed_to_differ_and_the_comparison_sees_it(models):
    warm, prompt, bs = AWKWARD[0]
    c = compare_cache_on_off(models[torch.bfloat16][0], encode(models, warm), encode(models, prompt), NATURAL,
                             max_tokens=4, block_size=bs)
    assert c.cached_tokens == 56 and not c.bit_identical and c.max_abs_diff > 0


def brute_force(model, warm, prompt, caching, reduction, max_tokens, block_size):
    """The comparison's run by hand: an engine's step loop over the two requests, the prompt's
    logits read from every ModelRunnerOutput."""
    e = LLMEngine(model, EngineConfig(block_size=block_size, num_gpu_blocks=256, watermark=0.0,
                                      enable_prefix_caching=caching, reduction=reduction))
    e.add_request(warm, SamplingParams(max_tokens=1))
    while e.has_unfinished_requests():
        e.step()
    rid = e.add_request(prompt, SamplingParams(max_tokens=max_tokens))
    logits = []
    while e.has_unfinished_requests():
        out = e.scheduler.schedule()
        result = e.runner.execute(out)
        e.scheduler.update(out, result.sampled_token_ids, result.failed)
        logits += list(result.logits.values())
    return e.output(rid).token_ids[0], logits


def test_the_comparison_against_the_step_loop_by_hand(models):
    model = models[torch.bfloat16][0]
    warm, prompt = encode(models, "MACBETH:\nTo-morrow, and to-morrow, and"), encode(models, "MACBETH:\nTo-morrow, and to-morrow, or")
    c = compare_cache_on_off(model, warm, prompt, NATURAL, max_tokens=5, block_size=4)
    off, l_off = brute_force(model, warm, prompt, False, NATURAL, 5, 4)
    on, l_on = brute_force(model, warm, prompt, True, NATURAL, 5, 4)
    assert list(c.tokens_off) == off and list(c.tokens_on) == on
    first = next((i for i, (a, b) in enumerate(zip(off, on)) if a != b), None)
    assert c.first_difference == first
    n = 5 if first is None else first + 1
    assert c.steps_compared == n
    assert c.max_abs_diff == max(float((a - b).abs().max()) for a, b in zip(l_off[:n], l_on[:n]))
    assert c.cached_tokens == 32


def test_a_flip_reports_its_step_and_margin():
    c = CacheComparison("bfloat16", NATURAL, 8, (1, 2, 3), (1, 2, 4), 3, 0.25, 2, 0.0)
    assert c.flipped and not c.bit_identical
    same = CacheComparison("float32", FIXED, 8, (1, 2), (1, 2), 2, 0.0, None, None)
    assert same.bit_identical and not same.flipped
    assert not CacheComparison("float32", NATURAL, 8, (1, 2), (1, 2), 2, 1e-6, None, None).bit_identical


@pytest.mark.parametrize("kw, match", [(dict(reduction="fixed"), "ReductionOrder or None, got 'fixed'"),
                                      (dict(reduction=FIXED, backend="triton"), "torch backend, got backend 'triton'")])
def test_the_engine_refuses_a_reduction_it_cannot_run(kw, match):
    with pytest.raises(ConfigError, match=match):
        EngineConfig(num_gpu_blocks=8, **kw)


def test_the_model_refuses_a_reduction_on_the_triton_backend(models):
    model = models[torch.float32][0]
    with pytest.raises(ConfigError, match="torch backend"):
        model(torch.tensor([[1, 2, 3]]), backend="triton", reduction=FIXED)
    with pytest.raises(ConfigError, match="ReductionOrder or None"):
        model(torch.tensor([[1, 2, 3]]), reduction=16)


def test_a_reduction_without_a_cache_is_the_paged_one(models):
    """Recompute (no cache) and the paged cache, one prompt, the fixed split: the same bits."""
    model, tok = models[torch.bfloat16]
    ids = tok.encode("VIOLA:\nIf music be the food of love")
    no_cache = model(torch.tensor([ids]), reduction=FIXED)[0, -1]
    _, logits = brute_force(model, ids[:3], ids, False, FIXED, 1, 4)
    assert torch.equal(logits[0], no_cache)


def test_load_flip_search(tmp_path):
    assert load_flip_search(tmp_path / "none.json") is None
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_flip_search(bad)
    bad.write_text(json.dumps({"date": "x"}))
    with pytest.raises(ConfigError, match="lacks the field"):
        load_flip_search(bad)
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"date": "d", "torch": "t", "cpu": "c", "trials": 1, "max_tokens": 2, "results": {}}))
    assert load_flip_search(good)["trials"] == 1


def test_the_search_script_writes_a_record_the_book_reads(tmp_path, capsys):
    path = Path(__file__).resolve().parents[2] / "scripts" / "find_greedy_flips.py"
    spec = importlib.util.spec_from_file_location("find_greedy_flips", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    warm, prompt = script.draw_pair(3)
    assert warm != prompt and warm[:20] == prompt[:20] and script.draw_pair(3) == (warm, prompt)
    out = tmp_path / "flips.json"
    record = script.main(["--trials", "1", "--max-tokens", "2", "--out", str(out)])
    assert load_flip_search(out) == json.loads(json.dumps(record))
    assert all(r["tried"] == 1 for r in record["results"].values())
    assert record["results"]["float32 fixed"]["bit_identical"] == 1 == record["results"]["bfloat16 fixed"]["bit_identical"]
    assert "bfloat16 natural" in capsys.readouterr().out
