"""Token-by-token gated delta rule (Gated DeltaNet), the reference.

    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,     o_t = scale * q_t S_t

(state [K, V]; q_t, k_t rows of length K; g_t <= 0 and beta_t one scalar each per head and token).
"""

from __future__ import annotations

import torch


def naive_recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run the recurrence one token at a time in the inputs' dtype.

    Args:
        q, k: [B, T, H, K]; v: [B, T, H, V]; g: [B, T, H] log-gate (<= 0); beta: [B, T, H] write strength.
        initial_state: [B, H, K, V] or None (zeros).
    Returns:
        o: [B, T, H, V]; final state [B, H, K, V] when output_final_state, else None.
    """
    batch, length, heads, key_dim = q.shape
    if scale is None:
        scale = key_dim**-0.5
    state = q.new_zeros(batch, heads, key_dim, v.shape[-1])
    if initial_state is not None:
        state = state + initial_state.to(q.dtype)
    outputs = []
    for t in range(length):
        state = state * g[:, t].exp()[..., None, None]
        key = k[:, t]
        prediction = torch.einsum("bhk,bhkv->bhv", key, state)
        correction = beta[:, t, :, None] * (v[:, t] - prediction)
        state = state + key[..., :, None] * correction[..., None, :]
        outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, state))
    return torch.stack(outputs, dim=1), (state if output_final_state else None)
