"""``schedlang tune``: the pruned search against an exhaustive one, the file it writes, and its refusals."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from schedlang.cli import main
from schedlang.commands.simulate_fit import GIB
from schedlang.compiler import CostSettings, Pass, ScheduleText, compile_schedule, revise
from schedlang.frontend import load_program, load_program_text
from schedlang.lowering.cost import CostModelKind, Hardware, make_cost_model
from schedlang.lowering.hardware_profile import DEFAULT_PINNED_FRACTION
from schedlang.lowering.memory_budget import OUTSIDE_THE_ALLOCATOR
from schedlang.lowering.memory_peak import Component, predict_memory
from schedlang.tuning.search import TuneSettings, fits_at, search
from schedlang.tuning.space import Knobs, layouts, schedule_changes
from schedlang.tuning.writing import relocated_text, tuned_text
from schedlang.vocabulary import CudaGraphs, Recompute
from schedlang.vocabulary.actions import ActionKind, TaskId

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE_PATHS = sorted(EXAMPLES.glob("*.sched"))
FLOPS = CostSettings(CostModelKind.FLOPS, Hardware())

SMALL = """\
# a small space: two stages, two microbatches, gpipe
schedule small

model {
  vocab    = 256
  d_model  = 64
  layers   = [gla, gla]
  heads    = 2
  head_dim = 32
}

mesh { pipeline = 2 }

sequence {
  length       = 2048
  chunks       = {chunks}      # cut in pieces
  kernel_chunk = 64
}

pipeline {
  microbatches = 2
  order        = {order}
}
"""


def small_program(order: str = "gpipe", chunks: int = 2):
    return load_program_text(SMALL.replace("{order}", order).replace("{chunks}", str(chunks)), "small.sched")


def memory_between_modes(program) -> int:
    """A device on which the file's stage 0 fits with full recomputation but not without any (from the memory
    model, so the search has to choose modes)."""
    peaks = {}
    for mode in (Recompute.NONE, Recompute.FULL):
        variant = compile_schedule(
            ScheduleText(program.source_text.replace("order        = ", f"recompute = {mode.value}\n  order = "),
                         program.source_file),
            through=Pass.ORDER,
        )
        peaks[mode] = max(stage.reserved for stage in predict_memory(variant.program, variant.orders))
    assert peaks[Recompute.FULL] < peaks[Recompute.NONE]
    return int(OUTSIDE_THE_ALLOCATOR + (peaks[Recompute.FULL] + peaks[Recompute.NONE]) / 2)


def compare_with_exhaustive(program, settings: TuneSettings) -> None:
    """The pruned search's pick is as fast as the fastest candidate of the whole space, compiling fewer."""
    pruned = search(program, settings)
    everything = search(program, TuneSettings(**{**settings.__dict__, "prune": False, "top": 10**6}))
    assert pruned.candidates and everything.candidates
    assert pruned.candidates[0].makespan == pytest.approx(everything.candidates[0].makespan, rel=1e-12)
    assert all(candidate.makespan >= everything.candidates[0].makespan for candidate in pruned.candidates)
    assert pruned.stats.compiled < everything.stats.compiled


def test_pruned_search_finds_the_fastest_of_an_exhaustive_search_when_memory_binds():
    program = small_program("gpipe")
    settings = TuneSettings(FLOPS, memory_between_modes(program), max_chunks=4, device="cpu", top=3)
    everything = search(program, TuneSettings(**{**settings.__dict__, "prune": False, "top": 10**6}))
    modes = {candidate.knobs.recompute for candidate in everything.candidates}
    assert len(modes) > 1 and everything.stats.not_fitting > 0  # memory binds: some candidates do not fit
    compare_with_exhaustive(program, settings)


