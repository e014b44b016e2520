"""Triton chunked GLA: host functions, the chunk-update kernel and the Triton implementation of chunk_gla.

Forward: gate cumsum (with each chunk's cumulative-gate range) -> per-chunk state updates (parallel over
chunks) -> state scan -> output. Chunks whose cumulative gate spans at most SPAN_LIMIT ("smooth", nearly all
in practice) get their output from one fused kernel that forms the intra-chunk scores as a single matrix
product around a per-chunk reference (triton_smooth.py); the others ("steep") go through the exact 16-token
sub-chunk kernels (triton_steep.py). Backward: the same recomputation of states and the state-gradient scan
in one launch, then for smooth chunks a dv kernel and a dq/dk/dg kernel, for steep chunks sub-chunk scores,
dv (with the score gradients), the intra-chunk dq/dk and a last kernel adding the state terms and forming dg.
Every kernel of one path returns at once on the other path's chunks. kernels/gla/README.md derives every
formula. No kernel feeds a transposed matrix-product accumulator cast to 16 bits into another product (Triton
3.4-3.7.0 miscompiles that on Hopper).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from schedlang.kernels.common.function import Implementation
from schedlang.kernels.common.triton_scan import (
    chunk_local_cumsum_with_range,
    chunk_state_scan,
    chunk_state_scan_pair,
    new_output,
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

CHUNK = 64
SUB_CHUNK = 16
SPAN_LIMIT = 60.0
"""A chunk is smooth when no key's cumulative gate spans more than this over the chunk; the factors
exp(gc - mid) and exp(mid - gc) then stay within exp(+-30), far inside bfloat16's and float32's range."""
FLOAT16_SPAN_LIMIT = 8.0
"""float16 overflows at 65504: its gated operands keep their factors within exp(+-4)."""

# launch shapes of the smooth-chunk kernels: at 4 warps they spill (benchmarks/kernel_resources.py)
SMOOTH_LAUNCH = dict(num_warps=8, num_stages=2)
SMOOTH_BLOCK_V = 128  # the whole value dimension up to 128: each chunk's scores are formed once
DQKG_BLOCK_K = 32
DQKG_WARPS = 8


def smooth_span_limit(dtype: torch.dtype) -> float:
    """The span limit for inputs of this dtype (read at call time, so tests can move SPAN_LIMIT)."""
    return min(SPAN_LIMIT, FLOAT16_SPAN_LIMIT) if dtype == torch.float16 else SPAN_LIMIT


@triton.jit
def gla_fwd_kernel_chunk_updates(
    x, y, gate_cumsum, chunk_gate, updates, scale, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    FROM_CHUNK_END: tl.constexpr,
):
    # FROM_CHUNK_END: U_n = (k * exp(gl - gc))^T v  (state pass); else U_n = scale * (q * exp(gc))^T do (gradient pass)
    i_k, i_v, i_nbh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh, i_n = i_nbh // NT, i_nbh % NT
    i_b, i_h = i_bh // H, i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
    p_xt = tl.make_block_ptr(x + i_b * T * H * K + i_h * K, (K, T), (1, H * K), (i_k * BK, i_n * BT), (BK, BT), (0, 1))
    p_gct = tl.make_block_ptr(
        gate_cumsum + i_b * T * H * K + i_h * K, (K, T), (1, H * K), (i_k * BK, i_n * BT), (BK, BT), (0, 1)
    )
    p_y = tl.make_block_ptr(y + i_b * T * H * V + i_h * V, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
    # [BK, BT]
    b_xt = tl.load(p_xt, boundary_check=(0, 1), padding_option="zero")
    b_gct = tl.load(p_gct, boundary_check=(0, 1), padding_option="zero")
    b_y = tl.load(p_y, boundary_check=(0, 1), padding_option="zero")
    if FROM_CHUNK_END:
        b_gl = tl.load(chunk_gate + (i_bh * NT + i_n) * K + o_k, mask=o_k < K, other=0.0)
        b_xt = (b_xt * tl.exp(b_gl[:, None] - b_gct)).to(b_y.dtype)
    else:
        b_xt = (b_xt * tl.exp(b_gct) * scale).to(b_y.dtype)
    # [BK, BV]
    b_update = tl.dot(b_xt, b_y)
    p_update = tl.make_block_ptr(
        updates + i_nbh.to(tl.int64) * K * V, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0)
    )
    tl.store(p_update, b_update.to(p_update.dtype.element_ty), boundary_check=(0, 1))


def _blocks(dim: int, largest: int) -> int:
    return max(16, min(largest, triton.next_power_of_2(dim)))


def _states_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float32, torch.float64) else dtype


def chunk_updates(x, y, gate_cumsum, chunk_gate, scale: float, from_chunk_end: bool) -> torch.Tensor:
    """Per-chunk state contributions [B, H, NT, K, V] in the states' dtype, in parallel over chunks."""
    batch, length, heads, key_dim = x.shape
    value_dim = y.shape[-1]
    n_chunks = triton.cdiv(length, CHUNK)
    # in the states' dtype: bfloat16 for 16-bit inputs halves the traffic of the pass; the scan adds in float32
    updates = new_output((batch, heads, n_chunks, key_dim, value_dim), _states_dtype(x.dtype), x.device)
    block_k, block_v = _blocks(key_dim, 64), _blocks(value_dim, 128)
    grid = (triton.cdiv(key_dim, block_k), triton.cdiv(value_dim, block_v), n_chunks * batch * heads)
    gla_fwd_kernel_chunk_updates[grid](
        x, y, gate_cumsum, chunk_gate, updates, scale, length, n_chunks,
        H=heads, K=key_dim, V=value_dim, BT=CHUNK, BK=block_k, BV=block_v, FROM_CHUNK_END=from_chunk_end,
    )
    return updates


