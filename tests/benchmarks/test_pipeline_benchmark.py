"""benchmarks/pipeline.py end to end on the CPU: two gloo ranks, the tiny model, a schedlang system named by
its keys beside torch's Schedule1F1B; each system's schedule is written under --out and checks as a file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from schedlang.frontend import load_program

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "pipeline.py"
SYSTEM = "schedlang:chunks=2/split_backward=true"


def test_the_whole_path_runs_on_the_cpu_with_the_tiny_model(tmp_path):
    out = tmp_path / "out"
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--out", str(out), "--length", "128",
         "--systems", SYSTEM, "torch", "--search-systems", "--warmup", "1", "--steps", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    records = json.loads((out / "throughput.json").read_text())
    assert sorted((record["system"], record["stage"]) for record in records) == [
        (SYSTEM, 0), (SYSTEM, 1), ("torch", 0), ("torch", 1)
    ]
    assert all(record["tokens_per_second"] > 0 for record in records)
    summary = (out / "summary.md").read_text()
    assert f"{SYSTEM}: throughput x" in summary and "of Schedule1F1B" in summary
    written = load_program(out / "schedlang-chunks=2-split_backward=true.sched")  # what schedlang run re-runs
    assert written.n_chunks == 2 and written.pipeline.split_backward and written.sequence.length == 128
    assert written.model.d_model == 64 and written.n_stages == 2
    assert load_program(out / "torch.sched").n_chunks == 1
