"""A hardware profile held against one whole training step: ``schedlang profile FILE --calibrate``.

Contract. :func:`measure_step_seconds` trains a one-process schedule with ``schedlang run`` (a process of its
own, exactly what a user runs) for ``warmup + steps`` steps and returns the median ``step_seconds`` of the
steps after the warm-up, or raises :class:`CalibrationError` with the run's last lines. :func:`parts_step_seconds`
is the same schedule simulated with a profile's parts alone (its calibration set aside). :func:`calibrated`
returns the profile with a :class:`~schedlang.lowering.hardware_profile.Calibration` whose factor is their
ratio; a factor outside ``CALIBRATION_BOUNDS`` is refused, not written. :func:`host_bound_text` is the same
schedule cut into ``HOST_CALIBRATION_CHUNKS`` eager chunks of a short sequence, whose step the host's launches
bound; :func:`fitted_host_factor` is the host factor at which its simulated step equals the measured one
(bisection: the simulated step never falls as the factor grows), refused outside ``HOST_CALIBRATION_BOUNDS``.
Nothing here times a part: the parts come from ``schedlang.runtime.profiling`` or from an earlier profile
(``--parts-from``).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from schedlang.lowering.hardware_profile import (
    CALIBRATION_BOUNDS,
    HOST_CALIBRATION_BOUNDS,
    Calibration,
    HardwareProfile,
)

HOST_CALIBRATION_CHUNKS = 64
HOST_CALIBRATION_LENGTH = 32768
"""The host-bound variant: 64 eager chunks of at most 512 tokens, so every task waits on its launches."""


class CalibrationError(Exception):
    """The calibration run failed or measured nonsense; the message says which and why."""


class RunTimedOut(CalibrationError):
    """The run outlasted its time limit; ``steps`` holds the metrics records of the steps it finished first."""

    def __init__(self, message: str, steps: list[dict] | None = None):
        super().__init__(message)
        self.steps = steps or []


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
    lines), :class:`RunTimedOut` past ``timeout`` (with the records of the steps finished by then)."""
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
            raise RunTimedOut(f"the run of {path} took over {timeout:g} s", read_steps(metrics)) from None
        if completed.returncode != 0:
            tail = " | ".join((completed.stderr or completed.stdout).strip().splitlines()[-3:])
            raise CalibrationError(f"the run of {path} failed ({completed.returncode}): {tail}")
        return read_steps(metrics)


def read_steps(metrics: Path) -> list[dict]:
    """The complete records of a ``--metrics`` file (none when it was never written; a line cut off by a killed
    run is left out)."""
    if not metrics.exists():
        return []
    records = []
    for line in metrics.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return records


def measure_step_seconds(path: str, device: str, warmup: int, steps: int, timeout: float) -> float:
    """The median step time of ``schedlang run PATH`` over the ``steps`` after ``warmup``; see the module doc."""
    records = train_and_read_steps(path, device, warmup + steps, timeout)
    timed = records[warmup:]
    if not timed:
        raise CalibrationError(f"the calibration run of {path} wrote {len(records)} steps; {warmup + steps} asked")
    return statistics.median(record["step_seconds"] for record in timed)


def simulated_step_seconds(program, profile: HardwareProfile) -> float:
    """``program``'s step simulated with ``profile`` as it is, in seconds."""
    from schedlang.lowering.orders import stage_orders
    from schedlang.lowering.profile_cost import ProfileCostModel
    from schedlang.lowering.simulate import simulate

    return simulate(program, stage_orders(program), ProfileCostModel(program, profile)).makespan


def parts_step_seconds(program, profile: HardwareProfile) -> float:
    """``program``'s step simulated with ``profile``'s parts alone (step factor 1), in seconds."""
    return simulated_step_seconds(program, dataclasses.replace(profile, calibration=Calibration()))


def host_bound_changes(program) -> dict:
    """The keys that make ``program`` the host-bound variant (see the module doc)."""
    length = min(program.sequence.length, HOST_CALIBRATION_LENGTH)
    kernel_chunks = -(-length // program.sequence.kernel_chunk)  # a chunk holds whole kernel chunks
    return {
        "length": length, "chunks": min(HOST_CALIBRATION_CHUNKS, kernel_chunks), "cuda_graphs": False,
        "recompute": "none", "offload": False, "split_backward": False,
    }


def host_bound_text(program) -> str:
    """``program``'s schedule text revised to its host-bound variant (checked by the caller's compile)."""
    from schedlang.compiler import revised_text

    return revised_text(program, host_bound_changes(program))


def fitted_host_factor(program, profile: HardwareProfile, measured: float, iterations: int = 40) -> float:
    """The host factor at which ``program`` (the host-bound variant) simulates to ``measured`` seconds, with
    ``profile``'s step factor kept; :class:`CalibrationError` when no factor within the bounds reaches it."""

    def step(factor: float) -> float:
        calibration = dataclasses.replace(profile.calibration, host_factor=factor)
        return simulated_step_seconds(program, dataclasses.replace(profile, calibration=calibration))

    low, high = HOST_CALIBRATION_BOUNDS
    slowest, fastest = step(high), step(low)
    if not fastest <= measured <= slowest:
        raise CalibrationError(
            f"the host-bound step measured {measured:.4g} s, but the profile simulates it between {fastest:.4g} s "
            f"and {slowest:.4g} s for host factors {low:g}x-{high:g}x: its device times or its host times are "
            "not this machine's; nothing written"
        )
    for _ in range(iterations):
        middle = (low + high) / 2
        low, high = (middle, high) if step(middle) < measured else (low, middle)
    return (low + high) / 2


def host_calibrated(profile: HardwareProfile, schedule: str, measured: float, program) -> HardwareProfile:
    """``profile`` with the host factor fitted to ``program`` (the host-bound variant, described by
    ``schedule``) measured at ``measured`` seconds a step."""
    factor = fitted_host_factor(program, profile, measured)
    at_one = simulated_step_seconds(
        program, dataclasses.replace(profile, calibration=dataclasses.replace(profile.calibration, host_factor=1.0))
    )
    calibration = dataclasses.replace(
        profile.calibration, host_factor=factor, host_schedule=schedule,
        host_measured_step_seconds=measured, host_parts_step_seconds=at_one,
    )
    return dataclasses.replace(profile, calibration=calibration)


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
    calibration = dataclasses.replace(
        profile.calibration, step_factor=factor, schedule=schedule, measured_step_seconds=measured,
        parts_step_seconds=predicted,
    )
    return dataclasses.replace(profile, calibration=calibration)
