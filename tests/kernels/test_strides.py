"""Every public kernel wrapper over awkward strides, against its reference on the same values.

The stride policy (``kernels/checks.py``): an input a kernel only reads may have any strides; a
tensor it writes in place (a cache, a swap destination) is written through its own strides, or
refused with ``TensorError`` where the kernel cannot (``copy_blocks`` needs contiguous caches;
nothing may be written whose elements share memory).

Each read-only argument in turn is replaced by a view holding the same values with other strides:
stored with two dims swapped (``torch.randn(B, H, T, D).transpose(1, 2)``, the new-user trial that
found the bug), stored in reversed dim order (a D stride that is not 1), every other element of
a tensor twice as long (``x[:, ::2]``; the elements in between hold NaN or a wrong id, so a read
with the wrong strides shows), a narrow of a wider tensor at an offset (``x[..., 1:D + 1]``: a
storage offset too), and a stride-0 ``expand`` where the argument may repeat.  The wrapper must
match its reference on the contiguous values, and so must the reference itself on the view (all
the references are public: the torch backends call them).  Runs in the Triton interpreter.
"""

import paged_kv  # noqa: F401  (switches on the Triton interpreter before triton is imported)

import pytest
import torch

from kernels.cache_ops import store_kv, store_kv_reference, swap_blocks
from kernels.copy_blocks import copy_blocks, copy_blocks_reference
from kernels.decode_attention import decode_attention, decode_attention_reference
from kernels.paged_attention import paged_copy, paged_decode_attention, paged_decode_attention_reference
from kernels.paged_prefill import paged_prefill_attention, paged_prefill_attention_reference
from kernels.prefill_attention import prefill_attention, prefill_attention_reference
from paged_kv.errors import TensorError

NAN = float("nan")
TOL = dict(atol=2e-5, rtol=2e-5)


# --- views with the same values and other strides ---------------------------------------------
def stored_as(x, order):
    """``x``'s values in a tensor whose memory holds its dims in ``order`` (outermost first)."""
    inverse = [order.index(i) for i in range(x.dim())]
    return x.permute(order).contiguous().permute(inverse)


def stepped(x, dim, fill):
    """``x``'s values as every other element along ``dim`` of a tensor twice as long; ``fill`` between."""
    shape = list(x.shape)
    shape[dim] *= 2
    view = torch.full(shape, fill, dtype=x.dtype)[(slice(None),) * dim + (slice(None, None, 2),)]
    return view.copy_(x)


def narrowed(x, dim, fill):
    """``x``'s values at offset 1 along ``dim`` of a tensor 3 longer: wider strides, a storage offset."""
    shape = list(x.shape)
    shape[dim] += 3
    return torch.full(shape, fill, dtype=x.dtype).narrow(dim, 1, x.shape[dim]).copy_(x)


def layouts(ndim, expand=None):
    """``[(name, make)]``: ``make(x, fill)`` returns a view of ``x``'s values with other strides.

    ``expand``: a dim along which the argument may repeat; ``expandN`` then returns ``x``'s first
    slice along it, expanded (stride 0): other values, which the test takes as the plain ones.
    """
    out = []
    if ndim >= 2:
        a, b = (1, 2) if ndim >= 3 else (0, 1)
        swap = list(range(ndim))
        swap[a], swap[b] = b, a
        out.append(("transposed", lambda x, f: stored_as(x, swap)))
    if ndim >= 3:
        out.append(("reversed", lambda x, f: stored_as(x, list(range(ndim))[::-1])))
    step = min(1, ndim - 1)
    out.append((f"step{step}", lambda x, f: stepped(x, step, f)))
    if ndim - 1 != step:
        out.append((f"step{ndim - 1}", lambda x, f: stepped(x, ndim - 1, f)))
    out.append(("narrow", lambda x, f: narrowed(x, ndim - 1, f)))
    if expand is not None:
        out.append((f"expand{expand}", lambda x, f: x.narrow(expand, 0, 1).expand(x.shape)))
    return out


def cases(spec):
    """pytest params ``(arg, make, fill)``, one per read-only argument and layout, from
    ``spec = {arg: (ndim, fill, expand_dim)}``."""
    return [pytest.param(arg, make, fill, id=f"{arg}-{name}")
            for arg, (ndim, fill, expand) in spec.items() for name, make in layouts(ndim, expand)]


