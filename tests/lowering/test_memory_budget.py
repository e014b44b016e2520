"""Pinned host memory of offload (lowering/memory_peak.py's ``pinned_host``) and the one rule of what fits
(lowering/memory_budget.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedlang.compiler import Pass, compile_schedule, revise
from schedlang.frontend import load_program_text
from schedlang.lowering.hardware_profile import (
    DEFAULT_HOST_MEMORY_BYTES,
    DEFAULT_PINNED_FRACTION,
    HostMemory,
    resolve_hardware,
)
from schedlang.lowering.memory_budget import (
    OFFLOADED_ACTIVATIONS,
    OUTSIDE_THE_ALLOCATOR,
    MemoryBudget,
    MemoryPlace,
)
from schedlang.lowering.memory_peak import predict_memory
from schedlang.lowering.memory_terms import chunk_activation_bytes
from schedlang.lowering.cost import Hardware

GIB = 2**30
ROOT = Path(__file__).resolve().parents[2]
ONE_DEVICE = ROOT / "benchmarks" / "schedules" / "gla_1b_one_device.sched"


def one_device_at(length: int, chunks: int, **changes):
    program = compile_schedule(str(ONE_DEVICE), through=Pass.CHECK).program
    return revise(program, length=length, chunks=chunks, **changes)


def small(pipeline: str = "", stages: int = 2, mesh: str = "", microbatches: int = 2) -> str:
    return f"""\
schedule host
model {{ vocab = 256  d_model = 64  layers = [gla] * 4  heads = 2  head_dim = 32  mlp = swiglu(ratio = 4) }}
mesh {{ pipeline = {stages} {mesh} }}
sequence {{ length = 1024  chunks = 4  kernel_chunk = 64 }}
pipeline {{ microbatches = {microbatches}  order = 1f1b  {pipeline} }}
"""


def test_the_256k_offload_candidate_pins_more_than_the_h200_machine_has():
    """The candidate tune ranked on the H200 (8 chunks, recompute = mlp, offload): every chunk of the one
    microbatch but the last (its backward runs right after its forward, so it stays on the device) waits on the
    host at once, 143 GiB, over the machine's 128 GiB and so over the h200 profile's pinned share; on a 1 TB
    host it fits."""
    program = one_device_at(262144, 8, offload=True, recompute="mlp")
    (stage,) = predict_memory(program)
    chunks = sum(chunk_activation_bytes(program, 0, chunk) for chunk in range(7))
    assert stage.pinned_host == pytest.approx(chunks)
    assert stage.pinned_host > 128 * GIB
    h200 = resolve_hardware("h200")
    assert h200.host == HostMemory(128 * GIB, DEFAULT_PINNED_FRACTION)
    budget = MemoryBudget.of(140 * GIB, None, h200)
    (misfit,) = budget.misfits(program, (stage,))
    assert misfit.place is MemoryPlace.HOST and misfit.node == 0 and misfit.stage.stage == 0
    assert misfit.term == OFFLOADED_ACTIVATIONS and misfit.needed == stage.pinned_host
    assert misfit.limit == 0.75 * 128 * GIB
    described = misfit.describe()
    assert "needs 142.62 GiB of pinned host memory on node 0, over the 96.00 GiB" in described
    assert "offloaded activations of stage 0" in described
    assert MemoryBudget.of(140 * GIB, 10**12, h200).fits(program, (stage,))


def test_without_offload_nothing_is_pinned():
    program = one_device_at(262144, 8, recompute="full")
    assert predict_memory(program)[0].pinned_host == 0.0
    assert MemoryBudget.of(140 * GIB, 1, None).fits(program, predict_memory(program))


def test_a_stage_pins_its_chunks_from_forward_to_backward_and_releases_at_b_not_w():
    """1F1B on two stages: stage r holds N + P - r - 1 chunks in flight at most, each pinned until its B; a split
    backward moves the device's release to W, but the host copies go at the end of B all the same."""
    program = load_program_text(small("offload = true  recompute = mlp"), "host.sched")
    memory = predict_memory(program)
    one_chunk = chunk_activation_bytes(program, 0, 0)
    assert memory[0].pinned_host == pytest.approx(5 * one_chunk)  # N + P - 1 = 4 + 2 - 1
    assert memory[1].pinned_host == pytest.approx(4 * chunk_activation_bytes(program, 1, 0))
    split = load_program_text(small("offload = true  recompute = mlp  split_backward = true"), "split.sched")
    assert [stage.pinned_host for stage in predict_memory(split)] == [stage.pinned_host for stage in memory]


