"""Checkpoints under attack: shard checksums, ``latest`` read only after the trust check and bounded, no fresh run
writing over another run's checkpoints, and a run that stops at a non-finite loss with strict-JSON metrics."""

from __future__ import annotations

import json
import os
import threading
import warnings

import pytest
import torch

from reliability_helpers import one_rank_schedule, run_cli, run_script
from schedlang.runtime.checkpoint import (
    CheckpointError,
    UntrustedCheckpointError,
    checkpoint_path,
    load_checkpoint,
    save_checkpoint,
)

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _two_checkpoints(directory):
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.no_grad():
        model.weight.fill_(1.0)
    save_checkpoint(str(directory), 1, model, optimizer)
    with torch.no_grad():
        model.weight.fill_(2.0)
    save_checkpoint(str(directory), 2, model, optimizer)
    return model, optimizer


def _load(directory, model, optimizer):
    said = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = load_checkpoint(str(directory), model, optimizer, say=said.append)
    return step, said


def _load_or_raise_within(directory, model, optimizer, seconds: float = 60):
    """``_load`` in a thread: what it returns or raises, or a failure when it blocks (opening a FIFO would)."""
    outcome = {}

    def load():
        try:
            outcome["value"] = _load(directory, model, optimizer)
        except BaseException as error:  # handed to the test's thread
            outcome["error"] = error

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"loading {directory} blocked for {seconds} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _shard(directory, step):
    shards = sorted(checkpoint_path(str(directory), step).glob("*.distcp"))
    assert shards
    return max(shards, key=lambda path: path.stat().st_size)


def test_every_shard_has_a_checksum_in_the_manifest(tmp_path):
    from schedlang.runtime.checkpoint import CHECKSUM_FILE

    _two_checkpoints(tmp_path)
    step_directory = checkpoint_path(str(tmp_path), 2)
    recorded = json.loads((step_directory / CHECKSUM_FILE).read_text())
    assert set(recorded) == {entry.name for entry in step_directory.iterdir()} - {CHECKSUM_FILE}
    assert ".metadata" in recorded and all(len(entry["sha256"]) == 64 for entry in recorded.values())


def test_a_corrupt_shard_of_the_same_size_falls_back_naming_the_shard(tmp_path):
    model, optimizer = _two_checkpoints(tmp_path)
    shard = _shard(tmp_path, 2)
    data = bytearray(shard.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 4096] = b"\xff" * len(data[middle:middle + 4096])
    shard.write_bytes(bytes(data))
    step, said = _load(tmp_path, model, optimizer)
    assert step == 1
    assert torch.equal(model.weight, torch.ones(64, 64))
    assert said == [f"schedlang: checkpoint {shard} does not match its checksum (its content changed: corrupt); "
                    "trying an earlier one"]


def test_a_truncated_shard_is_named_not_the_metadata(tmp_path):
    model, optimizer = _two_checkpoints(tmp_path)
    shard = _shard(tmp_path, 2)
    shard.write_bytes(shard.read_bytes()[:100])
    step, said = _load(tmp_path, model, optimizer)
    assert step == 1
    assert len(said) == 1 and said[0].startswith(f"schedlang: checkpoint {shard} does not match its checksum")
    assert ".metadata" not in said[0]


def test_a_fresh_run_refuses_to_write_over_checkpoints_without_latest(tmp_path):
    model, optimizer = _two_checkpoints(tmp_path)
    (tmp_path / "latest").unlink()
    with pytest.raises(CheckpointError) as raised:
        _load(tmp_path, model, optimizer)
    message = str(raised.value)
    assert message.startswith(f"{tmp_path} holds checkpoints (step-00000002, 2 in all) but no 'latest' names one")
    assert "give train.checkpoint another directory" in message


def test_an_interrupted_first_save_does_not_block_a_fresh_start(tmp_path):
    model, optimizer = _two_checkpoints(tmp_path)
    (tmp_path / "latest").unlink()
    for step in (1, 2):
        (checkpoint_path(str(tmp_path), step) / ".metadata").unlink()
    assert _load(tmp_path, model, optimizer) == (0, [])


def test_latest_is_not_opened_in_a_directory_the_trust_check_refuses(tmp_path):
    directory = tmp_path / "ckpt"
    directory.mkdir()
    os.mkfifo(directory / "latest")  # opening it for reading would block for ever
    directory.chmod(0o777)
    model, optimizer = _two_checkpoints(tmp_path / "other")
    with pytest.raises(UntrustedCheckpointError, match="it is writable by group and others"):
        _load_or_raise_within(directory, model, optimizer)


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_latest_that_is_not_a_regular_file_is_refused_without_reading(tmp_path, kind):
    model, optimizer = _two_checkpoints(tmp_path)
    latest = tmp_path / "latest"
    latest.unlink()
    if kind == "fifo":
        os.mkfifo(latest, 0o600)
    else:
        latest.symlink_to("/dev/zero")
    with pytest.raises(CheckpointError, match="not a regular file|owned by user id|writable by"):
        _load_or_raise_within(tmp_path, model, optimizer)


def test_non_finite_losses_and_weights_stop_with_one_line():
    from schedlang.runtime.finite_guard import NonFiniteLossError, stop_unless_finite, stop_unless_finite_weights

    stop_unless_finite(3, 1.5, skipped=False, rank_zero=True, last_saved=2)
    stop_unless_finite(3, float("inf"), skipped=True, rank_zero=True, last_saved=2)  # loss scaling skipped it
    with pytest.raises(NonFiniteLossError) as raised:
        stop_unless_finite(3, float("nan"), skipped=False, rank_zero=True, last_saved=2)
    assert str(raised.value.code).startswith("schedlang: error: the loss of step 3 is nan, not a finite number: "
                                             "training stopped, the newest checkpoint (step 2) is before it")
    with pytest.raises(NonFiniteLossError) as raised:
        stop_unless_finite(3, float("nan"), skipped=False, rank_zero=False, last_saved=2)
    assert raised.value.code == 1
    weights = [torch.ones(3), torch.tensor([1.0, float("inf")])]
    stop_unless_finite_weights(4, weights[:1], torch.device("cpu"), True, None)
    with pytest.raises(NonFiniteLossError, match="the weights after step 4 are not finite"):
        stop_unless_finite_weights(4, weights, torch.device("cpu"), True, None)


@pytest.mark.slow
def test_a_diverging_run_stops_with_an_error_and_strict_json_metrics(tmp_path):
    schedule = tmp_path / "diverges.sched"
    text = one_rank_schedule(1).replace("lr = 1e-2", "lr = 1e308").replace("steps = 2", "steps = 4")
    schedule.write_text(text, encoding="utf-8")
    script = tmp_path / "diverges.py"
    assert run_cli("compile", schedule, "-o", script).returncode == 0
    metrics = tmp_path / "metrics.jsonl"
    completed = run_script(script, "--metrics", metrics)
    assert completed.returncode == 1, completed.stdout
    assert "Traceback" not in completed.stderr
    assert "is nan, not a finite number: training stopped" in completed.stderr

    def refuse(constant):
        raise AssertionError(f"{constant} is not JSON")

    records = [json.loads(line, parse_constant=refuse) for line in metrics.read_text().splitlines()]
    assert records[-1]["loss"] is None
    assert len(records) < 4
