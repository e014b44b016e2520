"""The public chunked gated-delta-rule operator (Gated DeltaNet)."""

from __future__ import annotations

import torch

from schedlang.kernels.common import Backend, check_recurrence_arguments, resolve_backend
from schedlang.kernels.common.heads import repeat_each_head
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
    save_states: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked gated delta rule: S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, o_t = scale q_t S_t.

    Args:
        q, k: [B, T, H_q, K] (k is expected L2-normalised per head, as Gated DeltaNet does). v: [B, T, H, V],
            ``H`` a multiple of ``H_q``: with ``H_q < H`` (grouped value heads, fla's ``num_v_heads``) head ``j``
            reads q/k head ``j // (H / H_q)`` ([Note: grouped head order] in schedlang.kernels.common.heads);
            the Triton path keeps q and k that narrow for the backward and repeats them only while it runs.
        g: [B, T, H] log of the forget gate (<= 0). beta: [B, T, H] write strength (in (0, 1) usually).
        scale: defaults to K ** -0.5. initial_state: [B, H, K, V] (float32) or None for zeros.
        output_final_state: also return the state after the last token.
        backend: "auto" (Triton on CUDA tensors, or under TRITON_INTERPRET=1 for inputs other than bfloat16),
            "triton" or "torch". Triton runs every step as Triton kernels with one autograd Function
            (kernels/gdn/chunk_triton.py); "torch" is batched PyTorch around a Python state pass, differentiated
            by autograd. float64 inputs always take the PyTorch path.
        save_states: keep the state entering every 64-token chunk, and its corrections, from the forward for
            the backward, which then skips one state pass (Triton path; the PyTorch path keeps what autograd
            keeps). Costs B * H * ceil(T / 64) * (K + 64) * V float32 elements until the backward.
    Returns:
        o: [B, T, H, V] in v's dtype; final_state: [B, H, K, V] float32, or None.
    Gradients flow to q, k, v, g, beta and initial_state, and from the final state (through autograd).
    """
    shape = check_recurrence_arguments(q, k, v, g, initial_state, gate_per_key=False, grouped_queries=True)
    chosen = resolve_backend(backend, q.device, matmul_dtype=q.dtype)
    if not isinstance(beta, torch.Tensor) or tuple(beta.shape) != tuple(g.shape) or not beta.is_floating_point():
        found = tuple(beta.shape) if isinstance(beta, torch.Tensor) else type(beta).__name__
        raise ValueError(f"beta must be a floating-point tensor of g's shape [B, T, H] = {list(g.shape)}, got {found}")
    if scale is None:
        scale = shape.key_dim**-0.5
    if chosen is Backend.TRITON and q.dtype != torch.float64:
        from schedlang.kernels.gdn.chunk_triton import triton_chunk_gated_delta_rule

        output, final_state = triton_chunk_gated_delta_rule(
            q, k, v, g, beta, float(scale), initial_state, bool(save_states)
        )
    else:
        q, k = repeat_each_head(q, shape.heads), repeat_each_head(k, shape.heads)
        output, final_state = chunk_gated_delta_rule_forward(q, k, v, g, beta, float(scale), initial_state)
    return output, (final_state if output_final_state else None)
