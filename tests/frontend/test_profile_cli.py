"""``schedlang profile`` (schedlang/commands/profile.py) on the CPU, end to end, and the link measurement on two
gloo processes (runtime/profiling.py)."""

from __future__ import annotations

from pathlib import Path

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


def test_profile_refuses_an_output_in_a_missing_folder_before_measuring(profiled, capsys):
    _, schedule, output = profiled
    missing = output.parent / "missing" / "profile.toml"
    with pytest.raises(SystemExit, match="its folder .*missing does not exist"):
        main(["profile", str(schedule), "--device", "cpu", "-o", str(missing)])
    printed = capsys.readouterr()
    assert "#" not in printed.out + printed.err  # no progress bar: nothing was measured


def test_profile_refuses_cuda_without_a_device(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    schedule = tmp_path / "tiny.sched"
    schedule.write_text(SCHEDULE)
    with pytest.raises(SystemExit, match="no CUDA device is visible"):
        main(["profile", str(schedule), "--device", "cuda", "-o", str(tmp_path / "out.toml")])


@pytest.mark.parametrize("length", ["0", "-512", str(2**31 + 1)])
def test_a_chunk_length_outside_the_checkers_bounds_is_refused_before_measuring(profiled, tmp_path, capsys, length):
    _, schedule, _ = profiled
    with pytest.raises(SystemExit, match=f"--lengths {length}: a chunk length must be in 1 .. 2147483648 tokens"):
        main(["profile", str(schedule), "--device", "cpu", "--lengths", "128", length, "-o", str(tmp_path / "p.toml")])
    assert "#" not in capsys.readouterr().err
    assert not (tmp_path / "p.toml").exists()


@pytest.mark.parametrize("error", [RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't "
                                                "allocate memory: you tried to allocate 799999999992 bytes"),
                                   MemoryError()], ids=["cpu-allocator", "memory-error"])
def test_a_part_that_does_not_fit_memory_is_named_with_its_length(profiled, tmp_path, monkeypatch, error):
    from schedlang.runtime import profiling

    def out_of_memory(*arguments, **options):
        raise error

    monkeypatch.setattr(profiling, "measure_part", out_of_memory)
    _, schedule, _ = profiled
    with pytest.raises(SystemExit, match="error: gla at 4096 tokens does not fit the cpu device's memory; give "
                                         "shorter --lengths"):
        main(["profile", str(schedule), "--device", "cpu", "--lengths", "4096", "-o", str(tmp_path / "p.toml")])
    assert not (tmp_path / "p.toml").exists()


def test_another_failure_of_a_part_is_not_called_memory(profiled, tmp_path, monkeypatch):
    from schedlang.runtime import profiling

    def broken(*arguments, **options):
        raise RuntimeError("cannot reshape tensor")

    monkeypatch.setattr(profiling, "measure_part", broken)
    _, schedule, _ = profiled
    with pytest.raises(RuntimeError, match="cannot reshape tensor"):
        main(["profile", str(schedule), "--device", "cpu", "--lengths", "128", "-o", str(tmp_path / "p.toml")])


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
        # each part's own host times, and with its saved tensors offloaded (the embedding saves token ids alone)
        assert layer.host is not None and layer.host.forward > 0 and layer.host.backward > 0, layer.part
        assert layer.host.offload_measured, layer.part
        # and run as recompute reruns it, for a block's part (the embedding and the head are never rerun so)
        assert layer.host.recompute_measured == (layer.part.value not in ("embedding", "head")), layer.part
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


def test_calibrate_fits_the_host_factor_to_the_host_bound_variant(tmp_path, monkeypatch):
    """With parts that have host times (h200's), --calibrate also runs FILE cut into 64 eager chunks of a short
    sequence and writes the host factor at which that step simulates to the measured one; the variant's
    temporary file is gone afterwards and the user's folder holds only what it held plus the output."""
    from schedlang import profile_calibration
    from schedlang.compiler import Pass, ScheduleText, compile_schedule
    from schedlang.frontend import load_program

    schedule = tmp_path / "one.sched"
    schedule.write_text(SCHEDULE.replace("length = 128  chunks = 2", "length = 65536  chunks = 1"))
    program = load_program(str(schedule))
    h200 = resolve_hardware("h200")
    variant = compile_schedule(
        ScheduleText(profile_calibration.host_bound_text(program), "v.sched"), through=Pass.CHECK
    ).program
    assert (variant.sequence.length, variant.n_chunks, variant.pipeline.cuda_graphs.value) == (32768, 64, "false")
    at_one = profile_calibration.parts_step_seconds(variant, h200)
    asked = []

    def measured(path, device, warmup, steps, timeout):
        asked.append(path)
        text = open(path, encoding="utf-8").read()
        return 2.5 * at_one if "chunks = 64" in text else 1.1 * profile_calibration.parts_step_seconds(program, h200)

    monkeypatch.setattr(profile_calibration, "measure_step_seconds", measured)
    output = tmp_path / "calibrated.toml"
    status = main(["profile", str(schedule), "--device", "cpu", "--calibrate", "--parts-from", "h200",
                   "-o", str(output)])
    assert status == 0 and len(asked) == 2 and asked[0] == str(schedule)
    assert not any(Path(path).exists() for path in asked[1:])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["calibrated.toml", "one.sched"]
    calibration = load_hardware_profile(output).calibration
    assert calibration.step_factor == pytest.approx(1.1, rel=1e-5)
    assert calibration.host_parts_step_seconds == pytest.approx(at_one, rel=1e-6)
    assert calibration.host_schedule.startswith("one.sched with length = 32768, chunks = 64")
    # the factor reproduces the measured host-bound step; host-bound, it is the step's ratio to factor 1
    refit = profile_calibration.simulated_step_seconds(variant, load_hardware_profile(output))
    assert refit == pytest.approx(2.5 * at_one, rel=1e-6)
    assert calibration.host_factor == pytest.approx(2.5, rel=0.05)
    assert "# host calibration: one.sched with length = 32768" in output.read_text()


