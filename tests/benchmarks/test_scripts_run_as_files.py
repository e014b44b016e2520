"""Each benchmark runs as ``python benchmarks/NAME.py`` from any directory and finds the ``benchmarks`` package
(the docs' commands), not only when pytest puts the repository root on the path."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize(
    "script",
    [
        "pipeline", "profile_stage", "nccl_overlap", "sequence_parallel", "gemm_memsets", "gdn_kernels",
        "kernel_resources", "mamba2_kernels", "mamba3_kernels", "loss_head",
    ],
)
def test_a_script_run_as_a_file_imports_the_benchmarks_package(script, tmp_path):
    completed = subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{script}.py"), "--help"], cwd=tmp_path, capture_output=True, text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "usage:" in completed.stdout


def test_kernel_resources_compiles_a_bfloat16_gdn_kernel_for_hopper_without_a_gpu(tmp_path):
    """The recorder gets past the operators' refusal of bfloat16 on CPU tensors, and one row has numbers."""
    completed = subprocess.run(
        [sys.executable, str(BENCHMARKS / "kernel_resources.py"), "--operators", "gdn", "--only", "state_pass_forward"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env={**os.environ, "TRITON_INTERPRET": "0"},
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    rows = [line.split() for line in completed.stdout.splitlines() if line.startswith("gdn ")]
    assert [row[1] for row in rows] == ["gdn_state_pass_forward_kernel"], completed.stdout
    registers, stack, shared = (int(field) for field in rows[0][4:7])
    assert 0 < registers <= 255 and stack >= 0 and shared > 0
