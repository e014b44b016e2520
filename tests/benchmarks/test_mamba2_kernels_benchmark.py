"""benchmarks/mamba2_kernels.py's plumbing on the CPU: the peer's mapped operands are the SSD's (simple GLA on them
plus the D skip is our operator's output), each forward+backward closure returns one finite gradient per leaf,
and ``--check``'s errors are small for the operator and large for a wrong one. The timings need a GPU."""

import torch

from benchmarks import mamba2_kernels as benchmark
from schedlang.kernels import chunk_simple_gla
from schedlang.kernels.mamba2 import chunk_mamba2


def test_the_peers_operands_are_the_ssds():
    inputs = benchmark.make_ssd_inputs(50, 4, 8, 6, 2, torch.float32, device="cpu")
    q, k, v, g = benchmark.mapped_operands(inputs)
    with torch.no_grad():
        mapped, _ = chunk_simple_gla(q, k, v, g, scale=1.0, backend="torch")
        ours, _ = chunk_mamba2(*(inputs[name] for name in benchmark.SSD_ARGUMENTS), backend="torch")
    skip = inputs["D"].detach()[:, None] * inputs["x"].detach()
    assert ((mapped + skip - ours).norm() / ours.norm()).item() < 1e-5


def test_each_closure_returns_a_finite_gradient_per_leaf():
    inputs = benchmark.make_ssd_inputs(40, 2, 8, 4, 1, torch.float32, device="cpu")
    gradients = benchmark.ssd_step(inputs, backend="torch")()
    assert [tuple(gradient.shape) for gradient in gradients] == [
        tuple(inputs[name].shape) for name in benchmark.SSD_ARGUMENTS
    ]
    operands = benchmark.mapped_operands(inputs)
    gradients += benchmark.simple_gla_step(chunk_simple_gla, operands, backend="torch")()
    assert all(bool(torch.isfinite(gradient).all()) for gradient in gradients)


def test_the_check_separates_the_operator_from_a_wrong_one():
    inputs = benchmark.make_ssd_inputs(30, 2, 8, 4, 1, torch.float32, device="cpu")
    assert max(benchmark.relative_errors(inputs, backend="torch").values()) < 1e-4

    def b_and_c_swapped(x, dt, A, B, C, D, backend):
        return chunk_mamba2(x, dt, A, C, B, D, backend=backend)

    assert benchmark.relative_errors(inputs, backend="torch", operator=b_and_c_swapped)["y"] > 1e-2


def test_the_layer_it_times_is_the_mamba2_mixer_and_runs():
    """--layer's construction (the whole mixer at fla's expand = 2) on the CPU: its output has the input's shape."""
    layer = benchmark.our_layer(4, 8, 6, 2, device="cpu", dtype=torch.float32)
    hidden = torch.randn(1, 32, 16)
    output = layer(hidden, None)[0]
    assert output.shape == hidden.shape and bool(torch.isfinite(output).all())


def test_the_per_head_baseline_computes_what_the_grouped_operator_does():
    """``--per-head`` times B and C repeated per head: the same gradients as the operator, or its ratio means
    nothing."""
    inputs = benchmark.make_ssd_inputs(70, 4, 8, 6, 2, torch.float32, device="cpu")
    torch.manual_seed(1)
    grouped = benchmark.ssd_step(inputs, backend="torch")()
    torch.manual_seed(1)
    per_head = benchmark.per_head_ssd_step(inputs, backend="torch")()
    for ours, baseline in zip(grouped, per_head, strict=True):
        assert ((ours - baseline).norm() / baseline.norm()).item() < 1e-5


def test_graphs_and_per_head_are_flags_of_the_benchmark():
    """The flags the docs' next GPU command uses parse (the timings themselves need a GPU)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(benchmark.__file__)
    completed = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, check=True)
    assert "--graphs" in completed.stdout and "--per-head" in completed.stdout


def test_host_time_counts_the_steps_own_work_and_not_its_warmup():
    import time

    from benchmarks.common import host_ms

    calls = []

    def step():
        calls.append(None)
        time.sleep(0.004 if len(calls) > 2 else 0.05)  # the two warm-up calls are slow; the timed ones 4 ms

    median = host_ms(step, warmup=2, iterations=5, device=torch.device("cpu"))
    assert len(calls) == 7 and 4.0 <= median < 40.0


def test_each_line_compares_the_same_steps_and_names_the_ratio():
    """The eager, host and replayed lines share :func:`compared_steps`: ours, our kernels and the peer when given,
    each a forward+backward of its own operands; the ratio is ours over the peer's, and absent without it."""
    from functools import partial

    inputs = benchmark.make_ssd_inputs(40, 2, 8, 4, 1, torch.float32, device="cpu")
    operands = benchmark.mapped_operands(inputs)
    peer = partial(chunk_simple_gla, backend="torch")
    steps = benchmark.compared_steps(inputs, operands, peer, backend="torch")
    assert list(steps) == ["mamba2", "kernels", benchmark.PEER]
    assert len(steps["mamba2"]()) == len(benchmark.SSD_ARGUMENTS)
    assert all(len(steps[name]()) == len(operands) for name in ("kernels", benchmark.PEER))
    assert list(benchmark.compared_steps(inputs, operands, None, backend="torch")) == ["mamba2", "kernels"]

    line = benchmark.timed_line("T: ", {"mamba2": 3.0, "kernels": 2.0, benchmark.PEER: 2.0})
    assert line.startswith("T: mamba2    3.000 ms") and line.endswith("mamba2/fla  1.50x")
    assert "mamba2/fla" not in benchmark.timed_line("T: ", {"mamba2": 3.0, "kernels": 2.0})
