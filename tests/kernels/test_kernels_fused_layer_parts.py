"""The short convolution (gdn, mamba2) and Mamba-2's gated RMSNorm, both backends, against float64 references
written out tap by tap and formula by formula, differentiated by autograd.

On a CPU the Triton path runs in the interpreter (float32) at small sizes; on a GPU the same tests run at the
1B mamba2 model's sizes in float32 and bfloat16. Inputs include a column slice of a wider tensor (the fused
input projection's layout, which both kernels read in place), chunks shorter than the history, one-tap
convolutions and several groups.
"""

import pytest
import torch

from kernel_reference_cases import relative_error
from schedlang.kernels.gated_rms_norm import gated_rms_norm, naive_gated_rms_norm
from schedlang.kernels.short_convolution import naive_short_convolution, short_convolution, short_convolution_history

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
DTYPES = {"float32": (torch.float32, 1e-5), "bfloat16": (torch.bfloat16, 1.5e-2)} if ON_GPU else {
    "float32": (torch.float32, 1e-5)
}
BACKENDS = ["torch", "triton"]
CONVOLUTION_SHAPES = [(2, 4096, 2304), (1, 3, 256)] if ON_GPU else [(2, 37, 130), (1, 2, 40)]
NORM_SHAPES = [(2, 4096, 2048), (3, 100, 128)] if ON_GPU else [(2, 19, 96), (1, 5, 256)]


def _leaf(shape, dtype, strided=False, scale=1.0):
    """Fresh N(0, scale^2) values as a leaf; ``strided``: columns 3 .. 3 + C of a tensor 7 columns wider."""
    *leading, width = shape
    wide = torch.randn(*leading, width + (7 if strided else 0), dtype=torch.float64) * scale
    values = wide.to(DEVICE, dtype)
    if strided:
        values = values[..., 3 : 3 + width]
        assert not values.is_contiguous()
    return values.detach().requires_grad_(True)


def _double(leaf):
    return None if leaf is None else leaf.detach().double().requires_grad_(True)


def _errors(output, expected, leaves, references):
    errors = {"output": relative_error(output, expected)}
    for index, (leaf, reference) in enumerate(zip(leaves, references)):
        if leaf is not None:
            assert leaf.grad is not None and leaf.grad.dtype == leaf.dtype and leaf.grad.shape == leaf.shape
            errors[f"grad {index}"] = relative_error(leaf.grad, reference.grad)
    return errors


@pytest.mark.parametrize("dtype_name", sorted(DTYPES))
@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("with_history", [False, True], ids=["zeros", "history"])
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "column_slice"])
@pytest.mark.parametrize("taps", [4, 1])
@pytest.mark.parametrize("shape", CONVOLUTION_SHAPES, ids=lambda shape: "x".join(map(str, shape)))
@pytest.mark.parametrize("backend", BACKENDS)
def test_short_convolution_matches_taps_written_out(backend, shape, taps, strided, with_history, with_bias,
                                                    dtype_name):
    dtype, tolerance = DTYPES[dtype_name]
    batch, _, channels = shape
    inputs = _leaf(shape, dtype, strided)
    weight = _leaf((channels, taps), torch.float32, scale=0.5)
    bias = _leaf((channels,), torch.float32) if with_bias else None
    history = _leaf((batch, taps - 1, channels), dtype) if with_history else None
    output = short_convolution(inputs, weight, bias, history, backend=backend)
    output_grad = torch.randn(output.shape, dtype=torch.float64)
    output.backward(output_grad.to(DEVICE, dtype))
    references = [_double(leaf) for leaf in (inputs, weight, bias, history)]
    expected = naive_short_convolution(*references)
    expected.backward(output_grad.to(DEVICE))
    assert output.dtype == dtype and output.shape == shape and output.is_contiguous()
    errors = _errors(output, expected, (inputs, weight, bias, history), references)
    assert all(error <= tolerance for error in errors.values()), errors


