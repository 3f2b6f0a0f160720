"""How the engine speculates: vLLM's ``speculative_config``, validated on creation.

vLLM takes ``LLM(..., speculative_config={"method": "ngram", "num_speculative_tokens": k,
"prompt_lookup_min": a, "prompt_lookup_max": b})`` (``vllm/config/speculative.py``); this is the
same dictionary as a frozen dataclass.  The defaults are vLLM's: with neither lookup bound given
both are 5 (vLLM's source calls the value arbitrary, to be tuned); with one given, the other
copies it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..errors import ConfigError
from ..validate import count

__all__ = ["SPECULATIVE_METHODS", "SpeculativeConfig"]

SPECULATIVE_METHODS = ("ngram", "draft_model")
DEFAULT_PROMPT_LOOKUP = 5            # vLLM's, for both bounds when neither is given


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding's knobs (vLLM's names).

    Attributes:
        method: how drafts are made: ``"ngram"``, prompt lookup
            (:class:`~paged_kv.spec_decode.ngram.NgramProposer`), or ``"draft_model"``, a smaller
            model of the same tokenizer (:class:`~paged_kv.engine.draft_proposer.DraftModelProposer`;
            the engine builds it from the target's first ``draft_num_layers`` layers,
            :func:`~paged_kv.model.draft.truncated_draft`, where vLLM takes a second checkpoint
            as ``model``).
        num_speculative_tokens: ``k``, the most draft tokens per sequence per step (tokens, >= 1).
        prompt_lookup_min, prompt_lookup_max: the shortest and longest n-gram (tokens) the
            ``ngram`` proposer matches against the sequence's earlier tokens.
        draft_num_layers: the draft model's layers (``"draft_model"`` only; default 1).

    Raises:
        ConfigError: an unknown method, a count that is not an int >= 1, ``min > max``, or
            ``draft_num_layers`` with ``"ngram"``.
    """

    method: str = "ngram"
    num_speculative_tokens: int = 1
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    draft_num_layers: int | None = None

    def __post_init__(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise ConfigError(f"speculative method must be one of {SPECULATIVE_METHODS}, got {self.method!r}")
        count("num_speculative_tokens", self.num_speculative_tokens, 1)
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is None and hi is None:
            lo = hi = DEFAULT_PROMPT_LOOKUP
        lo = hi if lo is None else count("prompt_lookup_min", lo, 1)
        hi = lo if hi is None else count("prompt_lookup_max", hi, 1)
        if lo > hi:
            raise ConfigError(f"prompt_lookup_min ({lo}) must be <= prompt_lookup_max ({hi})")
        if self.method == "draft_model":
            object.__setattr__(self, "draft_num_layers", count("draft_num_layers", 1 if self.draft_num_layers is None
                                                               else self.draft_num_layers, 1))
        elif self.draft_num_layers is not None:
            raise ConfigError(f"draft_num_layers ({self.draft_num_layers!r}) is for method 'draft_model', "
                              f"not {self.method!r}")
        object.__setattr__(self, "prompt_lookup_min", lo)
        object.__setattr__(self, "prompt_lookup_max", hi)

    @classmethod
    def from_dict(cls, config) -> "SpeculativeConfig":
        """From vLLM's dictionary form; a ``SpeculativeConfig`` is returned as it is.

        Raises:
            ConfigError: not a dict, an unknown key (named), or a bad value.
        """
        if isinstance(config, cls):
            return config
        if not isinstance(config, dict):
            raise ConfigError(f"speculative_config must be a dict or a SpeculativeConfig, got {config!r:.80}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(config) - known, key=str)
        if unknown:
            raise ConfigError(f"speculative_config has unknown keys {unknown}; known: {sorted(known)}")
        return cls(**config)