def awkward(args, arg, make, fill):
    """``(views, plain)``: ``args`` with ``arg`` replaced by ``make``'s view, and the same values
    contiguous.  Asserts that the view really has other strides (or an offset) than its copy."""
    view = make(args[arg], fill)
    plain = view.contiguous()
    assert view.stride() != plain.stride() or view.storage_offset() != 0, arg
    return {**args, arg: view}, {**args, arg: plain}


def all_awkward(args, spec, kind):
    """Every argument of ``spec`` at once in its layout named ``kind...`` (else its first step)."""
    views = {}
    for arg, (ndim, fill, expand) in spec.items():
        made = dict(layouts(ndim, expand))
        name = next((n for n in made if n.startswith(kind)), next(n for n in made if n.startswith("step")))
        views[arg] = made[name](args[arg], fill)
    return {**args, **views}, {**args, **{a: v.contiguous() for a, v in views.items()}}


ALL_KINDS = ["transposed", "reversed", "step", "narrow", "expand"]


def base_of(view):
    """The tensor a test view was cut from (itself when it is not a view)."""
    return view._base if view._base is not None else view


def outside(view):
    """A copy of ``view``'s base with ``view``'s own elements zeroed: what a write must not change."""
    rest = base_of(view).clone()
    rest.as_strided(view.shape, view.stride(), view.storage_offset()).zero_()
    return rest


# --- the attention wrappers: every argument is only read -------------------------------------
def _prefill_args():
    g = torch.Generator().manual_seed(0)
    B, T, H, Hkv, D = 2, 9, 4, 2, 24
    return dict(q=torch.randn(B, T, H, D, generator=g), k=torch.randn(B, T, Hkv, D, generator=g),
                v=torch.randn(B, T, Hkv, D, generator=g), seq_lens=torch.tensor([9, 4], dtype=torch.int32))


PREFILL = {"q": (4, NAN, 1), "k": (4, NAN, 0), "v": (4, NAN, 0), "seq_lens": (1, 1, 0)}


def _check_prefill(views, plain):
    want = prefill_attention_reference(**plain)
    out = prefill_attention(**views, block_m=16, block_n=16)
    assert out.is_contiguous() and out.shape == want.shape
    torch.testing.assert_close(out, want, **TOL)
    torch.testing.assert_close(prefill_attention_reference(**views), want, **TOL)


@pytest.mark.parametrize("arg,make,fill", cases(PREFILL))
def test_prefill_attention_any_strides(arg, make, fill):
    _check_prefill(*awkward(_prefill_args(), arg, make, fill))


def _decode_args():
    g = torch.Generator().manual_seed(1)
    B, T, H, Hkv, D = 2, 11, 4, 2, 24
    return dict(q=torch.randn(B, H, D, generator=g), k_cache=torch.randn(B, T, Hkv, D, generator=g),
                v_cache=torch.randn(B, T, Hkv, D, generator=g), seq_lens=torch.tensor([11, 5], dtype=torch.int32))


DECODE = {"q": (3, NAN, 1), "k_cache": (4, NAN, 0), "v_cache": (4, NAN, 0), "seq_lens": (1, 1, 0)}


def _check_decode(views, plain):
    want = decode_attention_reference(**plain)
    for splits in (1, 2):
        out = decode_attention(**views, num_splits=splits, block_n=16)
        assert out.is_contiguous() and out.shape == want.shape
        torch.testing.assert_close(out, want, **TOL)
    torch.testing.assert_close(decode_attention_reference(**views), want, **TOL)


@pytest.mark.parametrize("arg,make,fill", cases(DECODE))
def test_decode_attention_any_strides(arg, make, fill):
    _check_decode(*awkward(_decode_args(), arg, make, fill))


def _pool(k, v, BS, g):
    """``paged_copy``'s pool plus one NaN block, whose id fills the gaps of a sliced block table."""
    kc, vc, tables = paged_copy(k, v, BS, generator=g)
    nan = torch.full((1,) + kc.shape[1:], NAN)
    return torch.cat([kc, nan]), torch.cat([vc, nan]), tables, kc.shape[0]


