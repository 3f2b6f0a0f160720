"""The order of a pass's sums (paged_kv/model/reduction.py): key tiles against a per-key brute
force, split attention against float64 softmax attention, and the batch-invariant order's bits
equal across passes that the natural order rounds differently."""

import itertools
import math

import pytest
import torch

from paged_kv.errors import ConfigError, TensorError
from paged_kv.model import AttentionMetadata, load_tiny_model
from paged_kv.model.reduction import ReductionOrder, linear, split_attention, split_bounds
from paged_kv.storage import ContiguousKVCache

NATURAL, FIXED = ReductionOrder(16), ReductionOrder(16, batch_invariant=True)


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiles_by_key(context_len, seq_len, size, fixed):
    """Brute force: label every key with the tile a kernel's loop puts it in, walking the keys one
    by one (a new tile every ``size`` keys, counting from 0, or, in the natural order, from the
    context boundary for the pass's own keys), then cut the runs of equal labels."""
    labels, tile, run = [], -1, 0
    for j in range(seq_len):
        restart = j == 0 or (not fixed and j == context_len)
        if restart or run == size:
            tile, run = tile + 1, 0
        labels.append(tile)
        run += 1
    bounds = []
    for _, group in itertools.groupby(range(seq_len), key=lambda j: labels[j]):
        g = list(group)
        bounds.append((g[0], g[-1] + 1))
    return bounds


@pytest.mark.parametrize("size", [1, 3, 4, 16, 17, 64])
@pytest.mark.parametrize("fixed", [False, True])
def test_split_bounds_match_a_key_by_key_walk(size, fixed):
    order = ReductionOrder(size, fixed)
    for seq_len in range(1, 70, 3):
        for context_len in range(0, seq_len):
            got = split_bounds(context_len, seq_len, order)
            assert got == tiles_by_key(context_len, seq_len, size, fixed), (context_len, seq_len)
            assert got[0][0] == 0 and got[-1][1] == seq_len
            assert all(a[1] == b[0] for a, b in zip(got, got[1:]))              # in order, no gap
            assert all(0 < stop - start <= size for start, stop in got)
            if fixed:
                assert got == split_bounds(0, seq_len, order)                    # whatever the pass
            else:
                assert context_len == 0 or (context_len in [s for s, _ in got])  # never straddles c
                assert len(got) == math.ceil(context_len / size) + math.ceil((seq_len - context_len) / size)


def test_the_natural_split_differs_from_the_fixed_one_only_off_the_grid():
    # a hit of 20 cached tokens: the cache-off pass reads [0,16) [16,32) ..., the hit [0,16) [16,20) [20,36) ...
    assert split_bounds(20, 40, NATURAL) == [(0, 16), (16, 20), (20, 36), (36, 40)]
    assert split_bounds(20, 40, FIXED) == split_bounds(0, 40, NATURAL) == [(0, 16), (16, 32), (32, 40)]
    assert split_bounds(32, 40, NATURAL) == split_bounds(32, 40, FIXED)       # a hit on the grid


@pytest.mark.parametrize("bad", [dict(context_len=5, seq_len=5), dict(context_len=-1, seq_len=4),
                                 dict(context_len=0, seq_len=0), dict(context_len=1.0, seq_len=4)])
def test_split_bounds_refuse_impossible_passes(bad):
    with pytest.raises(ConfigError, match="context_len|seq_len"):
        split_bounds(order=NATURAL, **bad)
    with pytest.raises(ConfigError, match="ReductionOrder"):
        split_bounds(0, 4, 16)


@pytest.mark.parametrize("kw", [dict(split_size=0), dict(split_size=2.0), dict(split_size=True),
                                dict(batch_invariant=1), dict(batch_invariant="yes")])
def test_reduction_order_refuses_bad_fields(kw):
    with pytest.raises(ConfigError, match=list(kw)[0] if "split" in list(kw)[0] else "batch_invariant"):
        ReductionOrder(**kw)


