"""Stopping ``schedlang run``: a signal (HUP, INT, TERM, QUIT) ends torchrun and every rank, leaves no temporary
directory, says so in a few lines without a traceback and exits 128 + the signal number; SIGKILL of the run's
whole process group leaves nothing running either ([Note: run lifetime] in schedlang.run_lifetime)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reliability_helpers import one_rank_schedule


def processes_mentioning(text: str) -> list[int]:
    """Live process ids whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command_line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().split(") ", 1)[1][0]
        except OSError:
            continue
        if text in command_line and state != "Z":
            found.append(int(entry.name))
    return found


def _start_training(tmp_path, **options) -> tuple[subprocess.Popen, Path]:
    """``schedlang run`` of a long one-rank schedule with its own TMPDIR, once its first step is done."""
    schedule = tmp_path / "long.sched"
    text = one_rank_schedule(1, 'checkpoint = "ckpt" every 1').replace("steps = 2", "steps = 100000")
    schedule.write_text(text, encoding="utf-8")
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    environment = dict(os.environ, TMPDIR=str(temporary), OMP_NUM_THREADS="1")
    process = subprocess.Popen(
        [sys.executable, "-m", "schedlang", "run", str(schedule), "--device", "cpu"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment, **options,
    )
    deadline = time.monotonic() + 180
    for line in process.stdout:
        if "step 1/100000" in line or time.monotonic() > deadline:
            break
    assert processes_mentioning(str(temporary)), "the ranks should be training now"
    return process, temporary


def _nothing_left(temporary: Path, within_s: float = 60) -> None:
    deadline = time.monotonic() + within_s
    while (processes_mentioning(str(temporary)) or list(temporary.iterdir())) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_mentioning(str(temporary)) == []
    assert list(temporary.iterdir()) == []


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads /proc to find left-over ranks")
@pytest.mark.parametrize(
    "signum, status",
    [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129), (signal.SIGQUIT, 131)],
    ids=["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"],
)
def test_a_signal_stops_the_run_and_every_rank(tmp_path, signum, status):
    process, temporary = _start_training(tmp_path)
    process.send_signal(signum)
    try:
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    stderr = process.stderr.read()
    assert process.returncode == status, stderr
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) <= 5, stderr
    assert f"schedlang: stopped by {signal.Signals(signum).name}; torchrun and its ranks were ended" in lines
    assert lines[-1].startswith(f"schedlang: the newest checkpoint is {tmp_path / 'ckpt'}/step-")
    _nothing_left(temporary, within_s=5)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads /proc to find left-over ranks")
def test_sigkill_of_the_whole_process_group_leaves_nothing_running(tmp_path):
    process, temporary = _start_training(tmp_path, start_new_session=True)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    _nothing_left(temporary)


def test_ctrl_c_before_the_job_starts_is_one_line_without_a_traceback(tmp_path, monkeypatch, capsys):
    import schedlang.commands.check
    from schedlang.cli import main

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(schedlang.commands.check, "run", interrupted)
    schedule = tmp_path / "one.sched"
    schedule.write_text(one_rank_schedule(1), encoding="utf-8")
    assert main(["check", str(schedule)]) == 130
    assert capsys.readouterr().err == "schedlang: interrupted\n"
