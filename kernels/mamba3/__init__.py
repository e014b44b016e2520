"""Mamba-3 SISO (exponential-trapezoidal update, data-dependent rotary angles) as the chunked simple-GLA operator,
and its float64 reference.

    from schedlang.kernels.mamba3 import chunk_mamba3
    y, final_state = chunk_mamba3(x, dt, adt, trap, B, C, angles, D, initial_state=None, output_final_state=True)

kernels/mamba3/README.md maps the update onto simple GLA's operands.
"""

from schedlang.kernels.mamba3.chunk import (
    Mamba3State,
    TrapezoidOperands,
    chunk_mamba3,
    cumulative_angles,
    entry_state,
    rotate_pairs,
    trapezoid_operands,
    wrap_angle,
)
from schedlang.kernels.mamba3.naive import naive_recurrent_mamba3

__all__ = [
    "Mamba3State",
    "TrapezoidOperands",
    "chunk_mamba3",
    "cumulative_angles",
    "entry_state",
    "naive_recurrent_mamba3",
    "rotate_pairs",
    "trapezoid_operands",
    "wrap_angle",
]
