"""Exact, differentiable sequence-parallel GLA and Gated DeltaNet over the ranks of one process group.

The tokens of one span are split contiguously over the ``P`` ranks of a group
(rank ``p`` holds positions ``t_p .. t_{p+1} - 1``; lengths may differ). ZeCO's
formulation, as phases of the single-device operator ([Note: span phases] in
``schedlang.kernels.common.function``):

1. each rank prepares its chunks (gate sums and per-chunk state updates, which
   need no state) and reads from them ``S_local(p)``, its final state from a
   zero initial state, and ``gamma(p) = exp(sum of g over its tokens)`` (per key
   row for ``gla``, one scalar per head for ``simple_gla``);
2. a cross-rank scan gives the state entering each rank,
   ``S_in(0) = initial_state`` and ``S_in(p) = gamma(p-1) * S_in(p-1) + S_local(p-1)``;
3. each rank finishes the operator from ``S_in(p)``: its outputs and final
   state are exactly those of the single-device operator on the whole span.

The backward mirrors it ([Note: sequence-parallel gradients]). Three methods
implement the scan: :class:`SequenceParallelMethod`.

The gated delta rule's transition across a span is a ``[K, K]`` matrix, not a
decay ([Note: gdn span map] in ``schedlang.kernels.gdn.span``):
:func:`sequence_parallel_gated_delta_rule` scans ``(M(p), S_local(p))`` pairs
with the same three methods ([Note: transitions] in
``schedlang.runtime.scan_common``) and the same rank contract.

[Note: sequence-parallel gradients]
Write ``S_out(p) = gamma(p) * S_in(p) + S_local(p)`` (so ``S_in(p+1) = S_out(p)``
and ``final_state = S_out(P-1)``; for the gated delta rule read ``gamma(p) *``
as ``M(p) @`` and, below, ``gamma(p) * A(p)`` as ``M(p)^T @ A(p)``). Let
``dS_in(p)`` be the gradient rank ``p``'s own outputs send into ``S_in(p)``
(its backward from a zero final-state gradient) and ``A(p)`` the total
gradient of ``S_out(p)``. Then

    A(P-1)   = sum over ranks of the gradients given to final_state
    B(p)     = dS_in(p) + gamma(p) * A(p)          total gradient of S_in(p)
    A(p-1)   = B(p)
    d initial_state = B(0)

which is the same scan run from the last rank down, with local term
``dS_in(p)``, the adjoint transitions (for GLA the same decays), and boundary
``A(P-1)``. Each rank sends one state gradient, as many bytes as the forward, then finishes the operator's
backward from ``S_in(p)`` and ``A(p)``: the gradients of its q, k, v and g,
including those through ``gamma(p)``, are the single-device operator's.

[Note: local terms on demand]
A rank reads its local term (``S_local`` in the forward, ``dS_in`` in the
backward: one store-free pass over its chunk updates) only when the term
enters the scan. In the ring and All-Scan the last rank of each direction
sends nothing, so it scans a zero instead: on two ranks each rank reads one
local term per step, not two. The last rank's final state is then its own
kernel's, broadcast to the others.

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

from schedlang.kernels.common import check_recurrence_arguments
from schedlang.kernels.common.function import Implementation
from schedlang.kernels.gdn.span import gated_delta_span
from schedlang.kernels.gla.chunk import implementation_for as gla_implementation
from schedlang.kernels.simple_gla.chunk import implementation_for as simple_gla_implementation
from schedlang.runtime.allgather_scan import allgather_scan
from schedlang.runtime.allscan import allscan_scan
from schedlang.runtime.ring import ring_scan
from schedlang.runtime.scan_common import (
    DiagonalDecay,
    MatrixTransition,
    ScanDirection,
    ScanPosition,
    ScanResult,
    Transition,
    combine,
)
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
    transition: Transition,
    boundary: torch.Tensor | None,
    config: ScanConfig,
    direction: ScanDirection,
) -> ScanResult:
    """Dispatch the state scan (see ``schedlang.runtime.scan_common``) to one method."""
    position = ScanPosition.of(config.group, direction)
    if position.size == 1:
        carry_in = boundary if boundary is not None else torch.zeros_like(local)
        carry_out = combine(transition, carry_in, local)
        return ScanResult(carry_in=carry_in, carry_out=carry_out, last_carry_out=carry_out)
    if config.method is SequenceParallelMethod.ALLSCAN:
        return allscan_scan(local, transition, boundary, position, config.scan_blocks)
    if config.method is SequenceParallelMethod.RING:
        return ring_scan(local, transition, boundary, position)
    return allgather_scan(local, transition, boundary, position)


def _sends_local_term(config: ScanConfig, direction: ScanDirection) -> bool:
    """Whether this rank's local term enters the scan: every rank's does in an all-gather, and in the
    point-to-point methods every rank's but the last one's in the scan's direction, whose carry out goes
    nowhere ([Note: local terms on demand])."""
    return config.method is SequenceParallelMethod.ALLGATHER or not ScanPosition.of(config.group, direction).is_last


def _final_state_everywhere(result: ScanResult, kernel_final_state: torch.Tensor, config: ScanConfig) -> torch.Tensor:
    """The state after the span on every rank: the all-gather's combined value, or the last rank's own final
    state broadcast from there."""
    if result.last_carry_out is not None:
        return result.last_carry_out
    position = ScanPosition.of(config.group, ScanDirection.FORWARD)
    final_state = kernel_final_state.contiguous() if position.is_last else torch.empty_like(result.carry_in)
    dist.broadcast(final_state, group=config.group, group_src=position.last_rank)
    return final_state


@dataclass(frozen=True)
class SpanConfig:
    """What the sequence-parallel Function needs besides tensors."""

    scan: ScanConfig
    scale: float
    implementation: Implementation
    save_states: bool


class SequenceParallelFunction(torch.autograd.Function):
    """``(q, k, v, g, initial_state) -> (o, final_state)`` for this rank's tokens of a span split over the group.

    Shapes as :func:`sequence_parallel_chunk_gla`; ``final_state`` is None unless
    ``config.scan.output_final_state``. Backward: [Note: sequence-parallel gradients].
    """

    @staticmethod
    def forward(ctx, q, k, v, g, initial_state, config: SpanConfig):
        implementation = config.implementation
        group = config.scan.group
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        prepared = implementation.prepare_forward(q, k, v, g)
        decay = _decay_view(implementation.total_log_decay(prepared).exp())
        boundary = initial_state.to(decay.dtype) if (initial_state is not None and rank == 0) else None
        state_in, final_state = boundary, None
        result = None
        if size > 1:
            if _sends_local_term(config.scan, ScanDirection.FORWARD):
                local_state = implementation.local_final_state(prepared)
            else:
                local_state = _zero_state(q, v, decay.dtype)
            result = scan_states(local_state, DiagonalDecay(decay), boundary, config.scan, ScanDirection.FORWARD)
            if rank > 0:
                state_in = result.carry_in
        o, kernel_final_state, saved_states = implementation.finish_forward(
            prepared, q, k, v, g, config.scale, state_in, config.save_states
        )
        if config.scan.output_final_state:
            final_state = kernel_final_state
            if result is not None:
                final_state = _final_state_everywhere(result, kernel_final_state, config.scan)
        ctx.config = config
        ctx.initial_state_given = initial_state is not None
        ctx.save_for_backward(q, k, v, g, state_in, decay, saved_states)
        return o, final_state

    @staticmethod
    def backward(ctx, grad_output, grad_final_state):
        config: SpanConfig = ctx.config
        implementation = config.implementation
        q, k, v, g, state_in, decay, saved_states = ctx.saved_tensors
        group = config.scan.group
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        do = (grad_output if grad_output is not None else torch.zeros_like(v)).contiguous()
        prepared = implementation.prepare_backward(q, k, v, g, do, config.scale, saved_states)
        if config.scan.output_final_state and grad_final_state is None:
            grad_final_state = torch.zeros(decay.shape[:2] + (q.shape[-1], v.shape[-1]), dtype=decay.dtype, device=q.device)
        state_out_grad = grad_final_state
        if size > 1:
            position = ScanPosition.of(group, ScanDirection.REVERSE)
            boundary = None
            if config.scan.output_final_state:
                # final_state was a broadcast from the last rank: its adjoint sums every rank's gradient there.
                boundary = grad_final_state.to(decay.dtype).contiguous().clone()
                dist.reduce(boundary, group=group, group_dst=position.first_rank)
                if not position.is_first:
                    boundary = None
            if _sends_local_term(config.scan, ScanDirection.REVERSE):
                local_grad = implementation.local_initial_state_gradient(prepared)
            else:
                local_grad = _zero_state(q, v, decay.dtype)
            result = scan_states(
                local_grad, DiagonalDecay(decay).transposed(), boundary, config.scan, ScanDirection.REVERSE
            )
            state_out_grad = result.carry_in
        dq, dk, dv, dg, d_initial = implementation.finish_backward(
            prepared, q, k, v, g, config.scale, state_in, do, state_out_grad, saved_states
        )
        grad_initial_state = None
        if ctx.initial_state_given:
            grad_initial_state = d_initial if rank == 0 else torch.zeros_like(d_initial)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg.to(g.dtype), grad_initial_state, None


def _zero_state(q: torch.Tensor, v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(q.shape[0], q.shape[2], q.shape[3], v.shape[3], dtype=dtype, device=q.device)


def _decay_view(gamma: torch.Tensor) -> torch.Tensor:
    """``[B, H, K]`` -> ``[B, H, K, 1]``; ``[B, H]`` -> ``[B, H, 1, 1]`` (broadcast over the state)."""
    if gamma.dim() == 2:
        return gamma[:, :, None, None].contiguous()
    return gamma[..., None].contiguous()


def _check_arguments(
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
    _check_scan_blocks(method, scan_blocks, q.shape[-1], "key head dim", "rows")


def _check_scan_blocks(method: SequenceParallelMethod, scan_blocks: int, extent: int, dim_name: str, part: str) -> None:
    """All-Scan cuts the state into at most one block per row (decays) or column (matrices) of it."""
    if method is SequenceParallelMethod.ALLSCAN and not 1 <= scan_blocks <= extent:
        raise ValueError(
            f"allscan(blocks = {scan_blocks}) needs 1 <= blocks <= {dim_name} ({extent}): "
            f"the blocks are groups of state {part}"
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
    save_states: bool = False,
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
        method: :class:`SequenceParallelMethod` (the vocabulary's enum) or its string value.
        scan_blocks: All-Scan pipeline depth, ``1 <= scan_blocks <= K``; ignored by
            the other methods.
        backend: the kernel backend: "torch" (PyTorch path, any device), "triton"
            (CUDA, or Triton's interpreter), "auto" (the kernel's choice).
        initial_state: ``[B, H, K, V]`` state before the span, read on group rank 0.
        output_final_state: also return the state after the span, on every rank.
        scale: query scale, default ``K ** -0.5``.
        save_states: keep the chunk states for the backward (the kernels' option).

    Returns:
        ``(o, final_state)``: ``o`` ``[B, T_p, H, V]``; ``final_state`` ``[B, H, K, V]``
        float32 (or None when not requested).
    """
    method = SequenceParallelMethod(method)
    gate = GateKind(gate)
    _check_arguments(q, g, gate, scan_blocks, method)
    check_recurrence_arguments(q, k, v, g, initial_state, gate_per_key=gate is GateKind.VECTOR)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    implementation_for = gla_implementation if gate is GateKind.VECTOR else simple_gla_implementation
    config = SpanConfig(
        scan=ScanConfig(group=group, method=method, scan_blocks=scan_blocks, output_final_state=output_final_state),
        scale=float(scale),
        implementation=implementation_for(backend, q),
        save_states=bool(save_states),
    )
    return SequenceParallelFunction.apply(q, k, v, g, initial_state, config)


