"""Prefix caching at the block layer: the free queue, chained hashes, the token check, the three
rules, LRU eviction, and the block manager's state machine with caching on."""

import dataclasses
import hashlib
import json
import random
from collections import deque

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from paged_kv.blocks import (BlockAllocator, BlockSpaceManager, FreeBlockQueue, PrefixCache, block_hashes,
                             blocks_needed, sha256_block_hash)
from paged_kv.errors import BlockError, ConfigError, PromptError

from test_manager import BlockManagerMachine  # noqa: E402  (tests/blocks is on sys.path)


# --- the free queue ---------------------------------------------------------------------------
@pytest.mark.parametrize("ops", [[("pop",), ("rm", 3), ("app", 0), ("rm", 4), ("app", 3), ("pop",)],
                                 [("rm", 0), ("rm", 5), ("app", 5), ("app", 0), ("pop",), ("pop",)],
                                 [("pop",), ("left", 0), ("rm", 5), ("left", 5), ("pop",), ("rm", 0),
                                  ("pop",), ("pop",), ("pop",), ("pop",), ("left", 2), ("app", 3), ("left", 1)]])
def test_free_queue_behaves_like_a_list(ops):
    q, ref = FreeBlockQueue(6, range(6)), list(range(6))     # a plain list is the reference
    for op in ops:
        if op[0] == "pop":
            assert q.popleft() == ref.pop(0)
        elif op[0] == "rm":
            q.remove(op[1]), ref.remove(op[1])
        elif op[0] == "left":
            q.appendleft(op[1]), ref.insert(0, op[1])
        else:
            q.append(op[1]), ref.append(op[1])
        assert list(q) == ref and len(q) == len(ref)


def test_free_queue_errors():
    q = FreeBlockQueue(3, [0, 1])
    with pytest.raises(BlockError, match="already on the free queue"):
        q.append(1)
    with pytest.raises(BlockError, match="already on the free queue"):
        q.appendleft(0)
    with pytest.raises(BlockError, match="not on the free queue"):
        q.remove(2)
    with pytest.raises(BlockError, match="int in 0..2"):
        q.append(3)
    q.popleft(), q.popleft()
    with pytest.raises(BlockError, match="empty"):
        q.popleft()
    for bad in (-1, 2.5, True):
        with pytest.raises(ConfigError, match=f"num_blocks.*{bad!r}"):
            FreeBlockQueue(bad)


# --- hashes -----------------------------------------------------------------------------------
def test_sha256_block_hash_is_the_documented_encoding():
    parent = sha256_block_hash(None, [1, 2], None)
    want = hashlib.sha256(json.dumps([parent.hex(), [3, 4], ["lora", 1]], separators=(",", ":")).encode()).digest()
    assert sha256_block_hash(parent, (3, 4), ("lora", 1)) == want


def test_chained_hashes_name_the_whole_prefix():
    a = block_hashes([1, 2, 3, 4, 5, 6, 7], 2)
    b = block_hashes([9, 9, 3, 4, 5, 6], 2)
    assert len(a) == 3 and len(b) == 3                     # full blocks only
    assert all(x != y for x, y in zip(a, b))              # same block tokens, other parent: other hash
    assert block_hashes([1, 2, 3, 4, 0], 2)[:2] == a[:2]
    assert block_hashes([1, 2], 2, "salt") != block_hashes([1, 2], 2)
    with pytest.raises(ConfigError, match="extra cache key"):
        block_hashes([1, 2], 2, 1.5)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_a_bad_block_size_is_refused_by_name(bad):
    with pytest.raises(ConfigError, match=f"block_size.*{bad!r}"):
        block_hashes([1, 2, 3, 4], bad)
    with pytest.raises(ConfigError, match=f"block_size.*{bad!r}"):
        PrefixCache(bad)


@pytest.mark.parametrize("tokens, named", [([1, 2.5], "2.5"), ([1, -3], "-3"), ([True, 2], "True"),
                                           ("ab", "'ab'")])
def test_a_bad_token_id_is_refused_not_truncated(tokens, named):
    # int(2.5) would silently hash token 2: the block would be found by a prompt that holds token 2
    with pytest.raises(PromptError, match=named):
        block_hashes(tokens, 2)
    with pytest.raises(PromptError, match=named):
        sha256_block_hash(None, tokens)
    assert block_hashes([1, 2, 3], 2) == block_hashes([1, 2, 9], 2)      # only full blocks are checked and hashed


