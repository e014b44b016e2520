"""lowering.partition.recut: the schedule's own partition at another chunk count (schedlang simulate --chunks)."""

import dataclasses

import pytest

from lowering_programs import make_program
from schedlang.lowering.partition import model_balanced_boundaries, recut, uniform_boundaries
from schedlang.lowering.program import MeshSpec
from schedlang.vocabulary import LayerKind, OrderKind, PartitionKind


def test_recut_keeps_a_uniform_partition_uniform_and_everything_else():
    program = make_program(2, 3, 2, boundaries=(0, 512, 1024))
    variant = recut(program, 8)
    assert variant.sequence.boundaries == uniform_boundaries(1024, 8, 64)
    assert dataclasses.replace(variant, sequence=program.sequence) == program


def test_recut_cuts_in_whole_kernel_chunks_of_every_sequence_rank():
    program = make_program(1, 1, 2, boundaries=(0, 512, 1024), mesh=MeshSpec(sequence=2))
    assert recut(program, 4).sequence.boundaries == uniform_boundaries(1024, 4, 128)
    with pytest.raises(ValueError, match="at most 8 chunks fit"):
        recut(program, 9)


def test_recut_keeps_a_balanced_partition_balanced_with_its_alpha():
    layers = (LayerKind.GLA, LayerKind.ATTN)
    program = make_program(1, 1, 2, layers=layers, boundaries=(0, 2048, 4096))
    program = dataclasses.replace(
        program, sequence=dataclasses.replace(program.sequence, partition=PartitionKind.BALANCED, balance_alpha=0.5)
    )
    expected = model_balanced_boundaries(program.model, 4096, 4, 0.5, 64)
    assert recut(program, 4).sequence.boundaries == expected != uniform_boundaries(4096, 4, 64)


def test_recut_refuses_schedules_written_for_one_chunk_count():
    program = make_program(1, 1, 2)
    explicit_cut = dataclasses.replace(program, sequence=dataclasses.replace(program.sequence, partition=PartitionKind.EXPLICIT))
    with pytest.raises(ValueError, match="explicit chunk boundaries"):
        recut(explicit_cut, 4)
    explicit_order = dataclasses.replace(program, pipeline=dataclasses.replace(program.pipeline, order=OrderKind.EXPLICIT))
    with pytest.raises(ValueError, match="explicit order"):
        recut(explicit_order, 4)
