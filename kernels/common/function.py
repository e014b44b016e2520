"""The autograd.Function shared by the chunked operators, parametrised by an implementation.

An implementation (pure PyTorch or Triton) provides its forward and its backward as three phases each, cut
where the state entering the span is first needed ([Note: span phases]):

    prepare_forward(q, k, v, g) -> prepared
    scan_forward(prepared, initial_state) -> ScannedForward      chunk states from initial_state (None: zero)
    finish_forward(prepared, scanned, q, k, v, g, scale, incoming_state, save_states)
        -> (o, final_state, saved_states or None)
    prepare_backward(q, k, v, g, do, scale, saved_states) -> prepared
    scan_backward(prepared, initial_state, final_state_grad, saved_states) -> ScannedBackward
    finish_backward(prepared, scanned, q, k, v, g, scale, do, incoming_state, incoming_state_grad)
        -> (dq, dk, dv, dg, d_initial_state)
    total_log_decay(prepared) -> sum of g over the span, [B, H, K] (GLA) or [B, H] (simple GLA), float32

``incoming_state`` / ``incoming_state_grad`` are None for a single-device call. Given, the scans ran from a
zero state and a zero final-state gradient, and the finish adds exp(prefix) * incoming_state to every state
it reads and exp(suffix) * incoming_state_grad to every state gradient (kernels/common/triton_incoming.py);
its final state and initial-state gradient are then those of the whole recurrence.

By default the backward recomputes the chunk-boundary states instead of keeping them from the forward, so
memory stays at the inputs' size; with save_states an implementation may return them from its forward
(saved_states), and its backward scan then skips that recomputation (the Triton implementations do; the
PyTorch one returns None and recomputes). Saved states are what the forward scan produced: local ones under
an incoming state, which the backward's finish corrects the same way.

[Note: span phases]
The recurrence is linear in its initial state: S_out = gamma * S_in + S_local, where S_local is the final
state from a zero initial state and gamma = exp(sum of g over the span); likewise the gradient of S_in is
dS_in_local + gamma * dS_out, where dS_in_local flows from the outputs alone. A sequence-parallel rank
therefore prepares and scans its chunks from zero exactly as one device would (the per-chunk updates and
the scan need no incoming state), sends the scan's last value (S_local, or dS_in_local in the backward)
into the cross-rank scan, and finishes from the S_in (and dS_out) that scan returns, the kernels adding the
incoming term to each state tile as they load it. No pass is added to the single-device operator's, and no
output correction over the sequence is ever formed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from schedlang.kernels.common.arguments import CHUNK_SIZE


@dataclass(frozen=True)
class ScannedForward:
    """What a forward scan leaves: the state entering every chunk and the state after the last token
    (float32 ``[B, H, K, V]``); the PyTorch path also keeps the chunks' prefix log decays."""

    states: torch.Tensor
    final_state: torch.Tensor
    log_decay: torch.Tensor | None = None


@dataclass(frozen=True)
class ScannedBackward:
    """What a backward scan leaves: the states entering every chunk, the gradients of the states leaving every
    chunk, and the gradient of the initial state; the PyTorch path also keeps both scans' log decays."""

    states: torch.Tensor
    state_grads: torch.Tensor
    initial_grad: torch.Tensor
    state_log_decay: torch.Tensor | None = None
    grad_log_decay: torch.Tensor | None = None


@dataclass(frozen=True)
class Implementation:
    """One backend of a chunked operator, as the phases of [Note: span phases]."""

    name: str
    prepare_forward: Callable[..., Any]
    scan_forward: Callable[..., ScannedForward]
    finish_forward: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]
    prepare_backward: Callable[..., Any]
    scan_backward: Callable[..., ScannedBackward]
    finish_backward: Callable[..., tuple[torch.Tensor, ...]]
    total_log_decay: Callable[[Any], torch.Tensor]

    def forward(self, q, k, v, g, scale, initial_state, save_states=False):
        prepared = self.prepare_forward(q, k, v, g)
        scanned = self.scan_forward(prepared, initial_state)
        return self.finish_forward(prepared, scanned, q, k, v, g, scale, None, save_states)

    def backward(self, q, k, v, g, scale, initial_state, do, final_state_grad, saved_states=None):
        prepared = self.prepare_backward(q, k, v, g, do, scale, saved_states)
        scanned = self.scan_backward(prepared, initial_state, final_state_grad, saved_states)
        return self.finish_backward(prepared, scanned, q, k, v, g, scale, do, None, None)


