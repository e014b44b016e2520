"""Compiler-style error text for passes after the front end.

The lowering package may not import the front end, so it carries its own
copy of the one format every schedlang error uses::

    file:line:col: error: message
    <the source line>
    <spaces>^~~~

the same shape as the front end's ``schedlang.diagnostics.format_diagnostic``:
the caret line underlines the span on its first line (a ``^`` then ``~`` up
to the span's end, at least one character, never past the line's end); tabs
before the span are kept so the carets line up in a terminal; lines are split
at ``\n`` only, as Lark counts them.
"""

from __future__ import annotations

from collections.abc import Mapping

from schedlang.lowering.source import Span


def caret_line(source_line: str, span: Span) -> str:
    """Spaces up to the span's column, then ``^~~~`` under the span."""
    start = max(span.column - 1, 0)
    rest = max(len(source_line) - start, 1)
    if span.end_line == span.line and span.end_column > span.column:
        width = span.end_column - span.column
    else:
        width = rest
    width = max(min(width, rest), 1)
    prefix = "".join("\t" if character == "\t" else " " for character in source_line[:start])
    return prefix + "^" + "~" * (width - 1)


def format_error(span: Span | None, message: str, sources: Mapping[str, str] | None = None) -> str:
    """``file:line:col: error: message`` plus the source line and carets when the source is known."""
    if span is None:
        return f"error: {message}"
    header = f"{span.file}:{span.line}:{span.column}: error: {message}"
    text = None if sources is None else sources.get(span.file)
    if text is None:
        return header
    lines = [line.rstrip("\r") for line in text.split("\n")]
    if not 1 <= span.line <= len(lines):
        return header
    source_line = lines[span.line - 1]
    return "\n".join((header, source_line, caret_line(source_line, span)))
