"""``schedlang run`` against an existing checkpoint: a finished job and a checkpoint of another model are
refused in one line before torchrun starts (at most 5 lines, no traceback), ``--fresh`` starts over beside
the checkpoint, the banner says from which step it trains, and steps past ``train.steps`` say their rate."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest

from reliability_helpers import one_rank_schedule, run_cli
from schedlang.resume_preflight import fresh_checkpoint_directory, learning_rate_note
from schedlang.runtime.progress import StepMetrics, progress_line
from schedlang.vocabulary import LearningRateScheduleKind

COSINE = 'checkpoint = "ckpt" every 1  lr_schedule = cosine(min_lr = 1e-4)'


def _printed_lines(completed) -> list[str]:
    return [line for line in (completed.stdout + completed.stderr).splitlines() if line.strip()]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A one-rank job of train.steps = 2 trained to its end, with a checkpoint every step."""
    directory = tmp_path_factory.mktemp("finished")
    schedule = directory / "job.sched"
    schedule.write_text(one_rank_schedule(1, COSINE), encoding="utf-8")
    completed = run_cli("run", schedule, "--device", "cpu", cwd=directory)
    assert completed.returncode == 0, completed.stderr
    assert "schedlang: training one_rank for 2 steps on 1 cpu process" in completed.stdout
    return directory


@pytest.mark.slow
def test_rerunning_a_finished_job_says_so_in_one_line_before_launch(finished):
    completed = run_cli("run", finished / "job.sched", "--device", "cpu")
    assert completed.returncode == 1
    lines = _printed_lines(completed)
    assert len(lines) <= 5 and "Traceback" not in completed.stderr and "torchrun" not in completed.stderr
    assert lines == [
        f"schedlang: error: {finished / 'ckpt' / 'step-00000002'} has already trained 2 steps and train.steps is 2: "
        "nothing to train; give a larger --steps to go on, or --fresh to start over beside it"
    ]


@pytest.mark.slow
def test_resuming_into_another_model_is_refused_in_one_line_before_launch(finished, tmp_path):
    other = finished / "other.sched"
    other.write_text(one_rank_schedule(2, COSINE), encoding="utf-8")
    completed = run_cli("run", other, "--device", "cpu", "--steps", "3")
    assert completed.returncode == 1
    lines = _printed_lines(completed)
    assert len(lines) <= 5 and "Traceback" not in completed.stderr
    assert lines == [
        f"schedlang: error: checkpoint {finished / 'ckpt' / 'step-00000002'} was written for "
        "model.layers = ('gla',), but this schedule has model.layers = ('gla', 'gla'); "
        "give --fresh to start over beside it"
    ]


@pytest.mark.slow
def test_fresh_starts_over_beside_the_checkpoint_and_says_where(finished, tmp_path):
    copy = tmp_path / "job"
    shutil.copytree(finished, copy)
    before = sorted(path.name for path in (copy / "ckpt").iterdir())
    completed = run_cli("run", copy / "job.sched", "--device", "cpu", "--fresh", "--steps", "1")
    assert completed.returncode == 0, completed.stderr
    assert (
        f"schedlang: --fresh: starting at step 0; checkpoints go to {copy / 'ckpt'}-2 "
        f"({copy / 'ckpt'} is kept as it is)"
        in completed.stdout
    )
    assert "resuming" not in completed.stdout
    assert sorted(path.name for path in (copy / "ckpt").iterdir()) == before
    assert (copy / "ckpt-2" / "step-00000001").is_dir()


@pytest.mark.slow
def test_steps_past_the_schedule_say_their_rate_and_train_at_it(finished, tmp_path):
    copy = tmp_path / "job"
    shutil.copytree(finished, copy)
    metrics = tmp_path / "metrics.jsonl"
    completed = run_cli("run", copy / "job.sched", "--device", "cpu", "--steps", "3", "--metrics", metrics)
    assert completed.returncode == 0, completed.stderr
    assert "steps 3-3 train at min_lr = 0.0001 (set train.steps = 3" in completed.stdout
    assert "schedlang: training one_rank from step 2 to step 3 on 1 cpu process" in completed.stdout
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [row["step"] for row in rows] == [3]
    assert rows[0]["learning_rate"] == pytest.approx(1e-4, rel=1e-12)
    assert "lr 0.0001" in completed.stdout


def _program(steps: int, kind: LearningRateScheduleKind, min_lr: float = 1e-5):
    schedule = SimpleNamespace(kind=kind, min_lr=min_lr, warmup=0)
    return SimpleNamespace(train=SimpleNamespace(steps=steps, lr_schedule=schedule))


def test_the_learning_rate_note_appears_only_past_a_decaying_schedule():
    assert learning_rate_note(_program(3, LearningRateScheduleKind.COSINE), 3) is None
    assert learning_rate_note(_program(3, LearningRateScheduleKind.CONSTANT), 6) is None
    note = learning_rate_note(_program(3, LearningRateScheduleKind.COSINE), 6)
    assert note == (
        "schedlang: note: train.lr_schedule's cosine decay ends at train.steps = 3; steps 4-6 train at "
        "min_lr = 1e-05 (set train.steps = 6 to spread the decay over them)"
    )


def test_a_fresh_directory_is_the_first_free_sibling(tmp_path):
    directory = tmp_path / "ckpt"
    assert fresh_checkpoint_directory(str(directory)) == str(directory)  # nothing there yet: itself
    (directory / "step-00000001").mkdir(parents=True)
    (directory / "latest").write_text("step-00000001\n")
    (tmp_path / "ckpt-2").mkdir()
    assert fresh_checkpoint_directory(str(directory)) == f"{directory}-3"


def test_the_progress_line_shows_the_learning_rate():
    line = progress_line(StepMetrics(3, 2.5, 1000.0, 0.1, 1 << 20, learning_rate=2.5e-4), 10)
    assert "loss 2.5000  lr 0.00025  1,000 tok/s" in line
    assert " lr " not in progress_line(StepMetrics(3, 2.5, 1000.0, 0.1, 1 << 20), 10)