@dataclass(frozen=True)
class TorchPrepared:
    """The PyTorch path's first phase keeps its operands (q and do only in the backward)."""

    q: torch.Tensor | None
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    do: torch.Tensor | None = None
    scale: float = 1.0


def torch_implementation(pieces) -> Implementation:
    """The pure-PyTorch Implementation from an operator's chunk_torch module (its local_chunk_states,
    update_state_rows, intra_chunk_output, output_from_states, local_chunk_state_gradients and
    intra_chunk_gradients). Nothing runs under autograd: the Function supplies the gradients."""

    def states_from(prepared: TorchPrepared, initial_state):
        local = pieces.local_chunk_states(prepared.k, prepared.v, prepared.g, CHUNK_SIZE)
        if initial_state is None:
            return local.states, local.log_decay
        return pieces.update_state_rows(initial_state, local.states, local.log_decay), local.log_decay

    def prepare_forward(q, k, v, g):
        return TorchPrepared(None, k, v, g)

    @torch.no_grad()
    def scan_forward(prepared, initial_state):
        states, log_decay = states_from(prepared, initial_state)
        return ScannedForward(states, states[:, :, -1], log_decay)

    @torch.no_grad()
    def finish_forward(prepared, scanned, q, k, v, g, scale, incoming_state, save_states=False):
        states = scanned.states
        if incoming_state is not None:
            states = pieces.update_state_rows(incoming_state, states, scanned.log_decay)
        output = pieces.intra_chunk_output(q, k, v, g, scale, CHUNK_SIZE) + pieces.output_from_states(
            q, g, states, scale, CHUNK_SIZE
        )
        return output.to(v.dtype), states[:, :, -1], None

    def prepare_backward(q, k, v, g, do, scale, saved_states=None):
        return TorchPrepared(q, k, v, g, do, scale)

    @torch.no_grad()
    def scan_backward(prepared, initial_state, final_state_grad, saved_states=None):
        states, state_log_decay = states_from(prepared, initial_state)
        local = pieces.local_chunk_state_gradients(prepared.q, prepared.g, prepared.do, prepared.scale, CHUNK_SIZE)
        state_grads = local.states
        if final_state_grad is not None:
            state_grads = pieces.update_state_rows(final_state_grad, state_grads, local.log_decay)
        return ScannedBackward(states, state_grads, state_grads[:, :, 0], state_log_decay, local.log_decay)

    @torch.no_grad()
    def finish_backward(prepared, scanned, q, k, v, g, scale, do, incoming_state, incoming_state_grad):
        states, state_grads = scanned.states, scanned.state_grads
        if incoming_state is not None:
            states = pieces.update_state_rows(incoming_state, states, scanned.state_log_decay)
        if incoming_state_grad is not None:
            state_grads = pieces.update_state_rows(incoming_state_grad, state_grads, scanned.grad_log_decay)
        dq, dk, dv, dg = pieces.intra_chunk_gradients(q, k, v, g, do, states, state_grads, scale, CHUNK_SIZE)
        return dq, dk, dv, dg, state_grads[:, :, 0]

    def total_log_decay(prepared: TorchPrepared):
        state_dtype = torch.float64 if prepared.g.dtype == torch.float64 else torch.float32
        return prepared.g.to(state_dtype).sum(dim=1)

    return Implementation(
        "torch", prepare_forward, scan_forward, finish_forward, prepare_backward, scan_backward, finish_backward,
        total_log_decay,
    )


class ChunkRecurrenceFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, initial_state, scale, implementation, save_states=False):
        output, final_state, saved_states = implementation.forward(q, k, v, g, scale, initial_state, save_states)
        ctx.save_for_backward(q, k, v, g, initial_state, saved_states)
        ctx.scale = scale
        ctx.implementation = implementation
        return output, final_state

    @staticmethod
    def backward(ctx, output_grad, final_state_grad):
        q, k, v, g, initial_state, saved_states = ctx.saved_tensors
        if output_grad is None:
            output_grad = torch.zeros_like(v)
        dq, dk, dv, dg, d_initial = ctx.implementation.backward(
            q, k, v, g, ctx.scale, initial_state, output_grad.contiguous(), final_state_grad, saved_states
        )
        if initial_state is None:
            d_initial = None
        else:
            d_initial = d_initial.to(initial_state.dtype)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg.to(g.dtype), d_initial, None, None, None
