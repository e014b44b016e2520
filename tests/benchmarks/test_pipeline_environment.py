"""benchmarks/pipeline.py: which jobs run without a cuBLAS workspace, its summary."""

import pytest

from benchmarks.pipeline import job_environment, summary_lines
from schedlang.runtime.cublas import WORKSPACE_FREE_SETTINGS


@pytest.fixture(autouse=True)
def no_user_setting(monkeypatch):
    for name in (*WORKSPACE_FREE_SETTINGS, "TORCH_BLAS_PREFER_CUBLASLT"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    "systems, setting, workspace_free",
    [
        (["schedlang:4g+2w", "schedlang:2g+1w", "torch"], "auto", True),
        (["schedlang:4g+2w", "schedlang:8", "torch"], "auto", False),  # eager chunks lose without one
        (["torch", "schedlang:16"], "auto", False),
        (["schedlang:8", "torch"], "none", True),
        (["schedlang:4g+2w", "torch"], "default", False),
    ],
)
def test_a_job_goes_without_a_workspace_only_when_asked_or_all_graphs(systems, setting, workspace_free):
    environment, words = job_environment(systems, "cuda", setting)
    has_settings = all(environment.get(name) == value for name, value in WORKSPACE_FREE_SETTINGS.items())
    assert has_settings == workspace_free
    assert not any(name in environment for name in WORKSPACE_FREE_SETTINGS) or workspace_free
    assert ("CUBLAS_WORKSPACE_CONFIG=:0:0" in words) == workspace_free


def test_cpu_jobs_keep_their_environment():
    environment, words = job_environment(["schedlang:4g+2w", "torch"], "cpu", "none")
    assert words == "(CPU)"
    assert not any(name in environment for name in WORKSPACE_FREE_SETTINGS)


def record(system: str, stage: int, tokens_per_second: float, nccl_seconds: float = 0.0) -> dict:
    return {
        "system": system, "stage": stage, "tokens_per_second": tokens_per_second, "step_seconds": 1.0,
        "kernel_seconds": 0.8, "communication_kernel_seconds": nccl_seconds, "peak_bytes": 2**30,
        "activation_peak_bytes": 2**29, "peak_minus_model_state_bytes": 2**29, "peak_reserved_bytes": 2**30,
    }


def test_summary_ratios_use_the_slower_stage_and_three_places():
    records = [
        record("schedlang:2g+1w", 0, 154_900.0, 0.130), record("schedlang:2g+1w", 1, 154_800.0, 0.036),
        record("torch", 0, 135_000.0, 0.217), record("torch", 1, 135_001.0, 0.181),
    ]
    lines = summary_lines("header", ["schedlang:2g+1w", "torch"], records)
    assert lines[0] == "header"
    assert "| NCCL kernels (s) |" in lines[1]
    assert "| 0.130 |" in lines[3]
    ratio_line = lines[-1]
    assert ratio_line.startswith("schedlang:2g+1w: throughput x1.147 of Schedule1F1B")  # 154,800 / 135,000
    assert ratio_line.endswith("(graph pools: only the reserved peak sees them whole)")


def test_summary_without_torch_has_no_ratios():
    lines = summary_lines("header", ["schedlang:8"], [record("schedlang:8", 0, 1.0)])
    assert len(lines) == 4 and not any("Schedule1F1B" in line for line in lines)
