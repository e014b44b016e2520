"""Task identities: the nodes of the task graph.

A task is the forward (``F``) or backward (``B``) pass of one sequence chunk of
one microbatch on one pipeline stage; with ``pipeline { split_backward = true }``
the weight gradients of a chunk's linear layers are a task of their own (``W``,
zero-bubble style) and ``B`` computes only the input and state gradients (and
those of the parameters outside linear layers). Its compact text form follows
torch.distributed.pipelining's actions (``2F0``), extended with the chunk:
``<stage><kind><microbatch>.<chunk>``, e.g. ``1B3.0`` is the backward of chunk 0
of microbatch 3 on stage 1. :meth:`TaskId.parse` is the exact inverse of
:func:`str`.

Inside a ``stage r:`` line of a schedule file the stage is implied, so tasks
are written without it (``F0.1``); :meth:`TaskId.local_form` gives that form.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import NamedTuple


class TaskKind(str, Enum):
    FORWARD = "F"
    BACKWARD = "B"
    WEIGHT = "W"  # [Note: split backward] in schedlang.lowering.orders

    def __str__(self) -> str:
        return self.value


_TASK_PATTERN = re.compile(r"^(\d+)([FBW])(\d+)\.(\d+)$")


class TaskId(NamedTuple):
    kind: TaskKind
    stage: int
    microbatch: int
    chunk: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind.value}{self.microbatch}.{self.chunk}"

    def local_form(self) -> str:
        """The form used inside a ``stage r:`` line: ``F0.1``."""
        return f"{self.kind.value}{self.microbatch}.{self.chunk}"

    @classmethod
    def parse(cls, text: str) -> "TaskId":
        match = _TASK_PATTERN.match(text.strip())
        if match is None:
            raise ValueError(
                f"{text!r} is not a task id; expected <stage><F|B|W><microbatch>.<chunk>, e.g. 1F0.2"
            )
        stage, kind, microbatch, chunk = match.groups()
        return cls(TaskKind(kind), int(stage), int(microbatch), int(chunk))

    @classmethod
    def forward(cls, stage: int, microbatch: int, chunk: int) -> "TaskId":
        return cls(TaskKind.FORWARD, stage, microbatch, chunk)

    @classmethod
    def backward(cls, stage: int, microbatch: int, chunk: int) -> "TaskId":
        return cls(TaskKind.BACKWARD, stage, microbatch, chunk)

    @classmethod
    def weight(cls, stage: int, microbatch: int, chunk: int) -> "TaskId":
        return cls(TaskKind.WEIGHT, stage, microbatch, chunk)
