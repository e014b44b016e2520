"""The causal depthwise convolution with SiLU of Gated DeltaNet's and Mamba-2's layers, with the inputs before
the chunk (its history) read in place, one launch each way.

    from schedlang.kernels.short_convolution import short_convolution
    y = short_convolution(inputs, weight, bias=None, history=None, backend="auto")   # [B, L, C] -> [B, L, C]
"""

from schedlang.kernels.short_convolution.short_convolution import (
    naive_short_convolution,
    short_convolution,
    short_convolution_history,
)

__all__ = ["naive_short_convolution", "short_convolution", "short_convolution_history"]
