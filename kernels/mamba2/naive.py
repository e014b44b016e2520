"""Token-by-token Mamba-2 SSD recurrence (scalar decay per head), the reference.

    h_t = exp(dt_t A) h_{t-1} + dt_t B_t^T x_t,     y_t = C_t h_t + D x_t

per head, with ``h`` of shape ``[N, P]`` (state size by head dim) and B, C read from the head's group.
"""

from __future__ import annotations

import torch


def naive_recurrent_mamba2(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run the recurrence one token at a time in x's dtype (the tests pass float64).

    Args:
        x: [B, T, H, P]. dt: [B, T, H], the discretised time step (> 0). A: [H] (< 0).
        B, C: [B, T, G, N], head ``h`` reading group ``h // (H / G)``. D: [H] or None (no skip).
        initial_state: [B, H, N, P] or None (zeros).
    Returns:
        y: [B, T, H, P]; the final state [B, H, N, P] when output_final_state, else None.
    """
    batch, length, heads, head_dim = x.shape
    state_size = B.shape[-1]
    group_of_head = torch.arange(heads, device=x.device) // (heads // B.shape[2])
    B, C = B[:, :, group_of_head].to(x.dtype), C[:, :, group_of_head].to(x.dtype)
    dt, A = dt.to(x.dtype), A.to(x.dtype)
    state = x.new_zeros(batch, heads, state_size, head_dim)
    if initial_state is not None:
        state = state + initial_state.to(x.dtype)
    outputs = []
    for t in range(length):
        decay = torch.exp(dt[:, t] * A)[..., None, None]
        state = decay * state + dt[:, t, :, None, None] * B[:, t, :, :, None] * x[:, t, :, None, :]
        output = torch.einsum("bhn,bhnp->bhp", C[:, t], state)
        if D is not None:
            output = output + D.to(x.dtype)[:, None] * x[:, t]
        outputs.append(output)
    return torch.stack(outputs, dim=1), (state if output_final_state else None)
