"""LASP-2 all-gather: every rank gathers all local terms and combines the prefix itself.

One ``all_gather`` moves every rank's ``(x(p), T(p))`` to every rank: each rank
receives ``(P - 1)`` states, and the whole exchange finishes after about
``P * tau(state + transition)`` on a ring all-gather, but all ranks then compute in
parallel, with no chain of dependent hops. The first rank folds the boundary
into what it contributes (it sends its ``carry_out`` instead of ``x``), so the
boundary itself never travels.

Every rank runs the same combines over the same gathered tensors in the same
order, so the carry leaving the last rank is computed identically everywhere
and is returned as ``last_carry_out`` without a broadcast.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from schedlang.runtime.scan_common import ScanPosition, ScanResult, Transition, combine, entering_carry


def allgather_scan(
    local: torch.Tensor,
    transition: Transition,
    boundary: torch.Tensor | None,
    position: ScanPosition,
) -> ScanResult:
    """Run the state scan of ``schedlang.runtime.scan_common`` from one all-gather (its arguments:
    :class:`~schedlang.runtime.scan_common.StateScan`)."""
    contributed = combine(transition, boundary, local) if position.is_first else local
    payload = torch.cat([contributed.reshape(-1), transition.payload()])
    gathered = [torch.empty_like(payload) for _ in range(position.size)]
    dist.all_gather(gathered, payload, group=position.group)

    n_state = contributed.numel()
    carry = None
    carry_in = carry_out = None
    for group_rank in position.order:
        if group_rank == position.rank:
            carry_in = entering_carry(boundary, local) if position.is_first else carry
        if group_rank == position.first_rank:
            carry = gathered[group_rank][:n_state].view_as(local)
        else:
            rank_local = gathered[group_rank][:n_state].view_as(local)
            rank_transition = transition.from_payload(gathered[group_rank][n_state:])
            carry = combine(rank_transition, carry, rank_local)
        if group_rank == position.rank:
            carry_out = carry
    return ScanResult(carry_in=carry_in, carry_out=carry_out, last_carry_out=carry)
