"""Predicted device memory per pipeline stage: the terms of :mod:`schedlang.lowering.memory_terms` added up
along each stage's program order.

Contract. Input: a checked program and its per-stage orders (legal: the compiler's order pass and
legality pass ran). Output: one :class:`StageMemory` per stage, the bytes of each component at the moment
the stage's allocated memory peaks, and the predicted *reserved* peak (what ``torch.cuda.max_memory_reserved``
reports), which is what must fit the device.

Semantics. A stage runs its tasks one at a time in program order, so its memory over a step is a function of
that order alone (times do not matter). Walking it, each task's moment holds:

* static: parameters, gradients and optimizer state (``StaticPart``);
* activations of the chunks in flight: chunk ``(a, i)`` allocates at the start of ``F(a, i)`` and frees at
  the end of ``B(a, i)`` (of ``W(a, i)`` with a split backward), [Note: activation bytes]; with
  ``pipeline.offload`` the device holds at most :data:`OFFLOAD_RESIDENT_CHUNKS` of them (the chunk being
  computed and one on the copy stream), the rest waiting in pinned host memory;
* the recurrent states: a chunk's final states from the end of its forward to the end of its backward (the
  states a forward hands to the next chunk's are those tensors, so that hand-off adds nothing), and each
  gradient a task hands to another of its stage (the state gradients ``B(a, i)`` hands to ``B(a, i - 1)``)
  from the end of the task that hands it on to the end of the task that takes it;
* the K/V buffers of attn layers, opened by a microbatch's first forward and, with their gradient buffers,
  its last backward, closed after ``B(a, 0)``;
* communication: the runtime keeps every message a task sends (every sent activation: every stage but the
  last; every sent input gradient: every stage but the first) until the step's sends are finished at its
  end, and a gradient a task received (the output gradient of a backward) while that task runs; a received
  activation is the chunk's input, counted with its activations;
* the transient of the running backward (``transient_bytes``: its largest layer's workspace);
* with ``cuda_graphs = true``, instead of the activations and transients: one private pool per graph slot,
  allocated at capture and held for the run, each as large as a chunk's activations and transient
  ([Note: graph slots] in schedlang.runtime.graphs: one slot per chunk in flight); with ``cuda_graphs =
  step`` the one pool of the step's graphs is used as the eager step uses the allocator ([Note: step graphs]
  in schedlang.runtime.step_graphs), so the walk is the eager one, except that every sent tensor is a graph
  output kept from its capture on: all of the step's sent tensors are live throughout;

and after the last task, with gradients reduced across sequence-parallel ranks or data replicas, the
flattened copy of the stage's gradients. The allocated peak is the largest of those moments;
:data:`RESERVED_PER_ALLOCATED` turns it into the reserved peak.

Host. With ``pipeline.offload`` every chunk's saved activations have a pinned host copy from the start of its
``F`` to the end of its ``B`` (``ActivationOffload.release`` runs there, also when ``W`` is split off; a chunk
prefetched back to the device keeps its host copy until then). A chunk whose ``F`` is directly followed by its
own ``B`` has none: it keeps them on the device (``offload_copies`` in schedlang.vocabulary.actions). So a
stage's pinned host memory is the largest sum of the activation bytes of the chunks between those two ends over
the walk: ``StageMemory.pinned_host``, 0 without offload. It is the host's peak, which need not fall at the device's; how the ranks of a node add
up, and what must fit, is schedlang.lowering.memory_budget's business.

Which task sends, receives, hands on or takes what, and which task's end frees a chunk's activations, is read
from the table of edge rules ([Note: edge rules] in schedlang.vocabulary.edges), passed as ``rules``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

from schedlang.lowering.memory_terms import (
    Device,
    StaticPart,
    activation_message_bytes,
    chunk_activation_bytes,
    key_value_bytes,
    reduced_gradient_bytes,
    state_bytes,
    static_bytes,
    transient_bytes,
)
from schedlang.lowering.orders import stage_orders
from schedlang.lowering.program import ScheduleProgram
from schedlang.vocabulary import CudaGraphs
from schedlang.vocabulary.actions import ActionKind, OffloadCopy, TaskId, offload_copies
from schedlang.vocabulary.edges import EDGE_RULES, EdgeRules

RESERVED_PER_ALLOCATED = 1.05
"""[Note: reserved memory] The predicted reserved peak is the allocated peak times this factor. PyTorch's
caching allocator reserves whole segments (2 MiB for small blocks, at least the request rounded up to 2 MiB
for large ones) and keeps freed blocks for reuse; a block freed among live ones can only be reused by a
request that fits it, so when chunk activations of several sizes alternate (a backward's gradients are
allocated while the saved tensors of other chunks are still live) the reserved peak runs above the allocated
one. The factor is the middle of the reserved/allocated ratios measured on one stage
(``benchmarks/memory_model.py``; docs/benchmarks.md, "Memory model against measured peaks"); it is the one
number to change when other measurements disagree."""

OFFLOAD_RESIDENT_CHUNKS = 2
"""With ``pipeline.offload``, the chunks whose saved activations are on the device at once: the one whose
forward (or backward) runs and the one being copied to the host after its forward or back ahead of its
backward on the copy stream."""


class Component(str, Enum):
    """What a stage's memory is made of, in the order the tables print them."""

    PARAMETERS = "parameters"
    GRADIENTS = "gradients"
    OPTIMIZER = "optimizer"
    ACTIVATIONS = "activations"
    STATES = "states"
    KEY_VALUE = "kv_buffers"
    COMMUNICATION = "communication"
    GRAPH_POOLS = "graph_pools"
    TRANSIENT = "transient"


