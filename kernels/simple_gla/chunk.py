"""The public chunked simple-GLA operator and its pure-PyTorch implementation."""

from __future__ import annotations

import torch

from schedlang.kernels.common import Backend, check_recurrence_arguments, resolve_backend
from schedlang.kernels.common.function import ChunkRecurrenceFunction, Implementation, torch_implementation
from schedlang.kernels.simple_gla import chunk_torch

TORCH_IMPLEMENTATION = torch_implementation(
    chunk_torch.chunk_simple_gla_forward,
    chunk_torch.chunk_states,
    chunk_torch.chunk_state_gradients,
    chunk_torch.intra_chunk_gradients,
)


def _triton_implementation() -> Implementation:
    from schedlang.kernels.simple_gla.chunk_triton import TRITON_IMPLEMENTATION

    return TRITON_IMPLEMENTATION


def implementation_for(backend: str, q: torch.Tensor) -> Implementation:
    """The Implementation ``backend`` ("auto", "triton" or "torch") picks for operands like ``q``."""
    chosen = resolve_backend(backend, q.device, matmul_dtype=q.dtype)
    return TORCH_IMPLEMENTATION if chosen is Backend.TORCH else _triton_implementation()


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
        q, k: [B, T, H, K]. v: [B, T, H, V]. g: [B, T, H], log of the forget gate (<= 0).
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
    shape = check_recurrence_arguments(q, k, v, g, initial_state, gate_per_key=False)
    implementation = implementation_for(backend, q)
    if scale is None:
        scale = shape.key_dim**-0.5
    output, final_state = ChunkRecurrenceFunction.apply(
        q, k, v, g, initial_state, float(scale), implementation, bool(save_states)
    )
    return output, (final_state if output_final_state else None)
