"""train.log = tensorboard(directory): each step's metrics as TensorBoard scalars, beside --metrics."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from schedlang.diagnostics import ScheduleError
from schedlang.frontend import load_program_text
from schedlang.preflight import check_tensorboard

SCHEDULE = """schedule board
model {{ vocab = 64  d_model = 16  heads = 1  head_dim = 16  layers = [gla] * 1 }}
sequence {{ length = 32  chunks = 2  kernel_chunk = 16 }}
pipeline {{ microbatches = 1 }}
train {{ steps = 3  optimizer = adamw(lr = 1e-2)  {log} }}
"""


def test_a_run_writes_its_losses_as_scalars_in_the_schedule_relative_directory(tmp_path):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    schedule = tmp_path / "board.sched"
    schedule.write_text(SCHEDULE.format(log='log = tensorboard(directory = "runs/board")'), encoding="utf-8")
    metrics = tmp_path / "metrics.jsonl"
    completed = subprocess.run(
        [sys.executable, "-m", "schedlang", "run", str(schedule), "--device", "cpu", "--metrics", str(metrics)],
        capture_output=True, text=True, timeout=240, cwd="/",
    )
    assert completed.returncode == 0, completed.stderr
    accumulator = event_accumulator.EventAccumulator(str(tmp_path / "runs" / "board"))
    accumulator.Reload()
    assert {"train/loss", "train/tokens_per_second", "train/step_seconds"} <= set(accumulator.Tags()["scalars"])
    losses = [(event.step, event.value) for event in accumulator.Scalars("train/loss")]
    recorded = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [step for step, _ in losses] == [1, 2, 3]
    assert [value for _, value in losses] == pytest.approx([row["loss"] for row in recorded], rel=1e-6)


def test_check_says_at_the_key_when_tensorboard_is_missing(monkeypatch):
    text = SCHEDULE.format(log='log = tensorboard(directory = "runs/board")')
    program = load_program_text(text, "board.sched")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None if name == "tensorboard" else real(name, *rest))
    with pytest.raises(ScheduleError) as error:
        check_tensorboard(program, text)
    rendered = error.value.render()
    column = text.splitlines()[4].index("log =") + 1
    assert rendered.startswith(f"board.sched:5:{column}: error: train.log = tensorboard(...) writes through the tensorboard")
    assert "pip install tensorboard" in rendered


def test_without_a_log_nothing_is_asked():
    program = load_program_text(SCHEDULE.format(log=""), "board.sched")
    assert program.train.tensorboard_directory is None
    check_tensorboard(program, "")
