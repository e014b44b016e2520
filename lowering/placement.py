"""Communication placement: per-stage task orders -> per-stage action lists with explicit messages.

Input: one order per pipeline stage, each a sequence of that stage's tasks
(``TaskId``), already checked by ``schedlang.lowering.legality`` (complete,
each task once, and the union of the stage sequences with the partial order of
StateFlow Eq. 8 is acyclic). Chunk-to-chunk states never leave their stage's
ranks: with ``mesh.sequence == 1`` they stay in the rank's state store; with a
sequence-parallel group they are also scanned across that group by
collectives inside the mixing layers (``schedlang.runtime.sequence_parallel``),
which every rank of the stage issues in the same order because all of them run
the same action list. So the only placed messages are activations
``F(r, a, i) -> F(r + 1, a, i)`` and activation gradients
``B(r + 1, a, i) -> B(r, a, i)``, between ranks of equal sequence and data
coordinates.

Output: for each stage, a tuple of runtime :class:`Action` s: every task, each
``F`` followed by ``SEND_F`` (unless last stage), each ``B`` followed by
``SEND_B`` (unless first stage), each ``W`` as it is (it sends and receives
nothing), and receives placed by this rule:

    before a task that needs message m from peer q, receive every message q
    sends this stage that has not been received yet, up to and including m,
    in the order q sends them.

[Note: deadlock freedom]
Messages between a pair of ranks in one direction are matched first-in,
first-out (gloo and NCCL both), so receives must be posted in the sender's
order, which the rule guarantees even when an explicit order runs a
neighbour's tasks in a different order. Sends are asynchronous and only
awaited at the end of the step, so a rank can only block in a receive. A
receive for message m' that precedes m in q's send order waits on the task of
q that produces m', which q runs before the task producing m; so every wait
is implied by an edge of the task graph (a dependency of Eq. 8) or by a chain
of q's own sequence. If a cycle of waiting ranks existed, it would be a cycle
in the union of the Eq. 8 edges and the stage sequences, which the legality
check rules out. Hence a legal order never deadlocks. A sequence-parallel
collective inside a task only waits for the same task on the other ranks of
the stage, which run identical action lists against identical peers, so it
adds no new wait between different tasks.
"""

from __future__ import annotations

from collections.abc import Sequence

from schedlang.lowering.tasks import TaskId, TaskKind
from schedlang.vocabulary import Action, ActionKind


def _send_order(order: Sequence[TaskId], kind: TaskKind) -> list[tuple[int, int]]:
    return [(task.microbatch, task.chunk) for task in order if task.kind is kind]


class _Inbox:
    """What one neighbour sends this stage, in the neighbour's send order, and how much of it is received."""

    def __init__(self, sends: list[tuple[int, int]], receive: ActionKind) -> None:
        self.sends = sends
        self.receive = receive
        self.received = 0
        self.positions: dict[tuple[int, int], int] = {}
        """Where each message first stands in ``sends`` (what ``sends.index`` finds, without the scan)."""
        for position, key in enumerate(sends):
            self.positions.setdefault(key, position)

    def receive_through(self, key: tuple[int, int], actions: list[Action]) -> None:
        """Receive every message not received yet, up to and including ``key``, in the sender's order."""
        if key not in self.positions:
            raise ValueError(f"{key} is not in list: the neighbouring stage never sends it (orders must be checked)")
        needed = self.positions[key] + 1
        while self.received < needed:
            actions.append(Action(self.receive, *self.sends[self.received]))
            self.received += 1


def place_stage_actions(orders: Sequence[Sequence[TaskId]]) -> tuple[tuple[Action, ...], ...]:
    """Expand checked per-stage task orders into per-stage action lists; see the module docstring."""
    n_stages = len(orders)
    placed = []
    for stage, order in enumerate(orders):
        activations_from_previous = _send_order(orders[stage - 1], TaskKind.FORWARD) if stage > 0 else []
        gradients_from_next = _send_order(orders[stage + 1], TaskKind.BACKWARD) if stage + 1 < n_stages else []
        activations = _Inbox(activations_from_previous, ActionKind.RECV_ACTIVATION)
        gradients = _Inbox(gradients_from_next, ActionKind.RECV_GRADIENT)
        actions: list[Action] = []
        for task in order:
            key = (task.microbatch, task.chunk)
            if task.kind is TaskKind.FORWARD:
                if stage > 0:
                    activations.receive_through(key, actions)
                actions.append(Action(ActionKind.FORWARD, *key))
                if stage + 1 < n_stages:
                    actions.append(Action(ActionKind.SEND_ACTIVATION, *key))
            elif task.kind is TaskKind.WEIGHT:
                actions.append(Action(ActionKind.WEIGHT, *key))
            else:
                if stage + 1 < n_stages:
                    gradients.receive_through(key, actions)
                actions.append(Action(ActionKind.BACKWARD, *key))
                if stage > 0:
                    actions.append(Action(ActionKind.SEND_GRADIENT, *key))
        placed.append(tuple(actions))
    return tuple(placed)
