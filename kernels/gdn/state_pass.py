"""The gated delta rule's state pass: the one part of the chunked algorithm that runs chunk after chunk.

Per chunk ``n`` (kernels/gdn/chunk_torch.py derives them): ``U_n`` [C, V] and ``W_n`` [C, K], the WY
corrections free of the state and per unit of it; ``KE_n`` [C, K], the keys decayed to the chunk's end;
``a_n = exp(gc_C)``, the chunk's decay. With ``S_0`` the initial state,

    Delta_n = U_n - W_n S_n,        S_{n+1} = a_n S_n + KE_n^T Delta_n

gives the state entering every chunk ``S_n``, the corrections ``Delta_n`` and the final state ``S_N``.
Everything before it (the triangular solves) and after it (the outputs ``O_n = Q~_n S_n + R_n Delta_n``) is
batched over all chunks.

Backward. With ``G = dL/dS_{n+1}``, from the last chunk down (``G`` starts as the final state's gradient):

    dDelta_n = dDelta_n(ext) + KE_n G,        G <- a_n G + dS_n(ext) - W_n^T dDelta_n

and ``dS_0`` is the last ``G``. Keeping ``G_n`` (the ``G`` met at chunk ``n``), the rest is batched:
``dU = dDelta``, ``dW_n = -dDelta_n S_n^T``, ``dKE_n = Delta_n G_n^T``, ``da_n = <S_n, G_n>``.

Both loops exist twice: a Python loop over chunks (any device and dtype) and one Triton kernel each way
(kernels/gdn/state_pass_triton.py, float32, one launch for all chunks).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable


def torch_state_pass_forward(updates, keys_in, keys_out, chunk_decay, initial_state):
    """(entering states [B, H, N, K, V], corrections [B, H, N, C, V], final state [B, H, K, V]) in updates' dtype."""
    batch, heads, n_chunks, _, key_dim = keys_in.shape
    state = updates.new_zeros(batch, heads, key_dim, updates.shape[-1])
    if initial_state is not None:
        state = state + initial_state.to(updates.dtype)
    entering, corrections = [], []
    for n in range(n_chunks):
        entering.append(state)
        delta = updates[:, :, n] - keys_in[:, :, n] @ state
        corrections.append(delta)
        state = chunk_decay[:, :, n, None, None] * state + keys_out[:, :, n].transpose(-1, -2) @ delta
    return torch.stack(entering, dim=2), torch.stack(corrections, dim=2), state


def torch_state_pass_backward(keys_in, keys_out, chunk_decay, entering_grad, corrections_grad, final_grad, value_dim):
    """(total corrections gradient, gradient of each chunk's leaving state, initial-state gradient); None
    gradients count as zeros."""
    batch, heads, n_chunks, _, key_dim = keys_in.shape
    grad = keys_in.new_zeros(batch, heads, key_dim, value_dim)
    if final_grad is not None:
        grad = grad + final_grad
    totals, leaving = [None] * n_chunks, [None] * n_chunks
    for n in reversed(range(n_chunks)):
        leaving[n] = grad
        total = keys_out[:, :, n] @ grad
        if corrections_grad is not None:
            total = total + corrections_grad[:, :, n]
        totals[n] = total
        grad = chunk_decay[:, :, n, None, None] * grad - keys_in[:, :, n].transpose(-1, -2) @ total
        if entering_grad is not None:
            grad = grad + entering_grad[:, :, n]
    return torch.stack(totals, dim=2), torch.stack(leaving, dim=2), grad


def _as_float32(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.to(torch.float32).contiguous()


class GatedDeltaStatePass(torch.autograd.Function):
    """``(updates, keys_in, keys_out, chunk_decay, initial_state or None, use_triton)`` ->
    ``(entering states, corrections, final state)``, differentiable in the first five (see the module
    docstring). ``use_triton`` needs float32 operands."""

    @staticmethod
    def forward(ctx, updates, keys_in, keys_out, chunk_decay, initial_state, use_triton):
        ctx.set_materialize_grads(False)
        if use_triton:
            from schedlang.kernels.gdn.state_pass_triton import triton_state_pass_forward

            operands = [_as_float32(tensor) for tensor in (updates, keys_in, keys_out, chunk_decay, initial_state)]
            keys_in, keys_out, chunk_decay = operands[1:4]
            entering, corrections, final_state = triton_state_pass_forward(*operands)
        else:
            entering, corrections, final_state = torch_state_pass_forward(
                updates, keys_in, keys_out, chunk_decay, initial_state
            )
        ctx.save_for_backward(keys_in, keys_out, chunk_decay, entering, corrections)
        ctx.use_triton = use_triton
        ctx.has_initial_state = initial_state is not None
        ctx.value_dim = updates.shape[-1]
        return entering, corrections, final_state

    @staticmethod
    @once_differentiable
    def backward(ctx, entering_grad, corrections_grad, final_grad):
        keys_in, keys_out, chunk_decay, entering, corrections = ctx.saved_tensors
        if ctx.use_triton:
            from schedlang.kernels.gdn.state_pass_triton import triton_state_pass_backward

            grads = [_as_float32(tensor) for tensor in (entering_grad, corrections_grad, final_grad)]
            total, leaving, initial_grad = triton_state_pass_backward(
                keys_in, keys_out, chunk_decay, *grads, ctx.value_dim
            )
        else:
            total, leaving, initial_grad = torch_state_pass_backward(
                keys_in, keys_out, chunk_decay, entering_grad, corrections_grad, final_grad, ctx.value_dim
            )
        keys_in_grad = -(total @ entering.transpose(-1, -2))
        keys_out_grad = corrections @ leaving.transpose(-1, -2)
        decay_grad = (entering * leaving).sum(dim=(-2, -1))
        return total, keys_in_grad, keys_out_grad, decay_grad, initial_grad if ctx.has_initial_state else None, None


def gated_delta_state_pass(updates, keys_in, keys_out, chunk_decay, initial_state, use_triton: bool):
    """See :class:`GatedDeltaStatePass`."""
    return GatedDeltaStatePass.apply(updates, keys_in, keys_out, chunk_decay, initial_state, use_triton)
