"""Stages 1-8 x microbatches 1-16 x chunks 1-8: gpipe and 1f1b are legal and match Eq. 12-15.

The legality sweep and the 1f1b simulation sweep cover every combination; the
gpipe simulation takes the microbatch counts around the pipeline depth
(1, P - 1, P, P + 1, 16), where the min() of Eq. 12-13 switches branch.
"""

from __future__ import annotations

import pytest

from lowering_programs import make_program
from schedlang.lowering.legality import check_orders
from schedlang.lowering.memory import (
    one_f_one_b_makespan,
    one_f_one_b_peak_activations,
    stateflow_makespan,
    stateflow_peak_activations,
)
from schedlang.lowering.orders import gpipe_orders, one_f_one_b_orders
from schedlang.vocabulary import OrderKind
from schedlang.lowering.simulate import simulate

STAGES = range(1, 9)
MICROBATCHES = range(1, 17)
CHUNKS = range(1, 9)


@pytest.mark.parametrize("n_stages", STAGES)
def test_generated_orders_are_legal(n_stages):
    for n_microbatches in MICROBATCHES:
        for n_chunks in CHUNKS:
            for generate in (gpipe_orders, one_f_one_b_orders):
                report = check_orders((n_stages, n_microbatches, n_chunks), generate(n_stages, n_microbatches, n_chunks))
                assert report.is_legal, (generate.__name__, n_stages, n_microbatches, n_chunks, report.violations[:3])


def _simulated_microbatch_counts(n_stages):
    return sorted({count for count in (1, n_stages - 1, n_stages, n_stages + 1, 16) if 1 <= count <= 16})


@pytest.mark.parametrize("n_stages", STAGES)
def test_one_f_one_b_matches_eq12_and_eq14_with_one_chunk(n_stages):
    for n_microbatches in MICROBATCHES:
        timeline = simulate(make_program(n_stages, n_microbatches, 1))
        assert timeline.peak_activations == one_f_one_b_peak_activations(n_stages, n_microbatches)
        assert timeline.makespan == one_f_one_b_makespan(n_stages, n_microbatches)
        assert timeline.makespan == (n_microbatches + n_stages - 1) * 3


@pytest.mark.parametrize("n_stages", STAGES)
def test_one_f_one_b_matches_eq13_and_eq15_with_chunks(n_stages):
    for n_microbatches in MICROBATCHES:
        for n_chunks in CHUNKS:
            timeline = simulate(make_program(n_stages, n_microbatches, n_chunks))
            expected_peaks = stateflow_peak_activations(n_stages, n_microbatches, n_chunks)
            assert timeline.peak_activations == pytest.approx(expected_peaks, abs=1e-12)
            assert timeline.makespan == pytest.approx(stateflow_makespan(n_stages, n_microbatches, n_chunks), abs=1e-12)
            busy = 3 * n_microbatches * n_stages
            assert timeline.bubble_fraction == pytest.approx(1 - busy / (n_stages * timeline.makespan))


@pytest.mark.parametrize("n_stages", STAGES)
def test_gpipe_holds_every_microbatch_and_has_the_same_makespan(n_stages):
    for n_microbatches in _simulated_microbatch_counts(n_stages):
        for n_chunks in (1, 2, 8):
            timeline = simulate(make_program(n_stages, n_microbatches, n_chunks, order=OrderKind.GPIPE))
            assert timeline.peak_activations == (float(n_microbatches),) * n_stages
            assert timeline.makespan == pytest.approx(stateflow_makespan(n_stages, n_microbatches, n_chunks), abs=1e-12)


class _SlowFirstStage:
    """Unit costs with stage 0 ``factor`` times slower: the upstream bottleneck that extra warm-up helps."""

    def __init__(self, n_chunks: int, factor: float) -> None:
        self.n_chunks, self.factor, self.time_divisor = n_chunks, factor, 1.0

    def task_duration(self, task):
        base = (1.0 if task.kind.value == "F" else 2.0) / self.n_chunks
        return base * (self.factor if task.stage == 0 else 1.0)

    def message_duration(self, kind, source, destination):
        return 0.01

    def message_bytes(self, kind, source, destination):
        return 0

    def gradient_reduction_duration(self, stage):
        return 0.0


