"""The command line's edges: --version, closed pipes, byte-order marks, CR line ends, bounded numbers,
strict JSON, validated options and one metrics row per step."""

from __future__ import annotations

import io
import json
import os

import pytest

from reliability_helpers import TWO_RANK_SCHEDULE, one_rank_schedule, run_cli, run_script
from schedlang.cli import main


def test_version():
    completed = run_cli("--version")
    assert completed.returncode == 0
    assert completed.stdout.strip() == "schedlang 0.1.0"


class ClosedPipe(io.StringIO):
    """Standard output whose reader has gone (``schedlang ... | head``)."""

    def __init__(self, descriptor: int) -> None:
        super().__init__()
        self.descriptor = descriptor

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self) -> int:
        return self.descriptor


def test_a_closed_pipe_ends_the_command_quietly(tmp_path, monkeypatch, capsys):
    schedule = tmp_path / "two.sched"
    schedule.write_text(TWO_RANK_SCHEDULE, encoding="utf-8")
    read_end, write_end = os.pipe()
    try:
        monkeypatch.setattr("sys.stdout", ClosedPipe(write_end))
        status = main(["viz", str(schedule), "--format", "dot", "-o", "-"])
    finally:
        os.close(read_end)
        os.close(write_end)
    assert status == 141
    assert capsys.readouterr().err == ""


def test_a_byte_order_mark_is_accepted(tmp_path):
    schedule = tmp_path / "bom.sched"
    schedule.write_bytes(b"\xef\xbb\xbf" + TWO_RANK_SCHEDULE.encode())
    completed = run_cli("check", schedule)
    assert completed.returncode == 0, completed.stderr
    assert "legal" in completed.stdout


def test_carriage_return_line_ends_give_right_positions(tmp_path):
    schedule = tmp_path / "mac.sched"
    text = TWO_RANK_SCHEDULE.replace("[gla] * 2", "[glaa] * 2")
    schedule.write_bytes(text.replace("\n", "\r").encode())
    completed = run_cli("check", schedule)
    assert completed.returncode == 1
    column = text.splitlines()[1].index("glaa") + 1
    assert completed.stderr.startswith(f"{schedule}:2:{column}: error: unknown layer kind 'glaa'"), completed.stderr


def test_an_enormous_mlp_ratio_is_refused_at_check(tmp_path):
    schedule = tmp_path / "wide.sched"
    text = TWO_RANK_SCHEDULE.replace("layers = [gla] * 2", "layers = [gla] * 2  mlp = swiglu(ratio = 1e308)")
    schedule.write_text(text, encoding="utf-8")
    completed = run_cli("check", schedule)
    assert completed.returncode == 1
    column = text.splitlines()[1].index("ratio") + 1
    assert completed.stderr.startswith(f"{schedule}:2:{column}: error: 'model.mlp.ratio' = 1e+308 is above the limit")
    assert "Traceback" not in completed.stderr


def test_simulate_json_is_strict_json(tmp_path):
    schedule = tmp_path / "two.sched"
    schedule.write_text(TWO_RANK_SCHEDULE, encoding="utf-8")
    completed = run_cli("simulate", schedule, "--json", "--cost-model", "flops", "--bandwidth", "1e-320")
    assert completed.returncode == 0, completed.stderr

    def refuse(constant):
        raise AssertionError(f"{constant} is not JSON")

    result = json.loads(completed.stdout, parse_constant=refuse)
    assert result["makespan"] is None


@pytest.mark.parametrize("timeout", ["0", "-1", "nan", "inf"])
def test_run_validates_timeout_before_launching(tmp_path, timeout):
    schedule = tmp_path / "two.sched"
    schedule.write_text(TWO_RANK_SCHEDULE, encoding="utf-8")
    completed = run_cli("run", schedule, "--device", "cpu", "--timeout", timeout, timeout=60)
    assert completed.returncode == 1
    assert "--timeout must be a number of seconds above 0" in completed.stderr
    assert "training" not in completed.stdout


@pytest.mark.slow
def test_metrics_have_one_row_per_step_whatever_log_every_says(tmp_path):
    schedule = tmp_path / "sparse.sched"
    schedule.write_text(one_rank_schedule(1, "log_every = 2").replace("steps = 2", "steps = 3"), encoding="utf-8")
    script = tmp_path / "sparse.py"
    assert run_cli("compile", schedule, "-o", script).returncode == 0
    metrics = tmp_path / "metrics.jsonl"
    completed = run_script(script, "--metrics", metrics)
    assert completed.returncode == 0, completed.stderr
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1, 2, 3]
    shown = [line for line in completed.stdout.splitlines() if "loss" in line]
    assert len(shown) == 2 and "step 2/3" in shown[0] and "step 3/3" in shown[1]
