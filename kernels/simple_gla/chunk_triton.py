"""Triton chunked simple GLA (scalar gate per head and token): kernels, host functions, implementation.

Forward: the gate cumsum (one small launch) -> the forward state walk (kernels/simple_gla/state_walks.py) ->
one output kernel (intra-chunk scores with the decay matrix, plus the read of the entering state). Backward:
the gates, the reverse walk of the state gradients beside the forward walk that recomputes the states unless
the forward saved them, in one launch -> a dv kernel and a dq/dk/dg kernel. With a scalar gate the decay matrix
exp(gc_i - gc_j), j <= i, never exceeds 1, so no sub-chunk split is needed.
Transposed products are formed from operands loaded transposed, never from a transposed accumulator.
q and k may be grouped: ``[B, T, G, K]`` with G dividing v's H heads, head ``h`` reading group ``h // (H / G)``
([Note: grouped head order] in kernels/common/heads.py); every kernel loads them at the group's rows
(``_group_rows``), and the backward sums the per-head dq and dk over each group once (``_sum_over_groups``).
Float32 inputs take the launch table's ``products`` precision (plain tf32: a 10-bit mantissa per operand; dg,
a sum of ``q dq - k dk`` terms that cancel, and the per-head sums of Mamba-2's dA feel it most); 16-bit inputs
multiply as 16-bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from schedlang.kernels.common.arguments import CHUNK_SIZE
from schedlang.kernels.common.function import Implementation
from schedlang.kernels.common.heads import sum_each_head_group
from schedlang.kernels.common.launch_tables import register_launch_table
from schedlang.kernels.common.sizes import block_size, cdiv, launch_options, products_precision, states_dtype
from schedlang.kernels.common.triton_gradients import chunk_score_gradients, chunk_state_products
from schedlang.kernels.common.triton_scan import new_output
from schedlang.kernels.simple_gla.state_walks import PreparedWalks, chunk_gates, state_walks

CHUNK = CHUNK_SIZE
LAUNCH = register_launch_table("simple_gla", __name__, {
    # tile edges (the largest; smaller dimensions get smaller tiles) and launch options per kernel ([Note: launch tables])
    # the state walks' largest tiles, halved down to min_block while a launch has fewer programs than the GPU
    # has multiprocessors (kernels/simple_gla/state_walks.py, walk_tiles)
    "walk": dict(block_k=64, block_v=64, min_block=32, num_warps=4, num_stages=3),
    "output": dict(block_k=64, block_v=128, num_warps=8, num_stages=3),
    "dv": dict(block_k=64, block_v=128, num_warps=8, num_stages=3),
    "dqkg": dict(block_v=64, num_warps=8, num_stages=3),  # all keys (up to 256) in one tile
    # the products' input precision for float32 inputs (kernels/common/sizes.py, products_precision). "tf32x3"
    # took mamba2's float32 GPU errors from 1.8e-2 (dA) to 2.2e-6, but at K = V = 128 its dqkg kernel asks for
    # 262,144 bytes of shared memory with 3 stages, over the H200's 232,448 (python -m
    # schedlang.kernels.compile_check; 163,840 with 2 stages, not yet run on a GPU): plain tf32 until then
    "products": {"float32": "tf32", "reduced": "tf32"},
})
"""The launch table of the Triton simple-GLA kernels, read at call time (kernels/common/launch_tables.py)."""


@triton.jit
def _group_rows(i_b, i_h, T, H: tl.constexpr, G: tl.constexpr, K: tl.constexpr):
    """The offset of head i_h's rows (batch i_b) in a q or k of shape [B, T, G, K]: its group's, i_h // (H / G)
    ([Note: grouped head order]); the row stride is G * K."""
    return i_b * T * G * K + (i_h // (H // G)) * K


@triton.jit
def simple_gla_fwd_kernel_output(
    q, k, v, gate_cumsum, states, output, scale, T, NT, x, D, x_stride_b, x_stride_t, x_stride_h,
    H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, PRECISION: tl.constexpr, SKIP: tl.constexpr,
):
    # o = scale (q S_entering exp(gc) + (q k^T * decay) v), and with SKIP the skip D[h] x added before the one
    # rounding (x [B, T, H, V] read through its strides, last stride 1)
    i_v, i_n, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    key_rows = _group_rows(i_b, i_h, T, H, G, K)
    state_base = states + (i_bh * NT + i_n).to(tl.int64) * K * V
    b_inter = tl.zeros([BT, BV], dtype=tl.float32)
    b_scores = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        p_q = tl.make_block_ptr(q + key_rows, (T, K), (G * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
        p_kt = tl.make_block_ptr(k + key_rows, (K, T), (1, G * K), (i_k * BK, i_n * BT), (BK, BT), (0, 1))
        p_h = tl.make_block_ptr(state_base, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
        b_q = tl.load(p_q, boundary_check=(0, 1), padding_option="zero")
        b_kt = tl.load(p_kt, boundary_check=(0, 1), padding_option="zero")
        b_h = tl.load(p_h, boundary_check=(0, 1))
        b_scores += tl.dot(b_q, b_kt, input_precision=PRECISION)
        b_inter += tl.dot(b_q.to(b_h.dtype), b_h, input_precision=PRECISION)
    o_i = tl.arange(0, BT)
    o_t = i_n * BT + o_i
    b_gc = tl.load(gate_cumsum + (i_b * T + o_t) * H + i_h, mask=o_t < T, other=0.0)
    causal = o_i[:, None] >= o_i[None, :]
    b_decay = tl.exp(tl.where(causal, b_gc[:, None] - b_gc[None, :], float("-inf")))
    p_v = tl.make_block_ptr(v + i_b * T * H * V + i_h * V, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
    b_v = tl.load(p_v, boundary_check=(0, 1), padding_option="zero")
    b_o = b_inter * tl.exp(b_gc)[:, None] + tl.dot((b_scores * b_decay).to(b_v.dtype), b_v, input_precision=PRECISION)
    b_o = b_o * scale
    if SKIP:
        p_x = tl.make_block_ptr(x + i_b.to(tl.int64) * x_stride_b + i_h * x_stride_h, (T, V), (x_stride_t, 1),
                                (i_n * BT, i_v * BV), (BT, BV), (1, 0))
        b_o += tl.load(D + i_h).to(tl.float32) * tl.load(p_x, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
    p_o = tl.make_block_ptr(output + i_b * T * H * V + i_h * V, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
    tl.store(p_o, b_o.to(p_o.dtype.element_ty), boundary_check=(0, 1))


@triton.jit
def simple_gla_bwd_kernel_dv(
    q, k, do, gate_cumsum, chunk_gate, state_grads, dv, scale, T, NT,
    x, dt, D, ddt_partials, end_partials, x_stride_b, x_stride_t, x_stride_h,
    H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, PRECISION: tl.constexpr, SSD_ENDS: tl.constexpr,
):
    # dv_j = sum_{i>=j} scale (q_i . k_j) exp(gc_i - gc_j) do_i + k_j exp(gl - gc_j) dS_leaving
    # With SSD_ENDS (Mamba-2: v = dt x, y = o + D x, do = dy) it stores dx = dt dv + D dy in dv's place, rounded
    # once, and this value block's partials of d dt (sum over its columns of x dv, [B, T, H, NV]) and of dD (sum
    # of dy x over its tile: column i_v of end_partials [B H, NT, NV + 1]); NV = the programs along axis 0
    i_v, i_n, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    key_rows = _group_rows(i_b, i_h, T, H, G, K)
    grad_base = state_grads + (i_bh * NT + i_n).to(tl.int64) * K * V
    o_i = tl.arange(0, BT)
    o_t = i_n * BT + o_i
    b_gc = tl.load(gate_cumsum + (i_b * T + o_t) * H + i_h, mask=o_t < T, other=0.0)
    b_gl = tl.load(chunk_gate + i_bh * NT + i_n)
    # padded tokens (g = 0) carry the chunk's last cumulative gate: a zero there would make
    # exp(gc_pad - gc_j) overflow under strong decay, and 0 * inf poison the sums over tokens
    b_gc = tl.where(o_t < T, b_gc, b_gl)
    # [BT(j), BT(i)]
    b_scores_t = tl.zeros([BT, BT], dtype=tl.float32)
    b_dv = tl.zeros([BT, BV], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        p_k = tl.make_block_ptr(k + key_rows, (T, K), (G * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
        p_qt = tl.make_block_ptr(q + key_rows, (K, T), (1, G * K), (i_k * BK, i_n * BT), (BK, BT), (0, 1))
        p_dh = tl.make_block_ptr(grad_base, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
        b_k = tl.load(p_k, boundary_check=(0, 1), padding_option="zero")
        b_qt = tl.load(p_qt, boundary_check=(0, 1), padding_option="zero")
        b_dh = tl.load(p_dh, boundary_check=(0, 1))
        b_scores_t += tl.dot(b_k, b_qt, input_precision=PRECISION)
        b_dv += tl.dot(b_k.to(b_dh.dtype), b_dh, input_precision=PRECISION)
    anticausal = o_i[:, None] <= o_i[None, :]
    b_decay_t = tl.exp(tl.where(anticausal, b_gc[None, :] - b_gc[:, None], float("-inf")))
    p_do = tl.make_block_ptr(do + i_b * T * H * V + i_h * V, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
    b_do = tl.load(p_do, boundary_check=(0, 1), padding_option="zero")
    b_dv = b_dv * tl.exp(b_gl - b_gc)[:, None] + tl.dot((b_scores_t * b_decay_t * scale).to(b_do.dtype), b_do,
                                                      input_precision=PRECISION)
    p_dv = tl.make_block_ptr(dv + i_b * T * H * V + i_h * V, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
    if SSD_ENDS:
        n_v = tl.num_programs(0)
        p_x = tl.make_block_ptr(x + i_b.to(tl.int64) * x_stride_b + i_h * x_stride_h, (T, V), (x_stride_t, 1),
                                (i_n * BT, i_v * BV), (BT, BV), (1, 0))
        b_x = tl.load(p_x, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        b_dy = b_do.to(tl.float32)
        b_dt = tl.load(dt + (i_b * T + o_t) * H + i_h, mask=o_t < T, other=0.0).to(tl.float32)
        b_dx = b_dv * b_dt[:, None] + b_dy * tl.load(D + i_h).to(tl.float32)
        tl.store(p_dv, b_dx.to(p_dv.dtype.element_ty), boundary_check=(0, 1))
        rows = ((i_b * T + o_t) * H + i_h).to(tl.int64)
        tl.store(ddt_partials + rows * n_v + i_v, tl.sum(b_dv * b_x, axis=1), mask=o_t < T)
        tl.store(end_partials + (i_bh * NT + i_n) * (n_v + 1) + i_v, tl.sum(tl.sum(b_dy * b_x, axis=1), axis=0))
    else:
        tl.store(p_dv, b_dv.to(p_dv.dtype.element_ty), boundary_check=(0, 1))


@triton.jit
def simple_gla_bwd_kernel_dqkg(
    q, k, v, do, gate_cumsum, chunk_gate, states, state_grads, dq, dk, dg, scale, T, NT,
    dt, A, ddt_partials, end_partials,
    H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, PRECISION: tl.constexpr, SSD_ENDS: tl.constexpr, NV: tl.constexpr, NV_PAD: tl.constexpr,
):
    # One program per chunk with the whole key dimension (BK >= K), so dg's sum over keys stays in the program.
    # q and k are read at the head's group (G heads); dq and dk are this head's terms, stored per head (H heads).
    # With SSD_ENDS (Mamba-2: g = dt A) dg never leaves the program: it stores d dt = (the dv kernel's NV partials
    # of sum_P x dv) + dg A in dg's place, and this chunk's sum of dg dt (its part of dA) in column NV of
    # end_partials [B H, NT, NV + 1] (NV_PAD: NV rounded up to a power of two).
    i_n, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    chunk_offset = (i_bh * NT + i_n).to(tl.int64) * K * V
    value_base = i_b * T * H * V + i_h * V
    b_ds, b_ds_t = chunk_score_gradients(do, v, value_base, i_n, T, H, V, BT, BV, PRECISION)
    b_dq, b_dk, b_boundary = chunk_state_products(
        do, v, states, state_grads, value_base, chunk_offset, i_n, 0, T, H, K, V, BT, BK, BV, PRECISION
    )
    o_i = tl.arange(0, BT)
    o_t = i_n * BT + o_i
    b_gc = tl.load(gate_cumsum + (i_b * T + o_t) * H + i_h, mask=o_t < T, other=0.0)
    b_gl = tl.load(chunk_gate + i_bh * NT + i_n)
    # padded tokens (g = 0) carry the chunk's last cumulative gate: a zero there would make
    # exp(gc_pad - gc_j) overflow under strong decay, and 0 * inf poison the sums over tokens
    b_gc = tl.where(o_t < T, b_gc, b_gl)
    causal = o_i[:, None] >= o_i[None, :]
    b_decay = tl.exp(tl.where(causal, b_gc[:, None] - b_gc[None, :], float("-inf")))
    b_decay_t = tl.exp(tl.where(o_i[:, None] <= o_i[None, :], b_gc[None, :] - b_gc[:, None], float("-inf")))
    key_rows = _group_rows(i_b, i_h, T, H, G, K)
    p_q = tl.make_block_ptr(q + key_rows, (T, K), (G * K, 1), (i_n * BT, 0), (BT, BK), (1, 0))
    p_k = tl.make_block_ptr(k + key_rows, (T, K), (G * K, 1), (i_n * BT, 0), (BT, BK), (1, 0))
    b_q = tl.load(p_q, boundary_check=(0, 1), padding_option="zero")
    b_k = tl.load(p_k, boundary_check=(0, 1), padding_option="zero")
    b_dq = b_dq * (tl.exp(b_gc) * scale)[:, None] + tl.dot((b_ds * b_decay * scale).to(b_k.dtype), b_k,
                                                                     input_precision=PRECISION)
    b_dk_state = b_dk * tl.exp(b_gl - b_gc)[:, None]
    b_dk = b_dk_state + tl.dot((b_ds_t * b_decay_t * scale).to(b_q.dtype), b_q, input_precision=PRECISION)
    b_qf = b_q.to(tl.float32)
    b_kf = b_k.to(tl.float32)
    b_boundary_total = tl.sum(b_boundary, axis=0) * tl.exp(b_gl) + tl.sum(b_kf * b_dk_state)
    b_terms = tl.sum(b_qf * b_dq - b_kf * b_dk, axis=1)
    b_dg = tl.sum(b_terms, axis=0) - tl.cumsum(b_terms, axis=0) + b_terms + b_boundary_total
    head_rows = i_b * T * H * K + i_h * K
    p_dq = tl.make_block_ptr(dq + head_rows, (T, K), (H * K, 1), (i_n * BT, 0), (BT, BK), (1, 0))
    p_dk = tl.make_block_ptr(dk + head_rows, (T, K), (H * K, 1), (i_n * BT, 0), (BT, BK), (1, 0))
    tl.store(p_dq, b_dq.to(p_dq.dtype.element_ty), boundary_check=(0, 1))
    tl.store(p_dk, b_dk.to(p_dk.dtype.element_ty), boundary_check=(0, 1))
    token_rows = (i_b * T + o_t) * H + i_h
    if SSD_ENDS:
        b_dt = tl.load(dt + token_rows, mask=o_t < T, other=0.0).to(tl.float32)
        o_nv = tl.arange(0, NV_PAD)
        b_partials = tl.load(ddt_partials + token_rows.to(tl.int64)[:, None] * NV + o_nv[None, :],
                             mask=(o_t < T)[:, None] & (o_nv < NV)[None, :], other=0.0)
        b_ddt = tl.sum(b_partials, axis=1) + b_dg * tl.load(A + i_h).to(tl.float32)
        tl.store(dg + token_rows, b_ddt.to(dg.dtype.element_ty), mask=o_t < T)
        tl.store(end_partials + (i_bh * NT + i_n) * (NV + 1) + NV, tl.sum(tl.where(o_t < T, b_dg * b_dt, 0.0), axis=0))
    else:
        tl.store(dg + token_rows, b_dg.to(dg.dtype.element_ty), mask=o_t < T)




def _walks(prepared: PreparedWalks, **walks):
    dtype = prepared.k.dtype
    return state_walks(prepared.gates, states_dtype(dtype), LAUNCH["walk"], products_precision(LAUNCH, dtype), **walks)


def prepare_forward(q, k, v, g) -> PreparedWalks:
    """Phase one forms the gates; every state is formed where it is walked (kernels/simple_gla/state_walks.py)."""
    return PreparedWalks(chunk_gates(g.contiguous()), k.contiguous(), v.contiguous())


def finish_forward(prepared: PreparedWalks, q, k, v, g, scale, initial_state, save_states=False, skip=None):
    """The forward's second phase ([Note: span phases]); ``skip = (x, D)`` (x [B, T, H, V] with last stride 1,
    D [H]) adds ``D[h] x`` to the output in the output kernel, before its one rounding (Mamba-2's skip)."""
    q, k, v = q.contiguous(), prepared.k, prepared.v  # phase one made k and v contiguous
    batch, length, heads, value_dim = v.shape
    groups, key_dim = q.shape[2], q.shape[3]
    n_chunks = cdiv(length, CHUNK)
    (states, final_state), _ = _walks(prepared, forward=(k, v, initial_state))
    gate_cumsum, _ = prepared.gates
    output = new_output(v.shape, v.dtype, v.device)
    launch = LAUNCH["output"]
    block_k, block_v = block_size(key_dim, launch["block_k"]), block_size(value_dim, launch["block_v"])
    x, D = skip if skip is not None else (v, v)  # without a skip the kernel never reads them
    if skip is not None:
        _check_skip(x, D, v)
    simple_gla_fwd_kernel_output[(cdiv(value_dim, block_v), n_chunks, batch * heads)](
        q, k, v, gate_cumsum, states, output, scale, length, n_chunks, x, D, x.stride(0), x.stride(1), x.stride(2),
        H=heads, G=groups, K=key_dim, V=value_dim, BT=CHUNK, BK=block_k, BV=block_v,
        PRECISION=products_precision(LAUNCH, q.dtype), SKIP=skip is not None, **launch_options(launch),
    )
    return output, final_state, (states if save_states else None)


def _check_skip(x, D, v):
    heads = v.shape[2]
    if x.shape != v.shape or x.stride(-1) != 1 or tuple(D.shape) != (heads,):
        raise ValueError(f"Mamba-2's ends: x must have v's shape {tuple(v.shape)} with last stride 1 and D shape "
                         f"[{heads}], got x {tuple(x.shape)} (strides {x.stride()}) and D {tuple(D.shape)}")


def prepare_backward(q, k, v, g, do, scale, saved_states=None) -> PreparedWalks:
    if q.shape[-1] > 256:
        raise ValueError(f"the Triton simple-GLA backward supports K <= 256, got K = {q.shape[-1]}; use backend='torch'")
    q, k, v, do = [tensor.contiguous() for tensor in (q, k, v, do)]
    return PreparedWalks(chunk_gates(g.contiguous()), k, v, q, do, scale)


def finish_backward(prepared: PreparedWalks, q, k, v, g, scale, initial_state, do, final_state_grad, saved_states=None,
                    ssd_ends=None):
    """The backward's second phase ([Note: span phases]): (dq, dk, dv, dg, d initial_state). With ``ssd_ends =
    (x, dt, A, D)`` (Mamba-2's ends: ``v = dt x``, ``g = dt A``, ``y = o + D x``, so ``do`` is dy) it returns
    :class:`SsdEndGradients` in dv's place and None in dg's (dg is folded into d dt and dA in the kernels)."""
    q, k, v, do = prepared.q, prepared.k, prepared.v, prepared.do  # made contiguous by phase one
    batch, length, heads, value_dim = v.shape
    groups, key_dim = q.shape[2], q.shape[3]
    n_chunks = cdiv(length, CHUNK)
    # the reverse walk, beside the forward one that recomputes the states unless the forward saved them
    forward = (k, v, initial_state) if saved_states is None else None
    recomputed, (state_grads, initial_grad) = _walks(prepared, forward=forward, reverse=(q, do, final_state_grad),
                                                     scale=scale)
    gate_cumsum, chunk_gate = prepared.gates
    states = saved_states if saved_states is not None else recomputed[0]
    launch = LAUNCH["dv"]
    block_k, block_v = block_size(key_dim, launch["block_k"]), block_size(value_dim, launch["block_v"])
    n_value_blocks = cdiv(value_dim, block_v)
    if ssd_ends is None:
        dv = new_output(v.shape, v.dtype, v.device)
        x, dt, A, D, ddt_partials, end_partials = dv, g, g, g, g, g  # unread
    else:
        x, dt, A, D = ssd_ends
        _check_skip(x, D, v)
        dv = new_output(v.shape, x.dtype, v.device)  # dx
        ddt_partials = new_output((*g.shape, n_value_blocks), torch.float32, v.device)
        end_partials = new_output((batch * heads, n_chunks, n_value_blocks + 1), torch.float32, v.device)
    simple_gla_bwd_kernel_dv[(n_value_blocks, n_chunks, batch * heads)](
        q, k, do, gate_cumsum, chunk_gate, state_grads, dv, scale, length, n_chunks,
        x, dt, D, ddt_partials, end_partials, x.stride(0), x.stride(1), x.stride(2),
        H=heads, G=groups, K=key_dim, V=value_dim, BT=CHUNK, BK=block_k, BV=block_v,
        PRECISION=products_precision(LAUNCH, q.dtype), SSD_ENDS=ssd_ends is not None, **launch_options(launch),
    )
    dq_dk = new_output((2, batch, length, heads, key_dim), q.dtype, q.device)  # per head, summed below
    dg = new_output(g.shape, torch.float32, g.device)  # d dt in its place with ssd_ends
    simple_gla_bwd_kernel_dqkg[(n_chunks, batch * heads)](
        q, k, v, do, gate_cumsum, chunk_gate, states, state_grads, dq_dk[0], dq_dk[1], dg, scale, length, n_chunks,
        dt, A, ddt_partials, end_partials,
        H=heads, G=groups, K=key_dim, V=value_dim, BT=CHUNK, BK=block_size(key_dim, 256),
        BV=block_size(value_dim, LAUNCH["dqkg"]["block_v"]), PRECISION=products_precision(LAUNCH, q.dtype),
        SSD_ENDS=ssd_ends is not None, NV=n_value_blocks, NV_PAD=triton.next_power_of_2(n_value_blocks),
        **launch_options(LAUNCH["dqkg"]),
    )
    dq, dk = _sum_over_groups(dq_dk, groups)
    if ssd_ends is not None:
        # per head: the dD partials (columns 0 .. NV - 1) and dA's (column NV), summed over batch and chunks at once
        sums = end_partials.view(batch, heads, n_chunks, n_value_blocks + 1).sum(dim=(0, 2))
        dD = sums[:, 0] if n_value_blocks == 1 else sums[:, :n_value_blocks].sum(dim=1)
        return dq, dk, SsdEndGradients(dx=dv, ddt=dg, dA=sums[:, n_value_blocks], dD=dD), None, initial_grad
    return dq, dk, dv, dg, initial_grad


@dataclass(frozen=True)
class SsdEndGradients:
    """Mamba-2's ends' gradients as simple GLA's backward kernels form them (``ssd_ends``): dx = dt dv + D dy in
    x's dtype (the dv kernel); d dt = sum_P x dv + dg A [B, T, H] float32 (the dqkg kernel, in dg's place); dA
    and dD [H] float32 (per-chunk partials from both kernels, summed in one reduction)."""

    dx: torch.Tensor
    ddt: torch.Tensor
    dA: torch.Tensor
    dD: torch.Tensor


def _sum_over_groups(dq_dk: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(dq, dk) [B, T, G, K] from the per-head terms ``dq_dk`` [2, B, T, H, K] (dq then dk): each group's sum
    over the heads it serves, both in one reduction (none when G = H)."""
    _, batch, length, heads, key_dim = dq_dk.shape
    summed = sum_each_head_group(dq_dk.view(2 * batch, length, heads, key_dim), heads // groups)
    summed = summed.view(2, batch, length, groups, key_dim)
    return summed[0], summed[1]


def local_final_state(prepared: PreparedWalks) -> torch.Tensor:
    (_, last), _ = _walks(prepared, forward=(prepared.k, prepared.v, None), store=False)
    return last


def local_initial_state_gradient(prepared: PreparedWalks) -> torch.Tensor:
    _, (_, last) = _walks(prepared, reverse=(prepared.q, prepared.do, None), scale=prepared.scale, store=False)
    return last


def total_log_decay(prepared: PreparedWalks) -> torch.Tensor:
    return prepared.gates[1].sum(dim=2)


TRITON_IMPLEMENTATION = Implementation(
    "triton", prepare_forward, finish_forward, prepare_backward, finish_backward,
    local_final_state, local_initial_state_gradient, total_log_decay, takes_ssd_ends=True,
)
