"""A stage's chunk forward and backward replayed from captured CUDA graphs (``pipeline { cuda_graphs = true }``).

Contract. ``GraphedChunks.run`` does what ``StageModel.forward`` (plus the loss,
on the last stage) does for one chunk, through a callable that
``torch.cuda.make_graphed_callables`` captured once: its forward replays one
graph and its backward another, so a chunk costs two graph launches instead
of a few hundred kernel launches. Requirements, checked by ``compile``:
every chunk has the same length (one set of static shapes), no recomputation,
no sequence parallelism (no collectives inside the graphs), and no attention
layers: recurrent layers (gla, simple_gla), whose states have fixed shapes,
and mlp layers, which keep none.

[Note: graph slots]
A captured callable owns static buffers: its sample arguments are its
static inputs (each slot gets its own: the backward reads them), its forward
writes the chunk's outputs and saved activations there, its backward writes the gradients of its
inputs there, and the next forward replay of the same callable overwrites
both (the backward's outputs can reuse memory the forward's activations had).
A stage has up to N + P - r - 1 chunks in flight between ``F`` and ``B``, so
it captures one callable per chunk in flight (a *slot*, each with its own
memory pool): ``F`` takes a free slot, ``B`` gives it back. What leaves a slot
is used before that slot's next forward or copied: forward outputs are sent
or handed to the next chunk's forward (which copies them into its own slot)
before this chunk's backward can run; the gradients ``B`` hands to
``B(a, i - 1)`` and to the previous stage are cloned; parameter gradients go
into ``.grad`` tensors allocated before capture, so autograd never adopts a
static buffer as a ``.grad``: the captured backward adds the weight gradients
of the linear layers into them itself ([Note: in-place weight gradients] in
:mod:`schedlang.runtime.linear`) and autograd adds the others. The warm-up
runs of capture add into them too, with arbitrary output gradients, so they
are zeroed once every slot is captured.

[Note: splitting slots]
On a stage that defers some chunk's ``W`` ([Note: deferred weight gradients]
in :mod:`schedlang.runtime.linear`) every slot *splits*: its callable was
captured with a :class:`WeightGradientRecorder` active, so its backward graph
forms input and state gradients only and keeps the output gradients of the
linear layers (the recorder holds the capture's tensors, so the pool never
reuses their blocks); a third graph, captured after the other two, adds
``dy^T x`` for each of them into ``.grad``, reading those buffers and the
inputs the forward graph saved. Every chunk's ``W`` replays it (right after
``B`` when not deferred) and only then gives the slot back, since the slot's
next forward overwrites the saved inputs. One kind of slot for all chunks
keeps the slot count at the chunks in flight; separate ordinary and splitting
slots would need up to twice as many (the ordinary ones peak in the warm-up,
the splitting ones in the cool-down), each with a chunk's activations.

Chunk 0 has no incoming state: it gets zero states, which the kernels treat
exactly like no state, so one set of static shapes serves every chunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from schedlang.runtime.linear import (
    WeightGradientRecorder,
    accumulate_weight_gradients_into_grad,
    recording_weight_gradients,
)
from schedlang.runtime.model import StageModel
from schedlang.vocabulary import Action, ActionKind, deferred_weight_units

GraphMaker = Callable[..., nn.Module]
"""``torch.cuda.make_graphed_callables``'s signature for one module: (module, sample_args, **options)."""


def slots_needed(actions: tuple[Action, ...]) -> int:
    """The most chunks this action list holds at any time between their F and their B (their W, for the
    chunks whose W is deferred: [Note: splitting slots])."""
    deferred = deferred_weight_units(actions)
    in_flight = most = 0
    for action in actions:
        unit = (action.microbatch, action.chunk)
        if action.kind is ActionKind.FORWARD:
            in_flight += 1
            most = max(most, in_flight)
        elif action.kind is (ActionKind.WEIGHT if unit in deferred else ActionKind.BACKWARD):
            in_flight -= 1
    return most


