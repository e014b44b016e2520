"""Launching a generated training script through torch's own launcher.

``schedlang run`` compiles a schedule to a temporary script and hands it to
``python -m torch.distributed.run --standalone``; this module builds that
command and its environment and reports how the job ended. A rank that fails
makes torchrun stop the others and exit non-zero; the script's ``main`` is
wrapped in torch's ``@record``, so torchrun's failure summary shows that
rank's exception.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LaunchRequest:
    script: Path
    nproc: int
    device: str
    steps: int | None = None
    metrics: Path | None = None
    timeout_s: float | None = None


def torchrun_command(request: LaunchRequest) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
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
    """Share the CPU cores among the ranks instead of letting each start one thread per core."""
    environment = dict(os.environ)
    environment.setdefault("PYTHONUNBUFFERED", "1")
    if request.device == "cpu":
        environment.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // request.nproc)))
    return environment


def launch(request: LaunchRequest) -> int:
    """Run the job to completion with its output on this terminal; returns torchrun's exit status."""
    completed = subprocess.run(torchrun_command(request), env=launch_environment(request), check=False)
    return completed.returncode


def read_metrics(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
