"""Byte units, binary and decimal, and how the book prints a byte count.

A leaf module (imports nothing of ours).  ``GiB`` = 2**30 bytes and ``GB`` = 10**9 bytes are
different units, 7.4% apart; vendors, papers and blog posts mix them up, so every number the book
prints says which one it is (:func:`format_bytes` shows both side by side).
"""

from __future__ import annotations

import math
import numbers

from .errors import ConfigError

__all__ = ["B", "GB", "GiB", "KB", "KiB", "MB", "MiB", "format_bytes"]

B = 1
KiB, MiB, GiB = 2**10, 2**20, 2**30
KB, MB, GB = 10**3, 10**6, 10**9

_UNITS = {"B": B, "KiB": KiB, "MiB": MiB, "GiB": GiB, "KB": KB, "MB": MB, "GB": GB}


def format_bytes(n: int | float, unit: str = "both") -> str:
    """``n`` bytes as text.

    ``"both"``: ``"160.00 GiB (171.80 GB)"``; ``"auto"``: the largest binary unit that
    keeps the number >= 1, and its decimal partner: ``"6.13 MiB (6.43 MB)"``; or one
    unit: ``"B"``, ``"KiB"``, ``"MiB"``, ``"GiB"``, ``"KB"``, ``"MB"``, ``"GB"``.  A negative
    ``n`` (a difference of two sizes) keeps its sign, unless it rounds to zero in that unit.

    Raises:
        ConfigError: ``n`` is not a finite real number (bools refused), or an unknown ``unit``.
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Real) or not math.isfinite(n):
        raise ConfigError(f"format_bytes needs a finite number of bytes, got {n!r}")
    if unit == "auto":
        if abs(n) < KiB:
            return f"{n:,} B"
        pairs = [("GiB", "GB"), ("MiB", "MB"), ("KiB", "KB")]
        binary, decimal = next((b, d) for b, d in pairs if abs(n) >= _UNITS[b])
        return f"{_in(n, binary)} ({_in(n, decimal)})"
    if unit == "both":
        return f"{_in(n, 'GiB')} ({_in(n, 'GB')})"
    if unit not in _UNITS:
        known = ", ".join(["both", "auto", *_UNITS])
        raise ConfigError(f"unknown unit {unit!r}; known: {known}")
    return f"{n:,} B" if unit == "B" else _in(n, unit)


def _in(n: int | float, unit: str) -> str:
    """``n`` bytes in ``unit`` with two decimals; no "-0.00" for a small negative ``n``."""
    text = f"{n / _UNITS[unit]:,.2f}"
    return f"{text.removeprefix('-') if float(text.replace(',', '')) == 0 else text} {unit}"
