"""Hardware profiles (lowering/hardware_profile.py) and the profile cost model (lowering/profile_cost.py)."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from schedlang.commands import simulate
from schedlang.compiler import CostSettings, Pass, ScheduleText, compile_schedule
from schedlang.lowering.cost import CostModelKind, make_cost_model
from schedlang.lowering.hardware_profile import (
    Curve,
    HardwareProfileError,
    LinkClass,
    Origin,
    ProfiledPart,
    model_parts,
    parse_hardware_profile,
    resolve_hardware,
    shipped_profiles,
)
from schedlang.lowering.memory_terms import chunk_activation_bytes
from schedlang.lowering.profile_cost import MissingMeasurementError, ProfileCostModel, scan_seconds
from schedlang.vocabulary.actions import ActionKind, TaskId
from schedlang.vocabulary.edges import Payload
from schedlang.vocabulary import LayerKind, SequenceParallelMethod


def profile_text(
    gpus_per_node: int = 8,
    nodes: int = 1,
    inter_node_bandwidth: float = 1e9,
    eager_layer_seconds: float = 0.0,
    graph_layer_seconds: float = 0.0,
    layers: str | None = None,
) -> str:
    """A small profile: every part linear in tokens (1 us per token forward, 2 backward, 0.5 weight)."""
    if layers is None:
        layers = "".join(
            f"""
[[layer]]
kind = "{kind}"
d_model = 128
{extra}
tokens = [64, 128]
forward = [64e-6, 128e-6]
backward = [128e-6, 256e-6]
weight = [32e-6, 64e-6]
"""
            for kind, extra in [
                ("gla", "heads = 2\nhead_dim = 64"),
                ("mlp", "hidden = 512"),
                ("embedding", "vocab = 256"),
                ("head", "vocab = 256"),
            ]
        )
    return f"""format = 1

[device]
name = "test"
model = "test device"
origin = "derived"
note = "written by the test"
dtype = "fp32"
memory_bandwidth = 1e30

[overhead]
eager_layer_seconds = {eager_layer_seconds}
graph_layer_seconds = {graph_layer_seconds}
task_seconds = 0.0

[offload]
bandwidth = 1e9

[topology]
gpus_per_node = {gpus_per_node}
nodes = {nodes}

[links.p2p]
latency = 1e-6
bandwidth = 1e11

[links.all_gather]
latency = 1e-6
bandwidth = 1e11

[links.reduce_scatter]
latency = 1e-6
bandwidth = 1e11

