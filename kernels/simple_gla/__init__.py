"""Simple GLA (one scalar gate per head and token): the public operator and the schedulable pieces.

The pieces (pure PyTorch, any device) are documented in kernels/simple_gla/README.md:
local_chunk_states, update_state_rows, chunk_states, intra_chunk_output, output_from_states,
local_chunk_state_gradients, chunk_state_gradients, intra_chunk_gradients.
"""

from schedlang.kernels.common import ChunkStates
from schedlang.kernels.simple_gla.chunk import chunk_simple_gla
from schedlang.kernels.simple_gla.chunk_torch import (
    chunk_state_gradients,
    chunk_states,
    intra_chunk_gradients,
    intra_chunk_output,
    local_chunk_state_gradients,
    local_chunk_states,
    output_from_states,
    update_state_rows,
)
from schedlang.kernels.simple_gla.naive import naive_recurrent_simple_gla

__all__ = [
    "ChunkStates",
    "chunk_simple_gla",
    "chunk_state_gradients",
    "chunk_states",
    "intra_chunk_gradients",
    "intra_chunk_output",
    "local_chunk_state_gradients",
    "local_chunk_states",
    "naive_recurrent_simple_gla",
    "output_from_states",
    "update_state_rows",
]
