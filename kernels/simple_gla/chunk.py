"""The public chunked simple-GLA operator: the shared glue of kernels/common/chunk_operator.py given its gate."""

from __future__ import annotations

import torch

from schedlang.kernels.common.function import Implementation
from schedlang.kernels.simple_gla.chunk_torch import SIMPLE_GLA


def implementation_for(backend: str, q: torch.Tensor) -> Implementation:
    """The Implementation ``backend`` ("auto", "triton" or "torch") picks for operands like ``q``."""
    return SIMPLE_GLA.implementation_for(backend, q)


def chunk_simple_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    backend: str = "auto",
    save_states: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked simple GLA (one scalar gate per head and token): S_t = exp(g_t) S_{t-1} + k_t^T v_t, o_t = scale * q_t S_t.

    Args:
        q, k: [B, T, H, K], or [B, T, G, K] shared by groups of heads, G dividing v's H: head ``h`` reads group
            ``h // (H / G)`` ([Note: grouped head order] in schedlang.kernels.common.heads). The Triton kernels
            read each group in place and sum its heads' dq and dk once; the PyTorch path repeats q and k per head.
        v: [B, T, H, V]. g: [B, T, H], log of the forget gate (<= 0).
        scale: defaults to K ** -0.5.
        initial_state: [B, H, K, V] (float32) or None for zeros.
        output_final_state: also return the state after the last token.
        backend: "auto" (Triton on CUDA or under TRITON_INTERPRET=1, else PyTorch), "triton" or "torch".
        save_states: keep the state entering every 64-token chunk from the forward for the backward, which
            then skips recomputing them (Triton path; the PyTorch path always recomputes). Costs
            B * H * ceil(T / 64) * K * V elements in the states' dtype (16 bits for 16-bit inputs) until the
            backward: as much as q in float32 when V = 128.
    Returns:
        o: [B, T, H, V] in v's dtype; final_state: [B, H, K, V] float32, or None.
    Gradients flow to q, k, v, g and initial_state, and from the final state.
    """
    grouped = q.dim() == v.dim() == 4 and q.shape[2] != v.shape[2]
    return SIMPLE_GLA(q, k, v, g, scale, initial_state, output_final_state, backend, save_states,
                      grouped_queries=grouped)