def _paged_decode_args():
    g = torch.Generator().manual_seed(2)
    B, T, H, Hkv, D, BS = 2, 11, 4, 2, 24, 4
    k, v = torch.randn(B, T, Hkv, D, generator=g), torch.randn(B, T, Hkv, D, generator=g)
    k_cache, v_cache, tables, nan_block = _pool(k, v, BS, g)
    return dict(q=torch.randn(B, H, D, generator=g), k_cache=k_cache, v_cache=v_cache, block_tables=tables,
                seq_lens=torch.tensor([11, 5], dtype=torch.int32)), nan_block


def _paged_decode_spec():
    nan_block = _paged_decode_args()[1]
    return {"q": (3, NAN, 1), "k_cache": (4, NAN, 0), "v_cache": (4, NAN, 2),
            "block_tables": (2, nan_block, 0), "seq_lens": (1, 1, 0)}


PAGED_DECODE = _paged_decode_spec()


def _check_paged_decode(views, plain):
    want = paged_decode_attention_reference(**plain)
    for splits in (1, 2):
        out = paged_decode_attention(**views, num_splits=splits, block_n=16)
        assert out.is_contiguous() and out.shape == want.shape
        torch.testing.assert_close(out, want, **TOL)
    torch.testing.assert_close(paged_decode_attention_reference(**views), want, **TOL)


@pytest.mark.parametrize("arg,make,fill", cases(PAGED_DECODE))
def test_paged_decode_attention_any_strides(arg, make, fill):
    _check_paged_decode(*awkward(_paged_decode_args()[0], arg, make, fill))


def _paged_prefill_args():
    g = torch.Generator().manual_seed(3)
    B, H, Hkv, D, BS = 2, 4, 2, 24, 4
    ctx, qlen = [5, 2], [6, 3]
    S = max(c + n for c, n in zip(ctx, qlen))
    k, v = torch.randn(B, S, Hkv, D, generator=g), torch.randn(B, S, Hkv, D, generator=g)
    k_cache, v_cache, tables, nan_block = _pool(k, v, BS, g)
    return dict(q=torch.randn(B, max(qlen), H, D, generator=g), k_cache=k_cache, v_cache=v_cache,
                block_tables=tables, context_lens=torch.tensor(ctx, dtype=torch.int32),
                query_lens=torch.tensor(qlen, dtype=torch.int32)), nan_block


PAGED_PREFILL = {"q": (4, NAN, 1), "k_cache": (4, NAN, 0), "v_cache": (4, NAN, 2),
                 "block_tables": (2, _paged_prefill_args()[1], 0), "context_lens": (1, 0, 0),
                 "query_lens": (1, 1, 0)}


def _check_paged_prefill(views, plain):
    want = paged_prefill_attention_reference(**plain)
    out = paged_prefill_attention(**views, block_m=16, block_n=16)
    assert out.is_contiguous() and out.shape == want.shape
    torch.testing.assert_close(out, want, **TOL)
    torch.testing.assert_close(paged_prefill_attention_reference(**views), want, **TOL)


@pytest.mark.parametrize("arg,make,fill", cases(PAGED_PREFILL))
def test_paged_prefill_attention_any_strides(arg, make, fill):
    _check_paged_prefill(*awkward(_paged_prefill_args()[0], arg, make, fill))


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_attention_with_every_argument_awkward_at_once(kind):
    _check_prefill(*all_awkward(_prefill_args(), PREFILL, kind))
    _check_decode(*all_awkward(_decode_args(), DECODE, kind))
    _check_paged_decode(*all_awkward(_paged_decode_args()[0], PAGED_DECODE, kind))
    _check_paged_prefill(*all_awkward(_paged_prefill_args()[0], PAGED_PREFILL, kind))


def test_the_issue_case_transposed_q():
    """The new-user trial: ``q`` built as ``[B, H, T, D]`` and transposed to ``[B, T, H, D]``.

    Before the fix ``paged_prefill_attention`` allocated its output like this ``q`` and the kernel
    wrote it with the strides of ``q.contiguous()``: max error 2.5 here, silently.
    ``prefill_attention`` passed its kernel the output's own strides and got this ``q`` right, but
    not one stored D-major (max error 4.0: the kernel assumes the output's D stride is 1)."""
    args, _ = _paged_prefill_args()
    B, T, H, D = args["q"].shape
    q = torch.randn(B, H, T, D, generator=torch.Generator().manual_seed(4)).transpose(1, 2)
    want = paged_prefill_attention_reference(**{**args, "q": q.contiguous()})
    torch.testing.assert_close(paged_prefill_attention(**{**args, "q": q}), want, **TOL)
    args = _prefill_args()
    q = torch.randn(2, 4, 9, 24, generator=torch.Generator().manual_seed(5)).transpose(1, 2)
    want = prefill_attention_reference(**{**args, "q": q.contiguous()})
    for view in (q, stored_as(q, [0, 1, 3, 2])):
        torch.testing.assert_close(prefill_attention(**{**args, "q": view}), want, **TOL)


