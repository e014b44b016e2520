"""Mamba-2's gated, grouped RMSNorm ``rmsnorm(values * silu(gate)) * weight``, one launch each way.

    from schedlang.kernels.gated_rms_norm import gated_rms_norm
    y = gated_rms_norm(values, gate, weight, groups=1, eps=1e-5, backend="auto")   # [..., D] -> [..., D]
"""

from schedlang.kernels.gated_rms_norm.gated_rms_norm import gated_rms_norm, naive_gated_rms_norm

__all__ = ["gated_rms_norm", "naive_gated_rms_norm"]
