"""Point-to-point messages between neighbouring pipeline stages.

Activations travel forward (stage r -> r + 1) and activation gradients
backward (r + 1 -> r), each direction in its own process group so that on
NCCL the two directions use separate communicators and streams and a pending
send one way never queues behind a receive the other way. Messages between
one pair of ranks in one direction are matched in issue order (FIFO); the
lowering lists every receive in the sender's order
(``schedlang.lowering.placement``), which is what makes this matching
correct. Sends are asynchronous and only awaited at the end of a step.

[Note: waiting without draining the GPU]
On CPU (gloo) a receive blocks the host until the data is there, with a
timeout: one that does not complete in time raises :class:`PeerTimeoutError`
naming this rank, the peer and the task that waits. On CUDA (NCCL) a wait with
a timeout would block the host until the message *and all GPU work queued
before it* are done, so every message would drain the GPU's queue and the next
task's kernel launches would run with the GPU idle. There the runtime waits on
the stream instead (``work.wait()`` without a timeout: later kernels are
ordered after the message, the host runs ahead) and hands the work to a
:class:`CompletionWatchdog`, a daemon thread that polls ``is_completed()`` and,
if a message outlives the timeout, prints the same message and ends the
process, so a hung peer still cannot hang the job.
"""

from __future__ import annotations

import datetime
import os
import sys
import threading
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


class PeerTimeoutError(RuntimeError):
    """A message did not complete in time: the peer hung or never sent."""


class PeerLostError(PeerTimeoutError):
    """A message failed before its time was up because the connection to the peer closed: the peer died."""


def _is_timeout(error: RuntimeError) -> bool:
    """Whether a failed wait ran out of time (as opposed to losing its connection)."""
    return "timed out" in str(error).lower() or "timeout" in str(error).lower()


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


class CompletionWatchdog:
    """Ends the process when a communication awaited on the stream outlives its deadline.

    See [Note: waiting without draining the GPU]. ``watch`` registers works
    with what they are for; a daemon thread polls them every ``poll_s``
    seconds and forgets the completed ones. An overdue one gets
    ``PeerTimeoutError: <what> and gave up after <timeout>s`` on stderr and
    exit status 1, which torchrun reports as that rank's failure.
    """

    def __init__(self, timeout_s: float, poll_s: float = 0.05) -> None:
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self._watched: list[tuple[object, float, str]] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def watch(self, works: list, what: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        with self._lock:
            self._watched.extend((work, deadline, what) for work in works)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="schedlang-p2p-watchdog", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self.poll_s)
            now = time.monotonic()
            with self._lock:
                self._watched = [entry for entry in self._watched if not entry[0].is_completed()]
                overdue = next((entry for entry in self._watched if entry[1] < now), None)
            if overdue is not None:
                print(
                    f"PeerTimeoutError: {overdue[2]} and gave up after {self.timeout_s:g}s",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(1)


class StageMessenger:
    """Sends and receives of one rank to its previous and next pipeline stage."""

    def __init__(
        self,
        rank: int,
        device: torch.device,
        timeout_s: float,
        activation_group: dist.ProcessGroup | None,
        gradient_group: dist.ProcessGroup | None,
        wait_on_stream: bool | None = None,
    ) -> None:
        self.rank = rank
        self.device = device
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.activation_group = activation_group
        self.gradient_group = gradient_group
        self.pool = BufferPool()
        self.pending: list[PendingSend] = []
        # [Note: waiting without draining the GPU]; None picks by device.
        self.wait_on_stream = device.type == "cuda" if wait_on_stream is None else wait_on_stream
        self.watchdog = CompletionWatchdog(timeout_s) if self.wait_on_stream else None

    def _group(self, is_gradient: bool) -> dist.ProcessGroup | None:
        return self.gradient_group if is_gradient else self.activation_group

    def send(self, tensor: torch.Tensor, peer: int, is_gradient: bool, description: str) -> None:
        tensor = tensor.detach().contiguous()
        operation = dist.P2POp(dist.isend, tensor, peer, self._group(is_gradient))
        works = self._post([operation], f"rank {self.rank} could not send {description} to rank {peer}")
        self.pending.append(PendingSend(works, tensor, description))

    def receive(
        self, shape: tuple[int, ...], dtype: torch.dtype, peer: int, is_gradient: bool, description: str
    ) -> torch.Tensor:
        return self.receive_into(self.pool.get(shape, dtype, self.device), peer, is_gradient, description)

    def receive_into(self, buffer: torch.Tensor, peer: int, is_gradient: bool, description: str) -> torch.Tensor:
        """Receive into ``buffer`` (contiguous) and return it once the data is there."""
        operation = dist.P2POp(dist.irecv, buffer, peer, self._group(is_gradient))
        what = f"rank {self.rank} waited for {description} from rank {peer}"
        self._wait(self._post([operation], what), what)
        return buffer

    def _post(self, operations: list, what: str) -> list:
        """Start the operations; a peer already gone can fail them here, before any wait."""
        try:
            return dist.batch_isend_irecv(operations)
        except RuntimeError as error:
            raise PeerLostError(f"{what}: the connection failed: {str(error).splitlines()[0]}") from error

    def _wait(self, works: list, what: str) -> None:
        if self.watchdog is not None:
            self.watchdog.watch(works, what)  # before waiting: on a host-blocking backend the wait may never return
            for work in works:
                work.wait()
            return
        try:
            for work in works:
                work.wait(self.timeout)
        except RuntimeError as error:
            first_line = str(error).splitlines()[0]
            if not _is_timeout(error):
                raise PeerLostError(f"{what}, but the connection closed (the peer process ended): {first_line}") from error
            raise PeerTimeoutError(f"{what} and gave up after {self.timeout.total_seconds():g}s: {first_line}") from error

    def finish_sends(self) -> None:
        """Wait for every send of the step, so their tensors may be freed or reused."""
        pending, self.pending = self.pending, []
        for send in pending:
            self._wait(send.works, f"rank {self.rank} could not complete the send of {send.description}")
