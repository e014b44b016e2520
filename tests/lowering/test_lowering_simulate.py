"""The simulator: exact unit-cost timelines for tiny cases, activation lifetimes, the FLOPs model."""

from __future__ import annotations

import dataclasses

import pytest

from lowering_programs import make_program
from schedlang.lowering.cost import (
    CostModelKind,
    FlopsCostModel,
    Hardware,
    UnitCostModel,
    attention_pair_flops,
    make_cost_model,
)
from schedlang.lowering.legality import IllegalScheduleError
from schedlang.lowering.parameters import stage_parameters
from schedlang.lowering.program import MeshSpec
from schedlang.lowering.simulate import simulate
from schedlang.lowering.timeline import Stream
from schedlang.vocabulary import CudaGraphs, LayerKind, SequenceParallelMethod
from schedlang.vocabulary.actions import TaskId
from schedlang.vocabulary.edges import Payload


def compute_intervals(timeline):
    return {
        str(interval.task): (interval.start, interval.end)
        for interval in timeline.tasks
        if interval.stream is Stream.COMPUTE
    }


def test_unequal_chunks_two_stages_exact_times():
    # chunks of 1/4 and 3/4 of the sequence; one microbatch; forward s/T, backward 2 s/T
    program = make_program(2, 1, 2, boundaries=(0, 64, 256))
    timeline = simulate(program)
    assert compute_intervals(timeline) == {
        "0F0.0": (0.0, 0.25),
        "0F0.1": (0.25, 1.0),
        "1F0.0": (0.25, 0.5),
        "1F0.1": (1.0, 1.75),
        "1B0.1": (1.75, 3.25),
        "1B0.0": (3.25, 3.75),
        "0B0.1": (3.25, 4.75),
        "0B0.0": (4.75, 5.25),
    }
    assert timeline.makespan == 5.25
    assert timeline.peak_activations == (1.0, 1.0)
    assert timeline.bubble_fraction == pytest.approx(1 - 6 / (2 * 5.25))


def test_activation_released_at_the_instant_another_is_allocated_does_not_overlap():
    # one stage, 1f1b with one chunk: F0 [0,1) B0 [1,3) F1 [3,4) B1 [4,6): never two microbatches live
    timeline = simulate(make_program(1, 2, 1))
    assert compute_intervals(timeline)["0F1.0"] == (3.0, 4.0)
    assert timeline.peak_activations == (1.0,)


def test_messages_follow_the_data_carrying_edges():
    timeline = simulate(make_program(2, 1, 2))
    kinds = sorted((m.kind.value, str(m.source), str(m.destination)) for m in timeline.messages)
    assert kinds == [
        ("activation", "0F0.0", "1F0.0"),
        ("activation", "0F0.1", "1F0.1"),
        ("activation_gradient", "1B0.0", "0B0.0"),
        ("activation_gradient", "1B0.1", "0B0.1"),
        ("state", "0F0.0", "0F0.1"),
        ("state", "1F0.0", "1F0.1"),
        ("state_gradient", "0B0.1", "0B0.0"),
        ("state_gradient", "1B0.1", "1B0.0"),
    ]
    assert all(m.start == m.end for m in timeline.messages)  # unit cost: communication is free
    assert all(interval.stream is Stream.COMPUTE for interval in timeline.tasks)


def test_illegal_orders_are_refused_with_the_report():
    program = make_program(1, 1, 1)
    with pytest.raises(IllegalScheduleError) as raised:
        simulate(program, [[TaskId.parse("0B0.0"), TaskId.parse("0F0.0")]])
    assert "before" in str(raised.value)


def test_unit_model_durations_are_integer_tokens():
    model = UnitCostModel((64, 192))
    assert model.time_divisor == 256
    assert model.task_duration(TaskId.parse("3F0.1")) == 192
    assert model.task_duration(TaskId.parse("3B0.0")) == 128


