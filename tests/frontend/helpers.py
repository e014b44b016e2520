"""Shared by the front-end tests: a valid schedule to mutate, and error extraction."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedlang.diagnostics import ScheduleError
from schedlang.frontend import load_program_text

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# Line numbers matter: tests replace one line of this text and assert positions.
VALID = """\
schedule t
model {
  vocab    = 256
  d_model  = 128
  layers   = [gla] * 4
  heads    = 2
  head_dim = 64
}
mesh {
  pipeline = 2
}
sequence {
  length       = 4096
  chunks       = 4
  kernel_chunk = 64
}
pipeline {
  microbatches = 4
  order        = 1f1b
}
train {
  steps = 5
}
"""


def replace_line(text: str, line: int, new: str) -> str:
    lines = text.split("\n")
    lines[line - 1] = new
    return "\n".join(lines)


def diagnostics_of(text: str, filename: str = "t.sched") -> list[tuple[int, int, str]]:
    """(line, column, message) of every diagnostic the front end reports for ``text``."""
    with pytest.raises(ScheduleError) as raised:
        load_program_text(text, filename)
    return [(d.span.line, d.span.column, d.message) for d in raised.value.diagnostics]


def only_diagnostic(text: str) -> tuple[int, int, str]:
    found = diagnostics_of(text)
    assert len(found) == 1, found
    return found[0]