def test_under_step_graphs_the_search_recomputes_full_and_nothing_else_when_memory_binds():
    """On CUDA, where memory binds, the space holds step graphs with ``recompute = full`` on a stage (the one
    recomputation a captured step runs: ``graph_recompute_modes``), never graphs with ``mlp`` or ``mixer``, and
    the pruned search still finds the exhaustive search's fastest."""
    program = small_program("gpipe")
    settings = TuneSettings(FLOPS, memory_between_modes(program), max_chunks=4, device="cuda", top=3)
    everything = search(program, TuneSettings(**{**settings.__dict__, "prune": False, "top": 10**6})).candidates
    graphed = [candidate.knobs for candidate in everything if candidate.knobs.cuda_graphs]
    assert any(knobs.cuda_graphs is CudaGraphs.STEP and Recompute.FULL in knobs.recompute for knobs in graphed)
    allowed = {CudaGraphs.STEP: {Recompute.NONE, Recompute.FULL}, CudaGraphs.CHUNK_SLOTS: {Recompute.NONE}}
    assert all(set(knobs.recompute) <= allowed[knobs.cuda_graphs] for knobs in graphed)
    compare_with_exhaustive(program, settings)


def test_eager_4k_chunks_are_marked_host_bound_and_graphs_are_not(capsys):
    """At 256K on the H200 profile, 64 eager chunks of 4K tokens are priced by the host's launches on every task
    (their prediction holds for the calibrated host only: docs/benchmarks.md, "The host-bound rows"); the same
    chunks replayed from step graphs, and 8 eager chunks of 32K, are priced by the device."""
    arguments = [str(ONE_DEVICE), "--hardware", "h200", "--length", "262144", "--dominated", "--top", "40", "--json"]
    assert run_tune(*arguments) == 0
    candidates = json.loads(capsys.readouterr().out)["candidates"]

    def share(chunks: str, graphs: str | None) -> float:
        (found, *_) = [candidate["host_bound_share"] for candidate in candidates
                       if candidate["changes"].get("sequence.chunks") == chunks
                       and candidate["changes"].get("pipeline.cuda_graphs") == graphs]
        return found

    assert share("64", None) == 1.0
    assert share("64", "step") == 0.0 and share("8", None) == 0.0


def test_pruned_search_finds_the_fastest_of_an_exhaustive_search_when_the_host_binds():
    """A host that holds some offloading candidates' copies and not others: the pruning (rule 5 weighs pinned
    bytes too) still finds the exhaustive search's fastest, and no listed candidate pins past the host."""
    program = small_program("gpipe")
    roomy = TuneSettings(FLOPS, memory_between_modes(program), max_chunks=4, device="cpu", top=3)
    everything = search(program, TuneSettings(**{**roomy.__dict__, "prune": False, "top": 10**6})).candidates
    pinned = sorted({max(stage.pinned_host for stage in candidate.memory) for candidate in everything} - {0.0})
    assert len(pinned) > 1  # offloading candidates of several sizes
    host = int((pinned[0] + pinned[-1]) / 2 / DEFAULT_PINNED_FRACTION)
    bound = TuneSettings(**{**roomy.__dict__, "host_memory": host})
    compare_with_exhaustive(program, bound)
    fitting = search(program, TuneSettings(**{**bound.__dict__, "prune": False, "top": 10**6})).candidates
    assert len(fitting) < len(everything)
    assert any(candidate.knobs.offload for candidate in fitting)
    for candidate in fitting:  # no profile: a node is one GPU, so each stage is held to the pinned share alone
        assert all(stage.pinned_host <= DEFAULT_PINNED_FRACTION * host for stage in candidate.memory)


@pytest.mark.slow
def test_pruned_search_finds_the_fastest_of_an_exhaustive_search_over_1f1b_placements():
    program = small_program("1f1b", chunks=1)
    settings = TuneSettings(FLOPS, memory_between_modes(program), max_chunks=1, device="cpu", top=2)
    compare_with_exhaustive(program, settings)