@pytest.mark.parametrize("length", [1, 2, 3, 5])
def test_short_convolution_history_is_the_last_inputs_of_history_and_chunk(length):
    """The history the next chunk starts from, also when the chunk is shorter than it."""
    batch, channels, taps = 2, 3, 4
    inputs, history = torch.randn(batch, length, channels), torch.randn(batch, taps - 1, channels)
    expected = torch.cat((history, inputs), dim=1)[:, -(taps - 1) :]
    assert torch.equal(short_convolution_history(inputs, history, taps), expected)
    zeros_before = torch.cat((torch.zeros_like(history), inputs), dim=1)[:, -(taps - 1) :]
    assert torch.equal(short_convolution_history(inputs, None, taps), zeros_before)


def test_chunks_continued_through_the_history_equal_the_whole_sequence():
    """Two chunks, the second starting from the first's history, give the whole sequence's output."""
    inputs, weight = torch.randn(2, 9, 20, device=DEVICE), torch.randn(20, 4, device=DEVICE)
    whole = short_convolution(inputs, weight, backend="triton")
    first = short_convolution(inputs[:, :5], weight, backend="triton")
    second = short_convolution(inputs[:, 5:], weight, None, short_convolution_history(inputs[:, :5], None, 4),
                               backend="triton")
    assert relative_error(torch.cat((first, second), dim=1), whole) < 1e-6


@pytest.mark.parametrize("dtype_name", sorted(DTYPES))
@pytest.mark.parametrize("shared_weight", [False, True], ids=["weight_per_channel", "weight_per_group_channel"])
@pytest.mark.parametrize("norm_before_gate", [False, True], ids=["gate_first", "norm_first"])
@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "gate_column_slice"])
@pytest.mark.parametrize("shape", NORM_SHAPES, ids=lambda shape: "x".join(map(str, shape)))
@pytest.mark.parametrize("backend", BACKENDS)
def test_gated_rms_norm_matches_the_formula(backend, shape, strided, groups, norm_before_gate, shared_weight,
                                            dtype_name):
    dtype, tolerance = DTYPES[dtype_name]
    values, gate = _leaf(shape, dtype), _leaf(shape, dtype, strided, scale=2.0)
    weight = _leaf((shape[-1] // groups if shared_weight else shape[-1],), torch.float32)
    output = gated_rms_norm(values, gate, weight, groups, 1e-5, norm_before_gate, backend=backend)
    output_grad = torch.randn(output.shape, dtype=torch.float64)
    output.backward(output_grad.to(DEVICE, dtype))
    references = [_double(leaf) for leaf in (values, gate, weight)]
    expected = naive_gated_rms_norm(*references, groups=groups, eps=1e-5, norm_before_gate=norm_before_gate)
    expected.backward(output_grad.to(DEVICE))
    assert output.dtype == dtype and output.shape == shape
    errors = _errors(output, expected, (values, gate, weight), references)
    assert all(error <= tolerance for error in errors.values()), errors


def test_bad_arguments_are_refused_before_any_kernel():
    inputs = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match=r"weight must have shape \[C, W\]"):
        short_convolution(inputs, torch.randn(7, 4))
    with pytest.raises(ValueError, match=r"history must have shape \[B, W - 1, C\]"):
        short_convolution(inputs, torch.randn(8, 4), history=torch.randn(2, 2, 8))
    with pytest.raises(ValueError, match="history must have inputs' dtype"):
        short_convolution(inputs, torch.randn(8, 4), history=torch.randn(2, 3, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="bias must have shape"):
        short_convolution(inputs, torch.randn(8, 4), bias=torch.randn(3))
    with pytest.raises(ValueError, match="groups must divide"):
        gated_rms_norm(inputs, inputs, torch.ones(8), groups=3)
    with pytest.raises(ValueError, match="one shape"):
        gated_rms_norm(inputs, inputs[..., :4], torch.ones(8))
    with pytest.raises(ValueError, match="weight must have shape"):
        gated_rms_norm(inputs, inputs, torch.ones(4), groups=4)
