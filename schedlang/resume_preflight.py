"""What ``schedlang run`` checks about the checkpoint it would resume from before it starts any rank.

The ranks refuse a checkpoint written for another model, mesh or schedule, and a ``--steps`` the checkpoint
has already reached (schedlang.runtime.checkpoint.resume_or_exit); refused there, torchrun would follow the
one clear line with its own failure summary. The launcher reads the same run record first, through the
same comparison (schedlang.runtime.checkpoint_manifest.first_mismatch), and refuses in one line before
torchrun starts. Whatever it cannot read (an unreadable or untrusted checkpoint) it leaves to the ranks,
which report it as before.

``--fresh`` starts over beside the existing checkpoints: :func:`fresh_checkpoint_directory` names the first
free sibling directory (``ckpt-2``, ``ckpt-3``, ...), nothing is deleted. :func:`learning_rate_note` says what
learning rate the steps past ``train.steps`` train at.
"""

from __future__ import annotations

import dataclasses
import runpy
import warnings
from pathlib import Path

from schedlang.vocabulary import LearningRateScheduleKind


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """The checkpoint the ranks would resume from: its step and step directory."""

    step: int
    path: Path


def script_run_record(script: Path) -> dict[str, str]:
    """The run record the generated ``script`` would compare checkpoints with (its ``MODEL``, ``PIPELINE``,
    ``TRAIN`` and ``MESH_SHAPE``, read without running its ``main``)."""
    from schedlang.runtime.checkpoint_manifest import run_record

    names = runpy.run_path(str(script), run_name="schedlang_resume_preflight")
    return run_record(names["MODEL"], names["PIPELINE"], names["TRAIN"], names["MESH_SHAPE"])


def newest_resume_point(directory: str | None) -> ResumePoint | None:
    """The newest checkpoint in ``directory`` whose step directory exists (the ranks' first candidate); None
    when the directory holds no complete checkpoint."""
    if directory is None or not Path(directory).is_dir():
        return None
    from schedlang.runtime.checkpoint import candidate_steps, checkpoint_path

    for step in candidate_steps(directory):
        if checkpoint_path(directory, step).is_dir():
            return ResumePoint(step, checkpoint_path(directory, step))
    return None


def checkpoint_refusal(
    directory: str | None, script: Path, steps: int, steps_option: str
) -> tuple[ResumePoint | None, str | None]:
    """The checkpoint the run would resume from, and why the ranks would refuse to train from it (None when
    they would not, or when the launcher cannot tell: the ranks then decide).

    ``steps_option`` names where ``steps`` came from (``--steps`` or ``train.steps``), for the message.
    """
    point = newest_resume_point(directory)
    if point is None:
        return None, None
    from schedlang.runtime.checkpoint import check_trusted_checkpoint, read_run_record
    from schedlang.runtime.checkpoint_manifest import first_mismatch

    try:
        check_trusted_checkpoint(point.path)
        expected = script_run_record(script)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.distributed.checkpoint warns that no process group exists
            recorded = read_run_record(point.path, expected)
    except Exception:  # an unreadable or untrusted checkpoint: the ranks report it, or fall back to an earlier one
        return point, None
    mismatch = first_mismatch(recorded, expected)
    if mismatch is not None:
        key, was, now = mismatch
        return point, (
            f"checkpoint {point.path} was written for {key} = {was}, but this schedule has {key} = {now}; "
            "give --fresh to start over beside it"
        )
    if point.step >= steps:
        return point, (
            f"{point.path} has already trained {point.step} steps and {steps_option} is {steps}: nothing to train; "
            "give a larger --steps to go on, or --fresh to start over beside it"
        )
    return point, None


def fresh_checkpoint_directory(directory: str) -> str:
    """``directory`` itself when it holds no checkpoint, else its first sibling ``<name>-<n>`` (n = 2, 3, ...)
    that does not exist yet."""
    if newest_resume_point(directory) is None and not (Path(directory) / "latest").exists():
        return directory
    number = 2
    while Path(f"{directory}-{number}").exists():
        number += 1
    return f"{directory}-{number}"


def learning_rate_note(program, steps: int) -> str | None:
    """One line saying what rate the steps past ``train.steps`` train at, when ``steps`` goes past it and the
    learning rate decays (a constant rate stays what it is); None otherwise."""
    train = program.train
    schedule = train.lr_schedule
    if steps <= train.steps or schedule.kind is LearningRateScheduleKind.CONSTANT:
        return None
    return (
        f"schedlang: note: train.lr_schedule's {schedule.kind.value} decay ends at train.steps = {train.steps}; "
        f"steps {train.steps + 1}-{steps} train at min_lr = {schedule.min_lr:g} "
        f"(set train.steps = {steps} to spread the decay over them)"
    )
