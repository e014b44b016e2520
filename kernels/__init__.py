"""Linear-recurrence kernels with state in and state out (Triton, with pure-PyTorch references).

    from schedlang.kernels import chunk_gla, chunk_simple_gla
    o, final_state = chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, backend="auto")
"""

from schedlang.kernels.gdn import chunk_gated_delta_rule
from schedlang.kernels.gla import chunk_gla
from schedlang.kernels.simple_gla import chunk_simple_gla

__all__ = ["chunk_gated_delta_rule", "chunk_gla", "chunk_simple_gla"]
