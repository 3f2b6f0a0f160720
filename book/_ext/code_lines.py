"""Sphinx extension: every line of a highlighted code block in its own ``<span class="line">``,
which carries the line's indentation (``style="--indent:8"``), so that a long line that wraps
continues *under its own indentation* plus four columns instead of at the left edge.

The book's CSS wraps code at the column's edge (``_assets/paged_kv.css``, rule 1: ``pre-wrap``
keeps every space); without this, a wrapped line's continuation started at column 0 and an
indented Python block lost its shape.  CSS alone cannot indent a wrapped line by its own leading
spaces: a ``<pre>`` is one box, and ``text-indent`` reaches only its first line.  So the lines
become boxes here (rule 5 of the CSS draws them), in the HTML Pygments writes for every code
cell, cell output and code block; the text is unchanged (copying a block copies the same
characters), and blank lines stay bare newlines.

The line boxes are ``inline-block``, not ``block``: a block box adds a line break of its own to
``innerText``, which the copy button reads, so every copied line would have been doubled.
"""

from __future__ import annotations

import html
import re

from pygments.formatters import HtmlFormatter

_TAG = re.compile(r"<[^>]*>")


def indentation(line_html: str) -> int:
    """Leading spaces of one highlighted line (its tags dropped, entities decoded)."""
    text = html.unescape(_TAG.sub("", line_html))
    return len(text) - len(text.lstrip(" "))


class LineFormatter(HtmlFormatter):
    """Pygments' HTML formatter with each non-blank output line wrapped in
    ``<span class="line" style="--indent:N">…</span>`` (N: the line's leading spaces)."""

    def wrap(self, source):
        return super().wrap(self._lines(source))

    @staticmethod
    def _lines(source):
        for kind, line in source:
            body = line[:-1] if line.endswith("\n") else line
            if kind != 1 or not html.unescape(_TAG.sub("", body)).strip():
                yield kind, line                       # not a code line, or a blank one
                continue
            yield 1, f'<span class="line" style="--indent:{indentation(body)}">{body}</span>{line[len(body):]}'


def _builder_inited(app):
    highlighter = getattr(app.builder, "highlighter", None)
    if app.builder.format == "html" and highlighter is not None and highlighter.dest == "html":
        highlighter.formatter = LineFormatter


def setup(app):
    app.connect("builder-inited", _builder_inited)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
