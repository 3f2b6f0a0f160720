"""vLLM start-up logs (paged_kv.memory.vllm_log, paged_kv.memory.startup_logs): every stored log
reconciles line by line; the checks fire on a wrong number, model or dtype; the pool's pieces
against vLLM's own examples and a brute force."""

import pytest

from paged_kv import ConfigError
from paged_kv.memory import STARTUP_LOGS, explain_vllm_log, model_preset, parse_vllm_log, vllm_pool
from paged_kv.memory.vllm_log import VLLMPool

GiB = 2**30


@pytest.mark.parametrize("key", sorted(STARTUP_LOGS))
def test_every_stored_log_reconciles(key):
    log = STARTUP_LOGS[key]
    e = log.explain()
    decided = [c for c in e.checks if c.agrees is not None]
    assert decided, "a log with nothing checked proves nothing"
    assert all(c.agrees for c in decided), [c for c in decided if not c.agrees]
    # every concurrency and "needed" line the log prints got its own check
    parsed = parse_vllm_log(log.lines)
    lines = len(parsed.get("concurrency", [])) + len(parsed.get("needed", []))
    assert sum(c.line.startswith(("Maximum concurrency", "KV cache needed")) for c in e.checks) == lines
    assert e.reasons and log.unknown and log.url.endswith(str(log.number))


def test_stored_logs_cover_the_brief():
    kinds = {model_preset(log.model).attention_kind for log in STARTUP_LOGS.values()}
    assert {"GQA", "MLA"} <= kinds
    assert any(model_preset(log.model).sliding_window for log in STARTUP_LOGS.values())
    assert any(log.kv_cache_dtype.startswith("fp8") for log in STARTUP_LOGS.values())
    assert any(log.tp > 1 for log in STARTUP_LOGS.values())
    assert len({log.url for log in STARTUP_LOGS.values()}) >= 5


def test_qwen_pool_from_the_config_by_hand():
    # Qwen/Qwen3-0.6B config.json: 28 layers, 8 KV heads, head_dim 128, bf16; blocks of 16
    per_block = 16 * 2 * 28 * 8 * 128 * 2
    lo, hi = 69.655 * GiB, 69.665 * GiB            # "Available KV cache memory: 69.66 GiB"
    blocks = range(int(lo // per_block), int(hi // per_block) + 1)
    assert 652_144 in {b * 16 for b in blocks}     # "GPU KV cache size: 652,144 tokens"
    assert f"{652_144 // 16 / (4096 // 16):.2f}" == "159.21"
    pool = vllm_pool("Qwen3-0.6B")
    assert pool.block_bytes == per_block and pool.tokens(652_144 // 16) == 652_144


@pytest.mark.parametrize("change, to", [("159.21x", "160.21x"), ("652,144", "662,144"), ("69.66", "68.66")])
def test_a_wrong_number_is_caught(change, to):
    log = STARTUP_LOGS["qwen3-0.6b-a100"]
    e = explain_vllm_log(log.lines.replace(change, to), log.model, log.gpu)
    assert not e.all_agree


def test_a_wrong_model_or_dtype_is_caught():
    qwen = STARTUP_LOGS["qwen3-0.6b-a100"]
    assert not explain_vllm_log(qwen.lines, "Llama-3.1-8B", qwen.gpu).all_agree
    fp8 = STARTUP_LOGS["fp8-kv-100k"]
    assert fp8.explain().all_agree
    assert not explain_vllm_log(fp8.lines, fp8.model, kv_cache_dtype="auto").all_agree
    oss = STARTUP_LOGS["gpt-oss-120b-h100"]  # without the window, every layer would need 131,072 tokens
    dense = model_preset(oss.model).replace(sliding_window=None, sliding_layers=0)
    assert not explain_vllm_log(oss.lines, dense, oss.gpu, max_num_batched_tokens=1024).all_agree


def test_groups_follow_vllms_own_examples():
    # kv_cache_utils docstrings: (2 full, 3 sliding) -> 3 groups of 2; gpt-oss-20b + eagle (12 sw + 13
    # full) -> padded to 13 and 13; a uniform model -> one group of all its layers
    base = model_preset("Mistral-7B")
    two_three = base.replace(num_layers=5, sliding_layers=3)
    pool = vllm_pool(two_three)
    assert (pool.group_size, sorted(pool.groups)) == (2, ["full", "sliding", "sliding"])
    eagle = base.replace(num_layers=25, sliding_layers=12)
    assert (vllm_pool(eagle).group_size, len(vllm_pool(eagle).groups)) == (13, 2)
    assert vllm_pool("Llama-3-8B").groups == ("full",) and vllm_pool("Llama-3-8B").group_size == 32
    assert vllm_pool("Mistral-7B").groups == ("sliding",)


def test_mla_page_is_the_latent_on_every_gpu():
    for tp in (1, 8):
        pool = vllm_pool("DeepSeek-V3", tp=tp)
        assert pool.page_bytes == 16 * (512 + 64) * 2 and pool.group_size == 61


def test_blocks_per_request_brute_force():
    # a request holds cdiv(L, BS) blocks on a full layer; on a sliding layer vLLM reserves the window's
    # W - 1 tokens plus one step's tokens, capped at L, and one block more for a window that straddles
    for W, mnbt, L in [(128, 1024, 131072), (4096, 8192, 32768), (128, 1024, 500), (64, 16, 100)]:
        pool = VLLMPool(16, 1, 1, ("full", "sliding"), W)
        full = len(range(0, L, 16))
        held = min(W - 1 + mnbt, L)
        sliding = len(range(0, held, 16)) + 1
        assert pool.blocks_per_request(L, mnbt) == full + sliding


def test_longest_len_against_a_scan():
    pool = vllm_pool("gpt-oss-120b")
    budget = 40 * pool.block_bytes + 123
    scan = max(n for n in range(1, 2000) if pool.needed_bytes(n, 64) <= budget)
    assert pool.max_model_len_for(budget, 64, 2000) == scan
    assert pool.max_model_len_for(0, 64, 2000) == 0


def test_parser_keeps_the_printed_text():
    found = parse_vllm_log("INFO [kv_cache_utils.py:868] Maximum concurrency for 4,096 tokens per request: 159.21x\n"
                           "INFO Available KV cache memory: 69.66 GiB")
    assert found == {"concurrency": [("4,096", "159.21")], "available_gib": ["69.66"]}
    for bad in ("no numbers here", 42):
        with pytest.raises(ConfigError):
            parse_vllm_log(bad)
