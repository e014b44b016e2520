"""The public SwiGLU activation and its pure-PyTorch implementation.

With ``a = gate``, ``b = up`` and ``s = sigmoid(a)``:
    y  = a s b
    da = dy b s (1 + a (1 - s))        (d silu(a) / da = s + a s (1 - s))
    db = dy a s
Both paths compute in float32 (float64 for float64 inputs) and round once to the input's dtype; the
backward writes ``[da | db]`` as one tensor, which is exactly the gradient of the fused projection's output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from schedlang.kernels.common import Backend, check_floating_tensor, compute_dtype_for, resolve_backend
from schedlang.kernels.common.pointwise import PointwiseFunction, PointwiseImplementation


def _halves(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    width = rows.shape[-1] // 2
    compute = compute_dtype_for(rows.dtype)
    return rows[:, :width].to(compute), rows[:, width:].to(compute)


def _torch_forward(rows: torch.Tensor) -> torch.Tensor:
    gate, up = _halves(rows)
    return (F.silu(gate) * up).to(rows.dtype)


def _torch_backward(rows: torch.Tensor, output_grad: torch.Tensor) -> torch.Tensor:
    gate, up = _halves(rows)
    sigmoid = torch.sigmoid(gate)
    grad = output_grad.to(gate.dtype)
    gate_grad = grad * up * sigmoid * (1 + gate * (1 - sigmoid))
    up_grad = grad * gate * sigmoid
    return torch.cat((gate_grad, up_grad), dim=-1).to(rows.dtype)


TORCH_IMPLEMENTATION = PointwiseImplementation("torch", _torch_forward, _torch_backward)


def _triton_implementation() -> PointwiseImplementation:
    from schedlang.kernels.swiglu.swiglu_triton import TRITON_IMPLEMENTATION

    return TRITON_IMPLEMENTATION


def swiglu(gate_up: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up = [gate | up]`` along the last dimension.

    Args:
        gate_up: [..., 2H], floating point; any strides whose last one is 1 are read in place.
        backend: "auto" (Triton on CUDA or under TRITON_INTERPRET=1, else PyTorch), "triton" or "torch".
    Returns:
        [..., H] in gate_up's dtype. Autograd gives the gradient of gate_up, one contiguous tensor.
    """
    check_floating_tensor("gate_up", gate_up)
    if gate_up.dim() == 0 or gate_up.shape[-1] % 2 != 0:
        raise ValueError(f"gate_up's last dimension must be even ([gate | up]), got shape {tuple(gate_up.shape)}")
    chosen = resolve_backend(backend, gate_up.device)
    implementation = TORCH_IMPLEMENTATION if chosen is Backend.TORCH else _triton_implementation()
    return PointwiseFunction.apply(gate_up, gate_up.shape[-1] // 2, implementation)


def naive_swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """The reference: torch's own silu and product on the two halves, differentiated by autograd."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
