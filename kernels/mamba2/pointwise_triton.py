"""Triton kernels for the SSD's pointwise ends: the operand map (``v = dt x``, ``g = dt A``) and the ``D`` skip.

One launch each way per end, and one for both ends' backward together (``map_and_skip_backward``). A program covers ``BT`` tokens of one (batch, head) and the whole head width
``P`` (``BP`` >= P), so the sums over P (``d dt``) stay in the program; the sums over tokens (``dA``, ``dD``)
leave one partial per program, which the host adds (``partials.sum``). Every value is formed in float32 and
rounded once to its output's dtype. Elementwise only: no ``tl.dot``, so bfloat16 runs in Triton's interpreter
too. ``x`` is read through its strides (last stride 1), so the mixer's column slice of the convolution's output
is read in place; every other tensor is contiguous ``[B, T, H(, P)]``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from schedlang.kernels.common.sizes import cdiv, next_power_of_2
from schedlang.kernels.common.triton_scan import new_output

TOKENS = 64
"""Tokens per program (``BT``)."""


@triton.jit
def _tile(i_t, i_bh, T, H: tl.constexpr, P: tl.constexpr, BT: tl.constexpr, BP: tl.constexpr):
    """(batch, head, token offsets, token mask, row offsets into a contiguous [B, T, H] tensor, 2-d mask)."""
    i_b, i_h = i_bh // H, i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    in_t = o_t < T
    rows = (i_b * T + o_t).to(tl.int64) * H + i_h
    mask = in_t[:, None] & (tl.arange(0, BP) < P)[None, :]
    return i_b, i_h, o_t, in_t, rows, mask


@triton.jit
def _load_x(x, i_b, i_h, o_t, mask, stride_b, stride_t, stride_h, BP: tl.constexpr):
    offsets = i_b.to(tl.int64) * stride_b + o_t.to(tl.int64)[:, None] * stride_t + i_h * stride_h
    return tl.load(x + offsets + tl.arange(0, BP)[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def ssd_map_fwd_kernel(
    x, dt, A, v, g, T, stride_b, stride_t, stride_h,
    H: tl.constexpr, P: tl.constexpr, BT: tl.constexpr, BP: tl.constexpr,
):
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h, o_t, in_t, rows, mask = _tile(i_t, i_bh, T, H, P, BT, BP)
    b_dt = tl.load(dt + rows, mask=in_t, other=0.0).to(tl.float32)
    b_x = _load_x(x, i_b, i_h, o_t, mask, stride_b, stride_t, stride_h, BP)
    columns = tl.arange(0, BP)[None, :]
    tl.store(v + rows[:, None] * P + columns, (b_x * b_dt[:, None]).to(v.dtype.element_ty), mask=mask)
    tl.store(g + rows, b_dt * tl.load(A + i_h).to(tl.float32), mask=in_t)


@triton.jit
def ssd_map_bwd_kernel(
    x, dt, A, dv, dg, dx, ddt, dA_partials, T, NTB, stride_b, stride_t, stride_h,
    H: tl.constexpr, P: tl.constexpr, BT: tl.constexpr, BP: tl.constexpr,
):
    # dx = dv dt; d dt = sum_P(dv x) + dg A; dA = sum over tokens of dg dt (one partial per program)
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h, o_t, in_t, rows, mask = _tile(i_t, i_bh, T, H, P, BT, BP)
    columns = tl.arange(0, BP)[None, :]
    b_dt = tl.load(dt + rows, mask=in_t, other=0.0).to(tl.float32)
    b_dg = tl.load(dg + rows, mask=in_t, other=0.0).to(tl.float32)
    b_dv = tl.load(dv + rows[:, None] * P + columns, mask=mask, other=0.0).to(tl.float32)
    b_x = _load_x(x, i_b, i_h, o_t, mask, stride_b, stride_t, stride_h, BP)
    a = tl.load(A + i_h).to(tl.float32)
    tl.store(dx + rows[:, None] * P + columns, (b_dv * b_dt[:, None]).to(dx.dtype.element_ty), mask=mask)
    tl.store(ddt + rows, tl.sum(b_dv * b_x, axis=1) + b_dg * a, mask=in_t)
    tl.store(dA_partials + i_bh * NTB + i_t, tl.sum(b_dg * b_dt, axis=0))


@triton.jit
def ssd_skip_fwd_kernel(
    o, x, D, y, T, stride_b, stride_t, stride_h,
    H: tl.constexpr, P: tl.constexpr, BT: tl.constexpr, BP: tl.constexpr,
):
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h, o_t, in_t, rows, mask = _tile(i_t, i_bh, T, H, P, BT, BP)
    offsets = rows[:, None] * P + tl.arange(0, BP)[None, :]
    b_o = tl.load(o + offsets, mask=mask, other=0.0).to(tl.float32)
    b_x = _load_x(x, i_b, i_h, o_t, mask, stride_b, stride_t, stride_h, BP)
    tl.store(y + offsets, (b_o + tl.load(D + i_h).to(tl.float32) * b_x).to(y.dtype.element_ty), mask=mask)


@triton.jit
def ssd_skip_bwd_kernel(
    x, D, dy, dx, dD_partials, T, NTB, stride_b, stride_t, stride_h,
    H: tl.constexpr, P: tl.constexpr, BT: tl.constexpr, BP: tl.constexpr,
):
    # dx = dy D; dD = sum over tokens and P of dy x (one partial per program)
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h, o_t, in_t, rows, mask = _tile(i_t, i_bh, T, H, P, BT, BP)
    offsets = rows[:, None] * P + tl.arange(0, BP)[None, :]
    b_dy = tl.load(dy + offsets, mask=mask, other=0.0).to(tl.float32)
    b_x = _load_x(x, i_b, i_h, o_t, mask, stride_b, stride_t, stride_h, BP)
    tl.store(dx + offsets, (b_dy * tl.load(D + i_h).to(tl.float32)).to(dx.dtype.element_ty), mask=mask)
    tl.store(dD_partials + i_bh * NTB + i_t, tl.sum(tl.sum(b_dy * b_x, axis=1), axis=0))


@triton.jit
def ssd_map_and_skip_bwd_kernel(
    x, dt, A, D, dv, dg, dy, dx, ddt, dA_partials, dD_partials, T, NTB, stride_b, stride_t, stride_h,
    H: tl.constexpr, P: tl.constexpr, BT: tl.constexpr, BP: tl.constexpr,
):
    # Both ends' backward in one pass: dx = dv dt + dy D (rounded once); d dt = sum_P(dv x) + dg A; dA and dD
    # one partial per program (sum of dg dt; sum of dy x)
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h, o_t, in_t, rows, mask = _tile(i_t, i_bh, T, H, P, BT, BP)
    offsets = rows[:, None] * P + tl.arange(0, BP)[None, :]
    b_dt = tl.load(dt + rows, mask=in_t, other=0.0).to(tl.float32)
    b_dg = tl.load(dg + rows, mask=in_t, other=0.0).to(tl.float32)
    b_dv = tl.load(dv + offsets, mask=mask, other=0.0).to(tl.float32)
    b_dy = tl.load(dy + offsets, mask=mask, other=0.0).to(tl.float32)
    b_x = _load_x(x, i_b, i_h, o_t, mask, stride_b, stride_t, stride_h, BP)
    a, d = tl.load(A + i_h).to(tl.float32), tl.load(D + i_h).to(tl.float32)
    tl.store(dx + offsets, (b_dv * b_dt[:, None] + b_dy * d).to(dx.dtype.element_ty), mask=mask)
    tl.store(ddt + rows, tl.sum(b_dv * b_x, axis=1) + b_dg * a, mask=in_t)
    tl.store(dA_partials + i_bh * NTB + i_t, tl.sum(b_dg * b_dt, axis=0))
    tl.store(dD_partials + i_bh * NTB + i_t, tl.sum(tl.sum(b_dy * b_x, axis=1), axis=0))


def _launch(kernel, x: torch.Tensor, *arguments, partials: bool = False):
    """Launch ``kernel`` over x's [B, T, H, P] tiles with ``arguments`` before T (and the partials' count)."""
    batch, length, heads, width = x.shape
    n_blocks = cdiv(length, TOKENS)
    count = (n_blocks,) if partials else ()
    kernel[(n_blocks, batch * heads)](
        *arguments, length, *count, x.stride(0), x.stride(1), x.stride(2),
        H=heads, P=width, BT=TOKENS, BP=max(16, next_power_of_2(width)),
    )


def _partials(x: torch.Tensor) -> torch.Tensor:
    batch, length, heads, _ = x.shape
    return new_output((batch, heads, cdiv(length, TOKENS)), torch.float32, x.device)


def map_forward(x, dt, A):
    """(v [B, T, H, P] in x's dtype, g [B, T, H] float32)."""
    v = new_output(x.shape, x.dtype, x.device)
    g = new_output(dt.shape, torch.float32, x.device)
    _launch(ssd_map_fwd_kernel, x, x, dt, A, v, g)
    return v, g


def map_backward(x, dt, A, dv, dg):
    """(dx in x's dtype, d dt float32, dA float32 [H])."""
    dx = new_output(x.shape, x.dtype, x.device)
    ddt = new_output(dt.shape, torch.float32, x.device)
    partials = _partials(x)
    _launch(ssd_map_bwd_kernel, x, x, dt, A, dv, dg, dx, ddt, partials, partials=True)
    return dx, ddt, partials.sum(dim=(0, 2))


def skip_forward(o, x, D):
    """``o + D x`` [B, T, H, P] in x's dtype."""
    y = new_output(x.shape, x.dtype, x.device)
    _launch(ssd_skip_fwd_kernel, x, o, x, D, y)
    return y


def skip_backward(x, D, dy):
    """(dx in x's dtype, dD float32 [H])."""
    dx = new_output(x.shape, x.dtype, x.device)
    partials = _partials(x)
    _launch(ssd_skip_bwd_kernel, x, x, D, dy, dx, partials, partials=True)
    return dx, partials.sum(dim=(0, 2))


def map_and_skip_backward(x, dt, A, D, dv, dg, dy):
    """:func:`map_backward` and :func:`skip_backward` in one launch, their two dx terms added before the one
    rounding: (dx in x's dtype, d dt float32, dA float32 [H], dD float32 [H])."""
    dx = new_output(x.shape, x.dtype, x.device)
    ddt = new_output(dt.shape, torch.float32, x.device)
    gate_partials, skip_partials = _partials(x), _partials(x)
    _launch(ssd_map_and_skip_bwd_kernel, x, x, dt, A, D, dv, dg, dy, dx, ddt, gate_partials, skip_partials,
            partials=True)
    return dx, ddt, gate_partials.sum(dim=(0, 2)), skip_partials.sum(dim=(0, 2))