def test_the_token_check_settles_a_collision():
    c = PrefixCache(2, hash_fn=lambda parent, tokens, key: "same")
    first = c.register(0, "same", [1, 2])
    c.register(1, "same", [3, 4], parent=first)
    assert c.lookup([1, 2, 3, 4]) == [0, 1]
    assert c.lookup([3, 4, 3, 4]) == []                   # block 1 holds (3, 4), but after (1, 2)
    assert c.lookup([1, 2, 9, 9]) == [0]
    assert c.lookup([1, 2, 3, 4], extra_key="other") == []
    with pytest.raises(ConfigError, match="prefix_caching_hash_algo"):
        PrefixCache(2, "md5")


# --- entries of O(BS) tokens, chained by prefix ids --------------------------------------------
def test_a_long_prompt_stores_each_token_id_once():
    bs, rng = 16, random.Random(0)
    prompt = [rng.randrange(50_000) for _ in range(2048)]
    m = BlockSpaceManager(2048 // bs + 1, bs, enable_prefix_caching=True)
    table = m.allocate("a", len(prompt)).block_ids
    m.cache_full_blocks("a", prompt, len(prompt))
    entries = m.cache.entries()
    assert len(entries) == 128 and sum(len(e.token_ids) for e in entries.values()) == len(prompt)
    assert [entries[b].depth for b in table] == list(range(128))
    assert m.cache_hit(prompt + [7]) == table             # all 128 blocks found again


def test_an_evicted_parent_whose_block_id_is_reused_never_vouches_for_its_old_child():
    """Block 0 caches (1, 2) and block 1 its child (3, 4).  Swapping out frees the parent first, so
    block 0 is evicted and refilled with (5, 6) while block 1 stays cached-free.  Every hash is
    the same: only the parent link can tell that block 1 followed (1, 2), not (5, 6)."""
    m = BlockSpaceManager(4, 2, num_cpu_blocks=2, enable_prefix_caching=True, hash_fn=lambda p, t, k: 0)
    a = [1, 2, 3, 4]
    m.allocate("a", 4)
    m.cache_full_blocks("a", a, 4)
    assert m.block_table("a").block_ids == [0, 1]
    m.swap_out(["a"])                                     # GPU blocks freed in table order: 0, then 1
    for sid in ("x", "y"):
        m.allocate(sid, 2)                                # blocks 2 and 3: the empty ones go first
    m.allocate("f", 2)
    assert m.block_table("f").block_ids == [0] and m.cache.evictions == [0] and 1 in m.cache
    m.cache_full_blocks("f", [5, 6], 2)                   # block 0 now caches (5, 6)
    assert m.cache_hit([5, 6, 3, 4, 9]) == [0]            # block 1 holds (3, 4), but after (1, 2)
    assert m.cache_hit(a + [9]) == []                     # (1, 2) is gone, and its child with it
    m.check()


def test_a_prefix_computed_twice_shares_one_prefix_id():
    """Two requests compute the same 2-block prompt at once and then diverge; a third request
    repeating the second one must find the second one's third block, whichever copy of the shared
    blocks the lookup took."""
    m = BlockSpaceManager(12, 2, enable_prefix_caching=True)
    shared = [1, 2, 3, 4]
    for sid, own in (("a", [5, 6]), ("b", [7, 8])):
        m.allocate(sid, 6)
    for sid, own in (("a", [5, 6]), ("b", [7, 8])):
        m.cache_full_blocks(sid, shared + own, 6)
    ta, tb = m.block_table("a").block_ids, m.block_table("b").block_ids
    ea, eb = m.cache.entry(ta[1]), m.cache.entry(tb[1])
    assert ea.block_id != eb.block_id and ea.prefix_id == eb.prefix_id
    hit = m.cache_hit(shared + [7, 8, 0])
    assert len(hit) == 3 and hit[2] == tb[2]
    m.check()


def test_prefix_cache_register_refuses_what_it_cannot_vouch_for():
    c = PrefixCache(2)
    e = c.register(0, b"h0", [1, 2])
    with pytest.raises(BlockError, match="already cached"):
        c.register(0, b"h0", [1, 2])
    with pytest.raises(BlockError, match="its own 2 tokens; got 4"):
        c.register(1, b"h1", [1, 2, 3, 4], parent=e)      # a whole prefix is not an entry any more
    with pytest.raises(PromptError, match="2.5"):
        c.register(1, b"h1", [3, 2.5], parent=e)
    c.evict(0)
    with pytest.raises(BlockError, match="parent entry of block 1 .block 0. is not cached"):
        c.register(1, b"h1", [3, 4], parent=e)


def test_manager_cache_checks_fire():
    """Each invariant the manager checks for cached blocks, broken on purpose."""
    def fresh():
        m = BlockSpaceManager(6, 2, enable_prefix_caching=True)
        m.allocate("a", 4)
        m.cache_full_blocks("a", [1, 2, 3, 4], 4)
        m.check()
        return m, m.block_table("a").block_ids

    m, (b0, b1) = fresh()
    m.cache._entry[b1] = dataclasses.replace(m.cache._entry[b1], depth=0)
    with pytest.raises(BlockError, match=f"block {b1} at depth 0 has parent"):   # the cache's own check
        m.check()
    m, (b0, b1) = fresh()
    m.cache._entry[b1] = dataclasses.replace(m.cache._entry[b1], depth=3)
    with pytest.raises(BlockError, match=f"block {b1} is block 3 of its prefix but logical block 1"):
        m.check()
    m, (b0, b1) = fresh()
    m.cache._entry[b1] = dataclasses.replace(m.cache._entry[b1], parent=m.cache._entry[b1].prefix_id)
    with pytest.raises(BlockError, match=f"block {b1} of sequence 'a' does not follow"):
        m.check()
    m, (b0, b1) = fresh()
    m.cache._entry[b0] = dataclasses.replace(m.cache._entry[b0], depth=1, parent=m.cache._entry[b1].prefix_id)
    with pytest.raises(BlockError, match=f"block {b0} is block 1 of its prefix but logical block 0"):
        m.check()
    m, (b0, b1) = fresh()
    e = m.cache._entry[b1]
    m.cache._entry[b1] = dataclasses.replace(e, prefix_id=m.cache._entry[b0].prefix_id)
    with pytest.raises(BlockError, match="names two different prefixes"):
        m.check()


# --- the three rules --------------------------------------------------------------------------
def test_rule_1_only_computed_tokens_are_cached_and_the_last_prompt_token_runs():
    m = BlockSpaceManager(8, 4, enable_prefix_caching=True)
    toks = list(range(8))
    m.allocate("a", 8)
    assert m.cache_full_blocks("a", toks, 7) == [m.block_table("a")[0]]   # block 1 lacks token 7's K/V
    assert m.cache_full_blocks("a", toks, 8) == [m.block_table("a")[1]]
    assert len(m.cache_hit(toks)) == 1                    # a hit stops before the last token
    assert len(m.cache_hit(toks + [8])) == 2


def test_rule_2_a_block_is_registered_when_it_fills_during_decode():
    m = BlockSpaceManager(8, 4, enable_prefix_caching=True)
    toks = [5, 6, 7]
    m.allocate("a", 3)
    assert m.cache_full_blocks("a", toks, 3) == []        # a partial block is never cached
    m.append_slot("a")
    toks.append(8)
    assert m.cache_full_blocks("a", toks, 4) == [m.block_table("a")[0]]
    e = m.cache.entry(m.block_table("a")[0])
    assert (e.token_ids, e.parent, e.depth) == ((5, 6, 7, 8), None, 0)


def test_rule_3_freed_blocks_stay_cached_until_needed_then_leave_lru_first():
    m = BlockSpaceManager(6, 2, enable_prefix_caching=True)
    a, b = [1, 2, 3, 4], [7, 8, 9, 10]
    for sid, toks in (("a", a), ("b", b)):
        m.allocate(sid, 4)
        m.cache_full_blocks(sid, toks, 4)
    ta, tb = m.block_table("a").block_ids, m.block_table("b").block_ids
    m.free("a"), m.free("b")                              # freed last block first: a1 a0 b1 b0
    assert m.allocator.cached_free() == [ta[1], ta[0], tb[1], tb[0]]
    assert len(m.cache) == 4 and all(m.allocator.ref_count(x) == 0 for x in ta + tb)
    m.allocate("c", 4)                                    # 2 plain free blocks: nothing evicted
    assert len(m.cache) == 4 and m.cache.evictions == []
    m.allocate("d", 2)                                    # the least recently freed goes first
    assert m.cache.evictions == [ta[1]] and m.cache.entry(ta[1]) is None
    assert m.cache_hit(a + [0]) == [ta[0]]                # a's first block is still found
    m.check()


def test_a_hit_revives_a_cached_free_block_from_the_middle_of_the_queue():
    m = BlockSpaceManager(4, 2, enable_prefix_caching=True)
    m.allocate("a", 4)
    m.cache_full_blocks("a", [1, 2, 3, 4], 4)
    t = m.block_table("a").block_ids
    m.free("a")
    hit = m.cache_hit([1, 2, 3, 4, 5])
    assert hit == t and m.blocks_to_allocate(5, hit) == 3
    m.allocate("b", 5, cached=hit)
    assert m.block_table("b").block_ids[:2] == t and all(m.allocator.ref_count(x) == 1 for x in t)
    with pytest.raises(BlockError, match="not a prefix-cache hit"):
        m.allocate("c", 3, cached=[m.block_table("b")[2]])
    m.check()


@pytest.mark.parametrize("empty_freed_last", [True, False])
def test_a_free_block_that_caches_nothing_is_used_before_a_cached_entry_is_evicted(empty_freed_last):
    """Two free blocks, one cached-free (c's full block) and one empty (e's partial block); a
    one-token request takes the empty one whichever was freed last, and c's block is still a hit."""
    m = BlockSpaceManager(3, 2, enable_prefix_caching=True)
    m.allocate("h", 2)                                    # holds the third block throughout
    m.allocate("c", 2)
    m.cache_full_blocks("c", [1, 2], 2)
    m.allocate("e", 1)
    cached, empty = m.block_table("c")[0], m.block_table("e")[0]
    for sid in (("c", "e") if empty_freed_last else ("e", "c")):
        m.free(sid)
    assert m.allocator.free_list() == [empty, cached] and m.allocator.cached_free() == [cached]
    assert m.allocate("r", 1).block_ids == [empty]
    assert m.cache.evictions == [] and m.cache_hit([1, 2, 3]) == [cached]
    m.check()


def test_without_a_cache_freed_blocks_keep_fifo_order():
    a = BlockAllocator(3)
    assert [a.allocate() for _ in range(3)] == [0, 1, 2]
    a.free(2), a.free(0), a.free(1)
    assert a.free_list() == [2, 0, 1]                     # the tail, as before: nothing to protect


def test_allocator_check_fires_when_a_cached_free_block_precedes_an_empty_one():
    m = BlockSpaceManager(3, 2, enable_prefix_caching=True)
    m.allocate("c", 2)
    m.cache_full_blocks("c", [1, 2], 2)
    m.free("c")
    (b,) = m.allocator.cached_free()
    m.check()
    m.allocator._free.remove(b)
    m.allocator._free.appendleft(b)
    with pytest.raises(BlockError, match=f"cached-free block {b} sits ahead of a free block that caches nothing"):
        m.check()


def test_allocator_touch_refuses_a_block_that_caches_nothing():
    a = BlockAllocator(3)
    a.cache = PrefixCache(2)
    with pytest.raises(BlockError, match="holds no cached prefix"):
        a.touch(0)


# --- the state machine, with caching on -------------------------------------------------------
class PrefixCachingMachine(BlockManagerMachine):
    """The block manager's state machine (allocate / append / fork / free, a dict standing for the
    KV cache) with prefix caching on, plus prompts from a two-token alphabet that hit each other.

    K/V depend on every token before them, so besides the dict (slot -> token) the model keeps, per
    block, the prefix its K/V were computed after (``origin``: tokens ``0 .. end of the block`` of
    the sequence that wrote it, refreshed for every held full block after every step; a block
    keeps it while free, until someone else writes it).  Checked: a hit block's origin is the
    prompt's own prefix (not just the same block tokens: a collision or a stale parent link would
    hand over K/V computed after other tokens); every entry's tokens and depth agree with the dict
    and the origin; a hit is at least as long as the cached, still-held blocks of any sequence that
    shares the prompt's prefix (a lookup must not lose a chain it could prove); ref counts equal
    holders; the cached-free blocks are exactly the evictable ones (cached, ref count 0), they sit
    behind every free block that caches nothing, and allocation evicts them in free-queue (LRU)
    order, only when no empty block is left."""

    NB, BS = 10, 2
    HASH = "sha256"

    def __init__(self):
        super().__init__()
        self.m = BlockSpaceManager(self.NB, self.BS, enable_prefix_caching=True, hash_fn=self.HASH)
        self.origin: dict[int, tuple] = {}       # block -> the prefix its K/V were computed after

    def _provable_hit(self, prompt) -> int:
        """Blocks of ``prompt`` that some held sequence holds, cached, from block 0 on."""
        best = 0
        for s, toks in self.tokens.items():
            table, k = self.m.block_table(s).block_ids, 0
            while (k < len(table) and table[k] in self.m.cache
                   and toks[k * self.BS:(k + 1) * self.BS] == prompt[k * self.BS:(k + 1) * self.BS]):
                k += 1
            best = max(best, k)
        return min(best, (len(prompt) - 1) // self.BS)

    @rule(prompt=st.lists(st.integers(0, 1), min_size=1, max_size=9))
    def allocate_cached(self, prompt):
        hit = self.m.cache_hit(prompt)
        for i, b in enumerate(hit):                           # a hit holds the prompt's own tokens
            assert [self.cache[b * self.BS + o] for o in range(self.BS)] == prompt[i * self.BS:(i + 1) * self.BS]
            assert self.origin[b] == tuple(prompt[:(i + 1) * self.BS]), f"block {b} was computed after other tokens"
        assert len(hit) >= self._provable_hit(prompt)
        need = self.m.blocks_to_allocate(len(prompt), hit)
        if need > self.m.num_free_blocks:
            with pytest.raises(Exception):
                self.m.allocate(self.next_id, len(prompt), cached=hit)
            return
        new = blocks_needed(len(prompt), self.BS) - len(hit)
        queue = [b for b in self.m.allocator.free_list() if b not in hit]
        lru = [b for b in queue[:new] if b in self.m.cache]   # the cached-free blocks to go, in order
        empty = [b for b in queue if b not in self.m.cache]
        seen = len(self.m.cache.evictions)
        seq = self.next_id
        self.m.allocate(seq, len(prompt), cached=hit)
        assert self.m.cache.evictions[seen:] == lru
        assert len(lru) == max(0, new - len(empty))           # an entry goes only when no empty block is left
        self.next_id += 1
        self.tokens[seq] = list(prompt)
        for p, slot in enumerate(self.m.slot_mapping(seq)):
            if p >= len(hit) * self.BS:                        # only the uncached suffix is written
                self.cache[slot] = prompt[p]

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def compute(self, data):
        """Every token a sequence holds has its K/V written here: register its full blocks."""
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        self.m.cache_full_blocks(seq, self.tokens[seq], len(self.tokens[seq]))

    @invariant()
    def cache_matches_contents(self):
        m = self.m
        for s, toks in self.tokens.items():                   # who wrote what, after this step
            table = m.block_table(s)
            for i, b in enumerate(table.block_ids):
                if table.filled(i) == self.BS:
                    self.origin[b] = tuple(toks[:(i + 1) * self.BS])
                else:
                    self.origin.pop(b, None)
        for b, e in m.cache.entries().items():
            assert [self.cache.get(b * self.BS + o) for o in range(self.BS)] == list(e.token_ids)
            assert len(self.origin[b]) == (e.depth + 1) * self.BS and self.origin[b][-self.BS:] == e.token_ids
        cached_zero = [b for b in m.allocator.free_list() if b in m.cache]
        assert m.allocator.cached_free() == cached_zero
        flags = [b in m.cache for b in m.allocator.free_list()]
        assert flags == sorted(flags)                         # empty blocks first, then cached-free ones
        assert set(cached_zero) == {b for b in m.cache.entries() if m.allocator.ref_count(b) == 0}


class CollidingPrefixCachingMachine(PrefixCachingMachine):
    """The same, with every block hashed alike: each lookup and each registration meets every
    entry, so only the token check and the parent links keep hits right, after evictions too."""

    HASH = staticmethod(lambda parent, tokens, key: 0)


for machine in (PrefixCachingMachine, CollidingPrefixCachingMachine):
    machine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_prefix_caching_state_machine = PrefixCachingMachine.TestCase
test_prefix_caching_state_machine_with_colliding_hashes = CollidingPrefixCachingMachine.TestCase


def test_discarding_an_entry_never_written_is_not_an_eviction_and_names_bad_blocks():
    """A step registered blocks 0 and 1 of ``a`` and the part that was to write them failed: their
    entries go (the free list then takes them at the head, uncached), no eviction is recorded, and
    nothing hits them; a block that caches nothing, or is not the sequence's, is refused by name."""
    m = BlockSpaceManager(6, 2, enable_prefix_caching=True)
    m.allocate("a", 5)
    blocks = m.block_ids("a")
    assert m.cache_full_blocks("a", [1, 2, 3, 4, 5], 4) == list(blocks[:2])
    m.allocate("b", 1)
    with pytest.raises(BlockError, match=rf"blocks \[{blocks[2]}\] are not cached blocks of sequence 'a'"):
        m.discard_cached("a", [blocks[2]])                     # partial: caches nothing
    with pytest.raises(BlockError, match=rf"\[{m.block_ids('b')[0]}\] are not cached blocks of sequence 'a'"):
        m.discard_cached("a", m.block_ids("b"))
    with pytest.raises(BlockError, match="caches nothing"):
        m.cache.discard(blocks[2])
    m.discard_cached("a", blocks[:2])
    assert m.cache_hit([1, 2, 3, 4, 5]) == [] and m.cache.evictions == [] and len(m.cache) == 0
    m.free("a")
    assert set(m.allocator.free_list()[:3]) == set(blocks)    # uncached: at the head of the free list
    assert m.allocator.cached_free() == []
    m.check()
