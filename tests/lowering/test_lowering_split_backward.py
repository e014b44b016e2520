"""The split backward ([Note: split backward]): W tasks in the graph, the legality pass, the cost models and the
simulator."""

from __future__ import annotations

import dataclasses
import itertools

import networkx as nx
import pytest

from lowering_programs import explicit_program, make_program
from schedlang.lowering.cost import FlopsCostModel, Hardware, UnitCostModel, linear_layers
from schedlang.lowering.graph import (
    Dependency,
    all_tasks,
    build_task_graph,
    task_graph,
    task_predecessors,
    task_successors,
)
from schedlang.lowering.legality import (
    IllegalScheduleError,
    ViolationKind,
    check_orders,
    execution_order,
    render_report,
)
from schedlang.lowering.memory import stateflow_peak_activations
from schedlang.lowering.orders import gpipe_orders, one_f_one_b_orders, one_f_one_b_warmup, stage_orders
from schedlang.lowering.parameters import stage_parameters
from schedlang.lowering.program import MeshSpec
from schedlang.lowering.simulate import simulate
from schedlang.lowering.timeline import Stream
from schedlang.vocabulary import LayerKind, OrderKind, SequenceParallelMethod
from schedlang.vocabulary.actions import ActionKind, TaskId

F, B, W = ActionKind.FORWARD, ActionKind.BACKWARD, ActionKind.WEIGHT

STAGES = range(1, 6)
MICROBATCHES = range(1, 6)
CHUNKS = range(1, 5)
EXTRA_WARMUPS = range(0, 3)


def split(program):
    return dataclasses.replace(program, pipeline=dataclasses.replace(program.pipeline, split_backward=True))


def compute_intervals(timeline):
    return {
        str(interval.task): (interval.start, interval.end)
        for interval in timeline.tasks
        if interval.stream is Stream.COMPUTE
    }


def orders_from_text(*lines: str) -> tuple[tuple[TaskId, ...], ...]:
    return tuple(tuple(TaskId.parse(word) for word in line.split()) for line in lines)


def test_the_sixth_dependency_joins_each_backward_to_its_weight_task():
    P, M, N = 3, 2, 4
    graph = build_task_graph(P, M, N, split_backward=True)
    weight_edges = {(u, v) for u, v, d in graph.edges(data="dependency") if d is Dependency.BACKWARD_WEIGHT}
    assert weight_edges == {
        (TaskId(B, r, a, i), TaskId(W, r, a, i)) for r in range(P) for a in range(M) for i in range(N)
    }
    unsplit = build_task_graph(P, M, N)
    assert graph.number_of_nodes() == 3 * P * M * N == unsplit.number_of_nodes() + P * M * N
    assert graph.number_of_edges() == unsplit.number_of_edges() + P * M * N
    assert set(unsplit.edges) <= set(graph.edges)
    assert all(graph.out_degree(task) == 0 and graph.in_degree(task) == 1 for task in graph if task.kind is W)
    assert nx.is_directed_acyclic_graph(graph)
    assert Dependency.BACKWARD_WEIGHT.same_stage
    assert Dependency.BACKWARD_WEIGHT.formula == "B[r,a,i] before W[r,a,i]"
    assert Dependency.BACKWARD_WEIGHT.reason == "the weight gradients need the output gradients the backward received"


def test_arithmetic_neighbours_match_the_split_graph():
    graph = build_task_graph(3, 2, 3, split_backward=True)
    assert set(all_tasks(3, 2, 3, split_backward=True)) == set(graph.nodes)
    for task in graph.nodes:
        assert set(task_predecessors(task, 3, 3)) == {(u, graph.edges[u, task]["dependency"]) for u in graph.pred[task]}
        assert set(task_successors(task, 3, 3, split_backward=True)) == {
            (v, graph.edges[task, v]["dependency"]) for v in graph.succ[task]
        }
    assert all(task.kind is not W for task in all_tasks(3, 2, 3))
    assert (TaskId(W, 0, 0, 0), Dependency.BACKWARD_WEIGHT) not in task_successors(TaskId(B, 0, 0, 0), 3, 3)


def test_task_graph_of_a_split_program_has_weight_tasks_with_lengths():
    graph = task_graph(make_program(2, 1, 2, boundaries=(0, 64, 192), split_backward=True))
    assert graph.nodes[TaskId.parse("1W0.1")]["info"].tokens == 128
    assert not any(task.kind is W for task in task_graph(make_program(2, 1, 2)))