[links.inter_node]
latency = 1e-5
bandwidth = {inter_node_bandwidth}
{layers}"""


SCHEDULE = """schedule small
model {{
  vocab = 256
  d_model = 128
  layers = [gla] * 4
  heads = 2
  head_dim = 64
}}
mesh {{ pipeline = 2 {mesh} }}
sequence {{ length = {length} chunks = 2 {sequence} }}
pipeline {{ microbatches = 2 {pipeline} }}
"""


def program_of(length: int = 256, mesh: str = "", sequence: str = "", pipeline: str = ""):
    text = SCHEDULE.format(length=length, mesh=mesh, sequence=sequence, pipeline=pipeline)
    return compile_schedule(ScheduleText(text), through=Pass.CHECK).program


def test_curve_interpolates_between_lengths_and_scales_beyond_them():
    curve = Curve((100, 200), (1.0, 3.0))
    assert curve.at(150) == pytest.approx(2.0)
    assert curve.at(50) == pytest.approx(0.5)  # proportional from the first length
    assert curve.at(400) == pytest.approx(6.0)  # proportional from the last


def test_shipped_profiles_load_and_h200_names_the_measured_profile():
    assert {"h200", "h200-benchmarks", "zeco-h100", "stateflow-a100", "zeco-h100-operator"} <= set(shipped_profiles())
    for name in shipped_profiles():
        assert resolve_hardware(name).name == name
    h200 = resolve_hardware("h200")
    assert h200.origin is Origin.MEASURED and h200.device == "NVIDIA H200"
    assert resolve_hardware("h200-benchmarks").origin is Origin.DERIVED


def test_forward_is_the_sum_of_the_parts_at_the_chunk_tokens():
    profile = parse_hardware_profile(profile_text())
    program = program_of()  # 2 stages of 2 gla layers with their MLPs, chunks of 128 tokens
    model = ProfileCostModel(program, profile)
    # stage 0: embedding + 2 x (gla + mlp) = 5 parts of 128 us each
    assert model.task_duration(TaskId(ActionKind.FORWARD, 0, 0, 0)) == pytest.approx(5 * 128e-6)
    # a whole backward: backward and weight curves (no split), no gradient addition at 1e30 B/s
    assert model.task_duration(TaskId(ActionKind.BACKWARD, 1, 0, 1)) == pytest.approx(5 * (256e-6 + 64e-6))


def test_split_backward_moves_the_weight_curve_into_w():
    profile = parse_hardware_profile(profile_text())
    whole = ProfileCostModel(program_of(), profile)
    split = ProfileCostModel(program_of(pipeline="split_backward = true"), profile)
    backward = TaskId(ActionKind.BACKWARD, 0, 0, 0)
    weight = TaskId(ActionKind.WEIGHT, 0, 0, 0)
    assert split.task_duration(weight) == pytest.approx(5 * 64e-6)
    assert split.task_duration(backward) + split.task_duration(weight) == pytest.approx(whole.task_duration(backward))


def test_recompute_full_adds_the_forward_to_the_backward():
    profile = parse_hardware_profile(profile_text())
    plain = ProfileCostModel(program_of(), profile)
    recomputed = ProfileCostModel(program_of(pipeline="recompute = full"), profile)
    backward = TaskId(ActionKind.BACKWARD, 0, 0, 0)
    forward = TaskId(ActionKind.FORWARD, 0, 0, 0)
    assert recomputed.task_duration(backward) - plain.task_duration(backward) == pytest.approx(
        plain.task_duration(forward)
    )


def test_eager_tasks_take_their_host_time_and_graph_tasks_add_their_gaps():
    host = parse_hardware_profile(profile_text(eager_layer_seconds=1e-3, graph_layer_seconds=1e-6))
    eager = ProfileCostModel(program_of(), host)
    assert eager.task_duration(TaskId(ActionKind.FORWARD, 0, 0, 0)) == pytest.approx(5 * 1e-3)  # host-bound
    graphs = ProfileCostModel(program_of(pipeline="cuda_graphs = true"), host)
    assert graphs.task_duration(TaskId(ActionKind.FORWARD, 0, 0, 0)) == pytest.approx(5 * 128e-6 + 5 * 1e-6)


def test_with_a_slow_host_link_a_stage_ends_when_its_copy_stream_does():
    """Stage 0 of 1f1b over two stages runs F0.0 F0.1 F1.0 B0.1 F1.1 B0.0 B1.1 B1.0 and copies every unit out
    (none is followed by its own backward). With a host link far slower than the tasks the forwards still take
    their own time (their copies run beside the next tasks), and the stage's last backward ends one task after
    the copy stream has taken every unit out and back, one copy at a time."""
    slow_host = profile_text().replace("bandwidth = 1e9\n\n[topology]", "bandwidth = 1e3\n\n[topology]")
    profile = parse_hardware_profile(slow_host)
    plain = ProfileCostModel(program_of(), profile)
    offloaded = ProfileCostModel(program_of(pipeline="offload = true"), profile)
    units = [(microbatch, chunk) for microbatch in range(2) for chunk in range(2)]
    for microbatch, chunk in units:
        forward = TaskId(ActionKind.FORWARD, 0, microbatch, chunk)
        assert offloaded.task_duration(forward) == plain.task_duration(forward)
    stage_0 = sum(offloaded.task_duration(TaskId(kind, 0, *unit)) for unit in units
                  for kind in (ActionKind.FORWARD, ActionKind.BACKWARD))
    copies = 2 * sum(chunk_activation_bytes(offloaded.program, 0, chunk) / 1e3 for _, chunk in units)
    last = TaskId(ActionKind.BACKWARD, 0, 1, 0)
    assert stage_0 == pytest.approx(copies + plain.task_duration(last))
    fast_host = profile_text().replace("bandwidth = 1e9\n\n[topology]", "bandwidth = 1e15\n\n[topology]")
    fast = ProfileCostModel(program_of(pipeline="offload = true"), parse_hardware_profile(fast_host))
    for unit in units:
        backward = TaskId(ActionKind.BACKWARD, 0, *unit)
        assert fast.task_duration(backward) == pytest.approx(plain.task_duration(backward), rel=1e-5)


def test_offloaded_units_are_priced_as_the_executor_moves_them():
    """Stage 0 of 1f1b over two stages runs F0.0 F0.1 F1.0 B0.1 F1.1 B0.0 B1.1 B1.0: B0.1 is its first backward,
    after another unit's forward, so it waits for its whole copy back; stage 1 runs F0.1 B0.1 back to back, so
    that unit copies nothing (``offload_copies``)."""
    # at 1e11 B/s each copy is shorter than its task
    fast_host = profile_text().replace("bandwidth = 1e9\n\n[topology]", "bandwidth = 1e11\n\n[topology]")
    profile = parse_hardware_profile(fast_host)
    plain = ProfileCostModel(program_of(), profile)
    offloaded = ProfileCostModel(program_of(pipeline="offload = true"), profile)
    copy_seconds = chunk_activation_bytes(offloaded.program, 0, 1) / 1e11
    assert 0.01 < copy_seconds / plain.task_duration(TaskId(ActionKind.FORWARD, 0, 0, 1)) < 1
    exposed = TaskId(ActionKind.BACKWARD, 0, 0, 1)
    assert offloaded.task_duration(exposed) == pytest.approx(plain.task_duration(exposed) + copy_seconds)
    for kind in ActionKind.FORWARD, ActionKind.BACKWARD:
        for task in TaskId(kind, 0, 1, 1), TaskId(kind, 1, 0, 1), TaskId(kind, 1, 1, 1):  # prefetched or kept
            assert offloaded.task_duration(task) == pytest.approx(plain.task_duration(task))
    forward = TaskId(ActionKind.FORWARD, 0, 0, 1)  # its copy out overlaps the tasks after it
    assert offloaded.task_duration(forward) == pytest.approx(plain.task_duration(forward))
    slow_host = profile_text().replace("bandwidth = 1e9\n\n[topology]", "bandwidth = 1e3\n\n[topology]")
    slow = ProfileCostModel(program_of(pipeline="offload = true"), parse_hardware_profile(slow_host))
    kept_forward, kept_backward = TaskId(ActionKind.FORWARD, 1, 0, 1), TaskId(ActionKind.BACKWARD, 1, 0, 1)
    assert slow.task_duration(kept_forward) == pytest.approx(plain.task_duration(kept_forward))
    assert slow.task_duration(kept_backward) == pytest.approx(plain.task_duration(kept_backward))
    travelling = TaskId(ActionKind.BACKWARD, 1, 0, 0)  # out during F0.0, back behind B0.1: B0.0 waits
    assert slow.task_duration(travelling) > 100 * plain.task_duration(travelling)


def test_width_scales_by_flops_from_the_nearest_measurement():
    profile = parse_hardware_profile(profile_text())
    narrow = ProfileCostModel(program_of(), profile)
    wide_text = SCHEDULE.format(length=256, mesh="", sequence="", pipeline="").replace("d_model = 128", "d_model = 256")
    wide_program = compile_schedule(ScheduleText(wide_text), through=Pass.CHECK).program
    wide = ProfileCostModel(wide_program, profile)
    mlp_narrow = narrow.part_seconds(ProfiledPart.MLP, 128, 0)[0]
    # the MLP's FLOPs grow with d_model x hidden, and hidden = 4 d_model: four times the measured 128 x 512
    assert wide.part_seconds(ProfiledPart.MLP, 128, 0)[0] == pytest.approx(4 * mlp_narrow)


def test_a_program_with_an_unmeasured_part_is_refused_by_name():
    layers = """
