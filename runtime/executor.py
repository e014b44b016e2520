"""Run one rank's static action list for one training step (StateFlow, section 3.1).

``F(a, i)`` (forward of microbatch ``a``, sequence chunk ``i``): take the
input (token ids on the first stage, the received activation elsewhere, made
a leaf that requires grad), take the recurrent states left by ``F(a, i - 1)``
from the state store as leaves that require grad, run the stage, keep the
chunk's graph, put the final states (detached) into the store for
``F(a, i + 1)``, and queue the output for ``SEND_F``. On the last stage the
chunk's loss is its summed cross-entropy divided by the number of tokens in
the *global* batch (with packed documents, of its targets that carry a loss:
[Note: packed documents] in :mod:`schedlang.runtime.packing`), so the sum over
chunks, microbatches and data replicas is exactly the single-device loss, and
so are the gradients.

``B(a, i)``: take the output gradient (the loss itself on the last stage) and
the gradients of the chunk's final states left by ``B(a, i + 1)``, run one
``torch.autograd.backward`` over outputs and final states together, put the
gradients of the chunk's initial-state leaves into the store for
``B(a, i - 1)``, queue the input gradient for ``SEND_B`` and drop the chunk's
graph. See [Note: state passing] in :mod:`schedlang.runtime.state_store`.
Which task a state, state gradient or message comes from and goes to, and
which rank a send or receive action talks to, is read from the table of edge
rules ([Note: edge rules] in :mod:`schedlang.vocabulary.edges`): a task takes
a payload where a rule carrying it gives the task a predecessor, and hands it
on where one gives it a successor.

[Note: sequence-parallel chunks]
With a sequence-parallel group of ``S`` ranks, every rank of a stage runs the
same action list on its contiguous slice of each chunk (``local_bounds``);
pipeline messages go between ranks of equal sequence index. The mixing layers
scan states across the group (``schedlang.runtime.sequence_parallel``): the
initial state is read on group rank 0 only (the others' leaves get zero
gradients) and the final state is returned on every rank, its backward
summing the gradients given on all ranks. Since only rank 0's state-leaf
gradient is non-zero, handing each rank's own leaf gradient to ``B(a, i - 1)``
gives the real gradient exactly once, as that contract requires.

``W(a, i)`` (only in schedules with ``split_backward``): the weight gradients
of the chunk's linear layers. When it directly follows ``B(a, i)`` they were
formed inside ``B`` as usual and ``W`` has nothing left to do; otherwise the
chunk's forward ran with a :class:`WeightGradientRecorder`, ``B`` left them to
it, and ``W`` applies it (see [Note: deferred weight gradients] in
:mod:`schedlang.runtime.linear`; with CUDA graphs, [Note: splitting slots]).

[Note: recompute modes]
``pipeline.recompute`` trades a second forward for the activations a chunk
keeps from its ``F`` to its ``B``. ``full``: ``F`` runs under ``no_grad``
keeping only its inputs and initial states, and ``B`` reruns the forward with
grad before the backward. ``mlp`` and ``mixer``: every block runs that part
(its pre-norm included) under ``torch.utils.checkpoint`` (non-reentrant), so
the graph keeps the part's inputs (the residual stream entering it, and the
mixer's initial state) and the first use of its activations in ``B`` reruns
it (``Block`` in :mod:`schedlang.runtime.model`). A rerun computes the same
arithmetic on the same inputs, so the results are identical: a recurrent
layer's final state handed to ``F(a, i + 1)`` is the first forward's, and
its gradient flows back through the original graph; an attention layer's
rerun writes its chunk's keys and values into the sequence-wide buffers
again, the same values into a region no pending chunk reads differently
(``B(a, i + 1)`` ran before ``B(a, i)``; [Note: sequence-wide K/V]). With
``offload`` the tensors a chunk's graph still saves wait for ``B`` in host
memory ([Note: activation offload] in :mod:`schedlang.runtime.offload`).

With CUDA graphs (``graphs``) ``F`` replays a captured slot instead of
running the stage eagerly and ``B`` gives the slot back; see
[Note: graph slots] in :mod:`schedlang.runtime.graphs`.

[Note: forward-only evaluation]
An evaluation step runs only the ``F``, ``RECV_F`` and ``SEND_F`` actions of the
step's list, in its order, under ``no_grad``: every receive still follows the
send it waits for on the stage before (the forwards of a stage run in the same
order as in training, and dropping backward work only removes waits), so the
list stays deadlock free, and every sequence-parallel rank of a stage still
runs the same collectives in the same order. A forward keeps no record, hands
its final states to the next chunk's forward, gives its receive buffer back at
once and closes its microbatch's K/V buffers after the last chunk; graphs are
not replayed (an evaluation runs eagerly). The loss is normalised by the
global token count as in training, so the sum over the ranks is the batch's
mean loss.

With step graphs
(``step_graphs``) the second step captures each compute action as it walks
the list and every later step replays them in the same order; see
[Note: step graphs] in :mod:`schedlang.runtime.step_graphs`.

[Note: recompute under step graphs]
Under step graphs a stage may recompute ``full``: ``F`` is captured running
under ``no_grad``, and ``B`` is one graph that reruns the forward with grad
and backpropagates, so a recomputed chunk costs two graph launches, as a
kept one does. The rerun's activations are allocated and freed inside ``B``'s
capture, so the step's one pool reuses their blocks as the eager step does.
What the rerun reads (the chunk's input and initial states) are tensors of
the capture walk that its record keeps from ``F`` to ``B``. ``mlp`` and
``mixer`` recompute through ``torch.utils.checkpoint``, which is not captured
(``graph_recompute_modes`` in :mod:`schedlang.vocabulary.capabilities`).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable

import torch

from schedlang.runtime.graphs import GraphedChunks
from schedlang.runtime.kv_buffers import ChunkPosition, SequenceKV
from schedlang.runtime.linear import WeightGradientRecorder, recording_weight_gradients
from schedlang.runtime.model import StageModel
from schedlang.runtime.offload import ActivationOffload, storage_key
from schedlang.runtime.p2p import StageMessenger
from schedlang.runtime.packing import ChunkDocuments, DocumentLayout, loss_targets
from schedlang.runtime.state_store import ChunkRecord, StateStore
from schedlang.runtime.step_graphs import StepGraphs
from schedlang.vocabulary import (
    Action,
    ActionKind,
    OffloadCopy,
    Recompute,
    deferred_weight_units,
    next_backwards,
    offload_copies,
)
from schedlang.vocabulary.actions import TaskId
from schedlang.vocabulary.edges import EDGE_RULES, MESSAGE_PAYLOADS, Payload


_FORWARD_ONLY = frozenset((ActionKind.FORWARD, ActionKind.RECV_ACTIVATION, ActionKind.SEND_ACTIVATION))
"""The actions an evaluation step keeps: [Note: forward-only evaluation]."""

_COMMUNICATION = frozenset(MESSAGE_PAYLOADS)

_MESSAGE_NAMES = {
    Payload.ACTIVATION: ("activation", "activation"),
    Payload.ACTIVATION_GRADIENT: ("output gradient", "input gradient"),
}
"""What a message of each payload is called by the task that receives it and by the task that sends it."""


@dataclass(frozen=True)
class _Message:
    """One send or receive action as the rule table reads it: [Note: edge rules] in schedlang.vocabulary.edges."""

    payload: Payload
    sends: bool
    task: tuple[ActionKind, int, int]  # the outbox key of the task that sent it, or the inbox key of its receiver
    peer: int | None  # the rank it goes to or comes from
    description: str


@dataclass(frozen=True)
class StepShape:
    """Sizes the executor needs to slice a batch and size its buffers."""

    chunk_boundaries: tuple[int, ...]
    local_chunk_bounds: tuple[tuple[int, int], ...]  # this rank's token range of each chunk
    microbatch_size: int
    d_model: int
    global_tokens: int
    recompute: Recompute
    # each chunk's token range on every rank of the sequence-parallel group, in group-rank order; () without one
    sequence_slices: tuple[tuple[tuple[int, int], ...], ...] = ()
    offload: bool = False  # [Note: activation offload]
    document_end: int | None = None  # the token id that ends each packed document: [Note: packed documents]

    def __post_init__(self) -> None:
        object.__setattr__(self, "recompute", Recompute(self.recompute))

    @property
    def n_chunks(self) -> int:
        return len(self.chunk_boundaries) - 1


class StageExecutor:
    def __init__(
        self,
        model: StageModel,
        shape: StepShape,
        actions: tuple[Action, ...],
        messenger: StageMessenger,
        stage: int,
        previous_stage_rank: int | None,
        next_stage_rank: int | None,
        activation_dtype: torch.dtype,
        graphs: GraphedChunks | None = None,
        step_graphs: StepGraphs | None = None,
        gradients_formed: Callable[[], None] | None = None,
    ) -> None:
        self.model = model
        self.shape = shape
        self.actions = actions
        self.messenger = messenger
        self.stage = stage
        self.previous_stage_rank = previous_stage_rank
        self.next_stage_rank = next_stage_rank
        self.activation_dtype = activation_dtype
        self.graphs = graphs  # [Note: graph slots] in schedlang.runtime.graphs
        self.step_graphs = step_graphs  # [Note: step graphs] in schedlang.runtime.step_graphs
        # called after every B and deferred W, inside its step graph: [Note: master weights]
        self.gradients_formed = gradients_formed or (lambda: None)
        # the last stage's backward starts from this instead of 1 ([Note: loss scaling] in schedlang.runtime.loss_scale)
        self.loss_gradient: torch.Tensor | None = None
        # [Note: sequence-wide K/V] in schedlang.runtime.kv_buffers
        self.kv = SequenceKV(shape.chunk_boundaries[-1]) if model.has_attention else None
        self.store = StateStore()
        self.split_backward = any(action.kind is ActionKind.WEIGHT for action in actions)
        # the stages the rule table's shifts may reach from here: those up to the next one, if there is one
        self.visible_stages = stage + (2 if next_stage_rank is not None else 1)
        # what each send and receive of the list moves, read from the rule table once
        self.messages = {action: self.message(action) for action in actions if action.kind in _COMMUNICATION}
        self.offload = ActivationOffload(self.model_device, self._stays_resident) if shape.offload else None
        self.parameter_storages = frozenset(storage_key(parameter) for parameter in model.parameters())
        self.next_backward = next_backwards(actions)  # the look-ahead of the offload's prefetch
        # units whose backward directly follows their forward keep what it saves on the device
        copies = offload_copies(actions)
        self.kept_on_device = frozenset(unit for unit, copy in copies.items() if copy is OffloadCopy.KEPT)
        if graphs is not None and graphs.splitting:  # [Note: splitting slots]: every chunk's W replays a graph
            self.deferred_weights = frozenset(
                (action.microbatch, action.chunk) for action in actions if action.kind is ActionKind.WEIGHT
            )
        else:
            self.deferred_weights = deferred_weight_units(actions)
        self.weight_recorders: dict[tuple[int, int], WeightGradientRecorder] = {}  # eager deferred W
        self.weight_slots: dict[tuple[int, int], int] = {}  # graph slots held from B to a deferred W
        # receive buffers held from B to a deferred W: [Note: received buffers of a deferred W]
        self.weight_buffers: dict[tuple[int, int], list[torch.Tensor]] = {}
        self.inbox: dict[tuple[ActionKind, int, int], torch.Tensor] = {}
        self.outbox: dict[tuple[ActionKind, int, int], torch.Tensor] = {}
        self.tokens: torch.Tensor | None = None
        self.loss_tokens = shape.global_tokens  # the step's loss normaliser: targets of the global batch with a loss
        self.documents: DocumentLayout | None = None  # the step's packed documents: [Note: packed documents]
        self.loss_sum = torch.zeros((), dtype=torch.float64)
        self.evaluating = False  # inside run_evaluation_step: [Note: forward-only evaluation]

    def task_name(self, kind: ActionKind, microbatch: int, chunk: int) -> str:
        return str(TaskId(kind, self.stage, microbatch, chunk))

    def source(self, kind: ActionKind, microbatch: int, chunk: int, payload: Payload) -> TaskId | None:
        """The task this stage's task takes ``payload`` from by the rule table, or None where it takes none
        (``F(a, 0)`` takes no state; a last stage's ``B`` receives no output gradient)."""
        return self._neighbour(kind, microbatch, chunk, payload, to_source=True)

    def destination(self, kind: ActionKind, microbatch: int, chunk: int, payload: Payload) -> TaskId | None:
        """The task this stage's task hands ``payload`` to by the rule table, or None where it hands none on."""
        return self._neighbour(kind, microbatch, chunk, payload, to_source=False)

    def _neighbour(
        self, kind: ActionKind, microbatch: int, chunk: int, payload: Payload, to_source: bool
    ) -> TaskId | None:
        task = TaskId(kind, self.stage, microbatch, chunk)
        for rule in EDGE_RULES.carrying(payload, self.split_backward):
            shift = rule.predecessor if to_source else rule.successor
            neighbour = shift(task, self.visible_stages, self.shape.n_chunks)
            if neighbour is not None:
                return neighbour
        return None

    def message(self, action: Action) -> _Message:
        """What a send or receive action moves, to or from which rank, for which task's key."""
        kind, microbatch, chunk = action
        payload = MESSAGE_PAYLOADS[kind]
        # the one rule that carries the payload across stages
        (rule,) = (rule for rule in EDGE_RULES.messages(self.split_backward) if rule.payload is payload)
        sends = kind is payload.send_action
        # a receive comes from the stage the rule shifts to, a send goes the opposite way
        towards = -rule.stage_offset if sends else rule.stage_offset
        peer = self.previous_stage_rank if towards < 0 else self.next_stage_rank
        received_name, sent_name = _MESSAGE_NAMES[payload]
        if sends:
            task = (rule.before, microbatch, chunk)
            description = f"the {sent_name} of task {self.task_name(*task)}"
        else:
            task = (rule.after, microbatch, chunk - rule.chunk_offset)
            description = f"the {received_name} that task {self.task_name(*task)} needs"
        return _Message(payload, sends, task, peer, description)

    def chunk_tokens(self, microbatch: int, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = slice(microbatch * self.shape.microbatch_size, (microbatch + 1) * self.shape.microbatch_size)
        start, end = self.shape.local_chunk_bounds[chunk]
        inputs = self.tokens[rows, start:end]
        return inputs, loss_targets(inputs, self.tokens[rows, start + 1 : end + 1], self.shape.document_end)

    def chunk_documents(self, microbatch: int, chunk: int) -> ChunkDocuments | None:
        """The packed documents of the microbatch's rows in the chunk, or None without packing."""
        if self.documents is None:
            return None
        start, end = self.shape.local_chunk_bounds[chunk]
        return self.documents.chunk(microbatch * self.shape.microbatch_size, self.shape.microbatch_size, start, end)

    def _begin_step(self, tokens: torch.Tensor, loss_tokens: int | None) -> None:
        """Take the step's tokens, its loss normaliser (None: every target of the global batch) and documents."""
        if self.shape.document_end is not None and (self.graphs is not None or self.step_graphs is not None):
            raise ValueError("packed documents do not run under CUDA graphs")
        if self.shape.document_end is not None and self.shape.sequence_slices:
            raise ValueError("packed documents do not run sequence-parallel")
        self.documents = None if self.shape.document_end is None else DocumentLayout.of(tokens, self.shape.document_end)
        self.loss_tokens = self.shape.global_tokens if loss_tokens is None else loss_tokens
        self.tokens = tokens.to(self.model_device)

    def activation_shape(self, chunk: int) -> tuple[int, int, int]:
        start, end = self.shape.local_chunk_bounds[chunk]
        length = end - start
        return (self.shape.microbatch_size, length, self.shape.d_model)

    def run_step(self, tokens: torch.Tensor, loss_tokens: int | None = None) -> torch.Tensor:
        """Run every action once; returns this rank's share of the loss (0 off the last stage): the summed
        loss over ``loss_tokens``, the targets of the global batch that carry one (None: all of them)."""
        self._begin_step(tokens, loss_tokens)
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=self.model_device)
        if self.graphs is not None and not self.graphs.captured:
            self._capture_graphs()
        if self.step_graphs is not None:
            self.tokens = self.step_graphs.begin_step(self.tokens)
            if self.step_graphs.replaying:
                return self._replay_step()
        for action in self.actions:
            self.run_action(action)
        self.messenger.finish_sends()
        self._check_nothing_left()
        if self.step_graphs is not None and self.step_graphs.capturing:
            self.step_graphs.end_capture()
            return self._replay_step()
        return self.loss_sum

    def _check_nothing_left(self) -> None:
        offloaded = sorted(self.offload.chunks) if self.offload is not None else []
        leftovers = self.weight_recorders or self.weight_slots or self.weight_buffers or offloaded
        if not self.store.is_empty() or self.inbox or self.outbox or leftovers:
            raise RuntimeError(
                f"stage {self.stage} ended the step with unconsumed data: {self.store.describe_leftovers()}"
                f" inbox={sorted(map(str, self.inbox))} outbox={sorted(map(str, self.outbox))}"
                f" weight gradients not applied={sorted(set(self.weight_recorders) | set(self.weight_slots))}"
                f" offloaded chunks never backpropagated={offloaded}"
            )

    def _replay_step(self) -> torch.Tensor:
        """Run the action list with every compute action replayed: [Note: step graphs]."""
        graphs = self.step_graphs
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=self.model_device)
        for action in self.actions:
            kind = action.kind
            if kind in (ActionKind.FORWARD, ActionKind.BACKWARD, ActionKind.WEIGHT):
                if action in graphs.graphs:  # a W that B's backward already formed has none
                    graphs.replay(action)
                if action in graphs.losses:
                    self.loss_sum += graphs.losses[action].double()
            else:
                message = self.messages[action]
                is_gradient = message.payload.is_gradient
                if action in graphs.received:
                    buffer = graphs.received[action]
                    self.messenger.receive_into(buffer, message.peer, is_gradient, message.description)
                else:
                    self.messenger.send(graphs.sent[action], message.peer, is_gradient, message.description)
        self.messenger.finish_sends()
        return self.loss_sum

    def _captured(self, action: Action):
        """Capture what runs inside as ``action``'s graph during the capture walk; otherwise run it."""
        if self.step_graphs is not None and self.step_graphs.capturing:
            return self.step_graphs.capture(action)
        return nullcontext()

    def _capture_graphs(self) -> None:
        """Capture the chunk graphs on chunk 0's shapes: this step's tokens, or zero activations."""
        tokens, targets = self.chunk_tokens(0, 0)
        if self.model.is_first:
            inputs = tokens
        else:
            inputs = torch.zeros(self.activation_shape(0), dtype=self.activation_dtype, device=self.model_device)
        self.graphs.capture(inputs, targets if self.model.is_last else None)

    @property
    def model_device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _stays_resident(self, tensor: torch.Tensor) -> bool:
        """Whether offload leaves a saved tensor on the device: parameters and the sequence-wide K/V buffers."""
        storage = storage_key(tensor)
        if storage in self.parameter_storages:
            return True
        if self.kv is None:
            return False
        return any(
            storage in (storage_key(buffers.keys), storage_key(buffers.values)) for buffers in self.kv.open.values()
        )

    def run_action(self, action: Action) -> None:
        kind, microbatch, chunk = action
        if kind is ActionKind.FORWARD:
            self.forward(microbatch, chunk)
        elif kind is ActionKind.BACKWARD:
            self.backward(microbatch, chunk)
        elif kind is ActionKind.WEIGHT:
            self.weight(microbatch, chunk)
        elif self.step_graphs is not None and self.step_graphs.capturing and kind in _COMMUNICATION:
            self._walk_communication(action)
        else:
            message = self.messages[action]
            if message.sends:
                self.messenger.send(
                    self.outbox.pop(message.task), message.peer, message.payload.is_gradient, message.description
                )
            else:
                self.inbox[message.task] = self.messenger.receive(
                    self.activation_shape(chunk),
                    self.activation_dtype,
                    message.peer,
                    is_gradient=message.payload.is_gradient,
                    description=message.description,
                )

    def _walk_communication(self, action: Action) -> None:
        """The capture walk's receive takes its buffer and its send keeps its tensor, communicating nothing."""
        message = self.messages[action]
        if message.sends:
            self.step_graphs.sent[action] = self.outbox.pop(message.task)
        else:
            shape = self.activation_shape(action.chunk)
            buffer = self.messenger.pool.get(shape, self.activation_dtype, self.model_device)
            self.step_graphs.received[action] = self.inbox[message.task] = buffer

    def _take_input(self, microbatch: int, chunk: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.model.is_first:
            inputs, _ = self.chunk_tokens(microbatch, chunk)
            return inputs, None
        buffer = self._received(ActionKind.FORWARD, microbatch, chunk, Payload.ACTIVATION)
        return buffer, buffer

    def _received(self, kind: ActionKind, microbatch: int, chunk: int, payload: Payload) -> torch.Tensor:
        """The ``payload`` this stage's task received from another stage; an error naming the missing receive."""
        try:
            return self.inbox.pop((kind, microbatch, chunk))
        except KeyError:
            raise RuntimeError(
                f"task {self.task_name(kind, microbatch, chunk)} runs before its {_MESSAGE_NAMES[payload][0]} "
                f"was received (no {payload.receive_action.value} precedes it in the action list)"
            ) from None

    def _initial_states(self, microbatch: int, chunk: int) -> list[torch.Tensor | None]:
        source = self.source(ActionKind.FORWARD, microbatch, chunk, Payload.STATE)
        if source is None:
            return [None] * self.model.n_states
        return self.store.take_forward_states(source.microbatch, source.chunk)

    def _run_model(
        self, inputs: torch.Tensor, initial_states: list[torch.Tensor | None], microbatch: int, chunk: int
    ) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor | None], list[torch.Tensor], int | None]:
        """Forward with grad from fresh leaves.

        Returns (outputs, input leaf, state leaves, final states, the CUDA-graph slot or None).
        """
        input_leaf = None
        if not self.model.is_first:
            input_leaf = inputs.detach().requires_grad_(True)
            inputs = input_leaf
        deferred = (microbatch, chunk) in self.deferred_weights
        if self.graphs is not None:
            targets = self.chunk_tokens(microbatch, chunk)[1] if self.model.is_last else None
            slot, outputs, state_leaves, final_states = self.graphs.run(inputs, initial_states, targets)
            return outputs, input_leaf, state_leaves, final_states, slot
        state_leaves = [None if state is None else state.detach().requires_grad_(True) for state in initial_states]
        position = None
        if self.kv is not None:
            start, end = self.shape.local_chunk_bounds[chunk]
            slices = self.shape.sequence_slices[chunk] if self.shape.sequence_slices else None
            position = ChunkPosition(self.kv, microbatch, start, end, slices)
        recorder = None
        if deferred and torch.is_grad_enabled():
            recorder = self.weight_recorders[(microbatch, chunk)] = WeightGradientRecorder()
        with recording_weight_gradients(recorder):
            hidden, final_states = self.model(inputs, state_leaves, position, self.chunk_documents(microbatch, chunk))
        if self.model.is_last:
            _, targets = self.chunk_tokens(microbatch, chunk)
            outputs = self.model.loss(hidden, targets) / self.loss_tokens
        else:
            outputs = hidden
        return outputs, input_leaf, state_leaves, final_states, None

    def forward(self, microbatch: int, chunk: int) -> None:
        inputs, input_buffer = self._take_input(microbatch, chunk)
        initial_states = self._initial_states(microbatch, chunk)
        if self.evaluating:
            self._evaluate_forward(inputs, input_buffer, initial_states, microbatch, chunk)
            return
        if self.shape.recompute is Recompute.FULL:
            with torch.no_grad(), self._captured(Action(ActionKind.FORWARD, microbatch, chunk)):
                outputs, _, _, final_states, _ = self._run_model(inputs, initial_states, microbatch, chunk)
            record = ChunkRecord(inputs, None, initial_states, None, [], input_buffer)
        else:
            offloading = self.offload is not None and (microbatch, chunk) not in self.kept_on_device
            saving = self.offload.saving((microbatch, chunk)) if offloading else nullcontext()
            with torch.enable_grad(), self._captured(Action(ActionKind.FORWARD, microbatch, chunk)), saving:
                outputs, input_leaf, state_leaves, final_states, slot = self._run_model(
                    inputs, initial_states, microbatch, chunk
                )
            record = ChunkRecord(inputs, input_leaf, state_leaves, outputs, final_states, input_buffer, slot)
        if self.destination(ActionKind.FORWARD, microbatch, chunk, Payload.STATE) is not None:
            self.store.put_forward_states(
                microbatch, chunk, [None if state is None else state.detach() for state in final_states]
            )
        self.store.put_record(microbatch, chunk, record)
        if self.model.is_last:
            self.loss_sum += outputs.detach().double()
            if self.step_graphs is not None and self.step_graphs.capturing:
                self.step_graphs.losses[Action(ActionKind.FORWARD, microbatch, chunk)] = outputs.detach()
        elif self.destination(ActionKind.FORWARD, microbatch, chunk, Payload.ACTIVATION) is not None:
            self.outbox[(ActionKind.FORWARD, microbatch, chunk)] = outputs.detach()

    def run_evaluation_step(self, tokens: torch.Tensor, loss_tokens: int | None = None) -> torch.Tensor:
        """The step's forwards only, without gradients: [Note: forward-only evaluation]. Returns this rank's
        share of the loss (0 off the last stage), normalised like a training step's."""
        self._begin_step(tokens, loss_tokens)
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=self.model_device)
        self.evaluating = True
        try:
            with torch.no_grad():
                for action in self.actions:
                    if action.kind in _FORWARD_ONLY:
                        self.run_action(action)
            self.messenger.finish_sends()
        finally:
            self.evaluating = False
        self._check_nothing_left()
        return self.loss_sum

    def _evaluate_forward(
        self,
        inputs: torch.Tensor,
        input_buffer: torch.Tensor | None,
        initial_states: list[torch.Tensor | None],
        microbatch: int,
        chunk: int,
    ) -> None:
        graphs, self.graphs = self.graphs, None  # graph slots are given back by backwards, which do not run here
        try:
            outputs, _, _, final_states, _ = self._run_model(inputs, initial_states, microbatch, chunk)
        finally:
            self.graphs = graphs
        if self.destination(ActionKind.FORWARD, microbatch, chunk, Payload.STATE) is not None:
            self.store.put_forward_states(microbatch, chunk, final_states)
        elif self.kv is not None:
            self.kv.close(microbatch)
        if input_buffer is not None:
            self.messenger.pool.give_back(input_buffer)
        if self.model.is_last:
            self.loss_sum += outputs.double()
        elif self.destination(ActionKind.FORWARD, microbatch, chunk, Payload.ACTIVATION) is not None:
            self.outbox[(ActionKind.FORWARD, microbatch, chunk)] = outputs

    def backward(self, microbatch: int, chunk: int) -> None:
        record = self.store.take_record(microbatch, chunk)
        if self.offload is not None:
            self.offload.prefetch((microbatch, chunk))
            if (microbatch, chunk) in self.next_backward:
                self.offload.prefetch(self.next_backward[(microbatch, chunk)])
        # with step graphs the whole of it is one captured graph: the rerun of a recomputed chunk, the backward and
        # the gradients handed on (zeros included); [Note: recompute under step graphs]
        with self._captured(Action(ActionKind.BACKWARD, microbatch, chunk)):
            output_gradient = self._backward_compute(record, microbatch, chunk)
        if record.graph_slot is not None:
            if (microbatch, chunk) in self.deferred_weights:
                self.weight_slots[(microbatch, chunk)] = record.graph_slot
            else:
                self.graphs.release(record.graph_slot)
        if chunk == 0 and self.kv is not None:
            self.kv.close(microbatch)
        received = [buffer for buffer in (output_gradient, record.input_buffer) if buffer is not None]
        if (microbatch, chunk) in self.deferred_weights:
            self.weight_buffers[(microbatch, chunk)] = received
            return
        for buffer in received:
            self.messenger.pool.give_back(buffer)

    def _backward_compute(self, record: ChunkRecord, microbatch: int, chunk: int) -> torch.Tensor | None:
        """``B``'s device work: rerun the chunk's forward when it is recomputed, backpropagate, hand the input
        and state gradients on; returns the received output gradient (None on the last stage)."""
        if self.shape.recompute is Recompute.FULL:
            with torch.enable_grad():
                outputs, input_leaf, state_leaves, final_states, _ = self._run_model(
                    record.inputs, record.initial_states, microbatch, chunk
                )
        else:
            outputs, input_leaf, state_leaves, final_states = (
                record.outputs,
                record.input_leaf,
                record.initial_states,
                record.final_states,
            )
        tensors, gradients = [outputs], [None if self.loss_gradient is None else self.loss_gradient.to(outputs.dtype)]
        output_gradient = None
        if self.source(ActionKind.BACKWARD, microbatch, chunk, Payload.ACTIVATION_GRADIENT) is not None:
            output_gradient = self._received(ActionKind.BACKWARD, microbatch, chunk, Payload.ACTIVATION_GRADIENT)
            gradients = [output_gradient]
        if self.source(ActionKind.BACKWARD, microbatch, chunk, Payload.STATE_GRADIENT) is not None:
            for final_state, state_gradient in zip(final_states, self.store.take_state_gradients(microbatch, chunk)):
                if final_state is not None:  # attention layers keep no state
                    tensors.append(final_state)
                    gradients.append(state_gradient)
        torch.autograd.backward(tensors, gradients)
        if self.offload is not None:
            self.offload.release((microbatch, chunk))
        # a graph slot's gradients live in its static buffers, which its next forward overwrites
        handed_out = (lambda grad: grad.clone()) if record.graph_slot is not None else (lambda grad: grad)
        state_gradient_to = self.destination(ActionKind.BACKWARD, microbatch, chunk, Payload.STATE_GRADIENT)
        if state_gradient_to is not None:
            self.store.put_state_gradients(
                state_gradient_to.microbatch,
                state_gradient_to.chunk,
                [
                    None if leaf is None else handed_out(leaf.grad) if leaf.grad is not None else torch.zeros_like(leaf)
                    for leaf in state_leaves
                ],
            )
        if self.destination(ActionKind.BACKWARD, microbatch, chunk, Payload.ACTIVATION_GRADIENT) is not None:
            self.outbox[(ActionKind.BACKWARD, microbatch, chunk)] = handed_out(input_leaf.grad)
        self.gradients_formed()
        return output_gradient

    def weight(self, microbatch: int, chunk: int) -> None:
        key = (microbatch, chunk)
        if key not in self.deferred_weights:
            return  # B formed them, as the W right behind it allows
        if key in self.weight_slots:
            slot = self.weight_slots.pop(key)
            self.graphs.apply_weight_gradients(slot)
            self.graphs.release(slot)
            self.gradients_formed()
        else:
            try:
                recorder = self.weight_recorders.pop(key)
            except KeyError:
                raise RuntimeError(
                    f"task {self.task_name(ActionKind.WEIGHT, microbatch, chunk)} runs before its backward "
                    "(no B precedes it in the action list)"
                ) from None
            with self._captured(Action(ActionKind.WEIGHT, microbatch, chunk)):
                recorder.apply()
                self.gradients_formed()
        # [Note: received buffers of a deferred W]
        # A deferred W reads the inputs and output gradients of the chunk's linear layers, and the output
        # gradient of a stage's last linear layer is the received gradient buffer itself (the residual add
        # hands it through unchanged; a graph slot copies it into its own buffer, but the tests' stand-in
        # for graphs does not). Had B given that buffer back to the pool, the next receive of that shape
        # could overwrite it before this W read it. So B keeps the receive buffers of a unit whose W is
        # deferred, and W gives them back (test_runtime_exactness.py: p3_n2_split_backward_middle_stage).
        for buffer in self.weight_buffers.pop(key, ()):
            self.messenger.pool.give_back(buffer)
