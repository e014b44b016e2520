"""The training benchmarks' kernel preflight: on a GPU whose Triton kernels fail, the benchmark stops rather than
measuring the PyTorch fallback, unless asked to measure it."""

from __future__ import annotations

import pytest

from benchmarks.training_systems import kernel_preflight


def preflight_script(tmp_path, verdict: str):
    script = tmp_path / "bench.py"
    script.write_text(f"print('kernel preflight: triton failed (CompilationError: ...)')\nprint({verdict!r})\n")
    return script


def test_a_failed_preflight_stops_the_benchmark(tmp_path):
    with pytest.raises(SystemExit, match="bench.py: the Triton kernels failed the preflight on the GPU"):
        kernel_preflight("cuda", preflight_script(tmp_path, "torch"))


def test_the_fallback_is_measured_only_when_asked_for(tmp_path):
    assert kernel_preflight("cuda", preflight_script(tmp_path, "torch"), allow_torch_kernels=True) == "torch"
    assert kernel_preflight("cuda", preflight_script(tmp_path, "triton")) == "triton"
    assert kernel_preflight("cpu", preflight_script(tmp_path, "triton")) == "torch"
