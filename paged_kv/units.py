"""Byte units, binary and decimal, and how the book prints a byte count.

A leaf module (imports nothing of ours).  ``GiB`` = 2**30 bytes and ``GB`` = 10**9 bytes are
different units, 7.4% apart; vendors, papers and blog posts mix them up, so every number the book
prints says which one it is (:func:`format_bytes` shows both side by side).
"""

from __future__ import annotations

from .errors import ConfigError

__all__ = ["B", "GB", "GiB", "KB", "KiB", "MB", "MiB", "format_bytes"]

B = 1
KiB, MiB, GiB = 2**10, 2**20, 2**30
KB, MB, GB = 10**3, 10**6, 10**9

_UNITS = {"B": B, "KiB": KiB, "MiB": MiB, "GiB": GiB, "KB": KB, "MB": MB, "GB": GB}


def format_bytes(n: int, unit: str = "both") -> str:
    """``n`` bytes as text.

    ``"both"``: ``"160.00 GiB (171.80 GB)"``; ``"auto"``: the largest binary unit that
    keeps the number >= 1, and its decimal partner: ``"6.13 MiB (6.43 MB)"``; or one
    unit: ``"B"``, ``"KiB"``, ``"MiB"``, ``"GiB"``, ``"KB"``, ``"MB"``, ``"GB"``.

    Raises:
        ConfigError: an unknown ``unit``.
    """
    if unit == "auto":
        if abs(n) < KiB:
            return f"{n:,} B"
        pairs = [("GiB", "GB"), ("MiB", "MB"), ("KiB", "KB")]
        binary, decimal = next((b, d) for b, d in pairs if abs(n) >= _UNITS[b])
        return f"{n / _UNITS[binary]:,.2f} {binary} ({n / _UNITS[decimal]:,.2f} {decimal})"
    if unit == "both":
        return f"{n / GiB:,.2f} GiB ({n / GB:,.2f} GB)"
    if unit not in _UNITS:
        known = ", ".join(["both", "auto", *_UNITS])
        raise ConfigError(f"unknown unit {unit!r}; known: {known}")
    return f"{n:,} B" if unit == "B" else f"{n / _UNITS[unit]:,.2f} {unit}"
