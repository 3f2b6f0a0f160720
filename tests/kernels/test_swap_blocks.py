"""swap_blocks: the issue's hand-made case, exact in fp16, and its checks."""

import pytest
import torch

from kernels.cache_ops import swap_blocks
from paged_kv.errors import CacheError, TensorError


def test_swap_out_and_in_by_hand():
    # 8 blocks x 2 layers, fp16, block size 4, 2 heads, head_dim 8.  "GPU" block b holds b + 0.5 in
    # layer 0 and b + 100.5 in layer 1 (a CPU tensor on a machine without a GPU: the same code runs).
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = torch.empty(2, 8, 4, 2, 8, dtype=torch.float16, device=dev)
    for b in range(8):
        gpu[0, b], gpu[1, b] = b + 0.5, b + 100.5
    cpu = torch.full((2, 8, 4, 2, 8), -2.0, dtype=torch.float16, pin_memory=dev == "cuda")
    swap_blocks(gpu, cpu, torch.tensor([[2, 0], [5, 1], [7, 2]]))
    first = cpu[:, :, 0, 0, 0].tolist()                       # read at once, one value per block
    assert first[0][:3] == [2.5, 5.5, 7.5] and first[1][:3] == [102.5, 105.5, 107.5]
    assert first[0][3:] == [-2.0] * 5 and first[1][3:] == [-2.0] * 5
    assert bool((cpu[:, :3] == cpu[:, :3, :1, :1, :1]).all())  # every element of a block, not just one
    gpu[:, [2, 5, 7]] = -1.0
    swap_blocks(cpu, gpu, torch.tensor([[0, 6], [1, 3], [2, 0]]))
    cpu[:, :3] = 9.0                                          # overwrite the sources right after the call
    got = gpu[:, :, 0, 0, 0].tolist()
    assert [got[0][b] for b in (6, 3, 0)] == [2.5, 5.5, 7.5] and [got[1][b] for b in (6, 3, 0)] == [102.5, 105.5, 107.5]
    assert [got[0][b] for b in (2, 5, 7)] == [-1.0] * 3
    assert [got[0][b] for b in (1, 4)] == [1.5, 4.5]          # untouched
    assert bool((gpu[:, [6, 3, 0]] == gpu[:, [6, 3, 0], :1, :1, :1]).all())


def test_bad_mappings_raise():
    a, b = torch.zeros(2, 4, 2, 1, 8), torch.zeros(2, 3, 2, 1, 8)
    with pytest.raises(CacheError, match="destination block ids must be in 0..2"):
        swap_blocks(a, b, torch.tensor([[0, 3]]))
    with pytest.raises(CacheError, match="named twice"):
        swap_blocks(a, b, torch.tensor([[0, 1], [2, 1]]))
    with pytest.raises(TensorError, match="differ beyond"):
        swap_blocks(a, torch.zeros(2, 3, 2, 2, 8), torch.tensor([[0, 1]]))
    with pytest.raises(TensorError, match="int64"):
        swap_blocks(a, b, torch.tensor([[0, 1]], dtype=torch.int32))
