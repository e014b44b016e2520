"""benchmarks/mamba3_kernels.py's plumbing on the CPU: the mapped operands give the operator's output (simple GLA
on them, less the diagonal share, plus the D skip), each forward+backward closure returns one finite gradient per
leaf, and ``--check``'s errors are small for the operator and large for a wrong one. The timings need a GPU."""

import torch

from benchmarks import mamba3_kernels as benchmark
from schedlang.kernels import chunk_simple_gla
from schedlang.kernels.mamba3 import chunk_mamba3


def test_each_closure_returns_a_finite_gradient_per_leaf():
    inputs = benchmark.make_inputs(40, 2, 8, 8, torch.float32, device="cpu")
    gradients = benchmark.operator_step(inputs, backend="torch")()
    assert [tuple(gradient.shape) for gradient in gradients] == [
        tuple(inputs[name].shape) for name in benchmark.ARGUMENTS
    ]
    gradients += benchmark.simple_gla_step(benchmark.mapped_operands(inputs), backend="torch")()
    assert all(bool(torch.isfinite(gradient).all()) for gradient in gradients)


def test_the_mapped_operands_run_the_same_recurrence():
    inputs = benchmark.make_inputs(50, 2, 8, 8, torch.float32, device="cpu")
    q, k, v, g = benchmark.mapped_operands(inputs)
    with torch.no_grad():
        mapped, _ = chunk_simple_gla(q, k, v, g, scale=1.0, backend="torch")
        ours, _ = chunk_mamba3(*(inputs[name] for name in benchmark.ARGUMENTS[:-1]), backend="torch")
    # without D the outputs differ by each token's diagonal share of the next token's term, and by nothing else
    from schedlang.kernels.mamba3.chunk import cumulative_angles, rotate_pairs, trapezoid_operands

    x, dt, adt, trap, B, C, angles = (inputs[name].detach() for name in benchmark.ARGUMENTS[:-1])
    theta = cumulative_angles(angles, dt, None)
    diagonal = trapezoid_operands(rotate_pairs(C, theta), rotate_pairs(B, theta), x, dt, adt, trap).diagonal
    assert ((mapped - diagonal - ours).norm() / ours.norm()).item() < 1e-5
    assert ((mapped[:, -1] - ours[:, -1]).norm() / ours[:, -1].norm()).item() < 1e-5  # the last has no share


def test_the_check_separates_the_operator_from_a_wrong_one():
    inputs = benchmark.make_inputs(30, 2, 8, 8, torch.float32, device="cpu")
    assert max(benchmark.relative_errors(inputs, backend="torch").values()) < 1e-4

    def b_and_c_swapped(x, dt, adt, trap, B, C, angles, D, backend):
        return chunk_mamba3(x, dt, adt, trap, C, B, angles, D, backend=backend)

    assert benchmark.relative_errors(inputs, backend="torch", operator=b_and_c_swapped)["y"] > 1e-2
