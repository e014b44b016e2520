"""Triton kernels for GLA's smooth chunks: intra-chunk products around one reference per chunk.

A chunk is smooth when no key's cumulative gate spans more than the span limit over it
(kernels/gla/README.md, "Smooth chunks"); every kernel here returns at once on the other chunks, which
kernels/gla/triton_steep.py handles. Transposed operands are gated inputs transposed in registers, never a
product's accumulator (Triton 3.4-3.7.0 miscompiles that on Hopper).
"""

from __future__ import annotations

import triton
import triton.language as tl

from schedlang.kernels.common.triton_gradients import chunk_score_gradients, chunk_state_products
from schedlang.kernels.gla.triton_shared import chunk_is_smooth, store_key_gradients


@triton.jit
def smooth_gated_block(
    q, k, gate_cumsum, gate_mid, base, row_valid, i_n, i_k, i_bh, T, NT,
    H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
):
    """Keys [i_k * BK, ...) of chunk i_n: q, k, gc and the gated q * exp(gc - mid), k * exp(mid - gc),
    zero on padded tokens, in q's dtype."""
    p_q = tl.make_block_ptr(q + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    p_k = tl.make_block_ptr(k + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    p_gc = tl.make_block_ptr(gate_cumsum + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    b_q = tl.load(p_q, boundary_check=(0, 1), padding_option="zero")
    b_k = tl.load(p_k, boundary_check=(0, 1), padding_option="zero")
    b_gc = tl.load(p_gc, boundary_check=(0, 1), padding_option="zero")
    o_k = i_k * BK + tl.arange(0, BK)
    b_mid = tl.load(gate_mid + (i_bh * NT + i_n) * K + o_k, mask=o_k < K, other=0.0)
    b_qg = tl.where(row_valid[:, None], b_q * tl.exp(b_gc - b_mid[None, :]), 0.0).to(b_q.dtype)
    b_kg = tl.where(row_valid[:, None], b_k * tl.exp(b_mid[None, :] - b_gc), 0.0).to(b_q.dtype)
    return b_q, b_k, b_gc, b_qg, b_kg


@triton.jit
def gla_fwd_kernel_smooth_output(
    q, k, v, gate_cumsum, gate_mid, gate_span, states, output, scale, span_limit, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    KP: tl.constexpr,
):
    # o = scale * (q * exp(gc)) S_n + (causal A) v with A = scale * (q * exp(gc - mid)) (k * exp(mid - gc))^T.
    i_v, i_n, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if not chunk_is_smooth(gate_span, i_bh, i_n, NT, span_limit, K, KP):
        return
    i_b, i_h = i_bh // H, i_bh % H
    base = i_b * T * H * K + i_h * K
    o_t = tl.arange(0, BT)
    row_valid = i_n * BT + o_t < T
    state_base = states + (i_bh * NT + i_n).to(tl.int64) * K * V
    b_scores = tl.zeros([BT, BT], dtype=tl.float32)
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        b_q, b_k, b_gc, b_qg, b_kg = smooth_gated_block(
            q, k, gate_cumsum, gate_mid, base, row_valid, i_n, i_k, i_bh, T, NT, H, K, BT, BK
        )
        p_h = tl.make_block_ptr(state_base, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
        b_h = tl.load(p_h, boundary_check=(0, 1))
        # the transpose of a gated input, not of a product's accumulator (see the module docstring)
        b_scores += tl.dot(b_qg, tl.trans(b_kg))
        b_o += tl.dot((b_q * tl.exp(b_gc)).to(b_h.dtype), b_h)
    b_scores = tl.where(o_t[:, None] >= o_t[None, :], b_scores * scale, 0.0)
    p_v = tl.make_block_ptr(v + i_b * T * H * V + i_h * V, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
    b_v = tl.load(p_v, boundary_check=(0, 1), padding_option="zero")
    b_o = b_o * scale + tl.dot(b_scores.to(b_v.dtype), b_v)
    p_o = tl.make_block_ptr(output + i_b * T * H * V + i_h * V, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
    tl.store(p_o, b_o.to(p_o.dtype.element_ty), boundary_check=(0, 1))


@triton.jit
def gla_bwd_kernel_smooth_dv(
    q, k, do, gate_cumsum, chunk_gate, gate_mid, gate_span, state_grads, dv, scale, span_limit, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    KP: tl.constexpr,
):
    # dv = (causal A)^T do + (k * exp(gl - gc)) dS_leaving; A^T is formed directly as
    # (k * exp(mid - gc)) (q * exp(gc - mid))^T, never by transposing a product.
    i_v, i_n, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if not chunk_is_smooth(gate_span, i_bh, i_n, NT, span_limit, K, KP):
        return
    i_b, i_h = i_bh // H, i_bh % H
    base = i_b * T * H * K + i_h * K
    o_t = tl.arange(0, BT)
    row_valid = i_n * BT + o_t < T
    grad_base = state_grads + (i_bh * NT + i_n).to(tl.int64) * K * V
    # [BT(j), BT(i)] = A[i, j]
    b_scores_t = tl.zeros([BT, BT], dtype=tl.float32)
    b_dv = tl.zeros([BT, BV], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        b_q, b_k, b_gc, b_qg, b_kg = smooth_gated_block(
            q, k, gate_cumsum, gate_mid, base, row_valid, i_n, i_k, i_bh, T, NT, H, K, BT, BK
        )
        p_dh = tl.make_block_ptr(grad_base, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
        b_dh = tl.load(p_dh, boundary_check=(0, 1))
        o_k = i_k * BK + tl.arange(0, BK)
        b_gl = tl.load(chunk_gate + (i_bh * NT + i_n) * K + o_k, mask=o_k < K, other=0.0)
        b_scores_t += tl.dot(b_kg, tl.trans(b_qg))
        b_kd = tl.where(row_valid[:, None], b_k * tl.exp(b_gl[None, :] - b_gc), 0.0).to(b_dh.dtype)
        b_dv += tl.dot(b_kd, b_dh)
    b_scores_t = tl.where(o_t[None, :] >= o_t[:, None], b_scores_t * scale, 0.0)
    p_do = tl.make_block_ptr(do + i_b * T * H * V + i_h * V, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
    b_do = tl.load(p_do, boundary_check=(0, 1), padding_option="zero")
    b_dv += tl.dot(b_scores_t.to(b_do.dtype), b_do)
    p_dv = tl.make_block_ptr(dv + i_b * T * H * V + i_h * V, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
    tl.store(p_dv, b_dv.to(p_dv.dtype.element_ty), boundary_check=(0, 1))


@triton.jit
def _smooth_dqkg_block(
    q, k, do, v, gate_cumsum, chunk_gate, gate_mid, states, state_grads, dq, dk, dg, b_dscores, b_dscores_t,
    scale, row_valid, i_n, i_k, i_bh, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    # dq, dk and dg of keys [i_k * BK, ...) of chunk i_n, given the chunk's masked, scaled dA and dA^T
    i_b, i_h = i_bh // H, i_bh % H
    b_dq, b_dk, b_boundary = chunk_state_products(
        do, v, states, state_grads, i_b * T * H * V + i_h * V, (i_bh * NT + i_n).to(tl.int64) * K * V, i_n,
        i_k * BK, T, H, K, V, BT, BK, BV, "tf32",
    )
    base = i_b * T * H * K + i_h * K
    o_k = i_k * BK + tl.arange(0, BK)
    p_q = tl.make_block_ptr(q + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    p_k = tl.make_block_ptr(k + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    p_gc = tl.make_block_ptr(gate_cumsum + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    b_q = tl.load(p_q, boundary_check=(0, 1), padding_option="zero")
    b_k = tl.load(p_k, boundary_check=(0, 1), padding_option="zero")
    b_gc = tl.load(p_gc, boundary_check=(0, 1), padding_option="zero")
    gate_offset = (i_bh * NT + i_n) * K + o_k
    b_mid = tl.load(gate_mid + gate_offset, mask=o_k < K, other=0.0)
    b_gl = tl.load(chunk_gate + gate_offset, mask=o_k < K, other=0.0)
    valid = row_valid[:, None]
    b_up = tl.where(valid, tl.exp(b_gc - b_mid[None, :]), 0.0)
    b_down = tl.where(valid, tl.exp(b_mid[None, :] - b_gc), 0.0)
    b_dq_intra = tl.dot(b_dscores.to(b_k.dtype), (b_k * b_down).to(b_k.dtype)) * b_up
    b_dk_intra = tl.dot(b_dscores_t.to(b_q.dtype), (b_q * b_up).to(b_q.dtype)) * b_down
    b_q = b_q.to(tl.float32)
    b_k = b_k.to(tl.float32)
    b_dq = b_dq_intra + tl.where(valid, b_dq * scale * tl.exp(b_gc), 0.0)
    b_dk_state = tl.where(valid, b_dk * tl.exp(b_gl[None, :] - b_gc), 0.0)
    b_dk = b_dk_intra + b_dk_state
    store_key_gradients(b_q, b_k, b_dq, b_dk, b_dk_state, b_boundary, b_gl, dq, dk, dg, base, i_n, i_k, T, H, K, BT, BK)


@triton.jit
def gla_bwd_kernel_smooth_dqkg(
    q, k, v, do, gate_cumsum, chunk_gate, gate_mid, gate_span, states, state_grads, dq, dk, dg,
    scale, span_limit, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    KP: tl.constexpr, KS: tl.constexpr,
):
    # One program per smooth chunk and split of the keys (grid axis 2, KS splits). dA = scale * do v^T
    # (causal) and dA^T = scale * v do^T (formed directly), once per program; then for each block of keys:
    # dq = scale * exp(gc) (do S_n^T) + exp(gc - mid) (dA (k * exp(mid - gc)));
    # dk = exp(gl - gc) (v dS^T) + exp(mid - gc) (dA^T (q * exp(gc - mid)));
    # dg = reverse-cumsum_in_chunk(q dq - k dk) + sum_v(S_{n+1} dS_{n+1}), as in gla_bwd_kernel_inter.
    i_n, i_bh, i_split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if not chunk_is_smooth(gate_span, i_bh, i_n, NT, span_limit, K, KP):
        return
    i_b, i_h = i_bh // H, i_bh % H
    o_t = tl.arange(0, BT)
    b_dscores, b_dscores_t = chunk_score_gradients(do, v, i_b * T * H * V + i_h * V, i_n, T, H, V, BT, BV, "tf32")
    b_dscores = tl.where(o_t[:, None] >= o_t[None, :], b_dscores * scale, 0.0)
    b_dscores_t = tl.where(o_t[None, :] >= o_t[:, None], b_dscores_t * scale, 0.0)
    row_valid = i_n * BT + o_t < T
    # the key blocks of this program: the grid's third axis splits them in KS runs (each forms dA once more)
    for i_k in range(tl.cdiv(K, BK)):
        if i_k // tl.cdiv(tl.cdiv(K, BK), KS) == i_split:
            _smooth_dqkg_block(
                q, k, do, v, gate_cumsum, chunk_gate, gate_mid, states, state_grads, dq, dk, dg, b_dscores, b_dscores_t,
                scale, row_valid, i_n, i_k, i_bh, T, NT, H, K, V, BT, BK, BV,
            )