[[layer]]
kind = "gla"
d_model = 128
heads = 2
head_dim = 64
tokens = [64]
forward = [1e-6]
backward = [1e-6]
"""
    with pytest.raises(MissingMeasurementError, match="mlp, embedding, head"):
        ProfileCostModel(program_of(), parse_hardware_profile(profile_text(layers=layers)))


def test_sequence_scan_crossing_nodes_pays_the_inter_node_link():
    one_node = parse_hardware_profile(profile_text(gpus_per_node=16, nodes=1))
    two_nodes = parse_hardware_profile(profile_text(gpus_per_node=8, nodes=2))
    ranks = list(range(16))
    for method in SequenceParallelMethod:
        inside = scan_seconds(method, ranks, 4, 1e6, one_node)
        across = scan_seconds(method, ranks, 4, 1e6, two_nodes)
        assert across > inside
    # the ring crosses once: its 15 hops are 14 on NVLink-class and one inter-node
    p2p, inter = one_node.link(LinkClass.P2P), one_node.link(LinkClass.INTER_NODE)
    expected = 14 * p2p.transfer_time(1e6) + inter.transfer_time(1e6)
    assert scan_seconds(SequenceParallelMethod.RING, ranks, 1, 1e6, two_nodes) == pytest.approx(expected)


def test_all_scan_on_uniform_links_is_the_flops_models_formula():
    from schedlang.lowering.cost import Hardware, state_scan_seconds

    profile = parse_hardware_profile(profile_text(gpus_per_node=64))
    link = profile.link(LinkClass.P2P)
    hardware = Hardware(latency_s=link.latency_s, bandwidth_bytes_per_s=link.bandwidth_bytes_per_s)
    for ranks in (2, 3, 8, 64):
        for blocks in (1, 4, 16):
            ours = scan_seconds(SequenceParallelMethod.ALLSCAN, list(range(ranks)), blocks, 1e6, profile)
            theirs = state_scan_seconds(SequenceParallelMethod.ALLSCAN, ranks, blocks, 1e6, hardware)
            assert ours == pytest.approx(theirs)


def test_stage_messages_across_nodes_use_the_inter_node_link():
    program = program_of(length=512, mesh="sequence = 4", sequence="kernel_chunk = 64")
    same_node = ProfileCostModel(program, parse_hardware_profile(profile_text(gpus_per_node=8)))
    split_nodes = ProfileCostModel(program, parse_hardware_profile(profile_text(gpus_per_node=4, nodes=2)))
    source, destination = TaskId(ActionKind.FORWARD, 0, 0, 0), TaskId(ActionKind.FORWARD, 1, 0, 0)
    n_bytes = same_node.message_bytes(Payload.ACTIVATION, source, destination)
    assert same_node.message_duration(Payload.ACTIVATION, source, destination) == pytest.approx(
        1e-6 + n_bytes / 1e11
    )
    assert split_nodes.message_duration(Payload.ACTIVATION, source, destination) == pytest.approx(
        1e-5 + n_bytes / 1e9
    )


def test_make_cost_model_takes_a_profile_and_keeps_its_old_signature():
    profile = parse_hardware_profile(profile_text())
    program = program_of()
    assert isinstance(make_cost_model(CostModelKind.FLOPS, program, profile), ProfileCostModel)
    assert isinstance(make_cost_model(CostModelKind.FLOPS, program, hardware=profile), ProfileCostModel)
    assert not isinstance(make_cost_model(CostModelKind.FLOPS, program), ProfileCostModel)
    assert not isinstance(make_cost_model(CostModelKind.UNIT, program, profile), ProfileCostModel)
    timeline = compile_schedule(program, Pass.COST, CostSettings(CostModelKind.FLOPS, profile)).timeline
    assert timeline.makespan > 0


@pytest.mark.parametrize(
    ("edit", "line", "column", "message"),
    [
        (lambda text: text.replace("format = 1", "format = 2"), 1, 1, "format 2 is not supported"),
        (lambda text: text.replace("format = 1\n", ""), None, None, "no 'format' key"),
        (lambda text: text.replace("bandwidth = 1e9", "bandwidth = -1"), 17, 1, "'offload.bandwidth' must be positive"),
        (lambda text: text.replace('kind = "mlp"', 'kind = "moe"'), 50, 1, "'layer[1].kind' must be one of"),
        (lambda text: text.replace("forward = [64e-6, 128e-6]", "forward = [64e-6]", 1), 45, 1, "list of 2 numbers"),
        (lambda text: text.replace("tokens = [64, 128]", "tokens = [128, 64]", 1), 44, 1, "increasing"),
        (lambda text: text.replace('dtype = "fp32"', "dtype = fp32"), 8, 9, "not valid TOML"),
    ],
)
def test_malformed_profiles_are_positioned_errors(edit, line, column, message):
    text = edit(profile_text())
    with pytest.raises(HardwareProfileError) as raised:
        parse_hardware_profile(text, "bad.toml")
    rendered = raised.value.render()
    assert message in rendered
    first = rendered.splitlines()[0]
    if line is None:
        assert first.startswith("error:")
    else:
        assert first.startswith(f"bad.toml:{line}:{column}: error:"), rendered
        assert "^" in rendered.splitlines()[2]
    assert "hint:" in rendered


def run_simulate(argv):
    parser = argparse.ArgumentParser()
    simulate.add_arguments(parser)
    return simulate.run(parser.parse_args(argv))


def test_simulate_prints_the_profile_it_used(tmp_path, capsys):
    schedule = tmp_path / "small.sched"
    schedule.write_text(SCHEDULE.format(length=256, mesh="", sequence="", pipeline=""))
    profile = tmp_path / "test.toml"
    profile.write_text(profile_text())
    assert run_simulate([str(schedule), "--hardware", str(profile)]) == 0
    out = capsys.readouterr().out
    assert "cost model profile" in out
    assert f"hardware profile test ({profile}; derived: written by the test)" in out


def test_simulate_refuses_a_malformed_profile_without_a_traceback(tmp_path, capsys):
    schedule = tmp_path / "small.sched"
    schedule.write_text(SCHEDULE.format(length=256, mesh="", sequence="", pipeline=""))
    profile = tmp_path / "bad.toml"
    profile.write_text(profile_text().replace("format = 1", "format = 7"))
    with pytest.raises(SystemExit) as raised:
        run_simulate([str(schedule), "--hardware", str(profile)])
    assert raised.value.code == 2
    error = capsys.readouterr().err
    assert f"{profile}:1:1: error: hardware profile format 7 is not supported" in error
    assert "Traceback" not in error
    with pytest.raises(SystemExit):
        run_simulate([str(schedule), "--hardware", "nowhere"])
    assert "error: no hardware profile 'nowhere'" in capsys.readouterr().err


def test_simulate_refuses_a_cost_model_that_contradicts_hardware(tmp_path):
    schedule = tmp_path / "small.sched"
    schedule.write_text(SCHEDULE.format(length=256, mesh="", sequence="", pipeline=""))
    for cost_model in ("unit", "flops"):
        with pytest.raises(SystemExit, match=f"drop --cost-model {cost_model}"):
            run_simulate([str(schedule), "--hardware", "h200", "--cost-model", cost_model])


def test_simulate_names_the_parts_a_profile_lacks(capsys):
    hybrid = str(__import__("pathlib").Path(__file__).resolve().parents[2] / "examples" / "gdn_hybrid.sched")
    assert run_simulate([hybrid, "--hardware", "h200-benchmarks"]) == 1
    error = capsys.readouterr().err
    assert "hardware profile h200-benchmarks has no measurement of attn," in error  # gdn: priced from gla
    assert "Traceback" not in error


def attention_layers(prefixes_and_forward) -> str:
    common = "\n".join(
        f"""
