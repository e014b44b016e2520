"""benchmarks/one_device.py: its systems, the outcome of a job, the budgeted length search, its tables, and the
whole path on the CPU with the tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.one_device import (
    Attempt,
    Outcome,
    job_outcome,
    prediction_lines,
    search_lines,
    search_longest,
    throughput_lines,
)
from benchmarks.one_device_systems import FLA_SYSTEM, configs_of, fla_config_keys, one_device_model

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "one_device.py"


@pytest.mark.parametrize(
    "code, output, outcome",
    [
        (0, "", Outcome.MEASURED),
        (124, "torch.OutOfMemoryError", Outcome.TIMED_OUT),
        (1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB", Outcome.OUT_OF_MEMORY),
        (1, "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate", Outcome.OUT_OF_MEMORY),
        (1, "RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 8589934592 bytes",
         Outcome.OUT_OF_MEMORY),
        (1, "schedlang.diagnostics.ScheduleError: error: 'sequence.chunks' = 2 does not fit", Outcome.FAILED),
        (-9, "", Outcome.FAILED),
    ],
)
def test_job_outcome(code, output, outcome):
    assert job_outcome(code, output) is outcome


@pytest.mark.parametrize(
    "name", ["torch", "torch+ckpt", FLA_SYSTEM, "schedlang:16/full", "schedlang:8/mlp/offload", "mamba2:16/full"]
)
def test_every_system_holds_the_whole_model_on_one_stage(name):
    configs = configs_of(name, one_device_model(tiny=False), 65536, "bf16")
    assert configs.pipeline.stage_layers == (tuple(range(16)),)
    assert len(configs.pipeline.chunk_boundaries) - 1 == (int(name.split(":")[1].split("/")[0]) if ":" in name else 1)


def test_a_mamba2_system_is_schedlangs_on_the_model_with_mamba2_layers():
    configs = configs_of("mamba2:16/full", one_device_model(tiny=False), 65536, "bf16")
    assert configs.model.layers == ("mamba2",) * 16 and (configs.model.heads, configs.model.head_dim) == (16, 128)
    assert configs.pipeline.recompute == "full"
    assert configs_of("schedlang:16/full", one_device_model(tiny=False), 65536, "bf16").model.layers == ("gla",) * 16


def test_fla_gets_the_widths_of_the_same_model():
    keys = fla_config_keys(configs_of(FLA_SYSTEM, one_device_model(tiny=False), 65536, "bf16").model)
    assert keys["hidden_size"] == 2048 and keys["num_hidden_layers"] == 16 and keys["num_heads"] == 16
    assert keys["expand_k"] == keys["expand_v"] == 1.0  # 16 heads of 128 over d_model 2048
    assert keys["intermediate_size"] == 5464  # 2048 * 8/3 = 5461.3, rounded up to a multiple of 8
    assert keys["vocab_size"] == 32000 and keys["fuse_cross_entropy"] and not keys["use_output_gate"]


def attempt(length, outcome, tokens_per_second=1000.0):
    record = {"tokens_per_second": tokens_per_second, "step_seconds": length / tokens_per_second,
              "peak_bytes": 2**30, "peak_reserved_bytes": 2 * 2**30} if outcome is Outcome.MEASURED else None
    return Attempt("schedlang:2", length, outcome, record)


def test_search_doubles_then_bisects_and_keeps_the_longest_attempt():
    best, attempts, ending = search_longest(
        lambda length: attempt(length, Outcome.MEASURED if length <= 96 else Outcome.OUT_OF_MEMORY, length),
        16, 16, 1024, time.monotonic() + 60,
    )
    assert [a.length for a in attempts] == [16, 32, 64, 128, 96, 112]
    assert best.length == 96 and best.record["tokens_per_second"] == 96 and ending == "converged"


def test_a_failed_attempt_stops_the_search_at_the_longest_that_trained():
    best, attempts, ending = search_longest(
        lambda length: attempt(length, Outcome.MEASURED if length <= 32 else Outcome.TIMED_OUT), 16, 16, 1024,
        time.monotonic() + 60,
    )
    assert [a.length for a in attempts] == [16, 32, 64]
    assert best.length == 32 and ending == "stopped: timed out at 64"


def test_a_spent_budget_starts_no_attempt():
    tried = []
    best, attempts, ending = search_longest(
        lambda length: tried.append(length) or attempt(length, Outcome.MEASURED), 16, 16, 1024, time.monotonic() - 1
    )
    assert tried == [] and best is None and ending == "stopped: its share of --budget was spent"


def test_tables():
    skipped = Attempt(FLA_SYSTEM, 128, Outcome.SKIPPED, detail="not installed")
    throughput = throughput_lines([attempt(128, Outcome.MEASURED), skipped])
    assert throughput[2] == "| schedlang:2 | 128 | 1,000 | 0.128 | 1.0 | 2.0 | measured |"
    assert throughput[3] == "| fla | 128 | | | | | skipped: not installed |"
    search = search_lines({"schedlang:2": (attempt(256, Outcome.MEASURED), [attempt(256, Outcome.MEASURED),
                                                                          attempt(512, Outcome.OUT_OF_MEMORY)],
                                           "converged")})
    assert search[2] == "| schedlang:2 | 256 | 1,000 | 1.0 | 2.0 | 256 measured, 512 out of memory | converged |"
    rows = [
        {"system": "schedlang:2", "fit": {"length": 512, "n_chunks": 4, "reserved_gib": [3.0], "tokens_per_second": 5e4},
         "fit_error": "", "measured_length": 256, "measured_reserved_bytes": 2**31, "predicted_reserved_bytes": 2**30},
        {"system": "schedlang:4", "fit": None, "fit_error": "", "measured_length": None,
         "measured_reserved_bytes": 0, "predicted_reserved_bytes": 0},
    ]
    predictions = prediction_lines(rows)
    assert predictions[2] == "| schedlang:2 | 256 | 2.0 | 1.0 | 512 | 4 | 3.0 | 50,000 |"
    assert predictions[3] == "| schedlang:4 | none | |  | nothing fits | | | |"


def test_the_whole_path_runs_on_the_cpu_with_the_tiny_model(tmp_path):
    out = tmp_path / "out"
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--out", str(out), "--length", "128",
         "--warmup", "1", "--steps", "2", "--systems", "torch", FLA_SYSTEM, "schedlang:2/full", "mamba2:2",
         "--search-systems", "schedlang:2/full", FLA_SYSTEM, "--search-start", "128", "--search-step", "128",
         "--search-max", "256"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    records = json.loads((out / "records.json").read_text())
    outcomes = {entry["system"]: entry["outcome"] for entry in records["throughput"]}
    assert outcomes == {
        "torch": "measured", FLA_SYSTEM: "skipped", "schedlang:2/full": "measured", "mamba2:2": "measured"
    }
    measured = [entry["record"] for entry in records["throughput"] if entry["record"]]
    assert all(record["tokens_per_second"] > 0 and len(record["each_step_seconds"]) == 2 for record in measured)
    assert records["search"]["schedlang:2/full"]["longest"] == 256
    assert records["search"][FLA_SYSTEM] == {"longest": None, "ending": "skipped: fla's kernels need a GPU",
                                             "attempts": []}
    prediction, mamba2_prediction = records["predictions"]
    assert prediction["system"] == "schedlang:2/full" and prediction["fit"]["length"] == 256
    assert mamba2_prediction["system"] == "mamba2:2" and mamba2_prediction["fit"]["length"] > 0
    summary = (out / "summary.md").read_text()
    assert "| schedlang:2/full | 256 |" in summary and "skipped: fla's kernels need a GPU" in summary
