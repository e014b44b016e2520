"""Our own 2-GPU run predicted with the H200 profile: the PP2 job of docs/benchmarks.md's "Where the W tasks go"
(2 H200s, the split-MLP 1B GLA, 4 microbatches of 32K, bf16; torch's Schedule1F1B in the same job).

The H200 profile is measured by `schedlang profile` on one H200 (lowering/profiles/h200.toml): its compute
curves time each part alone, not these PP2 jobs, so these tests hold the compute level and the schedule's part of
the model (fill, drain, chunk lengths, W placement, graph gaps) together.
"""

from __future__ import annotations

import pytest

from schedlang.compiler import CostSettings, Pass, ScheduleText, compile_schedule
from schedlang.lowering.cost import CostModelKind
from schedlang.lowering.hardware_profile import resolve_hardware

TOKENS_PER_STEP = 4 * 32768
STAGES = "stages = [[" + ", ".join(map(str, range(17))) + "], [" + ", ".join(map(str, range(17, 32))) + "]]"

SCHEDULE = """schedule pp2
model {{ vocab = 32000  d_model = 2048  layers = [gla, mlp] * 16  heads = 16  head_dim = 128
  mlp = swiglu(intermediate_size = 5464)  {stages} }}
mesh {{ pipeline = 2 }}
sequence {{ length = 32768  chunks = {chunks} }}
pipeline {{ microbatches = 4  order = 1f1b  {pipeline} }}
train {{ dtype = bf16 }}
"""

GRAPHS_SPLIT = "cuda_graphs = true  split_backward = true  forward_before_weight = true"
MEASURED = {  # system of benchmarks/pipeline.py -> (chunks, pipeline keys, tokens/s measured in job 1)
    "torch Schedule1F1B": (1, "", 134_413),
    "2g+1wf": (2, f"{GRAPHS_SPLIT}  extra_warmup = 1", 155_166),
    "2g+1wfd1": (2, f"{GRAPHS_SPLIT}  extra_warmup = 1  extra_deferred_weights = 1", 157_595),
    "2g+1wfd2": (2, f"{GRAPHS_SPLIT}  extra_warmup = 1  extra_deferred_weights = 2", 158_736),
    "4g+2wf": (4, f"{GRAPHS_SPLIT}  extra_warmup = 2", 154_598),
    "4g+2wfd2": (4, f"{GRAPHS_SPLIT}  extra_warmup = 2  extra_deferred_weights = 2", 154_840),
}


def predicted_tokens_per_second(chunks: int, pipeline: str) -> float:
    text = SCHEDULE.format(stages=STAGES, chunks=chunks, pipeline=pipeline)
    cost = CostSettings(CostModelKind.FLOPS, resolve_hardware("h200"))
    timeline = compile_schedule(ScheduleText(text, "<pp2>"), Pass.COST, cost).timeline
    return TOKENS_PER_STEP / timeline.makespan


@pytest.fixture(scope="module")
def predictions():
    return {system: predicted_tokens_per_second(chunks, pipeline) for system, (chunks, pipeline, _) in MEASURED.items()}


PP2_TOLERANCE = 0.10
"""Issue 34's bound. With the parts alone every system came out 9-12% optimistic; calibrated against the one-GPU
whole step (step factor 1.12, docs/cost-model.md, "Our own PP2 run") they are within 3%."""


@pytest.mark.parametrize("system", sorted(MEASURED))
def test_pp2_throughput_within_the_profiles_reach(predictions, system):
    measured = MEASURED[system][2]
    assert predictions[system] == pytest.approx(measured, rel=PP2_TOLERANCE)


def test_pp2_ratio_over_schedule1f1b(predictions):
    """1.181x measured for 2g+1wfd2 over torch's Schedule1F1B in the same job."""
    measured = MEASURED["2g+1wfd2"][2] / MEASURED["torch Schedule1F1B"][2]
    predicted = predictions["2g+1wfd2"] / predictions["torch Schedule1F1B"]
    assert predicted == pytest.approx(measured, rel=0.05)
    assert predicted > 1.1


