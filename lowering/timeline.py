"""The simulated timeline: what the simulator produces and the exporters draw.

Times are in the cost model's unit (``unit``: one full-sequence forward of one
microbatch on one stage = 1.0; ``flops``: seconds). Intervals are half-open
``[start, end)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from schedlang.vocabulary.actions import TaskId
from schedlang.vocabulary.edges import Payload


class Stream(str, Enum):
    """Where an interval runs on its stage; one Perfetto track each."""

    COMPUTE = "compute"
    SEND = "send"
    RECV = "recv"


@dataclass(frozen=True)
class TaskInterval:
    task: TaskId
    start: float
    end: float
    stream: Stream = Stream.COMPUTE

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class MessageInterval:
    """A message between two tasks; same-stage state hand-offs have zero duration."""

    kind: Payload  # what the edge carries, one that moves (the rule table says which edges do)
    source: TaskId
    destination: TaskId
    start: float
    end: float
    n_bytes: int = 0


@dataclass(frozen=True)
class Timeline:
    n_stages: int
    tasks: tuple[TaskInterval, ...]
    messages: tuple[MessageInterval, ...]
    makespan: float
    peak_activations: tuple[float, ...]  # per stage; one whole microbatch's activations = 1.0
    gradient_reductions: tuple[float, ...] = ()  # per stage: its gradient all-reduce after its last task

    @property
    def busy_time(self) -> float:
        return sum(interval.duration for interval in self.tasks if interval.stream is Stream.COMPUTE)

    @property
    def bubble_fraction(self) -> float:
        if self.makespan <= 0:
            return 0.0
        return 1.0 - self.busy_time / (self.n_stages * self.makespan)
