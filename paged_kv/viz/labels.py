"""How text is written inside a figure, in one place: a token's text with its whitespace made
visible (:func:`visible_token`), a title broken to fit a phone (:func:`wrap_title`), and the
labelled ticks of a log axis (:func:`log_ticks`).

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

import math

from ..errors import ConfigError

__all__ = ["CONTROL", "NEWLINE", "SPACE", "TAB", "TITLE_CHARS", "log_ticks", "visible_token", "wrap_title"]

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


TITLE_CHARS = 44   # characters of a 14-px title line that fit a 360-px phone's figure (about 7.5 px each)


def wrap_title(text: str, width: int = TITLE_CHARS) -> str:
    """``text`` broken with ``<br>`` at spaces so that no line is longer than ``width`` characters
    where a space allows it (plotly never wraps a title: one wider than a phone-wide figure was cut
    off at its right edge).  Lines already broken with ``<br>`` are wrapped one by one; a word longer
    than ``width`` keeps a line of its own.  Markup inside a line (``<b>``, ``<sup>``) counts as
    characters, so keep it out of long titles."""
    out = []
    for part in text.split("<br>"):
        lines, line = [], ""
        for word in part.split(" "):
            if line and len(line) + 1 + len(word) > width:
                lines.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        out.extend(lines + [line])
    return "<br>".join(out)


def log_ticks(values) -> tuple[list[float], list[str]]:
    """Ticks for a log axis over ``values`` (the data, > 0): 1, 2 and 5 times each power of ten
    from the one below the smallest value to the one above the largest, every tick with its number
    (``"50"``, ``"1,000"``, ``"0.2"``); over more than four decades, the powers of ten only.
    The first tick is at or below the smallest value and the last at or above the largest, so an
    axis ranged over them shows a number at both ends.  Plotly's own log ticks label only the decades and leave
    bare small digits (2, 3, … 9) between them, which read as noise.

    Raises:
        ConfigError: no value > 0 (a log axis has nothing to show).
    """
    positive = [float(v) for v in values if v is not None and math.isfinite(v) and v > 0]
    if not positive:
        raise ConfigError(f"log_ticks needs a value > 0, got {list(values)!r:.80}")
    lo, hi = min(positive), max(positive)

    def spanning(mantissas):
        ticks = [m * 10.0 ** e for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
                 for m in mantissas]
        below = max(t for t in ticks if t <= lo * (1 + 1e-9))   # one tick at or below the data, one at or above
        above = min(t for t in ticks if t >= hi * (1 - 1e-9))
        return [t for t in ticks if below <= t <= above]

    vals = spanning((1, 2, 5))
    if len(vals) > 12:                                   # many decades: a labelled tick per decade
        vals = spanning((1,))
    return vals, [f"{t:,.0f}" if t >= 1 else f"{t:g}" for t in vals]
