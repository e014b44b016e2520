"""Nothing of a ``schedlang run`` outlives it: torchrun, its ranks and the temporary directory.

[Note: run lifetime] ``schedlang run`` starts torchrun in a session of its own, and torchrun starts each rank
in another, so no signal sent to the terminal's process group reaches them. Three things tie them to the run:

- torchrun is started with a parent-death signal (``PR_SET_PDEATHSIG`` = SIGKILL, Linux), so it dies with
  ``schedlang run`` whatever ends it, SIGKILL included; each rank has its own for torchrun
  (schedlang.runtime.lifetime), so the ranks follow.
- A watchdog process (:func:`start_watchdog`, this module run with ``-m``), in a session of its own, holds the
  read end of a pipe only ``schedlang run`` writes. When the run ends in order it writes one byte and the
  watchdog leaves; when the pipe closes without it (the run was killed) the watchdog ends what is left of the
  job and removes the temporary directory.
- A signal that stops the run (:data:`STOP_SIGNALS`: HUP, INT, TERM, QUIT) is handled alike:
  torchrun is killed first, which it cannot report (SIGTERM would make it print its own traceback), then its
  ranks get SIGTERM and, after ``grace_s``, SIGKILL (:func:`kill_torchrun`, :func:`end_ranks`). So Ctrl-C prints
  only schedlang's own lines.

Processes are found through ``/proc`` (the descendants of torchrun); elsewhere only torchrun is ended.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

STOP_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGQUIT)
PR_SET_PDEATHSIG = 1
RELEASED = b"."


def kill_with_parent() -> None:
    """For ``Popen(preexec_fn=...)``: SIGKILL this child when the process that started it dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except OSError:
        pass


def _parent_of(pid: int) -> int | None:
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat_line.rsplit(")", 1)[1].split()
    return int(fields[1]) if len(fields) > 1 and fields[0] != "Z" else None


def descendants(pid: int) -> list[int]:
    """The live descendants of ``pid`` (children first), from ``/proc``; empty where there is none."""
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    parents = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            parent = _parent_of(int(entry.name))
            if parent is not None:
                parents[int(entry.name)] = parent
    found, frontier = [], [pid]
    while frontier:
        current = frontier.pop(0)
        children = [child for child, parent in parents.items() if parent == current and child not in found]
        found += children
        frontier += children
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _parent_of(pid) is not None  # a zombie is not alive


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def processes_mentioning(text: str) -> list[int]:
    """Live processes other than this one whose command line contains ``text`` (the ranks name their script)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command_line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in command_line and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def _terminate(pids: list[int], grace_s: float) -> None:
    """SIGTERM each of ``pids``; SIGKILL those still alive after ``grace_s``."""
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids:
        if _alive(pid):
            _signal(pid, signal.SIGKILL)


def kill_torchrun(torchrun_pid: int) -> list[int]:
    """SIGKILL torchrun, which cannot report it; returns the processes it had started, to end with
    :func:`end_ranks`. Safe in a signal handler (no waiting)."""
    ranks = descendants(torchrun_pid)
    _signal(torchrun_pid, signal.SIGKILL)
    return ranks


def end_ranks(ranks: list[int], grace_s: float) -> None:
    """SIGTERM each of ``ranks``; SIGKILL those still alive after ``grace_s``."""
    _terminate(ranks, grace_s)


def start_watchdog(torchrun_pid: int, directory: Path, grace_s: float) -> int:
    """Start the watchdog of this run's job; returns the write end of its pipe (see :func:`release_watchdog`)."""
    read_end, write_end = os.pipe()
    subprocess.Popen(
        [sys.executable, "-m", "schedlang.run_lifetime", str(torchrun_pid), str(directory), str(grace_s)],
        stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    os.close(read_end)
    return write_end


def release_watchdog(write_end: int) -> None:
    """The run ended in order: the watchdog leaves without touching anything."""
    try:
        os.write(write_end, RELEASED)
    except OSError:
        pass
    os.close(write_end)


def _watch(torchrun_pid: int, directory: Path, grace_s: float) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if sys.stdin.buffer.read(1) == RELEASED:
        return
    if _alive(torchrun_pid):  # the parent-death signal has usually ended it already
        end_ranks(kill_torchrun(torchrun_pid), grace_s)
    _terminate(processes_mentioning(str(directory)), grace_s)  # ranks whose torchrun is gone
    shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    _watch(int(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]))
