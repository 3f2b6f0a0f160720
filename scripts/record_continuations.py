"""Record the tiny model's greedy continuations of the live panels' offered prompts (chapters 5-8).

Writes ``paged_kv/panels/continuations.json``: for every prompt of
:data:`paged_kv.panels.continuations.OFFERED_PROMPTS`, the continuation the Jupyter panel would
generate (:func:`paged_kv.panels.continuations.record_continuation`: float32 on the CPU, greedy,
through :class:`~paged_kv.engine.LiveRequests`).  The browser edition replays them
(:class:`~paged_kv.engine.token_source.RecordedTokens`); ``tests/panels/test_continuations.py``
recomputes every entry and fails if the file differs.  Rerun it after changing the prompts or the
weights; ``--check`` only compares and exits 1 on a difference.

    PYTHONPATH=. python scripts/record_continuations.py [--check]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from paged_kv.model import load_tiny_model                                           # noqa: E402
from paged_kv.panels.continuations import (CONTINUATION_BYTES, OFFERED_PROMPTS,       # noqa: E402
                                           RECORDINGS_FILE, record_continuation)

OUT = ROOT / "paged_kv" / "panels" / RECORDINGS_FILE


def recordings() -> dict:
    """The file's contents: how it was made, and prompt -> continuation."""
    model, tok = load_tiny_model(device="cpu")
    return {"about": f"greedy continuations ({CONTINUATION_BYTES} bytes, cut to whole characters) of the "
                     f"bundled tiny model, float32 on the CPU, by scripts/record_continuations.py",
            "continuations": {p: record_continuation(model, tok, p, CONTINUATION_BYTES) for p in OFFERED_PROMPTS}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the file; write nothing")
    args = ap.parse_args(argv)
    text = json.dumps(recordings(), indent=1, ensure_ascii=False) + "\n"
    if args.check:
        same = OUT.exists() and OUT.read_text(encoding="utf-8") == text
        print(f"{OUT.relative_to(ROOT)}: {'up to date' if same else 'differs: rerun without --check'}")
        return 0 if same else 1
    OUT.write_text(text, encoding="utf-8")
    data = json.loads(text)["continuations"]
    print(f"wrote {OUT.relative_to(ROOT)}: {len(data)} prompts")
    for p, c in data.items():
        print(f"  {p!r} -> {c[:40]!r}...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
