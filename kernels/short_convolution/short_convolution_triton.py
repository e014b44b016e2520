"""Triton short convolution: forward ``y = silu(b + sum_j w_j p_{t+j})`` and backward, one launch each.

Each program covers ``BT`` positions and ``BC`` channels of one sequence. The padded sequence ``p = [history |
inputs]`` is never formed: :func:`_padded_tile` reads position ``s`` from the history (``s < W - 1``) or the
inputs, through their strides. The backward program covers padded positions ``s`` (``L + W - 1`` of them):
``dp_s = sum_j w_j dpre_{s-j}`` recomputes ``pre`` at the ``W`` positions ``s - j`` it needs (``W^2`` tile
loads, served by the cache: the kernel is memory-bound on its one read of x and dy and one write of dx), and
the ``j = 0`` term's ``dpre_s`` gives the weight and bias gradients, summed per program into a float32
``[programs, W, C]`` buffer that the host sums (deterministic, no atomics). Elementwise only: no ``tl.dot``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from schedlang.kernels.common.sizes import block_size, cdiv
from schedlang.kernels.common.triton_scan import new_output
from schedlang.kernels.short_convolution.short_convolution import ConvolutionImplementation

BLOCK_TOKENS = 32
CHANNEL_LIMIT = 128


@triton.jit
def _padded_tile(inputs, history, i_b, s, o_c, L, C, inputs_b_stride, inputs_t_stride,
                 HISTORY: tl.constexpr, HAS_HISTORY: tl.constexpr):
    """``p[s, c]`` in float32 for padded positions ``s`` [BT] and channels ``o_c`` [BC]; zero outside
    ``0 <= s < L + HISTORY`` and where the history is absent."""
    c_mask = o_c < C
    t = s - HISTORY
    in_chunk = (t >= 0) & (t < L)
    p_inputs = inputs + i_b * inputs_b_stride + t[:, None].to(tl.int64) * inputs_t_stride + o_c[None, :]
    tile = tl.load(p_inputs, mask=in_chunk[:, None] & c_mask[None, :], other=0.0).to(tl.float32)
    if HAS_HISTORY:
        in_history = (s >= 0) & (s < HISTORY)
        p_history = history + (i_b * HISTORY + s[:, None]).to(tl.int64) * C + o_c[None, :]
        tile += tl.load(p_history, mask=in_history[:, None] & c_mask[None, :], other=0.0).to(tl.float32)
    return tile


@triton.jit
def _pre_activation(inputs, history, weight, b_bias, i_b, t, o_c, L, C, inputs_b_stride, inputs_t_stride,
                    W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, HAS_HISTORY: tl.constexpr):
    """``pre_t = b + sum_j w_j p_{t+j}`` [BT, BC] float32 at chunk tokens ``t``."""
    c_mask = o_c < C
    acc = tl.zeros([BT, BC], dtype=tl.float32) + b_bias[None, :]
    for j in tl.static_range(W):
        b_w = tl.load(weight + o_c * W + j, mask=c_mask, other=0.0).to(tl.float32)
        acc += b_w[None, :] * _padded_tile(inputs, history, i_b, t + j, o_c, L, C, inputs_b_stride,
                                           inputs_t_stride, W - 1, HAS_HISTORY)
    return acc


@triton.jit
def short_convolution_fwd_kernel(
    inputs, history, weight, bias, output, L, C, inputs_b_stride, inputs_t_stride,
    W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, HAS_HISTORY: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    i_t, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    t = i_t * BT + tl.arange(0, BT)
    o_c = i_c * BC + tl.arange(0, BC)
    c_mask = o_c < C
    b_bias = tl.zeros([BC], dtype=tl.float32)
    if HAS_BIAS:
        b_bias += tl.load(bias + o_c, mask=c_mask, other=0.0).to(tl.float32)
    pre = _pre_activation(inputs, history, weight, b_bias, i_b, t, o_c, L, C, inputs_b_stride, inputs_t_stride,
                          W, BT, BC, HAS_HISTORY)
    y = pre / (1.0 + tl.exp(-pre))
    p_output = output + (i_b * L + t[:, None]).to(tl.int64) * C + o_c[None, :]
    tl.store(p_output, y.to(output.dtype.element_ty), mask=(t < L)[:, None] & c_mask[None, :])


@triton.jit
def short_convolution_bwd_kernel(
    inputs, history, weight, bias, output_grad, d_inputs, d_history, d_weight_parts, d_bias_parts,
    L, C, inputs_b_stride, inputs_t_stride, dy_b_stride, dy_t_stride,
    W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, HAS_HISTORY: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    i_s, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)  # offsets past 2**31
    s = i_s * BT + tl.arange(0, BT)  # padded positions: history rows, then the chunk's tokens
    o_c = i_c * BC + tl.arange(0, BC)
    c_mask = o_c < C
    b_bias = tl.zeros([BC], dtype=tl.float32)
    if HAS_BIAS:
        b_bias += tl.load(bias + o_c, mask=c_mask, other=0.0).to(tl.float32)
    d_padded = tl.zeros([BT, BC], dtype=tl.float32)
    for j in tl.static_range(W):
        t = s - j  # the output token whose tap j reads position s
        t_mask = (t >= 0) & (t < L)
        pre = _pre_activation(inputs, history, weight, b_bias, i_b, t, o_c, L, C, inputs_b_stride,
                              inputs_t_stride, W, BT, BC, HAS_HISTORY)
        p_dy = output_grad + i_b * dy_b_stride + t[:, None].to(tl.int64) * dy_t_stride + o_c[None, :]
        dy = tl.load(p_dy, mask=t_mask[:, None] & c_mask[None, :], other=0.0).to(tl.float32)
        sigmoid = 1.0 / (1.0 + tl.exp(-pre))
        d_pre = dy * sigmoid * (1.0 + pre * (1.0 - sigmoid))
        b_w = tl.load(weight + o_c * W + j, mask=c_mask, other=0.0).to(tl.float32)
        d_padded += b_w[None, :] * d_pre
        if j == 0:  # t = s: each chunk token's d_pre once, for the weight and bias gradients
            part = (i_b * tl.num_programs(0) + i_s).to(tl.int64)
            for tap in tl.static_range(W):
                tile = _padded_tile(inputs, history, i_b, s + tap, o_c, L, C, inputs_b_stride, inputs_t_stride,
                                    W - 1, HAS_HISTORY)
                tl.store(d_weight_parts + (part * W + tap) * C + o_c, tl.sum(d_pre * tile, axis=0), mask=c_mask)
            if HAS_BIAS:
                tl.store(d_bias_parts + part * C + o_c, tl.sum(d_pre, axis=0), mask=c_mask)
    t = s - (W - 1)
    in_chunk = (t >= 0) & (t < L)
    p_dx = d_inputs + (i_b * L + t[:, None]).to(tl.int64) * C + o_c[None, :]
    tl.store(p_dx, d_padded.to(d_inputs.dtype.element_ty), mask=in_chunk[:, None] & c_mask[None, :])
    if HAS_HISTORY:
        in_history = (s >= 0) & (s < W - 1)
        p_dh = d_history + (i_b * (W - 1) + s[:, None]).to(tl.int64) * C + o_c[None, :]
        tl.store(p_dh, d_padded.to(d_history.dtype.element_ty), mask=in_history[:, None] & c_mask[None, :])


def _sizes(channels: int) -> tuple[int, int]:
    return BLOCK_TOKENS, block_size(channels, CHANNEL_LIMIT)


def forward(inputs, weight, bias, history):
    batch, length, channels = inputs.shape
    size = weight.shape[1]
    output = new_output((batch, length, channels), inputs.dtype, inputs.device)
    block_tokens, block_channels = _sizes(channels)
    grid = (cdiv(length, block_tokens), cdiv(channels, block_channels), batch)
    short_convolution_fwd_kernel[grid](
        inputs, inputs if history is None else history, weight, weight if bias is None else bias, output,
        length, channels, inputs.stride(0), inputs.stride(1),
        W=size, BT=block_tokens, BC=block_channels, HAS_HISTORY=history is not None, HAS_BIAS=bias is not None,
    )
    return output


def backward(inputs, weight, bias, history, output_grad):
    batch, length, channels = inputs.shape
    size = weight.shape[1]
    if output_grad.stride(-1) != 1:
        output_grad = output_grad.contiguous()
    block_tokens, block_channels = _sizes(channels)
    position_blocks = cdiv(length + size - 1, block_tokens)
    d_inputs = new_output((batch, length, channels), inputs.dtype, inputs.device)
    d_history = None if history is None else new_output(tuple(history.shape), history.dtype, history.device)
    d_weight_parts = torch.empty(batch * position_blocks, size, channels, dtype=torch.float32, device=inputs.device)
    d_bias_parts = None if bias is None else torch.empty(batch * position_blocks, channels, dtype=torch.float32,
                                                         device=inputs.device)
    grid = (position_blocks, cdiv(channels, block_channels), batch)
    short_convolution_bwd_kernel[grid](
        inputs, inputs if history is None else history, weight, weight if bias is None else bias, output_grad,
        d_inputs, d_inputs if d_history is None else d_history, d_weight_parts,
        d_weight_parts if d_bias_parts is None else d_bias_parts,
        length, channels, inputs.stride(0), inputs.stride(1), output_grad.stride(0), output_grad.stride(1),
        W=size, BT=block_tokens, BC=block_channels, HAS_HISTORY=history is not None, HAS_BIAS=bias is not None,
    )
    d_weight = d_weight_parts.sum(dim=0).t()
    d_bias = None if d_bias_parts is None else d_bias_parts.sum(dim=0)
    return d_inputs, d_weight, d_bias, d_history


TRITON_IMPLEMENTATION = ConvolutionImplementation("triton", forward, backward)