STATIC_COMPONENTS = {
    StaticPart.PARAMETERS: Component.PARAMETERS,
    StaticPart.GRADIENTS: Component.GRADIENTS,
    StaticPart.OPTIMIZER: Component.OPTIMIZER,
}


@dataclass(frozen=True)
class StageMemory:
    """One stage's predicted memory at its allocated peak, in bytes."""

    stage: int
    components: dict[Component, float] = field(hash=False)
    chunks_in_flight: int  # at the peak
    peak_task: TaskId | None  # the task running at the peak; None: after the step's last task
    pinned_host: float = 0.0  # with offload, the stage's pinned host bytes at their own peak (module docstring)

    @property
    def allocated(self) -> float:
        return sum(self.components.values())

    @property
    def reserved(self) -> float:
        """The predicted reserved peak ([Note: reserved memory])."""
        return RESERVED_PER_ALLOCATED * self.allocated


def predict_memory(
    program: ScheduleProgram,
    orders: Sequence[Sequence[TaskId]] | None = None,
    device: Device = Device.CUDA,
    rules: EdgeRules = EDGE_RULES,
) -> tuple[StageMemory, ...]:
    """Each stage's memory at its peak; see the module docstring."""
    if orders is None:
        orders = stage_orders(program)
    return tuple(_stage_memory(program, stage, tuple(order), device, rules) for stage, order in enumerate(orders))


def graph_slots(program: ScheduleProgram, order: Sequence[TaskId], rules: EdgeRules = EDGE_RULES) -> int:
    """The most chunks in flight in a stage's order: the runtime captures one graph slot per chunk in flight
    (``schedlang.runtime.graphs.slots_needed``)."""
    releasing = rules.releasing_kind(program.pipeline.split_backward)
    in_flight = most = 0
    for task in order:
        if task.kind is ActionKind.FORWARD:
            in_flight += 1
            most = max(most, in_flight)
        elif task.kind is releasing:
            in_flight -= 1
    return most


