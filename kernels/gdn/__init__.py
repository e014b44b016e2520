"""Gated DeltaNet's gated delta rule: the public chunked operator (Triton kernels or PyTorch) and its reference."""

from schedlang.kernels.gdn.chunk import chunk_gated_delta_rule
from schedlang.kernels.gdn.naive import naive_recurrent_gated_delta_rule

__all__ = ["chunk_gated_delta_rule", "naive_recurrent_gated_delta_rule"]
