"""Beam search on shared blocks (vLLM paper §4.4, Figure 9): beams fork from their parents and
share every block they have in common; pruned beams free theirs.

The ``beam_width`` best candidates of a step survive.  Beam ``b``'s first surviving candidate
*is* ``b`` grown by one token, any other a fork of ``b``
(:meth:`~paged_kv.blocks.BlockSpaceManager.fork`: no copy, ref counts up); a beam with none is
freed (shared blocks lose a holder).  A write into a shared, partly filled last block copies it
first (copy-on-write), so the beams' common history is stored once, however many beams hold it.

Ranking and stopping (stated, since engines differ): candidates are ranked by the cumulative
log-probability of the generated tokens; ties go to the lower beam index, then the lower token id
(a stable sort).  The bundled byte-level model has no end-of-sequence token, so every beam runs
exactly ``max_new_tokens`` tokens and all beams always have the same length: the length penalty
of Hugging Face transformers and vLLM (score / length ** alpha) cannot change the order, and the
result lists the beams by cumulative log-probability, best first.

Legend: k beam width, V vocabulary, BS block size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..blocks import BlockHistory, BlockSpaceManager, blocks_needed, stored_tokens
from ..defaults import BLOCK_SIZE
from ..errors import ConfigError, OutOfBlocksError
from ..model.attention import check_backend
from ..model.llama import TinyLlama
from ..storage import PagedKVCache, run_from_manager
from ..validate import count
from .generate import check_prompts

__all__ = ["Beam", "BeamSearchResult", "beam_search", "select_candidates"]


@dataclass
class Beam:
    """One beam: its generated ``tokens``, their cumulative log-probability ``logprob`` (natural
    log), and the sequence id that held it in the block manager."""

    tokens: list[int]
    logprob: float
    seq_id: int


@dataclass
class BeamSearchResult:
    """What :func:`beam_search` returns.

    Attributes:
        prompt: the prompt's token ids.
        beams: ``beam_width`` beams, best first.
        blocks_used: per step, physical blocks the beams held (shared blocks once).
        blocks_unshared: per step, the blocks the same beams would hold without sharing
            (``sum`` over beams of ``ceil(tokens / BS)``).
        divergence: per step, how many of the last generated tokens the live beams do not all
            share (generated tokens minus the beams' common prefix): beams *coalesce*, all of
            them descend from one beam this many tokens back.
        history: the recorded :class:`~paged_kv.blocks.BlockHistory` (``record=True``), else ``None``.
        cache_bytes: bytes of the paged pool (all layers, K and V).
    """

    prompt: list[int]
    beams: list[Beam]
    blocks_used: list[int] = field(default_factory=list)
    blocks_unshared: list[int] = field(default_factory=list)
    divergence: list[int] = field(default_factory=list)
    history: BlockHistory | None = None
    cache_bytes: int = 0


def select_candidates(scores: torch.Tensor, beam_width: int) -> list[tuple[int, int, float]]:
    """The ``beam_width`` best ``(beam, token, score)`` of ``scores [live beams, V]`` (cumulative
    log-probabilities), best first; ties go to the lower beam, then the lower token (stable sort)."""
    flat = scores.reshape(-1)
    order = torch.sort(flat, descending=True, stable=True).indices[:beam_width].tolist()
    V = scores.shape[1]
    return [(i // V, i % V, float(flat[i])) for i in order]


@torch.no_grad()
def beam_search(model: TinyLlama, prompt, beam_width: int, max_new_tokens: int, *,
                block_size: int = BLOCK_SIZE, num_blocks: int | None = None, backend: str = "torch",
                record: bool = False, label=None) -> BeamSearchResult:
    """Beam search of width ``beam_width`` after ``prompt``, with the beams' common tokens stored
    once in a paged KV cache.

    Args:
        model: a :class:`~paged_kv.model.TinyLlama` (eval mode).
        prompt: the prompt's token ids.
        beam_width: k, beams kept each step (1 is greedy decoding).
        max_new_tokens: tokens per beam.
        block_size: tokens per block (BS).
        num_blocks: the pool; default ``k * ceil((len(prompt) + max_new_tokens - 1) / BS)``, enough
            even if no two beams shared anything.
        backend: ``"torch"`` or ``"triton"``.
        record: drive the manager through a :class:`~paged_kv.blocks.BlockHistory` (a snapshot
            after every allocate, fork, append and free, for figures).
        label: ``label(token_id) -> str`` for the recorded slots (default ``str``).

    Raises:
        PromptError: a bad prompt (as :func:`~paged_kv.decoding.generate`).
        ConfigError: ``beam_width`` not an int in ``1..vocab_size``, a bad backend or count.
        OutOfBlocksError: a ``num_blocks`` too small for the beams.
    """
    (prompt,) = check_prompts(model, [prompt], max_new_tokens)
    max_new_tokens = count("max_new_tokens", max_new_tokens, 1)
    k = count("beam_width", beam_width, 1)
    if k > model.cfg.vocab_size:
        raise ConfigError(f"beam_width {k} is more than the vocabulary ({model.cfg.vocab_size} tokens)")
    check_backend(backend)
    bs = count("block_size", block_size, 1)
    if num_blocks is None:
        num_blocks = k * blocks_needed(stored_tokens(len(prompt), max_new_tokens), bs)
    history = BlockHistory(BlockSpaceManager(num_blocks, bs), record=record, noun="beam")
    manager = history.manager
    label = label or str
    cache = PagedKVCache(model.cfg, manager.num_blocks, bs, dtype=model.dtype, device=model.device)
    dev = model.device

    def run(seqs, tokens, phase):
        logits = run_from_manager(model, cache, manager, seqs, tokens, phase, backend)
        return torch.log_softmax(logits.float(), dim=-1)   # (B, V)

    def usage(seqs):
        tables = [manager.block_table(s).block_ids for s in seqs]
        return len({b for t in tables for b in t}), sum(len(t) for t in tables)

    history.allocate(0, [label(t) for t in prompt] if record else len(prompt))
    logp = run([0], [prompt], "prefill")                                  # (1, V)
    live = [Beam([], 0.0, 0)]
    next_id = 1
    used, unshared, diverge = [], [], []
    for step in range(max_new_tokens):
        scores = torch.tensor([b.logprob for b in live], dtype=torch.float64)[:, None] + logp.double()
        chosen = select_candidates(scores, k)
        if step == max_new_tokens - 1:                                    # the last tokens are not fed back
            final = [Beam(live[p].tokens + [t], s, live[p].seq_id) for p, t, s in chosen]
            break
        # fork the extra children of each surviving parent, free the parents nobody continues
        children, kept = [], set()
        for p, t, s in chosen:
            parent = live[p]
            if parent.seq_id in kept:
                history.fork(parent.seq_id, next_id)
                seq, next_id = next_id, next_id + 1
            else:
                seq = parent.seq_id
                kept.add(seq)
            children.append(Beam(parent.tokens + [t], s, seq))
        for b in live:
            if b.seq_id not in kept:
                history.free(b.seq_id)
        seqs = [c.seq_id for c in children]
        need = manager.blocks_to_append_all(seqs)
        if need > manager.num_free_blocks:
            raise OutOfBlocksError(need, manager.num_free_blocks, f"beam step {step + 1}")
        for c in children:                                                # each writes its new token
            history.append(c.seq_id, label(c.tokens[-1]))
        logp = run(seqs, [[c.tokens[-1]] for c in children], "decode")   # copies applied, then written
        live = children
        u, w = usage(seqs)
        used.append(u)
        unshared.append(w)
        gen = len(children[0].tokens)
        common = 0
        while common < gen and len({c.tokens[common] for c in children}) == 1:
            common += 1
        diverge.append(gen - common)
    for b in live:                                                        # the pool comes back whole
        history.free(b.seq_id)
    manager.check()
    return BeamSearchResult(list(prompt), final, used, unshared, diverge, history if record else None, cache.nbytes)
