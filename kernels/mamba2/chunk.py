"""The chunked Mamba-2 SSD operator: simple GLA's chunk kernels on the SSD's operands.

The SSD recurrence ``h_t = exp(dt_t A) h_{t-1} + dt_t B_t^T x_t``, ``y_t = C_t h_t + D x_t`` is simple GLA's
``S_t = exp(g_t) S_{t-1} + k_t^T v_t``, ``o_t = scale q_t S_t`` with ``q = C``, ``k = B`` (each group shared by
its consecutive heads, which simple GLA's kernels read by group), ``v = dt x``, ``g = dt A`` and
``scale = 1`` (kernels/mamba2/README.md). The state is simple GLA's ``[B, H, K, V]`` = ``[B, H, N, P]``, so
chunks and sequence ranks hand it on as they hand on a simple-GLA state, through the same scans.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from schedlang.kernels.common import check_floating_tensor
from schedlang.kernels.common.arguments import check_recurrence_arguments
from schedlang.kernels.common.heads import repeat_each_head, sum_each_head_group
from schedlang.kernels.mamba2.pointwise import pointwise_implementation, ssd_values_and_gates, unit_last_stride
from schedlang.kernels.simple_gla import chunk_simple_gla
from schedlang.kernels.simple_gla.chunk_torch import SIMPLE_GLA


@dataclass(frozen=True)
class SsdOperands:
    """Simple GLA's operands for an SSD: ``q`` and ``k`` ``[B, T, H, N]`` (``[B, T, G, N]`` when grouped), ``v``
    ``[B, T, H, P]``, the log decay ``g`` ``[B, T, H]`` in float32 (float64 for float64 inputs); ``scale`` is 1."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor


def _check_ssd_arguments(x, dt, A, B, C, D) -> None:
    for name, tensor in (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C)):
        check_floating_tensor(name, tensor)
    if x.dim() != 4:
        raise ValueError(f"x must have shape [B, T, H, P], got {tuple(x.shape)}")
    batch, length, heads, _ = x.shape
    if tuple(dt.shape) != (batch, length, heads):
        raise ValueError(f"dt must have shape [B, T, H] = {[batch, length, heads]}, got {tuple(dt.shape)}")
    if tuple(A.shape) != (heads,):
        raise ValueError(f"A must have shape [H] = [{heads}], got {tuple(A.shape)}")
    if B.dim() != 4 or B.shape[:2] != (batch, length) or B.shape[2] == 0 or heads % B.shape[2]:
        raise ValueError(f"B must have shape [B, T, G, N] = [{batch}, {length}, G, N], G dividing {heads} heads, "
                         f"got {tuple(B.shape)}")
    if C.shape != B.shape:
        raise ValueError(f"C must have B's shape {tuple(B.shape)}, got {tuple(C.shape)}")
    if D is not None and tuple(D.shape) != (heads,):
        raise ValueError(f"D must have shape [H] = [{heads}], got {tuple(D.shape)}")


def ssd_operands(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                 backend: str = "auto", grouped: bool = False) -> SsdOperands:
    """The SSD as simple GLA's operands (shapes as :func:`chunk_mamba2`'s). ``v = dt x`` and ``g = dt A`` come
    from one fused launch each way (:func:`ssd_values_and_gates`); q and k are C and B in x's dtype: by group
    with ``grouped``, else each group repeated for its heads (what the sequence-parallel scans take).
    Differentiable: gradients reach x, dt, A, B and C."""
    heads = x.shape[2]
    v, g = ssd_values_and_gates(x, dt, A, backend)
    q, k = C.to(x.dtype), B.to(x.dtype)
    if not grouped:
        q, k = repeat_each_head(q, heads), repeat_each_head(k, heads)
    return SsdOperands(q=q, k=k, v=v, g=g)


