"""Exact, differentiable sequence-parallel GLA over the ranks of one process group.

The tokens of one span are split contiguously over the ``P`` ranks of a group
(rank ``p`` holds positions ``t_p .. t_{p+1} - 1``; lengths may differ). ZeCO's
formulation:

1. each rank runs the single-device kernel on its own tokens from a zero state:
   ``o_local``, ``S_local`` (state after its last token), and its cumulative
   log-decay ``G_t = sum_{s <= t} g_s`` within the rank, whose last value gives
   the rank's total decay ``gamma = exp(G_last)`` (per key row for ``gla``, one
   scalar per head for ``simple_gla``);
2. a cross-rank scan gives the state entering each rank,
   ``S_in(0) = initial_state`` and ``S_in(p) = gamma(p-1) * S_in(p-1) + S_local(p-1)``;
3. the output is corrected with plain differentiable torch ops,
   ``o_t += (q_t * scale * exp(G_t)) @ S_in``, because the recurrence is linear
   in its initial state.

The scan is :class:`StateScanFunction`, whose backward is the reverse scan
derived in [Note: sequence-parallel gradients]. Three methods implement it:
:class:`SequenceParallelMethod`.

[Note: sequence-parallel gradients]
Write ``S_out(p) = gamma(p) * S_in(p) + S_local(p)`` (so ``S_in(p+1) = S_out(p)``
and ``final_state = S_out(P-1)``). Let ``dS_in(p)`` be the gradient the rest of
rank ``p``'s graph sends into ``S_in(p)`` (through the output correction) and
``A(p)`` the total gradient of ``S_out(p)``. Then

    A(P-1)   = sum over ranks of the gradients given to final_state
    B(p)     = dS_in(p) + gamma(p) * A(p)          total gradient of S_in(p)
    A(p-1)   = B(p)
    dS_local(p) = A(p)
    dgamma(p)   = sum over V of A(p) * S_in(p)     (and over K for a scalar gate)
    d initial_state = B(0)

which is the same decayed scan run from the last rank down, with local term
``dS_in(p)``, the same decays, and boundary ``A(P-1)``. Each rank sends one
state gradient, as many bytes as the forward.

Contract for callers that chain spans (the pipeline runtime):

* ``initial_state`` is read on group rank 0 only. Its gradient is returned on
  rank 0; any other rank that passes one gets zeros.
* ``final_state`` (state after the last token of the whole span) is returned on
  every rank, bit-identical. It behaves as a broadcast from the last rank, so
  its backward is a sum: the gradients given to ``final_state`` on *all*
  ranks are added. Give the real gradient on exactly one rank (typically rank
  0, which feeds the next span's ``initial_state``) and leave the others
  unused (autograd passes zeros); giving the same gradient on every rank would
  count it ``P`` times.
* Every rank of the group must backpropagate through its output (or final
  state): the backward runs point-to-point and collective calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch
import torch.distributed as dist

from schedlang.kernels import chunk_gla, chunk_simple_gla
from schedlang.runtime.allgather_scan import allgather_scan
from schedlang.runtime.allscan import allscan_scan
from schedlang.runtime.ring import ring_scan
from schedlang.runtime.scan_common import ScanDirection, ScanPosition, ScanResult
from schedlang.vocabulary import SequenceParallelMethod


class GateKind(str, Enum):
    """Shape of the log-decay ``g``: per key dimension (GLA) or one per head (simple GLA)."""

    VECTOR = "vector"  # g: [B, T, H, K], kernel chunk_gla
    SCALAR = "scalar"  # g: [B, T, H], kernel chunk_simple_gla


@dataclass(frozen=True)
class ScanConfig:
    """Everything about the scan that is not a tensor."""

    group: dist.ProcessGroup | None
    method: SequenceParallelMethod
    scan_blocks: int
    output_final_state: bool


def scan_states(
    local: torch.Tensor,
    decay: torch.Tensor,
    boundary: torch.Tensor | None,
    config: ScanConfig,
    direction: ScanDirection,
) -> ScanResult:
    """Dispatch the decayed scan (see ``schedlang.runtime.scan_common``) to one method."""
    position = ScanPosition.of(config.group, direction)
    if position.size == 1:
        carry_in = boundary if boundary is not None else torch.zeros_like(local)
        carry_out = torch.addcmul(local, decay, carry_in)
        return ScanResult(carry_in=carry_in, carry_out=carry_out, last_carry_out=carry_out)
    if config.method is SequenceParallelMethod.ALLSCAN:
        return allscan_scan(local, decay, boundary, position, config.scan_blocks)
    if config.method is SequenceParallelMethod.RING:
        return ring_scan(local, decay, boundary, position)
    return allgather_scan(local, decay, boundary, position)


def _last_carry_everywhere(result: ScanResult, config: ScanConfig, direction: ScanDirection) -> torch.Tensor:
    """The carry leaving the last rank of the scan, on every rank (broadcast if needed)."""
    if result.last_carry_out is not None:
        return result.last_carry_out
    position = ScanPosition.of(config.group, direction)
    carry = result.carry_out if position.is_last else torch.empty_like(result.carry_out)
    dist.broadcast(carry, group=config.group, group_src=position.last_rank)
    return carry


class StateScanFunction(torch.autograd.Function):
    """``(S_local, gamma, initial_state) -> (S_in, final_state)`` across the group.

    Shapes: ``S_local`` ``[B, H, K, V]``; ``gamma`` ``[B, H, K]`` (vector gate)
    or ``[B, H]`` (scalar gate); ``initial_state`` ``[B, H, K, V]`` or None.
    ``final_state`` is returned only when ``config.output_final_state``.
    Backward: [Note: sequence-parallel gradients].
    """

    @staticmethod
    def forward(ctx, local_state, gamma, initial_state, config: ScanConfig):
        decay = _decay_view(gamma)
        rank = dist.get_rank(config.group)
        boundary = initial_state if rank == 0 else None
        result = scan_states(local_state, decay, boundary, config, ScanDirection.FORWARD)
        ctx.config = config
        ctx.gamma_shape = gamma.shape
        ctx.initial_state_given = initial_state is not None
        ctx.save_for_backward(decay, result.carry_in)
        if not config.output_final_state:
            return result.carry_in
        final_state = _last_carry_everywhere(result, config, ScanDirection.FORWARD)
        return result.carry_in, final_state

    @staticmethod
    def backward(ctx, grad_state_in, grad_final_state=None):
        config: ScanConfig = ctx.config
        decay, state_in = ctx.saved_tensors
        position = ScanPosition.of(config.group, ScanDirection.REVERSE)
        boundary = None
        if config.output_final_state:
            # final_state was a broadcast from the last rank: its adjoint sums the
            # gradients of every rank's copy onto the last rank.
            boundary = grad_final_state.contiguous().clone()
            if position.size > 1:
                dist.reduce(boundary, group=config.group, group_dst=position.first_rank)
            if not position.is_first:
                boundary = None
        result = scan_states(grad_state_in.contiguous(), decay, boundary, config, ScanDirection.REVERSE)
        grad_local_state = result.carry_in
        grad_gamma = (grad_local_state * state_in).sum(dim=-1)
        if len(ctx.gamma_shape) == 2:
            grad_gamma = grad_gamma.sum(dim=-1)
        grad_initial_state = None
        if ctx.initial_state_given:
            grad_initial_state = result.carry_out if position.rank == 0 else torch.zeros_like(state_in)
        return grad_local_state, grad_gamma, grad_initial_state, None


def _decay_view(gamma: torch.Tensor) -> torch.Tensor:
    """``[B, H, K]`` -> ``[B, H, K, 1]``; ``[B, H]`` -> ``[B, H, 1, 1]`` (broadcast over the state)."""
    if gamma.dim() == 2:
        return gamma[:, :, None, None].contiguous()
    return gamma[..., None].contiguous()


def sequence_parallel_combine(
    o_local: torch.Tensor,
    local_state: torch.Tensor,
    q: torch.Tensor,
    g: torch.Tensor,
    *,
    group: dist.ProcessGroup | None,
    method: SequenceParallelMethod | str,
    scan_blocks: int,
    scale: float,
    gate: GateKind | str,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Turn one rank's zero-state kernel results into the exact sequence-parallel output.

    This is steps 2 and 3 of the module docstring; the kernel call (step 1) is
    :func:`sequence_parallel_chunk_gla`'s job, kept apart so any kernel that
    returns ``(o_local, S_local)`` from a zero state can be used.

    Args:
        o_local: ``[B, T_p, H, V]`` this rank's output computed from a zero state.
        local_state: ``[B, H, K, V]`` this rank's final state from a zero state.
        q: ``[B, T_p, H, K]`` queries (unscaled).
        g: ``[B, T_p, H, K]`` (vector gate) or ``[B, T_p, H]`` (scalar) log-decays.
        scale: the query scale the kernel used.
        initial_state: ``[B, H, K, V]`` state before the span, read on group rank 0.

    Returns:
        ``(o, final_state)``; ``final_state`` is None unless requested.
    """
    method = SequenceParallelMethod(method)
    gate = GateKind(gate)
    _check_arguments(local_state, q, g, gate, scan_blocks, method)
    state_dtype = local_state.dtype
    gate_cumsum = g.to(state_dtype).cumsum(dim=1)
    gamma = gate_cumsum[:, -1].exp()
    token_decay = gate_cumsum.exp()
    if gate is GateKind.SCALAR:
        token_decay = token_decay[..., None]
    config = ScanConfig(
        group=group,
        method=method,
        scan_blocks=scan_blocks,
        output_final_state=output_final_state,
    )
    if initial_state is not None:
        initial_state = initial_state.to(state_dtype)
    scanned = StateScanFunction.apply(local_state, gamma, initial_state, config)
    state_in, final_state = scanned if output_final_state else (scanned, None)
    query_decayed = q.to(state_dtype) * scale * token_decay
    correction = torch.einsum("bthk,bhkv->bthv", query_decayed, state_in)
    o = (o_local.to(state_dtype) + correction).to(o_local.dtype)
    return o, final_state


