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
bits wide.  vLLM v1 used ``hash()`` by default until v0.10.2 and SHA-256 since (its
``prefix_caching_hash_algo``: ``sha256``, ``sha256_cbor``, and the faster, non-cryptographic
``xxhash``/``xxhash_cbor``), after a predictable ``hash(None)`` made crafted collisions feasible
(advisory GHSA-rm76-4mrf-v9r8).  vLLM seeds the chain with a value, ``NONE_HASH``; we use ``None``.

**The token check.**  A hash is an index, not a proof: two different prefixes can, in
principle, hash alike.  Each entry therefore stores the token ids of its whole prefix and the
extra key, and a hit is accepted only when they equal the request's; a collision costs a miss,
never a wrong block (tested with a constant hash function).  Only full blocks are cached: a
partial last block still changes.

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


@dataclass(frozen=True)
class CacheEntry:
    """What the cache knows about one block: its hash, the token ids of its whole prefix (tokens
    ``0 .. len(prefix) - 1``, ending with the block's own) and the extra key."""

    block_hash: bytes
    prefix: tuple
    extra_key: Hashable


class PrefixCache:
    """Hash -> cached blocks, and block -> its :class:`CacheEntry`.

    Args:
        block_size: tokens per block (BS).
        hash_fn: ``"sha256"`` or a function ``(parent, token_ids, extra_key) -> hashable``
            (tests inject a constant one to force collisions).

    Several blocks may carry the same hash (two requests computed the same prefix at once, or a
    collision); :meth:`lookup` takes the first whose stored tokens match.

    Raises:
        ConfigError: ``block_size`` not an int >= 1; an unknown hash algorithm.
        BlockError: registering a block twice, or a prefix that is not whole blocks.
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

        A block is a hit only if its hash is present *and* its entry's prefix tokens and extra key
        equal the request's (the token check); the first miss ends the run.  ``max_blocks`` caps
        the run (the scheduler keeps the last prompt token out of it).  Changes nothing.
        """
        hashes = self.hashes(token_ids, extra_key) if hashes is None else hashes
        limit = len(hashes) if max_blocks is None else min(max_blocks, len(hashes))
        key, hits = canonical_key(extra_key), []
        for i in range(limit):
            prefix = None
            for block_id in self._by_hash.get(hashes[i], ()):
                e = self._entry[block_id]
                if prefix is None:
                    prefix = tuple(token_ids[:(i + 1) * self.block_size])
                if e.prefix == prefix and canonical_key(e.extra_key) == key:
                    hits.append(block_id)
                    break
            else:
                break
        return hits

    # --- changes ------------------------------------------------------------------------------
    def register(self, block_id: int, block_hash, prefix: Sequence[int], extra_key=None) -> None:
        """Record that full block ``block_id`` holds the K/V of ``prefix`` (its last ``BS`` tokens)."""
        if block_id in self._entry:
            raise BlockError(f"block {block_id} is already cached")
        if not prefix or len(prefix) % self.block_size:
            raise BlockError(f"a cached block ends a prefix of whole blocks of {self.block_size} tokens; "
                             f"got {len(prefix)} tokens")
        self._entry[block_id] = CacheEntry(block_hash, tuple(prefix), extra_key)
        self._by_hash.setdefault(block_hash, {})[block_id] = None

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

    def check(self) -> None:
        """The two indexes agree: every entry is filed under its hash and nothing else is filed.
        Raises ``BlockError`` naming the first breach."""
        filed = {b for group in self._by_hash.values() for b in group}
        if filed != set(self._entry):
            raise BlockError(f"hash index {sorted(filed)} differs from cached blocks {sorted(self._entry)}")
        for h, group in self._by_hash.items():
            for b in group:
                if self._entry[b].block_hash != h:
                    raise BlockError(f"block {b} is filed under a hash that is not its own")
