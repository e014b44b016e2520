"""Source positions and the one way every schedlang message points into a schedule file.

A :class:`Span` is copied from Lark's ``meta`` when the front end builds the AST and travels unchanged
into the lowered program, so that errors found long after parsing (legality, capabilities) still point at
the token in the schedule file. :func:`render_message` is the only renderer of the format every schedlang
error uses, so editors can jump to it::

    file:line:col: error: message
    <the source line>
    <spaces>^~~~
      hint: ...

The caret line underlines the span on its first line (a ``^`` then ``~`` up to the span's end, at least
one character, never past the line's end); tabs before the span are kept so the carets line up in a
terminal; lines are split at ``\\n`` only, as Lark counts them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from schedlang.vocabulary.source_lines import clip_source_line, clip_text, split_source


@dataclass(frozen=True)
class Span:
    """A half-open region of a source file; lines and columns count from 1."""

    file: str
    line: int
    column: int
    end_line: int
    end_column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"

    def offsets(self, text: str) -> tuple[int, int]:
        """(start, end) indices of the span in ``text``, the source it was read from."""
        return text_offset(text, self.line, self.column), text_offset(text, self.end_line, self.end_column)


def text_offset(text: str, line: int, column: int) -> int:
    """The index in ``text`` of a 1-based (line, column) position, lines split at ``\\n`` as Lark counts."""
    lines = text.split("\n")
    return sum(len(earlier) + 1 for earlier in lines[: line - 1]) + column - 1


def apply_edits(text: str, edits) -> str:
    """``text`` with each ``(start, end, replacement)`` applied; the edits index the original text and do not
    overlap (applied from the last, so earlier indices stay valid)."""
    for start, end, replacement in sorted(edits, key=lambda edit: edit[0], reverse=True):
        text = text[:start] + replacement + text[end:]
    return text


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    NOTE = "note"

    def __str__(self) -> str:
        return self.value


def caret_line(source_line: str, span: Span) -> str:
    """Spaces (tabs kept) up to the span's column, then ``^~~~`` under the span."""
    start = max(span.column - 1, 0)
    rest = max(len(source_line) - start, 1)
    if span.end_line == span.line and span.end_column > span.column:
        width = span.end_column - span.column
    else:
        width = rest
    width = max(min(width, rest), 1)
    prefix = "".join("\t" if character == "\t" else " " for character in source_line[:start])
    return prefix + "^" + "~" * (width - 1)


def render_message(
    span: Span | None,
    message: str,
    source_text: str | None = None,
    severity: Severity = Severity.ERROR,
    hint: str | None = None,
    source_lines: list[str] | None = None,
) -> str:
    """``file:line:col: severity: message``, the source line and carets, an optional hint.

    ``source_text`` is the whole file the span points into; when it is ``None`` or the span's line is not
    in it, only the first line (and the hint) is given. Without a span the message has no position.
    ``source_lines`` is that text already split; long lines and messages are clipped
    (schedlang.vocabulary.source_lines).
    """
    message = clip_text(message)
    if span is None:
        lines = [f"{severity}: {message}"]
    else:
        lines = [f"{span.file}:{span.line}:{span.column}: {severity}: {message}"]
        if source_lines is None and source_text is not None:
            source_lines = split_source(source_text)
        if source_lines is not None and 1 <= span.line <= len(source_lines):
            source_line, caret_span = clip_source_line(source_lines[span.line - 1], span)
            lines.append(source_line)
            lines.append(caret_line(source_line, caret_span))
    if hint:
        lines.append(f"  hint: {clip_text(hint)}")
    return "\n".join(lines)


def format_error(span: Span | None, message: str, sources: Mapping[str, str] | None = None) -> str:
    """:func:`render_message` for an error, its source looked up by the span's file in ``sources``."""
    source_text = None if span is None or sources is None else sources.get(span.file)
    return render_message(span, message, source_text)
