"""Mamba-2's SSD (one scalar decay per head) as the chunked simple-GLA operator, and its float64 reference.

    from schedlang.kernels.mamba2 import chunk_mamba2
    y, final_state = chunk_mamba2(x, dt, A, B, C, D, initial_state=None, output_final_state=True)

kernels/mamba2/README.md maps the SSD onto simple GLA's operands.
"""

from schedlang.kernels.mamba2.chunk import SsdOperands, chunk_mamba2, ssd_operands
from schedlang.kernels.mamba2.naive import naive_recurrent_mamba2
from schedlang.kernels.mamba2.pointwise import ssd_skip, ssd_values_and_gates

__all__ = ["SsdOperands", "chunk_mamba2", "naive_recurrent_mamba2", "ssd_operands", "ssd_skip", "ssd_values_and_gates"]