def test_every_candidate_is_the_file_revised_and_fits():
    program = load_program(EXAMPLES / "hybrid_balanced.sched")
    device_memory = 4 * GIB
    result = search(program, TuneSettings(FLOPS, device_memory, max_chunks=8, device="cuda", top=4))
    assert len(result.candidates) == 4
    makespans = [candidate.makespan for candidate in result.candidates]
    assert makespans == sorted(makespans)
    for candidate in result.candidates:
        rechecked = compile_schedule(ScheduleText(candidate.program.source_text, "again.sched"), through=Pass.COST,
                                     cost=FLOPS)
        assert rechecked.timeline.makespan == pytest.approx(candidate.makespan, rel=1e-12)
        for stage in predict_memory(rechecked.program, rechecked.orders):
            assert stage.reserved + OUTSIDE_THE_ALLOCATOR <= device_memory
        assert candidate.changes  # the file's own 4 chunks do not fit: every candidate changes something
        for name, value in candidate.changes:
            assert value in candidate.program.source_text and name.split(".")[1] in candidate.program.source_text


def test_schedule_changes_are_only_the_keys_that_differ():
    program = load_program(EXAMPLES / "gla_stateflow.sched")
    layout = next(
        layout for layout in layouts(program, program.sequence.length, None, 64)
        if (layout.microbatches, layout.chunks) == (program.n_microbatches, program.n_chunks)
    )
    same = Knobs(recompute=(Recompute.NONE,) * 2)
    assert schedule_changes(program, layout, same) == {}
    changed = schedule_changes(program, layout, Knobs(extra_warmup=1, recompute=(Recompute.FULL, Recompute.NONE)))
    assert changed == {"pipeline.extra_warmup": 1, "pipeline.recompute": [Recompute.FULL, Recompute.NONE]}


def run_tune(*arguments):
    return main(["tune", *arguments])


def test_output_keeps_comments_and_unchanged_keys_and_checks(tmp_path, capsys):
    output = tmp_path / "tuned.sched"
    source = EXAMPLES / "gla_text.sched"
    assert run_tune(str(source), "--device", "cpu", "--max-chunks", "4", "-o", str(output)) == 0
    printed = capsys.readouterr().out
    assert f"wrote {output}" in printed
    written = output.read_text()
    original = source.read_text()
    for line in original.splitlines():
        if line.lstrip().startswith("#"):
            assert line in written  # comments kept
    assert "vocab    = 256        # bytes" in written
    assert not any("=" in line and line.rstrip().endswith("}") for line in written.splitlines())  # added: own lines
    assert main(["check", str(output)]) == 0
    program = load_program(output)
    assert program.train.data.path is None and program.model.vocab == 256


def test_output_is_never_written_over_without_force_nor_over_the_input(tmp_path):
    output = tmp_path / "exists.sched"
    output.write_text("keep me")
    source = str(EXAMPLES / "gla_stateflow.sched")
    with pytest.raises(SystemExit, match="already exists; give --force"):
        run_tune(source, "-o", str(output))
    assert output.read_text() == "keep me"
    with pytest.raises(SystemExit, match="is the input schedule"):
        run_tune(source, "-o", source, "--force")
    assert run_tune(source, "--device", "cpu", "--max-chunks", "2", "-o", str(output), "--force") == 0
    assert output.read_text().startswith("# The default example")


def test_output_into_a_missing_folder_or_over_a_link_is_refused_before_the_search(tmp_path):
    """A missing folder is named before minutes of search; a link is replaced with --force, never written
    through (its target, here one that does not exist yet, is not created)."""
    source = str(EXAMPLES / "gla_stateflow.sched")
    with pytest.raises(SystemExit, match="its folder .*missing does not exist"):
        run_tune(source, "-o", str(tmp_path / "missing" / "tuned.sched"))
    link, target = tmp_path / "tuned.sched", tmp_path / "target.sched"
    link.symlink_to(target)
    with pytest.raises(SystemExit, match="already exists; give --force"):
        run_tune(source, "-o", str(link))
    assert run_tune(source, "--device", "cpu", "--max-chunks", "2", "-o", str(link), "--force") == 0
    assert not link.is_symlink() and not target.exists() and main(["check", str(link)]) == 0


