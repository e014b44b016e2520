"""Helpers shared by every operator: argument checks, backend choice, chunk padding."""

from schedlang.kernels.common.chunking import ChunkStates, chunk_count, from_chunks, to_chunks
from schedlang.kernels.common.arguments import (
    Backend,
    CHUNK_SIZE,
    RecurrenceShape,
    check_floating_tensor,
    check_recurrence_arguments,
    resolve_backend,
    compute_dtype_for,
)

__all__ = [
    "Backend",
    "CHUNK_SIZE",
    "ChunkStates",
    "RecurrenceShape",
    "check_floating_tensor",
    "check_recurrence_arguments",
    "chunk_count",
    "from_chunks",
    "to_chunks",
    "resolve_backend",
    "compute_dtype_for",
]
