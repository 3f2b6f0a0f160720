"""Computed prose and tables for the chapters: the book's three display helpers, in one place.

A chapter shows a number either in a figure or in text that a cell computed; these helpers turn
computed values into Markdown the page renders (a table that fits the text column, a sentence
that states a conclusion), so no chapter defines its own copy.

* :func:`md_table`: rows as a Markdown table (a string);
* :func:`table`: display that table;
* :func:`say`: display a computed sentence or paragraph as Markdown;
* :func:`show_source`: display the source of a package object as a highlighted code block;
* :func:`show_diff`: display what changes between two functions' sources as a ``diff`` block.
"""

from __future__ import annotations

import difflib
import inspect
import textwrap
from typing import Iterable, Sequence

from IPython.display import Markdown, display

from ..errors import ConfigError

__all__ = ["md_table", "say", "show_diff", "show_source", "table"]


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
