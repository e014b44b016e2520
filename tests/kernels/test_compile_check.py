"""``python -m schedlang.kernels.compile_check``: every Triton kernel built for sm_90 on the CPU, and a kernel
that only the compiler rejects (not the interpreter) caught with its name."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest


def run_without_interpreter(*arguments: str, timeout: float) -> subprocess.CompletedProcess:
    environment = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, *arguments], capture_output=True, text=True, timeout=timeout,
                          env=environment, check=False)


BROKEN = textwrap.dedent("""
    import sys
    import torch
    import triton
    import triton.language as tl
    from schedlang.kernels.compile_check import CompileFailure, compile_only_launches

    @triton.jit
    def doubled(x, PRECISION: tl.constexpr = "tf32"):  # a default string is no constexpr when compiled
        return x * 2

    @triton.jit
    def broken_kernel(x, y, n, BLOCK: tl.constexpr):
        offsets = tl.arange(0, BLOCK)
        tl.store(y + offsets, doubled(tl.load(x + offsets, mask=offsets < n)), mask=offsets < n)

    compiled = []
    compile_only_launches(90, 232448, compiled.append)
    x = torch.zeros(16)
    try:
        broken_kernel[(1,)](x, torch.zeros(16), 16, BLOCK=16)
    except CompileFailure as failure:
        print("caught:", failure)
        sys.exit(3)
    print("compiled", len(compiled))
""")


def test_a_kernel_only_the_compiler_rejects_is_caught_on_the_cpu(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text(BROKEN)
    completed = run_without_interpreter(str(script), timeout=300)
    assert completed.returncode == 3, completed.stdout + completed.stderr
    assert "caught: broken_kernel: CompilationError" in completed.stdout


@pytest.mark.full
def test_every_kernel_builds_for_hopper():
    completed = run_without_interpreter("-m", "schedlang.kernels.compile_check", timeout=1800)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "kernel specialisations built for sm_90" in completed.stdout
    for kernel in ("gla_fwd_kernel_smooth_output", "simple_gla_bwd_kernel_dqkg", "gdn_state_pass_backward_kernel",
                   "ssd_map_bwd_kernel", "ssd_skip_bwd_kernel", "ssd_map_and_skip_bwd_kernel", "swiglu_bwd_kernel"):
        assert kernel in completed.stdout
