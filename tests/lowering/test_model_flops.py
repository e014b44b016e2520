"""``model_training_flops_per_token``: the model-FLOP count a step's rate is read against (benchmarks/one_device.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedlang.frontend import load_program
from schedlang.lowering.cost import model_training_flops_per_token

SCHEDULES = Path(__file__).resolve().parents[2] / "benchmarks" / "schedules"


def test_the_1b_gla_is_three_times_its_forward_by_weight_count():
    """Recurrent layers only: no term grows with the length. The forward is 2 FLOPs per weight of every linear
    layer (mixer projections, the MLP, the head) plus the chunked recurrence, so three times it lands within 3%
    of 6 FLOPs per weight (the recurrence is the rest), and near the 5.7 GFLOPs a token issue 37 states."""
    program = load_program(SCHEDULES / "gla_1b_one_device.sched")
    model = program.model
    at_64k = model_training_flops_per_token(model, 65536, program.sequence.kernel_chunk)
    assert at_64k == model_training_flops_per_token(model, 1 << 20, program.sequence.kernel_chunk)
    import torch

    from schedlang.runtime.model import build_stage_model

    stage = build_stage_model(model, tuple(range(len(model.layers))), True, True, 0, torch.device("meta"),
                              torch.bfloat16)
    matrices = sum(parameter.numel() for name, parameter in stage.named_parameters()
                   if parameter.dim() == 2 and "embed" not in name)
    assert 6 * matrices <= at_64k <= 1.03 * 6 * matrices
    assert at_64k == pytest.approx(5.7e9, rel=0.01)


def test_attention_adds_its_causal_pairs_per_token():
    """Each ``attn`` layer adds ``(length + 1) / 2`` pairs a token: the difference between two lengths is
    linear in the length difference."""
    program = load_program(SCHEDULES / "gdn_attn_1b_one_device.sched")
    model, chunk = program.model, program.sequence.kernel_chunk
    short, middle, long = (model_training_flops_per_token(model, length, chunk) for length in (4096, 8192, 12288))
    assert long > middle > short
    assert long - middle == pytest.approx(middle - short, rel=1e-9)
