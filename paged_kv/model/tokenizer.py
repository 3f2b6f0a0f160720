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

Going the other way, not every Python ``str`` has UTF-8 bytes: a *surrogate* (U+D800 to U+DFFF, half
of a UTF-16 pair, e.g. from a JSON escape ``"\\ud83d"`` or UTF-16 text cut inside an emoji)
is a code point no UTF-8 byte sequence stands for.  :meth:`ByteTokenizer.encode` refuses such text
with a :class:`~paged_kv.errors.PromptError` naming the first one, rather than dropping or replacing
it: a prompt that silently lost a character would give tokens the reader did not type.
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


def _surrogate_message(text: str, i: int) -> str:
    """Why ``text`` has no UTF-8 bytes: its character ``i`` is a surrogate.  A high surrogate
    followed by a low one is a UTF-16 pair written as two escapes; the message names the character
    the pair stands for, which is what the writer most likely meant."""
    code = ord(text[i])
    low = ord(text[i + 1]) if i + 1 < len(text) else 0
    paired = code < 0xDC00 and 0xDC00 <= low <= 0xDFFF          # high, then low: a UTF-16 pair
    kind = ("" if paired else "lone ") + ("high" if code < 0xDC00 else "low")
    where = f"...{text[max(0, i - 10):i + 11]!r}..." if len(text) > 21 else repr(text)
    msg = (f"the text cannot be encoded as UTF-8: character {i} is U+{code:04X}, a {kind} "
           f"surrogate (half of a UTF-16 pair), in {where}")
    others = sum(0xD800 <= ord(c) <= 0xDFFF for c in text[i + 1:])
    if others:
        msg += f"; {others} more surrogate{'s' if others > 1 else ''} after it"
    if paired:
        pair = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
        msg += f"; with the next one it stands for U+{pair:X} {chr(pair)!r}: write that character instead"
    return msg


class ByteTokenizer:
    """Encode text to UTF-8 byte ids (0..255) and back, and label each byte for a figure."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        """Return the UTF-8 bytes of ``text`` as ints.

        Raises ``PromptError`` if ``text`` is not a str, or holds a surrogate (no UTF-8 bytes
        exist for it; the message names the first one's character index and code point).
        """
        if not isinstance(text, str):
            raise PromptError(f"expected a str to encode, got {type(text).__name__}: {text!r}")
        try:
            return list(text.encode("utf-8"))
        except UnicodeEncodeError as e:   # strict UTF-8 fails on surrogates only (U+D800..U+DFFF)
            raise PromptError(_surrogate_message(text, e.start)) from None

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
