"""Shared pieces of the cross-rank state scans: direction, rank position, the combine step.

A *decayed scan* over the ranks ``0 .. P-1`` of a process group takes, on every
rank ``p``, a local term ``x(p)`` (shape ``[B, H, K, V]``) and a decay ``d(p)``
(broadcastable to it: ``[B, H, K, 1]`` or ``[B, H, 1, 1]``), plus a boundary
value ``b`` known on the first rank of the scan direction, and produces on
every rank

    carry_in(first)  = b                         (zeros when no boundary is given)
    carry_out(p)     = d(p) * carry_in(p) + x(p)
    carry_in(next)   = carry_out(p)

The forward pass of sequence parallelism scans states from rank 0 upwards
(``carry_in`` is the state entering a rank); the backward pass scans state
gradients from the last rank downwards with the same decays (see
[Note: sequence-parallel gradients] in ``schedlang.runtime.sequence_parallel``).
Each method (All-Scan, ring, all-gather) implements this one contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

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


def combine(decay: torch.Tensor, carry: torch.Tensor | None, local: torch.Tensor) -> torch.Tensor:
    """One scan step: ``decay * carry + local``; a missing carry is zero."""
    if carry is None:
        return local.clone()
    return torch.addcmul(local, decay, carry)


def split_rows(tensor: torch.Tensor, n_blocks: int) -> list[torch.Tensor]:
    """Split a ``[B, H, K, X]`` tensor into ``n_blocks`` contiguous blocks of K rows.

    A decay with a single row (scalar gate: ``[B, H, 1, 1]``) applies to every
    block, so it is repeated instead of split.
    """
    if tensor.shape[-2] == 1:
        return [tensor] * n_blocks
    return [block.contiguous() for block in torch.tensor_split(tensor, n_blocks, dim=-2)]
