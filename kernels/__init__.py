"""Linear-recurrence kernels with state in and state out (Triton, with pure-PyTorch references).

    from schedlang.kernels import chunk_gla, chunk_simple_gla
    o, final_state = chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, backend="auto")

``CHUNK_SIZE``: the tokens of one kernel chunk, for every operator and backend (the Triton kernels tile by it,
the PyTorch paths chunk by it); chunk-local cumulative gates restart at each multiple of it.
"""

from schedlang.kernels.common.arguments import CHUNK_SIZE
from schedlang.kernels.gdn import chunk_gated_delta_rule
from schedlang.kernels.gla import chunk_gla
from schedlang.kernels.simple_gla import chunk_simple_gla

__all__ = ["CHUNK_SIZE", "chunk_gated_delta_rule", "chunk_gla", "chunk_simple_gla"]
