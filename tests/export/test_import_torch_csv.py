"""``schedlang export`` of chunked schedules and ``schedlang import`` of torch's schedule CSV.

Round trips on every example (export, import with ``--like``: the same per-stage orders, legal), on the
orders torch's own single-stage-per-rank schedules generate (GPipe, 1F1B, looped BFS, interleaved 1F1B
and zero bubble with one stage per rank), and torch's runtime loading and dry-running a chunked export.
"""

from __future__ import annotations

import csv
import io
import types
from pathlib import Path

import pytest
from torch.distributed.pipelining import schedules as torch_schedules

from schedlang.cli import main
from schedlang.compiler import Pass, compile_schedule
from schedlang.frontend import load_program, load_program_text
from schedlang.lowering.export.torch_csv import TorchCsvError, parse_torch_csv, torch_csv_text, torch_microbatch
from schedlang.lowering.orders import one_f_one_b_orders, stage_orders
from schedlang.vocabulary.actions import TaskId

EXAMPLES = Path(__file__).parents[2] / "examples"
SCHEDULES = Path(__file__).parent / "schedules"


def _stage_stand_in(n_stages: int, rank: int, stage: int | None = None, n_local: int = 1):
    """The fields torch's schedule constructors read from a stage (see test_export_torch_csv.py)."""
    stage = rank if stage is None else stage
    return types.SimpleNamespace(
        num_stages=n_stages * n_local, group_size=n_stages, group_rank=rank, stage_index=stage,
        is_last=stage == n_stages * n_local - 1, submod=None,
    )


def _imported(tmp_path, csv_path: Path, *arguments) -> Path:
    output = tmp_path / "imported.sched"
    assert main(["import", str(csv_path), "-o", str(output), *arguments]) == 0
    return output


@pytest.mark.parametrize("example", sorted(path.name for path in EXAMPLES.glob("*.sched")))
def test_every_example_exports_and_imports_back_to_the_same_legal_order(tmp_path, example):
    schedule = EXAMPLES / example
    exported = tmp_path / "order.csv"
    assert main(["export", str(schedule), "--format", "torch-csv", "-o", str(exported)]) == 0
    imported = _imported(tmp_path, exported, "--like", str(schedule))
    # read as if beside the example, so its relative paths (data, Hugging Face directories) resolve
    program = load_program_text(imported.read_text(), str(EXAMPLES / "imported.sched"))
    original = load_program(schedule)
    assert program.pipeline.order.value == "explicit"
    assert stage_orders(program) == stage_orders(original)
    assert compile_schedule(program, Pass.LEGALITY).legality.is_legal
    assert (program.model, program.mesh, program.sequence, program.train) == (
        original.model, original.mesh, original.sequence, original.train
    )


def test_a_chunked_export_names_chunk_i_of_microbatch_a_torch_microbatch_a_n_plus_i():
    orders = one_f_one_b_orders(2, 2, 3)
    assert torch_microbatch(TaskId.forward(0, 1, 2), 3) == 5
    text = torch_csv_text(orders, 3)
    assert text.splitlines()[0].split(",")[:4] == ["0F0", "0F1", "0F2", "0F3"]
    assert parse_torch_csv(text, n_chunks=3) == tuple(tuple(order) for order in orders)


@pytest.mark.parametrize(("n_stages", "n_microbatches", "n_chunks"), [(2, 2, 2), (3, 4, 4)])
def test_torch_runtime_loads_and_dry_runs_a_chunked_export(tmp_path, n_stages, n_microbatches, n_chunks):
    path = tmp_path / "chunked.csv"
    path.write_text(torch_csv_text(one_f_one_b_orders(n_stages, n_microbatches, n_chunks), n_chunks))
    runtime = torch_schedules._PipelineScheduleRuntime(
        [_stage_stand_in(n_stages, 0)], n_microbatches=n_microbatches * n_chunks
    )
    runtime._load_csv(str(path))
    fsdp = {torch_schedules.UNSHARD, torch_schedules.RESHARD, torch_schedules.REDUCE_GRAD}
    with_comms = {
        rank: [action for action in actions if action is None or action.computation_type not in fsdp]
        for rank, actions in runtime.pipeline_order_with_comms.items()
    }
    simulated = torch_schedules._simulate_comms_compute(with_comms, lambda stage: stage, n_stages)
    computed = sum(action is not None and action.is_compute_op for actions in simulated.values() for action in actions)
    assert computed == 2 * n_stages * n_microbatches * n_chunks


def _torch_orders(name: str, n_stages: int, n_microbatches: int) -> dict[int, list]:
    """The orders torch generates; 1F1B is ``ScheduleInterleaved1F1B`` with one stage per rank, since
    ``Schedule1F1B._get_pipeline_order`` (a drawing aid, not what it runs) starts the last rank's forwards
    at microbatch 1 in torch 2.13, which ``check`` reports as a missing ``F0.0``."""
    if name == "GPipe":
        schedule = torch_schedules.ScheduleGPipe(_stage_stand_in(n_stages, 0), n_microbatches=n_microbatches)
        return schedule._get_pipeline_order()
    cls = {
        "LoopedBFS": torch_schedules.ScheduleLoopedBFS,
        "1F1B": torch_schedules.ScheduleInterleaved1F1B,
        "InterleavedZeroBubble": torch_schedules.ScheduleInterleavedZeroBubble,
    }[name]
    return cls([_stage_stand_in(n_stages, 0)], n_microbatches=n_microbatches).pipeline_order


