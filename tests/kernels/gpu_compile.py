"""Compile every Triton kernel for NVIDIA GPUs we cannot reach: T4 (sm_75), A100 (sm_80), H100 (sm_90).

The Triton interpreter (how the rest of the suite runs the kernels on the CPU) skips rules that
only the GPU compiler enforces: ``tl.dot`` needs at least 16 rows and columns, bf16 ``tl.dot``
needs sm_80, a tile must fit the GPU's shared memory.  This script calls each host wrapper
exactly as a user would, on small CPU tensors, but instead of launching it hands the launch to
``triton.compile`` for a ``GPUTarget``, with the same signature, constexprs and specialisation a
real launch would compile (Triton's own binder and ``_pack_args``).  It then checks the shared
memory the compiled kernel needs against the target's per-block limit.

Run as a subprocess by ``tests/kernels/test_gpu_compile.py`` (the interpreter must be *off*,
which the rest of the suite cannot have).  ``python tests/kernels/gpu_compile.py [--quick]`` prints
one line per compile and a JSON summary as its last line.
"""

import json
import os
import sys
import time

os.environ["TRITON_INTERPRET"] = "0"  # compile for real; nothing is launched

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.jit import JITFunction, create_function_from_signature  # noqa: E402

import kernels.cache_ops as cache_ops  # noqa: E402
import kernels.checks as checks  # noqa: E402
import kernels.copy_blocks as copy_blocks  # noqa: E402
import kernels.decode_attention as decode_attention  # noqa: E402
import kernels.paged_attention as paged_attention  # noqa: E402
import kernels.paged_prefill as paged_prefill  # noqa: E402
import kernels.prefill_attention as prefill_attention  # noqa: E402

# Shared memory one block (CTA) may use, bytes: CUDA C Programming Guide, "Technical
# Specifications per Compute Capability" (7.5: 64 KB, 8.0: 163 KB, 9.0: 227 KB).
SHARED_LIMIT = {75: 64 * 1024, 80: 163 * 1024, 90: 227 * 1024}

# The wrappers refuse to launch without a GPU or the interpreter, and refuse bf16 on the CPU; here
# nothing is launched, so both checks step aside (the dtype policy has its own tests).
_allow = lambda *a, **k: None  # noqa: E731
for mod in (cache_ops, checks, copy_blocks, decode_attention, paged_attention, paged_prefill, prefill_attention):
    for name in ("require_triton", "check_kernel_dtype"):
        if hasattr(mod, name):
            setattr(mod, name, _allow)

_TARGET = None      # set per case: (cc, GPUTarget)
_RESULTS = []       # one dict per compile


