"""StateFlow's partial order (Eq. 8) as one table of edge rules, what each edge carries, and the neighbour
queries derived from it.

[Note: edge rules]
Every dependency between two tasks is one row of :data:`EDGE_RULES`: a
:class:`Dependency` name, the kinds of the task that must run first
(``before``) and of the task that waits (``after``), where the earlier
task lies relative to the later one, as a shift of the stage and of the chunk
(the microbatch never changes), and the :class:`Payload` the edge carries.
``STATE_BACKWARD``, ``B[r,a,i+1] before B[r,a,i]``, is the row
``(B, B, stage_offset=0, chunk_offset=+1, STATE_GRADIENT)``. A rule
holds for every task of its ``after`` kind whose shifted position lies inside
the graph (``0 <= stage < P``, ``0 <= chunk < N``), in every graph it
:class:`Applies` to; the kinds of task a graph has are the kinds its applicable
rules join (so a split backward, the only graph with a ``B -> W`` rule, is the
only graph with ``W`` tasks).

Because a rule is a shift, its inverse is the opposite shift:
:meth:`EdgeRule.predecessor` and :meth:`EdgeRule.successor` apply the same two
offsets with opposite signs, so successors are never written a second time,
and :meth:`EdgeRule.joins` (which rule an edge is) asks the predecessor too.
Everything else is derived from the table (:class:`EdgeRules`, which indexes
the rows once, like tinygrad's ``PatternMatcher``): each rule's formula, origin
and whether it joins two tasks of one stage; the task graph and its arithmetic
neighbours (schedlang.lowering.graph); the legality checker's numbered
predecessors, successors and waiting counts (schedlang.lowering.legality); the
DOT exporter's edge classes (schedlang.lowering.export.dot). What the edges
carry is read from the rows too: placement sends and receives the payload of
every rule that crosses stages (schedlang.lowering.placement), the memory model
holds the messages and state gradients the rules hand on and frees a chunk's
saved tensors at the end of the last task that reads them
(:meth:`EdgeRules.releasing_kind`; schedlang.lowering.memory_peak), the
simulator times one message per edge whose payload moves
(schedlang.lowering.simulate), and a rank's executor takes and hands on states,
state gradients and messages where the rules say a task has a predecessor or
successor (schedlang.runtime.executor, which is why the table lives in the
vocabulary). Each of those takes the table as a parameter (``rules``),
:data:`EDGE_RULES` by default, so a caller that extends it (``EDGE_RULES +
(rule,)``; a test does) sees all of them follow. A new dependency is a new
:class:`Dependency` member and a new row here, and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import Enum

from schedlang.vocabulary.actions import ActionKind, TaskId


class Dependency(str, Enum):
    """The five constraints of Eq. 8, in the paper's order, then the split backward's ``B`` before ``W``.

    Each member names one row of :data:`EDGE_RULES`; the properties read that row.
    """

    STAGE_FORWARD = "stage_forward"
    STATE_FORWARD = "state_forward"
    FORWARD_BACKWARD = "forward_backward"
    STAGE_BACKWARD = "stage_backward"
    STATE_BACKWARD = "state_backward"
    BACKWARD_WEIGHT = "backward_weight"

    @property
    def same_stage(self) -> bool:
        """Whether the edge joins two tasks of one stage (so one stage's order alone can break it)."""
        return EDGE_RULES.rule(self).same_stage

    @property
    def origin(self) -> str:
        """Where the constraint comes from, for messages: ``Eq. 8``, or ``the split backward``."""
        return EDGE_RULES.rule(self).origin

    @property
    def formula(self) -> str:
        """The constraint as written in Eq. 8."""
        return EDGE_RULES.rule(self).formula

    @property
    def reason(self) -> str:
        """Why the constraint exists, in words."""
        return EDGE_RULES.rule(self).reason

    @property
    def payload(self) -> Payload:
        """What the edge carries."""
        return EDGE_RULES.rule(self).payload


class Payload(str, Enum):
    """What an edge of Eq. 8 carries from the task before to the task after.

    The four that move are what the simulator times as messages and the memory model holds; ``SAVED`` moves
    nothing: the later task reads what the earlier one kept on its stage (a forward's saved graph, the output
    gradients and layer inputs a ``W`` reads).
    """

    ACTIVATION = "activation"
    ACTIVATION_GRADIENT = "activation_gradient"
    STATE = "state"
    STATE_GRADIENT = "state_gradient"
    SAVED = "saved"

    @property
    def moves(self) -> bool:
        """Whether the payload is a tensor handed from one task to another (not what a stage kept)."""
        return self is not Payload.SAVED

    @property
    def is_gradient(self) -> bool:
        """Whether the payload is a gradient, which its receiver holds only while it runs: a received
        activation becomes the chunk's input, kept with its saved tensors."""
        return self in (Payload.ACTIVATION_GRADIENT, Payload.STATE_GRADIENT)

    @property
    def send_action(self) -> ActionKind | None:
        """The action that sends this payload to another stage, None for a payload that never leaves one."""
        return _SEND_ACTIONS.get(self)

    @property
    def receive_action(self) -> ActionKind | None:
        """The action that receives this payload from another stage, None for a payload that never leaves one."""
        return _RECEIVE_ACTIONS.get(self)


_SEND_ACTIONS = {Payload.ACTIVATION: ActionKind.SEND_ACTIVATION, Payload.ACTIVATION_GRADIENT: ActionKind.SEND_GRADIENT}
_RECEIVE_ACTIONS = {
    Payload.ACTIVATION: ActionKind.RECV_ACTIVATION,
    Payload.ACTIVATION_GRADIENT: ActionKind.RECV_GRADIENT,
}
MESSAGE_PAYLOADS = {
    action: payload for payloads in (_SEND_ACTIONS, _RECEIVE_ACTIONS) for payload, action in payloads.items()
}
"""The payload each message action sends or receives (``SEND_F``: an activation)."""


class Applies(Enum):
    """The graphs a rule holds in."""

    ALWAYS = "always"  # Eq. 8 itself
    SPLIT_BACKWARD = "split_backward"  # only with pipeline { split_backward = true }

    def holds(self, split_backward: bool) -> bool:
        """Whether a rule that applies this way holds in a graph that does (or does not) split its backward."""
        return self is Applies.ALWAYS or split_backward

    @property
    def origin(self) -> str:
        """Where a rule that applies this way comes from, for messages."""
        return "Eq. 8" if self is Applies.ALWAYS else "the split backward"


@dataclass(frozen=True)
class EdgeRule:
    """``before[r + stage_offset, a, i + chunk_offset]`` runs before ``after[r, a, i]``; see [Note: edge rules]."""

    dependency: Dependency
    before: ActionKind
    after: ActionKind
    stage_offset: int
    chunk_offset: int
    payload: Payload
    reason: str
    applies: Applies = Applies.ALWAYS

    def __post_init__(self) -> None:
        if not self.same_stage and self.payload.send_action is None:
            raise ValueError(f"{self.dependency} crosses stages with {self.payload.value}, which no action sends")

    @property
    def is_message(self) -> bool:
        """Whether the rule's payload goes from one stage to another (a send and a receive placed for it)."""
        return not self.same_stage

    @property
    def same_stage(self) -> bool:
        """Whether the rule joins two tasks of one stage (so one stage's order alone can break it)."""
        return self.stage_offset == 0

    @property
    def origin(self) -> str:
        """``Eq. 8``, or ``the split backward`` for a rule only a split backward has."""
        return self.applies.origin

    @property
    def formula(self) -> str:
        """The rule as Eq. 8 writes it: ``B[r,a,i+1] before B[r,a,i]``."""
        earlier = f"{self.before.value}[{_shifted('r', self.stage_offset)},a,{_shifted('i', self.chunk_offset)}]"
        return f"{earlier} before {self.after.value}[r,a,i]"

    def predecessor(self, task: TaskId, n_stages: int, n_chunks: int) -> TaskId | None:
        """The task this rule makes ``task`` wait for, or None (another kind, or a position outside the graph)."""
        return self._shift(task, self.after, self.before, +1, n_stages, n_chunks)

    def successor(self, task: TaskId, n_stages: int, n_chunks: int) -> TaskId | None:
        """The task that waits for ``task`` by this rule, or None: the exact inverse of :meth:`predecessor`."""
        return self._shift(task, self.before, self.after, -1, n_stages, n_chunks)

    def _shift(
        self, task: TaskId, kind: ActionKind, other_kind: ActionKind, sign: int, n_stages: int, n_chunks: int
    ) -> TaskId | None:
        """``task`` (of ``kind``) moved by ``sign`` times the rule's offsets, as ``other_kind``, if inside."""
        if task.kind is not kind:
            return None
        stage, chunk = task.stage + sign * self.stage_offset, task.chunk + sign * self.chunk_offset
        if 0 <= stage < n_stages and 0 <= chunk < n_chunks:
            return TaskId(other_kind, stage, task.microbatch, chunk)
        return None

    def joins(self, source: TaskId, destination: TaskId) -> bool:
        """Whether ``source -> destination`` is an edge of this rule: ``source`` is the task :meth:`predecessor`
        gives for ``destination`` in a graph just large enough to hold both."""
        n_stages = max(source.stage, destination.stage) + 1
        n_chunks = max(source.chunk, destination.chunk) + 1
        return self.predecessor(destination, n_stages, n_chunks) == source


def _shifted(index: str, offset: int) -> str:
    return index if offset == 0 else f"{index}{offset:+d}"


class EdgeRules:
    """An ordered table of edge rules, indexed once for the queries the passes make.

    Like tinygrad's ``PatternMatcher``: the rows are data, the lookups are
    built from them at construction, and ``table + rows`` is a longer table.
    Two rows may not name the same dependency, nor join the same pair of
    positions (so every edge is an instance of exactly one row).
    """

    def __init__(self, *rules: EdgeRule) -> None:
        self.rules = rules
        shapes: dict[tuple[ActionKind, ActionKind, int, int], EdgeRule] = {}
        self._by_dependency: dict[Dependency, EdgeRule] = {}
        for rule in self.rules:
            shape = (rule.before, rule.after, rule.stage_offset, rule.chunk_offset)
            if shape in shapes:
                raise ValueError(f"{rule.dependency} joins the same tasks as {shapes[shape].dependency}")
            if rule.dependency in self._by_dependency:
                raise ValueError(f"two rules are named {rule.dependency}")
            shapes[shape] = rule
            self._by_dependency[rule.dependency] = rule
        self._applicable = {split: tuple(r for r in self.rules if r.applies.holds(split)) for split in (False, True)}
        self._kinds = {
            split: tuple(kind for kind in ActionKind if any(kind in (r.before, r.after) for r in applicable))
            for split, applicable in self._applicable.items()
        }

    def __iter__(self) -> Iterator[EdgeRule]:
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def __add__(self, more: Iterable[EdgeRule]) -> EdgeRules:
        return EdgeRules(*self.rules, *more)

    def messages(self, split_backward: bool) -> tuple[EdgeRule, ...]:
        """The applicable rules whose payload crosses stages, in table order."""
        return tuple(rule for rule in self.applicable(split_backward) if rule.is_message)

    def hand_offs(self, split_backward: bool) -> tuple[EdgeRule, ...]:
        """The applicable rules that hand a moving payload to a task of the same stage (states, state gradients)."""
        return tuple(rule for rule in self.applicable(split_backward) if rule.same_stage and rule.payload.moves)

    def carrying(self, payload: Payload, split_backward: bool) -> tuple[EdgeRule, ...]:
        """The applicable rules whose edges carry ``payload``, in table order."""
        return tuple(rule for rule in self.applicable(split_backward) if rule.payload is payload)

    def releasing_kind(self, split_backward: bool) -> ActionKind:
        """The kind of task whose end frees a chunk's saved tensors: the last of the chain of ``SAVED`` rules that
        starts at the forward (``B``, or ``W`` with a split backward)."""
        saved = {rule.before: rule.after for rule in self.carrying(Payload.SAVED, split_backward)}
        kind = ActionKind.FORWARD
        while kind in saved:
            kind = saved[kind]
        return kind

    def rule(self, dependency: Dependency) -> EdgeRule:
        """The row named ``dependency`` (KeyError if none is)."""
        return self._by_dependency[dependency]

    def applicable(self, split_backward: bool) -> tuple[EdgeRule, ...]:
        """The rules that hold in a graph that does (or does not) split its backward, in table order."""
        return self._applicable[bool(split_backward)]

    def task_kinds(self, split_backward: bool = False) -> tuple[ActionKind, ...]:
        """The kinds of task every ``(stage, microbatch, chunk)`` has: those the applicable rules join, in
        :class:`ActionKind` order (for Eq. 8: F and B, and W when the backward is split)."""
        return self._kinds[bool(split_backward)]

    def predecessors(
        self, task: TaskId, n_stages: int, n_chunks: int, split_backward: bool
    ) -> list[tuple[TaskId, EdgeRule]]:
        """Every task ``task`` waits for, with the rule that makes it wait, in table order."""
        return self._neighbours(EdgeRule.predecessor, task, n_stages, n_chunks, split_backward)

    def successors(
        self, task: TaskId, n_stages: int, n_chunks: int, split_backward: bool
    ) -> list[tuple[TaskId, EdgeRule]]:
        """Every task that waits for ``task``, with the rule that makes it wait, in table order."""
        return self._neighbours(EdgeRule.successor, task, n_stages, n_chunks, split_backward)

    def _neighbours(
        self,
        neighbour_by: Callable[[EdgeRule, TaskId, int, int], TaskId | None],
        task: TaskId,
        n_stages: int,
        n_chunks: int,
        split_backward: bool,
    ) -> list[tuple[TaskId, EdgeRule]]:
        result = []
        for rule in self._applicable[bool(split_backward)]:
            neighbour = neighbour_by(rule, task, n_stages, n_chunks)
            if neighbour is not None:
                result.append((neighbour, rule))
        return result

    def edge_rule(self, source: TaskId, destination: TaskId) -> EdgeRule | None:
        """The rule an edge ``source -> destination`` is an instance of, or None if it is no rule's."""
        return next((rule for rule in self.rules if rule.joins(source, destination)), None)


EDGE_RULES = EdgeRules(
    EdgeRule(
        Dependency.STAGE_FORWARD, ActionKind.FORWARD, ActionKind.FORWARD, stage_offset=-1, chunk_offset=0,
        payload=Payload.ACTIVATION,
        reason="a stage's forward consumes the previous stage's output activations",
    ),
    EdgeRule(
        Dependency.STATE_FORWARD, ActionKind.FORWARD, ActionKind.FORWARD, stage_offset=0, chunk_offset=-1,
        payload=Payload.STATE,
        reason="a chunk's forward consumes the recurrent state left by the previous chunk",
    ),
    EdgeRule(
        Dependency.FORWARD_BACKWARD, ActionKind.FORWARD, ActionKind.BACKWARD, stage_offset=0, chunk_offset=0,
        payload=Payload.SAVED,
        reason="a chunk's backward needs the activations its forward saved",
    ),
    EdgeRule(
        Dependency.STAGE_BACKWARD, ActionKind.BACKWARD, ActionKind.BACKWARD, stage_offset=+1, chunk_offset=0,
        payload=Payload.ACTIVATION_GRADIENT,
        reason="a stage's backward consumes the next stage's activation gradients",
    ),
    EdgeRule(
        Dependency.STATE_BACKWARD, ActionKind.BACKWARD, ActionKind.BACKWARD, stage_offset=0, chunk_offset=+1,
        payload=Payload.STATE_GRADIENT,
        reason="a chunk's backward consumes the state gradient from the next chunk's backward",
    ),
    EdgeRule(
        Dependency.BACKWARD_WEIGHT, ActionKind.BACKWARD, ActionKind.WEIGHT, stage_offset=0, chunk_offset=0,
        payload=Payload.SAVED,
        reason="the weight gradients need the output gradients the backward received",
        applies=Applies.SPLIT_BACKWARD,  # [Note: split backward] in schedlang.lowering.orders
    ),
)
"""Eq. 8 in the paper's order, then the split backward's ``B`` before ``W``: [Note: edge rules]."""
