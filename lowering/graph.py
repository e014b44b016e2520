"""The task graph: StateFlow's partial order (Eq. 8) over forward and backward chunk tasks.

Nodes are :class:`~schedlang.lowering.tasks.TaskId`; every node carries an
``"info"`` attribute (:class:`TaskInfo`) and every edge a ``"dependency"``
attribute (:class:`Dependency`), one of the five constraints of Eq. 8 or, when
the program splits its backward, a sixth:

=================  =====================================  =====================
Dependency         edge                                   why
=================  =====================================  =====================
STAGE_FORWARD      F(r-1, a, i) -> F(r, a, i)             activations flow down
STATE_FORWARD      F(r, a, i-1) -> F(r, a, i)             boundary state S_i^in
FORWARD_BACKWARD   F(r, a, i)   -> B(r, a, i)             saved activations
STAGE_BACKWARD     B(r+1, a, i) -> B(r, a, i)             activation gradients
STATE_BACKWARD     B(r, a, i+1) -> B(r, a, i)             state gradient
BACKWARD_WEIGHT    B(r, a, i)   -> W(r, a, i)             output gradients
=================  =====================================  =====================

``BACKWARD_WEIGHT`` exists only with ``pipeline { split_backward = true }``
([Note: split backward] in schedlang.lowering.orders): then every
``(r, a, i)`` also has a ``W`` task, which waits for its ``B`` alone and which
nothing waits for. Functions that list tasks or successors take
``split_backward`` (default False: the five-edge graph of Eq. 8);
:func:`task_predecessors` needs no flag, since only a ``W`` task has a
``BACKWARD_WEIGHT`` predecessor.

The edges are also available arithmetically (:func:`task_predecessors`,
:func:`task_successors`) so that passes that must scale to hundreds of
thousands of tasks (the legality check, the simulator) never build the
NetworkX graph. :func:`build_task_graph` at 64 stages x 64 microbatches x 32
chunks (262,144 nodes, 643,072 edges) works but takes about 6 s and 450 MB on
the 2-core CI machine, against about 1.3 s and 90 MB for the whole check; the
graph is meant for export and inspection at smaller scales.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import networkx as nx

from schedlang.lowering.program import ScheduleProgram
from schedlang.lowering.tasks import TaskId, TaskKind


class Dependency(str, Enum):
    """The five constraints of Eq. 8, in the paper's order, then the split backward's ``B`` before ``W``."""

    STAGE_FORWARD = "stage_forward"
    STATE_FORWARD = "state_forward"
    FORWARD_BACKWARD = "forward_backward"
    STAGE_BACKWARD = "stage_backward"
    STATE_BACKWARD = "state_backward"
    BACKWARD_WEIGHT = "backward_weight"

    @property
    def same_stage(self) -> bool:
        """Whether the edge joins two tasks of one stage (so one stage's order alone can break it)."""
        return self in _SAME_STAGE

    @property
    def origin(self) -> str:
        """Where the constraint comes from, for messages: ``Eq. 8``, or ``the split backward``."""
        return "the split backward" if self is Dependency.BACKWARD_WEIGHT else "Eq. 8"

    @property
    def formula(self) -> str:
        """The constraint as written in Eq. 8."""
        return _FORMULAS[self]

    @property
    def reason(self) -> str:
        """Why the constraint exists, in words."""
        return _REASONS[self]


_SAME_STAGE = frozenset(
    (Dependency.STATE_FORWARD, Dependency.FORWARD_BACKWARD, Dependency.STATE_BACKWARD, Dependency.BACKWARD_WEIGHT)
)

_FORMULAS = {
    Dependency.STAGE_FORWARD: "F[r-1,a,i] before F[r,a,i]",
    Dependency.STATE_FORWARD: "F[r,a,i-1] before F[r,a,i]",
    Dependency.FORWARD_BACKWARD: "F[r,a,i] before B[r,a,i]",
    Dependency.STAGE_BACKWARD: "B[r+1,a,i] before B[r,a,i]",
    Dependency.STATE_BACKWARD: "B[r,a,i+1] before B[r,a,i]",
    Dependency.BACKWARD_WEIGHT: "B[r,a,i] before W[r,a,i]",
}

_REASONS = {
    Dependency.STAGE_FORWARD: "a stage's forward consumes the previous stage's output activations",
    Dependency.STATE_FORWARD: "a chunk's forward consumes the recurrent state left by the previous chunk",
    Dependency.FORWARD_BACKWARD: "a chunk's backward needs the activations its forward saved",
    Dependency.STAGE_BACKWARD: "a stage's backward consumes the next stage's activation gradients",
    Dependency.STATE_BACKWARD: "a chunk's backward consumes the state gradient from the next chunk's backward",
    Dependency.BACKWARD_WEIGHT: "the weight gradients need the output gradients the backward received",
}


@dataclass(frozen=True)
class TaskInfo:
    """What a task computes: one chunk of ``tokens`` tokens, forward, backward or weight gradients, on one stage."""

    kind: TaskKind
    stage: int
    microbatch: int
    chunk: int
    tokens: int | None = None  # s_i, the chunk length; None when the graph was built without lengths


def task_predecessors(task: TaskId, n_stages: int, n_chunks: int) -> list[tuple[TaskId, Dependency]]:
    """The predecessors of ``task`` with the constraint that links each one (a ``W`` task's: its ``B``)."""
    kind, stage, microbatch, chunk = task
    result = []
    if kind is TaskKind.FORWARD:
        if stage > 0:
            result.append((TaskId(kind, stage - 1, microbatch, chunk), Dependency.STAGE_FORWARD))
        if chunk > 0:
            result.append((TaskId(kind, stage, microbatch, chunk - 1), Dependency.STATE_FORWARD))
    elif kind is TaskKind.BACKWARD:
        result.append((TaskId(TaskKind.FORWARD, stage, microbatch, chunk), Dependency.FORWARD_BACKWARD))
        if stage < n_stages - 1:
            result.append((TaskId(kind, stage + 1, microbatch, chunk), Dependency.STAGE_BACKWARD))
        if chunk < n_chunks - 1:
            result.append((TaskId(kind, stage, microbatch, chunk + 1), Dependency.STATE_BACKWARD))
    else:
        result.append((TaskId(TaskKind.BACKWARD, stage, microbatch, chunk), Dependency.BACKWARD_WEIGHT))
    return result


def task_successors(
    task: TaskId, n_stages: int, n_chunks: int, split_backward: bool = False
) -> list[tuple[TaskId, Dependency]]:
    """The tasks that list ``task`` among their :func:`task_predecessors` (with ``split_backward``, a ``B``'s
    ``W`` too)."""
    kind, stage, microbatch, chunk = task
    result = []
    if kind is TaskKind.FORWARD:
        if stage < n_stages - 1:
            result.append((TaskId(kind, stage + 1, microbatch, chunk), Dependency.STAGE_FORWARD))
        if chunk < n_chunks - 1:
            result.append((TaskId(kind, stage, microbatch, chunk + 1), Dependency.STATE_FORWARD))
        result.append((TaskId(TaskKind.BACKWARD, stage, microbatch, chunk), Dependency.FORWARD_BACKWARD))
    elif kind is TaskKind.BACKWARD:
        if stage > 0:
            result.append((TaskId(kind, stage - 1, microbatch, chunk), Dependency.STAGE_BACKWARD))
        if chunk > 0:
            result.append((TaskId(kind, stage, microbatch, chunk - 1), Dependency.STATE_BACKWARD))
        if split_backward:
            result.append((TaskId(TaskKind.WEIGHT, stage, microbatch, chunk), Dependency.BACKWARD_WEIGHT))
    return result


def task_kinds(split_backward: bool = False) -> tuple[TaskKind, ...]:
    """The kinds of task every ``(stage, microbatch, chunk)`` has: F and B, and W when the backward is split."""
    if split_backward:
        return (TaskKind.FORWARD, TaskKind.BACKWARD, TaskKind.WEIGHT)
    return (TaskKind.FORWARD, TaskKind.BACKWARD)


def all_tasks(n_stages: int, n_microbatches: int, n_chunks: int, split_backward: bool = False) -> list[TaskId]:
    """Every task of the graph: forwards, then backwards, then (split) weight gradients, each stage-,
    microbatch-, chunk-major."""
    return [
        TaskId(kind, stage, microbatch, chunk)
        for kind in task_kinds(split_backward)
        for stage in range(n_stages)
        for microbatch in range(n_microbatches)
        for chunk in range(n_chunks)
    ]


def build_task_graph(
    n_stages: int,
    n_microbatches: int,
    n_chunks: int,
    chunk_tokens: tuple[int, ...] | None = None,
    split_backward: bool = False,
) -> nx.DiGraph:
    """The Eq. 8 task graph; ``chunk_tokens[i]`` (optional) is the length of chunk ``i``; with
    ``split_backward`` also the ``W`` tasks and their ``BACKWARD_WEIGHT`` edges."""
    for name, value in (("n_stages", n_stages), ("n_microbatches", n_microbatches), ("n_chunks", n_chunks)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    if chunk_tokens is not None and len(chunk_tokens) != n_chunks:
        raise ValueError(f"chunk_tokens has {len(chunk_tokens)} lengths for {n_chunks} chunks")
    graph = nx.DiGraph(
        n_stages=n_stages, n_microbatches=n_microbatches, n_chunks=n_chunks, split_backward=split_backward
    )
    tasks = all_tasks(n_stages, n_microbatches, n_chunks, split_backward)
    graph.add_nodes_from(
        (
            task,
            {
                "info": TaskInfo(
                    task.kind,
                    task.stage,
                    task.microbatch,
                    task.chunk,
                    None if chunk_tokens is None else chunk_tokens[task.chunk],
                )
            },
        )
        for task in tasks
    )
    graph.add_edges_from(
        (predecessor, task, {"dependency": dependency})
        for task in tasks
        for predecessor, dependency in task_predecessors(task, n_stages, n_chunks)
    )
    return graph


def chunk_tokens(program: ScheduleProgram) -> tuple[int, ...]:
    """The length s_i of every chunk of the program's sequence."""
    return tuple(program.sequence.chunk_length(chunk) for chunk in range(program.n_chunks))


def task_graph(program: ScheduleProgram) -> nx.DiGraph:
    """The task graph of a checked program, with chunk lengths (and ``W`` tasks when it splits its backward)."""
    return build_task_graph(
        program.n_stages,
        program.n_microbatches,
        program.n_chunks,
        chunk_tokens(program),
        program.pipeline.split_backward,
    )
