"""The public log-sigmoid gate and its pure-PyTorch implementation.

    y  = logsigmoid(x) / c = (min(x, 0) - log1p(exp(-|x|))) / c
    dx = dy sigmoid(-x) / c
The output is float32 (float64 for float64 inputs: the reference tests), the form the recurrence kernels
take their log-gates in; the gradient comes back in the logits' dtype. One kernel each way, where the
separate cast, log-sigmoid and division took three launches forward and three backward.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from schedlang.kernels.common import Backend, check_floating_tensor, compute_dtype_for, resolve_backend
from schedlang.kernels.common.pointwise import PointwiseFunction, PointwiseImplementation


def _torch_forward(rows: torch.Tensor, normalizer: float) -> torch.Tensor:
    return F.logsigmoid(rows.to(compute_dtype_for(rows.dtype))) / normalizer


def _torch_backward(rows: torch.Tensor, output_grad: torch.Tensor, normalizer: float) -> torch.Tensor:
    logits = rows.to(compute_dtype_for(rows.dtype))
    return (output_grad.to(logits.dtype) * torch.sigmoid(-logits) / normalizer).to(rows.dtype)


@functools.lru_cache(maxsize=None)
def _implementation(backend: Backend, normalizer: float) -> PointwiseImplementation:
    if backend is Backend.TORCH:
        return PointwiseImplementation(
            "torch",
            functools.partial(_torch_forward, normalizer=normalizer),
            functools.partial(_torch_backward, normalizer=normalizer),
        )
    from schedlang.kernels.log_sigmoid_gate.gate_triton import triton_implementation

    return triton_implementation(normalizer)


def log_sigmoid_gate(logits: torch.Tensor, normalizer: float = 1.0, backend: str = "auto") -> torch.Tensor:
    """``logsigmoid(logits) / normalizer``, the log of a forget gate in (0, 1), scaled toward 0.

    Args:
        logits: [..., W], floating point; any strides whose last one is 1 are read in place.
        normalizer: a positive number (GLA uses 16: forget gates start close to 1).
        backend: "auto" (Triton on CUDA or under TRITON_INTERPRET=1, else PyTorch), "triton" or "torch".
    Returns:
        [..., W] float32 (float64 for float64 logits). Autograd gives the logits' gradient in their dtype.
    """
    check_floating_tensor("logits", logits)
    if logits.dim() == 0:
        raise ValueError("logits must have at least one dimension")
    if not normalizer > 0:
        raise ValueError(f"normalizer must be positive, got {normalizer!r}")
    chosen = resolve_backend(backend, logits.device)
    return PointwiseFunction.apply(logits, logits.shape[-1], _implementation(chosen, float(normalizer)))


def naive_log_sigmoid_gate(logits: torch.Tensor, normalizer: float = 1.0) -> torch.Tensor:
    """The reference: torch's own log-sigmoid, differentiated by autograd."""
    return F.logsigmoid(logits) / normalizer
