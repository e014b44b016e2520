"""benchmarks/sequence_parallel.py runs end to end on gloo ranks: every kind of row, finite times.

The script once all-reduced a CPU tensor on its process group, which NCCL refuses; the reduction now runs on
the steps' device, and this run covers that code path (the device is the CPU here).
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "sequence_parallel.py"


@pytest.mark.slow
def test_benchmark_reports_every_kind_of_row(tmp_path):
    rows_file = tmp_path / "rows.json"
    command = [
        sys.executable, str(SCRIPT), "--ranks", "1", "2", "--length-per-rank", "96", "--heads", "1",
        "--head-dim", "8", "--blocks", "1", "4", "--warmup", "0", "--iterations", "1", "--json", str(rows_file),
    ]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    rows = json.loads(rows_file.read_text())
    kinds = {(row["kind"], row["ranks"], row["method"], row["blocks"]) for row in rows}
    assert {("rank-work", 1, "end", 0), ("rank-work", 1, "middle", 0), ("one-device-phases", 1, "-", 0)} <= kinds
    assert ("layer", 1, "allscan", 1) in kinds
    for method, blocks in (("ring", 1), ("allscan", 1), ("allscan", 4), ("allgather", 1)):
        assert ("layer", 2, method, blocks) in kinds
        assert ("scan", 2, method, blocks) in kinds
    assert {("one-device", ranks, "-", 0) for ranks in (1, 2)} <= kinds
    assert all(math.isfinite(row["ms"]) and row["ms"] > 0 for row in rows)
    assert "| layer | 2 | 96 | allscan | 4 |" in completed.stdout
