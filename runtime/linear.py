"""Linear layers whose backward can add the weight gradient into ``.grad`` itself.

[Note: in-place weight gradients]
A stage run in N sequence chunks runs N backwards per microbatch, and after each one autograd adds the
chunk's weight gradients into ``.grad`` with a separate elementwise kernel that reads and writes every
weight gradient once more. On an H200 (docs/benchmarks.md, profile_stage at 32K tokens) those additions
were the largest single part of the GPU work that chunking adds to a stage: 5.6 of 12.7 ms per microbatch
at 8 chunks, 11.6 of 23.4 at 16. With ``accumulate_into_grad`` set, a :class:`Linear`'s backward instead
forms ``weight.grad += dy^T x`` in the weight-gradient GEMM itself (``addmm_``, beta = 1, as Megatron-LM's
gradient-accumulation fusion does) and hands autograd no weight gradient.

Contract: ``weight.grad`` exists before the backward and keeps its storage (the runtime zeroes gradients
in place); whoever asks autograd for the weight's gradient (``torch.autograd.grad``) gets None for it and
must accept that (``allow_unused``). The runtime sets the flag only on stages replayed from CUDA graphs
(:mod:`schedlang.runtime.graphs`): there the captured backward writes into ``.grad`` at replay and costs no
host time, while in eager runs, whose many-chunk steps are already host-bound, the custom autograd function
would cost about as much host time as it saves GPU time (9 us more per linear forward+backward on the
development CPU; a 2048-wide GLA block's 9 linears against about 90 us of additions on an H200). Biases keep
autograd's accumulation (they are tiny).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class _LinearAccumulatingWeightGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(inputs, weight)
        ctx.has_bias = bias is not None
        return F.linear(inputs, weight, bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, output_grad: torch.Tensor):
        inputs, weight = ctx.saved_tensors
        if weight.grad is None:
            raise RuntimeError(
                "a Linear with accumulate_into_grad ran its backward before its weight had a .grad to add into: "
                "allocate the gradients (zeros) before the first backward"
            )
        rows_grad = output_grad.reshape(-1, output_grad.shape[-1])
        weight.grad.addmm_(rows_grad.t(), inputs.reshape(-1, inputs.shape[-1]))
        input_grad = output_grad @ weight if ctx.needs_input_grad[0] else None
        bias_grad = rows_grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return input_grad, None, bias_grad


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, names and initialisation) with [Note: in-place weight gradients]."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.accumulate_into_grad = False

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.accumulate_into_grad and torch.is_grad_enabled() and self.weight.requires_grad:
            return _LinearAccumulatingWeightGradient.apply(inputs, self.weight, self.bias)
        return F.linear(inputs, self.weight, self.bias)


def accumulate_weight_gradients_into_grad(module: nn.Module, enabled: bool = True) -> None:
    """Set [Note: in-place weight gradients] on every :class:`Linear` inside ``module``."""
    for child in module.modules():
        if isinstance(child, Linear):
            child.accumulate_into_grad = enabled
