"""train.decay_norms_and_biases: the optimizer's weight decay with or without the parameters of < 2 dimensions."""

from __future__ import annotations

import pytest
import torch

from schedlang.compiler import compile_schedule
from schedlang.frontend import load_program_text
from schedlang.runtime.trainer import build_optimizer
from schedlang.vocabulary import OptimizerConfig, OptimizerKind, TrainConfig

LR, WEIGHT_DECAY = 0.1, 0.5


def _parameters() -> list[torch.nn.Parameter]:
    """A weight matrix, a bias and a norm weight, in float64, all ones, with zero gradients."""
    shapes = ((3, 4), (3,), (4,))
    parameters = [torch.nn.Parameter(torch.ones(shape, dtype=torch.float64)) for shape in shapes]
    for parameter in parameters:
        parameter.grad = torch.zeros_like(parameter)
    return parameters


@pytest.mark.parametrize("kind", [OptimizerKind.ADAMW, OptimizerKind.SGD])
@pytest.mark.parametrize("decay_norms_and_biases", [True, False])
def test_weight_decay_skips_vectors_only_when_asked(kind, decay_norms_and_biases):
    """With zero gradients one step is the decay alone: AdamW's decoupled ``p (1 - lr wd)``, SGD's
    ``p - lr wd p``, the same number; a parameter without decay stays 1 exactly."""
    parameters = _parameters()
    config = TrainConfig(
        optimizer=OptimizerConfig(kind=kind, lr=LR, weight_decay=WEIGHT_DECAY),
        decay_norms_and_biases=decay_norms_and_biases,
    )
    build_optimizer(parameters, config).step()
    decayed = 1.0 - LR * WEIGHT_DECAY
    matrix, bias, norm = parameters
    torch.testing.assert_close(matrix.detach(), torch.full_like(matrix, decayed), rtol=1e-12, atol=0.0)
    expected_vector = decayed if decay_norms_and_biases else 1.0
    for vector in (bias, norm):
        torch.testing.assert_close(vector.detach(), torch.full_like(vector, expected_vector), rtol=1e-12, atol=0.0)


def test_one_group_without_weight_decay():
    config = TrainConfig(optimizer=OptimizerConfig(weight_decay=0.0), decay_norms_and_biases=False)
    assert len(build_optimizer(_parameters(), config).param_groups) == 1


SCHEDULE = """schedule t
model {{ vocab = 64  d_model = 32  layers = [gla] * 2  heads = 2  head_dim = 16 }}
sequence {{ length = 32 }}
pipeline {{ microbatches = 1 }}
train {{ optimizer = adamw(lr = 1e-3, weight_decay = 0.1) {extra} }}
"""


def test_the_key_reaches_the_generated_script_only_when_not_the_default():
    off = load_program_text(SCHEDULE.format(extra="decay_norms_and_biases = false"), "t.sched")
    assert off.train.decay_norms_and_biases is False
    assert "    decay_norms_and_biases=False,\n" in compile_schedule(off).script
    default = load_program_text(SCHEDULE.format(extra=""), "t.sched")
    assert default.train.decay_norms_and_biases is True
    assert "decay_norms_and_biases" not in compile_schedule(default).script