def test_tuned_text_rewrites_in_place_adds_lines_and_blocks():
    text = SMALL.replace("{order}", "1f1b").replace("{chunks}", "2")
    tuned = tuned_text(text, "small.sched", {
        "sequence.chunks": 8, "pipeline.split_backward": True, "mesh.data": 2, "train.steps": 3,
    })
    assert "  chunks       = 8      # cut in pieces" in tuned.splitlines()
    assert "  order        = 1f1b\n  split_backward = true\n}" in tuned
    assert "mesh { pipeline = 2  data = 2 }" in tuned  # a one-line block keeps its line
    assert tuned.endswith("}\n\ntrain {\n  steps = 3\n}\n")
    program = load_program_text(tuned, "small.sched")
    assert (program.n_chunks, program.pipeline.split_backward, program.mesh.data, program.train.steps) == (8, True, 2, 3)


def test_dash_prints_the_schedule_alone(capsys):
    assert run_tune(str(EXAMPLES / "gla_stateflow.sched"), "-o", "-", "--max-chunks", "2", "--device", "cpu") == 0
    printed = capsys.readouterr().out
    assert printed.startswith("# The default example") and "rank" not in printed
    assert load_program_text(printed, "printed.sched").n_stages == 2


def test_relative_paths_are_moved_to_the_output_directory(tmp_path):
    text = (EXAMPLES / "fla_gla.sched").read_text()
    moved = relocated_text(text, str(EXAMPLES / "fla_gla.sched"), str(tmp_path / "deep" / "out.sched"))
    (tmp_path / "deep").mkdir()
    (tmp_path / "deep" / "out.sched").write_text(moved)
    assert moved != text and 'hf(path = "hf/gla_tiny")' in text
    assert main(["check", str(tmp_path / "deep" / "out.sched")]) == 0
    assert relocated_text(text, str(EXAMPLES / "fla_gla.sched"), str(EXAMPLES / "other.sched")) == text


def test_nothing_fits_names_the_binding_stage_and_term(capsys):
    assert run_tune(str(EXAMPLES / "gla_stateflow.sched"), "--device-memory", "1540MiB", "--max-chunks", "2") == 1
    error = capsys.readouterr().err
    assert "nothing in the space fits 1.5 GiB at 4096 tokens" in error
    assert "on stage" in error and "whose largest term is" in error
    assert any(f"largest term is {component.value}" in error for component in Component)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--top", "0"], "--top must be positive, got 0"),
        (["--world", "0"], "--world must be positive, got 0"),
        (["--world", str(2**16 + 1)], f"--world {2**16 + 1} is more than the limit of 65536 ranks a mesh may have"),
        (["--length", "-5"], "--length must be in 1 .. 2147483648 .*, got -5"),
        (["--length", str(2**31 + 1)], f"--length must be in 1 .. 2147483648 .*, got {2**31 + 1}"),
        (["--fit", "--max-length", str(2**40)], f"--max-length must be in 1 .. 2147483648 .*, got {2**40}"),
        (["--fit", "--step", "1"], "in steps of 1 gives .* lengths, more than 65536: give a larger --step"),
        (["--max-chunks", "0"], "--max-chunks must be in 1 .. "),
        (["--cost-model", "unit"], "--cost-model unit has no seconds to rank by"),
        (["--throughput", "0"], "--throughput must be positive"),
        (["-o", "-", "--json"], "where --json prints its object; choose one"),
        (["--hardware", "h200", "--cost-model", "flops"], "--hardware gives the profile cost model"),
    ],
)
def test_bad_flags_are_refused_before_any_work(arguments, message):
    with pytest.raises(SystemExit, match=message.replace("(", r"\(")):
        run_tune(str(EXAMPLES / "gla_stateflow.sched"), *arguments)


def test_hardware_profile_times_the_candidates(capsys):
    assert run_tune(str(EXAMPLES / "gla_stateflow.sched"), "--hardware", "h200", "--max-chunks", "2", "--top", "1") == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[1].startswith("hardware profile h200")
    with pytest.raises(SystemExit) as refused:
        run_tune(str(EXAMPLES / "gla_stateflow.sched"), "--hardware", "missing.toml")
    assert refused.value.code == 2
    assert "no hardware profile 'missing.toml'" in capsys.readouterr().err


