"""Argument checks and backend choice for the chunked linear-recurrence operators.

Every public operator takes `q, k: [B, T, H, K]`, `v: [B, T, H, V]`, a log-gate `g` (`[B, T, H, K]` for
GLA, `[B, T, H]` for simple GLA) and an optional state `[B, H, K, V]`. Bad arguments raise ValueError
naming the argument and the shapes seen, before any kernel runs.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass

import torch

CHUNK_SIZE = 64

COMPILE_ONLY_VARIABLE = "SCHEDLANG_KERNELS_COMPILE_ONLY"
"""Set to 1 by ``python -m schedlang.kernels.compile_check`` in its own process: Triton launches there compile
for a GPU target and never run, so CPU tensors take the Triton path (no interpreter, so bfloat16 too)."""


def compiling_only() -> bool:
    return os.environ.get(COMPILE_ONLY_VARIABLE) == "1"


class Backend(enum.Enum):
    AUTO = "auto"
    TRITON = "triton"
    TORCH = "torch"


@dataclass(frozen=True)
class RecurrenceShape:
    batch: int
    length: int
    heads: int
    key_dim: int
    value_dim: int


def resolve_backend(backend: str | Backend, device: torch.device, matmul_dtype: torch.dtype | None = None) -> Backend:
    """Turn the user's `backend` argument into TRITON or TORCH.

    "auto" runs Triton on CUDA tensors, and on CPU tensors only when TRITON_INTERPRET=1 is set (the
    interpreter); otherwise the pure-PyTorch chunked path. ``matmul_dtype`` is the dtype of the operands a
    kernel feeds to ``tl.dot``: Triton's interpreter keeps bfloat16 as raw 16-bit patterns and multiplies
    those in ``tl.dot`` (Triton 3.6; its debugging guide lists bfloat16 as unsupported), so bfloat16 on the
    CPU takes the PyTorch path under "auto", and "triton" is refused rather than returning garbage.
    """
    try:
        chosen = Backend(backend) if not isinstance(backend, Backend) else backend
    except ValueError:
        names = ", ".join(repr(member.value) for member in Backend)
        raise ValueError(f"backend must be one of {names}, got {backend!r}") from None
    interpreted_bfloat16 = device.type == "cpu" and matmul_dtype == torch.bfloat16 and not compiling_only()
    if chosen is Backend.TRITON and interpreted_bfloat16:
        raise ValueError(
            "backend='triton' on CPU tensors runs Triton's interpreter, whose tl.dot is wrong for bfloat16 "
            "operands; pass float32 tensors, use backend='torch', or run on a GPU"
        )
    if chosen is not Backend.AUTO:
        return chosen
    interpreted = os.environ.get("TRITON_INTERPRET") == "1" and not interpreted_bfloat16
    if device.type == "cuda" or compiling_only() or interpreted:
        return Backend.TRITON
    return Backend.TORCH


def runs_float32_kernels(backend: str | Backend, tensor: torch.Tensor) -> bool:
    """Whether an operator whose Triton kernels compute in float32 runs them for ``tensor``: ``backend``
    resolves to Triton and ``tensor`` is not float64 (float64 takes the PyTorch path, which keeps its precision)."""
    return tensor.dtype != torch.float64 and resolve_backend(backend, tensor.device) is Backend.TRITON


def compute_dtype_for(dtype: torch.dtype) -> torch.dtype:
    """What the PyTorch paths compute and keep states in: float32, or float64 when the inputs are float64 (the
    reference tests)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_floating_tensor(name: str, tensor: object) -> None:
    """Raise ValueError unless ``tensor`` is a floating-point torch.Tensor."""
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {tensor.dtype}")


def check_recurrence_arguments(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    initial_state: torch.Tensor | None,
    gate_per_key: bool,
    grouped_queries: bool = False,
) -> RecurrenceShape:
    """Check shapes, devices and dtypes; return the sizes (``heads``: v's). With ``grouped_queries`` q and k may
    have fewer heads than v, a divisor of v's ([Note: grouped head order] in schedlang.kernels.common.heads).
    Raises ValueError on any mismatch."""
    for name, tensor in (("q", q), ("k", k), ("v", v), ("g", g)):
        check_floating_tensor(name, tensor)
    if q.dim() != 4:
        raise ValueError(f"q must have shape [B, T, H, K], got {tuple(q.shape)}")
    batch, length, query_heads, key_dim = q.shape
    if k.shape != q.shape:
        raise ValueError(f"k must have q's shape {tuple(q.shape)}, got {tuple(k.shape)}")
    if grouped_queries:
        heads = v.shape[2] if v.dim() == 4 else 0
        if v.dim() != 4 or v.shape[:2] != (batch, length) or query_heads == 0 or heads % query_heads:
            raise ValueError(f"v must have shape [B, T, H, V] = [{batch}, {length}, H, V], H a multiple of q's "
                             f"{query_heads} heads, got {tuple(v.shape)}")
    else:
        heads = query_heads
        if v.dim() != 4 or v.shape[:3] != q.shape[:3]:
            raise ValueError(f"v must have shape [B, T, H, V] = [{batch}, {length}, {heads}, V], got {tuple(v.shape)}")
    value_dim = v.shape[3]
    expected_gate = (batch, length, heads, key_dim) if gate_per_key else (batch, length, heads)
    if tuple(g.shape) != expected_gate:
        layout = "[B, T, H, K]" if gate_per_key else "[B, T, H]"
        raise ValueError(f"g must have shape {layout} = {list(expected_gate)}, got {tuple(g.shape)}")
    if length == 0 or key_dim == 0 or value_dim == 0 or batch == 0 or heads == 0:
        raise ValueError(f"empty input: q {tuple(q.shape)}, v {tuple(v.shape)}")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    devices = {tensor.device for tensor in (q, k, v, g)}
    if initial_state is not None:
        expected_state = (batch, heads, key_dim, value_dim)
        if tuple(initial_state.shape) != expected_state:
            raise ValueError(
                f"initial_state must have shape [B, H, K, V] = {list(expected_state)}, got {tuple(initial_state.shape)}"
            )
        devices.add(initial_state.device)
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(str(device) for device in devices)}")
    return RecurrenceShape(batch, length, heads, key_dim, value_dim)
