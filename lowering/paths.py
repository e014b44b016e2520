"""The one rule for paths written in a schedule file: relative paths are relative to the schedule file.

``train.data``'s ``path`` and ``tokenizer``, ``train.checkpoint = "..." every N`` and ``train.log``'s
directory all follow it, so a schedule
means the same files whatever directory ``compile`` or ``run`` is started from; the generated script
holds the resolved absolute paths (``schedlang compile`` and ``run`` apply :func:`with_resolved_paths`;
codegen resolves the data path of any program it renders). A schedule given as text in memory (no file)
keeps its paths as written.
"""

from __future__ import annotations

import dataclasses
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


def tokenizer_path(program: ScheduleProgram) -> str | None:
    return resolve_schedule_path(program, program.train.data.tokenizer)


def tensorboard_directory(program: ScheduleProgram) -> str | None:
    return resolve_schedule_path(program, program.train.log)


def with_resolved_paths(program: ScheduleProgram) -> ScheduleProgram:
    """``program`` with its data path and checkpoint directory resolved by :func:`resolve_schedule_path`."""
    train = program.train
    checkpoint = train.checkpoint
    if checkpoint is not None:
        checkpoint = dataclasses.replace(checkpoint, directory=checkpoint_directory(program))
    data = dataclasses.replace(train.data, path=data_path(program), tokenizer=tokenizer_path(program))
    return dataclasses.replace(
        program,
        train=dataclasses.replace(train, data=data, checkpoint=checkpoint, log=tensorboard_directory(program)),
    )
