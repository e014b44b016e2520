"""benchmarks/tune_kernels.py's sweep: keeps what is faster and exact, never what differs or fails to launch.

The timings here are a stand-in (the sweep itself runs on a GPU); what is tested is the decision each
candidate gets, read through the launch-table overrides it runs under, and that no registered table changes.
"""

import pytest
import torch

from benchmarks import tune_kernels
from schedlang.kernels.common import launch_tables
from schedlang.kernels.common.launch_tables import LaunchTable

REGISTERED = {"block_k": 32, "num_warps": 8}


@pytest.fixture()
def table(monkeypatch):
    stand_in = LaunchTable("op_table", __name__, {"kernel": REGISTERED})
    monkeypatch.setitem(launch_tables.LAUNCH_TABLES, "op_table", stand_in)
    monkeypatch.setitem(tune_kernels.OPERATORS, "op", (None, "op_table"))
    monkeypatch.setitem(tune_kernels.CANDIDATES, "op", {"kernel": {"block_k": [16, 64, 128], "num_warps": [4, 8]}})
    return stand_in


def run_sweep(table, timings, wrong=(), broken=(), entries=None):
    """Sweep with a stand-in measurement: ms per (block_k, num_warps), wrong results or an error for some."""
    reference = [torch.ones(4)]
    records = []
    tuned = {}

    def measure_step():
        entry = table["kernel"]
        key = (entry["block_k"], entry["num_warps"])
        if key in broken:
            raise RuntimeError("out of shared memory")
        results = [reference[0] * (2.0 if key in wrong else 1.0)]
        return timings.get(key, 10.0), results

    start, best = tune_kernels.sweep("op", measure_step, float("inf"), records.append, entries, tuned)
    assert dict(table["kernel"]) == REGISTERED  # outside the overrides, the registered values
    return start, best, records, tuned.get("op_table", {}).get("kernel", {})


def test_the_sweep_keeps_the_fastest_exact_candidate_of_each_knob(table):
    start, best, records, kept = run_sweep(table, {(32, 8): 10.0, (64, 8): 8.0, (128, 8): 9.0, (64, 4): 7.0})
    assert (start, best) == (10.0, 7.0)
    assert kept == {"block_k": 64, "num_warps": 4}
    # block_k 16, 64, 128; then num_warps 4 and, the table now at 4, 8 again
    assert [record.get("kept", False) for record in records[1:]] == [False, True, False, True, False]


def test_a_faster_candidate_with_other_results_is_rejected(table):
    _, best, records, kept = run_sweep(table, {(32, 8): 10.0, (16, 8): 1.0}, wrong={(16, 8)})
    assert kept == {} and best == 10.0
    assert any(record.get("rejected") for record in records if record.get("block_k") == 16)


def test_a_candidate_that_fails_to_launch_is_skipped(table):
    _, best, records, kept = run_sweep(table, {(32, 8): 10.0, (64, 8): 5.0}, broken={(128, 8)})
    assert kept == {"block_k": 64} and best == 5.0
    assert any("error" in record for record in records if record.get("block_k") == 128)


def test_entries_limit_the_sweep_to_the_named_table_entries(table):
    start, best, records, kept = run_sweep(table, {(64, 8): 5.0}, entries=["another_kernel"])
    assert kept == {} and (start, best) == (10.0, 10.0) and len(records) == 1
    _, best, _, kept = run_sweep(table, {(64, 8): 5.0}, entries=["kernel"])
    assert kept == {"block_k": 64} and best == 5.0


def test_the_scan_entry_names_the_shared_scan_table():
    assert tune_kernels.table_entry("gla", "scan") == ("scan", "scan")
    assert tune_kernels.table_entry("simple_gla", "dv") == ("simple_gla", "dv")
    for operator, entries in tune_kernels.CANDIDATES.items():
        for entry, knobs in entries.items():
            table_name, entry_name = tune_kernels.table_entry(operator, entry)
            registered = launch_tables.LAUNCH_TABLES[table_name].registered[entry_name]
            assert set(knobs) & set(registered), (operator, entry)  # knobs the entry lacks are skipped