def test_a_space_the_checker_refuses_whole_shows_the_first_refusal(capsys):
    assert run_tune(str(EXAMPLES / "simple_gla_gpipe.sched"), "--length", "8192") == 1
    error = capsys.readouterr().err.splitlines()
    assert error[-4].endswith("the checker refuses every candidate of the space; the first, in its revised text:")
    assert error[-3].endswith(":20:34: error: the last chunk boundary must be the sequence length 8192, found 4096")
    assert error[-1] == " " * 33 + "^~~~"


def test_world_is_refused_for_an_explicit_order():
    with pytest.raises(SystemExit, match="an explicit order is written for its own mesh"):
        run_tune(str(EXAMPLES / "explicit_order.sched"), "--world", "4")


def test_a_bad_device_memory_is_shown_at_its_column():
    with pytest.raises(SystemExit) as refused:
        run_tune("f.sched", "--device-memory", "12XB")
    lines = str(refused.value).splitlines()
    assert lines[0].endswith("error: --device-memory: unknown unit 'XB': write one of B, KB, MB, GB, TB, KiB, MiB, "
                             "GiB, TiB")
    assert lines[1] == "schedlang tune f.sched --device-memory 12XB"
    assert lines[2].index("^") == lines[1].index("XB")


def test_same_answer_twice_and_json(capsys):
    source = str(EXAMPLES / "hybrid_long_context.sched")
    answers = []
    for _ in range(2):
        assert run_tune(source, "--json", "--max-chunks", "4", "--top", "3") == 0
        answer = json.loads(capsys.readouterr().out)
        answer.pop("seconds")
        answers.append(answer)
    assert answers[0] == answers[1]
    first = answers[0]["candidates"][0]
    assert first["rank"] == 1 and first["tokens_per_second"] == pytest.approx(
        1024 * 2 / first["step_seconds"]
    )  # two sequences of 1024 tokens per step


def test_world_factorises_the_mesh():
    program = load_program(EXAMPLES / "gla_stateflow.sched")
    result = search(program, TuneSettings(FLOPS, 140 * GIB, world=8, max_chunks=4, top=5))
    assert result.candidates
    for candidate in result.candidates:
        mesh = candidate.program.mesh
        assert mesh.pipeline * mesh.sequence * mesh.data == 8
        pipeline = candidate.program.pipeline
        assert pipeline.microbatches * pipeline.microbatch_size * mesh.data == 4  # the file's global batch
    meshes = {layout.pipeline for layout in layouts(program, 4096, 8, 4)}
    assert meshes == {1, 2, 4}  # at most one stage per layer


def test_fit_tunes_at_a_length_that_fits_whose_next_step_does_not(capsys):
    source = EXAMPLES / "gla_stateflow.sched"
    step, device_memory = 2048, "1600MiB"
    assert main(["tune", str(source), "--fit", "--step", str(step), "--max-length", str(64 * step), "--device-memory",
                 device_memory, "--max-chunks", "16", "--top", "1", "--json"]) == 0
    length = json.loads(capsys.readouterr().out)["length"]
    settings = TuneSettings(FLOPS, 1600 * 2**20, max_chunks=16, top=1)
    program = load_program(source)
    assert length % step == 0 and step < length < 64 * step
    assert fits_at(program, settings, length) and not fits_at(program, settings, length + step)


def train_one_step(schedule: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "schedlang", "run", str(schedule), "--steps", "1", "--device", "cpu"],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]


def tune_and_train(example: Path, tmp_path: Path) -> None:
    output = tmp_path / f"tuned_{example.name}"
    started = time.process_time()
    assert run_tune(str(example), "--device", "cpu", "-o", str(output)) == 0
    assert time.process_time() - started < 60  # seconds of CPU: the bound for every example
    assert main(["check", str(output)]) == 0
    train_one_step(output)


