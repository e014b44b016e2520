"""``schedlang profile`` (schedlang/commands/profile.py) on the CPU, end to end, and the link measurement on two
gloo processes (runtime/profiling.py)."""

from __future__ import annotations

import pytest

from schedlang.cli import main
from schedlang.lowering.hardware_profile import LinkClass, Origin, ProfiledPart, load_hardware_profile, resolve_hardware
from schedlang.runtime.host_memory import physical_memory_bytes
from schedlang.runtime.profiling import fit_latency_bandwidth, measure_links

SCHEDULE = """schedule tiny
model {
  vocab = 128
  d_model = 32
  layers = [gla, attn]
  heads = 2
  head_dim = 16
  mlp = swiglu(ratio = 2)
}
mesh { pipeline = 1 }
sequence { length = 128  chunks = 2 }
pipeline { microbatches = 1 }
"""


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    directory = tmp_path_factory.mktemp("profile")
    schedule = directory / "tiny.sched"
    schedule.write_text(SCHEDULE)
    output = directory / "tiny.toml"
    status = main(["profile", str(schedule), "--device", "cpu", "-o", str(output), "--repeats", "1"])
    return status, schedule, output


def test_profile_measures_every_part_the_model_has(profiled, capsys):
    status, schedule, output = profiled
    assert status == 0
    profile = load_hardware_profile(output)
    assert profile.origin is Origin.MEASURED and profile.name == "tiny"
    parts = {layer.part for layer in profile.layers}
    assert parts == {ProfiledPart.GLA, ProfiledPart.ATTN, ProfiledPart.MLP, ProfiledPart.EMBEDDING, ProfiledPart.HEAD}
    for layer in profile.layers:
        assert layer.forward.tokens == (32, 64)  # the chunk length and half of it
        assert all(seconds > 0 for seconds in layer.forward.seconds)
    prefixes = sorted(layer.prefix for layer in profile.layers if layer.part is ProfiledPart.ATTN)
    assert prefixes == [0, 64]  # no prefix, and the last chunk's
    defaults = resolve_hardware("h200")
    assert profile.links == defaults.links  # one device: every link from the defaults
    assert "links: defaults of the h200 profile" in profile.note
    header = output.read_text().splitlines()[2]
    assert header.startswith("# from the h200 profile's defaults, not measured: every link")
    assert profile.host.memory_bytes == physical_memory_bytes()  # this machine's RAM, for offload's copies
    assert output.read_text().splitlines()[3].startswith("# host memory: ")
    # and simulate reads it
    assert main(["simulate", str(schedule), "--hardware", str(output)]) == 0
    assert f"hardware profile tiny ({output}; measured:" in capsys.readouterr().out


def test_profile_keeps_an_existing_output_without_force(profiled):
    _, schedule, output = profiled
    before = output.read_text()
    with pytest.raises(SystemExit, match="already exists; give --force"):
        main(["profile", str(schedule), "--device", "cpu", "-o", str(output)])
    assert output.read_text() == before