class ChunkStep(nn.Module):
    """One chunk of a stage as a function of tensors only: (inputs, *states[, targets]) -> (outputs, *states).

    ``states`` are those of the layers at ``stateful`` (positions in the stage's layer list); the others
    (``mlp`` layers) keep none and get None.
    """

    def __init__(
        self,
        stage: StageModel,
        global_tokens: int,
        stateful: tuple[int, ...],
        recorder: WeightGradientRecorder | None = None,
    ) -> None:
        super().__init__()
        self.stage = stage
        self.global_tokens = global_tokens
        self.stateful = stateful
        self.recorder = recorder  # set on splitting slots: [Note: splitting slots]

    def forward(self, inputs: torch.Tensor, *states_and_targets: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n_states = len(self.stateful)
        states: list[torch.Tensor | None] = [None] * self.stage.n_states
        for position, state in zip(self.stateful, states_and_targets[:n_states]):
            states[position] = state
        targets = states_and_targets[n_states:]
        if self.recorder is not None:
            self.recorder.clear()  # keep only the last (at capture: the captured) backward's records
        with recording_weight_gradients(self.recorder):
            hidden, final_states = self.stage(inputs, states)
        if self.stage.is_last:
            hidden = self.stage.loss(hidden, targets[0]) / self.global_tokens
        return (hidden, *(final_states[position] for position in self.stateful))


@dataclass(frozen=True)
class StateSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype


class GraphedChunks:
    """Captured chunk callables of one stage, one per slot, captured before the first step's first action."""

    def __init__(
        self, stage: StageModel, n_slots: int, global_tokens: int, make_graphed: GraphMaker, splitting: bool = False
    ) -> None:
        self.stage = stage
        self.n_slots = n_slots
        self.global_tokens = global_tokens
        self.make_graphed = make_graphed
        self.splitting = splitting  # [Note: splitting slots]
        self.callables: list[nn.Module] = []
        self.weight_gradient_replays: list[Callable[[], None]] = []  # per slot, when splitting
        self.state_specs: list[StateSpec] = []  # of the layers at `stateful`
        self.stateful: tuple[int, ...] = ()  # positions in the stage's layer list of the layers with a state
        self.free_slots: list[int] = []

    def zero_states(self) -> list[torch.Tensor]:
        """Zero initial states of the layers at ``stateful``."""
        device = next(self.stage.parameters()).device
        return [torch.zeros(spec.shape, dtype=spec.dtype, device=device) for spec in self.state_specs]

    @property
    def captured(self) -> bool:
        return bool(self.callables)

    def capture(self, inputs: torch.Tensor, targets: torch.Tensor | None) -> None:
        """Capture every slot on sample inputs shaped like a chunk's (and its targets on the last stage).

        The executor calls this before a step's first action: capturing with point-to-point work in
        flight would let the P2P watchdog query CUDA events during the capture, which CUDA forbids.
        """
        with torch.no_grad():
            _, final_states = self.stage(inputs.detach(), [None] * self.stage.n_states)
        self.stateful = tuple(position for position, state in enumerate(final_states) if state is not None)
        self.state_specs = [StateSpec(tuple(final_states[p].shape), final_states[p].dtype) for p in self.stateful]
        for parameter in self.stage.parameters():
            if parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)
        accumulate_weight_gradients_into_grad(self.stage)
        for slot in range(self.n_slots):
            warmup = 3 if slot == 0 else 1  # later slots find kernels compiled and autotuned
            recorder = WeightGradientRecorder() if self.splitting else None
            self.callables.append(
                self.make_graphed(
                    ChunkStep(self.stage, self.global_tokens, self.stateful, recorder),
                    self._sample_args(inputs, targets),
                    num_warmup_iters=warmup,
                    allow_unused_input=True,
                )
            )
            if recorder is not None:
                self.weight_gradient_replays.append(_weight_gradient_replay(recorder, inputs.device))
        self.free_slots = list(range(self.n_slots))
        if inputs.device.type == "cuda":
            torch.cuda.synchronize(inputs.device)  # the warm-ups ran on make_graphed_callables' side stream
        with torch.no_grad():
            for parameter in self.stage.parameters():
                parameter.grad.zero_()

    def _sample_args(self, inputs: torch.Tensor, targets: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        """Fresh sample arguments for one slot: make_graphed_callables keeps them as the slot's static inputs,
        which every replay copies its arguments into and its backward reads, so slots must not share them."""
        sample_inputs = inputs.detach().clone().requires_grad_(not self.stage.is_first)
        sample_states = [state.requires_grad_(True) for state in self.zero_states()]
        return (sample_inputs, *sample_states) + ((targets.detach().clone(),) if targets is not None else ())

    def run(
        self, inputs: torch.Tensor, initial_states: list[torch.Tensor | None], targets: torch.Tensor | None
    ) -> tuple[int, torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """Replay a free slot's forward on fresh state leaves (zeros where a state is None).

        Returns (slot, outputs or the chunk's loss, the state leaves, final states); the last two hold
        the graph that ``torch.autograd.backward`` runs, as the eager path's do, one entry per layer
        (None for layers without a state).
        """
        if not self.captured:
            raise RuntimeError("GraphedChunks.run before capture: the executor captures at the start of a step")
        if not self.free_slots:
            raise RuntimeError(
                f"all {self.n_slots} CUDA-graph slots of the stage with layers {self.stage.layer_indices} are in "
                "flight: the action list runs more forwards ahead of their backwards (or W tasks) than it was "
                "sized for"
            )
        slot = self.free_slots.pop()
        given = [initial_states[position] for position in self.stateful]
        zeros = self.zero_states() if any(state is None for state in given) else []
        leaves = [
            (zeros[index] if state is None else state).detach().requires_grad_(True)
            for index, state in enumerate(given)
        ]
        extra = (targets,) if targets is not None else ()
        outputs, *finals = self.callables[slot](inputs, *leaves, *extra)
        state_leaves: list[torch.Tensor | None] = [None] * len(initial_states)
        final_states: list[torch.Tensor | None] = [None] * len(initial_states)
        for position, leaf, final in zip(self.stateful, leaves, finals):
            state_leaves[position], final_states[position] = leaf, final
        return slot, outputs, state_leaves, final_states

    def apply_weight_gradients(self, slot: int) -> None:
        """``W`` of the chunk in slot ``slot`` of a splitting stage: add its linear layers' weight gradients."""
        self.weight_gradient_replays[slot]()

    def release(self, slot: int) -> None:
        """B (W on a splitting stage) is done with the slot: its next forward may overwrite what it handed out."""
        self.free_slots.append(slot)


def _weight_gradient_replay(recorder: WeightGradientRecorder, device: torch.device) -> Callable[[], None]:
    """``recorder.apply`` as a captured CUDA graph over the buffers it recorded at capture ([Note: splitting
    slots]); on the CPU (the tests' stand-in for graphs) the eager call, over the last backward's records."""
    if device.type != "cuda":
        return recorder.apply
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        recorder.apply()  # warm-up (cuBLAS picks its kernels); capture zeroes the gradients afterwards
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        recorder.apply()
    return graph.replay