def test_tuned_example_trains_a_step(tmp_path):
    tune_and_train(EXAMPLES / "gla_stateflow.sched", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLE_PATHS, ids=lambda path: path.stem)
def test_every_tuned_example_checks_and_trains_a_step(example, tmp_path):
    tune_and_train(example, tmp_path)


ONE_DEVICE = Path(__file__).resolve().parents[2] / "benchmarks" / "schedules" / "gla_1b_one_device.sched"


def offloads(candidate: dict) -> bool:
    return candidate["changes"].get("pipeline.offload") == "true"


def test_at_256k_on_the_h200_no_candidate_offloads_past_its_host_memory(capsys):
    """The offloading candidates, each pinning more than the 96 GiB the H200's 128 GiB machine allows (122 GiB and
    up), are gone; a 1 TB host takes them back."""
    arguments = [str(ONE_DEVICE), "--hardware", "h200", "--length", "262144", "--dominated", "--top", "40", "--json"]
    assert run_tune(*arguments) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["host_memory"]["memory_gib"] == 128 and answer["host_memory"]["pinned_limit_gib"] == 96
    assert answer["candidates"] and not any(offloads(candidate) for candidate in answer["candidates"])
    assert all(max(candidate["pinned_host_gib"]) == 0 for candidate in answer["candidates"])
    assert run_tune(*arguments, "--host-memory", "1TB") == 0
    answer = json.loads(capsys.readouterr().out)
    offloading = [candidate for candidate in answer["candidates"] if offloads(candidate)]
    assert offloading and all(max(candidate["pinned_host_gib"]) > 96 for candidate in offloading)


WIDE_MLP = """\
# a wide MLP: recomputing it and offloading the rest holds less than recomputing the whole chunk
schedule wide_mlp
model { vocab = 256  d_model = 64  layers = [gla] * 2  heads = 2  head_dim = 32  mlp = swiglu(ratio = 16) }
mesh { pipeline = 1 }
sequence { length = 65536  chunks = 4  kernel_chunk = 64 }
pipeline { microbatches = 1 }
"""


def test_where_only_offload_fits_the_device_the_host_binds_and_is_named(tmp_path, capsys):
    source = tmp_path / "wide_mlp.sched"
    source.write_text(WIDE_MLP)
    program = load_program(source)
    peaks = {}
    for mode, offload in (("mlp", True), ("full", False)):
        stage, = predict_memory(revise(program, recompute=mode, offload=offload))
        peaks[mode] = stage
    assert peaks["mlp"].reserved < peaks["full"].reserved  # two mlp-recomputed chunks below one rebuilt whole
    device = int(OUTSIDE_THE_ALLOCATOR + (peaks["mlp"].reserved + peaks["full"].reserved) / 2)
    common = [str(source), "--device", "cpu", "--max-chunks", "4", "--device-memory", f"{device}B"]
    assert run_tune(*common, "--json") == 0  # the default host holds the copies: offload is the pick
    assert all(offloads(candidate) for candidate in json.loads(capsys.readouterr().out)["candidates"])

    assert run_tune(*common, "--host-memory", "256MiB") == 1
    error = capsys.readouterr().err
    assert "nothing in the space fits" in error
    assert "per device and 0.19 GiB of pinned host memory per node of 1 GPU (75% of 0.25 GiB)" in error
    assert "whose largest term is" in error and "on stage 0" in error  # the nearest: recompute = full's device
    assert "; of those that fit their devices, the nearest (pipeline.offload = true, pipeline.recompute = mlp)" in error
    assert "pinned host memory on node 0" in error and "offloaded activations of stage 0" in error
    assert "a larger --host-memory" in error

    # a host a hair too small: the offloading candidate is now the nearest miss of all
    host = int(peaks["mlp"].pinned_host / 0.75 / 1.005)
    assert run_tune(*common, "--host-memory", f"{host}B") == 1
    error = capsys.readouterr().err
    assert "the nearest (pipeline.offload = true, pipeline.recompute = mlp) needs" in error
    assert "of pinned host memory on node 0" in error and "of those that fit their devices" not in error
    assert "hint: a larger --host-memory (the node's real memory)" in error


