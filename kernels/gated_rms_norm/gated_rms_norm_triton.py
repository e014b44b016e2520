"""Triton gated RMSNorm: forward and backward, one launch each.

A program covers one group of ``D / G`` channels (``BD``, a power of two covering it) for ``ROWS`` consecutive
rows, one row at a time, so a group's whole width is in registers for its mean. ``NORM_BEFORE_GATE`` picks the
order (kernels/gated_rms_norm/gated_rms_norm.py); ``SHARED_WEIGHT`` reads one ``[D / G]`` weight for every
group. The backward sums its rows' weight gradient into a float32 ``[programs, D]`` buffer that the host sums
(deterministic, no atomics).
Elementwise and row reductions only: no ``tl.dot``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from schedlang.kernels.common.sizes import cdiv, next_power_of_2
from schedlang.kernels.common.triton_scan import new_output
from schedlang.kernels.gated_rms_norm.gated_rms_norm import GatedNormImplementation

ROWS_PER_PROGRAM = 16


@triton.jit
def _gated_row(values, gate, row, o_d, mask, values_stride, gate_stride, NORM_BEFORE_GATE: tl.constexpr):
    """(v, z, sigmoid(z), u) of one row's group in float32, ``u`` what is normalised: v, or v silu(z)."""
    v = tl.load(values + row * values_stride + o_d, mask=mask, other=0.0).to(tl.float32)
    z = tl.load(gate + row * gate_stride + o_d, mask=mask, other=0.0).to(tl.float32)
    sigmoid = 1.0 / (1.0 + tl.exp(-z))
    if NORM_BEFORE_GATE:
        u = v
    else:
        u = v * z * sigmoid
    return v, z, sigmoid, u


@triton.jit
def _program_group(weight, GROUP: tl.constexpr, BD: tl.constexpr, SHARED_WEIGHT: tl.constexpr):
    """(this program's first row block index, its group's channels ``o_d`` and their mask, the weight there)."""
    i_g = tl.program_id(1)
    o_d = i_g * GROUP + tl.arange(0, BD)
    d_mask = tl.arange(0, BD) < GROUP
    o_w = tl.arange(0, BD)
    if not SHARED_WEIGHT:
        o_w += i_g * GROUP
    return tl.program_id(0), o_d, d_mask, tl.load(weight + o_w, mask=d_mask, other=0.0).to(tl.float32)


@triton.jit
def gated_rms_norm_fwd_kernel(values, gate, weight, output, R, D, values_stride, gate_stride, eps,
                              GROUP: tl.constexpr, BD: tl.constexpr, ROWS: tl.constexpr,
                              NORM_BEFORE_GATE: tl.constexpr, SHARED_WEIGHT: tl.constexpr):
    i_r, o_d, d_mask, w = _program_group(weight, GROUP, BD, SHARED_WEIGHT)
    for r in range(ROWS):
        row = (i_r * ROWS + r).to(tl.int64)
        mask = d_mask & (row < R)
        _, z, sigmoid, u = _gated_row(values, gate, row, o_d, mask, values_stride, gate_stride, NORM_BEFORE_GATE)
        rstd = 1.0 / tl.sqrt(tl.sum(u * u, axis=0) / GROUP + eps)
        y = u * rstd * w
        if NORM_BEFORE_GATE:
            y = y * z * sigmoid
        tl.store(output + row * D + o_d, y.to(output.dtype.element_ty), mask=mask)


@triton.jit
def gated_rms_norm_bwd_kernel(values, gate, weight, output_grad, d_values, d_gate, d_weight_parts,
                              R, D, values_stride, gate_stride, dy_stride, eps,
                              GROUP: tl.constexpr, BD: tl.constexpr, ROWS: tl.constexpr,
                              NORM_BEFORE_GATE: tl.constexpr, SHARED_WEIGHT: tl.constexpr):
    i_r, o_d, d_mask, w = _program_group(weight, GROUP, BD, SHARED_WEIGHT)
    d_w = tl.zeros([BD], dtype=tl.float32)
    for r in range(ROWS):
        row = (i_r * ROWS + r).to(tl.int64)
        mask = d_mask & (row < R)
        v, z, sigmoid, u = _gated_row(values, gate, row, o_d, mask, values_stride, gate_stride, NORM_BEFORE_GATE)
        rstd = 1.0 / tl.sqrt(tl.sum(u * u, axis=0) / GROUP + eps)
        dy = tl.load(output_grad + row * dy_stride + o_d, mask=mask, other=0.0).to(tl.float32)
        normed = u * rstd
        silu_derivative = sigmoid * (1.0 + z * (1.0 - sigmoid))
        if NORM_BEFORE_GATE:  # y = normed w silu(z)
            d_normed = dy * w * z * sigmoid
            d_w += dy * normed * z * sigmoid
            d_z = dy * normed * w * silu_derivative
        else:  # y = normed w, normed from u = v silu(z)
            d_normed = dy * w
            d_w += dy * normed
        d_u = rstd * (d_normed - normed * (tl.sum(d_normed * normed, axis=0) / GROUP))
        if NORM_BEFORE_GATE:
            d_v = d_u
        else:
            d_v = d_u * z * sigmoid
            d_z = d_u * v * silu_derivative
        tl.store(d_values + row * D + o_d, d_v.to(d_values.dtype.element_ty), mask=mask)
        tl.store(d_gate + row * D + o_d, d_z.to(d_gate.dtype.element_ty), mask=mask)
    tl.store(d_weight_parts + i_r.to(tl.int64) * D + o_d, d_w, mask=d_mask)


def _launch(rows: int, width: int, groups: int):
    group = width // groups
    return (cdiv(rows, ROWS_PER_PROGRAM), groups), group, next_power_of_2(group)


def forward(values, gate, weight, groups, eps, norm_before_gate):
    rows, width = values.shape
    output = new_output((rows, width), values.dtype, values.device)
    grid, group, block = _launch(rows, width, groups)
    gated_rms_norm_fwd_kernel[grid](
        values, gate, weight, output, rows, width, values.stride(0), gate.stride(0), eps, GROUP=group, BD=block,
        ROWS=ROWS_PER_PROGRAM, NORM_BEFORE_GATE=norm_before_gate, SHARED_WEIGHT=weight.shape[0] != width,
    )
    return output


def backward(values, gate, weight, groups, eps, norm_before_gate, output_grad):
    rows, width = values.shape
    grid, group, block = _launch(rows, width, groups)
    d_values = new_output((rows, width), values.dtype, values.device)
    d_gate = new_output((rows, width), gate.dtype, gate.device)
    d_weight_parts = torch.empty(grid[0], width, dtype=torch.float32, device=values.device)
    gated_rms_norm_bwd_kernel[grid](
        values, gate, weight, output_grad, d_values, d_gate, d_weight_parts, rows, width,
        values.stride(0), gate.stride(0), output_grad.stride(0), eps, GROUP=group, BD=block, ROWS=ROWS_PER_PROGRAM,
        NORM_BEFORE_GATE=norm_before_gate, SHARED_WEIGHT=weight.shape[0] != width,
    )
    d_weight = d_weight_parts.sum(dim=0)
    return d_values, d_gate, d_weight.view(-1, weight.shape[0]).sum(dim=0)


TRITON_IMPLEMENTATION = GatedNormImplementation("triton", forward, backward)
