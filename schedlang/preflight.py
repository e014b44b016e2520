"""What ``schedlang run`` checks about this machine and its files before it launches anything.

The schedule's paths are resolved by the one rule of schedlang.lowering.paths (relative to the schedule
file). A data path that is a directory, a pipe or a device, or unreadable, is refused at the
``train.data`` key: a pipe would block every rank, a device fill its memory. A missing file is left to
the ranks, whose error names it (schedlang.runtime.data).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from schedlang.diagnostics import Diagnostic, ScheduleError
from schedlang.lowering import paths
from schedlang.vocabulary import Span

MAX_TIMEOUT_S = 7 * 24 * 3600.0


def check_data_file(program, text: str) -> None:
    from schedlang.runtime.data import data_file_problem

    path = paths.data_path(program)
    if path is None or not os.path.exists(path):
        return  # each rank names a missing file in its own error; only what would hang them is caught here
    problem = data_file_problem(path)
    if problem is not None:
        span = program.spans.get("train.data.path") or program.spans.get("train.data")
        span = span or Span(program.source_file, 1, 1, 1, 2)
        raise ScheduleError([Diagnostic.error(problem, span)], {span.file: text})


def will_resume(program) -> bool:
    """Whether the schedule's checkpoint directory holds a checkpoint its run would resume from."""
    directory = paths.checkpoint_directory(program)
    return directory is not None and (Path(directory) / "latest").exists()


def timeout_problem(timeout_s: float) -> str | None:
    """Why ``--timeout`` is unusable: not a positive, finite number of seconds up to a week."""
    if not math.isfinite(timeout_s) or timeout_s <= 0 or timeout_s > MAX_TIMEOUT_S:
        return f"--timeout must be a number of seconds above 0 and at most {MAX_TIMEOUT_S:.0f}, got {timeout_s}"
    return None
