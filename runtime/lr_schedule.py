"""The learning rate of each step: a linear warm-up, then constant, cosine or linear decay to ``min_lr``.

Contract: :func:`learning_rate_factor` is a pure function of the step (0-based, the step whose optimizer
update it scales), so a resumed run gets the same learning rate at every step as an uninterrupted one;
:func:`build_scheduler` wraps it in torch's ``LambdaLR``, positioned at ``start_step``. The decay ends at
``min_lr`` on the schedule's last step, ``total_steps - 1`` (``train.steps`` of the schedule file: a run
given more steps on the command line keeps ``min_lr`` after it).
"""

from __future__ import annotations

import math

import torch

from schedlang.vocabulary import LearningRateScheduleConfig, LearningRateScheduleKind


def learning_rate_factor(
    schedule: LearningRateScheduleConfig, step: int, total_steps: int, base_lr: float
) -> float:
    """The learning rate of ``step`` as a fraction of ``base_lr``."""
    if step < schedule.warmup:
        return (step + 1) / schedule.warmup
    if schedule.kind is LearningRateScheduleKind.CONSTANT:
        return 1.0
    floor = schedule.min_lr / base_lr
    decay_steps = max(total_steps - 1 - schedule.warmup, 1)
    progress = min((step - schedule.warmup) / decay_steps, 1.0)
    if schedule.kind is LearningRateScheduleKind.COSINE:
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return floor + (1.0 - floor) * (1.0 - progress)


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    schedule: LearningRateScheduleConfig,
    total_steps: int,
    base_lr: float,
    start_step: int = 0,
) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR`` over :func:`learning_rate_factor` whose current learning rate is ``start_step``'s.

    The optimizer's groups may hold a resumed checkpoint's learning rate: the schedule restarts from
    ``base_lr`` (each group's ``initial_lr``), not from it.
    """
    for group in optimizer.param_groups:
        group["initial_lr"] = base_lr
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: learning_rate_factor(schedule, step, total_steps, base_lr),
        last_epoch=start_step - 1,
    )
