"""Triton pieces shared by the chunked operators: the state scan (GLA's path; simple GLA
walks its states instead, kernels/simple_gla/state_walks.py).

The state pass is split the way ZeCO splits it across devices, here across thread blocks: every chunk's
contribution U_n is a matrix product that runs in parallel over chunks (the operator's own kernel, which
also forms the chunk-local gate cumsum), and
only the elementwise scan  S_{n+1} = exp(gamma_n) * S_n + U_n  is sequential. The scan is spread over
small row blocks of the state so that many programs run it at once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from schedlang.kernels.common.function import Implementation
from schedlang.kernels.common.launch_tables import register_launch_table
from schedlang.kernels.common.sizes import cdiv, launch_options, next_power_of_2, states_dtype


def new_output(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised kernel output, NaN-filled when SCHEDLANG_KERNELS_POISON_OUTPUTS=1 (tests)."""
    if os.environ.get("SCHEDLANG_KERNELS_POISON_OUTPUTS") == "1":
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _step_chunk(i_bh, step, NT, K: tl.constexpr, V: tl.constexpr, REVERSE: tl.constexpr):
    """(the chunk scan step ``step`` visits, the offset of its [K, V] entry in a [BH, NT, K, V] tensor)."""
    if REVERSE:
        i_n = NT - 1 - step
    else:
        i_n = step
    return i_n, (i_bh * NT + i_n).to(tl.int64) * K * V


