"""Chunk boundaries: uniform cuts and StateFlow's FLOP-balanced cut (Eq. 9-11)."""

from __future__ import annotations

import math

import pytest

from schedlang.frontend import load_program_text
from schedlang.lowering.cost import CostModelKind, make_cost_model, mixer_flops_per_token
from schedlang.lowering.partition import (
    balanced_boundaries,
    layer_flop_coefficients,
    uniform_boundaries,
)
from schedlang.vocabulary.actions import TaskId
from schedlang.vocabulary import LayerKind, ModelConfig


def chunk_costs(boundaries, n_linear, n_softmax, linear_cost, dense_cost, softmax_cost):
    """Eq. 9 written out directly, for each chunk."""
    costs = []
    for start, end in zip(boundaries, boundaries[1:]):
        size = end - start
        costs.append(
            (n_linear * linear_cost + dense_cost) * size
            + n_softmax * softmax_cost * (start * size + size * size / 2)
        )
    return costs


def test_uniform_is_exactly_equal_when_divisible():
    assert uniform_boundaries(4096, 4, 64) == (0, 1024, 2048, 3072, 4096)
    assert uniform_boundaries(4096, 1, 64) == (0, 4096)
    assert uniform_boundaries(4096, 64, 64)[1] == 64


def test_uniform_deals_out_whole_kernel_chunks_when_not_divisible():
    boundaries = uniform_boundaries(1000, 3, 64)  # 16 kernel chunks, the last ragged
    assert boundaries[0] == 0 and boundaries[-1] == 1000
    assert all(boundary % 64 == 0 for boundary in boundaries[1:-1])
    sizes = [end - start for start, end in zip(boundaries, boundaries[1:])]
    assert max(sizes) - min(sizes) <= 64


def test_uniform_rejects_more_chunks_than_kernel_chunks():
    with pytest.raises(ValueError, match="at most 64 chunks fit"):
        uniform_boundaries(4096, 65, 64)


@pytest.mark.parametrize("n_chunks", [2, 4, 8])
@pytest.mark.parametrize("n_linear,n_softmax", [(6, 2), (0, 4), (3, 1)])
def test_alpha_one_equalizes_eq9_costs(n_chunks, n_linear, n_softmax):
    """With kernel_chunk = 1 rounding is negligible, so Eq. 10 must hold almost exactly."""
    length = 1_000_000
    linear_cost, dense_cost, softmax_cost = 3.0e3, 5.0e3, 0.02
    boundaries = balanced_boundaries(
        length, n_chunks, 1.0, 1, n_linear, n_softmax, linear_cost, dense_cost, softmax_cost
    )
    costs = chunk_costs(boundaries, n_linear, n_softmax, linear_cost, dense_cost, softmax_cost)
    assert max(costs) / min(costs) == pytest.approx(1.0, abs=1e-4)
    sizes = [end - start for start, end in zip(boundaries, boundaries[1:])]
    assert sizes == sorted(sizes, reverse=True)


def test_attention_only_boundaries_follow_square_root():
    # F(x) = b x^2 / 2, so F(c_i) = (i/N) F(T) gives c_i = T sqrt(i/N).
    boundaries = balanced_boundaries(4096, 4, 1.0, 64, 0, 2, 0.0, 0.0, 1.0)
    expected = [round(4096 * math.sqrt(index / 4) / 64) * 64 for index in range(1, 4)]
    assert list(boundaries[1:-1]) == expected
    assert boundaries == (0, 2048, 2880, 3520, 4096)


def test_alpha_blends_linearly_between_equal_and_balanced():
    arguments = dict(
        n_linear_layers=2,
        n_softmax_layers=2,
        linear_cost_per_token=1.0e3,
        dense_cost_per_token=0.0,
        softmax_cost_per_pair=1.0,
    )
    length = 1 << 20
    equal = balanced_boundaries(length, 4, 0.0, 1, **arguments)
    hybrid = balanced_boundaries(length, 4, 1.0, 1, **arguments)
    blended = balanced_boundaries(length, 4, 0.75, 1, **arguments)
    assert equal == (0, length // 4, length // 2, 3 * length // 4, length)
    for index in range(1, 4):
        assert blended[index] == pytest.approx(0.25 * equal[index] + 0.75 * hybrid[index], abs=1)


def test_linear_only_model_is_cut_equally_whatever_alpha():
    assert balanced_boundaries(4096, 4, 1.0, 64, 4, 0, 1.0, 1.0, 1.0) == (0, 1024, 2048, 3072, 4096)


def test_rounding_collisions_are_separated():
    # alpha = 3 pushes every boundary towards the end; rounding must keep them apart.
    boundaries = balanced_boundaries(256, 4, 3.0, 64, 0, 2, 0.0, 0.0, 1.0)
    assert boundaries == (0, 64, 128, 192, 256)


@pytest.mark.parametrize(
    "arguments,match",
    [
        ((256, 5, 1.0, 64, 1, 1, 1.0, 1.0, 1.0), "at most 4 chunks fit"),
        ((4096, 4, -0.5, 64, 1, 1, 1.0, 1.0, 1.0), "alpha"),
        ((4096, 4, 1.0, 64, 0, 0, 1.0, 0.0, 1.0), "no cost"),
        ((4096, 4, 1.0, 64, 1, 1, float("nan"), 0.0, 1.0), "linear_cost_per_token"),
    ],
)
def test_balanced_rejects_impossible_requests(arguments, match):
    with pytest.raises(ValueError, match=match):
        balanced_boundaries(*arguments)


def test_layer_flop_coefficients_come_from_the_flops_cost_model():
    model = ModelConfig(
        vocab=256,
        d_model=128,
        layers=(LayerKind.GLA, LayerKind.SIMPLE_GLA, LayerKind.GLA, LayerKind.ATTN),
        heads=2,
        head_dim=64,
        mlp_ratio=4.0,
    )
    coefficients = layer_flop_coefficients(model, kernel_chunk=64)

    def mixer(kind):
        return mixer_flops_per_token(kind, 128, 2, 64, 64)

    assert coefficients.n_linear_layers == 3 and coefficients.n_softmax_layers == 1
    assert coefficients.linear_cost_per_token * 3 == pytest.approx(
        2 * mixer(LayerKind.GLA) + mixer(LayerKind.SIMPLE_GLA)
    )
    assert coefficients.softmax_cost_per_pair == 4 * 2 * 64
    assert coefficients.dense_cost_per_token == mixer(LayerKind.ATTN) + 4 * 2 * 3 * 128 * 512 + 2 * 128 * 256


HYBRID = """schedule hybrid
model {{ vocab = 256  d_model = 256  layers = [gla, gla, gla, attn] * 2  heads = 4  head_dim = 64 }}
mesh {{ pipeline = 1 }}
sequence {{ length = 65536  chunks = 8  partition = {partition}  kernel_chunk = 16 }}
pipeline {{ microbatches = 1  order = 1f1b }}
train {{ steps = 1 }}
"""


def forward_durations(partition: str) -> list[float]:
    program = load_program_text(HYBRID.format(partition=partition), "hybrid.sched")
    cost_model = make_cost_model(CostModelKind.FLOPS, program)
    return [cost_model.task_duration(TaskId.forward(0, 0, chunk)) for chunk in range(program.n_chunks)]


def test_balanced_cut_is_balanced_for_the_simulator():
    balanced = forward_durations("balanced(alpha = 1)")
    uniform = forward_durations("uniform")
    assert max(balanced) / min(balanced) < 1.01
    assert max(uniform) / min(uniform) > 1.5  # the hybrid's late chunks attend to long prefixes