"""The autograd.Function shared by the chunked operators, parametrised by an implementation.

An implementation (pure PyTorch or Triton) provides two functions working on plain tensors:
    forward(q, k, v, g, scale, initial_state, save_states) -> (o, final_state, saved_states or None)
    backward(q, k, v, g, scale, initial_state, do, final_state_grad, saved_states)
        -> (dq, dk, dv, dg, d_initial_state)
with final_state_grad possibly None (no gradient flows into the final state). By default the backward
recomputes the chunk-boundary states instead of keeping them from the forward, so memory stays at the
inputs' size; with save_states an implementation may return them from its forward (saved_states), and its
backward then skips that recomputation (the Triton implementations do; the PyTorch one returns None and
recomputes).
torch_implementation assembles the pure-PyTorch one from an operator's chunk_torch pieces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from schedlang.kernels.common.arguments import CHUNK_SIZE


@dataclass(frozen=True)
class Implementation:
    name: str
    forward: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    backward: Callable[..., tuple[torch.Tensor, ...]]


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

    def forward(q, k, v, g, scale, initial_state, save_states=False):
        with torch.no_grad():
            output, final_state = chunk_forward(q, k, v, g, scale, initial_state, CHUNK_SIZE)
        return output, final_state, None

    def backward(q, k, v, g, scale, initial_state, do, final_state_grad, saved_states=None):
        states = chunk_states(k, v, g, initial_state, CHUNK_SIZE)
        state_grads = chunk_state_gradients(q, g, do, scale, final_state_grad, CHUNK_SIZE)
        dq, dk, dv, dg = intra_chunk_gradients(q, k, v, g, do, states, state_grads, scale, CHUNK_SIZE)
        return dq, dk, dv, dg, state_grads[:, :, 0]

    return Implementation("torch", forward, backward)


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