@triton.jit
def _scan_operands(
    updates, chunk_gate, i_bh, step, o_k, i_k, i_v, NT,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    SCALAR_GATE: tl.constexpr, REVERSE: tl.constexpr,
):
    """The update tile and the decay of scan step ``step`` (clamped to the last step: a prefetch past the end
    reloads it and is never used), float32."""
    i_n, offset = _step_chunk(i_bh, tl.minimum(step, NT - 1), NT, K, V, REVERSE)
    p_update = tl.make_block_ptr(updates + offset, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
    b_update = tl.load(p_update, boundary_check=(0, 1)).to(tl.float32)
    if SCALAR_GATE:
        b_decay = tl.exp(tl.load(chunk_gate + i_bh * NT + i_n) + tl.zeros([BK], dtype=tl.float32))
    else:
        b_decay = tl.exp(tl.load(chunk_gate + (i_bh * NT + i_n) * K + o_k, mask=o_k < K, other=0.0))
    return b_update, b_decay


@triton.jit
def _scan_step(
    updates, chunk_gate, states, b_state, b_u0, b_d0, b_u1, b_d1, b_u2, b_d2, i_bh, step, o_k, i_k, i_v, NT,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    SCALAR_GATE: tl.constexpr, REVERSE: tl.constexpr, PREFETCH: tl.constexpr, STORE: tl.constexpr,
):
    """Stores the state entering step ``step`` (with STORE) and advances it; with PREFETCH, (b_u0, b_d0) hold this step's
    operands, loaded three steps earlier, and the operands of step + 3 are loaded; returns the state and the
    operands rotated one step."""
    if PREFETCH:
        b_u3, b_d3 = _scan_operands(updates, chunk_gate, i_bh, step + 3, o_k, i_k, i_v, NT, K, V, BK, BV, SCALAR_GATE, REVERSE)
    else:
        b_u0, b_d0 = _scan_operands(updates, chunk_gate, i_bh, step, o_k, i_k, i_v, NT, K, V, BK, BV, SCALAR_GATE, REVERSE)
        b_u3, b_d3 = b_u0, b_d0
    if STORE:
        _, offset = _step_chunk(i_bh, step, NT, K, V, REVERSE)
        p_state = tl.make_block_ptr(states + offset, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
        tl.store(p_state, b_state.to(p_state.dtype.element_ty), boundary_check=(0, 1))
    b_state = b_state * b_d0[:, None] + b_u0
    return b_state, b_u1, b_d1, b_u2, b_d2, b_u3, b_d3


@triton.jit
def _scan(
    updates, chunk_gate, states, initial_state, final_state, i_k, i_v, i_bh, NT,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    SCALAR_GATE: tl.constexpr, REVERSE: tl.constexpr, HAS_INITIAL: tl.constexpr, INTERPRETED: tl.constexpr,
    PREFETCH: tl.constexpr, STORE: tl.constexpr,
):
    # [Note: scan prefetch] The chain S_{n+1} = exp(gamma_n) S_n + U_n is one multiply-add per step; U_n and
    # gamma_n do not depend on it. With PREFETCH the loop loads the operands of step + 3 and uses those loaded
    # three steps earlier, so four loads are in flight while the chain waits (Triton's software pipeliner
    # leaves these loads alone: they feed no dot). Without it each step loads, then uses, its own operands.
    # Triton 3.6's interpreter cannot take a run-time loop bound in range() under numpy >= 2.4 (it converts
    # a one-element array with int()), so interpreted runs loop with while.
    o_k = i_k * BK + tl.arange(0, BK)
    b_state = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_INITIAL:
        p_initial = tl.make_block_ptr(initial_state + i_bh * K * V, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
        b_state += tl.load(p_initial, boundary_check=(0, 1)).to(tl.float32)
    b_u0, b_d0 = _scan_operands(updates, chunk_gate, i_bh, 0, o_k, i_k, i_v, NT, K, V, BK, BV, SCALAR_GATE, REVERSE)
    b_u1, b_d1, b_u2, b_d2 = b_u0, b_d0, b_u0, b_d0
    if PREFETCH:
        b_u1, b_d1 = _scan_operands(updates, chunk_gate, i_bh, 1, o_k, i_k, i_v, NT, K, V, BK, BV, SCALAR_GATE, REVERSE)
        b_u2, b_d2 = _scan_operands(updates, chunk_gate, i_bh, 2, o_k, i_k, i_v, NT, K, V, BK, BV, SCALAR_GATE, REVERSE)
    if INTERPRETED:
        step = 0
        while step < NT:
            b_state, b_u0, b_d0, b_u1, b_d1, b_u2, b_d2 = _scan_step(
                updates, chunk_gate, states, b_state, b_u0, b_d0, b_u1, b_d1, b_u2, b_d2, i_bh, step, o_k, i_k, i_v,
                NT, K, V, BK, BV, SCALAR_GATE, REVERSE, PREFETCH, STORE,
            )
            step += 1
    else:
        for step in range(NT):
            b_state, b_u0, b_d0, b_u1, b_d1, b_u2, b_d2 = _scan_step(
                updates, chunk_gate, states, b_state, b_u0, b_d0, b_u1, b_d1, b_u2, b_d2, i_bh, step, o_k, i_k, i_v,
                NT, K, V, BK, BV, SCALAR_GATE, REVERSE, PREFETCH, STORE,
            )
    p_final = tl.make_block_ptr(final_state + i_bh * K * V, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
    tl.store(p_final, b_state, boundary_check=(0, 1))


@triton.jit
def chunk_state_scan_kernel(
    updates, chunk_gate, states, initial_state, final_state, NT,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    SCALAR_GATE: tl.constexpr, REVERSE: tl.constexpr, HAS_INITIAL: tl.constexpr, INTERPRETED: tl.constexpr,
    PREFETCH: tl.constexpr, STORE: tl.constexpr,
):
    i_k, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    _scan(
        updates, chunk_gate, states, initial_state, final_state, i_k, i_v, i_bh, NT,
        K, V, BK, BV, SCALAR_GATE, REVERSE, HAS_INITIAL, INTERPRETED, PREFETCH, STORE,
    )


@triton.jit
def chunk_state_scan_pair_kernel(
    updates, states, initial_state, final_state, grad_updates, state_grads, final_state_grad, initial_grad,
    chunk_gate, NT, BH,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, SCALAR_GATE: tl.constexpr,
    HAS_INITIAL: tl.constexpr, HAS_FINAL_GRAD: tl.constexpr, INTERPRETED: tl.constexpr, PREFETCH: tl.constexpr,
):
    # The backward's two independent scans in one launch: programs z < BH recompute the states (forward),
    # the others scan the state gradients (reverse). Each scan alone is latency-bound on a few hundred
    # programs; side by side they share the wait.
    i_k, i_v, i_z = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if i_z < BH:
        _scan(
            updates, chunk_gate, states, initial_state, final_state, i_k, i_v, i_z, NT,
            K, V, BK, BV, SCALAR_GATE, False, HAS_INITIAL, INTERPRETED, PREFETCH, True,
        )
    else:
        _scan(
            grad_updates, chunk_gate, state_grads, final_state_grad, initial_grad, i_k, i_v, i_z - BH, NT,
            K, V, BK, BV, SCALAR_GATE, True, HAS_FINAL_GRAD, INTERPRETED, PREFETCH, True,
        )


SCAN_LAUNCH = register_launch_table("scan", __name__, {
    "scan": dict(block_k=8, block_v=32, prefetch=1, num_warps=4, num_stages=3, pair_max_chunks=64),
})
"""Tile of the state each scan program walks along the chunks (small tiles: more programs walk at once), whether
it loads three steps ahead ([Note: scan prefetch]), its launch options, and the most chunks for which the
backward runs its two scans as one launch ([Note: paired scans]); read at call time
([Note: launch tables] in kernels/common/launch_tables.py, which also says where the measurements are)."""


def _scanblock_size(key_dim: int, value_dim: int) -> tuple[int, int]:
    launch = SCAN_LAUNCH["scan"]
    return min(launch["block_k"], next_power_of_2(key_dim)), min(launch["block_v"], next_power_of_2(value_dim))


def chunk_state_scan(
    updates: torch.Tensor,
    chunk_gate: torch.Tensor,
    initial_state: torch.Tensor | None,
    states_dtype: torch.dtype,
    reverse: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scan the per-chunk updates U [B, H, NT, K, V] (float32, or 16-bit: added in float32).

    Forward (reverse=False): states[n] = state entering chunk n, S_{n+1} = exp(gate_n) S_n + U_n, from
    initial_state. Backward (reverse=True): states[n] = gradient of the state leaving chunk n,
    dS_n = exp(gate_n) dS_{n+1} + U_n, from initial_state = the final-state gradient. Returns (states in
    states_dtype, the last value of the scan [B, H, K, V] float32).
    """
    batch, heads, n_chunks, key_dim, value_dim = updates.shape
    states = new_output(updates.shape, states_dtype, updates.device)
    final_state = new_output((batch, heads, key_dim, value_dim), torch.float32, updates.device)
    block_k, block_v = _scanblock_size(key_dim, value_dim)
    grid = (cdiv(key_dim, block_k), cdiv(value_dim, block_v), batch * heads)
    chunk_state_scan_kernel[grid](
        updates, chunk_gate.contiguous(), states,
        initial_state.contiguous() if initial_state is not None else updates, final_state, n_chunks,
        K=key_dim, V=value_dim, BK=block_k, BV=block_v,
        SCALAR_GATE=chunk_gate.dim() == 3, REVERSE=reverse, HAS_INITIAL=initial_state is not None,
        INTERPRETED=INTERPRETED, PREFETCH=bool(SCAN_LAUNCH["scan"]["prefetch"]), STORE=True,
        **launch_options(SCAN_LAUNCH["scan"]),
    )
    return states, final_state


def chunk_state_scan_last(updates: torch.Tensor, chunk_gate: torch.Tensor, reverse: bool) -> torch.Tensor:
    """The last value of ``chunk_state_scan(updates, chunk_gate, None, ..., reverse)`` alone, float32
    ``[B, H, K, V]``: the span's final state from a zero initial state (forward), or the gradient of its initial
    state from the outputs alone, with a zero final-state gradient (reverse). It reads every update once and
    stores no chunk state: what one rank of a sequence-parallel group sends before it knows its incoming
    state ([Note: span phases] in kernels/common/function.py)."""
    batch, heads, n_chunks, key_dim, value_dim = updates.shape
    last = new_output((batch, heads, key_dim, value_dim), torch.float32, updates.device)
    block_k, block_v = _scanblock_size(key_dim, value_dim)
    grid = (cdiv(key_dim, block_k), cdiv(value_dim, block_v), batch * heads)
    chunk_state_scan_kernel[grid](
        updates, chunk_gate.contiguous(), updates, updates, last, n_chunks,
        K=key_dim, V=value_dim, BK=block_k, BV=block_v,
        SCALAR_GATE=chunk_gate.dim() == 3, REVERSE=reverse, HAS_INITIAL=False,
        INTERPRETED=INTERPRETED, PREFETCH=bool(SCAN_LAUNCH["scan"]["prefetch"]), STORE=False,
        **launch_options(SCAN_LAUNCH["scan"]),
    )
    return last


def chunk_state_scan_pair(
    updates: torch.Tensor,
    grad_updates: torch.Tensor,
    chunk_gate: torch.Tensor,
    initial_state: torch.Tensor | None,
    final_state_grad: torch.Tensor | None,
    states_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward's two scans in one launch: chunk_state_scan(updates, ..., initial_state, reverse=False)
    and chunk_state_scan(grad_updates, ..., final_state_grad, reverse=True). Returns (states entering each
    chunk, gradients of the states leaving each chunk, the gradient of the initial state), as those do."""
    batch, heads, n_chunks, key_dim, value_dim = updates.shape
    states = new_output(updates.shape, states_dtype, updates.device)
    state_grads = new_output(updates.shape, states_dtype, updates.device)
    final_state = new_output((batch, heads, key_dim, value_dim), torch.float32, updates.device)
    initial_grad = new_output((batch, heads, key_dim, value_dim), torch.float32, updates.device)
    block_k, block_v = _scanblock_size(key_dim, value_dim)
    grid = (cdiv(key_dim, block_k), cdiv(value_dim, block_v), 2 * batch * heads)
    chunk_state_scan_pair_kernel[grid](
        updates, states, initial_state.contiguous() if initial_state is not None else updates, final_state,
        grad_updates, state_grads,
        final_state_grad.contiguous() if final_state_grad is not None else grad_updates, initial_grad,
        chunk_gate.contiguous(), n_chunks, batch * heads,
        K=key_dim, V=value_dim, BK=block_k, BV=block_v, SCALAR_GATE=chunk_gate.dim() == 3,
        HAS_INITIAL=initial_state is not None, HAS_FINAL_GRAD=final_state_grad is not None,
        INTERPRETED=INTERPRETED, PREFETCH=bool(SCAN_LAUNCH["scan"]["prefetch"]), **launch_options(SCAN_LAUNCH["scan"]),
    )
    return states, state_grads, initial_grad


@dataclass(frozen=True)
class PreparedChunks:
    """What the first phase of a Triton forward or backward leaves ([Note: span phases] in function.py): the
    operator's gates, the per-chunk state updates (None where the phase needs none), the per-chunk
    state-gradient updates (backward only) and the per-chunk log decay ``[B, H, NT, K]`` or ``[B, H, NT]``."""

    gates: Any
    updates: torch.Tensor | None
    grad_updates: torch.Tensor | None
    chunk_gate: torch.Tensor


def prepare_chunks(gates_and_updates, chunk_gate_of, g, k, v, q=None, do=None, scale=1.0, saved_states=None) -> PreparedChunks:
    """Phase one of a Triton forward (no q, do) or backward: one launch of the operator's gate and update
    kernel. A backward given the forward's states forms the state-gradient updates alone."""
    gates, updates, grad_updates = gates_and_updates(g, k, v, q, do, scale, state_updates=saved_states is None)
    return PreparedChunks(gates, updates, grad_updates, chunk_gate_of(gates))


def local_final_state(prepared: PreparedChunks) -> torch.Tensor:
    return chunk_state_scan_last(prepared.updates, prepared.chunk_gate, reverse=False)


def local_initial_state_gradient(prepared: PreparedChunks) -> torch.Tensor:
    return chunk_state_scan_last(prepared.grad_updates, prepared.chunk_gate, reverse=True)


def total_log_decay(prepared: PreparedChunks) -> torch.Tensor:
    return prepared.chunk_gate.sum(dim=2)


def recurrence_gradients(prepared: PreparedChunks, initial_state, final_state_grad, saved_states, dtype):
    """The start of every chunked backward after its first phase: (the states entering each chunk, the
    gradients of the states leaving each chunk, the gradient of the initial state).

    Without ``saved_states`` the states are recomputed beside the state-gradient scan; with the forward's
    states only the reverse scan runs.

    [Note: paired scans]
    A scan is one chain per program; with few chunks it leaves the GPU mostly waiting, and the two scans of a
    backward share that wait when they run as one launch (chunk_state_scan_pair). With many chunks each scan
    alone keeps the memory system busy, and the paired launch is no faster than two, and slower when it also
    loads a boundary state (an initial state or a final-state gradient): above
    SCAN_LAUNCH["scan"]["pair_max_chunks"] the two scans run as separate launches.
    """
    if saved_states is not None:
        states = saved_states
    elif prepared.chunk_gate.shape[2] <= SCAN_LAUNCH["scan"]["pair_max_chunks"]:
        return chunk_state_scan_pair(
            prepared.updates, prepared.grad_updates, prepared.chunk_gate, initial_state, final_state_grad, dtype
        )
    else:
        states, _ = chunk_state_scan(prepared.updates, prepared.chunk_gate, initial_state, dtype, reverse=False)
    state_grads, initial_grad = chunk_state_scan(prepared.grad_updates, prepared.chunk_gate, final_state_grad, dtype, reverse=True)
    return states, state_grads, initial_grad


def triton_implementation(prepare_forward, finish_forward, prepare_backward, finish_backward) -> Implementation:
    """An operator's Triton Implementation from its four phase functions; the boundary terms it reads from its
    prepared chunks are the same for every operator (store-free scans and the summed chunk decays)."""
    return Implementation(
        "triton", prepare_forward, finish_forward, prepare_backward, finish_backward,
        local_final_state, local_initial_state_gradient, total_log_decay,
    )
