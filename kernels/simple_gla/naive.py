"""Token-by-token simple-GLA recurrence (one scalar gate per head and token), the reference.

    S_t = exp(g_t) S_{t-1} + k_t^T v_t,     o_t = scale * q_t S_t
"""

from __future__ import annotations

import torch


def naive_recurrent_simple_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run the recurrence one token at a time in the inputs' dtype.

    Args:
        q, k: [B, T, H, K]; v: [B, T, H, V]; g: [B, T, H] log-gate (<= 0).
        initial_state: [B, H, K, V] or None (zeros).
    Returns:
        o: [B, T, H, V]; final state [B, H, K, V] when output_final_state, else None.
    """
    batch, length, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    if scale is None:
        scale = key_dim**-0.5
    state = q.new_zeros(batch, heads, key_dim, value_dim)
    if initial_state is not None:
        state = state + initial_state.to(q.dtype)
    outputs = []
    for t in range(length):
        state = state * g[:, t].exp()[..., None, None] + k[:, t, :, :, None] * v[:, t, :, None, :]
        outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, state))
    output = torch.stack(outputs, dim=1)
    return output, (state if output_final_state else None)