def test_flops_model_backward_is_twice_forward_and_attention_grows_with_prefix():
    layers = (LayerKind.GLA, LayerKind.ATTN)
    program = make_program(1, 1, 4, layers=layers, boundaries=(0, 1024, 2048, 3072, 4096))
    model = FlopsCostModel(program, Hardware(throughput_flops=1e12))
    forwards = [model.task_duration(TaskId.parse(f"0F0.{chunk}")) for chunk in range(4)]
    accumulation = model.accumulation_seconds[0]
    assert model.task_duration(TaskId.parse("0B0.2")) == pytest.approx(2 * forwards[2] + accumulation)
    # equal chunks differ only by the attention prefix term c_i s_i
    pair_seconds = attention_pair_flops(2, 64) * 1024 * 1024 / 1e12
    for chunk in range(1, 4):
        assert forwards[chunk] - forwards[chunk - 1] == pytest.approx(pair_seconds)


def test_flops_model_messages_use_alpha_beta_between_stages_only():
    program = make_program(2, 1, 2, boundaries=(0, 512, 1024))
    hardware = Hardware(throughput_flops=1e12, latency_s=1e-5, bandwidth_bytes_per_s=1e9)
    model = make_cost_model(CostModelKind.FLOPS, program, hardware)
    source, destination = TaskId.parse("0F0.0"), TaskId.parse("1F0.0")
    activation_bytes = 512 * 128 * 4  # tokens x d_model x fp32
    assert model.message_bytes(Payload.ACTIVATION, source, destination) == activation_bytes
    assert model.message_duration(Payload.ACTIVATION, source, destination) == pytest.approx(
        1e-5 + activation_bytes / 1e9
    )
    state = (TaskId.parse("0F0.0"), TaskId.parse("0F0.1"))
    assert model.message_bytes(Payload.STATE, *state) == 2 * 64 * 64 * 4  # heads x Dk x Dv x fp32, 1 layer
    assert model.message_duration(Payload.STATE, *state) == 0.0
    timeline = simulate(program, cost_model=model)
    sends = [interval for interval in timeline.tasks if interval.stream is Stream.SEND]
    receives = [interval for interval in timeline.tasks if interval.stream is Stream.RECV]
    assert len(sends) == len(receives) == 4  # two activations down, two gradients up
    starts = compute_intervals(timeline)
    assert starts["1F0.0"][0] == pytest.approx(starts["0F0.0"][1] + 1e-5 + activation_bytes / 1e9)


STATE_BYTES = 2 * 64 * 64 * 4  # heads x Dk x Dv x fp32
DECAY_BYTES = 2 * 64 * 4  # heads x Dk x fp32: the transition the all-gather sends with a gla state


@pytest.mark.parametrize(
    ("method", "exchange_seconds"),
    [
        (SequenceParallelMethod.RING, 3 * (1e-3 + STATE_BYTES / 1e9)),  # S - 1 hops in sequence
        (SequenceParallelMethod.ALLGATHER, 2 * 1e-3 + 3 * (STATE_BYTES + DECAY_BYTES) / 1e9),  # log2 S, S - 1
        # S - 3 + K block steps through the middle ranks, then the whole state into the last rank
        (SequenceParallelMethod.ALLSCAN, (1 + 4) * (1e-3 + STATE_BYTES / 4 / 1e9) + (1e-3 + STATE_BYTES / 1e9)),
    ],
)
def test_flops_model_sequence_parallel_splits_compute_and_adds_state_exchange(method, exchange_seconds):
    single = make_program(1, 1, 1, boundaries=(0, 4096))
    split = make_program(1, 1, 1, boundaries=(0, 4096), mesh=MeshSpec(sequence=4), parallel=method, scan_blocks=4)
    hardware = Hardware(throughput_flops=1e12, latency_s=1e-3, bandwidth_bytes_per_s=1e9)
    task = TaskId.parse("0F0.0")
    one = FlopsCostModel(single, hardware).task_duration(task)
    four = FlopsCostModel(split, hardware).task_duration(task)
    assert four == pytest.approx(one / 4 + exchange_seconds)


def test_unit_cost_model_via_kind_matches_eq14_on_a_bigger_case():
    timeline = simulate(make_program(4, 8, 1), cost_model=CostModelKind.UNIT)
    assert timeline.makespan == (8 + 4 - 1) * 3
    assert timeline.peak_activations == (4.0, 3.0, 2.0, 1.0)


