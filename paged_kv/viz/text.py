"""Computed prose and tables for the chapters: the book's three display helpers, in one place.

A chapter shows a number either in a figure or in text that a cell computed; these helpers turn
computed values into Markdown the page renders (a table that fits the text column, a sentence
that states a conclusion), so no chapter defines its own copy.

* :func:`md_table`: rows as a Markdown table (a string);
* :func:`table`: display that table;
* :func:`say`: display a computed sentence or paragraph as Markdown;
* :func:`solution`: display an exercise's computed solution as prose folded in a closed box;
* :func:`order_of_magnitude` and :func:`sci_tex`: a number's power of ten, and the number in
  scientific notation for ``$...$`` math (``4.3 \\times 10^{-48}``), so that prose never rounds a
  logarithm into the wrong power;
* :func:`show_source`: display the source of a package object as a highlighted code block;
* :func:`show_diff`: display what changes between two functions' sources as a ``diff`` block.
"""

from __future__ import annotations

import difflib
import inspect
import numbers
import textwrap
from decimal import Decimal
from typing import Iterable, Sequence

from IPython.display import Markdown, display

from ..errors import ConfigError

__all__ = ["md_table", "order_of_magnitude", "say", "sci_tex", "show_diff", "show_source", "solution",
           "table"]


def _cell(value) -> str:
    """One cell: ``str(value)`` with the characters that would break a Markdown row escaped."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def md_table(header: Sequence, rows: Iterable[Sequence]) -> str:
    """A Markdown table with ``header`` and one line per row (every cell through ``str``).

    Raises:
        ConfigError: a row with a different number of cells from the header (a table that would
            render shifted columns).
    """
    header = [_cell(h) for h in header]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for i, row in enumerate(rows):
        row = list(row)
        if len(row) != len(header):
            raise ConfigError(f"row {i} has {len(row)} cells, the header {len(header)}: {row!r:.80}")
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return "\n".join(lines)


def table(header: Sequence, rows: Iterable[Sequence]) -> None:
    """Display :func:`md_table` of ``header`` and ``rows`` (every cell computed by the caller)."""
    display(Markdown(md_table(header, rows)))


def say(text: str) -> None:
    """Display computed prose (Markdown): the conclusion a cell's numbers support, in words."""
    display(Markdown(text))


SOLUTION_SUMMARY = "Solution"


def solution_markdown(text: str) -> str:
    """The Markdown :func:`solution` displays: ``text`` between an HTML ``<details>`` element's
    opening (summary "Solution") and its end, each apart by a blank line so that the text inside is
    still parsed as Markdown (math, code, emphasis) by MyST in the book and by Jupyter and Colab.

    Why ``<details>`` and not a cell tag: a ``hide-cell`` solution cell shows its *code* when
    opened, the ``say(f"...")`` call, and the reader must find the words in it; a MyST dropdown
    directive would print as raw ``:::`` lines in Colab.  The element folds the same way in all three.
    The classes are myst-nb's own toggles' (``admonition hide``), so the box looks like the page's
    other folded cells.

    Raises:
        ConfigError: ``text`` is empty, or contains ``</details>`` (it would close the box early).
    """
    if not isinstance(text, str) or not text.strip() or "</details>" in text:
        raise ConfigError(f"a solution needs non-empty text without '</details>', got {text!r:.80}")
    return (f'<details class="admonition hide above-output solution">\n'
            f'<summary><p class="admonition-title">{SOLUTION_SUMMARY}</p></summary>\n\n'
            f"{text.strip()}\n\n</details>")


def solution(text: str) -> None:
    """Display an exercise's solution, computed by the cell before it, as prose in a closed box
    (:func:`solution_markdown`): the reader opens it after predicting, and reads words, not code.
    Tag the cell ``remove-input``."""
    display(Markdown(solution_markdown(text)))


def order_of_magnitude(x: float) -> int:
    """The power of ten of ``x``: the integer ``e`` with ``10**e <= |x| < 10**(e + 1)``, exactly.

    ``round(math.log10(x))`` is not it: 4.3e-48 has log10 −47.37, which rounds to −47, one power
    too high (the number is about 4 × 10^−48, not 10^−47), and ``floor(log10(x))`` can miss by one
    at powers of ten through float rounding.  This reads the exponent from the decimal number the
    float stands for, its shortest round-tripping ``repr`` (what Python prints), so ``1e-48`` gives
    −48, although the nearest binary float lies just below 10^−48.

    Raises:
        ConfigError: ``x`` is 0, infinite or NaN (no power of ten).
    """
    return _decimal(x).adjusted()


def _decimal(x) -> Decimal:
    """``x`` as the decimal it stands for (an int exactly, a float by its ``repr``), checked."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise ConfigError(f"order_of_magnitude needs a finite nonzero number, got {x!r}")
    d = Decimal(int(x)) if isinstance(x, numbers.Integral) else Decimal(repr(float(x)))
    if not d.is_finite() or d == 0:
        raise ConfigError(f"order_of_magnitude needs a finite nonzero number, got {x!r}")
    return d


def sci_tex(x: float, digits: int = 2) -> str:
    """``x`` in scientific notation for inline math, ``digits`` significant digits: ``sci_tex(4.3e-48)``
    is ``"4.3 \\times 10^{-48}"`` (wrap it in ``$...$``).  The mantissa is rounded first, so 9.96e-48
    at 2 digits gives ``"1.0 \\times 10^{-47}"``.

    Raises:
        ConfigError: ``x`` as for :func:`order_of_magnitude`; ``digits`` not an int >= 1.
    """
    d = _decimal(x)
    if not isinstance(digits, int) or isinstance(digits, bool) or digits < 1:
        raise ConfigError(f"digits must be an int >= 1, got {digits!r}")
    mantissa, exponent = f"{d:.{digits - 1}e}".split("e")        # decimal rounding, half to even
    return f"{mantissa} \\times 10^{{{int(exponent)}}}"


def _source(obj) -> list[str]:
    if isinstance(obj, str):
        return obj.splitlines()
    return textwrap.dedent(inspect.getsource(obj)).splitlines()


def show_source(*objs) -> None:
    """Display the sources of ``objs`` (functions, classes, methods) as one Python code block:
    the package's real code, read with :func:`inspect.getsource`, never a copy."""
    code = "\n\n".join("\n".join(_source(o)) for o in objs)
    display(Markdown(f"```python\n{code}\n```"))


def show_diff(old, new, old_name: str, new_name: str, context: int = 3) -> None:
    """Display a unified diff from ``old`` to ``new`` (objects whose source is read, or strings),
    lines removed marked ``-`` and added ``+``, as a ``diff`` code block."""
    lines = difflib.unified_diff(_source(old), _source(new), old_name, new_name, n=context, lineterm="")
    display(Markdown("```diff\n" + "\n".join(lines) + "\n```"))