def _csv_of(pipeline_order: dict[int, list]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    for rank in sorted(pipeline_order):
        writer.writerow(["" if action is None else str(action) for action in pipeline_order[rank]])
    return buffer.getvalue()


@pytest.mark.parametrize("name", ["GPipe", "1F1B", "LoopedBFS", "InterleavedZeroBubble"])
@pytest.mark.parametrize(("n_stages", "n_microbatches"), [(2, 4), (4, 8)])
def test_torch_schedules_import_as_legal_explicit_orders(tmp_path, name, n_stages, n_microbatches):
    pipeline_order = _torch_orders(name, n_stages, n_microbatches)
    path = tmp_path / f"{name}.csv"
    path.write_text(_csv_of(pipeline_order))
    program = load_program(_imported(tmp_path, path))
    assert compile_schedule(program, Pass.LEGALITY).legality.is_legal
    assert (program.n_stages, program.n_microbatches, program.n_chunks) == (n_stages, n_microbatches, 1)
    compute = {torch_schedules.FORWARD, torch_schedules.FULL_BACKWARD, torch_schedules.BACKWARD_INPUT,
               torch_schedules.BACKWARD_WEIGHT}
    for rank, order in enumerate(stage_orders(program)):
        torch_actions = [
            str(action) for action in pipeline_order[rank] if action and action.computation_type in compute
        ]
        split = program.pipeline.split_backward
        assert [f"{task.stage}{'I' if split and task.kind.value == 'B' else task.kind.value}{task.microbatch}"
                for task in order] == torch_actions
    assert program.pipeline.split_backward == (name == "InterleavedZeroBubble")


def test_an_interleaved_schedule_with_two_stages_per_rank_is_refused_at_its_cell(tmp_path):
    n_stages = 2
    schedule = torch_schedules.ScheduleInterleaved1F1B(
        [_stage_stand_in(n_stages, 0, 0, 2), _stage_stand_in(n_stages, 0, 2, 2)], n_microbatches=4
    )
    path = tmp_path / "interleaved.csv"
    path.write_text(_csv_of(schedule.pipeline_order))
    assert main(["import", str(path), "-o", str(tmp_path / "out.sched")]) == 1
    assert not (tmp_path / "out.sched").exists()


def test_import_without_like_writes_a_checkable_stand_in_schedule(tmp_path, capsys):
    exported = tmp_path / "tiny.csv"
    assert main(["export", str(SCHEDULES / "tiny.sched"), "--format", "torch-csv", "-o", str(exported)]) == 0
    assert "`schedlang import" in capsys.readouterr().out
    program = load_program(_imported(tmp_path, exported, "--chunks", "2"))
    assert stage_orders(program) == stage_orders(load_program(SCHEDULES / "tiny.sched"))
    assert main(["check", str(tmp_path / "imported.sched")]) == 0


def test_a_chunk_count_that_does_not_divide_the_torch_microbatches_is_refused(tmp_path, capsys):
    path = tmp_path / "three.csv"
    path.write_text("0F0,0F1,0F2,0B0,0B1,0B2\n")
    assert main(["import", str(path), "--chunks", "2", "-o", str(tmp_path / "out.sched")]) == 1
    assert "3 torch microbatches, not a whole number of microbatches of 2 chunks" in capsys.readouterr().err


def test_reduce_grad_cells_are_dropped_and_sends_refused():
    assert parse_torch_csv("0F0,0B0,0REDUCE_GRAD") == ((TaskId.forward(0, 0, 0), TaskId.backward(0, 0, 0)),)
    with pytest.raises(TorchCsvError, match="communication"):
        parse_torch_csv("0F0,0SEND_F0")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty.csv: error: no compute action (a cell like 0F0, 0B0, 0I0 or 0W0) in 0 rows"),
        (b"0REDUCE_GRAD\n", "empty.csv: error: no compute action (a cell like 0F0, 0B0, 0I0 or 0W0) in 1 rows"),
        (b"0F0,0B0\n0F0,\xd2\x80\xff\n", "empty.csv:2: error: byte 0xff is not valid UTF-8"),
    ],
    ids=["empty", "only-dropped-actions", "binary"],
)
def test_a_file_that_is_no_torch_schedule_is_refused_in_one_line(tmp_path, capsys, content, message):
    path = tmp_path / "empty.csv"
    path.write_bytes(content)
    assert main(["import", str(path), "-o", str(tmp_path / "out.sched")]) == 1
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error and len(error.strip().splitlines()) == 1
    assert not (tmp_path / "out.sched").exists()


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_a_missing_csv_or_a_folder_is_named(tmp_path, capsys, kind):
    path = tmp_path / "in.csv"
    if kind == "directory":
        path.mkdir()
    assert main(["import", str(path), "-o", str(tmp_path / "out.sched")]) == 1
    error = capsys.readouterr().err
    assert "no such file" in error if kind == "missing" else "is a directory, not a regular file" in error
