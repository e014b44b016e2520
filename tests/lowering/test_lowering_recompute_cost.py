"""[Note: recompute costs]: a backward under ``recompute`` pays for the forward parts it reruns."""

from __future__ import annotations

import dataclasses

import pytest

from lowering_programs import make_program
from schedlang.lowering.cost import FlopsCostModel, Hardware
from schedlang.lowering.program import MeshSpec
from schedlang.lowering.simulate import simulate
from schedlang.vocabulary import LayerKind, Recompute
from schedlang.vocabulary.actions import ActionKind, TaskId

HYBRID = (LayerKind.GLA, LayerKind.ATTN, LayerKind.GDN, LayerKind.GLA)
HARDWARE = Hardware(kernel_gap_s=2e-6)


def program_with(recompute: Recompute, split_backward: bool = False, sequence: int = 1):
    program = make_program(
        2, 4, 3, layers=HYBRID, split_backward=split_backward, mesh=MeshSpec(pipeline=2, sequence=sequence)
    )
    return dataclasses.replace(program, pipeline=dataclasses.replace(program.pipeline, recompute=recompute))


def durations(recompute: Recompute, kind: ActionKind, **options) -> list[float]:
    model = FlopsCostModel(program_with(recompute, **options), HARDWARE)
    return [model.task_duration(TaskId(kind, stage, 0, chunk)) for stage in range(2) for chunk in range(3)]


@pytest.mark.parametrize("sequence", [1, 2])
def test_each_mode_adds_its_rerun_part_to_the_backward_and_nothing_to_the_forward(sequence):
    parts = FlopsCostModel(program_with(Recompute.NONE, sequence=sequence), HARDWARE).forward_parts
    rerun = {
        Recompute.NONE: [0.0] * 6,
        Recompute.MLP: [chunk.mlps for stage in parts for chunk in stage],
        Recompute.MIXER: [chunk.mixers + chunk.sequence_parallel for stage in parts for chunk in stage],
        Recompute.FULL: [chunk.total for stage in parts for chunk in stage],
    }
    kept = durations(Recompute.NONE, ActionKind.BACKWARD, sequence=sequence)
    forwards = durations(Recompute.NONE, ActionKind.FORWARD, sequence=sequence)
    for mode, extra in rerun.items():
        assert durations(mode, ActionKind.FORWARD, sequence=sequence) == forwards
        expected = [k + e for k, e in zip(kept, extra)]
        assert durations(mode, ActionKind.BACKWARD, sequence=sequence) == pytest.approx(expected, rel=1e-12)
    for mlp, mixer, full in zip(rerun[Recompute.MLP], rerun[Recompute.MIXER], rerun[Recompute.FULL]):
        assert 0 < mlp < full and 0 < mixer < full
    if sequence > 1:
        assert all(chunk.sequence_parallel > 0 for stage in parts for chunk in stage)


def test_a_split_backward_puts_the_rerun_in_b_and_leaves_w_alone():
    def extra(mode, split_backward):
        kept = durations(Recompute.NONE, ActionKind.BACKWARD, split_backward=split_backward)
        return [b - a for a, b in zip(kept, durations(mode, ActionKind.BACKWARD, split_backward=split_backward))]

    weights = durations(Recompute.NONE, ActionKind.WEIGHT, split_backward=True)
    for mode in (Recompute.MLP, Recompute.FULL):
        assert durations(mode, ActionKind.WEIGHT, split_backward=True) == weights
        assert extra(mode, True) == pytest.approx(extra(mode, False), rel=1e-12)


def test_the_simulated_step_is_longer_the_more_a_backward_reruns():
    makespans = {
        mode: simulate(program_with(mode), cost_model=FlopsCostModel(program_with(mode), HARDWARE)).makespan
        for mode in (Recompute.NONE, Recompute.MLP, Recompute.FULL)
    }
    assert makespans[Recompute.NONE] < makespans[Recompute.MLP] < makespans[Recompute.FULL]
