"""Task graph -> Graphviz DOT text.

Input: a NetworkX DiGraph whose nodes are :class:`TaskId` and whose edges are
dependencies of Eq. 8 (as built by ``schedlang.lowering.graph``, with the
split backward's ``B -> W`` edges when it has ``W`` tasks), and optionally
each stage's program order. Output: DOT text with one
``subgraph cluster_stage_<r>`` per stage, nodes labelled in local form
(``F0.1``), forward, backward and weight-gradient nodes filled apart, and
edges styled by the constraint they encode: stage edges solid, state edges
(``STATE_FORWARD``, ``STATE_BACKWARD``) dashed and coloured apart, the
same-stage hand-offs of saved tensors (``FORWARD_BACKWARD``, and
``BACKWARD_WEIGHT`` with a hollow arrowhead) grey. Nothing here runs Graphviz.

An edge without a ``"dependency"`` attribute (a hand-built graph) is
classified from its endpoints by the table of edge rules ([Note: edge rules]
in schedlang.vocabulary.edges); an edge that is no rule's is drawn bold
red so it stands out, and one of a rule the caller's table adds without a
style here is drawn black.

The text is deterministic: nodes and edges are sorted, so it can be diffed
against a golden file.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import Enum

import networkx as nx

from schedlang.vocabulary.actions import ActionKind, TaskId
from schedlang.vocabulary.edges import EDGE_RULES, Dependency, EdgeRules


class ProgramOrderEdges(str, Enum):
    """How each stage's program order is drawn, when orders are given."""

    NONE = "none"
    INVISIBLE = "invisible"  # only steers the layout: each stage reads left to right
    DOTTED = "dotted"


_EDGE_STYLES: dict[Dependency | None, str] = {
    Dependency.STAGE_FORWARD: 'color="#1f5fa8"',
    Dependency.STAGE_BACKWARD: 'color="#b35806"',
    Dependency.STATE_FORWARD: 'color="#2e8b57", style=dashed, penwidth=1.6',
    Dependency.STATE_BACKWARD: 'color="#8b2e6b", style=dashed, penwidth=1.6',
    Dependency.FORWARD_BACKWARD: 'color="#777777"',
    Dependency.BACKWARD_WEIGHT: 'color="#777777", arrowhead=empty',  # like F -> B: a same-stage hand-off
    None: 'color="#cc0000", style=bold',  # an edge that is no constraint of Eq. 8
}

_UNSTYLED_RULE_EDGE = 'color="#000000"'
"""An edge of a rule that the caller's table adds and that has no style of its own above."""

_NODE_FILL: dict[ActionKind, str] = {
    ActionKind.FORWARD: "#cfe2f3",
    ActionKind.BACKWARD: "#fce5cd",
    ActionKind.WEIGHT: "#d9ead3",
}

_KIND_RANK = {kind: rank for rank, kind in enumerate(ActionKind)}  # F, B, W: the order ActionKind declares


def classify_edge(source: TaskId, destination: TaskId, rules: EdgeRules = EDGE_RULES) -> Dependency | None:
    """The constraint of the rule table ([Note: edge rules]: Eq. 8 and the split backward's ``B -> W``) that an
    edge ``source -> destination`` encodes, or None if it is none."""
    rule = rules.edge_rule(source, destination)
    return None if rule is None else rule.dependency


def task_sort_key(task: TaskId) -> tuple[int, int, int, int]:
    """Stage, then forwards before backwards before weight gradients, then microbatch, then chunk."""
    return (task.stage, _KIND_RANK[task.kind], task.microbatch, task.chunk)


def _quoted(task: TaskId) -> str:
    return f'"{task}"'


def _node_line(task: TaskId) -> str:
    return f'{_quoted(task)} [label="{task.local_form()}", fillcolor="{_NODE_FILL[task.kind]}"];'


def _stage_node_order(
    stage: int, tasks: Iterable[TaskId], orders: Sequence[Sequence[TaskId]] | None
) -> list[TaskId]:
    """The stage's tasks in program order when known (so the file reads like the schedule)."""
    remaining = sorted(tasks, key=task_sort_key)
    if orders is None or stage >= len(orders):
        return remaining
    known_tasks = set(remaining)
    in_order = [task for task in dict.fromkeys(orders[stage]) if task in known_tasks]
    placed = set(in_order)
    return in_order + [task for task in remaining if task not in placed]


def task_graph_to_dot(
    graph: nx.DiGraph,
    *,
    orders: Sequence[Sequence[TaskId]] | None = None,
    program_order_edges: ProgramOrderEdges = ProgramOrderEdges.INVISIBLE,
    name: str = "schedule",
    rules: EdgeRules = EDGE_RULES,
) -> str:
    """Render ``graph`` as DOT text; see the module docstring for the contract.

    Args:
        graph: nodes are :class:`TaskId`; edges are Eq. 8 dependencies.
        orders: ``orders[r]`` is stage r's program order; used to list each
            cluster's nodes in that order and, unless ``program_order_edges`` is
            ``NONE``, to chain consecutive tasks so Graphviz lays each stage out
            left to right in the order it runs.
        program_order_edges: how those chains are drawn.
        name: the graph's name (quoted, so any text is accepted).
        rules: the table that classifies edges without a ``"dependency"``
            attribute ([Note: edge rules]).
    """
    tasks = list(graph.nodes)
    for task in tasks:
        if not isinstance(task, TaskId):
            raise TypeError(f"task graph node {task!r} is not a TaskId")
    tasks_by_stage: dict[int, list[TaskId]] = {stage: [] for stage in range(len(orders or ()))}
    for task in tasks:
        tasks_by_stage.setdefault(task.stage, []).append(task)
    escaped_name = name.replace("\\", "\\\\").replace('"', '\\"')

    lines = [
        f'digraph "{escaped_name}" {{',
        "  rankdir=LR;",
        "  newrank=true;",
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=11];',
        '  edge [fontname="Helvetica", fontsize=9, arrowsize=0.7];',
    ]
    for stage in sorted(tasks_by_stage):
        lines.append(f"  subgraph cluster_stage_{stage} {{")
        lines.append(f'    label="stage {stage}";')
        lines.append('    style=rounded; color="#999999";')
        for task in _stage_node_order(stage, tasks_by_stage[stage], orders):
            lines.append(f"    {_node_line(task)}")
        lines.append("  }")

    dependency_edges = sorted(
        graph.edges, key=lambda edge: (task_sort_key(edge[0]), task_sort_key(edge[1]))
    )
    for source, destination in dependency_edges:
        dependency = graph.edges[source, destination].get("dependency") or classify_edge(source, destination, rules)
        style = _EDGE_STYLES.get(dependency, _UNSTYLED_RULE_EDGE)
        lines.append(f"  {_quoted(source)} -> {_quoted(destination)} [{style}];")

    if orders and program_order_edges is not ProgramOrderEdges.NONE:
        if program_order_edges is ProgramOrderEdges.INVISIBLE:
            style = "style=invis"
        else:
            style = 'style=dotted, color="#bbbbbb"'
        known_tasks = set(tasks)
        for stage_order in orders:
            # Tasks the graph lacks are the legality checker's to report, not ours to draw.
            unique_order = [task for task in dict.fromkeys(stage_order) if task in known_tasks]
            for earlier, later in zip(unique_order, unique_order[1:]):
                lines.append(f"  {_quoted(earlier)} -> {_quoted(later)} [{style}, weight=10];")
    lines.append("}")
    return "\n".join(lines) + "\n"
