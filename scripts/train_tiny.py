"""Train the book's tiny model on Tiny Shakespeare and write it to ``paged_kv/model/weights/``.

Reproducible: fixed seed, fixed step count, data split as nanoGPT's char-level example (first
90% train, last 10% held out).  Run from the repository root:

    python scripts/train_tiny.py --data ../shared/data/tinyshakespeare.txt

It prints the held-out loss in nats per byte (one token = one byte), the same loss per band of
positions, and a greedy sample, and writes them into the model card.  The model's ``max_seq_len``
is the training window (``--ctx``), so the engine admits no sequence longer than the model was
trained on (what the loss does past it: ``scripts/position_loss.py --beyond 512``).  About 15-20
minutes on 2 idle CPU cores.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from paged_kv.decoding import generate  # noqa: E402
from paged_kv.model import ByteTokenizer, ModelConfig, TinyLlama, load_checkpoint, save_checkpoint  # noqa: E402
from paged_kv.model.evaluation import loss_by_position  # noqa: E402
from position_loss import BAND, band_table  # noqa: E402  (scripts/, beside this file)


def batches(data: torch.Tensor, batch: int, ctx: int, g: torch.Generator):
    while True:
        ix = torch.randint(len(data) - ctx - 1, (batch,), generator=g)
        x = torch.stack([data[i:i + ctx] for i in ix])
        y = torch.stack([data[i + 1:i + ctx + 1] for i in ix])
        yield x, y


def held_out_loss(model: TinyLlama, data: torch.Tensor, ctx: int, max_windows: int = 400) -> float:
    """Mean cross-entropy (nats/byte) over non-overlapping windows of the held-out split (the mean
    of :func:`~paged_kv.model.evaluation.loss_by_position`'s equal bands)."""
    bands = loss_by_position(model, data, ctx, band=ctx, max_windows=max_windows)
    return bands[0].loss



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="../shared/data/tinyshakespeare.txt")
    ap.add_argument("--out", default="paged_kv/model/weights")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=1337)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    raw = Path(args.data).read_bytes()
    data = torch.tensor(list(raw), dtype=torch.long)
    split = int(0.9 * len(data))
    train, val = data[:split], data[split:]
    cfg = ModelConfig(vocab_size=256, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
                      intermediate_size=768, max_seq_len=args.ctx, tie_embeddings=True)  # its context = its window
    model = TinyLlama(cfg)
    print(f"params: {sum(p.numel() for p in model.parameters()):,} ({cfg.num_parameters():,} by formula)")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(args.seed)
    warmup = 100
    t0 = time.time()
    for step, (x, y) in zip(range(args.steps), batches(train, args.batch, args.ctx, g)):
        lr = args.lr * min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for group in opt.param_groups:
            group["lr"] = max(lr, args.lr * 0.05)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step:5d}  loss {loss.item():.4f}  {time.time() - t0:7.1f}s", flush=True)
    train_secs = time.time() - t0
    model.eval()
    path = save_checkpoint(model, args.out, meta={"steps": args.steps, "seed": args.seed})
    # Measure the loss of what ships (fp16 weights), not of the fp32 training copy.
    shipped = load_checkpoint(args.out)
    val_loss = held_out_loss(shipped, val, args.ctx)
    train_loss = held_out_loss(shipped, train[-len(val):], args.ctx)
    table, _ = band_table(shipped, val, args.ctx, BAND, 400)
    tok = ByteTokenizer()
    prompt = tok.encode("ROMEO:\n")
    sample = generate(shipped, [prompt], max_new_tokens=args.ctx - len(prompt)).texts(tok)[0]  # the whole context
    print(f"held-out loss {val_loss:.4f} nats/byte; train-split loss {train_loss:.4f}")
    print(table)
    print(sample)
    card = Path(args.out) / "MODEL_CARD.md"
    card.write_text(f"""# Model card: tiny-shakespeare

A {cfg.num_parameters():,}-parameter Llama-style decoder (RMSNorm, RoPE, GQA with
{cfg.num_heads} query heads and {cfg.num_kv_heads} KV heads of head_dim {cfg.head_dim}, SwiGLU,
tied embeddings) over UTF-8 bytes (vocab 256), for teaching KV-cache management. Not a useful
language model.

- **Data**: Tiny Shakespeare ({len(raw):,} bytes, public domain); first 90% train, last 10% held out.
- **Training**: `python scripts/train_tiny.py` (seed {args.seed}): {args.steps} steps of AdamW,
  batch {args.batch} x {args.ctx} bytes, peak lr {args.lr}, cosine decay; {train_secs / 60:.1f} min
  on 2 CPU cores.
- **Stored**: fp16 safetensors ({path.stat().st_size / 1e6:.1f} MB); `config.json` beside it.
- **Context**: `max_seq_len` {args.ctx} tokens (bytes), the training window; the engine refuses a
  longer sequence (prompt + `max_tokens`).
- **Held-out loss**: {val_loss:.4f} nats/byte ({val_loss / math.log(2):.3f} bits/byte), measured on
  the shipped fp16 weights over {min(400, (len(val) - 1) // args.ctx)} windows of {args.ctx} bytes;
  same measure on the end of the train split: {train_loss:.4f}.
- **Held-out loss by position**, over the same windows, in bands of {BAND} positions
  (`python scripts/position_loss.py` prints it for the shipped weights; the first positions
  predict from the least context, so their loss is the highest):

{table}

- **Greedy sample** from the prompt `ROMEO:\\n`, to the end of the context ({args.ctx} bytes in all):

```text
{sample}
```
""")
    print(f"wrote {path} and {card}")


if __name__ == "__main__":
    main()
