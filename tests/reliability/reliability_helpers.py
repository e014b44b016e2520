"""Shared pieces of the reliability suite: a tiny schedule and ways to run the CLI and a generated script."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ONE_RANK_SCHEDULE = """schedule one_rank
model {{ vocab = 64  d_model = 16  heads = 1  head_dim = 16  layers = [gla] * {layers} }}
mesh {{ pipeline = 1 }}
sequence {{ length = 32  chunks = 2  kernel_chunk = 16 }}
pipeline {{ microbatches = 1  order = 1f1b }}
train {{ steps = 2  optimizer = adamw(lr = 1e-2)  {train} }}
"""

TWO_RANK_SCHEDULE = """schedule two_ranks
model { vocab = 64  d_model = 16  heads = 1  head_dim = 16  layers = [gla] * 2 }
mesh { pipeline = 2 }
sequence { length = 32  chunks = 2  kernel_chunk = 16 }
pipeline { microbatches = 2  order = 1f1b }
train { steps = 2  optimizer = adamw(lr = 1e-2) }
"""


def one_rank_schedule(layers: int = 1, train: str = "") -> str:
    return ONE_RANK_SCHEDULE.format(layers=layers, train=train)


def run_cli(*arguments, cwd: Path | None = None, timeout: float = 240, **options) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "schedlang", *map(str, arguments)],
        capture_output=True, text=True, timeout=timeout, cwd=cwd, **options,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def one_rank_environment() -> dict[str, str]:
    """torchrun's variables for a job of one process, so a generated script runs without the launcher."""
    return dict(
        os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1",
    )


def run_script(script: Path, *arguments, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run a generated one-rank script as its own process, as torchrun would start it."""
    return subprocess.run(
        [sys.executable, str(script), "--device", "cpu", *map(str, arguments)],
        capture_output=True, text=True, timeout=timeout, env=one_rank_environment(), cwd=script.parent,
    )
