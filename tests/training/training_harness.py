"""Jobs of tests/training: ``runtime_harness.run_job`` with ``training_worker.py`` as each rank."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

import runtime_harness  # noqa: E402
from runtime_harness import compile_schedule  # noqa: E402

WORKER = Path(__file__).with_name("training_worker.py")


def run_training_job(
    schedules: dict[str, str],
    world_size: int,
    steps: int,
    directory: Path,
    extra_env: dict[str, str] | None = None,
    job_name: str | None = None,
) -> dict[str, list[dict]]:
    """Compile ``schedules`` (name -> text) into ``directory`` and run them in one job of ``world_size`` ranks;
    returns name -> each rank's result (training_worker.py's). Fails the calling test when a rank fails."""
    names = list(schedules)
    scripts = [compile_schedule(schedules[name], directory, name) for name in names]
    out = directory / (job_name or f"world{world_size}")
    original, runtime_harness.WORKER = runtime_harness.WORKER, WORKER
    try:
        job = runtime_harness.run_job(scripts, world_size, steps, out, extra_env=extra_env)
    finally:
        runtime_harness.WORKER = original
    assert job.return_codes == [0] * world_size, job.errors
    return {name: job.results[index] for index, name in enumerate(names)}


def merged(results: list[dict], key: str) -> dict:
    """``key`` (gradients, parameters, updated) merged over the stages of data replica 0."""
    out = {}
    for result in results:
        if result["data_index"] == 0 and result.get(key) is not None:
            out.update(result[key])
    return out
