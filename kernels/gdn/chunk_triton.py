"""Triton chunked gated delta rule: host functions and the autograd Function of the Triton backend.

Forward (kernels/gdn/README.md derives every step): the WY solve per chunk (gc, exp(gc_C) and
T = (I + A)^-1), the WY products (U, W, KE), the chunk-after-chunk state pass (kernels/gdn/state_pass_triton.py:
each chunk's entering state S_n and corrections Delta_n, the final state), then the outputs. Backward: the WY
products again, the state pass again unless the forward kept its states (``save_states``), the outputs'
state-free gradients, the backward state pass, and one kernel per chunk for dq, dk, dv, dbeta and dg.

The forward keeps gc, the chunk decays and T for the backward (T is [B, H, N, 64, 64] float32: 64 values per
token and head); with ``save_states`` also S_n and Delta_n ([B, H, N, K, V] and [B, H, N, 64, V]). Those, U, W,
KE and the leaving-state gradients are stored in the states' dtype (kernels/common/sizes.py: 16 bits for
16-bit inputs, else float32); every product accumulates in float32 (kernels/gdn/README.md, "Precision").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from schedlang.kernels.common.sizes import block_size, cdiv, launch_options, states_dtype
from schedlang.kernels.common.triton_scan import new_output
from schedlang.kernels.gdn.state_pass_triton import LAUNCH, triton_state_pass_backward, triton_state_pass_forward
from schedlang.kernels.gdn.triton_backward import gdn_bwd_kernel_chunk, gdn_bwd_kernel_key_block, gdn_bwd_kernel_wy_block
from schedlang.kernels.gdn.triton_output import gdn_bwd_kernel_output_terms, gdn_fwd_kernel_output
from schedlang.kernels.gdn.triton_wy import gdn_fwd_kernel_wy_apply, gdn_fwd_kernel_wy_solve

CHUNK = 64
SUB_CHUNK = 16
"""The edge of the diagonal blocks the solve inverts by forward substitution (CHUNK // SUB_CHUNK = 4 of them)."""


def products_precision(dtype: torch.dtype) -> str:
    """The input precision of the per-chunk kernels' products for inputs of ``dtype``."""
    return LAUNCH["products"]["float32" if dtype == torch.float32 else "reduced"]


def state_pass_precision(dtype: torch.dtype) -> str | None:
    """The state pass's input precision for inputs of ``dtype``: its own table entry's for float32 inputs (None);
    16-bit inputs give it 16-bit operands, whose products take the per-chunk kernels' setting."""
    return None if dtype == torch.float32 else products_precision(dtype)


@dataclass(frozen=True)
class SolvedChunks:
    """What the WY solve leaves, chunk by chunk: gc [B, H, N, C], exp(gc_C) [B, H, N] and T [B, H, N, C, C],
    float32."""

    gate_cumsum: torch.Tensor
    chunk_decay: torch.Tensor
    inverse: torch.Tensor


def _sizes(q_or_k: torch.Tensor, v: torch.Tensor) -> dict:
    batch, length, heads, key_dim = q_or_k.shape
    return dict(T=length, N=cdiv(length, CHUNK), H=heads, K=key_dim, V=v.shape[-1], C=CHUNK)


def solve_chunks(k: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> SolvedChunks:
    """gc, the chunk decays and T = (I + A)^-1 of every chunk, from one launch."""
    batch, length, heads, key_dim = k.shape
    n_chunks = cdiv(length, CHUNK)
    device = k.device
    solved = SolvedChunks(
        new_output((batch, heads, n_chunks, CHUNK), torch.float32, device),
        new_output((batch, heads, n_chunks), torch.float32, device),
        new_output((batch, heads, n_chunks, CHUNK, CHUNK), torch.float32, device),
    )
    launch = LAUNCH["wy_solve"]
    gdn_fwd_kernel_wy_solve[(n_chunks, batch * heads)](
        k, g, beta, solved.gate_cumsum, solved.chunk_decay, solved.inverse, length, n_chunks,
        H=heads, K=key_dim, C=CHUNK, BC=SUB_CHUNK, BK=block_size(key_dim, launch["block_k"]),
        PRECISION=products_precision(k.dtype), **launch_options(launch),
    )
    return solved


def apply_inverse(k, v, beta, solved: SolvedChunks, with_updates: bool = True):
    """(U [B, H, N, C, V] or None without ``with_updates``, W [B, H, N, C, K], KE [B, H, N, C, K]) in the
    states' dtype (kernels/common/sizes.py: 16 bits for 16-bit inputs)."""
    sizes = _sizes(k, v)
    batch, n_chunks = k.shape[0], sizes["N"]
    device = k.device
    chunked = (batch, sizes["H"], n_chunks, CHUNK)
    stored = states_dtype(k.dtype)
    updates = new_output(chunked + (sizes["V"],), stored, device) if with_updates else None
    keys_in = new_output(chunked + (sizes["K"],), stored, device)
    keys_out = new_output(chunked + (sizes["K"],), stored, device)
    launch = LAUNCH["wy_apply"]
    gdn_fwd_kernel_wy_apply[(n_chunks, batch * sizes["H"])](
        k, v, beta, solved.gate_cumsum, solved.inverse, updates if with_updates else keys_in, keys_in, keys_out,
        sizes["T"], n_chunks, H=sizes["H"], K=sizes["K"], V=sizes["V"], C=CHUNK,
        BK=block_size(sizes["K"], launch["block_k"]), BV=block_size(sizes["V"], launch["block_v"]),
        PRECISION=products_precision(k.dtype), UPDATES=with_updates, **launch_options(launch),
    )
    return updates, keys_in, keys_out


def chunk_output(q, k, v, solved: SolvedChunks, states, corrections, scale: float) -> torch.Tensor:
    """o [B, T, H, V] in v's dtype from the states entering the chunks and the corrections."""
    sizes = _sizes(q, v)
    batch, heads = q.shape[0], sizes["H"]
    output = new_output(v.shape, v.dtype, v.device)
    launch = LAUNCH["output"]
    block_v = block_size(sizes["V"], launch["block_v"])
    gdn_fwd_kernel_output[(cdiv(sizes["V"], block_v), sizes["N"], batch * heads)](
        q, k, solved.gate_cumsum, states, corrections, output, scale, sizes["T"], sizes["N"],
        H=heads, K=sizes["K"], V=sizes["V"], C=CHUNK, BK=block_size(sizes["K"], launch["block_k"]), BV=block_v,
        PRECISION=products_precision(q.dtype), **launch_options(launch),
    )
    return output


def output_gradients(q, k, v, do, solved: SolvedChunks, scale: float):
    """The outputs' gradients of each chunk's entering state [B, H, N, K, V] and of its corrections
    [B, H, N, C, V], float32."""
    sizes = _sizes(q, v)
    batch, heads, n_chunks = q.shape[0], sizes["H"], sizes["N"]
    entering_grad = new_output((batch, heads, n_chunks, sizes["K"], sizes["V"]), torch.float32, q.device)
    corrections_grad = new_output((batch, heads, n_chunks, CHUNK, sizes["V"]), torch.float32, q.device)
    launch = LAUNCH["output_gradients"]
    gdn_bwd_kernel_output_terms[(n_chunks, batch * heads)](
        q, k, do, solved.gate_cumsum, entering_grad, corrections_grad, scale, sizes["T"], n_chunks,
        H=heads, K=sizes["K"], V=sizes["V"], C=CHUNK, BK=block_size(sizes["K"], launch["block_k"]),
        BV=block_size(sizes["V"], launch["block_v"]), PRECISION=products_precision(q.dtype), **launch_options(launch),
    )
    return entering_grad, corrections_grad


def chunk_gradients(q, k, v, beta, do, solved: SolvedChunks, states, leaving_grad, corrections, corrections_grad, scale):
    """(dq in q's dtype, dk float32, dv in v's dtype, dbeta float32, dg float32), user layout."""
    sizes = _sizes(q, v)
    batch, heads, n_chunks = q.shape[0], sizes["H"], sizes["N"]
    dq = new_output(q.shape, q.dtype, q.device)
    dk = new_output(k.shape, torch.float32, k.device)
    dv = new_output(v.shape, v.dtype, v.device)
    dbeta = new_output(beta.shape, torch.float32, beta.device)
    dg = new_output(beta.shape, torch.float32, beta.device)
    scratch = torch.empty(solved.inverse.shape, dtype=torch.float32, device=q.device)
    launch = LAUNCH["chunk_gradients"]
    blocks = dict(
        H=heads, K=sizes["K"], V=sizes["V"], C=CHUNK, BK=block_size(sizes["K"], launch["block_k"]),
        BV=block_size(sizes["V"], launch["block_v"]), PRECISION=products_precision(q.dtype), **launch_options(launch),
    )
    if not launch["split"]:
        gdn_bwd_kernel_chunk[(n_chunks, batch * heads)](
            q, k, v, beta, do, solved.gate_cumsum, solved.inverse, states, leaving_grad, corrections, corrections_grad,
            dq, dk, dv, dbeta, dg, scratch, scale, sizes["T"], n_chunks, **blocks,
        )
        return dq, dk, dv, dbeta, dg
    key_blocks = cdiv(sizes["K"], blocks["BK"])
    shares = key_blocks * batch * heads * n_chunks
    partial_dt = torch.empty((shares, CHUNK, CHUNK), dtype=torch.float32, device=q.device)
    partial_dbeta = torch.empty((shares, CHUNK), dtype=torch.float32, device=q.device)
    partial_dgc = torch.empty((shares, CHUNK), dtype=torch.float32, device=q.device)
    gdn_bwd_kernel_key_block[(key_blocks, n_chunks, batch * heads)](
        q, k, beta, do, solved.gate_cumsum, solved.inverse, states, leaving_grad, corrections, corrections_grad,
        dq, dk, partial_dt, partial_dbeta, partial_dgc, scale, sizes["T"], n_chunks, **blocks,
    )
    gdn_bwd_kernel_wy_block[(n_chunks, batch * heads)](
        k, v, beta, solved.gate_cumsum, solved.inverse, corrections_grad, dk, dv, dbeta, dg,
        partial_dt, partial_dbeta, partial_dgc, scratch, sizes["T"], n_chunks, **blocks,
    )
    return dq, dk, dv, dbeta, dg


def _float32(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.to(torch.float32).contiguous()


class ChunkGatedDeltaRuleFunction(torch.autograd.Function):
    """``(q, k, v, g, beta, initial_state or None, scale, save_states)`` -> ``(o, final state)``; inputs of 16 or 32
    bits, contiguous, on one CUDA device (or the interpreter). Gradients flow to the first six."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, initial_state, scale, save_states):
        ctx.set_materialize_grads(False)
        solved = solve_chunks(k, g, beta)
        updates, keys_in, keys_out = apply_inverse(k, v, beta, solved)
        states, corrections, final_state = triton_state_pass_forward(
            updates, keys_in, keys_out, solved.chunk_decay, _float32(initial_state),
            state_pass_precision(k.dtype), states_dtype(k.dtype),
        )
        output = chunk_output(q, k, v, solved, states, corrections, scale)
        kept = (states, corrections) if save_states else (None, None)
        ctx.save_for_backward(q, k, v, g, beta, initial_state, *kept, solved.gate_cumsum, solved.chunk_decay, solved.inverse)
        ctx.scale = scale
        return output, final_state

    @staticmethod
    def backward(ctx, output_grad, final_state_grad):
        q, k, v, g, beta, initial_state, states, corrections, *solved_tensors = ctx.saved_tensors
        solved = SolvedChunks(*solved_tensors)
        saved = states is not None
        updates, keys_in, keys_out = apply_inverse(k, v, beta, solved, with_updates=not saved)
        if not saved:
            states, corrections, _ = triton_state_pass_forward(
                updates, keys_in, keys_out, solved.chunk_decay, _float32(initial_state),
                state_pass_precision(k.dtype), states_dtype(k.dtype),
            )
        do = torch.zeros_like(v) if output_grad is None else output_grad.contiguous()
        entering_grad, corrections_grad = output_gradients(q, k, v, do, solved, ctx.scale)
        total, leaving, initial_grad = triton_state_pass_backward(
            keys_in, keys_out, solved.chunk_decay, entering_grad, corrections_grad, _float32(final_state_grad), v.shape[-1],
            state_pass_precision(k.dtype), states_dtype(k.dtype),
        )
        dq, dk, dv, dbeta, dg = chunk_gradients(
            q, k, v, beta, do, solved, states, leaving, corrections, total, ctx.scale
        )
        d_initial = None if initial_state is None else initial_grad.to(initial_state.dtype)
        return dq, dk.to(k.dtype), dv, dg.to(g.dtype), dbeta.to(beta.dtype), d_initial, None, None


def triton_chunk_gated_delta_rule(q, k, v, g, beta, scale: float, initial_state, save_states: bool):
    """(o [B, T, H, V] in v's dtype, final state [B, H, K, V] float32) through ChunkGatedDeltaRuleFunction."""
    q, k, v, g, beta = (tensor.contiguous() for tensor in (q, k, v, g, beta))
    return ChunkGatedDeltaRuleFunction.apply(q, k, v, g, beta, initial_state, scale, save_states)
