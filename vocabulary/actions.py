"""The per-rank instruction set and the task identities of the task graph: one kind of action, one parser.

An action is one compute task (``F0.1``: forward of microbatch 0, chunk 1;
``B0.1``: its backward; ``W0.1``: the weight gradients of its linear layers,
when the schedule splits them out of ``B``) or one explicit message: ``RECV_F0.1`` receives the
activation that ``F0.1`` of this stage consumes from the previous stage,
``SEND_F0.1`` sends the activation ``F0.1`` produced to the next stage,
``RECV_B0.1`` / ``SEND_B0.1`` do the same for activation gradients in the
other direction. Which actions a stage lists, and in which order, is decided by the lowering
(``schedlang.lowering.placement``); the runtime's executor only runs them.

A :class:`TaskId` is a compute action with its stage inside, as torch.distributed.pipelining's ``_Action``
carries its stage: ``1B3.0`` is the backward of chunk 0 of microbatch 3 on stage 1, the node key of the
task graph (with ``pipeline { split_backward = true }`` the weight gradients of a chunk's linear layers are
a task of their own, ``W``, zero-bubble style, and ``B`` computes only the input and state gradients).
:attr:`TaskId.action` is its form inside a ``stage r:`` line of a schedule file and in a rank's action
list (``B3.0``), and :meth:`Action.on` its inverse. Both texts are read by one grammar,
``[<stage>]<kind><microbatch>.<chunk>``: :meth:`Action.parse` and :meth:`TaskId.parse` are the exact
inverses of :func:`str`.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import NamedTuple


class ActionKind(str, Enum):
    FORWARD = "F"
    BACKWARD = "B"
    WEIGHT = "W"
    RECV_ACTIVATION = "RECV_F"
    SEND_ACTIVATION = "SEND_F"
    RECV_GRADIENT = "RECV_B"
    SEND_GRADIENT = "SEND_B"

    @property
    def is_compute(self) -> bool:
        return self in (ActionKind.FORWARD, ActionKind.BACKWARD, ActionKind.WEIGHT)

    def __str__(self) -> str:
        return self.value


_ACTION_PATTERN = re.compile(r"^([0-9]*)(RECV_F|SEND_F|RECV_B|SEND_B|F|B|W)([0-9]+)\.([0-9]+)$")
# a dict lookup, not ActionKind(text): a schedule's explicit orders can hold 10^5 tasks
_KINDS = {kind.value: kind for kind in ActionKind}


def _parse(text: str, staged: bool) -> tuple[int | None, ActionKind, int, int] | None:
    """``[<stage>]<kind><microbatch>.<chunk>`` as (stage or None, kind, microbatch, chunk); None if ``text`` is
    not of that form, has a stage where ``staged`` is false, lacks one where it is true, or (``staged``) is no
    compute kind."""
    match = _ACTION_PATTERN.match(text.strip())
    if match is None or bool(match.group(1)) != staged:
        return None
    stage, kind, microbatch, chunk = match.groups()
    kind = _KINDS[kind]
    if staged and not kind.is_compute:
        return None
    return (int(stage) if staged else None), kind, int(microbatch), int(chunk)


class Action(NamedTuple):
    kind: ActionKind
    microbatch: int
    chunk: int

    def __str__(self) -> str:
        return f"{self.kind.value}{self.microbatch}.{self.chunk}"

    @classmethod
    def read(cls, text: str) -> "Action | None":
        """The action ``text`` writes, or None if it writes none (:meth:`parse` says why)."""
        parsed = _parse(text, staged=False)
        return None if parsed is None else cls(*parsed[1:])

    @classmethod
    def parse(cls, text: str) -> "Action":
        parsed = _parse(text, staged=False)
        if parsed is None:
            raise ValueError(
                f"{text!r} is not a pipeline action; expected F<a>.<i>, B<a>.<i>, W<a>.<i> or "
                "RECV_F/SEND_F/RECV_B/SEND_B<a>.<i>"
            )
        _, kind, microbatch, chunk = parsed
        return cls(kind, microbatch, chunk)

    def on(self, stage: int) -> "TaskId":
        """This compute action as the task of ``stage``."""
        if not self.kind.is_compute:
            raise ValueError(f"{self} is a message, not a task")
        return TaskId(self.kind, stage, self.microbatch, self.chunk)


class TaskId(NamedTuple):
    """A compute action on its stage: the node key of the task graph."""

    kind: ActionKind
    stage: int
    microbatch: int
    chunk: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind.value}{self.microbatch}.{self.chunk}"

    @property
    def action(self) -> Action:
        """The task as its stage's action list and a ``stage r:`` line write it: ``F0.1``."""
        return Action(self.kind, self.microbatch, self.chunk)

    def local_form(self) -> str:
        """The form used inside a ``stage r:`` line: ``F0.1``."""
        return str(self.action)

    @classmethod
    def parse(cls, text: str) -> "TaskId":
        parsed = _parse(text, staged=True)
        if parsed is None:
            raise ValueError(
                f"{text!r} is not a task id; expected <stage><F|B|W><microbatch>.<chunk>, e.g. 1F0.2"
            )
        stage, kind, microbatch, chunk = parsed
        return cls(kind, stage, microbatch, chunk)

    @classmethod
    def forward(cls, stage: int, microbatch: int, chunk: int) -> "TaskId":
        return cls(ActionKind.FORWARD, stage, microbatch, chunk)

    @classmethod
    def backward(cls, stage: int, microbatch: int, chunk: int) -> "TaskId":
        return cls(ActionKind.BACKWARD, stage, microbatch, chunk)

    @classmethod
    def weight(cls, stage: int, microbatch: int, chunk: int) -> "TaskId":
        return cls(ActionKind.WEIGHT, stage, microbatch, chunk)


