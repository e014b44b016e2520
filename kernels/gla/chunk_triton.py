"""Triton chunked GLA: host functions, the gates-and-updates kernel and the Triton implementation of chunk_gla.

Forward: one kernel for the gate cumsum (with each chunk's cumulative-gate range) and the per-chunk state
updates (parallel over chunks) -> state scan -> output. Chunks whose cumulative gate spans at most
SPAN_LIMIT ("smooth", nearly all in practice) get their output from one fused kernel that forms the
intra-chunk scores as a single matrix product around a per-chunk reference (triton_smooth.py); the others
("steep") go through the exact 16-token sub-chunk kernels (triton_steep.py). Backward: the gates with both
the state and the state-gradient updates in one kernel; the recomputation of states and the state-gradient
scan in one launch; then for smooth chunks a dv kernel and a dq/dk/dg kernel, for steep chunks sub-chunk
scores, dv (with the score gradients), the intra-chunk dq/dk and a last kernel adding the state terms and
forming dg. Every kernel of one path returns at once on the other path's chunks. kernels/gla/README.md
derives every formula. No kernel feeds a transposed matrix-product accumulator cast to 16 bits into another
product (Triton 3.4-3.7.0 miscompiles that on Hopper).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from schedlang.kernels.common.arguments import CHUNK_SIZE
from schedlang.kernels.common.launch_tables import register_launch_table
from schedlang.kernels.common.sizes import block_size, cdiv, launch_options, next_power_of_2, states_dtype
from schedlang.kernels.common.triton_scan import (
    PreparedChunks,
    chunk_state_scan,
    new_output,
    prepare_chunks,
    recurrence_gradients,
    triton_implementation,
)
from schedlang.kernels.gla.triton_smooth import (
    gla_bwd_kernel_smooth_dqkg,
    gla_bwd_kernel_smooth_dv,
    gla_fwd_kernel_smooth_output,
)
from schedlang.kernels.gla.triton_steep import (
    gla_bwd_kernel_dv,
    gla_bwd_kernel_inter,
    gla_bwd_kernel_intra,
    gla_fwd_kernel_intra_scores,
    gla_fwd_kernel_output,
)

CHUNK = CHUNK_SIZE
SUB_CHUNK = 16
SPAN_LIMIT = 60.0
"""A chunk is smooth when no key's cumulative gate spans more than this over the chunk; the factors
exp(gc - mid) and exp(mid - gc) then stay within exp(+-30), far inside bfloat16's and float32's range."""
FLOAT16_SPAN_LIMIT = 8.0
"""float16 overflows at 65504: its gated operands keep their factors within exp(+-4)."""

LAUNCH = register_launch_table("gla", __name__, {
    # tile edges (the largest; smaller dimensions get smaller tiles) and launch options per kernel,
    # [Note: launch tables]. block_v = 128 covers the whole value dimension, so each chunk's scores are formed once.
    "updates": dict(block_k=64, num_warps=4, num_stages=3),
    "updates_with_gradients": dict(block_k=64, num_warps=4, num_stages=3),
    "smooth_output": dict(block_k=32, block_v=128, num_warps=8, num_stages=4),
    "smooth_dv": dict(block_k=32, block_v=128, num_warps=8, num_stages=3),
    "smooth_dqkg": dict(block_k=64, block_v=64, key_splits=1, num_warps=8, num_stages=3),
})
"""The launch table of the Triton GLA kernels, read at call time (kernels/common/launch_tables.py)."""
STEEP_GROUP = 8  # a power of two
"""Chunks per program of the steep-path kernels: on smooth data each program only loads its group's spans, so the
cost of those launches falls with the number of programs ([Note: launch tables] says where it was measured)."""


def steep_grid(n_all: int, blocks: int = 1) -> tuple[int, ...]:
    """The grid of a steep-path kernel over ``n_all`` (batch * head, chunk) pairs and ``blocks`` key or value blocks."""
    groups = cdiv(n_all, STEEP_GROUP)
    return (groups, blocks) if blocks > 1 else (groups,)


def smooth_span_limit(dtype: torch.dtype) -> float:
    """The span limit for inputs of this dtype (read at call time, so tests can move SPAN_LIMIT)."""
    return min(SPAN_LIMIT, FLOAT16_SPAN_LIMIT) if dtype == torch.float16 else SPAN_LIMIT


@triton.jit
def gate_cumsum_block(
    g, gate_cumsum, chunk_gate, gate_mid, gate_span, i_k, i_t, i_bh, T, NT,
    H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
):
    """Keys [i_k * BK, ...) of chunk i_t: stores the chunk-local cumsum of g, the chunk's total and the midpoint
    and width of the cumulative gate's range over the real tokens; returns (gc [BT, BK], total [BK])."""
    i_b, i_h = i_bh // H, i_bh % H
    p_g = tl.make_block_ptr(g + i_b * T * H * K + i_h * K, (T, K), (H * K, 1), (i_t * BT, i_k * BK), (BT, BK), (1, 0))
    p_gc = tl.make_block_ptr(
        gate_cumsum + i_b * T * H * K + i_h * K, (T, K), (H * K, 1), (i_t * BT, i_k * BK), (BT, BK), (1, 0)
    )
    # [BT, BK]
    b_g = tl.load(p_g, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
    b_gc = tl.cumsum(b_g, axis=0)
    tl.store(p_gc, b_gc, boundary_check=(0, 1))
    o_k = i_k * BK + tl.arange(0, BK)
    chunk_offset = (i_bh * NT + i_t) * K + o_k
    b_total = tl.sum(b_g, axis=0)
    tl.store(chunk_gate + chunk_offset, b_total, mask=o_k < K)
    row_valid = (i_t * BT + tl.arange(0, BT) < T)[:, None]
    b_max = tl.max(tl.where(row_valid, b_gc, float("-inf")), axis=0)
    b_min = tl.min(tl.where(row_valid, b_gc, float("inf")), axis=0)
    tl.store(gate_mid + chunk_offset, 0.5 * (b_max + b_min), mask=o_k < K)
    tl.store(gate_span + chunk_offset, b_max - b_min, mask=o_k < K)
    return b_gc, b_total


@triton.jit
def _store_chunk_update(
    b_x, y, updates, i_n, i_bh, i_k, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    # updates[chunk i_n, keys of block i_k, :] = b_x^T y, with b_x [BT, BK] a gated input in y's dtype
    i_b, i_h = i_bh // H, i_bh % H
    update_base = updates + (i_bh * NT + i_n).to(tl.int64) * K * V
    for i_v in range(tl.cdiv(V, BV)):
        p_y = tl.make_block_ptr(y + i_b * T * H * V + i_h * V, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
        b_y = tl.load(p_y, boundary_check=(0, 1), padding_option="zero")
        # the transpose of a gated input, not of a product's accumulator
        b_update = tl.dot(tl.trans(b_x), b_y)
        p_update = tl.make_block_ptr(update_base, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
        tl.store(p_update, b_update.to(p_update.dtype.element_ty), boundary_check=(0, 1))


@triton.jit
def gla_kernel_gates_and_updates(
    g, k, v, q, do, gate_cumsum, chunk_gate, gate_mid, gate_span, updates, grad_updates, scale, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    UPDATES: tl.constexpr, GRADIENTS: tl.constexpr,
):
    # One program per (key block, chunk): the chunk-local gate cumsum and its range, then, with UPDATES, the
    # chunk's state update U_n = (k * exp(gl - gc))^T v and, with GRADIENTS, its state-gradient update
    # scale * (q * exp(gc))^T do, for these keys: the gates are read once for all of them.
    i_k, i_n, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b_gc, b_gl = gate_cumsum_block(g, gate_cumsum, chunk_gate, gate_mid, gate_span, i_k, i_n, i_bh, T, NT, H, K, BT, BK)
    i_b, i_h = i_bh // H, i_bh % H
    if UPDATES:
        p_k = tl.make_block_ptr(k + i_b * T * H * K + i_h * K, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
        b_k = tl.load(p_k, boundary_check=(0, 1), padding_option="zero")
        b_kd = (b_k * tl.exp(b_gl[None, :] - b_gc)).to(b_k.dtype)
        _store_chunk_update(b_kd, v, updates, i_n, i_bh, i_k, T, NT, H, K, V, BT, BK, BV)
    if GRADIENTS:
        p_q = tl.make_block_ptr(q + i_b * T * H * K + i_h * K, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
        b_q = tl.load(p_q, boundary_check=(0, 1), padding_option="zero")
        b_qd = (b_q * tl.exp(b_gc) * scale).to(b_q.dtype)
        _store_chunk_update(b_qd, do, grad_updates, i_n, i_bh, i_k, T, NT, H, K, V, BT, BK, BV)




@dataclass(frozen=True)
class ChunkGates:
    """What the kernels read of the gates: the chunk-local cumsum [B, T, H, K], and per chunk and key
    ([B, H, NT, K]) the total, the midpoint and the width of the cumulative gate's range."""

    cumsum: torch.Tensor
    total: torch.Tensor
    mid: torch.Tensor
    span: torch.Tensor


def gates_and_updates(g, k, v, q=None, do=None, scale: float = 1.0, state_updates: bool = True):
    """ChunkGates, the per-chunk state updates [B, H, NT, K, V] (None without state_updates: a backward given
    the forward's states needs none) and, given q and do, the state-gradient updates (else None), in the
    states' dtype (bfloat16 for 16-bit inputs halves the traffic of the passes; the scans add in float32),
    from one launch."""
    batch, length, heads, key_dim = k.shape
    value_dim = v.shape[-1]
    n_chunks = cdiv(length, CHUNK)
    per_chunk = [new_output((batch, heads, n_chunks, key_dim), torch.float32, k.device) for _ in range(3)]
    gates = ChunkGates(new_output(g.shape, torch.float32, g.device), *per_chunk)
    update_shape = (batch, heads, n_chunks, key_dim, value_dim)
    updates = new_output(update_shape, states_dtype(k.dtype), k.device) if state_updates else None
    gradients = q is not None
    grad_updates = new_output(update_shape, states_dtype(k.dtype), k.device) if gradients else None
    launch = LAUNCH["updates_with_gradients" if gradients else "updates"]
    block_k = block_size(key_dim, launch["block_k"])
    written = updates if updates is not None else grad_updates
    gla_kernel_gates_and_updates[(cdiv(key_dim, block_k), n_chunks, batch * heads)](
        g, k, v, q if gradients else k, do if gradients else v, gates.cumsum, gates.total, gates.mid, gates.span,
        written, grad_updates if gradients else written, scale, length, n_chunks,
        H=heads, K=key_dim, V=value_dim, BT=CHUNK, BK=block_k, BV=block_size(value_dim, 128),
        UPDATES=state_updates, GRADIENTS=gradients, **launch_options(launch),
    )
    return gates, updates, grad_updates


def _launch_args(q, v):
    batch, length, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    return dict(
        T=length, NT=cdiv(length, CHUNK), H=heads, K=key_dim, V=value_dim, BT=CHUNK,
        BK=block_size(key_dim, 64), BV=block_size(value_dim, 64), KP=next_power_of_2(key_dim),
    )


def intra_scores(q, k, gates: ChunkGates, scale: float, span_limit: float) -> torch.Tensor:
    """Scaled causal intra-chunk scores [B, T, H, CHUNK] float32 of the steep chunks (elsewhere unwritten)."""
    batch, length, heads, key_dim = q.shape
    n_chunks = cdiv(length, CHUNK)
    scores = new_output((batch, length, heads, CHUNK), torch.float32, q.device)
    n_sub = CHUNK // SUB_CHUNK
    n_all = batch * heads * n_chunks
    gla_fwd_kernel_intra_scores[steep_grid(n_all)](
        q, k, gates.cumsum, gates.span, scores, scale, span_limit, length, n_chunks, n_all,
        H=heads, K=key_dim, BT=CHUNK, BC=SUB_CHUNK, BK=block_size(key_dim, 32), NC=n_sub,
        KP=next_power_of_2(key_dim), CG=STEEP_GROUP,
    )
    return scores


def _contiguous(*tensors):
    return [tensor.contiguous() for tensor in tensors]


def _chunk_gate(gates: ChunkGates) -> torch.Tensor:
    return gates.total


def prepare_forward(q, k, v, g) -> PreparedChunks:
    k, v, g = _contiguous(k, v, g)
    return prepare_chunks(gates_and_updates, _chunk_gate, g, k, v)


def finish_forward(prepared: PreparedChunks, q, k, v, g, scale, initial_state, save_states=False):
    q, k, v, g = _contiguous(q, k, v, g)
    args = _launch_args(q, v)
    batch, _, heads, _ = q.shape
    span_limit = smooth_span_limit(q.dtype)
    gates = prepared.gates
    states, final_state = chunk_state_scan(prepared.updates, gates.total, initial_state, states_dtype(k.dtype), reverse=False)
    output = new_output(v.shape, v.dtype, v.device)
    launch = LAUNCH["smooth_output"]
    smooth_args = dict(args, BK=block_size(args["K"], launch["block_k"]), BV=block_size(args["V"], launch["block_v"]))
    gla_fwd_kernel_smooth_output[(cdiv(args["V"], smooth_args["BV"]), args["NT"], batch * heads)](
        q, k, v, gates.cumsum, gates.mid, gates.span, states, output, scale, span_limit, **smooth_args,
        **launch_options(launch),
    )
    scores = intra_scores(q, k, gates, scale, span_limit)
    n_all = batch * heads * args["NT"]
    gla_fwd_kernel_output[steep_grid(n_all, cdiv(args["V"], args["BV"]))](
        q, v, gates.cumsum, gates.span, states, scores, output, scale, span_limit, n_all=n_all, CG=STEEP_GROUP, **args
    )
    return output, final_state, (states if save_states else None)


def prepare_backward(q, k, v, g, do, scale, saved_states=None) -> PreparedChunks:
    q, k, v, g, do = _contiguous(q, k, v, g, do)
    return prepare_chunks(gates_and_updates, _chunk_gate, g, k, v, q, do, scale, saved_states)


def finish_backward(prepared: PreparedChunks, q, k, v, g, scale, initial_state, do, final_state_grad, saved_states=None):
    q, k, v, g, do = _contiguous(q, k, v, g, do)
    args = _launch_args(q, v)
    batch, length, heads, key_dim = q.shape
    n_chunks = args["NT"]
    span_limit = smooth_span_limit(q.dtype)
    gates = prepared.gates
    states, state_grads, initial_grad = recurrence_gradients(
        prepared, initial_state, final_state_grad, saved_states, states_dtype(k.dtype)
    )
    dv = new_output(v.shape, v.dtype, v.device)
    dq = new_output(q.shape, q.dtype, q.device)
    dk = new_output(k.shape, k.dtype, k.device)
    dg = new_output(g.shape, torch.float32, g.device)
    n_all = batch * heads * n_chunks
    # smooth chunks: two fused kernels
    launch = LAUNCH["smooth_dv"]
    smooth_args = dict(args, BK=block_size(key_dim, launch["block_k"]), BV=block_size(args["V"], launch["block_v"]))
    gla_bwd_kernel_smooth_dv[(cdiv(args["V"], smooth_args["BV"]), n_chunks, batch * heads)](
        q, k, do, gates.cumsum, gates.total, gates.mid, gates.span, state_grads, dv, scale, span_limit,
        **smooth_args, **launch_options(launch),
    )
    launch = LAUNCH["smooth_dqkg"]
    dqkg_args = dict(args, BK=block_size(key_dim, launch["block_k"]), BV=block_size(args["V"], launch["block_v"]))
    key_splits = min(launch["key_splits"], cdiv(key_dim, dqkg_args["BK"]))
    gla_bwd_kernel_smooth_dqkg[(n_chunks, batch * heads, key_splits)](
        q, k, v, do, gates.cumsum, gates.total, gates.mid, gates.span, states, state_grads, dq, dk, dg,
        scale, span_limit, KS=key_splits, **dqkg_args, **launch_options(launch),
    )
    # steep chunks: sub-chunk scores, then dv, the intra-chunk dq/dk and the state terms
    scores = intra_scores(q, k, gates, scale, span_limit)
    score_grads = new_output((batch, length, heads, CHUNK), torch.float32, q.device)
    gla_bwd_kernel_dv[steep_grid(n_all, cdiv(args["V"], args["BV"]))](
        k, v, do, gates.cumsum, gates.total, gates.span, scores, state_grads, dv, score_grads, scale, span_limit,
        n_all=n_all, CG=STEEP_GROUP, **args,
    )
    dq_intra = new_output(q.shape, torch.float32, q.device)
    dk_intra = new_output(q.shape, torch.float32, q.device)
    n_sub = CHUNK // SUB_CHUNK
    block_intra = block_size(key_dim, 32)
    gla_bwd_kernel_intra[steep_grid(n_all, cdiv(key_dim, block_intra))](
        q, k, gates.cumsum, gates.span, score_grads, dq_intra, dk_intra, span_limit, length, n_chunks, n_all,
        H=heads, K=key_dim, BT=CHUNK, BC=SUB_CHUNK, BK=block_intra, NC=n_sub, KP=args["KP"], CG=STEEP_GROUP,
    )
    gla_bwd_kernel_inter[steep_grid(n_all, cdiv(key_dim, args["BK"]))](
        q, k, v, do, gates.cumsum, gates.total, gates.span, states, state_grads, dq_intra, dk_intra, dq, dk, dg,
        scale, span_limit, n_all=n_all, CG=STEEP_GROUP, **args,
    )
    return dq, dk, dv, dg, initial_grad


TRITON_IMPLEMENTATION = triton_implementation(prepare_forward, finish_forward, prepare_backward, finish_backward)
