"""``schedlang viz`` and ``schedlang export`` end to end: schedule file in, file out, errors as diagnostics."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image
import pytest

from schedlang.cli import main
from schedlang.frontend import load_program
from schedlang.lowering.export.torch_csv import load_torch_csv
from schedlang.lowering.orders import stage_orders

SCHEDULES = Path(__file__).parent / "schedules"
GOLDEN = Path(__file__).parent / "golden"
EXAMPLES = Path(__file__).parents[2] / "examples"


def test_viz_dot_of_the_tiny_file_is_the_golden_graph(tmp_path):
    output = tmp_path / "tiny.dot"
    assert main(["viz", str(SCHEDULES / "tiny.sched"), "--format", "dot", "-o", str(output)]) == 0
    assert output.read_text() == (GOLDEN / "tiny_1f1b.dot").read_text()


def test_viz_chrome_of_the_tiny_file_is_the_golden_trace(tmp_path):
    output = tmp_path / "tiny.json"
    assert main(["viz", str(SCHEDULES / "tiny.sched"), "--format", "chrome", "-o", str(output)]) == 0
    assert output.read_text() == (GOLDEN / "tiny_1f1b_unit.trace.json").read_text()


def test_viz_writes_text_to_standard_output(capsys):
    assert main(["viz", str(SCHEDULES / "tiny.sched"), "--format", "dot", "-o", "-", "--program-order", "dotted"]) == 0
    text = capsys.readouterr().out
    assert text.startswith('digraph "tiny" {') and "style=dotted" in text


def test_viz_png_of_the_example(tmp_path):
    output = tmp_path / "gla.png"
    assert main(["viz", str(EXAMPLES / "gla_stateflow.sched"), "--format", "png", "-o", str(output)]) == 0
    pixels = matplotlib.image.imread(output)
    assert pixels.shape[0] > 100 and pixels.shape[1] > 100


def test_viz_chrome_with_the_flops_model_shows_transfers(tmp_path):
    output = tmp_path / "gla.json"
    arguments = ["viz", str(EXAMPLES / "gla_stateflow.sched"), "--format", "chrome", "-o", str(output)]
    assert main(arguments + ["--cost-model", "flops", "--bandwidth", "1e9"]) == 0
    trace = json.loads(output.read_text())
    assert trace["otherData"]["time_unit"] == "s"
    assert any(event["name"].startswith("send activation") for event in trace["traceEvents"] if event["ph"] == "X")


def test_viz_refuses_an_illegal_schedule(tmp_path, capsys):
    output = tmp_path / "deadlock.dot"
    assert main(["viz", str(SCHEDULES / "deadlock.sched"), "--format", "dot", "-o", str(output)]) == 1
    error = capsys.readouterr().err
    assert "deadlock.sched:26:12: error: stage 1 runs B0.0 (step 0) before F0.0 (step 1)" in error
    assert not output.exists()


def test_viz_rejects_a_bad_bandwidth(tmp_path):
    with pytest.raises(SystemExit, match="--bandwidth must be positive"):
        main(["viz", str(SCHEDULES / "tiny.sched"), "--format", "png", "-o", str(tmp_path / "x.png"), "--bandwidth=0"])


def test_export_torch_csv_round_trips_the_program_order(tmp_path):
    output = tmp_path / "order.csv"
    schedule = SCHEDULES / "one_chunk.sched"
    assert main(["export", str(schedule), "--format", "torch-csv", "-o", str(output)]) == 0
    assert load_torch_csv(output) == stage_orders(load_program(schedule))
    assert output.read_text().splitlines()[3].startswith(",,,3F0,3B0,3F1")


def test_export_of_a_chunked_schedule_writes_each_chunk_as_a_torch_microbatch(tmp_path, capsys):
    output = tmp_path / "order.csv"
    assert main(["export", str(SCHEDULES / "tiny.sched"), "--format", "torch-csv", "-o", str(output)]) == 0
    assert "chunk i of microbatch a is torch microbatch a * 2 + i (4 torch microbatches)" in capsys.readouterr().out
    assert load_torch_csv(output, n_chunks=2) == stage_orders(load_program(SCHEDULES / "tiny.sched"))


def test_missing_file_is_an_error_not_a_traceback(tmp_path, capsys):
    assert main(["viz", str(tmp_path / "absent.sched"), "--format", "dot", "-o", str(tmp_path / "x.dot")]) == 1
    assert "does not exist" in capsys.readouterr().err


def _split_copy(tmp_path, name: str) -> Path:
    """A schedule of SCHEDULES with ``split_backward = true`` added to its pipeline block."""
    text = (SCHEDULES / name).read_text().replace("order        = 1f1b", "order        = 1f1b\n  split_backward = true")
    assert "split_backward" in text
    path = tmp_path / name
    path.write_text(text)
    return path


def test_export_torch_csv_of_a_split_schedule_writes_i_and_w_and_round_trips(tmp_path):
    schedule = _split_copy(tmp_path, "one_chunk.sched")
    output = tmp_path / "order.csv"
    assert main(["export", str(schedule), "--format", "torch-csv", "-o", str(output)]) == 0
    program = load_program(schedule)
    assert program.pipeline.split_backward
    assert load_torch_csv(output) == stage_orders(program)
    assert output.read_text().splitlines()[3].startswith(",,,3F0,3I0,3W0,3F1")


def test_viz_of_a_split_schedule_draws_weight_tasks(tmp_path):
    schedule = _split_copy(tmp_path, "tiny.sched")
    dot, trace = tmp_path / "tiny.dot", tmp_path / "tiny.json"
    assert main(["viz", str(schedule), "--format", "dot", "-o", str(dot)]) == 0
    assert '"1W0.1" [label="W0.1"' in dot.read_text()
    assert main(["viz", str(schedule), "--format", "chrome", "-o", str(trace)]) == 0
    categories = {event["cat"] for event in json.loads(trace.read_text())["traceEvents"] if event["ph"] == "X"}
    assert categories == {"forward", "backward", "weight"}
    assert main(["viz", str(schedule), "--format", "png", "-o", str(tmp_path / "tiny.png")]) == 0