class StateScanFunction(torch.autograd.Function):
    """``(local, transition tensor, initial_state) -> (state_in, final_state)``: the scan of
    ``schedlang.runtime.scan_common`` as a differentiable function of every rank's pair.

    ``transition_kind`` builds the :class:`Transition` from its tensor. ``state_in`` is the carry entering
    this rank; ``final_state`` (None unless ``config.output_final_state``) the carry leaving the last rank,
    on every rank. The rank contract of the module docstring holds: ``initial_state`` is read on group rank
    0 only and the gradients given to ``final_state`` on all ranks are summed. Backward: the reverse scan
    with the adjoint transitions ([Note: sequence-parallel gradients]); the gradient of ``S_out(p)`` it
    leaves on rank ``p`` is the local term's, and the transition's follows from it and ``S_in(p)``.
    """

    @staticmethod
    def forward(ctx, local, transition_tensor, initial_state, transition_kind, config: ScanConfig):
        position = ScanPosition.of(config.group, ScanDirection.FORWARD)
        transition = transition_kind(transition_tensor)
        boundary = initial_state.to(local.dtype) if (initial_state is not None and position.is_first) else None
        result = scan_states(local, transition, boundary, config, ScanDirection.FORWARD)
        state_in = result.carry_in.clone() if result.carry_in is initial_state else result.carry_in
        final_state = None
        if config.output_final_state:
            final_state = _final_state_everywhere(result, result.carry_out, config)
        ctx.config = config
        ctx.transition_kind = transition_kind
        ctx.initial_state_given = initial_state is not None
        ctx.initial_state_dtype = None if initial_state is None else initial_state.dtype
        ctx.save_for_backward(transition_tensor, state_in)
        return state_in, final_state

    @staticmethod
    def backward(ctx, grad_state_in, grad_final_state):
        config: ScanConfig = ctx.config
        transition_tensor, state_in = ctx.saved_tensors
        position = ScanPosition.of(config.group, ScanDirection.REVERSE)
        local_grad = grad_state_in if grad_state_in is not None else torch.zeros_like(state_in)
        boundary = None
        if config.output_final_state:
            boundary = grad_final_state if grad_final_state is not None else torch.zeros_like(state_in)
            boundary = boundary.to(state_in.dtype).contiguous().clone()
            if position.size > 1:
                # final_state was a broadcast from the last rank: its adjoint sums every rank's gradient there.
                dist.reduce(boundary, group=config.group, group_dst=position.first_rank)
                if not position.is_first:
                    boundary = None
        transition = ctx.transition_kind(transition_tensor)
        result = scan_states(local_grad.contiguous(), transition.transposed(), boundary, config, ScanDirection.REVERSE)
        state_out_grad = result.carry_in
        grad_initial_state = None
        if ctx.initial_state_given:
            grad_initial_state = result.carry_out if position.rank == 0 else torch.zeros_like(result.carry_out)
            grad_initial_state = grad_initial_state.to(ctx.initial_state_dtype)
        return state_out_grad, transition.gradient(state_in, state_out_grad), grad_initial_state, None, None


