"""train.eval_every: a validation loss on held-out data, forward-only, the same on every mesh."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from schedlang.runtime.data import TokenSource
from schedlang.vocabulary import DataConfig, DataKind

SCHEDULE = """schedule evaluation
model {{ vocab = 64  d_model = 32  layers = [gla, attn, gla, simple_gla]  heads = 2  head_dim = 16 }}
mesh {{ {mesh} }}
sequence {{ length = 64  chunks = {chunks}  kernel_chunk = 16 }}
pipeline {{ microbatches = {microbatches}  microbatch_size = {size} }}
train {{ steps = 3  eval_every = 1  eval_batches = 2  optimizer = adamw(lr = 1e-2)
  data = tokens(path = "train.bin", validation = 0.2) }}
"""


def validation_losses(tmp_path, name: str, mesh: str, chunks: int, microbatches: int, size: int) -> list[float]:
    schedule = tmp_path / f"{name}.sched"
    schedule.write_text(SCHEDULE.format(mesh=mesh, chunks=chunks, microbatches=microbatches, size=size))
    metrics = tmp_path / f"{name}.jsonl"
    completed = subprocess.run(
        [sys.executable, "-m", "schedlang", "run", str(schedule), "--device", "cpu", "--metrics", str(metrics)],
        capture_output=True, text=True, timeout=300,
    )
    assert completed.returncode == 0, completed.stderr
    assert " val " in completed.stdout
    return [json.loads(line)["validation_loss"] for line in metrics.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.default_tier  # the default tier's CPU training run on each mesh shape: 1, pipeline 2, sequence 2 x data 2
def test_validation_losses_equal_one_process_on_pipeline_sequence_and_data_meshes(tmp_path):
    """The evaluation runs only the forwards of each stage's action list ([Note: forward-only evaluation]);
    its loss after every step matches one process within 1e-5, and moves as training does."""
    rng = np.random.default_rng(0)
    np.tile(rng.integers(0, 64, 40), 100).astype("<u2").tofile(tmp_path / "train.bin")
    reference = validation_losses(tmp_path, "one", "pipeline = 1", 1, 1, 4)
    assert len(reference) == 3 and reference[0] != reference[-1]
    for name, mesh, chunks, microbatches, size in (
        ("pipeline", "pipeline = 2", 2, 2, 2),
        ("sequence_data", "sequence = 2  data = 2", 2, 1, 2),
    ):
        losses = validation_losses(tmp_path, name, mesh, chunks, microbatches, size)
        assert losses == pytest.approx(reference, rel=1e-5), name


def test_validation_batches_come_from_the_held_out_end_only(tmp_path):
    path = tmp_path / "ids.bin"
    np.arange(1000, dtype="<u2").tofile(path)
    config = DataConfig(DataKind.TOKENS, seed=1, path=str(path), dtype="uint16", validation=0.25)
    source = TokenSource(config, vocab=1000, length=31, global_batch=8)
    assert source.training_end() == 750
    for step in range(20):
        assert int(source.global_batch_tokens(step).max()) < 750
        assert int(source.validation_batch_tokens(step)[:, 0].min()) >= 750
    assert torch.equal(source.validation_batch_tokens(3), source.validation_batch_tokens(3))
    synthetic = TokenSource(DataConfig(), vocab=64, length=31, global_batch=2)
    assert not torch.equal(synthetic.validation_batch_tokens(0), synthetic.global_batch_tokens(0))
