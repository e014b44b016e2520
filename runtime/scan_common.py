"""Shared pieces of the cross-rank state scans: direction, rank position, transitions, the combine step.

A *state scan* over the ranks ``0 .. P-1`` of a process group takes, on every
rank ``p``, a local term ``x(p)`` (shape ``[B, H, K, V]``) and a transition
``T(p)`` (a linear map of states, :class:`Transition`), plus a boundary value
``b`` known on the first rank of the scan direction, and produces on every rank

    carry_in(first)  = b                         (zeros when no boundary is given)
    carry_out(p)     = T(p)(carry_in(p)) + x(p)
    carry_in(next)   = carry_out(p)

Each rank's span of tokens maps the state entering it affinely to the state
leaving it, so the pair ``(T(p), x(p))`` is all a rank contributes. Pairs
compose associatively, ``(T2, x2) o (T1, x1) = (T2 T1, T2(x1) + x2)``; the three
methods (All-Scan, ring, all-gather) fold them in rank order and implement this
one contract for every transition.

[Note: transitions]
The transition is the one place the recurrences differ. GLA and simple GLA
decay each state row (:class:`DiagonalDecay`, ``d * S`` with ``d`` of shape
``[B, H, K, 1]`` or ``[B, H, 1, 1]``); the gated delta rule mixes rows
(:class:`MatrixTransition`, ``M @ S`` with ``M`` of shape ``[B, H, K, K]``).
The backward scans state gradients from the last rank down with the adjoint
maps (``transition.transposed()``: a decay is its own adjoint, a matrix's is
``M^T``); see [Note: sequence-parallel gradients] in
``schedlang.runtime.sequence_parallel``. A transition also says along which
state axis the map never mixes entries (``block_axis``): All-Scan cuts the
state into blocks along it (key rows for a decay, value columns for a matrix),
and a block of the state goes with the matching block of the transition
(``blocks``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol

import torch
import torch.distributed as dist


class ScanDirection(str, Enum):
    """Which way carries travel through the ranks of the group."""

    FORWARD = "forward"  # rank 0 -> rank P-1: states in the forward pass
    REVERSE = "reverse"  # rank P-1 -> rank 0: state gradients in the backward pass


@dataclass(frozen=True)
class ScanPosition:
    """Where this process stands in a scan over ``group``, in group ranks."""

    group: dist.ProcessGroup | None
    size: int
    rank: int
    direction: ScanDirection

    @classmethod
    def of(cls, group: dist.ProcessGroup | None, direction: ScanDirection) -> "ScanPosition":
        return cls(
            group=group,
            size=dist.get_world_size(group),
            rank=dist.get_rank(group),
            direction=direction,
        )

    @property
    def order(self) -> list[int]:
        """Group ranks in the order the carry visits them."""
        ranks = list(range(self.size))
        return ranks if self.direction is ScanDirection.FORWARD else ranks[::-1]

    @property
    def first_rank(self) -> int:
        return self.order[0]

    @property
    def last_rank(self) -> int:
        return self.order[-1]

    @property
    def is_first(self) -> bool:
        return self.rank == self.first_rank

    @property
    def is_last(self) -> bool:
        return self.rank == self.last_rank

    @property
    def previous_rank(self) -> int:
        """The group rank this one receives its carry from (only when not first)."""
        return self.rank - 1 if self.direction is ScanDirection.FORWARD else self.rank + 1

    @property
    def next_rank(self) -> int:
        """The group rank this one sends its carry to (only when not last)."""
        return self.rank + 1 if self.direction is ScanDirection.FORWARD else self.rank - 1


@dataclass(frozen=True)
class ScanResult:
    """What a scan leaves on one rank.

    ``last_carry_out`` is the carry leaving the last rank of the direction when
    the method computes it on every rank anyway (all-gather); point-to-point
    methods leave it ``None`` and the caller broadcasts it if needed.
    """

    carry_in: torch.Tensor
    carry_out: torch.Tensor
    last_carry_out: torch.Tensor | None = None


class StateScan(Protocol):
    """One method of the state scan (All-Scan, ring, all-gather): what every rank of the group passes it.

    Args:
        local: ``[B, H, K, V]`` this rank's local term ``x(p)``.
        transition: this rank's transition ``T(p)``.
        boundary: ``[B, H, K, V]`` carry entering the first rank; read only there.
        position: this rank's place in the scan.
    """

    def __call__(
        self, local: torch.Tensor, transition: "Transition", boundary: torch.Tensor | None, position: ScanPosition
    ) -> ScanResult: ...


class Transition(Protocol):
    """The linear part of one rank's affine state map ([Note: transitions])."""

    block_axis: int
    """The state axis (-2: key rows, -1: value columns) along which the map never mixes entries."""

    def step(self, carry: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        """``T(carry) + local``."""

    def transposed(self) -> "Transition":
        """The adjoint map, which carries state gradients back through the span."""

    def blocks(self, n_blocks: int) -> list["Transition"]:
        """The maps of the ``n_blocks`` blocks of the state along ``block_axis`` (``split_state``)."""

    def payload(self) -> torch.Tensor:
        """The map as one flat tensor, for collectives."""

    def from_payload(self, payload: torch.Tensor) -> "Transition":
        """A map of this one's kind and shape read back from ``payload``."""

    def gradient(self, carry_in: torch.Tensor, carry_out_grad: torch.Tensor) -> torch.Tensor:
        """The gradient of the map's own tensor, given the carry it was applied to and the gradient of
        ``step``'s result."""


@dataclass(frozen=True)
class DiagonalDecay:
    """``T(S) = decay * S``: GLA's per-row decay ``[B, H, K, 1]`` or simple GLA's ``[B, H, 1, 1]``."""

    decay: torch.Tensor
    block_axis = -2

    def step(self, carry: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(local, self.decay, carry)

    def transposed(self) -> "DiagonalDecay":
        return self

    def blocks(self, n_blocks: int) -> list["DiagonalDecay"]:
        return [DiagonalDecay(block) for block in split_rows(self.decay, n_blocks)]

    def payload(self) -> torch.Tensor:
        return self.decay.reshape(-1)

    def from_payload(self, payload: torch.Tensor) -> "DiagonalDecay":
        return DiagonalDecay(payload.view_as(self.decay))

    def gradient(self, carry_in: torch.Tensor, carry_out_grad: torch.Tensor) -> torch.Tensor:
        per_row = (carry_in * carry_out_grad).sum(dim=-1, keepdim=True)
        return per_row.sum(dim=-2, keepdim=True) if self.decay.shape[-2] == 1 else per_row


@dataclass(frozen=True)
class MatrixTransition:
    """``T(S) = matrix @ S`` with ``matrix`` ``[B, H, K, K]``: the gated delta rule's span map, which mixes key
    rows but never value columns."""

    matrix: torch.Tensor
    block_axis = -1

    def step(self, carry: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        return local + self.matrix @ carry

    def transposed(self) -> "MatrixTransition":
        return MatrixTransition(self.matrix.transpose(-1, -2))

    def blocks(self, n_blocks: int) -> list["MatrixTransition"]:
        return [self] * n_blocks

    def payload(self) -> torch.Tensor:
        return self.matrix.reshape(-1)

    def from_payload(self, payload: torch.Tensor) -> "MatrixTransition":
        return MatrixTransition(payload.view(self.matrix.shape))

    def gradient(self, carry_in: torch.Tensor, carry_out_grad: torch.Tensor) -> torch.Tensor:
        return carry_out_grad @ carry_in.transpose(-1, -2)


def entering_carry(boundary: torch.Tensor | None, local: torch.Tensor) -> torch.Tensor:
    """The carry entering the first rank of a scan: the boundary, or zeros shaped like ``local`` without one."""
    return boundary if boundary is not None else torch.zeros_like(local)


def combine(transition: Transition, carry: torch.Tensor | None, local: torch.Tensor) -> torch.Tensor:
    """One scan step: ``T(carry) + local``; a missing carry is zero."""
    if carry is None:
        return local.clone()
    return transition.step(carry, local)


def split_state(state: torch.Tensor, n_blocks: int, axis: int) -> list[torch.Tensor]:
    """Cut a ``[B, H, K, V]`` state into ``n_blocks`` contiguous blocks along ``axis`` (-2 or -1)."""
    return [block.contiguous() for block in torch.tensor_split(state, n_blocks, dim=axis)]


def split_rows(tensor: torch.Tensor, n_blocks: int) -> list[torch.Tensor]:
    """Split a ``[B, H, K, X]`` tensor into ``n_blocks`` contiguous blocks of K rows.

    A decay with a single row (scalar gate: ``[B, H, 1, 1]``) applies to every
    block, so it is repeated instead of split.
    """
    if tensor.shape[-2] == 1:
        return [tensor] * n_blocks
    return split_state(tensor, n_blocks, -2)