@pytest.mark.parametrize("n_stages", STAGES)
def test_generated_split_orders_are_legal_and_deadlock_free(n_stages):
    for n_microbatches in MICROBATCHES:
        for n_chunks in CHUNKS:
            dimensions = (n_stages, n_microbatches, n_chunks)
            candidates = [("gpipe", gpipe_orders(*dimensions, split_backward=True))]
            candidates += [
                (f"1f1b+{extra}{' F-before-W' if late else ''}", one_f_one_b_orders(*dimensions, extra, True, late))
                for extra in EXTRA_WARMUPS
                for late in (False, True)
            ]
            for name, orders in candidates:
                report = check_orders(dimensions, orders, split_backward=True)
                assert report.is_legal, (name, dimensions, report.violations[:3])
                assert report.n_tasks == 3 * n_stages * n_microbatches * n_chunks
                # the same orders are not a legal unsplit schedule: every W is an unknown task there
                unsplit = check_orders(dimensions, orders)
                assert {violation.kind for violation in unsplit.violations} == {ViolationKind.UNKNOWN_TASK}
                sequence = execution_order(dimensions, orders, split_backward=True)
                assert len(sequence) == report.n_tasks
                done = set()
                for task in sequence:
                    assert all(predecessor in done for predecessor, _ in task_predecessors(task, n_stages, n_chunks))
                    done.add(task)


def test_a_split_program_checks_its_generated_orders_and_counts_weight_tasks():
    for order in (OrderKind.ONE_F_ONE_B, OrderKind.GPIPE):
        report = check_orders(make_program(3, 2, 2, order=order, split_backward=True))
        assert report.is_legal
        assert report.summary() == "legal: 3 stages, 2 microbatches, 2 chunks, 36 tasks"
    with pytest.raises(ValueError, match="program's pipeline.split_backward is False"):
        check_orders(make_program(1, 1, 1), split_backward=True)


def test_weight_task_before_its_backward_is_an_order_violation():
    program, source = explicit_program(1, 1, 2, {0: "F0.0 F0.1 B0.1 W0.0 B0.0 W0.1"}, split_backward=True)
    report = check_orders(program)
    (violation,) = report.violations
    assert violation.kind is ViolationKind.ORDER_VIOLATION
    assert violation.dependency is Dependency.BACKWARD_WEIGHT
    assert violation.tasks == (TaskId.parse("0W0.0"), TaskId.parse("0B0.0"))
    assert render_report(report, {"test.sched": source}) == (
        "test.sched:3:27: error: stage 0 runs W0.0 (step 3) before B0.0 (step 4), but the split backward requires "
        "B[r,a,i] before W[r,a,i]: the weight gradients need the output gradients the backward received; "
        "move W0.0 after B0.0\n"
        "  stage 0: F0.0 F0.1 B0.1 W0.0 B0.0 W0.1\n"
        "                          ^~~~\n"
        "illegal: 1 violation (1 stage, 1 microbatch, 2 chunks, 6 tasks)"
    )
    with pytest.raises(IllegalScheduleError, match="runs W0.0 \\(step 3\\) before B0.0"):
        execution_order((1, 1, 2), orders_from_text("0F0.0 0F0.1 0B0.1 0W0.0 0B0.0 0W0.1"), split_backward=True)


def test_missing_and_duplicated_weight_tasks_are_reported_with_their_token():
    program, source = explicit_program(
        2, 1, 1, {0: "F0.0 B0.0 W0.0 W0.0", 1: "F0.0 B0.0"}, split_backward=True
    )
    report = check_orders(program)
    assert [violation.kind for violation in report.violations] == [
        ViolationKind.DUPLICATE_TASK,
        ViolationKind.MISSING_TASK,
    ]
    assert report.of_kind(ViolationKind.MISSING_TASK)[0].tasks == (TaskId.parse("1W0.0"),)
    assert render_report(report, {"test.sched": source}) == (
        "test.sched:3:27: error: stage 0 runs W0.0 twice (first at step 2); remove one\n"
        "  stage 0: F0.0 B0.0 W0.0 W0.0\n"
        "                          ^~~~\n"
        "test.sched:4:3: error: stage 1 never runs W0.0 (the weight gradients of microbatch 0, chunk 0)\n"
        "  stage 1: F0.0 B0.0\n"
        "  ^~~~~~~~~~~~~~~~~~\n"
        "illegal: 2 violations (2 stages, 1 microbatch, 1 chunk, 6 tasks)"
    )


