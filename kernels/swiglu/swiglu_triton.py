"""Triton SwiGLU: forward ``y = silu(gate) * up`` and backward ``[d gate | d up]``, one launch each.

Each program handles ``BLOCK`` columns of one row, reading the gate and up halves of the input row in place
(``x_row_stride`` lets the input be a column slice of a wider tensor). Elementwise only: no ``tl.dot``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from schedlang.kernels.common.pointwise import PointwiseImplementation, pointwise_grid
from schedlang.kernels.common.sizes import block_size
from schedlang.kernels.common.triton_scan import new_output

BLOCK_LIMIT = 1024


@triton.jit
def swiglu_fwd_kernel(x, y, x_row_stride, H, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    columns = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = columns < H
    gate = tl.load(x + row * x_row_stride + columns, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x + row * x_row_stride + H + columns, mask=mask, other=0.0).to(tl.float32)
    sigmoid = 1.0 / (1.0 + tl.exp(-gate))
    tl.store(y + row * H + columns, (gate * sigmoid * up).to(y.dtype.element_ty), mask=mask)


@triton.jit
def swiglu_bwd_kernel(x, dy, dx, x_row_stride, dy_row_stride, H, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    columns = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = columns < H
    gate = tl.load(x + row * x_row_stride + columns, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x + row * x_row_stride + H + columns, mask=mask, other=0.0).to(tl.float32)
    grad = tl.load(dy + row * dy_row_stride + columns, mask=mask, other=0.0).to(tl.float32)
    sigmoid = 1.0 / (1.0 + tl.exp(-gate))
    gate_grad = grad * up * sigmoid * (1.0 + gate * (1.0 - sigmoid))
    up_grad = grad * gate * sigmoid
    tl.store(dx + row * 2 * H + columns, gate_grad.to(dx.dtype.element_ty), mask=mask)
    tl.store(dx + row * 2 * H + H + columns, up_grad.to(dx.dtype.element_ty), mask=mask)


def forward(rows):
    n_rows, width = rows.shape
    half = width // 2
    output = new_output((n_rows, half), rows.dtype, rows.device)
    block = block_size(half, BLOCK_LIMIT)
    swiglu_fwd_kernel[pointwise_grid(n_rows, half, block)](rows, output, rows.stride(0), half, BLOCK=block)
    return output


def backward(rows, output_grad):
    n_rows, width = rows.shape
    half = width // 2
    input_grad = new_output((n_rows, width), rows.dtype, rows.device)
    block = block_size(half, BLOCK_LIMIT)
    swiglu_bwd_kernel[pointwise_grid(n_rows, half, block)](
        rows, output_grad, input_grad, rows.stride(0), output_grad.stride(0), half, BLOCK=block
    )
    return input_grad


TRITON_IMPLEMENTATION = PointwiseImplementation("triton", forward, backward)