def test_a_bad_host_memory_is_shown_at_its_column():
    with pytest.raises(SystemExit) as refused:
        run_tune("f.sched", "--host-memory", "0GB")
    lines = str(refused.value).splitlines()
    assert lines[0].endswith("error: --host-memory: a memory size must be positive")
    assert lines[1] == "schedlang tune f.sched --host-memory 0GB"
    assert lines[2].index("^") == lines[1].index("0GB")


def slow_host_link_search():
    """The small program tuned with a hardware profile whose host link is as slow as the tasks: offload's copies
    are priced per microbatch (a chunk whose backward follows its forward copies nothing, the first backward of a
    stage waits for its copy: ``offload_copies``). Returns the settings, the exhaustive candidates and a function
    giving a candidate's task durations per microbatch, each a list over stages, chunks and F, B (and W)."""
    import dataclasses

    from schedlang.lowering.hardware_profile import Offload, resolve_hardware

    profile = resolve_hardware("h200")
    slow = CostSettings(CostModelKind.FLOPS, dataclasses.replace(profile, offload=Offload(1e9)))
    program = small_program("gpipe")
    settings = TuneSettings(slow, memory_between_modes(program), max_chunks=4, device="cpu", top=3, dominated=True)
    everything = search(program, TuneSettings(**{**settings.__dict__, "prune": False, "top": 10**6})).candidates

    def by_microbatch(candidate) -> list[list[float]]:
        model = make_cost_model(CostModelKind.FLOPS, candidate.program, slow.hardware)
        kinds = (ActionKind.FORWARD, ActionKind.BACKWARD)
        kinds += (ActionKind.WEIGHT,) if candidate.program.pipeline.split_backward else ()
        return [[model.task_duration(TaskId(kind, stage, microbatch, chunk))
                 for stage in range(candidate.program.n_stages) for chunk in range(candidate.program.n_chunks)
                 for kind in kinds] for microbatch in range(candidate.program.n_microbatches)]

    return program, settings, everything, by_microbatch


def test_pruned_search_finds_the_fastest_of_an_exhaustive_search_when_a_profile_prices_offload_per_microbatch():
    """With offload priced per microbatch one chunk's tasks differ between microbatches; the bounds (each task at
    its shortest) and rule 5 (every microbatch's durations) still find the exhaustive search's fastest."""
    program, settings, everything, by_microbatch = slow_host_link_search()
    offloading = [candidate for candidate in everything if candidate.knobs.offload]
    assert any(len(set(map(tuple, by_microbatch(candidate)))) > 1 for candidate in offloading)
    compare_with_exhaustive(program, settings)


def test_rule_five_weighs_every_microbatchs_tasks_and_the_bounds_each_tasks_shortest():
    """Where offload makes a chunk's tasks differ between microbatches, rule 5 compares recompute modes on every
    microbatch's durations (microbatch 0's alone could drop a mode faster on another) and the bounds take each
    task at its shortest over the microbatches (any other would not be a lower bound)."""
    from schedlang.tuning.search import _Search

    program, settings, everything, by_microbatch = slow_host_link_search()
    candidate = next(candidate for candidate in everything
                     if candidate.knobs.offload and len(set(map(tuple, by_microbatch(candidate)))) > 1)
    state = _Search(program, settings, None)
    divisor = state.cost_model(candidate.program).time_divisor
    per_microbatch = by_microbatch(candidate)
    n_stages = candidate.program.n_stages
    tasks = len(per_microbatch[0]) // n_stages
    stages = [[[duration / divisor for duration in durations[stage * tasks:(stage + 1) * tasks]]
               for durations in per_microbatch] for stage in range(n_stages)]
    assert state.unit_durations(candidate.program) == [tuple(sum(stage, [])) for stage in stages]
    assert state.stage_durations(candidate.program) == [tuple(map(min, zip(*stage))) for stage in stages]
    assert any(len(set(map(tuple, stage))) > 1 for stage in stages)
