"""The last recorded GPU run of the kernels, for the book (chapter 5).

``bash scripts/gpu_check.sh`` on a machine with a CUDA GPU measures the performance targets in
one run and writes ``benchmarks/gpu_results.json`` (date, GPU, commit, ratios).  The book shows
that file through :func:`load_gpu_results` and :func:`gpu_results_rows`, or says that no run was
recorded: timings of the Triton interpreter on a CPU measure Python, not the kernels, so the book
never prints them as performance.
"""

from __future__ import annotations

from pathlib import Path

from ..validate import read_record

__all__ = ["DEFAULT_PATH", "RATIO_NAMES", "gpu_results_rows", "load_gpu_results"]

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_results.json"

# ratio key -> (what it measures, how the target reads)
RATIO_NAMES = {
    "paged_vs_copy_bandwidth": ("paged decode K/V bandwidth / copy bandwidth", "≥ {t:.2f}"),
    "paged_vs_contiguous": ("paged vs our contiguous kernel (speed)", "≥ {t:.2f}×"),
    "paged_vs_gather_sdpa": ("paged vs gather + SDPA (speed)", "≥ {t:.0f}×"),
    "block_size_spread": ("block sizes 8–128: slowest / fastest − 1", "≤ {t:.0%}"),
    "prefill_vs_sdpa": ("causal prefill vs SDPA (speed)", "(reported)"),
}
REQUIRED = ("date", "gpu", "commit", "shape", "ratios", "block_sizes")


def load_gpu_results(path: str | Path | None = None) -> dict | None:
    """The recorded run at ``path`` (default :data:`DEFAULT_PATH`), or ``None`` if none exists.

    Raises:
        ConfigError: the file exists but is not a results file (bad JSON or a missing field).
    """
    path = Path(path) if path is not None else DEFAULT_PATH
    return read_record(path, REQUIRED, "scripts/gpu_check.sh")


def gpu_results_rows(results: dict) -> tuple[list[list[str]], list[list[str]]]:
    """Two tables of strings: ``(ratios, block sizes)``.

    Ratios: ``[measure, value, target, met]`` per ratio; block sizes: ``[BS, ms, GB/s, vs contiguous,
    vs gather+SDPA]`` per block size measured.
    """
    ratios = []
    for key, value in results["ratios"].items():
        what, fmt = RATIO_NAMES.get(key, (key, "{t}"))
        target = results.get("targets", {}).get(key)
        met = results.get("met", {}).get(key)
        shown = f"{value:.1%}" if key == "block_size_spread" else f"{value:.2f}"
        ratios.append([what, shown, fmt.format(t=target) if target is not None else fmt.format(t=0),
                       "" if met is None else ("yes" if met else "**no**")])
    sizes = [[bs, f"{r['ms']:.3f}", f"{r['gbs']:.0f}", f"{r['vs_contiguous']:.2f}×", f"{r['vs_gather_sdpa']:.2f}×"]
             for bs, r in sorted(results["block_sizes"].items(), key=lambda kv: int(kv[0]))]
    return ratios, sizes
