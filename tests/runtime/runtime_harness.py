"""Helpers for runtime tests: compile schedule text to scripts and run them on several local ranks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from schedlang import compiler

WORKER = Path(__file__).with_name("rank_worker.py")


def compile_schedule(text: str, directory: Path, name: str) -> Path:
    path = directory / f"{name}.py"
    script = compiler.compile_schedule(compiler.ScheduleText(text, f"{name}.sched"), script_name=path.name).script
    path.write_text(script, encoding="utf-8")
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class JobResult:
    return_codes: list[int]
    errors: dict[int, str]
    results: list[list[dict]] = field(default_factory=list)  # per script, per rank
    seconds: float = 0.0

    def losses(self, index: int) -> list[float]:
        return self.results[index][0]["losses"]

    def gradients(self, index: int) -> dict[str, torch.Tensor]:
        """Gradients after the first step, over all stages of data replica 0."""
        merged = {}
        for result in self.results[index]:
            if result["data_index"] == 0 and result.get("gradients") is not None:
                merged.update(result["gradients"])
        return merged


def run_job(
    scripts: list[Path],
    world_size: int,
    steps: int,
    out_dir: Path,
    extra_env: dict[str, str] | None = None,
    wall_timeout_s: float = 300.0,
) -> JobResult:
    out_dir.mkdir(parents=True, exist_ok=True)
    environment = dict(os.environ)
    environment.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        WORLD_SIZE=str(world_size),
        OMP_NUM_THREADS="1",
        TORCHELASTIC_ERROR_FILE="",
    )
    environment.update(extra_env or {})
    started = time.perf_counter()
    processes = []
    for rank in range(world_size):
        rank_environment = dict(environment, RANK=str(rank), LOCAL_RANK=str(rank))
        command = [sys.executable, str(WORKER), str(out_dir), str(steps), *map(str, scripts)]
        processes.append(subprocess.Popen(command, env=rank_environment))
    deadline = time.monotonic() + wall_timeout_s
    return_codes = []
    for process in processes:
        try:
            return_codes.append(process.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            process.kill()
            return_codes.append(process.wait())
    errors = {}
    for rank in range(world_size):
        error_file = out_dir / f"error-rank{rank}.txt"
        if error_file.exists():
            errors[rank] = error_file.read_text(encoding="utf-8")
    results = []
    if all(code == 0 for code in return_codes):
        for index in range(len(scripts)):
            results.append(
                [torch.load(out_dir / f"result-{index}-rank{rank}.pt") for rank in range(world_size)]
            )
    return JobResult(return_codes, errors, results, time.perf_counter() - started)


def run_jobs(
    jobs: dict[int, dict[str, str]], directory: Path, steps: int, wall_timeout_s: float = 300.0
) -> dict[str, tuple[list[float], dict[str, torch.Tensor]]]:
    """One job per world size of ``jobs`` (world size -> schedule name -> schedule text), every schedule of a
    job compiled into ``directory`` and run by the same ranks; returns name -> (losses, gradients after the first
    step). Fails the calling test when a rank fails."""
    outcomes = {}
    for world_size, schedules in sorted(jobs.items()):
        names = list(schedules)
        scripts = [compile_schedule(schedules[name], directory, name) for name in names]
        job = run_job(scripts, world_size, steps, directory / f"world{world_size}", wall_timeout_s=wall_timeout_s)
        assert job.return_codes == [0] * world_size, job.errors
        for index, name in enumerate(names):
            outcomes[name] = (job.losses(index), job.gradients(index))
    return outcomes


def assert_trains_like(outcome, reference, steps: int, tolerance: float) -> None:
    """``outcome`` and ``reference`` are (losses, gradients) of :func:`run_jobs`: the same number of steps, every
    loss within ``tolerance`` relative, the same gradient names, every gradient within ``tolerance`` relative."""
    (losses, gradients), (reference_losses, reference_gradients) = outcome, reference
    assert len(losses) == steps
    for step, (loss, expected) in enumerate(zip(losses, reference_losses)):
        assert abs(loss - expected) <= tolerance * abs(expected), f"step {step}: {loss} vs {expected}"
    assert sorted(gradients) == sorted(reference_gradients)
    errors = {key: relative_error(gradients[key], reference_gradients[key]) for key in reference_gradients}
    worst = max(errors, key=errors.get)
    assert errors[worst] <= tolerance, f"{worst}: relative error {errors[worst]:.2e}"


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return float((value.double() - reference.double()).norm() / reference.double().norm().clamp_min(1e-30))
