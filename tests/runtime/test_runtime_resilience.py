"""Checkpoint/resume and failure behaviour of generated scripts on 2 gloo ranks."""

from __future__ import annotations

import re
import time

import pytest
import torch

from runtime_harness import compile_schedule, run_job


def tiny_schedule(name: str, checkpoint: str = "", lr_schedule: str = "") -> str:
    return f"""schedule {name}
model {{ vocab = 64  d_model = 32  heads = 2  head_dim = 16  layers = [gla] * 2  mlp = swiglu(ratio = 2) }}
mesh {{ pipeline = 2 }}
sequence {{ length = 64  chunks = 2  kernel_chunk = 16 }}
pipeline {{ microbatches = 2  order = 1f1b }}
train {{ steps = 4  optimizer = adamw(lr = 1e-2)  {checkpoint}  {lr_schedule} }}
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        # On CUDA the optimizer is torch's fused AdamW (runtime/trainer.py); its state must round-trip too.
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (NCCL, one rank each)"),
        ),
    ],
)
def test_killed_run_resumes_with_identical_losses(tmp_path, device):
    """With a cosine learning-rate schedule, whose rate differs at every step: a resume that restarted the
    schedule, or kept the checkpoint's rate, would change the redone steps' updates and so the last loss."""
    environment = {"SCHEDLANG_TEST_DEVICE": device}
    uninterrupted_dir, resumed_dir = tmp_path / "full", tmp_path / "resumed"
    cosine = "lr_schedule = cosine(warmup = 1, min_lr = 1e-3)"
    uninterrupted = compile_schedule(
        tiny_schedule("full", f'checkpoint = "{uninterrupted_dir}" every 2', cosine), tmp_path, "full"
    )
    resumed = compile_schedule(
        tiny_schedule("resumed", f'checkpoint = "{resumed_dir}" every 2', cosine), tmp_path, "resumed"
    )

    full_job = run_job([uninterrupted], 2, 4, tmp_path / "job-full", environment)
    assert full_job.return_codes == [0, 0], full_job.errors
    first_part = run_job([resumed], 2, 4, tmp_path / "job-first", {**environment, "SCHEDLANG_TEST_STOP_AFTER": "3"})
    assert first_part.return_codes == [0, 0], first_part.errors
    second_part = run_job([resumed], 2, 4, tmp_path / "job-second", environment)
    assert second_part.return_codes == [0, 0], second_part.errors

    full_losses = full_job.losses(0)
    assert len(full_losses) == 4
    # The first run stopped after step 3 but its last checkpoint is after step 2, so step 3 is redone.
    assert first_part.losses(0) == full_losses[:3]
    assert second_part.losses(0) == full_losses[2:]
    assert (resumed_dir / "latest").read_text().strip() == "step-00000004"


@pytest.mark.slow
def test_dead_rank_fails_the_job_with_the_waiting_task_named(tmp_path):
    script = compile_schedule(tiny_schedule("dies"), tmp_path, "dies")
    started = time.monotonic()
    job = run_job([script], 2, 2, tmp_path / "job", {"SCHEDLANG_TEST_DIE_RANK": "1", "SCHEDLANG_TEST_TIMEOUT": "20"})
    assert job.return_codes[1] == 3
    assert job.return_codes[0] != 0
    message = job.errors[0]
    # a death is reported as a death, not as a wait that ran out of time
    assert "PeerLostError" in message and "gave up" not in message, message
    # Which operation notices the dead peer first depends on timing: the receive rank 0 blocks in, or one
    # of the sends before it (gloo can fail a send when it is posted or when it is completed).
    assert "rank 0 waited for the output gradient that task 0B0.1 needs from rank 1" in message or re.search(
        r"rank 0 could not (send|complete the send of) the activation of task 0F\d\.\d", message
    ), message
    assert time.monotonic() - started < 60


@pytest.mark.slow
def test_hung_peer_times_out_with_the_waiting_task_named(tmp_path):
    script = compile_schedule(tiny_schedule("hangs"), tmp_path, "hangs")
    job = run_job(
        [script],
        2,
        2,
        tmp_path / "job",
        {"SCHEDLANG_TEST_HANG_RANK": "0", "SCHEDLANG_TEST_HANG_SECONDS": "12", "SCHEDLANG_TEST_TIMEOUT": "3"},
        wall_timeout_s=60,
    )
    assert job.return_codes[1] != 0
    message = job.errors[1]
    assert "rank 1 waited for the activation that task 1F0.0 needs from rank 0" in message
    assert "gave up after 3s" in message
