"""Triton: simple GLA's chunk states, each formed where it is walked.

A walk is one program per (batch, head, key tile, value tile) stepping along the chunks and carrying its
tile of the state in float32 registers:

    forward  S_{n+1} = exp(gl_n) S_n + (k_n * exp(gl_n - gc_n))^T v_n           states[n] = S_n (entering n)
    reverse  dS_{n-1} = exp(gl_n) dS_n + scale (q_n * exp(gc_n))^T do_n         states[n] = dS_n (leaving n)

(gc the chunk-local cumsum of the scalar gate, gl its chunk total). Each step's product is formed from the
chunk's keys and values as it is walked, so no per-chunk update is ever written and read back: against a
pass that writes every update then a scan that reads it, a walk moves two state-sized tensors fewer through
memory per direction. The chain between steps is one multiply-add; the loads and the product of the next step
do not depend on it, so Triton's pipeliner runs them ahead (``num_stages``).

The gate cumsum [B, T, H] and the chunk totals [B, H, NT] come first, from one small launch (``chunk_gates``),
so a step's gates are two loads with nothing to reduce. A launch runs the forward walk, the reverse walk, or
both side by side (programs ``z < B H`` forward, the others reverse: the backward without saved states). A walk
without ``store`` keeps no chunk state: the span's last value alone, what a sequence-parallel rank sends before
it knows its incoming state ([Note: span phases] in kernels/common/function.py). q and k may be grouped
([B, T, G, K], [Note: grouped head order]); transposed operands are loaded transposed, never formed from an
accumulator.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from schedlang.kernels.common.arguments import CHUNK_SIZE
from schedlang.kernels.common.sizes import block_size, cdiv, launch_options
from schedlang.kernels.common.triton_scan import INTERPRETED, new_output


@triton.jit
def simple_gla_chunk_gates_kernel(g, gate_cumsum, chunk_gate, T, NT, H: tl.constexpr, BT: tl.constexpr):
    # one chunk of one head: the cumsum of its scalar log gates and their total; padded tokens read g = 0
    i_nbh = tl.program_id(0)
    i_bh, i_n = i_nbh // NT, i_nbh % NT
    i_b, i_h = i_bh // H, i_bh % H
    o_t = i_n * BT + tl.arange(0, BT)
    b_g = tl.load(g + (i_b * T + o_t) * H + i_h, mask=o_t < T, other=0.0).to(tl.float32)
    tl.store(gate_cumsum + (i_b * T + o_t) * H + i_h, tl.cumsum(b_g, axis=0), mask=o_t < T)
    tl.store(chunk_gate + i_bh * NT + i_n, tl.sum(b_g, axis=0))


@triton.jit
def _walk_step(
    x, y, gate_cumsum, chunk_gate, states, b_state, scale, step, i_k, i_v, i_bh, T, NT,
    H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, PRECISION: tl.constexpr, REVERSE: tl.constexpr, STORE: tl.constexpr,
):
    i_b, i_h = i_bh // H, i_bh % H
    if REVERSE:
        i_n = NT - 1 - step
    else:
        i_n = step
    # padded tokens read a cumsum of 0: their keys or queries are zero, and exp(0) and exp(gl) stay finite
    o_t = i_n * BT + tl.arange(0, BT)
    b_gc = tl.load(gate_cumsum + (i_b * T + o_t) * H + i_h, mask=o_t < T, other=0.0)
    b_gl = tl.load(chunk_gate + i_bh * NT + i_n)
    if STORE:
        p_state = tl.make_block_ptr(states + (i_bh * NT + i_n).to(tl.int64) * K * V, (K, V), (V, 1),
                                    (i_k * BK, i_v * BV), (BK, BV), (1, 0))
        tl.store(p_state, b_state.to(p_state.dtype.element_ty), boundary_check=(0, 1))
    x_rows = i_b * T * G * K + (i_h // (H // G)) * K
    p_xt = tl.make_block_ptr(x + x_rows, (K, T), (1, G * K), (i_k * BK, i_n * BT), (BK, BT), (0, 1))
    p_y = tl.make_block_ptr(y + i_b * T * H * V + i_h * V, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
    b_xt = tl.load(p_xt, boundary_check=(0, 1), padding_option="zero")
    b_y = tl.load(p_y, boundary_check=(0, 1), padding_option="zero")
    if REVERSE:
        b_factor = tl.exp(b_gc) * scale
    else:
        b_factor = tl.exp(b_gl - b_gc)
    b_xt = (b_xt * b_factor[None, :]).to(b_y.dtype)
    return b_state * tl.exp(b_gl) + tl.dot(b_xt, b_y, input_precision=PRECISION).to(tl.float32)


@triton.jit
def _walk(
    x, y, gate_cumsum, chunk_gate, states, boundary, last, scale, i_k, i_v, i_bh, T, NT,
    H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, PRECISION: tl.constexpr, REVERSE: tl.constexpr, STORE: tl.constexpr,
    HAS_BOUNDARY: tl.constexpr, INTERPRETED: tl.constexpr,
):
    # Triton 3.6's interpreter cannot take a run-time loop bound in range() under numpy >= 2.4, so interpreted
    # runs loop with while ([Note: scan prefetch] in kernels/common/triton_scan.py)
    b_state = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_BOUNDARY:
        p_boundary = tl.make_block_ptr(boundary + i_bh * K * V, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
        b_state += tl.load(p_boundary, boundary_check=(0, 1)).to(tl.float32)
    if INTERPRETED:
        step = 0
        while step < NT:
            b_state = _walk_step(x, y, gate_cumsum, chunk_gate, states, b_state, scale, step, i_k, i_v, i_bh, T, NT,
                                 H, G, K, V, BT, BK, BV, PRECISION, REVERSE, STORE)
            step += 1
    else:
        for step in range(NT):
            b_state = _walk_step(x, y, gate_cumsum, chunk_gate, states, b_state, scale, step, i_k, i_v, i_bh, T, NT,
                                 H, G, K, V, BT, BK, BV, PRECISION, REVERSE, STORE)
    p_last = tl.make_block_ptr(last + i_bh * K * V, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
    tl.store(p_last, b_state, boundary_check=(0, 1))


@triton.jit
def simple_gla_state_walks_kernel(
    k, v, initial_state, states, final_state, q, do, final_state_grad, state_grads, initial_grad,
    gate_cumsum, chunk_gate, scale, T, NT, BH,
    H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, PRECISION: tl.constexpr, FORWARD: tl.constexpr, REVERSE: tl.constexpr,
    STORE: tl.constexpr, HAS_INITIAL: tl.constexpr, HAS_FINAL_GRAD: tl.constexpr, INTERPRETED: tl.constexpr,
):
    # with FORWARD, programs z < BH walk forward and the others (REVERSE) in reverse; without it every program
    # walks in reverse
    i_k, i_v, i_z = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if FORWARD:
        if i_z < BH:
            _walk(k, v, gate_cumsum, chunk_gate, states, initial_state, final_state, scale, i_k, i_v, i_z, T, NT,
                  H, G, K, V, BT, BK, BV, PRECISION, False, STORE, HAS_INITIAL, INTERPRETED)
        elif REVERSE:
            _walk(q, do, gate_cumsum, chunk_gate, state_grads, final_state_grad, initial_grad, scale, i_k, i_v,
                  i_z - BH, T, NT, H, G, K, V, BT, BK, BV, PRECISION, True, STORE, HAS_FINAL_GRAD, INTERPRETED)
    else:
        _walk(q, do, gate_cumsum, chunk_gate, state_grads, final_state_grad, initial_grad, scale, i_k, i_v, i_z,
              T, NT, H, G, K, V, BT, BK, BV, PRECISION, True, STORE, HAS_FINAL_GRAD, INTERPRETED)


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    """The GPU's multiprocessor count; 132 (an H100's or H200's) for a tensor off CUDA (the compile check)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132