def test_ranks_of_a_node_add_up():
    """Ranks are pipeline x sequence x data, row-major, filling nodes of gpus_per_node in rank order."""
    program = load_program_text(small("offload = true  recompute = mlp", mesh="data = 2", microbatches=1),
                                "host.sched")
    memory = predict_memory(program)
    first, second = (stage.pinned_host for stage in memory)
    assert first > 0 and second > 0
    by_gpu = MemoryBudget(140 * GIB, HostMemory(), gpus_per_node=1)
    assert by_gpu.node_stages(program) == [[0], [0], [1], [1]]
    assert by_gpu.node_pinned_bytes(program, memory) == (first, first, second, second)
    assert MemoryBudget(140 * GIB, HostMemory(), gpus_per_node=2).node_pinned_bytes(program, memory) == (
        2 * first, 2 * second,
    )
    whole = MemoryBudget(140 * GIB, HostMemory(), gpus_per_node=8)
    assert whole.node_pinned_bytes(program, memory) == (2 * first + 2 * second,)
    # a host that holds each rank's copies alone, but not the node's four together
    tight = MemoryBudget(140 * GIB, HostMemory(int(2.5 * first / DEFAULT_PINNED_FRACTION)), gpus_per_node=8)
    assert tight.stage_fits_host(first) and tight.stage_fits_host(second)
    (misfit,) = tight.misfits(program, memory)
    assert misfit.node == 0 and misfit.needed == 2 * first + 2 * second
    assert misfit.stage.stage == (0 if first >= second else 1)


def test_the_budget_of_a_command_takes_the_profile_or_the_defaults():
    plain = MemoryBudget.of(80 * GIB, None, Hardware())
    assert plain == MemoryBudget(80 * GIB, HostMemory(DEFAULT_HOST_MEMORY_BYTES, DEFAULT_PINNED_FRACTION), 1)
    assert DEFAULT_HOST_MEMORY_BYTES == 128 * GIB
    h200 = resolve_hardware("h200")
    assert MemoryBudget.of(80 * GIB, None, h200).gpus_per_node == h200.topology.gpus_per_node
    given = MemoryBudget.of(80 * GIB, 512 * GIB, h200)
    assert given.host == HostMemory(512 * GIB, h200.host.pinned_fraction)
    for paper in ("zeco-h100", "stateflow-a100"):  # the papers state no host memory: the default
        assert resolve_hardware(paper).host is None
        assert MemoryBudget.of(80 * GIB, None, resolve_hardware(paper)).host == HostMemory()


def test_device_misfits_name_the_stage_and_its_largest_term_worst_first():
    program = load_program_text(small(), "host.sched")
    memory = predict_memory(program)
    budget = MemoryBudget(OUTSIDE_THE_ALLOCATOR + min(stage.reserved for stage in memory) / 2)
    misfits = budget.misfits(program, memory)
    assert [misfit.place for misfit in misfits] == [MemoryPlace.DEVICE] * 2
    assert misfits[0].overshoot >= misfits[1].overshoot
    for misfit in misfits:
        components = misfit.stage.components
        assert misfit.term == max(components, key=components.get).value
        assert f"on stage {misfit.stage.stage}" in misfit.describe() and "whose largest term is" in misfit.describe()
    assert budget.stage_fits(budget.device_bytes - OUTSIDE_THE_ALLOCATOR)
    assert not budget.stage_fits(budget.device_bytes)


def test_a_device_smaller_than_the_memory_outside_the_allocator_is_named_as_such():
    """A device that cannot hold even the CUDA context: the message says so, not a stage's small largest term."""
    program = load_program_text(small(), "host.sched")
    memory = predict_memory(program)
    for device_bytes in (1024, OUTSIDE_THE_ALLOCATOR):
        misfits = MemoryBudget(device_bytes).misfits(program, memory)
        assert misfits and all(misfit.place is MemoryPlace.DEVICE for misfit in misfits)
        text = misfits[0].describe()
        assert "do not hold even the 1.5 GiB a process uses outside the allocator" in text
        assert "largest term" not in text and f"on stage {misfits[0].stage.stage}" in text
    roomy = MemoryBudget(OUTSIDE_THE_ALLOCATOR + min(stage.reserved for stage in memory) / 2)
    assert all("largest term" in misfit.describe() for misfit in roomy.misfits(program, memory))


def test_the_host_memory_flag_names_the_defaults_it_falls_back_to():
    from schedlang.commands.simulate_fit import HOST_MEMORY_HELP, parse_size

    assert parse_size("128GiB") == DEFAULT_HOST_MEMORY_BYTES and "else 128GiB" in HOST_MEMORY_HELP
    assert f"else {DEFAULT_PINNED_FRACTION:.0%}%" in HOST_MEMORY_HELP  # argparse's %% prints one
