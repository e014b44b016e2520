"""How many tokens per sequence a chunk's recurrent operators run over: the chunk's own, or with packed
documents the longest padded row the data allows ([Note: packed documents] in schedlang.runtime.packing).
The memory model (schedlang.lowering.memory_terms) and the cost model (schedlang.lowering.cost) both read it.
"""

from __future__ import annotations

from schedlang.lowering.program import ScheduleProgram
from schedlang.runtime.document_padding import most_padded_tokens

RUNTIME_KERNEL_CHUNK = 64
"""Tokens per kernel chunk of the runtime's recurrence kernels (``schedlang.kernels.common.CHUNK_SIZE``;
the kernels tile by it whatever ``sequence.kernel_chunk`` says), which the packed layout pads to."""


def operator_tokens(program: ScheduleProgram, chunk: int) -> int:
    """Tokens per sequence of chunk ``chunk``'s recurrent operator calls: its length, or with
    ``program.document_pieces`` the most a padded row of that many pieces can have
    (:func:`schedlang.runtime.document_padding.most_padded_tokens`)."""
    length = program.sequence.chunk_length(chunk)
    if program.document_pieces is None:
        return length
    return most_padded_tokens(length, program.document_pieces.most(length), RUNTIME_KERNEL_CHUNK)