def test_weight_task_in_a_program_that_does_not_split_is_unknown():
    program, source = explicit_program(1, 1, 1, {0: "F0.0 B0.0 W0.0"})
    report = check_orders(program)
    (violation,) = report.violations
    assert violation.kind is ViolationKind.UNKNOWN_TASK and violation.tasks == (TaskId.parse("0W0.0"),)
    assert render_report(report, {"test.sched": source}).splitlines()[:3] == [
        "test.sched:3:22: error: stage 0: W0.0 is a weight-gradient task (the weight gradients of microbatch 0, "
        "chunk 0), but the backward is not split; set `split_backward = true` in the pipeline block, or drop the "
        "W tasks",
        "  stage 0: F0.0 B0.0 W0.0",
        "                     ^~~~",
    ]
    assert check_orders((1, 1, 1), orders_from_text("0F0.0 0B0.0 0W0.0")).of_kind(ViolationKind.UNKNOWN_TASK)


def test_weight_task_of_another_stage_or_microbatch_is_unknown():
    report = check_orders((2, 1, 1), orders_from_text("0F0.0 0B0.0 1W0.0 0W1.0", "1F0.0 1B0.0"), split_backward=True)
    assert [violation.message for violation in report.violations] == [
        "1W0.0 is in the order of stage 0 but belongs to stage 1",
        "stage 0: W1.0 names microbatch 1, but the pipeline has 1 microbatch (only 0)",
        "stage 0 never runs W0.0 (the weight gradients of microbatch 0, chunk 0)",
        "stage 1 never runs W0.0 (the weight gradients of microbatch 0, chunk 0)",
    ]


def test_a_deadlock_is_still_found_in_a_split_schedule():
    orders = orders_from_text("0F0.0 0B0.0 0W0.0 0F1.0 0B1.0 0W1.0", "1F0.0 1F1.0 1B0.0 1W0.0 1B1.0 1W1.0")
    report = check_orders((2, 2, 1), orders, split_backward=True)
    (deadlock,) = report.violations
    assert deadlock.kind is ViolationKind.DEADLOCK
    assert [str(link.stuck_task) for link in deadlock.cycle] == ["0B0.0", "1F1.0"]


def test_unit_costs_split_the_backward_in_two_halves():
    model = UnitCostModel((64, 192), split_backward=True)
    assert [model.task_duration(TaskId.parse(name)) for name in ("0F0.1", "0B0.1", "0W0.1")] == [192, 192, 192]
    assert UnitCostModel((64, 192)).task_duration(TaskId.parse("0B0.1")) == 384


def test_split_two_stages_exact_times():
    # forward, backward and weight gradients of the one chunk cost 1 each: stage 1's W runs after its B, stage 0's
    # backward starts as soon as stage 1's B is done instead of after the whole backward
    timeline = simulate(make_program(2, 1, 1, split_backward=True))
    assert compute_intervals(timeline) == {
        "0F0.0": (0.0, 1.0),
        "1F0.0": (1.0, 2.0),
        "1B0.0": (2.0, 3.0),
        "1W0.0": (3.0, 4.0),
        "0B0.0": (3.0, 4.0),
        "0W0.0": (4.0, 5.0),
    }
    assert timeline.makespan == 5.0 < simulate(make_program(2, 1, 1)).makespan == 6.0
    assert all(message.destination.kind is not W for message in timeline.messages)


def test_activations_live_until_the_weight_task():
    # one stage: a W deferred past the next forward keeps two chunks live
    program = make_program(1, 2, 1, order=OrderKind.EXPLICIT, split_backward=True)
    eager = orders_from_text("0F0.0 0B0.0 0W0.0 0F1.0 0B1.0 0W1.0")
    deferred = orders_from_text("0F0.0 0B0.0 0F1.0 0B1.0 0W0.0 0W1.0")
    assert simulate(program, eager).peak_activations == (1.0,)
    assert simulate(program, deferred).peak_activations == (2.0,)


@pytest.mark.parametrize("n_stages", STAGES)
def test_splitting_never_lengthens_the_generated_orders_and_keeps_eq13(n_stages):
    for n_microbatches in MICROBATCHES:
        for n_chunks in CHUNKS:
            dimensions = (n_stages, n_microbatches, n_chunks)
            for order in (OrderKind.GPIPE, OrderKind.ONE_F_ONE_B):
                for extra in EXTRA_WARMUPS if order is OrderKind.ONE_F_ONE_B else (0,):
                    program = make_program(*dimensions, order=order)
                    program = dataclasses.replace(
                        program, pipeline=dataclasses.replace(program.pipeline, extra_warmup=extra)
                    )
                    whole, halves = simulate(program), simulate(split(program))
                    case = (order.value, dimensions, extra, whole.makespan, halves.makespan)
                    assert halves.makespan <= whole.makespan, case
                    assert halves.busy_time == pytest.approx(whole.busy_time, rel=1e-12)
                    if order is OrderKind.ONE_F_ONE_B:
                        expected = stateflow_peak_activations(*dimensions, extra, split_backward=True)
                        assert halves.peak_activations == pytest.approx(expected, abs=1e-12), case
                    else:
                        assert halves.peak_activations == (float(n_microbatches),) * n_stages


