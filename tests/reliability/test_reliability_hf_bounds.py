"""``model { from = hf("dir") }`` under attack: the config is read bounded and held to the schedule keys' bounds
before anything is built from it; pickle-only weights and files that are not safetensors are refused in words."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from reliability_helpers import run_cli

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hf" / "gla_tiny" / "config.json"

SCHEDULE = """schedule from_hf
model { from = hf("model") }
mesh { pipeline = 1 }
sequence { length = 32  chunks = 2  kernel_chunk = 16 }
pipeline { microbatches = 1 }
train { steps = 1 }
"""


def _directory(tmp_path, **changes) -> Path:
    directory = tmp_path / "model"
    directory.mkdir()
    config = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    (tmp_path / "s.sched").write_text(SCHEDULE, encoding="utf-8")
    return directory


def _check(tmp_path, timeout=60):
    completed = run_cli("check", tmp_path / "s.sched", timeout=timeout)
    assert completed.returncode == 1, completed.stdout
    assert "Traceback" not in completed.stderr
    return completed.stderr


@pytest.mark.parametrize(
    "field, value, said",
    [
        ("num_hidden_layers", 10**9, "config field 'num_hidden_layers' = 1000000000 is outside 1 .. 4096"),
        ("hidden_size", 10**12, "config field 'hidden_size' = 1000000000000 is outside 1 .. 1048576"),
        ("vocab_size", 10**10, "config field 'vocab_size' = 10000000000 is outside 1 .. 16777216"),
        ("intermediate_size", 10**9, "config field 'intermediate_size' = 1000000000 is outside 1 .. 8192"),
    ],
)
def test_config_integers_are_held_to_the_keys_bounds_before_building(tmp_path, field, value, said):
    _directory(tmp_path, **{field: value})
    assert said in _check(tmp_path)


def test_a_config_that_is_a_fifo_or_a_link_to_a_device_is_refused_without_reading(tmp_path):
    directory = _directory(tmp_path)
    (directory / "config.json").unlink()
    os.mkfifo(directory / "config.json")
    assert "config.json is a FIFO, not a regular file" in _check(tmp_path, timeout=30)
    (directory / "config.json").unlink()
    (directory / "config.json").symlink_to("/dev/zero")
    assert "config.json is a character device, not a regular file" in _check(tmp_path, timeout=30)


@pytest.mark.parametrize(
    "text, said",
    [
        ("[" * 200_000 + "]" * 200_000, "nested too deeply"),
        ('{"hidden_size": ' + "7" * 5000 + "}", "cannot read"),
        (" " * (2 << 20) + "{}", "larger than 1,048,576 bytes"),
    ],
    ids=["deep", "long-integer", "large"],
)
def test_hostile_json_is_an_error_not_a_traceback(tmp_path, text, said):
    directory = _directory(tmp_path)
    (directory / "config.json").write_text(text, encoding="utf-8")
    assert said in _check(tmp_path)


def test_pickle_only_weights_are_refused_with_the_reason(tmp_path):
    directory = _directory(tmp_path)
    (directory / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    stderr = _check(tmp_path)
    assert "holds its weights only as torch pickles (pytorch_model.bin)" in stderr
    assert "unpickling can run code" in stderr


@pytest.mark.parametrize("target", ["config.json", "/dev/zero"], ids=["another-file", "device"])
def test_a_safetensors_name_that_is_not_safetensors_is_an_error(tmp_path, target):
    pytest.importorskip("safetensors")
    directory = _directory(tmp_path)
    (directory / "model.safetensors").symlink_to(directory / target if target == "config.json" else target)
    stderr = _check(tmp_path)
    assert "model.safetensors" in stderr
    assert "not a safetensors file" in stderr or "not a regular file" in stderr


def test_the_example_directory_is_still_accepted(tmp_path):
    directory = _directory(tmp_path)
    shutil.copy(EXAMPLE, directory / "config.json")
    completed = run_cli("check", tmp_path / "s.sched")
    assert completed.returncode == 0, completed.stderr
