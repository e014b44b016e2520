"""benchmarks/pipeline_schedule.py: the benchmarks' systems are checked-in schedule files revised on named keys,
compiled by the front end and code generation, with the orders the lowering gives those keys (on the CPU)."""

import pytest

from benchmarks.pipeline_schedule import (
    ONE_DEVICE_SCHEDULE,
    PIPELINE_SCHEDULE,
    BenchmarkSchedule,
    predicted_reserved_bytes,
    runtime_configs,
    script_configs,
    system_changes,
    system_configs,
    system_file_name,
    system_program,
)
from schedlang.compiler import compile_schedule
from schedlang.diagnostics import ScheduleError
from schedlang.frontend import load_program
from schedlang.lowering.orders import one_f_one_b_orders
from schedlang.lowering.placement import place_stage_actions
from schedlang.vocabulary import CudaGraphs, Recompute

FULL = BenchmarkSchedule(PIPELINE_SCHEDULE)
TINY = BenchmarkSchedule(PIPELINE_SCHEDULE, tiny=True)


def test_system_names_are_keys_and_values():
    assert system_changes("schedlang:chunks=8") == {"chunks": "8"}
    assert system_changes("schedlang:chunks=16/recompute=[full, none]/offload=true") == {
        "chunks": "16", "recompute": "[full, none]", "offload": "true"
    }
    assert system_changes("schedlang:mesh.data=2") == {"mesh.data": "2"}
    for peer in ("torch", "torch+ckpt", "fla", "schedlang"):
        assert system_changes(peer) == {}
    for malformed in ("8g", "schedlang:8", "schedlang:chunks", "schedlang:chunks=", "schedlang:=4", "schedlang:"):
        with pytest.raises(ValueError):
            system_changes(malformed)


def test_a_system_is_written_to_a_file_named_after_it():
    written = system_file_name("schedlang:chunks=16/recompute=[full, mlp]")
    assert written == "schedlang-chunks=16-recompute=-full,-mlp-.sched"
    assert system_file_name("schedlang:split_backward=true") == "schedlang-split_backward=true.sched"
    assert system_file_name("torch+ckpt") == "torch+ckpt.sched"


def test_a_key_the_language_lacks_is_refused_by_revise():
    with pytest.raises(ValueError, match="no key 'chunk'"):
        system_program(FULL, "schedlang:chunk=4")


def test_a_bad_value_is_refused_by_the_checker_at_the_revised_line():
    with pytest.raises(ScheduleError, match="gla_1b_pp2.sched:"):
        system_program(FULL, "schedlang:chunks=8/cuda_graphs=true/recompute=[full, none]")


@pytest.mark.parametrize(
    "name, expected",
    [
        ("schedlang", dict(chunks=1)),
        ("schedlang:chunks=8", dict(chunks=8)),
        ("schedlang:chunks=4/cuda_graphs=true/extra_warmup=2/split_backward=true",
         dict(chunks=4, cuda_graphs=CudaGraphs.CHUNK_SLOTS, extra_warmup=2, split_backward=True)),
        ("schedlang:chunks=2/cuda_graphs=true/extra_warmup=1/split_backward=true/forward_before_weight=true"
         "/extra_deferred_weights=2",
         dict(chunks=2, cuda_graphs=CudaGraphs.CHUNK_SLOTS, extra_warmup=1, split_backward=True,
              forward_before_weight=True, extra_deferred_weights=2)),
        ("schedlang:chunks=8/cuda_graphs=step", dict(chunks=8, cuda_graphs=CudaGraphs.STEP)),
        ("schedlang:chunks=16/recompute=mlp", dict(chunks=16, recompute=Recompute.MLP)),
        ("schedlang:chunks=8/recompute=mixer/offload=true", dict(chunks=8, recompute=Recompute.MIXER, offload=True)),
        ("schedlang:chunks=16/recompute=[full, mlp]", dict(chunks=16, recompute=(Recompute.FULL, Recompute.MLP))),
        ("torch", dict(chunks=1)),
        ("torch+ckpt", dict(chunks=1)),
    ],
)
def test_each_system_is_the_file_with_its_keys(name, expected):
    program = system_program(FULL, name, 32768, 4, "bf16")
    settings = dict(cuda_graphs=CudaGraphs.NONE, extra_warmup=0, split_backward=False, forward_before_weight=False,
                    extra_deferred_weights=0, recompute=Recompute.NONE, offload=False)
    settings.update(expected)
    assert program.n_chunks == settings.pop("chunks") and program.n_stages == 2 and program.n_microbatches == 4
    for key, value in settings.items():
        assert getattr(program.pipeline, key) == value, key
    assert program.stage_layers == (tuple(range(8)), tuple(range(8, 16)))
    assert load_program(PIPELINE_SCHEDULE).model == program.model  # the peers and every system: one model