def brute_force(q, k, v, ctx, qlen):
    """float64 softmax(QK^T / sqrt(D)) V, one query at a time, straight from the definition."""
    B, T, H, D = q.shape
    group = H // k.shape[2]
    out = torch.zeros(B, T, H, D, dtype=torch.float64)
    for b in range(B):
        for t in range(int(qlen[b])):
            p = int(ctx[b]) + t
            for h in range(H):
                s = k[b, :p + 1, h // group].double() @ q[b, t, h].double() / math.sqrt(D)
                out[b, t, h] = torch.softmax(s, 0) @ v[b, :p + 1, h // group].double()
    return out


CASES = [  # B, T, H, Hkv, D, context_lens, query_lens
    (1, 5, 2, 2, 8, [0], [5]),
    (1, 1, 4, 2, 16, [37], [1]),                      # a decode step
    (3, 7, 4, 1, 8, [0, 13, 30], [7, 3, 1]),          # GQA 4:1, padding rows, mixed passes
    (2, 9, 2, 1, 12, [16, 5], [9, 9]),
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("order", [NATURAL, FIXED, ReductionOrder(1), ReductionOrder(5, True),
                                   ReductionOrder(100, True)])
def test_split_attention_is_softmax_attention(case, order):
    B, T, H, Hkv, D, ctx, qlen = case
    g = torch.Generator().manual_seed(hash((case[:5], order.split_size)) % 2**31)
    S = max(c + n for c, n in zip(ctx, qlen)) + 2
    q, k, v = (torch.randn(B, n, h, D, generator=g) for n, h in ((T, H), (S, Hkv), (S, Hkv)))
    ctx_t, qlen_t = torch.tensor(ctx, dtype=torch.int32), torch.tensor(qlen, dtype=torch.int32)
    want = brute_force(q, k, v, ctx, qlen)
    got = split_attention(q, k, v, ctx_t, qlen_t, order)
    assert got.dtype == torch.float32 and got.shape == q.shape
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    got16 = split_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), ctx_t, qlen_t, order)
    assert got16.dtype == torch.bfloat16
    torch.testing.assert_close(got16.double(), want, rtol=3e-2, atol=3e-2)


def test_padding_rows_are_zero_and_garbage_past_the_keys_stays_out():
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(2, 4, 2, 8, generator=g), torch.randn(2, 12, 1, 8, generator=g), torch.randn(2, 12, 1, 8, generator=g)
    ctx, qlen = torch.tensor([3, 0], dtype=torch.int32), torch.tensor([4, 2], dtype=torch.int32)
    clean = split_attention(q, k, v, ctx, qlen, NATURAL)
    k[0, 7:], v[0, 7:], k[1, 2:], v[1, 2:] = float("nan"), float("inf"), float("nan"), float("nan")
    dirty = split_attention(q, k, v, ctx, qlen, NATURAL)
    assert torch.equal(clean, dirty)
    assert torch.equal(dirty[1, 2:], torch.zeros_like(dirty[1, 2:]))


def passes_of_one_sequence(dtype, order, n=45, cuts=(0, 4, 20, 31, 44)):
    """Attention of the last ``n - c`` queries of one sequence, for each cut ``c`` (a prefix-cache
    hit of ``c`` tokens; ``c = 0`` is the cache-off pass), also with the row batched beside others
    and padded wider.  Returns, per pass, the outputs of the queries every pass shares (the last)."""
    g = torch.Generator().manual_seed(7)
    q, k, v = torch.randn(1, n, 4, 16, generator=g), torch.randn(1, n, 2, 16, generator=g), torch.randn(1, n, 2, 16, generator=g)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    outs = {}
    for c in cuts:
        alone = split_attention(q[:, c:], k, v, torch.tensor([c], dtype=torch.int32),
                                torch.tensor([n - c], dtype=torch.int32), order)
        outs[(c, "alone")] = alone[0, -1]
        other = torch.randn(1, n + 9, 2, 16, generator=g).to(dtype)                 # a longer neighbour
        qq = torch.cat([torch.nn.functional.pad(q[:, c:], (0, 0, 0, 0, 0, 6)),
                        torch.randn(1, n - c + 6, 4, 16, generator=g).to(dtype)])
        kk = torch.cat([torch.nn.functional.pad(k, (0, 0, 0, 0, 0, 9)), other])
        vv = torch.cat([torch.nn.functional.pad(v, (0, 0, 0, 0, 0, 9)), other])
        batched = split_attention(qq, kk, vv, torch.tensor([c, 3], dtype=torch.int32),
                                  torch.tensor([n - c, n - c + 6], dtype=torch.int32), order)
        outs[(c, "batched")] = batched[0, n - c - 1]
    return outs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fixed_split_gives_the_same_bits_in_every_pass(dtype):
    outs = passes_of_one_sequence(dtype, FIXED)
    first = outs[(0, "alone")]
    for key, out in outs.items():
        assert torch.equal(out, first), key


def test_the_natural_split_rounds_a_hit_differently_in_bf16():
    outs = passes_of_one_sequence(torch.bfloat16, NATURAL)
    assert torch.equal(outs[(0, "alone")], outs[(0, "batched")])     # same tiles, same bits
    assert not torch.equal(outs[(0, "alone")], outs[(20, "alone")])  # tiles cut at 20: other roundings


def test_split_attention_refuses_what_does_not_fit():
    q, k = torch.zeros(1, 3, 4, 8), torch.zeros(1, 5, 2, 8)
    one, three = torch.tensor([1], dtype=torch.int32), torch.tensor([3], dtype=torch.int32)
    with pytest.raises(TensorError, match="context_lens"):
        split_attention(q, k, k, torch.tensor([1]), three, NATURAL)          # int64 lengths
    with pytest.raises(TensorError, match=r"context \+ query <= S=5"):
        split_attention(q, k, k, three, three, NATURAL)
    with pytest.raises(TensorError, match="H a multiple of Hkv"):
        split_attention(torch.zeros(1, 3, 3, 8), k, k, one, three, NATURAL)
    with pytest.raises(TensorError, match="must match"):
        split_attention(q, k.double(), k.double(), one, three, NATURAL)
    with pytest.raises(ConfigError, match="ReductionOrder"):
        split_attention(q, k, k, one, three, "fixed")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_batch_invariant_matmul_gives_each_row_the_same_bits_whatever_the_rows(dtype):
    g = torch.Generator().manual_seed(3)
    w, x = torch.randn(48, 32, generator=g).to(dtype), torch.randn(70, 32, generator=g).to(dtype)
    full = linear(x, w, FIXED)
    torch.testing.assert_close(full.double(), (x.double() @ w.double().T), rtol=1e-2, atol=2e-2)
    for start, n in ((0, 1), (5, 3), (9, 17), (0, 64)):
        assert torch.equal(linear(x[start:start + n].clone(), w, FIXED), full[start:start + n])
    assert torch.equal(linear(x.view(7, 10, 32), w, FIXED), full.view(7, 10, 48))
    assert torch.equal(linear(x, w, NATURAL), torch.nn.functional.linear(x, w))   # the natural one is nn.Linear's


class PlainCache:
    """A cache written against the plain interface, no ``reduction`` keyword (assignment 1's is)."""

    def __init__(self, inner):
        self.inner = inner

    def store(self, layer, k, v, meta, backend="torch"):
        self.inner.store(layer, k, v, meta, backend)

    def prefill_attention(self, layer, q, k, v, meta, backend="torch"):
        return self.inner.prefill_attention(layer, q, k, v, meta, backend)

    def decode_attention(self, layer, q, meta, backend="torch"):
        return self.inner.decode_attention(layer, q, meta, backend)


def test_a_cache_without_the_reduction_keyword_still_serves_the_default_order():
    model, _ = load_tiny_model()
    ids = torch.tensor([[5, 6, 7, 8]])
    lens = torch.tensor([4], dtype=torch.int32)
    plain = PlainCache(ContiguousKVCache(model.cfg, 1, 16))
    ours = ContiguousKVCache(model.cfg, 1, 16)
    for cache in (plain, ours):
        first = model(ids, AttentionMetadata.for_prefill(lens, 4), cache)[0, -1]
        nxt = model(torch.tensor([[9]]), AttentionMetadata.for_decode(lens + 1), cache)[0, -1]
        if cache is plain:
            want = first, nxt
    assert torch.equal(want[0], first) and torch.equal(want[1], nxt)
