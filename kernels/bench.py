"""``python -m kernels.bench``: time every kernel against PyTorch's SDPA on the same inputs.

Each kernel module exposes ``benchmark(device, dtype, timer) -> list[dict]``; this file runs
them and prints one table.  Units are formulas, not impressions:

* decode kernels are memory-bound: **GB/s** = bytes of K/V (and q, out) moved / seconds;
* prefill is compute-bound: **TFLOP/s** = 4 * B * H * D * (causal query-key pairs) / seconds.

``vs SDPA`` is SDPA's time divided by ours (> 1: ours is faster).  On a CPU the kernels run in the
Triton interpreter, so only a tiny sanity shape is timed and the numbers mean nothing about GPUs.
"""

from __future__ import annotations

import argparse

import torch

from paged_kv.errors import ConfigError

from . import cache_ops, copy_blocks, decode_attention, paged_attention, paged_prefill, prefill_attention
from .runtime import default_device, interpreter_active, triton_available, triton_status
from .timing import make_timer, row

__all__ = ["KERNEL_MODULES", "format_rows", "main", "make_timer", "row", "run"]

# Each kernel module has ``benchmark(device, dtype, timer) -> list[dict]``.
KERNEL_MODULES = {"prefill_attention": prefill_attention, "decode_attention": decode_attention,
                  "paged_attention": paged_attention, "paged_prefill": paged_prefill, "cache_ops": cache_ops,
                  "copy_blocks": copy_blocks}


def run(device: torch.device | None = None, dtypes=None, modules=KERNEL_MODULES) -> list[dict]:
    """Run every available kernel module's ``benchmark``; returns the rows."""
    device = device or default_device()
    if not triton_available():  # e.g. macOS/Windows: nothing to time; say why instead
        print(f"no Triton kernels timed: {triton_status()}")
        return []
    if dtypes is None:
        if device.type == "cuda":
            dtypes = [torch.float16]
            if torch.cuda.get_device_capability(device) >= (8, 0):
                dtypes.append(torch.bfloat16)
        else:
            dtypes = [torch.float32]
    timer = make_timer(device, warmup=1 if interpreter_active() else 3, rep=3 if interpreter_active() else 20)
    rows = []
    for name in modules:
        if name not in KERNEL_MODULES:
            raise ConfigError(f"unknown kernel module {name!r}; known: {', '.join(KERNEL_MODULES)}")
        for dtype in dtypes:
            rows.extend(KERNEL_MODULES[name].benchmark(device, dtype, timer))
    return rows


def format_rows(rows: list[dict]) -> str:
    head = f"{'kernel':<26} {'shape':<36} {'dtype':<9} {'ms':>9} {'rate':>14} {'vs SDPA':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        ratio = f"{r['vs_sdpa']:.2f}x" if r["vs_sdpa"] else "-"
        # Other ratios a module adds as vs_<name>=... (e.g. vs_contig) print as "<name> 1.23x".
        more = "".join(f"  {k[3:]} {v:.3g}x" for k, v in r.items() if k.startswith("vs_") and k != "vs_sdpa" and v)
        lines.append(f"{r['kernel']:<26} {r['shape']:<36} {r['dtype']:<9} {r['ms']:>9.3f} "
                     f"{r['rate']:>9.3g} {r['unit']:<4} {ratio:>8}{more}")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", nargs="*", default=list(KERNEL_MODULES), help="subset of kernel modules")
    args = ap.parse_args(argv)
    print(triton_status())
    device = default_device()
    if device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    print(format_rows(run(device, modules=args.kernels)))


if __name__ == "__main__":
    main()
