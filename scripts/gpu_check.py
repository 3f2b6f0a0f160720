"""GPU check: every kernel vs its PyTorch reference on CUDA, in fp16 (T4-safe) and bf16 (sm_80+),
then the performance targets measured in one run and recorded in a results file the book reads.

Run on a machine with a CUDA GPU (``bash scripts/gpu_check.sh`` runs this, the >2^31-element
cache test, the benchmark and every chapter). Prints one line per case and exits non-zero on any
mismatch. On a CPU-only machine it says so, writes nothing and exits 0: interpreter timings
measure Python, so no CPU run is ever recorded as performance.

The performance targets (issue 10), all measured in the same run on one shape, paged decode at
B=64, context 4096, 32 query / 8 KV heads, D=128, fp16:

* paged decode's K/V read bandwidth vs the copy bandwidth of ``Tensor.copy_`` measured in the same
  run (read + write bytes per second): target >= 0.80;
* paged vs our contiguous decode kernel on the same tokens (its time / ours): target >= 0.95;
* paged vs gathering the blocks into a contiguous tensor + SDPA (their time / ours): target >= 3;
* block sizes 8, 16, 32, 64, 128: the slowest within 10% of the fastest;
* causal prefill at T=4096 (B=1, same heads) vs SDPA (SDPA's time / ours), reported.

Results go to ``benchmarks/gpu_results.json`` (``--results PATH`` or ``$GPU_RESULTS`` to change)
with the date (UTC), GPU, compute capability, torch and Triton versions and the git commit;
:mod:`paged_kv.viz.gpu_results` reads it for the book.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from kernels.runtime import default_dtype, triton_status
from kernels.cache_ops import store_kv, store_kv_reference
from kernels.decode_attention import decode_attention, decode_attention_reference
from kernels.paged_attention import paged_copy, paged_decode_attention, paged_decode_attention_reference
from kernels.prefill_attention import prefill_attention, prefill_attention_reference
from kernels.paged_attention import gather_kv
from kernels.timing import make_timer

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "gpu_results.json"
TARGETS = {"paged_vs_copy_bandwidth": 0.80, "paged_vs_contiguous": 0.95, "paged_vs_gather_sdpa": 3.0,
           "block_size_spread": 0.10}

TOL = {torch.float16: 3e-3, torch.bfloat16: 2e-2}


def correctness(dev) -> int:
    """Every kernel vs its reference on awkward shapes; returns the number of mismatches."""
    dtypes = [torch.float16] + ([torch.bfloat16] if default_dtype(dev) == torch.bfloat16 else [])
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, dtypes {dtypes}")
    lens = [1, 15, 16, 17, 100, 1000]
    bad = 0
    for dtype in dtypes:
        for D in (64, 80, 96, 128):
            for H, Hkv in ((8, 8), (8, 2), (8, 1)):
                g = torch.Generator(device=dev).manual_seed(D + H * 7 + Hkv)
                B, T = len(lens), max(lens)
                sl = torch.tensor(lens, dtype=torch.int32, device=dev)
                q3 = torch.randn(B, H, D, device=dev, generator=g).to(dtype)
                k = torch.randn(B, T, Hkv, D, device=dev, generator=g).to(dtype)
                v = torch.randn(B, T, Hkv, D, device=dev, generator=g).to(dtype)
                errs = {"decode": (decode_attention(q3, k, v, sl) - decode_attention_reference(q3, k, v, sl)).abs().max()}
                q4 = torch.randn(B, T, H, D, device=dev, generator=g).to(dtype)
                valid = torch.arange(T, device=dev)[None, :] < sl[:, None]
                errs["prefill"] = (prefill_attention(q4, k, v, sl) - prefill_attention_reference(q4, k, v, sl))[valid].abs().max()
                for BS in (8, 16, 32):
                    kc, vc, tables = paged_copy(k, v, BS, generator=g)
                    out = paged_decode_attention(q3, kc, vc, tables, sl)
                    errs[f"paged BS={BS}"] = (out - paged_decode_attention_reference(q3, kc, vc, tables, sl)).abs().max()
                slots = torch.randperm(64 * 16, device=dev)[:40].long()
                kc = torch.zeros(64, 16, Hkv, D, device=dev, dtype=dtype)
                vc, kr, vr = kc.clone(), kc.clone(), kc.clone()
                kn, vn = k[0, :40], v[0, :40]
                store_kv(kn, vn, kc, vc, slots)
                store_kv_reference(kn, vn, kr, vr, slots)
                errs["store_kv"] = (kc - kr).abs().max() + (vc - vr).abs().max()
                for name, e in errs.items():
                    ok = float(e) <= TOL[dtype]
                    bad += not ok
                    print(f"{'ok ' if ok else 'BAD'} {name:<14} {str(dtype):<15} D={D:<3} H={H} Hkv={Hkv}  max|err|={float(e):.2e}")
    print(f"{bad} mismatches")
    return bad


def performance(dev, dtype=torch.float16, B=64, T=4096, H=32, Hkv=8, D=128,
                block_sizes=(8, 16, 32, 64, 128), prefill_T=4096, timer=None) -> dict:
    """The performance ratios of one run (see the module docstring); returns plain data.

    ``timer(fn) -> seconds``: default :func:`kernels.timing.make_timer` for ``dev``.  The shape
    arguments exist so a test can run the same code on a tiny shape under the interpreter (its
    numbers are then meaningless and never recorded).
    """
    timer = timer or make_timer(dev)
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(B, H, D, device=dev, generator=g).to(dtype)
    k = torch.randn(B, T, Hkv, D, device=dev, generator=g).to(dtype)
    v = torch.randn(B, T, Hkv, D, device=dev, generator=g).to(dtype)
    seq_lens = torch.full((B,), T, dtype=torch.int32, device=dev)
    kv_bytes = 2 * B * T * Hkv * D * k.element_size()                    # K and V read once
    src = torch.empty(kv_bytes // 2, dtype=torch.int16, device=dev)       # kv_bytes of data
    dst = torch.empty_like(src)
    copy_s = timer(lambda: dst.copy_(src))
    copy_gbs = 2 * kv_bytes / copy_s / 1e9                               # read + write
    contig_s = timer(lambda: decode_attention(q, k, v, seq_lens))
    sweep = {}
    for BS in block_sizes:
        kc, vc, tables = paged_copy(k, v, BS, generator=g)
        paged_s = timer(lambda: paged_decode_attention(q, kc, vc, tables, seq_lens))

        def gather_sdpa():
            kg, vg = gather_kv(kc, vc, tables, seq_lens)
            return torch.nn.functional.scaled_dot_product_attention(
                q[:, :, None], kg.transpose(1, 2), vg.transpose(1, 2), enable_gqa=H != Hkv)

        sweep[BS] = {"ms": paged_s * 1e3, "gbs": kv_bytes / paged_s / 1e9,
                     "vs_contiguous": contig_s / paged_s, "vs_gather_sdpa": timer(gather_sdpa) / paged_s}
    main_bs = 16 if 16 in sweep else block_sizes[0]
    times = [r["ms"] for r in sweep.values()]
    qp = torch.randn(1, prefill_T, H, D, device=dev, generator=g).to(dtype)
    kp = torch.randn(1, prefill_T, Hkv, D, device=dev, generator=g).to(dtype)
    vp = torch.randn(1, prefill_T, Hkv, D, device=dev, generator=g).to(dtype)
    ours_prefill = timer(lambda: prefill_attention(qp, kp, vp))
    sdpa_prefill = timer(lambda: torch.nn.functional.scaled_dot_product_attention(
        qp.transpose(1, 2), kp.transpose(1, 2), vp.transpose(1, 2), is_causal=True, enable_gqa=H != Hkv))
    ratios = {"paged_vs_copy_bandwidth": sweep[main_bs]["gbs"] / copy_gbs,
              "paged_vs_contiguous": sweep[main_bs]["vs_contiguous"],
              "paged_vs_gather_sdpa": sweep[main_bs]["vs_gather_sdpa"],
              "block_size_spread": max(times) / min(times) - 1,
              "prefill_vs_sdpa": sdpa_prefill / ours_prefill}
    met = {name: (ratios[name] <= target if name == "block_size_spread" else ratios[name] >= target)
           for name, target in TARGETS.items()}
    return {"shape": {"B": B, "T": T, "H": H, "Hkv": Hkv, "D": D, "dtype": str(dtype).replace("torch.", ""),
                      "block_size": main_bs, "prefill_T": prefill_T},
            "copy_gbs": copy_gbs, "contiguous_ms": contig_s * 1e3, "prefill_ms": ours_prefill * 1e3,
            "prefill_sdpa_ms": sdpa_prefill * 1e3, "block_sizes": {str(bs): r for bs, r in sweep.items()},
            "ratios": ratios, "targets": TARGETS, "met": met}


def commit() -> str:
    """The checked-out commit, with ``+dirty`` when tracked files differ from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"


