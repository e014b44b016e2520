"""The table of edge rules ([Note: edge rules]) against everything derived from it.

A property test holds the table against the NetworkX graph, the arithmetic
neighbour queries, the legality checker's numbering and the DOT exporter's
edge classes; a made-up rule added to the table in one place is then followed
by the graph, the legality check and the DOT text alike.
"""

from __future__ import annotations

from enum import Enum

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedlang.lowering.export.dot import classify_edge, task_graph_to_dot
from schedlang.lowering.graph import all_tasks, build_task_graph, task_predecessors, task_successors
from schedlang.lowering.legality import ViolationKind, _Dimensions, _TaskNumbering, check_orders, execution_order
from schedlang.lowering.orders import gpipe_orders, one_f_one_b_orders
from schedlang.vocabulary.actions import ActionKind, TaskId
from schedlang.vocabulary.edges import EDGE_RULES, Applies, Dependency, EdgeRule, EdgeRules, Payload

F, B, W = ActionKind.FORWARD, ActionKind.BACKWARD, ActionKind.WEIGHT

dimensions = st.tuples(
    st.integers(1, 4),  # stages
    st.integers(1, 3),  # microbatches
    st.integers(1, 4),  # chunks
    st.booleans(),  # split backward
)


@settings(max_examples=60, deadline=None)
@given(dimensions)
def test_every_edge_of_the_graph_is_exactly_one_rule_and_every_derivation_agrees(case):
    n_stages, n_microbatches, n_chunks, split = case
    graph = build_task_graph(n_stages, n_microbatches, n_chunks, split_backward=split)

    for source, destination, dependency in graph.edges(data="dependency"):
        matching = [rule for rule in EDGE_RULES if rule.joins(source, destination)]
        assert [rule.dependency for rule in matching] == [dependency]
        assert matching[0].applies.holds(split)
        assert classify_edge(source, destination) is dependency

    for task in graph.nodes:
        into = {(source, graph.edges[source, task]["dependency"]) for source in graph.pred[task]}
        out_of = {(destination, graph.edges[task, destination]["dependency"]) for destination in graph.succ[task]}
        assert set(task_predecessors(task, n_stages, n_chunks)) == into
        assert set(task_predecessors(task, n_stages, n_chunks, split)) == into
        assert set(task_successors(task, n_stages, n_chunks, split)) == out_of

    numbering = _TaskNumbering(_Dimensions(n_stages, n_microbatches, n_chunks, split), EDGE_RULES)
    assert numbering.total == graph.number_of_nodes()
    assert sorted(numbering.number(task) for task in graph.nodes) == list(range(numbering.total))
    for number in range(numbering.total):
        task = numbering.task(number)
        assert numbering.number(task) == number
        predecessors = {(numbering.task(before), rule.dependency) for before, rule in numbering.predecessors(number)}
        assert predecessors == {(source, graph.edges[source, task]["dependency"]) for source in graph.pred[task]}
        assert len(numbering.predecessor_steps[number]) == graph.in_degree(task)  # _run_queues' waiting count
        successors = {numbering.task(number + difference) for difference in numbering.successor_differences[number]}
        assert successors == set(graph.succ[task])


@settings(max_examples=40, deadline=None)
@given(dimensions, st.data())
def test_classify_edge_names_a_rule_exactly_for_the_edges_of_the_graph(case, data):
    n_stages, n_microbatches, n_chunks, split = case
    graph = build_task_graph(n_stages, n_microbatches, n_chunks, split_backward=split)
    tasks = sorted(graph.nodes)
    for _ in range(30):
        source = data.draw(st.sampled_from(tasks))
        destination = data.draw(st.sampled_from(tasks))
        assert (classify_edge(source, destination) is not None) == graph.has_edge(source, destination)


def test_every_dependency_is_one_row_and_its_properties_read_the_row():
    assert [rule.dependency for rule in EDGE_RULES] == list(Dependency)
    for rule in EDGE_RULES:
        assert rule.dependency.formula == rule.formula
        assert rule.dependency.same_stage == rule.same_stage == (rule.stage_offset == 0)
        assert rule.dependency.reason == rule.reason
    assert Dependency.STAGE_BACKWARD.formula == "B[r+1,a,i] before B[r,a,i]"
    assert Dependency.STATE_FORWARD.origin == "Eq. 8"
    assert Dependency.BACKWARD_WEIGHT.origin == "the split backward"


def test_the_kinds_of_a_graph_are_the_kinds_its_rules_join():
    assert EDGE_RULES.task_kinds(False) == (F, B)
    assert EDGE_RULES.task_kinds(True) == (F, B, W)


def test_a_table_rejects_two_rows_for_one_edge_or_one_name():
    stage_forward = EDGE_RULES.rule(Dependency.STAGE_FORWARD)
    with pytest.raises(ValueError, match="joins the same tasks as"):
        EDGE_RULES + (EdgeRule(Dependency.FORWARD_BACKWARD, F, F, -1, 0, Payload.ACTIVATION, "again"),)
    with pytest.raises(ValueError, match="two rules are named"):
        EdgeRules(stage_forward, EdgeRule(Dependency.STAGE_FORWARD, B, B, -1, 0, Payload.ACTIVATION_GRADIENT, "again"))