@dataclass(frozen=True)
class ChunkGates:
    """What the kernels read of the gates: the chunk-local cumsum [B, T, H, K], and per chunk and key
    ([B, H, NT, K]) the total, the midpoint and the width of the cumulative gate's range."""

    cumsum: torch.Tensor
    total: torch.Tensor
    mid: torch.Tensor
    span: torch.Tensor


def chunk_gates(g: torch.Tensor) -> ChunkGates:
    return ChunkGates(*chunk_local_cumsum_with_range(g, CHUNK))


def _launch_args(q, v):
    batch, length, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    return dict(
        T=length, NT=triton.cdiv(length, CHUNK), H=heads, K=key_dim, V=value_dim, BT=CHUNK,
        BK=_blocks(key_dim, 64), BV=_blocks(value_dim, 64), KP=triton.next_power_of_2(key_dim),
    )


def intra_scores(q, k, gates: ChunkGates, scale: float, span_limit: float) -> torch.Tensor:
    """Scaled causal intra-chunk scores [B, T, H, CHUNK] float32 of the steep chunks (elsewhere unwritten)."""
    batch, length, heads, key_dim = q.shape
    n_chunks = triton.cdiv(length, CHUNK)
    scores = new_output((batch, length, heads, CHUNK), torch.float32, q.device)
    n_sub = CHUNK // SUB_CHUNK
    gla_fwd_kernel_intra_scores[(n_chunks, batch * heads)](
        q, k, gates.cumsum, gates.span, scores, scale, span_limit, length, n_chunks,
        H=heads, K=key_dim, BT=CHUNK, BC=SUB_CHUNK, BK=_blocks(key_dim, 32), NC=n_sub,
        KP=triton.next_power_of_2(key_dim),
    )
    return scores


def _contiguous(*tensors):
    return [tensor.contiguous() for tensor in tensors]


def _states(k, v, gates: ChunkGates, initial_state):
    updates = chunk_updates(k, v, gates.cumsum, gates.total, 1.0, from_chunk_end=True)
    return chunk_state_scan(updates, gates.total, initial_state, _states_dtype(k.dtype), reverse=False)


