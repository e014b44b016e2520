"""Pure-PyTorch chunked GLA: the CPU path of the runtime, and the pieces ZeCO and StateFlow schedule.

All functions take the user layout (q, k: [B, T, H, K], v: [B, T, H, V], g: [B, T, H, K] log-gate) and
work in float32 (float64 when the inputs are float64), vectorised over chunks; only the state pass loops,
once per chunk. States are laid out [B, H, N + 1, K, V]: entry n is the state entering chunk n, entry N the
state after the last token. kernels/gla/README.md gives the derivations.
"""

from __future__ import annotations

import torch

from schedlang.kernels.common import CHUNK_SIZE, ChunkStates, from_chunks, state_dtype_for, to_chunks
from schedlang.kernels.gla.gated_products import gated_causal_columns, gated_causal_rows, gated_causal_scores


def _prepared(g: torch.Tensor, chunk_size: int, dtype: torch.dtype) -> torch.Tensor:
    return to_chunks(g, chunk_size, dtype).cumsum(-2)


def _scan_states(chunk_updates: torch.Tensor, chunk_log_decay: torch.Tensor, initial: torch.Tensor) -> torch.Tensor:
    """S_{n+1} = exp(gamma_n) * S_n + U_n over the chunk axis: [B, H, N + 1, K, V]."""
    states = [initial]
    for index in range(chunk_updates.shape[2]):
        states.append(chunk_log_decay[:, :, index, :, None].exp() * states[-1] + chunk_updates[:, :, index])
    return torch.stack(states, dim=2)


def local_chunk_states(k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, chunk_size: int = CHUNK_SIZE) -> ChunkStates:
    """ZeCO Algorithm 1, phase 1: chunk states from a zero initial state, and the cumulative log decay.

    Returns ChunkStates(states [B, H, N + 1, K, V] with states[:, :, 0] = 0, log_decay [B, H, N + 1, K]
    with log_decay[:, :, n] = sum of g over chunks 0..n-1, i.e. log of ZeCO's gamma_tilde).
    """
    dtype = state_dtype_for(k.dtype)
    gc = _prepared(g, chunk_size, dtype)
    keys = to_chunks(k, chunk_size, dtype)
    values = to_chunks(v, chunk_size, dtype)
    chunk_log_decay = gc[..., -1, :]
    updates = (keys * (chunk_log_decay[..., None, :] - gc).exp()).transpose(-1, -2) @ values
    batch, heads, _, key_dim, value_dim = updates.shape
    zero = updates.new_zeros(batch, heads, key_dim, value_dim)
    states = _scan_states(updates, chunk_log_decay, zero)
    log_decay = torch.cat([chunk_log_decay.new_zeros(batch, heads, 1, key_dim), chunk_log_decay.cumsum(2)], dim=2)
    return ChunkStates(states, log_decay)


def update_state_rows(
    incoming_state: torch.Tensor,
    local_state: torch.Tensor,
    log_decay: torch.Tensor,
    row_start: int = 0,
    row_end: int | None = None,
) -> torch.Tensor:
    """The All-Scan step on rows [row_start, row_end) of the key dimension: exp(log_decay) * S_in + S_local.

    incoming_state: [B, H, K, V]; local_state: [B, H, K, V] or [B, H, M, K, V] (then every boundary is
    updated); log_decay: local_state's shape without V. Returns the updated rows, float32/64.
    """
    rows = slice(row_start, row_end)
    if local_state.dim() == 5:
        incoming_state = incoming_state[:, :, None]
    incoming_rows = incoming_state[..., rows, :].to(local_state.dtype)
    return log_decay[..., rows, None].exp() * incoming_rows + local_state[..., rows, :]


def chunk_states(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = CHUNK_SIZE,
) -> torch.Tensor:
    """States entering every chunk and the final state, from initial_state (zeros if None): [B, H, N + 1, K, V].

    This is also the backward's recomputation of states.
    """
    local = local_chunk_states(k, v, g, chunk_size)
    if initial_state is None:
        return local.states
    return update_state_rows(initial_state, local.states, local.log_decay)


def intra_chunk_output(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, scale: float, chunk_size: int = CHUNK_SIZE
) -> torch.Tensor:
    """The part of the output from tokens of the same chunk (independent of any state): [B, T, H, V]."""
    dtype = state_dtype_for(q.dtype)
    gc = _prepared(g, chunk_size, dtype)
    scores = gated_causal_scores(to_chunks(q, chunk_size, dtype) * scale, to_chunks(k, chunk_size, dtype), gc)
    return from_chunks(scores @ to_chunks(v, chunk_size, dtype), q.shape[1])


