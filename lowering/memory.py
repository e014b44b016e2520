"""StateFlow's closed-form estimates (Eq. 12-15) for the 1F1B-style schedules.

Units as in the simulator's unit cost model: activations in whole microbatches
(``A_r = 1``, boundary term ``B_r`` left out), time in full-sequence forwards
(forward 1, backward 2, so ``t = 3``). The simulator reproduces these exactly
for uniform chunks; they are printed next to the simulated numbers for
comparison. The memory model in bytes is :mod:`schedlang.lowering.memory_peak`.
"""

from __future__ import annotations

from schedlang.lowering.orders import ExtraWarmup, one_f_one_b_warmup

FORWARD_BACKWARD_TIME = 3
"""``t`` of Eq. 14-15 in unit cost: forward 1 plus backward 2."""


def one_f_one_b_peak_activations(n_stages: int, n_microbatches: int) -> tuple[float, ...]:
    """Eq. 12: stage ``r`` holds ``min(M, P - r)`` microbatches."""
    return tuple(float(min(n_microbatches, n_stages - stage)) for stage in range(n_stages))


def stateflow_peak_activations(
    n_stages: int,
    n_microbatches: int,
    n_chunks: int,
    extra_warmup: ExtraWarmup = 0,
    split_backward: bool = False,
    extra_deferred_weights: int = 0,
) -> tuple[float, ...]:
    """Eq. 13 without ``B_r``: stage ``r`` holds ``min(MN, N + P - r - 1) / N`` microbatches.

    With ``extra_warmup = e`` ([Note: extra warm-up]) every stage but the last holds ``e`` chunks more
    (``e_r`` more on stage ``r`` for a per-stage list). With ``split_backward`` ([Note: split backward]) stage
    ``r > 0`` holds the chunks in flight of stage ``r - 1``: its deferred ``W`` tasks keep the chunks whose
    gradients stage ``r - 1`` consumes in its cool-down until the end of the step, and
    ``extra_deferred_weights = d`` chunks more (at most all ``MN``).
    """
    return tuple(
        _chunks_in_flight(
            n_stages, n_microbatches, n_chunks, stage, extra_warmup, split_backward, extra_deferred_weights
        )
        / n_chunks
        for stage in range(n_stages)
    )


def _chunks_in_flight(
    n_stages: int,
    n_microbatches: int,
    n_chunks: int,
    stage: int,
    extra_warmup: ExtraWarmup,
    split_backward: bool,
    extra_deferred_weights: int,
) -> int:
    if not (split_backward and stage > 0):
        return one_f_one_b_warmup(n_stages, n_microbatches, n_chunks, stage, extra_warmup)
    upstream = one_f_one_b_warmup(n_stages, n_microbatches, n_chunks, stage - 1, extra_warmup)
    return min(n_microbatches * n_chunks, upstream + extra_deferred_weights)


def one_f_one_b_makespan(n_stages: int, n_microbatches: int) -> float:
    """Eq. 14: ``(M + P - 1) t``."""
    return float((n_microbatches + n_stages - 1) * FORWARD_BACKWARD_TIME)


def stateflow_makespan(n_stages: int, n_microbatches: int, n_chunks: int) -> float:
    """Eq. 15: ``(M N + P - 1) t / N``."""
    return (n_microbatches * n_chunks + n_stages - 1) * FORWARD_BACKWARD_TIME / n_chunks
