"""SwiGLU and the log-sigmoid gate, both backends, against float64 autograd through torch's own ops.

On a CPU the Triton path runs in the interpreter at small sizes; on a GPU the same tests run at real sizes
in float32 and bfloat16. Inputs include a column slice of a wider tensor (the fused projection's layout),
which the kernels must read in place, and logits large enough that log1p(exp(-|x|)) underflows to 0 in
``log(1 + z)``.
"""

import pytest
import torch

from kernel_reference_cases import relative_error
from schedlang.kernels.log_sigmoid_gate import log_sigmoid_gate, naive_log_sigmoid_gate
from schedlang.kernels.swiglu import naive_swiglu, swiglu

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
SHAPES = [(2, 4096, 5464), (3, 1000, 64)] if ON_GPU else [(2, 7, 40), (1, 33, 2 * 1030)]
DTYPES = {"float32": (torch.float32, 1e-6), "bfloat16": (torch.bfloat16, 1e-2)} if ON_GPU else {
    "float32": (torch.float32, 1e-6)
}
BACKENDS = ["torch", "triton"]


def pointwise_cases(test):
    """Every backend, shape, layout (contiguous or a column slice) and dtype."""
    test = pytest.mark.parametrize("dtype_name", sorted(DTYPES))(test)
    test = pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "column_slice"])(test)
    test = pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: "x".join(map(str, shape)))(test)
    test = pytest.mark.parametrize("backend", BACKENDS)(test)
    return test


def _random_inputs(shape, strided, dtype, scale):
    """Fresh N(0, scale^2) inputs; ``strided``: a [..., W] view whose rows are strided, columns 3 .. 3 + W of a
    tensor 5 columns wider (the layout of a slice of a fused projection's output)."""
    *leading, width = shape
    if not strided:
        return (torch.randn(shape, dtype=torch.float64) * scale).to(DEVICE, dtype)
    wide = torch.randn(*leading, width + 5, dtype=torch.float64) * scale
    inputs = wide.to(DEVICE, dtype)[..., 3 : 3 + width]
    assert not inputs.is_contiguous()
    return inputs


def _check(operator, reference, inputs, tolerance, **kwargs):
    leaf = inputs.detach().requires_grad_(True)
    output = operator(leaf, **kwargs)
    output_grad = torch.randn(output.shape, dtype=torch.float64).to(output.device, output.dtype)
    output.backward(output_grad)
    expected_leaf = inputs.detach().double().requires_grad_(True)
    expected = reference(expected_leaf)
    expected.backward(output_grad.double())
    assert leaf.grad.dtype == inputs.dtype and leaf.grad.shape == inputs.shape
    errors = {
        "forward": relative_error(output, expected),
        "gradient": relative_error(leaf.grad, expected_leaf.grad),
    }
    assert all(error <= tolerance for error in errors.values()), errors
    return output


@pointwise_cases
def test_swiglu_matches_torch_silu_product(backend, shape, strided, dtype_name):
    dtype, tolerance = DTYPES[dtype_name]
    inputs = _random_inputs(shape, strided, dtype, 2.0)
    output = _check(swiglu, naive_swiglu, inputs, tolerance, backend=backend)
    assert output.shape == (*shape[:-1], shape[-1] // 2) and output.dtype == dtype


@pointwise_cases
def test_log_sigmoid_gate_matches_torch_logsigmoid(backend, shape, strided, dtype_name):
    dtype, tolerance = DTYPES[dtype_name]
    # scale 12: many logits beyond |x| = 17, where exp(-|x|) vanishes next to 1 in float32
    inputs = _random_inputs(shape, strided, dtype, 12.0)
    output = _check(
        log_sigmoid_gate, lambda x: naive_log_sigmoid_gate(x, 16.0), inputs, tolerance, normalizer=16.0, backend=backend
    )
    assert output.dtype == torch.float32 and output.shape == inputs.shape


@pytest.mark.parametrize("backend", BACKENDS)
def test_log_sigmoid_gate_keeps_relative_accuracy_for_gates_near_one(backend):
    """logsigmoid(x) ~ -exp(-x) for large x: the kernel must not round it to 0 (log(1 + z) would)."""
    logits = torch.tensor([[20.0, 30.0, 40.0, 60.0]], device=DEVICE)
    output = log_sigmoid_gate(logits, backend=backend)
    expected = naive_log_sigmoid_gate(logits.double())
    assert relative_error(output, expected) < 1e-6
    assert (output < 0).all()


def test_bad_arguments_are_refused_before_any_kernel():
    with pytest.raises(ValueError, match="even"):
        swiglu(torch.randn(2, 3))
    with pytest.raises(ValueError, match="floating-point"):
        swiglu(torch.ones(2, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="normalizer must be positive"):
        log_sigmoid_gate(torch.randn(2, 3), normalizer=0.0)
    with pytest.raises(ValueError, match="backend"):
        log_sigmoid_gate(torch.randn(2, 3), backend="cuda")
