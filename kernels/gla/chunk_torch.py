"""Pure-PyTorch chunked GLA: the CPU path of the runtime, and the pieces ZeCO and StateFlow schedule.

All functions take the user layout (q, k: [B, T, H, K], v: [B, T, H, V], g: [B, T, H, K] log-gate) and
work in float32 (float64 when the inputs are float64), vectorised over chunks; only the state pass loops,
once per chunk. States are laid out [B, H, N + 1, K, V]: entry n is the state entering chunk n, entry N the
state after the last token. The state passes, the forward and the backend choice are shared with simple GLA
(:class:`~schedlang.kernels.common.chunk_operator.ChunkOperator` over kernels/common/chunk_state_passes.py,
given the per-key gate); the intra-chunk terms, which need the sub-chunk split, are here.
kernels/gla/README.md gives the derivations.
"""

from __future__ import annotations

import torch

from schedlang.kernels.common import CHUNK_SIZE, from_chunks, compute_dtype_for, to_chunks
from schedlang.kernels.common.chunk_operator import ChunkOperator
from schedlang.kernels.common.chunk_state_passes import cumulative_gate, decay_to_chunk_end
from schedlang.kernels.common.gate_layout import PER_KEY_GATE
from schedlang.kernels.gla.gated_products import gated_causal_columns, gated_causal_rows, gated_causal_scores


def intra_chunk_output(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, scale: float, chunk_size: int = CHUNK_SIZE
) -> torch.Tensor:
    """The part of the output from tokens of the same chunk (independent of any state): [B, T, H, V]."""
    dtype = compute_dtype_for(q.dtype)
    gc = cumulative_gate(g, chunk_size, dtype)
    scores = gated_causal_scores(to_chunks(q, chunk_size, dtype) * scale, to_chunks(k, chunk_size, dtype), gc)
    return from_chunks(scores @ to_chunks(v, chunk_size, dtype), q.shape[1])


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


GLA = ChunkOperator(
    PER_KEY_GATE, intra_chunk_output, intra_chunk_gradients, triton_module="schedlang.kernels.gla.chunk_triton"
)
"""The operator: the glue shared with the other gate shape, around the two intra-chunk pieces above."""

local_chunk_states = GLA.local_chunk_states
update_state_rows = GLA.update_state_rows
chunk_states = GLA.chunk_states
output_from_states = GLA.output_from_states
local_chunk_state_gradients = GLA.local_chunk_state_gradients
chunk_state_gradients = GLA.chunk_state_gradients