def _check_arguments(
    local_state: torch.Tensor,
    q: torch.Tensor,
    g: torch.Tensor,
    gate: GateKind,
    scan_blocks: int,
    method: SequenceParallelMethod,
) -> None:
    expected_gate_dims = 4 if gate is GateKind.VECTOR else 3
    if g.dim() != expected_gate_dims:
        raise ValueError(
            f"gate={gate.value!r} needs g with {expected_gate_dims} dims "
            f"({'[B, T, H, K]' if gate is GateKind.VECTOR else '[B, T, H]'}), got shape {tuple(g.shape)}"
        )
    if q.shape[1] == 0:
        raise ValueError("every rank of the sequence-parallel group needs at least one token")
    key_dim = local_state.shape[-2]
    if method is SequenceParallelMethod.ALLSCAN and not 1 <= scan_blocks <= key_dim:
        raise ValueError(
            f"allscan(blocks = {scan_blocks}) needs 1 <= blocks <= key head dim ({key_dim}): "
            "the blocks are groups of state rows"
        )


def sequence_parallel_chunk_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    *,
    group: dist.ProcessGroup | None,
    method: SequenceParallelMethod | str,
    scan_blocks: int,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    scale: float | None = None,
    backend: str = "auto",
    gate: GateKind | str = GateKind.VECTOR,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """GLA (vector gate) or simple GLA (scalar gate) over a span split across ``group``.

    Each rank passes its contiguous slice of the span; the result equals the
    matching slice of the single-device kernel on the whole span started from
    ``initial_state``. See the module docstring for the method and
    [Note: sequence-parallel gradients] for which ranks' gradients count.

    Args:
        q, k: ``[B, T_p, H, K]``; v: ``[B, T_p, H, V]``.
        g: ``[B, T_p, H, K]`` for ``gate="vector"``, ``[B, T_p, H]`` for ``"scalar"``:
            log-space forget gates (``<= 0``).
        group: the sequence-parallel process group (None: the default group).
        method: :class:`SequenceParallelMethod` (or the lowering enum / its value).
        scan_blocks: All-Scan pipeline depth, ``1 <= scan_blocks <= K``; ignored by
            the other methods.
        backend: passed to the kernel: "torch" (PyTorch path, any device), "triton"
            (CUDA, or Triton's interpreter), "auto" (the kernel's choice).
        initial_state: ``[B, H, K, V]`` state before the span, read on group rank 0.
        output_final_state: also return the state after the span, on every rank.
        scale: query scale, default ``K ** -0.5``.

    Returns:
        ``(o, final_state)``: ``o`` ``[B, T_p, H, V]``; ``final_state`` ``[B, H, K, V]``
        float32 (or None when not requested).
    """
    gate = GateKind(gate)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    kernel = chunk_gla if gate is GateKind.VECTOR else chunk_simple_gla
    o_local, local_state = kernel(
        q, k, v, g, scale=scale, initial_state=None, output_final_state=True, backend=backend
    )
    return sequence_parallel_combine(
        o_local,
        local_state,
        q,
        g,
        group=group,
        method=method,
        scan_blocks=scan_blocks,
        scale=scale,
        gate=gate,
        initial_state=initial_state,
        output_final_state=output_final_state,
    )
