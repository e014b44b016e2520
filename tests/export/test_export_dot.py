"""The DOT exporter: golden text for the tiny schedule, and the structure every graph's text must have."""

from __future__ import annotations

import re
import shutil
import subprocess

import networkx as nx
import pytest
from lark import Lark

from schedlang.lowering.export.dot import ProgramOrderEdges, classify_edge, task_graph_to_dot
from schedlang.lowering.graph import Dependency, build_task_graph
from schedlang.lowering.orders import gpipe_orders, one_f_one_b_orders
from schedlang.vocabulary.actions import ActionKind, TaskId

# The DOT language's statement grammar (graphviz.org/doc/info/lang.html), without ports and
# HTML strings, which the exporter never writes: enough to catch quoting and bracket mistakes
# when Graphviz itself is not installed.
_DOT_GRAMMAR = r"""
graph: STRICT? GRAPH_KIND id? "{" stmt_list "}"
stmt_list: (stmt ";"?)*
?stmt: edge_stmt | node_stmt | attr_stmt | assignment | subgraph
attr_stmt: ATTR_TARGET attr_list
assignment: id "=" id
node_stmt: id attr_list?
edge_stmt: (id | subgraph) (EDGE_OP (id | subgraph))+ attr_list?
attr_list: ("[" a_list? "]")+
a_list: (id "=" id (";" | ",")?)+
subgraph: ("subgraph" id?)? "{" stmt_list "}"
id: ID | NUMERAL | STRING
STRICT: "strict"
GRAPH_KIND: "digraph" | "graph"
ATTR_TARGET: "graph" | "node" | "edge"
EDGE_OP: "->" | "--"
ID: /[A-Za-z_][A-Za-z_0-9]*/
NUMERAL: /-?(\.[0-9]+|[0-9]+(\.[0-9]*)?)/
STRING: /"([^"\\]|\\.)*"/
%ignore /\s+/
"""
_DOT_PARSER = Lark(_DOT_GRAMMAR, start="graph", parser="earley")

_EDGE_LINE = re.compile(r'^  "(\S+)" -> "(\S+)" \[(.*)\];$')
_NODE_LINE = re.compile(r'^    "(\S+)" \[label="(\S+)", fillcolor="(#[0-9a-f]{6})"\];$')


def _clusters(text: str) -> dict[int, list[str]]:
    """Node ids listed inside each ``cluster_stage_<r>`` block, in file order."""
    clusters: dict[int, list[str]] = {}
    current = None
    for line in text.splitlines():
        opening = re.match(r"^  subgraph cluster_stage_(\d+) \{$", line)
        if opening:
            current = int(opening.group(1))
            clusters[current] = []
        elif line == "  }":
            current = None
        elif current is not None and _NODE_LINE.match(line):
            clusters[current].append(_NODE_LINE.match(line).group(1))
    return clusters


def _edges(text: str) -> list[tuple[TaskId, TaskId, str]]:
    return [
        (TaskId.parse(match.group(1)), TaskId.parse(match.group(2)), match.group(3))
        for match in map(_EDGE_LINE.match, text.splitlines())
        if match
    ]


def test_tiny_one_f_one_b_matches_golden(golden):
    text = task_graph_to_dot(build_task_graph(2, 2, 2), orders=one_f_one_b_orders(2, 2, 2), name="tiny")
    golden("tiny_1f1b.dot", text)


@pytest.mark.parametrize("dimensions", [(1, 1, 1), (2, 2, 2), (3, 2, 4), (4, 3, 1)])
def test_every_node_sits_in_its_stage_cluster_in_program_order(dimensions):
    graph = build_task_graph(*dimensions)
    orders = one_f_one_b_orders(*dimensions)
    clusters = _clusters(task_graph_to_dot(graph, orders=orders))
    assert sorted(clusters) == list(range(dimensions[0]))
    for stage, node_ids in clusters.items():
        assert [TaskId.parse(node) for node in node_ids] == list(orders[stage])
    assert sum(len(node_ids) for node_ids in clusters.values()) == graph.number_of_nodes()


def test_nodes_use_local_labels_and_kind_colours():
    text = task_graph_to_dot(build_task_graph(2, 1, 2))
    fills = {}
    for match in filter(None, map(_NODE_LINE.match, text.splitlines())):
        task = TaskId.parse(match.group(1))
        assert match.group(2) == task.local_form()
        fills.setdefault(task.kind, set()).add(match.group(3))
    assert len(fills[ActionKind.FORWARD]) == 1 and len(fills[ActionKind.BACKWARD]) == 1
    assert fills[ActionKind.FORWARD] != fills[ActionKind.BACKWARD]


def test_weight_tasks_have_their_own_fill_and_sit_in_program_order():
    graph = build_task_graph(2, 2, 2, split_backward=True)
    orders = one_f_one_b_orders(2, 2, 2, split_backward=True)
    text = task_graph_to_dot(graph, orders=orders)
    fills = {}
    for match in filter(None, map(_NODE_LINE.match, text.splitlines())):
        fills.setdefault(TaskId.parse(match.group(1)).kind, set()).add(match.group(3))
    assert [len(fills[kind]) for kind in ActionKind if kind.is_compute] == [1, 1, 1]
    assert len(set.union(*fills.values())) == 3, "forward, backward and weight-gradient nodes are filled apart"
    assert '    "1W0.1" [label="W0.1", fillcolor="#d9ead3"];' in text.splitlines()
    clusters = _clusters(text)
    for stage, node_ids in clusters.items():
        assert [TaskId.parse(node) for node in node_ids] == list(orders[stage])
    weight_edges = [(s, d, a) for s, d, a in _edges(text) if d.kind is ActionKind.WEIGHT and "invis" not in a]
    assert sorted((s, d) for s, d, _ in weight_edges) == sorted(
        (TaskId(ActionKind.BACKWARD, *task[1:]), task) for task in graph if task.kind is ActionKind.WEIGHT
    )
    assert {a for _, _, a in weight_edges} == {'color="#777777", arrowhead=empty'}
    _DOT_PARSER.parse(text)


