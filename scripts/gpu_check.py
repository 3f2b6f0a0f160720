"""GPU check: every kernel vs its PyTorch reference on CUDA, in fp16 (T4-safe) and bf16 (sm_80+).

Run on a machine with a CUDA GPU (``bash scripts/gpu_check.sh`` runs this, the >2^31-element
cache test, the benchmark and every chapter). Prints one line per case and exits non-zero on any
mismatch. On a CPU-only machine it says so and exits 0.
"""

import sys

import torch

from kernels.runtime import default_dtype, triton_status
from kernels.cache_ops import store_kv, store_kv_reference
from kernels.decode_attention import decode_attention, decode_attention_reference
from kernels.paged_attention import paged_copy, paged_decode_attention, paged_decode_attention_reference
from kernels.prefill_attention import prefill_attention, prefill_attention_reference

TOL = {torch.float16: 3e-3, torch.bfloat16: 2e-2}


def main() -> int:
    print(triton_status())
    if not torch.cuda.is_available():
        print("no CUDA GPU here: nothing to check")
        return 0
    dev = torch.device("cuda")
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
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
