"""benchmarks/trace_gaps.py: busy time and idle gaps of a profiled step, from a Chrome trace."""

import gzip
import json

import pytest

from benchmarks.trace_gaps import compute_intervals, load_events, memset_starts, step_gaps


def _kernel(name: str, ts: float, dur: float) -> dict:
    return {"cat": "kernel", "name": name, "ts": ts, "dur": dur}


def test_gaps_split_into_launch_gaps_and_waits(tmp_path):
    events = [
        _kernel("gemm", 0, 100),
        _kernel("norm", 90, 20),  # overlaps the GEMM: one busy stretch 0-110
        _kernel("ncclKernel_SendRecv", 110, 5000),  # communication is not compute
        _kernel("gla", 120, 30),  # 10 us launch gap
        _kernel("gemm", 1150, 50),  # 1000 us wait
        {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 9999},
        {"cat": "gpu_memset", "name": "Memset (Device)", "ts": 113, "dur": 1},  # in the 10 us launch gap
        {"cat": "gpu_memset", "name": "Memset (Device)", "ts": 600, "dur": 1},  # in the wait: not a launch gap
    ]
    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt") as handle:
        json.dump({"traceEvents": events}, handle)
    events = load_events(path)
    gaps = step_gaps(compute_intervals(events), long_us=50, memsets=memset_starts(events))
    assert gaps.kernels == 4
    assert (gaps.memset_gaps, gaps.memset_gap_ms) == (1, pytest.approx(0.01))
    assert gaps.step_ms == pytest.approx(1.2)
    assert gaps.busy_ms == pytest.approx(0.19)
    assert (gaps.short_gaps, gaps.short_gap_ms) == (1, pytest.approx(0.01))
    assert gaps.long_gaps == (pytest.approx((0.15, 1.0)),)
    assert gaps.busy_ms + gaps.short_gap_ms + gaps.long_gap_ms == pytest.approx(gaps.step_ms)


def test_an_empty_trace_has_no_step():
    assert step_gaps([], long_us=50).step_ms == 0.0
