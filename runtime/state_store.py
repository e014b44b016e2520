"""Per-chunk bookkeeping of one stage: boundary states, state gradients, saved graphs.

[Note: state passing]
Keys are ``(microbatch, chunk)``. ``F(a, i)`` puts the recurrent state of each
of its layers after chunk ``i`` (detached); ``F(a, i + 1)`` takes it, once, as
the initial state it makes into leaves that require grad. ``B(a, i + 1)``
puts the gradients of those leaves; ``B(a, i)`` takes them as the incoming
gradients of its final states. A chunk's saved record (its autograd graph and
inputs) lives from ``F(a, i)`` until ``B(a, i)`` takes it. Every entry is
removed when it is taken, so an empty store at the end of a step shows that
every hand-off happened exactly once; a take of a missing key is a schedule
the legality checker should have refused, reported as such.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ChunkKey = tuple[int, int]


@dataclass
class ChunkRecord:
    """What ``B(a, i)`` needs from ``F(a, i)``.

    Without recomputation ``outputs`` and ``final_states`` are attached to the
    chunk's graph; with full recomputation they are empty and ``inputs`` and
    ``initial_states`` are plain detached tensors to rerun the forward from.
    """

    inputs: torch.Tensor
    input_leaf: torch.Tensor | None
    initial_states: list[torch.Tensor | None]
    outputs: torch.Tensor | None
    final_states: list[torch.Tensor]
    input_buffer: torch.Tensor | None = None
    graph_slot: int | None = None  # the CUDA-graph slot holding this chunk's graph, if graphs are used


class StateStore:
    def __init__(self) -> None:
        self.forward_states: dict[ChunkKey, list[torch.Tensor]] = {}
        self.state_gradients: dict[ChunkKey, list[torch.Tensor]] = {}
        self.records: dict[ChunkKey, ChunkRecord] = {}

    @staticmethod
    def _take(table: dict, key: ChunkKey, what: str):
        try:
            return table.pop(key)
        except KeyError:
            microbatch, chunk = key
            raise RuntimeError(
                f"{what} of microbatch {microbatch}, chunk {chunk} is not available: "
                "the task that produces it has not run (an order the legality check should refuse)"
            ) from None

    def put_forward_states(self, microbatch: int, chunk: int, states: list[torch.Tensor]) -> None:
        self.forward_states[(microbatch, chunk)] = states

    def take_forward_states(self, microbatch: int, chunk: int) -> list[torch.Tensor]:
        return self._take(self.forward_states, (microbatch, chunk), "the recurrent state after the forward")

    def put_state_gradients(self, microbatch: int, chunk: int, gradients: list[torch.Tensor]) -> None:
        self.state_gradients[(microbatch, chunk)] = gradients

    def take_state_gradients(self, microbatch: int, chunk: int) -> list[torch.Tensor]:
        return self._take(self.state_gradients, (microbatch, chunk), "the state gradient from the backward")

    def put_record(self, microbatch: int, chunk: int, record: ChunkRecord) -> None:
        self.records[(microbatch, chunk)] = record

    def take_record(self, microbatch: int, chunk: int) -> ChunkRecord:
        return self._take(self.records, (microbatch, chunk), "the saved forward")

    def is_empty(self) -> bool:
        return not (self.forward_states or self.state_gradients or self.records)

    def describe_leftovers(self) -> str:
        parts = []
        for name, table in (
            ("forward states", self.forward_states),
            ("state gradients", self.state_gradients),
            ("saved forwards", self.records),
        ):
            if table:
                parts.append(f"{name} of " + ", ".join(f"{a}.{i}" for a, i in sorted(table)))
        return "; ".join(parts)
