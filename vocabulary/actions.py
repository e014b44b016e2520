"""The per-rank instruction set: what the lowering's placement emits and a generated script's runtime runs.

An action is one compute task (``F0.1``: forward of microbatch 0, chunk 1;
``B0.1``: its backward; ``W0.1``: the weight gradients of its linear layers,
when the schedule splits them out of ``B``) or one explicit message: ``RECV_F0.1`` receives the
activation that ``F0.1`` of this stage consumes from the previous stage,
``SEND_F0.1`` sends the activation ``F0.1`` produced to the next stage,
``RECV_B0.1`` / ``SEND_B0.1`` do the same for activation gradients in the
other direction. The text forms parse back exactly with :meth:`Action.parse`.
Which actions a stage lists, and in which order, is decided by the lowering
(``schedlang.lowering.placement``); the runtime's executor only runs them.
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


_ACTION_PATTERN = re.compile(r"^(RECV_F|SEND_F|RECV_B|SEND_B|F|B|W)(\d+)\.(\d+)$")


class Action(NamedTuple):
    kind: ActionKind
    microbatch: int
    chunk: int

    def __str__(self) -> str:
        return f"{self.kind.value}{self.microbatch}.{self.chunk}"

    @classmethod
    def parse(cls, text: str) -> "Action":
        match = _ACTION_PATTERN.match(text.strip())
        if match is None:
            raise ValueError(
                f"{text!r} is not a pipeline action; expected F<a>.<i>, B<a>.<i>, W<a>.<i> or "
                "RECV_F/SEND_F/RECV_B/SEND_B<a>.<i>"
            )
        kind, microbatch, chunk = match.groups()
        return cls(ActionKind(kind), int(microbatch), int(chunk))


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
