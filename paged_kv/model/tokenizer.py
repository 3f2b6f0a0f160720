"""``ByteTokenizer``: UTF-8 bytes as tokens (vocab 256), so the book needs no downloads.

One token per byte keeps the KV arithmetic visible: a prompt of n ASCII characters is exactly
n tokens, so "tokens" and "characters" coincide in every figure of the book.  A character outside
ASCII is 2 to 4 tokens ("é" 2, "—" 3, an emoji 4), so two things need care:

* **Slot labels** (:meth:`ByteTokenizer.token_labels`): decoding one byte of "é" alone gives the
  replacement character "\ufffd"; instead the first byte of a character is labelled with the whole
  character and every continuation byte with :data:`CONTINUATION`.
* **Text of a request still generating** (:meth:`ByteTokenizer.decode` with ``final=False``): the
  last character may be incomplete (its remaining bytes are not sampled yet); it is left out
  rather than shown as "\ufffd".  Python's incremental UTF-8 decoder (``codecs``) does exactly this.
"""

from __future__ import annotations

import codecs
from typing import Iterable

from ..errors import PromptError

CONTINUATION = "⋯"   # label of a byte that continues the character started in an earlier slot
INVALID = "\ufffd"   # label of a byte that can never start or continue a valid character


def _char_length(lead: int) -> int:
    """Bytes in the UTF-8 character that starts with byte ``lead``; 0 if ``lead`` cannot start one."""
    if lead < 0x80:
        return 1
    if 0xC2 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF4:
        return 4
    return 0                                     # a continuation byte (0x80-0xBF) or never valid


class ByteTokenizer:
    """Encode text to UTF-8 byte ids (0..255) and back, and label each byte for a figure."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        """Return the UTF-8 bytes of ``text`` as ints. Raises ``PromptError`` if not a str."""
        if not isinstance(text, str):
            raise PromptError(f"expected a str to encode, got {type(text).__name__}: {text!r}")
        return list(text.encode("utf-8"))

    @staticmethod
    def _ids(ids: Iterable[int]) -> list[int]:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < 256]
        if bad:
            raise PromptError(f"token ids must be in 0..255, got {bad[:5]}")
        return ids

    def decode(self, ids: Iterable[int], final: bool = True) -> str:
        """Return the text for byte ids.

        ``final=True``: the sequence is complete; bytes that do not form a character (a sample
        that stopped mid-character, or an invalid byte) show as "\ufffd".  ``final=False``: the
        sequence is still growing; an incomplete character at its end is left out (it is not an
        error yet), invalid bytes elsewhere still show as "\ufffd".

        Raises ``PromptError`` on an id outside 0..255.
        """
        data = bytes(self._ids(ids))
        return codecs.getincrementaldecoder("utf-8")(errors="replace").decode(data, final=bool(final))

    def token_labels(self, ids: Iterable[int]) -> list[str]:
        """One label per byte id, for drawing each token's slot: the first byte of a character
        shows the character, each further byte :data:`CONTINUATION`.  The bytes of a character
        not yet complete (at the end of ``ids``) all show :data:`CONTINUATION`; a byte that cannot
        belong to a valid character shows "\ufffd".  Raises ``PromptError`` on an id outside 0..255.
        """
        ids = self._ids(ids)
        labels: list[str] = []
        i = 0
        while i < len(ids):
            n = _char_length(ids[i])
            chunk = bytes(ids[i:i + n])
            if n == 0:
                labels.append(INVALID)
                i += 1
                continue
            try:
                char = chunk.decode("utf-8")
            except UnicodeDecodeError:
                # incomplete at the end (every byte so far a continuation): wait for the rest
                if len(chunk) < n and all(0x80 <= b <= 0xBF for b in chunk[1:]):
                    labels += [CONTINUATION] * len(chunk)
                    break
                labels.append(INVALID)          # a bad continuation: only the lead is skipped
                i += 1
                continue
            labels += [char] + [CONTINUATION] * (n - 1)
            i += n
        return labels
