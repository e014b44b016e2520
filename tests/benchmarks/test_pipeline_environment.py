"""benchmarks/pipeline.py: which jobs run without a cuBLAS workspace, and how its system names parse."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from pipeline import SchedlangVariant, job_environment  # noqa: E402

from schedlang.runtime.cublas import WORKSPACE_FREE_SETTINGS  # noqa: E402


@pytest.fixture(autouse=True)
def no_user_setting(monkeypatch):
    for name in (*WORKSPACE_FREE_SETTINGS, "TORCH_BLAS_PREFER_CUBLASLT"):
        monkeypatch.delenv(name, raising=False)


def test_system_names_parse():
    assert SchedlangVariant.parse("schedlang:8") == SchedlangVariant(8, False, 0, False)
    assert SchedlangVariant.parse("schedlang:4g+2w") == SchedlangVariant(4, True, 2, True)
    assert SchedlangVariant.parse("schedlang:16gw") == SchedlangVariant(16, True, 0, True)


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
