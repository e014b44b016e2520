"""The one rule for paths written in a schedule file: relative paths are relative to the schedule file.

``train.data = bytes(path = ...)`` and ``train.checkpoint = "..." every N`` both follow it, so a schedule
means the same files whatever directory ``compile`` or ``run`` is started from; the generated script
holds the resolved absolute paths. A schedule given as text in memory (no file) keeps its paths as written.
"""

from __future__ import annotations

from pathlib import Path

from schedlang.lowering.program import ScheduleProgram


def resolve_schedule_path(program: ScheduleProgram, path: str | None) -> str | None:
    """``path`` made absolute against the directory of ``program``'s schedule file."""
    if path is None or Path(path).is_absolute() or program.source_file.startswith("<"):
        return path
    return str((Path(program.source_file).parent / path).resolve())


def checkpoint_directory(program: ScheduleProgram) -> str | None:
    checkpoint = program.train.checkpoint
    return None if checkpoint is None else resolve_schedule_path(program, checkpoint.directory)


def data_path(program: ScheduleProgram) -> str | None:
    return resolve_schedule_path(program, program.train.data.path)
