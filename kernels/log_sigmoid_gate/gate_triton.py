"""Triton log-sigmoid gate: ``logsigmoid(x) / c`` forward into float32, ``dy sigmoid(-x) / c`` backward.

``log1p`` is formed with Goldberg's correction, ``log(w) * z / (w - 1)`` for ``w = 1 + z``, which stays exact
to float32 rounding where ``exp(-|x|)`` is far below 1 (Triton's core language has no log1p). Elementwise
only: no ``tl.dot``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from schedlang.kernels.common.pointwise import PointwiseImplementation, pointwise_grid
from schedlang.kernels.common.sizes import block_size
from schedlang.kernels.common.triton_scan import new_output

BLOCK_LIMIT = 1024


@triton.jit
def log_sigmoid_gate_fwd_kernel(x, y, x_row_stride, W, inverse_normalizer, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    columns = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = columns < W
    logits = tl.load(x + row * x_row_stride + columns, mask=mask, other=0.0).to(tl.float32)
    z = tl.exp(-tl.abs(logits))
    w = 1.0 + z
    log1p = tl.where(w == 1.0, z, tl.log(w) * z / tl.where(w == 1.0, 1.0, w - 1.0))
    value = (tl.minimum(logits, 0.0) - log1p) * inverse_normalizer
    tl.store(y + row * W + columns, value, mask=mask)


@triton.jit
def log_sigmoid_gate_bwd_kernel(x, dy, dx, x_row_stride, dy_row_stride, W, inverse_normalizer, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    columns = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = columns < W
    logits = tl.load(x + row * x_row_stride + columns, mask=mask, other=0.0).to(tl.float32)
    grad = tl.load(dy + row * dy_row_stride + columns, mask=mask, other=0.0).to(tl.float32)
    value = grad * inverse_normalizer / (1.0 + tl.exp(logits))
    tl.store(dx + row * W + columns, value.to(dx.dtype.element_ty), mask=mask)


def triton_implementation(normalizer: float) -> PointwiseImplementation:
    inverse = 1.0 / normalizer

    def forward(rows):
        n_rows, width = rows.shape
        output = new_output((n_rows, width), torch.float32, rows.device)
        block = block_size(width, BLOCK_LIMIT)
        log_sigmoid_gate_fwd_kernel[pointwise_grid(n_rows, width, block)](
            rows, output, rows.stride(0), width, inverse, BLOCK=block
        )
        return output

    def backward(rows, output_grad):
        n_rows, width = rows.shape
        input_grad = new_output((n_rows, width), rows.dtype, rows.device)
        block = block_size(width, BLOCK_LIMIT)
        log_sigmoid_gate_bwd_kernel[pointwise_grid(n_rows, width, block)](
            rows, output_grad, input_grad, rows.stride(0), output_grad.stride(0), width, inverse, BLOCK=block
        )
        return input_grad

    return PointwiseImplementation("triton", forward, backward)
