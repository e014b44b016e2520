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
    return resolve_schedule_path(program, program.train.checkpoint_directory)


def data_path(program: ScheduleProgram) -> str | None:
    return resolve_schedule_path(program, program.train.data.path)


def tokenizer_path(program: ScheduleProgram) -> str | None:
    return resolve_schedule_path(program, program.train.data.tokenizer)


def tensorboard_directory(program: ScheduleProgram) -> str | None:
    return resolve_schedule_path(program, program.train.tensorboard_directory)


def with_resolved_inputs(program: ScheduleProgram) -> ScheduleProgram:
    """``program`` with the paths its run reads or logs to resolved (data, tokenizer, TensorBoard directory),
    the checkpoint directory left as written: what codegen renders for any program."""
    train = program.train
    data = dataclasses.replace(train.data, path=data_path(program), tokenizer=tokenizer_path(program))
    train = dataclasses.replace(train, data=data, tensorboard_directory=tensorboard_directory(program))
    return dataclasses.replace(program, train=train)


def with_resolved_paths(program: ScheduleProgram) -> ScheduleProgram:
    """``program`` with every path of its train record resolved by :func:`resolve_schedule_path`."""
    resolved = with_resolved_inputs(program)
    train = dataclasses.replace(resolved.train, checkpoint_directory=checkpoint_directory(program))
    return dataclasses.replace(resolved, train=train)
