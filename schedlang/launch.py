"""Launching a generated training script through torch's own launcher.

``schedlang run`` compiles a schedule to a temporary script and hands it to
``python -m torch.distributed.run``: ``--standalone`` on one machine, or, on
several, torchrun's own static rendezvous (``--nnodes``, ``--node-rank``,
``--rdzv-endpoint``: one ``schedlang run`` per node, node 0's address as the
endpoint). This module builds that command and its environment and reports
how the job ended. A rank that fails
makes torchrun stop the others and exit non-zero; the script's ``main`` is
wrapped in torch's ``@record``, so torchrun's failure summary shows that
rank's exception.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Nodes:
    """The machines of a multi-node job, as torchrun's static rendezvous takes them."""

    count: int
    rank: int
    endpoint: str  # HOST:PORT of node 0's rendezvous


@dataclass(frozen=True)
class LaunchRequest:
    script: Path
    nproc: int  # processes on this node
    device: str
    steps: int | None = None
    metrics: Path | None = None
    timeout_s: float | None = None
    nodes: Nodes | None = None  # None: one machine


def nodes_problem(count: int, rank: int | None, endpoint: str | None, world_size: int) -> str | None:
    """Why ``--nnodes``, ``--node-rank`` and ``--rdzv-endpoint`` cannot launch a mesh of ``world_size`` ranks."""
    if count < 1:
        return f"--nnodes must be at least 1, got {count}"
    if count == 1:
        return None if rank in (None, 0) and endpoint is None else "--node-rank and --rdzv-endpoint need --nnodes > 1"
    if world_size % count:
        return f"--nnodes {count} does not divide the mesh's {world_size} ranks into equal nodes"
    if rank is None or not 0 <= rank < count:
        return f"--node-rank must be one of 0 .. {count - 1} with --nnodes {count}, got {rank}"
    host, _, port = (endpoint or "").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return f"--rdzv-endpoint must be HOST:PORT (node 0's address and a free port), got {endpoint!r}"
    return None


def torchrun_command(request: LaunchRequest) -> list[str]:
    if request.nodes is None:
        placement = ["--standalone"]
    else:
        placement = [
            f"--nnodes={request.nodes.count}",
            f"--node-rank={request.nodes.rank}",
            "--rdzv-backend=static",
            f"--rdzv-endpoint={request.nodes.endpoint}",
        ]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *placement,
        f"--nproc-per-node={request.nproc}",
        str(request.script),
        "--device",
        request.device,
    ]
    if request.steps is not None:
        command += ["--steps", str(request.steps)]
    if request.metrics is not None:
        command += ["--metrics", str(request.metrics)]
    if request.timeout_s is not None:
        command += ["--timeout", str(request.timeout_s)]
    return command


def launch_environment(request: LaunchRequest) -> dict[str, str]:
    """Share the CPU cores among the ranks instead of letting each start one thread per core; keep torch's
    temporary files (torchrun's error files, caches) in the script's directory, which ``run`` removes."""
    environment = dict(os.environ)
    environment.setdefault("PYTHONUNBUFFERED", "1")
    environment["TMPDIR"] = str(request.script.parent)
    if request.device == "cpu":
        environment.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // request.nproc)))
    return environment


GRACE_SECONDS = 20.0


class LaunchInterrupted(SystemExit):
    """``schedlang run`` was stopped by a signal after its job was ended; exits ``128 + signal``."""


def launch(request: LaunchRequest) -> int:
    """Run the job to completion with its output on this terminal; returns torchrun's exit status.

    [Note: stopping a run] The launcher, torchrun, runs in a session of its own, so a signal from the terminal
    reaches this process only. HUP, INT, TERM and QUIT end the job ([Note: run lifetime] in
    schedlang.run_lifetime: torchrun is killed, its ranks get SIGTERM, and what has not exited after
    ``GRACE_SECONDS`` is killed); then :class:`LaunchInterrupted` carries ``128 + signal`` out, one line having
    said why, and the caller's temporary directory is removed on the way. When this process is killed outright,
    torchrun's parent-death signal and the run's watchdog end the job and remove the directory.
    """
    from schedlang.run_lifetime import (
        STOP_SIGNALS, end_ranks, kill_torchrun, kill_with_parent, release_watchdog, start_watchdog,
    )

    process = subprocess.Popen(
        torchrun_command(request), env=launch_environment(request), start_new_session=True,
        preexec_fn=kill_with_parent,
    )
    watchdog = start_watchdog(process.pid, request.script.parent, GRACE_SECONDS)
    received: list[int] = []
    ranks: list[int] = []

    def stop(signum, frame) -> None:
        if not received:
            received.append(signum)
            ranks.extend(kill_torchrun(process.pid))

    previous = {signum: signal.signal(signum, stop) for signum in STOP_SIGNALS}
    try:
        status = process.wait()
    except BaseException:
        end_ranks(kill_torchrun(process.pid), GRACE_SECONDS)
        process.wait()
        release_watchdog(watchdog)
        raise
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    end_ranks(ranks, GRACE_SECONDS)  # none unless a signal stopped the job
    release_watchdog(watchdog)
    if not received:
        return status
    name = signal.Signals(received[0]).name
    print(f"schedlang: stopped by {name}; torchrun and its ranks were ended", file=sys.stderr, flush=True)
    raise LaunchInterrupted(128 + received[0])

