"""The autograd.Function shared by the pointwise operators (SwiGLU, the log-sigmoid gate).

A pointwise implementation provides two functions on a row matrix ``x`` ([rows, columns], last-dimension
stride 1, any row stride, so a column slice of a wider projection is read in place):
    forward(x) -> y          (a new contiguous tensor)
    backward(x, dy) -> dx    (a new contiguous tensor of x's shape and dtype)
The Function saves only ``x`` and recomputes what the backward needs from it: one kernel each way, nothing
kept beyond the input, which the projection that produced it saves anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class PointwiseImplementation:
    name: str
    forward: Callable[[torch.Tensor], torch.Tensor]
    backward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def as_rows(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as [rows, last dimension] with unit column stride; a view when the leading dimensions collapse."""
    rows = tensor.reshape(-1, tensor.shape[-1])
    return rows if rows.stride(-1) == 1 or rows.shape[-1] == 1 else rows.contiguous()


class PointwiseFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, output_columns: int, implementation: PointwiseImplementation) -> torch.Tensor:
        rows = as_rows(x)
        ctx.save_for_backward(x)
        ctx.implementation = implementation
        return implementation.forward(rows).view(*x.shape[:-1], output_columns)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, output_grad: torch.Tensor):
        (x,) = ctx.saved_tensors
        rows_grad = as_rows(output_grad)
        input_grad = ctx.implementation.backward(as_rows(x), rows_grad)
        return input_grad.view(x.shape), None, None


def pointwise_grid(rows: int, columns: int, block: int) -> tuple[int, int]:
    """One program per row and ``block`` columns."""
    return (rows, -(-columns // block))
