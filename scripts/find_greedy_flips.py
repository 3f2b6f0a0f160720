"""Search prompt pairs for a greedy token that prefix caching flips (chapter 8, "Is it exact?").

Each trial draws, from its seed, a shared prefix (one to three lines of Shakespeare, cut at a random
length, so the cache hit ends at varied offsets) and two endings: ``warm`` = prefix + ending A fills
the cache, ``prompt`` = prefix + ending B hits it.  For every precision and reduction order below,
:func:`paged_kv.engine.exactness.compare_cache_on_off` serves the pair greedily with prefix caching
off and on and compares the prompt's logits step by step:

* float32, the references' own order (``reduction=None``; bf16 is refused there on a CPU);
* float32 and bfloat16, the natural split (attention tiles restart at the pass's first new token);
* float32 and bfloat16, the fixed split (batch-invariant: tiles at 0, S, 2S, ...; matmuls row by row).

It prints, per configuration, the trials run, the flips found (outputs that differ) and the largest
|Δlogit| seen before the outputs part, and writes them, with the prompts of every flip, to
``benchmarks/greedy_flips.json`` (read back by :func:`paged_kv.engine.exactness.load_flip_search`).
Bounded: ``--trials`` trials or ``--max-seconds``, whichever comes first.  Not run by ``make book``.

    PYTHONPATH=. python scripts/find_greedy_flips.py --trials 100
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from paged_kv.engine.exactness import FLIP_SEARCH_PATH, compare_cache_on_off   # noqa: E402
from paged_kv.model import load_tiny_model                                     # noqa: E402
from paged_kv.model.reduction import ReductionOrder                            # noqa: E402

# Public-domain lines (Shakespeare), the register the tiny model was trained on.
LINES = [
    "ROMEO:\nBut soft, what light through yonder window breaks?\n",
    "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\n",
    "HAMLET:\nTo be, or not to be, that is the question:\n",
    "KING RICHARD III:\nNow is the winter of our discontent\n",
    "MACBETH:\nTo-morrow, and to-morrow, and to-morrow,\n",
    "PORTIA:\nThe quality of mercy is not strain'd,\n",
    "ANTONY:\nFriends, Romans, countrymen, lend me your ears;\n",
    "JAQUES:\nAll the world's a stage,\nAnd all the men and women merely players:\n",
    "KING HENRY V:\nOnce more unto the breach, dear friends, once more;\n",
    "PROSPERO:\nWe are such stuff\nAs dreams are made on,\n",
    "LADY MACBETH:\nOut, damned spot! out, I say!\n",
    "OTHELLO:\nIt is the cause, it is the cause, my soul,\n",
    "MIRANDA:\nO brave new world,\nThat has such people in't!\n",
    "PUCK:\nLord, what fools these mortals be!\n",
    "LEAR:\nBlow, winds, and crack your cheeks! rage! blow!\n",
    "BRUTUS:\nThere is a tide in the affairs of men,\n",
    "FIRST CITIZEN:\nBefore we proceed any further, hear me speak.\n",
    "MENENIUS:\nI tell you, friends, most charitable care\nHave the patricians of you.\n",
    "GLOUCESTER:\nAs flies to wanton boys, are we to the gods;\n",
    "VIOLA:\nIf music be the food of love, play on;\n",
    "MERCUTIO:\nA plague o' both your houses!\n",
    "CLAUDIO:\nAy, but to die, and go we know not where;\n",
    "ISABELLA:\nO, it is excellent\nTo have a giant's strength;\n",
    "DUKE VINCENTIO:\nBe absolute for death; either death or life\n",
]


def draw_pair(seed: int) -> tuple[str, str]:
    """``(warm, prompt)`` texts for trial ``seed``: a shared prefix, then two different endings."""
    rng = random.Random(seed)
    prefix = "".join(rng.sample(LINES, rng.randint(1, 3)))
    prefix = prefix[:rng.randint(20, max(21, len(prefix)))]
    a, b = rng.sample(LINES, 2)
    return prefix + a[:rng.randint(3, len(a))], prefix + b[:rng.randint(3, len(b))]


def configurations(split_size: int) -> list[tuple[str, torch.dtype, ReductionOrder | None]]:
    natural, fixed = ReductionOrder(split_size), ReductionOrder(split_size, batch_invariant=True)
    return [("float32 reference", torch.float32, None),
            ("float32 natural", torch.float32, natural), ("float32 fixed", torch.float32, fixed),
            ("bfloat16 natural", torch.bfloat16, natural), ("bfloat16 fixed", torch.bfloat16, fixed)]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=100, help="prompt pairs to try (default 100)")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--max-seconds", type=float, default=1800.0, help="stop after this long (default 1800)")
    ap.add_argument("--max-tokens", type=int, default=24, help="greedy tokens per prompt (default 24)")
    ap.add_argument("--block-size", type=int, default=4, help="tokens per block (default 4, chapter 8's)")
    ap.add_argument("--split-size", type=int, default=16, help="keys per attention tile (default 16)")
    ap.add_argument("--out", type=Path, default=FLIP_SEARCH_PATH, help="where to write the record")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    models = {dt: load_tiny_model(dtype=dt) for dt in (torch.float32, torch.bfloat16)}
    tok = models[torch.float32][1]
    configs = configurations(args.split_size)
    results = {name: {"tried": 0, "flips": 0, "bit_identical": 0, "max_abs_diff": 0.0} for name, _, _ in configs}
    flips, t0, done = [], time.perf_counter(), 0
    for seed in range(args.first_seed, args.first_seed + args.trials):
        if time.perf_counter() - t0 > args.max_seconds:
            break
        warm, prompt = draw_pair(seed)
        for name, dtype, reduction in configs:
            c = compare_cache_on_off(models[dtype][0], tok.encode(warm), tok.encode(prompt), reduction,
                                     max_tokens=args.max_tokens, block_size=args.block_size)
            r = results[name]
            r["tried"] += 1
            r["flips"] += c.flipped
            r["bit_identical"] += c.bit_identical
            r["max_abs_diff"] = max(r["max_abs_diff"], c.max_abs_diff)
            if c.flipped:
                flips.append({"seed": seed, "config": name, "warm": warm, "prompt": prompt,
                              "cached_tokens": c.cached_tokens, "first_difference": c.first_difference,
                              "margin": c.margin, "max_abs_diff": c.max_abs_diff,
                              "text_off": tok.decode(list(c.tokens_off)), "text_on": tok.decode(list(c.tokens_on))})
                print(f"  flip: seed {seed}, {name}, token {c.first_difference}, margin {c.margin:.4g}: "
                      f"{tok.decode(list(c.tokens_off))!r} vs {tok.decode(list(c.tokens_on))!r}", flush=True)
        done += 1
        if done % 10 == 0:
            print(f"{done} trials, {time.perf_counter() - t0:.0f} s: "
                  + ", ".join(f"{n} {r['flips']}" for n, r in results.items()), flush=True)
    record = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
              "cpu": torch.backends.cpu.get_cpu_capability(), "trials": done, "first_seed": args.first_seed,
              "max_tokens": args.max_tokens, "block_size": args.block_size, "split_size": args.split_size,
              "seconds": round(time.perf_counter() - t0, 1), "results": results, "flips": flips}
    print(f"\n{done} prompt pairs, {args.max_tokens} greedy tokens each, block size {args.block_size}, "
          f"split size {args.split_size}:")
    for name, r in results.items():
        print(f"  {name:18s} tried {r['tried']:4d}  flips {r['flips']:4d}  bit-identical {r['bit_identical']:4d}  "
              f"max |Δlogit| {r['max_abs_diff']:.3g}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {args.out}")
    return record


if __name__ == "__main__":
    main()
