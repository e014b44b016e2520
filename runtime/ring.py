"""LASP ring: the state scan with the whole state passed rank to rank.

Each rank blocks until the full carry of its predecessor has arrived, combines
it with its own local term and sends the full result on: ``P - 1`` hops of one
whole state each, so the last rank has its carry after ``(P - 1) * tau(state)``
plus the combines (LASP-1's serial chain). This is All-Scan with a single
block and no overlap; it is kept as its own method because it is the baseline
the ZeCO paper compares against and it needs no block bookkeeping.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from schedlang.runtime.scan_common import ScanPosition, ScanResult, Transition, combine


def ring_scan(
    local: torch.Tensor,
    transition: Transition,
    boundary: torch.Tensor | None,
    position: ScanPosition,
) -> ScanResult:
    """Run the state scan of ``schedlang.runtime.scan_common`` one whole state at a time.

    Args:
        local: ``[B, H, K, V]`` this rank's local term ``x(p)``.
        transition: this rank's transition ``T(p)``.
        boundary: ``[B, H, K, V]`` carry entering the first rank; read only there.
        position: this rank's place in the scan.
    """
    if position.is_first:
        carry_in = boundary
    else:
        carry_in = torch.empty_like(local)
        dist.recv(carry_in, group=position.group, group_src=position.previous_rank)
    carry_out = combine(transition, carry_in, local)
    if not position.is_last:
        dist.send(carry_out, group=position.group, group_dst=position.next_rank)
    if carry_in is None:
        carry_in = torch.zeros_like(local)
    return ScanResult(carry_in=carry_in, carry_out=carry_out)
