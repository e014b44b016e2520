"""What the checks of one schedule file share: its keys, the values read so far, the diagnostics.

Contract: :meth:`Checker.get` reads a key through its row of the key schema
(``schedlang.checks.schema``) the first time it is asked for, and caches the
result, so each key is read, and each of its problems reported, at most once,
and a key no check asks for (``sequence.chunks`` after the length was refused)
is not read at all. An absent key reads as its schema default; an absent
required key reads as invalid (its absence was reported when the keys were
collected). Rules refuse a value already read with :meth:`Checker.reject`, and
record what they compute from several keys (``"sequence.boundaries"``) in
``derived``; ``None`` there means "could not be computed, already reported".
"""

from __future__ import annotations

from schedlang import ast
from schedlang.checks.readers import INVALID
from schedlang.checks.schema import read_key
from schedlang.diagnostics import Diagnostic
from schedlang.vocabulary import Span


class Checker:
    def __init__(self, schedule: ast.ScheduleFile, source_text: str):
        self.schedule = schedule
        self.source_lines = source_text.split("\n")
        self.filename = schedule.span.file
        self.diagnostics: list[Diagnostic] = []
        self.spans: dict[str, Span] = {}
        self.blocks: dict[str, ast.Block] = {}
        self.assignments: dict[str, ast.Assignment] = {}
        self.stage_lines: list[ast.StageLine] = []
        self.derived: dict[str, object] = {}
        self._values: dict[str, object] = {}

    def error(self, message: str, span: Span, hint: str | None = None) -> None:
        self.diagnostics.append(Diagnostic.error(message, span, hint))

    def text_of(self, span: Span) -> str:
        """The source text under a one-line span, shortened, for messages."""
        if span.line == span.end_line and 1 <= span.line <= len(self.source_lines):
            text = self.source_lines[span.line - 1][span.column - 1 : span.end_column - 1]
        elif 1 <= span.line <= len(self.source_lines):
            text = self.source_lines[span.line - 1][span.column - 1 :] + " ..."
        else:
            text = "?"
        return text if len(text) <= 40 else text[:37] + "..."

    def file_start(self) -> Span:
        if self.schedule.header is not None:
            return self.schedule.header.span
        return Span(self.filename, 1, 1, 1, 2)

    def span_of(self, path: str) -> Span:
        """Where ``path`` was written (the whole ``key = value``), or the file's start."""
        return self.spans.get(path, self.file_start())

    def node(self, path: str) -> ast.Value | None:
        """The value written for ``"block.key"``, unread; ``None`` when the key is absent."""
        assignment = self.assignments.get(path)
        return assignment.value if assignment is not None else None

    def given(self, path: str) -> bool:
        return path in self.assignments

    def get(self, path: str):
        """The value of ``"block.key"`` (its default when absent), or ``None`` when it is invalid.

        A key whose row accepts ``none`` also reads as ``None`` when written so;
        :meth:`valid` tells the two apart.
        """
        value = self._read(path)
        return None if value is INVALID else value

    def valid(self, *paths: str) -> bool:
        """Whether every key of ``paths`` reads without a problem; reads each of them."""
        values = [self._read(path) for path in paths]
        return all(value is not INVALID for value in values)

    def was_read(self, path: str) -> bool:
        """Whether a check has asked for ``path`` already (asking now would report its problems anew)."""
        return path in self._values

    def reject(self, path: str) -> None:
        """Mark a key's value as refused by a rule (which has reported why)."""
        self._values[path] = INVALID

    def _read(self, path: str):
        if path not in self._values:
            self._values[path] = read_key(self, path)
        return self._values[path]
