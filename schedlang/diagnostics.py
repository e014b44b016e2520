"""Diagnostics: what the front end reports about a schedule file.

Every message has the shape compilers use, so editors can jump to it::

    examples/bad.sched:9:14: error: unknown layer kind 'glaa'
      layers = [glaa] * 4
                ^~~~
      hint: did you mean 'gla'?

A pass collects all its diagnostics and raises one :class:`ScheduleError`
holding them and the source text they point into; the CLI prints
:meth:`ScheduleError.render` and exits 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Mapping

from schedlang.lowering.source import Span


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    NOTE = "note"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Diagnostic:
    severity: Severity
    message: str
    span: Span
    hint: str | None = None

    @classmethod
    def error(cls, message: str, span: Span, hint: str | None = None) -> "Diagnostic":
        return cls(Severity.ERROR, message, span, hint)


def _caret_line(source_line: str, span: Span) -> str:
    """``^~~~`` under the span, aligned even when the line holds tabs."""
    start = max(span.column - 1, 0)
    if span.end_line == span.line and span.end_column > span.column:
        width = span.end_column - span.column
    else:
        width = max(len(source_line) - start, 1)
    width = max(min(width, max(len(source_line) - start, 1)), 1)
    indent = "".join("\t" if character == "\t" else " " for character in source_line[:start])
    return indent + "^" + "~" * (width - 1)


def format_diagnostic(diagnostic: Diagnostic, source_text: str | None) -> str:
    """``file:line:col: error: message``, the source line, a caret line, an optional hint.

    ``source_text`` is the whole file the span points into; when it is ``None``
    or the span's line is not in it, only the first line (and the hint) is given.
    """
    span = diagnostic.span
    lines = [f"{span.file}:{span.line}:{span.column}: {diagnostic.severity}: {diagnostic.message}"]
    if source_text is not None:
        # Lark counts lines by '\n' only; str.splitlines would also split at
        # form feeds and other separators and shift the line numbers.
        source_lines = [line.rstrip("\r") for line in source_text.split("\n")]
        if 1 <= span.line <= len(source_lines):
            source_line = source_lines[span.line - 1]
            lines.append(source_line)
            lines.append(_caret_line(source_line, span))
    if diagnostic.hint:
        lines.append(f"  hint: {diagnostic.hint}")
    return "\n".join(lines)


class ScheduleError(Exception):
    """One or more diagnostics about schedule files, with the text they point into."""

    def __init__(self, diagnostics: Iterable[Diagnostic], sources: Mapping[str, str] | None = None):
        self.diagnostics: tuple[Diagnostic, ...] = tuple(diagnostics)
        if not self.diagnostics:
            raise ValueError("a ScheduleError needs at least one diagnostic")
        self.sources: dict[str, str] = dict(sources or {})
        super().__init__(self.render())

    @property
    def error_count(self) -> int:
        return sum(1 for diagnostic in self.diagnostics if diagnostic.severity is Severity.ERROR)

    def render(self) -> str:
        parts = [
            format_diagnostic(diagnostic, self.sources.get(diagnostic.span.file))
            for diagnostic in self.diagnostics
        ]
        count = self.error_count
        if count > 1:
            parts.append(f"{count} errors")
        return "\n".join(parts)

    def __str__(self) -> str:
        return self.render()
