"""Automatic prefix caching: full blocks found again by a hash of everything before and in them.

Follows vLLM v1's automatic prefix caching (the design document "Automatic Prefix Caching",
docs.vllm.ai, and ``vllm/v1/core/kv_cache_utils.py``/``block_pool.py``; read as a map, not
copied), the general form of the vLLM paper's §4.4 "shared prefix".  Pure Python; no tensors.

**A block's identity is its whole prefix.**  The K/V of a token depend on every token before it
(attention) and on anything that changes the model's computation (an adapter, modelled here as
an *extra key* on the request: an adapter's id and a cache salt).  So full block ``i`` of a
sequence is named by the chained hash

    ``h_i = H(h_{i-1}, token ids of block i, extra key)``,  ``h_{-1} = None``

and two sequences share block ``i`` exactly when they agree on tokens ``0 .. (i+1)*BS - 1`` and
the extra key.  Nothing that leaves K/V unchanged goes in (temperature, top-p, seed,
max_tokens): requests that differ only there share blocks.

**The hash.**  ``H`` is SHA-256 (:func:`sha256_block_hash`) over a canonical encoding (JSON of
``[parent hex, token ids, extra key]``): stable across processes and Python versions, unlike the
built-in ``hash()``, which is salted per process for str and bytes (``PYTHONHASHSEED``) and only 64
bits wide; a predictable built-in hash lets crafted prompts collide on purpose (vLLM advisory
GHSA-rm76-4mrf-v9r8).  vLLM v1 defaults to SHA-256 too (``prefix_caching_hash_algo``), over one of
two encodings of the same ``(parent, token ids, extra keys)`` tuple (``vllm/utils/hashing.py``): its
default ``sha256`` hashes a *pickle* (Python's own serialization, reproducible only by Python), and
``sha256_cbor`` hashes canonical CBOR ("a reproducible, cross-language compatible hash"); the faster,
non-cryptographic ``xxhash``/``xxhash_cbor`` use XXH3-128.  Ours is of the ``sha256_cbor`` kind, a
canonical encoding any language can reproduce, but not byte-compatible with it (JSON, not CBOR), and
vLLM seeds the chain with a value, ``NONE_HASH``, where we use ``None``.

**The token check, in O(BS) per block.**  A hash is an index, not a proof: two different prefixes
can, in principle, hash alike.  So a hit is accepted only when the cache can show, from stored
tokens, that the block's whole prefix equals the request's; a collision costs a miss, never a
wrong block (tested with a constant hash function).  Storing each block's whole prefix would prove
it directly but costs O(P^2 / BS) token ids for a P-token prompt (132,096 for 2,048 tokens in
blocks of 16).  Each :class:`CacheEntry` instead stores its block's own ``BS`` token ids, the
extra key, and a link to its parent: the *prefix id* of the prefix before it.  A prefix id names
one prefix (tokens ``0 .. (i+1)*BS - 1`` and the extra key).  Entries whose prefixes are equal
share it (two requests that computed the same system prompt at once), so a lookup that took one
copy of a block still accepts the children of the other; a per-entry id would miss them.  It comes
from a counter, so it is never reused for another prefix.  :meth:`PrefixCache.lookup` then proves a run by induction:
block ``i``'s entry is accepted when its tokens and extra key equal the request's block ``i`` and
its parent is the prefix id accepted for block ``i - 1`` (none for block 0).  A parent named by
its *block id* would not do: a parent block can be evicted and its id reused for other tokens,
after which a stale child would pass the check.  Once every entry holding a prefix id is evicted,
its children can no longer be hit: a recomputed parent gets a new id, so they cost a miss where
vLLM, which trusts the hash, would reuse them.  (It is rare: a request frees its tail blocks
first, so children usually leave before their parent; a swap-out frees the parent first.)  Only
full blocks are cached: a partial last block still changes.

Legend: BS block size (tokens per block).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

from ..errors import BlockError, ConfigError, PromptError
from ..validate import count

__all__ = ["CacheEntry", "HASH_ALGOS", "PrefixCache", "block_hashes", "canonical_key", "sha256_block_hash"]

HashFn = Callable[[bytes | None, tuple, object], bytes]


def canonical_key(extra_key) -> object:
    """The extra key as JSON-ready data: ``None``, a str, an int, or a tuple/list of those
    (nested).  Raises ``ConfigError`` naming anything else (a float or an object has no
    stable, canonical text)."""
    if extra_key is None or isinstance(extra_key, str) or (type(extra_key) is int):
        return extra_key
    if isinstance(extra_key, (tuple, list)):
        return [canonical_key(k) for k in extra_key]
    raise ConfigError(f"an extra cache key must be None, str, int or a tuple of those, got {extra_key!r}")


def _token_ids(token_ids) -> list[int]:
    """``token_ids`` as a list of Python ints >= 0; ``PromptError`` names the first that is not one
    (a float, a bool or a str is not silently truncated into some other token)."""
    if isinstance(token_ids, (str, bytes)):
        raise PromptError(f"token ids must be a sequence of ints, got the {type(token_ids).__name__} {token_ids!r:.60}")
    return [t if type(t) is int and t >= 0 else count("a token id", t, 0, PromptError) for t in token_ids]


def sha256_block_hash(parent: bytes | None, token_ids: Sequence[int], extra_key=None) -> bytes:
    """``SHA-256(JSON([parent hex or null, token ids, extra key]))``: the 32-byte hash of one full
    block given its parent block's hash (``None`` for block 0).

    Raises:
        PromptError: a token id that is not an int >= 0.
        ConfigError: an extra key that is not None, a str, an int or a tuple of those.
    """
    payload = json.dumps([None if parent is None else parent.hex(), _token_ids(token_ids),
                          canonical_key(extra_key)], separators=(",", ":"))
    return hashlib.sha256(payload.encode()).digest()


HASH_ALGOS: dict[str, HashFn] = {"sha256": sha256_block_hash}


def block_hashes(token_ids: Sequence[int], block_size: int, extra_key=None,
                 hash_fn: HashFn = sha256_block_hash, known: list | None = None) -> list:
    """Chained hashes of the *full* blocks of ``token_ids`` (``len // block_size`` of them).

    ``known``: hashes already computed for a prefix of the same tokens (extended in place and
    returned), so a growing sequence hashes each block once.

    Raises:
        ConfigError: ``block_size`` not an int >= 1; an extra key :func:`canonical_key` refuses.
        PromptError: ``token_ids`` a str, or a token id (of a block being hashed) not an int >= 0.
    """
    block_size = count("block_size (tokens per block)", block_size)
    if isinstance(token_ids, (str, bytes)):
        _token_ids(token_ids)
    hashes = [] if known is None else known
    for i in range(len(hashes), len(token_ids) // block_size):
        parent = hashes[-1] if hashes else None
        hashes.append(hash_fn(parent, tuple(_token_ids(token_ids[i * block_size:(i + 1) * block_size])), extra_key))
    return hashes


def _frozen_key(extra_key) -> Hashable:
    """The extra key in its canonical form (:func:`canonical_key`), lists made tuples, so that it can
    be stored and compared: ``("lora", 1)`` and ``["lora", 1]`` are one key, ``1`` and ``"1"`` two."""
    key = canonical_key(extra_key)

    def freeze(k):
        return tuple(freeze(x) for x in k) if isinstance(k, list) else k
    return freeze(key)


@dataclass(frozen=True)
class CacheEntry:
    """What the cache knows about one full block, O(BS) whatever the length of its prefix.

    Attributes:
        block_id: the physical block holding the K/V.
        block_hash: its chained hash (the index it is filed under).
        token_ids: the block's own ``BS`` token ids.
        extra_key: the request's extra key, canonical (see :func:`canonical_key`; lists as tuples).
        parent: the prefix id of the prefix before this block; ``None`` for block 0.
        prefix_id: the id of the prefix this block ends (tokens ``0 .. (depth+1)*BS - 1`` and the
            extra key): equal for two entries exactly when their prefixes are, never reused.
        depth: the block's logical index ``i`` in every sequence that holds it (tokens
            ``i*BS .. (i+1)*BS - 1``).
    """

    block_id: int
    block_hash: Hashable
    token_ids: tuple
    extra_key: Hashable
    parent: int | None
    prefix_id: int
    depth: int


class PrefixCache:
    """Hash -> cached blocks, and block -> its :class:`CacheEntry`.

    Args:
        block_size: tokens per block (BS).
        hash_fn: ``"sha256"`` or a function ``(parent, token_ids, extra_key) -> hashable``
            (tests inject a constant one to force collisions).

    Several blocks may carry the same hash (two requests computed the same prefix at once, or a
    collision); :meth:`lookup` takes the first whose tokens, extra key and parent match.  Memory:
    ``BS`` token ids and a few words per cached block (a P-token prompt stores P token ids).

    Raises:
        ConfigError: ``block_size`` not an int >= 1; an unknown hash algorithm.
        BlockError: registering a block twice, a block that is not ``BS`` tokens, or a parent entry
            that is no longer cached.
    """

    def __init__(self, block_size: int, hash_fn: str | HashFn = "sha256") -> None:
        block_size = count("block_size (tokens per block)", block_size)
        if isinstance(hash_fn, str):
            if hash_fn not in HASH_ALGOS:
                raise ConfigError(f"prefix_caching_hash_algo must be one of {sorted(HASH_ALGOS)} or a "
                                  f"function, got {hash_fn!r}")
            hash_fn = HASH_ALGOS[hash_fn]
        if not callable(hash_fn):
            raise ConfigError(f"hash_fn must be a name or a function, got {hash_fn!r}")
        self.block_size, self.hash_fn = block_size, hash_fn
        self._by_hash: dict[object, dict[int, None]] = {}
        self._entry: dict[int, CacheEntry] = {}
        self._next_prefix_id = 0           # a counter: a prefix id is never handed out twice
        self.evictions: list[int] = []     # block ids whose entry was evicted, oldest first

    # --- queries ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._entry)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._entry

    def entry(self, block_id: int) -> CacheEntry | None:
        """The block's entry, or ``None`` if it caches nothing."""
        return self._entry.get(block_id)

    def entries(self) -> dict[int, CacheEntry]:
        """Every cached block and its entry (a copy)."""
        return dict(self._entry)

    def hashes(self, token_ids: Sequence[int], extra_key=None, known: list | None = None) -> list:
        """:func:`block_hashes` with this cache's block size and hash function."""
        return block_hashes(token_ids, self.block_size, extra_key, self.hash_fn, known)

    def lookup(self, token_ids: Sequence[int], extra_key=None, hashes: list | None = None,
               max_blocks: int | None = None) -> list[int]:
        """Block ids holding the longest cached run of ``token_ids``' full blocks, from block 0.

        Block ``i`` is a hit only if an entry filed under its hash holds the request's block ``i``
        tokens and extra key *and* names as parent the prefix id accepted for block ``i - 1``
        (none for block 0): by induction its whole prefix is the request's (the token check,
        O(BS) per block).  The first miss ends the run.  ``max_blocks`` caps the run (the
        scheduler keeps the last prompt token out of it).  Changes nothing.
        """
        hashes = self.hashes(token_ids, extra_key) if hashes is None else hashes
        limit = len(hashes) if max_blocks is None else min(max_blocks, len(hashes))
        key, bs = _frozen_key(extra_key), self.block_size
        hits, parent = [], None
        for i in range(limit):
            tokens = None
            for block_id in self._by_hash.get(hashes[i], ()):
                e = self._entry[block_id]
                if e.parent != parent:
                    continue
                if tokens is None:
                    tokens = tuple(token_ids[i * bs:(i + 1) * bs])
                if e.token_ids == tokens and e.extra_key == key:
                    hits.append(block_id)
                    parent = e.prefix_id
                    break
            else:
                break
        return hits

    # --- changes ------------------------------------------------------------------------------
    def register(self, block_id: int, block_hash, token_ids: Sequence[int], extra_key=None,
                 parent: CacheEntry | None = None) -> CacheEntry:
        """Record that full block ``block_id`` holds the K/V of ``token_ids`` (its own ``BS`` tokens)
        after the prefix that ``parent`` ends (the entry of the sequence's previous block; ``None``
        for block 0); returns the new entry.  Its prefix id is that of a cached entry with the same
        hash, tokens, extra key and parent (the same prefix, computed twice), else a new one.

        Raises:
            BlockError: ``block_id`` already cached; not ``BS`` token ids; ``parent`` not an entry
                cached now (an evicted entry's prefix can no longer be vouched for).
            PromptError: a token id that is not an int >= 0.
        """
        if block_id in self._entry:
            raise BlockError(f"block {block_id} is already cached")
        tokens = tuple(_token_ids(token_ids))
        if len(tokens) != self.block_size:
            raise BlockError(f"a cached block holds its own {self.block_size} tokens; got {len(tokens)}")
        if parent is not None and self._entry.get(parent.block_id) is not parent:
            raise BlockError(f"the parent entry of block {block_id} (block {parent.block_id}) is not cached")
        key = _frozen_key(extra_key)
        parent_id = None if parent is None else parent.prefix_id
        prefix_id = next((self._entry[b].prefix_id for b in self._by_hash.get(block_hash, ())
                          if (self._entry[b].parent, self._entry[b].token_ids, self._entry[b].extra_key)
                          == (parent_id, tokens, key)), None)
        if prefix_id is None:
            prefix_id, self._next_prefix_id = self._next_prefix_id, self._next_prefix_id + 1
        entry = CacheEntry(block_id, block_hash, tokens, key, parent_id, prefix_id,
                           0 if parent is None else parent.depth + 1)
        self._entry[block_id] = entry
        self._by_hash.setdefault(block_hash, {})[block_id] = None
        return entry

    def evict(self, block_id: int) -> bool:
        """Remove ``block_id``'s entry (before the block is reused); returns whether it had one."""
        e = self._entry.pop(block_id, None)
        if e is None:
            return False
        group = self._by_hash[e.block_hash]
        del group[block_id]
        if not group:
            del self._by_hash[e.block_hash]
        self.evictions.append(block_id)
        return True

    def discard(self, block_id: int) -> None:
        """Remove ``block_id``'s entry because its K/V were never written: it was registered when a
        step was scheduled (as vLLM v1 registers, in ``allocate_slots``) and that step's part that
        was to write it failed or did not run.  Not an eviction (:attr:`evictions` is unchanged): the
        block held nothing worth keeping.  The caller discards the entries registered after it in
        the same sequence too, whose prefix it vouched for.

        Raises:
            BlockError: ``block_id`` caches nothing.
        """
        if block_id not in self._entry:
            raise BlockError(f"block {block_id} caches nothing: there is no entry to discard")
        evictions = len(self.evictions)
        self.evict(block_id)
        del self.evictions[evictions:]

    def check(self) -> None:
        """Verify the cache's own invariants; raise ``BlockError`` naming the first breach.

        In the order checked: the two indexes agree (every entry is filed under its own hash and
        nothing else is filed); each entry names its own block and holds ``BS`` tokens; block 0
        (depth 0) and only it has no parent; entries sharing a prefix id agree on depth, parent,
        tokens and extra key (so a prefix id names one prefix); no prefix id is ahead of the counter.
        """
        filed = {b for group in self._by_hash.values() for b in group}
        if filed != set(self._entry):
            raise BlockError(f"hash index {sorted(filed)} differs from cached blocks {sorted(self._entry)}")
        for h, group in self._by_hash.items():
            for b in group:
                if self._entry[b].block_hash != h:
                    raise BlockError(f"block {b} is filed under a hash that is not its own")
        named: dict[int, tuple] = {}
        for b, e in self._entry.items():
            if e.block_id != b or len(e.token_ids) != self.block_size:
                raise BlockError(f"the entry of block {b} names block {e.block_id} and holds "
                                 f"{len(e.token_ids)} tokens (BS = {self.block_size})")
            if (e.parent is None) != (e.depth == 0):
                raise BlockError(f"block {b} at depth {e.depth} has parent {e.parent}: only block 0 has none")
            if not 0 <= e.prefix_id < self._next_prefix_id:
                raise BlockError(f"block {b} has prefix id {e.prefix_id}, never handed out")
            seen = named.setdefault(e.prefix_id, (e.depth, e.parent, e.token_ids, e.extra_key))
            if seen != (e.depth, e.parent, e.token_ids, e.extra_key):
                raise BlockError(f"prefix id {e.prefix_id} names two different prefixes (block {b} and another)")