def test_a_host_bound_step_no_factor_reaches_is_refused():
    from schedlang.compiler import Pass, ScheduleText, compile_schedule
    from schedlang.profile_calibration import CalibrationError, fitted_host_factor, host_bound_text

    program = compile_schedule(ScheduleText(SCHEDULE, "tiny.sched"), through=Pass.CHECK).program
    variant = compile_schedule(ScheduleText(host_bound_text(program), "v.sched"), through=Pass.CHECK).program
    with pytest.raises(CalibrationError, match="for host factors 0.25x-4x"):
        fitted_host_factor(variant, resolve_hardware("h200"), 1e3)


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


def test_parts_from_without_calibrate_or_measure_is_refused(tmp_path):
    schedule = tmp_path / "tiny.sched"
    schedule.write_text(SCHEDULE)
    with pytest.raises(SystemExit, match="--parts-from serves --calibrate or --measure"):
        main(["profile", str(schedule), "--device", "cpu", "--parts-from", "h200", "-o", str(tmp_path / "o.toml")])
    with pytest.raises(SystemExit, match="--measure re-times parts of --parts-from PROFILE"):
        main(["profile", str(schedule), "--device", "cpu", "--measure", "attn", "-o", str(tmp_path / "o.toml")])
    with pytest.raises(SystemExit, match="--measure gdn: .* has no such part; it has gla, attn, mlp"):
        main(["profile", str(schedule), "--device", "cpu", "--parts-from", "h200", "--measure", "gdn",
              "-o", str(tmp_path / "o.toml")])
    assert not (tmp_path / "o.toml").exists()


def test_measure_merges_new_lengths_into_rows_of_the_same_geometry(profiled, tmp_path):
    """--parts-from P --measure gla --lengths 16 64: P's gla row gains 16 tokens and its 64-token point is timed
    again; its 32-token point and every other row stay P's."""
    _, schedule, parts = profiled
    output = tmp_path / "merged.toml"
    assert main(["profile", str(schedule), "--device", "cpu", "--parts-from", str(parts), "--measure", "gla",
                 "--lengths", "16", "64", "--repeats", "1", "-o", str(output)]) == 0
    earlier, merged = load_hardware_profile(parts), load_hardware_profile(output)
    assert len(merged.layers) == len(earlier.layers)
    for old, new in zip(earlier.layers, merged.layers):
        if old.part is not ProfiledPart.GLA:
            assert new == old
            continue
        assert new.forward.tokens == (16, 32, 64)
        assert new.forward.seconds[1] == old.forward.seconds[0]  # 32 tokens: kept
        assert all(seconds > 0 for seconds in new.forward.seconds)


def test_measure_times_the_named_parts_again_and_keeps_the_rest(profiled, tmp_path):
    """--parts-from h200 --measure attn: this machine's attn rows (at the schedule's lengths and prefixes; a
    width h200 never measured, so added beside h200's), every other row and the calibration h200's."""
    _, schedule, _ = profiled
    output = tmp_path / "mixed.toml"
    assert main(["profile", str(schedule), "--device", "cpu", "--parts-from", "h200", "--measure", "attn",
                 "--repeats", "1", "-o", str(output)]) == 0
    h200, mixed = resolve_hardware("h200"), load_hardware_profile(output)
    assert mixed.layers[: len(h200.layers)] == h200.layers
    attention = mixed.layers[len(h200.layers):]
    assert sorted(layer.prefix for layer in attention) == [0, 64]
    assert all(layer.forward.tokens == (32, 64) and layer.d_model == 32 for layer in attention)
    assert mixed.calibration == h200.calibration
    assert "--measure attn` on CPU" in output.read_text()


