"""Print the bundled model's held-out loss per position band (the model card's table).

Measured on the shipped fp16 weights (loaded in fp32) over non-overlapping windows of the held-out
split of Tiny Shakespeare (its last 10%, as ``scripts/train_tiny.py`` splits it), by
:func:`paged_kv.model.evaluation.loss_by_position`. The windows are the model's whole context,
``max_seq_len`` tokens, so the table shows whether the loss is flat up to the last position the
engine admits. ``--beyond N`` also measures windows of N tokens on a copy of the model whose config
admits them (the same weights): what the loss would be past the context the model was trained on.

    PYTHONPATH=. python scripts/position_loss.py --data ../shared/data/tinyshakespeare.txt
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from paged_kv.model import TinyLlama, load_tiny_model                  # noqa: E402
from paged_kv.model.evaluation import loss_by_position                  # noqa: E402
from paged_kv.viz.text import md_table                                  # noqa: E402


BAND = 32  # positions per band of the model card's table


def held_out(path: str | Path) -> torch.Tensor:
    """The last 10% of the file's bytes, as token ids (the split of ``scripts/train_tiny.py``)."""
    raw = Path(path).read_bytes()
    return torch.tensor(list(raw[int(0.9 * len(raw)):]), dtype=torch.long)


def band_table(model, data: torch.Tensor, window: int, band: int, max_windows: int) -> tuple[str, list]:
    """A Markdown table of the loss per band, with each band's ratio to the first."""
    bands = loss_by_position(model, data, window, band, max_windows)
    first = bands[0].loss
    rows = [[f"{b.start}–{b.end - 1}", f"{b.loss:.4f}", f"{b.loss / math.log(2):.3f}",
             f"{100 * (b.loss / first - 1):+.1f}%"] for b in bands]
    return md_table(["positions", "nats/byte", "bits/byte", "vs first band"], rows), bands


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="../shared/data/tinyshakespeare.txt")
    ap.add_argument("--band", type=int, default=BAND, help="positions per band (tokens)")
    ap.add_argument("--windows", type=int, default=400, help="at most this many windows")
    ap.add_argument("--beyond", type=int, default=0, help="also measure windows of this many tokens")
    args = ap.parse_args()
    torch.manual_seed(0)
    model, _ = load_tiny_model()
    data = held_out(args.data)
    ctx = model.cfg.max_seq_len
    text, bands = band_table(model, data, ctx, args.band, args.windows)
    spread = max(b.loss for b in bands) / min(b.loss for b in bands) - 1
    print(f"Held-out loss by position, windows of {ctx} bytes (the model's max_seq_len), "
          f"{bands[0].predictions // args.band} windows:\n")
    print(text)
    print(f"\nlargest band / smallest band - 1: {100 * spread:.1f}%")
    if args.beyond:
        longer = TinyLlama(dataclasses.replace(model.cfg, max_seq_len=args.beyond))
        longer.load_state_dict(model.state_dict())
        text, _ = band_table(longer.eval(), data, args.beyond, ctx, args.windows)  # inside the context, then past it
        print(f"\nThe same weights on windows of {args.beyond} bytes, in bands of max_seq_len = {ctx}:\n")
        print(text)


if __name__ == "__main__":
    main()
