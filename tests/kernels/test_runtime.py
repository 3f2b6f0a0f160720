"""The device/dtype policy of kernels/runtime.py."""

import os
import subprocess
import sys

import pytest
import torch

from kernels import runtime
from paged_kv.errors import DTypeNotSupportedError


def test_interpreter_is_on_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the interpreter is for CPU-only machines")
    assert os.environ.get("TRITON_INTERPRET") == "1"
    assert runtime.interpreter_active() and runtime.triton_available()
    assert "interpreter" in runtime.triton_status()


def test_fresh_process_switches_interpreter_on():
    """Importing paged_kv in a clean process (no TRITON_INTERPRET) makes kernels interpreted."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    code = ("import paged_kv, os, kernels.decode_attention as d; "
            "print(os.environ['TRITON_INTERPRET'], type(d._decode_split_kernel).__name__)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "InterpretedFunction"]


@pytest.mark.parametrize("capability,expected", [((7, 5), torch.float16), ((8, 0), torch.bfloat16),
                                                 ((9, 0), torch.bfloat16), ((7, 0), torch.float16)])
def test_dtype_policy_by_capability(capability, expected):
    # A T4 (7, 5) must get float16 even though torch.cuda.is_bf16_supported() says True there.
    assert runtime.default_dtype("cuda", capability=capability) == expected


def test_cpu_dtype_is_fp32():
    assert runtime.default_dtype("cpu") == torch.float32


def test_bf16_refused_where_it_cannot_run():
    with pytest.raises(DTypeNotSupportedError, match="interpreter"):
        runtime.check_kernel_dtype(torch.bfloat16, torch.device("cpu"))
    with pytest.raises(DTypeNotSupportedError, match="sm_75"):
        runtime.check_kernel_dtype(torch.bfloat16, torch.device("cuda"), capability=(7, 5))
    runtime.check_kernel_dtype(torch.bfloat16, torch.device("cuda"), capability=(8, 0))
    with pytest.raises(DTypeNotSupportedError, match="int8"):
        runtime.check_kernel_dtype(torch.int8, torch.device("cpu"))