@pytest.mark.parametrize("n_stages", range(1, 7))
def test_extra_warmup_orders_are_legal_and_match_eq13(n_stages):
    for n_microbatches in range(1, 9):
        for n_chunks in range(1, 7):
            for extra in range(0, 5):
                dimensions = (n_stages, n_microbatches, n_chunks)
                orders = one_f_one_b_orders(*dimensions, extra)
                report = check_orders(dimensions, orders)
                assert report.is_legal, (dimensions, extra, report.violations[:3])
                timeline = simulate(make_program(*dimensions), orders)
                expected = stateflow_peak_activations(*dimensions, extra)
                assert timeline.peak_activations == pytest.approx(expected, abs=1e-12)
                # the last stage's order does not change: its first backward waits on nothing downstream
                assert orders[-1] == one_f_one_b_orders(*dimensions)[-1]


def test_extra_warmup_holds_e_more_chunks_upstream():
    assert stateflow_peak_activations(2, 4, 8, 2) == ((8 + 1 + 2) / 8, 8 / 8)
    assert stateflow_peak_activations(3, 1, 2, 5) == (1.0, 1.0, 1.0)  # never more than every chunk


def test_extra_warmup_keeps_a_slow_first_stage_busy():
    """Stage 0 1.2x slower, 8 chunks: without extra warm-up it idles waiting for its first backward."""
    n_stages, n_microbatches, n_chunks = 2, 4, 8
    program = make_program(n_stages, n_microbatches, n_chunks)
    makespans = []
    for extra in range(4):
        cost_model = _SlowFirstStage(n_chunks, 1.2)
        orders = one_f_one_b_orders(n_stages, n_microbatches, n_chunks, extra)
        makespans.append(simulate(program, orders, cost_model).makespan)
    stage0_work = 1.2 * 3 * n_microbatches
    assert makespans[0] > stage0_work + 0.1  # idles: stage 1's forward and backward of a chunk exceed one stage-0 forward
    assert makespans[2] < makespans[1] < makespans[0]
    # two are enough here: stage 0 is busy but for the last chunk's trip through stage 1 (0.25 + 2 messages)
    assert makespans[2] < stage0_work + 0.25 + 0.03
    assert makespans[3] >= makespans[2] - 1e-9


def test_extra_warmup_rejects_negative():
    with pytest.raises(ValueError, match="extra_warmup"):
        one_f_one_b_orders(2, 2, 2, -1)


def test_per_stage_extra_warmup_is_legal_and_holds_its_own_counts():
    """Every list of 3 or 4 counts in 0..3 ending in 0 with no rise above 1 is legal and deadlock free and holds its
    own counts (Eq. 13 per stage); a rise of 2 deadlocks, and the generator refuses it."""
    import itertools

    for n_stages in (3, 4):
        for head in itertools.product(range(4), repeat=n_stages - 1):
            extra = (*head, 0)
            valid = all(later <= earlier + 1 for earlier, later in zip(extra, extra[1:]))
            for n_microbatches, n_chunks in ((1, 3), (4, 2), (3, 5)):
                dimensions = (n_stages, n_microbatches, n_chunks)
                if not valid:
                    with pytest.raises(ValueError, match="at most 1 more than the one before"):
                        one_f_one_b_orders(*dimensions, extra)
                    continue
                orders = one_f_one_b_orders(*dimensions, extra)
                assert check_orders(dimensions, orders).is_legal, (extra, dimensions)
                timeline = simulate(make_program(*dimensions), orders)
                expected = stateflow_peak_activations(*dimensions, extra)
                assert expected == tuple(
                    min(n_microbatches * n_chunks, n_chunks + n_stages - r - 1 + extra[r]) / n_chunks
                    for r in range(n_stages)
                )
                assert timeline.peak_activations == pytest.approx(expected, abs=1e-12)
    assert one_f_one_b_orders(3, 4, 2, (2, 2, 0)) == one_f_one_b_orders(3, 4, 2, 2)
    for bad in ((1, 0), (1, 1, 1), (0, -1, 0)):
        with pytest.raises(ValueError, match="per-stage extra_warmup"):
            one_f_one_b_orders(3, 4, 2, bad)