def test_every_backward_pays_for_adding_the_stage_gradients_and_graph_stages_only_for_non_linear_ones():
    """3 passes over the stage's parameters at memory bandwidth per backward, whatever the chunk's length, so
    more chunks cost more; CUDA-graph stages add the linear weights' gradients inside their GEMMs."""
    hardware = Hardware(throughput_flops=1e12, memory_bandwidth_bytes_per_s=1e9)
    program = make_program(2, 1, 4)
    count = stage_parameters(program, 1)
    model = FlopsCostModel(program, hardware)
    assert model.accumulation_seconds[1] == pytest.approx(3 * count.total * 4 / 1e9)  # fp32
    backward = model.task_duration(TaskId.parse("1B0.0"))
    assert backward == pytest.approx(2 * model.task_duration(TaskId.parse("1F0.0")) + model.accumulation_seconds[1])
    one_chunk = FlopsCostModel(make_program(2, 1, 1, boundaries=(0, 256)), hardware)
    four_backwards = sum(model.task_duration(TaskId.parse(f"1B0.{chunk}")) for chunk in range(4))
    assert four_backwards == pytest.approx(one_chunk.task_duration(TaskId.parse("1B0.0")) + 3 * model.accumulation_seconds[1])
    for mode in (CudaGraphs.CHUNK_SLOTS, CudaGraphs.STEP):  # both add linear weight gradients inside the GEMMs
        graphs = dataclasses.replace(program, pipeline=dataclasses.replace(program.pipeline, cuda_graphs=mode))
        assert FlopsCostModel(graphs, hardware).accumulation_seconds[1] == pytest.approx(3 * count.other * 4 / 1e9)
    assert 0 < count.other < count.linear_weights


def test_kernel_gap_charges_every_task_its_launches_so_small_chunks_cost_more():
    """--kernel-gap: a chunk's forward pays (kernels it launches) x gap, its backward twice that, whatever its
    length; the launches follow the layers (a block = mixer + MLP, an mlp layer only its part)."""
    from schedlang.lowering.cost import (
        KERNELS_PER_MIXER_FORWARD,
        KERNELS_PER_MLP_FORWARD,
        KERNELS_PER_STAGE_END_FORWARD,
        kernel_launches,
    )

    gap = 1e-3
    plain, gapped = Hardware(throughput_flops=1e12), Hardware(throughput_flops=1e12, kernel_gap_s=gap)
    program = make_program(2, 1, 4)  # one gla block per stage, each with its MLP
    launches = KERNELS_PER_MIXER_FORWARD + KERNELS_PER_MLP_FORWARD + KERNELS_PER_STAGE_END_FORWARD
    assert kernel_launches(program.model, program.stage_layers[0], True, False) == launches
    for name, factor in (("0F0.1", 1), ("0B0.1", 2)):
        task = TaskId.parse(name)
        extra = FlopsCostModel(program, gapped).task_duration(task) - FlopsCostModel(program, plain).task_duration(task)
        assert extra == pytest.approx(factor * launches * gap)
    split = make_program(2, 1, 1, layers=(LayerKind.GLA, LayerKind.MLP))
    assert kernel_launches(split.model, (0,), True, False) == KERNELS_PER_MIXER_FORWARD + KERNELS_PER_STAGE_END_FORWARD
    assert kernel_launches(split.model, (1,), False, True) == KERNELS_PER_MLP_FORWARD + KERNELS_PER_STAGE_END_FORWARD
    makespans = []
    for n_chunks in (1, 4, 64):
        chunked = make_program(2, 2, n_chunks, boundaries=tuple(range(0, 1025, 1024 // n_chunks)))
        cost = FlopsCostModel(chunked, Hardware(throughput_flops=1e9, kernel_gap_s=1e-4))
        makespans.append(simulate(chunked, cost_model=cost).makespan)
    assert makespans[1] < makespans[0] and makespans[2] > makespans[1]  # the gap makes 64 chunks worse than 4
