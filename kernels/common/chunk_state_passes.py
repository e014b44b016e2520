"""Pure-PyTorch chunk-state passes shared by GLA and simple GLA: the pieces ZeCO and StateFlow schedule.

Every function takes the operator's GateLayout first, then the user layout (q, k: [B, T, H, K],
v: [B, T, H, V], g: [B, T, H, K] for a per-key gate or [B, T, H] for a scalar one), and works in float32
(float64 when the inputs are float64), vectorised over chunks; only the state scans loop, once per chunk.
In the chunked layout the token axis is axis 3 for both gate shapes: gc is [B, H, N, C, K] or [B, H, N, C].
States are [B, H, N + 1, K, V]: entry n is the state entering chunk n, entry N the state after the last
token; log decays are the gate's shape without the token axis: [B, H, N + 1, K] or [B, H, N + 1].
schedlang.kernels.gla and schedlang.kernels.simple_gla expose these under their own signatures;
kernels/gla/README.md gives the derivations.
"""

from __future__ import annotations

import torch

from schedlang.kernels.common.arguments import compute_dtype_for
from schedlang.kernels.common.chunking import ChunkStates, from_chunks, to_chunks
from schedlang.kernels.common.gate_layout import GateLayout

TOKEN_AXIS = 3


def cumulative_gate(g: torch.Tensor, chunk_size: int, dtype: torch.dtype) -> torch.Tensor:
    """gc: the log-gate summed from each chunk's start, inclusive ([B, H, N, C, K] or [B, H, N, C])."""
    return to_chunks(g, chunk_size, dtype).cumsum(TOKEN_AXIS)


def decay_to_chunk_end(layout: GateLayout, gc: torch.Tensor) -> torch.Tensor:
    """exp(gc_last - gc_i), the decay from each token to its chunk's end, broadcastable against keys."""
    return layout.over_keys((gc[:, :, :, -1:] - gc).exp())


def _scan_states(
    layout: GateLayout, chunk_updates: torch.Tensor, chunk_log_decay: torch.Tensor, initial: torch.Tensor
) -> torch.Tensor:
    """S_{n+1} = exp(gamma_n) * S_n + U_n over the chunk axis: [B, H, N + 1, K, V]."""
    states = [initial]
    for index in range(chunk_updates.shape[2]):
        decay = layout.over_keys(chunk_log_decay[:, :, index])[..., None].exp()
        states.append(decay * states[-1] + chunk_updates[:, :, index])
    return torch.stack(states, dim=2)


def _prefix_log_decay(chunk_log_decay: torch.Tensor) -> torch.Tensor:
    """[0, gamma_0, gamma_0 + gamma_1, ...] along the chunk axis: one entry more than chunk_log_decay."""
    return torch.cat([torch.zeros_like(chunk_log_decay[:, :, :1]), chunk_log_decay.cumsum(2)], dim=2)


def _zero_state(updates: torch.Tensor) -> torch.Tensor:
    batch, heads, _, key_dim, value_dim = updates.shape
    return updates.new_zeros(batch, heads, key_dim, value_dim)


def local_chunk_states(
    layout: GateLayout, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, chunk_size: int
) -> ChunkStates:
    """ZeCO Algorithm 1, phase 1: chunk states from a zero initial state, and the cumulative log decay.

    Returns ChunkStates(states with states[:, :, 0] = 0, log_decay with log_decay[:, :, n] = sum of g
    over chunks 0..n-1, i.e. log of ZeCO's gamma_tilde).
    """
    dtype = compute_dtype_for(k.dtype)
    gc = cumulative_gate(g, chunk_size, dtype)
    keys = to_chunks(k, chunk_size, dtype) * decay_to_chunk_end(layout, gc)
    updates = keys.transpose(-1, -2) @ to_chunks(v, chunk_size, dtype)
    chunk_log_decay = gc[:, :, :, -1]
    states = _scan_states(layout, updates, chunk_log_decay, _zero_state(updates))
    return ChunkStates(states, _prefix_log_decay(chunk_log_decay))


