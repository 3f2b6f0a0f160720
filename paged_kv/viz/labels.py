"""How a token's text is written inside a figure, in one place: whitespace made visible.

A slot that stores a space or a newline would otherwise carry a blank label in the full colour of
a stored token, which at a glance looks like a slot with nothing in it.  Every figure that writes
token text into a slot or a box (:mod:`~paged_kv.viz.blocks` and the figures built on it,
:mod:`~paged_kv.viz.logical_view`, :mod:`~paged_kv.viz.prefix_cache`) passes it through
:func:`visible_token`, so a space reads ``␣`` and a newline ``⏎`` in every chapter.  Hover text
keeps the token's ``repr`` (``' '``, ``'\\n'``), which names it exactly.

The signs are the ones editors use to show whitespace: U+2423 OPEN BOX for a space, U+23CE RETURN
SYMBOL for a newline, U+21E5 for a tab, and the Unicode *Control Pictures* block (U+2400-U+2421)
for the other C0 control characters.
"""

from __future__ import annotations

from ..errors import ConfigError

__all__ = ["CONTROL", "NEWLINE", "SPACE", "TAB", "visible_token"]

SPACE = "\u2423"     # ␣
NEWLINE = "\u23ce"   # ⏎
TAB = "\u21e5"       # ⇥

CONTROL = "\u2370"   # ⍰ a C1 control character (U+0080-U+009F), which has no control picture

# the line breaks that are not "\n": NEXT LINE, LINE SEPARATOR, PARAGRAPH SEPARATOR
_SIGNS = {" ": SPACE, "\n": NEWLINE, "\t": TAB, "\x85": NEWLINE, "\u2028": NEWLINE, "\u2029": NEWLINE}


def _sign(ch: str) -> str:
    if ch in _SIGNS:
        return _SIGNS[ch]
    code = ord(ch)
    if code < 0x20:
        return chr(0x2400 + code)   # the control picture of C0 control `code` (e.g. "\r" -> ␍)
    if code == 0x7F:
        return "\u2421"             # ␡ DELETE
    if 0x80 <= code <= 0x9F:
        return CONTROL
    if ch.isspace():
        return SPACE                # any other space (no-break, thin, ...): a space to the reader
    return ch                       # everything else, format characters (a joiner in an emoji) too


def visible_token(text: str) -> str:
    """``text`` (a token's label, one character or a word) with every whitespace or control
    character replaced by a visible sign: space ``␣``, newline ``⏎`` (also the other line breaks,
    U+0085, U+2028, U+2029), tab ``⇥``, carriage return ``␍`` and the other C0 controls their
    control pictures, a C1 control :data:`CONTROL`, any other Unicode space ``␣``.  Other
    characters, and the empty string (a slot whose token has no label), are kept.

    Raises:
        ConfigError: ``text`` is not a ``str`` (the message names its type and value).
    """
    if not isinstance(text, str):
        raise ConfigError(f"a token label must be a str, got {type(text).__name__}: {text!r:.60}")
    return "".join(_sign(ch) for ch in text)