[[layer]]
kind = "{kind}"
d_model = 128
{extra}
tokens = [128]
forward = [1e-3]
backward = [1e-3]
"""
        for kind, extra in [("mlp", "hidden = 512"), ("embedding", "vocab = 256"), ("head", "vocab = 256")]
    )
    return common + "".join(
        f"""
[[layer]]
kind = "attn"
d_model = 128
heads = 2
head_dim = 64
prefix = {prefix}
tokens = [128]
forward = [{forward}]
backward = [{2 * forward}]
"""
        for prefix, forward in prefixes_and_forward
    )


def attention_model(layers: str, pipeline: str = "") -> ProfileCostModel:
    text = SCHEDULE.format(length=256, mesh="", sequence="", pipeline=pipeline).replace("[gla] * 4", "[attn] * 4")
    program = compile_schedule(ScheduleText(text), through=Pass.CHECK).program
    return ProfileCostModel(program, parse_hardware_profile(profile_text(layers=layers)))


def test_attention_is_linear_in_the_prefix_between_and_beyond_measured_prefixes():
    model = attention_model(attention_layers([(0, 1e-3), (1000, 3e-3)]))
    assert model.part_seconds(ProfiledPart.ATTN, 128, 500)[0] == pytest.approx(2e-3)
    assert model.part_seconds(ProfiledPart.ATTN, 128, 2000)[0] == pytest.approx(5e-3)  # beyond: the same line
    assert model.part_seconds(ProfiledPart.ATTN, 128, 0)[1] == pytest.approx(2e-3)
    # the second chunk of 128 tokens starts after 128 keys
    forward = model.task_duration(TaskId(ActionKind.FORWARD, 1, 0, 1))
    expected_attention = 2 * (1e-3 + 2e-3 * 128 / 1000)  # two attn layers on stage 1
    assert forward == pytest.approx(expected_attention + 2 * 1e-3 + 1e-3)  # their MLPs and the head


def test_one_measured_prefix_scales_by_the_pair_flops():
    model = attention_model(attention_layers([(0, 1e-3)]))
    from schedlang.lowering.cost import attention_pair_flops
    from schedlang.lowering.profile_cost import measured_flops_per_token

    measured = model.profile.measurements(ProfiledPart.ATTN)[0]
    per_token = measured_flops_per_token(measured, 64)
    pairs = attention_pair_flops(2, 64)
    expected = 1e-3 * (per_token + pairs * (256 + 64)) / (per_token + pairs * 64)
    assert model.part_seconds(ProfiledPart.ATTN, 128, 256)[0] == pytest.approx(expected)


def test_a_microbatch_of_sequences_reads_its_rows_and_attention_per_sequence():
    profile = parse_hardware_profile(profile_text())
    one = ProfileCostModel(program_of(), profile)
    two = ProfileCostModel(program_of(pipeline="microbatch_size = 2"), profile)
    forward = TaskId(ActionKind.FORWARD, 0, 0, 0)
    # 5 linear curves: at 256 rows, proportional beyond the last measured length (128)
    assert two.task_duration(forward) == pytest.approx(2 * one.task_duration(forward))
    # attention: two sequences of 128 tokens after 128 keys each, not one of 256 rows after 128 keys
    layers = attention_layers([(0, 1e-3), (1000, 3e-3)])
    second_chunk = TaskId(ActionKind.FORWARD, 1, 0, 1)
    single = attention_model(layers).task_duration(second_chunk)
    double = attention_model(layers, "microbatch_size = 2").task_duration(second_chunk)
    per_sequence_attention = 2 * (1e-3 + 2e-3 * 128 / 1000)  # two attn layers, read at 128 tokens
    rest = 2 * 1e-3 + 1e-3  # two MLPs and the head, linear in rows
    assert single == pytest.approx(per_sequence_attention + rest)
    assert double == pytest.approx(2 * per_sequence_attention + 2 * rest)


CALIBRATION = """
[calibration]
step_factor = {factor}
schedule = "one.sched"
measured_step_seconds = 1.1
parts_step_seconds = 1.0
"""


def test_the_calibration_factor_scales_every_part_and_round_trips():
    from schedlang.lowering.hardware_profile import format_hardware_profile

    plain = parse_hardware_profile(profile_text())
    calibrated = parse_hardware_profile(profile_text() + CALIBRATION.format(factor=1.25))
    assert not plain.calibration.measured and plain.calibration.step_factor == 1.0
    assert calibrated.calibration.schedule == "one.sched"
    program = program_of()
    before, after = ProfileCostModel(program, plain), ProfileCostModel(program, calibrated)
    for kind, stage in [(ActionKind.FORWARD, 0), (ActionKind.BACKWARD, 1)]:
        task = TaskId(kind, stage, 0, 0)
        assert after.task_duration(task) == pytest.approx(1.25 * before.task_duration(task))
    assert parse_hardware_profile(format_hardware_profile(calibrated)).calibration == calibrated.calibration


def test_a_calibration_outside_its_bounds_is_a_positioned_error():
    text = profile_text() + CALIBRATION.format(factor=3.0)
    with pytest.raises(HardwareProfileError) as raised:
        parse_hardware_profile(text, "bad.toml")
    rendered = raised.value.render()
    line = text.splitlines().index("step_factor = 3.0") + 1
    assert rendered.splitlines()[0].startswith(f"bad.toml:{line}:1: error: 'calibration.step_factor' is 3")


HOST_CALIBRATION = """host_factor = {factor}
host_schedule = "one.sched with chunks = 64"
host_measured_step_seconds = 4.0
host_parts_step_seconds = 2.4
"""


def test_the_host_factor_scales_eager_host_times_only_and_round_trips():
    """An eager task takes the longer of its device and host times: the factor multiplies the host side, so a
    host-bound task scales by it and graph replay ignores it."""
    from schedlang.lowering.hardware_profile import format_hardware_profile

    text = profile_text() + CALIBRATION.format(factor=1.0)
    plain = parse_hardware_profile(text)
    hosted = parse_hardware_profile(text + HOST_CALIBRATION.format(factor=2.0))
    assert not plain.calibration.host_measured and plain.calibration.host_factor == 1.0
    assert hosted.calibration.host_factor == 2.0 and hosted.calibration.host_measured
    assert parse_hardware_profile(format_hardware_profile(hosted)).calibration == hosted.calibration
    # make the host dominate: a large per-layer launch time
    slow_host = dataclasses.replace(plain.overhead, eager_layer_seconds=1.0, eager_backward_layer_seconds=3.0)
    plain, hosted = (dataclasses.replace(profile, overhead=slow_host) for profile in (plain, hosted))
    program = program_of()
    task = TaskId(ActionKind.FORWARD, 0, 0, 0)
    before, after = ProfileCostModel(program, plain), ProfileCostModel(program, hosted)
    task_seconds = plain.overhead.task_seconds
    assert after.task_duration(task) - task_seconds == pytest.approx(2 * (before.task_duration(task) - task_seconds))


def test_a_host_factor_outside_its_bounds_is_a_positioned_error():
    text = profile_text() + CALIBRATION.format(factor=1.0) + HOST_CALIBRATION.format(factor=9.0)
    with pytest.raises(HardwareProfileError) as raised:
        parse_hardware_profile(text, "bad.toml")
    line = text.splitlines().index("host_factor = 9.0") + 1
    assert raised.value.render().splitlines()[0].startswith(f"bad.toml:{line}:1: error: 'calibration.host_factor' is 9")


HOST = """
[host]
memory = {memory}
{fraction}"""


def host_profile(memory="137438953472", fraction: str = "") -> str:
    """The small profile with a [host] table after its layers."""
    return profile_text() + HOST.format(memory=memory, fraction=fraction)


def test_the_host_table_is_optional_and_round_trips():
    from schedlang.lowering.hardware_profile import (
        DEFAULT_HOST_MEMORY_BYTES,
        DEFAULT_PINNED_FRACTION,
        HostMemory,
        format_hardware_profile,
    )

    plain = parse_hardware_profile(profile_text())
    assert plain.host is None  # an old profile: not stated
    assert plain.host_memory() == HostMemory(DEFAULT_HOST_MEMORY_BYTES, DEFAULT_PINNED_FRACTION)
    assert "[host]" not in format_hardware_profile(plain)
    stated = parse_hardware_profile(host_profile("2.5e11", "pinned_fraction = 0.5"))
    assert stated.host == HostMemory(250_000_000_000, 0.5) and stated.host.pinned_limit == 125_000_000_000
    assert parse_hardware_profile(host_profile()).host == HostMemory(128 * 2**30, DEFAULT_PINNED_FRACTION)
    assert parse_hardware_profile(format_hardware_profile(stated)).host == stated.host


@pytest.mark.parametrize(
    ("memory", "fraction", "key", "message"),
    [
        ("-1", "", "memory", "'host.memory' must be positive, got -1"),
        ('"128GiB"', "", "memory", "'host.memory' must be a number, got '128GiB'"),
        ("1.5", "", "memory", "'host.memory' must be a whole number of bytes, got 1.5"),
        ("1e9", "pinned_fraction = 0", "pinned_fraction", "'host.pinned_fraction' must be positive, got 0"),
        ("1e9", "pinned_fraction = 1.5", "pinned_fraction", "at most 1, got 1.5"),
        ("1e9", "pinned_fraction = true", "pinned_fraction", "'host.pinned_fraction' must be a number, got True"),
    ],
)
def test_a_malformed_host_table_is_a_positioned_error(memory, fraction, key, message):
    text = host_profile(memory, fraction)
    with pytest.raises(HardwareProfileError) as raised:
        parse_hardware_profile(text, "bad.toml")
    rendered = raised.value.render().splitlines()
    line = next(number for number, row in enumerate(text.splitlines(), start=1) if row.startswith(f"{key} ="))
    assert rendered[0].startswith(f"bad.toml:{line}:1: error:") and message in rendered[0], rendered
    assert rendered[2].startswith("^")


def test_a_host_table_without_its_memory_or_not_a_table_is_refused_where_it_is():
    text = profile_text() + "\n[host]\npinned_fraction = 0.5\n"
    with pytest.raises(HardwareProfileError) as raised:
        parse_hardware_profile(text, "bad.toml")
    line = text.splitlines().index("[host]") + 1
    assert raised.value.render().startswith(f"bad.toml:{line}:1: error: missing key 'host.memory'")
    text = "host = 5\n" + profile_text()
    with pytest.raises(HardwareProfileError) as raised:
        parse_hardware_profile(text, "bad.toml")
    assert raised.value.render().startswith("bad.toml:1:1: error: 'host' must be the table [host], got 5")


def test_the_shipped_h200_profile_has_mamba2s_own_curves():
    """mamba2 was measured on the H200 (docs/benchmarks.md, "The 1B mamba2 model on one H200"): it needs no
    stand-in, and simulate's line names no stand-in for it."""
    profile = resolve_hardware("h200")
    assert profile.measurements(ProfiledPart.MAMBA2) and profile.stand_in(ProfiledPart.MAMBA2) is None
    assert "priced" not in profile.describe((ProfiledPart.MAMBA2, ProfiledPart.MLP))


