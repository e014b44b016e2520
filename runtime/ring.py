"""LASP ring: the state scan with the whole state passed rank to rank.

Each rank blocks until the full carry of its predecessor has arrived, combines
it with its own local term and sends the full result on: ``P - 1`` hops of one
whole state each, so the last rank has its carry after ``(P - 1) * tau(state)``
plus the combines (LASP-1's serial chain). This is All-Scan with a single
block and no overlap, and runs as exactly that (``allscan_scan`` with one
block: every hop one message of the whole state); it is kept as its own method
because it is the baseline the ZeCO paper compares against.
"""

from __future__ import annotations

import torch

from schedlang.runtime.allscan import allscan_scan
from schedlang.runtime.scan_common import ScanPosition, ScanResult, Transition


def ring_scan(
    local: torch.Tensor,
    transition: Transition,
    boundary: torch.Tensor | None,
    position: ScanPosition,
) -> ScanResult:
    """Run the state scan of ``schedlang.runtime.scan_common`` one whole state at a time (its arguments:
    :class:`~schedlang.runtime.scan_common.StateScan`)."""
    return allscan_scan(local, transition, boundary, position, n_blocks=1)
