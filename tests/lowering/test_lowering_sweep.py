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
from schedlang.lowering.program import OrderKind
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
