"""The step's gradient all-reduce in the simulator: after each stage's last task, over its sequence group, then
its data group (``Trainer.reduce_gradients``), on the profile's link classes or the inter-node link."""

from __future__ import annotations

import pytest

from schedlang.lowering.cost import CostModelKind, Hardware, make_cost_model, ring_allreduce_seconds
from schedlang.lowering.hardware_profile import parse_hardware_profile
from schedlang.lowering.memory_terms import reduced_gradient_bytes
from schedlang.lowering.profile_cost import ProfileCostModel
from schedlang.lowering.simulate import simulate
from schedlang.lowering.timeline import Stream

from tests.lowering.test_hardware_profile import profile_text, program_of


def test_ring_allreduce_is_two_passes_of_a_pth_of_the_bytes():
    hardware = Hardware(latency_s=1e-5, bandwidth_bytes_per_s=1e9)
    assert ring_allreduce_seconds(1, 1e9, hardware) == 0.0
    assert ring_allreduce_seconds(4, 4e6, hardware) == pytest.approx(6 * (1e-5 + 1e6 / 1e9))


@pytest.mark.parametrize("mesh, groups", [("data = 4", (4,)), ("sequence = 2 data = 3", (2, 3))])
def test_flops_model_adds_each_groups_allreduce_to_the_step(mesh, groups):
    plain, replicated = program_of(), program_of(mesh=mesh)
    hardware = Hardware(latency_s=1e-5, bandwidth_bytes_per_s=1e8)
    alone = simulate(plain, cost_model=make_cost_model(CostModelKind.FLOPS, plain, hardware))
    reduced = simulate(replicated, cost_model=make_cost_model(CostModelKind.FLOPS, replicated, hardware))
    per_stage = [
        sum(ring_allreduce_seconds(size, reduced_gradient_bytes(replicated, stage), hardware) for size in groups)
        for stage in range(replicated.n_stages)
    ]
    assert reduced.gradient_reductions == pytest.approx(per_stage) and min(per_stage) > 0
    assert alone.gradient_reductions == (0.0, 0.0)
    # the step ends with the last stage to finish its tasks and then its all-reduce
    ends = [max(t.end for t in reduced.tasks if t.task.stage == stage and t.stream is Stream.COMPUTE)
            for stage in range(replicated.n_stages)]
    assert reduced.makespan == pytest.approx(max(end + r for end, r in zip(ends, per_stage)))
    assert reduced.makespan > max(ends)


def test_unit_model_has_no_reduction():
    program = program_of(mesh="data = 4")
    assert simulate(program).gradient_reductions == (0, 0)


def test_profile_model_reduces_on_the_inter_node_link_once_the_group_spans_nodes():
    program = program_of(mesh="data = 4")  # 2 stages x 4 replicas: each stage's data group is 4 adjacent ranks
    one_node = ProfileCostModel(program, parse_hardware_profile(profile_text(gpus_per_node=8)))
    split = ProfileCostModel(program, parse_hardware_profile(profile_text(gpus_per_node=2, nodes=4)))
    n_bytes = reduced_gradient_bytes(program, 0)
    # a reduce-scatter and an all-gather of n/4 from each of 4 ranks: 2 latencies and 3 contributions each
    expected = 2 * (2 * 1e-6 + 3 * (n_bytes / 4) / 1e11)
    assert one_node.gradient_reduction_duration(0) == pytest.approx(expected)
    assert split.gradient_reduction_duration(0) == pytest.approx(2 * (2 * 1e-5 + 3 * (n_bytes / 4) / 1e9))
    assert ProfileCostModel(program_of(), parse_hardware_profile(profile_text())).gradient_reduction_duration(0) == 0


def test_simulate_prints_each_stages_all_reduce(capsys):
    import json

    from schedlang.cli import main

    assert main(["simulate", "examples/sequence_parallel.sched", "--cost-model", "flops", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert len(result["gradient_reduction"]) == result["n_stages"] and min(result["gradient_reduction"]) > 0
    assert main(["simulate", "examples/sequence_parallel.sched", "--cost-model", "flops"]) == 0
    assert "gradient all-reduce" in capsys.readouterr().out
    assert main(["simulate", "examples/sequence_parallel.sched", "--cost-model", "unit", "--json"]) == 0
    assert not any(json.loads(capsys.readouterr().out)["gradient_reduction"])