def test_the_h200_profile_in_use_is_the_measured_and_calibrated_one():
    profile = resolve_hardware("h200")
    assert profile.name == "h200"
    assert profile.calibration.schedule == "gla_1b_one_device.sched"
    assert 1.0 < profile.calibration.step_factor < 1.3
    with open(profile.source_file, encoding="utf-8") as handle:
        header = [line for line in handle if line.startswith("#")]
    assert any(line.startswith("# Measured by `schedlang profile") for line in header)


OFFLOAD_MEASURED = {  # chunks -> (offload, its twin without): measured step seconds, one H100, 2026-12-07
    2: (1.178, 0.8962),
    4: (1.477, 0.9076),
}
"""The 1B GLA at 64K tokens, ``recompute = mixer``, from docs/benchmarks.md, "Offload on one H100, the last
forward's chunk kept" (medians of ranks 24 and 1, 31 and 3 over two runs each where there were two)."""


@pytest.mark.parametrize("chunks", sorted(OFFLOAD_MEASURED))
def test_offload_on_one_h100_is_priced_by_its_copy_stream(chunks):
    """With the shipped h100 profile, the offloading step within 5% of the measured one. Its copies overlap the
    next tasks on one copy stream (``ProfileCostModel._copy_waits``); priced as if each copy had to end within
    its own task, the two-chunk step came out 1.324 s against 1.178 measured (the calibrated profile of that
    session)."""
    from benchmarks.pipeline_schedule import ONE_DEVICE_SCHEDULE
    from schedlang.compiler import revise

    cost = CostSettings(CostModelKind.FLOPS, resolve_hardware("h100"))
    program = compile_schedule(str(ONE_DEVICE_SCHEDULE), through=Pass.CHECK).program
    seconds = {}
    for offload in (True, False):
        revised = revise(program, length=65536, chunks=chunks, offload=offload, recompute="mixer")
        seconds[offload] = compile_schedule(revised, Pass.COST, cost).timeline.makespan
    measured_offload, measured_twin = OFFLOAD_MEASURED[chunks]
    assert seconds[True] == pytest.approx(measured_offload, rel=0.05)
    assert seconds[False] == pytest.approx(measured_twin, rel=0.06)  # the head curve predates the Triton loss


SAME_MACHINE_MEASURED = {  # (schedule, length, chunks, alpha, recompute) -> measured step seconds
    ("gla_1b_one_device_32k.sched", 32768, 16, None, "none"): 0.975,
    ("gla_1b_one_device_32k.sched", 32768, 16, None, "mlp"): 0.991,
    ("gla_1b_one_device_32k.sched", 32768, 64, None, "none"): 3.544,
    ("gla_1b_one_device_32k.sched", 32768, 64, None, "mlp"): 4.928,
    ("gdn_attn_1b_one_device.sched", 65536, 64, 1.0, "mlp"): 5.653,
}
"""Eager steps on the H100 whose calibration the shipped h100 profile carries, in the same call (docs/benchmarks.md,
"The recompute host rows shipped"): medians of three steps after two. Most are bound by the host's launches (512
to 2,048 tokens a chunk); the 16-chunk rows are near the balance of host and device."""

OTHER_MACHINES_MEASURED = {  # (schedule, chunks, alpha, offload) -> measured step seconds, 64K, recompute = mlp
    ("gla_1b_one_device.sched", 32, None, False): (1.870, 2.076),
    ("gla_1b_one_device.sched", 32, None, True): (2.782, 3.072),
    ("gdn_attn_1b_one_device.sched", 64, 1.0, False): (4.639, 4.523),
    ("gdn_attn_1b_one_device.sched", 64, 1.0, True): (7.084,),
}
"""The host-bound rows of docs/benchmarks.md, "The host model per part against one H100", measured on two other
lent H100 machines (eleventh and thirteenth sessions of 2026-12-07). The host calibration's own step (the 32K GLA
in 64 eager chunks) measured 2.491, 2.664, 3.257, 3.427, 3.542 and 3.973 s on six lent H100 machines, 25% below to
19% above the one this profile was calibrated with, so another machine's host-bound rows are held to 20%."""

