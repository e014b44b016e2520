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

The messages are read from the table of edge rules ([Note: edge rules] in
schedlang.vocabulary.edges): every rule that crosses stages carries a payload
that its ``before`` task sends (the payload's send action right after that
task) and its ``after`` task receives (the payload's receive action before it),
wherever the rule joins two tasks inside the graph.

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

from schedlang.vocabulary.actions import Action, ActionKind, TaskId
from schedlang.vocabulary.edges import EDGE_RULES, Dependency, EdgeRule, EdgeRules

_Message = tuple[Dependency, int, int]
"""One message between two stages: the dependency whose rule carries it, and the sender's microbatch and chunk."""


class _Inbox:
    """What one neighbour sends this stage, in the neighbour's send order, and how much of it is received."""

    def __init__(self, sends: list[_Message], rules: EdgeRules) -> None:
        self.sends = sends
        self.rules = rules
        self.received = 0
        self.positions: dict[_Message, int] = {}
        """Where each message first stands in ``sends`` (what ``sends.index`` finds, without the scan)."""
        for position, message in enumerate(sends):
            self.positions.setdefault(message, position)

    def receive_through(self, message: _Message, actions: list[Action]) -> None:
        """Receive every message not received yet, up to and including ``message``, in the sender's order."""
        if message not in self.positions:
            raise ValueError(
                f"{message[1:]} is not in list: the neighbouring stage never sends it (orders must be checked)"
            )
        needed = self.positions[message] + 1
        while self.received < needed:
            dependency, microbatch, chunk = self.sends[self.received]
            actions.append(Action(self.rules.rule(dependency).payload.receive_action, microbatch, chunk))
            self.received += 1


def place_stage_actions(
    orders: Sequence[Sequence[TaskId]], n_chunks: int | None = None, rules: EdgeRules = EDGE_RULES
) -> tuple[tuple[Action, ...], ...]:
    """Expand checked per-stage task orders into per-stage action lists; see the module docstring.

    ``n_chunks`` (default: one more than the largest chunk the orders name) bounds the rules' shifts;
    ``rules`` is the table whose message rules are placed.
    """
    n_stages = len(orders)
    if n_chunks is None:
        n_chunks = 1 + max((task.chunk for order in orders for task in order), default=0)
    split_backward = any(task.kind not in rules.task_kinds(False) for order in orders for task in order)
    messages = rules.messages(split_backward)
    # the rules' shifts keep the microbatch, so what a task sends and receives is asked once per kind, stage and
    # chunk (as the legality check numbers its neighbours)
    sent_by: dict[tuple[ActionKind, int, int], tuple[EdgeRule, ...]] = {}
    received_by: dict[tuple[ActionKind, int, int], tuple[tuple[Dependency, int, int], ...]] = {}

    def sends(task: TaskId, stage_offset: int | None = None) -> list[_Message]:
        """What ``task`` sends, in table order (only to the stage ``stage_offset`` below it, when given)."""
        position = (task.kind, task.stage, task.chunk)
        if position not in sent_by:
            sent_by[position] = tuple(rule for rule in messages if rule.successor(task, n_stages, n_chunks) is not None)
        return [
            (rule.dependency, task.microbatch, task.chunk)
            for rule in sent_by[position]
            if stage_offset in (None, rule.stage_offset)
        ]

    def receives(task: TaskId) -> list[tuple[int, _Message]]:
        """What ``task`` receives, in table order, each with the stage offset of its sender."""
        position = (task.kind, task.stage, task.chunk)
        if position not in received_by:
            received_by[position] = tuple(
                (rule.stage_offset, rule.dependency, predecessor.chunk)
                for predecessor, rule in rules.predecessors(task, n_stages, n_chunks, split_backward)
                if rule.is_message
            )
        return [(offset, (dependency, task.microbatch, chunk)) for offset, dependency, chunk in received_by[position]]

    placed = []
    for stage, order in enumerate(orders):
        # one inbox per neighbour: messages in one direction are matched first in, first out ([Note: deadlock freedom])
        inboxes = {
            offset: _Inbox([message for task in orders[stage + offset] for message in sends(task, offset)], rules)
            for offset in {rule.stage_offset for rule in messages}
            if 0 <= stage + offset < n_stages
        }
        actions: list[Action] = []
        for task in order:
            for offset, message in receives(task):
                inboxes[offset].receive_through(message, actions)
            actions.append(task.action)
            for dependency, microbatch, chunk in sends(task):
                actions.append(Action(rules.rule(dependency).payload.send_action, microbatch, chunk))
        placed.append(tuple(actions))
    return tuple(placed)