def deferred_weight_units(actions: tuple[Action, ...]) -> frozenset[tuple[int, int]]:
    """Units ``(microbatch, chunk)`` whose ``W`` is not the next compute action after their ``B``.

    The others' weight gradients can be formed inside ``B`` as usual (their ``W`` then does nothing): nothing
    runs between the two that could use the time ([Note: deferred weight gradients] in schedlang.runtime.linear).
    """
    compute = [action for action in actions if action.kind.is_compute]
    deferred = set()
    for position, action in enumerate(compute):
        if action.kind is ActionKind.BACKWARD:
            following = compute[position + 1] if position + 1 < len(compute) else None
            if following != Action(ActionKind.WEIGHT, action.microbatch, action.chunk):
                deferred.add((action.microbatch, action.chunk))
    has_weight = {(action.microbatch, action.chunk) for action in compute if action.kind is ActionKind.WEIGHT}
    return frozenset(deferred & has_weight)


class OffloadCopy(str, Enum):
    """How one unit's saved activations travel under ``pipeline { offload = true }`` ([Note: activation offload]
    in schedlang.runtime.offload): what the executor does and what the cost and memory models price."""

    KEPT = "kept"  # its forward is directly followed by its own backward: nothing moves, they stay on the device
    PREFETCHED = "prefetched"  # out during its forward, back while the backward before its own runs
    EXPOSED = "exposed"  # out during its forward, back at the start of its backward, which waits for them


def next_backwards(actions: tuple[Action, ...]) -> dict[tuple[int, int], tuple[int, int]]:
    """Unit -> the unit of the next ``B`` in ``actions``: each backward prefetches the next one's offloaded
    activations, so that their copy back overlaps its own work."""
    backwards = [(action.microbatch, action.chunk) for action in actions if action.kind is ActionKind.BACKWARD]
    return dict(zip(backwards, backwards[1:]))


def offload_copies(actions: tuple[Action, ...]) -> dict[tuple[int, int], OffloadCopy]:
    """Each unit ``(microbatch, chunk)`` that runs a forward in ``actions``: how its saved activations travel.

    A unit whose next compute action after ``F`` is its own ``B`` keeps them on the device: a copy out and straight
    back would only delay that backward. Otherwise they go to the host during ``F``, and come back ahead of ``B``
    when the backward before it (:func:`next_backwards`) prefetches them, which it can only after ``F`` has run;
    else (the first backward of the list, or one whose ``F`` came after that backward) at the start of ``B``.
    """
    compute = [action for action in actions if action.kind.is_compute]
    position = {(action.kind, action.microbatch, action.chunk): index for index, action in enumerate(compute)}
    prefetched = {
        unit for before, unit in next_backwards(actions).items()
        if position[(ActionKind.FORWARD, *unit)] < position[(ActionKind.BACKWARD, *before)]
    }
    copies = {}
    for position, action in enumerate(compute):
        if action.kind is not ActionKind.FORWARD:
            continue
        unit = (action.microbatch, action.chunk)
        following = compute[position + 1] if position + 1 < len(compute) else None
        if following == Action(ActionKind.BACKWARD, *unit):
            copies[unit] = OffloadCopy.KEPT
        else:
            copies[unit] = OffloadCopy.PREFETCHED if unit in prefetched else OffloadCopy.EXPOSED
    return copies
