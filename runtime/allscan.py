"""ZeCO All-Scan: the decayed scan pipelined over blocks of state rows.

The state ``[B, H, K, V]`` is cut into ``n_blocks`` contiguous blocks of K rows
(ZeCO's ``S^{(k)}``). Rows never mix in the combine ``d * carry + x`` (the
decay is per key row), so a rank can combine block ``j`` and send it on as
soon as block ``j`` has arrived, while blocks ``j+1 ..`` are still in flight
from its predecessor. With ``P`` ranks the carry reaches the last rank after
about ``tau(state) + (P - 1) * tau(state) / n_blocks`` (ZeCO Eq. 12) instead
of ``P * tau(state)`` for an unpipelined pass.

Every receive is posted up front (one ``irecv`` per block, each into its own
buffer), then blocks are waited on, combined and sent with ``isend`` in order.
Each block carries its index as the message tag so that transports that match
by tag (gloo) pair them correctly; NCCL keeps per-peer order.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from schedlang.runtime.scan_common import ScanPosition, ScanResult, combine, split_rows


def allscan_scan(
    local: torch.Tensor,
    decay: torch.Tensor,
    boundary: torch.Tensor | None,
    position: ScanPosition,
    n_blocks: int,
) -> ScanResult:
    """Run the decayed scan of ``schedlang.runtime.scan_common`` with pipelined blocks.

    Args:
        local: ``[B, H, K, V]`` this rank's local term ``x(p)``.
        decay: ``[B, H, K, 1]`` or ``[B, H, 1, 1]`` this rank's decay ``d(p)``.
        boundary: ``[B, H, K, V]`` carry entering the first rank; read only there.
        position: this rank's place in the scan.
        n_blocks: number of row blocks, ``1 <= n_blocks <= K``.
    """
    local_blocks = split_rows(local, n_blocks)
    decay_blocks = split_rows(decay, n_blocks)

    if position.is_first:
        incoming = split_rows(boundary, n_blocks) if boundary is not None else [None] * n_blocks
        receives = []
    else:
        incoming = [torch.empty_like(block) for block in local_blocks]
        receives = [
            dist.irecv(buffer, group=position.group, group_src=position.previous_rank, tag=index)
            for index, buffer in enumerate(incoming)
        ]

    outgoing = []
    sends = []
    for index in range(n_blocks):
        if receives:
            receives[index].wait()
        block_out = combine(decay_blocks[index], incoming[index], local_blocks[index])
        outgoing.append(block_out)
        if not position.is_last:
            sends.append(
                dist.isend(block_out, group=position.group, group_dst=position.next_rank, tag=index)
            )
    for send in sends:
        send.wait()

    if incoming[0] is None:
        carry_in = torch.zeros_like(local)
    else:
        carry_in = torch.cat(incoming, dim=-2)
    return ScanResult(carry_in=carry_in, carry_out=torch.cat(outgoing, dim=-2))