def test_profile_refuses_cuda_without_a_device(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    schedule = tmp_path / "tiny.sched"
    schedule.write_text(SCHEDULE)
    with pytest.raises(SystemExit, match="no CUDA device is visible"):
        main(["profile", str(schedule), "--device", "cuda", "-o", str(tmp_path / "out.toml")])


def test_latency_and_bandwidth_fit_two_sizes():
    fit = fit_latency_bandwidth((1000, 1e-5 + 1000 / 1e9), (1_000_000, 1e-5 + 1_000_000 / 1e9))
    assert fit.latency_s == pytest.approx(1e-5)
    assert fit.bandwidth_bytes_per_s == pytest.approx(1e9)


@pytest.mark.slow
def test_links_are_measured_between_two_processes():
    links = measure_links(2, "gloo", "cpu")
    assert set(links) == {link_class.value for link_class in LinkClass if link_class is not LinkClass.INTER_NODE}
    for fit in links.values():
        assert fit.latency_s >= 0 and fit.bandwidth_bytes_per_s > 0


@pytest.mark.gpu
def test_profile_on_the_gpu_writes_kernel_times(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    schedule = tmp_path / "tiny.sched"
    schedule.write_text(SCHEDULE.replace("pipeline = 1 }", "pipeline = 1 }\ntrain { dtype = bf16 }"))
    output = tmp_path / "gpu.toml"
    assert main(["profile", str(schedule), "--device", "cuda", "-o", str(output), "--lengths", "64", "256"]) == 0
    profile = load_hardware_profile(output)
    assert "NVIDIA" in profile.device or "GPU" in profile.device
    for layer in profile.layers:
        assert all(seconds > 0 for seconds in layer.forward.seconds), layer.part
    assert profile.overhead.eager_layer_seconds > 0
    assert profile.memory_bandwidth_bytes_per_s > 1e11


def test_calibrate_writes_the_whole_steps_ratio_to_its_parts(profiled, tmp_path, monkeypatch):
    """--calibrate --parts-from: the factor written is the measured step over the parts' step, the parts are the
    earlier profile's, and simulate with the result predicts the measured step. (The step is measured by
    test_the_calibration_run_trains_the_schedule; here it is 1.3x the parts', since a tiny CPU step's ratio to
    its parts timed alone is noise.)"""
    from schedlang import profile_calibration
    from schedlang.frontend import load_program
    from schedlang.lowering.orders import stage_orders
    from schedlang.lowering.profile_cost import ProfileCostModel
    from schedlang.lowering.simulate import simulate

    _, schedule, parts = profiled
    program = load_program(str(schedule))
    earlier = load_hardware_profile(parts)
    parts_seconds = profile_calibration.parts_step_seconds(program, earlier)
    asked = []

    def measured(path, device, warmup, steps, timeout):
        asked.append((path, device, warmup, steps))
        return 1.3 * parts_seconds

    monkeypatch.setattr(profile_calibration, "measure_step_seconds", measured)
    output = tmp_path / "calibrated.toml"
    status = main([
        "profile", str(schedule), "--device", "cpu", "--calibrate", "--parts-from", str(parts),
        "--calibration-steps", "4", "-o", str(output),
    ])
    assert status == 0 and asked == [(str(schedule), "cpu", 2, 4)]
    profile = load_hardware_profile(output)
    assert profile.layers == earlier.layers and profile.name == "calibrated"
    calibration = profile.calibration
    assert calibration.schedule == "tiny.sched"
    assert calibration.step_factor == pytest.approx(1.3, rel=1e-5)
    assert calibration.parts_step_seconds == pytest.approx(parts_seconds, rel=1e-5)
    predicted = simulate(program, stage_orders(program), ProfileCostModel(program, profile)).makespan
    assert predicted == pytest.approx(calibration.measured_step_seconds, rel=1e-3)
    header = output.read_text()
    assert f"# Parts from {parts}:" in header and "# calibration: `schedlang run tiny.sched` measured" in header


def test_the_calibration_run_trains_the_schedule(profiled):
    from schedlang.profile_calibration import measure_step_seconds

    _, schedule, _ = profiled
    assert measure_step_seconds(str(schedule), "cpu", 1, 1, timeout=300) > 0


def test_a_calibration_far_from_its_parts_is_refused(profiled):
    from schedlang.profile_calibration import CalibrationError, calibrated

    _, _, parts = profiled
    profile = load_hardware_profile(parts)
    assert calibrated(profile, "x.sched", 1.2, 1.0).calibration.step_factor == pytest.approx(1.2)
    with pytest.raises(CalibrationError, match="outside 0.5x-2x"):
        calibrated(profile, "x.sched", 2.5, 1.0)


def test_calibrate_refuses_a_schedule_of_several_ranks(tmp_path):
    schedule = tmp_path / "pp2.sched"
    schedule.write_text(SCHEDULE.replace("layers = [gla, attn]", "layers = [gla, attn, gla, attn]")
                        .replace("mesh { pipeline = 1 }", "mesh { pipeline = 2 }"))
    with pytest.raises(SystemExit, match="--calibrate trains the schedule on one device; its mesh has 2 ranks"):
        main(["profile", str(schedule), "--device", "cpu", "--calibrate", "--parts-from", "h200",
              "-o", str(tmp_path / "out.toml")])
    assert not (tmp_path / "out.toml").exists()


def test_parts_from_without_calibrate_is_refused(tmp_path):
    schedule = tmp_path / "tiny.sched"
    schedule.write_text(SCHEDULE)
    with pytest.raises(SystemExit, match="--parts-from only serves --calibrate"):
        main(["profile", str(schedule), "--device", "cpu", "--parts-from", "h200", "-o", str(tmp_path / "o.toml")])
