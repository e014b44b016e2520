"""Outputs never overwrite an input, '-' is standard output, and the launch hints are right."""

from __future__ import annotations

import subprocess
import sys

import pytest

from reliability_helpers import TWO_RANK_SCHEDULE, run_cli


@pytest.fixture
def schedule(tmp_path):
    path = tmp_path / "two.sched"
    path.write_text(TWO_RANK_SCHEDULE, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "arguments",
    [
        ("compile", "two.sched", "-o", "two.sched"),
        ("compile", "two.sched", "-o", "./sub/../two.sched"),
        ("run", "two.sched", "--metrics", "two.sched"),
        ("run", "two.sched", "--keep-script", "two.sched"),
        ("viz", "two.sched", "--format", "dot", "-o", "two.sched"),
        ("export", "two.sched", "--format", "torch-csv", "-o", "two.sched"),
    ],
    ids=["compile", "compile-other-spelling", "run-metrics", "run-keep-script", "viz", "export"],
)
def test_no_output_may_overwrite_the_schedule(schedule, arguments):
    (schedule.parent / "sub").mkdir()
    completed = run_cli(*arguments, cwd=schedule.parent)
    assert completed.returncode == 1
    assert "is the input schedule two.sched; refusing to write over it" in completed.stderr
    assert schedule.read_text(encoding="utf-8") == TWO_RANK_SCHEDULE


def test_compile_to_standard_output(schedule):
    completed = run_cli("compile", schedule, "-o", "-", cwd=schedule.parent)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith('"""Train schedule two_ranks')
    assert not (schedule.parent / "-").exists()


def test_compile_without_output_keeps_an_existing_train_py(schedule):
    existing = schedule.parent / "train.py"
    existing.write_text("# mine\n", encoding="utf-8")
    refused = run_cli("compile", schedule, cwd=schedule.parent)
    assert refused.returncode == 1
    assert "train.py already exists; give -o FILE to write elsewhere, or --force to replace it" in refused.stderr
    assert existing.read_text(encoding="utf-8") == "# mine\n"
    forced = run_cli("compile", schedule, "--force", cwd=schedule.parent)
    assert forced.returncode == 0, forced.stderr
    assert existing.read_text(encoding="utf-8").startswith('"""Train')


def test_the_launch_hints_name_the_real_process_count(schedule):
    completed = run_cli("compile", schedule, "-o", "job.py", cwd=schedule.parent)
    assert completed.returncode == 0, completed.stderr
    assert "run it with: torchrun --nproc-per-node 2 job.py" in completed.stdout
    environment = {"PATH": "/usr/bin:/bin"}
    direct = subprocess.run(
        [sys.executable, "job.py", "--device", "cpu"], cwd=schedule.parent, capture_output=True, text=True,
        timeout=120, env=environment,
    )
    assert direct.returncode == 1
    assert "Traceback" not in direct.stderr
    assert direct.stderr.strip().endswith("launch it with: torchrun --nproc-per-node 2 job.py")
