"""The SSD's pointwise ends as autograd Functions: the operand map ``(x, dt, A) -> (v = dt x, g = dt A)`` and
the skip ``(o, x, D) -> o + D x``.

Each runs one Triton launch each way on CUDA (and under TRITON_INTERPRET=1; kernels/mamba2/pointwise_triton.py)
and the same formulas in PyTorch elsewhere and for float64. Values are formed in float32 (float64 for float64
inputs) and rounded once to x's dtype; ``g`` and every gradient of ``dt``, ``A`` and ``D`` are computed in that
precision and returned in their input's dtype. Each Function saves only its inputs (x, not a float32 copy).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from schedlang.kernels.common.arguments import compute_dtype_for, runs_float32_kernels


def _torch_map_forward(x, dt, A):
    compute = compute_dtype_for(x.dtype)
    step = dt.to(compute)
    return (x.to(compute) * step[..., None]).to(x.dtype), step * A.to(compute)


def _torch_map_backward(x, dt, A, dv, dg):
    compute = compute_dtype_for(x.dtype)
    step, dv = dt.to(compute), dv.to(compute)
    dx = (dv * step[..., None]).to(x.dtype)
    ddt = (dv * x.to(compute)).sum(dim=-1) + dg.to(compute) * A.to(compute)
    return dx, ddt, (dg.to(compute) * step).sum(dim=(0, 1))


def _torch_skip_forward(o, x, D):
    compute = compute_dtype_for(x.dtype)
    return (o.to(compute) + D.to(compute)[:, None] * x.to(compute)).to(x.dtype)


def _torch_skip_backward(x, D, dy):
    compute = compute_dtype_for(x.dtype)
    dy = dy.to(compute)
    return (dy * D.to(compute)[:, None]).to(x.dtype), (dy * x.to(compute)).sum(dim=(0, 1, 3))


def _torch_map_and_skip_backward(x, dt, A, D, dv, dg, dy):
    compute = compute_dtype_for(x.dtype)
    step, dv, dy, x_wide = dt.to(compute), dv.to(compute), dy.to(compute), x.to(compute)
    dx = (dv * step[..., None] + dy * D.to(compute)[:, None]).to(x.dtype)
    ddt = (dv * x_wide).sum(dim=-1) + dg.to(compute) * A.to(compute)
    return dx, ddt, (dg.to(compute) * step).sum(dim=(0, 1)), (dy * x_wide).sum(dim=(0, 1, 3))


TORCH = SimpleNamespace(map_forward=_torch_map_forward, map_backward=_torch_map_backward,
                        skip_forward=_torch_skip_forward, skip_backward=_torch_skip_backward,
                        map_and_skip_backward=_torch_map_and_skip_backward)


def pointwise_implementation(backend: str, x: torch.Tensor):
    """The pointwise kernels ``backend`` picks for ``x``: Triton's module, or :data:`TORCH` (also for float64),
    each with ``map_forward``, ``map_backward``, ``skip_forward``, ``skip_backward`` and ``map_and_skip_backward``
    (both ends' backward in one pass)."""
    if not runs_float32_kernels(backend, x):
        return TORCH
    from schedlang.kernels.mamba2 import pointwise_triton

    return pointwise_triton


def unit_last_stride(x: torch.Tensor) -> torch.Tensor:
    """``x``, copied only where its last stride is not 1 (the kernels read x through its other strides)."""
    return x if x.stride(-1) == 1 else x.contiguous()


class SsdMapFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dt, A, implementation):
        x, dt, A = unit_last_stride(x), dt.contiguous(), A.contiguous()
        ctx.save_for_backward(x, dt, A)
        ctx.implementation = implementation
        return implementation.map_forward(x, dt, A)

    @staticmethod
    def backward(ctx, dv, dg):
        x, dt, A = ctx.saved_tensors
        dv = torch.zeros_like(x) if dv is None else dv.contiguous()
        dg = torch.zeros(dt.shape, dtype=torch.float32, device=dt.device) if dg is None else dg.contiguous()
        dx, ddt, dA = ctx.implementation.map_backward(x, dt, A, dv, dg)
        return dx, ddt.to(dt.dtype), dA.to(A.dtype), None


class SsdSkipFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, o, x, D, implementation):
        x, D = unit_last_stride(x), D.contiguous()
        ctx.save_for_backward(x, D)
        ctx.implementation = implementation
        ctx.output_dtype = o.dtype
        return implementation.skip_forward(o.contiguous(), x, D)

    @staticmethod
    def backward(ctx, dy):
        x, D = ctx.saved_tensors
        dx, dD = ctx.implementation.skip_backward(x, D, dy.contiguous())
        return dy.to(ctx.output_dtype), dx, dD.to(D.dtype), None


def ssd_values_and_gates(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                         backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """``v = dt x`` [B, T, H, P] in x's dtype and ``g = dt A`` [B, T, H] in float32 (float64 for float64 x),
    from x [B, T, H, P] (any strides with a unit last one), dt [B, T, H] and A [H]. Differentiable in all three."""
    return SsdMapFunction.apply(x, dt, A, pointwise_implementation(backend, x))


def ssd_skip(o: torch.Tensor, x: torch.Tensor, D: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """``o + D x`` [B, T, H, P] in x's dtype, from o and x [B, T, H, P] and D [H]. Differentiable in all three."""
    return SsdSkipFunction.apply(o, x, D, pointwise_implementation(backend, x))
