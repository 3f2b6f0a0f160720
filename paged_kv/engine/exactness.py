"""Is a prefix-cache hit exact?  The same greedy request with caching off and on, logits side by side
(chapter 8, "Is it exact?").

A cache-on run computes the same function as a cache-off one, in another order: the prompt's
cached blocks were written by an earlier request's pass, and only the uncached suffix is prefilled
now, a pass of other shapes (:mod:`paged_kv.model.reduction`).  So the logits may differ in their
last bits, and at reduced precision a greedy token may flip where the top two are nearly tied
(vLLM issue #40896, lmdeploy #1719, SGLang #34683).  :func:`compare_cache_on_off` measures it:
two engines that differ only in ``enable_prefix_caching`` serve the same two requests one after
the other (``warm`` fills the cache, then ``prompt`` hits it), greedy, and every step's logits of
``prompt`` are kept.

Legend: V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import PromptError
from ..model.reduction_order import ReductionOrder, check_reduction
from ..sampling_params import SamplingParams
from ..validate import count, read_record
from .config import EngineConfig
from .llm_engine import LLMEngine

__all__ = ["CacheComparison", "FLIP_SEARCH_PATH", "compare_cache_on_off", "load_flip_search"]

# Where scripts/find_greedy_flips.py records its last search (next to benchmarks/gpu_results.json).
FLIP_SEARCH_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "greedy_flips.json"


@dataclass(frozen=True)
class CacheComparison:
    """One request served with caching off and on (:func:`compare_cache_on_off`).

    Attributes:
        dtype: the model's dtype, e.g. ``"bfloat16"``.
        reduction: the engine's :class:`~paged_kv.model.reduction.ReductionOrder` (``None``: the
            references' own order).
        cached_tokens: prompt tokens the cache-on run took from the cache.
        tokens_off, tokens_on: the greedy output tokens of each run.
        steps_compared: steps whose logits both runs computed from the same tokens (all of them,
            or up to and including the first step that chose differently).
        max_abs_diff: the largest ``|logit_on - logit_off|`` over those steps and the vocabulary.
        first_difference: the index of the first output token that differs, or ``None``.
        margin: at that step, how far apart the two chosen tokens' logits are in the cache-off
            run (``logit_off[token_off] - logit_off[token_on] >= 0``: a near tie), else ``None``.
    """

    dtype: str
    reduction: ReductionOrder | None
    cached_tokens: int
    tokens_off: tuple[int, ...]
    tokens_on: tuple[int, ...]
    steps_compared: int
    max_abs_diff: float
    first_difference: int | None
    margin: float | None

    @property
    def flipped(self) -> bool:
        """Whether the greedy outputs differ."""
        return self.first_difference is not None

    @property
    def bit_identical(self) -> bool:
        """Whether every compared logit is equal to the last bit (and so every token)."""
        return self.max_abs_diff == 0.0 and not self.flipped


def _greedy_run(model, config: EngineConfig, requests: list[list[int]], max_tokens: int):
    """Serve ``requests`` one after the other on one engine, greedy; returns the last one's tokens,
    the logits ``[V]`` of each of its steps that sampled, and its prompt tokens hit in the cache."""
    engine = LLMEngine(model, config)
    runner, steps = engine.runner, []

    class Tap:                       # the runner, keeping each step's logits (the engine drops them)
        def execute(self, out):
            result = runner.execute(out)
            steps.append(result.logits)
            return result

    engine.runner = Tap()
    out = None
    for i, r in enumerate(requests):       # the earlier ones only fill the cache: one token each
        steps.clear()
        params = SamplingParams(max_tokens=max_tokens if i == len(requests) - 1 else 1)
        out = engine.output(engine.add_request(r, params))
        while engine.has_unfinished_requests():
            engine.step()
        if out.error is not None:
            raise PromptError(f"request {out.request_id} failed: {out.error}")
    seq = out.request.seqs[0].seq_id
    logits = [s[seq] for s in steps if seq in s]
    return list(out.token_ids[0]), logits, sum(out.cached_tokens[:1])


def compare_cache_on_off(model, warm, prompt, reduction: ReductionOrder | None = None, max_tokens: int = 16,
                         block_size: int = 4, num_gpu_blocks: int = 256) -> CacheComparison:
    """Serve ``warm`` then ``prompt`` (token ids) greedily with prefix caching off, then on, on
    engines that differ in nothing else, and compare ``prompt``'s logits step by step.

    ``prompt`` should share whole blocks with ``warm`` (a system prompt), so that the cache-on run
    hits them; with caching off it recomputes them in one pass with its own tokens.

    Args:
        model: the :class:`~paged_kv.model.TinyLlama` (its dtype is the compared precision).
        warm, prompt: token-id lists.
        reduction: the engines' ``reduction`` (torch backend).
        max_tokens: greedy tokens per request.
        block_size, num_gpu_blocks: the pool (ample: no preemption).

    Returns:
        A :class:`CacheComparison`.

    Raises:
        ConfigError: a bad knob or reduction; PromptError: a bad prompt or a failed request.
    """
    check_reduction(reduction)
    max_tokens = count("max_tokens", max_tokens, 1)
    runs = {}
    for caching in (False, True):
        config = EngineConfig(block_size=block_size, num_gpu_blocks=num_gpu_blocks, watermark=0.0,
                              enable_prefix_caching=caching, reduction=reduction)
        runs[caching] = _greedy_run(model, config, [list(warm), list(prompt)], max_tokens)
    (off, logits_off, _), (on, logits_on, hits) = runs[False], runs[True]
    first = next((i for i, (a, b) in enumerate(zip(off, on)) if a != b), None)
    if first is None and len(off) != len(on):
        first = min(len(off), len(on))
    n = min(len(logits_off), len(logits_on)) if first is None else first + 1
    diff = max((float((a - b).abs().max()) for a, b in zip(logits_off[:n], logits_on[:n])), default=0.0)
    margin = None
    if first is not None and first < min(len(off), len(on)):
        row = logits_off[first]
        margin = float(row[off[first]] - row[on[first]])
    return CacheComparison(str(model.dtype).replace("torch.", ""), reduction, hits, tuple(off), tuple(on),
                           n, diff, first, margin)


def load_flip_search(path: str | Path | None = None) -> dict | None:
    """The search ``scripts/find_greedy_flips.py`` last recorded at ``path`` (default
    :data:`FLIP_SEARCH_PATH`), or ``None`` if none was (an installed package has none).

    Raises:
        ConfigError: the file exists but is not such a record (bad JSON or a missing field).
    """
    path = Path(path) if path is not None else FLIP_SEARCH_PATH
    return read_record(path, ("date", "torch", "cpu", "trials", "max_tokens", "results"),
                       "scripts/find_greedy_flips.py")

