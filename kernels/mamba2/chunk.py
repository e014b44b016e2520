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
from schedlang.kernels.common.heads import repeat_each_head
from schedlang.kernels.mamba2.pointwise import ssd_skip, ssd_values_and_gates
from schedlang.kernels.simple_gla import chunk_simple_gla


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
    operands = ssd_operands(x, dt, A, B, C, backend, grouped=True)
    output, final_state = chunk_simple_gla(
        operands.q, operands.k, operands.v, operands.g, scale=1.0, initial_state=initial_state,
        output_final_state=output_final_state, backend=backend,
    )
    if D is not None:
        output = ssd_skip(output, x, D, backend)
    return output.to(x.dtype), final_state
