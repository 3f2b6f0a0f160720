"""Which draft tokens a verify pass keeps: the greedy rule.

The target model runs the sequence's last token followed by the ``k`` draft tokens as one chunk
and so gives its own greedy choice after each prefix: ``target[i]`` is its token after the
context plus ``draft[:i]``.  Plain greedy decoding would have produced ``target[0]`` next; if that
equals ``draft[0]``, then ``target[1]`` is what it would produce after that, and so on.  So the
output is the longest prefix of the draft that agrees with the target, followed by the target's
token at the first disagreement (or after the whole draft: the "bonus" token) — exactly the tokens
greedy decoding would have produced, one to ``k + 1`` of them per pass (Leviathan et al. 2023,
§2.3, with temperature 0; vLLM's rejection sampler takes the same path for greedy requests).
"""

from __future__ import annotations

from typing import Sequence

from ..errors import PagedKVError

__all__ = ["accept_greedy"]


def accept_greedy(draft: Sequence[int], target: Sequence[int]) -> list[int]:
    """The tokens a greedy verify pass keeps: ``draft[:a] + [target[a]]`` for the first ``a`` with
    ``draft[a] != target[a]`` (``a = len(draft)`` if none differs).

    Args:
        draft: the ``k`` proposed tokens (``k >= 0``).
        target: the target's greedy token at each of the pass's ``k + 1`` positions.

    Returns:
        1 to ``k + 1`` tokens; the rejected drafts are ``draft[a:]`` (their slots are rolled back).

    Raises:
        PagedKVError: ``len(target) != len(draft) + 1``.
    """
    if len(target) != len(draft) + 1:
        raise PagedKVError(f"a verify pass over {len(draft)} draft tokens gives {len(draft) + 1} target "
                           f"tokens, got {len(target)}")
    out = []
    for d, t in zip(draft, target):
        out.append(t)
        if d != t:
            return out
    out.append(target[-1])
    return out
