"""The pieces of the gdn Triton path's two-segment schedule (kernels/gdn/chunk_triton.py, [Note: gdn overlap]):
the kernel-chunk ranges the sequence is split into, and the two CUDA streams the phases run on.

A ``Segment`` is a contiguous range of kernel chunks ``[first, stop)``; a launch over a segment runs one program
per chunk of it and writes only that range of the full-length outputs, so the segments of one call share their
output tensors. ``Lanes`` runs a step on a side stream after everything the caller's stream has issued so far,
and lets the caller's stream wait on it; on a CPU (the Triton interpreter) there are no streams and every step
runs where it is issued, so the overlapped schedule runs its phases in the same order on one stream.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

Result = TypeVar("Result")


@dataclass(frozen=True)
class Segment:
    """The kernel chunks ``first, first + 1, ..., stop - 1`` of a call (0 <= first < stop <= the chunk count)."""

    first: int
    stop: int

    @property
    def count(self) -> int:
        return self.stop - self.first


def split_into_segments(n_chunks: int, segments: int, split: float) -> tuple[Segment, ...]:
    """The call's kernel chunks as ``segments`` contiguous segments: one segment, or two whose first holds
    ``split`` of the chunks rounded to a whole chunk and clamped so that each segment keeps at least one. A call
    of a single chunk is one segment whatever is asked. Raises ValueError for a segment count other than 1 or 2,
    or a split outside (0, 1)."""
    if segments not in (1, 2):
        raise ValueError(f"gdn overlap: segments must be 1 or 2, got {segments!r}")
    if not 0.0 < float(split) < 1.0:
        raise ValueError(f"gdn overlap: split must lie strictly between 0 and 1, got {split!r}")
    if segments == 1 or n_chunks < 2:
        return (Segment(0, n_chunks),)
    boundary = min(max(int(float(split) * n_chunks + 0.5), 1), n_chunks - 1)
    return Segment(0, boundary), Segment(boundary, n_chunks)


_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}
"""One side stream per CUDA device, made at its first use and reused: every schedule joins it back before it
returns, so successive calls never run on it at the same time."""


class Lanes:
    """The caller's current stream and a side stream of ``device``; on a CPU, one lane.

    Ordering contract: ``beside(step)`` makes the side stream wait for all work issued so far on the caller's
    stream, issues ``step()`` on the side stream and returns an event recorded after it (None on a CPU);
    ``wait(event)`` makes the caller's stream wait for that event. Steps issued to the side stream run in issue
    order. Memory contract: tensors a side step uses must be allocated on the caller's stream (before ``beside``)
    and stay referenced until the caller's stream has waited on the last event of the side stream (``join``), so
    the caching allocator cannot hand their memory to new work before the side stream is done with it."""

    def __init__(self, device: torch.device) -> None:
        self.streams = device.type == "cuda"
        if self.streams:
            index = device.index if device.index is not None else torch.cuda.current_device()
            self.main = torch.cuda.current_stream(index)
            if index not in _SIDE_STREAMS:
                _SIDE_STREAMS[index] = torch.cuda.Stream(device=index)
            self.side = _SIDE_STREAMS[index]
        self.last_side_event: torch.cuda.Event | None = None

    def beside(self, step: Callable[[], Result]) -> tuple[Result, torch.cuda.Event | None]:
        if not self.streams:
            return step(), None
        self.side.wait_stream(self.main)
        with torch.cuda.stream(self.side):
            result = step()
            event = torch.cuda.Event()
            event.record(self.side)
        self.last_side_event = event
        return result, event

    def wait(self, event: torch.cuda.Event | None) -> None:
        if event is not None:
            self.main.wait_event(event)

    def join(self) -> None:
        """The caller's stream waits for everything issued to the side stream."""
        self.wait(self.last_side_event)