def sequence_parallel_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    group: dist.ProcessGroup | None,
    method: SequenceParallelMethod | str,
    scan_blocks: int,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    scale: float | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The gated delta rule (``schedlang.kernels.chunk_gated_delta_rule``) over a span split across ``group``.

    Each rank passes its contiguous slice of the span; the result equals the matching slice of the
    single-device operator on the whole span started from ``initial_state``. Each rank reads its span's
    affine map ``(M, S_local)`` ([Note: gdn span map]), the ranks scan the pairs (:class:`StateScanFunction`,
    with :class:`MatrixTransition`), and each rank forms its outputs from the state entering it. The rank
    contract for ``initial_state`` and ``final_state`` is the module docstring's.

    Args:
        q, k: ``[B, T_p, H_q, K]`` (k L2-normalised per head), ``H_q`` dividing ``H`` (grouped value heads,
            kept that narrow into the operator); v: ``[B, T_p, H, V]``.
        g: ``[B, T_p, H]`` log forget gate (``<= 0``); beta: ``[B, T_p, H]`` write strength.
        group: the sequence-parallel process group (None: the default group).
        method: :class:`SequenceParallelMethod` (the vocabulary's enum) or its string value.
        scan_blocks: All-Scan pipeline depth, ``1 <= scan_blocks <= V`` (blocks of value columns, which the
            transition never mixes); ignored by the other methods.
        initial_state: ``[B, H, K, V]`` state before the span, read on group rank 0.
        output_final_state: also return the state after the span, on every rank.
        scale: query scale, default ``K ** -0.5``.
        backend: the operator's backend ("auto", "triton" or "torch").

    Returns:
        ``(o, final_state)``: ``o`` ``[B, T_p, H, V]`` in v's dtype; ``final_state`` ``[B, H, K, V]`` in the
        state dtype (float32, or float64 for float64 inputs), or None when not requested.
    """
    method = SequenceParallelMethod(method)
    if q.shape[1] == 0:
        raise ValueError("every rank of the sequence-parallel group needs at least one token")
    check_recurrence_arguments(q, k, v, g, initial_state, gate_per_key=False, grouped_queries=True)
    _check_scan_blocks(method, scan_blocks, v.shape[-1], "value head dim", "columns")
    if scale is None:
        scale = q.shape[-1] ** -0.5
    span = gated_delta_span(q, k, v, g, beta, float(scale), backend)
    config = ScanConfig(group=group, method=method, scan_blocks=scan_blocks, output_final_state=output_final_state)
    state_in, final_state = StateScanFunction.apply(
        span.local_final_state.contiguous(), span.transition.contiguous(), initial_state, MatrixTransition, config
    )
    return span.output(state_in).to(v.dtype), final_state
