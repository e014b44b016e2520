"""Where a sequence is cut into pipeline chunks: uniform and StateFlow's balanced cut.

Both functions return boundaries ``c_0 = 0 < c_1 < ... < c_N = length`` whose
inner values are multiples of ``kernel_chunk`` (the last chunk is ragged only
when the length is not a multiple), as [Note: program contract] requires; they
raise ``ValueError`` with the reason when no such cut exists.

[Note: balanced chunking]
StateFlow section 3.2: the cost of chunk i, of length s_i starting at c_i, is

    Cost_i = (L_lin C_lin + C_dense) s_i + L_soft C_soft (c_i s_i + s_i^2 / 2)     (Eq. 9)

so the cost of the prefix [0, x) is F(x) = a x + b x^2 / 2 with
a = L_lin C_lin + C_dense and b = L_soft C_soft. Equal costs (Eq. 10) put
boundary i where F(c_i) = (i / N) F(T), the positive root of a quadratic. The
boundaries used are blended with equal chunking, c_i(alpha) =
(1 - alpha) i T / N + alpha c_i^hybrid (Eq. 11), then rounded to the nearest
multiple of the kernel chunk (the paper rounds to 128, its kernel chunk).
The per-layer coefficients come from :func:`layer_flop_coefficients`, which
takes them from the ``flops`` cost model so the simulator sees the cut balanced.

Under sequence parallelism (``S`` ranks, each holding ``s_i / S`` contiguous
tokens of every chunk) a chunk takes as long as its slowest rank, the last one,
whose queries also attend to the keys of every earlier rank's slice
(:func:`schedlang.lowering.cost.attention_pairs`):

    S Cost_i = (L_lin C_lin + C_dense) s_i + L_soft C_soft (c_i s_i + k s_i^2),  k = (2S - 1) / (2S)

With ``S = 1`` this is Eq. 9 (``k = 1/2``) and the closed form above applies;
otherwise no prefix function has these differences, and the equal-cost cut is
found by bisection on the common cost: from ``c_0 = 0`` each chunk is as long as
that cost allows (the positive root of its quadratic), and the cost is the one
whose ``N`` chunks end at ``T``. The blend and rounding are the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from schedlang.lowering.cost import (
    last_rank_square_share,
    head_flops_per_token,
    layer_mixer_flops_per_token,
    mlp_flops_per_token,
    model_attention_pair_flops,
)
from schedlang.lowering.program import ScheduleProgram
from schedlang.vocabulary import LayerKind, ModelConfig, OrderKind, PartitionKind


def _kernel_blocks(length: int, kernel_chunk: int) -> int:
    return -(-length // kernel_chunk)


def _check_cut(length: int, n_chunks: int, kernel_chunk: int) -> None:
    if length < 1:
        raise ValueError(f"the sequence length must be positive, got {length}")
    if kernel_chunk < 1:
        raise ValueError(f"the kernel chunk must be positive, got {kernel_chunk}")
    if n_chunks < 1:
        raise ValueError(f"the number of chunks must be positive, got {n_chunks}")
    blocks = _kernel_blocks(length, kernel_chunk)
    if n_chunks > blocks:
        raise ValueError(
            f"cannot cut {length} tokens into {n_chunks} chunks of whole {kernel_chunk}-token kernel"
            f" chunks: at most {blocks} chunks fit"
        )


def uniform_boundaries(length: int, n_chunks: int, kernel_chunk: int) -> tuple[int, ...]:
    """Chunks as equal as whole kernel chunks allow.

    Exactly equal when ``length`` is a multiple of ``n_chunks * kernel_chunk``;
    otherwise the ``ceil(length / kernel_chunk)`` kernel chunks are dealt out as
    evenly as possible, the later chunks getting the extra ones.
    """
    _check_cut(length, n_chunks, kernel_chunk)
    blocks = _kernel_blocks(length, kernel_chunk)
    inner = [(index * blocks // n_chunks) * kernel_chunk for index in range(1, n_chunks)]
    return (0, *inner, length)


def _hybrid_boundary(
    fraction: float, length: int, linear_coefficient: float, quadratic_coefficient: float
) -> float:
    """The x in [0, length] with F(x) = fraction * F(length), F(x) = a x + b x^2 / 2."""
    a, b = linear_coefficient, quadratic_coefficient
    target = fraction * (a * length + b * length * length / 2.0)
    if b == 0.0:
        return fraction * length
    # The root (-a + sqrt(a^2 + 2 b target)) / b, written without cancellation.
    return 2.0 * target / (a + math.sqrt(a * a + 2.0 * b * target))


BISECTION_STEPS = 200
"""Halvings of the common chunk cost; the bracket shrinks to float precision well before."""


def _sequence_parallel_boundaries(
    length: int, n_chunks: int, linear_coefficient: float, quadratic_coefficient: float, square_share: float
) -> list[float]:
    """The ``n_chunks - 1`` inner boundaries of equal ``a s + b (c s + k s^2)`` chunks (``k = square_share``),
    by bisection on that cost; see [Note: balanced chunking]."""
    a, b, k = linear_coefficient, quadratic_coefficient, square_share

    def cut(cost: float) -> list[float]:
        boundaries, start = [], 0.0
        for _ in range(n_chunks):
            slope = a + b * start
            # the positive root of b k s^2 + slope s - cost = 0, written without cancellation
            start += 2.0 * cost / (slope + math.sqrt(slope * slope + 4.0 * b * k * cost))
            boundaries.append(start)
        return boundaries

    low, high = 0.0, a * length + b * k * length * length  # one chunk of the whole sequence costs this much
    for _ in range(BISECTION_STEPS):
        middle = (low + high) / 2.0
        if middle in (low, high):
            break
        if cut(middle)[-1] < length:
            low = middle
        else:
            high = middle
    return cut(high)[:-1]


def balanced_boundaries(
    length: int,
    n_chunks: int,
    alpha: float,
    kernel_chunk: int,
    n_linear_layers: int,
    n_softmax_layers: int,
    linear_cost_per_token: float,
    dense_cost_per_token: float,
    softmax_cost_per_pair: float,
    sequence_ranks: int = 1,
) -> tuple[int, ...]:
    """StateFlow's FLOP-balanced boundaries blended with equal ones by ``alpha``.

    See [Note: balanced chunking]. ``alpha = 0`` gives equal chunks, ``alpha = 1``
    equal FLOPs (on the slowest of ``sequence_ranks`` ranks), ``alpha > 1``
    overshoots towards shorter late chunks. After
    rounding to multiples of ``kernel_chunk``, boundaries that collide are moved
    apart by one kernel chunk (earlier ones down, later ones up), so the result
    is strictly increasing whenever ``n_chunks`` kernel chunks fit in the length.
    """
    _check_cut(length, n_chunks, kernel_chunk)
    if not math.isfinite(alpha) or alpha < 0:
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha}")
    for name, value in (
        ("linear_cost_per_token", linear_cost_per_token),
        ("dense_cost_per_token", dense_cost_per_token),
        ("softmax_cost_per_pair", softmax_cost_per_pair),
    ):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    if n_linear_layers < 0 or n_softmax_layers < 0:
        raise ValueError("layer counts must be >= 0")
    if sequence_ranks < 1:
        raise ValueError(f"sequence_ranks must be >= 1, got {sequence_ranks}")
    linear_coefficient = n_linear_layers * linear_cost_per_token + dense_cost_per_token
    quadratic_coefficient = n_softmax_layers * softmax_cost_per_pair
    if linear_coefficient == 0.0 and quadratic_coefficient == 0.0:
        raise ValueError("the model has no cost at all; cannot balance chunks by FLOPs")

    # The largest multiple of kernel_chunk strictly inside the sequence.
    last_inner = (length - 1) // kernel_chunk * kernel_chunk
    if sequence_ranks > 1 and quadratic_coefficient > 0.0:
        hybrids = _sequence_parallel_boundaries(
            length, n_chunks, linear_coefficient, quadratic_coefficient, last_rank_square_share(sequence_ranks)
        )
    else:
        hybrids = [
            _hybrid_boundary(index / n_chunks, length, linear_coefficient, quadratic_coefficient)
            for index in range(1, n_chunks)
        ]
    inner = []
    for index, hybrid in zip(range(1, n_chunks), hybrids):
        equal = index * length / n_chunks
        blended = (1.0 - alpha) * equal + alpha * hybrid
        rounded = int(math.floor(blended / kernel_chunk + 0.5)) * kernel_chunk
        inner.append(min(max(rounded, kernel_chunk), last_inner))

    # Separate collisions: push forward from the start, then back from the end.
    for position in range(1, len(inner)):
        inner[position] = max(inner[position], inner[position - 1] + kernel_chunk)
    upper = last_inner
    for position in range(len(inner) - 1, -1, -1):
        inner[position] = min(inner[position], upper)
        upper = inner[position] - kernel_chunk
    boundaries = (0, *inner, length)
    if any(later <= earlier for earlier, later in zip(boundaries, boundaries[1:])):
        raise ValueError(
            f"the balanced boundaries {list(boundaries)} are not strictly increasing after rounding"
            f" to multiples of {kernel_chunk}"
        )
    return boundaries


@dataclass(frozen=True)
class LayerFlopCoefficients:
    """The per-layer FLOP coefficients of Eq. 9 (forward pass, 2 FLOPs per multiply-add)."""

    n_linear_layers: int
    n_softmax_layers: int
    linear_cost_per_token: float  # C_lin: one recurrent layer, per token
    dense_cost_per_token: float  # C_dense: every token-wise dense FLOP of the whole model, per token
    softmax_cost_per_pair: float  # C_soft: one attention layer, per query-key pair


def layer_flop_coefficients(model: ModelConfig, kernel_chunk: int) -> LayerFlopCoefficients:
    """Forward FLOP coefficients of ``model`` for Eq. 9, from the simulator's own per-layer counts.

    The ``flops`` cost model (:mod:`schedlang.lowering.cost`, formulas in
    docs/cost-model.md) prices each layer kind; taking the coefficients from the
    same functions means a FLOP-balanced cut is balanced for the simulator too:

    * L_lin C_lin: the sum over recurrent layers of their mixer FLOPs per token
      (projections and the chunked recurrence over a ``kernel_chunk``), so
      C_lin is their mean;
    * C_soft: one attention layer's FLOPs per causal query-key pair;
    * C_dense: the attention layers' projections, every layer's MLP and the LM head.

    Attention layers are sized by their own heads (``model.attention_geometry``), as in the simulator.
    """
    recurrent = [kind for kind in model.layers if kind.is_recurrent]
    n_softmax = sum(kind is LayerKind.ATTN for kind in model.layers)

    def mixer(kind: LayerKind) -> float:
        return layer_mixer_flops_per_token(model, kind, kernel_chunk)

    linear_cost = sum(mixer(kind) for kind in recurrent) / len(recurrent) if recurrent else 0.0
    dense_cost = (
        n_softmax * mixer(LayerKind.ATTN)
        + sum(model.has_mlp(kind) for kind in model.layers) * mlp_flops_per_token(model)
        + head_flops_per_token(model)
    )
    softmax_cost = model_attention_pair_flops(model)
    return LayerFlopCoefficients(len(recurrent), n_softmax, linear_cost, dense_cost, softmax_cost)


def model_balanced_boundaries(
    model: ModelConfig, length: int, n_chunks: int, alpha: float, unit: int, sequence_ranks: int = 1
) -> tuple[int, ...]:
    """:func:`balanced_boundaries` with the coefficients of ``model``, boundaries on multiples of ``unit``
    (the kernel chunk times ``sequence_ranks``, [Note: sequence-parallel alignment])."""
    coefficients = layer_flop_coefficients(model, unit // sequence_ranks)
    return balanced_boundaries(
        length,
        n_chunks,
        alpha,
        unit,
        coefficients.n_linear_layers,
        coefficients.n_softmax_layers,
        coefficients.linear_cost_per_token,
        coefficients.dense_cost_per_token,
        coefficients.softmax_cost_per_pair,
        sequence_ranks,
    )


__all__ = [
    "LayerFlopCoefficients",
    "balanced_boundaries",
    "layer_flop_coefficients",
    "model_balanced_boundaries",
    "uniform_boundaries",
]


def recut(program: ScheduleProgram, n_chunks: int) -> ScheduleProgram:
    """``program`` with its sequence cut into ``n_chunks`` chunks the way its schedule cuts it (uniform, or
    balanced with the same alpha), for sweeping the chunk count (``schedlang simulate --chunks``).

    Raises ValueError when the schedule fixes its chunks (explicit boundaries or an explicit order, both
    written for one chunk count) or when ``n_chunks`` does not fit the length.
    """
    sequence, pipeline = program.sequence, program.pipeline
    if pipeline.order is OrderKind.EXPLICIT:
        raise ValueError("an explicit order is written for its own chunk count; sweep a gpipe or 1f1b schedule")
    if sequence.partition is PartitionKind.EXPLICIT:
        raise ValueError("explicit chunk boundaries fix the chunk count; sweep a uniform or balanced partition")
    unit = sequence.kernel_chunk * program.mesh.sequence
    if sequence.partition is PartitionKind.BALANCED:
        boundaries = model_balanced_boundaries(
            program.model, sequence.length, n_chunks, sequence.balance_alpha, unit, program.mesh.sequence
        )
    else:
        boundaries = uniform_boundaries(sequence.length, n_chunks, unit)
    return replace(program, sequence=replace(sequence, boundaries=boundaries))
