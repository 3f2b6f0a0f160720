"""How a request picks its tokens: :class:`SamplingParams`, plain data (no torch), so a request
carries its own parameters through the bookkeeping; :func:`paged_kv.model.sample` applies them.

Field names as in vLLM's ``vllm/sampling_params.py``.  A leaf module: it imports only the
exceptions and the argument checks.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError
from .validate import count, real

__all__ = ["SamplingParams"]


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its tokens (field names as in vLLM's ``SamplingParams``).

    Attributes:
        temperature: ``0`` means greedy (argmax); otherwise logits are divided by it (> 0, any
            finite value: a tiny one approaches greedy, as the limit T -> 0 is; :func:`sample`
            computes it without overflow).
        top_k: keep only the k most likely tokens, >= 1 (``None``: all).
        top_p: keep the smallest set of tokens whose probability reaches ``top_p``
            (Holtzman et al. 2020), in ``(0, 1]``.
        seed: the request's seed, an int from 0 to ``2**64 - n`` (sample ``i`` draws from
            :func:`sample_generator` ``(seed, i)``, and a torch generator takes seeds below 2**64).  Required when ``temperature > 0`` (no run is silently unseeded);
            ignored when greedy.
        n: samples per request, >= 1 (parallel sampling, vLLM paper §4.4): with the paged cache
            they share the prompt's blocks.  Greedy ``n > 1`` would give ``n`` identical copies, so
            it is refused.
        max_tokens: tokens to generate per sample, >= 1 (the serving engine's stopping rule; the
            byte-level model has no end-of-sequence token).  :func:`paged_kv.decoding.generate`
            takes its own ``max_new_tokens`` instead.
        frequency_penalty: subtracted from a token's logit once per time the sample has already
            generated it (OpenAI's and vLLM's definition and range, -2 to 2; prompt tokens do not
            count; a negative one favours repeats).
        stop: strings that end a sample when its text contains one (they may span tokens, and
            bytes of one character); the text is cut before it unless
            ``include_stop_str_in_output``.  A str or a sequence of non-empty strs (vLLM's
            ``stop``); checked by the engine, which has the tokenizer.
        stop_token_ids: token ids that end a sample when sampled, checked by the scheduler; the
            token is kept in ``token_ids`` and its text left out of the text, as in vLLM.
        include_stop_str_in_output: keep the stop string, or the stop token's text, at the end of
            the text (default off).

    Raises:
        ConfigError: a field outside the range given above (the message names it), sampling
            without a seed, or greedy with ``n > 1``.
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    n: int = 1
    max_tokens: int = 16
    frequency_penalty: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        fix = lambda name, value: object.__setattr__(self, name, value)  # frozen dataclass
        fix("temperature", real("temperature (0 = greedy)", self.temperature, 0.0))
        if self.top_k is not None:
            fix("top_k", count("top_k (or None)", self.top_k, 1))
        if self.top_p is not None:
            fix("top_p", real("top_p (or None)", self.top_p, 0.0, 1.0, low_open=True))
        fix("n", count("n (samples per request)", self.n, 1))
        if self.seed is not None:
            fix("seed", count("seed (or None)", self.seed, 0))
            if self.seed + self.n - 1 >= 2 ** 64:
                raise ConfigError(f"seed {self.seed} is too large: sample i draws with seed + i, and with "
                                  f"n = {self.n} that must stay below 2**64 (a torch generator's range)")
        fix("max_tokens", count("max_tokens", self.max_tokens, 1))
        fix("frequency_penalty", real("frequency_penalty (OpenAI's range, -2 to 2)", self.frequency_penalty,
                                      -2.0, 2.0))
        stop = self.stop
        if isinstance(stop, str):
            stop = (stop,)
        elif stop is not None and hasattr(stop, "__iter__"):
            stop = tuple(stop)              # once: a generator would be used up by the check
        if not isinstance(stop, tuple) or not all(isinstance(s, str) and s for s in stop):
            raise ConfigError(f"stop must be a str or a sequence of non-empty strs, got {self.stop!r:.80}")
        fix("stop", tuple(stop))
        if isinstance(self.stop_token_ids, (str, bytes)) or not hasattr(self.stop_token_ids, "__iter__"):
            raise ConfigError(f"stop_token_ids must be a sequence of token ids, got {self.stop_token_ids!r:.80}")
        fix("stop_token_ids", tuple(count("a stop token id", t, 0) for t in self.stop_token_ids))
        if not isinstance(self.include_stop_str_in_output, bool):
            raise ConfigError(f"include_stop_str_in_output must be True or False, got {self.include_stop_str_in_output!r}")
        if not self.greedy and self.seed is None:
            raise ConfigError(f"sampling with temperature {self.temperature} needs a seed "
                              f"(SamplingParams(..., seed=0)): no run is silently unseeded")
        if self.greedy and self.n > 1:
            raise ConfigError(f"greedy decoding with n={self.n} would give {self.n} identical "
                              f"samples; set temperature > 0 (and a seed), or use beam search")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