def walk_tiles(key_dim: int, value_dim: int, walkers: int, device: torch.device, launch) -> tuple[int, int]:
    """The (key, value) tile edges of a launch of ``walkers`` walks (batch x heads x walks): the launch entry's
    largest (``block_k``, ``block_v``), halved, the value edge first, while the launch has fewer programs than
    the GPU has multiprocessors and an edge is above ``min_block``."""
    block_k, block_v = block_size(key_dim, launch["block_k"]), block_size(value_dim, launch["block_v"])
    smallest = launch["min_block"]
    while cdiv(key_dim, block_k) * cdiv(value_dim, block_v) * walkers < _multiprocessors(device):
        if block_v > smallest and block_v >= block_k:
            block_v //= 2
        elif block_k > smallest:
            block_k //= 2
        else:
            break
    return block_k, block_v


def chunk_gates(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate cumsum within each 64-token chunk [B, T, H], chunk totals [B, H, NT]), float32, of the scalar log
    gates g [B, T, H] (contiguous), in one launch."""
    batch, length, heads = g.shape
    n_chunks = cdiv(length, CHUNK_SIZE)
    gate_cumsum = new_output(g.shape, torch.float32, g.device)
    chunk_gate = new_output((batch, heads, n_chunks), torch.float32, g.device)
    simple_gla_chunk_gates_kernel[(n_chunks * batch * heads,)](
        g, gate_cumsum, chunk_gate, length, n_chunks, H=heads, BT=CHUNK_SIZE, num_warps=1,
    )
    return gate_cumsum, chunk_gate


@dataclass(frozen=True)
class PreparedWalks:
    """Phase one of simple GLA's Triton forward or backward ([Note: span phases]): the gates ``chunk_gates``
    formed, and the operands the walks will read (q, do and scale in a backward)."""

    gates: tuple[torch.Tensor, torch.Tensor]
    k: torch.Tensor
    v: torch.Tensor
    q: torch.Tensor | None = None
    do: torch.Tensor | None = None
    scale: float = 1.0


def state_walks(
    gates: tuple[torch.Tensor, torch.Tensor],
    states_dtype: torch.dtype,
    launch,
    precision: str,
    forward: tuple | None = None,
    reverse: tuple | None = None,
    scale: float = 1.0,
    store: bool = True,
):
    """One launch of the forward walk, the reverse walk or both, with the launch-table entry ``launch``
    (``block_k``, ``block_v``, ``min_block``, ``num_warps``, ``num_stages``) and the products' ``precision``.

    ``gates`` = ``chunk_gates(g)``; ``forward = (k, v, initial_state or None)``, ``reverse = (q, do,
    final_state_grad or None)``; q and k ``[B, T, G, K]``, v and do ``[B, T, H, V]``, all contiguous. Returns
    (forward's (states [B, H, NT, K, V] in states_dtype, or None without ``store``; the final state [B, H, K, V]
    float32) or None, reverse's (state gradients, the initial state's gradient) likewise or None)."""
    y = (forward or reverse)[1]
    batch, length, heads, value_dim = y.shape
    groups, key_dim = (forward or reverse)[0].shape[2:]
    n_chunks = cdiv(length, CHUNK_SIZE)
    device = y.device
    state_shape, last_shape = (batch, heads, n_chunks, key_dim, value_dim), (batch, heads, key_dim, value_dim)

    def outputs(walk):
        if walk is None:
            return y, y, None  # unread
        states = new_output(state_shape, states_dtype, device) if store else y
        return states, new_output(last_shape, torch.float32, device), walk[2]

    states, final_state, initial_state = outputs(forward)
    state_grads, initial_grad, final_state_grad = outputs(reverse)
    k, v = forward[:2] if forward else (y, y)
    q, do = reverse[:2] if reverse else (y, y)
    walkers = batch * heads * ((forward is not None) + (reverse is not None))
    block_k, block_v = walk_tiles(key_dim, value_dim, walkers, device, launch)
    simple_gla_state_walks_kernel[(cdiv(key_dim, block_k), cdiv(value_dim, block_v), walkers)](
        k, v, initial_state if initial_state is not None else y, states, final_state,
        q, do, final_state_grad if final_state_grad is not None else y, state_grads, initial_grad,
        gates[0], gates[1], scale, length, n_chunks, batch * heads,
        H=heads, G=groups, K=key_dim, V=value_dim, BT=CHUNK_SIZE, BK=block_k, BV=block_v,
        PRECISION=precision, FORWARD=forward is not None, REVERSE=reverse is not None, STORE=store,
        HAS_INITIAL=initial_state is not None, HAS_FINAL_GRAD=final_state_grad is not None, INTERPRETED=INTERPRETED,
        **launch_options(launch),
    )
    forward_result = ((states if store else None), final_state) if forward else None
    reverse_result = ((state_grads if store else None), initial_grad) if reverse else None
    return forward_result, reverse_result
