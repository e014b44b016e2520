"""The task graph: StateFlow's partial order (Eq. 8) over forward and backward chunk tasks.

Nodes are :class:`~schedlang.vocabulary.actions.TaskId`; every node carries an
``"info"`` attribute (:class:`TaskInfo`) and every edge a ``"dependency"``
attribute (:class:`Dependency`). Nodes and edges come from the table of edge
rules in schedlang.vocabulary.edges ([Note: edge rules]): the five
constraints of Eq. 8 and, when the program splits its backward
(``pipeline { split_backward = true }``, [Note: split backward] in
schedlang.lowering.orders), a sixth, ``BACKWARD_WEIGHT``, from each ``B`` to
its ``W`` task, which nothing waits for. Functions that list tasks or
successors take ``split_backward`` (default False: the five-edge graph of
Eq. 8); every function takes the rule table (``rules``, the real one by
default).

The edges are also available arithmetically (:func:`task_predecessors`,
:func:`task_successors`) so that passes that must scale to hundreds of
thousands of tasks (the legality check, the simulator) never build the
NetworkX graph, which is meant for export and inspection at smaller scales
(its cost at the largest checked size is in docs/benchmarks.md, "Legality check at 64 stages x 64
microbatches x 32 chunks").
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from schedlang.lowering.program import ScheduleProgram
from schedlang.vocabulary.actions import ActionKind, TaskId
from schedlang.vocabulary.edges import EDGE_RULES, Dependency, EdgeRules


@dataclass(frozen=True)
class TaskInfo:
    """What a task computes: one chunk of ``tokens`` tokens, forward, backward or weight gradients, on one stage."""

    kind: ActionKind
    stage: int
    microbatch: int
    chunk: int
    tokens: int | None = None  # s_i, the chunk length; None when the graph was built without lengths


def task_predecessors(
    task: TaskId,
    n_stages: int,
    n_chunks: int,
    split_backward: bool | None = None,
    rules: EdgeRules = EDGE_RULES,
) -> list[tuple[TaskId, Dependency]]:
    """The predecessors of ``task`` with the constraint that links each one (a ``W`` task's: its ``B``).

    ``split_backward`` None: the graph is split exactly when ``task`` is of a
    kind that only a split graph has (so a ``W`` task's ``B`` is found without
    the flag).
    """
    if split_backward is None:
        split_backward = task.kind not in rules.task_kinds(False)
    found = rules.predecessors(task, n_stages, n_chunks, split_backward)
    return [(earlier, rule.dependency) for earlier, rule in found]


def task_successors(
    task: TaskId,
    n_stages: int,
    n_chunks: int,
    split_backward: bool = False,
    rules: EdgeRules = EDGE_RULES,
) -> list[tuple[TaskId, Dependency]]:
    """The tasks that list ``task`` among their :func:`task_predecessors` (with ``split_backward``, a ``B``'s
    ``W`` too)."""
    found = rules.successors(task, n_stages, n_chunks, split_backward)
    return [(later, rule.dependency) for later, rule in found]


def task_kinds(split_backward: bool = False, rules: EdgeRules = EDGE_RULES) -> tuple[ActionKind, ...]:
    """The kinds of task every ``(stage, microbatch, chunk)`` has: F and B, and W when the backward is split."""
    return rules.task_kinds(split_backward)


def all_tasks(
    n_stages: int,
    n_microbatches: int,
    n_chunks: int,
    split_backward: bool = False,
    rules: EdgeRules = EDGE_RULES,
) -> list[TaskId]:
    """Every task of the graph: forwards, then backwards, then (split) weight gradients, each stage-,
    microbatch-, chunk-major."""
    return [
        TaskId(kind, stage, microbatch, chunk)
        for kind in rules.task_kinds(split_backward)
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
    rules: EdgeRules = EDGE_RULES,
) -> nx.DiGraph:
    """The Eq. 8 task graph; ``chunk_tokens[i]`` (optional) is the length of chunk ``i``; with
    ``split_backward`` also the ``W`` tasks and their ``BACKWARD_WEIGHT`` edges. ``rules`` is the table the
    nodes and edges come from ([Note: edge rules])."""
    for name, value in (("n_stages", n_stages), ("n_microbatches", n_microbatches), ("n_chunks", n_chunks)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    if chunk_tokens is not None and len(chunk_tokens) != n_chunks:
        raise ValueError(f"chunk_tokens has {len(chunk_tokens)} lengths for {n_chunks} chunks")
    graph = nx.DiGraph(
        n_stages=n_stages, n_microbatches=n_microbatches, n_chunks=n_chunks, split_backward=split_backward
    )
    tasks = all_tasks(n_stages, n_microbatches, n_chunks, split_backward, rules)
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
        (earlier, task, {"dependency": rule.dependency})
        for task in tasks
        for earlier, rule in rules.predecessors(task, n_stages, n_chunks, split_backward)
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
