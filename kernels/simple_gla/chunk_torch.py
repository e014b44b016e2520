"""Pure-PyTorch chunked simple GLA (scalar gate per head and token): CPU path and schedulable pieces.

Same layout and contracts as schedlang.kernels.gla.chunk_torch, with g: [B, T, H] and the cumulative log
decay one number per head: [B, H, N + 1]. The state passes, the forward and the backend choice are shared
with GLA (:class:`~schedlang.kernels.common.chunk_operator.ChunkOperator`, given the scalar gate). Because
the gate is a scalar, the intra-chunk decay matrix exp(gc_i - gc_j) (j <= i) is formed directly and is never
larger than 1, so no sub-chunk split is needed.
"""

from __future__ import annotations

import torch

from schedlang.kernels.common import CHUNK_SIZE, from_chunks, compute_dtype_for, to_chunks
from schedlang.kernels.common.chunk_operator import ChunkOperator
from schedlang.kernels.common.chunk_state_passes import cumulative_gate, decay_to_chunk_end
from schedlang.kernels.common.gate_layout import SCALAR_GATE


def _decay_matrix(gc: torch.Tensor) -> torch.Tensor:
    size = gc.shape[-1]
    causal = torch.ones(size, size, dtype=torch.bool, device=gc.device).tril()
    return torch.where(causal, gc[..., :, None] - gc[..., None, :], float("-inf")).exp()


def intra_chunk_output(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, scale: float, chunk_size: int = CHUNK_SIZE
) -> torch.Tensor:
    """Output from tokens of the same chunk: [B, T, H, V]."""
    dtype = compute_dtype_for(q.dtype)
    gc = cumulative_gate(g, chunk_size, dtype)
    queries = to_chunks(q, chunk_size, dtype) * scale
    scores = (queries @ to_chunks(k, chunk_size, dtype).transpose(-1, -2)) * _decay_matrix(gc)
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


SIMPLE_GLA = ChunkOperator(
    SCALAR_GATE, intra_chunk_output, intra_chunk_gradients, triton_module="schedlang.kernels.simple_gla.chunk_triton",
    triton_reads_groups=True,
)
"""The operator: the glue shared with the other gate shape, around the two intra-chunk pieces above."""

local_chunk_states = SIMPLE_GLA.local_chunk_states
update_state_rows = SIMPLE_GLA.update_state_rows
chunk_states = SIMPLE_GLA.chunk_states
output_from_states = SIMPLE_GLA.output_from_states
local_chunk_state_gradients = SIMPLE_GLA.local_chunk_state_gradients
chunk_state_gradients = SIMPLE_GLA.chunk_state_gradients