def _compile_instead_of_launch(self, *args, grid, warmup, **kwargs):
    """Stands in for ``JITFunction.run``: bind and specialise as Triton does, then compile only."""
    cc, target = _TARGET
    from triton.compiler import make_backend
    backend = make_backend(target)
    binder = create_function_from_signature(self.signature, self.params, backend)
    bound_args, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = self._pack_args(backend, kwargs, bound_args, specialization, options)
    t0 = time.perf_counter()
    row = {"kernel": self.fn.__name__, "cc": cc,
           "constexprs": {self.params[p[0]].name: v for p, v in constexprs.items() if len(p) == 1}}
    try:
        compiled = triton.compile(ASTSource(self, signature, constexprs, attrs), target=target,
                                  options=options.__dict__)
        shared = int(compiled.metadata.shared)
        row.update(ok=shared <= SHARED_LIMIT[cc], shared=shared,
                   error="" if shared <= SHARED_LIMIT[cc] else
                   f"needs {shared} bytes of shared memory, sm_{cc} allows {SHARED_LIMIT[cc]}")
    except Exception as exc:  # a compile failure is the finding: record it, go on
        row.update(ok=False, shared=None, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
    row["seconds"] = round(time.perf_counter() - t0, 2)
    _RESULTS.append(row)
    return None


JITFunction.run = _compile_instead_of_launch


def _t(*shape, dtype, g):
    return torch.randn(*shape, dtype=torch.float32, generator=g).to(dtype)


def _v_layout(vc, case):
    """``case["v"] == "narrow"``: the v cache as ``[..., 1:D + 1]`` of one 3 wider, so its strides
    differ from k's and are not multiples of 16.  The paged kernels take k's and v's strides apart,
    and Triton specialises on a stride's divisibility by 16: this compiles another variant (a
    layout whose strides stay multiples of 16, such as a head-major pool, compiles the same one)."""
    if case.get("v") != "narrow":
        return vc
    wide = torch.zeros(*vc.shape[:-1], vc.shape[-1] + 3, dtype=vc.dtype)
    return wide[..., 1:vc.shape[-1] + 1].copy_(vc)


def launch(case: dict, dtype: torch.dtype) -> None:
    """Call the wrapper ``case['kernel']`` on CPU tensors of the case's shape class."""
    g = torch.Generator().manual_seed(0)
    kind = case["kernel"]
    H, Hkv, D = case.get("H", 8), case.get("Hkv", 2), case.get("D", 64)
    BS = case.get("BS", 16)
    # tuning arguments only where the case names them: otherwise the wrapper's own defaults
    tune = {name: case[key] for key, name in (("block_m", "block_m"), ("block_n", "block_n"),
                                               ("splits", "num_splits"), ("block_e", "block_e")) if key in case}
    if kind == "prefill_attention":
        B, T = 2, 40
        q, k, v = _t(B, T, H, D, dtype=dtype, g=g), _t(B, T, Hkv, D, dtype=dtype, g=g), _t(B, T, Hkv, D, dtype=dtype, g=g)
        prefill_attention.prefill_attention(q, k, v, **tune)
    elif kind == "decode_attention":
        B, T = 2, case.get("T", 70)
        q = _t(B, H, D, dtype=dtype, g=g)
        kc, vc = _t(B, T, Hkv, D, dtype=dtype, g=g), _t(B, T, Hkv, D, dtype=dtype, g=g)
        decode_attention.decode_attention(q, kc, vc, torch.tensor([T, 33], dtype=torch.int32), **tune)
    elif kind in ("paged_decode_attention", "paged_prefill_attention"):
        B, NB = 2, 12
        kc, vc = _t(NB, BS, Hkv, D, dtype=dtype, g=g), _t(NB, BS, Hkv, D, dtype=dtype, g=g)
        vc = _v_layout(vc, case)
        nblk = 3
        tables = torch.tensor([[5, 2, 9], [0, 7, 11]], dtype=torch.int32)
        if kind == "paged_decode_attention":
            lens = torch.tensor([nblk * BS, BS + 1 if BS > 1 else 2], dtype=torch.int32)
            paged_attention.paged_decode_attention(_t(B, H, D, dtype=dtype, g=g), kc, vc, tables, lens, **tune)
        else:
            total = nblk * BS
            qlen = min(total, 5)
            ctx = torch.tensor([total - qlen, 0], dtype=torch.int32)
            ql = torch.tensor([qlen, min(qlen, 2)], dtype=torch.int32)
            paged_prefill.paged_prefill_attention(_t(B, qlen, H, D, dtype=dtype, g=g), kc, vc, tables, ctx, ql, **tune)
    elif kind == "store_kv":
        N, NB = 5, 4
        kc, vc = _t(NB, BS, Hkv, D, dtype=dtype, g=g), _t(NB, BS, Hkv, D, dtype=dtype, g=g)
        vc = _v_layout(vc, case)
        slots = torch.tensor([0, NB * BS - 1, -1, 1, 2], dtype=torch.int64)   # distinct even at BS = 1
        cache_ops.store_kv(_t(N, Hkv, D, dtype=dtype, g=g), _t(N, Hkv, D, dtype=dtype, g=g), kc, vc, slots)
    elif kind == "copy_blocks":
        L, NB = 2, 6
        kc, vc = _t(L, NB, BS, Hkv, D, dtype=dtype, g=g), _t(L, NB, BS, Hkv, D, dtype=dtype, g=g)
        copy_blocks.copy_blocks(kc, vc, torch.tensor([[0, 3], [0, 4], [2, 5]], dtype=torch.int64), **tune)
    else:
        raise ValueError(f"unknown kernel {kind!r}")


# Targets: the T4 computes in fp16 (no bf16 tl.dot below sm_80); Ampere and Hopper in fp16 and bf16.
TARGETS = [(75, torch.float16), (80, torch.float16), (80, torch.bfloat16), (90, torch.float16), (90, torch.bfloat16)]

# One representative per shape class the wrappers accept, with the tile sizes the package uses
# (the wrappers' defaults: prefill block_m 16 / block_n 32, decode block_n 32, num_splits from
# choose_num_splits, at most 64) and a few explicit tuning choices.  Every wrapper at a base shape
# on every target; then head_dim (8, 80, 96, 112, 120, 192, 256), GQA groups (1, 3, 8), block sizes
# (1, 128) and the tuning choices on the T4 (the tightest target: 64 KB of shared memory), and
# the largest shapes again on sm_90 in bf16.  A tile a user picks by hand may still exceed a GPU's
# shared memory; Triton then refuses the launch with an "out of resource: shared memory" error
# that names both sizes (for instance prefill block_m 128 x block_n 64 at D 128 needs 96 KiB).
BASE = [{"kernel": k} for k in ("prefill_attention", "decode_attention", "paged_decode_attention",
                                "paged_prefill_attention", "store_kv", "copy_blocks")]
CLASSES = [
    # head_dim below 16: tl.dot needs 16 (the ModelConfig(hidden_size=32, num_heads=4) case)
    {"kernel": "prefill_attention", "D": 8, "H": 4, "Hkv": 4},
    {"kernel": "decode_attention", "D": 8, "H": 4, "Hkv": 2},
    {"kernel": "paged_decode_attention", "D": 8, "H": 4, "Hkv": 1},
    {"kernel": "paged_prefill_attention", "D": 8, "H": 4, "Hkv": 2},
    {"kernel": "store_kv", "D": 8, "Hkv": 1, "BS": 1},
    {"kernel": "copy_blocks", "BS": 1, "D": 8, "Hkv": 1, "block_e": 16},
    # head_dims that are not powers of two, GQA groups 1, 3, 8, and the largest head_dim
    {"kernel": "paged_decode_attention", "D": 80, "H": 8, "Hkv": 8},
    {"kernel": "paged_prefill_attention", "D": 96, "H": 6, "Hkv": 2},
    {"kernel": "prefill_attention", "D": 112, "H": 8, "Hkv": 1},
    {"kernel": "decode_attention", "D": 120, "H": 3, "Hkv": 1},
    {"kernel": "paged_decode_attention", "D": 192, "H": 16, "Hkv": 2, "splits": 37},
    {"kernel": "prefill_attention", "D": 256, "H": 8, "Hkv": 8},
    {"kernel": "paged_prefill_attention", "D": 256, "H": 8, "Hkv": 1, "BS": 32},
    {"kernel": "decode_attention", "D": 256, "H": 16, "Hkv": 2, "T": 2048, "splits": 64},  # S = 64
    {"kernel": "paged_decode_attention", "D": 256, "H": 64, "Hkv": 8},
    {"kernel": "store_kv", "BS": 128, "D": 256, "Hkv": 8},
    # block sizes 1 and 128, and explicit tiles
    {"kernel": "paged_decode_attention", "BS": 1, "block_n": 16},
    {"kernel": "paged_decode_attention", "BS": 128, "D": 128, "H": 32, "Hkv": 8, "block_n": 64, "splits": 2},
    {"kernel": "paged_prefill_attention", "BS": 1, "block_m": 32, "block_n": 16},
    {"kernel": "paged_prefill_attention", "BS": 128, "D": 128, "H": 32, "Hkv": 8},
    {"kernel": "prefill_attention", "block_m": 64, "block_n": 64},
    {"kernel": "decode_attention", "D": 128, "block_n": 64},
    {"kernel": "copy_blocks", "BS": 128, "D": 128, "Hkv": 8, "block_e": 4096},
    # a v cache laid out unlike k's (the kernels read each with its own strides)
    {"kernel": "paged_decode_attention", "v": "narrow"},
    {"kernel": "paged_prefill_attention", "v": "narrow"},
    {"kernel": "store_kv", "v": "narrow"},
]
BIG = [c for c in CLASSES if c.get("D", 64) >= 192 or c.get("BS", 16) == 128]


def plan(quick: bool = False):
    """(case, cc, dtype) triples to compile."""
    jobs = [(c, cc, dt) for c in BASE for cc, dt in TARGETS]
    if quick:
        return jobs[:2]
    jobs += [(c, 75, torch.float16) for c in CLASSES]
    jobs += [(c, 90, torch.bfloat16) for c in BIG]
    return jobs


def main(argv) -> int:
    quick = "--quick" in argv
    global _TARGET
    t0 = time.perf_counter()
    for case, cc, dtype in plan(quick):
        _TARGET = (cc, GPUTarget("cuda", cc, 32))
        before = len(_RESULTS)
        try:
            launch(case, dtype)
        except Exception as exc:  # the wrapper itself refused: also a finding
            _RESULTS.append({"kernel": case["kernel"], "cc": cc, "ok": False, "shared": None,
                             "error": f"wrapper raised {type(exc).__name__}: {exc}", "seconds": 0})
        for row in _RESULTS[before:]:
            row["case"] = case
            row["dtype"] = str(dtype).replace("torch.", "")
            print(f"{'ok  ' if row['ok'] else 'FAIL'} sm_{cc} {row['dtype']:8} {row['kernel']:30} {case} "
                  f"shared={row['shared']} {row['seconds']}s {row['error']}", flush=True)
    summary = {"compiles": len(_RESULTS), "failures": sum(not r["ok"] for r in _RESULTS),
               "seconds": round(time.perf_counter() - t0, 1), "triton": triton.__version__,
               "failed": [r for r in _RESULTS if not r["ok"]]}
    print(json.dumps(summary, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