@pytest.mark.parametrize("kind", ["mamba2", "mamba3"])
def test_profile_times_the_mamba_layers_and_simulate_reads_them(tmp_path, kind, capsys):
    """A Mamba layer is a part of its own: profiled on the CPU, read back by simulate; the shipped H200 profile,
    prices mamba3, which it never timed, from a measured recurrent mixer's curves by FLOPs and says so, and
    mamba2 from its own curves (measured on the H200)."""
    schedule = tmp_path / "mamba.sched"
    schedule.write_text(SCHEDULE.replace("layers = [gla, attn]", f"layers = [{kind}, attn]"))
    output = tmp_path / "mamba.toml"
    assert main(["profile", str(schedule), "--device", "cpu", "-o", str(output), "--repeats", "1"]) == 0
    profile = load_hardware_profile(output)
    mixer = [layer for layer in profile.layers if layer.part is ProfiledPart(kind)]
    assert mixer and mixer[0].heads == 2 and mixer[0].head_dim == 16
    assert main(["simulate", str(schedule), "--hardware", str(output)]) == 0
    capsys.readouterr()
    assert main(["simulate", str(schedule), "--hardware", "h200"]) == 0
    line = next(row for row in capsys.readouterr().out.splitlines() if row.startswith("hardware profile h200"))
    if kind == "mamba3":
        assert "not measured, priced: mamba3 from gla's curves by FLOPs" in line
    else:
        assert "priced" not in line


def test_a_part_is_timed_with_its_saved_tensors_offloaded():
    """On the CPU the offload hooks run their bookkeeping without copies: the path runs end to end and its
    host times are recorded beside the plain ones (``schedlang profile`` keeps them on CUDA alone)."""
    import torch

    from schedlang.compiler import Pass, ScheduleText, compile_schedule
    from schedlang.runtime.profiling import measure_part

    config = compile_schedule(ScheduleText(SCHEDULE), through=Pass.CHECK).program.model
    timing = measure_part(config, "gla", 64, torch.device("cpu"), torch.float32, repeats=1, offload_host=True)
    assert timing.host_offload_forward_s > 0 and timing.host_offload_backward_s > 0
    plain = measure_part(config, "gla", 64, torch.device("cpu"), torch.float32, repeats=1)
    assert plain.host_offload_forward_s == plain.host_offload_backward_s == 0.0


@pytest.mark.parametrize("part", ["gla", "mlp"])
def test_a_part_is_timed_as_recompute_reruns_it(part, monkeypatch):
    """recompute_host: the part runs under the runtime's checkpoint, so its backward runs its forward again: two
    more calls of the part (warm-up and one repeat), each under its recompute mode, beside the plain timing's."""
    import torch

    from schedlang.compiler import Pass, ScheduleText, compile_schedule
    from schedlang.runtime import model as runtime_model
    from schedlang.runtime.profiling import measure_part
    from schedlang.vocabulary import Recompute

    config = compile_schedule(ScheduleText(SCHEDULE), through=Pass.CHECK).program.model
    method = "_mix" if part == "gla" else "_feed_forward"
    original = getattr(runtime_model.Block, method)
    calls = []

    def counted(self, *inputs):
        calls.append(self.recompute)
        return original(self, *inputs)

    monkeypatch.setattr(runtime_model.Block, method, counted)
    plain = measure_part(config, part, 64, torch.device("cpu"), torch.float32, repeats=1)
    plain_calls = len(calls)
    calls.clear()
    timing = measure_part(config, part, 64, torch.device("cpu"), torch.float32, repeats=1, recompute_host=True)
    assert plain.host_recompute_forward_s == plain.host_recompute_backward_s == 0.0
    assert timing.host_recompute_forward_s > 0 and timing.host_recompute_backward_s > 0
    rerun = Recompute.MIXER if part == "gla" else Recompute.MLP
    # warm-up and repeats: each forward under the checkpoint once, then again in its backward
    assert calls.count(rerun) == 2 * 2 and len(calls) == plain_calls + 2 * 2
    assert all(mode is Recompute.NONE for mode in calls if mode is not rerun)


def test_a_parts_host_row_reads_each_host_time_of_its_timing():
    """``part_host``: each host figure goes to its own field (distinct values, so a swapped pair fails)."""
    from schedlang.commands.profile import part_host
    from schedlang.lowering.hardware_profile import PartHost
    from schedlang.runtime.profiling import PartTiming

    timing = PartTiming("gla", 512, 0, 1.0, 2.0, 3.0, 11e-4, 12e-4, 13e-4, 14e-4, 15e-4, 16e-4)
    assert part_host(timing) == PartHost(
        forward=11e-4, backward=12e-4, offload_forward=13e-4, offload_backward=14e-4,
        recompute_forward=15e-4, recompute_backward=16e-4,
    )
