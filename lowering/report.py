"""Compiler-style error text for passes after the front end.

The lowering package may not import the front end, so it carries its own
copy of the one format every schedlang error uses::

    file:line:col: error: message
    <the source line>
    <spaces>^^^^

The caret line underlines the span on its first line (at least one caret);
tabs before the span are kept so the carets line up in a terminal.
"""

from __future__ import annotations

from collections.abc import Mapping

from schedlang.lowering.source import Span


def caret_line(source_line: str, span: Span) -> str:
    """Spaces up to the span's column, then one caret per underlined character."""
    start = max(span.column - 1, 0)
    prefix = "".join("\t" if character == "\t" else " " for character in source_line[:start])
    if span.end_line == span.line:
        width = span.end_column - span.column
    else:
        width = len(source_line) - start
    return prefix + "^" * max(width, 1)


def format_error(span: Span | None, message: str, sources: Mapping[str, str] | None = None) -> str:
    """``file:line:col: error: message`` plus the source line and carets when the source is known."""
    if span is None:
        return f"error: {message}"
    header = f"{span.file}:{span.line}:{span.column}: error: {message}"
    text = None if sources is None else sources.get(span.file)
    if text is None:
        return header
    lines = text.splitlines()
    if not 1 <= span.line <= len(lines):
        return header
    source_line = lines[span.line - 1]
    return "\n".join((header, source_line, caret_line(source_line, span)))
