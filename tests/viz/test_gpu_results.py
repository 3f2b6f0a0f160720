"""The GPU results file: scripts/gpu_check.py's ratio arithmetic (run on a tiny shape under the
interpreter with a stand-in timer, so the numbers are derived by hand, not timed), and the book's
reader, which shows a recorded run or None and refuses a broken file by name."""

import importlib.util
import json

import pytest

from conftest import ROOT
from kernels import runtime as rt
from paged_kv.errors import ConfigError
from paged_kv.viz.gpu_results import gpu_results_rows, load_gpu_results


def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(not rt.triton_available(), reason="needs Triton (interpreter on CPU)")
def test_performance_ratios_follow_their_definitions():
    """With every call 'taking' 1 s: paged reads kv_bytes while the copy moves 2 * kv_bytes, so the
    bandwidth ratio is 1/2; every speed ratio is 1; the block sizes do not spread."""
    import torch
    calls = []

    def timer(fn):
        fn()                            # the real kernels run once (interpreter): the code works
        calls.append(fn)
        return 1.0

    perf = gpu_check().performance(torch.device("cpu"), torch.float32, B=1, T=32, H=2, Hkv=1, D=16,
                                   block_sizes=(8, 16), prefill_T=16, timer=timer)
    assert perf["ratios"] == {"paged_vs_copy_bandwidth": 0.5, "paged_vs_contiguous": 1.0,
                              "paged_vs_gather_sdpa": 1.0, "block_size_spread": 0.0, "prefill_vs_sdpa": 1.0}
    assert perf["met"] == {"paged_vs_copy_bandwidth": False, "paged_vs_contiguous": True,
                           "paged_vs_gather_sdpa": False, "block_size_spread": True}
    assert perf["copy_gbs"] == 2 * (2 * 1 * 32 * 1 * 16 * 4) / 1e9          # K+V bytes, read + write
    assert len(calls) == 1 + 1 + 2 * 2 + 2                                 # copy, contig, 2 x (paged, sdpa), prefill x 2
    json.dumps(perf)                                                        # plain data


def test_no_file_means_no_recorded_run(tmp_path):
    assert load_gpu_results(tmp_path / "gpu_results.json") is None


def test_a_recorded_run_becomes_two_tables(tmp_path):
    run = {"date": "2026-12-01T10:00:00+00:00", "gpu": "NVIDIA H100", "commit": "abc", "shape": {},
           "ratios": {"paged_vs_contiguous": 0.97, "block_size_spread": 0.04},
           "targets": {"paged_vs_contiguous": 0.95, "block_size_spread": 0.10},
           "met": {"paged_vs_contiguous": True, "block_size_spread": True},
           "block_sizes": {"16": {"ms": 1.0, "gbs": 3000.0, "vs_contiguous": 0.97, "vs_gather_sdpa": 3.5},
                           "8": {"ms": 1.04, "gbs": 2900.0, "vs_contiguous": 0.93, "vs_gather_sdpa": 3.4}}}
    path = tmp_path / "gpu_results.json"
    path.write_text(json.dumps(run))
    ratios, sizes = gpu_results_rows(load_gpu_results(path))
    assert ratios[0][1:] == ["0.97", "≥ 0.95×", "yes"] and ratios[1][1:] == ["4.0%", "≤ 10%", "yes"]
    assert [r[0] for r in sizes] == ["8", "16"]                             # numeric order, not text


@pytest.mark.parametrize("text,match", [("{not json", "not valid JSON"), ('{"date": 1}', "lacks the field")])
def test_a_broken_file_is_refused_by_name(tmp_path, text, match):
    path = tmp_path / "gpu_results.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_gpu_results(path)