SAME_MACHINE_TOLERANCE = 0.15
OTHER_MACHINE_TOLERANCE = 0.20


def predicted_step_seconds(schedule: str, **changes) -> float:
    from benchmarks.pipeline_schedule import SCHEDULES_DIRECTORY
    from schedlang.compiler import revise

    cost = CostSettings(CostModelKind.FLOPS, resolve_hardware("h100"))
    program = compile_schedule(str(SCHEDULES_DIRECTORY / schedule), through=Pass.CHECK).program
    return compile_schedule(revise(program, **changes), Pass.COST, cost).timeline.makespan


def partition(alpha: float | None) -> dict:
    """The revision's ``partition`` key for a balanced cut at ``alpha``; none for the file's own."""
    return {} if alpha is None else {"partition": f"balanced(alpha = {alpha})"}


@pytest.mark.parametrize("row", sorted(SAME_MACHINE_MEASURED, key=str), ids=str)
def test_steps_on_the_calibrating_h100_priced_by_each_parts_host_times(row):
    """With the shipped h100 profile (each part's own host times, plain, offloaded and recomputed, and the
    launches a backward reruns: ``ProfileCostModel._stage_chunk``), each step measured on the machine it was
    calibrated on within 15%."""
    schedule, length, chunks, alpha, recompute = row
    predicted = predicted_step_seconds(schedule, length=length, chunks=chunks, recompute=recompute,
                                       **partition(alpha))
    assert predicted == pytest.approx(SAME_MACHINE_MEASURED[row], rel=SAME_MACHINE_TOLERANCE)


@pytest.mark.xfail(strict=True, reason="measured 3.08 s twice against 2.18 predicted: 3.1x the 32K row in 16 chunks "
                   "of the same 2,048 tokens, where the host model's launches double; not explained yet "
                   "(docs/benchmarks.md, 'The recompute host rows shipped')")
def test_the_64k_gla_in_32_chunks_recomputing_the_mlps_on_the_calibrating_h100():
    predicted = predicted_step_seconds("gla_1b_one_device.sched", length=65536, chunks=32, recompute="mlp")
    assert predicted == pytest.approx(3.082, rel=SAME_MACHINE_TOLERANCE)


def test_recomputing_the_mlps_costs_the_host_what_was_measured():
    """The 32K GLA in 64 eager chunks: ``recompute = mlp`` ran 1.39x the step without it on the calibrating machine
    (4.928 / 3.544 s) and 1.36x on the fourteenth session's (3.443 / 2.534 s). Priced with the rerun forward alone
    (no recompute rows) the model said 1.07x."""
    plain = predicted_step_seconds("gla_1b_one_device_32k.sched", chunks=64, recompute="none")
    recomputing = predicted_step_seconds("gla_1b_one_device_32k.sched", chunks=64, recompute="mlp")
    for measured in (4.928 / 3.544, 3.443 / 2.534):
        assert recomputing / plain == pytest.approx(measured, rel=0.10)


@pytest.mark.parametrize("row", sorted(OTHER_MACHINES_MEASURED, key=str), ids=str)
def test_host_bound_steps_on_other_h100_machines(row):
    """The same profile against the host-bound rows of two other machines: each within 20%."""
    schedule, chunks, alpha, offload = row
    predicted = predicted_step_seconds(schedule, length=65536, chunks=chunks, offload=offload, recompute="mlp",
                                       **partition(alpha))
    for measured in OTHER_MACHINES_MEASURED[row]:
        assert predicted == pytest.approx(measured, rel=OTHER_MACHINE_TOLERANCE)
