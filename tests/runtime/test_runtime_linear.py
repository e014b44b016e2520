"""runtime.linear: a Linear whose backward adds its weight gradient into .grad (the CUDA-graph stages use it)."""

import pytest
import torch

from schedlang.runtime.linear import Linear, accumulate_weight_gradients_into_grad


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
