"""The task graph's edges, one constraint of Eq. 8 at a time, and the order generators."""

from __future__ import annotations

import networkx as nx
import pytest

from lowering_programs import explicit_program, make_program
from schedlang.lowering.graph import (
    Dependency,
    TaskInfo,
    build_task_graph,
    task_graph,
    task_predecessors,
    task_successors,
)
from schedlang.lowering.orders import (
    explicit_orders,
    gpipe_orders,
    one_f_one_b_orders,
    one_f_one_b_warmup,
    stage_orders,
)
from schedlang.vocabulary import OrderKind
from schedlang.vocabulary.actions import ActionKind, TaskId

F, B = ActionKind.FORWARD, ActionKind.BACKWARD


def edges_of(graph, dependency):
    return {(u, v) for u, v, d in graph.edges(data="dependency") if d is dependency}


@pytest.mark.parametrize(("n_stages", "n_microbatches", "n_chunks"), [(1, 1, 1), (3, 2, 4), (2, 3, 1)])
def test_each_constraint_of_eq8_gives_exactly_its_edges(n_stages, n_microbatches, n_chunks):
    graph = build_task_graph(n_stages, n_microbatches, n_chunks)
    P, M, N = n_stages, n_microbatches, n_chunks
    units = [(a, i) for a in range(M) for i in range(N)]
    expected = {
        Dependency.STAGE_FORWARD: {
            (TaskId(F, r - 1, a, i), TaskId(F, r, a, i)) for r in range(1, P) for a, i in units
        },
        Dependency.STATE_FORWARD: {
            (TaskId(F, r, a, i - 1), TaskId(F, r, a, i)) for r in range(P) for a, i in units if i >= 1
        },
        Dependency.FORWARD_BACKWARD: {(TaskId(F, r, a, i), TaskId(B, r, a, i)) for r in range(P) for a, i in units},
        Dependency.STAGE_BACKWARD: {
            (TaskId(B, r + 1, a, i), TaskId(B, r, a, i)) for r in range(P - 1) for a, i in units
        },
        Dependency.STATE_BACKWARD: {
            (TaskId(B, r, a, i + 1), TaskId(B, r, a, i)) for r in range(P) for a, i in units if i < N - 1
        },
    }
    for dependency, edges in expected.items():
        assert edges_of(graph, dependency) == edges, dependency
    assert graph.number_of_edges() == sum(len(edges) for edges in expected.values())
    assert graph.number_of_nodes() == 2 * P * M * N
    assert nx.is_directed_acyclic_graph(graph)


def test_arithmetic_neighbours_match_the_graph():
    graph = build_task_graph(3, 2, 3)
    for task in graph.nodes:
        assert set(task_predecessors(task, 3, 3)) == {(u, graph.edges[u, task]["dependency"]) for u in graph.pred[task]}
        assert set(task_successors(task, 3, 3)) == {(v, graph.edges[task, v]["dependency"]) for v in graph.succ[task]}


def test_node_info_carries_chunk_lengths():
    program = make_program(2, 1, 3, boundaries=(0, 64, 192, 200))
    graph = task_graph(program)
    assert graph.nodes[TaskId.parse("1B0.1")]["info"] == TaskInfo(B, 1, 0, 1, 128)
    assert graph.nodes[TaskId.parse("0F0.2")]["info"].tokens == 8
    assert build_task_graph(1, 1, 1).nodes[TaskId.parse("0F0.0")]["info"].tokens is None
    assert Dependency.STATE_BACKWARD.same_stage and not Dependency.STAGE_FORWARD.same_stage


def test_build_task_graph_rejects_bad_dimensions():
    with pytest.raises(ValueError, match="n_microbatches must be at least 1"):
        build_task_graph(1, 0, 1)
    with pytest.raises(ValueError, match="2 lengths for 3 chunks"):
        build_task_graph(1, 1, 3, (1, 2))


def text(orders):
    return [" ".join(task.local_form() for task in order) for order in orders]


def test_one_f_one_b_with_chunks_exact():
    assert text(one_f_one_b_orders(2, 2, 2)) == [
        "F0.0 F0.1 F1.0 B0.1 F1.1 B0.0 B1.1 B1.0",
        "F0.0 F0.1 B0.1 F1.0 B0.0 F1.1 B1.1 B1.0",
    ]


def test_one_f_one_b_with_one_chunk_is_classic_1f1b():
    assert text(one_f_one_b_orders(3, 4, 1)) == [
        "F0.0 F1.0 F2.0 B0.0 F3.0 B1.0 B2.0 B3.0",
        "F0.0 F1.0 B0.0 F2.0 B1.0 F3.0 B2.0 B3.0",
        "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0 F3.0 B3.0",
    ]


def test_gpipe_exact():
    assert text(gpipe_orders(2, 2, 2)) == ["F0.0 F0.1 F1.0 F1.1 B0.1 B0.0 B1.1 B1.0"] * 2


@pytest.mark.parametrize("generate", [gpipe_orders, one_f_one_b_orders])
def test_generators_run_every_task_once_on_its_stage(generate):
    P, M, N = 4, 3, 5
    orders = generate(P, M, N)
    assert len(orders) == P
    for stage, order in enumerate(orders):
        assert sorted(order) == sorted(
            TaskId(kind, stage, a, i) for kind in (F, B) for a in range(M) for i in range(N)
        )


@pytest.mark.parametrize(("P", "M", "N"), [(4, 3, 2), (8, 1, 4), (2, 16, 8), (5, 2, 1)])
def test_one_f_one_b_warmup_then_alternation(P, M, N):
    for stage, order in enumerate(one_f_one_b_orders(P, M, N)):
        warmup = one_f_one_b_warmup(P, M, N, stage)
        assert warmup == min(M * N, N + P - stage - 1)
        kinds = [task.kind for task in order]
        assert kinds[:warmup] == [F] * warmup and kinds[warmup] is B
        steady = kinds[warmup : warmup + 2 * (M * N - warmup)]
        assert steady == [B, F] * (M * N - warmup)
        backwards = [(task.microbatch, task.chunk) for task in order if task.kind is B]
        assert backwards == [(a, i) for a in range(M) for i in reversed(range(N))]


def test_generators_reject_empty_dimensions():
    with pytest.raises(ValueError, match="n_stages must be at least 1"):
        gpipe_orders(0, 1, 1)


def test_stage_orders_follow_the_program_order_kind():
    assert stage_orders(make_program(3, 2, 2, order=OrderKind.GPIPE)) == gpipe_orders(3, 2, 2)
    assert stage_orders(make_program(3, 2, 2)) == one_f_one_b_orders(3, 2, 2)


def test_explicit_orders_fill_in_the_stage_and_concatenate_lines():
    program, _ = explicit_program(2, 1, 1, {1: "F0.0 B0.0", 0: "F0.0"})
    assert text(stage_orders(program)) == ["F0.0", "F0.0 B0.0"]
    assert stage_orders(program)[1][0] == TaskId.parse("1F0.0")
    out_of_range, _ = explicit_program(2, 1, 1, {2: "F0.0"})
    with pytest.raises(ValueError, match="names stage 2 but the pipeline has 2 stages"):
        explicit_orders(out_of_range)
