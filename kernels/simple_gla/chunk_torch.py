"""Pure-PyTorch chunked simple GLA (scalar gate per head and token): CPU path and schedulable pieces.

Same layout and contracts as schedlang.kernels.gla.chunk_torch, with g: [B, T, H] and the cumulative log
decay one number per head: [B, H, N + 1]. The state passes are shared with GLA
(kernels/common/chunk_state_passes.py). Because the gate is a scalar, the intra-chunk decay matrix
exp(gc_i - gc_j) (j <= i) is formed directly and is never larger than 1, so no sub-chunk split is needed.
"""

from __future__ import annotations

import torch

from schedlang.kernels.common import CHUNK_SIZE, ChunkStates, from_chunks, compute_dtype_for, to_chunks
from schedlang.kernels.common import chunk_state_passes
from schedlang.kernels.common.chunk_state_passes import cumulative_gate, decay_to_chunk_end
from schedlang.kernels.common.gate_layout import SCALAR_GATE


def _decay_matrix(gc: torch.Tensor) -> torch.Tensor:
    size = gc.shape[-1]
    causal = torch.ones(size, size, dtype=torch.bool, device=gc.device).tril()
    return torch.where(causal, gc[..., :, None] - gc[..., None, :], float("-inf")).exp()


def local_chunk_states(k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, chunk_size: int = CHUNK_SIZE) -> ChunkStates:
    """Chunk states from a zero initial state ([B, H, N + 1, K, V]) and cumulative log decay ([B, H, N + 1])."""
    return chunk_state_passes.local_chunk_states(SCALAR_GATE, k, v, g, chunk_size)


def update_state_rows(
    incoming_state: torch.Tensor,
    local_state: torch.Tensor,
    log_decay: torch.Tensor,
    row_start: int = 0,
    row_end: int | None = None,
) -> torch.Tensor:
    """exp(log_decay) * S_in + S_local on key rows [row_start, row_end).

    incoming_state: [B, H, K, V]; local_state: [B, H, K, V] or [B, H, M, K, V]; log_decay: [B, H] or [B, H, M].
    """
    return chunk_state_passes.update_state_rows(
        SCALAR_GATE, incoming_state, local_state, log_decay, row_start, row_end
    )


def chunk_states(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = CHUNK_SIZE,
) -> torch.Tensor:
    """States entering every chunk plus the final state: [B, H, N + 1, K, V]."""
    return chunk_state_passes.chunk_states(SCALAR_GATE, k, v, g, initial_state, chunk_size)


def intra_chunk_output(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, scale: float, chunk_size: int = CHUNK_SIZE
) -> torch.Tensor:
    """Output from tokens of the same chunk: [B, T, H, V]."""
    dtype = compute_dtype_for(q.dtype)
    gc = cumulative_gate(g, chunk_size, dtype)
    queries = to_chunks(q, chunk_size, dtype) * scale
    scores = (queries @ to_chunks(k, chunk_size, dtype).transpose(-1, -2)) * _decay_matrix(gc)
    return from_chunks(scores @ to_chunks(v, chunk_size, dtype), q.shape[1])


def output_from_states(
    q: torch.Tensor, g: torch.Tensor, states: torch.Tensor, scale: float, chunk_size: int = CHUNK_SIZE
) -> torch.Tensor:
    """Output read from the state entering each chunk (states[:, :, :N]): [B, T, H, V]."""
    return chunk_state_passes.output_from_states(SCALAR_GATE, q, g, states, scale, chunk_size)


def chunk_simple_gla_forward(
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
    """State gradients from a zero final-state gradient ([B, H, N + 1, K, V]) and suffix log decay ([B, H, N + 1])."""
    return chunk_state_passes.local_chunk_state_gradients(SCALAR_GATE, q, g, do, scale, chunk_size)


def chunk_state_gradients(
    q: torch.Tensor,
    g: torch.Tensor,
    do: torch.Tensor,
    scale: float,
    final_state_grad: torch.Tensor | None = None,
    chunk_size: int = CHUNK_SIZE,
) -> torch.Tensor:
    """Gradient with respect to the state at every chunk boundary: [B, H, N + 1, K, V]."""
    return chunk_state_passes.chunk_state_gradients(SCALAR_GATE, q, g, do, scale, final_state_grad, chunk_size)


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
    """dq, dk, dv ([B, T, H, *]) and dg ([B, T, H]) given states and state gradients at every boundary."""
    dtype = states.dtype
    length = q.shape[1]
    gc = cumulative_gate(g, chunk_size, dtype)
    queries = to_chunks(q, chunk_size, dtype) * scale
    keys = to_chunks(k, chunk_size, dtype)
    values = to_chunks(v, chunk_size, dtype)
    grads_out = to_chunks(do, chunk_size, dtype)
    entering, leaving, leaving_grads = states[:, :, :-1], states[:, :, 1:], state_grads[:, :, 1:]
    decay = _decay_matrix(gc)
    key_decay = decay_to_chunk_end(SCALAR_GATE, gc)
    scores = (queries @ keys.transpose(-1, -2)) * decay
    score_grads = (grads_out @ values.transpose(-1, -2)) * decay
    dv = scores.transpose(-1, -2) @ grads_out + (keys * key_decay) @ leaving_grads
    dq_scaled = gc.exp()[..., None] * (grads_out @ entering.transpose(-1, -2)) + score_grads @ keys
    dk = key_decay * (values @ leaving_grads.transpose(-1, -2)) + score_grads.transpose(-1, -2) @ queries
    gate_terms = (queries * dq_scaled - keys * dk).sum(-1)
    boundary_term = (leaving * leaving_grads).sum((-1, -2))[..., None]
    dgate = gate_terms.flip(-1).cumsum(-1).flip(-1) + boundary_term
    return (
        from_chunks(dq_scaled * scale, length),
        from_chunks(dk, length),
        from_chunks(dv, length),
        from_chunks(dgate, length),
    )
