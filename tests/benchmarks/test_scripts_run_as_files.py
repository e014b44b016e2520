"""Each benchmark runs as ``python benchmarks/NAME.py`` from any directory and finds the ``benchmarks`` package
(the docs' commands), not only when pytest puts the repository root on the path."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize("script", ["pipeline", "profile_stage", "nccl_overlap", "sequence_parallel", "gemm_memsets"])
def test_a_script_run_as_a_file_imports_the_benchmarks_package(script, tmp_path):
    completed = subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{script}.py"), "--help"], cwd=tmp_path, capture_output=True, text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "usage:" in completed.stdout