@pytest.mark.parametrize(
    "name, chunks, extra_warmup, split_backward, forward_before_weight, extra_deferred_weights",
    [
        ("schedlang", 1, 0, False, False, 0),
        ("schedlang:chunks=4", 4, 0, False, False, 0),
        ("schedlang:chunks=2/extra_warmup=2", 2, 2, False, False, 0),
        ("schedlang:chunks=4/cuda_graphs=true/extra_warmup=1/split_backward=true", 4, 1, True, False, 0),
        ("schedlang:chunks=2/cuda_graphs=true/extra_warmup=1/split_backward=true/forward_before_weight=true"
         "/extra_deferred_weights=2", 2, 1, True, True, 2),
    ],
)
def test_compiled_systems_run_the_orders_of_their_keys(
    name, chunks, extra_warmup, split_backward, forward_before_weight, extra_deferred_weights
):
    configs = system_configs(TINY, name, 1024, 4, "fp32")
    orders = one_f_one_b_orders(
        2, 4, chunks, extra_warmup, split_backward, forward_before_weight, extra_deferred_weights
    )
    expected_actions = tuple(tuple(str(action) for action in stage) for stage in place_stage_actions(orders))
    assert configs.pipeline.stage_actions == expected_actions
    assert configs.pipeline.chunk_boundaries == tuple(1024 * index // chunks for index in range(chunks + 1))
    assert configs.pipeline.microbatch_size == 1 and configs.pipeline.stage_layers == ((0, 1), (2, 3))
    assert configs.train.dtype == "fp32" and configs.train.optimizer.lr == pytest.approx(1e-4)
    assert configs.model.layers == ("gla",) * 4 and configs.model.mlp_ratio == 2.0


@pytest.mark.parametrize(
    "path, name",
    [(PIPELINE_SCHEDULE, "schedlang"), (PIPELINE_SCHEDULE, "schedlang:chunks=4/cuda_graphs=true/split_backward=true"),
     (ONE_DEVICE_SCHEDULE, "schedlang:chunks=2/recompute=mlp/offload=true")],
    ids=["pp2", "pp2-graphs-split", "one-device-offload"],
)
def test_the_configs_read_from_the_script_are_the_ones_it_builds(path, name, tmp_path):
    """The script's literals read without running it equal what running the script builds (as ``schedlang run``
    does, in a process of its own)."""
    import json
    import subprocess
    import sys

    program = system_program(BenchmarkSchedule(path, tiny=True), name, 512, None, "fp32")
    script = compile_schedule(program).script
    read = script_configs(script)
    assert read == runtime_configs(program)
    (tmp_path / "train.py").write_text(script)
    probe = ("import json, runpy; namespace = runpy.run_path('train.py'); "
             "print(json.dumps([repr(namespace[name]) for name in ('MODEL', 'PIPELINE', 'TRAIN')]))")
    completed = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert json.loads(completed.stdout) == [repr(read.model), repr(read.pipeline), repr(read.train)]


def test_the_script_reader_refuses_anything_but_literals_and_records():
    with pytest.raises(ValueError, match="line 2"):
        script_configs("from schedlang.vocabulary import ModelConfig\nMODEL = open('x')\n")
    with pytest.raises(ValueError, match="assigns no PIPELINE, TRAIN"):
        script_configs("MODEL = 1\n")


def test_split_mlp_and_first_stage_layers_are_model_keys():
    schedule = BenchmarkSchedule(PIPELINE_SCHEDULE, split_mlp=True, first_stage_layers=19)
    configs = system_configs(schedule, "schedlang:chunks=2", 32768, 4, "bf16")
    assert configs.model.layers == ("gla", "mlp") * 16
    assert configs.pipeline.stage_layers == (tuple(range(19)), tuple(range(19, 32)))
    assert configs.model.mlp_ratio == 8 / 3


def test_a_bad_option_is_refused_by_the_checker():
    schedule = BenchmarkSchedule(PIPELINE_SCHEDULE, tiny=True, first_stage_layers=4)  # leaves stage 1 no layer
    with pytest.raises(ScheduleError, match="stage 1"):
        system_program(schedule, "schedlang:chunks=2", 1024, 4, "fp32")


def test_predicted_reserved_peaks_follow_the_recompute_mode():
    kept, recomputed = (
        predicted_reserved_bytes(system_program(FULL, name, 32768, 4, "bf16"))
        for name in ("schedlang:chunks=8", "schedlang:chunks=8/recompute=full")
    )
    assert len(kept) == 2 and all(full < none for full, none in zip(recomputed, kept))


def test_the_one_device_file_is_the_pipeline_model_on_one_stage():
    one, two = load_program(ONE_DEVICE_SCHEDULE), load_program(PIPELINE_SCHEDULE)
    assert one.model == two.model and one.n_stages == 1 and one.n_microbatches == 1


@pytest.mark.parametrize(
    "row_file, schedule, name, length",
    [
        ("gla_1b_one_device_8m.sched", BenchmarkSchedule(ONE_DEVICE_SCHEDULE), "schedlang:chunks=128/recompute=full",
         8388608),
        ("gla_1b_pp2_deferred_weights.sched",
         BenchmarkSchedule(PIPELINE_SCHEDULE, split_mlp=True, first_stage_layers=17),
         "schedlang:chunks=2/cuda_graphs=true/extra_warmup=1/split_backward=true/forward_before_weight=true"
         "/extra_deferred_weights=2", None),
    ],
)
def test_a_checked_in_row_file_is_the_benchmarks_system(row_file, schedule, name, length):
    """docs/benchmarks.md re-runs a row with ``schedlang run`` on its file: the file trains what the benchmark's
    system trained."""
    row = load_program(PIPELINE_SCHEDULE.parent / row_file)
    system = system_program(schedule, name, length)
    for part in ("model", "mesh", "sequence", "pipeline", "train", "stage_layers"):
        assert getattr(row, part) == getattr(system, part), part
