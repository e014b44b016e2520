"""benchmarks/pipeline.py: which jobs run without a cuBLAS workspace, its summary."""

import pytest

from benchmarks.pipeline import job_environment, summary_lines
from benchmarks.pipeline_schedule import PIPELINE_SCHEDULE, BenchmarkSchedule
from schedlang.runtime.cublas import WORKSPACE_FREE_SETTINGS

GRAPHS_4 = "schedlang:chunks=4/cuda_graphs=true/extra_warmup=2/split_backward=true"
GRAPHS_2 = "schedlang:chunks=2/cuda_graphs=true/extra_warmup=1/split_backward=true"
SCHEDULE = BenchmarkSchedule(PIPELINE_SCHEDULE)


@pytest.fixture(autouse=True)
def no_user_setting(monkeypatch):
    for name in (*WORKSPACE_FREE_SETTINGS, "TORCH_BLAS_PREFER_CUBLASLT"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    "systems, setting, workspace_free",
    [
        ([GRAPHS_4, GRAPHS_2, "torch"], "auto", True),
        ([GRAPHS_4, "schedlang:chunks=8", "torch"], "auto", False),  # eager chunks lose without one
        (["torch", "schedlang:chunks=16"], "auto", False),
        (["schedlang:chunks=8", "torch"], "none", True),
        ([GRAPHS_4, "torch"], "default", False),
    ],
)
def test_a_job_goes_without_a_workspace_only_when_asked_or_all_graphs(systems, setting, workspace_free):
    environment, words = job_environment(systems, "cuda", setting, SCHEDULE)
    has_settings = all(environment.get(name) == value for name, value in WORKSPACE_FREE_SETTINGS.items())
    assert has_settings == workspace_free
    assert not any(name in environment for name in WORKSPACE_FREE_SETTINGS) or workspace_free
    assert ("CUBLAS_WORKSPACE_CONFIG=:0:0" in words) == workspace_free


def test_cpu_jobs_keep_their_environment():
    environment, words = job_environment([GRAPHS_4, "torch"], "cpu", "none", SCHEDULE)
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
        record(GRAPHS_2, 0, 154_900.0, 0.130),
        record(GRAPHS_2, 1, 154_800.0, 0.036),
        record("torch", 0, 135_000.0, 0.217), record("torch", 1, 135_001.0, 0.181),
    ]
    lines = summary_lines("header", [GRAPHS_2, "torch"], records, {GRAPHS_2})
    assert lines[0] == "header"
    assert "| NCCL kernels (s) |" in lines[1]
    assert "| 0.130 |" in lines[3]
    ratio_line = lines[-1]
    assert ratio_line.startswith(f"{GRAPHS_2}: throughput x1.147 of Schedule1F1B")  # 154,800 / 135,000
    assert ratio_line.endswith("(graph pools: only the reserved peak sees them whole)")


def test_summary_without_torch_has_no_ratios():
    lines = summary_lines("header", ["schedlang:chunks=8"], [record("schedlang:chunks=8", 0, 1.0)], set())
    assert len(lines) == 4 and not any("Schedule1F1B" in line for line in lines)


@pytest.mark.parametrize(
    "limit, start, step, maximum, expected, tried",
    [
        (100, 16, 16, 1024, 96, [16, 32, 64, 128, 96, 112]),  # double, then bisect in whole steps
        (5000, 16, 16, 1024, 1024, [16, 32, 64, 128, 256, 512, 1024]),  # everything fits: stop at the maximum
        (8, 16, 16, 1024, None, [16]),  # not even the start
        (48, 16, 16, 48, 48, [16, 32, 48]),  # doubling capped at the maximum
    ],
)
def test_length_search_doubles_then_bisects(limit, start, step, maximum, expected, tried):
    from benchmarks.pipeline import longest_fitting_length

    seen = []

    def fits_at(length):
        seen.append(length)
        return length <= limit

    assert longest_fitting_length(fits_at, start, step, maximum) == expected
    assert seen == tried


def test_prediction_lines_put_the_measured_reserved_peak_over_the_prediction():
    from benchmarks.pipeline import prediction_lines

    records = [
        {"system": "schedlang:chunks=8", "stage": 1, "peak_reserved_bytes": 3 * 2**30},
        {"system": "schedlang:chunks=8", "stage": 0, "peak_reserved_bytes": 2**30},
        {"system": "torch", "stage": 0, "peak_reserved_bytes": 2**30},
    ]
    lines = prediction_lines(["schedlang:chunks=8", "torch"], records, {"schedlang:chunks=8": (2**30, 2 * 2**30)})
    assert lines == ["schedlang:chunks=8: reserved peak measured / predicted: stage 0 1.0 / 1.0 GiB (x1.000), "
                     "stage 1 3.0 / 2.0 GiB (x1.500)"]
