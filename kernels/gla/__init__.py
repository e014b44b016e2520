"""Gated linear attention (per-key-dimension gate): the public operator and the schedulable pieces.

The pieces (pure PyTorch, any device) are documented in kernels/gla/README.md:
local_chunk_states, update_state_rows, chunk_states, intra_chunk_output, output_from_states,
local_chunk_state_gradients, chunk_state_gradients, intra_chunk_gradients.
"""

from schedlang.kernels.common import ChunkStates
from schedlang.kernels.gla.chunk import chunk_gla
from schedlang.kernels.gla.chunk_torch import (
    chunk_state_gradients,
    chunk_states,
    intra_chunk_gradients,
    intra_chunk_output,
    local_chunk_state_gradients,
    local_chunk_states,
    output_from_states,
    update_state_rows,
)
from schedlang.kernels.gla.naive import naive_recurrent_gla

__all__ = [
    "ChunkStates",
    "chunk_gla",
    "chunk_state_gradients",
    "chunk_states",
    "intra_chunk_gradients",
    "intra_chunk_output",
    "local_chunk_state_gradients",
    "local_chunk_states",
    "naive_recurrent_gla",
    "output_from_states",
    "update_state_rows",
]