def test_the_numbering_asks_the_table_once_per_kind_stage_and_chunk():
    """What keeps the legality check linear: the table is not asked once per task."""

    class CountingRules(EdgeRules):
        questions = 0

        def predecessors(self, *arguments):
            CountingRules.questions += 1
            return super().predecessors(*arguments)

    rules = CountingRules(*EDGE_RULES)
    for n_microbatches in (1, 7):
        CountingRules.questions = 0
        _TaskNumbering(_Dimensions(3, n_microbatches, 4, True), rules)
        assert CountingRules.questions == 3 * 3 * 4


class MadeUpDependency(str, Enum):
    """A dependency name that only this test's table has."""

    WEIGHT_CHAIN = "weight_chain"


WEIGHT_CHAIN = EdgeRule(
    MadeUpDependency.WEIGHT_CHAIN,  # type: ignore[arg-type]  # a name outside Dependency, on purpose
    before=W,
    after=W,
    stage_offset=0,
    chunk_offset=+1,
    payload=Payload.SAVED,
    reason="a made-up rule: weight gradients in the order of the state gradients",
    applies=Applies.SPLIT_BACKWARD,
)
EXTENDED_RULES = EDGE_RULES + (WEIGHT_CHAIN,)
"""The real table and one made-up row: the only place the made-up rule is written."""


def test_a_made_up_rule_is_followed_by_the_graph():
    n_stages, n_microbatches, n_chunks = 2, 2, 3
    plain = build_task_graph(n_stages, n_microbatches, n_chunks, split_backward=True)
    graph = build_task_graph(n_stages, n_microbatches, n_chunks, split_backward=True, rules=EXTENDED_RULES)
    chain = {(u, v) for u, v, d in graph.edges(data="dependency") if d is MadeUpDependency.WEIGHT_CHAIN}
    assert chain == {
        (TaskId(W, r, a, i + 1), TaskId(W, r, a, i))
        for r in range(n_stages)
        for a in range(n_microbatches)
        for i in range(n_chunks - 1)
    }
    assert set(graph.edges) == set(plain.edges) | chain
    assert nx.is_directed_acyclic_graph(graph)
    unsplit = build_task_graph(n_stages, n_microbatches, n_chunks, rules=EXTENDED_RULES)
    assert set(unsplit.edges) == set(build_task_graph(n_stages, n_microbatches, n_chunks).edges)
    last_weight = TaskId(W, 1, 0, n_chunks - 1)
    assert task_successors(last_weight, n_stages, n_chunks, True, EXTENDED_RULES) == [
        (TaskId(W, 1, 0, n_chunks - 2), MadeUpDependency.WEIGHT_CHAIN)
    ]
    assert all_tasks(2, 2, 3, True, EXTENDED_RULES) == all_tasks(2, 2, 3, True)


def test_a_made_up_rule_is_followed_by_the_legality_check():
    n_stages, n_microbatches, n_chunks = 2, 2, 3
    # GPipe with every W at the end of the step, in ascending chunk order: legal under Eq. 8, but not under
    # the made-up rule, which wants W[r,a,i+1] before W[r,a,i].
    orders = [
        [task for task in order if task.kind is not W]
        + sorted((task for task in order if task.kind is W), key=lambda task: (task.microbatch, task.chunk))
        for order in gpipe_orders(n_stages, n_microbatches, n_chunks, split_backward=True)
    ]
    dims = (n_stages, n_microbatches, n_chunks)
    assert check_orders(dims, orders, split_backward=True).is_legal
    report = check_orders(dims, orders, split_backward=True, rules=EXTENDED_RULES)
    violations = report.of_kind(ViolationKind.ORDER_VIOLATION)
    assert len(violations) == n_stages * n_microbatches * (n_chunks - 1)
    assert all(violation.dependency is MadeUpDependency.WEIGHT_CHAIN for violation in violations)
    assert "W[r,a,i+1] before W[r,a,i]: a made-up rule" in violations[0].message
    assert "stage 0 runs W0.0 (step" in violations[0].message

    legal = one_f_one_b_orders(n_stages, n_microbatches, n_chunks, split_backward=True)
    assert check_orders(dims, legal, split_backward=True, rules=EXTENDED_RULES).is_legal
    done = set()
    for task in execution_order(dims, legal, split_backward=True, rules=EXTENDED_RULES):
        assert all(before in done for before, _ in task_predecessors(task, n_stages, n_chunks, True, EXTENDED_RULES))
        done.add(task)


def test_a_made_up_rule_is_followed_by_the_dot_exporter():
    graph = build_task_graph(1, 1, 2, split_backward=True, rules=EXTENDED_RULES)
    text = task_graph_to_dot(graph)
    assert '"0W0.1" -> "0W0.0" [color="#000000"];' in text

    later, earlier = TaskId(W, 0, 0, 1), TaskId(W, 0, 0, 0)
    assert classify_edge(later, earlier) is None
    assert classify_edge(later, earlier, EXTENDED_RULES) is MadeUpDependency.WEIGHT_CHAIN
    hand_built = nx.DiGraph([(later, earlier)])
    assert '[color="#cc0000", style=bold]' in task_graph_to_dot(hand_built)
    assert '"0W0.1" -> "0W0.0" [color="#000000"];' in task_graph_to_dot(hand_built, rules=EXTENDED_RULES)
