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
from schedlang.source_lines import (
    MAX_SHOWN_DIAGNOSTICS,
    clip_source_line,
    clip_text,
    more_diagnostics_line,
    split_source,
)


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


def format_diagnostic(
    diagnostic: Diagnostic, source_text: str | None, source_lines: list[str] | None = None
) -> str:
    """``file:line:col: error: message``, the source line, a caret line, an optional hint.

    ``source_text`` is the whole file the span points into; when it is ``None``
    or the span's line is not in it, only the first line (and the hint) is given.
    ``source_lines`` is that text already split (schedlang.source_lines bounds what is shown).
    """
    span = diagnostic.span
    lines = [f"{span.file}:{span.line}:{span.column}: {diagnostic.severity}: {clip_text(diagnostic.message)}"]
    if source_lines is None and source_text is not None:
        source_lines = split_source(source_text)
    if source_lines is not None:
        if 1 <= span.line <= len(source_lines):
            source_line, caret_span = clip_source_line(source_lines[span.line - 1], span)
            lines.append(source_line)
            lines.append(_caret_line(source_line, caret_span))
    if diagnostic.hint:
        lines.append(f"  hint: {clip_text(diagnostic.hint)}")
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
        split = {name: split_source(text) for name, text in self.sources.items()}
        shown = self.diagnostics[:MAX_SHOWN_DIAGNOSTICS]
        parts = [format_diagnostic(diagnostic, None, split.get(diagnostic.span.file)) for diagnostic in shown]
        if len(self.diagnostics) > len(shown):
            parts.append(more_diagnostics_line(len(self.diagnostics) - len(shown)))
        count = self.error_count
        if count > 1:
            parts.append(f"{count} errors")
        return "\n".join(parts)

    def __str__(self) -> str:
        return self.render()