def record(perf: dict, mismatches: int, dev, path: Path) -> dict:
    """Write one GPU run's results to ``path`` (JSON) and return them."""
    import triton
    results = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "gpu": torch.cuda.get_device_name(dev),
               "capability": "sm_%d%d" % torch.cuda.get_device_capability(dev),
               "torch": torch.__version__, "triton": triton.__version__, "commit": commit(),
               "correctness_mismatches": mismatches, **perf}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=Path(os.environ.get("GPU_RESULTS", RESULTS)),
                    help="where to write the results file (default benchmarks/gpu_results.json)")
    args = ap.parse_args(argv)
    print(triton_status())
    if not torch.cuda.is_available():
        print("no CUDA GPU here: nothing to check, no results recorded")
        return 0
    dev = torch.device("cuda")
    bad = correctness(dev)
    perf = performance(dev)
    res = record(perf, bad, dev, args.results)
    print(f"{res['gpu']} ({res['capability']}), commit {res['commit']}, {res['date']}")
    for name, value in res["ratios"].items():
        target = TARGETS.get(name)
        verdict = "" if target is None else ("  met" if res["met"][name] else "  MISSED")
        print(f"{name:<26} {value:8.3f}" + (f"  target {'<=' if name == 'block_size_spread' else '>='} "
                                              f"{target}{verdict}" if target is not None else ""))
    print(f"results written to {args.results}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
