"""benchmarks/tune_kernels.py's sweep: keeps what is faster and exact, never what differs or fails to launch.

The timings here are a stand-in (the sweep itself runs on a GPU); what is tested is the decision each
candidate gets, against the launch table it edits.
"""

import importlib.util
import pathlib

import pytest
import torch

PATH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "tune_kernels.py"


@pytest.fixture()
def tuner(monkeypatch):
    spec = importlib.util.spec_from_file_location("tune_kernels_under_test", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table = {"kernel": {"block_k": 32, "num_warps": 8}}
    monkeypatch.setattr(module, "OPERATORS", {"op": (None, table)})
    monkeypatch.setattr(module, "CANDIDATES", {"op": {"kernel": {"block_k": [16, 64, 128], "num_warps": [4, 8]}}})
    return module, table["kernel"]


def run_sweep(module, entry, timings, wrong=(), broken=(), entries=None):
    """Sweep with a stand-in measurement: ms per (block_k, num_warps), wrong results or an error for some."""
    reference = [torch.ones(4)]
    records = []

    def measure_step():
        key = (entry["block_k"], entry["num_warps"])
        if key in broken:
            raise RuntimeError("out of shared memory")
        results = [reference[0] * (2.0 if key in wrong else 1.0)]
        return timings.get(key, 10.0), results

    start, best = module.sweep("op", measure_step, float("inf"), records.append, entries)
    return start, best, records


def test_the_sweep_keeps_the_fastest_exact_candidate_of_each_knob(tuner):
    module, entry = tuner
    start, best, records = run_sweep(module, entry, {(32, 8): 10.0, (64, 8): 8.0, (128, 8): 9.0, (64, 4): 7.0})
    assert (start, best) == (10.0, 7.0)
    assert entry == {"block_k": 64, "num_warps": 4}
    # block_k 16, 64, 128; then num_warps 4 and, the table now at 4, 8 again
    assert [record.get("kept", False) for record in records[1:]] == [False, True, False, True, False]


def test_a_faster_candidate_with_other_results_is_rejected(tuner):
    module, entry = tuner
    _, best, records = run_sweep(module, entry, {(32, 8): 10.0, (16, 8): 1.0}, wrong={(16, 8)})
    assert entry == {"block_k": 32, "num_warps": 8} and best == 10.0
    assert any(record.get("rejected") for record in records if record.get("block_k") == 16)


def test_a_candidate_that_fails_to_launch_is_skipped(tuner):
    module, entry = tuner
    _, best, records = run_sweep(module, entry, {(32, 8): 10.0, (64, 8): 5.0}, broken={(128, 8)})
    assert entry["block_k"] == 64 and best == 5.0
    assert any("error" in record for record in records if record.get("block_k") == 128)


def test_entries_limit_the_sweep_to_the_named_table_entries(tuner):
    module, entry = tuner
    start, best, records = run_sweep(module, entry, {(64, 8): 5.0}, entries=["another_kernel"])
    assert entry == {"block_k": 32, "num_warps": 8} and (start, best) == (10.0, 10.0) and len(records) == 1
    _, best, _ = run_sweep(module, entry, {(64, 8): 5.0}, entries=["kernel"])
    assert entry["block_k"] == 64 and best == 5.0
