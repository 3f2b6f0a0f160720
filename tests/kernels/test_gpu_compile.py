"""The kernels compile for the GPUs readers have (T4 sm_75 fp16; A100 sm_80 and H100 sm_90 in fp16
and bf16) and fit their shared memory, shown without a GPU: ``tests/kernels/gpu_compile.py`` runs
every host wrapper on CPU tensors and hands each launch to ``triton.compile`` for a ``GPUTarget``.
And head_dim below 16, which the GPU compiler refused before ``runtime.head_tile`` padded the tile,
gives the reference's numbers in the interpreter.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels import runtime as rt
from kernels.decode_attention import decode_attention, decode_attention_reference
from kernels.paged_attention import paged_copy, paged_decode_attention, paged_decode_attention_reference
from kernels.paged_prefill import paged_prefill_attention, paged_prefill_attention_reference
from kernels.prefill_attention import prefill_attention, prefill_attention_reference

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not rt.HAS_TRITON, reason="Triton is not installed")


@pytest.mark.parametrize("head_dim,tile", [(1, 16), (8, 16), (16, 16), (17, 32), (80, 128), (256, 256)])
def test_head_tile_is_a_power_of_two_of_at_least_16(head_dim, tile):
    assert rt.head_tile(head_dim) == tile


def test_head_dim_8_matches_the_references():
    """ModelConfig(hidden_size=32, num_heads=4) has head_dim 8: every attention kernel pads it."""
    g = torch.Generator().manual_seed(3)
    B, T, H, Hkv, D, BS = 2, 11, 4, 2, 8, 4
    q = torch.randn(B, T, H, D, generator=g)
    k, v = torch.randn(B, T, Hkv, D, generator=g), torch.randn(B, T, Hkv, D, generator=g)
    lens = torch.tensor([11, 6], dtype=torch.int32)
    torch.testing.assert_close(prefill_attention(q, k, v, lens)[1, :6], prefill_attention_reference(q, k, v, lens)[1, :6])
    torch.testing.assert_close(prefill_attention(q, k, v, lens)[0], prefill_attention_reference(q, k, v, lens)[0])
    q1 = torch.randn(B, H, D, generator=g)
    torch.testing.assert_close(decode_attention(q1, k, v, lens), decode_attention_reference(q1, k, v, lens))
    k_cache, v_cache, tables = paged_copy(k, v, BS, generator=g)
    torch.testing.assert_close(paged_decode_attention(q1, k_cache, v_cache, tables, lens),
                               paged_decode_attention_reference(q1, k_cache, v_cache, tables, lens))
    ctx, ql = torch.tensor([7, 0], dtype=torch.int32), torch.tensor([4, 6], dtype=torch.int32)
    qc = torch.randn(B, 6, H, D, generator=g)
    got = paged_prefill_attention(qc, k_cache, v_cache, tables, ctx, ql)
    want = paged_prefill_attention_reference(qc, k_cache, v_cache, tables, ctx, ql)
    torch.testing.assert_close(got[0, :4], want[0, :4])
    torch.testing.assert_close(got[1], want[1])


@pytest.mark.slow
def test_every_kernel_compiles_for_sm75_sm80_sm90(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": str(tmp_path / "triton-cache"),
           "TRITON_DEFAULT_FP_FUSION": "1", "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "kernels" / "gpu_compile.py")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    summary = json.loads(lines[-1])
    print("\n".join(lines[:-1]))  # the matrix, for the log (pytest -s)
    assert summary["failures"] == 0, json.dumps(summary["failed"], indent=1, default=str)
    rows = [line.split() for line in lines[:-1]]
    seen = {(r[1], r[2], r[3]) for r in rows}
    kernels = {"_prefill_attention_kernel", "_decode_split_kernel", "decode_combine_kernel",
               "_paged_decode_split_kernel", "paged_prefill_kernel", "_store_kv_kernel", "copy_blocks_kernel"}
    for cc, dtype in [("sm_75", "float16"), ("sm_80", "float16"), ("sm_80", "bfloat16"),
                      ("sm_90", "float16"), ("sm_90", "bfloat16")]:
        for name in kernels:
            assert (cc, dtype, name) in seen, f"{name} was not compiled for {cc} {dtype}"
    assert summary["compiles"] >= 80