class SsdFunction(torch.autograd.Function):
    """The whole SSD with its ``D`` skip as one autograd node: the operand map, simple GLA's chunk phases
    (``chunk`` an Implementation of kernels/common/function.py) and the skip forward (in the chunk output
    kernel's epilogue where the implementation ``takes_ssd_ends``, so y is rounded once); backward, the chunk
    phases from ``dy`` (the skip passes it on unchanged) with ``dx = dt dv + D dy`` (rounded once), d dt, dA and
    dD formed in the backward kernels where the implementation takes the ends, else both pointwise ends in one
    pass after it (``map_and_skip_backward``). B and C arrive in x's dtype (the caller's
    cast is autograd's); saves x, dt, A, D, B, C, v and g."""

    @staticmethod
    def forward(ctx, x, dt, A, B, C, D, initial_state, chunk, pointwise):
        x, dt, A, D = unit_last_stride(x), dt.contiguous(), A.contiguous(), D.contiguous()
        heads = x.shape[2]
        v, g = pointwise.map_forward(x, dt, A)
        q, k = C, B
        if not SIMPLE_GLA.reads_groups(chunk):
            q, k = repeat_each_head(q, heads), repeat_each_head(k, heads)
        if chunk.takes_ssd_ends:  # the skip in the chunk kernels' output epilogue: y rounded once
            output, final_state, _ = chunk.forward(q, k, v, g, 1.0, initial_state, skip=(x, D))
        else:
            output, final_state, _ = chunk.forward(q, k, v, g, 1.0, initial_state)
            output = pointwise.skip_forward(output.contiguous(), x, D)
        ctx.save_for_backward(x, dt, A, D, q, k, v, g, initial_state)
        ctx.chunk, ctx.pointwise, ctx.groups = chunk, pointwise, B.shape[2]
        ctx.dtypes = (dt.dtype, A.dtype, D.dtype)
        return output, final_state

    @staticmethod
    def backward(ctx, output_grad, final_state_grad):
        x, dt, A, D, q, k, v, g, initial_state = ctx.saved_tensors
        output_grad = torch.zeros_like(x) if output_grad is None else output_grad.contiguous()
        if ctx.chunk.takes_ssd_ends:  # every end's gradient formed in the backward kernels
            dq, dk, ends, _, d_initial = ctx.chunk.backward(
                q, k, v, g, 1.0, initial_state, output_grad, final_state_grad, ssd_ends=(x, dt, A, D)
            )
            dx, ddt, dA, dD = ends.dx, ends.ddt, ends.dA, ends.dD
        else:
            dq, dk, dv, dg, d_initial = ctx.chunk.backward(
                q, k, v, g, 1.0, initial_state, output_grad, final_state_grad
            )
            dx, ddt, dA, dD = ctx.pointwise.map_and_skip_backward(
                x, dt, A, D, dv.contiguous(), dg.contiguous(), output_grad
            )
        heads_per_group = x.shape[2] // ctx.groups
        if dq.shape[2] != ctx.groups:  # repeated per head on the PyTorch path
            dq, dk = sum_each_head_group(dq, heads_per_group), sum_each_head_group(dk, heads_per_group)
        dt_dtype, A_dtype, D_dtype = ctx.dtypes
        d_initial = None if initial_state is None else d_initial.to(initial_state.dtype)
        return (dx, ddt.to(dt_dtype), dA.to(A_dtype), dk, dq, dD.to(D_dtype), d_initial,
                None, None)


def chunk_mamba2(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked Mamba-2 SSD: ``h_t = exp(dt_t A) h_{t-1} + dt_t B_t^T x_t``, ``y_t = C_t h_t + D x_t``.

    Args:
        x: [B, T, H, P]. dt: [B, T, H], the time step after softplus and clamping (> 0). A: [H] (< 0).
        B, C: [B, T, G, N], G dividing H; head ``h`` reads group ``h // (H / G)`` (mamba_ssm's order,
            [Note: grouped head order] in schedlang.kernels.common.heads). D: [H] or None (no skip).
        initial_state: [B, H, N, P] (float32; float64 for float64 inputs) or None for zeros.
        output_final_state: also return the state after the last token.
        backend: "auto", "triton" or "torch", as for :func:`schedlang.kernels.chunk_simple_gla`. The Triton
            kernels read B and C by group; the PyTorch path repeats them per head.
    Returns:
        y: [B, T, H, P] in x's dtype; final_state: [B, H, N, P] float32 (float64 for float64 inputs), or None.
    Gradients flow to x, dt, A, B, C, D and initial_state, and from the final state.
    """
    _check_ssd_arguments(x, dt, A, B, C, D)
    if D is not None:
        q, k = C.to(x.dtype), B.to(x.dtype)
        check_recurrence_arguments(q, k, x, dt, initial_state, gate_per_key=False, grouped_queries=True)
        output, final_state = SsdFunction.apply(
            x, dt, A, k, q, D, initial_state, SIMPLE_GLA.implementation_for(backend, q),
            pointwise_implementation(backend, x),
        )
        return output, (final_state if output_final_state else None)
    operands = ssd_operands(x, dt, A, B, C, backend, grouped=True)
    output, final_state = chunk_simple_gla(
        operands.q, operands.k, operands.v, operands.g, scale=1.0, initial_state=initial_state,
        output_final_state=output_final_state, backend=backend,
    )
    return output.to(x.dtype), final_state