@pytest.mark.parametrize("kind", ["mamba3", "simple_gla"])
def test_an_unmeasured_recurrent_mixer_is_priced_from_a_measured_one_by_flops(kind):
    """The shipped H200 profile times gla, gdn and mamba2, not these: each is gla's curve scaled by its own FLOPs, so its
    time over gla's at the same rows is the ratio of the two layers' FLOPs, and simulate's line names it."""
    from schedlang.lowering.cost import layer_mixer_flops_per_token

    text = SCHEDULE.format(length=4096, mesh="", sequence="", pipeline="").replace(
        "layers = [gla] * 4", f"layers = [gla, {kind}] * 2")
    program = compile_schedule(ScheduleText(text), through=Pass.CHECK).program
    profile = resolve_hardware("h200")
    part = ProfiledPart(kind)
    assert not profile.measurements(part) and profile.stand_in(part) is ProfiledPart.GLA
    assert profile.stand_in(ProfiledPart.GLA) is None and profile.stand_in(ProfiledPart.MLP) is None
    cost = ProfileCostModel(program, profile)
    kernel_chunk = program.sequence.kernel_chunk
    expected = (layer_mixer_flops_per_token(program.model, LayerKind(kind), kernel_chunk)
                / layer_mixer_flops_per_token(program.model, LayerKind.GLA, kernel_chunk))
    for tokens in (1024, 2048):
        ours, gla = cost.part_seconds(part, tokens, 0), cost.part_seconds(ProfiledPart.GLA, tokens, 0)
        for own, measured in zip(ours, gla):
            assert own == pytest.approx(expected * measured, rel=1e-12)
    assert f"not measured, priced: {kind} from gla's curves by FLOPs" in profile.describe(model_parts(program.model))


