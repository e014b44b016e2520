"""ZeCO All-Scan: the state scan pipelined over blocks of the state.

The state ``[B, H, K, V]`` is cut into ``n_blocks`` contiguous blocks along the
axis the transition never mixes ([Note: transitions]): K rows for a decay
(ZeCO's ``S^{(k)}``), V columns for the gated delta rule's matrix. Each block
combines with its own block of the transition alone, so a rank can combine
block ``j`` and send it on as soon as block ``j`` has arrived, while blocks
``j+1 ..`` are still in flight from its predecessor. With ``P`` ranks the carry reaches the last rank after
about ``tau(state) + (P - 1) * tau(state) / n_blocks`` (ZeCO Eq. 12) instead
of ``P * tau(state)`` for an unpipelined pass.

[Note: All-Scan messages]
Blocks pay off only where a rank forwards what it receives. The first rank has
its whole carry at once and the last rank forwards nothing, so a hop into the
last rank carries the state as one message, and the first rank's blocks go out
as one batched group of sends. On two ranks All-Scan therefore sends exactly
what the ring sends, whatever the block count. A middle rank posts one receive
per block up front, then waits, combines and sends block by block. Each block
carries its index as the message tag so that transports that match by tag
(gloo) pair them correctly; NCCL keeps per-peer order.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from schedlang.runtime.scan_common import ScanPosition, ScanResult, Transition, combine, entering_carry, split_state


def _blocks_on_hop_into(receiver_is_last: bool, n_blocks: int) -> int:
    """Messages on one hop: one into the last rank, ``n_blocks`` elsewhere ([Note: All-Scan messages])."""
    return 1 if receiver_is_last else n_blocks


def _send_blocks(blocks: list[torch.Tensor], position: ScanPosition) -> list:
    """Start sending ``blocks`` to the next rank, as one batched group when there are several."""
    operations = [
        dist.P2POp(dist.isend, block, group=position.group, group_peer=position.next_rank, tag=index)
        for index, block in enumerate(blocks)
    ]
    if len(operations) == 1:
        return [dist.isend(blocks[0], group=position.group, group_dst=position.next_rank, tag=0)]
    return dist.batch_isend_irecv(operations)


def allscan_scan(
    local: torch.Tensor,
    transition: Transition,
    boundary: torch.Tensor | None,
    position: ScanPosition,
    n_blocks: int,
) -> ScanResult:
    """Run the state scan of ``schedlang.runtime.scan_common`` with pipelined blocks: the arguments of a
    :class:`~schedlang.runtime.scan_common.StateScan`, and ``n_blocks``, at least 1 and at most the state's
    extent along ``transition.block_axis``."""
    axis = transition.block_axis
    outgoing_blocks = 0 if position.is_last else _blocks_on_hop_into(position.next_rank == position.last_rank, n_blocks)
    if position.is_first:
        carry_in = entering_carry(boundary, local)
        carry_out = combine(transition, boundary, local)
        sends = _send_blocks(split_state(carry_out, outgoing_blocks, axis), position) if outgoing_blocks else []
    else:
        incoming_blocks = _blocks_on_hop_into(position.is_last, n_blocks)
        incoming = [torch.empty_like(block) for block in split_state(local, incoming_blocks, axis)]
        receives = [
            dist.irecv(buffer, group=position.group, group_src=position.previous_rank, tag=index)
            for index, buffer in enumerate(incoming)
        ]
        if outgoing_blocks == incoming_blocks:
            # a middle rank forwarding block by block
            local_blocks = split_state(local, incoming_blocks, axis)
            transition_blocks = transition.blocks(incoming_blocks)
            outgoing, sends = [], []
            for index, receive in enumerate(receives):
                receive.wait()
                outgoing.append(combine(transition_blocks[index], incoming[index], local_blocks[index]))
                sends.append(dist.isend(outgoing[-1], group=position.group, group_dst=position.next_rank, tag=index))
            carry_in, carry_out = torch.cat(incoming, dim=axis), torch.cat(outgoing, dim=axis)
        else:
            for receive in receives:
                receive.wait()
            carry_in = torch.cat(incoming, dim=axis) if len(incoming) > 1 else incoming[0]
            carry_out = combine(transition, carry_in, local)
            sends = _send_blocks(split_state(carry_out, outgoing_blocks, axis), position) if outgoing_blocks else []
    for send in sends:
        send.wait()
    return ScanResult(carry_in=carry_in, carry_out=carry_out)
