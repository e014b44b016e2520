"""Linear layers whose backward can add the weight gradient into ``.grad`` itself.

[Note: in-place weight gradients]
A stage run in N sequence chunks runs N backwards per microbatch, and after each one autograd adds the
chunk's weight gradients into ``.grad`` with a separate elementwise kernel that reads and writes every
weight gradient once more: the largest single part of the GPU work that chunking adds to a stage
(docs/benchmarks.md, "Measurements behind the runtime"). With ``accumulate_into_grad`` set, a :class:`Linear`'s backward instead
forms ``weight.grad += dy^T x`` in the weight-gradient GEMM itself (``addmm_``, beta = 1, as Megatron-LM's
gradient-accumulation fusion does) and hands autograd no weight gradient.

Contract: ``weight.grad`` exists before the backward and keeps its storage (the runtime zeroes gradients
in place); whoever asks autograd for the weight's gradient (``torch.autograd.grad``) gets None for it and
must accept that (``allow_unused``). The runtime sets the flag only on stages replayed from CUDA graphs
(:mod:`schedlang.runtime.graphs`): there the captured backward writes into ``.grad`` at replay and costs no
host time, while in eager runs, whose many-chunk steps are already host-bound, the custom autograd function
would cost about as much host time as it saves GPU time (same section of docs/benchmarks.md). Biases keep
autograd's accumulation (they are tiny).

[Note: deferred weight gradients]
A schedule with ``pipeline { split_backward = true }`` runs some chunks' weight gradients as a task of their
own, ``W``, after ``B`` has handed the input and state gradients on ([Note: split backward] in
schedlang.lowering.orders). A :class:`Linear` run forward while a :class:`WeightGradientRecorder` is active
(``recording_weight_gradients``) takes the recorder into its autograd node; its backward then computes the
input gradient only and records ``(x, dy, weight)`` (views of its saved input and of the output gradient,
which the record keeps alive), and ``W`` is ``recorder.apply()``: ``weight.grad += dy^T x`` for every record,
the same GEMM the in-place backward would have run. The recorder is bound at forward time, not looked up in
the backward, because autograd runs CUDA backwards on its own device thread. Biases and every parameter
outside a :class:`Linear` keep their gradients in ``B``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn


class WeightGradientRecorder:
    """The weight gradients one chunk's backward left for its ``W`` task: [Note: deferred weight gradients]."""

    def __init__(self) -> None:
        self.records: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def record(self, input_rows: torch.Tensor, output_grad_rows: torch.Tensor, weight: torch.Tensor) -> None:
        # Detached: a saved input carries its grad_fn, whose graph holds the autograd node whose context holds
        # this recorder, a reference cycle through C++ objects that Python's collector cannot break, which would
        # keep every step's CUDA-graph pools alive.
        self.records.append((input_rows.detach(), output_grad_rows.detach(), weight))

    def clear(self) -> None:
        self.records.clear()

    def apply(self) -> None:
        """``weight.grad += dy^T x`` for every record (a zero ``.grad`` is made where there is none)."""
        with torch.no_grad():
            for input_rows, output_grad_rows, weight in self.records:
                if weight.grad is None:
                    weight.grad = torch.zeros_like(weight)
                weight.grad.addmm_(output_grad_rows.t(), input_rows)


_active_recorder: WeightGradientRecorder | None = None


def active_weight_gradient_recorder() -> WeightGradientRecorder | None:
    """The recorder of the innermost ``recording_weight_gradients`` block (None outside one)."""
    return _active_recorder


@contextmanager
def recording_weight_gradients(recorder: WeightGradientRecorder | None) -> Iterator[None]:
    """Linear layers run forward inside this block leave their weight gradients to ``recorder`` (None: no change)."""
    global _active_recorder
    previous, _active_recorder = _active_recorder, recorder
    try:
        yield
    finally:
        _active_recorder = previous


class _LinearAccumulatingWeightGradient(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        inputs: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        recorder: WeightGradientRecorder | None,
    ) -> torch.Tensor:
        ctx.save_for_backward(inputs, weight)
        # the parameter itself: the saved weight may come back as a detached alias, whose .grad is not the
        # parameter's (recomputation, saved-tensor hooks: [Note: recompute modes] in schedlang.runtime.executor)
        ctx.weight_parameter = weight
        ctx.has_bias = bias is not None
        ctx.recorder = recorder
        return F.linear(inputs, weight, bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, output_grad: torch.Tensor):
        inputs, weight = ctx.saved_tensors
        rows_grad = output_grad.reshape(-1, output_grad.shape[-1])
        input_rows = inputs.reshape(-1, inputs.shape[-1])
        parameter = ctx.weight_parameter
        if ctx.recorder is not None:
            ctx.recorder.record(input_rows, rows_grad, parameter)
        elif parameter.grad is None:
            raise RuntimeError(
                "a Linear with accumulate_into_grad ran its backward before its weight had a .grad to add into: "
                "allocate the gradients (zeros) before the first backward"
            )
        else:
            parameter.grad.addmm_(rows_grad.t(), input_rows)
        input_grad = output_grad @ weight if ctx.needs_input_grad[0] else None
        bias_grad = rows_grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return input_grad, None, bias_grad, None


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, names and initialisation) with [Note: in-place weight gradients] and
    [Note: deferred weight gradients]."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.accumulate_into_grad = False

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        recorder = _active_recorder
        if (self.accumulate_into_grad or recorder is not None) and torch.is_grad_enabled() and self.weight.requires_grad:
            return _LinearAccumulatingWeightGradient.apply(inputs, self.weight, self.bias, recorder)
        return F.linear(inputs, self.weight, self.bias)


def accumulate_weight_gradients_into_grad(module: nn.Module, enabled: bool = True) -> None:
    """Set [Note: in-place weight gradients] on every :class:`Linear` inside ``module``."""
    for child in module.modules():
        if isinstance(child, Linear):
            child.accumulate_into_grad = enabled
