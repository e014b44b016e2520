"""``silu(causal depthwise conv1d)`` over a chunk that continues a sequence, and its PyTorch implementation.

With ``W`` taps, the padded sequence ``p = [history | inputs]`` (``W - 1`` inputs before the chunk, then its
``L``), weight ``w [C, W]`` and bias ``b``:
    pre_t = b + sum_j w_j p_{t + j}          y_t = silu(pre_t)                       (t = 0 .. L - 1)
    dpre_t = dy_t silu'(pre_t)               dp_s = sum_j w_j dpre_{s - j}           (0 <= s - j < L)
    dw_j = sum_t dpre_t p_{t + j}            db = sum_t dpre_t
Tap ``W - 1`` reads the current token (flash-linear-attention's ``ShortConvolution`` layout). Both paths
compute in float32 (float64 for float64 inputs) and round once; the Triton path (one launch each way,
kernels/short_convolution/short_convolution_triton.py) reads ``inputs`` through its row strides, so a column
slice of a fused projection is read in place, and never forms the padded sequence. The Function saves only
its inputs and recomputes ``pre`` in the backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from schedlang.kernels.common import check_floating_tensor, compute_dtype_for
from schedlang.kernels.common.arguments import runs_float32_kernels


@dataclass(frozen=True)
class ConvolutionImplementation:
    """``forward(inputs, weight, bias, history) -> y`` and ``backward(inputs, weight, bias, history, dy) ->
    (d inputs, d weight [C, W] float32, d bias [C] float32 or None, d history or None)``; ``history`` is None
    for zeros, ``inputs`` has a unit last stride, ``weight`` is ``[C, W]`` contiguous."""

    name: str
    forward: Callable
    backward: Callable


def _padded(inputs, history, size, compute):
    batch, _, channels = inputs.shape
    if history is None:
        history = inputs.new_zeros(batch, size - 1, channels)
    return torch.cat((history.to(compute), inputs.to(compute)), dim=1)


def _torch_pre_activation(padded, weight, bias):
    return F.conv1d(padded.transpose(1, 2), weight[:, None, :], bias, groups=weight.shape[0]).transpose(1, 2)


def _torch_forward(inputs, weight, bias, history):
    compute = compute_dtype_for(inputs.dtype)
    padded = _padded(inputs, history, weight.shape[1], compute)
    bias = None if bias is None else bias.to(compute)
    output = F.silu(_torch_pre_activation(padded, weight.to(compute), bias))
    return output.to(inputs.dtype).contiguous()


def _torch_backward(inputs, weight, bias, history, dy):
    compute = compute_dtype_for(inputs.dtype)
    size = weight.shape[1]
    padded = _padded(inputs, history, size, compute).requires_grad_(True)
    weight = weight.to(compute).requires_grad_(True)
    bias = None if bias is None else bias.to(compute).requires_grad_(True)
    with torch.enable_grad():
        output = F.silu(_torch_pre_activation(padded, weight, bias))
        leaves = [padded, weight] + ([] if bias is None else [bias])
        grads = torch.autograd.grad(output, leaves, dy.to(compute))
    d_padded, d_weight = grads[0], grads[1]
    d_bias = grads[2] if bias is not None else None
    d_history = None if history is None else d_padded[:, : size - 1].to(history.dtype)
    return d_padded[:, size - 1 :].to(inputs.dtype), d_weight, d_bias, d_history


TORCH_IMPLEMENTATION = ConvolutionImplementation("torch", _torch_forward, _torch_backward)


class ShortConvolutionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inputs, weight, bias, history, implementation):
        ctx.save_for_backward(inputs, weight, bias, history)
        ctx.implementation = implementation
        return implementation.forward(inputs, weight, bias, history)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        inputs, weight, bias, history = ctx.saved_tensors
        d_inputs, d_weight, d_bias, d_history = ctx.implementation.backward(inputs, weight, bias, history, dy)
        d_bias = None if bias is None else d_bias.to(bias.dtype)
        return d_inputs, d_weight.to(weight.dtype), d_bias, d_history, None


def _check_arguments(inputs, weight, bias, history) -> None:
    check_floating_tensor("inputs", inputs)
    check_floating_tensor("weight", weight)
    if inputs.dim() != 3:
        raise ValueError(f"inputs must have shape [B, L, C], got {tuple(inputs.shape)}")
    batch, _, channels = inputs.shape
    if weight.dim() != 2 or weight.shape[0] != channels or weight.shape[1] < 1:
        raise ValueError(f"weight must have shape [C, W] = [{channels}, W], got {tuple(weight.shape)}")
    if bias is not None and tuple(bias.shape) != (channels,):
        raise ValueError(f"bias must have shape [C] = [{channels}], got {tuple(bias.shape)}")
    expected = (batch, weight.shape[1] - 1, channels)
    if history is not None and tuple(history.shape) != expected:
        raise ValueError(f"history must have shape [B, W - 1, C] = {list(expected)}, got {tuple(history.shape)}")
    if history is not None and history.dtype != inputs.dtype:
        raise ValueError(f"history must have inputs' dtype {inputs.dtype}, got {history.dtype}")


def short_convolution(inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                      history: torch.Tensor | None = None, backend: str = "auto") -> torch.Tensor:
    """``silu`` of the causal depthwise convolution of ``[history | inputs]``, at the chunk's ``L`` tokens.

    Args:
        inputs: [B, L, C]; any strides whose last one is 1 are read in place on the Triton path.
        weight: [C, W] (fla's ``conv1d.weight [C, 1, W]`` without its middle axis); tap W - 1 is the token's own.
        bias: [C] or None. history: [B, W - 1, C] in inputs' dtype, the inputs before the chunk; None: zeros.
        backend: "auto" (Triton on CUDA or under TRITON_INTERPRET=1, else PyTorch), "triton" or "torch";
            float64 inputs always take the PyTorch path (the kernels compute in float32).
    Returns:
        [B, L, C] in inputs' dtype, contiguous. Autograd gives gradients for inputs, weight, bias and history.
    """
    _check_arguments(inputs, weight, bias, history)
    if not runs_float32_kernels(backend, inputs):
        implementation = TORCH_IMPLEMENTATION
    else:
        from schedlang.kernels.short_convolution.short_convolution_triton import TRITON_IMPLEMENTATION as implementation
    inputs = inputs if inputs.stride(-1) == 1 else inputs.contiguous()
    history = None if history is None else history.contiguous()
    return ShortConvolutionFunction.apply(inputs, weight.contiguous(), bias, history, implementation)


def short_convolution_history(inputs: torch.Tensor, history: torch.Tensor | None, size: int) -> torch.Tensor:
    """The last ``size - 1`` of ``[history | inputs]`` (``[B, size - 1, C]``; None history: zeros), the
    history the next chunk starts from; a view of ``inputs`` when the chunk has at least ``size - 1`` tokens."""
    keep = size - 1
    length = inputs.shape[1]
    if length >= keep:
        return inputs[:, length - keep :]
    if history is None:
        history = inputs.new_zeros(inputs.shape[0], keep, inputs.shape[2])
    return torch.cat((history[:, length:].to(inputs.dtype), inputs), dim=1)


def naive_short_convolution(inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                            history: torch.Tensor | None = None) -> torch.Tensor:
    """The reference: every tap as a shifted product, summed, then torch's silu; differentiated by autograd."""
    size = weight.shape[1]
    length = inputs.shape[1]
    if history is None:
        history = inputs.new_zeros(inputs.shape[0], size - 1, inputs.shape[2])
    padded = torch.cat((history, inputs), dim=1)
    pre = sum(weight[:, tap] * padded[:, tap : tap + length] for tap in range(size))
    return F.silu(pre if bias is None else pre + bias)
