"""runtime.linear: a Linear whose backward adds its weight gradient into .grad (the CUDA-graph stages use it),
or leaves it to a recorder for a later W task (split backward)."""

import pytest
import torch

from schedlang.runtime.linear import (
    Linear,
    WeightGradientRecorder,
    accumulate_weight_gradients_into_grad,
    recording_weight_gradients,
)


def _pair(bias: bool) -> tuple[Linear, Linear]:
    torch.manual_seed(0)
    plain = Linear(6, 5, bias=bias).double()
    fused = Linear(6, 5, bias=bias).double()
    fused.load_state_dict(plain.state_dict())
    accumulate_weight_gradients_into_grad(fused)
    return plain, fused


@pytest.mark.parametrize("bias", [False, True])
def test_backwards_add_into_grad_what_autograd_would_accumulate(bias):
    plain, fused = _pair(bias)
    fused.weight.grad = torch.full_like(fused.weight, 0.5)
    plain.weight.grad = torch.full_like(plain.weight, 0.5)
    for seed in (1, 2):  # two chunks' backwards, as a chunked stage runs them
        generator = torch.Generator().manual_seed(seed)
        inputs = torch.randn(2, 3, 6, dtype=torch.float64, generator=generator)
        upstream = torch.randn(2, 3, 5, dtype=torch.float64, generator=generator)
        results = []
        for layer in (plain, fused):
            leaf = inputs.clone().requires_grad_(True)
            output = layer(leaf)
            output.backward(upstream)
            results.append((output.detach(), leaf.grad))
        torch.testing.assert_close(results[1], results[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fused.weight.grad, plain.weight.grad, rtol=1e-12, atol=1e-12)
    if bias:
        torch.testing.assert_close(fused.bias.grad, plain.bias.grad, rtol=1e-12, atol=1e-12)


def test_autograd_grad_gets_no_weight_gradient_but_grad_gets_it():
    _, fused = _pair(bias=False)
    fused.weight.grad = torch.zeros_like(fused.weight)
    inputs = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    (input_grad, weight_grad) = torch.autograd.grad(fused(inputs).sum(), [inputs, fused.weight], allow_unused=True)
    assert weight_grad is None and input_grad is not None
    torch.testing.assert_close(fused.weight.grad, torch.ones(5, 4, dtype=torch.float64) @ inputs.detach())


def test_a_missing_grad_is_a_clear_error():
    _, fused = _pair(bias=False)
    with pytest.raises(RuntimeError, match="before its weight had a .grad"):
        fused(torch.randn(3, 6, dtype=torch.float64, requires_grad=True)).sum().backward()


def test_without_the_flag_it_is_nn_linear():
    plain, _ = _pair(bias=True)
    inputs = torch.randn(3, 6, dtype=torch.float64)
    plain(inputs).sum().backward()
    torch.testing.assert_close(plain.weight.grad, torch.ones(3, 5, dtype=torch.float64).t() @ inputs)


@pytest.mark.parametrize("bias, in_place", [(False, False), (True, False), (True, True)])
def test_a_recorded_backward_leaves_the_weight_gradient_to_apply(bias, in_place):
    """[Note: deferred weight gradients]: B gives the input and bias gradients at once and no weight gradient;
    ``apply`` then adds exactly what autograd would have, also into a .grad that is None at first."""
    plain, deferring = _pair(bias)
    accumulate_weight_gradients_into_grad(deferring, in_place)
    plain.weight.grad = None
    generator = torch.Generator().manual_seed(3)
    recorders = []
    for chunk in range(2):
        inputs = torch.randn(2, 3, 6, dtype=torch.float64, generator=generator)
        upstream = torch.randn(2, 3, 5, dtype=torch.float64, generator=generator)
        expected_leaf, leaf = inputs.clone().requires_grad_(True), inputs.clone().requires_grad_(True)
        plain(expected_leaf).backward(upstream)
        recorder = WeightGradientRecorder()
        with recording_weight_gradients(recorder):
            output = deferring(leaf)
        output.backward(upstream)  # the recorder is bound at forward time: outside the block is fine
        torch.testing.assert_close(leaf.grad, expected_leaf.grad, rtol=1e-12, atol=1e-12)
        assert deferring.weight.grad is None
        assert len(recorder.records) == 1
        # no record may hold the autograd graph (it holds the recorder: a cycle the collector cannot break)
        assert all(tensor.grad_fn is None for tensor in recorder.records[0][:2])
        recorders.append(recorder)
    if bias:
        torch.testing.assert_close(deferring.bias.grad, plain.bias.grad, rtol=1e-12, atol=1e-12)
    for recorder in reversed(recorders):  # W tasks in backward order
        recorder.apply()
    torch.testing.assert_close(deferring.weight.grad, plain.weight.grad, rtol=1e-12, atol=1e-12)


def test_without_an_active_recorder_nothing_is_recorded():
    plain, _ = _pair(bias=False)
    recorder = WeightGradientRecorder()
    with recording_weight_gradients(recorder):
        pass
    inputs = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    plain(inputs).sum().backward()
    assert not recorder.records and plain.weight.grad is not None
