"""Token-by-token Mamba-3 SISO recurrence (exponential-trapezoidal update, data-dependent rotary angles), the
reference.

Per head, with ``alpha_t = exp(adt_t)``, the rotated key ``k_t = R(theta_t) B_t`` and query ``q_t = R(theta_t)
C_t`` (``theta_t = theta_{t-1} + dt_t angles_t``, each angle turning one pair ``(2i, 2i + 1)`` of the state rows,
the rows past ``2 A`` unturned):

    h_t = alpha_t h_{t-1} + (1 - trap_t) dt_t alpha_t k_{t-1}^T x_{t-1} + trap_t dt_t k_t^T x_t
    y_t = q_t h_t + D x_t

``h`` is ``[N, P]`` (state rows by head dim). The state carried between calls is the angle, ``h``, and the last
token's rotated key and input (the term the next token's update reads).
"""

from __future__ import annotations

import torch

from schedlang.kernels.mamba3.chunk import Mamba3State, rotate_pairs, wrap_angle


def naive_recurrent_mamba3(
    x: torch.Tensor,
    dt: torch.Tensor,
    adt: torch.Tensor,
    trap: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    angles: torch.Tensor,
    D: torch.Tensor | None = None,
    initial_state: Mamba3State | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, Mamba3State | None]:
    """Run the recurrence one token at a time in x's dtype (the tests pass float64). Arguments and results as
    :func:`schedlang.kernels.mamba3.chunk_mamba3`'s."""
    batch, length, heads, head_dim = x.shape
    state_size, angle_count = B.shape[-1], angles.shape[-1]
    dtype = x.dtype
    B, C, dt, adt, trap, angles = (t.to(dtype) for t in (B, C, dt, adt, trap, angles))
    if initial_state is None:
        angle = x.new_zeros(batch, heads, angle_count)
        state = x.new_zeros(batch, heads, state_size, head_dim)
        key = x.new_zeros(batch, heads, state_size)
        value = x.new_zeros(batch, heads, head_dim)
    else:
        angle, state, key, value = (t.to(dtype) for t in initial_state.parts())
    outputs = []
    for t in range(length):
        angle = wrap_angle(angle + dt[:, t, :, None] * angles[:, t])
        q = rotate_pairs(C[:, t], angle)
        k = rotate_pairs(B[:, t], angle)
        alpha = torch.exp(adt[:, t])[..., None, None]
        previous = ((1 - trap[:, t]) * dt[:, t])[..., None, None] * key[..., :, None] * value[..., None, :]
        current = (trap[:, t] * dt[:, t])[..., None, None] * k[..., :, None] * x[:, t, :, None, :]
        state = alpha * (state + previous) + current
        output = torch.einsum("bhn,bhnp->bhp", q, state)
        if D is not None:
            output = output + D.to(dtype)[:, None] * x[:, t]
        outputs.append(output)
        key, value = k, x[:, t]
    final = Mamba3State(angle, state, key, value) if output_final_state else None
    return torch.stack(outputs, dim=1), final
