"""Attacks on what the tools write and read: the script name in generated code, planted checkpoints."""

from __future__ import annotations

import ast
import os
import stat
import subprocess
import sys

import pytest
import torch

from reliability_helpers import one_rank_schedule, run_cli
from schedlang.runtime.checkpoint import UntrustedCheckpointError, load_checkpoint, save_checkpoint

ATTACK_NAMES = [
    'x"""\nimport os; os.system("touch INJECTED")\n""".py',
    "y\\N.py",
    "z'''\\\nopen('INJECTED', 'w')\n.py",
]


@pytest.mark.parametrize("name", ATTACK_NAMES, ids=["triple-quote", "backslash-N", "single-quotes"])
def test_a_hostile_output_name_stays_out_of_the_generated_code(tmp_path, name):
    schedule = tmp_path / "tiny.sched"
    schedule.write_text(one_rank_schedule(), encoding="utf-8")
    completed = run_cli("compile", schedule, "-o", name, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    script = tmp_path / name
    text = script.read_text(encoding="utf-8")
    ast.parse(text)
    assert "INJECTED" not in text
    ran = subprocess.run([sys.executable, name, "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert not (tmp_path / "INJECTED").exists()


def _saved_checkpoint(directory):
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    save_checkpoint(str(directory), 1, model, optimizer)
    return model, optimizer


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize("where", ["directory", "step directory", "metadata file"])
def test_resume_refuses_a_checkpoint_others_can_write(tmp_path, where):
    directory = tmp_path / "ckpt"
    model, optimizer = _saved_checkpoint(directory)
    target = {
        "directory": directory,
        "step directory": directory / "step-00000001",
        "metadata file": directory / "step-00000001" / ".metadata",
    }[where]
    target.chmod(stat.S_IMODE(target.stat().st_mode) | stat.S_IWOTH)
    with pytest.raises(UntrustedCheckpointError) as refusal:
        load_checkpoint(str(directory), model, optimizer)
    message = str(refusal.value)
    assert "\n" not in message
    assert f"refusing to resume from {target}: it is writable by all users" in message


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another user needs root")
def test_resume_refuses_a_checkpoint_another_user_owns(tmp_path):
    directory = tmp_path / "ckpt"
    model, optimizer = _saved_checkpoint(directory)
    os.chown(directory / "step-00000001", 65534, -1)
    with pytest.raises(UntrustedCheckpointError, match="owned by user id 65534, not by you"):
        load_checkpoint(str(directory), model, optimizer)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_saves_take_away_group_and_other_write(tmp_path):
    directory = tmp_path / "ckpt"
    previous = os.umask(0)
    try:
        model, optimizer = _saved_checkpoint(directory)
    finally:
        os.umask(previous)
    for path in (directory, directory / "step-00000001", *(directory / "step-00000001").iterdir()):
        assert not path.stat().st_mode & (stat.S_IWGRP | stat.S_IWOTH), path
    assert load_checkpoint(str(directory), model, optimizer) == 1
