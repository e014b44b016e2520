"""benchmarks/one_device.py: its systems, the outcome of a job, the budgeted length search, its tables, and the
whole path on the CPU with the tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from benchmarks.one_device import (
    Attempt,
    Outcome,
    job_outcome,
    prediction_lines,
    search_lines,
    search_longest,
    throughput_lines,
)
from schedlang.frontend import load_program
from benchmarks.one_device_systems import FLA_SYSTEM, configs_of, one_device_schedule
from schedlang.runtime.hf_format import fla_peer_config

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
    "name, chunks",
    [("torch", 1), ("torch+ckpt", 1), (FLA_SYSTEM, 1), ("schedlang", 1), ("schedlang:chunks=16/recompute=full", 16),
     ("schedlang:chunks=8/recompute=mlp/offload=true", 8)],
)
def test_every_system_holds_the_whole_model_on_one_stage(name, chunks):
    configs = configs_of(name, one_device_schedule(tiny=False), 65536, "bf16")
    assert configs.pipeline.stage_layers == (tuple(range(16)),)
    assert configs.pipeline.n_chunks == chunks and configs.pipeline.sequence_length == 65536


@pytest.mark.parametrize("name, chunks", [("torch", 1), ("schedlang:chunks=16/recompute=full", 16)])
def test_the_mamba2_schedule_trains_the_same_model_with_mamba2_layers(name, chunks):
    from benchmarks.pipeline_schedule import MAMBA2_ONE_DEVICE_SCHEDULE, BenchmarkSchedule

    configs = configs_of(name, BenchmarkSchedule(MAMBA2_ONE_DEVICE_SCHEDULE), 65536, "bf16")
    gla = configs_of(name, one_device_schedule(tiny=False), 65536, "bf16")
    assert configs.model.layers == ("mamba2",) * 16 and (configs.model.heads, configs.model.head_dim) == (16, 128)
    assert (configs.model.d_model, configs.model.vocab) == (gla.model.d_model, gla.model.vocab)
    assert configs.pipeline.stage_layers == (tuple(range(16)),) and configs.pipeline.n_chunks == chunks


def test_fla_gets_the_widths_of_the_same_model():
    configs = configs_of(FLA_SYSTEM, one_device_schedule(tiny=False), 65536, "bf16")
    keys = fla_peer_config(configs.model, torch.bfloat16)
    assert keys["hidden_size"] == 2048 and keys["num_hidden_layers"] == 16 and keys["num_heads"] == 16
    assert keys["expand_k"] == keys["expand_v"] == 1.0  # 16 heads of 128 over d_model 2048
    assert keys["intermediate_size"] == 5464  # 2048 * 8/3 = 5461.3, rounded up to a multiple of 8
    assert keys["vocab_size"] == 32000 and keys["fuse_cross_entropy"] and not keys["use_output_gate"]
    assert not keys["tie_word_embeddings"] and not keys["use_short_conv"] and keys["norm_eps"] == 1e-6
    assert keys["attn"] is None and keys["attn_mode"] == "chunk" and not keys["use_cache"]


def test_the_fla_peer_of_a_model_fla_builds_is_its_fla_config():
    """fla_peer_config extends fla_config: on a model fla's GLA builds exactly it changes nothing but the cache."""
    from dataclasses import replace

    from schedlang.runtime.hf_format import FLA_GATE_LOW_RANK_DIM, fla_config
    from schedlang.vocabulary import GlaOptions, ModelOptions, OutputGate

    model = configs_of(FLA_SYSTEM, one_device_schedule(tiny=True), 256, "fp32").model
    faithful = replace(model, options=ModelOptions(gla=GlaOptions(gate_rank=FLA_GATE_LOW_RANK_DIM,
                                                                  output_gate=OutputGate.SWISH)))
    assert fla_peer_config(faithful) == {**fla_config(faithful), "use_cache": False}
    assert fla_peer_config(model) == {**fla_config(faithful), "use_output_gate": False, "use_cache": False}
    with pytest.raises(ValueError, match="every layer must be gla or attn"):
        fla_peer_config(replace(model, layers=("simple_gla",) * 4))


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
    throughput = throughput_lines([attempt(128, Outcome.MEASURED), skipped], 6e9, 8e12)
    assert throughput[2] == "| schedlang:2 | 128 | 1,000 | 0.128 | 6.0 | 75.0% | 1.0 | 2.0 | measured |"
    assert throughput[3] == "| fla | 128 | | | | | | | skipped: not installed |"
    # 6e9 FLOPs a token at 100,000 tokens/s is 600 TFLOP/s, 75% of an 800-TFLOP/s GEMM; no GEMM rate, no share
    fast = Attempt("torch", 128, Outcome.MEASURED, {**attempt(128, Outcome.MEASURED).record, "tokens_per_second": 1e5})
    assert "| 600.0 | 75.0% |" in throughput_lines([fast], 6e9, 8e14)[2]
    assert "| 600.0 |  |" in throughput_lines([fast], 6e9, None)[2]
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


SYSTEM = "schedlang:chunks=2/recompute=full"


def test_the_whole_path_runs_on_the_cpu_with_the_tiny_model(tmp_path):
    out = tmp_path / "out"
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--out", str(out), "--length", "128",
         "--warmup", "1", "--steps", "2", "--systems", "torch", FLA_SYSTEM, SYSTEM,
         "--search-systems", SYSTEM, FLA_SYSTEM, "--search-start", "128", "--search-step", "128",
         "--search-max", "256"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    records = json.loads((out / "records.json").read_text())
    assert records["gemm"]["outcome"] == "measured" and records["gemm"]["record"]["flops_per_second"] > 0
    assert records["model_flops_per_token"] > 0
    outcomes = {entry["system"]: entry["outcome"] for entry in records["throughput"]}
    assert outcomes == {"torch": "measured", FLA_SYSTEM: "skipped", SYSTEM: "measured"}
    measured = [entry["record"] for entry in records["throughput"] if entry["record"]]
    assert all(record["tokens_per_second"] > 0 and len(record["each_step_seconds"]) == 2 for record in measured)
    assert records["search"][SYSTEM]["longest"] == 256
    assert records["search"][FLA_SYSTEM] == {"longest": None, "ending": "skipped: fla's kernels need a GPU",
                                             "attempts": []}
    (prediction,) = records["predictions"]
    assert prediction["system"] == SYSTEM and prediction["fit"]["length"] == 256
    summary = (out / "summary.md").read_text()
    assert f"| {SYSTEM} | 256 |" in summary and "skipped: fla's kernels need a GPU" in summary
    assert "GEMM rate" in summary and "TFLOP/s (1024^3 float32, this job)" in summary
    written = load_program(out / "schedlang-chunks=2-recompute=full.sched")  # schedlang run re-runs the system
    assert written.n_chunks == 2 and written.sequence.length == 128 and written.model.d_model == 64
