"""flash-linear-attention's ``RMSNormGated`` (Mamba-2's output norm, the gate before the norm) and
``FusedRMSNormGated`` (GLA's and Gated DeltaNet's output norm, ``norm_before_gate``), and their PyTorch
implementation.

Per row and per group of ``D / G`` channels, with ``r = (mean u^2 + eps)^-1/2`` of what is normalised and ``n = u r``:
    gate first (Mamba-2):  u = values silu(gate),  y = n w
        dn = dy w,            du = r (dn - n mean(dn n)),  dv = du silu(gate),  dz = du values silu'(gate)
    norm first:            u = values,             y = n w silu(gate)
        dn = dy w silu(gate), dv = r (dn - n mean(dn n)),  dz = dy n w silu'(gate)
``w`` is ``[D]``, or ``[D / G]`` shared by every group (one head's norm weight for all heads); ``dw`` sums
``dy n`` (times ``silu(gate)`` norm first) over rows, and over groups for a shared weight. Both paths compute
in float32 (float64 for float64 inputs) and round once; the Triton path
(kernels/gated_rms_norm/gated_rms_norm_triton.py) reads values and gate through their row strides, so the gate
is read in place from the layer's fused input projection, and recomputes ``u`` and ``r`` in the backward: the
Function saves only its inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from schedlang.kernels.common import check_floating_tensor, compute_dtype_for
from schedlang.kernels.common.arguments import runs_float32_kernels
from schedlang.kernels.common.pointwise import as_rows


@dataclass(frozen=True)
class GatedNormImplementation:
    """``forward(values, gate, weight, groups, eps, norm_before_gate) -> y`` and ``backward(values, gate, weight,
    groups, eps, norm_before_gate, dy) -> (d values, d gate, d weight float32)`` on row matrices ``[R, D]`` with
    unit column strides."""

    name: str
    forward: Callable
    backward: Callable


def _formula(values, gate, weight, groups, eps, norm_before_gate, normalise):
    """The output in the inputs' dtype, ``normalise(grouped, eps)`` the RMS normalisation of the last dimension."""
    activated = F.silu(gate)
    normalised = values if norm_before_gate else values * activated
    grouped = normalised.reshape(*normalised.shape[:-1], groups, -1)
    weighted = normalise(grouped, eps) * weight.view(-1, grouped.shape[-1])
    output = weighted.reshape(normalised.shape)
    return output * activated if norm_before_gate else output


def _torch_rms_norm(grouped, eps):
    return F.rms_norm(grouped, (grouped.shape[-1],), eps=eps)


def _torch_output(values, gate, weight, groups, eps, norm_before_gate):
    compute = compute_dtype_for(values.dtype)
    return _formula(values.to(compute), gate.to(compute), weight.to(compute), groups, eps, norm_before_gate,
                    _torch_rms_norm)


def _torch_forward(values, gate, weight, groups, eps, norm_before_gate):
    return _torch_output(values, gate, weight, groups, eps, norm_before_gate).to(values.dtype)


def _torch_backward(values, gate, weight, groups, eps, norm_before_gate, output_grad):
    compute = compute_dtype_for(values.dtype)
    leaves = [tensor.to(compute).requires_grad_(True) for tensor in (values, gate, weight)]
    with torch.enable_grad():
        output = _torch_output(*leaves, groups, eps, norm_before_gate)
        d_values, d_gate, d_weight = torch.autograd.grad(output, leaves, output_grad.to(compute))
    return d_values.to(values.dtype), d_gate.to(gate.dtype), d_weight


TORCH_IMPLEMENTATION = GatedNormImplementation("torch", _torch_forward, _torch_backward)


class GatedRMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, values, gate, weight, groups, eps, norm_before_gate, implementation):
        value_rows, gate_rows = as_rows(values), as_rows(gate)
        ctx.save_for_backward(value_rows, gate_rows, weight)
        ctx.shapes = (values.shape, gate.shape)
        ctx.settings = (groups, eps, norm_before_gate)
        ctx.implementation = implementation
        return implementation.forward(value_rows, gate_rows, weight, *ctx.settings).view(values.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, output_grad):
        value_rows, gate_rows, weight = ctx.saved_tensors
        d_values, d_gate, d_weight = ctx.implementation.backward(
            value_rows, gate_rows, weight, *ctx.settings, as_rows(output_grad)
        )
        values_shape, gate_shape = ctx.shapes
        return d_values.view(values_shape), d_gate.view(gate_shape), d_weight.to(weight.dtype), None, None, None, None


def gated_rms_norm(values: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, groups: int = 1,
                   eps: float = 1e-5, norm_before_gate: bool = False, backend: str = "auto") -> torch.Tensor:
    """``rmsnorm(values * silu(gate)) * weight`` (``norm_before_gate``: ``rmsnorm(values) * weight *
    silu(gate)``), the RMS over each of ``groups`` runs of ``D / groups`` channels.

    Args:
        values, gate: [..., D] of one shape; any strides whose last one is 1 are read in place on the Triton
            path. weight: [D], or [D / groups] shared by every group. groups: dividing D. eps: added to the
            mean square.
        backend: "auto" (Triton on CUDA or under TRITON_INTERPRET=1, else PyTorch), "triton" or "torch";
            float64 inputs always take the PyTorch path (the kernels compute in float32).
    Returns:
        [..., D] in values' dtype. Autograd gives gradients for values, gate and weight.
    """
    check_floating_tensor("values", values)
    check_floating_tensor("gate", gate)
    if values.dim() == 0 or gate.shape != values.shape:
        raise ValueError(f"values and gate must have one shape [..., D], got {tuple(values.shape)} and "
                         f"{tuple(gate.shape)}")
    width = values.shape[-1]
    if groups < 1 or width % groups:
        raise ValueError(f"groups must divide D = {width}, got {groups}")
    if tuple(weight.shape) not in ((width,), (width // groups,)):
        raise ValueError(f"weight must have shape [D] = [{width}] or [D / groups] = [{width // groups}], "
                         f"got {tuple(weight.shape)}")
    if not runs_float32_kernels(backend, values):
        implementation = TORCH_IMPLEMENTATION
    else:
        from schedlang.kernels.gated_rms_norm.gated_rms_norm_triton import TRITON_IMPLEMENTATION as implementation
    return GatedRMSNormFunction.apply(values, gate, weight.contiguous(), groups, eps, norm_before_gate,
                                      implementation)


def _written_out_rms_norm(grouped, eps):
    return grouped * torch.rsqrt(grouped.pow(2).mean(dim=-1, keepdim=True) + eps)


def naive_gated_rms_norm(values: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, groups: int = 1,
                         eps: float = 1e-5, norm_before_gate: bool = False) -> torch.Tensor:
    """The reference: the formula with the mean square written out, in the inputs' own dtype, differentiated by
    autograd."""
    return _formula(values, gate, weight, groups, eps, norm_before_gate, _written_out_rms_norm)