def test_every_dependency_is_drawn_once_and_state_edges_are_dashed():
    graph = build_task_graph(3, 2, 3, split_backward=True)  # all six dependencies, B -> W included
    orders = gpipe_orders(3, 2, 3, split_backward=True)
    edges = _edges(task_graph_to_dot(graph, orders=orders, program_order_edges=ProgramOrderEdges.NONE))
    assert sorted((source, destination) for source, destination, _ in edges) == sorted(graph.edges)
    styles_by_dependency: dict[Dependency, set[str]] = {}
    for source, destination, attributes in edges:
        dependency = graph.edges[source, destination]["dependency"]
        styles_by_dependency.setdefault(dependency, set()).add(attributes)
    assert set(styles_by_dependency) == set(Dependency)
    for dependency, styles in styles_by_dependency.items():
        assert len(styles) == 1, f"{dependency} drawn in several styles: {styles}"
        is_dashed = "style=dashed" in next(iter(styles))
        assert is_dashed == (dependency in (Dependency.STATE_FORWARD, Dependency.STATE_BACKWARD))
    distinct_styles = {next(iter(styles)) for styles in styles_by_dependency.values()}
    assert len(distinct_styles) == len(Dependency)


@pytest.mark.parametrize(
    ("style", "marker"), [(ProgramOrderEdges.INVISIBLE, "style=invis"), (ProgramOrderEdges.DOTTED, "style=dotted")]
)
def test_program_order_edges_chain_each_stage(style, marker):
    orders = one_f_one_b_orders(2, 3, 2)
    edges = _edges(task_graph_to_dot(build_task_graph(2, 3, 2), orders=orders, program_order_edges=style))
    chained = [(source, destination) for source, destination, attributes in edges if marker in attributes]
    expected = [pair for order in orders for pair in zip(order, order[1:])]
    assert chained == expected


def test_hand_built_graph_edges_are_classified_from_their_endpoints():
    graph = nx.DiGraph()
    forward_0, forward_1 = TaskId.forward(0, 0, 0), TaskId.forward(0, 0, 1)
    next_stage = TaskId.forward(1, 0, 0)
    stray = TaskId.backward(1, 1, 0)
    graph.add_edges_from([(forward_0, forward_1), (forward_0, next_stage), (forward_0, stray)])
    edges = {(source, destination): attributes for source, destination, attributes in _edges(task_graph_to_dot(graph))}
    assert "style=dashed" in edges[forward_0, forward_1]
    assert "style=dashed" not in edges[forward_0, next_stage]
    assert "style=bold" in edges[forward_0, stray]


@pytest.mark.parametrize(
    ("source", "destination", "expected"),
    [
        ("0F1.0", "1F1.0", Dependency.STAGE_FORWARD),
        ("0F1.0", "0F1.1", Dependency.STATE_FORWARD),
        ("2F1.3", "2B1.3", Dependency.FORWARD_BACKWARD),
        ("2B1.3", "1B1.3", Dependency.STAGE_BACKWARD),
        ("2B1.3", "2B1.2", Dependency.STATE_BACKWARD),
        ("2B1.3", "2W1.3", Dependency.BACKWARD_WEIGHT),
        ("2B1.3", "1W1.3", None),
        ("2B1.3", "2W1.2", None),
        ("2F1.3", "2W1.3", None),
        ("2W1.3", "2B1.3", None),
        ("0F1.0", "0F2.0", None),
        ("0F1.1", "0F1.0", None),
        ("0B1.0", "1B1.0", None),
        ("0F1.0", "1B1.0", None),
    ],
)
def test_classify_edge(source, destination, expected):
    assert classify_edge(TaskId.parse(source), TaskId.parse(destination)) is expected


def test_output_is_deterministic_whatever_the_insertion_order():
    graph = build_task_graph(2, 2, 2)
    shuffled = nx.DiGraph()
    shuffled.add_nodes_from(reversed(list(graph.nodes)))
    shuffled.add_edges_from((s, d, data) for s, d, data in reversed(list(graph.edges(data=True))))
    assert task_graph_to_dot(shuffled) == task_graph_to_dot(graph)


def test_non_task_nodes_are_rejected():
    graph = nx.DiGraph()
    graph.add_node("F0.0")
    with pytest.raises(TypeError, match="not a TaskId"):
        task_graph_to_dot(graph)


@pytest.mark.parametrize("name", ["tiny", 'quote " and \\ backslash'])
def test_text_is_valid_dot(name):
    text = task_graph_to_dot(build_task_graph(2, 2, 2), orders=one_f_one_b_orders(2, 2, 2), name=name)
    tree = _DOT_PARSER.parse(text)
    assert len(list(tree.find_data("subgraph"))) == 2


def test_dot_grammar_rejects_broken_text():
    with pytest.raises(Exception):
        _DOT_PARSER.parse('digraph "x" { "a" -> "b [color=red]; }')


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot binary is not installed")
def test_graphviz_renders_the_text(tmp_path):
    source = tmp_path / "tiny.dot"
    source.write_text(task_graph_to_dot(build_task_graph(2, 2, 2), orders=one_f_one_b_orders(2, 2, 2)))
    result = subprocess.run(["dot", "-Tsvg", str(source)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "<svg" in result.stdout
