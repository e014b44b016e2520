"""Checkpoints: what they record, where a run resumes, mismatches, corrupt files, and the path rule."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from reliability_helpers import one_rank_schedule, run_cli, run_script
from schedlang.runtime.checkpoint import (
    CheckpointError,
    CheckpointMismatchError,
    checkpoint_path,
    load_checkpoint,
    save_checkpoint,
)
from schedlang.runtime.checkpoint_manifest import run_record
from schedlang.runtime.config import PipelineConfig
from schedlang.vocabulary import ModelConfig, OptimizerConfig, TrainConfig

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def compiled(tmp_path, name: str, layers: int, every: int = 1):
    """A one-rank script whose schedule checkpoints to ``ckpt`` next to the schedule file."""
    schedule = tmp_path / f"{name}.sched"
    schedule.write_text(one_rank_schedule(layers, f'checkpoint = "ckpt" every {every}'), encoding="utf-8")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    script = tmp_path / f"{name}.py"
    completed = run_cli("compile", schedule, "-o", script, cwd=elsewhere)
    assert completed.returncode == 0, completed.stderr
    return script


@pytest.mark.slow
def test_resume_says_where_it_resumes_refuses_a_reached_step_and_another_model(tmp_path):
    script = compiled(tmp_path, "two_layers", layers=2)
    first = run_script(script, "--steps", "1")
    assert first.returncode == 0, first.stderr
    checkpoint = tmp_path / "ckpt" / "step-00000001"  # relative to the schedule file, not to the working directory
    assert (checkpoint / ".metadata").exists()
    assert not (tmp_path / "elsewhere" / "ckpt").exists()

    resumed = run_script(script, "--steps", "2")
    assert resumed.returncode == 0, resumed.stderr
    assert f"schedlang: resuming from step 1 of {checkpoint}" in resumed.stdout

    reached = run_script(script, "--steps", "2")
    assert reached.returncode == 1
    assert "Traceback" not in reached.stderr
    assert f"{tmp_path / 'ckpt' / 'step-00000002'} has already trained 2 steps and --steps is 2" in reached.stderr

    smaller = compiled(tmp_path, "one_layer", layers=1)
    mismatch = run_script(smaller, "--steps", "3")
    assert mismatch.returncode == 1
    assert "Traceback" not in mismatch.stderr
    assert mismatch.stderr.strip() == (
        f"schedlang: error: checkpoint {tmp_path / 'ckpt' / 'step-00000002'} was written for "
        "model.layers = ('gla', 'gla'), but this schedule has model.layers = ('gla',)"
    )


@pytest.mark.slow
def test_run_appends_metrics_when_it_resumes(tmp_path):
    schedule = tmp_path / "appends.sched"
    schedule.write_text(one_rank_schedule(1, 'checkpoint = "ckpt" every 1'), encoding="utf-8")
    metrics = tmp_path / "metrics.jsonl"
    for steps in (1, 2):
        completed = run_cli("run", schedule, "--steps", steps, "--metrics", metrics, "--device", "cpu")
        assert completed.returncode == 0, completed.stderr
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1, 2]


def _configs(heads: int, head_dim: int, layers: int = 1):
    model = ModelConfig(vocab=64, d_model=16, layers=("gla",) * layers, heads=heads, head_dim=head_dim)
    pipeline = PipelineConfig(((0,),), (0, 16, 32), 1, 1, (("F0.0",),))
    return model, pipeline, TrainConfig(optimizer=OptimizerConfig())


def _tiny_model():
    model = torch.nn.Linear(2, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_heads_are_recorded_and_a_different_split_is_refused(tmp_path):
    written = run_record(*_configs(heads=1, head_dim=16), (1, 1, 1))
    model, optimizer = _tiny_model()
    save_checkpoint(str(tmp_path), 3, model, optimizer, written)
    asked = run_record(*_configs(heads=2, head_dim=8), (1, 1, 1))
    with pytest.raises(CheckpointMismatchError) as error:
        load_checkpoint(str(tmp_path), model, optimizer, asked)
    assert str(error.value) == (
        f"checkpoint {checkpoint_path(str(tmp_path), 3)} was written for model.heads = 1, "
        "but this schedule has model.heads = 2"
    )


@pytest.mark.parametrize("damage", ["truncated data", "corrupt metadata", "missing directory"])
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, damage):
    model, optimizer = _tiny_model()
    with torch.no_grad():
        model.weight.fill_(1.0)
    save_checkpoint(str(tmp_path), 1, model, optimizer)
    with torch.no_grad():
        model.weight.fill_(2.0)
    save_checkpoint(str(tmp_path), 2, model, optimizer)
    newest = checkpoint_path(str(tmp_path), 2)
    if damage == "truncated data":
        for file in newest.glob("*.distcp"):
            file.write_bytes(file.read_bytes()[:7])
    elif damage == "corrupt metadata":
        (newest / ".metadata").write_bytes(b"not a pickle")
    else:
        for file in newest.iterdir():
            file.unlink()
        newest.rmdir()
    said = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = load_checkpoint(str(tmp_path), model, optimizer, say=said.append)
    assert step == 1
    assert torch.equal(model.weight, torch.ones(2, 2))
    assert len(said) == 1 and "\n" not in said[0]
    assert said[0].startswith(f"schedlang: checkpoint {newest}")
    assert said[0].endswith("trying an earlier one")


def test_no_readable_checkpoint_is_an_error_not_a_fresh_start(tmp_path):
    model, optimizer = _tiny_model()
    save_checkpoint(str(tmp_path), 1, model, optimizer)
    (checkpoint_path(str(tmp_path), 1) / ".metadata").write_bytes(b"")
    with pytest.raises(CheckpointError, match="no checkpoint in .* can be read"):
        load_checkpoint(str(tmp_path), model, optimizer, say=lambda line: None)
