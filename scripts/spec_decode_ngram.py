"""Prompt-lookup speculation on the tiny model: target passes and rolled-back drafts, printed.

Greedy from a prompt, drafts by :class:`~paged_kv.spec_decode.NgramProposer`, each verified by one
full forward pass (:func:`~paged_kv.decoding.speculative_greedy`); checks the output equals plain
greedy decoding's.  Usage: ``python scripts/spec_decode_ngram.py [--prompt TEXT] [--tokens N]
[--k K] [--min N] [--max N]`` (defaults: ``ROMEO:\\n``, 249 tokens, the most the bundled model's
256 positions allow after that prompt, k = 6, 3-grams).
"""

import argparse

from paged_kv.decoding import speculative_greedy
from paged_kv.model.checkpoint import load_tiny_model
from paged_kv.spec_decode import NgramProposer

ap = argparse.ArgumentParser()
ap.add_argument("--prompt", default="ROMEO:\n")
ap.add_argument("--tokens", type=int, default=249)
ap.add_argument("--k", type=int, default=6)
ap.add_argument("--min", type=int, default=3)
ap.add_argument("--max", type=int, default=3)
a = ap.parse_args()
model, tok = load_tiny_model()
prompt = tok.encode(a.prompt)
spec = speculative_greedy(model, prompt, a.tokens, NgramProposer(a.k, a.min, a.max))
plain = speculative_greedy(model, prompt, a.tokens, NgramProposer(1, model.cfg.max_seq_len))
print(f"{a.tokens} greedy tokens after {a.prompt!r}, k = {a.k}, n = {a.min}..{a.max}: "
      f"output equal to plain greedy: {spec.token_ids == plain.token_ids}; "
      f"{spec.target_passes} target passes instead of {plain.target_passes}; "
      f"{spec.draft_tokens} drafted, {spec.accepted_tokens} accepted, {spec.rolled_back} rolled back")