def test_splitting_shortens_the_two_stage_four_chunk_pipeline():
    program = make_program(2, 4, 4)
    whole, halves = simulate(program).makespan, simulate(split(program)).makespan
    print(f"P=2 M=4 N=4 1f1b unit makespan: {whole} whole backward, {halves} split backward")
    assert whole == (4 * 4 + 2 - 1) * 3 / 4 == 12.75  # Eq. 15
    assert halves == 12.25


FLOPS_CASES = {
    "gla": dict(layers=(LayerKind.GLA, LayerKind.GLA)),
    "attn-gdn": dict(layers=(LayerKind.ATTN, LayerKind.GDN), boundaries=(0, 512, 1536)),
    "simple_gla-mlp": dict(layers=(LayerKind.SIMPLE_GLA, LayerKind.MLP)),
    "ring": dict(layers=(LayerKind.GLA, LayerKind.GLA), mesh=MeshSpec(pipeline=2, sequence=2)),
    "allscan": dict(
        layers=(LayerKind.GLA, LayerKind.GLA),
        mesh=MeshSpec(pipeline=2, sequence=2),
        parallel=SequenceParallelMethod.ALLSCAN,
        scan_blocks=4,
    ),
}


@pytest.mark.parametrize("cuda_graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("case", sorted(FLOPS_CASES))
def test_flops_split_backward_adds_up_to_the_whole_backward(case, cuda_graphs):
    hardware = Hardware(throughput_flops=1e12, memory_bandwidth_bytes_per_s=1e9, latency_s=1e-5, kernel_gap_s=1e-6)
    program = make_program(2, 1, 2, **FLOPS_CASES[case])
    program = dataclasses.replace(program, pipeline=dataclasses.replace(program.pipeline, cuda_graphs=cuda_graphs))
    whole, halves = FlopsCostModel(program, hardware), FlopsCostModel(split(program), hardware)
    for stage in range(2):
        for chunk in range(2):
            forward, backward, weight = (TaskId(kind, stage, 0, chunk) for kind in (F, B, W))
            assert halves.task_duration(forward) == whole.task_duration(forward)
            total = whole.task_duration(forward) + whole.task_duration(backward)
            split_total = sum(halves.task_duration(task) for task in (forward, backward, weight))
            assert split_total == pytest.approx(total, rel=1e-12, abs=0)
            assert halves.task_duration(weight) > 0 and halves.task_duration(backward) > 0


@pytest.mark.parametrize("cuda_graphs", [False, True], ids=["eager", "graphs"])
def test_flops_weight_task_is_the_linear_layers_weight_gradients(cuda_graphs):
    """Last stage of a GLA + SwiGLU model: q, k, v, o and the forget gate, two MLP projections (gate-and-up fused, down) and the head, each
    ``dW = dY^T X`` as many FLOPs as its forward, one launch each, and (eager) their ``.grad`` additions."""
    gap = 1e-6
    hardware = Hardware(throughput_flops=1e12, memory_bandwidth_bytes_per_s=1e9, kernel_gap_s=gap)
    program = split(make_program(2, 1, 2))
    program = dataclasses.replace(program, pipeline=dataclasses.replace(program.pipeline, cuda_graphs=cuda_graphs))
    model = FlopsCostModel(program, hardware)
    d, width, hidden, vocab, tokens = 128, 2 * 64, 4 * 128, 256, 64
    flops_per_token = 8 * d * width + 2 * d * width + 6 * d * hidden + 2 * d * vocab
    assert linear_layers(program.model, program.stage_layers[1], is_last=True) == 5 + 2 + 1
    accumulation = 0.0 if cuda_graphs else 3 * stage_parameters(program, 1).linear_weights * 4 / 1e9
    assert model.task_duration(TaskId.parse("1W0.1")) == pytest.approx(
        flops_per_token * tokens / 1e12 + 8 * gap + accumulation, rel=1e-12
    )


def test_flops_split_shortens_the_simulated_step():
    hardware = Hardware(throughput_flops=1e12)
    program = make_program(4, 4, 4)
    whole = simulate(program, cost_model=FlopsCostModel(program, hardware)).makespan
    halves = simulate(split(program), cost_model=FlopsCostModel(split(program), hardware)).makespan
    assert halves < whole


def test_forward_before_weight_moves_each_undeferred_w_after_the_next_forward():
    """[Note: forward before weight gradients]: stage 1 runs B(j) F(k) W(j); stage 0 (which receives no
    activations) and the W tasks deferred to the end stay where they were."""
    plain = one_f_one_b_orders(2, 4, 2, 1, split_backward=True)
    late = one_f_one_b_orders(2, 4, 2, 1, split_backward=True, forward_before_weight=True)
    assert late[0] == plain[0]
    assert " ".join(str(task) for task in plain[1]).startswith("1F0.0 1F0.1 1B0.1 1W0.1 1F1.0")
    assert " ".join(str(task) for task in late[1]) == (
        "1F0.0 1F0.1 1B0.1 1F1.0 1W0.1 1B0.0 1F1.1 1W0.0 1B1.1 1F2.0 1W1.1 1B1.0 1F2.1 1W1.0 "
        "1B2.1 1F3.0 1B2.0 1F3.1 1B3.1 1B3.0 1W2.1 1W2.0 1W3.1 1W3.0"
    )
    assert sorted(map(str, late[1])) == sorted(map(str, plain[1]))


def test_forward_before_weight_keeps_the_chunks_in_flight():
    from schedlang.lowering.placement import place_stage_actions
    from schedlang.runtime.graphs import slots_needed

    for dimensions in itertools.product(range(2, 6), (1, 2, 3, 4, 6), (1, 2, 3, 4, 8), range(0, 4)):
        plain = place_stage_actions(one_f_one_b_orders(*dimensions, split_backward=True))
        late = place_stage_actions(one_f_one_b_orders(*dimensions, split_backward=True, forward_before_weight=True))
        assert [slots_needed(stage) for stage in late] == [slots_needed(stage) for stage in plain], dimensions


def test_a_program_with_forward_before_weight_gets_the_moved_orders():
    program = split(make_program(2, 4, 2))
    program = dataclasses.replace(
        program, pipeline=dataclasses.replace(program.pipeline, forward_before_weight=True, extra_warmup=1)
    )
    assert stage_orders(program) == one_f_one_b_orders(2, 4, 2, 1, True, True)
    assert check_orders(program).is_legal


@pytest.mark.parametrize("n_stages", (2, 3, 4))
def test_extra_deferred_weights_hold_more_chunks_as_eq13_says(n_stages):
    """``extra_deferred_weights = d``: stage r > 0 defers its last w_{r-1} + d W tasks (all, if fewer), holds
    min(MN, w_{r-1} + d) chunks (the simulator, the closed form and the runtime's graph slots agree), and the
    orders stay legal and deadlock free, with and without forward_before_weight."""
    from schedlang.lowering.placement import place_stage_actions
    from schedlang.runtime.graphs import slots_needed

    for n_microbatches, n_chunks, extra, deferred, late in itertools.product(
        (1, 2, 4), (1, 2, 3), (0, 1, 2), (0, 1, 2, 5), (False, True)
    ):
        dimensions = (n_stages, n_microbatches, n_chunks)
        orders = one_f_one_b_orders(*dimensions, extra, True, late, deferred)
        report = check_orders(dimensions, orders, split_backward=True)
        assert report.is_legal, (dimensions, extra, deferred, late, report.violations[:2])
        units = n_microbatches * n_chunks
        expected = stateflow_peak_activations(*dimensions, extra, True, deferred)
        placed = place_stage_actions(orders)
        for stage, actions in enumerate(placed):
            assert slots_needed(actions) == round(expected[stage] * n_chunks), (dimensions, extra, deferred, stage)
            if stage > 0:
                last_backward = max(index for index, task in enumerate(orders[stage]) if task.kind is B)
                at_the_end = [task for task in orders[stage][last_backward:] if task.kind is W]
                upstream_warmup = one_f_one_b_warmup(*dimensions, stage - 1, extra)
                assert len(at_the_end) == min(units, upstream_warmup + deferred), (dimensions, extra, deferred)
        program = split(make_program(*dimensions))
        program = dataclasses.replace(
            program,
            pipeline=dataclasses.replace(
                program.pipeline, extra_warmup=extra, forward_before_weight=late, extra_deferred_weights=deferred
            ),
        )
        assert simulate(program).peak_activations == pytest.approx(expected, abs=1e-12)


def test_extra_deferred_weights_must_not_be_negative():
    with pytest.raises(ValueError, match="extra_deferred_weights must be at least 0"):
        one_f_one_b_orders(2, 2, 2, 0, True, False, -1)
