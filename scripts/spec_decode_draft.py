"""Speculation through the engine on the tiny model: draft models of 1..L-1 layers and prompt lookup,
their acceptance and target passes, printed as a table.

Each row serves one greedy request (``LLMEngine`` with ``speculative_config``) and checks its output
equals the engine's without speculation.  A ``"draft_model"`` row drafts with the target's first
layers (:func:`~paged_kv.model.draft.truncated_draft`); with ``--data`` (tinyshakespeare) it also
prints each draft's held-out loss (nats/byte, as ``scripts/train_tiny.py`` measures it).
Usage: ``python scripts/spec_decode_draft.py [--prompt TEXT] [--tokens N] [--k K] [--data PATH]``
(defaults: ``ROMEO:\\n``, 200 tokens, k = 4).  CPU wall time is printed for reference only: it is
not a speed claim (the tiny model is not memory-bound; chapter 9's timing model is).
"""

import argparse
import math
import time
from pathlib import Path

import torch

from paged_kv.engine import EngineConfig, LLMEngine
from paged_kv.model.checkpoint import load_tiny_model
from paged_kv.model.draft import truncated_draft
from paged_kv.model.evaluation import loss_by_position
from paged_kv.sampling_params import SamplingParams

ap = argparse.ArgumentParser()
ap.add_argument("--prompt", default="ROMEO:\n")
ap.add_argument("--tokens", type=int, default=200)
ap.add_argument("--k", type=int, default=4)
ap.add_argument("--data", default=None, help="tinyshakespeare.txt, for the drafts' held-out loss")
a = ap.parse_args()
torch.set_num_threads(1)
model, tok = load_tiny_model()
params = SamplingParams(max_tokens=a.tokens)


def serve(spec):
    e = LLMEngine(model, EngineConfig(num_gpu_blocks=64, speculative_config=spec), tokenizer=tok)
    t0 = time.perf_counter()
    out = e.generate(a.prompt, params)[0]
    return out.token_ids, e.stats, time.perf_counter() - t0


def held_out(m) -> float:
    """Mean loss over the held-out 10% (nanoGPT's split), windows of the model's context."""
    text = Path(a.data).read_bytes()
    data = torch.tensor(list(text[int(0.9 * len(text)):]), dtype=torch.long)
    bands = loss_by_position(m, data, m.cfg.max_seq_len, band=m.cfg.max_seq_len, max_windows=100)
    return bands[0].loss


plain, plain_stats, plain_s = serve(None)
rows = [("none", "-", plain_stats.steps, "-", "-", "-", True, plain_s,
         held_out(model) if a.data else math.nan)]
specs = [(f"draft_model, {n} layer{'s' * (n > 1)}", {"method": "draft_model", "num_speculative_tokens": a.k,
                                                     "draft_num_layers": n}, n)
         for n in range(1, model.cfg.num_layers)]
specs.append(("ngram, 3-gram", {"method": "ngram", "num_speculative_tokens": a.k, "prompt_lookup_min": 3,
                                "prompt_lookup_max": 3}, None))
for name, spec, layers in specs:
    toks, s, secs = serve(spec)
    loss = held_out(truncated_draft(model, layers)) if a.data and layers else math.nan
    rows.append((name, a.k, s.steps, s.num_draft_tokens, s.num_accepted_tokens, f"{s.acceptance_rate:.3f}",
                 toks == plain, secs, loss))
print(f"{a.tokens} greedy tokens after {a.prompt!r} through LLMEngine (block size 16):\n")
print("| drafter | k | target passes | drafted | accepted | acceptance rate | output = plain | CPU s | held-out loss |")
print("|---|---|---|---|---|---|---|---|---|")
for name, k, steps, d, acc, rate, same, secs, loss in rows:
    print(f"| {name} | {k} | {steps} | {d} | {acc} | {rate} | {same} | {secs:.2f} | "
          f"{'-' if math.isnan(loss) else f'{loss:.4f}'} |")
