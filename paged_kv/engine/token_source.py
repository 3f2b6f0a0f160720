"""Where a sequence's next token comes from when there is no model to run: a *token source*.

A token source is a callable ``next_token(seq_id, tokens) -> int``: ``tokens`` is the sequence's
prompt and generated ids so far (a tuple), and it returns the next id, greedily (the same tokens
always give the same token, as greedy decoding of a model does, so a fork continues as its parent
and a recomputed request as before).  :class:`~paged_kv.engine.live.LiveRequests` and
:class:`~paged_kv.engine.timing_runner.TimingRunner` take one as ``next_token``; the browser build
uses it where the Jupyter panels sample from the tiny model (no torch in the browser).

:class:`RecordedTokens` is the one the book uses: it replays the tiny model's greedy continuation
recorded at build time for each offered prompt, and for any other prompt a plainly labelled
stand-in (:meth:`RecordedTokens.is_recorded` says which).  Pure Python.
"""

from __future__ import annotations

from typing import Callable, Mapping

from ..errors import ConfigError, PromptError

__all__ = ["RecordedTokens", "TokenSource", "smallest_period"]

TokenSource = Callable[[int, tuple[int, ...]], int]
"""``next_token(seq_id, tokens) -> int``: the next token id of sequence ``seq_id`` after ``tokens``
(its prompt and generated ids so far); greedy, a function of ``tokens``."""


def smallest_period(tokens) -> int:
    """The smallest ``p >= 1`` with ``tokens[i] == tokens[i - p]`` for every ``i >= p`` (the length
    itself when nothing shorter repeats), by the Knuth-Morris-Pratt failure function (Knuth, Morris
    and Pratt 1977): ``n - border`` where ``border`` is the longest proper prefix that is also a
    suffix.  ``O(n)``.

    Raises:
        PromptError: no tokens.
    """
    n = len(tokens)
    if n == 0:
        raise PromptError("a sequence has at least one token; got none")
    fail = [0] * n
    k = 0
    for i in range(1, n):
        while k and tokens[i] != tokens[k]:
            k = fail[k - 1]
        if tokens[i] == tokens[k]:
            k += 1
        fail[i] = k
    return n - fail[-1]


class RecordedTokens:
    """A token source that replays recorded greedy continuations, with a labelled stand-in.

    Args:
        recordings: prompt text -> the tiny model's greedy continuation of it (text), as recorded
            at build time (``paged_kv/panels/continuations.json``, loaded by
            ``paged_kv.panels.continuations.load_recordings``).
        tokenizer: what turns the texts into token ids (the tiny model's
            :class:`~paged_kv.model.ByteTokenizer`).

    ``next_token(seq_id, tokens)`` (this object is called so):

    * **recorded**: ``tokens`` is an offered prompt followed by the first ``k`` tokens of its
      recorded continuation, with ``k`` shorter than the recording: the recording's token ``k``.
      This is exactly what greedy decoding gives, so a typed prompt that happens to be an offered
      prompt plus the start of its continuation is recorded too.  Where several offered prompts
      match, the longest does (all are the same model's greedy output);
    * **stand-in**, for anything else (a typed prompt, or past a recording's end): the sequence
      repeats its own tokens cyclically, ``tokens[n - p]`` for ``n`` tokens of smallest period
      ``p`` (:func:`smallest_period`): a prompt with no repeat in it is repeated whole, byte for
      byte.  No model computed it; a panel must say so (:meth:`is_recorded`).

    ``seq_id`` is not used: the token depends on the tokens alone.

    Raises:
        ConfigError: recordings that are not a mapping of non-empty prompt texts to texts, or a
            tokenizer without ``encode``.
        PromptError: (a call) no tokens, or tokens that are not ints >= 0.
    """

    def __init__(self, recordings: Mapping[str, str], tokenizer) -> None:
        if not isinstance(recordings, Mapping):
            raise ConfigError(f"recordings must map prompt text to continuation text, got {recordings!r:.60}")
        if not callable(getattr(tokenizer, "encode", None)):
            raise ConfigError(f"tokenizer must have encode() (e.g. ByteTokenizer()), got {tokenizer!r:.60}")
        self.recordings = dict(recordings)
        self.tokenizer = tokenizer
        self._runs: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
        for prompt, continuation in self.recordings.items():
            if not isinstance(prompt, str) or not prompt or not isinstance(continuation, str):
                raise ConfigError(f"a recording is a non-empty prompt text and its continuation text, got "
                                  f"{prompt!r:.40} -> {continuation!r:.40}")
            self._runs.append((tuple(tokenizer.encode(prompt)), tuple(tokenizer.encode(continuation))))
        self._runs.sort(key=lambda run: -len(run[0]))           # the longest offered prompt first

    def __repr__(self) -> str:
        return f"RecordedTokens({len(self._runs)} recorded prompts)"

    def _recorded(self, tokens: tuple[int, ...]) -> int | None:
        """The recorded next token after ``tokens``, or ``None`` if none is recorded."""
        for prompt, continuation in self._runs:
            k = len(tokens) - len(prompt)
            if 0 <= k < len(continuation) and tokens[:len(prompt)] == prompt \
                    and tokens[len(prompt):] == continuation[:k]:
                return continuation[k]
        return None

    @staticmethod
    def _check(tokens) -> tuple[int, ...]:
        tokens = tuple(tokens)
        if not tokens:
            raise PromptError("a sequence has at least one token; got none")
        bad = [t for t in tokens if type(t) is not int or t < 0]
        if bad:
            raise PromptError(f"token ids are ints >= 0, got {bad[:3]!r}")
        return tokens

    def is_recorded(self, tokens) -> bool:
        """Whether the next token after ``tokens`` is the tiny model's, recorded (else a stand-in).

        Raises:
            PromptError: no tokens, or tokens that are not ints >= 0.
        """
        return self._recorded(self._check(tokens)) is not None

    def __call__(self, seq_id, tokens) -> int:
        """The next token after ``tokens`` (see the class docstring); a :data:`TokenSource`."""
        tokens = self._check(tokens)
        token = self._recorded(tokens)
        return tokens[len(tokens) - smallest_period(tokens)] if token is None else token
