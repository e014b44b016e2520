"""Source positions shared by the front end and every later pass.

A :class:`Span` is copied from Lark's ``meta`` when the front end builds the AST
and travels unchanged into the lowered program, so that legality errors found
long after parsing can still point at the token in the schedule file.
"""

from __future__ import annotations

from dataclasses import dataclass


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