def output_from_states(
    q: torch.Tensor, g: torch.Tensor, states: torch.Tensor, scale: float, chunk_size: int = CHUNK_SIZE
) -> torch.Tensor:
    """The part of the output read from the state entering each chunk (states[:, :, :N]): [B, T, H, V]."""
    dtype = states.dtype
    gc = _prepared(g, chunk_size, dtype)
    n_chunks = gc.shape[2]
    queries = to_chunks(q, chunk_size, dtype) * scale * gc.exp()
    return from_chunks(queries @ states[:, :, :n_chunks], q.shape[1])


def chunk_gla_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Output [B, T, H, V] (v's dtype) and final state [B, H, K, V]; differentiable through autograd."""
    states = chunk_states(k, v, g, initial_state, chunk_size)
    output = intra_chunk_output(q, k, v, g, scale, chunk_size) + output_from_states(q, g, states, scale, chunk_size)
    return output.to(v.dtype), states[:, :, -1]


def local_chunk_state_gradients(
    q: torch.Tensor, g: torch.Tensor, do: torch.Tensor, scale: float, chunk_size: int = CHUNK_SIZE
) -> ChunkStates:
    """Backward state pass from a zero final-state gradient (the backward All-Scan's local phase).

    Returns ChunkStates(states = dS [B, H, N + 1, K, V], the gradient of the loss with respect to the
    state entering each chunk with dS[:, :, N] = 0, and log_decay [B, H, N + 1, K] with entry n the sum of
    g from chunk n to the end). The global gradients are update_state_rows(dS_final, dS, log_decay).
    """
    dtype = state_dtype_for(q.dtype)
    gc = _prepared(g, chunk_size, dtype)
    queries = to_chunks(q, chunk_size, dtype) * scale * gc.exp()
    updates = queries.transpose(-1, -2) @ to_chunks(do, chunk_size, dtype)
    chunk_log_decay = gc[..., -1, :]
    batch, heads, _, key_dim, value_dim = updates.shape
    zero = updates.new_zeros(batch, heads, key_dim, value_dim)
    reversed_states = _scan_states(updates.flip(2), chunk_log_decay.flip(2), zero)
    suffix_decay = chunk_log_decay.flip(2).cumsum(2)
    log_decay = torch.cat([chunk_log_decay.new_zeros(batch, heads, 1, key_dim), suffix_decay], dim=2).flip(2)
    return ChunkStates(reversed_states.flip(2), log_decay)


def chunk_state_gradients(
    q: torch.Tensor,
    g: torch.Tensor,
    do: torch.Tensor,
    scale: float,
    final_state_grad: torch.Tensor | None = None,
    chunk_size: int = CHUNK_SIZE,
) -> torch.Tensor:
    """Gradient with respect to the state at every chunk boundary: [B, H, N + 1, K, V]; entry 0 is d initial_state."""
    local = local_chunk_state_gradients(q, g, do, scale, chunk_size)
    if final_state_grad is None:
        return local.states
    return update_state_rows(final_state_grad, local.states, local.log_decay)


def intra_chunk_gradients(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    do: torch.Tensor,
    states: torch.Tensor,
    state_grads: torch.Tensor,
    scale: float,
    chunk_size: int = CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv, dg ([B, T, H, *], float32/64) given the states and their gradients at every boundary.

    states and state_grads are [B, H, N + 1, K, V] (chunk_states and chunk_state_gradients). Each chunk's
    gradients depend only on its own tokens, the state entering it and the gradient of the state leaving
    it, so chunks (and ranks) can run this in any order.
    """
    dtype = states.dtype
    length = q.shape[1]
    gc = _prepared(g, chunk_size, dtype)
    queries = to_chunks(q, chunk_size, dtype) * scale
    keys = to_chunks(k, chunk_size, dtype)
    values = to_chunks(v, chunk_size, dtype)
    grads_out = to_chunks(do, chunk_size, dtype)
    entering, leaving = states[:, :, :-1], states[:, :, 1:]
    leaving_grads = state_grads[:, :, 1:]
    chunk_log_decay = gc[..., -1:, :]
    key_decay = (chunk_log_decay - gc).exp()
    scores = gated_causal_scores(queries, keys, gc)
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()
    score_grads = (grads_out @ values.transpose(-1, -2)).masked_fill(~causal, 0.0)
    dv = scores.transpose(-1, -2) @ grads_out + (keys * key_decay) @ leaving_grads
    dq_scaled = gc.exp() * (grads_out @ entering.transpose(-1, -2)) + gated_causal_rows(score_grads, keys, gc)
    dk = key_decay * (values @ leaving_grads.transpose(-1, -2)) + gated_causal_columns(score_grads, queries, gc)
    gate_terms = queries * dq_scaled - keys * dk
    boundary_term = (leaving * leaving_grads).sum(-1)[..., None, :]
    dgate = gate_terms.flip(-2).cumsum(-2).flip(-2) + boundary_term
    return (
        from_chunks(dq_scaled * scale, length),
        from_chunks(dk, length),
        from_chunks(dv, length),
        from_chunks(dgate, length),
    )
