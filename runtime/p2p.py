"""Point-to-point messages between neighbouring pipeline stages.

Activations travel forward (stage r -> r + 1) and activation gradients
backward (r + 1 -> r), each direction in its own process group so that on
NCCL the two directions use separate communicators and streams and a pending
send one way never queues behind a receive the other way. Messages between
one pair of ranks in one direction are matched in issue order (FIFO); the
lowering lists every receive in the sender's order
(``schedlang.lowering.placement``), which is what makes this matching
correct. Sends are asynchronous and only awaited at the end of a step, so a
rank blocks only in a receive; a receive that does not complete within the
timeout raises :class:`PeerTimeoutError` naming this rank, the peer and the
task that waits.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


class PeerTimeoutError(RuntimeError):
    """A receive did not complete: the peer died, hung or never sent."""


@dataclass
class PendingSend:
    works: list
    tensor: torch.Tensor
    description: str


@dataclass
class BufferPool:
    """Receive buffers by shape and dtype, reused across chunks and steps."""

    free: dict[tuple, list[torch.Tensor]] = field(default_factory=dict)

    def get(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        stack = self.free.get((shape, dtype))
        if stack:
            return stack.pop()
        return torch.empty(shape, dtype=dtype, device=device)

    def give_back(self, buffer: torch.Tensor) -> None:
        buffer = buffer.detach()
        buffer.grad = None
        self.free.setdefault((tuple(buffer.shape), buffer.dtype), []).append(buffer)


class StageMessenger:
    """Sends and receives of one rank to its previous and next pipeline stage."""

    def __init__(
        self,
        rank: int,
        device: torch.device,
        timeout_s: float,
        activation_group: dist.ProcessGroup | None,
        gradient_group: dist.ProcessGroup | None,
    ) -> None:
        self.rank = rank
        self.device = device
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.activation_group = activation_group
        self.gradient_group = gradient_group
        self.pool = BufferPool()
        self.pending: list[PendingSend] = []

    def _group(self, is_gradient: bool) -> dist.ProcessGroup | None:
        return self.gradient_group if is_gradient else self.activation_group

    def send(self, tensor: torch.Tensor, peer: int, is_gradient: bool, description: str) -> None:
        tensor = tensor.detach().contiguous()
        operation = dist.P2POp(dist.isend, tensor, peer, self._group(is_gradient))
        self.pending.append(PendingSend(dist.batch_isend_irecv([operation]), tensor, description))

    def receive(
        self, shape: tuple[int, ...], dtype: torch.dtype, peer: int, is_gradient: bool, description: str
    ) -> torch.Tensor:
        buffer = self.pool.get(shape, dtype, self.device)
        operation = dist.P2POp(dist.irecv, buffer, peer, self._group(is_gradient))
        works = dist.batch_isend_irecv([operation])
        self._wait(works, f"rank {self.rank} waited for {description} from rank {peer}")
        return buffer

    def _wait(self, works: list, what: str) -> None:
        try:
            for work in works:
                work.wait(self.timeout)
        except RuntimeError as error:
            raise PeerTimeoutError(
                f"{what} and gave up after {self.timeout.total_seconds():g}s: {str(error).splitlines()[0]}"
            ) from error

    def finish_sends(self) -> None:
        """Wait for every send of the step, so their tensors may be freed or reused."""
        pending, self.pending = self.pending, []
        for send in pending:
            self._wait(send.works, f"rank {self.rank} could not complete the send of {send.description}")