def test_a_prefetch_before_the_units_forward_does_nothing_and_its_backward_fetches_it():
    """B0.0's next backward is B2.0, whose forward runs after it: the executor's prefetch finds nothing to fetch
    (``ActivationOffload.prefetch``), so B2.0 starts its copy back itself and waits for all of it."""
    text = SCHEDULE.format(length=256, mesh="", sequence="", pipeline="").replace(
        "mesh { pipeline = 2  }", "mesh { pipeline = 1 }"
    ).replace("chunks = 2", "chunks = 1").replace(
        "pipeline { microbatches = 2  }",
        "pipeline { microbatches = 4  offload = true  order = explicit\n"
        "  stage 0: F0.0 F1.0 B0.0 F2.0 F3.0 B2.0 B3.0 B1.0\n}",
    )
    program = compile_schedule(ScheduleText(text), through=Pass.CHECK).program
    slow_host = profile_text().replace("bandwidth = 1e9\n\n[topology]", "bandwidth = 1e3\n\n[topology]")
    model = ProfileCostModel(program, parse_hardware_profile(slow_host))
    copy_seconds = chunk_activation_bytes(program, 0, 0) / 1e3
    fetched_by_itself = TaskId(ActionKind.BACKWARD, 0, 2, 0)
    assert model.task_duration(fetched_by_itself) > copy_seconds
