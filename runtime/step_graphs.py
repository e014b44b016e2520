"""A stage's whole step replayed from CUDA graphs captured in the step's own order, in one memory pool.

[Note: step graphs]
``pipeline { cuda_graphs = step }`` captures every compute action of a stage's action list (each ``F``, ``B``
and deferred ``W``) as a CUDA graph of its own, walking the list once in its order, and replays the list in
that same order every later step. All graphs of the stage share one memory pool. CUDA-graph pools may be
shared between graphs that replay in the order they were captured, never concurrently; since every step runs
the same static action list, that holds by construction. So the pool's blocks are used as an eager step uses
its allocator's: the activations a chunk keeps from its ``F`` to its ``B`` are allocated at that ``F``'s
capture and freed at that ``B``'s, and every graph's temporaries reuse freed blocks. The stage's reserved
memory follows the eager step's peak, where per-chunk slots ([Note: graph slots] in
:mod:`schedlang.runtime.graphs`) keep one private pool per chunk in flight.

What crosses a graph's boundary is a tensor of the capture walk, referenced for as long as a replay needs it:
- a chunk's final states are the next chunk's ``F`` inputs and its state-leaf gradients the previous chunk's
  ``B`` inputs, read in place (no copy), as in the eager step;
- a received activation or gradient is received at replay into the very buffer the capture walk's receive
  took from the messenger's pool at the same position (so buffers are reused as eagerly);
- a sent activation or gradient is the graph's own output tensor, kept referenced from its capture on, as the
  eager step keeps what it sends until the step's sends finish;
- the last stage's per-chunk losses are graph outputs, added up outside the graphs;
- token ids are read from one token buffer that every step's tokens are copied into.

Lifecycle: the first step runs eagerly (Triton compiles its kernels, cuBLAS makes its handles: neither may
happen during capture); the second step first walks the action list capturing (no communication: receives
only take their buffers, sends only keep their tensors), then replays it; later steps replay. Parameter
gradients accumulate in place into the ``.grad`` tensors the first step left, which the trainer zeroes in
place between steps; the linear layers add their weight gradients into them inside their backward GEMMs
([Note: in-place weight gradients] in :mod:`schedlang.runtime.linear`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum

import torch
from torch import nn

from schedlang.runtime.linear import accumulate_weight_gradients_into_grad
from schedlang.vocabulary import Action, CudaGraphs


def steps_before_steady(graphs: CudaGraphs) -> int:
    """Steps a measurement must run before its timed ones under ``graphs``: the first step compiles kernels
    (and, with per-layer graphs, captures them before running); under step graphs the second step also captures
    the walk before replaying it (:class:`StepGraphPhase`), so only the third is a steady step."""
    return 2 if graphs is CudaGraphs.STEP else 1


class StepGraphPhase(str, Enum):
    EAGER = "eager"  # the first step: warms kernels up
    CAPTURING = "capturing"  # the second step's walk that captures each compute action
    REPLAYING = "replaying"  # every step after the capture walk


@dataclass
class StepGraphs:
    """Captured graphs and the tensors that cross their boundaries, keyed by action; see [Note: step graphs]."""

    stage: nn.Module
    device: torch.device
    phase: StepGraphPhase = StepGraphPhase.EAGER
    graphs: dict[Action, torch.cuda.CUDAGraph] = field(default_factory=dict)
    received: dict[Action, torch.Tensor] = field(default_factory=dict)  # RECV action -> its buffer
    sent: dict[Action, torch.Tensor] = field(default_factory=dict)  # SEND action -> the tensor it sends
    losses: dict[Action, torch.Tensor] = field(default_factory=dict)  # F action of the last stage -> its loss
    tokens: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.device.type != "cuda":
            raise ValueError("pipeline { cuda_graphs = step } replays CUDA graphs: run it with --device cuda")
        self.pool = torch.cuda.graph_pool_handle()

    @property
    def capturing(self) -> bool:
        return self.phase is StepGraphPhase.CAPTURING

    @property
    def replaying(self) -> bool:
        return self.phase is StepGraphPhase.REPLAYING

    def begin_step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Advance the phase at a step's start; returns the token tensor the step's actions must read."""
        if self.phase is StepGraphPhase.EAGER and self.tokens is None:
            self.tokens = tokens.clone()  # the first, eager step: keep the shape for the buffer
            return tokens
        if self.phase is StepGraphPhase.EAGER:
            self._prepare_capture()
            self.phase = StepGraphPhase.CAPTURING
        self.tokens.copy_(tokens)
        return self.tokens

    def _prepare_capture(self) -> None:
        """Gradients the graphs add into in place: every parameter gets a ``.grad`` before capture."""
        with torch.no_grad():
            for parameter in self.stage.parameters():
                if parameter.grad is None:
                    parameter.grad = torch.zeros_like(parameter)
        accumulate_weight_gradients_into_grad(self.stage)
        torch.cuda.synchronize(self.device)

    def end_capture(self) -> None:
        torch.cuda.synchronize(self.device)
        self.phase = StepGraphPhase.REPLAYING

    @contextmanager
    def capture(self, action: Action) -> Iterator[None]:
        """Capture what runs inside as ``action``'s graph, into the stage's pool."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            yield
        self.graphs[action] = graph

    def replay(self, action: Action) -> None:
        self.graphs[action].replay()
