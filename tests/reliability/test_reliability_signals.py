"""Stopping ``schedlang run``: a signal ends torchrun and every rank, leaves no temporary directory, says so
in one line and exits 128 + the signal number."""

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


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads /proc to find left-over ranks")
@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_run_and_every_rank(tmp_path, signum, status):
    schedule = tmp_path / "long.sched"
    schedule.write_text(one_rank_schedule(1).replace("steps = 2", "steps = 100000"), encoding="utf-8")
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    environment = dict(os.environ, TMPDIR=str(temporary), OMP_NUM_THREADS="1")
    process = subprocess.Popen(
        [sys.executable, "-m", "schedlang", "run", str(schedule), "--device", "cpu"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment,
    )
    deadline = time.monotonic() + 180
    for line in process.stdout:
        if "step 1/100000" in line or time.monotonic() > deadline:
            break
    assert processes_mentioning(str(temporary)), "the ranks should be training now"
    process.send_signal(signum)
    try:
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    stderr = process.stderr.read()
    assert process.returncode == status, stderr
    assert stderr.strip().splitlines()[-1] == (
        f"schedlang: stopped by {signal.Signals(signum).name}; torchrun and its ranks were ended"
    )
    time.sleep(1)
    assert processes_mentioning(str(temporary)) == []
    assert list(temporary.iterdir()) == []
