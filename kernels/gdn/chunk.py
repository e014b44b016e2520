"""The public chunked gated-delta-rule operator (Gated DeltaNet)."""

from __future__ import annotations

import torch

from schedlang.kernels.common import Backend, check_recurrence_arguments, compute_dtype_for, resolve_backend
from schedlang.kernels.gdn.chunk_torch import chunk_gated_delta_rule_forward


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked gated delta rule: S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, o_t = scale q_t S_t.

    Args:
        q, k: [B, T, H, K] (k is expected L2-normalised per head, as Gated DeltaNet does). v: [B, T, H, V].
        g: [B, T, H] log of the forget gate (<= 0). beta: [B, T, H] write strength (in (0, 1) usually).
        scale: defaults to K ** -0.5. initial_state: [B, H, K, V] (float32) or None for zeros.
        output_final_state: also return the state after the last token.
        backend: "auto" (Triton on CUDA tensors, or under TRITON_INTERPRET=1), "triton" or "torch". Only the
            chunk-after-chunk state pass has Triton kernels (kernels/gdn/state_pass_triton.py); the rest is
            batched PyTorch on either backend. float64 inputs always take the PyTorch state pass.
    Returns:
        o: [B, T, H, V] in v's dtype; final_state: [B, H, K, V] float32, or None.
    Gradients flow to q, k, v, g, beta and initial_state, and from the final state (through autograd).
    """
    shape = check_recurrence_arguments(q, k, v, g, initial_state, gate_per_key=False)
    chosen = resolve_backend(backend, q.device)
    if not isinstance(beta, torch.Tensor) or tuple(beta.shape) != tuple(g.shape) or not beta.is_floating_point():
        found = tuple(beta.shape) if isinstance(beta, torch.Tensor) else type(beta).__name__
        raise ValueError(f"beta must be a floating-point tensor of g's shape [B, T, H] = {list(g.shape)}, got {found}")
    if scale is None:
        scale = shape.key_dim**-0.5
    use_triton = chosen is Backend.TRITON and compute_dtype_for(q.dtype) == torch.float32
    output, final_state = chunk_gated_delta_rule_forward(
        q, k, v, g, beta, float(scale), initial_state, use_triton=use_triton
    )
    return output, (final_state if output_final_state else None)
