"""A step's loss summed over all ranks, and its time, without making the pipeline stages wait for each other.

[Note: loss without a barrier]
Only last-stage ranks hold any loss, so reporting it needs a sum over every rank. A plain all-reduce on
the compute stream followed by ``float()`` is a barrier between the stages: a stage that finishes its step
early waits for the last one before it may take its optimizer step and start the next step's forwards,
so the next step's fill (the later stages waiting for the first chunk forward) is paid in full every step
(docs/benchmarks.md, "Measurements behind the runtime"); torch's pipeline schedules keep the loss on the
last stage and have no such barrier. :class:`PendingLoss` runs the all-reduce on a side stream, copies
the sum to pinned host memory there and records an event; ``value()`` waits for that event only, so a
caller that asks for step ``k``'s loss after queueing step ``k + 1`` overlaps the two. On the CPU (gloo)
the all-reduce is synchronous, as before. Read one step late, the host's clock no longer says when a step
ended; :class:`StepClock` marks step ends with timing events on the device instead.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


class PendingLoss:
    """The sum over all ranks of this rank's share of a step's loss, resolved by :meth:`value`."""

    def __init__(self, local_loss: torch.Tensor) -> None:
        total = local_loss.detach().to(torch.float64)
        self._event: torch.cuda.Event | None = None
        if total.device.type != "cuda":
            dist.all_reduce(total)
            self._host = total
            return
        compute = torch.cuda.current_stream(total.device)
        side = _side_stream(total.device)
        side.wait_stream(compute)
        with torch.cuda.stream(side):
            total.record_stream(side)
            dist.all_reduce(total)
            self._host = torch.empty((), dtype=torch.float64, pin_memory=True)
            self._host.copy_(total, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record(side)

    def value(self) -> float:
        """Wait for the sum (not for whatever the device was given after it) and return it."""
        if self._event is not None:
            self._event.synchronize()
        return float(self._host)


_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return _SIDE_STREAMS[device]


class StepClock:
    """Step ends marked on the device's stream (timing events on CUDA, the host clock on the CPU, where a
    step runs synchronously), so a step's time can be read after later steps were queued."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.last = self._mark()

    def _mark(self):
        if self.device.type != "cuda":
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def step_ended(self):
        """Mark the end of the step just queued; returns a token for ``seconds``."""
        start, self.last = self.last, self._mark()
        return start, self.last

    def seconds(self, token) -> float:
        """The time between the previous mark and this one (waits for this one on CUDA)."""
        start, end = token
        if self.device.type != "cuda":
            return end - start
        end.synchronize()
        return start.elapsed_time(end) / 1e3
