"""benchmarks/predictions.py: the fit reproduces its measurement, and every predicted run is a legal schedule."""

from __future__ import annotations

import pytest

from benchmarks.predictions import PEER, RUNS, fitted_hardware, main, predicted_step_seconds


def test_the_fitted_throughput_reproduces_the_measured_peer():
    hardware = fitted_hardware(100_000.0)
    makespan, _ = predicted_step_seconds(PEER, hardware)
    assert PEER.microbatches * PEER.length / makespan == pytest.approx(100_000.0, rel=1e-3)
    faster = fitted_hardware(200_000.0)
    assert faster.throughput_flops > 1.9 * hardware.throughput_flops


def test_stateflow_is_predicted_ahead_of_one_chunk_on_each_pipeline(capsys):
    hardware = fitted_hardware(135_000.0)
    by_name = {run.name: predicted_step_seconds(run, hardware)[0] for run in RUNS}
    for stages in (4, 8):
        assert by_name[f"PP{stages} StateFlow 8 chunks"] < by_name[f"PP{stages} Schedule1F1B"]
    assert main([]) == 0
    table = capsys.readouterr().out
    assert table.count("\n| PP") == 1 + len(RUNS)
