"""A hardware profile held against one whole training step: ``schedlang profile FILE --calibrate``.

Contract. :func:`measure_step_seconds` trains a one-process schedule with ``schedlang run`` (a process of its
own, exactly what a user runs) for ``warmup + steps`` steps and returns the median ``step_seconds`` of the
steps after the warm-up, or raises :class:`CalibrationError` with the run's last lines. :func:`parts_step_seconds`
is the same schedule simulated with a profile's parts alone (its calibration set aside). :func:`calibrated`
returns the profile with a :class:`~schedlang.lowering.hardware_profile.Calibration` whose factor is their
ratio; a factor outside ``CALIBRATION_BOUNDS`` is refused, not written. Nothing here times a part: the parts
come from ``schedlang.runtime.profiling`` or from an earlier profile (``--parts-from``).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from schedlang.lowering.hardware_profile import CALIBRATION_BOUNDS, Calibration, HardwareProfile


class CalibrationError(Exception):
    """The calibration run failed or measured nonsense; the message says which and why."""


class RunTimedOut(CalibrationError):
    """The run outlasted its time limit."""


def require_one_process(program, path: str) -> None:
    mesh = program.mesh
    ranks = mesh.pipeline * mesh.sequence * mesh.data
    if ranks != 1:
        raise CalibrationError(
            f"{path}: --calibrate trains the schedule on one device; its mesh has {ranks} ranks "
            "(pipeline x sequence x data). Calibrate with a one-process schedule, e.g. "
            "benchmarks/schedules/gla_1b_one_device.sched"
        )


def train_and_read_steps(path: str, device: str, steps: int, timeout: float) -> list[dict]:
    """``schedlang run PATH --device DEVICE --steps STEPS --metrics ...`` in a process of its own: the metrics
    record of every step, or :class:`CalibrationError` saying that the run timed out or failed (its last
    lines), :class:`RunTimedOut` past ``timeout``."""
    with tempfile.TemporaryDirectory(prefix="schedlang-steps-") as directory:
        metrics = Path(directory) / "steps.jsonl"
        command = [
            sys.executable, "-m", "schedlang", "run", path, "--device", device,
            "--steps", str(steps), "--metrics", str(metrics),
        ]
        print("$ " + " ".join(command), file=sys.stderr, flush=True)
        try:
            completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise RunTimedOut(f"the run of {path} took over {timeout:g} s") from None
        if completed.returncode != 0:
            tail = " | ".join((completed.stderr or completed.stdout).strip().splitlines()[-3:])
            raise CalibrationError(f"the run of {path} failed ({completed.returncode}): {tail}")
        return [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip()]


def measure_step_seconds(path: str, device: str, warmup: int, steps: int, timeout: float) -> float:
    """The median step time of ``schedlang run PATH`` over the ``steps`` after ``warmup``; see the module doc."""
    records = train_and_read_steps(path, device, warmup + steps, timeout)
    timed = records[warmup:]
    if not timed:
        raise CalibrationError(f"the calibration run of {path} wrote {len(records)} steps; {warmup + steps} asked")
    return statistics.median(record["step_seconds"] for record in timed)


def parts_step_seconds(program, profile: HardwareProfile) -> float:
    """``program``'s step simulated with ``profile``'s parts alone (step factor 1), in seconds."""
    from schedlang.lowering.orders import stage_orders
    from schedlang.lowering.profile_cost import ProfileCostModel
    from schedlang.lowering.simulate import simulate

    uncalibrated = dataclasses.replace(profile, calibration=Calibration())
    return simulate(program, stage_orders(program), ProfileCostModel(program, uncalibrated)).makespan


def calibrated(profile: HardwareProfile, schedule: str, measured: float, predicted: float) -> HardwareProfile:
    """``profile`` with the factor ``measured / predicted``; refused outside ``CALIBRATION_BOUNDS``."""
    factor = measured / predicted
    low, high = CALIBRATION_BOUNDS
    if not low <= factor <= high:
        raise CalibrationError(
            f"the whole step of {schedule} took {measured:.4g} s against {predicted:.4g} s of its parts "
            f"({factor:.3f}x, outside {low:g}x-{high:g}x): the parts were measured on other hardware or the run "
            "was disturbed; nothing written"
        )
    calibration = Calibration(factor, schedule, measured, predicted)
    return dataclasses.replace(profile, calibration=calibration)