# --- store_kv: k, v, slot_mapping read; the caches written in place --------------------------
def _store_args():
    g = torch.Generator().manual_seed(6)
    T, Hkv, D, NB, BS = 5, 2, 24, 4, 4
    return dict(k=torch.randn(T, Hkv, D, generator=g), v=torch.randn(T, Hkv, D, generator=g),
                k_cache=torch.full((NB, BS, Hkv, D), NAN), v_cache=torch.full((NB, BS, Hkv, D), NAN),
                slot_mapping=torch.tensor([3, 0, -1, 9, 14]))


# A gap in a sliced slot mapping holds -1: reading it instead of a real slot skips a token.
STORE_READS = {"k": (3, NAN, 1), "v": (3, NAN, 1), "slot_mapping": (1, -1, None)}


def _stored(write, args):
    caches = {name: args[name].clone() for name in ("k_cache", "v_cache")}
    write(**{**args, **caches})
    return caches


@pytest.mark.parametrize("arg,make,fill", cases(STORE_READS))
def test_store_kv_reads_any_strides(arg, make, fill):
    views, plain = awkward(_store_args(), arg, make, fill)
    want = _stored(store_kv_reference, plain)
    for write in (store_kv, store_kv_reference):
        got = _stored(write, views)
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("name,make", [pytest.param(n, m, id=n) for n, m in layouts(4)])
def test_store_kv_writes_caches_of_any_layout(name, make):
    """The caches written through their strides: k's and v's layouts differ (v is always stored
    head-major), and nothing outside the view's own elements changes (the gaps hold -7)."""
    args = _store_args()
    want = _stored(store_kv_reference, args)
    for write in (store_kv, store_kv_reference):
        k_cache = make(args["k_cache"], -7.0)
        v_cache = stored_as(args["v_cache"], [0, 2, 1, 3])
        k_rest, v_rest = outside(k_cache), outside(v_cache)
        write(args["k"], args["v"], k_cache, v_cache, args["slot_mapping"])
        torch.testing.assert_close(k_cache, want["k_cache"], rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(v_cache, want["v_cache"], rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(outside(k_cache), k_rest, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(outside(v_cache), v_rest, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("which", ["k_cache", "v_cache"])
def test_store_kv_refuses_a_cache_whose_elements_share_memory(which):
    args = _store_args()
    shared = args[which][:1].expand_as(args[which])          # every block is block 0
    for write in (store_kv, store_kv_reference):
        with pytest.raises(TensorError, match=rf"{which} \(shape \(4, 4, 2, 24\), strides \(0, 48, 24, 1\)\).*share memory"):
            write(**{**args, which: shared})
    assert torch.isnan(args["k_cache"]).all() and torch.isnan(args["v_cache"]).all()


# --- copy_blocks: the mapping read; the caches written in place and flat ---------------------
def _copy_args():
    g = torch.Generator().manual_seed(7)
    L, NB, BS, Hkv, D = 2, 6, 4, 2, 24
    return dict(k_caches=torch.randn(L, NB, BS, Hkv, D, generator=g),
                v_caches=torch.randn(L, NB, BS, Hkv, D, generator=g),
                block_mapping=torch.tensor([[0, 3], [1, 4], [0, 5]]))


def _copied(copy, args):
    caches = {name: args[name].clone() for name in ("k_caches", "v_caches")}
    copy(**{**args, **caches})
    return caches


# A gap in a sliced mapping holds 2, a block no copy touches.  No expand: a repeated row would
# name a destination twice (CacheError, its own test).
@pytest.mark.parametrize("arg,make,fill", cases({"block_mapping": (2, 2, None)}))
def test_copy_blocks_reads_any_mapping_strides(arg, make, fill):
    views, plain = awkward(_copy_args(), arg, make, fill)
    want = _copied(copy_blocks_reference, plain)
    for copy in (copy_blocks, copy_blocks_reference):
        got = _copied(copy, views)
        assert all(torch.equal(got[n], want[n]) for n in want)


@pytest.mark.parametrize("name,make", [pytest.param(n, m, id=n) for n, m in layouts(5)])
@pytest.mark.parametrize("which", ["k_caches", "v_caches"])
def test_copy_blocks_refuses_non_contiguous_caches_and_the_reference_copies_them(which, name, make):
    args = _copy_args()
    want = _copied(copy_blocks_reference, args)
    cache = make(args[which], -7.0)
    before = cache.clone()
    strides = str(cache.stride()).replace("(", r"\(").replace(")", r"\)")
    with pytest.raises(TensorError, match=rf"{which} must be contiguous .*got strides {strides}"):
        copy_blocks(**{**args, which: cache})
    assert torch.equal(cache, before), "a refused call wrote"
    rest = outside(cache)
    copy_blocks_reference(**{**args, which: cache})
    assert torch.equal(cache, want[which]) and torch.equal(outside(cache), rest)


def test_copy_blocks_refuses_caches_whose_elements_share_memory():
    args = _copy_args()
    shared = args["v_caches"][:, :1].expand_as(args["v_caches"])
    for copy in (copy_blocks, copy_blocks_reference):
        with pytest.raises(TensorError, match=r"v_caches \(shape .*, strides \(1152, 0, 48, 24, 1\)\).*share memory"):
            copy(**{**args, "v_caches": shared})


# --- swap_blocks: the source and mapping read; the destination written in place -------------
def _swap_args():
    g = torch.Generator().manual_seed(8)
    L, BS, Hkv, D = 2, 4, 2, 24
    return dict(src_cache=torch.randn(L, 6, BS, Hkv, D, generator=g),
                dst_cache=torch.randn(L, 5, BS, Hkv, D, generator=g),
                block_mapping=torch.tensor([[0, 3], [4, 1], [5, 0]]))


def _swapped(args):
    dst = args["dst_cache"].clone()
    swap_blocks(args["src_cache"], dst, args["block_mapping"])
    return dst


@pytest.mark.parametrize("arg,make,fill", cases({"src_cache": (5, NAN, 1), "block_mapping": (2, 2, None)}))
def test_swap_blocks_reads_any_strides(arg, make, fill):
    views, plain = awkward(_swap_args(), arg, make, fill)
    want = plain["dst_cache"].clone()
    src, ids = plain["src_cache"], plain["block_mapping"]
    want[:, ids[:, 1]] = src[:, ids[:, 0]]                       # expected by torch indexing
    assert torch.equal(_swapped(views), want)


@pytest.mark.parametrize("name,make", [pytest.param(n, m, id=n) for n, m in layouts(5)])
def test_swap_blocks_writes_a_destination_of_any_layout(name, make):
    args = _swap_args()
    want = _swapped(args)
    dst = make(args["dst_cache"], -7.0)
    rest = outside(dst)
    swap_blocks(args["src_cache"], dst, args["block_mapping"])
    assert torch.equal(dst, want) and torch.equal(outside(dst), rest)


def test_swap_blocks_refuses_a_destination_whose_elements_share_memory():
    args = _swap_args()
    shared = args["dst_cache"][:, :1].expand_as(args["dst_cache"])
    with pytest.raises(TensorError, match=r"dst_cache \(shape \(2, 5, 4, 2, 24\), strides .*share memory"):
        swap_blocks(args["src_cache"], shared, args["block_mapping"])


# --- the overlap test itself -------------------------------------------------------------------
def test_may_overlap():
    from kernels.checks import may_overlap

    x = torch.zeros(3, 4, 5)
    for view in (x, x.transpose(0, 2), x[:, ::2], x[..., 1:4], x.narrow(0, 1, 2), x[:1].expand(7, 4, 5).narrow(0, 0, 1),
                 torch.zeros(0, 3).expand(0, 3), x.as_strided((3, 2), (2, 7))):
        assert not may_overlap(view), view.stride()
    for view in (x[:1].expand(3, 4, 5), x[..., :1].expand(3, 4, 5), x.as_strided((4, 3), (1, 2)),
                 x.view(-1).as_strided((2, 3), (2, 1))):
        assert may_overlap(view), view.stride()


def test_may_share_against_a_brute_force():
    """Every pair of views of one small storage: ``may_share`` says False only when the views'
    element offsets are really disjoint (brute force over the offsets)."""
    from kernels.checks import may_share

    base = torch.zeros(2 * 3 * 2 * 4)
    views = {"kv[0]": base.view(2, 3, 2, 4)[0], "kv[1]": base.view(2, 3, 2, 4)[1],
             "nhd[:,0]": base.view(3, 2, 2, 4)[:, 0], "nhd[:,1]": base.view(3, 2, 2, 4)[:, 1],
             "head0": base.view(6, 2, 4)[:, 0], "odd": base[1::2], "even": base[::2],
             "front": base[:20], "back": base[20:], "mid": base[10:30], "all": base,
             "other": torch.zeros(24)}

    def offsets(t):
        if t.untyped_storage().data_ptr() != base.untyped_storage().data_ptr():
            return {("other", i) for i in range(t.numel())}
        idx = torch.arange(base.numel(), dtype=torch.float64)
        return set(torch.as_strided(idx, t.shape, t.stride(), t.storage_offset()).flatten().tolist())
    for a, x in views.items():
        for b, y in views.items():
            if a == b:
                continue
            really = bool(offsets(x) & offsets(y))
            assert may_share(x, y) or not really, (a, b)           # never a miss
            if {a, b} in ({"kv[0]", "kv[1]"}, {"nhd[:,0]", "nhd[:,1]"}, {"front", "back"}, {"all", "other"}):
                assert not may_share(x, y), (a, b)                 # the layouts engines use pass


@pytest.mark.parametrize("case", ["k_cache is v_cache", "overlapping views", "k inside k_cache"])
def test_store_kv_refuses_arguments_that_share_memory(case):
    args = _store_args()
    base = torch.full((5, 4, 2, 24), NAN)
    if case == "k_cache is v_cache":
        args["v_cache"] = args["k_cache"]
    elif case == "overlapping views":
        args["k_cache"], args["v_cache"] = base[:4], base[1:]
    else:
        args["k"] = args["k_cache"].view(-1, 2, 24)[:5]
    for fn in (store_kv, store_kv_reference):
        with pytest.raises(TensorError, match="share memory"):
            fn(**args)


def test_store_kv_takes_k_and_v_caches_interleaved_in_one_tensor():
    """FlashInfer's layout, ``[NB, 2, BS, Hkv, D]``: K and V of a block side by side."""
    args = _store_args()
    kv = torch.full((4, 2, 4, 2, 24), NAN)
    want_k, want_v = args["k_cache"].clone(), args["v_cache"].clone()
    store_kv_reference(args["k"], args["v"], want_k, want_v, args["slot_mapping"])
    store_kv(args["k"], args["v"], kv[:, 0], kv[:, 1], args["slot_mapping"])
    torch.testing.assert_close(kv[:, 0], want_k, equal_nan=True)
    torch.testing.assert_close(kv[:, 1], want_v, equal_nan=True)


def test_store_kv_refuses_a_slot_named_twice():
    from paged_kv.errors import CacheError
    args = _store_args()
    args["slot_mapping"] = torch.tensor([3, 0, -1, 3, -1])
    for fn in (store_kv, store_kv_reference):
        with pytest.raises(CacheError, match=r"slots \[3\]"):
            fn(**args)


def test_copy_blocks_refuses_k_and_v_caches_that_share_memory():
    k = torch.zeros(2, 4, 4, 2, 8)
    with pytest.raises(TensorError, match="share memory"):
        copy_blocks(k, k, torch.tensor([[0, 1]]))


@pytest.mark.parametrize("scale", ["x", float("nan"), float("inf"), True, 0.0, -1.0])
def test_attention_wrappers_refuse_a_bad_scale_by_name(scale):
    from paged_kv.errors import ConfigError
    pre, dec = _prefill_args(), _decode_args()
    pd, _ = _paged_decode_args()
    calls = [(prefill_attention, pre), (prefill_attention_reference, pre), (decode_attention, dec),
             (decode_attention_reference, dec), (paged_decode_attention, pd),
             (paged_decode_attention_reference, pd)]
    for fn, args in calls:
        with pytest.raises(ConfigError, match="scale"):
            fn(**args, scale=scale)