def _stage_memory(
    program: ScheduleProgram, stage: int, order: tuple[TaskId, ...], device: Device, rules: EdgeRules
) -> StageMemory:
    pipeline = program.pipeline
    releasing = rules.releasing_kind(pipeline.split_backward)
    n_chunks = program.n_chunks
    chunk_bytes = [chunk_activation_bytes(program, stage, chunk, device=device) for chunk in range(n_chunks)]
    chunk_transient = [transient_bytes(program, stage, chunk, device) for chunk in range(n_chunks)]
    one_state = state_bytes(program, stage)
    key_values = key_value_bytes(program, stage)

    static = {STATIC_COMPONENTS[part]: value for part, value in static_bytes(program, stage).items()}
    slots = pipeline.cuda_graphs is CudaGraphs.CHUNK_SLOTS
    pools = 0.0
    if slots:
        pools = graph_slots(program, order, rules) * (max(chunk_bytes) + max(chunk_transient))

    in_flight: dict[tuple[int, int], float] = {}  # chunk -> its activation bytes
    on_host: dict[tuple[int, int], float] = {}  # with offload: chunk -> its pinned host copy's bytes
    pinned_host = 0.0
    states = 0.0
    key_value = 0.0
    sent = _sent_bytes(program, order, rules) if pipeline.cuda_graphs is CudaGraphs.STEP else 0.0
    kept_sent = sent  # step graphs keep every sent tensor; otherwise the step's end frees them
    best: StageMemory | None = None

    def moment(task: TaskId | None, received: float, transient: float) -> None:
        nonlocal best
        if slots:
            activations, transient = 0.0, 0.0
        elif pipeline.offload:
            largest = sorted(in_flight.values(), reverse=True)[:OFFLOAD_RESIDENT_CHUNKS]
            activations = sum(largest)
        else:
            activations = sum(in_flight.values())
        components = dict(static)
        components.update(
            {
                Component.ACTIVATIONS: activations,
                Component.STATES: states,
                Component.KEY_VALUE: key_value,
                Component.COMMUNICATION: sent + received,
                Component.GRAPH_POOLS: pools,
                Component.TRANSIENT: transient,
            }
        )
        candidate = StageMemory(stage, components, len(in_flight), task)
        if best is None or candidate.allocated > best.allocated:
            best = candidate

    copies = offload_copies(tuple(task.action for task in order)) if pipeline.offload else {}
    edges_by_kind_and_chunk: dict[tuple[ActionKind, int], _TaskEdges] = {}  # the rules' shifts keep the microbatch
    for task in order:
        unit = (task.microbatch, task.chunk)
        if (task.kind, task.chunk) not in edges_by_kind_and_chunk:
            edges_by_kind_and_chunk[task.kind, task.chunk] = _TaskEdges.of(program, task, rules)
        edges = edges_by_kind_and_chunk[task.kind, task.chunk]
        if task.kind is ActionKind.FORWARD:
            if task.chunk == 0:
                key_value += key_values
            in_flight[unit] = chunk_bytes[task.chunk]
            if pipeline.offload and copies[unit] is not OffloadCopy.KEPT:
                on_host[unit] = chunk_bytes[task.chunk]
                pinned_host = max(pinned_host, sum(on_host.values()))
            moment(task, edges.received_gradients, 0.0)
            states += one_state
        if task.kind is ActionKind.BACKWARD:
            if task.chunk == n_chunks - 1:
                key_value += key_values  # the gradient buffers
            moment(task, edges.received_gradients, chunk_transient[task.chunk])
            states -= one_state
            if task.chunk == 0:
                key_value -= 2 * key_values
            on_host.pop(unit, None)  # released at the end of B, split W or not
        states += one_state * (edges.gradients_handed_on - edges.gradients_taken)
        if not kept_sent:
            sent += edges.sent
        if task.kind is releasing:
            in_flight.pop(unit, None)
    sent = kept_sent  # the step's sends are finished before its gradients are reduced
    moment(None, 0.0, _gradient_reduction_bytes(program, stage))
    return replace(best, pinned_host=pinned_host)


@dataclass(frozen=True)
class _TaskEdges:
    """What one task's edges move, by the rule table: the bytes it sends to other stages and the gradient bytes it
    received from them, and how many same-stage gradient hand-offs (state gradients) it gives and takes."""

    sent: float
    received_gradients: float
    gradients_handed_on: int
    gradients_taken: int

    @classmethod
    def of(cls, program: ScheduleProgram, task: TaskId, rules: EdgeRules) -> _TaskEdges:
        split = program.pipeline.split_backward
        n_stages, n_chunks = program.n_stages, program.n_chunks
        predecessors = rules.predecessors(task, n_stages, n_chunks, split)
        successors = rules.successors(task, n_stages, n_chunks, split)
        return cls(
            sent=sum(activation_message_bytes(program, task.chunk) for _, rule in successors if rule.is_message),
            received_gradients=sum(
                activation_message_bytes(program, source.chunk)
                for source, rule in predecessors
                if rule.is_message and rule.payload.is_gradient
            ),
            gradients_handed_on=sum(1 for _, rule in successors if _is_gradient_hand_off(rule)),
            gradients_taken=sum(1 for _, rule in predecessors if _is_gradient_hand_off(rule)),
        )


def _is_gradient_hand_off(rule) -> bool:
    return rule.same_stage and rule.payload.is_gradient


def _sent_bytes(program: ScheduleProgram, order: tuple[TaskId, ...], rules: EdgeRules) -> float:
    """Every message the stage sends in a step (every activation but the last stage's, every input gradient but
    the first stage's)."""
    sent: dict[tuple[ActionKind, int], float] = {}  # the rules' shifts keep the microbatch
    for task in order:
        if (task.kind, task.chunk) not in sent:
            sent[task.kind, task.chunk] = _TaskEdges.of(program, task, rules).sent
    return sum(sent[task.kind, task.chunk] for task in order)


def _gradient_reduction_bytes(program: ScheduleProgram, stage: int) -> float:
    """The flattened copy of a stage's gradients that the step's all-reduce over sequence-parallel ranks and
    data replicas works on (``Trainer.reduce_gradients``)."""
    if program.mesh.sequence * program.mesh.data == 1:
        return 0.0
    return reduced_gradient_bytes(program, stage)
