"""Pure-PyTorch chunked GLA: the CPU path of the runtime, and the pieces ZeCO and StateFlow schedule.

All functions take the user layout (q, k: [B, T, H, K], v: [B, T, H, V], g: [B, T, H, K] log-gate) and
work in float32 (float64 when the inputs are float64), vectorised over chunks; only the state pass loops,
once per chunk. States are laid out [B, H, N + 1, K, V]: entry n is the state entering chunk n, entry N the
state after the last token. The state passes are shared with simple GLA (kernels/common/chunk_state_passes.py);
the intra-chunk terms, which need the sub-chunk split, are here. kernels/gla/README.md gives the derivations.
"""

from __future__ import annotations

import torch

from schedlang.kernels.common import CHUNK_SIZE, ChunkStates, from_chunks, compute_dtype_for, to_chunks
from schedlang.kernels.common import chunk_state_passes
from schedlang.kernels.common.chunk_state_passes import cumulative_gate, decay_to_chunk_end
from schedlang.kernels.common.gate_layout import PER_KEY_GATE
from schedlang.kernels.gla.gated_products import gated_causal_columns, gated_causal_rows, gated_causal_scores


def local_chunk_states(k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, chunk_size: int = CHUNK_SIZE) -> ChunkStates:
    """ZeCO Algorithm 1, phase 1: chunk states from a zero initial state, and the cumulative log decay.

    Returns ChunkStates(states [B, H, N + 1, K, V] with states[:, :, 0] = 0, log_decay [B, H, N + 1, K]
    with log_decay[:, :, n] = sum of g over chunks 0..n-1, i.e. log of ZeCO's gamma_tilde).
    """
    return chunk_state_passes.local_chunk_states(PER_KEY_GATE, k, v, g, chunk_size)


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
    return chunk_state_passes.update_state_rows(
        PER_KEY_GATE, incoming_state, local_state, log_decay, row_start, row_end
    )


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
    return chunk_state_passes.chunk_states(PER_KEY_GATE, k, v, g, initial_state, chunk_size)


def intra_chunk_output(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, scale: float, chunk_size: int = CHUNK_SIZE
) -> torch.Tensor:
    """The part of the output from tokens of the same chunk (independent of any state): [B, T, H, V]."""
    dtype = compute_dtype_for(q.dtype)
    gc = cumulative_gate(g, chunk_size, dtype)
    scores = gated_causal_scores(to_chunks(q, chunk_size, dtype) * scale, to_chunks(k, chunk_size, dtype), gc)
    return from_chunks(scores @ to_chunks(v, chunk_size, dtype), q.shape[1])


def output_from_states(
    q: torch.Tensor, g: torch.Tensor, states: torch.Tensor, scale: float, chunk_size: int = CHUNK_SIZE
) -> torch.Tensor:
    """The part of the output read from the state entering each chunk (states[:, :, :N]): [B, T, H, V]."""
    return chunk_state_passes.output_from_states(PER_KEY_GATE, q, g, states, scale, chunk_size)


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
    return chunk_state_passes.local_chunk_state_gradients(PER_KEY_GATE, q, g, do, scale, chunk_size)


def chunk_state_gradients(
    q: torch.Tensor,
    g: torch.Tensor,
    do: torch.Tensor,
    scale: float,
    final_state_grad: torch.Tensor | None = None,
    chunk_size: int = CHUNK_SIZE,
) -> torch.Tensor:
    """Gradient with respect to the state at every chunk boundary: [B, H, N + 1, K, V]; entry 0 is d initial_state."""
    return chunk_state_passes.chunk_state_gradients(PER_KEY_GATE, q, g, do, scale, final_state_grad, chunk_size)


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
    gc = cumulative_gate(g, chunk_size, dtype)
    queries = to_chunks(q, chunk_size, dtype) * scale
    keys = to_chunks(k, chunk_size, dtype)
    values = to_chunks(v, chunk_size, dtype)
    grads_out = to_chunks(do, chunk_size, dtype)
    entering, leaving = states[:, :, :-1], states[:, :, 1:]
    leaving_grads = state_grads[:, :, 1:]
    key_decay = decay_to_chunk_end(PER_KEY_GATE, gc)
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
