"""The autograd.Function shared by the chunked operators, parametrised by an implementation.

An implementation (pure PyTorch or Triton) provides its forward and its backward in two phases each, cut
where the state entering the span is first needed ([Note: span phases]):

    prepare_forward(q, k, v, g) -> prepared
    finish_forward(prepared, q, k, v, g, scale, initial_state, save_states) -> (o, final_state, saved or None)
    prepare_backward(q, k, v, g, do, scale, saved_states) -> prepared
    finish_backward(prepared, q, k, v, g, scale, initial_state, do, final_state_grad, saved_states)
        -> (dq, dk, dv, dg, d_initial_state)

and, from a prepared phase, the span's boundary terms:

    local_final_state(prepared)             the final state from a zero initial state  [B, H, K, V] float32
    local_initial_state_gradient(prepared)  d initial_state from the outputs alone      [B, H, K, V] float32
    total_log_decay(prepared)               sum of g over the span  [B, H, K] (GLA) or [B, H] (simple GLA)

with final_state_grad possibly None (no gradient flows into the final state). By default the backward
recomputes the chunk-boundary states instead of keeping them from the forward, so memory stays at the
inputs' size; with save_states an implementation may return them from its forward (saved_states), and its
backward then skips that recomputation (the Triton implementations do; the PyTorch one returns None and
recomputes).

[Note: span phases]
The recurrence is linear in its initial state: S_out = gamma * S_in + S_local, where S_local is the final
state from a zero initial state and gamma = exp(sum of g over the span); likewise the gradient of S_in is
dS_in_local + gamma * dS_out, where dS_in_local flows from the outputs alone. A sequence-parallel rank
therefore prepares (the per-chunk updates, which need no state), reads S_local from its prepared updates,
passes (S_local, gamma) into the cross-rank scan, and, once its S_in arrives, finishes exactly as the
single-device operator does from S_in. The backward does the same with the
state-gradient updates and the final-state gradient. No output correction is ever formed: each rank runs
the operator's own kernels once, from the state that really enters its span.

torch_implementation assembles the pure-PyTorch one from an operator's chunk_torch pieces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from schedlang.kernels.common.arguments import CHUNK_SIZE


@dataclass(frozen=True)
class Implementation:
    """One backend of a chunked operator, as the phases of [Note: span phases]."""

    name: str
    prepare_forward: Callable[..., Any]
    finish_forward: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]
    prepare_backward: Callable[..., Any]
    finish_backward: Callable[..., tuple[torch.Tensor, ...]]
    local_final_state: Callable[[Any], torch.Tensor]
    local_initial_state_gradient: Callable[[Any], torch.Tensor]
    total_log_decay: Callable[[Any], torch.Tensor]
    takes_ssd_ends: bool = False
    """Whether its phases take Mamba-2's pointwise ends into their kernels: finish_forward ``skip = (x, D)``
    (adds ``D[h] x`` to the output), finish_backward ``ssd_ends = (x, dt, A, D)`` (returns the ends' gradients in
    dv's place; kernels/simple_gla/chunk_triton.py, ``SsdEndGradients``)."""

    def forward(self, q, k, v, g, scale, initial_state, save_states=False, skip=None):
        """Both forward phases; ``skip = (x, D)`` (only where :attr:`takes_ssd_ends`) also adds ``D[h] x``."""
        prepared = self.prepare_forward(q, k, v, g)
        if skip is None:
            return self.finish_forward(prepared, q, k, v, g, scale, initial_state, save_states)
        self._check_takes_ssd_ends()
        return self.finish_forward(prepared, q, k, v, g, scale, initial_state, save_states, skip=skip)

    def backward(self, q, k, v, g, scale, initial_state, do, final_state_grad, saved_states=None, ssd_ends=None):
        """Both backward phases; ``ssd_ends = (x, dt, A, D)`` (only where :attr:`takes_ssd_ends`) returns Mamba-2's
        ends' gradients in dv's place."""
        prepared = self.prepare_backward(q, k, v, g, do, scale, saved_states)
        if ssd_ends is None:
            return self.finish_backward(prepared, q, k, v, g, scale, initial_state, do, final_state_grad, saved_states)
        self._check_takes_ssd_ends()
        return self.finish_backward(prepared, q, k, v, g, scale, initial_state, do, final_state_grad, saved_states,
                                    ssd_ends=ssd_ends)

    def _check_takes_ssd_ends(self):
        if not self.takes_ssd_ends:
            raise ValueError(f"the {self.name} implementation does not take Mamba-2's ends into its kernels")


@dataclass(frozen=True)
class TorchPrepared:
    """The PyTorch path's phase one keeps its operands; the boundary terms are computed from them."""

    q: torch.Tensor | None
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    do: torch.Tensor | None = None
    scale: float = 1.0


def torch_implementation(
    chunk_forward: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    chunk_states: Callable[..., torch.Tensor],
    chunk_state_gradients: Callable[..., torch.Tensor],
    intra_chunk_gradients: Callable[..., tuple[torch.Tensor, ...]],
) -> Implementation:
    """The pure-PyTorch Implementation from an operator's chunk_torch functions of the same names.

    The forward runs without autograd (the Function supplies the gradients); the backward recomputes the
    states, runs the backward state pass, then the per-chunk gradients.
    """

    def prepare_forward(q, k, v, g):
        return TorchPrepared(None, k, v, g)

    def finish_forward(prepared, q, k, v, g, scale, initial_state, save_states=False):
        with torch.no_grad():
            output, final_state = chunk_forward(q, k, v, g, scale, initial_state, CHUNK_SIZE)
        return output, final_state, None

    def prepare_backward(q, k, v, g, do, scale, saved_states=None):
        return TorchPrepared(q, k, v, g, do, scale)

    def finish_backward(prepared, q, k, v, g, scale, initial_state, do, final_state_grad, saved_states=None):
        states = chunk_states(k, v, g, initial_state, CHUNK_SIZE)
        state_grads = chunk_state_gradients(q, g, do, scale, final_state_grad, CHUNK_SIZE)
        dq, dk, dv, dg = intra_chunk_gradients(q, k, v, g, do, states, state_grads, scale, CHUNK_SIZE)
        return dq, dk, dv, dg, state_grads[:, :, 0]

    def local_final_state(prepared: TorchPrepared):
        with torch.no_grad():
            return chunk_states(prepared.k, prepared.v, prepared.g, None, CHUNK_SIZE)[:, :, -1]

    def local_initial_state_gradient(prepared: TorchPrepared):
        with torch.no_grad():
            return chunk_state_gradients(prepared.q, prepared.g, prepared.do, prepared.scale, None, CHUNK_SIZE)[:, :, 0]

    def total_log_decay(prepared: TorchPrepared):
        state_dtype = torch.float64 if prepared.g.dtype == torch.float64 else torch.float32
        return prepared.g.to(state_dtype).sum(dim=1)  # [B, H, K] or [B, H]

    return Implementation(
        "torch", prepare_forward, finish_forward, prepare_backward, finish_backward,
        local_final_state, local_initial_state_gradient, total_log_decay,
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