def forward(q, k, v, g, scale, initial_state):
    q, k, v, g = _contiguous(q, k, v, g)
    args = _launch_args(q, v)
    batch, _, heads, _ = q.shape
    span_limit = smooth_span_limit(q.dtype)
    gates = chunk_gates(g)
    states, final_state = _states(k, v, gates, initial_state)
    output = new_output(v.shape, v.dtype, v.device)
    grid = (triton.cdiv(args["V"], args["BV"]), args["NT"], batch * heads)
    smooth_args = dict(args, BV=_blocks(args["V"], SMOOTH_BLOCK_V))
    gla_fwd_kernel_smooth_output[(triton.cdiv(args["V"], smooth_args["BV"]), args["NT"], batch * heads)](
        q, k, v, gates.cumsum, gates.mid, gates.span, states, output, scale, span_limit, **smooth_args,
        **SMOOTH_LAUNCH,
    )
    scores = intra_scores(q, k, gates, scale, span_limit)
    gla_fwd_kernel_output[grid](
        q, v, gates.cumsum, gates.span, states, scores, output, scale, span_limit, **args
    )
    return output, final_state


def backward(q, k, v, g, scale, initial_state, do, final_state_grad):
    q, k, v, g, do = _contiguous(q, k, v, g, do)
    args = _launch_args(q, v)
    batch, length, heads, key_dim = q.shape
    n_chunks = args["NT"]
    span_limit = smooth_span_limit(q.dtype)
    gates = chunk_gates(g)
    updates = chunk_updates(k, v, gates.cumsum, gates.total, 1.0, from_chunk_end=True)
    grad_updates = chunk_updates(q, do, gates.cumsum, gates.total, scale, from_chunk_end=False)
    states, state_grads, initial_grad = chunk_state_scan_pair(
        updates, grad_updates, gates.total, initial_state, final_state_grad, _states_dtype(k.dtype)
    )
    dv = new_output(v.shape, v.dtype, v.device)
    dq = new_output(q.shape, q.dtype, q.device)
    dk = new_output(k.shape, k.dtype, k.device)
    dg = new_output(g.shape, torch.float32, g.device)
    grid_v = (triton.cdiv(args["V"], args["BV"]), n_chunks, batch * heads)
    grid_k = (triton.cdiv(key_dim, args["BK"]), n_chunks, batch * heads)
    # smooth chunks: two fused kernels
    smooth_args = dict(args, BV=_blocks(args["V"], SMOOTH_BLOCK_V))
    gla_bwd_kernel_smooth_dv[(triton.cdiv(args["V"], smooth_args["BV"]), n_chunks, batch * heads)](
        q, k, do, gates.cumsum, gates.total, gates.mid, gates.span, state_grads, dv, scale, span_limit,
        **smooth_args, **SMOOTH_LAUNCH,
    )
    dqkg_args = dict(args, BK=_blocks(key_dim, DQKG_BLOCK_K))
    gla_bwd_kernel_smooth_dqkg[(triton.cdiv(key_dim, dqkg_args["BK"]), n_chunks, batch * heads)](
        q, k, v, do, gates.cumsum, gates.total, gates.mid, gates.span, states, state_grads, dq, dk, dg,
        scale, span_limit, num_warps=DQKG_WARPS, **dqkg_args,
    )
    # steep chunks: sub-chunk scores, then dv, the intra-chunk dq/dk and the state terms
    scores = intra_scores(q, k, gates, scale, span_limit)
    score_grads = new_output((batch, length, heads, CHUNK), torch.float32, q.device)
    gla_bwd_kernel_dv[grid_v](
        k, v, do, gates.cumsum, gates.total, gates.span, scores, state_grads, dv, score_grads, scale, span_limit,
        **args,
    )
    dq_intra = new_output(q.shape, torch.float32, q.device)
    dk_intra = new_output(q.shape, torch.float32, q.device)
    n_sub = CHUNK // SUB_CHUNK
    block_intra = _blocks(key_dim, 32)
    gla_bwd_kernel_intra[(triton.cdiv(key_dim, block_intra), n_chunks, batch * heads)](
        q, k, gates.cumsum, gates.span, score_grads, dq_intra, dk_intra, span_limit, length, n_chunks,
        H=heads, K=key_dim, BT=CHUNK, BC=SUB_CHUNK, BK=block_intra, NC=n_sub, KP=args["KP"],
    )
    gla_bwd_kernel_inter[grid_k](
        q, k, v, do, gates.cumsum, gates.total, gates.span, states, state_grads, dq_intra, dk_intra, dq, dk, dg,
        scale, span_limit, **args,
    )
    return dq, dk, dv, dg, initial_grad


TRITON_IMPLEMENTATION = Implementation("triton", forward, backward)