def update_state_rows(
    layout: GateLayout,
    incoming_state: torch.Tensor,
    local_state: torch.Tensor,
    log_decay: torch.Tensor,
    row_start: int = 0,
    row_end: int | None = None,
) -> torch.Tensor:
    """The All-Scan step on rows [row_start, row_end) of the key dimension: exp(log_decay) * S_in + S_local.

    incoming_state: [B, H, K, V]; local_state: [B, H, K, V] or [B, H, M, K, V] (then every boundary is
    updated); log_decay: local_state's shape without V (per-key gate) or without K and V (scalar gate).
    Returns the updated rows, float32/64.
    """
    rows = slice(row_start, row_end)
    if local_state.dim() == 5:
        incoming_state = incoming_state[:, :, None]
    incoming_rows = incoming_state[..., rows, :].to(local_state.dtype)
    row_log_decay = log_decay[..., rows] if layout.gate_per_key else log_decay[..., None]
    return row_log_decay[..., None].exp() * incoming_rows + local_state[..., rows, :]


def chunk_states(
    layout: GateLayout,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    initial_state: torch.Tensor | None,
    chunk_size: int,
) -> torch.Tensor:
    """States entering every chunk and the final state, from initial_state (zeros if None): [B, H, N + 1, K, V]."""
    local = local_chunk_states(layout, k, v, g, chunk_size)
    if initial_state is None:
        return local.states
    return update_state_rows(layout, initial_state, local.states, local.log_decay)


def gated_queries(layout: GateLayout, q: torch.Tensor, gc: torch.Tensor, scale: float, chunk_size: int) -> torch.Tensor:
    """scale * q_i * exp(gc_i) in the chunked layout, gc's dtype: the queries that read the entering state."""
    return to_chunks(q, chunk_size, gc.dtype) * scale * layout.over_keys(gc.exp())


def output_from_states(
    layout: GateLayout, q: torch.Tensor, g: torch.Tensor, states: torch.Tensor, scale: float, chunk_size: int
) -> torch.Tensor:
    """The part of the output read from the state entering each chunk (states[:, :, :N]): [B, T, H, V]."""
    gc = cumulative_gate(g, chunk_size, states.dtype)
    queries = gated_queries(layout, q, gc, scale, chunk_size)
    return from_chunks(queries @ states[:, :, : gc.shape[2]], q.shape[1])


def local_chunk_state_gradients(
    layout: GateLayout, q: torch.Tensor, g: torch.Tensor, do: torch.Tensor, scale: float, chunk_size: int
) -> ChunkStates:
    """Backward state pass from a zero final-state gradient (the backward All-Scan's local phase).

    Returns ChunkStates(states = dS, the gradient of the loss with respect to the state entering each
    chunk with dS[:, :, N] = 0, and log_decay with entry n the sum of g from chunk n to the end). The
    global gradients are update_state_rows(dS_final, dS, log_decay).
    """
    dtype = compute_dtype_for(q.dtype)
    gc = cumulative_gate(g, chunk_size, dtype)
    updates = gated_queries(layout, q, gc, scale, chunk_size).transpose(-1, -2) @ to_chunks(do, chunk_size, dtype)
    chunk_log_decay = gc[:, :, :, -1]
    reversed_states = _scan_states(layout, updates.flip(2), chunk_log_decay.flip(2), _zero_state(updates))
    return ChunkStates(reversed_states.flip(2), _prefix_log_decay(chunk_log_decay.flip(2)).flip(2))


def chunk_state_gradients(
    layout: GateLayout,
    q: torch.Tensor,
    g: torch.Tensor,
    do: torch.Tensor,
    scale: float,
    final_state_grad: torch.Tensor | None,
    chunk_size: int,
) -> torch.Tensor:
    """Gradient with respect to the state at every chunk boundary: [B, H, N + 1, K, V]; entry 0 is d initial_state."""
    local = local_chunk_state_gradients(layout, q, g, do, scale, chunk_size)
    if final_state_grad is None:
        return local.states
    return update_state_rows(layout, final_state_grad, local.states, local.log_decay)
