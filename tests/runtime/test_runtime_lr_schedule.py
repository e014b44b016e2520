"""train.lr_schedule: the learning rate of every step, from the schedule text to torch's LambdaLR."""

from __future__ import annotations

import math

import pytest
import torch

from schedlang.frontend import load_program_text
from schedlang.runtime.lr_schedule import build_scheduler, learning_rate_factor
from schedlang.vocabulary import LearningRateScheduleConfig, LearningRateScheduleKind

STEPS, LR = 11, 0.1


def rates(schedule: LearningRateScheduleConfig, start_step: int = 0, steps: int = STEPS) -> list[float]:
    """The learning rate the optimizer uses at each step from ``start_step``, through LambdaLR."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    scheduler = build_scheduler(optimizer, schedule, STEPS, LR, start_step)
    seen = []
    for _ in range(start_step, steps):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return seen


def test_cosine_warms_up_linearly_then_falls_to_min_lr_on_the_last_step():
    schedule = LearningRateScheduleConfig(LearningRateScheduleKind.COSINE, warmup=2, min_lr=0.01)
    seen = rates(schedule)
    assert seen[:2] == pytest.approx([0.05, 0.1])
    assert seen[2] == pytest.approx(LR)  # the decay starts at the full rate
    assert seen[-1] == pytest.approx(0.01)
    middle = 2 + (STEPS - 1 - 2) / 2  # halfway through the decay: halfway between lr and min_lr
    assert learning_rate_factor(schedule, middle, STEPS, LR) * LR == pytest.approx((LR + 0.01) / 2)
    assert all(later <= earlier for earlier, later in zip(seen[1:], seen[2:]))


def test_linear_and_constant():
    linear = rates(LearningRateScheduleConfig(LearningRateScheduleKind.LINEAR, warmup=0, min_lr=0.0))
    assert linear == pytest.approx([LR * (1 - step / (STEPS - 1)) for step in range(STEPS)])
    constant = rates(LearningRateScheduleConfig(LearningRateScheduleKind.CONSTANT, warmup=4))
    assert constant == pytest.approx([0.025, 0.05, 0.075, 0.1] + [0.1] * (STEPS - 4))


@pytest.mark.parametrize("start", [1, 3, 7])
def test_a_scheduler_built_at_a_later_step_continues_the_same_rates(start):
    """A resume builds the scheduler at its first step, over an optimizer that may hold any stored rate."""
    schedule = LearningRateScheduleConfig(LearningRateScheduleKind.COSINE, warmup=3, min_lr=0.001)
    assert rates(schedule, start) == pytest.approx(rates(schedule)[start:])


def test_past_the_schedule_the_rate_stays_at_min_lr():
    schedule = LearningRateScheduleConfig(LearningRateScheduleKind.COSINE, warmup=0, min_lr=0.02)
    assert learning_rate_factor(schedule, STEPS + 5, STEPS, LR) * LR == pytest.approx(0.02)
    assert not math.isnan(learning_rate_factor(schedule, 0, 1, LR))  # a one-step run: no division by zero


def test_the_schedule_text_reaches_the_program():
    text = """schedule lr
model { vocab = 64  d_model = 32  layers = [gla] * 2  heads = 2  head_dim = 16 }
sequence { length = 64  chunks = 2  kernel_chunk = 16 }
pipeline { microbatches = 1 }
train { steps = 20  optimizer = adamw(lr = 1e-2)  lr_schedule = linear(warmup = 5, min_lr = 1e-4) }
"""
    schedule = load_program_text(text, "lr.sched").train.lr_schedule
    assert (schedule.kind, schedule.warmup, schedule.min_lr) == (LearningRateScheduleKind.LINEAR, 5, 1e-4)
