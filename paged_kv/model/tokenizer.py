"""``ByteTokenizer``: UTF-8 bytes as tokens (vocab 256), so the book needs no downloads.

One token per byte keeps the KV arithmetic visible: a prompt of n ASCII characters is exactly
n tokens, so "tokens" and "characters" coincide in every figure of the book.
"""

from __future__ import annotations

from typing import Iterable

from ..errors import PromptError


class ByteTokenizer:
    """Encode text to UTF-8 byte ids (0..255) and back.

    Decoding uses ``errors="replace"``: a sampled sequence may stop in the middle of a
    multi-byte character, and the book should still print it.
    """

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        """Return the UTF-8 bytes of ``text`` as ints. Raises ``PromptError`` if not a str."""
        if not isinstance(text, str):
            raise PromptError(f"expected a str to encode, got {type(text).__name__}: {text!r}")
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        """Return the text for byte ids. Raises ``PromptError`` on an id outside 0..255."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < 256]
        if bad:
            raise PromptError(f"token ids must be in 0..255, got {bad[:5]}")
        return bytes(ids).decode("utf-8", errors="replace")
