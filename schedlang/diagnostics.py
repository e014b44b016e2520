"""Diagnostics: what the front end reports about a schedule file.

Every message has the shape compilers use, so editors can jump to it::

    examples/bad.sched:9:14: error: unknown layer kind 'glaa'
      layers = [glaa] * 4
                ^~~~
      hint: did you mean 'gla'?

The format is rendered in one place for the whole compiler
(:func:`schedlang.vocabulary.source.render_message`). A pass collects all its
diagnostics and raises one :class:`ScheduleError` holding them and the source
text they point into; the CLI prints :meth:`ScheduleError.render` and exits 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from schedlang.vocabulary import Severity, Span, render_message
from schedlang.vocabulary.source_lines import MAX_SHOWN_DIAGNOSTICS, more_diagnostics_line, split_source


@dataclass(frozen=True)
class Diagnostic:
    severity: Severity
    message: str
    span: Span
    hint: str | None = None

    @classmethod
    def error(cls, message: str, span: Span, hint: str | None = None) -> "Diagnostic":
        return cls(Severity.ERROR, message, span, hint)


def format_diagnostic(
    diagnostic: Diagnostic, source_text: str | None, source_lines: list[str] | None = None
) -> str:
    """``file:line:col: error: message``, the source line, a caret line, an optional hint
    (:func:`schedlang.vocabulary.source.render_message`, the one renderer)."""
    return render_message(
        diagnostic.span, diagnostic.message, source_text, diagnostic.severity, diagnostic.hint, source_lines
    )


class ScheduleError(Exception):
    """One or more diagnostics about schedule files, with the text they point into."""

    def __init__(self, diagnostics: Iterable[Diagnostic], sources: Mapping[str, str] | None = None, partial=None):
        self.diagnostics: tuple[Diagnostic, ...] = tuple(diagnostics)
        if not self.diagnostics:
            raise ValueError("a ScheduleError needs at least one diagnostic")
        self.sources: dict[str, str] = dict(sources or {})
        # the semantic pass's schedlang.checks.partial.PartialProgram: what the errors leave checkable
        self.partial = partial
        super().__init__(self.render())

    @property
    def error_count(self) -> int:
        return sum(1 for diagnostic in self.diagnostics if diagnostic.severity is Severity.ERROR)

    def render(self) -> str:
        split = {name: split_source(text) for name, text in self.sources.items()}  # once per file
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
