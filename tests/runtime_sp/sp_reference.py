"""Test-only references: the naive token-by-token GLA recurrence and error measures."""

from __future__ import annotations

import torch


def naive_gla(q, k, v, g, scale, initial_state=None):
    """``S_t = exp(g_t) * S_{t-1} + k_t^T v_t``; ``o_t = (q_t * scale) S_t``.

    q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; g: ``[B, T, H, K]`` or ``[B, T, H]``.
    Returns ``(o [B, T, H, V], final state [B, H, K, V])``.
    """
    batch, length, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    state = q.new_zeros(batch, heads, key_dim, value_dim)
    if initial_state is not None:
        state = state + initial_state
    outputs = []
    for t in range(length):
        decay = g[:, t].exp()
        decay = decay[..., None] if g.dim() == 4 else decay[..., None, None]
        state = decay * state + k[:, t, :, :, None] * v[:, t, :, None, :]
        outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, state))
    return torch.stack(outputs, dim=1), state


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected||, compared absolutely below a norm of 1: a rank whose slice starts
    the span from a zero state has a reference dg of exactly zero at its one token, which the kernels reach
    only to rounding (every input is of order one)."""
    difference = (actual.double() - expected.double()).norm()
    return (difference / expected.double().norm().clamp_min(1.0)).item()
